/*
 * caps.h - what cpu.amx runs, stated once: read by its descriptor and by
 * the registry's stand-in in builds that leave the kernel out, so
 * `sdpa explain` says the same about it everywhere.
 */
#ifndef SDPA_CPU_AMX_CAPS_H
#define SDPA_CPU_AMX_CAPS_H

/* `features`: what the platform must have; the emulated-tile build for
 * tests (tests/backends/amx_emulated.c) needs no AMX itself. */
#define SDPA_CPU_AMX_CAPS_WITH(features)                                                           \
    {.dtypes = SDPA_DTYPE_BIT(SDPA_F16) | SDPA_DTYPE_BIT(SDPA_BF16), .d_min = 1, .d_max = 512,     \
     .d_multiple = 1, .gqa = 1, .cross = 1, .causal_top_left = 1, .causal_bottom_right = 1,       \
     .masks = SDPA_MASK_KIND_SEQ_LEN | SDPA_MASK_KIND_KEY | SDPA_MASK_KIND_GENERAL, .lse = 1,     \
     .deterministic = 1, .cpu_features = (features), .product_bits = 8}
#define SDPA_CPU_AMX_CAPS                                                                          \
    SDPA_CPU_AMX_CAPS_WITH(SDPA_CPU_AMX_BF16 | SDPA_CPU_AVX512F | SDPA_CPU_AVX512BF16)

#endif
