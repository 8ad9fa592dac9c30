/*
 * test_tune.c - the tuner against scripted backends and a fake clock:
 * rules over shape classes with evidence for a clear win, the order kept
 * within noise or below the minimum gain, one class over rows with one
 * winner (deciding the shapes between them and none beyond), a boundary
 * placed by measuring shapes between two rows (the gap left to the
 * built-in rules), head dims merged into a set; the rules load and decide;
 * a rule file made for another machine or version is refused (or loaded
 * with a warning when asked).
 */
#define _POSIX_C_SOURCE 200809L
#include "support/scripted.h"
#include "support/testlib.h"

#include <stdlib.h>
#include <string.h>

static scripted fast, slow;

static sdpa_context *setup(double cost_slow, double cost_fast, double jitter)
{
    sdpa_context *ctx = tl_context("cpu:isa=portable");
    memset(&fast, 0, sizeof fast), memset(&slow, 0, sizeof slow);
    slow.cost_ms = cost_slow, fast.cost_ms = cost_fast;
    slow.jitter = fast.jitter = jitter;
    scripted_add(ctx, "test.slow", &slow);
    scripted_add(ctx, "test.fast", &fast);
    /* The current order puts test.slow first. */
    sdpa_context_load_policy_text(ctx,
                                  "rule current\ndevice cpu\ntry test.slow test.fast ref\n"
                                  "evidence test\n",
                                  "current.rules");
    return ctx;
}

static char *tune(sdpa_context *ctx, sdpa_tune_row *rows, int n)
{
    static const char *names[] = {"test.slow", "test.fast"};
    sdpa_tune_options o = SDPA_TUNE_OPTIONS_DEFAULT;
    o.backends = names;
    o.n_backends = 2;
    o.reps = 9;
    o.clock_ms = scripted_clock_ms;
    char *text = NULL;
    CHECK_STATUS(sdpa_tune(ctx, rows, n, &o, &text), SDPA_OK);
    return text;
}

static sdpa_tune_row row(const char *name, int64_t S)
{
    sdpa_tune_row r;
    memset(&r, 0, sizeof r);
    r.name = name;
    r.desc.device = SDPA_DEVICE_CPU, r.desc.dtype = SDPA_F32;
    r.desc.B = 1, r.desc.Sq = r.desc.Skv = S, r.desc.Hq = r.desc.Hkv = 2, r.desc.D = 16;
    return r;
}

/* The decision for a shape like the rows' (S, head dim D): its first
 * backend, and the rule that made it in rule[]. */
static const char *first_for_d(sdpa_context *ctx, int64_t S, int64_t D, char *rule)
{
    static sdpa_decision dec;
    sdpa_call_desc d = row("x", S).desc;
    d.D = D;
    sdpa_decide(ctx, &d, &dec);
    if (rule)
        strcpy(rule, dec.rule);
    return dec.n_candidates ? dec.candidates[0] : "(none)";
}

static const char *first_for(sdpa_context *ctx, int64_t S)
{
    return first_for_d(ctx, S, 16, NULL);
}

/* Number of rules in a rule text. */
static int count_rules(const char *text)
{
    int n = 0;
    for (const char *p = text; p && (p = strstr(p, "\nrule ")); p++)
        n++;
    return n;
}

