/*
 * ab_libs.c - two builds of libsdpa in one process, timed call by call.
 *
 *   bench_ab_libs OLD.so NEW.so [--dtype f32|bf16|f16] [--reps N]
 *                 [--causal top-left] [--layout bshd|bhsd] [--burst N]
 *                 [--backward] B,Sq,Skv,Hq,Hkv,D ...
 *
 * Both libraries are loaded with dlopen (RTLD_LOCAL: each keeps its own
 * symbols, context and thread pool) and called on the same tensors, one
 * after the other, the order alternating every pair; per shape it prints
 * each build's median and minimum time and the median of the per-pair
 * ratios new/old with its quartiles. Why beside bench/ab_builds.py (which
 * alternates whole `sdpa bench` processes): on a host whose neighbours
 * take the cores for seconds at a time (the Emerald Rapids VM of
 * 2026-12-06: ceilings 2,000-6,500 GFLOP/s between runs), process-level
 * rounds gave ratios spread 0.54-1.47 for one row, while two calls a few
 * milliseconds apart see the same neighbours: an A/A run (one build
 * twice) gives medians 0.99-1.01 with quartiles within 2%.
 *
 * The backend is the dispatcher's choice unless SDPA_BACKEND names one
 * (both libraries read it). The program links neither library (a third
 * copy, loaded at start, could stand in for one of them). Inputs: uniform
 * random values in (-1, 1), the output in the inputs' dtype, default
 * scale, no mask; [B, S, H, D] tensors, or [B, H, S, D] with --layout bhsd
 * (torch's layout, as libsdpa's Python calls pass it). --burst N: each
 * turn is N calls in a row (a layer called again on the same tensors, as
 * a benchmark's loop does: what the caches keep from one call to the
 * next counts), timed together, per call. --backward times sdpa_backward
 * instead (dq, dk, dv from a random output gradient; the forward's output
 * and LSE from the old library, once per shape, shared by both). The idle
 * library's pool sleeps while the other runs (its workers wait on a
 * condition).
 */
#define _POSIX_C_SOURCE 200809L
#include "sdpa.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef sdpa_status (*create_fn)(const sdpa_context_options *, sdpa_context **);
typedef void (*destroy_fn)(sdpa_context *);
typedef sdpa_status (*forward_fn)(sdpa_context *, const sdpa_tensor *, const sdpa_tensor *,
                                  const sdpa_tensor *, sdpa_tensor *, float *,
                                  const sdpa_params *);
typedef sdpa_status (*backward_fn)(sdpa_context *, const sdpa_tensor *, const sdpa_tensor *,
                                   const sdpa_tensor *, const sdpa_tensor *, const float *,
                                   const sdpa_tensor *, const float *, sdpa_tensor *,
                                   sdpa_tensor *, sdpa_tensor *, const sdpa_params *);
typedef sdpa_status (*convert_fn)(const void *, sdpa_dtype, void *, sdpa_dtype, size_t);

typedef struct lib {
    void *handle;
    forward_fn forward;
    backward_fn backward;
    destroy_fn destroy;
    sdpa_context *ctx;
} lib;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int open_lib(lib *l, const char *path, convert_fn *convert)
{
    /* dlopen searches the library path for a name without a slash; a
     * file named here is meant */
    char local[4096];
    if (!strchr(path, '/') && snprintf(local, sizeof local, "./%s", path) < (int)sizeof local)
        path = local;
    l->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!l->handle) {
        fprintf(stderr, "bench_ab_libs: %s\n", dlerror());
        return 0;
    }
    create_fn create;
    /* POSIX: a data pointer from dlsym converts to a function pointer */
    *(void **)&create = dlsym(l->handle, "sdpa_context_create");
    *(void **)&l->forward = dlsym(l->handle, "sdpa_forward");
    *(void **)&l->backward = dlsym(l->handle, "sdpa_backward");
    *(void **)&l->destroy = dlsym(l->handle, "sdpa_context_destroy");
    if (convert)
        *(void **)convert = dlsym(l->handle, "sdpa_convert");
    if (!create || !l->forward || !l->backward || !l->destroy || (convert && !*convert)) {
        fprintf(stderr, "bench_ab_libs: %s is not a libsdpa (no sdpa_forward)\n", path);
        return 0;
    }
    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    if (create(&o, &l->ctx) != SDPA_OK) {
        fprintf(stderr, "bench_ab_libs: %s: context creation failed\n", path);
        return 0;
    }
    return 1;
}

