/*
 * tune.c - `sdpa tune --suite FILE --out rules.txt`: measures the
 * candidates on each row (sdpa_tune) and writes the rule file, which can be
 * installed with SDPA_POLICY=rules.txt; or `sdpa tune --install [--system]`
 * writes it as this user's (or the system's) wisdom, which every context
 * then loads by itself (sdpa.h, sdpa_context_wisdom). Progress on a
 * terminal only.
 */
#define _POSIX_C_SOURCE 200809L
#include "suite.h"
#include "commands.h"
#include "output.h"
#include "tool.h"

#include <errno.h>
#include <stdlib.h>
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

int cmd_tune(int argc, char **argv)
{
    tool_flag f[] = {{"--suite", 1, NULL},    {"--shape", 1, NULL},   {"--backends", 1, NULL},
                     {"--reps", 1, NULL},     {"--dtype", 1, NULL},   {"--threads", 1, NULL},
                     {"--out", 1, NULL},      {"--min-gain", 1, NULL}, {"--install", 0, NULL},
                     {"--system", 0, NULL}};
    enum { SUITE, SHAPE, BACKENDS, REPS, DTYPE, THREADS, OUT, MIN_GAIN, INSTALL, SYSTEM, NF };
    int rc = tool_parse_flags(argc, argv, f, NF);
    if (rc)
        return rc;
    const int install = f[INSTALL].value != NULL;
    if (f[SYSTEM].value && !install)
        return tool_usage_error("tune: --system goes with --install");
    if (install == (f[OUT].value != NULL))
        return tool_usage_error("tune: give --out FILE or --install [--system], not %s",
                                install ? "both" : "neither");
    char wisdom[4096] = "";
    if (install) {
        sdpa_wisdom_path(f[SYSTEM].value != NULL, wisdom, sizeof wisdom);
        if (!wisdom[0])
            return tool_usage_error("tune --install: no per-user location (HOME and "
                                    "XDG_CONFIG_HOME are unset); use --system or --out FILE");
        if (make_parents(wisdom) != 0)
            return tool_usage_error("tune --install: cannot create the directory of %s: %s",
                                    wisdom, strerror(errno));
        if (!f[SUITE].value && !f[SHAPE].value)
            f[SUITE].value = "diffusion-cpu"; /* the measured shapes that matter here */
    }
    const char *out_path = install ? wisdom : f[OUT].value;
    char err[640];
    tool_output o1 = {install ? "--install" : "--out", out_path, write_text, NULL, "", 0, 0};
    if (tool_outputs_resolve(&o1, 1, err, sizeof err) != 0) /* before the timing, not after */
        return tool_usage_error("%s", err);
    static row rows[MAX_ROWS];
    int n_rows, threads;
    sdpa_dtype dtype;
    if ((rc = suite_args(f[SUITE].value, f[SHAPE].value, f[DTYPE].value, f[THREADS].value, rows,
                         &n_rows, &dtype, &threads)) != 0)
        return rc;
    long long reps = 7;
    if (f[REPS].value && !tool_parse_int(f[REPS].value, 3, 1000, &reps))
        return tool_usage_error("--reps '%s' is not a number in 3..1000", f[REPS].value);
    double min_gain = 0.02;
    if (f[MIN_GAIN].value) {
        char *end;
        min_gain = strtod(f[MIN_GAIN].value, &end);
        if (*end || end == f[MIN_GAIN].value || min_gain <= 0 || min_gain >= 1)
            return tool_usage_error("--min-gain '%s' is not a fraction in (0, 1)",
                                    f[MIN_GAIN].value);
    }
    static sdpa_tune_row trows[MAX_ROWS];
    for (int r = 0; r < n_rows; r++) {
        trows[r].name = rows[r].name;
        trows[r].desc = rows[r].d;
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
            sdpa_context *check;
            if (tool_context(NULL, threads, &check) == 0) {
                printf("# wisdom installed at %s; a new context reports:\n# %s", out_path,
                       sdpa_context_wisdom(check));
                sdpa_context_destroy(check);
            }
        }
    }
    sdpa_free(text);
    sdpa_context_destroy(ctx);
    return rc;
}
