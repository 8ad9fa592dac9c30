/*
 * sdpa.c - the command-line tool:
 *
 *   sdpa run      attention on .npy files
 *   sdpa explain  the dispatcher's decision for a call, and why
 *   sdpa bench    interleaved timing of backends on shape suites (bench.c)
 *   sdpa check    numerics of every backend against the reference (check.c)
 *   sdpa ab       interleaved A/B of two backends or rule files (ab.c)
 *   sdpa tune     policy rules from measurements (tune.c)
 *   sdpa dit      a small diffusion transformer end to end (dit.c, image.c)
 *   sdpa info     the platform and the backends
 *
 * Errors are one line on stderr and a non-zero exit: 2 for bad usage, 1
 * when the library refused or failed. No output file is left behind on
 * failure.
 */
#define _POSIX_C_SOURCE 200809L
#include "tool.h"
#include "npy.h"
#include "../src/core/half.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int tool_usage_error(const char *fmt, ...)
{
    va_list ap;
    fputs("sdpa: error: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return 2;
}

int tool_lib_error(const char *what, sdpa_status st)
{
    fprintf(stderr, "sdpa: error: %s: %s: %s\n", what, sdpa_status_string(st), sdpa_last_error());
    return 1;
}

int tool_parse_dtype(const char *s, sdpa_dtype *out)
{
    for (int t = 0; t < SDPA_DTYPE_COUNT; t++)
        if (strcmp(s, sdpa_dtype_name((sdpa_dtype)t)) == 0)
            return *out = (sdpa_dtype)t, 1;
    return 0;
}

int tool_parse_causal(const char *s, sdpa_causal *out)
{
    for (int c = 0; c <= SDPA_CAUSAL_BOTTOM_RIGHT; c++)
        if (strcmp(s, sdpa_causal_name((sdpa_causal)c)) == 0)
            return *out = (sdpa_causal)c, 1;
    return 0;
}

int tool_parse_int(const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return 0;
    *out = v;
    return 1;
}

int tool_parse_shape(const char *s, sdpa_call_desc *d)
{
    int64_t *dst[6] = {&d->B, &d->Sq, &d->Skv, &d->Hq, &d->Hkv, &d->D};
    char buf[256];
    if (strlen(s) >= sizeof buf)
        return 0;
    strcpy(buf, s);
    char *save = NULL, *tok = strtok_r(buf, ",", &save);
    for (int i = 0; i < 6; i++, tok = strtok_r(NULL, ",", &save)) {
        long long v;
        if (!tok || !tool_parse_int(tok, 1, (long long)1 << 40, &v))
            return 0;
        *dst[i] = v;
    }
    return tok == NULL;
}

double tool_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int tool_context(const char *platform, int threads, sdpa_context **ctx)
{
    sdpa_platform plat;
    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    sdpa_status st;
    if (platform) {
        if ((st = sdpa_platform_parse(platform, &plat)) != SDPA_OK)
            return tool_usage_error("--platform: %s", sdpa_last_error());
        o.platform = &plat;
    }
    o.threads = threads;
    if ((st = sdpa_context_create(&o, ctx)) != SDPA_OK)
        return tool_lib_error("cannot create a context", st);
    return 0;
}

int tool_parse_flags(int argc, char **argv, tool_flag *flags, int n)
{
    for (int i = 0; i < argc; i++) {
        int k = 0;
        while (k < n && strcmp(argv[i], flags[k].name) != 0)
            k++;
        if (k == n) {
            char known[512] = "";
            for (int j = 0; j < n; j++) {
                size_t len = strlen(known);
                snprintf(known + len, sizeof known - len, "%s%s", j ? " " : "", flags[j].name);
            }
            return tool_usage_error("unknown flag '%s' (expected: %s)", argv[i], known);
        }
        if (flags[k].value)
            return tool_usage_error("flag %s given twice", argv[i]);
        if (flags[k].takes_value) {
            if (i + 1 >= argc)
                return tool_usage_error("flag %s needs a value", argv[i]);
            flags[k].value = argv[++i];
        } else {
            flags[k].value = "1";
        }
    }
    return 0;
}

/* ---- run */

static void *convert_input(const npy_array *a, sdpa_dtype dtype)
{
    size_t n = (size_t)a->count;
    void *dst = malloc((n ? n : 1) * sdpa_dtype_size(dtype));
    if (!dst)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        float x = a->is_f16 ? sdpa__f16_to_f32(((const uint16_t *)a->data)[i])
                            : ((const float *)a->data)[i];
        if (dtype == SDPA_F32)
            ((float *)dst)[i] = x;
        else if (dtype == SDPA_F16)
            ((uint16_t *)dst)[i] = sdpa__f32_to_f16(x);
        else
            ((uint16_t *)dst)[i] = sdpa__f32_to_bf16(x);
    }
    return dst;
}

