/*
 * flash_avx512bf16.c - cpu.avx512bf16: the tiled framework (../flash_tiled.h)
 * in pair mode, both products on VDPBF16PS (AVX512-BF16): each lane adds a
 * two-term bf16 dot product to an fp32 accumulator, 32 multiply-adds per
 * instruction where VFMADD231PS does 16. Softmax and accumulation stay
 * fp32 (vec_avx512.h); P is rounded to bf16 for the second product, as on
 * AMX and GPU tensor cores. bf16 inputs are used as they are; f16 inputs
 * are rounded to bf16 (the default rules send only bf16 here).
 *
 * Micro-kernel 8 x 3, as cpu.avx512: eight broadcast pairs (keys for S^T,
 * head-dim elements for O^T) against three 16-query vectors of pairs.
 *
 * Few queries (at most 8 rows per KV head): the few-query path
 * (../flash_decode.h) in this file's build, bf16 calls with 2-8 rows per
 * KV head on pair products (below), the rest on fp32 products.
 *
 * For CPUs with AVX512-BF16 but no AMX (AMD Zen 4 and later, Intel Cooper
 * Lake); where AMX is usable, cpu.amx comes first.
 */
#include "../avx512/vec_avx512.h"

#include <stdint.h>
#include <string.h>

#define QV 3
#define MR 8
#define KERNEL_NAME "cpu.avx512bf16"
#define TILED_PAIRS 1
typedef uint32_t a_elem; /* two bf16: reduction index 2i (low), 2i + 1 (high) */
typedef uint32_t b_elem;
typedef __m512bh avec;
typedef __m512bh bvec;
#define A_BCAST(x) ((__m512bh)_mm512_set1_epi32((int)(x)))
#define B_LOAD(p) ((__m512bh)_mm512_loadu_si512(p))
#define V_MAC(acc, a, b) _mm512_dpbf16_ps((acc), (a), (b))

/* 16 lanes of (bf16(lo[i]), bf16(hi[i])) pairs: convert both, then
 * interleave the two halves word by word. */
#define PACK_PAIRS(dst, lo, hi)                                                                    \
    _mm512_storeu_si512((dst), _mm512_permutexvar_epi16(pair_order(),                              \
                                                        (__m512i)_mm512_cvtne2ps_pbh((hi), (lo))))

static inline __m512i pair_order(void)
{
    return _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                            22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
}

/*
 * The few-query path in pairs (../flash_decode.h, DECODE_PAIRS): bf16 Q, K
 * and V read in place, both products on VDPBF16PS, 32 head dims a step.
 * S: 16 K rows of 32 bf16 are 16 x 16 dwords (pairs of head dims), one
 * transpose puts key j's pair i in lane j of t[i], which meets row r's
 * pair i broadcast: half the transposes and half the multiply
 * instructions of fp32 products, and no widening. P V: two V rows (keys
 * 2t, 2t + 1) interleaved word by word are 32 pairs of keys, which meet
 * row r's (p_2t, p_2t+1) rounded to bf16. The interleave runs within
 * 128-bit lanes, so O is kept in that order (decode_pairs_order puts it
 * back once per row at the end); scaling by alpha and the merge of key
 * chunks are element by element and do not mind.
 */
#define DECODE_PAIRS 1
#define DECODE_PAIR_DIMS 32 /* head dims per step */

/* Pair i of p, read as bytes (the workspace holds bf16 words and vectors) */
static inline int pair_at(const uint32_t *p, int64_t i)
{
    int32_t x;
    memcpy(&x, p + i, sizeof x);
    return x;
}

/* acc[r] lane j += the pairs of head dims d .. d + part (part <= 32) of q_r
 * (qp: pairs, row r at qp + r * qs) and of key row krow[j]. */
static inline __attribute__((always_inline)) void
decode_pairs_scores(const void *const *krow, int64_t d, int part, const uint32_t *qp, int64_t qs,
                    const int nr, vec *acc)
{
    vec t[16];
    if (part == DECODE_PAIR_DIMS)
        for (int j = 0; j < 16; j++)
            t[j] = _mm512_castsi512_ps(_mm512_loadu_si512((const uint16_t *)krow[j] + d));
    else /* past D: zeros (never K's next row, which may hold NaN) */
        for (int j = 0; j < 16; j++)
            t[j] = _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(
                (__mmask32)((1ull << part) - 1), (const uint16_t *)krow[j] + d));
    transpose16(t); /* t[i] lane j: key j's pair i */
V_UNROLL_WHOLE
    for (int i = 0; i < 16; i++)
        for (int r = 0; r < nr; r++)
            acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_castps_si512(t[i]),
                                      (__m512bh)_mm512_set1_epi32(pair_at(qp, r * qs + d / 2 + i)));
}

