/*
 * amx_tiles.h - the five AMX tile operations cpu.amx uses, as macros over
 * either the real instructions or a C emulation of them.
 *
 * Why an emulation: most of our machines have no AMX, and a kernel that
 * only runs where nobody tests it is a kernel that is wrong somewhere.
 * The emulation implements the instructions as the Intel SDM defines them
 * (TILELOADD, TILESTORED, TILEZERO, TDPBF16PS with the VNNI pair layout of
 * the second source) and enforces what the hardware enforces: tiles must be
 * configured on the calling thread, and the shapes of C, A and B must agree
 * (#UD on the hardware, an abort here). The kernel's packing and tiling are
 * therefore checked against the instruction definition, not against
 * themselves: the same kernel source is compiled twice, once with
 * SDPA_AMX_EMULATE for tests/backends (cpu.amx-emulated), once with the
 * instructions for the library (cpu.amx).
 *
 * Cost of the emulation: ~100x slower than fp32 AVX-512; tests only.
 */
#ifndef SDPA_AMX_TILES_H
#define SDPA_AMX_TILES_H

#include <stdint.h>
#include <string.h>

/* Palette 1 tile configuration, the 64-byte TILECFG memory operand. */
typedef struct amx_tilecfg {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((aligned(64))) amx_tilecfg;

_Static_assert(sizeof(amx_tilecfg) == 64, "TILECFG is 64 bytes");

#ifdef SDPA_AMX_EMULATE
#include <stdio.h>
#include <stdlib.h>

typedef struct amx_emu_state {
    int configured;
    uint8_t rows[8];
    uint16_t colsb[8];
    unsigned char t[8][16][64];
} amx_emu_state;

static _Thread_local amx_emu_state amx_emu;

static void amx_emu_fault(const char *what)
{
    fprintf(stderr, "amx emulation: %s (the hardware would raise #UD)\n", what);
    abort();
}

static inline void amx_emu_loadconfig(const amx_tilecfg *cfg)
{
    if (cfg->palette_id != 1)
        amx_emu_fault("palette_id is not 1");
    for (int i = 0; i < 8; i++) {
        if (cfg->rows[i] > 16 || cfg->colsb[i] > 64 || (cfg->colsb[i] & 3))
            amx_emu_fault("tile shape beyond palette 1 (16 rows x 64 bytes)");
        amx_emu.rows[i] = cfg->rows[i];
        amx_emu.colsb[i] = cfg->colsb[i];
    }
    memset(amx_emu.t, 0, sizeof amx_emu.t);
    amx_emu.configured = 1;
}

static inline void amx_emu_need(int tile)
{
    if (!amx_emu.configured)
        amx_emu_fault("tile instruction on a thread without LDTILECFG");
    if (amx_emu.rows[tile] == 0)
        amx_emu_fault("tile instruction on an unconfigured tile");
}

/* TILELOADD: rows x colsb bytes from base with a byte stride; the rest of
 * the register is zeroed. */
static inline void amx_emu_load(int tile, const void *base, int64_t stride)
{
    amx_emu_need(tile);
    memset(amx_emu.t[tile], 0, sizeof amx_emu.t[tile]);
    for (int r = 0; r < amx_emu.rows[tile]; r++)
        memcpy(amx_emu.t[tile][r], (const char *)base + r * stride, amx_emu.colsb[tile]);
}

static inline void amx_emu_store(int tile, void *base, int64_t stride)
{
    amx_emu_need(tile);
    for (int r = 0; r < amx_emu.rows[tile]; r++)
        memcpy((char *)base + r * stride, amx_emu.t[tile][r], amx_emu.colsb[tile]);
}

static inline void amx_emu_zero(int tile)
{
    amx_emu_need(tile);
    memset(amx_emu.t[tile], 0, sizeof amx_emu.t[tile]);
}

static inline float amx_emu_bf16(const unsigned char *p)
{
    uint32_t u = (uint32_t)(p[0] | (p[1] << 8)) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/*
 * TDPBF16PS c, a, b:  for m < rows(a), n < colsb(c)/4, k < colsb(a)/4:
 *   c[m][n] += a.bf16[m][2k] * b.bf16[k][2n] + a.bf16[m][2k+1] * b.bf16[k][2n+1]
 * B is "VNNI" laid out: its row k holds the pairs (2k, 2k+1) of the
 * reduction index for every output column n.
 */
static inline void amx_emu_dpbf16ps(int c, int a, int b)
{
    amx_emu_need(c), amx_emu_need(a), amx_emu_need(b);
    if (amx_emu.rows[c] != amx_emu.rows[a] || amx_emu.colsb[c] != amx_emu.colsb[b] ||
        amx_emu.colsb[a] != 4 * amx_emu.rows[b])
        amx_emu_fault("TDPBF16PS shapes disagree (C rows = A rows, C colsb = B colsb, "
                      "A colsb = 4 B rows)");
    const int M = amx_emu.rows[c], N = amx_emu.colsb[c] / 4, K = amx_emu.colsb[a] / 4;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            float acc;
            memcpy(&acc, &amx_emu.t[c][m][4 * n], 4);
            for (int k = 0; k < K; k++) {
                acc += amx_emu_bf16(&amx_emu.t[a][m][4 * k]) *
                       amx_emu_bf16(&amx_emu.t[b][k][4 * n]);
                acc += amx_emu_bf16(&amx_emu.t[a][m][4 * k + 2]) *
                       amx_emu_bf16(&amx_emu.t[b][k][4 * n + 2]);
            }
            memcpy(&amx_emu.t[c][m][4 * n], &acc, 4);
        }
}

#define TILE_LOADCONFIG(cfg) amx_emu_loadconfig(cfg)
#define TILE_RELEASE() (amx_emu.configured = 0)
#define TILE_ZERO(t) amx_emu_zero(t)
#define TILE_LOAD(t, base, stride) amx_emu_load((t), (base), (stride))
#define TILE_STORE(t, base, stride) amx_emu_store((t), (base), (stride))
#define TILE_DPBF16PS(c, a, b) amx_emu_dpbf16ps((c), (a), (b))

#elif defined(SDPA_AMX_NO_TILES)
/* The tile work compiled out (bench/amx_cost.c): configuration, loads,
 * products and stores do nothing, so what remains is what the kernel
 * spends outside the tiles (packing, softmax, the O rescale, stores, the
 * task loop), timeable on any CPU with AVX-512 BF16. Results are garbage. */
#define TILE_LOADCONFIG(cfg) ((void)(cfg))
#define TILE_RELEASE() ((void)0)
#define TILE_ZERO(t) ((void)0)
#define TILE_LOAD(t, base, stride) ((void)(base), (void)(stride))
#define TILE_STORE(t, base, stride) ((void)(base), (void)(stride))
#define TILE_DPBF16PS(c, a, b) ((void)0)

#else /* the instructions */
#include <immintrin.h>

#define TILE_LOADCONFIG(cfg) _tile_loadconfig(cfg)
#define TILE_RELEASE() _tile_release()
#define TILE_ZERO(t) _tile_zero(t)
#define TILE_LOAD(t, base, stride) _tile_loadd(t, (base), (stride))
#define TILE_STORE(t, base, stride) _tile_stored(t, (base), (stride))
#define TILE_DPBF16PS(c, a, b) _tile_dpbf16ps(c, a, b)
#endif

/* The kernels' 32 x 32 step: C tiles 0-3 (two row halves x two column
 * halves) += A . B, A's row halves (tiles 4, 5) from a0 and a1, B's column
 * halves (tiles 6, 7) from b0 and b1; strides in bytes. */
static inline void amx_step_2x2(const void *a0, const void *a1, int64_t sa, const void *b0,
                                const void *b1, int64_t sb)
{
    TILE_LOAD(4, a0, sa);
    TILE_LOAD(5, a1, sa);
    TILE_LOAD(6, b0, sb);
    TILE_LOAD(7, b1, sb);
    TILE_DPBF16PS(0, 4, 6);
    TILE_DPBF16PS(1, 4, 7);
    TILE_DPBF16PS(2, 5, 6);
    TILE_DPBF16PS(3, 5, 7);
}

/* C tiles 0-3 to the 32 x 32 fp32 block at c, rows ld floats apart. */
static inline void amx_store_2x2(float *c, int64_t ld)
{
    TILE_STORE(0, c, ld * 4);
    TILE_STORE(1, c + 16, ld * 4);
    TILE_STORE(2, c + 16 * ld, ld * 4);
    TILE_STORE(3, c + 16 * ld + 16, ld * 4);
}

/* Configures all 8 tiles as 16 rows x 64 bytes on the calling thread. */
static inline void amx_configure_full_tiles(void)
{
    amx_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int t = 0; t < 8; t++)
        cfg.rows[t] = 16, cfg.colsb[t] = 64;
    TILE_LOADCONFIG(&cfg);
}

#endif
