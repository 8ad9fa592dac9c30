/*
 * test_dispatch.c - the dispatcher's selection semantics.
 *
 * Each precedence level and the one above it; explicit-but-unsupported;
 * the scoped override stack (nesting, per thread, captured by layers);
 * component overrides; the default CUDA rules on simulated sm_100, sm_90,
 * sm_120 and cuDNN 9.10; NVFP4 and its explicit-choice exception; LSE
 * forcing; the latch (one warning, correct result in the same call);
 * OUT_OF_MEMORY / DEVICE_ERROR pass-through; concurrent calls on a layer;
 * warm-up; contexts sharing one worker pool from several threads;
 * SDPA_MAX_ISA at every level this CPU allows, for f32 and bf16.
 */
#define _POSIX_C_SOURCE 200809L
#include "dispatch/context.h"
#include "support/scripted.h"
#include "support/testlib.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static sdpa_call_desc cuda_call(int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t D)
{
    sdpa_call_desc d;
    memset(&d, 0, sizeof d);
    d.device = SDPA_DEVICE_CUDA, d.dtype = SDPA_BF16;
    d.B = B, d.Sq = d.Skv = S, d.Hq = Hq, d.Hkv = Hkv, d.D = D;
    return d;
}

static sdpa_call_desc cpu_call(void)
{
    sdpa_call_desc d;
    memset(&d, 0, sizeof d);
    d.device = SDPA_DEVICE_CPU, d.dtype = SDPA_F32;
    d.B = 1, d.Sq = 40, d.Skv = 33, d.Hq = 4, d.Hkv = 2, d.D = 32;
    return d;
}

static const char *reason_of(const sdpa_decision *dec, const char *name)
{
    for (int i = 0; i < dec->n_backends; i++)
        if (strcmp(dec->backends[i].name, name) == 0)
            return dec->backends[i].reason;
    return "(no such backend)";
}

static sdpa_decision dec;

static int decide(sdpa_context *ctx, const sdpa_call_desc *d)
{
    sdpa_status st = sdpa_decide(ctx, d, &dec);
    CHECK_STATUS(st, SDPA_OK);
    return st == SDPA_OK;
}

#define FIRST(name)                                                                                \
    CHECK(dec.n_candidates > 0 && strcmp(dec.candidates[0], name) == 0,                            \
          "first candidate %s, expected %s (rule '%s')",                                           \
          dec.n_candidates ? dec.candidates[0] : "(none)", name, dec.rule)

/* ---- the CPU rules on every CPU the project has measured, described */

/* Each CPU of bench/results and ../shared/data, described by --platform,
 * with the kernel its measurements say should come first for a long
 * diffusion call (FLUX's joint attention), a padded cross-attention call
 * and the 26-token grouped-query one: the bf16 order differs by vendor
 * (VDPBF16PS runs at half the fp32 FMA rate on every Intel core measured,
 * faster than fp32 on AMD's) and by AMX; f16 and f32 keep fp32 arithmetic. */
static void test_cpu_rules_per_cpu(void)
{
    static const struct {
        const char *cpu, *platform, *bf16, *f16, *f32;
    } cpus[] = {
        {"Sapphire Rapids (AMX)", "cpu:vendor=intel,features=avx2+avx512+avx512bf16+avx512fp16+amx-bf16",
         "cpu.amx", "cpu.avx512", "cpu.avx512"},
        {"Emerald Rapids, AMX hidden", "cpu:vendor=intel,features=avx2+avx512+avx512bf16+avx512fp16",
         "cpu.avx512", "cpu.avx512", "cpu.avx512"},
        {"Zen 4 / Zen 5", "cpu:vendor=amd,features=avx2+avx512+avx512bf16", "cpu.avx512bf16",
         "cpu.avx512", "cpu.avx512"},
        {"Zen 2 / Zen 3", "cpu:vendor=amd,features=avx2", "cpu.avx2", "cpu.avx2", "cpu.avx2"},
    };
    static const struct {
        const char *what;
        int64_t B, Sq, Skv, Hq, Hkv, D;
        unsigned mask;
    } shapes[] = {{"flux1-joint", 1, 3520, 3520, 24, 24, 128, 0},
                  {"wan22-5b-cross-padded", 1, 8190, 512, 24, 24, 128, SDPA_MASK_KIND_SEQ_LEN},
                  {"minimaxh3-gqa", 1, 26, 26, 16, 2, 128, 0}};
    for (size_t i = 0; i < sizeof cpus / sizeof *cpus; i++) {
        sdpa_context *ctx = tl_context(cpus[i].platform);
        CHECK(ctx != NULL, "%s: %s", cpus[i].cpu, cpus[i].platform);
        if (!ctx)
            continue;
        for (size_t j = 0; j < sizeof shapes / sizeof *shapes; j++)
            for (int t = 0; t < SDPA_DTYPE_COUNT; t++) {
                sdpa_call_desc d = cpu_call();
                d.B = shapes[j].B, d.Sq = shapes[j].Sq, d.Skv = shapes[j].Skv;
                d.Hq = shapes[j].Hq, d.Hkv = shapes[j].Hkv, d.D = shapes[j].D;
                d.mask = shapes[j].mask, d.dtype = (sdpa_dtype)t;
                const char *want = t == SDPA_BF16 ? cpus[i].bf16
                                   : t == SDPA_F16 ? cpus[i].f16
                                                   : cpus[i].f32;
                decide(ctx, &d);
                CHECK(dec.n_candidates > 0 && strcmp(dec.candidates[0], want) == 0,
                      "%s, %s in %s: first candidate %s (rule '%s'), expected %s", cpus[i].cpu,
                      shapes[j].what, sdpa_dtype_name((sdpa_dtype)t),
                      dec.n_candidates ? dec.candidates[0] : "(none)", dec.rule, want);
            }
        sdpa_context_destroy(ctx);
    }
    /* The vendor is what a described CPU says, and only that: without it,
     * no vendor rule applies (the bf16 order is AMD's, whose rule names no
     * vendor). */
    sdpa_context *ctx = tl_context("cpu:features=avx2+avx512+avx512bf16");
    sdpa_call_desc d = cpu_call();
    d.dtype = SDPA_BF16, d.Sq = d.Skv = 3520, d.Hq = d.Hkv = 24, d.D = 128;
    decide(ctx, &d);
    FIRST("cpu.avx512bf16");
    sdpa_context_destroy(ctx);
    /* A few bf16 tokens on AMX against a few keys: cpu.amx's few-rows
     * tile path where it takes them (2-16 tokens, no mask, D a multiple of
     * 32: cpu-amx-bf16-rows), else cpu.avx512 (one token, a head dim of
     * 72: cpu-amx-bf16-decode); grouped-query calls and long key ranges
     * stay on the tiles. */
    ctx = tl_context(cpus[0].platform);
    d = cpu_call();
    d.dtype = SDPA_BF16, d.Sq = 16, d.Skv = 16, d.Hq = d.Hkv = 8, d.D = 64;
    decide(ctx, &d);
    FIRST("cpu.amx");
    CHECK(strcmp(dec.rule, "cpu-amx-bf16-rows") == 0, "rule %s", dec.rule);
    d.D = 72;
    decide(ctx, &d);
    FIRST("cpu.avx512");
    CHECK(strcmp(dec.rule, "cpu-amx-bf16-decode") == 0, "rule %s", dec.rule);
    d.D = 64, d.Sq = 1;
    decide(ctx, &d);
    FIRST("cpu.avx512");
    CHECK(strcmp(dec.rule, "cpu-amx-bf16-decode") == 0, "rule %s", dec.rule);
    d.Sq = 16;
    d.Hkv = 4;
    decide(ctx, &d);
    FIRST("cpu.amx");
    d.Hkv = 8, d.Skv = 8192;
    decide(ctx, &d);
    FIRST("cpu.amx");
    sdpa_context_destroy(ctx);
    /* One f32 query per head on a Zen 4 core (family 25 with AVX-512):
     * cpu.avx2 (cpu-zen4-f32-decode); grouped-query rows, bf16 and a core
     * of another family keep cpu.avx512 */
    ctx = tl_context("cpu:vendor=amd,family=25,features=avx2+avx512+avx512bf16");
    d = cpu_call();
    d.Sq = 1, d.Skv = 1024, d.Hq = d.Hkv = 32, d.D = 128;
    decide(ctx, &d);
    FIRST("cpu.avx2");
    CHECK(strcmp(dec.rule, "cpu-zen4-f32-decode") == 0, "rule %s", dec.rule);
    d.Hkv = 4;
    decide(ctx, &d);
    FIRST("cpu.avx512");
    d.Hkv = 32, d.Sq = 16;
    decide(ctx, &d);
    FIRST("cpu.avx512");
    d.Sq = 1, d.dtype = SDPA_BF16;
    decide(ctx, &d);
    FIRST("cpu.avx512bf16");
    sdpa_context_destroy(ctx);
    ctx = tl_context("cpu:vendor=amd,family=26,features=avx2+avx512+avx512bf16");
    d.dtype = SDPA_F32;
    decide(ctx, &d);
    FIRST("cpu.avx512");
    sdpa_context_destroy(ctx);
    sdpa_platform p;
    CHECK_STATUS(sdpa_platform_parse("cpu:vendor=via", &p), SDPA_INVALID_ARGUMENT);
    CHECK(strstr(sdpa_last_error(), "via") != NULL && strstr(sdpa_last_error(), "intel"),
          "the refusal names the vendor and the expected ones: %s", sdpa_last_error());
    CHECK_STATUS(sdpa_platform_parse("cpu:vendor=amd,features=avx2", &p), SDPA_OK);
    CHECK(strcmp(p.cpu_vendor, "amd") == 0 && p.cpu_family == 0, "vendor %s family %d",
          p.cpu_vendor, p.cpu_family);
    CHECK_STATUS(sdpa_platform_parse("cpu:features=avx2,vendor=intel", &p), SDPA_OK);
    CHECK(strcmp(p.cpu_vendor, "intel") == 0, "vendor after features: %s", p.cpu_vendor);
}

