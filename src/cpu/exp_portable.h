/*
 * exp_portable.h - e^x for x <= 0 in portable C that compilers vectorise.
 *
 * x = n ln2 + f ln2 with n integer and |f| <= 1/2; 2^f by its degree-6
 * Taylor polynomial (truncation error <= 1.2e-7 relative), 2^n through the
 * exponent bits. Within 3e-7 relative of expf on [-87, 0]; below -87 (and
 * -inf) the result is 0, and NaN gives NaN (the NaN rules in sdpa.h).
 * The rounding trick (t + 1.5 * 2^23 - 1.5 * 2^23) needs strict IEEE
 * evaluation: files including this must not be built with -ffast-math.
 */
#ifndef SDPA_EXP_PORTABLE_H
#define SDPA_EXP_PORTABLE_H

#include <stdint.h>
#include <string.h>

/* 2^f for f in [0, 1) as 1 + f (C1 + f (C2 + f (C3 + f (C4 + f C5)))):
 * the vector kernels' reduction is t - floor(t) (cpu.avx2's exp256,
 * cpu.avx512's exp512). Fitted for relative error with the constant term
 * held at 1 (so 2^0 = 1 exactly): 8.2e-8, 1.6e-7 evaluated in fp32 by
 * FMAs, one FMA fewer than a degree-6 Taylor polynomial on [-1/2, 1/2]
 * (1.2e-7). test_vec_exp holds both kernels to it. */
#define SDPA_EXP2_C1 6.931512952e-1f
#define SDPA_EXP2_C2 2.401644588e-1f
#define SDPA_EXP2_C3 5.579988658e-2f
#define SDPA_EXP2_C4 9.017067961e-3f
#define SDPA_EXP2_C5 1.867112471e-3f

static inline float sdpa__exp_nonpos(float x)
{
    /* below -87 (and -inf: a score a window or map hides) the result is 0,
     * not exp(-87) = 1.6e-38: that weight times V made subnormal products,
     * and each cost a microcode assist on Intel (cpu.portable over a
     * partial-bits map ran at 0.21x its dense call, 3.7 s -> 17 s) */
    const float keep = x >= -87.0f ? 1.0f : 0.0f; /* NaN: p is NaN, and so is p * 0 */
    x = x < -87.0f ? -87.0f : x; /* NaN passes through */
    float t = x * 1.44269504088896341f;
    float r = t + 12582912.0f; /* 1.5 * 2^23 + n: n sits in the low bits */
    float n = r - 12582912.0f;
    float f = t - n;
    float p = 1.5403530e-4f;
    p = p * f + 1.3333558e-3f;
    p = p * f + 9.6181291e-3f;
    p = p * f + 5.5504109e-2f;
    p = p * f + 2.4022651e-1f;
    p = p * f + 6.9314718e-1f;
    p = p * f + 1.0f;
    /* 2^n from r's bits in unsigned arithmetic: defined for every input
     * (a float-to-int conversion of NaN would be undefined behaviour);
     * for NaN the polynomial is NaN and so is the result. */
    uint32_t rbits;
    memcpy(&rbits, &r, sizeof rbits);
    uint32_t bits = (rbits - 0x4b400000u + 127u) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale * keep;
}

#endif
