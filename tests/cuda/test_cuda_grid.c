/*
 * test_cuda_grid.c - every present cuda.* backend against the float64
 * reference, on device memory: fresh random inputs, odd sizes, GQA, cross,
 * both causal alignments, LSE, guard bytes after the device outputs, and
 * the masks each backend declares with their arrays in device memory
 * (sequence lengths with a zero length; a key mask for cuda.flash and
 * cuda.unfused), against ref given the same masks on the host. The
 * large row is checked against cuda.unfused (the GPU-side reference) when
 * it is present. Without a GPU every backend is skipped with the reason
 * (this is what CI sees); scripts/gpu-check.sh runs it on a GPU, once per
 * backend (test_cuda_grid BACKEND).
 */
#define _POSIX_C_SOURCE 200809L
#include "support/testlib.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static sdpa_context *ctx;

typedef struct dev_tensor {
    sdpa_tensor t;
    void *mem;
    size_t bytes;
} dev_tensor;

static int to_device(const sdpa_tensor *h, size_t bytes, dev_tensor *d)
{
    d->bytes = bytes;
    if (cudaMalloc(&d->mem, bytes + TL_GUARD) != cudaSuccess)
        return 0;
    cudaMemset((char *)d->mem + bytes, 0xA5, TL_GUARD);
    cudaMemcpy(d->mem, h->data, bytes, cudaMemcpyHostToDevice);
    d->t = *h;
    d->t.data = d->mem;
    d->t.device.kind = SDPA_DEVICE_CUDA, d->t.device.ordinal = 0;
    return 1;
}

static int guard_ok(const void *dev, size_t bytes)
{
    unsigned char g[TL_GUARD];
    cudaMemcpy(g, (const char *)dev + bytes, TL_GUARD, cudaMemcpyDeviceToHost);
    for (int i = 0; i < TL_GUARD; i++)
        if (g[i] != 0xA5)
            return 0;
    return 1;
}

static double tolerance(sdpa_dtype t) { return t == SDPA_BF16 ? 2e-2 : 4e-3; }

/* A copy of the host mask hm with its arrays in device memory. */
static int mask_to_device(const sdpa_mask *hm, int64_t B, int64_t Skv, sdpa_mask *dm,
                          void *arrays[3])
{
    *dm = *hm;
    const void *src[3] = {hm->seq_len_q, hm->seq_len_kv, hm->key};
    const size_t bytes[3] = {sizeof(int32_t) * (size_t)B, sizeof(int32_t) * (size_t)B,
                             (size_t)(B * Skv)};
    for (int i = 0; i < 3; i++) {
        arrays[i] = NULL;
        if (src[i] && (cudaMalloc(&arrays[i], bytes[i]) != cudaSuccess ||
                       cudaMemcpy(arrays[i], src[i], bytes[i], cudaMemcpyHostToDevice) !=
                           cudaSuccess))
            return 0;
    }
    dm->seq_len_q = arrays[0], dm->seq_len_kv = arrays[1], dm->key = arrays[2];
    return 1;
}

/* must_run: a refusal (UNSUPPORTED) fails the case instead of skipping it.
 * hm: masks (host arrays, key rows of Skv bytes), or NULL. */