/* ---- the default CUDA rules on simulated platforms */

static void test_cuda_rules(void)
{
    sdpa_context *ctx = tl_context("cuda:sm_100,cudnn=91900");
    sdpa_call_desc d = cuda_call(1, 8190, 24, 24, 128);
    decide(ctx, &d);
    FIRST("cuda.cudnn");
    CHECK(strcmp(dec.rule, "blackwell-cudnn") == 0, "rule %s", dec.rule);
    CHECK(dec.n_candidates == 3 && strcmp(dec.candidates[2], "cuda.unfused") == 0,
          "cuda.unfused last");
    CHECK(dec.evidence[0] != '\0', "rule carries evidence");
    for (int i = 0; i < dec.n_backends; i++)
        if (strncmp(dec.backends[i].name, "cuda.", 5) == 0)
            CHECK(!dec.backends[i].present, "%s present on a machine without a CUDA plugin",
                  dec.backends[i].name);

    d.causal = SDPA_CAUSAL_TOP_LEFT;
    decide(ctx, &d);
    FIRST("cuda.flash");
    CHECK(strstr(reason_of(&dec, "cuda.cudnn"), "causal-flash") != NULL, "reason: %s",
          reason_of(&dec, "cuda.cudnn"));
    d.causal = SDPA_CAUSAL_NONE;

    /* Rows that see no key: cuDNN's graph has no padding mask for them, and
     * the refusal is the declared check's, so explain never promises it. */
    d.causal = SDPA_CAUSAL_BOTTOM_RIGHT, d.Skv = 4096;
    decide(ctx, &d);
    CHECK(dec.n_candidates > 0 && strcmp(dec.candidates[0], "cuda.cudnn") != 0 &&
              strstr(reason_of(&dec, "cuda.cudnn"), "Sq > Skv") != NULL,
          "bottom-right with Sq > Skv passed over cuDNN: first %s, reason %s",
          dec.n_candidates ? dec.candidates[0] : "(none)", reason_of(&dec, "cuda.cudnn"));
    d.backend = "cuda.cudnn"; /* explicit: refused with the reason, never run */
    decide(ctx, &d);
    CHECK(dec.status == SDPA_UNSUPPORTED && strstr(dec.error, "Sq > Skv") != NULL,
          "explicit cuda.cudnn with Sq > Skv: %s", dec.error);
    d.backend = NULL, d.causal = SDPA_CAUSAL_NONE, d.Skv = 8190;

    d.quant = "nvfp4"; /* NVFP4 on 10.x: flash, unless chosen explicitly */
    decide(ctx, &d);
    FIRST("cuda.flash");
    CHECK(strcmp(dec.rule, "nvfp4-blackwell-flash") == 0, "rule %s", dec.rule);
    d.backend = "cuda.cudnn";
    decide(ctx, &d);
    FIRST("cuda.cudnn");
    CHECK(dec.source == SDPA_SOURCE_EXPLICIT && dec.n_candidates == 1, "explicit wins over NVFP4");
    d.backend = NULL, d.quant = NULL;

    d.Hkv = 2; /* grouped-query never to cuDNN by default */
    decide(ctx, &d);
    FIRST("cuda.flash");
    CHECK(strstr(reason_of(&dec, "cuda.cudnn"), "gqa-not-cudnn") != NULL, "reason: %s",
          reason_of(&dec, "cuda.cudnn"));
    d.Hkv = 24;

    d.dtype = SDPA_F32; /* only the unfused path does fp32 */
    decide(ctx, &d);
    FIRST("cuda.unfused");
    CHECK(strstr(reason_of(&dec, "cuda.flash"), "dtype f32") != NULL, "reason: %s",
          reason_of(&dec, "cuda.flash"));
    d.dtype = SDPA_BF16;

    d.want_lse = 1; /* every CUDA backend declares LSE: order unchanged */
    decide(ctx, &d);
    FIRST("cuda.cudnn");
    sdpa_context_destroy(ctx);

    ctx = tl_context("cuda:sm_120"); /* 12.x untouched by the 10.x rule */
    d = cuda_call(1, 8190, 24, 24, 128);
    decide(ctx, &d);
    FIRST("cuda.flash");
    CHECK(strcmp(dec.rule, "cuda-default") == 0, "rule %s", dec.rule);
    sdpa_context_destroy(ctx);

    ctx = tl_context("cuda:sm_100,cudnn=91001"); /* known-bad cuDNN refused */
    decide(ctx, &d);
    FIRST("cuda.flash");
    CHECK(strcmp(dec.rule, "cudnn-9.10-refused") == 0, "rule %s", dec.rule);
    d.backend = "cuda.cudnn";
    decide(ctx, &d);
    CHECK(dec.status == SDPA_UNSUPPORTED && strstr(dec.error, "known-bad"),
          "explicit cuDNN 9.10.1: %s", dec.error);
    sdpa_context_destroy(ctx);

    ctx = tl_context("cuda:sm_90"); /* Hopper: cuDNN only on its narrow shape */
    d = cuda_call(4, 1024, 16, 16, 64);
    decide(ctx, &d);
    FIRST("cuda.cudnn");
    d.B = 2;
    decide(ctx, &d);
    FIRST("cuda.flash");
    d.B = 4, d.D = 128;
    decide(ctx, &d);
    FIRST("cuda.flash");
    d.D = 64, d.Skv = 2048;
    decide(ctx, &d);
    FIRST("cuda.flash");
    sdpa_context_destroy(ctx);

    ctx = tl_context("cuda:sm_61"); /* below every CUDA backend's minimum */
    d = cuda_call(1, 128, 8, 8, 64);
    decide(ctx, &d);
    CHECK(dec.status == SDPA_UNSUPPORTED && dec.n_candidates == 0, "sm_61 has no backend");
    CHECK(strstr(reason_of(&dec, "cuda.flash"), "compute capability") != NULL, "reason: %s",
          reason_of(&dec, "cuda.flash"));
    sdpa_context_destroy(ctx);

    ctx = tl_context("cpu"); /* a CUDA call on a CPU platform: no device */
    decide(ctx, &d);
    CHECK(dec.status == SDPA_UNSUPPORTED, "cuda call without a device");
    sdpa_context_destroy(ctx);
}