int main(void)
{
    tl_seed_from_env();
    sdpa_tune_row rows[2] = {row("clear win", 40), row("other", 24)};
    char rule[64];

    /* 1. A clear 20% win on one row: a rule for that shape (its class is
     * the one row), with its class and evidence, and it decides there
     * only. */
    sdpa_context *ctx = setup(10.0, 8.0, 0.02);
    char *text = tune(ctx, rows, 1);
    CHECK(text && strstr(text, "rule tuned-1-f32-self\n") &&
              strstr(text, "try         test.fast test.slow ref"),
          "rule written: %s", text ? text : "(null)");
    CHECK(text && strstr(text, "class       f32 self-attention, S 40, D 16, B 1, 2 heads") &&
              strstr(text, "evidence    1 row (clear win): test.fast fastest") &&
              strstr(text, "replaces the built-in choice") && strstr(text, "1.25-1.25x"),
          "class and evidence: %s", text ? text : "(null)");
    CHECK(text && strstr(text, "require libsdpa ") && strstr(text, "require cpu-model "),
          "require lines");
    CHECK(text && strstr(text, "Sq          40\n") && strstr(text, "keep the built-in rules"),
          "the measured shape only");
    CHECK_STATUS(sdpa_context_load_policy_text(ctx, text, "tuned.rules"), SDPA_OK);
    CHECK(strcmp(first_for(ctx, 40), "test.fast") == 0, "tuned shape: %s", first_for(ctx, 40));
    CHECK(strcmp(first_for_d(ctx, 24, 16, rule), "test.slow") == 0 && strcmp(rule, "current") == 0,
          "unmeasured shape keeps the built-in rule: %s by %s", first_for(ctx, 24), rule);
    sdpa_free(text);
    sdpa_context_destroy(ctx);

    /* 2. Equal within noise: the current first choice keeps the class, and
     * the rule says it confirms the built-in choice. */
    ctx = setup(10.0, 10.0, 0.10);
    text = tune(ctx, rows, 2);
    CHECK(text && count_rules(text) == 1 && strstr(text, "try         test.slow test.fast ref") &&
              strstr(text, "the built-in first choice") && strstr(text, "Sq          24-40"),
          "a tie keeps the order, over both rows: %s", text ? text : "(null)");
    sdpa_free(text);
    sdpa_context_destroy(ctx);

    /* 3. A real but 1% win: below the 2% minimum gain, a tie. */
    ctx = setup(10.0, 9.9, 0.0005);
    text = tune(ctx, rows, 1);
    CHECK(text && strstr(text, "try         test.slow") && strstr(text, "the built-in first choice"),
          "1%% win keeps the order: %s", text ? text : "(null)");
    sdpa_free(text);
    sdpa_context_destroy(ctx);

    /* 4. Ranges: one winner over S 32..256 gives one rule over that range,
     * which decides shapes between the rows and none beyond them. */
    ctx = setup(10.0, 8.0, 0.02);
    sdpa_tune_row range_rows[4] = {row("s256", 256), row("s32", 32), row("s64", 64),
                                   row("s128", 128)};
    text = tune(ctx, range_rows, 4);
    CHECK(text && count_rules(text) == 1 && strstr(text, "Sq          32-256\n") &&
              strstr(text, "Skv         32-256\n") && strstr(text, "4 rows (s32 s64 s128 s256)"),
          "one class over the rows, in key order: %s", text ? text : "(null)");
    CHECK_STATUS(sdpa_context_load_policy_text(ctx, text, "tuned.rules"), SDPA_OK);
    CHECK(strcmp(first_for_d(ctx, 100, 16, rule), "test.fast") == 0 &&
              strcmp(rule, "tuned-1-f32-self") == 0,
          "a shape between the rows: %s by %s", first_for(ctx, 100), rule);
    CHECK(strcmp(first_for_d(ctx, 512, 16, rule), "test.slow") == 0 && strcmp(rule, "current") == 0,
          "beyond the last row: %s by %s", first_for(ctx, 512), rule);
    CHECK(strcmp(first_for_d(ctx, 100, 32, rule), "test.slow") == 0,
          "another head dim is another class: %s by %s", first_for(ctx, 100), rule);
    sdpa_free(text);
    sdpa_context_destroy(ctx);

    /* 5. A boundary: test.fast costs 0.1 + 0.01 S ms, test.slow 1 ms, so
     * test.fast wins below S = 90 and loses above. Rows at 16, 32, 256, 512:
     * two classes, and the tuner measures shapes between 32 and 256 (91,
     * then 153) to narrow the gap; between the classes the built-in rules
     * decide. */
    ctx = setup(1.0, 0.1, 0.01);
    fast.cost_per_key_ms = 0.01;
    sdpa_tune_row edge_rows[4] = {row("s16", 16), row("s32", 32), row("s256", 256),
                                  row("s512", 512)};
    text = tune(ctx, edge_rows, 4);
    CHECK(text && count_rules(text) == 2 && strstr(text, "Sq          16-91\n") &&
              strstr(text, "Sq          153-512\n") &&
              strstr(text, "2 rows (s16 s32) and 1 shape measured between them: test.fast") &&
              strstr(text, "2 rows (s256 s512) and 1 shape measured between them: test.slow"),
          "a boundary placed by measuring between: %s", text ? text : "(null)");
    CHECK_STATUS(sdpa_context_load_policy_text(ctx, text, "tuned.rules"), SDPA_OK);
    CHECK(strcmp(first_for_d(ctx, 50, 16, rule), "test.fast") == 0 &&
              strcmp(rule, "tuned-1-f32-self") == 0,
          "S 50: %s by %s", first_for(ctx, 50), rule);
    CHECK(strcmp(first_for_d(ctx, 200, 16, rule), "test.slow") == 0 &&
              strcmp(rule, "tuned-2-f32-self") == 0,
          "S 200: %s by %s", first_for(ctx, 200), rule);
    CHECK(strcmp(first_for_d(ctx, 120, 16, rule), "test.slow") == 0 && strcmp(rule, "current") == 0,
          "S 120, in the gap no measurement covers: %s by %s", first_for(ctx, 120), rule);
    sdpa_free(text);
    /* without shapes between the rows the gap stays as the rows leave it */
    static const char *names[] = {"test.slow", "test.fast"};
    sdpa_tune_options to = SDPA_TUNE_OPTIONS_DEFAULT;
    to.backends = names, to.n_backends = 2, to.reps = 9, to.clock_ms = scripted_clock_ms;
    to.max_extra = -1;
    CHECK_STATUS(sdpa_tune(ctx, edge_rows, 4, &to, &text), SDPA_OK);
    CHECK(text && strstr(text, "Sq          16-32\n") && strstr(text, "Sq          256-512\n"),
          "no extra shapes: %s", text ? text : "(null)");
    sdpa_free(text);
    sdpa_context_destroy(ctx);

    /* 6. Head dims: two with the same winner over the same lengths merge,
     * D becoming a set. */
    ctx = setup(10.0, 8.0, 0.02);
    sdpa_tune_row dims[4] = {row("d16-s32", 32), row("d16-s64", 64), row("d32-s32", 32),
                             row("d32-s64", 64)};
    dims[2].desc.D = dims[3].desc.D = 32;
    text = tune(ctx, dims, 4);
    CHECK(text && count_rules(text) == 1 && strstr(text, "D           16 32\n"),
          "head dims merged into a set: %s", text ? text : "(null)");
    CHECK_STATUS(sdpa_context_load_policy_text(ctx, text, "tuned.rules"), SDPA_OK);
    CHECK(strcmp(first_for_d(ctx, 40, 32, rule), "test.fast") == 0 &&
              strcmp(first_for_d(ctx, 40, 24, rule), "test.slow") == 0,
          "D in the set, and not: %s", rule);
    sdpa_free(text);
    sdpa_context_destroy(ctx);

    /* 4. Foreign files: refused with the reason, or loaded with a warning. */
    ctx = tl_context(NULL);
    const char *foreign = "require cpu-model Imaginary CPU 9000\n\n"
                          "rule r\ndevice cpu\ntry ref\nevidence elsewhere\n";
    CHECK_STATUS(sdpa_context_load_policy_text(ctx, foreign, "other.rules"),
                 SDPA_INVALID_ARGUMENT);
    CHECK(strstr(sdpa_last_error(), "other.rules:1: made on CPU 'Imaginary CPU 9000'") &&
              strstr(sdpa_last_error(), "SDPA_POLICY_FOREIGN=warn"),
          "message: %s", sdpa_last_error());
    CHECK_STATUS(sdpa_context_load_policy_text(ctx, "require libsdpa 0.0.1\nrule r\ntry ref\n"
                                                    "evidence old\n",
                                               "old.rules"),
                 SDPA_INVALID_ARGUMENT);
    CHECK(strstr(sdpa_last_error(), "made for libsdpa 0.0.1") != NULL, "%s", sdpa_last_error());
    sdpa_context_destroy(ctx);
    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    o.ignore_env = 1;
    o.foreign_policy = 1;
    o.log = NULL;
    o.log_level = SDPA_LOG_ERROR;
    CHECK_STATUS(sdpa_context_create(&o, &ctx), SDPA_OK);
    CHECK_STATUS(sdpa_context_load_policy_text(ctx, foreign, "other.rules"), SDPA_OK);
    sdpa_context_destroy(ctx);
    CHECK_STATUS(sdpa_context_load_policy_text(NULL, foreign, "x"), SDPA_INVALID_ARGUMENT);
    return tl_finish();
}
