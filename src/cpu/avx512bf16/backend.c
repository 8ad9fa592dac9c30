/*
 * backend.c - cpu.avx512bf16's descriptor: what it runs, stated once, and
 * how the dispatcher reaches the kernel (flash_avx512bf16.c, built with
 * AVX512-BF16 flags). Compiled without ISA flags, on every architecture.
 */
#include "../cpu_backend.h"

double sdpa__probe_dpbf16_avx512(int64_t iters);

sdpa_status sdpa__cpu_avx512bf16_run(const sdpa_backend *self, const sdpa_call *call);

const sdpa_backend sdpa__backend_cpu_avx512bf16 = {
    .name = "cpu.avx512bf16",
    .summary = "tiled flash attention, VDPBF16PS bf16-pair micro-kernels (8 x 48), fp32 softmax",
    .device = SDPA_DEVICE_CPU,
    .caps = {.shares = 1, .mixed_dtypes = 1, .dtypes = SDPA_DTYPE_BIT(SDPA_F16) | SDPA_DTYPE_BIT(SDPA_BF16), .d_min = 1,
             .d_max = 512, .d_multiple = 1, .gqa = 1, .cross = 1, .causal_top_left = 1,
             .causal_bottom_right = 1, .lse = 1, .deterministic = 1,
             .cpu_features = SDPA_CPU_AVX512F | SDPA_CPU_AVX512BF16, .product_bits = 8,
             .masks = SDPA_MASK_KIND_SEQ_LEN | SDPA_MASK_KIND_KEY | SDPA_MASK_KIND_GENERAL |
                      SDPA_MASK_KIND_WINDOW | SDPA_MASK_KIND_BLOCKS},
    .fallback_rank = 35,
    .version = SDPA_CPU_VERSION,
    .present = sdpa__cpu_backend_present,
    .run = SDPA_CPU_KERNEL(sdpa__cpu_avx512bf16_run),
    .not_built = SDPA_CPU_NOT_BUILT,
    .probe = SDPA_CPU_PROBE(sdpa__probe_dpbf16_avx512),
    .probe_unit = SDPA_CPU_AVX512BF16,
};
