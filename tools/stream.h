/*
 * stream.h - the memory side of `sdpa bench`: how fast n threads can read
 * given buffers once, start to end, measured beside the calls it bounds.
 *
 * A call with few query rows per KV head (a decode step) reads K and V
 * once and does a few multiply-adds per element: its ceiling is not the
 * FMA rate but the time to read those bytes. The bound is measured on the
 * call's own K and V, in the same rounds as the backends (so the bytes sit
 * wherever the calls find them: DRAM, or L3 for small caches), split over
 * as many threads as the context runs, each reading a contiguous share.
 * Its threads sleep between reads, so a read pays one wake-up of them, as
 * a call pays one of the library's pool: on rows of a few hundred KB or
 * less that wake-up, not the bytes, is most of either time, and %bw says
 * little there.
 */
#ifndef SDPA_TOOL_STREAM_H
#define SDPA_TOOL_STREAM_H

#include <stddef.h>

typedef struct stream_reader stream_reader;

/* A reader with `threads` threads (the caller's counts as one); NULL when
 * out of memory or threads cannot start. */
stream_reader *stream_reader_make(int threads);
void stream_reader_free(stream_reader *r);

/* Milliseconds to read every byte of the n buffers once. */
double stream_read_ms(stream_reader *r, const void *const *bufs, const size_t *bytes, int n);

#endif
