/*
 * ab.c - `sdpa ab`: an interleaved A/B test of two configurations.
 *
 *   sdpa ab --a backend=cpu.avx2 --b backend=cpu.avx512 --suite smoke.tsv --rounds 9
 *   sdpa ab --a rules=old.rules --b rules=new.rules --shape 1,4096,4096,24,24,128
 *
 * Each arm is a configuration: one backend named explicitly, or a rule file
 * loaded over the built-in rules (the dispatcher then decides). For each
 * row, after one warm-up per arm, rounds alternate AB, BA, AB, ... so drift
 * in the machine hits both arms alike. A round's time is the sum over rows.
 * Reported: per-arm medians, the B/A ratio with a paired bootstrap 95%
 * interval, and a verdict.
 */
#define _POSIX_C_SOURCE 200809L
#include "dit.h"
#include "suite.h"
#include "commands.h"
#include "tool.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/*
 * An arm decides in its own context (its rule file) but runs in the shared
 * one: two contexts would mean two worker pools, and on a small machine the
 * scheduler may wake one pool's worker on the core the other is using,
 * which costs one arm up to 2x and would be measured as a difference.
 */
typedef struct arm {
    const char *spec;
    const char *backend; /* explicit, or NULL when rules decide */
    sdpa_context *ctx;   /* decides */
    const char *chosen;  /* what it chose for the current row */
} arm;

static int arm_open(arm *a, const char *spec, int threads, const char *which)
{
    memset(a, 0, sizeof *a);
    a->spec = spec;
    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    o.threads = threads;
    o.ignore_env = 1; /* the arms are what is compared, not the environment */
    if (strncmp(spec, "backend=", 8) == 0) {
        a->backend = spec + 8;
    } else if (strncmp(spec, "rules=", 6) == 0) {
        o.policy_file = spec + 6;
    } else {
        return tool_usage_error("%s '%s': expected backend=NAME or rules=FILE", which, spec);
    }
    sdpa_status st = sdpa_context_create(&o, &a->ctx);
    if (st != SDPA_OK)
        return tool_usage_error("%s '%s': %s", which, spec, sdpa_last_error());
    if (a->backend) {
        for (int i = 0; i < sdpa_backend_count(a->ctx); i++) {
            sdpa_backend_info b;
            sdpa_backend_get(a->ctx, i, &b);
            if (strcmp(b.name, a->backend) == 0) {
                if (!b.present)
                    return tool_usage_error("%s: %s is not present here: %s", which, b.name,
                                            b.why_absent);
                return 0;
            }
        }
        return tool_usage_error("%s: backend '%s' unknown (see `sdpa info`)", which, a->backend);
    }
    return 0;
}

/* The backend the arm's configuration picks for this row. */
static int arm_choose(arm *a, const sdpa_call_desc *d)
{
    if (a->backend) {
        a->chosen = a->backend;
        return 0;
    }
    static sdpa_decision dec;
    if (sdpa_decide(a->ctx, d, &dec) != SDPA_OK)
        return tool_lib_error(a->spec, SDPA_INVALID_ARGUMENT);
    for (int c = 0; c < dec.n_candidates; c++)
        for (int i = 0; i < dec.n_backends; i++)
            if (dec.backends[i].candidate == c && dec.backends[i].present) {
                a->chosen = dec.backends[i].name;
                return 0;
            }
    return tool_usage_error("%s: no backend present here for this row: %s", a->spec, dec.error);
}

static sdpa_status arm_run(const arm *a, sdpa_context *runner, problem *p, sdpa_causal causal,
                           double *ms)
{
    sdpa_params prm = SDPA_PARAMS_DEFAULT;
    prm.backend = a->chosen;
    prm.causal = causal;
    prm.mask = p->mask;
    double t0 = tool_now_ms();
    sdpa_status st = sdpa_forward(runner, &p->q, &p->k, &p->v, &p->out, NULL, &prm);
    *ms = tool_now_ms() - t0;
    return st;
}

static void print_result(const char *label, const char *spec_a, const char *spec_b,
                         const sdpa_ab_result *res, int rounds, int json)
{
    if (json)
        printf("{\"row\":\"%s\",\"a\":\"%s\",\"b\":\"%s\",\"median_a_ms\":%.4f,"
               "\"median_b_ms\":%.4f,\"ratio\":%.4f,\"lo\":%.4f,\"hi\":%.4f,\"verdict\":\"%s\"}\n",
               label, spec_a, spec_b, res->median_a, res->median_b, res->ratio, res->lo, res->hi,
               sdpa_ab_verdict_text(res->verdict));
    else
        printf("%-44s %12.3f %12.3f %8.3f     [%6.3f, %6.3f]  %s\n"
               "verdict: %s (B/A = %.3f, 95%% interval [%.3f, %.3f] over %d rounds)\n",
               label, res->median_a, res->median_b, res->ratio, res->lo, res->hi,
               sdpa_ab_verdict_text(res->verdict), sdpa_ab_verdict_text(res->verdict), res->ratio,
               res->lo, res->hi, rounds);
}

