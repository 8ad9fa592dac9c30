/*
 * block_map.c - sdpa_block_map_3d (a 3-D neighbourhood over a video grid,
 * with dense text tokens in front, as a block map) and the map's density.
 *
 * Each query row's visible keys are a few runs of consecutive tokens (one
 * per (frame, line) of its window in row-major order, one per (frame,
 * tile line) in tile-major order, plus the text prefix), so a key block's
 * class is found by counting the keys the runs put in it: all of them,
 * FULL; some, PARTIAL; none, unlisted. Nothing of size Sq x Skv is made:
 * the build keeps one class byte per (head, query block, key block) and
 * one count per key block of the current query block. Cost: rows x runs
 * per row, twice for blocks that come out partial (their bits).
 */
#include "alloc.h"
#include "core.h"
#include "sparse.h"

#include <stdlib.h>
#include <string.h>

/* The run callback: keys [a, b) are visible to the row. */
typedef void (*run_fn)(void *arg, int64_t a, int64_t b);

/* Positions start .. start + n visible on an axis of `len` positions to
 * position p with window k (NATTEN's clamp; causal: ending at p). */
static void axis_window(int64_t p, int64_t len, int64_t k, int causal, int64_t *s, int64_t *e)
{
    if (k <= 0 || k >= len) {
        *s = 0, *e = causal ? p + 1 : len;
        return;
    }
    if (causal) {
        *s = p - k + 1 > 0 ? p - k + 1 : 0, *e = p + 1;
        return;
    }
    int64_t start = p - k / 2;
    start = start < 0 ? 0 : start > len - k ? len - k : start;
    *s = start, *e = start + k;
}

/* Calls fn for every run of keys visible to token i under head hh. */
static void row_runs(const sdpa_neighborhood_3d *nb, int64_t hh, int64_t n_tokens, int64_t i,
                     run_fn fn, void *arg)
{
    const int64_t P = nb->prefix;
    if (i < P) { /* text rows see everything */
        fn(arg, 0, n_tokens);
        return;
    }
    if (P > 0)
        fn(arg, 0, P);
    const int64_t *win = nb->windows + (nb->heads > 1 ? hh : 0) * 3;
    const int64_t g = i - P;
    const int tiled = nb->tile[0] > 0;
    int64_t unit[3], n[3], pos[3]; /* positions: tokens, or tiles when tiled */
    for (int a = 0; a < 3; a++) {
        unit[a] = tiled ? nb->tile[a] : 1;
        n[a] = nb->grid[a] / unit[a];
    }
    int64_t tsize = 1; /* tokens per position: a tile's run is all of its tokens */
    if (tiled) {
        tsize = unit[0] * unit[1] * unit[2];
        const int64_t tile = g / tsize;
        pos[0] = tile / (n[1] * n[2]), pos[1] = tile / n[2] % n[1], pos[2] = tile % n[2];
    } else {
        pos[0] = g / (n[1] * n[2]), pos[1] = g / n[2] % n[1], pos[2] = g % n[2];
    }
    int64_t s[3], e[3];
    for (int a = 0; a < 3; a++)
        axis_window(pos[a], n[a], win[a], a == 0 && nb->causal_time, &s[a], &e[a]);
    for (int64_t t = s[0]; t < e[0]; t++)
        for (int64_t y = s[1]; y < e[1]; y++) {
            const int64_t line = (t * n[1] + y) * n[2]; /* first position of the line */
            fn(arg, P + (line + s[2]) * tsize, P + (line + e[2]) * tsize);
        }
}

typedef struct count_arg {
    int64_t *count; /* per key block */
    int64_t bk;
} count_arg;

static void count_run(void *arg, int64_t a, int64_t b)
{
    count_arg *c = arg;
    for (int64_t kb = a / c->bk; kb * c->bk < b; kb++) {
        const int64_t lo = kb * c->bk > a ? kb * c->bk : a;
        const int64_t hi = (kb + 1) * c->bk < b ? (kb + 1) * c->bk : b;
        c->count[kb] += hi - lo;
    }
}

