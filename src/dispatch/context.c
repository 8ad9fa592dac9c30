/*
 * context.c - creating a context (platform, backends, rules, environment),
 * per-component and scoped overrides, backend listing.
 */
#include "context.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include "cuda_loader.h"
#include "../cpu/ceiling.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- scoped overrides: a per-thread stack of backend names */

static _Thread_local int override_depth;
static _Thread_local char override_stack[SDPA_OVERRIDE_DEPTH][64];

sdpa_status sdpa_override_push(const char *backend)
{
    if (!backend || !*backend)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "backend is %s, expected a backend name",
                          backend ? "empty" : "NULL");
    if (strlen(backend) >= sizeof override_stack[0])
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "backend name '%.20s...' is too long", backend);
    if (override_depth == SDPA_OVERRIDE_DEPTH)
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "scoped overrides nested deeper than %d; expected a pop for each push",
                          SDPA_OVERRIDE_DEPTH);
    strcpy(override_stack[override_depth++], backend);
    sdpa__clear_error();
    return SDPA_OK;
}

sdpa_status sdpa_override_pop(void)
{
    if (override_depth == 0)
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "sdpa_override_pop without a matching sdpa_override_push");
    override_depth--;
    sdpa__clear_error();
    return SDPA_OK;
}

const char *sdpa_override_current(void)
{
    return override_depth ? override_stack[override_depth - 1] : NULL;
}

/* ---- backends */

int sdpa__ctx_find(const sdpa_context *ctx, const char *name)
{
    for (int i = 0; i < ctx->n_backends; i++)
        if (strcmp(ctx->backends[i]->name, name) == 0)
            return i;
    return -1;
}

static int name_known(const char *name, void *user)
{
    return sdpa__ctx_find(user, name) >= 0;
}

sdpa_status sdpa__ctx_add_backend(sdpa_context *ctx, const sdpa_backend *b)
{
    if (ctx->n_backends == SDPA_MAX_BACKENDS)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "too many backends (at most %d)",
                          SDPA_MAX_BACKENDS);
    if (sdpa__ctx_find(ctx, b->name) >= 0)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "backend '%s' already registered", b->name);
    int i = ctx->n_backends++;
    ctx->backends[i] = b;
    ctx->present[i] = sdpa__backend_present(b, &ctx->host, ctx->why_absent[i],
                                            sizeof ctx->why_absent[i]);
    atomic_fetch_add(&ctx->generation, 1);
    return SDPA_OK;
}

int sdpa_backend_count(const sdpa_context *ctx) { return ctx ? ctx->n_backends : 0; }

sdpa_status sdpa_backend_get(const sdpa_context *ctx, int index, sdpa_backend_info *out)
{
    if (!ctx || !out)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "%s is NULL", ctx ? "out" : "ctx");
    if (index < 0 || index >= ctx->n_backends)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "index is %d, expected 0..%d", index,
                          ctx->n_backends - 1);
    const sdpa_backend *b = ctx->backends[index];
    memset(out, 0, sizeof *out);
    out->name = b->name;
    out->summary = b->summary;
    out->device = b->device;
    out->dtypes = b->caps.dtypes;
    out->head_dim_min = b->caps.d_min, out->head_dim_max = b->caps.d_max;
    out->head_dim_multiple = b->caps.d_multiple;
    out->gqa = b->caps.gqa, out->cross = b->caps.cross;
    out->causal_top_left = b->caps.causal_top_left;
    out->causal_bottom_right = b->caps.causal_bottom_right;
    out->lse = b->caps.lse, out->deterministic = b->caps.deterministic;
    out->cpu_features = b->caps.cpu_features;
    out->masks = b->caps.masks;
    out->min_cc = b->caps.min_cc;
    out->product_bits = b->caps.product_bits;
    out->present = ctx->present[index];
    sdpa__strlcpy(out->why_absent, ctx->why_absent[index], sizeof out->why_absent);
    out->version = b->version;
    return SDPA_OK;
}

/* ---- context */

const sdpa_platform *sdpa_context_platform(const sdpa_context *ctx)
{
    return ctx ? &ctx->platform : NULL;
}

int sdpa_context_threads(const sdpa_context *ctx) { return ctx ? ctx->threads : 0; }

