/*
 * rule_files.c - the rules a context decides by, from where they come: the
 * built-in text, this machine's wisdom, and the user's rule files (checked
 * as sdpa_context_load_policy says; a tuned file made elsewhere is refused
 * or, as wisdom, ignored).
 */
#include "context.h"
#include "rule_files.h"
#include "environment.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int name_known(const char *name, void *user)
{
    return sdpa__ctx_find(user, name) >= 0;
}

/* A tuned file names the machine and version it was measured on; timings
 * from elsewhere are not evidence here. Why pol was not made here, or ""
 * when its require lines match. */
static void foreign_reason(const sdpa_context *ctx, const sdpa_policy *pol, char *why, size_t n)
{
    char have[96], want[96];
    why[0] = '\0';
    if (pol->req_version[0] && strcmp(pol->req_version, SDPA_VERSION_STRING) != 0)
        snprintf(why, n, "made for libsdpa %s, this is %s", pol->req_version,
                 SDPA_VERSION_STRING);
    else if (pol->req_cpu_model[0] && strcmp(pol->req_cpu_model, ctx->host.cpu_model) != 0)
        snprintf(why, n, "made on CPU '%s', this is '%s'", pol->req_cpu_model,
                 ctx->host.cpu_model);
    else if (pol->has_req_isa && pol->req_isa != ctx->host.cpu_features) {
        sdpa__isa_list(pol->req_isa, want, sizeof want);
        sdpa__isa_list(ctx->host.cpu_features, have, sizeof have);
        snprintf(why, n, "made for CPU features [%s], this machine has [%s]", want, have);
    }
}

static sdpa_status check_foreign(const sdpa_context *ctx, const sdpa_policy *pol,
                                 const char *origin)
{
    char why[256];
    foreign_reason(ctx, pol, why, sizeof why);
    if (!why[0])
        return SDPA_OK;
    if (ctx->foreign_policy) {
        sdpa__log(&ctx->log, SDPA_LOG_WARN, "%s:%d: %s; loaded anyway (foreign_policy = warn)",
                  origin, pol->req_line, why);
        return SDPA_OK;
    }
    return sdpa__fail(SDPA_INVALID_ARGUMENT,
                      "%s:%d: %s; re-run `sdpa tune` on this machine, or set "
                      "SDPA_POLICY_FOREIGN=warn to load it anyway",
                      origin, pol->req_line, why);
}

/* Puts a parsed policy in front of the others (takes pol in every case). */
static sdpa_status install_parsed(sdpa_context *ctx, sdpa_policy *pol, const char *origin)
{
    pthread_rwlock_wrlock(&ctx->lock);
    if (ctx->n_policies == SDPA_MAX_POLICIES + 1) {
        pthread_rwlock_unlock(&ctx->lock);
        sdpa__policy_free(pol);
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "%s: too many rule files (at most %d)", origin,
                          SDPA_MAX_POLICIES);
    }
    /* Newest first: a later file takes precedence over earlier ones. */
    memmove(&ctx->policies[1], &ctx->policies[0], sizeof ctx->policies[0] * ctx->n_policies);
    memmove(&ctx->policy_origin[1], &ctx->policy_origin[0],
            sizeof ctx->policy_origin[0] * ctx->n_policies);
    ctx->policies[0] = pol;
    sdpa__strlcpy(ctx->policy_origin[0], origin, sizeof ctx->policy_origin[0]);
    ctx->n_policies++;
    atomic_fetch_add(&ctx->generation, 1);
    pthread_rwlock_unlock(&ctx->lock);
    return SDPA_OK;
}

sdpa_status sdpa__ctx_install_policy(sdpa_context *ctx, const char *text, const char *origin)
{
    sdpa_policy *pol;
    sdpa_status st = sdpa__policy_parse(text, origin, name_known, ctx, &pol);
    if (st != SDPA_OK)
        return st;
    if ((st = check_foreign(ctx, pol, origin)) != SDPA_OK) {
        sdpa__policy_free(pol);
        return st;
    }
    return install_parsed(ctx, pol, origin);
}