/* 16 weights of a row as 8 bf16 pairs of consecutive keys (the low half
 * holds the even key). */
static inline void decode_pairs_round(const float *p, uint32_t *pp)
{
    _mm256_storeu_si256((__m256i *)pp, (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(p)));
}

/* Keys 2t and 2t + 1 of V (a, b: 32 bf16 of each) into every row's sums:
 * interleaved word by word, 16 pairs of keys per 128-bit lane order. */
#define DECODE_PAIRS_PV_STEP(a, b, t)                                                        \
    do {                                                                                     \
        const __m512bh lo = (__m512bh)_mm512_unpacklo_epi16((a), (b));                       \
        const __m512bh hi = (__m512bh)_mm512_unpackhi_epi16((a), (b));                       \
        for (int r = 0; r < nr; r++) {                                                       \
            const __m512bh w = (__m512bh)_mm512_set1_epi32(pair_at(pp, 8 * r + (t)));        \
            lo_acc[r] = _mm512_dpbf16_ps(lo_acc[r], lo, w);                                  \
            hi_acc[r] = _mm512_dpbf16_ps(hi_acc[r], hi, w);                                  \
        }                                                                                    \
    } while (0)

/* O_r (at o + r * os, in pair order) += sum_j p_rj v_j over head dims d ..
 * d + part: keys whose bit in `seen` is clear are read as zeros (never
 * their V, which may hold NaN or Inf). pp: row r's 8 pairs at pp + 8 r.
 * The whole step (32 dims, every key) has a loop of its own: with the
 * test inside, GCC kept the sums on the stack. */
static inline __attribute__((always_inline)) void
decode_pairs_pv(const void *const *vrow, int64_t d, int part, unsigned seen, const uint32_t *pp,
                const int nr, float *o, int64_t os)
{
    __m512 lo_acc[8], hi_acc[8];
    for (int r = 0; r < nr; r++) {
        lo_acc[r] = _mm512_loadu_ps(o + r * os + d);
        hi_acc[r] = _mm512_loadu_ps(o + r * os + d + 16);
    }
    if (part == DECODE_PAIR_DIMS && seen == 0xffffu) {
V_UNROLL_WHOLE
        for (int t = 0; t < 8; t++) {
            const __m512i a = _mm512_loadu_si512((const uint16_t *)vrow[2 * t] + d);
            const __m512i b = _mm512_loadu_si512((const uint16_t *)vrow[2 * t + 1] + d);
            DECODE_PAIRS_PV_STEP(a, b, t);
        }
    } else {
        const __mmask32 all = (__mmask32)((1ull << part) - 1);
        for (int t = 0; t < 8; t++) {
            const __m512i a = _mm512_maskz_loadu_epi16(seen >> (2 * t) & 1 ? all : 0,
                                                       (const uint16_t *)vrow[2 * t] + d);
            const __m512i b = _mm512_maskz_loadu_epi16(seen >> (2 * t + 1) & 1 ? all : 0,
                                                       (const uint16_t *)vrow[2 * t + 1] + d);
            DECODE_PAIRS_PV_STEP(a, b, t);
        }
    }
    for (int r = 0; r < nr; r++) {
        _mm512_storeu_ps(o + r * os + d, lo_acc[r]);
        _mm512_storeu_ps(o + r * os + d + 16, hi_acc[r]);
    }
}

/* A row of Dp (a multiple of 32) floats from pair order to head-dim order:
 * per 32, lanes 4L + k of the first half hold dim 8L + k, of the second
 * 8L + 4 + k. */
static inline void decode_pairs_order(float *o, int64_t Dp)
{
    const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i second =
        _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int64_t d = 0; d < Dp; d += DECODE_PAIR_DIMS) {
        const __m512 lo = _mm512_loadu_ps(o + d), hi = _mm512_loadu_ps(o + d + 16);
        _mm512_storeu_ps(o + d, _mm512_permutex2var_ps(lo, first, hi));
        _mm512_storeu_ps(o + d + 16, _mm512_permutex2var_ps(lo, second, hi));
    }
}

#include "../flash_run.h"

/* The descriptor (backend.c) reaches the kernel through this. */
sdpa_status sdpa__cpu_avx512bf16_run(const sdpa_backend *self, const sdpa_call *call);
sdpa_status sdpa__cpu_avx512bf16_run(const sdpa_backend *self, const sdpa_call *call)
{
    if (decode_applies(call)) /* few queries per head: flash_decode.h, in pairs */
        return decode_run(self, call);
    return tiled_run(self, call);
}
