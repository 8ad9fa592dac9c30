/*
 * vec_exp_avx2.c - cpu.avx2's vector exponential (src/cpu/avx2/vec_avx2.h)
 * over an array, for test_vec_exp.c; compiled with the kernel's flags.
 */
#include "cpu/avx2/vec_avx2.h"

#include "vec_exp.h"

void sdpa_test_exp_avx2(const float *x, float *y, size_t n)
{
    for (size_t i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, exp256(_mm256_loadu_ps(x + i)));
}
