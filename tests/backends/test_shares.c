/*
 * test_shares.c - libsdpa on the caller's threads.
 *
 * 1. sdpa_forward_share: n threads of this test, released together, each
 *    compute share i of n; the result must be bitwise what sdpa_forward
 *    gives on a context of n threads, for every backend that claims
 *    shares, on every path of the CPU kernels (short and long key ranges,
 *    few queries with key chunks merged, causal, grouped-query, cross, a
 *    window, a block map, mixed dtypes, LSE). Every share must report the
 *    same backend; a backend that does not claim shares is refused with
 *    its reason, and bad share arguments name the argument.
 * 2. sdpa_context_options.parallel_for: a context whose regions run on
 *    this test's own pool gives bitwise the result of libsdpa's pool of
 *    the same width, for every present CPU backend, and starts no thread
 *    (the process's thread count is read from /proc/self/task); a call of
 *    under 2^19 multiply-adds runs on the calling thread, no region.
 *
 * usage: test_shares [backend ...]   (default: every present CPU backend)
 */
#include "support/testlib.h"

#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static sdpa_context *ctx_of[8]; /* ctx_of[n]: libsdpa's own pool of n threads */

/* ---- a case */

typedef struct scase {
    tl_case c;
    int window;  /* a sliding window (64, 32) */
    int blocks;  /* a block map: every other key block of each query block */
} scase;

static scase mk(int64_t B, int64_t Sq, int64_t Skv, int64_t Hq, int64_t Hkv, int64_t D)
{
    scase s = {{B, Sq, Skv, Hq, Hkv, D, SDPA_F32, SDPA_F32, SDPA_CAUSAL_NONE, TL_BSHD, 1,
                TL_UNIFORM, 0, 0},
               0, 0};
    return s;
}

typedef struct masks {
    sdpa_mask mask;
    sdpa_window window;
    sdpa_block_map map;
    int32_t *counts, *index;
} masks;

static const sdpa_mask *masks_make(masks *m, const scase *s)
{
    const sdpa_mask none = SDPA_MASK_DEFAULT;
    memset(m, 0, sizeof *m);
    m->mask = none;
    if (s->window) {
        m->window.left = 64, m->window.right = 32;
        m->mask.window = &m->window;
    }
    if (s->blocks) {
        const int64_t qb = (s->c.Sq + 63) / 64, kb = (s->c.Skv + 63) / 64;
        m->counts = calloc((size_t)qb, sizeof *m->counts);
        m->index = calloc((size_t)(qb * kb), sizeof *m->index);
        for (int64_t i = 0; i < qb; i++)
            for (int64_t j = i % 2; j < kb; j += 2)
                m->index[i * kb + m->counts[i]++] = (int32_t)j;
        sdpa_block_map map = {64, 64, 1, 1, qb, kb, kb, m->counts, m->index, NULL, NULL, NULL};
        m->map = map;
        m->mask.blocks = &m->map;
    }
    return s->window || s->blocks ? &m->mask : NULL;
}

static void masks_free(masks *m) { free(m->counts), free(m->index); }

static unsigned mask_kinds(const scase *s)
{
    return (s->window ? SDPA_MASK_KIND_WINDOW : 0) | (s->blocks ? SDPA_MASK_KIND_BLOCKS : 0);
}

static void describe(const char *backend, const scase *s, int n, char *buf, size_t len)
{
    const tl_case *c = &s->c;
    snprintf(buf, len, "%s shares=%d B=%lld Sq=%lld Skv=%lld Hq=%lld Hkv=%lld D=%lld %s%s%s %s%s%s",
             backend, n, (long long)c->B, (long long)c->Sq, (long long)c->Skv, (long long)c->Hq,
             (long long)c->Hkv, (long long)c->D, sdpa_dtype_name(c->dtype),
             tl_kv_dtype(c) != c->dtype ? "/" : "",
             tl_kv_dtype(c) != c->dtype ? sdpa_dtype_name(tl_kv_dtype(c)) : "",
             sdpa_causal_name(c->causal), s->window ? " window" : "", s->blocks ? " blocks" : "");
}

