/*
 * test_masks.c - padding (sequence lengths), key masks and general masks.
 *
 * The reference is checked against a second, independent reading of
 * sdpa.h's mask rules written here (each query's visible keys listed
 * explicitly, then a float64 softmax), on fresh random inputs and masks:
 * rows and whole batch entries with no visible key, zero lengths, masks
 * combined with both causal alignments and with grouped-query heads,
 * broadcasting through zero strides, boolean and additive (f32 and the
 * inputs' dtype, with -inf entries). Every other present backend must
 * either match the reference on a mask it claims (out and LSE, guard bytes
 * intact), or refuse it in explain with a reason that names the mask. The
 * padding is poisoned: NaN in the query rows past seq_len_q and in k and v
 * past seq_len_kv, which sdpa.h says are never read (padding rows are
 * zeros). Shapes span several query and key blocks of every tiled kernel,
 * so gathered key blocks (a key mask) and skipped ones are crossed.
 * cpu.amx's kernel runs here on emulated tiles as in test_grid. Bad masks
 * get INVALID_ARGUMENT naming the argument.
 */
#ifdef SDPA_TEST_AMX_EMULATED
#include "amx_emulated.h"
#endif
#include "support/testlib.h"
#include "core/core.h"
#include "core/half.h"
#include "core/convert.h"
#include "dispatch/context.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static sdpa_context *ctx;

typedef struct masks {
    int32_t lq[4], lkv[4];
    int use_lq, use_lkv;
    uint8_t *key;   /* [B][Skv] or broadcast [Skv] */
    int key_bcast;
    void *gen;      /* [Bg][Hg][Sq][Skv] */
    int gen_bcast_b, gen_bcast_h;
    sdpa_mask_type gen_type;
    sdpa_dtype gen_dtype;
    sdpa_mask m;
} masks;

static float gen_value(const masks *k, int64_t off)
{
    if (k->gen_type == SDPA_MASK_BOOL)
        return ((const uint8_t *)k->gen)[off];
    if (k->gen_dtype == SDPA_F32)
        return ((const float *)k->gen)[off];
    return k->gen_dtype == SDPA_BF16 ? sdpa__bf16_to_f32(((const uint16_t *)k->gen)[off])
                                     : sdpa__f16_to_f32(((const uint16_t *)k->gen)[off]);
}

/* The mask rules of sdpa.h, read independently of ref.c: is key j visible
 * to query i of (b, h), and what does the additive mask add? */
static int allowed(const tl_case *c, const masks *k, int64_t b, int64_t h, int64_t i, int64_t j,
                   double *add)
{
    *add = 0;
    const int64_t lq = k->use_lq ? k->lq[b] : c->Sq, lkv = k->use_lkv ? k->lkv[b] : c->Skv;
    if (i >= lq || j >= lkv)
        return 0;
    if (c->causal == SDPA_CAUSAL_TOP_LEFT && j > i)
        return 0;
    if (c->causal == SDPA_CAUSAL_BOTTOM_RIGHT && j > i + (lkv - lq))
        return 0;
    if (k->key && !k->key[(k->key_bcast ? 0 : b) * c->Skv + j])
        return 0;
    if (k->gen) {
        const int64_t Hg = k->gen_bcast_h ? 1 : c->Hq;
        const int64_t off = (((k->gen_bcast_b ? 0 : b) * Hg + (k->gen_bcast_h ? 0 : h)) * c->Sq +
                             i) * c->Skv + j;
        const float g = gen_value(k, off);
        if (k->gen_type == SDPA_MASK_BOOL)
            return g != 0;
        if (g == -INFINITY)
            return 0;
        *add = g;
    }
    return 1;
}

