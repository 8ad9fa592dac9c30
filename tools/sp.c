/* sp.c - see sp.h. */
#include "sp.h"
#include "tool.h"

#include "sdpa_mpi.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sp_begin(const char *spec, sp_session *s)
{
    memset(s, 0, sizeof *s);
    int u = 0, r = 0;
    if (strcmp(spec, "ring") != 0 && strcmp(spec, "ulysses") != 0 &&
        (sscanf(spec, "usp:%dx%d", &u, &r) != 2 || u < 1 || r < 1))
        return tool_usage_error("--sp '%s' unknown, expected ring, ulysses or usp:UxR", spec);
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided;
        MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
        s->inited_here = 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &s->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &s->size);
    s->ulysses = strcmp(spec, "ulysses") == 0 ? s->size : u ? u : 1;
    s->ring = strcmp(spec, "ring") == 0 ? s->size : r ? r : 1;
    s->active = 1;
    if ((int64_t)s->ulysses * s->ring != s->size) {
        int rc = tool_usage_error("--sp %s: %d x %d is not the %d ranks mpirun started", spec,
                                  s->ulysses, s->ring, s->size);
        sp_end(s);
        return rc;
    }
    return 0;
}

int sp_agree(const sp_session *s, int rc)
{
    int all = rc;
    MPI_Allreduce(&rc, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    (void)s;
    return all;
}

sdpa_status sp_forward(const sp_session *s, sdpa_context *ctx, const sdpa_tensor *q,
                       const sdpa_tensor *k, const sdpa_tensor *v, float *out, float *lse,
                       const sdpa_params *p)
{
    const int64_t B = q->size[0], Sq = q->size[1], Hq = q->size[2], D = q->size[3];
    sdpa_mpi_shape shape = {B, Sq, k->size[1], Hq, k->size[2], D, q->dtype, p->causal};
    sdpa_mpi_plan *plan;
    sdpa_status st = sdpa_mpi_plan_create(MPI_COMM_WORLD, s->ulysses, s->ring, &shape, NULL,
                                          NULL, &plan);
    if (st != SDPA_OK) {
        if (s->rank == 0)
            fprintf(stderr, "sdpa: error: %s\n", sdpa_mpi_last_error());
        return st;
    }
    int64_t q0, qn, k0, kn;
    sdpa_mpi_rows(plan, -1, 0, &q0, &qn);
    sdpa_mpi_rows(plan, -1, 1, &k0, &kn);
    const size_t es = sdpa_dtype_size(q->dtype);
    sdpa_tensor lq = *q, lk = *k, lv = *v; /* this rank's rows of the whole inputs */
    lq.data = (char *)q->data + q0 * q->stride[1] * (int64_t)es, lq.size[1] = qn;
    lk.data = (char *)k->data + k0 * k->stride[1] * (int64_t)es, lk.size[1] = kn;
    lv.data = (char *)v->data + k0 * v->stride[1] * (int64_t)es, lv.size[1] = kn;
    float *lo = malloc(sizeof(float) * (size_t)(B * (qn ? qn : 1) * Hq * D));
    float *ll = malloc(sizeof(float) * (size_t)(B * Hq * (qn ? qn : 1)));
    sdpa_tensor to = sdpa_tensor_bshd(lo, SDPA_F32, B, qn ? qn : 1, Hq, D);
    sdpa_params sp = *p;
    sp.causal = SDPA_CAUSAL_NONE, sp.mask = NULL; /* the plan carries causal */
    st = lo && ll ? SDPA_OK : SDPA_OUT_OF_MEMORY;
    int local = st != SDPA_OK, any = 0;
    MPI_Allreduce(&local, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (!any)
        st = sdpa_mpi_forward(plan, ctx, qn ? &lq : NULL, kn ? &lk : NULL, kn ? &lv : NULL,
                              qn ? &to : NULL, ll, &sp);
    else
        st = SDPA_OUT_OF_MEMORY;
    if (st != SDPA_OK) {
        fprintf(stderr, "sdpa: error: rank %d: %s\n", s->rank,
                any ? "out of memory for the local result" : sdpa_mpi_last_error());
    } else {
        /* rank 0 gathers: per batch entry, each rank's rows are a block of
         * qn * Hq * D floats of out and, per head, qn floats of the LSE */
        int *counts = malloc(sizeof(int) * 2 * (size_t)s->size), *displs = counts + s->size;
        for (int r = 0; r < s->size; r++) {
            int64_t f, n;
            sdpa_mpi_rows(plan, r, 0, &f, &n);
            counts[r] = (int)(n * Hq * D), displs[r] = (int)(f * Hq * D);
        }
        for (int64_t b = 0; b < B; b++)
            MPI_Gatherv(lo + b * qn * Hq * D, (int)(qn * Hq * D), MPI_FLOAT,
                        out ? out + b * Sq * Hq * D : NULL, counts, displs, MPI_FLOAT, 0,
                        MPI_COMM_WORLD);
        for (int r = 0; r < s->size; r++)
            counts[r] /= (int)(Hq * D), displs[r] /= (int)(Hq * D);
        for (int64_t bh = 0; bh < B * Hq; bh++)
            MPI_Gatherv(ll + bh * qn, (int)qn, MPI_FLOAT, lse ? lse + bh * Sq : NULL, counts,
                        displs, MPI_FLOAT, 0, MPI_COMM_WORLD);
        free(counts);
        sdpa_mpi_stats ms;
        sdpa_mpi_last_stats(plan, &ms);
        printf("rank %d/%d  rows %lld..%lld  %.3f ms  compute %.3f ms  waited %.3f ms  sent %lld "
               "B  received %lld B  overlap %.0f%%\n",
               s->rank, s->size, (long long)q0, (long long)(q0 + qn), ms.total_ms, ms.compute_ms,
               ms.wait_ms, (long long)ms.bytes_sent, (long long)ms.bytes_received,
               ms.total_ms > 0 ? 100.0 * (1.0 - ms.wait_ms / ms.total_ms) : 100.0);
        fflush(stdout);
    }
    free(lo), free(ll);
    sdpa_mpi_plan_destroy(plan);
    return st;
}

void sp_end(sp_session *s)
{
    if (s->active && s->inited_here) {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized)
            MPI_Finalize();
    }
    s->active = 0;
}
