/*
 * forward.c - libsdpa_mpi (include/sdpa_mpi.h): Ulysses, ring
 * and USP attention on the caller's communicator. Only libsdpa's public
 * API is used (sdpa_forward with the LSE, sdpa_merge), so any LSE-capable
 * backend does the local work and the core stays free of MPI; memory comes
 * from the core's allocation funnel (alloc.h), built in, for fault tests.
 *
 * One forward, on the rank (u, r) of a ulysses x ring grid:
 *   1. Ulysses (ulysses > 1): an all-to-all in the group of r turns the
 *      group's sequence shards into all its rows for Hq/ulysses heads (and
 *      the KV heads that serve them), packed contiguous.
 *   2. Ring (ring > 1): the group's K/V blocks travel around the ring of
 *      the ranks with the same u; each step posts the next block's receive
 *      and send, computes the visiting block, merges it into a float32
 *      accumulator, then waits. Causal is decided per block from global
 *      positions: a block entirely visible runs unmasked, one entirely
 *      hidden is skipped, the diagonal runs causal (top-left, bottom-right
 *      or, for any other offset, a boolean mask of that block).
 *   3. Ulysses back: the all-to-all in reverse, then one cast to out.
 * Volume per rank: Ulysses about 4 S H D / P elements, ring 2 S/R
 * Hkv/U D; see shared/notes/sequence-parallel.md.
 */
#include "sp_internal.h"
#include "device_staging.h"
#include "../core/causal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Rows [0, n) of batch entry b, heads [h0, h0 + nh) of a contiguous
 * [B, n, heads, D] block: a strided view. */
static sdpa_tensor view(void *p, sdpa_dtype dtype, int64_t n, int64_t heads, int64_t D, int64_t b,
                        int64_t h0, int64_t nh)
{
    sdpa_tensor t = sdpa_tensor_bshd(p, dtype, 1, n, heads, D);
    t.data = (char *)p + (b * n * heads + h0) * D * (int64_t)sp_esize(dtype);
    t.size[2] = nh;
    return t;
}

/* Pieces a visiting block's attention is cut into while ring messages are
 * in flight, so that MPI_Testall runs between them: an MPI without an
 * asynchronous progress thread (TCP, most shared-memory transports for
 * large messages) moves rendezvous data only inside MPI calls. */
enum { PIECES = 4 };

/*
 * The attention of the group's queries with one visiting K/V block, merged
 * into (acc, lacc). d: key j of the block is visible to query i when
 * j <= i + d (causal only). With ring requests pending (nreq > 0) the work
 * runs per batch entry and group of heads, testing them in between.
 */
/* Device buffers of a forward on CUDA tensors (device_staging.h): a
 * block's q, k and v go in, its output and LSE come out. */
typedef struct device_bufs {
    void *q, *k, *v, *o;
    float *lse;
    int ordinal;
} device_bufs;

/* The block's attention on the device: inputs copied in, sdpa_forward on
 * device tensors (the context's CUDA backends), output and LSE copied to
 * tmp and ltmp on the host. */
static sdpa_status device_block(sdpa_context *ctx, const sdpa_mpi_plan *p, const device_bufs *db,
                                const segment *q, const void *k, const void *v, int64_t nk,
                                int64_t hq, int64_t hk, float *tmp, float *ltmp,
                                const sdpa_params *prm)
{
    const sdpa_mpi_shape *s = &p->s;
    const size_t es = sp_esize(s->dtype), nqb = es * (size_t)(s->B * q->n * hq * s->D),
                 nkb = es * (size_t)(s->B * nk * hk * s->D);
    char why[300];
    sdpa_status st = sp_cuda_copy(db->q, nqb, q->data, nqb, nqb, 1, 1, why, sizeof why);
    if (st == SDPA_OK)
        st = sp_cuda_copy(db->k, nkb, k, nkb, nkb, 1, 1, why, sizeof why);
    if (st == SDPA_OK)
        st = sp_cuda_copy(db->v, nkb, v, nkb, nkb, 1, 1, why, sizeof why);
    if (st != SDPA_OK)
        return sp_fail(st, "sdpa_mpi_forward: %s", why);
    const sdpa_device dev = {SDPA_DEVICE_CUDA, db->ordinal};
    sdpa_tensor tq = sp_block(db->q, s->dtype, s->B, q->n, hq, s->D);
    sdpa_tensor tk = sp_block(db->k, s->dtype, s->B, nk, hk, s->D);
    sdpa_tensor tv = sp_block(db->v, s->dtype, s->B, nk, hk, s->D);
    sdpa_tensor to = sp_block(db->o, SDPA_F32, s->B, q->n, hq, s->D);
    tq.device = tk.device = tv.device = to.device = dev;
    st = sdpa_forward(ctx, &tq, &tk, &tv, &to, db->lse, prm);
    if (st != SDPA_OK)
        return sp_fail(st, "sdpa_mpi_forward: local attention on the device: %s", sdpa_last_error());
    const size_t nob = 4 * (size_t)(s->B * q->n * hq * s->D), nlb = 4 * (size_t)(s->B * hq * q->n);
    st = sp_cuda_copy(tmp, nob, db->o, nob, nob, 1, 0, why, sizeof why);
    if (st == SDPA_OK)
        st = sp_cuda_copy(ltmp, nlb, db->lse, nlb, nlb, 1, 0, why, sizeof why);
    return st == SDPA_OK ? SDPA_OK : sp_fail(st, "sdpa_mpi_forward: %s", why);
}

