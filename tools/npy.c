/*
 * npy.c - .npy reading and writing (format versions 1.0, 2.0 and 3.0).
 *
 * Layout: "\x93NUMPY", major, minor, header length (2 bytes for 1.0,
 * 4 bytes after), then a Python dict literal padded with spaces to a
 * multiple of 64 bytes, then the raw data in C order.
 */
#define _POSIX_C_SOURCE 200809L
#include "npy.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int fail(char *err, size_t n, const char *path, const char *what)
{
    snprintf(err, n, "%s: %s", path, what);
    return -1;
}

/*
 * The header is a Python dict literal. It is read as one, key by key, so a
 * key's name inside another key's string value is never taken for the key:
 * values are a quoted string, True/False, or a tuple of integers. Sets
 * vals[k] to the start of the value of keys[k]; -1 for a malformed dict.
 */
static int parse_dict(const char *p, const char *const *keys, int nkeys, const char **vals)
{
    for (int k = 0; k < nkeys; k++)
        vals[k] = NULL;
    while (*p == ' ')
        p++;
    if (*p++ != '{')
        return -1;
    for (;;) {
        while (*p == ' ' || *p == ',')
            p++;
        if (*p == '}')
            return 0;
        if (*p != '\'' && *p != '"')
            return -1;
        const char quote = *p++, *key = p;
        const char *end = strchr(p, quote);
        if (!end)
            return -1;
        const size_t klen = (size_t)(end - key);
        p = end + 1;
        while (*p == ' ')
            p++;
        if (*p++ != ':')
            return -1;
        while (*p == ' ')
            p++;
        for (int k = 0; k < nkeys; k++)
            if (strlen(keys[k]) == klen && strncmp(keys[k], key, klen) == 0)
                vals[k] = p;
        if (*p == '\'' || *p == '"') { /* skip the value */
            const char *e = strchr(p + 1, *p);
            if (!e)
                return -1;
            p = e + 1;
        } else if (*p == '(') {
            const char *e = strchr(p, ')');
            if (!e)
                return -1;
            p = e + 1;
        } else if (strncmp(p, "True", 4) == 0 || strncmp(p, "False", 5) == 0) {
            p += *p == 'T' ? 4 : 5;
        } else {
            return -1;
        }
    }
}

int npy_read(const char *path, npy_array *out, char *err, size_t errn)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f)
        return snprintf(err, errn, "%s: cannot open: %s", path, strerror(errno)), -1;
    int rc = npy_read_stream(f, path, out, err, errn);
    fclose(f);
    return rc;
}

