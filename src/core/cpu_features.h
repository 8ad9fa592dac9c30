/*
 * cpu_features.h - the one table of CPU features: each SDPA_CPU_* bit, the
 * name every text uses for it (rule files' `isa` lines, `require cpu-isa`,
 * `sdpa info`, `sdpa explain`, --platform cpu:features=...) and the title
 * sentences use ("this CPU has no AVX-512"). Adding an ISA is one row here.
 */
#ifndef SDPA_CPU_FEATURES_H
#define SDPA_CPU_FEATURES_H

#include "sdpa.h"

#include <stddef.h>

typedef struct sdpa_cpu_feature {
    unsigned bit;      /* SDPA_CPU_*                                       */
    const char *name;  /* canonical, lower case: "avx2", "amx-bf16"        */
    const char *alias; /* also accepted when parsing ("amx"); NULL: none   */
    const char *title; /* for sentences: "AVX2+FMA", "AMX-BF16"            */
} sdpa_cpu_feature;

extern const sdpa_cpu_feature sdpa__cpu_feature_table[];
extern const size_t sdpa__cpu_feature_count;

/* The row of one bit, or NULL. */
const sdpa_cpu_feature *sdpa__cpu_feature(unsigned bit);

/*
 * Parses a list of feature names separated by any of `seps` into bits.
 * Returns 1, or 0 with *bad pointing at the first unknown word (the list
 * is cut there). `list` is modified.
 */
int sdpa__cpu_features_parse(char *list, const char *seps, unsigned *out, const char **bad);

/* Writes the names of the bits set, in table order, joined by `sep`
 * ("" when none). Returns buf. */
char *sdpa__cpu_features_names(unsigned bits, const char *sep, char *buf, size_t n);

/* Writes the accepted names as "a, b, c or d" for error messages. */
char *sdpa__cpu_features_expected(char *buf, size_t n);

#endif
