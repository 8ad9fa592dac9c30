/*
 * backward_amx.h - cpu.amx's backward pass: ../flash_backward.h (the
 * split, masks, the softmax recomputed in fp32, the stores: the vector
 * kernels' framework) with its five products on tiles, TDPBF16PS on bf16
 * operands with fp32 sums. Included at the end of flash_amx.c, so it is
 * built the three ways that file is (the instructions, emulated tiles for
 * the tests, no tiles) and shares its per-thread tile configuration.
 *
 * One block of BQ = 64 query rows r against BK = 256 keys j (D' = D rounded
 * up to 32 for the reductions over head dims, Dp up to 16 for their
 * columns; a block short of keys runs only its keys rounded up to 32):
 *
 *     S  [BQ][BK]  = q . K^T      A: q rows (bf16)    B: K^T, pairs of head dims
 *     dP [BQ][BK]  = dO . V^T     A: dO rows          B: V^T, pairs of head dims
 *     P, dS in fp32 (flash_backward.h), then rounded to bf16
 *     dV^T [Dp][BK] += dO^T . P   A: dO^T (16 dims x 32 rows)   B: P, pairs of rows
 *     dK^T [Dp][BK] += q^T . c dS A: q^T                        B: c dS, pairs of rows
 *     dQ  [BQ][Dp] += dS . K      A: dS rows                    B: K, pairs of keys
 *
 * Every operand is laid out once where it is made: a task's rows as bf16
 * rows and as their transpose (q^T, dO^T), a key block's K^T and V^T as
 * pairs of head dims and K as pairs of keys, a block's P and dS as pairs
 * of rows: none is rearranged inside the products. The accumulators (dV^T,
 * dK^T of the key block, the task's dQ) are C tiles loaded and stored
 * around each block's products, in fp32: 64 rows serve each dV^T and dK^T
 * tile's load and store, 256 keys each dQ tile's. Why these sizes: with
 * 32 x 32 blocks every key block swept the task's rows (Q, dO, their
 * transposes, dQ: 8 MB at 4,096 rows, beyond L2) per 32 keys, and the
 * tiles waited on it: 548-575 GFLOP/s against 700 with 64 x 256 on 4,096
 * tokens, 2 heads, D 128 (Emerald Rapids, 2 cores; results.md).
 *
 * (c: the scale, applied to S in fp32 and to dS before its rounding for
 * dK; q is rounded unscaled, so bf16 inputs reach the scores exactly.)
 *
 * Accuracy: f16 inputs (q, dO, K, V), P and dS are rounded to bf16
 * (relative 2^-9 each) before their products, as the forward rounds P;
 * the sums are fp32. Same split as every flash_backward.h kernel, so the
 * gradients are the same bits for any thread count.
 */
#ifndef AMX_BACKWARD_SYMBOL
#define AMX_BACKWARD_SYMBOL sdpa__cpu_amx_backward
#endif

#define BWD_TILES 1
#ifndef BWD_BQ /* rows: 32 or 64; keys: a multiple of 32 (flash_backward.h) */
#define BWD_BQ 64
#define BWD_BK 256
#endif
#define BWD_NAME "cpu.amx"
#define BWD_TASK_START() amx_tiles_take()
#define BWD_TASK_END()                                                                       \
    do {                                                                                     \
        if (!amx_tiles_owned) /* a host's thread: it does not idle here */                  \
            amx_tiles_drop();                                                                \
    } while (0)

#include "../flash_backward.h"

/* n floats (a multiple of 16) of a and b, times mul, as bf16 pairs, word
 * i = (a[i], b[i]) (a NULL row: zeros), the VNNI layout of a B tile. */
static void bwd_tiles_pairs(const float *a, const float *b, uint16_t *dst, int64_t n, float mul)
{
    const __m512i zero = _mm512_setzero_si512();
    const __m512 m = _mm512_set1_ps(mul);
    for (int64_t i = 0; i < n; i += 16) {
        const __m512i lo =
            a ? _mm512_cvtepu16_epi32(bf16_round(_mm512_mul_ps(_mm512_loadu_ps(a + i), m))) : zero;
        const __m512i hi =
            b ? _mm512_cvtepu16_epi32(bf16_round(_mm512_mul_ps(_mm512_loadu_ps(b + i), m))) : zero;
        _mm512_storeu_si512(dst + 2 * i, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
}

/* n floats (a multiple of 16) as bf16. */
static void bwd_tiles_round(const float *src, uint16_t *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i), bf16_round(_mm512_loadu_ps(src + i)));
}

static void bwd_tiles_pack_row(const bwd_work *w, int64_t rr, const float *qs,
                               const float *dout, int64_t Dp)
{
    bwd_tiles_round(qs, w->qb + rr * w->Dt, Dp);
    bwd_tiles_round(dout, w->db + rr * w->Dt, Dp);
}

