/*
 * flash_portable.c - cpu.portable: tiled online-softmax ("flash") attention
 * in portable C11, no intrinsics. It must work on any CPU, so every inner
 * loop is a plain counted loop over contiguous floats that a compiler
 * vectorises at whatever width the target has.
 *
 * One task = (batch, head, block of BQ query rows). For each block of BK
 * keys it computes S = Q K^T (scale folded into Q), updates the running
 * row max m and denominator l, rescales the output accumulator and adds
 * P V. K and V tiles are converted to f32 per task; that conversion costs
 * about 1/BQ of the arithmetic and buys independence between tasks.
 *
 *     Q tile  [BQ][Dp]   S / P tile [BQ][BK]     O acc [BQ][Dp]
 *     K^T     [Dp][BK]   V tile     [BK][Dp]     m, l  [BQ]
 *
 * Dp is D rounded up to NR; padding columns are zero, so the micro-kernel
 * only ever sees full NR-wide tiles. Extra memory: threads x ~(5 Dp + 2) x
 * 64 floats (about 180 KiB per thread at D = 128), independent of S.
 *
 * Results do not depend on the thread count (each row is owned by one task
 * and accumulates keys in a fixed order): deterministic.
 *
 * At most eight query rows per KV head (a decode step, one token) take the
 * few-query path instead (../flash_decode.h over vec_portable.h): K and V
 * read in place, no tiles to convert for a single row.
 */
#include "../../core/convert.h"
#include "../../core/backend.h"
#include "../../core/sparse.h"
#include "../exp_portable.h"
#include "../flash_tasks.h"
#include "../mask_row.h"
#include "vec_portable.h"
#include "../flash_decode.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { BQ = 64, BK = 64, MR = 4, NR = 8 };

/* C[MR][NR] += A[MR][K] * B[K][NR]; accumulators live in registers. */
static inline void micro_kernel(int K, const float *restrict A, int lda, const float *restrict B,
                                int ldb, float *restrict C, int ldc)
{
    float acc[MR][NR];
    for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++)
            acc[r][c] = C[r * ldc + c];
    for (int k = 0; k < K; k++) {
        const float *b = B + (size_t)k * ldb;
        for (int r = 0; r < MR; r++) {
            const float a = A[r * lda + k];
            for (int c = 0; c < NR; c++)
                acc[r][c] += a * b[c];
        }
    }
    for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++)
            C[r * ldc + c] = acc[r][c];
}

/* C[M][N] += A[M][K] B[K][N] with M % MR == 0 and N % NR == 0. */
static void gemm_acc(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                     float *C, int ldc)
{
    for (int i = 0; i < M; i += MR)
        for (int j = 0; j < N; j += NR)
            micro_kernel(K, A + (size_t)i * lda, lda, B + j, ldb, C + (size_t)i * ldc + j, ldc);
}

typedef struct workspace {
    float *q, *kraw, *kt, *v, *s, *o, *m, *l;
    int64_t *keys; /* [Skv] visible keys under a key mask, else NULL */
} workspace;

typedef struct flash_job {
    const sdpa_call *c;
    int Dp;
    int64_t n_qblocks;
    workspace *ws; /* one per worker */
} flash_job;

static int round_up(int x, int m) { return (x + m - 1) / m * m; }

/* Loads keys flash_key(idx, p0 + j), j < bk, of kv head hk: K transposed
 * into kt, V as rows. */
static void load_kv(const sdpa_call *c, const workspace *w, int Dp, int64_t b, int64_t hk,
                    const int64_t *idx, int64_t p0, int bk)
{
    const sdpa_tensor *k = c->k, *v = c->v;
    const int64_t D = c->desc.D;
    for (int j = 0; j < bk; j++) {
        const int64_t kj = flash_key(idx, p0 + j);
        sdpa__load_row(sdpa__elem(k, sdpa__offset(k, b, kj, hk, 0)), k->dtype, k->stride[3], D,
                       1.0f, w->kraw + (size_t)j * Dp);
        sdpa__load_row(sdpa__elem(v, sdpa__offset(v, b, kj, hk, 0)), v->dtype, v->stride[3], D,
                       1.0f, w->v + (size_t)j * Dp);
    }
    for (int dd = 0; dd < D; dd++)
        for (int j = 0; j < bk; j++)
            w->kt[(size_t)dd * BK + j] = w->kraw[(size_t)j * Dp + dd];
}

