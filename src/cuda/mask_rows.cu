/*
 * mask_rows.cu - the rows of a masked call that see no key, written as
 * sdpa.h defines them: zeros and LSE -inf. cuda.cudnn's padding mask
 * bounds its products by the sequence lengths (cudnn_graph.c), so rows
 * past seq_len_q are never written, and a row that sees no key (a zero
 * length, or bottom-right causal with seq_len_q > seq_len_kv) would be
 * 0/0 inside cuDNN. Which rows those are follows from the lengths and the
 * causal alignment alone, so this pass does not read cuDNN's output: one
 * warp per row, every row checked, only the unseen ones written. Cost: one
 * read of two int32 per row and a store per element of the rows written,
 * a few microseconds next to the attention itself.
 */
#include "plugin.h"
#include "../core/causal.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

#include "store_elem.cuh"

extern "C" cudaError_t sdpa_cuda__zero_unseen_rows(const sdpa_cuda_call *c);

typedef struct unseen_args {
    void *o;
    int out_dtype;
    int64_t os[4]; /* b, s, h, d */
    float *lse;
    int64_t B, Sq, Skv, Hq, D;
    const int32_t *len_q, *len_kv;
    int causal; /* 0 none, 1 top-left, 2 bottom-right */
} unseen_args;

static __global__ void zero_unseen(const unseen_args a)
{
    const int64_t rows = a.B * a.Hq * a.Sq;
    for (int64_t r = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; r < rows;
         r += (int64_t)gridDim.x * blockDim.y) {
        const int64_t i = r % a.Sq, h = r / a.Sq % a.Hq, b = r / (a.Sq * a.Hq);
        const int64_t lq = a.len_q ? a.len_q[b] : a.Sq, lkv = a.len_kv ? a.len_kv[b] : a.Skv;
        int64_t seen = i < lq ? lkv : 0; /* keys row i may see */
        if (seen > 0)
            seen = sdpa_causal_visible_keys(a.causal, i, lq, lkv);
        if (seen > 0)
            continue;
        const int64_t base = b * a.os[0] + i * a.os[1] + h * a.os[2];
        for (int64_t d = threadIdx.x; d < a.D; d += 32)
            store_elem(a.o, a.out_dtype, base + d * a.os[3], 0.0f);
        if (a.lse && threadIdx.x == 0)
            a.lse[(b * a.Hq + h) * a.Sq + i] = -INFINITY;
    }
}

extern "C" cudaError_t sdpa_cuda__zero_unseen_rows(const sdpa_cuda_call *c)
{
    const sdpa_call_desc *d = &c->desc;
    unseen_args a;
    a.o = c->out->data, a.out_dtype = (int)c->out->dtype, a.lse = c->lse;
    for (int i = 0; i < 4; i++)
        a.os[i] = c->out->stride[i];
    a.B = d->B, a.Sq = d->Sq, a.Skv = d->Skv, a.Hq = d->Hq, a.D = d->D;
    a.len_q = c->mask ? c->mask->seq_len_q : NULL, a.len_kv = c->mask ? c->mask->seq_len_kv : NULL;
    a.causal = (int)c->causal;
    const int64_t rows = d->B * d->Hq * d->Sq, per_block = 8;
    const int64_t blocks = (rows + per_block - 1) / per_block;
    const dim3 block(32, (unsigned)per_block);
    zero_unseen<<<(unsigned)(blocks < 65536 ? blocks : 65536), block, 0,
                  (cudaStream_t)c->stream>>>(a);
    return cudaGetLastError();
}
