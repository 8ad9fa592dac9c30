/*
 * test_sparse.c - windows and block maps (sdpa.h), forward and backward.
 *
 * Exactness is the claim: a sparse call must equal the dense call fed the
 * same pattern as a boolean general mask. Each case draws a fresh random
 * map (per head or broadcast, blocks of 64 or 128, PARTIAL blocks with or
 * without bits, index_stride wider than the lists), materialises it here
 * by a linear reading of its lists (not sparse.h's search), and compares:
 *   ref with the map       == ref with the dense mask   (1e-6)
 *   each CPU backend that claims the map == that dense answer (the grid's
 *   tolerance, LSE within 1e-3 of the score scale, guard bytes intact)
 * at block sparsities 0, 0.25, 0.5, 0.75, 0.9, 0.99 and 1, lengths that
 * are not whole blocks, grouped-query heads, cross attention, both causal
 * alignments, with sequence lengths and a key mask on top, and peaked
 * scores. Windows (1-D) the same way; sdpa_block_map_3d against a reading
 * of the neighbourhood from token coordinates. The backward pass of every
 * backend that claims the map equals ref's under the dense mask. Bad maps
 * get INVALID_ARGUMENT naming the field, nothing written.
 */
#ifdef SDPA_TEST_AMX_EMULATED
#include "amx_emulated.h"
#endif
#include "support/testlib.h"
#include "core/core.h"
#include "dispatch/context.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static sdpa_context *ctx;

typedef struct test_map {
    sdpa_block_map m;
    int32_t *fc, *fi, *pc, *pi;
    uint64_t *bits;
} test_map;

static unsigned draw(unsigned n) { return (unsigned)((tl_uniform() + 1) * 0.5 * n) % n; }

/* A random map: each key block of each row hidden with probability s, else
 * FULL or PARTIAL (half each; PARTIAL with random bits when with_bits). */
static void map_make(test_map *t, const tl_case *c, int32_t bq, int32_t bkv, int per_batch,
                     int per_head, double s, int with_bits)
{
    sdpa_block_map *m = &t->m;
    memset(t, 0, sizeof *t);
    m->block_q = bq, m->block_kv = bkv;
    m->batch = per_batch ? c->B : 1, m->heads = per_head ? c->Hq : 1;
    m->q_blocks = (c->Sq + bq - 1) / bq, m->kv_blocks = (c->Skv + bkv - 1) / bkv;
    m->index_stride = m->kv_blocks + (int64_t)draw(3); /* wider than needed, as torch's */
    const int64_t rows = m->batch * m->heads * m->q_blocks, words = (int64_t)bq * bkv / 64;
    t->fc = calloc((size_t)rows, sizeof(int32_t));
    t->pc = calloc((size_t)rows, sizeof(int32_t));
    t->fi = malloc(sizeof(int32_t) * (size_t)(rows * m->index_stride));
    t->pi = malloc(sizeof(int32_t) * (size_t)(rows * m->index_stride));
    for (int64_t i = 0; i < rows * m->index_stride; i++)
        t->fi[i] = t->pi[i] = -7; /* unused entries: never read */
    if (with_bits)
        t->bits = calloc((size_t)(rows * m->index_stride * words), sizeof(uint64_t));
    for (int64_t r = 0; r < rows; r++)
        for (int32_t kb = 0; kb < m->kv_blocks; kb++) {
            if ((tl_uniform() + 1) * 0.5 < s)
                continue;
            if (draw(2)) {
                t->fi[r * m->index_stride + t->fc[r]++] = kb;
                continue;
            }
            const int64_t n = t->pc[r]++;
            t->pi[r * m->index_stride + n] = kb;
            for (int64_t w = 0; with_bits && w < words; w++)
                for (int bit = 0; bit < 64; bit++)
                    if (draw(10) < 7)
                        t->bits[(r * m->index_stride + n) * words + w] |= (uint64_t)1 << bit;
        }
    m->full_count = t->fc, m->full_index = t->fi;
    m->partial_count = t->pc, m->partial_index = t->pi, m->partial_bits = t->bits;
}

static void map_free(test_map *t) { free(t->fc), free(t->fi), free(t->pc), free(t->pi), free(t->bits); }

/* The map's answer for (b, h, i, j), read by scanning its lists. */
static int map_sees(const sdpa_block_map *m, int64_t b, int64_t h, int64_t i, int64_t j)
{
    const int64_t row = ((m->batch == 1 ? 0 : b) * m->heads + (m->heads == 1 ? 0 : h)) *
                            m->q_blocks + i / m->block_q;
    const int64_t kb = j / m->block_kv;
    for (int32_t e = 0; m->full_count && e < m->full_count[row]; e++)
        if (m->full_index[row * m->index_stride + e] == kb)
            return 1;
    for (int32_t e = 0; m->partial_count && e < m->partial_count[row]; e++)
        if (m->partial_index[row * m->index_stride + e] == kb) {
            if (!m->partial_bits)
                return 1;
            const int64_t bit = (i % m->block_q) * m->block_kv + j % m->block_kv;
            const uint64_t *w =
                m->partial_bits + (row * m->index_stride + e) * ((int64_t)m->block_q * m->block_kv / 64);
            return (int)(w[bit / 64] >> (bit % 64) & 1);
        }
    return 0;
}

/* What a case adds on top of the sparse pattern. */
typedef struct extras {
    int32_t lq[4], lkv[4];
    int lens;
    uint8_t *key; /* [B][Skv] */
} extras;

