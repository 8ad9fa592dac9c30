/*
 * test_grid.c - every present backend against the float64 reference.
 *
 * Fresh random inputs each run (seed printed), odd sizes (S = 1, 17, 129,
 * 2053), every head dim in {32, 64, 72, 80, 96, 128, 256} the backend
 * claims, grouped-query and multi-query, cross-attention (77 and 512-ish
 * text tokens), causal in both alignments (including rows that see no key),
 * BSHD, BHSD and a strided view with gaps, f32/f16/bf16 inputs and
 * outputs, LSE; guard bytes after every output and untouched gaps between
 * strided rows. A backend refusing a case it does not claim is a skip with
 * its reason, never a pass.
 *
 * usage: test_grid [backend ...]   (default: every present backend but ref)
 */
#ifdef SDPA_TEST_AMX_EMULATED
#include "amx_emulated.h"
#endif
#include "support/testlib.h"
#include "dispatch/context.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static sdpa_context *ctx1, *ctx2; /* 1 and 2 threads */

static void describe(const tl_case *c, char *buf, size_t n)
{
    snprintf(buf, n,
             "B=%lld Sq=%lld Skv=%lld Hq=%lld Hkv=%lld D=%lld in=%s%s%s out=%s causal=%s %s%s %s "
             "scale=%g",
             (long long)c->B, (long long)c->Sq, (long long)c->Skv, (long long)c->Hq,
             (long long)c->Hkv, (long long)c->D, sdpa_dtype_name(c->dtype),
             tl_kv_dtype(c) != c->dtype ? " kv=" : "",
             tl_kv_dtype(c) != c->dtype ? sdpa_dtype_name(tl_kv_dtype(c)) : "",
             sdpa_dtype_name(c->out_dtype), sdpa_causal_name(c->causal), tl_layout_name(c->layout),
             c->want_lse ? " lse" : "", tl_values_name(c->values), tl_case_scale(c));
}

static int run(sdpa_context *ctx, const char *backend, const tl_problem *p, tl_output *o)
{
    sdpa_params prm = SDPA_PARAMS_DEFAULT;
    prm.backend = backend;
    prm.causal = p->c.causal;
    prm.scale = tl_case_scale(&p->c);
    return sdpa_forward(ctx, &p->q, &p->k, &p->v, &o->t, o->lse, &prm);
}

static sdpa_backend_info info(const char *backend)
{
    sdpa_backend_info b = {0};
    for (int i = 0; i < sdpa_backend_count(ctx2); i++)
        if (sdpa_backend_get(ctx2, i, &b) == SDPA_OK && strcmp(b.name, backend) == 0)
            return b;
    memset(&b, 0, sizeof b);
    return b;
}

/* Does the backend claim the case (capabilities and check())? If not,
 * why, in why[]. A claimed case must run: refusing it is a failure. */
static int claims(const char *backend, const tl_case *c, char *why, size_t n)
{
    sdpa_call_desc d = {.size = sizeof(sdpa_call_desc), .device = SDPA_DEVICE_CPU,
                        .dtype = c->dtype, .B = c->B, .Sq = c->Sq, .Skv = c->Skv, .Hq = c->Hq,
                        .Hkv = c->Hkv, .D = c->D, .causal = c->causal, .want_lse = c->want_lse,
                        .backend = backend,
                        .kv_dtype = tl_kv_dtype(c) != c->dtype ? c->kv_dtype : 0};
    return tl_claims(ctx2, &d, why, n);
}

/* Largest |error| a case may show, relative to max |ref|: the rounding of
 * the stored output and f32 accumulation, more for bf16 products, and for
 * peaked softmaxes the float32 rounding of large scores (|s| ~ 100: a
 * relative 2^-24 of each of D products moves a weight by ~|s| 2^-22). */
static double relative_tolerance(const tl_case *c, int product_bits)
{
    double tol = tl_tolerance(c->dtype, c->out_dtype) + tl_product_tolerance(product_bits);
    if (c->values == TL_PEAKED) /* scores grow with a scale above 1, and so does this */
        tol += 8.0 * (double)c->D * ldexp(1.0, -22) * fmax(1.0, fabs(c->scale));
    return tol;
}

/* A backend that does not take a case's input dtype (cpu.amx: no f32)
 * gets the same case in the dtypes it does take, alternately, so that it
 * goes through the whole grid rather than a fraction of it. */
static tl_case in_dtype_taken(const sdpa_backend_info *bi, const tl_case *c)
{
    static unsigned alternate;
    tl_case cc = *c;
    if (bi->dtypes && !(bi->dtypes & (1u << cc.dtype))) {
        sdpa_dtype pick[SDPA_DTYPE_COUNT];
        int n = 0;
        for (int t = 0; t < SDPA_DTYPE_COUNT; t++)
            if (bi->dtypes & (1u << t))
                pick[n++] = (sdpa_dtype)t;
        cc.dtype = pick[alternate++ % (unsigned)n];
    }
    return cc;
}

