/*
 * policy.c - parse and match policy rules.
 *
 * A rule file is a list of stanzas; the first rule whose every condition
 * holds names the backends to try, in order:
 *
 *     rule blackwell-cudnn
 *     device      cuda
 *     cc          10.x
 *     dtype       f16 bf16     (q's; kv_dtype: k and v's, which may differ)
 *     causal      none
 *     same_heads  yes
 *     try         cuda.cudnn cuda.flash cuda.unfused
 *     evidence    B200, 11 diffusion shapes: cuDNN 1.1-1.3x over flash
 *
 * Lines starting with '#' are comments. Absent conditions match anything,
 * but for `pass`: a rule without it matches forward calls only (its
 * evidence measured forward calls), `pass backward` backward calls
 * (sdpa_backward), `pass forward backward` both.
 * Every rule needs `try` and `evidence`. Ranges: N, N-M, >=N, <=N, >N, <N;
 * compute capabilities as X.Y or X.x (any minor).
 */
#include "policy.h"
#include "../core/cpu_features.h"

#include <errno.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const sdpa_range any_range = {INT64_MIN, INT64_MAX};

int sdpa__parse_isa_list(char *words, unsigned *out, const char **bad)
{
    return sdpa__cpu_features_parse(words, " \t,", out, bad);
}

void sdpa__isa_list(unsigned isa, char *buf, size_t n)
{
    sdpa__cpu_features_names(isa, " ", buf, n);
    if (!buf[0])
        sdpa__strlcpy(buf, "none", n);
}

static int in_range(sdpa_range r, int64_t v) { return v >= r.lo && v <= r.hi; }
static int is_any(sdpa_range r) { return r.lo == INT64_MIN && r.hi == INT64_MAX; }

/* One value: an integer, or for compute capabilities X.Y / X.x. */
static int parse_atom(const char *s, int is_cc, sdpa_range *out)
{
    char *end;
    if (!isdigit((unsigned char)*s))
        return 0;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    /* Beyond 2^62 no size is real, and ">N" must be able to add one. */
    if (errno == ERANGE || v > (1ll << 62))
        return 0;
    if (!is_cc) {
        if (*end)
            return 0;
        out->lo = out->hi = v;
        return 1;
    }
    if (*end != '.' || v > 99)
        return 0;
    if (strcmp(end + 1, "x") == 0) {
        out->lo = v * 10, out->hi = v * 10 + 9;
        return 1;
    }
    if (!isdigit((unsigned char)end[1]) || end[2] != '\0')
        return 0;
    out->lo = out->hi = v * 10 + (end[1] - '0');
    return 1;
}

static int parse_range(const char *s, int is_cc, sdpa_range *out)
{
    sdpa_range a, b;
    *out = any_range;
    if (strncmp(s, ">=", 2) == 0 && parse_atom(s + 2, is_cc, &a))
        return out->lo = a.lo, 1;
    if (strncmp(s, "<=", 2) == 0 && parse_atom(s + 2, is_cc, &a))
        return out->hi = a.hi, 1;
    if (*s == '>' && parse_atom(s + 1, is_cc, &a))
        return out->lo = a.hi + 1, 1;
    if (*s == '<' && parse_atom(s + 1, is_cc, &a))
        return out->hi = a.lo - 1, 1;
    const char *dash = strchr(s, '-');
    if (dash) {
        char left[64];
        size_t n = (size_t)(dash - s);
        if (n == 0 || n >= sizeof left)
            return 0;
        memcpy(left, s, n);
        left[n] = '\0';
        if (!parse_atom(left, is_cc, &a) || !parse_atom(dash + 1, is_cc, &b) || a.lo > b.hi)
            return 0;
        out->lo = a.lo, out->hi = b.hi;
        return 1;
    }
    if (!parse_atom(s, is_cc, &a))
        return 0;
    *out = a;
    return 1;
}

static int parse_yesno(const char *s, int *out)
{
    if (strcmp(s, "yes") == 0)
        return *out = 1, 1;
    if (strcmp(s, "no") == 0)
        return *out = 0, 1;
    return 0;
}

