/*
 * fuzz_npy.c - libFuzzer target: `sdpa run`'s .npy reader on any bytes.
 * It must read the array or fail with a one-line reason, never crash,
 * hang, allocate what the bytes do not back, or trip a sanitizer. Run by
 * scripts/test.sh for a bounded time over tests/fuzz/corpus/npy.
 */
#define _POSIX_C_SOURCE 200809L
#include "npy.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    if (size == 0)
        return 0;
    FILE *f = fmemopen((void *)data, size, "rb");
    if (!f)
        return 0;
    npy_array a;
    char err[512] = "";
    int rc = npy_read_stream(f, "fuzz.npy", &a, err, sizeof err);
    fclose(f);
    if (rc == 0) {
        size_t bytes = (size_t)a.count * (a.is_bool ? 1 : a.is_f16 ? 2 : 4);
        if (bytes > size)
            abort(); /* data the input does not hold */
        volatile unsigned char sink = 0;
        for (size_t i = 0; i < bytes; i++)
            sink ^= ((const unsigned char *)a.data)[i];
        (void)sink;
        npy_free(&a);
    } else if (!err[0] || strchr(err, '\n')) {
        abort(); /* a failure must say why, on one line */
    }
    return 0;
}
