/*
 * flash_tiled.h - the tiled flash-attention framework shared by the ISA
 * kernels (cpu.avx512, cpu.avx2). Each ISA file defines a handful of vector
 * macros, its exp and its micro-kernel, then includes flash_run.h (the
 * backend entry: the call's paths, tasks and workspace), which includes
 * this file: the loops, packing, online softmax and the task functions.
 * Adding an ISA means adding a micro-kernel, not a framework (as in BLIS).
 *
 * Layout: queries run along the vector lanes. For one block of BQ queries
 * (QV vectors of VL lanes) and one block of BK keys:
 *
 *     S^T [BK][BQ] = K [BK][D] . Q^T [D][BQ]       (scale folded into Q^T)
 *     P^T = exp(S^T - m), column by column          (m, l per query: vectors)
 *     O^T [D][BQ] += V^T [D][BK] . P^T [BK][BQ]     (V read as V[j][d], or
 *                                                    copied as V^T: TILED_V_T)
 *
 * so the row max, exp and sum of the softmax are plain element-wise vector
 * operations with no horizontal reductions, and both products are one
 * micro-kernel: C[MR][BQ] += A[MR][k] (broadcast) * B[k][BQ] (vectors),
 * with A addressed by (row stride, k stride): K rows for S^T, V columns
 * for O^T. O^T is transposed back once per query block when stored.
 *
 * K and V tiles are converted to f32 once per (task, KV block) and shared
 * by the QB query blocks of the task (for short grouped-query calls, by the
 * query heads of one KV head: flash_tasks.h). Extra memory per thread:
 * QB x (2 D BQ + 2 BQ) + BK (2 D + BQ) floats, about 0.3 MiB at D = 128,
 * in the calling thread's scratch (sdpa__scratch: allocated once, kept).
 *
 * The ISA file defines, before including:
 *   VL, vec, V_LOAD, V_STORE, V_SET1, V_ZERO, V_FMA(a,b,c)=a*b+c, V_MUL,
 *   V_ADD, V_MAX, V_EXP (e^x of a vector, x <= 0), QV (vectors per query
 *   block), MR (micro-kernel rows), KERNEL_NAME, BACKEND_SYMBOL, the
 *   backend's caps and present function.
 *
 * Pair mode (TILED_PAIRS, cpu.avx512bf16): both products use a two-term
 * bf16 dot product per lane (VDPBF16PS), so the reduction index runs in
 * pairs: Q^T is packed as [D/2][BQ] pairs of bf16 (unscaled: the scale
 * is applied to S^T in fp32, so bf16 inputs stay exact), K as bf16 rows
 * whose consecutive elements are the pairs, V as [BK/2][D] pairs of
 * consecutive keys, and P^T, after the fp32 softmax, is rounded to bf16
 * pairs of consecutive keys in place. An odd D or key count is padded
 * with zeros. The ISA file then also defines a_elem/b_elem (uint32_t),
 * avec/bvec, A_BCAST, B_LOAD, V_MAC(acc, a, b) and PACK_PAIRS(dst, lo, hi)
 * (two fp32 vectors of queries to one vector of bf16 pairs), and may
 * define V_EXP_BF16 (e^x to bf16's precision, for P).
 */
#include "../core/convert.h"
#include "flash_tasks.h"
#include "mask_row.h"
#include "../core/backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(TILED_PAIRS) && !defined(V_EXP_BF16)
#define V_EXP_BF16(x) V_EXP(x) /* no cheaper one: P's exponential in fp32 */
#endif

#define BQ (QV * VL)
/* The most terms of one running sum in fp32: O^T's (the micro-kernel sums
 * at most this many keys from zero and adds that to O^T) and l's (exp_rows).
 * A sum's rounding grows with the sum, and O's running sum of every key is
 * far larger than the output it leaves once V's signs cancel: as one
 * running sum, rows of 3,520-8,192 keys were 1.1-1.7e-6 from float64 in
 * relative L2 (uniform inputs), in sums of 128 keys 2.7-3.1e-7; the
 * diffusion rows' max error 2.7-5.5e-6 of max |O|, now 4-7e-7 as PyTorch's
 * (bench/results/2026-12-07-blocked-sums-zen3.txt). The cost: an add per
 * SUM_STEPS products, level in time. */
#define SUM_STEPS 128
/* Query rows per task that share one copy of each f32 K/V block (the ISA
 * file may set its own: flash_run.h's tiled_run) */
#ifndef TILED_F32_ROWS
#define TILED_F32_ROWS 192
#endif
/* Keys per K/V block. Pair mode's micro-kernel runs half as many
 * reduction steps per key, so its blocks are twice as long to keep the
 * accumulator loads and stores of O^T as rare (flux1-joint bf16: 77% ->
 * 80% of the VDPBF16PS ceiling; f32 showed no difference). */
#ifdef TILED_PAIRS
#define BK 256
#else
#define BK 128
#endif

#ifndef TILED_PAIRS /* fp32 products: one A element, one B element per step */
typedef float a_elem;
typedef float b_elem;
typedef vec avec;
typedef vec bvec;
#define A_BCAST(x) V_SET1(x)
#define B_LOAD(p) V_LOAD(p)
#define V_MAC(acc, a, b) V_FMA((a), (b), (acc))
#endif

typedef struct qblock {
    float *qt;    /* [D][BQ]  Q^T, scaled   */
    float *ot;    /* [D][BQ]  O^T accumulator */
    float *m, *l; /* [BQ]                   */
} qblock;

typedef struct workspace {
    qblock *qb;   /* [qb_per_task] */
    float *st;    /* [BK][BQ] S^T, then P^T */
    float *k, *v; /* [BK][D]  */
    float *row;   /* [D] scratch */
    float *tr;    /* [VL][d_padded(D)] rows on their way to or from a transpose */
    int64_t *keys; /* [Skv] visible keys under a key mask, else NULL */
} workspace;

