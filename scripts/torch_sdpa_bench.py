#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention on a shape suite, with its flash and
cuDNN backends side by side: the outside reference for `sdpa bench` on a GPU.

usage: torch_sdpa_bench.py SUITE.tsv    (bf16, BSHD inputs, non-causal rows as given)
Prints one line per (row, backend) with median ms and TFLOP/s, then a summary line.
"""
import statistics
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F


def rows(path):
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        name, B, Sq, Skv, Hq, Hkv, D, causal = line.split("\t")[:8]
        yield name, int(B), int(Sq), int(Skv), int(Hq), int(Hkv), int(D), int(causal)


def main():
    done = 0
    for name, B, Sq, Skv, Hq, Hkv, D, causal in rows(sys.argv[1]):
        if B * Hq * Sq * Skv * D * 4 > 4e14:  # skip rows that take seconds per call
            print(f"{name:20s} skipped (too long for the time budget)")
            continue
        q = torch.randn(B, Hq, Sq, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, Hkv, Skv, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, Hkv, Skv, D, device="cuda", dtype=torch.bfloat16)
        flops = 4 * B * Hq * Sq * Skv * D / (2 if causal and Sq == Skv else 1)
        for label, backend in (("torch.flash", SDPBackend.FLASH_ATTENTION),
                               ("torch.cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                with sdpa_kernel(backend):
                    times = []
                    for i in range(6):
                        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        s.record()
                        F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal),
                                                       enable_gqa=Hq != Hkv)
                        e.record()
                        torch.cuda.synchronize()
                        if i:
                            times.append(s.elapsed_time(e))
                ms = statistics.median(times)
                print(f"{name:20s} {label:12s} {ms:9.3f} ms {flops / ms / 1e9:8.1f} TFLOP/s")
                done += 1
            except RuntimeError as err:
                print(f"{name:20s} {label:12s} refused: {str(err).splitlines()[0][:80]}")
    print(f"{done} (row, backend) timings")


if __name__ == "__main__":
    main()
