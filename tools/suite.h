/*
 * suite.h - shape suites (the .tsv files of ../shared/shapes) and the tensors a row
 * needs, shared by `sdpa bench`, `check` and `ab`.
 */
#ifndef SDPA_SUITE_H
#define SDPA_SUITE_H

#include "sdpa.h"
#include "sparse_spec.h"

#include <stddef.h>

#define MAX_ROWS 256

typedef struct row {
    char name[64];
    sdpa_call_desc d;
    int64_t seq_len_kv; /* padding: real keys of every batch entry (d.mask has
                         * SDPA_MASK_KIND_SEQ_LEN), or 0 for none */
    char sparse[96];    /* a sparse pattern (sparse_spec.h; d.mask has its
                         * kind), or "" for none */
} row;

/* Rows from --suite FILE or --shape B,Sq,Skv,Hq,Hkv,D (exactly one given);
 * 0, or an exit code after printing the problem. A suite line is
 * name B Sq Skv Hq Hkv D causal [seq_len_kv=N] [sparse=SPEC] description:
 * the optional columns pad every batch entry's keys past N (text padded to
 * Skv), and give the call a sparse pattern (sparse_spec.h). */
int suite_load(const char *suite, const char *shape, row *rows, int *n_rows);

/*
 * The arguments every suite command shares: rows (--suite or --shape),
 * --dtype (default f32, also written into each row) and --threads (0: all).
 * Values may be NULL when the flag was not given. 0, or an exit code.
 */
int suite_args(const char *suite, const char *shape, const char *dtype_arg,
               const char *threads_arg, row *rows, int *n_rows, sdpa_dtype *dtype, int *threads);

/*
 * The backends a suite command runs, from --backends: NULL means every
 * present CPU backend but the float64 reference; "all" adds the reference
 * when with_ref_on_all; otherwise a comma list, each name known and present
 * here, in the order given. 0, or an exit code after printing the problem.
 */
int suite_backends(sdpa_context *ctx, const char *list, int with_ref_on_all, const char **names,
                   int max, int *n);

/*
 * Does `backend` take row d in dtype (its capabilities and checks, as the
 * dispatcher sees them)? 1, or 0 with the reason in why. A command skips
 * what a backend does not take; a refusal of what it takes is a failure.
 */
int suite_claims(sdpa_context *ctx, const sdpa_call_desc *d, sdpa_dtype dtype,
                 const char *backend, char *why, size_t n);

/* Collects "backend: reason" pairs of suite_claims refusals, and prints
 * each once ("# not run: ..."), on stdout, as a comment or JSON line. */
void suite_note_unclaimed(const char *backend, const char *why);
void suite_print_unclaimed(int json);

/* s as a JSON string literal on stdout. */
void suite_json_string(const char *s);

/* 4 B Hq Sq Skv D, halved for causal with Sq == Skv; with seq_len_kv > 0
 * the keys counted are the real ones (the work a call must do). */
double suite_flops(const sdpa_call_desc *d, int64_t seq_len_kv);

/* Random inputs in [-1, 1) and an output of out_dtype for one row, BSHD;
 * with seq_len_kv > 0, the padding mask (mask points at mask_store, else
 * NULL). The timing tools write the inputs' dtype, as a model's layer and
 * the peers do (an f32 output for bf16 inputs writes twice the bytes: a
 * fifth of cpu.amx's time outside the tiles on SDXL's cross row); `sdpa
 * check` keeps f32 for its comparison. */
typedef struct problem {
    sdpa_tensor q, k, v, out;
    float *lse;
    const sdpa_mask *mask;
    sdpa_mask mask_store;
    int32_t *lens;
    sparse_pattern sparse; /* problem_sparse */
} problem;

/* Adds row r's sparse pattern (if any) to p's mask. 0, or -1 with the
 * problem in err. */
int problem_sparse(problem *p, const row *r, char *err, size_t n);

int problem_make(problem *p, const sdpa_call_desc *d, int64_t seq_len_kv, sdpa_dtype dtype,
                 sdpa_dtype out_dtype, int with_lse);
void problem_free(problem *p);

/* What a backward call of a problem adds: a random dout in the inputs'
 * dtype and f32 gradients; problem_backward_make also fills the problem's
 * out and LSE by one forward call on ctx (the dispatcher's choice), which
 * needs p made with_lse. 0 on failure (the library's message stands). */
typedef struct problem_grads {
    sdpa_tensor dout, dq, dk, dv;
} problem_grads;

int problem_backward_make(problem_grads *g, problem *p, sdpa_context *ctx,
                          const sdpa_call_desc *d);
void problem_backward_free(problem_grads *g);

#endif