typedef struct job {
    const sdpa_call *c;
    flash_split split;
    workspace *ws;
} job;

/*
 * C[mr][BQ] (+)= sum_k A[i*rs + k*cs] * B[k][0..BQ), on the first qv of
 * the QV query vectors (a block's last rows may fill fewer: the lanes past
 * them are neither computed nor read); mx, if not NULL, takes the max of
 * C's rows per vector (the softmax's row max without a pass over S^T). Inlined with constant mr and qv so
 * the accumulators stay in registers. In pair mode each A and B element is
 * a pair of bf16 and the step is a two-term dot product.
 */
static inline __attribute__((always_inline)) void ukr(const int mr, const int qv, int K,
                                                      const a_elem *a, ptrdiff_t rs, ptrdiff_t cs,
                                                      const b_elem *b, float *c, int accumulate,
                                                      vec *mx)
{
    vec acc[MR][QV];
    for (int i = 0; i < mr; i++)
        for (int v = 0; v < qv; v++)
            acc[i][v] = V_ZERO(); /* a sum from zero, added to C once (SUM_STEPS) */
    for (int k = 0; k < K; k++) {
        bvec bv[QV];
        for (int v = 0; v < qv; v++)
            bv[v] = B_LOAD(b + (ptrdiff_t)k * BQ + v * VL);
        for (int i = 0; i < mr; i++) {
            const avec ai = A_BCAST(a[i * rs + k * cs]);
            for (int v = 0; v < qv; v++)
                acc[i][v] = V_MAC(acc[i][v], ai, bv[v]);
        }
    }
    for (int i = 0; i < mr; i++)
        for (int v = 0; v < qv; v++)
            V_STORE(c + i * BQ + v * VL,
                    accumulate ? V_ADD(V_LOAD(c + i * BQ + v * VL), acc[i][v]) : acc[i][v]);
    if (mx) /* the scores' column max, while they are in registers */
        for (int v = 0; v < qv; v++)
            for (int i = 0; i < mr; i++)
                mx[v] = V_MAX(mx[v], acc[i][v]);
}

/* Row blocks of MR with one dispatch for the tail, so every call site sees
 * a constant mr (and qv). */
static inline __attribute__((always_inline)) void gemm_rows_qv(const int qv, int rows, int K,
                                                               const a_elem *a, ptrdiff_t rs,
                                                               ptrdiff_t cs, const b_elem *b,
                                                               float *c, int accumulate, vec *mx)
{
    int i = 0;
    for (; i + MR <= rows; i += MR)
        ukr(MR, qv, K, a + i * rs, rs, cs, b, c + (ptrdiff_t)i * BQ, accumulate, mx);
    const int t = rows - i;
    a += i * rs, c += (ptrdiff_t)i * BQ;
    switch (t) {
#if MR > 7
    case 7: ukr(7, qv, K, a, rs, cs, b, c, accumulate, mx); break;
    case 6: ukr(6, qv, K, a, rs, cs, b, c, accumulate, mx); break;
    case 5: ukr(5, qv, K, a, rs, cs, b, c, accumulate, mx); break;
    case 4: ukr(4, qv, K, a, rs, cs, b, c, accumulate, mx); break;
#endif
    case 3: ukr(3, qv, K, a, rs, cs, b, c, accumulate, mx); break;
    case 2: ukr(2, qv, K, a, rs, cs, b, c, accumulate, mx); break;
    case 1: ukr(1, qv, K, a, rs, cs, b, c, accumulate, mx); break;
    default: break;
    }
}

#if QV != 3
#error "gemm_rows dispatches qv = 1..3"
#endif
static void gemm_rows(int qv, int rows, int K, const a_elem *a, ptrdiff_t rs, ptrdiff_t cs,
                      const b_elem *b, float *c, int accumulate, vec *mx)
{
    if (qv == 1)
        gemm_rows_qv(1, rows, K, a, rs, cs, b, c, accumulate, mx);
    else if (qv == 2)
        gemm_rows_qv(2, rows, K, a, rs, cs, b, c, accumulate, mx);
    else
        gemm_rows_qv(QV, rows, K, a, rs, cs, b, c, accumulate, mx);
}

/* dst[c * ldd + r] = src[r * lds + c] for a VL x VL block of 32-bit words. */
static inline void transpose_block(float *dst, ptrdiff_t ldd, const float *src, ptrdiff_t lds)
{
    vec r[VL];
    for (int i = 0; i < VL; i++)
        r[i] = V_LOAD(src + i * lds);
    V_TRANSPOSE_REGS(r);
    for (int j = 0; j < VL; j++)
        V_STORE(dst + j * ldd, r[j]);
}

/* The same for a destination that may have fewer than VL rows (nc: the
 * last head-dim rows of Q^T when D is not a multiple of VL). */
static inline void transpose_to(float *dst, ptrdiff_t ldd, const float *src, ptrdiff_t lds,
                                int64_t nc)
{
    if (nc >= VL) {
        transpose_block(dst, ldd, src, lds);
        return;
    }
    float t[VL * VL];
    transpose_block(t, VL, src, lds);
    for (int c = 0; c < nc; c++)
        V_STORE(dst + c * ldd, V_LOAD(t + c * VL));
}

/* Words per row of a transposed tile: D floats, or (D + 1) / 2 bf16 pairs,
 * and that rounded up to whole VL x VL blocks (tr's row length). */
static inline int64_t tile_words(int64_t D)
{
#ifdef TILED_PAIRS
    return (D + 1) / 2;
#else
    return D;
#endif
}
static inline int64_t tile_words_padded(int64_t D) { return (tile_words(D) + VL - 1) / VL * VL; }
/* D rounded up to whole VL x VL blocks: the row length of w->tr. */
static inline int64_t d_padded(int64_t D) { return (D + VL - 1) / VL * VL; }

