/*
 * tool.c - what every `sdpa` subcommand shares: one-line errors, flag and
 * number parsing, a context for this machine or a described platform.
 */
#define _POSIX_C_SOURCE 200809L
#include "tool.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int tool_usage_error(const char *fmt, ...)
{
    va_list ap;
    fputs("sdpa: error: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return 2;
}

int tool_lib_error(const char *what, sdpa_status st)
{
    fprintf(stderr, "sdpa: error: %s: %s: %s\n", what, sdpa_status_string(st), sdpa_last_error());
    return 1;
}

int tool_parse_dtype(const char *s, sdpa_dtype *out)
{
    for (int t = 0; t < SDPA_DTYPE_COUNT; t++)
        if (strcmp(s, sdpa_dtype_name((sdpa_dtype)t)) == 0)
            return *out = (sdpa_dtype)t, 1;
    return 0;
}

int tool_parse_causal(const char *s, sdpa_causal *out)
{
    for (int c = 0; c <= SDPA_CAUSAL_BOTTOM_RIGHT; c++)
        if (strcmp(s, sdpa_causal_name((sdpa_causal)c)) == 0)
            return *out = (sdpa_causal)c, 1;
    return 0;
}

int tool_parse_int(const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return 0;
    *out = v;
    return 1;
}

int tool_parse_mask_kinds(const char *s, unsigned *out)
{
    static const struct {
        const char *name;
        unsigned bit;
    } kinds[] = {{"none", 0},
                 {"seq_len", SDPA_MASK_KIND_SEQ_LEN},
                 {"key", SDPA_MASK_KIND_KEY},
                 {"general", SDPA_MASK_KIND_GENERAL},
                 {"window", SDPA_MASK_KIND_WINDOW},
                 {"blocks", SDPA_MASK_KIND_BLOCKS}};
    char buf[128];
    if (strlen(s) >= sizeof buf)
        return 0;
    strcpy(buf, s);
    *out = 0;
    for (char *save = NULL, *w = strtok_r(buf, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
        size_t k = 0;
        while (k < sizeof kinds / sizeof *kinds && strcmp(kinds[k].name, w) != 0)
            k++;
        if (k == sizeof kinds / sizeof *kinds)
            return 0;
        *out |= kinds[k].bit;
    }
    return 1;
}

int tool_parse_scale(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || !isfinite(v) || v == 0.0)
        return 0;
    *out = v;
    return 1;
}

int tool_parse_shape(const char *s, sdpa_call_desc *d)
{
    int64_t *dst[6] = {&d->B, &d->Sq, &d->Skv, &d->Hq, &d->Hkv, &d->D};
    char buf[256];
    if (strlen(s) >= sizeof buf)
        return 0;
    strcpy(buf, s);
    char *save = NULL, *tok = strtok_r(buf, ",", &save);
    for (int i = 0; i < 6; i++, tok = strtok_r(NULL, ",", &save)) {
        long long v;
        if (!tok || !tool_parse_int(tok, 1, (long long)1 << 40, &v))
            return 0;
        *dst[i] = v;
    }
    return tok == NULL;
}

double tool_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int tool_context(const char *platform, int threads, sdpa_context **ctx)
{
    sdpa_platform plat;
    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    sdpa_status st;
    if (platform) {
        if ((st = sdpa_platform_parse(platform, &plat)) != SDPA_OK)
            return tool_usage_error("--platform: %s", sdpa_last_error());
        o.platform = &plat;
    }
    o.threads = threads;
    if ((st = sdpa_context_create(&o, ctx)) != SDPA_OK)
        return tool_lib_error("cannot create a context", st);
    return 0;
}

int tool_parse_flags(int argc, char **argv, tool_flag *flags, int n)
{
    for (int i = 0; i < argc; i++) {
        int k = 0;
        while (k < n && strcmp(argv[i], flags[k].name) != 0)
            k++;
        if (k == n) {
            char known[512] = "";
            for (int j = 0; j < n; j++) {
                size_t len = strlen(known);
                snprintf(known + len, sizeof known - len, "%s%s", j ? " " : "", flags[j].name);
            }
            return tool_usage_error("unknown flag '%s' (expected: %s)", argv[i], known);
        }
        if (flags[k].value)
            return tool_usage_error("flag %s given twice", argv[i]);
        if (flags[k].takes_value) {
            if (i + 1 >= argc)
                return tool_usage_error("flag %s needs a value", argv[i]);
            flags[k].value = argv[++i];
        } else {
            flags[k].value = "1";
        }
    }
    return 0;
}

