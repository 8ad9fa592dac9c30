/*
 * sequence_parallel.c - libsdpa_mpi (include/sdpa_mpi.h): Ulysses, ring
 * and USP attention on the caller's communicator. Only libsdpa's public
 * API is used (sdpa_forward with the LSE, sdpa_merge), so any LSE-capable
 * backend does the local work and the core stays free of MPI.
 *
 * One forward, on the rank (u, r) of a ulysses x ring grid:
 *   1. Ulysses (ulysses > 1): an all-to-all in the group of r turns the
 *      group's sequence shards into all its rows for Hq/ulysses heads (and
 *      the KV heads that serve them), packed contiguous.
 *   2. Ring (ring > 1): the group's K/V blocks travel around the ring of
 *      the ranks with the same u; each step posts the next block's receive
 *      and send, computes the visiting block, merges it into a float32
 *      accumulator, then waits. Causal is decided per block from global
 *      positions: a block entirely visible runs unmasked, one entirely
 *      hidden is skipped, the diagonal runs causal (top-left, bottom-right
 *      or, for any other offset, a boolean mask of that block).
 *   3. Ulysses back: the all-to-all in reverse, then one cast to out.
 * Volume per rank: Ulysses about 4 S H D / P elements, ring 2 S/R
 * Hkv/U D; see shared/notes/sequence-parallel.md.
 */
#include "sdpa_mpi.h"
#include "device_staging.h"
#include "../core/causal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct sdpa_mpi_plan {
    MPI_Comm comm, group, ring; /* duplicate of the caller's; its two splits */
    int size, rank, U, R, u, r;
    sdpa_mpi_shape s;
    int kv_replicated;          /* ulysses % Hkv == 0: each member gets one KV head */
    int nseg;                   /* row ranges per rank: 1, or 2 under the zigzag split */
    int64_t *q_first, *q_count, *kv_first, *kv_count; /* [rank * 2 + range] */
    sdpa_mpi_stats stats;
};

static _Thread_local char last_error[512];

const char *sdpa_mpi_last_error(void) { return last_error; }

int sdpa_mpi_cuda_aware(void) { return sp_mpi_cuda_aware(); }

static sdpa_status fail(sdpa_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return st;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* Every rank's local verdict (its message kept) made one: status of the
 * worst rank; the ranks that were fine say which rank failed. */
static sdpa_status agree(MPI_Comm comm, sdpa_status local, int rank)
{
    int mine[2] = {local != SDPA_OK ? (int)local : 0, local != SDPA_OK ? rank : -1}, all[2];
    if (MPI_Allreduce(mine, all, 2, MPI_INT, MPI_MAX, comm) != MPI_SUCCESS)
        return fail(SDPA_DEVICE_ERROR, "sdpa_mpi: MPI_Allreduce failed");
    if (all[0] == 0)
        return SDPA_OK;
    if (local == SDPA_OK)
        fail((sdpa_status)all[0], "sdpa_mpi: rank %d refused the call (its message says why)",
             all[1]);
    return (sdpa_status)all[0];
}

/* ceil blocks: n rows from a cut into P parts [a + p c, ...), c = ceil(n / P),
 * written to first[p * step], count[p * step]. */
static void ceil_split(int64_t a, int64_t n, int P, int step, int64_t *first, int64_t *count)
{
    const int64_t c = (n + P - 1) / P;
    for (int p = 0; p < P; p++) {
        const int64_t lo = p * c < n ? p * c : n, hi = (p + 1) * c < n ? (p + 1) * c : n;
        first[p * step] = a + lo, count[p * step] = hi - lo;
    }
}

/* One range per rank (ceil blocks or explicit counts); the second range of
 * every rank is empty. */
static sdpa_status split(int64_t S, int P, const int64_t *counts, const char *name,
                         int64_t *first, int64_t *count)
{
    for (int p = 0; p < P; p++)
        first[2 * p + 1] = S, count[2 * p + 1] = 0;
    if (!counts) {
        ceil_split(0, S, P, 2, first, count);
        return SDPA_OK;
    }
    int64_t at = 0;
    for (int p = 0; p < P; p++) {
        if (counts[p] < 0)
            return fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_plan_create: %s[%d] is %lld, expected >= 0",
                        name, p, (long long)counts[p]);
        first[2 * p] = at, count[2 * p] = counts[p], at += counts[p];
    }
    if (at != S)
        return fail(SDPA_INVALID_ARGUMENT,
                    "sdpa_mpi_plan_create: %s sum to %lld, expected %lld (the sequence)", name,
                    (long long)at, (long long)S);
    return SDPA_OK;
}

/*
 * The zigzag split that balances causal work over the ring: S is cut into
 * 2R chunks (ceil), ring group r holds chunks r and 2R - 1 - r, an early
 * one (little to see) and a late one (much), and its U members split each
 * chunk in ceil blocks. Rank (u, r)'s local rows are its part of the first
 * chunk, then its part of the second.
 */
static void zigzag_split(int64_t S, int U, int R, int64_t *first, int64_t *count)
{
    const int64_t cs = (S + 2 * R - 1) / (2 * R);
    for (int r = 0; r < R; r++)
        for (int half = 0; half < 2; half++) {
            const int64_t c = half ? 2 * R - 1 - r : r;
            const int64_t a = c * cs < S ? c * cs : S, b = (c + 1) * cs < S ? (c + 1) * cs : S;
            ceil_split(a, b - a, U, 2, first + 2 * r * U + half, count + 2 * r * U + half);
        }
}