static int cmd_run(int argc, char **argv)
{
    tool_flag f[] = {{"--q", 1, NULL},      {"--k", 1, NULL},       {"--v", 1, NULL},
                {"--out", 1, NULL},    {"--lse", 1, NULL},     {"--backend", 1, NULL},
                {"--causal", 1, NULL}, {"--scale", 1, NULL},   {"--dtype", 1, NULL},
                {"--threads", 1, NULL}};
    enum { Q, K, V, OUT, LSE, BACKEND, CAUSAL, SCALE, DTYPE, THREADS, NF };
    int rc = tool_parse_flags(argc, argv, f, NF);
    if (rc)
        return rc;
    for (int i = Q; i <= OUT; i++)
        if (!f[i].value)
            return tool_usage_error("run: %s FILE is required", f[i].name);
    sdpa_params p = SDPA_PARAMS_DEFAULT;
    if (f[CAUSAL].value && !tool_parse_causal(f[CAUSAL].value, &p.causal))
        return tool_usage_error("--causal '%s' unknown, expected none, top-left or bottom-right",
                                f[CAUSAL].value);
    if (f[SCALE].value) {
        char *end;
        p.scale = strtod(f[SCALE].value, &end);
        if (*end || end == f[SCALE].value || p.scale == 0.0)
            return tool_usage_error("--scale '%s' is not a non-zero number", f[SCALE].value);
    }
    long long threads = 0;
    if (f[THREADS].value && !tool_parse_int(f[THREADS].value, 1, 1024, &threads))
        return tool_usage_error("--threads '%s' is not a number in 1..1024", f[THREADS].value);
    p.backend = f[BACKEND].value;

    npy_array a[3];
    memset(a, 0, sizeof a);
    char err[512];
    void *conv[3] = {NULL, NULL, NULL};
    float *out = NULL, *lse = NULL;
    sdpa_context *ctx = NULL;
    rc = 1;
    for (int i = 0; i < 3; i++) {
        if (npy_read(f[Q + i].value, &a[i], err, sizeof err) != 0) {
            rc = tool_usage_error("--%s: %s", i == 0 ? "q" : i == 1 ? "k" : "v", err);
            goto done;
        }
        if (a[i].ndim != 4) {
            rc = tool_usage_error("--%s: %s has %d dimensions, expected 4 [B, S, H, D]",
                                  i == 0 ? "q" : i == 1 ? "k" : "v", f[Q + i].value, a[i].ndim);
            goto done;
        }
    }
    sdpa_dtype dtype = a[0].is_f16 ? SDPA_F16 : SDPA_F32;
    if (f[DTYPE].value && !tool_parse_dtype(f[DTYPE].value, &dtype)) {
        rc = tool_usage_error("--dtype '%s' unknown, expected f32, f16 or bf16", f[DTYPE].value);
        goto done;
    }
    for (int i = 0; i < 3; i++)
        if (!(conv[i] = convert_input(&a[i], dtype))) {
            rc = tool_usage_error("out of memory converting inputs");
            goto done;
        }
    const int64_t *qs = a[0].shape;
    sdpa_tensor tq = sdpa_tensor_bshd(conv[0], dtype, qs[0], qs[1], qs[2], qs[3]);
    sdpa_tensor tk = sdpa_tensor_bshd(conv[1], dtype, a[1].shape[0], a[1].shape[1],
                                      a[1].shape[2], a[1].shape[3]);
    sdpa_tensor tv = sdpa_tensor_bshd(conv[2], dtype, a[2].shape[0], a[2].shape[1],
                                      a[2].shape[2], a[2].shape[3]);
    out = malloc(sizeof(float) * (size_t)(a[0].count ? a[0].count : 1));
    lse = f[LSE].value ? malloc(sizeof(float) * (size_t)(qs[0] * qs[1] * qs[2] + 1)) : NULL;
    if (!out || (f[LSE].value && !lse)) {
        rc = tool_usage_error("out of memory allocating outputs");
        goto done;
    }
    sdpa_tensor to = sdpa_tensor_bshd(out, SDPA_F32, qs[0], qs[1], qs[2], qs[3]);
    if ((rc = tool_context(NULL, (int)threads, &ctx)) != 0)
        goto done;
    double t0 = tool_now_ms();
    sdpa_status st = sdpa_forward(ctx, &tq, &tk, &tv, &to, lse, &p);
    double t1 = tool_now_ms();
    if (st != SDPA_OK) {
        rc = tool_lib_error("run", st);
        goto done;
    }
    if (npy_write_f32(f[OUT].value, out, 4, qs, err, sizeof err) != 0) {
        rc = tool_usage_error("--out: %s", err);
        goto done;
    }
    if (lse) {
        int64_t ls[3] = {qs[0], qs[2], qs[1]};
        if (npy_write_f32(f[LSE].value, lse, 3, ls, err, sizeof err) != 0) {
            unlink(f[OUT].value);
            rc = tool_usage_error("--lse: %s (the output file was removed too)", err);
            goto done;
        }
    }
    printf("backend %s  dtype %s  q [%lld, %lld, %lld, %lld]  k [%lld, %lld, %lld, %lld]  "
           "%.3f ms\n",
           sdpa_last_backend(), sdpa_dtype_name(dtype), (long long)qs[0], (long long)qs[1],
           (long long)qs[2], (long long)qs[3], (long long)a[1].shape[0],
           (long long)a[1].shape[1], (long long)a[1].shape[2], (long long)a[1].shape[3], t1 - t0);
    rc = 0;
done:
    sdpa_context_destroy(ctx);
    for (int i = 0; i < 3; i++) {
        npy_free(&a[i]);
        free(conv[i]);
    }
    free(out);
    free(lse);
    return rc;
}

