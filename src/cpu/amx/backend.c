/*
 * backend.c - cpu.amx's descriptor: what it runs, stated once, and how the
 * dispatcher reaches the kernel (flash_amx.c, built with the AMX and
 * AVX512-BF16 flags). Compiled without ISA flags, on every architecture.
 * The test build of the same kernel on emulated tiles copies this
 * descriptor (tests/backends/amx_emulated.c).
 */
#include "../cpu_backend.h"

double sdpa__probe_amx_bf16(int64_t iters);

sdpa_status sdpa__cpu_amx_run(const sdpa_backend *self, const sdpa_call *call);
sdpa_status sdpa__cpu_amx_backward(const sdpa_backend *self, const sdpa_call *call);
int sdpa__cpu_amx_selftest(void);

/* The features, then the one-tile self-test on first use (flash_amx.c). */
static int amx_present(const sdpa_backend *self, const sdpa_platform *host, char *why, size_t n)
{
    if (!sdpa__cpu_backend_present(self, host, why, n))
        return 0;
#if SDPA_KERNELS_BUILT
    if (!sdpa__cpu_amx_selftest()) {
        sdpa__strlcpy(why, "not usable here: the AMX self-test (one TDPBF16PS tile against its "
                           "definition) failed", n);
        return 0;
    }
#endif
    return 1;
}

const sdpa_backend sdpa__backend_cpu_amx = {
    .name = "cpu.amx",
    .summary = "flash attention on AMX tiles, bf16 products, fp32 softmax (32 x 256 blocks)",
    .device = SDPA_DEVICE_CPU,
    .caps = {.dtypes = SDPA_DTYPE_BIT(SDPA_F16) | SDPA_DTYPE_BIT(SDPA_BF16), .d_min = 1,
             .d_max = 512, .d_multiple = 1, .gqa = 1, .cross = 1, .causal_top_left = 1,
             .causal_bottom_right = 1,
             .masks = SDPA_MASK_KIND_SEQ_LEN | SDPA_MASK_KIND_KEY | SDPA_MASK_KIND_GENERAL |
                      SDPA_MASK_KIND_WINDOW | SDPA_MASK_KIND_BLOCKS,
             .lse = 1, .deterministic = 1,
             .mixed_dtypes = 1, /* f16 and bf16 apart: each rounded to bf16 as it is packed */
             /* AVX-512 and AVX512-BF16 for the softmax and the rounding of P */
             .cpu_features = SDPA_CPU_AMX_BF16 | SDPA_CPU_AVX512F | SDPA_CPU_AVX512BF16,
             .product_bits = 8,
             .backward = 1}, /* backward_amx.h: the same products on tiles */
    .fallback_rank = 40,
    .version = SDPA_CPU_VERSION,
    .present = amx_present,
    .run = SDPA_CPU_KERNEL(sdpa__cpu_amx_run),
    .backward = SDPA_CPU_KERNEL(sdpa__cpu_amx_backward),
    .not_built = SDPA_CPU_NOT_BUILT,
    .probe = SDPA_CPU_PROBE(sdpa__probe_amx_bf16),
    .probe_unit = SDPA_CPU_AMX_BF16,
    .probe_max_iters = 1000000, /* a TDPBF16PS round is 16 x 16 x 32 multiply-adds per tile */
};
