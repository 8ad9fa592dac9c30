/*
 * flash_amx.c - cpu.amx: flash attention with both products on AMX tiles
 * (TDPBF16PS: bf16 inputs, fp32 accumulation) and the online softmax in
 * fp32 AVX-512. bf16 inputs are used as they are, f16 inputs are rounded
 * to bf16 when loaded; f32 inputs are not taken (that would be a silent
 * loss of 16 mantissa bits: cpu.avx512 serves them).
 *
 * Blocking, for one block of BQ = 32 queries and BK = 128 keys:
 *
 *     S [32][BK]  = Q [32][Dp] . K^T          tiles: 2 x 2 C, 2 A, 2 B
 *     P = exp(S*scale - m)  in fp32, rounded to bf16 for the second product
 *     O [32][Dp] = O * alpha + P [32][BK] . V  (O loaded as C, 2 x 2 at a time)
 *
 * Dp is D rounded up to 32 (one A tile row holds 32 bf16); the pad columns
 * of Q and K are zero, so they add nothing to S, and the pad columns of O
 * are never stored. Keys past the end of a block are zero in K and V and
 * masked to -inf in S, so they add exact zeros to P.V (zero V, not
 * whatever memory held, because 0 * NaN is NaN).
 *
 * Packing, once per (task, KV block) and shared by the query blocks of the
 * task: K into B tiles of the first product, where B row r holds, for 16
 * keys, the pairs (d = 2r, 2r+1) of a 32-wide slice of the head dim; V into
 * B tiles of the second, where row r holds, for 16 head-dim columns, the
 * pairs (key 2r, 2r+1) of a 32-key chunk. Q rows are A tiles as they are.
 *
 * The softmax is where the time goes: the two products cost 2 x 32 x 128 x
 * Dp MACs per block in 16 x 16 x 32 steps (~32 cycles per step at Dp = 128
 * on two tile units' worth), while the exp, max and sum touch each of the
 * 32 x 128 scores in 16-lane vectors. So the exp here is the shortest that
 * is accurate enough: P is rounded to bf16 (relative error up to 2^-8 = 3.9e-3)
 * anyway, and a degree-3 polynomial for 2^f on [-1/2, 1/2] has relative
 * error 7.5e-5. m, the running max, is kept in log2 units.
 *
 * Accuracy against ref: |out - ref| <= 2^-8 max|v| from rounding P (in
 * practice far less: the errors have random signs), plus the rounding of
 * f16 inputs to bf16 (2^-8 relative per element of Q, K and V). The README
 * states what the test grid measures.
 *
 * Threads: tasks over (batch, head, group of query blocks) as in
 * flash_tiled.h. Each task configures the tiles on its own thread (the
 * tile state is per thread) and releases them at the end, so a worker that
 * goes back to the pool does not carry 8 KiB of tile state.
 *
 * This file is compiled twice: with the instructions for the library
 * (AMX_RUN_SYMBOL = sdpa__cpu_amx_run, reached from backend.c) and with
 * SDPA_AMX_EMULATE for the tests (amx_tiles.h, tests/backends/amx_emulated.c).
 */
#include "amx_tiles.h"

#include "../../core/convert.h"
#include "../../core/backend.h"
#include "../flash_tasks.h"

#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#ifndef AMX_RUN_SYMBOL
#define AMX_RUN_SYMBOL sdpa__cpu_amx_run
#endif

#define BQ 32
#define BK 128
#define LOG2E 1.44269504088896341f

typedef struct amx_qblock {
    uint16_t *q;   /* [BQ][Dp] bf16, A tiles           */
    float *o;      /* [BQ][Dp] accumulator, C tiles    */
    float *m, *l;  /* [BQ] running max (log2 units), sum */
} amx_qblock;

typedef struct amx_workspace {
    amx_qblock *qb;
    float *s;      /* [BQ][BK] scores                   */
    uint16_t *p;   /* [BQ][BK] bf16 probabilities       */
    uint16_t *k;   /* [BK/16][Dp/32] B tiles of 512 bf16 */
    uint16_t *v;   /* [BK/32][Dp/16] B tiles of 512 bf16 */
    uint16_t *row; /* [Dp] scratch                      */
    float *frow;   /* [Dp] scratch                      */
    int64_t *keys; /* [Skv] visible keys under a key mask, else NULL */
} amx_workspace;

