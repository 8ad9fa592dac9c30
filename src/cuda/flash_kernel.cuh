/*
 * flash_kernel.cuh - cuda.flash's device code (see flash.cu for the design),
 * kept apart from the launch code so that it compiles two ways: by nvcc
 * for the GPU, and as host C++ under tests/cuda/simt_emulator.h, which
 * runs each block's 128 threads as coroutines and implements mma.sync,
 * __shfl_xor_sync and __syncthreads as the PTX manual defines them. The
 * emulator defines FLASH_EMULATED, mma_16816 and FLASH_SHARED_MEMORY
 * before including this file.
 */
#ifndef SDPA_FLASH_KERNEL_CUH
#define SDPA_FLASH_KERNEL_CUH

#ifndef FLASH_EMULATED
#define FLASH_SHARED_MEMORY(name) extern __shared__ __align__(16) uint16_t name[]
#endif

#include "store_elem.cuh"
#include "../core/causal.h"

#define FLASH_WARPS 4
#define FLASH_THREADS (32 * FLASH_WARPS)
#define BM (16 * FLASH_WARPS) /* query rows per block */
#define BN 64                 /* keys per step */
#define PAD 8                 /* elements added to every shared-memory row */
#define LN2 0.69314718055994531f

typedef struct flash_args {
    const uint16_t *q, *k, *v;
    void *o;
    float *lse;
    int64_t qs[4], ks[4], vs[4], os[4]; /* element strides of b, s, h, d */
    int64_t Sq, Skv, Hq, Hkv, D;
    int out_dtype;
    int causal;       /* 0 none, 1 top-left, 2 bottom-right */
    int vec;          /* 1: 16-byte loads are safe for q, k, v */
    float scale_log2;
    /* Masks (sdpa.h), device memory, each optional: real lengths per batch
     * entry, and a key mask [B, Skv] (byte strides key_s0, key_s1). */
    const int32_t *len_q, *len_kv;
    const uint8_t *key;
    int64_t key_s0, key_s1;
} flash_args;

/* c += a b for one 16 x 8 x 16 step; a: 4 registers, b: 2. */
#ifndef FLASH_EMULATED
template <int BF16>
static __device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4], uint32_t b0,
                                                 uint32_t b1)
{
    if (BF16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

/* Two floats as one register of two 16-bit values, lo in the low half. */
template <int BF16>
static __device__ __forceinline__ uint32_t pack2(float lo, float hi)
{
    uint32_t r;
    if (BF16) {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        memcpy(&r, &v, 4);
    } else {
        __half2 v = __floats2half2_rn(lo, hi);
        memcpy(&r, &v, 4);
    }
    return r;
}

#ifndef FLASH_EMULATED
/* 16 bytes global -> shared without registers (sm_80+); src_bytes 0 fills
 * zeros (rows past the end). Completes at cp_async_wait. */
static __device__ __forceinline__ void cp_async16(uint16_t *dst, const uint16_t *src, int src_bytes)
{
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
                 "r"(src_bytes));
}
static __device__ __forceinline__ void cp_async_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::);
}
/* Waits until at most n committed groups are still in flight. */
template <int N>
static __device__ __forceinline__ void cp_async_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
/* Four 8 x 8 b16 matrices; this lane gives the address of row lane % 8 of
 * matrix lane / 8. Without TRANS, r[i] holds row lane / 4, columns
 * 2 (lane % 4) and + 1 of matrix i; with TRANS, rows 2 (lane % 4) and + 1
 * of column lane / 4. */
template <int TRANS>
static __device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const uint16_t *row)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
}
#endif

static __device__ __forceinline__ uint32_t ld32(const uint16_t *p)
{
    return *(const uint32_t *)p;
}

/*
 * rows x HD elements of a [S][D] slice (row stride rs, element stride es)
 * into shared memory, zero past `limit` rows and past D columns. With
 * transpose, element (r, d) goes to dst[d][r] (row length ld).
 */
