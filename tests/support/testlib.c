/* testlib.c - see testlib.h. */
#define _POSIX_C_SOURCE 200809L
#include "testlib.h"
#include "core/half.h"

#include <math.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int tl_passed, tl_failed, tl_skipped;

void tl_skip(const char *what, const char *why)
{
    tl_skipped++;
    printf("SKIP %s: %s\n", what, why);
}

int tl_finish(void)
{
    printf("%d passed, %d failed, %d skipped\n", tl_passed, tl_failed, tl_skipped);
    return tl_failed ? 1 : 0;
}

/* The seed is process-wide; each thread draws its own stream from it (the
 * main thread's is the seed itself), so tests may make inputs on several
 * threads and a run still repeats from its printed seed. */
static uint64_t seed;
static _Thread_local uint64_t rng;
static _Atomic uint64_t streams;

void tl_seed_from_env(void)
{
    const char *s = getenv("SDPA_TEST_SEED");
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    seed = s && *s ? strtoull(s, NULL, 10) : (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20);
    if (!seed)
        seed = 1;
    rng = seed;
    printf("seed %llu (repeat with SDPA_TEST_SEED=%llu)\n", (unsigned long long)seed,
           (unsigned long long)seed);
}

uint64_t tl_seed(void) { return seed; }

double tl_uniform(void)
{
    if (!seed)
        tl_seed_from_env();
    if (!rng) /* a thread's first draw: stream k of the seed */
        rng = seed ^ (0x9e3779b97f4a7c15ull * (atomic_fetch_add(&streams, 1) + 1));
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

#define GUARD_BYTE 0xA5
#define GAP_BYTE 0x5A

void *tl_alloc_guarded(size_t bytes)
{
    unsigned char *p = malloc(bytes + TL_GUARD);
    if (p)
        memset(p + bytes, GUARD_BYTE, TL_GUARD);
    return p;
}

int tl_guard_intact(const void *p, size_t bytes)
{
    const unsigned char *g = (const unsigned char *)p + bytes;
    for (int i = 0; i < TL_GUARD; i++)
        if (g[i] != GUARD_BYTE)
            return 0;
    return 1;
}

void tl_free_guarded(void *p) { free(p); }

const char *tl_values_name(tl_values v)
{
    static const char *const names[TL_VALUES_COUNT] = {
        "uniform", "peaked", "nan-in-q", "nan-in-k", "inf-in-v", "overflow+inf", "overflow-inf"};
    return v < TL_VALUES_COUNT ? names[v] : "?";
}

double tl_case_scale(const tl_case *c) { return c->scale ? c->scale : c->values == TL_PEAKED; }

/* Writes element (b, s, h, d) of a view as x. */
static void put(const sdpa_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d, double x);

/* Rewrites the uniform inputs into the case's pattern (tl_values). */
static void apply_values(tl_problem *p)
{
    const tl_case *c = &p->c;
    const sdpa_tensor *ts[3] = {&p->q, &p->k, &p->v};
    for (int i = 0; i < 3; i++) {
        const sdpa_tensor *t = ts[i];
        for (int64_t b = 0; b < t->size[0]; b++)
            for (int64_t s = 0; s < t->size[1]; s++)
                for (int64_t h = 0; h < t->size[2]; h++)
                    for (int64_t d = 0; d < t->size[3]; d++) {
                        double x = tl_out_get(t, b, s, h, d), y = x;
                        if (c->values == TL_PEAKED && i == 0)
                            y = 8 * x;
                        /* overflow: q > 0; k of key 0 > 0 (+inf for every
                         * query) or every k < 0 (-inf everywhere) */
                        if (c->values == TL_OVERFLOW_POS && i < 2)
                            y = 1e30 * (i == 0 || s == 0 ? 0.5 + fabs(x) : x);
                        if (c->values == TL_OVERFLOW_NEG && i < 2)
                            y = 1e30 * (i == 0 ? 0.5 + fabs(x) : -0.5 - fabs(x));
                        if (y != x)
                            put(t, b, s, h, d, y);
                    }
    }
    const int64_t last = c->Sq - 1, mid = c->Sq / 2;
    for (int64_t b = 0; b < c->B; b++) {
        if (c->values == TL_NAN_Q)
            for (int64_t h = 0; h < c->Hq; h++) {
                put(&p->q, b, 0, h, c->D - 1, NAN);
                put(&p->q, b, mid, h, 0, NAN);
                put(&p->q, b, last, h, c->D / 2, NAN);
            }
        if (c->values == TL_NAN_K && c->Skv > 2)
            for (int64_t h = 0; h < c->Hkv; h++)
                put(&p->k, b, 2, h, 0, NAN);
        if (c->values == TL_INF_V && c->Skv > 1)
            for (int64_t h = 0; h < c->Hkv; h++)
                put(&p->v, b, 1, h, 0, INFINITY);
    }
}

const char *tl_layout_name(tl_layout l)
{
    return l == TL_BSHD      ? "bshd"
           : l == TL_BHSD    ? "bhsd"
           : l == TL_STRIDED ? "strided"
                             : "strided-nan";
}

static void store(void *base, sdpa_dtype t, int64_t i, double x)
{
    if (t == SDPA_F32)
        ((float *)base)[i] = (float)x;
    else if (t == SDPA_F16)
        ((uint16_t *)base)[i] = sdpa__f32_to_f16((float)x);
    else
        ((uint16_t *)base)[i] = sdpa__f32_to_bf16((float)x);
}

static void put(const sdpa_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d, double x)
{
    store(t->data, t->dtype,
          b * t->stride[0] + s * t->stride[1] + h * t->stride[2] + d * t->stride[3], x);
}

float tl_out_get(const sdpa_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d)
{
    int64_t i = b * t->stride[0] + s * t->stride[1] + h * t->stride[2] + d * t->stride[3];
    if (t->dtype == SDPA_F32)
        return ((const float *)t->data)[i];
    if (t->dtype == SDPA_F16)
        return sdpa__f16_to_f32(((const uint16_t *)t->data)[i]);
    return sdpa__bf16_to_f32(((const uint16_t *)t->data)[i]);
}

/*
 * Lays out a [B, S, H, D] tensor. TL_STRIDED (and _NAN) is a view into a wider buffer
 * shaped [B, S, H, D + 3] with the head dim padded and every other batch
 * of rows skipped in S: the view has non-unit strides in S and H and gaps
 * between rows, like a slice of a packed QKV buffer.
 */
static sdpa_tensor layout_tensor(void *mem, sdpa_dtype t, int64_t B, int64_t S, int64_t H,
                                 int64_t D, tl_layout l, size_t *bytes)
{
    sdpa_tensor x;
    if (l == TL_BSHD)
        x = sdpa_tensor_bshd(mem, t, B, S, H, D);
    else if (l == TL_BHSD)
        x = sdpa_tensor_bhsd(mem, t, B, S, H, D);
    else {
        x = sdpa_tensor_bshd(mem, t, B, S, H, D);
        int64_t Dp = D + 3, rowlen = 2 * H * Dp; /* each S row followed by a gap row */
        x.stride[3] = 1, x.stride[2] = Dp, x.stride[1] = rowlen, x.stride[0] = S * rowlen + 5;
    }
    int64_t last = 0;
    for (int i = 0; i < 4; i++)
        last += (x.size[i] - 1) * x.stride[i];
    *bytes = (size_t)(last + 1) * sdpa_dtype_size(t);
    return x;
}

int tl_problem_make(tl_problem *p, const tl_case *c)
{
    memset(p, 0, sizeof *p);
    p->c = *c;
    sdpa_tensor *ts[3] = {&p->q, &p->k, &p->v};
    for (int i = 0; i < 3; i++) {
        int64_t S = i == 0 ? c->Sq : c->Skv, H = i == 0 ? c->Hq : c->Hkv;
        const sdpa_dtype dt = i == 0 ? c->dtype : tl_kv_dtype(c);
        size_t bytes;
        layout_tensor(NULL, dt, c->B, S, H, c->D, c->layout, &bytes);
        p->qkv_mem[i] = tl_alloc_guarded(bytes);
        if (!p->qkv_mem[i])
            return 0;
        p->qkv_bytes[i] = bytes;
        /* Fill everything, gaps included, with random values: a kernel that
         * reads a gap gets a wrong answer rather than a lucky zero (with
         * TL_STRIDED_NAN: NaN, then the view's elements random). */
        const int nan_gaps = c->layout == TL_STRIDED_NAN;
        for (size_t e = 0; e < bytes / sdpa_dtype_size(dt); e++)
            store(p->qkv_mem[i], dt, (int64_t)e, nan_gaps ? NAN : tl_uniform());
        *ts[i] = layout_tensor(p->qkv_mem[i], dt, c->B, S, H, c->D, c->layout, &bytes);
        for (int64_t b = 0; nan_gaps && b < c->B; b++)
            for (int64_t s = 0; s < S; s++)
                for (int64_t h = 0; h < H; h++)
                    for (int64_t d = 0; d < c->D; d++)
                        put(ts[i], b, s, h, d, tl_uniform());
    }
    if (c->values != TL_UNIFORM)
        apply_values(p);
    return 1;
}

int tl_problem_rounded(tl_problem *dst, const tl_problem *src, sdpa_dtype t)
{
    tl_case c = src->c;
    c.dtype = t;
    c.kv_dtype = 0;
    c.values = TL_UNIFORM;
    if (!tl_problem_make(dst, &c))
        return 0;
    dst->c = src->c;
    const sdpa_tensor *from[3] = {&src->q, &src->k, &src->v};
    const sdpa_tensor *to[3] = {&dst->q, &dst->k, &dst->v};
    for (int i = 0; i < 3; i++)
        for (int64_t b = 0; b < from[i]->size[0]; b++)
            for (int64_t s = 0; s < from[i]->size[1]; s++)
                for (int64_t h = 0; h < from[i]->size[2]; h++)
                    for (int64_t d = 0; d < from[i]->size[3]; d++)
                        put(to[i], b, s, h, d, tl_out_get(from[i], b, s, h, d));
    return 1;
}

void tl_problem_round_bf16(tl_problem *p)
{
    const sdpa_tensor *ts[3] = {&p->q, &p->k, &p->v};
    for (int i = 0; i < 3; i++)
        for (int64_t b = 0; b < ts[i]->size[0]; b++)
            for (int64_t s = 0; s < ts[i]->size[1]; s++)
                for (int64_t h = 0; h < ts[i]->size[2]; h++)
                    for (int64_t d = 0; d < ts[i]->size[3]; d++)
                        put(ts[i], b, s, h, d,
                            sdpa__bf16_to_f32(sdpa__f32_to_bf16(tl_out_get(ts[i], b, s, h, d))));
}

void tl_problem_free(tl_problem *p)
{
    for (int i = 0; i < 3; i++)
        tl_free_guarded(p->qkv_mem[i]);
    memset(p, 0, sizeof *p);
}

int tl_output_make(tl_output *o, const tl_problem *p)
{
    memset(o, 0, sizeof *o);
    const tl_case *c = &p->c;
    layout_tensor(NULL, c->out_dtype, c->B, c->Sq, c->Hq, c->D, c->layout, &o->bytes);
    o->mem = tl_alloc_guarded(o->bytes);
    if (!o->mem)
        return 0;
    memset(o->mem, GAP_BYTE, o->bytes);
    size_t bytes;
    o->t = layout_tensor(o->mem, c->out_dtype, c->B, c->Sq, c->Hq, c->D, c->layout, &bytes);
    if (c->want_lse) {
        size_t n = (size_t)(c->B * c->Hq * c->Sq);
        o->lse = tl_alloc_guarded(n * sizeof(float));
        if (!o->lse)
            return 0;
        for (size_t i = 0; i < n; i++)
            o->lse[i] = NAN;
    }
    return 1;
}

int tl_output_check(const tl_output *o, char *why, size_t n)
{
    if (!tl_guard_intact(o->mem, o->bytes)) {
        snprintf(why, n, "guard bytes after out overwritten");
        return 0;
    }
    if (o->lse && !tl_guard_intact(o->lse, (size_t)(o->t.size[0] * o->t.size[2] * o->t.size[1]) *
                                               sizeof(float))) {
        snprintf(why, n, "guard bytes after lse overwritten");
        return 0;
    }
    /* Gaps of a strided view: mark every element of the view, then every
     * byte not marked must still hold the gap pattern. */
    unsigned char *mark = calloc(o->bytes, 1);
    if (!mark) {
        snprintf(why, n, "out of memory in the check");
        return 0;
    }
    const sdpa_tensor *t = &o->t;
    size_t es = sdpa_dtype_size(t->dtype);
    for (int64_t b = 0; b < t->size[0]; b++)
        for (int64_t s = 0; s < t->size[1]; s++)
            for (int64_t h = 0; h < t->size[2]; h++)
                for (int64_t d = 0; d < t->size[3]; d++) {
                    int64_t i = b * t->stride[0] + s * t->stride[1] + h * t->stride[2] +
                                d * t->stride[3];
                    memset(mark + (size_t)i * es, 1, es);
                }
    int ok = 1;
    for (size_t i = 0; i < o->bytes && ok; i++)
        if (!mark[i] && ((unsigned char *)o->mem)[i] != GAP_BYTE) {
            snprintf(why, n, "byte %zu between output rows was written", i);
            ok = 0;
        }
    free(mark);
    return ok;
}

void tl_output_free(tl_output *o)
{
    tl_free_guarded(o->mem);
    tl_free_guarded(o->lse);
    memset(o, 0, sizeof *o);
}

double tl_tolerance(sdpa_dtype in, sdpa_dtype out)
{
    /* Inputs are identical for both sides (already rounded to `in`), so
     * the difference is accumulation error (f32: ~1e-6 relative) plus the
     * rounding of the stored output: half an ulp of |out| <= 1. */
    (void)in;
    switch (out) {
    case SDPA_F32: return 2e-5;
    case SDPA_F16: return 1e-3;  /* 2^-11 half-ulp at 1, plus accumulation */
    case SDPA_BF16: return 8e-3; /* 2^-8 half-ulp at 1, plus accumulation  */
    }
    return 0;
}

double tl_product_tolerance(int bits)
{
    /* Rounding P (and f16 Q, K, V) to `bits` significand bits moves each
     * weight by at most 2^-bits relative: |out - ref| <= 2^-bits max|v|
     * for P, with errors of random sign in practice; twice that covers the
     * inputs' rounding too. Exact products (0, or 24 and up) add nothing. */
    return bits > 0 && bits < 24 ? 2.0 * ldexp(1.0, -bits) : 0.0;
}

int tl_same_bits(const tl_output *a, const tl_output *b, const tl_case *c)
{
    return a->bytes == b->bytes && memcmp(a->mem, b->mem, a->bytes) == 0 &&
           (!a->lse || !b->lse ||
            memcmp(a->lse, b->lse, sizeof(float) * (size_t)(c->B * c->Hq * c->Sq)) == 0);
}

double tl_max_diff(const tl_output *a, const tl_output *b, int64_t *where)
{
    double worst = 0;
    const sdpa_tensor *x = &a->t, *y = &b->t;
    int64_t n = 0;
    for (int64_t i0 = 0; i0 < x->size[0]; i0++)
        for (int64_t i1 = 0; i1 < x->size[1]; i1++)
            for (int64_t i2 = 0; i2 < x->size[2]; i2++)
                for (int64_t i3 = 0; i3 < x->size[3]; i3++, n++) {
                    const double u = tl_out_get(x, i0, i1, i2, i3);
                    const double w = tl_out_get(y, i0, i1, i2, i3);
                    double d;
                    if (isfinite(u) && isfinite(w))
                        d = fabs(u - w);
                    else /* non-finite must match exactly */
                        d = (isnan(u) && isnan(w)) || u == w ? 0.0 : INFINITY;
                    if (!(d <= worst)) {
                        worst = isnan(d) ? INFINITY : d;
                        if (where)
                            *where = n;
                    }
                }
    return worst;
}

double tl_max_lse_diff(const tl_output *a, const tl_output *b, int64_t B, int64_t Hq, int64_t Sq)
{
    double worst = 0;
    for (int64_t i = 0; i < B * Hq * Sq; i++) {
        float x = a->lse[i], y = b->lse[i];
        if (!isfinite(x) || !isfinite(y)) {
            if (!((isnan(x) && isnan(y)) || x == y))
                return INFINITY;
            continue;
        }
        double d = fabs((double)x - (double)y);
        if (!(d <= worst))
            worst = isnan(d) ? INFINITY : d;
    }
    return worst;
}

double tl_max_abs(const tl_output *o)
{
    const sdpa_tensor *t = &o->t;
    double m = 0;
    for (int64_t b = 0; b < t->size[0]; b++)
        for (int64_t s = 0; s < t->size[1]; s++)
            for (int64_t h = 0; h < t->size[2]; h++)
                for (int64_t d = 0; d < t->size[3]; d++) {
                    double x = fabs(tl_out_get(t, b, s, h, d));
                    if (isfinite(x) && x > m)
                        m = x;
                }
    return m;
}

int tl_log_warnings;
char tl_last_warning[1024];
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static void capture_log(sdpa_log_level level, const char *msg, void *user)
{
    (void)user;
    pthread_mutex_lock(&log_lock);
    if (level == SDPA_LOG_WARN) {
        tl_log_warnings++;
        snprintf(tl_last_warning, sizeof tl_last_warning, "%s", msg);
    }
    pthread_mutex_unlock(&log_lock);
}

void tl_log_reset(void)
{
    pthread_mutex_lock(&log_lock);
    tl_log_warnings = 0;
    tl_last_warning[0] = '\0';
    pthread_mutex_unlock(&log_lock);
}

sdpa_status tl_run_against_ref(sdpa_context *ctx, const char *backend, const tl_case *c,
                               double *diff, char *ran, size_t n)
{
    tl_problem p;
    tl_output got, want;
    *diff = INFINITY;
    if (n)
        ran[0] = '\0';
    if (!tl_problem_make(&p, c))
        return SDPA_OUT_OF_MEMORY;
    if (!tl_output_make(&got, &p) || !tl_output_make(&want, &p)) {
        tl_problem_free(&p);
        return SDPA_OUT_OF_MEMORY;
    }
    sdpa_params prm = SDPA_PARAMS_DEFAULT;
    prm.backend = backend;
    prm.causal = c->causal;
    prm.scale = tl_case_scale(c);
    sdpa_status st = sdpa_forward(ctx, &p.q, &p.k, &p.v, &got.t, got.lse, &prm);
    if (st == SDPA_OK) {
        snprintf(ran, n, "%s", sdpa_last_backend());
        prm.backend = "ref";
        st = sdpa_forward(ctx, &p.q, &p.k, &p.v, &want.t, want.lse, &prm);
        char why[128];
        if (st == SDPA_OK)
            *diff = tl_output_check(&got, why, sizeof why) ? tl_max_diff(&got, &want, NULL)
                                                           : INFINITY;
    }
    tl_output_free(&got), tl_output_free(&want), tl_problem_free(&p);
    return st;
}

sdpa_context *tl_context(const char *platform)
{
    sdpa_platform plat;
    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    if (platform) {
        if (sdpa_platform_parse(platform, &plat) != SDPA_OK) {
            printf("platform %s: %s\n", platform, sdpa_last_error());
            return NULL;
        }
        o.platform = &plat;
    }
    o.threads = 2;
    o.ignore_env = 1;
    o.log = capture_log;
    o.log_level = SDPA_LOG_WARN;
    sdpa_context *ctx = NULL;
    if (sdpa_context_create(&o, &ctx) != SDPA_OK)
        printf("context: %s\n", sdpa_last_error());
    return ctx;
}

int tl_claims(sdpa_context *ctx, const sdpa_call_desc *d, char *why, size_t n)
{
    static _Thread_local sdpa_decision dec;
    if (sdpa_decide(ctx, d, &dec) != SDPA_OK)
        return snprintf(why, n, "%s", sdpa_last_error()), 0;
    if (dec.n_candidates == 1)
        return 1;
    snprintf(why, n, "%s", dec.error);
    return 0;
}