/* qt, dt from the task's n bf16 rows (zero where a row is padding): two
 * rows at a time, the pair of a head dim as one 32-bit word scattered to
 * its column (rs even): 16 words per VPSCATTERDD, where a column of 2-byte
 * stores was a tenth of a single-head call's time (perf). */
static void bwd_tiles_transpose_rows(const bwd_work *w, int64_t n, int64_t Dp)
{
    const int64_t half = w->rs / 2;
    const __m512i lane = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6,
                                                             5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32((int)half));
    for (int g = 0; g < 2; g++) {
        const uint16_t *rows = g ? w->db : w->qb;
        uint32_t *t = (uint32_t *)(g ? w->dt : w->qt);
        for (int64_t rr = 0; rr < n; rr += 2) { /* row n (n odd): a zero row of the pad */
            const uint16_t *r0 = rows + rr * w->Dt, *r1 = r0 + w->Dt;
            for (int64_t e = 0; e < Dp; e += 16) {
                const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r0 + e)));
                const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r1 + e)));
                _mm512_i32scatter_epi32(t + e * half + rr / 2, lane,
                                        _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)), 4);
            }
        }
    }
}

static void bwd_tiles_pack_keys(const bwd_work *w, int bk, int64_t D, int64_t Dp)
{
    for (int64_t p = 0; p < w->Dt / 2; p++) { /* head dims 2p, 2p + 1 of every key */
        const float *k0 = 2 * p < D ? w->kt + 2 * p * BWD_BK : NULL;
        const float *k1 = 2 * p + 1 < D ? w->kt + (2 * p + 1) * BWD_BK : NULL;
        const float *v0 = 2 * p < D ? w->vt + 2 * p * BWD_BK : NULL;
        const float *v1 = 2 * p + 1 < D ? w->vt + (2 * p + 1) * BWD_BK : NULL;
        bwd_tiles_pairs(k0, k1, w->ktp + p * 2 * BWD_BK, BWD_BK, 1.0f);
        bwd_tiles_pairs(v0, v1, w->vtp + p * 2 * BWD_BK, BWD_BK, 1.0f);
    }
    for (int j = 0; j < BWD_BK; j += 2) /* keys j, j + 1 (pad keys: zeros) */
        bwd_tiles_pairs(j < bk ? w->kr + j * Dp : NULL, j + 1 < bk ? w->kr + (j + 1) * Dp : NULL,
                        w->kp + j * Dp, Dp, 1.0f);
}

/* S (times the scale, in fp32) and dP of rows r0 .. r0 + BQ - 1 against
 * the block's first kc keys, 32 rows x 32 keys at a time: C tiles 0-3 (two
 * row halves x two key halves), A tiles 4-5, B tiles 6-7. */
static void bwd_tiles_scores(const bwd_work *w, int64_t r0, int kc, float scale)
{
    const int64_t Dt = w->Dt;
    for (int pass = 0; pass < 2; pass++)
        for (int rb = 0; rb < BWD_BQ; rb += 32)
            for (int kb = 0; kb < kc; kb += 32) {
                const uint16_t *a = (pass ? w->db : w->qb) + (r0 + rb) * Dt;
                const uint16_t *b = (pass ? w->vtp : w->ktp) + 2 * kb;
                float *out = (pass ? w->dp : w->s) + rb * BWD_BK + kb;
                TILE_ZERO(0);
                TILE_ZERO(1);
                TILE_ZERO(2);
                TILE_ZERO(3);
                for (int64_t d0 = 0; d0 < Dt; d0 += 32) { /* B row d0 / 2: 2 BK words on */
                    amx_step_2x2(a + d0, a + 16 * Dt + d0, Dt * 2, b + d0 * BWD_BK,
                                 b + d0 * BWD_BK + 32, BWD_BK * 4);
                }
                amx_store_2x2(out, BWD_BK);
            }
    const __m512 sc = _mm512_set1_ps(scale);
    for (int r = 0; r < BWD_BQ; r++)
        for (int j = 0; j < kc; j += 16)
            _mm512_storeu_ps(w->s + r * BWD_BK + j,
                             _mm512_mul_ps(_mm512_loadu_ps(w->s + r * BWD_BK + j), sc));
}

/* C[Dp][BK] += A^T . B over the block's BQ rows, the first kc keys: A^T's
 * rows (16 head dims x 32 rows from column r0 + rb, row length rs) and B's
 * pairs of rows (bp: [BQ/2][BK][2]). dV^T from dO^T and P, dK^T from q^T
 * and c dS. Per 32 keys: C tiles 0-1, the BQ / 32 row blocks' B tiles
 * (4-7) loaded once, A tiles 2-3 per 16 head dims; each C tile's load and
 * store serve BQ / 32 products. */
