/*
 * cudnn_run.c - cuda.cudnn: running the SDPA graph of cudnn_graph.c.
 *
 * Per call: check what cuDNN needs that the capability table cannot say
 * (output in the input dtype, unit D-stride, 16-byte aligned pointers),
 * find or build the execution plan, and execute it on the caller's stream.
 *
 * Plans are cached per (device, sizes, strides, dtype, mask, stats) in a
 * small process-wide table; an entry a thread is executing is never
 * evicted under it (a use count, taken and dropped under the lock).
 * Building one compiles kernels (NVRTC, about a second), so it happens
 * under the cache lock once per shape (or in sdpa_warmup); later calls
 * cost a lookup. cuDNN handles are per thread (a handle must not be used
 * by two threads at once). The workspace is a per-thread device buffer
 * that only grows, so the hot path does no cudaMalloc.
 *
 * Status mapping (shared/notes/cudnn-backend-sdpa.md, section 6):
 * no viable engine or NOT_SUPPORTED_* -> UNSUPPORTED (the layer latches to
 * the next backend); missing driver/library -> NOT_AVAILABLE; allocation
 * failures -> OUT_OF_MEMORY; BAD_PARAM -> INTERNAL (our bug); failures
 * while executing -> DEVICE_ERROR. Nothing is swallowed.
 *
 * Masks: sequence lengths only, as cuDNN's padding mask (the graph's
 * seq_len tensors; a missing side is a cached device array of full
 * lengths), then mask_rows.cu writes the rows that see no key as sdpa.h
 * says (zeros, LSE -inf): the padded products never write rows past
 * seq_len_q.
 *
 * Not yet run on a GPU: scripts/gpu-check.sh is the test.
 */
#include "cudnn_graph.h"
#include "device_memory.h"
#include "plugin.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

extern const sdpa_cuda_host *sdpa_cuda__host;
#ifdef SDPA_HAVE_CUDA_KERNELS
cudaError_t sdpa_cuda__zero_unseen_rows(const sdpa_cuda_call *c); /* mask_rows.cu */
#endif

typedef struct plan_key {
    int device;
    sdpa_cudnn_problem p;
} plan_key;

typedef struct plan_entry {
    int used;
    int users; /* threads between get_plan and release_plan: not evicted */
    uint64_t last_use;
    plan_key key;
    sdpa_cudnn_graph graph;
    cudnnBackendDescriptor_t cfg, plan;
    int64_t workspace;
} plan_entry;

#define PLAN_SLOTS 32

static plan_entry plans[PLAN_SLOTS];
static uint64_t plan_clock;
static pthread_mutex_t plan_lock = PTHREAD_MUTEX_INITIALIZER;

/* The calling thread's handle for the device of its current call. Handles
 * are kept, one per device, and never destroyed while the thread lives:
 * a cached plan was finalized with the handle of the thread that built it
 * (sdpa_cudnn_build_plan), and stays valid only while that handle does. */
#define HANDLE_DEVICES 64
static _Thread_local cudnnHandle_t handles[HANDLE_DEVICES];
static _Thread_local cudnnHandle_t handle;
/* Like the handle, the workspace belongs to one device: a thread that
 * moves to another device gets a new one there. */
static _Thread_local void *workspace;
static _Thread_local size_t workspace_size;
static _Thread_local int workspace_device = -1;

/* Device arrays of one length repeated, for the side of the padding mask
 * a call leaves out (cuDNN's graph takes both): per thread, one per side,
 * rebuilt when the device, count or value changes. */
typedef struct full_lengths {
    int device;
    int64_t n;
    int32_t value;
    int32_t *ptr;
} full_lengths;
static _Thread_local full_lengths full_len[2] = {{-1, 0, 0, NULL}, {-1, 0, 0, NULL}};