#ifndef TILED_PAIRS
/* n <= VL f32 rows of D floats (unit stride) times scale as columns:
 * dst[d * ld + r] for d < D, r < VL (zeros past n), VL x VL in registers,
 * a row's last part masked. Q^T's rows (load_q) and V^T's (load_vt). */
static inline void rows_to_columns(const float *const *src, int n, int64_t D, float scale,
                                   float *dst, ptrdiff_t ld)
{
    const vec s = V_SET1(scale);
    for (int64_t d0 = 0; d0 < D; d0 += VL) {
        const int nd = D - d0 < VL ? (int)(D - d0) : VL; /* a last part of the row */
        vec x[VL];
        for (int r = 0; r < VL; r++)
            x[r] = r >= n      ? V_ZERO()
                   : nd == VL ? V_MUL(V_LOAD(src[r] + d0), s)
                              : V_MUL(V_LOAD_PART(src[r] + d0, nd), s);
        V_TRANSPOSE_REGS(x);
        for (int j = 0; j < nd; j++)
            V_STORE(dst + (d0 + j) * ld, x[j]);
    }
}
#endif

/*
 * Rows i0 .. i0 + rows of the task's row space (flash_row) into Q^T: VL
 * rows at a time are converted into w->tr (one row of tile_words_padded
 * words each, zero padded), then moved VL x VL block by block
 * (V_TRANSPOSE_REGS). Lanes past `rows` in its last vector are zeros;
 * vectors past it are left as they were: the micro-kernel's qv skips them.
 * f32 rows with a unit-stride D skip w->tr: loaded (the last part of a row
 * masked), scaled and transposed in registers.
 */
static void load_q(const sdpa_call *c, const workspace *w, const qblock *qb,
                   const flash_task *tk, int64_t i0, int rows)
{
    const sdpa_tensor *q = c->q;
    const int64_t D = c->desc.D, words = tile_words(D), ld = tile_words_padded(D);
#ifndef TILED_PAIRS
    const int direct = q->dtype == SDPA_F32 && q->stride[3] == 1;
#endif
    for (int r0 = 0; r0 < rows; r0 += VL) { /* vectors past the rows are never read (qv) */
#ifndef TILED_PAIRS
        if (direct) {
            const float *src[VL];
            const int n = rows - r0 < VL ? rows - r0 : VL;
            for (int r = 0; r < n; r++) {
                int64_t h, qi;
                flash_row(tk, i0 + r0 + r, &h, &qi);
                src[r] = (const float *)q->data + sdpa__offset(q, tk->b, qi, h, 0);
            }
            rows_to_columns(src, n, D, (float)c->scale, qb->qt + r0, BQ);
            continue;
        }
#endif
        for (int r = 0; r < VL; r++) {
            float *dst = w->tr + r * ld;
            if (r0 + r >= rows) {
                memset(dst, 0, sizeof(float) * (size_t)ld);
                continue;
            }
            int64_t h, qi;
            flash_row(tk, i0 + r0 + r, &h, &qi);
            const void *src = sdpa__elem(q, sdpa__offset(q, tk->b, qi, h, 0));
#ifdef TILED_PAIRS
            uint16_t *row = (uint16_t *)dst;
            sdpa__load_row_bf16(src, q->dtype, q->stride[3], D, row);
            memset(row + D, 0, sizeof *row * (size_t)(2 * ld - D)); /* pads: odd D, last block */
#else
            sdpa__load_row(src, q->dtype, q->stride[3], D, (float)c->scale, dst);
            memset(dst + D, 0, sizeof *dst * (size_t)(ld - D));
#endif
        }
        for (int64_t i = 0; i < words; i += VL)
            transpose_to(qb->qt + i * BQ + r0, BQ, w->tr + i, ld, words - i);
    }
    for (int r = 0; r < BQ; r++)
        qb->m[r] = -INFINITY, qb->l[r] = 0.0f;
}

#ifdef TILED_PAIRS
/* K rows j0.. as bf16 rows of Dp = D rounded up to even (zero pad); V as
 * [BK/2][D] pairs of consecutive keys (key bk of an odd bk is zero). */
static void load_kv_pairs(const sdpa_call *c, const workspace *w, const flash_task *tk,
                          const int64_t *idx, int64_t p0, int bk)
{
    const sdpa_tensor *k = c->k, *v = c->v;
    const int64_t D = c->desc.D, Dp = (D + 1) / 2 * 2;
    uint16_t *kb = (uint16_t *)w->k, *lo = (uint16_t *)w->row, *hi = lo + D;
    uint32_t *vp = (uint32_t *)w->v;
    for (int j = 0; j < bk; j++) {
        if (Dp > D)
            kb[(ptrdiff_t)j * Dp + D] = 0; /* the pad of an odd D */
        sdpa__load_row_bf16(sdpa__elem(k, sdpa__offset(k, tk->b, flash_key(idx, p0 + j), tk->hk, 0)),
                            k->dtype, k->stride[3], D, kb + (ptrdiff_t)j * Dp);
    }
    for (int j = 0; j < bk; j += 2) {
        sdpa__load_row_bf16(sdpa__elem(v, sdpa__offset(v, tk->b, flash_key(idx, p0 + j), tk->hk, 0)),
                            v->dtype, v->stride[3], D, lo);
        if (j + 1 < bk)
            sdpa__load_row_bf16(
                sdpa__elem(v, sdpa__offset(v, tk->b, flash_key(idx, p0 + j + 1), tk->hk, 0)),
                v->dtype, v->stride[3], D, hi);
        else
            memset(hi, 0, sizeof *hi * (size_t)D);
        uint32_t *dst = vp + (ptrdiff_t)(j / 2) * D;
        for (int64_t d = 0; d < D; d++)
            dst[d] = (uint32_t)lo[d] | (uint32_t)hi[d] << 16;
    }
}

/* S^T *= scale (pair mode keeps Q unscaled). */
static void scale_tile(float *st, int bk, float scale)
{
    const vec s = V_SET1(scale);
    for (int i = 0; i < bk * BQ; i += VL)
        V_STORE(st + i, V_MUL(V_LOAD(st + i), s));
}