/* The pattern (map and/or window) as a dense boolean mask [B][Hq][Sq][Skv]. */
static uint8_t *materialise(const tl_case *c, const sdpa_block_map *m, const sdpa_window *w,
                            const extras *x)
{
    uint8_t *g = malloc((size_t)(c->B * c->Hq * c->Sq * c->Skv));
    for (int64_t b = 0; b < c->B; b++) {
        const int64_t lq = x->lens ? x->lq[b] : c->Sq, lkv = x->lens ? x->lkv[b] : c->Skv;
        for (int64_t h = 0; h < c->Hq; h++)
            for (int64_t i = 0; i < c->Sq; i++)
                for (int64_t j = 0; j < c->Skv; j++) {
                    int see = !m || map_sees(m, b, h, i, j);
                    if (w) { /* FlashAttention's window, bottom-right on the real lengths */
                        const int64_t d = j - (i + lkv - lq);
                        see &= (w->left < 0 || d >= -w->left) && (w->right < 0 || d <= w->right);
                    }
                    g[((b * c->Hq + h) * c->Sq + i) * c->Skv + j] = (uint8_t)see;
                }
    }
    return g;
}

static sdpa_mask mask_of(const tl_case *c, const extras *x, const sdpa_block_map *m,
                         const sdpa_window *w, const uint8_t *dense)
{
    sdpa_mask k = SDPA_MASK_DEFAULT;
    if (x->lens)
        k.seq_len_q = x->lq, k.seq_len_kv = x->lkv;
    if (x->key)
        k.key = x->key, k.key_stride[0] = c->Skv, k.key_stride[1] = 1;
    if (dense) {
        k.general = dense, k.general_type = SDPA_MASK_BOOL;
        k.general_stride[0] = c->Hq * c->Sq * c->Skv, k.general_stride[1] = c->Sq * c->Skv;
        k.general_stride[2] = c->Skv, k.general_stride[3] = 1;
    } else {
        k.blocks = m, k.window = w;
    }
    return k;
}

static sdpa_status forward(const char *backend, const tl_problem *p, const sdpa_mask *k,
                           tl_output *o)
{
    sdpa_params prm = SDPA_PARAMS_DEFAULT;
    prm.backend = backend, prm.causal = p->c.causal, prm.mask = k, prm.scale = tl_case_scale(&p->c);
    return sdpa_forward(ctx, &p->q, &p->k, &p->v, &o->t, o->lse, &prm);
}

/* Gradients of one backend: dq, dk, dv in f32 (contiguous). */
typedef struct grads {
    float *dq, *dk, *dv;
} grads;

static sdpa_status backward(const char *backend, const tl_problem *p, const sdpa_mask *k,
                            const tl_output *fwd, const sdpa_tensor *dout, grads *g)
{
    const tl_case *c = &p->c;
    g->dq = malloc(sizeof(float) * (size_t)(c->B * c->Sq * c->Hq * c->D));
    g->dk = malloc(sizeof(float) * (size_t)(c->B * c->Skv * c->Hkv * c->D));
    g->dv = malloc(sizeof(float) * (size_t)(c->B * c->Skv * c->Hkv * c->D));
    sdpa_tensor dq = sdpa_tensor_bshd(g->dq, SDPA_F32, c->B, c->Sq, c->Hq, c->D);
    sdpa_tensor dk = sdpa_tensor_bshd(g->dk, SDPA_F32, c->B, c->Skv, c->Hkv, c->D);
    sdpa_tensor dv = sdpa_tensor_bshd(g->dv, SDPA_F32, c->B, c->Skv, c->Hkv, c->D);
    sdpa_params prm = SDPA_PARAMS_DEFAULT;
    prm.backend = backend, prm.causal = c->causal, prm.mask = k, prm.scale = tl_case_scale(c);
    return sdpa_backward(ctx, &p->q, &p->k, &p->v, &fwd->t, fwd->lse, dout, NULL, &dq, &dk, &dv,
                         &prm);
}

static double grads_diff(const tl_case *c, const grads *a, const grads *b)
{
    const int64_t n[3] = {c->B * c->Sq * c->Hq * c->D, c->B * c->Skv * c->Hkv * c->D,
                          c->B * c->Skv * c->Hkv * c->D};
    const float *x[3] = {a->dq, a->dk, a->dv}, *y[3] = {b->dq, b->dk, b->dv};
    double worst = 0;
    for (int t = 0; t < 3; t++)
        for (int64_t i = 0; i < n[t]; i++) {
            const double d = fabs((double)x[t][i] - y[t][i]);
            worst = d <= worst ? worst : (isnan(d) ? INFINITY : d);
        }
    return worst;
}

static void grads_free(grads *g) { free(g->dq), free(g->dk), free(g->dv); }

static char backends[SDPA_MAX_BACKENDS][32];
static int n_backends, n_claimed;
/* SDPA_TEST_QUICK (the TSan build): a few cases of each kind, for the
 * threads; the other builds run them all */
static int quick;

/* One pattern on one case: ref both ways, then every claiming backend,
 * forward, and backward where it has one. */
