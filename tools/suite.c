/* suite.c - see suite.h. */
#define _POSIX_C_SOURCE 200809L
#include "suite.h"
#include "tool.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int read_suite(const char *path, row *rows, int *n_rows)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return tool_usage_error("--suite: cannot open '%s'", path);
    char line[1024];
    int lineno = 0, n = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char *s = line;
        while (*s == ' ' || *s == '\t')
            s++;
        if (*s == '#' || *s == '\n' || *s == '\0')
            continue;
        if (n == MAX_ROWS) {
            fclose(f);
            return tool_usage_error("%s:%d: more than %d rows", path, lineno, MAX_ROWS);
        }
        row *r = &rows[n];
        memset(r, 0, sizeof *r);
        char *save = NULL, *tok = strtok_r(s, "\t \n", &save);
        long long v[7];
        int ok = tok && strlen(tok) < sizeof r->name;
        if (ok)
            strcpy(r->name, tok);
        for (int i = 0; i < 7 && ok; i++) {
            tok = strtok_r(NULL, "\t \n", &save);
            ok = tok && tool_parse_int(tok, i == 6 ? 0 : 1, i == 6 ? 1 : (1ll << 40), &v[i]);
        }
        if (!ok) {
            fclose(f);
            return tool_usage_error("%s:%d: expected name B Sq Skv Hq Hkv D causal(0|1)", path,
                                    lineno);
        }
        r->d.B = v[0], r->d.Sq = v[1], r->d.Skv = v[2], r->d.Hq = v[3], r->d.Hkv = v[4];
        r->d.D = v[5];
        r->d.causal = v[6] ? SDPA_CAUSAL_TOP_LEFT : SDPA_CAUSAL_NONE;
        tok = strtok_r(NULL, "\t \n", &save);
        long long real;
        if (tok && strncmp(tok, "seq_len_kv=", 11) == 0) { /* the padding column */
            if (!tool_parse_int(tok + 11, 0, v[2] < INT32_MAX ? v[2] : INT32_MAX, &real)) {
                fclose(f);
                return tool_usage_error("%s:%d: '%s': expected seq_len_kv=N with N in 0..%lld "
                                        "(Skv)", path, lineno, tok,
                                        v[2] < INT32_MAX ? v[2] : INT32_MAX);
            }
            r->seq_len_kv = real, r->d.mask = SDPA_MASK_KIND_SEQ_LEN;
            tok = strtok_r(NULL, "\t \n", &save);
        }
        if (tok && strncmp(tok, "sparse=", 7) == 0) { /* the sparse column */
            const unsigned kind = sparse_spec_kind(tok + 7);
            if (!kind || strlen(tok + 7) >= sizeof r->sparse) {
                fclose(f);
                return tool_usage_error("%s:%d: '%s': expected sparse=SPEC with SPEC "
                                        "window=..., nbhd=..., sta=..., radial=... or random=...",
                                        path, lineno, tok);
            }
            strcpy(r->sparse, tok + 7);
            r->d.mask |= kind;
        }
        if (r->d.Hq % r->d.Hkv) {
            fclose(f);
            return tool_usage_error("%s:%d: Hq %lld is not a multiple of Hkv %lld", path, lineno,
                                    v[3], v[4]);
        }
        n++;
    }
    fclose(f);
    if (n == 0)
        return tool_usage_error("--suite: '%s' has no rows", path);
    *n_rows = n;
    return 0;
}

/*
 * A suite by name ("diffusion-cpu") or path. A name (no '/', no ".tsv") is
 * looked up as NAME.tsv in $SDPA_SHAPES_DIR, beside the installed tool
 * (../share/libsdpa/shapes, so an installed tree can move), in the data
 * directory it was installed to, then in the source tree it was built
 * from (bench/shapes); the first that exists wins.
 */
