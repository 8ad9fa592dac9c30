/*
 * scratch.c - the calling thread's scratch area (core.h says how to use it).
 */
#include "core.h"

#include <pthread.h>
#include <stdlib.h>

/*
 * The calling thread's scratch: one 64-byte aligned area that only grows,
 * up to SCRATCH_KEEP bytes kept between calls (a larger request is
 * allocated for that call and released by sdpa__scratch_release). Kernels
 * take their per-call workspace here, so a repeated call allocates
 * nothing: a fresh 0.5 MiB malloc is an mmap whose pages fault in on first
 * touch, tens of microseconds, more than a small call's arithmetic. Freed
 * when the thread exits (a pthread key destructor). One area per thread:
 * a call's kernel runs to completion before the thread makes another.
 */
#define SCRATCH_KEEP ((size_t)16 << 20)

typedef struct scratch {
    void *p;
    size_t size;
} scratch;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int scratch_key_ok;

static void scratch_free(void *arg)
{
    scratch *s = arg;
    free(s->p);
    free(s);
}

static void scratch_init(void) { scratch_key_ok = pthread_key_create(&scratch_key, scratch_free) == 0; }

void *sdpa__scratch(size_t n)
{
    n = (n + 63) / 64 * 64;
    pthread_once(&scratch_once, scratch_init);
    scratch *s = scratch_key_ok ? pthread_getspecific(scratch_key) : NULL;
    if (s && n <= s->size)
        return s->p;
    if (n > SCRATCH_KEEP || !scratch_key_ok)
        return sdpa__aligned_alloc(64, n); /* this call's alone */
    if (!s) {
        if (!(s = sdpa__calloc(1, sizeof *s)))
            return NULL;
        if (pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            return sdpa__aligned_alloc(64, n);
        }
    }
    void *p = sdpa__aligned_alloc(64, n);
    if (!p)
        return NULL; /* the old area stays for later calls */
    free(s->p);
    s->p = p, s->size = n;
    return p;
}

void sdpa__scratch_release(void *p)
{
    scratch *s = scratch_key_ok ? pthread_getspecific(scratch_key) : NULL;
    if (!s || p != s->p)
        free(p);
}
