/*
 * npy.h - just enough of NumPy's .npy format for `sdpa run`: read float32,
 * float16 or bool C-order arrays, write float32 ones.
 */
#ifndef SDPA_NPY_H
#define SDPA_NPY_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#define NPY_MAX_DIMS 8

typedef struct npy_array {
    int ndim;
    int64_t shape[NPY_MAX_DIMS];
    int is_f16;   /* 1: float16 (2 bytes an element)                 */
    int is_bool;  /* 1: NumPy bool '|b1' (1 byte, nonzero = True);
                   * neither: float32                                 */
    int64_t count;
    void *data;
} npy_array;

/* 0 on success; otherwise -1 and a one-line reason in err. */
int npy_read(const char *path, npy_array *out, char *err, size_t errn);
/* The same from an open stream; path names it in messages. */
int npy_read_stream(FILE *f, const char *path, npy_array *out, char *err, size_t errn);
/* Writes a float32 C-order array to f; 0, or -1 (errno says why). Callers
 * that must not leave a partial file write through output.h. */
int npy_write_f32(FILE *f, const float *data, int ndim, const int64_t *shape);
void npy_free(npy_array *a);
/* "[2, 3, 4]": the shape as messages print it (a static buffer per thread). */
const char *npy_shape_text(const npy_array *a);

#endif