static void one_case(const tl_case *c, const sdpa_block_map *m, const sdpa_window *w,
                     const extras *x, const char *what)
{
    tl_problem p;
    tl_output want, got_ref;
    if (!tl_problem_make(&p, c) || !tl_output_make(&want, &p) || !tl_output_make(&got_ref, &p)) {
        CHECK(0, "%s: out of memory", what);
        return;
    }
    uint8_t *dense = materialise(c, m, w, x);
    const sdpa_mask k_dense = mask_of(c, x, m, w, dense), k_sparse = mask_of(c, x, m, w, NULL);
    CHECK_STATUS(forward("ref", &p, &k_dense, &want), SDPA_OK);
    CHECK_STATUS(forward("ref", &p, &k_sparse, &got_ref), SDPA_OK);
    double d = tl_max_diff(&got_ref, &want, NULL);
    double ld = tl_max_lse_diff(&got_ref, &want, c->B, c->Hq, c->Sq);
    CHECK(d <= 1e-6 && ld <= 1e-6, "ref %s: sparse vs dense |out| %.3g |lse| %.3g", what, d, ld);
    /* for kernels whose products round to bf16: the dense answer on f16
     * inputs as they round them (test_grid's rule), made when needed */
    tl_problem rounded;
    tl_output want_rounded;
    int have_rounded = 0;

    /* dout for the backward: fresh random values shaped like out */
    tl_problem gp;
    tl_case gc = *c;
    gc.dtype = SDPA_F32, gc.layout = TL_BSHD, gc.values = TL_UNIFORM;
    tl_problem_make(&gp, &gc);
    grads g_want = {0};
    int have_grad_ref = 0;

    for (int bi = 0; bi < n_backends; bi++) {
        sdpa_backend_info info;
        for (int i = 0; i < sdpa_backend_count(ctx); i++)
            if (sdpa_backend_get(ctx, i, &info) == SDPA_OK && strcmp(info.name, backends[bi]) == 0)
                break;
        sdpa_call_desc dd = {.size = sizeof(sdpa_call_desc), .device = SDPA_DEVICE_CPU,
                             .dtype = c->dtype, .B = c->B, .Sq = c->Sq, .Skv = c->Skv, .Hq = c->Hq,
                             .Hkv = c->Hkv, .D = c->D, .causal = c->causal, .want_lse = 1,
                             .backend = backends[bi]};
        dd.mask = (x->lens ? SDPA_MASK_KIND_SEQ_LEN : 0) | (x->key ? SDPA_MASK_KIND_KEY : 0) |
                  (m ? SDPA_MASK_KIND_BLOCKS : 0) | (w ? SDPA_MASK_KIND_WINDOW : 0);
        char why[200];
        tl_output got;
        tl_output_make(&got, &p);
        if (!tl_claims(ctx, &dd, why, sizeof why)) {
            if (strstr(why, "mask not supported"))
                CHECK(forward(backends[bi], &p, &k_sparse, &got) == SDPA_UNSUPPORTED,
                      "%s %s: a map it does not take must be refused", backends[bi], what);
            tl_output_free(&got);
            continue;
        }
        n_claimed++;
        const sdpa_status st = forward(backends[bi], &p, &k_sparse, &got);
        CHECK(st == SDPA_OK, "%s %s: claimed but %s: %s", backends[bi], what,
              sdpa_status_string(st), sdpa_last_error());
        if (st == SDPA_OK) {
            const tl_output *ref = &want;
            if (info.product_bits == 8 && c->dtype == SDPA_F16) {
                if (!have_rounded) {
                    tl_problem_rounded(&rounded, &p, SDPA_BF16);
                    tl_output_make(&want_rounded, &rounded);
                    CHECK_STATUS(forward("ref", &rounded, &k_dense, &want_rounded), SDPA_OK);
                    have_rounded = 1;
                }
                ref = &want_rounded;
            }
            /* test_grid's bounds: output rounding, bf16 products, the
             * float32 rounding of peaked scores; relative to the reference
             * too, so that small outputs cannot hide in the absolute bound */
            const int bits = info.product_bits;
            const double peaked = c->values == TL_PEAKED;
            const double tol = tl_tolerance(c->dtype, c->out_dtype) + tl_product_tolerance(bits) +
                               peaked * 8.0 * (double)c->D * ldexp(1.0, -22);
            const double mag = tl_max_abs(ref);
            d = tl_max_diff(&got, ref, NULL);
            ld = tl_max_lse_diff(&got, ref, c->B, c->Hq, c->Sq);
            CHECK(d <= tol && (d <= 4 * tol * mag || mag == 0),
                  "%s %s: |out - dense| %.3g (tolerance %.3g, max |ref| %.3g)", backends[bi], what,
                  d, tol, mag);
            CHECK(ld <= 1e-3 + tl_product_tolerance(bits) + peaked * 512.0 * ldexp(1.0, -22),
                  "%s %s: |lse - dense| %.3g", backends[bi], what, ld);
            CHECK(tl_output_check(&got, why, sizeof why), "%s %s: %s", backends[bi], what, why);
        }
        if (info.backward && c->values != TL_PEAKED && st == SDPA_OK) {
            if (!have_grad_ref) {
                CHECK_STATUS(backward("ref", &p, &k_dense, &want, &gp.q, &g_want), SDPA_OK);
                have_grad_ref = 1;
            }
            grads g = {0};
            const sdpa_status bs = backward(backends[bi], &p, &k_sparse, &got, &gp.q, &g);
            CHECK(bs == SDPA_OK, "%s %s backward: %s: %s", backends[bi], what,
                  sdpa_status_string(bs), sdpa_last_error());
            if (bs == SDPA_OK) {
                const double gd = grads_diff(c, &g, &g_want);
                /* bf16 products (cpu.amx) as the forward's bound adds them */
                CHECK(gd <= 4 * tl_tolerance(c->dtype, SDPA_F32) + 2e-3 +
                                tl_product_tolerance(info.product_bits),
                      "%s %s backward: |grad - dense ref| %.3g", backends[bi], what, gd);
            }
            grads_free(&g);
        }
        tl_output_free(&got);
    }
    if (have_grad_ref)
        grads_free(&g_want);
    if (have_rounded)
        tl_output_free(&want_rounded), tl_problem_free(&rounded);
    tl_problem_free(&gp);
    free(dense);
    tl_output_free(&want), tl_output_free(&got_ref), tl_problem_free(&p);
}

