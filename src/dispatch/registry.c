/*
 * registry.c - the built-in backend table and the one acceptance check all
 * backends share.
 *
 * Every backend is one descriptor in its own folder (src/cpu/NAME/backend.c,
 * src/ref/ref.c, src/dispatch/cuda_declared.c for the CUDA ones), built in
 * every configuration: a kernel left out of a build keeps its descriptor,
 * never present, so rules can name it and explain says the same about it on
 * every machine. Adding a backend is one row here.
 */
#include "registry.h"
#include "../core/cpu_features.h"

#include <stdio.h>
#include <string.h>

/* In registry order: the order `sdpa info` lists them in. */
#define SDPA_BUILTIN_BACKENDS(X)                                                               \
    X(ref) X(cpu_portable) X(cpu_amx) X(cpu_avx512bf16) X(cpu_avx512) X(cpu_avx2) X(cpu_neon)  \
    X(cpu_blas)                                                                                \
    X(cuda_cudnn) X(cuda_flash) X(cuda_unfused)

#define SDPA_DECLARE_BACKEND(id) extern const sdpa_backend sdpa__backend_##id;
SDPA_BUILTIN_BACKENDS(SDPA_DECLARE_BACKEND)
#define SDPA_LIST_BACKEND(id) &sdpa__backend_##id,
const sdpa_backend *const sdpa__builtin_backends[] = {SDPA_BUILTIN_BACKENDS(SDPA_LIST_BACKEND)
                                                          NULL};

static void dtype_list(unsigned mask, char *buf, size_t n)
{
    buf[0] = '\0';
    for (int t = 0; t < SDPA_DTYPE_COUNT; t++)
        if (mask & SDPA_DTYPE_BIT(t)) {
            size_t len = strlen(buf);
            snprintf(buf + len, n - len, "%s%s", len ? ", " : "", sdpa_dtype_name((sdpa_dtype)t));
        }
}


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
        for (size_t i = 0; i < sdpa__cpu_feature_count; i++)
            if (missing & sdpa__cpu_feature_table[i].bit) {
                sdpa__fmt(why, n, "needs %s, which this platform lacks%s",
                          sdpa__cpu_feature_table[i].title,
                          (sdpa__cpu_feature_table[i].bit == SDPA_CPU_AMX_BF16 &&
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
    if (d->shares > 0 && !c->shares) {
        sdpa__fmt(why, n, "a share of a call (sdpa_forward_share) not supported (%s)",
                  b->device == SDPA_DEVICE_CUDA ? "one launch per call"
                                                : "its regions read what other tasks wrote");
        return 0;
    }
    if (sdpa__mixed_dtypes(d)) {
        const sdpa_dtype kv = sdpa__kv_dtype(d);
        if (!c->mixed_dtypes) {
            sdpa__fmt(why, n, "q %s with k, v %s: mixed dtypes not supported (one dtype for all)",
                      sdpa_dtype_name(d->dtype), sdpa_dtype_name(kv));
            return 0;
        }
        if (!(c->dtypes & SDPA_DTYPE_BIT(kv))) {
            dtype_list(c->dtypes, list, sizeof list);
            sdpa__fmt(why, n, "k, v dtype %s not supported (%s only)", sdpa_dtype_name(kv), list);
            return 0;
        }
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
    if (d->backward && !c->backward) {
        sdpa__strlcpy(why, "has no backward pass, which the call needs", n);
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
    if (d->mask & ~c->masks) {
        char need[64], have[64];
        sdpa__mask_kinds_name(d->mask & ~c->masks, need, sizeof need);
        sdpa__mask_kinds_name(c->masks, have, sizeof have);
        sdpa__fmt(why, n, "%s mask not supported (%s%s)", need, c->masks ? "takes " : "",
                  c->masks ? have : "no masks");
        return 0;
    }
    if (b->check && !b->check(b, d, p, why, n))
        return 0;
    if (n)
        why[0] = '\0';
    return 1;
}