static void check_case(const char *backend, const char *against, tl_case c, int must_run,
                       const sdpa_mask *hm)
{
    char what[200];
    snprintf(what, sizeof what, "%s B=%lld Sq=%lld Skv=%lld Hq=%lld Hkv=%lld D=%lld %s causal=%s",
             backend, (long long)c.B, (long long)c.Sq, (long long)c.Skv, (long long)c.Hq,
             (long long)c.Hkv, (long long)c.D, sdpa_dtype_name(c.dtype), sdpa_causal_name(c.causal));
    tl_problem p;
    tl_output want, got;
    c.out_dtype = c.dtype; /* GPU backends write the input dtype */
    c.want_lse = 1;
    tl_problem_make(&p, &c);
    tl_output_make(&want, &p);
    tl_output_make(&got, &p);
    sdpa_params prm = SDPA_PARAMS_DEFAULT;
    prm.causal = c.causal;
    sdpa_mask dm;
    void *mask_mem[3] = {NULL, NULL, NULL};
    if (hm) {
        snprintf(what + strlen(what), sizeof what - strlen(what), " mask=%s%s",
                 hm->seq_len_q || hm->seq_len_kv ? "seq_len" : "", hm->key ? "+key" : "");
        CHECK(mask_to_device(hm, c.B, c.Skv, &dm, mask_mem), "%s: mask to device", what);
    }
    dev_tensor q, k, v, o;
    float *lse_dev = NULL;
    const size_t nl = (size_t)(c.B * c.Hq * c.Sq) * sizeof(float);
    if (!to_device(&p.q, p.qkv_bytes[0], &q) || !to_device(&p.k, p.qkv_bytes[1], &k) ||
        !to_device(&p.v, p.qkv_bytes[2], &v) || !to_device(&got.t, got.bytes, &o) ||
        cudaMalloc((void **)&lse_dev, nl + TL_GUARD) != cudaSuccess) {
        CHECK(0, "%s: cudaMalloc failed", what);
        return;
    }
    cudaMemset((char *)lse_dev + nl, 0xA5, TL_GUARD);
    /* The reference: ref on the host, or another GPU backend on the device. */
    sdpa_status sr;
    if (strcmp(against, "ref") == 0) {
        prm.backend = "ref";
        prm.mask = hm;
        sr = sdpa_forward(ctx, &p.q, &p.k, &p.v, &want.t, want.lse, &prm);
        prm.mask = hm ? &dm : NULL;
    } else {
        dev_tensor o2;
        to_device(&want.t, want.bytes, &o2);
        prm.backend = against;
        sr = sdpa_forward(ctx, &q.t, &k.t, &v.t, &o2.t, NULL, &prm);
        cudaMemcpy(want.mem, o2.mem, want.bytes, cudaMemcpyDeviceToHost);
        cudaFree(o2.mem);
    }
    prm.backend = backend;
    /* Warm-up first (cuda.cudnn builds its plan here): it must agree with
     * the forward call that follows. */
    sdpa_status sw = sdpa_warmup(ctx, &q.t, &k.t, &v.t, &o.t, lse_dev, &prm);
    sdpa_status st = sdpa_forward(ctx, &q.t, &k.t, &v.t, &o.t, lse_dev, &prm);
    cudaError_t sync = cudaDeviceSynchronize();
    CHECK(sw == st, "%s: warm-up said %s, forward %s", what, sdpa_status_string(sw),
          sdpa_status_string(st));
    if (st == SDPA_UNSUPPORTED && !must_run) {
        tl_skip(what, sdpa_last_error());
    } else {
        CHECK(st == SDPA_OK && sync == cudaSuccess, "%s: %s (%s), sync %s", what,
              sdpa_status_string(st), sdpa_last_error(), cudaGetErrorString(sync));
        CHECK(sr == SDPA_OK, "%s: reference %s failed: %s", what, against, sdpa_last_error());
        if (st == SDPA_OK && sr == SDPA_OK) {
            cudaMemcpy(got.mem, o.mem, got.bytes, cudaMemcpyDeviceToHost);
            cudaMemcpy(got.lse, lse_dev, nl, cudaMemcpyDeviceToHost);
            double diff = tl_max_diff(&got, &want, NULL);
            CHECK(diff <= tolerance(c.dtype), "%s: max |out - %s| = %.3g > %.3g", what, against,
                  diff, tolerance(c.dtype));
            if (strcmp(against, "ref") == 0) {
                double ld = tl_max_lse_diff(&got, &want, c.B, c.Hq, c.Sq);
                CHECK(ld <= 1e-2, "%s: max |lse - ref| = %.3g", what, ld);
            }
            CHECK(guard_ok(o.mem, o.bytes) && guard_ok(lse_dev, nl), "%s: guard bytes overwritten",
                  what);
        }
    }
    cudaFree(q.mem), cudaFree(k.mem), cudaFree(v.mem), cudaFree(o.mem), cudaFree(lse_dev);
    for (int i = 0; i < 3; i++)
        cudaFree(mask_mem[i]);
    tl_output_free(&want), tl_output_free(&got), tl_problem_free(&p);
}

