/*
 * test_faults.c - out of memory at every allocation of a call, SQLite's
 * way: the n-th allocation is made to fail, for n = 1, 2, ... until a run
 * makes fewer than n allocations (so every one was failed once). Each
 * failed run must return OUT_OF_MEMORY with a message, write nothing into
 * the outputs, and leak nothing (the AddressSanitizer build of this test
 * checks leaks at exit). Covered: context creation, loading rules, one
 * forward call on every present CPU backend (with a fresh context, so
 * that the worker pool is started inside the call), a layer's first
 * call, explain, a backward call on every backend with a backward
 * pass, cut by keys and by rows (their partial sums allocated), and the
 * block-map builder and slicer.
 */
#include "core/core.h"
#include "support/testlib.h"

#include <stdlib.h>
#include <string.h>

typedef sdpa_status (*operation)(void *arg);

/* Runs op with the n-th allocation failing, for every n; returns how many
 * allocations the successful run made. */
static int64_t every_allocation(const char *what, operation op, void *arg,
                                void (*check_untouched)(void *arg, const char *what, int64_t n))
{
    for (int64_t n = 1; n < 10000; n++) {
        sdpa__alloc_fail_at(n);
        sdpa_status st = op(arg);
        const int64_t made = sdpa__alloc_count();
        sdpa__alloc_fail_at(0);
        if (made < n) { /* nothing failed: the run must have succeeded */
            CHECK(st == SDPA_OK, "%s with no failure injected: %s: %s", what,
                  sdpa_status_string(st), sdpa_last_error());
            return made;
        }
        CHECK(st == SDPA_OUT_OF_MEMORY && sdpa_last_error()[0],
              "%s, allocation %lld failed: got %s (\"%s\"), expected out of memory with a "
              "message",
              what, (long long)n, sdpa_status_string(st), sdpa_last_error());
        if (check_untouched)
            check_untouched(arg, what, n);
    }
    CHECK(0, "%s: more than 10000 allocations", what);
    return 0;
}

/* ---- context creation and rules */

static sdpa_status create_context(void *arg)
{
    (void)arg;
    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    o.ignore_env = 1;
    o.threads = 2;
    sdpa_context *ctx = NULL;
    sdpa_status st = sdpa_context_create(&o, &ctx);
    CHECK((st == SDPA_OK) == (ctx != NULL), "context returned with status %s",
          sdpa_status_string(st));
    sdpa_context_destroy(ctx);
    return st;
}

static sdpa_status load_rules(void *arg)
{
    return sdpa_context_load_policy_text(arg,
                                         "rule mine\ndevice cpu\nD 64-128\ntry cpu.portable ref\n"
                                         "evidence a test\nrule other\ntry ref\nevidence x\n",
                                         "faults.rules");
}

/* ---- a forward call */

typedef struct forward_arg {
    const char *backend; /* NULL: the dispatcher's choice */
    int layer;           /* 1: through a fresh layer handle */
    tl_problem p;
    tl_output out;
    unsigned char *before; /* out's bytes before the call */
    float *lse_before;
} forward_arg;

/* One call with the n-th allocation inside it failing; the context (and
 * layer) are made before the failures are armed. *made: allocations the
 * call made. */
static sdpa_status forward(forward_arg *a, int64_t n, int64_t *made)
{
    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    o.ignore_env = 1;
    o.threads = 2; /* the pool starts inside the call */
    sdpa_context *ctx;
    sdpa_layer *layer = NULL;
    sdpa_layer_desc ld = SDPA_LAYER_DESC_DEFAULT;
    ld.name = "faults.attn";
    if (sdpa_context_create(&o, &ctx) != SDPA_OK ||
        (a->layer && sdpa_layer_create(ctx, &ld, &layer) != SDPA_OK))
        return SDPA_INTERNAL;
    sdpa_params prm = SDPA_PARAMS_DEFAULT;
    prm.backend = a->backend;
    prm.causal = a->p.c.causal;
    sdpa__alloc_fail_at(n);
    sdpa_status st = layer ? sdpa_layer_forward(layer, &a->p.q, &a->p.k, &a->p.v, &a->out.t,
                                                a->out.lse, &prm)
                           : sdpa_forward(ctx, &a->p.q, &a->p.k, &a->p.v, &a->out.t, a->out.lse,
                                          &prm);
    *made = sdpa__alloc_count();
    sdpa__alloc_fail_at(0);
    char msg[512]; /* destroy clears nothing, but keep the message safe anyway */
    snprintf(msg, sizeof msg, "%s", sdpa_last_error());
    sdpa_layer_destroy(layer);
    sdpa_context_destroy(ctx);
    if (st != SDPA_OK && !msg[0])
        return SDPA_INTERNAL; /* reported below as "no message" */
    return st;
}

