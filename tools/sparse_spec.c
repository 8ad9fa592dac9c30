/* sparse_spec.c - see sparse_spec.h. */
#include "sparse_spec.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 128

unsigned sparse_spec_kind(const char *spec)
{
    static const char *maps[] = {"nbhd=", "sta=", "radial=", "random="};
    if (strncmp(spec, "window=", 7) == 0)
        return SDPA_MASK_KIND_WINDOW;
    for (size_t i = 0; i < sizeof maps / sizeof *maps; i++)
        if (strncmp(spec, maps[i], strlen(maps[i])) == 0)
            return SDPA_MASK_KIND_BLOCKS;
    return 0;
}

/* n comma-separated integers from s (up to the next ':' or the end);
 * returns the rest after ':' (or "" at the end), NULL on a malformed list. */
static const char *ints(const char *s, long long *v, int n)
{
    for (int i = 0; i < n; i++) {
        char *end;
        v[i] = strtoll(s, &end, 10);
        if (end == s || (i + 1 < n && *end != ','))
            return NULL;
        s = end + (i + 1 < n);
    }
    if (*s == ':')
        return s + 1;
    return *s == '\0' ? s : NULL;
}

/* A map of FULL blocks only, in one allocation (sdpa_block_map_free frees it). */
static sdpa_block_map *full_map(int64_t nq, int64_t nk)
{
    const size_t head = (sizeof(sdpa_block_map) + 63) / 64 * 64;
    char *mem = malloc(head + sizeof(int32_t) * (size_t)(nq + nq * nk));
    if (!mem)
        return NULL;
    sdpa_block_map *m = (sdpa_block_map *)mem;
    int32_t *count = (int32_t *)(mem + head), *index = count + nq;
    *m = (sdpa_block_map){BLOCK, BLOCK, 1, 1, nq, nk, nk, count, index, NULL, NULL, NULL};
    return m;
}

/* Keys of the map's listed blocks over all keys (the keys a call visits). */
static double density(const sdpa_block_map *m, const sdpa_call_desc *d)
{
    return sdpa_block_map_density(m, d->Sq, d->Skv);
}

static int random_map(double s, const sdpa_call_desc *d, sparse_pattern *out)
{
    const int64_t nq = (d->Sq + BLOCK - 1) / BLOCK, nk = (d->Skv + BLOCK - 1) / BLOCK;
    sdpa_block_map *m = full_map(nq, nk);
    if (!m)
        return 0;
    int32_t *count = (int32_t *)m->full_count, *index = (int32_t *)m->full_index;
    uint64_t x = 0x2545f4914f6cdd1dull;
    for (int64_t qb = 0; qb < nq; qb++) {
        count[qb] = 0;
        for (int64_t kb = 0; kb < nk; kb++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            if ((double)(x >> 11) * 0x1p-53 >= s)
                index[qb * nk + count[qb]++] = (int32_t)kb;
        }
    }
    out->map = m;
    return 1;
}

/* Radial-like (Radial Attention's shape at block granularity): query block
 * qb in frame f sees every key block of frames f - 1 .. f + 1 and of
 * frame 0; at frame distance t >= 2, the key blocks whose position in
 * their frame lies within F / 2^ceil(log2 t) / 2 tokens of the query
 * block's position in its own (F tokens per frame). Text: dense. */
static int radial_map(const long long *g, long long P, const sdpa_call_desc *d,
                      sparse_pattern *out)
{
    const int64_t F = g[1] * g[2], N = d->Sq;
    const int64_t nq = (N + BLOCK - 1) / BLOCK;
    sdpa_block_map *m = full_map(nq, nq);
    if (!m)
        return 0;
    int32_t *count = (int32_t *)m->full_count, *index = (int32_t *)m->full_index;
    for (int64_t qb = 0; qb < nq; qb++) {
        count[qb] = 0;
        const int64_t qi = qb * BLOCK + BLOCK / 2 < N ? qb * BLOCK + BLOCK / 2 : N - 1;
        for (int64_t kb = 0; kb < nq; kb++) {
            const int64_t k0 = kb * BLOCK, k1 = k0 + BLOCK < N ? k0 + BLOCK : N;
            int see;
            if (qb * BLOCK < P || k0 < P || qi < P) {
                see = 1; /* text rows, or text keys */
            } else {
                const int64_t fq = (qi - P) / F, pq = (qi - P) % F;
                const int64_t fk0 = (k0 - P) / F, fk1 = (k1 - 1 - P) / F;
                see = 0;
                for (int64_t fk = fk0; fk <= fk1 && !see; fk++) {
                    const int64_t t = fq > fk ? fq - fk : fk - fq;
                    if (t <= 1 || fk == 0) {
                        see = 1;
                        break;
                    }
                    int64_t half = F / 2, p2 = 1;
                    while (p2 < t)
                        p2 *= 2, half /= 2;
                    /* keys of this frame inside the block: positions a .. b */
                    const int64_t a = (k0 - P > fk * F ? k0 - P : fk * F) - fk * F;
                    const int64_t b = (k1 - 1 - P < (fk + 1) * F - 1 ? k1 - 1 - P
                                                                     : (fk + 1) * F - 1) -
                                      fk * F;
                    see = b >= pq - half && a <= pq + half;
                }
            }
            if (see)
                index[qb * nq + count[qb]++] = (int32_t)kb;
        }
    }
    out->map = m;
    return 1;
}

