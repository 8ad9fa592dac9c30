// The header from C++ (stable-diffusion.cpp and llama.cpp are C++): this
// file only has to compile, with -Wall -Wextra -Werror, and link.
#include "sdpa_ggml.h"

extern "C" int sdpa_ggml_cxx_status(void);
extern "C" int sdpa_ggml_cxx_status(void)
{
    sdpa_ggml_op op;
    sdpa_ggml_op_init(&op, nullptr, 0.0f);
    return op.status;
}
