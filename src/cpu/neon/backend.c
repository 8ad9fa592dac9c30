/*
 * backend.c - cpu.neon's descriptor: what it runs, stated once, and how the
 * dispatcher reaches the kernels (flash_neon.c, backward_neon.c: AArch64
 * only). Compiled without ISA flags, on every architecture.
 */
#include "../cpu_backend.h"

double sdpa__probe_fma_neon(int64_t iters);
sdpa_status sdpa__cpu_neon_run(const sdpa_backend *self, const sdpa_call *call);
sdpa_status sdpa__cpu_neon_backward(const sdpa_backend *self, const sdpa_call *call);

const sdpa_backend sdpa__backend_cpu_neon = {
    .name = "cpu.neon",
    .summary = "tiled flash attention, NEON fp32 micro-kernels (8 x 12), AArch64",
    .device = SDPA_DEVICE_CPU,
    .caps = {.shares = 1, .mixed_dtypes = 1,
             .dtypes = SDPA_DTYPE_BIT(SDPA_F32) | SDPA_DTYPE_BIT(SDPA_F16) |
                       SDPA_DTYPE_BIT(SDPA_BF16),
             .d_min = 1, .d_max = 512, .d_multiple = 1, .gqa = 1, .cross = 1,
             .causal_top_left = 1, .causal_bottom_right = 1, .lse = 1, .deterministic = 1,
             .cpu_features = SDPA_CPU_NEON,
             .masks = SDPA_MASK_KIND_SEQ_LEN | SDPA_MASK_KIND_KEY | SDPA_MASK_KIND_GENERAL |
                      SDPA_MASK_KIND_WINDOW | SDPA_MASK_KIND_BLOCKS,
             .backward = 1},
    .fallback_rank = 25,
    .version = SDPA_CPU_VERSION,
    .present = sdpa__cpu_backend_present,
    .run = SDPA_CPU_KERNEL(sdpa__cpu_neon_run),
    .backward = SDPA_CPU_KERNEL(sdpa__cpu_neon_backward),
    .not_built = SDPA_CPU_NOT_BUILT,
    .probe = SDPA_CPU_PROBE(sdpa__probe_fma_neon),
};
