"""libsdpa's block-sparse attention against PyTorch's compiled CPU
flex_attention on the same BlockMask, side by side in one process.

    build-py/venv/bin/python bench/sparse_flex.py [--tokens 8192] [--reps 5]

Patterns over a T x H x W latent grid (T x 32 x 32 for --tokens 32 T x
32): a 3-D neighbourhood in tokens (NATTEN's clamp) and 128-blocks kept at
random, at block sparsities near 0, 0.5, 0.75 and 0.9, and a 1-D window.
Each pattern is one torch BlockMask (create_block_mask of its mask_mod,
_compile=True), which torch.compile(flex_attention) and libsdpa.attention
(block_mask=, the mask_mod evaluated once per partial block) both take.
Medians of interleaved repetitions after a warm-up call each (torch's
compile is not timed); outputs compared in float64. Backward: libsdpa's
is timed too; torch's compiled CPU flex_attention has no backward pass.
"""
import argparse
import os
import platform
import statistics
import time

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import libsdpa


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def patterns(T, H, W):
    """(name, mask_mod) pairs; coordinates from the row-major token index."""
    def nbhd(wt, wh, ww):
        def start(p, n, w):
            return (p - w // 2).clamp(0, n - w)

        def mod(b, h, q, kv):
            tq, yq, xq = q // (H * W), q // W % H, q % W
            tk, yk, xk = kv // (H * W), kv // W % H, kv % W
            ok = torch.ones_like(q >= 0) & torch.ones_like(kv >= 0)
            for pq, pk, n, w in ((tq, tk, T, wt), (yq, yk, H, wh), (xq, xk, W, ww)):
                if w < n:
                    s = start(pq, n, w)
                    ok = ok & (pk >= s) & (pk < s + w)
            return ok
        return mod

    def random_blocks(keep, seed=7):
        g = torch.Generator().manual_seed(seed)
        n = -(-T * H * W // 128)
        table = torch.rand(n, n, generator=g) < keep

        def mod(b, h, q, kv):
            return table[q // 128, kv // 128]
        return mod

    def window(left, right):
        def mod(b, h, q, kv):
            return (kv >= q - left) & (kv <= q + right)
        return mod

    out = [("dense-map", random_blocks(1.0))]
    out += [(f"random-{k:.2f}", random_blocks(k)) for k in (0.5, 0.25, 0.1)]
    out += [("nbhd-" + "x".join(map(str, w)), nbhd(*w))
            for w in ((T, 23, 23), (max(T // 2, 1), 17, 17), (max(T // 4, 1), 11, 11))]
    S = T * H * W
    out += [(f"window-{S // 8}", window(S // 8, S // 8))]
    return out


def median_ms(fn, reps, times):  # one timed call into times
    t0 = time.perf_counter()
    fn()
    times.append((time.perf_counter() - t0) * 1e3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dtype", default="f32", choices=("f32", "bf16"))
    args = ap.parse_args()
    dt = torch.float32 if args.dtype == "f32" else torch.bfloat16
    T, H, W = max(args.tokens // 1024, 1), 32, 32
    S = T * H * W
    threads = torch.get_num_threads()
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, S, 128, dtype=dt) for _ in range(3))
    flex = torch.compile(flex_attention)
    print(f"# sparse_flex.py  {cpu_model()}  torch {torch.__version__}  libsdpa "
          f"{libsdpa.__version__}  {threads} threads  {args.dtype}  {args.reps} reps "
          f"(interleaved), {time.strftime('%Y-%m-%d')}")
    print(f"# grid {T} x {H} x {W} = {S} tokens, 1 head, D 128, BlockMask 128 x 128; "
          "ms are medians; x flex = flex_ms / libsdpa_ms; x dense = libsdpa dense / sparse")
    print(f"{'pattern':<22} {'density':>7} {'flex_ms':>9} {'libsdpa_ms':>10} {'x flex':>7} "
          f"{'dense_ms':>9} {'x dense':>7} {'bwd_ms':>8} {'max|diff|':>9}")
    dense_times = []
    for name, mod in patterns(T, H, W):
        bm = create_block_mask(mod, None, None, S, S, device="cpu", BLOCK_SIZE=128,
                               _compile=True)
        m = libsdpa.BlockMap.from_torch(bm)  # the mask_mod's bits, once
        density = m.density(S, S)
        got = libsdpa.attention(q, k, v, layout="bhsd", block_mask=bm)
        try:
            want = flex(q, k, v, block_mask=bm)  # warm-up: the compile
            diff = (got.double() - want.double()).abs().max().item()
        except Exception as e:  # Inductor's CPU template failing to compile this mask_mod
            want, diff = None, float("nan")
            print(f"# {name}: torch.compile(flex_attention) failed: "
                  f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
        libsdpa.attention(q, k, v, layout="bhsd")
        tf, tl, td, tb = [], [], [], []
        qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))
        for _ in range(args.reps):
            if want is not None:
                median_ms(lambda: flex(q, k, v, block_mask=bm), args.reps, tf)
            median_ms(lambda: libsdpa.attention(q, k, v, layout="bhsd", block_mask=bm),
                      args.reps, tl)
            median_ms(lambda: libsdpa.attention(q, k, v, layout="bhsd"), args.reps, td)

            def step():
                o = libsdpa.attention(qg, kg, vg, layout="bhsd", block_mask=bm)
                o.sum().backward()
            median_ms(step, args.reps, tb)
        l_, d, b = (statistics.median(x) for x in (tl, td, tb))
        f = statistics.median(tf) if tf else float("nan")
        dense_times.append(d)
        print(f"{name:<22} {density:7.3f} {f:9.1f} {l_:10.1f} {f / l_:7.2f} {d:9.1f} "
              f"{d / l_:7.2f} {b:8.1f} {diff:9.2e}", flush=True)
    print("# bwd_ms: libsdpa's forward + backward through autograd (torch's compiled CPU "
          "flex_attention refuses a backward pass: no row to compare)")


if __name__ == "__main__":
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor-sparse-flex")
    main()
