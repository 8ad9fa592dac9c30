/*
 * convert.h - read and write one element of a tensor of any dtype as a
 * float or double. The reference uses these per element; fast kernels
 * convert whole rows with their own loops.
 */
#ifndef SDPA_CONVERT_H
#define SDPA_CONVERT_H

#include "core.h"
#include "half.h"

#include <math.h>
#include <string.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

/* Bytes of one element of a validated tensor: sdpa_dtype_size (tensor.c)
 * without the call, on the kernels' row stores (and no include circle). */
static inline int64_t sdpa__elem_bytes(sdpa_dtype t) { return t == SDPA_F32 ? 4 : 2; }

static inline float sdpa__load_f32(const void *base, sdpa_dtype t, int64_t i)
{
    switch (t) {
    case SDPA_F32: return ((const float *)base)[i];
    case SDPA_F16: return sdpa__f16_to_f32(((const uint16_t *)base)[i]);
    case SDPA_BF16: return sdpa__bf16_to_f32(((const uint16_t *)base)[i]);
    }
    return 0.0f;
}

static inline void sdpa__store_f32(void *base, sdpa_dtype t, int64_t i, float v)
{
    switch (t) {
    case SDPA_F32: ((float *)base)[i] = v; break;
    case SDPA_F16: ((uint16_t *)base)[i] = sdpa__f32_to_f16(v); break;
    case SDPA_BF16: ((uint16_t *)base)[i] = sdpa__f32_to_bf16(v); break;
    }
}

/* dst[j] = src[j * stride] * mul for j < n, converting from dtype t. */
static inline void sdpa__load_row(const void *src, sdpa_dtype t, int64_t stride, int64_t n,
                                  float mul, float *restrict dst)
{
    if (stride == 1) {
        switch (t) {
        case SDPA_F32:
            for (int64_t j = 0; j < n; j++)
                dst[j] = ((const float *)src)[j] * mul;
            return;
        case SDPA_F16: {
            int64_t j = 0;
#ifdef __F16C__
            /* a kernel's TU (-mf16c): VCVTPH2PS, 8 at a time; with the
             * portable conversion's branches an f16 call of cpu.avx512 ran
             * at 43% of the fp32 ceiling against f32's 83% (4608 keys,
             * D 128, Sapphire Rapids) */
            const __m256 m = _mm256_set1_ps(mul);
            for (; j + 8 <= n; j += 8)
                _mm256_storeu_ps(dst + j,
                                 _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(
                                                   (const __m128i *)((const uint16_t *)src + j))),
                                               m));
#endif
            for (; j < n; j++)
                dst[j] = sdpa__f16_to_f32(((const uint16_t *)src)[j]) * mul;
            return;
        }
        case SDPA_BF16:
            for (int64_t j = 0; j < n; j++)
                dst[j] = sdpa__bf16_to_f32(((const uint16_t *)src)[j]) * mul;
            return;
        }
    }
    for (int64_t j = 0; j < n; j++)
        dst[j] = sdpa__load_f32(src, t, j * stride) * mul;
}

/* dst[j] = src[j * stride] as bf16 bits (round to nearest even) for j < n. */
static inline void sdpa__load_row_bf16(const void *src, sdpa_dtype t, int64_t stride, int64_t n,
                                       uint16_t *restrict dst)
{
    if (t == SDPA_BF16 && stride == 1) {
        memcpy(dst, src, (size_t)n * sizeof *dst);
        return;
    }
    if (t == SDPA_BF16) {
        for (int64_t j = 0; j < n; j++)
            dst[j] = ((const uint16_t *)src)[j * stride];
        return;
    }
    for (int64_t j = 0; j < n; j++)
        dst[j] = sdpa__f32_to_bf16(sdpa__load_f32(src, t, j * stride));
}

/* dst[j * stride] = src[j] * mul for j < n, converting to dtype t; mul = 0
 * writes zeros, whatever src holds. */
static inline void sdpa__store_row(void *dst, sdpa_dtype t, int64_t stride, int64_t n,
                                   float mul, const float *restrict src)
{
    if (mul == 0.0f) { /* zeros, even where a zero weight met NaN or Inf in v */
        for (int64_t j = 0; j < n; j++)
            sdpa__store_f32(dst, t, j * stride, 0.0f);
        return;
    }
    if (stride == 1) { /* loops per dtype, which the compiler vectorises */
        switch (t) {
        case SDPA_F32:
            for (int64_t j = 0; j < n; j++)
                ((float *)dst)[j] = src[j] * mul;
            return;
        case SDPA_F16:
            for (int64_t j = 0; j < n; j++)
                ((uint16_t *)dst)[j] = sdpa__f32_to_f16(src[j] * mul);
            return;
        case SDPA_BF16:
            for (int64_t j = 0; j < n; j++)
                ((uint16_t *)dst)[j] = sdpa__f32_to_bf16(src[j] * mul);
            return;
        }
    }
    for (int64_t j = 0; j < n; j++)
        sdpa__store_f32(dst, t, j * stride, src[j] * mul);
}

/* The factor a finished row is stored with: 1 / l for a row that saw keys
 * (1 when already normalised), 0 when it saw none (masked, or every score
 * -inf: stored as zeros), NaN when a NaN or +inf score reached the sum
 * (sdpa.h). */
static inline float sdpa__result_mul(float l, int normalised)
{
    return l > 0.0f ? (normalised ? 1.0f : 1.0f / l) : l == 0.0f ? 0.0f : NAN;
}

/* lse[b, h, i] = m + log(l), -inf for a row that saw no key, NaN for NaN. */
static inline void sdpa__store_lse(const sdpa_call *c, int64_t b, int64_t i, int64_t h, float m,
                                   float l)
{
    if (c->lse)
        c->lse[(b * c->desc.Hq + h) * c->desc.Sq + i] =
            l > 0.0f ? m + logf(l) : l == 0.0f ? -INFINITY : NAN;
}

/*
 * Finishes query row i of head h: out[b, i, h, :] = row * (1 / l), or
 * zeros when l == 0 (the row saw no key), and lse = m + log(l) (-inf then).
 * l is the softmax denominator and m the running max, in scaled units.
 * Pass normalised = 1 when row is already divided by l.
 */
static inline void sdpa__store_result(const sdpa_call *c, int64_t b, int64_t i, int64_t h,
                                      const float *row, float m, float l, int normalised)
{
    sdpa_tensor *out = c->out;
    void *dst = (char *)out->data +
                sdpa__offset(out, b, i, h, 0) * sdpa__elem_bytes(out->dtype);
    sdpa__store_row(dst, out->dtype, out->stride[3], c->desc.D, sdpa__result_mul(l, normalised),
                    row);
    sdpa__store_lse(c, b, i, h, m, l);
}

/* Element pointer arithmetic in bytes. */
static inline const void *sdpa__elem(const sdpa_tensor *t, int64_t off)
{
    return (const char *)t->data + off * sdpa__elem_bytes(t->dtype);
}

#endif
