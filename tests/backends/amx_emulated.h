/* amx_emulated.h - the test build of cpu.amx on emulated tiles (amx_emulated.c). */
#ifndef SDPA_TEST_AMX_EMULATED_H
#define SDPA_TEST_AMX_EMULATED_H

#include "core/backend.h"

/* The descriptor "cpu.amx-emulated", made on first use. */
const sdpa_backend *sdpa__cpu_amx_emulated(void);

/* Threads that hold a tile configuration of the emulated kernel now. */
int sdpa__cpu_amx_emulated_threads_holding_tiles(void);

/* Rows of random scores where the kernel's two-row exponential
 * (exp_rows2) and its one-row one (exp_row) differ in P or the sum, of 8
 * (uniform: random numbers in [-1, 1)); needs AVX-512 BF16. */
int sdpa__cpu_amx_emulated_rows2_mismatches(double (*uniform)(void));

#endif
