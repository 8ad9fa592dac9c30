/*
 * context.c - creating and destroying a context: its platform, backends,
 * the built-in rules, then the environment (read by environment.c, applied
 * here), which brings the wisdom and user rules (rule_files.c). The top of
 * the dispatcher: it calls every file below it, none calls it. Lookups in
 * a context: lookup.c; overrides: overrides.c.
 */
#include "context.h"
#include "cuda_loader.h"
#include "decide.h"
#include "environment.h"
#include "rule_files.h"
#include "../core/cpu_features.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* The flash kernel variant SDPA_CUDA_FLASH_VARIANT selects: 0 or 1, or -1
 * when the value is neither (INVALID_ARGUMENT recorded). */
static int cuda_flash_variant(const sdpa_env *env)
{
    const char *v = sdpa__env_value(env, SDPA_ENV_CUDA_FLASH_VARIANT);
    if (!v || strcmp(v, "0") == 0)
        return 0;
    if (strcmp(v, "1") == 0)
        return 1;
    sdpa__fail(SDPA_INVALID_ARGUMENT,
               "SDPA_CUDA_FLASH_VARIANT='%.20s' unknown, expected 0 (plain loads) or 1 "
               "(cp.async pipeline)",
               v);
    return -1;
}

/* Applies the environment at creation: log level, ISA cap, foreign-file
 * policy, SDPA_BACKEND, the CUDA flash variant, the wisdom and SDPA_POLICY
 * (or o->policy_file), each validated. */
static sdpa_status apply_env(sdpa_context *ctx, const sdpa_context_options *o)
{
    if (o->ignore_env) {
        snprintf(ctx->wisdom, sizeof ctx->wisdom, "not looked for (ignore_env)\n");
        return o->policy_file ? sdpa_context_load_policy(ctx, o->policy_file) : SDPA_OK;
    }
    sdpa_env *env = sdpa__malloc(sizeof *env);
    if (!env)
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "cannot allocate the environment's snapshot");
    sdpa__env_read(env);
    sdpa_status st = SDPA_OK;
    const char *s;
    if (o->log_level < 0 && (s = sdpa__env_value(env, SDPA_ENV_LOG))) {
        int lvl = sdpa__log_level_parse(s);
        if (lvl < 0) {
            st = sdpa__fail(SDPA_INVALID_ARGUMENT,
                            "SDPA_LOG='%s' unknown, expected error, warn, info or debug", s);
            goto done;
        }
        ctx->log.level = lvl;
    }
    if ((s = sdpa__env_value(env, SDPA_ENV_MAX_ISA))) {
        const sdpa_isa_level *level = sdpa__isa_level(s);
        if (!level) {
            char names[160];
            st = sdpa__fail(SDPA_INVALID_ARGUMENT, "SDPA_MAX_ISA='%s' unknown, expected %s", s,
                            sdpa__isa_levels_expected(names, sizeof names));
            goto done;
        }
        const unsigned mask = level->features;
        unsigned before = ctx->host.cpu_features;
        ctx->host.cpu_features &= mask;
        if (!ctx->platform.simulated)
            ctx->platform.cpu_features &= mask;
        sdpa__log(&ctx->log, SDPA_LOG_INFO, "SDPA_MAX_ISA=%s: CPU features 0x%x -> 0x%x", s,
                  before, ctx->host.cpu_features);
    }
    if ((s = sdpa__env_value(env, SDPA_ENV_POLICY_FOREIGN))) {
        if (strcmp(s, "refuse") != 0 && strcmp(s, "warn") != 0) {
            st = sdpa__fail(SDPA_INVALID_ARGUMENT,
                            "SDPA_POLICY_FOREIGN='%s' unknown, expected refuse or warn", s);
            goto done;
        }
        ctx->foreign_policy = strcmp(s, "warn") == 0;
    }
    if ((s = sdpa__env_value(env, SDPA_ENV_BACKEND)) &&
        (ctx->env_backend = sdpa__ctx_find(ctx, s)) < 0) {
        st = sdpa__fail(SDPA_INVALID_ARGUMENT,
                        "SDPA_BACKEND='%s' unknown (see `sdpa info` for the names)", s);
        goto done;
    }
    if ((ctx->cuda_flash_variant = cuda_flash_variant(env)) < 0) {
        st = SDPA_INVALID_ARGUMENT;
        goto done;
    }
    if ((s = sdpa__env_value(env, SDPA_ENV_FINITE_GUARD))) {
        if (strcmp(s, "0") && strcmp(s, "1")) {
            st = sdpa__fail(SDPA_INVALID_ARGUMENT,
                            "SDPA_FINITE_GUARD='%.20s' unknown, expected 0 (off) or 1 (on)", s);
            goto done;
        }
        atomic_store(&ctx->finite_guard, s[0] == '1');
    }
    sdpa__ctx_load_wisdom(ctx, env);
    const char *policy = o->policy_file ? o->policy_file : sdpa__env_value(env, SDPA_ENV_POLICY);
    if (policy)
        st = sdpa_context_load_policy(ctx, policy);
done:
    free(env);
    return st;
}

sdpa_status sdpa_context_create(const sdpa_context_options *opts, sdpa_context **out)
{
    static const sdpa_context_options defaults = SDPA_CONTEXT_OPTIONS_DEFAULT;
    if (!out)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "out is NULL, expected a place for the context");
    *out = NULL;
    sdpa_context_options grown;
    const sdpa_context_options *o =
        opts ? sdpa__struct_in(opts, SDPA_BASE_CONTEXT_OPTIONS, sizeof grown, &grown, "opts")
             : &defaults;
    if (!o)
        return SDPA_INVALID_ARGUMENT;
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
    ctx->threads = o->threads ? o->threads : sdpa__cpus_allowed();
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
        st = apply_env(ctx, o);
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

