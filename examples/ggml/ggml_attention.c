/*
 * ggml_attention.c - libsdpa as a ggml operator, against ggml's own
 * ggml_flash_attn_ext, in one process on the same values.
 *
 * Both run as a node of a ggml graph on ggml's threads
 * (ggml_graph_compute_with_ctx): ggml_flash_attn_ext with Q f32, K and V
 * f16 and GGML_PREC_F32, as stable-diffusion.cpp calls it with flash
 * attention on; and sdpa_ggml_attention (include/sdpa_ggml.h) on the same
 * tensors, a mixed call whose shares ggml's threads compute. Outputs are
 * compared with each other and with a float64 reference on the same
 * (f16) K and V; a second sdpa node reads q, k and v as stable-diffusion.cpp
 * holds them before its ggml_cont (a permuted view of [D*H, S, B]), with no
 * copy.
 *
 *   ggml_attention [--threads N]            check: exits 1 on a mismatch
 *   ggml_attention --bench [--threads N] [--reps N]
 *                  interleaved medians, GFLOP/s, the fp32 ceiling measured
 *                  in the same run
 */
#include "sdpa_ggml.h"

#include "ggml-cpu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct shape {
    const char *name;
    int64_t B, Sq, Skv, H, D;
} shape;

/* diffusion shapes (a few heads of each: GFLOP/s is per head) */
static const shape bench_shapes[] = {
    {"sd1.5 64x64 latent, self, D 40", 1, 4096, 4096, 2, 40},
    {"sd1.5 32x32 latent, self, D 80", 1, 1024, 1024, 4, 80},
    {"sd1.5 64x64 x 77 text, cross, D 40", 1, 4096, 77, 8, 40},
    {"flux/sd3 1024px, self, D 128", 1, 4608, 4608, 1, 128},
    {"sdxl 32x32, self, D 64", 1, 1024, 1024, 8, 64},
    {"wan-like 3-D tokens, self, D 128", 1, 2048, 2048, 2, 128},
};

static const shape check_shapes[] = {
    {"self", 1, 300, 300, 3, 64},
    {"cross 77", 2, 129, 77, 2, 40},
    {"odd", 1, 97, 211, 2, 80},
    {"D 128", 1, 256, 256, 2, 128},
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float uniform(void) /* [-1, 1) */
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 40) * (2.0 / 16777216.0) - 1.0);
}

/* float64 attention of [D, S, H, B] element (d, s, h, b) getters */
static double ref_out(const float *q, const float *k, const float *v, const shape *s, int64_t b,
                      int64_t i, int64_t h, double *o)
{
    const int64_t D = s->D, S = s->Skv;
    const double scale = 1.0 / sqrt((double)D);
    double m = -INFINITY, l = 0;
    double *p = malloc(sizeof(double) * (size_t)S);
    const float *qi = q + ((b * s->H + h) * s->Sq + i) * D;
    for (int64_t j = 0; j < S; j++) {
        const float *kj = k + ((b * s->H + h) * S + j) * D;
        double dot = 0;
        for (int64_t d = 0; d < D; d++)
            dot += (double)qi[d] * kj[d];
        p[j] = dot * scale;
        m = p[j] > m ? p[j] : m;
    }
    for (int64_t d = 0; d < D; d++)
        o[d] = 0;
    for (int64_t j = 0; j < S; j++) {
        const double w = exp(p[j] - m);
        l += w;
        const float *vj = v + ((b * s->H + h) * S + j) * D;
        for (int64_t d = 0; d < D; d++)
            o[d] += w * vj[d];
    }
    for (int64_t d = 0; d < D; d++)
        o[d] /= l;
    free(p);
    return m;
}

/* One shape's graphs: ggml's node and libsdpa's on the same tensors. */
typedef struct problem {
    struct ggml_context *g;
    struct ggml_tensor *q, *k, *v, *fa, *ours, *ours_view;
    struct ggml_cgraph *gf_fa, *gf_ours, *gf_view;
    sdpa_ggml_op op, op_view;
} problem;

