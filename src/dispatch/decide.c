/*
 * decide.c - which backends to try for a call, in order, and why.
 *
 * Precedence, highest first:
 *   1. explicit backend on the call (or the layer)
 *   2. innermost scoped override (per thread)
 *   3. per-component override
 *   4. SDPA_BACKEND
 *   5. the first matching policy rule (user files, then default.rules)
 *   6. the built-in fallback chain of the call's device
 * Levels 1-4 name one backend and are never replaced: if it cannot run the
 * call the decision fails with its reason. Levels 5-6 name a list; every
 * backend on it that cannot run the call is passed over with its reason
 * (this is where an LSE-wanting call loses backends without LSE output).
 *
 * The decision is made for ctx->platform; whether a backend is present on
 * this machine is reported beside it, so a simulated platform shows the
 * decision that machine would make.
 */
#include "context.h"
#include "decide.h"
#include "guard.h"
#include "../core/cpu_features.h"
#include "../core/strbuf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *sdpa_source_name(sdpa_source s)
{
    switch (s) {
    case SDPA_SOURCE_EXPLICIT: return "explicit";
    case SDPA_SOURCE_SCOPED: return "scoped override";
    case SDPA_SOURCE_COMPONENT: return "component override";
    case SDPA_SOURCE_ENVIRONMENT: return "environment";
    case SDPA_SOURCE_RULE: return "rule";
    case SDPA_SOURCE_FALLBACK: return "fallback chain";
    }
    return "?";
}

void sdpa__desc_string(const sdpa_call_desc *d, char *buf, size_t n)
{
    char mask[48], kv[24] = "";
    sdpa__mask_kinds_name(d->mask, mask, sizeof mask);
    if (sdpa__mixed_dtypes(d))
        snprintf(kv, sizeof kv, " (k, v %s)", sdpa_dtype_name(sdpa__kv_dtype(d)));
    char shares[40] = "";
    if (d->shares > 0)
        snprintf(shares, sizeof shares, " (a share of %d)", d->shares);
    snprintf(buf, n,
             "%s%s %s%s B=%lld Sq=%lld Skv=%lld Hq=%lld Hkv=%lld D=%lld causal=%s lse=%s%s%s%s%s",
             d->backward ? "backward " : "",
             d->device == SDPA_DEVICE_CUDA ? "cuda" : "cpu", sdpa_dtype_name(d->dtype), kv,
             (long long)d->B, (long long)d->Sq, (long long)d->Skv, (long long)d->Hq,
             (long long)d->Hkv, (long long)d->D, sdpa_causal_name(d->causal),
             d->want_lse ? "yes" : "no", d->mask ? " mask=" : "", d->mask ? mask : "",
             d->deterministic ? " deterministic" : "", shares);
}

static int lookup(const sdpa_context *ctx, const char *name, const char *from)
{
    int i = sdpa__ctx_find(ctx, name);
    if (i < 0) {
        char known[512] = "";
        for (int k = 0; k < ctx->n_backends; k++) {
            size_t len = strlen(known);
            snprintf(known + len, sizeof known - len, "%s%s", k ? ", " : "",
                     ctx->backends[k]->name);
        }
        sdpa__fail(SDPA_INVALID_ARGUMENT, "backend '%s' (%s) unknown; known: %s", name, from,
                   known);
    }
    return i;
}

int sdpa__resolve_choice(const sdpa_context *ctx, const sdpa_call_desc *desc,
                         const sdpa_choice *fixed, sdpa_choice *out)
{
    memset(out, 0, sizeof *out);
    const char *name = NULL;
    if (desc->backend) {
        out->source = SDPA_SOURCE_EXPLICIT;
        name = desc->backend;
        sdpa__fmt(out->detail, sizeof out->detail, "backend=%s on the call", name);
    } else if (fixed) {
        *out = *fixed;
        return 1;
    } else if ((name = sdpa_override_current())) {
        out->source = SDPA_SOURCE_SCOPED;
        sdpa__fmt(out->detail, sizeof out->detail, "sdpa_override_push(\"%s\")", name);
    } else {
        int b = -1;
        const char *comp = desc->component;
        if (comp && *comp) {
            pthread_rwlock_rdlock((pthread_rwlock_t *)&ctx->lock);
            for (int i = 0; i < ctx->n_components; i++)
                if (strcmp(ctx->components[i].component, comp) == 0)
                    b = ctx->components[i].backend;
            pthread_rwlock_unlock((pthread_rwlock_t *)&ctx->lock);
        }
        if (b >= 0) {
            out->source = SDPA_SOURCE_COMPONENT;
            out->backend = b;
            sdpa__fmt(out->detail, sizeof out->detail, "component '%s' -> %s", comp,
                      ctx->backends[b]->name);
            return 1;
        }
        if (ctx->env_backend >= 0) {
            out->source = SDPA_SOURCE_ENVIRONMENT;
            out->backend = ctx->env_backend;
            sdpa__fmt(out->detail, sizeof out->detail, "SDPA_BACKEND=%s",
                      ctx->backends[ctx->env_backend]->name);
            return 1;
        }
        return 0;
    }
    out->backend = lookup(ctx, name, out->detail);
    return out->backend < 0 ? -1 : 1;
}

