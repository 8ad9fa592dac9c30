/*
 * validate.c - the validation of a forward call, its tensors, parameters
 * and masks.
 *
 * Every public entry point funnels through sdpa__call_prepare before any
 * backend sees the call, so a bad argument is reported once, here, with its
 * name and the expected value, and nothing has been written yet.
 */
#include "core.h"
#include "sparse.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static const char *dim_names[4] = {"B", "S", "H", "D"};

/*
 * Checks one tensor alone and returns the number of bytes from data to the
 * end of its last element. All arithmetic is overflow-checked: a size whose
 * byte count does not fit in 63 bits is an error, not a wrap-around.
 */
sdpa_status sdpa__check_tensor(const sdpa_tensor *t, const char *name, int is_output,
                               int64_t *span)
{
    if (!t)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "%s is NULL, expected a tensor", name);
    if (!t->data)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "%s->data is NULL, expected a pointer", name);
    if ((unsigned)t->dtype >= SDPA_DTYPE_COUNT)
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "%s->dtype is %d, expected SDPA_F32, SDPA_F16 or SDPA_BF16", name,
                          (int)t->dtype);
    if (t->device.kind != SDPA_DEVICE_CPU && t->device.kind != SDPA_DEVICE_CUDA)
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "%s->device.kind is %d, expected SDPA_DEVICE_CPU or SDPA_DEVICE_CUDA",
                          name, (int)t->device.kind);
    if (t->device.ordinal < 0 || (t->device.kind == SDPA_DEVICE_CPU && t->device.ordinal != 0))
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "%s->device.ordinal is %d, expected 0 for the CPU or >= 0 for CUDA",
                          name, t->device.ordinal);
    int64_t last = 0, count = 1;
    for (int i = 0; i < 4; i++) {
        if (t->size[i] < 1)
            return sdpa__fail(SDPA_INVALID_ARGUMENT, "%s->size[%d] (%s) is %lld, expected >= 1",
                              name, i, dim_names[i], (long long)t->size[i]);
        if (t->stride[i] < (is_output ? 1 : 0))
            return sdpa__fail(SDPA_INVALID_ARGUMENT, "%s->stride[%d] (%s) is %lld, expected >= %d",
                              name, i, dim_names[i], (long long)t->stride[i], is_output ? 1 : 0);
        int64_t step;
        if (__builtin_mul_overflow(t->size[i] - 1, t->stride[i], &step) ||
            __builtin_add_overflow(last, step, &last) ||
            __builtin_mul_overflow(count, t->size[i], &count))
            return sdpa__fail(SDPA_INVALID_ARGUMENT,
                              "%s sizes/strides overflow 64-bit element offsets (size[%d] = %lld, "
                              "stride[%d] = %lld)",
                              name, i, (long long)t->size[i], i, (long long)t->stride[i]);
    }
    int64_t bytes;
    if (__builtin_add_overflow(last, 1, &last) ||
        __builtin_mul_overflow(last, (int64_t)sdpa_dtype_size(t->dtype), &bytes) ||
        __builtin_mul_overflow(count, (int64_t)sdpa_dtype_size(t->dtype), &count))
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "%s byte count overflows 64 bits", name);
    uintptr_t end;
    if (__builtin_add_overflow((uintptr_t)t->data, (uintptr_t)bytes, &end))
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "%s extends past the end of the address space",
                          name);
    if (is_output) {
        /* No two output elements may share memory, or threads race on them.
         * Sufficient test: ordered by stride, each dimension steps over the
         * whole extent of the smaller ones. */
        int order[4] = {0, 1, 2, 3};
        for (int i = 1; i < 4; i++)
            for (int j = i; j > 0 && t->stride[order[j]] < t->stride[order[j - 1]]; j--) {
                int tmp = order[j];
                order[j] = order[j - 1], order[j - 1] = tmp;
            }
        int64_t extent = 1;
        for (int i = 0; i < 4; i++) {
            int d = order[i];
            if (t->size[d] == 1)
                continue;
            if (t->stride[d] < extent)
                return sdpa__fail(SDPA_INVALID_ARGUMENT,
                                  "%s->stride[%d] (%s) is %lld, which makes output elements "
                                  "overlap; expected >= %lld",
                                  name, d, dim_names[d], (long long)t->stride[d],
                                  (long long)extent);
            extent = t->stride[d] * t->size[d]; /* cannot overflow: bounded by `last` */
        }
    }
    *span = bytes;
    return SDPA_OK;
}

