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

double sdpa__probe_fma_avx512(int64_t iters);
double sdpa__probe_fma_avx2(int64_t iters);
double sdpa__probe_amx_bf16(int64_t iters);
double sdpa__probe_dpbf16_avx512(int64_t iters);

typedef struct probe_job {
    double (*fn)(int64_t);
    int64_t iters;
} probe_job;

static void probe_task(void *arg, int64_t task, int worker)
{
    (void)task, (void)worker;
    const probe_job *j = arg;
    j->fn(j->iters);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
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
    probe_job job = {NULL, 20000000}; /* ~30 ms per thread at 250 GFLOP/s */
    const char *name = "none";
#ifdef SDPA_HAVE_X86_KERNELS
    if (amx && (cpu_features & SDPA_CPU_AMX_BF16))
        job.fn = sdpa__probe_amx_bf16, job.iters = 1000000, name = "amx"; /* ~30 ms */
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
    double flops_per_call = job.fn(1000); /* warm up, and learn FLOPs per iteration */
    flops_per_call = flops_per_call / 1000 * (double)job.iters;
    double best = 0;
    for (int rep = 0; rep < 5; rep++) { /* best of 5: the peak, not the noise */
        double t0 = now_s();
        sdpa__parallel_for(pool, threads, probe_task, &job);
        double t = now_s() - t0;
        double g = flops_per_call * threads / t / 1e9;
        best = g > best ? g : best;
    }
    *gflops = best;
    sdpa__clear_error();
    return SDPA_OK;
}