static void maps(void)
{
    static const double sparsities[] = {0, 0.25, 0.5, 0.75, 0.9, 0.99, 1};
    const sdpa_dtype dtypes[3] = {SDPA_F32, SDPA_BF16, SDPA_F16};
    for (size_t si = 0; si < sizeof sparsities / sizeof *sparsities; si++) {
        const double s = sparsities[si];
        if (quick && si != 2 && si != 5)
            continue;
        /* self attention, GQA, lengths not whole blocks, several map blocks */
        for (int causal = 0; causal <= 2; causal++) {
            tl_case c = {2, 300, 300, 4, 2, 64, dtypes[(si + causal) % 3], SDPA_F32,
                         (sdpa_causal)causal, si % 2 ? TL_STRIDED_NAN : TL_BSHD, 1,
                         si == 2 ? TL_PEAKED : TL_UNIFORM, 0, 0};
            test_map t;
            extras x = {{0}, {0}, 0, NULL};
            const int bits = (si + causal) % 2;
            map_make(&t, &c, si % 2 ? 64 : 128, causal == 1 ? 64 : 128, causal == 2,
                     causal != 1, s, bits);
            char what[200];
            snprintf(what, sizeof what,
                     "map s=%.2f %s %s Sq=%lld Skv=%lld blocks %dx%d bits=%d per-head=%d %s", s,
                     sdpa_dtype_name(c.dtype), sdpa_causal_name(c.causal), (long long)c.Sq,
                     (long long)c.Skv, t.m.block_q, t.m.block_kv, bits, t.m.heads > 1,
                     tl_values_name(c.values));
            one_case(&c, &t.m, NULL, &x, what);
            map_free(&t);
        }
        /* cross attention (Sq != Skv), bottom-right causal, lengths and a key mask */
        tl_case c = {3, 97, 260, 2, 1, 40, dtypes[si % 3], SDPA_F32, SDPA_CAUSAL_BOTTOM_RIGHT,
                     TL_BSHD, 1, TL_UNIFORM, 0, 0};
        extras x = {{97, 50, 0}, {260, 200, 130}, 1, malloc((size_t)(3 * 260))};
        for (int i = 0; i < 3 * 260; i++)
            x.key[i] = draw(5) != 0;
        test_map t;
        map_make(&t, &c, 64, 128, 1, 1, s, 1);
        char what[200];
        snprintf(what, sizeof what, "map s=%.2f cross %s + seq_len + key", s,
                 sdpa_dtype_name(c.dtype));
        one_case(&c, &t.m, NULL, &x, what);
        /* and with a window on top */
        const sdpa_window w = {70, 10};
        snprintf(what, sizeof what, "map s=%.2f cross %s + seq_len + key + window", s,
                 sdpa_dtype_name(c.dtype));
        one_case(&c, &t.m, &w, &x, what);
        map_free(&t), free(x.key);
        /* partial blocks that show two keys, each to one row: a kernel that
         * skips a block none of its rows sees must still run the one whose
         * rows see a single key (any column) */
        tl_case c2 = {1, 300, 300, 2, 2, 64, si % 2 ? SDPA_BF16 : SDPA_F16, SDPA_F32,
                      SDPA_CAUSAL_NONE, TL_BSHD, 1, TL_UNIFORM, 0, 0};
        test_map t2;
        map_make(&t2, &c2, 128, 128, 0, 1, s, 1);
        const int64_t words = 128 * 128 / 64, entries = t2.m.heads * t2.m.q_blocks * t2.m.index_stride;
        memset(t2.bits, 0, sizeof(uint64_t) * (size_t)(entries * words));
        for (int64_t e = 0; e < entries; e++)
            for (int k = 0; k < 2; k++) {
                const unsigned bit = draw(128 * 128);
                t2.bits[e * words + bit / 64] |= (uint64_t)1 << bit % 64;
            }
        extras x2 = {{0}, {0}, 0, NULL};
        snprintf(what, sizeof what, "map s=%.2f %s, partial blocks showing two keys", s,
                 sdpa_dtype_name(c2.dtype));
        one_case(&c2, &t2.m, NULL, &x2, what);
        map_free(&t2);
    }
    /* few query rows per KV head (the kernels' decode path must not take
     * a window or a map: found by fuzz_forward) */
    for (int64_t sq = 1; sq <= 3; sq += 2) {
        tl_case c = {2, sq, 300, 4, 2, 16, sq == 1 ? SDPA_BF16 : SDPA_F32, SDPA_F32,
                     SDPA_CAUSAL_NONE, TL_BSHD, 1, TL_UNIFORM, 0, 0};
        extras x = {{(int32_t)sq, 1}, {300, 150}, 1, NULL};
        const sdpa_window w = {17, 11};
        char what[160];
        snprintf(what, sizeof what, "few queries (Sq=%lld) %s + window + seq_len", (long long)sq,
                 sdpa_dtype_name(c.dtype));
        one_case(&c, NULL, &w, &x, what);
        test_map t;
        map_make(&t, &c, 64, 64, 0, 1, 0.5, 1);
        snprintf(what, sizeof what, "few queries (Sq=%lld) %s + map", (long long)sq,
                 sdpa_dtype_name(c.dtype));
        one_case(&c, &t.m, NULL, &x, what);
        map_free(&t);
    }
}

