/*
 * plan.c - libsdpa_mpi's plan: the ulysses x ring grid on the caller's
 * communicator, the row split (even, given counts, or the zigzag for
 * causal), and the errors and agreed verdicts every step uses.
 */
#include "sp_internal.h"
#include "device_staging.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

_Thread_local char sp_last_error[512];

const char *sdpa_mpi_last_error(void) { return sp_last_error; }

int sdpa_mpi_cuda_aware(void) { return sp_mpi_cuda_aware(); }

sdpa_status sp_fail(sdpa_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sp_last_error, sizeof sp_last_error, fmt, ap);
    va_end(ap);
    return st;
}

double sp_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* Every rank's local verdict (its message kept) made one: status of the
 * worst rank; the ranks that were fine say which rank failed. */
sdpa_status sp_agree(MPI_Comm comm, sdpa_status local, int rank)
{
    int mine[2] = {local != SDPA_OK ? (int)local : 0, local != SDPA_OK ? rank : -1}, all[2];
    if (MPI_Allreduce(mine, all, 2, MPI_INT, MPI_MAX, comm) != MPI_SUCCESS)
        return sp_fail(SDPA_DEVICE_ERROR, "sdpa_mpi: MPI_Allreduce failed");
    if (all[0] == 0)
        return SDPA_OK;
    if (local == SDPA_OK)
        sp_fail((sdpa_status)all[0], "sdpa_mpi: rank %d refused the call (its message says why)",
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
            return sp_fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_plan_create: %s[%d] is %lld, expected >= 0",
                           name, p, (long long)counts[p]);
        first[2 * p] = at, count[2 * p] = counts[p], at += counts[p];
    }
    if (at != S)
        return sp_fail(SDPA_INVALID_ARGUMENT,
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
        return sp_fail(SDPA_INVALID_ARGUMENT,
                       "sdpa_mpi_plan_create: ulysses %d x ring %d is %lld, expected the "
                       "communicator's size %d",
                       U, R, (long long)U * R, size);
    const int64_t sz[6] = {s->B, s->Sq, s->Skv, s->Hq, s->Hkv, s->D};
    static const char *nm[6] = {"B", "Sq", "Skv", "Hq", "Hkv", "D"};
    for (int i = 0; i < 6; i++)
        if (sz[i] < 1)
            return sp_fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_plan_create: shape->%s is %lld, "
                           "expected >= 1", nm[i], (long long)sz[i]);
    if (s->Hq % s->Hkv)
        return sp_fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_plan_create: Hq %lld is not a multiple of "
                       "Hkv %lld", (long long)s->Hq, (long long)s->Hkv);
    if ((unsigned)s->dtype > SDPA_BF16 || (unsigned)s->causal > SDPA_CAUSAL_BOTTOM_RIGHT)
        return sp_fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_plan_create: shape->dtype %d or ->causal %d "
                       "unknown", (int)s->dtype, (int)s->causal);
    if (s->Hq % U || (s->Hkv % U && U % s->Hkv)) {
        char ok[200] = "";
        size_t len = 0;
        for (int d = 1; d <= size && len < sizeof ok - 16; d++)
            if (size % d == 0 && s->Hq % d == 0 && (s->Hkv % d == 0 || d % s->Hkv == 0))
                len += (size_t)snprintf(ok + len, sizeof ok - len, "%s%d", len ? ", " : "", d);
        return sp_fail(SDPA_INVALID_ARGUMENT,
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
    sp_last_error[0] = '\0';
    if (!out)
        return sp_fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_plan_create: out is NULL");
    *out = NULL;
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized)
        return sp_fail(SDPA_NOT_AVAILABLE, "sdpa_mpi_plan_create: MPI is %s; the caller "
                       "initialises MPI (libsdpa_mpi never calls MPI_Init)",
                       inited ? "finalized" : "not initialised");
    int size, rank, provided;
    if (comm == MPI_COMM_NULL || MPI_Comm_size(comm, &size) != MPI_SUCCESS ||
        MPI_Comm_rank(comm, &rank) != MPI_SUCCESS)
        return sp_fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_plan_create: comm is not a valid "
                       "communicator");
    MPI_Query_thread(&provided); /* only the calling thread communicates: any level will do */
    (void)provided;
    sdpa_mpi_plan *p = sdpa__calloc(1, sizeof *p);
    int64_t *arrays = p ? sdpa__malloc(sizeof(int64_t) * 8 * (size_t)size) : NULL;
    sdpa_status st = p && arrays ? SDPA_OK
                                 : sp_fail(SDPA_OUT_OF_MEMORY, "sdpa_mpi_plan_create: no memory");
    if (st == SDPA_OK && !shape)
        st = sp_fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_plan_create: shape is NULL");
    if (st == SDPA_OK)
        st = check_shape(shape, ulysses, ring, size);
    if (st == SDPA_OK && shape->zigzag && (q_counts || kv_counts))
        st = sp_fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_plan_create: shape->zigzag and explicit "
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
    /* [0]: the worst rank's status, [1]: which rank (as sp_agree) */
    int64_t mine[2 * ND + 2], all[2 * ND + 2];
    mine[0] = st, mine[1] = st != SDPA_OK ? rank : -1;
    for (int i = 0; i < ND; i++)
        mine[2 + i] = desc[i], mine[2 + ND + i] = -desc[i];
    if (MPI_Allreduce(mine, all, 2 * ND + 2, MPI_INT64_T, MPI_MAX, comm) != MPI_SUCCESS)
        st = sp_fail(SDPA_DEVICE_ERROR, "sdpa_mpi_plan_create: MPI_Allreduce failed");
    else if (all[0] && st == SDPA_OK) /* e.g. out of memory there: the same status here */
        st = sp_fail((sdpa_status)all[0], "sdpa_mpi_plan_create: rank %lld refused the plan (its "
                     "message says why)", (long long)all[1]);
    else if (st == SDPA_OK) {
        static const char *names[ND] = {"ulysses", "ring", "B",     "Sq",     "Skv",
                                        "Hq",      "Hkv",  "D",     "dtype",  "causal",
                                        "zigzag",  "the row splits"};
        for (int i = 0; i < ND && st == SDPA_OK; i++)
            if (all[2 + i] != -all[2 + ND + i])
                st = sp_fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_plan_create: ranks disagree on %s "
                             "(values %lld to %lld); every rank must pass the same plan",
                             names[i], (long long)-all[2 + ND + i], (long long)all[2 + i]);
    }
    if (st == SDPA_OK) {
        p->s = *shape, p->size = size, p->rank = rank, p->U = ulysses, p->R = ring;
        p->u = rank % ulysses, p->r = rank / ulysses;
        p->kv_replicated = shape->Hkv % ulysses != 0;
        p->nseg = shape->zigzag ? 2 : 1;
        if (MPI_Comm_dup(comm, &p->comm) != MPI_SUCCESS ||
            MPI_Comm_split(p->comm, p->r, p->u, &p->group) != MPI_SUCCESS ||
            MPI_Comm_split(p->comm, p->u, p->r, &p->ring) != MPI_SUCCESS)
            st = sp_fail(SDPA_DEVICE_ERROR, "sdpa_mpi_plan_create: MPI_Comm_dup/split failed");
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
int64_t sp_local_rows(const sdpa_mpi_plan *p, int i, int kv)
{
    const int64_t *c = kv ? p->kv_count : p->q_count;
    return c[2 * i] + c[2 * i + 1];
}

void sdpa_mpi_last_stats(const sdpa_mpi_plan *p, sdpa_mpi_stats *out) { *out = p->stats; }
