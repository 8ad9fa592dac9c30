/*
 * check.c - `sdpa check`: numerics of every backend against the float64
 * reference on suite shapes, and of backends against each other.
 *
 * Per (row, backend): max |out - ref|, relative L2 error, max |lse - ref|,
 * and whether it is within the tolerance of the input dtype (f32 1e-4,
 * f16 2e-3, bf16 1.6e-2: room for backends that compute in the input's
 * precision). Rows above --budget GFLOP (default 2) are checked on fewer
 * heads (and, for non-causal rows, fewer queries): heads and queries are
 * independent, so the numerics per element are those of the full shape.
 * Exit status 1 if any backend is outside its tolerance.
 */
#define _POSIX_C_SOURCE 200809L
#include "suite.h"
#include "commands.h"
#include "tool.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CHECK_BACKENDS 16

static double tolerance_of(sdpa_dtype t)
{
    return t == SDPA_F32 ? 1e-4 : t == SDPA_F16 ? 2e-3 : 1.6e-2;
}

/* Shrinks a row to about `budget` FLOPs; returns 1 if it changed. */
static int shrink(sdpa_call_desc *d, double budget)
{
    int changed = 0;
    const int64_t g = d->Hq / d->Hkv;
    if (suite_flops(d, 0) > budget && d->B > 1)
        d->B = 1, changed = 1;
    while (suite_flops(d, 0) > budget && d->Hkv > 1) {
        d->Hkv = (d->Hkv + 1) / 2, d->Hq = d->Hkv * g;
        changed = 1;
    }
    while (suite_flops(d, 0) > budget && d->causal == SDPA_CAUSAL_NONE && d->Sq > 64) {
        d->Sq = (d->Sq + 1) / 2;
        changed = 1;
    }
    return changed;
}

