/*
 * test_policy.c - the rule file: parsing, errors that name file, line and
 * problem, matching, precedence of user files over the built-in rules.
 */
#define _POSIX_C_SOURCE 200809L
#include "support/testlib.h"
#include "dispatch/policy.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int known(const char *name, void *user)
{
    (void)user;
    return strcmp(name, "cuda.cudnn") == 0 || strcmp(name, "cuda.flash") == 0 ||
           strcmp(name, "cpu.portable") == 0 || strcmp(name, "ref") == 0;
}

static void expect_error(const char *text, const char *needle)
{
    sdpa_policy *pol = NULL;
    sdpa_status st = sdpa__policy_parse(text, "my.rules", known, NULL, &pol);
    CHECK(st == SDPA_INVALID_ARGUMENT && pol == NULL, "accepted bad rules: %s", text);
    CHECK(strstr(sdpa_last_error(), needle) != NULL, "message '%s' lacks '%s'", sdpa_last_error(),
          needle);
}

static void test_errors(void)
{
    expect_error("rule a\ntry ref\n", "my.rules:1: rule 'a' has no 'evidence'");
    expect_error("rule a\nevidence x\n", "rule 'a' has no 'try'");
    expect_error("\n\nrule a\ncolour blue\n", "my.rules:4: unknown key 'colour'");
    expect_error("rule a\ntry cpu.fast\nevidence x\n", "my.rules:2: backend 'cpu.fast' unknown");
    expect_error("rule a\ncc 10\ntry ref\nevidence x\n", "my.rules:2: '10' is not a range");
    expect_error("rule a\nD 9-3\ntry ref\nevidence x\n", "'9-3' is not a range for D");
    expect_error("rule a\ndtype f64\ntry ref\nevidence x\n", "dtype 'f64' unknown");
    expect_error("rule a\ncausal maybe\ntry ref\nevidence x\n", "causal 'maybe' unknown");
    expect_error("rule a\nlse perhaps\ntry ref\nevidence x\n", "expected yes or no");
    expect_error("try ref\n", "my.rules:1: 'try' before the first 'rule NAME'");
    expect_error("rule a\ntry ref\nevidence x\nrule a\ntry ref\nevidence y\n",
                 "my.rules:4: rule 'a' already defined at my.rules:1");
    expect_error("rule a b\ntry ref\nevidence x\n", "needs one name");
    expect_error("rule a\ntry ref ref\nevidence x\n", "listed twice");
    expect_error("rule a\ndevice tpu\ntry ref\nevidence x\n", "device 'tpu' unknown");
    expect_error("rule a\nisa sse9\ntry ref\nevidence x\n", "isa 'sse9' unknown");
    expect_error("rule a\npass sideways\ntry ref\nevidence x\n", "pass 'sideways' unknown");
    expect_error("rule a\nfamily zen\ntry ref\nevidence x\n",
                 "my.rules:2: 'zen' is not a family, expected a CPUID display family");
    expect_error("rule a\nfamily 25 26\ntry ref\nevidence x\n", "is not a family");
    expect_error("rule a\nvendor via\ntry ref\nevidence x\n",
                 "my.rules:2: vendor 'via' unknown, expected intel, amd or other");
    expect_error("rule a\nvendor intel amd other intel\ntry ref\nevidence x\n", "too many vendors");
    expect_error("rule a\ntry ref\nevidence\n", "evidence is empty");
    /* numbers beyond 64 bits (they used to saturate, and '>' then
     * overflowed) and beyond any real size are rejected with file:line */
    expect_error("rule a\nSq >99999999999999999999\ntry ref\nevidence x\n", "my.rules:2:");
    expect_error("rule a\nSq >9223372036854775807\ntry ref\nevidence x\n", "not a range");
    expect_error("rule a\nB 1-99999999999999999999\ntry ref\nevidence x\n", "not a range");
    /* a name that would be truncated (two such names collided) */
    expect_error("rule a234567890123456789012345678901234567890123456789012345678901234\n"
                 "try ref\nevidence x\n",
                 "expected at most 63");
}

static sdpa_call_desc call(sdpa_device_kind dev, int64_t B, int64_t S, int64_t D)
{
    sdpa_call_desc d;
    memset(&d, 0, sizeof d);
    d.device = dev, d.dtype = SDPA_BF16, d.B = B, d.Sq = d.Skv = S, d.Hq = d.Hkv = 8, d.D = D;
    return d;
}