/*
 * Online softmax over one S tile: turns rows of S into P in place, updates
 * m and l, and rescales O. Row i may see the first n_cols(i) keys of the
 * tile; the rest of its P row is zeroed so P V ignores them.
 */
/* Where a tile sits in the call, for the masks (sdpa.h): rows at or past
 * rows_real are padding; the tile's keys are kidx[0..bk) under a key mask
 * (only visible keys are loaded), else j0 ..; a general mask is applied
 * per row. */
typedef struct tile_at {
    const sdpa_mask *mask; /* a general mask to apply, or NULL */
    int64_t b, h, i0, j0;
    const int64_t *kidx;
    int rows_real;
} tile_at;

static void softmax_tile(const workspace *w, int Dp, int rows, int bk, int64_t limit0,
                         int causal, const tile_at *at)
{
    int seen = 0; /* with kidx and causal: keys visible to row i (ascending in i) */
    for (int i = 0; i < rows; i++) {
        float *srow = w->s + (size_t)i * BK;
        int64_t lim = causal ? limit0 + i : bk; /* keys of this tile the row may see */
        if (causal && at->kidx) {
            while (seen < bk && at->kidx[seen] <= limit0 + i)
                seen++;
            lim = seen;
        }
        int n_cols = i >= at->rows_real ? 0 : lim < 0 ? 0 : (lim < bk ? (int)lim : bk);
        if (at->mask && n_cols > 0)
            sdpa__mask_row(at->mask, at->b, at->h, at->i0 + i, at->kidx, at->j0, srow, n_cols);
        float mx = w->m[i];
        for (int j = 0; j < n_cols; j++)
            mx = srow[j] > mx ? srow[j] : mx;
        if (n_cols == 0 || mx == -INFINITY) {
            /* Nothing to add, unless the max skipped NaN scores: then the
             * row is NaN (the NaN rules in sdpa.h). Rare, so checked here. */
            for (int j = 0; j < n_cols; j++)
                if (srow[j] != srow[j])
                    w->l[i] = NAN;
            memset(srow, 0, sizeof(float) * BK);
            continue;
        }
        const float alpha = sdpa__exp_nonpos(w->m[i] - mx);
        float sum = 0.0f;
        for (int j = 0; j < n_cols; j++) {
            srow[j] = sdpa__exp_nonpos(srow[j] - mx);
            sum += srow[j];
        }
        for (int j = n_cols; j < BK; j++)
            srow[j] = 0.0f;
        w->l[i] = w->l[i] * alpha + sum;
        w->m[i] = mx;
        if (alpha != 1.0f) {
            float *orow = w->o + (size_t)i * Dp;
            for (int dd = 0; dd < Dp; dd++)
                orow[dd] *= alpha;
        }
    }
}

/*
 * A window or a block map (sdpa.h) on the S tile of rows i0 .. i0 + rows
 * and keys j0 .. j0 + bk (kidx: under a key mask, the tile's keys):
 * hidden scores become -inf. Without a key mask a tile lies in one map
 * block both ways (64-row, 64-key tiles; map blocks of 64 or 128 start
 * on multiples of 64), so the map's entry is looked up once per tile: a
 * FULL block costs nothing more, a PARTIAL one its bits (or nothing: the
 * call's causal and window decide inside). Under a key mask the tile's
 * keys may span blocks: looked up per score.
 */
