/* info.c - `sdpa info`: the platform, the kernel choice and every backend
 * (the text is the library's, sdpa_info, which the Python package shares). */
#include "commands.h"
#include "tool.h"

#include <string.h>

int cmd_info(int argc, char **argv)
{
    tool_flag f[] = {{"--platform", 1, NULL}, {"--json", 0, NULL}};
    int rc = tool_parse_flags(argc, argv, f, 2);
    if (rc)
        return rc;
    sdpa_context *ctx;
    if ((rc = tool_context(f[0].value, 0, &ctx)) != 0)
        return rc;
    char *text = NULL;
    sdpa_status st = sdpa_info(ctx, f[1].value != NULL, &text);
    if (st == SDPA_OK)
        fputs(text, stdout), f[1].value ? (void)putchar('\n') : (void)0;
    sdpa_free(text);
    sdpa_context_destroy(ctx);
    return st == SDPA_OK ? 0 : tool_lib_error("info", st);
}
