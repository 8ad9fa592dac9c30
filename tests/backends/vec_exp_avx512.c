/*
 * vec_exp_avx512.c - the AVX-512 kernels' exponentials (src/cpu/avx512/
 * vec_avx512.h: exp512 for fp32 P, exp2_bf16 for P rounded to bf16) over
 * an array, for test_vec_exp.c; compiled with the kernels' flags.
 */
#include "cpu/avx512/vec_avx512.h"

#include "vec_exp.h"

void sdpa_test_exp_avx512(const float *x, float *y, size_t n)
{
    for (size_t i = 0; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, exp512(_mm512_loadu_ps(x + i)));
}

void sdpa_test_exp2_bf16_avx512(const float *x, float *y, size_t n)
{
    for (size_t i = 0; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, exp2_bf16(_mm512_loadu_ps(x + i)));
}