static void sparse_mask_tile(const sdpa_call *c, const workspace *w, int64_t b, int64_t h,
                             int64_t i0, int rows, const int64_t *kidx, int64_t j0, int bk)
{
    const sdpa_mask *mk = c->mask;
    if (mk->window) {
        int64_t len_q, len_kv;
        sdpa__seq_lens(c, b, &len_q, &len_kv);
        for (int r = 0; r < rows; r++) {
            int64_t lo, hi;
            sdpa__window_keys(mk->window, i0 + r, len_kv - len_q, &lo, &hi);
            float *srow = w->s + (size_t)r * BK;
            for (int jj = 0; jj < bk; jj++) {
                const int64_t j = kidx ? kidx[jj] : j0 + jj;
                if (j < lo || j > hi)
                    srow[jj] = -INFINITY;
            }
        }
    }
    const sdpa_block_map *m = mk->blocks;
    if (!m)
        return;
    if (kidx) {
        for (int r = 0; r < rows; r++)
            for (int jj = 0; jj < bk; jj++)
                if (!sdpa__map_visible(m, b, h, i0 + r, kidx[jj]))
                    w->s[(size_t)r * BK + jj] = -INFINITY;
        return;
    }
    const int64_t row = sdpa__map_row(m, b, h, i0 / m->block_q), kb = j0 / m->block_kv;
    if (m->full_count &&
        sdpa__map_find(m->full_index + row * m->index_stride, m->full_count[row], kb) >= 0)
        return;
    const int64_t n = m->partial_count ? sdpa__map_find(m->partial_index + row * m->index_stride,
                                                        m->partial_count[row], kb)
                                       : -1;
    for (int r = 0; r < rows; r++) {
        float *srow = w->s + (size_t)r * BK;
        for (int jj = 0; jj < bk; jj++)
            if (n < 0 || !sdpa__map_bit(m, row, n, (i0 + r) % m->block_q, (j0 + jj) % m->block_kv))
                srow[jj] = -INFINITY;
    }
}

static void portable_task(void *arg, int64_t task, int worker)
{
    const flash_job *job = arg;
    const sdpa_call *c = job->c;
    const sdpa_call_desc *d = &c->desc;
    const workspace *w = &job->ws[worker];
    const int Dp = job->Dp;
    const int64_t qb = task % job->n_qblocks, bh = task / job->n_qblocks;
    const int64_t b = bh / d->Hq, h = bh % d->Hq, hk = h / (d->Hq / d->Hkv);
    const int64_t i0 = qb * BQ;
    const int rows = (int)(d->Sq - i0 < BQ ? d->Sq - i0 : BQ);
    const int rows_p = round_up(rows, MR);
    /* Sequence lengths: padding rows, real key count, causal on real lengths. */
    int64_t len_q, len_kv;
    sdpa__seq_lens(c, b, &len_q, &len_kv);
    const int64_t offset = sdpa_causal_offset(c->causal, len_q, len_kv);
    tile_at at = {c->mask && c->mask->general ? c->mask : NULL, b, h, i0, 0, NULL,
                  (int)(len_q - i0 < 0 ? 0 : len_q - i0 < rows ? len_q - i0 : rows)};

    /* Keys beyond kv_end are masked for every row of this block. */
    int64_t kv_end = at.rows_real > 0 ? len_kv : 0;
    if (kv_end > 0) /* what the last real row sees */
        kv_end = sdpa_causal_visible_keys(c->causal, i0 + at.rows_real - 1, len_q, len_kv);

    const sdpa_tensor *q = c->q;
    memset(w->q, 0, sizeof(float) * (size_t)rows_p * Dp);
    for (int r = 0; r < rows; r++)
        sdpa__load_row(sdpa__elem(q, sdpa__offset(q, b, i0 + r, h, 0)), q->dtype, q->stride[3],
                       d->D, (float)c->scale, w->q + (size_t)r * Dp);
    memset(w->o, 0, sizeof(float) * (size_t)rows_p * Dp);
    for (int i = 0; i < BQ; i++)
        w->m[i] = -INFINITY, w->l[i] = 0.0f;

    /* A key mask: only the visible keys are loaded (flash_tasks.h). */
    int64_t nk = kv_end;
    const int64_t *keys = NULL;
    if (c->mask && c->mask->key) {
        const uint8_t *key = c->mask->key + b * c->mask->key_stride[0];
        nk = 0, keys = w->keys;
        for (int64_t j = 0; j < kv_end; j++)
            if (key[j * c->mask->key_stride[1]])
                w->keys[nk++] = j;
    }
    const int sparse = c->mask && (c->mask->window || c->mask->blocks);
    for (int64_t j0 = 0; j0 < nk; j0 += BK) { /* j0: position in the keys read */
        const int bk = (int)(nk - j0 < BK ? nk - j0 : BK);
        /* a tile the window and the map hide wholly is never loaded */
        if (sparse && !sdpa__sparse_tile_sees(c, b, h, i0, i0 + at.rows_real, flash_key(keys, j0),
                                              flash_key(keys, j0 + bk - 1)))
            continue;
        load_kv(c, w, Dp, b, hk, keys, j0, bk);
        memset(w->s, 0, sizeof(float) * (size_t)rows_p * BK);
        gemm_acc(rows_p, round_up(bk, NR), (int)d->D, w->q, Dp, w->kt, BK, w->s, BK);
        if (sparse)
            sparse_mask_tile(c, w, b, h, i0, rows, keys ? keys + j0 : NULL, j0, bk);
        /* Row i sees keys j <= i0 + i + offset, i.e. the first
         * (i0 + i + offset + 1 - j0) of this tile; without a mask, all.
         * Under a key mask softmax_tile counts them in keys[]. */
        const int64_t limit0 = c->causal == SDPA_CAUSAL_NONE ? BK
                               : keys                       ? i0 + offset
                                                            : i0 + offset + 1 - j0;
        at.j0 = j0, at.kidx = keys ? keys + j0 : NULL;
        softmax_tile(w, Dp, rows, bk, limit0, c->causal != SDPA_CAUSAL_NONE, &at);
        gemm_acc(rows_p, Dp, bk, w->s, BK, w->v, Dp, w->o, Dp);
    }

    for (int r = 0; r < rows; r++)
        sdpa__store_result(c, b, i0 + r, h, w->o + (size_t)r * Dp, w->m[r], w->l[r], 0);
}