/* One case: backend vs ref, then determinism across thread counts. */
static void check_case(const char *backend, const tl_case *case_in)
{
    const sdpa_backend_info bi = info(backend);
    tl_case cc = in_dtype_taken(&bi, case_in);
    const tl_case *c = &cc;
    char what[256], why[128];
    describe(c, what, sizeof what);
    tl_problem p;
    tl_output got, want;
    tl_case rc = *c;
    rc.out_dtype = SDPA_F32;
    rc.want_lse = 1;
    if (!tl_problem_make(&p, c) || !tl_output_make(&got, &p)) {
        CHECK(0, "%s: out of memory", what);
        return;
    }
    /* The reference reads the same inputs, or, for a kernel whose products
     * take bf16 operands, the f16 inputs as that kernel rounds them (its
     * documented precision: f16 -> bf16 costs 3 bits of every score). Such
     * a kernel may also not round (cpu.amx's few-query calls, and
     * cpu.avx512bf16's unless q, k and v are all bf16, run on fp32
     * products, flash_decode.h): it is then held, with the
     * same bounds, to the reference on the inputs as they are, whichever of
     * the two it is closer to. */
    tl_problem pr = p, rounded;
    const int round_inputs =
        bi.product_bits == 8 && (c->dtype == SDPA_F16 || tl_kv_dtype(c) == SDPA_F16);
    if (round_inputs) {
        if (!tl_problem_rounded(&rounded, &p, SDPA_BF16)) {
            CHECK(0, "%s: out of memory", what);
            return;
        }
        pr = rounded;
    }
    pr.c = rc;
    if (!tl_output_make(&want, &pr)) {
        CHECK(0, "%s: out of memory", what);
        return;
    }
    char refusal[512];
    const int claimed = claims(backend, c, refusal, sizeof refusal);
    sdpa_status st = claimed ? run(ctx2, backend, &p, &got) : SDPA_UNSUPPORTED;
    /* SDPA_TEST_QUICK (the ThreadSanitizer run): the float64 reference,
     * most of the time there, is left to the other builds, which compare
     * every case; this one runs each kernel's tasks on two threads and
     * checks they match one thread's, bitwise where deterministic. */
    const int quick = getenv("SDPA_TEST_QUICK") != NULL;
    if (claimed && quick) {
        CHECK(st == SDPA_OK, "%s %s: %s: %s", backend, what, sdpa_status_string(st),
              sdpa_last_error());
        tl_output again;
        if (st == SDPA_OK && tl_output_make(&again, &p)) {
            if (run(ctx1, backend, &p, &again) == SDPA_OK)
                CHECK(memcmp(again.mem, got.mem, got.bytes) == 0, "%s %s: 1 thread != 2 threads",
                      backend, what);
            tl_output_free(&again);
        }
        CHECK(tl_output_check(&got, why, sizeof why), "%s %s: %s", backend, what, why);
    } else if (!claimed) {
        char buf[400];
        snprintf(buf, sizeof buf, "%s %s", backend, what);
        tl_skip(buf, refusal);
    } else {
        CHECK(st == SDPA_OK, "%s %s: %s: %s", backend, what, sdpa_status_string(st),
              sdpa_last_error());
        sdpa_status sr = run(ctx2, "ref", &pr, &want);
        CHECK(sr == SDPA_OK, "ref %s: %s", what, sdpa_last_error());
        if (st == SDPA_OK && sr == SDPA_OK && round_inputs) {
            tl_problem pe = p;
            pe.c = rc;
            tl_output exact;
            if (tl_output_make(&exact, &pe)) {
                int64_t at = -1;
                if (run(ctx2, "ref", &pe, &exact) == SDPA_OK &&
                    tl_max_diff(&got, &exact, &at) < tl_max_diff(&got, &want, &at)) {
                    tl_output t = want;
                    want = exact, exact = t;
                }
                tl_output_free(&exact);
            }
        }
        if (st == SDPA_OK && sr == SDPA_OK) {
            int64_t at = -1;
            double diff = tl_max_diff(&got, &want, &at);
            const int bits = bi.product_bits;
            /* Absolute (inputs are in [-1, 1), so |out| <= 1) and relative
             * to the reference's magnitude (outputs far below 1, as in
             * flat softmaxes over many keys, must not hide in the
             * absolute bound: zeros would pass it). */
            const double tol = relative_tolerance(c, bits), scale = tl_max_abs(&want);
            CHECK(diff <= tol, "%s %s: max |out - ref| = %.3g > %.3g at element %lld", backend,
                  what, diff, tol, (long long)at);
            CHECK(diff <= 4 * tol * scale || scale == 0,
                  "%s %s: max |out - ref| / max |ref| = %.3g > %.3g", backend, what,
                  diff / scale, 4 * tol);
            if (getenv("SDPA_TEST_VERBOSE"))
                printf("  %s %s: abs %.3g (tol %.3g) rel %.3g\n", backend, what, diff, tol,
                       scale ? diff / scale : 0.0);
            if (c->want_lse) {
                double ld = tl_max_lse_diff(&got, &want, c->B, c->Hq, c->Sq);
                const double peaked =
                    c->values == TL_PEAKED ? 512.0 * ldexp(1.0, -22) * fmax(1.0, fabs(c->scale)) : 0;
                CHECK(ld <= 2e-5 * (1 + sqrt((double)c->Skv)) + tl_product_tolerance(bits) +
                               peaked,
                      "%s %s: max |lse - ref| = %.3g", backend, what, ld);
            }
            CHECK(tl_output_check(&got, why, sizeof why), "%s %s: %s", backend, what, why);
            /* Deterministic backends: bitwise equal with 1 thread and 2. */
            tl_output again;
            if (tl_output_make(&again, &p) && run(ctx1, backend, &p, &again) == SDPA_OK)
                CHECK(memcmp(again.mem, got.mem, got.bytes) == 0, "%s %s: 1 thread != 2 threads",
                      backend, what);
            tl_output_free(&again);
        }
    }
    tl_output_free(&got);
    tl_output_free(&want);
    tl_problem_free(&p);
    if (round_inputs)
        tl_problem_free(&rounded);
}

