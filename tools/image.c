/* image.c - see image.h. */
#define _POSIX_C_SOURCE 200809L
#include "image.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef SDPA_HAVE_PNG
#include <png.h>
#include <setjmp.h>
#endif

int image_alloc(image *im, int w, int h)
{
    im->w = w, im->h = h;
    im->rgb = calloc((size_t)w * (size_t)h * 3, 1);
    return im->rgb != NULL;
}

void image_free(image *im)
{
    free(im->rgb);
    im->rgb = NULL;
}

double image_psnr(const image *a, const image *b)
{
    const size_t n = (size_t)a->w * (size_t)a->h * 3;
    double se = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a->rgb[i] - b->rgb[i];
        se += d * d;
    }
    if (se == 0)
        return INFINITY;
    return 10.0 * log10(255.0 * 255.0 / (se / (double)n));
}

double image_ssim(const image *a, const image *b)
{
    enum { R = 5 }; /* 11 x 11 window */
    double g[2 * R + 1], sum = 0;
    for (int i = -R; i <= R; i++)
        sum += g[i + R] = exp(-(double)(i * i) / (2 * 1.5 * 1.5));
    for (int i = 0; i < 2 * R + 1; i++)
        g[i] /= sum;
    const double C1 = (0.01 * 255) * (0.01 * 255), C2 = (0.03 * 255) * (0.03 * 255);
    double total = 0;
    long count = 0;
    for (int c = 0; c < 3; c++)
        for (int y = R; y < a->h - R; y++)
            for (int x = R; x < a->w - R; x++) {
                double ma = 0, mb = 0, saa = 0, sbb = 0, sab = 0;
                for (int dy = -R; dy <= R; dy++)
                    for (int dx = -R; dx <= R; dx++) {
                        const double w = g[dy + R] * g[dx + R];
                        const size_t i = ((size_t)(y + dy) * (size_t)a->w + (size_t)(x + dx)) * 3 + (size_t)c;
                        const double pa = a->rgb[i], pb = b->rgb[i];
                        ma += w * pa, mb += w * pb;
                        saa += w * pa * pa, sbb += w * pb * pb, sab += w * pa * pb;
                    }
                const double va = saa - ma * ma, vb = sbb - mb * mb, cov = sab - ma * mb;
                total += ((2 * ma * mb + C1) * (2 * cov + C2)) /
                         ((ma * ma + mb * mb + C1) * (va + vb + C2));
                count++;
            }
    return count ? total / (double)count : 1.0;
}

int image_diff_heatmap(const image *a, const image *b, image *out)
{
    if (!image_alloc(out, a->w, a->h))
        return 0;
    for (int i = 0; i < a->w * a->h; i++) {
        int d = 0;
        for (int c = 0; c < 3; c++) {
            int e = abs((int)a->rgb[i * 3 + c] - (int)b->rgb[i * 3 + c]);
            d = e > d ? e : d;
        }
        double v = d * 8.0 / 255.0; /* black -> red -> yellow -> white */
        v = v > 1 ? 1 : v;
        out->rgb[i * 3 + 0] = (uint8_t)(255 * fmin(1.0, 3 * v));
        out->rgb[i * 3 + 1] = (uint8_t)(255 * fmin(1.0, fmax(0.0, 3 * v - 1)));
        out->rgb[i * 3 + 2] = (uint8_t)(255 * fmin(1.0, fmax(0.0, 3 * v - 2)));
    }
    return 1;
}

int image_write_png(FILE *f, const image *im, char *err, size_t errn)
{
#ifdef SDPA_HAVE_PNG
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    volatile int ok = png && info; /* survives a longjmp from libpng */
    if (ok && setjmp(png_jmpbuf(png)) == 0) {
        png_init_io(png, f);
        png_set_IHDR(png, info, (png_uint_32)im->w, (png_uint_32)im->h, 8, PNG_COLOR_TYPE_RGB,
                     PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
        png_write_info(png, info);
        for (int y = 0; y < im->h; y++)
            png_write_row(png, im->rgb + (size_t)y * (size_t)im->w * 3);
        png_write_end(png, NULL);
    } else {
        ok = 0;
    }
    png_destroy_write_struct(&png, &info);
    if (!ok || fflush(f) != 0)
        return snprintf(err, errn, "cannot write the PNG"), -1;
    return 0;
#else
    (void)im, (void)f;
    snprintf(err, errn, "this build has no libpng (install libpng-dev)");
    return -1;
#endif
}
