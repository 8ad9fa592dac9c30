/*
 * device_staging.h - what libsdpa_mpi needs of the CUDA runtime to take
 * device tensors: copies between host and device and device buffers,
 * through libcudart opened on first use (dlopen), so libsdpa_mpi neither
 * links nor requires CUDA and builds the same everywhere.
 *
 * Device tensors are staged through host memory: the local rows are copied
 * to the host, the all-to-alls and the ring move host buffers, every block's
 * attention runs on the device (the context's CUDA backends: q, k and v of
 * the block copied in, its output and LSE copied out and merged on the
 * host), and the result is copied back. A CUDA-aware MPI
 * (MPIX_Query_cuda_support) could take device buffers directly; the packing
 * here is host code, so this release stages either way and says so.
 * Written and compiled, not yet run on a GPU.
 */
#ifndef SDPA_MPI_DEVICE_STAGING_H
#define SDPA_MPI_DEVICE_STAGING_H

#include "sdpa.h"

#include <stddef.h>

/* Opens the runtime once; SDPA_OK, or NOT_AVAILABLE with why. */
sdpa_status sp_cuda_load(char *why, size_t n);

/* height rows of width bytes, each pitch apart on its side; to_device 1:
 * host to device, 0: device to host. SDPA_OK or DEVICE_ERROR with why. */
sdpa_status sp_cuda_copy(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t height, int to_device, char *why, size_t n);

sdpa_status sp_cuda_alloc(void **p, size_t bytes, char *why, size_t n);
void sp_cuda_free(void *p);

/* 1 when the MPI library says it takes CUDA device buffers, else 0. */
int sp_mpi_cuda_aware(void);

#endif
