/*
 * run.c - `sdpa run`: attention on .npy files.
 *
 * The inputs are read whole, converted to their dtypes (the files' own, or
 * --dtype for q and --kv-dtype for k and v, which may differ: f32 queries
 * over an f16 cache, as stable-diffusion.cpp keeps them), computed, and the outputs written all or nothing (output.h):
 * a failure at any step leaves every file that existed exactly as it was,
 * including an --out that names one of the inputs.
 */
#define _POSIX_C_SOURCE 200809L
#include "commands.h"
#include "npy.h"
#include "output.h"
#include "sparse_spec.h"
#include "tool.h"
#ifdef SDPA_HAVE_MPI
#include "sp.h"
#endif

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct npy_out {
    const float *data;
    int ndim;
    int64_t shape[4];
} npy_out;

static int write_npy(FILE *f, const void *user, char *err, size_t errn)
{
    const npy_out *o = user;
    (void)err, (void)errn; /* errno says why */
    return npy_write_f32(f, o->data, o->ndim, o->shape);
}

static void *convert_input(const npy_array *a, sdpa_dtype dtype)
{
    size_t n = (size_t)a->count;
    void *dst = malloc((n ? n : 1) * sdpa_dtype_size(dtype));
    if (dst && sdpa_convert(a->data, a->is_f16 ? SDPA_F16 : SDPA_F32, dst, dtype, n) != SDPA_OK) {
        free(dst);
        dst = NULL;
    }
    return dst;
}

enum { MAX_LENS = 4096 };

