/*
 * alloc.h - the allocation funnel of libsdpa and libsdpa_mpi (alloc.c):
 * malloc's family with a fault injector, for the out-of-memory tests.
 * Memory from here is released with free(). Not installed.
 */
#ifndef SDPA_ALLOC_H
#define SDPA_ALLOC_H

#include <stddef.h>
#include <stdint.h>

void *sdpa__malloc(size_t n);
void *sdpa__calloc(size_t n, size_t size);
void *sdpa__realloc(void *p, size_t n);
void *sdpa__aligned_alloc(size_t align, size_t n); /* n rounded up to align */
/*
 * Fault injection, for tests: after this call the n-th allocation (from 1)
 * fails, returning NULL; the others succeed. n = 0 turns it off.
 * sdpa__alloc_count() says how many were made since: a run in which fewer
 * than n were made had no failure injected.
 */
void sdpa__alloc_fail_at(int64_t n);
int64_t sdpa__alloc_count(void);

#endif