/* Rule names and evidence reach explain's JSON whatever bytes they hold. */
static void test_json_escaping(void)
{
    sdpa_context *ctx = tl_context(NULL);
    CHECK_STATUS(sdpa_context_load_policy_text(
                     ctx, "rule bad\xff\xc3(name\ndevice cpu\ntry ref\nevidence caf\xc3\xa9 \xed\xa0\x80\n",
                     "u.rules"),
                 SDPA_OK);
    sdpa_call_desc d = call(SDPA_DEVICE_CPU, 1, 64, 64);
    char *text = NULL;
    CHECK_STATUS(sdpa_explain(ctx, &d, 1, &text), SDPA_OK);
    int valid = text != NULL;
    for (const unsigned char *p = (const unsigned char *)(text ? text : ""); *p; p++)
        valid &= *p < 0x80 || (*p == 0xc3 && p[1] == 0xa9 && (p++, 1)); /* only the é */
    CHECK(valid && strstr(text, "bad\\ufffd\\ufffd(name") && strstr(text, "caf\xc3\xa9 \\ufffd"),
          "explain --json with invalid UTF-8: %s", text ? text : "(null)");
    sdpa_free(text);
    sdpa_context_destroy(ctx);
}

/* kv_dtype matches k and v's dtype, which a mixed call has apart from q's. */
static void test_kv_dtype(void)
{
    expect_error("rule a\nkv_dtype f8\ntry ref\nevidence x\n", "kv_dtype 'f8' unknown");
    sdpa_context *ctx = tl_context(NULL);
    CHECK_STATUS(sdpa_context_load_policy_text(ctx,
                                               "rule mixed\ndevice cpu\ndtype f32\nkv_dtype f16\n"
                                               "try cpu.portable\nevidence x\n",
                                               "u.rules"),
                 SDPA_OK);
    sdpa_call_desc d = call(SDPA_DEVICE_CPU, 1, 64, 64);
    d.dtype = SDPA_F32;
    sdpa_decision dec;
    CHECK_STATUS(sdpa_decide(ctx, &d, &dec), SDPA_OK);
    CHECK(strcmp(dec.rule, "mixed") != 0, "f32 k, v matched kv_dtype f16: %s", dec.rule);
    d.kv_dtype = SDPA_KV_DTYPE(SDPA_F16);
    CHECK_STATUS(sdpa_decide(ctx, &d, &dec), SDPA_OK);
    CHECK(strcmp(dec.rule, "mixed") == 0 && strcmp(dec.candidates[0], "cpu.portable") == 0,
          "q f32, k, v f16: rule %s, first %s", dec.rule, dec.candidates[0]);
    d.kv_dtype = 9;
    CHECK_STATUS(sdpa_decide(ctx, &d, &dec), SDPA_INVALID_ARGUMENT);
    sdpa_context_destroy(ctx);
}

/* Only regular files of at most 1 MiB are read; a FIFO is not waited on. */
static void test_file_limits(void)
{
    sdpa_context *ctx = tl_context(NULL);
    char fifo[] = "/tmp/sdpa_policy_fifo_XXXXXX";
    int fd = mkstemp(fifo);
    close(fd);
    unlink(fifo);
    if (mkfifo(fifo, 0600) == 0) {
        CHECK_STATUS(sdpa_context_load_policy(ctx, fifo), SDPA_INVALID_ARGUMENT);
        CHECK(strstr(sdpa_last_error(), "not a regular file"), "FIFO: %s", sdpa_last_error());
        unlink(fifo);
    } else {
        tl_skip("policy file FIFO", "mkfifo failed");
    }
    CHECK_STATUS(sdpa_context_load_policy(ctx, "/tmp"), SDPA_INVALID_ARGUMENT);
    char big[] = "/tmp/sdpa_policy_big_XXXXXX";
    fd = mkstemp(big);
    CHECK(ftruncate(fd, (1 << 20) + 1) == 0, "ftruncate");
    close(fd);
    CHECK_STATUS(sdpa_context_load_policy(ctx, big), SDPA_INVALID_ARGUMENT);
    CHECK(strstr(sdpa_last_error(), "expected at most 1048576"), "big file: %s",
          sdpa_last_error());
    unlink(big);
    sdpa_context_destroy(ctx);
}