int sdpa__overlaps(const void *a, int64_t na, const void *b, int64_t nb)
{
    uintptr_t a0 = (uintptr_t)a, b0 = (uintptr_t)b;
    return a0 < b0 + (uintptr_t)nb && b0 < a0 + (uintptr_t)na;
}

#ifdef SDPA_ABI_GROWTH_TEST
/* The growth test's library (scripts/abi-check.sh) reads its added field,
 * as a release that adds one would: it must be 0 ("as before") for a
 * program built against 0.2.0, which it is only if the struct was read no
 * further than the caller's size. */
static const void *grown_field_zero(const void *r, size_t base, size_t ours, const char *what)
{
    int64_t added;
    memcpy(&added, (const char *)r + base, sizeof added);
    if (ours >= base + sizeof added && added != 0) {
        sdpa__fail(SDPA_INVALID_ARGUMENT, "%s->abi_growth_test is %lld, expected 0: read past "
                                          "the caller's struct", what, (long long)added);
        return NULL;
    }
    return r;
}
#else
static const void *grown_field_zero(const void *r, size_t base, size_t ours, const char *what)
{
    (void)base, (void)ours, (void)what;
    return r;
}
#endif

const void *sdpa__struct_in(const void *src, size_t base, size_t ours, void *local,
                            const char *what)
{
    size_t size;
    memcpy(&size, src, sizeof size); /* the first member of every growing struct */
    if (size == 0) /* cleared or designated without .size: the 0.2.0 layout */
        size = base;
    if (size == ours)
        return grown_field_zero(src, base, ours, what);
    if (size < base || size > ours) {
        sdpa__fail(SDPA_INVALID_ARGUMENT,
                   "%s->size is %zu, expected %zu (this libsdpa's sizeof), 0 (the 0.2.0 layout) or "
                   "a size between: start from the SDPA_*_DEFAULT macro; a larger size means a "
                   "caller built against a newer libsdpa",
                   what, size, ours);
        return NULL;
    }
    memset(local, 0, ours);
    memcpy(local, src, size);
    return grown_field_zero(local, base, ours, what);
}

static sdpa_status check_params(const sdpa_params *p)
{
    if (!isfinite(p->scale))
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "params->scale is not finite, expected a finite number (0 = 1/sqrt(D))");
    if ((unsigned)p->causal > SDPA_CAUSAL_BOTTOM_RIGHT)
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "params->causal is %d, expected SDPA_CAUSAL_NONE, _TOP_LEFT or "
                          "_BOTTOM_RIGHT",
                          (int)p->causal);
    if (p->deterministic != 0 && p->deterministic != 1)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "params->deterministic is %d, expected 0 or 1",
                          p->deterministic);
    return SDPA_OK;
}

static const struct {
    unsigned bit;
    const char *name;
} mask_kinds[] = {{SDPA_MASK_KIND_SEQ_LEN, "seq_len"},
                  {SDPA_MASK_KIND_KEY, "key"},
                  {SDPA_MASK_KIND_GENERAL, "general"},
                  {SDPA_MASK_KIND_WINDOW, "window"},
                  {SDPA_MASK_KIND_BLOCKS, "blocks"}};

void sdpa__mask_kinds_name(unsigned kinds, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof mask_kinds / sizeof *mask_kinds; i++)
        if (kinds & mask_kinds[i].bit && len < n)
            len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? "+" : "",
                                    mask_kinds[i].name);
    if (!buf[0])
        sdpa__strlcpy(buf, "none", n);
}

unsigned sdpa__mask_kind_top(unsigned kinds)
{
    return kinds & SDPA_MASK_KIND_BLOCKS    ? SDPA_MASK_KIND_BLOCKS
           : kinds & SDPA_MASK_KIND_GENERAL ? SDPA_MASK_KIND_GENERAL
           : kinds & SDPA_MASK_KIND_WINDOW  ? SDPA_MASK_KIND_WINDOW
           : kinds & SDPA_MASK_KIND_KEY     ? SDPA_MASK_KIND_KEY
                                            : kinds & SDPA_MASK_KIND_SEQ_LEN;
}

