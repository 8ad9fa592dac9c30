/*
 * amx_emulated_backend.c - the descriptor of cpu.amx's kernel on emulated
 * tiles (amx_emulated.c). Built without ISA flags: this code runs before
 * the presence check, on any CPU.
 */
#include "amx_emulated.h"
#include "cpu/cpu_backend.h"

#include <pthread.h>

extern const sdpa_backend sdpa__backend_cpu_amx; /* src/cpu/amx/backend.c */
sdpa_status sdpa__cpu_amx_emulated_run(const sdpa_backend *self, const sdpa_call *call);
sdpa_status sdpa__cpu_amx_emulated_backward(const sdpa_backend *self, const sdpa_call *call);

static sdpa_backend emulated;
static pthread_once_t emulated_once = PTHREAD_ONCE_INIT;

/* cpu.amx's own descriptor (its capabilities stay stated once), with the
 * features the emulation needs (the softmax's AVX-512 BF16, no tiles), no
 * self-test, and out of the fallback chain. */
static void make_emulated(void)
{
    emulated = sdpa__backend_cpu_amx;
    emulated.name = "cpu.amx-emulated";
    emulated.summary = "cpu.amx's kernel on emulated tiles (tests only)";
    emulated.caps.cpu_features = SDPA_CPU_AVX512F | SDPA_CPU_AVX512BF16;
    emulated.fallback_rank = 0;
    emulated.present = sdpa__cpu_backend_present;
    emulated.run = sdpa__cpu_amx_emulated_run;
    emulated.backward = sdpa__cpu_amx_emulated_backward;
    emulated.not_built = NULL;
}

const sdpa_backend *sdpa__cpu_amx_emulated(void)
{
    pthread_once(&emulated_once, make_emulated);
    return &emulated;
}
