/*
 * flash_amx.c - cpu.amx: flash attention with both products on AMX tiles
 * (TDPBF16PS: bf16 operands, fp32 sums) and the online softmax in fp32
 * AVX-512. bf16 inputs are used as they are, f16 inputs are rounded to
 * bf16 while packed; f32 inputs are not taken (a silent loss of 16
 * mantissa bits: cpu.avx512 serves them).
 *
 * One query block of BQ = 32 rows against one key block of kb keys:
 *
 *     S [32][kb]  = Q [32][Dp] . K^T       tiles: C 2 x 2, A = Q rows, B = K
 *     P = 2^(c S - m)  fp32, rounded to bf16 (AVX-512, one pass per row)
 *     O [32][Dv] += P [32][kb] . V         tiles: C = O, A = P rows, B = V
 *
 * c = |scale| log2(e): the scale is folded into the exponent (q is negated
 * when the scale is negative, so that c >= 0 and a max stays a max), and m,
 * the running max, is kept in log2 units. Dp is D rounded up to 32 (a
 * product's reduction runs 32 at a time), Dv up to 16 (its output columns
 * come 16 to a tile: D = 72 computes 80 columns of O, not 96); pad
 * columns of Q and K are zero and add nothing to S, pad keys of a block
 * (its key count rounded up to 32) are masked to P = 0 exactly.
 *
 * Packing. K and V of one (batch, KV head) are packed once per call, by
 * every thread in a phase of their own before the products, into the B
 * tile layouts (VNNI pairs): K as [keys/16][Dp/32] tiles whose row r holds
 * the pairs (d = 2r, 2r+1) of 16 keys, built by a 16 x 16 transpose of
 * 32-bit words; V as [keys/32][Dv/16] tiles whose row r holds, for 16 head
 * dims, the pair (key 2r, 2r+1), built by one 16-bit interleave (VPERMT2W)
 * per row. Every query block and every grouped-query head that reads that
 * KV head then loads its tiles as they are. Packed K and V take as many
 * bytes as the inputs (bf16); the call packs groups of KV heads of at most
 * PACK_BUDGET bytes at a time (so a 500K-token video does not double its
 * K and V in memory), a barrier between packing and products per group.
 *
 * The softmax, per row of S while it is in registers: the row max (vector
 * max, no horizontal step unless it moved), P = 2^(c s - m) by one FMA,
 * VREDUCEPS (the fraction), a degree-3 polynomial and VSCALEFPS (6
 * operations per 16 scores; -inf gives exactly 0, NaN stays NaN), the sum
 * in a vector per row, VCVTNE2PS2BF16 to bf16 and one store of 32 P
 * values. The max moves lazily: m is raised only when a score exceeds it
 * by more than 2^TAU, so P may reach 2^TAU (exact in bf16 terms: its
 * relative rounding is the same) and O and l are rescaled only then,
 * almost never after the first key block of a row. So past that block a
 * row's P is computed against the m it has, with no pass for the max, and
 * the sums tell whether some P passed 2^TAU (then the row is redone with
 * its max: softmax_row). Costs, the tiles'
 * budget and how they were measured: README "cpu.amx" and bench/amx_cost.c.
 *
 * Few queries: 2-16 rows per KV head in bf16 without a mask (grouped-query
 * decode steps, a few tokens) on tiles with K read in place, S^T = K Q^T
 * (decode_amx.h); otherwise at most eight rows per KV head (one token per
 * head, masks, f16) go to cpu.avx512's few-query path
 * (avx512/decode_avx512.h), fp32 products on K and V read in place:
 * packing tiles for one row costs more than the products.
 *
 * Windows and block maps (sdpa.h): the long path, a row space per head (a
 * query block then lies in one map row). A task visits only the key
 * blocks its map rows list (the others are passed over without a lookup),
 * consecutive ones that all its map rows list joined up to 512 keys
 * (key_block_keys); a (query block, key block) pair that the window, the
 * map or a partial block's bits hide entirely is skipped, and so is each
 * 32-key group of a pair that the bits hide from all its rows (neither its
 * scores nor its P V product; its scores are -inf'd unread); a FULL block
 * runs as a dense one, the others get -inf on their hidden scores before
 * the softmax (a masked store per 16 scores). Costs against the fp32
 * sparse path: tasks split rows as on dense calls, not by listed blocks,
 * and K and V are packed whole, listed or not.
 *
 * Pipeline: a task's blocks run in sequence, and the scores of each are
 * computed during the softmax of the one before (into the second of two
 * score buffers; the short path keeps two query blocks for it): see
 * scores_step.
 *
 * Accuracy against ref: P is rounded to bf16 (relative 2^-9) before the
 * second product, and f16 inputs are rounded to bf16 (2^-9 relative per
 * element); the polynomial's own relative error is 7.5e-5.
 *
 * Threads: packing tasks are (up to 8 KV heads, 128 keys); product tasks are
 * (batch, head, group of query blocks) as in flash_tasks.h, grouped-query
 * heads of short calls sharing one row space. Each thread configures its
 * tiles once (palette 1, all eight 16 x 64 bytes) at its first task and
 * keeps them while it works; a pool worker releases them when it goes idle
 * (sdpa__thread_on_idle), the calling thread at the end of the call.
 *
 * This file is compiled three ways: with the instructions for the library
 * (AMX_RUN_SYMBOL = sdpa__cpu_amx_run, reached from backend.c), with
 * SDPA_AMX_EMULATE for the tests (tests/backends/amx_emulated.c), and with
 * SDPA_AMX_NO_TILES, the tile work compiled out, to time everything else
 * on any AVX-512 CPU (bench/amx_cost.c).
 */
#include "amx_tiles.h"

#include "../../core/convert.h"
#include "../../core/backend.h"
#include "../../core/sparse.h"
#include "../flash_tasks.h"
#include "../avx512/decode_avx512.h"
#include "../avx512/vec_avx512.h"

#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#ifndef AMX_RUN_SYMBOL
#define AMX_RUN_SYMBOL sdpa__cpu_amx_run
#define AMX_HELD_SYMBOL sdpa__cpu_amx_threads_holding_tiles
#endif

#define BQ 32           /* query rows per block: two A tiles of 16 rows      */
/*
 * Block sizes, measured on real tiles (an Emerald Rapids Xeon, 2 cores:
 * bench/results/2026-12-05-amx-blocks-ab-emr.txt, long rows 0.76-0.90x the
 * time of 256-key blocks, 4 query blocks a task and S rows kb apart). The
 * tile unit charges for what surrounds its products (bench_amx_tiles, one
 * core, bench/results/2026-12-05-amx-tiles-emr.txt): P V over 512 keys at
 * D = 128 took 1.60x the register-only time per product with O's C tiles
 * loaded and stored around it, 1.27x without, so 512-key blocks halve the
 * O traffic of 256; tiles streamed from beyond L2 took 6.2x, and a task's
 * key block comes from L3 for its first query block and from L2 for the
 * others, 16 of them now; S's rows 2 KB apart put a C tile's 16 stored
 * rows in two cache sets (padding them 64 bytes: 2-4% on one thread).
 */
#define BK_LONG 512     /* keys per block past the short path                 */
#define QB_LONG 16      /* query blocks a task keeps resident, at most        */
#define S_PAD 16        /* floats between S's rows beyond kb                  */
#define SHORT_KEYS 512  /* up to here one block holds every key: one softmax  */
#define PACK_KEYS 128   /* keys per packing task                              */
#define PACK_SLOTS 8    /* and KV heads (slots of the group), at most         */
#define PACK_BUDGET ((size_t)12 << 20) /* packed K and V held at once        */
#define LOG2E 1.44269504088896341f
#define TAU 8.0f        /* the lazy max: P may reach 2^TAU                    */
#define P_LIMIT 256.0f  /* 2^TAU                                              */

typedef struct amx_qblock {
    uint16_t *q; /* [BQ][Dp] bf16: A tiles of the first product        */
    float *o;    /* [BQ][Dv] fp32: C tiles of the second                */
    float *m;    /* [BQ] running max, log2 units of scaled scores       */
    float *l;    /* [BQ][16] the softmax denominator, one vector a row  */
    int o_live;  /* o holds sums; else the next product starts at zero  */
} amx_qblock;

typedef struct amx_workspace {
    amx_qblock *qb;  /* [resident query blocks]                         */
    float *s[2];     /* [BQ][kb] scores: this block's, the next block's */
    uint16_t *p;     /* [BQ][kb] bf16 P: A tiles of the second product  */
    uint16_t *stage; /* [32][Dp] rows converted to bf16 (f16, strided)  */
    uint8_t *listed; /* [2][key blocks] how many of the task's map rows
                      * list each of the map's key blocks, and as FULL */
} amx_workspace;

/* One (batch, KV head), packed. */
typedef struct amx_slot {
    uint16_t *k;   /* [kp/16][Dp/32] B tiles of the first product         */
    uint16_t *v;   /* [kp/32][Dv/16] B tiles of the second                */
    int64_t nk;    /* keys packed: those below len_kv (under a key mask,
                    * only the visible ones, in order)                    */
    int64_t *kidx; /* key numbers of the packed keys under a key mask, else NULL */
} amx_slot;

typedef struct amx_job {
    const sdpa_call *c;
    int64_t Dp;              /* D rounded up to 32: Q and K (reduction)     */
    int64_t Dv;              /* D rounded up to 16: V and O (output columns) */
    int64_t kb;              /* keys per block, at most (a multiple of 32)  */
    int64_t ss, ps;          /* row strides of S (floats) and P (bf16)      */
    int64_t kp;              /* keys of room per slot: Skv rounded up to 32 */
    int is_short;            /* one block holds every key                   */
    int sparse;              /* a window or a block map (sdpa.h)            */
    int map_blocks;          /* key blocks are the map's: tasks visit only
                              * the listed ones (workspace.listed)          */
    flash_split split;
    amx_workspace *ws;       /* [threads]                                   */
    amx_slot *slots;         /* the packing group's                         */
    int64_t bh0, nslots;     /* the group: KV rows b * Hkv + hk from bh0    */
    int64_t spaces_per_slot; /* row spaces reading one KV head              */
    float c_log2;            /* |scale| log2(e)                             */
    uint16_t qsign;          /* 0x8000 when scale < 0: q is negated         */
} amx_job;

