/*
 * simt_emulator.h - just enough of a CUDA block to run cuda.flash's kernel
 * (src/cuda/flash_kernel.cuh) on the CPU, so that its indexing, masking,
 * online softmax, LSE and synchronisation are tested where there is no GPU.
 *
 * A block's 128 threads are coroutines (ucontext) on one OS thread;
 * __syncthreads and the warp-wide operations are barriers at which a
 * coroutine yields until its whole group has arrived. Each scheduling pass
 * runs a random half of the warps (seeded, so a run repeats), so warps
 * drift apart between block barriers as they do on hardware: a missing
 * __syncthreads lets one warp overwrite a tile another is still reading,
 * and the results go wrong. A barrier no thread can pass (divergent
 * __syncthreads) aborts with a message.
 *
 * The warp-wide operations follow the PTX ISA manual, independently of the
 * kernel: __shfl_xor_sync exchanges a value with lane ^ m; mma.sync
 * m16n8k16 (row.col, bf16 or f16 operands, f32 accumulators) gathers the
 * 32 lanes' fragments into the full 16 x 16 A, 16 x 8 B and C matrices by
 * the manual's fragment layouts, computes D = A B + C, and hands each lane
 * its four elements of D:
 *   A element i (i = 0..7, two per register): row g + 8 ((i / 2) % 2),
 *     column 2t + i % 2 + 8 (i / 4)
 *   B element i (i = 0..3): row 2t + i % 2 + 8 (i / 2), column g
 *   C/D element i (i = 0..3): row g + 8 (i / 2), column 2t + i % 2
 * with g = lane / 4 and t = lane % 4. What this cannot check: whether
 * those layouts are right (they are the manual's, transcribed), timing,
 * and memory-model effects beyond what barriers order.
 *
 * Also ldmatrix .x4 (with and without .trans) by the manual's layout, and
 * cp.async, whose copies land either at once or only at the
 * cp.async.wait_group that covers them: the two ends of the window in
 * which the hardware may complete them.
 *
 * Include it instead of the CUDA headers, before flash_kernel.cuh.
 */
#ifndef SDPA_SIMT_EMULATOR_H
#define SDPA_SIMT_EMULATOR_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

extern "C" {
#include "core/half.h"
}

#define FLASH_EMULATED 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __align__(x) __attribute__((aligned(x)))

/* ---- CUDA vector and half types, as far as the kernel uses them */

struct uint4 {
    unsigned x, y, z, w;
};
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w)
{
    return uint4{x, y, z, w};
}
struct __nv_bfloat16 {
    uint16_t bits;
};
struct __half {
    uint16_t bits;
};
struct __nv_bfloat162 {
    uint16_t x, y; /* x in the low half, as on the GPU */
};
struct __half2 {
    uint16_t x, y;
};
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return {sdpa__f32_to_bf16(f)}; }
static inline __half __float2half_rn(float f) { return {sdpa__f32_to_f16(f)}; }
static inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi)
{
    return {sdpa__f32_to_bf16(lo), sdpa__f32_to_bf16(hi)};
}
static inline __half2 __floats2half2_rn(float lo, float hi)
{
    return {sdpa__f32_to_f16(lo), sdpa__f32_to_f16(hi)};
}

/* ---- the block: coroutines and barriers */

#define EMU_THREADS 128
#define EMU_WARPS (EMU_THREADS / 32)
#define EMU_STACK (256 * 1024)

struct emu_dim3 {
    unsigned x, y, z;
};

#define EMU_COPIES 256 /* cp.async copies a thread may have in flight */

struct emu_copy {
    void *dst;
    const void *src;
    int bytes, group;
};

struct emu_thread {
    ucontext_t ctx;
    emu_dim3 idx;
    int lane, warp, done;
    char *stack;
    emu_copy copies[EMU_COPIES];
    int n_copies, group; /* group: committed groups so far */
};

static emu_thread emu_threads[EMU_THREADS];
static emu_thread *emu_cur;
static ucontext_t emu_main;
static emu_dim3 emu_block;
static uint16_t *emu_smem;
static int emu_bar_count[EMU_WARPS + 1], emu_bar_gen[EMU_WARPS + 1];
static long emu_progress;
static uint64_t emu_rng = 0x2545f4914f6cdd1dull; /* emu_seed() sets it */

