/*
 * seam.h - the one internal seam that tests and benchmarks use besides
 * sdpa.h (not installed): a backend made at run time registered with a
 * context (tests' scripted backends, cpu.amx-emulated, the benchmark's
 * no-op), and the call validation every public entry point runs first.
 * Code that needs more of the dispatcher is the dispatcher.
 */
#ifndef SDPA_SEAM_H
#define SDPA_SEAM_H

#include "../core/backend.h"

/* Adds a backend at run time. Not thread-safe: call before the context is
 * shared. INVALID_ARGUMENT on a duplicate name or a full table. */
sdpa_status sdpa__ctx_add_backend(sdpa_context *ctx, const sdpa_backend *b);

/* sdpa__call_prepare (core.h) validates a call as sdpa_forward does. */

#endif
