/*
 * cpu_backend.h - what every CPU backend's descriptor (src/cpu/NAME/backend.c)
 * shares: one presence check driven by the CPU features its capabilities
 * name, and what a descriptor says when its kernel is not in this build.
 *
 * A descriptor is always compiled, without ISA flags, so rules can name
 * the backend and explain says the same about it on every machine; its
 * kernel lives in files compiled with their ISA's flags, reached only
 * through the descriptor's run after the presence check passed.
 */
#ifndef SDPA_CPU_BACKEND_H
#define SDPA_CPU_BACKEND_H

#include "../core/backend.h"

/*
 * 1 when the backend's kernel is built (self->not_built is NULL) and
 * `host` has every feature in self->caps.cpu_features; else 0 with the
 * reason, naming the highest missing feature (and whether the CPU has it
 * but the OS or SDPA_MAX_ISA withholds it).
 */
int sdpa__cpu_backend_present(const sdpa_backend *self, const sdpa_platform *host, char *why,
                              size_t n);

/* run of a descriptor whose kernel is not built: NOT_AVAILABLE, saying so. */
sdpa_status sdpa__cpu_backend_not_built(const sdpa_backend *self, const sdpa_call *call);

/*
 * A backend's kernels are built on the architecture its sdpa_cpu_backend
 * line in CMakeLists.txt names; there its backend.c is compiled with
 * SDPA_KERNELS_BUILT=1 (SDPA_KERNELS_ARCH, SDPA_BUILD_ARCH: the two
 * architectures). Elsewhere the descriptor stays, never present, and these
 * name what it lacks.
 */
#if SDPA_KERNELS_BUILT
#define SDPA_CPU_KERNEL(fn) fn
#define SDPA_CPU_PROBE(fn) fn
#define SDPA_CPU_NOT_BUILT NULL
#define SDPA_CPU_VERSION SDPA_VERSION_STRING
#else
#define SDPA_CPU_KERNEL(fn) sdpa__cpu_backend_not_built
#define SDPA_CPU_PROBE(fn) NULL
#define SDPA_CPU_NOT_BUILT SDPA_KERNELS_ARCH " kernels, this build is for " SDPA_BUILD_ARCH
#define SDPA_CPU_VERSION "absent"
#endif

#endif
