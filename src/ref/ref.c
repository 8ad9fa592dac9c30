/*
 * ref.c - the reference backend: the oracle every test compares against.
 *
 * Written for obviousness, not speed: one query row at a time, every score
 * in double, the softmax in three plain passes (max, sum, weighted sum).
 * It supports everything the API can describe. Rows are independent, so
 * (batch, head) pairs run in parallel; the per-row arithmetic order never
 * depends on the thread count, so the result is deterministic.
 *
 * Memory: (Skv + D) doubles per worker thread; the backward pass
 * (2 Skv D + 2 Skv + D) doubles.
 */
#include "../core/convert.h"
#include "../core/backend.h"
#include "../core/sparse.h"

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

/* May query i of (b, h) attend key j, by the key and boolean general masks? */
static int visible(const sdpa_mask *m, int64_t b, int64_t h, int64_t i, int64_t j)
{
    if (!m)
        return 1;
    if (m->key && !m->key[b * m->key_stride[0] + j * m->key_stride[1]])
        return 0;
    if (m->general && m->general_type == SDPA_MASK_BOOL)
        return ((const uint8_t *)m->general)[b * m->general_stride[0] + h * m->general_stride[1] +
                                             i * m->general_stride[2] + j * m->general_stride[3]] !=
               0;
    return 1;
}

/* The additive general mask's term for (b, h, i, j), or 0. */
static double bias(const sdpa_mask *m, int64_t b, int64_t h, int64_t i, int64_t j)
{
    if (!m || !m->general || m->general_type != SDPA_MASK_ADDITIVE)
        return 0.0;
    return sdpa__load_f32(m->general, m->general_dtype,
                          b * m->general_stride[0] + h * m->general_stride[1] +
                              i * m->general_stride[2] + j * m->general_stride[3]);
}

/* Hidden keys (a false mask entry, outside the window or the map, or an
 * additive -inf) are never read. */
static int hidden(const sdpa_call *c, int64_t b, int64_t h, int64_t i, int64_t j)
{
    const sdpa_mask *m = c->mask;
    return m && (!visible(m, b, h, i, j) || !sdpa__sparse_visible(c, b, h, i, j) ||
                 bias(m, b, h, i, j) == -INFINITY);
}

/*
 * The scores of query i of (b, h) against the keys it may see, j < the
 * returned count (padding rows, real lengths for causal alignment, then the
 * key and general masks; all in the most obvious form): score[j], -inf for
 * a hidden key. Scores beyond float32's range are +-inf, as the kernels
 * form them (sdpa.h, non-finite values); a NaN or +inf one poisons the row
 * (*poisoned), and -inf ones weigh nothing. *max is the largest.
 */
static int64_t row_scores(const sdpa_call *c, int64_t b, int64_t h, int64_t i, double *score,
                          double *max, int *poisoned)
{
    const sdpa_call_desc *d = &c->desc;
    const sdpa_mask *m = c->mask;
    const int64_t hk = h / (d->Hq / d->Hkv);
    const int64_t len_q = m && m->seq_len_q ? m->seq_len_q[b] : d->Sq;
    const int64_t len_kv = m && m->seq_len_kv ? m->seq_len_kv[b] : d->Skv;
    int64_t n_keys = i < len_q ? len_kv : 0;
    if (c->causal != SDPA_CAUSAL_NONE && n_keys > 0) {
        const int64_t last = i + (c->causal == SDPA_CAUSAL_BOTTOM_RIGHT ? len_kv - len_q : 0);
        n_keys = last < 0 ? 0 : (last + 1 < n_keys ? last + 1 : n_keys);
    }
    *max = -INFINITY, *poisoned = 0;
    for (int64_t j = 0; j < n_keys; j++) {
        if (hidden(c, b, h, i, j)) {
            score[j] = -INFINITY;
            continue;
        }
        double dot = 0.0;
        for (int64_t e = 0; e < d->D; e++)
            dot += load(c->q, b, i, h, e) * load(c->k, b, j, hk, e);
        double s = c->scale * dot;
        s = s > FLT_MAX ? INFINITY : s < -FLT_MAX ? -INFINITY : s;
        s += bias(m, b, h, i, j);
        score[j] = s;
        *poisoned |= s != s || s == INFINITY;
        if (s > *max)
            *max = s;
    }
    return n_keys;
}

