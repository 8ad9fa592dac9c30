/*
 * layer.c - running a call: the one-shot entry point and layer handles
 * with their decision cache and latch.
 *
 * A layer caches its decision per shape class (dtype, sizes, mask, LSE,
 * determinism), and so does the context for one-shot calls
 * (decision_cache.h), so the steady-state cost of dispatch is one mutex
 * and one table probe (bench/dispatch_overhead measures it). A backend that answers
 * UNSUPPORTED while running is latched off for the layer: one atomic bit,
 * one warning, and the next candidate runs in the same call.
 */
#include "context.h"
#include "decide.h"
#include "decision_cache.h"
#include "guard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct sdpa_layer {
    sdpa_context *ctx;
    char name[96];
    char component[48];
    char quant[32];
    int has_choice;
    sdpa_choice choice;          /* levels 1-4, captured at creation */
    _Atomic uint64_t latched[2]; /* bit per backend index: forward, backward */
    char who[112];               /* "layer 'NAME'", for the decision log */
    _Atomic int guard;           /* the finite guard: 1, 0, or -1 as the context */
    sdpa_decision_cache cache;
};

_Static_assert(SDPA_MAX_BACKENDS <= 64, "latch mask holds one bit per backend");

/* ---- running a list of candidates */

/* Appends to a fixed buffer, "; "-separated, truncating quietly. */
static void note(char *buf, size_t cap, const char *name, const char *why)
{
    const char *parts[4] = {buf[0] ? "; " : "", name, ": ", why};
    for (int i = 0; i < 4; i++) {
        size_t len = strlen(buf);
        sdpa__strlcpy(buf + len, parts[i], cap - len);
    }
}

/* The finite guard caught backend b (index) giving NaN or Inf from finite
 * inputs: counted, latched off for the layer (or the context's one-shot
 * calls), one warning the first time. */
static void guard_event(sdpa_context *ctx, sdpa_layer *layer, const char *layer_name,
                        const sdpa_call *call, const char *backend, int b)
{
    atomic_fetch_add(&ctx->guard_events, 1);
    const uint64_t bit = 1ull << b;
    _Atomic uint64_t *latch = layer ? &layer->latched[0] : &ctx->guard_latched;
    if (atomic_fetch_or(latch, bit) & bit)
        return;
    char shape[256];
    sdpa__desc_string(&call->desc, shape, sizeof shape);
    sdpa__log(&ctx->log, SDPA_LOG_WARN,
              "%s: backend %s gave a non-finite output from finite inputs (%s); finite guard: "
              "latched off for %s, running the next candidate",
              layer_name, backend, shape, layer ? "this layer" : "this context's one-shot calls");
}

/*
 * Runs the first candidate that can; with `warmup`, prepares it instead
 * (backend->prepare, or nothing when it has none): the same walk, latch
 * and errors as the call it warms up, so a shape cuDNN has no engine for is
 * latched at warm-up rather than on the first real call.
 */
