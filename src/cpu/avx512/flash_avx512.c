/*
 * flash_avx512.c - cpu.avx512: the tiled framework (../flash_tiled.h) with
 * 16-lane fp32 vectors. f16 / bf16 inputs are converted to f32 as tiles are
 * loaded; arithmetic and softmax are fp32.
 *
 * Micro-kernel 8 x 3: eight broadcast rows (keys for S^T, head-dim
 * elements for O^T) against three 16-query vectors: 24 zmm accumulators,
 * 3 loads and 8 broadcasts per 24 FMAs. Query blocks are 48 wide.
 *
 * exp: e^x = 2^n * 2^f, n = round(x log2 e), |f| <= 1/2, 2^f by a degree-6
 * polynomial (relative error <= 3e-7 on [-87, 0]), 2^n by VSCALEFPS. Inputs
 * below -110 (and -inf) give exactly 0, so masked scores contribute nothing.
 */
#include <immintrin.h>

#define VL 16
#define QV 3
#define MR 8
#define KERNEL_NAME "cpu.avx512"
typedef __m512 vec;
#define V_LOAD(p) _mm512_loadu_ps(p)
#define V_STORE(p, x) _mm512_storeu_ps((p), (x))
#define V_SET1(x) _mm512_set1_ps(x)
#define V_ZERO() _mm512_setzero_ps()
#define V_FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define V_MUL(a, b) _mm512_mul_ps((a), (b))
#define V_ADD(a, b) _mm512_add_ps((a), (b))
#define V_MAX(a, b) _mm512_max_ps((a), (b))
#define V_EXP(x) exp512(x)

static inline __m512 exp512(__m512 x)
{
    x = _mm512_max_ps(x, _mm512_set1_ps(-110.0f));
    const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(1.5403530e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

#include "../flash_tiled.h"

static int avx512_present(const sdpa_backend *self, const sdpa_platform *host, char *why,
                          size_t n)
{
    (void)self;
    if (host->cpu_features & SDPA_CPU_AVX512F)
        return 1;
    sdpa__strlcpy(why,
                  (host->cpu_features_present & SDPA_CPU_AVX512F)
                      ? "not usable here: AVX-512 disabled (OS support or SDPA_MAX_ISA)"
                      : "not usable here: this CPU has no AVX-512",
                  n);
    return 0;
}

const sdpa_backend sdpa__backend_cpu_avx512 = {
    .name = "cpu.avx512",
    .summary = "tiled flash attention, AVX-512 fp32 micro-kernels (8 x 48)",
    .device = SDPA_DEVICE_CPU,
    .caps = {.dtypes = SDPA_DTYPE_BIT(SDPA_F32) | SDPA_DTYPE_BIT(SDPA_F16) |
                       SDPA_DTYPE_BIT(SDPA_BF16),
             .d_min = 1, .d_max = 512, .d_multiple = 1, .gqa = 1, .cross = 1,
             .causal_top_left = 1, .causal_bottom_right = 1, .lse = 1, .deterministic = 1,
             .cpu_features = SDPA_CPU_AVX512F},
    .fallback_rank = 30,
    .version = SDPA_VERSION_STRING,
    .present = avx512_present,
    .run = tiled_run,
};