/* ---- precedence, with scripted backends on the CPU */

static scripted sa, sb, sc;

/* Decisions for a CPU with no vector ISA, so they are the same on every
 * machine; scripted backends and cpu.portable/ref run everywhere. */
static sdpa_context *cpu_ctx_with_scripts(void)
{
    sdpa_context *ctx = tl_context("cpu:isa=portable");
    memset(&sa, 0, sizeof sa), memset(&sb, 0, sizeof sb), memset(&sc, 0, sizeof sc);
    scripted_add(ctx, "test.a", &sa);
    scripted_add(ctx, "test.b", &sb);
    scripted_add(ctx, "test.c", &sc);
    return ctx;
}

typedef struct thread_arg {
    sdpa_context *ctx;
    const char *seen;
    sdpa_source source;
} thread_arg;

static void *other_thread(void *raw)
{
    thread_arg *a = raw;
    sdpa_call_desc d = cpu_call();
    sdpa_decision *local = malloc(sizeof *local);
    sdpa_decide(a->ctx, &d, local);
    a->seen = local->n_candidates ? local->candidates[0] : "(none)";
    a->source = local->source;
    free(local);
    return NULL;
}

static void test_precedence(void)
{
    setenv("SDPA_BACKEND", "ref", 1);
    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    o.threads = 2;
    sdpa_context *ctx;
    CHECK_STATUS(sdpa_context_create(&o, &ctx), SDPA_OK);
    unsetenv("SDPA_BACKEND");
    memset(&sa, 0, sizeof sa), memset(&sb, 0, sizeof sb), memset(&sc, 0, sizeof sc);
    scripted_add(ctx, "test.a", &sa);
    scripted_add(ctx, "test.b", &sb);
    scripted_add(ctx, "test.c", &sc);
    CHECK_STATUS(sdpa_context_load_policy_text(ctx,
                                               "rule t\ndevice cpu\ntry test.c cpu.portable\n"
                                               "evidence test\n",
                                               "t.rules"),
                 SDPA_OK);
    sdpa_call_desc d = cpu_call();
    d.component = "text_encoder";

    decide(ctx, &d); /* 4: environment beats rules */
    FIRST("ref");
    CHECK(dec.source == SDPA_SOURCE_ENVIRONMENT, "source %s", sdpa_source_name(dec.source));

    sdpa_context_set_component_backend(ctx, "text_encoder", "test.b"); /* 3 beats 4 */
    decide(ctx, &d);
    FIRST("test.b");
    CHECK(dec.source == SDPA_SOURCE_COMPONENT, "source %s", sdpa_source_name(dec.source));
    d.component = "transformer"; /* other components unaffected */
    decide(ctx, &d);
    FIRST("ref");
    d.component = "text_encoder";

    sdpa_override_push("test.a"); /* 2 beats 3 */
    decide(ctx, &d);
    FIRST("test.a");
    CHECK(dec.source == SDPA_SOURCE_SCOPED, "source %s", sdpa_source_name(dec.source));

    thread_arg ta = {ctx, NULL, 0}; /* another thread does not see this thread's push */
    pthread_t th;
    pthread_create(&th, NULL, other_thread, &ta);
    pthread_join(th, NULL);
    CHECK(strcmp(ta.seen, "ref") == 0 && ta.source == SDPA_SOURCE_ENVIRONMENT,
          "other thread saw %s", ta.seen);

    sdpa_override_push("test.c"); /* nesting: innermost wins */
    decide(ctx, &d);
    FIRST("test.c");
    d.backend = "test.b"; /* 1 beats 2 */
    decide(ctx, &d);
    FIRST("test.b");
    CHECK(dec.source == SDPA_SOURCE_EXPLICIT, "source %s", sdpa_source_name(dec.source));
    d.backend = NULL;
    CHECK_STATUS(sdpa_override_pop(), SDPA_OK);
    decide(ctx, &d);
    FIRST("test.a");
    CHECK_STATUS(sdpa_override_pop(), SDPA_OK);
    CHECK(sdpa_override_current() == NULL, "stack empty");
    CHECK_STATUS(sdpa_override_pop(), SDPA_INVALID_ARGUMENT);

    sdpa_override_push("no.such.backend"); /* names are checked when used */
    CHECK_STATUS(sdpa_decide(ctx, &d, &dec), SDPA_INVALID_ARGUMENT);
    CHECK(strstr(sdpa_last_error(), "no.such.backend") != NULL, "message: %s", sdpa_last_error());
    sdpa_override_pop();
    for (int i = 0; i < 16; i++)
        sdpa_override_push("test.a");
    CHECK_STATUS(sdpa_override_push("test.a"), SDPA_INVALID_ARGUMENT); /* depth bound */
    for (int i = 0; i < 16; i++)
        sdpa_override_pop();

    sdpa_context_set_component_backend(ctx, "text_encoder", NULL); /* removed: env again */
    decide(ctx, &d);
    FIRST("ref");
    CHECK_STATUS(sdpa_context_set_component_backend(ctx, "x", "nope"), SDPA_INVALID_ARGUMENT);
    sdpa_context_destroy(ctx);

    ctx = cpu_ctx_with_scripts(); /* 5: rules, then 6: the fallback chain */
    d = cpu_call();
    decide(ctx, &d);
    FIRST("cpu.portable");
#if defined(__aarch64__)
    CHECK(dec.source == SDPA_SOURCE_RULE && strcmp(dec.rule, "cpu-aarch64") == 0, "rule %s",
          dec.rule);
#else
    CHECK(dec.source == SDPA_SOURCE_RULE && strcmp(dec.rule, "cpu-default") == 0, "rule %s",
          dec.rule);
#endif
    CHECK(strstr(reason_of(&dec, "test.a"), "passed over by rule") != NULL, "reason %s",
          reason_of(&dec, "test.a"));
    sdpa_context_load_policy_text(ctx, "rule only-a\ntry test.a\nevidence test\n", "u.rules");
    decide(ctx, &d);
    FIRST("test.a");
    sa.refuse = "scripted: refuses everything";
    decide(ctx, &d); /* rule leaves nothing: fallback chain, best first */
    CHECK(dec.source == SDPA_SOURCE_FALLBACK, "source %s", sdpa_source_name(dec.source));
    FIRST("cpu.portable");
    CHECK(dec.n_candidates == 2 && strcmp(dec.candidates[1], "ref") == 0, "ref last");
    sa.refuse = NULL;
    sdpa_context_destroy(ctx);

    /* SDPA_BACKEND with an unknown name fails context creation. */
    setenv("SDPA_BACKEND", "cpu.nonexistent", 1);
    CHECK_STATUS(sdpa_context_create(&o, &ctx), SDPA_INVALID_ARGUMENT);
    CHECK(strstr(sdpa_last_error(), "SDPA_BACKEND") != NULL, "message: %s", sdpa_last_error());
    unsetenv("SDPA_BACKEND");
    setenv("SDPA_LOG", "loud", 1);
    CHECK_STATUS(sdpa_context_create(&o, &ctx), SDPA_INVALID_ARGUMENT);
    unsetenv("SDPA_LOG");
}

/* ---- running: explicit refusal, latch, pass-through */

typedef struct run_setup {
    tl_problem p;
    tl_output out, ref;
} run_setup;

static void setup(run_setup *r, sdpa_context *ctx, int lse)
{
    tl_case c = {1, 70, 45, 4, 2, 32, SDPA_F32, SDPA_F32, SDPA_CAUSAL_NONE, TL_BSHD, lse, TL_UNIFORM, 0, 0};
    tl_problem_make(&r->p, &c);
    tl_output_make(&r->out, &r->p);
    tl_output_make(&r->ref, &r->p);
    sdpa_params prm = SDPA_PARAMS_DEFAULT;
    prm.backend = "ref";
    sdpa_forward(ctx, &r->p.q, &r->p.k, &r->p.v, &r->ref.t, r->ref.lse, &prm);
}