/* Out and LSE by the rules above, in float64, for comparison with ref. */
static void oracle(const tl_case *c, const tl_problem *p, const masks *k, double *out,
                   double *lse)
{
    const double scale = 1.0 / sqrt((double)c->D);
    double *s = malloc(sizeof(double) * (size_t)c->Skv);
    int *vis = malloc(sizeof(int) * (size_t)c->Skv);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->Hq; h++)
            for (int64_t i = 0; i < c->Sq; i++) {
                const int64_t hk = h / (c->Hq / c->Hkv);
                double mx = -INFINITY;
                for (int64_t j = 0; j < c->Skv; j++) {
                    double add, dot = 0;
                    vis[j] = allowed(c, k, b, h, i, j, &add);
                    if (!vis[j])
                        continue;
                    for (int64_t e = 0; e < c->D; e++)
                        dot += (double)tl_out_get(&p->q, b, i, h, e) * tl_out_get(&p->k, b, j, hk, e);
                    s[j] = dot * scale + add;
                    mx = fmax(mx, s[j]);
                }
                double *o = out + ((b * c->Sq + i) * c->Hq + h) * c->D, sum = 0;
                for (int64_t e = 0; e < c->D; e++)
                    o[e] = 0;
                if (mx == -INFINITY) { /* sees no key: zeros, LSE -inf */
                    lse[(b * c->Hq + h) * c->Sq + i] = -INFINITY;
                    continue;
                }
                for (int64_t j = 0; j < c->Skv; j++)
                    if (vis[j]) {
                        const double w = exp(s[j] - mx);
                        sum += w;
                        for (int64_t e = 0; e < c->D; e++)
                            o[e] += w * tl_out_get(&p->v, b, j, hk, e);
                    }
                for (int64_t e = 0; e < c->D; e++)
                    o[e] /= sum;
                lse[(b * c->Hq + h) * c->Sq + i] = mx + log(sum);
            }
    free(s), free(vis);
}

static unsigned draw(unsigned n) { return (unsigned)((tl_uniform() + 1) * 0.5 * n) % n; }

/* Random masks of the kinds in `kinds` for case c; rows and a whole batch
 * entry with nothing visible are made on purpose. */
static void make_masks(const tl_case *c, unsigned kinds, masks *k)
{
    memset(k, 0, sizeof *k);
    sdpa_mask m0 = SDPA_MASK_DEFAULT;
    k->m = m0;
    if (kinds & SDPA_MASK_KIND_SEQ_LEN) {
        k->use_lq = draw(3) != 0, k->use_lkv = 1;
        for (int64_t b = 0; b < c->B; b++) {
            k->lq[b] = (int32_t)(b == 1 ? 0 : 1 + draw((unsigned)c->Sq));
            k->lkv[b] = (int32_t)(b == 2 ? 0 : 1 + draw((unsigned)c->Skv));
        }
        k->m.seq_len_q = k->use_lq ? k->lq : NULL;
        k->m.seq_len_kv = k->lkv;
    }
    if (kinds & SDPA_MASK_KIND_KEY) {
        k->key_bcast = draw(3) == 0;
        const int64_t rows = k->key_bcast ? 1 : c->B;
        k->key = malloc((size_t)(rows * c->Skv));
        for (int64_t i = 0; i < rows * c->Skv; i++)
            k->key[i] = draw(4) != 0; /* mostly visible */
        if (!k->key_bcast && c->B > 1)
            memset(k->key + c->Skv, 0, (size_t)c->Skv); /* batch entry 1 sees nothing */
        k->m.key = k->key;
        k->m.key_stride[0] = k->key_bcast ? 0 : c->Skv, k->m.key_stride[1] = 1;
    }
    if (kinds & SDPA_MASK_KIND_GENERAL) {
        k->gen_bcast_b = draw(2), k->gen_bcast_h = draw(2);
        k->gen_type = draw(2) ? SDPA_MASK_ADDITIVE : SDPA_MASK_BOOL;
        k->gen_dtype = k->gen_type == SDPA_MASK_BOOL ? SDPA_F32 : draw(2) ? SDPA_F32 : c->dtype;
        const int64_t Bg = k->gen_bcast_b ? 1 : c->B, Hg = k->gen_bcast_h ? 1 : c->Hq;
        const int64_t n = Bg * Hg * c->Sq * c->Skv;
        const size_t es = k->gen_type == SDPA_MASK_BOOL ? 1 : sdpa_dtype_size(k->gen_dtype);
        k->gen = malloc((size_t)n * es);
        for (int64_t i = 0; i < n; i++) {
            const int hide = draw(5) == 0 || (i / c->Skv) % 7 == 3; /* some rows see nothing */
            if (k->gen_type == SDPA_MASK_BOOL) {
                ((uint8_t *)k->gen)[i] = !hide;
            } else {
                const float x = hide ? -INFINITY : (float)(2 * tl_uniform());
                if (k->gen_dtype == SDPA_F32)
                    ((float *)k->gen)[i] = x;
                else
                    ((uint16_t *)k->gen)[i] = k->gen_dtype == SDPA_BF16 ? sdpa__f32_to_bf16(x)
                                                                      : sdpa__f32_to_f16(x);
            }
        }
        k->m.general = k->gen, k->m.general_type = k->gen_type, k->m.general_dtype = k->gen_dtype;
        k->m.general_stride[3] = 1, k->m.general_stride[2] = c->Skv;
        k->m.general_stride[1] = k->gen_bcast_h ? 0 : c->Sq * c->Skv;
        k->m.general_stride[0] = k->gen_bcast_b ? 0 : Hg * c->Sq * c->Skv;
    }
}

