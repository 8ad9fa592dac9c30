/*
 * amx_tiles.c - what the tile unit charges for the operations around its
 * products, measured on one core of a CPU with usable AMX:
 *
 *   bench_amx_tiles [--reps N]
 *
 * Each line times a loop of TDPBF16PS (16 x 16 x 32 bf16 multiply-adds
 * into fp32) with something beside it, in ns per product and as a multiple
 * of the register-only loop of the same run (the ceiling probe's: four
 * accumulators, operands loaded once). The loops are the shapes cpu.amx
 * runs (src/cpu/amx/flash_amx.c): C tiles 2 x 2, A = 32 query rows, B =
 * packed K or V; S = Q K^T stored as fp32 after D / 32 products per C
 * tile, O loaded and stored around P V. Medians of N interleaved rounds.
 * Why it exists: the kernel's block sizes and its pipeline were chosen
 * from these figures (the comments there cite them); a CPU without AMX
 * prints that and exits 0.
 */
#include "cpu/amx/amx_tiles.h"

#include <sdpa.h>

#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { KB = 512, SPAD = 16 };

static uint16_t *qbuf, *kbuf, *vbuf, *pbuf, *big;
static float *sbuf, *obuf, sl1[32 * 48] __attribute__((aligned(64)));
static size_t big_tiles; /* 1 KB tiles in big */

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Four products on tmm0-3 from A = tmm4, 5 and B = tmm6, 7. */
#define DP4()                                                                                     \
    do {                                                                                          \
        TILE_DPBF16PS(0, 4, 6);                                                                   \
        TILE_DPBF16PS(1, 4, 7);                                                                   \
        TILE_DPBF16PS(2, 5, 6);                                                                   \
        TILE_DPBF16PS(3, 5, 7);                                                                   \
    } while (0)

/* Each loop returns the products it ran. */
static long loop_regs(long n)
{
    for (long i = 0; i < n; i++)
        DP4();
    return 4 * n;
}

static long loop_l1(long n) /* A and B loaded every step, from 8 KB in L1 */
{
    for (long i = 0; i < n; i++) {
        TILE_LOAD(4, qbuf + (i & 3) * 32, 256);
        TILE_LOAD(5, qbuf + 2048 + (i & 3) * 32, 256);
        TILE_LOAD(6, kbuf + (i & 3) * 1024, 64);
        TILE_LOAD(7, kbuf + (i & 3) * 1024 + 512, 64);
        DP4();
    }
    return 4 * n;
}

static long loop_stream(long n, size_t tiles) /* B streaming over `tiles` KB */
{
    size_t t = 0;
    for (long i = 0; i < n; i++) {
        TILE_LOAD(4, qbuf + (i & 3) * 32, 256);
        TILE_LOAD(5, qbuf + 2048 + (i & 3) * 32, 256);
        TILE_LOAD(6, big + t * 512, 64);
        TILE_LOAD(7, big + t * 512 + 512, 64);
        t = t + 2 < tiles ? t + 2 : 0;
        DP4();
    }
    return 4 * n;
}

/* The kernel's S for one query block and KB keys at head dim 32 nch:
 * per 32-key group zero C, nch steps, store C to s (row stride ld floats). */
static long loop_scores(long n, int nch, float *s, int64_t ld, int one_place)
{
    long dps = 0;
    for (long i = 0; i < n; i++)
        for (int g = 0; g < KB / 32; g++) {
            TILE_ZERO(0);
            TILE_ZERO(1);
            TILE_ZERO(2);
            TILE_ZERO(3);
            for (int ch = 0; ch < nch; ch++) {
                TILE_LOAD(4, qbuf + ch * 32, nch * 64);
                TILE_LOAD(5, qbuf + 16 * nch * 32 + ch * 32, nch * 64);
                TILE_LOAD(6, kbuf + (2 * g * nch + ch) * 512, 64);
                TILE_LOAD(7, kbuf + ((2 * g + 1) * nch + ch) * 512, 64);
                DP4();
            }
            float *c = one_place ? s : s + g * 32;
            TILE_STORE(0, c, ld * 4);
            TILE_STORE(1, c + 16, ld * 4);
            TILE_STORE(2, c + 16 * ld, ld * 4);
            TILE_STORE(3, c + 16 * ld + 16, ld * 4);
            dps += 4 * nch;
        }
    return dps;
}

/* The kernel's P V for one query block, KB keys, D = 128: per 32 head dims
 * O's C tiles loaded (or not), KB / 32 steps, stored (or not). */
