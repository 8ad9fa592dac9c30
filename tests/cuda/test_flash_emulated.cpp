/*
 * test_flash_emulated.cpp - cuda.flash's kernel, unchanged, run on the CPU
 * under the SIMT emulator (simt_emulator.h) against the float64 reference.
 *
 * The same call preparation as the backend (sdpa__call_prepare, then the
 * kernel's own flash_args_make), the same grid, the same dynamic shared
 * memory size; then ref on the same inputs. Cases: both kernels (D = 64
 * and 128) and padded head dims (32, 72, 80, 96); bf16 and f16; GQA and
 * MQA; cross-attention with 77 and 513 keys; causal in both alignments,
 * including rows that see no key; BSHD, BHSD and a strided view with gaps
 * (which takes the scalar load path); f32, f16 and bf16 outputs; LSE;
 * guard bytes; the masks cuda.flash declares (sequence lengths, with a
 * zero length and NaN in the padding it must never read, and a key
 * mask with a batch entry that sees nothing), alone, together, and with
 * both causal alignments. A GPU run (test_cuda_grid) is still the final word; this
 * finds the kernel's own mistakes before a GPU is at hand.
 *
 * Tolerance: P is rounded to the input type for the second product, so
 * the bound is the output's plus 2 * 2^-bits (bits: 8 for bf16, 11 for f16).
 */
#include "simt_emulator.h"

extern "C" {
#include "core/core.h"
#include "cuda/plugin.h"
#include "support/testlib.h"
}

#include "cuda/flash_kernel.cuh"

static flash_args emu_args;

template <int BF16, int HD, int PIPE>
static void body(void)
{
    flash_fwd<BF16, HD, PIPE>(emu_args);
}

static int pipe; /* the kernel variant under test */

static sdpa_context *ctx;

static void check(tl_case c, const sdpa_mask *mask = NULL)
{
    char what[200];
    snprintf(what, sizeof what,
             "v%d B=%lld Sq=%lld Skv=%lld Hq=%lld Hkv=%lld D=%lld %s->%s causal=%s %s", pipe,
             (long long)c.B, (long long)c.Sq, (long long)c.Skv, (long long)c.Hq, (long long)c.Hkv,
             (long long)c.D, sdpa_dtype_name(c.dtype), sdpa_dtype_name(c.out_dtype),
             sdpa_causal_name(c.causal), tl_layout_name(c.layout));
    tl_problem p;
    tl_output got, want;
    if (!tl_problem_make(&p, &c) || !tl_output_make(&got, &p) || !tl_output_make(&want, &p)) {
        CHECK(0, "%s: out of memory", what);
        return;
    }
    sdpa_params prm = SDPA_PARAMS_DEFAULT;
    prm.causal = c.causal;
    prm.mask = mask;
    if (mask) { /* NaN where the kernel must not look: padding rows and keys */
        for (int64_t b = 0; b < c.B; b++)
            for (int t = 0; t < 3; t++) {
                sdpa_tensor *x = t == 0 ? &p.q : t == 1 ? &p.k : &p.v;
                const int32_t *len = t == 0 ? mask->seq_len_q : mask->seq_len_kv;
                for (int64_t i = len ? len[b] : x->size[1]; i < x->size[1]; i++)
                    for (int64_t h = 0; h < x->size[2]; h++)
                        for (int64_t e = 0; e < c.D; e++) /* inputs are f16 or bf16 */
                            ((uint16_t *)x->data)[sdpa__offset(x, b, i, h, e)] =
                                x->dtype == SDPA_BF16 ? 0x7fc0 : 0x7e00;
            }
        snprintf(what + strlen(what), sizeof what - strlen(what), " mask=%s%s",
                 mask->seq_len_q || mask->seq_len_kv ? "seq_len" : "",
                 mask->key ? "+key" : "");
    }
    sdpa_call call;
    CHECK_STATUS(sdpa__call_prepare(&p.q, &p.k, &p.v, &got.t, got.lse, &prm, &call), SDPA_OK);
    const sdpa_cuda_call pc = {call.q,     call.k,      call.v,           call.out,    call.lse,
                               call.scale, call.causal, call.deterministic, call.stream, call.desc,
                               call.mask,  pipe};
    flash_args_make(&pc, &emu_args);
    const int hd = c.D <= 64 ? 64 : 128, bf16 = c.dtype == SDPA_BF16;
    void (*const fns[2][2][2])(void) = {
        {{body<0, 64, 0>, body<0, 64, 1>}, {body<0, 128, 0>, body<0, 128, 1>}},
        {{body<1, 64, 0>, body<1, 64, 1>}, {body<1, 128, 0>, body<1, 128, 1>}}};
    const emu_dim3 grid = {(unsigned)((c.Sq + BM - 1) / BM), (unsigned)c.Hq, (unsigned)c.B};
    CHECK(emu_launch(grid, flash_smem_bytes(hd, pipe), fns[bf16][hd == 128][pipe]) == 0,
          "%s: the block did not finish", what);
    prm.backend = "ref";
    CHECK_STATUS(sdpa_forward(ctx, &p.q, &p.k, &p.v, &want.t, want.lse, &prm), SDPA_OK);
    const double tol = tl_tolerance(c.dtype, c.out_dtype) + tl_product_tolerance(bf16 ? 8 : 11);
    int64_t at = -1;
    const double diff = tl_max_diff(&got, &want, &at);
    CHECK(diff <= tol, "%s: max |out - ref| = %.3g > %.3g at element %lld", what, diff, tol,
          (long long)at);
    const double ld = tl_max_lse_diff(&got, &want, c.B, c.Hq, c.Sq);
    CHECK(ld <= 1e-3, "%s: max |lse - ref| = %.3g", what, ld);
    char why[128];
    CHECK(tl_output_check(&got, why, sizeof why), "%s: %s", what, why);
    tl_output_free(&got), tl_output_free(&want), tl_problem_free(&p);
}

