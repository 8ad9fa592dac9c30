/*
 * test_sp.c - libsdpa_mpi against single-process attention, run by CTest
 * under mpirun with 1 to 4 ranks. Every rank builds the same full inputs
 * (rank 0's seed, broadcast), runs its shard through sdpa_mpi_forward and
 * compares its rows of O and of the LSE with `ref` on the whole call.
 * Cases: every grid the rank count allows (ring, Ulysses, USP); uneven
 * splits (101 rows) and an explicit split with an empty shard; GQA (KV
 * heads split, and replicated when ulysses > Hkv); cross-attention; both
 * causal alignments (rows that see no key included); f32 and bf16 inputs;
 * a bf16 output; the zigzag split (two ranges per rank, copied out);
 * random block maps (broadcast without bits, per batch entry and head with
 * bits) with shard edges inside and on the map's blocks. Then the
 * refusals: ranks that disagree on the shape all
 * get INVALID_ARGUMENT (no hang), a degree that does not divide the heads
 * is refused with the degrees that work, a wrong local size names it.
 *
 * Links only the public libraries (libsdpa.so, libsdpa_mpi.so): the test
 * harness of the other tests carries its own copy of the core.
 */
#define _GNU_SOURCE /* dlfcn */
#include "sdpa_mpi.h"
#include "mpi_check.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int rank, size, passed, failed;
static uint64_t rng;

static float uniform(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static float *fill(size_t n)
{
    float *x = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++)
        x[i] = uniform();
    return x;
}

static double get(const void *p, sdpa_dtype t, size_t i)
{
    if (t == SDPA_F32)
        return ((const float *)p)[i];
    float f;
    sdpa_convert((const uint16_t *)p + i, t, &f, SDPA_F32, 1);
    return f;
}

typedef struct spcase {
    int U, R;
    int64_t B, Sq, Skv, Hq, Hkv, D;
    sdpa_dtype dtype, out_dtype;
    sdpa_causal causal;
    const int64_t *q_counts; /* or NULL */
    int zigzag;
    int map; /* a random block map over the global positions: 1 without bits, 2 with */
} spcase;

/* A random 64 x 64 block map (half the blocks hidden, the rest FULL or
 * PARTIAL; rows with nothing among them), the same on every rank (the
 * broadcast seed): per batch entry and per head for maps with bits,
 * broadcast for the others. */
typedef struct spmap {
    sdpa_block_map m;
    int32_t *fc, *fi, *pc, *pi;
    uint64_t *bits;
} spmap;

static void spmap_make(spmap *t, const spcase *c)
{
    sdpa_block_map *m = &t->m;
    memset(t, 0, sizeof *t);
    m->block_q = m->block_kv = 64;
    m->batch = c->map == 2 ? c->B : 1, m->heads = c->map == 2 ? c->Hq : 1;
    m->q_blocks = (c->Sq + 63) / 64, m->kv_blocks = (c->Skv + 63) / 64;
    m->index_stride = m->kv_blocks;
    const int64_t rows = m->batch * m->heads * m->q_blocks, words = 64;
    t->fc = calloc((size_t)rows, sizeof(int32_t)), t->pc = calloc((size_t)rows, sizeof(int32_t));
    t->fi = calloc((size_t)(rows * m->index_stride), sizeof(int32_t));
    t->pi = calloc((size_t)(rows * m->index_stride), sizeof(int32_t));
    if (c->map == 2)
        t->bits = calloc((size_t)(rows * m->index_stride * words), sizeof(uint64_t));
    for (int64_t r = 0; r < rows; r++)
        for (int32_t kb = 0; kb < m->kv_blocks; kb++) {
            const float x = uniform();
            if (x < 0.0f)
                continue;
            if (x < 0.5f) {
                t->fi[r * m->index_stride + t->fc[r]++] = kb;
                continue;
            }
            const int64_t n = t->pc[r]++;
            t->pi[r * m->index_stride + n] = kb;
            for (int64_t w = 0; t->bits && w < words; w++)
                for (int bit = 0; bit < 64; bit++)
                    if (uniform() < 0.4f)
                        t->bits[(r * m->index_stride + n) * words + w] |= (uint64_t)1 << bit;
        }
    m->full_count = t->fc, m->full_index = t->fi;
    m->partial_count = t->pc, m->partial_index = t->pi, m->partial_bits = t->bits;
}

