/*
 * context.c - creating and destroying a context: its platform, backends,
 * pool, the built-in rules, then the environment (environment.c), which
 * brings the wisdom and user rules (rule_files.c). Overrides: overrides.c.
 */
#include "context.h"

#include "cuda_loader.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- backends */

int sdpa__ctx_find(const sdpa_context *ctx, const char *name)
{
    for (int i = 0; i < ctx->n_backends; i++)
        if (strcmp(ctx->backends[i]->name, name) == 0)
            return i;
    return -1;
}

sdpa_status sdpa__ctx_add_backend(sdpa_context *ctx, const sdpa_backend *b)
{
    if (ctx->n_backends == SDPA_MAX_BACKENDS)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "too many backends (at most %d)",
                          SDPA_MAX_BACKENDS);
    if (sdpa__ctx_find(ctx, b->name) >= 0)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "backend '%s' already registered", b->name);
    int i = ctx->n_backends++;
    ctx->backends[i] = b;
    ctx->present[i] = sdpa__backend_present(b, &ctx->host, ctx->why_absent[i],
                                            sizeof ctx->why_absent[i]);
    atomic_fetch_add(&ctx->generation, 1);
    return SDPA_OK;
}

int sdpa_backend_count(const sdpa_context *ctx) { return ctx ? ctx->n_backends : 0; }

sdpa_status sdpa_backend_get(const sdpa_context *ctx, int index, sdpa_backend_info *out)
{
    if (!ctx || !out)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "%s is NULL", ctx ? "out" : "ctx");
    if (index < 0 || index >= ctx->n_backends)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "index is %d, expected 0..%d", index,
                          ctx->n_backends - 1);
    const sdpa_backend *b = ctx->backends[index];
    memset(out, 0, sizeof *out);
    out->name = b->name;
    out->summary = b->summary;
    out->device = b->device;
    out->dtypes = b->caps.dtypes;
    out->head_dim_min = b->caps.d_min, out->head_dim_max = b->caps.d_max;
    out->head_dim_multiple = b->caps.d_multiple;
    out->gqa = b->caps.gqa, out->cross = b->caps.cross;
    out->causal_top_left = b->caps.causal_top_left;
    out->causal_bottom_right = b->caps.causal_bottom_right;
    out->lse = b->caps.lse, out->deterministic = b->caps.deterministic;
    out->cpu_features = b->caps.cpu_features;
    out->masks = b->caps.masks;
    out->min_cc = b->caps.min_cc;
    out->product_bits = b->caps.product_bits;
    out->backward = b->caps.backward;
    out->mixed_dtypes = b->caps.mixed_dtypes;
    out->shares = b->caps.shares;
    out->present = ctx->present[index];
    sdpa__strlcpy(out->why_absent, ctx->why_absent[index], sizeof out->why_absent);
    out->version = b->version;
    return SDPA_OK;
}

/* ---- context */

const sdpa_platform *sdpa_context_platform(const sdpa_context *ctx)
{
    return ctx ? &ctx->platform : NULL;
}

int sdpa_context_threads(const sdpa_context *ctx) { return ctx ? ctx->threads : 0; }

sdpa_status sdpa__ctx_pool(sdpa_context *ctx, sdpa_pool **out)
{
    /* started once, then read on every call: an acquire load, not the
     * mutex (a lock and unlock were ~5% of a one-token call) */
    sdpa_pool *pool = atomic_load_explicit(&ctx->pool, memory_order_acquire);
    if (pool) {
        *out = pool;
        return SDPA_OK;
    }
    sdpa_status st = SDPA_OK;
    pthread_mutex_lock(&ctx->pool_lock);
    pool = atomic_load_explicit(&ctx->pool, memory_order_relaxed);
    if (!pool) {
        st = ctx->host_for     ? sdpa__pool_create_host(ctx->threads, ctx->host_for,
                                                        ctx->host_user, &pool)
             : ctx->share_pool ? sdpa__pool_acquire(ctx->threads, &pool)
                               : sdpa__pool_create(ctx->threads, &pool);
        atomic_store_explicit(&ctx->pool, pool, memory_order_release);
    }
    *out = pool;
    pthread_mutex_unlock(&ctx->pool_lock);
    return st;
}

/* One line on which CPU kernel each input dtype gets here (by the rules,
 * for a typical diffusion call) and why the better ones do not run
 * ("AMX present but permission refused; f32 -> cpu.avx512, ..."). */
