/*
 * flash_decode.h - the CPU kernels' path for few query rows per KV head
 * (grouped-query heads times Sq, at most DECODE_ROWS: a decode step, a
 * text encoder with a cache, one token), fp32 products over a vector
 * vocabulary: included by flash_run.h (cpu.avx512, cpu.avx2, cpu.neon,
 * cpu.portable over vec_portable.h). cpu.avx512bf16's
 * build (flash_tiled.h in pair mode) runs bf16 calls with 2-8 rows per KV
 * head on its ISA file's pair products instead (DECODE_PAIRS: VDPBF16PS
 * on K and V in place, P rounded to bf16, decode_block_pairs), the rest
 * on fp32 products as everywhere; cpu.amx runs cpu.avx512's build
 * (avx512/decode_avx512.h): tiles for one row cost more than the products
 * (its 2-16 unmasked bf16 rows per KV head run on tiles: amx/decode_amx.h).
 *
 * A block of query tiles buys nothing with one query: packing K and V for
 * it costs as much as using them, and 47 of a 48-lane block would be
 * empty. Here K and V are read in place (f32, bf16 and f16 rows with unit
 * D-stride, the half types widened as they are loaded; other rows are
 * converted VL at a time), the rows of one KV head share one pass over its
 * keys, and keys run along the lanes:
 *
 *   for VL keys at a time, for each KV head of the task, for each row r:
 *     acc[j] = sum_d q_r[d] k_j[d]       (VL vector accumulators over d)
 *     s_r    = the VL sums, one vector   (V_TRANSPOSE_REGS, then adds)
 *     online softmax on s_r (max, exp, sum; O_r rescaled when the max moves)
 *     O_r   += sum_j p_rj v_j            (over d, V's rows as they are)
 *
 * With 16 lanes and 2-8 rows per KV head (grouped-query heads, a few
 * queries) the rows go side by side instead (decode_block_rows): K's block
 * is transposed once (in registers), s_r = sum_d q_r[d] k[d] for all rows,
 * and each V vector meets every row's weight before the next is loaded.
 * With 8 lanes (AVX2) they run as a small GEMM (decode_block_gemm): up to
 * 4 rows against 2 keys with D on the lanes, then O += P V with a block of
 * O in registers.
 *
 * Such a step reads every key once and is bound by memory. In BSHD one
 * head's consecutive keys are a row of all heads apart (4-32 KB), a page
 * or more, where the hardware prefetchers do not follow; so a task takes
 * several KV heads (up to DECODE_SLOTS rows) and reads all their rows of a
 * key before the next key, along memory. Against one head per task that
 * made a one-query step 1.9-2.8x faster (f32 and bf16, 8-32 heads, a
 * Sapphire Rapids VM); software prefetching instead gained nothing.
 *
 * Why at most 8 rows per KV head: from 16 rows the tiled path's packed
 * micro-kernel is 2-3x faster (each row here pays a transpose of VL
 * accumulators per VL keys). At 8 (one query, grouped-query 8:1 or MQA
 * with 8 heads) this path was 1.1-2.8x the tiled one against 1024-8192
 * keys, f32 and bf16, and 0.8-1.0x against 256 (sdpa bench, Sapphire
 * Rapids VM, the two builds run in turn); with 4 the limit before, such
 * calls packed K and V for one query per head. With 8 lanes the small
 * GEMM (decode_block_gemm) pays no transpose per row and takes up to 12
 * rows, 16 with one KV head (decode_applies).
 *
 * Tasks are (batch, group of KV heads, chunk of keys). When a call has
 * fewer than DECODE_TASKS (batch, group) pieces and many keys, its keys
 * are cut into chunks whose partial results (O, max, sum) are merged in
 * chunk order afterwards, as flash-decoding does; if there are still few,
 * the groups are cut smaller. The cuts depend on the shape and the strides
 * only, so results are bitwise the same for any thread count. A call whose
 * whole work is below SDPA_POOL_INLINE_MACS multiply-adds runs on the
 * calling thread alone (core.h: sdpa__pool_for_call): waking the pool costs more.
 *
 * Masks as everywhere (sdpa.h): lengths bound the keys and mark padding
 * rows, causal limits each row, a key mask and a general mask hide keys
 * lane by lane.
 */
#ifndef SDPA_FLASH_DECODE_H
#define SDPA_FLASH_DECODE_H

/* Rows of one KV head share one pass (decode_block_rows) with 16 lanes;
 * with 8 (AVX2) that way was no faster than row by row: 1.0-1.3x on
 * grouped-query rows, bench/results/2026-12-03-decode-shared-ab-spr.txt */
#define DECODE_SHARED (VL >= 16)
/* With 8 lanes and a vocabulary that folds lane sums (AVX2), the rows of
 * a KV head share their reads as a small GEMM instead (decode_block_gemm);
 * row by row remains for cpu.portable and NEON. */
#if !DECODE_SHARED && VL == 8 && defined(V_PAIR_SUMS)
#define DECODE_GEMM 1
#else
#define DECODE_GEMM 0
#endif
#define DECODE_GEMM_ROWS 4 /* rows per register block of decode_block_gemm */

/* query rows per KV head up to which this path runs (see "Why" above) */
#define DECODE_ROWS (DECODE_GEMM ? 16 : 8)
#define DECODE_TASKS 16     /* fewer pieces than this: cut the keys too          */
#define DECODE_KEYS 256     /* at least this many keys per key chunk             */
#define DECODE_KEYS_ONE 64  /* the same with one row per KV head (see decode_run) */
#define DECODE_SLOTS 32     /* rows (of one or more KV heads) per task, at most   */
#ifndef V_UNROLL_WHOLE /* the vocabulary's hint for the rows' product loops */
#define V_UNROLL_WHOLE
#endif
#ifndef DECODE_PAIRS
#define DECODE_PAIR_DIMS VL /* no pair products: unused */
#endif

typedef struct decode_job {
    const sdpa_call *c;
    int64_t group;       /* query heads per KV head                           */
    int64_t rows;        /* rows per KV head: group * Sq                      */
    int64_t hg_len, n_hg; /* KV heads per task, and groups of them per batch  */
    int64_t n_kc;        /* chunks of keys per (batch, group of KV heads)     */
    int64_t kc_len;      /* keys per key chunk (a multiple of VL)             */
    int64_t Dp;          /* D rounded up to VL                                */
    int pf_rows;         /* rows decode_block_rows asks for per step          */
    int64_t k_bytes, v_bytes; /* a K and a V row in memory (what is prefetched) */
    int pairs;           /* DECODE_PAIRS products (bf16 Q, K, V in place)     */
    float *part;         /* n_kc > 1: partial results, [task][slot][Dp + 2]   */
    float *ws;           /* [threads][per-thread workspace]                   */
    size_t ws_floats;
} decode_job;

static int decode_applies(const sdpa_call *c)
{
    /* windows and block maps are flash_sparse.h's, whatever the rows */
    const int64_t rows = c->desc.Hq / c->desc.Hkv * c->desc.Sq;
    /* decode_block_gemm: up to 12 rows, 16 with one KV head. Against the
     * tiled path on a Zen 3, 9 rows took 0.69-0.75x the time, 16 rows of
     * one KV head 0.64-0.72x, but 12-16 rows of several KV heads
     * 0.89-1.34x, above 1.0 on 9 of 12 (f32 and bf16;
     * bench/results/2026-12-07-decode-gemm-rows16-ab-zen3.txt) */
    const int64_t most = DECODE_GEMM && c->desc.Hkv > 1 ? 12 : DECODE_ROWS;
    return rows <= most && !(c->mask && (c->mask->window || c->mask->blocks));
}

/* Row r of a KV head's rows: query head and query. */
static inline void decode_row(const decode_job *jb, int64_t hk, int64_t r, int64_t *h,
                              int64_t *i)
{
    *h = hk * jb->group + r / jb->c->desc.Sq, *i = r % jb->c->desc.Sq;
}

/* A row of D elements of t at (b, s, h) as f32: the tensor's own memory
 * when it is f32 with unit stride, else converted into `stage` (scaled by
 * mul when it is a query; keys and values come with mul = 1). */
static inline const float *decode_f32_row(const sdpa_tensor *t, int64_t b, int64_t s, int64_t h,
                                          int64_t D, float mul, float *stage)
{
    const void *src = sdpa__elem(t, sdpa__offset(t, b, s, h, 0));
    if (t->dtype == SDPA_F32 && t->stride[3] == 1 && mul == 1.0f)
        return src;
    sdpa__load_row(src, t->dtype, t->stride[3], D, mul, stage);
    return stage;
}

/* bf16 and f16 elements as floats where a vocabulary has no instruction
 * for them (cpu.portable; NEON for f16): core/convert.h's, one at a time */
