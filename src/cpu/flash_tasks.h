/*
 * flash_tasks.h - how the tiled CPU kernels (flash_tiled.h, cpu.amx) cut a
 * call into tasks: one task is a group of query blocks of one (batch,
 * head), so that a packed K/V block is shared by the group's query blocks,
 * and the pool hands tasks out one at a time (causal and ragged shapes
 * balance themselves).
 *
 * Short grouped-query calls (Sq up to two query blocks, Hq = g Hkv with
 * g > 1) are cut by KV head instead: the g query heads that read one KV
 * head form one row space of g Sq rows (row r is query r % Sq of head
 * hk g + r / Sq), so K and V are packed once for all of them and the
 * query blocks' lanes are filled (26 queries in a 48-lane block used
 * 54% of it; 8 heads x 26 fill 4.3 blocks). Only where every mask is
 * per batch entry or per key (no causal, no general mask): flash_row maps
 * a row back.
 */
#ifndef SDPA_FLASH_TASKS_H
#define SDPA_FLASH_TASKS_H

#include "../core/core.h"
#include "../core/causal.h"
#include "../core/convert.h"
#include "mask_row.h"

typedef struct flash_split {
    int qb_per_task;         /* query blocks sharing one packed K/V block */
    int64_t n_qblocks;       /* per row space                             */
    int64_t tasks_per_head;  /* per row space                             */
    int group;               /* query heads per row space (1, or Hq/Hkv)  */
    int64_t rows;            /* rows of a row space: group * Sq           */
} flash_split;

/* Whether a call is cut by KV head (see the top of the file). */
static inline int flash_groups_heads(const sdpa_call *c, int bq)
{
    const sdpa_call_desc *d = &c->desc;
    return d->Hq > d->Hkv && d->Sq <= 2 * (int64_t)bq && c->causal == SDPA_CAUSAL_NONE &&
           !(c->mask && c->mask->general);
}

/* Share each packed K/V block among up to max_qb query blocks of bq rows
 * (a power of two; then evened out over the head's tasks), but keep at least per_thread tasks per thread so that
 * odd shapes still balance (4 for long key ranges; the short-key path
 * takes 2: its tasks repack K/V each, and a 26-token grouped-query call
 * ran 12% faster in 4 tasks than in 10). grouped: cut by KV head
 * (flash_groups_heads). */
static inline flash_split flash_split_make(const sdpa_call_desc *d, int bq, int threads,
                                           int grouped, int max_qb, int per_thread)
{
    const int group = grouped ? (int)(d->Hq / d->Hkv) : 1;
    flash_split s = {1, (group * d->Sq + bq - 1) / bq, 0, group, group * d->Sq};
    const int64_t heads = d->B * d->Hq / group;
    while (s.qb_per_task < max_qb &&
           heads * ((s.n_qblocks + 2 * s.qb_per_task - 1) / (2 * s.qb_per_task)) >=
               (int64_t)per_thread * threads)
        s.qb_per_task *= 2;
    s.tasks_per_head = (s.n_qblocks + s.qb_per_task - 1) / s.qb_per_task;
    /* a head's tasks of equal size: 86 blocks in two tasks of 43, not 64
     * and 22 (SDXL's 4096 queries at 48 rows a block), whose big ones all
     * fell to one worker once the pool dealt tasks in turn (task_lanes.h) */
    s.qb_per_task = (int)((s.n_qblocks + s.tasks_per_head - 1) / s.tasks_per_head);
    s.tasks_per_head = (s.n_qblocks + s.qb_per_task - 1) / s.qb_per_task;
    return s;
}

/* One task's coordinates. Query block q of the task starts at row
 * i_first + q * bq; keys at or past kv_end are masked for all its rows. */
typedef struct flash_task {
    int64_t b, h, hk;  /* batch, query head, its KV head          */
    int causal;
    int64_t offset;    /* causal: key j visible to row i if j <= i + offset */
    int64_t i_first;
    int nqb;           /* query blocks in this task               */
    int64_t kv_end;
    int64_t len_q;     /* real queries of batch entry b (sdpa.h's
                        * seq_len_q; Sq without one): rows at or past
                        * it are padding */
    int group;         /* query heads in the row space (h is its first) */
    int64_t Sq;
} flash_task;

/* Head and query of row r of the task's row space. */
static inline void flash_row(const flash_task *t, int64_t r, int64_t *h, int64_t *i)
{
    if (t->group == 1)
        *h = t->h, *i = r;
    else
        *h = t->h + r / t->Sq, *i = r % t->Sq;
}

static inline flash_task flash_task_make(const sdpa_call *c, const flash_split *s, int bq,
                                         int64_t task)
{
    const sdpa_call_desc *d = &c->desc;
    flash_task t;
    const int64_t bh = task / s->tasks_per_head, qb0 = task % s->tasks_per_head * s->qb_per_task;
    const int64_t spaces = d->Hq / s->group; /* row spaces per batch entry */
    t.b = bh / spaces, t.h = bh % spaces * s->group, t.hk = t.h / (d->Hq / d->Hkv);
    t.group = s->group, t.Sq = d->Sq;
    t.causal = c->causal != SDPA_CAUSAL_NONE;
    /* Sequence lengths bound the keys and align causal on the real
     * lengths; without them they are Sq and Skv. */
    int64_t len_kv;
    sdpa__seq_lens(c, t.b, &t.len_q, &len_kv);
    t.offset = sdpa_causal_offset(c->causal, t.len_q, len_kv);
    t.nqb = (int)(s->n_qblocks - qb0 < s->qb_per_task ? s->n_qblocks - qb0 : s->qb_per_task);
    t.i_first = qb0 * bq;
    if (s->group > 1) { /* no causal here; rows of every head: padding only when len_q is 0 */
        t.kv_end = t.len_q > 0 ? len_kv : 0;
        return t;
    }
    const int64_t i_end = (qb0 + t.nqb) * bq < t.len_q ? (qb0 + t.nqb) * bq : t.len_q;
    t.kv_end = i_end <= t.i_first ? 0 : len_kv; /* a task of padding rows sees nothing */
    if (t.kv_end > 0) /* what the task's last real row sees */
        t.kv_end = sdpa_causal_visible_keys(c->causal, i_end - 1, t.len_q, len_kv);
    return t;
}