static void teardown(run_setup *r)
{
    tl_output_free(&r->out);
    tl_output_free(&r->ref);
    tl_problem_free(&r->p);
}

static int correct(const run_setup *r) { return tl_max_diff(&r->out, &r->ref, NULL) < 1e-6; }

static void test_explicit_refusal(void)
{
    sdpa_context *ctx = cpu_ctx_with_scripts();
    run_setup r;
    setup(&r, ctx, 0);
    sa.refuse = "test.a: head_dim 32 not supported (scripted)";
    sdpa_params prm = SDPA_PARAMS_DEFAULT;
    prm.backend = "test.a";
    memset(r.out.mem, 0x5A, r.out.bytes);
    sdpa_status st = sdpa_forward(ctx, &r.p.q, &r.p.k, &r.p.v, &r.out.t, NULL, &prm);
    CHECK_STATUS(st, SDPA_UNSUPPORTED);
    CHECK(strstr(sdpa_last_error(), "head_dim 32 not supported (scripted)") != NULL,
          "message carries the backend's reason: %s", sdpa_last_error());
    CHECK(atomic_load(&sa.runs) == 0 && atomic_load(&sb.runs) == 0, "nothing ran");
    CHECK(((unsigned char *)r.out.mem)[0] == 0x5A, "nothing written");
    sa.refuse = NULL;

    sa.run_status = SDPA_UNSUPPORTED; /* refusing at run time: returned, not replaced */
    st = sdpa_forward(ctx, &r.p.q, &r.p.k, &r.p.v, &r.out.t, NULL, &prm);
    CHECK_STATUS(st, SDPA_UNSUPPORTED);
    sa.run_status = SDPA_OK;

    sdpa_layer_desc ld = SDPA_LAYER_DESC_DEFAULT; /* explicit on a layer: same */
    ld.name = "blocks.0.attn";
    ld.backend = "test.a";
    sa.refuse = "scripted no";
    sdpa_layer *layer;
    CHECK_STATUS(sdpa_layer_create(ctx, &ld, &layer), SDPA_OK);
    st = sdpa_layer_forward(layer, &r.p.q, &r.p.k, &r.p.v, &r.out.t, NULL, NULL);
    CHECK_STATUS(st, SDPA_UNSUPPORTED);
    CHECK(strstr(sdpa_last_error(), "scripted no") && strstr(sdpa_last_error(), "blocks.0.attn"),
          "message: %s", sdpa_last_error());
    sa.refuse = NULL;
    sdpa_layer_destroy(layer);
    ld.backend = "nope"; /* unknown explicit name */
    CHECK_STATUS(sdpa_layer_create(ctx, &ld, &layer), SDPA_INVALID_ARGUMENT);
    teardown(&r);
    sdpa_context_destroy(ctx);
}

static void test_lse_forcing(void)
{
    sdpa_context *ctx = tl_context(NULL);
    memset(&sa, 0, sizeof sa), memset(&sb, 0, sizeof sb);
    sb.no_lse = 1;
    scripted_add(ctx, "test.a", &sa);
    scripted_add(ctx, "test.nolse", &sb);
    sdpa_context_load_policy_text(ctx, "rule r\ndevice cpu\ntry test.nolse test.a\nevidence x\n",
                                  "r.rules");
    sdpa_call_desc d = cpu_call();
    decide(ctx, &d);
    FIRST("test.nolse");
    d.want_lse = 1;
    decide(ctx, &d);
    FIRST("test.a");
    for (int c = 0; c < dec.n_candidates; c++)
        CHECK(strcmp(dec.candidates[c], "test.nolse") != 0, "no-LSE backend listed for LSE call");
    CHECK(strstr(reason_of(&dec, "test.nolse"), "LSE") != NULL, "reason: %s",
          reason_of(&dec, "test.nolse"));

    run_setup r;
    setup(&r, ctx, 1);
    sdpa_status st = sdpa_forward(ctx, &r.p.q, &r.p.k, &r.p.v, &r.out.t, r.out.lse, NULL);
    CHECK_STATUS(st, SDPA_OK);
    CHECK(strcmp(sdpa_last_backend(), "test.a") == 0, "ran %s", sdpa_last_backend());
    CHECK(atomic_load(&sb.runs) == 0, "the no-LSE backend never ran");
    sdpa_params prm = SDPA_PARAMS_DEFAULT;
    prm.backend = "test.nolse";
    st = sdpa_forward(ctx, &r.p.q, &r.p.k, &r.p.v, &r.out.t, r.out.lse, &prm);
    CHECK_STATUS(st, SDPA_UNSUPPORTED);
    CHECK(strstr(sdpa_last_error(), "LSE") != NULL, "message: %s", sdpa_last_error());
    teardown(&r);
    sdpa_context_destroy(ctx);
}

/* Warm-up walks the candidates as forward does, prepares instead of
 * running, latches what refuses, passes errors through, writes nothing. */
static void test_warmup(void)
{
    sdpa_context *ctx = cpu_ctx_with_scripts();
    sdpa_context_load_policy_text(ctx, "rule r\ndevice cpu\ntry test.a test.b\nevidence x\n",
                                  "r.rules");
    run_setup r;
    setup(&r, ctx, 1);
    sa.has_prepare = 1;
    sdpa_layer_desc ld = SDPA_LAYER_DESC_DEFAULT;
    ld.name = "blocks.1.attn1";
    sdpa_layer *layer;
    CHECK_STATUS(sdpa_layer_create(ctx, &ld, &layer), SDPA_OK);
    memset(r.out.mem, 0x5A, r.out.bytes);
    CHECK_STATUS(sdpa_layer_warmup(layer, &r.p.q, &r.p.k, &r.p.v, &r.out.t, r.out.lse, NULL),
                 SDPA_OK);
    CHECK(atomic_load(&sa.prepares) == 1 && atomic_load(&sa.runs) == 0,
          "warm-up: %d prepares, %d runs of test.a", atomic_load(&sa.prepares),
          atomic_load(&sa.runs));
    CHECK(strcmp(sdpa_last_backend(), "test.a") == 0, "warm-up names %s", sdpa_last_backend());
    int untouched = 1;
    for (size_t i = 0; i < r.out.bytes; i++)
        untouched &= ((unsigned char *)r.out.mem)[i] == 0x5A;
    CHECK(untouched, "warm-up wrote the output");
    CHECK_STATUS(sdpa_layer_forward(layer, &r.p.q, &r.p.k, &r.p.v, &r.out.t, r.out.lse, NULL),
                 SDPA_OK);
    CHECK(atomic_load(&sa.runs) == 1 && correct(&r), "forward after warm-up");
    sdpa_layer_destroy(layer);

    /* A backend that refuses the shape at warm-up is latched there. */
    sa.prepare_status = SDPA_UNSUPPORTED;
    atomic_store(&sa.runs, 0), atomic_store(&sa.prepares, 0);
    ld.name = "blocks.2.attn1";
    CHECK_STATUS(sdpa_layer_create(ctx, &ld, &layer), SDPA_OK);
    tl_log_reset();
    CHECK_STATUS(sdpa_layer_warmup(layer, &r.p.q, &r.p.k, &r.p.v, &r.out.t, r.out.lse, NULL),
                 SDPA_OK);
    CHECK(strcmp(sdpa_last_backend(), "test.b") == 0, "after the refusal: %s",
          sdpa_last_backend());
    CHECK(sdpa_layer_is_latched(layer, "test.a") && tl_log_warnings == 1 &&
              strstr(tl_last_warning, "at warm-up"),
          "latched %d, %d warnings: %s", sdpa_layer_is_latched(layer, "test.a"),
          tl_log_warnings, tl_last_warning);
    CHECK_STATUS(sdpa_layer_forward(layer, &r.p.q, &r.p.k, &r.p.v, &r.out.t, r.out.lse, NULL),
                 SDPA_OK);
    CHECK(atomic_load(&sa.runs) == 0 && atomic_load(&sb.runs) == 1 && correct(&r),
          "forward skips the latched backend: test.a %d runs, test.b %d",
          atomic_load(&sa.runs), atomic_load(&sb.runs));
    sdpa_layer_destroy(layer);

    /* Errors come back as they would from forward, and latch nothing. */
    sa.prepare_status = SDPA_OUT_OF_MEMORY;
    ld.name = "blocks.3.attn1";
    CHECK_STATUS(sdpa_layer_create(ctx, &ld, &layer), SDPA_OK);
    CHECK_STATUS(sdpa_layer_warmup(layer, &r.p.q, &r.p.k, &r.p.v, &r.out.t, r.out.lse, NULL),
                 SDPA_OUT_OF_MEMORY);
    CHECK(!sdpa_layer_is_latched(layer, "test.a"), "OOM at warm-up latched");
    CHECK_STATUS(sdpa_warmup(ctx, &r.p.q, &r.p.k, &r.p.v, &r.out.t, r.out.lse, NULL),
                 SDPA_OUT_OF_MEMORY);
    sdpa_layer_destroy(layer);

    /* Bad tensors are refused as forward refuses them. */
    CHECK_STATUS(sdpa_warmup(ctx, NULL, &r.p.k, &r.p.v, &r.out.t, r.out.lse, NULL),
                 SDPA_INVALID_ARGUMENT);
    teardown(&r);
    sdpa_context_destroy(ctx);
}