int cmd_check(int argc, char **argv)
{
    tool_flag f[] = {{"--suite", 1, NULL},   {"--shape", 1, NULL}, {"--backends", 1, NULL},
                     {"--dtype", 1, NULL},   {"--budget", 1, NULL}, {"--threads", 1, NULL},
                     {"--json", 0, NULL}};
    enum { SUITE, SHAPE, BACKENDS, DTYPE, BUDGET, THREADS, JSON, NF };
    int rc = tool_parse_flags(argc, argv, f, NF);
    if (rc)
        return rc;
    static row rows[MAX_ROWS];
    int n_rows, threads;
    sdpa_dtype dtype;
    if ((rc = suite_args(f[SUITE].value, f[SHAPE].value, f[DTYPE].value, f[THREADS].value, rows,
                         &n_rows, &dtype, &threads)) != 0)
        return rc;
    long long budget = 2;
    if (f[BUDGET].value && !tool_parse_int(f[BUDGET].value, 1, 100000, &budget))
        return tool_usage_error("--budget '%s' is not GFLOP in 1..100000", f[BUDGET].value);
    sdpa_context *ctx;
    if ((rc = tool_context(NULL, threads, &ctx)) != 0)
        return rc;
    const char *names[MAX_CHECK_BACKENDS];
    int nb;
    if ((rc = suite_backends(ctx, f[BACKENDS].value, 0, names, MAX_CHECK_BACKENDS, &nb)) != 0) {
        sdpa_context_destroy(ctx);
        return rc;
    }
    const int json = f[JSON].value != NULL;
    const double tol = tolerance_of(dtype);
    if (!json)
        printf("# sdpa check %s: every backend against ref (float64), dtype %s, tolerance "
               "max|err| <= %g\n%-20s %-30s %-14s %10s %10s %10s  %s\n",
               sdpa_version(), sdpa_dtype_name(dtype), tol, "row", "checked shape", "backend",
               "max|err|", "rel L2", "lse err", "verdict");
    int bad = 0;
    for (int r = 0; r < n_rows; r++) {
        sdpa_call_desc d = rows[r].d;
        int shrunk = shrink(&d, (double)budget * 1e9);
        char shape[96], pad[40] = "";
        if (d.mask) /* a padded row: the real keys of every batch entry */
            snprintf(pad, sizeof pad, " len_kv=%lld", (long long)rows[r].seq_len_kv);
        snprintf(shape, sizeof shape, "%lld,%lld,%lld,%lld,%lld,%lld%s%s%s", (long long)d.B,
                 (long long)d.Sq, (long long)d.Skv, (long long)d.Hq, (long long)d.Hkv,
                 (long long)d.D, d.causal ? " causal" : "", pad, shrunk ? "*" : "");
        problem ref, got[MAX_CHECK_BACKENDS];
        int ok_alloc = problem_make(&ref, &d, rows[r].seq_len_kv, dtype, SDPA_F32, 1);
        sdpa_params p = SDPA_PARAMS_DEFAULT;
        p.causal = d.causal;
        p.mask = ref.mask;
        p.backend = "ref";
        if (!ok_alloc) {
            fprintf(stderr, "sdpa: error: row %s: out of memory for its tensors (%s); expected "
                            "a shape whose q, k and v fit in memory\n",
                    rows[r].name, shape);
            rc = 1;
            break;
        }
        sdpa_status st = sdpa_forward(ctx, &ref.q, &ref.k, &ref.v, &ref.out, ref.lse, &p);
        if (st != SDPA_OK) {
            rc = tool_lib_error(rows[r].name, st);
            problem_free(&ref);
            break;
        }
        const int64_t n = d.B * d.Sq * d.Hq * d.D, nl = d.B * d.Hq * d.Sq;
        int ran[MAX_CHECK_BACKENDS];
        for (int b = 0; b < nb; b++) {
            ran[b] = 0;
            got[b] = ref; /* same inputs; own outputs */
            char why[256];
            if (!suite_claims(ctx, &d, dtype, names[b], why, sizeof why)) {
                suite_note_unclaimed(names[b], why); /* named once, at the end */
                got[b].out.data = NULL, got[b].lse = NULL;
                continue;
            }
            got[b].out.data = malloc(sizeof(float) * (size_t)n);
            got[b].lse = malloc(sizeof(float) * (size_t)nl);
            if (!got[b].out.data || !got[b].lse) {
                free(got[b].out.data), free(got[b].lse);
                got[b].out.data = NULL, got[b].lse = NULL;
                fprintf(stderr, "sdpa: error: row %s: out of memory for %s's outputs\n",
                        rows[r].name, names[b]);
                bad++;
                continue;
            }
            p.backend = names[b];
            st = sdpa_forward(ctx, &got[b].q, &got[b].k, &got[b].v, &got[b].out, got[b].lse, &p);
            if (st != SDPA_OK) { /* it takes the call but failed it: a failure */
                bad++;
                if (json) {
                    printf("{\"row\":\"%s\",\"backend\":\"%s\",\"dtype\":\"%s\",\"ok\":false,"
                           "\"error\":\"%s\",\"message\":",
                           rows[r].name, names[b], sdpa_dtype_name(dtype), sdpa_status_string(st));
                    suite_json_string(sdpa_last_error());
                    printf("}\n");
                } else {
                    printf("%-20s %-30s %-14s FAILED: %s: %s\n", rows[r].name, shape, names[b],
                           sdpa_status_string(st), sdpa_last_error());
                }
                continue;
            }
            ran[b] = 1;
            const float *o = got[b].out.data, *w = ref.out.data;
            double max_abs = 0, num = 0, den = 0, lse_err = 0;
            for (int64_t i = 0; i < n; i++) {
                double e = fabs((double)o[i] - w[i]);
                max_abs = !(e <= max_abs) ? (isnan(e) ? INFINITY : e) : max_abs;
                num += e * e, den += (double)w[i] * w[i];
            }
            for (int64_t i = 0; i < nl; i++) {
                if (isinf(got[b].lse[i]) || isinf(ref.lse[i])) {
                    if (got[b].lse[i] != ref.lse[i])
                        lse_err = INFINITY;
                    continue;
                }
                double e = fabs((double)got[b].lse[i] - ref.lse[i]);
                lse_err = !(e <= lse_err) ? (isnan(e) ? INFINITY : e) : lse_err;
            }
            const double rel = den > 0 ? sqrt(num / den) : sqrt(num);
            const int ok = max_abs <= tol && lse_err <= tol;
            bad += !ok;
            if (json)
                printf("{\"row\":\"%s\",\"shape\":\"%s\",\"backend\":\"%s\",\"dtype\":\"%s\","
                       "\"max_abs\":%.3e,\"rel_l2\":%.3e,\"lse_max_abs\":%.3e,\"tolerance\":%g,"
                       "\"ok\":%s}\n",
                       rows[r].name, shape, names[b], sdpa_dtype_name(dtype), max_abs, rel,
                       lse_err, tol, ok ? "true" : "false");
            else
                printf("%-20s %-30s %-14s %10.2e %10.2e %10.2e  %s\n", rows[r].name, shape,
                       names[b], max_abs, rel, lse_err, ok ? "ok" : "OUTSIDE TOLERANCE");
        }
        for (int a = 0; a < nb; a++) /* backends against each other */
            for (int b = a + 1; b < nb; b++) {
                if (!ran[a] || !ran[b])
                    continue;
                const float *x = got[a].out.data, *y = got[b].out.data;
                double m = 0;
                for (int64_t i = 0; i < n; i++) {
                    double e = fabs((double)x[i] - y[i]);
                    m = !(e <= m) ? (isnan(e) ? INFINITY : e) : m;
                }
                if (json)
                    printf("{\"row\":\"%s\",\"a\":\"%s\",\"b\":\"%s\",\"max_abs_diff\":%.3e}\n",
                           rows[r].name, names[a], names[b], m);
                else
                    printf("%-20s %-30s   %s vs %s: max|diff| %.2e\n", "", "", names[a],
                           names[b], m);
            }
        for (int b = 0; b < nb; b++)
            free(got[b].out.data), free(got[b].lse);
        problem_free(&ref);
        fflush(stdout);
    }
    suite_print_unclaimed(json);
    if (!json && rc == 0)
        printf("# * checked on fewer batches/heads/queries to stay within --budget %lld GFLOP "
               "per reference call\n%s\n",
               budget,
               bad ? "RESULT: some backend failed a call it takes or is outside its tolerance"
                   : "RESULT: all within tolerance");
    sdpa_context_destroy(ctx);
    return rc ? rc : (bad ? 1 : 0);
}
