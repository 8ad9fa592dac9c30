/*
 * test_validate.c - bad input: every case returns INVALID_ARGUMENT with a
 * message naming the argument, nothing crashes, nothing is written.
 */
#include "support/testlib.h"
#include "core/core.h"

#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { B = 2, S = 9, H = 4, D = 16 };
static float qm[B * S * H * D], km[B * S * H * D], vm[B * S * H * D], om[B * S * H * D + 64];
static float lsem[B * H * S + 16];
static sdpa_context *ctx;

typedef struct call {
    sdpa_tensor q, k, v, o;
    float *lse;
    sdpa_params p;
} call;

static call good(void)
{
    call c;
    c.q = sdpa_tensor_bshd(qm, SDPA_F32, B, S, H, D);
    c.k = sdpa_tensor_bshd(km, SDPA_F32, B, S, H, D);
    c.v = sdpa_tensor_bshd(vm, SDPA_F32, B, S, H, D);
    c.o = sdpa_tensor_bshd(om, SDPA_F32, B, S, H, D);
    c.lse = lsem;
    sdpa_params p = SDPA_PARAMS_DEFAULT;
    c.p = p;
    return c;
}

static void expect_invalid(const char *what, call c, const char *needle, int null_q)
{
    memset(om, 0x5A, sizeof om);
    memset(lsem, 0x5A, sizeof lsem);
    sdpa_status st = sdpa_forward(ctx, null_q ? NULL : &c.q, &c.k, &c.v, &c.o, c.lse, &c.p);
    CHECK(st == SDPA_INVALID_ARGUMENT, "%s: status %s", what, sdpa_status_string(st));
    CHECK(strstr(sdpa_last_error(), needle) != NULL, "%s: message '%s' lacks '%s'", what,
          sdpa_last_error(), needle);
    int untouched = 1;
    for (size_t i = 0; i < sizeof om; i++)
        untouched &= ((unsigned char *)om)[i] == 0x5A;
    for (size_t i = 0; i < sizeof lsem; i++)
        untouched &= ((unsigned char *)lsem)[i] == 0x5A;
    CHECK(untouched, "%s: output written despite the error", what);
    /* The same through a layer. */
    sdpa_layer *layer;
    sdpa_layer_create(ctx, NULL, &layer);
    st = sdpa_layer_forward(layer, null_q ? NULL : &c.q, &c.k, &c.v, &c.o, c.lse, &c.p);
    CHECK(st == SDPA_INVALID_ARGUMENT, "%s (layer): status %s", what, sdpa_status_string(st));
    sdpa_layer_destroy(layer);
}

/* Structs that grow by addition: the size member is what the library reads
 * by (sdpa.h: growing by addition; scripts/abi-check.sh runs old binaries). */
typedef struct grown {
    size_t size;
    int a, b;
    int64_t added; /* a field "added after the base layout" */
} grown;

