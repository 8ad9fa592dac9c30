/*
 * amx_cost.c - what cpu.amx spends outside the tiles, in cycles per score
 * per core, on any CPU with AVX-512 BF16.
 *
 *   bench_amx_cost [--suite FILE | --shape B,Sq,Skv,Hq,Hkv,D] [--reps N]
 *                  [--threads N] [--flop-per-cycle N] [--notiles-only] [--softmax]
 *
 * "cpu.amx-notiles" is cpu.amx's kernel compiled with its tile work left
 * out (bench/amx_notiles.c: no tile configuration, loads, products or
 * stores), so that everything else runs as on AMX: the packing of K and V,
 * the loads of Q, the softmax over the score buffer, the O rescale, the
 * output stores and the task loop. Its time is the work the tiles cannot
 * hide unless it overlaps them. On a CPU with usable AMX, cpu.amx itself
 * is timed too, interleaved, and the share of its time the tiles add is
 * printed beside (--notiles-only leaves it out: for a profiler).
 *
 * Cycles per score per core = CPU time x clock / scores, scores = B Hq Sq
 * Skv (half of it for causal Sq == Skv), CPU time that of all the
 * process's threads (on a virtual machine whose CPUs the hypervisor lends
 * to others now and then, wall time x threads counts time the threads did
 * not run; the wall times are printed too). The clock comes from the
 * fp32 FMA ceiling probe of the same run: ceiling / (threads x
 * FLOP per cycle per core), 64 on cores with two 512-bit FMA ports (Intel
 * Xeons, Zen 5) and 32 on Zen 4 (its 512-bit operations run on 256-bit
 * units; AMD family 25), or --flop-per-cycle. The budget (notes/amx.md):
 * at full rate the tiles need 0.5 cycle per score at D = 128 and 0.25 at
 * D = 64, so for cpu.amx to reach about 35% of the TDPBF16PS peak at D = 128
 * the rest must stay near 0.7 cycle per score (0.5 at D = 64/72). The
 * targets are printed beside each row.
 *
 * Medians of --reps interleaved rounds (default 5). Results are garbage
 * (nothing computes the scores); only time is read.
 *
 * --softmax times the softmax's exponential alone instead (one thread, 32
 * rows of 256 scores in L1): the kernel's exp_row and variants of its
 * arithmetic (bench/amx_notiles.c), in cycles per 32 scores by the same
 * clock, so that the floor of that part of the budget on the CPU at hand
 * is measured rather than counted.
 */