/* A [B, S, H, D] tensor of uniform values in (-1, 1), or NULL. */
static void *random_tensor(convert_fn convert, sdpa_dtype t, size_t n)
{
    float *f = malloc(sizeof *f * n);
    void *x = aligned_alloc(64, (n * 4 + 63) / 64 * 64);
    if (!f || !x) {
        free(f), free(x);
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        f[i] = (float)(2.0 * rand() / RAND_MAX - 1.0);
    if (convert(f, SDPA_F32, x, t, n) != SDPA_OK) {
        free(f), free(x);
        return NULL;
    }
    free(f);
    return x;
}

/* A [B, S, H, D] view of the memory, laid out as [B, S, H, D] or, with
 * heads_outer, [B, H, S, D]. */
static sdpa_tensor view(void *data, sdpa_dtype t, int64_t B, int64_t S, int64_t H, int64_t D,
                        int heads_outer)
{
    sdpa_tensor x = {.data = data, .dtype = t, .device = {SDPA_DEVICE_CPU, 0},
                     .size = {B, S, H, D}, .stride = {S * H * D, H * D, D, 1}};
    if (heads_outer)
        x.stride[1] = D, x.stride[2] = S * D;
    return x;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: bench_ab_libs OLD.so NEW.so [--dtype f32|bf16|f16] [--reps N] "
                        "[--causal top-left] [--layout bshd|bhsd] [--burst N] [--backward] "
                        "B,Sq,Skv,Hq,Hkv,D ...\n");
        return 2;
    }
    sdpa_dtype dtype = SDPA_BF16;
    int reps = 31, first_shape = 3, heads_outer = 0, burst = 1, backward = 0;
    sdpa_params params = SDPA_PARAMS_DEFAULT;
    for (; first_shape < argc && argv[first_shape][0] == '-'; first_shape += 2) {
        const char *f = argv[first_shape], *v = first_shape + 1 < argc ? argv[first_shape + 1] : "";
        if (!strcmp(f, "--backward")) { /* a flag: no value */
            backward = 1;
            first_shape--;
        } else if (!strcmp(f, "--dtype") && (!strcmp(v, "f32") || !strcmp(v, "bf16") || !strcmp(v, "f16"))) {
            dtype = !strcmp(v, "f32") ? SDPA_F32 : !strcmp(v, "bf16") ? SDPA_BF16 : SDPA_F16;
        } else if (!strcmp(f, "--reps") && atoi(v) >= 3 && atoi(v) <= 100000) {
            reps = atoi(v);
        } else if (!strcmp(f, "--burst") && atoi(v) >= 1 && atoi(v) <= 10000) {
            burst = atoi(v);
        } else if (!strcmp(f, "--causal") && !strcmp(v, "top-left")) {
            params.causal = SDPA_CAUSAL_TOP_LEFT;
        } else if (!strcmp(f, "--layout") && (!strcmp(v, "bshd") || !strcmp(v, "bhsd"))) {
            heads_outer = !strcmp(v, "bhsd");
        } else {
            fprintf(stderr, "bench_ab_libs: %s %s: expected --dtype f32|bf16|f16, --reps N "
                            "(3 or more), --causal top-left, --layout bshd|bhsd, --burst N (1 or more) or "
                            "--backward\n", f, v);
            return 2;
        }
    }
    lib libs[2];
    convert_fn convert = NULL;
    if (!open_lib(&libs[0], argv[1], &convert) || !open_lib(&libs[1], argv[2], NULL))
        return 1;
    double *times[2] = {malloc(sizeof(double) * (size_t)reps), malloc(sizeof(double) * (size_t)reps)};
    double *ratio = malloc(sizeof(double) * (size_t)reps);
    if (!times[0] || !times[1] || !ratio)
        return 1;
    printf("# bench_ab_libs: old %s, new %s; %s%s, causal %s, layout %s, %d pairs of %d call%s per "
           "shape, the order alternating; backend %s\n", argv[1], argv[2],
           backward ? "backward, " : "",
           dtype == SDPA_F32 ? "f32" : dtype == SDPA_BF16 ? "bf16" : "f16",
           params.causal == SDPA_CAUSAL_TOP_LEFT ? "top-left" : "none",
           heads_outer ? "bhsd" : "bshd", reps, burst, burst > 1 ? "s" : "",
           getenv("SDPA_BACKEND") ? getenv("SDPA_BACKEND") : "the dispatcher's choice");
    printf("%-26s %10s %10s %10s %10s %8s %8s %8s\n", "shape B,Sq,Skv,Hq,Hkv,D", "old_ms",
           "old_min", "new_ms", "new_min", "new/old", "q1", "q3");
    srand(1);
    for (int a = first_shape; a < argc; a++) {
        long long B, Sq, Skv, Hq, Hkv, D;
        char tail;
        if (sscanf(argv[a], "%lld,%lld,%lld,%lld,%lld,%lld%c", &B, &Sq, &Skv, &Hq, &Hkv, &D,
                   &tail) != 6 || B < 1 || Sq < 1 || Skv < 1 || Hkv < 1 || Hq < Hkv ||
            Hq % Hkv || D < 1) {
            fprintf(stderr, "bench_ab_libs: shape '%s': expected B,Sq,Skv,Hq,Hkv,D (positive, "
                            "Hq a multiple of Hkv)\n", argv[a]);
            return 2;
        }
        const size_t nq = (size_t)(B * Sq * Hq * D), nk = (size_t)(B * Skv * Hkv * D);
        void *q = random_tensor(convert, dtype, nq), *k = random_tensor(convert, dtype, nk);
        void *v = random_tensor(convert, dtype, nk), *o = random_tensor(convert, dtype, nq);
        if (!q || !k || !v || !o) {
            fprintf(stderr, "bench_ab_libs: shape '%s': out of memory\n", argv[a]);
            return 1;
        }
        const sdpa_tensor tq = view(q, dtype, B, Sq, Hq, D, heads_outer);
        const sdpa_tensor tk = view(k, dtype, B, Skv, Hkv, D, heads_outer);
        const sdpa_tensor tv = view(v, dtype, B, Skv, Hkv, D, heads_outer);
        sdpa_tensor to = view(o, dtype, B, Sq, Hq, D, heads_outer);
        /* --backward: the output's gradient and the three gradients, and
         * the forward's LSE (from the old library's forward, below) */
        void *dout = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
        float *lse = NULL;
        if (backward) {
            dout = random_tensor(convert, dtype, nq), dq = random_tensor(convert, dtype, nq);
            dk = random_tensor(convert, dtype, nk), dv = random_tensor(convert, dtype, nk);
            lse = malloc(sizeof(float) * (size_t)(B * Hq * Sq));
            if (!dout || !dq || !dk || !dv || !lse) {
                fprintf(stderr, "bench_ab_libs: shape '%s': out of memory\n", argv[a]);
                return 1;
            }
        }
        const sdpa_tensor tdo = view(dout, dtype, B, Sq, Hq, D, heads_outer);
        sdpa_tensor tdq = view(dq, dtype, B, Sq, Hq, D, heads_outer);
        sdpa_tensor tdk = view(dk, dtype, B, Skv, Hkv, D, heads_outer);
        sdpa_tensor tdv = view(dv, dtype, B, Skv, Hkv, D, heads_outer);
        if (backward && libs[0].forward(libs[0].ctx, &tq, &tk, &tv, &to, lse, &params) != SDPA_OK) {
            fprintf(stderr, "bench_ab_libs: shape '%s': %s failed the forward call\n", argv[a],
                    argv[1]);
            return 1;
        }
#define CALL(l)                                                                                \
    (backward ? (l).backward((l).ctx, &tq, &tk, &tv, &to, lse, &tdo, NULL, &tdq, &tdk, &tdv,    \
                             &params)                                                          \
              : (l).forward((l).ctx, &tq, &tk, &tv, &to, NULL, &params))
        for (int i = 0; i < 2; i++)
            for (int w = 0; w < 2; w++) /* warm: pools, tiles, packing buffers */
                if (CALL(libs[i]) != SDPA_OK) {
                    fprintf(stderr, "bench_ab_libs: shape '%s': %s failed the call\n", argv[a],
                            argv[1 + i]);
                    return 1;
                }
        for (int n = 0; n < reps; n++)
            for (int j = 0; j < 2; j++) {
                const int i = n & 1 ? 1 - j : j;
                const double t0 = now();
                for (int r = 0; r < burst; r++)
                    CALL(libs[i]);
                times[i][n] = (now() - t0) / burst;
            }
#undef CALL
        for (int n = 0; n < reps; n++)
            ratio[n] = times[1][n] / times[0][n];
        qsort(times[0], (size_t)reps, sizeof(double), cmp);
        qsort(times[1], (size_t)reps, sizeof(double), cmp);
        qsort(ratio, (size_t)reps, sizeof(double), cmp);
        printf("%-26s %10.3f %10.3f %10.3f %10.3f %8.3f %8.3f %8.3f\n", argv[a],
               1e3 * times[0][reps / 2], 1e3 * times[0][0], 1e3 * times[1][reps / 2],
               1e3 * times[1][0], ratio[reps / 2], ratio[reps / 4], ratio[3 * reps / 4]);
        fflush(stdout);
        free(q), free(k), free(v), free(o);
        free(dout), free(dq), free(dk), free(dv), free(lse);
    }
    for (int i = 0; i < 2; i++)
        libs[i].destroy(libs[i].ctx);
    free(times[0]), free(times[1]), free(ratio);
    return 0;
}
