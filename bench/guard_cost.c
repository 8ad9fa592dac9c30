/*
 * guard_cost.c - what the finite-output guard costs a call: the same
 * calls on one context, guard off and on (sdpa_context_set_finite_guard),
 * interleaved, medians of R rounds; with the guard on every call also
 * scans its output (B x Sq x Hq x D elements) once. Reported per shape:
 * both medians, the ratio on/off, and the fp32 ceiling measured now.
 * Nothing is asserted.
 *
 * usage: bench_guard [R rounds, default 15]
 */
#define _POSIX_C_SOURCE 200809L
#include "sdpa.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const int rounds = argc > 1 ? atoi(argv[1]) : 15;
    if (rounds < 1 || rounds > 1000) {
        fprintf(stderr, "usage: bench_guard [rounds 1..1000]\n");
        return 2;
    }
    static const struct {
        const char *name;
        int64_t B, Sq, Skv, H, D;
        sdpa_dtype dtype;
    } shapes[] = {
        {"one token, 8 heads", 1, 1, 1, 8, 64, SDPA_F32},
        {"decode, 77 keys, 24 heads", 2, 1, 77, 24, 128, SDPA_F32},
        {"text 77 tokens, 8 heads", 1, 77, 77, 8, 64, SDPA_F32},
        {"1024 tokens, 8 heads", 1, 1024, 1024, 8, 64, SDPA_F32},
        {"4096 tokens, 2 heads, D 128", 1, 4096, 4096, 2, 128, SDPA_F32},
        {"4096 tokens, 2 heads, D 128, bf16", 1, 4096, 4096, 2, 128, SDPA_BF16},
    };
    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    o.ignore_env = 1;
    sdpa_context *off, *on;
    if (sdpa_context_create(&o, &off) != SDPA_OK || sdpa_context_create(&o, &on) != SDPA_OK ||
        sdpa_context_set_finite_guard(on, 1) != SDPA_OK) {
        fprintf(stderr, "bench_guard: %s\n", sdpa_last_error());
        return 1;
    }
    char *info = NULL;
    sdpa_info(off, 0, &info);
    double ceiling = 0;
    const char *isa = "";
    sdpa_measure_ceiling(off, "fp32", &ceiling, &isa);
    const char *cpu = info ? strstr(info, "cpu ") : NULL;
    printf("# bench_guard: the finite-output guard off and on, %d interleaved rounds (the "
           "order alternating), medians\n# %.*s\n# fp32 ceiling %.0f GFLOP/s (%s, measured "
           "now)\n",
           rounds, cpu ? (int)strcspn(cpu, "\n") : 0, cpu ? cpu : "", ceiling, isa);
    sdpa_free(info);
    printf("%-36s %10s %10s %8s  %s\n", "shape", "off ms", "on ms", "on/off", "backend");
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        const int64_t nq = shapes[i].B * shapes[i].Sq * shapes[i].H * shapes[i].D;
        const int64_t nkv = shapes[i].B * shapes[i].Skv * shapes[i].H * shapes[i].D;
        const size_t es = sdpa_dtype_size(shapes[i].dtype);
        float *buf = malloc(sizeof(float) * (size_t)(nq + 2 * nkv));
        void *in = malloc(es * (size_t)(nq + 2 * nkv));
        float *out = malloc(sizeof(float) * (size_t)nq);
        for (int64_t j = 0; j < nq + 2 * nkv; j++)
            buf[j] = (float)((double)rand() / RAND_MAX - 0.5);
        sdpa_convert(buf, SDPA_F32, in, shapes[i].dtype, (size_t)(nq + 2 * nkv));
        char *base = in;
        sdpa_tensor q = sdpa_tensor_bshd(base, shapes[i].dtype, shapes[i].B, shapes[i].Sq,
                                         shapes[i].H, shapes[i].D);
        sdpa_tensor k = sdpa_tensor_bshd(base + es * (size_t)nq, shapes[i].dtype, shapes[i].B,
                                         shapes[i].Skv, shapes[i].H, shapes[i].D);
        sdpa_tensor v = sdpa_tensor_bshd(base + es * (size_t)(nq + nkv), shapes[i].dtype,
                                         shapes[i].B, shapes[i].Skv, shapes[i].H, shapes[i].D);
        sdpa_tensor t = sdpa_tensor_bshd(out, SDPA_F32, shapes[i].B, shapes[i].Sq, shapes[i].H,
                                         shapes[i].D);
        const int inner = shapes[i].Sq * shapes[i].Skv < 100000 ? 200 : 1; /* calls per sample */
        double *t_off = malloc(sizeof(double) * (size_t)rounds);
        double *t_on = malloc(sizeof(double) * (size_t)rounds);
        /* one context (one pool), the guard switched between the halves of a
         * round: two contexts' pools spinning against each other cost more
         * than the guard on short calls (bench/contexts.c) */
        for (int r = -1; r < rounds; r++) { /* round -1 warms; the order alternates */
            sdpa_context_set_finite_guard(on, r % 2);
            double a = now_ms();
            for (int c = 0; c < inner; c++)
                sdpa_forward(on, &q, &k, &v, &t, NULL, NULL);
            double b = now_ms();
            sdpa_context_set_finite_guard(on, !(r % 2));
            for (int c = 0; c < inner; c++)
                sdpa_forward(on, &q, &k, &v, &t, NULL, NULL);
            double e = now_ms();
            if (r >= 0) {
                const double t1 = (b - a) / inner, t2 = (e - b) / inner;
                t_off[r] = r % 2 ? t2 : t1, t_on[r] = r % 2 ? t1 : t2;
            }
        }
        qsort(t_off, (size_t)rounds, sizeof(double), cmp);
        qsort(t_on, (size_t)rounds, sizeof(double), cmp);
        printf("%-36s %10.4f %10.4f %7.3fx  %s\n", shapes[i].name, t_off[rounds / 2],
               t_on[rounds / 2], t_on[rounds / 2] / t_off[rounds / 2], sdpa_last_backend());
        free(buf), free(in), free(out), free(t_off), free(t_on);
    }
    printf("guard events: %lld (expected 0: finite outputs)\n",
           (long long)sdpa_context_guard_events(on));
    sdpa_context_destroy(off);
    sdpa_context_destroy(on);
    return 0;
}
