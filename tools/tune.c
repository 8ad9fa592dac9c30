/*
 * tune.c - `sdpa tune --suite FILE --out rules.txt`: measures the
 * candidates on each row (sdpa_tune) and writes rules over shape classes,
 * which can be installed with SDPA_POLICY=rules.txt; or `sdpa tune
 * --install [--system]` writes them as this user's (or the system's)
 * wisdom, which every context then loads by itself (sdpa.h,
 * sdpa_context_wisdom). Default suite tune-cpu (--quick: tune-cpu-quick,
 * 3 rounds, no shapes between rows), dtypes f32 and bf16. `sdpa tune
 * --check` measures the wisdom in force on held-out shapes (tune-holdout)
 * and reports its regret. Progress on a terminal only.
 */
#define _POSIX_C_SOURCE 200809L
#include "suite.h"
#include "commands.h"
#include "output.h"
#include "tool.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* mkdir -p of the directories above path; 0, or -1 with errno. */
static int make_parents(const char *path)
{
    char dir[4096];
    if (strlen(path) >= sizeof dir) {
        errno = ENAMETOOLONG;
        return -1;
    }
    strcpy(dir, path);
    for (char *p = dir + 1; (p = strchr(p, '/')); p++) {
        *p = '\0';
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    return 0;
}

/* The wisdom being replaced is kept beside it as PATH.previous. */
static int keep_previous(const char *path, char *err, size_t errn)
{
    FILE *in = fopen(path, "rb");
    if (!in)
        return errno == ENOENT ? 0 : (snprintf(err, errn, "%.400s: %s", path, strerror(errno)), -1);
    char prev[4200];
    snprintf(prev, sizeof prev, "%s.previous", path);
    FILE *out = fopen(prev, "wb");
    int ok = out != NULL;
    char buf[8192];
    size_t n;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0)
        ok = fwrite(buf, 1, n, out) == n;
    ok = ok && !ferror(in);
    if (out && fclose(out) != 0)
        ok = 0;
    fclose(in);
    if (!ok)
        snprintf(err, errn, "%.400s: cannot keep a copy: %s", prev, strerror(errno));
    return ok ? 0 : -1;
}

static void progress(int index, int n_rows, void *user)
{
    const row *rows = user;
    fprintf(stderr, "\r  tuning row %d/%d %-24s", index + 1, n_rows, rows[index].name);
}

static int write_text(FILE *f, const void *user, char *err, size_t errn)
{
    (void)err, (void)errn; /* errno says why */
    return fputs(user, f) >= 0 && fflush(f) == 0 ? 0 : -1;
}

/* "f32,bf16" -> dtypes; 0, or an exit code. */
static int parse_dtypes(const char *arg, sdpa_dtype *out, int *n)
{
    char buf[64];
    *n = 0;
    if (strlen(arg) >= sizeof buf)
        return tool_usage_error("--dtype '%s' too long", arg);
    strcpy(buf, arg);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (*n == SDPA_DTYPE_COUNT || !tool_parse_dtype(tok, &out[*n]))
            return tool_usage_error("--dtype '%s': expected f32, f16 or bf16, or a comma list "
                                    "of them",
                                    arg);
        for (int i = 0; i < *n; i++)
            if (out[i] == out[*n])
                return tool_usage_error("--dtype '%s' names %s twice", arg, tok);
        (*n)++;
    }
    return *n ? 0 : tool_usage_error("--dtype '%s' names no dtype", arg);
}

/* Rows times dtypes, into rows (in place, dtype-major); 0 or an exit code. */
static int expand_dtypes(row *rows, int *n_rows, const sdpa_dtype *dtypes, int n_dtypes)
{
    if ((long long)*n_rows * n_dtypes > MAX_ROWS)
        return tool_usage_error("%d rows x %d dtypes is more than %d rows", *n_rows, n_dtypes,
                                MAX_ROWS);
    for (int t = n_dtypes - 1; t >= 0; t--)
        for (int r = 0; r < *n_rows; r++) {
            rows[t * *n_rows + r] = rows[r];
            rows[t * *n_rows + r].d.dtype = dtypes[t];
        }
    *n_rows *= n_dtypes;
    return 0;
}

/*
 * --check: held-out shapes (default suite tune-holdout: inside the ranges
 * of tune-cpu's rows, none of them) decided as every program would decide
 * them, with this machine's wisdom, and every backend timed on them, side
 * by side: the regret of the decision against the fastest backend
 * measured in the same run, and whether the wisdom or the built-in rules
 * decided.
 */
