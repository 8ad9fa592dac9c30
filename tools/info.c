/* info.c - `sdpa info`: the platform, the kernel choice and every backend. */
#include "commands.h"
#include "tool.h"

#include <stdlib.h>
#include <string.h>

int cmd_info(int argc, char **argv)
{
    tool_flag f[] = {{"--platform", 1, NULL}};
    int rc = tool_parse_flags(argc, argv, f, 1);
    if (rc)
        return rc;
    sdpa_context *ctx;
    if ((rc = tool_context(f[0].value, 0, &ctx)) != 0)
        return rc;
    const sdpa_platform *p = sdpa_context_platform(ctx);
    static const struct {
        unsigned bit;
        const char *name;
    } feats[] = {{SDPA_CPU_AVX2, "avx2+fma"},         {SDPA_CPU_AVX512F, "avx512"},
                 {SDPA_CPU_AVX512BF16, "avx512bf16"}, {SDPA_CPU_AVX512FP16, "avx512fp16"},
                 {SDPA_CPU_AMX_BF16, "amx-bf16"},     {SDPA_CPU_NEON, "neon"}};
    printf("libsdpa %s\n", sdpa_version());
    printf("cpu       %s%s\n", p->cpu_model, p->simulated ? " (simulated platform)" : "");
    printf("isa       ");
    for (size_t i = 0; i < sizeof feats / sizeof *feats; i++)
        if (p->cpu_features_present & feats[i].bit)
            printf("%s%s ", feats[i].name, (p->cpu_features & feats[i].bit) ? "" : "(unusable)");
    printf("\n");
    printf("amx       %s\n",
           !(p->cpu_features_present & SDPA_CPU_AMX_BF16) ? "not in this CPU"
           : p->amx_permitted ? "permitted (arch_prctl granted XTILEDATA)"
                              : "present but permission refused by the OS");
    printf("threads   %d (of %d online CPUs)\n", sdpa_context_threads(ctx), p->cpu_cores);
    if (p->cuda_present)
        printf("cuda      %s, sm_%d%d, cuDNN %d\n", p->gpu_name, p->cc_major, p->cc_minor,
               p->cudnn_version);
    else
        printf("cuda      none: %s\n", p->cuda_why);
    sdpa_call_desc probe = {SDPA_DEVICE_CPU, SDPA_F32, 1, 1024, 1024, 8, 8, 128,
                            SDPA_CAUSAL_NONE, 0, 0, NULL, NULL, NULL, 0};
    sdpa_decision *dec = malloc(sizeof *dec);
    if (dec && sdpa_decide(ctx, &probe, dec) == SDPA_OK && dec->n_candidates > 0)
        printf("kernel    %s for f32 B=1 S=1024 H=8 D=128 (%s%s%s); see `sdpa explain`\n",
               dec->candidates[0], sdpa_source_name(dec->source), dec->rule[0] ? " " : "",
               dec->rule);
    free(dec);
    printf("backends\n");
    for (int i = 0; i < sdpa_backend_count(ctx); i++) {
        sdpa_backend_info b;
        sdpa_backend_get(ctx, i, &b);
        char dt[32] = "";
        for (int t = 0; t < SDPA_DTYPE_COUNT; t++)
            if (b.dtypes & (1u << t)) {
                size_t len = strlen(dt);
                snprintf(dt + len, sizeof dt - len, "%s%s", len ? "," : "",
                         sdpa_dtype_name((sdpa_dtype)t));
            }
        char step[24] = "";
        if (b.head_dim_multiple > 1)
            snprintf(step, sizeof step, " step %d", b.head_dim_multiple);
        printf("  %-14s %-8s %-6s %-13s D %d..%d%s%s%s%s  %s\n", b.name, b.version,
               b.device == SDPA_DEVICE_CUDA ? "cuda" : "cpu", dt, b.head_dim_min,
               b.head_dim_max, step, b.lse ? " lse" : "",
               b.product_bits == 8 ? " P in bf16" : "",
               b.masks == (SDPA_MASK_KIND_SEQ_LEN | SDPA_MASK_KIND_KEY | SDPA_MASK_KIND_GENERAL)
                   ? " masks"
                   : "",
               b.present ? "present" : b.why_absent);
    }
    sdpa_context_destroy(ctx);
    return 0;
}

