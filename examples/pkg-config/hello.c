/*
 * hello.c - the smallest libsdpa program, built with pkg-config:
 *   cc hello.c $(pkg-config --cflags --libs libsdpa) -o hello
 * (PKG_CONFIG_PATH=PREFIX/lib/pkgconfig for an install outside /usr.)
 */
#include <sdpa.h>
#include <stdio.h>

int main(void)
{
    float q[8] = {1, 0, 0, 0, 0, 1, 0, 0}, k[8] = {1, 0, 0, 0, 0, 1, 0, 0};
    float v[8] = {1, 2, 3, 4, 5, 6, 7, 8}, o[8];
    sdpa_tensor tq = sdpa_tensor_bshd(q, SDPA_F32, 1, 2, 1, 4);
    sdpa_tensor tk = sdpa_tensor_bshd(k, SDPA_F32, 1, 2, 1, 4);
    sdpa_tensor tv = sdpa_tensor_bshd(v, SDPA_F32, 1, 2, 1, 4);
    sdpa_tensor to = sdpa_tensor_bshd(o, SDPA_F32, 1, 2, 1, 4);
    sdpa_context *ctx;
    sdpa_params p = SDPA_PARAMS_DEFAULT;
    p.causal = SDPA_CAUSAL_TOP_LEFT; /* row 0 sees only key 0: o[0..3] = v[0..3] */
    if (sdpa_context_create(NULL, &ctx) != SDPA_OK ||
        sdpa_forward(ctx, &tq, &tk, &tv, &to, NULL, &p) != SDPA_OK)
        return fprintf(stderr, "%s\n", sdpa_last_error()), 1;
    printf("libsdpa %s on %s: row 0 = %g %g %g %g\n", sdpa_version(), sdpa_last_backend(), o[0],
           o[1], o[2], o[3]);
    sdpa_context_destroy(ctx);
    return o[0] == 1 && o[1] == 2 && o[2] == 3 && o[3] == 4 ? 0 : 1;
}