static long loop_values(long n, int with_o)
{
    long dps = 0;
    for (long i = 0; i < n; i++)
        for (int g = 0; g < 8; g += 2) {
            float *o = obuf + g * 16;
            if (with_o) {
                TILE_LOAD(0, o, 512);
                TILE_LOAD(1, o + 16, 512);
                TILE_LOAD(2, o + 16 * 128, 512);
                TILE_LOAD(3, o + 16 * 128 + 16, 512);
            }
            for (int ch = 0; ch < KB / 32; ch++) {
                TILE_LOAD(4, pbuf + ch * 32, KB * 2);
                TILE_LOAD(5, pbuf + 16 * KB + ch * 32, KB * 2);
                TILE_LOAD(6, vbuf + (ch * 8 + g) * 512, 64);
                TILE_LOAD(7, vbuf + (ch * 8 + g + 1) * 512, 64);
                DP4();
            }
            if (with_o) {
                TILE_STORE(0, o, 512);
                TILE_STORE(1, o + 16, 512);
                TILE_STORE(2, o + 16 * 128, 512);
                TILE_STORE(3, o + 16 * 128 + 16, 512);
            }
            dps += 4 * KB / 32;
        }
    return dps;
}

/* Tiles and vector work in one loop: per step the L1 loads and four
 * products (tiles), 8 x `fma` independent 512-bit FMAs (vector), or both. */
static __m512 vsink;
static long loop_mix(long n, int tiles, int fma)
{
    __m512 a[8];
    for (int j = 0; j < 8; j++)
        a[j] = _mm512_set1_ps(1.0f + (float)j);
    const __m512 m = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(0.001f);
    for (long i = 0; i < n; i++) {
        if (tiles) {
            TILE_LOAD(4, qbuf + (i & 3) * 32, 256);
            TILE_LOAD(5, qbuf + 2048 + (i & 3) * 32, 256);
            TILE_LOAD(6, kbuf + (i & 3) * 1024, 64);
            TILE_LOAD(7, kbuf + (i & 3) * 1024 + 512, 64);
            DP4();
        }
        for (int k = 0; k < fma; k++)
            for (int j = 0; j < 8; j++) {
                a[j] = _mm512_fmadd_ps(a[j], m, c);
                __asm__ volatile("" : "+v"(a[j]));
            }
    }
    __m512 s = a[0];
    for (int j = 1; j < 8; j++)
        s = _mm512_add_ps(s, a[j]);
    vsink = s;
    return 4 * n;
}

enum { CASES = 13 };
static const char *const case_name[CASES] = {
    "registers only (the ceiling probe's loop)",
    "A and B tile loads from L1 every 4 products",
    "B streaming over 128 KB (L2), A from L1",
    "B streaming over 1 MB (L2), A from L1",
    "B streaming over 64 MB (beyond L2), A from L1",
    "S = Q K^T, D = 128: C stored to S of 32 x 528 fp32 (L2)",
    "S = Q K^T, D = 128: C stored to one 32 x 48 place (L1)",
    "S = Q K^T, D = 64: C stored to S of 32 x 528 fp32 (L2)",
    "S = Q K^T, D = 64: C stored to one 32 x 48 place (L1)",
    "O += P V, D = 128, 512 keys: O's C tiles loaded and stored",
    "O += P V, D = 128, 512 keys: C tiles kept (no O traffic)",
    "L1 loads + 4 products, then 16 vector FMAs: both",
    "  the same 16 vector FMAs alone (ns per step, x: of both)",
};

