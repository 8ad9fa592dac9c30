/*
 * flash_sparse.h - windows and block maps (sdpa.h) on the tiled kernels:
 * included by flash_run.h after flash_tiled.h, whose packing,
 * micro-kernel and online softmax it reuses.
 *
 * A task is one (batch, query head, map query block): block_q rows (128
 * for a window without a map; up to SPARSE_ROWS when consecutive map rows
 * list the same blocks without bits), held as resident query blocks
 * while the key blocks it lists stream past. Only listed key blocks
 * are packed and multiplied; a FULL one is never masked unless the call's
 * own causal, window, key or general mask crosses it (one comparison per
 * tile decides), a PARTIAL one has its bits applied. A window without a
 * map visits the keys between its first row's lowest and its last row's
 * highest key. Tasks are handed out in decreasing order of their listed
 * blocks (largest first), so a map whose rows differ in length (canvas
 * edges, text rows) still balances across threads.
 *
 * Costs beyond the dense path: the task order (8 bytes per task), and per
 * masked tile one pass over its scores.
 */
#ifndef SDPA_FLASH_SPARSE_H
#define SDPA_FLASH_SPARSE_H

#include "../core/sparse.h"
#include "../core/alloc.h"

/* The window-only task's rows and key blocks; the most rows of a task:
 * consecutive map rows with the same lists and no bits (a FULL-only map,
 * STA's tiles of three blocks) share their packed K/V blocks as one task
 * of up to SPARSE_ROWS rows, a whole number of query blocks of every
 * kernel (48 or 24 rows): 128-row tasks left a third block of 32 rows,
 * and ran a FULL-only map at 0.95x the dense kernel. */
#define SPARSE_BQ 128
#define SPARSE_ROWS 384

typedef struct sparse_job {
    const sdpa_call *c;
    workspace *ws;
    int64_t block_q, n_qblocks; /* map query blocks per (b, h)                 */
    int64_t *order;             /* first map rows of the tasks, most work first */
    uint8_t *group;             /* per map row: the rows of the task it leads   */
    int64_t n_tasks;
} sparse_job;

static int sparse_applies(const sdpa_call *c)
{
    return c->mask && (c->mask->window || c->mask->blocks);
}

/* Keys lo .. hi (inclusive) the window admits to query i of the task
 * (whole range without a window). */
static inline void sparse_window(const sdpa_call *c, int64_t off, int64_t i, int64_t *lo,
                                 int64_t *hi)
{
    if (c->mask->window)
        sdpa__window_keys(c->mask->window, i, off, lo, hi);
    else
        *lo = INT64_MIN, *hi = INT64_MAX;
}

/*
 * The masks of a sparse tile (keys j0 .. j0 + bk, rows i0 .. i0 + rows):
 * causal, window, the partial block's bits (entry n of map row `row`,
 * whose first row is i_map), key and general masks.
 */