static sdpa_status run_candidates(sdpa_context *ctx, sdpa_layer *layer, const char *layer_name,
                                  sdpa_call *call, const int *cand, int n, sdpa_source source,
                                  int warmup)
{
    const char *when = warmup ? "at warm-up" : "at run time";
    const int pass = call->desc.backward; /* which latch, which entry point */
    const char *what = pass ? "backward pass" : "call";
    /* A share runs where every other share runs: a refusal is not taken
     * to the next candidate, which would compute its rows differently. */
    const int fixed = source <= SDPA_SOURCE_ENVIRONMENT || call->desc.shares > 0;
    char skipped[512] = "";
    int n_absent = 0;
    const char *kept = NULL;
    const int guard = layer ? atomic_load_explicit(&layer->guard, memory_order_relaxed) : -1;
    const int guarded = !pass && !warmup && call->desc.shares == 0 &&
                        call->desc.device == SDPA_DEVICE_CPU &&
                        (guard >= 0 ? guard : atomic_load_explicit(&ctx->finite_guard,
                                                                   memory_order_relaxed));
    sdpa_status st = SDPA_OK;
    if (call->desc.shares > 0)
        call->pool = sdpa__pool_share(call->share, call->desc.shares);
    else if ((st = sdpa__ctx_pool(ctx, &call->pool)) != SDPA_OK)
        return st;
    call->cpu_features = ctx->host.cpu_features;
    call->cuda_flash_variant = ctx->cuda_flash_variant;
    for (int k = 0; k < n; k++) {
        const int b = cand[k];
        const sdpa_backend *be = ctx->backends[b];
        if (layer && (atomic_load_explicit(&layer->latched[pass], memory_order_relaxed) >> b) & 1u) {
            note(skipped, sizeof skipped, be->name, "latched off");
            continue;
        }
        if (!ctx->present[b]) {
            if (fixed)
                return sdpa__fail(SDPA_NOT_AVAILABLE, "%s: %s", be->name, ctx->why_absent[b]);
            n_absent++;
            note(skipped, sizeof skipped, be->name, ctx->why_absent[b]);
            continue;
        }
        if (!layer && (atomic_load_explicit(&ctx->guard_latched, memory_order_relaxed) >> b) & 1u &&
            !pass) {
            note(skipped, sizeof skipped, be->name, "latched off by the finite guard");
            continue;
        }
        st = pass      ? be->backward(be, call)
             : !warmup ? be->run(be, call)
             : be->prepare ? be->prepare(be, call)
                           : SDPA_OK;
        if (st == SDPA_OK && guarded && be != &sdpa__backend_ref &&
            sdpa__guard_output_bad(call) && sdpa__guard_inputs_finite(call)) {
            guard_event(ctx, layer, layer_name, call, be->name, b);
            kept = be->name; /* what the output holds if no later candidate runs */
            note(skipped, sizeof skipped, be->name, "non-finite output (finite guard)");
            continue;
        }
        if (st == SDPA_OK) {
            sdpa__set_last_backend(be->name);
            sdpa__clear_error();
            return SDPA_OK;
        }
        if (st != SDPA_UNSUPPORTED || fixed)
            return st; /* never swallowed: OOM, device errors, bad input, bugs */
        char reason[512];
        sdpa__strlcpy(reason, sdpa_last_error(), sizeof reason);
        note(skipped, sizeof skipped, be->name, reason);
        if (layer) {
            uint64_t bit = 1ull << b;
            uint64_t old = atomic_fetch_or(&layer->latched[pass], bit);
            if (!(old & bit))
                sdpa__log(&ctx->log, SDPA_LOG_WARN,
                          "layer '%s': backend %s refused the %s %s (%s); latched off "
                          "for this layer's %s, running the next candidate",
                          layer_name, be->name, what, when, reason,
                          pass ? "backward pass" : "forward calls");
        } else {
            sdpa__log(&ctx->log, SDPA_LOG_INFO,
                      "%s: backend %s refused the %s %s (%s); running the next "
                      "candidate",
                      layer_name, be->name, what, when, reason);
        }
    }
    if (kept) { /* the guard's last refusal is all there is: its output stands */
        sdpa__log(&ctx->log, SDPA_LOG_WARN,
                  "%s: no candidate after %s gave a finite output; keeping %s's", layer_name,
                  kept, kept);
        sdpa__set_last_backend(kept);
        sdpa__clear_error();
        return SDPA_OK;
    }
    /* Only absent backends: nothing here can run it. Otherwise the call
     * itself is what the candidates refused. */
    return sdpa__fail(n_absent == n ? SDPA_NOT_AVAILABLE : SDPA_UNSUPPORTED,
                      "%s: no candidate could run the %s (%s)", layer_name, what,
                      skipped[0] ? skipped : "no candidates");
}

/* A fresh decision, then run: per-call explicit choices and calls under a
 * scoped override. */
static sdpa_status decide_and_run(sdpa_context *ctx, sdpa_layer *layer, const char *name,
                                  sdpa_call *call, int warmup)
{
    sdpa_decision dec;
    int cand[SDPA_MAX_CANDIDATES];
    sdpa_status st = sdpa__decide_lean(ctx, &call->desc, &dec, cand);
    if (st != SDPA_OK)
        return st;
    if (dec.status != SDPA_OK)
        return sdpa__fail(dec.status, "%s: %s", name, dec.error);
    return run_candidates(ctx, layer, name, call, cand, dec.n_candidates, dec.source, warmup);
}

/* A prepared call (forward, warm-up or backward) through the context's
 * one-shot decisions. */
static sdpa_status context_run(sdpa_context *ctx, sdpa_call *call, const char *name, int warmup)
{
    /* per-call explicit choices and scoped overrides: decided fresh, never
     * cached (decision_cache.h says why) */
    if (call->desc.backend || sdpa_override_current())
        return decide_and_run(ctx, NULL, name, call, warmup);
    sdpa_cached_decision e;
    sdpa_status st = sdpa__cached_decide(ctx, &ctx->oneshot, &call->desc, NULL, name, &e);
    if (st != SDPA_OK)
        return st;
    if (e.status != SDPA_OK)
        return sdpa__fail(e.status, "%s: %s", name, e.error);
    return run_candidates(ctx, NULL, name, call, e.cand, e.n, e.source, warmup);
}

