/*
 * registry.c - the built-in backend table and the one acceptance check all
 * backends share.
 *
 * The CUDA backends are listed with their capabilities even though this
 * build has no CUDA plugin: the policy names them, and `sdpa explain
 * --platform cuda:sm_100` must show what such a machine would decide.
 */
#include "backend.h"

#include <stdio.h>
#include <string.h>

/* Placeholders until the plugin provides the kernels: say why not. */
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

/* cuDNN's own support surface beyond the table: the known-bad releases. */
static int cudnn_check(const sdpa_backend *self, const sdpa_call_desc *d, const sdpa_platform *p,
                       char *why, size_t n)
{
    (void)self, (void)d;
    if (p->cudnn_version >= 91000 && p->cudnn_version <= 91001) {
        sdpa__fmt(why, n, "cuDNN %d.%d.%d fp16/bf16 forward is known-bad (refused)",
                  p->cudnn_version / 10000, p->cudnn_version / 100 % 100,
                  p->cudnn_version % 100);
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
             .cross = 1, .causal_top_left = 1, .causal_bottom_right = 1, .lse = 1,
             .deterministic = 1, .min_cc = 80, .min_cudnn = 80900},
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
             .cross = 1, .causal_top_left = 1, .causal_bottom_right = 1, .lse = 1,
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
             .cross = 1, .causal_top_left = 1, .causal_bottom_right = 1, .lse = 1,
             .deterministic = 1, .min_cc = 70},
    .fallback_rank = 1,
    .version = "absent",
    .present = cuda_absent,
    .run = cuda_absent_run,
};

#ifndef SDPA_HAVE_X86_KERNELS
/* Not x86-64: the ISA backends are known by name (rules mention them) but
 * never present. */
static int x86_absent(const sdpa_backend *self, const sdpa_platform *host, char *why, size_t n)
{
    (void)self, (void)host;
    sdpa__strlcpy(why, "not built: x86-64 kernels, this build is for another architecture", n);
    return 0;
}

static sdpa_status x86_absent_run(const sdpa_backend *self, const sdpa_call *call)
{
    (void)call;
    return sdpa__fail(SDPA_NOT_AVAILABLE, "%s: not built for this architecture", self->name);
}

const sdpa_backend sdpa__backend_cpu_avx512 = {
    .name = "cpu.avx512", .summary = "AVX-512 fp32 tiled kernel (x86-64 only)",
    .device = SDPA_DEVICE_CPU,
    .caps = {.dtypes = ALL_TYPES, .d_min = 1, .d_max = 512, .d_multiple = 1, .gqa = 1,
             .cross = 1, .causal_top_left = 1, .causal_bottom_right = 1, .lse = 1,
             .deterministic = 1, .cpu_features = SDPA_CPU_AVX512F},
    .version = "absent", .present = x86_absent, .run = x86_absent_run,
};

const sdpa_backend sdpa__backend_cpu_avx2 = {
    .name = "cpu.avx2", .summary = "AVX2 fp32 tiled kernel (x86-64 only)",
    .device = SDPA_DEVICE_CPU,
    .caps = {.dtypes = ALL_TYPES, .d_min = 1, .d_max = 512, .d_multiple = 1, .gqa = 1,
             .cross = 1, .causal_top_left = 1, .causal_bottom_right = 1, .lse = 1,
             .deterministic = 1, .cpu_features = SDPA_CPU_AVX2},
    .version = "absent", .present = x86_absent, .run = x86_absent_run,
};

const sdpa_backend sdpa__backend_cpu_amx = {
    .name = "cpu.amx", .summary = "AMX-BF16 tiled kernel (x86-64 only)",
    .device = SDPA_DEVICE_CPU,
    .caps = {.dtypes = HALF_TYPES, .d_min = 1, .d_max = 512, .d_multiple = 1, .gqa = 1,
             .cross = 1, .causal_top_left = 1, .causal_bottom_right = 1, .lse = 1,
             .deterministic = 1,
             .cpu_features = SDPA_CPU_AMX_BF16 | SDPA_CPU_AVX512F | SDPA_CPU_AVX512BF16,
             .product_bits = 8},
    .version = "absent", .present = x86_absent, .run = x86_absent_run,
};

