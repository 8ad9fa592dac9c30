/*
 * sparse.h - the one reading of sdpa.h's window and block map that ref,
 * the kernels and validation share: which keys a row's window admits,
 * where a (b, h, query block) row of a map lives, and whether the map
 * shows key j to query i.
 *
 * Lookups by element (sdpa__map_visible) cost a search of the row's two
 * lists: ref and the masking of PARTIAL tiles use them; the kernels walk
 * the lists block by block and never search for a FULL block.
 */
#ifndef SDPA_SPARSE_H
#define SDPA_SPARSE_H

#include "core.h"

#include <stdint.h>

/* Keys lo .. hi (inclusive) that the window admits for query i, with
 * off = len_kv - len_q (the real lengths); an unbounded side gives
 * INT64_MIN / INT64_MAX. */
static inline void sdpa__window_keys(const sdpa_window *w, int64_t i, int64_t off, int64_t *lo,
                                     int64_t *hi)
{
    *lo = w->left < 0 ? INT64_MIN : i + off - w->left;
    *hi = w->right < 0 ? INT64_MAX : i + off + w->right;
}

/* Row (b, h, qb) of the map's count arrays (batch or heads 1 broadcast). */
static inline int64_t sdpa__map_row(const sdpa_block_map *m, int64_t b, int64_t h, int64_t qb)
{
    return ((m->batch == 1 ? 0 : b) * m->heads + (m->heads == 1 ? 0 : h)) * m->q_blocks + qb;
}

/* 64-bit words of bits per partial entry. */
static inline int64_t sdpa__map_words(const sdpa_block_map *m)
{
    return (int64_t)m->block_q * m->block_kv / 64;
}

