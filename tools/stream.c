/*
 * stream.c - a streaming read of buffers by a fixed set of threads (see
 * stream.h). Threads wait at a barrier between reads, so a read costs one
 * wake-up of them and not a thread start (a decode step's K and V may take
 * only tens of microseconds to read).
 */
#define _POSIX_C_SOURCE 200809L
#include "stream.h"
#include "tool.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BUFS 4

struct stream_reader {
    int threads, ready, quit;
    pthread_t *tid;
    struct stream_arg *arg;
    pthread_mutex_t lock; /* ready / quit, before the barriers exist */
    pthread_cond_t go;
    pthread_barrier_t start, done;
    const unsigned char *buf[MAX_BUFS];
    size_t bytes[MAX_BUFS];
    int n;
    volatile uint64_t sink; /* the caller's sum: so its reads are not optimised away */
};

struct stream_arg {
    struct stream_reader *r;
    int t;
    volatile uint64_t sink; /* this thread's sum, for the same reason */
};

/* Words summed so the reads are not optimised away; 64 bytes at a time. */
static inline uint64_t sum64(const unsigned char *p)
{
    uint64_t s = 0;
    for (int k = 0; k < 8; k++) {
        uint64_t w;
        memcpy(&w, p + 8 * k, 8);
        s += w;
    }
    return s;
}

/*
 * Thread t's share: a contiguous 1/threads of every buffer, each share cut
 * in SUBSTREAMS parts read side by side. Why several streams at once: one
 * sequential stream per core is bound by how many misses it has in flight
 * (3-4 GB/s on the Sapphire Rapids VM, where two or more reach 7-9), and
 * a kernel reading K and V at once has two: a one-stream read would not
 * be a bound.
 */
#define SUBSTREAMS 4

/* Thread t's bytes [lo, hi) of buffer b, and the length of each part. */
static void share(const struct stream_reader *r, int b, int t, size_t *lo, size_t *hi,
                  size_t *part)
{
    const size_t per = (r->bytes[b] + (size_t)r->threads - 1) / (size_t)r->threads;
    *lo = per * (size_t)t < r->bytes[b] ? per * (size_t)t : r->bytes[b];
    *hi = *lo + per < r->bytes[b] ? *lo + per : r->bytes[b];
    *part = (*hi - *lo) / SUBSTREAMS / 64 * 64;
}

static uint64_t read_part(const struct stream_reader *r, int t)
{
    const unsigned char *at[MAX_BUFS * SUBSTREAMS];
    size_t len = SIZE_MAX;
    int ns = 0;
    uint64_t sum = 0;
    for (int b = 0; b < r->n; b++) {
        size_t lo, hi, part;
        share(r, b, t, &lo, &hi, &part);
        for (int k = 0; k < SUBSTREAMS; k++)
            at[ns++] = r->buf[b] + lo + (size_t)k * part;
        len = part < len ? part : len;
        for (size_t i = lo + SUBSTREAMS * part; i < hi; i++) /* what the parts leave */
            sum += r->buf[b][i];
    }
    if (ns == 0)
        return sum;
    for (size_t i = 0; i < len; i += 64)
        for (int k = 0; k < ns; k++)
            sum += sum64(at[k] + i);
    /* parts of a buffer longer than the shortest: their rest, in turn */
    for (int b = 0; b < r->n; b++) {
        size_t lo, hi, part;
        share(r, b, t, &lo, &hi, &part);
        for (int k = 0; k < SUBSTREAMS; k++)
            for (size_t i = len; i < part; i += 64)
                sum += sum64(r->buf[b] + lo + (size_t)k * part + i);
    }
    return sum;
}

static void *worker(void *p)
{
    struct stream_arg *a = p;
    struct stream_reader *r = a->r;
    pthread_mutex_lock(&r->lock);
    while (!r->ready && !r->quit)
        pthread_cond_wait(&r->go, &r->lock);
    const int quit = r->quit;
    pthread_mutex_unlock(&r->lock);
    if (quit)
        return NULL;
    for (;;) {
        pthread_barrier_wait(&r->start);
        if (r->quit)
            return NULL;
        a->sink = read_part(r, a->t);
        pthread_barrier_wait(&r->done);
    }
}

static void release(struct stream_reader *r, int started)
{
    pthread_mutex_lock(&r->lock);
    r->quit = 1;
    pthread_cond_broadcast(&r->go);
    pthread_mutex_unlock(&r->lock);
    if (r->ready)
        pthread_barrier_wait(&r->start);
    for (int i = 0; i < started; i++)
        pthread_join(r->tid[i], NULL);
    if (r->ready) {
        pthread_barrier_destroy(&r->start);
        pthread_barrier_destroy(&r->done);
    }
    pthread_mutex_destroy(&r->lock);
    pthread_cond_destroy(&r->go);
    free(r->tid);
    free(r->arg);
    free(r);
}

stream_reader *stream_reader_make(int threads)
{
    struct stream_reader *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->threads = threads < 1 ? 1 : threads;
    r->tid = calloc((size_t)r->threads, sizeof *r->tid);
    r->arg = calloc((size_t)r->threads, sizeof *r->arg);
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->go, NULL);
    int started = 0;
    if (r->tid && r->arg)
        for (; started < r->threads - 1; started++) {
            r->arg[started] = (struct stream_arg){r, started + 1, 0};
            if (pthread_create(&r->tid[started], NULL, worker, &r->arg[started]) != 0)
                break;
        }
    if (!r->tid || !r->arg || started < r->threads - 1) {
        release(r, started);
        return NULL;
    }
    pthread_barrier_init(&r->start, NULL, (unsigned)r->threads);
    pthread_barrier_init(&r->done, NULL, (unsigned)r->threads);
    pthread_mutex_lock(&r->lock);
    r->ready = 1;
    pthread_cond_broadcast(&r->go);
    pthread_mutex_unlock(&r->lock);
    return r;
}

void stream_reader_free(stream_reader *r)
{
    if (r)
        release(r, r->threads - 1);
}

double stream_read_ms(stream_reader *r, const void *const *bufs, const size_t *bytes, int n)
{
    r->n = n < MAX_BUFS ? n : MAX_BUFS;
    for (int b = 0; b < r->n; b++)
        r->buf[b] = bufs[b], r->bytes[b] = bytes[b];
    const double t0 = tool_now_ms();
    pthread_barrier_wait(&r->start);
    r->sink = read_part(r, 0);
    pthread_barrier_wait(&r->done);
    return tool_now_ms() - t0;
}