static void test_latch(void)
{
    sdpa_context *ctx = cpu_ctx_with_scripts();
    sa.run_status = SDPA_UNSUPPORTED; /* test.a accepts in check, refuses at run time */
    sdpa_context_load_policy_text(ctx, "rule r\ndevice cpu\ntry test.a test.b\nevidence x\n",
                                  "r.rules");
    run_setup r;
    setup(&r, ctx, 1);
    sdpa_layer_desc ld = SDPA_LAYER_DESC_DEFAULT;
    ld.name = "blocks.7.attn1";
    sdpa_layer *layer;
    CHECK_STATUS(sdpa_layer_create(ctx, &ld, &layer), SDPA_OK);
    tl_log_reset();
    sdpa_status st = sdpa_layer_forward(layer, &r.p.q, &r.p.k, &r.p.v, &r.out.t, r.out.lse, NULL);
    CHECK_STATUS(st, SDPA_OK);
    CHECK(correct(&r), "correct result in the same call");
    CHECK(strcmp(sdpa_last_backend(), "test.b") == 0, "ran %s", sdpa_last_backend());
    CHECK(tl_log_warnings == 1, "%d warnings", tl_log_warnings);
    CHECK(strstr(tl_last_warning, "blocks.7.attn1") && strstr(tl_last_warning, "test.a") &&
              strstr(tl_last_warning, "scripted unsupported"),
          "warning names layer, backend and reason: %s", tl_last_warning);
    CHECK(sdpa_layer_is_latched(layer, "test.a"), "latched");
    CHECK(!sdpa_layer_is_latched(layer, "test.b"), "test.b not latched");
    for (int i = 0; i < 3; i++)
        CHECK_STATUS(sdpa_layer_forward(layer, &r.p.q, &r.p.k, &r.p.v, &r.out.t, r.out.lse, NULL),
                     SDPA_OK);
    CHECK(atomic_load(&sa.runs) == 1, "latched backend tried %d times", atomic_load(&sa.runs));
    CHECK(tl_log_warnings == 1, "still one warning, got %d", tl_log_warnings);

    sdpa_layer *other; /* the latch is per layer */
    ld.name = "blocks.8.attn1";
    sdpa_layer_create(ctx, &ld, &other);
    CHECK(!sdpa_layer_is_latched(other, "test.a"), "another layer is not latched");
    CHECK_STATUS(sdpa_layer_forward(other, &r.p.q, &r.p.k, &r.p.v, &r.out.t, r.out.lse, NULL),
                 SDPA_OK);
    CHECK(tl_log_warnings == 2, "its own one warning, got %d", tl_log_warnings);
    sdpa_layer_destroy(other);

    tl_log_reset(); /* one-shot calls fall through without latching or warning */
    CHECK_STATUS(sdpa_forward(ctx, &r.p.q, &r.p.k, &r.p.v, &r.out.t, r.out.lse, NULL), SDPA_OK);
    CHECK(correct(&r) && tl_log_warnings == 0, "one-shot fallback");
    sdpa_layer_destroy(layer);

    /* Errors that must never be swallowed nor latch anything. */
    const sdpa_status passthrough[] = {SDPA_OUT_OF_MEMORY, SDPA_DEVICE_ERROR, SDPA_INTERNAL,
                                       SDPA_INVALID_ARGUMENT};
    for (int i = 0; i < 4; i++) {
        sa.run_status = passthrough[i];
        atomic_store(&sb.runs, 0);
        ld.name = "blocks.9.attn1";
        sdpa_layer_create(ctx, &ld, &layer);
        tl_log_reset();
        st = sdpa_layer_forward(layer, &r.p.q, &r.p.k, &r.p.v, &r.out.t, r.out.lse, NULL);
        CHECK(st == passthrough[i], "%s came back as %s", sdpa_status_string(passthrough[i]),
              sdpa_status_string(st));
        CHECK(atomic_load(&sb.runs) == 0, "next candidate ran after %s",
              sdpa_status_string(passthrough[i]));
        CHECK(!sdpa_layer_is_latched(layer, "test.a") && tl_log_warnings == 0,
              "%s latched or warned", sdpa_status_string(passthrough[i]));
        st = sdpa_forward(ctx, &r.p.q, &r.p.k, &r.p.v, &r.out.t, r.out.lse, NULL);
        CHECK(st == passthrough[i], "one-shot: %s came back as %s",
              sdpa_status_string(passthrough[i]), sdpa_status_string(st));
        sdpa_layer_destroy(layer);
    }
    sa.run_status = SDPA_OK;

    /* A layer built under a scoped override keeps it after the pop. */
    sdpa_override_push("test.c");
    ld.name = "quantised.attn";
    sdpa_layer_create(ctx, &ld, &layer);
    sdpa_override_pop();
    atomic_store(&sc.runs, 0);
    CHECK_STATUS(sdpa_layer_forward(layer, &r.p.q, &r.p.k, &r.p.v, &r.out.t, r.out.lse, NULL),
                 SDPA_OK);
    CHECK(atomic_load(&sc.runs) == 1 && strcmp(sdpa_last_backend(), "test.c") == 0,
          "layer used its captured override (ran %s)", sdpa_last_backend());
    sdpa_layer_destroy(layer);
    teardown(&r);
    sdpa_context_destroy(ctx);
}

/* ---- a caller's scoped override and the layer's shared cache */

typedef struct layer_thread {
    sdpa_layer *layer;
    const run_setup *r;
    const char *push; /* override to push around the call, or NULL */
    char ran[32];
    sdpa_status st;
} layer_thread;

static void *call_layer_on_thread(void *raw)
{
    layer_thread *t = raw;
    tl_output out;
    tl_output_make(&out, &t->r->p);
    if (t->push)
        sdpa_override_push(t->push);
    t->st = sdpa_layer_forward(t->layer, &t->r->p.q, &t->r->p.k, &t->r->p.v, &out.t, out.lse,
                               NULL);
    snprintf(t->ran, sizeof t->ran, "%s", t->st == SDPA_OK ? sdpa_last_backend() : "(failed)");
    if (t->push)
        sdpa_override_pop();
    tl_output_free(&out);
    return NULL;
}

static const char *ran_on_thread(sdpa_layer *layer, const run_setup *r, const char *push)
{
    static layer_thread t;
    pthread_t th;
    t = (layer_thread){layer, r, push, "", SDPA_OK};
    pthread_create(&th, NULL, call_layer_on_thread, &t);
    pthread_join(th, NULL);
    CHECK_STATUS(t.st, SDPA_OK);
    return t.ran;
}

