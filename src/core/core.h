/*
 * core.h - internal services every part of libsdpa uses: errors, logging,
 * call validation, the thread pool. Not installed; not part of the API.
 */
#ifndef SDPA_CORE_H
#define SDPA_CORE_H

#include "sdpa.h"

#include <stdarg.h>
#include <stdbool.h>

#if defined(__GNUC__)
#define SDPA_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define SDPA_PRINTF(a, b)
#endif

/* ---- errors (error.c) */

/* Records the message as this thread's last error and returns `status`. */
sdpa_status sdpa__fail(sdpa_status status, const char *fmt, ...) SDPA_PRINTF(2, 3);
void sdpa__clear_error(void);
void sdpa__set_last_backend(const char *name);

/* snprintf that never overflows and always terminates; returns dst. */
char *sdpa__strlcpy(char *dst, const char *src, size_t cap);
char *sdpa__fmt(char *dst, size_t cap, const char *fmt, ...) SDPA_PRINTF(3, 4);

/* ---- allocation: the library's only way to the heap (alloc.h), and
 * the per-thread scratch (scratch.c) */
#include "alloc.h"

/*
 * The calling thread's scratch area (64-byte aligned, at least n bytes,
 * contents undefined), kept between calls up to 16 MiB so that repeated
 * calls allocate nothing; NULL when out of memory. Pair every use with
 * sdpa__scratch_release(p), which frees only what was not kept. The area
 * is the thread's: never hand it to another call on the same thread while
 * in use.
 */
void *sdpa__scratch(size_t n);
void sdpa__scratch_release(void *p);

/* ---- logging (log.c) */

typedef struct sdpa_logger {
    sdpa_log_fn fn;
    void *user;
    int level; /* messages with level <= this are emitted */
} sdpa_logger;

void sdpa__log(const sdpa_logger *lg, sdpa_log_level level, const char *fmt, ...)
    SDPA_PRINTF(3, 4);
/* Parses "error|warn|info|debug"; -1 if unknown. */
int sdpa__log_level_parse(const char *s);

/* ---- a validated call (tensor.c) */

/* Everything a backend needs, checked once by sdpa__call_prepare. */
/*
 * Public structs that callers fill grow by addition (sdpa.h: "Growing by
 * addition"): each starts with size_t size, the sizeof the caller compiled
 * against; 0 means the 0.2.0 layout. SDPA_BASE_* are those 0.2.0 sizes,
 * which stay: a field added later must start at or after the old sizeof
 * (a struct that ended in padding gets the field 8-aligned, or an explicit
 * pad member first), so that an older caller's struct is read up to where
 * it ends and its padding is never taken for the new field.
 */
#ifndef SDPA_ABI_GROWTH_TEST
#define SDPA_BASE_PARAMS sizeof(sdpa_params)
#define SDPA_BASE_MASK sizeof(sdpa_mask)
#define SDPA_BASE_CONTEXT_OPTIONS sizeof(sdpa_context_options)
#define SDPA_BASE_LAYER_DESC sizeof(sdpa_layer_desc)
#define SDPA_BASE_CALL_DESC sizeof(sdpa_call_desc)
#define SDPA_BASE_TUNE_OPTIONS sizeof(sdpa_tune_options)
#else /* the growth test's build: each struct has one field more than at 0.2.0 */
#define SDPA_BASE_PARAMS offsetof(sdpa_params, abi_growth_test)
#define SDPA_BASE_MASK offsetof(sdpa_mask, abi_growth_test)
#define SDPA_BASE_CONTEXT_OPTIONS offsetof(sdpa_context_options, abi_growth_test)
#define SDPA_BASE_LAYER_DESC offsetof(sdpa_layer_desc, abi_growth_test)
#define SDPA_BASE_CALL_DESC offsetof(sdpa_call_desc, abi_growth_test)
#define SDPA_BASE_TUNE_OPTIONS offsetof(sdpa_tune_options, abi_growth_test)
#endif

/*
 * The struct to read for a caller's src: src itself when it holds every
 * field this build knows (the common case: no copy), else `local` (ours
 * bytes) with src's fields and the later ones zero, which means "as before
 * they existed". NULL with INVALID_ARGUMENT naming `what` when src->size
 * is below the 0.2.0 layout or beyond this build's (a caller built against
 * a newer libsdpa).
 */
const void *sdpa__struct_in(const void *src, size_t base, size_t ours, void *local,
                            const char *what);