static void spmap_free(spmap *t) { free(t->fc), free(t->fi), free(t->pc), free(t->pi), free(t->bits); }

/* A rank's rows under zigzag are two ranges: copied out of the full
 * tensor [B, S, H, D] (es bytes an element) into [B, total, H, D]. */
static void *take_rows(const void *src, size_t es, int64_t B, int64_t S, int64_t H, int64_t D,
                       const int64_t f[2], const int64_t n[2])
{
    const int64_t total = n[0] + n[1], w = H * D;
    char *dst = malloc(es * (size_t)(B * (total ? total : 1) * w));
    for (int64_t b = 0; b < B; b++)
        for (int64_t li = 0, g = 0; g < 2; g++)
            for (int64_t i = 0; i < n[g]; i++, li++)
                memcpy(dst + es * (size_t)((b * total + li) * w),
                       (const char *)src + es * (size_t)((b * S + f[g] + i) * w), es * (size_t)w);
    return dst;
}

/* The global row of local row li. */
static int64_t global_row(const int64_t f[2], const int64_t n[2], int64_t li)
{
    return li < n[0] ? f[0] + li : f[1] + li - n[0];
}

static void run_case(sdpa_context *ctx, const spcase *c)
{
    char what[160];
    snprintf(what, sizeof what, "P=%d U=%d R=%d B=%lld Sq=%lld Skv=%lld Hq=%lld Hkv=%lld %s->%s %s%s%s%s",
             size, c->U, c->R, (long long)c->B, (long long)c->Sq, (long long)c->Skv,
             (long long)c->Hq, (long long)c->Hkv, sdpa_dtype_name(c->dtype),
             sdpa_dtype_name(c->out_dtype), sdpa_causal_name(c->causal),
             c->q_counts ? " explicit split" : "", c->zigzag ? " zigzag" : "",
             c->map == 1 ? " map" : c->map == 2 ? " map with bits, per head" : "");
    spmap map;
    sdpa_mask mask = SDPA_MASK_DEFAULT;
    if (c->map) {
        spmap_make(&map, c);
        mask.blocks = &map.m;
    }
    const size_t es = c->dtype == SDPA_F32 ? 4 : 2, oes = c->out_dtype == SDPA_F32 ? 4 : 2;
    const size_t nq = (size_t)(c->B * c->Sq * c->Hq * c->D), nk = (size_t)(c->B * c->Skv * c->Hkv * c->D);
    float *qf = fill(nq), *kf = fill(nk), *vf = fill(nk);
    void *q = qf, *k = kf, *v = vf;
    if (c->dtype != SDPA_F32) { /* narrowed in place: the front half holds the values */
        sdpa_convert(qf, SDPA_F32, q, c->dtype, nq), sdpa_convert(kf, SDPA_F32, k, c->dtype, nk);
        sdpa_convert(vf, SDPA_F32, v, c->dtype, nk);
    }
    sdpa_tensor tq = sdpa_tensor_bshd(q, c->dtype, c->B, c->Sq, c->Hq, c->D);
    sdpa_tensor tk = sdpa_tensor_bshd(k, c->dtype, c->B, c->Skv, c->Hkv, c->D);
    sdpa_tensor tv = sdpa_tensor_bshd(v, c->dtype, c->B, c->Skv, c->Hkv, c->D);
    float *want = malloc(sizeof(float) * nq), *want_lse = malloc(sizeof(float) * (size_t)(c->B * c->Hq * c->Sq));
    sdpa_tensor tw = sdpa_tensor_bshd(want, SDPA_F32, c->B, c->Sq, c->Hq, c->D);
    sdpa_params prm = SDPA_PARAMS_DEFAULT;
    prm.backend = "ref", prm.causal = c->causal, prm.mask = c->map ? &mask : NULL;
    CHECK(sdpa_forward(ctx, &tq, &tk, &tv, &tw, want_lse, &prm) == SDPA_OK, "%s: ref: %s", what,
          sdpa_last_error());
    sdpa_mpi_shape shape = {c->B, c->Sq, c->Skv, c->Hq, c->Hkv, c->D, c->dtype, c->causal,
                            c->zigzag};
    sdpa_mpi_plan *plan;
    sdpa_status st = sdpa_mpi_plan_create(MPI_COMM_WORLD, c->U, c->R, &shape, c->q_counts, NULL,
                                          &plan);
    CHECK(st == SDPA_OK, "%s: plan: %s", what, sdpa_mpi_last_error());
    if (st != SDPA_OK)
        goto done;
    int64_t rq_f[2], rq_n[2], rk_f[2], rk_n[2];
    const int nr = sdpa_mpi_ranges(plan, -1, 0, rq_f, rq_n);
    sdpa_mpi_ranges(plan, -1, 1, rk_f, rk_n);
    CHECK(nr == (c->zigzag ? 2 : 1), "%s: %d ranges", what, nr);
    const int64_t qn = rq_n[0] + rq_n[1], kn = rk_n[0] + rk_n[1], q0 = rq_f[0];
    /* this rank's rows: views into the full inputs (one range), or copies */
    sdpa_tensor lq = tq, lk = tk, lv = tv;
    void *cq = NULL, *ck = NULL, *cv = NULL;
    if (nr == 1) {
        lq.data = (char *)q + q0 * tq.stride[1] * (int64_t)es, lq.size[1] = qn;
        lk.data = (char *)k + rk_f[0] * tk.stride[1] * (int64_t)es, lk.size[1] = kn;
        lv.data = (char *)v + rk_f[0] * tv.stride[1] * (int64_t)es, lv.size[1] = kn;
    } else {
        cq = take_rows(q, es, c->B, c->Sq, c->Hq, c->D, rq_f, rq_n);
        ck = take_rows(k, es, c->B, c->Skv, c->Hkv, c->D, rk_f, rk_n);
        cv = take_rows(v, es, c->B, c->Skv, c->Hkv, c->D, rk_f, rk_n);
        lq = sdpa_tensor_bshd(cq, c->dtype, c->B, qn ? qn : 1, c->Hq, c->D);
        lk = sdpa_tensor_bshd(ck, c->dtype, c->B, kn ? kn : 1, c->Hkv, c->D);
        lv = sdpa_tensor_bshd(cv, c->dtype, c->B, kn ? kn : 1, c->Hkv, c->D);
    }
    void *out = malloc(oes * (size_t)(c->B * (qn ? qn : 1) * c->Hq * c->D));
    float *lse = malloc(sizeof(float) * (size_t)(c->B * c->Hq * (qn ? qn : 1)));
    sdpa_tensor lo = sdpa_tensor_bshd(out, c->out_dtype, c->B, qn ? qn : 1, c->Hq, c->D);
    sdpa_params sp = SDPA_PARAMS_DEFAULT;
    sp.mask = c->map ? &mask : NULL;
    st = sdpa_mpi_forward(plan, ctx, qn ? &lq : NULL, kn ? &lk : NULL, kn ? &lv : NULL,
                          qn ? &lo : NULL, lse, &sp);
    CHECK(st == SDPA_OK, "%s: forward: %s", what, sdpa_mpi_last_error());
    if (st == SDPA_OK) {
        double worst = 0, worst_lse = 0;
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t i = 0; i < qn; i++)
                for (int64_t h = 0; h < c->Hq; h++) {
                    for (int64_t d = 0; d < c->D; d++) {
                        const double g = get(out, c->out_dtype, (size_t)(((b * qn + i) * c->Hq + h) * c->D + d));
                        const double w = want[((b * c->Sq + global_row(rq_f, rq_n, i)) * c->Hq + h) * c->D + d];
                        const double e = fabs(g - w);
                        worst = e > worst || e != e ? (e != e ? INFINITY : e) : worst;
                    }
                    const double gl = lse[(b * c->Hq + h) * qn + i];
                    const double wl = want_lse[(b * c->Hq + h) * c->Sq + global_row(rq_f, rq_n, i)];
                    const double e = isinf(gl) || isinf(wl) ? (gl == wl ? 0 : INFINITY) : fabs(gl - wl);
                    worst_lse = e > worst_lse || e != e ? (e != e ? INFINITY : e) : worst_lse;
                }
        /* bf16 inputs go to a bf16-product kernel (P rounded to bf16: 2 x 2^-8) */
        const double tol = c->out_dtype == SDPA_BF16 || c->dtype == SDPA_BF16 ? 8e-3 : 2e-5;
        CHECK(worst <= tol && worst_lse <= 1e-4, "%s: rows %lld..%lld: |out - ref| %.3g, |lse - ref| %.3g",
              what, (long long)q0, (long long)(q0 + qn), worst, worst_lse);
    }
    free(out), free(lse), free(cq), free(ck), free(cv);
    sdpa_mpi_plan_destroy(plan);