/* The rows of a piece's map for batch entry b and query heads h0 .. h0 +
 * nh - 1 (pointers into it: nothing is copied). */
static sdpa_block_map map_view(const sdpa_block_map *m, int64_t b, int64_t h0, int64_t nh)
{
    sdpa_block_map v = *m;
    const int64_t row = ((m->batch > 1 ? b : 0) * m->heads + (m->heads > 1 ? h0 : 0)) *
                        m->q_blocks;
    const int64_t at = row * m->index_stride, words = (int64_t)m->block_q * m->block_kv / 64;
    v.batch = 1, v.heads = m->heads > 1 ? nh : 1;
    if (v.full_count)
        v.full_count += row, v.full_index += at;
    if (v.partial_count)
        v.partial_count += row, v.partial_index += at;
    if (v.partial_bits)
        v.partial_bits += at * words;
    return v;
}

/*
 * map: the call's block map (global positions), or NULL; the block's own
 * piece of it (this segment's rows, the visiting keys from kfirst, this
 * member's query heads) is cut with sdpa_block_map_slice, and a piece that
 * lists nothing is skipped like a block causal hides.
 */
static sdpa_status one_block(sdpa_context *ctx, const sdpa_mpi_plan *p, const segment *q,
                             void *k, void *v, int64_t nk, int64_t d, int64_t hq, int64_t hk,
                             sdpa_tensor *acc, float *lacc, float *tmp, float *ltmp,
                             const sdpa_params *user, MPI_Request *req, int nreq,
                             const device_bufs *db, const sdpa_block_map *map, int64_t kfirst)
{
    const sdpa_mpi_shape *s = &p->s;
    const int64_t nq = q->n;
    /* the caller's params as far as they go (an older, smaller layout's
     * later fields stay at their defaults: sdpa.h, growing by addition) */
    sdpa_params prm = SDPA_PARAMS_DEFAULT;
    memcpy(&prm, user, user->size && user->size < sizeof prm ? user->size : sizeof prm);
    prm.size = sizeof prm;
    sdpa_mask m = SDPA_MASK_DEFAULT;
    uint8_t *vis = NULL;
    prm.causal = SDPA_CAUSAL_NONE, prm.mask = NULL;
    if (s->causal != SDPA_CAUSAL_NONE) {
        if (nq - 1 + d < 0)
            return SDPA_OK;                     /* no query sees any of these keys */
        if (d < nk - 1) {                       /* else every query sees all of them */
            if (d == 0)
                prm.causal = SDPA_CAUSAL_TOP_LEFT;
            else if (d == nk - nq)
                prm.causal = SDPA_CAUSAL_BOTTOM_RIGHT;
            else { /* another offset: this block's own mask */
                if (db) /* the CUDA backends take no general mask */
                    return sp_fail(SDPA_UNSUPPORTED, "sdpa_mpi_forward: causal on device tensors "
                                   "needs shard boundaries on the diagonal (equal splits, no "
                                   "zigzag); a block has offset %lld", (long long)d);
                if (!(vis = sdpa__malloc((size_t)(nq * nk))))
                    return sp_fail(SDPA_OUT_OF_MEMORY, "sdpa_mpi_forward: no memory for a mask");
                for (int64_t i = 0; i < nq; i++)
                    for (int64_t j = 0; j < nk; j++)
                        vis[i * nk + j] = j <= i + d;
                m.general = vis, m.general_type = SDPA_MASK_BOOL;
                m.general_stride[2] = nk, m.general_stride[3] = 1;
                prm.mask = &m;
            }
        }
    }
    sdpa_block_map *piece = NULL;
    if (map) {
        sdpa_status st = sdpa_block_map_slice(map, s->Sq, s->Skv, q->first, nq, kfirst, nk,
                                              p->u * hq, hq, &piece);
        if (st != SDPA_OK) {
            free(vis);
            return sp_fail(st, "sdpa_mpi_forward: params->mask->blocks: %s", sdpa_last_error());
        }
        if (sdpa_block_map_density(piece, nq, nk) <= 0.0) { /* lists nothing: shows nothing */
            sdpa_block_map_free(piece);
            free(vis);
            return SDPA_OK;
        }
        m.blocks = piece;
        prm.mask = &m;
    }
    if (db) {
        sdpa_status st = device_block(ctx, p, db, q, k, v, nk, hq, hk, tmp, ltmp, &prm);
        sdpa_block_map_free(piece); /* none: maps are refused on device tensors */
        if (st == SDPA_OK) {
            sdpa_tensor to = sp_block(tmp, SDPA_F32, s->B, nq, hq, s->D);
            st = sdpa_merge(acc, lacc, &to, ltmp, acc, lacc);
        }
        return st == SDPA_OK ? SDPA_OK : (sp_last_error[0] ? st : sp_fail(st, "sdpa_mpi_forward: "
                                                                   "merge: %s", sdpa_last_error()));
    }
    /* whole block at once, or per (batch entry, group of query heads that
     * share KV heads) */
    const int64_t g = hq / hk, per = nreq ? g * ((hq / g + PIECES - 1) / PIECES) : hq;
    const int64_t nb = nreq ? s->B : 1;
    sdpa_status st = SDPA_OK;
    for (int64_t b = 0; b < nb && st == SDPA_OK; b++)
        for (int64_t h0 = 0; h0 < hq && st == SDPA_OK; h0 += per) {
            const int64_t nh = hq - h0 < per ? hq - h0 : per;
            sdpa_tensor tq, tk, tv, to, ta;
            float *la;
            if (!nreq) {
                tq = sp_block(q->data, s->dtype, s->B, nq, hq, s->D);
                tk = sp_block(k, s->dtype, s->B, nk, hk, s->D);
                tv = sp_block(v, s->dtype, s->B, nk, hk, s->D);
                to = sp_block(tmp, SDPA_F32, s->B, nq, hq, s->D);
                ta = *acc, la = lacc;
            } else {
                tq = view(q->data, s->dtype, nq, hq, s->D, b, h0, nh);
                tk = view(k, s->dtype, nk, hk, s->D, b, h0 / g, nh / g);
                tv = view(v, s->dtype, nk, hk, s->D, b, h0 / g, nh / g);
                to = sp_block(tmp, SDPA_F32, 1, nq, nh, s->D);
                ta = view(acc->data, SDPA_F32, nq, hq, s->D, b, h0, nh);
                la = lacc + (b * hq + h0) * nq; /* [B, hq, nq]: this piece is contiguous */
            }
            sdpa_block_map pv;
            if (piece && nreq) { /* this piece's batch entry and heads of the map */
                pv = map_view(piece, b, h0, nh);
                m.blocks = &pv;
            }
            st = sdpa_forward(ctx, &tq, &tk, &tv, &to, ltmp, &prm);
            if (st == SDPA_OK)
                st = sdpa_merge(&ta, la, &to, ltmp, &ta, la);
            if (nreq) {
                int done;
                MPI_Testall(nreq, req, &done, MPI_STATUSES_IGNORE);
            }
        }
    free(vis);
    sdpa_block_map_free(piece);
    return st == SDPA_OK ? SDPA_OK : sp_fail(st, "sdpa_mpi_forward: local attention: %s",
                                             sdpa_last_error());
}

