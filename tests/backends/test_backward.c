/*
 * test_backward.c - sdpa_backward: ref against finite differences of the
 * forward, every other backend with a backward pass against ref.
 *
 * ref is the oracle, so it is checked first against what a gradient is:
 * central differences of the loss L = sum(dout * out) over every element
 * of q, k and v, on small cases with causal both ways, grouped-query,
 * cross-attention, a custom scale and every mask kind.
 *
 * Then the grid, fresh random inputs each run (seed printed): head dims
 * 1..256 the backend claims, odd sequence lengths, cross-attention,
 * grouped-query and multi-query (dk, dv summed over query heads), causal
 * in both alignments (rows and keys that see nothing), BSHD, BHSD and
 * strided views with gaps, f32/f16/bf16 inputs and gradient dtypes,
 * peaked softmaxes, a custom scale, sequence lengths, key masks and
 * general masks (boolean and additive with -inf), one chunk per KV head
 * and several (few heads, long keys); guard bytes after every gradient
 * and untouched gaps; bitwise equal with 1 and 2 threads. Errors are
 * bounded relative to the reference gradient's magnitude.
 *
 * Then the API: the arguments sdpa_backward refuses (each naming itself),
 * outputs untouched on refusal, a backend without a backward pass named
 * explicitly (its reason), the dispatcher's choice and explain for
 * backward calls, layers.
 *
 * usage: test_backward [backend ...]   (default: every present backend
 * with a backward pass, but ref)
 */
#include "support/scripted.h"
#include "support/testlib.h"
#ifdef SDPA_TEST_AMX_EMULATED
#include "amx_emulated.h"
#include "dispatch/context.h"
#endif

#include <math.h>
#include <stdlib.h>
#include <string.h>

static sdpa_context *ctx1, *ctx2; /* 1 and 2 threads */

/* Which masks a case carries (all optional, as sdpa_mask). */
enum { M_SEQ_LEN = 1, M_KEY = 2, M_BOOL = 4, M_ADDITIVE = 8 };

typedef struct bcase {
    tl_case c;     /* c.out_dtype: dtype of out and of the gradients */
    unsigned masks;
    int dlse;      /* 1: the LSE has a gradient too */
} bcase;

typedef struct masks {
    sdpa_mask m;
    int32_t *lq, *lkv;
    uint8_t *key, *general_bool;
    float *general_add;
} masks;

/* Random masks for the case: lengths in 0..S (a few full), ~75% of keys
 * visible, general masks per (b, i, j) broadcast over heads, the additive
 * one with -inf entries. */
static int masks_make(masks *mk, const tl_case *c, unsigned kinds)
{
    memset(mk, 0, sizeof *mk);
    sdpa_mask def = SDPA_MASK_DEFAULT;
    mk->m = def;
    const int64_t B = c->B, Sq = c->Sq, Skv = c->Skv;
    if (kinds & M_SEQ_LEN) {
        mk->lq = malloc(sizeof(int32_t) * (size_t)B), mk->lkv = malloc(sizeof(int32_t) * (size_t)B);
        if (!mk->lq || !mk->lkv)
            return 0;
        for (int64_t b = 0; b < B; b++) {
            mk->lq[b] = b == 0 ? (int32_t)Sq : (int32_t)((tl_uniform() + 1) / 2 * (double)(Sq + 1));
            mk->lkv[b] = (int32_t)((tl_uniform() + 1) / 2 * (double)(Skv + 1));
            if (mk->lq[b] > Sq)
                mk->lq[b] = (int32_t)Sq;
            if (mk->lkv[b] > Skv)
                mk->lkv[b] = (int32_t)Skv;
        }
        mk->m.seq_len_q = mk->lq, mk->m.seq_len_kv = mk->lkv;
    }
    if (kinds & M_KEY) {
        mk->key = malloc((size_t)(B * Skv));
        if (!mk->key)
            return 0;
        for (int64_t i = 0; i < B * Skv; i++)
            mk->key[i] = tl_uniform() > -0.5;
        mk->m.key = mk->key, mk->m.key_stride[0] = Skv, mk->m.key_stride[1] = 1;
    }
    if (kinds & (M_BOOL | M_ADDITIVE)) {
        const size_t n = (size_t)(B * Sq * Skv);
        mk->m.general_stride[0] = Sq * Skv, mk->m.general_stride[1] = 0;
        mk->m.general_stride[2] = Skv, mk->m.general_stride[3] = 1;
        if (kinds & M_BOOL) {
            mk->general_bool = malloc(n);
            if (!mk->general_bool)
                return 0;
            for (size_t i = 0; i < n; i++)
                mk->general_bool[i] = tl_uniform() > -0.6;
            mk->m.general = mk->general_bool, mk->m.general_type = SDPA_MASK_BOOL;
        } else {
            mk->general_add = malloc(sizeof(float) * n);
            if (!mk->general_add)
                return 0;
            for (size_t i = 0; i < n; i++) {
                const double u = tl_uniform();
                mk->general_add[i] = u < -0.8 ? -INFINITY : (float)(2 * u);
            }
            mk->m.general = mk->general_add, mk->m.general_type = SDPA_MASK_ADDITIVE;
            mk->m.general_dtype = SDPA_F32;
        }
    }
    return 1;
}

