/*
 * guard.c - the finite-output guard's scans (sdpa_context_set_finite_guard).
 *
 * A call whose output holds NaN or Inf although q, k and v are finite is
 * a kernel gone wrong (fp16 accumulation, a bug at one size): the
 * dispatcher runs it again on the next candidate. The output is scanned
 * on every guarded call (one read of B x Sq x Hq x D elements, by their
 * bits: no float compare, no conversion); the inputs only when the output
 * is bad. LSE -inf is a row that sees no key, not an error.
 */
#include "guard.h"
#include "context.h"
#include "../core/strbuf.h"

#include <string.h>

/* Non-finite: the exponent all ones, per dtype. */
static int row_bad(const void *p, sdpa_dtype t, int64_t stride, int64_t n)
{
    if (t == SDPA_F32) {
        const uint32_t *u = p;
        uint32_t acc = 0;
        if (stride == 1) { /* branch-free, so the compiler vectorises it */
            for (int64_t i = 0; i < n; i++)
                acc |= (uint32_t)((u[i] & 0x7f800000u) == 0x7f800000u);
        } else {
            for (int64_t i = 0; i < n; i++)
                acc |= (uint32_t)((u[i * stride] & 0x7f800000u) == 0x7f800000u);
        }
        return acc != 0;
    }
    const uint16_t *h = p;
    const uint16_t mask = t == SDPA_F16 ? 0x7c00u : 0x7f80u;
    unsigned acc = 0;
    for (int64_t i = 0; i < n; i++)
        acc |= (unsigned)((h[i * stride] & mask) == mask);
    return acc != 0;
}

static int tensor_bad(const sdpa_tensor *t)
{
    const size_t es = sdpa_dtype_size(t->dtype);
    for (int64_t b = 0; b < t->size[0]; b++)
        for (int64_t s = 0; s < t->size[1]; s++)
            for (int64_t h = 0; h < t->size[2]; h++) {
                const char *row = (const char *)t->data + sdpa__offset(t, b, s, h, 0) * (int64_t)es;
                if (row_bad(row, t->dtype, t->stride[3], t->size[3]))
                    return 1;
            }
    return 0;
}

int sdpa__guard_output_bad(const sdpa_call *c)
{
    if (tensor_bad(c->out))
        return 1;
    if (c->lse) {
        const int64_t n = c->desc.B * c->desc.Hq * c->desc.Sq;
        for (int64_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &c->lse[i], sizeof u);
            if ((u & 0x7f800000u) == 0x7f800000u && u != 0xff800000u) /* NaN, +inf */
                return 1;
        }
    }
    return 0;
}

int sdpa__guard_inputs_finite(const sdpa_call *c)
{
    return !tensor_bad(c->q) && !tensor_bad(c->k) && !tensor_bad(c->v);
}

sdpa_status sdpa_context_set_finite_guard(sdpa_context *ctx, int on)
{
    if (!ctx)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "ctx is NULL, expected a context");
    if (on != 0 && on != 1)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "on is %d, expected 1 (on) or 0 (off)", on);
    atomic_store(&ctx->finite_guard, on);
    return SDPA_OK;
}

int64_t sdpa_context_guard_events(const sdpa_context *ctx)
{
    return ctx ? atomic_load(&((sdpa_context *)ctx)->guard_events) : 0;
}

/* The finite guard's line (info and explain). */
void sdpa__guard_text(sdpa_strbuf *sb, const sdpa_context *ctx, int width)
{
    const int64_t n = sdpa_context_guard_events(ctx);
    sdpa__sb_printf(sb, "%-*s%s, %lld event%s%s\n", width, "guard",
                    atomic_load(&ctx->finite_guard) ? "on (finite outputs)" : "off",
                    (long long)n, n == 1 ? "" : "s",
                    atomic_load(&ctx->finite_guard) ? ""
                                                    : " (SDPA_FINITE_GUARD=1 or "
                                                      "sdpa_context_set_finite_guard)");
}
