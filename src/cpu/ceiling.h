/*
 * ceiling.h - the arithmetic-peak probes (ceiling.c), over a worker pool
 * and the CPU features the caller allows; sdpa_measure_ceiling (context.c)
 * is this with a context's pool and machine.
 */
#ifndef SDPA_CPU_CEILING_H
#define SDPA_CPU_CEILING_H

#include "../core/core.h"

/* what: "fp32" | "avx512-bf16" | "amx-bf16"; anything else is INVALID_ARGUMENT. */
sdpa_status sdpa__cpu_ceiling(sdpa_pool *pool, unsigned cpu_features, const char *what,
                              double *gflops, const char **isa);

#endif