/* ---- the tile configuration, kept per thread while it works */

static _Thread_local int amx_tiles_held;  /* this thread's tiles are configured */
static _Thread_local int amx_tiles_owned; /* and registered to go when idle */
static _Atomic int amx_holders;           /* threads with tiles configured, for the tests */

static void amx_tiles_drop(void)
{
    if (amx_tiles_held) {
        TILE_RELEASE();
        amx_tiles_held = 0;
        amx_holders--;
    }
    amx_tiles_owned = 0;
}

static inline void amx_tiles_take(void)
{
    if (amx_tiles_held)
        return;
    amx_configure_full_tiles();
    amx_tiles_held = 1;
    amx_holders++;
    amx_tiles_owned = sdpa__thread_on_idle(amx_tiles_drop);
}

/* How many threads hold a tile configuration now (tests: none once the
 * pool's workers went idle). */
int AMX_HELD_SYMBOL(void);
int AMX_HELD_SYMBOL(void) { return amx_holders; }

/* ---- rows as bf16 */

/* 32 bf16 from p, of which the first n are read (n < 32: the rest zero;
 * a masked load reads nothing past them). */
static inline __m512i load32(const uint16_t *p, int64_t n)
{
    const __mmask32 m = n >= 32 ? ~(__mmask32)0 : (((__mmask32)1 << n) - 1);
    return _mm512_maskz_loadu_epi16(m, p);
}

/* A row of D elements (dtype t, element stride st) as contiguous bf16:
 * the row itself when it is one, else converted into `stage` (f16 by
 * VCVTPH2PS and VCVTNE2PS2BF16, both exact or round to nearest even). */
static const uint16_t *row_bf16(const void *src, sdpa_dtype t, int64_t st, int64_t D,
                                uint16_t *stage)
{
    if (t == SDPA_BF16 && st == 1)
        return src;
    if (t == SDPA_F16 && st == 1) {
        const uint16_t *h = src;
        int64_t d = 0;
        for (; d + 32 <= D; d += 32) {
            const __m512 lo = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + d)));
            const __m512 hi = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + d + 16)));
            _mm512_storeu_si512(stage + d, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
        for (; d < D; d++)
            stage[d] = sdpa__f32_to_bf16(sdpa__f16_to_f32(h[d]));
        return stage;
    }
    sdpa__load_row_bf16(src, t, st, D, stage);
    return stage;
}

static const uint16_t *kv_row(const sdpa_tensor *t, int64_t b, int64_t j, int64_t hk, int64_t D,
                              uint16_t *stage)
{
    return row_bf16(sdpa__elem(t, sdpa__offset(t, b, j, hk, 0)), t->dtype, t->stride[3], D,
                    stage);
}

/* ---- packing: K and V of one slot into B tiles */

/* Keys [j0, j0 + n) of the slot's packed order (n <= 32, j0 a multiple
 * of 32; keys n..31 are zero): K into tiles j0/16 and j0/16 + 1 of every
 * head-dim chunk, by a 16 x 16 transpose of bf16 pairs. */
static void pack_k32(const amx_job *jb, const amx_slot *sl, const uint16_t *const rows[32], int n,
                     int64_t j0)
{
    const int64_t D = jb->c->desc.D, nch = jb->Dp / 32;
    for (int half = 0; half < 2; half++) {
        uint16_t *kt = sl->k + (j0 / 16 + half) * nch * 512;
        for (int64_t ch = 0; ch < nch; ch++) {
            __m512 r[16];
            for (int i = 0; i < 16; i++)
                r[i] = 16 * half + i < n
                           ? _mm512_castsi512_ps(load32(rows[16 * half + i] + ch * 32, D - ch * 32))
                           : _mm512_setzero_ps();
            transpose16(r); /* r[i]: the pairs (2i, 2i + 1) of the 16 keys */
            for (int i = 0; i < 16; i++)
                _mm512_store_si512(kt + ch * 512 + i * 32, _mm512_castps_si512(r[i]));
        }
    }
}

/* 32 keys of V (rows[0 .. n), the rest zero) as one tile row of every
 * head-dim group at vt: row r of a group's tile interleaves keys 2r and
 * 2r + 1 over its 16 head dims (ng groups of 512 bf16). */
static void interleave_v32(const uint16_t *const rows[32], int n, int64_t D, int64_t ng,
                           uint16_t *vt)
{
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                        40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                        32, 0);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for (int64_t g = 0; g < ng; g += 2) {
        const int64_t d = g * 16;
        for (int r = 0; r < 16; r++) {
            const __m512i a = 2 * r < n ? load32(rows[2 * r] + d, D - d) : _mm512_setzero_si512();
            const __m512i b =
                2 * r + 1 < n ? load32(rows[2 * r + 1] + d, D - d) : _mm512_setzero_si512();
            _mm512_store_si512(vt + g * 512 + r * 32, _mm512_permutex2var_epi16(a, lo, b));
            if (g + 1 < ng)
                _mm512_store_si512(vt + (g + 1) * 512 + r * 32,
                                   _mm512_permutex2var_epi16(a, hi, b));
        }
    }
}

/* The same keys of V into tile row j0/32 of every head-dim group. */
static void pack_v32(const amx_job *jb, const amx_slot *sl, const uint16_t *const rows[32], int n,
                     int64_t j0)
{
    const int64_t ng = jb->Dv / 16;
    interleave_v32(rows, n, jb->c->desc.D, ng, sl->v + (j0 / 32) * ng * 512);
}

/* Packing task: PACK_KEYS keys of up to PACK_SLOTS slots of the group, 32
 * keys of every slot before the next 32, so that neighbouring heads' rows
 * of a key (one page) are read one after another. One head's rows stride
 * Hkv D elements, a page or more apart; a slot at a time (512 keys a task)
 * the packing alone took 1.2-1.3x as long (three long rows, Zen 4, in a
 * build that skipped the products; not kept). Both orders wait on those
 * rows' misses, about 5 GB/s of K and V on one core where a probe (not
 * kept) read the rows alone in this order at 11 GB/s and in address order
 * at 20; prefetching them (whole rows, the next keys in address order, or
 * the next group's rows during the products) gained nothing. */
static void pack_task(void *arg, int64_t task, int worker)
{
    const amx_job *jb = arg;
    const sdpa_call *c = jb->c;
    const int64_t chunks = (jb->kp + PACK_KEYS - 1) / PACK_KEYS;
    const int64_t s0 = task / chunks * PACK_SLOTS;
    const int64_t s1 = s0 + PACK_SLOTS < jb->nslots ? s0 + PACK_SLOTS : jb->nslots;
    const int64_t first = task % chunks * PACK_KEYS, last = first + PACK_KEYS;
    const int64_t D = c->desc.D, Dp = jb->Dp;
    uint16_t *stage = jb->ws[worker].stage;
    for (int64_t j0 = first; j0 < last; j0 += 32) {
        for (int64_t s = s0; s < s1; s++) {
            const amx_slot *sl = &jb->slots[s];
            const int64_t bh = jb->bh0 + s, b = bh / c->desc.Hkv, hk = bh % c->desc.Hkv;
            const int64_t end = sl->nk < last ? sl->nk : last;
            if (j0 >= end)
                continue;
            const int n = (int)(end - j0 < 32 ? end - j0 : 32);
            const uint16_t *rows[32];
            for (int i = 0; i < n; i++)
                rows[i] = kv_row(c->k, b, flash_key(sl->kidx, j0 + i), hk, D, stage + i * Dp);
            pack_k32(jb, sl, rows, n, j0);
            for (int i = 0; i < n; i++)
                rows[i] = kv_row(c->v, b, flash_key(sl->kidx, j0 + i), hk, D, stage + i * Dp);
            pack_v32(jb, sl, rows, n, j0);
        }
    }
}

/* ---- one query block against one key block */

/* Q rows i0 .. i0 + rows of the task's row space into A-tile rows (the
 * rest zero), negated when the scale is; m = -inf, l = 0. */
static void load_q(const amx_job *jb, const amx_workspace *w, amx_qblock *qb,
                   const flash_task *tk, int64_t i0, int rows)
{
    const sdpa_tensor *q = jb->c->q;
    const int64_t D = jb->c->desc.D, Dp = jb->Dp;
    const __m512i sign = _mm512_set1_epi16((short)jb->qsign);
    for (int r = 0; r < BQ; r++) {
        uint16_t *dst = qb->q + r * Dp;
        if (r >= rows) {
            memset(dst, 0, sizeof *dst * (size_t)Dp);
            continue;
        }
        int64_t h, i;
        flash_row(tk, i0 + r, &h, &i);
        const uint16_t *src = row_bf16(sdpa__elem(q, sdpa__offset(q, tk->b, i, h, 0)), q->dtype,
                                       q->stride[3], D, w->stage);
        for (int64_t d = 0; d < Dp; d += 32)
            _mm512_store_si512(dst + d, _mm512_xor_si512(load32(src + d, D - d), sign));
    }
    for (int r = 0; r < BQ; r++) {
        qb->m[r] = -INFINITY;
        _mm512_store_ps(qb->l + 16 * r, _mm512_setzero_ps());
    }
    qb->o_live = 0;
}

/*
 * S = Q K^T for the packed keys p0 .. p0 + bkp, as steps of one 32-key
 * group and one 32-dim chunk: four tile loads and four products (tiles,
 * all 16 rows x 64 bytes: tmm0-3 sum C, tmm4-5 hold A, tmm6-7 B), the
 * group's C tiles stored to S after its last chunk.
 *
 * Why steps: the next block's scores are computed a step or two after each
 * row of this block's softmax (scores_run), so that the tile unit and the
 * vector units work at once. What it bought on the Sapphire Rapids VM
 * (same process, interleaved, against the kernel that ran them one after
 * the other): 0-12% on D = 128 long rows (median about 2-3%), nothing at
 * D = 64/72. It cannot buy much there: tile loads and products do not
 * overlap each other (a 1 KB tile load costs about 0.8 of a product), so
 * the tiles alone are about 85% of the kernel's time and the softmax, with
 * every product left in, adds only 13%. Half-row steps did no better.
 */