static void sparse_mask_tile(const sdpa_call *c, float *st, const flash_task *tk, int64_t off,
                             int64_t i0, int rows, int64_t j0, int bk, int64_t row, int64_t n,
                             int64_t i_map)
{
    const sdpa_mask *mk = c->mask;
    if (tk->causal && j0 + bk - 1 > i0 + tk->offset)
        mask_tile(st, bk, NULL, j0, i0, tk->offset);
    if (mk->window) {
        const sdpa_window *wn = mk->window;
        for (int j = 0; j < bk; j++) {
            /* row r sees key j0 + j when lo(i0 + r) <= j0 + j <= hi(i0 + r) */
            float *col = st + (ptrdiff_t)j * BQ;
            const int64_t kj = j0 + j;
            int64_t r_min = 0, r_max = rows - 1;
            if (wn->right >= 0 && kj - off - wn->right - i0 > r_min)
                r_min = kj - off - wn->right - i0;
            if (wn->left >= 0 && kj - off + wn->left - i0 < r_max)
                r_max = kj - off + wn->left - i0;
            for (int r = 0; r < rows; r++)
                if (r < r_min || r > r_max)
                    col[r] = -INFINITY;
        }
    }
    if (n >= 0 && mk->blocks->partial_bits) {
        /* row by row, only the hidden keys' scores are touched (a row's
         * bits are block_kv / 64 whole words): the cost is one store per
         * hidden score, not a bit test per score */
        const sdpa_block_map *m = mk->blocks;
        const int wpr = m->block_kv / 64, c0 = (int)(j0 % m->block_kv);
        const uint64_t *bits = m->partial_bits + (row * m->index_stride + n) * sdpa__map_words(m);
        for (int r = 0; r < rows; r++) {
            const uint64_t *rw = bits + (i0 + r - i_map) * wpr;
            for (int wi = 0; wi < wpr; wi++) {
                const int lo = c0 - 64 * wi > 0 ? c0 - 64 * wi : 0;
                const int hi = c0 + bk - 64 * wi < 64 ? c0 + bk - 64 * wi : 64;
                if (lo >= hi)
                    continue;
                const uint64_t cols = (hi == 64 ? ~(uint64_t)0 : ((uint64_t)1 << hi) - 1) &
                                      ~(((uint64_t)1 << lo) - 1);
                for (uint64_t hidden = ~rw[wi] & cols; hidden; hidden &= hidden - 1) {
                    const int j = 64 * wi + __builtin_ctzll(hidden) - c0;
                    st[(ptrdiff_t)j * BQ + r] = -INFINITY;
                }
            }
        }
    }
    if (mk->key) {
        const uint8_t *key = mk->key + tk->b * mk->key_stride[0];
        for (int j = 0; j < bk; j++)
            if (!key[(j0 + j) * mk->key_stride[1]])
                for (int r = 0; r < rows; r++)
                    st[(ptrdiff_t)j * BQ + r] = -INFINITY;
    }
    if (mk->general)
        mask_tile_general(st, bk, NULL, j0, i0, rows, mk, tk->b, tk->h);
}

/* Whether any of rows i0 .. i0 + rows sees any of keys j0 .. j0 + bk by
 * the bits of partial entry n of map row `row` (whose first row is
 * i_map): a kernel block none of whose rows sees the tile skips it. */
static int sparse_bits_any(const sdpa_block_map *m, int64_t row, int64_t n, int64_t i0, int rows,
                           int64_t j0, int bk, int64_t i_map)
{
    const int wpr = m->block_kv / 64, c0 = (int)(j0 % m->block_kv);
    const uint64_t *bits = m->partial_bits + (row * m->index_stride + n) * sdpa__map_words(m);
    for (int wi = 0; wi < wpr; wi++) {
        const int lo = c0 - 64 * wi > 0 ? c0 - 64 * wi : 0;
        const int hi = c0 + bk - 64 * wi < 64 ? c0 + bk - 64 * wi : 64;
        if (lo >= hi)
            continue;
        const uint64_t cols =
            (hi == 64 ? ~(uint64_t)0 : ((uint64_t)1 << hi) - 1) & ~(((uint64_t)1 << lo) - 1);
        uint64_t any = 0;
        for (int r = 0; r < rows; r++)
            any |= bits[(i0 + r - i_map) * wpr + wi];
        if (any & cols)
            return 1;
    }
    return 0;
}

/* Keys j0 .. j0 + bk, for every resident query block of the task; the
 * rows of the block visited next (keys nj0 .. nj0 + nbk; nbk 0: none)
 * are asked for a share per query block meanwhile, as task_fn does: with
 * 12 heads in [B, S, H, D] sparse calls took 0.90-0.96x the time in f32,
 * 0.92-0.98x in bf16, one head level (Zen 4, bench/results/
 * 2026-12-05-sparse-kv-prefetch-ab-zen4.txt). */