template <int HD>
static __device__ void load_tile(const uint16_t *src, int64_t rs, int64_t es, int64_t row0,
                                 int64_t limit, int64_t D, int vec, uint16_t *dst, int ld,
                                 int rows, int transpose)
{
    if (vec) { /* es == 1, D % 8 == 0, rows 16-byte aligned */
        for (int e = threadIdx.x; e < rows * HD / 8; e += FLASH_THREADS) {
            const int r = e / (HD / 8), d = e % (HD / 8) * 8;
            uint4 x = make_uint4(0, 0, 0, 0);
            if (row0 + r < limit && d < D)
                x = *(const uint4 *)(src + (row0 + r) * rs + d);
            const uint16_t *xs = (const uint16_t *)&x;
            if (!transpose) {
                *(uint4 *)(dst + r * ld + d) = x;
            } else {
                for (int u = 0; u < 8; u++)
                    dst[(d + u) * ld + r] = xs[u];
            }
        }
        return;
    }
    for (int e = threadIdx.x; e < rows * HD; e += FLASH_THREADS) {
        const int r = e / HD, d = e % HD;
        uint16_t x = 0;
        if (row0 + r < limit && d < D)
            x = src[(row0 + r) * rs + d * es];
        dst[transpose ? d * ld + r : r * ld + d] = x;
    }
}

/* The pipelined variant's K or V tile: cp.async when 16-byte loads are
 * safe (rows past `limit` zero-filled), else load_tile, row-major. */
template <int HD>
static __device__ void issue_tile(const uint16_t *src, int64_t rs, int64_t es, int64_t row0,
                                  int64_t limit, int64_t D, int vec, uint16_t *dst, int ld)
{
    if (!vec) {
        load_tile<HD>(src, rs, es, row0, limit, D, vec, dst, ld, BN, 0);
        return;
    }
    for (int e = threadIdx.x; e < BN * HD / 8; e += FLASH_THREADS) {
        const int r = e / (HD / 8), d = e % (HD / 8) * 8;
        const int in = row0 + r < limit && d < D;
        cp_async16(dst + r * ld + d, in ? src + (row0 + r) * rs + d : src, in ? 16 : 0);
    }
}

/*
 * PIPE = 0: the first version. K and V^T tiles loaded with plain loads
 * between two barriers; fragments read with 32-bit shared loads.
 * PIPE = 1: K and V (row-major) double-buffered with cp.async, so block
 * j + 1 streams in while block j is computed; K and V fragments read with
 * ldmatrix (V with .trans, which does the transpose v0 did by hand). More
 * shared memory (5 tiles), fewer instructions, loads off the critical path.
 */