sdpa_status sdpa__ctx_pool(sdpa_context *ctx, sdpa_pool **out)
{
    sdpa_status st = SDPA_OK;
    pthread_mutex_lock(&ctx->pool_lock);
    if (!ctx->pool)
        st = ctx->share_pool ? sdpa__pool_acquire(ctx->threads, &ctx->pool)
                             : sdpa__pool_create(ctx->threads, &ctx->pool);
    *out = ctx->pool;
    pthread_mutex_unlock(&ctx->pool_lock);
    return st;
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

static sdpa_status install_policy(sdpa_context *ctx, const char *text, const char *origin)
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
    sdpa_status st = install_policy(ctx, text, origin ? origin : "(text)");
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
    st = install_policy(ctx, text, path);
    free(text);
    if (st == SDPA_OK)
        sdpa__clear_error();
    return st;
}

sdpa_status sdpa_context_set_component_backend(sdpa_context *ctx, const char *component,
                                               const char *backend)
{
    if (!ctx || !component || !*component)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "%s is NULL or empty",
                          ctx ? "component" : "ctx");
    if (strlen(component) >= sizeof ctx->components[0].component)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "component name '%.20s...' is too long",
                          component);
    int b = -1;
    if (backend && (b = sdpa__ctx_find(ctx, backend)) < 0)
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "backend '%s' unknown (see `sdpa info` for the names)", backend);
    pthread_rwlock_wrlock(&ctx->lock);
    int i = 0;
    while (i < ctx->n_components && strcmp(ctx->components[i].component, component))
        i++;
    sdpa_status st = SDPA_OK;
    if (b < 0) {
        if (i < ctx->n_components)
            ctx->components[i] = ctx->components[--ctx->n_components];
    } else if (i == ctx->n_components && i == SDPA_MAX_COMPONENTS) {
        st = sdpa__fail(SDPA_INVALID_ARGUMENT, "too many component overrides (at most %d)",
                        SDPA_MAX_COMPONENTS);
    } else {
        if (i == ctx->n_components)
            ctx->n_components++;
        sdpa__strlcpy(ctx->components[i].component, component,
                      sizeof ctx->components[i].component);
        ctx->components[i].backend = b;
    }
    atomic_fetch_add(&ctx->generation, 1);
    pthread_rwlock_unlock(&ctx->lock);
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
void sdpa_wisdom_path(int system, char *buf, size_t n)
{
    if (!buf || n == 0)
        return;
    const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
    if (system)
        snprintf(buf, n, "%s/libsdpa/wisdom.rules", SDPA_SYSCONFDIR);
    else if (xdg && *xdg)
        snprintf(buf, n, "%s/libsdpa/wisdom.rules", xdg);
    else if (home && *home)
        snprintf(buf, n, "%s/.config/libsdpa/wisdom.rules", home);
    else
        buf[0] = '\0';
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
    if (install_parsed(ctx, pol, path) != SDPA_OK) {
        wisdom_note(ctx, "ignored %s: %s\n", path, sdpa_last_error());
        sdpa__clear_error();
        return;
    }
    sdpa__log(&ctx->log, SDPA_LOG_INFO, "wisdom %s in force", path);
    wisdom_note(ctx, "in force %s%s\n", path, "");
}

static void load_wisdom(sdpa_context *ctx)
{
    const char *env = getenv("SDPA_WISDOM");
    if (env) {
        if (!*env || strcmp(env, "none") == 0)
            snprintf(ctx->wisdom, sizeof ctx->wisdom, "none (SDPA_WISDOM=%s)\n", env);
        else
            load_wisdom_file(ctx, env, 1);
        return;
    }
    char sys[400], user[400];
    sdpa_wisdom_path(1, sys, sizeof sys);
    sdpa_wisdom_path(0, user, sizeof user);
    load_wisdom_file(ctx, sys, 0); /* the user's is installed after it: tried first */
    if (user[0])
        load_wisdom_file(ctx, user, 0);
    if (!ctx->wisdom[0])
        snprintf(ctx->wisdom, sizeof ctx->wisdom, "none found (looked for %s and %s)\n", user,
                 sys);
}

const char *sdpa_context_wisdom(const sdpa_context *ctx) { return ctx ? ctx->wisdom : ""; }