static sdpa_status full_lengths_get(int side, int device, int64_t n, int32_t value,
                                    const int32_t **out)
{
    full_lengths *f = &full_len[side];
    if (f->ptr && f->device == device && f->n == n && f->value == value) {
        *out = f->ptr;
        return SDPA_OK;
    }
    if (f->ptr)
        cudaFree(f->ptr);
    f->ptr = NULL;
    int32_t host[256];
    cudaError_t ce = cudaMalloc((void **)&f->ptr, sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; ce == cudaSuccess && i < n; i += 256) {
        const int64_t m = n - i < 256 ? n - i : 256;
        for (int64_t j = 0; j < m; j++)
            host[j] = value;
        ce = cudaMemcpy(f->ptr + i, host, sizeof(int32_t) * (size_t)m, cudaMemcpyHostToDevice);
    }
    if (ce != cudaSuccess) {
        if (f->ptr)
            cudaFree(f->ptr);
        f->ptr = NULL;
        return sdpa_cuda__host->fail(ce == cudaErrorMemoryAllocation ? SDPA_OUT_OF_MEMORY
                                                                     : SDPA_DEVICE_ERROR,
                                     "cuda.cudnn: %lld full lengths for the padding mask: %s",
                                     (long long)n, cudaGetErrorString(ce));
    }
    f->device = device, f->n = n, f->value = value;
    *out = f->ptr;
    return SDPA_OK;
}

static sdpa_status fail_cudnn(cudnnStatus_t st, int executing, const char *what)
{
    const int code = (int)st;
    char detail[256] = "";
    cudnnGetLastErrorString(detail, sizeof detail);
    return sdpa_cuda__host->fail(sdpa_cudnn_status_map(code, executing, detail),
                                 "cuda.cudnn: %s: %s (%d)%s%.200s", what, cudnnGetErrorString(st),
                                 code, detail[0] ? ": " : "", detail);
}

/* [B, S, H, D] strides -> the graph's [b, h, s, d] order. */
static void bhsd(const sdpa_tensor *t, int64_t out[4])
{
    out[0] = t->stride[0], out[1] = t->stride[2], out[2] = t->stride[1], out[3] = t->stride[3];
}

static int same_key(const plan_key *a, const plan_key *b)
{
    return memcmp(a, b, sizeof *a) == 0; /* keys are memset before filling */
}

