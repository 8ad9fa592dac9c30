/*
 * probe_avx2.c - the fp32 FMA ceiling with AVX2: 12 independent
 * accumulator chains in ymm registers. Returns the FLOPs done.
 */
#include <immintrin.h>
#include <stdint.h>

double sdpa__probe_fma_avx2(int64_t iters);

double sdpa__probe_fma_avx2(int64_t iters)
{
    __m256 a[12];
    const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++)
        a[i] = _mm256_set1_ps((float)i);
    for (int64_t n = 0; n < iters; n++)
        for (int i = 0; i < 12; i++)
            a[i] = _mm256_fmadd_ps(a[i], x, y);
    __m256 s = a[0];
    for (int i = 1; i < 12; i++)
        s = _mm256_add_ps(s, a[i]);
    float out[8];
    _mm256_storeu_ps(out, s);
    volatile float sink = out[0];
    (void)sink;
    return (double)iters * 12 * 8 * 2;
}
