/*
 * overrides.c - the choices made above the rules: the scoped overrides
 * (a per-thread stack of backend names) and the per-component backends.
 */
#include "context.h"

#include <string.h>

static _Thread_local int override_depth;
static _Thread_local char override_stack[SDPA_OVERRIDE_DEPTH][64];

sdpa_status sdpa_override_push(const char *backend)
{
    if (!backend || !*backend)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "backend is %s, expected a backend name",
                          backend ? "empty" : "NULL");
    if (strlen(backend) >= sizeof override_stack[0])
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "backend name '%.20s...' is too long", backend);
    if (override_depth == SDPA_OVERRIDE_DEPTH)
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "scoped overrides nested deeper than %d; expected a pop for each push",
                          SDPA_OVERRIDE_DEPTH);
    strcpy(override_stack[override_depth++], backend);
    sdpa__clear_error();
    return SDPA_OK;
}

sdpa_status sdpa_override_pop(void)
{
    if (override_depth == 0)
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "sdpa_override_pop without a matching sdpa_override_push");
    override_depth--;
    sdpa__clear_error();
    return SDPA_OK;
}

const char *sdpa_override_current(void)
{
    return override_depth ? override_stack[override_depth - 1] : NULL;
}

sdpa_status sdpa_context_set_component_backend(sdpa_context *ctx, const char *component,
                                               const char *backend)
{
    if (!ctx || !component || !*component)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "%s is NULL or empty",
                          ctx ? "component" : "ctx");
    if (strlen(component) >= sizeof ctx->components[0].component)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "component name '%.20s...' is too long",
                          component);
    int b = -1;
    if (backend && (b = sdpa__ctx_find(ctx, backend)) < 0)
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "backend '%s' unknown (see `sdpa info` for the names)", backend);
    pthread_rwlock_wrlock(&ctx->lock);
    int i = 0;
    while (i < ctx->n_components && strcmp(ctx->components[i].component, component))
        i++;
    sdpa_status st = SDPA_OK;
    if (b < 0) {
        if (i < ctx->n_components)
            ctx->components[i] = ctx->components[--ctx->n_components];
    } else if (i == ctx->n_components && i == SDPA_MAX_COMPONENTS) {
        st = sdpa__fail(SDPA_INVALID_ARGUMENT, "too many component overrides (at most %d)",
                        SDPA_MAX_COMPONENTS);
    } else {
        if (i == ctx->n_components)
            ctx->n_components++;
        sdpa__strlcpy(ctx->components[i].component, component,
                      sizeof ctx->components[i].component);
        ctx->components[i].backend = b;
    }
    atomic_fetch_add(&ctx->generation, 1);
    pthread_rwlock_unlock(&ctx->lock);
    if (st == SDPA_OK)
        sdpa__clear_error();
    return st;
}
