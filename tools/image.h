/*
 * image.h - 8-bit RGB images for `sdpa dit`: PNG output (libpng), PSNR,
 * SSIM and a difference heat map.
 */
#ifndef SDPA_IMAGE_H
#define SDPA_IMAGE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct image {
    int w, h;
    uint8_t *rgb; /* w * h * 3, row-major */
} image;

int image_alloc(image *im, int w, int h);
void image_free(image *im);

/* PSNR in dB over all channels (peak 255); +inf for identical images. */
double image_psnr(const image *a, const image *b);

/*
 * SSIM as usually defined (Wang et al. 2004): 11x11 Gaussian window with
 * sigma 1.5, K1 = 0.01, K2 = 0.03, L = 255, computed per channel over the
 * valid window positions and averaged. 1 for identical images.
 */
double image_ssim(const image *a, const image *b);

/* |a - b| per pixel (max over channels), amplified x8, as a heat ramp. */
int image_diff_heatmap(const image *a, const image *b, image *out);

/* Writes im as a PNG to f: 0, or -1 with a reason in err. Callers that
 * must not leave a partial file write through output.h. */
int image_write_png(FILE *f, const image *im, char *err, size_t errn);

#endif
