/*
 * strbuf.h - a growable string for building explanations and JSON.
 * On allocation failure the buffer sticks in a failed state (oom = 1) and
 * further appends are ignored, so callers check once at the end.
 */
#ifndef SDPA_STRBUF_H
#define SDPA_STRBUF_H

#include <stddef.h>

typedef struct sdpa_strbuf {
    char *s;
    size_t len, cap;
    int oom;
} sdpa_strbuf;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
void sdpa__sb_printf(sdpa_strbuf *sb, const char *fmt, ...);
/* Appends `s` as a JSON string literal, quotes included. */
void sdpa__sb_json_string(sdpa_strbuf *sb, const char *s);
/* Returns the text (caller frees) or NULL after an allocation failure. */
char *sdpa__sb_take(sdpa_strbuf *sb);

#endif
