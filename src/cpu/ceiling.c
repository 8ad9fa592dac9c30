/*
 * ceiling.c - short probes of this machine's arithmetic peak, so that
 * benchmarks print each figure next to the ceiling it is measured against
 * in the same run (absolute times from different runs are not comparable
 * on a shared machine).
 */
#define _POSIX_C_SOURCE 200809L
#include "ceiling.h"

#include <string.h>
#include <time.h>

/* Threads whose CPU time a probe reads (more share the wall clock). */
#define SDPA_MAX_PROBE_THREADS 256

double sdpa__probe_fma_avx512(int64_t iters);
double sdpa__probe_fma_avx2(int64_t iters);
double sdpa__probe_amx_bf16(int64_t iters);
double sdpa__probe_dpbf16_avx512(int64_t iters);

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

sdpa_status sdpa__cpu_ceiling(sdpa_pool *pool, unsigned cpu_features, const char *what,
                              double *gflops, const char **isa)
{
    *gflops = 0;
    (void)cpu_features; /* read only where the x86-64 probes are built */
    const int amx = strcmp(what, "amx-bf16") == 0, dpbf16 = strcmp(what, "avx512-bf16") == 0;
    if (strcmp(what, "fp32") != 0 && !amx && !dpbf16)
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "what is '%s', expected \"fp32\", \"avx512-bf16\" or \"amx-bf16\"",
                          what);
    probe_job job = {NULL, 20000000, {0}}; /* iters: a cap on the sizing runs below */
    const char *name = "none";
#ifdef SDPA_HAVE_X86_KERNELS
    if (amx && (cpu_features & SDPA_CPU_AMX_BF16))
        job.fn = sdpa__probe_amx_bf16, job.iters = 1000000, name = "amx";
    else if (dpbf16 && (cpu_features & SDPA_CPU_AVX512BF16))
        job.fn = sdpa__probe_dpbf16_avx512, name = "avx512-bf16";
    else if (amx || dpbf16)
        ;
    else if (cpu_features & SDPA_CPU_AVX512F)
        job.fn = sdpa__probe_fma_avx512, name = "avx512";
    else if (cpu_features & SDPA_CPU_AVX2)
        job.fn = sdpa__probe_fma_avx2, name = "avx2";
#endif
    if (isa)
        *isa = name;
    if (!job.fn)
        return sdpa__fail(SDPA_NOT_AVAILABLE, amx      ? "no usable AMX-BF16 on this machine"
                                              : dpbf16 ? "no usable AVX512-BF16 on this machine"
                                                       : "no vector FMA probe for this CPU");
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