/*
 * Runs call(arg, n, &made) with the n-th allocation inside it failing, for
 * every n: each failure must be OUT_OF_MEMORY with a message and leave the
 * outputs as they were (untouched(arg)); the run past the last allocation
 * must succeed.
 */
static void call_every_allocation(const char *what,
                                  sdpa_status (*call)(void *arg, int64_t n, int64_t *made),
                                  int (*untouched)(const void *arg), void *arg)
{
    for (int64_t n = 1; n < 10000; n++) {
        int64_t made = 0;
        sdpa_status st = call(arg, n, &made);
        if (made < n) {
            CHECK(st == SDPA_OK, "%s with no failure injected: %s", what,
                  sdpa_status_string(st));
            printf("%s: %lld allocations, each failed once\n", what, (long long)made);
            return;
        }
        CHECK(st == SDPA_OUT_OF_MEMORY,
              "%s, allocation %lld failed: got %s, expected out of memory with a message", what,
              (long long)n, sdpa_status_string(st));
        CHECK(untouched(arg), "%s, allocation %lld failed: an output was written", what,
              (long long)n);
    }
    CHECK(0, "%s: more than 10000 allocations", what);
}

static sdpa_status forward_call(void *arg, int64_t n, int64_t *made)
{
    return forward(arg, n, made);
}

static int forward_untouched(const void *arg)
{
    const forward_arg *a = arg;
    const size_t nl = (size_t)(a->p.c.B * a->p.c.Hq * a->p.c.Sq) * sizeof(float);
    return memcmp(a->out.mem, a->before, a->out.bytes) == 0 &&
           memcmp(a->out.lse, a->lse_before, nl) == 0;
}

/* ---- a backward call: dq, dk, dv untouched by every failure */

typedef struct backward_arg {
    const char *backend;
    tl_problem p, dp;      /* q, k, v; dout is dp.q */
    tl_output out, g[3];   /* the forward's out and LSE; dq, dk, dv */
    unsigned char *before[3];
    sdpa_mask *mask;       /* a block map, or NULL */
} backward_arg;

static sdpa_status backward_call(void *arg, int64_t n, int64_t *made)
{
    backward_arg *a = arg;
    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    o.ignore_env = 1;
    o.threads = 2;
    sdpa_context *ctx;
    if (sdpa_context_create(&o, &ctx) != SDPA_OK)
        return SDPA_INTERNAL;
    sdpa_params prm = SDPA_PARAMS_DEFAULT;
    prm.backend = a->backend;
    prm.causal = a->p.c.causal;
    prm.mask = a->mask;
    sdpa__alloc_fail_at(n);
    sdpa_status st = sdpa_backward(ctx, &a->p.q, &a->p.k, &a->p.v, &a->out.t, a->out.lse,
                                   &a->dp.q, NULL, &a->g[0].t, &a->g[1].t, &a->g[2].t, &prm);
    *made = sdpa__alloc_count();
    sdpa__alloc_fail_at(0);
    const int has_message = sdpa_last_error()[0] != '\0';
    sdpa_context_destroy(ctx);
    return st != SDPA_OK && !has_message ? SDPA_INTERNAL : st;
}

static int backward_untouched(const void *arg)
{
    const backward_arg *a = arg;
    for (int i = 0; i < 3; i++)
        if (memcmp(a->g[i].mem, a->before[i], a->g[i].bytes) != 0)
            return 0;
    return 1;
}

static sdpa_status build_3d(void *arg);

