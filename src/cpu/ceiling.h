/*
 * ceiling.h - the arithmetic-peak probes (ceiling.c), over a worker pool
 * and the CPU features the caller allows; sdpa_measure_ceiling (context.c)
 * is this with a context's pool and machine.
 */
#ifndef SDPA_CPU_CEILING_H
#define SDPA_CPU_CEILING_H

#include "../core/core.h"

struct sdpa_backend;

/* what: "fp32" (the FMA peak, probed by the present backend of the highest
 * ISA), or the name of a feature some backend's probe times (probe_unit:
 * "avx512bf16", "amx-bf16"); anything else is INVALID_ARGUMENT. The probes
 * are the backends' own (their descriptors declare them). */
sdpa_status sdpa__cpu_ceiling(sdpa_pool *pool, const struct sdpa_backend *const *backends,
                              int n_backends, unsigned cpu_features, const char *what,
                              double *gflops, const char **isa);

#endif
