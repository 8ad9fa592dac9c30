/*
 * log.c - messages through the context's callback, filtered by level.
 * Formatting happens only when the level is enabled, so a disabled debug
 * line on the hot path costs one comparison.
 */
#include "core.h"

#include <stdio.h>
#include <string.h>

static const char *level_names[] = {"error", "warn", "info", "debug"};

int sdpa__log_level_parse(const char *s)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(s, level_names[i]) == 0)
            return i;
    return -1;
}

void sdpa__log(const sdpa_logger *lg, sdpa_log_level level, const char *fmt, ...)
{
    if (!lg || (int)level > lg->level)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (lg->fn)
        lg->fn(level, msg, lg->user);
    else
        fprintf(stderr, "sdpa: %s: %s\n", level_names[level], msg);
}
