/*
 * dit.c - `sdpa dit`: a small diffusion transformer in C on top of libsdpa,
 * using attention the way the real ones do, to see what a backend choice
 * does to a whole denoising run (time share, and the image).
 *
 * Configurations (shaped like the real models, scaled to run in seconds):
 *   image  FLUX/SD3-like: 48x48x4 latent, 2x2 patches (576 image tokens),
 *          32 text tokens attended jointly, width 256, 4 heads of 64, 4 blocks
 *   video  Wan-like: 3 latent frames of 24x24x4, 2x2 patches (432 tokens),
 *          image-only self-attention plus cross-attention to 32 text tokens
 *
 * Block: adaLN modulation from (time embedding + mean text embedding) ->
 * shift/scale/gate; LN -> QKV -> libsdpa (one layer handle per attention
 * module) -> out projection, gated residual; LN -> MLP (GELU, 4x), gated
 * residual. The final layer maps tokens back to latent patches (a
 * prediction of the clean latent, x0).
 *
 * Weights come from --seed: every matrix N(0, 1/fan_in) (Box-Muller over
 * xorshift64), q/k projections x2 so attention is selective, 2-D
 * sinusoidal position embeddings of low frequency added to the patch
 * embedding. Attention then mixes mostly by position, so the predicted
 * latent is smooth and structured (blobs and bands), not noise; it is not
 * a trained model and makes no pictures of anything.
 *
 * Sampler: rectified flow, K Euler steps from t = 1 (noise) to 0: with the
 * model's x0 prediction, v = (x_t - x0) / t and x_{t'} = x_t + (t' - t) v.
 * The latent is decoded with a fixed 4 -> 3 colour matrix and a sigmoid,
 * upsampled 4x.
 */
#define _POSIX_C_SOURCE 200809L
#include "dit.h"
#include "image.h"
#include "commands.h"
#include "output.h"
#include "tool.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef SDPA_HAVE_MPI
#include "sp.h"

/* `dit --sp`: the arm whose attention runs sequence-parallel over the
 * ranks (each rank then holds the whole output: the rest of the model is
 * replicated), and that arm's context. The tool is single-threaded. */
static sp_session *dit_sp;
static sdpa_context *dit_sp_ctx;
#endif

typedef struct dit_config {
    const char *name;
    int frames, lat_h, lat_w, lat_c, patch;
    int width, heads, blocks, txt_tokens;
    int cross; /* 0: joint text+image self-attention; 1: self + cross-attention */
} dit_config;

static const dit_config configs[] = {
    {"image", 1, 48, 48, 4, 2, 256, 4, 4, 32, 0},
    {"video", 3, 24, 24, 4, 2, 256, 4, 4, 32, 1},
};

/* ---- weights */

static uint64_t rng_state;

static double gauss(void)
{
    double u[2];
    for (int i = 0; i < 2; i++) {
        rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
        u[i] = ((double)(rng_state >> 11) + 0.5) / 9007199254740992.0;
    }
    return sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

static float *matrix(int rows, int cols, double gain)
{
    float *m = malloc(sizeof(float) * (size_t)rows * (size_t)cols);
    if (m)
        for (size_t i = 0; i < (size_t)rows * (size_t)cols; i++)
            m[i] = (float)(gauss() * gain / sqrt((double)rows));
    return m;
}

typedef struct block_w {
    float *mod;              /* [C][6C] adaLN: shift1 scale1 gate1 shift2 scale2 gate2 */
    float *wq, *wk, *wv, *wo; /* [C][C] */
    float *cq, *ck, *cv, *co; /* cross-attention, video only */
    float *w1, *w2;          /* [C][4C], [4C][C] */
    sdpa_layer *attn, *xattn;
} block_w;

typedef struct model {
    const dit_config *cfg;
    int C, P, T_img, T_txt;
    float *w_in, *pos, *t1, *t2, *fin_mod, *w_out, *txt;
    block_w *blk;
} model;

/* ---- small dense kernels (row-major; the tool's own, not libsdpa's job) */

/* y[n][m] = x[n][k] . w[k][m] (+ y when acc) */
static void matmul(const float *x, const float *w, float *y, int n, int k, int m, int acc)
{
    for (int i = 0; i < n; i++) {
        float *yr = y + (size_t)i * m;
        if (!acc)
            memset(yr, 0, sizeof(float) * (size_t)m);
        for (int p = 0; p < k; p++) {
            const float a = x[(size_t)i * k + p];
            const float *wr = w + (size_t)p * m;
            for (int j = 0; j < m; j++)
                yr[j] += a * wr[j];
        }
    }
}

/* LayerNorm without affine, then adaLN: (1 + scale) * ln(x) + shift. */
static void modulate(const float *x, float *y, int n, int C, const float *shift,
                     const float *scale)
{
    for (int i = 0; i < n; i++) {
        const float *xr = x + (size_t)i * C;
        double mu = 0, var = 0;
        for (int c = 0; c < C; c++)
            mu += xr[c];
        mu /= C;
        for (int c = 0; c < C; c++)
            var += (xr[c] - mu) * (xr[c] - mu);
        const float inv = (float)(1.0 / sqrt(var / C + 1e-6));
        for (int c = 0; c < C; c++)
            y[(size_t)i * C + c] = (float)(xr[c] - mu) * inv * (1 + scale[c]) + shift[c];
    }
}

static float gelu(float x) { return 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x))); }
static float silu(float x) { return x / (1.0f + expf(-x)); }