static int tune_check(row *rows, int n_rows, const char *backends, int threads, long long reps,
                      double max_regret)
{
    sdpa_context *ctx;
    int rc = tool_context(NULL, threads, &ctx);
    if (rc)
        return rc;
    const char *names[32];
    int nb = 0;
    if ((rc = suite_backends(ctx, backends, 0, names, 32, &nb)) != 0) {
        sdpa_context_destroy(ctx);
        return rc;
    }
    const char *w = sdpa_context_wisdom(ctx);
    char wisdom[1024] = "";
    if (strncmp(w, "in force ", 9) == 0)
        snprintf(wisdom, sizeof wisdom, "%.*s", (int)strcspn(w + 9, "\n"), w + 9);
    char date[32];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
    printf("# sdpa tune --check  %s  %s  %d threads  %lld reps (interleaved), %s\n",
           sdpa_version(), sdpa_context_platform(ctx)->cpu_model, sdpa_context_threads(ctx), reps,
           date);
    printf("# wisdom: %s\n", wisdom[0] ? wisdom : "none in force (the built-in rules decide)");
    printf("# regret: the decision's median time / the fastest backend's median time - 1, "
           "measured side by side in this run\n");
    printf("%-18s %-5s %-10s %-28s %-14s %-14s %8s\n", "row", "dtype", "decided_by", "rule",
           "choice", "fastest", "regret");
    double *t = malloc(sizeof(double) * (size_t)reps * 32);
    if (!t) {
        sdpa_context_destroy(ctx);
        return tool_usage_error("out of memory");
    }
    int n_wisdom = 0, n_measured = 0, over = 0;
    double worst = 0, sum = 0, worst_all = 0, sum_all = 0;
    for (int r = 0; r < n_rows && rc == 0; r++) {
        sdpa_call_desc d = rows[r].d;
        static sdpa_decision dec;
        const char *choice = NULL;
        if (sdpa_decide(ctx, &d, &dec) == SDPA_OK)
            for (int c = 0; c < dec.n_candidates && !choice; c++)
                for (int i = 0; i < dec.n_backends; i++)
                    if (dec.backends[i].candidate == c && dec.backends[i].present)
                        choice = dec.backends[i].name;
        const int by_wisdom = dec.rule[0] && wisdom[0] &&
                              strncmp(dec.rule_origin, wisdom, strlen(wisdom)) == 0 &&
                              dec.rule_origin[strlen(wisdom)] == ':';
        problem pb;
        if (!choice || !problem_make(&pb, &d, rows[r].seq_len_kv, d.dtype, d.dtype, 0)) {
            printf("%-18s %-5s no decision, or out of memory\n", rows[r].name,
                   sdpa_dtype_name(d.dtype));
            continue;
        }
        int take[32], n_take = 0;
        for (int b = 0; b < nb; b++) {
            char why[256];
            if (suite_claims(ctx, &d, d.dtype, names[b], why, sizeof why))
                take[n_take++] = b;
        }
        int ok[32];
        for (int j = 0; j < n_take; j++) { /* warm-up */
            sdpa_params p = SDPA_PARAMS_DEFAULT;
            p.backend = names[take[j]], p.causal = d.causal, p.mask = pb.mask;
            ok[j] = sdpa_forward(ctx, &pb.q, &pb.k, &pb.v, &pb.out, NULL, &p) == SDPA_OK;
        }
        for (long long rep = 0; rep < reps; rep++)
            for (int i = 0; i < n_take; i++) {
                const int j = (int)((i + rep) % n_take);
                if (!ok[j])
                    continue;
                sdpa_params p = SDPA_PARAMS_DEFAULT;
                p.backend = names[take[j]], p.causal = d.causal, p.mask = pb.mask;
                const double t0 = tool_now_ms();
                ok[j] = sdpa_forward(ctx, &pb.q, &pb.k, &pb.v, &pb.out, NULL, &p) == SDPA_OK;
                t[j * reps + rep] = tool_now_ms() - t0;
            }
        problem_free(&pb);
        int fastest = -1, chosen = -1;
        double med[32];
        for (int j = 0; j < n_take; j++) {
            med[j] = ok[j] ? sdpa_median(&t[j * reps], (int)reps) : 1e300;
            if (fastest < 0 || med[j] < med[fastest])
                fastest = j;
            if (strcmp(names[take[j]], choice) == 0)
                chosen = j;
        }
        if (fastest < 0 || chosen < 0 || !ok[chosen]) {
            printf("%-18s %-5s %-10s %-28s %-14s (the choice did not run)\n", rows[r].name,
                   sdpa_dtype_name(d.dtype), by_wisdom ? "wisdom" : "built-in", dec.rule, choice);
            continue;
        }
        const double regret = med[chosen] / med[fastest] - 1;
        n_measured++;
        worst_all = regret > worst_all ? regret : worst_all;
        sum_all += regret;
        if (by_wisdom) {
            n_wisdom++;
            worst = regret > worst ? regret : worst;
            sum += regret;
            over += max_regret >= 0 && regret > max_regret;
        }
        printf("%-18s %-5s %-10s %-28s %-14s %-14s %+7.1f%%\n", rows[r].name,
               sdpa_dtype_name(d.dtype), by_wisdom ? "wisdom" : dec.rule[0] ? "built-in" : "fallback",
               dec.rule[0] ? dec.rule : "-", choice, names[take[fastest]], 100 * regret);
        fflush(stdout);
    }
    free(t);
    printf("# %d of %d held-out shapes decided by the wisdom; their regret: max %.1f%%, mean "
           "%.1f%%%s\n",
           n_wisdom, n_measured, 100 * worst, n_wisdom ? 100 * sum / n_wisdom : 0.0,
           n_wisdom < n_measured ? "; the others fall outside every tuned class (built-in rules)"
                                 : "");
    printf("# every shape, whatever decided it: regret max %.1f%%, mean %.1f%%\n",
           100 * worst_all, n_measured ? 100 * sum_all / n_measured : 0.0);
    sdpa_context_destroy(ctx);
    if (over)
        printf("# %d shape%s above --max-regret %.1f%%\n", over, over == 1 ? "" : "s",
               100 * max_regret);
    return over ? 1 : 0;
}

