/*
 * device_memory.h - is a pointer the call's device memory? Shared by the
 * plugin's backends, which all take the tensors and the mask arrays of
 * sdpa.h in device memory: a host pointer handed to a kernel would be an
 * illegal address, a sticky error that ends the process's CUDA context,
 * so it is refused as INVALID_ARGUMENT before any launch.
 */
#ifndef SDPA_CUDA_DEVICE_MEMORY_H
#define SDPA_CUDA_DEVICE_MEMORY_H

#include "plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* OK, or INVALID_ARGUMENT "WHO: NAME is not device memory ..." recorded. */
sdpa_status sdpa_cuda__check_device(const char *who, const char *name, const void *p, int device);

/* The same for each array of c->mask that is given (none: OK). */
sdpa_status sdpa_cuda__check_mask_arrays(const char *who, const sdpa_cuda_call *c, int device);

#ifdef __cplusplus
}
#endif

#endif