done:
    free(qf), free(kf), free(vf), free(want), free(want_lse);
    if (c->map)
        spmap_free(&map);
}

/* Joint attention: every query also attends T replicated text keys, passed
 * apart (sdpa_mpi_forward_joint), against ref over [text; image] keys. */
static void joint_case(sdpa_context *ctx, int U, int R)
{
    const int64_t B = 2, Sq = 61, Skv = 61, T = 13, Hq = 12, Hkv = U == 3 ? 3 : 2, D = 16;
    char what[96];
    snprintf(what, sizeof what, "joint P=%d U=%d R=%d T=%lld", size, U, R, (long long)T);
    float *q = fill((size_t)(B * Sq * Hq * D));
    float *k = fill((size_t)(B * (T + Skv) * Hkv * D)), *v = fill((size_t)(B * (T + Skv) * Hkv * D));
    float *want = malloc(sizeof(float) * (size_t)(B * Sq * Hq * D));
    sdpa_tensor tq = sdpa_tensor_bshd(q, SDPA_F32, B, Sq, Hq, D);
    sdpa_tensor tk = sdpa_tensor_bshd(k, SDPA_F32, B, T + Skv, Hkv, D);
    sdpa_tensor tv = sdpa_tensor_bshd(v, SDPA_F32, B, T + Skv, Hkv, D);
    sdpa_tensor tw = sdpa_tensor_bshd(want, SDPA_F32, B, Sq, Hq, D);
    sdpa_params prm = SDPA_PARAMS_DEFAULT;
    prm.backend = "ref";
    CHECK(sdpa_forward(ctx, &tq, &tk, &tv, &tw, NULL, &prm) == SDPA_OK, "%s: ref", what);
    sdpa_mpi_shape shape = {B, Sq, Skv, Hq, Hkv, D, SDPA_F32, SDPA_CAUSAL_NONE, 0};
    sdpa_mpi_plan *plan;
    if (sdpa_mpi_plan_create(MPI_COMM_WORLD, U, R, &shape, NULL, NULL, &plan) != SDPA_OK) {
        CHECK(0, "%s: plan: %s", what, sdpa_mpi_last_error());
        return;
    }
    int64_t q0, qn, k0, kn;
    sdpa_mpi_rows(plan, -1, 0, &q0, &qn);
    sdpa_mpi_rows(plan, -1, 1, &k0, &kn);
    sdpa_tensor kj = tk, vj = tv, lq = tq, lk = tk, lv = tv; /* views: text rows, then image */
    kj.size[1] = vj.size[1] = T;
    lq.data = q + q0 * tq.stride[1], lq.size[1] = qn;
    lk.data = k + (T + k0) * tk.stride[1], lk.size[1] = kn;
    lv.data = v + (T + k0) * tv.stride[1], lv.size[1] = kn;
    float *out = malloc(sizeof(float) * (size_t)(B * (qn ? qn : 1) * Hq * D));
    sdpa_tensor lo = sdpa_tensor_bshd(out, SDPA_F32, B, qn ? qn : 1, Hq, D);
    sdpa_status st = sdpa_mpi_forward_joint(plan, ctx, qn ? &lq : NULL, kn ? &lk : NULL,
                                            kn ? &lv : NULL, &kj, &vj, qn ? &lo : NULL, NULL,
                                            NULL);
    CHECK(st == SDPA_OK, "%s: %s", what, sdpa_mpi_last_error());
    double worst = 0;
    for (int64_t b = 0; st == SDPA_OK && b < B; b++)
        for (int64_t i = 0; i < qn; i++)
            for (int64_t e = 0; e < Hq * D; e++) {
                const double d = fabs(out[(b * qn + i) * Hq * D + e] - want[(b * Sq + q0 + i) * Hq * D + e]);
                worst = d > worst || d != d ? (d != d ? INFINITY : d) : worst;
            }
    CHECK(worst <= 2e-5, "%s: |out - ref over text + image| %.3g", what, worst);
    sdpa_mpi_plan_destroy(plan);
    free(q), free(k), free(v), free(want), free(out);
}

