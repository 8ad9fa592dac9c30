"""python_calls_ab.py LABEL - one arm of a before/after comparison of the
Python per-call cost: torch's SDPA next to libsdpa.attention and a Layer on
the same torch tensors (BHSD, CPU), in one process, 9 interleaved rounds of
2000 calls each, medians. Works with any version of the package (it uses
only the public API), so two builds are compared by their ratios to torch,
each measured in its own process, run alternately:

    for i in 1 2; do
      SDPA_LIBRARY=old/build/libsdpa.so PYTHONPATH=old/python python bench/python_calls_ab.py before
      SDPA_LIBRARY=build/libsdpa.so PYTHONPATH=python python bench/python_calls_ab.py after
    done

`python -m libsdpa.bench --calls` is the fuller per-call benchmark of the
current package (more shapes, numpy, the parts of a call)."""
import statistics
import sys
import time

import torch

import libsdpa

label = sys.argv[1]
torch.set_grad_enabled(False)
sdpa = torch.nn.functional.scaled_dot_product_attention
SHAPES = (("one-token", (1, 1, 1, 32)), ("decode-8x64", (1, 8, 1, 64)),
          ("tokens-16", (1, 8, 16, 64)))  # [B, H, S, D]
for name, shape in SHAPES:
    q, k, v = (torch.rand(*shape) for _ in range(3))
    layer = libsdpa.Layer("ab")
    arms = {"torch": lambda: sdpa(q, k, v),
            "attention": lambda: libsdpa.attention(q, k, v, layout="bhsd"),
            "Layer": lambda: layer(q, k, v, layout="bhsd")}
    t = {a: [] for a in arms}
    for r in range(9):
        for a, f in arms.items():
            t0 = time.perf_counter()
            for _ in range(2000):
                f()
            t[a].append((time.perf_counter() - t0) / 2000 * 1e6)
    m = {a: statistics.median(x) for a, x in t.items()}
    print(f"{label:6} {name:12} torch {m['torch']:6.2f} us  attention {m['attention']:6.2f} us "
          f"({m['torch'] / m['attention']:.2f}x torch)  Layer {m['Layer']:6.2f} us "
          f"({m['torch'] / m['Layer']:.2f}x torch)")