static sdpa_status check_shape(const sdpa_mpi_shape *s, int U, int R, int size)
{
    if (U < 1 || R < 1 || (int64_t)U * R != size)
        return fail(SDPA_INVALID_ARGUMENT,
                    "sdpa_mpi_plan_create: ulysses %d x ring %d is %lld, expected the "
                    "communicator's size %d",
                    U, R, (long long)U * R, size);
    const int64_t sz[6] = {s->B, s->Sq, s->Skv, s->Hq, s->Hkv, s->D};
    static const char *nm[6] = {"B", "Sq", "Skv", "Hq", "Hkv", "D"};
    for (int i = 0; i < 6; i++)
        if (sz[i] < 1)
            return fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_plan_create: shape->%s is %lld, "
                        "expected >= 1", nm[i], (long long)sz[i]);
    if (s->Hq % s->Hkv)
        return fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_plan_create: Hq %lld is not a multiple of "
                    "Hkv %lld", (long long)s->Hq, (long long)s->Hkv);
    if ((unsigned)s->dtype > SDPA_BF16 || (unsigned)s->causal > SDPA_CAUSAL_BOTTOM_RIGHT)
        return fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_plan_create: shape->dtype %d or ->causal %d "
                    "unknown", (int)s->dtype, (int)s->causal);
    if (s->Hq % U || (s->Hkv % U && U % s->Hkv)) {
        char ok[200] = "";
        size_t len = 0;
        for (int d = 1; d <= size && len < sizeof ok - 16; d++)
            if (size % d == 0 && s->Hq % d == 0 && (s->Hkv % d == 0 || d % s->Hkv == 0))
                len += (size_t)snprintf(ok + len, sizeof ok - len, "%s%d", len ? ", " : "", d);
        return fail(SDPA_INVALID_ARGUMENT,
                    "sdpa_mpi_plan_create: ulysses degree %d must divide Hq %lld and either "
                    "divide Hkv %lld or be a multiple of it; degrees that work with %d ranks: %s",
                    U, (long long)s->Hq, (long long)s->Hkv, size, ok);
    }
    return SDPA_OK;
}

sdpa_status sdpa_mpi_plan_create(MPI_Comm comm, int ulysses, int ring,
                                 const sdpa_mpi_shape *shape, const int64_t *q_counts,
                                 const int64_t *kv_counts, sdpa_mpi_plan **out)
{
    last_error[0] = '\0';
    if (!out)
        return fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_plan_create: out is NULL");
    *out = NULL;
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized)
        return fail(SDPA_NOT_AVAILABLE, "sdpa_mpi_plan_create: MPI is %s; the caller "
                    "initialises MPI (libsdpa_mpi never calls MPI_Init)",
                    inited ? "finalized" : "not initialised");
    int size, rank, provided;
    if (comm == MPI_COMM_NULL || MPI_Comm_size(comm, &size) != MPI_SUCCESS ||
        MPI_Comm_rank(comm, &rank) != MPI_SUCCESS)
        return fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_plan_create: comm is not a valid "
                    "communicator");
    MPI_Query_thread(&provided); /* only the calling thread communicates: any level will do */
    (void)provided;
    sdpa_mpi_plan *p = calloc(1, sizeof *p);
    int64_t *arrays = p ? malloc(sizeof(int64_t) * 8 * (size_t)size) : NULL;
    sdpa_status st = p && arrays ? SDPA_OK
                                 : fail(SDPA_OUT_OF_MEMORY, "sdpa_mpi_plan_create: no memory");
    if (st == SDPA_OK && !shape)
        st = fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_plan_create: shape is NULL");
    if (st == SDPA_OK)
        st = check_shape(shape, ulysses, ring, size);
    if (st == SDPA_OK && shape->zigzag && (q_counts || kv_counts))
        st = fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_plan_create: shape->zigzag and explicit "
                  "counts exclude each other (zigzag makes its own split)");
    if (st == SDPA_OK) {
        p->q_first = arrays, p->q_count = arrays + 2 * size;
        p->kv_first = arrays + 4 * size, p->kv_count = arrays + 6 * size;
        if (shape->zigzag) {
            zigzag_split(shape->Sq, ulysses, ring, p->q_first, p->q_count);
            zigzag_split(shape->Skv, ulysses, ring, p->kv_first, p->kv_count);
        } else {
            st = split(shape->Sq, size, q_counts, "q_counts", p->q_first, p->q_count);
            if (st == SDPA_OK)
                st = split(shape->Skv, size, kv_counts, "kv_counts", p->kv_first, p->kv_count);
        }
    }
    /* The same plan on every rank: compare what each was given (max of x
     * and of -x is the range), or every rank fails with the difference. */
    enum { ND = 12 };
    int64_t desc[ND] = {0};
    if (st == SDPA_OK) {
        const int64_t d0[ND] = {ulysses, ring, shape->B, shape->Sq, shape->Skv, shape->Hq,
                                shape->Hkv, shape->D, shape->dtype, shape->causal,
                                shape->zigzag != 0, 0};
        memcpy(desc, d0, sizeof desc);
        uint64_t h = 14695981039346656037u; /* the splits, hashed (FNV-1a, unsigned) */
        for (int i = 0; i < 2 * size; i++)
            h = (h ^ (uint64_t)p->q_count[i]) * 1099511628211u,
            h = (h ^ (uint64_t)p->kv_count[i]) * 1099511628211u;
        desc[ND - 1] = (int64_t)(h >> 2); /* non-negative: -x below cannot overflow */
    }
    int64_t mine[2 * ND + 1], all[2 * ND + 1];
    mine[0] = st != SDPA_OK;
    for (int i = 0; i < ND; i++)
        mine[1 + i] = desc[i], mine[1 + ND + i] = -desc[i];
    if (MPI_Allreduce(mine, all, 2 * ND + 1, MPI_INT64_T, MPI_MAX, comm) != MPI_SUCCESS)
        st = fail(SDPA_DEVICE_ERROR, "sdpa_mpi_plan_create: MPI_Allreduce failed");
    else if (all[0] && st == SDPA_OK)
        st = fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_plan_create: another rank refused the plan "
                  "(its message says why)");
    else if (st == SDPA_OK) {
        static const char *names[ND] = {"ulysses", "ring", "B",     "Sq",     "Skv",
                                        "Hq",      "Hkv",  "D",     "dtype",  "causal",
                                        "zigzag",  "the row splits"};
        for (int i = 0; i < ND && st == SDPA_OK; i++)
            if (all[1 + i] != -all[1 + ND + i])
                st = fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_plan_create: ranks disagree on %s "
                          "(values %lld to %lld); every rank must pass the same plan",
                          names[i], (long long)-all[1 + ND + i], (long long)all[1 + i]);
    }
    if (st == SDPA_OK) {
        p->s = *shape, p->size = size, p->rank = rank, p->U = ulysses, p->R = ring;
        p->u = rank % ulysses, p->r = rank / ulysses;
        p->kv_replicated = shape->Hkv % ulysses != 0;
        p->nseg = shape->zigzag ? 2 : 1;
        if (MPI_Comm_dup(comm, &p->comm) != MPI_SUCCESS ||
            MPI_Comm_split(p->comm, p->r, p->u, &p->group) != MPI_SUCCESS ||
            MPI_Comm_split(p->comm, p->u, p->r, &p->ring) != MPI_SUCCESS)
            st = fail(SDPA_DEVICE_ERROR, "sdpa_mpi_plan_create: MPI_Comm_dup/split failed");
    }
    if (st != SDPA_OK) {
        free(arrays), free(p);
        return st;
    }
    *out = p;
    return SDPA_OK;
}

