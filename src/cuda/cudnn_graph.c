/*
 * cudnn_graph.c - see cudnn_graph.h. The recipe, its limits and the status
 * codes are in shared/notes/cudnn-backend-sdpa.md; the points that cost
 * engines when missed: the stats ops (log, add) are mandatory even when
 * the LSE is not wanted (then virtual); P feeding bmm2 is in the I/O type;
 * every tensor gets a distinct uid and 16-byte alignment.
 */
#include "cudnn_graph.h"

#include <stdbool.h>
#include <string.h>

#define TRY(step, call)                                                                            \
    do {                                                                                           \
        cudnnStatus_t st_ = (call);                                                                \
        if (st_ != CUDNN_STATUS_SUCCESS) {                                                         \
            if (where)                                                                             \
                *where = step;                                                                     \
            return st_;                                                                            \
        }                                                                                          \
    } while (0)

void sdpa_cudnn_bshd_strides(int64_t s, int64_t h, int64_t d, int64_t stride[4])
{
    stride[0] = s * h * d, stride[1] = d, stride[2] = h * d, stride[3] = 1;
}

static cudnnStatus_t keep(sdpa_cudnn_graph *g, cudnnBackendDescriptorType_t type,
                          cudnnBackendDescriptor_t *out)
{
    if (g->n_objs == (int)(sizeof g->objs / sizeof *g->objs))
        return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t st = cudnnBackendCreateDescriptor(type, out);
    if (st == CUDNN_STATUS_SUCCESS)
        g->objs[g->n_objs++] = *out;
    return st;
}

static cudnnStatus_t tensor(sdpa_cudnn_graph *g, int64_t uid, cudnnDataType_t type,
                            const int64_t dims[4], const int64_t strides[4], bool is_virtual,
                            bool by_value, cudnnBackendDescriptor_t *out)
{
    const char **where = NULL;
    const int64_t align = 16;
    TRY("tensor", keep(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, out));
    TRY("tensor", cudnnBackendSetAttribute(*out, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE,
                                           1, &type));
    TRY("tensor", cudnnBackendSetAttribute(*out, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4,
                                           dims));
    TRY("tensor", cudnnBackendSetAttribute(*out, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4,
                                           strides));
    TRY("tensor", cudnnBackendSetAttribute(*out, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1,
                                           &uid));
    TRY("tensor", cudnnBackendSetAttribute(*out, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT,
                                           CUDNN_TYPE_INT64, 1, &align));
    TRY("tensor", cudnnBackendSetAttribute(*out, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN,
                                           1, &is_virtual));
    if (by_value)
        TRY("tensor", cudnnBackendSetAttribute(*out, CUDNN_ATTR_TENSOR_IS_BY_VALUE,
                                               CUDNN_TYPE_BOOLEAN, 1, &by_value));
    return cudnnBackendFinalize(*out);
}

/* c = a b; with overrides (padding), the GEMM's M, N and K are bounded per
 * batch entry by int32 [b] tensors (NULL: the full size). */
static cudnnStatus_t matmul(sdpa_cudnn_graph *g, cudnnBackendDescriptor_t a,
                            cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c,
                            cudnnBackendDescriptor_t m_over, cudnnBackendDescriptor_t n_over,
                            cudnnBackendDescriptor_t k_over, cudnnBackendDescriptor_t *op)
{
    const char **where = NULL;
    cudnnBackendDescriptor_t desc;
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    TRY("matmul", keep(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, &desc));
    TRY("matmul", cudnnBackendSetAttribute(desc, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE,
                                           1, &comp));
    TRY("matmul", cudnnBackendFinalize(desc));
    TRY("matmul", keep(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, op));
    TRY("matmul", cudnnBackendSetAttribute(*op, CUDNN_ATTR_OPERATION_MATMUL_ADESC,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a));
    TRY("matmul", cudnnBackendSetAttribute(*op, CUDNN_ATTR_OPERATION_MATMUL_BDESC,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b));
    TRY("matmul", cudnnBackendSetAttribute(*op, CUDNN_ATTR_OPERATION_MATMUL_CDESC,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c));
    TRY("matmul", cudnnBackendSetAttribute(*op, CUDNN_ATTR_OPERATION_MATMUL_DESC,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &desc));
    if (m_over)
        TRY("matmul", cudnnBackendSetAttribute(*op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC,
                                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m_over));
    if (n_over)
        TRY("matmul", cudnnBackendSetAttribute(*op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC,
                                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n_over));
    if (k_over)
        TRY("matmul", cudnnBackendSetAttribute(*op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC,
                                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &k_over));
    return cudnnBackendFinalize(*op);
}

