/*
 * backward_avx512.c - cpu.avx512's backward pass: ../flash_backward.h with
 * 16-lane fp32 vectors (vec_avx512.h). f16 / bf16 inputs are converted to
 * f32 as they are packed; every product and the softmax are fp32.
 *
 * Micro-kernel 8 x 3: eight broadcast rows against three 16-lane vectors
 * (24 zmm accumulators, as the forward's). Key blocks of 96 (two panels),
 * query blocks of 64 rows.
 */
#include "vec_avx512.h"

#define BWD_MR 8
#define BWD_NV 3
#define BWD_BQ 64
#define BWD_BK 96
#define BWD_NAME "cpu.avx512"

#include "../flash_backward.h"

/* The descriptor (backend.c) reaches the kernel through this. */
sdpa_status sdpa__cpu_avx512_backward(const sdpa_backend *self, const sdpa_call *call);
sdpa_status sdpa__cpu_avx512_backward(const sdpa_backend *self, const sdpa_call *call)
{
    return tiled_backward(self, call);
}