static void test_layer_call_time_override(void)
{
    sdpa_context *ctx = cpu_ctx_with_scripts();
    sdpa_context_load_policy_text(ctx, "rule r\ndevice cpu\ntry test.b\nevidence x\n", "r.rules");
    run_setup r;
    setup(&r, ctx, 1);
    sdpa_layer_desc ld = SDPA_LAYER_DESC_DEFAULT;
    ld.name = "blocks.1.attn1";
    sdpa_layer *layer;
    CHECK_STATUS(sdpa_layer_create(ctx, &ld, &layer), SDPA_OK); /* no override captured */

    /* The first call of the layer happens inside thread A's override. */
    sdpa_override_push("test.c");
    CHECK_STATUS(sdpa_layer_forward(layer, &r.p.q, &r.p.k, &r.p.v, &r.out.t, r.out.lse, NULL),
                 SDPA_OK);
    CHECK(strcmp(sdpa_last_backend(), "test.c") == 0, "under A's override ran %s",
          sdpa_last_backend());
    sdpa_override_pop();
    CHECK_STATUS(sdpa_layer_forward(layer, &r.p.q, &r.p.k, &r.p.v, &r.out.t, r.out.lse, NULL),
                 SDPA_OK);
    CHECK(strcmp(sdpa_last_backend(), "test.b") == 0, "thread A after the pop ran %s",
          sdpa_last_backend());
    const char *ran = ran_on_thread(layer, &r, NULL);
    CHECK(strcmp(ran, "test.b") == 0, "thread B with no override ran %s", ran);

    /* B's override applies to B's call only, also once the cache is warm. */
    ran = ran_on_thread(layer, &r, "test.a");
    CHECK(strcmp(ran, "test.a") == 0, "thread B under its override ran %s", ran);
    CHECK_STATUS(sdpa_layer_forward(layer, &r.p.q, &r.p.k, &r.p.v, &r.out.t, r.out.lse, NULL),
                 SDPA_OK);
    CHECK(strcmp(sdpa_last_backend(), "test.b") == 0, "thread A after B's override ran %s",
          sdpa_last_backend());
    sdpa_layer_destroy(layer);

    /* A captured override keeps applying on every thread; a caller's
     * override beats it; the layer's own backend beats the caller's. */
    sdpa_override_push("test.c");
    CHECK_STATUS(sdpa_layer_create(ctx, &ld, &layer), SDPA_OK);
    sdpa_override_pop();
    ran = ran_on_thread(layer, &r, NULL);
    CHECK(strcmp(ran, "test.c") == 0, "captured override on thread B: ran %s", ran);
    ran = ran_on_thread(layer, &r, "test.a");
    CHECK(strcmp(ran, "test.a") == 0, "caller's override over the captured one: ran %s", ran);
    sdpa_layer_destroy(layer);
    ld.backend = "test.c";
    CHECK_STATUS(sdpa_layer_create(ctx, &ld, &layer), SDPA_OK);
    ran = ran_on_thread(layer, &r, "test.a");
    CHECK(strcmp(ran, "test.c") == 0, "the layer's own backend over the caller's: ran %s", ran);
    sdpa_layer_destroy(layer);
    teardown(&r);
    sdpa_context_destroy(ctx);
}

/* ---- many threads, one layer */

typedef struct worker {
    sdpa_layer *layer;
    const run_setup *r;
    int ok;
} worker;

static void *hammer(void *raw)
{
    worker *w = raw;
    const run_setup *r = w->r;
    tl_output out;
    tl_output_make(&out, &r->p);
    w->ok = 1;
    for (int i = 0; i < 25; i++) {
        sdpa_status st = sdpa_layer_forward(w->layer, &r->p.q, &r->p.k, &r->p.v, &out.t, out.lse,
                                            NULL);
        if (st != SDPA_OK || tl_max_diff(&out, &r->ref, NULL) > 1e-6)
            w->ok = 0;
    }
    tl_output_free(&out);
    return NULL;
}

static void test_concurrency(void)
{
    sdpa_context *ctx = cpu_ctx_with_scripts();
    sa.run_status = SDPA_UNSUPPORTED;
    sdpa_context_load_policy_text(ctx, "rule r\ndevice cpu\ntry test.a test.b\nevidence x\n",
                                  "r.rules");
    run_setup r;
    setup(&r, ctx, 1);
    sdpa_layer *layer;
    sdpa_layer_desc ld = SDPA_LAYER_DESC_DEFAULT;
    ld.name = "shared.attn";
    sdpa_layer_create(ctx, &ld, &layer);
    tl_log_reset();
    enum { N = 6 };
    pthread_t th[N];
    worker w[N];
    for (int i = 0; i < N; i++) {
        w[i] = (worker){layer, &r, 0};
        pthread_create(&th[i], NULL, hammer, &w[i]);
    }
    int all_ok = 1;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        all_ok &= w[i].ok;
    }
    CHECK(all_ok, "every concurrent call succeeded with the correct result");
    CHECK(tl_log_warnings == 1, "exactly one warning across threads, got %d", tl_log_warnings);
    CHECK(atomic_load(&sa.runs) >= 1 && atomic_load(&sa.runs) <= N,
          "latched backend ran %d times", atomic_load(&sa.runs));
    sdpa_layer_destroy(layer);
    teardown(&r);
    sa.run_status = SDPA_OK;
    sdpa_context_destroy(ctx);
}

/* The checkers must catch a backend that returns a wrong answer. */
static void test_wrong_result_detected(void)
{
    sdpa_context *ctx = cpu_ctx_with_scripts();
    sa.wrong_result = 1;
    run_setup r;
    setup(&r, ctx, 0);
    sdpa_params prm = SDPA_PARAMS_DEFAULT;
    prm.backend = "test.a";
    CHECK_STATUS(sdpa_forward(ctx, &r.p.q, &r.p.k, &r.p.v, &r.out.t, NULL, &prm), SDPA_OK);
    CHECK(!correct(&r), "a wrong result went unnoticed");
    teardown(&r);
    sdpa_context_destroy(ctx);
}

/* Explain text and JSON carry the decision. */
static void test_explain(void)
{
    sdpa_context *ctx = tl_context("cuda:sm_100,cudnn=91900");
    sdpa_call_desc d = cuda_call(1, 8190, 24, 2, 128);
    char *text = NULL;
    CHECK_STATUS(sdpa_explain(ctx, &d, 1, &text), SDPA_OK);
    CHECK(text && strstr(text, "\"candidates\":[\"cuda.flash\",\"cuda.unfused\"]") &&
              strstr(text, "\"rejected\":{") && strstr(text, "gqa-not-cudnn"),
          "json: %s", text ? text : "(null)");
    sdpa_free(text);
    CHECK_STATUS(sdpa_explain(ctx, &d, 0, &text), SDPA_OK);
    CHECK(text && strstr(text, "not present here") && strstr(text, "1. cuda.flash"), "text: %s",
          text ? text : "(null)");
    sdpa_free(text);
    d.Hkv = 5; /* Hq % Hkv != 0 */
    CHECK_STATUS(sdpa_explain(ctx, &d, 0, &text), SDPA_INVALID_ARGUMENT);
    sdpa_context_destroy(ctx);
}

/* Contexts that ask share one pool per width, from several threads at once. */
typedef struct pool_arg {
    sdpa_context *ctx;
    int ok;
} pool_arg;

static void *pool_thread(void *raw)
{
    pool_arg *a = raw;
    tl_case c = {1, 90, 70, 4, 2, 64, SDPA_F32, SDPA_F32, SDPA_CAUSAL_NONE, TL_BSHD, 1, TL_UNIFORM, 0, 0};
    a->ok = 1;
    for (int i = 0; i < 4; i++) {
        double diff;
        char ran[64];
        a->ok &= tl_run_against_ref(a->ctx, "cpu.portable", &c, &diff, ran, sizeof ran) ==
                     SDPA_OK &&
                 diff < 2e-5;
    }
    return NULL;
}

