/*
 * sp_internal.h - what the files of libsdpa_mpi share: the plan, the row
 * ranges a forward gathers, and the helpers of plan.c (errors, the agreed
 * verdict, the splits) and exchange.c (packing, all-to-alls, gathers,
 * scatters) that forward.c calls. Not installed.
 */
#ifndef SDPA_MPI_SP_INTERNAL_H
#define SDPA_MPI_SP_INTERNAL_H

#include "sdpa_mpi.h"
#include "../core/alloc.h" /* every allocation through the core's funnel: faults can be injected */

#include <stddef.h>
#include <stdint.h>

struct sdpa_mpi_plan {
    MPI_Comm comm, group, ring; /* duplicate of the caller's; its two splits */
    int size, rank, U, R, u, r;
    sdpa_mpi_shape s;
    int kv_replicated;          /* ulysses % Hkv == 0: each member gets one KV head */
    int nseg;                   /* row ranges per rank: 1, or 2 under the zigzag split */
    int64_t *q_first, *q_count, *kv_first, *kv_count; /* [rank * 2 + range] */
    sdpa_mpi_stats stats;
};

/* This thread's last libsdpa_mpi error (sdpa_mpi_last_error). */
extern _Thread_local char sp_last_error[512];

typedef struct segment {
    int64_t first, n;
    char *data;
} segment;

/* A group's rows of q or k/v for this member's heads: its ranges one
 * after the other (range-major), in one allocation. */
typedef struct gathered {
    int nseg;
    segment seg[2];
    int64_t n; /* all ranges */
    char *data;
} gathered;


/* Records this thread's error (printf-style) and returns st. */
sdpa_status sp_fail(sdpa_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Monotonic milliseconds, for the statistics. */
double sp_now_ms(void);

/* Bytes per element of an input dtype. */
size_t sp_esize(sdpa_dtype t);

/* Every rank's local verdict (its message kept) made one: status of the
 * worst rank; the ranks that were fine say which rank failed. */
sdpa_status sp_agree(MPI_Comm comm, sdpa_status local, int rank);

/* Rows rank i holds of q (kv = 0) or k/v, all its ranges. */
int64_t sp_local_rows(const sdpa_mpi_plan *p, int i, int kv);

/* dst[b][i][h][d] = t(b, i0 + i, h0 + h, d), for i < n, h < nh. */
void sp_pack(const sdpa_tensor *t, int64_t i0, int64_t n, int64_t h0, int64_t nh, char *dst);

/* A contiguous [B, n, h, D] block of `dtype` at p, as a tensor. */
sdpa_tensor sp_block(void *p, sdpa_dtype dtype, int64_t B, int64_t n, int64_t h, int64_t D);

/* Range g of ring group r: its members' parts, in member order. */
void sp_group_range(const sdpa_mpi_plan *p, int r, int kv, int g, int64_t *first, int64_t *n);

/* The group's rows of x (q: kv = 0, or k/v) for this member's heads. */
sdpa_status sp_gather_group(sdpa_mpi_plan *p, const sdpa_tensor *x, int kv, int64_t heads,
                            gathered *g);

/*
 * This rank's rows of the result, from the group's accumulators (acc:
 * range-major [B, n_r, hq, D] blocks, lacc [B, hq, n_r]): every member's
 * rows of this member's heads go to it in one all-to-all (U > 1) as rows
 * of D + 1 floats (O, then the LSE), and are cast once into out.
 */
sdpa_status sp_scatter_result(sdpa_mpi_plan *p, const gathered *q, const float *acc,
                              const float *lacc, int64_t hq, sdpa_tensor *out, float *lse);

#endif