static double run_case(int k, long n, long *dps)
{
    const double t0 = now();
    switch (k) {
    case 0: *dps = loop_regs(n); break;
    case 1: *dps = loop_l1(n); break;
    case 2: *dps = loop_stream(n, 128); break;
    case 3: *dps = loop_stream(n, 1024); break;
    case 4: *dps = loop_stream(n, big_tiles); break;
    case 5: *dps = loop_scores(n / 64, 4, sbuf, KB + SPAD, 0); break;
    case 6: *dps = loop_scores(n / 64, 4, sl1, 48, 1); break;
    case 7: *dps = loop_scores(n / 32, 2, sbuf, KB + SPAD, 0); break;
    case 8: *dps = loop_scores(n / 32, 2, sl1, 48, 1); break;
    case 9: *dps = loop_values(n / 64, 1); break;
    case 10: *dps = loop_values(n / 64, 0); break;
    case 11: *dps = loop_mix(n, 1, 2); break;
    default: *dps = loop_mix(n, 0, 2); break;
    }
    return now() - t0;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    long reps = 5;
    if (argc == 3 && strcmp(argv[1], "--reps") == 0) {
        char *end;
        reps = strtol(argv[2], &end, 10);
        if (*end || reps < 1 || reps > 101) {
            fprintf(stderr, "bench_amx_tiles: --reps '%s' is not a number in 1..101\n", argv[2]);
            return 2;
        }
    } else if (argc != 1) {
        fprintf(stderr, "usage: bench_amx_tiles [--reps N]\n");
        return 2;
    }
    sdpa_context *ctx;
    if (sdpa_context_create(NULL, &ctx) != SDPA_OK) {
        fprintf(stderr, "bench_amx_tiles: %s\n", sdpa_last_error());
        return 1;
    }
    const sdpa_platform *plat = sdpa_context_platform(ctx);
    if (!(plat->cpu_features & SDPA_CPU_AMX_BF16)) {
        printf("# bench_amx_tiles: no usable AMX on this CPU (%s): nothing to time\n",
               plat->cpu_model);
        sdpa_context_destroy(ctx);
        return 0;
    }
    char date[32];
    const time_t t = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d", gmtime(&t));
    printf("# bench_amx_tiles %s  %s  one thread  %ld rounds (interleaved), %s\n",
           sdpa_version(), plat->cpu_model, reps, date);
    printf("# ns per TDPBF16PS (median); x: over the register-only loop of this run\n");
    big_tiles = (size_t)64 << 10;
    qbuf = aligned_alloc(64, 32 * 128 * 2);
    kbuf = aligned_alloc(64, (size_t)KB * 128 * 2);
    vbuf = aligned_alloc(64, (size_t)KB * 128 * 2);
    pbuf = aligned_alloc(64, 32 * (size_t)KB * 2);
    sbuf = aligned_alloc(64, 32 * (KB + SPAD) * 4);
    obuf = aligned_alloc(64, 32 * 128 * 4);
    big = aligned_alloc(64, big_tiles * 1024);
    if (!qbuf || !kbuf || !vbuf || !pbuf || !sbuf || !obuf || !big) {
        fprintf(stderr, "bench_amx_tiles: out of memory\n");
        return 1;
    }
    /* small bf16 values (1, 1/2, ...): no overflow, no denormals */
    for (size_t i = 0; i < 32 * 128; i++)
        qbuf[i] = (uint16_t)(0x3f80 - (i & 7) * 0x80), obuf[i] = 0.0f;
    for (size_t i = 0; i < (size_t)KB * 128; i++)
        kbuf[i] = vbuf[i] = (uint16_t)(0x3f80 - (i & 7) * 0x80);
    for (size_t i = 0; i < 32 * (size_t)KB; i++)
        pbuf[i] = 0x3c00;
    for (size_t i = 0; i < 32 * (KB + SPAD); i++)
        sbuf[i] = 0.0f;
    for (size_t i = 0; i < big_tiles * 512; i++)
        big[i] = 0x3c00;
    amx_configure_full_tiles();
    TILE_LOAD(4, qbuf, 64);
    TILE_LOAD(5, qbuf, 64);
    TILE_LOAD(6, kbuf, 64);
    TILE_LOAD(7, kbuf, 64);
    const long n = 1 << 16;
    static double ns[CASES][101];
    for (long r = 0; r < reps; r++)
        for (int k = 0; k < CASES; k++) {
            long dps;
            const double s = run_case(k, n, &dps);
            ns[k][r] = s * 1e9 / (double)dps;
        }
    TILE_RELEASE();
    double med[CASES];
    for (int k = 0; k < CASES; k++) {
        qsort(ns[k], (size_t)reps, sizeof(double), cmp_double);
        med[k] = ns[k][reps / 2];
    }
    printf("%-66s %9s %7s\n", "loop", "ns/TDP", "x");
    for (int k = 0; k < CASES; k++) {
        /* the last line: the vector work alone, per step, against both */
        const int last = k == CASES - 1;
        printf("%-66s %9.2f %7.2f\n", case_name[k], last ? med[k] * 4 : med[k],
               med[k] / (last ? med[CASES - 2] : med[0]));
    }
    free(qbuf), free(kbuf), free(vbuf), free(pbuf), free(sbuf), free(obuf), free(big);
    sdpa_context_destroy(ctx);
    return 0;
}
