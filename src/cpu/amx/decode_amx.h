/*
 * decode_amx.h - cpu.amx's path for a few grouped-query rows per KV head
 * (2-16: a decode step of a grouped-query or multi-query model, a few
 * tokens of one), bf16 throughout, on tiles with K read in place.
 * Included by flash_amx.c (after its helpers), so the emulated and the
 * tile-less builds get it too.
 *
 * Why: cpu.avx512's few-query path (flash_decode.h) does such rows with
 * fp32 FMAs, 2 D multiply-adds per key and row; with 8 rows per KV head
 * that is about as many cycles per key as reading the key's K and V rows
 * from memory takes, so one query against 1024-8192 keys at 8:1 ran at
 * 45-63% of a streaming read of K and V on the Emerald Rapids Xeon
 * (bench/results/2026-12-06-peers-decode-cpu-bf16-emr.txt). The tiled
 * path would pack K and V first: three passes over memory instead of one.
 *
 * Here the products are turned around so that K needs no packing:
 *
 *   S^T = K Q^T     A = 16 keys x 32 dims of K as they lie in memory (its
 *                   rows are a tile's rows; a sequence stride apart), B =
 *                   Q^T in pairs of dims (packed once per task), C = 16
 *                   keys x 16 query rows: a key per tile row, a row per lane
 *   softmax         down the keys: a key's 16 lanes are one vector, so the
 *                   max and the sum are vertical, no horizontal step
 *   O += P V        A = P (query rows x 32 keys in pairs: two keys' vectors
 *                   interleaved and a 16 x 16 transpose per 32 keys), B = V
 *                   interleaved by pairs of keys (interleave_v32, as the
 *                   tiled path packs it, here per block into L1)
 *
 * Per 64 keys and KV head at D = 128: 16 products for S^T and 16 for P V,
 * K's tiles loaded from memory once. Tasks are (batch, group of up to 8 KV
 * heads, chunk of keys); a task reads every head's rows of a key before the
 * next key, along memory (BSHD), as flash_decode.h does. With few such
 * pieces the keys are cut into chunks, merged afterwards in chunk order;
 * the cuts depend on the shape only, so the result is the same bits for
 * any thread count.
 *
 * Scope (the rest goes to flash_decode.h or the tiled path): q, k and v
 * bf16 with unit head-dim stride, D a multiple of 32 up to 256, no mask
 * and no causal alignment, forward.
 */

#define ADEC_KEYS 64      /* keys per block: 4 C tiles of S^T               */
#define ADEC_HEADS 8      /* KV heads per task, at most                     */
#define ADEC_PIECES 16    /* fewer (batch, head group) pieces: cut the keys */
#define ADEC_CHUNK 512    /* keys per chunk, at least                       */

typedef struct adec_job {
    const sdpa_call *c;
    int64_t group, rows;   /* query heads per KV head; rows per KV head     */
    int64_t D, nch;        /* head dim; its 32-dim chunks                   */
    int64_t hg_len, n_hg;  /* KV heads per task, and groups per batch entry */
    int64_t kc_len, n_kc;  /* keys per chunk (a multiple of ADEC_KEYS), chunks */
    float c_log2;          /* |scale| log2(e)                               */
    uint16_t qsign;        /* 0x8000 when scale < 0: q is negated           */
    float *part;           /* n_kc > 1: [B Hkv][n_kc][16 D + 32]            */
    char *ws;              /* [threads][ws_bytes]                           */
    size_t ws_bytes;
} adec_job;

/* A task's per-head state and its buffers, carved from ws. */
typedef struct adec_ws {
    uint16_t *qt; /* [hg_len][nch][16][32] Q^T, B tiles              */
    float *o;     /* [hg_len][16][D]                                 */
    float *m, *l; /* [hg_len][16] (log2 units, scaled), sums         */
    float *st;    /* [ADEC_KEYS][16] S^T                              */
    uint16_t *p;  /* [2][16][32] P, A tiles                          */
    uint16_t *vt; /* [2][D / 16][16][32] V interleaved, B tiles      */
    uint16_t *ks; /* [ADEC_KEYS][D] K rows staged for a partial block */
} adec_ws;