/* The softmax is an argmax here, and which of two near-equal scores is
 * the largest depends on float32 rounding, so the output is checked for
 * what must hold whatever the order: finite, within the range of v (a
 * convex combination), and LSE equal to the largest score to within
 * float32 rounding. */
static void huge_scale_case(const char *backend, const tl_case *case_in)
{
    const sdpa_backend_info bi = info(backend);
    const tl_case cc = in_dtype_taken(&bi, case_in);
    const tl_case *c = &cc;
    char what[256], why[512];
    describe(c, what, sizeof what);
    if (!claims(backend, c, why, sizeof why)) {
        char buf[400];
        snprintf(buf, sizeof buf, "%s %s", backend, what);
        tl_skip(buf, why);
        return;
    }
    tl_problem p;
    tl_output got, want;
    if (!tl_problem_make(&p, c) || !tl_output_make(&got, &p) || !tl_output_make(&want, &p)) {
        CHECK(0, "%s: out of memory", what);
        return;
    }
    /* the reference on the inputs as the backend rounds them (f16 to bf16
     * for bf16 products): the LSE is the largest score times 1e30 */
    tl_problem rounded;
    const int round_inputs =
        bi.product_bits == 8 && (c->dtype == SDPA_F16 || tl_kv_dtype(c) == SDPA_F16);
    if (round_inputs && !tl_problem_rounded(&rounded, &p, SDPA_BF16)) {
        CHECK(0, "%s: out of memory", what);
        return;
    }
    CHECK_STATUS(run(ctx2, backend, &p, &got), SDPA_OK);
    CHECK_STATUS(run(ctx2, "ref", round_inputs ? &rounded : &p, &want), SDPA_OK);
    if (round_inputs)
        tl_problem_free(&rounded);
    int bad_out = 0, bad_lse = 0;
    for (int64_t s = 0; s < c->Sq; s++)
        for (int64_t h = 0; h < c->Hq; h++)
            for (int64_t d = 0; d < c->D; d++) {
                float x = tl_out_get(&got.t, 0, s, h, d);
                bad_out += !(fabsf(x) <= 1.0f + 1e-5f);
            }
    for (int64_t i = 0; i < c->Hq * c->Sq; i++)
        bad_lse += !(fabs(got.lse[i] - want.lse[i]) <= 1e-4 * fabs(want.lse[i]));
    CHECK(bad_out == 0 && bad_lse == 0, "%s %s: %d outputs outside [-1, 1], %d LSE off",
          backend, what, bad_out, bad_lse);
    tl_output_free(&got), tl_output_free(&want), tl_problem_free(&p);
}

static tl_case mk(int64_t B, int64_t Sq, int64_t Skv, int64_t Hq, int64_t Hkv, int64_t D)
{
    tl_case c = {B, Sq, Skv, Hq, Hkv, D, SDPA_F32, SDPA_F32, SDPA_CAUSAL_NONE, TL_BSHD, 1, TL_UNIFORM, 0, 0};
    return c;
}

/* Each kind of non-finite input (NaN in q, k or v, Inf, ...) on one shape. */
static void nonfinite_cases(const char *backend, tl_case c)
{
    for (int v = TL_NAN_Q; v < TL_VALUES_COUNT; v++) {
        c.values = (tl_values)v;
        check_case(backend, &c);
    }
}

/*
 * fp32 sums over many keys: a kernel with fp32 products whose output is one
 * running sum of every key rounds in proportion to that sum, not to the
 * output it leaves once v's signs cancel. 64 queries against 4,096 keys
 * (D 128, uniform inputs): as one running sum, 1.1e-6 relative L2 from
 * float64 (cpu.avx2 and cpu.portable before SUM_STEPS, flash_tiled.h); in
 * sums of 128 keys 2.5-2.8e-7, cpu.blas 3.5e-7. The bound sits between.
 * (Outside the quick run: it needs the reference.)
 */
