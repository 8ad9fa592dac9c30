/*
 * test_sp_faults.c - libsdpa_mpi under faults, run by CTest under mpirun
 * with 1 to 4 ranks (test_sp checks its results; this checks its failures).
 *
 * Allocation failures: for every rank f and every n, rank f's n-th
 * allocation fails while it creates a plan, runs a forward and destroys
 * the plan; the other ranks allocate freely. libsdpa_mpi's sources are
 * built here over the static core (tests/CMakeLists.txt), so one counter
 * (src/core/alloc.c) spans libsdpa_mpi's allocations and the core's inside
 * the local attention. Wherever the failure lands, every rank must return
 * OUT_OF_MEMORY from the same call, plan or forward, with its outputs as
 * they were; once n is past the last allocation, the call must succeed
 * with the fault-free result, bit for bit. A rank left waiting would hang
 * the test (CTest's timeout); a leak is LeakSanitizer's in the ASan build.
 *
 * `test_sp_faults --exit-rank R CODE`: rank R calls _exit(CODE) from inside
 * the local attention of its first ring block (a backend registered for
 * that) while the others are inside the same sdpa_mpi_forward; none of
 * them may return. tests/mpi/rank_exit.sh checks that mpirun ends the job
 * in bounded time with an error naming the rank.
 */
#include "sdpa_mpi.h"
#include "mpi_check.h"
#include "dispatch/seam.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int rank, size, passed, failed;
static int64_t injected_all, wrong_all; /* over every case, for the summary */

typedef struct fcase {
    int U, R;
    int64_t B, Sq, Skv, Hq, Hkv, D, T; /* T > 0: that many replicated joint keys */
    sdpa_dtype dtype, out_dtype;
    sdpa_causal causal;
    int zigzag;
} fcase;

/* A deterministic value of element (b, global row i, h, d) of tensor
 * `which`: every rank fills its own rows without the whole tensor. */