#endif

/* Masks S^T entries (key kj = flash_key(idx, p0 + j), query i0 + r) with
 * kj > i0 + r + offset. */
static void mask_tile(float *st, int bk, const int64_t *idx, int64_t p0, int64_t i0,
                      int64_t offset)
{
    for (int j = 0; j < bk; j++) {
        /* queries r with i0 + r + offset < kj are masked: r < first */
        int64_t first = flash_key(idx, p0 + j) - offset - i0;
        int n = first <= 0 ? 0 : (first > BQ ? BQ : (int)first);
        for (int r = 0; r < n; r++)
            st[(ptrdiff_t)j * BQ + r] = -INFINITY;
    }
}

/*
 * The general mask of sdpa.h on an S^T tile (key flash_key(idx, p0 + j),
 * query i0 + r), read entry by entry for the rows that are not padding.
 * Only calls with a general mask come here: sequence lengths bound the
 * task (flash_task_make), a key mask is gathered (flash_task_keys) and
 * padding rows are stored as zeros (store_out).
 */
static void mask_tile_general(float *st, int bk, const int64_t *idx, int64_t p0, int64_t i0,
                              int rows, const sdpa_mask *mk, int64_t b, int64_t h)
{
    for (int j = 0; j < bk; j++) {
        float *col = st + (ptrdiff_t)j * BQ;
        const int64_t kj = flash_key(idx, p0 + j);
        for (int r = 0; r < rows; r++)
            col[r] = sdpa__mask_general(mk, sdpa__mask_at(mk, b, h, i0 + r, kj), col[r]);
    }
}

/*
 * P^T = exp(scale s + neg) down the v-th vector of every key row, in place;
 * returns the sum. In pair mode the probabilities are stored as bf16 pairs
 * of consecutive keys, what values() multiplies, in the same pass: pair
 * row i lands on fp32 row i, which was read before (i > 0) or just now
 * (i = 0); an odd last key pairs with zero. Their exponential is the ISA
 * file's V_EXP_BF16, e^x to bf16's precision (P is rounded to it), where
 * it has one: on cpu.avx512bf16 6 operations instead of V_EXP's 11.
 */
static inline vec exp_rows(float *st, int bk, int v, vec sc, vec neg, int exact)
{
    vec sum = V_ZERO();
#ifdef TILED_PAIRS
    /* exact: scale s rounded before the max is subtracted (V_MUL_ROUNDED,
     * which the compiler does not fuse), for a max so large that an FMA's
     * unrounded product would leave a residue of 2^-24 |m| (softmax_tile) */
#define SCALED_SHIFTED(x) (exact ? V_ADD(V_MUL_ROUNDED((x), sc), neg) : V_FMA((x), sc, neg))
    uint32_t *pt = (uint32_t *)st;
    for (int j0 = 0; j0 < bk; j0 += 2 * SUM_STEPS) { /* SUM_STEPS pairs per partial sum */
        const int j1 = bk - j0 < 2 * SUM_STEPS ? bk : j0 + 2 * SUM_STEPS;
        vec part = V_ZERO();
        for (int j = j0; j < j1; j += 2) {
            const vec lo = V_EXP_BF16(SCALED_SHIFTED(V_LOAD(st + (ptrdiff_t)j * BQ + v * VL)));
            const vec hi = j + 1 < bk ? V_EXP_BF16(SCALED_SHIFTED(
                                            V_LOAD(st + (ptrdiff_t)(j + 1) * BQ + v * VL)))
                                      : V_ZERO();
            part = V_ADD(part, V_ADD(lo, hi));
            PACK_PAIRS(pt + (ptrdiff_t)(j / 2) * BQ + v * VL, lo, hi);
        }
        sum = V_ADD(sum, part);
    }
#undef SCALED_SHIFTED
#else
    /* fp32 products: s is already scaled (sc is 1), so the max goes with an
     * add rather than a multiply-add by 1: the same bits, one operation
     * off the FMA pipes per 8 scores (D 64 rows 0.96-1.00x the time, Zen
     * 3, bench/results/2026-12-07-exp-add-ab-zen3.txt) */
    (void)exact;
    (void)sc;
    for (int j0 = 0; j0 < bk; j0 += SUM_STEPS) {
        const int j1 = bk - j0 < SUM_STEPS ? bk : j0 + SUM_STEPS;
        vec part = V_ZERO();
        for (int j = j0; j < j1; j++) {
            float *p = st + (ptrdiff_t)j * BQ + v * VL;
            const vec e = V_EXP(V_ADD(V_LOAD(p), neg));
            V_STORE(p, e);
            part = V_ADD(part, e);
        }
        sum = V_ADD(sum, part);
    }
#endif
    return sum;
}

/* A running max beyond which the exponent's FMA residue (2^-24 |m|) could
 * reach 2^-4: exp_rows then rounds the scaled scores first. Only scales
 * around 1e30 or scores around 1e7 get there. */
#define HUGE_MAX 0x1p20f

/*
 * Online softmax over a tile of scores s (P^T = exp(scale s - m) in
 * place): updates m and l and rescales O^T, unless no query's max moved
 * (most tiles after the first few: alpha is 1). mx: the tile's max per
 * query from the scores' micro-kernel (unscaled like s), or NULL to find
 * it here (a masked tile: its max is of the masked scores).
 */
/* The max of the v-th query vector's scores over the bk keys: from the
 * micro-kernel (mx_in), or read from the tile (a masked one). */
static inline vec tile_max(const float *st, int bk, int v, const vec *mx_in)
{
    if (mx_in)
        return mx_in[v];
    vec m = V_SET1(-INFINITY);
    for (int j = 0; j < bk; j++)
        m = V_MAX(m, V_LOAD(st + (ptrdiff_t)j * BQ + v * VL));
    return m;
}

