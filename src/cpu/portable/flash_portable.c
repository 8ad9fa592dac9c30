/*
 * flash_portable.c - cpu.portable's forward: the tiled framework
 * (../flash_tiled.h) over the portable vector vocabulary (vec_portable.h:
 * structs of 8 floats and counted loops, no intrinsics), the one its
 * backward and few-query path use, so it runs on every CPU and every
 * architecture with whatever SIMD the compiler finds for the target.
 *
 * Micro-kernel 4 x 3: four broadcast rows against three 8-float vectors;
 * query blocks of 24. Until 0.2 cpu.portable had a forward framework of
 * its own (64 x 64 tiles, a 4 x 8 micro-kernel); this one ran 1.12-1.67x
 * faster on 20 of 24 rows (smoke and five 1-2K-token rows, f32 and bf16),
 * even on the f32 384-token causal row, 0.89x on its bf16 twin and
 * 0.70-0.92x on the one-token rows (3-5 us calls, as noisy as that), on
 * the Sapphire Rapids VM (bench/results/2026-12-03-portable-tiled-spr.txt),
 * and it brings the windows, block maps and short-key path of the ISA
 * kernels with it.
 */
#include "vec_portable.h"

#define QV 3
#define MR 4
#define KERNEL_NAME "cpu.portable"

#include "../flash_run.h"

/* The descriptor (backend.c) reaches the kernel through this. */
sdpa_status sdpa__cpu_portable_run(const sdpa_backend *self, const sdpa_call *call);
sdpa_status sdpa__cpu_portable_run(const sdpa_backend *self, const sdpa_call *call)
{
    return tiled_run(self, call);
}