/*
 * The keys a task reads under a key mask: the visible ones below kv_end,
 * gathered into idx[] (ascending; Skv entries of room), so that K/V
 * blocks are packed from visible keys only and a hidden key costs one
 * byte read, not a column of scores. Returns how many; without a key
 * mask the keys are 0..kv_end and idx is not touched.
 */
static inline int64_t flash_task_keys(const sdpa_call *c, const flash_task *t, int64_t *idx)
{
    const sdpa_mask *mk = c->mask;
    if (!mk || !mk->key)
        return t->kv_end;
    const uint8_t *key = mk->key + t->b * mk->key_stride[0];
    int64_t n = 0;
    for (int64_t j = 0; j < t->kv_end; j++)
        if (key[j * mk->key_stride[1]])
            idx[n++] = j;
    return n;
}

/* Key number of the p-th key a task reads (idx NULL: keys are 0..kv_end). */
static inline int64_t flash_key(const int64_t *idx, int64_t p) { return idx ? idx[p] : p; }

/* Rows of the query block starting at row i0 of a row space of `rows`
 * (flash_split.rows; the last block may be short). */
static inline int flash_block_rows(int64_t rows, int64_t i0, int bq)
{
    return (int)(rows - i0 < bq ? rows - i0 : bq);
}

/* Touches the cache lines of rows i0 .. i0 + rows of the task's row space
 * in t (Q to read, or the output with write intent) ahead of their use:
 * one head's rows stride Hq D elements, which the hardware prefetchers
 * follow poorly, and a short key range computes too little to hide the
 * misses (cpu.amx on SDXL's 77-key cross attention: 9-14% of its time). */
static inline void flash_prefetch_rows(const sdpa_tensor *t, const flash_task *tk, int64_t i0,
                                       int rows, int64_t D, int write)
{
    if (t->stride[3] != 1)
        return; /* strided head dim: left to the hardware */
    /* sdpa__elem_bytes, not sdpa_dtype_size: a call through the PLT per
     * row was 3% of cpu.amx's time on a 77-key cross-attention row */
    const int64_t esz = sdpa__elem_bytes(t->dtype), bytes = D * esz;
    for (int r = 0; r < rows; r++) {
        int64_t h, i;
        flash_row(tk, i0 + r, &h, &i);
        const char *p = (const char *)t->data + sdpa__offset(t, tk->b, i, h, 0) * esz;
        /* the T1 hint (PREFETCHT1: into L2), where a block's 32-64 rows
         * of T0 requests had waited for L1's few fill buffers: 0.96-0.985x
         * the time of cpu.amx, cpu.avx512 and cpu.avx2 on short-key rows,
         * long rows level (Emerald Rapids; not measured on AMD cores).
         * PREFETCHW for the output rows (needs -mprfchw; the
         * build has none, so `write` asks as a read does) was 1.04-1.07x
         * slower on cpu.amx: bench/results/2026-12-06-prefetch-rows-hint-ab-emr.txt */
        for (int64_t o = 0; o < bytes; o += 64) {
            if (write)
                __builtin_prefetch(p + o, 1, 2);
            else
                __builtin_prefetch(p + o, 0, 2);
        }
    }
}

/* Touches the rows of keys p .. p + n that a task reads (flash_key) of K
 * or V (t) at its KV head, share `part` of `parts` of them, with the T1
 * hint (L2, where the CPU honours it: the block in use stays in L1): the
 * next K/V block's rows, asked for while the current one is in use
 * (flash_prefetch_kv: flash_tiled.h's task_fn, flash_sparse.h). */
static inline void flash_prefetch_keys(const sdpa_tensor *t, const flash_task *tk,
                                       const int64_t *keys, int64_t p, int n, int64_t D, int part,
                                       int parts)
{
    if (t->stride[3] != 1)
        return;
    const int64_t esz = sdpa__elem_bytes(t->dtype), bytes = D * esz;
    const int j0 = n * part / parts, j1 = n * (part + 1) / parts;
    for (int j = j0; j < j1; j++) {
        const char *r = (const char *)t->data +
                        sdpa__offset(t, tk->b, flash_key(keys, p + j), tk->hk, 0) * esz;
        for (int64_t o = 0; o < bytes; o += 64)
            __builtin_prefetch(r + o, 0, 2);
    }
}

/* flash_prefetch_keys for K, then V: what every caller asks for. */
static inline void flash_prefetch_kv(const sdpa_call *c, const flash_task *tk, const int64_t *keys,
                                     int64_t p, int n, int64_t D, int part, int parts)
{
    flash_prefetch_keys(c->k, tk, keys, p, n, D, part, parts);
    flash_prefetch_keys(c->v, tk, keys, p, n, D, part, parts);
}

#endif