static void test_matching(void)
{
    const char *text = "# comment\n"
                       "rule r1\n"
                       "device cuda\n"
                       "cc 9.0-10.x\n"
                       "cudnn >=90000\n"
                       "D 64-128\n"
                       "B >=4\n"
                       "Sq <2048\n"
                       "same_seq yes\n"
                       "quant none fp8\n"
                       "component transformer\n"
                       "try cuda.cudnn cuda.flash\n"
                       "evidence test # not a comment here\n";
    sdpa_policy *pol;
    CHECK_STATUS(sdpa__policy_parse(text, "m.rules", known, NULL, &pol), SDPA_OK);
    if (!pol)
        return;
    const sdpa_rule *r = &pol->rules[0];
    CHECK(strcmp(r->evidence, "test # not a comment here") == 0, "evidence '%s'", r->evidence);
    CHECK(strcmp(r->origin, "m.rules:2") == 0, "origin %s", r->origin);
    sdpa_platform p;
    sdpa_platform_parse("cuda:sm_100", &p);
    sdpa_call_desc d = call(SDPA_DEVICE_CUDA, 4, 1024, 128);
    d.component = "transformer";
    CHECK(sdpa__rule_matches(r, &p, &d), "matches");
    d.quant = "fp8";
    CHECK(sdpa__rule_matches(r, &p, &d), "fp8 listed");
    d.quant = "nvfp4";
    CHECK(!sdpa__rule_matches(r, &p, &d), "nvfp4 not listed");
    d.quant = NULL;
    d.B = 3;
    CHECK(!sdpa__rule_matches(r, &p, &d), "B >= 4");
    d.B = 4, d.Sq = 2048, d.Skv = 2048;
    CHECK(!sdpa__rule_matches(r, &p, &d), "Sq < 2048");
    d.Sq = 1024, d.Skv = 77;
    CHECK(!sdpa__rule_matches(r, &p, &d), "same_seq");
    d.Skv = 1024, d.D = 256;
    CHECK(!sdpa__rule_matches(r, &p, &d), "D range");
    d.D = 64, d.component = "text_encoder";
    CHECK(!sdpa__rule_matches(r, &p, &d), "component");
    d.component = "transformer";
    sdpa_platform_parse("cuda:sm_120", &p);
    CHECK(!sdpa__rule_matches(r, &p, &d), "cc 12.0 outside 9.0-10.x");
    sdpa_platform_parse("cuda:sm_90,cudnn=8900", &p);
    CHECK(!sdpa__rule_matches(r, &p, &d), "cudnn too old");
    sdpa_platform_parse("cpu", &p);
    d.device = SDPA_DEVICE_CPU;
    CHECK(!sdpa__rule_matches(r, &p, &d), "device");
    sdpa__policy_free(pol);

    /* pass: a rule without it is for forward calls only */
    const char *passes = "rule fwd\ntry ref\nevidence e\n"
                         "rule bwd\npass backward\ntry ref\nevidence e\n"
                         "rule both\npass forward backward\ntry ref\nevidence e\n";
    CHECK_STATUS(sdpa__policy_parse(passes, "p.rules", known, NULL, &pol), SDPA_OK);
    if (!pol)
        return;
    sdpa_platform_parse("cpu", &p);
    d = call(SDPA_DEVICE_CPU, 1, 64, 64);
    const int want[3][2] = {{1, 0}, {0, 1}, {1, 1}}; /* [rule][backward] */
    for (int i = 0; i < 3; i++)
        for (int bwd = 0; bwd <= 1; bwd++) {
            d.backward = bwd;
            CHECK(sdpa__rule_matches(&pol->rules[i], &p, &d) == want[i][bwd],
                  "rule %s on a %s call", pol->rules[i].name, bwd ? "backward" : "forward");
        }
    sdpa__policy_free(pol);
}

/* Two rules parsed from `text`, and on each described platform (a CPU or
 * a CUDA call) whether each matches: the CPU conditions' cases below. */
typedef struct match_case {
    const char *platform;
    int dev, want0, want1;
} match_case;

