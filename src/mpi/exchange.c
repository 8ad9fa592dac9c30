/*
 * exchange.c - libsdpa_mpi's data movement: packing [B, rows, heads, D]
 * blocks, the Ulysses all-to-alls, gathering a ring group's rows for this
 * member's heads, and scattering the result back to the caller's rows.
 */
#include "sp_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- packing: [B, rows, heads, D] blocks, contiguous, in the input dtype */

size_t sp_esize(sdpa_dtype t) { return t == SDPA_F32 ? 4 : 2; }

/* dst[b][i][h][d] = t(b, i0 + i, h0 + h, d), for i < n, h < nh. */
void sp_pack(const sdpa_tensor *t, int64_t i0, int64_t n, int64_t h0, int64_t nh, char *dst)
{
    const size_t es = sp_esize(t->dtype);
    const int64_t D = t->size[3];
    for (int64_t b = 0; b < t->size[0]; b++)
        for (int64_t i = 0; i < n; i++)
            for (int64_t h = 0; h < nh; h++) {
                const char *src = (const char *)t->data +
                                  (b * t->stride[0] + (i0 + i) * t->stride[1] +
                                   (h0 + h) * t->stride[2]) * (int64_t)es;
                if (t->stride[3] == 1) {
                    memcpy(dst, src, es * (size_t)D);
                } else {
                    for (int64_t d = 0; d < D; d++)
                        memcpy(dst + d * (int64_t)es, src + d * t->stride[3] * (int64_t)es, es);
                }
                dst += es * (size_t)D;
            }
}

/* A contiguous [B, n, h, D] block of `dtype` at p, as a tensor. */
sdpa_tensor sp_block(void *p, sdpa_dtype dtype, int64_t B, int64_t n, int64_t h, int64_t D)
{
    return sdpa_tensor_bshd(p, dtype, B, n, h, D);
}

/* Counts of an all-to-all: sc[U] and rc[U] rows to and from each member,
 * then MPI's int counts and displacements (4U ints), in one allocation.
 * Both are made (prepare_counts) before the ranks agree to exchange: a
 * rank that failed after that point would leave the others waiting in
 * MPI_Alltoallv. */
static int64_t *alloc_counts(const sdpa_mpi_plan *p)
{
    return sdpa__malloc(sizeof(int64_t) * 2 * (size_t)p->U + sizeof(int) * 4 * (size_t)p->U);
}

/* MPI's int counts and displacements from sc and rc (counts in rows of
 * D); a piece beyond int is refused, and the refusal agreed on like any
 * other local failure. */
static sdpa_status prepare_counts(const sdpa_mpi_plan *p, int64_t *sc)
{
    const int64_t *rc = sc + p->U;
    int *c = (int *)(sc + 2 * p->U);
    int64_t so = 0, ro = 0;
    for (int u = 0; u < p->U; u++) {
        if (sc[u] > 0x7fffffff || rc[u] > 0x7fffffff || so > 0x7fffffff || ro > 0x7fffffff)
            return sp_fail(SDPA_UNSUPPORTED, "sdpa_mpi_forward: an all-to-all piece exceeds 2^31 "
                           "rows of D (MPI counts are int)");
        c[u] = (int)sc[u], c[p->U + u] = (int)so, c[2 * p->U + u] = (int)rc[u];
        c[3 * p->U + u] = (int)ro;
        so += sc[u], ro += rc[u];
    }
    return SDPA_OK;
}

/* One all-to-all of [B, rows, heads, D] pieces within the Ulysses group,
 * in units of one D-row, with the counts prepare_counts made in sc. */
static sdpa_status alltoall(sdpa_mpi_plan *p, const void *send, const int64_t *sc, void *recv,
                            size_t row_bytes)
{
    const double t0 = sp_now_ms(); /* Ulysses' exchanges hide behind nothing: all of it is waiting */
    const int *c = (const int *)(sc + 2 * p->U);
    MPI_Datatype row;
    MPI_Type_contiguous((int)row_bytes, MPI_BYTE, &row);
    MPI_Type_commit(&row);
    const int e = MPI_Alltoallv(send, c, c + p->U, row, recv, c + 2 * p->U, c + 3 * p->U, row,
                                p->group);
    MPI_Type_free(&row);
    p->stats.wait_ms += sp_now_ms() - t0;
    return e == MPI_SUCCESS ? SDPA_OK : sp_fail(SDPA_DEVICE_ERROR, "sdpa_mpi_forward: "
                                                "MPI_Alltoallv failed");
}

/* Range g of ring group r: its members' parts, in member order. */
void sp_group_range(const sdpa_mpi_plan *p, int r, int kv, int g, int64_t *first, int64_t *n)
{
    const int64_t *f = kv ? p->kv_first : p->q_first, *c = kv ? p->kv_count : p->q_count;
    *first = f[2 * r * p->U + g], *n = 0;
    for (int u = 0; u < p->U; u++)
        *n += c[2 * (r * p->U + u) + g];
}

