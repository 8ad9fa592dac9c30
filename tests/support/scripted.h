/*
 * scripted.h - a test-only backend whose answers and failures are scripted:
 * it refuses calls in check() with a given reason, fails in run() with a
 * given status, or runs the reference and optionally corrupts the result.
 * Used to test the dispatcher without real kernels misbehaving.
 */
#ifndef SDPA_SCRIPTED_H
#define SDPA_SCRIPTED_H

#include "sdpa.h"

#include <stdatomic.h>

typedef struct scripted {
    const char *refuse;      /* non-NULL: check() refuses with this reason       */
    sdpa_status run_status;  /* not OK: run() fails with it (UNSUPPORTED latches) */
    int wrong_result;        /* 1: runs ref, then adds 1 to the first output value */
    int no_lse;              /* 1: declares no LSE output                         */
    int cuda;                /* 1: a CUDA backend (decisions only)                */
    _Atomic int runs;        /* how many times run() was entered                  */
    int has_prepare;         /* 1: has a warm-up step; 0: prepare() does nothing  */
    sdpa_status prepare_status; /* not OK: prepare() fails with it                */
    _Atomic int prepares;    /* how many times prepare() was entered              */
    double cost_ms;          /* advances scripted_clock_ms by this much per run   */
    double cost_per_key_ms;  /* ... plus this much per key (Skv): costs that cross  */
    double jitter;           /* ... times (1 + jitter * u), u uniform in [-1, 1)  */
    int nan_result;          /* 1: runs ref, then writes NaN into output element
                              * (0, Sq - 1, Hq - 1, D - 1): a fast path gone wrong */
} scripted;

/* A fake clock for the tuner: advanced only by scripted runs. */
double scripted_clock_ms(void *user);

/* Registers a scripted backend named `name` with ctx. */
sdpa_status scripted_add(sdpa_context *ctx, const char *name, scripted *script);

#endif
