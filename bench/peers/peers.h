/*
 * peers.h - what libsdpa_peers.so offers bench/peers/peers.py (ctypes
 * mirrors these). Tensors are contiguous BSHD; dtype / bf16: 0 f32, 1 bf16
 * for q, k, v and out alike. A run returns seconds per call over `calls`
 * back-to-back calls, or -1 with peers_last_error() saying why.
 */
#ifndef SDPA_BENCH_PEERS_H
#define SDPA_BENCH_PEERS_H

#include <stdint.h>

const char *peers_last_error(void);

/* libsdpa: backend NULL is the dispatcher's choice (then named by
 * peers_libsdpa_choice), else that backend. */
double peers_libsdpa(const char *backend, const void *q, const void *k, const void *v, void *out,
                     int64_t B, int64_t Sq, int64_t Skv, int64_t Hq, int64_t Hkv, int64_t D,
                     int dtype, int threads, int calls);
const char *peers_libsdpa_choice(void);
/* Its backward pass: out (inputs' dtype) and lse (float32 [B, Hq, Sq]) of
 * the forward, dout, into dq, dk, dv (inputs' dtype); the choice as above. */
double peers_libsdpa_backward(const char *backend, const void *q, const void *k, const void *v,
                              const void *out, const float *lse, const void *dout, void *dq,
                              void *dk, void *dv, int64_t B, int64_t Sq, int64_t Skv, int64_t Hq,
                              int64_t Hkv, int64_t D, int dtype, int threads, int calls);

/* The unfused peers (peers.c says how each is written). */
double peers_openblas(const float *q, const float *k, const float *v, float *out, int64_t B,
                      int64_t Sq, int64_t Skv, int64_t Hq, int64_t Hkv, int64_t D, int threads,
                      int calls);
double peers_dnnl(const void *q, const void *k, const void *v, void *out, int64_t B, int64_t Sq,
                  int64_t Skv, int64_t Hq, int64_t Hkv, int64_t D, int bf16, int threads,
                  int calls);

/* For the report. */
const char *peers_dnnl_version(void);
const char *peers_openblas_config(void);
char *peers_info_json(int threads); /* sdpa_info JSON; release with peers_free */
void peers_free(void *p);
double peers_ceiling(const char *what, int threads); /* sdpa_measure_ceiling; -1: none */

#endif
