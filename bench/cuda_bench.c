/*
 * cuda_bench.c - the GPU benchmark: every present cuda.* backend on the
 * rows of a shape suite (diffusion-gpu.tsv), side by side, against the
 * bf16 matrix ceiling measured in the same run, with the dispatcher's
 * choice next to the fastest backend.
 *
 * usage: cuda_bench SUITE.tsv [--reps N] [--max-flops F] [--dtype bf16|f16]
 *
 * Method: device tensors in BSHD with random values in [-1, 1) (never
 * zeros: they run faster than real data), output in the input dtype. Per
 * row and backend: sdpa_warmup (cuDNN builds its plan there) and one
 * untimed call; then N rounds, each timing every backend once with CUDA
 * events, starting at a different backend each round. Reported: median
 * ms, TFLOP/s from the median (4 B Hq Sq Skv D; halved for causal), % of
 * the ceiling, and the output's relative L2 difference from cuda.unfused
 * (the GPU-side reference). Rows above --max-flops (default 2e13, a few
 * seconds per row on cuda.unfused) are listed as skipped.
 *
 * Ceiling: cuBLAS bf16 GEMM (fp32 accumulation), 8192^3, best of 10, on
 * random data.
 *
 * Built only with the CUDA toolkit; scripts/gpu-check.sh runs it. It uses
 * libsdpa's public API only, plus the CUDA runtime and cuBLAS for the
 * tensors and the ceiling.
 */
#include "sdpa.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ROWS 64
#define MAX_BACKENDS 3

typedef struct shape_row {
    char name[64];
    long long B, Sq, Skv, Hq, Hkv, D, causal;
    long long seq_len_kv; /* the suite's optional seq_len_kv=N column: real keys, or 0 */
} shape_row;

static int load_rows(const char *path, shape_row *rows, int *n)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "cuda_bench: cannot open %s\n", path);
        return 0;
    }
    char line[512];
    *n = 0;
    while (fgets(line, sizeof line, f) && *n < MAX_ROWS) {
        shape_row *r = &rows[*n];
        if (line[0] == '#' || line[0] == '\n')
            continue;
        int used = 0;
        r->seq_len_kv = 0;
        if (sscanf(line, "%63s %lld %lld %lld %lld %lld %lld %lld%n", r->name, &r->B, &r->Sq,
                   &r->Skv, &r->Hq, &r->Hkv, &r->D, &r->causal, &used) == 8) {
            /* padded rows: the real keys of every batch entry (sdpa bench's format) */
            const char *pad = strstr(line + used, "seq_len_kv=");
            if (pad && sscanf(pad + 11, "%lld", &r->seq_len_kv) != 1)
                r->seq_len_kv = 0;
            (*n)++;
        }
    }
    fclose(f);
    return *n > 0;
}

