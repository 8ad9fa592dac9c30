/*
 * registry.h - what registry.c offers the dispatcher (and the tuner above
 * it): the built-in backend table and the acceptance check every backend
 * shares. The descriptors themselves are core/backend.h's interface.
 */
#ifndef SDPA_REGISTRY_H
#define SDPA_REGISTRY_H

#include "../core/backend.h"

/* The built-in table (NULL-terminated). */
extern const sdpa_backend *const sdpa__builtin_backends[];

/*
 * Can `b` run the call described by `d` on platform `p`? Checks device,
 * platform requirements, the capability table, then b->check. Returns 1, or
 * 0 with a short reason in why ("head_dim 72 not a multiple of 32").
 */
int sdpa__backend_accepts(const sdpa_backend *b, const sdpa_platform *p,
                          const sdpa_call_desc *d, char *why, size_t n);

/* Can `b` run on this machine? 1, or 0 with the reason. */
int sdpa__backend_present(const sdpa_backend *b, const sdpa_platform *host, char *why,
                          size_t n);

#endif