static void free_masks(masks *k) { free(k->key), free(k->gen); }

/* NaN where sdpa.h says a kernel never looks: query rows past seq_len_q,
 * key and value rows past seq_len_kv. With lengths alone and no causal,
 * also NaN in one visible v element of each batch entry: every real row
 * reads it (NaN in that column) and padding rows must still be zeros. */
static void poison_padding(tl_problem *p, const masks *k, unsigned kinds)
{
    const tl_case *c = &p->c;
    if (kinds == SDPA_MASK_KIND_SEQ_LEN && c->causal == SDPA_CAUSAL_NONE)
        for (int64_t b = 0; b < c->B; b++)
            if (k->lkv[b] > 0)
                sdpa__store_f32(p->v.data, p->v.dtype, sdpa__offset(&p->v, b, 0, 0, 0), NAN);
    for (int64_t b = 0; b < c->B; b++)
        for (int t = 0; t < 3; t++) {
            sdpa_tensor *x = t == 0 ? &p->q : t == 1 ? &p->k : &p->v;
            const int64_t from = t == 0 ? (k->use_lq ? k->lq[b] : c->Sq)
                                        : (k->use_lkv ? k->lkv[b] : c->Skv);
            for (int64_t i = from; i < x->size[1]; i++)
                for (int64_t h = 0; h < x->size[2]; h++)
                    for (int64_t e = 0; e < c->D; e++)
                        sdpa__store_f32(x->data, x->dtype, sdpa__offset(x, b, i, h, e), NAN);
        }
}

static int run(const char *backend, const tl_problem *p, const masks *k, tl_output *o)
{
    sdpa_params prm = SDPA_PARAMS_DEFAULT;
    prm.backend = backend;
    prm.causal = p->c.causal;
    prm.mask = &k->m;
    return sdpa_forward(ctx, &p->q, &p->k, &p->v, &o->t, o->lse, &prm);
}