static void emu_seed(uint64_t seed) { emu_rng = seed ? seed : 1; }

#define threadIdx (emu_cur->idx)
#define blockIdx emu_block
#define FLASH_SHARED_MEMORY(name) uint16_t *name = emu_smem

/* Group `id` (a warp, or EMU_WARPS for the block) of `size` threads. */
static void emu_barrier(int id, int size)
{
    const int gen = emu_bar_gen[id];
    if (++emu_bar_count[id] == size) {
        emu_bar_count[id] = 0;
        emu_bar_gen[id]++;
        emu_progress++;
        return;
    }
    while (emu_bar_gen[id] == gen)
        swapcontext(&emu_cur->ctx, &emu_main);
}

static inline void __syncthreads(void) { emu_barrier(EMU_WARPS, EMU_THREADS); }

static float emu_shfl[EMU_WARPS][32];

static inline float __shfl_xor_sync(unsigned mask, float v, int m)
{
    (void)mask;
    const int w = emu_cur->warp, l = emu_cur->lane;
    emu_shfl[w][l] = v;
    emu_barrier(w, 32);
    const float r = emu_shfl[w][l ^ m];
    emu_barrier(w, 32);
    return r;
}

/* cp.async lands at a random moment of its window, as on hardware: half
 * the copies at once (so a buffer refilled while another warp still reads
 * it gets clobbered), the other half only at the wait that covers their
 * group (so a read before that wait sees the old bytes). src_bytes 0
 * writes zeros. */
static inline void cp_async16(uint16_t *dst, const uint16_t *src, int src_bytes)
{
    emu_thread *t = emu_cur;
    emu_rng ^= emu_rng << 13, emu_rng ^= emu_rng >> 7, emu_rng ^= emu_rng << 17;
    if (emu_rng >> 63) {
        if (src_bytes)
            memcpy(dst, src, 16);
        else
            memset(dst, 0, 16);
        return;
    }
    if (t->n_copies == EMU_COPIES) {
        fprintf(stderr, "simt emulator: more than %d cp.async in flight\n", EMU_COPIES);
        abort();
    }
    t->copies[t->n_copies++] = emu_copy{dst, src, src_bytes, t->group};
}

static inline void cp_async_commit(void) { emu_cur->group++; }

template <int N>
static inline void cp_async_wait(void)
{
    emu_thread *t = emu_cur;
    int kept = 0;
    for (int i = 0; i < t->n_copies; i++) {
        emu_copy *c = &t->copies[i];
        if (c->group < t->group - N) { /* a committed group older than the newest N */
            if (c->bytes)
                memcpy(c->dst, c->src, 16);
            else
                memset(c->dst, 0, 16);
        } else {
            t->copies[kept++] = *c;
        }
    }
    t->n_copies = kept;
}

/* ldmatrix .x4: lane L gives the row address of row L % 8 of matrix L / 8. */
static const uint16_t *emu_rows[EMU_WARPS][32];

template <int TRANS>
static void ldmatrix_x4(uint32_t r[4], const uint16_t *row)
{
    const int w = emu_cur->warp, l = emu_cur->lane;
    emu_rows[w][l] = row;
    emu_barrier(w, 32);
    for (int i = 0; i < 4; i++) {
        const uint16_t *const *m = &emu_rows[w][8 * i];
        uint16_t lo, hi;
        if (TRANS) /* rows 2 (l % 4) and + 1, column l / 4 */
            lo = m[2 * (l % 4)][l / 4], hi = m[2 * (l % 4) + 1][l / 4];
        else /* row l / 4, columns 2 (l % 4) and + 1 */
            lo = m[l / 4][2 * (l % 4)], hi = m[l / 4][2 * (l % 4) + 1];
        r[i] = (uint32_t)lo | (uint32_t)hi << 16;
    }
    emu_barrier(w, 32);
}

struct emu_frag {
    uint32_t a[4], b[2];
    float c[4];
};
static emu_frag emu_frags[EMU_WARPS][32];

static inline float emu_half_value(uint32_t reg, int high, int bf16)
{
    const uint16_t h = (uint16_t)(high ? reg >> 16 : reg & 0xffffu);
    return bf16 ? sdpa__bf16_to_f32(h) : sdpa__f16_to_f32(h);
}

