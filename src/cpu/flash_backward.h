/*
 * flash_backward.h - the backward pass of the tiled CPU kernels
 * (sdpa_backward), shared by the ISA files as flash_tiled.h is: each
 * defines its vector vocabulary (vec_*.h) and the block sizes below, then
 * includes this file, which supplies the loops, packing, threading and
 * the entry point.
 *
 * FlashAttention-2's backward: the softmax is recomputed tile by tile from
 * q, k and the forward's LSE, so no Sq x Skv buffer exists. For a block of
 * BQ query rows and a block of BK keys, with qs = scale q:
 *
 *     S  = qs K^T                    P  = exp(S - lse)      (masked: 0)
 *     dV^T += dO^T P                 dP = dO V^T
 *     dS = P (dP - Di),  Di = dO_i . O_i - dlse_i
 *     dK^T += qs^T dS                dQ += dS K             (scaled once, at the end)
 *
 * Keys run along the vector lanes in the four products of the tile (S, dP,
 * dV^T, dK^T: one row of the tile is one query, or one head-dim element,
 * against BK keys), and the head dim in dQ's; so one micro-kernel serves
 * all five: C[mr][n] (+)= A[mr][k] (broadcast, any two strides) . B[k][n]
 * (vectors), n a multiple of VL. Q and dO are packed once per task as f32
 * rows; K and V once per key block, as K^T, V^T (lanes) and K rows.
 *
 * Threads without races: a task is one (batch, KV head), or a chunk of
 * its rows or of its keys (bwd_split_make says which). A task owns the dK
 * and dV rows of its keys, summed over the query heads that read the KV
 * head (grouped-query), and the dQ rows of its rows. With one task per
 * (batch, KV head) it stores both itself; cut into chunks of keys, each
 * keeps a partial dQ of all the rows, cut into chunks of rows a partial dK
 * and dV of all the keys, and a second pass sums the parts in chunk order.
 * The cut depends on the shape only, never on the thread count, so the
 * gradients are deterministic. Keys hidden by a key mask are gathered out
 * before packing (as in the forward) and get zero gradients; keys past
 * the real length likewise.
 *
 * Windows and block maps: a tile that the window or the map hides
 * entirely adds zeros and is skipped. A map is read by key blocks
 * (sdpa__map_by_keys, built once per call), so a key block that no query
 * block lists is neither packed nor visited, and a row tile is tested by
 * one mark per map query block rather than a search of its lists. What
 * the map does not remove: a chunk of keys still packs every row of its
 * task and keeps a partial dQ of them all.
 *
 * Extra memory per thread: rows (3 Dp + 2) floats for the task's rows
 * (at most Hq/Hkv x Sq; Dp = D rounded up to VL), plus the key block's
 * tiles, about 4 D BK + BK Dp + 2 BQ BK floats; with chunks, the parts:
 * B Hkv chunks x (rows Dp, or 2 Skv Dp) floats for the call.
 *
 * The ISA file defines, before including: VL, vec, V_LOAD, V_STORE,
 * V_SET1, V_ZERO, V_FMA, V_MUL, V_ADD, V_SUB, V_EXP (x <= 0 and -inf),
 * and BWD_MR (micro-kernel rows), BWD_NV (vectors per micro-kernel row),
 * BWD_BQ (query rows per block), BWD_BK (keys per block, a multiple of
 * VL), BWD_NAME.
 *
 * Or BWD_TILES (cpu.amx: amx/backward_amx.h, included before this file),
 * BWD_BQ 32 or 64, BWD_BK a multiple of 32: the five products on bf16
 * operands with fp32 sums (w->qs then holds q unscaled), by the
 * includer's type bwd_tiles (its operands, one per worker: bwd_work's t)
 * and functions bwd_tiles_floats and bwd_tiles_lay (their room and
 * layout), bwd_tiles_clear_rows, bwd_tiles_pack_row and
 * bwd_tiles_transpose_rows (a task's rows), bwd_tiles_pack_keys (a key
 * block's), bwd_tiles_scores (S and dP) and bwd_tiles_grads (dV^T, dK^T,
 * dQ), and BWD_TASK_START() / BWD_TASK_END() around each task (the tile
 * configuration). Everything else (the split, masks, the softmax in fp32,
 * the stores) is this file's, as for the vector kernels; the tiles'
 * products read 32 rows from a block's first, so their row buffers have
 * BWD_BQ more, zero, rows at their end (BWD_ROWS_PAD).
 */
#include "../core/convert.h"
#include "flash_tasks.h"
#include "mask_row.h"
#include "../core/sparse.h"
#include "../core/backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if BWD_BK % VL != 0
#error "BWD_BK must be a multiple of VL"
#endif

#ifdef BWD_TILES
#if (BWD_BQ != 32 && BWD_BQ != 64) || BWD_BK % 32 != 0
#error "BWD_TILES: blocks of 32 or 64 rows and a multiple of 32 keys"
#endif
/* key columns a block computes: its keys rounded up to 32 (a short block
 * of a long BWD_BK runs no products, exponentials or masks past them) */
#define BWD_KEY_COLS(bk) (((bk) + 31) / 32 * 32)
#define BWD_ROWS_PAD BWD_BQ /* rows past a buffer's last that a block's products read */
/* q unscaled (bf16 q exact: a scaled copy would round every score by up to
 * 2^-9 of it); the scale meets S in fp32 and dS for dK */
#define BWD_Q_SCALED 0
#else
#define BWD_ROWS_PAD 0
#define BWD_Q_SCALED 1 /* qs = scale q */
/* a short block's keys rounded up to whole vectors, not to BWD_BK: SDXL's
 * 77 keys (48 + 29) took 96 score columns, now 80; PixArt's 120 (48 + 48
 * + 24) 144, now 120 (cpu.avx2, Zen 3: 0.94x and 0.90x the time) */
