/*
 * pool.c - a fixed set of worker threads, shared by the contexts of a
 * process that ask for the same width (or private to one context).
 *
 * Kernels split a call into independent tasks (batch x head x query block),
 * dealt out to the workers in turn, a thread that has run out taking
 * others' (task_lanes.h): one that drew cheap tasks (causal rows near the
 * top) simply takes more of them. The calling thread works too, as worker
 * 0. Small calls run inline instead.
 *
 * Waking a sleeping thread costs a futex round trip: 5-20 us on the
 * virtual machines measured here, as long as a whole 26-token attention
 * call. So after a region a worker spins for SPIN_NS on the published
 * generation before it sleeps, and the caller spins on the busy count
 * before it waits: back-to-back calls (a transformer's layers) then start
 * and finish without a system call. What it costs: up to SPIN_NS of one
 * core per worker after the last call of a burst.
 *
 * Several application threads may call into one context at once; their
 * parallel regions take turns on the pool (`submit`), which keeps each
 * region at full width rather than splitting the cores between them.
 * Contexts that ask for it (share_pool) take turns the same way on one
 * process-wide pool of their width (sdpa__pool_acquire), so many contexts
 * keep one set of threads; bench/contexts.c compares the two arrangements.
 *
 * Two pools start no thread at all (libsdpa inside another runtime):
 *  - a host pool hands every region to the caller's parallel-for
 *    (sdpa_context_options.parallel_for: ggml's, OpenMP's, torch's intra-op
 *    pool), whose threads are the workers 0..threads-1;
 *  - a share pool (sdpa_forward_share) is one thread's view of a call cut
 *    into `shares`: kernels split the work exactly as for a pool of that
 *    many threads, and this thread runs the tasks t with t % shares ==
 *    share, in order, as worker 0. Nothing waits on another share, so
 *    there is no barrier to need: a kernel whose second region reads what
 *    other tasks of the first wrote (cpu.amx's shared packing) does not
 *    take shares; flash_decode.h runs a piece's key chunks and their merge
 *    in the one share that owns the piece.
 */
#include "core.h"
#include "task_lanes.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

#define SPIN_NS 50000 /* 50 us */

struct sdpa_pool {
    int threads;
    int share, shares;              /* a share pool: this thread's part (shares > 0) */
    sdpa_parallel_for_fn host_for;  /* a host pool: the caller's parallel-for */
    void *host_user;
    pthread_t *tids;
    pthread_mutex_t submit; /* one parallel region at a time */
    pthread_mutex_t m;
    pthread_cond_t start, done;
    uint64_t generation;   /* under m */
    _Atomic uint64_t published; /* generation, for spinning workers */
    _Atomic int stop;
    _Atomic int busy; /* workers still inside the current region */
    sdpa_task_fn fn;
    void *arg;
    sdpa_task_lanes lanes; /* the region's tasks (n_tasks in it) */
};

typedef struct worker_arg {
    sdpa_pool *pool;
    int index;
} worker_arg;

static void drain(sdpa_pool *p, int worker) { sdpa__task_lanes_drain(&p->lanes, worker, p->fn, p->arg); }

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* What a spinner waits for (acquire loads, so what was written before the
 * release that made it true is visible). */
static int new_region(const sdpa_pool *p, uint64_t seen)
{
    return atomic_load_explicit(&p->published, memory_order_acquire) != seen ||
           atomic_load_explicit(&p->stop, memory_order_relaxed);
}

static int region_done(const sdpa_pool *p, uint64_t unused)
{
    (void)unused;
    return atomic_load_explicit(&p->busy, memory_order_acquire) == 0;
}

/* Spins up to SPIN_NS until ready(p, arg); returns whether it became so.
 * The clock is read every 64 pauses. */
static int spin(const sdpa_pool *p, int (*ready)(const sdpa_pool *, uint64_t), uint64_t arg)
{
    const uint64_t t0 = now_ns();
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if (ready(p, arg))
                return 1;
            CPU_RELAX();
        }
        if (now_ns() - t0 > SPIN_NS)
            return 0;
    }
}

/* Set while this thread runs a task handed to the caller's parallel-for
 * (a host pool): such a thread is the host's and never idles here. */
static _Thread_local int in_host_task;

#define IDLE_HOOKS 4
static _Thread_local void (*idle_hooks[IDLE_HOOKS])(void);

