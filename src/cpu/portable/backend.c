/*
 * backend.c - cpu.portable's descriptor: what it runs, stated once, and how
 * the dispatcher reaches the kernels (flash_portable.c, backward_portable.c:
 * plain C11, built on every architecture with no ISA flag, so every CPU has
 * a blockwise kernel beside the float64 reference).
 */
#include "../cpu_backend.h"

sdpa_status sdpa__cpu_portable_run(const sdpa_backend *self, const sdpa_call *call);
sdpa_status sdpa__cpu_portable_backward(const sdpa_backend *self, const sdpa_call *call);

const sdpa_backend sdpa__backend_cpu_portable = {
    .name = "cpu.portable",
    .summary = "tiled online-softmax attention in portable C11, f32 accumulation",
    .device = SDPA_DEVICE_CPU,
    .caps = {.shares = 1, .mixed_dtypes = 1,
             .dtypes = SDPA_DTYPE_BIT(SDPA_F32) | SDPA_DTYPE_BIT(SDPA_F16) |
                       SDPA_DTYPE_BIT(SDPA_BF16),
             .d_min = 1, .d_max = 1024, .d_multiple = 1, .gqa = 1, .cross = 1,
             .masks = SDPA_MASK_KIND_SEQ_LEN | SDPA_MASK_KIND_KEY | SDPA_MASK_KIND_GENERAL |
                      SDPA_MASK_KIND_WINDOW | SDPA_MASK_KIND_BLOCKS,
             .causal_top_left = 1, .causal_bottom_right = 1, .lse = 1, .deterministic = 1,
             .backward = 1},
    .fallback_rank = 10,
    .version = SDPA_VERSION_STRING,
    .run = sdpa__cpu_portable_run,
    .backward = sdpa__cpu_portable_backward,
};
