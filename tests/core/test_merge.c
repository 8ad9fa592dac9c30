/*
 * test_merge.c - sdpa_merge against attention over all the keys: random
 * problems (strided views, GQA, f32 and bf16) split into disjoint key
 * ranges, each part run by ref with its LSE, the parts merged, the result
 * compared with ref on the whole. Also: the merge is symmetric (bitwise),
 * three parts merge the same in either grouping, in-place accumulation, a
 * side that saw no key (LSE -inf, its output poisoned with NaN: never
 * read), both sides empty, a NaN LSE, bad arguments.
 */
#include "support/testlib.h"
#include "core/core.h"
#include "core/convert.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static sdpa_context *ctx;

/* Keys [j0, j0 + n) of k or v, as a view. */
static sdpa_tensor keys(const sdpa_tensor *t, int64_t j0, int64_t n)
{
    sdpa_tensor s = *t;
    s.data = (char *)t->data + j0 * t->stride[1] * (int64_t)sdpa_dtype_size(t->dtype);
    s.size[1] = n;
    return s;
}

/* ref over keys [j0, j0 + n), with a key mask hiding them all when hide. */
static void partial(const tl_problem *p, int64_t j0, int64_t n, int hide, tl_output *o)
{
    tl_output_make(o, p);
    sdpa_tensor k = keys(&p->k, j0, n), v = keys(&p->v, j0, n);
    sdpa_params prm = SDPA_PARAMS_DEFAULT;
    prm.backend = "ref";
    sdpa_mask m = SDPA_MASK_DEFAULT;
    uint8_t none[1] = {0};
    if (hide) {
        m.key = none; /* stride 0: every key hidden in every batch entry */
        prm.mask = &m;
    }
    CHECK_STATUS(sdpa_forward(ctx, &p->q, &k, &v, &o->t, o->lse, &prm), SDPA_OK);
}

static double max_lse_diff(const float *a, const float *b, int64_t n)
{
    double w = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = isinf(a[i]) || isinf(b[i]) ? (a[i] == b[i] ? 0 : INFINITY) : fabs(a[i] - b[i]);
        w = d > w || isnan(d) ? (isnan(d) ? INFINITY : d) : w;
    }
    return w;
}

static void split_case(tl_case c)
{
    tl_problem p;
    tl_output whole, a, b, m, m2, third, left, right;
    tl_problem_make(&p, &c);
    tl_output_make(&whole, &p);
    sdpa_params prm = SDPA_PARAMS_DEFAULT;
    prm.backend = "ref";
    CHECK_STATUS(sdpa_forward(ctx, &p.q, &p.k, &p.v, &whole.t, whole.lse, &prm), SDPA_OK);
    const int64_t s1 = c.Skv / 3, s2 = c.Skv / 3 * 2, nl = c.B * c.Hq * c.Sq;
    const double tol = c.out_dtype == SDPA_F32 ? 2e-6 : 8e-3;
    /* two parts */
    partial(&p, 0, s1, 0, &a), partial(&p, s1, c.Skv - s1, 0, &b);
    tl_output_make(&m, &p), tl_output_make(&m2, &p);
    CHECK_STATUS(sdpa_merge(&a.t, a.lse, &b.t, b.lse, &m.t, m.lse), SDPA_OK);
    CHECK(tl_max_diff(&m, &whole, NULL) <= tol, "two parts: |out - whole| %.3g",
          tl_max_diff(&m, &whole, NULL));
    CHECK(max_lse_diff(m.lse, whole.lse, nl) <= 2e-6, "two parts: |lse - whole| %.3g",
          max_lse_diff(m.lse, whole.lse, nl));
    char why[128];
    CHECK(tl_output_check(&m, why, sizeof why), "two parts: %s", why);
    CHECK_STATUS(sdpa_merge(&b.t, b.lse, &a.t, a.lse, &m2.t, m2.lse), SDPA_OK);
    CHECK(memcmp(m.mem, m2.mem, m.bytes) == 0 && memcmp(m.lse, m2.lse, sizeof(float) * nl) == 0,
          "merge(a, b) and merge(b, a) differ");
    /* three parts, either grouping; the left one accumulated in place */
    tl_output_free(&b);
    partial(&p, s1, s2 - s1, 0, &b), partial(&p, s2, c.Skv - s2, 0, &third);
    tl_output_make(&left, &p), tl_output_make(&right, &p);
    CHECK_STATUS(sdpa_merge(&a.t, a.lse, &b.t, b.lse, &a.t, a.lse), SDPA_OK); /* in place */
    CHECK_STATUS(sdpa_merge(&a.t, a.lse, &third.t, third.lse, &a.t, a.lse), SDPA_OK);
    CHECK(tl_max_diff(&a, &whole, NULL) <= tol, "three parts in place: |out - whole| %.3g",
          tl_max_diff(&a, &whole, NULL));
    CHECK(max_lse_diff(a.lse, whole.lse, nl) <= 4e-6, "three parts: |lse - whole| %.3g",
          max_lse_diff(a.lse, whole.lse, nl));
    tl_output_free(&a), tl_output_free(&b), tl_output_free(&third);
    tl_output_free(&left), tl_output_free(&right);
    /* a side that saw no key: lse -inf, output poisoned, never read */
    tl_output empty;
    partial(&p, 0, s1, 1, &empty);
    partial(&p, 0, c.Skv, 0, &a);
    for (int64_t i = 0; i < nl; i++)
        CHECK(empty.lse[i] == -INFINITY, "the hidden part's lse is %g", empty.lse[i]);
    for (int64_t b0 = 0; b0 < c.B; b0++)
        for (int64_t i = 0; i < c.Sq; i++)
            for (int64_t h = 0; h < c.Hq; h++)
                sdpa__store_f32(empty.t.data, empty.t.dtype, sdpa__offset(&empty.t, b0, i, h, 0),
                                NAN);
    CHECK_STATUS(sdpa_merge(&empty.t, empty.lse, &a.t, a.lse, &m.t, m.lse), SDPA_OK);
    CHECK(tl_max_diff(&m, &a, NULL) == 0 && max_lse_diff(m.lse, a.lse, nl) == 0,
          "merging with an empty side changed the other: %.3g", tl_max_diff(&m, &a, NULL));
    /* both empty: zeros and -inf; a NaN lse: a NaN row */
    CHECK_STATUS(sdpa_merge(&empty.t, empty.lse, &empty.t, empty.lse, &m.t, m.lse), SDPA_OK);
    CHECK(tl_max_abs(&m) == 0 && max_lse_diff(m.lse, empty.lse, nl) == 0,
          "both empty: max |out| %.3g", tl_max_abs(&m));
    a.lse[0] = NAN;
    CHECK_STATUS(sdpa_merge(&a.t, a.lse, &whole.t, whole.lse, &m.t, m.lse), SDPA_OK);
    CHECK(isnan(m.lse[0]) && isnan(tl_out_get(&m.t, 0, 0, 0, 0)) && !isnan(m.lse[1]),
          "a NaN lse: row 0 must be NaN, the others not");
    tl_output_free(&empty), tl_output_free(&a), tl_output_free(&m), tl_output_free(&m2);
    tl_output_free(&whole), tl_problem_free(&p);
}

