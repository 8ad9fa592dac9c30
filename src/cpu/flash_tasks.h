/*
 * flash_tasks.h - how the tiled CPU kernels (flash_tiled.h, cpu.amx) cut a
 * call into tasks: one task is a group of query blocks of one (batch,
 * head), so that a packed K/V block is shared by the group's query blocks,
 * and the pool hands tasks out one at a time (causal and ragged shapes
 * balance themselves).
 */
#ifndef SDPA_FLASH_TASKS_H
#define SDPA_FLASH_TASKS_H

#include "../core/core.h"
#include "mask_row.h"

typedef struct flash_split {
    int qb_per_task;         /* query blocks sharing one packed K/V block */
    int64_t n_qblocks;       /* per head                                  */
    int64_t tasks_per_head;
} flash_split;

/* Share each packed K/V block among up to 4 query blocks of bq rows, but
 * keep at least 4 tasks per thread so that odd shapes still balance. */
static inline flash_split flash_split_make(const sdpa_call_desc *d, int bq, int threads)
{
    flash_split s = {1, (d->Sq + bq - 1) / bq, 0};
    const int64_t heads = d->B * d->Hq;
    while (s.qb_per_task < 4 &&
           heads * ((s.n_qblocks + 2 * s.qb_per_task - 1) / (2 * s.qb_per_task)) >=
               4 * (int64_t)threads)
        s.qb_per_task *= 2;
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
} flash_task;

static inline flash_task flash_task_make(const sdpa_call *c, const flash_split *s, int bq,
                                         int64_t task)
{
    const sdpa_call_desc *d = &c->desc;
    flash_task t;
    const int64_t bh = task / s->tasks_per_head, qb0 = task % s->tasks_per_head * s->qb_per_task;
    t.b = bh / d->Hq, t.h = bh % d->Hq, t.hk = t.h / (d->Hq / d->Hkv);
    t.causal = c->causal != SDPA_CAUSAL_NONE;
    /* Sequence lengths bound the keys and align causal on the real
     * lengths; without them they are Sq and Skv. */
    int64_t len_kv;
    sdpa__seq_lens(c, t.b, &t.len_q, &len_kv);
    t.offset = c->causal == SDPA_CAUSAL_BOTTOM_RIGHT ? len_kv - t.len_q : 0;
    t.nqb = (int)(s->n_qblocks - qb0 < s->qb_per_task ? s->n_qblocks - qb0 : s->qb_per_task);
    t.i_first = qb0 * bq;
    const int64_t i_end = (qb0 + t.nqb) * bq < t.len_q ? (qb0 + t.nqb) * bq : t.len_q;
    t.kv_end = i_end <= t.i_first ? 0 : len_kv; /* a task of padding rows sees nothing */
    if (t.causal && t.kv_end > 0) {
        const int64_t last = i_end - 1 + t.offset;
        t.kv_end = last < 0 ? 0 : (last + 1 < len_kv ? last + 1 : len_kv);
    }
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

/* Rows of the query block starting at i0 (the last one may be short). */
static inline int flash_block_rows(const sdpa_call_desc *d, int64_t i0, int bq)
{
    return (int)(d->Sq - i0 < bq ? d->Sq - i0 : bq);
}

#endif