static void masks_free(masks *mk)
{
    free(mk->lq), free(mk->lkv), free(mk->key), free(mk->general_bool), free(mk->general_add);
}

static sdpa_params params_of(const tl_case *c, const masks *mk, const char *backend)
{
    sdpa_params p = SDPA_PARAMS_DEFAULT;
    p.causal = c->causal;
    p.scale = tl_case_scale(c);
    p.backend = backend;
    if (mk && (mk->m.seq_len_q || mk->m.key || mk->m.general))
        p.mask = &mk->m;
    return p;
}

/* The gradients of a case as outputs: dq like out, dk and dv like k. */
typedef struct grads {
    tl_output dq, dk, dv;
} grads;

static int grads_make(grads *g, const tl_problem *p, sdpa_dtype dtype, tl_layout layout)
{
    tl_problem like = *p;
    like.c.out_dtype = dtype, like.c.layout = layout, like.c.want_lse = 0;
    if (!tl_output_make(&g->dq, &like))
        return 0;
    like.c.Sq = p->c.Skv, like.c.Hq = p->c.Hkv;
    return tl_output_make(&g->dk, &like) && tl_output_make(&g->dv, &like);
}

static void grads_free(grads *g)
{
    tl_output_free(&g->dq), tl_output_free(&g->dk), tl_output_free(&g->dv);
}

static sdpa_status backward(sdpa_context *ctx, const tl_problem *p, const tl_output *out,
                            const sdpa_tensor *dout, const float *dlse, grads *g,
                            const sdpa_params *prm)
{
    return sdpa_backward(ctx, &p->q, &p->k, &p->v, &out->t, out->lse, dout, dlse, &g->dq.t,
                         &g->dk.t, &g->dv.t, prm);
}

/* A random gradient of the LSE [B, Hq, Sq] (a caller that used the LSE). */
static float *random_dlse(const tl_case *c)
{
    const size_t n = (size_t)(c->B * c->Hq * c->Sq);
    float *g = tl_alloc_guarded(n * sizeof(float));
    for (size_t i = 0; g && i < n; i++)
        g[i] = (float)tl_uniform();
    return g;
}

static double max_abs3(const grads *g)
{
    double a = tl_max_abs(&g->dq), b = tl_max_abs(&g->dk), c = tl_max_abs(&g->dv);
    return fmax(a, fmax(b, c));
}

static void describe(const bcase *bc, char *buf, size_t n)
{
    const tl_case *c = &bc->c;
    snprintf(buf, n,
             "B=%lld Sq=%lld Skv=%lld Hq=%lld Hkv=%lld D=%lld in=%s%s%s grad=%s causal=%s %s %s "
             "scale=%g masks=%s%s%s%s%s",
             (long long)c->B, (long long)c->Sq, (long long)c->Skv, (long long)c->Hq,
             (long long)c->Hkv, (long long)c->D, sdpa_dtype_name(c->dtype),
             tl_kv_dtype(c) != c->dtype ? " kv=" : "",
             tl_kv_dtype(c) != c->dtype ? sdpa_dtype_name(tl_kv_dtype(c)) : "",
             sdpa_dtype_name(c->out_dtype), sdpa_causal_name(c->causal), tl_layout_name(c->layout),
             tl_values_name(c->values), tl_case_scale(c), bc->masks & M_SEQ_LEN ? "seq_len " : "",
             bc->masks & M_KEY ? "key " : "", bc->masks & M_BOOL ? "bool " : "",
             bc->masks & M_ADDITIVE ? "additive" : "", bc->dlse ? " dlse" : "");
}

static unsigned mask_kinds(unsigned m)
{
    return (m & M_SEQ_LEN ? SDPA_MASK_KIND_SEQ_LEN : 0) | (m & M_KEY ? SDPA_MASK_KIND_KEY : 0) |
           (m & (M_BOOL | M_ADDITIVE) ? SDPA_MASK_KIND_GENERAL : 0);
}

/* Does the backend claim the backward case? If not, why. */
static int claims(const char *backend, const bcase *bc, char *why, size_t n)
{
    const tl_case *c = &bc->c;
    sdpa_call_desc d = {.size = sizeof(sdpa_call_desc), .device = SDPA_DEVICE_CPU,
                        .dtype = c->dtype, .B = c->B, .Sq = c->Sq, .Skv = c->Skv, .Hq = c->Hq,
                        .Hkv = c->Hkv, .D = c->D, .causal = c->causal, .want_lse = 1,
                        .backend = backend, .mask = mask_kinds(bc->masks), .backward = 1,
                        .kv_dtype = tl_kv_dtype(c) != c->dtype ? c->kv_dtype : 0};
    return tl_claims(ctx2, &d, why, n);
}

/* |error| allowed relative to max |ref gradient|: f32 accumulation of
 * blockwise products (~1e-6), the stored gradient's rounding, and the
 * inputs the kernel reads that ref does not: out in its dtype (for
 * D_i = dout . out) and the f32 LSE; a kernel whose products take bf16
 * operands (cpu.amx: q, dO, P and dS rounded, f16 inputs too) the
 * forward grid's allowance for them. Peaked softmaxes add the float32
 * rounding of scores near 100, as in the forward's grid. */
