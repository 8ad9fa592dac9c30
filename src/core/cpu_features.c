/* cpu_features.c - the CPU feature table and its readers (cpu_features.h). */
#include "cpu_features.h"
#include "core.h"

#include <stdio.h>
#include <string.h>

const sdpa_cpu_feature sdpa__cpu_feature_table[] = {
    {SDPA_CPU_AVX2, "avx2", NULL, "AVX2+FMA"},
    {SDPA_CPU_AVX512F, "avx512", NULL, "AVX-512"},
    {SDPA_CPU_AVX512BF16, "avx512bf16", NULL, "AVX512-BF16"},
    {SDPA_CPU_AVX512FP16, "avx512fp16", NULL, "AVX512-FP16"},
    {SDPA_CPU_AMX_BF16, "amx-bf16", "amx", "AMX-BF16"},
    {SDPA_CPU_NEON, "neon", NULL, "NEON"},
};
const size_t sdpa__cpu_feature_count =
    sizeof sdpa__cpu_feature_table / sizeof *sdpa__cpu_feature_table;

const sdpa_cpu_feature *sdpa__cpu_feature(unsigned bit)
{
    for (size_t i = 0; i < sdpa__cpu_feature_count; i++)
        if (sdpa__cpu_feature_table[i].bit == bit)
            return &sdpa__cpu_feature_table[i];
    return NULL;
}

int sdpa__cpu_features_parse(char *list, const char *seps, unsigned *out, const char **bad)
{
    *out = 0;
    char *save = NULL;
    for (char *w = strtok_r(list, seps, &save); w; w = strtok_r(NULL, seps, &save)) {
        size_t i = 0;
        while (i < sdpa__cpu_feature_count && strcmp(sdpa__cpu_feature_table[i].name, w) != 0 &&
               !(sdpa__cpu_feature_table[i].alias && strcmp(sdpa__cpu_feature_table[i].alias, w) == 0))
            i++;
        if (i == sdpa__cpu_feature_count) {
            *bad = w;
            return 0;
        }
        *out |= sdpa__cpu_feature_table[i].bit;
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

char *sdpa__cpu_features_expected(char *buf, size_t n)
{
    size_t len = 0;
    if (n)
        buf[0] = '\0';
    for (size_t i = 0; i < sdpa__cpu_feature_count && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%s",
                                i == 0 ? "" : i + 1 == sdpa__cpu_feature_count ? " or " : ", ",
                                sdpa__cpu_feature_table[i].name);
    return buf;
}