/* y = mode(x[, b][, t]); axis >= 0 for GEN_INDEX. */
static cudnnStatus_t pointwise(sdpa_cudnn_graph *g, cudnnPointwiseMode_t mode,
                               cudnnDataType_t prec, int64_t axis, cudnnBackendDescriptor_t x,
                               cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t,
                               cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t *op)
{
    const char **where = NULL;
    cudnnBackendDescriptor_t desc;
    TRY("pointwise", keep(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, &desc));
    TRY("pointwise", cudnnBackendSetAttribute(desc, CUDNN_ATTR_POINTWISE_MODE,
                                              CUDNN_TYPE_POINTWISE_MODE, 1, &mode));
    TRY("pointwise", cudnnBackendSetAttribute(desc, CUDNN_ATTR_POINTWISE_MATH_PREC,
                                              CUDNN_TYPE_DATA_TYPE, 1, &prec));
    if (axis >= 0)
        TRY("pointwise", cudnnBackendSetAttribute(desc, CUDNN_ATTR_POINTWISE_AXIS,
                                                  CUDNN_TYPE_INT64, 1, &axis));
    TRY("pointwise", cudnnBackendFinalize(desc));
    TRY("pointwise", keep(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, op));
    TRY("pointwise", cudnnBackendSetAttribute(*op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &desc));
    TRY("pointwise", cudnnBackendSetAttribute(*op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
    if (b)
        TRY("pointwise", cudnnBackendSetAttribute(*op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b));
    if (t)
        TRY("pointwise", cudnnBackendSetAttribute(*op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t));
    TRY("pointwise", cudnnBackendSetAttribute(*op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
    return cudnnBackendFinalize(*op);
}

static cudnnStatus_t reduction(sdpa_cudnn_graph *g, cudnnReduceTensorOp_t mode,
                               cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y,
                               cudnnBackendDescriptor_t *op)
{
    const char **where = NULL;
    cudnnBackendDescriptor_t desc;
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    TRY("reduction", keep(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, &desc));
    TRY("reduction", cudnnBackendSetAttribute(desc, CUDNN_ATTR_REDUCTION_OPERATOR,
                                              CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode));
    TRY("reduction", cudnnBackendSetAttribute(desc, CUDNN_ATTR_REDUCTION_COMP_TYPE,
                                              CUDNN_TYPE_DATA_TYPE, 1, &comp));
    TRY("reduction", cudnnBackendFinalize(desc));
    TRY("reduction", keep(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, op));
    TRY("reduction", cudnnBackendSetAttribute(*op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
    TRY("reduction", cudnnBackendSetAttribute(*op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
    TRY("reduction", cudnnBackendSetAttribute(*op, CUDNN_ATTR_OPERATION_REDUCTION_DESC,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &desc));
    return cudnnBackendFinalize(*op);
}

cudnnStatus_t sdpa_cudnn_graph_build(const sdpa_cudnn_problem *p, sdpa_cudnn_graph *g,
                                     const char **where)
{
    memset(g, 0, sizeof *g);
    const cudnnDataType_t F = CUDNN_DATA_FLOAT;
    const int64_t qd[4] = {p->b, p->hq, p->sq, p->d}, kd[4] = {p->b, p->hk, p->d, p->skv};
    const int64_t vd[4] = {p->b, p->hk, p->skv, p->d};
    /* K^T: K's last two dimensions and strides swapped. */
    const int64_t kts[4] = {p->k_stride[0], p->k_stride[1], p->k_stride[3], p->k_stride[2]};
    const int64_t sd[4] = {p->b, p->hq, p->sq, p->skv};
    const int64_t ss[4] = {p->hq * p->sq * p->skv, p->sq * p->skv, p->skv, 1};
    const int64_t rd[4] = {p->b, p->hq, p->sq, 1}, rs[4] = {p->hq * p->sq, p->sq, 1, 1};
    const int64_t one[4] = {1, 1, 1, 1}, bd[4] = {p->b, 1, 1, 1};
    int64_t uid = 100; /* virtual tensors */
    cudnnBackendDescriptor_t Q, K, V, O, stats, scale, S, S1, Sm, mx, Sd, E, sum, lg, P;
    cudnnBackendDescriptor_t lq = NULL, lkv = NULL, fill = NULL;
    cudnnBackendDescriptor_t ops[32];
    int n = 0;
    TRY("Q", tensor(g, SDPA_UID_Q, p->io_type, qd, p->q_stride, false, false, &Q));
    TRY("K^T", tensor(g, SDPA_UID_K, p->io_type, kd, kts, false, false, &K));
    TRY("V", tensor(g, SDPA_UID_V, p->io_type, vd, p->v_stride, false, false, &V));
    TRY("O", tensor(g, SDPA_UID_O, p->io_type, qd, p->o_stride, false, false, &O));
    TRY("Stats", tensor(g, SDPA_UID_STATS, F, rd, rs, !p->want_stats, false, &stats));
    TRY("scale", tensor(g, SDPA_UID_SCALE, F, one, one, false, true, &scale));
    if (p->padding) {
        TRY("seq_len_q", tensor(g, SDPA_UID_SEQ_LEN_Q, CUDNN_DATA_INT32, bd, one, false, false,
                                &lq));
        TRY("seq_len_kv", tensor(g, SDPA_UID_SEQ_LEN_KV, CUDNN_DATA_INT32, bd, one, false, false,
                                 &lkv));
    }
    if (p->padding || p->causal)
        TRY("fill", tensor(g, SDPA_UID_FILL, F, one, one, false, true, &fill));
    TRY("S", tensor(g, uid++, F, sd, ss, true, false, &S));
    TRY("bmm1", matmul(g, Q, K, S, lq, lkv, NULL, &ops[n++]));
    TRY("S*scale", tensor(g, uid++, F, sd, ss, true, false, &S1));
    TRY("scale op", pointwise(g, CUDNN_POINTWISE_MUL, F, -1, S, scale, NULL, S1, &ops[n++]));
    Sm = S1;
    if (p->padding) {
        /* keep row < seq_len_q[b] and col < seq_len_kv[b], else -inf */
        cudnnBackendDescriptor_t row, col, in_q, in_kv, keep, Sp;
        TRY("pad row", tensor(g, uid++, CUDNN_DATA_INT32, sd, ss, true, false, &row));
        TRY("gen pad row", pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, 2, Sm, NULL,
                                     NULL, row, &ops[n++]));
        TRY("pad col", tensor(g, uid++, CUDNN_DATA_INT32, sd, ss, true, false, &col));
        TRY("gen pad col", pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, 3, Sm, NULL,
                                     NULL, col, &ops[n++]));
        TRY("row < len_q", tensor(g, uid++, CUDNN_DATA_BOOLEAN, sd, ss, true, false, &in_q));
        TRY("cmp len_q", pointwise(g, CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, -1, row, lq,
                                   NULL, in_q, &ops[n++]));
        TRY("col < len_kv", tensor(g, uid++, CUDNN_DATA_BOOLEAN, sd, ss, true, false, &in_kv));
        TRY("cmp len_kv", pointwise(g, CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, -1, col, lkv,
                                    NULL, in_kv, &ops[n++]));
        TRY("pad keep", tensor(g, uid++, CUDNN_DATA_BOOLEAN, sd, ss, true, false, &keep));
        TRY("and", pointwise(g, CUDNN_POINTWISE_LOGICAL_AND, CUDNN_DATA_BOOLEAN, -1, in_q, in_kv,
                             NULL, keep, &ops[n++]));
        TRY("S padded", tensor(g, uid++, F, sd, ss, true, false, &Sp));
        TRY("pad select", pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, F, -1, Sm, fill, keep, Sp,
                                    &ops[n++]));
        Sm = Sp;
    }
    if (p->causal) {
        /* keep (row + offset) >= col, else -inf */
        cudnnBackendDescriptor_t row, col, mask, Sc;
        TRY("row index", tensor(g, uid++, CUDNN_DATA_INT32, sd, ss, true, false, &row));
        TRY("gen row", pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, 2, Sm, NULL,
                                 NULL, row, &ops[n++]));
        TRY("col index", tensor(g, uid++, CUDNN_DATA_INT32, sd, ss, true, false, &col));
        TRY("gen col", pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, 3, Sm, NULL,
                                 NULL, col, &ops[n++]));
        if (p->causal == SDPA_CAUSAL_BOTTOM_RIGHT && p->padding) { /* row + seq_len_kv[b] - seq_len_q[b] */
            cudnnBackendDescriptor_t row2, row3;
            TRY("row+len_kv", tensor(g, uid++, CUDNN_DATA_INT32, sd, ss, true, false, &row2));
            TRY("add len_kv", pointwise(g, CUDNN_POINTWISE_ADD, CUDNN_DATA_INT32, -1, row, lkv,
                                        NULL, row2, &ops[n++]));
            TRY("row+len_kv-len_q", tensor(g, uid++, CUDNN_DATA_INT32, sd, ss, true, false,
                                           &row3));
            TRY("sub len_q", pointwise(g, CUDNN_POINTWISE_SUB, CUDNN_DATA_INT32, -1, row2, lq,
                                       NULL, row3, &ops[n++]));
            row = row3;
        } else if (p->causal == SDPA_CAUSAL_BOTTOM_RIGHT && p->skv != p->sq) {
            cudnnBackendDescriptor_t off, row2;
            TRY("offset", tensor(g, SDPA_UID_OFFSET, CUDNN_DATA_INT32, one, one, false, true,
                                 &off));
            TRY("row+offset", tensor(g, uid++, CUDNN_DATA_INT32, sd, ss, true, false, &row2));
            TRY("add offset", pointwise(g, CUDNN_POINTWISE_ADD, CUDNN_DATA_INT32, -1, row, off,
                                        NULL, row2, &ops[n++]));
            row = row2;
        }
        TRY("mask", tensor(g, uid++, CUDNN_DATA_BOOLEAN, sd, ss, true, false, &mask));
        TRY("cmp", pointwise(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, -1, row, col, NULL,
                             mask, &ops[n++]));
        TRY("S masked", tensor(g, uid++, F, sd, ss, true, false, &Sc));
        TRY("select", pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, F, -1, Sm, fill, mask, Sc,
                                &ops[n++]));
        Sm = Sc;
    }
    TRY("rowmax", tensor(g, uid++, F, rd, rs, true, false, &mx));
    TRY("max", reduction(g, CUDNN_REDUCE_TENSOR_MAX, Sm, mx, &ops[n++]));
    TRY("S-max", tensor(g, uid++, F, sd, ss, true, false, &Sd));
    TRY("sub", pointwise(g, CUDNN_POINTWISE_SUB, F, -1, Sm, mx, NULL, Sd, &ops[n++]));
    TRY("exp", tensor(g, uid++, F, sd, ss, true, false, &E));
    TRY("exp op", pointwise(g, CUDNN_POINTWISE_EXP, F, -1, Sd, NULL, NULL, E, &ops[n++]));
    TRY("rowsum", tensor(g, uid++, F, rd, rs, true, false, &sum));
    TRY("sum", reduction(g, CUDNN_REDUCE_TENSOR_ADD, E, sum, &ops[n++]));
    TRY("log", tensor(g, uid++, F, rd, rs, true, false, &lg));
    TRY("log op", pointwise(g, CUDNN_POINTWISE_LOG, F, -1, sum, NULL, NULL, lg, &ops[n++]));
    TRY("stats op", pointwise(g, CUDNN_POINTWISE_ADD, F, -1, mx, lg, NULL, stats, &ops[n++]));
    TRY("P", tensor(g, uid++, p->io_type, sd, ss, true, false, &P));
    TRY("div", pointwise(g, CUDNN_POINTWISE_DIV, F, -1, E, sum, NULL, P, &ops[n++]));
    TRY("bmm2", matmul(g, P, V, O, lq, NULL, lkv, &ops[n++]));
    TRY("graph", keep(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &g->graph));
    TRY("graph", cudnnBackendSetAttribute(g->graph, CUDNN_ATTR_OPERATIONGRAPH_OPS,
                                          CUDNN_TYPE_BACKEND_DESCRIPTOR, n, ops));
    TRY("graph finalize", cudnnBackendFinalize(g->graph));
    return CUDNN_STATUS_SUCCESS;
}

void sdpa_cudnn_graph_free(sdpa_cudnn_graph *g)
{
    for (int i = g->n_objs - 1; i >= 0; i--)
        cudnnBackendDestroyDescriptor(g->objs[i]);
    memset(g, 0, sizeof *g);
}

cudnnStatus_t sdpa_cudnn_build_plan(cudnnBackendDescriptor_t cfg, cudnnBackendDescriptor_t devprop,
                                    cudnnHandle_t handle, cudnnBackendDescriptor_t *plan,
                                    int64_t *workspace)
{
    *workspace = 0;
    cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, plan);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    st = cudnnBackendSetAttribute(*plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg);
    /* A plan that will execute is finalized with a handle, as every cuDNN
     * sample that executes does; the device properties alone build a plan
     * ahead of time (the tests, without a GPU) that must be bound to a
     * handle before it runs. */
    if (st == CUDNN_STATUS_SUCCESS && handle)
        st = cudnnBackendSetAttribute(*plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE,
                                      1, &handle);
    else if (st == CUDNN_STATUS_SUCCESS && devprop)
        st = cudnnBackendSetAttribute(*plan, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP,
                                      CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &devprop);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendFinalize(*plan);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendGetAttribute(*plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                      CUDNN_TYPE_INT64, 1, NULL, workspace);
    if (st != CUDNN_STATUS_SUCCESS) {
        cudnnBackendDestroyDescriptor(*plan);
        *plan = NULL;
    }
    return st;
}

cudnnStatus_t sdpa_cudnn_devprop_device(int device, cudnnBackendDescriptor_t *out,
                                        const char **where)
{
    *where = "creating the descriptor";
    cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, out);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    /* 32-bit: cuDNN 9.19 refuses INT64 here with status 2010 ("CUDNN_TYPE_INT32
     * != attrType"), which made every cuda.cudnn call fail before it ran */
    const int32_t id = device;
    *where = "the device id";
    st = cudnnBackendSetAttribute(*out, CUDNN_ATTR_DEVICEPROP_DEVICE_ID, CUDNN_TYPE_INT32, 1, &id);
    if (st == CUDNN_STATUS_SUCCESS) {
        *where = "finalizing (reads the device)";
        st = cudnnBackendFinalize(*out);
    }
    if (st != CUDNN_STATUS_SUCCESS) {
        cudnnBackendDestroyDescriptor(*out);
        *out = NULL;
    }
    return st;
}