/* "3,5,7" into exactly B lengths. */
static int parse_lengths(const char *flag, const char *s, int64_t B, int32_t *out)
{
    char buf[8 * MAX_LENS];
    if (strlen(s) >= sizeof buf)
        return tool_usage_error("%s: too long, expected B comma-separated lengths", flag);
    strcpy(buf, s);
    int64_t n = 0;
    for (char *save = NULL, *w = strtok_r(buf, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
        long long v;
        if (n == B || n == MAX_LENS || !tool_parse_int(w, 0, INT32_MAX, &v))
            return tool_usage_error("%s '%s': expected %lld comma-separated lengths >= 0 (one per "
                                    "batch entry)",
                                    flag, s, (long long)B);
        out[n++] = (int32_t)v;
    }
    if (n != B)
        return tool_usage_error("%s '%s' has %lld lengths, expected %lld (B)", flag, s,
                                (long long)n, (long long)B);
    return 0;
}

/*
 * The masks from the command line: --seq-len-q/--seq-len-kv lists, a
 * --key-mask [B|1, Skv] (bool: True = attend, as torch; or float32:
 * nonzero = attend) and a --mask [B|1, H|1, Sq, Skv] (bool: True = attend;
 * or float32, additive: -inf hides a key); size-1 dimensions broadcast.
 * The library checks the values against the shapes.
 */
static int read_masks(const char *len_q, const char *len_kv, const char *key_path,
                      const char *mask_path, const npy_array *a, npy_array *mk,
                      int32_t lens[2][MAX_LENS], uint8_t **key_bytes, sdpa_mask *m)
{
    const int64_t B = a[0].shape[0], Hq = a[0].shape[2], Sq = a[0].shape[1];
    const int64_t Skv = a[1].shape[1];
    char err[512];
    int rc;
    if (B > MAX_LENS && (len_q || len_kv))
        return tool_usage_error("--seq-len-q/kv: B is %lld, at most %d supported", (long long)B,
                                MAX_LENS);
    if (len_q && (rc = parse_lengths("--seq-len-q", len_q, B, lens[0])) != 0)
        return rc;
    if (len_kv && (rc = parse_lengths("--seq-len-kv", len_kv, B, lens[1])) != 0)
        return rc;
    m->seq_len_q = len_q ? lens[0] : NULL;
    m->seq_len_kv = len_kv ? lens[1] : NULL;
    if (key_path) {
        if (npy_read(key_path, &mk[0], err, sizeof err) != 0)
            return tool_usage_error("--key-mask: %s", err);
        const int64_t *s = mk[0].shape;
        if (mk[0].ndim != 2 || (s[0] != B && s[0] != 1) || s[1] != Skv || mk[0].is_f16)
            return tool_usage_error("--key-mask: %s must be bool or float32 [B or 1, Skv] = "
                                    "[%lld, %lld], got %s %s",
                                    key_path, (long long)B, (long long)Skv,
                                    mk[0].is_f16 ? "float16" : mk[0].is_bool ? "bool" : "float32",
                                    npy_shape_text(&mk[0]));
        if (!(*key_bytes = malloc((size_t)(s[0] * s[1]) + 1)))
            return fprintf(stderr, "sdpa: error: --key-mask: out of memory\n"), 1;
        for (int64_t i = 0; i < s[0] * s[1]; i++)
            (*key_bytes)[i] = mk[0].is_bool ? ((const uint8_t *)mk[0].data)[i] != 0
                                            : ((const float *)mk[0].data)[i] != 0.0f;
        m->key = *key_bytes;
        m->key_stride[0] = s[0] == 1 ? 0 : Skv, m->key_stride[1] = 1;
    }
    if (mask_path) {
        if (npy_read(mask_path, &mk[1], err, sizeof err) != 0)
            return tool_usage_error("--mask: %s", err);
        const int64_t *s = mk[1].shape;
        if (mk[1].ndim != 4 || (s[0] != B && s[0] != 1) || (s[1] != Hq && s[1] != 1) ||
            s[2] != Sq || s[3] != Skv || mk[1].is_f16)
            return tool_usage_error("--mask: %s must be bool or float32 [B or 1, H or 1, Sq, Skv] "
                                    "= [%lld, %lld, %lld, %lld], got %s %s",
                                    mask_path, (long long)B, (long long)Hq, (long long)Sq,
                                    (long long)Skv,
                                    mk[1].is_f16 ? "float16" : mk[1].is_bool ? "bool" : "float32",
                                    npy_shape_text(&mk[1]));
        m->general = mk[1].data; /* NumPy bools are bytes 0 / 1: the library's boolean mask */
        m->general_type = mk[1].is_bool ? SDPA_MASK_BOOL : SDPA_MASK_ADDITIVE;
        m->general_dtype = SDPA_F32;
        m->general_stride[3] = 1, m->general_stride[2] = Skv;
        m->general_stride[1] = s[1] == 1 ? 0 : Sq * Skv;
        m->general_stride[0] = s[0] == 1 ? 0 : s[1] * Sq * Skv;
    }
    return 0;
}

int cmd_run(int argc, char **argv)
{
    tool_flag f[] = {{"--q", 1, NULL},          {"--k", 1, NULL},
                     {"--v", 1, NULL},          {"--out", 1, NULL},
                     {"--lse", 1, NULL},        {"--backend", 1, NULL},
                     {"--causal", 1, NULL},     {"--scale", 1, NULL},
                     {"--dtype", 1, NULL},      {"--threads", 1, NULL},
                     {"--seq-len-q", 1, NULL},  {"--seq-len-kv", 1, NULL},
                     {"--key-mask", 1, NULL},   {"--mask", 1, NULL},
                     {"--sp", 1, NULL},         {"--sparse", 1, NULL},
                     {"--kv-dtype", 1, NULL}};
    enum { Q, K, V, OUT, LSE, BACKEND, CAUSAL, SCALE, DTYPE, THREADS, LEN_Q, LEN_KV, KEYMASK,
           MASK, SP, SPARSE, KV_DTYPE, NF };
    static const char *const input_flag[3] = {"--q", "--k", "--v"};
    int rc = tool_parse_flags(argc, argv, f, NF);
    if (rc)
        return rc;
    for (int i = Q; i <= OUT; i++)
        if (!f[i].value)
            return tool_usage_error("run: %s FILE is required", f[i].name);
    sdpa_params p = SDPA_PARAMS_DEFAULT;
    if (f[CAUSAL].value && !tool_parse_causal(f[CAUSAL].value, &p.causal))
        return tool_usage_error("--causal '%s' unknown, expected none, top-left or bottom-right",
                                f[CAUSAL].value);
    if (f[SCALE].value && !tool_parse_scale(f[SCALE].value, &p.scale))
        return tool_usage_error("--scale '%s' is not a finite non-zero number", f[SCALE].value);
    long long threads = 0;
    if (f[THREADS].value && !tool_parse_int(f[THREADS].value, 1, 1024, &threads))
        return tool_usage_error("--threads '%s' is not a number in 1..1024", f[THREADS].value);
    sdpa_dtype dtype = SDPA_F32;
    if (f[DTYPE].value && !tool_parse_dtype(f[DTYPE].value, &dtype))
        return tool_usage_error("--dtype '%s' unknown, expected f32, f16 or bf16", f[DTYPE].value);
    sdpa_dtype kv_dtype = dtype;
    if (f[KV_DTYPE].value && !tool_parse_dtype(f[KV_DTYPE].value, &kv_dtype))
        return tool_usage_error("--kv-dtype '%s' unknown, expected f32, f16 or bf16",
                                f[KV_DTYPE].value);
    p.backend = f[BACKEND].value;
    if (f[SP].value && f[KV_DTYPE].value)
        return tool_usage_error("--sp takes one dtype for q, k and v (--dtype), not --kv-dtype");
    if (f[SP].value && (f[LEN_Q].value || f[LEN_KV].value || f[KEYMASK].value || f[MASK].value))
        return tool_usage_error("--sp takes no masks yet (--seq-len-q, --seq-len-kv, --key-mask, "
                                "--mask); causal is fine");
    int root = 1; /* the process that writes the outputs */
#ifdef SDPA_HAVE_MPI
    sp_session sp;
    memset(&sp, 0, sizeof sp);
    if (f[SP].value) {
        if ((rc = sp_begin(f[SP].value, &sp)) != 0)
            return rc;
        root = sp.rank == 0;
    }
#else
    if (f[SP].value)
        return tool_usage_error("--sp: this sdpa was built without MPI (libsdpa_mpi); install "
                                "an MPI (scripts/deps.sh) and rebuild");
#endif

    /* Bad output paths fail now, before any work (on the rank that writes). */
    npy_out res[2] = {{NULL, 4, {0}}, {NULL, 3, {0}}};
    tool_output outs[2] = {{"--out", f[OUT].value, write_npy, &res[0], "", 0, 0},
                           {"--lse", f[LSE].value, write_npy, &res[1], "", 0, 0}};
    const int n_outs = f[LSE].value ? 2 : 1;
    char err[640];
    int resolve_rc = root && tool_outputs_resolve(outs, n_outs, err, sizeof err) != 0
                         ? tool_usage_error("%s", err)
                         : 0;
#ifdef SDPA_HAVE_MPI
    if (sp.active && (resolve_rc = sp_agree(&sp, resolve_rc)) != 0) {
        sp_end(&sp);
        return resolve_rc;
    }
#endif
    if (resolve_rc)
        return resolve_rc;

    npy_array a[3], mk[2];
    memset(a, 0, sizeof a);
    memset(mk, 0, sizeof mk);
    void *conv[3] = {NULL, NULL, NULL};
    float *out = NULL, *lse = NULL;
    uint8_t *key_bytes = NULL;
    int32_t lens[2][MAX_LENS];
    sdpa_mask mask = SDPA_MASK_DEFAULT;
    sparse_pattern sparse = {0};
    sdpa_context *ctx = NULL;
#ifdef SDPA_HAVE_MPI
    int sp_agreed = 0;
#endif
    rc = 1;
    for (int i = 0; i < 3; i++) {
        if (npy_read(f[Q + i].value, &a[i], err, sizeof err) != 0) {
            rc = tool_usage_error("%s: %s", input_flag[i], err);
            goto done;
        }
        if (a[i].is_bool) {
            rc = tool_usage_error("%s: %s is bool, expected float32 or float16", input_flag[i],
                                  f[Q + i].value);
            goto done;
        }
        if (a[i].ndim != 4) {
            rc = tool_usage_error("%s: %s has %d dimensions, expected 4 [B, S, H, D]",
                                  input_flag[i], f[Q + i].value, a[i].ndim);
            goto done;
        }
        /* q may differ from k and v (mixed), k and v are one dtype */
        if (i == 2 && !f[KV_DTYPE].value && !f[DTYPE].value && a[2].is_f16 != a[1].is_f16) {
            rc = tool_usage_error("--v: %s is %s but --k is %s; expected one dtype for k and v, "
                                  "or --kv-dtype to convert both",
                                  f[V].value, a[2].is_f16 ? "f16" : "f32",
                                  a[1].is_f16 ? "f16" : "f32");
            goto done;
        }
    }
    if (!f[DTYPE].value)
        dtype = a[0].is_f16 ? SDPA_F16 : SDPA_F32;
    if (!f[KV_DTYPE].value) /* --dtype alone converts all three, as it did */
        kv_dtype = f[DTYPE].value ? dtype : a[1].is_f16 ? SDPA_F16 : SDPA_F32;
    if ((rc = read_masks(f[LEN_Q].value, f[LEN_KV].value, f[KEYMASK].value, f[MASK].value, a,
                         mk, lens, &key_bytes, &mask)) != 0)
        goto done;
    if (f[SPARSE].value) { /* a window or a block map (sparse_spec.h) on top */
        sdpa_call_desc sd = {.size = sizeof(sdpa_call_desc), .device = SDPA_DEVICE_CPU,
                             .dtype = dtype, .B = a[0].shape[0], .Sq = a[0].shape[1],
                             .Skv = a[1].shape[1], .Hq = a[0].shape[2], .Hkv = a[1].shape[2],
                             .D = a[0].shape[3], .causal = p.causal,
                             .kv_dtype = kv_dtype != dtype ? SDPA_KV_DTYPE(kv_dtype) : 0};
        char why[256];
        if (sparse_spec_build(f[SPARSE].value, &sd, &sparse, why, sizeof why) != 0) {
            rc = tool_usage_error("--sparse %s", why);
            goto done;
        }
        sparse_pattern_apply(&sparse, &mask);
    }
    rc = 1;
    p.mask = &mask;
    for (int i = 0; i < 3; i++)
        if (!(conv[i] = convert_input(&a[i], i ? kv_dtype : dtype))) {
            fprintf(stderr, "sdpa: error: out of memory converting the inputs to %s\n",
                    sdpa_dtype_name(i ? kv_dtype : dtype));
            goto done;
        }
    const int64_t *qs = a[0].shape, *ks = a[1].shape, *vs = a[2].shape;
    sdpa_tensor tq = sdpa_tensor_bshd(conv[0], dtype, qs[0], qs[1], qs[2], qs[3]);
    sdpa_tensor tk = sdpa_tensor_bshd(conv[1], kv_dtype, ks[0], ks[1], ks[2], ks[3]);
    sdpa_tensor tv = sdpa_tensor_bshd(conv[2], kv_dtype, vs[0], vs[1], vs[2], vs[3]);
    out = malloc(sizeof(float) * (size_t)(a[0].count ? a[0].count : 1));
    lse = f[LSE].value ? malloc(sizeof(float) * (size_t)(qs[0] * qs[1] * qs[2] + 1)) : NULL;
    if (!out || (f[LSE].value && !lse)) {
        fprintf(stderr, "sdpa: error: out of memory allocating the outputs\n");
        goto done;
    }
    sdpa_tensor to = sdpa_tensor_bshd(out, SDPA_F32, qs[0], qs[1], qs[2], qs[3]);
    if ((rc = tool_context(NULL, (int)threads, &ctx)) != 0)
        goto done;
    rc = 1;
#ifdef SDPA_HAVE_MPI
    if (sp.active) { /* every rank has its inputs: now the collective part */
        sp_agreed = 1;
        if ((rc = sp_agree(&sp, 0)) != 0)
            goto done;
        double s0 = tool_now_ms();
        sdpa_status sst = sp_forward(&sp, ctx, &tq, &tk, &tv, root ? out : NULL,
                                     root ? lse : NULL, &p);
        double s1 = tool_now_ms();
        if (sst != SDPA_OK) {
            rc = sst == SDPA_INVALID_ARGUMENT ? 2 : 1;
            goto done;
        }
        res[0].data = out;
        memcpy(res[0].shape, qs, sizeof res[0].shape);
        res[1].data = lse;
        res[1].shape[0] = qs[0], res[1].shape[1] = qs[2], res[1].shape[2] = qs[1];
        if (root && tool_outputs_write(outs, n_outs, err, sizeof err) != 0) {
            fprintf(stderr, "sdpa: error: %s (no existing file was replaced)\n", err);
            goto done;
        }
        if (root)
            printf("sp %s over %d ranks (ulysses %d x ring %d)  dtype %s  %.3f ms  "
                   "CUDA-aware MPI: %s\n",
                   f[SP].value, sp.size, sp.ulysses, sp.ring, sdpa_dtype_name(dtype), s1 - s0,
                   sp_cuda_aware() ? "yes" : "no");
        rc = 0;
        goto done;
    }
#endif
    double t0 = tool_now_ms();
    sdpa_status st = sdpa_forward(ctx, &tq, &tk, &tv, &to, lse, &p);
    double t1 = tool_now_ms();
    if (st != SDPA_OK) {
        rc = tool_lib_error("run", st);
        goto done;
    }
    res[0].data = out;
    memcpy(res[0].shape, qs, sizeof res[0].shape);
    res[1].data = lse;
    res[1].shape[0] = qs[0], res[1].shape[1] = qs[2], res[1].shape[2] = qs[1];
    if (tool_outputs_write(outs, n_outs, err, sizeof err) != 0) {
        fprintf(stderr, "sdpa: error: %s (no existing file was replaced)\n", err);
        goto done;
    }
    char kv_note[32] = "";
    if (kv_dtype != dtype)
        snprintf(kv_note, sizeof kv_note, " (k, v %s)", sdpa_dtype_name(kv_dtype));
    printf("backend %s  dtype %s%s  q [%lld, %lld, %lld, %lld]  k [%lld, %lld, %lld, %lld]  "
           "%.3f ms\n",
           sdpa_last_backend(), sdpa_dtype_name(dtype), kv_note, (long long)qs[0], (long long)qs[1],
           (long long)qs[2], (long long)qs[3], (long long)ks[0], (long long)ks[1],
           (long long)ks[2], (long long)ks[3], t1 - t0);
    rc = 0;
done:
#ifdef SDPA_HAVE_MPI
    if (sp.active && !sp_agreed) /* failed before the others' collective: release them */
        sp_agree(&sp, rc ? rc : 1);
    sp_end(&sp);
#endif
    sdpa_context_destroy(ctx);
    for (int i = 0; i < 3; i++) {
        npy_free(&a[i]);
        free(conv[i]);
    }
    npy_free(&mk[0]), npy_free(&mk[1]);
    free(key_bytes);
    sparse_pattern_free(&sparse);
    free(out);
    free(lse);
    return rc;
}
