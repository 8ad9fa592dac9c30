/*
 * test_openmp_host.c - sdpa_openmp_host (src/core/openmp_host.c) in a
 * program built with OpenMP, so that a runtime is in the process:
 *  1. its parallel-for runs every task exactly once, on workers below the
 *     count asked for, one task at a time per worker, when OpenMP's team
 *     is wider than that count, and on one thread inside a parallel region;
 *  2. a context on it computes what a context with its own workers does,
 *     bit for bit, on every present CPU backend's calls of several tasks;
 *     and starts no thread of its own.
 * The refusals (threads < 1, NULL pointers) are here too; NOT_AVAILABLE,
 * with no runtime loaded, is test_validate's.
 */
#include "support/testlib.h"

#include <omp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

enum { TASKS = 997, WIDTH = 2 };

typedef struct tally {
    _Atomic int runs[TASKS];
    _Atomic int busy[8];    /* a worker inside a task                       */
    _Atomic int bad_worker; /* a worker number outside 0..WIDTH-1           */
    _Atomic int overlap;    /* a worker entered a task while inside another */
} tally;

static void count_task(void *arg, int64_t task, int worker)
{
    tally *t = arg;
    if (worker < 0 || worker >= WIDTH) {
        atomic_store(&t->bad_worker, 1);
        return;
    }
    if (atomic_fetch_add(&t->busy[worker], 1) != 0)
        atomic_store(&t->overlap, 1);
    atomic_fetch_add(&t->runs[task], 1);
    for (volatile int spin = 0; spin < 2000; spin++) /* long enough for members to meet */
        ;
    atomic_fetch_sub(&t->busy[worker], 1);
}

static void check_tally(const tally *t, const char *where)
{
    int once = 1;
    for (int i = 0; i < TASKS; i++)
        once &= atomic_load(&t->runs[i]) == 1;
    CHECK(once, "%s: some task did not run exactly once", where);
    CHECK(!atomic_load(&t->bad_worker), "%s: a task ran on a worker outside 0..%d", where, WIDTH - 1);
    CHECK(!atomic_load(&t->overlap), "%s: a worker ran two tasks at once", where);
}

static void parallel_for_contract(sdpa_parallel_for_fn fn, void *user)
{
    printf("== the parallel-for's contract\n");
    static tally t;
    memset(&t, 0, sizeof t);
    omp_set_num_threads(4); /* wider than the WIDTH asked for */
    fn(user, TASKS, count_task, &t);
    check_tally(&t, "a team of 4 for a width of 2");
    memset(&t, 0, sizeof t);
#pragma omp parallel num_threads(2)
    {
#pragma omp single
        fn(user, TASKS, count_task, &t); /* nested: one thread runs them all */
    }
    check_tally(&t, "inside a parallel region");
    omp_set_num_threads(WIDTH);
}

