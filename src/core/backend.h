/*
 * backend.h - what a backend is to the dispatcher.
 *
 * A backend is one descriptor: static capabilities the core knows whether
 * or not the code is built or usable here (so `sdpa explain` can show what
 * an sm_100 GPU would do from a laptop), plus three functions:
 *
 *   present(host)   can it run on this machine at all? If not, why.
 *   check(call)     can it run this exact call? If not, a short reason.
 *                   Only what the capability table cannot say goes here.
 *   run(call)       do it. UNSUPPORTED here means "this shape, after all"
 *                   and gets the backend latched off for the calling layer.
 *   prepare(call)   optional: build now what run(call) would build first
 *                   (cuDNN execution plans), touching no tensor data.
 *                   Same status meanings as run.
 *   backward(call)  optional: the gradients (sdpa_backward), where
 *                   caps.backward says it has them. Same status meanings.
 *
 * The capability table is checked by sdpa__backend_accepts first, so
 * every backend refuses the same things with the same words.
 */
#ifndef SDPA_BACKEND_H
#define SDPA_BACKEND_H

#include "core.h"

typedef struct sdpa_backend sdpa_backend;

typedef struct sdpa_caps {
    unsigned dtypes;       /* bit (1 << sdpa_dtype) per accepted input dtype */
    int d_min, d_max;      /* head dim range                                 */
    int d_multiple;        /* head dim must be a multiple of this (1: any)   */
    unsigned char gqa, cross, causal_top_left, causal_bottom_right, lse, deterministic;
    unsigned cpu_features; /* SDPA_CPU_* the platform must have              */
    unsigned masks;        /* SDPA_MASK_KIND_* it takes (0: no masks)        */
    int min_cc;            /* CUDA compute capability * 10, 0: none          */
    int min_cudnn;         /* cuDNN version (91900 = 9.19.0), 0: none        */
    int product_bits;      /* significand bits of the products' operands:
                            * 0 = the input dtype's (exact conversion to
                            * fp32, or tensor cores on the input type), 8 =
                            * rounded to bf16 (cpu.amx, whatever the input) */
    unsigned char backward; /* has a backward pass (sdpa_backend.backward), with
                             * the same dtypes, head dims, masks and flags   */
    unsigned char mixed_dtypes; /* q's dtype may differ from k's and v's (each
                                 * input converted while packing), both dtypes
                                 * among `dtypes`                         */
    unsigned char shares; /* runs one share of a call (sdpa_forward_share):
                           * every region's tasks independent of the
                           * others' (core.h: share pools)              */
} sdpa_caps;

struct sdpa_backend {
    const char *name;
    const char *summary;
    sdpa_device_kind device;
    sdpa_caps caps;
    /* Position in the fallback chain of its device: higher is tried first;
     * 0 keeps it out of the chain (only rules or overrides name it). */
    int fallback_rank;
    const char *version;
    int (*present)(const sdpa_backend *self, const sdpa_platform *host, char *why, size_t n);
    int (*check)(const sdpa_backend *self, const sdpa_call_desc *d, const sdpa_platform *p,
                 char *why, size_t n); /* NULL: the caps say it all */
    sdpa_status (*run)(const sdpa_backend *self, const sdpa_call *call);
    sdpa_status (*prepare)(const sdpa_backend *self, const sdpa_call *call); /* NULL: none */
    /* The backward pass (call->desc.backward, the sdpa_call's gradient
     * fields); NULL exactly when caps.backward is 0. */
    sdpa_status (*backward)(const sdpa_backend *self, const sdpa_call *call);
    void *state; /* for backends made at run time (tests' scripted ones) */
    /* NULL when the kernel is in this build; else why not ("OpenBLAS was
     * not found at build time"): the descriptor stays, never present. */
    const char *not_built;
    /* The arithmetic peak of the unit the kernel's products run on
     * (sdpa_measure_ceiling, src/cpu/ceiling.c): probe(iters) runs iters
     * rounds of independent chains in registers and returns the FLOPs
     * done. probe_unit is 0 for the fp32 FMA peak (the present backend
     * with the highest feature measures it), else the SDPA_CPU_* bit whose
     * instructions it times (AVX512-BF16's VDPBF16PS, AMX-BF16's tiles).
     * probe_max_iters caps the sizing runs (0: 20 million). NULL: none. */
    double (*probe)(int64_t iters);
    unsigned probe_unit;
    int64_t probe_max_iters;
};

#define SDPA_DTYPE_BIT(t) (1u << (t))

/* The float64 oracle, which tests' scripted backends wrap. */
extern const sdpa_backend sdpa__backend_ref;

/* The built-in table and the acceptance check over this interface are the
 * dispatcher's: src/dispatch/registry.h. */

#endif
