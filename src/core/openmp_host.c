/*
 * openmp_host.c - sdpa_openmp_host: a parallel-for (sdpa.h) on the team of
 * an OpenMP runtime the host has already loaded.
 *
 * The runtime is found among the loaded objects (dl_iterate_phdr) by name
 * and opened with RTLD_NOLOAD, so libsdpa neither links an OpenMP runtime
 * nor loads one: a second runtime beside the host's would be a second
 * pool, the thing this avoids. Two entry points are used, GOMP_parallel
 * (GNU's ABI for `#pragma omp parallel`, which LLVM's and Intel's runtimes
 * also export) and omp_get_thread_num. The handle is kept open for the
 * life of the process: contexts hold its function pointers.
 *
 * Tasks go to the team's members as on libsdpa's own pool (task_lanes.h:
 * dealt in turn, the rest taken by whoever has run out, so a team narrower
 * than asked for still runs them all); a member whose number is at or past
 * the context's threads takes none, so the workers libsdpa sees stay
 * 0..threads-1 if the host's team is wider.
 */
#define _GNU_SOURCE
#include "core.h"
#include "task_lanes.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#if defined(__linux__)
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#define SDPA_HAVE_DL_ITERATE 1
#endif

#ifdef SDPA_HAVE_DL_ITERATE
typedef void (*gomp_parallel_fn)(void (*fn)(void *), void *data, unsigned threads, unsigned flags);
typedef int (*omp_thread_num_fn)(void);

static struct {
    gomp_parallel_fn parallel;
    omp_thread_num_fn thread_num;
} omp;
static pthread_mutex_t omp_lock = PTHREAD_MUTEX_INITIALIZER;

static int is_runtime_name(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    return !strncmp(base, "libgomp", 7) || !strncmp(base, "libomp.", 7) ||
           !strncmp(base, "libiomp5", 8);
}

/* The paths of loaded objects named like a runtime, gathered while
 * dl_iterate_phdr holds the loader's list lock and opened after it lets
 * go (dlopen inside the callback would take the loader's other lock in
 * the order opposite to a concurrent dlopen's). */
enum { MAX_CANDIDATES = 4 };
typedef struct candidates {
    char path[MAX_CANDIDATES][4096];
    int n;
} candidates;

static int gather(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    candidates *c = data;
    if (info->dlpi_name && is_runtime_name(info->dlpi_name) && c->n < MAX_CANDIDATES &&
        strlen(info->dlpi_name) < sizeof c->path[0])
        strcpy(c->path[c->n++], info->dlpi_name);
    return 0;
}

static void find_runtime(void)
{
    static candidates c; /* 16 KB: not on the caller's stack; under omp_lock */
    c.n = 0;
    dl_iterate_phdr(gather, &c);
    for (int i = 0; i < c.n && !omp.parallel; i++) {
        void *h = dlopen(c.path[i], RTLD_NOW | RTLD_NOLOAD);
        if (!h)
            continue;
        gomp_parallel_fn parallel;
        omp_thread_num_fn thread_num;
        /* POSIX: dlsym's object pointer converts to a function pointer */
        *(void **)&parallel = dlsym(h, "GOMP_parallel");
        *(void **)&thread_num = dlsym(h, "omp_get_thread_num");
        if (parallel && thread_num)
            omp.parallel = parallel, omp.thread_num = thread_num; /* h stays open: see the top */
        else
            dlclose(h);
    }
}

typedef struct team_region {
    sdpa_task_body body;
    void *arg;
    int threads;
    sdpa_task_lanes lanes;
} team_region;

static void team_member(void *raw)
{
    team_region *r = raw;
    const int worker = omp.thread_num();
    if (worker < 0 || worker >= r->threads)
        return;
    sdpa__task_lanes_drain(&r->lanes, worker, r->body, r->arg);
}

/* user: the team's width, as an integer (sdpa_openmp_host) */
static void openmp_for(void *user, int64_t n_tasks, sdpa_task_body body, void *arg)
{
    team_region r; /* 4 KB of lanes: set by _start, not zeroed first */
    r.body = body, r.arg = arg, r.threads = (int)(intptr_t)user;
    sdpa__task_lanes_start(&r.lanes, r.threads, n_tasks);
    omp.parallel(team_member, &r, (unsigned)r.threads, 0);
}
#endif

sdpa_status sdpa_openmp_host(int threads, sdpa_parallel_for_fn *fn, void **user)
{
    if (!fn || !user)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "sdpa_openmp_host: fn and user must not be NULL");
    *fn = NULL, *user = NULL;
    if (threads < 1)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "sdpa_openmp_host: threads is %d, expected >= 1",
                          threads);
#ifdef SDPA_HAVE_DL_ITERATE
    /* looked for until found: a host may load its runtime after a first ask */
    pthread_mutex_lock(&omp_lock);
    if (!omp.parallel)
        find_runtime();
    const int found = omp.parallel != NULL;
    pthread_mutex_unlock(&omp_lock);
    if (found) {
        *fn = openmp_for, *user = (void *)(intptr_t)threads;
        return SDPA_OK;
    }
    return sdpa__fail(SDPA_NOT_AVAILABLE, "sdpa_openmp_host: no OpenMP runtime (libgomp, libomp, "
                                          "libiomp5) is loaded in this process");
#else
    return sdpa__fail(SDPA_NOT_AVAILABLE, "sdpa_openmp_host: needs a dynamic loader (Linux)");
#endif
}