void sdpa_mpi_plan_destroy(sdpa_mpi_plan *p)
{
    if (!p)
        return;
    MPI_Comm_free(&p->ring);
    MPI_Comm_free(&p->group);
    MPI_Comm_free(&p->comm);
    free(p->q_first);
    free(p);
}

int sdpa_mpi_ranges(const sdpa_mpi_plan *p, int rank, int kv, int64_t first[2], int64_t count[2])
{
    const int i = rank < 0 ? p->rank : rank;
    for (int g = 0; g < 2; g++) {
        first[g] = kv ? p->kv_first[2 * i + g] : p->q_first[2 * i + g];
        count[g] = g < p->nseg ? (kv ? p->kv_count[2 * i + g] : p->q_count[2 * i + g]) : 0;
    }
    return p->nseg;
}

void sdpa_mpi_rows(const sdpa_mpi_plan *p, int rank, int kv, int64_t *first, int64_t *count)
{
    int64_t f[2], n[2];
    sdpa_mpi_ranges(p, rank, kv, f, n);
    *first = f[0], *count = n[0] + n[1];
}

/* Rows rank i holds of q (kv = 0) or k/v, all its ranges. */
static int64_t local_rows(const sdpa_mpi_plan *p, int i, int kv)
{
    const int64_t *c = kv ? p->kv_count : p->q_count;
    return c[2 * i] + c[2 * i + 1];
}

void sdpa_mpi_last_stats(const sdpa_mpi_plan *p, sdpa_mpi_stats *out) { *out = p->stats; }

/* ---- packing: [B, rows, heads, D] blocks, contiguous, in the input dtype */

static size_t esize(sdpa_dtype t) { return t == SDPA_F32 ? 4 : 2; }