/* The plan for key: from the cache, or built now (under the lock). */
static sdpa_status get_plan(const plan_key *key, plan_entry **out)
{
    pthread_mutex_lock(&plan_lock);
    plan_entry *victim = NULL;
    for (int i = 0; i < PLAN_SLOTS; i++) {
        if (plans[i].used && same_key(&plans[i].key, key)) {
            plans[i].last_use = ++plan_clock;
            plans[i].users++;
            *out = &plans[i];
            pthread_mutex_unlock(&plan_lock);
            return SDPA_OK;
        }
        if (plans[i].users == 0 &&
            (!victim || (victim->used && (!plans[i].used || plans[i].last_use < victim->last_use))))
            victim = &plans[i];
    }
    if (!victim) {
        pthread_mutex_unlock(&plan_lock);
        *out = NULL;
        return sdpa_cuda__host->fail(SDPA_OUT_OF_MEMORY,
                                     "cuda.cudnn: all %d cached plans are executing on other "
                                     "threads; none can be replaced",
                                     PLAN_SLOTS);
    }
    if (victim->used) { /* evict the least recently used plan */
        cudnnBackendDestroyDescriptor(victim->plan);
        cudnnBackendDestroyDescriptor(victim->cfg);
        sdpa_cudnn_graph_free(&victim->graph);
        victim->used = 0;
    }
    const char *where = "";
    sdpa_status result = SDPA_OK;
    cudnnStatus_t st = sdpa_cudnn_graph_build(&key->p, &victim->graph, &where);
    cudnnBackendDescriptor_t dev = NULL, cfgs[8];
    int n = 0;
    if (st == CUDNN_STATUS_SUCCESS) {
        const char *step = "";
        st = sdpa_cudnn_devprop_device(key->device, &dev, &step);
        where = st == CUDNN_STATUS_SUCCESS ? "" : step;
    }
    if (st == CUDNN_STATUS_SUCCESS) {
        st = sdpa_cudnn_engine_configs(&victim->graph, dev, cfgs, 8, &n);
        where = "heuristics";
    }
    if (st != CUDNN_STATUS_SUCCESS) {
        result = fail_cudnn(st, 0, where);
    } else if (n == 0) {
        result = sdpa_cuda__host->fail(SDPA_UNSUPPORTED,
                                       "cuda.cudnn: no engine configuration for this shape "
                                       "(cuDNN's support checks rejected all)");
    } else {
        /* The first configuration that builds wins; the others are freed. */
        cudnnStatus_t last = CUDNN_STATUS_SUCCESS;
        for (int i = 0; i < n; i++) {
            if (victim->used) {
                cudnnBackendDestroyDescriptor(cfgs[i]);
                continue;
            }
            cudnnBackendDescriptor_t plan;
            int64_t ws = 0;
            last = sdpa_cudnn_build_plan(cfgs[i], dev, handle, &plan, &ws);
            if (last == CUDNN_STATUS_SUCCESS) {
                victim->used = 1, victim->users = 1, victim->plan = plan, victim->cfg = cfgs[i];
                victim->workspace = ws, victim->key = *key;
                victim->last_use = ++plan_clock;
            } else {
                cudnnBackendDestroyDescriptor(cfgs[i]);
                if (last == CUDNN_STATUS_ALLOC_FAILED || (int)last == 4004)
                    break; /* out of memory is not "try another engine" */
            }
        }
        if (!victim->used)
            result = fail_cudnn(last, 0, "building the execution plan");
    }
    if (dev)
        cudnnBackendDestroyDescriptor(dev);
    if (!victim->used)
        sdpa_cudnn_graph_free(&victim->graph);
    *out = victim->used ? victim : NULL;
    pthread_mutex_unlock(&plan_lock);
    return result;
}

static void release_plan(plan_entry *e)
{
    pthread_mutex_lock(&plan_lock);
    e->users--;
    pthread_mutex_unlock(&plan_lock);
}

/*
 * What the plan cache and the execution share: the checks cuDNN needs
 * beyond the capability table, the calling thread's handle for the
 * tensors' device on the caller's stream, and the plan for this call.
 */
