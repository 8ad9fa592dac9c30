/*
 * peers.c - the C contenders of bench/peers (peers.py drives them): each
 * function runs one attention call `calls` times back to back on the
 * caller's BSHD tensors and returns the seconds per call, timed here in C
 * so that no Python sits inside the measured loop.
 *
 *   peers_libsdpa  libsdpa's public API through a layer (decision cached,
 *                  as a model's attention calls it): the dispatcher's
 *                  choice (backend NULL) or a named backend;
 *   peers_libsdpa_backward  the backward pass of the same call, the same way
 *   peers_openblas the unfused attention a careful C programmer writes
 *                  with OpenBLAS: per (batch, head, block of 256 query
 *                  rows) S = scale Q K^T by cblas_sgemm, a softmax whose
 *                  exp the compiler vectorises (libmvec, this file is
 *                  built with -O3 -ffast-math -march=native), O = P V by
 *                  cblas_sgemm, rows divided by their sum; blocks run in
 *                  parallel under OpenMP with OpenBLAS single-threaded
 *                  inside (the faster arrangement here: 2 threads on a
 *                  256-row block leave OpenBLAS idle at the edges); f32
 *   peers_dnnl     the same blocks with oneDNN's primitives: matmul (bf16
 *                  or f32 inputs, f32 scores, the scale as an output
 *                  scale), softmax v2 (f32 scores to bf16 or f32
 *                  probabilities), matmul P V into the output's dtype;
 *                  oneDNN threads each primitive (OpenMP), primitives
 *                  created once per call shape, outside the timing
 *
 * None of this is libsdpa code: the peers use only their own libraries,
 * so "x openblas" measures libsdpa against them, not against itself.
 */
#include "peers.h"

#include <cblas.h>
#include <dnnl.h>
#include <math.h>
#include <omp.h>
#include <sdpa.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { BR = 256 };

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char last_error[256];
const char *peers_last_error(void) { return last_error; }

/* ---- libsdpa */

static sdpa_context *ctx;
static int ctx_threads;
static const char *choice = ""; /* the backend of the last peers_libsdpa run */
static int ensure_ctx(int threads);

/* dtype: 0 f32, 1 bf16 (q, k, v and out alike). Returns -1 on error
 * (peers_last_error says why). */
double peers_libsdpa(const char *backend, const void *q, const void *k, const void *v, void *out,
                     int64_t B, int64_t Sq, int64_t Skv, int64_t Hq, int64_t Hkv, int64_t D,
                     int dtype, int threads, int calls)
{
    if (ensure_ctx(threads))
        return -1;
    const sdpa_dtype t = dtype ? SDPA_BF16 : SDPA_F32;
    sdpa_tensor tq = sdpa_tensor_bshd((void *)q, t, B, Sq, Hq, D);
    sdpa_tensor tk = sdpa_tensor_bshd((void *)k, t, B, Skv, Hkv, D);
    sdpa_tensor tv = sdpa_tensor_bshd((void *)v, t, B, Skv, Hkv, D);
    sdpa_tensor to = sdpa_tensor_bshd(out, t, B, Sq, Hq, D);
    /* A layer, as a model calls attention again and again: its decision is
     * cached (a one-shot sdpa_forward decides each call: ~1 us here,
     * bench/dispatch_overhead.c). */
    sdpa_layer_desc ld = SDPA_LAYER_DESC_DEFAULT;
    ld.name = "peers";
    ld.backend = backend;
    sdpa_layer *layer;
    if (sdpa_layer_create(ctx, &ld, &layer) != SDPA_OK) {
        snprintf(last_error, sizeof last_error, "libsdpa: %s", sdpa_last_error());
        return -1;
    }
    if (sdpa_layer_forward(layer, &tq, &tk, &tv, &to, NULL, NULL) != SDPA_OK) { /* decides */
        snprintf(last_error, sizeof last_error, "libsdpa: %s", sdpa_last_error());
        sdpa_layer_destroy(layer);
        return -1;
    }
    choice = sdpa_last_backend();
    const double t0 = now_s();
    for (int i = 0; i < calls; i++)
        if (sdpa_layer_forward(layer, &tq, &tk, &tv, &to, NULL, NULL) != SDPA_OK) {
            snprintf(last_error, sizeof last_error, "libsdpa: %s", sdpa_last_error());
            sdpa_layer_destroy(layer);
            return -1;
        }
    const double per_call = (now_s() - t0) / calls;
    sdpa_layer_destroy(layer);
    return per_call;
}