sdpa_status sdpa_context_load_policy_text(sdpa_context *ctx, const char *text, const char *origin)
{
    if (!ctx || !text)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "%s is NULL", ctx ? "text" : "ctx");
    sdpa_status st = sdpa__ctx_install_policy(ctx, text, origin ? origin : "(text)");
    if (st == SDPA_OK)
        sdpa__clear_error();
    return st;
}

/* Rule files are a few KiB; a larger one is a mistake (or not a rule file). */
#define SDPA_POLICY_MAX_BYTES (1 << 20)

/* A rule file's text (release with free), checked as sdpa_context_load_policy says. */
static sdpa_status read_rule_file(const char *path, char **out)
{
    *out = NULL;
    /* Non-blocking open, so a FIFO is refused rather than waited on; only
     * regular files of at most SDPA_POLICY_MAX_BYTES are read. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat sb;
    if (fd < 0)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "policy file '%s' cannot be opened: %s", path,
                          strerror(errno));
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "policy file '%s' is not a regular file, expected a rule file", path);
    }
    if (sb.st_size > SDPA_POLICY_MAX_BYTES) {
        close(fd);
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "policy file '%s' has %lld bytes, expected at most %d", path,
                          (long long)sb.st_size, SDPA_POLICY_MAX_BYTES);
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "policy file '%s': cannot allocate", path);
    }
    char *text = NULL;
    size_t len = 0, cap = 0, n;
    char chunk[4096];
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (len + n > SDPA_POLICY_MAX_BYTES) { /* grew while being read */
            free(text);
            fclose(f);
            return sdpa__fail(SDPA_INVALID_ARGUMENT,
                              "policy file '%s' is longer than %d bytes, expected at most that",
                              path, SDPA_POLICY_MAX_BYTES);
        }
        if (len + n + 1 > cap) {
            cap = (len + n + 1) * 2;
            char *t = sdpa__realloc(text, cap);
            if (!t) {
                free(text);
                fclose(f);
                return sdpa__fail(SDPA_OUT_OF_MEMORY, "policy file '%s': cannot allocate", path);
            }
            text = t;
        }
        memcpy(text + len, chunk, n);
        len += n;
    }
    int read_error = ferror(f);
    fclose(f);
    if (read_error) {
        free(text);
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "policy file '%s' cannot be read", path);
    }
    if (!text && !(text = sdpa__calloc(1, 1)))
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "policy file '%s': cannot allocate", path);
    text[len] = '\0';
    if (strlen(text) != len) {
        free(text);
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "policy file '%s' contains a NUL byte", path);
    }
    *out = text;
    return SDPA_OK;
}

sdpa_status sdpa_context_load_policy(sdpa_context *ctx, const char *path)
{
    if (!ctx || !path)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "%s is NULL", ctx ? "path" : "ctx");
    char *text;
    sdpa_status st = read_rule_file(path, &text);
    if (st != SDPA_OK)
        return st;
    st = sdpa__ctx_install_policy(ctx, text, path);
    free(text);
    if (st == SDPA_OK)
        sdpa__clear_error();
    return st;
}

/*
 * Wisdom, as FFTW calls it: the rules `sdpa tune --install` measured on
 * this machine, loaded by every context (unless opts->ignore_env) after
 * the built-in rules and before SDPA_POLICY / opts->policy_file, so that
 * an explicit file still wins. Lookup order (sdpa.h, README):
 *   SDPA_WISDOM=PATH      that file only ("none": no wisdom at all)
 *   otherwise             SDPA_SYSCONFDIR/libsdpa/wisdom.rules (system),
 *                         then $XDG_CONFIG_HOME/libsdpa/wisdom.rules or
 *                         ~/.config/libsdpa/wisdom.rules (this user's,
 *                         tried before the system's)
 * A missing file is skipped quietly. A file whose `require` lines name
 * another CPU, ISA or libsdpa version is ignored, saying why at info level;
 * one that does not parse is ignored with a warning: a stale or broken
 * file must never stop a program from creating its context.
 */
/* The wisdom file's path: the system's, or this user's from XDG_CONFIG_HOME
 * or HOME as given. */
