/*
 * test_vec_exp.c - the CPU kernels' vector exponentials against the
 * float64 one, each on the CPU that has its ISA (else skipped, saying so):
 * cpu.avx2's exp256, the AVX-512 kernels' exp512 and exp2_bf16 (P for a
 * bf16 product). A dense sweep and random points of each one's domain
 * within a relative bound, its exact values (1 at 0, 0 at -inf and far
 * below, NaN kept), and for the fp32 ones no denormal result near the
 * underflow (an assist on some cores). The test grid sees an exponential
 * only through whole softmaxes, where an error of 1e-6 hides in the
 * tolerance; this names the function. Built on x86 only (tests/CMakeLists.txt).
 */
#include "support/testlib.h"

#include "vec_exp.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

typedef void exp_fn(const float *x, float *y, size_t n);

typedef struct exp_case {
    const char *name;
    exp_fn *fn;
    int base2;          /* 2^x, else e^x                                          */
    double lo, hi;      /* the domain checked for accuracy (normal results)       */
    double rel, per_x;  /* bound: rel + per_x |x| (e^x: x log2(e) is rounded once,
                         * 2^-24 of it, 6e-8 |x| relative in the result)          */
    double zero_below;  /* x at or below this gives exactly 0                     */
    int normal_only;    /* every nonzero result is normal                         */
} exp_case;

enum { N = 1 << 20 };

static double want_of(const exp_case *ec, double x) { return ec->base2 ? exp2(x) : exp(x); }

static void check_case(const exp_case *ec)
{
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    if (!x || !y) {
        CHECK(0, "out of memory");
        free(x), free(y);
        return;
    }
    /* half a sweep of the domain, half random points in it */
    for (int i = 0; i < N; i++)
        x[i] = (float)(i < N / 2 ? ec->lo + (ec->hi - ec->lo) * i / (N / 2 - 1)
                                 : ec->lo + (ec->hi - ec->lo) * (tl_uniform() + 1) / 2);
    ec->fn(x, y, N);
    double worst = 0, worst_err = 0, worst_x = 0;
    for (int i = 0; i < N; i++) {
        const double want = want_of(ec, x[i]), err = fabs(y[i] - want) / want;
        const double r = err / (ec->rel + ec->per_x * fabs(x[i]));
        if (!(r <= worst)) /* NaN too */
            worst = r, worst_err = err, worst_x = x[i];
    }
    CHECK(worst <= 1, "%s: relative error %.3g at x = %.9g, over its bound %.3g", ec->name,
          worst_err, worst_x, ec->rel + ec->per_x * fabs(worst_x));
    if (getenv("SDPA_TEST_VERBOSE"))
        printf("  %s: worst relative error %.3g at x = %.9g (%.2f of the bound)\n", ec->name,
               worst_err, worst_x, worst);

    /* exact values, 16 lanes of each */
    const float special[] = {0.0f, -0.0f, -INFINITY, -1e30f, (float)ec->zero_below, NAN};
    const int nspecial = (int)(sizeof special / sizeof *special);
    for (int s = 0; s < nspecial; s++) {
        for (int i = 0; i < 16; i++)
            x[i] = special[s];
        ec->fn(x, y, 16);
        int bad = 0;
        for (int i = 0; i < 16; i++)
            bad += s < 2 ? y[i] != 1.0f : s < 5 ? y[i] != 0.0f : !isnan(y[i]);
        CHECK(bad == 0, "%s(%g) = %.9g, expected %s", ec->name, (double)special[s], (double)y[0],
              s < 2 ? "1 exactly" : s < 5 ? "0 exactly" : "NaN");
    }
    /* below zero_below: 0; around it: 0 or a normal number where asked */
    int bad_zero = 0, bad_normal = 0;
    for (int i = 0; i < N; i++)
        x[i] = (float)(ec->zero_below - 8.0 + 12.0 * i / (N - 1));
    ec->fn(x, y, N);
    float at_zero = 0, at_normal = 0;
    for (int i = 0; i < N; i++) {
        if (x[i] <= ec->zero_below && y[i] != 0.0f && !bad_zero++)
            at_zero = x[i];
        if (ec->normal_only && y[i] != 0.0f && !(y[i] >= FLT_MIN) && !bad_normal++)
            at_normal = x[i];
    }
    CHECK(bad_zero == 0, "%s: %d results at or below x = %g not 0 (the first at %.9g)", ec->name,
          bad_zero, ec->zero_below, (double)at_zero);
    CHECK(bad_normal == 0, "%s: %d denormal results near the underflow (the first at x = %.9g)",
          ec->name, bad_normal, (double)at_normal);
    free(x), free(y);
}

int main(void)
{
    tl_seed_from_env();
    const exp_case avx2 = {"exp256 (cpu.avx2)", sdpa_test_exp_avx2, 0, -87.3, 0.0, 3e-7, 9e-8,
                           -88.0, 1};
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        check_case(&avx2);
    else
        tl_skip(avx2.name, "this CPU has no AVX2 with FMA");
    const exp_case avx512[] = {
        {"exp512 (AVX-512 kernels)", sdpa_test_exp_avx512, 0, -87.0, 0.0, 3e-7, 9e-8, -87.5, 1},
        /* P for a bf16 product: the polynomial's 8.6e-5 (bf16 rounds at 2^-9); subnormal
         * from -150 to -126 by design (VCVTNE2PS2BF16 flushes them) */
        {"exp2_bf16 (cpu.amx, cpu.avx512bf16)", sdpa_test_exp2_bf16_avx512, 1, -126.0, 8.0, 1e-4,
         0.0, -150.0, 0}};
    for (size_t i = 0; i < sizeof avx512 / sizeof *avx512; i++)
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq"))
            check_case(&avx512[i]);
        else
            tl_skip(avx512[i].name, "this CPU has no AVX-512 F and DQ");
    return tl_finish();
}