/* Backward calls cut by keys (partial dQ) and by rows (partial dK, dV),
 * and one under a block map (the map read by key blocks is allocated). */
/* dtype: the inputs' (a backend without f32, cpu.amx: bf16) */
static int backward_faults(const char *backend, sdpa_dtype dtype)
{
    static const int64_t shapes[3][3] = {{70, 200, 2}, {300, 40, 2}, {233, 233, 2}};
    for (int s = 0; s < 3; s++) {
        backward_arg a;
        memset(&a, 0, sizeof a);
        a.backend = backend;
        sdpa_block_map *map = NULL; /* 17 text tokens and a 4 x 6 x 9 grid */
        sdpa_mask mask = SDPA_MASK_DEFAULT;
        if (s == 2) {
            if (build_3d(&map) != SDPA_OK)
                return 0;
            mask.blocks = map;
            a.mask = &mask;
        }
        tl_case c = {1, shapes[s][0], shapes[s][1], 4, shapes[s][2], 64, dtype, SDPA_F32,
                     SDPA_CAUSAL_NONE, TL_BSHD, 1, TL_UNIFORM, 0, 0};
        if (!tl_problem_make(&a.p, &c) || !tl_problem_make(&a.dp, &c) ||
            !tl_output_make(&a.out, &a.p))
            return 0;
        tl_problem like = a.p;
        like.c.want_lse = 0;
        if (!tl_output_make(&a.g[0], &like))
            return 0;
        like.c.Sq = c.Skv, like.c.Hq = c.Hkv;
        if (!tl_output_make(&a.g[1], &like) || !tl_output_make(&a.g[2], &like))
            return 0;
        sdpa_context *ctx = tl_context(NULL);
        sdpa_params prm = SDPA_PARAMS_DEFAULT;
        prm.backend = "ref";
        prm.mask = a.mask;
        CHECK_STATUS(sdpa_forward(ctx, &a.p.q, &a.p.k, &a.p.v, &a.out.t, a.out.lse, &prm),
                     SDPA_OK);
        sdpa_context_destroy(ctx);
        for (int i = 0; i < 3; i++) {
            a.before[i] = malloc(a.g[i].bytes);
            memcpy(a.before[i], a.g[i].mem, a.g[i].bytes);
        }
        char what[128];
        snprintf(what, sizeof what, "sdpa_backward on %s, Sq %lld Skv %lld%s",
                 backend ? backend : "the dispatcher's choice", (long long)c.Sq,
                 (long long)c.Skv, map ? " under a block map" : "");
        call_every_allocation(what, backward_call, backward_untouched, &a);
        sdpa_block_map_free(map);
        for (int i = 0; i < 3; i++)
            free(a.before[i]), tl_output_free(&a.g[i]);
        tl_output_free(&a.out), tl_problem_free(&a.p), tl_problem_free(&a.dp);
    }
    return 1;
}

static sdpa_status explain(void *arg)
{
    sdpa_call_desc d = {.size = sizeof(sdpa_call_desc), .device = SDPA_DEVICE_CPU,
                        .dtype = SDPA_BF16, .B = 1, .Sq = 100, .Skv = 77, .Hq = 4, .Hkv = 2,
                        .D = 64, .want_lse = 1};
    char *text = NULL;
    sdpa_status st = sdpa_explain(arg, &d, 1, &text);
    CHECK((st == SDPA_OK) == (text != NULL), "explain text with status %s",
          sdpa_status_string(st));
    sdpa_free(text);
    return st;
}

/* ---- block maps: the 3-D builder, and slices of its map (off the
 * blocks, so that every partial block is worked out bit by bit) */

static sdpa_status build_3d(void *arg)
{
    static const int64_t win[3] = {3, 3, 5};
    const sdpa_neighborhood_3d nb = {{4, 6, 9}, {0, 0, 0}, win, 1, 17, 0};
    sdpa_block_map **m = arg;
    sdpa_status st = sdpa_block_map_3d(&nb, 64, m);
    CHECK((st == SDPA_OK) == (*m != NULL), "sdpa_block_map_3d: map with status %s",
          sdpa_status_string(st));
    return st;
}

