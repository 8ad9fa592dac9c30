/*
 * probe_neon.c - the fp32 FMA ceiling with NEON: 12 independent
 * accumulator chains of 4 lanes (more than FMLA latency x throughput on
 * Neoverse V1/V2 and Apple cores), registers only. Returns the FLOPs done.
 */
#include <arm_neon.h>
#include <stdint.h>

double sdpa__probe_fma_neon(int64_t iters);

double sdpa__probe_fma_neon(int64_t iters)
{
    float32x4_t a[12];
    const float32x4_t x = vdupq_n_f32(0.999999f), y = vdupq_n_f32(1e-7f);
    for (int i = 0; i < 12; i++)
        a[i] = vdupq_n_f32((float)i);
    for (int64_t n = 0; n < iters; n++)
        for (int i = 0; i < 12; i++)
            a[i] = vfmaq_f32(y, a[i], x);
    float32x4_t s = a[0];
    for (int i = 1; i < 12; i++)
        s = vaddq_f32(s, a[i]);
    volatile float sink = vgetq_lane_f32(s, 0);
    (void)sink;
    return (double)iters * 12 * 4 * 2;
}
