/*
 * tune.c - defaults from data: time the candidates on real shapes, group
 * the shapes into classes by which backend wins them beyond the noise, and
 * write each class as a rule with its evidence (sdpa.h says the method).
 *
 * Three steps:
 *   1. measure: every row, every candidate that takes it, interleaved
 *      rounds; per row the tie set (backends within the noise of the
 *      fastest) and the current order (what the dispatcher decides now).
 *   2. classes: rows of a family in key order; a class grows while the
 *      rows' tie sets share a backend; at a change, shapes between the two
 *      rows are measured to narrow the gap the data leaves open. Then
 *      classes of other head dims with the same winner and the same
 *      sequence ranges merge.
 *   3. rules: one per class, its ranges the hull of its rows.
 */
#define _POSIX_C_SOURCE 200809L
#include "../core/half.h"
#include "../core/strbuf.h"
#include "../dispatch/decide.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double monotonic_ms(void *user)
{
    (void)user;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Random inputs in [-1, 1) of the row's dtype, f32 output, BSHD; the
 * padding mask of a padded row. */
typedef struct row_data {
    sdpa_tensor q, k, v, out;
    void *mem[4];
    sdpa_mask mask;
    int32_t *lens;
} row_data;

static sdpa_status row_data_make(row_data *r, const sdpa_call_desc *d, int64_t seq_len_kv)
{
    memset(r, 0, sizeof *r);
    const size_t es = sdpa_dtype_size(d->dtype);
    const size_t n[4] = {(size_t)(d->B * d->Sq * d->Hq * d->D),
                         (size_t)(d->B * d->Skv * d->Hkv * d->D),
                         (size_t)(d->B * d->Skv * d->Hkv * d->D),
                         (size_t)(d->B * d->Sq * d->Hq * d->D)};
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int t = 0; t < 4; t++) {
        r->mem[t] = sdpa__malloc((t == 3 ? 4 : es) * (n[t] ? n[t] : 1));
        if (!r->mem[t])
            return sdpa__fail(SDPA_OUT_OF_MEMORY, "tune: cannot allocate the row's tensors");
        for (size_t i = 0; t < 3 && i < n[t]; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            float x = (float)((s >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
            if (d->dtype == SDPA_F32)
                ((float *)r->mem[t])[i] = x;
            else if (d->dtype == SDPA_F16)
                ((uint16_t *)r->mem[t])[i] = sdpa__f32_to_f16(x);
            else
                ((uint16_t *)r->mem[t])[i] = sdpa__f32_to_bf16(x);
        }
    }
    r->q = sdpa_tensor_bshd(r->mem[0], d->dtype, d->B, d->Sq, d->Hq, d->D);
    r->k = sdpa_tensor_bshd(r->mem[1], d->dtype, d->B, d->Skv, d->Hkv, d->D);
    r->v = sdpa_tensor_bshd(r->mem[2], d->dtype, d->B, d->Skv, d->Hkv, d->D);
    r->out = sdpa_tensor_bshd(r->mem[3], SDPA_F32, d->B, d->Sq, d->Hq, d->D);
    const sdpa_mask none = SDPA_MASK_DEFAULT;
    r->mask = none;
    if (d->mask & SDPA_MASK_KIND_SEQ_LEN) {
        if (!(r->lens = sdpa__malloc(sizeof(int32_t) * (size_t)d->B)))
            return sdpa__fail(SDPA_OUT_OF_MEMORY, "tune: cannot allocate the row's lengths");
        for (int64_t b = 0; b < d->B; b++)
            r->lens[b] = (int32_t)(seq_len_kv > 0 && seq_len_kv < d->Skv ? seq_len_kv : d->Skv);
        r->mask.seq_len_kv = r->lens;
    }
    return SDPA_OK;
}

static void row_data_free(row_data *r)
{
    for (int t = 0; t < 4; t++)
        free(r->mem[t]);
    free(r->lens);
}

/* ---- 1. measuring */

/* One measured shape: a row of the suite, or one measured between two. */
typedef struct meas {
    const char *name;  /* the row's name, or NULL for a shape between rows */
    sdpa_call_desc d;
    int64_t seq_len_kv;
    int ok;            /* measured; else note says why not */
    char note[160];
    int n_order;       /* the current order (backend indices) */
    int order[SDPA_MAX_CANDIDATES];
    int nb;            /* backends timed: idx[], their medians */
    int idx[SDPA_MAX_BACKENDS];
    double med[SDPA_MAX_BACKENDS];
    int fastest;       /* backend index */
    uint64_t tie;      /* bit per backend index: within the noise of the fastest */
} meas;

typedef struct tuner {
    sdpa_context *ctx;
    sdpa_tune_options o;
    sdpa_pool *pool;
    int chosen[SDPA_MAX_BACKENDS], n_chosen;
    double *t;         /* reps x SDPA_MAX_BACKENDS timings */
    sdpa_decision *dec;
} tuner;

static sdpa_status time_row(const tuner *tu, const sdpa_call *call, const int *idx, int nb,
                            int *failed)
{
    const sdpa_context *ctx = tu->ctx;
    const int reps = tu->o.reps;
    for (int b = 0; b < nb; b++) { /* warm-up; a backend that fails is dropped */
        const sdpa_backend *be = ctx->backends[idx[b]];
        failed[b] = be->run(be, call) != SDPA_OK;
    }
    for (int r = 0; r < reps; r++)
        for (int j = 0; j < nb; j++) {
            const int b = (j + r) % nb;
            if (failed[b])
                continue;
            const sdpa_backend *be = ctx->backends[idx[b]];
            const double t0 = tu->o.clock_ms(tu->o.clock_user);
            sdpa_status st = be->run(be, call);
            tu->t[b * reps + r] = tu->o.clock_ms(tu->o.clock_user) - t0;
            if (st == SDPA_OUT_OF_MEMORY || st == SDPA_DEVICE_ERROR)
                return st;
            if (st != SDPA_OK)
                failed[b] = 1;
        }
    return SDPA_OK;
}

/* Measures m->d: fills the order, the medians, the fastest and the tie
 * set, or leaves m->ok 0 with a note. Errors only for OOM and the like. */
static sdpa_status measure(tuner *tu, meas *m)
{
    sdpa_context *ctx = tu->ctx;
    sdpa_call_desc d = m->d;
    d.backend = NULL;
    m->ok = 0;
    if (d.device != SDPA_DEVICE_CPU) {
        sdpa__strlcpy(m->note, "not measured (CUDA rows need the CUDA plugin)", sizeof m->note);
        return SDPA_OK;
    }
    if (d.backward) {
        sdpa__strlcpy(m->note, "not measured (the tuner times forward calls)", sizeof m->note);
        return SDPA_OK;
    }
    int cand[SDPA_MAX_CANDIDATES];
    sdpa_status st = sdpa__decide(ctx, &d, NULL, tu->dec, cand);
    if (st != SDPA_OK)
        return st;
    m->n_order = 0;
    for (int c = 0; c < tu->dec->n_candidates; c++)
        m->order[m->n_order++] = cand[c];
    int cur = -1;
    for (int c = 0; c < m->n_order && cur < 0; c++)
        if (ctx->present[m->order[c]])
            cur = m->order[c];
    /* Timed: the current choice first, then every chosen backend that accepts. */
    m->nb = 0;
    if (cur >= 0)
        m->idx[m->nb++] = cur;
    char why[240];
    for (int i = 0; i < tu->n_chosen; i++)
        if (tu->chosen[i] != cur &&
            sdpa__backend_accepts(ctx->backends[tu->chosen[i]], &ctx->platform, &d, why,
                                  sizeof why))
            m->idx[m->nb++] = tu->chosen[i];
    if (cur < 0 || m->nb < 2) {
        sdpa__strlcpy(m->note,
                      cur < 0 ? "not measured (no backend can run it here)"
                              : "not measured (only one backend can run it)",
                      sizeof m->note);
        return SDPA_OK;
    }
    row_data data;
    sdpa_call call;
    sdpa_params prm = SDPA_PARAMS_DEFAULT;
    prm.causal = d.causal;
    if ((st = row_data_make(&data, &d, m->seq_len_kv)) != SDPA_OK) {
        row_data_free(&data);
        return st;
    }
    prm.mask = d.mask ? &data.mask : NULL;
    st = sdpa__call_prepare(&data.q, &data.k, &data.v, &data.out, NULL, &prm, &call);
    call.pool = tu->pool;
    call.cpu_features = ctx->host.cpu_features;
    call.cuda_flash_variant = ctx->cuda_flash_variant;
    int failed[SDPA_MAX_BACKENDS];
    if (st == SDPA_OK)
        st = time_row(tu, &call, m->idx, m->nb, failed);
    row_data_free(&data);
    if (st != SDPA_OK)
        return st;
    if (failed[0]) {
        snprintf(m->note, sizeof m->note, "not measured (%s failed to run)",
                 ctx->backends[cur]->name);
        return SDPA_OK;
    }
    const int reps = tu->o.reps;
    int f = 0;
    for (int b = 0; b < m->nb; b++) {
        m->med[b] = failed[b] ? INFINITY : sdpa_median(&tu->t[b * reps], reps);
        if (m->med[b] < m->med[f])
            f = b;
    }
    m->fastest = m->idx[f];
    m->tie = 1ull << m->idx[f];
    for (int b = 0; b < m->nb; b++) {
        if (b == f || failed[b])
            continue;
        sdpa_ab_result res; /* a = b's times, b = the fastest's */
        sdpa_ab_compare(&tu->t[b * reps], &tu->t[f * reps], reps, tu->o.min_gain, &res);
        if (res.verdict != SDPA_AB_B_FASTER)
            m->tie |= 1ull << m->idx[b];
    }
    m->ok = 1;
    return SDPA_OK;
}

static double med_of(const meas *m, int backend)
{
    for (int b = 0; b < m->nb; b++)
        if (m->idx[b] == backend)
            return m->med[b];
    return INFINITY;
}

/* ---- 2. classes */

/* Few queries against many keys (decoding, a text query): a regime of its
 * own, where a call is fixed costs more than products, so its rows never
 * join the cross-attention rows of thousands of queries. */
static int few_queries(const sdpa_call_desc *d) { return d->Sq != d->Skv && d->Sq < 64; }

static int same_family(const sdpa_call_desc *a, const sdpa_call_desc *b)
{
    return a->dtype == b->dtype && a->causal == b->causal && few_queries(a) == few_queries(b) &&
           sdpa__mask_kind_top(a->mask) == sdpa__mask_kind_top(b->mask) &&
           (a->Sq == a->Skv) == (b->Sq == b->Skv) && (a->Hq == a->Hkv) == (b->Hq == b->Hkv) &&
           a->device == b->device;
}

/* Key order within a family: keys, then queries, then batch x heads. */
static int axis_cmp(const sdpa_call_desc *a, const sdpa_call_desc *b)
{
    const int64_t x[3] = {a->Skv, a->Sq, a->B * a->Hq}, y[3] = {b->Skv, b->Sq, b->B * b->Hq};
    for (int i = 0; i < 3; i++)
        if (x[i] != y[i])
            return x[i] < y[i] ? -1 : 1;
    return 0;
}

typedef struct klass {
    int *rows;      /* indices into the measured shapes */
    int n;
    uint64_t cand;  /* backends within the noise on every row */
    int winner;     /* backend index */
    int merged_into; /* -1, or the class it was merged into */
    int64_t d_set[8];
    int n_d;
} klass;

typedef struct shapes {
    meas *m;
    int n, cap;
} shapes;

/* A shape between a and b, or 0 when there is none to measure: they
 * differ only in their sequence lengths (self-attention: S; cross: one
 * of Sq, Skv), and the geometric middle is a new length. */
static int between(const meas *a, const meas *b, meas *out)
{
    const sdpa_call_desc *x = &a->d, *y = &b->d;
    if (x->B != y->B || x->Hq != y->Hq || x->Hkv != y->Hkv || x->D != y->D ||
        a->seq_len_kv != b->seq_len_kv)
        return 0;
    *out = *a;
    out->name = NULL;
    out->ok = 0;
    const int self = x->Sq == x->Skv;
    if (self || x->Sq == y->Sq) {
        const int64_t m = (int64_t)llround(sqrt((double)x->Skv * (double)y->Skv));
        if (m <= (x->Skv < y->Skv ? x->Skv : y->Skv) || m >= (x->Skv > y->Skv ? x->Skv : y->Skv))
            return 0;
        out->d.Skv = m;
        if (self)
            out->d.Sq = m;
        return 1;
    }
    if (x->Skv == y->Skv) {
        const int64_t m = (int64_t)llround(sqrt((double)x->Sq * (double)y->Sq));
        if (m <= (x->Sq < y->Sq ? x->Sq : y->Sq) || m >= (x->Sq > y->Sq ? x->Sq : y->Sq))
            return 0;
        out->d.Sq = m;
        return 1;
    }
    return 0;
}

/* The class's winner among its candidates: the current first choice of its
 * first row if it is one of them (the rule then confirms the default),
 * else the one with the least time relative to each row's fastest. */
static int pick_winner(const tuner *tu, const shapes *sh, const klass *k)
{
    const meas *first = &sh->m[k->rows[0]];
    for (int c = 0; c < first->n_order; c++)
        if (tu->ctx->present[first->order[c]]) {
            if ((k->cand >> first->order[c]) & 1u)
                return first->order[c];
            break;
        }
    int best = -1;
    double best_cost = INFINITY;
    for (int b = 0; b < tu->ctx->n_backends; b++) {
        if (!((k->cand >> b) & 1u))
            continue;
        double cost = 0;
        for (int i = 0; i < k->n; i++) {
            const meas *m = &sh->m[k->rows[i]];
            cost += med_of(m, b) / med_of(m, m->fastest);
        }
        if (cost < best_cost)
            best = b, best_cost = cost;
    }
    return best;
}

/* ---- 3. rules */

static void range_of(const shapes *sh, const klass *k, size_t off, int64_t *lo, int64_t *hi)
{
    *lo = INT64_MAX, *hi = 0;
    for (int i = 0; i < k->n; i++) {
        const int64_t v = *(const int64_t *)((const char *)&sh->m[k->rows[i]].d + off);
        *lo = v < *lo ? v : *lo;
        *hi = v > *hi ? v : *hi;
    }
}

static void put_range(sdpa_strbuf *sb, const char *key, int64_t lo, int64_t hi)
{
    if (lo == hi)
        sdpa__sb_printf(sb, "%-11s %lld\n", key, (long long)lo);
    else
        sdpa__sb_printf(sb, "%-11s %lld-%lld\n", key, (long long)lo, (long long)hi);
}

static void shape_text(const sdpa_call_desc *d, char *buf, size_t n)
{
    snprintf(buf, n, "%lld,%lld,%lld,%lld,%lld,%lld %s causal=%s", (long long)d->B,
             (long long)d->Sq, (long long)d->Skv, (long long)d->Hq, (long long)d->Hkv,
             (long long)d->D, sdpa_dtype_name(d->dtype), sdpa_causal_name(d->causal));
}

static void write_rule(const tuner *tu, const shapes *sh, klass *k, int n_rule, sdpa_strbuf *sb,
                       const char *date)
{
    const sdpa_context *ctx = tu->ctx;
    const meas *first = &sh->m[k->rows[0]];
    const sdpa_call_desc *d = &first->d;
    const int self = d->Sq == d->Skv, gqa = d->Hq != d->Hkv;
    char mask[48];
    sdpa__mask_kinds_name(sdpa__mask_kind_top(d->mask), mask, sizeof mask);
    int64_t lo[5], hi[5];
    const size_t offs[5] = {offsetof(sdpa_call_desc, B), offsetof(sdpa_call_desc, Sq),
                            offsetof(sdpa_call_desc, Skv), offsetof(sdpa_call_desc, Hq),
                            offsetof(sdpa_call_desc, Hkv)};
    for (int i = 0; i < 5; i++)
        range_of(sh, k, offs[i], &lo[i], &hi[i]);
    char dset[64] = "";
    for (int i = 0; i < k->n_d; i++) {
        size_t len = strlen(dset);
        snprintf(dset + len, sizeof dset - len, "%s%lld", i ? " " : "", (long long)k->d_set[i]);
    }
    sdpa__sb_printf(sb, "\nrule tuned-%d-%s-%s%s%s%s\n", n_rule, sdpa_dtype_name(d->dtype),
                    self ? "self" : few_queries(d) ? "few-queries" : "cross", gqa ? "-gqa" : "",
                    d->causal ? "-causal" : "", d->mask ? "-padded" : "");
    char txt[5][48];
    for (int i = 0; i < 5; i++)
        snprintf(txt[i], sizeof txt[i], lo[i] == hi[i] ? "%lld" : "%lld-%lld", (long long)lo[i],
                 (long long)hi[i]);
    sdpa__sb_printf(sb, "class       %s %s, %s %s%s%s, D %s, B %s, %s heads%s%s%s\n",
                    sdpa_dtype_name(d->dtype), self ? "self-attention" : "cross-attention",
                    self ? "S" : "queries", txt[1], self ? "" : ", keys ", self ? "" : txt[2],
                    dset, txt[0], txt[3], gqa ? " (grouped-query)" : "",
                    d->causal ? ", causal" : "", d->mask ? ", padded keys" : "");
    /* arch: measured on this architecture, never deciding for another */
    sdpa__sb_printf(sb, "device      cpu\narch        %s\ndtype       %s\ncausal      %s\n"
                        "mask        %s\n",
                    tu->ctx->host.cpu_arch, sdpa_dtype_name(d->dtype), sdpa_causal_name(d->causal),
                    mask);
    sdpa__sb_printf(sb, "same_seq    %s\nsame_heads  %s\n", self ? "yes" : "no",
                    gqa ? "no" : "yes");
    static const char *keys[5] = {"B", "Sq", "Skv", "Hq", "Hkv"};
    for (int i = 0; i < 5; i++)
        put_range(sb, keys[i], lo[i], hi[i]);
    sdpa__sb_printf(sb, "D           %s\n", dset);
    sdpa__sb_printf(sb, "try         %s", ctx->backends[k->winner]->name);
    for (int c = 0; c < first->n_order; c++)
        if (first->order[c] != k->winner)
            sdpa__sb_printf(sb, " %s", ctx->backends[first->order[c]]->name);
    /* evidence: the rows, the margin over the fastest other backend */
    double rmin = INFINITY, rmax = 0;
    int n_between = 0, confirms = 1;
    for (int i = 0; i < k->n; i++) {
        const meas *m = &sh->m[k->rows[i]];
        n_between += m->name == NULL;
        double alt = INFINITY;
        for (int b = 0; b < m->nb; b++)
            if (m->idx[b] != k->winner && m->med[b] < alt)
                alt = m->med[b];
        const double r = alt / med_of(m, k->winner);
        rmin = r < rmin ? r : rmin, rmax = r > rmax ? r : rmax;
        int cur = -1;
        for (int c = 0; c < m->n_order && cur < 0; c++)
            if (ctx->present[m->order[c]])
                cur = m->order[c];
        confirms &= cur == k->winner;
    }
    char names[200] = "";
    int listed = 0;
    for (int i = 0; i < k->n; i++) {
        const meas *m = &sh->m[k->rows[i]];
        if (!m->name)
            continue;
        size_t len = strlen(names);
        if (len + strlen(m->name) + 16 >= sizeof names)
            break;
        snprintf(names + len, sizeof names - len, "%s%s", listed ? " " : "", m->name);
        listed++;
    }
    const int n_rows = k->n - n_between;
    char between_text[64] = "";
    if (n_between)
        snprintf(between_text, sizeof between_text, " and %d shape%s measured between them",
                 n_between, n_between == 1 ? "" : "s");
    sdpa__sb_printf(sb,
                    "\nevidence    %d row%s (%s%s)%s: %s fastest or within the noise on every "
                    "one, %.2f-%.2fx the fastest other; %s; %s, %d threads, %d rounds, "
                    "libsdpa %s, %s\n",
                    n_rows, n_rows == 1 ? "" : "s", names, listed < n_rows ? " ..." : "",
                    between_text, ctx->backends[k->winner]->name, rmin, rmax,
                    confirms ? "the built-in first choice" : "replaces the built-in choice",
                    ctx->host.cpu_model, sdpa__pool_threads(tu->pool), tu->o.reps,
                    SDPA_VERSION_STRING, date);
}

static int cmp_int64(const void *a, const void *b)
{
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Two classes of one family with the same winner and the same sequence
 * ranges, one head dim each (or a set): one rule with D as a set. */
static int mergeable(const shapes *sh, const klass *a, const klass *b)
{
    if (a->winner != b->winner || a->n_d + b->n_d > 8 ||
        !same_family(&sh->m[a->rows[0]].d, &sh->m[b->rows[0]].d))
        return 0;
    int64_t alo, ahi, blo, bhi;
    range_of(sh, a, offsetof(sdpa_call_desc, Sq), &alo, &ahi);
    range_of(sh, b, offsetof(sdpa_call_desc, Sq), &blo, &bhi);
    if (alo != blo || ahi != bhi)
        return 0;
    range_of(sh, a, offsetof(sdpa_call_desc, Skv), &alo, &ahi);
    range_of(sh, b, offsetof(sdpa_call_desc, Skv), &blo, &bhi);
    return alo == blo && ahi == bhi;
}

sdpa_status sdpa_tune(sdpa_context *ctx, const sdpa_tune_row *rows, int n_rows,
                      const sdpa_tune_options *opts, char **rules_text)
{
    static const sdpa_tune_options defaults = SDPA_TUNE_OPTIONS_DEFAULT;
    if (!ctx || !rows || !rules_text || n_rows < 1)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "%s",
                          !ctx ? "ctx is NULL" : !rows ? "rows is NULL"
                          : !rules_text ? "rules_text is NULL" : "n_rows must be >= 1");
    *rules_text = NULL;
    tuner tu;
    memset(&tu, 0, sizeof tu);
    tu.ctx = ctx;
    sdpa_tune_options grown;
    if (opts && !(opts = sdpa__struct_in(opts, SDPA_BASE_TUNE_OPTIONS, sizeof grown, &grown, "opts")))
        return SDPA_INVALID_ARGUMENT;
    tu.o = opts ? *opts : defaults;
    if (tu.o.reps == 0)
        tu.o.reps = 7;
    if (tu.o.min_gain == 0.0)
        tu.o.min_gain = 0.02;
    if (!tu.o.clock_ms)
        tu.o.clock_ms = monotonic_ms;
    if (tu.o.max_extra == 0)
        tu.o.max_extra = 2;
    if (tu.o.reps < 3 || tu.o.reps > 1000 || tu.o.min_gain < 0 || tu.o.min_gain >= 1 ||
        tu.o.max_extra < -1 || tu.o.max_extra > 16)
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "opts: reps %d (expected 3..1000), min_gain %g (expected 0..1), "
                          "max_extra %d (expected -1..16)",
                          tu.o.reps, tu.o.min_gain, tu.o.max_extra);
    const int extra = tu.o.max_extra < 0 ? 0 : tu.o.max_extra;
    if (tu.o.backends) {
        for (int i = 0; i < tu.o.n_backends; i++) {
            int b = sdpa__ctx_find(ctx, tu.o.backends[i]);
            if (b < 0)
                return sdpa__fail(SDPA_INVALID_ARGUMENT, "opts->backends[%d] '%s' unknown", i,
                                  tu.o.backends[i]);
            if (!ctx->present[b])
                return sdpa__fail(SDPA_NOT_AVAILABLE, "%s: %s", tu.o.backends[i],
                                  ctx->why_absent[b]);
            tu.chosen[tu.n_chosen++] = b;
        }
    } else {
        for (int b = 0; b < ctx->n_backends; b++)
            if (ctx->present[b] && strcmp(ctx->backends[b]->name, "ref") != 0)
                tu.chosen[tu.n_chosen++] = b;
    }
    sdpa_status st = sdpa__ctx_pool(ctx, &tu.pool);
    if (st != SDPA_OK)
        return st;
    for (int r = 0; r < n_rows; r++) {
        sdpa_call_desc d = rows[r].desc;
        if ((st = sdpa__desc_validate(&d)) != SDPA_OK)
            return st;
    }

    shapes sh = {NULL, 0, n_rows * (1 + extra) + 1};
    klass *ks = NULL;
    int *order = NULL;
    tu.t = sdpa__malloc(sizeof(double) * (size_t)tu.o.reps * SDPA_MAX_BACKENDS);
    tu.dec = sdpa__malloc(sizeof *tu.dec);
    sh.m = sdpa__calloc((size_t)sh.cap, sizeof *sh.m);
    ks = sdpa__calloc((size_t)sh.cap, sizeof *ks);
    order = sdpa__malloc(sizeof(int) * (size_t)n_rows);
    sdpa_strbuf sb = {0};
    if (!tu.t || !tu.dec || !sh.m || !ks || !order) {
        st = sdpa__fail(SDPA_OUT_OF_MEMORY, "tune: cannot allocate");
        goto done;
    }

    /* 1. every row */
    for (int r = 0; r < n_rows; r++) {
        if (tu.o.progress)
            tu.o.progress(r, n_rows, tu.o.progress_user);
        meas *m = &sh.m[sh.n++];
        m->name = rows[r].name ? rows[r].name : "row";
        m->d = rows[r].desc;
        m->d.backend = NULL;
        m->seq_len_kv = rows[r].seq_len_kv;
        if ((st = measure(&tu, m)) != SDPA_OK)
            goto done;
    }

    /* 2. classes: per family and head dim, rows in key order */
    int n_k = 0, n_members = 0;
    int *placed = sdpa__calloc((size_t)n_rows, sizeof *placed);
    int *pool_rows = sdpa__malloc(sizeof(int) * (size_t)sh.cap);
    if (!placed || !pool_rows) {
        free(placed), free(pool_rows);
        st = sdpa__fail(SDPA_OUT_OF_MEMORY, "tune: cannot allocate");
        goto done;
    }
    for (int r0 = 0; r0 < n_rows && st == SDPA_OK; r0++) {
        if (placed[r0] || !sh.m[r0].ok)
            continue;
        int n = 0; /* the family's rows of r0's head dim, sorted */
        for (int r = r0; r < n_rows; r++)
            if (!placed[r] && sh.m[r].ok && sh.m[r].d.D == sh.m[r0].d.D &&
                same_family(&sh.m[r].d, &sh.m[r0].d)) {
                placed[r] = 1;
                int j = n++;
                while (j > 0 && axis_cmp(&sh.m[order[j - 1]].d, &sh.m[r].d) > 0)
                    order[j] = order[j - 1], j--;
                order[j] = r;
            }
        /* sweep: a class grows while the tie sets share a backend */
        int i = 0;
        while (i < n && st == SDPA_OK) {
            klass *k = &ks[n_k++];
            k->rows = pool_rows + n_members;
            k->merged_into = -1;
            k->rows[k->n++] = order[i], n_members++;
            k->cand = sh.m[order[i]].tie;
            int last = order[i];
            i++;
            int next_first = -1; /* a shape between the rows that opens the next class */
            while (i < n) {
                const uint64_t both = k->cand & sh.m[order[i]].tie;
                if (both) {
                    k->cand = both;
                    k->rows[k->n++] = order[i], n_members++;
                    last = order[i++];
                    continue;
                }
                /* a change: narrow it with shapes measured between */
                int hi = order[i];
                for (int e = 0; e < extra && sh.n < sh.cap; e++) {
                    meas x;
                    if (!between(&sh.m[last], &sh.m[hi], &x))
                        break;
                    sh.m[sh.n] = x;
                    if ((st = measure(&tu, &sh.m[sh.n])) != SDPA_OK)
                        break;
                    if (!sh.m[sh.n].ok)
                        break;
                    const int xi = sh.n++;
                    if (k->cand & sh.m[xi].tie) { /* joins this class */
                        k->cand &= sh.m[xi].tie;
                        k->rows[k->n++] = xi, n_members++;
                        last = xi;
                    } else { /* opens the next one */
                        hi = xi;
                        next_first = xi;
                    }
                }
                break;
            }
            k->winner = pick_winner(&tu, &sh, k);
            k->d_set[k->n_d++] = sh.m[k->rows[0]].d.D;
            if (next_first >= 0 && i < n && st == SDPA_OK) {
                /* the next class starts at the shape between, then its rows */
                klass *k2 = &ks[n_k++];
                k2->rows = pool_rows + n_members;
                k2->merged_into = -1;
                k2->rows[k2->n++] = next_first, n_members++;
                k2->cand = sh.m[next_first].tie;
                while (i < n && (k2->cand & sh.m[order[i]].tie)) {
                    k2->cand &= sh.m[order[i]].tie;
                    k2->rows[k2->n++] = order[i++], n_members++;
                }
                k2->winner = pick_winner(&tu, &sh, k2);
                k2->d_set[k2->n_d++] = sh.m[k2->rows[0]].d.D;
            }
        }
    }
    free(placed);
    if (st != SDPA_OK) {
        free(pool_rows);
        goto done;
    }
    /* head dims merge */
    for (int a = 0; a < n_k; a++)
        for (int b = a + 1; b < n_k; b++)
            if (ks[a].merged_into < 0 && ks[b].merged_into < 0 && mergeable(&sh, &ks[a], &ks[b])) {
                ks[b].merged_into = a;
                for (int i = 0; i < ks[b].n_d; i++)
                    ks[a].d_set[ks[a].n_d++] = ks[b].d_set[i];
            }

    /* 3. the file */
    char date[16], isa[96];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
    sdpa__isa_list(ctx->host.cpu_features, isa, sizeof isa);
    sdpa__sb_printf(&sb,
                    "# libsdpa rules written by `sdpa tune` on %s\n"
                    "# machine: %s, %d threads; CPU features: %s; libsdpa %s\n"
                    "# method: %d interleaved rounds per shape; a backend is out of a shape's "
                    "tie set when the 95%% bootstrap interval of its time ratio to the fastest "
                    "excludes 1 and it is at least %.0f%% slower. Neighbouring rows (by keys, "
                    "then queries) whose tie sets share a backend form one shape class; up to "
                    "%d shapes between two rows place a boundary.\n"
                    "# Each rule covers one class: the hull of the rows in its evidence. Shapes "
                    "outside every class were not measured and keep the built-in rules.\n"
                    "require libsdpa %s\nrequire cpu-model %s\nrequire cpu-isa %s\n",
                    date, ctx->host.cpu_model, sdpa__pool_threads(tu.pool), isa,
                    SDPA_VERSION_STRING, tu.o.reps, tu.o.min_gain * 100, extra,
                    SDPA_VERSION_STRING, ctx->host.cpu_model, isa);
    for (int r = 0; r < n_rows; r++)
        if (!sh.m[r].ok) {
            char shape[128];
            shape_text(&sh.m[r].d, shape, sizeof shape);
            sdpa__sb_printf(&sb, "# row %s (%s): %s\n", sh.m[r].name, shape, sh.m[r].note);
        }
    /* the raw figures every class rests on: each measured shape's medians */
    sdpa__sb_printf(&sb, "\n# measured (median ms per backend; * within the noise of the "
                         "fastest):\n");
    for (int i = 0; i < sh.n; i++) {
        const meas *m = &sh.m[i];
        if (!m->ok)
            continue;
        char shape[128];
        shape_text(&m->d, shape, sizeof shape);
        sdpa__sb_printf(&sb, "# %-20s %s:", m->name ? m->name : "(between)", shape);
        for (int b = 0; b < m->nb; b++)
            if (isfinite(m->med[b]))
                sdpa__sb_printf(&sb, " %s %.4g%s", ctx->backends[m->idx[b]]->name, m->med[b],
                                (m->tie >> m->idx[b]) & 1u ? "*" : "");
        sdpa__sb_printf(&sb, "\n");
    }
    int n_rules = 0;
    for (int a = 0; a < n_k; a++) {
        if (ks[a].merged_into >= 0)
            continue;
        /* the rows of merged classes join it for the evidence and ranges */
        int total = ks[a].n;
        for (int b = a + 1; b < n_k; b++)
            if (ks[b].merged_into == a)
                total += ks[b].n;
        int *all = sdpa__malloc(sizeof(int) * (size_t)total);
        if (!all) {
            st = sdpa__fail(SDPA_OUT_OF_MEMORY, "tune: cannot allocate");
            break;
        }
        memcpy(all, ks[a].rows, sizeof(int) * (size_t)ks[a].n);
        int n_all = ks[a].n;
        for (int b = a + 1; b < n_k; b++)
            if (ks[b].merged_into == a) {
                memcpy(all + n_all, ks[b].rows, sizeof(int) * (size_t)ks[b].n);
                n_all += ks[b].n;
            }
        klass k = ks[a];
        k.rows = all, k.n = n_all;
        qsort(k.d_set, (size_t)k.n_d, sizeof *k.d_set, cmp_int64);
        write_rule(&tu, &sh, &k, ++n_rules, &sb, date);
        free(all);
    }
    free(pool_rows);
    if (st == SDPA_OK) {
        int n_ok = 0, n_between = sh.n - n_rows;
        for (int r = 0; r < n_rows; r++)
            n_ok += sh.m[r].ok;
        sdpa__sb_printf(&sb, "\n# %d rule%s (shape classes) from %d of %d row%s and %d shape%s "
                             "measured between them\n",
                        n_rules, n_rules == 1 ? "" : "s", n_ok, n_rows, n_rows == 1 ? "" : "s",
                        n_between, n_between == 1 ? "" : "s");
    }
done:
    free(tu.t), free(tu.dec), free(sh.m), free(ks), free(order);
    if (st != SDPA_OK) {
        free(sdpa__sb_take(&sb));
        return st;
    }
    *rules_text = sdpa__sb_take(&sb);
    if (!*rules_text)
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "tune: cannot allocate the rules text");
    sdpa__clear_error();
    return SDPA_OK;
}