int main(int argc, char **argv)
{
    tl_seed_from_env();
    ctx = tl_context(NULL);
    static const char *names[] = {"cuda.cudnn", "cuda.flash", "cuda.unfused"};
    /* test_cuda_grid [BACKEND ...]: those only (gpu-check.sh runs each in
     * its own process, so that a sticky CUDA fault in one cannot fail the
     * others' cases) */
    int wanted[3] = {argc <= 1, argc <= 1, argc <= 1};
    for (int a = 1; a < argc; a++) {
        int n = 0;
        while (n < 3 && strcmp(argv[a], names[n]) != 0)
            n++;
        if (n == 3) {
            printf("usage: test_cuda_grid [cuda.cudnn|cuda.flash|cuda.unfused ...]: '%s' "
                   "unknown\n",
                   argv[a]);
            return 2;
        }
        wanted[n] = 1;
    }
    int unfused_present = 0;
    for (int i = 0; i < sdpa_backend_count(ctx); i++) {
        sdpa_backend_info b;
        sdpa_backend_get(ctx, i, &b);
        unfused_present |= strcmp(b.name, "cuda.unfused") == 0 && b.present;
    }
    for (int n = 0; n < 3; n++) {
        if (!wanted[n])
            continue;
        sdpa_backend_info b;
        int found = 0;
        for (int i = 0; i < sdpa_backend_count(ctx) && !found; i++)
            if (sdpa_backend_get(ctx, i, &b) == SDPA_OK && strcmp(b.name, names[n]) == 0)
                found = 1;
        if (!found || !b.present) {
            tl_skip(names[n], found ? b.why_absent : "unknown backend");
            continue;
        }
        printf("== %s\n", names[n]);
        const tl_case cases[] = {
            {1, 128, 128, 4, 4, 64, SDPA_BF16, SDPA_BF16, SDPA_CAUSAL_NONE, TL_BSHD, 1, TL_UNIFORM, 0, 0},
            {2, 257, 77, 8, 2, 128, SDPA_F16, SDPA_F16, SDPA_CAUSAL_NONE, TL_BSHD, 1, TL_UNIFORM, 0, 0},
            {1, 513, 513, 4, 4, 128, SDPA_BF16, SDPA_BF16, SDPA_CAUSAL_TOP_LEFT, TL_BHSD, 1, TL_UNIFORM, 0, 0},
            {1, 100, 300, 4, 1, 64, SDPA_BF16, SDPA_BF16, SDPA_CAUSAL_BOTTOM_RIGHT, TL_STRIDED, 1, TL_UNIFORM, 0, 0},
            {1, 33, 33, 2, 2, 72, SDPA_F16, SDPA_F16, SDPA_CAUSAL_NONE, TL_BSHD, 1, TL_UNIFORM, 0, 0},
            {1, 1, 1, 1, 1, 64, SDPA_F16, SDPA_F16, SDPA_CAUSAL_NONE, TL_BSHD, 1, TL_UNIFORM, 0, 0},
        };
        /* cuDNN must itself serve the first, known-good shape (not a skip, not
         * a fallback: the backend is named); cuda.flash claims every case. */
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
            check_case(names[n], "ref", cases[c], (n == 0 && c == 0) || n == 1, NULL);
        /* the masks: every backend claims sequence lengths; flash and
         * unfused the key mask too. All must run. */
        int32_t lq[2] = {90, 0}, lkv[2] = {200, 0};
        static uint8_t key[2 * 300];
        for (int i = 0; i < 2 * 300; i++)
            key[i] = (i * 7919) % 4 != 0;
        sdpa_mask lens = SDPA_MASK_DEFAULT, both;
        lens.seq_len_q = lq, lens.seq_len_kv = lkv;
        both = lens, both.key = key, both.key_stride[0] = 300, both.key_stride[1] = 1;
        for (int causal = 0; causal <= 2; causal++) {
            tl_case m = {2, 128, 300, 4, 2, 64, SDPA_BF16, SDPA_BF16, (sdpa_causal)causal,
                         TL_BSHD, 1, TL_UNIFORM, 0, 0};
            check_case(names[n], "ref", m, 1, &lens);
            if (n != 0)
                check_case(names[n], "ref", m, 1, &both);
        }
        if (unfused_present && n != 2) {
            tl_case big = {1, 4096, 4096, 8, 8, 128, SDPA_BF16, SDPA_BF16, SDPA_CAUSAL_NONE,
                           TL_BSHD, 1, TL_UNIFORM, 0, 0};
            check_case(names[n], "cuda.unfused", big, n == 1, NULL);
        }
    }
    sdpa_context_destroy(ctx);
    return tl_finish();
}