typedef struct amx_scores {
    const amx_qblock *qb;
    const uint16_t *k; /* the block's first packed K tile       */
    float *s;          /* [BQ][kb] destination                  */
    int step, steps;   /* done, and (bkp / 32) groups x chunks  */
    unsigned groups;   /* bit g: keys 32 g .. 32 g + 31 are computed (block_sees) */
} amx_scores;

static amx_scores scores_begin(const amx_job *jb, const amx_qblock *qb, const amx_slot *sl,
                               int64_t p0, int bkp, unsigned groups, float *s)
{
    const amx_scores a = {qb, sl->k + (p0 / 16) * (jb->Dp / 32) * 512, s, 0,
                          bkp / 32 * (int)(jb->Dp / 32), groups};
    return a;
}

static inline void scores_step(const amx_job *jb, amx_scores *a)
{
    const int64_t Dp = jb->Dp, nch = Dp / 32;
    const int64_t g = a->step / nch, ch = a->step % nch;
    const uint16_t *q = a->qb->q;
    if (!(a->groups >> g & 1)) { /* no row sees these keys: their scores are -inf'd unread */
        a->step++;
        return;
    }
    if (ch == 0) {
        TILE_ZERO(0);
        TILE_ZERO(1);
        TILE_ZERO(2);
        TILE_ZERO(3);
    }
    amx_step_2x2(q + ch * 32, q + 16 * Dp + ch * 32, Dp * 2, a->k + (2 * g * nch + ch) * 512,
                 a->k + ((2 * g + 1) * nch + ch) * 512, 64);
    if (ch == nch - 1)
        amx_store_2x2(a->s + g * 32, jb->ss);
    a->step++;
}

/* The steps due once `done` of BQ rows of the softmax beside them are. */
static inline void scores_run(const amx_job *jb, amx_scores *a, int done)
{
    if (!a)
        return;
    const int due = (int)((int64_t)a->steps * done / BQ);
    while (a->step < due)
        scores_step(jb, a);
}

/* O (+)= P V for the packed keys p0 .. p0 + bkp, 32 at a time where
 * `groups` has their bit (P is 0 for every real row elsewhere): O as C
 * tiles, 32 head dims at a time; the first block of a query block starts
 * from zero. */
static void values(const amx_job *jb, const amx_workspace *w, amx_qblock *qb, const amx_slot *sl,
                   int64_t p0, int bkp, unsigned groups)
{
    const int64_t Dv = jb->Dv, ng = Dv / 16, ld = jb->ps * 2;
    const uint16_t *v = sl->v + (p0 / 32) * ng * 512;
    int64_t g = 0;
    for (; g + 1 < ng; g += 2) {
        float *o = qb->o + g * 16;
        if (qb->o_live) {
            TILE_LOAD(0, o, Dv * 4);
            TILE_LOAD(1, o + 16, Dv * 4);
            TILE_LOAD(2, o + 16 * Dv, Dv * 4);
            TILE_LOAD(3, o + 16 * Dv + 16, Dv * 4);
        } else {
            TILE_ZERO(0);
            TILE_ZERO(1);
            TILE_ZERO(2);
            TILE_ZERO(3);
        }
        for (int ch = 0; ch < bkp / 32; ch++) {
            if (!(groups >> ch & 1))
                continue;
            amx_step_2x2(w->p + ch * 32, w->p + 16 * jb->ps + ch * 32, ld,
                         v + (ch * ng + g) * 512, v + (ch * ng + g + 1) * 512, 64);
        }
        amx_store_2x2(o, Dv);
    }
    if (g < ng) { /* an odd last group of 16 head dims (D = 72: 80, not 96) */
        float *o = qb->o + g * 16;
        if (qb->o_live) {
            TILE_LOAD(0, o, Dv * 4);
            TILE_LOAD(2, o + 16 * Dv, Dv * 4);
        } else {
            TILE_ZERO(0);
            TILE_ZERO(2);
        }
        for (int ch = 0; ch < bkp / 32; ch++) {
            if (!(groups >> ch & 1))
                continue;
            TILE_LOAD(4, w->p + ch * 32, ld);
            TILE_LOAD(5, w->p + 16 * jb->ps + ch * 32, ld);
            TILE_LOAD(6, v + (ch * ng + g) * 512, 64);
            TILE_DPBF16PS(0, 4, 6);
            TILE_DPBF16PS(2, 5, 6);
        }
        TILE_STORE(0, o, Dv * 4);
        TILE_STORE(2, o + 16 * Dv, Dv * 4);
    }
    qb->o_live = 1;
}

/* Lanes of the v-th vector of a row below `limit`. */
static inline __mmask16 lanes_below(int v, int limit)
{
    const int n = limit - 16 * v;
    return n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
}

/* 2^(c s - m) over 32 scores at a time, the lanes at or past `limit` zero
 * (the caller's masks), into P as bf16; returns the row's sum, in fp32 of
 * P before it is rounded (as FlashAttention does: the LSE stays within the
 * polynomial's error; the output's weights are off by bf16's rounding).
 * `exact`: c s is rounded before m is subtracted (a huge m, where the
 * FMA's unrounded product would leave a residue of up to 2^-24 |m|). */
