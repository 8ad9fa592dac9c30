/* decision_cache.c - see decision_cache.h. */
#include "decision_cache.h"
#include "context.h"
#include "decide.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sdpa__decision_cache_init(sdpa_decision_cache *c)
{
    pthread_mutex_init(&c->lock, NULL);
    for (int i = 0; i < SDPA_DECISION_SLOTS; i++)
        c->slot[i].valid = 0;
}

void sdpa__decision_cache_destroy(sdpa_decision_cache *c) { pthread_mutex_destroy(&c->lock); }

static const char *or_empty(const char *s) { return s ? s : ""; }

static int same_class(const sdpa_cached_decision *e, const sdpa_call_desc *b)
{
    const sdpa_call_desc *a = &e->key;
    return a->device == b->device && a->dtype == b->dtype && a->B == b->B && a->Sq == b->Sq &&
           a->Skv == b->Skv && a->Hq == b->Hq && a->Hkv == b->Hkv && a->D == b->D &&
           a->causal == b->causal && a->want_lse == b->want_lse &&
           a->deterministic == b->deterministic && a->mask == b->mask &&
           a->backward == b->backward && sdpa__kv_dtype(a) == sdpa__kv_dtype(b) &&
           a->shares == b->shares &&
           strcmp(e->component, or_empty(b->component)) == 0 &&
           strcmp(e->quant, or_empty(b->quant)) == 0;
}

static unsigned class_hash(const sdpa_call_desc *d)
{
    uint64_t h = 1469598103934665603ull;
    const int64_t f[] = {d->device, d->dtype, d->B, d->Sq, d->Skv, d->Hq, d->Hkv, d->D,
                         d->causal, d->want_lse, d->deterministic, d->mask, d->backward,
                         sdpa__kv_dtype(d), d->shares};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++)
        h = (h ^ (uint64_t)f[i]) * 1099511628211ull;
    for (const char *s = or_empty(d->component); *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return (unsigned)(h ^ (h >> 32)) % SDPA_DECISION_SLOTS;
}

sdpa_status sdpa__cached_decide(sdpa_context *ctx, sdpa_decision_cache *c,
                                const sdpa_call_desc *d, const sdpa_choice *fixed,
                                const char *who, sdpa_cached_decision *out)
{
    const unsigned gen = atomic_load(&ctx->generation);
    const unsigned slot = class_hash(d);
    pthread_mutex_lock(&c->lock);
    const sdpa_cached_decision *e = &c->slot[slot];
    const int hit = e->valid && e->generation == gen && same_class(e, d);
    if (hit)
        *out = *e;
    pthread_mutex_unlock(&c->lock);
    if (hit)
        return SDPA_OK;

    sdpa_decision *dec = sdpa__malloc(sizeof *dec); /* ~3 KB: not on the stack of every call */
    if (!dec)
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "%s: cannot allocate a decision", who);
    memset(out, 0, sizeof *out);
    sdpa_status st = sdpa__decide(ctx, d, fixed, dec, out->cand);
    if (st != SDPA_OK) {
        free(dec);
        return st;
    }
    out->valid = 1;
    out->generation = gen;
    out->key = *d;
    out->key.backend = out->key.component = out->key.quant = NULL;
    const int fits = strlen(or_empty(d->component)) < sizeof out->component &&
                     strlen(or_empty(d->quant)) < sizeof out->quant;
    sdpa__strlcpy(out->component, or_empty(d->component), sizeof out->component);
    sdpa__strlcpy(out->quant, or_empty(d->quant), sizeof out->quant);
    out->n = dec->n_candidates;
    out->source = dec->source;
    out->status = dec->status;
    sdpa__strlcpy(out->error, dec->error, sizeof out->error);
    if (ctx->log.level >= SDPA_LOG_DEBUG) {
        char cls[256], list[256] = "";
        sdpa__desc_string(d, cls, sizeof cls);
        for (int i = 0, len = 0; i < dec->n_candidates; i++)
            len += snprintf(list + len, sizeof list - (size_t)len, "%s%s", i ? ", " : "",
                            dec->candidates[i]);
        sdpa__log(&ctx->log, SDPA_LOG_DEBUG, "%s: %s -> [%s] by %s%s%s%s", who, cls,
                  dec->n_candidates ? list : dec->error, sdpa_source_name(dec->source),
                  dec->rule[0] ? " '" : "", dec->rule, dec->rule[0] ? "'" : "");
    }
    free(dec);
    if (fits) {
        pthread_mutex_lock(&c->lock);
        c->slot[slot] = *out;
        pthread_mutex_unlock(&c->lock);
    }
    return SDPA_OK;
}