const char *peers_libsdpa_choice(void) { return choice; }

/* The backward pass of the same call (sdpa_layer_backward), from the
 * forward's out (inputs' dtype) and LSE, into dq, dk, dv of the inputs'
 * dtype; seconds per call, or -1 (peers_last_error). */
double peers_libsdpa_backward(const char *backend, const void *q, const void *k, const void *v,
                              const void *out, const float *lse, const void *dout, void *dq,
                              void *dk, void *dv, int64_t B, int64_t Sq, int64_t Skv, int64_t Hq,
                              int64_t Hkv, int64_t D, int dtype, int threads, int calls)
{
    if (ensure_ctx(threads))
        return -1;
    const sdpa_dtype t = dtype ? SDPA_BF16 : SDPA_F32;
    sdpa_tensor tq = sdpa_tensor_bshd((void *)q, t, B, Sq, Hq, D);
    sdpa_tensor tk = sdpa_tensor_bshd((void *)k, t, B, Skv, Hkv, D);
    sdpa_tensor tv = sdpa_tensor_bshd((void *)v, t, B, Skv, Hkv, D);
    sdpa_tensor to = sdpa_tensor_bshd((void *)out, t, B, Sq, Hq, D);
    sdpa_tensor tdo = sdpa_tensor_bshd((void *)dout, t, B, Sq, Hq, D);
    sdpa_tensor tdq = sdpa_tensor_bshd(dq, t, B, Sq, Hq, D);
    sdpa_tensor tdk = sdpa_tensor_bshd(dk, t, B, Skv, Hkv, D);
    sdpa_tensor tdv = sdpa_tensor_bshd(dv, t, B, Skv, Hkv, D);
    sdpa_layer_desc ld = SDPA_LAYER_DESC_DEFAULT;
    ld.name = "peers-backward";
    ld.backend = backend;
    sdpa_layer *layer;
    if (sdpa_layer_create(ctx, &ld, &layer) != SDPA_OK) {
        snprintf(last_error, sizeof last_error, "libsdpa: %s", sdpa_last_error());
        return -1;
    }
    double per_call = -1, t0 = 0;
    for (int i = 0; i <= calls; i++) { /* call 0 decides, untimed */
        if (i == 1)
            t0 = now_s();
        if (sdpa_layer_backward(layer, &tq, &tk, &tv, &to, lse, &tdo, NULL, &tdq, &tdk, &tdv,
                                NULL) != SDPA_OK) {
            snprintf(last_error, sizeof last_error, "libsdpa: %s", sdpa_last_error());
            sdpa_layer_destroy(layer);
            return -1;
        }
        if (i == 0)
            choice = sdpa_last_backend();
        if (i == calls)
            per_call = calls ? (now_s() - t0) / calls : 0;
    }
    sdpa_layer_destroy(layer);
    return per_call;
}

/* ---- OpenBLAS */

/* exp(s - max) in place over n scores; returns the sum. */
static float softmax_numerators(float *s, int64_t n)
{
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; j++)
        mx = s[j] > mx ? s[j] : mx;
    float sum = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        s[j] = expf(s[j] - mx);
        sum += s[j];
    }
    return sum;
}

static float *blas_mem;
static size_t blas_mem_n;

