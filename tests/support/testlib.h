/*
 * testlib.h - a small test harness: checks that count, fresh random inputs
 * with a printed seed, tensors with guard bytes, comparison against ref.
 *
 * Each test program ends with the line "N passed, N failed[, N skipped]"
 * and exits non-zero on any failure. SDPA_TEST_SEED=n repeats a run.
 */
#ifndef SDPA_TESTLIB_H
#define SDPA_TESTLIB_H

#include "sdpa.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

extern int tl_passed, tl_failed, tl_skipped;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (cond) {                                                                                \
            tl_passed++;                                                                           \
        } else {                                                                                   \
            tl_failed++;                                                                           \
            printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                 \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)

#define CHECK_STATUS(got, want)                                                                    \
    CHECK((got) == (want), "status %s, expected %s; last error: %s", sdpa_status_string(got),     \
          sdpa_status_string(want), sdpa_last_error())

void tl_skip(const char *what, const char *why);
/* Prints the summary line; returns the exit code. */
int tl_finish(void);

/* ---- random numbers (seeded once per process, seed printed) */
void tl_seed_from_env(void);
uint64_t tl_seed(void);
double tl_uniform(void); /* [-1, 1) */

/* ---- buffers with guard bytes after the end */
#define TL_GUARD 64
void *tl_alloc_guarded(size_t bytes);          /* fills guard with a pattern */
int tl_guard_intact(const void *p, size_t bytes);
void tl_free_guarded(void *p);

/* ---- an attention problem: q, k, v in some layout and dtype */
/* TL_STRIDED_NAN: TL_STRIDED whose gaps hold NaN instead of random values,
 * so that a kernel that reads past a row and multiplies what it read by
 * zero fails too */
typedef enum tl_layout { TL_BSHD, TL_BHSD, TL_STRIDED, TL_STRIDED_NAN } tl_layout;
const char *tl_layout_name(tl_layout l);

/* What the inputs hold beyond uniform [-1, 1) (tl_problem_make). */
typedef enum tl_values {
    TL_UNIFORM = 0,  /* flat softmaxes                                          */
    TL_PEAKED,       /* q x 8 and scale 1: scores around +-100, large max jumps  */
    TL_NAN_Q,        /* NaN in q at three rows: those rows NaN                  */
    TL_NAN_K,        /* NaN in k at key 2: the rows that see it NaN            */
    TL_INF_V,        /* +inf in v at key 1, column 0                            */
    TL_OVERFLOW_POS, /* |q|, |k| ~ 1e30, key 0 aligned with every q: +inf, NaN  */
    TL_OVERFLOW_NEG, /* |q|, |k| ~ 1e30, every score -inf: masked rows          */
    TL_VALUES_COUNT
} tl_values;
const char *tl_values_name(tl_values v);

typedef struct tl_case {
    int64_t B, Sq, Skv, Hq, Hkv, D;
    sdpa_dtype dtype;     /* inputs */
    sdpa_dtype out_dtype;
    sdpa_causal causal;
    tl_layout layout;
    int want_lse;
    tl_values values;     /* default TL_UNIFORM                    */
    double scale;         /* 0: 1/sqrt(D), except TL_PEAKED: 1     */
    int kv_dtype;         /* k and v's dtype when not q's: SDPA_KV_DTYPE(t); 0: dtype */
} tl_case;

/* k and v's dtype in a case. */
static inline sdpa_dtype tl_kv_dtype(const tl_case *c)
{
    return c->kv_dtype ? (sdpa_dtype)(c->kv_dtype - 1) : c->dtype;
}

typedef struct tl_problem {
    tl_case c;
    sdpa_tensor q, k, v;
    void *qkv_mem[3];
    size_t qkv_bytes[3];
} tl_problem;

/* Fresh random inputs in [-1, 1) (strided: a slice of a wider buffer). */
int tl_problem_make(tl_problem *p, const tl_case *c);
void tl_problem_free(tl_problem *p);
/* The same problem with every input rounded to dtype t (what a kernel
 * whose products take t operands computes from). */
int tl_problem_rounded(tl_problem *dst, const tl_problem *src, sdpa_dtype t);
/* q, k and v rounded in place to bf16's 8 significant bits, in their own
 * dtype (f16 holds them exactly): inputs that a kernel whose products take
 * bf16 operands reads without a rounding of its own. */
void tl_problem_round_bf16(tl_problem *p);

/* An output tensor for the problem, with guard bytes; strided layouts leave
 * gaps filled with a pattern that tl_output_check verifies untouched. */
typedef struct tl_output {
    sdpa_tensor t;
    void *mem;
    size_t bytes;
    float *lse;
} tl_output;

int tl_output_make(tl_output *o, const tl_problem *p);
/* Guards intact and the gaps of a strided view untouched? */
int tl_output_check(const tl_output *o, char *why, size_t n);
void tl_output_free(tl_output *o);

/* Element of an output as float. */
float tl_out_get(const sdpa_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d);

/* Tolerance on |out - ref| for a backend with f32 accumulation, by dtypes. */
double tl_tolerance(sdpa_dtype in, sdpa_dtype out);
/* Extra tolerance for a backend whose products round operands to `bits`
 * significand bits (sdpa_backend_info.product_bits; 0: none). */
double tl_product_tolerance(int bits);

/* Max |a - b| over outputs and over LSE. Non-finite values must match
 * exactly (NaN with NaN, +-inf with the same infinity), else the result is
 * infinite. */
double tl_max_diff(const tl_output *a, const tl_output *b, int64_t *where);
/* Outputs and LSEs of two runs of one case the same bits? */
int tl_same_bits(const tl_output *a, const tl_output *b, const tl_case *c);
double tl_max_lse_diff(const tl_output *a, const tl_output *b, int64_t B, int64_t Hq,
                       int64_t Sq);
/* Max |x| over the finite elements of an output (the scale of errors). */
double tl_max_abs(const tl_output *o);
/* The scale a case runs with (what the call's params.scale gets). */
double tl_case_scale(const tl_case *c);

/*
 * Runs case c on ctx with the dispatcher's choice (backend NULL) or the
 * named backend, then on ref over the same inputs: returns the status,
 * *diff = max |out - ref| (infinite when guard bytes or gaps were touched)
 * and the name of the backend that ran in ran[n].
 */
sdpa_status tl_run_against_ref(sdpa_context *ctx, const char *backend, const tl_case *c,
                               double *diff, char *ran, size_t n);

/* Does the backend named in d->backend claim the call d describes (its
 * capabilities and check, as sdpa_decide sees them on ctx)? 1, or 0 with
 * the reason in why. A claimed case must run: refusing it is a failure. */
int tl_claims(sdpa_context *ctx, const sdpa_call_desc *d, char *why, size_t n);

/* A context with the given platform spec (NULL = this machine), 2 threads,
 * env ignored, logs captured into tl_log_* counters. */
sdpa_context *tl_context(const char *platform);
extern int tl_log_warnings;
extern char tl_last_warning[1024];
void tl_log_reset(void);

#endif