static void softmax_tile(float *st, int bk, const qblock *qb, int64_t D, int qv, const vec *mx_in,
                         float scale)
{
    const vec sc = V_SET1(scale);
    for (int v = 0; v < qv; v++) {
        const vec tmax = tile_max(st, bk, v, mx_in);
        const vec old = V_LOAD(qb->m + v * VL);
        const vec mx = V_MAX(old, V_MUL(tmax, sc)); /* old second: NaN scores stay */
        /* A query that has seen no key yet keeps m = -inf; subtracting 0
         * instead keeps exp(-inf) = 0 rather than NaN. */
        float mb[VL], ob[VL];
        V_STORE(mb, mx);
        V_STORE(ob, old);
        int moved = 0, huge = 0;
        for (int i = 0; i < VL; i++) {
            moved |= !(mb[i] == ob[i]);
            mb[i] = mb[i] == -INFINITY ? 0.0f : -mb[i];
            huge |= fabsf(mb[i]) >= HUGE_MAX;
        }
        const vec neg = V_LOAD(mb);
        const vec sum = exp_rows(st, bk, v, sc, neg, huge);
        if (!moved) {
            V_STORE(qb->l + v * VL, V_ADD(V_LOAD(qb->l + v * VL), sum));
            continue;
        }
        const vec alpha = V_EXP(V_ADD(old, neg));
        V_STORE(qb->l + v * VL, V_FMA(V_LOAD(qb->l + v * VL), alpha, sum));
        V_STORE(qb->m + v * VL, mx);
        for (int64_t d = 0; d < D; d++) {
            float *o = qb->ot + d * BQ + v * VL;
            V_STORE(o, V_MUL(V_LOAD(o), alpha));
        }
    }
}

/* Transposes nr <= VL rows of VL words (the rest zeros) to dst, which has
 * VL full rows: O^T's last head-dim rows when D is not a multiple of VL. */
static inline void transpose_from(float *dst, ptrdiff_t ldd, const float *src, ptrdiff_t lds,
                                  int64_t nr)
{
    if (nr >= VL) {
        transpose_block(dst, ldd, src, lds);
        return;
    }
    float t[VL * VL];
    for (int r = 0; r < VL; r++)
        V_STORE(t + r * VL, r < nr ? V_LOAD(src + r * lds) : V_ZERO());
    transpose_block(dst, ldd, t, VL);
}

/* O^T back to rows, VL queries at a time through w->tr (rows of
 * d_padded(D) floats). Queries at or past len_q are padding (sdpa.h):
 * zeros and LSE -inf, l = 0. */
static void store_out(const sdpa_call *c, const workspace *w, const qblock *qb,
                      const flash_task *tk, int64_t i0, int rows)
{
    const int64_t D = c->desc.D, ld = d_padded(D);
    const sdpa_tensor *out = c->out;
    if (out->dtype == SDPA_F32 && out->stride[3] == 1) {
        /* f32 rows: transposed in registers, scaled and stored to the output
         * directly (the last part of a row masked) */
        for (int r0 = 0; r0 < rows; r0 += VL) {
            const int n = rows - r0 < VL ? rows - r0 : VL;
            float *dst[VL], mul[VL];
            for (int r = 0; r < n; r++) {
                int64_t h, i;
                flash_row(tk, i0 + r0 + r, &h, &i);
                const float l = i < tk->len_q ? qb->l[r0 + r] : 0.0f;
                dst[r] = (float *)out->data + sdpa__offset(out, tk->b, i, h, 0);
                mul[r] = sdpa__result_mul(l, 0);
                sdpa__store_lse(c, tk->b, i, h, qb->m[r0 + r], l);
            }
            for (int64_t d0 = 0; d0 < D; d0 += VL) {
                const int nd = D - d0 < VL ? (int)(D - d0) : VL; /* O^T has D rows */
                vec x[VL];
                for (int j = 0; j < VL; j++)
                    x[j] = j < nd ? V_LOAD(qb->ot + (d0 + j) * BQ + r0) : V_ZERO();
                V_TRANSPOSE_REGS(x);
                for (int r = 0; r < n; r++) { /* mul 0: zeros, whatever O^T holds */
                    const vec y = mul[r] == 0.0f ? V_ZERO() : V_MUL(x[r], V_SET1(mul[r]));
                    if (nd == VL)
                        V_STORE(dst[r] + d0, y);
                    else
                        V_STORE_PART(dst[r] + d0, y, nd);
                }
            }
        }
        return;
    }
    for (int r0 = 0; r0 < rows; r0 += VL) {
        for (int64_t d0 = 0; d0 < D; d0 += VL)
            transpose_from(w->tr + d0, ld, qb->ot + d0 * BQ + r0, BQ, D - d0);
        const int n = rows - r0 < VL ? rows - r0 : VL;
        for (int r = 0; r < n; r++) {
            int64_t h, i;
            flash_row(tk, i0 + r0 + r, &h, &i);
            sdpa__store_result(c, tk->b, i, h, w->tr + r * ld, qb->m[r0 + r],
                               i < tk->len_q ? qb->l[r0 + r] : 0.0f, 0);
        }
    }
}

#ifdef TILED_V_T
/*
 * V^T [D][ldv] of keys p0 .. p0 + bk (ldv: bk rounded up to whole vectors,
 * the pads zero), VL keys at a time by register transposes: straight from
 * f32 rows of unit stride, else through w->tr. P V then reads V^T's MR
 * rows one after the other instead of one 16-byte piece of each of bk
 * rows 4 D bytes apart. Its cost: the copy's transposes, a small share of
 * the products that reuse it (every query block of the task).
 */
