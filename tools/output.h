/*
 * output.h - writing a command's output files all or nothing.
 *
 * `sdpa run --out O --lse L` must never lose a file the user had: a
 * failure anywhere leaves every pre-existing file exactly as it was. So
 * every output is first written to a temporary file beside its target,
 * and the temporaries are renamed over their targets only when all of them
 * were written. Targets are resolved first:
 *   - a symbolic link is followed: its target is replaced (or created, for
 *     a link to a file that does not exist yet), the link stays;
 *   - a character device or FIFO (/dev/null, a pipe) is written in place,
 *     after every temporary has been written (it cannot be rolled back);
 *   - a directory, a block device or a socket is refused;
 *   - two outputs naming one file are refused.
 * A replaced regular file keeps its permission bits; a new one gets
 * 0666 less the umask, like any file the shell creates.
 */
#ifndef SDPA_OUTPUT_H
#define SDPA_OUTPUT_H

#include <stddef.h>
#include <stdio.h>

/* Writes one output's bytes to f; 0, or -1 with a reason in err. */
typedef int (*tool_write_fn)(FILE *f, const void *user, char *err, size_t errn);

typedef struct tool_output {
    const char *flag; /* "--out": named in messages */
    const char *path; /* as the user gave it       */
    tool_write_fn write;
    const void *user;
    /* filled by tool_outputs_resolve */
    char target[4096]; /* the file that will hold the output      */
    int in_place;      /* 1: a character device or FIFO           */
    unsigned mode;     /* permission bits for the replacement     */
} tool_output;

/* Resolves and checks every target; call before the work, so a bad path
 * fails at once. 0, or -1 with "FLAG: PATH: why" in err. */
int tool_outputs_resolve(tool_output *o, int n, char *err, size_t errn);

/* Writes them all or none (see above). 0, or -1 with the reason in err. */
int tool_outputs_write(tool_output *o, int n, char *err, size_t errn);

#endif