static double tolerance(const tl_case *c, int product_bits)
{
    /* bf16 products: four times the forward's allowance. A gradient is a
     * sum whose terms cancel (each row's dS sums to about zero; dV adds
     * P dO of either sign), so the terms' rounding is relative to the
     * terms, not to the sum: D = 1 cases reached 1.3e-2 of max |ref grad|
     * (seeds of 2026-12-06), where 2^-7 had been allowed; torch's own bf16
     * backward is 1.0-1.5e-2 from float64 on the peers' rows */
    double tol = 1e-5 + 4.0 * tl_product_tolerance(product_bits);
    if (c->out_dtype == SDPA_F16)
        tol += 2e-3;
    else if (c->out_dtype == SDPA_BF16)
        tol += 1.5e-2;
    if (c->values == TL_PEAKED)
        tol += 16.0 * (double)c->D * ldexp(1.0, -22);
    return tol;
}

static sdpa_backend_info info(const char *backend)
{
    sdpa_backend_info b;
    for (int i = 0; i < sdpa_backend_count(ctx2); i++)
        if (sdpa_backend_get(ctx2, i, &b) == SDPA_OK && strcmp(b.name, backend) == 0)
            return b;
    memset(&b, 0, sizeof b);
    return b;
}

/* A backend that does not take a case's input dtypes (cpu.amx: no f32)
 * gets the case in the dtypes it takes, alternately, as in the forward's
 * grid: it meets the whole grid rather than the part in its dtypes. */
static bcase in_dtype_taken(const sdpa_backend_info *bi, const bcase *in)
{
    static unsigned alternate;
    bcase bc = *in;
    tl_case *c = &bc.c;
    const sdpa_dtype kv = tl_kv_dtype(c);
    if (!bi->dtypes || (bi->dtypes & (1u << c->dtype) && bi->dtypes & (1u << kv)))
        return bc;
    sdpa_dtype pick[SDPA_DTYPE_COUNT];
    int n = 0;
    for (int t = 0; t < SDPA_DTYPE_COUNT; t++)
        if (bi->dtypes & (1u << t))
            pick[n++] = (sdpa_dtype)t;
    const sdpa_dtype t = pick[alternate++ % (unsigned)n];
    if (!(bi->dtypes & (1u << c->dtype)))
        c->dtype = t;
    if (!(bi->dtypes & (1u << kv)))
        c->kv_dtype = t == c->dtype ? 0 : SDPA_KV_DTYPE(t);
    return bc;
}

static void check_case(const char *backend, const bcase *bc_in)
{
    const sdpa_backend_info bi = info(backend);
    const bcase bcc = in_dtype_taken(&bi, bc_in), *bc = &bcc;
    const tl_case *c = &bc->c;
    char what[320], why[512];
    describe(bc, what, sizeof what);
    if (!claims(backend, bc, why, sizeof why)) {
        char buf[600];
        snprintf(buf, sizeof buf, "%s %s", backend, what);
        tl_skip(buf, why);
        return;
    }
    tl_problem p, dp;
    tl_output out;
    grads got, want, again;
    masks mk;
    tl_case oc = *c;
    oc.want_lse = 1;
    if (!tl_problem_make(&p, &oc) || !tl_problem_make(&dp, &oc) || !tl_output_make(&out, &p) ||
        !grads_make(&got, &p, c->out_dtype, c->layout) ||
        !grads_make(&want, &p, SDPA_F32, TL_BSHD) ||
        !grads_make(&again, &p, c->out_dtype, c->layout) || !masks_make(&mk, c, bc->masks)) {
        CHECK(0, "%s: out of memory", what);
        return;
    }
    /* a kernel with bf16 products rounds f16 inputs to bf16 (3 bits of
     * every score, its documented precision): the case's inputs are such
     * values already, so that the comparison sees its products' rounding */
    if (bi.product_bits == 8 && (c->dtype == SDPA_F16 || tl_kv_dtype(c) == SDPA_F16))
        tl_problem_round_bf16(&p), tl_problem_round_bf16(&dp);
    /* the forward's out (in the case's dtype) and LSE, from ref */
    sdpa_params prm = params_of(c, &mk, "ref");
    sdpa_status st = sdpa_forward(ctx2, &p.q, &p.k, &p.v, &out.t, out.lse, &prm);
    CHECK(st == SDPA_OK, "ref forward %s: %s", what, sdpa_last_error());
    /* dout: random values in [-1, 1), q-shaped, the inputs' dtype */
    const sdpa_tensor *dout = &dp.q;
    float *dlse = bc->dlse ? random_dlse(c) : NULL;
    if (st == SDPA_OK) {
        st = backward(ctx2, &p, &out, dout, dlse, &want, &prm);
        CHECK(st == SDPA_OK, "ref backward %s: %s", what, sdpa_last_error());
    }
    prm = params_of(c, &mk, backend);
    sdpa_status sg = backward(ctx2, &p, &out, dout, dlse, &got, &prm);
    CHECK(sg == SDPA_OK, "%s backward %s: %s: %s", backend, what, sdpa_status_string(sg),
          sdpa_last_error());
    if (st == SDPA_OK && sg == SDPA_OK) {
        const double scale = max_abs3(&want), tol = tolerance(c, bi.product_bits);
        const tl_output *g[3] = {&got.dq, &got.dk, &got.dv}, *w[3] = {&want.dq, &want.dk, &want.dv};
        static const char *names[3] = {"dq", "dk", "dv"};
        for (int i = 0; i < 3; i++) {
            int64_t at = -1;
            const double diff = tl_max_diff(g[i], w[i], &at);
            CHECK(diff <= tol * scale || (diff == 0 && scale == 0),
                  "%s %s: max |%s - ref| / max |ref grads| = %.3g > %.3g at element %lld",
                  backend, what, names[i], scale > 0 ? diff / scale : diff, tol, (long long)at);
            if (getenv("SDPA_TEST_VERBOSE"))
                printf("  %s %s %s: rel %.3g (tol %.3g)\n", backend, what, names[i],
                       scale > 0 ? diff / scale : diff, tol);
            CHECK(tl_output_check(g[i], why, sizeof why), "%s %s: %s: %s", backend, what, names[i],
                  why);
        }
        /* deterministic: bitwise equal with 1 thread */
        if (backward(ctx1, &p, &out, dout, dlse, &again, &prm) == SDPA_OK)
            CHECK(memcmp(again.dq.mem, got.dq.mem, got.dq.bytes) == 0 &&
                      memcmp(again.dk.mem, got.dk.mem, got.dk.bytes) == 0 &&
                      memcmp(again.dv.mem, got.dv.mem, got.dv.bytes) == 0,
                  "%s %s: 1 thread != 2 threads", backend, what);
        else
            CHECK(0, "%s %s with 1 thread: %s", backend, what, sdpa_last_error());
    }
    grads_free(&got), grads_free(&want), grads_free(&again), tl_free_guarded(dlse);
    tl_output_free(&out), tl_problem_free(&p), tl_problem_free(&dp), masks_free(&mk);
}

