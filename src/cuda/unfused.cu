/*
 * unfused.cu - cuda.unfused: attention as the textbook says, for any head
 * dim and fp32 too: S = scale * Q K^T (cuBLAS, fp32 accumulation), a
 * row softmax kernel (masks, max, exp, sum; LSE: unfused_softmax.cuh),
 * O = P V (cuBLAS), and a store kernel into the caller's dtype and
 * strides. Masks: sequence lengths and a key mask, read on the device by
 * the softmax (padding keys of V widened as zeros, so 0 * NaN never
 * reaches O); rows that see no key are then written by mask_rows.cu. It is the last-resort
 * GPU path and the GPU-side reference for shapes too large for ref.
 *
 * Costs, stated: S and P are materialised in fp32 for a block of query
 * rows (at most 256 MiB at a time), one (batch, head) at a time, and V is
 * widened to fp32 per (batch, kv head). Temporary memory comes from the
 * stream-ordered allocator (cudaMallocAsync), so there is no device-wide
 * synchronisation; everything runs on the caller's stream.
 *
 * cuBLAS is opened on the first cuda.unfused call, not linked: its Lt
 * library alone adds about 150 MB of resident memory to a process that
 * loads it (dlopen of libcublasLt.so.13 took RSS from 1.9 to 153 MB), and
 * the plugin is loaded by every process that probes for a GPU, most of
 * which never run this backend.
 *
 * Written and compiled without a GPU; scripts/gpu-check.sh is its test.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

extern "C" {
#include "plugin.h"
extern const sdpa_cuda_host *sdpa_cuda__host;
sdpa_status sdpa_cuda__unfused_run(const sdpa_cuda_call *c);
}

#include "device_memory.h"
#include "store_elem.cuh"
#include "unfused_softmax.cuh"

extern "C" cudaError_t sdpa_cuda__zero_unseen_rows(const sdpa_cuda_call *c); /* mask_rows.cu */

static __device__ float load_elem(const void *p, int dtype, int64_t i)
{
    if (dtype == SDPA_F32)
        return ((const float *)p)[i];
    const unsigned short h = ((const unsigned short *)p)[i];
    if (dtype == SDPA_BF16)
        return __uint_as_float((unsigned int)h << 16);
    return __half2float(__ushort_as_half(h));
}


/* dst[j][d] = src(b, j, hk, d) widened to fp32, contiguous [Skv][D]; rows
 * at or past *len (batch entry b's seq_len_kv, when given) are zeros. */
static __global__ void widen_rows(const void *src, int dtype, int64_t base, int64_t s_stride,
                                  int64_t d_stride, int64_t rows, int64_t D, const int32_t *len,
                                  float *dst)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * D)
        return;
    const int64_t j = i / D, d = i % D;
    dst[i] = len && j >= *len ? 0.0f : load_elem(src, dtype, base + j * s_stride + d * d_stride);
}

/* out(b, i, h, d) = O[r][d] in out's dtype and strides. */
static __global__ void store_rows(const float *O, int64_t rows, int64_t D, void *out, int dtype,
                                  int64_t base, int64_t s_stride, int64_t d_stride)
{
    const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= rows * D)
        return;
    store_elem(out, dtype, base + (k / D) * s_stride + (k % D) * d_stride, O[k]);
}

static thread_local cublasHandle_t cublas;
static thread_local int cublas_device = -1;

/* The four cuBLAS entry points used here, from the library opened on the
 * first call (see the top of the file). */
static struct {
    decltype(&cublasCreate_v2) create;
    decltype(&cublasDestroy_v2) destroy;
    decltype(&cublasSetStream_v2) set_stream;
    cublasStatus_t (*gemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                           const void *, const void *, cudaDataType, int, const void *,
                           cudaDataType, int, const void *, void *, cudaDataType, int,
                           cublasComputeType_t, cublasGemmAlgo_t); /* the non-inline one */
} cb;
static pthread_once_t cb_once = PTHREAD_ONCE_INIT;
static char cb_error[200];

#define SDPA_STR2(x) #x
#define SDPA_STR(x) SDPA_STR2(x)