static tl_case mk(int64_t B, int64_t Sq, int64_t Skv, int64_t Hq, int64_t Hkv, int64_t D,
                  sdpa_dtype t, sdpa_causal causal, tl_layout layout)
{
    return tl_case{B, Sq, Skv, Hq, Hkv, D, t, t, causal, layout, 1, TL_UNIFORM, 0, 0};
}

int main(void)
{
    tl_seed_from_env();
    emu_seed(tl_seed());
    ctx = tl_context(NULL);
    if (!ctx)
        return 1;
    for (pipe = 0; pipe <= 1; pipe++) { /* both kernel variants, the same cases */
        const sdpa_dtype bf = SDPA_BF16, hf = SDPA_F16;
        /* both kernels and the padded head dims */
        const int64_t dims[] = {64, 128, 32, 72, 80, 96};
        for (size_t i = 0; i < sizeof dims / sizeof *dims; i++)
            check(mk(1, 70, 130, 2, 2, dims[i], i % 2 ? hf : bf, SDPA_CAUSAL_NONE, TL_BSHD));
        /* causal, both alignments; rows that see no key (bottom-right, Sq > Skv) */
        check(mk(1, 129, 129, 2, 1, 64, bf, SDPA_CAUSAL_TOP_LEFT, TL_BHSD));
        check(mk(1, 100, 300, 4, 2, 128, hf, SDPA_CAUSAL_BOTTOM_RIGHT, TL_BSHD));
        check(mk(2, 90, 33, 2, 2, 64, bf, SDPA_CAUSAL_BOTTOM_RIGHT, TL_BSHD));
        check(mk(1, 33, 90, 2, 2, 64, bf, SDPA_CAUSAL_TOP_LEFT, TL_BSHD));
        /* cross-attention to text tokens; GQA and MQA; a strided view (scalar loads) */
        check(mk(2, 65, 77, 4, 1, 128, bf, SDPA_CAUSAL_NONE, TL_BSHD));
        check(mk(1, 17, 513, 4, 2, 64, hf, SDPA_CAUSAL_NONE, TL_STRIDED));
        check(mk(1, 1, 1, 1, 1, 64, bf, SDPA_CAUSAL_NONE, TL_BSHD));
        /* output dtypes */
        tl_case c = mk(1, 64, 64, 2, 2, 128, bf, SDPA_CAUSAL_NONE, TL_BSHD);
        c.out_dtype = SDPA_F32;
        check(c);
        c.dtype = hf, c.out_dtype = bf;
        check(c);
        /* masks: lengths (one zero), a key mask (one batch entry sees
         * nothing), both, with causal */
        int32_t lq[3] = {70, 0, 33}, lkv[3] = {129, 77, 0};
        static uint8_t key[3 * 150];
        for (int i = 0; i < 3 * 150; i++)
            key[i] = i >= 150 && i < 300 ? 0 : (i * 7919) % 5 != 0;
        sdpa_mask lens = SDPA_MASK_DEFAULT, keys = SDPA_MASK_DEFAULT, both = SDPA_MASK_DEFAULT;
        lens.seq_len_q = lq, lens.seq_len_kv = lkv;
        keys.key = key, keys.key_stride[0] = 150, keys.key_stride[1] = 1;
        both = lens, both.key = key, both.key_stride[0] = 150, both.key_stride[1] = 1;
        check(mk(3, 100, 150, 2, 1, 64, bf, SDPA_CAUSAL_NONE, TL_BSHD), &lens);
        check(mk(3, 100, 150, 4, 2, 128, hf, SDPA_CAUSAL_NONE, TL_BHSD), &keys);
        check(mk(3, 100, 150, 2, 2, 64, hf, SDPA_CAUSAL_BOTTOM_RIGHT, TL_BSHD), &both);
        check(mk(3, 100, 150, 2, 2, 72, bf, SDPA_CAUSAL_TOP_LEFT, TL_STRIDED), &both);
    }
    sdpa_context_destroy(ctx);
    return tl_finish();
}
