/*
 * backward_amx.h - cpu.amx's backward pass: ../flash_backward.h (the
 * split, masks, the softmax recomputed in fp32, the stores: the vector
 * kernels' framework) with its five products on tiles, TDPBF16PS on bf16
 * operands with fp32 sums. flash_amx.c includes it at its end, then the
 * framework, which calls the bwd_tiles_* functions below (as the forward
 * framework calls an ISA file's micro-kernel): it is built the ways that
 * file is (the instructions, emulated tiles for the tests) and shares its
 * per-thread tile configuration.
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

/* One worker's bf16 operands, each laid out once where it is made (the
 * framework keeps them in its bwd_work, in the room bwd_tiles_floats
 * asks for). Row buffers hold BWD_BQ rows more than the task's, zero:
 * a block's products read 32 rows from its first. */
typedef struct bwd_tiles {
    uint16_t *qb, *db;   /* [rs][Dt]   q (unscaled), dO rows (A of S, dP)       */
    uint16_t *qt, *dt;   /* [Dp][rs]   qs^T, dO^T (A of dK^T, dV^T)             */
    uint16_t *ktp, *vtp; /* [Dt/2][BK][2] K^T, V^T, pairs of head dims (B of S, dP) */
    uint16_t *kp;        /* [BK/2][Dp][2] K, pairs of keys (B of dQ)            */
    uint16_t *pp, *dsp;  /* [BQ/2][BK][2] P, dS, pairs of rows (B of dV^T, dK^T) */
    uint16_t *dsr;       /* [BQ][BK]   dS rows (A of dQ)                        */
    int64_t Dt, rs;      /* D rounded up to 32; the task's rows + BWD_BQ, even  */
} bwd_tiles;

/* rs even: qt and dt are written two rows (a 32-bit word) at a time */
static int64_t bwd_tiles_dt(int64_t D) { return (D + 31) / 32 * 32; }
static int64_t bwd_tiles_rs(int64_t rows) { return (rows + BWD_BQ + 1) / 2 * 2; }

/* Floats of room for the operands of tasks of up to `rows` rows (two
 * bf16 to a float, and 64 to spare for the alignment of what follows). */
static size_t bwd_tiles_floats(int64_t D, int64_t Dp, int64_t rows)
{
    const int64_t Dt = bwd_tiles_dt(D), rs = bwd_tiles_rs(rows);
    return (size_t)(rs * Dt + rs * Dp + Dt * BWD_BK + BWD_BK * Dp / 2 +
                    3 * BWD_BQ * BWD_BK / 2 + 64);
}

/* The operands laid out in that room, from p. */
static void bwd_tiles_lay(bwd_tiles *t, float *p, int64_t D, int64_t Dp, int64_t rows)
{
    const int64_t Dt = bwd_tiles_dt(D), rs = bwd_tiles_rs(rows);
    uint16_t *h = (uint16_t *)p;
    t->Dt = Dt, t->rs = rs;
    t->qb = h, h += rs * Dt;
    t->db = h, h += rs * Dt;
    t->qt = h, h += Dp * rs;
    t->dt = h, h += Dp * rs;
    t->ktp = h, h += Dt * BWD_BK;
    t->vtp = h, h += Dt * BWD_BK;
    t->kp = h, h += BWD_BK * Dp;
    t->pp = h, h += BWD_BQ * BWD_BK;
    t->dsp = h, h += BWD_BQ * BWD_BK;
    t->dsr = h;
}

/* Before a task's n rows are packed: the row buffers' padding rows are
 * read by the products, so zeros (P and dS are 0 there). */
static void bwd_tiles_clear_rows(const bwd_tiles *t, int64_t n, int64_t Dp)
{
    memset(t->qb, 0, sizeof(uint16_t) * (size_t)((n + BWD_BQ) * t->Dt));
    memset(t->db, 0, sizeof(uint16_t) * (size_t)((n + BWD_BQ) * t->Dt));
    memset(t->qt, 0, sizeof(uint16_t) * (size_t)(2 * Dp * t->rs)); /* qt, then dt */
}

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

/* Row rr of the task (qs, dout: Dp floats) as bf16 rows. */
static void bwd_tiles_pack_row(const bwd_tiles *t, int64_t rr, const float *qs,
                               const float *dout, int64_t Dp)
{
    bwd_tiles_round(qs, t->qb + rr * t->Dt, Dp);
    bwd_tiles_round(dout, t->db + rr * t->Dt, Dp);
}

/* qt, dt from the task's n bf16 rows (zero where a row is padding): two
 * rows at a time, the pair of a head dim as one 32-bit word scattered to
 * its column (rs even): 16 words per VPSCATTERDD, where a column of 2-byte
 * stores was a tenth of a single-head call's time (perf). */
static void bwd_tiles_transpose_rows(const bwd_tiles *t, int64_t n, int64_t Dp)
{
    const int64_t half = t->rs / 2;
    const __m512i lane = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6,
                                                             5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32((int)half));
    for (int g = 0; g < 2; g++) {
        const uint16_t *rows = g ? t->db : t->qb;
        uint32_t *col = (uint32_t *)(g ? t->dt : t->qt);
        for (int64_t rr = 0; rr < n; rr += 2) { /* row n (n odd): a zero row of the pad */
            const uint16_t *r0 = rows + rr * t->Dt, *r1 = r0 + t->Dt;
            for (int64_t e = 0; e < Dp; e += 16) {
                const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r0 + e)));
                const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r1 + e)));
                _mm512_i32scatter_epi32(col + e * half + rr / 2, lane,
                                        _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)), 4);
            }
        }
    }
}