static bcase mk(int64_t B, int64_t Sq, int64_t Skv, int64_t Hq, int64_t Hkv, int64_t D)
{
    bcase b = {{B, Sq, Skv, Hq, Hkv, D, SDPA_F32, SDPA_F32, SDPA_CAUSAL_NONE, TL_BSHD, 1,
                TL_UNIFORM, 0, 0},
               0, 0};
    return b;
}

/* SDPA_TEST_QUICK (the ThreadSanitizer run): the cases that exercise each
 * way of cutting the work into tasks, not the whole grid. */
static void grid_quick(const char *backend)
{
    printf("== %s (quick)\n", backend);
    bcase b = mk(1, 40, 300, 4, 1, 64); /* chunks of keys: partial dQ */
    b.masks = M_KEY;
    check_case(backend, &b);
    b = mk(1, 300, 40, 4, 2, 64); /* chunks of rows: partial dK, dV */
    b.c.causal = SDPA_CAUSAL_BOTTOM_RIGHT;
    check_case(backend, &b);
    b = mk(2, 100, 120, 16, 8, 32); /* one task per (batch, KV head) */
    b.masks = M_SEQ_LEN | M_ADDITIVE;
    check_case(backend, &b);
}

static void grid(const char *backend)
{
    if (getenv("SDPA_TEST_QUICK")) {
        grid_quick(backend);
        return;
    }
    printf("== %s\n", backend);
    static const int64_t dims[] = {1, 16, 64, 72, 80, 128, 256};
    bcase b;
    for (size_t i = 0; i < sizeof dims / sizeof *dims; i++) { /* every head dim */
        b = mk(1, 65, 70, 2, 2, dims[i]);
        check_case(backend, &b);
        b.c.causal = SDPA_CAUSAL_TOP_LEFT, b.c.layout = TL_BHSD, b.c.dtype = SDPA_BF16;
        check_case(backend, &b);
        /* several key chunks, grouped-query; NaN after every row's D elements */
        b = mk(1, 40, 300, 2, 1, dims[i]);
        b.c.layout = TL_STRIDED_NAN, b.c.dtype = (sdpa_dtype)(i % SDPA_DTYPE_COUNT);
        check_case(backend, &b);
    }
    static const int64_t seqs[] = {1, 17, 130};
    for (size_t i = 0; i < 3; i++) /* odd sequence lengths */
        for (int causal = 0; causal <= 2; causal++) {
            b = mk(2, seqs[i], seqs[i], 3, 3, 64);
            b.c.causal = (sdpa_causal)causal;
            check_case(backend, &b);
        }
    /* cross-attention, both alignments: rows and keys that see nothing */
    const int64_t cross[][2] = {{300, 77}, {17, 129}, {129, 17}, {65, 513}};
    for (size_t i = 0; i < 4; i++)
        for (int causal = 0; causal <= 2; causal++) {
            b = mk(2, cross[i][0], cross[i][1], 2, 2, 64);
            b.c.causal = (sdpa_causal)causal;
            b.c.layout = (tl_layout)(i % 3);
            check_case(backend, &b);
        }
    /* one chunk per KV head (16 of them) and grouped-query sums */
    b = mk(2, 100, 200, 16, 8, 64);
    check_case(backend, &b);
    b = mk(1, 130, 130, 8, 2, 128);
    b.c.causal = SDPA_CAUSAL_TOP_LEFT;
    check_case(backend, &b);
    b = mk(2, 33, 70, 4, 1, 80);
    b.c.causal = SDPA_CAUSAL_BOTTOM_RIGHT, b.c.layout = TL_STRIDED;
    check_case(backend, &b);
    /* layouts, input and gradient dtypes */
    for (int layout = 0; layout < 3; layout++)
        for (int in = 0; in < SDPA_DTYPE_COUNT; in++)
            for (int out = 0; out < SDPA_DTYPE_COUNT; out++) {
                b = mk(2, 45, 67, 4, 2, 96);
                b.c.layout = (tl_layout)layout, b.c.dtype = (sdpa_dtype)in;
                b.c.out_dtype = (sdpa_dtype)out;
                b.c.causal = (sdpa_causal)((in + out) % 3);
                check_case(backend, &b);
            }
    /* mixed dtypes: f32 q over f16 or bf16 k and v, and the reverse */
    for (int i = 0; i < 4; i++) {
        static const int pairs[4][2] = {
            {SDPA_F32, SDPA_F16}, {SDPA_F32, SDPA_BF16}, {SDPA_BF16, SDPA_F32}, {SDPA_F16, SDPA_BF16}};
        b = mk(2, 45 + 30 * i, 67 + 100 * (i % 2), 4, 2, i % 2 ? 72 : 64);
        b.c.dtype = (sdpa_dtype)pairs[i][0], b.c.kv_dtype = SDPA_KV_DTYPE(pairs[i][1]);
        b.c.causal = (sdpa_causal)(i % 3), b.c.layout = (tl_layout)(i % 3);
        b.masks = i == 3 ? M_KEY : 0;
        check_case(backend, &b);
    }
    /* peaked softmaxes and a custom scale */
    for (int causal = 0; causal <= 2; causal++) {
        b = mk(2, 129, 300, 2, 1, 64);
        b.c.values = TL_PEAKED, b.c.causal = (sdpa_causal)causal;
        check_case(backend, &b);
    }
    b = mk(1, 50, 60, 2, 2, 32);
    b.c.scale = -0.3;
    check_case(backend, &b);
    /* masks: every kind, alone and together, with causal and GQA */
    static const unsigned kinds[] = {M_SEQ_LEN, M_KEY, M_BOOL, M_ADDITIVE,
                                     M_SEQ_LEN | M_KEY | M_ADDITIVE, M_SEQ_LEN | M_BOOL};
    for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++)
        for (int causal = 0; causal <= 2; causal += 2) {
            b = mk(3, 70, 230, 4, 2, 64);
            b.masks = kinds[i], b.c.causal = (sdpa_causal)causal;
            b.c.layout = (tl_layout)(i % 3), b.c.dtype = (sdpa_dtype)(i % SDPA_DTYPE_COUNT);
            check_case(backend, &b);
        }
    /* the LSE's own gradient (ring attention merges with it) */
    for (int causal = 0; causal <= 2; causal++) {
        b = mk(2, 70, 150, 4, 2, 64);
        b.dlse = 1, b.c.causal = (sdpa_causal)causal, b.masks = causal == 1 ? M_KEY : 0;
        check_case(backend, &b);
    }
    b = mk(1, 1, 1, 1, 1, 32); /* one token */
    check_case(backend, &b);
}