static void sparse_keys(const sdpa_call *c, const workspace *w, const flash_task *tk,
                        int64_t off, int64_t i_map, int64_t i_end, int64_t j0, int bk, int64_t row,
                        int64_t n, int64_t nj0, int nbk)
{
    const sdpa_mask *mk = c->mask;
    const int64_t D = c->desc.D;
    const kv_tile kt = load_kv(c, w, tk, NULL, j0, bk, 1);
    for (int q = 0; q < tk->nqb; q++) {
        const qblock *qb = &w->qb[q];
        const int64_t i0 = i_map + (int64_t)q * BQ;
        if (nbk > 0) {
            flash_prefetch_kv(c, tk, NULL, nj0, nbk, D, q, tk->nqb);
        }
        const int rows = flash_block_rows(i_end, i0, BQ);
        const int64_t i_last = i0 + rows - 1;
        if (tk->causal && j0 > i_last + tk->offset)
            continue; /* none of these keys is visible to this block */
        int64_t lo_first, hi_first, lo_last, hi_last;
        sparse_window(c, off, i0, &lo_first, &hi_first);
        sparse_window(c, off, i_last, &lo_last, &hi_last);
        if (j0 > hi_last || j0 + bk - 1 < lo_first)
            continue;
        if (n >= 0 && mk->blocks->partial_bits &&
            !sparse_bits_any(mk->blocks, row, n, i0, rows, j0, bk, i_map))
            continue; /* the block's bits show these rows none of its keys */
        const int masked = (n >= 0 && mk->blocks->partial_bits) || mk->key || mk->general ||
                           (tk->causal && j0 + bk - 1 > i0 + tk->offset) || j0 < lo_last ||
                           j0 + bk - 1 > hi_first;
        const int qv = (rows + VL - 1) / VL;
        vec mx[QV];
        vec *mxp = scores_max(c, w, &kt, qb, bk, qv, masked, mx);
        if (masked)
            sparse_mask_tile(c, w->st, tk, off, i0, rows, j0, bk, row, n, i_map);
        softmax_tile(w->st, bk, qb, D, qv, mxp, score_scale(c));
        values(c, w, &kt, qb, bk, qv, 1);
    }
}

/* The task's coordinates: (b, h) and the map query block's rows. */
static flash_task sparse_task_make(const sparse_job *jb, int64_t task, int64_t *i_end)
{
    const sdpa_call *c = jb->c;
    const sdpa_call_desc *d = &c->desc;
    flash_task t;
    const int64_t bh = task / jb->n_qblocks, qb = task % jb->n_qblocks, rows = jb->group[task];
    t.b = bh / d->Hq, t.h = bh % d->Hq, t.hk = t.h / (d->Hq / d->Hkv);
    t.group = 1, t.Sq = d->Sq;
    t.causal = c->causal != SDPA_CAUSAL_NONE;
    int64_t len_kv;
    sdpa__seq_lens(c, t.b, &t.len_q, &len_kv);
    t.offset = sdpa_causal_offset(c->causal, t.len_q, len_kv);
    t.i_first = qb * jb->block_q;
    *i_end = t.i_first + rows * jb->block_q < d->Sq ? t.i_first + rows * jb->block_q : d->Sq;
    t.nqb = (int)((*i_end - t.i_first + BQ - 1) / BQ);
    const int64_t real_end = *i_end < t.len_q ? *i_end : t.len_q; /* rows past len_q: padding */
    t.kv_end = real_end <= t.i_first
                   ? 0
                   : sdpa_causal_visible_keys(c->causal, real_end - 1, t.len_q, len_kv);
    return t;
}

/* The keys any row of the task (rows i_first .. i_end) may see, [k_lo,
 * k_hi), and the window's alignment off (bottom-right, real lengths). */
static void sparse_key_range(const sdpa_call *c, const flash_task *tk, int64_t i_end,
                             int64_t *off, int64_t *k_lo, int64_t *k_hi)
{
    int64_t len_q, len_kv, lo, hi;
    sdpa__seq_lens(c, tk->b, &len_q, &len_kv);
    *off = len_kv - len_q;
    *k_lo = 0, *k_hi = tk->kv_end;
    sparse_window(c, *off, tk->i_first, &lo, &hi);
    *k_lo = lo > *k_lo ? lo : *k_lo;
    sparse_window(c, *off, i_end - 1, &lo, &hi);
    *k_hi = hi < INT64_MAX && hi + 1 < *k_hi ? hi + 1 : *k_hi;
}

/* The key blocks a task visits, in ascending key order: SPARSE_BQ keys at
 * a time over [k_lo, k_hi) for a window without a map, else the map row's
 * FULL and PARTIAL lists merged, each block cut to [k_lo, k_hi) (a block
 * cut to nothing is passed over). */
typedef struct sparse_walk {
    const sdpa_block_map *m;
    int64_t k_lo, k_hi, j;     /* j: the next window block's first key */
    const int32_t *f, *p;      /* the map row's lists, nf and np long  */
    int32_t nf, np, x, y;
} sparse_walk;

