/*
 * plugin.h - the ABI between the core and libsdpa_cuda.so: this header and
 * the public sdpa.h are all the plugin sees of libsdpa.
 *
 * The core never links CUDA. It looks for the plugin (SDPA_CUDA_PLUGIN=path,
 * else libsdpa_cuda.so beside the core library; never the current
 * directory), dlopens it and calls its one exported function,
 * sdpa_cuda_plugin_entry, which returns the table below. The structs here
 * are the whole contract, kept small on purpose: the core's internal
 * layouts (backends, validated calls) can change without touching a
 * plugin. SDPA_CUDA_PLUGIN_ABI changes whenever anything here does; a
 * plugin built with another number is refused with that reason.
 */
#ifndef SDPA_CUDA_PLUGIN_H
#define SDPA_CUDA_PLUGIN_H

#include "sdpa.h"

#define SDPA_CUDA_PLUGIN_ABI 6
#define SDPA_CUDA_PLUGIN_ENTRY "sdpa_cuda_plugin_entry"

/* What the core lends the plugin (its own symbols are not exported):
 * fail records this thread's last error, as sdpa_last_error() reports it. */
typedef struct sdpa_cuda_host {
    sdpa_status (*fail)(sdpa_status status, const char *fmt, ...);
} sdpa_cuda_host;

/* One validated call, as the core hands it to a plugin kernel: every
 * argument already checked (sizes, strides, dtypes, devices, overlap). */
typedef struct sdpa_cuda_call {
    const sdpa_tensor *q, *k, *v;
    sdpa_tensor *out;
    float *lse;          /* [B, Hq, Sq] on the device, or NULL */
    double scale;        /* resolved: never 0                  */
    sdpa_causal causal;
    int deterministic;
    void *stream;        /* cudaStream_t                       */
    sdpa_call_desc desc; /* the sizes in one place; desc.mask the kinds */
    const sdpa_mask *mask; /* sdpa.h's masks, arrays in device memory, or
                            * NULL; only kinds the backend declares */
    int flash_variant;   /* cuda.flash's kernel, from SDPA_CUDA_FLASH_VARIANT as
                          * the core read it at context creation: 0 or 1 */
} sdpa_cuda_call;

/*
 * A kernel the plugin implements for one of the CUDA backends the core
 * declares (src/dispatch/cuda_declared.c): the core keeps their capabilities and
 * checks, and takes only run (and warm-up) from here. UNSUPPORTED from
 * run means "this exact call, after all" and latches the backend off for
 * the calling layer; OUT_OF_MEMORY and DEVICE_ERROR reach the caller.
 */
typedef struct sdpa_cuda_kernel {
    const char *name; /* "cuda.cudnn"; NULL ends the list */
    const char *version;
    sdpa_status (*run)(const sdpa_cuda_call *call);
    sdpa_status (*prepare)(const sdpa_cuda_call *call); /* or NULL */
} sdpa_cuda_kernel;

typedef struct sdpa_cuda_plugin {
    int abi;             /* SDPA_CUDA_PLUGIN_ABI */
    const char *version; /* the plugin's libsdpa version */
    void (*init)(const sdpa_cuda_host *host);
    /*
     * Describes CUDA device 0 in p (name, compute capability, SMs, memory,
     * driver/runtime/cuDNN versions) and returns 1; or returns 0 with why
     * no device can be used ("cudaGetDeviceCount returned 35: ...").
     */
    int (*probe)(sdpa_platform *p, char *why, size_t n);
    const sdpa_cuda_kernel *kernels;
} sdpa_cuda_plugin;

typedef const sdpa_cuda_plugin *(*sdpa_cuda_plugin_entry_fn)(void);

#endif