int npy_read_stream(FILE *f, const char *path, npy_array *out, char *err, size_t errn)
{
    memset(out, 0, sizeof *out);
    unsigned char magic[10];
    char *hdr = NULL;
    int rc = -1;
    if (fread(magic, 1, 8, f) != 8 || memcmp(magic, "\x93NUMPY", 6) != 0) {
        fail(err, errn, path, "not a .npy file (bad magic)");
        goto done;
    }
    uint32_t hlen;
    if (magic[6] == 1) {
        unsigned char b[2];
        if (fread(b, 1, 2, f) != 2) {
            fail(err, errn, path, "truncated header");
            goto done;
        }
        hlen = b[0] | (uint32_t)b[1] << 8;
    } else if (magic[6] == 2 || magic[6] == 3) {
        unsigned char b[4];
        if (fread(b, 1, 4, f) != 4) {
            fail(err, errn, path, "truncated header");
            goto done;
        }
        hlen = b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    } else {
        fail(err, errn, path, "unsupported .npy format version");
        goto done;
    }
    if (hlen > (1u << 20)) {
        fail(err, errn, path, "header too large");
        goto done;
    }
    hdr = malloc(hlen + 1);
    if (!hdr || fread(hdr, 1, hlen, f) != hlen) {
        fail(err, errn, path, "truncated header");
        goto done;
    }
    hdr[hlen] = '\0';
    static const char *const keys[3] = {"descr", "fortran_order", "shape"};
    const char *vals[3];
    if (parse_dict(hdr, keys, 3, vals) != 0) {
        fail(err, errn, path, "malformed header (expected a dict of descr, fortran_order and "
                              "shape)");
        goto done;
    }
    const char *descr = vals[0], *order = vals[1], *shape = vals[2];
    if (!descr || !order || !shape) {
        fail(err, errn, path, "header lacks descr, fortran_order or shape");
        goto done;
    }
    out->is_f16 = out->is_bool = 0;
    if (strncmp(descr, "'<f4'", 5) == 0 || strncmp(descr, "'=f4'", 5) == 0)
        ;
    else if (strncmp(descr, "'<f2'", 5) == 0 || strncmp(descr, "'=f2'", 5) == 0)
        out->is_f16 = 1;
    else if (strncmp(descr, "'|b1'", 5) == 0)
        out->is_bool = 1;
    else {
        char what[128], code[16] = "?";
        const char *end = descr[0] == '\'' ? strchr(descr + 1, '\'') : NULL;
        if (end && end - descr - 1 < (long)sizeof code)
            snprintf(code, sizeof code, "%.*s", (int)(end - descr - 1), descr + 1);
        for (char *c = code; *c; c++) /* the message stays one printable line */
            *c = *c >= 0x20 && *c < 0x7f ? *c : '?';
        const char *name = strcmp(code + 1, "f8") == 0 ? "float64"
                           : code[1] == 'i'            ? "an integer type"
                                                       : "this dtype";
        snprintf(what, sizeof what,
                 "%s ('%s') not supported, expected float32, float16 or bool", name, code);
        fail(err, errn, path, what);
        goto done;
    }
    if (strncmp(order, "False", 5) != 0) {
        fail(err, errn, path, "Fortran-order array, expected C order");
        goto done;
    }
    if (*shape != '(') {
        fail(err, errn, path, "malformed shape");
        goto done;
    }
    const char *p = shape + 1;
    out->count = 1;
    while (*p && *p != ')') {
        while (*p == ' ' || *p == ',')
            p++;
        if (*p == ')')
            break;
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < 0 || out->ndim == NPY_MAX_DIMS ||
            __builtin_mul_overflow(out->count, (int64_t)v, &out->count)) {
            fail(err, errn, path, "malformed or oversized shape");
            goto done;
        }
        out->shape[out->ndim++] = v;
        p = end;
    }
    if (*p != ')') {
        fail(err, errn, path, "malformed shape");
        goto done;
    }
    size_t esize = out->is_bool ? 1 : out->is_f16 ? 2 : 4;
    if ((uint64_t)out->count > SIZE_MAX / esize / 2) { /* unsigned: SIZE_MAX / 1 is no int64 */
        fail(err, errn, path, "array too large");
        goto done;
    }
    size_t bytes = (size_t)out->count * esize;
    /* A seekable input must hold the data before it is allocated: a small
     * file claiming a huge shape is refused, not given gigabytes. */
    long here = ftell(f);
    if (here >= 0 && fseek(f, 0, SEEK_END) == 0) {
        long end = ftell(f);
        if (fseek(f, here, SEEK_SET) != 0 || (end >= here && (uint64_t)(end - here) < bytes)) {
            fail(err, errn, path, "truncated data (file shorter than its shape says)");
            goto done;
        }
    }
    out->data = malloc(bytes ? bytes : 1);
    if (!out->data) {
        fail(err, errn, path, "out of memory reading data");
        goto done;
    }
    if (fread(out->data, 1, bytes, f) != bytes) {
        fail(err, errn, path, "truncated data (file shorter than its shape says)");
        goto done;
    }
    rc = 0;
done:
    free(hdr);
    if (rc != 0)
        npy_free(out);
    return rc;
}

int npy_write_f32(FILE *f, const float *data, int ndim, const int64_t *shape)
{
    char dict[512];
    int len = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (");
    int64_t count = 1;
    for (int i = 0; i < ndim; i++) {
        len += snprintf(dict + len, sizeof dict - (size_t)len, "%lld%s", (long long)shape[i],
                        ndim == 1 ? "," : (i + 1 < ndim ? ", " : ""));
        count *= shape[i];
    }
    len += snprintf(dict + len, sizeof dict - (size_t)len, "), }");
    /* Pad so that magic (10 bytes) + dict + '\n' is a multiple of 64. */
    int total = 10 + len + 1;
    int pad = (64 - total % 64) % 64;
    unsigned hl = (unsigned)(len + pad + 1);
    unsigned char head[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hl & 0xff),
                              (unsigned char)(hl >> 8)};
    int ok = fwrite(head, 1, 10, f) == 10 && fwrite(dict, 1, (size_t)len, f) == (size_t)len;
    for (int i = 0; i < pad && ok; i++)
        ok = fputc(' ', f) != EOF;
    ok = ok && fputc('\n', f) != EOF;
    ok = ok && fwrite(data, sizeof(float), (size_t)count, f) == (size_t)count;
    return ok && fflush(f) == 0 ? 0 : -1;
}

void npy_free(npy_array *a)
{
    free(a->data);
    a->data = NULL;
}

const char *npy_shape_text(const npy_array *a)
{
    static _Thread_local char buf[NPY_MAX_DIMS * 22 + 4];
    size_t len = (size_t)snprintf(buf, sizeof buf, "[");
    for (int i = 0; i < a->ndim && len < sizeof buf; i++)
        len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%lld", i ? ", " : "",
                                (long long)a->shape[i]);
    if (len < sizeof buf)
        snprintf(buf + len, sizeof buf - len, "]");
    return buf;
}
