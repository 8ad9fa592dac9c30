/*
 * sdpa_mpi.h - sequence-parallel attention over MPI (libsdpa_mpi): one
 * attention call whose sequence is split across the ranks of the caller's
 * communicator, computed as ring attention, Ulysses (all-to-all from a
 * sequence split to a head split and back) or both on a 2-D grid (USP),
 * with any libsdpa backend that returns the LSE doing the local work.
 *
 * MPI stays out of the core library's ABI: this is a separate library
 * (libsdpa_mpi.so, linked with the MPI it was built against) and header.
 * It never calls MPI_Init or MPI_Finalize and never uses MPI_COMM_WORLD on
 * its own: a plan duplicates the communicator it is given, so its messages
 * cannot meet the caller's. Only the calling thread communicates, so
 * MPI_THREAD_FUNNELED suffices (SINGLE too, if the process has one thread
 * calling MPI); the library's worker threads never touch MPI.
 *
 * Ranks form a grid of `ulysses` x `ring` = size: rank = r * ulysses + u.
 * The sequences (q's Sq and k/v's Skv) are cut into size shards, rank p
 * holding shard p (sdpa_mpi_rows: ceil(S / size) rows each, the last ones
 * shorter or empty; explicit counts are accepted instead), or for causal
 * attention in the load-balanced zigzag split (sdpa_mpi_shape.zigzag). A Ulysses group
 * (the ulysses ranks of one r) gathers its shards' rows for Hq / ulysses
 * of the heads; KV heads are split when Hkv % ulysses == 0 and replicated
 * when ulysses % Hkv == 0 (grouped-query), otherwise the plan is refused
 * with the degrees that would work. The ring then passes each group's K/V
 * around the groups, posting the next block's send and receive before the
 * current block is computed; partial results are merged in float32
 * (sdpa_merge) and cast once.
 *
 * Every argument is checked on every rank and the verdict agreed with one
 * MPI_Allreduce before any data moves, so ranks that disagree (shapes,
 * dtypes, degrees, causal, tensor sizes) all get INVALID_ARGUMENT, never a
 * hang or an MPI_Abort. A failure on one rank later in a call (out of
 * memory, a refused local attention) is agreed the same way before the
 * next exchange and before any output is written: every rank returns that
 * status from the same call, its outputs as they were. A rank that exits
 * or dies inside a call is the MPI implementation's to handle (Open MPI's
 * mpirun ends the whole job); libsdpa_mpi does not survive a lost rank.
 */
#ifndef SDPA_MPI_H
#define SDPA_MPI_H

#include "sdpa.h"

#include <mpi.h>

