/*
 * info.c - sdpa_info: what this context sees (platform, the kernel it would
 * pick for a plain call, every backend with its capabilities and why it is
 * absent), as the text `sdpa info` prints or as one JSON object for
 * programs (the Python package's libsdpa.info()). One implementation, so
 * the two never disagree. Also sdpa_measure_ceiling: the arithmetic peak
 * every figure of this machine is a fraction of.
 */
#include "context.h"
#include "decide.h"
#include "guard.h"
#include "rule_files.h"
#include "../core/cpu_features.h"
#include "../core/strbuf.h"
#include "../cpu/ceiling.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static const sdpa_cpu_feature *const features = sdpa__cpu_feature_table;

static const char *amx_state(const sdpa_platform *p)
{
    return !(p->cpu_features_present & SDPA_CPU_AMX_BF16) ? "not in this CPU"
           : p->amx_permitted ? "permitted (arch_prctl granted XTILEDATA)"
                              : "present but permission refused by the OS";
}

/* The probe call the "kernel" line reports: f32, B=1, S=1024, H=8, D=128. */
static void probe_decision(sdpa_context *ctx, const char **backend, const char **source,
                           char *rule, size_t n, sdpa_decision *dec)
{
    sdpa_call_desc probe = {.size = sizeof(sdpa_call_desc), .device = SDPA_DEVICE_CPU,
                            .dtype = SDPA_F32, .B = 1, .Sq = 1024, .Skv = 1024, .Hq = 8, .Hkv = 8,
                            .D = 128};
    *backend = NULL, *source = "", rule[0] = '\0';
    if (dec && sdpa_decide(ctx, &probe, dec) == SDPA_OK && dec->n_candidates > 0) {
        *backend = dec->candidates[0];
        *source = sdpa_source_name(dec->source);
        sdpa__strlcpy(rule, dec->rule, n);
    }
}

/* The next line of *text into line (without its newline), advancing
 * *text; 0 at the end. */
static int next_line(const char **text, char *line, size_t n)
{
    if (!**text)
        return 0;
    const char *eol = strchr(*text, '\n');
    const size_t len = eol ? (size_t)(eol - *text) : strlen(*text);
    snprintf(line, n, "%.*s", (int)len, *text);
    *text += len + (eol != NULL);
    return 1;
}

static void dtypes_text(unsigned dtypes, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int t = 0; t < SDPA_DTYPE_COUNT; t++)
        if (dtypes & (1u << t) && len < n)
            len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? "," : "",
                                    sdpa_dtype_name((sdpa_dtype)t));
}