/* bits of bf16 / f16 random values in [-1, 1) */
static void fill_random(uint16_t *h, size_t n, int bf16, uint64_t *state)
{
    for (size_t i = 0; i < n; i++) {
        *state ^= *state << 13, *state ^= *state >> 7, *state ^= *state << 17;
        const float x = (float)((double)(*state >> 11) * (2.0 / 9007199254740992.0) - 1.0);
        uint32_t u;
        memcpy(&u, &x, 4);
        if (bf16) {
            h[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
        } else { /* |x| < 1: normal or subnormal half, truncated is fine for test data */
            const int e = (int)((u >> 23) & 0xff) - 127 + 15;
            h[i] = e <= 0 ? (uint16_t)((u >> 16) & 0x8000u)
                          : (uint16_t)(((u >> 16) & 0x8000u) | ((unsigned)e << 10) |
                                       ((u >> 13) & 0x3ffu));
        }
    }
}

static double median(double *x, int n)
{
    for (int i = 1; i < n; i++) /* insertion sort: n is small */
        for (int j = i; j > 0 && x[j - 1] > x[j]; j--) {
            double t = x[j];
            x[j] = x[j - 1], x[j - 1] = t;
        }
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "cuda_bench: %s: %s\n", #call, cudaGetErrorString(e_));             \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* cuBLAS bf16 GEMM TFLOP/s, the matrix ceiling every figure is a share of. */
static double gemm_ceiling(void)
{
    const int n = 8192;
    const size_t elems = (size_t)n * n;
    uint16_t *h = malloc(elems * 2);
    void *a, *b, *c;
    CK(cudaMalloc(&a, elems * 2));
    CK(cudaMalloc(&b, elems * 2));
    CK(cudaMalloc(&c, elems * 4));
    uint64_t st = 12345;
    fill_random(h, elems, 1, &st);
    CK(cudaMemcpy(a, h, elems * 2, cudaMemcpyHostToDevice));
    fill_random(h, elems, 1, &st);
    CK(cudaMemcpy(b, h, elems * 2, cudaMemcpyHostToDevice));
    free(h);
    cublasHandle_t handle;
    if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS)
        return 0;
    const float one = 1.0f, zero = 0.0f;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    double best = 0;
    for (int rep = 0; rep < 12; rep++) {
        cudaEventRecord(e0, 0);
        cublasStatus_t s = cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a,
                                        CUDA_R_16BF, n, b, CUDA_R_16BF, n, &zero, c, CUDA_R_32F, n,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (s == CUBLAS_STATUS_SUCCESS && rep >= 2 && ms > 0)
            best = fmax(best, 2.0 * n * (double)n * n / (ms * 1e-3) / 1e12);
    }
    cublasDestroy(handle);
    cudaFree(a), cudaFree(b), cudaFree(c);
    return best;
}

/* Relative L2 difference of two device outputs of n 16-bit values. */
static double rel_l2(const void *x, const void *y, size_t n, int bf16)
{
    uint16_t *a = malloc(n * 2), *b = malloc(n * 2);
    cudaMemcpy(a, x, n * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(b, y, n * 2, cudaMemcpyDeviceToHost);
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        float fa, fb;
        if (bf16) {
            uint32_t ua = (uint32_t)a[i] << 16, ub = (uint32_t)b[i] << 16;
            memcpy(&fa, &ua, 4), memcpy(&fb, &ub, 4);
        } else { /* normal halves only: outputs are averages of values in [-1, 1) */
            uint32_t ua = ((uint32_t)(a[i] & 0x8000u) << 16) |
                          ((a[i] & 0x7fffu) ? ((((a[i] >> 10) & 0x1fu) + 112u) << 23) |
                                                  ((uint32_t)(a[i] & 0x3ffu) << 13)
                                            : 0u);
            uint32_t ub = ((uint32_t)(b[i] & 0x8000u) << 16) |
                          ((b[i] & 0x7fffu) ? ((((b[i] >> 10) & 0x1fu) + 112u) << 23) |
                                                  ((uint32_t)(b[i] & 0x3ffu) << 13)
                                            : 0u);
            memcpy(&fa, &ua, 4), memcpy(&fb, &ub, 4);
        }
        num += ((double)fa - fb) * ((double)fa - fb);
        den += (double)fb * fb;
    }
    free(a), free(b);
    return den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr,
                "usage: cuda_bench SUITE.tsv [--reps N] [--max-flops F] [--dtype bf16|f16]\n");
        return 2;
    }
    int reps = 5, bf16 = 1;
    double max_flops = 2e13;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--reps") == 0)
            reps = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--max-flops") == 0)
            max_flops = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--dtype") == 0 && strcmp(argv[i + 1], "f16") == 0)
            bf16 = 0;
        else if (strcmp(argv[i], "--dtype") != 0 || strcmp(argv[i + 1], "bf16") != 0) {
            fprintf(stderr, "cuda_bench: unknown argument '%s %s'\n", argv[i], argv[i + 1]);
            return 2;
        }
    }
    if (reps < 1 || reps > 100) {
        fprintf(stderr, "cuda_bench: --reps %d, expected 1..100\n", reps);
        return 2;
    }
    shape_row rows[MAX_ROWS];
    int n_rows;
    if (!load_rows(argv[1], rows, &n_rows))
        return 2;
    sdpa_context *ctx;
    if (sdpa_context_create(NULL, &ctx) != SDPA_OK) {
        fprintf(stderr, "cuda_bench: %s\n", sdpa_last_error());
        return 1;
    }
    static const char *all[MAX_BACKENDS] = {"cuda.cudnn", "cuda.flash", "cuda.unfused"};
    const char *names[MAX_BACKENDS];
    int nb = 0, unfused = -1;
    for (int a = 0; a < MAX_BACKENDS; a++)
        for (int i = 0; i < sdpa_backend_count(ctx); i++) {
            sdpa_backend_info bi;
            if (sdpa_backend_get(ctx, i, &bi) == SDPA_OK && strcmp(bi.name, all[a]) == 0) {
                if (bi.present) {
                    if (strcmp(all[a], "cuda.unfused") == 0)
                        unfused = nb;
                    names[nb++] = all[a];
                } else {
                    printf("# %s: %s\n", all[a], bi.why_absent);
                }
            }
        }
    if (nb == 0) {
        printf("cuda_bench: no cuda.* backend is present here\n");
        sdpa_context_destroy(ctx);
        return 0;
    }
    const sdpa_platform *plat = sdpa_context_platform(ctx);
    const double ceiling = gemm_ceiling();
    printf("# cuda_bench %s  %s (sm_%d%d, %d SMs)  %s  %d reps, CUDA events\n", sdpa_version(),
           plat->gpu_name, plat->cc_major, plat->cc_minor, plat->sm_count, bf16 ? "bf16" : "f16",
           reps);
    printf("# ceiling: cuBLAS bf16 GEMM 8192^3 %.0f TFLOP/s (this run)\n", ceiling);
    printf("%-20s %-13s %10s %9s %6s %9s  %s\n", "row", "backend", "median_ms", "TFLOP/s", "%peak",
           "relL2", "");
    const sdpa_dtype dt = bf16 ? SDPA_BF16 : SDPA_F16;
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    int worst_ok = 1, unchecked = 0;
    double worst_gap = 0;
    for (int r = 0; r < n_rows; r++) {
        const shape_row *w = &rows[r];
        const double keys = w->seq_len_kv > 0 ? (double)w->seq_len_kv : (double)w->Skv;
        const double flops = 4.0 * w->B * w->Hq * w->Sq * keys * w->D / (w->causal ? 2.0 : 1.0);
        if (flops > max_flops) {
            printf("%-20s skipped: %.2g FLOPs > --max-flops %.2g\n", w->name, flops, max_flops);
            continue;
        }
        const size_t nq = (size_t)(w->B * w->Sq * w->Hq * w->D),
                     nk = (size_t)(w->B * w->Skv * w->Hkv * w->D);
        void *q, *k, *v, *o[MAX_BACKENDS];
        uint16_t *h = malloc((nq > nk ? nq : nk) * 2);
        CK(cudaMalloc(&q, nq * 2));
        CK(cudaMalloc(&k, nk * 2));
        CK(cudaMalloc(&v, nk * 2));
        fill_random(h, nq, bf16, &seed);
        CK(cudaMemcpy(q, h, nq * 2, cudaMemcpyHostToDevice));
        fill_random(h, nk, bf16, &seed);
        CK(cudaMemcpy(k, h, nk * 2, cudaMemcpyHostToDevice));
        fill_random(h, nk, bf16, &seed);
        CK(cudaMemcpy(v, h, nk * 2, cudaMemcpyHostToDevice));
        free(h);
        sdpa_tensor tq = sdpa_tensor_bshd(q, dt, w->B, w->Sq, w->Hq, w->D);
        sdpa_tensor tk = sdpa_tensor_bshd(k, dt, w->B, w->Skv, w->Hkv, w->D);
        sdpa_tensor tv = sdpa_tensor_bshd(v, dt, w->B, w->Skv, w->Hkv, w->D);
        tq.device = tk.device = tv.device = (sdpa_device){SDPA_DEVICE_CUDA, 0};
        sdpa_tensor to[MAX_BACKENDS];
        char refused[MAX_BACKENDS][200];
        double t[MAX_BACKENDS][100];
        sdpa_params p = SDPA_PARAMS_DEFAULT;
        p.causal = w->causal ? SDPA_CAUSAL_TOP_LEFT : SDPA_CAUSAL_NONE;
        /* a padded row: its lengths in device memory, as the CUDA backends read them */
        int32_t *lens = NULL;
        sdpa_mask mask = SDPA_MASK_DEFAULT;
        if (w->seq_len_kv > 0) {
            int32_t host_lens[64];
            const long long nb_lens = w->B < 64 ? w->B : 64;
            for (long long i = 0; i < nb_lens; i++)
                host_lens[i] = (int32_t)w->seq_len_kv;
            CK(cudaMalloc((void **)&lens, sizeof(int32_t) * (size_t)nb_lens));
            CK(cudaMemcpy(lens, host_lens, sizeof(int32_t) * (size_t)nb_lens,
                          cudaMemcpyHostToDevice));
            mask.seq_len_kv = lens;
            p.mask = &mask;
        }
        for (int b = 0; b < nb; b++) {
            CK(cudaMalloc(&o[b], nq * 2));
            CK(cudaMemset(o[b], 0xff, nq * 2)); /* NaN-poisoned: unwritten output shows */
            to[b] = sdpa_tensor_bshd(o[b], dt, w->B, w->Sq, w->Hq, w->D);
            to[b].device = tq.device;
            p.backend = names[b];
            sdpa_status st = sdpa_warmup(ctx, &tq, &tk, &tv, &to[b], NULL, &p);
            if (st == SDPA_OK)
                st = sdpa_forward(ctx, &tq, &tk, &tv, &to[b], NULL, &p);
            cudaError_t ce = cudaDeviceSynchronize();
            refused[b][0] = '\0';
            if (st != SDPA_OK || ce != cudaSuccess)
                snprintf(refused[b], sizeof refused[b], "%s: %s", sdpa_status_string(st),
                         st != SDPA_OK ? sdpa_last_error() : cudaGetErrorString(ce));
        }
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0), cudaEventCreate(&e1);
        for (int rep = 0; rep < reps; rep++)
            for (int j = 0; j < nb; j++) {
                const int b = (j + rep) % nb;
                if (refused[b][0])
                    continue;
                p.backend = names[b];
                cudaEventRecord(e0, 0);
                sdpa_forward(ctx, &tq, &tk, &tv, &to[b], NULL, &p);
                cudaEventRecord(e1, 0);
                cudaEventSynchronize(e1);
                float ms = 0;
                cudaEventElapsedTime(&ms, e0, e1);
                t[b][rep] = ms;
            }
        /* the dispatcher's choice for this row, by its rules */
        sdpa_call_desc d;
        memset(&d, 0, sizeof d);
        d.device = SDPA_DEVICE_CUDA, d.dtype = dt, d.B = w->B, d.Sq = w->Sq, d.Skv = w->Skv;
        d.Hq = w->Hq, d.Hkv = w->Hkv, d.D = w->D, d.causal = p.causal;
        sdpa_decision dec;
        const char *choice = sdpa_decide(ctx, &d, &dec) == SDPA_OK && dec.n_candidates > 0
                                 ? dec.candidates[0]
                                 : "none";
        double med[MAX_BACKENDS];
        int fastest = -1, chosen = -1;
        for (int b = 0; b < nb; b++) {
            if (refused[b][0])
                continue;
            med[b] = median(t[b], reps);
            if (fastest < 0 || med[b] < med[fastest])
                fastest = b;
            if (strcmp(names[b], choice) == 0)
                chosen = b;
        }
        for (int b = 0; b < nb; b++) {
            if (refused[b][0]) {
                printf("%-20s %-13s refused: %s\n", w->name, names[b], refused[b]);
                continue;
            }
            const double tf = flops / (med[b] * 1e-3) / 1e12;
            /* against cuda.unfused when it ran; a reference that refused or is
             * absent leaves the row unchecked (not a disagreement) */
            const int checked = unfused >= 0 && !refused[unfused][0];
            const double err = checked ? rel_l2(o[b], o[unfused], nq, bf16) : NAN;
            printf("%-20s %-13s %10.3f %9.1f %5.1f%% %9.2e  %s%s%s\n", w->name, names[b], med[b], tf,
                   ceiling > 0 ? 100.0 * tf / ceiling : 0.0, err, b == fastest ? "fastest " : "",
                   b == chosen ? "chosen " : "", checked ? "" : "(unchecked: no reference)");
            if (checked && !(err < 2e-2))
                worst_ok = 0;
            unchecked += !checked;
        }
        if (chosen >= 0 && fastest >= 0) {
            const double gap = med[chosen] / med[fastest] - 1.0;
            worst_gap = gap > worst_gap ? gap : worst_gap;
        }
        cudaEventDestroy(e0), cudaEventDestroy(e1);
        for (int b = 0; b < nb; b++)
            cudaFree(o[b]);
        cudaFree(q), cudaFree(k), cudaFree(v);
        if (lens)
            cudaFree(lens);
    }
    printf("summary: outputs %s (relative L2 vs cuda.unfused < 2e-2; %d unchecked without it); "
           "the dispatcher's choice is at most %.1f%% slower than the fastest backend on any row\n",
           worst_ok ? "agree" : "DISAGREE", unchecked, 100.0 * worst_gap);
    sdpa_context_destroy(ctx);
    return worst_ok ? 0 : 1;
}