/* The descriptor (backend.c) reaches the kernel through this. */
sdpa_status sdpa__cpu_portable_run(const sdpa_backend *self, const sdpa_call *c);
sdpa_status sdpa__cpu_portable_run(const sdpa_backend *self, const sdpa_call *c)
{
    if (decode_applies(c)) /* few queries per head */
        return decode_run(self, c);
    const int threads = sdpa__pool_workers(c->pool); /* workspaces */
    const int Dp = round_up((int)c->desc.D, NR);
    /* q, kraw, kt, v, o: Dp x 64 each; s: 64 x 64; m, l: 64 each. */
    const size_t key_room = c->mask && c->mask->key ? 2 * (size_t)c->desc.Skv : 0;
    const size_t per = (size_t)5 * Dp * 64 + 64 * 64 + 2 * 64 + key_room;
    flash_job job = {c, Dp, (c->desc.Sq + BQ - 1) / BQ, NULL};
    /* tiles, then the per-thread descriptors, in the thread's scratch */
    const size_t tiles = per * (size_t)threads * sizeof(float);
    float *mem = sdpa__scratch(tiles + (size_t)threads * sizeof *job.ws);
    if (!mem)
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "cpu.portable: cannot allocate %zu bytes of tiles",
                          tiles + (size_t)threads * sizeof *job.ws);
    job.ws = (workspace *)((char *)mem + tiles);
    for (int t = 0; t < threads; t++) {
        float *p = mem + per * (size_t)t;
        workspace *w = &job.ws[t];
        w->q = p, p += (size_t)Dp * 64;
        w->kraw = p, p += (size_t)Dp * 64;
        w->kt = p, p += (size_t)Dp * 64;
        w->v = p, p += (size_t)Dp * 64;
        w->o = p, p += (size_t)Dp * 64;
        w->s = p, p += 64 * 64;
        w->m = p, p += 64;
        w->l = p, p += 64;
        w->keys = key_room ? (int64_t *)p : NULL;
    }
    sdpa__parallel_for(c->pool, c->desc.B * c->desc.Hq * job.n_qblocks, portable_task, &job);
    sdpa__scratch_release(mem);
    return SDPA_OK;
}
