/*
 * sp.h - `sdpa run --sp`: the call computed sequence-parallel over MPI
 * (libsdpa_mpi), for tools built with MPI (SDPA_HAVE_MPI). Every rank reads
 * the whole inputs; each computes its shard; rank 0 gathers the output and
 * the LSE, so the result can be compared with the single-process run.
 */
#ifndef SDPA_TOOL_SP_H
#define SDPA_TOOL_SP_H

#include "sdpa.h"

typedef struct sdpa_mpi_plan sdpa_mpi_plan;

typedef struct sp_session {
    int active, rank, size, ulysses, ring, inited_here;
    int zigzag; /* SPEC:zigzag, the load-balanced causal split */
    sdpa_mpi_plan *plans[4]; /* sp_attention_all's, by shape */
    int64_t keys[4][5];
} sp_session;

/* Parses ring | ulysses | usp:UxR, each optionally :zigzag (the
 * load-balanced causal split), initialises MPI if the process has not.
 * 0, or an exit code after printing the problem (before any collective). */
int sp_begin(const char *spec, sp_session *s);

/* Every rank's exit code made one (the largest), so no rank waits in a
 * collective for one that gave up. */
int sp_agree(const sp_session *s, int rc);

/* The call over the ranks; on rank 0, out ([B, Sq, Hq, D] f32) and lse
 * ([B, Hq, Sq], or NULL) receive the whole result. Prints, per rank, what
 * it moved and how much of the time communication added. SDPA_OK or the
 * status, with the message printed. */
sdpa_status sp_forward(const sp_session *s, sdpa_context *ctx, const sdpa_tensor *q,
                       const sdpa_tensor *k, const sdpa_tensor *v, float *out, float *lse,
                       const sdpa_params *p);

/*
 * `sdpa bench --sp`: each row timed sequence-parallel, reps times after a
 * warm-up, random local data (every rank its own shard). Rank 0 prints, per
 * row and rank, the median time, its compute and blocked parts, bytes sent
 * and received, the overlap (1 - blocked / total) and the row's GFLOP/s
 * over all ranks. 0, or an exit code.
 */
int sp_bench(const sp_session *s, sdpa_context *ctx, const char *const *names,
             const sdpa_call_desc *rows, int n_rows, sdpa_dtype dtype, int reps);

/*
 * For `sdpa dit --sp`: the call over the ranks, and every rank receives the
 * whole output ([1, Sq, H, D] f32, an allgather), so the rest of a
 * replicated model runs on. Plans are kept per shape for the session.
 */
sdpa_status sp_attention_all(sp_session *s, sdpa_context *ctx, const sdpa_tensor *q,
                             const sdpa_tensor *k, const sdpa_tensor *v, float *out);

void sp_end(sp_session *s);

/* Whether the MPI library takes CUDA device buffers (sdpa_mpi_cuda_aware). */
int sp_cuda_aware(void);

#endif