typedef struct bits_arg {
    const int32_t *slot;  /* per key block: its partial entry, or -1 */
    uint64_t *bits;       /* the row's first entry's words */
    int64_t words, bk, r; /* words per entry, block size, row in block */
} bits_arg;

static void bits_run(void *arg, int64_t a, int64_t b)
{
    bits_arg *x = arg;
    for (int64_t j = a; j < b; j++) {
        const int64_t kb = j / x->bk;
        if (x->slot[kb] < 0) {
            j = (kb + 1) * x->bk - 1; /* a full block: skip it */
            continue;
        }
        const int64_t bit = x->r * x->bk + j % x->bk;
        x->bits[x->slot[kb] * x->words + (bit >> 6)] |= (uint64_t)1 << (bit & 63);
    }
}

enum { CLASS_NONE = 0, CLASS_FULL = 1, CLASS_PARTIAL = 2 };

sdpa_status sdpa_block_map_3d(const sdpa_neighborhood_3d *nb, int32_t block, sdpa_block_map **out)
{
    if (!out)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "out is NULL, expected a place for the map");
    *out = NULL;
    if (!nb)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "nb is NULL, expected a neighbourhood");
    if (block != 64 && block != 128)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "block is %d, expected 64 or 128", (int)block);
    static const char *axes[3] = {"T", "H", "W"};
    for (int a = 0; a < 3; a++) {
        if (nb->grid[a] < 1)
            return sdpa__fail(SDPA_INVALID_ARGUMENT, "nb->grid[%d] (%s) is %lld, expected >= 1",
                              a, axes[a], (long long)nb->grid[a]);
        if ((nb->tile[0] > 0) != (nb->tile[a] > 0) || nb->tile[a] < 0 ||
            (nb->tile[a] > 0 && nb->grid[a] % nb->tile[a] != 0))
            return sdpa__fail(SDPA_INVALID_ARGUMENT,
                              "nb->tile[%d] (%s) is %lld, expected 0 on every axis, or on every "
                              "axis a divisor of the grid's %lld",
                              a, axes[a], (long long)nb->tile[a], (long long)nb->grid[a]);
    }
    if (nb->heads < 1 || !nb->windows)
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "nb->heads is %lld with windows %s, expected heads >= 1 and windows "
                          "[heads][3]",
                          (long long)nb->heads, nb->windows ? "given" : "NULL");
    if (nb->prefix < 0)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "nb->prefix is %lld, expected >= 0",
                          (long long)nb->prefix);
    if (nb->causal_time != 0 && nb->causal_time != 1)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "nb->causal_time is %d, expected 0 or 1",
                          nb->causal_time);
    const int64_t N = nb->prefix + nb->grid[0] * nb->grid[1] * nb->grid[2];
    if (N > INT32_MAX / 2)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "the map's %lld tokens exceed 2^30",
                          (long long)N);
    const int64_t nq = (N + block - 1) / block, H = nb->heads, words = (int64_t)block * block / 64;

    /* pass 1: classes and the longest lists */
    uint8_t *cls = sdpa__malloc((size_t)(H * nq * nq));
    int64_t *count = sdpa__malloc(sizeof *count * (size_t)nq);
    int32_t *slot = sdpa__malloc(sizeof *slot * (size_t)nq);
    if (!cls || !count || !slot) {
        free(cls), free(count), free(slot);
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "sdpa_block_map_3d: cannot allocate %lld bytes",
                          (long long)(H * nq * nq));
    }
    int64_t max_list = 1, n_partial = 0;
    count_arg ca = {count, block};
    for (int64_t h = 0; h < H; h++)
        for (int64_t qb = 0; qb < nq; qb++) {
            memset(count, 0, sizeof *count * (size_t)nq);
            const int64_t i1 = (qb + 1) * block < N ? (qb + 1) * block : N;
            for (int64_t i = qb * block; i < i1; i++)
                row_runs(nb, h, N, i, count_run, &ca);
            int64_t nf = 0, np = 0;
            uint8_t *c = cls + (h * nq + qb) * nq;
            for (int64_t kb = 0; kb < nq; kb++) {
                const int64_t keys = (kb + 1) * block < N ? block : N - kb * block;
                c[kb] = count[kb] == 0                          ? CLASS_NONE
                        : count[kb] == keys * (i1 - qb * block) ? CLASS_FULL
                                                                : CLASS_PARTIAL;
                nf += c[kb] == CLASS_FULL, np += c[kb] == CLASS_PARTIAL;
            }
            max_list = nf > max_list ? nf : max_list;
            max_list = np > max_list ? np : max_list;
            n_partial += np;
        }
    free(count);

    /* pass 2: the map in one allocation: header, counts, lists, bits */
    const int64_t rows = H * nq;
    const size_t head = (sizeof(sdpa_block_map) + 63) / 64 * 64;
    const size_t lists = sizeof(int32_t) * (size_t)(2 * rows + 2 * rows * max_list);
    const size_t bits = n_partial ? sizeof(uint64_t) * (size_t)(rows * max_list * words) : 0;
    char *mem = sdpa__malloc(head + (lists + 63) / 64 * 64 + bits);
    if (!mem) {
        free(cls), free(slot);
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "sdpa_block_map_3d: cannot allocate %zu bytes",
                          head + lists + bits);
    }
    sdpa_block_map *m = (sdpa_block_map *)mem;
    int32_t *full_count = (int32_t *)(mem + head), *partial_count = full_count + rows;
    int32_t *full_index = partial_count + rows, *partial_index = full_index + rows * max_list;
    uint64_t *pbits = bits ? (uint64_t *)(mem + head + (lists + 63) / 64 * 64) : NULL;
    memset(mem + head, 0, lists);
    if (pbits)
        memset(pbits, 0, bits);
    *m = (sdpa_block_map){block, block, 1, H, nq, nq, max_list, full_count, full_index,
                          partial_count, partial_index, pbits};
    for (int64_t h = 0; h < H; h++)
        for (int64_t qb = 0; qb < nq; qb++) {
            const int64_t row = h * nq + qb;
            const uint8_t *c = cls + row * nq;
            int32_t nf = 0, np = 0;
            for (int64_t kb = 0; kb < nq; kb++) {
                slot[kb] = -1;
                if (c[kb] == CLASS_FULL)
                    full_index[row * max_list + nf++] = (int32_t)kb;
                else if (c[kb] == CLASS_PARTIAL)
                    slot[kb] = np, partial_index[row * max_list + np++] = (int32_t)kb;
            }
            full_count[row] = nf, partial_count[row] = np;
            if (!np)
                continue;
            bits_arg ba = {slot, pbits + row * max_list * words, words, block, 0};
            const int64_t i1 = (qb + 1) * block < N ? (qb + 1) * block : N;
            for (int64_t i = qb * block; i < i1; i++) {
                ba.r = i - qb * block;
                row_runs(nb, h, N, i, bits_run, &ba);
            }
        }
    if (!n_partial)
        m->partial_count = NULL, m->partial_index = NULL;
    free(cls), free(slot);
    *out = m;
    return SDPA_OK;
}

void sdpa_block_map_free(sdpa_block_map *map) { free(map); }

double sdpa_block_map_density(const sdpa_block_map *m, int64_t Sq, int64_t Skv)
{
    if (!m || Sq <= 0 || Skv <= 0)
        return 0.0;
    double seen = 0.0;
    for (int64_t bh = 0; bh < m->batch * m->heads; bh++)
        for (int64_t qb = 0; qb < m->q_blocks; qb++) {
            const int64_t row = bh * m->q_blocks + qb;
            const int64_t rows = (qb + 1) * m->block_q < Sq ? m->block_q : Sq - qb * m->block_q;
            for (int l = 0; l < 2; l++) {
                const int32_t *cnt = l ? m->partial_count : m->full_count;
                const int32_t *idx = l ? m->partial_index : m->full_index;
                for (int32_t e = 0; cnt && e < cnt[row]; e++) {
                    const int64_t kb = idx[row * m->index_stride + e];
                    const int64_t keys =
                        (kb + 1) * m->block_kv < Skv ? m->block_kv : Skv - kb * m->block_kv;
                    seen += (double)rows * (double)keys;
                }
            }
        }
    return seen / ((double)m->batch * (double)m->heads * (double)Sq * (double)Skv);
}