static void info_text(sdpa_context *ctx, sdpa_strbuf *sb, sdpa_decision *dec)
{
    const sdpa_platform *p = sdpa_context_platform(ctx);
    sdpa__sb_printf(sb, "libsdpa %s\n", sdpa_version());
    sdpa__sb_printf(sb, "cpu       %s%s\n", p->cpu_model, p->simulated ? " (simulated platform)" : "");
    if (p->cpu_family)
        sdpa__sb_printf(sb, "vendor    %s, family %d\n", p->cpu_vendor, p->cpu_family);
    else
        sdpa__sb_printf(sb, "vendor    %s\n", p->cpu_vendor[0] ? p->cpu_vendor : "not known");
    sdpa__sb_printf(sb, "isa      ");
    int any = 0;
    for (size_t i = 0; i < sdpa__cpu_feature_count; i++)
        if (p->cpu_features_present & features[i].bit)
            any = 1, sdpa__sb_printf(sb, " %s%s", features[i].name,
                                     (p->cpu_features & features[i].bit) ? "" : "(unusable)");
    sdpa__sb_printf(sb, "%s\n", any ? "" : " none (portable code only)");
    sdpa__sb_printf(sb, "arch      %s\n", p->cpu_arch);
    if (strcmp(p->cpu_arch, SDPA_ARCH_X86_64) == 0) /* AMX's permission is an x86 matter */
        sdpa__sb_printf(sb, "amx       %s\n", amx_state(p));
    const size_t l2 = sdpa__cpu_l2_bytes();
    if (l2 && !p->simulated) /* the machine's, not a described one's */
        sdpa__sb_printf(sb, "cache     L2 %zu KiB per core (sizes the f32 rows that share a K/V copy "
                            "in cpu.avx512)\n",
                        l2 / 1024);
    const int allowed = sdpa__cpus_allowed();
    sdpa__sb_printf(sb, "threads   %d (of %d online CPUs", sdpa_context_threads(ctx), p->cpu_cores);
    if (allowed < p->cpu_cores && !p->simulated)
        sdpa__sb_printf(sb, "; this process may run on %d", allowed);
    sdpa__sb_printf(sb, ")%s\n", ctx->host_for ? ", the caller's parallel-for" : "");
    sdpa__guard_text(sb, ctx, 10);
    if (p->cuda_present)
        sdpa__sb_printf(sb, "cuda      %s, sm_%d%d, cuDNN %d\n", p->gpu_name, p->cc_major,
                        p->cc_minor, p->cudnn_version);
    else
        sdpa__sb_printf(sb, "cuda      none: %s\n", p->cuda_why);
    /* one line per wisdom file looked at, or why there is none */
    const char *w = sdpa_context_wisdom(ctx);
    char line[1024];
    for (int first = 1; next_line(&w, line, sizeof line); first = 0) {
        sdpa__sb_printf(sb, "%s%s", first ? "wisdom    " : "          ", line);
        if (strncmp(line, "in force ", 9) == 0)
            sdpa__sb_printf(sb, " (%d rule%s, %d over shape classes)", ctx->wisdom_rules,
                            ctx->wisdom_rules == 1 ? "" : "s", ctx->wisdom_classes);
        sdpa__sb_printf(sb, "\n");
    }
    const char *backend, *source;
    char rule[64];
    probe_decision(ctx, &backend, &source, rule, sizeof rule, dec);
    if (backend)
        sdpa__sb_printf(sb, "kernel    %s for f32 B=1 S=1024 H=8 D=128 (%s%s%s); see `sdpa explain`\n",
                        backend, source, rule[0] ? " " : "", rule);
    sdpa__sb_printf(sb, "backends\n");
    for (int i = 0; i < sdpa_backend_count(ctx); i++) {
        sdpa_backend_info b;
        sdpa_backend_get(ctx, i, &b);
        char dt[32], step[24] = "", masks[80] = "";
        dtypes_text(b.dtypes, dt, sizeof dt);
        if (b.head_dim_multiple > 1)
            snprintf(step, sizeof step, " step %d", b.head_dim_multiple);
        if (b.masks) {
            char kinds[64];
            sdpa__mask_kinds_name(b.masks, kinds, sizeof kinds);
            snprintf(masks, sizeof masks, " masks:%s", kinds);
        }
        sdpa__sb_printf(sb, "  %-14s %-8s %-6s %-13s D %d..%d%s%s%s%s%s%s  %s\n", b.name,
                        b.version, b.device == SDPA_DEVICE_CUDA ? "cuda" : "cpu", dt,
                        b.head_dim_min, b.head_dim_max, step, b.lse ? " lse" : "",
                        b.backward ? " backward" : "", b.mixed_dtypes ? " mixed" : "",
                        b.product_bits == 8 ? " P in bf16" : "",
                        masks,
                        b.present ? "present" : b.why_absent);
    }
}

static void json_key(sdpa_strbuf *sb, const char *key, const char *value, int comma)
{
    sdpa__sb_printf(sb, "%s\"%s\":", comma ? "," : "", key);
    if (value)
        sdpa__sb_json_string(sb, value);
    else
        sdpa__sb_printf(sb, "null");
}

