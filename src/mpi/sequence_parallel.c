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
    int64_t *q_first, *q_count, *kv_first, *kv_count; /* per rank */
    sdpa_mpi_stats stats;
};

static _Thread_local char last_error[512];

const char *sdpa_mpi_last_error(void) { return last_error; }

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

/* ceil blocks: rank p holds [p c, min(S, (p + 1) c)), c = ceil(S / P). */
static void ceil_split(int64_t S, int P, int64_t *first, int64_t *count)
{
    const int64_t c = (S + P - 1) / P;
    for (int p = 0; p < P; p++) {
        first[p] = p * c < S ? p * c : S;
        count[p] = (p + 1) * c < S ? c : S - first[p];
    }
}

static sdpa_status split(int64_t S, int P, const int64_t *counts, const char *name,
                         int64_t *first, int64_t *count)
{
    if (!counts) {
        ceil_split(S, P, first, count);
        return SDPA_OK;
    }
    int64_t at = 0;
    for (int p = 0; p < P; p++) {
        if (counts[p] < 0)
            return fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_plan_create: %s[%d] is %lld, expected >= 0",
                        name, p, (long long)counts[p]);
        first[p] = at, count[p] = counts[p], at += counts[p];
    }
    if (at != S)
        return fail(SDPA_INVALID_ARGUMENT,
                    "sdpa_mpi_plan_create: %s sum to %lld, expected %lld (the sequence)", name,
                    (long long)at, (long long)S);
    return SDPA_OK;
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
    int64_t *arrays = p ? malloc(sizeof(int64_t) * 4 * (size_t)size) : NULL;
    sdpa_status st = p && arrays ? SDPA_OK
                                 : fail(SDPA_OUT_OF_MEMORY, "sdpa_mpi_plan_create: no memory");
    if (st == SDPA_OK && !shape)
        st = fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_plan_create: shape is NULL");
    if (st == SDPA_OK)
        st = check_shape(shape, ulysses, ring, size);
    if (st == SDPA_OK) {
        p->q_first = arrays, p->q_count = arrays + size;
        p->kv_first = arrays + 2 * size, p->kv_count = arrays + 3 * size;
        st = split(shape->Sq, size, q_counts, "q_counts", p->q_first, p->q_count);
        if (st == SDPA_OK)
            st = split(shape->Skv, size, kv_counts, "kv_counts", p->kv_first, p->kv_count);
    }
    /* The same plan on every rank: compare what each was given (max of x
     * and of -x is the range), or every rank fails with the difference. */
    int64_t desc[11] = {0};
    if (st == SDPA_OK) {
        const int64_t d0[11] = {ulysses, ring, shape->B, shape->Sq, shape->Skv, shape->Hq,
                                shape->Hkv, shape->D, shape->dtype, shape->causal, 0};
        memcpy(desc, d0, sizeof desc);
        uint64_t h = 14695981039346656037u; /* the splits, hashed (FNV-1a, unsigned) */
        for (int i = 0; i < size; i++)
            h = (h ^ (uint64_t)p->q_count[i]) * 1099511628211u,
            h = (h ^ (uint64_t)p->kv_count[i]) * 1099511628211u;
        desc[10] = (int64_t)(h >> 2); /* non-negative: -x below cannot overflow */
    }
    int64_t mine[23], all[23];
    mine[0] = st != SDPA_OK;
    for (int i = 0; i < 11; i++)
        mine[1 + i] = desc[i], mine[12 + i] = -desc[i];
    if (MPI_Allreduce(mine, all, 23, MPI_INT64_T, MPI_MAX, comm) != MPI_SUCCESS)
        st = fail(SDPA_DEVICE_ERROR, "sdpa_mpi_plan_create: MPI_Allreduce failed");
    else if (all[0] && st == SDPA_OK)
        st = fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_plan_create: another rank refused the plan "
                  "(its message says why)");
    else if (st == SDPA_OK) {
        static const char *names[11] = {"ulysses", "ring", "B", "Sq", "Skv", "Hq", "Hkv", "D",
                                        "dtype", "causal", "the row splits"};
        for (int i = 0; i < 11 && st == SDPA_OK; i++)
            if (all[1 + i] != -all[12 + i])
                st = fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_plan_create: ranks disagree on %s "
                          "(values %lld to %lld); every rank must pass the same plan",
                          names[i], (long long)-all[12 + i], (long long)all[1 + i]);
    }
    if (st == SDPA_OK) {
        p->s = *shape, p->size = size, p->rank = rank, p->U = ulysses, p->R = ring;
        p->u = rank % ulysses, p->r = rank / ulysses;
        p->kv_replicated = shape->Hkv % ulysses != 0;
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

void sdpa_mpi_rows(const sdpa_mpi_plan *p, int rank, int kv, int64_t *first, int64_t *count)
{
    const int i = rank < 0 ? p->rank : rank;
    *first = kv ? p->kv_first[i] : p->q_first[i];
    *count = kv ? p->kv_count[i] : p->q_count[i];
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
static sdpa_status alltoall(const sdpa_mpi_plan *p, const void *send, const int64_t *sc,
                            void *recv, const int64_t *rc, size_t row_bytes)
{
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
    return e == MPI_SUCCESS ? SDPA_OK : fail(SDPA_DEVICE_ERROR, "sdpa_mpi_forward: "
                                             "MPI_Alltoallv failed");
}

/* ---- the forward */

typedef struct gathered {
    int64_t first, n; /* the group's rows */
    char *data;       /* [B, n, heads, D] */
} gathered;

/* The group's rows of x (q: kv = 0, or k/v) for this member's heads. */
static sdpa_status gather_group(sdpa_mpi_plan *p, const sdpa_tensor *x, int kv, int64_t heads,
                                gathered *g)
{
    const sdpa_mpi_shape *s = &p->s;
    const int64_t *first = kv ? p->kv_first : p->q_first, *count = kv ? p->kv_count : p->q_count;
    const int base = p->r * p->U;
    const size_t row = esize(s->dtype) * (size_t)s->D;
    g->first = first[base], g->n = 0;
    for (int u = 0; u < p->U; u++)
        g->n += count[base + u];
    g->data = malloc(row * (size_t)(s->B * (g->n ? g->n : 1) * heads));
    const int64_t mine = count[p->rank];
    if (p->U == 1) { /* no message: a local failure is agreed on before the ring */
        if (!g->data)
            return fail(SDPA_OUT_OF_MEMORY, "sdpa_mpi_forward: no memory for the gathered rows");
        if (mine)
            pack(x, 0, mine, 0, heads, g->data);
        return SDPA_OK;
    }
    /* send to member u: my rows of u's heads; receive from u: u's rows of mine */
    const int64_t H = kv ? s->Hkv : s->Hq;
    int64_t *sc = malloc(sizeof(int64_t) * 2 * (size_t)p->U), *rc = sc ? sc + p->U : NULL;
    char *sendbuf = malloc(row * (size_t)(s->B * (mine ? mine : 1) * heads * p->U));
    char *recvbuf = malloc(row * (size_t)(s->B * (g->n ? g->n : 1) * heads));
    sdpa_status st = g->data && sc && sendbuf && recvbuf
                         ? SDPA_OK
                         : fail(SDPA_OUT_OF_MEMORY, "sdpa_mpi_forward: no memory for the "
                                "all-to-all");
    /* every rank, or none, goes on to the all-to-all */
    if ((st = agree(p->comm, st, p->rank)) != SDPA_OK) {
        free(sc), free(sendbuf), free(recvbuf);
        return st;
    }
    for (int u = 0; st == SDPA_OK && u < p->U; u++) {
        const int64_t h0 = kv && p->kv_replicated ? u * H / p->U : u * heads;
        if (mine)
            pack(x, 0, mine, h0, heads, sendbuf + row * (size_t)(s->B * mine * heads * u));
        sc[u] = s->B * mine * heads, rc[u] = s->B * count[base + u] * heads;
    }
    if (st == SDPA_OK)
        st = alltoall(p, sendbuf, sc, recvbuf, rc, row);
    p->stats.bytes_sent += (int64_t)row * s->B * mine * heads * (p->U - 1);
    p->stats.bytes_received += (int64_t)row * s->B * (g->n - mine) * heads;
    /* member u's piece is [B, count_u, heads, D]: into rows first_u - g->first */
    for (int u = 0, off = 0; st == SDPA_OK && u < p->U; u++) {
        const int64_t n = count[base + u], at = first[base + u] - g->first;
        for (int64_t b = 0; b < s->B; b++)
            memcpy(g->data + row * (size_t)((b * g->n + at) * heads),
                   recvbuf + row * (size_t)(off + b * n * heads), row * (size_t)(n * heads));
        off += (int)(s->B * n * heads);
    }
    free(sc), free(sendbuf), free(recvbuf);
    return st;
}

/* The attention of the group's queries with one visiting K/V block, merged
 * into (acc, lacc). d: key j of the block is visible to query i when
 * j <= i + d (causal only). */
static sdpa_status one_block(sdpa_context *ctx, const sdpa_mpi_plan *p, const gathered *q,
                             void *k, void *v, int64_t nk, int64_t d, int64_t hq, int64_t hk,
                             sdpa_tensor *acc, float *lacc, float *tmp, float *ltmp,
                             const sdpa_params *user)
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
    sdpa_tensor tq = block(q->data, s->dtype, s->B, nq, hq, s->D);
    sdpa_tensor tk = block(k, s->dtype, s->B, nk, hk, s->D);
    sdpa_tensor tv = block(v, s->dtype, s->B, nk, hk, s->D);
    sdpa_tensor to = block(tmp, SDPA_F32, s->B, nq, hq, s->D);
    sdpa_status st = sdpa_forward(ctx, &tq, &tk, &tv, &to, ltmp, &prm);
    if (st == SDPA_OK)
        st = sdpa_merge(acc, lacc, &to, ltmp, acc, lacc);
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
    if (t->device.kind != SDPA_DEVICE_CPU)
        return fail(SDPA_UNSUPPORTED, "sdpa_mpi_forward: %s is device memory; this build "
                    "stages nothing through the host yet (CPU tensors only)", name);
    if (!is_out && t->dtype != s->dtype)
        return fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_forward: %s is %s, expected the plan's %s",
                    name, sdpa_dtype_name(t->dtype), sdpa_dtype_name(s->dtype));
    if (is_out && (unsigned)t->dtype > SDPA_BF16)
        return fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_forward: out->dtype %d unknown",
                    (int)t->dtype);
    return SDPA_OK;
}

