/*
 * stats.c - medians and a paired bootstrap interval for the ratio of two
 * arms' medians: the statistics behind `sdpa ab` and the tuner.
 */
#include "../core/core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double sdpa_median(const double *x, int n)
{
    if (n <= 0 || !x)
        return NAN;
    double small[64], *tmp = n <= 64 ? small : sdpa__malloc(sizeof(double) * (size_t)n);
    if (!tmp)
        return x[0];
    memcpy(tmp, x, sizeof(double) * (size_t)n);
    qsort(tmp, (size_t)n, sizeof(double), cmp_double);
    double m = n % 2 ? tmp[n / 2] : 0.5 * (tmp[n / 2 - 1] + tmp[n / 2]);
    if (tmp != small)
        free(tmp);
    return m;
}

void sdpa_ab_compare(const double *a, const double *b, int n, double min_gain,
                     sdpa_ab_result *out)
{
    enum { RESAMPLES = 2000 };
    memset(out, 0, sizeof *out);
    if (n <= 0 || !a || !b) { /* nothing measured: no interval, no verdict */
        out->median_a = out->median_b = out->ratio = out->lo = out->hi = NAN;
        out->verdict = SDPA_AB_TIE;
        return;
    }
    out->median_a = sdpa_median(a, n);
    out->median_b = sdpa_median(b, n);
    out->ratio = out->median_b / out->median_a;
    double *ra = sdpa__malloc(sizeof(double) * (size_t)n), *rb = sdpa__malloc(sizeof(double) * (size_t)n);
    double *ratios = sdpa__malloc(sizeof(double) * RESAMPLES);
    if (!ra || !rb || !ratios) {
        free(ra), free(rb), free(ratios);
        out->lo = 0, out->hi = 1e300; /* no interval: no verdict */
        return;
    }
    uint64_t s = 0x2545f4914f6cdd1dull; /* fixed: reproducible verdicts */
    for (int r = 0; r < RESAMPLES; r++) {
        for (int i = 0; i < n; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            int k = (int)(s % (uint64_t)n);
            ra[i] = a[k], rb[i] = b[k];
        }
        ratios[r] = sdpa_median(rb, n) / sdpa_median(ra, n);
    }
    qsort(ratios, RESAMPLES, sizeof(double), cmp_double);
    out->lo = ratios[(int)(0.025 * RESAMPLES)];
    out->hi = ratios[(int)(0.975 * RESAMPLES) - 1];
    if (out->hi < 1.0 && out->ratio <= 1.0 - min_gain)
        out->verdict = SDPA_AB_B_FASTER;
    else if (out->lo > 1.0 && out->ratio >= 1.0 + min_gain)
        out->verdict = SDPA_AB_B_SLOWER;
    else
        out->verdict = SDPA_AB_TIE;
    free(ra), free(rb), free(ratios);
}

const char *sdpa_ab_verdict_text(sdpa_ab_verdict v)
{
    switch (v) {
    case SDPA_AB_B_FASTER: return "B is faster";
    case SDPA_AB_B_SLOWER: return "B is slower";
    case SDPA_AB_TIE: return "no difference at this noise level";
    }
    return "?";
}
