/*
 * test_soak.c - every concurrent use at once, for a bounded time
 * (SDPA_SOAK_SECONDS, default 3): callers share one context and one of its
 * layers (one-shot calls, layer calls, calls of a component, calls inside
 * their own scoped overrides) while a mutator sets and clears the
 * component's backend and loads rule files into that context, and a third
 * thread creates and destroys layers and whole contexts (private and
 * shared pools, each loading the wisdom file SDPA_WISDOM names) and calls
 * through them. Every result is checked against the answer ref computed
 * before the threads started. Prints the counts; any wrong result, failed
 * call or clobbered guard fails the test. CI also runs it under
 * ThreadSanitizer.
 */
#define _POSIX_C_SOURCE 200809L
#include "support/testlib.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { B = 1, S = 45, H = 2, D = 24, N = B * S * H * D, MAX_NAMES = 16 };

static float q[N], k[N], v[N], want[N];
static const char *names[MAX_NAMES]; /* present CPU backends that take f32 */
static int n_names;
static sdpa_context *shared;
static sdpa_layer *shared_layer;
static double deadline;
static double tol;
static char wisdom_path[256];

static _Atomic long calls, wrong, failed, mutations, lifecycles;
static char first_problem[512];
static pthread_mutex_t problem_lock = PTHREAD_MUTEX_INITIALIZER;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void note_problem(_Atomic long *counter, const char *what, sdpa_status st)
{
    atomic_fetch_add(counter, 1);
    pthread_mutex_lock(&problem_lock);
    if (!first_problem[0])
        snprintf(first_problem, sizeof first_problem, "%s: %s (%s, %s)", what,
                 sdpa_status_string(st), sdpa_last_error(), sdpa_last_backend());
    pthread_mutex_unlock(&problem_lock);
}

/* One call through `how`, its output checked against ref's; guard bytes
 * after the output must stay. */
static void call_and_check(sdpa_context *ctx, sdpa_layer *layer, const char *component,
                           const char *what)
{
    float *out = tl_alloc_guarded(sizeof(float) * N);
    if (!out) {
        note_problem(&failed, "allocating an output", SDPA_OUT_OF_MEMORY);
        return;
    }
    sdpa_tensor tq = sdpa_tensor_bshd(q, SDPA_F32, B, S, H, D);
    sdpa_tensor tk = sdpa_tensor_bshd(k, SDPA_F32, B, S, H, D);
    sdpa_tensor tv = sdpa_tensor_bshd(v, SDPA_F32, B, S, H, D);
    sdpa_tensor to = sdpa_tensor_bshd(out, SDPA_F32, B, S, H, D);
    sdpa_params p = SDPA_PARAMS_DEFAULT;
    p.component = component;
    sdpa_status st = layer ? sdpa_layer_forward(layer, &tq, &tk, &tv, &to, NULL, &p)
                           : sdpa_forward(ctx, &tq, &tk, &tv, &to, NULL, &p);
    atomic_fetch_add(&calls, 1);
    if (st != SDPA_OK) {
        note_problem(&failed, what, st);
    } else {
        double diff = 0;
        for (int i = 0; i < N; i++)
            diff = fmax(diff, fabs((double)out[i] - want[i]));
        if (!(diff <= tol) || !tl_guard_intact(out, sizeof(float) * N)) {
            char msg[128];
            snprintf(msg, sizeof msg, "%s: off by %g (or guard bytes clobbered)", what, diff);
            note_problem(&wrong, msg, st);
        }
    }
    tl_free_guarded(out);
}

static void *caller(void *arg)
{
    unsigned r = (unsigned)(uintptr_t)arg * 2654435761u + 1;
    while (now_s() < deadline) {
        r = r * 1103515245u + 12345u;
        switch (r >> 16 & 3) {
        case 0: call_and_check(shared, NULL, NULL, "one-shot call"); break;
        case 1: call_and_check(shared, shared_layer, NULL, "shared layer call"); break;
        case 2: call_and_check(shared, NULL, "text", "component call"); break;
        default: { /* a scoped override, nested once, on this thread */
            const char *a = names[(r >> 8) % (unsigned)n_names];
            const char *b = names[(r >> 20) % (unsigned)n_names];
            if (sdpa_override_push(a) != SDPA_OK) {
                note_problem(&failed, "override push", SDPA_INVALID_ARGUMENT);
                break;
            }
            call_and_check(shared, shared_layer, NULL, "layer call in an override");
            if (sdpa_override_push(b) == SDPA_OK) {
                call_and_check(shared, NULL, NULL, "one-shot call in a nested override");
                sdpa_override_pop();
            }
            call_and_check(shared, NULL, "text", "component call in an override");
            sdpa_override_pop();
        }
        }
    }
    return NULL;
}

/* Component backends set and cleared, rule files loaded (up to the
 * context's limit of eight; the ninth is refused, and must say so). */