/* The group's rows of x (q: kv = 0, or k/v) for this member's heads. */
sdpa_status sp_gather_group(sdpa_mpi_plan *p, const sdpa_tensor *x, int kv, int64_t heads,
                            gathered *g)
{
    const sdpa_mpi_shape *s = &p->s;
    const int64_t *count = kv ? p->kv_count : p->q_count;
    const int base = p->r * p->U;
    const size_t row = sp_esize(s->dtype) * (size_t)s->D;
    const size_t rows_b = row * (size_t)heads; /* one row of all heads, one batch entry */
    g->nseg = p->nseg, g->n = 0;
    for (int r = 0; r < 2; r++) {
        sp_group_range(p, p->r, kv, r, &g->seg[r].first, &g->seg[r].n);
        if (r >= p->nseg)
            g->seg[r].n = 0;
        g->n += g->seg[r].n;
    }
    g->data = sdpa__malloc(rows_b * (size_t)(s->B * (g->n ? g->n : 1)));
    for (int r = 0, at = 0; r < 2; at += (int)g->seg[r].n, r++)
        g->seg[r].data = g->data ? g->data + rows_b * (size_t)(s->B * at) : NULL;
    const int64_t mine = sp_local_rows(p, p->rank, kv), mine0 = count[2 * p->rank];
    if (p->U == 1) { /* no message: a local failure is agreed on before the ring */
        if (!g->data)
            return sp_fail(SDPA_OUT_OF_MEMORY, "sdpa_mpi_forward: no memory for the gathered rows");
        for (int r = 0; r < g->nseg; r++) /* my ranges are the group's */
            if (g->seg[r].n)
                sp_pack(x, r ? mine0 : 0, g->seg[r].n, 0, heads, g->seg[r].data);
        return SDPA_OK;
    }
    /* send to member u: my rows of u's heads, range by range; receive from
     * u: u's rows of mine, range by range */
    const int64_t H = kv ? s->Hkv : s->Hq;
    int64_t *sc = alloc_counts(p), *rc = sc ? sc + p->U : NULL;
    char *sendbuf = sdpa__malloc(rows_b * (size_t)(s->B * (mine ? mine : 1) * p->U));
    char *recvbuf = sdpa__malloc(rows_b * (size_t)(s->B * (g->n ? g->n : 1)));
    sdpa_status st = g->data && sc && sendbuf && recvbuf
                         ? SDPA_OK
                         : sp_fail(SDPA_OUT_OF_MEMORY, "sdpa_mpi_forward: no memory for the "
                                   "all-to-all");
    for (int u = 0; st == SDPA_OK && u < p->U; u++)
        sc[u] = s->B * mine * heads, rc[u] = s->B * sp_local_rows(p, base + u, kv) * heads;
    if (st == SDPA_OK)
        st = prepare_counts(p, sc);
    /* every rank, or none, goes on to the all-to-all */
    if ((st = sp_agree(p->comm, st, p->rank)) != SDPA_OK) {
        free(sc), free(sendbuf), free(recvbuf);
        return st;
    }
    for (int u = 0; u < p->U; u++) {
        const int64_t h0 = kv && p->kv_replicated ? u * H / p->U : u * heads;
        char *dst = sendbuf + rows_b * (size_t)(s->B * mine * u);
        for (int r = 0; r < p->nseg; r++) {
            const int64_t n = count[2 * p->rank + r];
            if (n)
                sp_pack(x, r ? mine0 : 0, n, h0, heads, dst);
            dst += rows_b * (size_t)(s->B * n);
        }
    }
    st = alltoall(p, sendbuf, sc, recvbuf, row);
    p->stats.bytes_sent += (int64_t)rows_b * s->B * mine * (p->U - 1);
    p->stats.bytes_received += (int64_t)rows_b * s->B * (g->n - mine);
    /* member u's piece, per range r: [B, count_ur, heads, D] into range r's
     * rows from the parts of members before u */
    const char *src = recvbuf;
    int64_t at[2] = {0, 0};
    for (int u = 0; st == SDPA_OK && u < p->U; u++)
        for (int r = 0; r < p->nseg; r++) {
            const int64_t n = count[2 * (base + u) + r];
            for (int64_t b = 0; b < s->B; b++, src += rows_b * (size_t)n)
                memcpy(g->seg[r].data + rows_b * (size_t)(b * g->seg[r].n + at[r]), src,
                       rows_b * (size_t)n);
            at[r] += n;
        }
    free(sc), free(sendbuf), free(recvbuf);
    return st;
}