unsigned sdpa__mask_kind_parse(const char *s, int *ok)
{
    *ok = 1;
    if (strcmp(s, "none") == 0)
        return 0;
    for (size_t i = 0; i < sizeof mask_kinds / sizeof *mask_kinds; i++)
        if (strcmp(s, mask_kinds[i].name) == 0)
            return mask_kinds[i].bit;
    *ok = 0;
    return 0;
}

/* The byte extent of a strided view of sizes n[] and strides st[] (elements
 * of es bytes), or -1 when it overflows or a stride is negative. */
static int64_t view_bytes(const int64_t *n, const int64_t *st, int dims, int64_t es)
{
    int64_t last = 0, t;
    for (int i = 0; i < dims; i++) {
        if (st[i] < 0 || __builtin_mul_overflow(n[i] - 1, st[i], &t) ||
            __builtin_add_overflow(last, t, &last))
            return -1;
    }
    return __builtin_add_overflow(last, 1, &t) || __builtin_mul_overflow(t, es, &t) ? -1 : t;
}

/* One list of a block map row: counts within 0..index_stride and
 * kv_blocks, entries ascending without repeats, inside 0..kv_blocks. */
static sdpa_status check_map_list(const sdpa_block_map *m, const int32_t *count,
                                  const int32_t *index, const char *what, int64_t row,
                                  int64_t b, int64_t h, int64_t qb)
{
    const int32_t n = count[row];
    const int64_t cap = m->index_stride < m->kv_blocks ? m->index_stride : m->kv_blocks;
    if (n < 0 || n > cap)
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "mask->blocks->%s_count[b=%lld, h=%lld, qb=%lld] is %d, expected "
                          "0..%lld (index_stride and kv_blocks)",
                          what, (long long)b, (long long)h, (long long)qb, (int)n, (long long)cap);
    const int32_t *idx = index + row * m->index_stride;
    for (int32_t e = 0; e < n; e++) {
        if (idx[e] < 0 || idx[e] >= m->kv_blocks)
            return sdpa__fail(SDPA_INVALID_ARGUMENT,
                              "mask->blocks->%s_index[b=%lld, h=%lld, qb=%lld][%d] is %d, "
                              "expected a key block 0..%lld",
                              what, (long long)b, (long long)h, (long long)qb, (int)e,
                              (int)idx[e], (long long)m->kv_blocks - 1);
        if (e > 0 && idx[e] <= idx[e - 1])
            return sdpa__fail(SDPA_INVALID_ARGUMENT,
                              "mask->blocks->%s_index[b=%lld, h=%lld, qb=%lld][%d] is %d after "
                              "%d, expected ascending key blocks without repeats",
                              what, (long long)b, (long long)h, (long long)qb, (int)e,
                              (int)idx[e], (int)idx[e - 1]);
    }
    return SDPA_OK;
}

/* A block map against the call's sizes (sdpa.h): its shape, then, for
 * host arrays, the lists of query blocks qb0 .. qb1 - 1 (every head and
 * batch entry) and that no key block is in both. Costs one pass over the
 * listed entries of those rows. */