#define BWD_KEY_COLS(bk) (((bk) + VL - 1) / VL * VL)
#ifndef BWD_TASK_START
#define BWD_TASK_START() ((void)0)
#define BWD_TASK_END() ((void)0)
#endif

/*
 * C[mr][nv VL] (+)= sum_k A[i rs + k cs] B[k ldb + 0 .. nv VL), inlined
 * with constant mr and nv so the accumulators stay in registers.
 */
static inline __attribute__((always_inline)) void bwd_ukr(const int mr, const int nv, int K,
                                                          const float *a, ptrdiff_t rs,
                                                          ptrdiff_t cs, const float *b,
                                                          ptrdiff_t ldb, float *c, ptrdiff_t ldc,
                                                          int accumulate)
{
    vec acc[BWD_MR][BWD_NV];
    for (int i = 0; i < mr; i++)
        for (int v = 0; v < nv; v++)
            acc[i][v] = V_ZERO(); /* a block's sum from zero, added to C once */
    for (int k = 0; k < K; k++) {
        vec bv[BWD_NV];
        for (int v = 0; v < nv; v++)
            bv[v] = V_LOAD(b + k * ldb + v * VL);
        for (int i = 0; i < mr; i++) {
            const vec ai = V_SET1(a[i * rs + k * cs]);
            for (int v = 0; v < nv; v++)
                acc[i][v] = V_FMA(ai, bv[v], acc[i][v]);
        }
    }
    for (int i = 0; i < mr; i++)
        for (int v = 0; v < nv; v++)
            V_STORE(c + i * ldc + v * VL,
                    accumulate ? V_ADD(V_LOAD(c + i * ldc + v * VL), acc[i][v]) : acc[i][v]);
}

/* Every row of one column panel of nv vectors: BWD_MR rows at a time, one
 * dispatch for the tail, so each call site sees constant mr and nv. */
static inline __attribute__((always_inline)) void bwd_panel(const int nv, int M, int K,
                                                            const float *a, ptrdiff_t rs,
                                                            ptrdiff_t cs, const float *b,
                                                            ptrdiff_t ldb, float *c,
                                                            ptrdiff_t ldc, int accumulate)
{
    int i = 0;
    for (; i + BWD_MR <= M; i += BWD_MR) {
        /* the next rows' accumulators asked for now: a call of the
         * micro-kernel ends by adding to them, and dQ's come from L2 or
         * beyond (its rows are the task's, streamed once per key block) */
        if (accumulate && i + 2 * BWD_MR <= M)
            for (int r = BWD_MR; r < 2 * BWD_MR; r++)
                for (int v = 0; v < nv * VL; v += 16) /* 16 floats: a line */
                    __builtin_prefetch(c + (i + r) * ldc + v, 1, 3);
        bwd_ukr(BWD_MR, nv, K, a + i * rs, rs, cs, b, ldb, c + i * ldc, ldc, accumulate);
    }
    a += i * rs, c += i * ldc;
    switch (M - i) {
#if BWD_MR > 7
    case 7: bwd_ukr(7, nv, K, a, rs, cs, b, ldb, c, ldc, accumulate); break;
    case 6: bwd_ukr(6, nv, K, a, rs, cs, b, ldb, c, ldc, accumulate); break;
#endif
#if BWD_MR > 5
    case 5: bwd_ukr(5, nv, K, a, rs, cs, b, ldb, c, ldc, accumulate); break;
    case 4: bwd_ukr(4, nv, K, a, rs, cs, b, ldb, c, ldc, accumulate); break;
#endif
    case 3: bwd_ukr(3, nv, K, a, rs, cs, b, ldb, c, ldc, accumulate); break;
    case 2: bwd_ukr(2, nv, K, a, rs, cs, b, ldb, c, ldc, accumulate); break;
    case 1: bwd_ukr(1, nv, K, a, rs, cs, b, ldb, c, ldc, accumulate); break;
    default: break;
    }
}

#if BWD_MR != 8 && BWD_MR != 6 && BWD_MR != 4
#error "bwd_panel dispatches tails of BWD_MR 4, 6 or 8"
#endif
#if BWD_NV < 2 || BWD_NV > 4
#error "bwd_gemm dispatches BWD_NV 2..4"
#endif

/* C[M][N] (+)= A[M][K] . B[K][N], N a multiple of VL; A element (i, k) at
 * a[i rs + k cs]. Column panels outer, so a panel of B stays in L1 while
 * the rows pass. With 3 vectors a panel, 4 left are cut 2 + 2, not 3 + 1:
 * a one-vector panel of 4 rows has 4 accumulators, too few to cover the
 * multiply-add's latency on two pipes (dQ's 128 columns at D 128, a
 * 32-key block). */
static void bwd_gemm(int M, int N, int K, const float *a, ptrdiff_t rs, ptrdiff_t cs,
                     const float *b, ptrdiff_t ldb, float *c, ptrdiff_t ldc, int accumulate)
{
    for (int n0 = 0, nv; n0 < N; n0 += nv * VL) {
        const int left = (N - n0) / VL;
        nv = left < BWD_NV ? left : BWD_NV == 3 && left == 4 ? 2 : BWD_NV;
        switch (nv) {
#if BWD_NV > 3
        case 4: bwd_panel(4, M, K, a, rs, cs, b + n0, ldb, c + n0, ldc, accumulate); break;
#endif
#if BWD_NV > 2
        case 3: bwd_panel(3, M, K, a, rs, cs, b + n0, ldb, c + n0, ldc, accumulate); break;
#endif
        case 2: bwd_panel(2, M, K, a, rs, cs, b + n0, ldb, c + n0, ldc, accumulate); break;
        default: bwd_panel(1, M, K, a, rs, cs, b + n0, ldb, c + n0, ldc, accumulate); break;
        }
    }
}
#endif /* !BWD_TILES */