const sdpa_backend sdpa__backend_cpu_avx512bf16 = {
    .name = "cpu.avx512bf16", .summary = "AVX512-BF16 tiled kernel (x86-64 only)",
    .device = SDPA_DEVICE_CPU,
    .caps = {.dtypes = HALF_TYPES, .d_min = 1, .d_max = 512, .d_multiple = 1, .gqa = 1,
             .cross = 1, .causal_top_left = 1, .causal_bottom_right = 1, .lse = 1,
             .deterministic = 1, .cpu_features = SDPA_CPU_AVX512F | SDPA_CPU_AVX512BF16,
             .product_bits = 8},
    .version = "absent", .present = x86_absent, .run = x86_absent_run,
};
#endif

#ifndef SDPA_HAVE_OPENBLAS
static int blas_absent(const sdpa_backend *self, const sdpa_platform *host, char *why, size_t n)
{
    (void)self, (void)host;
    sdpa__strlcpy(why, "not built: OpenBLAS (cblas.h, libopenblas) was not found at build time",
                  n);
    return 0;
}

static sdpa_status blas_absent_run(const sdpa_backend *self, const sdpa_call *call)
{
    (void)call;
    return sdpa__fail(SDPA_NOT_AVAILABLE, "%s: not built (no OpenBLAS at build time)",
                      self->name);
}

const sdpa_backend sdpa__backend_cpu_blas = {
    .name = "cpu.blas", .summary = "unfused OpenBLAS baseline (not built)",
    .device = SDPA_DEVICE_CPU,
    .caps = {.dtypes = SDPA_DTYPE_BIT(SDPA_F32), .d_min = 1, .d_max = 4096, .d_multiple = 1,
             .gqa = 1, .cross = 1, .causal_top_left = 1, .causal_bottom_right = 1, .lse = 1,
             .deterministic = 1},
    .version = "absent", .present = blas_absent, .run = blas_absent_run,
};
#endif

const sdpa_backend *const sdpa__builtin_backends[] = {
    &sdpa__backend_ref,        &sdpa__backend_cpu_portable, &sdpa__backend_cpu_amx,
    &sdpa__backend_cpu_avx512bf16, &sdpa__backend_cpu_avx512, &sdpa__backend_cpu_avx2,
    &sdpa__backend_cpu_blas,
    &sdpa__backend_cuda_cudnn, &sdpa__backend_cuda_flash,  &sdpa__backend_cuda_unfused,
    NULL,
};

static void dtype_list(unsigned mask, char *buf, size_t n)
{
    buf[0] = '\0';
    for (int t = 0; t < SDPA_DTYPE_COUNT; t++)
        if (mask & SDPA_DTYPE_BIT(t)) {
            size_t len = strlen(buf);
            snprintf(buf + len, n - len, "%s%s", len ? ", " : "", sdpa_dtype_name((sdpa_dtype)t));
        }
}

static const struct {
    unsigned bit;
    const char *name;
} cpu_feature_names[] = {
    {SDPA_CPU_AVX2, "AVX2+FMA"},       {SDPA_CPU_AVX512F, "AVX-512"},
    {SDPA_CPU_AVX512BF16, "AVX512-BF16"}, {SDPA_CPU_AVX512FP16, "AVX512-FP16"},
    {SDPA_CPU_AMX_BF16, "AMX-BF16"},   {SDPA_CPU_NEON, "NEON"},
};

int sdpa__backend_present(const sdpa_backend *b, const sdpa_platform *host, char *why, size_t n)
{
    if (n)
        why[0] = '\0';
    return b->present ? b->present(b, host, why, n) : 1;
}

