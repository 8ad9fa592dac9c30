/*
 * context.h - the context (struct sdpa_context) and the lookups in it that
 * lookup.c implements. What the other dispatcher files offer is declared
 * in headers named for them: decide.h, guard.h, rule_files.h, policy.h,
 * environment.h, decision_cache.h, cuda_loader.h, registry.h.
 */
#ifndef SDPA_CONTEXT_H
#define SDPA_CONTEXT_H

#include "../core/backend.h"
#include "decision_cache.h"
#include "policy.h"
#include "registry.h"
#include "seam.h"

#include <pthread.h>
#include <stdatomic.h>

#define SDPA_MAX_COMPONENTS 32
#define SDPA_MAX_POLICIES 8
#define SDPA_OVERRIDE_DEPTH 16

struct sdpa_context {
    sdpa_platform platform; /* what decisions are made for (may be simulated) */
    sdpa_platform host;     /* this machine: decides which backends are present */
    sdpa_logger log;
    int threads;

    pthread_mutex_t pool_lock; /* the pool starts on the first run, under this lock */
    sdpa_pool *_Atomic pool;
    int share_pool;            /* 1: the process-wide pool of its width; 0: its own */
    sdpa_parallel_for_fn host_for; /* the caller's parallel-for, or NULL (options) */
    void *host_user;

    int n_backends;
    const sdpa_backend *backends[SDPA_MAX_BACKENDS];
    int present[SDPA_MAX_BACKENDS];
    char why_absent[SDPA_MAX_BACKENDS][160];

    /* Mutable after creation: guarded by `lock`. */
    pthread_rwlock_t lock;
    int n_policies; /* policies[0] is the newest user file; the built-in set is last */
    sdpa_policy *policies[SDPA_MAX_POLICIES + 1];
    char policy_origin[SDPA_MAX_POLICIES + 1][160];
    int n_components;
    struct {
        char component[48];
        int backend;
    } components[SDPA_MAX_COMPONENTS];
    /* Bumped whenever rules or overrides change: layers' caches go stale. */
    _Atomic unsigned generation;

    int env_backend; /* SDPA_BACKEND's backend index, or -1 */
    /* The wisdom files looked for at creation, a line each: "in force
     * PATH", "ignored PATH: why"; or why none (sdpa_context_wisdom). */
    char wisdom[1024];
    int wisdom_rules, wisdom_classes; /* in the file in force: rules, and those over a class */
    int foreign_policy; /* 1: load rule files made elsewhere, with a warning */
    int cuda_flash_variant; /* SDPA_CUDA_FLASH_VARIANT: 0 or 1 */
    sdpa_decision_cache oneshot; /* sdpa_forward's decisions per shape class */
    /* The finite-output guard (guard.c): on or off, the backends it latched
     * off for one-shot calls (a bit per backend), the events counted. */
    _Atomic int finite_guard;
    _Atomic uint64_t guard_latched;
    _Atomic int64_t guard_events;
};

/* Index of a backend by name, or -1. */
int sdpa__ctx_find(const sdpa_context *ctx, const char *name);

/* The context's pool, started on first use. */
sdpa_status sdpa__ctx_pool(sdpa_context *ctx, sdpa_pool **out);

#endif