static void add_candidate(const sdpa_context *ctx, sdpa_decision *out, int *cand, int b)
{
    if (out->n_candidates == SDPA_MAX_CANDIDATES)
        return;
    out->backends[b].candidate = out->n_candidates;
    if (!ctx->present[b])
        sdpa__strlcpy(out->backends[b].reason, ctx->why_absent[b], sizeof out->backends[b].reason);
    cand[out->n_candidates] = b;
    out->candidates[out->n_candidates++] = ctx->backends[b]->name;
}

/* Tries backend b: candidate if it accepts, else its verdict says why. */
static void consider(const sdpa_context *ctx, const sdpa_call_desc *d, sdpa_decision *out,
                     int *cand, int b)
{
    if (out->backends[b].candidate >= 0)
        return;
    if (sdpa__backend_accepts(ctx->backends[b], &ctx->platform, d, out->backends[b].reason,
                              sizeof out->backends[b].reason))
        add_candidate(ctx, out, cand, b);
}

/* Backends of the call's device with a fallback rank, best first. */
static void fallback_chain(const sdpa_context *ctx, const sdpa_call_desc *d, sdpa_decision *out,
                           int *cand)
{
    int order[SDPA_MAX_BACKENDS], n = 0;
    for (int i = 0; i < ctx->n_backends; i++)
        if (ctx->backends[i]->device == d->device && ctx->backends[i]->fallback_rank > 0)
            order[n++] = i;
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && ctx->backends[order[j]]->fallback_rank >
                                     ctx->backends[order[j - 1]]->fallback_rank;
             j--) {
            int t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
    for (int i = 0; i < n; i++)
        consider(ctx, d, out, cand, order[i]);
}

static void no_candidate_error(const sdpa_context *ctx, sdpa_decision *out)
{
    out->status = SDPA_UNSUPPORTED;
    size_t len = (size_t)snprintf(out->error, sizeof out->error, "no backend can run this call");
    const char *sep = ":";
    for (int i = 0; i < ctx->n_backends && len < sizeof out->error; i++)
        if (out->backends[i].reason[0]) {
            len += (size_t)snprintf(out->error + len, sizeof out->error - len, "%s %s: %s", sep,
                                    ctx->backends[i]->name, out->backends[i].reason);
            sep = ";";
        }
}

/* lean: the candidates, the status and the error only; the other
 * backends' verdicts stay empty and the struct is not cleared past what
 * that branch reads (see sdpa__decide_lean) */