static void test_shared_pool(void)
{
    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    o.threads = 2, o.ignore_env = 1, o.share_pool = 1;
    sdpa_context *a, *b, *c, *own;
    CHECK_STATUS(sdpa_context_create(&o, &a), SDPA_OK);
    CHECK_STATUS(sdpa_context_create(&o, &b), SDPA_OK);
    o.threads = 3;
    CHECK_STATUS(sdpa_context_create(&o, &c), SDPA_OK);
    o.threads = 2, o.share_pool = 0;
    CHECK_STATUS(sdpa_context_create(&o, &own), SDPA_OK);
    sdpa_pool *pa, *pb, *pc, *pown;
    sdpa__ctx_pool(a, &pa), sdpa__ctx_pool(b, &pb), sdpa__ctx_pool(c, &pc);
    sdpa__ctx_pool(own, &pown);
    CHECK(pa == pb && pa != pc && pa != pown, "pools: %p %p (3 wide: %p, own: %p)", (void *)pa,
          (void *)pb, (void *)pc, (void *)pown);
    pool_arg args[4] = {{a, 0}, {b, 0}, {c, 0}, {own, 0}};
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, pool_thread, &args[i]);
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        CHECK(args[i].ok, "context %d: wrong result on a shared pool", i);
    }
    sdpa_context_destroy(a); /* b still holds the pool */
    pool_arg again = {b, 0};
    pool_thread(&again);
    CHECK(again.ok, "the shared pool stopped with the first context");
    sdpa_context_destroy(b), sdpa_context_destroy(c), sdpa_context_destroy(own);
}

/* A context on this machine with SDPA_MAX_ISA=level (left set). */
static sdpa_context *capped_context(const char *level)
{
    setenv("SDPA_MAX_ISA", level, 1);
    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    o.threads = 2;
    o.log_level = SDPA_LOG_WARN;
    sdpa_context *ctx = NULL;
    CHECK_STATUS(sdpa_context_create(&o, &ctx), SDPA_OK);
    return ctx;
}

/* The same for bf16 inputs, whose chain starts with the bf16-product
 * kernels: each level's first kernel runs and is within its tolerance. */
static void max_isa_bf16(const sdpa_platform *host)
{
    static const struct {
        const char *level;
        const char *expect_first;
        unsigned needs;
        int product_bits;
    } caps[] = {{"amx", "cpu.avx512bf16", SDPA_CPU_AVX512F | SDPA_CPU_AVX512BF16, 8},
                {"avx512bf16", "cpu.avx512bf16", SDPA_CPU_AVX512F | SDPA_CPU_AVX512BF16, 8},
                {"avx512", "cpu.avx512", SDPA_CPU_AVX512F, 0},
                {"avx2", "cpu.avx2", SDPA_CPU_AVX2, 0},
                {"portable", "cpu.portable", 0, 0}};
    for (size_t i = 0; i < sizeof caps / sizeof *caps; i++) {
        char what[64];
        snprintf(what, sizeof what, "SDPA_MAX_ISA=%s, bf16", caps[i].level);
        if ((host->cpu_features & caps[i].needs) != caps[i].needs) {
            tl_skip(what, "this CPU lacks the ISA");
            continue;
        }
        /* With AMX, rule cpu-amx-bf16 puts cpu.amx first; on an Intel core
         * without it (or capped below it), cpu-intel-bf16 puts cpu.avx512
         * first (VDPBF16PS at half the fp32 rate there). */
        const int amx_host = strcmp(caps[i].level, "amx") == 0 &&
                             (host->cpu_features & SDPA_CPU_AMX_BF16);
        const int intel = strcmp(host->cpu_vendor, "intel") == 0 &&
                          (host->cpu_features & SDPA_CPU_AVX512F) &&
                          strcmp(caps[i].expect_first, "cpu.avx512bf16") == 0;
        const char *expect_first = amx_host ? "cpu.amx"
                                   : intel  ? "cpu.avx512"
                                            : caps[i].expect_first;
        const int product_bits = amx_host ? 8 : intel ? 0 : caps[i].product_bits;
        sdpa_context *ctx = capped_context(caps[i].level);
        if (!ctx)
            continue;
        tl_case c = {1, 70, 45, 4, 2, 32, SDPA_BF16, SDPA_F32, SDPA_CAUSAL_NONE, TL_BSHD, 1, TL_UNIFORM, 0, 0};
        double diff;
        char ran[64];
        CHECK_STATUS(tl_run_against_ref(ctx, NULL, &c, &diff, ran, sizeof ran), SDPA_OK);
        CHECK(strcmp(ran, expect_first) == 0, "%s ran %s, expected %s", what, ran,
              expect_first);
        CHECK(diff <= tl_tolerance(SDPA_BF16, SDPA_F32) + tl_product_tolerance(product_bits),
              "%s: off by %g", what, diff);
        sdpa_context_destroy(ctx);
    }
}

/* SDPA_MAX_ISA caps the CPU kernels; every fallback this CPU allows runs. */
static void test_max_isa(void)
{
    static const struct {
        const char *level;
        const char *expect_first;
        unsigned needs;
    } caps[] = {{"amx", "cpu.avx512", SDPA_CPU_AVX512F},
                {"avx512", "cpu.avx512", SDPA_CPU_AVX512F},
                {"avx2", "cpu.avx2", SDPA_CPU_AVX2},
                {"portable", "cpu.portable", 0}};
    sdpa_platform host;
    sdpa_platform_detect(&host);
    for (size_t i = 0; i < sizeof caps / sizeof *caps; i++) {
        if ((host.cpu_features & caps[i].needs) != caps[i].needs) {
            char what[64];
            snprintf(what, sizeof what, "SDPA_MAX_ISA=%s", caps[i].level);
            tl_skip(what, "this CPU lacks the ISA");
            continue;
        }
        sdpa_context *ctx = capped_context(caps[i].level);
        if (!ctx)
            continue;
        sdpa_status st;
        sdpa_call_desc d = cpu_call();
        decide(ctx, &d);
        FIRST(caps[i].expect_first);
        run_setup r;
        setup(&r, ctx, 1);
        CHECK_STATUS(sdpa_forward(ctx, &r.p.q, &r.p.k, &r.p.v, &r.out.t, r.out.lse, NULL),
                     SDPA_OK);
        CHECK(strcmp(sdpa_last_backend(), caps[i].expect_first) == 0 &&
                  tl_max_diff(&r.out, &r.ref, NULL) < 2e-5,
              "SDPA_MAX_ISA=%s ran %s", caps[i].level, sdpa_last_backend());
        if (strcmp(caps[i].level, "avx2") == 0 || strcmp(caps[i].level, "portable") == 0) {
            sdpa_params prm = SDPA_PARAMS_DEFAULT; /* capped away: explicit use refused */
            prm.backend = "cpu.avx512";
            st = sdpa_forward(ctx, &r.p.q, &r.p.k, &r.p.v, &r.out.t, NULL, &prm);
            CHECK(st == SDPA_UNSUPPORTED && strstr(sdpa_last_error(), "AVX-512"),
                  "capped cpu.avx512: %s %s", sdpa_status_string(st), sdpa_last_error());
        }
        teardown(&r);
        sdpa_context_destroy(ctx);
    }
    max_isa_bf16(&host);
    setenv("SDPA_MAX_ISA", "sse9", 1);
    sdpa_context *ctx;
    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    CHECK_STATUS(sdpa_context_create(&o, &ctx), SDPA_INVALID_ARGUMENT);
    CHECK(strstr(sdpa_last_error(), "SDPA_MAX_ISA='sse9'") != NULL, "%s", sdpa_last_error());
    unsetenv("SDPA_MAX_ISA");

    /* A simulated CPU without AVX-512 decides for itself, not for this one. */
    ctx = tl_context("cpu:isa=avx2");
    sdpa_call_desc d = cpu_call();
    decide(ctx, &d);
    CHECK(strcmp(dec.candidates[0], "cpu.avx512") != 0, "no AVX-512 on cpu:isa=avx2");
    CHECK(strstr(reason_of(&dec, "cpu.avx512"), "AVX-512") != NULL, "reason: %s",
          reason_of(&dec, "cpu.avx512"));
    sdpa_context_destroy(ctx);
}

