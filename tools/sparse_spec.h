/*
 * sparse_spec.h - sparse patterns named on a command line or in a suite
 * column (sparse=SPEC), for `sdpa run`, `bench` and `explain`:
 *
 *   window=L,R                   FlashAttention's 1-D window (-1: unbounded)
 *   nbhd=T,H,W:wt,wh,ww[:P]      3-D neighbourhood, windows in tokens (NATTEN)
 *   sta=T,H,W:tt,th,tw:wt,wh,ww[:P]   tile-major, windows in tiles (STA)
 *   radial=T,H,W[:P]             a radial-like map: frames at distance <= 1
 *                                dense, the window halving as the distance
 *                                doubles, frame 0 a sink (128-blocks)
 *   random=S                     128-blocks hidden with probability S, the
 *                                rest FULL (fixed seed; S = 0: every block)
 * P: dense text tokens in front of the grid. The grid plus P must be Sq
 * and Skv. Every map is shared by all heads and batch entries.
 */
#ifndef SDPA_TOOL_SPARSE_SPEC_H
#define SDPA_TOOL_SPARSE_SPEC_H

#include "sdpa.h"

#include <stddef.h>

typedef struct sparse_pattern {
    sdpa_window window;
    int has_window;
    sdpa_block_map *map; /* or NULL */
    double density;      /* of the keys a call must visit: 1 - block sparsity */
} sparse_pattern;

/* The SDPA_MASK_KIND_* bit a spec adds, or 0 when it is not one. */
unsigned sparse_spec_kind(const char *spec);

/* Builds the pattern of spec for calls of d. 0, or -1 with the problem in
 * err (naming the spec and what was expected). */
int sparse_spec_build(const char *spec, const sdpa_call_desc *d, sparse_pattern *out, char *err,
                      size_t n);
void sparse_pattern_free(sparse_pattern *p);

/* The pattern's part of a mask. */
void sparse_pattern_apply(const sparse_pattern *p, sdpa_mask *m);

#endif
