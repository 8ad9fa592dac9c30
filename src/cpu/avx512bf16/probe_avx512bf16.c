/*
 * probe_avx512bf16.c - the bf16 dot-product ceiling with AVX512-BF16: 12
 * independent VDPBF16PS chains (32 multiply-adds each), registers only, so
 * the loop measures the unit and nothing else. cpu.avx512bf16's %peak is of
 * this. Returns the FLOPs done.
 */
#include <immintrin.h>
#include <stdint.h>

double sdpa__probe_dpbf16_avx512(int64_t iters);

double sdpa__probe_dpbf16_avx512(int64_t iters)
{
    __m512 a[12];
    const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f7f3f7f); /* pairs of ~0.996 */
    const __m512bh y = (__m512bh)_mm512_set1_epi32(0x33d633d6); /* pairs of ~1e-7 */
    for (int i = 0; i < 12; i++)
        a[i] = _mm512_set1_ps((float)i);
    for (int64_t n = 0; n < iters; n++)
        for (int i = 0; i < 12; i++)
            a[i] = _mm512_dpbf16_ps(a[i], x, y);
    __m512 s = a[0];
    for (int i = 1; i < 12; i++)
        s = _mm512_add_ps(s, a[i]);
    volatile float sink = _mm512_reduce_add_ps(s);
    (void)sink;
    return (double)iters * 12 * 32 * 2;
}
