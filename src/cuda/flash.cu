/*
 * flash.cu - cuda.flash: libsdpa's FlashAttention-2-style forward kernel.
 *
 * One block of 4 warps per (64 query rows, head, batch); each warp owns 16
 * query rows for the whole call. For each block of 64 keys:
 *
 *     S = Q K^T      mma.sync m16n8k16 (bf16 or f16 operands, fp32 accumulators)
 *     online softmax on the accumulators, in registers, in log2 units
 *     O += P V       P re-used from S's accumulators as the A operand
 *
 * which is the FA2 register choreography: the C fragment of S (rows g and
 * g + 8, columns 2t, 2t + 1 of each 8-key tile, with g = lane / 4 and
 * t = lane % 4) is, tile pair by tile pair, exactly the A fragment of the
 * second product, so P never goes through shared memory. Row maxima and
 * sums need only the 4 lanes of a quad (two shuffles); the sum stays
 * per-lane until the end.
 *
 * Shared memory: Q [64][HD], K [64][HD] and V transposed [HD][64], each
 * row padded by 8 elements so that every fragment load of a warp hits 32
 * different banks. V is transposed as it is stored so that the B fragment
 * of P V (two consecutive keys of one head-dim column) is one 32-bit load.
 *
 * Head dims: kernels for HD = 64 and 128; a smaller D (a multiple of 8) is
 * zero-padded to the next one (zero columns add nothing to Q K^T, and the
 * padded output columns are not stored). Any Sq, Skv; GQA (kv head
 * h / (Hq / Hkv)); causal in both alignments, with key blocks past the
 * block's last visible key skipped; LSE (natural log) on request; output
 * in f32, f16 or bf16, any strides.
 *
 * Costs, stated: variant 0 (the default) is the correct-first version:
 * tiles loaded with plain loads (16-byte vectors when the strides allow)
 * between two barriers. Variant 1 (SDPA_CUDA_FLASH_VARIANT=1) streams K and
 * V with cp.async into two buffers and reads fragments with ldmatrix. Both
 * pass the emulated test; which is faster is for the first GPU run to say.
 * On Hopper, wgmma and TMA would come next.
 *
 * Written and compiled without a GPU; scripts/gpu-check.sh is its test.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "plugin.h"
extern const sdpa_cuda_host *sdpa_cuda__host;
sdpa_status sdpa_cuda__flash_run(const sdpa_cuda_call *c);
}

#include "device_memory.h"
#include "flash_kernel.cuh"

template <int BF16, int HD, int PIPE>
static cudaError_t launch(const flash_args *a, int64_t B, cudaStream_t stream)
{
    const size_t bytes = flash_smem_bytes(HD, PIPE);
    cudaError_t e = cudaFuncSetAttribute(flash_fwd<BF16, HD, PIPE>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e != cudaSuccess)
        return e;
    const dim3 grid((unsigned)((a->Sq + BM - 1) / BM), (unsigned)a->Hq, (unsigned)B);
    flash_fwd<BF16, HD, PIPE><<<grid, FLASH_THREADS, bytes, stream>>>(*a);
    return cudaGetLastError();
}

template <int PIPE>
static cudaError_t launch_variant(const flash_args *a, int64_t B, int64_t D, int bf16,
                                  cudaStream_t stream)
{
    if (D <= 64)
        return bf16 ? launch<1, 64, PIPE>(a, B, stream) : launch<0, 64, PIPE>(a, B, stream);
    return bf16 ? launch<1, 128, PIPE>(a, B, stream) : launch<0, 128, PIPE>(a, B, stream);
}

sdpa_status sdpa_cuda__flash_run(const sdpa_cuda_call *c)
{
    const sdpa_call_desc *d = &c->desc;
    if (d->D > 128)
        return sdpa_cuda__host->fail(SDPA_UNSUPPORTED,
                                     "cuda.flash: head_dim %lld needs a kernel for D > 128 (built: "
                                     "64 and 128, smaller D padded)",
                                     (long long)d->D);
    if (d->Hq > 65535 || d->B > 65535 || (d->Sq + BM - 1) / BM > 0x7fffffff)
        return sdpa_cuda__host->fail(SDPA_UNSUPPORTED,
                                     "cuda.flash: grid too large (Hq and B at most 65535)");
    const int device = c->q->device.ordinal;
    cudaError_t ce = cudaSetDevice(device);
    if (ce != cudaSuccess)
        return sdpa_cuda__host->fail(SDPA_DEVICE_ERROR, "cuda.flash: cudaSetDevice(%d): %s",
                                     device, cudaGetErrorString(ce));
    const sdpa_tensor *t[4] = {c->q, c->k, c->v, c->out};
    static const char *names[4] = {"q", "k", "v", "out"};
    for (int i = 0; i < 4; i++) {
        sdpa_status s = sdpa_cuda__check_device("cuda.flash", names[i], t[i]->data, device);
        if (s != SDPA_OK)
            return s;
    }
    if (c->lse) {
        sdpa_status s = sdpa_cuda__check_device("cuda.flash", "lse", c->lse, device);
        if (s != SDPA_OK)
            return s;
    }
    sdpa_status ms = sdpa_cuda__check_mask_arrays("cuda.flash", c, device);
    if (ms != SDPA_OK) /* the mask arrays live with the tensors (sdpa.h) */
        return ms;
    flash_args a;
    flash_args_make(c, &a);
    /* The kernel variant (flash_kernel.cuh): 0, plain loads; 1, cp.async
     * double-buffering and ldmatrix. Neither is measured yet, so the
     * simpler one is the default; scripts/gpu-check.sh times both. The
     * core validated SDPA_CUDA_FLASH_VARIANT when the context was made. */
    const int pipe = c->flash_variant == 1;
    cudaStream_t stream = (cudaStream_t)c->stream;
    const int bf16 = c->q->dtype == SDPA_BF16;
    ce = pipe ? launch_variant<1>(&a, d->B, d->D, bf16, stream)
              : launch_variant<0>(&a, d->B, d->D, bf16, stream);
    if (ce != cudaSuccess)
        return sdpa_cuda__host->fail(ce == cudaErrorMemoryAllocation ? SDPA_OUT_OF_MEMORY
                                                                     : SDPA_DEVICE_ERROR,
                                     "cuda.flash: launch: %s", cudaGetErrorString(ce));
    return SDPA_OK;
}
