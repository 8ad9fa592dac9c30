/* scripted.c - see scripted.h. */
#include "scripted.h"
#include "dispatch/seam.h"
#include "core/convert.h"

#include <math.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int scripted_check(const sdpa_backend *self, const sdpa_call_desc *d,
                          const sdpa_platform *p, char *why, size_t n)
{
    (void)d, (void)p;
    const scripted *s = self->state;
    if (s->refuse) {
        sdpa__strlcpy(why, s->refuse, n);
        return 0;
    }
    return 1;
}

static double fake_now;
static uint64_t fake_rng = 88172645463325252ull;

double scripted_clock_ms(void *user)
{
    (void)user;
    return fake_now;
}

static sdpa_status scripted_run(const sdpa_backend *self, const sdpa_call *call)
{
    scripted *s = self->state;
    atomic_fetch_add(&s->runs, 1);
    if (s->cost_ms > 0 || s->cost_per_key_ms > 0) {
        fake_rng ^= fake_rng << 13, fake_rng ^= fake_rng >> 7, fake_rng ^= fake_rng << 17;
        double u = (double)(fake_rng >> 11) * (2.0 / 9007199254740992.0) - 1.0;
        const double cost = s->cost_ms + s->cost_per_key_ms * (double)call->desc.Skv;
        fake_now += cost * (1.0 + s->jitter * u);
    }
    if (s->run_status != SDPA_OK)
        return sdpa__fail(s->run_status, "%s: scripted %s", self->name,
                          sdpa_status_string(s->run_status));
    sdpa_status st = sdpa__backend_ref.run(&sdpa__backend_ref, call);
    if (st == SDPA_OK && s->wrong_result) {
        float *o = call->out->data;
        if (call->out->dtype == SDPA_F32)
            o[0] += 1.0f;
    }
    if (st == SDPA_OK && s->nan_result) {
        const sdpa_call_desc *d = &call->desc;
        sdpa__store_f32(call->out->data, call->out->dtype,
                        sdpa__offset(call->out, 0, d->Sq - 1, d->Hq - 1, d->D - 1), NAN);
    }
    return st;
}

/* The backward pass: the same script (its status, its cost), then ref's. */
static sdpa_status scripted_backward(const sdpa_backend *self, const sdpa_call *call)
{
    scripted *s = self->state;
    atomic_fetch_add(&s->runs, 1);
    if (s->run_status != SDPA_OK)
        return sdpa__fail(s->run_status, "%s: scripted %s", self->name,
                          sdpa_status_string(s->run_status));
    return sdpa__backend_ref.backward(&sdpa__backend_ref, call);
}

static sdpa_status scripted_prepare(const sdpa_backend *self, const sdpa_call *call)
{
    (void)call;
    scripted *s = self->state;
    if (!s->has_prepare) /* as a backend without the hook: nothing to build */
        return SDPA_OK;
    atomic_fetch_add(&s->prepares, 1);
    if (s->prepare_status != SDPA_OK)
        return sdpa__fail(s->prepare_status, "%s: scripted warm-up %s", self->name,
                          sdpa_status_string(s->prepare_status));
    return SDPA_OK;
}

sdpa_status scripted_add(sdpa_context *ctx, const char *name, scripted *script)
{
    /* Leaked on purpose: a registered backend lives as long as the test. */
    static sdpa_backend pool[64];
    static int used;
    if (used == 64)
        return SDPA_INTERNAL;
    sdpa_backend *b = &pool[used++];
    *b = sdpa__backend_ref;
    b->name = name;
    b->summary = "scripted test backend";
    b->fallback_rank = 0;
    b->version = "test";
    b->caps.lse = !script->no_lse;
    b->device = script->cuda ? SDPA_DEVICE_CUDA : SDPA_DEVICE_CPU;
    b->check = scripted_check;
    b->run = scripted_run;
    b->backward = scripted_backward;
    b->prepare = scripted_prepare; /* has_prepare may be set after registering */
    b->state = script;
    return sdpa__ctx_add_backend(ctx, b);
}