int sparse_spec_build(const char *spec, const sdpa_call_desc *d, sparse_pattern *out, char *err,
                      size_t n)
{
    memset(out, 0, sizeof *out);
    out->density = 1.0;
    long long v[9] = {0};
    const char *rest;
    if (strncmp(spec, "window=", 7) == 0) {
        if (!(rest = ints(spec + 7, v, 2)) || *rest || v[0] < -1 || v[1] < -1) {
            snprintf(err, n, "'%s': expected window=L,R (keys left and right, -1 unbounded)",
                     spec);
            return -1;
        }
        out->window.left = v[0], out->window.right = v[1], out->has_window = 1;
        /* keys visited: each row's window within the keys (bottom-right) */
        double seen = 0;
        for (int64_t i = 0; i < d->Sq; i++) {
            const int64_t c = i + d->Skv - d->Sq;
            int64_t lo = v[0] < 0 ? 0 : c - v[0], hi = v[1] < 0 ? d->Skv - 1 : c + v[1];
            lo = lo < 0 ? 0 : lo, hi = hi >= d->Skv ? d->Skv - 1 : hi;
            seen += hi >= lo ? (double)(hi - lo + 1) : 0;
        }
        out->density = seen / ((double)d->Sq * (double)d->Skv);
        return 0;
    }
    if (d->Sq != d->Skv) {
        snprintf(err, n, "'%s': a map over a token grid needs Sq == Skv (self attention)", spec);
        return -1;
    }
    if (strncmp(spec, "random=", 7) == 0) {
        char *end;
        const double s = strtod(spec + 7, &end);
        if (end == spec + 7 || *end || !(s >= 0 && s <= 1)) {
            snprintf(err, n, "'%s': expected random=S with S in 0..1", spec);
            return -1;
        }
        if (!random_map(s, d, out)) {
            snprintf(err, n, "'%s': out of memory", spec);
            return -1;
        }
        out->density = density(out->map, d);
        return 0;
    }
    const int sta = strncmp(spec, "sta=", 4) == 0, radial = strncmp(spec, "radial=", 7) == 0;
    const int nbhd = strncmp(spec, "nbhd=", 5) == 0;
    const char *form = sta      ? "sta=T,H,W:tt,th,tw:wt,wh,ww[:P[,S]]"
                       : radial ? "radial=T,H,W[:P]"
                                : "nbhd=T,H,W:wt,wh,ww[:P[,S]]";
    if (!sta && !radial && !nbhd) {
        snprintf(err, n,
                 "'%s': expected window=L,R, nbhd=T,H,W:wt,wh,ww[:P[,S]], "
                 "sta=T,H,W:tt,th,tw:wt,wh,ww[:P[,S]], radial=T,H,W[:P] or random=S",
                 spec);
        return -1;
    }
    rest = ints(spec + (sta ? 4 : radial ? 7 : 5), v, 3);           /* grid */
    if (rest && sta)
        rest = *rest ? ints(rest, v + 3, 3) : NULL;                   /* tiles */
    if (rest && !radial)
        rest = *rest ? ints(rest, v + 6, 3) : NULL;                   /* windows */
    long long text[2] = {0, 0}; /* dense tokens before and after the grid */
    if (rest && *rest) {
        const char *two = radial ? NULL : ints(rest, text, 2);
        rest = two ? two : ints(rest, text, 1);
    }
    const long long prefix = text[0], suffix = text[1];
    if (!rest || *rest || v[0] < 1 || v[1] < 1 || v[2] < 1 || prefix < 0 || suffix < 0) {
        snprintf(err, n, "'%s': expected %s", spec, form);
        return -1;
    }
    if (prefix + v[0] * v[1] * v[2] + suffix != d->Sq) {
        char after[40] = "";
        if (suffix)
            snprintf(after, sizeof after, " + %lld text", suffix);
        snprintf(err, n, "'%s': %lld text + %lld x %lld x %lld grid tokens%s = %lld, expected Sq %lld",
                 spec, prefix, v[0], v[1], v[2], after, prefix + v[0] * v[1] * v[2] + suffix,
                 (long long)d->Sq);
        return -1;
    }
    if (radial) {
        if (!radial_map(v, prefix, d, out)) {
            snprintf(err, n, "'%s': out of memory", spec);
            return -1;
        }
        out->density = density(out->map, d);
        return 0;
    }
    const int64_t windows[3] = {v[6], v[7], v[8]};
    sdpa_neighborhood_3d nb = {{v[0], v[1], v[2]},
                               {sta ? v[3] : 0, sta ? v[4] : 0, sta ? v[5] : 0},
                               windows, 1, prefix, 0};
    if (sdpa_block_map_3d_joint(&nb, suffix, BLOCK, &out->map) != SDPA_OK) {
        snprintf(err, n, "'%s': %s", spec, sdpa_last_error());
        return -1;
    }
    out->density = density(out->map, d);
    return 0;
}

void sparse_pattern_free(sparse_pattern *p)
{
    sdpa_block_map_free(p->map);
    memset(p, 0, sizeof *p);
}

void sparse_pattern_apply(const sparse_pattern *p, sdpa_mask *m)
{
    m->window = p->has_window ? &p->window : NULL;
    m->blocks = p->map;
}