typedef struct amx_job {
    const sdpa_call *c;
    int64_t Dp;
    flash_split split;
    amx_workspace *ws;
    float scale_log2; /* scale * log2(e) */
} amx_job;

static const void *row_ptr(const sdpa_tensor *t, int64_t b, int64_t s, int64_t h)
{
    return sdpa__elem(t, sdpa__offset(t, b, s, h, 0));
}

static void load_q(const amx_job *jb, const amx_qblock *qb, int64_t b, int64_t h, int64_t i0,
                   int rows)
{
    const sdpa_call *c = jb->c;
    const int64_t D = c->desc.D, Dp = jb->Dp;
    memset(qb->q, 0, sizeof(uint16_t) * (size_t)(BQ * Dp));
    for (int r = 0; r < rows; r++)
        sdpa__load_row_bf16(row_ptr(c->q, b, i0 + r, h), c->q->dtype, c->q->stride[3], D,
                            qb->q + r * Dp);
    memset(qb->o, 0, sizeof(float) * (size_t)(BQ * Dp));
    for (int r = 0; r < BQ; r++)
        qb->m[r] = -INFINITY, qb->l[r] = 0.0f;
}

/* K rows of keys flash_key(idx, p0 + j), j < bk, into first-product B
 * tiles, V rows into second-product B tiles; keys bk .. bkp (the pad to
 * 32) are zero. */
static void pack_kv(const amx_job *jb, const amx_workspace *w, int64_t b, int64_t hk,
                    const int64_t *idx, int64_t p0, int bk, int bkp)
{
    const sdpa_call *c = jb->c;
    const int64_t D = c->desc.D, Dp = jb->Dp;
    const int64_t kchunks = Dp / 32, vgroups = Dp / 16;
    memset(w->k, 0, sizeof(uint16_t) * (size_t)(bkp * Dp));
    memset(w->v, 0, sizeof(uint16_t) * (size_t)(bkp * Dp));
    for (int j = 0; j < bk; j++) {
        /* K: tile (g = j / 16, chunk), row r = (d % 32) / 2, column j % 16, half d % 2 */
        const int64_t kj = flash_key(idx, p0 + j);
        sdpa__load_row_bf16(row_ptr(c->k, b, kj, hk), c->k->dtype, c->k->stride[3], D, w->row);
        uint16_t *kt = w->k + (int64_t)(j / 16) * kchunks * 512 + (j % 16) * 2;
        for (int64_t d = 0; d < D; d++)
            kt[(d / 32) * 512 + ((d % 32) / 2) * 32 + (d % 2)] = w->row[d];
        /* V: tile (chunk = j / 32, group = d / 16), row r = (j % 32) / 2,
         * column d % 16, half j % 2 */
        sdpa__load_row_bf16(row_ptr(c->v, b, kj, hk), c->v->dtype, c->v->stride[3], D, w->row);
        uint16_t *vt = w->v + (int64_t)(j / 32) * vgroups * 512 + ((j % 32) / 2) * 32 + (j % 2);
        for (int64_t d = 0; d < D; d++)
            vt[(d / 16) * 512 + (d % 16) * 2] = w->row[d];
    }
}

/* S = Q K^T for keys 0 .. bkp of the block, 32 keys (two B tiles) at a time.
 * Tile registers, all 16 rows x 64 bytes (amx_configure_full_tiles): C is
 * 16 x 16 fp32, A 16 x 32 bf16, B 16 pair-rows x 16 columns x 2 bf16;
 * tmm0-3 accumulate, tmm4-5 hold A, tmm6-7 hold B (both products). */
