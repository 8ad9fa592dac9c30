/*
 * fuzz_policy.c - libFuzzer target: the rule-file parser on any bytes.
 * It must return OK or INVALID_ARGUMENT with a message, never crash, hang
 * or trip a sanitizer; a parsed policy must match calls without trouble.
 * Run by scripts/test.sh for a bounded time over tests/fuzz/corpus/policy.
 */
#include "dispatch/policy.h"

#include <stdlib.h>
#include <string.h>

static int known(const char *name, void *user)
{
    (void)user;
    static const char *const names[] = {"ref", "cpu.portable", "cpu.avx512", "cpu.avx2",
                                        "cpu.blas", "cuda.cudnn", "cuda.flash", "cuda.unfused"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strcmp(name, names[i]) == 0)
            return 1;
    return 0;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0'; /* the loader refuses NUL bytes before parsing */
    sdpa_policy *pol = NULL;
    sdpa_status st = sdpa__policy_parse(text, "fuzz.rules", known, NULL, &pol);
    if (st != SDPA_OK && (st != SDPA_INVALID_ARGUMENT || pol || !sdpa_last_error()[0]))
        abort(); /* an error must be INVALID_ARGUMENT with a message and no policy */
    if (pol) {
        sdpa_platform p;
        sdpa_platform_parse("cuda:sm_100", &p);
        sdpa_call_desc d = {.size = sizeof(sdpa_call_desc),
                            .device = SDPA_DEVICE_CUDA, .dtype = SDPA_BF16, .B = 1, .Sq = 4096,
                            .Skv = 4096, .Hq = 24, .Hkv = 24, .D = 128, .component = "transformer"};
        for (int i = 0; i < pol->n; i++)
            (void)sdpa__rule_matches(&pol->rules[i], &p, &d);
        sdpa__policy_free(pol);
    }
    free(text);
    return 0;
}
