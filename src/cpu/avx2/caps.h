/*
 * caps.h - what cpu.avx2 runs, stated once: read by its descriptor and by
 * the registry's stand-in in builds that leave the kernel out, so
 * `sdpa explain` says the same about it everywhere.
 */
#ifndef SDPA_CPU_AVX2_CAPS_H
#define SDPA_CPU_AVX2_CAPS_H

#define SDPA_CPU_AVX2_CAPS                                                                         \
    {.dtypes = SDPA_DTYPE_BIT(SDPA_F32) | SDPA_DTYPE_BIT(SDPA_F16) | SDPA_DTYPE_BIT(SDPA_BF16),    \
     .d_min = 1, .d_max = 512, .d_multiple = 1, .gqa = 1, .cross = 1, .causal_top_left = 1,       \
     .causal_bottom_right = 1, .lse = 1, .deterministic = 1, .cpu_features = SDPA_CPU_AVX2,                                                   \
     .masks = SDPA_MASK_KIND_SEQ_LEN | SDPA_MASK_KIND_KEY | SDPA_MASK_KIND_GENERAL}

#endif