typedef struct sdpa_call {
    const sdpa_tensor *q, *k, *v;
    sdpa_tensor *out;
    float *lse;
    double scale;         /* resolved: never 0 */
    sdpa_causal causal;
    int deterministic;
    void *stream;
    const sdpa_mask *mask; /* NULL, or validated; desc.mask says which kinds */
    sdpa_mask mask_grown;  /* the caller's mask when it was of an older layout */
    sdpa_call_desc desc;  /* sizes and flags in one place */
    struct sdpa_pool *pool;
    unsigned cpu_features; /* SDPA_CPU_* usable on this machine (after SDPA_MAX_ISA) */
    int cuda_flash_variant; /* the context's SDPA_CUDA_FLASH_VARIANT: 0 or 1 */
    int share;              /* sdpa_forward_share: this share (of desc.shares) */
    /* A backward call (desc.backward = 1, sdpa__call_prepare_backward):
     * out and lse are the forward's results and only read; dout is the
     * output's gradient, dq, dk, dv receive the inputs'. NULL otherwise. */
    const sdpa_tensor *dout;
    const float *dlse; /* [B, Hq, Sq], or NULL */
    sdpa_tensor *dq, *dk, *dv;
} sdpa_call;

/*
 * Checks every argument of a forward call (NULLs, sizes, strides, dtype and
 * device agreement, Hq % Hkv, 64-bit byte-count overflow, output overlapping
 * an input) and fills *call. INVALID_ARGUMENT with the argument's name.
 */
/* One tensor's own checks (dtype, device, sizes, strides, no output element
 * shared when is_output); *span is its extent in bytes. */
sdpa_status sdpa__check_tensor(const sdpa_tensor *t, const char *name, int is_output,
                               int64_t *span);
/* Whether byte ranges [a, a + na) and [b, b + nb) meet. */
int sdpa__overlaps(const void *a, int64_t na, const void *b, int64_t nb);

sdpa_status sdpa__call_prepare(const sdpa_tensor *q, const sdpa_tensor *k,
                               const sdpa_tensor *v, sdpa_tensor *out, float *lse,
                               const sdpa_params *params, sdpa_call *call);

/* The same for a backward call (sdpa_backward's arguments): the forward's
 * checks on q, k, v, out, lse and the mask, then dout, dq, dk, dv (sizes,
 * devices, no overlap between the gradients and anything else); lse is
 * required. */
sdpa_status sdpa__call_prepare_backward(const sdpa_tensor *q, const sdpa_tensor *k,
                                        const sdpa_tensor *v, const sdpa_tensor *out,
                                        const float *lse, const sdpa_tensor *dout,
                                        const float *dlse, sdpa_tensor *dq, sdpa_tensor *dk,
                                        sdpa_tensor *dv, const sdpa_params *params,
                                        sdpa_call *call);

/* "seq_len+key" for SDPA_MASK_KIND_* bits, "none" for 0. */
void sdpa__mask_kinds_name(unsigned kinds, char *buf, size_t n);
/* The most general kind among the bits (general > key > seq_len), 0: none. */
unsigned sdpa__mask_kind_top(unsigned kinds);
/* Parses "none" | "seq_len" | "key" | "general"; 0 with *ok = 0 if unknown. */
unsigned sdpa__mask_kind_parse(const char *s, int *ok);

/* k and v's dtype (sdpa_call_desc.kv_dtype resolved), and whether it is
 * not q's. */
static inline sdpa_dtype sdpa__kv_dtype(const sdpa_call_desc *d)
{
    return d->kv_dtype ? (sdpa_dtype)(d->kv_dtype - 1) : d->dtype;
}
static inline int sdpa__mixed_dtypes(const sdpa_call_desc *d) { return sdpa__kv_dtype(d) != d->dtype; }

/* Checks a block map against a call of B x Hq x Sq x Skv (validate.c):
 * its shape, and with host = 1 the lists of query blocks qb0 .. qb1 - 1. */
sdpa_status sdpa__check_block_map(const sdpa_block_map *m, int64_t B, int64_t Hq, int64_t Sq,
                                  int64_t Skv, int host, int64_t qb0, int64_t qb1);

/* Checks a call description (explain/decide input). */
sdpa_status sdpa__desc_validate(const sdpa_call_desc *d);

/* Byte offset of element (b, s, h, dd). */
static inline int64_t sdpa__offset(const sdpa_tensor *t, int64_t b, int64_t s, int64_t h,
                                   int64_t dd)
{
    return b * t->stride[0] + s * t->stride[1] + h * t->stride[2] + dd * t->stride[3];
}

/* ---- thread pool (pool.c) */

typedef struct sdpa_pool sdpa_pool;

/* A task body: runs tasks [task] on worker `worker` (0..threads-1); the
 * public sdpa_task_body. */