static void ref_task(void *arg, int64_t task, int worker)
{
    const ref_job *job = arg;
    const sdpa_call *c = job->c;
    const sdpa_call_desc *d = &c->desc;
    const int64_t b = task / d->Hq, h = task % d->Hq;
    const int64_t hk = h / (d->Hq / d->Hkv);
    double *score = job->work + (size_t)worker * (size_t)(d->Skv + d->D);
    double *acc = score + d->Skv;
    for (int64_t i = 0; i < d->Sq; i++) {
        double max;
        int poisoned;
        const int64_t n_keys = row_scores(c, b, h, i, score, &max, &poisoned);
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
            for (int64_t e = 0; e < d->D && !hidden(c, b, h, i, j); e++)
                acc[e] += score[j] * load(c->v, b, j, hk, e); /* hidden keys are never read */
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
    const sdpa_call_desc *d = &c->desc;
    sdpa_pool *pool = sdpa__pool_for_call(c); /* small calls: the calling thread alone */
    int threads = sdpa__pool_workers(pool); /* workspaces */
    size_t per = (size_t)(d->Skv + d->D);
    ref_job job = {c, sdpa__malloc(sizeof(double) * per * (size_t)threads)};
    if (!job.work)
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "ref: cannot allocate %zu bytes of work space",
                          sizeof(double) * per * (size_t)threads);
    sdpa__parallel_for(pool, d->B * d->Hq, ref_task, &job);
    free(job.work);
    return SDPA_OK;
}

/* ---- the backward pass: the exact gradient of the forward above */

typedef struct ref_grad_job {
    const sdpa_call *c;
    double *work; /* per worker: see ref_grad_task */
    size_t per;
} ref_grad_job;

static void store_row(sdpa_tensor *t, int64_t b, int64_t s, int64_t h, const double *x,
                      int64_t n, double mul)
{
    for (int64_t e = 0; e < n; e++)
        sdpa__store_f32(t->data, t->dtype, sdpa__offset(t, b, s, h, e), (float)(x[e] * mul));
}

/*
 * One (batch, KV head): its query heads' rows one at a time, so that dk
 * and dv, which sum over those rows, are owned by one task. Everything is
 * recomputed in float64 from q, k, v and dout (the softmax, and
 * D_i = sum_j P_ij dP_ij, which the fast kernels take as dout_i . out_i):
 * ref reads neither out nor lse, so it is the gradient of ref's own
 * forward, not of whatever forward produced them.
 *
 *   P_ij = softmax_j(s_ij)    dP_ij = dout_i . v_j    dS_ij = P_ij (dP_ij - D_i + dlse_i)
 *   dq_i = scale sum_j dS_ij k_j   dk_j += scale dS_ij q_i   dv_j += P_ij dout_i
 */
