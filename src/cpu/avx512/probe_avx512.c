/*
 * probe_avx512.c - the fp32 FMA ceiling with AVX-512: 12 independent
 * accumulator chains (more than FMA latency x throughput on current cores),
 * registers only, so the loop measures the FMA units and nothing else.
 * Returns the FLOPs done.
 */
#include <immintrin.h>
#include <stdint.h>

double sdpa__probe_fma_avx512(int64_t iters);

double sdpa__probe_fma_avx512(int64_t iters)
{
    __m512 a[12];
    const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++)
        a[i] = _mm512_set1_ps((float)i);
    for (int64_t n = 0; n < iters; n++)
        for (int i = 0; i < 12; i++)
            a[i] = _mm512_fmadd_ps(a[i], x, y);
    __m512 s = a[0];
    for (int i = 1; i < 12; i++)
        s = _mm512_add_ps(s, a[i]);
    volatile float sink = _mm512_reduce_add_ps(s);
    (void)sink;
    return (double)iters * 12 * 16 * 2;
}
