/*
 * stats.h - the statistics behind `sdpa ab` (and the tuner): medians and
 * a paired bootstrap interval for the ratio of two arms' medians.
 */
#ifndef SDPA_STATS_H
#define SDPA_STATS_H

#include <stdint.h>

double stats_median(const double *x, int n); /* n >= 1; x is not modified */

typedef enum ab_verdict {
    AB_TIE = 0,     /* the interval contains 1: no difference at this noise level */
    AB_B_FASTER = 1,
    AB_B_SLOWER = 2
} ab_verdict;

typedef struct ab_result {
    double median_a, median_b;
    double ratio;  /* median_b / median_a: below 1 means B is faster */
    double lo, hi; /* 95% bootstrap interval of the ratio */
    ab_verdict verdict;
} ab_result;

/*
 * a[i] and b[i] are the times of round i (paired: measured side by side).
 * The interval resamples rounds with replacement (2000 resamples, fixed
 * seed: the same samples give the same answer). The verdict needs the
 * interval to exclude 1 and the ratio to differ from 1 by at least
 * min_gain (e.g. 0.02 for 2%).
 */
void ab_compare(const double *a, const double *b, int n, double min_gain, ab_result *out);

const char *ab_verdict_text(ab_verdict v);

#endif