double peers_openblas(const float *q, const float *k, const float *v, float *out, int64_t B,
                      int64_t Sq, int64_t Skv, int64_t Hq, int64_t Hkv, int64_t D, int threads,
                      int calls)
{
    const size_t per = (size_t)BR * (size_t)(Skv + D);
    if (blas_mem_n < per * (size_t)threads) {
        free(blas_mem);
        blas_mem = malloc(sizeof(float) * per * (size_t)threads);
        blas_mem_n = blas_mem ? per * (size_t)threads : 0;
        if (!blas_mem) {
            snprintf(last_error, sizeof last_error, "openblas: out of memory");
            return -1;
        }
    }
    openblas_set_num_threads(1);
    const int64_t nblk = (Sq + BR - 1) / BR, g = Hq / Hkv;
    const float scale = 1.0f / sqrtf((float)D);
    const double t0 = now_s();
    for (int it = 0; it < calls; it++) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
        for (int64_t task = 0; task < B * Hq * nblk; task++) {
            const int64_t blk = task % nblk, h = task / nblk % Hq, b = task / nblk / Hq;
            const int64_t i0 = blk * BR, rows = Sq - i0 < BR ? Sq - i0 : BR;
            float *s = blas_mem + per * (size_t)omp_get_thread_num(), *o = s + (size_t)BR * Skv;
            const float *qb = q + ((b * Sq + i0) * Hq + h) * D;
            const float *kb = k + (b * Skv * Hkv + h / g) * D, *vb = v + (b * Skv * Hkv + h / g) * D;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)Skv, (int)D,
                        scale, qb, (int)(Hq * D), kb, (int)(Hkv * D), 0.0f, s, (int)Skv);
            float l[BR];
            for (int64_t r = 0; r < rows; r++)
                l[r] = softmax_numerators(s + r * Skv, Skv);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)D, (int)Skv,
                        1.0f, s, (int)Skv, vb, (int)(Hkv * D), 0.0f, o, (int)D);
            for (int64_t r = 0; r < rows; r++) {
                float *dst = out + ((b * Sq + i0 + r) * Hq + h) * D;
                const float inv = 1.0f / l[r];
                for (int64_t d = 0; d < D; d++)
                    dst[d] = o[r * D + d] * inv;
            }
        }
    }
    return (now_s() - t0) / calls;
}

/* ---- oneDNN */

#define DNNL_TRY(x)                                                                                \
    do {                                                                                           \
        dnnl_status_t st_ = (x);                                                                   \
        if (st_ != dnnl_success) {                                                                 \
            snprintf(last_error, sizeof last_error, "oneDNN: %s failed (status %d)", #x,         \
                     (int)st_);                                                                    \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)

typedef struct dnnl_plan {
    int64_t key[8];
    dnnl_primitive_t qk[2], sm[2], pv[2]; /* [0] full blocks, [1] the last, shorter one */
    dnnl_memory_t mq[2], mk[2], ms[2], mp[2], mv[2], mo[2];
} dnnl_plan;

static dnnl_engine_t engine;
static dnnl_stream_t stream;
static dnnl_plan plan;
static void *dnnl_buf; /* scores f32 + probabilities */
static size_t dnnl_buf_n;

static dnnl_status_t make_prim(dnnl_primitive_t *p, const_dnnl_op_desc_t desc,
                               const_dnnl_primitive_attr_t attr)
{
    dnnl_primitive_desc_t pd;
    dnnl_status_t st = dnnl_primitive_desc_create(&pd, desc, attr, engine, NULL);
    if (st != dnnl_success)
        return st;
    st = dnnl_primitive_create(p, pd);
    dnnl_primitive_desc_destroy(pd);
    return st;
}

static int dnnl_prepare(int64_t rows_full, int64_t rows_last, int64_t Skv, int64_t Hq,
                        int64_t Hkv, int64_t D, int bf16)
{
    if (!engine) {
        DNNL_TRY(dnnl_engine_create(&engine, dnnl_cpu, 0));
        DNNL_TRY(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags));
    }
    const dnnl_data_type_t t = bf16 ? dnnl_bf16 : dnnl_f32;
    const float scale = 1.0f / sqrtf((float)D);
    dnnl_primitive_attr_t attr;
    DNNL_TRY(dnnl_primitive_attr_create(&attr));
    DNNL_TRY(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &scale));
    dnnl_memory_desc_t q_md, k_md, s_md, p_md, v_md, o_md;
    for (int i = 0; i < 2; i++) {
        const int64_t rows = i ? rows_last : rows_full;
        if (rows <= 0)
            continue;
        const dnnl_dims_t qd = {rows, D}, qs = {Hq * D, 1};
        const dnnl_dims_t kd = {D, Skv}, ks = {1, Hkv * D}; /* K^T */
        const dnnl_dims_t sd = {rows, Skv}, ss = {Skv, 1};
        const dnnl_dims_t vd = {Skv, D}, vs = {Hkv * D, 1};
        const dnnl_dims_t od = {rows, D}, os = {Hq * D, 1};
        DNNL_TRY(dnnl_memory_desc_init_by_strides(&q_md, 2, qd, t, qs));
        DNNL_TRY(dnnl_memory_desc_init_by_strides(&k_md, 2, kd, t, ks));
        DNNL_TRY(dnnl_memory_desc_init_by_strides(&s_md, 2, sd, dnnl_f32, ss));
        DNNL_TRY(dnnl_memory_desc_init_by_strides(&p_md, 2, sd, t, ss));
        DNNL_TRY(dnnl_memory_desc_init_by_strides(&v_md, 2, vd, t, vs));
        DNNL_TRY(dnnl_memory_desc_init_by_strides(&o_md, 2, od, t, os));
        dnnl_matmul_desc_t mm;
        DNNL_TRY(dnnl_matmul_desc_init(&mm, &q_md, &k_md, NULL, &s_md));
        DNNL_TRY(make_prim(&plan.qk[i], &mm, attr));
        dnnl_softmax_v2_desc_t sm;
        DNNL_TRY(dnnl_softmax_v2_forward_desc_init(&sm, dnnl_forward_inference,
                                                   dnnl_softmax_accurate, &s_md, &p_md, 1));
        DNNL_TRY(make_prim(&plan.sm[i], &sm, NULL));
        DNNL_TRY(dnnl_matmul_desc_init(&mm, &p_md, &v_md, NULL, &o_md));
        DNNL_TRY(make_prim(&plan.pv[i], &mm, NULL));
        /* memory objects: handles change per block */
        DNNL_TRY(dnnl_memory_create(&plan.mq[i], &q_md, engine, DNNL_MEMORY_NONE));
        DNNL_TRY(dnnl_memory_create(&plan.mk[i], &k_md, engine, DNNL_MEMORY_NONE));
        DNNL_TRY(dnnl_memory_create(&plan.ms[i], &s_md, engine, DNNL_MEMORY_NONE));
        DNNL_TRY(dnnl_memory_create(&plan.mp[i], &p_md, engine, DNNL_MEMORY_NONE));
        DNNL_TRY(dnnl_memory_create(&plan.mv[i], &v_md, engine, DNNL_MEMORY_NONE));
        DNNL_TRY(dnnl_memory_create(&plan.mo[i], &o_md, engine, DNNL_MEMORY_NONE));
    }
    dnnl_primitive_attr_destroy(attr);
    return 0;
}

