/*
 * block_map.c - sdpa_block_map_3d (a 3-D neighbourhood over a video grid,
 * with dense text tokens in front, as a block map), the map's density,
 * sdpa_block_map_slice (the piece of a map a part of the call sees) and
 * the map read by key blocks (sdpa__map_by_keys, for the backward pass).
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

/* Calls fn for every run of keys visible to token i under head hh, of
 * n_tokens: the prefix, the grid, then the suffix. */
static void row_runs(const sdpa_neighborhood_3d *nb, int64_t hh, int64_t n_tokens,
                     int64_t suffix, int64_t i, run_fn fn, void *arg)
{
    const int64_t P = nb->prefix;
    if (i < P || i >= n_tokens - suffix) { /* text rows see everything */
        fn(arg, 0, n_tokens);
        return;
    }
    if (P > 0)
        fn(arg, 0, P);
    if (suffix > 0) /* ascending order is not needed: runs are counted or set as bits */
        fn(arg, n_tokens - suffix, n_tokens);
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


/* A map in one allocation (freed by sdpa_block_map_free): header, counts,
 * lists of `stride` entries per row, and bits for every entry position
 * when with_bits; everything zeroed. */
static sdpa_block_map *map_alloc(int32_t bq, int32_t bk, int64_t batch, int64_t heads,
                                 int64_t q_blocks, int64_t kv_blocks, int64_t stride, int with_bits)
{
    const int64_t rows = batch * heads * q_blocks, words = (int64_t)bq * bk / 64;
    const size_t head = (sizeof(sdpa_block_map) + 63) / 64 * 64;
    const size_t lists = (sizeof(int32_t) * (size_t)(2 * rows + 2 * rows * stride) + 63) / 64 * 64;
    const size_t bits = with_bits ? sizeof(uint64_t) * (size_t)(rows * stride * words) : 0;
    char *mem = sdpa__calloc(1, head + lists + bits);
    if (!mem)
        return NULL;
    sdpa_block_map *m = (sdpa_block_map *)mem;
    int32_t *full_count = (int32_t *)(mem + head), *partial_count = full_count + rows;
    int32_t *full_index = partial_count + rows, *partial_index = full_index + rows * stride;
    *m = (sdpa_block_map){bq, bk, batch, heads, q_blocks, kv_blocks, stride, full_count,
                          full_index, partial_count, partial_index,
                          bits ? (const uint64_t *)(mem + head + lists) : NULL};
    return m;
}

sdpa_status sdpa_block_map_3d(const sdpa_neighborhood_3d *nb, int32_t block, sdpa_block_map **out)
{
    return sdpa_block_map_3d_joint(nb, 0, block, out);
}

sdpa_status sdpa_block_map_3d_joint(const sdpa_neighborhood_3d *nb, int64_t suffix, int32_t block,
                                    sdpa_block_map **out)
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
    if (suffix < 0)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "suffix is %lld, expected >= 0",
                          (long long)suffix);
    if (nb->causal_time != 0 && nb->causal_time != 1)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "nb->causal_time is %d, expected 0 or 1",
                          nb->causal_time);
    /* counted in double first: huge sizes must not wrap around */
    const double tokens = (double)nb->prefix +
                          (double)nb->grid[0] * (double)nb->grid[1] * (double)nb->grid[2] +
                          (double)suffix;
    if (tokens > INT32_MAX / 2)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "the map's %.0f tokens exceed 2^30", tokens);
    const int64_t N = nb->prefix + nb->grid[0] * nb->grid[1] * nb->grid[2] + suffix;
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
                row_runs(nb, h, N, suffix, i, count_run, &ca);
            int64_t nf = 0, np = 0;
            uint8_t *c = cls + (h * nq + qb) * nq;
            for (int64_t kb = 0; kb < nq; kb++) {
                const int64_t keys = (kb + 1) * block < N ? block : N - kb * block;
                c[kb] = count[kb] == 0                          ? SDPA_MAP_NONE
                        : count[kb] == keys * (i1 - qb * block) ? SDPA_MAP_FULL
                                                                : SDPA_MAP_PARTIAL;
                nf += c[kb] == SDPA_MAP_FULL, np += c[kb] == SDPA_MAP_PARTIAL;
            }
            max_list = nf > max_list ? nf : max_list;
            max_list = np > max_list ? np : max_list;
            n_partial += np;
        }
    free(count);

    /* pass 2: the map in one allocation */
    sdpa_block_map *m = map_alloc(block, block, 1, H, nq, nq, max_list, n_partial > 0);
    if (!m) {
        free(cls), free(slot);
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "sdpa_block_map_3d: out of memory for a map of "
                          "%lld x %lld blocks", (long long)nq, (long long)nq);
    }
    int32_t *full_count = (int32_t *)m->full_count, *partial_count = (int32_t *)m->partial_count;
    int32_t *full_index = (int32_t *)m->full_index, *partial_index = (int32_t *)m->partial_index;
    uint64_t *pbits = (uint64_t *)m->partial_bits;
    for (int64_t h = 0; h < H; h++)
        for (int64_t qb = 0; qb < nq; qb++) {
            const int64_t row = h * nq + qb;
            const uint8_t *c = cls + row * nq;
            int32_t nf = 0, np = 0;
            for (int64_t kb = 0; kb < nq; kb++) {
                slot[kb] = -1;
                if (c[kb] == SDPA_MAP_FULL)
                    full_index[row * max_list + nf++] = (int32_t)kb;
                else if (c[kb] == SDPA_MAP_PARTIAL)
                    slot[kb] = np, partial_index[row * max_list + np++] = (int32_t)kb;
            }
            full_count[row] = nf, partial_count[row] = np;
            if (!np)
                continue;
            bits_arg ba = {slot, pbits + row * max_list * words, words, block, 0};
            const int64_t i1 = (qb + 1) * block < N ? (qb + 1) * block : N;
            for (int64_t i = qb * block; i < i1; i++) {
                ba.r = i - qb * block;
                row_runs(nb, h, N, suffix, i, bits_run, &ba);
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

/* --------------------------------------------------------- by key blocks */

sdpa_map_by_keys *sdpa__map_by_keys(const sdpa_block_map *m)
{
    const int64_t groups = m->batch * m->heads, nkb = m->kv_blocks, per = nkb + 1;
    int64_t listed = 0;
    for (int64_t r = 0; r < groups * m->q_blocks; r++)
        listed += (m->full_count ? m->full_count[r] : 0) +
                  (m->partial_count ? m->partial_count[r] : 0);
    const size_t head = (sizeof(sdpa_map_by_keys) + 7) / 8 * 8;
    sdpa_map_by_keys *t = sdpa__malloc(head + sizeof(int64_t) * (size_t)(groups * per) +
                                       sizeof(int32_t) * (size_t)listed);
    if (!t)
        return NULL;
    t->kv_blocks = nkb;
    t->start = (int64_t *)(void *)((char *)t + head);
    t->q = (int32_t *)(void *)(t->start + groups * per);
    memset(t->start, 0, sizeof(int64_t) * (size_t)(groups * per));
    /* count into start[kb + 1], sum into offsets, then fill in query
     * block order (each list ascending) using start[kb] as the cursor,
     * which leaves it at start[kb + 1]: shifted back after */
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t g = 0; g < groups; g++) {
            int64_t *st = t->start + g * per;
            for (int64_t qb = 0; qb < m->q_blocks; qb++) {
                const int64_t row = g * m->q_blocks + qb;
                for (int l = 0; l < 2; l++) {
                    const int32_t *cnt = l ? m->partial_count : m->full_count;
                    const int32_t *idx = l ? m->partial_index : m->full_index;
                    for (int32_t e = 0; cnt && e < cnt[row]; e++) {
                        const int32_t kb = idx[row * m->index_stride + e];
                        if (pass == 0)
                            st[kb + 1]++;
                        else
                            t->q[st[kb]++] = (int32_t)qb;
                    }
                }
            }
        }
        if (pass == 0) { /* offsets, running on across groups */
            int64_t at = 0;
            for (int64_t g = 0; g < groups; g++) {
                int64_t *st = t->start + g * per;
                st[0] = at;
                for (int64_t kb = 1; kb <= nkb; kb++)
                    st[kb] += st[kb - 1];
                at = st[nkb];
            }
        }
    }
    for (int64_t g = 0; g < groups; g++) { /* the cursors moved each start one block on */
        int64_t *st = t->start + g * per;
        for (int64_t kb = nkb; kb > 0; kb--)
            st[kb] = st[kb - 1];
        st[0] = g > 0 ? t->start[(g - 1) * per + nkb] : 0;
    }
    return t;
}