#ifdef __cplusplus
extern "C" {
#endif

#pragma GCC visibility push(default)

/* The global call every rank takes part in. */
typedef struct sdpa_mpi_shape {
    int64_t B, Sq, Skv, Hq, Hkv, D;
    sdpa_dtype dtype;   /* q, k and v */
    sdpa_causal causal; /* on the global positions */
    /* 1: the load-balanced (zigzag) split for causal attention. Each
     * sequence is cut into 2 R chunks (ceil); ring group r holds chunks r
     * and 2R - 1 - r (an early one, with little to see, and a late one),
     * each split among its U members in ceil blocks. A rank's local tensors
     * then hold two ranges of rows, its part of the first chunk followed by
     * its part of the second (sdpa_mpi_ranges). Plain causal ceil blocks
     * leave the last ring group R times the work of the first; zigzag
     * evens it out. Not with explicit counts. 0: ceil blocks or counts. */
    int zigzag;
} sdpa_mpi_shape;

typedef struct sdpa_mpi_plan sdpa_mpi_plan;

/*
 * Collective over comm. ulysses * ring must be comm's size. q_counts and
 * kv_counts (size entries each, summing to Sq and Skv) give explicit
 * splits, or NULL for ceil blocks. *out is NULL on failure, on every rank.
 */
sdpa_status sdpa_mpi_plan_create(MPI_Comm comm, int ulysses, int ring,
                                 const sdpa_mpi_shape *shape, const int64_t *q_counts,
                                 const int64_t *kv_counts, sdpa_mpi_plan **out);
void sdpa_mpi_plan_destroy(sdpa_mpi_plan *plan); /* collective (frees the duplicate) */

/* The rows of the global q (kv = 0) or k/v (kv = 1) sequence a rank
 * holds: [*first, *first + *count). rank -1: the calling rank. Under
 * zigzag a rank holds two ranges: *count is then their total (the rows of
 * its local tensors) and *first the start of the first; sdpa_mpi_ranges
 * gives both. */
void sdpa_mpi_rows(const sdpa_mpi_plan *plan, int rank, int kv, int64_t *first, int64_t *count);

/* A rank's ranges of rows, in the order its local tensors hold them:
 * [first[g], first[g] + count[g]) for g < the returned number (1, or 2
 * under zigzag; count[1] is 0 when there is one). */
int sdpa_mpi_ranges(const sdpa_mpi_plan *plan, int rank, int kv, int64_t first[2],
                    int64_t count[2]);

/*
 * Collective. q [B, count_q, Hq, D], k and v [B, count_kv, Hkv, D] are this
 * rank's rows (CPU memory, any strides; or CUDA device memory with
 * contiguous heads, on every rank alike); out [B, count_q, Hq, D] (any
 * dtype) and lse (float32 [B, Hq, count_q], or NULL; device memory with
 * device tensors) receive this rank's rows of the result. Device tensors
 * are staged through host memory: rows copied to the host, messages
 * between host buffers, each block's attention on the device through the
 * context's CUDA backends, the result copied back (written and compiled,
 * not yet run on a GPU; causal on device tensors needs shard boundaries on
 * the diagonal, since the CUDA backends take no general mask). params: scale, backend, deterministic, component
 * and quant are honoured for the local calls; causal comes from the plan.
 * params->mask may carry a block map (mask->blocks, sdpa.h) over the
 * global positions, the same on every rank, and nothing else
 * (INVALID_ARGUMENT otherwise): each block's attention gets its piece of
 * the map (sdpa_block_map_slice: its query rows, the visiting keys, the
 * member's heads), and a piece that lists nothing is skipped, so a sparse
 * pattern saves compute on every rank (not messages: K/V still travel the
 * whole ring). Shard boundaries need not fall on the map's blocks. With
 * k_joint, the map covers the sequence only; the joint keys are seen by
 * every query. Maps are CPU-only (UNSUPPORTED with device tensors). ctx
 * runs the local attention.
 */
sdpa_status sdpa_mpi_forward(sdpa_mpi_plan *plan, sdpa_context *ctx, const sdpa_tensor *q,
                             const sdpa_tensor *k, const sdpa_tensor *v, sdpa_tensor *out,
                             float *lse, const sdpa_params *params);

/*
 * Joint attention (FLUX, SD3, Qwen-Image: text tokens attended with the
 * image): as sdpa_mpi_forward, and every query also attends k_joint,
 * v_joint [B, T, Hkv, D], the same on every rank (replicated text tokens),
 * counted exactly once: each rank computes them for its own rows (sliced by
 * head under Ulysses), outside the ring, never sent. They are not subject
 * to causal. The text tokens' own queries attend everything and are the
 * caller's to compute (every rank holds them: one local call over the
 * gathered K/V, or this function with the text as q). Cross-attention to
 * replicated text K/V needs no communication: a local sdpa_forward of each
 * rank's rows.
 */
sdpa_status sdpa_mpi_forward_joint(sdpa_mpi_plan *plan, sdpa_context *ctx, const sdpa_tensor *q,
                                   const sdpa_tensor *k, const sdpa_tensor *v,
                                   const sdpa_tensor *k_joint, const sdpa_tensor *v_joint,
                                   sdpa_tensor *out, float *lse, const sdpa_params *params);

/* 1 when the MPI library says it takes CUDA device buffers itself
 * (Open MPI's MPIX_Query_cuda_support), else 0. This release stages device
 * tensors through host memory either way (its packing is host code); the
 * answer says whether a direct path could be used. */
int sdpa_mpi_cuda_aware(void);

/* The calling thread's message for the last failing sdpa_mpi_* call (""
 * after a success); the core's sdpa_last_error() is not touched. */
const char *sdpa_mpi_last_error(void);

/* Per rank, what the last forward on this plan moved and waited for. */
typedef struct sdpa_mpi_stats {
    int64_t bytes_sent, bytes_received;
    double compute_ms;  /* local attention and merges            */
    double total_ms;    /* the whole call                         */
    double wait_ms;     /* blocked on messages the compute did not hide: ring
                         * waits, and every Ulysses all-to-all (nothing runs
                         * beside those) */
} sdpa_mpi_stats;
void sdpa_mpi_last_stats(const sdpa_mpi_plan *plan, sdpa_mpi_stats *out);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif

#endif