static void scores(const amx_job *jb, const amx_workspace *w, const amx_qblock *qb, int bkp)
{
    const int64_t Dp = jb->Dp, kchunks = Dp / 32;
    for (int g = 0; g < bkp / 16; g += 2) {
        TILE_ZERO(0);
        TILE_ZERO(1);
        TILE_ZERO(2);
        TILE_ZERO(3);
        for (int64_t ch = 0; ch < kchunks; ch++) {
            TILE_LOAD(4, qb->q + ch * 32, Dp * 2);
            TILE_LOAD(5, qb->q + 16 * Dp + ch * 32, Dp * 2);
            TILE_LOAD(6, w->k + (g * kchunks + ch) * 512, 64);
            TILE_LOAD(7, w->k + ((g + 1) * kchunks + ch) * 512, 64);
            TILE_DPBF16PS(0, 4, 6);
            TILE_DPBF16PS(1, 4, 7);
            TILE_DPBF16PS(2, 5, 6);
            TILE_DPBF16PS(3, 5, 7);
        }
        float *s = w->s + g * 16;
        TILE_STORE(0, s, BK * 4);
        TILE_STORE(1, s + 16, BK * 4);
        TILE_STORE(2, s + 16 * BK, BK * 4);
        TILE_STORE(3, s + 16 * BK + 16, BK * 4);
    }
}

/* O = O + P V for the keys 0 .. bkp of the block (O already rescaled). */
static void accumulate(const amx_job *jb, const amx_workspace *w, const amx_qblock *qb, int bkp)
{
    const int64_t Dp = jb->Dp, vgroups = Dp / 16;
    for (int64_t g = 0; g < vgroups; g += 2) {
        float *o = qb->o + g * 16;
        TILE_LOAD(0, o, Dp * 4);
        TILE_LOAD(1, o + 16, Dp * 4);
        TILE_LOAD(2, o + 16 * Dp, Dp * 4);
        TILE_LOAD(3, o + 16 * Dp + 16, Dp * 4);
        for (int ch = 0; ch < bkp / 32; ch++) {
            TILE_LOAD(4, w->p + ch * 32, BK * 2);
            TILE_LOAD(5, w->p + 16 * BK + ch * 32, BK * 2);
            TILE_LOAD(6, w->v + (ch * vgroups + g) * 512, 64);
            TILE_LOAD(7, w->v + (ch * vgroups + g + 1) * 512, 64);
            TILE_DPBF16PS(0, 4, 6);
            TILE_DPBF16PS(1, 4, 7);
            TILE_DPBF16PS(2, 5, 6);
            TILE_DPBF16PS(3, 5, 7);
        }
        TILE_STORE(0, o, Dp * 4);
        TILE_STORE(1, o + 16, Dp * 4);
        TILE_STORE(2, o + 16 * Dp, Dp * 4);
        TILE_STORE(3, o + 16 * Dp + 16, Dp * 4);
    }
}

/* 2^x for x <= 0: 2^n * p(f), f = x - round(x), p of degree 3 (relative
 * error 7.5e-5). x <= -160 gives exactly 0, so -inf (masked) adds nothing. */
static inline __m512 exp2_bf16_accurate(__m512 x)
{
    x = _mm512_max_ps(_mm512_set1_ps(-160.0f), x); /* x second: NaN stays NaN */
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(0.0551716648f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.242611125f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.693260968f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.999928057f));
    return _mm512_scalef_ps(p, n);
}

/*
 * The general mask (sdpa.h) on row r's scores s[0..bk), in log2 units of
 * scaled scores: a hidden key gets -inf, an additive entry is added times
 * log2(e). kidx lists the block's key numbers (NULL: j0 + j).
 */
static void mask_general_row(const sdpa_mask *mk, int64_t b, int64_t h, int64_t i,
                             const int64_t *kidx, int64_t j0, float *s, int bk)
{
    for (int j = 0; j < bk; j++) {
        const int64_t at = sdpa__mask_at(mk, b, h, i, kidx ? kidx[j] : j0 + j);
        if (mk->general_type == SDPA_MASK_BOOL) {
            if (!((const uint8_t *)mk->general)[at])
                s[j] = -INFINITY;
        } else {
            const float add = sdpa__load_f32(mk->general, mk->general_dtype, at);
            s[j] = add == -INFINITY ? -INFINITY : s[j] + add * LOG2E;
        }
    }
}

/* Where a block sits, for the masks: batch, head, first query, its real
 * rows (the rest are past Sq) and the key numbers of its columns (kidx, or
 * j0 + j when NULL). */