static int suite_path(const char *suite, char *path, size_t n)
{
    const size_t len = strlen(suite);
    if (strchr(suite, '/') || (len > 4 && strcmp(suite + len - 4, ".tsv") == 0)) {
        snprintf(path, n, "%s", suite);
        return 1;
    }
    char exe[4096] = "", near[4096] = "";
    ssize_t got = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (got > 0) {
        exe[got] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            snprintf(near, sizeof near, "%.4000s/../share/libsdpa/shapes", exe);
        }
    }
    const char *env = getenv("SDPA_SHAPES_DIR");
    const char *dirs[] = {env && *env ? env : NULL, near[0] ? near : NULL, SDPA_SHAPES_INSTALLED,
                          SDPA_SHAPES_SOURCE};
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
        if (!dirs[i])
            continue;
        snprintf(path, n, "%s/%s.tsv", dirs[i], suite);
        FILE *f = fopen(path, "r");
        if (f) {
            fclose(f);
            return 1;
        }
    }
    return 0;
}

int suite_load(const char *suite, const char *shape, row *rows, int *n_rows)
{
    if (!!suite == !!shape)
        return tool_usage_error("give exactly one of --suite NAME|FILE or --shape "
                                "B,Sq,Skv,Hq,Hkv,D");
    char path[4200];
    if (suite && !suite_path(suite, path, sizeof path))
        return tool_usage_error("--suite '%s': no %s.tsv in $SDPA_SHAPES_DIR, beside the tool, "
                                "in %s or in %s; expected a suite name (smoke, diffusion-cpu, "
                                "diffusion-gpu) or a path",
                                suite, suite, SDPA_SHAPES_INSTALLED, SDPA_SHAPES_SOURCE);
    if (suite)
        return read_suite(path, rows, n_rows);
    memset(&rows[0], 0, sizeof rows[0]);
    if (!tool_parse_shape(shape, &rows[0].d) || rows[0].d.Hq % rows[0].d.Hkv)
        return tool_usage_error("--shape '%s' is not six positive integers B,Sq,Skv,Hq,Hkv,D "
                                "with Hq a multiple of Hkv",
                                shape);
    strcpy(rows[0].name, "shape");
    *n_rows = 1;
    return 0;
}

int suite_args(const char *suite, const char *shape, const char *dtype_arg,
               const char *threads_arg, row *rows, int *n_rows, sdpa_dtype *dtype, int *threads)
{
    int rc = suite_load(suite, shape, rows, n_rows);
    if (rc)
        return rc;
    *dtype = SDPA_F32;
    if (dtype_arg && !tool_parse_dtype(dtype_arg, dtype))
        return tool_usage_error("--dtype '%s' unknown, expected f32, f16 or bf16", dtype_arg);
    long long t = 0;
    if (threads_arg && !tool_parse_int(threads_arg, 1, 1024, &t))
        return tool_usage_error("--threads '%s' is not a number in 1..1024", threads_arg);
    *threads = (int)t;
    for (int r = 0; r < *n_rows; r++)
        rows[r].d.dtype = *dtype;
    return 0;
}

int suite_backends(sdpa_context *ctx, const char *list, int with_ref_on_all, const char **names,
                   int max, int *n)
{
    *n = 0;
    const int all = list && strcmp(list, "all") == 0;
    if (!list || all) {
        for (int i = 0; i < sdpa_backend_count(ctx) && *n < max; i++) {
            sdpa_backend_info b;
            sdpa_backend_get(ctx, i, &b);
            if (b.present && b.device == SDPA_DEVICE_CPU &&
                ((all && with_ref_on_all) || strcmp(b.name, "ref") != 0))
                names[(*n)++] = b.name;
        }
        return 0;
    }
    char buf[512];
    if (strlen(list) >= sizeof buf)
        return tool_usage_error("--backends list too long");
    strcpy(buf, list);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int found = 0;
        for (int i = 0; i < sdpa_backend_count(ctx) && !found; i++) {
            sdpa_backend_info b;
            sdpa_backend_get(ctx, i, &b);
            if (strcmp(b.name, tok) != 0)
                continue;
            found = 1;
            if (!b.present)
                return tool_usage_error("--backends: %s is not present here: %s", tok,
                                        b.why_absent);
            if (*n == max)
                return tool_usage_error("--backends: at most %d", max);
            names[(*n)++] = b.name;
        }
        if (!found)
            return tool_usage_error("--backends: '%s' unknown (see `sdpa info`)", tok);
    }
    if (*n == 0)
        return tool_usage_error("--backends: no backend in '%s'", list);
    return 0;
}