static void refusals(sdpa_context *ctx)
{
    /* ranks disagree: rank 0 says Sq = 64, the others 65; all must fail */
    sdpa_mpi_shape s = {1, rank == 0 ? 64 : 65, 64, 4, 4, 16, SDPA_F32, SDPA_CAUSAL_NONE, 0};
    sdpa_mpi_plan *plan = (sdpa_mpi_plan *)1;
    sdpa_status st = sdpa_mpi_plan_create(MPI_COMM_WORLD, 1, size, &s, NULL, NULL, &plan);
    if (size > 1)
        CHECK(st == SDPA_INVALID_ARGUMENT && plan == NULL &&
                  strstr(sdpa_mpi_last_error(), "ranks disagree on Sq (values 64 to 65)"),
              "disagreeing ranks: %s", sdpa_mpi_last_error());
    else if (st == SDPA_OK) /* one rank agrees with itself */
        sdpa_mpi_plan_destroy(plan);
    /* a ulysses degree that does not divide the heads */
    sdpa_mpi_shape h3 = {1, 64, 64, 3, 3, 16, SDPA_F32, SDPA_CAUSAL_NONE, 0};
    if (size > 1 && 3 % size != 0) {
        st = sdpa_mpi_plan_create(MPI_COMM_WORLD, size, 1, &h3, NULL, NULL, &plan);
        CHECK(st == SDPA_INVALID_ARGUMENT && strstr(sdpa_mpi_last_error(), "degrees that work"),
              "bad degree: %s", sdpa_mpi_last_error());
    }
    st = sdpa_mpi_plan_create(MPI_COMM_WORLD, 1, size + 1, &h3, NULL, NULL, &plan);
    CHECK(st == SDPA_INVALID_ARGUMENT && strstr(sdpa_mpi_last_error(), "communicator's size"),
          "grid larger than the communicator: %s", sdpa_mpi_last_error());
    /* a wrong local size on one rank: every rank fails, the wrong one says why */
    sdpa_mpi_shape ok = {1, 64, 64, 4, 4, 16, SDPA_F32, SDPA_CAUSAL_NONE, 0};
    /* zigzag makes its own split: explicit counts with it are refused */
    sdpa_mpi_shape zz = {1, 64, 64, 4, 4, 16, SDPA_F32, SDPA_CAUSAL_TOP_LEFT, 1};
    int64_t counts[4] = {64, 0, 0, 0};
    st = sdpa_mpi_plan_create(MPI_COMM_WORLD, 1, size, &zz, counts, NULL, &plan);
    CHECK(st == SDPA_INVALID_ARGUMENT && strstr(sdpa_mpi_last_error(), "zigzag"),
          "zigzag with counts: %s", sdpa_mpi_last_error());
    if (sdpa_mpi_plan_create(MPI_COMM_WORLD, 1, size, &ok, NULL, NULL, &plan) == SDPA_OK) {
        int64_t q0, qn;
        sdpa_mpi_rows(plan, -1, 0, &q0, &qn);
        static float buf[64 * 4 * 16], o[64 * 4 * 16];
        const int64_t bad = rank == size - 1 ? qn + 1 : qn;
        sdpa_tensor t = sdpa_tensor_bshd(buf, SDPA_F32, 1, bad, 4, 16);
        sdpa_tensor to = sdpa_tensor_bshd(o, SDPA_F32, 1, qn, 4, 16);
        st = sdpa_mpi_forward(plan, ctx, &t, &t, &t, &to, NULL, NULL);
        CHECK(st == SDPA_INVALID_ARGUMENT, "a wrong local size: %d", (int)st);
        if (rank == size - 1)
            CHECK(strstr(sdpa_mpi_last_error(), "q->size[1]") != NULL, "names q: %s",
                  sdpa_mpi_last_error());
        /* masks: only a block map, of the call's shape */
        uint8_t keys[64];
        memset(keys, 1, sizeof keys);
        sdpa_mask km = SDPA_MASK_DEFAULT;
        km.key = keys;
        sdpa_params kp = SDPA_PARAMS_DEFAULT;
        kp.mask = &km;
        sdpa_tensor tg = sdpa_tensor_bshd(buf, SDPA_F32, 1, qn, 4, 16);
        st = sdpa_mpi_forward(plan, ctx, &tg, &tg, &tg, &to, NULL, &kp);
        CHECK(st == SDPA_INVALID_ARGUMENT &&
                  strstr(sdpa_mpi_last_error(), "params->mask sets key; sequence parallelism "
                                                "takes only mask->blocks"),
              "a key mask: %s", sdpa_mpi_last_error());
        int32_t cnt[1] = {1}, idx[1] = {0};
        sdpa_block_map bm = {64, 64, 1, 3, 1, 1, 1, cnt, idx, NULL, NULL, NULL};
        sdpa_mask mm = SDPA_MASK_DEFAULT;
        mm.blocks = &bm;
        kp.mask = &mm;
        st = sdpa_mpi_forward(plan, ctx, &tg, &tg, &tg, &to, NULL, &kp);
        CHECK(st == SDPA_INVALID_ARGUMENT &&
                  strstr(sdpa_mpi_last_error(), "mask->blocks->heads is 3, expected 1 "
                                                "(broadcast) or Hq = 4"),
              "a map with 3 heads: %s", sdpa_mpi_last_error());
        bm.heads = 1, bm.q_blocks = 2;
        st = sdpa_mpi_forward(plan, ctx, &tg, &tg, &tg, &to, NULL, &kp);
        CHECK(st == SDPA_INVALID_ARGUMENT &&
                  strstr(sdpa_mpi_last_error(), "mask->blocks->q_blocks is 2, expected 1"),
              "a map of the wrong length: %s", sdpa_mpi_last_error());
        bm.q_blocks = 1;
        sdpa_params mixed = SDPA_PARAMS_DEFAULT; /* a map on rank 0 only */
        mixed.mask = rank == 0 ? &mm : NULL;
        st = sdpa_mpi_forward(plan, ctx, &tg, &tg, &tg, &to, NULL, &mixed);
        if (size > 1)
            CHECK(st == SDPA_INVALID_ARGUMENT &&
                      strstr(sdpa_mpi_last_error(), "given on some ranks and not on others"),
                  "a map on one rank: %s", sdpa_mpi_last_error());
        /* device tensors are staged through the host: without a GPU (or with
         * a bogus pointer) the first copy fails, on every rank together */
        sdpa_tensor dq = sdpa_tensor_bshd((void *)(uintptr_t)0x1000, SDPA_F32, 1, qn, 4, 16);
        dq.device.kind = SDPA_DEVICE_CUDA;
        sdpa_tensor dout = dq;
        st = sdpa_mpi_forward(plan, ctx, &dq, &dq, &dq, &dout, NULL, NULL);
        CHECK((st == SDPA_DEVICE_ERROR && strstr(sdpa_mpi_last_error(), "staging")) ||
                  (st == SDPA_NOT_AVAILABLE && strstr(sdpa_mpi_last_error(), "CUDA runtime")) ||
                  (st != SDPA_OK && strstr(sdpa_mpi_last_error(), "rank")),
              "device tensors without a device: %d %s", (int)st, sdpa_mpi_last_error());
        /* device and host memory mixed: refused on every rank */
        sdpa_tensor th = sdpa_tensor_bshd(buf, SDPA_F32, 1, qn, 4, 16);
        st = sdpa_mpi_forward(plan, ctx, &dq, &th, &th, &to, NULL, NULL);
        if (qn > 0)
            CHECK(st == SDPA_INVALID_ARGUMENT && strstr(sdpa_mpi_last_error(), "mix device and host"),
                  "mixed memory: %s", sdpa_mpi_last_error());
        /* a device tensor whose heads are not contiguous cannot be staged by rows */
        sdpa_tensor ds = dq;
        ds.stride[2] = 32, ds.stride[1] = 4 * 32;
        st = sdpa_mpi_forward(plan, ctx, &ds, &dq, &dq, &dout, NULL, NULL);
        CHECK(st != SDPA_OK, "strided device tensor: %d", (int)st);
        if (qn > 0)
            CHECK(strstr(sdpa_mpi_last_error(), "contiguous heads") != NULL, "names it: %s",
                  sdpa_mpi_last_error());
        sdpa_mpi_plan_destroy(plan);
    }
}