/* A/B over whole `sdpa dit` sampling runs: what the choice does end to end. */
static int ab_dit(const char *config, arm *arms, sdpa_context *runner, int rounds, int steps,
                  int json, int progress)
{
    sdpa_call_desc d;
    if (!dit_attention_desc(config, &d))
        return tool_usage_error("--dit '%s' unknown, expected image or video", config);
    dit_session *s[2] = {NULL, NULL};
    double *t[2] = {malloc(sizeof(double) * (size_t)rounds), malloc(sizeof(double) * (size_t)rounds)};
    int rc = t[0] && t[1] ? 0 : tool_usage_error("out of memory");
    for (int k = 0; k < 2 && rc == 0; k++)
        if ((rc = arm_choose(&arms[k], &d)) == 0 &&
            (rc = dit_open(config, runner, arms[k].chosen, SDPA_F32, 1, steps, &s[k])) == 0)
            rc = dit_run(s[k], 0, NULL); /* warm-up */
    if (!json && rc == 0)
        printf("# sdpa ab --dit %s: A = %s (%s), B = %s (%s), %d rounds of %d-step sampling "
               "runs, interleaved\n%-44s %12s %12s %8s %20s  %s\n",
               config, arms[0].spec, arms[0].chosen, arms[1].spec, arms[1].chosen, rounds, steps,
               "run", "A median ms", "B median ms", "B/A", "95% interval", "verdict");
    for (int i = 0; i < rounds && rc == 0; i++) {
        if (progress)
            fprintf(stderr, "\r  round %d/%d ", i + 1, rounds);
        for (int k = 0; k < 2 && rc == 0; k++) {
            const int which = i % 2 ? !k : k; /* AB, BA, ... */
            rc = dit_run(s[which], 0, &t[which][i]);
        }
    }
    if (progress)
        fprintf(stderr, "\r%30s\r", "");
    if (rc == 0) {
        sdpa_ab_result res;
        sdpa_ab_compare(t[0], t[1], rounds, 0.0, &res);
        char label[96];
        snprintf(label, sizeof label, "dit %.16s (%.32s vs %.32s)", config, arms[0].chosen,
                 arms[1].chosen);
        print_result(label, arms[0].spec, arms[1].spec, &res, rounds, json);
    }
    dit_close(s[0]), dit_close(s[1]);
    free(t[0]), free(t[1]);
    return rc;
}

