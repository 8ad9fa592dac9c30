/*
 * backend.c - cpu.blas's descriptor: what the unfused OpenBLAS baseline
 * runs, stated once, and how the dispatcher reaches it (unfused_blas.c,
 * built where OpenBLAS's headers were found). Always compiled.
 */
#include "../cpu_backend.h"

sdpa_status sdpa__cpu_blas_run(const sdpa_backend *self, const sdpa_call *call);

const sdpa_backend sdpa__backend_cpu_blas = {
    .name = "cpu.blas",
    .summary = "unfused baseline: OpenBLAS sgemm, softmax, sgemm in 256-row blocks",
    .device = SDPA_DEVICE_CPU,
    .caps = {.shares = 1, .dtypes = SDPA_DTYPE_BIT(SDPA_F32), .d_min = 1, .d_max = 4096, .d_multiple = 1,
             .gqa = 1, .cross = 1, .causal_top_left = 1, .causal_bottom_right = 1, .lse = 1,
             .deterministic = 1,
             .masks = SDPA_MASK_KIND_SEQ_LEN | SDPA_MASK_KIND_KEY | SDPA_MASK_KIND_GENERAL},
    .fallback_rank = 0, /* a baseline: only rules or explicit choices name it */
    .present = sdpa__cpu_backend_present,
#ifdef SDPA_HAVE_OPENBLAS
    .version = "openblas",
    .run = sdpa__cpu_blas_run,
#else
    .version = "absent",
    .run = sdpa__cpu_backend_not_built,
    .not_built = "OpenBLAS (cblas.h, libopenblas) was not found at build time",
#endif
};
