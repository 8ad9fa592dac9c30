/*
 * backend.c - cpu.avx512's descriptor: what it runs, stated once, and how
 * the dispatcher reaches the kernels (flash_avx512.c, backward_avx512.c, built with AVX-512
 * flags). Compiled without ISA flags, on every architecture.
 */
#include "../cpu_backend.h"

double sdpa__probe_fma_avx512(int64_t iters);

sdpa_status sdpa__cpu_avx512_run(const sdpa_backend *self, const sdpa_call *call);
sdpa_status sdpa__cpu_avx512_backward(const sdpa_backend *self, const sdpa_call *call);

const sdpa_backend sdpa__backend_cpu_avx512 = {
    .name = "cpu.avx512",
    .summary = "tiled flash attention, AVX-512 fp32 micro-kernels (8 x 48)",
    .device = SDPA_DEVICE_CPU,
    .caps = {.shares = 1, .mixed_dtypes = 1, .dtypes = SDPA_DTYPE_BIT(SDPA_F32) | SDPA_DTYPE_BIT(SDPA_F16) |
                       SDPA_DTYPE_BIT(SDPA_BF16),
             .d_min = 1, .d_max = 512, .d_multiple = 1, .gqa = 1, .cross = 1,
             .causal_top_left = 1, .causal_bottom_right = 1, .lse = 1, .deterministic = 1,
             .cpu_features = SDPA_CPU_AVX512F,
             .masks = SDPA_MASK_KIND_SEQ_LEN | SDPA_MASK_KIND_KEY | SDPA_MASK_KIND_GENERAL |
                      SDPA_MASK_KIND_WINDOW | SDPA_MASK_KIND_BLOCKS,
             .backward = 1},
    .fallback_rank = 30,
    .version = SDPA_CPU_VERSION,
    .present = sdpa__cpu_backend_present,
    .run = SDPA_CPU_KERNEL(sdpa__cpu_avx512_run),
    .backward = SDPA_CPU_KERNEL(sdpa__cpu_avx512_backward),
    .not_built = SDPA_CPU_NOT_BUILT,
    .probe = SDPA_CPU_PROBE(sdpa__probe_fma_avx512),
};