sdpa_status sdpa__check_block_map(const sdpa_block_map *m, int64_t B, int64_t Hq, int64_t Sq,
                                  int64_t Skv, int host, int64_t qb0, int64_t qb1)
{
    const int32_t sizes[2] = {m->block_q, m->block_kv};
    static const char *size_names[2] = {"block_q", "block_kv"};
    for (int i = 0; i < 2; i++)
        if (sizes[i] != 64 && sizes[i] != 128)
            return sdpa__fail(SDPA_INVALID_ARGUMENT,
                              "mask->blocks->%s is %d, expected 64 or 128", size_names[i],
                              (int)sizes[i]);
    if (m->batch != 1 && m->batch != B)
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "mask->blocks->batch is %lld, expected 1 (broadcast) or B = %lld",
                          (long long)m->batch, (long long)B);
    if (m->heads != 1 && m->heads != Hq)
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "mask->blocks->heads is %lld, expected 1 (broadcast) or Hq = %lld",
                          (long long)m->heads, (long long)Hq);
    const int64_t nq = (Sq + m->block_q - 1) / m->block_q, nk = (Skv + m->block_kv - 1) / m->block_kv;
    if (m->q_blocks != nq)
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "mask->blocks->q_blocks is %lld, expected %lld (Sq %lld in blocks of "
                          "%d)",
                          (long long)m->q_blocks, (long long)nq, (long long)Sq, (int)m->block_q);
    if (m->kv_blocks != nk)
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "mask->blocks->kv_blocks is %lld, expected %lld (Skv %lld in blocks "
                          "of %d)",
                          (long long)m->kv_blocks, (long long)nk, (long long)Skv,
                          (int)m->block_kv);
    if (m->index_stride < 1)
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "mask->blocks->index_stride is %lld, expected >= 1 (entries per row)",
                          (long long)m->index_stride);
    if (!m->full_count != !m->full_index || !m->partial_count != !m->partial_index)
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "mask->blocks->%s_count and %s_index must be given together",
                          !m->full_count != !m->full_index ? "full" : "partial",
                          !m->full_count != !m->full_index ? "full" : "partial");
    if (m->partial_bits && !m->partial_count)
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "mask->blocks->partial_bits is given without partial_count");
    if (m->partial_bits && (uintptr_t)m->partial_bits % sizeof(uint64_t) != 0)
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "mask->blocks->partial_bits is not 8-byte aligned");
    int64_t rows;
    if (__builtin_mul_overflow(m->batch * m->heads, m->q_blocks, &rows) ||
        __builtin_mul_overflow(rows, m->index_stride, &rows) ||
        __builtin_mul_overflow(rows, sdpa__map_words(m) * 8, &rows))
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "mask->blocks byte count overflows 64 bits");
    for (int64_t b = 0; host && b < m->batch; b++)
        for (int64_t h = 0; h < m->heads; h++)
            for (int64_t qb = qb0; qb < qb1 && qb < m->q_blocks; qb++) {
                const int64_t row = sdpa__map_row(m, b, h, qb);
                sdpa_status st;
                if (m->full_count && (st = check_map_list(m, m->full_count, m->full_index,
                                                          "full", row, b, h, qb)) != SDPA_OK)
                    return st;
                if (m->partial_count &&
                    (st = check_map_list(m, m->partial_count, m->partial_index, "partial", row,
                                         b, h, qb)) != SDPA_OK)
                    return st;
                if (!m->full_count || !m->partial_count)
                    continue;
                const int32_t *f = m->full_index + row * m->index_stride,
                              *p = m->partial_index + row * m->index_stride;
                for (int32_t x = 0, y = 0; x < m->full_count[row] && y < m->partial_count[row];) {
                    if (f[x] == p[y])
                        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                                          "mask->blocks: key block %d of row [b=%lld, h=%lld, "
                                          "qb=%lld] is both full and partial, expected one list",
                                          (int)f[x], (long long)b, (long long)h, (long long)qb);
                    if (f[x] < p[y])
                        x++;
                    else
                        y++;
                }
            }
    return SDPA_OK;
}