/* ---------------------------------------------------------------- slices */

/* Bits pos .. pos + len - 1 (len <= 64) of a bit row, least significant
 * first; and the same range of dst OR'ed with v. */
static uint64_t bits_get(const uint64_t *w, int64_t pos, int64_t len)
{
    const int64_t s = pos & 63;
    uint64_t v = w[pos >> 6] >> s;
    if (s + len > 64)
        v |= w[(pos >> 6) + 1] << (64 - s);
    return len == 64 ? v : v & (((uint64_t)1 << len) - 1);
}

static void bits_or(uint64_t *w, int64_t pos, uint64_t v, int64_t len)
{
    const int64_t s = pos & 63;
    w[pos >> 6] |= v << s;
    if (s + len > 64)
        w[(pos >> 6) + 1] |= v >> (64 - s);
}

/* A growing list of a slice's entries (key blocks, and bits when kept). */
typedef struct grow_list {
    int32_t *index;
    uint64_t *bits;
    int64_t n, cap, words;
} grow_list;

static int grow_push(grow_list *g, int32_t kb, const uint64_t *bits)
{
    if (g->n == g->cap) {
        const int64_t cap = g->cap ? 2 * g->cap : 256;
        int32_t *index = sdpa__realloc(g->index, sizeof *index * (size_t)cap);
        if (!index)
            return 0;
        g->index = index;
        if (g->words) {
            uint64_t *b = sdpa__realloc(g->bits, sizeof *b * (size_t)(cap * g->words));
            if (!b)
                return 0;
            g->bits = b;
        }
        g->cap = cap;
    }
    g->index[g->n] = kb;
    if (g->words && bits)
        memcpy(g->bits + g->n * g->words, bits, sizeof *bits * (size_t)g->words);
    g->n++;
    return 1;
}

