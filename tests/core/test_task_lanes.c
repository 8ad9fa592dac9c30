/*
 * test_task_lanes.c - the pool's deal of a region's tasks (src/core/
 * task_lanes.h): every task runs exactly once whoever turns up,
 *  1. a worker alone (the others never come: asleep, or a host's team
 *     narrower than asked for) runs its own share first, in order, then
 *     the other lanes' in lane order;
 *  2. a worker that comes after the others finished finds nothing;
 *  3. more workers than lanes share lanes (w % SDPA_TASK_LANES);
 *  4. threads racing on one region, tasks of uneven cost, over repeated
 *     regions of different sizes (0, 1, fewer than workers, many).
 * And the pool itself (sdpa__parallel_for on a pool of 3): each task once,
 * on workers 0..2. Which worker runs which task once several race depends
 * on timing, so only 1 and 2 check the deal itself.
 */
#include "support/testlib.h"
#include "core/core.h"
#include "core/task_lanes.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

enum { MAX_TASKS = 1000 };

typedef struct ledger {
    _Atomic int runs[MAX_TASKS];
    int64_t order[MAX_TASKS]; /* single-threaded checks: the order tasks ran in */
    int n_order;
    _Atomic int bad_worker;
    int workers;
} ledger;

static void record(void *arg, int64_t task, int worker)
{
    ledger *g = arg;
    if (task < 0 || task >= MAX_TASKS || worker < 0 || worker >= g->workers) {
        atomic_store(&g->bad_worker, 1);
        return;
    }
    atomic_fetch_add(&g->runs[task], 1);
    if (g->n_order < MAX_TASKS)
        g->order[g->n_order++] = task;
}

static void busy_task(void *arg, int64_t task, int worker)
{
    ledger *g = arg;
    if (task < 0 || task >= MAX_TASKS || worker < 0 || worker >= g->workers) {
        atomic_store(&g->bad_worker, 1);
        return;
    }
    atomic_fetch_add(&g->runs[task], 1);
    for (volatile int spin = 0; spin < (int)(task % 7) * 300; spin++) /* uneven costs */
        ;
}

static int each_once(const ledger *g, int64_t n)
{
    for (int64_t t = 0; t < MAX_TASKS; t++)
        if (atomic_load(&g->runs[t]) != (t < n))
            return 0;
    return 1;
}

static void alone(void)
{
    static sdpa_task_lanes tl;
    static ledger g;
    const int64_t n = 10;
    for (int w = 0; w < 3; w++) {
        memset(&g, 0, sizeof g);
        g.workers = 3;
        sdpa__task_lanes_start(&tl, 3, n);
        sdpa__task_lanes_drain(&tl, w, record, &g);
        CHECK(each_once(&g, n), "worker %d alone: not every task exactly once", w);
        /* its own share (w, w + 3, ...), then lane w + 1's, then lane w + 2's */
        int64_t want[10], k = 0;
        for (int l = 0; l < 3; l++)
            for (int64_t t = (w + l) % 3; t < n; t += 3)
                want[k++] = t;
        CHECK(g.n_order == 10 && !memcmp(g.order, want, sizeof want),
              "worker %d alone: ran %d tasks, first %lld %lld %lld; expected its own share "
              "first, then the next lanes'", w, g.n_order, (long long)g.order[0],
              (long long)g.order[1], (long long)g.order[2]);
        /* 2: the others come too late */
        const int before = g.n_order;
        sdpa__task_lanes_drain(&tl, (w + 1) % 3, record, &g);
        sdpa__task_lanes_drain(&tl, (w + 2) % 3, record, &g);
        CHECK(g.n_order == before, "workers after the last task ran %d more", g.n_order - before);
    }
    /* 3: 70 workers, 64 lanes: worker 69 uses lane 5 and still finds every task */
    memset(&g, 0, sizeof g);
    g.workers = 70;
    sdpa__task_lanes_start(&tl, 70, 300);
    sdpa__task_lanes_drain(&tl, 69, record, &g);
    CHECK(tl.ways == SDPA_TASK_LANES && each_once(&g, 300) && g.order[0] == 5 &&
              g.order[1] == 5 + SDPA_TASK_LANES,
          "70 workers: %d lanes, first tasks %lld %lld (expected 64 lanes, 5 and 69)", tl.ways,
          (long long)g.order[0], (long long)g.order[1]);
    CHECK(!atomic_load(&g.bad_worker), "a task out of range");
}

typedef struct racer {
    sdpa_task_lanes *tl;
    ledger *g;
    int w;
    pthread_barrier_t *go;
} racer;

static void *race(void *raw)
{
    racer *r = raw;
    pthread_barrier_wait(r->go);
    sdpa__task_lanes_drain(r->tl, r->w, busy_task, r->g);
    return NULL;
}

static void racing(void)
{
    static sdpa_task_lanes tl;
    static ledger g;
    const int64_t sizes[] = {0, 1, 3, 997, 64, 1000};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        for (int workers = 1; workers <= 4; workers++) {
            memset(&g, 0, sizeof g);
            g.workers = workers;
            sdpa__task_lanes_start(&tl, workers, sizes[s]);
            pthread_barrier_t go;
            pthread_barrier_init(&go, NULL, (unsigned)workers);
            pthread_t tid[4];
            racer r[4];
            for (int w = 0; w < workers; w++) {
                r[w] = (racer){&tl, &g, w, &go};
                if (w > 0)
                    pthread_create(&tid[w], NULL, race, &r[w]);
            }
            race(&r[0]);
            for (int w = 1; w < workers; w++)
                pthread_join(tid[w], NULL);
            pthread_barrier_destroy(&go);
            CHECK(each_once(&g, sizes[s]) && !atomic_load(&g.bad_worker),
                  "%d workers racing on %lld tasks: not every task exactly once", workers,
                  (long long)sizes[s]);
        }
    }
}

static void pool(void)
{
    sdpa_pool *p = NULL;
    CHECK_STATUS(sdpa__pool_create(3, &p), SDPA_OK);
    if (!p)
        return;
    static ledger g;
    for (int64_t n = 0; n <= MAX_TASKS; n += 111) {
        memset(&g, 0, sizeof g);
        g.workers = 3;
        sdpa__parallel_for(p, n, busy_task, &g);
        CHECK(each_once(&g, n) && !atomic_load(&g.bad_worker),
              "a pool of 3, %lld tasks: not every task exactly once on workers 0..2", (long long)n);
    }
    sdpa__pool_destroy(p);
}

int main(void)
{
    alone();
    racing();
    pool();
    return tl_finish();
}
