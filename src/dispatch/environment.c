/*
 * environment.c - the environment variables libsdpa reads (environment.h):
 * what each means, and a snapshot of their values. A context applies them
 * at its creation (context.c).
 */
#include "environment.h"
#include "../core/core.h"
#include "../core/cpu_features.h"

#include <pthread.h>
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
    [SDPA_ENV_MAX_ISA] = {"SDPA_MAX_ISA", NULL, /* the level table's names: max_isa_values */
                          "caps the CPU features the kernels use to those of an ISA level "
                          "(src/core/cpu_features.c lists each level's features)"},
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

/* SDPA_MAX_ISA's values, written once from the ISA level table. */
static char max_isa_text[160];
static void max_isa_fill(void) { sdpa__isa_levels_expected(max_isa_text, sizeof max_isa_text); }
static const char *max_isa_values(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, max_isa_fill);
    return max_isa_text;
}

const char *sdpa_env_variable(int i, const char **values, const char **meaning)
{
    if (i < 0 || i >= SDPA_ENV_COUNT)
        return NULL;
    if (values)
        *values = i == SDPA_ENV_MAX_ISA ? max_isa_values() : vars[i].values;
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