static int claims(const char *backend, const scase *s, int shares, char *why, size_t n)
{
    const tl_case *c = &s->c;
    sdpa_call_desc d;
    memset(&d, 0, sizeof d);
    d.device = SDPA_DEVICE_CPU, d.dtype = c->dtype, d.kv_dtype = c->kv_dtype;
    d.B = c->B, d.Sq = c->Sq, d.Skv = c->Skv, d.Hq = c->Hq, d.Hkv = c->Hkv, d.D = c->D;
    d.causal = c->causal, d.want_lse = c->want_lse, d.backend = backend;
    d.mask = mask_kinds(s), d.shares = shares;
    return tl_claims(ctx_of[2], &d, why, n);
}

/* ---- n threads of the test, each one share */

typedef struct share_run {
    const tl_problem *p;
    tl_output *o;
    sdpa_params prm;
    int shares;
    atomic_int ready;
    pthread_barrier_t go;
    sdpa_status st[8];
    const char *ran[8];
} share_run;

typedef struct share_arg {
    share_run *r;
    int i;
} share_arg;

static void *share_thread(void *raw)
{
    share_arg *a = raw;
    share_run *r = a->r;
    pthread_barrier_wait(&r->go); /* every share at once */
    r->st[a->i] = sdpa_forward_share(ctx_of[1], a->i, r->shares, &r->p->q, &r->p->k, &r->p->v,
                                     &r->o->t, r->o->lse, &r->prm);
    r->ran[a->i] = r->st[a->i] == SDPA_OK ? sdpa_last_backend() : "";
    return NULL;
}

static void check_shares(const char *backend, const scase *s, int n)
{
    char what[256], why[512];
    describe(backend, s, n, what, sizeof what);
    if (!claims(backend, s, n, why, sizeof why)) {
        tl_skip(what, why);
        return;
    }
    tl_problem p;
    tl_output whole, parts;
    masks mk;
    if (!tl_problem_make(&p, &s->c) || !tl_output_make(&whole, &p) ||
        !tl_output_make(&parts, &p)) {
        CHECK(0, "%s: out of memory", what);
        return;
    }
    sdpa_params prm = SDPA_PARAMS_DEFAULT;
    prm.backend = backend, prm.causal = s->c.causal, prm.mask = masks_make(&mk, s);
    const sdpa_status sw =
        sdpa_forward(ctx_of[n], &p.q, &p.k, &p.v, &whole.t, whole.lse, &prm);
    CHECK(sw == SDPA_OK, "%s: one call: %s", what, sdpa_last_error());
    share_run r;
    memset(&r, 0, sizeof r);
    r.p = &p, r.o = &parts, r.prm = prm, r.shares = n;
    pthread_barrier_init(&r.go, NULL, (unsigned)n);
    pthread_t tid[8];
    share_arg args[8];
    for (int i = 0; i < n; i++) {
        args[i].r = &r, args[i].i = i;
        pthread_create(&tid[i], NULL, share_thread, &args[i]);
    }
    for (int i = 0; i < n; i++)
        pthread_join(tid[i], NULL);
    pthread_barrier_destroy(&r.go);
    int ok = 1;
    for (int i = 0; i < n; i++) {
        CHECK(r.st[i] == SDPA_OK, "%s: share %d: %s", what, i, sdpa_status_string(r.st[i]));
        ok &= r.st[i] == SDPA_OK;
        CHECK(strcmp(r.ran[i], r.ran[0]) == 0, "%s: share %d ran %s, share 0 %s", what, i,
              r.ran[i], r.ran[0]);
    }
    if (ok && sw == SDPA_OK) {
        CHECK(memcmp(parts.mem, whole.mem, whole.bytes) == 0,
              "%s: the shares' output differs from one call's (max |diff| %.3g)", what,
              tl_max_diff(&parts, &whole, NULL));
        CHECK(memcmp(parts.lse, whole.lse,
                     sizeof(float) * (size_t)(s->c.B * s->c.Hq * s->c.Sq)) == 0,
              "%s: the shares' LSE differs from one call's", what);
        CHECK(tl_output_check(&parts, why, sizeof why), "%s: %s", what, why);
    }
    tl_output_free(&whole), tl_output_free(&parts), tl_problem_free(&p), masks_free(&mk);
}