static void windows(void)
{
    const sdpa_window ws[] = {{0, 0}, {33, -1}, {-1, 50}, {100, 100}, {127, 0}, {5, 300}};
    for (size_t wi = 0; wi < sizeof ws / sizeof *ws; wi++)
        for (int causal = 0; causal <= 2; causal += 2) {
            if (quick && (wi + (size_t)causal) % 4 != 1)
                continue;
            tl_case c = {1, wi % 2 ? 200 : 333, 333, 3, wi % 3 ? 3 : 1, wi % 2 ? 72 : 64,
                         wi % 3 == 1 ? SDPA_BF16 : SDPA_F32, SDPA_F32, (sdpa_causal)causal,
                         TL_BSHD, 1, wi == 3 ? TL_PEAKED : TL_UNIFORM, 0, 0};
            extras x = {{0}, {0}, 0, NULL};
            if (wi == 4)
                x.lens = 1, x.lq[0] = 150, x.lkv[0] = 290;
            char what[200];
            snprintf(what, sizeof what, "window (%lld, %lld) %s %s Sq=%lld Skv=%lld%s",
                     (long long)ws[wi].left, (long long)ws[wi].right, sdpa_dtype_name(c.dtype),
                     sdpa_causal_name(c.causal), (long long)c.Sq, (long long)c.Skv,
                     x.lens ? " + seq_len" : "");
            one_case(&c, NULL, &ws[wi], &x, what);
        }
}

/* sdpa_block_map_3d against the neighbourhood read from coordinates. */
static int nb_sees(const sdpa_neighborhood_3d *nb, int64_t h, int64_t i, int64_t j)
{
    const int64_t P = nb->prefix, G = nb->grid[0] * nb->grid[1] * nb->grid[2];
    if (i < P || j < P || i >= P + G || j >= P + G) /* text before or after the grid */
        return 1;
    int64_t pi[3], pj[3], n[3];
    const int tiled = nb->tile[0] > 0;
    for (int a = 0; a < 3; a++)
        n[a] = tiled ? nb->grid[a] / nb->tile[a] : nb->grid[a];
    for (int s = 0; s < 2; s++) {
        int64_t g = (s ? j : i) - P, *p = s ? pj : pi;
        if (tiled)
            g /= nb->tile[0] * nb->tile[1] * nb->tile[2];
        p[0] = g / (n[1] * n[2]), p[1] = g / n[2] % n[1], p[2] = g % n[2];
    }
    const int64_t *win = nb->windows + (nb->heads > 1 ? h : 0) * 3;
    for (int a = 0; a < 3; a++) {
        const int64_t k = win[a];
        if (a == 0 && nb->causal_time) {
            if (pj[0] > pi[0] || (k > 0 && k < n[0] && pj[0] <= pi[0] - k))
                return 0;
            continue;
        }
        if (k <= 0 || k >= n[a])
            continue;
        int64_t start = pi[a] - k / 2;
        start = start < 0 ? 0 : start > n[a] - k ? n[a] - k : start;
        if (pj[a] < start || pj[a] >= start + k)
            return 0;
    }
    return 1;
}

static void neighborhoods(void)
{
    const int64_t w1[3] = {3, 3, 5}, w2[6] = {2, 3, 3, 0, 1, 4}, wt[3] = {3, 1, 3}, wt2[3] = {2, 1, 3};
    struct {
        sdpa_neighborhood_3d nb;
        int32_t block;
        sdpa_dtype dt;
        int64_t suffix; /* text after the grid: sdpa_block_map_3d_joint */
    } cases[] = {
        {{{4, 6, 9}, {0, 0, 0}, w1, 1, 0, 0}, 64, SDPA_F32, 0},
        {{{4, 6, 9}, {0, 0, 0}, w2, 2, 23, 0}, 128, SDPA_BF16, 0},
        {{{5, 4, 8}, {0, 0, 0}, w1, 1, 17, 1}, 64, SDPA_F16, 0},
        {{{6, 8, 16}, {2, 4, 8}, wt2, 1, 0, 0}, 64, SDPA_F32, 0}, /* STA: tiles of one block */
        {{{4, 4, 12}, {2, 2, 4}, wt, 1, 0, 0}, 64, SDPA_F32, 0},  /* tiles of 16 */
        {{{6, 4, 8}, {2, 4, 4}, wt, 1, 40, 1}, 128, SDPA_F32, 0}, /* tiles of 32, text */
        {{{4, 6, 9}, {0, 0, 0}, w2, 2, 0, 0}, 64, SDPA_BF16, 37}, /* text last */
        {{{6, 8, 16}, {2, 4, 8}, wt2, 1, 11, 0}, 128, SDPA_F32, 29}, /* text both sides, STA */
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const sdpa_neighborhood_3d *nb = &cases[ci].nb;
        if (quick && ci % 2)
            continue;
        const int64_t sfx = cases[ci].suffix;
        const int64_t N = nb->prefix + nb->grid[0] * nb->grid[1] * nb->grid[2] + sfx;
        sdpa_block_map *m = NULL;
        if (sfx)
            CHECK_STATUS(sdpa_block_map_3d_joint(nb, sfx, cases[ci].block, &m), SDPA_OK);
        else
            CHECK_STATUS(sdpa_block_map_3d(nb, cases[ci].block, &m), SDPA_OK);
        if (!m)
            continue;
        const int64_t Hq = nb->heads > 1 ? nb->heads : 2;
        int64_t wrong = 0, seen = 0;
        for (int64_t h = 0; h < m->heads; h++)
            for (int64_t i = 0; i < N; i++)
                for (int64_t j = 0; j < N; j++) {
                    const int want = nb_sees(nb, h, i, j);
                    wrong += map_sees(m, 0, h, i, j) != want;
                    seen += want;
                }
        CHECK(wrong == 0, "3-D case %zu: %lld of %lld entries differ from the neighbourhood", ci,
              (long long)wrong, (long long)(m->heads * N * N));
        const double density = sdpa_block_map_density(m, N, N);
        CHECK(density >= (double)seen / (double)(m->heads * N * N) - 1e-12 && density <= 1.0,
              "3-D case %zu: density %.3f below the visible share %.3f", ci, density,
              (double)seen / (double)(m->heads * N * N));
        if (nb->tile[0] * nb->tile[1] * nb->tile[2] == cases[ci].block && nb->prefix == 0 &&
            sfx == 0)
            /* STA: a tile per block, so no partial blocks */
            CHECK(m->partial_count == NULL, "3-D case %zu: tile-aligned map has partial blocks",
                  ci);
        tl_case c = {1, N, N, Hq, 1, 32, cases[ci].dt, SDPA_F32, SDPA_CAUSAL_NONE, TL_BSHD, 1,
                     TL_UNIFORM, 0, 0};
        extras x = {{0}, {0}, 0, NULL};
        char what[160];
        snprintf(what, sizeof what, "3-D case %zu (N=%lld, text %lld + %lld, density %.2f)", ci,
                 (long long)N, (long long)nb->prefix, (long long)sfx, density);
        one_case(&c, m, NULL, &x, what);
        sdpa_block_map_free(m);
    }
}

