/*
 * decode_avx512.h - cpu.avx512's build of the few-query path
 * (../flash_decode.h), for cpu.amx, whose own products are tiles: on at
 * most eight query rows per KV head it takes this path, fp32 products on K
 * and V read in place, instead of packing tiles for one row (on the
 * Sapphire Rapids VM cpu.amx was 1.65-4.27x slower than this path on
 * one-query rows: bench/results/2026-12-02-peers-decode-cpu-bf16-spr.txt).
 * cpu.avx512bf16 builds the path itself, with its pair products.
 * Errors name the backend passed as `self`.
 */
#ifndef SDPA_DECODE_AVX512_H
#define SDPA_DECODE_AVX512_H

#include "../../core/backend.h"

/* Whether the call has few enough query rows per KV head. */
int sdpa__cpu_avx512_decode_applies(const sdpa_call *call);
sdpa_status sdpa__cpu_avx512_decode_run(const sdpa_backend *self, const sdpa_call *call);

#endif