static sdpa_status check_local(const sdpa_mpi_plan *p, const sdpa_tensor *t, const char *name,
                               int64_t rows, int64_t heads, int is_out)
{
    const sdpa_mpi_shape *s = &p->s;
    if (rows == 0)
        return SDPA_OK; /* an empty shard: the tensor is not read */
    if (!t || !t->data)
        return sp_fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_forward: %s is NULL on rank %d, expected "
                       "its %lld rows", name, p->rank, (long long)rows);
    const int64_t want[4] = {s->B, rows, heads, s->D};
    for (int i = 0; i < 4; i++)
        if (t->size[i] != want[i])
            return sp_fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_forward: %s->size[%d] is %lld on rank "
                           "%d, expected %lld", name, i, (long long)t->size[i], p->rank,
                           (long long)want[i]);
    if (t->device.kind != SDPA_DEVICE_CPU &&
        (t->device.kind != SDPA_DEVICE_CUDA || t->stride[3] != 1 || t->stride[2] != s->D))
        return sp_fail(SDPA_UNSUPPORTED, "sdpa_mpi_forward: %s is device memory with strides "
                       "S=%lld H=%lld D=%lld; device tensors are staged by rows, which needs "
                       "contiguous heads (H stride D, D stride 1)", name, (long long)t->stride[1],
                       (long long)t->stride[2], (long long)t->stride[3]);
    if (!is_out && t->dtype != s->dtype)
        return sp_fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_forward: %s is %s, expected the plan's %s",
                       name, sdpa_dtype_name(t->dtype), sdpa_dtype_name(s->dtype));
    if (is_out && (unsigned)t->dtype > SDPA_BF16)
        return sp_fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_forward: out->dtype %d unknown",
                       (int)t->dtype);
    return SDPA_OK;
}