static void ref_grad_task(void *arg, int64_t task, int worker)
{
    const ref_grad_job *job = arg;
    const sdpa_call *c = job->c;
    const sdpa_call_desc *d = &c->desc;
    const int64_t D = d->D, Skv = d->Skv, G = d->Hq / d->Hkv;
    const int64_t b = task / d->Hkv, hk = task % d->Hkv;
    double *p = job->work + job->per * (size_t)worker;
    double *dk = p, *dv = dk + Skv * D, *prob = dv + Skv * D, *dp = prob + Skv, *dq = dp + Skv;
    for (int64_t e = 0; e < 2 * Skv * D; e++)
        dk[e] = 0.0;
    for (int64_t h = hk * G; h < (hk + 1) * G; h++)
        for (int64_t i = 0; i < d->Sq; i++) {
            double max; /* the forward's scores, exactly */
            int poisoned;
            const int64_t n_keys = row_scores(c, b, h, i, prob, &max, &poisoned);
            for (int64_t e = 0; e < D; e++)
                dq[e] = 0.0;
            if (poisoned) { /* the forward's row is NaN: so is everything it reaches */
                for (int64_t j = 0; j < n_keys; j++)
                    for (int64_t e = 0; e < D && !hidden(c, b, h, i, j); e++)
                        dk[j * D + e] = dv[j * D + e] = NAN;
                store_row(c->dq, b, i, h, dq, D, NAN);
                continue;
            }
            if (max == -INFINITY) { /* sees no key: out is 0, a constant */
                store_row(c->dq, b, i, h, dq, D, 0.0);
                continue;
            }
            double sum = 0.0;
            for (int64_t j = 0; j < n_keys; j++)
                sum += prob[j] = exp(prob[j] - max);
            /* a gradient g of the LSE adds g P_ij to dS_ij */
            double di = c->dlse ? -(double)c->dlse[(b * d->Hq + h) * d->Sq + i] : 0.0;
            for (int64_t j = 0; j < n_keys; j++) {
                prob[j] /= sum;
                double x = 0.0;
                for (int64_t e = 0; e < D && !hidden(c, b, h, i, j); e++)
                    x += load(c->dout, b, i, h, e) * load(c->v, b, j, hk, e);
                dp[j] = x;
                di += prob[j] * x;
            }
            for (int64_t j = 0; j < n_keys; j++) {
                if (hidden(c, b, h, i, j)) /* never read, as in the forward */
                    continue;
                const double ds = prob[j] * (dp[j] - di);
                for (int64_t e = 0; e < D; e++) {
                    dq[e] += ds * load(c->k, b, j, hk, e);
                    dk[j * D + e] += ds * load(c->q, b, i, h, e);
                    dv[j * D + e] += prob[j] * load(c->dout, b, i, h, e);
                }
            }
            store_row(c->dq, b, i, h, dq, D, c->scale);
        }
    for (int64_t j = 0; j < Skv; j++) {
        store_row(c->dk, b, j, hk, dk + j * D, D, c->scale);
        store_row(c->dv, b, j, hk, dv + j * D, D, 1.0);
    }
}

static sdpa_status ref_backward(const sdpa_backend *self, const sdpa_call *c)
{
    (void)self;
    const int threads = sdpa__pool_workers(c->pool); /* workspaces */
    const sdpa_call_desc *d = &c->desc;
    ref_grad_job job = {c, NULL, (size_t)(2 * d->Skv * d->D + 2 * d->Skv + d->D)};
    job.work = sdpa__malloc(sizeof(double) * job.per * (size_t)threads);
    if (!job.work)
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "ref: cannot allocate %zu bytes of work space",
                          sizeof(double) * job.per * (size_t)threads);
    sdpa__parallel_for(c->pool, d->B * d->Hkv, ref_grad_task, &job);
    free(job.work);
    return SDPA_OK;
}

const sdpa_backend sdpa__backend_ref = {
    .name = "ref",
    .summary = "float64 reference: obvious loops, the test oracle",
    .device = SDPA_DEVICE_CPU,
    .caps = {.shares = 1, .mixed_dtypes = 1, .dtypes = SDPA_DTYPE_BIT(SDPA_F32) | SDPA_DTYPE_BIT(SDPA_F16) |
                       SDPA_DTYPE_BIT(SDPA_BF16),
             .d_min = 1, .d_max = 1 << 20, .d_multiple = 1, .gqa = 1, .cross = 1,
             .causal_top_left = 1, .causal_bottom_right = 1, .lse = 1, .deterministic = 1,
             .masks = SDPA_MASK_KIND_SEQ_LEN | SDPA_MASK_KIND_KEY | SDPA_MASK_KIND_GENERAL |
                      SDPA_MASK_KIND_WINDOW | SDPA_MASK_KIND_BLOCKS,
             .backward = 1},
    .fallback_rank = 1,
    .version = SDPA_VERSION_STRING,
    .run = ref_run,
    .backward = ref_backward,
};