template <int BF16, int HD, int PIPE>
static __global__ void __launch_bounds__(FLASH_THREADS) flash_fwd(const flash_args a)
{
    FLASH_SHARED_MEMORY(smem);
    const int LDQ = HD + PAD, LDV = BN + PAD;
    uint16_t *Qs = smem;             /* [BM][LDQ] */
    uint16_t *Ks = Qs + BM * LDQ;    /* [BN][LDQ]; PIPE: K[2] then V[2], each [BN][LDQ] */
    uint16_t *Vt = Ks + BN * LDQ;    /* [HD][LDV]; PIPE: unused */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int64_t m0 = (int64_t)blockIdx.x * BM, h = blockIdx.y, b = blockIdx.z;
    const int64_t hk = h / (a.Hq / a.Hkv);
    const uint16_t *q = a.q + b * a.qs[0] + h * a.qs[2];
    const uint16_t *k = a.k + b * a.ks[0] + hk * a.ks[2];
    const uint16_t *v = a.v + b * a.vs[0] + hk * a.vs[2];

    /* Sequence lengths: rows at or past len_q are padding (stored as
     * zeros), keys at or past len_kv are never loaded (zero-filled, so
     * 0 * garbage never reaches O), causal aligns on the real lengths. */
    const int64_t len_q = a.len_q ? a.len_q[b] : a.Sq, len_kv = a.len_kv ? a.len_kv[b] : a.Skv;
    const int64_t offset = sdpa_causal_offset(a.causal, len_q, len_kv); /* j <= i + offset */
    const uint8_t *key = a.key ? a.key + b * a.key_s0 : 0;
    load_tile<HD>(q, a.qs[1], a.qs[3], m0, a.Sq, a.D, a.vec, Qs, LDQ, BM, 0);
    __syncthreads();
    const int r0 = warp * 16 + g; /* this lane's rows: r0 and r0 + 8 of the block */
    uint32_t qf[HD / 16][4];
#pragma unroll
    for (int ks = 0; ks < HD / 16; ks++) {
        const uint16_t *p = Qs + r0 * LDQ + ks * 16 + 2 * t;
        qf[ks][0] = ld32(p), qf[ks][1] = ld32(p + 8 * LDQ);
        qf[ks][2] = ld32(p + 8), qf[ks][3] = ld32(p + 8 * LDQ + 8);
    }
    float o[HD / 8][4];
#pragma unroll
    for (int dt = 0; dt < HD / 8; dt++)
        o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const int64_t row[2] = {m0 + r0, m0 + r0 + 8};

    /* keys at or past kv_end are masked for the whole block; a block of
     * padding rows reads none */
    int64_t kv_end = m0 < len_q ? len_kv : 0;
    if (kv_end > 0) /* what the block's last real row sees */
        kv_end = sdpa_causal_visible_keys(a.causal, (m0 + BM < len_q ? m0 + BM : len_q) - 1,
                                          len_q, len_kv);
    /* PIPE: K of buffer n at Ks + n BN LDQ, V at Ks + (2 + n) BN LDQ (pointer
     * arithmetic, not an array: a run-time index would put it in local memory) */
    if (PIPE && kv_end > 0) { /* prologue: block 0 into buffer 0 */
        issue_tile<HD>(k, a.ks[1], a.ks[3], 0, len_kv, a.D, a.vec, Ks, LDQ);
        issue_tile<HD>(v, a.vs[1], a.vs[3], 0, len_kv, a.D, a.vec, Ks + 2 * BN * LDQ, LDQ);
        cp_async_commit();
    }
    for (int64_t j0 = 0, it = 0; j0 < kv_end; j0 += BN, it++) {
        const uint16_t *kt = Ks, *vt = Vt;
        if (PIPE) {
            if (j0 + BN < kv_end) { /* block it + 1 into the other buffer, then wait for it */
                const int nb = (int)((it + 1) % 2);
                issue_tile<HD>(k, a.ks[1], a.ks[3], j0 + BN, len_kv, a.D, a.vec,
                               Ks + nb * BN * LDQ, LDQ);
                issue_tile<HD>(v, a.vs[1], a.vs[3], j0 + BN, len_kv, a.D, a.vec,
                               Ks + (2 + nb) * BN * LDQ, LDQ);
                cp_async_commit();
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            __syncthreads(); /* every thread's copies of block it have landed */
            kt = Ks + (it % 2) * BN * LDQ, vt = Ks + (2 + it % 2) * BN * LDQ;
        } else {
            __syncthreads(); /* the previous step's reads of Ks and Vt are done */
            load_tile<HD>(k, a.ks[1], a.ks[3], j0, len_kv, a.D, a.vec, Ks, LDQ, BN, 0);
            load_tile<HD>(v, a.vs[1], a.vs[3], j0, len_kv, a.D, a.vec, Vt, LDV, BN, 1);
            __syncthreads();
        }

        float s[BN / 8][4];
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++)
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < HD / 16; ks++)
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt += 2) {
                uint32_t bf[4]; /* B of key tiles nt, nt + 1: K rows, d pairs */
                if (PIPE) {     /* matrix i: keys (nt + i / 2) * 8.., d ks * 16 + (i % 2) * 8.. */
                    const int mi = lane / 8;
                    ldmatrix_x4<0>(bf, kt + ((nt + mi / 2) * 8 + lane % 8) * LDQ + ks * 16 +
                                           (mi % 2) * 8);
                } else {
                    const uint16_t *p = kt + (nt * 8 + g) * LDQ + ks * 16 + 2 * t;
                    bf[0] = ld32(p), bf[1] = ld32(p + 8);
                    bf[2] = ld32(p + 8 * LDQ), bf[3] = ld32(p + 8 * LDQ + 8);
                }
                mma_16816<BF16>(s[nt], qf[ks], bf[0], bf[1]);
                mma_16816<BF16>(s[nt + 1], qf[ks], bf[2], bf[3]);
            }

        /* scale into log2 units, mask, and the online softmax per row */
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            float mx = m[hr];
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const int64_t j = j0 + nt * 8 + 2 * t + c;
                    float x = s[nt][2 * hr + c] * a.scale_log2;
                    if (j >= len_kv || (a.causal && j > row[hr] + offset) ||
                        (key && !key[j * a.key_s1]))
                        x = -INFINITY;
                    s[nt][2 * hr + c] = x;
                    mx = fmaxf(mx, x);
                }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            /* a row that has seen no key keeps m = -inf; 0 keeps exp2 finite */
            const float mu = mx == -INFINITY ? 0.0f : mx;
            const float alpha = exp2f(m[hr] - mu);
            m[hr] = mx;
            l[hr] *= alpha;
