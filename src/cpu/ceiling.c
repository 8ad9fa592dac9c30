/*
 * ceiling.c - short probes of this machine's arithmetic peak, so that
 * benchmarks print each figure next to the ceiling it is measured against
 * in the same run (absolute times from different runs are not comparable
 * on a shared machine).
 */
#define _POSIX_C_SOURCE 200809L
#include "ceiling.h"
#include "../core/backend.h"
#include "../core/cpu_features.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

/* Threads whose CPU time a probe reads (more share the wall clock). */
#define SDPA_MAX_PROBE_THREADS 256

typedef struct probe_job {
    double (*fn)(int64_t);
    int64_t iters;
    double cpu[SDPA_MAX_PROBE_THREADS]; /* each task's own CPU time, seconds */
} probe_job;

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double now_s(void) { return clock_s(CLOCK_MONOTONIC); }

static void probe_task(void *arg, int64_t task, int worker)
{
    (void)worker;
    probe_job *j = arg;
    const double t0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
    j->fn(j->iters);
    if (task < SDPA_MAX_PROBE_THREADS)
        j->cpu[task] = clock_s(CLOCK_THREAD_CPUTIME_ID) - t0;
}

/* The table position of the highest feature in bits: the fp32 probe of
 * the backend whose ISA is the newest present one wins (avx512 over avx2). */
static int feature_rank(unsigned bits)
{
    int rank = -1;
    for (size_t i = 0; i < sdpa__cpu_feature_count; i++)
        if (bits & sdpa__cpu_feature_table[i].bit)
            rank = (int)i;
    return rank;
}

sdpa_status sdpa__cpu_ceiling(sdpa_pool *pool, const sdpa_backend *const *backends, int n_backends,
                              unsigned cpu_features, const char *what, double *gflops,
                              const char **isa)
{
    *gflops = 0;
    if (isa)
        *isa = "none";
    /* what: "fp32", or the feature whose unit a backend's probe times */
    unsigned unit = 0;
    if (strcmp(what, "fp32") != 0) {
        const sdpa_cpu_feature *f = sdpa__cpu_feature_named(what);
        int probed = 0;
        for (int i = 0; f && i < n_backends && !probed; i++)
            probed = backends[i]->probe_unit == f->bit;
        if (!probed) {
            char names[160];
            size_t len = (size_t)snprintf(names, sizeof names, "\"fp32\"");
            for (int i = 0; i < n_backends && len < sizeof names; i++) {
                const sdpa_cpu_feature *u = sdpa__cpu_feature(backends[i]->probe_unit);
                if (backends[i]->probe_unit && u)
                    len += (size_t)snprintf(names + len, sizeof names - len, ", \"%s\"", u->name);
            }
            return sdpa__fail(SDPA_INVALID_ARGUMENT, "what is '%s', expected %s", what, names);
        }
        unit = f->bit;
    }
    const sdpa_backend *by = NULL; /* the backend whose probe runs */
    for (int i = 0; i < n_backends; i++) {
        const sdpa_backend *b = backends[i];
        if (!b->probe || b->not_built || b->probe_unit != unit ||
            (b->caps.cpu_features & ~cpu_features))
            continue;
        if (!by || feature_rank(b->caps.cpu_features) > feature_rank(by->caps.cpu_features))
            by = b;
    }
    if (!by) {
        const sdpa_cpu_feature *f = sdpa__cpu_feature(unit);
        return sdpa__fail(SDPA_NOT_AVAILABLE, f ? "no usable %s on this machine"
                                                : "no vector FMA probe for this CPU%s",
                          f ? f->title : "");
    }
    probe_job job = {by->probe, by->probe_max_iters ? by->probe_max_iters : 20000000, {0}};
    if (isa) { /* the probed unit, by its table name */
        const sdpa_cpu_feature *f = sdpa__cpu_feature(unit);
        *isa = f ? f->name : sdpa__cpu_feature_table[feature_rank(by->caps.cpu_features)].name;
    }
    const int threads = sdpa__pool_threads(pool);
    /* Warm up and size the run: iterations for about 25 ms a rep, whatever
     * the unit's speed (a fixed count took 0.1 s on one CPU and seconds on
     * another, where VDPBF16PS runs at a quarter of the rate assumed). */
    int64_t n = 1000;
    double flops = 0, took = 0;
    for (;;) {
        const double t0 = now_s();
        flops = job.fn(n);
        took = now_s() - t0;
        if (took >= 0.002 || n >= job.iters)
            break;
        n *= 8;
    }
    job.iters = (int64_t)((double)n * 0.025 / (took > 0 ? took : 1e-9));
    job.iters = job.iters < 1000 ? 1000 : job.iters;
    const double flops_per_call = flops / (double)n * (double)job.iters;
    /* Best of 5: the peak, not the noise. Each rep counts the slowest
     * thread's own CPU time, not the wall clock: on a virtual machine the
     * hypervisor may take a CPU away for part of a rep, which is not the
     * unit's speed (wall time is what the benchmarks report, so a figure
     * taken while CPUs were away shows as a lower share of this peak). */
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        const double t0 = now_s();
        sdpa__parallel_for(pool, threads, probe_task, &job);
        double t = now_s() - t0;
        if (threads <= SDPA_MAX_PROBE_THREADS) {
            double slowest = 0;
            for (int i = 0; i < threads; i++)
                slowest = job.cpu[i] > slowest ? job.cpu[i] : slowest;
            if (slowest > 0 && slowest < t)
                t = slowest;
        }
        const double g = flops_per_call * threads / t / 1e9;
        best = g > best ? g : best;
    }
    *gflops = best;
    sdpa__clear_error();
    return SDPA_OK;
}