int sdpa__thread_on_idle(void (*fn)(void))
{
    if (in_host_task) /* the kernel drops its state after each task instead */
        return 0;
    for (int i = 0; i < IDLE_HOOKS; i++) {
        if (idle_hooks[i] == fn)
            return 1;
        if (!idle_hooks[i]) {
            idle_hooks[i] = fn;
            return 1;
        }
    }
    return 0;
}

/* A worker about to sleep: what its kernels kept for the next task goes. */
static void run_idle_hooks(void)
{
    for (int i = 0; i < IDLE_HOOKS && idle_hooks[i]; i++) {
        void (*fn)(void) = idle_hooks[i];
        idle_hooks[i] = NULL;
        fn();
    }
}

static void *worker_main(void *raw)
{
    worker_arg wa = *(worker_arg *)raw;
    free(raw);
    sdpa_pool *p = wa.pool;
    uint64_t seen = 0;
    for (;;) {
        if (!spin(p, new_region, seen)) {
            run_idle_hooks();
            pthread_mutex_lock(&p->m);
            while (!atomic_load(&p->stop) && p->generation == seen)
                pthread_cond_wait(&p->start, &p->m);
            pthread_mutex_unlock(&p->m);
        }
        if (atomic_load(&p->stop))
            break;
        /* fn, arg and the lanes were written before published (release) */
        seen = atomic_load_explicit(&p->published, memory_order_acquire);
        drain(p, wa.index);
        if (atomic_fetch_sub_explicit(&p->busy, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->m); /* the caller may be waiting on done */
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->m);
        }
    }
    return NULL;
}

sdpa_status sdpa__pool_create(int threads, sdpa_pool **out)
{
    *out = NULL;
    if (threads < 1)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "threads is %d, expected >= 1", threads);
    sdpa_pool *p = sdpa__calloc(1, sizeof *p);
    if (!p)
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "thread pool: cannot allocate");
    p->threads = threads;
    pthread_mutex_init(&p->submit, NULL);
    pthread_mutex_init(&p->m, NULL);
    pthread_cond_init(&p->start, NULL);
    pthread_cond_init(&p->done, NULL);
    if (threads > 1) {
        p->tids = sdpa__calloc((size_t)threads - 1, sizeof *p->tids);
        if (!p->tids) {
            sdpa__pool_destroy(p);
            return sdpa__fail(SDPA_OUT_OF_MEMORY, "thread pool: cannot allocate");
        }
        for (int i = 1; i < threads; i++) {
            worker_arg *wa = sdpa__malloc(sizeof *wa);
            if (wa)
                wa->pool = p, wa->index = i;
            if (!wa || pthread_create(&p->tids[i - 1], NULL, worker_main, wa) != 0) {
                free(wa);
                p->threads = i; /* destroy joins the ones that started */
                sdpa__pool_destroy(p);
                return sdpa__fail(SDPA_OUT_OF_MEMORY,
                                  "thread pool: cannot start worker thread %d of %d", i, threads);
            }
        }
    }
    *out = p;
    return SDPA_OK;
}

void sdpa__pool_destroy(sdpa_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->m);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->m);
    for (int i = 1; i < p->threads && p->tids; i++)
        pthread_join(p->tids[i - 1], NULL);
    pthread_mutex_destroy(&p->submit);
    pthread_mutex_destroy(&p->m);
    pthread_cond_destroy(&p->start);
    pthread_cond_destroy(&p->done);
    free(p->tids);
    free(p);
}

sdpa_status sdpa__pool_create_host(int threads, sdpa_parallel_for_fn fn, void *user,
                                   sdpa_pool **out)
{
    *out = NULL;
    if (threads < 1)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "threads is %d, expected >= 1", threads);
    sdpa_pool *p = sdpa__calloc(1, sizeof *p);
    if (!p)
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "host pool: cannot allocate");
    p->threads = threads, p->host_for = fn, p->host_user = user;
    pthread_mutex_init(&p->submit, NULL);
    pthread_mutex_init(&p->m, NULL);
    pthread_cond_init(&p->start, NULL);
    pthread_cond_init(&p->done, NULL);
    *out = p;
    return SDPA_OK;
}

typedef struct host_task {
    sdpa_task_fn fn;
    void *arg;
} host_task;

static void host_trampoline(void *raw, int64_t task, int worker)
{
    const host_task *h = raw;
    in_host_task = 1;
    h->fn(h->arg, task, worker);
    in_host_task = 0;
}

