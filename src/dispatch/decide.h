/*
 * decide.h - the decision procedure (decide.c): the precedence of fixed
 * choices, the rules, the candidates with their reasons.
 */
#ifndef SDPA_DECIDE_H
#define SDPA_DECIDE_H

#include "context.h"

/* A choice fixed before any rule is consulted (levels 1-4 of the precedence). */
typedef struct sdpa_choice {
    sdpa_source source;
    int backend; /* index into ctx->backends */
    char detail[128];
} sdpa_choice;

/*
 * The choice that overrides the rules for a call, if any, in precedence
 * order: desc->backend, then `fixed` (a layer's captured choice), then the
 * scoped override, the component override and SDPA_BACKEND.
 * Returns 1 and fills *out, 0 when the rules decide, or -1 with
 * INVALID_ARGUMENT recorded when a name is unknown.
 */
int sdpa__resolve_choice(const sdpa_context *ctx, const sdpa_call_desc *desc,
                         const sdpa_choice *fixed, sdpa_choice *out);

/*
 * The full decision. cand[] receives backend indices in order. Returns
 * INVALID_ARGUMENT for a bad description or unknown backend name; otherwise
 * OK with out->status saying whether anything can run.
 */
sdpa_status sdpa__decide(sdpa_context *ctx, const sdpa_call_desc *desc, const sdpa_choice *fixed,
                         sdpa_decision *out, int *cand);

/*
 * sdpa__decide for a call about to run under a per-call or scoped choice
 * (decided fresh on every call: decision_cache.h): the same candidates,
 * status and error, without a verdict string for each backend the choice
 * passed over. Those formatted strings and the 9 KB clear cost 0.8 us a
 * call (bench_dispatch: +986-1,003 ns against +157-160 now, Zen 4), half
 * of a one-token call naming its backend; sdpa_explain still writes them.
 */
sdpa_status sdpa__decide_lean(sdpa_context *ctx, const sdpa_call_desc *desc, sdpa_decision *out,
                              int *cand);

/* Describes the call's shape class for log lines. */
void sdpa__desc_string(const sdpa_call_desc *d, char *buf, size_t n);

#endif