/* The one mask sequence parallelism takes: a block map over the global
 * positions (the same on every rank), its shape checked here and each
 * row as a block's piece is cut from it. */
static sdpa_status take_mask(const sdpa_mpi_plan *p, const sdpa_mask *user,
                             const sdpa_block_map **map)
{
    sdpa_mask m = SDPA_MASK_DEFAULT; /* the caller's as far as it goes (sdpa.h: growth) */
    memcpy(&m, user, user->size && user->size < sizeof m ? user->size : sizeof m);
    const char *other = m.seq_len_q || m.seq_len_kv ? "seq_len_q/seq_len_kv"
                        : m.key                     ? "key"
                        : m.general                 ? "general"
                        : m.window                  ? "window"
                                                    : NULL;
    if (other || !m.blocks)
        return sp_fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_forward: params->mask %s%s; sequence "
                       "parallelism takes only mask->blocks (a block map over the global "
                       "positions, the same on every rank); causal comes from the plan",
                       other ? "sets " : "has no blocks", other ? other : "");
    const sdpa_block_map *b = m.blocks;
    const sdpa_mpi_shape *s = &p->s;
    if (b->batch != 1 && b->batch != s->B)
        return sp_fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_forward: mask->blocks->batch is %lld, "
                       "expected 1 (broadcast) or B = %lld", (long long)b->batch, (long long)s->B);
    if (b->heads != 1 && b->heads != s->Hq)
        return sp_fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_forward: mask->blocks->heads is %lld, "
                       "expected 1 (broadcast) or Hq = %lld", (long long)b->heads,
                       (long long)s->Hq);
    sdpa_block_map *first = NULL; /* the map's shape against Sq and Skv, and its first row */
    sdpa_status st = sdpa_block_map_slice(b, s->Sq, s->Skv, 0, 1, 0, 1, 0, 1, &first);
    sdpa_block_map_free(first);
    if (st != SDPA_OK)
        return sp_fail(st, "sdpa_mpi_forward: %s", sdpa_last_error());
    *map = b;
    return SDPA_OK;
}

sdpa_status sdpa_mpi_forward(sdpa_mpi_plan *p, sdpa_context *ctx, const sdpa_tensor *q,
                             const sdpa_tensor *k, const sdpa_tensor *v, sdpa_tensor *out,
                             float *lse, const sdpa_params *params)
{
    return sdpa_mpi_forward_joint(p, ctx, q, k, v, NULL, NULL, out, lse, params);
}

/* The replicated joint keys' checks: [B, T, Hkv, D] in the plan's dtype,
 * both or neither. */