static void long_sum_case(const char *backend)
{
    const sdpa_backend_info bi = info(backend);
    if (bi.product_bits != 0 || (bi.dtypes && !(bi.dtypes & (1u << SDPA_F32))) ||
        getenv("SDPA_TEST_QUICK"))
        return;
    const tl_case c = mk(1, 64, 4096, 1, 1, 128);
    tl_problem p;
    tl_output got, want;
    if (!tl_problem_make(&p, &c) || !tl_output_make(&got, &p) || !tl_output_make(&want, &p)) {
        CHECK(0, "long sums: out of memory");
        return;
    }
    if (run(ctx2, backend, &p, &got) == SDPA_OK && run(ctx2, "ref", &p, &want) == SDPA_OK) {
        double num = 0, den = 0;
        for (int64_t i = 0; i < c.Sq; i++)
            for (int64_t d = 0; d < c.D; d++) {
                const double w = tl_out_get(&want.t, 0, i, 0, d);
                const double e = tl_out_get(&got.t, 0, i, 0, d) - w;
                num += e * e, den += w * w;
            }
        const double rel = sqrt(num / den);
        CHECK(rel <= 6e-7, "%s, 64 queries x 4096 keys, f32: relative L2 error %.3g > 6e-7 "
              "(one running sum of every key?)", backend, rel);
    } else {
        CHECK(0, "%s long sums: %s", backend, sdpa_last_error());
    }
    tl_output_free(&got), tl_output_free(&want), tl_problem_free(&p);
}

