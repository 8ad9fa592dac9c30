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
    char grid[64];
    const char *zz = strstr(spec, ":zigzag");
    if (strlen(spec) >= sizeof grid || (zz && zz[7]))
        return tool_usage_error("--sp '%s' unknown, expected ring, ulysses or usp:UxR, "
                                "optionally followed by :zigzag", spec);
    snprintf(grid, sizeof grid, "%.*s", zz ? (int)(zz - spec) : (int)strlen(spec), spec);
    s->zigzag = zz != NULL;
    if (strcmp(grid, "ring") != 0 && strcmp(grid, "ulysses") != 0 &&
        (sscanf(grid, "usp:%dx%d", &u, &r) != 2 || u < 1 || r < 1))
        return tool_usage_error("--sp '%s' unknown, expected ring, ulysses or usp:UxR, "
                                "optionally followed by :zigzag", spec);
    spec = grid;
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

/* This rank's rows of the whole x ([B, S, H, D]): a view when they are
 * one range, else copied out (*copy, the caller frees it). */
static sdpa_tensor local_rows(const sdpa_mpi_plan *plan, int kv, const sdpa_tensor *x,
                              void **copy)
{
    int64_t f[2], n[2];
    const int nr = sdpa_mpi_ranges(plan, -1, kv, f, n);
    const int64_t es = (int64_t)sdpa_dtype_size(x->dtype), total = n[0] + n[1];
    sdpa_tensor t = *x;
    *copy = NULL;
    if (nr == 1) {
        t.data = (char *)x->data + f[0] * x->stride[1] * es, t.size[1] = total;
        return t;
    }
    const int64_t B = x->size[0], H = x->size[2], D = x->size[3];
    char *dst = malloc((size_t)(es * B * (total ? total : 1) * H * D));
    *copy = dst;
    t = sdpa_tensor_bshd(dst, x->dtype, B, total ? total : 1, H, D);
    for (int64_t b = 0; dst && b < B; b++)
        for (int64_t li = 0, g = 0; g < 2; g++)
            for (int64_t i = 0; i < n[g]; i++, li++)
                for (int64_t h = 0; h < H; h++) {
                    const char *src = (const char *)x->data +
                                      (b * x->stride[0] + (f[g] + i) * x->stride[1] +
                                       h * x->stride[2]) * es;
                    for (int64_t d = 0; d < D; d++)
                        memcpy(dst + (((b * total + li) * H + h) * D + d) * es,
                               src + d * x->stride[3] * es, (size_t)es);
                }
    if (!dst)
        t.data = NULL;
    return t;
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
    sdpa_mpi_shape shape = {B, Sq, k->size[1], Hq, k->size[2], D, q->dtype, p->causal, s->zigzag};
    sdpa_mpi_plan *plan;
    sdpa_status st = sdpa_mpi_plan_create(MPI_COMM_WORLD, s->ulysses, s->ring, &shape, NULL,
                                          NULL, &plan);
    if (st != SDPA_OK) {
        if (s->rank == 0)
            fprintf(stderr, "sdpa: error: %s\n", sdpa_mpi_last_error());
        return st;
    }
    int64_t q0, qn, kn, k0;
    sdpa_mpi_rows(plan, -1, 0, &q0, &qn);
    sdpa_mpi_rows(plan, -1, 1, &k0, &kn);
    void *cq, *ck, *cv;
    sdpa_tensor lq = local_rows(plan, 0, q, &cq), lk = local_rows(plan, 1, k, &ck),
                lv = local_rows(plan, 1, v, &cv);
    float *lo = malloc(sizeof(float) * (size_t)(B * (qn ? qn : 1) * Hq * D));
    float *ll = malloc(sizeof(float) * (size_t)(B * Hq * (qn ? qn : 1)));
    sdpa_tensor to = sdpa_tensor_bshd(lo, SDPA_F32, B, qn ? qn : 1, Hq, D);
    sdpa_params sp = *p;
    sp.causal = SDPA_CAUSAL_NONE; /* the plan carries causal */
    /* --sparse: a block map goes to every rank's blocks (a window is
     * refused by libsdpa_mpi, naming it); run.c refuses the other masks */
    sp.mask = p->mask && (p->mask->blocks || p->mask->window) ? p->mask : NULL;
    st = lo && ll && lq.data && lk.data && lv.data ? SDPA_OK : SDPA_OUT_OF_MEMORY;
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
        /* rank 0 gathers range by range: per batch entry, each rank's rows
         * of a range are a block of n * Hq * D floats of out and, per head,
         * n floats of the LSE */
        int *counts = malloc(sizeof(int) * 2 * (size_t)s->size), *displs = counts + s->size;
        /* the LSE only when rank 0 wants it: the ranks must agree on which
         * gathers run (a root without a buffer would be written through NULL) */
        int want_lse = lse != NULL;
        MPI_Bcast(&want_lse, 1, MPI_INT, 0, MPI_COMM_WORLD);
        int64_t mf[2], mn[2];
        const int nr = sdpa_mpi_ranges(plan, -1, 0, mf, mn);
        for (int g = 0; g < nr; g++) {
            const int64_t at = g ? mn[0] : 0; /* the range's first local row */
            for (int r = 0; r < s->size; r++) {
                int64_t f[2], n[2];
                sdpa_mpi_ranges(plan, r, 0, f, n);
                counts[r] = (int)(n[g] * Hq * D), displs[r] = (int)(f[g] * Hq * D);
            }
            for (int64_t b = 0; b < B; b++)
                MPI_Gatherv(lo + (b * qn + at) * Hq * D, (int)(mn[g] * Hq * D), MPI_FLOAT,
                            out ? out + b * Sq * Hq * D : NULL, counts, displs, MPI_FLOAT, 0,
                            MPI_COMM_WORLD);
            for (int r = 0; r < s->size; r++)
                counts[r] /= (int)(Hq * D), displs[r] /= (int)(Hq * D);
            for (int64_t bh = 0; want_lse && bh < B * Hq; bh++)
                MPI_Gatherv(ll + bh * qn + at, (int)mn[g], MPI_FLOAT, lse ? lse + bh * Sq : NULL,
                            counts, displs, MPI_FLOAT, 0, MPI_COMM_WORLD);
        }
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
    free(lo), free(ll), free(cq), free(ck), free(cv);
    sdpa_mpi_plan_destroy(plan);
    return st;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int sp_bench(const sp_session *s, sdpa_context *ctx, const char *const *names,
             const sdpa_call_desc *rows, int n_rows, sdpa_dtype dtype, int reps)
{
    if (s->rank == 0)
        printf("# sdpa bench --sp: ulysses %d x ring %d = %d ranks, dtype %s, %d reps (medians; "
               "time blocked on messages the compute did not hide)\n"
               "%-20s %4s %10s %10s %10s %12s %12s %8s %9s\n",
               s->ulysses, s->ring, s->size, sdpa_dtype_name(dtype), reps, "row", "rank",
               "total_ms", "compute_ms", "blocked_ms", "sent_B", "received_B", "overlap",
               "GFLOP/s");
    int rc = 0;
    for (int r = 0; r < n_rows && rc == 0; r++) {
        const sdpa_call_desc *d = &rows[r];
        sdpa_mpi_shape shape = {d->B, d->Sq, d->Skv, d->Hq, d->Hkv, d->D, dtype, d->causal,
                                s->zigzag};
        sdpa_mpi_plan *plan;
        if (sdpa_mpi_plan_create(MPI_COMM_WORLD, s->ulysses, s->ring, &shape, NULL, NULL,
                                 &plan) != SDPA_OK) {
            if (s->rank == 0)
                fprintf(stderr, "sdpa: error: row %s: %s\n", names[r], sdpa_mpi_last_error());
            rc = 2;
            break;
        }
        int64_t q0, qn, k0, kn;
        sdpa_mpi_rows(plan, -1, 0, &q0, &qn);
        sdpa_mpi_rows(plan, -1, 1, &k0, &kn);
        const size_t es = sdpa_dtype_size(dtype);
        const size_t nq = (size_t)(d->B * (qn ? qn : 1) * d->Hq * d->D);
        const size_t nk = (size_t)(d->B * (kn ? kn : 1) * d->Hkv * d->D);
        float *qf = malloc(nq * 4), *kf = malloc(nk * 4), *vf = malloc(nk * 4);
        float *o = malloc(nq * 4), *l = malloc(sizeof(float) * (size_t)(d->B * d->Hq * (qn ? qn : 1)));
        double *t = malloc(sizeof(double) * 3 * (size_t)reps);
        int local = !qf || !kf || !vf || !o || !l || !t, any = 0;
        MPI_Allreduce(&local, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        sdpa_mpi_stats ms = {0, 0, 0, 0, 0};
        if (!any) {
            uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(s->rank + 1);
            float *in[3] = {qf, kf, vf};
            const size_t n[3] = {nq, nk, nk};
            for (int i = 0; i < 3; i++) {
                for (size_t j = 0; j < n[i]; j++) {
                    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                    in[i][j] = (float)((x >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
                }
                if (dtype != SDPA_F32)
                    sdpa_convert(in[i], SDPA_F32, in[i], dtype, n[i]);
            }
            sdpa_tensor tq = sdpa_tensor_bshd(qf, dtype, d->B, qn ? qn : 1, d->Hq, d->D);
            sdpa_tensor tk = sdpa_tensor_bshd(kf, dtype, d->B, kn ? kn : 1, d->Hkv, d->D);
            sdpa_tensor tv = sdpa_tensor_bshd(vf, dtype, d->B, kn ? kn : 1, d->Hkv, d->D);
            sdpa_tensor to = sdpa_tensor_bshd(o, SDPA_F32, d->B, qn ? qn : 1, d->Hq, d->D);
            (void)es;
            for (int i = -1; i < reps && rc == 0; i++) { /* -1: the warm-up */
                if (sdpa_mpi_forward(plan, ctx, qn ? &tq : NULL, kn ? &tk : NULL,
                                     kn ? &tv : NULL, qn ? &to : NULL, l, NULL) != SDPA_OK) {
                    fprintf(stderr, "sdpa: error: rank %d, row %s: %s\n", s->rank, names[r],
                            sdpa_mpi_last_error());
                    rc = 1;
                    break;
                }
                sdpa_mpi_last_stats(plan, &ms);
                if (i >= 0)
                    t[i] = ms.total_ms, t[reps + i] = ms.compute_ms, t[2 * reps + i] = ms.wait_ms;
            }
        } else {
            rc = 1;
        }
        double mine[6] = {0}, *all = s->rank == 0 ? malloc(sizeof mine * (size_t)s->size) : NULL;
        if (rc == 0) {
            for (int k = 0; k < 3; k++) {
                qsort(t + k * reps, (size_t)reps, sizeof *t, cmp_double);
                mine[k] = t[k * reps + reps / 2];
            }
            mine[3] = (double)ms.bytes_sent, mine[4] = (double)ms.bytes_received;
        }
        MPI_Gather(mine, 6, MPI_DOUBLE, all, 6, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        if (s->rank == 0 && rc == 0) {
            double slowest = 0;
            for (int p = 0; p < s->size; p++)
                slowest = all[6 * p] > slowest ? all[6 * p] : slowest;
            const double flops = 4.0 * (double)(d->B * d->Hq * d->Sq * d->Skv * d->D) /
                                 (d->causal && d->Sq == d->Skv ? 2 : 1);
            for (int p = 0; p < s->size; p++) {
                const double *m = all + 6 * p;
                printf("%-20s %4d %10.3f %10.3f %10.3f %12.0f %12.0f %7.0f%% %9.2f\n", names[r],
                       p, m[0], m[1], m[2], m[3], m[4], m[0] > 0 ? 100.0 * (1 - m[2] / m[0]) : 100.0,
                       flops / (slowest * 1e6));
            }
            fflush(stdout);
        }
        free(all), free(qf), free(kf), free(vf), free(o), free(l), free(t);
        sdpa_mpi_plan_destroy(plan);
        rc = sp_agree(s, rc);
    }
    return rc;
}

sdpa_status sp_attention_all(sp_session *s, sdpa_context *ctx, const sdpa_tensor *q,
                             const sdpa_tensor *k, const sdpa_tensor *v, float *out)
{
    const int64_t Sq = q->size[1], Skv = k->size[1], H = q->size[2], D = q->size[3];
    const int64_t key[5] = {Sq, Skv, H, D, q->dtype};
    int slot = -1;
    for (int i = 0; i < 4 && slot < 0; i++)
        if (s->plans[i] && memcmp(s->keys[i], key, sizeof key) == 0)
            slot = i;
    if (slot < 0) { /* same shapes in the same order on every rank: collective-safe */
        for (int i = 0; i < 4 && slot < 0; i++)
            if (!s->plans[i])
                slot = i;
        if (slot < 0)
            sdpa_mpi_plan_destroy(s->plans[slot = 3]), s->plans[3] = NULL;
        sdpa_mpi_shape shape = {1, Sq, Skv, H, k->size[2], D, q->dtype, SDPA_CAUSAL_NONE, 0};
        sdpa_status st = sdpa_mpi_plan_create(MPI_COMM_WORLD, s->ulysses, s->ring, &shape, NULL,
                                              NULL, &s->plans[slot]);
        if (st != SDPA_OK) {
            fprintf(stderr, "sdpa: error: rank %d: %s\n", s->rank, sdpa_mpi_last_error());
            return st;
        }
        memcpy(s->keys[slot], key, sizeof key);
    }
    sdpa_mpi_plan *plan = s->plans[slot];
    int64_t q0, qn, k0, kn;
    sdpa_mpi_rows(plan, -1, 0, &q0, &qn); /* one range each: this plan has no zigzag */
    sdpa_mpi_rows(plan, -1, 1, &k0, &kn);
    void *unused;
    sdpa_tensor lq = local_rows(plan, 0, q, &unused), lk = local_rows(plan, 1, k, &unused),
                lv = local_rows(plan, 1, v, &unused);
    /* this rank's rows straight into their place in out */
    sdpa_tensor to = sdpa_tensor_bshd(out + q0 * H * D, SDPA_F32, 1, qn ? qn : 1, H, D);
    sdpa_status st = sdpa_mpi_forward(plan, ctx, qn ? &lq : NULL, kn ? &lk : NULL,
                                      kn ? &lv : NULL, qn ? &to : NULL, NULL, NULL);
    if (st != SDPA_OK) {
        fprintf(stderr, "sdpa: error: rank %d: %s\n", s->rank, sdpa_mpi_last_error());
        return st;
    }
    int *counts = malloc(sizeof(int) * 2 * (size_t)s->size), *displs = counts ? counts + s->size
                                                                                : NULL;
    if (!counts)
        return SDPA_OUT_OF_MEMORY;
    for (int r = 0; r < s->size; r++) {
        int64_t f, n;
        sdpa_mpi_rows(plan, r, 0, &f, &n);
        counts[r] = (int)(n * H * D), displs[r] = (int)(f * H * D);
    }
    MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, out, counts, displs, MPI_FLOAT, MPI_COMM_WORLD);
    free(counts);
    return SDPA_OK;
}

void sp_end(sp_session *s)
{
    for (int i = 0; i < 4; i++)
        if (s->plans[i])
            sdpa_mpi_plan_destroy(s->plans[i]), s->plans[i] = NULL;
    if (s->active && s->inited_here) {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized)
            MPI_Finalize();
    }
    s->active = 0;
}

int sp_cuda_aware(void) { return sdpa_mpi_cuda_aware(); }