static void load_vt(const sdpa_call *c, const workspace *w, const flash_task *tk,
                    const int64_t *keys, int64_t p0, int bk, int64_t ldv)
{
    const sdpa_tensor *v = c->v;
    const int64_t D = c->desc.D, ldp = d_padded(D);
    const int direct = v->dtype == SDPA_F32 && v->stride[3] == 1;
    for (int j0 = 0; j0 < bk; j0 += VL) {
        const int n = bk - j0 < VL ? bk - j0 : VL;
        if (direct) {
            const float *src[VL];
            for (int r = 0; r < n; r++)
                src[r] = (const float *)v->data +
                         sdpa__offset(v, tk->b, flash_key(keys, p0 + j0 + r), tk->hk, 0);
            rows_to_columns(src, n, D, 1.0f, w->v + j0, ldv); /* x 1: exact */
            continue;
        }
        for (int r = 0; r < VL; r++) {
            float *dst = w->tr + r * ldp;
            if (r >= n) {
                memset(dst, 0, sizeof *dst * (size_t)ldp);
                continue;
            }
            const int64_t kj = flash_key(keys, p0 + j0 + r);
            sdpa__load_row(sdpa__elem(v, sdpa__offset(v, tk->b, kj, tk->hk, 0)), v->dtype,
                           v->stride[3], D, 1.0f, dst);
            memset(dst + D, 0, sizeof *dst * (size_t)(ldp - D));
        }
        for (int64_t d0 = 0; d0 < D; d0 += VL)
            transpose_to(w->v + d0 * ldv + j0, ldv, w->tr + d0, ldp, D - d0);
    }
}
#endif

/* Where the products read a K/V block: key row j at k + j * k_ld, the
 * value of key j and head dim d at v + d * v_rs + j * v_cs (rows: v_rs 1,
 * v_cs the row stride; V^T, TILED_V_T: v_rs its row length, v_cs 1; pair
 * mode: w->k, w->v as packed). */
typedef struct kv_tile {
    const a_elem *k, *v;
    ptrdiff_t k_ld, v_rs, v_cs;
} kv_tile;

/*
 * K and V rows of keys p0 .. p0 + bk (flash_key) into w->k, w->v, or, when
 * in_place and the keys are consecutive f32 rows of one head close
 * together (a row stride of at most 4 D: one KV head, or [B, H, S, D]
 * storage), left where they are: the products then read the tensors. The
 * sparse path asks for it (its blocks serve as few as 128 rows: the copy
 * was 10-15% of a 3-D neighbourhood call); the dense path does not: read
 * in place with 24 heads interleaved ([B, S, H, D], rows 12 KiB apart) a
 * 2048-token call ran at 0.83x, with 4 heads at 0.93x (D 128, Sapphire
 * Rapids; only D 64 gained, 1.04x).
 */
static kv_tile load_kv(const sdpa_call *c, const workspace *w, const flash_task *tk,
                       const int64_t *keys, int64_t p0, int bk, int in_place)
{
#ifdef TILED_PAIRS
    (void)in_place;
    load_kv_pairs(c, w, tk, keys, p0, bk);
    const kv_tile t = {(const a_elem *)w->k, (const a_elem *)w->v, (c->desc.D + 1) / 2, 1,
                       c->desc.D};
    return t;
#else
    const sdpa_tensor *k = c->k, *v = c->v;
    const int64_t D = c->desc.D;
    if (in_place && !keys && k->dtype == SDPA_F32 && k->stride[3] == 1 && v->stride[3] == 1 &&
        k->stride[1] <= 4 * D && v->stride[1] <= 4 * D) {
        const kv_tile t = {(const float *)k->data + sdpa__offset(k, tk->b, p0, tk->hk, 0),
                           (const float *)v->data + sdpa__offset(v, tk->b, p0, tk->hk, 0),
                           k->stride[1], 1, v->stride[1]};
        return t;
    }
#ifdef TILED_KV_AHEAD
    /* Each row's source asked for TILED_KV_AHEAD rows before it is copied,
     * so that several rows' misses are in flight: the copy otherwise waits
     * on each row's first line in turn (one head's rows are Hkv D elements
     * apart, a page or more with many heads; the copy was 11-17% of a long
     * f32 row's profile on cpu.avx2, Zen 3). The prefetch a block ahead
     * (flash_prefetch_kv) does not do it there: a copy of 128 rows asked
     * for 70 us before took 7-13 us, one from L2 3 us, one from DRAM
     * 17-24 us (the rows of 24 heads of 128, Zen 3; a throwaway probe, not
     * in the tree: bench/results/2026-12-07-avx2-kv-copy-ab-zen3.txt is the
     * measured effect). */
    const int ahead = k->stride[3] == 1 && v->stride[3] == 1;
    const int64_t kb_bytes = D * sdpa__elem_bytes(k->dtype), vb_bytes = D * sdpa__elem_bytes(v->dtype);
#endif
    for (int j = 0; j < bk; j++) {
        const int64_t kj = flash_key(keys, p0 + j);
#ifdef TILED_KV_AHEAD
        if (ahead && j + TILED_KV_AHEAD < bk) {
            const int64_t kn = flash_key(keys, p0 + j + TILED_KV_AHEAD);
            const char *kr = (const char *)sdpa__elem(k, sdpa__offset(k, tk->b, kn, tk->hk, 0));
            const char *vr = (const char *)sdpa__elem(v, sdpa__offset(v, tk->b, kn, tk->hk, 0));
            for (int64_t o = 0; o < kb_bytes; o += 64)
                __builtin_prefetch(kr + o, 0, 3);
            for (int64_t o = 0; o < vb_bytes; o += 64)
                __builtin_prefetch(vr + o, 0, 3);
        }
#endif
        sdpa__load_row(sdpa__elem(k, sdpa__offset(k, tk->b, kj, tk->hk, 0)), k->dtype,
                       k->stride[3], D, 1.0f, w->k + (ptrdiff_t)j * D);
#ifndef TILED_V_T
        sdpa__load_row(sdpa__elem(v, sdpa__offset(v, tk->b, kj, tk->hk, 0)), v->dtype,
                       v->stride[3], D, 1.0f, w->v + (ptrdiff_t)j * D);
#endif
    }
#ifdef TILED_V_T
    const int64_t ldv = (bk + VL - 1) / VL * VL;
    load_vt(c, w, tk, keys, p0, bk, ldv);
    const kv_tile t = {w->k, w->v, D, ldv, 1};
#else
    const kv_tile t = {w->k, w->v, D, 1, D};
#endif
    return t;
#endif
}

