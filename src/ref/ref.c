/*
 * ref.c - the reference backend: the oracle every test compares against.
 *
 * Written for obviousness, not speed: one query row at a time, every score
 * in double, the softmax in three plain passes (max, sum, weighted sum).
 * It supports everything the API can describe. Rows are independent, so
 * (batch, head) pairs run in parallel; the per-row arithmetic order never
 * depends on the thread count, so the result is deterministic.
 *
 * Memory: (Skv + D) doubles per worker thread.
 */
#include "../core/convert.h"
#include "../core/backend.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

typedef struct ref_job {
    const sdpa_call *c;
    double *work; /* per worker: Skv scores + D accumulators */
} ref_job;

static double load(const sdpa_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d)
{
    return (double)sdpa__load_f32(t->data, t->dtype, sdpa__offset(t, b, s, h, d));
}

static void ref_task(void *arg, int64_t task, int worker)
{
    const ref_job *job = arg;
    const sdpa_call *c = job->c;
    const sdpa_call_desc *d = &c->desc;
    const int64_t b = task / d->Hq, h = task % d->Hq;
    const int64_t hk = h / (d->Hq / d->Hkv);
    const int64_t offset = c->causal == SDPA_CAUSAL_BOTTOM_RIGHT ? d->Skv - d->Sq : 0;
    double *score = job->work + (size_t)worker * (size_t)(d->Skv + d->D);
    double *acc = score + d->Skv;

    for (int64_t i = 0; i < d->Sq; i++) {
        /* Keys this query may see: j < n_keys. */
        int64_t n_keys = d->Skv;
        if (c->causal != SDPA_CAUSAL_NONE) {
            int64_t last = i + offset;
            n_keys = last < 0 ? 0 : (last + 1 < d->Skv ? last + 1 : d->Skv);
        }
        /* Scores beyond float32's range are +-inf, as the kernels form
         * them (sdpa.h, non-finite values); a NaN or +inf one poisons the
         * row, and -inf ones weigh nothing. */
        double max = -INFINITY;
        int poisoned = 0;
        for (int64_t j = 0; j < n_keys; j++) {
            double dot = 0.0;
            for (int64_t e = 0; e < d->D; e++)
                dot += load(c->q, b, i, h, e) * load(c->k, b, j, hk, e);
            double s = c->scale * dot;
            s = s > FLT_MAX ? INFINITY : s < -FLT_MAX ? -INFINITY : s;
            score[j] = s;
            poisoned |= s != s || s == INFINITY;
            if (s > max)
                max = s;
        }
        if (poisoned || max == -INFINITY) { /* NaN row, or a row that sees nothing */
            const float o = poisoned ? NAN : 0.0f;
            for (int64_t e = 0; e < d->D; e++)
                sdpa__store_f32(c->out->data, c->out->dtype, sdpa__offset(c->out, b, i, h, e), o);
            if (c->lse)
                c->lse[(b * d->Hq + h) * d->Sq + i] = poisoned ? NAN : -INFINITY;
            continue;
        }
        double sum = 0.0;
        for (int64_t j = 0; j < n_keys; j++) {
            score[j] = exp(score[j] - max);
            sum += score[j];
        }
        for (int64_t e = 0; e < d->D; e++)
            acc[e] = 0.0;
        for (int64_t j = 0; j < n_keys; j++)
            for (int64_t e = 0; e < d->D; e++)
                acc[e] += score[j] * load(c->v, b, j, hk, e);
        for (int64_t e = 0; e < d->D; e++)
            sdpa__store_f32(c->out->data, c->out->dtype, sdpa__offset(c->out, b, i, h, e),
                            (float)(acc[e] / sum));
        if (c->lse)
            c->lse[(b * d->Hq + h) * d->Sq + i] = (float)(max + log(sum));
    }
}

static sdpa_status ref_run(const sdpa_backend *self, const sdpa_call *c)
{
    (void)self;
    int threads = sdpa__pool_threads(c->pool);
    size_t per = (size_t)(c->desc.Skv + c->desc.D);
    ref_job job = {c, sdpa__malloc(sizeof(double) * per * (size_t)threads)};
    if (!job.work)
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "ref: cannot allocate %zu bytes of work space",
                          sizeof(double) * per * (size_t)threads);
    sdpa__parallel_for(c->pool, c->desc.B * c->desc.Hq, ref_task, &job);
    free(job.work);
    return SDPA_OK;
}

const sdpa_backend sdpa__backend_ref = {
    .name = "ref",
    .summary = "float64 reference: obvious loops, the test oracle",
    .device = SDPA_DEVICE_CPU,
    .caps = {.dtypes = SDPA_DTYPE_BIT(SDPA_F32) | SDPA_DTYPE_BIT(SDPA_F16) |
                       SDPA_DTYPE_BIT(SDPA_BF16),
             .d_min = 1, .d_max = 1 << 20, .d_multiple = 1, .gqa = 1, .cross = 1,
             .causal_top_left = 1, .causal_bottom_right = 1, .lse = 1, .deterministic = 1},
    .fallback_rank = 1,
    .version = SDPA_VERSION_STRING,
    .run = ref_run,
};
