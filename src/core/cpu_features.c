/* cpu_features.c - the CPU feature and ISA level tables and their readers
 * (cpu_features.h). */
#include "cpu_features.h"
#include "core.h"

#include <stdio.h>
#include <string.h>

const sdpa_cpu_feature sdpa__cpu_feature_table[] = {
    {SDPA_CPU_AVX2, "avx2", NULL, "AVX2+FMA", SDPA_ARCH_X86_64},
    {SDPA_CPU_AVX512F, "avx512", NULL, "AVX-512", SDPA_ARCH_X86_64},
    /* "avx512-bf16": the name sdpa_measure_ceiling took before 0.2 */
    {SDPA_CPU_AVX512BF16, "avx512bf16", "avx512-bf16", "AVX512-BF16", SDPA_ARCH_X86_64},
    {SDPA_CPU_AVX512FP16, "avx512fp16", NULL, "AVX512-FP16", SDPA_ARCH_X86_64},
    {SDPA_CPU_AMX_BF16, "amx-bf16", "amx", "AMX-BF16", SDPA_ARCH_X86_64},
    {SDPA_CPU_NEON, "neon", NULL, "NEON", SDPA_ARCH_AARCH64},
};
const size_t sdpa__cpu_feature_count =
    sizeof sdpa__cpu_feature_table / sizeof *sdpa__cpu_feature_table;

#define X86_AVX2 SDPA_CPU_AVX2
#define X86_AVX512 (X86_AVX2 | SDPA_CPU_AVX512F) /* fp32 AVX-512: no bf16/fp16 arithmetic */
#define X86_AVX512BF16 (X86_AVX512 | SDPA_CPU_AVX512BF16 | SDPA_CPU_AVX512FP16)
const sdpa_isa_level sdpa__isa_level_table[] = {
    {"portable", NULL, 0},
    {"avx2", SDPA_ARCH_X86_64, X86_AVX2},
    {"avx512", SDPA_ARCH_X86_64, X86_AVX512},
    {"avx512bf16", SDPA_ARCH_X86_64, X86_AVX512BF16},
    {"amx", SDPA_ARCH_X86_64, X86_AVX512BF16 | SDPA_CPU_AMX_BF16},
    {"neon", SDPA_ARCH_AARCH64, SDPA_CPU_NEON},
};
const size_t sdpa__isa_level_count = sizeof sdpa__isa_level_table / sizeof *sdpa__isa_level_table;

const char *sdpa__build_arch(void)
{
#if defined(__x86_64__)
    return SDPA_ARCH_X86_64;
#elif defined(__aarch64__)
    return SDPA_ARCH_AARCH64;
#else
    return "other";
#endif
}

const sdpa_cpu_feature *sdpa__cpu_feature(unsigned bit)
{
    for (size_t i = 0; i < sdpa__cpu_feature_count; i++)
        if (sdpa__cpu_feature_table[i].bit == bit)
            return &sdpa__cpu_feature_table[i];
    return NULL;
}

const sdpa_cpu_feature *sdpa__cpu_feature_named(const char *name)
{
    for (size_t i = 0; i < sdpa__cpu_feature_count; i++) {
        const sdpa_cpu_feature *f = &sdpa__cpu_feature_table[i];
        if (strcmp(f->name, name) == 0 || (f->alias && strcmp(f->alias, name) == 0))
            return f;
    }
    return NULL;
}

const char *sdpa__cpu_features_arch(unsigned bits)
{
    for (size_t i = 0; i < sdpa__cpu_feature_count; i++)
        if (bits & sdpa__cpu_feature_table[i].bit)
            return sdpa__cpu_feature_table[i].arch;
    return NULL;
}

int sdpa__cpu_features_parse(char *list, const char *seps, unsigned *out, const char **bad)
{
    *out = 0;
    char *save = NULL;
    for (char *w = strtok_r(list, seps, &save); w; w = strtok_r(NULL, seps, &save)) {
        const sdpa_cpu_feature *f = sdpa__cpu_feature_named(w);
        if (!f) {
            *bad = w;
            return 0;
        }
        *out |= f->bit;
    }
    return 1;
}

char *sdpa__cpu_features_names(unsigned bits, const char *sep, char *buf, size_t n)
{
    size_t len = 0;
    if (n)
        buf[0] = '\0';
    for (size_t i = 0; i < sdpa__cpu_feature_count && len < n; i++)
        if (bits & sdpa__cpu_feature_table[i].bit)
            len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? sep : "",
                                    sdpa__cpu_feature_table[i].name);
    return buf;
}

/* "a, b, c or d" of count names read through `name_of`. */
static char *expected_list(size_t count, const char *(*name_of)(size_t), char *buf, size_t n)
{
    size_t len = 0;
    if (n)
        buf[0] = '\0';
    for (size_t i = 0; i < count && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%s",
                                i == 0 ? "" : i + 1 == count ? " or " : ", ", name_of(i));
    return buf;
}

static const char *feature_name(size_t i) { return sdpa__cpu_feature_table[i].name; }
static const char *level_name(size_t i) { return sdpa__isa_level_table[i].name; }

char *sdpa__cpu_features_expected(char *buf, size_t n)
{
    return expected_list(sdpa__cpu_feature_count, feature_name, buf, n);
}

const sdpa_isa_level *sdpa__isa_level(const char *name)
{
    for (size_t i = 0; i < sdpa__isa_level_count; i++)
        if (strcmp(sdpa__isa_level_table[i].name, name) == 0)
            return &sdpa__isa_level_table[i];
    return NULL;
}

char *sdpa__isa_levels_expected(char *buf, size_t n)
{
    return expected_list(sdpa__isa_level_count, level_name, buf, n);
}
