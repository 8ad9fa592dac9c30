/*
 * lookup.c - finding things in a context (context.h): a backend by name,
 * the backends' descriptions, the platform, the thread count, and the pool
 * (started on first use). Every other dispatcher file looks up here; this
 * file calls none of them.
 */
#include "context.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