static void *mutator(void *arg)
{
    (void)arg;
    unsigned i = 0, loaded = 0;
    while (now_s() < deadline) {
        const char *b = (i % 3 == 2) ? NULL : names[i % (unsigned)n_names];
        if (sdpa_context_set_component_backend(shared, "text", b) != SDPA_OK)
            note_problem(&failed, "set_component_backend", SDPA_INVALID_ARGUMENT);
        if (i % 16 == 0) {
            char rules[256];
            snprintf(rules, sizeof rules, "rule soak-%u\ndevice cpu\ntry %s\n"
                                          "evidence soak test\n",
                     i, names[(i / 16) % (unsigned)n_names]);
            sdpa_status st = sdpa_context_load_policy_text(shared, rules, "soak.rules");
            if (loaded < 8 ? st != SDPA_OK : st != SDPA_INVALID_ARGUMENT)
                note_problem(&failed, "load_policy_text", st);
            loaded += st == SDPA_OK;
        }
        atomic_fetch_add(&mutations, 1);
        i++;
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* Layers of the shared context and whole contexts, made and destroyed. */
static void *lifecycle(void *arg)
{
    (void)arg;
    for (unsigned i = 0; now_s() < deadline; i++) {
        sdpa_layer_desc ld = SDPA_LAYER_DESC_DEFAULT;
        ld.name = "soak";
        ld.component = i % 2 ? "text" : NULL;
        sdpa_layer *layer;
        if (sdpa_layer_create(shared, &ld, &layer) != SDPA_OK) {
            note_problem(&failed, "layer_create", SDPA_INVALID_ARGUMENT);
            continue;
        }
        call_and_check(shared, layer, NULL, "fresh layer call");
        sdpa_layer_destroy(layer);
        sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
        o.threads = 1 + i % 2;
        o.share_pool = i % 4 < 2;
        sdpa_context *ctx;
        sdpa_status st = sdpa_context_create(&o, &ctx); /* reads SDPA_WISDOM: wisdom reloaded */
        if (st != SDPA_OK) {
            note_problem(&failed, "context_create", st);
            continue;
        }
        if (!strstr(sdpa_context_wisdom(ctx), "in force"))
            note_problem(&failed, "the soak's wisdom file not in force", SDPA_OK);
        call_and_check(ctx, NULL, NULL, "call on a fresh context");
        sdpa_context_destroy(ctx);
        atomic_fetch_add(&lifecycles, 1);
    }
    return NULL;
}

int main(void)
{
    tl_seed_from_env();
    const char *secs = getenv("SDPA_SOAK_SECONDS");
    const double seconds = secs && atof(secs) > 0 ? atof(secs) : 3.0;
    for (int i = 0; i < N; i++)
        q[i] = (float)tl_uniform(), k[i] = (float)tl_uniform(), v[i] = (float)tl_uniform();
    /* The wisdom every fresh context loads (set before any thread starts:
     * the environment is not changed while they run). */
    snprintf(wisdom_path, sizeof wisdom_path, "/tmp/sdpa-soak-%ld.rules", (long)getpid());
    FILE *f = fopen(wisdom_path, "w");
    if (!f || fputs("rule soak-wisdom\ndevice cpu\ntry cpu.portable ref\nevidence soak\n", f) < 0 ||
        fclose(f) != 0) {
        printf("cannot write %s\n", wisdom_path);
        return 1;
    }
    setenv("SDPA_WISDOM", wisdom_path, 1);

    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    o.threads = 2;
    o.ignore_env = 1;
    CHECK_STATUS(sdpa_context_create(&o, &shared), SDPA_OK);
    if (!shared)
        return tl_finish();
    for (int i = 0; i < sdpa_backend_count(shared) && n_names < MAX_NAMES; i++) {
        sdpa_backend_info b;
        sdpa_backend_get(shared, i, &b);
        if (b.present && b.device == SDPA_DEVICE_CPU && (b.dtypes & (1u << SDPA_F32)))
            names[n_names++] = b.name;
    }
    CHECK(n_names >= 2, "only %d present CPU backends take f32", n_names);
    /* The answer: ref, before anything runs concurrently. */
    {
        sdpa_tensor tq = sdpa_tensor_bshd(q, SDPA_F32, B, S, H, D);
        sdpa_tensor tk = sdpa_tensor_bshd(k, SDPA_F32, B, S, H, D);
        sdpa_tensor tv = sdpa_tensor_bshd(v, SDPA_F32, B, S, H, D);
        sdpa_tensor tw = sdpa_tensor_bshd(want, SDPA_F32, B, S, H, D);
        sdpa_params p = SDPA_PARAMS_DEFAULT;
        p.backend = "ref";
        CHECK_STATUS(sdpa_forward(shared, &tq, &tk, &tv, &tw, NULL, &p), SDPA_OK);
    }
    double scale = 0;
    for (int i = 0; i < N; i++)
        scale = fmax(scale, fabs(want[i]));
    tol = tl_tolerance(SDPA_F32, SDPA_F32) * fmax(scale, 1.0);
    sdpa_layer_desc ld = SDPA_LAYER_DESC_DEFAULT;
    ld.name = "soak-shared";
    CHECK_STATUS(sdpa_layer_create(shared, &ld, &shared_layer), SDPA_OK);

    deadline = now_s() + seconds;
    pthread_t t[5];
    pthread_create(&t[0], NULL, caller, (void *)1);
    pthread_create(&t[1], NULL, caller, (void *)2);
    pthread_create(&t[2], NULL, caller, (void *)3);
    pthread_create(&t[3], NULL, mutator, NULL);
    pthread_create(&t[4], NULL, lifecycle, NULL);
    for (int i = 0; i < 5; i++)
        pthread_join(t[i], NULL);

    printf("soak: %.1f s, %ld calls checked against ref (%d backends: overrides, components, "
           "rules, layers), %ld mutations, %ld contexts made and destroyed; %ld wrong, %ld "
           "failed\n",
           seconds, (long)calls, n_names, (long)mutations, (long)lifecycles, (long)wrong,
           (long)failed);
    CHECK(calls > 0 && lifecycles > 0 && mutations > 0, "the soak did nothing");
    CHECK(wrong == 0 && failed == 0, "%ld wrong, %ld failed; first: %s", (long)wrong,
          (long)failed, first_problem);
    sdpa_layer_destroy(shared_layer);
    sdpa_context_destroy(shared);
    remove(wisdom_path);
    return tl_finish();
}
