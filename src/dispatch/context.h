/*
 * context.h - the context, layers and the decision procedure, as the
 * dispatcher's files share them.
 */
#ifndef SDPA_CONTEXT_H
#define SDPA_CONTEXT_H

#include "../core/backend.h"
#include "decision_cache.h"
#include "policy.h"
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

/* guard.c: whether a finished call's output (or LSE: NaN, +inf) holds a
 * non-finite value; whether q, k and v are all finite. CPU tensors. */
int sdpa__guard_output_bad(const sdpa_call *c);
int sdpa__guard_inputs_finite(const sdpa_call *c);
/* "guard     on, N events" for info and explain (info.c). */
struct sdpa_strbuf;
void sdpa__guard_text(struct sdpa_strbuf *sb, const sdpa_context *ctx, int width);

/* A choice fixed before any rule is consulted (levels 1-4 of the precedence). */
typedef struct sdpa_choice {
    sdpa_source source;
    int backend; /* index into ctx->backends */
    char detail[128];
} sdpa_choice;

/* Index of a backend by name, or -1. */
int sdpa__ctx_find(const sdpa_context *ctx, const char *name);

/*
 * The choice that overrides the rules for a call, if any, in precedence
 * order: desc->backend, then `fixed` (a layer's captured choice), then the
 * scoped override, the component override and SDPA_BACKEND.
 * Returns 1 and fills *out, 0 when the rules decide, or -1 with
 * INVALID_ARGUMENT recorded when a name is unknown.
 */
int sdpa__resolve_choice(const sdpa_context *ctx, const sdpa_call_desc *desc,
                         const sdpa_choice *fixed, sdpa_choice *out);

/*
 * The full decision. cand[] receives backend indices in order. Returns
 * INVALID_ARGUMENT for a bad description or unknown backend name; otherwise
 * OK with out->status saying whether anything can run.
 */
sdpa_status sdpa__decide(sdpa_context *ctx, const sdpa_call_desc *desc, const sdpa_choice *fixed,
                         sdpa_decision *out, int *cand);

/* The context's pool, started on first use. */
sdpa_status sdpa__ctx_pool(sdpa_context *ctx, sdpa_pool **out);


/* Parses rule text and puts it in front of the context's rules
 * (rule_files.c); a tuned file made elsewhere is refused. */
sdpa_status sdpa__ctx_install_policy(sdpa_context *ctx, const char *text, const char *origin);

struct sdpa_env;
/* Loads this machine's wisdom as the snapshot says (rule_files.c). */
void sdpa__ctx_load_wisdom(sdpa_context *ctx, const struct sdpa_env *env);

/* Applies the environment at creation (environment.c): log level, ISA cap,
 * foreign-file policy, SDPA_BACKEND, the CUDA flash variant, the wisdom
 * and SDPA_POLICY (or o->policy_file), each validated. */
sdpa_status sdpa__ctx_apply_env(sdpa_context *ctx, const sdpa_context_options *o);

/* Describes the call's shape class for log lines. */
void sdpa__desc_string(const sdpa_call_desc *d, char *buf, size_t n);

#endif