#pragma unroll
            for (int dt = 0; dt < HD / 8; dt++)
                o[dt][2 * hr] *= alpha, o[dt][2 * hr + 1] *= alpha;
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const float p = exp2f(s[nt][2 * hr + c] - mu);
                    l[hr] += p;
                    s[nt][2 * hr + c] = p;
                }
        }

        /* O += P V: S's accumulators of key tiles 2kk, 2kk + 1 are P's A fragment */
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            const uint32_t pa[4] = {pack2<BF16>(s[2 * kk][0], s[2 * kk][1]),
                                    pack2<BF16>(s[2 * kk][2], s[2 * kk][3]),
                                    pack2<BF16>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                    pack2<BF16>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int dt = 0; dt < HD / 8; dt += 2) {
                uint32_t bf[4]; /* B of d tiles dt, dt + 1: key pairs of one d column */
                if (PIPE) {     /* matrix i: keys kk * 16 + (i % 2) * 8.., d (dt + i / 2) * 8.. */
                    const int mi = lane / 8;
                    ldmatrix_x4<1>(bf, vt + (kk * 16 + (mi % 2) * 8 + lane % 8) * LDQ +
                                           (dt + mi / 2) * 8);
                } else {
                    const uint16_t *p = vt + (dt * 8 + g) * LDV + kk * 16 + 2 * t;
                    bf[0] = ld32(p), bf[1] = ld32(p + 8);
                    bf[2] = ld32(p + 8 * LDV), bf[3] = ld32(p + 8 * LDV + 8);
                }
                mma_16816<BF16>(o[dt], pa, bf[0], bf[1]);
                mma_16816<BF16>(o[dt + 1], pa, bf[2], bf[3]);
            }
        }
        if (PIPE)
            __syncthreads(); /* buffer it % 2 is refilled next iteration */
    }

#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        float sum = l[hr];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const int64_t i = row[hr];
        if (i >= a.Sq)
            continue;
        if (i >= len_q)
            sum = 0.0f; /* padding: zeros and LSE -inf */
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f; /* no key seen: zeros */
        const int64_t base = b * a.os[0] + i * a.os[1] + h * a.os[2];
#pragma unroll
        for (int dt = 0; dt < HD / 8; dt++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int64_t d = dt * 8 + 2 * t + c;
                if (d < a.D) /* zeros, not 0 * o, where no key was seen; NaN sums stay NaN */
                    store_elem(a.o, a.out_dtype, base + d * a.os[3],
                               sum > 0.0f ? o[dt][2 * hr + c] * inv : sum == 0.0f ? 0.0f : sum);
            }
        if (a.lse && t == 0)
            a.lse[(b * a.Hq + h) * a.Sq + i] =
                sum > 0.0f ? m[hr] * LN2 + logf(sum) : sum == 0.0f ? -INFINITY : sum;
    }
}

/* The kernel's arguments for a validated call (host code, no CUDA calls). */
static void flash_args_make(const sdpa_cuda_call *c, flash_args *a)
{
    const sdpa_call_desc *d = &c->desc;
    const sdpa_tensor *t[4] = {c->q, c->k, c->v, c->out};
    int64_t *strides[4] = {a->qs, a->ks, a->vs, a->os};
    memset(a, 0, sizeof *a);
    a->vec = 1;
    for (int i = 0; i < 4; i++) {
        for (int j = 0; j < 4; j++)
            strides[i][j] = t[i]->stride[j];
        if (i < 3) /* 16-byte loads: unit D stride, rows on 8-element boundaries */
            a->vec &= t[i]->stride[3] == 1 && d->D % 8 == 0 && t[i]->stride[0] % 8 == 0 &&
                      t[i]->stride[1] % 8 == 0 && t[i]->stride[2] % 8 == 0 &&
                      (uintptr_t)t[i]->data % 16 == 0;
    }
    a->q = (const uint16_t *)c->q->data, a->k = (const uint16_t *)c->k->data;
    a->v = (const uint16_t *)c->v->data, a->o = c->out->data, a->lse = c->lse;
    a->Sq = d->Sq, a->Skv = d->Skv, a->Hq = d->Hq, a->Hkv = d->Hkv, a->D = d->D;
    a->out_dtype = (int)c->out->dtype;
    a->causal = (int)c->causal;
    a->scale_log2 = (float)(c->scale * 1.4426950408889634);
    if (c->mask) { /* only the kinds cuda.flash declares: lengths and a key mask */
        a->len_q = c->mask->seq_len_q, a->len_kv = c->mask->seq_len_kv;
        a->key = c->mask->key;
        a->key_s0 = c->mask->key_stride[0], a->key_s1 = c->mask->key_stride[1];
    }
}

/* Dynamic shared memory of one block. */
static size_t flash_smem_bytes(int hd, int pipe)
{
    if (pipe) /* Q, K[2], V[2] */
        return sizeof(uint16_t) * (size_t)((BM + 4 * BN) * (hd + PAD));
    return sizeof(uint16_t) * (size_t)((BM + BN) * (hd + PAD) + hd * (BN + PAD));
}

#endif