static sdpa_status plan_for_call(const sdpa_cuda_call *c, plan_entry **e)
{
    const sdpa_call_desc *d = &c->desc;
    const sdpa_tensor *t[4] = {c->q, c->k, c->v, c->out};
    static const char *names[4] = {"q", "k", "v", "out"};
    if (c->out->dtype != c->q->dtype)
        return sdpa_cuda__host->fail(SDPA_UNSUPPORTED,
                                     "cuda.cudnn: out must have the input dtype (%d), got %d",
                                     (int)c->q->dtype, (int)c->out->dtype);
    static const char *dims[3] = {"batch", "sequence", "head"};
    for (int i = 0; i < 4; i++) {
        if (t[i]->stride[3] != 1)
            return sdpa_cuda__host->fail(SDPA_UNSUPPORTED,
                                         "cuda.cudnn: %s needs unit stride along D", names[i]);
        if ((uintptr_t)t[i]->data % 16 != 0)
            return sdpa_cuda__host->fail(SDPA_UNSUPPORTED,
                                         "cuda.cudnn: %s is not 16-byte aligned", names[i]);
        /* The graph tells cuDNN every row starts 16-byte aligned, so every
         * stride must keep it (a head stride of 67 elements would not). */
        const int64_t es = t[i]->dtype == SDPA_F32 ? 4 : 2;
        for (int k = 0; k < 3; k++)
            if (t[i]->size[k] > 1 && (t[i]->stride[k] * es) % 16 != 0)
                return sdpa_cuda__host->fail(
                    SDPA_UNSUPPORTED,
                    "cuda.cudnn: %s's %s stride is %lld bytes, not a multiple of 16 (its rows "
                    "must stay 16-byte aligned)",
                    names[i], dims[k], (long long)(t[i]->stride[k] * es));
    }
    if (c->lse && (uintptr_t)c->lse % 16 != 0)
        return sdpa_cuda__host->fail(SDPA_UNSUPPORTED, "cuda.cudnn: lse is not 16-byte aligned");
    /* Bottom-right causal with Sq > Skv is refused by the declared
     * check (src/dispatch/cuda_declared.c), so explain and the dispatcher know it. */
    const int device = c->q->device.ordinal;
    cudaError_t ce = cudaSetDevice(device);
    if (ce != cudaSuccess)
        return sdpa_cuda__host->fail(SDPA_DEVICE_ERROR, "cuda.cudnn: cudaSetDevice(%d): %s",
                                     device, cudaGetErrorString(ce));
    cudnnStatus_t st;
    if (device < 0 || device >= HANDLE_DEVICES)
        return sdpa_cuda__host->fail(SDPA_UNSUPPORTED,
                                     "cuda.cudnn: device %d, expected one of the first %d",
                                     device, HANDLE_DEVICES);
    if (!handles[device] && (st = cudnnCreate(&handles[device])) != CUDNN_STATUS_SUCCESS) {
        handles[device] = NULL;
        return fail_cudnn(st, 0, "cudnnCreate");
    }
    handle = handles[device];
    if ((st = cudnnSetStream(handle, (cudaStream_t)c->stream)) != CUDNN_STATUS_SUCCESS)
        return fail_cudnn(st, 1, "cudnnSetStream");

    plan_key key;
    memset(&key, 0, sizeof key);
    key.device = device;
    sdpa_cudnn_problem *p = &key.p;
    p->b = d->B, p->hq = d->Hq, p->hk = d->Hkv, p->sq = d->Sq, p->skv = d->Skv, p->d = d->D;
    bhsd(c->q, p->q_stride), bhsd(c->k, p->k_stride), bhsd(c->v, p->v_stride);
    bhsd(c->out, p->o_stride);
    p->io_type = c->q->dtype == SDPA_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
    p->causal = (int)c->causal;
    p->want_stats = c->lse != NULL;
    p->padding = c->mask && (c->mask->seq_len_q || c->mask->seq_len_kv);
    if (p->padding) {
#ifndef SDPA_HAVE_CUDA_KERNELS
        return sdpa_cuda__host->fail(SDPA_UNSUPPORTED,
                                     "cuda.cudnn: this plugin was built without CUDA C kernels "
                                     "(no nvcc), and the padding mask needs mask_rows.cu");
#endif
        sdpa_status s = sdpa_cuda__check_mask_arrays("cuda.cudnn", c, device);
        if (s != SDPA_OK)
            return s;
    }
    return get_plan(&key, e);
}

/* The calling thread's workspace on the plan's device, grown to the plan's
 * need (on one device it never shrinks). */
static sdpa_status grow_workspace(const plan_entry *e)
{
    if (workspace_device == e->key.device && (size_t)e->workspace <= workspace_size)
        return SDPA_OK;
    if (workspace)
        cudaFree(workspace); /* any device may free: unified addressing */
    workspace = NULL, workspace_size = 0, workspace_device = -1;
    cudaError_t ce = cudaMalloc(&workspace, (size_t)e->workspace);
    if (ce != cudaSuccess)
        return sdpa_cuda__host->fail(
            ce == cudaErrorMemoryAllocation ? SDPA_OUT_OF_MEMORY : SDPA_DEVICE_ERROR,
            "cuda.cudnn: workspace of %lld bytes: %s", (long long)e->workspace,
            cudaGetErrorString(ce));
    workspace_size = (size_t)e->workspace;
    workspace_device = e->key.device;
    return SDPA_OK;
}

sdpa_status sdpa_cuda__cudnn_prepare(const sdpa_cuda_call *c);
sdpa_status sdpa_cuda__cudnn_run(const sdpa_cuda_call *c);

