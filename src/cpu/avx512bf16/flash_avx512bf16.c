/*
 * flash_avx512bf16.c - cpu.avx512bf16: the tiled framework (../flash_tiled.h)
 * in pair mode, both products on VDPBF16PS (AVX512-BF16): each lane adds a
 * two-term bf16 dot product to an fp32 accumulator, 32 multiply-adds per
 * instruction where VFMADD231PS does 16. Softmax and accumulation stay
 * fp32 (vec_avx512.h); P is rounded to bf16 for the second product, as on
 * AMX and GPU tensor cores. bf16 inputs are used as they are; f16 inputs
 * are rounded to bf16 (the default rules send only bf16 here).
 *
 * Micro-kernel 8 x 3, as cpu.avx512: eight broadcast pairs (keys for S^T,
 * head-dim elements for O^T) against three 16-query vectors of pairs.
 *
 * For CPUs with AVX512-BF16 but no AMX (AMD Zen 4 and later, Intel Cooper
 * Lake); where AMX is usable, cpu.amx comes first.
 */
#include "../avx512/decode_avx512.h"
#include "../avx512/vec_avx512.h"

#include <stdint.h>

#define QV 3
#define MR 8
#define KERNEL_NAME "cpu.avx512bf16"
#define TILED_PAIRS 1
typedef uint32_t a_elem; /* two bf16: reduction index 2i (low), 2i + 1 (high) */
typedef uint32_t b_elem;
typedef __m512bh avec;
typedef __m512bh bvec;
#define A_BCAST(x) ((__m512bh)_mm512_set1_epi32((int)(x)))
#define B_LOAD(p) ((__m512bh)_mm512_loadu_si512(p))
#define V_MAC(acc, a, b) _mm512_dpbf16_ps((acc), (a), (b))

/* 16 lanes of (bf16(lo[i]), bf16(hi[i])) pairs: convert both, then
 * interleave the two halves word by word. */
#define PACK_PAIRS(dst, lo, hi)                                                                    \
    _mm512_storeu_si512((dst), _mm512_permutexvar_epi16(pair_order(),                              \
                                                        (__m512i)_mm512_cvtne2ps_pbh((hi), (lo))))

static inline __m512i pair_order(void)
{
    return _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                            22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
}

#include "../flash_tiled.h"

/* The descriptor (backend.c) reaches the kernel through this. */
sdpa_status sdpa__cpu_avx512bf16_run(const sdpa_backend *self, const sdpa_call *call);
sdpa_status sdpa__cpu_avx512bf16_run(const sdpa_backend *self, const sdpa_call *call)
{
    if (sdpa__cpu_avx512_decode_applies(call)) /* few queries per head */
        return sdpa__cpu_avx512_decode_run(self, call);
    return tiled_run(self, call);
}
