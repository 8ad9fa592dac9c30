/*
 * cudnn_graph.h - cuDNN's fused attention (SDPA forward) as an operation
 * graph built through cuDNN's C backend API, without the C++ frontend.
 * Used by the plugin's cuda.cudnn backend and, without any GPU, by the test
 * that asks cuDNN's heuristics whether our graph is one it can run.
 */
#ifndef SDPA_CUDNN_GRAPH_H
#define SDPA_CUDNN_GRAPH_H

#include "sdpa.h"

#include <cudnn.h>
#include <stdint.h>

/* Unique ids of the graph's real (non-virtual) tensors: variant-pack keys. */
enum {
    SDPA_UID_Q = 1, SDPA_UID_K, SDPA_UID_V, SDPA_UID_O, SDPA_UID_STATS,
    SDPA_UID_SCALE,  /* float, by value                               */
    SDPA_UID_OFFSET, /* int32 Skv - Sq, by value (bottom-right causal) */
    SDPA_UID_FILL,   /* float -inf, by value (causal and padding fill) */
    SDPA_UID_SEQ_LEN_Q,  /* int32 [b], device (padding mask)           */
    SDPA_UID_SEQ_LEN_KV
};

typedef struct sdpa_cudnn_problem {
    int64_t b, hq, hk, sq, skv, d;
    int64_t q_stride[4], k_stride[4], v_stride[4], o_stride[4]; /* [b, h, s, d] order */
    cudnnDataType_t io_type;  /* CUDNN_DATA_HALF or CUDNN_DATA_BFLOAT16 */
    int causal;               /* 0 none, 1 top-left, 2 bottom-right */
    int want_stats;           /* LSE as a real output */
    int padding;              /* cuDNN's padding mask: seq_len_q and seq_len_kv
                               * [b] tensors; causal then aligns on them */
} sdpa_cudnn_problem;

typedef struct sdpa_cudnn_graph {
    cudnnBackendDescriptor_t graph;
    cudnnBackendDescriptor_t objs[128]; /* every descriptor made, for release */
    int n_objs;
} sdpa_cudnn_graph;

/*
 * The composite "flash fprop" graph: bmm1, scale, [padding mask], [causal
 * mask], max, sub, exp, sum, log, add (stats), div, bmm2. With padding the
 * two products are bounded by the lengths (M/N/K overrides), so rows past
 * seq_len_q are not written: the caller zeroes them. Returns
 * CUDNN_STATUS_SUCCESS or the first failing status; *where names the step
 * that failed.
 */
cudnnStatus_t sdpa_cudnn_graph_build(const sdpa_cudnn_problem *p, sdpa_cudnn_graph *g,
                                     const char **where);
void sdpa_cudnn_graph_free(sdpa_cudnn_graph *g);

/*
 * Engine configurations cuDNN's heuristics offer for the graph (mode A,
 * then FALLBACK if A has none), for the device described by devprop (a
 * DEVICEPROP descriptor; NULL: the current device). cfgs may be NULL.
 */
cudnnStatus_t sdpa_cudnn_engine_configs(sdpa_cudnn_graph *g, cudnnBackendDescriptor_t devprop,
                                        cudnnBackendDescriptor_t *cfgs, int max_cfgs,
                                        int *n_cfgs);

/*
 * An execution plan from one engine configuration (finalizing compiles the
 * kernel): with a handle, bound to it and its device, ready to execute;
 * without one (NULL), for the device devprop describes, ahead of time (no
 * GPU needed; not executable as it is). Its workspace size in *workspace.
 * On failure nothing is left allocated.
 */
cudnnStatus_t sdpa_cudnn_build_plan(cudnnBackendDescriptor_t cfg, cudnnBackendDescriptor_t devprop,
                                    cudnnHandle_t handle, cudnnBackendDescriptor_t *plan,
                                    int64_t *workspace);

/*
 * What a cuDNN status means for the dispatcher (shared/notes/cudnn-backend-
 * sdpa.md, section 6): environment missing -> NOT_AVAILABLE; this shape or
 * configuration unsupported -> UNSUPPORTED (the layer latches); host or
 * device allocation -> OUT_OF_MEMORY; BAD_PARAM -> INTERNAL (our bug);
 * failures while executing -> DEVICE_ERROR. While building (executing = 0),
 * compilation and internal failures mean "not this configuration", except
 * an execution-category failure whose detail (cudnnGetLastErrorString)
 * carries CUDA error 2, a driver out-of-memory hidden in module loading.
 */
sdpa_status sdpa_cudnn_status_map(int code, int executing, const char *detail);

/* A DEVICEPROP descriptor from a JSON description (for machines without the GPU). */
cudnnStatus_t sdpa_cudnn_devprop_json(const char *json, cudnnBackendDescriptor_t *out);

/*
 * A DEVICEPROP descriptor of CUDA device `device` (what cuda.cudnn's plans
 * are finalized for); *where names the step that failed. On failure
 * nothing is left allocated.
 */
cudnnStatus_t sdpa_cudnn_devprop_device(int device, cudnnBackendDescriptor_t *out,
                                        const char **where);

/* BSHD strides for a [b, s, h, d] buffer, in the graph's [b, h, s, d] order. */
void sdpa_cudnn_bshd_strides(int64_t s, int64_t h, int64_t d, int64_t stride[4]);

#endif
