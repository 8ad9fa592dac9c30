/*
 * amx_notiles.c - cpu.amx's kernel source with its tile work compiled out
 * (SDPA_AMX_NO_TILES in src/cpu/amx/amx_tiles.h): what bench/amx_cost.c
 * times on any CPU with AVX-512 BF16. Built with the kernel's own flags,
 * without the tile ones.
 */
#define SDPA_AMX_NO_TILES 1
#define AMX_RUN_SYMBOL sdpa__cpu_amx_notiles_run
#define AMX_HELD_SYMBOL sdpa__cpu_amx_notiles_holding_tiles
#include "cpu/amx/flash_amx.c"

/*
 * The softmax's exponential alone, for bench_amx_cost --softmax: the
 * kernel's exp_row (the path past a row's first block: P = 2^(c s - m)
 * without a max pass, its sum, P rounded to bf16 and stored) over 32 rows
 * of 256 scores in L1, and variants of its arithmetic beside it, each the
 * same loop with one thing changed. What they show is where the
 * exponential's floor lies on the CPU at hand; the rows named "kernel"
 * are the kernel's own (the others are not all exact: see their names).
 */
#include <time.h>

enum { EXP_ROWS = 32, EXP_KEYS = 256 };
static const float *exp_rows_base; /* the scores' first row: exp_rows2_kernel's pairs */

static inline __m512 exp_floor_roundscale(__m512 x) /* floor by VRNDSCALEPS, f = x - n */
{
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    return exp2_bf16_from_fraction(n, _mm512_sub_ps(x, n)); /* VSCALEFPS by floor(n) = n */
}

/* floor by VRNDSCALEPS, f = x - n by an FMA (-inf gives NaN): on Zen 4 VREDUCEPS and
 * VSCALEFPS each hold the FADD pipes two cycles per 16 lanes, VRNDSCALEPS one; this moves
 * a cycle to the FMA pipes */
static inline __m512 exp_floor_fma(__m512 x)
{
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    return exp2_bf16_from_fraction(n, _mm512_fnmadd_ps(n, _mm512_set1_ps(1.0f), x));
}

static inline __m512 exp_magic(__m512 x) /* nearest n by a magic add, 2^n by an integer add: no -inf */
{
    const __m512 magic = _mm512_set1_ps(12582912.0f), t = _mm512_add_ps(x, magic);
    const __m512 f = _mm512_sub_ps(x, _mm512_sub_ps(t, magic));
    __m512 p = _mm512_set1_ps(0.0555041087f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.240226507f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.693147181f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_castsi512_ps(
        _mm512_add_epi32(_mm512_castps_si512(p), _mm512_slli_epi32(_mm512_castps_si512(t), 23)));
}

static inline __m512 exp_fmas_only(__m512 x) /* the polynomial's FMAs alone: not an exponential */
{
    __m512 p = _mm512_set1_ps(0.0770675838f);
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(0.227644399f));
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(0.695116937f));
    return _mm512_fmadd_ps(p, x, _mm512_set1_ps(1.0f));
}

/* 2^x from a 32-entry table: j = floor(32 x) mod 32 from the low bits of
 * x + 1.5 2^18 rounded down, r = x - floor(32 x) / 32 (VREDUCEPS, 5
 * fraction bits), 2^(j/32) (1 + a r) as T0[j] + T1[j] r (relative error
 * 4.4e-5) by two VPERMT2PS and one FMA, VSCALEFPS by floor(x): one FMA
 * instead of three, two shuffles more */
static float exp_t32_t0[32], exp_t32_t1[32]; /* filled by sdpa__amx_exp_variant_seconds */
static inline __m512 exp_t32(__m512 x)
{
    const __m512i j = _mm512_castps_si512(_mm512_add_round_ps(
        x, _mm512_set1_ps(393216.0f), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC));
    const __m512 r = _mm512_reduce_ps(x, (5 << 4) | _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const __m512 a = _mm512_permutex2var_ps(_mm512_loadu_ps(exp_t32_t0), j,
                                            _mm512_loadu_ps(exp_t32_t0 + 16));
    const __m512 b = _mm512_permutex2var_ps(_mm512_loadu_ps(exp_t32_t1), j,
                                            _mm512_loadu_ps(exp_t32_t1 + 16));
    return _mm512_scalef_ps(_mm512_fmadd_ps(b, r, a), x);
}

/* exp_row's loop with `ex` for the exponential and the sums by FMA or add */
#define EXP_ROW_VARIANT(name, ex, fma_sums)                                                  \
    static __attribute__((noinline)) __m512 name(const float *s, uint16_t *p, float c,       \
                                                 float m)                                    \
    {                                                                                        \
        const __m512 cv = _mm512_set1_ps(c), nm = _mm512_set1_ps(-m), one = _mm512_set1_ps(1); \
        __m512 sum0 = _mm512_setzero_ps(), sum1 = sum0;                                      \
        for (int v = 0; v < EXP_KEYS / 16; v += 2) {                                         \
            const __m512 e0 = ex(_mm512_fmadd_ps(_mm512_load_ps(s + 16 * v), cv, nm));       \
            const __m512 e1 = ex(_mm512_fmadd_ps(_mm512_load_ps(s + 16 * v + 16), cv, nm));  \
            sum0 = (fma_sums) ? _mm512_fmadd_ps(e0, one, sum0) : _mm512_add_ps(sum0, e0);    \
            sum1 = (fma_sums) ? _mm512_fmadd_ps(e1, one, sum1) : _mm512_add_ps(sum1, e1);    \
            _mm512_store_si512(p + 16 * v, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));            \
        }                                                                                    \
        return _mm512_add_ps(sum0, sum1);                                                    \
    }