#define _POSIX_C_SOURCE 200809L
#include "cpu/cpu_backend.h"
#include "dispatch/seam.h"
#include "suite.h"
#include "tool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern const sdpa_backend sdpa__backend_cpu_amx;
sdpa_status sdpa__cpu_amx_notiles_run(const sdpa_backend *self, const sdpa_call *call);
const char *sdpa__amx_exp_variant_name(int variant);
double sdpa__amx_exp_variant_seconds(int variant, long long iters);

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *x, int n)
{
    qsort(x, (size_t)n, sizeof *x, cmp);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* --softmax: each variant's median over `reps` interleaved rounds, in
 * core cycles per 32 scores at `ghz`. */
static int softmax_variants(long long reps, double ghz)
{
    enum { ITERS = 2000, SCORES = 32 * 256 }; /* a pass: 32 rows x 256 scores */
    int n = 0;
    while (sdpa__amx_exp_variant_name(n))
        n++;
    double *t = malloc(sizeof(double) * (size_t)((long long)n * reps));
    if (!t)
        return tool_usage_error("out of memory");
    for (int v = 0; v < n; v++) /* warm up */
        sdpa__amx_exp_variant_seconds(v, ITERS / 10);
    for (long long r = 0; r < reps; r++)
        for (int v = 0; v < n; v++)
            t[v * reps + r] = sdpa__amx_exp_variant_seconds(v, ITERS);
    printf("# the softmax's exponential alone: 32 rows x 256 scores in L1, one thread, %d passes "
           "a round; cycles per 32 scores (medians; the clock above)\n",
           (int)ITERS);
    printf("%-80s %8s %10s\n", "variant", "cyc/32", "cyc/score");
    for (int v = 0; v < n; v++) {
        const double cyc = median(t + v * reps, (int)reps) * ghz * 1e9 / ITERS / SCORES * 32;
        printf("%-80s %8.2f %10.3f\n", sdpa__amx_exp_variant_name(v), cyc, cyc / 32);
    }
    free(t);
    return 0;
}

static double cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* One call: its wall time, and in *cpu the CPU time of all the process's
 * threads (time the hypervisor gave to others is not in it). */
static double run_ms(sdpa_context *ctx, problem *pb, const row *rw, const char *backend,
                     double *cpu)
{
    sdpa_params prm = SDPA_PARAMS_DEFAULT;
    prm.backend = backend;
    prm.causal = rw->d.causal;
    prm.mask = pb->mask;
    const double c0 = cpu_ms(), t0 = tool_now_ms();
    const sdpa_status st = sdpa_forward(ctx, &pb->q, &pb->k, &pb->v, &pb->out, NULL, &prm);
    const double t = tool_now_ms() - t0;
    *cpu = cpu_ms() - c0;
    if (st != SDPA_OK) {
        fprintf(stderr, "bench_amx_cost: %s on %s: %s\n", backend, rw->name, sdpa_last_error());
        exit(1);
    }
    return t;
}

int main(int argc, char **argv)
{
    enum { SUITE, SHAPE, REPS, THREADS, FPC, NOTILES, SOFTMAX, NFLAGS };
    tool_flag f[NFLAGS] = {{"--suite", 1, NULL},          {"--shape", 1, NULL},
                           {"--reps", 1, NULL},           {"--threads", 1, NULL},
                           {"--flop-per-cycle", 1, NULL}, {"--notiles-only", 0, NULL},
                           {"--softmax", 0, NULL}};
    int rc = tool_parse_flags(argc - 1, argv + 1, f, NFLAGS);
    if (rc)
        return rc;
    static row rows[MAX_ROWS];
    int n_rows = 0, threads = 0;
    sdpa_dtype dtype;
    const char *suite = f[SUITE].value || f[SHAPE].value ? f[SUITE].value : "diffusion-cpu";
    if ((rc = suite_args(suite, f[SHAPE].value, "bf16", f[THREADS].value, rows, &n_rows, &dtype,
                         &threads)) != 0)
        return rc;
    long long reps = 5, fpc = 0;
    if (f[REPS].value && !tool_parse_int(f[REPS].value, 1, 1000, &reps))
        return tool_usage_error("--reps '%s' is not a number in 1..1000", f[REPS].value);
    if (f[FPC].value && !tool_parse_int(f[FPC].value, 1, 1024, &fpc))
        return tool_usage_error("--flop-per-cycle '%s' is not a number in 1..1024", f[FPC].value);
    sdpa_context *ctx;
    if ((rc = tool_context(NULL, threads, &ctx)) != 0)
        return rc;
    const sdpa_platform *plat = sdpa_context_platform(ctx);
    if ((plat->cpu_features & (SDPA_CPU_AVX512F | SDPA_CPU_AVX512BF16)) !=
        (SDPA_CPU_AVX512F | SDPA_CPU_AVX512BF16)) {
        printf("# bench_amx_cost: this CPU has no AVX-512 BF16, which cpu.amx's softmax needs: "
               "nothing to time\n");
        sdpa_context_destroy(ctx);
        return 0;
    }
    static sdpa_backend notiles;
    notiles = sdpa__backend_cpu_amx;
    notiles.name = "cpu.amx-notiles";
    notiles.summary = "cpu.amx with its tile work compiled out (bench only)";
    notiles.caps.cpu_features = SDPA_CPU_AVX512F | SDPA_CPU_AVX512BF16;
    notiles.fallback_rank = 0;
    notiles.present = sdpa__cpu_backend_present;
    notiles.run = sdpa__cpu_amx_notiles_run;
    notiles.not_built = NULL;
    if (sdpa__ctx_add_backend(ctx, &notiles) != SDPA_OK)
        return tool_lib_error("adding cpu.amx-notiles", SDPA_INVALID_ARGUMENT);
    const int amx = (plat->cpu_features & SDPA_CPU_AMX_BF16) && !f[NOTILES].value;
    const int nthreads = sdpa_context_threads(ctx);

    double fp32 = 0, amx_peak = 0;
    if (sdpa_measure_ceiling(ctx, "fp32", &fp32, NULL) != SDPA_OK || fp32 <= 0)
        return tool_lib_error("the fp32 ceiling probe", SDPA_NOT_AVAILABLE);
    if (amx && sdpa_measure_ceiling(ctx, "amx-bf16", &amx_peak, NULL) != SDPA_OK)
        amx_peak = 0;
    if (!fpc) /* 512-bit FMAs per cycle per core x 2 FLOP x 16 lanes */
        fpc = strcmp(plat->cpu_vendor, "amd") == 0 && plat->cpu_family == 25 ? 32 : 64;
    const double ghz = fp32 / ((double)nthreads * (double)fpc);
    char date[32];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
    printf("# bench_amx_cost %s  %s (%s, family %d)  %d threads  bf16  %lld reps (interleaved), "
           "%s\n",
           sdpa_version(), plat->cpu_model, plat->cpu_vendor, plat->cpu_family, nthreads, reps,
           date);
    printf("# cpu.amx-notiles: cpu.amx with the tile loads, products and stores compiled out "
           "(packing, Q loads, softmax, O rescale, output stores, task loop remain)\n");
    printf("# clock %.2f GHz = fp32 FMA ceiling %.0f GFLOP/s (this run) / (%d threads x %lld "
           "FLOP/cycle)\n",
           ghz, fp32, nthreads, fpc);
    if (amx)
        printf("# AMX usable: cpu.amx timed beside it; TDPBF16PS ceiling %.0f GFLOP/s (this "
               "run, %%peak from wall time); tiles: the share of cpu.amx's cycles the tile work "
               "adds\n",
               amx_peak);
    if (f[SOFTMAX].value) {
        rc = softmax_variants(reps, ghz);
        sdpa_context_destroy(ctx);
        return rc;
    }
    printf("# target: <= 0.7 cycle per score at D = 128, <= 0.5 at D <= 72 (notes/amx.md)\n");
    printf("# cyc/score: core cycles per score, from the CPU time of all threads (medians)\n");
    printf("%-22s %2s %6s %6s %3s %3s %4s  %12s %12s %7s", "row", "B", "Sq", "Skv", "Hq", "Hkv",
           "D", "notiles_ms", "cyc/score", "target");
    if (amx)
        printf(" %12s %12s %7s %7s", "cpu.amx_ms", "cyc/score", "%peak", "tiles");
    printf("\n");

    double *t = malloc(sizeof(double) * (size_t)reps * 4), *u = t + 2 * reps; /* wall, CPU */
    if (!t)
        return tool_usage_error("out of memory");
    int met = 0, missed = 0;
    for (int r = 0; r < n_rows; r++) {
        const row *rw = &rows[r];
        problem pb;
        if (!problem_make(&pb, &rw->d, rw->seq_len_kv, dtype, dtype, 0))
            return tool_usage_error("out of memory for %s", rw->name);
        double unused;
        run_ms(ctx, &pb, rw, "cpu.amx-notiles", &unused); /* warm up both */
        if (amx)
            run_ms(ctx, &pb, rw, "cpu.amx", &unused);
        for (long long i = 0; i < reps; i++) {
            const int first_amx = amx && (i & 1); /* alternate which goes first */
            if (first_amx)
                t[reps + i] = run_ms(ctx, &pb, rw, "cpu.amx", &u[reps + i]);
            t[i] = run_ms(ctx, &pb, rw, "cpu.amx-notiles", &u[i]);
            if (amx && !first_amx)
                t[reps + i] = run_ms(ctx, &pb, rw, "cpu.amx", &u[reps + i]);
        }
        const double flops = suite_flops(&rw->d, rw->seq_len_kv);
        const double scores = flops / (4.0 * (double)rw->d.D);
        const double ms = median(t, (int)reps);
        const double cyc = median(u, (int)reps) * 1e-3 * ghz * 1e9 / scores;
        const double target = rw->d.D >= 128 ? 0.7 : 0.5;
        cyc <= target ? met++ : missed++;
        printf("%-22s %2lld %6lld %6lld %3lld %3lld %4lld  %12.3f %12.3f %7.2f", rw->name,
               (long long)rw->d.B, (long long)rw->d.Sq, (long long)rw->d.Skv,
               (long long)rw->d.Hq, (long long)rw->d.Hkv, (long long)rw->d.D, ms, cyc, target);
        if (amx) {
            const double ams = median(t + reps, (int)reps);
            const double acyc = median(u + reps, (int)reps) * 1e-3 * ghz * 1e9 / scores;
            printf(" %12.3f %12.3f %6.1f%% %6.0f%%", ams, acyc,
                   amx_peak > 0 ? 100.0 * flops / (ams * 1e-3) / 1e9 / amx_peak : 0.0,
                   100.0 * (acyc - cyc) / acyc);
        }
        printf("\n");
        fflush(stdout);
        problem_free(&pb);
    }
    printf("# rows at or under the target: %d of %d\n", met, met + missed);
    free(t);
    sdpa_context_destroy(ctx);
    return 0;
}