/* This rank's rows of the result: from the group's accumulator (U = 1) or
 * through the reverse all-to-all, cast once into out. */
static sdpa_status scatter_result(sdpa_mpi_plan *p, const gathered *q, const float *acc,
                                  const float *lacc, int64_t hq, sdpa_tensor *out, float *lse)
{
    const sdpa_mpi_shape *s = &p->s;
    const int base = p->r * p->U;
    const int64_t mine = p->q_count[p->rank], D = s->D;
    const size_t row = sizeof(float) * (size_t)D;
    /* send to member u: its rows of my heads, O then the LSE; receive from
     * u: my rows of its heads */
    int64_t *sc = malloc(sizeof(int64_t) * 2 * (size_t)p->U), *rc = sc ? sc + p->U : NULL;
    float *sendbuf = malloc(row * (size_t)(s->B * (q->n ? q->n : 1) * hq) +
                            sizeof(float) * (size_t)(s->B * hq * (q->n ? q->n : 1)));
    float *recvbuf = malloc(row * (size_t)(s->B * (mine ? mine : 1) * s->Hq) +
                            sizeof(float) * (size_t)(s->B * s->Hq * (mine ? mine : 1)));
    sdpa_status st = sc && sendbuf && recvbuf
                         ? SDPA_OK
                         : fail(SDPA_OUT_OF_MEMORY, "sdpa_mpi_forward: no memory for the result");
    if (p->U > 1) /* every rank, or none, goes on to the all-to-all */
        st = agree(p->comm, st, p->rank);
    if (st != SDPA_OK) {
        free(sc), free(sendbuf), free(recvbuf);
        return st;
    }
    if (p->U == 1) {
        memcpy(recvbuf, acc, row * (size_t)(s->B * mine * hq));
        memcpy(recvbuf + s->B * mine * hq * D, lacc, sizeof(float) * (size_t)(s->B * hq * mine));
    } else {
        /* a piece is [B, n_u, hq, D] floats then [B, hq, n_u] floats: D + 1
         * floats per (b, i, h), sent as rows of D + 1 floats */
        const size_t prow = sizeof(float) * (size_t)(D + 1);
        float *o = sendbuf;
        for (int u = 0; u < p->U; u++) {
            const int64_t n = p->q_count[base + u], at = p->q_first[base + u] - q->first;
            for (int64_t b = 0; b < s->B; b++)
                for (int64_t i = 0; i < n; i++)
                    for (int64_t h = 0; h < hq; h++, o += D + 1) {
                        memcpy(o, acc + ((b * q->n + at + i) * hq + h) * D, row);
                        o[D] = lacc[(b * hq + h) * q->n + at + i];
                    }
            sc[u] = s->B * n * hq, rc[u] = s->B * mine * hq;
        }
        st = alltoall(p, sendbuf, sc, recvbuf, rc, prow);
        p->stats.bytes_sent += (int64_t)prow * s->B * (q->n - mine) * hq;
        p->stats.bytes_received += (int64_t)prow * s->B * mine * hq * (p->U - 1);
    }
    float *tmp = malloc(row);
    if (st == SDPA_OK && !tmp)
        st = fail(SDPA_OUT_OF_MEMORY, "sdpa_mpi_forward: no memory");
    for (int u = 0; st == SDPA_OK && u < p->U; u++) { /* member u's heads of my rows */
        for (int64_t b = 0; b < s->B; b++)
            for (int64_t i = 0; i < mine; i++)
                for (int64_t h = 0; h < hq; h++) {
                    const float *src, *l;
                    if (p->U == 1) {
                        src = recvbuf + ((b * mine + i) * hq + h) * D;
                        l = recvbuf + s->B * mine * hq * D + (b * hq + h) * mine + i;
                    } else {
                        src = recvbuf + (((int64_t)u * s->B * mine + b * mine + i) * hq + h) *
                                            (D + 1);
                        l = src + D;
                    }
                    const int64_t H = u * hq + h;
                    char *dst = (char *)out->data +
                                (b * out->stride[0] + i * out->stride[1] + H * out->stride[2]) *
                                    (int64_t)esize(out->dtype);
                    if (out->stride[3] == 1) {
                        sdpa_convert(src, SDPA_F32, dst, out->dtype, (size_t)D);
                    } else {
                        sdpa_convert(src, SDPA_F32, tmp, out->dtype, (size_t)D);
                        for (int64_t e = 0; e < D; e++)
                            memcpy(dst + e * out->stride[3] * (int64_t)esize(out->dtype),
                                   (char *)tmp + e * (int64_t)esize(out->dtype),
                                   esize(out->dtype));
                    }
                    if (lse)
                        lse[(b * s->Hq + H) * mine + i] = *l;
                }
    }
    free(tmp), free(sc), free(sendbuf), free(recvbuf);
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
                        "the plan's dtype %s", names[i], sdpa_dtype_name(p->s.dtype));
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
    const int64_t nq = p->q_count[p->rank], nkv = p->kv_count[p->rank];
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

    const int64_t hq = s->Hq / p->U, hk = p->kv_replicated ? 1 : s->Hkv / p->U;
    gathered gq = {0, 0, NULL}, gk = {0, 0, NULL}, gv = {0, 0, NULL};
    /* a failure inside a gather with messages is agreed there (every rank
     * stops at the same one); without messages (ulysses 1), before the ring */
    st = gather_group(p, q, 0, hq, &gq);
    if (st == SDPA_OK || p->U == 1)
        st = st == SDPA_OK ? gather_group(p, k, 1, hk, &gk) : st;
    if (st == SDPA_OK || p->U == 1)
        st = st == SDPA_OK ? gather_group(p, v, 1, hk, &gv) : st;
    /* the ring: blocks of the R groups' K/V */
    const size_t row = esize(s->dtype) * (size_t)s->D;
    int64_t max_nk = 0;
    for (int j = 0; j < p->R; j++) {
        int64_t n = 0;
        for (int u = 0; u < p->U; u++)
            n += p->kv_count[j * p->U + u];
        max_nk = n > max_nk ? n : max_nk;
    }
    const size_t kv_bytes = row * (size_t)(s->B * (max_nk ? max_nk : 1) * hk);
    char *cur = malloc(2 * kv_bytes), *next = malloc(2 * kv_bytes);
    const size_t acc_n = (size_t)(s->B * (gq.n ? gq.n : 1) * hq);
    float *acc = calloc(acc_n * (size_t)s->D, sizeof(float)), *tmp = malloc(acc_n * (size_t)s->D * 4);
    float *lacc = malloc(acc_n * sizeof(float)), *ltmp = malloc(acc_n * sizeof(float));
    if (st == SDPA_OK && (!cur || !next || !acc || !tmp || !lacc || !ltmp))
        st = fail(SDPA_OUT_OF_MEMORY, "sdpa_mpi_forward: no memory for the ring");
    if ((st = agree(p->comm, st, p->rank)) != SDPA_OK) { /* together, before any ring message */
        free(gq.data), free(gk.data), free(gv.data);
        free(cur), free(next), free(acc), free(tmp), free(lacc), free(ltmp);
        p->stats.total_ms = now_ms() - t_start;
        return st;
    }
    if (st == SDPA_OK) {
        for (size_t i = 0; i < acc_n; i++)
            lacc[i] = -INFINITY; /* nothing seen yet */
        memcpy(cur, gk.data, row * (size_t)(s->B * gk.n * hk));
        memcpy(cur + kv_bytes, gv.data, row * (size_t)(s->B * gk.n * hk));
    }
    sdpa_tensor tacc = block(acc, SDPA_F32, s->B, gq.n ? gq.n : 1, hq, s->D);
    const int64_t off = s->causal == SDPA_CAUSAL_BOTTOM_RIGHT ? s->Skv - s->Sq : 0;
    const int prev = (p->r - 1 + p->R) % p->R, nxt = (p->r + 1) % p->R;
    /* A local failure inside the loop must not leave the others waiting
     * on this rank's messages: the ring keeps turning, and the failure is
     * agreed on after it. */
    for (int step = 0; step < p->R; step++) {
        const int j = (p->r - step + p->R) % p->R, jn = (j - 1 + p->R) % p->R;
        int64_t nk = 0, nk_next = 0;
        for (int u = 0; u < p->U; u++)
            nk += p->kv_count[j * p->U + u], nk_next += p->kv_count[jn * p->U + u];
        const int64_t kfirst = p->kv_first[j * p->U];
        MPI_Request req[4];
        int nreq = 0;
        if (step < p->R - 1 && cur && next) {
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
        if (st == SDPA_OK && gq.n > 0 && nk > 0)
            st = one_block(ctx, p, &gq, cur, cur + kv_bytes, nk, gq.first + off - kfirst, hq, hk,
                           &tacc, lacc, tmp, ltmp, prm);
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
            sdpa_mpi_shape flat = *s;
            flat.causal = SDPA_CAUSAL_NONE; /* joint keys: visible to every query */
            sdpa_mpi_plan view = *p;
            view.s = flat;
            st = one_block(ctx, &view, &gq, kj, vj, T, 0, hq, hk, &tacc, lacc, tmp, ltmp, prm);
        }
        p->stats.compute_ms += now_ms() - t0;
        free(kj), free(vj);
    }
    if ((st = agree(p->comm, st, p->rank)) == SDPA_OK)
        st = scatter_result(p, &gq, acc, lacc, hq, out, lse);
    st = agree(p->comm, st, p->rank);
    free(gq.data), free(gk.data), free(gv.data);
    free(cur), free(next), free(acc), free(tmp), free(lacc), free(ltmp);
    p->stats.total_ms = now_ms() - t_start;
    return st;
}
