/*
 * test_guard.c - the finite-output guard (sdpa_context_set_finite_guard).
 *
 * A scripted backend that runs ref and then writes one NaN into its output
 * (a fast path gone wrong at one size) is first in the rules; with the
 * guard on, the call must come back finite from the next candidate, the
 * backend latched off with one warning naming it and the shape, the event
 * counted and shown by explain and info; with the guard off (the default)
 * the NaN reaches the caller; NaN inputs are not the backend's fault;
 * out-of-memory still reaches the caller; a layer latches for itself and
 * may switch the guard on or off; when no later candidate runs, the output
 * of the last stands.
 */
#include "support/scripted.h"
#include "support/testlib.h"

#include <math.h>
#include <string.h>

static scripted nanny, quiet;

static sdpa_context *ctx_with(const char *try_list)
{
    sdpa_context *ctx = tl_context("cpu:isa=portable");
    memset(&nanny, 0, sizeof nanny), memset(&quiet, 0, sizeof quiet);
    nanny.nan_result = 1;
    scripted_add(ctx, "test.nan", &nanny);
    scripted_add(ctx, "test.oom", &quiet);
    char rules[256];
    snprintf(rules, sizeof rules, "rule guarded\ndevice cpu\ntry %s\nevidence a test\n", try_list);
    CHECK_STATUS(sdpa_context_load_policy_text(ctx, rules, "test.rules"), SDPA_OK);
    return ctx;
}

static int finite_output(const tl_output *o, const tl_case *c)
{
    for (int64_t s = 0; s < c->Sq; s++)
        for (int64_t h = 0; h < c->Hq; h++)
            for (int64_t d = 0; d < c->D; d++)
                if (!isfinite(tl_out_get(&o->t, 0, s, h, d)))
                    return 0;
    return 1;
}

static sdpa_status call(sdpa_context *ctx, sdpa_layer *layer, const tl_problem *p, tl_output *o)
{
    return layer ? sdpa_layer_forward(layer, &p->q, &p->k, &p->v, &o->t, o->lse, NULL)
                 : sdpa_forward(ctx, &p->q, &p->k, &p->v, &o->t, o->lse, NULL);
}

