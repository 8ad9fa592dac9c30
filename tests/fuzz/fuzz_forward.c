/*
 * fuzz_forward.c - libFuzzer target: differential fuzzing of sdpa_forward.
 *
 * The input's bytes choose a call: B, Sq, Skv, Hq, Hkv and D (1..40, odd
 * and 1 included), the input dtype and the output's, k and v in another
 * dtype than q (f32 over f16 or bf16 and the reverse), the layout (BSHD,
 * BHSD, a view with gaps, slices of one packed QKV buffer), causal, the
 * scale (default, or negative, zero-crossing and large ones), LSE or not,
 * every mask kind (sequence lengths, a key mask broadcast or not, a boolean
 * or additive general mask broadcast over B and H, a 1-D window, a block
 * map with or without bits, and malformed maps that must be refused) and what the values
 * hold (uniform, peaked scores, NaN or Inf in q, k or v, huge v, denormal
 * q). The data come from a generator seeded by the bytes.
 *
 * The call runs on ref and on every present CPU backend, each named
 * explicitly. For each backend:
 *   - its refusal must agree with sdpa_decide for the same description
 *     (explain's verdict): accepted -> the run is OK, refused -> UNSUPPORTED
 *     and nothing written;
 *   - the output is within the test grid's bound of ref's (tl_tolerance of
 *     the dtypes plus tl_product_tolerance of its product bits, relative to
 *     max |v| and at least 1), and the LSE within 1e-3 (3e-2 with bf16
 *     products);
 *   - the non-finite rules of sdpa.h: with NaN or Inf in q or k, a row is
 *     all NaN exactly where ref's is; with NaN or Inf in v only the rows ref
 *     keeps finite and the backend keeps finite are compared (the rule
 *     allows 0 * NaN on rows that do not see the key);
 *   - guard bytes after the output and the LSE, and the gaps of a strided
 *     output, are untouched;
 *   - sdpa_forward_share, shares 0 and 1 of 2 run one after the other (a
 *     share waits on no other): bitwise the call on this 2-thread context,
 *     or, where the backend takes no shares, refused as sdpa_decide says
 *     (desc.shares = 2) with nothing written;
 *   - where the values are finite, the backward pass of the same call
 *     (sdpa_backward from ref's out and LSE, a random dout) on every
 *     backend with one, against ref's gradients relative to their
 *     magnitude (at least dout's), refusals against sdpa_decide, guard bytes.
 * A failure aborts (libFuzzer keeps the input); ASan/UBSan watch the rest.
 * Run by scripts/test.sh for a bounded time over tests/fuzz/corpus/forward;
 * FUZZ_DEBUG=1 prints each input's call (to read a crash file's case).
 */
#include "support/testlib.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

typedef struct bytes {
    const unsigned char *p;
    size_t n;
} bytes;


/* The largest |got - ref| over the outputs both have finite. */
static double out_distance(const sdpa_tensor *got, const sdpa_tensor *ref, int64_t B, int64_t Sq,
                           int64_t Hq, int64_t D)
{
    double worst = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < Sq; s++)
            for (int64_t h = 0; h < Hq; h++)
                for (int64_t d = 0; d < D; d++) {
                    const double g = tl_out_get(got, b, s, h, d), w = tl_out_get(ref, b, s, h, d);
                    if (isfinite(g) && isfinite(w) && fabs(g - w) > worst)
                        worst = fabs(g - w);
                }
    return worst;
}

static unsigned take(bytes *b, unsigned range)
{
    if (!b->n)
        return 0;
    b->n--;
    return (unsigned)*b->p++ % range;
}

static uint64_t rng_state;
static double rnd(void) /* [-1, 1) */
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 4503599627370496.0 - 1.0;
}

static sdpa_context *ctx;
static const char *names[SDPA_MAX_BACKENDS];
static int bits[SDPA_MAX_BACKENDS];
static int takes_shares[SDPA_MAX_BACKENDS]; /* sdpa_backend_info.shares */
static int n_names;

static void fail_here(const char *what, const char *backend, const char *detail)
{
    fprintf(stderr, "fuzz_forward: %s on %s: %s\n", what, backend, detail);
    abort();
}

static void store(void *p, sdpa_dtype t, int64_t i, double x)
{
    float f = (float)x;
    sdpa_convert(&f, SDPA_F32, (char *)p + (size_t)i * sdpa_dtype_size(t), t, 1);
}