/* Validates a mask against the call's sizes; fills the kinds it carries. */
static sdpa_status check_mask(const sdpa_mask *m, const sdpa_tensor *q, const sdpa_tensor *k,
                              unsigned *kinds)
{
    *kinds = 0;
    if (!m)
        return SDPA_OK;
    const int64_t B = q->size[0], Sq = q->size[1], Hq = q->size[2], Skv = k->size[1];
    const int host = q->device.kind == SDPA_DEVICE_CPU;
    const int32_t *lens[2] = {m->seq_len_q, m->seq_len_kv};
    const int64_t limit[2] = {Sq, Skv};
    static const char *len_names[2] = {"mask->seq_len_q", "mask->seq_len_kv"};
    for (int i = 0; i < 2; i++) {
        if (!lens[i])
            continue;
        *kinds |= SDPA_MASK_KIND_SEQ_LEN;
        if ((uintptr_t)lens[i] % sizeof(int32_t) != 0)
            return sdpa__fail(SDPA_INVALID_ARGUMENT, "%s is not 4-byte aligned", len_names[i]);
        for (int64_t b = 0; host && b < B; b++) /* device arrays: the backend's to read */
            if (lens[i][b] < 0 || lens[i][b] > limit[i])
                return sdpa__fail(SDPA_INVALID_ARGUMENT, "%s[%lld] is %d, expected 0..%lld (%s)",
                                  len_names[i], (long long)b, (int)lens[i][b],
                                  (long long)limit[i], i ? "Skv" : "Sq");
    }
    if (m->key) {
        *kinds |= SDPA_MASK_KIND_KEY;
        const int64_t n[2] = {B, Skv};
        if (view_bytes(n, m->key_stride, 2, 1) < 0)
            return sdpa__fail(SDPA_INVALID_ARGUMENT,
                              "mask->key_stride is {%lld, %lld}, expected strides >= 0 (in "
                              "bytes, 0 broadcasts) whose extent fits in 64 bits",
                              (long long)m->key_stride[0], (long long)m->key_stride[1]);
    }
    if (m->general) {
        *kinds |= SDPA_MASK_KIND_GENERAL;
        if (m->general_type != SDPA_MASK_BOOL && m->general_type != SDPA_MASK_ADDITIVE)
            return sdpa__fail(SDPA_INVALID_ARGUMENT,
                              "mask->general_type is %d, expected SDPA_MASK_BOOL or "
                              "SDPA_MASK_ADDITIVE",
                              (int)m->general_type);
        size_t es = 1;
        if (m->general_type == SDPA_MASK_ADDITIVE) {
            if (m->general_dtype != SDPA_F32 && m->general_dtype != q->dtype)
                return sdpa__fail(SDPA_INVALID_ARGUMENT,
                                  "mask->general_dtype is %s, expected f32 or the inputs' dtype "
                                  "%s",
                                  sdpa_dtype_name(m->general_dtype), sdpa_dtype_name(q->dtype));
            es = sdpa_dtype_size(m->general_dtype);
            if ((uintptr_t)m->general % es != 0)
                return sdpa__fail(SDPA_INVALID_ARGUMENT,
                                  "mask->general is not aligned to its %zu-byte elements", es);
        }
        const int64_t n[4] = {B, Hq, Sq, Skv};
        if (view_bytes(n, m->general_stride, 4, (int64_t)es) < 0)
            return sdpa__fail(SDPA_INVALID_ARGUMENT,
                              "mask->general_stride is {%lld, %lld, %lld, %lld}, expected "
                              "strides >= 0 (in elements, 0 broadcasts) whose extent fits in "
                              "64 bits",
                              (long long)m->general_stride[0], (long long)m->general_stride[1],
                              (long long)m->general_stride[2], (long long)m->general_stride[3]);
    }
    if (m->window) {
        *kinds |= SDPA_MASK_KIND_WINDOW;
        if (m->window->left < -1 || m->window->right < -1)
            return sdpa__fail(SDPA_INVALID_ARGUMENT,
                              "mask->window is {left %lld, right %lld}, expected keys >= 0 on "
                              "each side, or -1 for unbounded",
                              (long long)m->window->left, (long long)m->window->right);
    }
    if (m->blocks) {
        *kinds |= SDPA_MASK_KIND_BLOCKS;
        sdpa_status st = sdpa__check_block_map(m->blocks, B, Hq, Sq, Skv, host, 0, INT64_MAX);
        if (st != SDPA_OK)
            return st;
    }
    return SDPA_OK;
}