/* ---- the model */

static int model_make(model *m, const dit_config *cfg, uint64_t seed, sdpa_context *ctx,
                      const char *backend)
{
    memset(m, 0, sizeof *m);
    m->cfg = cfg;
    const int C = cfg->width;
    m->C = C;
    m->P = cfg->lat_c * cfg->patch * cfg->patch;
    m->T_img = cfg->frames * (cfg->lat_h / cfg->patch) * (cfg->lat_w / cfg->patch);
    m->T_txt = cfg->txt_tokens;
    rng_state = seed * 0x9e3779b97f4a7c15ull + 1;
    m->w_in = matrix(m->P, C, 1.0);
    m->t1 = matrix(64, C, 1.0);
    m->t2 = matrix(C, C, 1.0);
    m->fin_mod = matrix(C, 2 * C, 0.5);
    /* The output projection is shared by the pixels of a patch (plus a
     * little each), so patches come out smooth rather than checkered. */
    m->w_out = matrix(C, m->P, 0.15);
    float *base = matrix(C, cfg->lat_c, 1.0);
    if (m->w_out && base)
        for (int r = 0; r < C; r++)
            for (int j = 0; j < m->P; j++)
                m->w_out[(size_t)r * m->P + j] += base[(size_t)r * cfg->lat_c + j / (cfg->patch * cfg->patch)];
    free(base);
    m->txt = matrix(m->T_txt, C, sqrt((double)m->T_txt)); /* the "prompt": N(0, 1) rows */
    m->pos = malloc(sizeof(float) * (size_t)m->T_img * C);
    m->blk = calloc((size_t)cfg->blocks, sizeof *m->blk);
    if (!m->w_in || !m->t1 || !m->t2 || !m->fin_mod || !m->w_out || !m->txt || !m->pos || !m->blk)
        return 0;
    /* 2-D (and frame) sinusoidal positions, low frequencies only. */
    const int gh = cfg->lat_h / cfg->patch, gw = cfg->lat_w / cfg->patch;
    for (int t = 0; t < m->T_img; t++) {
        const int f = t / (gh * gw), y = t / gw % gh, x = t % gw;
        for (int c = 0; c < C; c++) {
            const int which = c % 3, k = c / 6 % 8;
            const double coord = which == 0 ? x : which == 1 ? y : f * 4.0;
            const double freq = 0.5 / pow(2.0, k);
            m->pos[(size_t)t * C + c] = (float)(2.0 * (c % 2 ? cos(coord * freq) : sin(coord * freq)));
        }
    }
    for (int b = 0; b < cfg->blocks; b++) {
        block_w *w = &m->blk[b];
        w->mod = matrix(C, 6 * C, 0.3);
        w->wq = matrix(C, C, 2.0), w->wk = matrix(C, C, 2.0);
        w->wv = matrix(C, C, 1.0), w->wo = matrix(C, C, 1.0);
        w->w1 = matrix(C, 4 * C, 1.0), w->w2 = matrix(4 * C, C, 1.0);
        if (!w->mod || !w->wq || !w->wk || !w->wv || !w->wo || !w->w1 || !w->w2)
            return 0;
        if (cfg->cross) {
            w->cq = matrix(C, C, 2.0), w->ck = matrix(C, C, 2.0);
            w->cv = matrix(C, C, 1.0), w->co = matrix(C, C, 1.0);
            if (!w->cq || !w->ck || !w->cv || !w->co)
                return 0;
        }
        char name[64];
        sdpa_layer_desc ld = SDPA_LAYER_DESC_DEFAULT;
        ld.component = "transformer";
        ld.backend = backend;
        snprintf(name, sizeof name, "blocks.%d.attn", b);
        ld.name = name;
        if (sdpa_layer_create(ctx, &ld, &w->attn) != SDPA_OK)
            return 0;
        if (cfg->cross) {
            snprintf(name, sizeof name, "blocks.%d.cross", b);
            if (sdpa_layer_create(ctx, &ld, &w->xattn) != SDPA_OK)
                return 0;
        }
    }
    return 1;
}

