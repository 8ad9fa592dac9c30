/*
 * error.c - status strings and the per-thread last-error message.
 *
 * The message lives in thread-local storage so that concurrent calls on one
 * context never see each other's errors (SQLite keeps it per handle; a
 * per-thread buffer is the same idea without a handle to hang it on).
 */
#include "core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char last_error[1024];
static _Thread_local const char *last_backend = "";

const char *sdpa_version(void) { return SDPA_VERSION_STRING; }

const char *sdpa_status_string(sdpa_status status)
{
    switch (status) {
    case SDPA_OK: return "ok";
    case SDPA_INVALID_ARGUMENT: return "invalid argument";
    case SDPA_UNSUPPORTED: return "unsupported";
    case SDPA_OUT_OF_MEMORY: return "out of memory";
    case SDPA_DEVICE_ERROR: return "device error";
    case SDPA_NOT_AVAILABLE: return "not available";
    case SDPA_INTERNAL: return "internal error";
    }
    return "unknown status";
}

const char *sdpa_last_error(void) { return last_error; }
const char *sdpa_last_backend(void) { return last_backend; }
void sdpa__set_last_backend(const char *name) { last_backend = name ? name : ""; }
void sdpa_free(void *p) { free(p); }

sdpa_status sdpa__fail(sdpa_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

void sdpa__clear_error(void) { last_error[0] = '\0'; }

char *sdpa__strlcpy(char *dst, const char *src, size_t cap)
{
    if (cap == 0)
        return dst;
    size_t n = src ? strlen(src) : 0;
    if (n >= cap)
        n = cap - 1;
    if (n)
        memcpy(dst, src, n);
    dst[n] = '\0';
    return dst;
}

char *sdpa__fmt(char *dst, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst, cap, fmt, ap);
    va_end(ap);
    return dst;
}
