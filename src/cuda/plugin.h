/*
 * plugin.h - the interface between the core and libsdpa_cuda.so.
 *
 * The core never links CUDA. At context creation it looks for the plugin
 * (SDPA_CUDA_PLUGIN=path, else libsdpa_cuda.so beside the core library;
 * never the current directory), dlopens it and calls its one exported
 * function, sdpa_cuda_plugin_entry, which returns this table. The ABI
 * number changes whenever this struct or sdpa_backend changes; a plugin
 * with another number is refused with that reason.
 */
#ifndef SDPA_CUDA_PLUGIN_H
#define SDPA_CUDA_PLUGIN_H

#include "../dispatch/backend.h"

#define SDPA_CUDA_PLUGIN_ABI 3
#define SDPA_CUDA_PLUGIN_ENTRY "sdpa_cuda_plugin_entry"

/* What the core lends the plugin (its own symbols are not exported). */
typedef struct sdpa_cuda_host {
    sdpa_status (*fail)(sdpa_status status, const char *fmt, ...);
} sdpa_cuda_host;

/*
 * A kernel the plugin implements for one of the core's declared CUDA
 * backends: the core keeps the capabilities and checks it declared, and
 * takes the run (and warm-up) functions from here.
 */
typedef struct sdpa_cuda_kernel {
    const char *name; /* "cuda.cudnn"; NULL ends the list */
    const char *version;
    sdpa_status (*run)(const sdpa_backend *self, const sdpa_call *call);
    sdpa_status (*prepare)(const sdpa_backend *self, const sdpa_call *call); /* or NULL */
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

/*
 * Loads the plugin once per process and probes the device into *p.
 * Returns the plugin table or NULL; on NULL, p->cuda_why says why.
 */
const sdpa_cuda_plugin *sdpa__cuda_plugin_load(sdpa_platform *p);

/*
 * The declared CUDA backends that the loaded plugin implements, as full
 * descriptors (the core's capabilities with the plugin's run). They are
 * present when the plugin found a device. Returns how many (0 without a
 * plugin).
 */
int sdpa__cuda_backends(const sdpa_backend **out, int max);

#endif