typedef struct amx_block_at {
    int64_t b, h, i0, j0;
    int rows;
    const int64_t *kidx;
    int causal;
    int64_t offset;
} amx_block_at;

/*
 * Online softmax over the block's scores: masks keys past bk, the causal
 * triangle and the general mask, updates m and l, writes P as bf16 and
 * rescales O. Key j of the block is masked for query row r when j >= bk or
 * its key number exceeds i0 + r + offset (causal only).
 */
static void softmax(const amx_job *jb, const amx_workspace *w, const amx_qblock *qb, int bk,
                    int bkp, const amx_block_at *at)
{
    const int64_t i0 = at->i0, j0 = at->j0, offset = at->offset;
    const int causal = at->causal;
    const sdpa_mask *mk = jb->c->mask && jb->c->mask->general ? jb->c->mask : NULL;
    int64_t seen = 0; /* with kidx: keys of the block visible to row r (ascending in r) */
    const int64_t Dp = jb->Dp;
    const __m512 sc = _mm512_set1_ps(jb->scale_log2);
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    for (int r = 0; r < BQ; r++) {
        float *s = w->s + r * BK;
        /* keys visible to this row: j < limit */
        int64_t limit = bk;
        if (causal && at->kidx) {
            while (seen < bk && at->kidx[seen] <= i0 + r + offset)
                seen++;
            limit = seen;
        } else if (causal) {
            const int64_t last = i0 + r + offset - j0; /* last visible key, block-relative */
            limit = last + 1 < limit ? (last + 1 < 0 ? 0 : last + 1) : limit;
        }
        __m512 mx = ninf;
        for (int j = 0; j < bkp; j += 16) {
            const __mmask16 keep =
                _mm512_cmplt_epi32_mask(_mm512_add_epi32(lane, _mm512_set1_epi32(j)),
                                        _mm512_set1_epi32((int)limit));
            const __m512 t = _mm512_mask_mul_ps(ninf, keep, _mm512_loadu_ps(s + j), sc);
            _mm512_storeu_ps(s + j, t);
            mx = _mm512_max_ps(mx, t);
        }
        if (mk && limit > 0 && r < at->rows) { /* only calls with a general mask */
            mask_general_row(mk, at->b, at->h, i0 + r, at->kidx, j0, s, (int)limit);
            mx = ninf;
            for (int j = 0; j < bkp; j += 16)
                mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + j));
        }
        const float m_old = qb->m[r];
        float m_new = _mm512_reduce_max_ps(mx);
        m_new = m_new > m_old ? m_new : m_old;
        /* A row that has seen no key yet keeps m = -inf; subtracting 0
         * instead keeps 2^(-inf) = 0 rather than NaN. */
        const float mu = m_new == -INFINITY ? 0.0f : m_new;
        const __m512 mv = _mm512_set1_ps(mu);
        __m512 sum = _mm512_setzero_ps();
        uint16_t *p = w->p + r * BK;
        for (int j = 0; j < bkp; j += 32) {
            const __m512 e0 = exp2_bf16_accurate(_mm512_sub_ps(_mm512_loadu_ps(s + j), mv));
            const __m512 e1 = exp2_bf16_accurate(_mm512_sub_ps(_mm512_loadu_ps(s + j + 16), mv));
            sum = _mm512_add_ps(sum, _mm512_add_ps(e0, e1));
            const __m512bh pb = _mm512_cvtne2ps_pbh(e1, e0); /* e0 in the low half */
            _mm512_storeu_si512(p + j, (__m512i)pb);
        }
        const float alpha = exp2f(m_old - mu); /* m_old = -inf: 0 */
        qb->l[r] = qb->l[r] * alpha + _mm512_reduce_add_ps(sum);
        qb->m[r] = m_new;
        if (alpha != 1.0f) {
            float *o = qb->o + r * Dp;
            const __m512 av = _mm512_set1_ps(alpha);
            for (int64_t d = 0; d < Dp; d += 16)
                _mm512_storeu_ps(o + d, _mm512_mul_ps(_mm512_loadu_ps(o + d), av));
        }
    }
}