/*
 * S^T [bk][BQ] = K . Q^T over the packed keys, and in mx (if not NULL)
 * their max per query. f32 products give scaled scores (the scale is in
 * Q^T); pair mode gives them unscaled, the softmax applies score_scale()
 * (one multiply-add with the max it subtracts), except under a general
 * mask, which is defined on scaled scores, or a scale <= 0, which would
 * turn the max into a min: those are scaled here (and mx is not found).
 */
static int scale_deferred(const sdpa_call *c)
{
#ifdef TILED_PAIRS
    /* a max of unscaled scores is the max of scaled ones only for scale > 0 */
    return !(c->mask && c->mask->general) && c->scale > 0;
#else
    (void)c;
    return 0;
#endif
}

static float score_scale(const sdpa_call *c) { return scale_deferred(c) ? (float)c->scale : 1.0f; }

/* Whether the scores' micro-kernel may find a tile's max (an unmasked
 * tile, scores not scaled after it). */
static int max_fused(const sdpa_call *c, int masked)
{
#ifdef TILED_PAIRS
    return !masked && scale_deferred(c);
#else
    (void)c;
    return !masked;
#endif
}

static void scores(const sdpa_call *c, const workspace *w, const kv_tile *t, const qblock *qb,
                   int bk, int qv, vec *mx)
{
    const int64_t D = c->desc.D;
#ifdef TILED_PAIRS
    gemm_rows(qv, bk, (int)(D + 1) / 2, t->k, t->k_ld, 1, (const b_elem *)qb->qt, w->st, 0, mx);
    if (!scale_deferred(c))
        scale_tile(w->st, bk, (float)c->scale);
#else
    gemm_rows(qv, bk, (int)D, t->k, t->k_ld, 1, qb->qt, w->st, 0, mx);
#endif
}

/* scores() with the tile's max per query found by the micro-kernel when
 * the tile is unmasked: returns mx holding it, or NULL (the softmax then
 * reads the masked tile). */
static inline vec *scores_max(const sdpa_call *c, const workspace *w, const kv_tile *t,
                              const qblock *qb, int bk, int qv, int masked, vec *mx)
{
    for (int v = 0; v < QV; v++)
        mx[v] = V_SET1(-INFINITY);
    vec *mxp = max_fused(c, masked) ? mx : NULL;
    scores(c, w, t, qb, bk, qv, mxp);
    return mxp;
}

/* O^T (+)= V^T . P^T over the packed keys (P^T in w->st: fp32, or in
 * pair mode bf16 pairs, exp_rows). */
static void values(const sdpa_call *c, const workspace *w, const kv_tile *t, const qblock *qb,
                   int bk, int qv, int accumulate)
{
    const int64_t D = c->desc.D;
#ifdef TILED_PAIRS
    const int steps = (bk + 1) / 2; /* pairs of keys */
#else
    const int steps = bk;
#endif
    for (int s0 = 0; s0 < steps; s0 += SUM_STEPS) { /* the short path's 129-512 keys: in parts */
        const int n = steps - s0 < SUM_STEPS ? steps - s0 : SUM_STEPS;
        gemm_rows(qv, (int)D, n, t->v + s0 * t->v_cs, t->v_rs, t->v_cs,
                  (const b_elem *)w->st + (ptrdiff_t)s0 * BQ, qb->ot, accumulate || s0 > 0, NULL);
    }
}

/* Whether the S^T tile of keys p0 .. p0 + bk for the query block at i0
 * has masked entries (causal across it, or a general mask). */
static int tile_masked(const sdpa_call *c, const flash_task *tk, const int64_t *keys, int64_t p0,
                       int bk, int64_t i0)
{
    return (tk->causal && flash_key(keys, p0 + bk - 1) > i0 + tk->offset) ||
           (c->mask && c->mask->general);
}

/* Causal and general masks on the S^T tile of keys p0 .. p0 + bk. */
static void mask_scores(const sdpa_call *c, const workspace *w, const flash_task *tk,
                        const int64_t *keys, int64_t p0, int bk, int64_t i0)
{
    const sdpa_mask *mk = c->mask;
    if (tk->causal && flash_key(keys, p0 + bk - 1) > i0 + tk->offset)
        mask_tile(w->st, bk, keys, p0, i0, tk->offset);
    if (mk && mk->general)
        mask_tile_general(w->st, bk, keys, p0, i0, flash_block_rows(c->desc.Sq, i0, BQ), mk,
                          tk->b, tk->h); /* never grouped: flash_groups_heads */
}

/*
 * Long key ranges: the task's query blocks stay resident (Q^T, O^T, m, l)
 * while K/V blocks of BK keys stream past once, online softmax.
 */