static int problem_make(problem *p, const shape *s, sdpa_context *ctx, int with_view)
{
    memset(p, 0, sizeof *p);
    const size_t n_q = (size_t)(s->B * s->Sq * s->H * s->D), n_kv = (size_t)(s->B * s->Skv * s->H * s->D);
    /* tensors, the work buffer ggml_graph_compute_with_ctx takes from the
     * context (flash attention: a few rows per thread), the views' copies */
    struct ggml_init_params ip = {(n_q * 4 * 6 + n_kv * 2 * 6) + (256u << 20), NULL, false};
    p->g = ggml_init(ip);
    if (!p->g)
        return 0;
    p->q = ggml_new_tensor_4d(p->g, GGML_TYPE_F32, s->D, s->Sq, s->H, s->B);
    p->k = ggml_new_tensor_4d(p->g, GGML_TYPE_F16, s->D, s->Skv, s->H, s->B);
    p->v = ggml_new_tensor_4d(p->g, GGML_TYPE_F16, s->D, s->Skv, s->H, s->B);
    float *q = p->q->data;
    ggml_fp16_t *k = p->k->data, *v = p->v->data;
    for (size_t i = 0; i < n_q; i++)
        q[i] = uniform();
    for (size_t i = 0; i < n_kv; i++)
        k[i] = ggml_fp32_to_fp16(uniform()), v[i] = ggml_fp32_to_fp16(uniform());
    const float scale = 1.0f / sqrtf((float)s->D);
    p->fa = ggml_flash_attn_ext(p->g, p->q, p->k, p->v, NULL, scale, 0.0f, 0.0f);
    ggml_flash_attn_ext_set_prec(p->fa, GGML_PREC_F32);
    sdpa_ggml_op_init(&p->op, ctx, scale);
    p->ours = sdpa_ggml_attention(p->g, p->q, p->k, p->v, &p->op);
    p->gf_fa = ggml_new_graph(p->g);
    ggml_build_forward_expand(p->gf_fa, p->fa);
    p->gf_ours = ggml_new_graph(p->g);
    ggml_build_forward_expand(p->gf_ours, p->ours);
    if (with_view) {
        /* stable-diffusion.cpp's q before its ggml_cont: [D*H, S, B] viewed
         * [D, H, S, B] and permuted to [D, S, H, B] (the same values laid
         * out heads-inner); libsdpa reads the view as it is */
        struct ggml_tensor *qa = ggml_new_tensor_3d(p->g, GGML_TYPE_F32, s->D * s->H, s->Sq, s->B);
        struct ggml_tensor *ka = ggml_new_tensor_3d(p->g, GGML_TYPE_F16, s->D * s->H, s->Skv, s->B);
        struct ggml_tensor *va = ggml_new_tensor_3d(p->g, GGML_TYPE_F16, s->D * s->H, s->Skv, s->B);
        for (int64_t b = 0; b < s->B; b++)
            for (int64_t h = 0; h < s->H; h++) {
                for (int64_t i = 0; i < s->Sq; i++)
                    memcpy((float *)qa->data + ((b * s->Sq + i) * s->H + h) * s->D,
                           q + ((b * s->H + h) * s->Sq + i) * s->D, sizeof(float) * (size_t)s->D);
                for (int64_t j = 0; j < s->Skv; j++) {
                    memcpy((ggml_fp16_t *)ka->data + ((b * s->Skv + j) * s->H + h) * s->D,
                           k + ((b * s->H + h) * s->Skv + j) * s->D, 2 * (size_t)s->D);
                    memcpy((ggml_fp16_t *)va->data + ((b * s->Skv + j) * s->H + h) * s->D,
                           v + ((b * s->H + h) * s->Skv + j) * s->D, 2 * (size_t)s->D);
                }
            }
        struct ggml_tensor *qv = ggml_permute(
            p->g, ggml_reshape_4d(p->g, qa, s->D, s->H, s->Sq, s->B), 0, 2, 1, 3);
        struct ggml_tensor *kv = ggml_permute(
            p->g, ggml_reshape_4d(p->g, ka, s->D, s->H, s->Skv, s->B), 0, 2, 1, 3);
        struct ggml_tensor *vv = ggml_permute(
            p->g, ggml_reshape_4d(p->g, va, s->D, s->H, s->Skv, s->B), 0, 2, 1, 3);
        sdpa_ggml_op_init(&p->op_view, ctx, scale);
        p->ours_view = sdpa_ggml_attention(p->g, qv, kv, vv, &p->op_view);
        p->gf_view = ggml_new_graph(p->g);
        ggml_build_forward_expand(p->gf_view, p->ours_view);
    }
    return 1;
}