typedef sdpa_task_body sdpa_task_fn;

sdpa_status sdpa__pool_create(int threads, sdpa_pool **out);
void sdpa__pool_destroy(sdpa_pool *pool);
/* The process-wide pool of this width, created on first use and shared by
 * reference count; release with sdpa__pool_release (the last one stops it). */
sdpa_status sdpa__pool_acquire(int threads, sdpa_pool **out);
void sdpa__pool_release(sdpa_pool *pool);
/* The width kernels split a call for (a share pool: its share count). */
int sdpa__pool_threads(const sdpa_pool *pool);
/* How many workers run at once: the workspaces a kernel allocates (a share
 * pool: 1, worker 0). */
int sdpa__pool_workers(const sdpa_pool *pool);
/*
 * The pool call c runs on: NULL, the calling thread alone, when its
 * multiply-adds (both products, 2 B Hq Sq Skv D) are below
 * SDPA_POOL_INLINE_MACS, where waking the workers costs more than they
 * save; else c->pool. A share pool is kept whatever the size: each share
 * must run only its own tasks.
 * Why 2^19: the few-query path's threshold since it landed (b606191); the
 * tiled, BLAS and AMX runs took it when Python showed what waking costs
 * beside torch's own threads: one query x one key x 8 heads (cpu.blas,
 * 8 head tasks) from 0.55-0.69x torch's call to 1.46-1.56x (Zen 4, 2 vCPU,
 * bench/results/2026-12-04-python-calls-inline-ab-zen4.txt).
 */
#define SDPA_POOL_INLINE_MACS (1 << 19)
sdpa_pool *sdpa__pool_for_call(const sdpa_call *c);
/* A pool whose regions go to the caller's parallel-for, on `threads` workers. */
sdpa_status sdpa__pool_create_host(int threads, sdpa_parallel_for_fn fn, void *user,
                                   sdpa_pool **out);
/* This thread's share pool for part `share` of `shares` (pool.c says what
 * it runs); valid until the thread's next call of this. */
sdpa_pool *sdpa__pool_share(int share, int shares);
/* 1 and the share when `pool` is a share pool; else 0. */
int sdpa__pool_share_of(const sdpa_pool *pool, int *share, int *shares);
/*
 * Runs fn(arg, t, worker) for t in [0, n_tasks), tasks handed out one at a
 * time (dynamic balance for causal and ragged shapes). The caller is worker
 * 0. Concurrent calls on one pool run one after the other. A NULL pool runs
 * everything on the caller.
 */
void sdpa__parallel_for(sdpa_pool *pool, int64_t n_tasks, sdpa_task_fn fn, void *arg);

/*
 * State a kernel keeps on a thread between its tasks (cpu.amx: the tile
 * configuration, 8 KiB of register state the OS saves on every switch)
 * is dropped by fn, which the calling thread registers here: a pool worker
 * runs its registered functions once when it goes idle (after its spin,
 * before it sleeps), then forgets them. Up to 4 distinct functions per
 * thread (returns 0 when there is no room: the kernel must then drop its
 * state itself after each task); registering one again is a no-op. A
 * thread that is not a pool worker (the caller of a call) never goes idle
 * here: the kernel drops its state itself at the end of the call. A thread
 * of the caller's parallel-for (a host pool) gets 0: the kernel drops its
 * state after each task there.
 */
int sdpa__thread_on_idle(void (*fn)(void));

/* ---- platform (platform.c) */

/* This machine's CPU, and its CUDA device through probe_cuda (the
 * dispatcher passes the plugin loader's probe; core does not know the
 * plugin). sdpa_platform_detect is this with the loader's probe. */
sdpa_status sdpa__platform_detect(sdpa_platform *out, void (*probe_cuda)(sdpa_platform *p));

/*
 * What CPU detection reads from the machine (x86-64): CPUID leaves,
 * XCR0, and the kernel's answer to the AMX permission request. Tests
 * substitute a described CPU to check, e.g., that a refused AMX permission
 * falls back cleanly on machines that have no AMX at all.
 */
typedef struct sdpa_cpu_probe {
    int (*cpuid)(unsigned leaf, unsigned subleaf, unsigned regs[4]); /* 0: no such leaf */
    uint64_t (*xgetbv0)(void);
    int (*request_amx)(void); /* 1: XTILEDATA permitted */
} sdpa_cpu_probe;

/* NULL: the real machine. Tests only, and only while no context is being
 * created (it is read without a lock). */
void sdpa__set_cpu_probe(const sdpa_cpu_probe *probe);

#endif