static void test_growth(void)
{
    /* sdpa__struct_in: an older caller's smaller struct is copied, the rest 0 */
    const size_t base = offsetof(grown, added);
    grown old = {base, 1, 2, 0x7777}, local, *r;
    memset(&local, 0x5A, sizeof local);
    r = (grown *)sdpa__struct_in(&old, base, sizeof(grown), &local, "old");
    CHECK(r == &local && r->a == 1 && r->b == 2 && r->added == 0,
          "an older struct: read at %p (local %p), a %d b %d added %lld", (void *)r,
          (void *)&local, r ? r->a : -1, r ? r->b : -1, r ? (long long)r->added : -1);
    grown cur = {sizeof(grown), 3, 4, 5};
    CHECK(sdpa__struct_in(&cur, base, sizeof(grown), &local, "cur") == &cur,
          "the current layout is read in place");
    grown zero = {0, 6, 7, 8};
    r = (grown *)sdpa__struct_in(&zero, base, sizeof(grown), &local, "zero");
    CHECK(r == &local && r->a == 6 && r->b == 7 && r->added == 0,
          "size 0 is the base layout: read no further than it");
    CHECK(sdpa__struct_in(&zero, sizeof(grown), sizeof(grown), &local, "zero") == &zero,
          "size 0 when the base layout is this build's: read in place");
    grown newer = {sizeof(grown) + 8, 0, 0, 0};
    CHECK(sdpa__struct_in(&newer, base, sizeof(grown), &local, "newer") == NULL &&
              strstr(sdpa_last_error(), "newer->size is"),
          "a newer caller's size: %s", sdpa_last_error());

    /* through the API: bad sizes are refused naming the member, nothing written */
    call c = good();
    c.p.size = sizeof(sdpa_params) + 16;
    expect_invalid("params from a newer header", c, "params->size is", 0);
    c = good(), c.p.size = 4;
    expect_invalid("params too small", c, "params->size is 4", 0);
    c = good(), c.p.size = 0; /* memset or designated: the 0.2.0 layout */
    CHECK_STATUS(sdpa_forward(ctx, &c.q, &c.k, &c.v, &c.o, c.lse, &c.p), SDPA_OK);
    sdpa_mask m = SDPA_MASK_DEFAULT;
    m.size = 3;
    c = good(), c.p.mask = &m;
    expect_invalid("mask too small", c, "params->mask->size is 3", 0);
    sdpa_call_desc d = SDPA_CALL_DESC_DEFAULT;
    d.B = 1, d.Sq = d.Skv = 64, d.Hq = d.Hkv = 2, d.D = 64;
    sdpa_decision dec;
    CHECK_STATUS(sdpa_decide(ctx, &d, &dec), SDPA_OK);
    d.size = sizeof d + 8;
    CHECK(sdpa_decide(ctx, &d, &dec) == SDPA_INVALID_ARGUMENT &&
              strstr(sdpa_last_error(), "desc->size is"),
          "decide, newer desc: %s", sdpa_last_error());
    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    o.size = 1;
    sdpa_context *bad = NULL;
    CHECK(sdpa_context_create(&o, &bad) == SDPA_INVALID_ARGUMENT && !bad &&
              strstr(sdpa_last_error(), "opts->size is 1"),
          "context options of size 1: %s", sdpa_last_error());
    sdpa_layer_desc ld = SDPA_LAYER_DESC_DEFAULT;
    ld.size = sizeof ld * 2;
    sdpa_layer *layer = NULL;
    CHECK(sdpa_layer_create(ctx, &ld, &layer) == SDPA_INVALID_ARGUMENT && !layer,
          "layer desc from a newer header: %s", sdpa_last_error());
}

/* sdpa_tensor_from_bytes: ggml's innermost-first ne/nb, any axis order */
/* sdpa_openmp_host in a process without an OpenMP runtime (this test
 * links none; /proc/self/maps tells if something loaded one anyway):
 * NOT_AVAILABLE, saying what it looked for. The rest is test_openmp_host's. */
static void test_openmp_host_absent(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int loaded = 0;
    while (f && fgets(line, sizeof line, f))
        loaded |= strstr(line, "/libgomp") || strstr(line, "/libomp.") || strstr(line, "/libiomp5");
    if (f)
        fclose(f);
    if (!f || loaded) {
        tl_skip("sdpa_openmp_host without a runtime", f ? "an OpenMP runtime is loaded here"
                                                          : "no /proc/self/maps to tell");
        return;
    }
    sdpa_parallel_for_fn fn;
    void *user;
    CHECK_STATUS(sdpa_openmp_host(2, &fn, &user), SDPA_NOT_AVAILABLE);
    CHECK(strstr(sdpa_last_error(), "no OpenMP runtime (libgomp, libomp, libiomp5) is loaded"),
          "%s", sdpa_last_error());
    CHECK(fn == NULL && user == NULL, "NOT_AVAILABLE left *fn and *user unset");
}