static void grid(const char *backend)
{
    printf("== %s\n", backend);
    long_sum_case(backend);
    static const int64_t dims[] = {32, 64, 72, 80, 96, 128, 256};
    tl_case c;
    for (size_t i = 0; i < sizeof dims / sizeof *dims; i++) { /* every head dim */
        c = mk(1, 129, 129, 2, 2, dims[i]);
        check_case(backend, &c);
        c.causal = SDPA_CAUSAL_TOP_LEFT, c.layout = TL_BHSD, c.dtype = SDPA_BF16;
        check_case(backend, &c);
        /* past the tiled kernels' short-key path (flash_run.h SHORT_KEYS):
         * key blocks with a running softmax; NaN after every row's D
         * elements (packing reads no further) */
        c = mk(1, 50, 600, 2, 1, dims[i]);
        c.layout = TL_STRIDED_NAN, c.dtype = (sdpa_dtype)(i % SDPA_DTYPE_COUNT);
        check_case(backend, &c);
    }
    /* odd head dims against an odd count of keys on the short-key path: K
     * and V rooms of kb x D floats once left what follows them in the
     * tiles (a thread's descriptor, a key mask's int64 list) 4 bytes off */
    static const int64_t odd_dims[] = {33, 47};
    for (size_t i = 0; i < 2; i++) {
        c = mk(1, 50, 77, 2, 2, odd_dims[i]);
        c.dtype = (sdpa_dtype)(i + 1);
        check_case(backend, &c);
    }
    static const int64_t seqs[] = {1, 17, 129};
    for (size_t i = 0; i < 3; i++) /* odd sequence lengths */
        for (int causal = 0; causal <= 2; causal++) {
            c = mk(2, seqs[i], seqs[i], 3, 3, 64);
            c.causal = (sdpa_causal)causal;
            check_case(backend, &c);
        }
    c = mk(1, 2053, 2053, 1, 1, 64); /* a few thousand, not a tile multiple */
    check_case(backend, &c);
    c.causal = SDPA_CAUSAL_BOTTOM_RIGHT, c.Sq = 1000, c.layout = TL_STRIDED;
    check_case(backend, &c);
    /* cross-attention: text tokens, both alignments, rows that see nothing */
    const int64_t cross[][2] = {{300, 77}, {17, 129}, {129, 17}, {65, 513}};
    for (size_t i = 0; i < 4; i++)
        for (int causal = 0; causal <= 2; causal++) {
            c = mk(2, cross[i][0], cross[i][1], 2, 2, 64);
            c.causal = (sdpa_causal)causal;
            c.layout = (tl_layout)(i % 3);
            check_case(backend, &c);
        }
    /* grouped-query and multi-query */
    c = mk(1, 130, 130, 8, 2, 128);
    check_case(backend, &c);
    c = mk(2, 33, 70, 4, 1, 80);
    c.causal = SDPA_CAUSAL_BOTTOM_RIGHT, c.layout = TL_STRIDED;
    check_case(backend, &c);
    /* layouts and dtypes */
    for (int layout = 0; layout < 3; layout++)
        for (int in = 0; in < SDPA_DTYPE_COUNT; in++)
            for (int out = 0; out < SDPA_DTYPE_COUNT; out++) {
                c = mk(2, 45, 67, 4, 2, 96);
                c.layout = (tl_layout)layout, c.dtype = (sdpa_dtype)in;
                c.out_dtype = (sdpa_dtype)out, c.want_lse = (layout + in + out) % 2;
                c.causal = (sdpa_causal)((in + out) % 3);
                check_case(backend, &c);
            }
    c = mk(1, 1, 1, 1, 1, 32); /* one token */
    check_case(backend, &c);
    /* Peaked softmaxes: scores around +-100, so the max subtraction, the
     * exp's range and large running-max jumps between key blocks matter. */
    for (int causal = 0; causal <= 2; causal++) {
        c = mk(2, 129, 300, 2, 1, 64);
        c.values = TL_PEAKED, c.causal = (sdpa_causal)causal;
        check_case(backend, &c);
    }
    c = mk(1, 77, 513, 2, 2, 128);
    c.values = TL_PEAKED, c.dtype = SDPA_BF16, c.out_dtype = SDPA_BF16, c.layout = TL_STRIDED;
    check_case(backend, &c);
    /* Non-finite values and overflowing scores (the rules in sdpa.h). */
    for (int v = TL_NAN_Q; v < TL_VALUES_COUNT; v++)
        for (int in = 0; in < SDPA_DTYPE_COUNT; in += 2) /* f32, bf16 */
            for (int causal = 0; causal <= 1; causal++) {
                if (v == TL_INF_V && causal) /* masked rows may see 0 * inf: unspecified */
                    continue;
                c = mk(2, 70, 133, 2, 2, 64);
                c.values = (tl_values)v, c.dtype = (sdpa_dtype)in;
                c.causal = (sdpa_causal)causal;
                check_case(backend, &c);
            }
    /* Negative scales (the max of the scaled scores is then the min of the
     * products), short and long key ranges, bf16 and f32. */
    for (int in = 0; in < SDPA_DTYPE_COUNT; in += 2)
        for (int i = 0; i < 2; i++) {
            c = mk(1, 60, i ? 600 : 90, 2, 2, 64);
            c.scale = -0.3, c.dtype = (sdpa_dtype)in, c.causal = (sdpa_causal)i;
            check_case(backend, &c);
        }
    /* A large scale on a long key range: a row's max grows by far more
     * than cpu.amx's lazy 2^8 between key blocks, so a P computed against
     * the old max would overflow unless the row is redone with its max
     * (the online softmax is exact against any max that does not). */
    /* The same for the few-query path's rows side by side (8 and 4 rows
     * per KV head), whose test for a moved max must not miss one. */
    static const int64_t large_scale[][6] = {
        {1, 64, 600, 2, 2, 64}, {1, 1, 600, 8, 1, 64}, {1, 2, 600, 4, 2, 64}};
    for (int in = 0; in < SDPA_DTYPE_COUNT; in += 2)
        for (size_t i = 0; i < sizeof large_scale / sizeof *large_scale; i++) {
            const int64_t *x = large_scale[i];
            c = mk(x[0], x[1], x[2], x[3], x[4], x[5]);
            c.values = TL_PEAKED, c.scale = 4.0, c.dtype = (sdpa_dtype)in;
            check_case(backend, &c);
        }
    /* A handful of keys (the tiled kernels' rows path, flash_rows.h): the
     * 26-token grouped-query shape, strided, peaked, and non-finite values. */
    c = mk(1, 26, 26, 16, 2, 128);
    check_case(backend, &c);
    c.layout = TL_STRIDED, c.values = TL_PEAKED;
    check_case(backend, &c);
    nonfinite_cases(backend, mk(2, 30, 29, 4, 2, 64));
    /* At most 8 query rows per KV head (the CPU kernels' few-query path,
     * flash_decode.h): one token and a few against short and long key
     * ranges, grouped-query rows of one KV head sharing a pass, KV heads
     * taken together (BSHD: 32 per task and a group of 4 left over; cut
     * further when few), keys cut into chunks and merged (two KV heads,
     * 5000 keys), head dims with a tail (100), both causal alignments,
     * every layout and dtype, peaked, and the non-finite values; one row
     * per KV head against 700 keys (cut into chunks of 64 keys or more, 16
     * KV heads a task); 8 rows
     * per KV head (the most it takes: 8 query heads on one KV head), and
     * 16 (the tiled path) as a control. */
    {
        static const int64_t few[][6] = {{1, 1, 1, 1, 1, 32},     {2, 1, 77, 24, 24, 128},
                                         {1, 4, 300, 8, 8, 100},  {1, 2, 129, 16, 8, 64},
                                         {1, 1, 5000, 8, 2, 128}, {2, 3, 2053, 4, 4, 64},
                                         {1, 1, 16, 4, 1, 96},    {1, 2, 700, 32, 16, 72},
                                         {1, 1, 900, 8, 1, 64},   {8, 1, 40, 36, 36, 32},
                                         {1, 2, 300, 16, 2, 64},  {1, 1, 700, 32, 32, 64}};
        for (size_t i = 0; i < sizeof few / sizeof *few; i++) {
            c = mk(few[i][0], few[i][1], few[i][2], few[i][3], few[i][4], few[i][5]);
            c.causal = (sdpa_causal)(i % 3), c.layout = (tl_layout)(i % 3);
            c.dtype = (sdpa_dtype)(i % SDPA_DTYPE_COUNT);
            c.out_dtype = (sdpa_dtype)((i / 3) % SDPA_DTYPE_COUNT);
            check_case(backend, &c);
        }
        c = mk(2, 4, 333, 8, 8, 64);
        c.values = TL_PEAKED, c.causal = SDPA_CAUSAL_BOTTOM_RIGHT;
        check_case(backend, &c);
        /* every dtype with 2-16 rows per KV head, each count (2-8: the
         * shared pass of every AVX-512 build, cpu.avx512bf16's pair
         * products in bf16; 2-12: cpu.avx2's small GEMM, blocks of 4
         * rows and the 1-3 left over, f16 and bf16 K and V read in place;
         * the rest the tiled path), key blocks with a
         * tail, head dims whose last vector or pair step is partial (33,
         * 100, 102, 72, 8, 47, 99, 124), read from rows with NaN after
         * them (never read: 0 x NaN); causal with two queries, so that
         * rows see different keys of a block */
        for (int nr = 2; nr <= 16; nr++)
            for (int in = 0; in < SDPA_DTYPE_COUNT; in++) { /* f32, f16, bf16 */
                static const int64_t head_dims[] = {33, 100, 102, 72, 8,  256, 47, 64,
                                                    40, 99,  128, 24, 100, 64, 124};
                const int sq = nr % 2 == 0 && nr > 2 ? 2 : 1;
                c = mk(1, sq, 100 + 37 * nr, 2 * nr / sq, 2, head_dims[nr - 2]);
                c.dtype = (sdpa_dtype)in, c.out_dtype = nr % 2 ? SDPA_F32 : SDPA_BF16;
                c.causal = sq > 1 ? SDPA_CAUSAL_BOTTOM_RIGHT : SDPA_CAUSAL_NONE;
                c.values = nr % 3 == 0 ? TL_PEAKED : TL_UNIFORM;
                c.layout = TL_STRIDED_NAN;
                check_case(backend, &c);
            }
        /* 13-16 rows of one KV head (cpu.avx2's small GEMM takes them) */
        for (int nr = 13; nr <= 16; nr++) {
            c = mk(1, nr % 2 ? 1 : 2, 150 + nr, nr % 2 ? nr : nr / 2, 1, nr % 2 ? 100 : 64);
            c.dtype = (sdpa_dtype)(nr % SDPA_DTYPE_COUNT);
            c.causal = nr % 2 ? SDPA_CAUSAL_NONE : SDPA_CAUSAL_TOP_LEFT;
            c.layout = (tl_layout)(nr % 4);
            check_case(backend, &c);
        }
        nonfinite_cases(backend, mk(1, 2, 600, 4, 2, 64));
        /* one row per KV head, bf16 and f16 K and V read in place, a head
         * dim whose last part is 2 elements for 4, 8 and 16 lanes (the
         * vocabularies' partial half loads) */
        for (int t = SDPA_F16; t <= SDPA_BF16; t++) {
            c = mk(1, 1, 300, 8, 8, 98);
            c.dtype = (sdpa_dtype)t;
            check_case(backend, &c);
        }
    }
    /* 2-16 grouped-query rows per KV head in bf16 with no mask (cpu.amx
     * runs them on tiles with K in place, S^T = K Q^T: decode_amx.h): every
     * count of rows from 2 to 16, key blocks of 64 with a tail (1, 16, 63,
     * 65 keys), keys cut into chunks and merged (one or two KV heads
     * against 1100-5000 keys), KV heads in two groups (12), head dims 32
     * to 256, every layout and output dtype, a negative scale, peaked
     * values; non-finite values on 16 rows of one KV head */
    {
        static const int64_t tile_rows[][6] = {
            {1, 1, 1, 2, 1, 32},      {1, 1, 16, 3, 1, 64},     {2, 1, 63, 8, 2, 128},
            {1, 2, 65, 10, 2, 96},    {1, 1, 1100, 16, 1, 128}, {1, 3, 5000, 8, 2, 64},
            {2, 1, 333, 84, 12, 128}, {1, 4, 700, 16, 4, 256},  {1, 16, 200, 1, 1, 64},
            {1, 5, 129, 3, 1, 32},    {1, 1, 2000, 7, 1, 160},  {3, 2, 90, 24, 4, 192},
            {1, 13, 77, 1, 1, 224},   {1, 1, 4096, 11, 1, 128}, {1, 2, 64, 12, 2, 64}};
        for (size_t i = 0; i < sizeof tile_rows / sizeof *tile_rows; i++) {
            const int64_t *x = tile_rows[i];
            c = mk(x[0], x[1], x[2], x[3], x[4], x[5]);
            c.dtype = SDPA_BF16;
            c.layout = (tl_layout)(i % 4);
            c.out_dtype = (sdpa_dtype)(i % SDPA_DTYPE_COUNT);
            c.values = i % 3 == 1 ? TL_PEAKED : TL_UNIFORM;
            c.scale = i % 5 == 3 ? -0.2 : 0.0;
            check_case(backend, &c);
        }
        c = mk(1, 2, 3000, 8, 1, 128);
        c.dtype = SDPA_BF16;
        nonfinite_cases(backend, c);
    }
    /* Mixed dtypes: q in one dtype, k and v in another (f32 queries over
     * an f16 or bf16 cache, as stable-diffusion.cpp calls it, and the
     * reverse), through every path of the CPU kernels: short and long key
     * ranges, few queries, grouped-query, cross, causal, strided, peaked,
     * head dims with tails; a backend that converts one dtype only skips. */
    {
        static const int pairs[][2] = {{SDPA_F32, SDPA_F16}, {SDPA_F32, SDPA_BF16},
                                       {SDPA_BF16, SDPA_F32}, {SDPA_F16, SDPA_BF16},
                                       {SDPA_BF16, SDPA_F16}};
        static const int64_t shapes[][6] = {{1, 129, 129, 2, 2, 64}, {1, 50, 600, 4, 2, 72},
                                            {2, 300, 77, 2, 2, 128}, {1, 1, 333, 8, 2, 64},
                                            {1, 3, 2053, 4, 4, 80},  {2, 45, 67, 4, 1, 96}};
        int n = 0;
        for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++)
            for (size_t j = 0; j < sizeof shapes / sizeof *shapes; j++, n++) {
                c = mk(shapes[j][0], shapes[j][1], shapes[j][2], shapes[j][3], shapes[j][4],
                       shapes[j][5]);
                c.dtype = (sdpa_dtype)pairs[i][0], c.kv_dtype = SDPA_KV_DTYPE(pairs[i][1]);
                c.out_dtype = n % 4 == 3 ? SDPA_BF16 : SDPA_F32;
                c.causal = (sdpa_causal)(n % 3), c.layout = (tl_layout)(n % 3);
                c.values = n % 5 == 4 ? TL_PEAKED : TL_UNIFORM;
                check_case(backend, &c);
            }
    }
    /* A huge finite scale: no undefined behaviour, the largest score wins. */
    c = mk(1, 40, 70, 2, 2, 64);
    c.scale = 1e30;
    huge_scale_case(backend, &c);
}