EXP_ROW_VARIANT(exp_row_fma_sums, exp2_bf16, 1)
EXP_ROW_VARIANT(exp_row_roundscale, exp_floor_roundscale, 0)
EXP_ROW_VARIANT(exp_row_magic, exp_magic, 0)
EXP_ROW_VARIANT(exp_row_fmas_only, exp_fmas_only, 0)
EXP_ROW_VARIANT(exp_row_floor_fma, exp_floor_fma, 0)
EXP_ROW_VARIANT(exp_row_t32, exp_t32, 0)

static __attribute__((noinline)) __m512 exp_row_kernel(const float *s, uint16_t *p, float c,
                                                       float m)
{
    return exp_row(s, p, EXP_KEYS / 16, EXP_KEYS, c, m, 0);
}

/* The kernel's exp_rows2 (the rows past their first block, two at a
 * time): rows r and r + 1 where r is even, nothing for odd r. */
static __attribute__((noinline)) __m512 exp_rows2_kernel(const float *s, uint16_t *p, float c,
                                                         float m)
{
    if ((s - exp_rows_base) / EXP_KEYS % 2)
        return _mm512_setzero_ps();
    __m512 a, b;
    exp_rows2(s, p, EXP_KEYS, EXP_KEYS, EXP_KEYS / 16, EXP_KEYS, c, m, m, &a, &b);
    return _mm512_add_ps(a, b);
}

/* Tried against the kernel's exp_rows2, not kept. MODE 0: the sums of P
 * as rounded to bf16, by VDPBF16PS of the stored P with ones (one
 * operation per 32 scores where the FMA sums take two): 0.94-0.95x the
 * loop's time on Zen 4, 1-2% of the tile-less kernel, but the LSE moves
 * by up to 2^-8 P_2 / (1 + P_2) on a row of two keys (1.3e-3 where P_2 is
 * just past 0.5), over the 1e-3 a caller merging partial results by their
 * LSE (and python/tests/test_numpy.py) holds a bf16 backend to. MODES 1
 * and 2, on top of MODE 0: P made bf16 another way than VCVTNE2PS2BF16,
 * the polynomial's result rounded to 8 bits in fp32, by VRNDSCALEPS (7
 * fraction bits; MODE 1, the same bits as the kernel) or by its last FMA
 * adding 2^16 and one more subtracting it (MODE 2), so that VSCALEFPS
 * leaves an fp32 exact in bf16 whose high halves VPERMT2W packs: both
 * slower than MODE 0. (MODE is rows2_variant's mode.) */
static inline __attribute__((always_inline)) __m512 rows2_variant(const float *s, uint16_t *p,
                                                                   float c, float m,
                                                                   const int mode)
{
    if ((s - exp_rows_base) / EXP_KEYS % 2)
        return _mm512_setzero_ps();
    const int ld = EXP_KEYS, nv = EXP_KEYS / 16;
    const __m512 cv = _mm512_set1_ps(c), nm = _mm512_set1_ps(-m);
    const __m512bh ones = (__m512bh)_mm512_set1_epi16(0x3f80);
    const __m512i odd = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37,
                                         35, 33, 31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9,
                                         7, 5, 3, 1); /* the high halves of two vectors */
    __m512 a = _mm512_setzero_ps(), b = a, x[4], f[4];
    const float *row[4] = {s, s + 16, s + ld, s + ld + 16}; /* the step's four vectors */
    for (int i = 0; i < 4; i++)
        x[i] = _mm512_fmadd_ps(_mm512_load_ps(row[i]), cv, nm), f[i] = exp2_bf16_fraction(x[i]);
    for (int v = 0; v < nv; v += 2) {
        __m512 y[4], g[4], e[4];
        for (int i = 0; i < 4; i++)
            y[i] = x[i], g[i] = f[i];
        if (v + 2 < nv)
            for (int i = 0; i < 4; i++)
                x[i] = _mm512_fmadd_ps(_mm512_load_ps(row[i] + 16 * v + 32), cv, nm),
                f[i] = exp2_bf16_fraction(x[i]);
        __m512bh pa, pb;
        if (mode == 0) {
            for (int i = 0; i < 4; i++)
                e[i] = exp2_bf16_from_fraction(y[i], g[i]);
            pa = _mm512_cvtne2ps_pbh(e[1], e[0]), pb = _mm512_cvtne2ps_pbh(e[3], e[2]);
        } else {
            for (int i = 0; i < 4; i++) {
                __m512 q = _mm512_set1_ps(0.0770675838f);
                q = _mm512_fmadd_ps(q, g[i], _mm512_set1_ps(0.227644399f));
                q = _mm512_fmadd_ps(q, g[i], _mm512_set1_ps(0.695116937f));
                if (mode == 1)
                    q = _mm512_roundscale_ps(_mm512_fmadd_ps(q, g[i], _mm512_set1_ps(1.0f)),
                                             (7 << 4) | _MM_FROUND_TO_NEAREST_INT |
                                                 _MM_FROUND_NO_EXC);
                else
                    q = _mm512_fmadd_ps(_mm512_fmadd_ps(q, g[i], _mm512_set1_ps(65537.0f)),
                                        _mm512_set1_ps(1.0f), _mm512_set1_ps(-65536.0f));
                e[i] = _mm512_scalef_ps(q, y[i]);
            }
            pa = (__m512bh)_mm512_permutex2var_epi16(_mm512_castps_si512(e[0]), odd,
                                                     _mm512_castps_si512(e[1]));
            pb = (__m512bh)_mm512_permutex2var_epi16(_mm512_castps_si512(e[2]), odd,
                                                     _mm512_castps_si512(e[3]));
        }
        a = _mm512_dpbf16_ps(a, pa, ones);
        b = _mm512_dpbf16_ps(b, pb, ones);
        _mm512_store_si512(p + 16 * v, (__m512i)pa);
        _mm512_store_si512(p + ld + 16 * v, (__m512i)pb);
    }
    return _mm512_add_ps(a, b);
}

