/*
 * plugin.c - libsdpa_cuda.so: the CUDA side of libsdpa, loaded at run time
 * (see plugin.h). It probes the device and the libraries and provides
 * cuda.cudnn (cudnn_run.c) and cuda.unfused (unfused.cu); cuda.flash is not
 * in it yet, so the dispatcher keeps reporting it as not present.
 *
 * Everything here runs without a GPU: with only the toolkit's stub driver,
 * cudaGetDeviceCount fails (35, insufficient driver) and the probe says so.
 */
#include "plugin.h"

#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <stdio.h>

extern const sdpa_cuda_host *sdpa_cuda__host;

static int probe(sdpa_platform *p, char *why, size_t n)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        snprintf(why, n, "cudaGetDeviceCount returned %d: %s", (int)e, cudaGetErrorString(e));
        return 0;
    }
    if (count == 0) {
        snprintf(why, n, "the CUDA driver reports no device");
        return 0;
    }
    struct cudaDeviceProp prop;
    if ((e = cudaGetDeviceProperties(&prop, 0)) != cudaSuccess) {
        snprintf(why, n, "cudaGetDeviceProperties: %s (%d)", cudaGetErrorString(e), (int)e);
        return 0;
    }
    snprintf(p->gpu_name, sizeof p->gpu_name, "%.63s", prop.name);
    p->cc_major = prop.major, p->cc_minor = prop.minor;
    p->sm_count = prop.multiProcessorCount;
    p->memory_bytes = (int64_t)prop.totalGlobalMem;
    cudaDriverGetVersion(&p->driver_version);
    cudaRuntimeGetVersion(&p->runtime_version);
    p->cudnn_version = (int)cudnnGetVersion();
    return 1;
}

const sdpa_cuda_host *sdpa_cuda__host;

static void init(const sdpa_cuda_host *host) { sdpa_cuda__host = host; }

sdpa_status sdpa_cuda__cudnn_run(const sdpa_cuda_call *c);
sdpa_status sdpa_cuda__cudnn_prepare(const sdpa_cuda_call *c);
sdpa_status sdpa_cuda__unfused_run(const sdpa_cuda_call *c);
sdpa_status sdpa_cuda__flash_run(const sdpa_cuda_call *c);

static const sdpa_cuda_kernel kernels[] = {
    {"cuda.cudnn", "cudnn-graph", sdpa_cuda__cudnn_run, sdpa_cuda__cudnn_prepare},
#ifdef SDPA_HAVE_CUDA_KERNELS
    {"cuda.flash", "fa2-mma-v1", sdpa_cuda__flash_run, NULL},
    {"cuda.unfused", "cublas", sdpa_cuda__unfused_run, NULL},
#endif
    {NULL, NULL, NULL, NULL},
};

static const sdpa_cuda_plugin table = {
    .abi = SDPA_CUDA_PLUGIN_ABI,
    .version = SDPA_VERSION_STRING,
    .init = init,
    .probe = probe,
    .kernels = kernels,
};

__attribute__((visibility("default"))) const sdpa_cuda_plugin *sdpa_cuda_plugin_entry(void);

const sdpa_cuda_plugin *sdpa_cuda_plugin_entry(void) { return &table; }