static void cb_load(void)
{
    const char *names[] = {"libcublas.so." SDPA_STR(CUBLAS_VER_MAJOR), "libcublas.so"};
    void *h = NULL;
    for (int i = 0; i < 2 && !h; i++)
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(cb_error, sizeof cb_error, "cuda.unfused: cannot load cuBLAS: %.150s",
                 e ? e : "?");
        return;
    }
    *(void **)&cb.create = dlsym(h, "cublasCreate_v2");
    *(void **)&cb.destroy = dlsym(h, "cublasDestroy_v2");
    *(void **)&cb.set_stream = dlsym(h, "cublasSetStream_v2");
    *(void **)&cb.gemm = dlsym(h, "cublasGemmEx");
    if (!cb.create || !cb.destroy || !cb.set_stream || !cb.gemm) {
        snprintf(cb_error, sizeof cb_error, "cuda.unfused: %s lacks an entry point it needs",
                 names[0]);
        cb.create = NULL;
    }
}

static sdpa_status cuda_fail(cudaError_t e, const char *what)
{
    return sdpa_cuda__host->fail(e == cudaErrorMemoryAllocation ? SDPA_OUT_OF_MEMORY
                                                                 : SDPA_DEVICE_ERROR,
                                 "cuda.unfused: %s: %s", what, cudaGetErrorString(e));
}

static sdpa_status blas_fail(cublasStatus_t s, const char *what)
{
    return sdpa_cuda__host->fail(s == CUBLAS_STATUS_ALLOC_FAILED ? SDPA_OUT_OF_MEMORY
                                 : s == CUBLAS_STATUS_NOT_SUPPORTED ? SDPA_UNSUPPORTED
                                                                    : SDPA_DEVICE_ERROR,
                                 "cuda.unfused: %s: cuBLAS status %d", what, (int)s);
}

static cudaDataType_t cuda_type(int dtype)
{
    return dtype == SDPA_F32 ? CUDA_R_32F : dtype == SDPA_BF16 ? CUDA_R_16BF : CUDA_R_16F;
}