static inline __attribute__((always_inline)) __m512
exp_row(const float *s, uint16_t *p, int nv, int limit, float c, float m, int exact)
{
    const __m512 cv = _mm512_set1_ps(c), nm = _mm512_set1_ps(-m);
    __m512 sum0 = _mm512_setzero_ps(), sum1 = sum0;
    const int full = limit == 16 * nv;
    /* the explicitly rounded multiply: GCC would fuse a plain one with the
     * add (-ffp-contract=fast), which is the residue this path avoids */
#define SCALED(x) _mm512_mul_round_ps((x), cv, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
    for (int v = 0; v < nv; v += 2) {
        const __m512 s0 = _mm512_load_ps(s + 16 * v), s1 = _mm512_load_ps(s + 16 * v + 16);
        __m512 e0 = exp2_bf16(exact ? _mm512_add_ps(SCALED(s0), nm) : _mm512_fmadd_ps(s0, cv, nm));
        __m512 e1 = exp2_bf16(exact ? _mm512_add_ps(SCALED(s1), nm) : _mm512_fmadd_ps(s1, cv, nm));
        if (!full) {
            e0 = _mm512_maskz_mov_ps(lanes_below(v, limit), e0);
            e1 = _mm512_maskz_mov_ps(lanes_below(v + 1, limit), e1);
        }
        sum0 = _mm512_add_ps(sum0, e0);
        sum1 = _mm512_add_ps(sum1, e1);
        _mm512_store_si512(p + 16 * v, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
    }
#undef SCALED
    return _mm512_add_ps(sum0, sum1);
}

/* exp_row for two rows at once (m finite and not huge: the path past a
 * row's first block, and first_rows2; with `masked`, the lanes at or past
 * `limit` give P = 0 as exp_row's do): one loop for both, so that a
 * row's loop set-up and the tail of its sums' chains are paid once per two
 * rows (0.90-0.99x the tile-less time on the long rows, Zen 4:
 * bench/results/2026-12-05-amx-rows2-ab-zen4.txt). The next block's tile
 * steps then run after every second row instead of every row, as many.
 *
 * Software-pipelined: each step loads the next 32 scores of both rows and
 * takes their fractions while it finishes the current ones, and the sums
 * are FMAs (e 1 + sum: the same rounding as an add). One vector's chain is
 * about 40 cycles (load, FMA, VREDUCEPS 6, three FMAs, VSCALEFPS, the bf16
 * rounding 7) and on Zen 4 VREDUCEPS, VSCALEFPS, VADDPS and the rounding
 * all hold the FADD pipes: in program order the loop left ops waiting in
 * the scheduler; a step apart, and with the sums on the FMA pipes, the
 * loop alone takes 0.87-0.92x the time (bench_amx_cost --softmax,
 * bench/results/2026-12-05-amx-rows2-pipelined-zen4.txt), where the mix
 * of its operations with no dependences needs 10.4 cycles per 32 scores
 * of a row (a probe, not kept); the whole tile-less kernel, a few percent.
 * test_grid holds it to exp_row bit for bit. */
static inline __attribute__((always_inline)) void
exp_rows2_lanes(const float *s, uint16_t *p, int64_t ls, int64_t lp, int nv, int limit, int masked,
                float c, float m0, float m1, __m512 *sum_0, __m512 *sum_1)
{
    const __m512 cv = _mm512_set1_ps(c), nm0 = _mm512_set1_ps(-m0), nm1 = _mm512_set1_ps(-m1);
    const __m512 one = _mm512_set1_ps(1.0f);
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
    const float *t = s + ls;
    uint16_t *q = p + lp;
    /* x: c s - m of the step's four vectors (row 0's two, row 1's two), f their fractions */
    __m512 x0 = _mm512_fmadd_ps(_mm512_load_ps(s), cv, nm0);
    __m512 x1 = _mm512_fmadd_ps(_mm512_load_ps(s + 16), cv, nm0);
    __m512 x2 = _mm512_fmadd_ps(_mm512_load_ps(t), cv, nm1);
    __m512 x3 = _mm512_fmadd_ps(_mm512_load_ps(t + 16), cv, nm1);
    __m512 f0 = exp2_bf16_fraction(x0), f1 = exp2_bf16_fraction(x1);
    __m512 f2 = exp2_bf16_fraction(x2), f3 = exp2_bf16_fraction(x3);
    for (int v = 0; v < nv; v += 2) {
        const __m512 y0 = x0, y1 = x1, y2 = x2, y3 = x3, g0 = f0, g1 = f1, g2 = f2, g3 = f3;
        if (v + 2 < nv) {
            x0 = _mm512_fmadd_ps(_mm512_load_ps(s + 16 * v + 32), cv, nm0);
            x1 = _mm512_fmadd_ps(_mm512_load_ps(s + 16 * v + 48), cv, nm0);
            x2 = _mm512_fmadd_ps(_mm512_load_ps(t + 16 * v + 32), cv, nm1);
            x3 = _mm512_fmadd_ps(_mm512_load_ps(t + 16 * v + 48), cv, nm1);
            f0 = exp2_bf16_fraction(x0), f1 = exp2_bf16_fraction(x1);
            f2 = exp2_bf16_fraction(x2), f3 = exp2_bf16_fraction(x3);
        }
        __m512 e0 = exp2_bf16_from_fraction(y0, g0), e1 = exp2_bf16_from_fraction(y1, g1);
        __m512 e2 = exp2_bf16_from_fraction(y2, g2), e3 = exp2_bf16_from_fraction(y3, g3);
        if (masked) { /* lanes at or past limit: P = 0, as exp_row */
            const __mmask16 k0 = lanes_below(v, limit), k1 = lanes_below(v + 1, limit);
            e0 = _mm512_maskz_mov_ps(k0, e0), e1 = _mm512_maskz_mov_ps(k1, e1);
            e2 = _mm512_maskz_mov_ps(k0, e2), e3 = _mm512_maskz_mov_ps(k1, e3);
        }
        a0 = _mm512_fmadd_ps(e0, one, a0);
        a1 = _mm512_fmadd_ps(e1, one, a1);
        b0 = _mm512_fmadd_ps(e2, one, b0);
        b1 = _mm512_fmadd_ps(e3, one, b1);
        _mm512_store_si512(p + 16 * v, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
        _mm512_store_si512(q + 16 * v, (__m512i)_mm512_cvtne2ps_pbh(e3, e2));
    }
    *sum_0 = _mm512_add_ps(a0, a1);
    *sum_1 = _mm512_add_ps(b0, b1);
}

/* exp_rows2 over scores s[0 .. limit) of each row (the lanes past it P =
 * 0), one copy of the loop without the masks, one with. */
static inline __attribute__((always_inline)) void
exp_rows2(const float *s, uint16_t *p, int64_t ls, int64_t lp, int nv, int limit, float c, float m0,
          float m1, __m512 *sum_0, __m512 *sum_1)
{
    if (limit == 16 * nv)
        exp_rows2_lanes(s, p, ls, lp, nv, limit, 0, c, m0, m1, sum_0, sum_1);
    else
        exp_rows2_lanes(s, p, ls, lp, nv, limit, 1, c, m0, m1, sum_0, sum_1);
}

/* The max of a row's scores s[0 .. limit) times c (the product rounded,
 * not fused with what comes next), as a vector of lane maxima: four
 * running maxima, since one would be a chain of VMAXPS latencies. */
static inline __attribute__((always_inline)) __m512 row_max(const float *s, int limit, float c)
{
    __m512 mx = _mm512_set1_ps(-INFINITY), mx1 = mx, mx2 = mx, mx3 = mx;
    int v = 0;
    for (; 16 * v + 64 <= limit; v += 4) {
        mx = _mm512_max_ps(mx, _mm512_load_ps(s + 16 * v));
        mx1 = _mm512_max_ps(mx1, _mm512_load_ps(s + 16 * v + 16));
        mx2 = _mm512_max_ps(mx2, _mm512_load_ps(s + 16 * v + 32));
        mx3 = _mm512_max_ps(mx3, _mm512_load_ps(s + 16 * v + 48));
    }
    for (; 16 * v + 16 <= limit; v++)
        mx = _mm512_max_ps(mx, _mm512_load_ps(s + 16 * v));
    if (16 * v < limit)
        mx = _mm512_mask_max_ps(mx, lanes_below(v, limit), mx, _mm512_load_ps(s + 16 * v));
    mx = _mm512_max_ps(_mm512_max_ps(mx, mx1), _mm512_max_ps(mx2, mx3));
    return _mm512_mul_round_ps(mx, _mm512_set1_ps(c), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/*
 * Row r of the block: scores s[0 .. limit) are the keys it sees (the rest
 * of the nv vectors give P = 0). Raises m (lazily, see the top) and
 * rescales O's row and l when it does, then writes P and adds its sum.
 */
static inline __attribute__((always_inline)) void softmax_row(const float *s, uint16_t *p, int nv,
                                                              int limit, float c, amx_qblock *qb,
                                                              int r, int64_t Dv)
{
    if (limit <= 0) { /* sees none of these keys: nothing to add */
        for (int v = 0; v < nv; v += 2)
            _mm512_store_si512(p + 16 * v, _mm512_setzero_si512());
        return;
    }
    float m = qb->m[r];
    if (m != -INFINITY) {
        /* Past a row's first block the max seldom moves (lazily: by more
         * than TAU), so P is computed against the m it has, without a pass
         * for the block's max, and checked after: every P is at most its
         * lane's sum (P >= 0), so sums at most 2^TAU mean no score passed
         * m + TAU (up to the polynomial's 1e-4). Otherwise (a larger score,
         * or many near 2^TAU: inf and overflow included) the row is done
         * again below with its max. It saves the max pass, a tenth of the
         * softmax's vector operations. */
        const __m512 sum = fabsf(m) < 0x1p20f ? exp_row(s, p, nv, limit, c, m, 0)
                                              : exp_row(s, p, nv, limit, c, m, 1);
        if (!_mm512_cmp_ps_mask(sum, _mm512_set1_ps(P_LIMIT), _CMP_GT_OQ)) {
            _mm512_store_ps(qb->l + 16 * r, _mm512_add_ps(_mm512_load_ps(qb->l + 16 * r), sum));
            return;
        }
    }
    const __m512 mx = row_max(s, limit, c);
    if (m == -INFINITY || _mm512_cmp_ps_mask(mx, _mm512_set1_ps(m + TAU), _CMP_GT_OQ)) {
        const float top = _mm512_reduce_max_ps(mx);
        if (top > m) { /* NaN scores leave m: their P is NaN whatever m is */
            if (qb->o_live) {
                const __m512 alpha = _mm512_set1_ps(exp2f(m - top)); /* m = -inf: 0 */
                float *o = qb->o + r * Dv;
                for (int64_t d = 0; d < Dv; d += 16)
                    _mm512_store_ps(o + d, _mm512_mul_ps(_mm512_load_ps(o + d), alpha));
                _mm512_store_ps(qb->l + 16 * r, _mm512_mul_ps(_mm512_load_ps(qb->l + 16 * r), alpha));
            }
            qb->m[r] = m = top;
        }
    }
    /* A row whose scores so far are all -inf keeps m = -inf; subtracting
     * 0 instead keeps 2^-inf = 0 rather than NaN. */
    const float mu = m == -INFINITY ? 0.0f : m;
    const __m512 sum = fabsf(mu) < 0x1p20f ? exp_row(s, p, nv, limit, c, mu, 0)
                                           : exp_row(s, p, nv, limit, c, mu, 1);
    _mm512_store_ps(qb->l + 16 * r, _mm512_add_ps(_mm512_load_ps(qb->l + 16 * r), sum));
}

/* A run of a block's columns c0 .. c1 - 1 whose keys lie in key block kb
 * of the map: what the map row of the query block lists it as (SDPA_MAP_*)
 * and, for a PARTIAL one, its entry. */
typedef struct amx_keyrun {
    int c0, c1, cls;
    int64_t kb, entry;
} amx_keyrun;

enum { MAX_RUNS = 16 }; /* more (a key mask's gathered keys): looked up key by key */

/* Where a block sits, for its masks. */
typedef struct amx_block {
    const flash_task *tk;
    int64_t i0;          /* first row of the query block in the row space */
    int rows;            /* real rows of the query block                  */
    int64_t p0;          /* first packed key of the key block             */
    int bk, bkp;         /* keys in the block, and rounded up to 32       */
    const int64_t *kidx; /* key numbers under a key mask, else NULL       */
    int causal;          /* causal cuts through this block                */
    /* windows and block maps: whether they hide anything of the block,
     * the map row of the query block and the runs of its columns (nruns
     * -1: too many runs, keys looked up one by one) */
    int sparse, nruns;
    int64_t map_row, i_map; /* the map row, and its first query          */
    amx_keyrun runs[MAX_RUNS];
} amx_block;

/*
 * The window's and the map's part of a block (query rows i0 .. i0 + rows,
 * packed keys p0 .. p0 + bk; a row space of one head, so row = query):
 * at->sparse is set when either hides some of it, and the map's verdict on
 * each run of columns in one of its key blocks is kept for the rows (a
 * query block of 32 rows lies in one map row: block_q is 64 or 128). A
 * FULL run, or a PARTIAL one without bits, needs nothing: causal and the
 * other masks apply as they do on dense calls.
 */
static void sparse_prepare(const amx_job *jb, amx_block *at)
{
    const sdpa_call *c = jb->c;
    const sdpa_mask *mk = c->mask;
    const flash_task *tk = at->tk;
    const int64_t j0 = flash_key(at->kidx, at->p0), j1 = flash_key(at->kidx, at->p0 + at->bk - 1);
    at->sparse = 0, at->nruns = 0;
    if (mk->window) {
        int64_t len_q, len_kv, lo_first, hi_first, lo_last, hi_last;
        sdpa__seq_lens(c, tk->b, &len_q, &len_kv);
        sdpa__window_keys(mk->window, at->i0, len_kv - len_q, &lo_first, &hi_first);
        sdpa__window_keys(mk->window, at->i0 + at->rows - 1, len_kv - len_q, &lo_last, &hi_last);
        at->sparse = lo_last > j0 || hi_first < j1;
    }
    const sdpa_block_map *m = mk->blocks;
    if (!m)
        return;
    at->map_row = sdpa__map_row(m, tk->b, tk->h, at->i0 / m->block_q);
    at->i_map = at->i0 / m->block_q * m->block_q;
    for (int col = 0; col < at->bk;) {
        const int64_t kb = flash_key(at->kidx, at->p0 + col) / m->block_kv;
        int end = col + 1;
        if (!at->kidx)
            end = (int)((kb + 1) * m->block_kv - at->p0 < at->bk ? (kb + 1) * m->block_kv - at->p0
                                                                 : at->bk);
        else
            while (end < at->bk && at->kidx[at->p0 + end] / m->block_kv == kb)
                end++;
        if (at->nruns == MAX_RUNS) {
            at->nruns = -1, at->sparse = 1;
            return;
        }
        amx_keyrun *run = &at->runs[at->nruns++];
        run->c0 = col, run->c1 = end, run->kb = kb, run->entry = -1;
        run->cls = sdpa__map_class(m, at->map_row, kb, &run->entry);
        at->sparse |= run->cls == SDPA_MAP_NONE || (run->cls == SDPA_MAP_PARTIAL && m->partial_bits);
        col = end;
    }
}

/* The bits of word wi of a map block's row that a run's columns cover
 * (base: the column of the map block's first key). */
static inline uint64_t run_word(const amx_keyrun *run, int64_t base, int wi)
{
    const int64_t lo = run->c0 - base - 64 * wi, hi = run->c1 - base - 64 * wi;
    const int a = lo > 0 ? (int)lo : 0, z = hi < 64 ? (int)hi : 64;
    if (a >= z)
        return 0;
    return (z == 64 ? ~(uint64_t)0 : ((uint64_t)1 << z) - 1) & ~(((uint64_t)1 << a) - 1);
}

/* The 32-key groups of a block (bit g: columns 32 g .. 32 g + 31) that
 * its runs (sparse_prepare) may show a row: a PARTIAL run's bits are read
 * for rows i0 .. i0 + rows and its columns (a word per row and 64 keys).
 * 0: the block is skipped; a group without its bit is neither multiplied
 * nor added (in a 3-D neighbourhood of half density, 13% of the 32 x 32
 * pieces of listed blocks show nothing). */
static unsigned sparse_groups(const amx_job *jb, const amx_block *at)
{
    const unsigned all = (1u << (at->bk + 31) / 32) - 1;
    const sdpa_block_map *m = jb->c->mask->blocks;
    if (!m || at->nruns < 0 || at->kidx) /* gathered keys: not worth a bit walk */
        return all;
    const int wpr = m->block_kv / 64;
    unsigned seen = 0;
    for (int n = 0; n < at->nruns; n++) {
        const amx_keyrun *run = &at->runs[n];
        if (run->cls == SDPA_MAP_NONE)
            continue;
        if (run->cls == SDPA_MAP_FULL || !m->partial_bits) {
            for (int g = run->c0 / 32; g * 32 < run->c1; g++)
                seen |= 1u << g;
            continue;
        }
        const uint64_t *bits = m->partial_bits +
                               (at->map_row * m->index_stride + run->entry) * sdpa__map_words(m);
        const int64_t base = run->kb * m->block_kv - at->p0; /* a multiple of 64 */
        for (int wi = 0; wi < wpr; wi++) {
            const uint64_t cols = run_word(run, base, wi);
            uint64_t any = 0;
            for (int r = 0; r < at->rows && cols && any != cols; r++)
                any |= bits[(at->i0 + r - at->i_map) * wpr + wi] & cols;
            for (int h = 0; h < 2; h++)
                if (any >> 32 * h & 0xffffffffu)
                    seen |= 1u << (base + 64 * wi + 32 * h) / 32;
        }
    }
    return seen & all;
}

/* The window and the map on row r of a block's scores: hidden keys' scores
 * become -inf (only the hidden ones are stored to). */
static void sparse_mask_row(const amx_job *jb, const amx_block *at, int r, float *s)
{
    const sdpa_call *c = jb->c;
    const sdpa_mask *mk = c->mask;
    const int64_t i = at->i0 + r;
    if (mk->window) {
        int64_t len_q, len_kv, lo, hi;
        sdpa__seq_lens(c, at->tk->b, &len_q, &len_kv);
        sdpa__window_keys(mk->window, i, len_kv - len_q, &lo, &hi);
        for (int col = 0; col < at->bk; col++) {
            const int64_t key = flash_key(at->kidx, at->p0 + col);
            if (key < lo || key > hi)
                s[col] = -INFINITY;
        }
    }
    const sdpa_block_map *m = mk->blocks;
    if (!m)
        return;
    if (at->nruns < 0) { /* many runs: each key's own lookup */
        for (int col = 0; col < at->bk; col++)
            if (!sdpa__map_visible(m, at->tk->b, at->tk->h, i, flash_key(at->kidx, at->p0 + col)))
                s[col] = -INFINITY;
        return;
    }
    const int wpr = m->block_kv / 64;
    for (int n = 0; n < at->nruns; n++) {
        const amx_keyrun *run = &at->runs[n];
        if (run->cls == SDPA_MAP_NONE) {
            for (int col = run->c0; col < run->c1; col++)
                s[col] = -INFINITY;
        } else if (run->cls == SDPA_MAP_PARTIAL && m->partial_bits) {
            const uint64_t *rw = m->partial_bits +
                                 (at->map_row * m->index_stride + run->entry) * sdpa__map_words(m) +
                                 (i - at->i_map) * wpr;
            if (at->kidx) {
                for (int col = run->c0; col < run->c1; col++) {
                    const int64_t bit = at->kidx[at->p0 + col] % m->block_kv;
                    if (!(rw[bit >> 6] >> (bit & 63) & 1u))
                        s[col] = -INFINITY;
                }
                continue;
            }
            /* keys kb * block_kv + b for bits b: a masked store per 16
             * (a store per hidden score was 7% of a 3-D neighbourhood's
             * time, where most keys of a partial block are hidden) */
            const int64_t base = run->kb * m->block_kv - at->p0; /* column of bit 0 */
            const __m512 ninf = _mm512_set1_ps(-INFINITY);
            for (int wi = 0; wi < wpr; wi++) {
                const uint64_t hidden = ~rw[wi] & run_word(run, base, wi);
                for (int g = 0; g < 4 && hidden >> 16 * g; g++)
                    _mm512_mask_storeu_ps(s + base + 64 * wi + 16 * g,
                                          (__mmask16)(hidden >> 16 * g), ninf);
            }
        }
    }
}

/* The general mask (sdpa.h) on row i of (b, h): s = c s + mask in log2
 * units, -inf for hidden keys. */
static void mask_general_row(const sdpa_mask *mk, int64_t b, int64_t h, int64_t i,
                             const int64_t *kidx, int64_t p0, float *s, int n, float c)
{
    for (int j = 0; j < n; j++) {
        const int64_t at = sdpa__mask_at(mk, b, h, i, flash_key(kidx, p0 + j));
        if (mk->general_type == SDPA_MASK_BOOL) {
            s[j] = ((const uint8_t *)mk->general)[at] ? s[j] * c : -INFINITY;
        } else {
            const float add = sdpa__load_f32(mk->general, mk->general_dtype, at);
            s[j] = add == -INFINITY ? -INFINITY : s[j] * c + add * LOG2E;
        }
    }
}

/*
 * Rows r and r + 1 of a query block's first key block (m = -inf, O not yet
 * summed), every lane below limit seen: their maxima, then both rows' P in
 * one exp_rows2 loop, as softmax_row would (the same m, P and sums:
 * amx_emulated.c holds exp_rows2's masked copy to exp_row bit for bit).
 * What it saves is on short calls, where every row's only block is its
 * first: the serial chain of one row's max, reduction and exponentials,
 * run for two rows at once (with the bf16 stores of store_row_unit:
 * 0.89x the time on SDXL's 77-key cross-attention row, 0.94-0.96x on
 * 300-512 keys, 0.98-0.99x on long rows; Emerald Rapids,
 * bench/results/2026-12-06-amx-store-first-rows2-ab-emr.txt). Returns 0,
 * having written nothing, when a max is -inf, NaN or huge (softmax_row's
 * cases).
 */
static inline __attribute__((always_inline)) int first_rows2(const float *s, uint16_t *p,
                                                             int64_t ss, int64_t ps, int nv,
                                                             int limit, float c, amx_qblock *qb,
                                                             int r)
{
    const float m0 = _mm512_reduce_max_ps(row_max(s, limit, c));
    const float m1 = _mm512_reduce_max_ps(row_max(s + ss, limit, c));
    if (!(fabsf(m0) < 0x1p20f && fabsf(m1) < 0x1p20f))
        return 0;
    __m512 sum[2];
    exp_rows2(s, p, ss, ps, nv, limit, c, m0, m1, &sum[0], &sum[1]);
    qb->m[r] = m0, qb->m[r + 1] = m1;
    for (int i = 0; i < 2; i++)
        _mm512_store_ps(qb->l + 16 * (r + i),
                        _mm512_add_ps(_mm512_load_ps(qb->l + 16 * (r + i)), sum[i]));
    return 1;
}

static void softmax(const amx_job *jb, const amx_workspace *w, amx_qblock *qb,
                    const amx_block *at, float *sbuf, amx_scores *ahead)
{
    const flash_task *tk = at->tk;
    const sdpa_mask *mk = jb->c->mask && jb->c->mask->general ? jb->c->mask : NULL;
    const int nv = at->bkp / 16;
    const int64_t ss = jb->ss, ps = jb->ps, Dv = jb->Dv;
    if (!at->causal && !mk && !at->sparse) {
        const float c = jb->c_log2;
        for (int r = 0; r < BQ; r += 2) { /* BQ is even */
            const float m0 = qb->m[r], m1 = qb->m[r + 1];
            float *s = sbuf + r * ss;
            uint16_t *p = w->p + r * ps;
            if (fabsf(m0) < 0x1p20f && fabsf(m1) < 0x1p20f) {
                /* both rows past their first block (-inf fails the test);
                 * a last block of keys short of a multiple of 32 takes the
                 * masked copy (CogVideoX's 432-key tail went row by row:
                 * 0.96x the tile-less time of that row, 0.474 cycle per
                 * score from 0.493, bench/results/2026-12-06-amx-cost-
                 * partial-block-rows2-ab-emr.txt) */
                __m512 sum[2];
                exp_rows2(s, p, ss, ps, nv, at->bk, c, m0, m1, &sum[0], &sum[1]);
                for (int i = 0; i < 2; i++) { /* as softmax_row: redone with its max if any P passed 2^TAU */
                    if (_mm512_cmp_ps_mask(sum[i], _mm512_set1_ps(P_LIMIT), _CMP_GT_OQ))
                        softmax_row(s + i * ss, p + i * ps, nv, at->bk, c, qb, r + i, Dv);
                    else
                        _mm512_store_ps(qb->l + 16 * (r + i),
                                        _mm512_add_ps(_mm512_load_ps(qb->l + 16 * (r + i)), sum[i]));
                }
            } else if (m0 == -INFINITY && m1 == -INFINITY && !qb->o_live &&
                       first_rows2(s, p, ss, ps, nv, at->bk, c, qb, r)) {
                /* both rows' first block, their maxima finite and not huge */
            } else {
                softmax_row(s, p, nv, at->bk, c, qb, r, Dv);
                softmax_row(s + ss, p + ps, nv, at->bk, c, qb, r + 1, Dv);
            }
            scores_run(jb, ahead, r + 2);
        }
        return;
    }
    int64_t seen = 0; /* with kidx: the keys of the block row r sees (ascending in r) */
    for (int r = 0; r < BQ; r++) {
        float *s = sbuf + r * ss;
        int limit = at->bk;
        if (at->causal) {
            const int64_t last = at->i0 + r + tk->offset; /* the last key number it sees */
            if (at->kidx) {
                while (seen < at->bk && at->kidx[at->p0 + seen] <= last)
                    seen++;
                limit = (int)seen;
            } else {
                const int64_t n = last - at->p0 + 1;
                limit = n < 0 ? 0 : n < at->bk ? (int)n : at->bk;
            }
        }
        float c = jb->c_log2;
        if (at->sparse && r < at->rows && limit > 0)
            sparse_mask_row(jb, at, r, s);
        if (mk && r < at->rows && limit > 0) {
            int64_t h, i;
            flash_row(tk, at->i0 + r, &h, &i);
            mask_general_row(mk, tk->b, h, i, at->kidx, at->p0, s, limit, c);
            c = 1.0f;
        }
        softmax_row(s, w->p + r * ps, nv, limit, c, qb, r, Dv);
        scores_run(jb, ahead, r + 1);
    }
}

/* x as bf16, rounded to nearest even as sdpa__f32_to_bf16 (NaN made
 * quiet, the same bits). VCVTNEPS2BF16 does that in one instruction but
 * flushes fp32 denormals to zero, so a vector with one goes the integer
 * way (nine operations); the check costs one VFPCLASSPS. The output rows'
 * stores were a quarter of cpu.amx's time on a 77-key row (perf, cpu-clock). */
static inline __m256i bf16_round(__m512 x)
{
    if (!_mm512_fpclass_ps_mask(x, 0x20)) /* 0x20: denormal */
        return (__m256i)_mm512_cvtneps_pbh(x);
    const __m512i u = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
}

/* out[b, i, h, :] = o * mul for a unit-stride row: f32, bf16 (bf16_round)
 * or f16 (VCVTPS2PH). */
static inline __attribute__((always_inline)) void
store_row_unit(void *dst, sdpa_dtype t, const float *o, int64_t D, float mul)
{
    const __m512 mv = _mm512_set1_ps(mul);
    for (int64_t d = 0; d < D; d += 16) {
        const __mmask16 k = D - d >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (D - d)) - 1);
        const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, o + d), mv);
        if (t == SDPA_F32)
            _mm512_mask_storeu_ps((float *)dst + d, k, x);
        else if (t == SDPA_BF16)
            _mm256_mask_storeu_epi16((uint16_t *)dst + d, k, bf16_round(x));
        else
            _mm256_mask_storeu_epi16((uint16_t *)dst + d, k,
                                     _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    }
}

/* The rows store_row does not take: zeros, NaN rows, strided outputs (out
 * of line: inlined, its generic conversions made every row's call set up
 * a stack frame for them). */
static __attribute__((noinline)) void store_row_rare(const sdpa_call *c, int64_t b, int64_t h,
                                                     int64_t i, const float *o, float mn, float l)
{
    sdpa__store_result(c, b, i, h, o, mn, l, 0);
}

/* One row (query head h, query i) of O / l to the output, LSE in natural
 * units from m (log2 units of the scaled scores). */
static inline void store_row(const sdpa_call *c, int64_t b, int64_t h, int64_t i, const float *o,
                             float m, float l)
{
    const sdpa_tensor *out = c->out;
    const float mn = m / LOG2E, mul = sdpa__result_mul(l, 0);
    if (out->stride[3] == 1 && mul != 0.0f && mul == mul) {
        store_row_unit((char *)out->data + sdpa__offset(out, b, i, h, 0) * sdpa__elem_bytes(out->dtype),
                       out->dtype, o, c->desc.D, mul);
        sdpa__store_lse(c, b, i, h, mn, l);
    } else {
        store_row_rare(c, b, h, i, o, mn, l);
    }
}

/* Rows i0 .. i0 + rows of O / l to the output; rows at or past len_q are
 * padding (sdpa.h): zeros and LSE -inf. */
static void store_out(const amx_job *jb, const amx_qblock *qb, const flash_task *tk, int64_t i0,
                      int rows)
{
    for (int r = 0; r < rows; r++) {
        int64_t h, i;
        flash_row(tk, i0 + r, &h, &i);
        const float l = i < tk->len_q ? _mm512_reduce_add_ps(_mm512_load_ps(qb->l + 16 * r)) : 0.0f;
        store_row(jb->c, tk->b, h, i, qb->o + r * jb->Dv, qb->m[r], l);
    }
}

/* The task's map: for each key block of the map, how many of the map rows
 * its query rows fall in list it (count) and how many as FULL (full), of
 * `rows` map rows. */
typedef struct amx_listed {
    const uint8_t *count, *full;
    int rows;
    int64_t block_kv;
} amx_listed;

/* Whether every map row of the task lists every map block of keys p0 ..
 * p0 + bk as FULL, and no window cuts them: a dense block for each of its
 * query blocks, taken without a lookup (the lookups were 4% of a map that
 * lists every block). */
static int task_full(const amx_job *jb, const amx_listed *ls, int64_t p0, int bk)
{
    if (!ls || jb->c->mask->window)
        return 0;
    for (int64_t kb = p0 / ls->block_kv; kb * ls->block_kv < p0 + bk; kb++)
        if (ls->full[kb] != ls->rows)
            return 0;
    return 1;
}

/* Which 32-key groups of the block of packed keys p0 .. p0 + bk the query
 * block of rows i0.. may see (bit g: keys 32 g ..), 0 for none: causal
 * calls skip the blocks it does not reach, windows and maps the blocks
 * they hide (one lookup per map block the block covers), and a map's bits
 * the groups no row sees. */
static unsigned block_sees(const amx_job *jb, const amx_slot *sl, const flash_task *tk,
                           const amx_listed *ls, int64_t i0, int64_t p0, int bk)
{
    const int rows = flash_block_rows(jb->split.rows, i0, BQ);
    const unsigned all = (1u << (bk + 31) / 32) - 1;
    if (tk->causal && flash_key(sl->kidx, p0) > i0 + rows - 1 + tk->offset)
        return 0;
    if (!jb->sparse || task_full(jb, ls, p0, bk))
        return all;
    const int64_t last = p0 + bk - 1;
    if (!sdpa__sparse_tile_sees(jb->c, tk->b, tk->h, i0, i0 + rows, flash_key(sl->kidx, p0),
                                flash_key(sl->kidx, last)))
        return 0;
    if (!jb->c->mask->blocks || !jb->c->mask->blocks->partial_bits)
        return all;
    amx_block at = {tk, i0, rows, p0, bk, 0, sl->kidx, 0, 0, 0, 0, 0, {{0}}};
    sparse_prepare(jb, &at);
    return sparse_groups(jb, &at);
}

/* A task's blocks run in a sequence, each block's scores computed during
 * the softmax of the one before: w->s[cur] holds the next block's when
 * `ready`. */
typedef struct amx_pipe {
    int cur, ready;
} amx_pipe;

/* The block the pipeline runs next, if any: query block qb of rows i0..,
 * packed keys p0 .. p0 + bk. */
typedef struct amx_next {
    const amx_qblock *qb;
    int64_t p0;
    int bk;
    unsigned groups; /* block_sees */
} amx_next;

/* Query block qb (rows i0..), which sees some of them, against the key
 * block of packed keys p0..; the scores of `next` during its softmax. */
static void block(const amx_job *jb, const amx_workspace *w, amx_qblock *qb, const amx_slot *sl,
                  const flash_task *tk, const amx_listed *ls, int64_t i0, int64_t p0, int bk,
                  unsigned groups, amx_pipe *pp, const amx_next *next)
{
    const int rows = flash_block_rows(jb->split.rows, i0, BQ);
    const int64_t k_last = flash_key(sl->kidx, p0 + bk - 1);
    /* fields one by one: an initializer zeroed the 16 runs too, a REP
     * STOSQ of 592 bytes per block (1.6% of a dense block's time) for what
     * only sparse_prepare fills, and only sparse blocks read */
    amx_block at;
    at.tk = tk, at.i0 = i0, at.rows = rows, at.p0 = p0, at.bk = bk, at.bkp = (bk + 31) / 32 * 32;
    at.kidx = sl->kidx, at.causal = tk->causal && k_last > i0 + tk->offset;
    at.sparse = 0, at.nruns = 0, at.map_row = 0, at.i_map = 0;
    if (jb->sparse && !task_full(jb, ls, p0, bk))
        sparse_prepare(jb, &at);
    float *s = w->s[pp->cur];
    if (!pp->ready) {
        amx_scores now = scores_begin(jb, qb, sl, p0, at.bkp, groups, s);
        scores_run(jb, &now, BQ);
    }
    amx_scores ahead, *ah = NULL;
    if (next) {
        ahead = scores_begin(jb, next->qb, sl, next->p0, (next->bk + 31) / 32 * 32,
                             next->groups, w->s[pp->cur ^ 1]);
        ah = &ahead;
    }
    softmax(jb, w, qb, &at, s, ah);
    scores_run(jb, ah, BQ);
    values(jb, w, qb, sl, p0, at.bkp, groups);
    pp->cur ^= 1;
    pp->ready = next != NULL;
}

/*
 * Keys of the key block that starts at packed key p0 (of nk): kb, or for a
 * map the map block at p0 and the consecutive ones after it that every map
 * row of the task lists, up to kb keys. Why join them: a block of 128 keys
 * loads and stores O's tiles and runs the softmax's per-row steps for half
 * the products of one of 256 (about 5% more tile operations, measured as
 * 0.96x of the dense call on a map listing every block); a block some map
 * row of the task does not list stays alone, so no query block computes
 * scores its map row hides.
 */
static int key_block_keys(const amx_job *jb, int64_t p0, int64_t nk, const amx_listed *ls)
{
    int64_t end = p0 + jb->kb;
    if (ls) {
        end = p0 + ls->block_kv;
        if (ls->count[p0 / ls->block_kv] == ls->rows)
            while (end < nk && end - p0 < jb->kb && ls->count[end / ls->block_kv] == ls->rows)
                end += ls->block_kv;
    }
    return (int)((end < nk ? end : nk) - p0);
}

/* From (q, p0) on, in the order the long path runs (query blocks within a
 * key block), the first block that sees keys, its keys in *bk; returns its
 * groups (block_sees), 0 when none is left. */
static unsigned next_seen(const amx_job *jb, const amx_slot *sl, const flash_task *tk,
                          int64_t nk, int *q, int64_t *p0, int *bk, const amx_listed *ls)
{
    for (; *p0 < nk; *q = 0) {
        if (ls && !ls->count[*p0 / ls->block_kv]) { /* passed over without a lookup */
            *p0 += ls->block_kv;
            continue;
        }
        *bk = key_block_keys(jb, *p0, nk, ls);
        for (; *q < tk->nqb; ++*q) {
            const unsigned groups =
                block_sees(jb, sl, tk, ls, tk->i_first + (int64_t)*q * BQ, *p0, *bk);
            if (groups)
                return groups;
        }
        *p0 += *bk;
    }
    return 0;
}

/* Product task: a group of query blocks of one row space of the packing
 * group (task numbers local to the group). */
static void amx_task(void *arg, int64_t task, int worker)
{
    const amx_job *jb = arg;
    const sdpa_call *c = jb->c;
    const sdpa_call_desc *d = &c->desc;
    const amx_workspace *w = &jb->ws[worker];
    /* Query groups outermost: consecutive tasks read the same rows of Q
     * and write the same rows of the output in every head, whose pages
     * (one head's rows stride Hq D elements) then stay in the TLB and
     * cache (Wan2.2's 8190 x 512 cross attention: 4.5% faster). */
    const int64_t across = jb->nslots * jb->spaces_per_slot;
    const int64_t qg = task / across, sp = task % across;
    const int64_t slot = sp / jb->spaces_per_slot;
    const int64_t bh = jb->bh0 + slot, b = bh / d->Hkv, hk = bh % d->Hkv;
    const int64_t spaces = d->Hq / jb->split.group; /* row spaces per batch entry */
    const int64_t space =
        jb->split.group > 1 ? hk : hk * (d->Hq / d->Hkv) + sp % jb->spaces_per_slot;
    const flash_task tk =
        flash_task_make(c, &jb->split, BQ, (b * spaces + space) * jb->split.tasks_per_head + qg);
    const amx_slot *sl = &jb->slots[slot];
    /* the packed keys the task reads: those before kv_end (causal bound) */
    int64_t nk = sl->nk;
    if (sl->kidx) {
        int64_t lo = 0, hi = nk; /* first packed key at or past kv_end */
        while (lo < hi) {
            const int64_t mid = (lo + hi) / 2;
            if (sl->kidx[mid] < tk.kv_end)
                lo = mid + 1;
            else
                hi = mid;
        }
        nk = lo;
    } else if (nk > tk.kv_end) {
        nk = tk.kv_end;
    }
    amx_tiles_take();
    amx_pipe pp = {0, 0};
    if (jb->is_short) { /* every key in one block: a query block at a time, two resident */
        if (tk.nqb > 0)
            load_q(jb, w, &w->qb[0], &tk, tk.i_first,
                   flash_block_rows(jb->split.rows, tk.i_first, BQ));
        for (int q = 0; q < tk.nqb; q++) {
            const int64_t i0 = tk.i_first + (int64_t)q * BQ;
            const int rows = flash_block_rows(jb->split.rows, i0, BQ);
            amx_qblock *qb = &w->qb[q & 1];
            amx_next next = {&w->qb[(q + 1) & 1], 0, (int)nk, 0};
            const int has_next = q + 1 < tk.nqb;
            if (has_next) /* the next block's Q now: its scores run during this softmax */
                load_q(jb, w, &w->qb[(q + 1) & 1], &tk, i0 + BQ,
                       flash_block_rows(jb->split.rows, i0 + BQ, BQ));
            if (q + 2 < tk.nqb)
                flash_prefetch_rows(c->q, &tk, i0 + 2 * BQ,
                                    flash_block_rows(jb->split.rows, i0 + 2 * BQ, BQ), d->D, 0);
            flash_prefetch_rows(c->out, &tk, i0, rows, d->D, 1);
            const unsigned groups = nk > 0 ? block_sees(jb, sl, &tk, NULL, i0, 0, (int)nk) : 0;
            if (groups) {
                next.groups = has_next ? block_sees(jb, sl, &tk, NULL, i0 + BQ, 0, (int)nk) : 0;
                block(jb, w, qb, sl, &tk, NULL, i0, 0, (int)nk, groups, &pp,
                      next.groups ? &next : NULL);
            }
            store_out(jb, qb, &tk, i0, rows);
        }
    } else { /* query blocks resident, key blocks streaming past once */
        for (int q = 0; q < tk.nqb; q++) {
            const int64_t i0 = tk.i_first + (int64_t)q * BQ;
            /* Q's rows a block ahead, the first block's too: each row is a
             * page or more from the last (one head's rows stride Hq D), and
             * load_q waited on them one after another (6-7% of the time
             * without tiles on CogVideoX's D = 64 row, Zen 4; 2.5% after) */
            if (q == 0)
                flash_prefetch_rows(c->q, &tk, i0, flash_block_rows(jb->split.rows, i0, BQ), d->D,
                                    0);
            if (q + 1 < tk.nqb)
                flash_prefetch_rows(c->q, &tk, i0 + BQ,
                                    flash_block_rows(jb->split.rows, i0 + BQ, BQ), d->D, 0);
            load_q(jb, w, &w->qb[q], &tk, i0, flash_block_rows(jb->split.rows, i0, BQ));
        }
        int q = 0;
        int64_t p0 = 0;
        /* how many of the task's map rows list each key block of the map:
         * the unlisted are passed over without a lookup */
        amx_listed listed = {w->listed, NULL, 0, 0}, *ls = NULL;
        if (jb->map_blocks && tk.nqb > 0) {
            const sdpa_block_map *m = c->mask->blocks;
            uint8_t *full = w->listed + m->kv_blocks;
            memset(w->listed, 0, 2 * (size_t)m->kv_blocks);
            listed.full = full;
            const int64_t i_last = tk.i_first + (int64_t)tk.nqb * BQ - 1;
            for (int64_t mq = tk.i_first / m->block_q;
                 mq <= i_last / m->block_q && mq < m->q_blocks; mq++, listed.rows++) {
                const int64_t row = sdpa__map_row(m, tk.b, tk.h, mq);
                for (int l = 0; l < 2; l++) {
                    const int32_t *cnt = l ? m->partial_count : m->full_count;
                    const int32_t *idx = l ? m->partial_index : m->full_index;
                    for (int32_t e = 0; cnt && e < cnt[row]; e++) {
                        w->listed[idx[row * m->index_stride + e]]++;
                        full[idx[row * m->index_stride + e]] += l == 0;
                    }
                }
            }
            listed.block_kv = m->block_kv;
            ls = &listed;
        }
        int bk = 0;
        unsigned groups = next_seen(jb, sl, &tk, nk, &q, &p0, &bk, ls);
        while (groups) {
            const int64_t i0 = tk.i_first + (int64_t)q * BQ;
            int qn = q + 1, bkn = bk;
            int64_t pn = p0;
            const unsigned gn = next_seen(jb, sl, &tk, nk, &qn, &pn, &bkn, ls);
            const amx_next next = {&w->qb[qn < tk.nqb ? qn : 0], pn, bkn, gn};
            if (p0 + bk >= nk) /* the last key block: its output rows come next */
                flash_prefetch_rows(c->out, &tk, i0, flash_block_rows(jb->split.rows, i0, BQ),
                                    d->D, 1);
            block(jb, w, &w->qb[q], sl, &tk, ls, i0, p0, bk, groups, &pp, gn ? &next : NULL);
            q = qn, p0 = pn, bk = bkn, groups = gn;
        }
        for (q = 0; q < tk.nqb; q++) {
            const int64_t i0 = tk.i_first + (int64_t)q * BQ;
            store_out(jb, &w->qb[q], &tk, i0, flash_block_rows(jb->split.rows, i0, BQ));
        }
    }
    if (!amx_tiles_owned)
        amx_tiles_drop();
}

/* The packed keys of slot s (KV row bh): below len_kv, under a key mask
 * only the visible ones (their numbers in kidx). */
static void slot_keys(const sdpa_call *c, amx_slot *sl, int64_t bh)
{
    const int64_t b = bh / c->desc.Hkv;
    int64_t len_q, len_kv;
    sdpa__seq_lens(c, b, &len_q, &len_kv);
    sl->nk = len_kv;
    if (!sl->kidx)
        return;
    const sdpa_mask *mk = c->mask;
    const uint8_t *key = mk->key + b * mk->key_stride[0];
    int64_t n = 0;
    for (int64_t j = 0; j < len_kv; j++)
        if (key[j * mk->key_stride[1]])
            sl->kidx[n++] = j;
    sl->nk = n;
}

#define R64(x) (((size_t)(x) + 63) / 64 * 64)

#include "decode_amx.h"

static sdpa_status amx_run(const sdpa_backend *self, const sdpa_call *c)
{
    if (adec_applies(c)) /* 2-16 grouped-query rows per KV head, bf16: K in place */
        return adec_run(self, c);
    if (sdpa__cpu_avx512_decode_applies(c)) /* one row per head, masks, f16: fp32 products */
        return sdpa__cpu_avx512_decode_run(self, c);
    const sdpa_call_desc *d = &c->desc;
    sdpa_pool *pool = sdpa__pool_for_call(c); /* small calls: the calling thread alone */
    const int threads = sdpa__pool_threads(c->pool); /* the split: as flash_tiled.h's */
    amx_job jb;
    memset(&jb, 0, sizeof jb);
    jb.c = c;
    jb.Dp = (d->D + 31) / 32 * 32;
    jb.Dv = (d->D + 15) / 16 * 16;
    jb.kp = (d->Skv + 31) / 32 * 32;
    /* windows and maps: the long path, a row space per head (a query
     * block in one map row), key blocks of the map's size where keys are
     * not gathered by a key mask (a block is then listed or not as a whole) */
    jb.sparse = c->mask && (c->mask->window || c->mask->blocks);
    const int key_mask = c->mask && c->mask->key;
    jb.is_short = !jb.sparse && d->Skv <= SHORT_KEYS;
    jb.map_blocks = jb.sparse && c->mask->blocks && !key_mask;
    /* a map's key blocks (64 or 128 keys) are joined up to BK_LONG keys
     * where they are listed in a row (key_block_keys) */
    jb.kb = jb.is_short ? jb.kp : BK_LONG;
    jb.ss = jb.kb + S_PAD;
    jb.ps = jb.kb;
    jb.split = flash_split_make(d, BQ, threads, !jb.sparse && flash_groups_heads(c, BQ),
                                jb.is_short ? 16 : QB_LONG, jb.is_short ? 2 : 4);
    jb.spaces_per_slot = jb.split.group > 1 ? 1 : d->Hq / d->Hkv;
    jb.c_log2 = (float)(fabs(c->scale) * LOG2E);
    jb.qsign = c->scale < 0 ? 0x8000 : 0;
    const int64_t Dp = jb.Dp, Dv = jb.Dv, kv_rows = d->B * d->Hkv;
    /* per thread: resident query blocks, S, P, a stage of 32 rows */
    const int resident = jb.is_short ? 2 : jb.split.qb_per_task;
    const size_t per_qb = R64(BQ * Dp * 2) + R64(BQ * Dv * 4) + R64(BQ * 4) + R64(BQ * 16 * 4);
    const size_t listed = jb.map_blocks ? R64(2 * c->mask->blocks->kv_blocks) : 0;
    const size_t per_thread = per_qb * (size_t)resident + 2 * R64(BQ * jb.ss * 4) + R64(BQ * jb.ps * 2) +
                              R64(32 * Dp * 2) + listed;
    /* per slot: packed K and V, the visible keys under a key mask */
    const size_t per_slot =
        R64(jb.kp * Dp * 2) + R64(jb.kp * Dv * 2) + (key_mask ? R64(d->Skv * 8) : 0);
    int64_t group = (int64_t)(PACK_BUDGET / per_slot);
    group = group < 1 ? 1 : group > kv_rows ? kv_rows : group;
    const size_t descs = R64((size_t)threads * sizeof(amx_workspace)) +
                         R64((size_t)threads * (size_t)resident * sizeof(amx_qblock)) +
                         R64((size_t)group * sizeof(amx_slot));
    const size_t bytes = per_thread * (size_t)threads + per_slot * (size_t)group + descs;
    char *mem = sdpa__scratch(bytes);
    if (!mem)
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes of tiles",
                          self->name, bytes);
    char *p = mem;
    jb.ws = (amx_workspace *)p, p += R64((size_t)threads * sizeof(amx_workspace));
    amx_qblock *qbs = (amx_qblock *)p;
    p += R64((size_t)threads * (size_t)resident * sizeof(amx_qblock));
    jb.slots = (amx_slot *)p, p += R64((size_t)group * sizeof(amx_slot));
    for (int t = 0; t < threads; t++) {
        amx_workspace *w = &jb.ws[t];
        w->qb = qbs + (size_t)t * (size_t)resident;
        for (int q = 0; q < resident; q++) {
            w->qb[q].q = (uint16_t *)p, p += R64(BQ * Dp * 2);
            w->qb[q].o = (float *)p, p += R64(BQ * Dv * 4);
            w->qb[q].m = (float *)p, p += R64(BQ * 4);
            w->qb[q].l = (float *)p, p += R64(BQ * 16 * 4);
        }
        for (int i = 0; i < 2; i++) {
            w->s[i] = (float *)p, p += R64(BQ * jb.ss * 4);
#ifdef SDPA_AMX_NO_TILES
            memset(w->s[i], 0, sizeof(float) * (size_t)(BQ * jb.ss)); /* never written by tiles */
#endif
        }
        w->p = (uint16_t *)p, p += R64(BQ * jb.ps * 2);
        w->stage = (uint16_t *)p, p += R64(32 * Dp * 2);
        w->listed = listed ? (uint8_t *)p : NULL, p += listed;
    }
    for (int64_t s = 0; s < group; s++) {
        amx_slot *sl = &jb.slots[s];
        sl->k = (uint16_t *)p, p += R64(jb.kp * Dp * 2);
        sl->v = (uint16_t *)p, p += R64(jb.kp * Dv * 2);
        sl->kidx = key_mask ? (int64_t *)p : NULL, p += key_mask ? R64(d->Skv * 8) : 0;
    }
    const int64_t chunks = (jb.kp + PACK_KEYS - 1) / PACK_KEYS;
    for (jb.bh0 = 0; jb.bh0 < kv_rows; jb.bh0 += group) {
        jb.nslots = kv_rows - jb.bh0 < group ? kv_rows - jb.bh0 : group;
        for (int64_t s = 0; s < jb.nslots; s++)
            slot_keys(c, &jb.slots[s], jb.bh0 + s);
        sdpa__parallel_for(pool, (jb.nslots + PACK_SLOTS - 1) / PACK_SLOTS * chunks, pack_task,
                           &jb);
        sdpa__parallel_for(pool, jb.nslots * jb.spaces_per_slot * jb.split.tasks_per_head,
                           amx_task, &jb);
    }
    amx_tiles_drop(); /* the calling thread's; the workers' go when they idle */
    sdpa__scratch_release(mem);
    return SDPA_OK;
}
#undef R64

