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
#include "caps.h"
#include "vec_avx512.h"

#define QV 3
#define MR 8
#define KERNEL_NAME "cpu.avx512"

#include "../flash_tiled.h"

static int avx512_present(const sdpa_backend *self, const sdpa_platform *host, char *why,
                          size_t n)
{
    (void)self;
    if (host->cpu_features & SDPA_CPU_AVX512F)
        return 1;
    sdpa__strlcpy(why,
                  (host->cpu_features_present & SDPA_CPU_AVX512F)
                      ? "not usable here: AVX-512 disabled (OS support or SDPA_MAX_ISA)"
                      : "not usable here: this CPU has no AVX-512",
                  n);
    return 0;
}

const sdpa_backend sdpa__backend_cpu_avx512 = {
    .name = "cpu.avx512",
    .summary = "tiled flash attention, AVX-512 fp32 micro-kernels (8 x 48)",
    .device = SDPA_DEVICE_CPU,
    .caps = SDPA_CPU_AVX512_CAPS,
    .fallback_rank = 30,
    .version = SDPA_VERSION_STRING,
    .present = avx512_present,
    .run = tiled_run,
};