static float value(int which, int64_t b, int64_t i, int64_t h, int64_t d)
{
    uint64_t x = ((((uint64_t)which * 131 + (uint64_t)b) * 1000003 + (uint64_t)i) * 1009 +
                  (uint64_t)h) * 1031 + (uint64_t)d + 1;
    x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33, x *= 0xc4ceb9fe1a85ec53ull, x ^= x >> 33;
    return (float)((x >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* This rank's rows (ranges f, n) of tensor `which`, [B, n0 + n1, H, D]. */
static void *local_rows(int which, const fcase *c, int64_t H, const int64_t f[2],
                        const int64_t n[2])
{
    const int64_t rows = n[0] + n[1];
    const size_t count = (size_t)(c->B * (rows ? rows : 1) * H * c->D);
    float *x = malloc(sizeof(float) * count);
    size_t at = 0;
    for (int64_t b = 0; b < c->B; b++)
        for (int g = 0; g < 2; g++)
            for (int64_t i = 0; i < n[g]; i++)
                for (int64_t h = 0; h < H; h++)
                    for (int64_t d = 0; d < c->D; d++)
                        x[at++] = value(which, b, f[g] + i, h, d);
    if (c->dtype != SDPA_F32) /* narrowed in place: the front half holds the values */
        sdpa_convert(x, SDPA_F32, x, c->dtype, count);
    return x;
}

typedef struct outcome {
    int step;         /* 0: success; 1: plan creation failed; 2: the forward failed */
    sdpa_status status;
} outcome;

/* Plan, forward, destroy, as a caller would; the result in out and lse. */
static outcome run_once(sdpa_context *ctx, const fcase *c, void *q, void *k, void *v, void *kj,
                        void *vj, const int64_t qn, const int64_t kn, void *out, float *lse,
                        const char *backend)
{
    sdpa_mpi_shape shape = {c->B, c->Sq, c->Skv, c->Hq, c->Hkv, c->D, c->dtype, c->causal,
                            c->zigzag};
    sdpa_mpi_plan *plan;
    outcome r = {0, sdpa_mpi_plan_create(MPI_COMM_WORLD, c->U, c->R, &shape, NULL, NULL, &plan)};
    if (r.status != SDPA_OK) {
        r.step = 1;
        return r;
    }
    const int64_t qr = qn ? qn : 1, kr = kn ? kn : 1;
    sdpa_tensor tq = sdpa_tensor_bshd(q, c->dtype, c->B, qr, c->Hq, c->D);
    sdpa_tensor tk = sdpa_tensor_bshd(k, c->dtype, c->B, kr, c->Hkv, c->D);
    sdpa_tensor tv = sdpa_tensor_bshd(v, c->dtype, c->B, kr, c->Hkv, c->D);
    sdpa_tensor to = sdpa_tensor_bshd(out, c->out_dtype, c->B, qr, c->Hq, c->D);
    sdpa_tensor tkj = sdpa_tensor_bshd(kj, c->dtype, c->B, c->T ? c->T : 1, c->Hkv, c->D);
    sdpa_tensor tvj = sdpa_tensor_bshd(vj, c->dtype, c->B, c->T ? c->T : 1, c->Hkv, c->D);
    sdpa_params prm = SDPA_PARAMS_DEFAULT;
    prm.backend = backend;
    r.status = sdpa_mpi_forward_joint(plan, ctx, qn ? &tq : NULL, kn ? &tk : NULL,
                                      kn ? &tv : NULL, c->T ? &tkj : NULL, c->T ? &tvj : NULL,
                                      qn ? &to : NULL, lse, &prm);
    r.step = r.status != SDPA_OK ? 2 : 0;
    sdpa_mpi_plan_destroy(plan);
    return r;
}

/* Every rank's outcome: all equal (step and status) or the first that differs. */
static int all_agree(outcome mine, outcome *first_other)
{
    int m[2] = {mine.step, (int)mine.status}, *all = malloc(sizeof(int) * 2 * (size_t)size);
    MPI_Allgather(m, 2, MPI_INT, all, 2, MPI_INT, MPI_COMM_WORLD);
    int same = 1;
    for (int i = 0; i < size && same; i++)
        if (all[2 * i] != m[0] || all[2 * i + 1] != m[1])
            same = 0, first_other->step = all[2 * i], first_other->status = (sdpa_status)all[2 * i + 1];
    free(all);
    return same;
}

/* This rank's row ranges of q and of k/v, from a fault-free plan. */
static int my_ranges(const fcase *c, int64_t qf[2], int64_t qc[2], int64_t kf[2], int64_t kc[2])
{
    sdpa_mpi_shape shape = {c->B, c->Sq, c->Skv, c->Hq, c->Hkv, c->D, c->dtype, c->causal,
                            c->zigzag};
    sdpa_mpi_plan *plan;
    if (sdpa_mpi_plan_create(MPI_COMM_WORLD, c->U, c->R, &shape, NULL, NULL, &plan) != SDPA_OK)
        return 0;
    sdpa_mpi_ranges(plan, -1, 0, qf, qc);
    sdpa_mpi_ranges(plan, -1, 1, kf, kc);
    sdpa_mpi_plan_destroy(plan);
    return 1;
}

static void fault_case(sdpa_context *ctx, const fcase *c)
{
    char what[160];
    snprintf(what, sizeof what, "P=%d U=%d R=%d Sq=%lld Skv=%lld Hq=%lld Hkv=%lld T=%lld %s->%s %s%s",
             size, c->U, c->R, (long long)c->Sq, (long long)c->Skv, (long long)c->Hq,
             (long long)c->Hkv, (long long)c->T, sdpa_dtype_name(c->dtype),
             sdpa_dtype_name(c->out_dtype), sdpa_causal_name(c->causal), c->zigzag ? " zigzag" : "");
    int64_t qf[2], qc[2], kf[2], kc[2];
    if (!my_ranges(c, qf, qc, kf, kc)) {
        CHECK(0, "%s: plan: %s", what, sdpa_mpi_last_error());
        return;
    }
    const int64_t qn = qc[0] + qc[1], kn = kc[0] + kc[1], jf[2] = {0, 0}, jn[2] = {c->T, 0};
    void *q = local_rows(0, c, c->Hq, qf, qc), *k = local_rows(1, c, c->Hkv, kf, kc);
    void *v = local_rows(2, c, c->Hkv, kf, kc);
    void *kj = local_rows(3, c, c->Hkv, jf, jn), *vj = local_rows(4, c, c->Hkv, jf, jn);
    const size_t out_bytes = (c->out_dtype == SDPA_F32 ? 4 : 2) *
                             (size_t)(c->B * (qn ? qn : 1) * c->Hq * c->D),
                 lse_bytes = sizeof(float) * (size_t)(c->B * c->Hq * (qn ? qn : 1));
    char *want = malloc(out_bytes + lse_bytes), *got = malloc(out_bytes + lse_bytes);
    char *sentinel = malloc(out_bytes + lse_bytes);
    memset(sentinel, 0x5a, out_bytes + lse_bytes);
    outcome ok = run_once(ctx, c, q, k, v, kj, vj, qn, kn, want, (float *)(want + out_bytes), NULL);
    CHECK(ok.status == SDPA_OK, "%s: fault-free run: %s", what, sdpa_mpi_last_error());
    int injected_total = 0, wrong = 0;
    for (int f = 0; f < size && ok.status == SDPA_OK; f++) {
        for (int64_t n = 1; n < 100000; n++) {
            memcpy(got, sentinel, out_bytes + lse_bytes);
            sdpa__alloc_fail_at(rank == f ? n : 0);
            outcome r = run_once(ctx, c, q, k, v, kj, vj, qn, kn, got, (float *)(got + out_bytes),
                                 NULL);
            int injected = rank == f && sdpa__alloc_count() >= n;
            sdpa__alloc_fail_at(0);
            MPI_Bcast(&injected, 1, MPI_INT, f, MPI_COMM_WORLD);
            outcome other = r;
            const int same = all_agree(r, &other);
            if (!injected) { /* past rank f's last allocation: a normal call */
                CHECK(r.status == SDPA_OK && memcmp(got, want, out_bytes + lse_bytes) == 0,
                      "%s: rank %d, no failure injected at %lld: status %d, result %s", what, f,
                      (long long)n, (int)r.status,
                      memcmp(got, want, out_bytes + lse_bytes) ? "differs" : "equal");
                if (rank == 0)
                    printf("%s: rank %d: %lld allocations, each failed once\n", what, f,
                           (long long)(n - 1));
                break;
            }
            injected_total++;
            const int bad = !same || r.status != SDPA_OUT_OF_MEMORY ||
                            memcmp(got, sentinel, out_bytes + lse_bytes) != 0;
            wrong += bad;
            if (bad && wrong <= 5) /* the first few, in full */
                CHECK(0, "%s: allocation %lld of rank %d failed: here step %d status %d (%s), "
                      "another rank step %d status %d; outputs %s", what, (long long)n, f, r.step,
                      (int)r.status, sdpa_mpi_last_error(), other.step, (int)other.status,
                      memcmp(got, sentinel, out_bytes + lse_bytes) ? "written" : "as they were");
        }
    }
    CHECK(wrong == 0, "%s: %d of %d injected failures not reported alike by every rank", what,
          wrong, injected_total);
    injected_all += injected_total, wrong_all += wrong;
    free(q), free(k), free(v), free(kj), free(vj), free(want), free(got), free(sentinel);
}

/* --exit-rank: a backend that ends the process from inside a call. */
static int exit_code;

static sdpa_status exit_run(const sdpa_backend *self, const sdpa_call *call)
{
    (void)self, (void)call;
    printf("rank %d: exiting with %d inside sdpa_mpi_forward\n", rank, exit_code);
    fflush(stdout);
    _exit(exit_code);
}

static int exit_during_call(sdpa_context *ctx, int who, int code)
{
    static sdpa_backend exiter;
    exiter = sdpa__backend_ref;
    exiter.name = "test.exit", exiter.summary = "ends the process", exiter.fallback_rank = 0;
    exiter.run = exit_run;
    exit_code = code;
    if (sdpa__ctx_add_backend(ctx, &exiter) != SDPA_OK)
        return 1;
    const fcase c = {1, size, 1, 64, 64, 4, 4, 16, 0, SDPA_F32, SDPA_F32, SDPA_CAUSAL_NONE, 0};
    int64_t f[2], n[2], kf[2], kn[2];
    if (!my_ranges(&c, f, n, kf, kn))
        return 1;
    void *q = local_rows(0, &c, 4, f, n), *k = local_rows(1, &c, 4, kf, kn);
    void *v = local_rows(2, &c, 4, kf, kn), *out = malloc(sizeof(float) * 64 * 4 * 16);
    printf("rank %d: entering sdpa_mpi_forward\n", rank);
    fflush(stdout);
    outcome r = run_once(ctx, &c, q, k, v, NULL, NULL, n[0], kn[0], out, NULL,
                         rank == who ? "test.exit" : NULL);
    /* Not reached while MPI does what rank_exit.sh expects: the job is
     * ended while the other ranks wait for rank `who`'s messages. */
    printf("rank %d: sdpa_mpi_forward returned %d (%s)\n", rank, (int)r.status,
           sdpa_mpi_last_error());
    fflush(stdout);
    free(q), free(k), free(v), free(out);
    return 0;
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    o.threads = 1, o.ignore_env = 1; /* the calling thread only: one deterministic result */
    sdpa_context *ctx;
    if (sdpa_context_create(&o, &ctx) != SDPA_OK)
        return 1;
    if (argc == 4 && strcmp(argv[1], "--exit-rank") == 0) {
        const int rc = exit_during_call(ctx, atoi(argv[2]), atoi(argv[3]));
        sdpa_context_destroy(ctx);
        MPI_Finalize();
        return rc;
    }
    int grids[3][2], ng = 0;
    grids[ng][0] = 1, grids[ng][1] = size, ng++; /* ring */
    if (size > 1)
        grids[ng][0] = size, grids[ng][1] = 1, ng++; /* Ulysses */
    if (size == 4)
        grids[ng][0] = 2, grids[ng][1] = 2, ng++; /* USP */
    for (int g = 0; g < ng; g++) {
        const int U = grids[g][0], R = grids[g][1];
        const int64_t hkv = U == 3 ? 3 : 2; /* split by 2, replicated by 4 */
        /* causal across shard boundaries (a block's own mask), zigzag */
        const fcase a = {U, R, 1, 37, 37, 12, hkv, 8, 0, SDPA_F32, SDPA_F32,
                         SDPA_CAUSAL_BOTTOM_RIGHT, 1};
        /* cross attention, bf16 in and out, joint text keys */
        const fcase b = {U, R, 2, 19, 29, 12, hkv, 8, 5, SDPA_BF16, SDPA_BF16, SDPA_CAUSAL_NONE,
                         0};
        fault_case(ctx, &a);
        fault_case(ctx, &b);
    }
    sdpa_context_destroy(ctx);
    int counts[2] = {passed, failed}, total[2];
    MPI_Reduce(counts, total, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("%lld allocation failures injected on %d ranks, %lld not reported alike by every "
               "rank\n", (long long)injected_all, size, (long long)wrong_all);
        printf("%d passed, %d failed, 0 skipped (all ranks)\n", total[0], total[1]);
    }
    MPI_Bcast(total, 2, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Finalize();
    return total[1] ? 1 : 0;
}
