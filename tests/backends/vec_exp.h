/*
 * vec_exp.h - the CPU kernels' vector exponentials, each over an array of
 * n floats (n a multiple of 16), built with its ISA's flags (vec_exp_*.c)
 * and called only where the CPU has that ISA.
 */
#ifndef SDPA_TEST_VEC_EXP_H
#define SDPA_TEST_VEC_EXP_H

#include <stddef.h>

void sdpa_test_exp_avx2(const float *x, float *y, size_t n);         /* e^x, exp256    */
void sdpa_test_exp_avx512(const float *x, float *y, size_t n);       /* e^x, exp512    */
void sdpa_test_exp2_bf16_avx512(const float *x, float *y, size_t n); /* 2^x, exp2_bf16 */

#endif