/* Rows at or past len_q are padding (sdpa.h): zeros and LSE -inf, l = 0. */
static void store_out(const amx_job *jb, const amx_workspace *w, const amx_qblock *qb,
                      int64_t b, int64_t h, int64_t i0, int rows, int64_t len_q)
{
    const int64_t Dp = jb->Dp;
    for (int r = 0; r < rows; r++) {
        memcpy(w->frow, qb->o + r * Dp, sizeof(float) * (size_t)jb->c->desc.D);
        /* m is in log2 units of scaled scores; LSE wants natural units */
        sdpa__store_result(jb->c, b, i0 + r, h, w->frow, qb->m[r] / LOG2E,
                           i0 + r < len_q ? qb->l[r] : 0.0f, 0);
    }
}

static void amx_task(void *arg, int64_t task, int worker)
{
    const amx_job *jb = arg;
    const sdpa_call_desc *d = &jb->c->desc;
    const amx_workspace *w = &jb->ws[worker];
    const flash_task tk = flash_task_make(jb->c, &jb->split, BQ, task);
    amx_configure_full_tiles();
    for (int q = 0; q < tk.nqb; q++) {
        const int64_t i0 = tk.i_first + (int64_t)q * BQ;
        load_q(jb, &w->qb[q], tk.b, tk.h, i0, flash_block_rows(d->Sq, i0, BQ));
    }
    /* Masks as in flash_tiled.h: lengths bound the task, a key mask is
     * gathered (keys[p] is the p-th key read), a general mask is read in
     * the softmax, padding rows are stored as zeros. */
    const int64_t nk = flash_task_keys(jb->c, &tk, w->keys);
    const int64_t *keys = jb->c->mask && jb->c->mask->key ? w->keys : NULL;
    for (int64_t p0 = 0; p0 < nk; p0 += BK) {
        const int bk = (int)(nk - p0 < BK ? nk - p0 : BK);
        const int bkp = (bk + 31) / 32 * 32;
        pack_kv(jb, w, tk.b, tk.hk, keys, p0, bk, bkp);
        for (int q = 0; q < tk.nqb; q++) {
            const amx_qblock *qb = &w->qb[q];
            const int64_t i0 = tk.i_first + (int64_t)q * BQ;
            if (tk.causal && flash_key(keys, p0) > i0 + BQ - 1 + tk.offset)
                continue; /* this query block sees none of these keys */
            const amx_block_at at = {tk.b,          tk.h,      i0,       p0,
                                     flash_block_rows(d->Sq, i0, BQ), keys ? keys + p0 : NULL,
                                     tk.causal,     tk.offset};
            scores(jb, w, qb, bkp);
            softmax(jb, w, qb, bk, bkp, &at);
            accumulate(jb, w, qb, bkp);
        }
    }
    TILE_RELEASE();
    for (int q = 0; q < tk.nqb; q++) {
        const int64_t i0 = tk.i_first + (int64_t)q * BQ;
        store_out(jb, w, &w->qb[q], tk.b, tk.h, i0, flash_block_rows(d->Sq, i0, BQ), tk.len_q);
    }
}

