/*
 * cuda_declared.c - the CUDA backends as the core knows them, with or without
 * the plugin: their capabilities and refusals, stated once, here. The
 * core is built with this file (never with CUDA): the policy names these
 * backends and `sdpa explain --platform cuda:sm_100` shows what such a
 * machine would decide from any laptop. When libsdpa_cuda.so loads, the
 * loader copies each descriptor and takes only run and prepare from the
 * plugin, so what explain promises is what the backend accepts.
 */
#include "../core/backend.h"

/* Until the plugin provides the kernels: say why not. */
static int cuda_absent(const sdpa_backend *self, const sdpa_platform *host, char *why, size_t n)
{
    (void)self;
    if (!host->cuda_present)
        sdpa__fmt(why, n, "not present here: %s", host->cuda_why);
    else
        sdpa__strlcpy(why, "not present here: the CUDA plugin does not implement it yet", n);
    return 0;
}

static sdpa_status cuda_absent_run(const sdpa_backend *self, const sdpa_call *call)
{
    (void)call;
    return sdpa__fail(SDPA_NOT_AVAILABLE, "%s: not present here (no CUDA kernel loaded)",
                      self->name);
}

/* cuDNN's support surface beyond the table: the known-bad releases, and
 * rows that see no key (bottom-right causal with Sq > Skv), which its
 * graph cannot express without a padding mask (with sequence lengths,
 * mask_rows.cu writes such rows after the graph). */
static int cudnn_check(const sdpa_backend *self, const sdpa_call_desc *d, const sdpa_platform *p,
                       char *why, size_t n)
{
    (void)self;
    if (p->cudnn_version >= 91000 && p->cudnn_version <= 91001) {
        sdpa__fmt(why, n, "cuDNN %d.%d.%d fp16/bf16 forward is known-bad (refused)",
                  p->cudnn_version / 10000, p->cudnn_version / 100 % 100,
                  p->cudnn_version % 100);
        return 0;
    }
    if ((d->mask & SDPA_MASK_KIND_SEQ_LEN) && p->cudnn_version < 80903) {
        sdpa__fmt(why, n, "cuDNN %d.%d.%d has no padding mask (sequence lengths need 8.9.3)",
                  p->cudnn_version / 10000, p->cudnn_version / 100 % 100,
                  p->cudnn_version % 100);
        return 0;
    }
    if (d->causal == SDPA_CAUSAL_BOTTOM_RIGHT && d->Sq > d->Skv &&
        !(d->mask & SDPA_MASK_KIND_SEQ_LEN)) {
        sdpa__strlcpy(why,
                      "bottom-right causal with Sq > Skv (rows that see no key) needs sequence "
                      "lengths, which cuDNN's graph takes as its padding mask",
                      n);
        return 0;
    }
    return 1;
}

#define HALF_TYPES (SDPA_DTYPE_BIT(SDPA_F16) | SDPA_DTYPE_BIT(SDPA_BF16))
#define ALL_TYPES (SDPA_DTYPE_BIT(SDPA_F32) | HALF_TYPES)

const sdpa_backend sdpa__backend_cuda_cudnn = {
    .name = "cuda.cudnn",
    .summary = "cuDNN fused attention through the backend graph API",
    .device = SDPA_DEVICE_CUDA,
    .caps = {.dtypes = HALF_TYPES, .d_min = 8, .d_max = 256, .d_multiple = 8, .gqa = 1,
             .cross = 1, .causal_top_left = 1, .causal_bottom_right = 1,
             .masks = SDPA_MASK_KIND_SEQ_LEN, .lse = 1, .deterministic = 1, .min_cc = 80,
             .min_cudnn = 80900},
    .version = "absent",
    .present = cuda_absent,
    .check = cudnn_check,
    .run = cuda_absent_run,
};

const sdpa_backend sdpa__backend_cuda_flash = {
    .name = "cuda.flash",
    .summary = "libsdpa's FlashAttention-2-style CUDA C kernel (mma.sync, D <= 128)",
    .device = SDPA_DEVICE_CUDA,
    .caps = {.dtypes = HALF_TYPES, .d_min = 8, .d_max = 128, .d_multiple = 8, .gqa = 1,
             .cross = 1, .causal_top_left = 1, .causal_bottom_right = 1,
             .masks = SDPA_MASK_KIND_SEQ_LEN | SDPA_MASK_KIND_KEY, .lse = 1,
             .deterministic = 1, .min_cc = 80},
    .version = "absent",
    .present = cuda_absent,
    .run = cuda_absent_run,
};
const sdpa_backend sdpa__backend_cuda_unfused = {
    .name = "cuda.unfused",
    .summary = "cuBLAS batched GEMMs and a softmax kernel; any head dim, fp32 too",
    .device = SDPA_DEVICE_CUDA,
    .caps = {.dtypes = ALL_TYPES, .d_min = 1, .d_max = 1 << 16, .d_multiple = 1, .gqa = 1,
             .cross = 1, .causal_top_left = 1, .causal_bottom_right = 1,
             .masks = SDPA_MASK_KIND_SEQ_LEN | SDPA_MASK_KIND_KEY, .lse = 1,
             .deterministic = 1, .min_cc = 70},
    .fallback_rank = 1,
    .version = "absent",
    .present = cuda_absent,
    .run = cuda_absent_run,
};