/* The descriptor (backend.c, or the tests' emulated one) reaches the kernel
 * through this. */
sdpa_status AMX_RUN_SYMBOL(const sdpa_backend *self, const sdpa_call *call);
sdpa_status AMX_RUN_SYMBOL(const sdpa_backend *self, const sdpa_call *call)
{
    return amx_run(self, call);
}

/* The backward pass (not in the build that times the forward without
 * tiles): the vector kernels' framework with the products on tiles. */
#ifndef SDPA_AMX_NO_TILES
#include "backward_amx.h"
#include "../flash_backward.h"

#ifndef AMX_BACKWARD_SYMBOL
#define AMX_BACKWARD_SYMBOL sdpa__cpu_amx_backward
#endif
/* The descriptor (backend.c, or the tests' emulated one) reaches the
 * backward pass through this. */
sdpa_status AMX_BACKWARD_SYMBOL(const sdpa_backend *self, const sdpa_call *call);
sdpa_status AMX_BACKWARD_SYMBOL(const sdpa_backend *self, const sdpa_call *call)
{
    const sdpa_status st = tiled_backward(self, call);
    amx_tiles_drop(); /* the calling thread's; the workers' go when they idle */
    return st;
}
#endif

#if !defined(SDPA_AMX_EMULATE) && !defined(SDPA_AMX_NO_TILES)
/*
 * The first use on a machine checks one tile product against the scalar
 * definition: the kernel above has been run on emulated tiles by the tests,
 * and this ties the instructions to that emulation on the machine itself
 * (and proves the tile permission holds on this thread).
 */
