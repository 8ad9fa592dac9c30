/*
 * decision_cache.h - decisions kept per shape class, so that a repeated
 * call pays one mutex and one table probe (~0.1 us) instead of a full
 * decision (~1-3 us: the choice levels, every rule file, every backend's
 * check). Each layer has one; the context has one for its one-shot calls
 * (sdpa_forward, sdpa_warmup).
 *
 * An entry is valid for the context generation it was made in: loading
 * rules or setting a component's backend bumps it, and every entry goes
 * stale. The caller never asks this cache for a call with a per-call
 * explicit backend or under a scoped override: those are decided fresh,
 * because an override belongs to its thread and must never reach another
 * thread's calls through a shared entry.
 */
#ifndef SDPA_DECISION_CACHE_H
#define SDPA_DECISION_CACHE_H

#include "sdpa.h"

#include <pthread.h>

#define SDPA_DECISION_SLOTS 64

typedef struct sdpa_cached_decision {
    int valid;
    unsigned generation;
    sdpa_call_desc key; /* its string fields NULL: they are the two below */
    char component[48], quant[32];
    int n;
    int cand[SDPA_MAX_CANDIDATES];
    sdpa_source source;
    sdpa_status status;
    char error[256];
} sdpa_cached_decision;

typedef struct sdpa_decision_cache {
    pthread_mutex_t lock;
    sdpa_cached_decision slot[SDPA_DECISION_SLOTS];
} sdpa_decision_cache;

struct sdpa_context;
struct sdpa_choice;

void sdpa__decision_cache_init(sdpa_decision_cache *c);
void sdpa__decision_cache_destroy(sdpa_decision_cache *c);

/*
 * The decision for d (its backend field must be NULL): from the cache, or
 * made now with `fixed` (a layer's captured choice, or NULL) and kept
 * unless its component or quant string is too long for the key. `who`
 * names the caller in the debug log line written once per new decision.
 * Returns an error only when the decision itself could not be made; the
 * decision's own verdict is out->status.
 */
sdpa_status sdpa__cached_decide(struct sdpa_context *ctx, sdpa_decision_cache *c,
                                const sdpa_call_desc *d, const struct sdpa_choice *fixed,
                                const char *who, sdpa_cached_decision *out);

#endif
