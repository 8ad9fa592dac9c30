/* explain.c - `sdpa explain`: the dispatcher's decision for a call, and why. */
#include "commands.h"
#include "sparse_spec.h"
#include "tool.h"

#include <string.h>

int cmd_explain(int argc, char **argv)
{
    tool_flag f[] = {{"--shape", 1, NULL},     {"--dtype", 1, NULL},     {"--causal", 1, NULL},
                {"--lse", 0, NULL},       {"--platform", 1, NULL},  {"--quant", 1, NULL},
                {"--component", 1, NULL}, {"--backend", 1, NULL},   {"--json", 0, NULL},
                {"--deterministic", 0, NULL}, {"--mask", 1, NULL}, {"--backward", 0, NULL},
                {"--sparse", 1, NULL}, {"--kv-dtype", 1, NULL}};
    enum { SHAPE, DTYPE, CAUSAL, LSE, PLATFORM, QUANT, COMPONENT, BACKEND, JSON, DET, MASK,
           BACKWARD, SPARSE, KV_DTYPE, NF };
    int rc = tool_parse_flags(argc, argv, f, NF);
    if (rc)
        return rc;
    sdpa_call_desc d;
    memset(&d, 0, sizeof d);
    if (!f[SHAPE].value || !tool_parse_shape(f[SHAPE].value, &d))
        return tool_usage_error("explain: --shape B,Sq,Skv,Hq,Hkv,D is required (six positive "
                                "integers), got '%s'",
                                f[SHAPE].value ? f[SHAPE].value : "");
    d.device = f[PLATFORM].value && strncmp(f[PLATFORM].value, "cuda", 4) == 0 ? SDPA_DEVICE_CUDA
                                                                              : SDPA_DEVICE_CPU;
    d.dtype = d.device == SDPA_DEVICE_CUDA ? SDPA_BF16 : SDPA_F32;
    if (f[DTYPE].value && !tool_parse_dtype(f[DTYPE].value, &d.dtype))
        return tool_usage_error("--dtype '%s' unknown, expected f32, f16 or bf16", f[DTYPE].value);
    if (f[KV_DTYPE].value) { /* k and v's, when not q's (mixed) */
        sdpa_dtype kv;
        if (!tool_parse_dtype(f[KV_DTYPE].value, &kv))
            return tool_usage_error("--kv-dtype '%s' unknown, expected f32, f16 or bf16",
                                    f[KV_DTYPE].value);
        d.kv_dtype = kv != d.dtype ? SDPA_KV_DTYPE(kv) : 0;
    }
    if (f[CAUSAL].value && !tool_parse_causal(f[CAUSAL].value, &d.causal))
        return tool_usage_error("--causal '%s' unknown, expected none, top-left or bottom-right",
                                f[CAUSAL].value);
    if (f[MASK].value && !tool_parse_mask_kinds(f[MASK].value, &d.mask))
        return tool_usage_error("--mask '%s' unknown, expected none, seq_len, key, general, "
                                "window or blocks (a comma list for several)",
                                f[MASK].value);
    /* a sparse pattern: its kind joins the call's masks, its density is printed */
    sparse_pattern sp = {0};
    if (f[SPARSE].value) {
        char err[256];
        if (sparse_spec_build(f[SPARSE].value, &d, &sp, err, sizeof err) != 0)
            return tool_usage_error("--sparse %s", err);
        d.mask |= sparse_spec_kind(f[SPARSE].value);
    }
    d.want_lse = f[LSE].value != NULL;
    d.deterministic = f[DET].value != NULL;
    d.backward = f[BACKWARD].value != NULL; /* sdpa_backward: it needs the forward's LSE */
    if (d.backward)
        d.want_lse = 1;
    d.quant = f[QUANT].value;
    d.component = f[COMPONENT].value;
    d.backend = f[BACKEND].value;
    sdpa_context *ctx;
    if ((rc = tool_context(f[PLATFORM].value, 1, &ctx)) != 0) {
        sparse_pattern_free(&sp);
        return rc;
    }
    char *text;
    sdpa_status st = sdpa_explain(ctx, &d, f[JSON].value != NULL, &text);
    if (st != SDPA_OK) {
        rc = tool_lib_error("explain", st);
    } else if (f[SPARSE].value && f[JSON].value) { /* one more member of the object */
        const size_t n = strlen(text);
        printf("%.*s,\"sparse\":{\"spec\":\"%s\",\"density\":%.4f}}\n",
               (int)(n > 0 ? n - 1 : 0), text, f[SPARSE].value, sp.density);
        sdpa_free(text);
    } else {
        printf("%s%s", text, f[JSON].value ? "\n" : "");
        if (f[SPARSE].value)
            printf("sparse     %s: the call visits %.1f%% of its (query, key) pairs "
                   "(block sparsity %.1f%%)\n",
                   f[SPARSE].value, 100.0 * sp.density, 100.0 * (1.0 - sp.density));
        sdpa_free(text);
    }
    sparse_pattern_free(&sp);
    sdpa_context_destroy(ctx);
    return rc;
}