sdpa_status sdpa__call_prepare(const sdpa_tensor *q, const sdpa_tensor *k,
                               const sdpa_tensor *v, sdpa_tensor *out, float *lse,
                               const sdpa_params *params, sdpa_call *call)
{
    static const sdpa_params defaults = SDPA_PARAMS_DEFAULT;
    sdpa_params grown;
    if (!params)
        params = &defaults;
    else if (!(params = sdpa__struct_in(params, SDPA_BASE_PARAMS, sizeof grown, &grown, "params")))
        return SDPA_INVALID_ARGUMENT;
    int64_t span[4];
    const sdpa_tensor *t[4] = {q, k, v, out};
    static const char *names[4] = {"q", "k", "v", "out"};
    sdpa_status st;
    for (int i = 0; i < 4; i++)
        if ((st = sdpa__check_tensor(t[i], names[i], i == 3, &span[i])) != SDPA_OK)
            return st;
    if ((st = check_params(params)) != SDPA_OK)
        return st;

    for (int i = 1; i < 4; i++) {
        if (t[i]->size[0] != q->size[0])
            return sdpa__fail(SDPA_INVALID_ARGUMENT,
                              "%s->size[0] (B) is %lld, expected %lld as in q", names[i],
                              (long long)t[i]->size[0], (long long)q->size[0]);
        if (t[i]->size[3] != q->size[3])
            return sdpa__fail(SDPA_INVALID_ARGUMENT,
                              "%s->size[3] (D) is %lld, expected %lld as in q", names[i],
                              (long long)t[i]->size[3], (long long)q->size[3]);
        if (t[i]->device.kind != q->device.kind || t[i]->device.ordinal != q->device.ordinal)
            return sdpa__fail(SDPA_INVALID_ARGUMENT,
                              "%s is on device %d:%d, expected q's device %d:%d", names[i],
                              (int)t[i]->device.kind, t[i]->device.ordinal, (int)q->device.kind,
                              q->device.ordinal);
    }
    if (v->size[1] != k->size[1])
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "v->size[1] (Skv) is %lld, expected %lld as in k",
                          (long long)v->size[1], (long long)k->size[1]);
    if (v->size[2] != k->size[2])
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "v->size[2] (Hkv) is %lld, expected %lld as in k",
                          (long long)v->size[2], (long long)k->size[2]);
    if (out->size[1] != q->size[1] || out->size[2] != q->size[2])
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "out sizes are [%lld, %lld, %lld, %lld], expected q's [%lld, %lld, "
                          "%lld, %lld]",
                          (long long)out->size[0], (long long)out->size[1],
                          (long long)out->size[2], (long long)out->size[3],
                          (long long)q->size[0], (long long)q->size[1], (long long)q->size[2],
                          (long long)q->size[3]);
    if (q->size[2] % k->size[2] != 0)
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "Hq %% Hkv must be 0 (grouped-query), got Hq = %lld (q->size[2]) and "
                          "Hkv = %lld (k->size[2])",
                          (long long)q->size[2], (long long)k->size[2]);
    /* q may differ from k and v (f32 queries over an f16 cache); k and v
     * are read by one packing loop, so they agree */
    if (v->dtype != k->dtype)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "v->dtype is %s, expected k's dtype %s",
                          sdpa_dtype_name(v->dtype), sdpa_dtype_name(k->dtype));
    for (int i = 0; i < 3; i++)
        if (sdpa__overlaps(out->data, span[3], t[i]->data, span[i]))
            return sdpa__fail(SDPA_INVALID_ARGUMENT,
                              "out overlaps %s in memory, expected separate buffers", names[i]);
    if (lse) {
        int64_t n, bytes;
        if (__builtin_mul_overflow(q->size[0], q->size[2], &n) ||
            __builtin_mul_overflow(n, q->size[1], &n) ||
            __builtin_mul_overflow(n, (int64_t)sizeof(float), &bytes))
            return sdpa__fail(SDPA_INVALID_ARGUMENT, "lse byte count overflows 64 bits");
        if ((uintptr_t)lse % sizeof(float) != 0)
            return sdpa__fail(SDPA_INVALID_ARGUMENT, "lse is not 4-byte aligned");
        for (int i = 0; i < 4; i++)
            if (sdpa__overlaps(lse, bytes, t[i]->data, span[i]))
                return sdpa__fail(SDPA_INVALID_ARGUMENT,
                                  "lse overlaps %s in memory, expected a separate buffer",
                                  names[i]);
    }
    for (int i = 0; i < 4; i++) /* a mask, not %: a 64-bit division per tensor was a fifth of
                                  * a one-token call's validation */
        if ((uintptr_t)t[i]->data & (sdpa_dtype_size(t[i]->dtype) - 1))
            return sdpa__fail(SDPA_INVALID_ARGUMENT,
                              "%s->data is not aligned to its %zu-byte elements", names[i],
                              sdpa_dtype_size(t[i]->dtype));

    unsigned kinds;
    const sdpa_mask *mask = params->mask;
    if (mask && !(mask = sdpa__struct_in(mask, SDPA_BASE_MASK, sizeof call->mask_grown,
                                         &call->mask_grown, "params->mask")))
        return SDPA_INVALID_ARGUMENT;
    if ((st = check_mask(mask, q, k, &kinds)) != SDPA_OK)
        return st;

    /* every field set, no memset: a rep stos of the whole struct was 3% of a one-token call */
    call->pool = NULL, call->cpu_features = 0, call->cuda_flash_variant = 0;
    call->dout = NULL, call->dlse = NULL, call->dq = call->dk = call->dv = NULL;
    call->q = q, call->k = k, call->v = v, call->out = out, call->lse = lse;
    call->mask = kinds ? mask : NULL;
    call->scale = params->scale != 0.0 ? params->scale : 1.0 / sqrt((double)q->size[3]);
    call->causal = params->causal;
    call->deterministic = params->deterministic;
    call->stream = params->stream;
    sdpa_call_desc *d = &call->desc;
    d->device = q->device.kind;
    d->dtype = q->dtype;
    d->kv_dtype = k->dtype != q->dtype ? SDPA_KV_DTYPE(k->dtype) : 0;
    d->shares = 0, call->share = 0;
    d->B = q->size[0], d->Sq = q->size[1], d->Skv = k->size[1];
    d->Hq = q->size[2], d->Hkv = k->size[2], d->D = q->size[3];
    d->causal = params->causal;
    d->want_lse = lse != NULL;
    d->deterministic = params->deterministic;
    d->backend = params->backend;
    d->component = params->component;
    d->quant = params->quant;
    d->mask = kinds;
    d->backward = 0;
    return SDPA_OK;
}