/* A key block's operands from its f32 copies: K^T and V^T ([D][BK]) and
 * K's bk rows (kr: rows of Dp). */
static void bwd_tiles_pack_keys(const bwd_tiles *t, const float *kt, const float *vt,
                                const float *kr, int bk, int64_t D, int64_t Dp)
{
    for (int64_t p = 0; p < t->Dt / 2; p++) { /* head dims 2p, 2p + 1 of every key */
        const float *k0 = 2 * p < D ? kt + 2 * p * BWD_BK : NULL;
        const float *k1 = 2 * p + 1 < D ? kt + (2 * p + 1) * BWD_BK : NULL;
        const float *v0 = 2 * p < D ? vt + 2 * p * BWD_BK : NULL;
        const float *v1 = 2 * p + 1 < D ? vt + (2 * p + 1) * BWD_BK : NULL;
        bwd_tiles_pairs(k0, k1, t->ktp + p * 2 * BWD_BK, BWD_BK, 1.0f);
        bwd_tiles_pairs(v0, v1, t->vtp + p * 2 * BWD_BK, BWD_BK, 1.0f);
    }
    for (int j = 0; j < BWD_BK; j += 2) /* keys j, j + 1 (pad keys: zeros) */
        bwd_tiles_pairs(j < bk ? kr + j * Dp : NULL, j + 1 < bk ? kr + (j + 1) * Dp : NULL,
                        t->kp + j * Dp, Dp, 1.0f);
}

/* S (times the scale, in fp32) and dP of rows r0 .. r0 + BQ - 1 against
 * the block's first kc keys, into s and dp ([BQ][BK]), 32 rows x 32 keys
 * at a time: C tiles 0-3 (two row halves x two key halves), A tiles 4-5,
 * B tiles 6-7. */
static void bwd_tiles_scores(const bwd_tiles *t, float *s, float *dp, int64_t r0, int kc,
                             float scale)
{
    const int64_t Dt = t->Dt;
    for (int pass = 0; pass < 2; pass++)
        for (int rb = 0; rb < BWD_BQ; rb += 32)
            for (int kb = 0; kb < kc; kb += 32) {
                const uint16_t *a = (pass ? t->db : t->qb) + (r0 + rb) * Dt;
                const uint16_t *b = (pass ? t->vtp : t->ktp) + 2 * kb;
                float *out = (pass ? dp : s) + rb * BWD_BK + kb;
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
            _mm512_storeu_ps(s + r * BWD_BK + j,
                             _mm512_mul_ps(_mm512_loadu_ps(s + r * BWD_BK + j), sc));
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

/* The block's gradients from P (s) and dS (dp) of its nr rows: dV^T and
 * dK^T ([Dp][BK]) and dQ at dq (rows of Dp), each added to. */
static void bwd_tiles_grads(const bwd_tiles *t, const float *s, const float *dp, float *dvt,
                            float *dkt, int64_t Dp, int64_t r0, int nr, int kc, float *dq,
                            float scale)
{
    /* P and dS as bf16: pairs of rows (dS times the scale: q is not), and
     * dS's rows; rows past nr zero, so that the products add nothing */
    for (int r = 0; r < BWD_BQ; r += 2) {
        const float *p0 = r < nr ? s + r * BWD_BK : NULL;
        const float *p1 = r + 1 < nr ? s + (r + 1) * BWD_BK : NULL;
        const float *s0 = r < nr ? dp + r * BWD_BK : NULL;
        const float *s1 = r + 1 < nr ? dp + (r + 1) * BWD_BK : NULL;
        bwd_tiles_pairs(p0, p1, t->pp + r * BWD_BK, kc, 1.0f);
        bwd_tiles_pairs(s0, s1, t->dsp + r * BWD_BK, kc, scale);
    }
    for (int r = 0; r < BWD_BQ; r++) {
        if (r < nr)
            bwd_tiles_round(dp + r * BWD_BK, t->dsr + r * BWD_BK, kc);
        else
            memset(t->dsr + r * BWD_BK, 0, sizeof(uint16_t) * (size_t)kc);
    }
    bwd_tiles_keys_grad(t->dt, t->rs, r0, t->pp, dvt, Dp, kc);
    bwd_tiles_keys_grad(t->qt, t->rs, r0, t->dsp, dkt, Dp, kc);
    /* dQ [BQ][Dp] += dS [BQ][kc] . K, per 32 rows and 16 head dims: C tiles
     * 0-1 (row halves) loaded once for all kc keys, A tiles 4-5 (dS rows,
     * 32 keys) and B tile 6 (pairs of keys x 16 head dims) per 32 keys */
    for (int rb = 0; rb < BWD_BQ; rb += 32) {
        const uint16_t *a = t->dsr + rb * BWD_BK;
        float *q0 = dq + (r0 + rb) * Dp, *q1 = q0 + 16 * Dp;
        for (int64_t d0 = 0; d0 < Dp; d0 += 16) {
            TILE_LOAD(0, q0 + d0, Dp * 4);
            TILE_LOAD(1, q1 + d0, Dp * 4);
            for (int kb = 0; kb < kc; kb += 32) {
                TILE_LOAD(4, a + kb, BWD_BK * 2);
                TILE_LOAD(5, a + 16 * BWD_BK + kb, BWD_BK * 2);
                TILE_LOAD(6, t->kp + kb * Dp + 2 * d0, Dp * 4); /* pair rows kb / 2 on */
                TILE_DPBF16PS(0, 4, 6);
                TILE_DPBF16PS(1, 5, 6);
            }
            TILE_STORE(0, q0 + d0, Dp * 4);
            TILE_STORE(1, q1 + d0, Dp * 4);
        }
    }
}
