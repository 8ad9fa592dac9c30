/*
 * test_unfused_emulated.cpp - cuda.unfused's row softmax kernel
 * (src/cuda/unfused_softmax.cuh), unchanged, run on the CPU under the SIMT
 * emulator, with the masks it declares: sequence lengths (a zero length
 * among them) and a key mask (a batch entry that sees nothing), alone and
 * together, with both causal alignments and grouped-query heads.
 *
 * The two products around it are cuBLAS on a GPU; here they are float
 * loops in this file, with V widened as unfused.cu's widen_rows does
 * (keys past seq_len_kv as zeros), and the rows that see no key written
 * as mask_rows.cu writes them. O and LSE are compared with ref on the
 * same inputs and masks; the padding holds NaN, which must never reach a
 * real row. What this cannot see: cuBLAS's layouts and the launch code,
 * which scripts/gpu-check.sh runs on a GPU.
 */
#include "simt_emulator.h"

extern "C" {
#include "core/core.h"
#include "cuda/plugin.h"
#include "support/testlib.h"
}

#define UNFUSED_EMULATED 1
#define SOFTMAX_SHARED(name) float *name = (float *)emu_smem
#include "cuda/unfused_softmax.cuh"

static softmax_args emu_args;
static void body(void) { softmax_rows(emu_args); }

static sdpa_context *ctx;

static double get(const sdpa_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d)
{
    return tl_out_get(t, b, s, h, d);
}

static void check(tl_case c, const sdpa_mask *mask)
{
    char what[200];
    snprintf(what, sizeof what, "B=%lld Sq=%lld Skv=%lld Hq=%lld Hkv=%lld D=%lld causal=%s mask=%s%s",
             (long long)c.B, (long long)c.Sq, (long long)c.Skv, (long long)c.Hq,
             (long long)c.Hkv, (long long)c.D, sdpa_causal_name(c.causal),
             mask->seq_len_q || mask->seq_len_kv ? "seq_len" : "", mask->key ? "+key" : "");
    tl_problem p;
    tl_output want;
    if (!tl_problem_make(&p, &c) || !tl_output_make(&want, &p)) {
        CHECK(0, "%s: out of memory", what);
        return;
    }
    for (int64_t b = 0; b < c.B; b++) /* NaN in the padding: f32 inputs */
        for (int t = 0; t < 3; t++) {
            sdpa_tensor *x = t == 0 ? &p.q : t == 1 ? &p.k : &p.v;
            const int32_t *len = t == 0 ? mask->seq_len_q : mask->seq_len_kv;
            for (int64_t i = len ? len[b] : x->size[1]; i < x->size[1]; i++)
                for (int64_t h = 0; h < x->size[2]; h++)
                    for (int64_t e = 0; e < c.D; e++)
                        ((float *)x->data)[sdpa__offset(x, b, i, h, e)] = NAN;
        }
    sdpa_params prm = SDPA_PARAMS_DEFAULT;
    prm.causal = c.causal, prm.mask = mask, prm.backend = "ref";
    CHECK_STATUS(sdpa_forward(ctx, &p.q, &p.k, &p.v, &want.t, want.lse, &prm), SDPA_OK);
    const double scale = 1.0 / sqrt((double)c.D);
    float *S = (float *)malloc(sizeof(float) * (size_t)(c.Sq * c.Skv));
    float *lse = (float *)malloc(sizeof(float) * (size_t)c.Sq);
    double worst = 0, worst_lse = 0;
    for (int64_t b = 0; b < c.B; b++)
        for (int64_t h = 0; h < c.Hq; h++) {
            const int64_t hk = h / (c.Hq / c.Hkv);
            const int64_t lq = mask->seq_len_q ? mask->seq_len_q[b] : c.Sq;
            const int64_t lkv = mask->seq_len_kv ? mask->seq_len_kv[b] : c.Skv;
            for (int64_t i = 0; i < c.Sq; i++) /* S = scale Q K^T, as cuBLAS would */
                for (int64_t j = 0; j < c.Skv; j++) {
                    double dot = 0;
                    for (int64_t e = 0; e < c.D; e++)
                        dot += get(&p.q, b, i, h, e) * get(&p.k, b, j, hk, e);
                    S[i * c.Skv + j] = (float)(dot * scale);
                }
            emu_args = softmax_args{S, lse, c.Sq, c.Skv, 0, b, (int)c.causal, mask->seq_len_q,
                                    mask->seq_len_kv, mask->key, mask->key_stride[0],
                                    mask->key_stride[1]};
            CHECK(emu_launch(emu_dim3{(unsigned)c.Sq, 1, 1}, sizeof(float) * SOFTMAX_THREADS,
                             body) == 0,
                  "%s: the block did not finish", what);
            for (int64_t i = 0; i < c.Sq; i++) {
                int64_t seen = i < lq ? lkv : 0; /* mask_rows.cu's rule */
                if (c.causal != SDPA_CAUSAL_NONE && seen > 0) {
                    const int64_t last = i + (c.causal == SDPA_CAUSAL_BOTTOM_RIGHT ? lkv - lq : 0);
                    seen = last < 0 ? 0 : (last + 1 < lkv ? last + 1 : lkv);
                }
                for (int64_t e = 0; e < c.D; e++) {
                    double o = 0; /* P V with V widened: zeros past seq_len_kv */
                    for (int64_t j = 0; j < lkv; j++)
                        o += (double)S[i * c.Skv + j] * get(&p.v, b, j, hk, e);
                    if (seen <= 0)
                        o = 0;
                    const double w = get(&want.t, b, i, h, e), d = fabs(o - w);
                    worst = d <= worst ? worst : (isnan(d) ? INFINITY : d);
                }
                const double gl = seen <= 0 ? -INFINITY : lse[i];
                const double wl = want.lse[(b * c.Hq + h) * c.Sq + i];
                const double dl = isinf(gl) || isinf(wl) ? (gl == wl ? 0 : INFINITY) : fabs(gl - wl);
                worst_lse = dl <= worst_lse ? worst_lse : (isnan(dl) ? INFINITY : dl);
            }
        }
    CHECK(worst <= 1e-5 && worst_lse <= 1e-5, "%s: max |out - ref| %.3g, |lse - ref| %.3g", what,
          worst, worst_lse);
    free(S), free(lse);
    tl_output_free(&want), tl_problem_free(&p);
}