/* The next block: keys [*j0, *j1), *n its PARTIAL entry (-1: FULL or no
 * map); returns 0 when there is none. */
static int sparse_walk_next(sparse_walk *it, int64_t *j0, int64_t *j1, int64_t *n)
{
    if (!it->m) {
        if (it->j >= it->k_hi)
            return 0;
        *j0 = it->j, *j1 = it->j + SPARSE_BQ < it->k_hi ? it->j + SPARSE_BQ : it->k_hi, *n = -1;
        it->j = *j1;
        return 1;
    }
    while (it->x < it->nf || it->y < it->np) {
        const int partial = it->x >= it->nf || (it->y < it->np && it->p[it->y] < it->f[it->x]);
        const int64_t kb = partial ? it->p[it->y] : it->f[it->x];
        *n = partial ? it->y++ : (it->x++, -1);
        *j0 = kb * it->m->block_kv > it->k_lo ? kb * it->m->block_kv : it->k_lo;
        *j1 = (kb + 1) * it->m->block_kv < it->k_hi ? (kb + 1) * it->m->block_kv : it->k_hi;
        if (*j0 < *j1) /* j0 moved: the window's start inside the block; bits stay by key */
            return 1;
    }
    return 0;
}

static void sparse_task_fn(void *arg, int64_t slot, int worker)
{
    const sparse_job *jb = arg;
    const sdpa_call *c = jb->c;
    const workspace *w = &jb->ws[worker];
    int64_t i_end;
    const flash_task tk = sparse_task_make(jb, jb->order[slot], &i_end);
    const int64_t D = c->desc.D, i_map = tk.i_first;
    int64_t off;
    sparse_walk it = {c->mask->blocks, 0, 0, 0, NULL, NULL, 0, 0, 0, 0};
    sparse_key_range(c, &tk, i_end, &off, &it.k_lo, &it.k_hi);
    it.j = it.k_lo;
    int64_t row = -1;
    if (it.m) {
        row = sdpa__map_row(it.m, tk.b, tk.h, i_map / it.m->block_q);
        it.nf = it.m->full_count ? it.m->full_count[row] : 0;
        it.np = it.m->partial_count ? it.m->partial_count[row] : 0;
        it.f = it.nf ? it.m->full_index + row * it.m->index_stride : NULL;
        it.p = it.np ? it.m->partial_index + row * it.m->index_stride : NULL;
    }
    int64_t j0, j1, n;
    int more = sparse_walk_next(&it, &j0, &j1, &n);
    if (more) { /* the first block's rows while Q is loaded */
        flash_prefetch_kv(c, &tk, NULL, j0, (int)(j1 - j0), D, 0, 1);
    }
    for (int q = 0; q < tk.nqb; q++) {
        const int64_t i0 = i_map + (int64_t)q * BQ;
        load_q(c, w, &w->qb[q], &tk, i0, flash_block_rows(i_end, i0, BQ));
        memset(w->qb[q].ot, 0, sizeof(float) * (size_t)D * BQ);
    }
    while (more) {
        int64_t nj0 = 0, nj1 = 0, nn = -1;
        const int next = sparse_walk_next(&it, &nj0, &nj1, &nn);
        sparse_keys(c, w, &tk, off, i_map, i_end, j0, (int)(j1 - j0), row, n, nj0,
                    next ? (int)(nj1 - nj0) : 0);
        j0 = nj0, j1 = nj1, n = nn, more = next;
    }
    for (int q = 0; q < tk.nqb; q++) {
        const int64_t i0 = i_map + (int64_t)q * BQ;
        store_out(c, w, &w->qb[q], &tk, i0, flash_block_rows(i_end, i0, BQ));
    }
}

/* Listed key blocks of task t (keys in window-only calls): its cost. */
static int64_t sparse_cost(const sparse_job *jb, int64_t t)
{
    const sdpa_call *c = jb->c;
    const sdpa_block_map *m = c->mask->blocks;
    int64_t i_end;
    const flash_task tk = sparse_task_make(jb, t, &i_end);
    if (m) {
        const int64_t row = sdpa__map_row(m, tk.b, tk.h, tk.i_first / m->block_q);
        return ((m->full_count ? m->full_count[row] : 0) +
                (m->partial_count ? m->partial_count[row] : 0)) *
               jb->group[t];
    }
    int64_t off, k_lo, k_hi;
    sparse_key_range(c, &tk, i_end, &off, &k_lo, &k_hi);
    return k_hi > k_lo ? (k_hi - k_lo + SPARSE_BQ - 1) / SPARSE_BQ : 0;
}