static void task_fn(void *arg, int64_t task, int worker)
{
    const job *jb = arg;
    const sdpa_call *c = jb->c;
    const workspace *w = &jb->ws[worker];
    const flash_task tk = flash_task_make(c, &jb->split, BQ, task);
    const int64_t D = c->desc.D;
    /* Masks (sdpa.h): flash_task_make bounded the keys by the real
     * lengths, a key mask leaves only the visible keys to pack (keys[p] is
     * the p-th), a general mask is read per tile. */
    const int64_t nk = flash_task_keys(c, &tk, w->keys);
    const int64_t *keys = c->mask && c->mask->key ? w->keys : NULL;
    /* K/V rows are asked for one block ahead (into L2): the first block
     * while Q is loaded, the next one a share per query block while this
     * one is used. One head's rows are Hkv D elements apart in [B, S, H, D]
     * (12 KiB with 24 heads of 128), beyond what the hardware prefetchers
     * follow, so the packing copy waited on each row (memmove was 13-18%
     * of a long f32 row's profile). Asked for ahead, long f32 rows took
     * 0.90-0.98x the time on cpu.avx512 and cpu.avx2, bf16 ones
     * 0.93-1.03x (Zen 4, bench/results/2026-12-05-kv-prefetch-ab-zen4.txt). */
    flash_prefetch_kv(c, &tk, keys, 0, nk < BK ? (int)nk : BK, D, 0, 1);
    for (int q = 0; q < tk.nqb; q++) {
        const int64_t i0 = tk.i_first + (int64_t)q * BQ;
        load_q(c, w, &w->qb[q], &tk, i0, flash_block_rows(jb->split.rows, i0, BQ));
        memset(w->qb[q].ot, 0, sizeof(float) * (size_t)D * BQ);
    }
    for (int64_t p0 = 0; p0 < nk; p0 += BK) {
        const int bk = (int)(nk - p0 < BK ? nk - p0 : BK);
        const int64_t k_first = flash_key(keys, p0);
        const kv_tile kt = load_kv(c, w, &tk, keys, p0, bk, 0);
        const int nbk = (int)(nk - p0 - BK < BK ? nk - p0 - BK : BK); /* the next block */
        for (int q = 0; q < tk.nqb; q++) {
            const qblock *qb = &w->qb[q];
            const int64_t i0 = tk.i_first + (int64_t)q * BQ;
            if (nbk > 0) {
                flash_prefetch_kv(c, &tk, keys, p0 + BK, nbk, D, q, tk.nqb);
            }
            if (tk.causal && k_first > i0 + BQ - 1 + tk.offset)
                continue; /* this query block sees none of these keys */
            const int qv = (flash_block_rows(jb->split.rows, i0, BQ) + VL - 1) / VL;
            const int masked = tile_masked(c, &tk, keys, p0, bk, i0);
            vec mx[QV];
            vec *mxp = scores_max(c, w, &kt, qb, bk, qv, masked, mx);
            if (masked)
                mask_scores(c, w, &tk, keys, p0, bk, i0);
            softmax_tile(w->st, bk, qb, D, qv, mxp, score_scale(c));
            values(c, w, &kt, qb, bk, qv, 1);
        }
    }
    for (int q = 0; q < tk.nqb; q++) {
        const int64_t i0 = tk.i_first + (int64_t)q * BQ;
        store_out(c, w, &w->qb[q], &tk, i0, flash_block_rows(jb->split.rows, i0, BQ));
    }
}

/* Softmax over all the keys at once (short path): m = row max, P^T =
 * exp(scale s - m) in place, l = sum. A query that saw no key keeps
 * m = -inf and l = 0 (exp(-inf - 0) = 0), stored as zeros. mx_in, scale:
 * as for softmax_tile. */
static void softmax_full(float *st, int bk, const qblock *qb, int qv, const vec *mx_in,
                         float scale)
{
    const vec sc = V_SET1(scale);
    for (int v = 0; v < qv; v++) {
        const vec mx = V_MUL(tile_max(st, bk, v, mx_in), sc);
        float mb[VL];
        V_STORE(qb->m + v * VL, mx);
        V_STORE(mb, mx);
        int huge = 0;
        for (int i = 0; i < VL; i++) {
            mb[i] = mb[i] == -INFINITY ? 0.0f : -mb[i];
            huge |= fabsf(mb[i]) >= HUGE_MAX;
        }
        const vec neg = V_LOAD(mb);
        const vec sum = exp_rows(st, bk, v, sc, neg, huge);
        V_STORE(qb->l + v * VL, sum);
    }
}

/*
 * Short key ranges (all of K and V fit in cache, flash_run.h's SHORT_KEYS): K/V are
 * packed once per task, and each of its many query blocks runs the whole
 * key range in one piece: scores, one softmax with no running rescale,
 * O^T = V^T P^T written (over 128 keys: its parts added), stored.
 */
static void task_short_fn(void *arg, int64_t task, int worker)
{
    const job *jb = arg;
    const sdpa_call *c = jb->c;
    const workspace *w = &jb->ws[worker];
    const flash_task tk = flash_task_make(c, &jb->split, BQ, task);
    const int64_t nk = flash_task_keys(c, &tk, w->keys);
    const int64_t *keys = c->mask && c->mask->key ? w->keys : NULL;
    const qblock *qb = &w->qb[0];
    const kv_tile kt = nk > 0 ? load_kv(c, w, &tk, keys, 0, (int)nk, 0) : (kv_tile){0};
    for (int q = 0; q < tk.nqb; q++) {
        const int64_t i0 = tk.i_first + (int64_t)q * BQ;
        const int rows = flash_block_rows(jb->split.rows, i0, BQ);
        load_q(c, w, qb, &tk, i0, rows);
        /* the next block's Q is fetched during this block's scores, this
         * block's output rows during its softmax and values */
        if (q + 1 < tk.nqb)
            flash_prefetch_rows(c->q, &tk, i0 + BQ, flash_block_rows(jb->split.rows, i0 + BQ, BQ),
                          c->desc.D, 0);
        if (nk > 0) {
            const int qv = (rows + VL - 1) / VL; /* vectors of real rows */
            const int masked = tile_masked(c, &tk, keys, 0, (int)nk, i0);
            vec mx[QV];
            vec *mxp = scores_max(c, w, &kt, qb, (int)nk, qv, masked, mx);
            flash_prefetch_rows(c->out, &tk, i0, rows, c->desc.D, 1);
            mask_scores(c, w, &tk, keys, 0, (int)nk, i0);
            softmax_full(w->st, (int)nk, qb, qv, mxp, score_scale(c));
            values(c, w, &kt, qb, (int)nk, qv, 0);
        } else {
            memset(qb->ot, 0, sizeof(float) * (size_t)c->desc.D * BQ);
        }
        store_out(c, w, qb, &tk, i0, rows);
    }
}
