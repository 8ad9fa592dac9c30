/*
 * test_tune.c - the tuner against scripted backends and a fake clock:
 * it writes a rule with evidence for a clear win, keeps the order within
 * noise or below the minimum gain, and the rules it writes load and decide;
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

static const char *first_for(sdpa_context *ctx, int64_t S)
{
    static sdpa_decision dec;
    sdpa_call_desc d = row("x", S).desc;
    sdpa_decide(ctx, &d, &dec);
    return dec.n_candidates ? dec.candidates[0] : "(none)";
}

int main(void)
{
    tl_seed_from_env();
    sdpa_tune_row rows[2] = {row("clear win", 40), row("other", 24)};

    /* 1. A clear 20% win: one rule per row, with evidence, and it decides. */
    sdpa_context *ctx = setup(10.0, 8.0, 0.02);
    char *text = tune(ctx, rows, 1);
    CHECK(text && strstr(text, "rule tuned-1-clear_win") && strstr(text, "try test.fast test.slow ref"),
          "rule written: %s", text ? text : "(null)");
    CHECK(text && strstr(text, "evidence row clear win (1,40,40,2,2,16 f32 causal=none): test.fast "
                               "median") && strstr(text, "ratio 0.8"),
          "evidence: %s", text ? text : "(null)");
    CHECK(text && strstr(text, "require libsdpa ") && strstr(text, "require cpu-model "),
          "require lines");
    CHECK(text && strstr(text, "Sq 40\n") && strstr(text, "were not measured"), "exact shape only");
    CHECK_STATUS(sdpa_context_load_policy_text(ctx, text, "tuned.rules"), SDPA_OK);
    CHECK(strcmp(first_for(ctx, 40), "test.fast") == 0, "tuned shape: %s", first_for(ctx, 40));
    CHECK(strcmp(first_for(ctx, 24), "test.slow") == 0, "unmeasured shape unchanged: %s",
          first_for(ctx, 24));
    sdpa_free(text);
    sdpa_context_destroy(ctx);

    /* 2. Equal within noise: the order stays, and the file says so. */
    ctx = setup(10.0, 10.0, 0.10);
    text = tune(ctx, rows, 2);
    CHECK(text && !strstr(text, "\nrule ") && strstr(text, "order kept, test.slow first"),
          "tie keeps the order: %s", text ? text : "(null)");
    sdpa_free(text);
    sdpa_context_destroy(ctx);

    /* 3. A real but 1% win: below the 2% minimum gain, no rule. */
    ctx = setup(10.0, 9.9, 0.0005);
    text = tune(ctx, rows, 1);
    CHECK(text && !strstr(text, "\nrule ") && strstr(text, "less than the minimum gain"),
          "1%% win keeps the order: %s", text ? text : "(null)");
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
