/*
 * cpu_features.h - the one table of CPU architectures, features and ISA
 * levels. Every text that names one reads it from here: rule files' `isa`
 * and `arch` lines, `require cpu-isa`, SDPA_MAX_ISA, `sdpa info`,
 * `sdpa explain`, --platform cpu:isa=LEVEL / features=LIST, the ceiling
 * probes' names and the sentences ("this CPU has no AVX-512").
 *
 * Adding an architecture or an ISA is rows here: a feature row per new
 * SDPA_CPU_* bit, a level row per new SDPA_MAX_ISA value. Detection of the
 * bit is platform.c's (CPUID on x86-64, the auxiliary vector on aarch64).
 */
#ifndef SDPA_CPU_FEATURES_H
#define SDPA_CPU_FEATURES_H

#include "sdpa.h"

#include <stddef.h>

/* Architectures, as `uname -m` and rule files' `arch` lines spell them. */
#define SDPA_ARCH_X86_64 "x86_64"
#define SDPA_ARCH_AARCH64 "aarch64"

typedef struct sdpa_cpu_feature {
    unsigned bit;      /* SDPA_CPU_*                                       */
    const char *name;  /* canonical, lower case: "avx2", "amx-bf16"        */
    const char *alias; /* also accepted when parsing ("amx"); NULL: none   */
    const char *title; /* for sentences: "AVX2+FMA", "AMX-BF16"            */
    const char *arch;  /* the architecture that has it                     */
} sdpa_cpu_feature;

extern const sdpa_cpu_feature sdpa__cpu_feature_table[];
extern const size_t sdpa__cpu_feature_count;

/*
 * ISA levels (SDPA_MAX_ISA, --platform cpu:isa=LEVEL): the features a
 * level lets the kernels use, every lower level's included. Rows of one
 * architecture run from the lowest up; "portable" (no feature: plain C)
 * is every architecture's lowest.
 */
typedef struct sdpa_isa_level {
    const char *name;  /* "portable", "avx2", ..., "neon"                  */
    const char *arch;  /* NULL: every architecture                         */
    unsigned features; /* SDPA_CPU_* allowed at this level                 */
} sdpa_isa_level;

extern const sdpa_isa_level sdpa__isa_level_table[];
extern const size_t sdpa__isa_level_count;

/* The architecture this library was compiled for ("x86_64", "aarch64",
 * or "other"). */
const char *sdpa__build_arch(void);

/* The CPUs this process may run on: the online ones, or fewer where its
 * affinity mask (taskset, a container's cpuset) or a cgroup's CPU quota
 * (a container's --cpus, a Kubernetes CPU limit: sdpa__cgroup_cpus) holds
 * it to fewer. The default worker count: a pool of every online CPU in a
 * process held to fewer would time-slice its workers (under a quota, be
 * throttled for the rest of each period). */
int sdpa__cpus_allowed(void);

/* Bytes of L2 cache per core (sysconf's _SC_LEVEL2_CACHE_SIZE: glibc
 * reads CPUID leaf 4, or 0x8000001D on AMD), 0 where the system does not
 * say. Read once per process. The tiled kernels size the query rows that
 * share one copy of a K/V block by it (flash_run.h). */
size_t sdpa__cpu_l2_bytes(void);

/* The CPUs a cgroup CPU quota grants the process (quota over period,
 * rounded up; the smallest of its group's and every parent group's), 0
 * where none is set or none can be read. root: where the cgroup file
 * systems are mounted ("/sys/fs/cgroup": v2's unified tree there, v1's
 * controllers under it by name); self_cgroup: the process's memberships
 * ("/proc/self/cgroup"). Parameters so a test can describe a cgroup. */
int sdpa__cgroup_cpus(const char *root, const char *self_cgroup);

/* The row of one bit, or NULL. */
const sdpa_cpu_feature *sdpa__cpu_feature(unsigned bit);

/* The row of a feature name or alias, or NULL. */
const sdpa_cpu_feature *sdpa__cpu_feature_named(const char *name);

/* The architecture of the bits (the first set bit's row), or NULL if none. */
const char *sdpa__cpu_features_arch(unsigned bits);

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

/* The level row named `name`, or NULL. */
const sdpa_isa_level *sdpa__isa_level(const char *name);

/* Writes the level names as "a, b, c or d" for error messages. */
char *sdpa__isa_levels_expected(char *buf, size_t n);

#endif