static void same_results(sdpa_parallel_for_fn fn, void *user)
{
    printf("== a context on the OpenMP team against one with its own workers\n");
    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    o.threads = WIDTH, o.ignore_env = 1, o.parallel_for = fn, o.parallel_for_user = user;
    sdpa_context *host = NULL, *own = NULL;
    CHECK_STATUS(sdpa_context_create(&o, &host), SDPA_OK);
    sdpa_context_options oo = SDPA_CONTEXT_OPTIONS_DEFAULT;
    oo.threads = WIDTH, oo.ignore_env = 1;
    CHECK_STATUS(sdpa_context_create(&oo, &own), SDPA_OK);
    if (!host || !own)
        return;
    static const char *backends[] = {"cpu.amx", "cpu.avx512bf16", "cpu.avx512", "cpu.avx2",
                                     "cpu.portable", "cpu.neon"};
    /* several tasks each: a long call, grouped-query decode, cross attention */
    const tl_case cases[3] = {
        {1, 300, 700, 4, 2, 64, SDPA_F32, SDPA_F32, SDPA_CAUSAL_BOTTOM_RIGHT, TL_BSHD, 1, TL_UNIFORM, 0, 0},
        {1, 2, 3000, 8, 2, 128, SDPA_F32, SDPA_F32, SDPA_CAUSAL_NONE, TL_BSHD, 1, TL_UNIFORM, 0, 0},
        {2, 150, 77, 3, 3, 80, SDPA_F32, SDPA_F32, SDPA_CAUSAL_NONE, TL_BSHD, 1, TL_UNIFORM, 0, 0}};
    for (size_t b = 0; b < sizeof backends / sizeof *backends; b++) {
        for (int i = 0; i < 3; i++) {
            tl_case c = cases[i];
            if (!strcmp(backends[b], "cpu.amx") || !strcmp(backends[b], "cpu.avx512bf16"))
                c.dtype = SDPA_BF16;
            char what[160];
            snprintf(what, sizeof what, "%s B=%lld Sq=%lld Skv=%lld Hq=%lld Hkv=%lld D=%lld",
                     backends[b], (long long)c.B, (long long)c.Sq, (long long)c.Skv,
                     (long long)c.Hq, (long long)c.Hkv, (long long)c.D);
            sdpa_call_desc d = SDPA_CALL_DESC_DEFAULT;
            d.dtype = c.dtype, d.B = c.B, d.Sq = c.Sq, d.Skv = c.Skv, d.Hq = c.Hq, d.Hkv = c.Hkv;
            d.D = c.D, d.causal = c.causal, d.want_lse = 1, d.backend = backends[b];
            char why[256];
            if (!tl_claims(own, &d, why, sizeof why)) { /* absent here, or not its case */
                tl_skip(what, why);
                continue;
            }
            tl_problem p;
            tl_output a, h;
            if (!tl_problem_make(&p, &c) || !tl_output_make(&a, &p) || !tl_output_make(&h, &p)) {
                CHECK(0, "%s: out of memory", what);
                continue;
            }
            sdpa_params prm = SDPA_PARAMS_DEFAULT;
            prm.backend = backends[b], prm.causal = c.causal;
            CHECK_STATUS(sdpa_forward(own, &p.q, &p.k, &p.v, &a.t, a.lse, &prm), SDPA_OK);
            CHECK_STATUS(sdpa_forward(host, &p.q, &p.k, &p.v, &h.t, h.lse, &prm), SDPA_OK);
            CHECK(tl_same_bits(&a, &h, &c),
                  "%s: on OpenMP's team != on libsdpa's workers (max |diff| %.3g)", what,
                  tl_max_diff(&a, &h, NULL));
            tl_output_free(&a), tl_output_free(&h), tl_problem_free(&p);
        }
    }
    sdpa_context_destroy(own);
    sdpa_context_destroy(host);
}

static void refusals(void)
{
    printf("== refusals\n");
    sdpa_parallel_for_fn fn = (sdpa_parallel_for_fn)1;
    void *user = &fn;
    CHECK_STATUS(sdpa_openmp_host(0, &fn, &user), SDPA_INVALID_ARGUMENT);
    CHECK(strstr(sdpa_last_error(), "threads is 0, expected >= 1"), "%s", sdpa_last_error());
    CHECK(fn == NULL && user == NULL, "a refusal left *fn and *user as they were");
    CHECK_STATUS(sdpa_openmp_host(2, NULL, &user), SDPA_INVALID_ARGUMENT);
    CHECK_STATUS(sdpa_openmp_host(2, &fn, NULL), SDPA_INVALID_ARGUMENT);
}

int main(void)
{
    tl_seed_from_env();
    omp_set_num_threads(WIDTH);
#pragma omp parallel
    { /* the runtime is loaded by linking; this starts its team as a host would */
    }
    sdpa_parallel_for_fn fn = NULL;
    void *user = NULL;
    CHECK_STATUS(sdpa_openmp_host(WIDTH, &fn, &user), SDPA_OK);
    if (fn) {
        parallel_for_contract(fn, user);
        same_results(fn, user);
    }
    refusals();
    return tl_finish();
}