static void dnnl_release(void)
{
    for (int i = 0; i < 2; i++) {
        if (plan.qk[i])
            dnnl_primitive_destroy(plan.qk[i]);
        if (plan.sm[i])
            dnnl_primitive_destroy(plan.sm[i]);
        if (plan.pv[i])
            dnnl_primitive_destroy(plan.pv[i]);
    }
    for (int i = 0; i < 2; i++) {
        dnnl_memory_t m[] = {plan.mq[i], plan.mk[i], plan.ms[i], plan.mp[i], plan.mv[i], plan.mo[i]};
        for (size_t j = 0; j < sizeof m / sizeof *m; j++)
            if (m[j])
                dnnl_memory_destroy(m[j]);
    }
    memset(&plan, 0, sizeof plan);
}

static int run_prim(dnnl_primitive_t p, int na, const dnnl_exec_arg_t *a)
{
    DNNL_TRY(dnnl_primitive_execute(p, stream, na, a));
    return 0;
}

double peers_dnnl(const void *q, const void *k, const void *v, void *out, int64_t B, int64_t Sq,
                  int64_t Skv, int64_t Hq, int64_t Hkv, int64_t D, int bf16, int threads,
                  int calls)
{
    const int64_t key[8] = {B, Sq, Skv, Hq, Hkv, D, bf16, threads};
    const int64_t rows_last = Sq % BR ? Sq % BR : 0, rows_full = Sq < BR ? 0 : BR;
    omp_set_num_threads(threads);
    if (memcmp(key, plan.key, sizeof key)) {
        dnnl_release();
        const int64_t full = rows_full ? rows_full : rows_last;
        if (dnnl_prepare(full, rows_full ? rows_last : 0, Skv, Hq, Hkv, D, bf16) != 0) {
            dnnl_release();
            return -1;
        }
        memcpy(plan.key, key, sizeof key);
    }
    const size_t need = (size_t)BR * (size_t)Skv * (4 + (bf16 ? 2 : 4));
    if (dnnl_buf_n < need) {
        free(dnnl_buf);
        dnnl_buf = malloc(need);
        dnnl_buf_n = dnnl_buf ? need : 0;
        if (!dnnl_buf) {
            snprintf(last_error, sizeof last_error, "oneDNN: out of memory");
            return -1;
        }
    }
    const size_t es = bf16 ? 2 : 4;
    char *scores = dnnl_buf, *probs = scores + (size_t)BR * (size_t)Skv * 4;
    const int64_t nblk = (Sq + BR - 1) / BR, g = Hq / Hkv;
    const double t0 = now_s();
    for (int it = 0; it < calls; it++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < Hq; h++)
                for (int64_t blk = 0; blk < nblk; blk++) {
                    const int64_t i0 = blk * BR;
                    const int last = rows_full == 0 || (rows_last && blk == nblk - 1);
                    const int which = rows_full == 0 ? 0 : last;
                    const int w = which;
                    dnnl_memory_set_data_handle(plan.mq[w], (char *)q + ((b * Sq + i0) * Hq + h) * D * es);
                    dnnl_memory_set_data_handle(plan.mk[w], (char *)k + (b * Skv * Hkv + h / g) * D * es);
                    dnnl_memory_set_data_handle(plan.mv[w], (char *)v + (b * Skv * Hkv + h / g) * D * es);
                    dnnl_memory_set_data_handle(plan.mo[w], (char *)out + ((b * Sq + i0) * Hq + h) * D * es);
                    dnnl_memory_set_data_handle(plan.ms[w], scores);
                    dnnl_memory_set_data_handle(plan.mp[w], probs);
                    const dnnl_exec_arg_t a1[] = {{DNNL_ARG_SRC, plan.mq[w]},
                                                  {DNNL_ARG_WEIGHTS, plan.mk[w]},
                                                  {DNNL_ARG_DST, plan.ms[w]}};
                    const dnnl_exec_arg_t a2[] = {{DNNL_ARG_SRC, plan.ms[w]},
                                                  {DNNL_ARG_DST, plan.mp[w]}};
                    const dnnl_exec_arg_t a3[] = {{DNNL_ARG_SRC, plan.mp[w]},
                                                  {DNNL_ARG_WEIGHTS, plan.mv[w]},
                                                  {DNNL_ARG_DST, plan.mo[w]}};
                    if (run_prim(plan.qk[which], 3, a1) || run_prim(plan.sm[which], 2, a2) ||
                        run_prim(plan.pv[which], 3, a3))
                        return -1;
                }
    dnnl_stream_wait(stream);
    return (now_s() - t0) / calls;
}