typedef struct parser {
    const char *origin;
    int line;
    sdpa_name_known_fn known;
    void *user;
} parser;

static sdpa_status perr(const parser *ps, const char *fmt, const char *a, const char *b)
{
    char msg[512];
    snprintf(msg, sizeof msg, fmt, a, b);
    return sdpa__fail(SDPA_INVALID_ARGUMENT, "%s:%d: %s", ps->origin, ps->line, msg);
}

/* Splits `value` into words; returns their count, or -1 if more than max. */
static int split_words(char *value, char **words, int max)
{
    int n = 0;
    for (char *save = NULL, *w = strtok_r(value, " \t,", &save); w;
         w = strtok_r(NULL, " \t,", &save)) {
        if (n == max)
            return -1;
        words[n++] = w;
    }
    return n;
}

static sdpa_status set_key(const parser *ps, sdpa_rule *r, const char *key, char *value)
{
    char raw[256];
    sdpa__strlcpy(raw, value, sizeof raw);
    if (strcmp(key, "evidence") == 0) {
        if (!*value)
            return perr(ps, "evidence is empty; say which measurement justifies the rule%s%s",
                        "", "");
        sdpa__strlcpy(r->evidence, value, sizeof r->evidence);
        return SDPA_OK;
    }
    if (strcmp(key, "class") == 0) { /* free text: what the rule's conditions say, in words */
        if (!*value)
            return perr(ps, "class is empty, expected the shape class in words%s%s", "", "");
        sdpa__strlcpy(r->klass, value, sizeof r->klass);
        return SDPA_OK;
    }
    /* The raw results the evidence cites, and the figures taken from them,
     * in a form tests/dispatch/test_evidence.py recomputes; the dispatcher
     * only checks that they are there. */
    if (strcmp(key, "source") == 0 || strcmp(key, "claim") == 0) {
        if (!*value)
            return perr(ps, "'%s' is empty, expected %s", key,
                        key[0] == 's' ? "a results file" : "a figure and its rows");
        return SDPA_OK;
    }
    char *w[SDPA_MAX_CANDIDATES];
    int n = split_words(value, w, SDPA_MAX_CANDIDATES);
    if (n == 0)
        return perr(ps, "'%s' has no value%s", key, "");
    if (n < 0)
        return perr(ps, "'%s' lists too many values (at most 16)%s", key, "");

    if (strcmp(key, "device") == 0) {
        if (n != 1 || (strcmp(w[0], "cpu") && strcmp(w[0], "cuda")))
            return perr(ps, "device '%s' unknown, expected cpu or cuda%s", raw, "");
        r->device = strcmp(w[0], "cpu") == 0 ? SDPA_DEVICE_CPU : SDPA_DEVICE_CUDA;
    } else if (strcmp(key, "cc") == 0 || strcmp(key, "cudnn") == 0) {
        int is_cc = key[1] == 'c';
        if (n != 1 || !parse_range(w[0], is_cc, is_cc ? &r->cc : &r->cudnn))
            return perr(ps, "'%s' is not a range, expected e.g. %s", raw,
                        is_cc ? "10.x, 9.0, 8.0-9.0 or >=8.0" : "91900, 91000-91001 or >=90000");
    } else if (strcmp(key, "isa") == 0) {
        for (int i = 0; i < n; i++) {
            unsigned bit;
            const char *bad;
            char names[128];
            if (!sdpa__parse_isa_list(w[i], &bit, &bad))
                return perr(ps, "isa '%s' unknown, expected %s", bad,
                            sdpa__cpu_features_expected(names, sizeof names));
            r->isa |= bit;
        }
    } else if (strcmp(key, "vendor") == 0) {
        if (n > 3)
            return perr(ps, "'%s' lists too many vendors (at most 3)%s", raw, "");
        for (int i = 0; i < n; i++) {
            if (strcmp(w[i], "intel") && strcmp(w[i], "amd") && strcmp(w[i], "other"))
                return perr(ps, "vendor '%s' unknown, expected intel, amd or other%s", w[i], "");
            sdpa__strlcpy(r->vendor[i], w[i], sizeof r->vendor[i]);
        }
        r->n_vendor = n;
    } else if (strcmp(key, "family") == 0) {
        if (n != 1 || !parse_range(w[0], 0, &r->family))
            return perr(ps, "'%s' is not a family, expected a CPUID display family or range, "
                            "e.g. 25 (AMD Zen 3 and Zen 4) or 6 (Intel cores)%s", raw, "");
    } else if (strcmp(key, "arch") == 0) {
        if (n > 2)
            return perr(ps, "'%s' lists too many architectures (at most 2)%s", raw, "");
        for (int i = 0; i < n; i++) {
            size_t f = 0; /* an architecture is one the feature table names */
            while (f < sdpa__cpu_feature_count && strcmp(sdpa__cpu_feature_table[f].arch, w[i]))
                f++;
            if (f == sdpa__cpu_feature_count)
                return perr(ps, "arch '%s' unknown, expected " SDPA_ARCH_X86_64 " or "
                                SDPA_ARCH_AARCH64 "%s", w[i], "");
            sdpa__strlcpy(r->arch[i], w[i], sizeof r->arch[i]);
        }
        r->n_arch = n;
    } else if (strcmp(key, "dtype") == 0 || strcmp(key, "kv_dtype") == 0) {
        for (int i = 0; i < n; i++) {
            int t = 0;
            while (t < SDPA_DTYPE_COUNT && strcmp(sdpa_dtype_name((sdpa_dtype)t), w[i]))
                t++;
            if (t == SDPA_DTYPE_COUNT)
                return perr(ps, "%s '%s' unknown, expected f32, f16 or bf16", key, w[i]);
            *(key[0] == 'k' ? &r->kv_dtypes : &r->dtypes) |= 1u << t;
        }
    } else if (strcmp(key, "causal") == 0) {
        for (int i = 0; i < n; i++) {
            int c = 0;
            while (c <= SDPA_CAUSAL_BOTTOM_RIGHT && strcmp(sdpa_causal_name((sdpa_causal)c), w[i]))
                c++;
            if (c > SDPA_CAUSAL_BOTTOM_RIGHT)
                return perr(ps, "causal '%s' unknown, expected none, top-left or bottom-right%s",
                            w[i], "");
            r->causal |= 1u << c;
        }
    } else if (strcmp(key, "mask") == 0) {
        for (int i = 0; i < n; i++) {
            int ok;
            unsigned kind = sdpa__mask_kind_parse(w[i], &ok);
            if (!ok)
                return perr(ps, "mask '%s' unknown, expected none, seq_len, key, general, window or blocks%s",
                            w[i], "");
            r->masks |= kind ? kind << 1 : 1u;
        }
    } else if (strcmp(key, "pass") == 0) {
        r->pass = 0;
        for (int i = 0; i < n; i++) {
            if (strcmp(w[i], "forward") && strcmp(w[i], "backward"))
                return perr(ps, "pass '%s' unknown, expected forward or backward%s", w[i], "");
            r->pass |= w[i][0] == 'f' ? 1 : 2;
        }
    } else if (strcmp(key, "lse") == 0 || strcmp(key, "deterministic") == 0 ||
               strcmp(key, "same_seq") == 0 || strcmp(key, "same_heads") == 0) {
        int *dst = key[0] == 'l' ? &r->lse
                   : key[0] == 'd' ? &r->deterministic
                   : key[5] == 's' ? &r->same_seq
                                   : &r->same_heads;
        if (n != 1 || !parse_yesno(w[0], dst))
            return perr(ps, "'%s' for %s, expected yes or no", raw, key);
    } else if (strcmp(key, "quant") == 0 || strcmp(key, "component") == 0) {
        int is_quant = key[0] == 'q';
        if (n > SDPA_RULE_LIST)
            return perr(ps, "'%s' lists too many values (at most 8)%s", key, "");
        for (int i = 0; i < n; i++) {
            if (is_quant)
                sdpa__strlcpy(r->quant[i], w[i], sizeof r->quant[i]);
            else
                sdpa__strlcpy(r->component[i], w[i], sizeof r->component[i]);
        }
        *(is_quant ? &r->n_quant : &r->n_component) = n;
    } else if (strcmp(key, "try") == 0) {
        for (int i = 0; i < n; i++) {
            if (!ps->known(w[i], ps->user))
                return perr(ps, "backend '%s' unknown (see `sdpa info` for the names)%s", w[i],
                            "");
            for (int j = 0; j < i; j++)
                if (strcmp(r->try_names[j], w[i]) == 0)
                    return perr(ps, "backend '%s' listed twice in try%s", w[i], "");
            sdpa__strlcpy(r->try_names[i], w[i], sizeof r->try_names[i]);
        }
        r->n_try = n;
        return SDPA_OK; /* not a condition */
    } else {
        static const char *dims[] = {"B", "Sq", "Skv", "Hq", "Hkv", "D"};
        sdpa_range *dst[] = {&r->B, &r->Sq, &r->Skv, &r->Hq, &r->Hkv, &r->D};
        int i = 0;
        while (i < 6 && strcmp(dims[i], key))
            i++;
        if (i == 6)
            return perr(ps, "unknown key '%s' (expected device, cc, cudnn, arch, isa, vendor, family, dtype, "
                            "kv_dtype, causal, mask, pass, lse, deterministic, quant, component, B, Sq, "
                            "Skv, Hq, Hkv, D, same_seq, same_heads, try, evidence, class, source "
                            "or claim)%s",
                        key, "");
        if (i == 5 && n > 1) { /* D: a set */
            if (n > SDPA_RULE_LIST)
                return perr(ps, "'%s' lists too many values for D (at most 8)%s", raw, "");
            for (int j = 0; j < n; j++)
                if (!parse_range(w[j], 0, &r->D_set[j]))
                    return perr(ps, "'%s' is not a value or range for D, expected N or N-M "
                                    "(a list: D 64 72 128)",
                                w[j], "");
            r->n_D = n;
        } else if (n != 1 || !parse_range(w[0], 0, dst[i])) {
            return perr(ps, "'%s' is not a range for %s, expected N, N-M, >=N or <=N", raw, key);
        }
    }
    size_t len = strlen(r->conditions);
    snprintf(r->conditions + len, sizeof r->conditions - len, "%s%s=%s", len ? " " : "", key,
             raw);
    return SDPA_OK;
}

