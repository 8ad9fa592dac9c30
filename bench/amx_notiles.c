/*
 * amx_notiles.c - cpu.amx's kernel source with its tile work compiled out
 * (SDPA_AMX_NO_TILES in src/cpu/amx/amx_tiles.h): what bench/amx_cost.c
 * times on any CPU with AVX-512 BF16. Built with the kernel's own flags,
 * without the tile ones.
 */
#define SDPA_AMX_NO_TILES 1
#define AMX_RUN_SYMBOL sdpa__cpu_amx_notiles_run
#define AMX_HELD_SYMBOL sdpa__cpu_amx_notiles_holding_tiles
#include "cpu/amx/flash_amx.c"