int sdpa__backend_accepts(const sdpa_backend *b, const sdpa_platform *p,
                          const sdpa_call_desc *d, char *why, size_t n)
{
    const sdpa_caps *c = &b->caps;
    char list[64];
    if (b->device != d->device) {
        sdpa__fmt(why, n, "runs on %s, the call is on %s",
                  b->device == SDPA_DEVICE_CUDA ? "CUDA" : "the CPU",
                  d->device == SDPA_DEVICE_CUDA ? "CUDA" : "the CPU");
        return 0;
    }
    if (b->device == SDPA_DEVICE_CUDA) {
        if (!p->cuda_present) {
            sdpa__fmt(why, n, "no CUDA device: %s", p->cuda_why);
            return 0;
        }
        if (c->min_cc && p->cc_major * 10 + p->cc_minor < c->min_cc) {
            sdpa__fmt(why, n, "needs compute capability >= %d.%d, the platform has %d.%d",
                      c->min_cc / 10, c->min_cc % 10, p->cc_major, p->cc_minor);
            return 0;
        }
        if (c->min_cudnn && p->cudnn_version < c->min_cudnn) {
            sdpa__fmt(why, n, "needs cuDNN >= %d, the platform has %s%d", c->min_cudnn,
                      p->cudnn_version ? "" : "none: ", p->cudnn_version);
            return 0;
        }
    }
    unsigned missing = c->cpu_features & ~p->cpu_features;
    if (missing) {
        for (size_t i = 0; i < sizeof cpu_feature_names / sizeof *cpu_feature_names; i++)
            if (missing & cpu_feature_names[i].bit) {
                sdpa__fmt(why, n, "needs %s, which this platform lacks%s", cpu_feature_names[i].name,
                          (cpu_feature_names[i].bit == SDPA_CPU_AMX_BF16 &&
                           (p->cpu_features_present & SDPA_CPU_AMX_BF16))
                              ? " (AMX present but the OS refused permission)"
                              : "");
                return 0;
            }
    }
    if (!(c->dtypes & SDPA_DTYPE_BIT(d->dtype))) {
        dtype_list(c->dtypes, list, sizeof list);
        sdpa__fmt(why, n, "dtype %s not supported (%s only)", sdpa_dtype_name(d->dtype), list);
        return 0;
    }
    if (d->D < c->d_min || d->D > c->d_max || d->D % c->d_multiple != 0) {
        if (c->d_multiple > 1)
            sdpa__fmt(why, n, "head_dim %lld not supported (multiple of %d in %d..%d)",
                      (long long)d->D, c->d_multiple, c->d_min, c->d_max);
        else
            sdpa__fmt(why, n, "head_dim %lld not supported (%d..%d)", (long long)d->D, c->d_min,
                      c->d_max);
        return 0;
    }
    if (d->Hq != d->Hkv && !c->gqa) {
        sdpa__fmt(why, n, "grouped-query (Hq %lld != Hkv %lld) not supported", (long long)d->Hq,
                  (long long)d->Hkv);
        return 0;
    }
    if (d->Sq != d->Skv && !c->cross) {
        sdpa__fmt(why, n, "cross-attention (Sq %lld != Skv %lld) not supported",
                  (long long)d->Sq, (long long)d->Skv);
        return 0;
    }
    if ((d->causal == SDPA_CAUSAL_TOP_LEFT && !c->causal_top_left) ||
        (d->causal == SDPA_CAUSAL_BOTTOM_RIGHT && !c->causal_bottom_right)) {
        sdpa__fmt(why, n, "causal %s not supported", sdpa_causal_name(d->causal));
        return 0;
    }
    if (d->want_lse && !c->lse) {
        sdpa__strlcpy(why, "does not produce the LSE, which the call asks for", n);
        return 0;
    }
    if (d->deterministic && !c->deterministic) {
        sdpa__strlcpy(why, "not deterministic, which the call asks for", n);
        return 0;
    }
    if (b->check && !b->check(b, d, p, why, n))
        return 0;
    if (n)
        why[0] = '\0';
    return 1;
}
