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
#define AMX_BACKWARD_SYMBOL sdpa__cpu_amx_emulated_backward
#include "cpu/amx/flash_amx.c"

#include "amx_emulated.h"

#include <string.h>

/*
 * exp_rows2 against exp_row: per row the same operations in another order
 * (two rows a loop, a step apart; sums by FMA, e 1 + s, which rounds as
 * e + s does), so P and the sums must agree bit for bit. The grid sees a
 * P wrong on a few keys of a long block only against the float64
 * reference (a mutant that gave the last 16 or 32 keys of each such block
 * stale fractions failed 18-41 of its checks), which the quick,
 * ThreadSanitizer run leaves out; this runs in every build and names the
 * function.
 */
int sdpa__cpu_amx_emulated_rows2_mismatches(double (*uniform)(void))
{
    enum { KEYS = 256, PS = KEYS + 32 }; /* P's rows further apart than S's, as in the kernel */
    static const int nvs[] = {2, 4, 6, 16}; /* one step, two, three, a long block */
    float s[2 * KEYS] __attribute__((aligned(64)));
    uint16_t p_rows2[KEYS + PS] __attribute__((aligned(64)));
    uint16_t p_row[2 * KEYS] __attribute__((aligned(64)));
    float sum_rows2[2][16], sum_row[2][16];
    int bad = 0;
    for (size_t t = 0; t < sizeof nvs / sizeof *nvs; t++) {
        const int nv = nvs[t];
        const float c = 0.18f * LOG2E * (float)(1.5 + uniform());
        const float m0 = (float)(4 * uniform()), m1 = (float)(40 * uniform());
        for (int i = 0; i < 2 * KEYS; i++) /* c s - m from about -40 up to P_LIMIT's 2^8 */
            s[i] = ((float)(24 * uniform()) - 16 + (i < KEYS ? m0 : m1)) / c;
        /* every lane, and a limit short of the last two vectors (the
         * masked copy, first_rows2's short blocks: 1-31 lanes cut) */
        const int limits[2] = {16 * nv, 16 * nv - 1 - (int)(31 * uniform())};
        for (int li = 0; li < 2; li++) {
            const int limit = limits[li];
            __m512 a, b;
            exp_rows2(s, p_rows2, KEYS, PS, nv, limit, c, m0, m1, &a, &b);
            _mm512_storeu_ps(sum_rows2[0], a);
            _mm512_storeu_ps(sum_rows2[1], b);
            _mm512_storeu_ps(sum_row[0], exp_row(s, p_row, nv, limit, c, m0, 0));
            _mm512_storeu_ps(sum_row[1], exp_row(s + KEYS, p_row + KEYS, nv, limit, c, m1, 0));
            for (int r = 0; r < 2; r++)
                bad += memcmp(p_rows2 + r * PS, p_row + r * KEYS, 32u * (unsigned)nv) != 0 ||
                       memcmp(sum_rows2[r], sum_row[r], sizeof sum_row[r]) != 0;
        }
    }
    return bad;
}

int sdpa__cpu_amx_emulated_bf16_round_mismatches(double (*uniform)(void))
{
    enum { N = 4096 };
    static const uint32_t special[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu,
                                       0x007f8000u, 0x00008000u, 0x7f800000u, 0xff800000u,
                                       0x7fc00000u, 0xffbfffffu, 0x7f800001u, 0x3f808000u,
                                       0x3f818000u, 0x7f7fffffu, 0x00800000u, 0x3f7fffffu};
    float x[N] __attribute__((aligned(64)));
    uint16_t got[N];
    int bad = 0;
    for (int i = 0; i < N; i++) {
        uint32_t u = (uint32_t)((uniform() + 1.0) * 2147483648.0); /* uniform: [-1, 1) */
        if (i % 8 == 1) /* a denormal in most vectors: the integer way */
            u &= 0x807fffffu;
        else if (i % 64 == 2) /* a vector or so without one: VCVTNEPS2BF16 */
            u = u & 0xbfffffffu;
        if (i < (int)(sizeof special / sizeof *special))
            u = special[i];
        memcpy(&x[i], &u, sizeof u);
    }
    /* every vector of 16 once as it is, and once with its denormals made
     * normal (so that the one-instruction path sees halfway cases too) */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; pass && i < N; i++) {
            uint32_t u;
            memcpy(&u, &x[i], sizeof u);
            if ((u & 0x7f800000u) == 0 && (u & 0x007fffffu))
                u |= 0x00800000u;
            memcpy(&x[i], &u, sizeof u);
        }
        for (int i = 0; i < N; i += 16)
            _mm256_storeu_si256((__m256i *)(got + i), bf16_round(_mm512_load_ps(x + i)));
        for (int i = 0; i < N; i++)
            bad += got[i] != sdpa__f32_to_bf16(x[i]);
    }
    return bad;
}
