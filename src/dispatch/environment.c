/*
 * environment.c - the environment variables libsdpa reads (environment.h),
 * what each means, and how a context applies them at creation.
 */
#include "environment.h"
#include "context.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name, *values, *meaning;
} vars[SDPA_ENV_COUNT] = {
    [SDPA_ENV_BACKEND] = {"SDPA_BACKEND", "a backend name",
                          "global backend override (level 4 of the precedence)"},
    [SDPA_ENV_POLICY] = {"SDPA_POLICY", "a path",
                         "user rule file, tried before the wisdom and the built-in rules"},
    [SDPA_ENV_WISDOM] = {"SDPA_WISDOM", "a path, or none",
                         "the machine's wisdom file; default: this user's, then the system's"},
    [SDPA_ENV_POLICY_FOREIGN] = {"SDPA_POLICY_FOREIGN", "refuse (default) or warn",
                                 "a rule file whose require lines name another machine or "
                                 "libsdpa version: refused, or loaded with a warning"},
    [SDPA_ENV_LOG] = {"SDPA_LOG", "error, warn (default), info or debug",
                      "log level; at debug every decision is logged once per layer and shape "
                      "class"},
    [SDPA_ENV_MAX_ISA] = {"SDPA_MAX_ISA", "portable, avx2, avx512, avx512bf16 or amx",
                          "caps the CPU features the kernels use (avx512: fp32 AVX-512 only; "
                          "avx512bf16 adds AVX512-BF16/FP16)"},
    [SDPA_ENV_CUDA_PLUGIN] = {"SDPA_CUDA_PLUGIN", "an absolute path",
                              "libsdpa_cuda.so to load (read when the first context loads it); "
                              "default: beside libsdpa.so, never the current directory"},
    [SDPA_ENV_CUDA_FLASH_VARIANT] = {"SDPA_CUDA_FLASH_VARIANT", "0 (default) or 1",
                                     "cuda.flash's kernel: plain loads, or the cp.async "
                                     "pipeline with ldmatrix"},
    [SDPA_ENV_FINITE_GUARD] = {"SDPA_FINITE_GUARD", "0 (default) or 1",
                               "1: a CPU call whose output holds NaN or Inf from finite inputs "
                               "runs again on the next candidate, that backend latched off "
                               "(sdpa_context_set_finite_guard)"},
    [SDPA_ENV_XDG_CONFIG_HOME] = {"XDG_CONFIG_HOME", "a path",
                                  "this user's wisdom is $XDG_CONFIG_HOME/libsdpa/wisdom.rules"},
    [SDPA_ENV_HOME] = {"HOME", "a path",
                       "without XDG_CONFIG_HOME, this user's wisdom is "
                       "~/.config/libsdpa/wisdom.rules"},
};

const char *sdpa_env_variable(int i, const char **values, const char **meaning)
{
    if (i < 0 || i >= SDPA_ENV_COUNT)
        return NULL;
    if (values)
        *values = vars[i].values;
    if (meaning)
        *meaning = vars[i].meaning;
    return vars[i].name;
}

size_t sdpa__env_read_one(sdpa_env_id id, char *buf, size_t n)
{
    const char *v = getenv(vars[id].name);
    sdpa__strlcpy(buf, v ? v : "", n);
    return v ? strlen(v) : 0;
}

void sdpa__env_read(sdpa_env *env)
{
    for (int i = 0; i < SDPA_ENV_COUNT; i++) {
        env->set[i] = getenv(vars[i].name) != NULL;
        env->length[i] = sdpa__env_read_one((sdpa_env_id)i, env->value[i], sizeof env->value[i]);
    }
}

const char *sdpa__env_value(const sdpa_env *env, sdpa_env_id id)
{
    return env->set[id] && env->value[id][0] ? env->value[id] : NULL;
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

sdpa_status sdpa__ctx_apply_env(sdpa_context *ctx, const sdpa_context_options *o)
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
        int ok;
        unsigned mask = sdpa__isa_level_mask(s, &ok);
        if (!ok) {
            st = sdpa__fail(SDPA_INVALID_ARGUMENT,
                            "SDPA_MAX_ISA='%s' unknown, expected portable, avx2, avx512, "
                            "avx512bf16 or amx",
                            s);
            goto done;
        }
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
