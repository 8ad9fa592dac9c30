/*
 * guard.h - the finite-output guard's scans and its line in info and
 * explain (guard.c). Switching it on and counting its events are public
 * (sdpa.h: sdpa_context_set_finite_guard, sdpa_context_guard_events).
 */
#ifndef SDPA_GUARD_H
#define SDPA_GUARD_H

#include "context.h"

struct sdpa_strbuf;

/* guard.c: whether a finished call's output (or LSE: NaN, +inf) holds a
 * non-finite value; whether q, k and v are all finite. CPU tensors. */
int sdpa__guard_output_bad(const sdpa_call *c);
int sdpa__guard_inputs_finite(const sdpa_call *c);
/* "guard     on, N events" for info and explain. */
void sdpa__guard_text(struct sdpa_strbuf *sb, const sdpa_context *ctx, int width);

#endif
