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
/* f32 K/V blocks shared by more query rows: Q^T and O^T up to 3/8 of the
 * core's L2 (flash_run.h), at least 384 rows. On an Emerald Rapids Xeon
 * (2 MB L2: 768 rows at D 128, 1536 at D 64/72, where 192 rows at any D
 * made the K/V copy 9-10% of a long row's profile, memmove waiting on
 * rows 10-12 KiB apart) long f32 rows took 0.87-0.96x the time,
 * bench/results/2026-12-08-avx512-rows-by-l2-ab-emr.txt. A 1 MB L2 (Zen
 * 4/5) gets 384 rows at D 128 and 768 at D 64: not measured there. */
#define TILED_F32_ROWS 384
#define TILED_F32_QO_L2_EIGHTHS 3

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