static void one_case(const tl_case *c, unsigned kinds, char (*backends)[32], int nb)
{
    char what[200], km[48];
    sdpa__mask_kinds_name(kinds, km, sizeof km);
    snprintf(what, sizeof what, "mask=%s B=%lld Sq=%lld Skv=%lld Hq=%lld Hkv=%lld D=%lld %s %s",
             km, (long long)c->B, (long long)c->Sq, (long long)c->Skv, (long long)c->Hq,
             (long long)c->Hkv, (long long)c->D, sdpa_dtype_name(c->dtype),
             sdpa_causal_name(c->causal));
    tl_problem p;
    tl_output want;
    masks k;
    make_masks(c, kinds, &k);
    if (getenv("SDPA_TEST_VERBOSE"))
        printf("  %s\n", what), fflush(stdout);
    if (!tl_problem_make(&p, c) || !tl_output_make(&want, &p)) {
        CHECK(0, "%s: out of memory", what);
        return;
    }
    poison_padding(&p, &k, kinds);
    CHECK_STATUS(run("ref", &p, &k, &want), SDPA_OK);
    /* ref against the independent reading of the rules */
    const size_t n = (size_t)(c->B * c->Sq * c->Hq * c->D), nl = (size_t)(c->B * c->Hq * c->Sq);
    double *o = malloc(sizeof(double) * n), *l = malloc(sizeof(double) * nl);
    oracle(c, &p, &k, o, l);
    double worst = 0, worst_lse = 0;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t i = 0; i < c->Sq; i++)
            for (int64_t h = 0; h < c->Hq; h++)
                for (int64_t e = 0; e < c->D; e++) {
                    const double g = tl_out_get(&want.t, b, i, h, e),
                                 r = o[((b * c->Sq + i) * c->Hq + h) * c->D + e];
                    double d = isnan(g) && isnan(r) ? 0 : fabs(g - r);
                    worst = d <= worst ? worst : (isnan(d) ? INFINITY : d);
                }
    for (size_t i = 0; i < nl; i++) {
        const double g = want.lse[i];
        double d = isinf(l[i]) || isinf(g) ? (g == l[i] ? 0 : INFINITY) : fabs(g - l[i]);
        worst_lse = d <= worst_lse ? worst_lse : (isnan(d) ? INFINITY : d);
    }
    CHECK(worst <= 1e-6 && worst_lse <= 1e-5, "ref %s: max |out - rules| %.3g, |lse| %.3g", what,
          worst, worst_lse);
    free(o), free(l);
    /* every other backend: the same answer, or a refusal naming the mask */
    for (int bi = 0; bi < nb; bi++) {
        sdpa_call_desc d = {.size = sizeof(sdpa_call_desc), .device = SDPA_DEVICE_CPU,
                            .dtype = c->dtype, .B = c->B, .Sq = c->Sq, .Skv = c->Skv, .Hq = c->Hq,
                            .Hkv = c->Hkv, .D = c->D, .causal = c->causal, .want_lse = 1,
                            .backend = backends[bi], .mask = kinds};
        sdpa_decision dec;
        CHECK_STATUS(sdpa_decide(ctx, &d, &dec), SDPA_OK);
        if (dec.n_candidates == 0) {
            CHECK(strstr(dec.error, "mask not supported") || !strstr(dec.error, "mask"),
                  "%s %s: refused without naming the mask: %s", backends[bi], what, dec.error);
            if (strstr(dec.error, "mask not supported")) {
                tl_output got;
                tl_output_make(&got, &p);
                CHECK(run(backends[bi], &p, &k, &got) == SDPA_UNSUPPORTED,
                      "%s %s: a mask it does not take must be refused, not dropped",
                      backends[bi], what);
                tl_output_free(&got);
            }
            continue;
        }
        tl_output got;
        tl_output_make(&got, &p);
        sdpa_status st = run(backends[bi], &p, &k, &got);
        CHECK(st == SDPA_OK, "%s %s: claimed but %s: %s", backends[bi], what,
              sdpa_status_string(st), sdpa_last_error());
        if (st == SDPA_OK) {
            char why[128];
            double diff = tl_max_diff(&got, &want, NULL);
            CHECK(diff <= tl_tolerance(c->dtype, c->out_dtype) + 8e-3, "%s %s: |out - ref| %.3g",
                  backends[bi], what, diff);
            double ld = tl_max_lse_diff(&got, &want, c->B, c->Hq, c->Sq);
            CHECK(ld <= 1e-3 * (1 + sqrt((double)c->Skv)) + 8e-3, "%s %s: |lse - ref| %.3g",
                  backends[bi], what, ld);
            CHECK(tl_output_check(&got, why, sizeof why), "%s %s: %s", backends[bi], what, why);
        }
        tl_output_free(&got);
    }
    tl_output_free(&want), tl_problem_free(&p), free_masks(&k);
}