/* ---- explain */

static int cmd_explain(int argc, char **argv)
{
    tool_flag f[] = {{"--shape", 1, NULL},     {"--dtype", 1, NULL},     {"--causal", 1, NULL},
                {"--lse", 0, NULL},       {"--platform", 1, NULL},  {"--quant", 1, NULL},
                {"--component", 1, NULL}, {"--backend", 1, NULL},   {"--json", 0, NULL},
                {"--deterministic", 0, NULL}};
    enum { SHAPE, DTYPE, CAUSAL, LSE, PLATFORM, QUANT, COMPONENT, BACKEND, JSON, DET, NF };
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
    if (f[CAUSAL].value && !tool_parse_causal(f[CAUSAL].value, &d.causal))
        return tool_usage_error("--causal '%s' unknown, expected none, top-left or bottom-right",
                                f[CAUSAL].value);
    d.want_lse = f[LSE].value != NULL;
    d.deterministic = f[DET].value != NULL;
    d.quant = f[QUANT].value;
    d.component = f[COMPONENT].value;
    d.backend = f[BACKEND].value;
    sdpa_context *ctx;
    if ((rc = tool_context(f[PLATFORM].value, 1, &ctx)) != 0)
        return rc;
    char *text;
    sdpa_status st = sdpa_explain(ctx, &d, f[JSON].value != NULL, &text);
    if (st != SDPA_OK) {
        rc = tool_lib_error("explain", st);
    } else {
        printf("%s%s", text, f[JSON].value ? "\n" : "");
        sdpa_free(text);
    }
    sdpa_context_destroy(ctx);
    return rc;
}