template <int BF16>
static void mma_16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    const int w = emu_cur->warp, l = emu_cur->lane;
    emu_frag *f = emu_frags[w];
    memcpy(f[l].a, a, sizeof f[l].a);
    f[l].b[0] = b0, f[l].b[1] = b1;
    memcpy(f[l].c, c, sizeof f[l].c);
    emu_barrier(w, 32);
    float A[16][16], B[16][8], C[16][8];
    for (int L = 0; L < 32; L++) {
        const int g = L / 4, t = L % 4;
        for (int i = 0; i < 8; i++)
            A[g + 8 * ((i / 2) % 2)][2 * t + i % 2 + 8 * (i / 4)] =
                emu_half_value(f[L].a[i / 2], i % 2, BF16);
        for (int i = 0; i < 4; i++)
            B[2 * t + i % 2 + 8 * (i / 2)][g] = emu_half_value(f[L].b[i / 2], i % 2, BF16);
        for (int i = 0; i < 4; i++)
            C[g + 8 * (i / 2)][2 * t + i % 2] = f[L].c[i];
    }
    const int g = l / 4, t = l % 4;
    for (int i = 0; i < 4; i++) {
        const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
        float d = C[row][col];
        for (int k = 0; k < 16; k++)
            d += A[row][k] * B[k][col];
        c[i] = d;
    }
    emu_barrier(w, 32);
}

/* ---- launching a grid, one block at a time */

static void (*emu_body)(void);

static void emu_entry(void)
{
    emu_body();
    emu_cur->done = 1;
    emu_progress++;
}

/* Runs body() as every thread of every block of the grid, with smem_bytes
 * of shared memory per block. Returns 0, or -1 after printing why. */
static int emu_launch(emu_dim3 grid, size_t smem_bytes, void (*body)(void))
{
    emu_body = body;
    emu_smem = (uint16_t *)aligned_alloc(64, (smem_bytes + 63) / 64 * 64);
    if (!emu_smem)
        return -1;
    int rc = 0;
    for (unsigned z = 0; z < grid.z && rc == 0; z++)
        for (unsigned y = 0; y < grid.y && rc == 0; y++)
            for (unsigned x = 0; x < grid.x && rc == 0; x++) {
                emu_block = emu_dim3{x, y, z};
                memset(emu_smem, 0xEE, smem_bytes); /* garbage, as on a GPU */
                memset(emu_bar_count, 0, sizeof emu_bar_count);
                for (int i = 0; i < EMU_THREADS; i++) {
                    emu_thread *t = &emu_threads[i];
                    if (!t->stack && !(t->stack = (char *)malloc(EMU_STACK))) {
                        rc = -1;
                        break;
                    }
                    t->idx = emu_dim3{(unsigned)i, 0, 0};
                    t->lane = i % 32, t->warp = i / 32, t->done = 0;
                    t->n_copies = 0, t->group = 0;
                    getcontext(&t->ctx);
                    t->ctx.uc_stack.ss_sp = t->stack;
                    t->ctx.uc_stack.ss_size = EMU_STACK;
                    t->ctx.uc_link = &emu_main;
                    makecontext(&t->ctx, emu_entry, 0);
                }
                int left = EMU_THREADS, idle = 0;
                while (left > 0 && rc == 0) {
                    const long before = emu_progress;
                    emu_rng ^= emu_rng << 13, emu_rng ^= emu_rng >> 7, emu_rng ^= emu_rng << 17;
                    const unsigned run = (unsigned)(emu_rng >> 32) | 1u; /* warps this pass */
                    left = 0;
                    for (int i = 0; i < EMU_THREADS; i++) {
                        if (emu_threads[i].done)
                            continue;
                        if ((run >> (i / 32)) & 1u) {
                            emu_cur = &emu_threads[i];
                            swapcontext(&emu_main, &emu_cur->ctx);
                        }
                        left += !emu_threads[i].done;
                    }
                    idle = emu_progress == before ? idle + 1 : 0;
                    if (left > 0 && idle > 64) { /* 2^-64 odds that a live block idles so long */
                        fprintf(stderr, "simt emulator: block (%u,%u,%u): threads wait at a "
                                        "barrier not all of them reach\n",
                                x, y, z);
                        rc = -1;
                    }
                }
            }
    free(emu_smem);
    emu_smem = NULL;
    return rc;
}

#endif
