/*
 * contexts.c - what two contexts in one process cost when both are busy:
 * two application threads, each with its own context (all cores wide),
 * each running N forward calls at once. Compared, side by side and
 * interleaved in one run:
 *
 *   private  the default: each context has its own workers, two pools on
 *            the same cores
 *   shared   share_pool = 1: both use the process-wide pool of their
 *            width, so their parallel regions take turns
 *   serial   one thread, one context, 2N calls: the work without contention
 *   alternate  one thread, 2N calls alternating between two contexts with
 *            private pools (what `sdpa ab` would do with one context per arm)
 *
 * Reported: median wall time of each arrangement over R rounds, and its
 * ratio to serial. Nothing is asserted; this is the evidence behind the
 * default (measured on 2 vCPUs, 2026-11-29, S = 128 / 384 / 1024 over five
 * runs: private 0.58-0.83x / 0.96-1.15x / 0.96-1.10x of serial, shared
 * 1.00-1.09x / 1.03-1.07x / 1.01-1.03x, alternate 1.01-1.04x. Private
 * pools let two small calls overlap their fixed costs; nothing is slower by
 * more than 15%; bench/results/2026-11-29-contexts.txt is one run).
 *
 * usage: bench_contexts [N calls per thread, default 20] [R rounds, default 7]
 *                       [S tokens, default 1024]
 */
#define _POSIX_C_SOURCE 200809L
#include "sdpa.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define B 1
#define H 8
#define D 64
static int S = 1024; /* tokens, argv[3] */

typedef struct worker {
    sdpa_context *ctx;
    int calls;
    float *q, *k, *v, *o;
    sdpa_status st;
} worker;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static void *run_calls(void *arg)
{
    worker *w = arg;
    sdpa_tensor q = sdpa_tensor_bshd(w->q, SDPA_F32, B, S, H, D);
    sdpa_tensor k = sdpa_tensor_bshd(w->k, SDPA_F32, B, S, H, D);
    sdpa_tensor v = sdpa_tensor_bshd(w->v, SDPA_F32, B, S, H, D);
    sdpa_tensor o = sdpa_tensor_bshd(w->o, SDPA_F32, B, S, H, D);
    sdpa_params p = SDPA_PARAMS_DEFAULT;
    w->st = SDPA_OK;
    for (int i = 0; i < w->calls && w->st == SDPA_OK; i++)
        w->st = sdpa_forward(w->ctx, &q, &k, &v, &o, NULL, &p);
    return NULL;
}

static float *random_floats(size_t n, unsigned *seed)
{
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; x && i < n; i++)
        x[i] = (float)rand_r(seed) / (float)RAND_MAX * 2.0f - 1.0f;
    return x;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One thread, 2N calls alternating between c0 and c1. */
static double alternating(sdpa_context *c0, sdpa_context *c1, worker *w, int calls)
{
    double t0 = now_ms();
    for (int i = 0; i < 2 * calls; i++) {
        w[0].ctx = i % 2 ? c1 : c0;
        w[0].calls = 1;
        run_calls(&w[0]);
        if (w[0].st != SDPA_OK) {
            fprintf(stderr, "bench_contexts: %s\n", sdpa_last_error());
            exit(1);
        }
    }
    return now_ms() - t0;
}

/* Wall time of two threads on ctx[0], ctx[1] (or one thread, 2N calls). */
static double arrangement(sdpa_context *c0, sdpa_context *c1, worker *w, int calls)
{
    pthread_t t;
    w[0].ctx = c0, w[1].ctx = c1;
    w[0].calls = w[1].calls = calls;
    if (!c1)
        w[0].calls = 2 * calls;
    double t0 = now_ms();
    if (c1)
        pthread_create(&t, NULL, run_calls, &w[1]);
    run_calls(&w[0]);
    if (c1)
        pthread_join(t, NULL);
    double ms = now_ms() - t0;
    if (w[0].st != SDPA_OK || (c1 && w[1].st != SDPA_OK)) {
        fprintf(stderr, "bench_contexts: %s\n", sdpa_last_error());
        exit(1);
    }
    return ms;
}

int main(int argc, char **argv)
{
    const int calls = argc > 1 ? atoi(argv[1]) : 20, rounds = argc > 2 ? atoi(argv[2]) : 7;
    S = argc > 3 ? atoi(argv[3]) : 1024;
    if (calls < 1 || rounds < 1 || rounds > 99 || S < 1 || S > 65536) {
        fprintf(stderr, "usage: bench_contexts [calls >= 1] [rounds 1..99] [S 1..65536]\n");
        return 2;
    }
    sdpa_context_options shared = SDPA_CONTEXT_OPTIONS_DEFAULT, own = SDPA_CONTEXT_OPTIONS_DEFAULT;
    shared.share_pool = 1;
    sdpa_context *s0, *s1, *p0, *p1;
    if (sdpa_context_create(&shared, &s0) || sdpa_context_create(&shared, &s1) ||
        sdpa_context_create(&own, &p0) || sdpa_context_create(&own, &p1)) {
        fprintf(stderr, "bench_contexts: %s\n", sdpa_last_error());
        return 1;
    }
    unsigned seed = 7;
    const size_t n = (size_t)B * S * H * D;
    worker w[2];
    for (int i = 0; i < 2; i++) {
        w[i].q = random_floats(n, &seed), w[i].k = random_floats(n, &seed);
        w[i].v = random_floats(n, &seed), w[i].o = malloc(n * sizeof(float));
        if (!w[i].q || !w[i].k || !w[i].v || !w[i].o)
            return 1;
    }
    arrangement(s0, s1, w, 1); /* start every pool before timing */
    arrangement(p0, p1, w, 1);
    double ts[99], tp[99], t1[99], ta[99];
    for (int r = 0; r < rounds; r++) { /* interleaved, so drift hits all four */
        ts[r] = arrangement(s0, s1, w, calls);
        tp[r] = arrangement(p0, p1, w, calls);
        t1[r] = arrangement(s0, NULL, w, calls);
        ta[r] = alternating(p0, p1, w, calls);
    }
    qsort(ts, (size_t)rounds, sizeof *ts, cmp);
    qsort(tp, (size_t)rounds, sizeof *tp, cmp);
    qsort(t1, (size_t)rounds, sizeof *t1, cmp);
    qsort(ta, (size_t)rounds, sizeof *ta, cmp);
    const double ms = ts[rounds / 2], mp = tp[rounds / 2], m1 = t1[rounds / 2];
    const double ma = ta[rounds / 2];
    printf("# bench_contexts: 2 threads x %d calls of f32 %d,%d,%d,%d,%d,%d on %d-thread contexts "
           "(%s), medians of %d interleaved rounds\n",
           calls, B, S, S, H, H, D, sdpa_context_threads(s0), sdpa_context_platform(s0)->cpu_model,
           rounds);
    printf("%-9s %10s %10s\n", "pools", "median_ms", "x serial");
    printf("%-9s %10.1f %10.2f\n", "serial", m1, 1.0);
    printf("%-9s %10.1f %10.2f\n", "shared", ms, ms / m1);
    printf("%-9s %10.1f %10.2f\n", "private", mp, mp / m1);
    printf("%-9s %10.1f %10.2f\n", "alternate", ma, ma / m1);
    sdpa_context_destroy(s0), sdpa_context_destroy(s1);
    sdpa_context_destroy(p0), sdpa_context_destroy(p1);
    for (int i = 0; i < 2; i++)
        free(w[i].q), free(w[i].k), free(w[i].v), free(w[i].o);
    return 0;
}
