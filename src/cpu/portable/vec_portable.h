/*
 * vec_portable.h - the vector vocabulary of the backward framework
 * (../flash_backward.h) and the few-query path (../flash_decode.h) in
 * portable C11: a "vector" is a struct of 8
 * floats and every operation a counted loop over them, which compilers
 * turn into whatever SIMD the target has (SSE2 on any x86-64, NEON on
 * AArch64) once inlined. No intrinsics, so cpu.portable keeps running on
 * every CPU.
 *
 * exp: exp_portable.h's, with inputs below -87 (and -inf) giving exactly 0,
 * so masked scores weigh nothing, as in the ISA kernels.
 */
#ifndef SDPA_VEC_PORTABLE_H
#define SDPA_VEC_PORTABLE_H

#include "../exp_portable.h"

#include <stddef.h>
#include <string.h>

#define VL 8
typedef struct vec {
    float x[VL];
} vec;

static inline vec v_load(const float *p)
{
    vec r;
    memcpy(r.x, p, sizeof r.x);
    return r;
}
static inline void v_store(float *p, vec a) { memcpy(p, a.x, sizeof a.x); }
static inline vec v_set1(float s)
{
    vec r;
    for (int i = 0; i < VL; i++)
        r.x[i] = s;
    return r;
}
static inline vec v_fma(vec a, vec b, vec c)
{
    for (int i = 0; i < VL; i++)
        c.x[i] += a.x[i] * b.x[i];
    return c;
}
static inline vec v_mul(vec a, vec b)
{
    for (int i = 0; i < VL; i++)
        a.x[i] *= b.x[i];
    return a;
}
static inline vec v_add(vec a, vec b)
{
    for (int i = 0; i < VL; i++)
        a.x[i] += b.x[i];
    return a;
}
static inline vec v_sub(vec a, vec b)
{
    for (int i = 0; i < VL; i++)
        a.x[i] -= b.x[i];
    return a;
}
static inline vec v_max(vec a, vec b) /* NaN in either stays NaN, as the ISA kernels' order keeps it */
{
    for (int i = 0; i < VL; i++)
        a.x[i] = a.x[i] != a.x[i] || a.x[i] > b.x[i] ? a.x[i] : b.x[i];
    return a;
}
static inline vec v_exp(vec a)
{
    for (int i = 0; i < VL; i++)
        a.x[i] = a.x[i] < -87.0f ? 0.0f : sdpa__exp_nonpos(a.x[i]);
    return a;
}

/* The first n floats of p, the rest zero (nothing past them is read). */
static inline vec v_load_part(const float *p, int n)
{
    vec r;
    for (int i = 0; i < VL; i++)
        r.x[i] = i < n ? p[i] : 0.0f;
    return r;
}

/* Into the first n floats of p (nothing past them is written). */
static inline void v_store_part(float *p, vec a, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = a.x[i];
}

/* r[i] lane j becomes r[j] lane i. */
static inline void v_transpose(vec r[VL])
{
    for (int i = 0; i < VL; i++)
        for (int j = i + 1; j < VL; j++) {
            const float t = r[i].x[j];
            r[i].x[j] = r[j].x[i];
            r[j].x[i] = t;
        }
}

#define V_LOAD(p) v_load(p)
#define V_LOAD_PART(p, n) v_load_part((p), (n))
#define V_TRANSPOSE_REGS(r) v_transpose(r)
#define V_STORE(p, x) v_store((p), (x))
#define V_STORE_PART(p, x, n) v_store_part((p), (x), (n))
#define V_MAX(a, b) v_max((a), (b))
#define V_SET1(x) v_set1(x)
#define V_ZERO() v_set1(0.0f)
#define V_FMA(a, b, c) v_fma((a), (b), (c))
#define V_MUL(a, b) v_mul((a), (b))
#define V_ADD(a, b) v_add((a), (b))
#define V_SUB(a, b) v_sub((a), (b))
#define V_EXP(x) v_exp(x)

#endif
