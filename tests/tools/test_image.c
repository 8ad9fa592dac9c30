/*
 * test_image.c - PSNR and SSIM against hand-computed values: identical
 * images give +inf dB and SSIM 1; a constant shift of 10 gives
 * 10 log10(255^2 / 100) dB; two flat images 100 and 110 give SSIM
 * (2*100*110 + C1) / (100^2 + 110^2 + C1) with C1 = (0.01 * 255)^2.
 */
#include "support/testlib.h"
#include "image.h"

#include <math.h>

int main(void)
{
    tl_seed_from_env();
    image a, b;
    image_alloc(&a, 40, 30), image_alloc(&b, 40, 30);
    for (int i = 0; i < 40 * 30 * 3; i++)
        a.rgb[i] = b.rgb[i] = (uint8_t)(20 + 200 * (tl_uniform() * 0.5 + 0.5));
    CHECK(isinf(image_psnr(&a, &b)) && image_psnr(&a, &b) > 0, "identical: PSNR %g",
          image_psnr(&a, &b));
    CHECK(fabs(image_ssim(&a, &b) - 1.0) < 1e-12, "identical: SSIM %.15f", image_ssim(&a, &b));

    for (int i = 0; i < 40 * 30 * 3; i++)
        b.rgb[i] = (uint8_t)(a.rgb[i] + 10);
    const double want = 10 * log10(255.0 * 255.0 / 100.0);
    CHECK(fabs(image_psnr(&a, &b) - want) < 1e-9, "shift 10: PSNR %.6f, expected %.6f",
          image_psnr(&a, &b), want);
    CHECK(image_ssim(&a, &b) < 1.0 && image_ssim(&a, &b) > 0.9, "shift 10: SSIM %.6f",
          image_ssim(&a, &b));

    for (int i = 0; i < 40 * 30 * 3; i++)
        a.rgb[i] = 100, b.rgb[i] = 110;
    const double C1 = (0.01 * 255) * (0.01 * 255);
    const double ssim = (2 * 100.0 * 110.0 + C1) / (100.0 * 100.0 + 110.0 * 110.0 + C1);
    CHECK(fabs(image_ssim(&a, &b) - ssim) < 1e-9, "flat 100 vs 110: SSIM %.9f, expected %.9f",
          image_ssim(&a, &b), ssim);

    image h;
    CHECK(image_diff_heatmap(&a, &b, &h) && h.rgb[0] > 0, "heat map marks the difference");
    image_free(&h);
    image_free(&a), image_free(&b);
    return tl_finish();
}
