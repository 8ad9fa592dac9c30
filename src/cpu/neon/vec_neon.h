/*
 * vec_neon.h - the framework's vector vocabulary (../flash_tiled.h,
 * ../flash_backward.h, ../flash_decode.h) in 4-lane fp32 AArch64 Advanced
 * SIMD (NEON), for cpu.neon's forward and backward kernels.
 *
 * exp: the polynomial of the x86 kernels (degree 6 for 2^f, relative error
 * <= 3e-7 on [-87, 0]); 2^n is built in the exponent bits, and inputs below
 * -87 give exactly 0, so masked scores weigh nothing. vmaxq_f32 returns
 * NaN when either input is NaN, so NaN scores stay NaN whatever the order.
 */
#ifndef SDPA_VEC_NEON_H
#define SDPA_VEC_NEON_H

#include <arm_neon.h>
#include <stddef.h>
#include <stdint.h>

#define VL 4
typedef float32x4_t vec;
#define V_LOAD(p) vld1q_f32(p)
#define V_STORE(p, x) vst1q_f32((p), (x))
#define V_SET1(x) vdupq_n_f32(x)
#define V_ZERO() vdupq_n_f32(0.0f)
#define V_FMA(a, b, c) vfmaq_f32((c), (a), (b))
#define V_MUL(a, b) vmulq_f32((a), (b))
#define V_ADD(a, b) vaddq_f32((a), (b))
#define V_SUB(a, b) vsubq_f32((a), (b))
#define V_MAX(a, b) vmaxq_f32((a), (b))
#define V_EXP(x) exp_neon(x)
#define V_TRANSPOSE_REGS(r) transpose4(r)
/* the largest lane (NaN if a lane is) and the sum of the lanes, as a float */
#define V_REDUCE_MAX(x) vmaxvq_f32(x)
#define V_REDUCE_ADD(x) vaddvq_f32(x)
/* the first n < 4 lanes of p (the rest zero), and into p: nothing past
 * them is read or written */
#define V_LOAD_PART(p, n) load_part((p), (n))
#define V_STORE_PART(p, x, n) store_part((p), (x), (n))
/* 4 bf16 at p (uint16_t *) as floats, exactly; and the first n < 4 of them */
#define V_LOAD_BF16(p) vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16))
#define V_LOAD_BF16_PART(p, n) load_bf16_part((p), (n))

static inline float32x4_t load_part(const float *p, int n)
{
    float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < n; i++)
        t[i] = p[i];
    return vld1q_f32(t);
}

static inline void store_part(float *p, float32x4_t x, int n)
{
    float t[4];
    vst1q_f32(t, x);
    for (int i = 0; i < n; i++)
        p[i] = t[i];
}

static inline float32x4_t load_bf16_part(const uint16_t *p, int n)
{
    uint16_t t[4] = {0, 0, 0, 0};
    for (int i = 0; i < n; i++)
        t[i] = p[i];
    return V_LOAD_BF16(t);
}

static inline float32x4_t exp_neon(float32x4_t x)
{
    const uint32x4_t dead = vcltq_f32(x, vdupq_n_f32(-87.0f));
    x = vmaxq_f32(x, vdupq_n_f32(-87.0f)); /* NaN stays NaN */
    const float32x4_t t = vmulq_f32(x, vdupq_n_f32(1.44269504088896341f));
    const float32x4_t n = vrndnq_f32(t);
    const float32x4_t f = vsubq_f32(t, n);
    float32x4_t p = vdupq_n_f32(1.5403530e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3333558e-3f), p, f);
    p = vfmaq_f32(vdupq_n_f32(9.6181291e-3f), p, f);
    p = vfmaq_f32(vdupq_n_f32(5.5504109e-2f), p, f);
    p = vfmaq_f32(vdupq_n_f32(2.4022651e-1f), p, f);
    p = vfmaq_f32(vdupq_n_f32(6.9314718e-1f), p, f);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, f);
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    const float32x4_t y = vmulq_f32(p, vreinterpretq_f32_s32(e));
    return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(y), dead));
}

/* r[j] = column j of the 4 x 4 block of floats whose rows r[i] held. */
static inline void transpose4(float32x4_t r[4])
{
    const float32x4x2_t a = vtrnq_f32(r[0], r[1]); /* a0: r00 r10 r02 r12, a1: r01 r11 r03 r13 */
    const float32x4x2_t b = vtrnq_f32(r[2], r[3]);
    r[0] = vcombine_f32(vget_low_f32(a.val[0]), vget_low_f32(b.val[0]));
    r[1] = vcombine_f32(vget_low_f32(a.val[1]), vget_low_f32(b.val[1]));
    r[2] = vcombine_f32(vget_high_f32(a.val[0]), vget_high_f32(b.val[0]));
    r[3] = vcombine_f32(vget_high_f32(a.val[1]), vget_high_f32(b.val[1]));
}

#endif