/* max |a - b| over two [D, H, Sq, B] float32 results */
static double max_diff(const struct ggml_tensor *a, const struct ggml_tensor *b)
{
    const float *x = a->data, *y = b->data;
    double m = 0;
    for (int64_t i = 0; i < ggml_nelements(a); i++) {
        const double d = fabs((double)x[i] - y[i]);
        m = d > m || d != d ? d : m;
    }
    return m;
}

/* max |result - float64| over every row of a [D, H, Sq, B] result */
static double ref_diff(const problem *p, const shape *s, const struct ggml_tensor *r)
{
    const int64_t n_kv = s->B * s->Skv * s->H * s->D;
    float *k = malloc(sizeof(float) * (size_t)n_kv), *v = malloc(sizeof(float) * (size_t)n_kv);
    for (int64_t i = 0; i < n_kv; i++) {
        k[i] = ggml_fp16_to_fp32(((ggml_fp16_t *)p->k->data)[i]);
        v[i] = ggml_fp16_to_fp32(((ggml_fp16_t *)p->v->data)[i]);
    }
    double *o = malloc(sizeof(double) * (size_t)s->D), m = 0;
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t h = 0; h < s->H; h++)
            for (int64_t i = 0; i < s->Sq; i++) {
                ref_out(p->q->data, k, v, s, b, i, h, o);
                const float *got = (const float *)r->data + ((b * s->Sq + i) * s->H + h) * s->D;
                for (int64_t d = 0; d < s->D; d++) {
                    const double e = fabs(got[d] - o[d]);
                    m = e > m || e != e ? e : m;
                }
            }
    free(k), free(v), free(o);
    return m;
}

