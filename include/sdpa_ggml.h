/*
 * sdpa_ggml.h - libsdpa as a ggml operator (header only; include ggml.h
 * first or let this include it). Nothing of ggml is in libsdpa's build:
 * this header is compiled by the program that has ggml.
 *
 *   sdpa_ggml_tensor(t, order, &view)   a ggml tensor (ne[], nb[], F32,
 *                                       F16 or BF16) as an sdpa_tensor
 *   sdpa_ggml_attention(g, q, k, v, &op)
 *                                       a graph node in place of
 *                                       ggml_flash_attn_ext(g, q, k, v,
 *                                       NULL, scale, 0, 0): q [D, Sq, Hq, B],
 *                                       k, v [D, Skv, Hkv, B] (any views of
 *                                       them, with op.q_order/kv_order
 *                                       saying their axes), the result
 *                                       [D, Hq, Sq, B] float32 as
 *                                       ggml_flash_attn_ext's
 *
 * The node runs on ggml's own threads: each of its nth threads calls
 * sdpa_forward_share(ctx, ith, nth, ...) and computes its share; libsdpa
 * starts no thread and no share waits on another. Q in f32 with K and V in
 * f16 (stable-diffusion.cpp's flash-attention call) is a mixed call that
 * the CPU kernels convert while packing: no ggml_cast of K and V needed.
 * A failure (a backend that cannot take the shape) cannot be returned
 * through ggml: the first is kept in op.status, and the node's output is
 * then not to be used.
 */
#ifndef SDPA_GGML_H
#define SDPA_GGML_H

#include "ggml.h"
#include "sdpa.h"

/* C and C++ (stable-diffusion.cpp and llama.cpp are C++): no _Atomic, the
 * GCC/Clang __atomic builtins on a plain int instead. */

/* ggml's element type as an sdpa_dtype; 0 when libsdpa has no such dtype. */
static inline int sdpa_ggml_dtype(enum ggml_type type, sdpa_dtype *out)
{
    switch (type) {
    case GGML_TYPE_F32: *out = SDPA_F32; return 1;
    case GGML_TYPE_F16: *out = SDPA_F16; return 1;
    case GGML_TYPE_BF16: *out = SDPA_BF16; return 1;
    default: return 0;
    }
}

/* A ggml tensor as an sdpa_tensor; order names its axes innermost first
 * (sdpa_tensor_from_bytes: "dshb" for ggml_flash_attn_ext's q, k, v). */
static inline sdpa_status sdpa_ggml_tensor(const struct ggml_tensor *t, const char *order,
                                           sdpa_tensor *out)
{
    sdpa_dtype dt;
    if (!t || !sdpa_ggml_dtype(t->type, &dt))
        return SDPA_INVALID_ARGUMENT; /* sdpa_tensor_from_bytes names the rest */
    const int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
    const size_t nb[4] = {t->nb[0], t->nb[1], t->nb[2], t->nb[3]};
    return sdpa_tensor_from_bytes(t->data, dt, ne, nb, order, out);
}

/* What the node computes with; lives as long as the graph. */
typedef struct sdpa_ggml_op {
    sdpa_context *ctx;       /* required */
    sdpa_params params;      /* scale (0: 1/sqrt(D)), causal, mask, backend, ... */
    const char *q_order;     /* NULL: "dshb" */
    const char *kv_order;    /* NULL: "dshb" */
    int status;              /* SDPA_OK, or the first share's failure (read it
                              * after the graph computed) */
} sdpa_ggml_op;

static inline void sdpa_ggml_op_init(sdpa_ggml_op *op, sdpa_context *ctx, float scale)
{
    const sdpa_params defaults = SDPA_PARAMS_DEFAULT;
    op->ctx = ctx, op->params = defaults, op->params.scale = scale;
    op->q_order = op->kv_order = NULL;
    __atomic_store_n(&op->status, (int)SDPA_OK, __ATOMIC_RELAXED);
}

/* ggml's custom operator: thread ith of nth computes its share. */
static inline void sdpa_ggml_attention_op(struct ggml_tensor *dst, int ith, int nth, void *userdata)
{
    sdpa_ggml_op *op = (sdpa_ggml_op *)userdata;
    const char *qo = op->q_order ? op->q_order : "dshb";
    const char *kvo = op->kv_order ? op->kv_order : "dshb";
    sdpa_tensor q, k, v, out;
    sdpa_status st = sdpa_ggml_tensor(dst->src[0], qo, &q);
    if (st == SDPA_OK)
        st = sdpa_ggml_tensor(dst->src[1], kvo, &k);
    if (st == SDPA_OK)
        st = sdpa_ggml_tensor(dst->src[2], kvo, &v);
    if (st == SDPA_OK)
        st = sdpa_ggml_tensor(dst, "dhsb", &out);
    if (st == SDPA_OK)
        st = sdpa_forward_share(op->ctx, ith, nth, &q, &k, &v, &out, NULL, &op->params);
    if (st != SDPA_OK) {
        int ok = SDPA_OK;
        __atomic_compare_exchange_n(&op->status, &ok, (int)st, 0, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED);
    }
}

/* The node: [D, Hq, Sq, B] float32, on every thread ggml computes with. */
static inline struct ggml_tensor *sdpa_ggml_attention(struct ggml_context *g, struct ggml_tensor *q,
                                                      struct ggml_tensor *k, struct ggml_tensor *v,
                                                      sdpa_ggml_op *op)
{
    /* the sizes from q's view: D, Sq, Hq, B wherever its order puts them */
    const char *qo = op->q_order ? op->q_order : "dshb";
    int64_t D = 1, S = 1, H = 1, B = 1;
    for (int i = 0; i < 4 && qo[i]; i++) {
        int64_t *dim = qo[i] == 'd' ? &D : qo[i] == 's' ? &S : qo[i] == 'h' ? &H : &B;
        *dim = q->ne[i];
    }
    struct ggml_tensor *args[3] = {q, k, v};
    return ggml_custom_4d(g, GGML_TYPE_F32, D, H, S, B, args, 3, sdpa_ggml_attention_op,
                          GGML_N_TASKS_MAX, op);
}

#endif