/*
 * How a call is cut into tasks, from its shape alone (never the thread
 * count: the sums then run in one order whatever the threads, so the
 * gradients are deterministic). One task per (batch, KV head) when there
 * are at least 16; else each is cut into chunks until there are 16 tasks,
 * along whichever side keeps the partial sums smaller: the rows (each
 * chunk adds its part of dK, dV for all keys: Skv D floats, kept and
 * summed after; cross-attention to a short text) or the keys (each chunk
 * adds its part of dQ for all rows: rows D floats).
 */
typedef struct bwd_split {
    int by_rows;        /* chunks of rows (partial dK, dV), else of keys (partial dQ) */
    int64_t chunks;     /* per (batch, KV head) */
    int64_t chunk_rows; /* rows per chunk: a multiple of BWD_BQ, or all the rows */
    int64_t chunk_keys; /* keys per chunk: a multiple of BWD_BK, or all the keys */
    int64_t rows;       /* rows of a (batch, KV head): G Sq, head-major */
    int64_t Dp;         /* D rounded up to VL */
} bwd_split;

static bwd_split bwd_split_make(const sdpa_call_desc *d)
{
    bwd_split s;
    s.rows = d->Hq / d->Hkv * d->Sq;
    s.Dp = (d->D + VL - 1) / VL * VL;
    const int64_t heads = d->B * d->Hkv;
    int64_t want = heads >= 16 ? 1 : (16 + heads - 1) / heads;
    s.by_rows = want > 1 && s.rows > d->Skv;
    const int64_t step = s.by_rows ? BWD_BQ : BWD_BK;
    const int64_t blocks = ((s.by_rows ? s.rows : d->Skv) + step - 1) / step;
    if (want > blocks)
        want = blocks;
    const int64_t per = (blocks + want - 1) / want;
    s.chunks = (blocks + per - 1) / per;
    s.chunk_rows = s.by_rows ? per * BWD_BQ : s.rows;
    s.chunk_keys = s.by_rows ? d->Skv : per * BWD_BK;
    if (s.chunk_rows > s.rows)
        s.chunk_rows = s.rows;
    return s;
}

typedef struct bwd_work {
    float *qs, *dout;    /* [chunk_rows][Dp] scaled q, dO (real rows only) */
    float *lse, *di;     /* [chunk_rows] the forward's LSE (+inf: sees no key), dO . O - dlse */
    float *dq;           /* [chunk_rows][Dp] dQ (unscaled), unless chunks of keys */
    float *kt, *vt;      /* [D][BK]    K^T, V^T of the key block        */
    float *kr;           /* [BK][Dp]   K rows                           */
    float *dkt, *dvt;    /* [D][BK]    dK^T, dV^T of the key block      */
    float *s, *dp;       /* [BQ][BK]   S then P; dP then dS             */
    float *row;          /* [Dp]       a row on its way in or out       */
    uint8_t *qmark;      /* [map q_blocks] those listing the key block  */
    int64_t *keys;       /* [Skv]      visible keys under a key mask    */
#ifdef BWD_TILES
    bwd_tiles t;         /* the includer's bf16 operands */
#endif
} bwd_work;

/* What a task's rows see: causal key j is visible to query i when
 * j <= i + offset (aligned on the real lengths, as in the forward). */
typedef struct bwd_rows {
    int64_t b;
    int causal;
    int64_t offset;
} bwd_rows;

typedef struct bwd_job {
    const sdpa_call *c;
    bwd_split sp;
    bwd_work *ws;        /* per worker */
    float *parts;        /* per task: dQ [rows][Dp] (chunks of keys) or dK, dV
                          * [2][Skv][Dp] (chunks of rows); NULL with one chunk */
    sdpa_map_by_keys *by_keys; /* a block map read by key blocks, or NULL */
} bwd_job;

/* Floats of one task's partial results (chunks): dK, dV of every key, or
 * dQ of every row (the products of a block's last rows may touch 32 more:
 * they stay in the task's own part). */
static size_t bwd_part_floats(const bwd_split *sp, const sdpa_call_desc *d)
{
    return (size_t)(sp->by_rows ? 2 * d->Skv * sp->Dp : (sp->rows + BWD_ROWS_PAD) * sp->Dp);
}

/* Packs the task's real rows r_lo .. r_hi of its row space (buffers
 * indexed from r_lo): qs = scale q, dO, the LSE (+inf where the forward
 * saw no key, so that P = 0 there), Di = dO . O minus the LSE's gradient. */