static void model_free(model *m)
{
    free(m->w_in), free(m->pos), free(m->t1), free(m->t2), free(m->fin_mod), free(m->w_out);
    free(m->txt);
    for (int b = 0; m->blk && b < m->cfg->blocks; b++) {
        block_w *w = &m->blk[b];
        free(w->mod), free(w->wq), free(w->wk), free(w->wv), free(w->wo), free(w->w1);
        free(w->w2), free(w->cq), free(w->ck), free(w->cv), free(w->co);
        sdpa_layer_destroy(w->attn), sdpa_layer_destroy(w->xattn);
    }
    free(m->blk);
}

typedef struct run_stats {
    sdpa_dtype dtype; /* of the attention inputs */
    double attn_ms;
    char backends[256]; /* distinct backends that ran, in order of first use */
    char layers[1024];  /* "blocks.0.attn=cpu.avx512 ...", from the first step */
    int step;
} run_stats;

static void note_backend(run_stats *s, const char *layer)
{
    const char *b = sdpa_last_backend();
    if (s->step == 0) {
        size_t len = strlen(s->layers);
        snprintf(s->layers + len, sizeof s->layers - len, "%s%s=%s", len ? " " : "", layer, b);
    }
    if (strstr(s->backends, b))
        return;
    size_t len = strlen(s->backends);
    snprintf(s->backends + len, sizeof s->backends - len, "%s%s", len ? ", " : "", b);
}

/* out[Tq][C] = attention(xq . wq, xkv . wk, xkv . wv) . wo, added with gate. */
static sdpa_status attention(sdpa_layer *layer, const char *name, const float *xq, int Tq,
                             const float *xkv, int Tkv,
                             const float *wq, const float *wk, const float *wv, const float *wo,
                             int C, int H, float *scratch, float *residual, const float *gate,
                             run_stats *st)
{
    float *q = scratch, *k = q + (size_t)Tq * C, *v = k + (size_t)Tkv * C;
    float *o = v + (size_t)Tkv * C, *proj = o + (size_t)Tq * C;
    matmul(xq, wq, q, Tq, C, C, 0);
    matmul(xkv, wk, k, Tkv, C, C, 0);
    matmul(xkv, wv, v, Tkv, C, C, 0);
    /* Half-precision attention inputs, as a bf16/f16 model would pass them;
     * converted in place (the half values fill the front of each buffer). */
    if (st->dtype != SDPA_F32) {
        float *bufs[3] = {q, k, v};
        const size_t n[3] = {(size_t)Tq * C, (size_t)Tkv * C, (size_t)Tkv * C};
        for (int b = 0; b < 3; b++)
            sdpa_convert(bufs[b], SDPA_F32, bufs[b], st->dtype, n[b]);
    }
    sdpa_tensor tq = sdpa_tensor_bshd(q, st->dtype, 1, Tq, H, C / H);
    sdpa_tensor tk = sdpa_tensor_bshd(k, st->dtype, 1, Tkv, H, C / H);
    sdpa_tensor tv = sdpa_tensor_bshd(v, st->dtype, 1, Tkv, H, C / H);
    sdpa_tensor to = sdpa_tensor_bshd(o, SDPA_F32, 1, Tq, H, C / H);
    double t0 = tool_now_ms();
    sdpa_status s;
#ifdef SDPA_HAVE_MPI
    if (dit_sp) /* sharded over the ranks, gathered on all of them */
        s = sp_attention_all(dit_sp, dit_sp_ctx, &tq, &tk, &tv, o);
    else
#endif
        s = sdpa_layer_forward(layer, &tq, &tk, &tv, &to, NULL, NULL);
    st->attn_ms += tool_now_ms() - t0;
    if (s != SDPA_OK)
        return s;
    note_backend(st, name);
    matmul(o, wo, proj, Tq, C, C, 0);
    for (int i = 0; i < Tq; i++)
        for (int c = 0; c < C; c++)
            residual[(size_t)i * C + c] += gate[c] * proj[(size_t)i * C + c];
    return SDPA_OK;
}