static void bad_maps(void)
{
    tl_case c = {2, 130, 200, 2, 1, 16, SDPA_F32, SDPA_F32, SDPA_CAUSAL_NONE, TL_BSHD, 1,
                 TL_UNIFORM, 0, 0};
    tl_problem p;
    tl_output o;
    tl_problem_make(&p, &c);
    tl_output_make(&o, &p);
    unsigned char *before = malloc(o.bytes);
    memcpy(before, o.mem, o.bytes);
    struct {
        const char *what, *needle;
    } cases[] = {
        {"block size", "mask->blocks->block_q is 96, expected 64 or 128"},
        {"q_blocks", "mask->blocks->q_blocks is 1, expected 3"},
        {"heads", "mask->blocks->heads is 3, expected 1 (broadcast) or Hq = 2"},
        {"index out of range", "mask->blocks->full_index[b=0, h=0, qb=1][0] is 4, expected a key block 0..3"},
        {"unsorted", "mask->blocks->partial_index[b=0, h=0, qb=0][1] is 0 after 2, expected ascending"},
        {"repeated", "mask->blocks->full_index[b=0, h=0, qb=2][1] is 1 after 1"},
        {"count beyond", "mask->blocks->full_count[b=0, h=0, qb=0] is 9, expected 0..4"},
        {"both lists", "key block 3 of row [b=0, h=0, qb=0] is both full and partial"},
        {"window", "mask->window is {left -2, right 0}"},
        {"bits unaligned", "mask->blocks->partial_bits is not 8-byte aligned"},
    };
    const int n = (int)(sizeof cases / sizeof *cases);
    for (int ci = 0; ci < n; ci++) {
        test_map t;
        map_make(&t, &c, 64, 64, 0, 0, 0.0, 0);
        /* a clean map: row 0 full {1}, partial {2}; row 1 full {0}; row 2 full {1, 2} */
        t.fc[0] = 1, t.fi[0] = 1, t.pc[0] = 1, t.pi[0] = 2;
        t.fc[1] = 1, t.fi[t.m.index_stride] = 0, t.pc[1] = 0;
        t.fc[2] = 2, t.fi[2 * t.m.index_stride] = 1, t.fi[2 * t.m.index_stride + 1] = 2, t.pc[2] = 0;
        sdpa_window w = {-1, -1};
        uint64_t bits[2 * 64 + 1];
        sdpa_mask k = SDPA_MASK_DEFAULT;
        k.blocks = &t.m;
        switch (ci) {
        case 0: t.m.block_q = 96; break;
        case 1: t.m.q_blocks = 1; break;
        case 2: t.m.heads = 3; break;
        case 3: t.fi[t.m.index_stride] = 4; break;
        case 4: t.pc[0] = 2, t.pi[0] = 2, t.pi[1] = 0; break;
        case 5: t.fi[2 * t.m.index_stride + 1] = 1; break;
        case 6: t.fc[0] = 9; break;
        case 7: t.pi[0] = 3, t.fc[0] = 2, t.fi[1] = 3; break;
        case 8: w.left = -2, w.right = 0, k.window = &w; break;
        case 9: t.m.partial_bits = (const uint64_t *)((char *)bits + 4); break;
        }
        sdpa_params prm = SDPA_PARAMS_DEFAULT;
        prm.mask = &k, prm.backend = "ref";
        const sdpa_status st = sdpa_forward(ctx, &p.q, &p.k, &p.v, &o.t, o.lse, &prm);
        CHECK(st == SDPA_INVALID_ARGUMENT && strstr(sdpa_last_error(), cases[ci].needle),
              "%s: %s: %s (expected '%s')", cases[ci].what, sdpa_status_string(st),
              sdpa_last_error(), cases[ci].needle);
        CHECK(memcmp(before, o.mem, o.bytes) == 0, "%s: the output was written", cases[ci].what);
        map_free(&t);
    }
    /* the builder's own arguments */
    const int64_t w3[3] = {1, 1, 1};
    sdpa_neighborhood_3d nb = {{4, 6, 9}, {2, 4, 3}, w3, 1, 0, 0};
    sdpa_block_map *m = (sdpa_block_map *)&nb;
    CHECK(sdpa_block_map_3d(&nb, 128, &m) == SDPA_INVALID_ARGUMENT &&
              strstr(sdpa_last_error(), "nb->tile[1] (H) is 4") && m == NULL,
          "3-D tile not dividing the grid: %s", sdpa_last_error());
    nb.tile[1] = 3;
    CHECK(sdpa_block_map_3d(&nb, 100, &m) == SDPA_INVALID_ARGUMENT &&
              strstr(sdpa_last_error(), "block is 100, expected 64 or 128"),
          "3-D block size: %s", sdpa_last_error());
    m = (sdpa_block_map *)&nb;
    CHECK(sdpa_block_map_3d_joint(&nb, -2, 128, &m) == SDPA_INVALID_ARGUMENT &&
              strstr(sdpa_last_error(), "suffix is -2, expected >= 0") && m == NULL,
          "3-D negative suffix: %s", sdpa_last_error());
    CHECK(sdpa_block_map_3d_joint(&nb, INT64_MAX / 2, 128, &m) == SDPA_INVALID_ARGUMENT &&
              strstr(sdpa_last_error(), "exceed 2^30") && m == NULL,
          "3-D huge suffix: %s", sdpa_last_error());
    free(before);
    tl_output_free(&o), tl_problem_free(&p);
}

