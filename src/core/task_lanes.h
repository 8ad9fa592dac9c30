/*
 * task_lanes.h - how a parallel region's tasks reach its workers (pool.c's
 * own threads, openmp_host.c's team): dealt out in turn, worker w of n
 * owning tasks w, w + n, w + 2n, ..., each worker's share claimed through
 * its own counter; a worker that has run out of its own claims the next
 * task of another's (the next worker's first), until every share is out.
 *
 * Why not one counter for all, as before: which worker ran a task then
 * depended on timing, so a call repeated on the same tensors (a
 * benchmark's loop; a layer called again while its K and V still sit in
 * L2) found half of them in the other core's L2. Dealt, a worker runs the same tasks call after call while
 * the cores keep pace: one query against 77 keys x 24 heads, batch 2, f32
 * D 128 (3.8 MB of K and V, half in each core's 2 MB L2), took 0.66-0.83x
 * the time from Python, on torch's OpenMP team or libsdpa's own workers
 * (from 0.78-0.85x torch's SDPA to 1.10-1.18x), and 0.91x in C (bf16
 * 0.87x) alternating with the old build, whose calls move the data too;
 * long, causal and short-key rows level (Emerald Rapids VM, bench/results/
 * 2026-12-06-task-lanes-ab-emr.txt, ...-python-calls-ab-emr.txt).
 * Claiming from the others keeps what the one counter gave: a worker that
 * drew cheap tasks (causal rows near the top) or started late (asleep, or
 * a host's team member busy elsewhere) takes others' work, so no region
 * waits on a worker that never comes. What it costs: a 4 KB table per
 * region (SDPA_TASK_LANES lanes of 64 bytes, each counter on its own
 * line); and with 2 workers, tasks whose costs alternate (a head cut into
 * a big and a small task) all land big on one worker until it is robbed:
 * flash_split_make evens a head's tasks for that (SDXL's 77-key row was
 * 1.05x slower before it did).
 */
#ifndef SDPA_TASK_LANES_H
#define SDPA_TASK_LANES_H

#include <stdatomic.h>
#include <stdint.h>

#include "sdpa.h" /* sdpa_task_body */

#define SDPA_TASK_LANES 64 /* workers past this share lanes (w % 64): still correct */

/* 64 bytes a lane, so no two counters share a cache line (whatever the
 * table's alignment: the pool's lives in calloc's memory, 16-aligned) */
typedef struct sdpa_task_lane {
    _Atomic int64_t next; /* how many of the lane's tasks were claimed */
    char pad[64 - sizeof(int64_t)];
} sdpa_task_lane;

typedef struct sdpa_task_lanes {
    int64_t n_tasks; /* read by every claim: on a line no counter shares */
    int ways;        /* lanes in use: min(workers, SDPA_TASK_LANES) */
    char pad[64 - sizeof(int64_t) - sizeof(int)];
    sdpa_task_lane lane[SDPA_TASK_LANES];
} sdpa_task_lanes;

/* A region of n_tasks for `workers` workers; before any worker claims
 * (the region's publication orders these stores before the claims). */
static inline void sdpa__task_lanes_start(sdpa_task_lanes *tl, int workers, int64_t n_tasks)
{
    tl->ways = workers < SDPA_TASK_LANES ? (workers < 1 ? 1 : workers) : SDPA_TASK_LANES;
    tl->n_tasks = n_tasks;
    for (int i = 0; i < tl->ways; i++)
        atomic_store_explicit(&tl->lane[i].next, 0, memory_order_relaxed);
}

/* Runs worker w's tasks, then whatever the other lanes still hold. */
static inline void sdpa__task_lanes_drain(sdpa_task_lanes *tl, int w,
                                          sdpa_task_body fn, void *arg)
{
    const int ways = tl->ways, own = w % ways;
    for (int k = 0; k < ways; k++) {
        const int l = (own + k) % ways;
        int64_t t;
        while ((t = l + ways * atomic_fetch_add_explicit(&tl->lane[l].next, 1,
                                                         memory_order_relaxed)) < tl->n_tasks)
            fn(arg, t, w);
    }
}

#endif