static void bad_input(void)
{
    tl_case c = {1, 8, 8, 2, 2, 16, SDPA_F32, SDPA_F32, SDPA_CAUSAL_NONE, TL_BSHD, 1,
                 TL_UNIFORM, 0, 0};
    tl_problem p;
    tl_output a, b, o;
    tl_problem_make(&p, &c);
    tl_output_make(&a, &p), tl_output_make(&b, &p), tl_output_make(&o, &p);
    memset(a.lse, 0, sizeof(float) * 16), memset(b.lse, 0, sizeof(float) * 16);
    sdpa_tensor small = b.t;
    small.size[1] = 7;
    CHECK(sdpa_merge(&a.t, a.lse, &small, b.lse, &o.t, o.lse) == SDPA_INVALID_ARGUMENT &&
              strstr(sdpa_last_error(), "o_b->size[1] is 7, expected 8"),
          "size mismatch: %s", sdpa_last_error());
    CHECK(sdpa_merge(&a.t, NULL, &b.t, b.lse, &o.t, o.lse) == SDPA_INVALID_ARGUMENT &&
              strstr(sdpa_last_error(), "lse_a is NULL"),
          "NULL lse_a: %s", sdpa_last_error());
    sdpa_tensor shifted = a.t;
    shifted.data = (float *)a.t.data + 1; /* overlaps o_a, but is not it */
    CHECK(sdpa_merge(&a.t, a.lse, &b.t, b.lse, &shifted, o.lse) == SDPA_INVALID_ARGUMENT &&
              strstr(sdpa_last_error(), "out overlaps o_a"),
          "overlap: %s", sdpa_last_error());
    CHECK(sdpa_merge(&a.t, a.lse, &b.t, b.lse, &o.t, a.lse + 1) == SDPA_INVALID_ARGUMENT &&
              strstr(sdpa_last_error(), "lse overlaps lse_a"),
          "lse overlap: %s", sdpa_last_error());
    sdpa_tensor gpu = a.t;
    gpu.device.kind = SDPA_DEVICE_CUDA;
    CHECK(sdpa_merge(&gpu, a.lse, &b.t, b.lse, &o.t, o.lse) == SDPA_INVALID_ARGUMENT &&
              strstr(sdpa_last_error(), "o_a is on a CUDA device"),
          "device: %s", sdpa_last_error());
    tl_output_free(&a), tl_output_free(&b), tl_output_free(&o), tl_problem_free(&p);
}

int main(void)
{
    tl_seed_from_env();
    ctx = tl_context(NULL);
    split_case((tl_case){2, 37, 100, 4, 2, 24, SDPA_F32, SDPA_F32, SDPA_CAUSAL_NONE, TL_STRIDED, 1,
                         TL_UNIFORM, 0, 0});
    split_case((tl_case){1, 64, 301, 2, 2, 64, SDPA_F32, SDPA_F32, SDPA_CAUSAL_NONE, TL_BHSD, 1,
                         TL_PEAKED, 0, 0});
    split_case((tl_case){2, 17, 90, 2, 1, 32, SDPA_BF16, SDPA_BF16, SDPA_CAUSAL_NONE, TL_BSHD, 1,
                         TL_UNIFORM, 0, 0});
    bad_input();
    sdpa_context_destroy(ctx);
    return tl_finish();
}