/* The checker itself must catch a wrong answer and a clobbered guard. */
static void self_test(void)
{
    tl_case c = mk(1, 17, 17, 2, 1, 32);
    tl_problem p;
    tl_output a, b;
    char why[128];
    tl_problem_make(&p, &c);
    tl_output_make(&a, &p);
    tl_output_make(&b, &p);
    run(ctx2, "ref", &p, &a);
    run(ctx2, "ref", &p, &b);
    CHECK(tl_max_diff(&a, &b, NULL) == 0.0, "ref is not repeatable");
    ((float *)b.t.data)[5] += 3 * (float)tl_tolerance(SDPA_F32, SDPA_F32);
    CHECK(tl_max_diff(&a, &b, NULL) > tl_tolerance(SDPA_F32, SDPA_F32),
          "checker missed a perturbed output");
    ((unsigned char *)a.mem)[a.bytes] ^= 1;
    CHECK(!tl_output_check(&a, why, sizeof why), "checker missed a clobbered guard byte");
    tl_output_free(&a), tl_output_free(&b), tl_problem_free(&p);

    /* The reference against closed forms: one key gives v exactly and
     * LSE = scale q.k; two keys give a two-term softmax. */
    c = mk(1, 3, 1, 1, 1, 5);
    tl_problem_make(&p, &c);
    tl_output_make(&a, &p);
    CHECK_STATUS(run(ctx2, "ref", &p, &a), SDPA_OK);
    double worst = 0;
    for (int i = 0; i < 3; i++) {
        double dot = 0;
        for (int d = 0; d < 5; d++) {
            worst = fmax(worst, fabs(tl_out_get(&a.t, 0, i, 0, d) - tl_out_get(&p.v, 0, 0, 0, d)));
            dot += (double)tl_out_get(&p.q, 0, i, 0, d) * tl_out_get(&p.k, 0, 0, 0, d);
        }
        worst = fmax(worst, fabs(a.lse[i] - dot / sqrt(5.0)));
    }
    CHECK(worst < 1e-6, "ref with one key: off by %g", worst);
    tl_output_free(&a), tl_problem_free(&p);

    c = mk(1, 1, 2, 1, 1, 4);
    tl_problem_make(&p, &c);
    tl_output_make(&a, &p);
    CHECK_STATUS(run(ctx2, "ref", &p, &a), SDPA_OK);
    double s[2];
    for (int j = 0; j < 2; j++) {
        s[j] = 0;
        for (int d = 0; d < 4; d++)
            s[j] += (double)tl_out_get(&p.q, 0, 0, 0, d) * tl_out_get(&p.k, 0, j, 0, d) / 2.0;
    }
    double w0 = 1 / (1 + exp(s[1] - s[0]));
    worst = 0;
    for (int d = 0; d < 4; d++)
        worst = fmax(worst, fabs(tl_out_get(&a.t, 0, 0, 0, d) -
                                 (w0 * tl_out_get(&p.v, 0, 0, 0, d) +
                                  (1 - w0) * tl_out_get(&p.v, 0, 1, 0, d))));
    CHECK(worst < 1e-6, "ref with two keys: off by %g", worst);
    tl_output_free(&a), tl_problem_free(&p);
}