static void wisdom_path(const char *xdg, const char *home, int system, char *buf, size_t n)
{
    if (system)
        snprintf(buf, n, "%s/libsdpa/wisdom.rules", SDPA_SYSCONFDIR);
    else if (xdg && *xdg)
        snprintf(buf, n, "%s/libsdpa/wisdom.rules", xdg);
    else if (home && *home)
        snprintf(buf, n, "%s/.config/libsdpa/wisdom.rules", home);
    else
        buf[0] = '\0';
}

void sdpa_wisdom_path(int system, char *buf, size_t n)
{
    if (!buf || n == 0)
        return;
    char xdg[1024], home[1024];
    sdpa__env_read_one(SDPA_ENV_XDG_CONFIG_HOME, xdg, sizeof xdg);
    sdpa__env_read_one(SDPA_ENV_HOME, home, sizeof home);
    wisdom_path(xdg, home, system, buf, n);
}

static void wisdom_note(sdpa_context *ctx, const char *fmt, const char *path, const char *why)
{
    size_t len = strlen(ctx->wisdom);
    snprintf(ctx->wisdom + len, sizeof ctx->wisdom - len, fmt, path, why);
}

static void load_wisdom_file(sdpa_context *ctx, const char *path, int named)
{
    struct stat sb;
    if (stat(path, &sb) != 0 && errno == ENOENT) {
        if (named)
            wisdom_note(ctx, "ignored %s: %s\n", path, "no such file (SDPA_WISDOM)");
        return;
    }
    char *text;
    sdpa_policy *pol = NULL;
    sdpa_status st = read_rule_file(path, &text);
    if (st == SDPA_OK) {
        st = sdpa__policy_parse(text, path, name_known, ctx, &pol);
        free(text);
    }
    if (st != SDPA_OK) {
        sdpa__log(&ctx->log, SDPA_LOG_WARN, "wisdom %s ignored: %s", path, sdpa_last_error());
        wisdom_note(ctx, "ignored %s: %s\n", path, sdpa_last_error());
        sdpa__clear_error();
        return;
    }
    char why[256];
    foreign_reason(ctx, pol, why, sizeof why);
    if (why[0]) {
        sdpa__log(&ctx->log, SDPA_LOG_INFO, "wisdom %s ignored: %s", path, why);
        wisdom_note(ctx, "ignored %s: %s\n", path, why);
        sdpa__policy_free(pol);
        return;
    }
    int n_rules = pol->n, n_classes = 0;
    for (int i = 0; i < pol->n; i++)
        n_classes += pol->rules[i].klass[0] != '\0';
    if (install_parsed(ctx, pol, path) != SDPA_OK) {
        wisdom_note(ctx, "ignored %s: %s\n", path, sdpa_last_error());
        sdpa__clear_error();
        return;
    }
    ctx->wisdom_rules = n_rules, ctx->wisdom_classes = n_classes;
    sdpa__log(&ctx->log, SDPA_LOG_INFO, "wisdom %s in force", path);
    wisdom_note(ctx, "in force %s%s\n", path, "");
}

void sdpa__ctx_load_wisdom(sdpa_context *ctx, const sdpa_env *env)
{
    if (env->set[SDPA_ENV_WISDOM]) {
        const char *named = env->value[SDPA_ENV_WISDOM];
        if (!*named || strcmp(named, "none") == 0)
            snprintf(ctx->wisdom, sizeof ctx->wisdom, "none (SDPA_WISDOM=%.900s)\n", named);
        else
            load_wisdom_file(ctx, named, 1);
        return;
    }
    char sys[400], user[400];
    const char *xdg = sdpa__env_value(env, SDPA_ENV_XDG_CONFIG_HOME),
               *home = sdpa__env_value(env, SDPA_ENV_HOME);
    wisdom_path(xdg, home, 1, sys, sizeof sys);
    wisdom_path(xdg, home, 0, user, sizeof user);
    load_wisdom_file(ctx, sys, 0); /* the user's is installed after it: tried first */
    if (user[0])
        load_wisdom_file(ctx, user, 0);
    if (!ctx->wisdom[0])
        snprintf(ctx->wisdom, sizeof ctx->wisdom, "none found (looked for %s and %s)\n", user,
                 sys);
}

const char *sdpa_context_wisdom(const sdpa_context *ctx) { return ctx ? ctx->wisdom : ""; }