static void bwd_tiles_keys_grad(const uint16_t *at, int64_t rs, int64_t r0, const uint16_t *bp,
                                float *c, int64_t Dp, int kc)
{
    for (int kb = 0; kb < kc; kb += 32) {
        const uint16_t *b = bp + 2 * kb;
        TILE_LOAD(4, b, BWD_BK * 4);
        TILE_LOAD(5, b + 32, BWD_BK * 4);
#if BWD_BQ == 64 /* rows 32-63: B rows 16-31 */
        TILE_LOAD(6, b + 32 * BWD_BK, BWD_BK * 4);
        TILE_LOAD(7, b + 32 * BWD_BK + 32, BWD_BK * 4);
#endif
        for (int64_t d0 = 0; d0 < Dp; d0 += 16) {
            float *c0 = c + d0 * BWD_BK + kb;
            TILE_LOAD(0, c0, BWD_BK * 4);
            TILE_LOAD(1, c0 + 16, BWD_BK * 4);
            TILE_LOAD(2, at + d0 * rs + r0, rs * 2);
            TILE_DPBF16PS(0, 2, 4);
            TILE_DPBF16PS(1, 2, 5);
#if BWD_BQ == 64
            TILE_LOAD(3, at + d0 * rs + r0 + 32, rs * 2);
            TILE_DPBF16PS(0, 3, 6);
            TILE_DPBF16PS(1, 3, 7);
#endif
            TILE_STORE(0, c0, BWD_BK * 4);
            TILE_STORE(1, c0 + 16, BWD_BK * 4);
        }
    }
}

static void bwd_tiles_grads(const bwd_work *w, int64_t Dp, int64_t r0, int nr, int kc, float *dq,
                            float scale)
{
    /* P and dS as bf16: pairs of rows (dS times the scale: q is not), and
     * dS's rows; rows past nr zero, so that the products add nothing */
    for (int r = 0; r < BWD_BQ; r += 2) {
        const float *p0 = r < nr ? w->s + r * BWD_BK : NULL;
        const float *p1 = r + 1 < nr ? w->s + (r + 1) * BWD_BK : NULL;
        const float *s0 = r < nr ? w->dp + r * BWD_BK : NULL;
        const float *s1 = r + 1 < nr ? w->dp + (r + 1) * BWD_BK : NULL;
        bwd_tiles_pairs(p0, p1, w->pp + r * BWD_BK, kc, 1.0f);
        bwd_tiles_pairs(s0, s1, w->dsp + r * BWD_BK, kc, scale);
    }
    for (int r = 0; r < BWD_BQ; r++) {
        if (r < nr)
            bwd_tiles_round(w->dp + r * BWD_BK, w->dsr + r * BWD_BK, kc);
        else
            memset(w->dsr + r * BWD_BK, 0, sizeof(uint16_t) * (size_t)kc);
    }
    bwd_tiles_keys_grad(w->dt, w->rs, r0, w->pp, w->dvt, Dp, kc);
    bwd_tiles_keys_grad(w->qt, w->rs, r0, w->dsp, w->dkt, Dp, kc);
    /* dQ [BQ][Dp] += dS [BQ][kc] . K, per 32 rows and 16 head dims: C tiles
     * 0-1 (row halves) loaded once for all kc keys, A tiles 4-5 (dS rows,
     * 32 keys) and B tile 6 (pairs of keys x 16 head dims) per 32 keys */
    for (int rb = 0; rb < BWD_BQ; rb += 32) {
        const uint16_t *a = w->dsr + rb * BWD_BK;
        float *q0 = dq + (r0 + rb) * Dp, *q1 = q0 + 16 * Dp;
        for (int64_t d0 = 0; d0 < Dp; d0 += 16) {
            TILE_LOAD(0, q0 + d0, Dp * 4);
            TILE_LOAD(1, q1 + d0, Dp * 4);
            for (int kb = 0; kb < kc; kb += 32) {
                TILE_LOAD(4, a + kb, BWD_BK * 2);
                TILE_LOAD(5, a + 16 * BWD_BK + kb, BWD_BK * 2);
                TILE_LOAD(6, w->kp + kb * Dp + 2 * d0, Dp * 4); /* pair rows kb / 2 on */
                TILE_DPBF16PS(0, 4, 6);
                TILE_DPBF16PS(1, 5, 6);
            }
            TILE_STORE(0, q0 + d0, Dp * 4);
            TILE_STORE(1, q1 + d0, Dp * 4);
        }
    }
}

/* The descriptor (backend.c, or the tests' emulated one) reaches the
 * backward pass through this. */
sdpa_status AMX_BACKWARD_SYMBOL(const sdpa_backend *self, const sdpa_call *call);
sdpa_status AMX_BACKWARD_SYMBOL(const sdpa_backend *self, const sdpa_call *call)
{
    const sdpa_status st = tiled_backward(self, call);
    amx_tiles_drop(); /* the calling thread's; the workers' go when they idle */
    return st;
}