static sdpa_status decide(sdpa_context *ctx, const sdpa_call_desc *d, const sdpa_choice *fixed,
                          sdpa_decision *out, int *cand, int lean)
{
    sdpa_status st = sdpa__desc_validate(d);
    if (st != SDPA_OK)
        return st;
    if (lean) { /* what the fixed choice's branch reads and writes: not 9 KB of zeros */
        out->source = SDPA_SOURCE_EXPLICIT, out->n_candidates = 0, out->status = SDPA_OK;
        out->source_detail[0] = out->rule[0] = out->rule_origin[0] = out->evidence[0] =
            out->rule_class[0] = out->error[0] = '\0';
    } else {
        memset(out, 0, sizeof *out);
    }
    out->n_backends = ctx->n_backends;
    for (int i = 0; i < ctx->n_backends; i++) {
        out->backends[i].reason[0] = '\0'; /* lean: not cleared above */
        out->backends[i].name = ctx->backends[i]->name;
        out->backends[i].candidate = -1;
        out->backends[i].present = ctx->present[i];
    }

    sdpa_choice choice;
    int r = sdpa__resolve_choice(ctx, d, fixed, &choice);
    if (r < 0)
        return SDPA_INVALID_ARGUMENT;
    if (r > 0) {
        int b = choice.backend;
        out->source = choice.source;
        sdpa__strlcpy(out->source_detail, choice.detail, sizeof out->source_detail);
        consider(ctx, d, out, cand, b);
        for (int i = 0; i < ctx->n_backends && !lean; i++)
            if (i != b)
                sdpa__fmt(out->backends[i].reason, sizeof out->backends[i].reason,
                          "not considered: %s chose %s", sdpa_source_name(choice.source),
                          ctx->backends[b]->name);
        if (out->n_candidates == 0) {
            out->status = SDPA_UNSUPPORTED;
            snprintf(out->error, sizeof out->error, "%s (%s) cannot run this call: %s",
                     ctx->backends[b]->name, choice.detail, out->backends[b].reason);
        }
        return SDPA_OK;
    }

    const sdpa_rule *rule = NULL;
    pthread_rwlock_rdlock(&ctx->lock);
    for (int p = 0; p < ctx->n_policies && !rule; p++)
        for (int i = 0; i < ctx->policies[p]->n && !rule; i++)
            if (sdpa__rule_matches(&ctx->policies[p]->rules[i], &ctx->platform, d))
                rule = &ctx->policies[p]->rules[i];
    if (rule) {
        out->source = SDPA_SOURCE_RULE;
        sdpa__strlcpy(out->rule, rule->name, sizeof out->rule);
        sdpa__strlcpy(out->rule_origin, rule->origin, sizeof out->rule_origin);
        sdpa__strlcpy(out->evidence, rule->evidence, sizeof out->evidence);
        sdpa__strlcpy(out->rule_class, rule->klass, sizeof out->rule_class);
        sdpa__fmt(out->source_detail, sizeof out->source_detail, "%s",
                  rule->conditions[0] ? rule->conditions : "(no conditions)");
        for (int i = 0; i < rule->n_try; i++) {
            int b = sdpa__ctx_find(ctx, rule->try_names[i]);
            if (b >= 0)
                consider(ctx, d, out, cand, b);
        }
    }
    pthread_rwlock_unlock(&ctx->lock);
    if (out->n_candidates == 0) {
        if (rule)
            sdpa__fmt(out->source_detail, sizeof out->source_detail,
                      "rule '%s' left no backend that can run the call", out->rule);
        else
            sdpa__strlcpy(out->source_detail, "no rule matched", sizeof out->source_detail);
        out->source = SDPA_SOURCE_FALLBACK;
        fallback_chain(ctx, d, out, cand);
    }
    /* Every other backend: why it was not on the list. */
    for (int i = 0; i < ctx->n_backends; i++) {
        sdpa_backend_verdict *v = &out->backends[i];
        if (v->candidate >= 0 || v->reason[0])
            continue;
        if (!sdpa__backend_accepts(ctx->backends[i], &ctx->platform, d, v->reason,
                                   sizeof v->reason))
            continue;
        if (out->source == SDPA_SOURCE_RULE)
            sdpa__fmt(v->reason, sizeof v->reason, "passed over by rule '%s' (see its evidence)",
                      out->rule);
        else
            sdpa__strlcpy(v->reason, "not in the fallback chain", sizeof v->reason);
    }
    if (out->n_candidates == 0)
        no_candidate_error(ctx, out);
    return SDPA_OK;
}

sdpa_status sdpa__decide(sdpa_context *ctx, const sdpa_call_desc *d, const sdpa_choice *fixed,
                         sdpa_decision *out, int *cand)
{
    return decide(ctx, d, fixed, out, cand, 0);
}

sdpa_status sdpa__decide_lean(sdpa_context *ctx, const sdpa_call_desc *d, sdpa_decision *out,
                              int *cand)
{
    return decide(ctx, d, NULL, out, cand, 1);
}

sdpa_status sdpa_decide(sdpa_context *ctx, const sdpa_call_desc *desc, sdpa_decision *out)
{
    if (!ctx || !out)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "%s is NULL", ctx ? "out" : "ctx");
    sdpa_call_desc grown;
    if (desc && !(desc = sdpa__struct_in(desc, SDPA_BASE_CALL_DESC, sizeof grown, &grown, "desc")))
        return SDPA_INVALID_ARGUMENT;
    int cand[SDPA_MAX_CANDIDATES];
    sdpa_status st = sdpa__decide(ctx, desc, NULL, out, cand);
    if (st == SDPA_OK)
        sdpa__clear_error();
    return st;
}

/* ---- explain */

