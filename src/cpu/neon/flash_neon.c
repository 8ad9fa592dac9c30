/*
 * flash_neon.c - cpu.neon: the tiled framework (../flash_tiled.h) with
 * 4-lane fp32 NEON vectors, for AArch64 CPUs (Grace, Graviton, Apple).
 * f16 / bf16 inputs are converted to f32 as tiles are packed; products and
 * softmax are fp32. Few-query calls take ../flash_decode.h, windows and
 * block maps ../flash_sparse.h, as on x86.
 *
 * Micro-kernel 8 x 3: eight broadcast rows against three 4-query vectors:
 * 24 of the 32 vector registers accumulate, 3 hold B, 1 the broadcast.
 * Query blocks are 12 wide. No AArch64 timing has been taken yet (the
 * project's machines are x86-64; CI runs this under qemu), so the shape is
 * the register budget's, not a measurement's.
 *
 * Vectors and exp: vec_neon.h.
 */
#include "vec_neon.h"

#define QV 3
#define MR 8
#define KERNEL_NAME "cpu.neon"

#include "../flash_run.h"

/* The descriptor (backend.c) reaches the kernel through this. */
sdpa_status sdpa__cpu_neon_run(const sdpa_backend *self, const sdpa_call *call);
sdpa_status sdpa__cpu_neon_run(const sdpa_backend *self, const sdpa_call *call)
{
    return tiled_run(self, call);
}
