/*
 * rules.c - a user rule file: loaded into a context, it decides before the
 * built-in rules where its conditions hold; explain says which rule
 * decided and shows its evidence. (SDPA_POLICY=my.rules does the same for
 * any program, without code.)
 */
#include <sdpa.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    const char *file = argc > 1 ? argv[1] : RULES_FILE;
    sdpa_context *ctx;
    if (sdpa_context_create(NULL, &ctx) != SDPA_OK ||
        sdpa_context_load_policy(ctx, file) != SDPA_OK)
        return fprintf(stderr, "%s\n", sdpa_last_error()), 1;
    int ok = 1;
    const int64_t skv[2] = {77, 4096};
    for (int i = 0; i < 2; i++) {
        /* designated, with .size (what the library reads it as): sdpa_call_desc
         * grows by addition, unnamed fields are 0 */
        sdpa_call_desc call = {.size = sizeof(sdpa_call_desc),
                               .device = SDPA_DEVICE_CPU, .dtype = SDPA_F32, .B = 2, .Sq = 4096,
                               .Skv = skv[i], .Hq = 10, .Hkv = 10, .D = 64};
        sdpa_decision dec;
        if (sdpa_decide(ctx, &call, &dec) != SDPA_OK || dec.n_candidates == 0)
            return fprintf(stderr, "%s\n", sdpa_last_error()), 1;
        printf("Skv = %lld: %s first, by %s '%s'\n", (long long)skv[i], dec.candidates[0],
               sdpa_source_name(dec.source), dec.rule);
        ok &= (i == 0) == (strcmp(dec.rule, "text-cross-portable") == 0);
    }
    sdpa_context_destroy(ctx);
    return ok ? 0 : 1;
}