/* Whether map rows r and r + 1 may run as one task: the same lists, no bits. */
static int sparse_rows_alike(const sdpa_block_map *m, int64_t r)
{
    const int32_t *cnt[2] = {m->full_count, m->partial_count};
    const int32_t *idx[2] = {m->full_index, m->partial_index};
    for (int l = 0; l < 2; l++) {
        if (!cnt[l])
            continue;
        if (cnt[l][r] != cnt[l][r + 1] || (l == 1 && cnt[l][r] > 0 && m->partial_bits) ||
            memcmp(idx[l] + r * m->index_stride, idx[l] + (r + 1) * m->index_stride,
                   sizeof(int32_t) * (size_t)cnt[l][r]) != 0)
            return 0;
    }
    return 1;
}

/* The tasks (groups of alike map rows, sparse_rows_alike) in decreasing
 * cost by a counting sort (a cost is listed blocks x rows of blocks, at
 * most (Skv / 64 + 1) SPARSE_ROWS / 64). */
static sdpa_status sparse_order(sparse_job *jb)
{
    const sdpa_call_desc *d = &jb->c->desc;
    const sdpa_block_map *m = jb->c->mask->blocks;
    const int64_t n_rows = d->B * d->Hq * jb->n_qblocks;
    const int64_t max_cost = (d->Skv / 64 + 2) * (SPARSE_ROWS / 64) + 1;
    const int max_group = m ? SPARSE_ROWS / m->block_q : 1;
    int64_t *cost = sdpa__malloc(sizeof *cost * (size_t)(n_rows + max_cost + 1));
    jb->order = sdpa__malloc(sizeof *jb->order * (size_t)n_rows);
    jb->group = sdpa__malloc((size_t)n_rows);
    if (!cost || !jb->order || !jb->group) {
        free(cost), free(jb->order), free(jb->group);
        jb->order = NULL, jb->group = NULL;
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "%s: cannot allocate the order of %lld tasks",
                          KERNEL_NAME, (long long)n_rows);
    }
    jb->n_tasks = 0;
    for (int64_t bh = 0; bh < d->B * d->Hq; bh++)
        for (int64_t qb = 0; qb < jb->n_qblocks;) {
            int n = 1;
            if (m) {
                const int64_t r0 = sdpa__map_row(m, bh / d->Hq, bh % d->Hq, qb);
                while (n < max_group && qb + n < jb->n_qblocks &&
                       sparse_rows_alike(m, r0 + n - 1))
                    n++;
            }
            jb->group[bh * jb->n_qblocks + qb] = (uint8_t)n;
            jb->order[jb->n_tasks++] = bh * jb->n_qblocks + qb;
            qb += n;
        }
    int64_t *start = cost + n_rows; /* [max_cost + 1] */
    memset(start, 0, sizeof *start * (size_t)(max_cost + 1));
    for (int64_t t = 0; t < jb->n_tasks; t++) {
        cost[t] = sparse_cost(jb, jb->order[t]);
        cost[t] = cost[t] < max_cost ? cost[t] : max_cost - 1;
        start[max_cost - 1 - cost[t]]++;
    }
    for (int64_t k = 0, sum = 0; k <= max_cost; k++) {
        const int64_t n = start[k];
        start[k] = sum, sum += n;
    }
    int64_t *tmp = sdpa__malloc(sizeof *tmp * (size_t)(jb->n_tasks ? jb->n_tasks : 1));
    if (!tmp) {
        free(cost);
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "%s: cannot allocate the order of %lld tasks",
                          KERNEL_NAME, (long long)jb->n_tasks);
    }
    for (int64_t t = 0; t < jb->n_tasks; t++)
        tmp[start[max_cost - 1 - cost[t]]++] = jb->order[t];
    memcpy(jb->order, tmp, sizeof *tmp * (size_t)jb->n_tasks);
    free(tmp), free(cost);
    return SDPA_OK;
}

#endif
