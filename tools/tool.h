/* tool.h - helpers shared by the `sdpa` subcommands (tool.c). */
#ifndef SDPA_TOOL_H
#define SDPA_TOOL_H

#include "sdpa.h"

#include <stdio.h>

/* Prints "sdpa: error: ..." to stderr; returns 2 (usage) for convenience. */
int tool_usage_error(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
/* Prints the library's status and last error; returns 1. */
int tool_lib_error(const char *what, sdpa_status st);

int tool_parse_dtype(const char *s, sdpa_dtype *out);
int tool_parse_causal(const char *s, sdpa_causal *out);
int tool_parse_int(const char *s, long long lo, long long hi, long long *out);
/* "seq_len,key" into SDPA_MASK_KIND_* bits ("none" is 0). */
int tool_parse_mask_kinds(const char *s, unsigned *out);
/* A finite, non-zero --scale. */
int tool_parse_scale(const char *s, double *out);
/* "B,Sq,Skv,Hq,Hkv,D" */
int tool_parse_shape(const char *s, sdpa_call_desc *d);
double tool_now_ms(void);

/* Creates a context with `threads` (0: all) on platform spec (NULL: this machine). */
int tool_context(const char *platform, int threads, sdpa_context **ctx);

/* Flags: --name value pairs and --switches, in any order, each at most once. */
typedef struct tool_flag {
    const char *name;
    int takes_value;
    const char *value; /* set when seen; "1" for switches */
} tool_flag;

/* 0, or the exit code after printing the problem. */
int tool_parse_flags(int argc, char **argv, tool_flag *flags, int n);

#endif