static sdpa_status slice(void *arg)
{
    const sdpa_block_map *m = arg;
    const int64_t N = 17 + 4 * 6 * 9;
    sdpa_block_map *s = NULL;
    sdpa_status st = sdpa_block_map_slice(m, N, N, 30, 150, 5, N - 5, 0, 1, &s);
    CHECK((st == SDPA_OK) == (s != NULL), "sdpa_block_map_slice: map with status %s",
          sdpa_status_string(st));
    sdpa_block_map_free(s);
    return st;
}

static void block_maps(void)
{
    sdpa_block_map *m = NULL;
    int64_t n = every_allocation("sdpa_block_map_3d", build_3d, &m, NULL);
    printf("sdpa_block_map_3d: %lld allocations, each failed once\n", (long long)n);
    if (!m)
        return;
    n = every_allocation("sdpa_block_map_slice", slice, m, NULL);
    printf("sdpa_block_map_slice: %lld allocations, each failed once\n", (long long)n);
    sdpa_block_map_free(m);
}

int main(void)
{
    tl_seed_from_env();
    int64_t n = every_allocation("sdpa_context_create", create_context, NULL, NULL);
    printf("sdpa_context_create: %lld allocations, each failed once\n", (long long)n);
    sdpa_context *ctx = tl_context(NULL);
    n = every_allocation("sdpa_context_load_policy_text", load_rules, ctx, NULL);
    printf("sdpa_context_load_policy_text: %lld allocations, each failed once\n", (long long)n);
    n = every_allocation("sdpa_explain", explain, ctx, NULL);
    printf("sdpa_explain: %lld allocations, each failed once\n", (long long)n);
    block_maps();

    const char *names[SDPA_MAX_BACKENDS + 1];
    sdpa_dtype dtypes[SDPA_MAX_BACKENDS + 1];
    int nb = 0;
    dtypes[nb] = SDPA_BF16, names[nb++] = NULL; /* the dispatcher's choice */
    for (int i = 0; i < sdpa_backend_count(ctx); i++) {
        sdpa_backend_info b;
        if (sdpa_backend_get(ctx, i, &b) == SDPA_OK && b.present && b.device == SDPA_DEVICE_CPU) {
            dtypes[nb] = b.dtypes & (1u << SDPA_BF16) ? SDPA_BF16 : SDPA_F32;
            names[nb++] = b.name;
        }
    }
    for (int i = 0; i < nb; i++)
        for (int layer = 0; layer <= (names[i] == NULL); layer++) {
            forward_arg a;
            memset(&a, 0, sizeof a);
            a.backend = names[i], a.layer = layer;
            tl_case c = {1, 70, 45, 4, 2, 64, dtypes[i], SDPA_F32, SDPA_CAUSAL_TOP_LEFT,
                         TL_BSHD, 1, TL_UNIFORM, 0, 0};
            if (!tl_problem_make(&a.p, &c) || !tl_output_make(&a.out, &a.p))
                return 1;
            const size_t nl = (size_t)(c.B * c.Hq * c.Sq);
            a.before = malloc(a.out.bytes);
            a.lse_before = malloc(nl * sizeof(float));
            memcpy(a.before, a.out.mem, a.out.bytes);
            memcpy(a.lse_before, a.out.lse, nl * sizeof(float));
            char what[96];
            snprintf(what, sizeof what, "%s on %s", layer ? "sdpa_layer_forward" : "sdpa_forward",
                     names[i] ? names[i] : "the dispatcher's choice");
            call_every_allocation(what, forward_call, forward_untouched, &a);
            free(a.before), free(a.lse_before);
            tl_output_free(&a.out), tl_problem_free(&a.p);
        }
    if (!backward_faults(NULL, SDPA_F32))
        return 1;
    for (int i = 0; i < sdpa_backend_count(ctx); i++) {
        sdpa_backend_info b;
        if (sdpa_backend_get(ctx, i, &b) == SDPA_OK && b.present && b.backward &&
            b.device == SDPA_DEVICE_CPU &&
            !backward_faults(b.name, b.dtypes & (1u << SDPA_F32) ? SDPA_F32 : SDPA_BF16))
            return 1;
    }
    sdpa_context_destroy(ctx);
    return tl_finish();
}
