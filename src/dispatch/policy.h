/*
 * policy.h - policy rules: data that says which backends to try for which
 * calls, each with the evidence that justifies it. Format: see
 * src/dispatch/default.rules and the README.
 */
#ifndef SDPA_POLICY_H
#define SDPA_POLICY_H

#include "../core/core.h"

typedef struct sdpa_range {
    int64_t lo, hi; /* inclusive; [INT64_MIN, INT64_MAX] matches anything */
} sdpa_range;

#define SDPA_RULE_LIST 8

typedef struct sdpa_rule {
    char name[64];
    char origin[192];     /* "file:line" of the rule line */
    char evidence[512];
    char klass[192];      /* `class`: the shape class in words (tuned rules), or "" */
    char conditions[384]; /* the conditions as written, for explain */
    int device;           /* -1: any */
    sdpa_range cc;        /* compute capability * 10 */
    sdpa_range cudnn;
    unsigned isa;         /* SDPA_CPU_* all required; 0: any */
    int n_vendor;         /* `vendor`: the CPU's maker is one of these; 0: any */
    char vendor[3][16];
    sdpa_range family;    /* `family`: the CPU's CPUID display family (25: Zen 3/4) */
    int n_arch;           /* `arch`: the CPU's architecture is one of these; 0: any */
    char arch[2][16];
    unsigned dtypes;      /* bit per dtype (q's); 0: any */
    unsigned kv_dtypes;   /* `kv_dtype`: bit per k and v's dtype; 0: any */
    unsigned causal;      /* bit per sdpa_causal; 0: any */
    unsigned masks;       /* bit 0: no mask; else the call's most general
                           * SDPA_MASK_KIND_* bit, shifted up by 1; 0: any */
    unsigned pass;        /* bit 0 forward, bit 1 backward (`pass`); without a
                           * `pass` line a rule is for the forward only */
    int lse, deterministic, same_seq, same_heads; /* -1 any, 0 no, 1 yes */
    int n_quant, n_component;
    char quant[SDPA_RULE_LIST][32];
    char component[SDPA_RULE_LIST][48];
    sdpa_range B, Sq, Skv, Hq, Hkv, D;
    int n_D;              /* `D 64 72 128`: a set of values or ranges (D is then any) */
    sdpa_range D_set[SDPA_RULE_LIST];
    int n_try;
    char try_names[SDPA_MAX_CANDIDATES][32];
} sdpa_rule;

typedef struct sdpa_policy {
    int n;
    sdpa_rule *rules;
    /* `require` lines: the machine and library a tuned file was made on. */
    char req_cpu_model[64];
    int has_req_isa;
    unsigned req_isa;
    char req_version[32];
    int req_line; /* first require line, for messages */
} sdpa_policy;

/* Parses an ISA list ("avx2 avx512 amx") into SDPA_CPU_* bits; 0 on an unknown word. */
int sdpa__parse_isa_list(char *words, unsigned *out, const char **bad);
/* Writes the ISA bits as that list. */
void sdpa__isa_list(unsigned isa, char *buf, size_t n);

/* Is `name` a backend this policy may name? */
typedef int (*sdpa_name_known_fn)(const char *name, void *user);

/*
 * Parses rule text. `origin` names the source in messages ("policy.rules").
 * Errors: INVALID_ARGUMENT "origin:line: problem". Backend names are checked
 * with `known`.
 */
sdpa_status sdpa__policy_parse(const char *text, const char *origin, sdpa_name_known_fn known,
                               void *user, sdpa_policy **out);
void sdpa__policy_free(sdpa_policy *pol);

/* Does rule r match this call on platform p? */
int sdpa__rule_matches(const sdpa_rule *r, const sdpa_platform *p, const sdpa_call_desc *d);

/* The built-in rules (default.rules, compiled in). */
extern const char sdpa__default_rules_text[];

#endif
