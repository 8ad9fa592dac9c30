/*
 * packed_qkv.c - one attention call on a fused QKV projection's output,
 * [B, S, 3, H, D] in one buffer, as many transformers produce it: q, k
 * and v are views into it through strides, with no copy. The result is
 * checked against the same call on q, k and v copied out contiguously.
 */
#include <math.h>
#include <sdpa.h>
#include <stdio.h>
#include <stdlib.h>

enum { B = 2, S = 77, H = 4, D = 64 };

int main(void)
{
    float *qkv = malloc(sizeof(float) * B * S * 3 * H * D);
    float *sep = malloc(sizeof(float) * 3 * B * S * H * D);
    float *o1 = malloc(sizeof(float) * B * S * H * D), *o2 = malloc(sizeof(float) * B * S * H * D);
    if (!qkv || !sep || !o1 || !o2)
        return 1;
    unsigned x = 12345;
    for (int i = 0; i < B * S * 3 * H * D; i++) {
        x = x * 1664525u + 1013904223u;
        qkv[i] = (float)(x >> 8) / (float)(1u << 24) * 2.0f - 1.0f;
    }
    /* The views: element (b, s, h, d) of q is qkv[b][s][0][h][d]. */
    sdpa_tensor q = sdpa_tensor_bshd(qkv, SDPA_F32, B, S, H, D);
    q.stride[0] = (int64_t)S * 3 * H * D, q.stride[1] = 3 * H * D, q.stride[2] = D;
    sdpa_tensor k = q, v = q;
    k.data = qkv + H * D, v.data = qkv + 2 * H * D;
    /* The same tensors, copied out contiguously, for the check. */
    for (int b = 0; b < B; b++)
        for (int s = 0; s < S; s++)
            for (int t = 0; t < 3; t++)
                for (int i = 0; i < H * D; i++)
                    sep[(((size_t)t * B + b) * S + s) * H * D + i] =
                        qkv[(((size_t)b * S + s) * 3 + t) * H * D + i];
    sdpa_tensor qc = sdpa_tensor_bshd(sep, SDPA_F32, B, S, H, D);
    sdpa_tensor kc = sdpa_tensor_bshd(sep + B * S * H * D, SDPA_F32, B, S, H, D);
    sdpa_tensor vc = sdpa_tensor_bshd(sep + 2 * B * S * H * D, SDPA_F32, B, S, H, D);
    sdpa_tensor out1 = sdpa_tensor_bshd(o1, SDPA_F32, B, S, H, D);
    sdpa_tensor out2 = sdpa_tensor_bshd(o2, SDPA_F32, B, S, H, D);

    sdpa_context *ctx;
    if (sdpa_context_create(NULL, &ctx) != SDPA_OK) {
        fprintf(stderr, "context: %s\n", sdpa_last_error());
        return 1;
    }
    sdpa_params p = SDPA_PARAMS_DEFAULT;
    p.causal = SDPA_CAUSAL_TOP_LEFT;
    if (sdpa_forward(ctx, &q, &k, &v, &out1, NULL, &p) != SDPA_OK ||
        sdpa_forward(ctx, &qc, &kc, &vc, &out2, NULL, &p) != SDPA_OK) {
        fprintf(stderr, "forward: %s\n", sdpa_last_error());
        return 1;
    }
    double worst = 0;
    for (int i = 0; i < B * S * H * D; i++)
        worst = fmax(worst, fabs((double)o1[i] - o2[i]));
    printf("packed QKV through strides on %s: max |difference| from the copied tensors %.3g\n",
           sdpa_last_backend(), worst);
    sdpa_context_destroy(ctx);
    free(qkv), free(sep), free(o1), free(o2);
    return worst <= 1e-6 ? 0 : 1;
}