const char *peers_dnnl_version(void)
{
    static char s[32];
    const dnnl_version_t *v = dnnl_version();
    snprintf(s, sizeof s, "%d.%d.%d", v->major, v->minor, v->patch);
    return s;
}

const char *peers_openblas_config(void) { return openblas_get_config(); }

/* ---- facts for the report, from the same libsdpa */

static int ensure_ctx(int threads)
{
    if (ctx && ctx_threads == threads)
        return 0;
    sdpa_context_destroy(ctx);
    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    o.threads = threads;
    if (sdpa_context_create(&o, &ctx) != SDPA_OK) {
        snprintf(last_error, sizeof last_error, "libsdpa: %s", sdpa_last_error());
        ctx = NULL;
        return -1;
    }
    ctx_threads = threads;
    return 0;
}

/* sdpa info --json of a context with `threads` threads; release with
 * peers_free. */
char *peers_info_json(int threads)
{
    char *text = NULL;
    if (ensure_ctx(threads) || sdpa_info(ctx, 1, &text) != SDPA_OK)
        return NULL;
    return text;
}

void peers_free(void *p) { sdpa_free(p); }

/* GFLOP/s of libsdpa's ceiling probe ("fp32" or "avx512bf16"), -1 if
 * this CPU has none. */
double peers_ceiling(const char *what, int threads)
{
    double g = -1;
    const char *isa = NULL;
    if (ensure_ctx(threads) || sdpa_measure_ceiling(ctx, what, &g, &isa) != SDPA_OK)
        return -1;
    return g;
}
