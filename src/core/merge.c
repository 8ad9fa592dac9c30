/*
 * merge.c - sdpa_merge: two partial attention results over disjoint key
 * sets made one, the step every sequence-parallel scheme (ring attention,
 * Ulysses with split keys, joint text tokens) repeats. With m = max(la, lb)
 * and n = min(la, lb):
 *
 *     lse = m + log1p(exp(n - m))        (never exp of a large number)
 *     out = exp(la - lse) oa + exp(lb - lse) ob
 *
 * in float32. The formula is symmetric in a and b, so merge(a, b) and
 * merge(b, a) are bitwise equal; three or more partials merge the same up
 * to rounding whatever the order. A side with lse = -inf saw no key and is
 * not read at all (not multiplied by 0: its values may be anything); both
 * -inf gives zeros and -inf. A NaN or +inf lse makes the row NaN, as a NaN
 * score does in sdpa_forward. One pass over the rows, single-threaded: it
 * reads each input element once, a small cost next to the attention.
 */
#include "core.h"
#include "convert.h"

#include <math.h>
#include <string.h>

static int same_view(const sdpa_tensor *a, const sdpa_tensor *b)
{
    return a->data == b->data && a->dtype == b->dtype &&
           memcmp(a->stride, b->stride, sizeof a->stride) == 0;
}

static sdpa_status check(const sdpa_tensor *o_a, const float *lse_a, const sdpa_tensor *o_b,
                         const float *lse_b, const sdpa_tensor *out, const float *lse)
{
    const sdpa_tensor *t[3] = {o_a, o_b, out};
    static const char *names[3] = {"o_a", "o_b", "out"};
    int64_t span[3];
    sdpa_status st;
    for (int i = 0; i < 3; i++) {
        if ((st = sdpa__check_tensor(t[i], names[i], i == 2, &span[i])) != SDPA_OK)
            return st;
        if (t[i]->device.kind != SDPA_DEVICE_CPU)
            return sdpa__fail(SDPA_INVALID_ARGUMENT,
                              "%s is on a CUDA device, expected CPU memory (sdpa_merge runs on "
                              "the CPU)",
                              names[i]);
        for (int d = 0; d < 4; d++)
            if (t[i]->size[d] != o_a->size[d])
                return sdpa__fail(SDPA_INVALID_ARGUMENT,
                                  "%s->size[%d] is %lld, expected %lld as in o_a", names[i], d,
                                  (long long)t[i]->size[d], (long long)o_a->size[d]);
    }
    if (!lse_a || !lse_b)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "%s is NULL, expected its partial's LSE",
                          lse_a ? "lse_b" : "lse_a");
    for (int i = 0; i < 2; i++) /* out is an input itself, or apart from it */
        if (!same_view(out, t[i]) && sdpa__overlaps(out->data, span[2], t[i]->data, span[i]))
            return sdpa__fail(SDPA_INVALID_ARGUMENT,
                              "out overlaps %s in memory, expected %s itself or a separate "
                              "buffer",
                              names[i], names[i]);
    const int64_t rows = o_a->size[0] * o_a->size[1] * o_a->size[2];
    const int64_t bytes = rows * (int64_t)sizeof(float);
    const float *lses[2] = {lse_a, lse_b};
    for (int i = 0; lse && i < 2; i++)
        if (lse != lses[i] && sdpa__overlaps(lse, bytes, lses[i], bytes))
            return sdpa__fail(SDPA_INVALID_ARGUMENT,
                              "lse overlaps %s in memory, expected %s itself or a separate "
                              "buffer",
                              i ? "lse_b" : "lse_a", i ? "lse_b" : "lse_a");
    return SDPA_OK;
}

sdpa_status sdpa_merge(const sdpa_tensor *o_a, const float *lse_a, const sdpa_tensor *o_b,
                       const float *lse_b, sdpa_tensor *out, float *lse)
{
    sdpa_status st = check(o_a, lse_a, o_b, lse_b, out, lse);
    if (st != SDPA_OK)
        return st;
    const int64_t B = o_a->size[0], S = o_a->size[1], H = o_a->size[2], D = o_a->size[3];
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < S; i++) {
                const int64_t r = (b * H + h) * S + i; /* the LSE layout: [B, H, S] */
                const float la = lse_a[r], lb = lse_b[r];
                const int64_t ea = sdpa__offset(o_a, b, i, h, 0), eb = sdpa__offset(o_b, b, i, h, 0);
                const int64_t eo = sdpa__offset(out, b, i, h, 0);
                float wa, wb, l;
                if (isnan(la) || isnan(lb) || la == INFINITY || lb == INFINITY) {
                    wa = wb = l = NAN; /* the row is NaN */
                } else if (la == -INFINITY && lb == -INFINITY) {
                    wa = wb = 0.0f, l = -INFINITY;
                } else {
                    const float m = la > lb ? la : lb, n = la > lb ? lb : la;
                    l = m + log1pf(expf(n - m)); /* expf(-inf) = 0 */
                    wa = la == -INFINITY ? 0.0f : expf(la - l);
                    wb = lb == -INFINITY ? 0.0f : expf(lb - l);
                }
                for (int64_t d = 0; d < D; d++) {
                    float v = 0.0f;
                    if (wa != 0.0f) /* a side that saw nothing is not read */
                        v += wa * sdpa__load_f32(o_a->data, o_a->dtype, ea + d * o_a->stride[3]);
                    if (wb != 0.0f)
                        v += wb * sdpa__load_f32(o_b->data, o_b->dtype, eb + d * o_b->stride[3]);
                    sdpa__store_f32(out->data, out->dtype, eo + d * out->stride[3], v);
                }
                if (lse)
                    lse[r] = l;
            }
    sdpa__clear_error();
    return SDPA_OK;
}