static void check_two_rules(const char *text, const char *what, const match_case *cases,
                            size_t n)
{
    sdpa_policy *pol = NULL;
    CHECK_STATUS(sdpa__policy_parse(text, "m.rules", known, NULL, &pol), SDPA_OK);
    if (!pol)
        return;
    for (size_t i = 0; i < n; i++) {
        sdpa_platform p;
        CHECK_STATUS(sdpa_platform_parse(cases[i].platform, &p), SDPA_OK);
        sdpa_call_desc d = call((sdpa_device_kind)cases[i].dev, 1, 64, 64);
        CHECK(sdpa__rule_matches(&pol->rules[0], &p, &d) == cases[i].want0 &&
                  sdpa__rule_matches(&pol->rules[1], &p, &d) == cases[i].want1,
              "%s rules on %s (%s call)", what, cases[i].platform,
              cases[i].dev == SDPA_DEVICE_CPU ? "cpu" : "cuda");
    }
    sdpa__policy_free(pol);
}

/* `vendor`: the CPU's maker, never a CUDA call's. */
static void test_vendor_matching(void)
{
    static const match_case cases[] = {{"cpu:vendor=intel,features=avx2", SDPA_DEVICE_CPU, 1, 1},
                                       {"cpu:vendor=amd,features=avx2", SDPA_DEVICE_CPU, 0, 1},
                                       {"cpu:vendor=other,features=avx2", SDPA_DEVICE_CPU, 0, 0},
                                       {"cpu:features=avx2", SDPA_DEVICE_CPU, 0, 0},
                                       {"cpu:vendor=intel,features=avx2", SDPA_DEVICE_CUDA, 0, 0}};
    check_two_rules("rule i\nvendor intel\ntry ref\nevidence e\n"
                    "rule ia\nvendor amd intel\ntry ref\nevidence e\n",
                    "vendor", cases, sizeof cases / sizeof *cases);
}

/* `family`: the CPU's CPUID display family; a CPU that does not say one
 * (described without family=) matches no family rule, nor does a CUDA call. */
static void test_family_matching(void)
{
    static const match_case cases[] = {
        {"cpu:vendor=amd,family=25,features=avx2+avx512", SDPA_DEVICE_CPU, 1, 1},
        {"cpu:family=26,vendor=amd,features=avx2+avx512", SDPA_DEVICE_CPU, 0, 1},
        {"cpu:vendor=intel,family=6,features=avx2", SDPA_DEVICE_CPU, 0, 0},
        {"cpu:vendor=amd,features=avx2+avx512", SDPA_DEVICE_CPU, 0, 0},
        {"cpu:vendor=amd,family=25,features=avx2", SDPA_DEVICE_CUDA, 0, 0}};
    check_two_rules("rule zen4\nfamily 25\ntry ref\nevidence e\n"
                    "rule zen\nfamily 23-26\ntry ref\nevidence e\n",
                    "family", cases, sizeof cases / sizeof *cases);
    sdpa_platform p;
    CHECK_STATUS(sdpa_platform_parse("cpu:vendor=amd,family=zen4", &p), SDPA_INVALID_ARGUMENT);
    CHECK(strstr(sdpa_last_error(), "zen4") && strstr(sdpa_last_error(), "family"),
          "the refusal names the family: %s", sdpa_last_error());
    CHECK_STATUS(sdpa_platform_parse("cpu:family=0", &p), SDPA_INVALID_ARGUMENT);
}