static void bad_input(void)
{
    tl_case c = {2, 9, 11, 2, 1, 16, SDPA_F32, SDPA_F32, SDPA_CAUSAL_NONE, TL_BSHD, 1,
                 TL_UNIFORM, 0, 0};
    tl_problem p;
    tl_output o;
    tl_problem_make(&p, &c);
    tl_output_make(&o, &p);
    unsigned char *before = malloc(o.bytes);
    memcpy(before, o.mem, o.bytes);
    int32_t lens[2] = {3, 12};
    uint8_t key[22] = {1};
    float add[2 * 2 * 9 * 11];
    struct {
        const char *what, *needle;
        sdpa_mask m;
    } cases[6];
    for (int i = 0; i < 6; i++) {
        sdpa_mask m0 = SDPA_MASK_DEFAULT;
        cases[i].m = m0;
    }
    cases[0].what = "seq_len_kv > Skv", cases[0].needle = "mask->seq_len_kv[1] is 12, expected 0..11";
    cases[0].m.seq_len_kv = lens;
    cases[1].what = "seq_len_q < 0", cases[1].needle = "mask->seq_len_q[0] is -1";
    int32_t neg[2] = {-1, 2};
    cases[1].m.seq_len_q = neg;
    cases[2].what = "negative key stride", cases[2].needle = "mask->key_stride";
    cases[2].m.key = key, cases[2].m.key_stride[0] = -11, cases[2].m.key_stride[1] = 1;
    cases[3].what = "additive in another dtype", cases[3].needle = "mask->general_dtype is bf16";
    cases[3].m.general = add, cases[3].m.general_type = SDPA_MASK_ADDITIVE;
    cases[3].m.general_dtype = SDPA_BF16;
    cases[4].what = "unknown mask type", cases[4].needle = "mask->general_type is 7";
    cases[4].m.general = add, cases[4].m.general_type = (sdpa_mask_type)7;
    cases[5].what = "general stride overflow", cases[5].needle = "mask->general_stride";
    cases[5].m.general = add, cases[5].m.general_type = SDPA_MASK_BOOL;
    cases[5].m.general_stride[0] = cases[5].m.general_stride[1] = INT64_MAX; /* sum overflows */
    for (int i = 0; i < 6; i++) {
        sdpa_params prm = SDPA_PARAMS_DEFAULT;
        prm.mask = &cases[i].m;
        prm.backend = "ref";
        sdpa_status st = sdpa_forward(ctx, &p.q, &p.k, &p.v, &o.t, o.lse, &prm);
        CHECK(st == SDPA_INVALID_ARGUMENT && strstr(sdpa_last_error(), cases[i].needle),
              "%s: %s: %s (expected '%s')", cases[i].what, sdpa_status_string(st),
              sdpa_last_error(), cases[i].needle);
        CHECK(memcmp(before, o.mem, o.bytes) == 0, "%s: the output was written", cases[i].what);
    }
    free(before);
    tl_output_free(&o), tl_problem_free(&p);
}

/* The mask kind is part of the decision: the rule language matches it and
 * explain names why a backend is passed over. */
static void dispatch(void)
{
    sdpa_call_desc d = {.size = sizeof(sdpa_call_desc), .device = SDPA_DEVICE_CPU,
                        .dtype = SDPA_F32, .B = 1, .Sq = 64, .Skv = 64, .Hq = 2, .Hkv = 2, .D = 64,
                        .mask = SDPA_MASK_KIND_SEQ_LEN | SDPA_MASK_KIND_KEY};
    sdpa_context *c2 = tl_context("cpu:isa=portable");
    CHECK_STATUS(sdpa_context_load_policy_text(c2,
                                               "rule keys\nmask key\ntry ref\nevidence t\n"
                                               "rule plain\nmask none\ntry cpu.portable ref\n"
                                               "evidence t\n",
                                               "m.rules"),
                 SDPA_OK);
    sdpa_decision dec;
    CHECK_STATUS(sdpa_decide(c2, &d, &dec), SDPA_OK);
    CHECK(strcmp(dec.rule, "keys") == 0 && dec.n_candidates == 1 &&
              strcmp(dec.candidates[0], "ref") == 0,
          "seq_len+key matched 'mask key' (its most general kind): rule %s", dec.rule);
    d.mask = 0;
    CHECK_STATUS(sdpa_decide(c2, &d, &dec), SDPA_OK);
    CHECK(strcmp(dec.rule, "plain") == 0, "no mask matched 'mask none': rule %s", dec.rule);
    sdpa_context *gpu = tl_context("cuda:sm_100"); /* declared: no masks yet */
    sdpa_call_desc g = d;
    g.device = SDPA_DEVICE_CUDA, g.dtype = SDPA_BF16, g.mask = SDPA_MASK_KIND_GENERAL;
    g.backend = "cuda.flash";
    CHECK_STATUS(sdpa_decide(gpu, &g, &dec), SDPA_OK);
    CHECK(dec.status == SDPA_UNSUPPORTED && strstr(dec.error, "general mask not supported"),
          "explicit backend without the mask: %s", dec.error);
    sdpa_context_destroy(gpu);
    d.mask = SDPA_MASK_KIND_GENERAL;
    char *text;
    d.backend = NULL;
    CHECK_STATUS(sdpa_explain(c2, &d, 1, &text), SDPA_OK);
    CHECK(strstr(text, "\"mask\":\"general\"") != NULL, "explain JSON names the mask: %s", text);
    sdpa_free(text);
    sdpa_context_destroy(c2);
}