/* dst[b][i][h][d] = t(b, i0 + i, h0 + h, d), for i < n, h < nh. */
static void pack(const sdpa_tensor *t, int64_t i0, int64_t n, int64_t h0, int64_t nh, char *dst)
{
    const size_t es = esize(t->dtype);
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
static sdpa_tensor block(void *p, sdpa_dtype dtype, int64_t B, int64_t n, int64_t h, int64_t D)
{
    return sdpa_tensor_bshd(p, dtype, B, n, h, D);
}

/* One all-to-all of [B, rows, heads, D] pieces within the Ulysses group,
 * in units of one D-row: counts[u] rows-of-D to/from member u. */
static sdpa_status alltoall(sdpa_mpi_plan *p, const void *send, const int64_t *sc,
                            void *recv, const int64_t *rc, size_t row_bytes)
{
    const double t0 = now_ms(); /* Ulysses' exchanges hide behind nothing: all of it is waiting */
    int *c = malloc(sizeof(int) * 4 * (size_t)p->U);
    if (!c)
        return fail(SDPA_OUT_OF_MEMORY, "sdpa_mpi_forward: no memory");
    int64_t so = 0, ro = 0;
    for (int u = 0; u < p->U; u++) {
        if (sc[u] > 0x7fffffff || rc[u] > 0x7fffffff || so > 0x7fffffff || ro > 0x7fffffff) {
            free(c);
            return fail(SDPA_UNSUPPORTED, "sdpa_mpi_forward: an all-to-all piece exceeds 2^31 "
                        "rows of D (MPI counts are int)");
        }
        c[u] = (int)sc[u], c[p->U + u] = (int)so, c[2 * p->U + u] = (int)rc[u];
        c[3 * p->U + u] = (int)ro;
        so += sc[u], ro += rc[u];
    }
    MPI_Datatype row;
    MPI_Type_contiguous((int)row_bytes, MPI_BYTE, &row);
    MPI_Type_commit(&row);
    const int e = MPI_Alltoallv(send, c, c + p->U, row, recv, c + 2 * p->U, c + 3 * p->U, row,
                                p->group);
    MPI_Type_free(&row);
    free(c);
    p->stats.wait_ms += now_ms() - t0;
    return e == MPI_SUCCESS ? SDPA_OK : fail(SDPA_DEVICE_ERROR, "sdpa_mpi_forward: "
                                             "MPI_Alltoallv failed");
}

/* ---- the forward */

/* A group's rows of one range (one chunk under zigzag): global rows
 * [first, first + n), data a contiguous [B, n, heads, D] block. */
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

/* Range g of ring group r: its members' parts, in member order. */
static void group_range(const sdpa_mpi_plan *p, int r, int kv, int g, int64_t *first, int64_t *n)
{
    const int64_t *f = kv ? p->kv_first : p->q_first, *c = kv ? p->kv_count : p->q_count;
    *first = f[2 * r * p->U + g], *n = 0;
    for (int u = 0; u < p->U; u++)
        *n += c[2 * (r * p->U + u) + g];
}

/* The group's rows of x (q: kv = 0, or k/v) for this member's heads. */
static sdpa_status gather_group(sdpa_mpi_plan *p, const sdpa_tensor *x, int kv, int64_t heads,
                                gathered *g)
{
    const sdpa_mpi_shape *s = &p->s;
    const int64_t *count = kv ? p->kv_count : p->q_count;
    const int base = p->r * p->U;
    const size_t row = esize(s->dtype) * (size_t)s->D;
    const size_t rows_b = row * (size_t)heads; /* one row of all heads, one batch entry */
    g->nseg = p->nseg, g->n = 0;
    for (int r = 0; r < 2; r++) {
        group_range(p, p->r, kv, r, &g->seg[r].first, &g->seg[r].n);
        if (r >= p->nseg)
            g->seg[r].n = 0;
        g->n += g->seg[r].n;
    }
    g->data = malloc(rows_b * (size_t)(s->B * (g->n ? g->n : 1)));
    for (int r = 0, at = 0; r < 2; at += (int)g->seg[r].n, r++)
        g->seg[r].data = g->data ? g->data + rows_b * (size_t)(s->B * at) : NULL;
    const int64_t mine = local_rows(p, p->rank, kv), mine0 = count[2 * p->rank];
    if (p->U == 1) { /* no message: a local failure is agreed on before the ring */
        if (!g->data)
            return fail(SDPA_OUT_OF_MEMORY, "sdpa_mpi_forward: no memory for the gathered rows");
        for (int r = 0; r < g->nseg; r++) /* my ranges are the group's */
            if (g->seg[r].n)
                pack(x, r ? mine0 : 0, g->seg[r].n, 0, heads, g->seg[r].data);
        return SDPA_OK;
    }
    /* send to member u: my rows of u's heads, range by range; receive from
     * u: u's rows of mine, range by range */
    const int64_t H = kv ? s->Hkv : s->Hq;
    int64_t *sc = malloc(sizeof(int64_t) * 2 * (size_t)p->U), *rc = sc ? sc + p->U : NULL;
    char *sendbuf = malloc(rows_b * (size_t)(s->B * (mine ? mine : 1) * p->U));
    char *recvbuf = malloc(rows_b * (size_t)(s->B * (g->n ? g->n : 1)));
    sdpa_status st = g->data && sc && sendbuf && recvbuf
                         ? SDPA_OK
                         : fail(SDPA_OUT_OF_MEMORY, "sdpa_mpi_forward: no memory for the "
                                "all-to-all");
    /* every rank, or none, goes on to the all-to-all */
    if ((st = agree(p->comm, st, p->rank)) != SDPA_OK) {
        free(sc), free(sendbuf), free(recvbuf);
        return st;
    }
    for (int u = 0; u < p->U; u++) {
        const int64_t h0 = kv && p->kv_replicated ? u * H / p->U : u * heads;
        char *dst = sendbuf + rows_b * (size_t)(s->B * mine * u);
        for (int r = 0; r < p->nseg; r++) {
            const int64_t n = count[2 * p->rank + r];
            if (n)
                pack(x, r ? mine0 : 0, n, h0, heads, dst);
            dst += rows_b * (size_t)(s->B * n);
        }
        sc[u] = s->B * mine * heads, rc[u] = s->B * local_rows(p, base + u, kv) * heads;
    }
    st = alltoall(p, sendbuf, sc, recvbuf, rc, row);
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

/* Rows [0, n) of batch entry b, heads [h0, h0 + nh) of a contiguous
 * [B, n, heads, D] block: a strided view. */
static sdpa_tensor view(void *p, sdpa_dtype dtype, int64_t n, int64_t heads, int64_t D, int64_t b,
                        int64_t h0, int64_t nh)
{
    sdpa_tensor t = sdpa_tensor_bshd(p, dtype, 1, n, heads, D);
    t.data = (char *)p + (b * n * heads + h0) * D * (int64_t)esize(dtype);
    t.size[2] = nh;
    return t;
}

/* Pieces a visiting block's attention is cut into while ring messages are
 * in flight, so that MPI_Testall runs between them: an MPI without an
 * asynchronous progress thread (TCP, most shared-memory transports for
 * large messages) moves rendezvous data only inside MPI calls. */
enum { PIECES = 4 };

/*
 * The attention of the group's queries with one visiting K/V block, merged
 * into (acc, lacc). d: key j of the block is visible to query i when
 * j <= i + d (causal only). With ring requests pending (nreq > 0) the work
 * runs per batch entry and group of heads, testing them in between.
 */
/* Device buffers of a forward on CUDA tensors (device_staging.h): a
 * block's q, k and v go in, its output and LSE come out. */
typedef struct device_bufs {
    void *q, *k, *v, *o;
    float *lse;
    int ordinal;
} device_bufs;

/* The block's attention on the device: inputs copied in, sdpa_forward on
 * device tensors (the context's CUDA backends), output and LSE copied to
 * tmp and ltmp on the host. */
static sdpa_status device_block(sdpa_context *ctx, const sdpa_mpi_plan *p, const device_bufs *db,
                                const segment *q, const void *k, const void *v, int64_t nk,
                                int64_t hq, int64_t hk, float *tmp, float *ltmp,
                                const sdpa_params *prm)
{
    const sdpa_mpi_shape *s = &p->s;
    const size_t es = esize(s->dtype), nqb = es * (size_t)(s->B * q->n * hq * s->D),
                 nkb = es * (size_t)(s->B * nk * hk * s->D);
    char why[300];
    sdpa_status st = sp_cuda_copy(db->q, nqb, q->data, nqb, nqb, 1, 1, why, sizeof why);
    if (st == SDPA_OK)
        st = sp_cuda_copy(db->k, nkb, k, nkb, nkb, 1, 1, why, sizeof why);
    if (st == SDPA_OK)
        st = sp_cuda_copy(db->v, nkb, v, nkb, nkb, 1, 1, why, sizeof why);
    if (st != SDPA_OK)
        return fail(st, "sdpa_mpi_forward: %s", why);
    const sdpa_device dev = {SDPA_DEVICE_CUDA, db->ordinal};
    sdpa_tensor tq = block(db->q, s->dtype, s->B, q->n, hq, s->D);
    sdpa_tensor tk = block(db->k, s->dtype, s->B, nk, hk, s->D);
    sdpa_tensor tv = block(db->v, s->dtype, s->B, nk, hk, s->D);
    sdpa_tensor to = block(db->o, SDPA_F32, s->B, q->n, hq, s->D);
    tq.device = tk.device = tv.device = to.device = dev;
    st = sdpa_forward(ctx, &tq, &tk, &tv, &to, db->lse, prm);
    if (st != SDPA_OK)
        return fail(st, "sdpa_mpi_forward: local attention on the device: %s", sdpa_last_error());
    const size_t nob = 4 * (size_t)(s->B * q->n * hq * s->D), nlb = 4 * (size_t)(s->B * hq * q->n);
    st = sp_cuda_copy(tmp, nob, db->o, nob, nob, 1, 0, why, sizeof why);
    if (st == SDPA_OK)
        st = sp_cuda_copy(ltmp, nlb, db->lse, nlb, nlb, 1, 0, why, sizeof why);
    return st == SDPA_OK ? SDPA_OK : fail(st, "sdpa_mpi_forward: %s", why);
}

static sdpa_status one_block(sdpa_context *ctx, const sdpa_mpi_plan *p, const segment *q,
                             void *k, void *v, int64_t nk, int64_t d, int64_t hq, int64_t hk,
                             sdpa_tensor *acc, float *lacc, float *tmp, float *ltmp,
                             const sdpa_params *user, MPI_Request *req, int nreq,
                             const device_bufs *db)
{
    const sdpa_mpi_shape *s = &p->s;
    const int64_t nq = q->n;
    sdpa_params prm = *user;
    sdpa_mask m = SDPA_MASK_DEFAULT;
    uint8_t *vis = NULL;
    prm.causal = SDPA_CAUSAL_NONE, prm.mask = NULL;
    if (s->causal != SDPA_CAUSAL_NONE) {
        if (nq - 1 + d < 0)
            return SDPA_OK;                     /* no query sees any of these keys */
        if (d < nk - 1) {                       /* else every query sees all of them */
            if (d == 0)
                prm.causal = SDPA_CAUSAL_TOP_LEFT;
            else if (d == nk - nq)
                prm.causal = SDPA_CAUSAL_BOTTOM_RIGHT;
            else { /* another offset: this block's own mask */
                if (db) /* the CUDA backends take no general mask */
                    return fail(SDPA_UNSUPPORTED, "sdpa_mpi_forward: causal on device tensors "
                                "needs shard boundaries on the diagonal (equal splits, no "
                                "zigzag); a block has offset %lld", (long long)d);
                if (!(vis = malloc((size_t)(nq * nk))))
                    return fail(SDPA_OUT_OF_MEMORY, "sdpa_mpi_forward: no memory for a mask");
                for (int64_t i = 0; i < nq; i++)
                    for (int64_t j = 0; j < nk; j++)
                        vis[i * nk + j] = j <= i + d;
                m.general = vis, m.general_type = SDPA_MASK_BOOL;
                m.general_stride[2] = nk, m.general_stride[3] = 1;
                prm.mask = &m;
            }
        }
    }
    if (db) {
        sdpa_status st = device_block(ctx, p, db, q, k, v, nk, hq, hk, tmp, ltmp, &prm);
        if (st == SDPA_OK) {
            sdpa_tensor to = block(tmp, SDPA_F32, s->B, nq, hq, s->D);
            st = sdpa_merge(acc, lacc, &to, ltmp, acc, lacc);
        }
        return st == SDPA_OK ? SDPA_OK : (last_error[0] ? st : fail(st, "sdpa_mpi_forward: "
                                                                   "merge: %s", sdpa_last_error()));
    }
    /* whole block at once, or per (batch entry, group of query heads that
     * share KV heads) */
    const int64_t g = hq / hk, per = nreq ? g * ((hq / g + PIECES - 1) / PIECES) : hq;
    const int64_t nb = nreq ? s->B : 1;
    sdpa_status st = SDPA_OK;
    for (int64_t b = 0; b < nb && st == SDPA_OK; b++)
        for (int64_t h0 = 0; h0 < hq && st == SDPA_OK; h0 += per) {
            const int64_t nh = hq - h0 < per ? hq - h0 : per;
            sdpa_tensor tq, tk, tv, to, ta;
            float *la;
            if (!nreq) {
                tq = block(q->data, s->dtype, s->B, nq, hq, s->D);
                tk = block(k, s->dtype, s->B, nk, hk, s->D);
                tv = block(v, s->dtype, s->B, nk, hk, s->D);
                to = block(tmp, SDPA_F32, s->B, nq, hq, s->D);
                ta = *acc, la = lacc;
            } else {
                tq = view(q->data, s->dtype, nq, hq, s->D, b, h0, nh);
                tk = view(k, s->dtype, nk, hk, s->D, b, h0 / g, nh / g);
                tv = view(v, s->dtype, nk, hk, s->D, b, h0 / g, nh / g);
                to = block(tmp, SDPA_F32, 1, nq, nh, s->D);
                ta = view(acc->data, SDPA_F32, nq, hq, s->D, b, h0, nh);
                la = lacc + (b * hq + h0) * nq; /* [B, hq, nq]: this piece is contiguous */
            }
            st = sdpa_forward(ctx, &tq, &tk, &tv, &to, ltmp, &prm);
            if (st == SDPA_OK)
                st = sdpa_merge(&ta, la, &to, ltmp, &ta, la);
            if (nreq) {
                int done;
                MPI_Testall(nreq, req, &done, MPI_STATUSES_IGNORE);
            }
        }
    free(vis);
    return st == SDPA_OK ? SDPA_OK : fail(st, "sdpa_mpi_forward: local attention: %s",
                                          sdpa_last_error());
}

static sdpa_status check_local(const sdpa_mpi_plan *p, const sdpa_tensor *t, const char *name,
                               int64_t rows, int64_t heads, int is_out)
{
    const sdpa_mpi_shape *s = &p->s;
    if (rows == 0)
        return SDPA_OK; /* an empty shard: the tensor is not read */
    if (!t || !t->data)
        return fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_forward: %s is NULL on rank %d, expected "
                    "its %lld rows", name, p->rank, (long long)rows);
    const int64_t want[4] = {s->B, rows, heads, s->D};
    for (int i = 0; i < 4; i++)
        if (t->size[i] != want[i])
            return fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_forward: %s->size[%d] is %lld on rank "
                        "%d, expected %lld", name, i, (long long)t->size[i], p->rank,
                        (long long)want[i]);
    if (t->device.kind != SDPA_DEVICE_CPU &&
        (t->device.kind != SDPA_DEVICE_CUDA || t->stride[3] != 1 || t->stride[2] != s->D))
        return fail(SDPA_UNSUPPORTED, "sdpa_mpi_forward: %s is device memory with strides "
                    "S=%lld H=%lld D=%lld; device tensors are staged by rows, which needs "
                    "contiguous heads (H stride D, D stride 1)", name, (long long)t->stride[1],
                    (long long)t->stride[2], (long long)t->stride[3]);
    if (!is_out && t->dtype != s->dtype)
        return fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_forward: %s is %s, expected the plan's %s",
                    name, sdpa_dtype_name(t->dtype), sdpa_dtype_name(s->dtype));
    if (is_out && (unsigned)t->dtype > SDPA_BF16)
        return fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_forward: out->dtype %d unknown",
                    (int)t->dtype);
    return SDPA_OK;
}