#ifdef SDPA_TEST_AMX_EMULATED
/* cpu.amx keeps a thread's tile configuration while it works and drops it
 * when it goes idle: the calling thread at the end of the call, a pool
 * worker when it sleeps (after its spin). */
static void tile_release_check(void)
{
    if (!(sdpa_context_platform(ctx2)->cpu_features & SDPA_CPU_AVX512BF16))
        return;
    tl_case c = mk(1, 200, 300, 4, 2, 64);
    c.dtype = SDPA_BF16;
    tl_problem p;
    tl_output o;
    if (!tl_problem_make(&p, &c) || !tl_output_make(&o, &p)) {
        CHECK(0, "tile release: out of memory");
        return;
    }
    CHECK_STATUS(run(ctx2, "cpu.amx-emulated", &p, &o), SDPA_OK);
    const int after = sdpa__cpu_amx_emulated_threads_holding_tiles();
    CHECK(after <= 1, "after a call %d threads hold tiles (the caller must not)", after);
    struct timespec ts = {0, 50 * 1000 * 1000}; /* the pool spins 50 us, then sleeps */
    nanosleep(&ts, NULL);
    CHECK(sdpa__cpu_amx_emulated_threads_holding_tiles() == 0,
          "%d threads still hold tiles once the pool is idle",
          sdpa__cpu_amx_emulated_threads_holding_tiles());
    tl_output_free(&o), tl_problem_free(&p);
}