static void platform_text(const sdpa_platform *p, const sdpa_call_desc *d, char *buf, size_t n)
{
    if (d->device == SDPA_DEVICE_CUDA) {
        if (p->cuda_present)
            snprintf(buf, n, "cuda sm_%d%d, cuDNN %d.%d.%d%s", p->cc_major, p->cc_minor,
                     p->cudnn_version / 10000, p->cudnn_version / 100 % 100,
                     p->cudnn_version % 100, p->simulated ? " (simulated)" : "");
        else
            snprintf(buf, n, "cuda: none (%s)", p->cuda_why);
        return;
    }
    char names[128];
    sdpa__cpu_features_names(p->cpu_features, " ", names, sizeof names);
    snprintf(buf, n, "cpu %s [%s]%s", p->cpu_model, names[0] ? names : "portable only",
             p->simulated ? " (simulated)" : "");
}

static char *explain_text(const sdpa_context *ctx, const sdpa_call_desc *d,
                          const sdpa_decision *dec)
{
    sdpa_strbuf sb = {0};
    char line[512];
    sdpa__desc_string(d, line, sizeof line);
    sdpa__sb_printf(&sb, "call        %s%s%s%s%s\n", line, d->component ? " component=" : "",
                    d->component ? d->component : "", d->quant ? " quant=" : "",
                    d->quant ? d->quant : "");
    platform_text(&ctx->platform, d, line, sizeof line);
    sdpa__sb_printf(&sb, "platform    %s\n", line);
    const char *w = sdpa_context_wisdom(ctx); /* the first line: what is in force, or why not */
    sdpa__sb_printf(&sb, "wisdom      %.*s%s\n", (int)strcspn(w, "\n"), w,
                    strchr(w, '\n') && strchr(w, '\n')[1] ? " (more: sdpa info)" : "");
    if (atomic_load(&ctx->finite_guard) || sdpa_context_guard_events(ctx))
        sdpa__guard_text(&sb, ctx, 12);
    if (dec->source == SDPA_SOURCE_RULE) {
        sdpa__sb_printf(&sb, "decided by  rule '%s' (%s)\n", dec->rule, dec->rule_origin);
        sdpa__sb_printf(&sb, "  when      %s\n", dec->source_detail);
        if (dec->rule_class[0])
            sdpa__sb_printf(&sb, "  class     %s\n", dec->rule_class);
        sdpa__sb_printf(&sb, "  evidence  %s\n", dec->evidence);
    } else {
        sdpa__sb_printf(&sb, "decided by  %s: %s\n", sdpa_source_name(dec->source),
                        dec->source_detail);
        if (dec->rule[0])
            sdpa__sb_printf(&sb, "  rule      '%s' (%s): %s\n", dec->rule, dec->rule_origin,
                            dec->evidence);
    }
    sdpa__sb_printf(&sb, "candidates  (tried in this order)\n");
    for (int c = 0; c < dec->n_candidates; c++)
        for (int i = 0; i < dec->n_backends; i++)
            if (dec->backends[i].candidate == c)
                sdpa__sb_printf(&sb, "  %d. %-14s %s\n", c + 1, dec->backends[i].name,
                                dec->backends[i].present ? "present"
                                                         : dec->backends[i].reason);
    if (dec->n_candidates == 0)
        sdpa__sb_printf(&sb, "  (none) %s\n", dec->error);
    sdpa__sb_printf(&sb, "passed over\n");
    for (int i = 0; i < dec->n_backends; i++)
        if (dec->backends[i].candidate < 0)
            sdpa__sb_printf(&sb, "  %-17s %s%s\n", dec->backends[i].name, dec->backends[i].reason,
                            dec->backends[i].present ? "" : " [not present here]");
    return sdpa__sb_take(&sb);
}

static void json_string_or_null(sdpa_strbuf *sb, const char *s)
{
    if (s)
        sdpa__sb_json_string(sb, s);
    else
        sdpa__sb_printf(sb, "null");
}