sdpa_status sdpa_cuda__unfused_run(const sdpa_cuda_call *c)
{
    const sdpa_call_desc *d = &c->desc;
    const sdpa_tensor *q = c->q, *k = c->k, *v = c->v, *out = c->out;
    if (q->stride[3] != 1 || k->stride[3] != 1)
        return sdpa_cuda__host->fail(SDPA_UNSUPPORTED,
                                     "cuda.unfused: q and k need unit stride along D (cuBLAS)");
    const int device = q->device.ordinal;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess)
        return cuda_fail(e, "cudaSetDevice");
    sdpa_status ms = sdpa_cuda__check_mask_arrays("cuda.unfused", c, device);
    if (ms != SDPA_OK) /* the mask arrays live with the tensors (sdpa.h) */
        return ms;
    pthread_once(&cb_once, cb_load);
    if (!cb.create)
        return sdpa_cuda__host->fail(SDPA_NOT_AVAILABLE, "%s", cb_error);
    cublasStatus_t bs;
    if (!cublas || cublas_device != device) {
        if (cublas)
            cb.destroy(cublas);
        cublas = NULL;
        if ((bs = cb.create(&cublas)) != CUBLAS_STATUS_SUCCESS)
            return blas_fail(bs, "cublasCreate");
        cublas_device = device;
    }
    cudaStream_t stream = (cudaStream_t)c->stream;
    cb.set_stream(cublas, stream);
    const int64_t D = d->D, Sq = d->Sq, Skv = d->Skv, g = d->Hq / d->Hkv;
    int64_t rows = (int64_t)(256ll << 20) / (4 * Skv); /* S block of at most 256 MiB */
    rows = rows < 1 ? 1 : (rows > Sq ? Sq : rows);
    float *S = NULL, *Vf = NULL, *O = NULL;
    if ((e = cudaMallocAsync((void **)&S, sizeof(float) * rows * Skv, stream)) != cudaSuccess ||
        (e = cudaMallocAsync((void **)&Vf, sizeof(float) * Skv * D, stream)) != cudaSuccess ||
        (e = cudaMallocAsync((void **)&O, sizeof(float) * rows * D, stream)) != cudaSuccess) {
        cudaFreeAsync(S, stream), cudaFreeAsync(Vf, stream), cudaFreeAsync(O, stream);
        return cuda_fail(e, "temporary buffers");
    }
    const sdpa_mask *mk = c->mask;
    const float alpha = (float)c->scale, one = 1.0f, zero = 0.0f;
    const size_t es = q->dtype == SDPA_F32 ? 4 : 2;
    sdpa_status result = SDPA_OK;
    for (int64_t b = 0; b < d->B && result == SDPA_OK; b++)
        for (int64_t hk = 0; hk < d->Hkv && result == SDPA_OK; hk++) {
            const int64_t vbase = b * v->stride[0] + hk * v->stride[2];
            widen_rows<<<(unsigned)((Skv * D + 255) / 256), 256, 0, stream>>>(
                v->data, v->dtype, vbase, v->stride[1], v->stride[3], Skv, D,
                mk && mk->seq_len_kv ? mk->seq_len_kv + b : NULL, Vf);
            const char *kp = (const char *)k->data + (b * k->stride[0] + hk * k->stride[2]) * es;
            for (int64_t h = hk * g; h < (hk + 1) * g && result == SDPA_OK; h++)
                for (int64_t i0 = 0; i0 < Sq && result == SDPA_OK; i0 += rows) {
                    const int64_t n = Sq - i0 < rows ? Sq - i0 : rows;
                    const char *qp = (const char *)q->data +
                                     (b * q->stride[0] + i0 * q->stride[1] + h * q->stride[2]) * es;
                    /* column-major: S^T [Skv x n] = (K^T)^T [Skv x D] . Q^T [D x n] */
                    bs = cb.gemm(cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)Skv, (int)n, (int)D,
                                      &alpha, kp, cuda_type(k->dtype), (int)k->stride[1], qp,
                                      cuda_type(q->dtype), (int)q->stride[1], &zero, S, CUDA_R_32F,
                                      (int)Skv, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
                    if (bs != CUBLAS_STATUS_SUCCESS) {
                        result = blas_fail(bs, "Q.K^T");
                        break;
                    }
                    softmax_args sa = {S, c->lse ? c->lse + (b * d->Hq + h) * Sq + i0 : NULL,
                                       Sq, Skv, i0, b, (int)c->causal,
                                       mk ? mk->seq_len_q : NULL, mk ? mk->seq_len_kv : NULL,
                                       mk ? mk->key : NULL, mk ? mk->key_stride[0] : 0,
                                       mk ? mk->key_stride[1] : 0};
                    softmax_rows<<<(unsigned)n, SOFTMAX_THREADS, 0, stream>>>(sa);
                    /* O^T [D x n] = V^T [D x Skv] . P^T [Skv x n] */
                    bs = cb.gemm(cublas, CUBLAS_OP_N, CUBLAS_OP_N, (int)D, (int)n, (int)Skv,
                                      &one, Vf, CUDA_R_32F, (int)D, S, CUDA_R_32F, (int)Skv, &zero,
                                      O, CUDA_R_32F, (int)D, CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT);
                    if (bs != CUBLAS_STATUS_SUCCESS) {
                        result = blas_fail(bs, "P.V");
                        break;
                    }
                    store_rows<<<(unsigned)((n * D + 255) / 256), 256, 0, stream>>>(
                        O, n, D, out->data, out->dtype,
                        b * out->stride[0] + i0 * out->stride[1] + h * out->stride[2],
                        out->stride[1], out->stride[3]);
                }
        }
    if (result == SDPA_OK && mk && (mk->seq_len_q || mk->seq_len_kv) &&
        (e = sdpa_cuda__zero_unseen_rows(c)) != cudaSuccess) /* padding rows: zeros, -inf */
        result = cuda_fail(e, "zeroing unseen rows");
    if (result == SDPA_OK && (e = cudaGetLastError()) != cudaSuccess)
        result = cuda_fail(e, "kernel launch");
    cudaFreeAsync(S, stream), cudaFreeAsync(Vf, stream), cudaFreeAsync(O, stream);
    return result;
}