static void bwd_pack_rows(const sdpa_call *c, const bwd_work *w, const bwd_split *sp, int64_t b,
                          int64_t hk, int64_t len_q, int64_t r_lo, int64_t r_hi)
{
    const sdpa_call_desc *d = &c->desc;
    const int64_t D = d->D, Dp = sp->Dp, G = d->Hq / d->Hkv;
#ifdef BWD_TILES
    bwd_tiles_clear_rows(&w->t, r_hi - r_lo, Dp);
#endif
    for (int64_t r = r_lo; r < r_hi; r++) {
        const int64_t h = hk * G + r / d->Sq, i = r % d->Sq;
        if (i >= len_q)
            continue; /* padding: never read (tiles: zeros) */
        float *qs = w->qs + (r - r_lo) * Dp, *dout = w->dout + (r - r_lo) * Dp;
        sdpa__load_row(sdpa__elem(c->q, sdpa__offset(c->q, b, i, h, 0)), c->q->dtype,
                       c->q->stride[3], D, BWD_Q_SCALED ? (float)c->scale : 1.0f, qs);
        sdpa__load_row(sdpa__elem(c->dout, sdpa__offset(c->dout, b, i, h, 0)), c->dout->dtype,
                       c->dout->stride[3], D, 1.0f, dout);
        sdpa__load_row(sdpa__elem(c->out, sdpa__offset(c->out, b, i, h, 0)), c->out->dtype,
                       c->out->stride[3], D, 1.0f, w->row);
        for (int64_t e = D; e < Dp; e++)
            qs[e] = dout[e] = w->row[e] = 0.0f;
        /* Di in VL lanes, then their sum: one scalar chain of D
         * multiply-adds waited on each add (4 cycles), a row's whole cost
         * when the keys are few (77- and 120-key cross rows 0.95-0.96x
         * the time in VL lanes, cpu.avx2 on Zen 3) */
        vec acc = V_ZERO();
        for (int64_t e = 0; e < Dp; e += VL)
            acc = V_FMA(V_LOAD(dout + e), V_LOAD(w->row + e), acc);
        float lanes[VL], di = 0.0f;
        V_STORE(lanes, acc);
        for (int e = 0; e < VL; e++)
            di += lanes[e];
#ifdef BWD_TILES
        bwd_tiles_pack_row(&w->t, r - r_lo, qs, dout, Dp);
#endif
        const int64_t at = (b * d->Hq + h) * d->Sq + i;
        const float l = c->lse[at];
        w->lse[r - r_lo] = l == -INFINITY ? INFINITY : l;
        /* the LSE's gradient g adds g P_ij to dS_ij: D_i - g_i */
        w->di[r - r_lo] = c->dlse ? di - c->dlse[at] : di;
    }
#ifdef BWD_TILES
    bwd_tiles_transpose_rows(&w->t, r_hi - r_lo, Dp);
#endif
}

/* Packs keys flash_key(keys, p0 + j), j < bk, of KV head hk: K^T and V^T
 * with BWD_BK lanes (lanes past bk zero), K as rows of Dp. */
static void bwd_pack_keys(const sdpa_call *c, const bwd_work *w, const bwd_split *sp, int64_t b,
                          int64_t hk, const int64_t *keys, int64_t p0, int bk)
{
    const int64_t D = c->desc.D, Dp = sp->Dp;
    for (int j = 0; j < BWD_BK; j++) {
        if (j >= bk) {
            for (int64_t e = 0; e < D; e++)
                w->kt[e * BWD_BK + j] = w->vt[e * BWD_BK + j] = 0.0f;
            continue;
        }
        const int64_t kj = flash_key(keys, p0 + j);
        float *kr = w->kr + (ptrdiff_t)j * Dp;
        sdpa__load_row(sdpa__elem(c->k, sdpa__offset(c->k, b, kj, hk, 0)), c->k->dtype,
                       c->k->stride[3], D, 1.0f, kr);
        for (int64_t e = D; e < Dp; e++)
            kr[e] = 0.0f;
        sdpa__load_row(sdpa__elem(c->v, sdpa__offset(c->v, b, kj, hk, 0)), c->v->dtype,
                       c->v->stride[3], D, 1.0f, w->row);
        for (int64_t e = 0; e < D; e++) {
            w->kt[e * BWD_BK + j] = kr[e];
            w->vt[e * BWD_BK + j] = w->row[e];
        }
    }
#ifdef BWD_TILES
    bwd_tiles_pack_keys(&w->t, w->kt, w->vt, w->kr, bk, D, Dp);
#endif
}

/* The window and the block map on row i's first n scores (keys
 * flash_key(keys, p0 + j)): the map's entry is looked up once per key
 * block the row's keys cross, not per score. */
static void bwd_mask_sparse(const sdpa_call *c, int64_t b, int64_t h, int64_t i,
                            const int64_t *keys, int64_t p0, int n, float *s)
{
    const sdpa_mask *mk = c->mask;
    int64_t lo = INT64_MIN, hi = INT64_MAX;
    if (mk->window) {
        int64_t len_q, len_kv;
        sdpa__seq_lens(c, b, &len_q, &len_kv);
        sdpa__window_keys(mk->window, i, len_kv - len_q, &lo, &hi);
    }
    const sdpa_block_map *m = mk->blocks;
    const int64_t row = m ? sdpa__map_row(m, b, h, i / m->block_q) : 0;
    int64_t kb_seen = -1, entry = -1; /* entry: -2 full, -1 hidden, else partial n */
    for (int j = 0; j < n; j++) {
        const int64_t kj = flash_key(keys, p0 + j);
        int see = kj >= lo && kj <= hi;
        if (see && m) {
            const int64_t kb = kj / m->block_kv;
            if (kb != kb_seen) {
                kb_seen = kb;
                entry = m->full_count && sdpa__map_find(m->full_index + row * m->index_stride,
                                                        m->full_count[row], kb) >= 0
                            ? -2
                        : m->partial_count
                            ? sdpa__map_find(m->partial_index + row * m->index_stride,
                                             m->partial_count[row], kb)
                            : -1;
            }
            see = entry == -2 ||
                  (entry >= 0 && sdpa__map_bit(m, row, entry, i % m->block_q, kj % m->block_kv));
        }
        if (!see)
            s[j] = -INFINITY;
    }
}

/* Rows i0 .. i0 + nr of head h against the key block: lanes past bk,
 * causal and the general mask set to -inf in the score tile. */