static sdpa_status amx_run(const sdpa_backend *self, const sdpa_call *c)
{
    (void)self;
    const sdpa_call_desc *d = &c->desc;
    const int threads = sdpa__pool_threads(c->pool);
    amx_job jb = {c, (d->D + 31) / 32 * 32, flash_split_make(d, BQ, threads, 0, 4, 4), NULL,
                  (float)(c->scale * LOG2E)};
    const int64_t Dp = jb.Dp, heads = d->B * d->Hq;
    /* bytes per thread, each piece rounded to 64 for aligned tile rows */
#define R64(x) (((size_t)(x) + 63) / 64 * 64)
    const size_t per_qb = R64(BQ * Dp * 2) + R64(BQ * Dp * 4) + 2 * R64(BQ * 4);
    const size_t per = per_qb * (size_t)jb.split.qb_per_task + R64(BQ * BK * 4) + R64(BQ * BK * 2) +
                       2 * R64(BK * Dp * 2) + R64(Dp * 2) + R64(Dp * 4) +
                       (c->mask && c->mask->key ? R64(d->Skv * 8) : 0);
    /* tiles, then the per-thread descriptors, in the thread's scratch */
    const size_t tiles = per * (size_t)threads, descs = R64((size_t)threads * sizeof *jb.ws);
    const size_t n_qbs = (size_t)threads * (size_t)jb.split.qb_per_task;
    char *mem = sdpa__scratch(tiles + descs + n_qbs * sizeof(amx_qblock));
    if (!mem)
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes of tiles",
                          self->name, tiles + descs + n_qbs * sizeof(amx_qblock));
    jb.ws = (amx_workspace *)(mem + tiles);
    amx_qblock *qbs = (amx_qblock *)(mem + tiles + descs);
    for (int t = 0; t < threads; t++) {
        char *p = mem + per * (size_t)t;
        amx_workspace *w = &jb.ws[t];
        w->qb = qbs + (size_t)t * (size_t)jb.split.qb_per_task;
        for (int q = 0; q < jb.split.qb_per_task; q++) {
            w->qb[q].q = (uint16_t *)p, p += R64(BQ * Dp * 2);
            w->qb[q].o = (float *)p, p += R64(BQ * Dp * 4);
            w->qb[q].m = (float *)p, p += R64(BQ * 4);
            w->qb[q].l = (float *)p, p += R64(BQ * 4);
        }
        w->s = (float *)p, p += R64(BQ * BK * 4);
        w->p = (uint16_t *)p, p += R64(BQ * BK * 2);
        w->k = (uint16_t *)p, p += R64(BK * Dp * 2);
        w->v = (uint16_t *)p, p += R64(BK * Dp * 2);
        w->row = (uint16_t *)p, p += R64(Dp * 2);
        w->frow = (float *)p, p += R64(Dp * 4);
        w->keys = c->mask && c->mask->key ? (int64_t *)p : NULL;
    }
#undef R64
    sdpa__parallel_for(c->pool, heads * jb.split.tasks_per_head, amx_task, &jb);
    sdpa__scratch_release(mem);
    return SDPA_OK;
}

/* The descriptor (backend.c, or the tests' emulated one) reaches the kernel
 * through this. */
sdpa_status AMX_RUN_SYMBOL(const sdpa_backend *self, const sdpa_call *call);
sdpa_status AMX_RUN_SYMBOL(const sdpa_backend *self, const sdpa_call *call)
{
    return amx_run(self, call);
}

#ifndef SDPA_AMX_EMULATE
/*
 * The first use on a machine checks one tile product against the scalar
 * definition: the kernel above has been run on emulated tiles by the tests,
 * and this ties the instructions to that emulation on the machine itself
 * (and proves the tile permission holds on this thread).
 */
static int amx_selftest_ok;
static pthread_once_t amx_selftest_once = PTHREAD_ONCE_INIT;

static void amx_selftest(void)
{
    static uint16_t a[16 * 32] __attribute__((aligned(64)));
    static uint16_t b[16 * 32] __attribute__((aligned(64)));
    static float c[16 * 16] __attribute__((aligned(64)));
    for (int i = 0; i < 16 * 32; i++) { /* small integers: exact in bf16 and fp32 */
        a[i] = sdpa__f32_to_bf16((float)((i * 7) % 11 - 5));
        b[i] = sdpa__f32_to_bf16((float)((i * 5) % 13 - 6));
    }
    amx_configure_full_tiles();
    TILE_ZERO(0);
    TILE_LOAD(4, a, 64);
    TILE_LOAD(6, b, 64);
    TILE_DPBF16PS(0, 4, 6);
    TILE_STORE(0, c, 64);
    TILE_RELEASE();
    int ok = 1;
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            float want = 0;
            for (int k = 0; k < 32; k++) /* A[m][k] * B[k/2][n][k%2] */
                want += sdpa__bf16_to_f32(a[m * 32 + k]) *
                        sdpa__bf16_to_f32(b[(k / 2) * 32 + n * 2 + k % 2]);
            ok &= c[m * 16 + n] == want;
        }
    amx_selftest_ok = ok;
}

/* Runs the self-test once per process (call only where AMX is usable). */
int sdpa__cpu_amx_selftest(void);
int sdpa__cpu_amx_selftest(void)
{
    pthread_once(&amx_selftest_once, amx_selftest);
    return amx_selftest_ok;
}
#endif
