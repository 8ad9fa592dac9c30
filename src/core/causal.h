/*
 * causal.h - the one reading of a causal mask that the kernels share, CPU
 * and CUDA alike (this header compiles as C11, C++ and CUDA; the tests'
 * SIMT emulator includes it through the kernels). The float64 reference
 * (src/ref/ref.c) keeps its own reading on purpose: it is the oracle.
 *
 * With len_q real queries and len_kv real keys (the tensor's lengths, or
 * the per-batch sequence lengths), key j is visible to query i when
 *   j <= i + offset,   offset = 0 (top-left) or len_kv - len_q (bottom-right);
 * every key is visible without a causal mask.
 */
#ifndef SDPA_CAUSAL_H
#define SDPA_CAUSAL_H

#include "sdpa.h"

#include <stdint.h>

#if defined(__CUDACC__)
#define SDPA_HOST_DEVICE __host__ __device__
#else
#define SDPA_HOST_DEVICE
#endif

/* The diagonal's offset: key j is visible to query i when j <= i + offset. */
static inline SDPA_HOST_DEVICE int64_t sdpa_causal_offset(int causal, int64_t len_q,
                                                          int64_t len_kv)
{
    return causal == SDPA_CAUSAL_BOTTOM_RIGHT ? len_kv - len_q : 0;
}

/* How many keys query i sees: keys [0, n) with n in [0, len_kv]. */
static inline SDPA_HOST_DEVICE int64_t sdpa_causal_visible_keys(int causal, int64_t i,
                                                                int64_t len_q, int64_t len_kv)
{
    if (causal == SDPA_CAUSAL_NONE)
        return len_kv;
    const int64_t last = i + sdpa_causal_offset(causal, len_q, len_kv);
    return last < 0 ? 0 : last + 1 < len_kv ? last + 1 : len_kv;
}

#endif