int main(void)
{
    tl_seed_from_env();
    ctx = tl_context(NULL);
#ifdef SDPA_TEST_AMX_EMULATED
    if (sdpa__ctx_add_backend(ctx, sdpa__cpu_amx_emulated()) != SDPA_OK) {
        printf("cannot add cpu.amx-emulated: %s\n", sdpa_last_error());
        return 1;
    }
#endif
    char backends[SDPA_MAX_BACKENDS][32];
    int nb = 0;
    for (int i = 0; i < sdpa_backend_count(ctx); i++) {
        sdpa_backend_info b;
        if (sdpa_backend_get(ctx, i, &b) == SDPA_OK && b.present && b.device == SDPA_DEVICE_CPU &&
            strcmp(b.name, "ref") != 0)
            snprintf(backends[nb++], sizeof backends[0], "%s", b.name);
    }
    const unsigned kinds[] = {SDPA_MASK_KIND_SEQ_LEN, SDPA_MASK_KIND_KEY, SDPA_MASK_KIND_GENERAL,
                              SDPA_MASK_KIND_SEQ_LEN | SDPA_MASK_KIND_KEY,
                              SDPA_MASK_KIND_SEQ_LEN | SDPA_MASK_KIND_KEY |
                                  SDPA_MASK_KIND_GENERAL};
    for (size_t ki = 0; ki < sizeof kinds / sizeof *kinds; ki++)
        for (int causal = 0; causal <= 2; causal++) {
            /* rows with NaN after their 24 elements (never read) */
            tl_case c = {3, 23, 37, 4, 2, 24, SDPA_F32, SDPA_F32, (sdpa_causal)causal,
                         TL_STRIDED_NAN, 1, TL_UNIFORM, 0, 0};
            one_case(&c, kinds[ki], backends, nb);
            c.dtype = SDPA_BF16, c.Sq = 40, c.Skv = 17, c.Hkv = 4, c.layout = TL_BHSD;
            one_case(&c, kinds[ki], backends, nb);
            /* several query blocks (BQ up to 64) and key blocks (BK 128) */
            tl_case big = {2, 150, 333, 2, 1, 40, causal == 0 ? SDPA_F32 : causal == 1 ? SDPA_F16 : SDPA_BF16, SDPA_F32,
                           (sdpa_causal)causal, TL_BSHD, 1, TL_UNIFORM, 0, 0};
            one_case(&big, kinds[ki], backends, nb);
            /* at most 8 query rows per KV head (the CPU kernels' few-query
             * path, flash_decode.h): grouped-query rows of one KV head
             * together, and keys cut into chunks merged after (one KV
             * head, 700 keys) */
            tl_case few = {3, 2, 37, 8, 4, 24, SDPA_F32, SDPA_F32, (sdpa_causal)causal,
                           TL_STRIDED_NAN, 1, TL_UNIFORM, 0, 0};
            one_case(&few, kinds[ki], backends, nb);
            tl_case split = {1, 1, 700, 4, 1, 40, causal == 1 ? SDPA_F16 : SDPA_BF16, SDPA_F32,
                             (sdpa_causal)causal, TL_BSHD, 1, TL_UNIFORM, 0, 0};
            one_case(&split, kinds[ki], backends, nb);
        }
    bad_input();
    dispatch();
    sdpa_context_destroy(ctx);
    return tl_finish();
}
