/*
 * mask_row.h - the key and general masks (sdpa.h) applied to one query
 * row's scores, for the CPU kernels that hold a row of scores at a time
 * (cpu.portable per tile, cpu.blas per block): a hidden key's score
 * becomes -inf, an additive mask is added. Only masked calls run it, and
 * it is a scalar loop: what it costs is one load per score.
 */
#ifndef SDPA_MASK_ROW_H
#define SDPA_MASK_ROW_H

#include "../core/convert.h"

#include <math.h>

/* Score s of a key at element `at` of the general mask, masked. */
static inline float sdpa__mask_general(const sdpa_mask *mk, int64_t at, float s)
{
    if (mk->general_type == SDPA_MASK_BOOL)
        return ((const uint8_t *)mk->general)[at] ? s : -INFINITY;
    const float add = sdpa__load_f32(mk->general, mk->general_dtype, at);
    return add == -INFINITY ? -INFINITY : s + add;
}

/* Element of the general mask for query i of (b, h) and key j. */
static inline int64_t sdpa__mask_at(const sdpa_mask *mk, int64_t b, int64_t h, int64_t i,
                                    int64_t j)
{
    return b * mk->general_stride[0] + h * mk->general_stride[1] + i * mk->general_stride[2] +
           j * mk->general_stride[3];
}

/* Scores s[0..n) of query i of (b, h) against keys kidx[0..n), or
 * j0 .. j0 + n - 1 when kidx is NULL. */
static inline void sdpa__mask_row(const sdpa_mask *mk, int64_t b, int64_t h, int64_t i,
                                  const int64_t *kidx, int64_t j0, float *s, int64_t n)
{
    const uint8_t *key = mk->key ? mk->key + b * mk->key_stride[0] : NULL;
    for (int64_t jj = 0; jj < n; jj++) {
        const int64_t j = kidx ? kidx[jj] : j0 + jj;
        if (key && !key[j * mk->key_stride[1]])
            s[jj] = -INFINITY;
        else if (mk->general)
            s[jj] = sdpa__mask_general(mk, sdpa__mask_at(mk, b, h, i, j), s[jj]);
    }
}

/* The real lengths of batch entry b (sdpa.h: a missing array is full). */
static inline void sdpa__seq_lens(const sdpa_call *c, int64_t b, int64_t *len_q, int64_t *len_kv)
{
    const sdpa_mask *mk = c->mask;
    *len_q = mk && mk->seq_len_q ? mk->seq_len_q[b] : c->desc.Sq;
    *len_kv = mk && mk->seq_len_kv ? mk->seq_len_kv[b] : c->desc.Skv;
}

#endif
