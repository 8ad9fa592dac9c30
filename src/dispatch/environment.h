/*
 * environment.h - every environment variable libsdpa reads, in one table
 * (the README's table and `sdpa help` print it), read in one place: a
 * snapshot taken when a context is created. Nothing reads the environment
 * per call.
 */
#ifndef SDPA_ENVIRONMENT_H
#define SDPA_ENVIRONMENT_H

#include "sdpa.h"

#include <stddef.h>

typedef enum sdpa_env_id {
    SDPA_ENV_BACKEND,
    SDPA_ENV_POLICY,
    SDPA_ENV_WISDOM,
    SDPA_ENV_POLICY_FOREIGN,
    SDPA_ENV_LOG,
    SDPA_ENV_MAX_ISA,
    SDPA_ENV_CUDA_PLUGIN,
    SDPA_ENV_CUDA_FLASH_VARIANT,
    SDPA_ENV_FINITE_GUARD,
    SDPA_ENV_XDG_CONFIG_HOME, /* where this user's wisdom lives */
    SDPA_ENV_HOME,
    SDPA_ENV_COUNT
} sdpa_env_id;

/* The values at one moment. A value longer than the room is cut, and its
 * length says so: readers refuse it rather than use the cut value. */
typedef struct sdpa_env {
    char value[SDPA_ENV_COUNT][1024];
    size_t length[SDPA_ENV_COUNT];
    unsigned char set[SDPA_ENV_COUNT];
} sdpa_env;

/* Takes the snapshot: the one place libsdpa calls getenv. */
void sdpa__env_read(sdpa_env *env);

/* One variable now, into buf (cut to n - 1 bytes; "" when unset), for
 * what is read outside a context: the CUDA plugin's path, once per
 * process, and sdpa_wisdom_path. Returns the value's full length. */
size_t sdpa__env_read_one(sdpa_env_id id, char *buf, size_t n);

/* The variable's value, NULL when unset or empty. */
const char *sdpa__env_value(const sdpa_env *env, sdpa_env_id id);

#endif
