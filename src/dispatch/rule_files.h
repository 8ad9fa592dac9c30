/*
 * rule_files.h - the context's rule files (rule_files.c): the built-in
 * rules, the machine's wisdom and user rule files, installed in front of
 * the rules already there.
 */
#ifndef SDPA_RULE_FILES_H
#define SDPA_RULE_FILES_H

#include "context.h"

/* Parses rule text and puts it in front of the context's rules
 * (rule_files.c); a tuned file made elsewhere is refused. */
sdpa_status sdpa__ctx_install_policy(sdpa_context *ctx, const char *text, const char *origin);

struct sdpa_env;
/* Loads this machine's wisdom as the snapshot says (rule_files.c). */
void sdpa__ctx_load_wisdom(sdpa_context *ctx, const struct sdpa_env *env);

#endif