static void bwd_mask(const sdpa_call *c, const bwd_work *w, const bwd_rows *tk, int64_t h,
                     const int64_t *keys, int64_t p0, int bk, int64_t i0, int nr)
{
    const sdpa_mask *mk = c->mask;
    const int general = mk && mk->general;
    const int sparse = mk && (mk->window || mk->blocks); /* element by element (sparse.h) */
    const int64_t last_key = flash_key(keys, p0 + bk - 1);
    const int kc = BWD_KEY_COLS(bk);
    for (int r = 0; r < nr; r++) {
        float *s = w->s + (ptrdiff_t)r * BWD_BK;
        const int64_t i = i0 + r;
        int n = bk; /* lanes this row may see, before the general mask */
        if (tk->causal && last_key > i + tk->offset) {
            n = 0;
            while (n < bk && flash_key(keys, p0 + n) <= i + tk->offset)
                n++;
        }
        for (int j = n; j < kc; j++)
            s[j] = -INFINITY;
        for (int j = 0; general && j < n; j++)
            s[j] = sdpa__mask_general(mk, sdpa__mask_at(mk, tk->b, h, i, flash_key(keys, p0 + j)),
                                      s[j]);
        if (sparse)
            bwd_mask_sparse(c, tk->b, h, i, keys, p0, n, s);
    }
}

/* One query block against one key block: the five products. */
static void bwd_tile(const sdpa_call *c, const bwd_work *w, const bwd_split *sp,
                     const bwd_rows *tk, int64_t h, int64_t r0, int64_t i0, int nr,
                     const int64_t *keys, int64_t p0, int bk, float *dq)
{
    const int64_t Dp = sp->Dp;
    const int kc = BWD_KEY_COLS(bk); /* the score columns computed */
#ifdef BWD_TILES /* S and dP */
    bwd_tiles_scores(&w->t, w->s, w->dp, r0, kc, (float)c->scale);
#else
    const int64_t D = c->desc.D;
    const float *qs = w->qs + r0 * Dp, *dout = w->dout + r0 * Dp;
    /* S = qs K^T */
    bwd_gemm(nr, kc, (int)D, qs, Dp, 1, w->kt, BWD_BK, w->s, BWD_BK, 0);
#endif
    const int masked = bk < kc ||
                       (c->mask && (c->mask->general || c->mask->window || c->mask->blocks)) ||
                       (tk->causal && flash_key(keys, p0 + bk - 1) > i0 + tk->offset);
    if (masked)
        bwd_mask(c, w, tk, h, keys, p0, bk, i0, nr);
    /* P = exp(S - lse) */
    for (int r = 0; r < nr; r++) {
        float *s = w->s + (ptrdiff_t)r * BWD_BK;
        const vec l = V_SET1(w->lse[r0 + r]);
        for (int j = 0; j < kc; j += VL)
            V_STORE(s + j, V_EXP(V_SUB(V_LOAD(s + j), l)));
    }
#ifndef BWD_TILES
    /* dV^T += dO^T P: A(e, r) = dout[r][e] */
    bwd_gemm((int)D, kc, nr, dout, 1, Dp, w->s, BWD_BK, w->dvt, BWD_BK, 1);
    /* dP = dO V^T, then dS = P (dP - Di) in place */
    bwd_gemm(nr, kc, (int)D, dout, Dp, 1, w->vt, BWD_BK, w->dp, BWD_BK, 0);
#endif
    for (int r = 0; r < nr; r++) {
        float *dp = w->dp + (ptrdiff_t)r * BWD_BK;
        const float *p = w->s + (ptrdiff_t)r * BWD_BK;
        const vec di = V_SET1(w->di[r0 + r]);
        for (int j = 0; j < kc; j += VL)
            V_STORE(dp + j, V_MUL(V_LOAD(p + j), V_SUB(V_LOAD(dp + j), di)));
    }
#ifdef BWD_TILES /* dV^T, dK^T and dQ (K's pad keys are zero) */
    bwd_tiles_grads(&w->t, w->s, w->dp, w->dvt, w->dkt, Dp, r0, nr, kc, dq, (float)c->scale);
#else
    /* dK^T += qs^T dS */
    bwd_gemm((int)D, kc, nr, qs, 1, Dp, w->dp, BWD_BK, w->dkt, BWD_BK, 1);
    /* dQ += dS K (the block's bk keys) */
    bwd_gemm(nr, (int)Dp, bk, w->dp, BWD_BK, 1, w->kr, Dp, dq + r0 * Dp, Dp, 1);
#endif
}

/* dK, dV rows of the key block from dK^T, dV^T: into the tensors, or
 * into the task's partial [2][Skv][Dp] (part not NULL: chunks of rows). */
static void bwd_store_keys(const sdpa_call *c, const bwd_work *w, const bwd_split *sp, int64_t b,
                           int64_t hk, const int64_t *keys, int64_t p0, int bk, float *part)
{
    const int64_t D = c->desc.D, Skv = c->desc.Skv;
    for (int j = 0; j < bk; j++) {
        const int64_t kj = flash_key(keys, p0 + j);
        for (int g = 0; g < 2; g++) {
            const float *src = g ? w->dvt : w->dkt;
            if (part) {
                float *dst = part + (g * Skv + kj) * sp->Dp;
                for (int64_t e = 0; e < D; e++)
                    dst[e] = src[e * BWD_BK + j];
                continue;
            }
            sdpa_tensor *t = g ? c->dv : c->dk;
            for (int64_t e = 0; e < D; e++)
                w->row[e] = src[e * BWD_BK + j];
            sdpa__store_row((char *)t->data + sdpa__offset(t, b, kj, hk, 0) *
                                                  (int64_t)sdpa_dtype_size(t->dtype),
                            t->dtype, t->stride[3], D, 1.0f, w->row);
        }
    }
}