static void log_isa_decision(sdpa_context *ctx)
{
    if (ctx->log.level < SDPA_LOG_INFO)
        return; /* three decisions for a line nobody reads */
    char kernels[160] = "", skipped[512] = "";
    for (int t = 0; t < SDPA_DTYPE_COUNT; t++) {
        sdpa_call_desc d;
        memset(&d, 0, sizeof d);
        d.device = SDPA_DEVICE_CPU, d.dtype = (sdpa_dtype)t;
        d.B = 1, d.Sq = d.Skv = 1024, d.Hq = d.Hkv = 8, d.D = 128;
        sdpa_decision dec;
        int cand[SDPA_MAX_CANDIDATES];
        const char *name = "none";
        if (sdpa__decide(ctx, &d, NULL, &dec, cand) == SDPA_OK && dec.status == SDPA_OK)
            for (int k = 0; k < dec.n_candidates && strcmp(name, "none") == 0; k++)
                if (ctx->present[cand[k]])
                    name = ctx->backends[cand[k]]->name;
        size_t len = strlen(kernels);
        snprintf(kernels + len, sizeof kernels - len, "%s%s -> %s", len ? ", " : "",
                 sdpa_dtype_name((sdpa_dtype)t), name);
    }
    sdpa__clear_error();
    for (int i = 0; i < ctx->n_backends; i++) {
        const sdpa_backend *b = ctx->backends[i];
        if (b->device != SDPA_DEVICE_CPU || b->fallback_rank <= 0 || ctx->present[i])
            continue;
        size_t len = strlen(skipped);
        snprintf(skipped + len, sizeof skipped - len, "%s%s %s", len ? "; " : "", b->name,
                 ctx->why_absent[i]);
    }
    const int refused =
        (ctx->host.cpu_features_present & SDPA_CPU_AMX_BF16) && !ctx->host.amx_permitted;
    const char *amx = refused ? "AMX present but permission refused; " : "";
    sdpa__log(&ctx->log, SDPA_LOG_INFO, "CPU kernel: %s%s%s%s%s", amx, kernels,
              skipped[0] ? " (" : "", skipped, skipped[0] ? ")" : "");
}

sdpa_status sdpa_context_create(const sdpa_context_options *opts, sdpa_context **out)
{
    static const sdpa_context_options defaults = SDPA_CONTEXT_OPTIONS_DEFAULT;
    if (!out)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "out is NULL, expected a place for the context");
    *out = NULL;
    const sdpa_context_options *o = opts ? opts : &defaults;
    if (o->threads < 0)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "opts->threads is %d, expected >= 0 (0 = all)",
                          o->threads);
    if (o->log_level < -1 || o->log_level > SDPA_LOG_DEBUG)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "opts->log_level is %d, expected -1..3",
                          o->log_level);
    sdpa_context *ctx = sdpa__calloc(1, sizeof *ctx);
    if (!ctx)
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "cannot allocate a context");
    pthread_mutex_init(&ctx->pool_lock, NULL);
    pthread_rwlock_init(&ctx->lock, NULL);
    sdpa__decision_cache_init(&ctx->oneshot);
    ctx->env_backend = -1;
    ctx->log.fn = o->log;
    ctx->log.user = o->log_user;
    ctx->log.level = o->log_level >= 0 ? o->log_level : SDPA_LOG_WARN;
    sdpa_platform_detect(&ctx->host);
    ctx->platform = o->platform ? *o->platform : ctx->host;
    ctx->threads = o->threads ? o->threads : ctx->host.cpu_cores;
    ctx->foreign_policy = o->foreign_policy != 0;
    ctx->host_for = o->parallel_for, ctx->host_user = o->parallel_for_user;
    ctx->share_pool = o->share_pool != 0 && !ctx->host_for;

    sdpa_status st = SDPA_OK;
    for (int i = 0; sdpa__builtin_backends[i] && st == SDPA_OK; i++)
        st = sdpa__ctx_add_backend(ctx, sdpa__builtin_backends[i]);
    /* The CUDA plugin's kernels replace the declared placeholders. */
    const sdpa_backend *cuda[8];
    for (int i = 0, n = sdpa__cuda_backends(cuda, 8); i < n; i++) {
        int b = sdpa__ctx_find(ctx, cuda[i]->name);
        if (b >= 0)
            ctx->backends[b] = cuda[i];
    }
    if (st == SDPA_OK)
        st = sdpa__ctx_install_policy(ctx, sdpa__default_rules_text, "default.rules");
    if (st == SDPA_OK)
        st = sdpa__ctx_apply_env(ctx, o);
    if (st != SDPA_OK) {
        char msg[1024];
        sdpa__strlcpy(msg, sdpa_last_error(), sizeof msg);
        sdpa_context_destroy(ctx);
        return sdpa__fail(st, "%s", msg);
    }
    /* Presence depends on the host's features after SDPA_MAX_ISA. */
    for (int i = 0; i < ctx->n_backends; i++)
        ctx->present[i] = sdpa__backend_present(ctx->backends[i], &ctx->host, ctx->why_absent[i],
                                                sizeof ctx->why_absent[i]);
    sdpa__log(&ctx->log, SDPA_LOG_INFO, "context: %s, %d threads, %d backends", ctx->host.cpu_model,
              ctx->threads, ctx->n_backends);
    log_isa_decision(ctx);
    *out = ctx;
    sdpa__clear_error();
    return SDPA_OK;
}

void sdpa_context_destroy(sdpa_context *ctx)
{
    if (!ctx)
        return;
    if (ctx->share_pool)
        sdpa__pool_release(ctx->pool);
    else
        sdpa__pool_destroy(ctx->pool);
    for (int i = 0; i < ctx->n_policies; i++)
        sdpa__policy_free(ctx->policies[i]);
    pthread_mutex_destroy(&ctx->pool_lock);
    pthread_rwlock_destroy(&ctx->lock);
    sdpa__decision_cache_destroy(&ctx->oneshot);
    free(ctx);
}

