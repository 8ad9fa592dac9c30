/*
 * tune.c - defaults from data: time the candidates on real shapes, keep the
 * existing order unless a backend wins beyond the noise, and write each
 * decision as a rule with its evidence.
 *
 * Per row: the current order is what the dispatcher decides now (user and
 * built-in rules). Every timed backend runs once to warm up, then `reps`
 * rounds, each starting at a different backend, so the rounds pair up for
 * sdpa_ab_compare. A backend replaces the current first choice only when
 * its interval excludes 1 and it is at least min_gain faster; the fastest
 * such backend wins. Rules match the measured shape exactly: nothing here
 * justifies extending a win to shapes that were not measured.
 */
#define _POSIX_C_SOURCE 200809L
#include "../core/half.h"
#include "../core/strbuf.h"
#include "../dispatch/context.h"

#include <ctype.h>
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

/* Random inputs in [-1, 1) of the row's dtype, f32 output, BSHD. */
typedef struct row_data {
    sdpa_tensor q, k, v, out;
    void *mem[4];
} row_data;

static sdpa_status row_data_make(row_data *r, const sdpa_call_desc *d)
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
    return SDPA_OK;
}

static void row_data_free(row_data *r)
{
    for (int t = 0; t < 4; t++)
        free(r->mem[t]);
}

static void rule_name(const char *row, int index, char *buf, size_t n)
{
    snprintf(buf, n, "tuned-%d-", index + 1);
    size_t len = strlen(buf);
    for (const char *p = row ? row : "row"; *p && len + 1 < n; p++)
        buf[len++] = isalnum((unsigned char)*p) || *p == '-' || *p == '.' ? *p : '_';
    buf[len] = '\0';
}

/* Times every backend in idx[0..nb) on the row; t[b * reps + r]. */
static sdpa_status time_row(sdpa_context *ctx, const sdpa_call *call, const int *idx, int nb,
                            int reps, const sdpa_tune_options *o, double *t, int *failed)
{
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
            const double t0 = o->clock_ms(o->clock_user);
            sdpa_status st = be->run(be, call);
            t[b * reps + r] = o->clock_ms(o->clock_user) - t0;
            if (st == SDPA_OUT_OF_MEMORY || st == SDPA_DEVICE_ERROR)
                return st;
        }
    return SDPA_OK;
}

