/* output.c - see output.h. */
#define _XOPEN_SOURCE 700
#include "output.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int fail(char *err, size_t errn, const tool_output *o, const char *why, int e)
{
    snprintf(err, errn, "%s: %s: %s%s%s", o->flag, o->path, why, e ? ": " : "",
             e ? strerror(e) : "");
    return -1;
}

/* A path that does not exist yet: its directory must, and is canonical. */
static int resolve_new(tool_output *o, char *err, size_t errn)
{
    char dir[PATH_MAX], canon[PATH_MAX];
    const char *slash = strrchr(o->path, '/');
    const char *base = slash ? slash + 1 : o->path;
    if (!*base)
        return fail(err, errn, o, "names a directory, expected a file", 0);
    if (slash)
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - o->path) + (slash == o->path), o->path);
    else
        snprintf(dir, sizeof dir, ".");
    if (!realpath(dir, canon))
        return fail(err, errn, o, "cannot create", errno);
    if (snprintf(o->target, sizeof o->target, "%s/%s", strcmp(canon, "/") ? canon : "", base) >=
        (int)sizeof o->target)
        return fail(err, errn, o, "path too long", 0);
    mode_t mask = umask(0);
    umask(mask);
    o->mode = 0666u & ~(unsigned)mask;
    return 0;
}

/* A symbolic link whose target does not exist yet: the target is what the
 * output creates (links to links are followed, up to 8). */
static int resolve_dangling(tool_output *o, char *err, size_t errn)
{
    char link[PATH_MAX], next[PATH_MAX];
    snprintf(link, sizeof link, "%s", o->path);
    for (int depth = 0; depth < 8; depth++) {
        ssize_t len = readlink(link, next, sizeof next - 1);
        if (len < 0)
            return fail(err, errn, o, "cannot read the symbolic link", errno);
        next[len] = '\0';
        if (next[0] != '/') { /* relative to the link's directory */
            char joined[PATH_MAX];
            const char *slash = strrchr(link, '/');
            if (slash && snprintf(joined, sizeof joined, "%.*s/%s", (int)(slash - link), link,
                                  next) >= (int)sizeof joined)
                return fail(err, errn, o, "path too long", 0);
            if (slash)
                snprintf(next, sizeof next, "%s", joined);
        }
        struct stat ls;
        if (lstat(next, &ls) != 0) {
            if (errno != ENOENT)
                return fail(err, errn, o, "cannot inspect the link's target", errno);
            tool_output target = *o;
            target.path = next;
            if (resolve_new(&target, err, errn) != 0)
                return -1;
            snprintf(o->target, sizeof o->target, "%s", target.target);
            o->mode = target.mode;
            return 0;
        }
        if (!S_ISLNK(ls.st_mode))
            return fail(err, errn, o, "cannot resolve", ELOOP);
        snprintf(link, sizeof link, "%s", next);
    }
    return fail(err, errn, o, "too many levels of symbolic links", 0);
}

int tool_outputs_resolve(tool_output *o, int n, char *err, size_t errn)
{
    struct stat st[16];
    int exists[16];
    if (n > 16)
        return snprintf(err, errn, "too many outputs"), -1;
    for (int i = 0; i < n; i++) {
        o[i].in_place = 0;
        exists[i] = 0;
        struct stat ls;
        if (lstat(o[i].path, &ls) != 0) {
            if (errno != ENOENT)
                return fail(err, errn, &o[i], "cannot inspect", errno);
            if (resolve_new(&o[i], err, errn) != 0)
                return -1;
            continue;
        }
        char canon[PATH_MAX];
        if (!realpath(o[i].path, canon)) {
            if (S_ISLNK(ls.st_mode) && errno == ENOENT) {
                if (resolve_dangling(&o[i], err, errn) != 0)
                    return -1;
                continue;
            }
            return fail(err, errn, &o[i], "cannot resolve", errno);
        }
        if (stat(canon, &st[i]) != 0)
            return fail(err, errn, &o[i], "cannot inspect", errno);
        snprintf(o[i].target, sizeof o[i].target, "%s", canon);
        exists[i] = 1;
        if (S_ISREG(st[i].st_mode))
            o[i].mode = (unsigned)(st[i].st_mode & 07777);
        else if (S_ISCHR(st[i].st_mode) || S_ISFIFO(st[i].st_mode))
            o[i].in_place = 1;
        else
            return fail(err, errn, &o[i],
                        S_ISDIR(st[i].st_mode)
                            ? "is a directory, expected a file"
                            : "is not a regular file, character device or FIFO; refusing to "
                              "write it",
                        0);
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++) {
            int same = exists[i] && exists[j]
                           ? st[i].st_dev == st[j].st_dev && st[i].st_ino == st[j].st_ino
                           : strcmp(o[i].target, o[j].target) == 0;
            if (same && !(o[i].in_place && S_ISCHR(st[i].st_mode)))
                return snprintf(err, errn, "%s and %s name the same file (%s); expected two",
                                o[j].flag, o[i].flag, o[i].target),
                       -1;
        }
    return 0;
}

/* Writes through an open descriptor; closes it. */
static int write_fd(tool_output *o, int fd, char *err, size_t errn)
{
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        int e = errno;
        close(fd);
        return fail(err, errn, o, "cannot write", e);
    }
    char why[256] = "";
    int rc = o->write(f, o->user, why, sizeof why);
    int e = ferror(f) ? errno : 0;
    if (fclose(f) != 0 && rc == 0)
        rc = -1, e = errno;
    if (rc != 0)
        return why[0] ? fail(err, errn, o, why, 0) : fail(err, errn, o, "cannot write", e);
    return 0;
}

int tool_outputs_write(tool_output *o, int n, char *err, size_t errn)
{
    char tmp[16][PATH_MAX + 16];
    int made = 0, rc = 0;
    for (int i = 0; i < n && rc == 0; i++, made++) {
        tmp[i][0] = '\0';
        if (o[i].in_place)
            continue;
        snprintf(tmp[i], sizeof tmp[i], "%s.sdpa-XXXXXX", o[i].target);
        int fd = mkstemp(tmp[i]);
        if (fd < 0) {
            tmp[i][0] = '\0';
            rc = fail(err, errn, &o[i], "cannot create a temporary file beside it", errno);
        } else if (fchmod(fd, (mode_t)o[i].mode) != 0) {
            rc = fail(err, errn, &o[i], "cannot set permissions", errno);
            close(fd);
        } else {
            rc = write_fd(&o[i], fd, err, errn);
        }
    }
    for (int i = 0; i < n && rc == 0; i++) {
        if (!o[i].in_place)
            continue;
        int fd = open(o[i].target, O_WRONLY);
        rc = fd < 0 ? fail(err, errn, &o[i], "cannot open", errno)
                    : write_fd(&o[i], fd, err, errn);
    }
    for (int i = 0; i < n && rc == 0; i++)
        if (tmp[i][0] && rename(tmp[i], o[i].target) != 0)
            rc = fail(err, errn, &o[i], "cannot replace", errno);
        else
            tmp[i][0] = '\0';
    for (int i = 0; i < made; i++)
        if (tmp[i][0])
            unlink(tmp[i]);
    return rc;
}
