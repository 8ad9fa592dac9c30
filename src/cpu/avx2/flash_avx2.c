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
/* Zen 3 (512 KB of L2 per core, f32 rows): 288 query rows per copy of a
 * K/V block (12 blocks of 24; Q^T and O^T 288 KB at D 128), each K/V row's
 * source asked for 3 rows ahead of its copy (flash_tiled.h's load_kv):
 * long diffusion rows 0.88-0.95x the time of 192 rows and no prefetch in
 * the copy, bench/results/2026-12-07-avx2-kv-copy-ab-zen3.txt. Not tried
 * on cpu.avx512 yet: it keeps 192 rows and the plain copy. */
#define TILED_F32_ROWS 288
/* Below D 128 the rows that the same bytes of Q^T and O^T hold (576 at D
 * 64, 512 at D 72): a K/V block's copy then serves twice the rows there.
 * D 64/72 rows of 4-10 heads 0.92-0.98x the time in two of three runs of
 * 15-21 pairs (0.97-1.03x in the first; D 128, the same code, 0.99-1.02x),
 * outputs bitwise the same; Zen 3,
 * bench/results/2026-12-07-avx2-rows-by-bytes-ab-zen3.txt. */
#define TILED_F32_QO_BYTES (288 * 8 * 128)
#define TILED_KV_AHEAD 3
/* V copied as V^T (flash_tiled.h's load_vt): P V reads 4 rows of V^T in
 * turn instead of 16 bytes of each of 128 key rows. Cross rows 0.92-0.98x
 * the time (512 keys 0.92-0.93x), long rows level, Zen 3,
 * bench/results/2026-12-07-avx2-vt-copy-ab-zen3.txt; not tried on the
 * AVX-512 CPUs yet. */
#define TILED_V_T

#include "../flash_run.h"

/* The descriptor (backend.c) reaches the kernel through this. */
sdpa_status sdpa__cpu_avx2_run(const sdpa_backend *self, const sdpa_call *call);
sdpa_status sdpa__cpu_avx2_run(const sdpa_backend *self, const sdpa_call *call)
{
    return tiled_run(self, call);
}
