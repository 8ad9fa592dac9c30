/* device_staging.c - see device_staging.h. */
#define _GNU_SOURCE /* dlfcn */
#include "device_staging.h"

#include <dlfcn.h>
#include <mpi.h>
#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h> /* MPIX_CUDA_AWARE_SUPPORT, MPIX_Query_cuda_support */
#endif
#include <pthread.h>
#include <stdio.h>

/* The few runtime entry points used, as the CUDA runtime declares them
 * (cudaError_t is an int enum; cudaMemcpyKind 1 = host to device, 2 =
 * device to host). */
static int (*rt_memcpy2d)(void *, size_t, const void *, size_t, size_t, size_t, int);
static int (*rt_malloc)(void **, size_t);
static int (*rt_free)(void *);
static const char *(*rt_error_string)(int);
static pthread_once_t once = PTHREAD_ONCE_INIT;
static char load_error[200];

static void load(void)
{
    static const char *const names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
    void *h = NULL;
    for (size_t i = 0; i < sizeof names / sizeof *names && !h; i++)
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(load_error, sizeof load_error, "no CUDA runtime (libcudart) to stage device "
                 "tensors: %.120s", dlerror());
        return;
    }
    *(void **)&rt_memcpy2d = dlsym(h, "cudaMemcpy2D");
    *(void **)&rt_malloc = dlsym(h, "cudaMalloc");
    *(void **)&rt_free = dlsym(h, "cudaFree");
    *(void **)&rt_error_string = dlsym(h, "cudaGetErrorString");
    if (!rt_memcpy2d || !rt_malloc || !rt_free || !rt_error_string) {
        snprintf(load_error, sizeof load_error, "libcudart lacks cudaMemcpy2D, cudaMalloc, "
                 "cudaFree or cudaGetErrorString");
        rt_memcpy2d = NULL;
    }
}

sdpa_status sp_cuda_load(char *why, size_t n)
{
    pthread_once(&once, load);
    if (rt_memcpy2d)
        return SDPA_OK;
    snprintf(why, n, "%s", load_error);
    return SDPA_NOT_AVAILABLE;
}

sdpa_status sp_cuda_copy(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t height, int to_device, char *why, size_t n)
{
    if (height == 0 || width == 0)
        return SDPA_OK;
    const int e = rt_memcpy2d(dst, dpitch, src, spitch, width, height, to_device ? 1 : 2);
    if (e == 0)
        return SDPA_OK;
    snprintf(why, n, "cudaMemcpy2D (%s) returned %d: %s", to_device ? "to the device" : "to the host",
             e, rt_error_string(e));
    return SDPA_DEVICE_ERROR;
}

sdpa_status sp_cuda_alloc(void **p, size_t bytes, char *why, size_t n)
{
    *p = NULL;
    const int e = rt_malloc(p, bytes ? bytes : 1);
    if (e == 0)
        return SDPA_OK;
    *p = NULL;
    snprintf(why, n, "cudaMalloc of %zu bytes returned %d: %s", bytes, e, rt_error_string(e));
    return e == 2 ? SDPA_OUT_OF_MEMORY : SDPA_DEVICE_ERROR; /* 2: cudaErrorMemoryAllocation */
}

void sp_cuda_free(void *p)
{
    if (p && rt_free)
        rt_free(p);
}

int sp_mpi_cuda_aware(void)
{
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
    return MPIX_Query_cuda_support() == 1;
#else
    return 0;
#endif
}
