/* strbuf.c - see strbuf.h. */
#include "strbuf.h"
#include "core.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static int reserve(sdpa_strbuf *sb, size_t extra)
{
    if (sb->oom)
        return 0;
    if (sb->len + extra + 1 <= sb->cap)
        return 1;
    size_t cap = sb->cap ? sb->cap : 256;
    while (cap < sb->len + extra + 1)
        cap *= 2;
    char *s = sdpa__realloc(sb->s, cap);
    if (!s) {
        sb->oom = 1;
        return 0;
    }
    sb->s = s, sb->cap = cap;
    return 1;
}

void sdpa__sb_printf(sdpa_strbuf *sb, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !reserve(sb, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(sb->s + sb->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb->len += (size_t)n;
}

/* Length of the valid UTF-8 sequence at p (lead byte >= 0x80), or 0:
 * no overlong forms, no surrogates, nothing past U+10FFFF. */
static int utf8_length(const unsigned char *p)
{
    int n = p[0] >= 0xf0 ? 4 : p[0] >= 0xe0 ? 3 : p[0] >= 0xc2 ? 2 : 0;
    if (n == 0 || p[0] > 0xf4)
        return 0;
    for (int i = 1; i < n; i++)
        if ((p[i] & 0xc0) != 0x80)
            return 0;
    if ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] >= 0xa0) ||
        (p[0] == 0xf0 && p[1] < 0x90) || (p[0] == 0xf4 && p[1] >= 0x90))
        return 0;
    return n;
}

void sdpa__sb_json_string(sdpa_strbuf *sb, const char *s)
{
    sdpa__sb_printf(sb, "\"");
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p >= 0x80) { /* copy valid UTF-8; anything else becomes U+FFFD */
            int n = utf8_length(p);
            if (n == 0) {
                sdpa__sb_printf(sb, "\\ufffd");
                continue;
            }
            sdpa__sb_printf(sb, "%.*s", n, (const char *)p);
            p += n - 1;
        } else if (*p == '"' || *p == '\\')
            sdpa__sb_printf(sb, "\\%c", *p);
        else if (*p < 0x20)
            sdpa__sb_printf(sb, "\\u%04x", *p);
        else
            sdpa__sb_printf(sb, "%c", *p);
    }
    sdpa__sb_printf(sb, "\"");
}

char *sdpa__sb_take(sdpa_strbuf *sb)
{
    if (sb->oom || !reserve(sb, 0)) {
        free(sb->s);
        sb->s = NULL, sb->len = sb->cap = 0;
        return NULL;
    }
    sb->s[sb->len] = '\0';
    char *s = sb->s;
    sb->s = NULL, sb->len = sb->cap = 0;
    return s;
}