/* Zero dK, dV rows for keys kj0 .. kj1 that the task computes nothing for:
 * past the real length, hidden by the key mask, or every key when no query
 * row is real (len_q 0). */
static void bwd_zero_keys(const sdpa_call *c, int64_t b, int64_t hk, int64_t kj0, int64_t kj1,
                          int64_t len_q, int64_t len_kv)
{
    const sdpa_mask *mk = c->mask;
    const uint8_t *key = mk && mk->key ? mk->key + b * mk->key_stride[0] : NULL;
    for (int64_t j = kj0; j < kj1; j++) {
        if (len_q > 0 && j < len_kv && (!key || key[j * mk->key_stride[1]]))
            continue;
        for (int g = 0; g < 2; g++) {
            sdpa_tensor *t = g ? c->dv : c->dk;
            sdpa__store_row((char *)t->data + sdpa__offset(t, b, j, hk, 0) *
                                                  (int64_t)sdpa_dtype_size(t->dtype),
                            t->dtype, t->stride[3], c->desc.D, 0.0f, NULL);
        }
    }
}

/* dQ rows of the task's row space, scaled: real rows from acc, padding
 * rows (i >= len_q) zeros. */
static void bwd_store_dq(const sdpa_call *c, const bwd_split *sp, int64_t b, int64_t hk,
                         int64_t len_q, int64_t r_first, int64_t r_end, const float *acc)
{
    const sdpa_call_desc *d = &c->desc;
    const int64_t G = d->Hq / d->Hkv;
    sdpa_tensor *t = c->dq;
    for (int64_t r = r_first; r < r_end; r++) {
        const int64_t h = hk * G + r / d->Sq, i = r % d->Sq;
        sdpa__store_row((char *)t->data +
                            sdpa__offset(t, b, i, h, 0) * (int64_t)sdpa_dtype_size(t->dtype),
                        t->dtype, t->stride[3], d->D, i < len_q ? (float)c->scale : 0.0f,
                        acc + (r - r_first) * sp->Dp);
    }
}

/* Whether any query block of heads h0 .. h0 + n lists a key block of the
 * map among keys j0 .. j1: none does, and the key block adds nothing. */
static int bwd_keys_listed(const sdpa_call *c, const sdpa_map_by_keys *t, int64_t b, int64_t h0,
                           int64_t n, int64_t j0, int64_t j1)
{
    const sdpa_block_map *m = c->mask->blocks;
    for (int64_t h = h0; h < h0 + n; h++) {
        const int64_t *st = sdpa__map_by_keys_of(t, m, b, h);
        if (st[j1 / m->block_kv + 1] > st[j0 / m->block_kv])
            return 1;
    }
    return 0;
}

/* The map's query blocks of head h that list a key block among keys
 * j0 .. j1, marked in `mark`; 0 when there are none. The backward then
 * visits only row tiles in a marked query block: the map read by key
 * blocks, not a search of each tile's rows in their lists. */
static int bwd_mark_rows(const sdpa_call *c, const sdpa_map_by_keys *t, uint8_t *mark, int64_t b,
                         int64_t h, int64_t j0, int64_t j1)
{
    const sdpa_block_map *m = c->mask->blocks;
    const int64_t *st = sdpa__map_by_keys_of(t, m, b, h);
    memset(mark, 0, (size_t)m->q_blocks);
    int any = 0;
    for (int64_t kb = j0 / m->block_kv; kb <= j1 / m->block_kv; kb++)
        for (int64_t e = st[kb]; e < st[kb + 1]; e++)
            mark[t->q[e]] = 1, any = 1;
    return any;
}

/* Whether rows i0 .. i1 - 1 lie in a marked query block. */
static int bwd_rows_marked(const sdpa_block_map *m, const uint8_t *mark, int64_t i0, int64_t i1)
{
    for (int64_t qb = i0 / m->block_q; qb <= (i1 - 1) / m->block_q && qb < m->q_blocks; qb++)
        if (mark[qb])
            return 1;
    return 0;
}

