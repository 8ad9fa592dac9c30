/*
 * backward_neon.c - cpu.neon's backward pass: ../flash_backward.h with
 * 4-lane fp32 NEON vectors (vec_neon.h). f16 / bf16 inputs are converted
 * to f32 as they are packed; every product and the softmax are fp32.
 *
 * Micro-kernel 8 x 3: eight broadcast rows against three 4-lane vectors
 * (24 accumulators of the 32 registers). Key blocks of 48, query blocks
 * of 64 rows. Unmeasured on AArch64 hardware (see flash_neon.c).
 */
#include "vec_neon.h"

#define BWD_MR 8
#define BWD_NV 3
#define BWD_BQ 64
#define BWD_BK 48
#define BWD_NAME "cpu.neon"

#include "../flash_backward.h"

/* The descriptor (backend.c) reaches the kernel through this. */
sdpa_status sdpa__cpu_neon_backward(const sdpa_backend *self, const sdpa_call *call);
sdpa_status sdpa__cpu_neon_backward(const sdpa_backend *self, const sdpa_call *call)
{
    return tiled_backward(self, call);
}