static int amx_selftest_ok;
static pthread_once_t amx_selftest_once = PTHREAD_ONCE_INIT;

static void amx_selftest(void)
{
    static uint16_t a[16 * 32] __attribute__((aligned(64)));
    static uint16_t b[16 * 32] __attribute__((aligned(64)));
    static float c[16 * 16] __attribute__((aligned(64)));
    for (int i = 0; i < 16 * 32; i++) { /* small integers: exact in bf16 and fp32 */
        a[i] = sdpa__f32_to_bf16((float)((i * 7) % 11 - 5));
        b[i] = sdpa__f32_to_bf16((float)((i * 5) % 13 - 6));
    }
    amx_configure_full_tiles();
    TILE_ZERO(0);
    TILE_LOAD(4, a, 64);
    TILE_LOAD(6, b, 64);
    TILE_DPBF16PS(0, 4, 6);
    TILE_STORE(0, c, 64);
    TILE_RELEASE();
    int ok = 1;
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            float want = 0;
            for (int k = 0; k < 32; k++) /* A[m][k] * B[k/2][n][k%2] */
                want += sdpa__bf16_to_f32(a[m * 32 + k]) *
                        sdpa__bf16_to_f32(b[(k / 2) * 32 + n * 2 + k % 2]);
            ok &= c[m * 16 + n] == want;
        }
    amx_selftest_ok = ok;
}

/* Runs the self-test once per process (call only where AMX is usable). */
int sdpa__cpu_amx_selftest(void);
int sdpa__cpu_amx_selftest(void)
{
    pthread_once(&amx_selftest_once, amx_selftest);
    return amx_selftest_ok;
}
#endif
