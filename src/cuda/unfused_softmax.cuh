/*
 * unfused_softmax.cuh - cuda.unfused's row softmax (see unfused.cu), kept
 * apart so that it compiles two ways, as flash_kernel.cuh does: by nvcc,
 * and as host C++ under tests/cuda/simt_emulator.h (which defines
 * UNFUSED_EMULATED and SOFTMAX_SHARED before including this file).
 *
 * One block of SOFTMAX_THREADS per query row of S [rows][Skv] (scaled
 * scores): the masks of sdpa.h (causal, sequence lengths, key mask), max,
 * exp, sum and P in place, LSE = max + log(sum). A row that sees no key
 * (padding, or every key hidden) gets P = 0 and LSE -inf; a NaN sum stays
 * NaN. Lengths and the key mask are device arrays read here, per row, so
 * the host never needs them.
 */
#ifndef SDPA_UNFUSED_SOFTMAX_CUH
#define SDPA_UNFUSED_SOFTMAX_CUH

#include "../core/causal.h"

#define SOFTMAX_THREADS 128
#ifndef UNFUSED_EMULATED
#define SOFTMAX_SHARED(name) __shared__ float name[SOFTMAX_THREADS]
#endif

typedef struct softmax_args {
    float *S;        /* [rows][Skv], rows from query row0 of batch entry b */
    float *lse_row;  /* LSE of those rows, or NULL */
    int64_t Sq, Skv, row0, b;
    int causal;      /* 0 none, 1 top-left, 2 bottom-right */
    const int32_t *len_q, *len_kv; /* or NULL */
    const uint8_t *key;            /* [B, Skv] through key_s0, key_s1, or NULL */
    int64_t key_s0, key_s1;
} softmax_args;

static __global__ void softmax_rows(const softmax_args a)
{
    SOFTMAX_SHARED(red);
    const int64_t r = blockIdx.x, i = a.row0 + r;
    float *s = a.S + r * a.Skv;
    const int64_t lq = a.len_q ? a.len_q[a.b] : a.Sq, lkv = a.len_kv ? a.len_kv[a.b] : a.Skv;
    int64_t n = i < lq ? lkv : 0; /* keys j < n may be seen, unless the key mask hides them */
    if (n > 0)
        n = sdpa_causal_visible_keys(a.causal, i, lq, lkv);
    const uint8_t *key = a.key ? a.key + a.b * a.key_s0 : 0;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < n; j += SOFTMAX_THREADS)
        if (!key || key[j * a.key_s1])
            mx = fmaxf(mx, s[j]);
    red[threadIdx.x] = mx;
    __syncthreads();
    for (int w = SOFTMAX_THREADS / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w)
            red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + w]);
        __syncthreads();
    }
    mx = red[0];
    __syncthreads();
    const float mu = mx == -INFINITY ? 0.0f : mx; /* no key seen: exp(-inf - 0) = 0 */
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < a.Skv; j += SOFTMAX_THREADS) {
        const float e = j < n && (!key || key[j * a.key_s1]) ? expf(s[j] - mu) : 0.0f;
        s[j] = e;
        sum += e;
    }
    red[threadIdx.x] = sum;
    __syncthreads();
    for (int w = SOFTMAX_THREADS / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w)
            red[threadIdx.x] += red[threadIdx.x + w];
        __syncthreads();
    }
    sum = red[0];
    const float inv = sum > 0.0f ? 1.0f / sum : sum == 0.0f ? 0.0f : sum; /* NaN stays */
    for (int64_t j = threadIdx.x; j < a.Skv; j += SOFTMAX_THREADS)
        s[j] *= inv;
    if (threadIdx.x == 0 && a.lse_row)
        a.lse_row[r] = sum > 0.0f ? mx + logf(sum) : sum == 0.0f ? -INFINITY : sum;
}

#endif