static tl_case mk(int64_t B, int64_t Sq, int64_t Skv, int64_t Hq, int64_t Hkv, int64_t D,
                  sdpa_causal causal)
{
    tl_case c = {B, Sq, Skv, Hq, Hkv, D, SDPA_F32, SDPA_F32, causal, TL_BSHD, 1, TL_UNIFORM, 0, 0};
    return c;
}

int main(void)
{
    tl_seed_from_env();
    emu_seed(tl_seed());
    ctx = tl_context(NULL);
    if (!ctx)
        return 1;
    int32_t lq[3] = {40, 0, 17}, lkv[3] = {33, 77, 0}; /* entry 0: more queries than keys */
    static uint8_t key[3 * 300];
    for (int i = 0; i < 3 * 300; i++)
        key[i] = i >= 300 && i < 600 ? 0 : (i * 7919) % 5 != 0;
    sdpa_mask lens = SDPA_MASK_DEFAULT, keys = SDPA_MASK_DEFAULT, both;
    lens.seq_len_q = lq, lens.seq_len_kv = lkv;
    keys.key = key, keys.key_stride[0] = 300, keys.key_stride[1] = 1;
    both = lens, both.key = key, both.key_stride[0] = 300, both.key_stride[1] = 1;
    sdpa_mask kv_only = SDPA_MASK_DEFAULT;
    kv_only.seq_len_kv = lkv;
    for (int causal = 0; causal <= 2; causal++) {
        check(mk(3, 50, 300, 2, 1, 16, (sdpa_causal)causal), &lens);
        check(mk(3, 50, 300, 2, 2, 16, (sdpa_causal)causal), &keys);
        check(mk(3, 50, 300, 4, 2, 8, (sdpa_causal)causal), &both);
        check(mk(3, 50, 300, 1, 1, 8, (sdpa_causal)causal), &kv_only);
    }
    sdpa_context_destroy(ctx);
    return tl_finish();
}
