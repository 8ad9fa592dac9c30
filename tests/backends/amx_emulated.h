/* amx_emulated.h - the test build of cpu.amx on emulated tiles (amx_emulated.c). */
#ifndef SDPA_TEST_AMX_EMULATED_H
#define SDPA_TEST_AMX_EMULATED_H

#include "core/backend.h"

/* The descriptor "cpu.amx-emulated", made on first use. */
const sdpa_backend *sdpa__cpu_amx_emulated(void);

/* Threads that hold a tile configuration of the emulated kernel now. */
int sdpa__cpu_amx_emulated_threads_holding_tiles(void);

/* Rows of random scores where the kernel's two-row exponential
 * (exp_rows2) and its one-row one (exp_row) differ in P or the sum, of 16
 * (uniform: random numbers in [-1, 1)); needs AVX-512 BF16. */
int sdpa__cpu_amx_emulated_rows2_mismatches(double (*uniform)(void));
/* How many of 4096 fp32 values (random bits, denormals, zeros, infinities,
 * NaNs and halfway cases among them) the output store's bf16_round rounds
 * otherwise than sdpa__f32_to_bf16. */
int sdpa__cpu_amx_emulated_bf16_round_mismatches(double (*uniform)(void));

#endif