sdpa_status sdpa__call_prepare_backward(const sdpa_tensor *q, const sdpa_tensor *k,
                                        const sdpa_tensor *v, const sdpa_tensor *out,
                                        const float *lse, const sdpa_tensor *dout,
                                        const float *dlse, sdpa_tensor *dq, sdpa_tensor *dk,
                                        sdpa_tensor *dv, const sdpa_params *params,
                                        sdpa_call *call)
{
    if (!lse)
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "lse is NULL, expected the forward's log-sum-exp [B, Hq, Sq] float32");
    /* The forward's checks; out is read here, but the forward wrote it, so
     * it is a valid output view, separate from q, k, v and lse. */
    sdpa_status st = sdpa__call_prepare(q, k, v, (sdpa_tensor *)out, (float *)lse, params, call);
    if (st != SDPA_OK)
        return st;
    const sdpa_tensor *in[5] = {q, k, v, out, dout};
    static const char *in_names[5] = {"q", "k", "v", "out", "dout"};
    sdpa_tensor *grad[3] = {dq, dk, dv};
    static const char *grad_names[3] = {"dq", "dk", "dv"};
    const sdpa_tensor *like[3] = {q, k, k}; /* the sizes each gradient has */
    int64_t in_span[5], grad_span[3];
    for (int i = 0; i < 4; i++) /* checked above; their extents again */
        if ((st = sdpa__check_tensor(in[i], in_names[i], i == 3, &in_span[i])) != SDPA_OK)
            return st;
    if ((st = sdpa__check_tensor(dout, "dout", 0, &in_span[4])) != SDPA_OK)
        return st;
    for (int i = 0; i < 3; i++)
        if ((st = sdpa__check_tensor(grad[i], grad_names[i], 1, &grad_span[i])) != SDPA_OK)
            return st;
    for (int i = 0; i < 4; i++) {
        const sdpa_tensor *t = i == 0 ? dout : grad[i - 1];
        const sdpa_tensor *ref = i == 0 ? q : like[i - 1];
        const char *name = i == 0 ? "dout" : grad_names[i - 1];
        for (int d = 0; d < 4; d++)
            if (t->size[d] != ref->size[d])
                return sdpa__fail(SDPA_INVALID_ARGUMENT,
                                  "%s sizes are [%lld, %lld, %lld, %lld], expected %s's [%lld, "
                                  "%lld, %lld, %lld]",
                                  name, (long long)t->size[0], (long long)t->size[1],
                                  (long long)t->size[2], (long long)t->size[3],
                                  ref == q ? "q" : "k", (long long)ref->size[0],
                                  (long long)ref->size[1], (long long)ref->size[2],
                                  (long long)ref->size[3]);
        if (t->device.kind != q->device.kind || t->device.ordinal != q->device.ordinal)
            return sdpa__fail(SDPA_INVALID_ARGUMENT,
                              "%s is on device %d:%d, expected q's device %d:%d", name,
                              (int)t->device.kind, t->device.ordinal, (int)q->device.kind,
                              q->device.ordinal);
        if ((uintptr_t)t->data & (sdpa_dtype_size(t->dtype) - 1))
            return sdpa__fail(SDPA_INVALID_ARGUMENT,
                              "%s->data is not aligned to its %zu-byte elements", name,
                              sdpa_dtype_size(t->dtype));
    }
    const int64_t lse_bytes = q->size[0] * q->size[2] * q->size[1] * (int64_t)sizeof(float);
    for (int g = 0; g < 3; g++) {
        for (int i = 0; i < 5; i++)
            if (sdpa__overlaps(grad[g]->data, grad_span[g], in[i]->data, in_span[i]))
                return sdpa__fail(SDPA_INVALID_ARGUMENT,
                                  "%s overlaps %s in memory, expected separate buffers",
                                  grad_names[g], in_names[i]);
        for (int l = 0; l < 2; l++)
            if (sdpa__overlaps(grad[g]->data, grad_span[g], l ? (const void *)dlse : lse,
                               l && !dlse ? 0 : lse_bytes))
                return sdpa__fail(SDPA_INVALID_ARGUMENT,
                                  "%s overlaps %s in memory, expected separate buffers",
                                  grad_names[g], l ? "dlse" : "lse");
        for (int h = 0; h < g; h++)
            if (sdpa__overlaps(grad[g]->data, grad_span[g], grad[h]->data, grad_span[h]))
                return sdpa__fail(SDPA_INVALID_ARGUMENT,
                                  "%s overlaps %s in memory, expected separate buffers",
                                  grad_names[g], grad_names[h]);
    }
    if (dlse && (uintptr_t)dlse % sizeof(float) != 0)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "dlse is not 4-byte aligned");
    call->dout = dout, call->dlse = dlse, call->dq = dq, call->dk = dk, call->dv = dv;
    call->desc.backward = 1;
    return SDPA_OK;
}

