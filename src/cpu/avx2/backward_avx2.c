/*
 * backward_avx2.c - cpu.avx2's backward pass: ../flash_backward.h with
 * 8-lane fp32 vectors and FMA3 (vec_avx2.h). f16 / bf16 inputs are
 * converted to f32 as they are packed; every product and the softmax are
 * fp32.
 *
 * Micro-kernel 4 x 3: four broadcast rows against three 8-lane vectors (12
 * ymm accumulators, as the forward's). Key blocks of 48 (two panels),
 * query blocks of 64 rows.
 */
#include "vec_avx2.h"

#define BWD_MR 4
#define BWD_NV 3
#define BWD_BQ 64
#define BWD_BK 48
#define BWD_NAME "cpu.avx2"

#include "../flash_backward.h"

/* The descriptor (backend.c) reaches the kernel through this. */
sdpa_status sdpa__cpu_avx2_backward(const sdpa_backend *self, const sdpa_call *call);
sdpa_status sdpa__cpu_avx2_backward(const sdpa_backend *self, const sdpa_call *call)
{
    return tiled_backward(self, call);
}
