/*
 * vec_avx512.h - the framework's vector vocabulary (../flash_tiled.h) in
 * 16-lane fp32 AVX-512, shared by cpu.avx512 and cpu.avx512bf16.
 *
 * exp: e^x = 2^n * 2^f, n = round(x log2 e), |f| <= 1/2, 2^f by a degree-6
 * polynomial (relative error <= 3e-7 on [-87, 0]), 2^n by VSCALEFPS. Inputs
 * below -87 (and -inf) give exactly 0, so masked scores contribute nothing:
 * they are computed as e^-87 (a normal float) and then zeroed, because a
 * VSCALEFPS whose result underflows takes a microcode assist on Intel
 * cores (measured on Sapphire Rapids: a block-sparse call whose partial
 * blocks hid 60% of their scores ran 2.2x slower with -inf scaled to 0;
 * e^-87 < 2^-125 is far below what a softmax weight can matter).
 */
#ifndef SDPA_VEC_AVX512_H
#define SDPA_VEC_AVX512_H

#include "../exp_portable.h"

#include <immintrin.h>
#include <stddef.h>

#define VL 16
typedef __m512 vec;
#define V_LOAD(p) _mm512_loadu_ps(p)
#define V_STORE(p, x) _mm512_storeu_ps((p), (x))
#define V_SET1(x) _mm512_set1_ps(x)
#define V_ZERO() _mm512_setzero_ps()
#define V_FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define V_MUL(a, b) _mm512_mul_ps((a), (b))
#define V_ADD(a, b) _mm512_add_ps((a), (b))
#define V_SUB(a, b) _mm512_sub_ps((a), (b))
#define V_MAX(a, b) _mm512_max_ps((a), (b))
/* a product the compiler never fuses with a following add */
#define V_MUL_ROUNDED(a, b) _mm512_mul_round_ps((a), (b), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define V_EXP(x) exp512(x)
#define V_TRANSPOSE_REGS(r) transpose16(r)
/* Before a loop of 16 steps of the few-query path's products (a constant
 * trip count): GCC otherwise left some rolled, their sums on the stack
 * (bf16 steps 1.35x slower). Not for clang, which unrolls them itself
 * and, told to, took minutes per file under the sanitizers. */
#if defined(__GNUC__) && !defined(__clang__)
#define V_UNROLL_WHOLE _Pragma("GCC unroll 16")
#else
#define V_UNROLL_WHOLE
#endif
/* the largest lane (a NaN lane may or may not win: such rows end NaN either
 * way) and the sum of the lanes, as a float */
#define V_REDUCE_MAX(x) _mm512_reduce_max_ps(x)
#define V_REDUCE_ADD(x) _mm512_reduce_add_ps(x)
/* whether some lane of x is above m or NaN: one compare, no reduction */
#define V_ANY_ABOVE(x, m) (_mm512_cmp_ps_mask((x), _mm512_set1_ps(m), _CMP_NLE_UQ) != 0)
/* the first n < 16 lanes of p (the rest zero), and into p */
#define V_LOAD_PART(p, n) _mm512_maskz_loadu_ps((__mmask16)((1u << (n)) - 1), (p))
#define V_STORE_PART(p, x, n) _mm512_mask_storeu_ps((p), (__mmask16)((1u << (n)) - 1), (x))
/* 16 bf16 or f16 at p (uint16_t *) as floats, exactly; and the first n < 16 of them */
#define V_LOAD_BF16(p) \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define V_LOAD_BF16_PART(p, n)                                                               \
    _mm512_castsi512_ps(_mm512_slli_epi32(                                                   \
        _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16((__mmask16)((1u << (n)) - 1), (p))), 16))
#define V_LOAD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define V_LOAD_F16_PART(p, n) \
    _mm512_cvtph_ps(_mm256_maskz_loadu_epi16((__mmask16)((1u << (n)) - 1), (p)))