static int adec_applies(const sdpa_call *c)
{
    const sdpa_call_desc *d = &c->desc;
    const int64_t rows = d->Hq / d->Hkv * d->Sq;
    return rows >= 2 && rows <= 16 && d->Skv >= 1 && d->D % 32 == 0 && d->D <= 256 &&
           !c->mask && c->causal == SDPA_CAUSAL_NONE && c->q->dtype == SDPA_BF16 &&
           c->k->dtype == SDPA_BF16 && c->v->dtype == SDPA_BF16 && c->q->stride[3] == 1 &&
           c->k->stride[3] == 1 && c->v->stride[3] == 1;
}

#define ADEC_R64(x) (((size_t)(x) + 63) / 64 * 64)

/* A thread's workspace for H KV heads of head dim D at base (NULL: only
 * its size, returned either way). */
static size_t adec_layout(int64_t H, int64_t D, char *base, adec_ws *w)
{
    size_t at = 0;
#define ADEC_PART(field, type, bytes) \
    (w->field = base ? (type *)(base + at) : NULL, at += ADEC_R64(bytes))
    ADEC_PART(qt, uint16_t, H * (D / 32) * 512 * 2);
    ADEC_PART(o, float, H * 16 * D * 4);
    ADEC_PART(m, float, H * 16 * 4);
    ADEC_PART(l, float, H * 16 * 4);
    ADEC_PART(st, float, ADEC_KEYS * 16 * 4);
    ADEC_PART(p, uint16_t, 2 * 512 * 2);
    ADEC_PART(vt, uint16_t, 2 * (D / 16) * 512 * 2);
    ADEC_PART(ks, uint16_t, ADEC_KEYS * D * 2);
#undef ADEC_PART
    return at;
}

static inline const uint16_t *adec_row(const sdpa_tensor *t, int64_t b, int64_t j, int64_t h)
{
    return (const uint16_t *)sdpa__elem(t, sdpa__offset(t, b, j, h, 0));
}

/* Q^T of KV head hk's rows (row r: query head hk group + r / Sq, query
 * r % Sq) as B tiles: tile ch, row k holds every row's dims (2k, 2k + 1)
 * of chunk ch; lanes past the rows are zero. */
static void adec_pack_q(const adec_job *jb, int64_t b, int64_t hk, uint16_t *qt)
{
    const sdpa_call *c = jb->c;
    const __m512i sign = _mm512_set1_epi16((short)jb->qsign);
    for (int64_t ch = 0; ch < jb->nch; ch++) {
        __m512 r[16];
        for (int n = 0; n < 16; n++) {
            if (n < jb->rows) {
                const int64_t h = hk * jb->group + n / c->desc.Sq, i = n % c->desc.Sq;
                const __m512i x = _mm512_loadu_si512(adec_row(c->q, b, i, h) + ch * 32);
                r[n] = _mm512_castsi512_ps(_mm512_xor_si512(x, sign));
            } else {
                r[n] = _mm512_setzero_ps();
            }
        }
        transpose16(r);
        for (int k = 0; k < 16; k++)
            _mm512_store_ps((float *)(qt + ch * 512 + k * 32), r[k]);
    }
}