static sdpa_status check_joint(const sdpa_mpi_plan *p, const sdpa_tensor *kj,
                               const sdpa_tensor *vj)
{
    if (!kj && !vj)
        return SDPA_OK;
    if (!kj || !vj || !kj->data || !vj->data)
        return sp_fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_forward_joint: k_joint and v_joint come "
                       "together (one is NULL)");
    const sdpa_tensor *t[2] = {kj, vj};
    static const char *names[2] = {"k_joint", "v_joint"};
    for (int i = 0; i < 2; i++) {
        const int64_t want[4] = {p->s.B, kj->size[1], p->s.Hkv, p->s.D};
        for (int d = 0; d < 4; d++)
            if (t[i]->size[d] != want[d] || want[1] < 1)
                return sp_fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_forward_joint: %s->size[%d] is %lld, "
                               "expected %lld ([B, T >= 1, Hkv, D], T as in k_joint)", names[i], d,
                               (long long)t[i]->size[d], (long long)want[d]);
        if (t[i]->dtype != p->s.dtype || t[i]->device.kind != SDPA_DEVICE_CPU)
            return sp_fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_forward_joint: %s must be CPU memory in "
                           "the plan's dtype %s (replicated text keys are not staged from a "
                           "device)", names[i], sdpa_dtype_name(p->s.dtype));
    }
    return SDPA_OK;
}