/* Row i (local numbering), head H of out and lse from one float32 row. */
static void emit(const sdpa_mpi_plan *p, int64_t b, int64_t i, int64_t H, const float *src,
                 float l, sdpa_tensor *out, float *lse, int64_t mine, float *tmp)
{
    const int64_t D = p->s.D;
    const size_t oes = esize(out->dtype);
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
static sdpa_status scatter_result(sdpa_mpi_plan *p, const gathered *q, const float *acc,
                                  const float *lacc, int64_t hq, sdpa_tensor *out, float *lse)
{
    const sdpa_mpi_shape *s = &p->s;
    const int base = p->r * p->U;
    const int64_t mine = local_rows(p, p->rank, 0), D = s->D;
    const size_t prow = sizeof(float) * (size_t)(D + 1);
    int64_t *sc = malloc(sizeof(int64_t) * 2 * (size_t)p->U), *rc = sc ? sc + p->U : NULL;
    float *sendbuf = malloc(prow * (size_t)(s->B * (q->n ? q->n : 1) * hq));
    float *recvbuf = p->U > 1 ? malloc(prow * (size_t)(s->B * (mine ? mine : 1) * s->Hq)) : NULL;
    float *tmp = malloc(sizeof(float) * (size_t)D);
    sdpa_status st = sc && sendbuf && tmp && (recvbuf || p->U == 1)
                         ? SDPA_OK
                         : fail(SDPA_OUT_OF_MEMORY, "sdpa_mpi_forward: no memory for the result");
    if (p->U > 1) /* every rank, or none, goes on to the all-to-all */
        st = agree(p->comm, st, p->rank);
    if (st != SDPA_OK) {
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
        sc[u] = s->B * local_rows(p, base + u, 0) * hq, rc[u] = s->B * mine * hq;
    }
    if (p->U > 1) {
        st = alltoall(p, sendbuf, sc, recvbuf, rc, prow);
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

sdpa_status sdpa_mpi_forward(sdpa_mpi_plan *p, sdpa_context *ctx, const sdpa_tensor *q,
                             const sdpa_tensor *k, const sdpa_tensor *v, sdpa_tensor *out,
                             float *lse, const sdpa_params *params)
{
    return sdpa_mpi_forward_joint(p, ctx, q, k, v, NULL, NULL, out, lse, params);
}

/* The replicated joint keys' checks: [B, T, Hkv, D] in the plan's dtype,
 * both or neither. */
static sdpa_status check_joint(const sdpa_mpi_plan *p, const sdpa_tensor *kj,
                               const sdpa_tensor *vj)
{
    if (!kj && !vj)
        return SDPA_OK;
    if (!kj || !vj || !kj->data || !vj->data)
        return fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_forward_joint: k_joint and v_joint come "
                    "together (one is NULL)");
    const sdpa_tensor *t[2] = {kj, vj};
    static const char *names[2] = {"k_joint", "v_joint"};
    for (int i = 0; i < 2; i++) {
        const int64_t want[4] = {p->s.B, kj->size[1], p->s.Hkv, p->s.D};
        for (int d = 0; d < 4; d++)
            if (t[i]->size[d] != want[d] || want[1] < 1)
                return fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_forward_joint: %s->size[%d] is %lld, "
                            "expected %lld ([B, T >= 1, Hkv, D], T as in k_joint)", names[i], d,
                            (long long)t[i]->size[d], (long long)want[d]);
        if (t[i]->dtype != p->s.dtype || t[i]->device.kind != SDPA_DEVICE_CPU)
            return fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_forward_joint: %s must be CPU memory in "
                        "the plan's dtype %s (replicated text keys are not staged from a "
                        "device)", names[i], sdpa_dtype_name(p->s.dtype));
    }
    return SDPA_OK;
}