static void bwd_task(void *arg, int64_t task, int worker)
{
    const bwd_job *jb = arg;
    const sdpa_call *c = jb->c;
    const sdpa_call_desc *d = &c->desc;
    const bwd_split *sp = &jb->sp;
    const bwd_work *w = &jb->ws[worker];
    const int64_t bh = task / sp->chunks, chunk = task % sp->chunks;
    const int64_t b = bh / d->Hkv, hk = bh % d->Hkv, G = d->Hq / d->Hkv, Dp = sp->Dp;
    int64_t len_q, len_kv;
    sdpa__seq_lens(c, b, &len_q, &len_kv);
    const bwd_rows tk = {b, c->causal != SDPA_CAUSAL_NONE,
                         sdpa_causal_offset(c->causal, len_q, len_kv)};
    /* this task's rows r_lo .. r_hi and keys kj0 .. kj1 */
    const int64_t r_lo = sp->by_rows ? chunk * sp->chunk_rows : 0;
    const int64_t r_hi = r_lo + sp->chunk_rows < sp->rows ? r_lo + sp->chunk_rows : sp->rows;
    const int64_t kj0 = sp->by_rows ? 0 : chunk * sp->chunk_keys;
    const int64_t kj1 = kj0 + sp->chunk_keys < d->Skv ? kj0 + sp->chunk_keys : d->Skv;
    const size_t part = bwd_part_floats(sp, d);
    float *parts = jb->parts ? jb->parts + (size_t)task * part : NULL;
    float *dq = parts && !sp->by_rows ? parts : w->dq;
    float *kv_part = parts && sp->by_rows ? parts : NULL;
    if (parts)
        memset(parts, 0, sizeof(float) * part);
    if (dq != parts)
        memset(dq, 0, sizeof(float) * (size_t)((r_hi - r_lo) * Dp));
    if (!kv_part)
        bwd_zero_keys(c, b, hk, kj0, kj1, len_q, len_kv);

    /* the visible keys of the chunk: kj0 .. min(kj1, len_kv), gathered
     * under a key mask (keys[p] is the p-th) */
    const int64_t kend = kj1 < len_kv ? kj1 : len_kv;
    const sdpa_mask *mk = c->mask;
    int64_t *keys = NULL, nk = kend > kj0 ? kend - kj0 : 0;
    if (mk && mk->key) {
        const uint8_t *key = mk->key + b * mk->key_stride[0];
        keys = w->keys, nk = 0;
        for (int64_t j = kj0; j < kend; j++)
            if (key[j * mk->key_stride[1]])
                keys[nk++] = j;
    }
    const int sparse = mk && (mk->window || mk->blocks);
    if (len_q > 0 && nk > 0) {
        BWD_TASK_START();
        bwd_pack_rows(c, w, sp, b, hk, len_q, r_lo, r_hi);
        for (int64_t p = 0; p < nk; p += BWD_BK) {
            const int bk = (int)(nk - p < BWD_BK ? nk - p : BWD_BK);
            /* without a key list, flash_key(NULL, p0) is p0: key numbers */
            const int64_t p0 = keys ? p : kj0 + p;
            const int64_t kfirst = flash_key(keys, p0), klast = flash_key(keys, p0 + bk - 1);
            memset(w->dkt, 0, sizeof(float) * (size_t)(Dp * BWD_BK));
            memset(w->dvt, 0, sizeof(float) * (size_t)(Dp * BWD_BK));
            if (jb->by_keys && !bwd_keys_listed(c, jb->by_keys, b, hk * G, G, kfirst, klast)) {
                bwd_store_keys(c, w, sp, b, hk, keys, p0, bk, kv_part); /* listed by none */
                continue;
            }
            bwd_pack_keys(c, w, sp, b, hk, keys, p0, bk);
            /* causal: rows before kfirst - offset see none of these keys */
            const int64_t i_causal = tk.causal && kfirst - tk.offset > 0 ? kfirst - tk.offset : 0;
            for (int64_t g = r_lo / d->Sq; g < G && g * d->Sq < r_hi; g++) {
                if (jb->by_keys && !bwd_mark_rows(c, jb->by_keys, w->qmark, b, hk * G + g,
                                                  kfirst, klast))
                    continue;
                int64_t i = r_lo - g * d->Sq > i_causal ? r_lo - g * d->Sq : i_causal;
                const int64_t i_end = r_hi - g * d->Sq < len_q ? r_hi - g * d->Sq : len_q;
                for (; i < i_end; i += BWD_BQ) {
                    const int nr = (int)(i_end - i < BWD_BQ ? i_end - i : BWD_BQ);
                    /* a window or a map that hides the whole tile: its five
                     * products would add zeros */
                    if (jb->by_keys && !bwd_rows_marked(mk->blocks, w->qmark, i, i + nr))
                        continue;
                    if (sparse && (!jb->by_keys || mk->window) &&
                        !sdpa__sparse_tile_sees(c, b, hk * G + g, i, i + nr, kfirst, klast))
                        continue;
                    bwd_tile(c, w, sp, &tk, hk * G + g, g * d->Sq + i - r_lo, i, nr, keys, p0,
                             bk, dq);
                }
            }
            bwd_store_keys(c, w, sp, b, hk, keys, p0, bk, kv_part);
        }
        BWD_TASK_END();
    }
    if (dq == w->dq)
        bwd_store_dq(c, sp, b, hk, len_q, r_lo, r_hi, dq);
}

/* With several chunks: the chunks' parts summed in chunk order, a block
 * of rows (dQ) or of keys (dK, dV) per task, a row at a time. */
static void bwd_reduce_task(void *arg, int64_t task, int worker)
{
    const bwd_job *jb = arg;
    const sdpa_call *c = jb->c;
    const sdpa_call_desc *d = &c->desc;
    const bwd_split *sp = &jb->sp;
    const int64_t Dp = sp->Dp, step = sp->by_rows ? BWD_BK : BWD_BQ;
    const int64_t n = sp->by_rows ? d->Skv : sp->rows; /* rows of the parts */
    const int64_t blocks = (n + step - 1) / step;
    const int64_t bh = task / blocks, x0 = task % blocks * step;
    const int64_t x1 = x0 + step < n ? x0 + step : n;
    const int64_t b = bh / d->Hkv, hk = bh % d->Hkv, G = d->Hq / d->Hkv;
    const size_t part = bwd_part_floats(sp, d);
    const float *base = jb->parts + (size_t)(bh * sp->chunks) * part;
    float *row = jb->ws[worker].row;
    int64_t len_q, len_kv;
    sdpa__seq_lens(c, b, &len_q, &len_kv);
    for (int g = 0; g < (sp->by_rows ? 2 : 1); g++)
        for (int64_t x = x0; x < x1; x++) {
            const size_t at = (size_t)((g * n + x) * Dp);
            /* VL elements at a time, each summed in chunk order as one
             * at a time was (the same bits); the parts' lanes past D are
             * zeros from their memset */
            for (int64_t e = 0; e < Dp; e += VL) {
                vec sum = V_ZERO();
                for (int64_t ch = 0; ch < sp->chunks; ch++)
                    sum = V_ADD(sum, V_LOAD(base + (size_t)ch * part + at + (size_t)e));
                V_STORE(row + e, sum);
            }
            if (sp->by_rows) { /* key x: zeros where no chunk saw it */
                sdpa_tensor *t = g ? c->dv : c->dk;
                sdpa__store_row((char *)t->data + sdpa__offset(t, b, x, hk, 0) *
                                                      (int64_t)sdpa_dtype_size(t->dtype),
                                t->dtype, t->stride[3], d->D, 1.0f, row);
            } else { /* row x of the row space, scaled */
                const int64_t h = hk * G + x / d->Sq, i = x % d->Sq;
                sdpa_tensor *t = c->dq;
                sdpa__store_row((char *)t->data + sdpa__offset(t, b, i, h, 0) *
                                                      (int64_t)sdpa_dtype_size(t->dtype),
                                t->dtype, t->stride[3], d->D, i < len_q ? (float)c->scale : 0.0f,
                                row);
            }
        }
}