static char *explain_json(const sdpa_context *ctx, const sdpa_call_desc *d,
                          const sdpa_decision *dec)
{
    sdpa_strbuf sb = {0};
    char line[512];
    platform_text(&ctx->platform, d, line, sizeof line);
    sdpa__sb_printf(&sb, "{\"platform\":");
    sdpa__sb_json_string(&sb, line);
    sdpa__sb_printf(&sb, ",\"simulated\":%s", ctx->platform.simulated ? "true" : "false");
    sdpa__sb_printf(&sb,
                    ",\"call\":{\"device\":\"%s\",\"dtype\":\"%s\",\"kv_dtype\":\"%s\",\"B\":%lld,\"Sq\":%lld,"
                    "\"Skv\":%lld,\"Hq\":%lld,\"Hkv\":%lld,\"D\":%lld,\"causal\":\"%s\","
                    "\"lse\":%s,\"deterministic\":%s,\"backward\":%s,\"component\":",
                    d->device == SDPA_DEVICE_CUDA ? "cuda" : "cpu", sdpa_dtype_name(d->dtype),
                    sdpa_dtype_name(sdpa__kv_dtype(d)),
                    (long long)d->B, (long long)d->Sq, (long long)d->Skv, (long long)d->Hq,
                    (long long)d->Hkv, (long long)d->D, sdpa_causal_name(d->causal),
                    d->want_lse ? "true" : "false", d->deterministic ? "true" : "false",
                    d->backward ? "true" : "false");
    json_string_or_null(&sb, d->component);
    sdpa__sb_printf(&sb, ",\"quant\":");
    json_string_or_null(&sb, d->quant);
    char mask[48];
    sdpa__mask_kinds_name(d->mask, mask, sizeof mask);
    sdpa__sb_printf(&sb, ",\"mask\":");
    sdpa__sb_json_string(&sb, mask);
    sdpa__sb_printf(&sb, "},\"source\":");
    sdpa__sb_json_string(&sb, sdpa_source_name(dec->source));
    sdpa__sb_printf(&sb, ",\"source_detail\":");
    sdpa__sb_json_string(&sb, dec->source_detail);
    sdpa__sb_printf(&sb, ",\"rule\":");
    if (dec->rule[0]) {
        sdpa__sb_printf(&sb, "{\"name\":");
        sdpa__sb_json_string(&sb, dec->rule);
        sdpa__sb_printf(&sb, ",\"origin\":");
        sdpa__sb_json_string(&sb, dec->rule_origin);
        sdpa__sb_printf(&sb, ",\"evidence\":");
        sdpa__sb_json_string(&sb, dec->evidence);
        sdpa__sb_printf(&sb, ",\"class\":");
        if (dec->rule_class[0])
            sdpa__sb_json_string(&sb, dec->rule_class);
        else
            sdpa__sb_printf(&sb, "null");
        sdpa__sb_printf(&sb, "}");
    } else {
        sdpa__sb_printf(&sb, "null");
    }
    sdpa__sb_printf(&sb, ",\"candidates\":[");
    for (int c = 0; c < dec->n_candidates; c++) {
        sdpa__sb_printf(&sb, "%s", c ? "," : "");
        sdpa__sb_json_string(&sb, dec->candidates[c]);
    }
    sdpa__sb_printf(&sb, "],\"present\":{");
    for (int i = 0; i < dec->n_backends; i++) {
        sdpa__sb_printf(&sb, "%s", i ? "," : "");
        sdpa__sb_json_string(&sb, dec->backends[i].name);
        sdpa__sb_printf(&sb, ":%s", dec->backends[i].present ? "true" : "false");
    }
    sdpa__sb_printf(&sb, "},\"rejected\":{");
    int first = 1;
    for (int i = 0; i < dec->n_backends; i++) {
        if (dec->backends[i].candidate >= 0)
            continue;
        sdpa__sb_printf(&sb, "%s", first ? "" : ",");
        first = 0;
        sdpa__sb_json_string(&sb, dec->backends[i].name);
        sdpa__sb_printf(&sb, ":");
        sdpa__sb_json_string(&sb, dec->backends[i].reason);
    }
    sdpa__sb_printf(&sb, "},\"status\":");
    sdpa__sb_json_string(&sb, sdpa_status_string(dec->status));
    sdpa__sb_printf(&sb, ",\"error\":");
    sdpa__sb_json_string(&sb, dec->error);
    sdpa__sb_printf(&sb, "}");
    (void)ctx;
    return sdpa__sb_take(&sb);
}

sdpa_status sdpa_explain(sdpa_context *ctx, const sdpa_call_desc *desc, int json, char **text)
{
    if (!ctx || !text)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "%s is NULL", ctx ? "text" : "ctx");
    *text = NULL;
    sdpa_call_desc grown;
    if (desc && !(desc = sdpa__struct_in(desc, SDPA_BASE_CALL_DESC, sizeof grown, &grown, "desc")))
        return SDPA_INVALID_ARGUMENT;
    sdpa_decision *dec = sdpa__malloc(sizeof *dec);
    if (!dec)
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "explain: cannot allocate");
    int cand[SDPA_MAX_CANDIDATES];
    sdpa_status st = sdpa__decide(ctx, desc, NULL, dec, cand);
    if (st == SDPA_OK) {
        *text = json ? explain_json(ctx, desc, dec) : explain_text(ctx, desc, dec);
        st = *text ? SDPA_OK : sdpa__fail(SDPA_OUT_OF_MEMORY, "explain: cannot allocate");
    }
    free(dec);
    if (st == SDPA_OK)
        sdpa__clear_error();
    return st;
}
