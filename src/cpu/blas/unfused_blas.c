/*
 * unfused_blas.c - cpu.blas: the unfused attention a C programmer writes
 * with OpenBLAS, kept as the in-run baseline of every CPU benchmark (and a
 * candidate wherever it truly wins).
 *
 * Per (batch, head, block of BR = 256 query rows):
 *     S = scale * Q_blk K^T      cblas_sgemm  [BR x Skv]
 *     P = softmax(S) by rows     vectorised (compiled for AVX-512, AVX2 and
 *                                baseline x86-64; picked per call)
 *     O_blk = P V                cblas_sgemm  [BR x D]
 *
 * Costs: a BR x Skv score buffer per thread (8 MiB at Skv = 8190, in the
 * calling thread's scratch, kept between calls up to its limit), and two
 * passes over it (max; exp and sum), which is what the fused kernels avoid. f32 inputs only,
 * with unit stride along D (sgemm's leading dimensions); other inputs are
 * refused at run time. OpenBLAS is set to one thread (process-wide) and
 * libsdpa's pool runs blocks in parallel, so results do not depend on the
 * thread count.
 *
 * OpenBLAS is loaded with dlopen on the first cpu.blas call, not linked:
 * its constructor starts a thread per core and allocates their buffers in
 * every process that links it, and under a memory cap a process then hung
 * at exit in its thread pool, even one that never used cpu.blas. Now only
 * a process that runs cpu.blas pays for (and risks) those threads.
 */
#define _GNU_SOURCE /* dlfcn */
#include "../../core/convert.h"
#include "../../core/backend.h"
#include "../../core/causal.h"
#include "../exp_portable.h"
#include "../mask_row.h"

#include <cblas.h> /* for the prototypes only: nothing here links OpenBLAS */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { BR = 256 };

/*
 * Softmax numerators exp(s - max) of the first n_vis scores of a row, in
 * place; the rest become 0. Returns the denominator l (the output row is
 * divided by it when stored: D divisions, not a third pass over Skv
 * scores), and the max in *m. The body is compiled three
 * times (AVX-512, AVX2, baseline) so the compiler vectorises it for each;
 * the run picks one from the CPU features the context allows. (Not
 * target_clones: its ifunc resolver runs before ThreadSanitizer starts.)
 */
#define SOFTMAX_ROW_BODY                                                                           \
    float mx = -INFINITY;                                                                          \
    for (int64_t j = 0; j < n_vis; j++)                                                            \
        mx = s[j] > mx ? s[j] : mx;                                                                \
    if (mx == -INFINITY) { /* no key, all -inf (masked) or all NaN: rare */                        \
        float l0 = 0.0f;                                                                           \
        for (int64_t j = 0; j < n_vis; j++)                                                        \
            l0 = s[j] != s[j] ? NAN : l0;                                                          \
        memset(s, 0, sizeof(float) * (size_t)n);                                                   \
        *m = mx;                                                                                   \
        return l0;                                                                                 \
    }                                                                                              \
    /* 16 partial sums: one running sum is a serial chain the compiler may                     \
     * not reorder (no -ffast-math), which kept the whole loop scalar */                        \
    float part[16] = {0}, sum = 0.0f;                                                              \
    int64_t j = 0;                                                                                 \
    for (; j + 16 <= n_vis; j += 16)                                                               \
        for (int t = 0; t < 16; t++) {                                                             \
            s[j + t] = sdpa__exp_nonpos(s[j + t] - mx);                                            \
            part[t] += s[j + t];                                                                   \
        }                                                                                          \
    for (; j < n_vis; j++) {                                                                       \
        s[j] = sdpa__exp_nonpos(s[j] - mx);                                                        \
        sum += s[j];                                                                               \
    }                                                                                              \
    for (int t = 0; t < 16; t++)                                                                   \
        sum += part[t];                                                                            \
    for (j = n_vis; j < n; j++)                                                                    \
        s[j] = 0.0f;                                                                               \
    *m = mx;                                                                                       \
    return sum;

typedef float (*softmax_row_fn)(float *s, int64_t n, int64_t n_vis, float *m);

static float softmax_row_default(float *s, int64_t n, int64_t n_vis, float *m)
{
    SOFTMAX_ROW_BODY
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) static float softmax_row_avx2(float *s, int64_t n,
                                                                  int64_t n_vis, float *m)
{
    SOFTMAX_ROW_BODY
}

__attribute__((target("avx512f"))) static float softmax_row_avx512(float *s, int64_t n,
                                                                   int64_t n_vis, float *m)
{
    SOFTMAX_ROW_BODY
}
#endif

static softmax_row_fn pick_softmax(unsigned features)
{
#if defined(__x86_64__)
    if (features & SDPA_CPU_AVX512F)
        return softmax_row_avx512;
    if (features & SDPA_CPU_AVX2)
        return softmax_row_avx2;
#endif
    (void)features;
    return softmax_row_default;
}

/* OpenBLAS, loaded on first use (see the top of the file). */
static __typeof__(&cblas_sgemm) sgemm;
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static char load_error[200];

static void load_openblas(void)
{
    static const char *const names[] = {"libopenblas.so.0", SDPA_OPENBLAS_PATH};
    void *h = NULL;
    for (size_t i = 0; i < sizeof names / sizeof *names && !h; i++)
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(load_error, sizeof load_error, "cpu.blas: cannot load OpenBLAS: %.160s",
                 e ? e : "?");
        return;
    }
    void (*set_threads)(int);
    *(void **)&set_threads = dlsym(h, "openblas_set_num_threads");
    *(void **)&sgemm = dlsym(h, "cblas_sgemm");
    if (!sgemm || !set_threads) {
        snprintf(load_error, sizeof load_error, "cpu.blas: OpenBLAS lacks %s",
                 sgemm ? "openblas_set_num_threads" : "cblas_sgemm");
        sgemm = NULL;
        return;
    }
    set_threads(1); /* libsdpa's pool runs the blocks in parallel */
}

