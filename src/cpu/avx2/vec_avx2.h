/*
 * vec_avx2.h - the framework's vector vocabulary (../flash_tiled.h,
 * ../flash_backward.h) in 8-lane fp32 AVX2 with FMA3, for cpu.avx2's
 * forward and backward kernels.
 *
 * exp: 2^f for f = t - floor(t) by a degree-5 polynomial (relative error
 * 1.6e-7 in fp32), 2^floor(t) built in the exponent bits; inputs below
 * -87.34 give exactly 0, no result is a denormal (exp256).
 */
#ifndef SDPA_VEC_AVX2_H
#define SDPA_VEC_AVX2_H

#include "../exp_portable.h"

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#define VL 8
typedef __m256 vec;
#define V_LOAD(p) _mm256_loadu_ps(p)
#define V_STORE(p, x) _mm256_storeu_ps((p), (x))
#define V_SET1(x) _mm256_set1_ps(x)
#define V_ZERO() _mm256_setzero_ps()
#define V_FMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define V_MUL(a, b) _mm256_mul_ps((a), (b))
#define V_ADD(a, b) _mm256_add_ps((a), (b))
#define V_SUB(a, b) _mm256_sub_ps((a), (b))
#define V_MAX(a, b) _mm256_max_ps((a), (b))
#define V_EXP(x) exp256(x)
#define V_TRANSPOSE_REGS(r) transpose8(r)
/* the largest lane (a NaN lane may or may not win: such rows end NaN either
 * way) and the sum of the lanes, as a float */
#define V_REDUCE_MAX(x) reduce_max8(x)
#define V_REDUCE_ADD(x) reduce_add8(x)
/* the first n < 8 lanes of p (the rest zero), and into p */
#define V_LOAD_PART(p, n) _mm256_maskload_ps((p), part_mask(n))
#define V_STORE_PART(p, x, n) _mm256_maskstore_ps((p), part_mask(n), (x))
/* 8 bf16 or f16 at p (uint16_t *) as floats, exactly; and the first n < 8 of them */
#define V_LOAD_BF16(p) \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define V_LOAD_BF16_PART(p, n) \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load_halves_part((p), (n))), 16))
#define V_LOAD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define V_LOAD_F16_PART(p, n) _mm256_cvtph_ps(load_halves_part((p), (n)))
/* The lane sums of 8 vectors a0..a7 as one vector (lane j: the sum of
 * a_j's lanes), folded as they come: V_PAIR_SUMS(a_2i, a_2i+1) = h_i, then
 * V_SUMS_OF_PAIRS(h0, h1, h2, h3). flash_decode.h's row blocks (dot
 * products with D on the lanes) reduce 8 keys' sums this way: 6 HADDs, 2
 * lane permutes and an add for 8 sums, where a transpose took 24 shuffles. */
#define V_PAIR_SUMS(a, b) _mm256_hadd_ps((a), (b))
/* x held in a register from here: the compiler may not fold its load into
 * each instruction that reads it (flash_decode.h's scores) */
#define V_IN_REGISTER(x) __asm__("" : "+x"(x))
/* x made here, in a register, at every pass of the loop around it: the
 * compiler may not hoist it out of the loop (flash_decode.h's P V, whose
 * broadcast weights GCC computed once, kept on the stack and read back as
 * an operand of every multiply-add: a 256-bit load per multiply-add) */
#define V_MADE_HERE(x) __asm__ volatile("" : "+x"(x))
#define V_SUMS_OF_PAIRS(h0, h1, h2, h3) sums_of_pairs8((h0), (h1), (h2), (h3))

static inline __m256i part_mask(int n)
{
    static const int32_t lanes[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_loadu_si256((const __m256i *)(lanes + 8 - n));
}

static inline float reduce_max8(__m256 x)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

static inline float reduce_add8(__m256 x)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* The first n < 8 16-bit values at p, the rest zero (AVX2 has no 16-bit
 * masked load; nothing past them is read). */
static inline __m128i load_halves_part(const uint16_t *p, int n)
{
    uint16_t t[8] = {0};
    for (int i = 0; i < n; i++)
        t[i] = p[i];
    return _mm_loadu_si128((const __m128i *)t);
}

static inline __m256 exp256(__m256 x)
{
    /* t = x log2(e) = n + f, n = floor(t), f in [0, 1): 2^f by
     * exp_portable.h's degree-5 polynomial (constant term 1: e^0 = 1
     * exactly; 1.6e-7 in fp32), 2^n built in the exponent bits. Clamped
     * at -88, t >= -127, so n >= -127, and n = -127 (t < -126, x below
     * -87.34) gives an exponent field of 0: exactly 0, with no compare and
     * mask; every other result is normal (p >= 1), never a denormal (an
     * assist on some cores). 13 operations; the round-to-nearest
     * reduction before (f in [-0.5, 0.5], degree 6, a compare and a mask
     * for x < -87) took 16. */
    x = _mm256_max_ps(_mm256_set1_ps(-88.0f), x); /* x second: NaN stays NaN */
    const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f));
    const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(t, n);
    __m256 p = _mm256_set1_ps(SDPA_EXP2_C5);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(SDPA_EXP2_C4));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(SDPA_EXP2_C3));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(SDPA_EXP2_C2));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(SDPA_EXP2_C1));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
                                                         _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* h0..h3 from V_PAIR_SUMS: lanes 0-3 of hadd(h0, h1) hold keys 0-3's sums
 * over lanes 0-3 of a_j, lanes 4-7 over lanes 4-7; hadd(h2, h3) keys 4-7. */
static inline __m256 sums_of_pairs8(__m256 h0, __m256 h1, __m256 h2, __m256 h3)
{
    const __m256 k0123 = _mm256_hadd_ps(h0, h1), k4567 = _mm256_hadd_ps(h2, h3);
    return _mm256_add_ps(_mm256_permute2f128_ps(k0123, k4567, 0x20),
                         _mm256_permute2f128_ps(k0123, k4567, 0x31));
}

/* r[j] = column j of the 8 x 8 block of floats whose rows r[i] held. */
static inline void transpose8(__m256 r[8])
{
    __m256 t[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int g = 0; g < 8; g += 4) { /* t[g + j]: columns j, j + 4 of rows g.. */
        const __m256 a = t[g], b = t[g + 1], c = t[g + 2], d = t[g + 3];
        t[g] = _mm256_shuffle_ps(a, c, 0x44);
        t[g + 1] = _mm256_shuffle_ps(a, c, 0xee);
        t[g + 2] = _mm256_shuffle_ps(b, d, 0x44);
        t[g + 3] = _mm256_shuffle_ps(b, d, 0xee);
    }
    for (int j = 0; j < 4; j++) {
        r[j] = _mm256_permute2f128_ps(t[j], t[4 + j], 0x20);
        r[j + 4] = _mm256_permute2f128_ps(t[j], t[4 + j], 0x31);
    }
}

#endif
