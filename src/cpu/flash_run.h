/*
 * flash_run.h - the tiled CPU kernels' entry (tiled_run): which path a
 * call takes (few queries: flash_decode.h; windows and block maps:
 * flash_sparse.h; short key ranges: task_short_fn; else task_fn, both in
 * flash_tiled.h), how its rows are cut into tasks, and the per-thread
 * workspace they run in. The ISA file includes this after its vector
 * vocabulary and micro-kernel choices; it includes the framework and its
 * two paths, each of which depends only on what comes before it.
 */
#include "flash_tiled.h"
#include "flash_decode.h" /* pair mode: its DECODE_PAIRS products, the ISA file's */
#include "flash_sparse.h"
#include "../core/cpu_features.h" /* sdpa__cpu_l2_bytes */

/* Keys up to which the short path runs: K and V packed (2 Skv D floats)
 * and S^T (Skv x BQ) stay within L2 at D <= 128. */
#define SHORT_KEYS 512
static int short_keys(const sdpa_call_desc *d) { return d->Skv <= SHORT_KEYS && d->Skv * d->D <= SHORT_KEYS * 128; }

static sdpa_status tiled_run(const sdpa_backend *self, const sdpa_call *c)
{
    (void)self;
#ifndef TILED_PAIRS
    if (decode_applies(c)) /* few queries per head: flash_decode.h */
        return decode_run(self, c);
#endif
    const sdpa_call_desc *d = &c->desc;
    sdpa_pool *pool = sdpa__pool_for_call(c); /* small calls: the calling thread alone */
    /* the split as for the context's threads, whoever runs the tasks: a
     * share of the call then computes exactly its tasks of the n-thread
     * call (non-finite inputs meet masks task by task: 0 * NaN) */
    const int threads = sdpa__pool_threads(c->pool);
    const int workers = sdpa__pool_workers(pool); /* the workspaces */
    const int64_t D = d->D;
    /* windows and block maps: flash_sparse.h, SPARSE_BQ rows resident */
    const int sparse = sparse_applies(c);
    const int is_short = !sparse && short_keys(d);
    const int64_t kb = is_short ? d->Skv : BK; /* keys packed at once */
    /* K/V that must be converted (f16, bf16) are shared by up to 8 query
     * blocks: each task converts its own, and an f16 call ran at 61% of the
     * ceiling with 4, 67-78% with 8 (4608 tokens, D 128, the Sapphire Rapids
     * VM, noisy). f32 K/V rows are copied, by at least TILED_F32_ROWS
     * query rows (192 by default: 8 blocks of cpu.avx2's 24 rather than 4
     * made long rows 0.94-0.98x the time, short-key rows level, Zen 4,
     * bench/results/2026-12-05-avx2-f32-rows-per-kv-ab-zen4.txt). The
     * split doubles a task's blocks up to the first power of two at or
     * above f32_blocks, where enough tasks are left (flash_split_make). */
    /* (cpu.avx2 sets TILED_F32_ROWS to 288 for a 512 KB L2: Q^T and O^T
     * 288 KB at D 128, with the 128 KB K/V block; and TILED_F32_QO_BYTES
     * to those 288 KB, so that a smaller D gets more rows. cpu.avx512 sets
     * TILED_F32_QO_L2_EIGHTHS: those bytes as eighths of the core's L2,
     * read at run time, since its CPUs' L2 runs from 1 MB (Zen 4/5) to
     * 2 MB (Sapphire and Emerald Rapids).) */
#if defined(TILED_F32_QO_L2_EIGHTHS)
    const int64_t qo_bytes = (int64_t)(sdpa__cpu_l2_bytes() / 8) * TILED_F32_QO_L2_EIGHTHS;
#elif defined(TILED_F32_QO_BYTES)
    const int64_t qo_bytes = TILED_F32_QO_BYTES;
#else
    const int64_t qo_bytes = 0;
#endif
    /* as many rows as qo_bytes of Q^T and O^T hold (8 D bytes a row),
     * from TILED_F32_ROWS up to 4 times it */
    const int64_t qo_rows = qo_bytes / (8 * D);
    const int f32_rows = qo_rows < TILED_F32_ROWS       ? TILED_F32_ROWS
                         : qo_rows > 4 * TILED_F32_ROWS ? 4 * TILED_F32_ROWS
                                                        : (int)qo_rows;
    const int f32_blocks = (f32_rows + BQ - 1) / BQ;
    job jb = {c,
              flash_split_make(d, BQ, threads, !sparse && flash_groups_heads(c, BQ),
                               is_short ? 64 : c->k->dtype == SDPA_F32 ? f32_blocks : 8,
                               is_short ? 2 : 4),
              NULL};
    const int qbs_kept = is_short  ? 1
                         : sparse ? (SPARSE_ROWS + BQ - 1) / BQ
                                  : jb.split.qb_per_task; /* resident query blocks */
    const int64_t heads = d->B * d->Hq / jb.split.group; /* row spaces */
    const size_t per_qb = (size_t)(2 * D * BQ + 2 * BQ);
    /* under a key mask, room for the visible keys of a task (2 floats each) */
    const size_t key_room = c->mask && c->mask->key ? 2 * (size_t)d->Skv : 0;
    const size_t row_room = ((size_t)D + 64 + 15) / 16 * 16; /* keeps what follows aligned */
    const size_t tr_room = (size_t)(VL * d_padded(D));
    /* K and V rooms of whole vectors of keys (V^T's rows, TILED_V_T), so
     * that every room starts on a whole vector (keys: int64_t) and each
     * thread's tiles on a cache line, whatever kb and D */
    const int64_t kbr = (kb + VL - 1) / VL * VL;
    const size_t per = (per_qb * (size_t)qbs_kept + (size_t)(kb * BQ) + (size_t)(2 * kbr * D) +
                        row_room + tr_room + key_room + 15) / 16 * 16;
    /* tiles, then the per-thread descriptors, in the thread's scratch */
    const size_t tiles = per * (size_t)workers * sizeof(float);
    const size_t descs = ((size_t)workers * sizeof *jb.ws + 63) / 64 * 64;
    const size_t n_qbs = (size_t)workers * (size_t)qbs_kept;
    char *base = sdpa__scratch(tiles + descs + n_qbs * sizeof(qblock));
    if (!base)
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes of tiles",
                          KERNEL_NAME, tiles + descs + n_qbs * sizeof(qblock));
    float *mem = (float *)base;
    jb.ws = (workspace *)(base + tiles);
    qblock *qbs = (qblock *)(base + tiles + descs);
    for (int t = 0; t < workers; t++) {
        float *p = mem + per * (size_t)t;
        workspace *w = &jb.ws[t];
        w->qb = qbs + (size_t)t * (size_t)qbs_kept;
        for (int q = 0; q < qbs_kept; q++) {
            w->qb[q].qt = p, p += D * BQ;
            w->qb[q].ot = p, p += D * BQ;
            w->qb[q].m = p, p += BQ;
            w->qb[q].l = p, p += BQ;
        }
        w->st = p, p += kb * BQ;
        w->k = p, p += kbr * D;
        w->v = p, p += kbr * D;
        w->row = p, p += row_room;
        w->tr = p, p += tr_room;
        w->keys = key_room ? (int64_t *)p : NULL;
    }
    if (sparse) {
        const sdpa_block_map *m = c->mask->blocks;
        sparse_job sj = {c, jb.ws, m ? m->block_q : SPARSE_BQ, 0, NULL, NULL, 0};
        sj.n_qblocks = (d->Sq + sj.block_q - 1) / sj.block_q;
        const sdpa_status st = sparse_order(&sj);
        if (st == SDPA_OK)
            sdpa__parallel_for(pool, sj.n_tasks, sparse_task_fn, &sj);
        free(sj.order), free(sj.group);
        sdpa__scratch_release(base);
        return st;
    }
    sdpa__parallel_for(pool, heads * jb.split.tasks_per_head, is_short ? task_short_fn : task_fn,
                       &jb);
    sdpa__scratch_release(base);
    return SDPA_OK;
}