static void info_json(sdpa_context *ctx, sdpa_strbuf *sb, sdpa_decision *dec)
{
    const sdpa_platform *p = sdpa_context_platform(ctx);
    sdpa__sb_printf(sb, "{\"version\":\"%s\",\"cpu\":{", sdpa_version());
    json_key(sb, "model", p->cpu_model, 0);
    json_key(sb, "vendor", p->cpu_vendor, 1);
    json_key(sb, "arch", p->cpu_arch, 1);
    sdpa__sb_printf(sb, ",\"family\":%d", p->cpu_family);
    sdpa__sb_printf(sb, ",\"l2_bytes\":%zu", p->simulated ? (size_t)0 : sdpa__cpu_l2_bytes());
    sdpa__sb_printf(sb, ",\"simulated\":%s,\"isa\":[", p->simulated ? "true" : "false");
    int n = 0;
    for (size_t i = 0; i < sdpa__cpu_feature_count; i++)
        if (p->cpu_features & features[i].bit)
            sdpa__sb_printf(sb, "%s\"%s\"", n++ ? "," : "", features[i].name);
    sdpa__sb_printf(sb, "],\"isa_unusable\":[");
    n = 0;
    for (size_t i = 0; i < sdpa__cpu_feature_count; i++)
        if ((p->cpu_features_present & features[i].bit) && !(p->cpu_features & features[i].bit))
            sdpa__sb_printf(sb, "%s\"%s\"", n++ ? "," : "", features[i].name);
    sdpa__sb_printf(sb, "]");
    json_key(sb, "amx", amx_state(p), 1);
    sdpa__sb_printf(sb, ",\"threads\":%d,\"cores\":%d,\"host_parallel_for\":%s}",
                    sdpa_context_threads(ctx), p->cpu_cores, ctx->host_for ? "true" : "false");
    sdpa__sb_printf(sb, ",\"finite_guard\":{\"on\":%s,\"events\":%lld}",
                    atomic_load(&ctx->finite_guard) ? "true" : "false",
                    (long long)sdpa_context_guard_events(ctx));
    sdpa__sb_printf(sb, ",\"cuda\":{\"present\":%s", p->cuda_present ? "true" : "false");
    if (p->cuda_present) {
        json_key(sb, "name", p->gpu_name, 1);
        sdpa__sb_printf(sb, ",\"cc\":%d,\"cudnn\":%d,\"sm_count\":%d,\"memory_bytes\":%lld}",
                        p->cc_major * 10 + p->cc_minor, p->cudnn_version, p->sm_count,
                        (long long)p->memory_bytes);
    } else {
        json_key(sb, "why", p->cuda_why, 1);
        sdpa__sb_printf(sb, "}");
    }
    /* wisdom: {"in_force": [paths], "ignored": [{"path", "why"}], "note"}, from
     * sdpa_context_wisdom's lines ("in force PATH", "ignored PATH: why", or
     * one line saying why there is none) */
    sdpa_strbuf ignored = {NULL, 0, 0, 0};
    char line[1024], note[1024] = "";
    int n_force = 0, n_ignored = 0;
    sdpa__sb_printf(sb, ",\"wisdom\":{\"in_force\":[");
    for (const char *w = sdpa_context_wisdom(ctx); next_line(&w, line, sizeof line);) {
        char *colon = strstr(line, ": ");
        if (strncmp(line, "in force ", 9) == 0) {
            sdpa__sb_printf(sb, "%s", n_force++ ? "," : "");
            sdpa__sb_json_string(sb, line + 9);
        } else if (strncmp(line, "ignored ", 8) == 0 && colon) {
            *colon = '\0';
            sdpa__sb_printf(&ignored, "%s{", n_ignored++ ? "," : "");
            json_key(&ignored, "path", line + 8, 0);
            json_key(&ignored, "why", colon + 2, 1);
            sdpa__sb_printf(&ignored, "}");
        } else {
            snprintf(note, sizeof note, "%s", line);
        }
    }
    char *ig = sdpa__sb_take(&ignored);
    sdpa__sb_printf(sb, "],\"rules\":%d,\"classes\":%d,\"ignored\":[%s]", ctx->wisdom_rules,
                    ctx->wisdom_classes, ig ? ig : "");
    free(ig);
    json_key(sb, "note", note[0] ? note : NULL, 1);
    sdpa__sb_printf(sb, "}");
    const char *backend, *source;
    char rule[64];
    probe_decision(ctx, &backend, &source, rule, sizeof rule, dec);
    sdpa__sb_printf(sb, ",\"kernel\":{\"call\":\"f32 B=1 S=1024 H=8 D=128\"");
    json_key(sb, "backend", backend, 1);
    json_key(sb, "source", source, 1);
    json_key(sb, "rule", rule, 1);
    sdpa__sb_printf(sb, "},\"backends\":[");
    for (int i = 0; i < sdpa_backend_count(ctx); i++) {
        sdpa_backend_info b;
        sdpa_backend_get(ctx, i, &b);
        sdpa__sb_printf(sb, "%s{", i ? "," : "");
        json_key(sb, "name", b.name, 0);
        json_key(sb, "version", b.version, 1);
        json_key(sb, "summary", b.summary, 1);
        json_key(sb, "device", b.device == SDPA_DEVICE_CUDA ? "cuda" : "cpu", 1);
        sdpa__sb_printf(sb, ",\"dtypes\":[");
        n = 0;
        for (int t = 0; t < SDPA_DTYPE_COUNT; t++)
            if (b.dtypes & (1u << t))
                sdpa__sb_printf(sb, "%s\"%s\"", n++ ? "," : "", sdpa_dtype_name((sdpa_dtype)t));
        sdpa__sb_printf(sb, "],\"cpu_features\":[");
        n = 0;
        for (size_t k = 0; k < sdpa__cpu_feature_count; k++)
            if (b.cpu_features & features[k].bit)
                sdpa__sb_printf(sb, "%s\"%s\"", n++ ? "," : "", features[k].name);
        sdpa__sb_printf(sb, "],\"masks\":[");
        n = 0;
        for (unsigned bit = 1; bit <= SDPA_MASK_KIND_BLOCKS; bit <<= 1)
            if (b.masks & bit) { /* the names are the core's (sdpa__mask_kinds_name) */
                char name[16];
                sdpa__mask_kinds_name(bit, name, sizeof name);
                sdpa__sb_printf(sb, "%s\"%s\"", n++ ? "," : "", name);
            }
        sdpa__sb_printf(sb,
                        "],\"head_dim_min\":%d,\"head_dim_max\":%d,\"head_dim_multiple\":%d,"
                        "\"gqa\":%s,\"cross\":%s,\"causal_top_left\":%s,"
                        "\"causal_bottom_right\":%s,\"lse\":%s,\"deterministic\":%s,"
                        "\"product_bits\":%d,\"backward\":%s,\"mixed_dtypes\":%s,"
                        "\"present\":%s",
                        b.head_dim_min, b.head_dim_max, b.head_dim_multiple,
                        b.gqa ? "true" : "false", b.cross ? "true" : "false",
                        b.causal_top_left ? "true" : "false",
                        b.causal_bottom_right ? "true" : "false", b.lse ? "true" : "false",
                        b.deterministic ? "true" : "false", b.product_bits,
                        b.backward ? "true" : "false", b.mixed_dtypes ? "true" : "false",
                        b.present ? "true" : "false");
        json_key(sb, "why_absent", b.present ? NULL : b.why_absent, 1);
        sdpa__sb_printf(sb, "}");
    }
    sdpa__sb_printf(sb, "]}");
}