static void shape_text(const sdpa_call_desc *d, char *buf, size_t n)
{
    snprintf(buf, n, "%lld,%lld,%lld,%lld,%lld,%lld %s causal=%s", (long long)d->B,
             (long long)d->Sq, (long long)d->Skv, (long long)d->Hq, (long long)d->Hkv,
             (long long)d->D, sdpa_dtype_name(d->dtype), sdpa_causal_name(d->causal));
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
    sdpa_tune_options o = opts ? *opts : defaults;
    if (o.reps == 0)
        o.reps = 7;
    if (o.min_gain == 0.0)
        o.min_gain = 0.02;
    if (!o.clock_ms)
        o.clock_ms = monotonic_ms;
    if (o.reps < 3 || o.reps > 1000 || o.min_gain < 0 || o.min_gain >= 1)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "opts: reps %d (expected 3..1000), min_gain %g "
                          "(expected 0..1)", o.reps, o.min_gain);
    int chosen[SDPA_MAX_BACKENDS], n_chosen = 0;
    if (o.backends) {
        for (int i = 0; i < o.n_backends; i++) {
            int b = sdpa__ctx_find(ctx, o.backends[i]);
            if (b < 0)
                return sdpa__fail(SDPA_INVALID_ARGUMENT, "opts->backends[%d] '%s' unknown", i,
                                  o.backends[i]);
            if (!ctx->present[b])
                return sdpa__fail(SDPA_NOT_AVAILABLE, "%s: %s", o.backends[i], ctx->why_absent[b]);
            chosen[n_chosen++] = b;
        }
    } else {
        for (int b = 0; b < ctx->n_backends; b++)
            if (ctx->present[b] && strcmp(ctx->backends[b]->name, "ref") != 0)
                chosen[n_chosen++] = b;
    }
    sdpa_pool *pool;
    sdpa_status st = sdpa__ctx_pool(ctx, &pool);
    if (st != SDPA_OK)
        return st;

    char date[16], isa[96];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
    sdpa__isa_list(ctx->host.cpu_features, isa, sizeof isa);
    sdpa_strbuf sb = {0};
    sdpa__sb_printf(&sb,
                    "# libsdpa rules written by `sdpa tune` on %s\n"
                    "# machine: %s, %d threads; CPU features: %s; libsdpa %s\n"
                    "# method: %d interleaved rounds per row; a backend replaces the current "
                    "first choice only if the 95%% bootstrap interval of its time ratio "
                    "excludes 1 and it is at least %.0f%% faster.\n"
                    "# Each rule matches one measured shape exactly; shapes not listed here "
                    "were not measured and keep the existing rules.\n"
                    "require libsdpa %s\nrequire cpu-model %s\nrequire cpu-isa %s\n\n",
                    date, ctx->host.cpu_model, sdpa__pool_threads(pool), isa, SDPA_VERSION_STRING,
                    o.reps, o.min_gain * 100, SDPA_VERSION_STRING, ctx->host.cpu_model, isa);

    double *t = sdpa__malloc(sizeof(double) * (size_t)o.reps * SDPA_MAX_BACKENDS);
    sdpa_decision *dec = sdpa__malloc(sizeof *dec);
    if (!t || !dec) {
        free(t), free(dec), free(sdpa__sb_take(&sb));
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "tune: cannot allocate");
    }
    int n_rules = 0;
    for (int r = 0; r < n_rows && st == SDPA_OK; r++) {
        if (o.progress)
            o.progress(r, n_rows, o.progress_user);
        sdpa_call_desc d = rows[r].desc;
        d.backend = NULL;
        char shape[128];
        if ((st = sdpa__desc_validate(&d)) != SDPA_OK)
            break;
        shape_text(&d, shape, sizeof shape);
        if (d.device != SDPA_DEVICE_CPU) {
            sdpa__sb_printf(&sb, "# row %s (%s): not measured (CUDA rows need the CUDA plugin)\n",
                            rows[r].name, shape);
            continue;
        }
        int cand[SDPA_MAX_CANDIDATES];
        if ((st = sdpa__decide(ctx, &d, NULL, dec, cand)) != SDPA_OK)
            break;
        int cur = -1;
        for (int c = 0; c < dec->n_candidates && cur < 0; c++)
            if (ctx->present[cand[c]])
                cur = cand[c];
        /* Timed: the current choice first, then every chosen backend that accepts. */
        int idx[SDPA_MAX_BACKENDS], nb = 0;
        if (cur >= 0)
            idx[nb++] = cur;
        char why[240];
        for (int i = 0; i < n_chosen; i++)
            if (chosen[i] != cur &&
                sdpa__backend_accepts(ctx->backends[chosen[i]], &ctx->platform, &d, why,
                                      sizeof why))
                idx[nb++] = chosen[i];
        if (cur < 0 || nb < 2) {
            sdpa__sb_printf(&sb, "# row %s (%s): not measured (%s)\n", rows[r].name, shape,
                            cur < 0 ? "no backend can run it here"
                                    : "only one backend can run it");
            continue;
        }
        row_data data;
        sdpa_call call;
        sdpa_params prm = SDPA_PARAMS_DEFAULT;
        prm.causal = d.causal;
        if ((st = row_data_make(&data, &d)) != SDPA_OK) {
            row_data_free(&data);
            break;
        }
        st = sdpa__call_prepare(&data.q, &data.k, &data.v, &data.out, NULL, &prm, &call);
        call.pool = pool;
        call.cpu_features = ctx->host.cpu_features;
        call.cuda_flash_variant = ctx->cuda_flash_variant;
        int failed[SDPA_MAX_BACKENDS];
        if (st == SDPA_OK)
            st = time_row(ctx, &call, idx, nb, o.reps, &o, t, failed);
        row_data_free(&data);
        if (st != SDPA_OK)
            break;
        if (failed[0]) {
            sdpa__sb_printf(&sb, "# row %s (%s): not measured (%s failed to run)\n",
                            rows[r].name, shape, ctx->backends[cur]->name);
            continue;
        }
        int best = -1;
        sdpa_ab_result best_res, closest;
        memset(&closest, 0, sizeof closest);
        int closest_b = -1;
        for (int b = 1; b < nb; b++) {
            if (failed[b])
                continue;
            sdpa_ab_result res;
            sdpa_ab_compare(&t[0], &t[b * o.reps], o.reps, o.min_gain, &res);
            if (res.verdict == SDPA_AB_B_FASTER && (best < 0 || res.median_b < best_res.median_b))
                best = b, best_res = res;
            if (closest_b < 0 || res.ratio < closest.ratio)
                closest_b = b, closest = res;
        }
        if (best < 0) {
            sdpa__sb_printf(&sb,
                            "# row %s (%s): order kept, %s first (median %.4g ms)", rows[r].name,
                            shape, ctx->backends[cur]->name, closest.median_a);
            if (closest_b > 0)
                sdpa__sb_printf(&sb, "; best alternative %s, time ratio %.3f [%.3f, %.3f]: %s",
                                ctx->backends[idx[closest_b]]->name, closest.ratio, closest.lo,
                                closest.hi,
                                closest.hi < 1.0  ? "faster, but by less than the minimum gain"
                                : closest.lo > 1.0 ? "slower"
                                                   : "no difference at this noise level");
            sdpa__sb_printf(&sb, "\n");
            continue;
        }
        const sdpa_backend *w = ctx->backends[idx[best]], *c0 = ctx->backends[cur];
        char name[96];
        rule_name(rows[r].name, r, name, sizeof name);
        sdpa__sb_printf(&sb, "\nrule %s\ndevice cpu\ndtype %s\ncausal %s\n", name,
                        sdpa_dtype_name(d.dtype), sdpa_causal_name(d.causal));
        sdpa__sb_printf(&sb, "B %lld\nSq %lld\nSkv %lld\nHq %lld\nHkv %lld\nD %lld\n",
                        (long long)d.B, (long long)d.Sq, (long long)d.Skv, (long long)d.Hq,
                        (long long)d.Hkv, (long long)d.D);
        sdpa__sb_printf(&sb, "try %s", w->name);
        for (int c = 0; c < dec->n_candidates; c++)
            if (cand[c] != idx[best])
                sdpa__sb_printf(&sb, " %s", ctx->backends[cand[c]]->name);
        sdpa__sb_printf(&sb,
                        "\nevidence row %s (%s): %s median %.4g ms vs %s %.4g ms, ratio %.3f "
                        "[%.3f, %.3f] (95%%, %d interleaved rounds); %s, %d threads; "
                        "libsdpa %s (%s %s, %s %s); %s\n\n",
                        rows[r].name, shape, w->name, best_res.median_b, c0->name,
                        best_res.median_a, best_res.ratio, best_res.lo, best_res.hi, o.reps,
                        ctx->host.cpu_model, sdpa__pool_threads(pool), SDPA_VERSION_STRING,
                        w->name, w->version, c0->name, c0->version, date);
        n_rules++;
    }
    free(t), free(dec);
    if (st != SDPA_OK) {
        free(sdpa__sb_take(&sb));
        return st;
    }
    sdpa__sb_printf(&sb, "# %d rule%s from %d row%s\n", n_rules, n_rules == 1 ? "" : "s", n_rows,
                    n_rows == 1 ? "" : "s");
    *rules_text = sdpa__sb_take(&sb);
    if (!*rules_text)
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "tune: cannot allocate the rules text");
    sdpa__clear_error();
    return SDPA_OK;
}