/* Row i (local numbering), head H of out and lse from one float32 row. */
static void emit(const sdpa_mpi_plan *p, int64_t b, int64_t i, int64_t H, const float *src,
                 float l, sdpa_tensor *out, float *lse, int64_t mine, float *tmp)
{
    const int64_t D = p->s.D;
    const size_t oes = sp_esize(out->dtype);
    char *dst = (char *)out->data +
                (b * out->stride[0] + i * out->stride[1] + H * out->stride[2]) * (int64_t)oes;
    if (out->stride[3] == 1) {
        sdpa_convert(src, SDPA_F32, dst, out->dtype, (size_t)D);
    } else {
        sdpa_convert(src, SDPA_F32, tmp, out->dtype, (size_t)D);
        for (int64_t e = 0; e < D; e++)
            memcpy(dst + e * out->stride[3] * (int64_t)oes, (char *)tmp + e * (int64_t)oes, oes);
    }
    if (lse)
        lse[(b * p->s.Hq + H) * mine + i] = l;
}

/*
 * This rank's rows of the result, from the group's accumulators (acc:
 * range-major [B, n_r, hq, D] blocks, lacc [B, hq, n_r]): every member's
 * rows of this member's heads go to it in one all-to-all (U > 1) as rows
 * of D + 1 floats (O, then the LSE), and are cast once into out.
 */
sdpa_status sp_scatter_result(sdpa_mpi_plan *p, const gathered *q, const float *acc,
                              const float *lacc, int64_t hq, sdpa_tensor *out, float *lse)
{
    const sdpa_mpi_shape *s = &p->s;
    const int base = p->r * p->U;
    const int64_t mine = sp_local_rows(p, p->rank, 0), D = s->D;
    const size_t prow = sizeof(float) * (size_t)(D + 1);
    int64_t *sc = alloc_counts(p), *rc = sc ? sc + p->U : NULL;
    float *sendbuf = sdpa__malloc(prow * (size_t)(s->B * (q->n ? q->n : 1) * hq));
    float *recvbuf = p->U > 1 ? sdpa__malloc(prow * (size_t)(s->B * (mine ? mine : 1) * s->Hq)) : NULL;
    float *tmp = sdpa__malloc(sizeof(float) * (size_t)D);
    sdpa_status st = sc && sendbuf && tmp && (recvbuf || p->U == 1)
                         ? SDPA_OK
                         : sp_fail(SDPA_OUT_OF_MEMORY, "sdpa_mpi_forward: no memory for the result");
    for (int u = 0; st == SDPA_OK && u < p->U; u++)
        sc[u] = s->B * sp_local_rows(p, base + u, 0) * hq, rc[u] = s->B * mine * hq;
    if (st == SDPA_OK)
        st = prepare_counts(p, sc);
    /* every rank, or none, goes on to the all-to-all and writes its
     * output: a failure leaves every rank's output as it was */
    if ((st = sp_agree(p->comm, st, p->rank)) != SDPA_OK) {
        free(sc), free(sendbuf), free(recvbuf), free(tmp);
        return st;
    }
    /* for member u, range by range: its rows of this member's heads */
    float *o = sendbuf;
    int64_t at[2] = {0, 0}, off[2] = {0, q->seg[0].n};
    for (int u = 0; u < p->U; u++) {
        for (int r = 0; r < q->nseg; r++) {
            const int64_t n = p->q_count[2 * (base + u) + r], nr = q->seg[r].n;
            const float *ar = acc + off[r] * s->B * hq * D, *lr = lacc + off[r] * s->B * hq;
            for (int64_t b = 0; b < s->B; b++)
                for (int64_t i = 0; i < n; i++)
                    for (int64_t h = 0; h < hq; h++, o += D + 1) {
                        memcpy(o, ar + ((b * nr + at[r] + i) * hq + h) * D, sizeof(float) * (size_t)D);
                        o[D] = lr[(b * hq + h) * nr + at[r] + i];
                    }
            at[r] += n;
        }
    }
    if (p->U > 1) {
        st = alltoall(p, sendbuf, sc, recvbuf, prow);
        p->stats.bytes_sent += (int64_t)prow * s->B * (q->n - mine) * hq;
        p->stats.bytes_received += (int64_t)prow * s->B * mine * hq * (p->U - 1);
    }
    /* from member u, range by range: my rows of its heads */
    const float *src = p->U > 1 ? recvbuf : sendbuf;
    const int64_t mine0 = p->q_count[2 * p->rank];
    for (int u = 0; st == SDPA_OK && u < p->U; u++)
        for (int r = 0; r < q->nseg; r++) {
            const int64_t n = p->q_count[2 * p->rank + r];
            for (int64_t b = 0; b < s->B; b++)
                for (int64_t i = 0; i < n; i++)
                    for (int64_t h = 0; h < hq; h++, src += D + 1)
                        emit(p, b, (r ? mine0 : 0) + i, u * hq + h, src, src[D], out, lse, mine,
                             tmp);
        }
    free(sc), free(sendbuf), free(recvbuf), free(tmp);
    return st;
}
