/*
 * alloc.c - every heap allocation of the library goes through here, so
 * that tests can make any one of them fail (SQLite's way of proving that
 * out-of-memory paths return OUT_OF_MEMORY, leak nothing and write
 * nothing). In normal use the cost is one relaxed atomic load per
 * allocation; the library allocates a handful of times per call.
 * Self-contained, so libsdpa_mpi builds it in too (its own copy in its
 * .so; one shared counter where a test links both over the static core).
 */
#include "alloc.h"

#include <stdatomic.h>
#include <stdlib.h>

static _Atomic int64_t fail_at;  /* 0: off; else the count at which to fail */
static _Atomic int64_t n_allocs; /* allocations since the last arming       */

static int injected_failure(void)
{
    if (atomic_load_explicit(&fail_at, memory_order_relaxed) == 0)
        return 0;
    return atomic_fetch_add(&n_allocs, 1) + 1 == atomic_load(&fail_at);
}

void *sdpa__malloc(size_t n) { return injected_failure() ? NULL : malloc(n ? n : 1); }

void *sdpa__calloc(size_t n, size_t size)
{
    return injected_failure() ? NULL : calloc(n ? n : 1, size ? size : 1);
}

void *sdpa__realloc(void *p, size_t n) { return injected_failure() ? NULL : realloc(p, n ? n : 1); }

void *sdpa__aligned_alloc(size_t align, size_t n)
{
    n = (n + align - 1) / align * align; /* C11: a multiple of the alignment */
    return injected_failure() ? NULL : aligned_alloc(align, n ? n : align);
}

void sdpa__alloc_fail_at(int64_t n)
{
    atomic_store(&fail_at, 0);
    atomic_store(&n_allocs, 0);
    atomic_store(&fail_at, n);
}

int64_t sdpa__alloc_count(void) { return atomic_load(&n_allocs); }