/* The two-row exponential against the one-row one, and the output rows'
 * bf16 rounding against the library's, bit for bit, in every build (the
 * quick one compares nothing with the reference): amx_emulated.c. */
static void rows2_check(void)
{
    if (!(sdpa_context_platform(ctx2)->cpu_features & SDPA_CPU_AVX512BF16))
        return;
    const int bad = sdpa__cpu_amx_emulated_rows2_mismatches(tl_uniform);
    CHECK(bad == 0, "cpu.amx exp_rows2: %d of 16 rows differ from exp_row's P or sum", bad);
    const int wrong = sdpa__cpu_amx_emulated_bf16_round_mismatches(tl_uniform);
    CHECK(wrong == 0, "cpu.amx bf16_round: %d values differ from sdpa__f32_to_bf16's", wrong);
}
#endif

int main(int argc, char **argv)
{
    tl_seed_from_env();
    ctx2 = tl_context(NULL);
    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    o.threads = 1;
    o.ignore_env = 1;
    if (!ctx2 || sdpa_context_create(&o, &ctx1) != SDPA_OK) {
        printf("cannot create contexts: %s\n", sdpa_last_error());
        return 1;
    }
    self_test();
#ifdef SDPA_TEST_AMX_EMULATED
    if (sdpa__ctx_add_backend(ctx1, sdpa__cpu_amx_emulated()) != SDPA_OK ||
        sdpa__ctx_add_backend(ctx2, sdpa__cpu_amx_emulated()) != SDPA_OK) {
        printf("cannot add cpu.amx-emulated: %s\n", sdpa_last_error());
        return 1;
    }
    /* The emulated kernel runs wherever AVX512-BF16 does: it must claim a
     * plain bf16 case here, or the grid would skip it silently. */
    if (sdpa_context_platform(ctx2)->cpu_features & SDPA_CPU_AVX512BF16) {
        tl_case probe = mk(1, 64, 64, 2, 2, 64);
        char why[512];
        probe.dtype = SDPA_BF16;
        CHECK(claims("cpu.amx-emulated", &probe, why, sizeof why),
              "cpu.amx-emulated does not claim a plain bf16 case: %s", why);
    }
#endif
#ifdef SDPA_TEST_AMX_EMULATED
    tile_release_check();
    rows2_check();
#endif
    if (argc > 1) {
        for (int i = 1; i < argc; i++)
            grid(argv[i]);
    } else {
        for (int i = 0; i < sdpa_backend_count(ctx2); i++) {
            sdpa_backend_info b;
            sdpa_backend_get(ctx2, i, &b);
            if (strcmp(b.name, "ref") == 0)
                continue;
            if (!b.present) {
                tl_skip(b.name, b.why_absent);
                continue;
            }
            /* Under SDPA_TEST_QUICK (ThreadSanitizer) the emulated tiles add
             * nothing where the real ones run: the same source and task
             * threading, at 100x the cost (475 of 557 s on a Sapphire
             * Rapids VM). The plain and ASan builds run both. */
            if (getenv("SDPA_TEST_QUICK") && strcmp(b.name, "cpu.amx-emulated") == 0 &&
                info("cpu.amx").present) {
                tl_skip(b.name, "SDPA_TEST_QUICK: cpu.amx runs the same kernel on real tiles here");
                continue;
            }
            grid(b.name);
        }
    }
    sdpa_context_destroy(ctx1);
    sdpa_context_destroy(ctx2);
    return tl_finish();
}
