/*
 * flash_avx512.c - cpu.avx512: the tiled framework (../flash_tiled.h) with
 * 16-lane fp32 vectors. f16 / bf16 inputs are converted to f32 as tiles are
 * loaded; arithmetic and softmax are fp32.
 *
 * Micro-kernel 8 x 3: eight broadcast rows (keys for S^T, head-dim
 * elements for O^T) against three 16-query vectors: 24 zmm accumulators,
 * 3 loads and 8 broadcasts per 24 FMAs. Query blocks are 48 wide.
 *
 * Vectors and exp: vec_avx512.h.
 */
#include "decode_avx512.h"
#include "vec_avx512.h"

#define QV 3
#define MR 8
#define KERNEL_NAME "cpu.avx512"

#include "../flash_run.h"

/* The descriptor (backend.c) reaches the kernel through this. */
sdpa_status sdpa__cpu_avx512_run(const sdpa_backend *self, const sdpa_call *call);
sdpa_status sdpa__cpu_avx512_run(const sdpa_backend *self, const sdpa_call *call)
{
    return tiled_run(self, call);
}

int sdpa__cpu_avx512_decode_applies(const sdpa_call *call) { return decode_applies(call); }

sdpa_status sdpa__cpu_avx512_decode_run(const sdpa_backend *self, const sdpa_call *call)
{
    return decode_run(self, call);
}