cudnnStatus_t sdpa_cudnn_devprop_json(const char *json, cudnnBackendDescriptor_t *out)
{
    cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, out);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(*out, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION,
                                      CUDNN_TYPE_CHAR, (int64_t)strlen(json) + 1, json);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendFinalize(*out);
    return st;
}

cudnnStatus_t sdpa_cudnn_engine_configs(sdpa_cudnn_graph *g, cudnnBackendDescriptor_t devprop,
                                        cudnnBackendDescriptor_t *cfgs, int max_cfgs, int *n_cfgs)
{
    *n_cfgs = 0;
    const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    for (int m = 0; m < 2 && *n_cfgs == 0; m++) {
        cudnnBackendDescriptor_t heur;
        if ((st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur)) !=
            CUDNN_STATUS_SUCCESS)
            return st;
        st = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                      CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->graph);
        if (st == CUDNN_STATUS_SUCCESS)
            st = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE,
                                          1, &modes[m]);
        if (st == CUDNN_STATUS_SUCCESS && devprop)
            st = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP,
                                          CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &devprop);
        if (st == CUDNN_STATUS_SUCCESS)
            st = cudnnBackendFinalize(heur);
        int64_t candidates = 0;
        if (st == CUDNN_STATUS_SUCCESS)
            st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                          CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &candidates, NULL);
        if (st == CUDNN_STATUS_SUCCESS && candidates > 0) {
            cudnnBackendDescriptor_t tmp[32];
            const int64_t want = candidates < 32 ? candidates : 32;
            int64_t made = 0, got = 0;
            for (; made < want; made++)
                if ((st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR,
                                                       &tmp[made])) != CUDNN_STATUS_SUCCESS)
                    break;
            if (st == CUDNN_STATUS_SUCCESS)
                st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, want, &got, tmp);
            /* cuDNN runs its support checks here: got may be below the
             * candidate count, down to 0 with SUCCESS ("unsupported"). */
            for (int64_t i = 0; i < made; i++) {
                if (st == CUDNN_STATUS_SUCCESS && i < got && cfgs && *n_cfgs < max_cfgs)
                    cfgs[(*n_cfgs)++] = tmp[i];
                else
                    cudnnBackendDestroyDescriptor(tmp[i]);
            }
            if (!cfgs && st == CUDNN_STATUS_SUCCESS)
                *n_cfgs = (int)got;
        }
        cudnnBackendDestroyDescriptor(heur);
        if (st != CUDNN_STATUS_SUCCESS)
            return st;
    }
    return st;
}

sdpa_status sdpa_cudnn_status_map(int code, int executing, const char *detail)
{
    if (code >= 3005 && code <= 3009)
        return SDPA_NOT_AVAILABLE; /* driver, runtime, arch or library missing */
    if (code >= 3000 && code < 4000)
        return SDPA_UNSUPPORTED;
    if (code >= 1000 && code < 2000)
        return SDPA_NOT_AVAILABLE;
    if (code == 4003 || code == 4004)
        return SDPA_OUT_OF_MEMORY;
    if (code >= 2000 && code < 3000)
        return SDPA_INTERNAL;
    if (executing)
        return SDPA_DEVICE_ERROR;
    if (code >= 5000 && code < 6000 && detail && strstr(detail, "returned error (2)"))
        return SDPA_OUT_OF_MEMORY; /* cuLibraryLoadData: CUDA_ERROR_OUT_OF_MEMORY */
    return SDPA_UNSUPPORTED; /* compilation or internal failure while building */
}