/* The bits of one block of the slice: rows q0 .. q0 + rn - 1 and keys
 * k0 .. k0 + cn - 1 of the map (global positions), row r of the block at
 * bit r * bk. Returns how many are set. */
static int64_t slice_block_bits(const sdpa_block_map *m, int64_t b, int64_t h, int64_t q0,
                                int64_t rn, int64_t k0, int64_t cn, uint64_t *blk)
{
    const int64_t bq = m->block_q, bk = m->block_kv, words = sdpa__map_words(m);
    memset(blk, 0, sizeof *blk * (size_t)words);
    for (int64_t g = q0 / bq; g <= (q0 + rn - 1) / bq; g++) {
        const int64_t row = sdpa__map_row(m, b, h, g);
        const int64_t i0 = g * bq > q0 ? g * bq : q0;
        const int64_t i1 = (g + 1) * bq < q0 + rn ? (g + 1) * bq : q0 + rn;
        for (int64_t kb = k0 / bk; kb <= (k0 + cn - 1) / bk; kb++) {
            int64_t n = -1;
            const int cls = sdpa__map_class(m, row, kb, &n);
            if (cls == SDPA_MAP_NONE)
                continue;
            const int64_t j0 = kb * bk > k0 ? kb * bk : k0;
            const int64_t j1 = (kb + 1) * bk < k0 + cn ? (kb + 1) * bk : k0 + cn;
            const uint64_t *src = cls == SDPA_MAP_PARTIAL && m->partial_bits
                                      ? m->partial_bits + (row * m->index_stride + n) * words
                                      : NULL;
            for (int64_t i = i0; i < i1; i++)
                for (int64_t j = j0; j < j1; j += 64) {
                    const int64_t len = j1 - j < 64 ? j1 - j : 64;
                    const uint64_t v =
                        src ? bits_get(src, (i - g * bq) * bk + (j - kb * bk), len)
                            : (len == 64 ? ~(uint64_t)0 : ((uint64_t)1 << len) - 1);
                    bits_or(blk, (i - q0) * bk + (j - k0), v, len);
                }
        }
    }
    int64_t set = 0;
    for (int64_t w = 0; w < words; w++)
        set += __builtin_popcountll(blk[w]);
    return set;
}