/*
 * Device tensors on real device memory, where a CUDA device is (a GPU
 * machine; elsewhere the refusals above cover the staging path): a ring
 * over the ranks with q, k, v and out in cudaMalloc'ed memory (staged
 * through the host by libsdpa_mpi) must give what the same plan gives on
 * host tensors, bit for bit. The CUDA runtime is dlopened, as libsdpa_mpi
 * itself does, so this test links no CUDA.
 */
static void device_case(sdpa_context *ctx)
{
    int (*get_count)(int *) = NULL, (*set_device)(int) = NULL;
    int (*dmalloc)(void **, size_t) = NULL, (*dfree)(void *) = NULL;
    int (*dcopy)(void *, const void *, size_t, int) = NULL;
    static const char *const names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
    void *h = NULL;
    for (size_t i = 0; i < sizeof names / sizeof *names && !h; i++)
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    int devices = 0;
    if (h) {
        *(void **)&get_count = dlsym(h, "cudaGetDeviceCount");
        *(void **)&set_device = dlsym(h, "cudaSetDevice");
        *(void **)&dmalloc = dlsym(h, "cudaMalloc");
        *(void **)&dfree = dlsym(h, "cudaFree");
        *(void **)&dcopy = dlsym(h, "cudaMemcpy");
        if (!get_count || !set_device || !dmalloc || !dfree || !dcopy || get_count(&devices) != 0)
            devices = 0;
    }
    int everywhere = 0; /* every rank must have a device, or none runs it */
    MPI_Allreduce(&devices, &everywhere, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (everywhere < 1) {
        if (rank == 0)
            printf("SKIP device tensors on device memory: %s\n",
                   h ? "no CUDA device here" : "no CUDA runtime (libcudart) here");
        if (h)
            dlclose(h);
        return;
    }
    set_device(rank % devices);
    sdpa_mpi_shape sh = {1, 96, 96, 4, 2, 32, SDPA_F32, SDPA_CAUSAL_NONE, 0};
    sdpa_mpi_plan *plan = NULL;
    if (sdpa_mpi_plan_create(MPI_COMM_WORLD, 1, size, &sh, NULL, NULL, &plan) != SDPA_OK) {
        CHECK(0, "device case: plan: %s", sdpa_mpi_last_error());
        dlclose(h);
        return;
    }
    int64_t q0, qn, k0, kn;
    sdpa_mpi_rows(plan, -1, 0, &q0, &qn);
    sdpa_mpi_rows(plan, -1, 1, &k0, &kn);
    const size_t nq = (size_t)(qn * sh.Hq * sh.D), nk = (size_t)(kn * sh.Hkv * sh.D);
    rng = 12345 + (uint64_t)rank;
    float *q = fill(nq ? nq : 1), *k = fill(nk ? nk : 1), *v = fill(nk ? nk : 1);
    float *oh = calloc(nq ? nq : 1, sizeof(float)), *od = calloc(nq ? nq : 1, sizeof(float));
    void *dq = NULL, *dk = NULL, *dv = NULL, *dout = NULL;
    int ok = dmalloc(&dq, 4 * (nq ? nq : 1)) == 0 && dmalloc(&dk, 4 * (nk ? nk : 1)) == 0 &&
             dmalloc(&dv, 4 * (nk ? nk : 1)) == 0 && dmalloc(&dout, 4 * (nq ? nq : 1)) == 0 &&
             dcopy(dq, q, 4 * nq, 1) == 0 && dcopy(dk, k, 4 * nk, 1) == 0 &&
             dcopy(dv, v, 4 * nk, 1) == 0;
    CHECK(ok, "device case: device memory on rank %d", rank);
    sdpa_tensor tq = sdpa_tensor_bshd(q, SDPA_F32, 1, qn ? qn : 1, sh.Hq, sh.D);
    sdpa_tensor tk = sdpa_tensor_bshd(k, SDPA_F32, 1, kn ? kn : 1, sh.Hkv, sh.D);
    sdpa_tensor tv = sdpa_tensor_bshd(v, SDPA_F32, 1, kn ? kn : 1, sh.Hkv, sh.D);
    sdpa_tensor to = sdpa_tensor_bshd(oh, SDPA_F32, 1, qn ? qn : 1, sh.Hq, sh.D);
    sdpa_status st = sdpa_mpi_forward(plan, ctx, qn ? &tq : NULL, kn ? &tk : NULL,
                                      kn ? &tv : NULL, qn ? &to : NULL, NULL, NULL);
    CHECK(st == SDPA_OK, "device case: host run: %s", sdpa_mpi_last_error());
    sdpa_tensor gq = tq, gk = tk, gv = tv, go = to;
    gq.data = dq, gk.data = dk, gv.data = dv, go.data = dout;
    gq.device = gk.device = gv.device = go.device = (sdpa_device){SDPA_DEVICE_CUDA, rank % devices};
    st = sdpa_mpi_forward(plan, ctx, qn ? &gq : NULL, kn ? &gk : NULL, kn ? &gv : NULL,
                          qn ? &go : NULL, NULL, NULL);
    CHECK(st == SDPA_OK, "device case: device run: %s", sdpa_mpi_last_error());
    if (st == SDPA_OK && ok && nq) {
        CHECK(dcopy(od, dout, 4 * nq, 2) == 0, "device case: copying the output back");
        CHECK(memcmp(od, oh, 4 * nq) == 0, "device case: device and host outputs differ on rank %d",
              rank);
    }
    dfree(dq), dfree(dk), dfree(dv), dfree(dout);
    free(q), free(k), free(v), free(oh), free(od);
    sdpa_mpi_plan_destroy(plan);
    dlclose(h);
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    uint64_t seed = (uint64_t)time(NULL) * 2654435761u;
    const char *env = getenv("SDPA_TEST_SEED");
    if (env)
        seed = strtoull(env, NULL, 10);
    MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("seed %llu (repeat with SDPA_TEST_SEED=%llu), %d ranks\n", (unsigned long long)seed,
               (unsigned long long)seed, size);
    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    o.threads = 1, o.ignore_env = 1;
    sdpa_context *ctx;
    if (sdpa_context_create(&o, &ctx) != SDPA_OK)
        return 1;
    int grids[3][2], ng = 0;
    grids[ng][0] = 1, grids[ng][1] = size, ng++; /* ring */
    if (size > 1)
        grids[ng][0] = size, grids[ng][1] = 1, ng++; /* Ulysses (12 heads: any size here) */
    if (size == 4)
        grids[ng][0] = 2, grids[ng][1] = 2, ng++; /* USP */
    int64_t uneven[4] = {40, 0, 50, 11};
    for (int g = 0; g < ng; g++) {
        const int U = grids[g][0], R = grids[g][1];
        for (int causal = 0; causal <= 2; causal++) {
            rng = seed + (uint64_t)(g * 10 + causal);
            /* GQA: 2 KV heads (split by 2, replicated by 4), 3 when ulysses is 3 */
            const int64_t hkv = U == 3 ? 3 : 2;
            spcase c = {U, R, 2, 101, 101, 12, hkv, 32, SDPA_F32, SDPA_F32, (sdpa_causal)causal,
                        NULL, 0, 0};
            run_case(ctx, &c);
            c.Sq = 50, c.Skv = 77, c.dtype = SDPA_BF16; /* cross; bf16 in */
            run_case(ctx, &c);
            c.Sq = 77, c.Skv = 50, c.dtype = SDPA_F32, c.out_dtype = SDPA_BF16, c.Hkv = 1; /* Sq > Skv */
            run_case(ctx, &c);
            if (size == 4) {
                spcase e = {U, R, 1, 101, 101, 4, 4, 16, SDPA_F32, SDPA_F32, (sdpa_causal)causal,
                            uneven, 0, 0};
                run_case(ctx, &e);
            }
            /* the zigzag split: self (odd length), and cross with more keys */
            spcase z = {U, R, 2, 101, 101, 12, hkv, 32, SDPA_F32, SDPA_F32, (sdpa_causal)causal,
                        NULL, 1, 0};
            run_case(ctx, &z);
            z.Sq = 50, z.Skv = 77, z.dtype = SDPA_BF16;
            run_case(ctx, &z);
            /* block maps: shard edges inside the map's blocks (101 rows),
             * on them (256 rows: 64-row blocks), zigzag, cross */
            spcase mp = {U, R, 2, 101, 101, 12, hkv, 32, SDPA_F32, SDPA_F32,
                         (sdpa_causal)causal, NULL, 0, 1 + causal % 2};
            run_case(ctx, &mp);
            mp.Sq = mp.Skv = 256, mp.map = 2 - causal % 2;
            run_case(ctx, &mp);
            mp.Sq = 150, mp.Skv = 201, mp.zigzag = 1, mp.dtype = SDPA_BF16;
            run_case(ctx, &mp);
        }
    }
    for (int g = 0; g < ng; g++)
        joint_case(ctx, grids[g][0], grids[g][1]);
    refusals(ctx);
    device_case(ctx);
    sdpa_context_destroy(ctx);
    int counts[2] = {passed, failed}, total[2];
    MPI_Reduce(counts, total, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("%d passed, %d failed, 0 skipped (all ranks)\n", total[0], total[1]);
    MPI_Bcast(total, 2, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Finalize();
    return total[1] ? 1 : 0;
}
