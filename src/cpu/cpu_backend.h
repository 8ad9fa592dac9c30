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

/* The x86-64 kernels are built on x86-64 only; elsewhere their descriptors
 * stay, never present. */
#ifdef SDPA_HAVE_X86_KERNELS
#define SDPA_X86_KERNEL(fn) fn
#define SDPA_X86_NOT_BUILT NULL
#define SDPA_X86_VERSION SDPA_VERSION_STRING
#else
#define SDPA_X86_KERNEL(fn) sdpa__cpu_backend_not_built
#define SDPA_X86_NOT_BUILT "x86-64 kernels, this build is for another architecture"
#define SDPA_X86_VERSION "absent"
#endif

#endif