/* One head's block of nb keys from j0: S^T, the softmax into P, P V. */
static void adec_block(const adec_job *jb, const adec_ws *w, int hi, int64_t b, int64_t hk,
                       int64_t j0, int nb, int o_live)
{
    const sdpa_call *c = jb->c;
    const int64_t D = jb->D, ng = D / 16;
    const uint16_t *qt = w->qt + hi * jb->nch * 512;
    float *o = w->o + hi * 16 * D, *mp = w->m + hi * 16, *lp = w->l + hi * 16;
    const int groups = (nb + 15) / 16, halves = (nb + 31) / 32;
    /* K's 16-key tiles in place, or staged with zero rows past the keys */
    const uint16_t *kbase = adec_row(c->k, b, j0, hk);
    int64_t kstride = c->k->stride[1] * 2;
    if (nb < ADEC_KEYS) {
        for (int j = 0; j < 16 * groups; j++) {
            if (j < nb)
                memcpy(w->ks + j * D, adec_row(c->k, b, j0 + j, hk), (size_t)D * 2);
            else
                memset(w->ks + j * D, 0, (size_t)D * 2);
        }
        kbase = w->ks, kstride = D * 2;
    }
    TILE_ZERO(0); /* tile numbers are immediates: all four, used or not */
    TILE_ZERO(1);
    TILE_ZERO(2);
    TILE_ZERO(3);
    for (int64_t ch = 0; ch < jb->nch; ch++) {
        TILE_LOAD(5, qt + ch * 512, 64);
        for (int g = 0; g < groups; g++) {
            TILE_LOAD(4, (const char *)kbase + g * 16 * kstride + ch * 64, kstride);
            switch (g) { /* tile numbers are immediates */
            case 0: TILE_DPBF16PS(0, 4, 5); break;
            case 1: TILE_DPBF16PS(1, 4, 5); break;
            case 2: TILE_DPBF16PS(2, 4, 5); break;
            default: TILE_DPBF16PS(3, 4, 5); break;
            }
        }
    }
    for (int g = 0; g < groups; g++) {
        switch (g) {
        case 0: TILE_STORE(0, w->st, 64); break;
        case 1: TILE_STORE(1, w->st + 256, 64); break;
        case 2: TILE_STORE(2, w->st + 512, 64); break;
        default: TILE_STORE(3, w->st + 768, 64); break;
        }
    }
    /* V's keys interleaved by pairs, zero past nb */
    for (int h = 0; h < halves; h++) {
        const uint16_t *vr[32];
        const int n = nb - 32 * h < 32 ? nb - 32 * h : 32;
        for (int j = 0; j < n; j++)
            vr[j] = adec_row(c->v, b, j0 + 32 * h + j, hk);
        interleave_v32(vr, n, D, ng, w->vt + h * ng * 512);
    }
    /* the max down the keys; m rises (lazily, past TAU) where it moved */
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < nb; j++)
        mx = _mm512_max_ps(mx, _mm512_load_ps(w->st + 16 * j));
    const __m512 cv = _mm512_set1_ps(jb->c_log2);
    mx = _mm512_mul_round_ps(mx, cv, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 m = _mm512_load_ps(mp), l = _mm512_load_ps(lp);
    const __mmask16 up =
        _mm512_cmp_ps_mask(mx, _mm512_add_ps(m, _mm512_set1_ps(TAU)), _CMP_GT_OQ) &
        (__mmask16)((1u << jb->rows) - 1);
    if (up) {
        float mo[16], mn[16], alpha[16];
        const __m512 m_new = _mm512_mask_mov_ps(m, up, mx);
        _mm512_storeu_ps(mo, m), _mm512_storeu_ps(mn, m_new);
        for (int r = 0; r < 16; r++)
            alpha[r] = up >> r & 1 ? exp2f(mo[r] - mn[r]) : 1.0f; /* m = -inf: 0 */
        if (o_live)
            for (int r = 0; r < jb->rows; r++)
                if (up >> r & 1)
                    for (int64_t d = 0; d < D; d += 16)
                        _mm512_store_ps(o + r * D + d, _mm512_mul_ps(_mm512_load_ps(o + r * D + d),
                                                                     _mm512_set1_ps(alpha[r])));
        l = _mm512_mul_ps(l, _mm512_loadu_ps(alpha));
        m = m_new;
        _mm512_store_ps(mp, m);
    }
    /* rows whose scores so far are all -inf subtract 0: 2^-inf = 0, not NaN */
    const __m512 nmu = _mm512_sub_ps(
        _mm512_setzero_ps(),
        _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask(m, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ),
                           _mm512_setzero_ps()));
    static const uint16_t pair_idx[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                          8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i pidx = _mm512_loadu_si512(pair_idx);
    for (int h = 0; h < halves; h++) {
        __m512 y[16];
        for (int k = 0; k < 16; k++) {
            const int j = 32 * h + 2 * k;
            __m512 e0 = _mm512_setzero_ps(), e1 = e0;
            if (j < nb)
                e0 = exp2_bf16(_mm512_add_ps(
                    _mm512_mul_round_ps(_mm512_load_ps(w->st + 16 * j), cv,
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                    nmu));
            if (j + 1 < nb)
                e1 = exp2_bf16(_mm512_add_ps(
                    _mm512_mul_round_ps(_mm512_load_ps(w->st + 16 * j + 16), cv,
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                    nmu));
            l = _mm512_add_ps(l, _mm512_add_ps(e0, e1));
            y[k] = _mm512_castsi512_ps(
                _mm512_permutexvar_epi16(pidx, (__m512i)_mm512_cvtne2ps_pbh(e1, e0)));
        }
        transpose16(y); /* y[r]: row r's 16 pairs of keys */
        for (int r = 0; r < 16; r++)
            _mm512_store_ps((float *)(w->p + h * 512 + r * 32), y[r]);
    }
    _mm512_store_ps(lp, l);
    /* O += P V, 32 head dims at a time */
    for (int64_t g = 0; g < ng; g += 2) {
        if (o_live) {
            TILE_LOAD(0, o + g * 16, D * 4);
            TILE_LOAD(1, o + g * 16 + 16, D * 4);
        } else {
            TILE_ZERO(0);
            TILE_ZERO(1);
        }
        for (int h = 0; h < halves; h++) {
            TILE_LOAD(4, w->p + h * 512, 64);
            TILE_LOAD(6, w->vt + (h * ng + g) * 512, 64);
            TILE_LOAD(7, w->vt + (h * ng + g + 1) * 512, 64);
            TILE_DPBF16PS(0, 4, 6);
            TILE_DPBF16PS(1, 4, 7);
        }
        TILE_STORE(0, o + g * 16, D * 4);
        TILE_STORE(1, o + g * 16 + 16, D * 4);
    }
}

/* Row r of KV head hk's rows to the output: O / l, LSE from m and l. */
static void adec_store(const adec_job *jb, int64_t b, int64_t hk, int r, const float *o, float m,
                       float l)
{
    const int64_t Sq = jb->c->desc.Sq;
    store_row(jb->c, b, hk * jb->group + r / Sq, r % Sq, o, m, l);
}

static void adec_task(void *arg, int64_t task, int worker)
{
    const adec_job *jb = arg;
    const sdpa_call *c = jb->c;
    const sdpa_call_desc *d = &c->desc;
    adec_ws w;
    adec_layout(jb->hg_len, jb->D, jb->ws + (size_t)worker * jb->ws_bytes, &w);
    const int64_t kc = task % jb->n_kc, hg = task / jb->n_kc % jb->n_hg,
                  b = task / jb->n_kc / jb->n_hg;
    const int64_t hk0 = hg * jb->hg_len,
                  nh = d->Hkv - hk0 < jb->hg_len ? d->Hkv - hk0 : jb->hg_len;
    const int64_t j_first = kc * jb->kc_len,
                  j_end = j_first + jb->kc_len < d->Skv ? j_first + jb->kc_len : d->Skv;
    const int64_t D = jb->D;
    amx_tiles_take();
#ifdef SDPA_AMX_NO_TILES
    memset(w.st, 0, ADEC_KEYS * 16 * sizeof(float)); /* never written by tiles */
#endif
    for (int64_t hi = 0; hi < nh; hi++) {
        adec_pack_q(jb, b, hk0 + hi, w.qt + hi * jb->nch * 512);
        _mm512_store_ps(w.m + hi * 16, _mm512_set1_ps(-INFINITY));
        _mm512_store_ps(w.l + hi * 16, _mm512_setzero_ps());
    }
    for (int64_t j0 = j_first; j0 < j_end; j0 += ADEC_KEYS) {
        const int nb = (int)(j_end - j0 < ADEC_KEYS ? j_end - j0 : ADEC_KEYS);
        for (int64_t hi = 0; hi < nh; hi++)
            adec_block(jb, &w, (int)hi, b, hk0 + hi, j0, nb, j0 > j_first);
    }
    if (!amx_tiles_owned)
        amx_tiles_drop();
    for (int64_t hi = 0; hi < nh; hi++) {
        const float *o = w.o + hi * 16 * D, *m = w.m + hi * 16, *l = w.l + hi * 16;
        if (jb->n_kc == 1) {
            for (int r = 0; r < jb->rows; r++)
                adec_store(jb, b, hk0 + hi, r, o + r * D, m[r], l[r]);
        } else { /* the chunk's partial result, merged in adec_merge */
            float *pt = jb->part + ((b * d->Hkv + hk0 + hi) * jb->n_kc + kc) * (16 * D + 32);
            memcpy(pt, o, sizeof(float) * (size_t)(jb->rows * D));
            memcpy(pt + 16 * D, m, 16 * sizeof(float));
            memcpy(pt + 16 * D + 16, l, 16 * sizeof(float));
        }
    }
}

/* The chunks of one (batch, KV head), in chunk order: one max, the sums
 * and outputs rescaled to it. */
static void adec_merge(void *arg, int64_t bh, int worker)
{
    const adec_job *jb = arg;
    const int64_t D = jb->D, Hkv = jb->c->desc.Hkv;
    const float *pt = jb->part + bh * jb->n_kc * (16 * D + 32);
    adec_ws w; /* the worker's O area (its tasks are done) holds the sum */
    adec_layout(jb->hg_len, D, jb->ws + (size_t)worker * jb->ws_bytes, &w);
    float *acc = w.o;
    for (int r = 0; r < jb->rows; r++) {
        float top = -INFINITY;
        for (int64_t kc = 0; kc < jb->n_kc; kc++) {
            const float m = pt[kc * (16 * D + 32) + 16 * D + r];
            top = m > top ? m : top;
        }
        float l = 0.0f;
        memset(acc, 0, sizeof(float) * (size_t)D);
        for (int64_t kc = 0; kc < jb->n_kc; kc++) {
            const float *ck = pt + kc * (16 * D + 32);
            const float m = ck[16 * D + r];
            /* a chunk whose scores are all -inf (or NaN) kept m = -inf: its
             * O and l are 0 (or NaN, which must reach the row) as they are */
            const float a = m == -INFINITY ? 1.0f : exp2f(m - top);
            l += a * ck[16 * D + 16 + r];
            for (int64_t x = 0; x < D; x++)
                acc[x] += a * ck[r * D + x];
        }
        adec_store(jb, bh / Hkv, bh % Hkv, r, acc, top, l);
    }
}

static sdpa_status adec_run(const sdpa_backend *self, const sdpa_call *c)
{
    const sdpa_call_desc *d = &c->desc;
    sdpa_pool *pool = sdpa__pool_for_call(c);
    const int threads = sdpa__pool_threads(c->pool);
    adec_job jb;
    memset(&jb, 0, sizeof jb);
    jb.c = c;
    jb.group = d->Hq / d->Hkv;
    jb.rows = jb.group * d->Sq;
    jb.D = d->D;
    jb.nch = d->D / 32;
    jb.n_hg = (d->Hkv + ADEC_HEADS - 1) / ADEC_HEADS;
    jb.hg_len = (d->Hkv + jb.n_hg - 1) / jb.n_hg;
    jb.n_hg = (d->Hkv + jb.hg_len - 1) / jb.hg_len;
    /* few pieces and many keys: chunks of at least ADEC_CHUNK keys */
    const int64_t pieces = d->B * jb.n_hg;
    int64_t n_kc = 1;
    if (pieces < ADEC_PIECES) {
        n_kc = (ADEC_PIECES + pieces - 1) / pieces;
        if (n_kc > d->Skv / ADEC_CHUNK)
            n_kc = d->Skv / ADEC_CHUNK;
        if (n_kc < 1)
            n_kc = 1;
    }
    jb.kc_len = ((d->Skv + n_kc - 1) / n_kc + ADEC_KEYS - 1) / ADEC_KEYS * ADEC_KEYS;
    jb.n_kc = (d->Skv + jb.kc_len - 1) / jb.kc_len;
    jb.c_log2 = (float)(fabs(c->scale) * LOG2E);
    jb.qsign = c->scale < 0 ? 0x8000 : 0;
    adec_ws sizes;
    jb.ws_bytes = adec_layout(jb.hg_len, jb.D, NULL, &sizes);
    const size_t part = jb.n_kc > 1 ? ADEC_R64((size_t)(d->B * d->Hkv * jb.n_kc) *
                                               (size_t)(16 * jb.D + 32) * sizeof(float))
                                    : 0;
    const size_t bytes = jb.ws_bytes * (size_t)threads + part;
    char *mem = sdpa__scratch(bytes);
    if (!mem)
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes of tiles", self->name,
                          bytes);
    jb.ws = mem;
    jb.part = part ? (float *)(mem + jb.ws_bytes * (size_t)threads) : NULL;
    sdpa__parallel_for(pool, d->B * jb.n_hg * jb.n_kc, adec_task, &jb);
    if (jb.n_kc > 1)
        sdpa__parallel_for(pool, d->B * d->Hkv, adec_merge, &jb);
    amx_tiles_drop(); /* the calling thread's; the workers' go when they idle */
    sdpa__scratch_release(mem);
    return SDPA_OK;
}
#undef ADEC_R64
