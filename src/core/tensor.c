/*
 * tensor.c - the names of dtypes and causal modes, tensor views, dtype
 * conversion, and the struct sizes bindings check their mirrors against.
 * The validation of a call is validate.c.
 */
#include "core.h"
#include "convert.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

const char *sdpa_dtype_name(sdpa_dtype dtype)
{
    switch (dtype) {
    case SDPA_F32: return "f32";
    case SDPA_F16: return "f16";
    case SDPA_BF16: return "bf16";
    }
    return "?";
}

size_t sdpa_dtype_size(sdpa_dtype dtype)
{
    switch (dtype) {
    case SDPA_F32: return 4;
    case SDPA_F16: return 2;
    case SDPA_BF16: return 2;
    }
    return 0;
}

const char *sdpa_causal_name(sdpa_causal c)
{
    switch (c) {
    case SDPA_CAUSAL_NONE: return "none";
    case SDPA_CAUSAL_TOP_LEFT: return "top-left";
    case SDPA_CAUSAL_BOTTOM_RIGHT: return "bottom-right";
    }
    return "?";
}

static sdpa_tensor make(void *data, sdpa_dtype dtype, int64_t B, int64_t S, int64_t H,
                        int64_t D, int bhsd)
{
    sdpa_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    t.device.kind = SDPA_DEVICE_CPU;
    t.size[0] = B, t.size[1] = S, t.size[2] = H, t.size[3] = D;
    /* Overflowing sizes produce garbage strides here; validation rejects
     * them later through the overflow-checked span computation. */
    uint64_t uS = (uint64_t)S, uH = (uint64_t)H, uD = (uint64_t)D;
    if (bhsd) {
        t.stride[0] = (int64_t)(uH * uS * uD), t.stride[1] = D;
        t.stride[2] = (int64_t)(uS * uD), t.stride[3] = 1;
    } else {
        t.stride[0] = (int64_t)(uS * uH * uD), t.stride[1] = (int64_t)(uH * uD);
        t.stride[2] = D, t.stride[3] = 1;
    }
    return t;
}

sdpa_tensor sdpa_tensor_bshd(void *data, sdpa_dtype dtype, int64_t B, int64_t S, int64_t H,
                             int64_t D)
{
    return make(data, dtype, B, S, H, D, 0);
}

sdpa_tensor sdpa_tensor_bhsd(void *data, sdpa_dtype dtype, int64_t B, int64_t S, int64_t H,
                             int64_t D)
{
    return make(data, dtype, B, S, H, D, 1);
}

sdpa_status sdpa_tensor_from_bytes(void *data, sdpa_dtype dtype, const int64_t ne[4],
                                   const size_t nb[4], const char *order, sdpa_tensor *out)
{
    if (!out)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "out is NULL, expected a tensor to fill");
    if (!ne || !nb)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "%s is NULL, expected 4 values",
                          ne ? "nb" : "ne");
    const size_t es = sdpa_dtype_size(dtype);
    if (!es)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "dtype is %d, expected SDPA_F32, SDPA_F16 or "
                          "SDPA_BF16", (int)dtype);
    /* order names the axes innermost first, a permutation of d, s, h, b */
    static const char axes[4] = {'b', 's', 'h', 'd'}; /* sdpa_tensor's positions */
    int pos[4], seen = 0;
    for (int i = 0; i < 4; i++) {
        const char *hit = order && order[i] ? memchr(axes, order[i], 4) : NULL;
        if (!hit || (seen & (1 << (hit - axes))))
            return sdpa__fail(SDPA_INVALID_ARGUMENT,
                              "order is \"%s\", expected the axes innermost first, each of d, s, "
                              "h, b once (ggml's q, k, v: \"dshb\"; its attention result: "
                              "\"dhsb\")",
                              order ? order : "(null)");
        pos[i] = (int)(hit - axes), seen |= 1 << pos[i];
    }
    if (order[4])
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "order is \"%s\", expected 4 letters", order);
    sdpa_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data, t.dtype = dtype, t.device.kind = SDPA_DEVICE_CPU;
    for (int i = 0; i < 4; i++) {
        if (ne[i] < 1)
            return sdpa__fail(SDPA_INVALID_ARGUMENT, "ne[%d] is %lld, expected >= 1", i,
                              (long long)ne[i]);
        if (nb[i] % es != 0 || nb[i] > (size_t)INT64_MAX)
            return sdpa__fail(SDPA_INVALID_ARGUMENT,
                              "nb[%d] is %zu bytes, expected a multiple of the %zu-byte "
                              "elements",
                              i, nb[i], es);
        t.size[pos[i]] = ne[i];
        t.stride[pos[i]] = (int64_t)(nb[i] / es);
    }
    *out = t;
    return SDPA_OK;
}

sdpa_status sdpa_convert(const void *src, sdpa_dtype src_dtype, void *dst, sdpa_dtype dst_dtype,
                         size_t n)
{
    if (!sdpa_dtype_size(src_dtype) || !sdpa_dtype_size(dst_dtype))
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "%s is not a dtype, expected f32, f16 or bf16",
                          sdpa_dtype_size(src_dtype) ? "dst_dtype" : "src_dtype");
    if (n && (!src || !dst))
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "%s is NULL", src ? "dst" : "src");
    /* Forward order, one element read before it is written: in place is
     * safe whenever dst's elements are no wider than src's. */
    for (size_t i = 0; i < n; i++)
        sdpa__store_f32(dst, dst_dtype, (int64_t)i, sdpa__load_f32(src, src_dtype, (int64_t)i));
    sdpa__clear_error();
    return SDPA_OK;
}

size_t sdpa_struct_size(const char *name)
{
    static const struct {
        const char *name;
        size_t size;
    } sizes[] = {{"sdpa_tensor", sizeof(sdpa_tensor)},
                 {"sdpa_params", sizeof(sdpa_params)},
                 {"sdpa_mask", sizeof(sdpa_mask)},
                 {"sdpa_window", sizeof(sdpa_window)},
                 {"sdpa_block_map", sizeof(sdpa_block_map)},
                 {"sdpa_neighborhood_3d", sizeof(sdpa_neighborhood_3d)},
                 {"sdpa_call_desc", sizeof(sdpa_call_desc)},
                 {"sdpa_layer_desc", sizeof(sdpa_layer_desc)},
                 {"sdpa_context_options", sizeof(sdpa_context_options)}};
    for (size_t i = 0; name && i < sizeof sizes / sizeof *sizes; i++)
        if (strcmp(name, sizes[i].name) == 0)
            return sizes[i].size;
    return 0;
}