/* x0 prediction for latent patches x [T_img][P] at time t. */
static sdpa_status model_forward(const model *m, const float *x, float t, float *x0, float *work,
                                 run_stats *st)
{
    const dit_config *cfg = m->cfg;
    const int C = m->C, Ti = m->T_img, Tt = m->T_txt, T = cfg->cross ? Ti : Ti + Tt;
    /* work: tokens [Tt+Ti][C], h [..][C], mlp [..][4C], attention scratch */
    float *tok = work, *h = tok + (size_t)(Ti + Tt) * C, *mlp = h + (size_t)(Ti + Tt) * C;
    float *scratch = mlp + (size_t)(Ti + Tt) * 4 * C;
    float cond[1024], temb[64], mod[6 * 1024];
    for (int i = 0; i < 32; i++) { /* time embedding */
        const double f = exp(-log(10000.0) * i / 32.0) * t * 1000.0;
        temb[i] = (float)sin(f), temb[32 + i] = (float)cos(f);
    }
    matmul(temb, m->t1, h, 1, 64, C, 0);
    for (int c = 0; c < C; c++)
        h[c] = silu(h[c]);
    matmul(h, m->t2, cond, 1, C, C, 0);
    for (int c = 0; c < C; c++) { /* + mean text embedding, then SiLU */
        double s = 0;
        for (int i = 0; i < Tt; i++)
            s += m->txt[(size_t)i * C + c];
        cond[c] = silu(cond[c] + (float)(s / Tt));
    }
    /* Joint: [text | image]; cross: image only, text as keys/values. */
    float *img = cfg->cross ? tok : tok + (size_t)Tt * C;
    if (!cfg->cross)
        memcpy(tok, m->txt, sizeof(float) * (size_t)Tt * C);
    matmul(x, m->w_in, img, Ti, m->P, C, 0);
    for (size_t i = 0; i < (size_t)Ti * C; i++)
        img[i] += m->pos[i];
    for (int b = 0; b < cfg->blocks; b++) {
        const block_w *w = &m->blk[b];
        matmul(cond, w->mod, mod, 1, C, 6 * C, 0);
        const float *shift1 = mod, *scale1 = mod + C, *gate1 = mod + 2 * C;
        const float *shift2 = mod + 3 * C, *scale2 = mod + 4 * C, *gate2 = mod + 5 * C;
        modulate(tok, h, T, C, shift1, scale1);
        char name[48];
        snprintf(name, sizeof name, "blocks.%d.attn", b);
        sdpa_status s = attention(w->attn, name, h, T, h, T, w->wq, w->wk, w->wv, w->wo, C,
                                  cfg->heads, scratch, tok, gate1, st);
        if (s == SDPA_OK && cfg->cross) {
            modulate(tok, h, T, C, shift1, scale1);
            snprintf(name, sizeof name, "blocks.%d.cross", b);
            s = attention(w->xattn, name, h, T, m->txt, Tt, w->cq, w->ck, w->cv, w->co, C,
                          cfg->heads, scratch, tok, gate1, st);
        }
        if (s != SDPA_OK)
            return s;
        modulate(tok, h, T, C, shift2, scale2);
        matmul(h, w->w1, mlp, T, C, 4 * C, 0);
        for (size_t i = 0; i < (size_t)T * 4 * C; i++)
            mlp[i] = gelu(mlp[i]);
        matmul(mlp, w->w2, h, T, 4 * C, C, 0);
        for (size_t i = 0; i < (size_t)T * C; i++)
            tok[i] += gate2[i % (size_t)C] * h[i];
    }
    matmul(cond, m->fin_mod, mod, 1, C, 2 * C, 0);
    modulate(img, h, Ti, C, mod, mod + C);
    matmul(h, m->w_out, x0, Ti, C, m->P, 0);
    return SDPA_OK;
}

/* Latent patches -> RGB: fixed colour matrix, sigmoid, 4x upsampling; video
 * frames side by side. */