static void rule_init(sdpa_rule *r, const char *name, const parser *ps)
{
    memset(r, 0, sizeof *r);
    sdpa__strlcpy(r->name, name, sizeof r->name);
    snprintf(r->origin, sizeof r->origin, "%s:%d", ps->origin, ps->line);
    r->device = -1;
    r->pass = 1; /* forward only: a rule's evidence measured the forward */
    r->lse = r->deterministic = r->same_seq = r->same_heads = -1;
    r->cc = r->cudnn = r->B = r->Sq = r->Skv = r->Hq = r->Hkv = r->D = r->family = any_range;
}

static sdpa_status rule_finish(const parser *ps, const sdpa_rule *r)
{
    if (r->n_try == 0)
        return sdpa__fail(SDPA_INVALID_ARGUMENT, "%s: rule '%s' has no 'try' line", r->origin,
                          r->name);
    if (!r->evidence[0])
        return sdpa__fail(SDPA_INVALID_ARGUMENT,
                          "%s: rule '%s' has no 'evidence' line (every rule says which "
                          "measurement justifies it)",
                          r->origin, r->name);
    (void)ps;
    return SDPA_OK;
}

/* require libsdpa X.Y.Z | require cpu-model NAME... | require cpu-isa LIST */
static sdpa_status parse_require(const parser *ps, sdpa_policy *pol, char *value)
{
    char *what = value;
    while (*value && !isspace((unsigned char)*value))
        value++;
    if (*value)
        *value++ = '\0';
    while (isspace((unsigned char)*value))
        value++;
    if (!pol->req_line)
        pol->req_line = ps->line;
    if (!*value)
        return perr(ps, "'require %s' has no value%s", what, "");
    if (strcmp(what, "libsdpa") == 0) {
        sdpa__strlcpy(pol->req_version, value, sizeof pol->req_version);
    } else if (strcmp(what, "cpu-model") == 0) {
        sdpa__strlcpy(pol->req_cpu_model, value, sizeof pol->req_cpu_model);
    } else if (strcmp(what, "cpu-isa") == 0) {
        const char *bad = "";
        char names[128];
        if (strcmp(value, "none") != 0 && !sdpa__parse_isa_list(value, &pol->req_isa, &bad))
            return perr(ps, "require cpu-isa: '%s' unknown, expected none or %s", bad,
                        sdpa__cpu_features_expected(names, sizeof names));
        pol->has_req_isa = 1;
    } else {
        return perr(ps, "'require %s' unknown, expected libsdpa, cpu-model or cpu-isa%s", what,
                    "");
    }
    return SDPA_OK;
}