/* ---- ref against finite differences of the forward */

/* L = sum(dout * out) (+ sum(dlse * lse)) with out and the LSE from ref's
 * forward in f32. */
static double loss(const tl_problem *p, tl_output *out, const sdpa_tensor *dout,
                   const float *dlse, const sdpa_params *prm)
{
    if (sdpa_forward(ctx2, &p->q, &p->k, &p->v, &out->t, out->lse, prm) != SDPA_OK)
        return NAN;
    double l = 0;
    const int64_t n = p->c.B * p->c.Hq * p->c.Sq;
    for (int64_t i = 0; dlse && i < n; i++)
        l += out->lse[i] == -INFINITY ? 0.0 : (double)dlse[i] * out->lse[i];
    const sdpa_tensor *o = &out->t;
    for (int64_t b = 0; b < o->size[0]; b++)
        for (int64_t s = 0; s < o->size[1]; s++)
            for (int64_t h = 0; h < o->size[2]; h++)
                for (int64_t d = 0; d < o->size[3]; d++)
                    l += (double)tl_out_get(dout, b, s, h, d) * tl_out_get(o, b, s, h, d);
    return l;
}

static void finite_differences(const bcase *bc)
{
    const tl_case *c = &bc->c;
    char what[320];
    describe(bc, what, sizeof what);
    tl_problem p, dp;
    tl_output out, tmp;
    grads g;
    masks mk;
    if (!tl_problem_make(&p, c) || !tl_problem_make(&dp, c) || !tl_output_make(&out, &p) ||
        !tl_output_make(&tmp, &p) || !grads_make(&g, &p, SDPA_F32, TL_BSHD) ||
        !masks_make(&mk, c, bc->masks)) {
        CHECK(0, "%s: out of memory", what);
        return;
    }
    sdpa_params prm = params_of(c, &mk, "ref");
    float *dlse = bc->dlse ? random_dlse(c) : NULL;
    CHECK_STATUS(sdpa_forward(ctx2, &p.q, &p.k, &p.v, &out.t, out.lse, &prm), SDPA_OK);
    CHECK_STATUS(backward(ctx2, &p, &out, &dp.q, dlse, &g, &prm), SDPA_OK);
    const sdpa_tensor *in[3] = {&p.q, &p.k, &p.v};
    const tl_output *gr[3] = {&g.dq, &g.dk, &g.dv};
    const double h = 1e-2, scale = max_abs3(&g);
    double worst = 0;
    for (int t = 0; t < 3; t++) {
        const sdpa_tensor *x = in[t];
        for (int64_t b = 0; b < x->size[0]; b++)
            for (int64_t s = 0; s < x->size[1]; s++)
                for (int64_t hh = 0; hh < x->size[2]; hh++)
                    for (int64_t d = 0; d < x->size[3]; d++) {
                        float *e = (float *)x->data + b * x->stride[0] + s * x->stride[1] +
                                   hh * x->stride[2] + d * x->stride[3];
                        const float x0 = *e;
                        *e = x0 + (float)h;
                        const double up = loss(&p, &tmp, &dp.q, dlse, &prm);
                        *e = x0 - (float)h;
                        const double down = loss(&p, &tmp, &dp.q, dlse, &prm);
                        *e = x0;
                        const double fd = (up - down) / (2 * h);
                        const double an = tl_out_get(&gr[t]->t, b, s, hh, d);
                        worst = fmax(worst, fabs(fd - an));
                    }
    }
    /* central differences: O(h^2) truncation, f32 rounding of out and
     * the LSE over 2h; together below 3e-5 of the gradients' scale in 40
     * runs (5e-6 without dlse), while a wrong term is off by 1e-1 */
    CHECK(worst <= 2e-4 * scale + 1e-6, "ref %s: max |grad - finite difference| = %.3g (scale %.3g)",
          what, worst, scale);
    if (getenv("SDPA_TEST_VERBOSE"))
        printf("  ref fd %s: %.3g of %.3g\n", what, worst, scale);
    tl_problem_free(&p), tl_problem_free(&dp), tl_output_free(&out), tl_output_free(&tmp);
    grads_free(&g), masks_free(&mk), tl_free_guarded(dlse);
}