int sdpa_ggml_cxx_status(void); /* cxx_include.cpp: the header compiled as C++ */

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int threads = 2, reps = 5, bench = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bench"))
            bench = 1;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: ggml_attention [--bench] [--threads N] [--reps N]\n");
            return 2;
        }
    }
    if (threads < 1 || reps < 1 || reps > 100) {
        fprintf(stderr, "ggml_attention: --threads >= 1, --reps 1..100\n");
        return 2;
    }
    if (sdpa_ggml_cxx_status() != SDPA_OK)
        return 1;
    ggml_cpu_init();
    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    o.threads = threads; /* for the ceiling probe only: the node runs on ggml's threads */
    sdpa_context *ctx;
    if (sdpa_context_create(&o, &ctx) != SDPA_OK) {
        fprintf(stderr, "ggml_attention: %s\n", sdpa_last_error());
        return 1;
    }
    char *info = NULL;
    sdpa_info(ctx, 0, &info);
    const char *cpu = info ? strstr(info, "cpu ") : NULL; /* info's "cpu  MODEL" line */
    printf("# ggml_attention: libsdpa %s as a ggml custom op vs ggml_flash_attn_ext "
           "(Q f32, K/V f16, GGML_PREC_F32), %d ggml threads\n# %.*s\n",
           sdpa_version(), threads, cpu ? (int)strcspn(cpu, "\n") : 0, cpu ? cpu : "");
    sdpa_free(info);
    int failed = 0;
    if (!bench) {
        for (size_t i = 0; i < sizeof check_shapes / sizeof *check_shapes; i++) {
            const shape *s = &check_shapes[i];
            problem p;
            if (!problem_make(&p, s, ctx, 1)) {
                fprintf(stderr, "ggml_attention: ggml_init failed\n");
                return 1;
            }
            ggml_graph_compute_with_ctx(p.g, p.gf_fa, threads);
            ggml_graph_compute_with_ctx(p.g, p.gf_ours, threads);
            ggml_graph_compute_with_ctx(p.g, p.gf_view, threads);
            const double e_ggml = ref_diff(&p, s, p.fa), e_ours = ref_diff(&p, s, p.ours);
            const double e_view = max_diff(p.ours_view, p.ours), apart = max_diff(p.fa, p.ours);
            /* libsdpa keeps Q in f32 (f32 products): f32 accumulation error;
             * ggml rounds Q to f16 for its dot products: its error is larger */
            const int ok = p.op.status == SDPA_OK && p.op_view.status == SDPA_OK &&
                           e_ours <= 2e-5 && e_view == 0.0 && apart <= 2e-2;
            printf("%-10s B=%lld Sq=%lld Skv=%lld H=%lld D=%lld  |libsdpa-f64| %.2g  "
                   "|ggml-f64| %.2g  |libsdpa-ggml| %.2g  view==cont %s  %s\n",
                   s->name, (long long)s->B, (long long)s->Sq, (long long)s->Skv,
                   (long long)s->H, (long long)s->D, e_ours, e_ggml, apart,
                   e_view == 0.0 ? "yes" : "NO", ok ? "ok" : "FAIL");
            if (p.op.status != SDPA_OK)
                printf("  libsdpa: %s\n", sdpa_last_error());
            failed += !ok;
            ggml_free(p.g);
        }
        printf("ggml_attention: %zu checked, %d failed\n",
               sizeof check_shapes / sizeof *check_shapes, failed);
    } else {
        double ceiling = 0;
        const char *isa = "";
        if (sdpa_measure_ceiling(ctx, "fp32", &ceiling, &isa) != SDPA_OK)
            ceiling = 0;
        printf("# fp32 FMA ceiling %.0f GFLOP/s (%s, %d threads, measured now); medians of %d "
               "interleaved repetitions after one warm-up each\n",
               ceiling, isa, threads, reps);
        printf("%-36s %6s %6s %4s %4s %10s %10s %8s %8s %8s\n", "shape", "Sq", "Skv", "H", "D",
               "ggml ms", "libsdpa ms", "speedup", "ggml %", "ours %");
        for (size_t i = 0; i < sizeof bench_shapes / sizeof *bench_shapes; i++) {
            const shape *s = &bench_shapes[i];
            problem p;
            if (!problem_make(&p, s, ctx, 0)) {
                fprintf(stderr, "ggml_attention: ggml_init failed\n");
                return 1;
            }
            double t_fa[100], t_ours[100];
            ggml_graph_compute_with_ctx(p.g, p.gf_fa, threads);
            ggml_graph_compute_with_ctx(p.g, p.gf_ours, threads);
            for (int r = 0; r < reps; r++) {
                double t0 = now_ms();
                ggml_graph_compute_with_ctx(p.g, p.gf_fa, threads);
                double t1 = now_ms();
                ggml_graph_compute_with_ctx(p.g, p.gf_ours, threads);
                double t2 = now_ms();
                t_fa[r] = t1 - t0, t_ours[r] = t2 - t1;
            }
            qsort(t_fa, (size_t)reps, sizeof(double), cmp_double);
            qsort(t_ours, (size_t)reps, sizeof(double), cmp_double);
            const double fa = t_fa[reps / 2], ours = t_ours[reps / 2];
            const double gflop = 4.0 * (double)(s->B * s->H * s->Sq * s->Skv * s->D) / 1e9;
            printf("%-36s %6lld %6lld %4lld %4lld %10.2f %10.2f %7.2fx %7.1f%% %7.1f%%  "
                   "|diff| %.1g%s\n",
                   s->name, (long long)s->Sq, (long long)s->Skv, (long long)s->H,
                   (long long)s->D, fa, ours, fa / ours,
                   ceiling > 0 ? 100.0 * gflop / (fa / 1e3) / ceiling : 0.0,
                   ceiling > 0 ? 100.0 * gflop / (ours / 1e3) / ceiling : 0.0,
                   max_diff(p.fa, p.ours), p.op.status == SDPA_OK ? "" : "  libsdpa FAILED");
            failed += p.op.status != SDPA_OK;
            ggml_free(p.g);
        }
    }
    sdpa_context_destroy(ctx);
    return failed ? 1 : 0;
}
