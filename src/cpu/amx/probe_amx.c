/*
 * probe_amx.c - the AMX-BF16 ceiling: TDPBF16PS into 4 independent
 * accumulator tiles from 2 A and 2 B tiles loaded once (registers only),
 * so the loop measures the tile unit and nothing else. Each instruction is
 * 16 x 16 x 32 multiply-adds. Returns the FLOPs done. The caller must have
 * AMX usable (permission granted) on this thread's process.
 */
#include "amx_tiles.h"

double sdpa__probe_amx_bf16(int64_t iters);

double sdpa__probe_amx_bf16(int64_t iters)
{
    static const uint16_t one[16 * 32] __attribute__((aligned(64))) = {0};
    float sink[16 * 16] __attribute__((aligned(64)));
    amx_configure_full_tiles();
    TILE_ZERO(0);
    TILE_ZERO(1);
    TILE_ZERO(2);
    TILE_ZERO(3);
    TILE_LOAD(4, one, 64);
    TILE_LOAD(5, one, 64);
    TILE_LOAD(6, one, 64);
    TILE_LOAD(7, one, 64);
    for (int64_t n = 0; n < iters; n++) {
        TILE_DPBF16PS(0, 4, 6);
        TILE_DPBF16PS(1, 4, 7);
        TILE_DPBF16PS(2, 5, 6);
        TILE_DPBF16PS(3, 5, 7);
    }
    TILE_STORE(0, sink, 64);
    TILE_RELEASE();
    volatile float keep = sink[0];
    (void)keep;
    return (double)iters * 4 * 16 * 16 * 32 * 2;
}
