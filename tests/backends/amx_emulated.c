/*
 * amx_emulated.c - cpu.amx's kernel source compiled over the emulated tile
 * instructions (src/cpu/amx/amx_tiles.h), registered by test_grid as
 * "cpu.amx-emulated", so that every machine with AVX-512 BF16 runs the AMX
 * kernel's packing, tiling and softmax through the test grid.
 */
#define SDPA_AMX_EMULATE 1
#define AMX_BACKEND_SYMBOL sdpa__backend_cpu_amx_emulated
#define AMX_BACKEND_NAME "cpu.amx-emulated"
#include "cpu/amx/flash_amx.c"