sdpa_status sdpa__desc_validate(const sdpa_call_desc *d)
{
    if (!d)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "desc is NULL, expected a call description");
    if (d->device != SDPA_DEVICE_CPU && d->device != SDPA_DEVICE_CUDA)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "desc->device is %d, expected CPU or CUDA",
                          (int)d->device);
    if ((unsigned)d->dtype >= SDPA_DTYPE_COUNT)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "desc->dtype is %d, expected f32, f16 or bf16",
                          (int)d->dtype);
    if (d->kv_dtype < 0 || d->kv_dtype > SDPA_DTYPE_COUNT)
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "desc->kv_dtype is %d, expected 0 (k and v as q) or SDPA_KV_DTYPE(t)",
                          d->kv_dtype);
    if (d->shares < 0)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "desc->shares is %d, expected 0 (a whole call) "
                          "or the count of shares", d->shares);
    const int64_t sz[6] = {d->B, d->Sq, d->Skv, d->Hq, d->Hkv, d->D};
    static const char *nm[6] = {"B", "Sq", "Skv", "Hq", "Hkv", "D"};
    for (int i = 0; i < 6; i++)
        if (sz[i] < 1)
            return sdpa__fail(SDPA_INVALID_ARGUMENT, "desc->%s is %lld, expected >= 1", nm[i],
                              (long long)sz[i]);
    if (d->Hq % d->Hkv != 0)
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "Hq %% Hkv must be 0 (grouped-query), got Hq = %lld and Hkv = %lld",
                          (long long)d->Hq, (long long)d->Hkv);
    if ((unsigned)d->causal > SDPA_CAUSAL_BOTTOM_RIGHT)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "desc->causal is %d, expected 0, 1 or 2",
                          (int)d->causal);
    if (d->backward != 0 && d->backward != 1)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "desc->backward is %d, expected 0 or 1",
                          d->backward);
    if (d->mask & ~(unsigned)(SDPA_MASK_KIND_SEQ_LEN | SDPA_MASK_KIND_KEY | SDPA_MASK_KIND_GENERAL |
                              SDPA_MASK_KIND_WINDOW | SDPA_MASK_KIND_BLOCKS))
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "desc->mask is 0x%x, expected SDPA_MASK_KIND_* bits", d->mask);
    return SDPA_OK;
}