/* ---- info */

static int cmd_info(int argc, char **argv)
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
                            SDPA_CAUSAL_NONE, 0, 0, NULL, NULL, NULL};
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
        printf("  %-14s %-8s %-6s %-13s D %d..%d%s%s%s  %s\n", b.name, b.version,
               b.device == SDPA_DEVICE_CUDA ? "cuda" : "cpu", dt, b.head_dim_min,
               b.head_dim_max, step, b.lse ? " lse" : "",
               b.product_bits == 8 ? " P in bf16" : "", b.present ? "present" : b.why_absent);
    }
    sdpa_context_destroy(ctx);
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sdpa COMMAND [flags]\n"
            "  run      --q Q.npy --k K.npy --v V.npy --out O.npy [--lse L.npy] [--backend NAME]\n"
            "           [--causal top-left|bottom-right] [--scale X] [--dtype f32|f16|bf16]\n"
            "           [--threads N]\n"
            "  explain  --shape B,Sq,Skv,Hq,Hkv,D [--dtype ..] [--causal ..] [--lse]\n"
            "           [--platform cpu|cpu:isa=LEVEL|cuda:sm_XY[,cudnn=N]] [--quant NAME]\n"
            "           [--component NAME] [--backend NAME] [--deterministic] [--json]\n"
            "  bench    (--suite FILE | --shape B,Sq,Skv,Hq,Hkv,D) [--backends a,b,...|all]\n"
            "           [--dtype ..] [--causal ..] [--reps N] [--threads N] [--json]\n"
            "           [--plot FILE.svg]\n"
            "  check    (--suite FILE | --shape ..) [--backends a,b|all] [--dtype ..] [--budget GFLOP]\n"
            "           [--json]   numerics of every backend against the float64 reference\n"
            "  ab       --a SPEC --b SPEC (--suite FILE | --shape .. | --dit image|video [--steps K])\n"
            "           [--rounds N] [--dtype ..] [--json]   interleaved A/B; SPEC is\n"
            "           backend=NAME or rules=FILE\n"
            "  tune     (--suite FILE | --shape ..) --out RULES [--backends a,b] [--reps N]\n"
            "           [--dtype ..] [--min-gain F]   rules from measurements, with evidence\n"
            "  dit      [--config image|video] [--steps K] [--seed N] [--backends A[,B] | --rules\n"
            "           FA[,FB]] [--out PREFIX] [--verbose]   a small DiT; two arms: PSNR/SSIM\n"
            "  info     [--platform ..]\n"
            "environment: SDPA_BACKEND, SDPA_POLICY, SDPA_POLICY_FOREIGN, SDPA_LOG, SDPA_MAX_ISA,\n"
            "SDPA_CUDA_PLUGIN (README.md)\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "run") == 0)
        return cmd_run(argc - 2, argv + 2);
    if (strcmp(cmd, "explain") == 0)
        return cmd_explain(argc - 2, argv + 2);
    if (strcmp(cmd, "bench") == 0)
        return cmd_bench(argc - 2, argv + 2);
    if (strcmp(cmd, "check") == 0)
        return cmd_check(argc - 2, argv + 2);
    if (strcmp(cmd, "dit") == 0)
        return cmd_dit(argc - 2, argv + 2);
    if (strcmp(cmd, "tune") == 0)
        return cmd_tune(argc - 2, argv + 2);
    if (strcmp(cmd, "ab") == 0)
        return cmd_ab(argc - 2, argv + 2);
    if (strcmp(cmd, "info") == 0)
        return cmd_info(argc - 2, argv + 2);
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("sdpa %s\n", sdpa_version());
        return 0;
    }
    usage(stderr);
    return tool_usage_error("unknown command '%s'", cmd);
}
