/*
 * flash_avx2.c - cpu.avx2: the tiled framework (../flash_tiled.h) with
 * 8-lane fp32 vectors and FMA3, for x86-64 CPUs without AVX-512.
 *
 * Micro-kernel 4 x 3: four broadcast rows against three 8-query vectors:
 * 12 ymm accumulators, 3 loads, 1 broadcast register (16 registers in
 * all). Query blocks are 24 wide.
 *
 * Vectors and exp: vec_avx2.h.
 */
#include "vec_avx2.h"

#define QV 3
#define MR 4
#define KERNEL_NAME "cpu.avx2"

#include "../flash_tiled.h"

/* The descriptor (backend.c) reaches the kernel through this. */
sdpa_status sdpa__cpu_avx2_run(const sdpa_backend *self, const sdpa_call *call);
sdpa_status sdpa__cpu_avx2_run(const sdpa_backend *self, const sdpa_call *call)
{
    return tiled_run(self, call);
}