sdpa_status sdpa_block_map_slice(const sdpa_block_map *m, int64_t Sq, int64_t Skv,
                                 int64_t q_first, int64_t q_count, int64_t kv_first,
                                 int64_t kv_count, int64_t head_first, int64_t head_count,
                                 sdpa_block_map **out)
{
    if (!out)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "out is NULL, expected a place for the map");
    *out = NULL;
    if (!m)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "map is NULL, expected the call's block map");
    if (Sq < 1 || Skv < 1)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "Sq %lld and Skv %lld, expected both >= 1",
                          (long long)Sq, (long long)Skv);
    if (q_first < 0 || q_count < 1 || q_count > Sq - q_first)
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "q_first %lld with q_count %lld, expected rows inside 0..%lld",
                          (long long)q_first, (long long)q_count, (long long)Sq - 1);
    if (kv_first < 0 || kv_count < 1 || kv_count > Skv - kv_first)
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "kv_first %lld with kv_count %lld, expected keys inside 0..%lld",
                          (long long)kv_first, (long long)kv_count, (long long)Skv - 1);
    if (head_first < 0 || head_count < 1 ||
        (m->heads > 1 && head_count > m->heads - head_first))
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "head_first %lld with head_count %lld, expected heads inside the "
                          "map's 0..%lld (any, when it broadcasts one)",
                          (long long)head_first, (long long)head_count, (long long)m->heads - 1);
    const int64_t bq = m->block_q, bk = m->block_kv;
    sdpa_status st = sdpa__check_block_map(m, m->batch, m->heads, Sq, Skv, 1,
                                           bq ? q_first / bq : 0,
                                           bq ? (q_first + q_count - 1) / bq + 1 : 0);
    if (st != SDPA_OK)
        return st;
    const int64_t LQ = (q_count + bq - 1) / bq, LK = (kv_count + bk - 1) / bk;
    const int64_t H = m->heads == 1 ? 1 : head_count, rows = m->batch * H * LQ;
    const int aligned = q_first % bq == 0 && kv_first % bk == 0;
    /* without bits in the map, an aligned slice keeps its blocks as they
     * are; anything else is worked out bit by bit */
    const int64_t words = sdpa__map_words(m), keep_bits = !aligned || m->partial_bits;
    grow_list full = {0}, part = {0};
    part.words = keep_bits ? words : 0;
    int32_t *nfull = sdpa__calloc((size_t)(2 * rows), sizeof *nfull);
    int32_t *npart = nfull ? nfull + rows : NULL;
    uint64_t *blk = sdpa__malloc(sizeof *blk * (size_t)words);
    uint8_t *cand = sdpa__malloc((size_t)LK);
    int ok = nfull && blk && cand;
    for (int64_t b = 0; ok && b < m->batch; b++)
        for (int64_t hh = 0; ok && hh < H; hh++)
            for (int64_t lq = 0; ok && lq < LQ; lq++) {
                const int64_t h = m->heads == 1 ? 0 : head_first + hh, lrow = (b * H + hh) * LQ + lq;
                const int64_t q0 = q_first + lq * bq, rn = q_count - lq * bq < bq ? q_count - lq * bq : bq;
                if (!keep_bits) { /* aligned: one of the map's rows, renumbered */
                    const int64_t row = sdpa__map_row(m, b, h, q0 / bq), kb0 = kv_first / bk;
                    for (int l = 0; l < 2 && ok; l++) {
                        const int32_t *cnt = l ? m->partial_count : m->full_count;
                        const int32_t *idx = l ? m->partial_index : m->full_index;
                        for (int32_t e = 0; ok && cnt && e < cnt[row]; e++) {
                            const int64_t kb = idx[row * m->index_stride + e];
                            if (kb < kb0 || kb >= kb0 + LK)
                                continue;
                            ok = grow_push(l ? &part : &full, (int32_t)(kb - kb0), NULL);
                            (l ? npart : nfull)[lrow]++;
                        }
                    }
                    continue;
                }
                /* the slice's key blocks that some listed block of the map reaches */
                memset(cand, 0, (size_t)LK);
                for (int64_t g = q0 / bq; g <= (q0 + rn - 1) / bq; g++) {
                    const int64_t row = sdpa__map_row(m, b, h, g);
                    for (int l = 0; l < 2; l++) {
                        const int32_t *cnt = l ? m->partial_count : m->full_count;
                        const int32_t *idx = l ? m->partial_index : m->full_index;
                        for (int32_t e = 0; cnt && e < cnt[row]; e++) {
                            const int64_t kb = idx[row * m->index_stride + e];
                            const int64_t j0 = kb * bk > kv_first ? kb * bk : kv_first;
                            const int64_t j1 = (kb + 1) * bk < kv_first + kv_count
                                                   ? (kb + 1) * bk
                                                   : kv_first + kv_count;
                            for (int64_t j = j0; j < j1; j += bk - (j - kv_first) % bk)
                                cand[(j - kv_first) / bk] = 1;
                        }
                    }
                }
                for (int64_t lk = 0; ok && lk < LK; lk++) {
                    if (!cand[lk])
                        continue;
                    const int64_t k0 = kv_first + lk * bk;
                    const int64_t cn = kv_count - lk * bk < bk ? kv_count - lk * bk : bk;
                    const int64_t set = slice_block_bits(m, b, h, q0, rn, k0, cn, blk);
                    if (set == 0)
                        continue;
                    const int is_full = set == rn * cn;
                    ok = grow_push(is_full ? &full : &part, (int32_t)lk, blk);
                    (is_full ? nfull : npart)[lrow]++;
                }
            }
    /* the map in one allocation, as sdpa_block_map_3d lays it out */
    int64_t stride = 1;
    for (int64_t r = 0; ok && r < rows; r++) {
        stride = nfull[r] > stride ? nfull[r] : stride;
        stride = npart[r] > stride ? npart[r] : stride;
    }
    sdpa_block_map *s =
        ok ? map_alloc((int32_t)bq, (int32_t)bk, m->batch, H, LQ, LK, stride, part.n && keep_bits)
           : NULL;
    if (s) {
        int32_t *full_count = (int32_t *)s->full_count, *partial_count = (int32_t *)s->partial_count;
        int32_t *full_index = (int32_t *)s->full_index, *partial_index = (int32_t *)s->partial_index;
        uint64_t *pbits = (uint64_t *)s->partial_bits;
        int64_t at_f = 0, at_p = 0;
        for (int64_t r = 0; r < rows; r++) {
            full_count[r] = nfull[r], partial_count[r] = npart[r];
            if (nfull[r]) /* an empty list may have no array at all */
                memcpy(full_index + r * stride, full.index + at_f,
                       sizeof(int32_t) * (size_t)nfull[r]);
            if (npart[r])
                memcpy(partial_index + r * stride, part.index + at_p,
                       sizeof(int32_t) * (size_t)npart[r]);
            if (pbits && npart[r])
                memcpy(pbits + r * stride * words, part.bits + at_p * words,
                       sizeof(uint64_t) * (size_t)(npart[r] * words));
            at_f += nfull[r], at_p += npart[r];
        }
        *out = s;
    }
    free(nfull), free(blk), free(cand);
    free(full.index), free(full.bits), free(part.index), free(part.bits);
    if (!s)
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "sdpa_block_map_slice: out of memory for a "
                          "slice of %lld x %lld blocks", (long long)LQ, (long long)LK);
    return SDPA_OK;
}