sdpa_status sdpa__policy_parse(const char *text, const char *origin, sdpa_name_known_fn known,
                               void *user, sdpa_policy **out)
{
    *out = NULL;
    parser ps = {origin, 0, known, user};
    sdpa_policy *pol = sdpa__calloc(1, sizeof *pol);
    if (!pol)
        return sdpa__fail(SDPA_OUT_OF_MEMORY, "%s: cannot allocate rules", origin);
    int cap = 0;
    sdpa_status st = SDPA_OK;
    const char *p = text;
    while (*p && st == SDPA_OK) {
        ps.line++;
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        char line[1024];
        if (len >= sizeof line) {
            st = perr(&ps, "line longer than %s characters%s", "1023", "");
            break;
        }
        memcpy(line, p, len);
        line[len] = '\0';
        p = eol ? eol + 1 : p + len;

        char *s = line;
        while (isspace((unsigned char)*s))
            s++;
        char *e = s + strlen(s);
        while (e > s && isspace((unsigned char)e[-1]))
            *--e = '\0';
        if (*s == '\0' || *s == '#')
            continue;
        char *key = s;
        while (*s && !isspace((unsigned char)*s))
            s++;
        if (*s)
            *s++ = '\0';
        while (isspace((unsigned char)*s))
            s++;

        if (strcmp(key, "rule") == 0) {
            if (pol->n > 0 && (st = rule_finish(&ps, &pol->rules[pol->n - 1])) != SDPA_OK)
                break;
            if (!*s || strpbrk(s, " \t")) {
                st = perr(&ps, "'rule' needs one name without spaces, got '%s'%s", s, "");
                break;
            }
            if (strlen(s) >= sizeof pol->rules[0].name) {
                char limit[64];
                snprintf(limit, sizeof limit, "%zu characters, expected at most %zu",
                         strlen(s), sizeof pol->rules[0].name - 1);
                st = perr(&ps, "rule name '%s' has %s", s, limit);
                break;
            }
            for (int i = 0; i < pol->n; i++)
                if (strcmp(pol->rules[i].name, s) == 0) {
                    st = perr(&ps, "rule '%s' already defined at %s", s, pol->rules[i].origin);
                    break;
                }
            if (st != SDPA_OK)
                break;
            if (pol->n == cap) {
                int ncap = cap ? cap * 2 : 16;
                sdpa_rule *nr = sdpa__realloc(pol->rules, sizeof *nr * (size_t)ncap);
                if (!nr) {
                    st = sdpa__fail(SDPA_OUT_OF_MEMORY, "%s: cannot allocate rules", origin);
                    break;
                }
                pol->rules = nr, cap = ncap;
            }
            rule_init(&pol->rules[pol->n++], s, &ps);
            continue;
        }
        if (pol->n == 0 && strcmp(key, "require") == 0) {
            st = parse_require(&ps, pol, s);
            continue;
        }
        if (pol->n == 0) {
            st = perr(&ps, "'%s' before the first 'rule NAME' line%s", key, "");
            break;
        }
        st = set_key(&ps, &pol->rules[pol->n - 1], key, s);
    }
    if (st == SDPA_OK && pol->n > 0)
        st = rule_finish(&ps, &pol->rules[pol->n - 1]);
    if (st != SDPA_OK) {
        sdpa__policy_free(pol);
        return st;
    }
    *out = pol;
    return SDPA_OK;
}