/* Position of key block kb in the ascending list idx[0..n), or -1. */
static inline int64_t sdpa__map_find(const int32_t *idx, int32_t n, int64_t kb)
{
    int32_t lo = 0, hi = n;
    while (lo < hi) {
        const int32_t mid = lo + (hi - lo) / 2;
        if (idx[mid] < kb)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && idx[lo] == kb ? lo : -1;
}

/* What map row `row` lists key block kb as: SDPA_MAP_FULL, SDPA_MAP_PARTIAL
 * (its entry in *entry) or SDPA_MAP_NONE (two searches at most). */
enum { SDPA_MAP_NONE = 0, SDPA_MAP_FULL = 1, SDPA_MAP_PARTIAL = 2 };
static inline int sdpa__map_class(const sdpa_block_map *m, int64_t row, int64_t kb,
                                  int64_t *entry)
{
    if (m->full_count &&
        sdpa__map_find(m->full_index + row * m->index_stride, m->full_count[row], kb) >= 0)
        return SDPA_MAP_FULL;
    if (m->partial_count &&
        (*entry = sdpa__map_find(m->partial_index + row * m->index_stride,
                                 m->partial_count[row], kb)) >= 0)
        return SDPA_MAP_PARTIAL;
    return SDPA_MAP_NONE;
}

/* Whether entry n of map row `row` (a PARTIAL block) shows key c of the
 * block to its row r. */
static inline int sdpa__map_bit(const sdpa_block_map *m, int64_t row, int64_t n, int64_t r,
                                int64_t c)
{
    if (!m->partial_bits)
        return 1;
    const uint64_t *w = m->partial_bits + (row * m->index_stride + n) * sdpa__map_words(m);
    const int64_t bit = r * m->block_kv + c;
    return (int)(w[bit >> 6] >> (bit & 63) & 1u);
}

/* Whether the map shows key j to query i of (b, h). */
static inline int sdpa__map_visible(const sdpa_block_map *m, int64_t b, int64_t h, int64_t i,
                                    int64_t j)
{
    const int64_t row = sdpa__map_row(m, b, h, i / m->block_q), kb = j / m->block_kv;
    if (m->full_count &&
        sdpa__map_find(m->full_index + row * m->index_stride, m->full_count[row], kb) >= 0)
        return 1;
    if (!m->partial_count)
        return 0;
    const int64_t n =
        sdpa__map_find(m->partial_index + row * m->index_stride, m->partial_count[row], kb);
    return n >= 0 && sdpa__map_bit(m, row, n, i % m->block_q, j % m->block_kv);
}

/* Whether the call's window (aligned on the real lengths) and block map
 * show key j to query i of (b, h), element by element: ref's reading (the
 * kernels look a map row's entry up once per key block instead). */
static inline int sdpa__sparse_visible(const sdpa_call *c, int64_t b, int64_t h, int64_t i,
                                       int64_t j)
{
    const sdpa_mask *m = c->mask;
    if (!m)
        return 1;
    if (m->window) {
        const int64_t len_q = m->seq_len_q ? m->seq_len_q[b] : c->desc.Sq;
        const int64_t len_kv = m->seq_len_kv ? m->seq_len_kv[b] : c->desc.Skv;
        int64_t lo, hi;
        sdpa__window_keys(m->window, i, len_kv - len_q, &lo, &hi);
        if (j < lo || j > hi)
            return 0;
    }
    return !m->blocks || sdpa__map_visible(m->blocks, b, h, i, j);
}

/* Whether any query i0 <= i < i1 of (b, h) may see any key j0 <= j <= j1
 * by the call's window and map (1 when unsure: a partial block's bits are
 * not read): a tile for which this is 0 holds only hidden scores, and its
 * products can be skipped. Costs a search per (query block, key block)
 * the rectangle covers. */
static inline int sdpa__sparse_tile_sees(const sdpa_call *c, int64_t b, int64_t h, int64_t i0,
                                         int64_t i1, int64_t j0, int64_t j1)
{
    const sdpa_mask *m = c->mask;
    if (!m || i1 <= i0 || j1 < j0)
        return i1 > i0 && j1 >= j0;
    if (m->window) {
        const int64_t len_q = m->seq_len_q ? m->seq_len_q[b] : c->desc.Sq;
        const int64_t len_kv = m->seq_len_kv ? m->seq_len_kv[b] : c->desc.Skv;
        int64_t lo, hi, lo_last, hi_last;
        sdpa__window_keys(m->window, i0, len_kv - len_q, &lo, &hi);
        sdpa__window_keys(m->window, i1 - 1, len_kv - len_q, &lo_last, &hi_last);
        if (j1 < lo || j0 > hi_last)
            return 0;
    }
    const sdpa_block_map *bm = m->blocks;
    if (!bm)
        return 1;
    for (int64_t qb = i0 / bm->block_q; qb <= (i1 - 1) / bm->block_q; qb++) {
        const int64_t row = sdpa__map_row(bm, b, h, qb);
        for (int64_t kb = j0 / bm->block_kv; kb <= j1 / bm->block_kv; kb++)
            if ((bm->full_count && sdpa__map_find(bm->full_index + row * bm->index_stride,
                                                  bm->full_count[row], kb) >= 0) ||
                (bm->partial_count && sdpa__map_find(bm->partial_index + row * bm->index_stride,
                                                     bm->partial_count[row], kb) >= 0))
                return 1;
    }
    return 0;
}

/*
 * The map read by key blocks (sdpa.h asks the library to build this
 * transpose for the backward pass, which walks keys outermost): for map
 * row group g = (map batch, map head), as sdpa__map_row numbers them, and
 * key block kb, the query blocks whose lists hold kb (FULL or PARTIAL),
 * ascending, are q[start[g (kv_blocks + 1) + kb] .. start[... + kb + 1]).
 * One allocation (free()), 8 bytes per (group, key block) and 4 per
 * listed block: what the map itself costs. NULL when out of memory.
 */
typedef struct sdpa_map_by_keys {
    int64_t kv_blocks;
    int64_t *start; /* [groups][kv_blocks + 1], offsets into q */
    int32_t *q;     /* [listed blocks] query blocks            */
} sdpa_map_by_keys;

sdpa_map_by_keys *sdpa__map_by_keys(const sdpa_block_map *m);

/* The offsets of (b, h)'s row group: its key block kb's query blocks are
 * q[st[kb] .. st[kb + 1]). */
static inline const int64_t *sdpa__map_by_keys_of(const sdpa_map_by_keys *t,
                                                  const sdpa_block_map *m, int64_t b, int64_t h)
{
    return t->start + sdpa__map_row(m, b, h, 0) / m->q_blocks * (t->kv_blocks + 1);
}

#endif