/* Warm-up: the plan compiled and cached, this thread's workspace sized. */
sdpa_status sdpa_cuda__cudnn_prepare(const sdpa_cuda_call *c)
{
    plan_entry *e;
    sdpa_status s = plan_for_call(c, &e);
    if (s != SDPA_OK)
        return s;
    s = grow_workspace(e);
    release_plan(e);
    return s;
}

sdpa_status sdpa_cuda__cudnn_run(const sdpa_cuda_call *c)
{
    const sdpa_call_desc *d = &c->desc;
    plan_entry *e;
    sdpa_status s = plan_for_call(c, &e);
    if (s != SDPA_OK)
        return s;
    if ((s = grow_workspace(e)) != SDPA_OK) {
        release_plan(e);
        return s;
    }
    cudnnStatus_t st;
    float scale = (float)c->scale, fill = -INFINITY;
    int32_t offset = (int32_t)(d->Skv - d->Sq);
    const int padding = e->key.p.padding;
    const int32_t *lens[2] = {NULL, NULL};
    if (padding) { /* both sides: the caller's arrays, or full lengths */
        const int32_t *given[2] = {c->mask->seq_len_q, c->mask->seq_len_kv};
        const int64_t full[2] = {d->Sq, d->Skv};
        for (int side = 0; side < 2 && s == SDPA_OK; side++)
            s = given[side] ? (lens[side] = given[side], SDPA_OK)
                            : full_lengths_get(side, e->key.device, d->B, (int32_t)full[side],
                                               &lens[side]);
        if (s != SDPA_OK) {
            release_plan(e);
            return s;
        }
    }
    int64_t uids[12];
    void *ptrs[12];
    int n = 0;
    uids[n] = SDPA_UID_Q, ptrs[n++] = c->q->data;
    uids[n] = SDPA_UID_K, ptrs[n++] = c->k->data;
    uids[n] = SDPA_UID_V, ptrs[n++] = c->v->data;
    uids[n] = SDPA_UID_O, ptrs[n++] = c->out->data;
    uids[n] = SDPA_UID_SCALE, ptrs[n++] = &scale;
    if (c->lse)
        uids[n] = SDPA_UID_STATS, ptrs[n++] = c->lse;
    if (c->causal != SDPA_CAUSAL_NONE || padding)
        uids[n] = SDPA_UID_FILL, ptrs[n++] = &fill;
    if (c->causal == SDPA_CAUSAL_BOTTOM_RIGHT && d->Skv != d->Sq && !padding)
        uids[n] = SDPA_UID_OFFSET, ptrs[n++] = &offset;
    if (padding) {
        uids[n] = SDPA_UID_SEQ_LEN_Q, ptrs[n++] = (void *)lens[0];
        uids[n] = SDPA_UID_SEQ_LEN_KV, ptrs[n++] = (void *)lens[1];
    }
    cudnnBackendDescriptor_t pack;
    if ((st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack)) !=
        CUDNN_STATUS_SUCCESS) {
        release_plan(e);
        return fail_cudnn(st, 0, "variant pack");
    }
    st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n,
                                  uids);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                      CUDNN_TYPE_VOID_PTR, n, ptrs);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR,
                                      1, &workspace);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendFinalize(pack);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendExecute(handle, e->plan, pack);
    cudnnBackendDestroyDescriptor(pack);
    release_plan(e);
    if (st != CUDNN_STATUS_SUCCESS)
        return fail_cudnn(st, 1, "execute");
#ifdef SDPA_HAVE_CUDA_KERNELS
    if (padding) { /* rows past seq_len_q and rows that see no key */
        cudaError_t ce = sdpa_cuda__zero_unseen_rows(c);
        if (ce != cudaSuccess)
            return sdpa_cuda__host->fail(SDPA_DEVICE_ERROR, "cuda.cudnn: zeroing unseen rows: %s",
                                         cudaGetErrorString(ce));
    }
#endif
    return SDPA_OK;
}