static inline __m512 exp512(__m512 x)
{
    /* lanes at or above -87, and NaN (unordered), are kept; the others
     * give 0 (a weight of exp(-87) times V would make denormal products:
     * exp_portable.h), by the zero-masking of the last VSCALEFPS: a lane
     * below -87 is computed by nothing that could make a denormal or
     * raise a flag, so x needs no clamp (the same bits as with one, an
     * operation fewer) */
    const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_NLT_UQ);
    const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    /* f = t - floor(t) by VREDUCEPS, 2^f by exp_portable.h's degree-5
     * polynomial, VSCALEFPS by 2^floor(t) (t >= -125.6 on a kept lane: a
     * normal result): 9 operations, where rounding to nearest, subtracting
     * and a degree-6 polynomial took 13 */
    const __m512 f = _mm512_reduce_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 p = _mm512_set1_ps(SDPA_EXP2_C5);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(SDPA_EXP2_C4));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(SDPA_EXP2_C3));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(SDPA_EXP2_C2));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(SDPA_EXP2_C1));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(live, p, t);
}

/*
 * 2^x for a result that is rounded to bf16 before it is used (P for a bf16
 * product: cpu.amx, cpu.avx512bf16's pair mode): VREDUCEPS gives f = x -
 * floor(x) in [0, 1), a degree-3 polynomial 2^f (relative error 8.6e-5,
 * below bf16's 2^-9; its constant term is 1, so 2^0 = 1 exactly and a
 * softmax with one winner gives its V row exactly), VSCALEFPS multiplies
 * by 2^floor(x): 5 operations where exp512 takes 9. -inf gives exactly 0
 * (f = 0, scaled by 2^-inf), NaN stays NaN, x below -150 underflows to 0;
 * from -150 to -126 the result is subnormal (exp512 zeroes every lane
 * below -87 instead), which the bf16 rounding (VCVTNE2PS2BF16) then
 * flushes to 0.
 * In two halves, which a loop may run a step apart (cpu.amx's exp_rows2):
 * the fraction, then the polynomial and VSCALEFPS.
 */
static inline __m512 exp2_bf16_fraction(__m512 x)
{
    return _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
}

static inline __m512 exp2_bf16_from_fraction(__m512 x, __m512 f)
{
    __m512 p = _mm512_set1_ps(0.0770675838f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.227644399f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.695116937f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, x);
}

static inline __m512 exp2_bf16(__m512 x)
{
    return exp2_bf16_from_fraction(x, exp2_bf16_fraction(x));
}

/* e^x to bf16's precision, for pair mode's P (flash_tiled.h): x log2(e)
 * rounded once (an error of 2^-24 |x|), then exp2_bf16. */
#define V_EXP_BF16(x) exp2_bf16(_mm512_mul_ps((x), _mm512_set1_ps(1.44269504088896341f)))

/*
 * r[j] = column j of the 16 x 16 block of 32-bit elements (floats or bf16
 * pairs) whose rows r[i] held, in registers: four rounds of 16 shuffles
 * instead of 256 scalar loads and stores. Round 1 interleaves pairs of
 * rows, round 2 pairs of pairs (each 128-bit lane then holds one column
 * of 4 rows), rounds 3 and 4 gather a column's four lanes.
 */
static inline void transpose16(__m512 r[16])
{
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int g = 0; g < 16; g += 4) { /* r[g + j]: columns j, j + 4, j + 8, j + 12 of rows g.. */
        r[g] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[g]), _mm512_castps_pd(t[g + 2])));
        r[g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[g]), _mm512_castps_pd(t[g + 2])));
        r[g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[g + 1]), _mm512_castps_pd(t[g + 3])));
        r[g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[g + 1]), _mm512_castps_pd(t[g + 3])));
    }
    for (int h = 0; h < 16; h += 8) /* t[h + j]: columns j and j + 8 of rows h.. (j < 8) */
        for (int j = 0; j < 4; j++) {
            t[h + j] = _mm512_shuffle_f32x4(r[h + j], r[h + 4 + j], 0x88);
            t[h + 4 + j] = _mm512_shuffle_f32x4(r[h + j], r[h + 4 + j], 0xdd);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
        r[j + 8] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xdd);
    }
}

#endif
