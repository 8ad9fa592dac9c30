/*
 * half.h - f16 and bf16 <-> f32 conversion in portable C (bit arithmetic,
 * no intrinsics), round-to-nearest-even on the way down. Kernels with an
 * ISA of their own use hardware conversions instead.
 */
#ifndef SDPA_HALF_H
#define SDPA_HALF_H

#include <stdint.h>
#include <string.h>

static inline float sdpa__bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t sdpa__f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float sdpa__bf16_to_f32(uint16_t h) { return sdpa__bits_f32((uint32_t)h << 16); }

static inline uint16_t sdpa__f32_to_bf16(float f)
{
    uint32_t u = sdpa__f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a (quiet) NaN */
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

static inline float sdpa__f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) /* inf / NaN */
        return sdpa__bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) { /* zero / subnormal: man * 2^-24 exactly */
        float f = (float)man * 5.9604644775390625e-08f;
        return sign ? -f : f;
    }
    return sdpa__bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t sdpa__f32_to_f16(float f)
{
    uint32_t u = sdpa__f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN */
        return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) /* rounds to >= 65520: infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* below 2^-14: subnormal or zero */
        /* Adding 0.5 (2^-1) aligns the value's 2^-24 units with the
         * mantissa's last bit; the FPU does the round-to-nearest-even. */
        float r = sdpa__bits_f32(a) + 0.5f;
        return (uint16_t)(sign | (uint16_t)(sdpa__f32_bits(r) - 0x3f000000u));
    }
    uint32_t mant_odd = (a >> 13) & 1u;
    a += 0xc8000fffu + mant_odd; /* rebias exponent (-112 << 23) and round */
    return (uint16_t)(sign | (uint16_t)(a >> 13));
}

#endif