static int decode(const model *m, const float *x, image *im)
{
    const dit_config *cfg = m->cfg;
    const int up = 4, p = cfg->patch, gw = cfg->lat_w / p, gh = cfg->lat_h / p;
    static const float colour[4][3] = {{0.9f, 0.2f, -0.3f}, {-0.2f, 0.8f, 0.3f},
                                       {0.1f, -0.3f, 0.9f}, {0.4f, 0.4f, 0.4f}};
    if (!image_alloc(im, cfg->lat_w * up * cfg->frames, cfg->lat_h * up))
        return 0;
    /* Each latent channel standardised over the picture, so the colours
     * show its structure rather than its offset. */
    double mean[16] = {0}, sd[16] = {0};
    const size_t n = (size_t)m->T_img * (size_t)m->P / (size_t)cfg->lat_c;
    for (int pass = 0; pass < 2; pass++)
        for (size_t t = 0; t < (size_t)m->T_img; t++)
            for (int j = 0; j < m->P; j++) {
                const int c = j / (p * p);
                const double v = x[t * (size_t)m->P + (size_t)j];
                if (pass == 0)
                    mean[c] += v / (double)n;
                else
                    sd[c] += (v - mean[c]) * (v - mean[c]) / (double)n;
            }
    for (int c = 0; c < cfg->lat_c; c++)
        sd[c] = sqrt(sd[c]) + 1e-6;
    for (int f = 0; f < cfg->frames; f++)
        for (int y = 0; y < cfg->lat_h; y++)
            for (int xx = 0; xx < cfg->lat_w; xx++) {
                const int tok = f * gh * gw + (y / p) * gw + xx / p;
                const float *patch = x + (size_t)tok * m->P;
                float rgb[3] = {0, 0, 0};
                for (int c = 0; c < cfg->lat_c; c++) {
                    const float v = (float)((patch[(c * p + y % p) * p + xx % p] - mean[c]) / sd[c]);
                    for (int k = 0; k < 3; k++)
                        rgb[k] += colour[c % 4][k] * v;
                }
                for (int dy = 0; dy < up; dy++)
                    for (int dx = 0; dx < up; dx++) {
                        const size_t px = (size_t)(y * up + dy) * (size_t)im->w +
                                          (size_t)(f * cfg->lat_w * up + xx * up + dx);
                        for (int k = 0; k < 3; k++)
                            im->rgb[px * 3 + k] =
                                (uint8_t)lrintf(255.0f / (1.0f + expf(-1.5f * rgb[k])));
                    }
            }
    return 1;
}

/* ---- sessions: a model with its buffers, sampled as often as wanted */

struct dit_session {
    const dit_config *cfg;
    model m;
    float *x, *x0, *work;
    uint64_t seed;
    int steps;
    run_stats st;
    double total_ms, attn_ms; /* of the last run */
    const char *label;
};

static const dit_config *dit_find_config(const char *name)
{
    for (size_t i = 0; i < sizeof configs / sizeof *configs; i++)
        if (strcmp(configs[i].name, name) == 0)
            return &configs[i];
    return NULL;
}

int dit_attention_desc(const char *config, sdpa_call_desc *d)
{
    const dit_config *cfg = dit_find_config(config);
    if (!cfg)
        return 0;
    memset(d, 0, sizeof *d);
    const int64_t Ti = (int64_t)cfg->frames * (cfg->lat_h / cfg->patch) * (cfg->lat_w / cfg->patch);
    d->device = SDPA_DEVICE_CPU, d->dtype = SDPA_F32;
    d->B = 1, d->Sq = d->Skv = cfg->cross ? Ti : Ti + cfg->txt_tokens;
    d->Hq = d->Hkv = cfg->heads, d->D = cfg->width / cfg->heads;
    return 1;
}

