/* device_memory.c - see device_memory.h. */
#include "device_memory.h"

#include <cuda_runtime_api.h>

extern const sdpa_cuda_host *sdpa_cuda__host;

sdpa_status sdpa_cuda__check_device(const char *who, const char *name, const void *p, int device)
{
    struct cudaPointerAttributes at;
    cudaError_t e = cudaPointerGetAttributes(&at, p);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* clear it: not a sticky error */
        return sdpa_cuda__host->fail(SDPA_INVALID_ARGUMENT, "%s: %s: %s", who, name,
                                     cudaGetErrorString(e));
    }
    if (at.type != cudaMemoryTypeDevice && at.type != cudaMemoryTypeManaged)
        return sdpa_cuda__host->fail(SDPA_INVALID_ARGUMENT,
                                     "%s: %s is not device memory (a host pointer?), expected "
                                     "memory on device %d beside the tensors",
                                     who, name, device);
    if (at.device != device)
        return sdpa_cuda__host->fail(SDPA_INVALID_ARGUMENT,
                                     "%s: %s is on device %d, the call is on device %d", who, name,
                                     at.device, device);
    return SDPA_OK;
}

sdpa_status sdpa_cuda__check_mask_arrays(const char *who, const sdpa_cuda_call *c, int device)
{
    if (!c->mask)
        return SDPA_OK;
    const void *arrays[3] = {c->mask->seq_len_q, c->mask->seq_len_kv, c->mask->key};
    static const char *names[3] = {"mask->seq_len_q", "mask->seq_len_kv", "mask->key"};
    for (int i = 0; i < 3; i++) {
        sdpa_status s = arrays[i] ? sdpa_cuda__check_device(who, names[i], arrays[i], device)
                                  : SDPA_OK;
        if (s != SDPA_OK)
            return s;
    }
    return SDPA_OK;
}
