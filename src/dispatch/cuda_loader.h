/*
 * cuda_loader.h - the core's side of the CUDA plugin (../cuda/plugin.h):
 * finding and loading it once per process, probing the device, and the
 * declared CUDA backends completed with the plugin's kernels.
 */
#ifndef SDPA_CUDA_LOADER_H
#define SDPA_CUDA_LOADER_H

#include "../core/backend.h"

/*
 * Loads the plugin once per process and probes the device into *p (the
 * CUDA fields, or p->cuda_why saying why there is none). The platform
 * probe (../core/platform.c) receives this function; it does not know
 * the plugin.
 */
void sdpa__cuda_probe(sdpa_platform *p);

/*
 * The declared CUDA backends that the loaded plugin implements, as full
 * descriptors (the declared capabilities with a run that calls the
 * plugin). They are present when the plugin found a device. Returns how
 * many (0 without a plugin).
 */
int sdpa__cuda_backends(const sdpa_backend **out, int max);

#endif