static sdpa_status apply_env(sdpa_context *ctx, const sdpa_context_options *o)
{
    const char *s;
    if (o->log_level < 0 && !o->ignore_env && (s = getenv("SDPA_LOG")) && *s) {
        int lvl = sdpa__log_level_parse(s);
        if (lvl < 0)
            return sdpa__fail(SDPA_INVALID_ARGUMENT,
                              "SDPA_LOG='%s' unknown, expected error, warn, info or debug", s);
        ctx->log.level = lvl;
    }
    if (!o->ignore_env && (s = getenv("SDPA_MAX_ISA")) && *s) {
        int ok;
        unsigned mask = sdpa__isa_level_mask(s, &ok);
        if (!ok)
            return sdpa__fail(SDPA_INVALID_ARGUMENT,
                              "SDPA_MAX_ISA='%s' unknown, expected portable, avx2, avx512, "
                              "avx512bf16 or amx",
                              s);
        unsigned before = ctx->host.cpu_features;
        ctx->host.cpu_features &= mask;
        if (!ctx->platform.simulated)
            ctx->platform.cpu_features &= mask;
        sdpa__log(&ctx->log, SDPA_LOG_INFO, "SDPA_MAX_ISA=%s: CPU features 0x%x -> 0x%x", s,
                  before, ctx->host.cpu_features);
    }
    if (!o->ignore_env && (s = getenv("SDPA_POLICY_FOREIGN")) && *s) {
        if (strcmp(s, "refuse") != 0 && strcmp(s, "warn") != 0)
            return sdpa__fail(SDPA_INVALID_ARGUMENT,
                              "SDPA_POLICY_FOREIGN='%s' unknown, expected refuse or warn", s);
        ctx->foreign_policy = strcmp(s, "warn") == 0;
    }
    if (!o->ignore_env && (s = getenv("SDPA_BACKEND")) && *s) {
        if ((ctx->env_backend = sdpa__ctx_find(ctx, s)) < 0)
            return sdpa__fail(SDPA_INVALID_ARGUMENT,
                              "SDPA_BACKEND='%s' unknown (see `sdpa info` for the names)", s);
    }
    if (o->ignore_env)
        snprintf(ctx->wisdom, sizeof ctx->wisdom, "not looked for (ignore_env)\n");
    else
        load_wisdom(ctx);
    const char *policy = o->policy_file;
    if (!policy && !o->ignore_env && (s = getenv("SDPA_POLICY")) && *s)
        policy = s;
    if (policy)
        return sdpa_context_load_policy(ctx, policy);
    return SDPA_OK;
}

/* One line on which CPU kernel each input dtype gets here (by the rules,
 * for a typical diffusion call) and why the better ones do not run
 * ("AMX present but permission refused; f32 -> cpu.avx512, ..."). */
static void log_isa_decision(sdpa_context *ctx)
{
    if (ctx->log.level < SDPA_LOG_INFO)
        return; /* three decisions for a line nobody reads */
    char kernels[160] = "", skipped[512] = "";
    for (int t = 0; t < SDPA_DTYPE_COUNT; t++) {
        sdpa_call_desc d;
        memset(&d, 0, sizeof d);
        d.device = SDPA_DEVICE_CPU, d.dtype = (sdpa_dtype)t;
        d.B = 1, d.Sq = d.Skv = 1024, d.Hq = d.Hkv = 8, d.D = 128;
        sdpa_decision dec;
        int cand[SDPA_MAX_CANDIDATES];
        const char *name = "none";
        if (sdpa__decide(ctx, &d, NULL, &dec, cand) == SDPA_OK && dec.status == SDPA_OK)
            for (int k = 0; k < dec.n_candidates && strcmp(name, "none") == 0; k++)
                if (ctx->present[cand[k]])
                    name = ctx->backends[cand[k]]->name;
        size_t len = strlen(kernels);
        snprintf(kernels + len, sizeof kernels - len, "%s%s -> %s", len ? ", " : "",
                 sdpa_dtype_name((sdpa_dtype)t), name);
    }
    sdpa__clear_error();
    for (int i = 0; i < ctx->n_backends; i++) {
        const sdpa_backend *b = ctx->backends[i];
        if (b->device != SDPA_DEVICE_CPU || b->fallback_rank <= 0 || ctx->present[i])
            continue;
        size_t len = strlen(skipped);
        snprintf(skipped + len, sizeof skipped - len, "%s%s %s", len ? "; " : "", b->name,
                 ctx->why_absent[i]);
    }
    const int refused =
        (ctx->host.cpu_features_present & SDPA_CPU_AMX_BF16) && !ctx->host.amx_permitted;
    const char *amx = refused ? "AMX present but permission refused; " : "";
    sdpa__log(&ctx->log, SDPA_LOG_INFO, "CPU kernel: %s%s%s%s%s", amx, kernels,
              skipped[0] ? " (" : "", skipped, skipped[0] ? ")" : "");
}

