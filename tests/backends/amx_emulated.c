/*
 * amx_emulated.c - cpu.amx's kernel source compiled over the emulated tile
 * instructions (src/cpu/amx/amx_tiles.h) with the softmax's AVX-512 flags;
 * amx_emulated_backend.c (built without them) registers it as
 * "cpu.amx-emulated", so that every machine with AVX-512 BF16 runs the AMX
 * kernel's packing, tiling and softmax through the test grid.
 */
#define SDPA_AMX_EMULATE 1
#define AMX_RUN_SYMBOL sdpa__cpu_amx_emulated_run
#define AMX_HELD_SYMBOL sdpa__cpu_amx_emulated_threads_holding_tiles
#include "cpu/amx/flash_amx.c"