static void test_user_file(void)
{
    char path[] = "/tmp/sdpa_policy_XXXXXX";
    int fd = mkstemp(path);
    const char *rules = "rule mine\ndevice cpu\ntry ref\nevidence measured by me\n";
    CHECK(write(fd, rules, strlen(rules)) == (ssize_t)strlen(rules), "write");
    close(fd);
    /* a described CPU, so that the built-in rule is the same on any host
     * (an Intel one stops at cpu-amx-bf16 or cpu-intel-bf16) */
    sdpa_context *ctx = tl_context("cpu:vendor=amd,features=avx2+avx512+avx512bf16");
    sdpa_call_desc d = call(SDPA_DEVICE_CPU, 1, 64, 64);
    sdpa_decision dec;
    sdpa_decide(ctx, &d, &dec);
    CHECK(strcmp(dec.rule, "cpu-bf16") == 0, "built-in rule %s", dec.rule);
    d.dtype = SDPA_F16; /* f16 is not rounded to bf16 by default */
    sdpa_decide(ctx, &d, &dec);
    CHECK(strcmp(dec.rule, "cpu-default") == 0, "built-in rule for f16 %s", dec.rule);
    d.dtype = SDPA_BF16;
    CHECK_STATUS(sdpa_context_load_policy(ctx, path), SDPA_OK);
    sdpa_decide(ctx, &d, &dec);
    CHECK(strcmp(dec.rule, "mine") == 0 && strcmp(dec.candidates[0], "ref") == 0,
          "user rule first: %s", dec.rule);
    CHECK(strstr(dec.rule_origin, path) != NULL, "origin names the file: %s", dec.rule_origin);
    sdpa_context_destroy(ctx);

    /* SDPA_POLICY: loaded at creation; a broken file fails creation. */
    setenv("SDPA_POLICY", path, 1);
    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    CHECK_STATUS(sdpa_context_create(&o, &ctx), SDPA_OK);
    sdpa_decide(ctx, &d, &dec);
    CHECK(strcmp(dec.rule, "mine") == 0, "SDPA_POLICY rule: %s", dec.rule);
    sdpa_context_destroy(ctx);
    FILE *f = fopen(path, "w");
    fputs("rule broken\ndevice cpu\ntry ref\n", f);
    fclose(f);
    CHECK_STATUS(sdpa_context_create(&o, &ctx), SDPA_INVALID_ARGUMENT);
    CHECK(strstr(sdpa_last_error(), path) && strstr(sdpa_last_error(), ":1:"),
          "message names file and line: %s", sdpa_last_error());
    unsetenv("SDPA_POLICY");
    unlink(path);
    ctx = tl_context(NULL);
    CHECK_STATUS(sdpa_context_load_policy(ctx, "/nonexistent/rules"), SDPA_INVALID_ARGUMENT);
    CHECK(strstr(sdpa_last_error(), "/nonexistent/rules") != NULL, "%s", sdpa_last_error());
    sdpa_context_destroy(ctx);
}

static void test_default_rules_parse(void)
{
    sdpa_policy *pol;
    CHECK_STATUS(sdpa__policy_parse(sdpa__default_rules_text, "default.rules", known, NULL, &pol),
                 SDPA_INVALID_ARGUMENT); /* cuda.unfused is unknown to this test's list */
    sdpa_context *ctx = tl_context(NULL);
    CHECK(ctx != NULL, "the built-in rules load");
    sdpa_context_destroy(ctx);
}

static void test_platform_parse(void)
{
    sdpa_platform p;
    CHECK_STATUS(sdpa_platform_parse("cuda:sm_90a,cudnn=91001", &p), SDPA_OK);
    CHECK(p.cc_major == 9 && p.cc_minor == 0 && p.cudnn_version == 91001 && p.simulated,
          "parsed %d.%d %d", p.cc_major, p.cc_minor, p.cudnn_version);
    CHECK_STATUS(sdpa_platform_parse("cuda:sm_120", &p), SDPA_OK);
    CHECK(p.cc_major == 12 && p.cc_minor == 0, "sm_120");
    CHECK_STATUS(sdpa_platform_parse("cpu:isa=avx2", &p), SDPA_OK);
    CHECK(!(p.cpu_features & SDPA_CPU_AVX512F), "avx2 cap removes avx512");
    CHECK_STATUS(sdpa_platform_parse("tpu", &p), SDPA_INVALID_ARGUMENT);
    CHECK_STATUS(sdpa_platform_parse("cuda", &p), SDPA_INVALID_ARGUMENT);
    CHECK_STATUS(sdpa_platform_parse("cuda:sm_100,cudnn=x", &p), SDPA_INVALID_ARGUMENT);
    CHECK_STATUS(sdpa_platform_parse("cpu:isa=sse9", &p), SDPA_INVALID_ARGUMENT);
    CHECK(strstr(sdpa_last_error(), "sse9") != NULL, "%s", sdpa_last_error());
}

int main(void)
{
    test_errors();
    test_matching();
    test_vendor_matching();
    test_family_matching();
    test_user_file();
    test_default_rules_parse();
    test_platform_parse();
    test_json_escaping();
    test_file_limits();
    test_kv_dtype();
    return tl_finish();
}