sdpa_status sdpa_context_create(const sdpa_context_options *opts, sdpa_context **out)
{
    static const sdpa_context_options defaults = SDPA_CONTEXT_OPTIONS_DEFAULT;
    if (!out)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "out is NULL, expected a place for the context");
    *out = NULL;
    const sdpa_context_options *o = opts ? opts : &defaults;
    if (o->threads < 0)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "opts->threads is %d, expected >= 0 (0 = all)",
                          o->threads);
    if (o->log_level < -1 || o->log_level > SDPA_LOG_DEBUG)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "opts->log_level is %d, expected -1..3",
                          o->log_level);
    sdpa_context *ctx = sdpa__calloc(1, sizeof *ctx);
    if (!ctx)
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "cannot allocate a context");
    pthread_mutex_init(&ctx->pool_lock, NULL);
    pthread_rwlock_init(&ctx->lock, NULL);
    ctx->env_backend = -1;
    ctx->log.fn = o->log;
    ctx->log.user = o->log_user;
    ctx->log.level = o->log_level >= 0 ? o->log_level : SDPA_LOG_WARN;
    sdpa_platform_detect(&ctx->host);
    ctx->platform = o->platform ? *o->platform : ctx->host;
    ctx->threads = o->threads ? o->threads : ctx->host.cpu_cores;
    ctx->foreign_policy = o->foreign_policy != 0;
    ctx->share_pool = o->share_pool != 0;

    sdpa_status st = SDPA_OK;
    for (int i = 0; sdpa__builtin_backends[i] && st == SDPA_OK; i++)
        st = sdpa__ctx_add_backend(ctx, sdpa__builtin_backends[i]);
    /* The CUDA plugin's kernels replace the declared placeholders. */
    const sdpa_backend *cuda[8];
    for (int i = 0, n = sdpa__cuda_backends(cuda, 8); i < n; i++) {
        int b = sdpa__ctx_find(ctx, cuda[i]->name);
        if (b >= 0)
            ctx->backends[b] = cuda[i];
    }
    if (st == SDPA_OK)
        st = install_policy(ctx, sdpa__default_rules_text, "default.rules");
    if (st == SDPA_OK)
        st = apply_env(ctx, o);
    if (st != SDPA_OK) {
        char msg[1024];
        sdpa__strlcpy(msg, sdpa_last_error(), sizeof msg);
        sdpa_context_destroy(ctx);
        return sdpa__fail(st, "%s", msg);
    }
    /* Presence depends on the host's features after SDPA_MAX_ISA. */
    for (int i = 0; i < ctx->n_backends; i++)
        ctx->present[i] = sdpa__backend_present(ctx->backends[i], &ctx->host, ctx->why_absent[i],
                                                sizeof ctx->why_absent[i]);
    sdpa__log(&ctx->log, SDPA_LOG_INFO, "context: %s, %d threads, %d backends", ctx->host.cpu_model,
              ctx->threads, ctx->n_backends);
    log_isa_decision(ctx);
    *out = ctx;
    sdpa__clear_error();
    return SDPA_OK;
}

void sdpa_context_destroy(sdpa_context *ctx)
{
    if (!ctx)
        return;
    if (ctx->share_pool)
        sdpa__pool_release(ctx->pool);
    else
        sdpa__pool_destroy(ctx->pool);
    for (int i = 0; i < ctx->n_policies; i++)
        sdpa__policy_free(ctx->policies[i]);
    pthread_mutex_destroy(&ctx->pool_lock);
    pthread_rwlock_destroy(&ctx->lock);
    free(ctx);
}

sdpa_status sdpa_measure_ceiling(sdpa_context *ctx, const char *what, double *gflops,
                                 const char **isa)
{
    if (!ctx || !what || !gflops)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "%s is NULL",
                          !ctx ? "ctx" : !what ? "what" : "gflops");
    *gflops = 0;
    sdpa_pool *pool;
    sdpa_status st = sdpa__ctx_pool(ctx, &pool);
    if (st != SDPA_OK)
        return st;
    return sdpa__cpu_ceiling(pool, ctx->host.cpu_features, what, gflops, isa);
}