static sdpa_status context_call(sdpa_context *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                                const sdpa_tensor *v, sdpa_tensor *out, float *lse,
                                const sdpa_params *params, int warmup)
{
    if (!ctx)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "ctx is NULL, expected a context");
    sdpa_call call;
    sdpa_status st = sdpa__call_prepare(q, k, v, out, lse, params, &call);
    if (st != SDPA_OK)
        return st;
    const char *name = params && params->layer_name ? params->layer_name
                       : warmup                     ? "sdpa_warmup"
                                                    : "sdpa_forward";
    return context_run(ctx, &call, name, warmup);
}

sdpa_status sdpa_forward(sdpa_context *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                         const sdpa_tensor *v, sdpa_tensor *out, float *lse,
                         const sdpa_params *params)
{
    return context_call(ctx, q, k, v, out, lse, params, 0);
}

sdpa_status sdpa_forward_share(sdpa_context *ctx, int share, int shares, const sdpa_tensor *q,
                               const sdpa_tensor *k, const sdpa_tensor *v, sdpa_tensor *out,
                               float *lse, const sdpa_params *params)
{
    if (!ctx)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "ctx is NULL, expected a context");
    if (shares < 1 || shares > 4096)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "shares is %d, expected 1..4096", shares);
    if (share < 0 || share >= shares)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "share is %d, expected 0..%d (shares - 1)",
                          share, shares - 1);
    sdpa_call call;
    sdpa_status st = sdpa__call_prepare(q, k, v, out, lse, params, &call);
    if (st != SDPA_OK)
        return st;
    call.desc.shares = shares, call.share = share;
    return context_run(ctx, &call,
                       params && params->layer_name ? params->layer_name : "sdpa_forward_share",
                       0);
}

sdpa_status sdpa_warmup(sdpa_context *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                        const sdpa_tensor *v, sdpa_tensor *out, float *lse,
                        const sdpa_params *params)
{
    return context_call(ctx, q, k, v, out, lse, params, 1);
}

sdpa_status sdpa_backward(sdpa_context *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                          const sdpa_tensor *v, const sdpa_tensor *out, const float *lse,
                          const sdpa_tensor *dout, const float *dlse, sdpa_tensor *dq,
                          sdpa_tensor *dk, sdpa_tensor *dv, const sdpa_params *params)
{
    if (!ctx)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "ctx is NULL, expected a context");
    sdpa_call call;
    sdpa_status st =
        sdpa__call_prepare_backward(q, k, v, out, lse, dout, dlse, dq, dk, dv, params, &call);
    if (st != SDPA_OK)
        return st;
    return context_run(ctx, &call,
                       params && params->layer_name ? params->layer_name : "sdpa_backward", 0);
}

/* ---- layers */

sdpa_status sdpa_layer_create(sdpa_context *ctx, const sdpa_layer_desc *desc, sdpa_layer **out)
{
    static const sdpa_layer_desc defaults = SDPA_LAYER_DESC_DEFAULT;
    if (!ctx || !out)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "%s is NULL", ctx ? "out" : "ctx");
    *out = NULL;
    sdpa_layer_desc grown;
    if (!desc)
        desc = &defaults;
    else if (!(desc = sdpa__struct_in(desc, SDPA_BASE_LAYER_DESC, sizeof grown, &grown, "desc")))
        return SDPA_INVALID_ARGUMENT;
    sdpa_layer *l = sdpa__calloc(1, sizeof *l);
    if (!l)
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "cannot allocate a layer");
    l->ctx = ctx;
    atomic_store(&l->guard, -1);
    sdpa__strlcpy(l->name, desc->name ? desc->name : "(unnamed layer)", sizeof l->name);
    sdpa__strlcpy(l->component, desc->component ? desc->component : "", sizeof l->component);
    sdpa__strlcpy(l->quant, desc->quant ? desc->quant : "", sizeof l->quant);
    /* Levels 1-4 are resolved now, under the scoped override active now. */
    sdpa_call_desc probe;
    memset(&probe, 0, sizeof probe);
    probe.backend = desc->backend;
    probe.component = desc->component;
    int r = sdpa__resolve_choice(ctx, &probe, NULL, &l->choice);
    if (r < 0) {
        free(l);
        return SDPA_INVALID_ARGUMENT;
    }
    if (r > 0 && l->choice.source == SDPA_SOURCE_EXPLICIT)
        sdpa__fmt(l->choice.detail, sizeof l->choice.detail, "backend=%s on layer '%s'",
                  desc->backend, l->name);
    l->has_choice = r > 0;
    sdpa__fmt(l->who, sizeof l->who, "layer '%s'", l->name);
    sdpa__decision_cache_init(&l->cache);
    *out = l;
    sdpa__clear_error();
    return SDPA_OK;
}

