/*
 * test_half.c - the portable f16/bf16 conversions: every f16 value round
 * trips; f32 -> f16 agrees with the compiler's _Float16 on special and
 * random values; f32 -> bf16 rounds to nearest even.
 */
#include "support/testlib.h"
#include "core/half.h"

#include <math.h>
#include <string.h>

int main(void)
{
    tl_seed_from_env();
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = sdpa__f16_to_f32((uint16_t)h);
        uint16_t back = sdpa__f32_to_f16(f);
        int nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        if (nan ? !isnan(f) || (back & 0x7c00) != 0x7c00 || !(back & 0x3ff) : back != h)
            bad++;
#if defined(__FLT16_MAX__)
        _Float16 ref;
        uint16_t hh = (uint16_t)h;
        memcpy(&ref, &hh, 2);
        if (!nan && (float)ref != f)
            bad++;
#endif
    }
    CHECK(bad == 0, "%d f16 values do not round-trip", bad);

#if defined(__FLT16_MAX__)
    const float specials[] = {0.0f,     -0.0f,     1.0f,      65504.0f, 65519.99f, 65520.0f,
                              1e-8f,    2.98e-8f,  2.99e-8f,  6.1e-5f,  6.0975e-5f, 1e10f,
                              -1e-7f,   INFINITY,  -INFINITY, 0.33333f, 1.00048828125f,
                              1.000732421875f};
    bad = 0;
    for (size_t i = 0; i < sizeof specials / sizeof *specials; i++) {
        _Float16 r = (_Float16)specials[i];
        uint16_t rb;
        memcpy(&rb, &r, 2);
        if (sdpa__f32_to_f16(specials[i]) != rb) {
            printf("  f16(%g): got 0x%04x, expected 0x%04x\n", (double)specials[i],
                   sdpa__f32_to_f16(specials[i]), rb);
            bad++;
        }
    }
    for (int i = 0; i < 200000; i++) {
        float x = (float)(tl_uniform() * pow(2.0, 40 * tl_uniform()));
        _Float16 r = (_Float16)x;
        uint16_t rb;
        memcpy(&rb, &r, 2);
        bad += sdpa__f32_to_f16(x) != rb;
    }
    CHECK(bad == 0, "%d f32 -> f16 conversions differ from _Float16", bad);
#else
    tl_skip("f32 -> f16 against _Float16", "this compiler has no _Float16");
#endif

    /* bf16: round to nearest, ties to even, against exact arithmetic. */
    bad = 0;
    for (int i = 0; i < 200000; i++) {
        float x = (float)(tl_uniform() * pow(2.0, 60 * tl_uniform()));
        uint16_t b = sdpa__f32_to_bf16(x);
        double got = sdpa__bf16_to_f32(b);
        /* The two bf16 neighbours of x. */
        uint32_t u;
        memcpy(&u, &x, 4);
        uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
        float flo, fhi;
        memcpy(&flo, &lo, 4), memcpy(&fhi, &hi, 4);
        double dlo = fabs((double)x - flo), dhi = fabs((double)fhi - x);
        double want = dlo < dhi ? flo : dhi < dlo ? fhi : ((lo >> 16) & 1 ? fhi : flo);
        bad += got != want;
    }
    CHECK(bad == 0, "%d f32 -> bf16 roundings wrong", bad);
    CHECK(isnan(sdpa__bf16_to_f32(sdpa__f32_to_bf16(NAN))), "bf16 NaN stays NaN");
    return tl_finish();
}