static sdpa_status tiled_backward(const sdpa_backend *self, const sdpa_call *c)
{
    (void)self;
    const sdpa_call_desc *d = &c->desc;
    const int threads = sdpa__pool_threads(c->pool);
    bwd_job jb = {c, bwd_split_make(d), NULL, NULL, NULL};
    const bwd_split *sp = &jb.sp;
    const int64_t D = d->D, Dp = sp->Dp, rows = sp->chunk_rows;
    const int keys_split = sp->chunks > 1 && !sp->by_rows; /* dQ lives in the parts */
    const sdpa_block_map *map = c->mask ? c->mask->blocks : NULL;
    const size_t marks = map ? (size_t)(map->q_blocks + 3) / 4 : 0; /* floats of qmark bytes */
#ifdef BWD_TILES /* the bf16 operands, laid out by the includer */
    const size_t tiles = bwd_tiles_floats(D, Dp, rows);
#else
    const size_t tiles = 0;
#endif
    const size_t per = (size_t)(rows * (2 * Dp + 2) + (keys_split ? 0 : (rows + BWD_ROWS_PAD) * Dp) +
                                2 * D * BWD_BK + 2 * Dp * BWD_BK + BWD_BK * Dp +
                                2 * BWD_BQ * BWD_BK + Dp + 16) +
                       marks + (c->mask && c->mask->key ? 2 * (size_t)d->Skv : 0) + tiles;
    const size_t descs = ((size_t)threads * sizeof(bwd_work) + 63) / 64 * 64;
    const size_t bytes = per * sizeof(float) * (size_t)threads + descs;
    char *base = sdpa__scratch(bytes);
    if (!base)
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes for the backward pass",
                          BWD_NAME, bytes);
    if (sp->chunks > 1) {
        const size_t part = bwd_part_floats(sp, d);
        const size_t part_bytes = sizeof(float) * (size_t)(d->B * d->Hkv * sp->chunks) * part;
        jb.parts = sdpa__malloc(part_bytes);
        if (!jb.parts) {
            sdpa__scratch_release(base);
            return sdpa__fail(SDPA_OUT_OF_MEMORY,
                              "%s: cannot allocate %zu bytes of partial gradients for the "
                              "backward pass",
                              BWD_NAME, part_bytes);
        }
    }
    if (map && !(jb.by_keys = sdpa__map_by_keys(map))) {
        free(jb.parts);
        sdpa__scratch_release(base);
        return sdpa__fail(SDPA_OUT_OF_MEMORY,
                          "%s: cannot allocate the block map read by key blocks for the "
                          "backward pass", BWD_NAME);
    }
    jb.ws = (bwd_work *)base;
    float *mem = (float *)(base + descs);
    for (int t = 0; t < threads; t++) {
        float *p = mem + per * (size_t)t;
        bwd_work *w = &jb.ws[t];
        w->qs = p, p += rows * Dp;
        w->dout = p, p += rows * Dp;
        w->lse = p, p += rows;
        w->di = p, p += rows;
        w->dq = keys_split ? NULL : p, p += keys_split ? 0 : (rows + BWD_ROWS_PAD) * Dp;
        w->kt = p, p += D * BWD_BK;
        w->vt = p, p += D * BWD_BK;
        w->dkt = p, p += Dp * BWD_BK; /* Dp: the tiles' rows of head dims */
        w->dvt = p, p += Dp * BWD_BK;
        w->kr = p, p += BWD_BK * Dp;
        w->s = p, p += BWD_BQ * BWD_BK;
        w->dp = p, p += BWD_BQ * BWD_BK;
        w->row = p, p += Dp;
        w->qmark = marks ? (uint8_t *)p : NULL, p += marks;
        p += (16 - (size_t)(p - mem) % 16) % 16; /* the key list 8-byte aligned */
        w->keys = c->mask && c->mask->key ? (int64_t *)p : NULL;
        p += c->mask && c->mask->key ? 2 * d->Skv : 0;
#ifdef BWD_TILES
        bwd_tiles_lay(&w->t, p, D, Dp, rows);
#endif
    }
    sdpa__parallel_for(c->pool, d->B * d->Hkv * sp->chunks, bwd_task, &jb);
    if (sp->chunks > 1) {
        const int64_t n = sp->by_rows ? d->Skv : sp->rows, step = sp->by_rows ? BWD_BK : BWD_BQ;
        sdpa__parallel_for(c->pool, d->B * d->Hkv * ((n + step - 1) / step), bwd_reduce_task,
                           &jb);
    }
    free(jb.parts);
    free(jb.by_keys);
    sdpa__scratch_release(base);
    return SDPA_OK;
}