static void shares_grid(const char *backend)
{
    printf("== %s: shares\n", backend);
    const int quick = getenv("SDPA_TEST_QUICK") != NULL;
    scase list[16];
    int n = 0;
    list[n++] = mk(1, 300, 300, 4, 4, 64);               /* short keys */
    list[n] = mk(1, 200, 1100, 4, 2, 72);                /* key blocks, grouped-query */
    list[n++].c.causal = SDPA_CAUSAL_BOTTOM_RIGHT;
    list[n] = mk(2, 129, 77, 3, 3, 128);                 /* cross, top-left */
    list[n++].c.causal = SDPA_CAUSAL_TOP_LEFT;
    list[n++] = mk(1, 1, 5000, 8, 2, 128);               /* few queries, key chunks merged */
    list[n++] = mk(2, 3, 333, 16, 4, 64);                /* few queries, whole heads */
    list[n] = mk(1, 700, 700, 2, 2, 64);                 /* a window */
    list[n++].window = 1;
    list[n] = mk(1, 640, 640, 2, 1, 64);                 /* a block map */
    list[n++].blocks = 1;
    list[n] = mk(1, 250, 600, 4, 2, 80);                 /* mixed dtypes */
    list[n].c.kv_dtype = SDPA_KV_DTYPE(SDPA_F16), list[n++].c.layout = TL_STRIDED;
    list[n] = mk(1, 100, 260, 4, 4, 64);                 /* bf16 in and out */
    list[n].c.dtype = SDPA_BF16, list[n++].c.out_dtype = SDPA_BF16;
    static const int counts[] = {1, 2, 3, 5};
    for (int i = 0; i < n; i++)
        for (int j = 0; j < 4; j++) {
            if (quick && (i + j) % 3) /* the TSan build: a third of them */
                continue;
            /* a backend without f32 gets the case in bf16 */
            scase s = list[i];
            if (strcmp(backend, "cpu.avx512bf16") == 0 || strcmp(backend, "cpu.amx") == 0) {
                if (s.c.dtype == SDPA_F32)
                    s.c.dtype = SDPA_BF16;
                if (tl_kv_dtype(&s.c) == SDPA_F32 || tl_kv_dtype(&s.c) == s.c.dtype)
                    s.c.kv_dtype = 0;
            }
            check_shares(backend, &s, counts[j]);
        }
}

/* ---- the caller's parallel-for: a pool of this test's */

typedef struct test_pool {
    int threads;
    atomic_int regions;
} test_pool;

typedef struct region {
    sdpa_task_body body;
    void *arg;
    int64_t n_tasks;
    atomic_llong next; /* one counter for every worker */
} region;

typedef struct region_worker_arg {
    region *r;
    int worker;
} region_worker_arg;

static void *region_worker(void *raw)
{
    region_worker_arg *a = raw;
    int64_t t;
    while ((t = atomic_fetch_add(&a->r->next, 1)) < a->r->n_tasks)
        a->r->body(a->r->arg, t, a->worker);
    return NULL;
}

/* threads started per region and joined: a plain parallel-for */
static void test_parallel_for(void *user, int64_t n_tasks, sdpa_task_body body, void *arg)
{
    test_pool *tp = user;
    atomic_fetch_add(&tp->regions, 1);
    region r;
    r.body = body, r.arg = arg, r.n_tasks = n_tasks;
    atomic_store(&r.next, 0);
    region_worker_arg wa[8];
    pthread_t tid[8];
    for (int w = 0; w < tp->threads; w++)
        wa[w].r = &r, wa[w].worker = w;
    for (int w = 1; w < tp->threads; w++)
        pthread_create(&tid[w], NULL, region_worker, &wa[w]);
    region_worker(&wa[0]);
    for (int w = 1; w < tp->threads; w++)
        pthread_join(tid[w], NULL);
}