typedef struct blas_job {
    const sdpa_call *c;
    softmax_row_fn softmax_row;
    int64_t n_blocks;
    float *mem; /* per worker: BR x Skv scores + BR x D output */
    size_t per;
} blas_job;

static void blas_task(void *arg, int64_t task, int worker)
{
    const blas_job *j = arg;
    const sdpa_call *c = j->c;
    const sdpa_call_desc *d = &c->desc;
    const int64_t blk = task % j->n_blocks, bh = task / j->n_blocks;
    const int64_t b = bh / d->Hq, h = bh % d->Hq, hk = h / (d->Hq / d->Hkv);
    const int64_t i0 = blk * BR, rows = d->Sq - i0 < BR ? d->Sq - i0 : BR;
    /* Sequence lengths (sdpa.h): padding rows see nothing, keys past the
     * real length are never attended, causal aligns on the real lengths. */
    const sdpa_mask *mk = c->mask;
    int64_t len_q, len_kv;
    sdpa__seq_lens(c, b, &len_q, &len_kv);
    const int64_t offset = sdpa_causal_offset(c->causal, len_q, len_kv);
    const int causal = c->causal != SDPA_CAUSAL_NONE;
    float *s = j->mem + j->per * (size_t)worker, *o = s + (size_t)BR * (size_t)d->Skv;

    /* keys past it are masked for the whole block: what its last row sees */
    const int64_t kv_end = sdpa_causal_visible_keys(c->causal, i0 + rows - 1, len_q, len_kv);
    const float *q = (const float *)c->q->data + sdpa__offset(c->q, b, i0, h, 0);
    const float *k = (const float *)c->k->data + sdpa__offset(c->k, b, 0, hk, 0);
    const float *v = (const float *)c->v->data + sdpa__offset(c->v, b, 0, hk, 0);
    if (kv_end > 0)
        sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)kv_end, (int)d->D,
                    (float)c->scale, q, (int)c->q->stride[1], k, (int)c->k->stride[1], 0.0f, s,
                    (int)kv_end);
    float m[BR], l[BR];
    for (int64_t r = 0; r < rows; r++) {
        int64_t vis = i0 + r < len_q ? kv_end : 0;
        if (causal && vis > 0) {
            int64_t last = i0 + r + offset;
            vis = last < 0 ? 0 : (last + 1 < kv_end ? last + 1 : kv_end);
        }
        if (mk && (mk->key || mk->general))
            sdpa__mask_row(mk, b, h, i0 + r, NULL, 0, s + r * kv_end, vis);
        l[r] = j->softmax_row(s + r * kv_end, kv_end, vis, &m[r]);
    }
    if (kv_end > 0)
        sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)d->D, (int)kv_end,
                    1.0f, s, (int)kv_end, v, (int)c->v->stride[1], 0.0f, o, (int)d->D);
    else
        memset(o, 0, sizeof(float) * (size_t)(rows * d->D));
    for (int64_t r = 0; r < rows; r++)
        sdpa__store_result(c, b, i0 + r, h, o + r * d->D, m[r], l[r], 0);
}


static sdpa_status blas_run(const sdpa_backend *self, const sdpa_call *c)
{
    (void)self;
    const sdpa_tensor *t[3] = {c->q, c->k, c->v};
    static const char *names[3] = {"q", "k", "v"};
    for (int i = 0; i < 3; i++)
        if (t[i]->stride[3] != 1 || t[i]->stride[1] < c->desc.D || t[i]->stride[1] > INT32_MAX)
            return sdpa__fail(SDPA_UNSUPPORTED,
                              "cpu.blas: %s needs unit stride along D and a row stride >= D "
                              "(sgemm leading dimension), got strides S=%lld D=%lld",
                              names[i], (long long)t[i]->stride[1], (long long)t[i]->stride[3]);
    if (c->desc.Skv > INT32_MAX / BR)
        return sdpa__fail(SDPA_UNSUPPORTED, "cpu.blas: Skv %lld too long for int sgemm sizes",
                          (long long)c->desc.Skv);
    pthread_once(&load_once, load_openblas);
    if (!sgemm)
        return sdpa__fail(SDPA_NOT_AVAILABLE, "%s", load_error);
    const sdpa_call_desc *d = &c->desc;
    sdpa_pool *pool = sdpa__pool_for_call(c); /* small calls: the calling thread alone */
    const int threads = sdpa__pool_workers(pool); /* workspaces */
    blas_job j = {c, pick_softmax(c->cpu_features), (d->Sq + BR - 1) / BR, NULL,
                  (size_t)BR * (size_t)d->Skv + (size_t)BR * (size_t)d->D};
    j.mem = sdpa__scratch(sizeof(float) * j.per * (size_t)threads); /* kept between calls */
    if (!j.mem)
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "cpu.blas: cannot allocate %zu bytes of scores",
                          sizeof(float) * j.per * (size_t)threads);
    sdpa__parallel_for(pool, d->B * d->Hq * j.n_blocks, blas_task, &j);
    sdpa__scratch_release(j.mem);
    return SDPA_OK;
}

/* The descriptor (backend.c) reaches the kernel through this. */
sdpa_status sdpa__cpu_blas_run(const sdpa_backend *self, const sdpa_call *call);
sdpa_status sdpa__cpu_blas_run(const sdpa_backend *self, const sdpa_call *call)
{
    return blas_run(self, call);
}