/* Element offset of (b, s, h, d) in a view. */
static int64_t at(const sdpa_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d)
{
    return b * t->stride[0] + s * t->stride[1] + h * t->stride[2] + d * t->stride[3];
}

/* Max |x| over a view's elements (finite ones). */
static double max_abs_view(const sdpa_tensor *t)
{
    double m = 0;
    for (int64_t b = 0; b < t->size[0]; b++)
        for (int64_t s = 0; s < t->size[1]; s++)
            for (int64_t h = 0; h < t->size[2]; h++)
                for (int64_t d = 0; d < t->size[3]; d++) {
                    const double x = fabs(tl_out_get(t, b, s, h, d));
                    m = isfinite(x) && x > m ? x : m;
                }
    return m;
}

/* ref's forward result (out f32, lse) of the call t/p, its gradients for a
 * random dout, and every backend with a backward pass against them. */
static void fuzz_backward(const sdpa_tensor *t, const sdpa_tensor *out, const float *lse,
                          const sdpa_params *p_in, const sdpa_call_desc *desc_in, sdpa_dtype gdt,
                          int peaked)
{
    const int64_t B = t[0].size[0], Sq = t[0].size[1], Hq = t[0].size[2], D = t[0].size[3];
    const int64_t Skv = t[1].size[1], Hkv = t[1].size[2];
    const size_t nq = (size_t)(B * Sq * Hq * D), nk = (size_t)(B * Skv * Hkv * D);
    float *dout = malloc(nq * sizeof(float)), *want[3];
    for (size_t i = 0; i < nq; i++)
        dout[i] = (float)rnd();
    const sdpa_tensor tdo = sdpa_tensor_bshd(dout, SDPA_F32, B, Sq, Hq, D);
    const size_t n3[3] = {nq, nk, nk};
    sdpa_tensor tw[3];
    for (int g = 0; g < 3; g++) {
        want[g] = malloc(n3[g] * sizeof(float));
        tw[g] = sdpa_tensor_bshd(want[g], SDPA_F32, B, g ? Skv : Sq, g ? Hkv : Hq, D);
    }
    sdpa_params p = *p_in;
    p.backend = "ref";
    if (sdpa_backward(ctx, &t[0], &t[1], &t[2], out, lse, &tdo, NULL, &tw[0], &tw[1], &tw[2],
                      &p) != SDPA_OK)
        fail_here("the reference's backward failed", "ref", sdpa_last_error());
    /* the gradients' magnitude, and at least dout's: dv's terms are P dO
     * with P <= 1, so its rounding is relative to |dO| however much of the
     * sum cancels (one key and 4 queries once summed 4 values of dO to 1e-4
     * of their size; 3e-8 apart in f32 failed a bound of 1e-4 of that) */
    double scale = max_abs_view(&tdo);
    for (int g = 0; g < 3; g++) {
        const double m = max_abs_view(&tw[g]);
        scale = m > scale ? m : scale;
    }
    sdpa_call_desc desc = *desc_in;
    desc.backward = 1, desc.want_lse = 1;
    const size_t es = sdpa_dtype_size(gdt);
    unsigned char *got[3];
    for (int g = 0; g < 3; g++)
        got[g] = malloc(n3[g] * es + TL_GUARD);
    static sdpa_decision dec;
    for (int n = 0; n < n_names; n++) {
        desc.backend = names[n];
        const int accepts = sdpa_decide(ctx, &desc, &dec) == SDPA_OK && dec.status == SDPA_OK;
        sdpa_tensor tg[3];
        for (int g = 0; g < 3; g++) {
            memset(got[g], 0xA5, n3[g] * es + TL_GUARD);
            tg[g] = sdpa_tensor_bshd(got[g], gdt, B, g ? Skv : Sq, g ? Hkv : Hq, D);
        }
        p.backend = names[n];
        const sdpa_status st = sdpa_backward(ctx, &t[0], &t[1], &t[2], out, lse, &tdo, NULL,
                                             &tg[0], &tg[1], &tg[2], &p);
        if (!accepts) {
            if (st != SDPA_UNSUPPORTED)
                fail_here("explain refuses the backward call but it did not say UNSUPPORTED",
                          names[n], sdpa_last_error());
            for (int g = 0; g < 3; g++)
                for (size_t i = 0; i < n3[g] * es + TL_GUARD; i++)
                    if (got[g][i] != 0xA5)
                        fail_here("a refused backward call wrote a gradient", names[n], "");
            continue;
        }
        if (st != SDPA_OK)
            fail_here("explain accepts the backward call but it failed", names[n],
                      sdpa_last_error());
        /* relative to the gradients' magnitude: f32 accumulation, the
         * stored dtype, and for peaked scores the f32 rounding of scores
         * near 100 (as test_backward) */
        const double tol = (gdt == SDPA_F32 ? 1e-4 : gdt == SDPA_F16 ? 4e-3 : 3e-2) +
                           (peaked ? 32.0 * (double)D * ldexp(1.0, -22) : 0.0);
        for (int g = 0; g < 3; g++) {
            for (size_t i = n3[g] * es; i < n3[g] * es + TL_GUARD; i++)
                if (got[g][i] != 0xA5)
                    fail_here("the guard bytes after a gradient were written", names[n], "");
            for (size_t i = 0; i < n3[g]; i++) {
                const double w = want[g][i];
                const double x = tl_out_get(&tg[g], 0, 0, 0, (int64_t)i); /* contiguous */
                if (!(fabs(x - w) <= tol * fmax(scale, 1e-30) + 1e-30)) {
                    char why[160];
                    snprintf(why, sizeof why, "%s[%zu] = %g, ref %g, bound %g",
                             g == 0 ? "dq" : g == 1 ? "dk" : "dv", i, x, w, tol * scale);
                    fail_here("a gradient is off", names[n], why);
                }
            }
        }
    }
    for (int g = 0; g < 3; g++)
        free(want[g]), free(got[g]);
    free(dout);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    if (!ctx) {
        sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
        o.threads = 2;
        o.ignore_env = 1;
        if (sdpa_context_create(&o, &ctx) != SDPA_OK)
            abort();
        for (int i = 0; i < sdpa_backend_count(ctx); i++) {
            sdpa_backend_info b;
            sdpa_backend_get(ctx, i, &b);
            if (b.present && b.device == SDPA_DEVICE_CPU && strcmp(b.name, "ref") != 0)
                bits[n_names] = b.product_bits, takes_shares[n_names] = b.shares,
                names[n_names++] = b.name;
        }
    }
    bytes in = {data, size};
    const int64_t B = 1 + take(&in, 2), Sq = 1 + take(&in, 40), Skv = 1 + take(&in, 40);
    const int64_t Hkv = 1 + take(&in, 3), Hq = Hkv * (1 + take(&in, 3)), D = 1 + take(&in, 40);
    static const sdpa_dtype dtypes[3] = {SDPA_F32, SDPA_F16, SDPA_BF16};
    const sdpa_dtype dt = dtypes[take(&in, 3)], odt = take(&in, 2) ? dt : SDPA_F32;
    const unsigned layout = take(&in, 4); /* bshd, bhsd, gaps, packed qkv */
    const sdpa_causal causal = (sdpa_causal)take(&in, 3);
    const unsigned scale_kind = take(&in, 4), values = take(&in, 8);
    const int want_lse = take(&in, 2);
    const unsigned lens = take(&in, 4), keyk = take(&in, 3), general = take(&in, 5);
    /* last, so that the corpus's inputs keep what they meant (a missing
     * byte reads 0: k and v in q's dtype) */
    const unsigned mixed = take(&in, 3);
    const sdpa_dtype kvdt = !mixed ? dt : dt != SDPA_F32 ? SDPA_F32 : mixed == 1 ? SDPA_F16 : SDPA_BF16;
    const sdpa_dtype dt3[3] = {dt, kvdt, kvdt};
    uint64_t h = 1469598103934665603ull; /* the data: seeded by all the bytes */
    for (size_t i = 0; i < size; i++)
        h = (h ^ data[i]) * 1099511628211ull;
    rng_state = h | 1;

    /* Inputs in one buffer each (packed: one buffer for all three). */
    const int packed = layout == 3 && Sq == Skv && Hq == Hkv && kvdt == dt;
    const size_t es = sdpa_dtype_size(dt);
    sdpa_tensor t[3];
    void *mem[3] = {NULL, NULL, NULL};
    const int64_t S3[3] = {Sq, Skv, Skv}, H3[3] = {Hq, Hkv, Hkv};
    if (packed) {
        mem[0] = malloc((size_t)(B * Sq * 3 * Hq * D) * es);
        for (int i = 0; i < 3; i++) {
            t[i] = sdpa_tensor_bshd((char *)mem[0] + (size_t)(i * Hq * D) * es, dt, B, Sq, Hq, D);
            t[i].stride[1] = 3 * Hq * D, t[i].stride[0] = Sq * 3 * Hq * D;
        }
    } else {
        for (int i = 0; i < 3; i++) {
            const int64_t gap = layout == 2 ? 3 : 0; /* elements between rows */
            const size_t esi = sdpa_dtype_size(dt3[i]);
            mem[i] = malloc((size_t)(B * S3[i] * (H3[i] * D + gap)) * esi + esi);
            t[i] = layout == 1 ? sdpa_tensor_bhsd(mem[i], dt3[i], B, S3[i], H3[i], D)
                               : sdpa_tensor_bshd(mem[i], dt3[i], B, S3[i], H3[i], D);
            if (layout == 2)
                t[i].stride[1] = H3[i] * D + gap, t[i].stride[0] = S3[i] * (H3[i] * D + gap);
        }
    }
    const double mag = values == 1 ? 8.0 : 1.0;
    int nonfinite_qk = 0, nonfinite_v = 0;
    for (int i = 0; i < 3; i++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t s = 0; s < S3[i]; s++)
                for (int64_t hh = 0; hh < H3[i]; hh++)
                    for (int64_t d = 0; d < D; d++) {
                        double x = rnd() * (i == 0 ? mag : 1.0); /* as the grid: q x 8 */
                        if (i == 2 && values == 6) /* huge v, within v's and out's range */
                            x *= kvdt == SDPA_F16 || odt == SDPA_F16 ? 6e4 : 1e30;
                        if (i == 0 && values == 7 && d % 2) /* denormal q */
                            x *= dt == SDPA_F16 ? 1e-6 : 1e-40;
                        store(t[i].data, dt3[i], at(&t[i], b, s, hh, d), x);
                    }
    if (values >= 2 && values <= 5) { /* one non-finite element */
        const int which = values == 2 ? 0 : values == 3 ? 1 : 2;
        const int64_t s = (int64_t)((rnd() + 1) / 2 * (double)S3[which]) % S3[which];
        const double x = values == 5 ? INFINITY : NAN;
        store(t[which].data, dt3[which], at(&t[which], 0, s, 0, 0), x);
        if (which < 2)
            nonfinite_qk = 1;
        else
            nonfinite_v = 1;
    }
    sdpa_params p = SDPA_PARAMS_DEFAULT;
    p.causal = causal;
    p.scale = scale_kind == 0 ? 0.0 : scale_kind == 1 ? -0.25 : scale_kind == 2 ? 1.0 : 3.0;
    if (values == 1)
        p.scale = 1.0;

    /* Masks */
    sdpa_mask m = SDPA_MASK_DEFAULT;
    int32_t len_q[2], len_kv[2];
    uint8_t *key = NULL;
    void *gen = NULL;
    if (lens & 1) {
        for (int64_t b = 0; b < B; b++)
            len_q[b] = (int32_t)((rnd() + 1) / 2 * (double)(Sq + 1)) % (int32_t)(Sq + 1);
        m.seq_len_q = len_q;
    }
    if (lens & 2) {
        for (int64_t b = 0; b < B; b++)
            len_kv[b] = (int32_t)((rnd() + 1) / 2 * (double)(Skv + 1)) % (int32_t)(Skv + 1);
        m.seq_len_kv = len_kv;
    }
    if (keyk) {
        const int64_t rows = keyk == 1 ? 1 : B;
        key = malloc((size_t)(rows * Skv));
        for (int64_t i = 0; i < rows * Skv; i++)
            key[i] = rnd() > -0.4;
        m.key = key;
        m.key_stride[0] = keyk == 1 ? 0 : Skv, m.key_stride[1] = 1;
    }
    if (general) {
        const int bb = general & 1, bh = (general >> 1) & 1; /* broadcast over B, H */
        const int64_t nb = bb ? 1 : B, nh = bh ? 1 : Hq, n = nb * nh * Sq * Skv;
        const int additive = general >= 3;
        gen = malloc((size_t)n * (additive ? 4 : 1));
        for (int64_t i = 0; i < n; i++) {
            const double r = rnd();
            if (additive)
                ((float *)gen)[i] = r < -0.6 ? -INFINITY : (float)(2 * r);
            else
                ((uint8_t *)gen)[i] = r > -0.5;
        }
        m.general = gen;
        m.general_type = additive ? SDPA_MASK_ADDITIVE : SDPA_MASK_BOOL;
        m.general_dtype = SDPA_F32;
        m.general_stride[3] = 1, m.general_stride[2] = Skv;
        m.general_stride[1] = bh ? 0 : Sq * Skv, m.general_stride[0] = bb ? 0 : nh * Sq * Skv;
    }
    /* A window and a block map (sdpa.h), drawn from the generator (the
     * byte layout of the corpus stays), and now and then a malformed map,
     * which ref and every backend must refuse naming mask->blocks, writing
     * nothing. Sq, Skv <= 40: one 64-block each way, the map's rows (b, h)
     * none, FULL or PARTIAL with random bits or none. */
    sdpa_window win = {-1, -1};
    sdpa_block_map map;
    int32_t *mcount = NULL, *mindex = NULL;
    uint64_t *mbits = NULL;
    int bad_map = 0;
    if (rnd() > 0.3) {
        win.left = (int64_t)((rnd() + 1) * 12) - 1, win.right = (int64_t)((rnd() + 1) * 12) - 1;
        m.window = &win;
    }
    if (rnd() > 0.2) {
        const int64_t mb_ = rnd() > 0 ? 1 : B, mh = rnd() > 0 ? 1 : Hq, rows = mb_ * mh;
        mcount = calloc((size_t)(2 * rows), sizeof *mcount);
        mindex = malloc(sizeof *mindex * (size_t)(4 * rows));
        for (int64_t i = 0; i < 4 * rows; i++)
            mindex[i] = -7; /* past a row's count: never read */
        if (rnd() > 0)
            mbits = calloc((size_t)(rows * 2 * 64), sizeof *mbits);
        for (int64_t r = 0; r < rows; r++) {
            const int kind = (int)((rnd() + 1) * 1.5) % 3; /* none, full, partial */
            if (kind == 1)
                mcount[r] = 1, mindex[r * 2] = 0;
            if (kind == 2) {
                mcount[rows + r] = 1, mindex[2 * rows + r * 2] = 0;
                for (int w = 0; mbits && w < 64; w++)
                    for (int bit = 0; bit < 64; bit++)
                        if (rnd() > -0.4)
                            mbits[(r * 2) * 64 + w] |= (uint64_t)1 << bit;
            }
        }
        map = (sdpa_block_map){64, 64, mb_, mh, 1, 1, 2, mcount, mindex, mcount + rows,
                               mindex + 2 * rows, mbits};
        if (rnd() > 0.8) {
            bad_map = 1 + (int)((rnd() + 1) * 2.5) % 5;
            switch (bad_map) {
            case 1: mcount[0] = 1, mindex[0] = 1; break;         /* a key block past the end */
            case 2: mcount[0] = 3; break;                         /* more than index_stride */
            case 3: mcount[0] = mcount[rows] = 1, mindex[0] = mindex[2 * rows] = 0; break;
            case 4: map.block_q = 96; break;                      /* not 64 or 128 */
            default: map.q_blocks = 2; break;                     /* not ceil(Sq / 64) */
            }
        }
        m.blocks = &map;
    }
    if (m.seq_len_q || m.seq_len_kv || m.key || m.general || m.window || m.blocks)
        p.mask = &m;
    if (getenv("FUZZ_DEBUG"))
        fprintf(stderr, "B %lld Sq %lld Skv %lld Hq %lld Hkv %lld D %lld dt %d kv %d causal %d lens %d key %d gen %d values %d scale %g window %s %lld %lld map %s bad %d\n",
                (long long)B, (long long)Sq, (long long)Skv, (long long)Hq, (long long)Hkv, (long long)D, (int)dt, (int)kvdt, (int)causal, lens, keyk, general, values, p.scale,
                m.window ? "yes" : "no", (long long)win.left, (long long)win.right, m.blocks ? "yes" : "no", bad_map);
    if (bad_map) {
        const size_t bytes = (size_t)(B * Sq * Hq * D) * sdpa_dtype_size(odt) + TL_GUARD;
        unsigned char *o = malloc(bytes);
        for (int n = -1; n < n_names; n++) {
            memset(o, 0xA5, bytes);
            sdpa_tensor to = sdpa_tensor_bshd(o, odt, B, Sq, Hq, D);
            p.backend = n < 0 ? "ref" : names[n];
            if (sdpa_forward(ctx, &t[0], &t[1], &t[2], &to, NULL, &p) != SDPA_INVALID_ARGUMENT ||
                !strstr(sdpa_last_error(), "mask->blocks"))
                fail_here("a malformed block map was not refused naming it", p.backend,
                          sdpa_last_error());
            for (size_t i = 0; i < bytes; i++)
                if (o[i] != 0xA5)
                    fail_here("a refused block map wrote the output", p.backend, "");
        }
        free(o), free(key), free(gen), free(mcount), free(mindex), free(mbits);
        for (int i = 0; i < 3; i++)
            free(mem[i]);
        return 0;
    }

    /* ref's answer */
    const size_t oes = sdpa_dtype_size(odt), on = (size_t)(B * Sq * Hq * D);
    const size_t lse_n = (size_t)(B * Hq * Sq);
    float *want = malloc(on * sizeof(float)), *ref_lse = malloc(lse_n * sizeof(float));
    sdpa_tensor tw = sdpa_tensor_bshd(want, SDPA_F32, B, Sq, Hq, D);
    p.backend = "ref";
    sdpa_status st = sdpa_forward(ctx, &t[0], &t[1], &t[2], &tw, ref_lse, &p);
    if (st != SDPA_OK)
        fail_here("the reference failed", "ref", sdpa_last_error());
    /* A backend whose products take bf16 operands rounds f16 inputs to bf16
     * first (its documented precision: 3 bits of every score, which peaked
     * scores near 100 turn into whole units): it is held to ref on the
     * inputs as it rounds them, as the test grid holds it. */
    float *want_r = NULL, *ref_lse_r = NULL;
    sdpa_tensor tw_r = tw;
    if (dt == SDPA_F16 || kvdt != dt) { /* mixed: f32 operands are rounded to bf16 too */
        void *rmem[3] = {NULL, NULL, NULL};
        sdpa_tensor tr[3];
        for (int i = 0; i < 3; i++) {
            tr[i] = t[i];
            if (packed && i > 0) { /* one buffer: the same offsets from its copy */
                tr[i].data = (char *)rmem[0] + ((char *)t[i].data - (char *)mem[0]);
                continue;
            }
            const int64_t S = S3[i], H = H3[i];
            size_t span = 1;
            for (int k = 0; k < 4; k++)
                span += (size_t)((k == 0 ? B : k == 1 ? (packed ? Sq : S) : k == 2 ? H : D) - 1) *
                        (size_t)t[i].stride[k];
            if (packed)
                span += (size_t)(2 * Hq * D);
            const size_t esi = sdpa_dtype_size(dt3[i]);
            rmem[i] = malloc(span * esi);
            memcpy(rmem[i], packed ? mem[0] : mem[i], span * esi);
            tr[i].data = (char *)rmem[i] + ((char *)t[i].data - (char *)(packed ? mem[0] : mem[i]));
        }
        for (int i = 0; i < 3; i++)
            for (int64_t b = 0; b < B; b++)
                for (int64_t s2 = 0; s2 < S3[i]; s2++)
                    for (int64_t hh = 0; hh < H3[i]; hh++)
                        for (int64_t d = 0; d < D; d++) {
                            float x = tl_out_get(&tr[i], b, s2, hh, d);
                            uint16_t bf;
                            sdpa_convert(&x, SDPA_F32, &bf, SDPA_BF16, 1);
                            sdpa_convert(&bf, SDPA_BF16, &x, SDPA_F32, 1);
                            store(tr[i].data, dt3[i], at(&tr[i], b, s2, hh, d), x);
                        }
        want_r = malloc(on * sizeof(float)), ref_lse_r = malloc(lse_n * sizeof(float));
        tw_r = sdpa_tensor_bshd(want_r, SDPA_F32, B, Sq, Hq, D);
        if (sdpa_forward(ctx, &tr[0], &tr[1], &tr[2], &tw_r, ref_lse_r, &p) != SDPA_OK)
            fail_here("the reference failed on bf16-rounded inputs", "ref", sdpa_last_error());
        for (int i = 0; i < 3; i++)
            free(rmem[i]);
    }
    double vmax = 1.0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < Skv; s++)
            for (int64_t hh = 0; hh < Hkv; hh++)
                for (int64_t d = 0; d < D; d++) {
                    const double x = fabs(tl_out_get(&t[2], b, s, hh, d));
                    if (isfinite(x) && x > vmax)
                        vmax = x;
                }

    sdpa_call_desc desc = {.size = sizeof(sdpa_call_desc),

                           .device = SDPA_DEVICE_CPU, .dtype = dt, .B = B, .Sq = Sq, .Skv = Skv,
                           .Hq = Hq, .Hkv = Hkv, .D = D, .causal = causal, .want_lse = want_lse,
                           .kv_dtype = kvdt != dt ? SDPA_KV_DTYPE(kvdt) : 0};
    desc.mask = (m.seq_len_q || m.seq_len_kv ? SDPA_MASK_KIND_SEQ_LEN : 0) |
                (m.key ? SDPA_MASK_KIND_KEY : 0) | (m.general ? SDPA_MASK_KIND_GENERAL : 0) |
                (m.window ? SDPA_MASK_KIND_WINDOW : 0) | (m.blocks ? SDPA_MASK_KIND_BLOCKS : 0);
    const int64_t gap = layout == 2 ? 5 : 0; /* output rows with gaps too */
    const size_t out_bytes = (size_t)(B * Sq * (Hq * D + gap)) * oes;
    unsigned char *out = malloc(out_bytes + TL_GUARD), *lse = malloc(lse_n * 4 + TL_GUARD);
    static sdpa_decision dec;
    for (int n = 0; n < n_names; n++) {
        desc.backend = names[n];
        const int accepts = sdpa_decide(ctx, &desc, &dec) == SDPA_OK && dec.status == SDPA_OK;
        memset(out, 0xA5, out_bytes + TL_GUARD);
        memset(lse, 0x5A, lse_n * 4 + TL_GUARD);
        sdpa_tensor to = sdpa_tensor_bshd(out, odt, B, Sq, Hq, D);
        to.stride[1] = Hq * D + gap, to.stride[0] = Sq * (Hq * D + gap);
        p.backend = names[n];
        st = sdpa_forward(ctx, &t[0], &t[1], &t[2], &to, want_lse ? (float *)lse : NULL, &p);
        if (!accepts) {
            if (st != SDPA_UNSUPPORTED)
                fail_here("explain refuses the call but the run did not say UNSUPPORTED",
                          names[n], sdpa_last_error());
            for (size_t i = 0; i < out_bytes + TL_GUARD; i++)
                if (out[i] != 0xA5)
                    fail_here("a refused call wrote its output", names[n], dec.error);
            continue;
        }
        if (st != SDPA_OK)
            fail_here("explain accepts the call but the run failed", names[n], sdpa_last_error());
        for (size_t i = out_bytes; i < out_bytes + TL_GUARD; i++)
            if (out[i] != 0xA5)
                fail_here("the guard bytes after the output were written", names[n], "");
        for (size_t i = lse_n * 4; i < lse_n * 4 + TL_GUARD; i++)
            if (lse[i] != 0x5A)
                fail_here("the guard bytes after the LSE were written", names[n], "");
        { /* the same call in two shares */
            sdpa_call_desc ds = desc;
            ds.shares = 2;
            const int share_accepts = sdpa_decide(ctx, &ds, &dec) == SDPA_OK && dec.status == SDPA_OK;
            if (share_accepts != takes_shares[n])
                fail_here("sdpa_decide on a share disagrees with the backend's shares flag",
                          names[n], dec.error);
            unsigned char *o2 = malloc(out_bytes + TL_GUARD), *l2 = malloc(lse_n * 4 + TL_GUARD);
            memset(o2, 0xA5, out_bytes + TL_GUARD);
            memset(l2, 0x5A, lse_n * 4 + TL_GUARD);
            sdpa_tensor t2 = to;
            t2.data = o2;
            for (int sh = 0; sh < 2; sh++) {
                const sdpa_status s2 = sdpa_forward_share(ctx, sh, 2, &t[0], &t[1], &t[2], &t2,
                                                          want_lse ? (float *)l2 : NULL, &p);
                if (s2 != (share_accepts ? SDPA_OK : SDPA_UNSUPPORTED))
                    fail_here(share_accepts ? "a share failed" : "a refused share did not say "
                                                                 "UNSUPPORTED",
                              names[n], sdpa_last_error());
            }
            if (share_accepts ? memcmp(o2, out, out_bytes + TL_GUARD) != 0 ||
                                    memcmp(l2, lse, lse_n * 4 + TL_GUARD) != 0
                              : o2[0] != 0xA5 || memcmp(o2, o2 + 1, out_bytes + TL_GUARD - 1) != 0)
                fail_here(share_accepts ? "two shares differ from the 2-thread call"
                                        : "a refused share wrote its output",
                          names[n], "");
            free(o2), free(l2);
        }
        const double tol = (fmax(tl_tolerance(dt, odt), tl_tolerance(kvdt, odt)) +
                            tl_product_tolerance(bits[n])) *
                           vmax;
        /* held to ref on bf16-rounded f16, or, where the backend did not
         * round (few-query calls on fp32 products: flash_decode.h), on the
         * inputs as they are: whichever it is closer to */
        const int rounded = bits[n] == 8 && want_r &&
                            out_distance(&to, &tw_r, B, Sq, Hq, D) <=
                                out_distance(&to, &tw, B, Sq, Hq, D);
        const sdpa_tensor *ref_out = rounded ? &tw_r : &tw;
        const float *ref_l = rounded ? ref_lse_r : ref_lse;
        for (int64_t b = 0; b < B; b++)
            for (int64_t s = 0; s < Sq; s++) {
                if (gap)
                    for (int64_t g = 0; g < gap; g++)
                        if (((unsigned char *)out)[(size_t)(at(&to, b, s, 0, 0) + Hq * D + g) *
                                                   oes] != 0xA5)
                            fail_here("a gap between output rows was written", names[n], "");
                for (int64_t hh = 0; hh < Hq; hh++) {
                    int ref_nan = 1, got_nan = 1;
                    for (int64_t d = 0; d < D; d++) {
                        ref_nan &= isnan(tl_out_get(ref_out, b, s, hh, d));
                        got_nan &= isnan(tl_out_get(&to, b, s, hh, d));
                    }
                    if (nonfinite_qk && ref_nan != got_nan) {
                        char why[96];
                        snprintf(why, sizeof why, "row b=%lld s=%lld h=%lld: ref %s, backend %s",
                                 (long long)b, (long long)s, (long long)hh,
                                 ref_nan ? "NaN" : "not NaN", got_nan ? "NaN" : "not NaN");
                        fail_here("the NaN rows differ from ref's (q or k non-finite)", names[n],
                                  why);
                    }
                    for (int64_t d = 0; d < D; d++) {
                        const double w = tl_out_get(ref_out, b, s, hh, d);
                        const double g = tl_out_get(&to, b, s, hh, d);
                        if (!isfinite(w) || (nonfinite_v && !isfinite(g)))
                            continue; /* the rules above, not numbers */
                        if (!(fabs(g - w) <= tol * fmax(1.0, fabs(w) / vmax))) {
                            char why[160];
                            snprintf(why, sizeof why,
                                     "out[b=%lld s=%lld h=%lld d=%lld] = %g, ref %g, bound %g",
                                     (long long)b, (long long)s, (long long)hh, (long long)d, g,
                                     w, tol);
                            fail_here("the output is off", names[n], why);
                        }
                    }
                    if (want_lse && !nonfinite_qk && !nonfinite_v) {
                        const float wl = ref_l[(b * Hq + hh) * Sq + s];
                        const float gl = ((float *)lse)[(b * Hq + hh) * Sq + s];
                        const double lt = bits[n] ? 3e-2 : 1e-3;
                        if (isfinite(wl) != isfinite(gl) ||
                            (isfinite(wl) && !(fabs(gl - wl) <= lt * fmax(1.0, fabs(wl)))))
                            fail_here("the LSE is off", names[n], "");
                    }
                }
            }
    }
    /* The backward pass of the same call, where the values are finite
     * numbers (the non-finite rules are the forward's): every backend with
     * a backward pass against ref's gradients, refusals against
     * sdpa_decide, guard bytes after each gradient. */
    if (!nonfinite_qk && !nonfinite_v && values != 6 && values != 7)
        fuzz_backward(t, &tw, ref_lse, &p, &desc, odt, values == 1);
    free(out), free(lse), free(want), free(ref_lse), free(want_r), free(ref_lse_r), free(key),
        free(gen), free(mcount), free(mindex), free(mbits);
    for (int i = 0; i < 3; i++)
        free(mem[i]);
    return 0;
}