/* sdpa_block_map_slice: a piece of a random map shows every (b, h, i, j)
 * of the piece as the map does, aligned on its blocks or not, with bits or
 * without, broadcast or per head; bad arguments are named. */
static void slices(void)
{
    int64_t checks = 0;
    for (int ci = 0; ci < (quick ? 12 : 40); ci++) {
        const int32_t bq = draw(2) ? 64 : 128, bk = draw(2) ? 64 : 128;
        tl_case c = {1 + (int64_t)draw(2), 1 + (int64_t)draw(400), 1 + (int64_t)draw(400),
                     1 + (int64_t)draw(3), 1, 16, SDPA_F32, SDPA_F32, SDPA_CAUSAL_NONE, TL_BSHD,
                     1, TL_UNIFORM, 0, 0};
        test_map t;
        const double s = ci % 4 == 0 ? 0.0 : ci % 4 == 1 ? 1.0 : 0.5;
        map_make(&t, &c, bq, bk, (int)draw(2), (int)draw(2), s, ci % 5 == 2 || draw(2));
        if (ci % 5 == 2) { /* partial blocks that hide one key from one row */
            const int64_t words = (int64_t)bq * bk / 64,
                          n = t.m.batch * t.m.heads * t.m.q_blocks * t.m.index_stride;
            for (int64_t e = 0; e < n; e++) {
                memset(t.bits + e * words, 0xff, sizeof(uint64_t) * (size_t)words);
                const unsigned bit = draw(32) * (unsigned)bk + draw(32);
                t.bits[e * words + bit / 64] &= ~((uint64_t)1 << bit % 64);
            }
        }
        /* aligned pieces for a third of the cases, anything for the rest */
        const int aligned = ci % 3 == 0;
        int64_t q0 = draw((unsigned)c.Sq), k0 = draw((unsigned)c.Skv);
        if (aligned)
            q0 -= q0 % bq, k0 -= k0 % bk;
        const int64_t nq = 1 + draw((unsigned)(c.Sq - q0)), nk = 1 + draw((unsigned)(c.Skv - k0));
        const int64_t h0 = draw((unsigned)c.Hq), nh = 1 + draw((unsigned)(c.Hq - h0));
        sdpa_block_map *sl = NULL;
        CHECK_STATUS(sdpa_block_map_slice(&t.m, c.Sq, c.Skv, q0, nq, k0, nk, h0, nh, &sl),
                     SDPA_OK);
        if (!sl) {
            map_free(&t);
            continue;
        }
        /* the piece is a valid map for a call of its own size */
        tl_case pc = c;
        pc.Sq = nq, pc.Skv = nk, pc.Hq = t.m.heads == 1 ? c.Hq : nh;
        CHECK(sdpa__check_block_map(sl, pc.B, pc.Hq, nq, nk, 1, 0, INT64_MAX) == SDPA_OK,
              "slice %d: not a valid map: %s", ci, sdpa_last_error());
        CHECK(sl->heads == (t.m.heads == 1 ? 1 : nh) && sl->batch == t.m.batch,
              "slice %d: batch %lld heads %lld", ci, (long long)sl->batch, (long long)sl->heads);
        int64_t wrong = 0;
        for (int64_t b = 0; b < c.B; b++)
            for (int64_t h = 0; h < nh; h++)
                for (int64_t i = 0; i < nq; i++)
                    for (int64_t j = 0; j < nk; j++, checks++)
                        wrong += map_sees(sl, b, h, i, j) != map_sees(&t.m, b, h0 + h, q0 + i, k0 + j);
        CHECK(wrong == 0, "slice %d (rows %lld+%lld of %lld, keys %lld+%lld of %lld, blocks "
              "%dx%d, bits %s): %lld entries differ", ci, (long long)q0, (long long)nq,
              (long long)c.Sq, (long long)k0, (long long)nk, (long long)c.Skv, (int)bq, (int)bk,
              t.m.partial_bits ? "yes" : "no", (long long)wrong);
        if (aligned && !t.m.partial_bits) /* the map's own blocks: nothing gained bits */
            CHECK(sl->partial_bits == NULL, "slice %d: an aligned slice of a map without bits "
                  "has bits", ci);
        sdpa_block_map_free(sl);
        map_free(&t);
    }
    CHECK(checks > 0, "slices: nothing compared");
    /* bad arguments */
    tl_case c = {1, 130, 200, 2, 1, 16, SDPA_F32, SDPA_F32, SDPA_CAUSAL_NONE, TL_BSHD, 1,
                 TL_UNIFORM, 0, 0};
    test_map t;
    map_make(&t, &c, 64, 64, 0, 1, 0.5, 0);
    sdpa_block_map *sl = (sdpa_block_map *)&t;
    CHECK(sdpa_block_map_slice(&t.m, 130, 200, 100, 31, 0, 200, 0, 2, &sl) ==
                  SDPA_INVALID_ARGUMENT && sl == NULL &&
              strstr(sdpa_last_error(), "q_first 100 with q_count 31, expected rows inside 0..129"),
          "slice beyond Sq: %s", sdpa_last_error());
    CHECK(sdpa_block_map_slice(&t.m, 130, 200, 0, 130, 0, 200, 1, 2, &sl) ==
                  SDPA_INVALID_ARGUMENT &&
              strstr(sdpa_last_error(), "head_first 1 with head_count 2"),
          "slice beyond the heads: %s", sdpa_last_error());
    CHECK(sdpa_block_map_slice(&t.m, 193, 200, 0, 130, 0, 200, 0, 2, &sl) ==
                  SDPA_INVALID_ARGUMENT &&
              strstr(sdpa_last_error(), "mask->blocks->q_blocks is 3, expected 4"),
          "slice with the wrong Sq: %s", sdpa_last_error());
    t.fi[0] = 99, t.fc[0] = 1;
    CHECK(sdpa_block_map_slice(&t.m, 130, 200, 0, 64, 0, 200, 0, 1, &sl) ==
                  SDPA_INVALID_ARGUMENT &&
              strstr(sdpa_last_error(), "mask->blocks->full_index[b=0, h=0, qb=0][0] is 99"),
          "slice of a bad row: %s", sdpa_last_error());
    map_free(&t);
}