static void ref_against_finite_differences(void)
{
    printf("== ref against finite differences\n");
    bcase b = mk(1, 5, 7, 2, 1, 4);
    for (int causal = 0; causal <= 2; causal++) {
        b.c.causal = (sdpa_causal)causal;
        finite_differences(&b);
    }
    b = mk(2, 6, 6, 2, 2, 3);
    b.c.scale = 0.7, b.c.layout = TL_STRIDED;
    finite_differences(&b);
    static const unsigned kinds[] = {M_SEQ_LEN, M_KEY, M_BOOL, M_ADDITIVE};
    for (size_t i = 0; i < 4; i++) {
        b = mk(2, 4, 6, 2, 1, 3);
        b.masks = kinds[i], b.c.causal = (sdpa_causal)(i % 3);
        finite_differences(&b);
    }
    b = mk(1, 5, 6, 2, 2, 4); /* the LSE's gradient too */
    b.dlse = 1, b.c.causal = SDPA_CAUSAL_BOTTOM_RIGHT;
    finite_differences(&b);
}

/* ---- the API around it */

static void api(void)
{
    printf("== the API\n");
    tl_case c = mk(1, 8, 8, 2, 2, 16).c;
    tl_problem p, dp;
    tl_output out;
    grads g;
    if (!tl_problem_make(&p, &c) || !tl_problem_make(&dp, &c) || !tl_output_make(&out, &p) ||
        !grads_make(&g, &p, SDPA_F32, TL_BSHD)) {
        CHECK(0, "out of memory");
        return;
    }
    sdpa_params prm = SDPA_PARAMS_DEFAULT;
    CHECK_STATUS(sdpa_forward(ctx2, &p.q, &p.k, &p.v, &out.t, out.lse, &prm), SDPA_OK);
    memset(g.dq.mem, 0x5a, g.dq.bytes);
    /* refusals name the argument; nothing written */
    sdpa_status st = sdpa_backward(ctx2, &p.q, &p.k, &p.v, &out.t, NULL, &dp.q, NULL, &g.dq.t, &g.dk.t,
                                   &g.dv.t, &prm);
    CHECK(st == SDPA_INVALID_ARGUMENT && strstr(sdpa_last_error(), "lse"), "lse NULL: %s",
          sdpa_last_error());
    sdpa_tensor bad = g.dk.t;
    st = sdpa_backward(ctx2, &p.q, &p.k, &p.v, &out.t, out.lse, &dp.q, NULL, &bad, &g.dk.t, &g.dv.t,
                       &prm);
    CHECK(st == SDPA_INVALID_ARGUMENT && strstr(sdpa_last_error(), "dq"), "dq overlapping dk: %s",
          sdpa_last_error());
    bad = g.dq.t;
    bad.size[1] = 7;
    st = sdpa_backward(ctx2, &p.q, &p.k, &p.v, &out.t, out.lse, &dp.q, NULL, &bad, &g.dk.t, &g.dv.t,
                       &prm);
    CHECK(st == SDPA_INVALID_ARGUMENT && strstr(sdpa_last_error(), "dq sizes"), "dq size: %s",
          sdpa_last_error());
    st = sdpa_backward(ctx2, &p.q, &p.k, &p.v, &out.t, out.lse, NULL, NULL, &g.dq.t, &g.dk.t, &g.dv.t,
                       &prm);
    CHECK(st == SDPA_INVALID_ARGUMENT && strstr(sdpa_last_error(), "dout"), "dout NULL: %s",
          sdpa_last_error());
    st = sdpa_backward(ctx2, &p.q, &p.k, &p.v, &out.t, out.lse, &dp.q, NULL, &g.dq.t, &g.dk.t,
                       (sdpa_tensor *)&p.v, &prm);
    CHECK(st == SDPA_INVALID_ARGUMENT && strstr(sdpa_last_error(), "dv overlaps v"),
          "dv = v: %s", sdpa_last_error());
    int untouched = 1;
    for (size_t i = 0; i < g.dq.bytes; i++)
        untouched &= ((unsigned char *)g.dq.mem)[i] == 0x5a;
    CHECK(untouched, "a refused call wrote dq");
    /* a backend without a backward pass, named: its reason */
    prm.backend = "cpu.portable";
    st = sdpa_backward(ctx2, &p.q, &p.k, &p.v, &out.t, out.lse, &dp.q, NULL, &g.dq.t, &g.dk.t, &g.dv.t,
                       &prm);
    sdpa_backend_info bi = {0};
    for (int i = 0; i < sdpa_backend_count(ctx2); i++)
        if (sdpa_backend_get(ctx2, i, &bi) == SDPA_OK && strcmp(bi.name, "cpu.portable") == 0)
            break;
    if (!bi.backward)
        CHECK(st == SDPA_UNSUPPORTED && strstr(sdpa_last_error(), "no backward pass"),
              "cpu.portable named for a backward call: %s %s", sdpa_status_string(st),
              sdpa_last_error());
    /* the dispatcher's choice runs a backend with a backward pass */
    prm.backend = NULL;
    CHECK_STATUS(sdpa_backward(ctx2, &p.q, &p.k, &p.v, &out.t, out.lse, &dp.q, NULL, &g.dq.t, &g.dk.t,
                               &g.dv.t, &prm),
                 SDPA_OK);
    const char *ran = sdpa_last_backend();
    for (int i = 0; i < sdpa_backend_count(ctx2); i++)
        if (sdpa_backend_get(ctx2, i, &bi) == SDPA_OK && ran && strcmp(bi.name, ran) == 0)
            CHECK(bi.backward, "the dispatcher ran %s, which has no backward pass", ran);
    /* explain says it is a backward call and why the others are passed over */
    sdpa_call_desc d = {.size = sizeof(sdpa_call_desc), .device = SDPA_DEVICE_CPU,
                        .dtype = SDPA_F32, .B = 1, .Sq = 1024, .Skv = 1024, .Hq = 8, .Hkv = 8,
                        .D = 128, .want_lse = 1, .backward = 1};
    char *text = NULL;
    CHECK_STATUS(sdpa_explain(ctx2, &d, 0, &text), SDPA_OK);
    CHECK(text && strstr(text, "call        backward cpu f32"), "explain: %s", text ? text : "");
    if (text && !strstr(text, "cpu.blas          not present") && !strstr(text, "not built"))
        CHECK(strstr(text, "cpu.blas") && strstr(text, "has no backward pass"),
              "explain names why cpu.blas is passed over: %s", text);
    sdpa_free(text);
    CHECK_STATUS(sdpa_explain(ctx2, &d, 1, &text), SDPA_OK);
    CHECK(text && strstr(text, "\"backward\":true"), "explain json: %s", text ? text : "");
    sdpa_free(text);
    /* CUDA has no backward pass yet: every backend says so */
    sdpa_context *gpu = tl_context("cuda:sm_90");
    if (gpu) {
        d.device = SDPA_DEVICE_CUDA, d.dtype = SDPA_BF16;
        sdpa_decision dec;
        CHECK_STATUS(sdpa_decide(gpu, &d, &dec), SDPA_OK);
        CHECK(dec.n_candidates == 0, "cuda backward: %d candidates", dec.n_candidates);
        int n_cuda = 0;
        for (int i = 0; i < dec.n_backends; i++)
            if (strncmp(dec.backends[i].name, "cuda.", 5) == 0) {
                n_cuda++;
                CHECK(strstr(dec.backends[i].reason, "no backward pass"), "%s: %s",
                      dec.backends[i].name, dec.backends[i].reason);
            }
        CHECK(n_cuda == 3, "%d CUDA backends in the decision, expected 3", n_cuda);
        sdpa_context_destroy(gpu);
    }
    /* layers: the same through sdpa_layer_backward */
    sdpa_layer *layer = NULL;
    sdpa_layer_desc ld = SDPA_LAYER_DESC_DEFAULT;
    ld.name = "blocks.0.attn";
    CHECK_STATUS(sdpa_layer_create(ctx2, &ld, &layer), SDPA_OK);
    grads lg;
    if (grads_make(&lg, &p, SDPA_F32, TL_BSHD)) {
        CHECK_STATUS(sdpa_layer_backward(layer, &p.q, &p.k, &p.v, &out.t, out.lse, &dp.q, NULL,
                                         &lg.dq.t, &lg.dk.t, &lg.dv.t, &prm),
                     SDPA_OK);
        CHECK(memcmp(lg.dq.mem, g.dq.mem, g.dq.bytes) == 0 &&
                  memcmp(lg.dk.mem, g.dk.mem, g.dk.bytes) == 0,
              "layer backward differs from sdpa_backward");
        grads_free(&lg);
    }
    CHECK_STATUS(sdpa_layer_backward(NULL, &p.q, &p.k, &p.v, &out.t, out.lse, &dp.q, NULL, &g.dq.t,
                                     &g.dk.t, &g.dv.t, &prm),
                 SDPA_INVALID_ARGUMENT);
    sdpa_layer_destroy(layer);
    /* the latch: a backend that refuses a backward call at run time is
     * latched off for the layer's backward pass only (one warning), the
     * next candidate runs in the same call; out of memory is returned */
    static scripted refusing;
    memset(&refusing, 0, sizeof refusing);
    sdpa_context *lctx = tl_context(NULL);
    scripted_add(lctx, "test.refuse", &refusing);
    CHECK_STATUS(sdpa_context_load_policy_text(lctx,
                                               "rule both\ndevice cpu\npass forward backward\n"
                                               "try test.refuse ref\nevidence test\n",
                                               "latch.rules"),
                 SDPA_OK);
    CHECK_STATUS(sdpa_layer_create(lctx, &ld, &layer), SDPA_OK);
    refusing.run_status = SDPA_UNSUPPORTED;
    tl_log_reset();
    for (int i = 0; i < 2; i++) {
        CHECK_STATUS(sdpa_layer_backward(layer, &p.q, &p.k, &p.v, &out.t, out.lse, &dp.q, NULL,
                                         &g.dq.t, &g.dk.t, &g.dv.t, &prm),
                     SDPA_OK);
        CHECK(strcmp(sdpa_last_backend(), "ref") == 0, "the next candidate ran: %s",
              sdpa_last_backend());
    }
    CHECK(tl_log_warnings == 1 && strstr(tl_last_warning, "test.refuse") &&
              strstr(tl_last_warning, "backward pass"),
          "one warning for the latch: %d, %s", tl_log_warnings, tl_last_warning);
    CHECK(atomic_load(&refusing.runs) == 1, "latched: tried once, %d times",
          atomic_load(&refusing.runs));
    CHECK(sdpa_layer_is_latched(layer, "test.refuse"), "is_latched says so");
    refusing.run_status = SDPA_OK; /* the forward is not latched */
    tl_output fo;
    if (tl_output_make(&fo, &p)) {
        CHECK_STATUS(sdpa_layer_forward(layer, &p.q, &p.k, &p.v, &fo.t, fo.lse, &prm), SDPA_OK);
        CHECK(strcmp(sdpa_last_backend(), "test.refuse") == 0,
              "the forward still runs the backend latched off for the backward: %s",
              sdpa_last_backend());
        tl_output_free(&fo);
    }
    sdpa_layer_destroy(layer);
    CHECK_STATUS(sdpa_layer_create(lctx, &ld, &layer), SDPA_OK);
    refusing.run_status = SDPA_OUT_OF_MEMORY;
    CHECK_STATUS(sdpa_layer_backward(layer, &p.q, &p.k, &p.v, &out.t, out.lse, &dp.q, NULL,
                                     &g.dq.t, &g.dk.t, &g.dv.t, &prm),
                 SDPA_OUT_OF_MEMORY);
    CHECK(!sdpa_layer_is_latched(layer, "test.refuse"), "out of memory latches nothing");
    sdpa_layer_destroy(layer);
    sdpa_context_destroy(lctx);
    tl_problem_free(&p), tl_problem_free(&dp), tl_output_free(&out), grads_free(&g);
}