double suite_flops(const sdpa_call_desc *d, int64_t seq_len_kv)
{
    const double keys = (double)(seq_len_kv > 0 ? seq_len_kv : d->Skv);
    double f = 4.0 * (double)d->B * (double)d->Hq * (double)d->Sq * keys * (double)d->D;
    return d->causal != SDPA_CAUSAL_NONE && d->Sq == d->Skv ? f / 2 : f;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float rnd(void)
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

/* 64-byte aligned memory (free() releases it), as PyTorch's allocator
 * and most frameworks' give their tensors: with malloc's 16-byte alignment
 * of large blocks every 64-byte vector load of a row would cross two cache
 * lines, which Zen 4 pays for on every load. */
static void *tool_alloc_aligned(size_t bytes)
{
    return aligned_alloc(64, (bytes + 63) / 64 * 64);
}

static void *random_tensor(sdpa_dtype t, size_t n)
{
    /* Drawn as f32, then narrowed in place (the half values fill the
     * front; the tail is unused). */
    void *p = tool_alloc_aligned((n ? n : 1) * sizeof(float));
    if (!p)
        return NULL;
    for (size_t i = 0; i < n; i++)
        ((float *)p)[i] = rnd();
    if (t != SDPA_F32)
        sdpa_convert(p, SDPA_F32, p, t, n);
    return p;
}

int problem_make(problem *p, const sdpa_call_desc *d, int64_t seq_len_kv, sdpa_dtype dtype,
                 sdpa_dtype out_dtype, int with_lse)
{
    memset(p, 0, sizeof *p);
    if (d->mask & SDPA_MASK_KIND_SEQ_LEN) {
        if (!(p->lens = malloc(sizeof(int32_t) * (size_t)d->B)))
            return 0;
        for (int64_t b = 0; b < d->B; b++)
            p->lens[b] = (int32_t)seq_len_kv;
        sdpa_mask m0 = SDPA_MASK_DEFAULT;
        p->mask_store = m0;
        p->mask_store.seq_len_kv = p->lens;
        p->mask = &p->mask_store;
    }
    const size_t nq = (size_t)(d->B * d->Sq * d->Hq * d->D);
    const size_t nk = (size_t)(d->B * d->Skv * d->Hkv * d->D);
    void *q = random_tensor(dtype, nq), *k = random_tensor(dtype, nk);
    void *v = random_tensor(dtype, nk);
    void *o = tool_alloc_aligned(sdpa_dtype_size(out_dtype) * (nq ? nq : 1));
    float *lse = with_lse ? malloc(sizeof(float) * (size_t)(d->B * d->Hq * d->Sq)) : NULL;
    if (!q || !k || !v || !o || (with_lse && !lse)) {
        free(q), free(k), free(v), free(o), free(lse), free(p->lens);
        return 0;
    }
    p->q = sdpa_tensor_bshd(q, dtype, d->B, d->Sq, d->Hq, d->D);
    p->k = sdpa_tensor_bshd(k, dtype, d->B, d->Skv, d->Hkv, d->D);
    p->v = sdpa_tensor_bshd(v, dtype, d->B, d->Skv, d->Hkv, d->D);
    p->out = sdpa_tensor_bshd(o, out_dtype, d->B, d->Sq, d->Hq, d->D);
    p->lse = lse;
    return 1;
}

int problem_backward_make(problem_grads *g, problem *p, sdpa_context *ctx,
                          const sdpa_call_desc *d)
{
    memset(g, 0, sizeof *g);
    const size_t nq = (size_t)(d->B * d->Sq * d->Hq * d->D);
    const size_t nk = (size_t)(d->B * d->Skv * d->Hkv * d->D);
    void *dout = random_tensor(p->q.dtype, nq);
    float *dq = malloc(sizeof(float) * (nq ? nq : 1)), *dk = malloc(sizeof(float) * (nk ? nk : 1));
    float *dv = malloc(sizeof(float) * (nk ? nk : 1));
    sdpa_params prm = SDPA_PARAMS_DEFAULT;
    prm.causal = d->causal;
    prm.mask = p->mask;
    if (!dout || !dq || !dk || !dv || !p->lse ||
        sdpa_forward(ctx, &p->q, &p->k, &p->v, &p->out, p->lse, &prm) != SDPA_OK) {
        free(dout), free(dq), free(dk), free(dv);
        return 0;
    }
    g->dout = sdpa_tensor_bshd(dout, p->q.dtype, d->B, d->Sq, d->Hq, d->D);
    g->dq = sdpa_tensor_bshd(dq, SDPA_F32, d->B, d->Sq, d->Hq, d->D);
    g->dk = sdpa_tensor_bshd(dk, SDPA_F32, d->B, d->Skv, d->Hkv, d->D);
    g->dv = sdpa_tensor_bshd(dv, SDPA_F32, d->B, d->Skv, d->Hkv, d->D);
    return 1;
}

void problem_backward_free(problem_grads *g)
{
    free(g->dout.data), free(g->dq.data), free(g->dk.data), free(g->dv.data);
    memset(g, 0, sizeof *g);
}

void problem_free(problem *p)
{
    free(p->q.data), free(p->k.data), free(p->v.data), free(p->out.data), free(p->lse);
    free(p->lens);
    sparse_pattern_free(&p->sparse);
    memset(p, 0, sizeof *p);
}

int problem_sparse(problem *p, const row *r, char *err, size_t n)
{
    if (!r->sparse[0])
        return 0;
    if (sparse_spec_build(r->sparse, &r->d, &p->sparse, err, n) != 0)
        return -1;
    if (!p->mask) {
        sdpa_mask m0 = SDPA_MASK_DEFAULT;
        p->mask_store = m0;
        p->mask = &p->mask_store;
    }
    sparse_pattern_apply(&p->sparse, &p->mask_store);
    return 0;
}

int suite_claims(sdpa_context *ctx, const sdpa_call_desc *d, sdpa_dtype dtype,
                 const char *backend, char *why, size_t n)
{
    static _Thread_local sdpa_decision dec;
    sdpa_call_desc c = *d;
    c.dtype = dtype, c.backend = backend;
    if (sdpa_decide(ctx, &c, &dec) != SDPA_OK) {
        snprintf(why, n, "%s", sdpa_last_error());
        return 0;
    }
    if (dec.n_candidates == 1)
        return 1;
    /* "X (backend=X on the call) cannot run this call: REASON" -> REASON */
    const char *r = strstr(dec.error, "cannot run this call: ");
    snprintf(why, n, "%s", r ? r + strlen("cannot run this call: ") : dec.error);
    return 0;
}

static struct {
    char backend[32], why[224];
    int rows;
} unclaimed[64];
static int n_unclaimed;

void suite_note_unclaimed(const char *backend, const char *why)
{
    for (int i = 0; i < n_unclaimed; i++)
        if (strcmp(unclaimed[i].backend, backend) == 0 && strcmp(unclaimed[i].why, why) == 0) {
            unclaimed[i].rows++;
            return;
        }
    if (n_unclaimed == (int)(sizeof unclaimed / sizeof *unclaimed))
        return;
    snprintf(unclaimed[n_unclaimed].backend, sizeof unclaimed[0].backend, "%s", backend);
    snprintf(unclaimed[n_unclaimed].why, sizeof unclaimed[0].why, "%s", why);
    unclaimed[n_unclaimed++].rows = 1;
}

void suite_json_string(const char *s)
{
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p == '"' || *p == '\\')
            printf("\\%c", *p);
        else if (*p < 0x20)
            printf("\\u%04x", *p);
        else
            putchar(*p);
    putchar('"');
}

void suite_print_unclaimed(int json)
{
    for (int i = 0; i < n_unclaimed; i++) {
        if (json) {
            printf("{\"backend\":");
            suite_json_string(unclaimed[i].backend);
            printf(",\"not_run_rows\":%d,\"reason\":", unclaimed[i].rows);
            suite_json_string(unclaimed[i].why);
            printf("}\n");
        } else {
            printf("# not run: %s on %d row%s: %s\n", unclaimed[i].backend, unclaimed[i].rows,
                   unclaimed[i].rows == 1 ? "" : "s", unclaimed[i].why);
        }
    }
    n_unclaimed = 0;
}