void sdpa_layer_destroy(sdpa_layer *layer)
{
    if (!layer)
        return;
    sdpa__decision_cache_destroy(&layer->cache);
    free(layer);
}

int sdpa_layer_is_latched(const sdpa_layer *layer, const char *backend)
{
    if (!layer || !backend)
        return 0;
    int b = sdpa__ctx_find(layer->ctx, backend);
    return b >= 0 && (((atomic_load(&layer->latched[0]) | atomic_load(&layer->latched[1])) >> b) &
                      1u);
}

/* A prepared call (forward, warm-up or backward) through the layer. */
static sdpa_status layer_run(sdpa_layer *l, sdpa_call *call, int warmup)
{
    call->desc.component = l->component[0] ? l->component : NULL;
    call->desc.quant = l->quant[0] ? l->quant : NULL;
    if (call->desc.backend) /* per-call explicit choice: not cached */
        return decide_and_run(l->ctx, l, l->name, call, warmup);
    /* A scoped override on the calling thread belongs to that thread: it
     * beats everything but the layer's own backend, and its decision is
     * never written to the cache the layer's other callers read. */
    const int own_backend = l->has_choice && l->choice.source == SDPA_SOURCE_EXPLICIT;
    if (!own_backend && sdpa_override_current())
        return decide_and_run(l->ctx, l, l->name, call, warmup);
    sdpa_cached_decision e;
    sdpa_status st = sdpa__cached_decide(l->ctx, &l->cache, &call->desc,
                                         l->has_choice ? &l->choice : NULL, l->who, &e);
    if (st != SDPA_OK)
        return st;
    if (e.status != SDPA_OK)
        return sdpa__fail(e.status, "layer '%s': %s", l->name, e.error);
    return run_candidates(l->ctx, l, l->name, call, e.cand, e.n, e.source, warmup);
}

static sdpa_status layer_call(sdpa_layer *l, const sdpa_tensor *q, const sdpa_tensor *k,
                              const sdpa_tensor *v, sdpa_tensor *out, float *lse,
                              const sdpa_params *params, int warmup)
{
    if (!l)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "layer is NULL, expected a layer handle");
    sdpa_call call;
    sdpa_status st = sdpa__call_prepare(q, k, v, out, lse, params, &call);
    if (st != SDPA_OK)
        return st;
    return layer_run(l, &call, warmup);
}

sdpa_status sdpa_layer_forward(sdpa_layer *l, const sdpa_tensor *q, const sdpa_tensor *k,
                               const sdpa_tensor *v, sdpa_tensor *out, float *lse,
                               const sdpa_params *params)
{
    return layer_call(l, q, k, v, out, lse, params, 0);
}

sdpa_status sdpa_layer_warmup(sdpa_layer *l, const sdpa_tensor *q, const sdpa_tensor *k,
                              const sdpa_tensor *v, sdpa_tensor *out, float *lse,
                              const sdpa_params *params)
{
    return layer_call(l, q, k, v, out, lse, params, 1);
}

sdpa_status sdpa_layer_backward(sdpa_layer *l, const sdpa_tensor *q, const sdpa_tensor *k,
                                const sdpa_tensor *v, const sdpa_tensor *out, const float *lse,
                                const sdpa_tensor *dout, const float *dlse, sdpa_tensor *dq,
                                sdpa_tensor *dk, sdpa_tensor *dv, const sdpa_params *params)
{
    if (!l)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "layer is NULL, expected a layer handle");
    sdpa_call call;
    sdpa_status st =
        sdpa__call_prepare_backward(q, k, v, out, lse, dout, dlse, dq, dk, dv, params, &call);
    if (st != SDPA_OK)
        return st;
    return layer_run(l, &call, 0);
}

sdpa_status sdpa_layer_set_finite_guard(sdpa_layer *l, int on)
{
    if (!l)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "layer is NULL, expected a layer");
    if (on < -1 || on > 1)
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "on is %d, expected 1 (on), 0 (off) or -1 (as the context)", on);
    atomic_store(&l->guard, on);
    return SDPA_OK;
}

