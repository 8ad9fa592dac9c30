/*
 * vec_avx512.h - the framework's vector vocabulary (../flash_tiled.h) in
 * 16-lane fp32 AVX-512, shared by cpu.avx512 and cpu.avx512bf16.
 *
 * exp: e^x = 2^n * 2^f, n = round(x log2 e), |f| <= 1/2, 2^f by a degree-6
 * polynomial (relative error <= 3e-7 on [-87, 0]), 2^n by VSCALEFPS. Inputs
 * below -110 (and -inf) give exactly 0, so masked scores contribute nothing.
 */
#ifndef SDPA_VEC_AVX512_H
#define SDPA_VEC_AVX512_H

#include <immintrin.h>

#define VL 16
typedef __m512 vec;
#define V_LOAD(p) _mm512_loadu_ps(p)
#define V_STORE(p, x) _mm512_storeu_ps((p), (x))
#define V_SET1(x) _mm512_set1_ps(x)
#define V_ZERO() _mm512_setzero_ps()
#define V_FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define V_MUL(a, b) _mm512_mul_ps((a), (b))
#define V_ADD(a, b) _mm512_add_ps((a), (b))
#define V_MAX(a, b) _mm512_max_ps((a), (b))
#define V_EXP(x) exp512(x)

static inline __m512 exp512(__m512 x)
{
    x = _mm512_max_ps(_mm512_set1_ps(-110.0f), x); /* x second: NaN stays NaN */
    const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(1.5403530e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

#endif