sdpa_status sdpa_mpi_forward_joint(sdpa_mpi_plan *p, sdpa_context *ctx, const sdpa_tensor *q,
                                   const sdpa_tensor *k, const sdpa_tensor *v,
                                   const sdpa_tensor *k_joint, const sdpa_tensor *v_joint,
                                   sdpa_tensor *out, float *lse, const sdpa_params *params)
{
    last_error[0] = '\0';
    if (!p)
        return fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_forward: plan is NULL");
    const double t_start = now_ms();
    memset(&p->stats, 0, sizeof p->stats);
    const sdpa_mpi_shape *s = &p->s;
    const sdpa_params defaults = SDPA_PARAMS_DEFAULT;
    const sdpa_params *prm = params ? params : &defaults;
    const int64_t nq = local_rows(p, p->rank, 0), nkv = local_rows(p, p->rank, 1);
    sdpa_status st = ctx ? SDPA_OK : fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_forward: ctx is NULL");
    if (st == SDPA_OK && prm->mask)
        st = fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_forward: params->mask is set; sequence "
                  "parallelism takes no masks yet (causal comes from the plan)");
    if (st == SDPA_OK)
        st = check_local(p, q, "q", nq, s->Hq, 0);
    if (st == SDPA_OK)
        st = check_local(p, k, "k", nkv, s->Hkv, 0);
    if (st == SDPA_OK)
        st = check_local(p, v, "v", nkv, s->Hkv, 0);
    if (st == SDPA_OK)
        st = check_local(p, out, "out", nq, s->Hq, 1);
    if (st == SDPA_OK)
        st = check_joint(p, k_joint, v_joint);
    if ((st = agree(p->comm, st, p->rank)) != SDPA_OK)
        return st; /* every rank returns here together: nothing has moved */

    /* Device tensors (device_staging.h): every rank's, or none; their rows
     * are copied to the host here and the result back at the end. */
    int mode[2] = {0, 0}, all[2] = {0, 0}, ordinal = 0; /* any device tensor, any host one */
    const sdpa_tensor *loc[4] = {nq ? q : NULL, nkv ? k : NULL, nkv ? v : NULL, nq ? out : NULL};
    for (int i = 0; i < 4; i++)
        if (loc[i]) {
            const int d = loc[i]->device.kind == SDPA_DEVICE_CUDA;
            mode[d ? 0 : 1] = 1;
            ordinal = d ? loc[i]->device.ordinal : ordinal;
        }
    MPI_Allreduce(mode, all, 2, MPI_INT, MPI_MAX, p->comm);
    if (all[0] && all[1])
        return fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_forward: the local tensors mix device and "
                    "host memory (on this rank or across ranks); one kind for all of them");
    const int on_device = all[0];
    char *staged = NULL; /* host copies: q, k, v, then the result and its LSE */
    sdpa_tensor hq_t, hk_t, hv_t, ho_t;
    sdpa_tensor *out_user = out;
    float *lse_user = lse;
    const size_t es = esize(s->dtype), oes = esize(out ? out->dtype : SDPA_F32);
    if (on_device) {
        char why[300];
        st = sp_cuda_load(why, sizeof why);
        const size_t bq = es * (size_t)(s->B * nq * s->Hq * s->D),
                     bk = es * (size_t)(s->B * nkv * s->Hkv * s->D),
                     bo = oes * (size_t)(s->B * nq * s->Hq * s->D),
                     bl = sizeof(float) * (size_t)(s->B * s->Hq * nq);
        if (st == SDPA_OK && !(staged = malloc(bq + 2 * bk + bo + bl + 64)))
            st = SDPA_OUT_OF_MEMORY, snprintf(why, sizeof why, "no host memory for staging");
        const sdpa_tensor *src[3] = {q, k, v};
        sdpa_tensor *dst[3] = {&hq_t, &hk_t, &hv_t};
        const int64_t rows[3] = {nq, nkv, nkv}, heads[3] = {s->Hq, s->Hkv, s->Hkv};
        char *at = staged;
        for (int i = 0; i < 3 && st == SDPA_OK; i++) {
            *dst[i] = block(at, s->dtype, s->B, rows[i] ? rows[i] : 1, heads[i], s->D);
            const size_t w = es * (size_t)(heads[i] * s->D);
            for (int64_t b = 0; b < s->B && rows[i] && st == SDPA_OK; b++)
                st = sp_cuda_copy(at + w * (size_t)(b * rows[i]), w,
                                  (const char *)src[i]->data + b * src[i]->stride[0] * (int64_t)es,
                                  es * (size_t)src[i]->stride[1], w, (size_t)rows[i], 0, why,
                                  sizeof why);
            at += es * (size_t)(s->B * rows[i] * heads[i] * s->D);
        }
        if (st == SDPA_OK) {
            ho_t = block(at, out ? out->dtype : SDPA_F32, s->B, nq ? nq : 1, s->Hq, s->D);
            q = &hq_t, k = &hk_t, v = &hv_t, out = &ho_t;
            lse = (float *)(at + bo);
        }
        if (st != SDPA_OK)
            fail(st, "sdpa_mpi_forward: staging device tensors: %s", why);
        if ((st = agree(p->comm, st, p->rank)) != SDPA_OK) {
            free(staged);
            return st;
        }
    }

    const int64_t hq = s->Hq / p->U, hk = p->kv_replicated ? 1 : s->Hkv / p->U;
    gathered gq = {0}, gk = {0}, gv = {0};
    /* a failure inside a gather with messages is agreed there (every rank
     * stops at the same one); without messages (ulysses 1), before the ring */
    st = gather_group(p, q, 0, hq, &gq);
    if (st == SDPA_OK || p->U == 1)
        st = st == SDPA_OK ? gather_group(p, k, 1, hk, &gk) : st;
    if (st == SDPA_OK || p->U == 1)
        st = st == SDPA_OK ? gather_group(p, v, 1, hk, &gv) : st;
    /* the ring: blocks of the R groups' K/V, each its ranges one after the other */
    const size_t row = esize(s->dtype) * (size_t)s->D;
    int64_t max_nk = 0;
    for (int j = 0; j < p->R; j++) {
        int64_t n = 0;
        for (int u = 0; u < p->U; u++)
            n += local_rows(p, j * p->U + u, 1);
        max_nk = n > max_nk ? n : max_nk;
    }
    const size_t kv_bytes = row * (size_t)(s->B * (max_nk ? max_nk : 1) * hk);
    char *cur = malloc(2 * kv_bytes), *next = malloc(2 * kv_bytes);
    const size_t acc_n = (size_t)(s->B * (gq.n ? gq.n : 1) * hq);
    float *acc = calloc(acc_n * (size_t)s->D, sizeof(float)), *tmp = malloc(acc_n * (size_t)s->D * 4);
    float *lacc = malloc(acc_n * sizeof(float)), *ltmp = malloc(acc_n * sizeof(float));
    if (st == SDPA_OK && (!cur || !next || !acc || !tmp || !lacc || !ltmp))
        st = fail(SDPA_OUT_OF_MEMORY, "sdpa_mpi_forward: no memory for the ring");
    /* on the device: buffers for one block's q, k, v, output and LSE */
    device_bufs db = {NULL, NULL, NULL, NULL, NULL, ordinal}, *dbp = on_device ? &db : NULL;
    if (on_device && st == SDPA_OK) {
        const int64_t T = k_joint ? k_joint->size[1] : 0, nseg_max =
            gq.seg[0].n > gq.seg[1].n ? gq.seg[0].n : gq.seg[1].n;
        const int64_t nkb = max_nk > T ? max_nk : T;
        char why[300];
        st = sp_cuda_alloc(&db.q, row * (size_t)(s->B * nseg_max * hq), why, sizeof why);
        if (st == SDPA_OK)
            st = sp_cuda_alloc(&db.k, row * (size_t)(s->B * nkb * hk), why, sizeof why);
        if (st == SDPA_OK)
            st = sp_cuda_alloc(&db.v, row * (size_t)(s->B * nkb * hk), why, sizeof why);
        if (st == SDPA_OK)
            st = sp_cuda_alloc(&db.o, 4 * (size_t)(s->B * nseg_max * hq * s->D), why, sizeof why);
        if (st == SDPA_OK)
            st = sp_cuda_alloc((void **)&db.lse, 4 * (size_t)(s->B * hq * nseg_max), why,
                               sizeof why);
        if (st != SDPA_OK)
            fail(st, "sdpa_mpi_forward: %s", why);
    }
    if ((st = agree(p->comm, st, p->rank)) != SDPA_OK)
        goto release; /* together, before any ring message */
    for (size_t i = 0; i < acc_n; i++)
        lacc[i] = -INFINITY; /* nothing seen yet */
    memcpy(cur, gk.data, row * (size_t)(s->B * gk.n * hk));
    memcpy(cur + kv_bytes, gv.data, row * (size_t)(s->B * gk.n * hk));
    /* an accumulator per range of the group's queries */
    sdpa_tensor tacc[2];
    float *lacc_r[2];
    for (int r = 0, at = 0; r < 2; at += (int)gq.seg[r].n, r++) {
        tacc[r] = block(acc + (size_t)(at * s->B * hq * s->D), SDPA_F32, s->B,
                        gq.seg[r].n ? gq.seg[r].n : 1, hq, s->D);
        lacc_r[r] = lacc + at * s->B * hq;
    }
    const int64_t off = sdpa_causal_offset(s->causal, s->Sq, s->Skv); /* global positions */
    const int prev = (p->r - 1 + p->R) % p->R, nxt = (p->r + 1) % p->R;
    /* A local failure inside the loop must not leave the others waiting
     * on this rank's messages: the ring keeps turning, and the failure is
     * agreed on after it. */
    for (int step = 0; step < p->R; step++) {
        const int j = (p->r - step + p->R) % p->R, jn = (j - 1 + p->R) % p->R;
        int64_t nk = 0, nk_next = 0;
        for (int u = 0; u < p->U; u++)
            nk += local_rows(p, j * p->U + u, 1), nk_next += local_rows(p, jn * p->U + u, 1);
        MPI_Request req[4];
        int nreq = 0;
        if (step < p->R - 1) {
            const int cn = (int)(s->B * nk * hk), cnn = (int)(s->B * nk_next * hk);
            MPI_Datatype rt;
            MPI_Type_contiguous((int)row, MPI_BYTE, &rt);
            MPI_Type_commit(&rt);
            MPI_Irecv(next, cnn, rt, prev, 2 * step, p->ring, &req[nreq++]);
            MPI_Irecv(next + kv_bytes, cnn, rt, prev, 2 * step + 1, p->ring, &req[nreq++]);
            MPI_Isend(cur, cn, rt, nxt, 2 * step, p->ring, &req[nreq++]);
            MPI_Isend(cur + kv_bytes, cn, rt, nxt, 2 * step + 1, p->ring, &req[nreq++]);
            MPI_Type_free(&rt);
            p->stats.bytes_sent += 2 * (int64_t)row * cn;
            p->stats.bytes_received += 2 * (int64_t)row * cnn;
        }
        const double t0 = now_ms();
        /* every range of the queries with every range of the visiting keys,
         * causal from their global positions */
        for (int a = 0, kat = 0; a < gq.nseg && st == SDPA_OK; a++, kat = 0)
            for (int c = 0; c < gq.nseg && st == SDPA_OK; c++) {
                int64_t kfirst, kn;
                group_range(p, j, 1, c, &kfirst, &kn);
                const size_t at = row * (size_t)(s->B * kat * hk);
                kat += (int)kn;
                if (gq.seg[a].n > 0 && kn > 0)
                    st = one_block(ctx, p, &gq.seg[a], cur + at, cur + kv_bytes + at, kn,
                                   gq.seg[a].first + off - kfirst, hq, hk, &tacc[a], lacc_r[a],
                                   tmp, ltmp, prm, req, nreq, dbp);
            }
        const double t1 = now_ms();
        if (nreq)
            MPI_Waitall(nreq, req, MPI_STATUSES_IGNORE);
        p->stats.compute_ms += t1 - t0;
        p->stats.wait_ms += now_ms() - t1;
        char *swap = cur;
        cur = next, next = swap;
    }
    if (st == SDPA_OK && k_joint && gq.n > 0) { /* the replicated keys, once, this member's heads */
        const int64_t T = k_joint->size[1];
        const int64_t h0 = p->kv_replicated ? p->u * s->Hkv / p->U : p->u * hk;
        char *kj = malloc(row * (size_t)(s->B * T * hk)), *vj = malloc(row * (size_t)(s->B * T * hk));
        const double t0 = now_ms();
        if (!kj || !vj) {
            st = fail(SDPA_OUT_OF_MEMORY, "sdpa_mpi_forward_joint: no memory for the joint keys");
        } else {
            pack(k_joint, 0, T, h0, hk, kj), pack(v_joint, 0, T, h0, hk, vj);
            sdpa_mpi_plan flat_plan = *p;
            flat_plan.s.causal = SDPA_CAUSAL_NONE; /* joint keys: visible to every query */
            for (int a = 0; a < gq.nseg && st == SDPA_OK; a++)
                if (gq.seg[a].n > 0)
                    st = one_block(ctx, &flat_plan, &gq.seg[a], kj, vj, T, 0, hq, hk, &tacc[a],
                                   lacc_r[a], tmp, ltmp, prm, NULL, 0, dbp);
        }
        p->stats.compute_ms += now_ms() - t0;
        free(kj), free(vj);
    }
    if ((st = agree(p->comm, st, p->rank)) == SDPA_OK)
        st = scatter_result(p, &gq, acc, lacc, hq, out, lse);
    st = agree(p->comm, st, p->rank);
    if (on_device && st == SDPA_OK) { /* the result back to the caller's device tensors */
        char why[300];
        const size_t w = oes * (size_t)(s->Hq * s->D);
        for (int64_t b = 0; b < s->B && nq && st == SDPA_OK; b++)
            st = sp_cuda_copy((char *)out_user->data + b * out_user->stride[0] * (int64_t)oes,
                              oes * (size_t)out_user->stride[1],
                              (char *)out->data + w * (size_t)(b * nq), w, w, (size_t)nq, 1, why,
                              sizeof why);
        const size_t bl = sizeof(float) * (size_t)(s->B * s->Hq * nq);
        if (st == SDPA_OK && lse_user && nq)
            st = sp_cuda_copy(lse_user, bl, lse, bl, bl, 1, 1, why, sizeof why);
        if (st != SDPA_OK)
            fail(st, "sdpa_mpi_forward: the result to the device: %s", why);
        st = agree(p->comm, st, p->rank);
    }
release:
    free(gq.data), free(gk.data), free(gv.data);
    free(cur), free(next), free(acc), free(tmp), free(lacc), free(ltmp);
    sp_cuda_free(db.q), sp_cuda_free(db.k), sp_cuda_free(db.v), sp_cuda_free(db.o);
    sp_cuda_free(db.lse), free(staged);
    p->stats.total_ms = now_ms() - t_start;
    return st;
}