static __attribute__((noinline)) __m512 exp_rows2_dp(const float *s, uint16_t *p, float c,
                                                     float m)
{
    return rows2_variant(s, p, c, m, 0);
}

static __attribute__((noinline)) __m512 exp_rows2_rnd(const float *s, uint16_t *p, float c,
                                                      float m)
{
    return rows2_variant(s, p, c, m, 1);
}

static __attribute__((noinline)) __m512 exp_rows2_fmarnd(const float *s, uint16_t *p, float c,
                                                         float m)
{
    return rows2_variant(s, p, c, m, 2);
}

const char *sdpa__amx_exp_variant_name(int variant);
const char *sdpa__amx_exp_variant_name(int variant)
{
    static const char *const names[] = {
        "kernel: exp_row (VREDUCEPS, degree 3, VSCALEFPS; sums by add)",
        "the same, sums by FMA (e 1 + sum)",
        "floor by VRNDSCALEPS, f = x - n, VSCALEFPS",
        "nearest n by a magic add, 2^n by an integer add (no -inf: not exact)",
        "the FMAs alone for the exponential (no floor or 2^n; sums, bf16, store kept)",
        "floor by VRNDSCALEPS, f = x - n by an FMA, VSCALEFPS (-inf gives NaN)",
        "32-entry table by VPERMT2PS, degree 1 per entry (T0 + T1 r), VSCALEFPS",
        "kernel: exp_rows2 (two rows a loop, software-pipelined, sums by FMA)",
        "exp_rows2, sums of P as rounded by VDPBF16PS (LSE off by up to 2^-8)",
        "  and P to bf16 by VRNDSCALEPS (7 bits) and VPERMT2W",
        "  and P to bf16 by its last FMA (+2^16), an FMA (-2^16), VPERMT2W"};
    return variant >= 0 && variant < (int)(sizeof names / sizeof *names) ? names[variant] : NULL;
}

/* Thread CPU seconds of `iters` passes of variant v over the block. */
double sdpa__amx_exp_variant_seconds(int variant, long long iters);
double sdpa__amx_exp_variant_seconds(int variant, long long iters)
{
    __m512 (*const fn[])(const float *, uint16_t *, float, float) = {
        exp_row_kernel,    exp_row_fma_sums,  exp_row_roundscale, exp_row_magic,
        exp_row_fmas_only, exp_row_floor_fma, exp_row_t32, exp_rows2_kernel,
        exp_rows2_dp,      exp_rows2_rnd,     exp_rows2_fmarnd};
    static float s[EXP_ROWS * EXP_KEYS] __attribute__((aligned(64)));
    static uint16_t p[EXP_ROWS * EXP_KEYS] __attribute__((aligned(64)));
    for (int j = 0; j < 32; j++) /* 0.699396: (1 + a r) / 2^r closest to 1 on [0, 1/32) */
        exp_t32_t0[j] = (float)exp2(j / 32.0), exp_t32_t1[j] = (float)(exp2(j / 32.0) * 0.699396);
    exp_rows_base = s;
    for (int i = 0; i < EXP_ROWS * EXP_KEYS; i++) /* scores of a softmax that is not peaked */
        s[i] = (float)((i * 7919) % 1000) * 0.01f;
    __m512 acc = _mm512_setzero_ps();
    struct timespec t0, t1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    for (long long it = 0; it < iters; it++)
        for (int r = 0; r < EXP_ROWS; r++)
            acc = _mm512_add_ps(acc, fn[variant](s + r * EXP_KEYS, p + r * EXP_KEYS, 0.18f, 9.0f));
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    volatile float sink = _mm512_reduce_add_ps(acc); /* the sums are used */
    (void)sink;
    return (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
}
