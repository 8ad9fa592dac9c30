/*
 * store_elem.cuh - one output element in the caller's dtype, for the CUDA
 * kernels (cuda.unfused, cuda.flash; also compiled under the tests' SIMT
 * emulator, which supplies the bf16/half types).
 */
#ifndef SDPA_STORE_ELEM_CUH
#define SDPA_STORE_ELEM_CUH

static __device__ void store_elem(void *p, int dtype, int64_t i, float v)
{
    if (dtype == SDPA_F32)
        ((float *)p)[i] = v;
    else if (dtype == SDPA_BF16)
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else
        ((__half *)p)[i] = __float2half_rn(v);
}

#endif
