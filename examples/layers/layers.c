/*
 * layers.c - a model's attention layers as libsdpa sees them: one layer
 * handle per attention module (its decision is cached per shape, and a
 * backend that refuses a shape is latched off for it), a scoped override
 * around part of the model, and `explain` for the decision behind a call.
 */
#include <sdpa.h>
#include <stdio.h>
#include <stdlib.h>

enum { S = 256, H = 4, D = 64, LAYERS = 4 };

int main(void)
{
    static float q[S * H * D], k[S * H * D], v[S * H * D], o[S * H * D];
    for (int i = 0; i < S * H * D; i++)
        q[i] = (float)(i % 17) / 17.0f - 0.5f, k[i] = (float)(i % 13) / 13.0f - 0.5f,
        v[i] = (float)(i % 11) / 11.0f - 0.5f;
    sdpa_tensor tq = sdpa_tensor_bshd(q, SDPA_F32, 1, S, H, D);
    sdpa_tensor tk = sdpa_tensor_bshd(k, SDPA_F32, 1, S, H, D);
    sdpa_tensor tv = sdpa_tensor_bshd(v, SDPA_F32, 1, S, H, D);
    sdpa_tensor to = sdpa_tensor_bshd(o, SDPA_F32, 1, S, H, D);

    sdpa_context *ctx;
    if (sdpa_context_create(NULL, &ctx) != SDPA_OK)
        return fprintf(stderr, "%s\n", sdpa_last_error()), 1;
    sdpa_layer *layers[LAYERS];
    char names[LAYERS][32];
    for (int i = 0; i < LAYERS; i++) {
        snprintf(names[i], sizeof names[i], "blocks.%d.attn1", i);
        sdpa_layer_desc d = SDPA_LAYER_DESC_DEFAULT;
        d.name = names[i], d.component = "transformer";
        /* The last block is built under a scoped override: it keeps it. */
        if (i == LAYERS - 1)
            sdpa_override_push("cpu.portable");
        sdpa_status st = sdpa_layer_create(ctx, &d, &layers[i]);
        if (i == LAYERS - 1)
            sdpa_override_pop();
        if (st != SDPA_OK)
            return fprintf(stderr, "%s\n", sdpa_last_error()), 1;
    }
    for (int i = 0; i < LAYERS; i++) {
        if (sdpa_layer_forward(layers[i], &tq, &tk, &tv, &to, NULL, NULL) != SDPA_OK)
            return fprintf(stderr, "%s\n", sdpa_last_error()), 1;
        printf("%s ran on %s\n", names[i], sdpa_last_backend());
    }
    /* A call-time override: this thread's calls, for now, on the reference. */
    sdpa_override_push("ref");
    sdpa_layer_forward(layers[0], &tq, &tk, &tv, &to, NULL, NULL);
    printf("%s inside sdpa_override_push(\"ref\") ran on %s\n", names[0], sdpa_last_backend());
    sdpa_override_pop();

    /* designated, with .size (what the library reads it as): sdpa_call_desc grows
     * by addition, unnamed fields are 0 */
    sdpa_call_desc call = {.size = sizeof(sdpa_call_desc),
                           .device = SDPA_DEVICE_CPU, .dtype = SDPA_F32, .B = 1, .Sq = S,
                           .Skv = S, .Hq = H, .Hkv = H, .D = D, .component = "transformer"};
    char *why;
    if (sdpa_explain(ctx, &call, 0, &why) != SDPA_OK)
        return fprintf(stderr, "%s\n", sdpa_last_error()), 1;
    printf("\n%s", why);
    sdpa_free(why);
    for (int i = 0; i < LAYERS; i++)
        sdpa_layer_destroy(layers[i]);
    sdpa_context_destroy(ctx);
    return 0;
}
