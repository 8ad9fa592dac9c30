/*
 * call_overhead.c - what a whole small call costs on each CPU backend, the
 * kernel included: the fixed cost (a one-token call: validation, decision,
 * allocation, waking the pool, packing, storing) and the 26-token
 * grouped-query call of MiniMax-H3 (16 query heads, 2 KV heads, D = 128),
 * where such costs dominate. Public API only, through a layer (cached
 * decision), on a context of all cores. Medians of 9 rounds; in each round
 * every backend makes its calls back to back, in a rotating order.
 *
 * usage: bench_calls [ROUNDS]
 */
#define _POSIX_C_SOURCE 200809L
#include "sdpa.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct shape {
    const char *name;
    int64_t B, Sq, Skv, Hq, Hkv, D;
    int calls; /* per round */
} shape;

int main(int argc, char **argv)
{
    const int rounds = argc > 1 ? atoi(argv[1]) : 9;
    if (rounds < 1 || rounds > 99) {
        fprintf(stderr, "usage: bench_calls [ROUNDS 1..99]\n");
        return 2;
    }
    sdpa_context *ctx;
    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    o.ignore_env = 1;
    if (sdpa_context_create(&o, &ctx) != SDPA_OK) {
        fprintf(stderr, "context: %s\n", sdpa_last_error());
        return 1;
    }
    const char *names[SDPA_MAX_BACKENDS];
    int nb = 0;
    for (int i = 0; i < sdpa_backend_count(ctx); i++) {
        sdpa_backend_info b;
        if (sdpa_backend_get(ctx, i, &b) == SDPA_OK && b.present && b.device == SDPA_DEVICE_CPU &&
            (b.dtypes & (1u << SDPA_F32)) && strcmp(b.name, "ref") != 0)
            names[nb++] = b.name;
    }
    const shape shapes[] = {{"one token", 1, 1, 1, 1, 1, 32, 4000},
                            {"minimaxh3-gqa", 1, 26, 26, 16, 2, 128, 400}};
    printf("# bench_calls %s, %d threads, f32, medians of %d rounds (per call, through a "
           "layer)\n",
           sdpa_version(), sdpa_context_threads(ctx), rounds);
    printf("%-16s %-14s %12s %10s\n", "shape", "backend", "us/call", "GFLOP/s");
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const shape *sh = &shapes[s];
        const size_t nq = (size_t)(sh->B * sh->Sq * sh->Hq * sh->D);
        const size_t nk = (size_t)(sh->B * sh->Skv * sh->Hkv * sh->D);
        float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *out = malloc(nq * 4);
        if (!q || !k || !v || !out)
            return 1;
        for (size_t i = 0; i < nq; i++)
            q[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
        for (size_t i = 0; i < nk; i++)
            k[i] = v[i] = (float)((i * 104729) % 1000) / 1000.0f - 0.5f;
        sdpa_tensor tq = sdpa_tensor_bshd(q, SDPA_F32, sh->B, sh->Sq, sh->Hq, sh->D);
        sdpa_tensor tk = sdpa_tensor_bshd(k, SDPA_F32, sh->B, sh->Skv, sh->Hkv, sh->D);
        sdpa_tensor tv = sdpa_tensor_bshd(v, SDPA_F32, sh->B, sh->Skv, sh->Hkv, sh->D);
        sdpa_tensor to = sdpa_tensor_bshd(out, SDPA_F32, sh->B, sh->Sq, sh->Hq, sh->D);
        sdpa_layer *layers[SDPA_MAX_BACKENDS];
        double *t = calloc((size_t)(nb * rounds), sizeof *t);
        for (int b = 0; b < nb; b++) {
            sdpa_layer_desc ld = SDPA_LAYER_DESC_DEFAULT;
            ld.name = "bench", ld.backend = names[b];
            if (sdpa_layer_create(ctx, &ld, &layers[b]) != SDPA_OK ||
                sdpa_layer_forward(layers[b], &tq, &tk, &tv, &to, NULL, NULL) != SDPA_OK) {
                fprintf(stderr, "%s: %s\n", names[b], sdpa_last_error());
                return 1;
            }
        }
        for (int r = 0; r < rounds; r++)
            for (int j = 0; j < nb; j++) {
                const int b = (j + r) % nb;
                const double t0 = now_us();
                for (int c = 0; c < sh->calls; c++)
                    sdpa_layer_forward(layers[b], &tq, &tk, &tv, &to, NULL, NULL);
                t[b * rounds + r] = (now_us() - t0) / sh->calls;
            }
        const double flops = 4.0 * (double)(sh->B * sh->Hq * sh->Sq * sh->Skv * sh->D);
        for (int b = 0; b < nb; b++) {
            qsort(t + b * rounds, (size_t)rounds, sizeof *t, cmp);
            const double med = t[b * rounds + rounds / 2];
            printf("%-16s %-14s %12.2f %10.2f\n", sh->name, names[b], med, flops / (med * 1e3));
            sdpa_layer_destroy(layers[b]);
        }
        free(t), free(q), free(k), free(v), free(out);
    }
    sdpa_context_destroy(ctx);
    return 0;
}
