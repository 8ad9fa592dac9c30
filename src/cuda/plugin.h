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

#define SDPA_CUDA_PLUGIN_ABI 1
#define SDPA_CUDA_PLUGIN_ENTRY "sdpa_cuda_plugin_entry"

typedef struct sdpa_cuda_plugin {
    int abi;             /* SDPA_CUDA_PLUGIN_ABI */
    const char *version; /* the plugin's libsdpa version */
    /*
     * Describes CUDA device 0 in p (name, compute capability, SMs, memory,
     * driver/runtime/cuDNN versions) and returns 1; or returns 0 with why
     * no device can be used ("cudaGetDeviceCount: ... (35)").
     */
    int (*probe)(sdpa_platform *p, char *why, size_t n);
    /* Implemented backends, NULL-terminated; names match the core's table. */
    const sdpa_backend *const *backends;
} sdpa_cuda_plugin;

typedef const sdpa_cuda_plugin *(*sdpa_cuda_plugin_entry_fn)(void);

/*
 * Loads the plugin once per process and probes the device into *p.
 * Returns the plugin table or NULL; on NULL, p->cuda_why says why.
 */
const sdpa_cuda_plugin *sdpa__cuda_plugin_load(sdpa_platform *p);

#endif