/* ---- one-shot calls: the context's decision cache (decision_cache.h) */

static _Atomic int decisions_logged; /* debug lines "sdpa_forward: ... -> [...]" */

static void count_decisions(sdpa_log_level level, const char *message, void *user)
{
    (void)user;
    if (level == SDPA_LOG_DEBUG && strstr(message, " -> ["))
        atomic_fetch_add(&decisions_logged, 1);
}

typedef struct oneshot_thread {
    sdpa_context *ctx;
    const run_setup *r;
    const char *push;
    char ran[32];
} oneshot_thread;

static void *forward_on_thread(void *raw)
{
    oneshot_thread *t = raw;
    tl_output out;
    tl_output_make(&out, &t->r->p);
    if (t->push)
        sdpa_override_push(t->push);
    const sdpa_status st = sdpa_forward(t->ctx, &t->r->p.q, &t->r->p.k, &t->r->p.v, &out.t,
                                        out.lse, NULL);
    snprintf(t->ran, sizeof t->ran, "%s", st == SDPA_OK ? sdpa_last_backend() : "(failed)");
    if (t->push)
        sdpa_override_pop();
    tl_output_free(&out);
    return NULL;
}

/* sdpa_forward on the calling thread: which backend ran. */
static const char *forward_ran(sdpa_context *ctx, run_setup *r, const char *component)
{
    sdpa_params prm = SDPA_PARAMS_DEFAULT;
    prm.component = component;
    const sdpa_status st = sdpa_forward(ctx, &r->p.q, &r->p.k, &r->p.v, &r->out.t, r->out.lse,
                                        &prm);
    return st == SDPA_OK && correct(r) ? sdpa_last_backend() : "(failed or wrong)";
}

static void test_oneshot_cache(void)
{
    sdpa_platform plat;
    sdpa_platform_parse("cpu:isa=portable", &plat);
    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    o.platform = &plat, o.threads = 1, o.ignore_env = 1;
    o.log = count_decisions, o.log_level = SDPA_LOG_DEBUG;
    sdpa_context *ctx;
    CHECK_STATUS(sdpa_context_create(&o, &ctx), SDPA_OK);
    memset(&sa, 0, sizeof sa), memset(&sb, 0, sizeof sb), memset(&sc, 0, sizeof sc);
    scripted_add(ctx, "test.a", &sa);
    scripted_add(ctx, "test.b", &sb);
    scripted_add(ctx, "test.c", &sc);
    sdpa_context_load_policy_text(ctx, "rule r\ndevice cpu\ntry test.b\nevidence x\n", "r.rules");
    run_setup r;
    setup(&r, ctx, 1);
    atomic_store(&decisions_logged, 0);
    const char *ran = forward_ran(ctx, &r, NULL);
    CHECK(strcmp(ran, "test.b") == 0, "rule's choice: ran %s", ran);
    for (int i = 0; i < 3; i++)
        forward_ran(ctx, &r, NULL);
    CHECK(atomic_load(&decisions_logged) == 1, "4 calls of one shape: %d decisions, expected 1 "
          "(cached)", atomic_load(&decisions_logged));

    /* A scoped override is decided fresh and never cached, whether the
     * cache is cold (another shape) or warm. */
    sdpa_override_push("test.c");
    ran = forward_ran(ctx, &r, NULL);
    CHECK(strcmp(ran, "test.c") == 0, "under the override: ran %s", ran);
    sdpa_override_pop();
    ran = forward_ran(ctx, &r, NULL);
    CHECK(strcmp(ran, "test.b") == 0, "after the pop: ran %s", ran);
    oneshot_thread t = {ctx, &r, "test.a", ""};
    pthread_t th;
    pthread_create(&th, NULL, forward_on_thread, &t);
    pthread_join(th, NULL);
    CHECK(strcmp(t.ran, "test.a") == 0, "thread B under its override ran %s", t.ran);
    ran = forward_ran(ctx, &r, NULL);
    CHECK(strcmp(ran, "test.b") == 0, "thread A after B's override ran %s", ran);
    t = (oneshot_thread){ctx, &r, NULL, ""};
    sdpa_override_push("test.c"); /* A's override does not reach B's call */
    pthread_create(&th, NULL, forward_on_thread, &t);
    pthread_join(th, NULL);
    sdpa_override_pop();
    CHECK(strcmp(t.ran, "test.b") == 0, "thread B while A holds an override ran %s", t.ran);
    tl_case other = {1, 33, 45, 4, 2, 32, SDPA_F32, SDPA_F32, SDPA_CAUSAL_NONE, TL_BSHD, 1,
                     TL_UNIFORM, 0, 0};
    run_setup r2;
    tl_problem_make(&r2.p, &other);
    tl_output_make(&r2.out, &r2.p);
    sdpa_override_push("test.c"); /* first call of a new shape under an override */
    CHECK_STATUS(sdpa_forward(ctx, &r2.p.q, &r2.p.k, &r2.p.v, &r2.out.t, r2.out.lse, NULL),
                 SDPA_OK);
    sdpa_override_pop();
    CHECK_STATUS(sdpa_forward(ctx, &r2.p.q, &r2.p.k, &r2.p.v, &r2.out.t, r2.out.lse, NULL),
                 SDPA_OK);
    CHECK(strcmp(sdpa_last_backend(), "test.b") == 0, "new shape after the override: ran %s",
          sdpa_last_backend());
    tl_output_free(&r2.out);
    tl_problem_free(&r2.p);

    /* A component's backend: its own entry; setting or clearing it, and
     * loading rules, make every entry stale. */
    CHECK_STATUS(sdpa_context_set_component_backend(ctx, "text_encoder", "test.a"), SDPA_OK);
    ran = forward_ran(ctx, &r, "text_encoder");
    CHECK(strcmp(ran, "test.a") == 0, "component text_encoder: ran %s", ran);
    ran = forward_ran(ctx, &r, "transformer");
    CHECK(strcmp(ran, "test.b") == 0, "component transformer: ran %s", ran);
    ran = forward_ran(ctx, &r, NULL);
    CHECK(strcmp(ran, "test.b") == 0, "no component: ran %s", ran);
    CHECK_STATUS(sdpa_context_set_component_backend(ctx, "text_encoder", NULL), SDPA_OK);
    ran = forward_ran(ctx, &r, "text_encoder");
    CHECK(strcmp(ran, "test.b") == 0, "component cleared: ran %s", ran);
    sdpa_context_load_policy_text(ctx, "rule r2\ndevice cpu\ntry test.c\nevidence x\n", "r2.rules");
    ran = forward_ran(ctx, &r, NULL);
    CHECK(strcmp(ran, "test.c") == 0, "after loading rules: ran %s", ran);
    sb.refuse = "scripted: refuses now"; /* passed over in the next decision */
    sdpa_context_load_policy_text(ctx, "rule r3\ndevice cpu\ntry test.b test.a\nevidence x\n",
                                  "r3.rules");
    ran = forward_ran(ctx, &r, NULL);
    CHECK(strcmp(ran, "test.a") == 0, "first candidate refusing: ran %s", ran);
    sb.refuse = NULL;
    teardown(&r);
    sdpa_context_destroy(ctx);
}

int main(void)
{
    tl_seed_from_env();
    test_cuda_rules();
    test_cpu_rules_per_cpu();
    test_precedence();
    test_explicit_refusal();
    test_lse_forcing();
    test_latch();
    test_layer_call_time_override();
    test_oneshot_cache();
    test_warmup();
    test_shared_pool();
    test_concurrency();
    test_wrong_result_detected();
    test_explain();
    test_max_isa();
    return tl_finish();
}