/* Explain and rules know the kinds. */
static void dispatch(void)
{
    sdpa_call_desc d = {.size = sizeof(sdpa_call_desc), .device = SDPA_DEVICE_CPU,
                        .dtype = SDPA_F32, .B = 1, .Sq = 4096, .Skv = 4096, .Hq = 2, .Hkv = 2,
                        .D = 64, .mask = SDPA_MASK_KIND_BLOCKS};
    char *text;
    CHECK_STATUS(sdpa_explain(ctx, &d, 1, &text), SDPA_OK);
    CHECK(strstr(text, "\"mask\":\"blocks\"") != NULL, "explain JSON names the map: %s", text);
    CHECK(strstr(text, "cpu.portable") == NULL || strstr(text, "blocks mask not supported"),
          "explain says why a backend without maps is passed over: %s", text);
    sdpa_free(text);
    /* the rule for sparse calls, whatever the x86-64 CPU: the tiled kernels
     * first (AArch64 has one rule for every call) */
#if defined(__aarch64__)
    const char *rule = "cpu-aarch64";
#else
    const char *rule = "cpu-sparse";
#endif
    sdpa_decision dec;
    CHECK_STATUS(sdpa_decide(ctx, &d, &dec), SDPA_OK);
    CHECK(strcmp(dec.rule, rule) == 0, "f32 block map: rule %s, expected %s", dec.rule, rule);
    d.mask = SDPA_MASK_KIND_WINDOW | SDPA_MASK_KIND_SEQ_LEN;
    CHECK_STATUS(sdpa_decide(ctx, &d, &dec), SDPA_OK);
    CHECK(strcmp(dec.rule, rule) == 0, "f32 window with lengths: rule %s", dec.rule);
}

/* usage: test_sparse [backend ...]   (default: every present CPU backend but ref) */
int main(int argc, char **argv)
{
    tl_seed_from_env();
    quick = getenv("SDPA_TEST_QUICK") != NULL;
    ctx = tl_context(NULL);
#ifdef SDPA_TEST_AMX_EMULATED
    /* cpu.amx's kernel on emulated tiles, wherever AVX512-BF16 runs; under
     * SDPA_TEST_QUICK (ThreadSanitizer) not where the real tiles run it */
    int real_amx = 0;
    for (int i = 0; i < sdpa_backend_count(ctx); i++) {
        sdpa_backend_info b;
        real_amx |= sdpa_backend_get(ctx, i, &b) == SDPA_OK && b.present &&
                    strcmp(b.name, "cpu.amx") == 0;
    }
    if (!(quick && real_amx) && sdpa__ctx_add_backend(ctx, sdpa__cpu_amx_emulated()) != SDPA_OK) {
        printf("cannot add cpu.amx-emulated: %s\n", sdpa_last_error());
        return 1;
    }
#endif
    for (int i = 1; i < argc && n_backends < (int)(sizeof backends / sizeof *backends); i++)
        snprintf(backends[n_backends++], sizeof backends[0], "%s", argv[i]);
    for (int i = 0; i < sdpa_backend_count(ctx) && argc == 1; i++) {
        sdpa_backend_info b;
        if (sdpa_backend_get(ctx, i, &b) == SDPA_OK && b.present && b.device == SDPA_DEVICE_CPU &&
            strcmp(b.name, "ref") != 0)
            snprintf(backends[n_backends++], sizeof backends[0], "%s", b.name);
    }
    bad_maps();
    slices();
    dispatch();
    windows();
    neighborhoods();
    maps();
    printf("%d backend runs claimed a sparse case\n", n_claimed);
    sdpa_context_destroy(ctx);
    return tl_finish();
}