int cmd_ab(int argc, char **argv)
{
    tool_flag f[] = {{"--a", 1, NULL},     {"--b", 1, NULL},       {"--suite", 1, NULL},
                     {"--shape", 1, NULL}, {"--rounds", 1, NULL},  {"--dtype", 1, NULL},
                     {"--threads", 1, NULL}, {"--dit", 1, NULL},   {"--json", 0, NULL},
                     {"--steps", 1, NULL}};
    enum { A, B, SUITE, SHAPE, ROUNDS, DTYPE, THREADS, DIT, JSON, STEPS, NF };
    int rc = tool_parse_flags(argc, argv, f, NF);
    if (rc)
        return rc;
    if (!f[A].value || !f[B].value)
        return tool_usage_error("ab: --a SPEC and --b SPEC are required (backend=NAME or "
                                "rules=FILE)");
    static row rows[MAX_ROWS];
    int n_rows = 0, threads = 0;
    sdpa_dtype dtype = SDPA_F32;
    if (f[DIT].value) { /* whole denoising runs instead of suite rows */
        if (f[SUITE].value || f[SHAPE].value)
            return tool_usage_error("ab: give --dit CONFIG or --suite/--shape, not both");
        long long t = 0;
        if (f[THREADS].value && !tool_parse_int(f[THREADS].value, 1, 1024, &t))
            return tool_usage_error("--threads '%s' is not a number in 1..1024", f[THREADS].value);
        threads = (int)t;
    } else if ((rc = suite_args(f[SUITE].value, f[SHAPE].value, f[DTYPE].value,
                                f[THREADS].value, rows, &n_rows, &dtype, &threads)) != 0) {
        return rc;
    }
    long long steps = 4;
    if (f[STEPS].value && !tool_parse_int(f[STEPS].value, 1, 1000, &steps))
        return tool_usage_error("--steps '%s' is not a number in 1..1000", f[STEPS].value);
    long long rounds = 9;
    if (f[ROUNDS].value && !tool_parse_int(f[ROUNDS].value, 3, 10000, &rounds))
        return tool_usage_error("--rounds '%s' is not a number in 3..10000", f[ROUNDS].value);
    arm arms[2];
    memset(arms, 0, sizeof arms);
    sdpa_context *runner = NULL;
    if ((rc = tool_context(NULL, threads, &runner)) != 0)
        return rc;
    if ((rc = arm_open(&arms[0], f[A].value, threads, "--a")) != 0 ||
        (rc = arm_open(&arms[1], f[B].value, threads, "--b")) != 0) {
        sdpa_context_destroy(arms[0].ctx), sdpa_context_destroy(arms[1].ctx);
        sdpa_context_destroy(runner);
        return rc;
    }
    const int json = f[JSON].value != NULL, progress = isatty(2) && !json;
    if (f[DIT].value) {
        rc = ab_dit(f[DIT].value, arms, runner, (int)rounds, (int)steps, json, progress);
        sdpa_context_destroy(arms[0].ctx), sdpa_context_destroy(arms[1].ctx);
        sdpa_context_destroy(runner);
        return rc;
    }
    double *ta = calloc((size_t)rounds, sizeof(double)), *tb = calloc((size_t)rounds, sizeof(double));
    double *ra = malloc(sizeof(double) * (size_t)rounds), *rb = malloc(sizeof(double) * (size_t)rounds);
    if (!ta || !tb || !ra || !rb) {
        rc = tool_usage_error("out of memory");
        goto done;
    }
    if (!json)
        printf("# sdpa ab: A = %s, B = %s, %lld rounds interleaved (AB, BA, ...), dtype %s\n"
               "%-44s %12s %12s %8s %20s  %s\n",
               f[A].value, f[B].value, rounds, sdpa_dtype_name(dtype), "row", "A median ms",
               "B median ms", "B/A", "95% interval", "verdict");
    for (int r = 0; r < n_rows; r++) {
        sdpa_call_desc *d = &rows[r].d;
        problem p;
        if (!problem_make(&p, d, rows[r].seq_len_kv, dtype, dtype, 0)) {
            rc = tool_usage_error("row %s: out of memory", rows[r].name);
            goto done;
        }
        double ms;
        for (int k = 0; k < 2 && rc == 0; k++) { /* choose, warm up, catch refusals */
            if ((rc = arm_choose(&arms[k], d)) != 0)
                break;
            sdpa_status st = arm_run(&arms[k], runner, &p, d->causal, &ms);
            if (st != SDPA_OK)
                rc = tool_lib_error(arms[k].spec, st);
        }
        for (long long i = 0; i < rounds && rc == 0; i++) {
            if (progress)
                fprintf(stderr, "\r  row %d/%d  round %lld/%lld ", r + 1, n_rows, i + 1, rounds);
            const int first = (int)(i % 2); /* AB, then BA */
            for (int k = 0; k < 2; k++) {
                const int which = k ? !first : first;
                arm_run(&arms[which], runner, &p, d->causal, &ms);
                (which ? rb : ra)[i] = ms;
            }
            ta[i] += ra[i], tb[i] += rb[i];
        }
        problem_free(&p);
        if (rc)
            goto done;
        char label[160];
        snprintf(label, sizeof label, "%.63s (%.40s vs %.40s)", rows[r].name, arms[0].chosen,
                 arms[1].chosen);
        sdpa_ab_result res;
        sdpa_ab_compare(ra, rb, (int)rounds, 0.0, &res);
        if (progress)
            fprintf(stderr, "\r%40s\r", "");
        if (json)
            printf("{\"row\":\"%s\",\"a\":\"%s\",\"b\":\"%s\",\"a_backend\":\"%s\","
                   "\"b_backend\":\"%s\",\"median_a_ms\":%.4f,\"median_b_ms\":%.4f,\"ratio\":%.4f,"
                   "\"lo\":%.4f,\"hi\":%.4f,\"verdict\":\"%s\"}\n",
                   rows[r].name, f[A].value, f[B].value, arms[0].chosen, arms[1].chosen,
                   res.median_a, res.median_b, res.ratio, res.lo, res.hi,
                   sdpa_ab_verdict_text(res.verdict));
        else
            printf("%-44s %12.3f %12.3f %8.3f     [%6.3f, %6.3f]  %s\n", label, res.median_a,
                   res.median_b, res.ratio, res.lo, res.hi, sdpa_ab_verdict_text(res.verdict));
        fflush(stdout);
    }
    sdpa_ab_result all;
    sdpa_ab_compare(ta, tb, (int)rounds, 0.0, &all);
    print_result("(all rows)", f[A].value, f[B].value, &all, (int)rounds, json);
done:
    free(ta), free(tb), free(ra), free(rb);
    sdpa_context_destroy(arms[0].ctx);
    sdpa_context_destroy(arms[1].ctx);
    sdpa_context_destroy(runner);
    return rc;
}