int cmd_tune(int argc, char **argv)
{
    tool_flag f[] = {{"--suite", 1, NULL},    {"--shape", 1, NULL},   {"--backends", 1, NULL},
                     {"--reps", 1, NULL},     {"--dtype", 1, NULL},   {"--threads", 1, NULL},
                     {"--out", 1, NULL},      {"--min-gain", 1, NULL}, {"--install", 0, NULL},
                     {"--system", 0, NULL},   {"--quick", 0, NULL},   {"--check", 0, NULL},
                     {"--max-regret", 1, NULL}, {"--extra", 1, NULL}};
    enum { SUITE, SHAPE, BACKENDS, REPS, DTYPE, THREADS, OUT, MIN_GAIN, INSTALL, SYSTEM, QUICK,
           CHECK, MAX_REGRET, EXTRA, NF };
    int rc = tool_parse_flags(argc, argv, f, NF);
    if (rc)
        return rc;
    const int install = f[INSTALL].value != NULL, check = f[CHECK].value != NULL;
    const int quick = f[QUICK].value != NULL;
    if (f[SYSTEM].value && !install)
        return tool_usage_error("tune: --system goes with --install");
    if (check && (install || f[OUT].value || quick || f[MIN_GAIN].value || f[EXTRA].value))
        return tool_usage_error("tune --check measures the wisdom in force: it takes --suite "
                                "or --shape, --dtype, --backends, --reps, --threads and "
                                "--max-regret");
    if (!check && install == (f[OUT].value != NULL))
        return tool_usage_error("tune: give --out FILE, --install [--system] or --check, not %s",
                                install ? "--out and --install" : "none of them");
    if (f[MAX_REGRET].value && !check)
        return tool_usage_error("tune: --max-regret goes with --check");
    if (!f[SUITE].value && !f[SHAPE].value) /* the default suites */
        f[SUITE].value = check ? "tune-holdout" : quick ? "tune-cpu-quick" : "tune-cpu";
    char wisdom[4096] = "";
    if (install) {
        sdpa_wisdom_path(f[SYSTEM].value != NULL, wisdom, sizeof wisdom);
        if (!wisdom[0])
            return tool_usage_error("tune --install: no per-user location (HOME and "
                                    "XDG_CONFIG_HOME are unset); use --system or --out FILE");
        if (make_parents(wisdom) != 0)
            return tool_usage_error("tune --install: cannot create the directory of %s: %s",
                                    wisdom, strerror(errno));
    }
    const char *out_path = install ? wisdom : f[OUT].value;
    char err[640];
    tool_output o1 = {install ? "--install" : "--out", out_path, write_text, NULL, "", 0, 0};
    if (!check && tool_outputs_resolve(&o1, 1, err, sizeof err) != 0) /* before the timing */
        return tool_usage_error("%s", err);
    static row rows[MAX_ROWS];
    int n_rows, threads;
    sdpa_dtype dtype, dtypes[SDPA_DTYPE_COUNT];
    int n_dtypes = 0;
    /* --dtype takes a list here; default f32 and bf16, the two a CPU model runs in */
    const char *dtype_list = f[DTYPE].value ? f[DTYPE].value : "f32,bf16";
    if ((rc = parse_dtypes(dtype_list, dtypes, &n_dtypes)) != 0)
        return rc;
    if ((rc = suite_args(f[SUITE].value, f[SHAPE].value, NULL, f[THREADS].value, rows, &n_rows,
                         &dtype, &threads)) != 0 ||
        (rc = expand_dtypes(rows, &n_rows, dtypes, n_dtypes)) != 0)
        return rc;
    long long reps = quick ? 3 : 7;
    if (f[REPS].value && !tool_parse_int(f[REPS].value, 3, 1000, &reps))
        return tool_usage_error("--reps '%s' is not a number in 3..1000", f[REPS].value);
    if (check) {
        double max_regret = -1;
        if (f[MAX_REGRET].value) {
            char *end;
            max_regret = strtod(f[MAX_REGRET].value, &end) / 100.0;
            if (*end || end == f[MAX_REGRET].value || max_regret < 0)
                return tool_usage_error("--max-regret '%s' is not a percentage >= 0",
                                        f[MAX_REGRET].value);
        }
        return tune_check(rows, n_rows, f[BACKENDS].value, threads, reps, max_regret);
    }
    double min_gain = 0.02;
    if (f[MIN_GAIN].value) {
        char *end;
        min_gain = strtod(f[MIN_GAIN].value, &end);
        if (*end || end == f[MIN_GAIN].value || min_gain <= 0 || min_gain >= 1)
            return tool_usage_error("--min-gain '%s' is not a fraction in (0, 1)",
                                    f[MIN_GAIN].value);
    }
    long long extra = quick ? -1 : 2;
    if (f[EXTRA].value && !tool_parse_int(f[EXTRA].value, 0, 16, &extra))
        return tool_usage_error("--extra '%s' is not a number in 0..16", f[EXTRA].value);
    static sdpa_tune_row trows[MAX_ROWS];
    for (int r = 0; r < n_rows; r++) {
        trows[r].name = rows[r].name;
        trows[r].desc = rows[r].d;
        trows[r].seq_len_kv = rows[r].seq_len_kv;
    }
    const char *names[32];
    int nb = 0;
    char list[512];
    if (f[BACKENDS].value) {
        if (strlen(f[BACKENDS].value) >= sizeof list)
            return tool_usage_error("--backends list too long");
        strcpy(list, f[BACKENDS].value);
        char *save = NULL;
        for (char *tok = strtok_r(list, ",", &save); tok && nb < 32; tok = strtok_r(NULL, ",", &save))
            names[nb++] = tok;
    }
    sdpa_context *ctx;
    if ((rc = tool_context(NULL, threads, &ctx)) != 0)
        return rc;
    sdpa_tune_options o = SDPA_TUNE_OPTIONS_DEFAULT;
    o.backends = nb ? names : NULL;
    o.n_backends = nb;
    o.reps = (int)reps;
    o.min_gain = min_gain;
    o.max_extra = extra == 0 ? -1 : (int)extra;
    if (isatty(2)) {
        o.progress = progress;
        o.progress_user = rows;
    }
    char *text = NULL;
    sdpa_status st = sdpa_tune(ctx, trows, n_rows, &o, &text);
    if (o.progress)
        fprintf(stderr, "\r%60s\r", "");
    if (st != SDPA_OK) {
        rc = tool_lib_error("tune", st);
    } else {
        o1.user = text;
        if (tool_outputs_resolve(&o1, 1, err, sizeof err) != 0 ||
            (install && keep_previous(o1.target, err, sizeof err) != 0) ||
            tool_outputs_write(&o1, 1, err, sizeof err) != 0) {
            rc = tool_usage_error("%s", err);
        } else if (!install) {
            fputs(text, stdout);
            printf("# written to %s; install with SDPA_POLICY=%s\n", out_path, out_path);
        } else {
            fputs(text, stdout);
            /* what a fresh context makes of it, as every program will */
            sdpa_context *fresh;
            if (tool_context(NULL, threads, &fresh) == 0) {
                printf("# wisdom installed at %s; a new context reports:\n# %s", out_path,
                       sdpa_context_wisdom(fresh));
                sdpa_context_destroy(fresh);
            }
        }
    }
    sdpa_free(text);
    sdpa_context_destroy(ctx);
    return rc;
}