/* One per thread: a share call neither allocates nor locks for its pool. */
static _Thread_local sdpa_pool share_pool;

sdpa_pool *sdpa__pool_share(int share, int shares)
{
    share_pool.threads = shares, share_pool.share = share, share_pool.shares = shares;
    return &share_pool;
}

int sdpa__pool_share_of(const sdpa_pool *p, int *share, int *shares)
{
    if (!p || p->shares == 0)
        return 0;
    *share = p->share, *shares = p->shares;
    return 1;
}

int sdpa__pool_threads(const sdpa_pool *p) { return p ? p->threads : 1; }

int sdpa__pool_workers(const sdpa_pool *p) { return !p ? 1 : p->shares ? 1 : p->threads; }

sdpa_pool *sdpa__pool_for_call(const sdpa_call *c)
{
    const sdpa_call_desc *d = &c->desc;
    const double macs =
        2.0 * (double)d->B * (double)d->Hq * (double)d->Sq * (double)d->Skv * (double)d->D;
    return c->pool && !c->pool->shares && macs < SDPA_POOL_INLINE_MACS ? NULL : c->pool;
}

void sdpa__parallel_for(sdpa_pool *p, int64_t n_tasks, sdpa_task_fn fn, void *arg)
{
    if (p && p->shares) { /* this thread's share of the tasks, in order */
        for (int64_t t = p->share; t < n_tasks; t += p->shares)
            fn(arg, t, 0);
        return;
    }
    if (p && p->host_for && n_tasks > 1) {
        host_task h = {fn, arg};
        pthread_mutex_lock(&p->submit); /* regions take turns, as on a pool of ours */
        p->host_for(p->host_user, n_tasks, host_trampoline, &h);
        pthread_mutex_unlock(&p->submit);
        return;
    }
    if (!p || p->threads == 1 || n_tasks <= 1) {
        for (int64_t t = 0; t < n_tasks; t++)
            fn(arg, t, 0);
        return;
    }
    pthread_mutex_lock(&p->submit);
    pthread_mutex_lock(&p->m);
    p->fn = fn, p->arg = arg;
    sdpa__task_lanes_start(&p->lanes, p->threads, n_tasks);
    atomic_store_explicit(&p->busy, p->threads - 1, memory_order_relaxed);
    p->generation++;
    atomic_store_explicit(&p->published, p->generation, memory_order_release);
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->m);
    drain(p, 0);
    if (!spin(p, region_done, 0)) {
        pthread_mutex_lock(&p->m);
        while (atomic_load_explicit(&p->busy, memory_order_acquire) > 0)
            pthread_cond_wait(&p->done, &p->m);
        pthread_mutex_unlock(&p->m);
    }
    pthread_mutex_unlock(&p->submit);
}

/* ---- process-wide pools, one per width, reference counted */

#define SHARED_POOLS 8

static struct {
    sdpa_pool *pool;
    int refs;
} shared[SHARED_POOLS];
static pthread_mutex_t shared_lock = PTHREAD_MUTEX_INITIALIZER;

sdpa_status sdpa__pool_acquire(int threads, sdpa_pool **out)
{
    sdpa_status st = SDPA_OK;
    *out = NULL;
    pthread_mutex_lock(&shared_lock);
    int slot = -1;
    for (int i = 0; i < SHARED_POOLS && !*out; i++) {
        if (shared[i].pool && shared[i].pool->threads == threads)
            *out = shared[i].pool, shared[i].refs++;
        else if (!shared[i].pool && slot < 0)
            slot = i;
    }
    if (!*out && slot >= 0) {
        st = sdpa__pool_create(threads, &shared[slot].pool);
        if (st == SDPA_OK)
            *out = shared[slot].pool, shared[slot].refs = 1;
    }
    pthread_mutex_unlock(&shared_lock);
    if (!*out && st == SDPA_OK) /* every slot holds another width: a pool of its own */
        st = sdpa__pool_create(threads, out);
    return st;
}

void sdpa__pool_release(sdpa_pool *pool)
{
    if (!pool)
        return;
    pthread_mutex_lock(&shared_lock);
    for (int i = 0; i < SHARED_POOLS; i++)
        if (shared[i].pool == pool) {
            if (--shared[i].refs == 0)
                shared[i].pool = NULL;
            else
                pool = NULL; /* still in use */
            break;
        }
    pthread_mutex_unlock(&shared_lock);
    sdpa__pool_destroy(pool); /* the last reference, or a pool outside the table */
}
