/*
 * dit.h - the small diffusion transformer of `sdpa dit`, as sessions that
 * `sdpa ab --dit CONFIG` can time side by side.
 */
#ifndef SDPA_DIT_H
#define SDPA_DIT_H

#include "sdpa.h"

#include <stdint.h>

typedef struct dit_session dit_session;

/* The first attention call of a configuration ("image", "video"); 0 if unknown. */
int dit_attention_desc(const char *config, sdpa_call_desc *d);

/* A model for `config` whose attention layers run in ctx on `backend` (NULL:
 * the dispatcher decides). 0, or an exit code after printing the problem. */
int dit_open(const char *config, sdpa_context *ctx, const char *backend, sdpa_dtype attn_dtype,
             uint64_t seed, int steps, dit_session **out);
/* One full sampling run from the seed's noise; its time in *ms_total. */
int dit_run(dit_session *s, int verbose, double *ms_total);
void dit_close(dit_session *s);

#endif