static void test_from_bytes(void)
{
    float buf[2 * 5 * 3 * 4];
    /* ggml's q: ne = {D, S, H, B}, contiguous ("dshb") */
    const int64_t ne[4] = {4, 5, 3, 2};
    const size_t nb[4] = {4, 16, 80, 240};
    sdpa_tensor t;
    CHECK_STATUS(sdpa_tensor_from_bytes(buf, SDPA_F32, ne, nb, "dshb", &t), SDPA_OK);
    const sdpa_tensor want = sdpa_tensor_bhsd(buf, SDPA_F32, 2, 5, 3, 4);
    CHECK(memcmp(t.size, want.size, sizeof t.size) == 0 &&
              memcmp(t.stride, want.stride, sizeof t.stride) == 0 && t.data == buf,
          "dshb: sizes %lld %lld %lld %lld strides %lld %lld %lld %lld", (long long)t.size[0],
          (long long)t.size[1], (long long)t.size[2], (long long)t.size[3],
          (long long)t.stride[0], (long long)t.stride[1], (long long)t.stride[2],
          (long long)t.stride[3]);
    /* ggml's attention result: ne = {D, H, S, B} ("dhsb") is BSHD */
    const int64_t ne2[4] = {4, 3, 5, 2};
    const size_t nb2[4] = {4, 16, 48, 240};
    CHECK_STATUS(sdpa_tensor_from_bytes(buf, SDPA_F32, ne2, nb2, "dhsb", &t), SDPA_OK);
    const sdpa_tensor want2 = sdpa_tensor_bshd(buf, SDPA_F32, 2, 5, 3, 4);
    CHECK(memcmp(t.size, want2.size, sizeof t.size) == 0 &&
              memcmp(t.stride, want2.stride, sizeof t.stride) == 0,
          "dhsb is not BSHD");
    /* f16: strides in elements of 2 bytes */
    const size_t nb3[4] = {2, 8, 40, 120};
    CHECK_STATUS(sdpa_tensor_from_bytes(buf, SDPA_F16, ne, nb3, "dshb", &t), SDPA_OK);
    CHECK(t.stride[1] == 4 && t.stride[2] == 20 && t.stride[0] == 60 && t.stride[3] == 1,
          "f16 strides %lld %lld %lld %lld", (long long)t.stride[0], (long long)t.stride[1],
          (long long)t.stride[2], (long long)t.stride[3]);
    static const struct {
        const char *order;
        int bad_nb, bad_ne, dtype;
        const char *words;
    } bad[] = {{"dsh", 0, 0, 0, "order is \"dsh\""},   {"dshh", 0, 0, 0, "each of d, s, h, b once"},
               {"dshbx", 0, 0, 0, "expected 4 letters"}, {NULL, 0, 0, 0, "order is \"(null)\""},
               {"dshb", 1, 0, 0, "nb[1] is 17 bytes"},   {"dshb", 0, 1, 0, "ne[2] is 0"},
               {"dshb", 0, 0, 7, "dtype is 7"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int64_t e[4] = {4, 5, 3, 2};
        size_t b[4] = {4, 16, 80, 240};
        if (bad[i].bad_nb)
            b[1] = 17;
        if (bad[i].bad_ne)
            e[2] = 0;
        memset(&t, 0x5a, sizeof t);
        CHECK_STATUS(sdpa_tensor_from_bytes(buf, bad[i].dtype ? (sdpa_dtype)bad[i].dtype : SDPA_F32,
                                            e, b, bad[i].order, &t),
                     SDPA_INVALID_ARGUMENT);
        CHECK(strstr(sdpa_last_error(), bad[i].words), "%s: %s", bad[i].words, sdpa_last_error());
    }
    CHECK_STATUS(sdpa_tensor_from_bytes(buf, SDPA_F32, ne, nb, "dshb", NULL), SDPA_INVALID_ARGUMENT);
}

int main(void)
{
    tl_seed_from_env();
    ctx = tl_context(NULL);
    for (size_t i = 0; i < sizeof qm / sizeof *qm; i++)
        qm[i] = (float)tl_uniform(), km[i] = (float)tl_uniform(), vm[i] = (float)tl_uniform();

    call c = good();
    CHECK_STATUS(sdpa_forward(ctx, &c.q, &c.k, &c.v, &c.o, c.lse, &c.p), SDPA_OK);
    test_growth();
    test_openmp_host_absent();

    expect_invalid("NULL q", good(), "q is NULL", 1);
    c = good(), c.k.data = NULL;
    expect_invalid("NULL k data", c, "k->data is NULL", 0);
    c = good(), c.v.size[3] = 0;
    expect_invalid("zero size", c, "v->size[3] (D) is 0", 0);
    c = good(), c.q.size[1] = -5;
    expect_invalid("negative size", c, "q->size[1] (S) is -5", 0);
    c = good(), c.k.stride[1] = -1;
    expect_invalid("negative stride", c, "k->stride[1] (S) is -1", 0);
    c = good(), c.q.size[2] = 3, c.o.size[2] = 3, c.k.size[2] = 2, c.v.size[2] = 2;
    expect_invalid("Hq % Hkv", c, "Hq % Hkv must be 0", 0);
    c = good(), c.k.size[0] = 1, c.v.size[0] = 1;
    expect_invalid("mismatched B", c, "k->size[0] (B) is 1, expected 2", 0);
    c = good(), c.v.size[3] = 8;
    expect_invalid("mismatched D", c, "v->size[3] (D) is 8, expected 16", 0);
    c = good(), c.v.size[1] = 8;
    expect_invalid("mismatched Skv", c, "v->size[1] (Skv) is 8", 0);
    c = good(), c.o.size[1] = 8;
    expect_invalid("mismatched out", c, "out sizes", 0);
    c = good(), c.q.dtype = (sdpa_dtype)7;
    expect_invalid("unknown dtype", c, "q->dtype is 7", 0);
    c = good(), c.k.dtype = SDPA_F16;
    expect_invalid("k and v of two dtypes", c, "v->dtype is f32, expected k's dtype f16", 0);
    c = good(), c.o.data = qm;
    expect_invalid("out overlaps q", c, "out overlaps q", 0);
    c = good(), c.o.data = vm + 100;
    expect_invalid("out overlaps v partly", c, "out overlaps", 0);
    c = good(), c.lse = (float *)km;
    expect_invalid("lse overlaps k", c, "lse overlaps k", 0);
    c = good(), c.lse = om + 3;
    expect_invalid("lse overlaps out", c, "lse overlaps out", 0);
    c = good(), c.o.stride[2] = 1; /* heads on top of each other */
    expect_invalid("self-overlapping out", c, "overlap", 0);
    c = good(), c.q.size[0] = INT64_MAX / 2, c.o.size[0] = INT64_MAX / 2;
    c.k.size[0] = c.v.size[0] = INT64_MAX / 2;
    expect_invalid("byte count overflow", c, "overflow", 0);
    c = good(), c.q.stride[0] = INT64_MAX / 3;
    expect_invalid("stride overflow", c, "overflow", 0);
    c = good(), c.p.scale = NAN;
    expect_invalid("NaN scale", c, "params->scale", 0);
    c = good(), c.p.causal = (sdpa_causal)9;
    expect_invalid("bad causal", c, "params->causal is 9", 0);
    c = good(), c.q.device.kind = SDPA_DEVICE_CUDA;
    expect_invalid("mixed devices", c, "device", 0);
    c = good(), c.p.backend = "cpu.quantum";
    expect_invalid("unknown backend", c, "backend 'cpu.quantum'", 0);
    c = good(), c.o.data = (char *)om + 1;
    expect_invalid("misaligned out", c, "aligned", 0);

    CHECK_STATUS(sdpa_forward(NULL, &c.q, &c.k, &c.v, &c.o, NULL, NULL), SDPA_INVALID_ARGUMENT);
    CHECK_STATUS(sdpa_layer_forward(NULL, &c.q, &c.k, &c.v, &c.o, NULL, NULL),
                 SDPA_INVALID_ARGUMENT);
    CHECK_STATUS(sdpa_context_create(NULL, NULL), SDPA_INVALID_ARGUMENT);
    sdpa_context_options o = SDPA_CONTEXT_OPTIONS_DEFAULT;
    o.threads = -1;
    sdpa_context *bad;
    CHECK_STATUS(sdpa_context_create(&o, &bad), SDPA_INVALID_ARGUMENT);
    CHECK(strstr(sdpa_last_error(), "threads") != NULL, "%s", sdpa_last_error());
    sdpa_context_destroy(NULL); /* harmless */
    sdpa_layer_destroy(NULL);
    CHECK(strcmp(sdpa_status_string(SDPA_OUT_OF_MEMORY), "out of memory") == 0, "status string");

    sdpa_call_desc d;
    memset(&d, 0, sizeof d);
    sdpa_decision dec;
    CHECK_STATUS(sdpa_decide(ctx, &d, &dec), SDPA_INVALID_ARGUMENT);
    CHECK(strstr(sdpa_last_error(), "desc->B is 0") != NULL, "%s", sdpa_last_error());
    sdpa_context_destroy(ctx);
    test_from_bytes();
    return tl_finish();
}