void sdpa__policy_free(sdpa_policy *pol)
{
    if (!pol)
        return;
    free(pol->rules);
    free(pol);
}

static int in_list(const char (*list)[32], int n, const char *v)
{
    for (int i = 0; i < n; i++)
        if (strcasecmp(list[i], v) == 0)
            return 1;
    return 0;
}

static int in_component_list(const sdpa_rule *r, const char *v)
{
    for (int i = 0; i < r->n_component; i++)
        if (strcmp(r->component[i], v) == 0)
            return 1;
    return 0;
}

/* Whether value is one of the n words of a rule's list line (arch, vendor). */
static int one_of(const char (*list)[16], int n, const char *value)
{
    for (int i = 0; i < n; i++)
        if (strcmp(list[i], value) == 0)
            return 1;
    return 0;
}

int sdpa__rule_matches(const sdpa_rule *r, const sdpa_platform *p, const sdpa_call_desc *d)
{
    if (r->device >= 0 && r->device != (int)d->device)
        return 0;
    if (!is_any(r->cc) || !is_any(r->cudnn)) {
        if (d->device != SDPA_DEVICE_CUDA || !p->cuda_present)
            return 0;
        if (!in_range(r->cc, p->cc_major * 10 + p->cc_minor) ||
            !in_range(r->cudnn, p->cudnn_version))
            return 0;
    }
    if (r->isa && (d->device != SDPA_DEVICE_CPU || (p->cpu_features & r->isa) != r->isa))
        return 0;
    if (r->n_arch && (d->device != SDPA_DEVICE_CPU || !one_of(r->arch, r->n_arch, p->cpu_arch)))
        return 0;
    if (r->n_vendor &&
        (d->device != SDPA_DEVICE_CPU || !one_of(r->vendor, r->n_vendor, p->cpu_vendor)))
        return 0;
    if (!is_any(r->family) &&
        (d->device != SDPA_DEVICE_CPU || !p->cpu_family || !in_range(r->family, p->cpu_family)))
        return 0;
    if (!(r->pass & (d->backward ? 2 : 1)))
        return 0;
    if (r->dtypes && !(r->dtypes & (1u << d->dtype)))
        return 0;
    if (r->kv_dtypes && !(r->kv_dtypes & (1u << sdpa__kv_dtype(d))))
        return 0;
    if (r->masks) {
        const unsigned top = sdpa__mask_kind_top(d->mask);
        if (!(r->masks & (top ? top << 1 : 1u)))
            return 0;
    }
    if (r->causal && !(r->causal & (1u << d->causal)))
        return 0;
    if (r->lse >= 0 && r->lse != (d->want_lse != 0))
        return 0;
    if (r->deterministic >= 0 && r->deterministic != (d->deterministic != 0))
        return 0;
    if (r->same_seq >= 0 && r->same_seq != (d->Sq == d->Skv))
        return 0;
    if (r->same_heads >= 0 && r->same_heads != (d->Hq == d->Hkv))
        return 0;
    if (r->n_quant && !in_list(r->quant, r->n_quant, d->quant && *d->quant ? d->quant : "none"))
        return 0;
    if (r->n_component &&
        !in_component_list(r, d->component && *d->component ? d->component : "none"))
        return 0;
    int d_in_set = r->n_D == 0;
    for (int i = 0; i < r->n_D && !d_in_set; i++)
        d_in_set = in_range(r->D_set[i], d->D);
    return d_in_set && in_range(r->B, d->B) && in_range(r->Sq, d->Sq) &&
           in_range(r->Skv, d->Skv) && in_range(r->Hq, d->Hq) && in_range(r->Hkv, d->Hkv) &&
           in_range(r->D, d->D);
}