int main(void)
{
    tl_seed_from_env();
    tl_case c = {1, 37, 50, 2, 2, 32, SDPA_F32, SDPA_F32, SDPA_CAUSAL_NONE, TL_BSHD, 1,
                 TL_UNIFORM, 0, 0};
    tl_problem p;
    tl_output o, want;
    tl_problem_make(&p, &c);
    tl_output_make(&o, &p);
    tl_output_make(&want, &p);

    /* off by default: the NaN reaches the caller */
    sdpa_context *ctx = ctx_with("test.nan cpu.portable ref");
    CHECK_STATUS(sdpa_forward(ctx, &p.q, &p.k, &p.v, &want.t, want.lse,
                              &(sdpa_params){.backend = "ref"}),
                 SDPA_OK);
    CHECK_STATUS(call(ctx, NULL, &p, &o), SDPA_OK);
    CHECK(!finite_output(&o, &c) && strcmp(sdpa_last_backend(), "test.nan") == 0,
          "guard off: expected test.nan's NaN, got %s", sdpa_last_backend());
    CHECK(sdpa_context_guard_events(ctx) == 0, "guard off counted an event");

    /* on: the next candidate's output, one warning, one event, latched */
    CHECK_STATUS(sdpa_context_set_finite_guard(ctx, 1), SDPA_OK);
    tl_log_reset();
    CHECK_STATUS(call(ctx, NULL, &p, &o), SDPA_OK);
    CHECK(finite_output(&o, &c) && strcmp(sdpa_last_backend(), "cpu.portable") == 0,
          "guard on: ran %s, finite %d", sdpa_last_backend(), finite_output(&o, &c));
    CHECK(tl_max_diff(&o, &want, NULL) <= tl_tolerance(SDPA_F32, SDPA_F32),
          "guard on: the rerun differs from ref by %.3g", tl_max_diff(&o, &want, NULL));
    CHECK(tl_log_warnings == 1 && strstr(tl_last_warning, "test.nan") &&
              strstr(tl_last_warning, "B=1 Sq=37 Skv=50") && strstr(tl_last_warning, "latched"),
          "%d warnings, last: %s", tl_log_warnings, tl_last_warning);
    CHECK(sdpa_context_guard_events(ctx) == 1, "events %lld, expected 1",
          (long long)sdpa_context_guard_events(ctx));
    const int runs = atomic_load(&nanny.runs);
    CHECK_STATUS(call(ctx, NULL, &p, &o), SDPA_OK);
    CHECK(atomic_load(&nanny.runs) == runs && tl_log_warnings == 1 &&
              strcmp(sdpa_last_backend(), "cpu.portable") == 0,
          "latched: test.nan ran again (%d -> %d), %d warnings", runs,
          atomic_load(&nanny.runs), tl_log_warnings);
    char *text = NULL;
    CHECK_STATUS(sdpa_info(ctx, 0, &text), SDPA_OK);
    CHECK(text && strstr(text, "guard     on (finite outputs), 1 event"), "info: %s",
          text ? text : "");
    sdpa_free(text);
    sdpa_call_desc d;
    memset(&d, 0, sizeof d);
    d.device = SDPA_DEVICE_CPU, d.B = 1, d.Sq = d.Skv = 64, d.Hq = d.Hkv = 2, d.D = 32;
    CHECK_STATUS(sdpa_explain(ctx, &d, 0, &text), SDPA_OK);
    CHECK(text && strstr(text, "guard       on (finite outputs), 1 event"), "explain: %s",
          text ? text : "");
    sdpa_free(text);
    CHECK_STATUS(sdpa_info(ctx, 1, &text), SDPA_OK);
    CHECK(text && strstr(text, "\"finite_guard\":{\"on\":true,\"events\":1}"), "info --json: %s",
          text ? text : "");
    sdpa_free(text);

    /* a layer latches for itself; it may switch the guard off */
    sdpa_layer_desc ld = SDPA_LAYER_DESC_DEFAULT;
    ld.name = "blocks.7.attn";
    sdpa_layer *layer;
    CHECK_STATUS(sdpa_layer_create(ctx, &ld, &layer), SDPA_OK);
    CHECK_STATUS(call(ctx, layer, &p, &o), SDPA_OK);
    CHECK(finite_output(&o, &c) && sdpa_layer_is_latched(layer, "test.nan") == 1 &&
              tl_log_warnings == 2 && strstr(tl_last_warning, "blocks.7.attn"),
          "layer: finite %d, latched %d, %d warnings: %s", finite_output(&o, &c),
          sdpa_layer_is_latched(layer, "test.nan"), tl_log_warnings, tl_last_warning);
    sdpa_layer *off;
    ld.name = "blocks.8.attn";
    CHECK_STATUS(sdpa_layer_create(ctx, &ld, &off), SDPA_OK);
    CHECK_STATUS(sdpa_layer_set_finite_guard(off, 0), SDPA_OK);
    CHECK_STATUS(call(ctx, off, &p, &o), SDPA_OK);
    CHECK(!finite_output(&o, &c), "a layer with the guard off still got a finite output");
    CHECK_STATUS(sdpa_layer_set_finite_guard(off, 2), SDPA_INVALID_ARGUMENT);
    CHECK(strstr(sdpa_last_error(), "on is 2"), "%s", sdpa_last_error());
    CHECK_STATUS(sdpa_context_set_finite_guard(ctx, -1), SDPA_INVALID_ARGUMENT);
    sdpa_layer_destroy(layer);
    sdpa_layer_destroy(off);
    sdpa_context_destroy(ctx);

    /* NaN in the inputs: the NaN output is right, nothing latched */
    ctx = ctx_with("test.nan cpu.portable ref");
    sdpa_context_set_finite_guard(ctx, 1);
    tl_case cn = c;
    cn.values = TL_NAN_Q;
    tl_problem pn;
    tl_output on;
    tl_problem_make(&pn, &cn);
    tl_output_make(&on, &pn);
    CHECK_STATUS(call(ctx, NULL, &pn, &on), SDPA_OK);
    CHECK(strcmp(sdpa_last_backend(), "test.nan") == 0 && sdpa_context_guard_events(ctx) == 0,
          "NaN inputs: ran %s, %lld events", sdpa_last_backend(),
          (long long)sdpa_context_guard_events(ctx));
    tl_output_free(&on), tl_problem_free(&pn);
    sdpa_context_destroy(ctx);

    /* out of memory is never swallowed, guard or not */
    ctx = ctx_with("test.oom cpu.portable ref");
    quiet.run_status = SDPA_OUT_OF_MEMORY;
    sdpa_context_set_finite_guard(ctx, 1);
    CHECK_STATUS(call(ctx, NULL, &p, &o), SDPA_OUT_OF_MEMORY);
    sdpa_context_destroy(ctx);

    /* nothing after it: its output stands, with a warning */
    ctx = ctx_with("test.nan");
    sdpa_context_set_finite_guard(ctx, 1);
    tl_log_reset();
    CHECK_STATUS(call(ctx, NULL, &p, &o), SDPA_OK);
    CHECK(!finite_output(&o, &c) && strcmp(sdpa_last_backend(), "test.nan") == 0 &&
              strstr(tl_last_warning, "keeping test.nan's"),
          "last candidate: ran %s, warning %s", sdpa_last_backend(), tl_last_warning);
    sdpa_context_destroy(ctx);

    tl_output_free(&o), tl_output_free(&want), tl_problem_free(&p);
    return tl_finish();
}