static int process_threads(void)
{
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    if (!d)
        return -1;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* The count once threads that were joined have left /proc: pthread_join
 * returns when the thread clears its tid, a little before the kernel
 * removes its task (the test's parallel-for joins its threads after every
 * region), so a count above `want` is read again for up to 200 ms. A
 * thread libsdpa started would stay. */
static int threads_settle(int want)
{
    int n = process_threads();
    for (int tries = 0; n > want && tries < 200; tries++) {
        nanosleep(&(struct timespec){0, 1000000}, NULL);
        n = process_threads();
    }
    return n;
}

static void host_threads(const char **backends, int n_backends)
{
    printf("== the caller's parallel-for\n");
    test_pool tp = {3, 0};
    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    o.threads = 3, o.ignore_env = 1, o.parallel_for = test_parallel_for, o.parallel_for_user = &tp;
    sdpa_context *host;
    CHECK_STATUS(sdpa_context_create(&o, &host), SDPA_OK);
    sdpa_context_options own_o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    own_o.threads = 3, own_o.ignore_env = 1;
    sdpa_context *own;
    CHECK_STATUS(sdpa_context_create(&own_o, &own), SDPA_OK);
    { /* own's pool starts on its first call: before the count */
        scase s = mk(1, 64, 64, 2, 2, 32);
        tl_problem p;
        tl_output a;
        tl_problem_make(&p, &s.c);
        tl_output_make(&a, &p);
        CHECK_STATUS(sdpa_forward(own, &p.q, &p.k, &p.v, &a.t, a.lse, NULL), SDPA_OK);
        tl_output_free(&a), tl_problem_free(&p);
    }
    const int before = process_threads();
    for (int b = 0; b < n_backends; b++) {
        /* the last: 2^18 multiply-adds, under the 2^19 below which every CPU
         * kernel runs on the calling thread (core.h: sdpa__pool_for_call) */
        scase cases[4] = {mk(1, 400, 900, 4, 2, 64), mk(1, 2, 3000, 8, 2, 128),
                          mk(2, 150, 77, 3, 3, 80), mk(1, 16, 16, 8, 8, 64)};
        cases[0].c.causal = SDPA_CAUSAL_BOTTOM_RIGHT;
        for (int i = 0; i < 4; i++) {
            scase s = cases[i];
            if (strcmp(backends[b], "cpu.avx512bf16") == 0 || strcmp(backends[b], "cpu.amx") == 0)
                s.c.dtype = SDPA_BF16;
            char what[256], why[512];
            describe(backends[b], &s, 0, what, sizeof what);
            if (!claims(backends[b], &s, 0, why, sizeof why)) {
                tl_skip(what, why);
                continue;
            }
            tl_problem p;
            tl_output a, h;
            if (!tl_problem_make(&p, &s.c) || !tl_output_make(&a, &p) || !tl_output_make(&h, &p)) {
                CHECK(0, "%s: out of memory", what);
                continue;
            }
            sdpa_params prm = SDPA_PARAMS_DEFAULT;
            prm.backend = backends[b], prm.causal = s.c.causal;
            const int regions = atomic_load(&tp.regions);
            CHECK_STATUS(sdpa_forward(host, &p.q, &p.k, &p.v, &h.t, h.lse, &prm), SDPA_OK);
            const double macs = 2.0 * (double)(s.c.B * s.c.Hq * s.c.Sq * s.c.Skv * s.c.D);
            if (macs >= (1 << 19))
                CHECK(atomic_load(&tp.regions) > regions,
                      "%s: the call did not use the caller's parallel-for", what);
            else
                CHECK(atomic_load(&tp.regions) == regions,
                      "%s: %.0f multiply-adds woke the caller's parallel-for (under 2^19 the "
                      "calling thread runs the call alone)", what, macs);
            CHECK(threads_settle(before) == before, "%s: libsdpa started threads (%d, was %d)",
                  what, process_threads(), before);
            CHECK_STATUS(sdpa_forward(own, &p.q, &p.k, &p.v, &a.t, a.lse, &prm), SDPA_OK);
            CHECK(tl_same_bits(&a, &h, &s.c),
                  "%s: on the caller's threads != on libsdpa's (max |diff| %.3g)", what,
                  tl_max_diff(&a, &h, NULL));
            tl_output_free(&a), tl_output_free(&h), tl_problem_free(&p);
        }
    }
    sdpa_context_destroy(own);
    sdpa_context_destroy(host);
}

/* ---- refusals */

static void refusals(void)
{
    printf("== refusals\n");
    scase s = mk(1, 64, 64, 2, 2, 32);
    tl_problem p;
    tl_output o;
    tl_problem_make(&p, &s.c);
    tl_output_make(&o, &p);
    memset(o.mem, 0x5a, o.bytes - TL_GUARD);
    sdpa_params prm = SDPA_PARAMS_DEFAULT;
    static const struct {
        int share, shares;
        const char *words;
    } bad[] = {{0, 0, "shares is 0"}, {-1, 2, "share is -1"}, {2, 2, "share is 2, expected 0..1"},
               {0, 5000, "shares is 5000"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK_STATUS(sdpa_forward_share(ctx_of[1], bad[i].share, bad[i].shares, &p.q, &p.k, &p.v,
                                        &o.t, NULL, &prm),
                     SDPA_INVALID_ARGUMENT);
        CHECK(strstr(sdpa_last_error(), bad[i].words), "share %d of %d: %s", bad[i].share,
              bad[i].shares, sdpa_last_error());
    }
    int untouched = 1;
    for (size_t i = 0; i < o.bytes - TL_GUARD; i++)
        untouched &= ((unsigned char *)o.mem)[i] == 0x5a;
    CHECK(untouched, "a refused share wrote its output");
    /* a backend that does not take shares is refused with its reason */
    sdpa_backend_info bi;
    for (int i = 0; i < sdpa_backend_count(ctx_of[1]); i++)
        if (sdpa_backend_get(ctx_of[1], i, &bi) == SDPA_OK && bi.present && !bi.shares &&
            bi.device == SDPA_DEVICE_CPU) {
            prm.backend = bi.name;
            CHECK_STATUS(sdpa_forward_share(ctx_of[1], 0, 2, &p.q, &p.k, &p.v, &o.t, NULL, &prm),
                         SDPA_UNSUPPORTED);
            CHECK(strstr(sdpa_last_error(), "share"), "%s: %s", bi.name, sdpa_last_error());
        }
    /* explain says which backends take a share */
    sdpa_call_desc d;
    memset(&d, 0, sizeof d);
    d.device = SDPA_DEVICE_CPU, d.dtype = SDPA_BF16, d.B = 1, d.Sq = d.Skv = 4096;
    d.Hq = d.Hkv = 8, d.D = 128, d.shares = 4;
    char *text = NULL;
#if defined(__x86_64__)
    /* cpu.amx's reason, on a described AMX Xeon: on this machine's CPU the
     * rules may not try cpu.amx at all (an AMD core's bf16 rule does not) */
    sdpa_platform xeon;
    sdpa_context *ctx_xeon = NULL;
    sdpa_context_options xo = SDPA_CONTEXT_OPTIONS_DEFAULT;
    CHECK_STATUS(sdpa_platform_parse("cpu:vendor=intel,features=avx2+avx512+avx512bf16+amx-bf16",
                                     &xeon),
                 SDPA_OK);
    xo.platform = &xeon, xo.ignore_env = 1, xo.threads = 1;
    CHECK_STATUS(sdpa_context_create(&xo, &ctx_xeon), SDPA_OK);
    CHECK_STATUS(sdpa_explain(ctx_xeon, &d, 0, &text), SDPA_OK);
    CHECK(text && strstr(text, "(a share of 4)") && strstr(text, "cpu.amx") &&
              strstr(text, "sdpa_forward_share) not supported"),
          "explain of a share on an AMX Xeon: %s", text ? text : "(null)");
    sdpa_free(text);
    sdpa_context_destroy(ctx_xeon);
    text = NULL;
#endif
    CHECK_STATUS(sdpa_explain(ctx_of[1], &d, 0, &text), SDPA_OK);
    CHECK(text && strstr(text, "(a share of 4)"), "explain of a share: %s", text ? text : "(null)");
    sdpa_free(text);
    tl_output_free(&o), tl_problem_free(&p);
}

int main(int argc, char **argv)
{
    tl_seed_from_env();
    for (int n = 1; n <= 5; n++) {
        sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
        o.threads = n, o.ignore_env = 1;
        if (sdpa_context_create(&o, &ctx_of[n]) != SDPA_OK) {
            printf("context: %s\n", sdpa_last_error());
            return 1;
        }
    }
    const char *names[SDPA_MAX_BACKENDS];
    int n = 0;
    if (argc > 1) {
        for (int i = 1; i < argc && n < SDPA_MAX_BACKENDS; i++)
            names[n++] = argv[i];
    } else {
        sdpa_backend_info bi;
        for (int i = 0; i < sdpa_backend_count(ctx_of[1]); i++)
            if (sdpa_backend_get(ctx_of[1], i, &bi) == SDPA_OK && bi.present &&
                bi.device == SDPA_DEVICE_CPU)
                names[n++] = bi.name;
    }
    for (int i = 0; i < n; i++)
        shares_grid(names[i]);
    host_threads(names, n);
    refusals();
    for (int i = 1; i <= 5; i++)
        sdpa_context_destroy(ctx_of[i]);
    return tl_finish();
}