#if !defined(V_LOAD_BF16) || !defined(V_LOAD_F16)
static inline vec decode_load_half_part(const uint16_t *p, int n, sdpa_dtype t)
{
    float x[VL];
    for (int i = 0; i < VL; i++)
        x[i] = i >= n ? 0.0f : t == SDPA_BF16 ? sdpa__bf16_to_f32(p[i]) : sdpa__f16_to_f32(p[i]);
    return V_LOAD(x);
}
#endif
#ifndef V_LOAD_BF16
#define V_LOAD_BF16(p) decode_load_half_part((p), VL, SDPA_BF16)
#define V_LOAD_BF16_PART(p, n) decode_load_half_part((p), (n), SDPA_BF16)
#endif
#ifndef V_LOAD_F16
#define V_LOAD_F16(p) decode_load_half_part((p), VL, SDPA_F16)
#define V_LOAD_F16_PART(p, n) decode_load_half_part((p), (n), SDPA_F16)
#endif

/* What K and V rows hold where the path reads them: f32 (the tensors' own
 * rows or rows converted into the workspace), or bf16 or f16 rows read in
 * place, converted as they are loaded. */
enum { KV_F32, KV_BF16, KV_F16 };

/* VL elements of a K or V row from d (kv: a constant where the callers are
 * inlined, so each loop has one kind). */
#define KV_LOAD(row, d, kv)                                                                  \
    ((kv) == KV_BF16  ? V_LOAD_BF16((const uint16_t *)(row) + (d))                          \
     : (kv) == KV_F16 ? V_LOAD_F16((const uint16_t *)(row) + (d))                           \
                      : V_LOAD((const float *)(row) + (d)))
#define KV_LOAD_PART(row, d, n, kv)                                                          \
    ((kv) == KV_BF16  ? V_LOAD_BF16_PART((const uint16_t *)(row) + (d), (n))                \
     : (kv) == KV_F16 ? V_LOAD_F16_PART((const uint16_t *)(row) + (d), (n))                 \
                      : V_LOAD_PART((const float *)(row) + (d), (n)))

/* VL dot products of q with VL key rows into one vector (lane j: q . k_j). */
static inline __attribute__((always_inline)) vec decode_dots(const float *q,
                                                             const void *const *k, int64_t D,
                                                             const int kv)
{
    vec acc[VL];
    for (int j = 0; j < VL; j++)
        acc[j] = V_ZERO();
    int64_t d = 0;
    for (; d + VL <= D; d += VL) {
        const vec qv = V_LOAD(q + d);
        for (int j = 0; j < VL; j++)
            acc[j] = V_FMA(qv, KV_LOAD(k[j], d, kv), acc[j]);
    }
    if (d < D) { /* the last part of the rows (their memory ends at D) */
        const vec qv = V_LOAD_PART(q + d, (int)(D - d));
        for (int j = 0; j < VL; j++)
            acc[j] = V_FMA(qv, KV_LOAD_PART(k[j], d, (int)(D - d), kv), acc[j]);
    }
    V_TRANSPOSE_REGS(acc); /* acc[i] lane j: element i of k_j's products */
    vec s = acc[0];
    for (int i = 1; i < VL; i++)
        s = V_ADD(s, acc[i]);
    return s;
}

/* The online softmax of one row (slot) over one block of VL keys [j0, j0 +
 * seen) whose scores are `sv` (lane j: key j0 + j): masks, the max and sum,
 * O rescaled when the max moves; p gets the weights. Returns the lanes
 * whose value rows the output reads. */
static inline unsigned decode_softmax_row(const decode_job *jb, int64_t b, int64_t hk, int r,
                                          int64_t j0, int seen, vec sv, float *o, float *m,
                                          float *l, float *p)
{
    const sdpa_call *c = jb->c;
    const int64_t Dp = jb->Dp;
    const sdpa_mask *mk = c->mask;
    const uint8_t *key = mk && mk->key ? mk->key + b * mk->key_stride[0] : NULL;
    float *s_buf = p;
    V_STORE(s_buf, sv);
    float bmax = -INFINITY;
    unsigned weighed = 0; /* lanes whose value rows the output reads */
    if (seen == VL && !key && !(mk && mk->general)) { /* every lane, no mask */
#ifdef V_REDUCE_MAX /* a chain of 16 scalar compares per row was 1/3 of the rows' time */
        bmax = V_REDUCE_MAX(sv);
#else
        for (int j = 0; j < VL; j++)
            bmax = s_buf[j] > bmax ? s_buf[j] : bmax; /* NaN: its p is NaN anyway */
#endif
        weighed = (1u << (VL - 1) << 1) - 1;
    } else {
        int64_t h = 0, i = 0;
        if (mk && mk->general)
            decode_row(jb, hk, r, &h, &i);
        for (int j = 0; j < VL; j++) {
            if (j >= seen || (key && !key[(j0 + j) * mk->key_stride[1]])) {
                s_buf[j] = -INFINITY;
                continue;
            }
            if (mk && mk->general)
                s_buf[j] =
                    sdpa__mask_general(mk, sdpa__mask_at(mk, b, h, i, j0 + j), s_buf[j]);
            if (s_buf[j] == -INFINITY)
                continue; /* hidden by the mask: weighs nothing, reads nothing */
            weighed |= 1u << j;
            bmax = s_buf[j] > bmax ? s_buf[j] : bmax;
        }
    }
    if (bmax > *m) { /* the max moved: rescale what the row holds */
        const float alpha = *m == -INFINITY ? 0.0f : expf(*m - bmax);
        const vec av = V_SET1(alpha);
        for (int64_t dd = 0; dd < Dp; dd += VL)
            V_STORE(o + dd, V_MUL(V_LOAD(o + dd), av));
        *l *= alpha;
        *m = bmax;
    }
    /* a row that saw only -inf keeps m = -inf: subtracting 0
     * keeps exp(-inf) = 0 rather than NaN */
    const float mu = *m == -INFINITY ? 0.0f : *m;
    const vec pv = V_EXP(V_SUB(V_LOAD(s_buf), V_SET1(mu)));
    V_STORE(s_buf, pv);
#ifdef V_REDUCE_ADD
    *l += V_REDUCE_ADD(pv);
#else
    float sum = 0.0f;
    for (int j = 0; j < VL; j++)
        sum += s_buf[j];
    *l += sum;
#endif
    return weighed;
}

/* O += sum_j p_j v_j over the lanes in `weighed` (of the first `seen`): only
 * the keys the row sees meet V, so a hidden key's NaN or Inf in v cannot
 * reach it (0 * Inf). */
static inline __attribute__((always_inline)) void
decode_pv_row(const decode_job *jb, float *orow, const float *p, unsigned weighed, int seen,
              const void *const *vrow, const int kv)
{
    const int64_t D = jb->c->desc.D;
    int64_t dd = 0;
    if (weighed == (1u << (VL - 1) << 1) - 1) { /* every lane: no test per key */
        for (; dd + VL <= D; dd += VL) {
            vec acc = V_LOAD(orow + dd);
            for (int j = 0; j < VL; j++)
                acc = V_FMA(V_SET1(p[j]), KV_LOAD(vrow[j], dd, kv), acc);
            V_STORE(orow + dd, acc);
        }
    }
    for (; dd + VL <= D; dd += VL) {
        vec acc = V_LOAD(orow + dd);
        for (int j = 0; j < seen; j++)
            if (weighed >> j & 1)
                acc = V_FMA(V_SET1(p[j]), KV_LOAD(vrow[j], dd, kv), acc);
        V_STORE(orow + dd, acc);
    }
    if (dd < D) {
        vec acc = V_LOAD(orow + dd);
        for (int j = 0; j < seen; j++)
            if (weighed >> j & 1)
                acc = V_FMA(V_SET1(p[j]), KV_LOAD_PART(vrow[j], dd, (int)(D - dd), kv), acc);
        V_STORE(orow + dd, acc);
    }
}

/* One row (slot) against one block of VL keys [j0, j0 + seen): scores,
 * the online softmax's max and sum, and O += P V. */
static inline __attribute__((always_inline)) void
decode_block_row(const decode_job *jb, int64_t b, int64_t hk, int r, int64_t j0, int seen,
                 const float *q, const void *const *krow, const void *const *vrow, float *o,
                 float *m, float *l, const int kv)
{
    float p[VL];
    const unsigned weighed = decode_softmax_row(
        jb, b, hk, r, j0, seen, decode_dots(q, krow, jb->c->desc.D, kv), o, m, l, p);
    decode_pv_row(jb, o, p, weighed, seen, vrow, kv);
}