int main(int argc, char **argv)
{
    tl_seed_from_env();
    ctx1 = tl_context(NULL);
    ctx2 = tl_context(NULL);
    if (!ctx1 || !ctx2)
        return 1;
    sdpa_context_destroy(ctx1);
    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    o.threads = 1, o.ignore_env = 1;
    if (sdpa_context_create(&o, &ctx1) != SDPA_OK)
        return 1;
#ifdef SDPA_TEST_AMX_EMULATED /* cpu.amx's backward on emulated tiles (test_grid's note) */
    if (sdpa__ctx_add_backend(ctx1, sdpa__cpu_amx_emulated()) != SDPA_OK ||
        sdpa__ctx_add_backend(ctx2, sdpa__cpu_amx_emulated()) != SDPA_OK) {
        printf("cannot add cpu.amx-emulated: %s\n", sdpa_last_error());
        return 1;
    }
#endif
    ref_against_finite_differences();
    api();
    if (argc > 1) {
        for (int i = 1; i < argc; i++)
            grid(argv[i]);
    } else {
        for (int i = 0; i < sdpa_backend_count(ctx2); i++) {
            sdpa_backend_info bi;
            if (sdpa_backend_get(ctx2, i, &bi) != SDPA_OK || bi.device != SDPA_DEVICE_CPU ||
                strcmp(bi.name, "ref") == 0)
                continue;
            if (!bi.backward)
                printf("(%s: no backward pass)\n", bi.name);
            else if (!bi.present)
                tl_skip(bi.name, bi.why_absent);
            else if (getenv("SDPA_TEST_QUICK") && strcmp(bi.name, "cpu.amx-emulated") == 0 &&
                     info("cpu.amx").present) /* as in test_grid: the same kernel, 100x the time */
                tl_skip(bi.name, "SDPA_TEST_QUICK: cpu.amx runs the same kernel on real tiles here");
            else
                grid(bi.name);
        }
    }
    sdpa_context_destroy(ctx1);
    sdpa_context_destroy(ctx2);
    return tl_finish();
}