int dit_open(const char *config, sdpa_context *ctx, const char *backend, sdpa_dtype dtype,
             uint64_t seed, int steps, dit_session **out)
{
    const dit_config *cfg = dit_find_config(config);
    if (!cfg)
        return tool_usage_error("--config '%s' unknown, expected image or video", config);
    dit_session *s = calloc(1, sizeof *s);
    if (!s)
        return tool_usage_error("dit: out of memory");
    s->cfg = cfg, s->seed = seed, s->steps = steps, s->st.dtype = dtype;
    s->label = backend ? backend : "dispatcher";
    const size_t Tall = (size_t)cfg->frames * (size_t)(cfg->lat_h / cfg->patch) *
                            (size_t)(cfg->lat_w / cfg->patch) + (size_t)cfg->txt_tokens;
    const size_t C = (size_t)cfg->width, P = (size_t)(cfg->lat_c * cfg->patch * cfg->patch);
    s->x = malloc(sizeof(float) * Tall * P), s->x0 = malloc(sizeof(float) * Tall * P);
    s->work = malloc(sizeof(float) * Tall * C * 14);
    if (!s->x || !s->x0 || !s->work || !model_make(&s->m, cfg, seed, ctx, backend)) {
        int rc = tool_usage_error("dit: cannot build the model: %s", sdpa_last_error());
        dit_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

void dit_close(dit_session *s)
{
    if (!s)
        return;
    model_free(&s->m);
    free(s->x), free(s->x0), free(s->work), free(s);
}

int dit_run(dit_session *s, int verbose, double *ms_total)
{
    const size_t n = (size_t)s->m.T_img * (size_t)s->m.P;
    rng_state = s->seed * 0x2545f4914f6cdd1dull + 7; /* the starting noise */
    for (size_t i = 0; i < n; i++)
        s->x[i] = (float)gauss();
    s->total_ms = s->attn_ms = 0;
    s->st.step = 0;
    s->st.layers[0] = '\0';
    for (int k = 0; k < s->steps; k++) {
        const float t = 1.0f - (float)k / s->steps, t_next = 1.0f - (float)(k + 1) / s->steps;
        const double t0 = tool_now_ms(), a0 = s->st.attn_ms;
        sdpa_status ss = model_forward(&s->m, s->x, t, s->x0, s->work, &s->st);
        if (ss != SDPA_OK)
            return tool_lib_error("dit: attention", ss);
        for (size_t i = 0; i < n; i++) /* Euler on v = (x_t - x0) / t */
            s->x[i] += (t_next - t) * (s->x[i] - s->x0[i]) / t;
        const double ms = tool_now_ms() - t0;
        s->total_ms += ms, s->attn_ms += s->st.attn_ms - a0;
        s->st.step++;
        if (verbose)
            printf("  step %2d/%d  t=%.3f  %8.1f ms  attention %5.1f%%\n", k + 1, s->steps, t, ms,
                   100.0 * (s->st.attn_ms - a0) / ms);
    }
    if (ms_total)
        *ms_total = s->total_ms;
    return 0;
}

static void dit_report(const dit_session *s)
{
    const dit_config *cfg = s->cfg;
    printf("%s, %s attention: %d steps, %.1f ms per step, attention %.1f%% of it; attention "
           "layers (%d x %s) ran on: %s\n",
           s->label, sdpa_dtype_name(s->st.dtype), s->steps, s->total_ms / s->steps,
           100.0 * s->attn_ms / s->total_ms, cfg->blocks * (cfg->cross ? 2 : 1),
           cfg->cross ? "self + cross" : "joint", s->st.backends);
    printf("  per layer: %s\n", s->st.layers);
}

/* One full sampling run in a context of its own; the image and its timings. */
static int sample(const dit_config *cfg, uint64_t seed, int steps, int threads,
                  const char *backend, const char *rules, sdpa_dtype dtype, image *im,
                  int verbose)
{
    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    o.threads = threads;
    o.policy_file = rules;
    sdpa_context *ctx;
    sdpa_status st = sdpa_context_create(&o, &ctx);
    if (st != SDPA_OK)
        return tool_lib_error("dit: context", st);
#ifdef SDPA_HAVE_MPI
    dit_sp_ctx = ctx;
#endif
    dit_session *s = NULL;
    int rc = dit_open(cfg->name, ctx, backend, dtype, seed, steps, &s);
    if (rc == 0) {
        if (rules)
            s->label = rules;
        rc = dit_run(s, verbose, NULL);
    }
    if (rc == 0) {
        dit_report(s);
        if (!decode(&s->m, s->x, im))
            rc = tool_usage_error("dit: out of memory decoding");
    }
    dit_close(s);
    sdpa_context_destroy(ctx);
    return rc;
}

static int write_png(FILE *f, const void *user, char *err, size_t errn)
{
    return image_write_png(f, user, err, errn);
}

int cmd_dit(int argc, char **argv)
{
    tool_flag f[] = {{"--config", 1, NULL}, {"--steps", 1, NULL},   {"--seed", 1, NULL},
                     {"--backends", 1, NULL}, {"--rules", 1, NULL}, {"--out", 1, NULL},
                     {"--threads", 1, NULL}, {"--verbose", 0, NULL}, {"--attn-dtype", 1, NULL},
                     {"--sp", 1, NULL}};
    enum { CONFIG, STEPS, SEED, BACKENDS, RULES, OUT, THREADS, VERBOSE, ATTN_DTYPE, SP, NF };
    int rc = tool_parse_flags(argc, argv, f, NF);
    if (rc)
        return rc;
    int root = 1; /* the process that prints and writes */
#ifdef SDPA_HAVE_MPI
    static sp_session sp;
    if (f[SP].value) { /* two arms: one process, then the same run sharded */
        if ((f[BACKENDS].value && strchr(f[BACKENDS].value, ',')) ||
            (f[RULES].value && strchr(f[RULES].value, ',')) ||
            (f[ATTN_DTYPE].value && strchr(f[ATTN_DTYPE].value, ',')))
            return tool_usage_error("dit --sp compares one process with the sharded run: one "
                                    "backend, rule file and dtype");
        if ((rc = sp_begin(f[SP].value, &sp)) != 0)
            return rc;
        root = sp.rank == 0;
        if (!root && !freopen("/dev/null", "w", stdout)) /* one report, rank 0's */
            return tool_usage_error("dit: cannot silence rank %d", sp.rank);
    }
#else
    if (f[SP].value)
        return tool_usage_error("--sp: this sdpa was built without MPI (libsdpa_mpi)");
#endif
    const dit_config *cfg = f[CONFIG].value ? dit_find_config(f[CONFIG].value) : &configs[0];
    if (!cfg)
        return tool_usage_error("--config '%s' unknown, expected image or video", f[CONFIG].value);
    long long steps = 8, seed = 1, threads = 0;
    if (f[STEPS].value && !tool_parse_int(f[STEPS].value, 1, 1000, &steps))
        return tool_usage_error("--steps '%s' is not a number in 1..1000", f[STEPS].value);
    if (f[SEED].value && !tool_parse_int(f[SEED].value, 0, (1ll << 62), &seed))
        return tool_usage_error("--seed '%s' is not a non-negative number", f[SEED].value);
    if (f[THREADS].value && !tool_parse_int(f[THREADS].value, 1, 1024, &threads))
        return tool_usage_error("--threads '%s' is not a number in 1..1024", f[THREADS].value);
    if (f[BACKENDS].value && f[RULES].value)
        return tool_usage_error("dit: give --backends A[,B] or --rules FILE_A[,FILE_B], not both");
    const char *out = f[OUT].value ? f[OUT].value : "dit";
    /* Up to two arms: backends or rule files, comma-separated. */
    char list[1024] = "";
    const char *arms[2] = {NULL, NULL};
    int n_arms = 1; /* two: backends, rule files, or (below) attention dtypes */
    const char *src = f[BACKENDS].value ? f[BACKENDS].value : f[RULES].value;
    if (src) {
        if (strlen(src) >= sizeof list)
            return tool_usage_error("dit: argument too long");
        strcpy(list, src);
        char *comma = strchr(list, ',');
        arms[0] = list;
        if (comma) {
            *comma = '\0';
            arms[1] = comma + 1;
            n_arms = 2;
            if (strchr(arms[1], ','))
                return tool_usage_error("dit: at most two backends or rule files");
        }
    }
    /* Attention input dtype per arm: "bf16" for both, or "f32,bf16". */
    sdpa_dtype dt[2] = {SDPA_F32, SDPA_F32};
    if (f[ATTN_DTYPE].value) {
        char dl[64];
        if (strlen(f[ATTN_DTYPE].value) >= sizeof dl)
            return tool_usage_error("--attn-dtype too long");
        strcpy(dl, f[ATTN_DTYPE].value);
        char *comma = strchr(dl, ',');
        if (comma)
            *comma = '\0';
        if (!tool_parse_dtype(dl, &dt[0]) || (comma && !tool_parse_dtype(comma + 1, &dt[1])))
            return tool_usage_error("--attn-dtype '%s': expected f32, f16 or bf16, one or two",
                                    f[ATTN_DTYPE].value);
        if (!comma)
            dt[1] = dt[0];
        else if (n_arms == 1) { /* one backend, two dtypes: compare the dtypes */
            arms[1] = arms[0];
            n_arms = 2;
        }
    }
    if (f[SP].value) /* arm b: the same backend, rules and dtype, sharded */
        arms[1] = arms[0], dt[1] = dt[0], n_arms = 2;
    image im[2] = {{0, 0, NULL}, {0, 0, NULL}}, heat = {0, 0, NULL};
    /* The images (one per arm, and the difference for two), written all
     * or nothing at the end; bad paths fail before the sampling. */
    char err[640], paths[3][1024];
    tool_output outs[3];
    const int n_out = n_arms == 2 ? 3 : 1;
    const image *pics[3] = {&im[0], &im[1], &heat};
    for (int i = 0; i < n_out; i++) {
        if (i < 2)
            snprintf(paths[i], sizeof paths[i], n_arms == 2 ? "%s-%c.png" : "%s.png", out,
                     'a' + i);
        else
            snprintf(paths[i], sizeof paths[i], "%s-diff.png", out);
        outs[i] = (tool_output){"--out", paths[i], write_png, pics[i], "", 0, 0};
    }
    int resolved = root ? tool_outputs_resolve(outs, n_out, err, sizeof err) : 0;
#ifdef SDPA_HAVE_MPI
    if (f[SP].value && sp_agree(&sp, resolved != 0) != 0) {
        sp_end(&sp);
        return root && resolved ? tool_usage_error("dit: %s", err) : 2;
    }
#endif
    if (resolved != 0)
        return tool_usage_error("dit: %s", err);
    printf("# sdpa dit --config %s: %d frame(s) of %dx%dx%d latent, %d tokens + %d text, width "
           "%d, %d heads of %d, %d blocks, %lld Euler steps, seed %lld\n",
           cfg->name, cfg->frames, cfg->lat_h, cfg->lat_w, cfg->lat_c,
           cfg->frames * (cfg->lat_h / cfg->patch) * (cfg->lat_w / cfg->patch), cfg->txt_tokens,
           cfg->width, cfg->heads, cfg->width / cfg->heads, cfg->blocks, steps, seed);
    for (int a = 0; a < n_arms && rc == 0; a++) {
#ifdef SDPA_HAVE_MPI
        dit_sp = f[SP].value && a == 1 ? &sp : NULL;
        if (f[SP].value && a == 1)
            printf("# arm b: attention sequence-parallel, --sp %s over %d ranks\n", f[SP].value,
                   sp.size);
#endif
        rc = sample(cfg, (uint64_t)seed, (int)steps, (int)threads,
                    f[BACKENDS].value ? arms[a] : NULL, f[RULES].value ? arms[a] : NULL, dt[a],
                    &im[a], f[VERBOSE].value != NULL);
    }
#ifdef SDPA_HAVE_MPI
    dit_sp = NULL;
    if (f[SP].value) {
        rc = sp_agree(&sp, rc);
        if (rc == 0 && root) {
            int worst = 0;
            for (int i = 0; i < im[0].w * im[0].h * 3; i++) {
                const int d = abs((int)im[0].rgb[i] - (int)im[1].rgb[i]);
                worst = d > worst ? d : worst;
            }
            printf("one process vs --sp %s: max pixel difference %d of 255\n", f[SP].value,
                   worst);
        }
    }
#endif
    if (rc == 0 && n_arms == 2 && !image_diff_heatmap(&im[0], &im[1], &heat))
        rc = tool_usage_error("dit: out of memory");
    if (rc == 0 && root && tool_outputs_write(outs, n_out, err, sizeof err) != 0)
        rc = tool_usage_error("dit: %s (no existing file was replaced)", err);
    for (int i = 0; i < n_out && rc == 0; i++)
        printf("wrote %s (%dx%d%s)\n", paths[i], pics[i]->w, pics[i]->h,
               i == 2 ? ", |a - b| x 8" : "");
    if (rc == 0 && n_arms == 2)
        printf("PSNR %.2f dB, SSIM %.5f between %s/%s and %s/%s\n", image_psnr(&im[0], &im[1]),
               image_ssim(&im[0], &im[1]), arms[0] ? arms[0] : "dispatcher",
               sdpa_dtype_name(dt[0]), arms[1] ? arms[1] : "dispatcher", sdpa_dtype_name(dt[1]));
    image_free(&im[0]), image_free(&im[1]), image_free(&heat);
#ifdef SDPA_HAVE_MPI
    if (f[SP].value)
        sp_end(&sp);
#endif
    return rc;
}