/* The online softmax of rows 0 .. nr of a KV head (row r's scores acc[r],
 * lane j: key j0 + j), each as far as its limit; p[r] gets its weights,
 * weighed[r] the lanes its P V reads. Returns whether every row weighs
 * every lane (then P V runs the rows side by side). bf16_p: P is rounded
 * to bf16 next (decode_block_pairs), so the fast path's exponential is
 * the ISA file's V_EXP_BF16 (6 operations where V_EXP then took 13, now
 * 11; 0.98-0.99x a hot bf16 step of 8 rows per KV head against 1024-8192
 * keys, Zen 4, bench/results/2026-12-05-decode-pairs-exp-bf16-ab-zen4.txt).
 * The sum l is of P before its rounding, as everywhere. */
static inline __attribute__((always_inline)) int
decode_softmax_rows(const decode_job *jb, int64_t b, int64_t hk, const int nr, int64_t j0,
                    const int64_t *limit, const vec *acc, float *o, float *m, float *l,
                    float (*p)[VL], unsigned *weighed, const int bf16_p)
{
    (void)bf16_p; /* read where pair products exist and the path below is built */
    const sdpa_mask *mk = jb->c->mask;
    const int plain = !(mk && (mk->key || mk->general)); /* no lane hidden by a mask */
    const unsigned all = (1u << (VL - 1) << 1) - 1;
    int together = 1;
    for (int r = 0; r < nr; r++) {
        const int64_t ahead = limit[r] - j0;
        if (ahead <= 0) { /* this row sees none of these keys */
            weighed[r] = 0, together = 0;
            continue;
        }
        const int seen = ahead < VL ? (int)ahead : VL;
#if defined(V_REDUCE_MAX) && defined(V_REDUCE_ADD)
        /* Every lane seen and the row's max not moved (past a row's first
         * blocks, nearly always): decode_softmax_row's arithmetic, in
         * registers here; its call (every vector register saved around
         * it) was a sixth of a hot bf16 step. The rest goes to it. */
        if (plain && seen == VL && m[r] > -INFINITY) {
#ifdef V_ANY_ABOVE /* one compare for a reduction: with decode_block_pairs's zeroing,
                    * 0.93-0.94x a hot bf16 step of 8 rows per KV head (Zen 4,
                    * bench/results/2026-12-05-decode-softmax-compare-ab-zen4.txt) */
            if (!V_ANY_ABOVE(acc[r], m[r])) { /* NaN: not here */
#else
            const float bmax = V_REDUCE_MAX(acc[r]);
            if (bmax <= m[r]) { /* NaN: not here */
#endif
#ifdef DECODE_PAIRS /* P to be rounded to bf16: its exponential to that precision */
                const vec pv = bf16_p ? V_EXP_BF16(V_SUB(acc[r], V_SET1(m[r])))
                                      : V_EXP(V_SUB(acc[r], V_SET1(m[r])));
#else
                const vec pv = V_EXP(V_SUB(acc[r], V_SET1(m[r])));
#endif
                V_STORE(p[r], pv);
                l[r] += V_REDUCE_ADD(pv);
                weighed[r] = all;
                continue;
            }
        }
#else
        (void)plain;
#endif
        weighed[r] = decode_softmax_row(jb, b, hk, r, j0, seen, acc[r], o + r * jb->Dp, m + r,
                                        l + r, p[r]);
        together &= weighed[r] == all;
    }
    return together;
}

/* O += P V row by row, each over the lanes its mask and limit leave it
 * (decode_pv_row): the rows of a block that do not all weigh every key. */
static inline __attribute__((always_inline)) void
decode_pv_rows_alone(const decode_job *jb, const int nr, int64_t j0, const int64_t *limit,
                     float (*p)[VL], const unsigned *weighed, const void *const *vrow, float *o,
                     const int kv)
{
    for (int r = 0; r < nr; r++)
        if (weighed[r])
            decode_pv_row(jb, o + r * jb->Dp, p[r], weighed[r],
                          limit[r] - j0 < VL ? (int)(limit[r] - j0) : VL, vrow, kv);
}

/* Step st of a block's products asks for `per` of the rows in `pf` (VL
 * rows of `bytes` each, NULL: none), whole rows in memory order, into L1,
 * so that a block's rows have all been asked for when its last step ends
 * (per: decode_job.pf_rows, VL over the steps rounded up; a division here
 * was a tenth of the step's time). Step 0 of VL per step: all the rows at
 * once (decode_block_gemm). */
static inline __attribute__((always_inline)) void
decode_prefetch(const void *const *pf, int64_t st, int per, int64_t bytes)
{
    if (!pf)
        return;
    const int64_t j1 = (st + 1) * per < VL ? (st + 1) * per : VL;
    for (int64_t j = st * per; j < j1; j++)
        for (int64_t x = 0; x < bytes; x += 64)
            __builtin_prefetch((const char *)pf[j] + x, 0, 3);
}

/*
 * A task's K (or V) rows asked for in memory order (decode_block_gemm, where
 * a task reads every KV head of its keys: one contiguous range), a few lines
 * per step of the products, DECODE_STREAM_AHEAD key blocks ahead of the rows
 * they read. The blocks read one KV head's rows at a time, Hkv D elements
 * apart: an order the hardware prefetchers do not follow (in a throwaway
 * probe with the same arithmetic per line, reading a one-query 8:1 step's
 * rows in the blocks' order took 1.7x the time of reading them in memory
 * order, Zen 3). One-query 8:1 steps against 8192 keys: 0.90-0.96x the time
 * in f32, 0.98x in bf16 (whose arithmetic, not its reads, is the limit),
 * the other decode rows level (Zen 3, bench/results/2026-12-07-decode-
 * stream-ab-zen3.txt, with the runs that chose the variant). It replaces the
 * block-by-block prefetches there (both together: 1.10x the time of the
 * stream alone); 1 or 4 blocks ahead instead of 2: 0.97x and 1.04x, within
 * the host's noise (measured before the target's drift was fixed: see
 * decode_lines_advance); half the heads of each key per task (a segment per key):
 * 1.06x, so only whole ranges stream. Tasks of one KV head get none: with
 * one KV head in all (MQA) their rows are in memory order already; where
 * few keys make decode_run cut the heads across tasks it is not tried.
 * Addresses are kept as integers: the last lines may lie past the tensor.
 */
#define DECODE_STREAM_AHEAD 2
typedef struct decode_lines {
    uintptr_t next;   /* the next line to ask for */
    int64_t per;      /* lines per step of the products */
    int64_t block;    /* bytes one head block consumes (VL keys of one KV head) */
    int64_t advanced; /* bytes of the head blocks begun: the target, exactly */
    int64_t asked, target, total; /* lines asked for, up to where, in all */
} decode_lines;

typedef struct decode_stream {
    decode_lines k, v;
} decode_stream;

#if DECODE_GEMM
/* One step's lines, as far as the target allows. */
static inline __attribute__((always_inline)) void decode_lines_ask(decode_lines *s)
{
    int64_t n = s->target - s->asked;
    n = n < s->per ? n : s->per;
    if (n <= 0)
        return;
    s->asked += n;
    uintptr_t p = s->next;
    for (; n > 0; n--, p += 64)
        __builtin_prefetch((const void *)p, 0, 3);
    s->next = p;
}

/* A head block begins: the stream may run one block's bytes further. The
 * target follows the bytes, not a sum of rounded line counts: adding
 * lines rounded up per head block drifted 4 lines further ahead per key
 * block at 8:1, so that a task over 8192 keys asked for lines up to
 * 300 KB before their use, long evicted from L1 by then (with one worker
 * and the keys not cut, that call took 1.35x the time; batched 8:1 steps,
 * whose tasks stream every key, 1.06-1.12x: bench/results/2026-12-07-
 * decode-stream-drift-ab-zen3.txt). */
static inline void decode_lines_advance(decode_lines *s)
{
    s->advanced += s->block;
    const int64_t lines = (s->advanced + 63) / 64;
    s->target = lines < s->total ? lines : s->total;
}

/* t's rows of keys [k0, kmax) of KV heads [hk0, hk1) of batch b, one
 * contiguous range (every KV head of a key: decode_keys), as a stream
 * whose step is one of `steps` per head block. */
static void decode_lines_start(decode_lines *s, const sdpa_tensor *t, int64_t b, int64_t hk0,
                               int64_t hk1, int64_t k0, int64_t kmax, int steps)
{
    const int64_t key_bytes = t->stride[1] * sdpa__elem_bytes(t->dtype), keys = kmax - k0;
    const uintptr_t first = (uintptr_t)sdpa__elem(t, sdpa__offset(t, b, k0, hk0, 0));
    const int64_t off = (int64_t)(first % 64);
    const int64_t ahead = DECODE_STREAM_AHEAD * VL < keys ? DECODE_STREAM_AHEAD * VL : keys;
    const int64_t skipped = ahead * key_bytes / 64; /* lines the first blocks read */
    s->next = first - (uintptr_t)off + (uintptr_t)skipped * 64;
    s->total = (off + keys * key_bytes + 63) / 64 - skipped;
    s->block = VL * key_bytes / (hk1 - hk0); /* whole: key_bytes is the heads' rows */
    const int64_t lines = (s->block + 63) / 64 + 1; /* a block's lines, a boundary's too */
    s->per = (lines + steps - 1) / steps;
    s->advanced = s->asked = s->target = 0;
}
#endif

/* Where n rows of t at keys j0.. of head h of batch b start (rows past n:
 * the first one again), by the key stride, in bytes. */
static inline void decode_rows(const sdpa_tensor *t, int64_t b, int64_t j0, int n, int64_t h,
                               const void **rows)
{
    const char *base = sdpa__elem(t, sdpa__offset(t, b, j0, h, 0));
    const int64_t step = t->stride[1] * sdpa__elem_bytes(t->dtype);
    for (int j = 0; j < VL; j++)
        rows[j] = base + (j < n ? j : 0) * step;
}

/*
 * All rows of one KV head (2 to DECODE_ROWS of them: grouped-query heads,
 * a few queries) against one block of VL keys: the rows share every read.
 * K's block is transposed VL head dims at a time in registers (keys on
 * the lanes), and each transposed vector meets every row's broadcast q
 * element before the next, the rows' sums side by side in registers (a
 * transpose stored whole and read back ran 0.81-0.94x slower in f32 on 8
 * rows, Zen 4); and O += P V runs a V vector against every row's weight
 * before the next. Against a dot-product
 * transpose per row (decode_block_row) this is one transpose per block
 * instead of one per row, and V is read once instead of once per row.
 * Rows that see only part of the block, or whose masks hide keys, add
 * their P V alone (decode_pv_row: hidden keys never meet V).
 *
 * Half a block ahead, the rows are asked for (pf): while S runs, this
 * block's V rows; while P V runs, the K rows of the head block read next
 * (kpf). The block reads its 16 rows 64 bytes of each at a time, an order
 * in which a thread read DRAM at half the speed of reading row after row
 * and where the hardware prefetchers lag. Asked for row after row, half
 * a block (0.5-1 us of products) ahead, into L1, K and V from DRAM
 * (sdpa bench --cold) ran grouped-query and MQA one-query steps in
 * 0.70-0.87x the time in f32 and 0.54-0.83x in bf16 on Zen 4, and rows
 * already in L2/L3 0.64-1.06x (bench/results/2026-12-04-decode-prefetch-
 * ab-zen4.txt). Tried there and slower: this block's rows at its start,
 * 16 rows' lines a step in the order of the loads, into L2 (T1), one or
 * two head blocks ahead.
 */
static inline __attribute__((always_inline)) void
decode_block_rows(const decode_job *jb, int64_t b, int64_t hk, const int nr, int64_t j0,
                  const int64_t *limit, const float *q, const void *const *krow,
                  const void *const *vrow, const void *const *vpf, const void *const *kpf,
                  float *o, float *m, float *l, const int kv)
{
    const int64_t D = jb->c->desc.D, Dp = jb->Dp;
    vec acc[DECODE_ROWS];
V_UNROLL_WHOLE /* else GCC zeroes the array by REP STOSQ (decode_block_pairs) */
    for (int r = 0; r < nr; r++)
        acc[r] = V_ZERO();
    for (int64_t d = 0; d < D; d += VL) {
        vec t[VL];
        const int part = D - d < VL ? (int)(D - d) : VL;
        decode_prefetch(vpf, d / VL, jb->pf_rows, jb->v_bytes);
        for (int j = 0; j < VL; j++)
            t[j] = part == VL ? KV_LOAD(krow[j], d, kv) : KV_LOAD_PART(krow[j], d, part, kv);
        V_TRANSPOSE_REGS(t); /* t[i] lane j: element d + i of k_j */
        if (part == VL) { /* unrolled whole, so t stays in registers: GCC left a
                           * loop over `part` rolled once the prefetches were
                           * added, t went to the stack, bf16 steps 1.35x slower */
V_UNROLL_WHOLE
            for (int i = 0; i < VL; i++)
                for (int r = 0; r < nr; r++)
                    acc[r] = V_FMA(V_SET1(q[r * Dp + d + i]), t[i], acc[r]);
        } else {
            for (int i = 0; i < part; i++)
                for (int r = 0; r < nr; r++)
                    acc[r] = V_FMA(V_SET1(q[r * Dp + d + i]), t[i], acc[r]);
        }
    }
    float p[DECODE_ROWS][VL];
    unsigned weighed[DECODE_ROWS];
    const int together =
        decode_softmax_rows(jb, b, hk, nr, j0, limit, acc, o, m, l, p, weighed, 0);
    if (!together) {
        decode_pv_rows_alone(jb, nr, j0, limit, p, weighed, vrow, o, kv);
        return;
    }
    int64_t dd = 0;
    for (; dd < D; dd += VL) {
        const int part = D - dd < VL ? (int)(D - dd) : VL;
        decode_prefetch(kpf, dd / VL, jb->pf_rows, jb->k_bytes);
        vec out[DECODE_ROWS];
        for (int r = 0; r < nr; r++)
            out[r] = V_LOAD(o + r * Dp + dd);
        if (part == VL) { /* unrolled whole, as S's products above */
V_UNROLL_WHOLE
            for (int j = 0; j < VL; j++) {
                const vec vv = KV_LOAD(vrow[j], dd, kv);
                for (int r = 0; r < nr; r++)
                    out[r] = V_FMA(V_SET1(p[r][j]), vv, out[r]);
            }
        } else {
            for (int j = 0; j < VL; j++) {
                const vec vv = KV_LOAD_PART(vrow[j], dd, part, kv);
                for (int r = 0; r < nr; r++)
                    out[r] = V_FMA(V_SET1(p[r][j]), vv, out[r]);
            }
        }
        for (int r = 0; r < nr; r++)
            V_STORE(o + r * Dp + dd, out[r]);
    }
}

#if DECODE_GEMM
/* Scores of R rows (q, Dp apart) against VL = 8 keys, D on the lanes:
 * two keys at a time, each K vector meeting every row's q vector (R x 2
 * accumulators, 2 + R loads per 2R multiply-adds), each pair folded as it
 * ends, the four folded pairs summed into s[r] (lane j: key j). */
static inline __attribute__((always_inline)) void
decode_gemm_scores(const float *q, int64_t Dp, int64_t D, const int R, const void *const *krow,
                   vec *s, const int kv, decode_lines *ks)
{
    vec h[DECODE_GEMM_ROWS][VL / 2];
    for (int pr = 0; pr < VL / 2; pr++) {
        const void *k0 = krow[2 * pr], *k1 = krow[2 * pr + 1];
        vec a0[DECODE_GEMM_ROWS], a1[DECODE_GEMM_ROWS];
        for (int r = 0; r < R; r++)
            a0[r] = V_ZERO(), a1[r] = V_ZERO();
        int64_t d = 0;
        for (; d + VL <= D; d += VL) {
            const vec kv0 = KV_LOAD(k0, d, kv), kv1 = KV_LOAD(k1, d, kv);
            for (int r = 0; r < R; r++) {
                /* in a register: GCC otherwise folded the load into both
                 * multiply-adds, 2R + 2 loads instead of R + 2 (kept in a
                 * register: 0.73-0.97x the time of one-query grouped-query
                 * steps on a Zen 3; an A/B not committed) */
                vec qv = V_LOAD(q + r * Dp + d);
                V_IN_REGISTER(qv);
                a0[r] = V_FMA(qv, kv0, a0[r]), a1[r] = V_FMA(qv, kv1, a1[r]);
            }
        }
        if (d < D) { /* q too as a part: past D its workspace row holds anything */
            const int n = (int)(D - d);
            const vec kv0 = KV_LOAD_PART(k0, d, n, kv), kv1 = KV_LOAD_PART(k1, d, n, kv);
            for (int r = 0; r < R; r++) {
                const vec qv = V_LOAD_PART(q + r * Dp + d, n);
                a0[r] = V_FMA(qv, kv0, a0[r]), a1[r] = V_FMA(qv, kv1, a1[r]);
            }
        }
        for (int r = 0; r < R; r++)
            h[r][pr] = V_PAIR_SUMS(a0[r], a1[r]);
        if (ks)
            decode_lines_ask(ks);
    }
    for (int r = 0; r < R; r++)
        s[r] = V_SUMS_OF_PAIRS(h[r][0], h[r][1], h[r][2], h[r][3]);
}

/* O += P V for R rows (o and p: row r at o + r * Dp, p[r]), every row
 * weighing all VL keys: R x C vectors of O in registers, each V vector
 * meeting every row's weight. 4 x 2 rather than 4 x 3: with D = 128 the
 * columns then divide the row (4 x 3 left one column alone, its 4 chains
 * of 8 dependent multiply-adds waiting on latency), and a throwaway loop
 * of the same P V ran 4 x 2 at 85-90% of one core's FMA peak against
 * 69-70% for 4 x 3 (Zen 3; bench/results/2026-12-07-decode-gemm-tries-zen3.txt). Each weight is broadcast where it is used
 * (V_MADE_HERE): GCC otherwise broadcast all 32 once, kept them on the
 * stack and read one back for every multiply-add (1.02-1.03x the time).
 * One-query steps, 8 rows per KV head: 0.85-0.98x the time in f32,
 * 0.91-0.94x in bf16; 16 rows and D = 72 level (Zen 3,
 * bench/results/2026-12-07-decode-pv-cols-ab-zen3.txt). */
#define DECODE_GEMM_COLS 2
static inline __attribute__((always_inline)) void
decode_gemm_pv_cols(float *o, int64_t Dp, int64_t dd, const int R, const int C,
                    const float (*p)[VL], const void *const *vrow, const int kv)
{
    vec acc[DECODE_GEMM_ROWS][DECODE_GEMM_COLS];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            acc[r][c] = V_LOAD(o + r * Dp + dd + c * VL);
    for (int j = 0; j < VL; j++) {
        vec v[DECODE_GEMM_COLS];
        for (int c = 0; c < C; c++)
            v[c] = KV_LOAD(vrow[j], dd + c * VL, kv);
        for (int r = 0; r < R; r++) {
            vec pb = V_SET1(p[r][j]);
            V_MADE_HERE(pb);
            for (int c = 0; c < C; c++)
                acc[r][c] = V_FMA(pb, v[c], acc[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            V_STORE(o + r * Dp + dd + c * VL, acc[r][c]);
}

static inline __attribute__((always_inline)) void
decode_gemm_pv(float *o, int64_t Dp, int64_t D, const int R, const float (*p)[VL],
               const void *const *vrow, const int kv, decode_lines *vs)
{
    int64_t dd = 0;
    for (; dd + DECODE_GEMM_COLS * VL <= D; dd += DECODE_GEMM_COLS * VL) {
        decode_gemm_pv_cols(o, Dp, dd, R, DECODE_GEMM_COLS, p, vrow, kv);
        if (vs)
            decode_lines_ask(vs);
    }
    for (; dd + VL <= D; dd += VL)
        decode_gemm_pv_cols(o, Dp, dd, R, 1, p, vrow, kv);
    if (dd < D) { /* O's workspace row is Dp long and zero past D: V's part loads keep it so */
        const int n = (int)(D - dd);
        vec acc[DECODE_GEMM_ROWS];
        for (int r = 0; r < R; r++)
            acc[r] = V_LOAD(o + r * Dp + dd);
        for (int j = 0; j < VL; j++) {
            const vec vv = KV_LOAD_PART(vrow[j], dd, n, kv);
            for (int r = 0; r < R; r++)
                acc[r] = V_FMA(V_SET1(p[r][j]), vv, acc[r]);
        }
        for (int r = 0; r < R; r++)
            V_STORE(o + r * Dp + dd, acc[r]);
    }
}

/* fn(r0, R) for the register blocks of nr rows, R a constant at each call
 * (the remainders 3, 2, 1 below are those of blocks of 4) */
_Static_assert(DECODE_GEMM_ROWS == 4, "DECODE_GEMM_BLOCKS lists the remainders of 4");
#define DECODE_GEMM_BLOCKS(nr, fn)                                                           \
    for (int r0 = 0; r0 < (nr); r0 += DECODE_GEMM_ROWS) {                                    \
        if ((nr) - r0 >= DECODE_GEMM_ROWS)                                                   \
            fn(r0, DECODE_GEMM_ROWS);                                                        \
        else if ((nr) - r0 == 3)                                                             \
            fn(r0, 3);                                                                       \
        else if ((nr) - r0 == 2)                                                             \
            fn(r0, 2);                                                                       \
        else                                                                                 \
            fn(r0, 1);                                                                       \
    }

/*
 * All rows of one KV head (2 to DECODE_ROWS of them) against one block of
 * VL keys as a small GEMM, K and V read in place, for 8-lane vocabularies
 * that fold lane sums (AVX2): S = Q K^T with D on the lanes
 * (decode_gemm_scores: no transpose of K; each key's sums folded by
 * HADDs), the online softmax as decode_block_rows's, then O += P V with
 * a block of O in registers (decode_gemm_pv). Up to 4 rows share each K
 * and V load. decode_block_rows's way (K transposed, every product a
 * broadcast q element) was not faster with 8 lanes on a Zen 3 (0.94-1.15x
 * the time of row by row on one-query grouped-query steps), and row by row
 * ran P V as one chain of 8 dependent multiply-adds per O vector.
 * Prefetches: where a task reads every KV head of its keys, the stream of
 * decode_lines (memory order, a share per step: st); else the rows
 * decode_block_rows asks for, each set at once (this
 * block's V rows as it starts, the next head block's K rows after the
 * softmax; without them a one-query 8:1 step took 1.29x the time); K and
 * V 1-8 head blocks ahead instead, into L1 or L2, at once or spread over
 * the score steps, were level or slower there: 0.94-1.22x (these A/Bs
 * were not committed, nor the one above). Against row by row on a
 * Zen 3: 2-8 rows per KV head 0.66-1.10x the time in f32 (8:1 one-query
 * step against 8192 keys 0.90x), 0.65-0.82x in bf16 (K and V now read in
 * place), bench/results/2026-12-07-decode-gemm-ab-zen3.txt.
 */
static inline __attribute__((always_inline)) void
decode_block_gemm(const decode_job *jb, int64_t b, int64_t hk, const int nr, int64_t j0,
                  const int64_t *limit, const float *q, const void *const *krow,
                  const void *const *vrow, const void *const *vpf, const void *const *kpf,
                  float *o, float *m, float *l, const int kv, decode_stream *st)
{
    const int64_t D = jb->c->desc.D, Dp = jb->Dp;
    vec acc[DECODE_ROWS];
    decode_prefetch(vpf, 0, VL, jb->v_bytes); /* this block's V rows, read after the softmax */
#define GEMM_S(r0, R)                                                                        \
    decode_gemm_scores(q + (r0) * Dp, Dp, D, (R), krow, acc + (r0), kv, st ? &st->k : NULL)
    DECODE_GEMM_BLOCKS(nr, GEMM_S)
#undef GEMM_S
    float p[DECODE_ROWS][VL];
    unsigned weighed[DECODE_ROWS];
    const int together =
        decode_softmax_rows(jb, b, hk, nr, j0, limit, acc, o, m, l, p, weighed, 0);
    decode_prefetch(kpf, 0, VL, jb->k_bytes); /* the K rows of the head block read next */
    if (!together) {
        decode_pv_rows_alone(jb, nr, j0, limit, p, weighed, vrow, o, kv);
        return;
    }
#define GEMM_PV(r0, R)                                                                       \
    decode_gemm_pv(o + (r0) * Dp, Dp, D, (R), (const float(*)[VL])p[r0], vrow, kv,           \
                   st ? &st->v : NULL)
    DECODE_GEMM_BLOCKS(nr, GEMM_PV)
#undef GEMM_PV
}
#endif

#ifdef DECODE_PAIRS
/*
 * decode_block_rows with the ISA file's pair products (cpu.avx512bf16:
 * bf16 Q, K and V, VDPBF16PS; the ISA file says how). q holds row r's
 * pairs, unscaled (the scale meets S in fp32, as in pair mode's tiled
 * kernel), at qp + r * Dp; P is rounded to bf16 pairs for P V. O is in
 * the ISA file's pair order until decode_task puts it back.
 */
static inline __attribute__((always_inline)) void
decode_block_pairs(const decode_job *jb, int64_t b, int64_t hk, const int nr, int64_t j0,
                   const int64_t *limit, const uint32_t *qp, const void *const *krow,
                   const void *const *vrow, const void *const *vpf, const void *const *kpf,
                   float *o, float *m, float *l)
{
    const int64_t D = jb->c->desc.D, Dp = jb->Dp;
    vec acc[DECODE_ROWS];
V_UNROLL_WHOLE /* else GCC zeroes the array by REP STOSQ at every block */
    for (int r = 0; r < nr; r++)
        acc[r] = V_ZERO();
    for (int64_t d = 0; d < D; d += DECODE_PAIR_DIMS) {
        const int part = D - d < DECODE_PAIR_DIMS ? (int)(D - d) : DECODE_PAIR_DIMS;
        decode_prefetch(vpf, d / DECODE_PAIR_DIMS, jb->pf_rows, jb->v_bytes);
        decode_pairs_scores(krow, d, part, qp, Dp, nr, acc);
    }
    const vec scale = V_SET1((float)jb->c->scale);
    for (int r = 0; r < nr; r++)
        acc[r] = V_MUL(acc[r], scale);
    float p[DECODE_ROWS][VL];
    uint32_t pp[DECODE_ROWS][VL / 2];
    unsigned weighed[DECODE_ROWS];
    const int together =
        decode_softmax_rows(jb, b, hk, nr, j0, limit, acc, o, m, l, p, weighed, 1);
    for (int r = 0; r < nr; r++)
        if (weighed[r])
            decode_pairs_round(p[r], pp[r]);
    for (int64_t dd = 0; dd < D; dd += DECODE_PAIR_DIMS) {
        const int part = D - dd < DECODE_PAIR_DIMS ? (int)(D - dd) : DECODE_PAIR_DIMS;
        decode_prefetch(kpf, dd / DECODE_PAIR_DIMS, jb->pf_rows, jb->k_bytes);
        if (together)
            decode_pairs_pv(vrow, dd, part, 0xffffu, &pp[0][0], nr, o, Dp);
        else /* rows alone: hidden keys read as zeros, never meet V */
            for (int r = 0; r < nr; r++)
                if (weighed[r])
                    decode_pairs_pv(vrow, dd, part, weighed[r], pp[r], 1, o + r * Dp, Dp);
    }
}
#endif

/* One function per row count and row kind (the rows' sums stay in
 * registers with a constant count): inlined into decode_keys instead, their
 * 21-28 bodies made decode_task one function so large that compiling a
 * kernel's file took minutes under the sanitizers. A call per block of
 * 16 keys costs nothing measurable. */
#if DECODE_SHARED || DECODE_GEMM
typedef void decode_block_fn(const decode_job *jb, int64_t b, int64_t hk, int64_t j0,
                             const int64_t *limit, const float *q, const void *const *krow,
                             const void *const *vrow, const void *const *vpf,
                             const void *const *kpf, float *o, float *m, float *l,
                             decode_stream *st);
#if DECODE_GEMM
/* Per kind, one function for 8 rows and one for 4 (grouped-query 8:1 and
 * 4:1 decode steps), the count a constant; one for the other counts, read
 * at run time (the register blocks have a constant count of rows either
 * way). The constant 8 took 0.91-0.96x the time of the run-time count on
 * one query against 256-8192 keys (Zen 3, an A/B not committed); one
 * function per count from 2 to 16 took 30 s more to compile per build. */
#define DECODE_GEMM_FN(name, n, kind)                                                        \
    static __attribute__((noinline)) void decode_gemm_##name##_##kind(                       \
        const decode_job *jb, int64_t b, int64_t hk, int64_t j0, const int64_t *limit,       \
        const float *q, const void *const *krow, const void *const *vrow,                    \
        const void *const *vpf, const void *const *kpf, float *o, float *m, float *l,        \
        decode_stream *st)                                                                   \
    {                                                                                        \
        decode_block_gemm(jb, b, hk, (n), j0, limit, q, krow, vrow, vpf, kpf, o, m, l, kind,  \
                          st);                                                               \
    }
#define DECODE_GEMM_FNS(name, n)                                                             \
    DECODE_GEMM_FN(name, n, KV_F32) DECODE_GEMM_FN(name, n, KV_BF16)                         \
    DECODE_GEMM_FN(name, n, KV_F16)
DECODE_GEMM_FNS(4, 4)
DECODE_GEMM_FNS(8, 8)
DECODE_GEMM_FNS(any, (int)jb->rows)
#undef DECODE_GEMM_FNS
#undef DECODE_GEMM_FN

/* The function for nr rows of a kind (kv). */
static decode_block_fn *decode_block_for(int nr, int kv, int pairs)
{
    (void)pairs;
#define GEMM_KIND(name)                                                                      \
    (kv == KV_BF16  ? decode_gemm_##name##_KV_BF16                                           \
     : kv == KV_F16 ? decode_gemm_##name##_KV_F16                                            \
                    : decode_gemm_##name##_KV_F32)
    decode_block_fn *const fn = nr == 8 ? GEMM_KIND(8) : nr == 4 ? GEMM_KIND(4) : GEMM_KIND(any);
#undef GEMM_KIND
    return fn;
}
#else
#define DECODE_BLOCK_FN(n, kind)                                                             \
    static __attribute__((noinline)) void decode_block_##n##_##kind(                         \
        const decode_job *jb, int64_t b, int64_t hk, int64_t j0, const int64_t *limit,       \
        const float *q, const void *const *krow, const void *const *vrow,                    \
        const void *const *vpf, const void *const *kpf, float *o, float *m, float *l,        \
        decode_stream *st)                                                                   \
    {                                                                                        \
        (void)st;                                                                            \
        decode_block_rows(jb, b, hk, n, j0, limit, q, krow, vrow, vpf, kpf, o, m, l, kind);  \
    }
#ifdef DECODE_PAIRS
#define DECODE_PAIRS_FN(n)                                                                   \
    static __attribute__((noinline)) void decode_block_##n##_pairs(                          \
        const decode_job *jb, int64_t b, int64_t hk, int64_t j0, const int64_t *limit,       \
        const float *q, const void *const *krow, const void *const *vrow,                    \
        const void *const *vpf, const void *const *kpf, float *o, float *m, float *l,        \
        decode_stream *st)                                                                   \
    {                                                                                        \
        (void)st;                                                                            \
        decode_block_pairs(jb, b, hk, n, j0, limit, (const uint32_t *)q, krow, vrow, vpf,    \
                           kpf, o, m, l);                                                    \
    }
#else
#define DECODE_PAIRS_FN(n)
#endif
#define DECODE_FNS(n)                                                                        \
    DECODE_BLOCK_FN(n, KV_F32) DECODE_BLOCK_FN(n, KV_BF16) DECODE_BLOCK_FN(n, KV_F16)        \
    DECODE_PAIRS_FN(n)
DECODE_FNS(2)
DECODE_FNS(3)
DECODE_FNS(4)
DECODE_FNS(5)
DECODE_FNS(6)
DECODE_FNS(7)
DECODE_FNS(8)
#undef DECODE_FNS
#undef DECODE_PAIRS_FN
#undef DECODE_BLOCK_FN

/* The function for nr rows (2-8) of a kind (kv), or pair products. */
static decode_block_fn *decode_block_for(int nr, int kv, int pairs)
{
#ifdef DECODE_PAIRS
#define ROWS_CASE(n)                                                                         \
    case n:                                                                                  \
        return pairs ? decode_block_##n##_pairs                                              \
               : kv == KV_BF16 ? decode_block_##n##_KV_BF16                                  \
               : kv == KV_F16  ? decode_block_##n##_KV_F16                                   \
                               : decode_block_##n##_KV_F32;
#else
#define ROWS_CASE(n)                                                                         \
    case n:                                                                                  \
        return (void)pairs, kv == KV_BF16 ? decode_block_##n##_KV_BF16                       \
                            : kv == KV_F16 ? decode_block_##n##_KV_F16                       \
                                           : decode_block_##n##_KV_F32;
#endif
    switch (nr) {
        ROWS_CASE(2)
        ROWS_CASE(3)
        ROWS_CASE(4)
        ROWS_CASE(5)
        ROWS_CASE(6)
        ROWS_CASE(7)
        ROWS_CASE(8)
    }
#undef ROWS_CASE
    return NULL;
}
#endif
#endif

/* The rows of KV heads [hk0, hk1) of batch b against keys [k0, kmax), VL
 * at a time, every head's rows of a key block before the next block. kv:
 * what the rows hold (KV_BF16, KV_F16: read in place; KV_F32: f32 rows
 * read in place or rows of any dtype converted into the workspace at kst). */
static inline __attribute__((always_inline)) void
decode_keys(const decode_job *jb, int64_t b, int64_t hk0, int64_t hk1, int64_t k0, int64_t kmax,
            const int64_t *limit, const float *q, float *o, float *m, float *l, float *kst,
            const int kv)
{
    const sdpa_call *c = jb->c;
    const int64_t D = c->desc.D, Dp = jb->Dp;
    const int nr = (int)jb->rows;
    float *vst = kst + VL * Dp;
    const void *krow[VL], *vrow[VL];
    /* rows read where they are: bf16 and f16 (kv), f32 with unit stride */
    const int unit = c->k->stride[3] == 1 && c->v->stride[3] == 1;
    const int f32_rows = kv == KV_F32 && unit && c->k->dtype == SDPA_F32 &&
                         c->v->dtype == SDPA_F32;
    const int in_place_rows = kv != KV_F32 || f32_rows; /* else converted into kst, vst */
    /* decode_block_rows's prefetches: rows with unit stride only (a row
     * is then D elements of memory); this block's V rows are vrow itself
     * (converted rows were read by their conversion: only K's next ones) */
    const void *kpf[VL];
    const int fetch = (DECODE_SHARED || DECODE_GEMM) && nr > 1 && unit;
#if DECODE_SHARED || DECODE_GEMM
    decode_block_fn *const block = nr > 1 ? decode_block_for(nr, kv, jb->pairs) : NULL;
#endif
    decode_stream *st = NULL;
    (void)st; /* used where the blocks are built (DECODE_SHARED, DECODE_GEMM) */
#if DECODE_GEMM
    decode_stream stream;
    /* the stream (above) where the task reads all of several KV heads'
     * rows, side by side in memory (one contiguous range), and P V has full
     * column blocks (its steps) */
    const int64_t kb = c->k->stride[1] * sdpa__elem_bytes(c->k->dtype);
    const int64_t vb = c->v->stride[1] * sdpa__elem_bytes(c->v->dtype);
    if (block && in_place_rows && hk1 - hk0 > 1 && c->k->stride[2] == D &&
        c->v->stride[2] == D && D >= DECODE_GEMM_COLS * VL &&
        kb == (hk1 - hk0) * jb->k_bytes && vb == (hk1 - hk0) * jb->v_bytes) {
        const int blocks = (nr + DECODE_GEMM_ROWS - 1) / DECODE_GEMM_ROWS;
        decode_lines_start(&stream.k, c->k, b, hk0, hk1, k0, kmax, VL / 2 * blocks);
        decode_lines_start(&stream.v, c->v, b, hk0, hk1, k0, kmax,
                           (int)(D / (DECODE_GEMM_COLS * VL)) * blocks);
        st = &stream;
    }
#endif
    for (int64_t j0 = k0; j0 < kmax; j0 += VL) {
        const int nk = (int)(kmax - j0 < VL ? kmax - j0 : VL);
        for (int64_t hk = hk0; hk < hk1; hk++) {
            /* the head block read after this one: (j0, hk + 1), or the next
             * keys' first head */
            const int64_t nj = hk + 1 < hk1 ? j0 : j0 + VL, nh = hk + 1 < hk1 ? hk + 1 : hk0;
            const int nn = (int)(kmax - nj < VL ? kmax - nj : VL);
            if (fetch && nn > 0)
                decode_rows(c->k, b, nj, nn, nh, kpf);
            if (in_place_rows) { /* past the keys: lanes computed on, then hidden */
                decode_rows(c->k, b, j0, nk, hk, krow);
                decode_rows(c->v, b, j0, nk, hk, vrow);
            } else {
                for (int j = 0; j < nk; j++) {
                    krow[j] = decode_f32_row(c->k, b, j0 + j, hk, D, 1.0f, kst + j * Dp);
                    vrow[j] = decode_f32_row(c->v, b, j0 + j, hk, D, 1.0f, vst + j * Dp);
                }
                for (int j = nk; j < VL; j++)
                    krow[j] = krow[0], vrow[j] = vrow[0];
            }
            const int sl0 = (int)(hk - hk0) * nr;
#if DECODE_SHARED || DECODE_GEMM
            if (block) { /* 2 to DECODE_ROWS rows sharing each read */
#if DECODE_GEMM
                if (st) /* the stream instead of the block-by-block prefetches */
                    decode_lines_advance(&st->k), decode_lines_advance(&st->v);
#endif
                block(jb, b, hk, j0, limit, q + sl0 * Dp, krow, vrow,
                      !st && fetch && in_place_rows ? vrow : NULL,
                      !st && fetch && nn > 0 ? kpf : NULL, o + sl0 * Dp, m + sl0, l + sl0, st);
                continue;
            }
#endif
            for (int r = 0; r < nr; r++) {
                const int64_t ahead = limit[r] - j0;
                const int sl = sl0 + r;
                if (ahead > 0) /* else this row sees none of these keys */
                    decode_block_row(jb, b, hk, r, j0, ahead < VL ? (int)ahead : VL, q + sl * Dp,
                                     krow, vrow, o + sl * Dp, m + sl, l + sl, kv);
            }
        }
    }
}

/* One task: the rows of KV heads [hk0, hk1) of batch b against keys
 * [k0, k1). Slot s = (hk - hk0) * rows + r holds row r of head hk. */
static void decode_task(void *arg, int64_t task, int worker)
{
    const decode_job *jb = arg;
    const sdpa_call *c = jb->c;
    const sdpa_call_desc *d = &c->desc;
    const int64_t D = d->D, Dp = jb->Dp;
    const int64_t kc = task % jb->n_kc, g = task / jb->n_kc % jb->n_hg;
    const int64_t b = task / jb->n_kc / jb->n_hg, hk0 = g * jb->hg_len;
    const int64_t hk1 = hk0 + jb->hg_len < d->Hkv ? hk0 + jb->hg_len : d->Hkv;
    const int nr = (int)jb->rows, slots = (int)(hk1 - hk0) * nr;
    int64_t len_q, len_kv;
    sdpa__seq_lens(c, b, &len_q, &len_kv);
    const int64_t k0 = kc * jb->kc_len;
    const int64_t k1 = k0 + jb->kc_len < len_kv ? k0 + jb->kc_len : len_kv;
    /* the workspace: Q rows, O rows, m, l, VL converted K and V rows */
    float *w = jb->ws + jb->ws_floats * (size_t)worker;
    float *q = w, *o = q + DECODE_SLOTS * Dp, *m = o + DECODE_SLOTS * Dp, *l = m + DECODE_SLOTS;
    float *kst = l + DECODE_SLOTS; /* VL converted K and V rows (decode_keys) */
    int64_t limit[DECODE_ROWS]; /* keys row r sees, whatever its head: [0, limit) */
    int64_t kmax = k0;
    for (int r = 0; r < nr; r++) {
        const int64_t i = r % d->Sq;
        limit[r] = i < len_q ? sdpa_causal_visible_keys(c->causal, i, len_q, len_kv) : 0;
        if (limit[r] > k1)
            limit[r] = k1;
        kmax = limit[r] > kmax ? limit[r] : kmax;
    }
    for (int sl = 0; sl < slots; sl++) {
        int64_t h, i;
        decode_row(jb, hk0 + sl / nr, sl % nr, &h, &i);
        if (jb->pairs) { /* the bf16 row as it is, zeros past D (pairs: Dp / 2 words) */
            memset(q + sl * Dp, 0, sizeof(float) * (size_t)Dp / 2);
            memcpy(q + sl * Dp, sdpa__elem(c->q, sdpa__offset(c->q, b, i, h, 0)),
                   sizeof(uint16_t) * (size_t)D);
        } else {
            const float *src = decode_f32_row(c->q, b, i, h, D, (float)c->scale, q + sl * Dp);
            if (src != q + sl * Dp)
                memcpy(q + sl * Dp, src, sizeof(float) * (size_t)D);
        }
        m[sl] = -INFINITY, l[sl] = 0.0f;
        memset(o + sl * Dp, 0, sizeof(float) * (size_t)Dp);
    }
    /* bf16 and f16 K and V with unit stride are read where they are when
     * each element is widened once: one row per KV head, or the rows side
     * by side (a conversion pass into the workspace and back made bf16
     * steps against 256-8192 keys 1.3-1.6x slower), or in decode_block_gemm's
     * blocks of 4 rows (each element widened once per block: one-query
     * bf16 steps with 8 rows per KV head 0.71-0.88x the time of converting
     * each row first, Zen 3); row by row, 2-8 rows would widen each
     * element 2-8 times (AVX2: 1.2-1.3x slower than converting once), so
     * there the rows are converted (decode_f32_row) */
    const int in_place = c->k->dtype == c->v->dtype && c->k->stride[3] == 1 &&
                         c->v->stride[3] == 1 && (DECODE_SHARED || DECODE_GEMM || nr == 1);
    if (in_place && c->k->dtype == SDPA_BF16)
        decode_keys(jb, b, hk0, hk1, k0, kmax, limit, q, o, m, l, kst, KV_BF16);
    else if (in_place && c->k->dtype == SDPA_F16)
        decode_keys(jb, b, hk0, hk1, k0, kmax, limit, q, o, m, l, kst, KV_F16);
    else
        decode_keys(jb, b, hk0, hk1, k0, kmax, limit, q, o, m, l, kst, KV_F32);
#ifdef DECODE_PAIRS
    for (int sl = 0; jb->pairs && sl < slots; sl++)
        decode_pairs_order(o + sl * Dp, Dp);
#endif
    if (jb->n_kc > 1) { /* partial results, merged in decode_merge */
        float *p = jb->part + (size_t)task * (size_t)(DECODE_SLOTS * (Dp + 2));
        for (int sl = 0; sl < slots; sl++) {
            memcpy(p + sl * (Dp + 2), o + sl * Dp, sizeof(float) * (size_t)Dp);
            p[sl * (Dp + 2) + Dp] = m[sl], p[sl * (Dp + 2) + Dp + 1] = l[sl];
        }
        return;
    }
    for (int sl = 0; sl < slots; sl++) {
        int64_t h, i;
        decode_row(jb, hk0 + sl / nr, sl % nr, &h, &i);
        sdpa__store_result(c, b, i, h, o + sl * Dp, m[sl], i < len_q ? l[sl] : 0.0f, 0);
    }
}

/* The key chunks' partial results of one (batch, group of KV heads),
 * merged in chunk order: O = sum_c O_c e^(m_c - M), l likewise. */
static void decode_merge(void *arg, int64_t piece, int worker)
{
    const decode_job *jb = arg;
    const sdpa_call *c = jb->c;
    const int64_t Dp = jb->Dp, stride = DECODE_SLOTS * (Dp + 2);
    const int64_t b = piece / jb->n_hg, hk0 = piece % jb->n_hg * jb->hg_len;
    const int64_t hk1 = hk0 + jb->hg_len < c->desc.Hkv ? hk0 + jb->hg_len : c->desc.Hkv;
    const int nr = (int)jb->rows, slots = (int)(hk1 - hk0) * nr;
    float *o = jb->ws + jb->ws_floats * (size_t)worker;
    int64_t len_q, len_kv;
    sdpa__seq_lens(c, b, &len_q, &len_kv);
    const float *first = jb->part + (size_t)(piece * jb->n_kc) * (size_t)stride;
    for (int sl = 0; sl < slots; sl++) {
        float mx = -INFINITY;
        for (int64_t kc = 0; kc < jb->n_kc; kc++) {
            const float mc = first[kc * stride + sl * (Dp + 2) + Dp];
            mx = mc > mx ? mc : mx;
        }
        float l = 0.0f;
        memset(o, 0, sizeof(float) * (size_t)Dp);
        for (int64_t kc = 0; kc < jb->n_kc; kc++) {
            const float *p = first + kc * stride + sl * (Dp + 2);
            const float lc = p[Dp + 1];
            if (lc == 0.0f)
                continue; /* a chunk that saw none of this row's keys */
            const float w = expf(p[Dp] - mx); /* NaN m: NaN, as it should */
            const vec wv = V_SET1(w);
            for (int64_t dd = 0; dd < Dp; dd += VL)
                V_STORE(o + dd, V_FMA(V_LOAD(p + dd), wv, V_LOAD(o + dd)));
            l += lc * w;
        }
        int64_t h, i;
        decode_row(jb, hk0 + sl / nr, sl % nr, &h, &i);
        sdpa__store_result(c, b, i, h, o, mx, i < len_q ? l : 0.0f, 0);
    }
}

static sdpa_status decode_run(const sdpa_backend *self, const sdpa_call *c)
{
    const sdpa_call_desc *d = &c->desc;
    decode_job jb;
    memset(&jb, 0, sizeof jb);
    jb.c = c;
    jb.group = d->Hq / d->Hkv;
    jb.rows = jb.group * d->Sq;
    jb.Dp = (d->D + VL - 1) / VL * VL;
#ifdef DECODE_PAIRS /* bf16 Q, K and V with unit stride, rows side by side */
    jb.pairs = jb.rows > 1 && c->q->dtype == SDPA_BF16 && c->k->dtype == SDPA_BF16 &&
               c->v->dtype == SDPA_BF16 && c->q->stride[3] == 1 && c->k->stride[3] == 1 &&
               c->v->stride[3] == 1;
#endif
    const int64_t step = jb.pairs ? DECODE_PAIR_DIMS : VL; /* head dims per step */
    if (jb.pairs)
        jb.Dp = (d->D + step - 1) / step * step;
    jb.pf_rows = (int)((VL + jb.Dp / step - 1) / (jb.Dp / step));
    jb.k_bytes = d->D * sdpa__elem_bytes(c->k->dtype); /* rows in their own dtype */
    jb.v_bytes = d->D * sdpa__elem_bytes(c->v->dtype);
    /* KV heads per task: with a head's keys a row of all heads apart (BSHD),
     * a task takes every head's row of a key before the next key, so that
     * its reads run along memory, page after page (up to DECODE_SLOTS rows:
     * their Q and O stay in L1/L2); with each head's keys together, one
     * head per task */
    const int heads_inner = c->k->stride[2] < c->k->stride[1];
    jb.hg_len = heads_inner ? DECODE_SLOTS / jb.rows : 1;
    jb.hg_len = jb.hg_len < d->Hkv ? jb.hg_len : d->Hkv;
    jb.n_hg = (d->Hkv + jb.hg_len - 1) / jb.hg_len;
    int64_t pieces = d->B * jb.n_hg;
    jb.n_kc = 1;
    if (pieces < DECODE_TASKS) { /* few pieces, many keys: cut the keys */
        /* With one row per KV head (no grouped-query sharing) a task's
         * heads are what keeps its reads along memory: cutting them (below)
         * turns 8 KB runs of a key's heads into 2 KB ones. Shorter key
         * chunks first: one query against 256 keys and 32 heads, bf16, ran
         * 1.6x faster with 8 heads x 64 keys per task than with 2 x 256
         * (Sapphire Rapids VM; bench/results/2026-12-03-decode-chunks-*).
         * With grouped-query rows the rows share each read and the
         * chunks' merges cost more than they save. */
        const int64_t want = (DECODE_TASKS + pieces - 1) / pieces;
        const int64_t most = d->Skv / (jb.rows == 1 ? DECODE_KEYS_ONE : DECODE_KEYS);
        jb.n_kc = want < most ? want : most < 1 ? 1 : most;
    }
    jb.kc_len = ((d->Skv + jb.n_kc - 1) / jb.n_kc + VL - 1) / VL * VL;
    jb.n_kc = (d->Skv + jb.kc_len - 1) / jb.kc_len;
    if (jb.n_kc < 1)
        jb.n_kc = 1;
    if (pieces * jb.n_kc < DECODE_TASKS && jb.n_hg < d->Hkv) { /* still few: cut the heads */
        const int64_t want = (DECODE_TASKS + d->B * jb.n_kc - 1) / (d->B * jb.n_kc);
        jb.n_hg = want < d->Hkv ? want : d->Hkv;
        jb.hg_len = (d->Hkv + jb.n_hg - 1) / jb.n_hg;
        jb.n_hg = (d->Hkv + jb.hg_len - 1) / jb.hg_len;
        pieces = d->B * jb.n_hg;
    }
    int share, shares;
    const int is_share = sdpa__pool_share_of(c->pool, &share, &shares);
    sdpa_pool *pool = sdpa__pool_for_call(c); /* small calls: the calling thread alone */
    const int threads = sdpa__pool_workers(pool);
    jb.ws_floats = (size_t)(2 * DECODE_SLOTS * jb.Dp + 2 * DECODE_SLOTS + 2 * VL * jb.Dp + 16);
    const int64_t tasks = pieces * jb.n_kc;
    const size_t part = jb.n_kc > 1 ? (size_t)tasks * (size_t)(DECODE_SLOTS * (jb.Dp + 2)) : 0;
    const size_t bytes = sizeof(float) * (jb.ws_floats * (size_t)threads + part);
    float *mem = sdpa__scratch(bytes);
    if (!mem)
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes for few queries",
                          self->name, bytes);
    jb.ws = mem;
    jb.part = part ? mem + jb.ws_floats * (size_t)threads : NULL;
    if (is_share) { /* the pieces this share owns, each with its merge: no barrier */
        for (int64_t p = share; p < pieces; p += shares) {
            for (int64_t kc = 0; kc < jb.n_kc; kc++)
                decode_task(&jb, p * jb.n_kc + kc, 0);
            if (jb.n_kc > 1)
                decode_merge(&jb, p, 0);
        }
    } else {
        sdpa__parallel_for(pool, tasks, decode_task, &jb);
        if (jb.n_kc > 1)
            sdpa__parallel_for(pool, pieces, decode_merge, &jb);
    }
    sdpa__scratch_release(mem);
    return SDPA_OK;
}

#endif
