/*
 * test_stats.c - the A/B statistics on synthetic samples: a clear win, a
 * clear loss, a tie within noise, and a win too small to matter.
 *
 * The samples come from a fixed private stream, not the run's seed: a 95%
 * interval misses one run in twenty by design, so a verdict on fresh
 * samples would fail by chance. Fixed samples make the verdicts exact
 * facts about sdpa_ab_compare.
 */
#include "support/testlib.h"

#include <math.h>

static uint64_t stream = 0x9e3779b97f4a7c15ull;

static double fixed_uniform(void) /* [-1, 1) */
{
    stream ^= stream << 13, stream ^= stream >> 7, stream ^= stream << 17;
    return (double)(stream >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

static void samples(double *a, double *b, int n, double ratio, double noise)
{
    for (int i = 0; i < n; i++) {
        const double drift = 1.0 + 0.3 * sin(i * 0.7); /* shared by both arms of a round */
        a[i] = 10.0 * drift * (1.0 + noise * fixed_uniform());
        b[i] = 10.0 * ratio * drift * (1.0 + noise * fixed_uniform());
    }
}

int main(void)
{
    double a[41], b[41];
    sdpa_ab_result r;

    CHECK(sdpa_median((const double[]){3, 1, 2}, 3) == 2.0, "odd median");
    CHECK(sdpa_median((const double[]){4, 1, 3, 2}, 4) == 2.5, "even median");

    samples(a, b, 21, 0.80, 0.02);
    sdpa_ab_compare(a, b, 21, 0.0, &r);
    CHECK(r.verdict == SDPA_AB_B_FASTER, "clear win: %s, ratio %.3f [%.3f, %.3f]",
          sdpa_ab_verdict_text(r.verdict), r.ratio, r.lo, r.hi);
    CHECK(r.lo <= r.ratio && r.ratio <= r.hi && r.hi < 1.0, "interval [%.3f, %.3f] around %.3f",
          r.lo, r.hi, r.ratio);

    samples(a, b, 21, 1.25, 0.02);
    sdpa_ab_compare(a, b, 21, 0.0, &r);
    CHECK(r.verdict == SDPA_AB_B_SLOWER, "clear loss: %s, ratio %.3f [%.3f, %.3f]",
          sdpa_ab_verdict_text(r.verdict), r.ratio, r.lo, r.hi);

    samples(a, b, 21, 1.00, 0.10);
    sdpa_ab_compare(a, b, 21, 0.0, &r);
    CHECK(r.verdict == SDPA_AB_TIE && r.lo < 1.0 && r.hi > 1.0, "tie: %s, ratio %.3f [%.3f, %.3f]",
          sdpa_ab_verdict_text(r.verdict), r.ratio, r.lo, r.hi);

    samples(a, b, 41, 0.99, 0.001); /* real but below a 2% minimum gain */
    sdpa_ab_compare(a, b, 41, 0.02, &r);
    CHECK(r.verdict == SDPA_AB_TIE, "1%% gain with min_gain 2%%: %s", sdpa_ab_verdict_text(r.verdict));
    sdpa_ab_compare(a, b, 41, 0.0, &r);
    CHECK(r.verdict == SDPA_AB_B_FASTER, "1%% gain without a minimum: %s", sdpa_ab_verdict_text(r.verdict));

    /* No samples: no median, no verdict, and no undefined behaviour. */
    CHECK(isnan(sdpa_median(a, 0)), "median of nothing is NaN");
    sdpa_ab_result r0;
    sdpa_ab_compare(a, b, 0, 0.0, &r0);
    CHECK(r0.verdict == SDPA_AB_TIE && isnan(r0.ratio), "A/B of nothing: a tie, ratio NaN");

    sdpa_ab_result r2; /* deterministic for the same samples */
    sdpa_ab_compare(a, b, 41, 0.0, &r2);
    CHECK(r.lo == r2.lo && r.hi == r2.hi, "bootstrap is reproducible");
    return tl_finish();
}