sdpa_status sdpa_info(sdpa_context *ctx, int json, char **text)
{
    if (!ctx || !text)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "%s is NULL, expected a %s", ctx ? "text" : "ctx",
                          ctx ? "char ** for the result" : "context");
    *text = NULL;
    sdpa_strbuf sb = {NULL, 0, 0, 0};
    sdpa_decision *dec = sdpa__malloc(sizeof *dec);
    if (json)
        info_json(ctx, &sb, dec);
    else
        info_text(ctx, &sb, dec);
    free(dec);
    *text = sdpa__sb_take(&sb);
    if (!*text || !dec)
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "info: cannot allocate its text");
    sdpa__clear_error();
    return SDPA_OK;
}

sdpa_status sdpa_measure_ceiling(sdpa_context *ctx, const char *what, double *gflops,
                                 const char **isa)
{
    if (!ctx || !what || !gflops)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "%s is NULL",
                          !ctx ? "ctx" : !what ? "what" : "gflops");
    *gflops = 0;
    sdpa_pool *pool;
    sdpa_status st = sdpa__ctx_pool(ctx, &pool);
    if (st != SDPA_OK)
        return st;
    return sdpa__cpu_ceiling(pool, ctx->backends, ctx->n_backends, ctx->host.cpu_features, what,
                             gflops, isa);
}
