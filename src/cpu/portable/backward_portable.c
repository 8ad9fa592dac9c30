/*
 * backward_portable.c - cpu.portable's backward pass: ../flash_backward.h
 * with 8-float vectors in plain C (vec_portable.h), so every CPU has a
 * blockwise backward, not only the float64 reference. Products and softmax
 * in fp32.
 *
 * Micro-kernel 4 x 2: four broadcast rows against two 8-float vectors.
 * Key blocks of 64, query blocks of 64 rows.
 */
#include "vec_portable.h"

#define BWD_MR 4
#define BWD_NV 2
#define BWD_BQ 64
#define BWD_BK 64
#define BWD_NAME "cpu.portable"

#include "../flash_backward.h"

/* The descriptor (flash_portable.c) reaches the kernel through this. */
sdpa_status sdpa__cpu_portable_backward(const sdpa_backend *self, const sdpa_call *call);
sdpa_status sdpa__cpu_portable_backward(const sdpa_backend *self, const sdpa_call *call)
{
    return tiled_backward(self, call);
}