sdpa_status sdpa_mpi_forward_joint(sdpa_mpi_plan *p, sdpa_context *ctx, const sdpa_tensor *q,
                                   const sdpa_tensor *k, const sdpa_tensor *v,
                                   const sdpa_tensor *k_joint, const sdpa_tensor *v_joint,
                                   sdpa_tensor *out, float *lse, const sdpa_params *params)
{
    sp_last_error[0] = '\0';
    if (!p)
        return sp_fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_forward: plan is NULL");
    const double t_start = sp_now_ms();
    memset(&p->stats, 0, sizeof p->stats);
    const sdpa_mpi_shape *s = &p->s;
    const sdpa_params defaults = SDPA_PARAMS_DEFAULT;
    const sdpa_params *prm = params ? params : &defaults;
    const int64_t nq = sp_local_rows(p, p->rank, 0), nkv = sp_local_rows(p, p->rank, 1);
    sdpa_status st = ctx ? SDPA_OK : sp_fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_forward: ctx is NULL");
    const sdpa_block_map *map = NULL;
    if (st == SDPA_OK && prm->mask)
        st = take_mask(p, prm->mask, &map);
    if (st == SDPA_OK)
        st = check_local(p, q, "q", nq, s->Hq, 0);
    if (st == SDPA_OK)
        st = check_local(p, k, "k", nkv, s->Hkv, 0);
    if (st == SDPA_OK)
        st = check_local(p, v, "v", nkv, s->Hkv, 0);
    if (st == SDPA_OK)
        st = check_local(p, out, "out", nq, s->Hq, 1);
    if (st == SDPA_OK)
        st = check_joint(p, k_joint, v_joint);
    if ((st = sp_agree(p->comm, st, p->rank)) != SDPA_OK)
        return st; /* every rank returns here together: nothing has moved */

    /* Device tensors (device_staging.h): every rank's, or none; their rows
     * are copied to the host here and the result back at the end. */
    /* any device tensor, any host one; any rank with a map, any without */
    int mode[4] = {0, 0, map != NULL, map == NULL}, all[4] = {0, 0, 0, 0}, ordinal = 0;
    const sdpa_tensor *loc[4] = {nq ? q : NULL, nkv ? k : NULL, nkv ? v : NULL, nq ? out : NULL};
    for (int i = 0; i < 4; i++)
        if (loc[i]) {
            const int d = loc[i]->device.kind == SDPA_DEVICE_CUDA;
            mode[d ? 0 : 1] = 1;
            ordinal = d ? loc[i]->device.ordinal : ordinal;
        }
    MPI_Allreduce(mode, all, 4, MPI_INT, MPI_MAX, p->comm);
    if (all[0] && all[1])
        return sp_fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_forward: the local tensors mix device and "
                       "host memory (on this rank or across ranks); one kind for all of them");
    if (all[2] && all[3])
        return sp_fail(SDPA_INVALID_ARGUMENT, "sdpa_mpi_forward: params->mask->blocks is given "
                       "on some ranks and not on others; the same map on every rank");
    if (all[0] && all[2])
        return sp_fail(SDPA_UNSUPPORTED, "sdpa_mpi_forward: a block map with device tensors: "
                       "the CUDA backends take no block map");
    const int on_device = all[0];
    char *staged = NULL; /* host copies: q, k, v, then the result and its LSE */
    sdpa_tensor hq_t, hk_t, hv_t, ho_t;
    sdpa_tensor *out_user = out;
    float *lse_user = lse;
    const size_t es = sp_esize(s->dtype), oes = sp_esize(out ? out->dtype : SDPA_F32);
    if (on_device) {
        char why[300];
        st = sp_cuda_load(why, sizeof why);
        const size_t bq = es * (size_t)(s->B * nq * s->Hq * s->D),
                     bk = es * (size_t)(s->B * nkv * s->Hkv * s->D),
                     bo = oes * (size_t)(s->B * nq * s->Hq * s->D),
                     bl = sizeof(float) * (size_t)(s->B * s->Hq * nq);
        if (st == SDPA_OK && !(staged = sdpa__malloc(bq + 2 * bk + bo + bl + 64)))
            st = SDPA_OUT_OF_MEMORY, snprintf(why, sizeof why, "no host memory for staging");
        const sdpa_tensor *src[3] = {q, k, v};
        sdpa_tensor *dst[3] = {&hq_t, &hk_t, &hv_t};
        const int64_t rows[3] = {nq, nkv, nkv}, heads[3] = {s->Hq, s->Hkv, s->Hkv};
        char *at = staged;
        for (int i = 0; i < 3 && st == SDPA_OK; i++) {
            *dst[i] = sp_block(at, s->dtype, s->B, rows[i] ? rows[i] : 1, heads[i], s->D);
            const size_t w = es * (size_t)(heads[i] * s->D);
            for (int64_t b = 0; b < s->B && rows[i] && st == SDPA_OK; b++)
                st = sp_cuda_copy(at + w * (size_t)(b * rows[i]), w,
                                  (const char *)src[i]->data + b * src[i]->stride[0] * (int64_t)es,
                                  es * (size_t)src[i]->stride[1], w, (size_t)rows[i], 0, why,
                                  sizeof why);
            at += es * (size_t)(s->B * rows[i] * heads[i] * s->D);
        }
        if (st == SDPA_OK) {
            ho_t = sp_block(at, out ? out->dtype : SDPA_F32, s->B, nq ? nq : 1, s->Hq, s->D);
            q = &hq_t, k = &hk_t, v = &hv_t, out = &ho_t;
            lse = (float *)(at + bo);
        }
        if (st != SDPA_OK)
            sp_fail(st, "sdpa_mpi_forward: staging device tensors: %s", why);
        if ((st = sp_agree(p->comm, st, p->rank)) != SDPA_OK) {
            free(staged);
            return st;
        }
    }

    const int64_t hq = s->Hq / p->U, hk = p->kv_replicated ? 1 : s->Hkv / p->U;
    gathered gq = {0}, gk = {0}, gv = {0};
    /* a failure inside a gather with messages is agreed there (every rank
     * stops at the same one); without messages (ulysses 1), before the ring */
    st = sp_gather_group(p, q, 0, hq, &gq);
    if (st == SDPA_OK || p->U == 1)
        st = st == SDPA_OK ? sp_gather_group(p, k, 1, hk, &gk) : st;
    if (st == SDPA_OK || p->U == 1)
        st = st == SDPA_OK ? sp_gather_group(p, v, 1, hk, &gv) : st;
    /* the ring: blocks of the R groups' K/V, each its ranges one after the other */
    const size_t row = sp_esize(s->dtype) * (size_t)s->D;
    int64_t max_nk = 0;
    for (int j = 0; j < p->R; j++) {
        int64_t n = 0;
        for (int u = 0; u < p->U; u++)
            n += sp_local_rows(p, j * p->U + u, 1);
        max_nk = n > max_nk ? n : max_nk;
    }
    const size_t kv_bytes = row * (size_t)(s->B * (max_nk ? max_nk : 1) * hk);
    char *cur = sdpa__malloc(2 * kv_bytes), *next = sdpa__malloc(2 * kv_bytes);
    const size_t acc_n = (size_t)(s->B * (gq.n ? gq.n : 1) * hq);
    float *acc = sdpa__calloc(acc_n * (size_t)s->D, sizeof(float)), *tmp = sdpa__malloc(acc_n * (size_t)s->D * 4);
    float *lacc = sdpa__malloc(acc_n * sizeof(float)), *ltmp = sdpa__malloc(acc_n * sizeof(float));
    if (st == SDPA_OK && (!cur || !next || !acc || !tmp || !lacc || !ltmp))
        st = sp_fail(SDPA_OUT_OF_MEMORY, "sdpa_mpi_forward: no memory for the ring");
    /* on the device: buffers for one block's q, k, v, output and LSE */
    device_bufs db = {NULL, NULL, NULL, NULL, NULL, ordinal}, *dbp = on_device ? &db : NULL;
    if (on_device && st == SDPA_OK) {
        const int64_t T = k_joint ? k_joint->size[1] : 0, nseg_max =
            gq.seg[0].n > gq.seg[1].n ? gq.seg[0].n : gq.seg[1].n;
        const int64_t nkb = max_nk > T ? max_nk : T;
        char why[300];
        st = sp_cuda_alloc(&db.q, row * (size_t)(s->B * nseg_max * hq), why, sizeof why);
        if (st == SDPA_OK)
            st = sp_cuda_alloc(&db.k, row * (size_t)(s->B * nkb * hk), why, sizeof why);
        if (st == SDPA_OK)
            st = sp_cuda_alloc(&db.v, row * (size_t)(s->B * nkb * hk), why, sizeof why);
        if (st == SDPA_OK)
            st = sp_cuda_alloc(&db.o, 4 * (size_t)(s->B * nseg_max * hq * s->D), why, sizeof why);
        if (st == SDPA_OK)
            st = sp_cuda_alloc((void **)&db.lse, 4 * (size_t)(s->B * hq * nseg_max), why,
                               sizeof why);
        if (st != SDPA_OK)
            sp_fail(st, "sdpa_mpi_forward: %s", why);
    }
    if ((st = sp_agree(p->comm, st, p->rank)) != SDPA_OK)
        goto release; /* together, before any ring message */
    for (size_t i = 0; i < acc_n; i++)
        lacc[i] = -INFINITY; /* nothing seen yet */
    memcpy(cur, gk.data, row * (size_t)(s->B * gk.n * hk));
    memcpy(cur + kv_bytes, gv.data, row * (size_t)(s->B * gk.n * hk));
    /* an accumulator per range of the group's queries */
    sdpa_tensor tacc[2];
    float *lacc_r[2];
    for (int r = 0, at = 0; r < 2; at += (int)gq.seg[r].n, r++) {
        tacc[r] = sp_block(acc + (size_t)(at * s->B * hq * s->D), SDPA_F32, s->B,
                           gq.seg[r].n ? gq.seg[r].n : 1, hq, s->D);
        lacc_r[r] = lacc + at * s->B * hq;
    }
    const int64_t off = sdpa_causal_offset(s->causal, s->Sq, s->Skv); /* global positions */
    const int prev = (p->r - 1 + p->R) % p->R, nxt = (p->r + 1) % p->R;
    /* A local failure inside the loop must not leave the others waiting
     * on this rank's messages: the ring keeps turning, and the failure is
     * agreed on after it. */
    for (int step = 0; step < p->R; step++) {
        const int j = (p->r - step + p->R) % p->R, jn = (j - 1 + p->R) % p->R;
        int64_t nk = 0, nk_next = 0;
        for (int u = 0; u < p->U; u++)
            nk += sp_local_rows(p, j * p->U + u, 1), nk_next += sp_local_rows(p, jn * p->U + u, 1);
        MPI_Request req[4];
        int nreq = 0;
        if (step < p->R - 1) {
            const int cn = (int)(s->B * nk * hk), cnn = (int)(s->B * nk_next * hk);
            MPI_Datatype rt;
            MPI_Type_contiguous((int)row, MPI_BYTE, &rt);
            MPI_Type_commit(&rt);
            MPI_Irecv(next, cnn, rt, prev, 2 * step, p->ring, &req[nreq++]);
            MPI_Irecv(next + kv_bytes, cnn, rt, prev, 2 * step + 1, p->ring, &req[nreq++]);
            MPI_Isend(cur, cn, rt, nxt, 2 * step, p->ring, &req[nreq++]);
            MPI_Isend(cur + kv_bytes, cn, rt, nxt, 2 * step + 1, p->ring, &req[nreq++]);
            MPI_Type_free(&rt);
            p->stats.bytes_sent += 2 * (int64_t)row * cn;
            p->stats.bytes_received += 2 * (int64_t)row * cnn;
        }
        const double t0 = sp_now_ms();
        /* every range of the queries with every range of the visiting keys,
         * causal from their global positions */
        for (int a = 0, kat = 0; a < gq.nseg && st == SDPA_OK; a++, kat = 0)
            for (int c = 0; c < gq.nseg && st == SDPA_OK; c++) {
                int64_t kfirst, kn;
                sp_group_range(p, j, 1, c, &kfirst, &kn);
                const size_t at = row * (size_t)(s->B * kat * hk);
                kat += (int)kn;
                if (gq.seg[a].n > 0 && kn > 0)
                    st = one_block(ctx, p, &gq.seg[a], cur + at, cur + kv_bytes + at, kn,
                                   gq.seg[a].first + off - kfirst, hq, hk, &tacc[a], lacc_r[a],
                                   tmp, ltmp, prm, req, nreq, dbp, map, kfirst);
            }
        const double t1 = sp_now_ms();
        if (nreq)
            MPI_Waitall(nreq, req, MPI_STATUSES_IGNORE);
        p->stats.compute_ms += t1 - t0;
        p->stats.wait_ms += sp_now_ms() - t1;
        char *swap = cur;
        cur = next, next = swap;
    }
    if (st == SDPA_OK && k_joint && gq.n > 0) { /* the replicated keys, once, this member's heads */
        const int64_t T = k_joint->size[1];
        const int64_t h0 = p->kv_replicated ? p->u * s->Hkv / p->U : p->u * hk;
        char *kj = sdpa__malloc(row * (size_t)(s->B * T * hk)), *vj = sdpa__malloc(row * (size_t)(s->B * T * hk));
        const double t0 = sp_now_ms();
        if (!kj || !vj) {
            st = sp_fail(SDPA_OUT_OF_MEMORY, "sdpa_mpi_forward_joint: no memory for the joint keys");
        } else {
            sp_pack(k_joint, 0, T, h0, hk, kj), sp_pack(v_joint, 0, T, h0, hk, vj);
            sdpa_mpi_plan flat_plan = *p;
            flat_plan.s.causal = SDPA_CAUSAL_NONE; /* joint keys: visible to every query */
            for (int a = 0; a < gq.nseg && st == SDPA_OK; a++)
                if (gq.seg[a].n > 0)
                    st = one_block(ctx, &flat_plan, &gq.seg[a], kj, vj, T, 0, hq, hk, &tacc[a],
                                   lacc_r[a], tmp, ltmp, prm, NULL, 0, dbp, NULL, 0);
        }
        p->stats.compute_ms += sp_now_ms() - t0;
        free(kj), free(vj);
    }
    if ((st = sp_agree(p->comm, st, p->rank)) == SDPA_OK)
        st = sp_scatter_result(p, &gq, acc, lacc, hq, out, lse);
    st = sp_agree(p->comm, st, p->rank);
    if (on_device && st == SDPA_OK) { /* the result back to the caller's device tensors */
        char why[300];
        const size_t w = oes * (size_t)(s->Hq * s->D);
        for (int64_t b = 0; b < s->B && nq && st == SDPA_OK; b++)
            st = sp_cuda_copy((char *)out_user->data + b * out_user->stride[0] * (int64_t)oes,
                              oes * (size_t)out_user->stride[1],
                              (char *)out->data + w * (size_t)(b * nq), w, w, (size_t)nq, 1, why,
                              sizeof why);
        const size_t bl = sizeof(float) * (size_t)(s->B * s->Hq * nq);
        if (st == SDPA_OK && lse_user && nq)
            st = sp_cuda_copy(lse_user, bl, lse, bl, bl, 1, 1, why, sizeof why);
        if (st != SDPA_OK)
            sp_fail(st, "sdpa_mpi_forward: the result to the device: %s", why);
        st = sp_agree(p->comm, st, p->rank);
    }
release:
    free(gq.data), free(gk.data), free(gv.data);
    free(cur), free(next), free(acc), free(tmp), free(lacc), free(ltmp);
    sp_cuda_free(db.q), sp_cuda_free(db.k), sp_cuda_free(db.v), sp_cuda_free(db.o);
    sp_cuda_free(db.lse), free(staged);
    p->stats.total_ms = sp_now_ms() - t_start;
    return st;
}
