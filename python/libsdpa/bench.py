"""python -m libsdpa.bench: libsdpa (the dispatcher's choice and each CPU
backend) next to PyTorch's SDPA, in one process, interleaved, on a shape
suite; and a whole diffusers transformer forward, native vs libsdpa.

    python -m libsdpa.bench [--suite smoke] [--dtype f32|bf16] [--reps 5]
                            [--dit] [--dit-only]
    python -m libsdpa.bench --calls [--reps 9]   # the fixed cost of a call

Figures: medians of --reps rounds, each round running every arm once in a
rotating order; GFLOP/s = 4 B Hq Sq Skv D / time (halved for causal with
Sq == Skv; padded rows count their real keys), % of the fp32 FMA (or, for
bf16-product backends, VDPBF16PS) ceiling measured at the start of the
run; "x torch" is torch's median time over the arm's. Run it with
OMP_WAIT_POLICY=PASSIVE: otherwise torch's OpenMP threads spin after each
of its calls and take the cores from whichever arm runs next. torch's SDPA gets
the same BSHD tensors as libsdpa, transposed to its [B, H, S, D] as
diffusers' native backend passes them. Both use torch.get_num_threads().
"""
import argparse
import datetime
import pathlib
import statistics
import sys
import time

import torch

import libsdpa

_SHAPES = pathlib.Path(libsdpa.__file__).resolve().parent / "shapes"
_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def read_suite(name):
    path = pathlib.Path(name)
    if not path.exists():
        path = _SHAPES / (name if name.endswith(".tsv") else name + ".tsv")
    rows = []
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        f = line.split()
        B, Sq, Skv, Hq, Hkv, D, causal = (int(x) for x in f[1:8])
        pad = int(f[8][11:]) if len(f) > 8 and f[8].startswith("seq_len_kv=") else None
        rows.append((f[0], B, Sq, Skv, Hq, Hkv, D, bool(causal), pad))
    return path, rows


def median_times(arms, reps):
    """arms: name -> zero-argument callable. Each once to warm up, then
    reps rounds in a rotating order; medians in ms."""
    names = list(arms)
    for n in names:
        arms[n]()
    t = {n: [] for n in names}
    for r in range(reps):
        for i in range(len(names)):
            n = names[(i + r) % len(names)]
            t0 = time.perf_counter()
            arms[n]()
            t[n].append((time.perf_counter() - t0) * 1e3)
    return {n: statistics.median(v) for n, v in t.items()}


def bench_suite(args):
    dtype = _DTYPES[args.dtype]
    path, rows = read_suite(args.suite)
    # a ceiling is a maximum: the best of three probes, so that one
    # disturbed probe does not inflate every %peak of the run
    ceil, isa = max(libsdpa.measure_ceiling("fp32") for _ in range(3))
    def best_ceiling(what):
        try:
            return max(libsdpa.measure_ceiling(what)[0] for _ in range(3))
        except libsdpa.NotAvailableError:
            return 0.0

    bf16_ceil, amx_ceil = best_ceiling("avx512bf16"), best_ceiling("amx-bf16")
    info = libsdpa.info()
    backends = [b for b in info["backends"] if b["device"] == "cpu" and b["present"]
                and b["name"] != "ref" and args.dtype in b["dtypes"]]
    print(f"# python -m libsdpa.bench --suite {path.name} --dtype {args.dtype} --reps {args.reps}"
          f"  libsdpa {libsdpa.__version__}, torch {torch.__version__}, {info['cpu']['model']}, "
          f"{torch.get_num_threads()} threads, {datetime.date.today()}")
    print(f"# ceiling: fp32 FMA {ceil:.0f} GFLOP/s ({isa} probe, best of 3, this run)" +
          (f"; VDPBF16PS {bf16_ceil:.0f} GFLOP/s (the %peak of bf16-product backends)"
           if bf16_ceil else "") +
          (f"; TDPBF16PS {amx_ceil:.0f} GFLOP/s (the %peak of cpu.amx)" if amx_ceil else ""))
    # the ceiling of the unit a backend's products run on
    peak_of = {b["name"]: (amx_ceil if "amx-bf16" in b.get("cpu_features", []) else
                           bf16_ceil if b["product_bits"] == 8 else 0.0) or ceil
               for b in backends}
    print(f"{'row':22} {'arm':18} {'median_ms':>10} {'GFLOP/s':>9} {'%peak':>6} {'x torch':>8}")
    for name, B, Sq, Skv, Hq, Hkv, D, causal, pad in rows:
        q = torch.rand(B, Sq, Hq, D).mul(2).sub(1).to(dtype)
        k, v = (torch.rand(B, Skv, Hkv, D).mul(2).sub(1).to(dtype) for _ in range(2))
        lens = None if pad is None else torch.full((B,), pad, dtype=torch.int32)
        tmask = None if pad is None else (torch.arange(Skv) < pad).expand(B, 1, 1, Skv)
        out = torch.empty_like(q)
        kw = dict(is_causal=causal, seq_len_kv=lens, out=out)
        chosen = libsdpa.explain(q, k, v, is_causal=causal, seq_len_kv=lens)["candidates"][0]

        def torch_sdpa():
            torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=tmask,
                is_causal=causal, enable_gqa=Hq != Hkv)

        arms = {"torch sdpa": torch_sdpa,
                f"libsdpa ({chosen})": lambda: libsdpa.attention(q, k, v, **kw)}
        for b in backends:
            arms[b["name"]] = (lambda n: lambda: libsdpa.attention(q, k, v, backend=n, **kw))(
                b["name"])
        with torch.no_grad():
            med = median_times(arms, args.reps)
        flops = 4.0 * B * Hq * Sq * (pad or Skv) * D / (2 if causal and Sq == Skv else 1)
        for arm, ms in med.items():
            peak = peak_of.get(chosen if arm.startswith("libsdpa (") else arm, ceil)
            gf = flops / (ms * 1e6)
            print(f"{name:22} {arm:18} {ms:10.3f} {gf:9.1f} {100 * gf / peak:5.1f}% "
                  f"{med['torch sdpa'] / ms:8.2f}")
        sys.stdout.flush()


# Small calls, where the fixed cost is the cost: torch layout [B, H, S, D] as
# torch's SDPA takes it; name, B, Sq, Skv, H, D.
_CALL_SHAPES = [("one-token", 1, 1, 1, 1, 32), ("decode-8x64", 1, 1, 1, 8, 64),
                ("decode-24x128", 2, 1, 77, 24, 128), ("tokens-16", 1, 16, 16, 8, 64)]


def bench_calls(args, n=1000):
    """Microseconds per call, torch's SDPA next to libsdpa.attention and a
    Layer on the same torch tensors (and on numpy arrays), each arm n calls
    per round, rounds interleaved; plus where a libsdpa call's time goes: the
    same call through the general path (views and structs built per call,
    as every call did before prepared calls), through the prepared call's
    Python hit path (what a source tree without _fastcall runs), and the
    parts of a prepared call measured alone."""
    import ctypes
    import numpy as np
    info = libsdpa.info()
    print(f"# python -m libsdpa.bench --calls --reps {args.reps}  libsdpa {libsdpa.__version__}, "
          f"torch {torch.__version__}, {info['cpu']['model']}, {torch.get_num_threads()} threads, "
          f"{datetime.date.today()}; us per call, medians of {args.reps} interleaved rounds of "
          f"{n} calls")
    print(f"{'shape':15} {'arm':30} {'us/call':>8} {'x torch':>8}")
    for name, B, Sq, Skv, H, D in _CALL_SHAPES:
        q = torch.rand(B, H, Sq, D)
        k, v = torch.rand(B, H, Skv, D), torch.rand(B, H, Skv, D)
        qn, kn, vn = (x.transpose(1, 2).contiguous().numpy() for x in (q, k, v))
        layer = libsdpa.Layer(f"bench.{name}")
        sdpa = torch.nn.functional.scaled_dot_product_attention
        want = sdpa(q, k, v)
        got = {"libsdpa.attention": libsdpa.attention(q, k, v, layout="bhsd"),
               "Layer": layer(q, k, v, layout="bhsd"),
               "numpy": torch.from_numpy(libsdpa.attention(qn, kn, vn)).transpose(1, 2)}
        for arm, o in got.items():  # outputs checked, not timed
            err = (o - want).abs().max().item()
            if err > 1e-5:
                raise SystemExit(f"{name}: {arm} differs from torch's SDPA by {err:.2e}")

        def general():
            libsdpa._PREPARED = False
            try:
                libsdpa.attention(q, k, v, layout="bhsd")
            finally:
                libsdpa._PREPARED = True

        def python_hit_path():  # the prepared call without the C module (a source tree)
            fast, libsdpa._fast_tensor_type = libsdpa._fast_tensor_type, None
            try:
                libsdpa.attention(q, k, v, layout="bhsd")
            finally:
                libsdpa._fast_tensor_type = fast

        def signature():  # the key _prepared builds for a torch call
            return (q.dtype, k.dtype, v.dtype, q.shape, q.stride(), k.shape, k.stride(), v.shape,
                    v.stride(), "bhsd", False, None, None, False, None, None, None)

        plan = libsdpa._tls.state[1][signature()]  # this thread's table (libsdpa._prepared)
        out = torch.empty_like(q)  # the C call alone: copies of the plan's structs, pointing here
        structs = [type(t).from_buffer_copy(t) for t in plan.parts[:4]]
        for t, x in zip(structs, (q, k, v, out)):
            t.data = x.data_ptr()
        rq, rk, rv, ro = (ctypes.byref(t) for t in structs)
        rp, cfn, handle = plan.parts[8:11]
        parts = {
            "torch sdpa": lambda: sdpa(q, k, v),
            "libsdpa.attention": lambda: libsdpa.attention(q, k, v, layout="bhsd"),
            "Layer": lambda: layer(q, k, v, layout="bhsd"),
            "libsdpa.attention (numpy)": lambda: libsdpa.attention(qn, kn, vn),
            "general path": general,
            "Python hit path": python_hit_path,
            "part: signature (Python)": signature,
            "part: output alloc": lambda: torch.empty_like(q),
            "part: C call (ctypes)": lambda: cfn(handle, rq, rk, rv, ro, None, rp),
        }
        def repeat(f):
            # each result dropped before the next call, as a model's layer
            # drops its attention output: a list keeping all n alive made
            # every call fault in fresh pages (torch's and libsdpa's alike:
            # 16 tokens, 32 KB outputs, took 35-40 us a call instead of 14-18)
            def arm():
                for _ in range(n):
                    f()
            return arm

        arms = {a: repeat(f) for a, f in parts.items()}
        with torch.no_grad():
            med = median_times(arms, args.reps)
        for arm, ms in med.items():
            us = ms * 1e3 / n
            ratio = "" if arm.startswith("part") else f"{med['torch sdpa'] / ms:8.2f}"
            print(f"{name:15} {arm:30} {us:8.2f} {ratio:>8}")
        sys.stdout.flush()


def bench_dit(args):
    import diffusers
    import libsdpa.diffusers as ld
    ld.enable()
    dtype = _DTYPES[args.dtype]
    torch.manual_seed(0)
    heads, hd, side, T = 8, 128, 32, 128  # 1024 image + 128 text tokens, width 1024
    model = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=64, num_layers=2, num_single_layers=4, attention_head_dim=hd,
        num_attention_heads=heads, joint_attention_dim=256, pooled_projection_dim=256,
        axes_dims_rope=(16, 56, 56)).eval().to(dtype)
    S = side * side
    ids = torch.zeros(S, 3)
    ids[:, 1], ids[:, 2] = torch.arange(S) // side, torch.arange(S) % side
    inputs = dict(hidden_states=torch.randn(1, S, 64, dtype=dtype),
                  encoder_hidden_states=torch.randn(1, T, 256, dtype=dtype),
                  pooled_projections=torch.randn(1, 256, dtype=dtype),
                  timestep=torch.tensor([0.5], dtype=dtype), img_ids=ids,
                  txt_ids=torch.zeros(T, 3))
    from diffusers.models import attention_dispatch as ad

    # the time each arm spends inside its attention backend, per forward
    # (the registry's entries wrapped: what a forward spends elsewhere is
    # the same model code in both arms)
    registry = ad._AttentionBackendRegistry._backends
    in_attention = {"native": 0.0, "libsdpa": 0.0}
    originals = {}
    for key in list(registry):
        name = str(getattr(key, "value", key))
        if name in in_attention:
            originals[key] = registry[key]

            def timed(*a, _fn=registry[key], _name=name, **kw):
                t0 = time.perf_counter()
                r = _fn(*a, **kw)
                in_attention[_name] += (time.perf_counter() - t0) * 1e3
                return r
            registry[key] = timed

    def forward(backend):
        with ad.attention_backend(backend):
            return model(**inputs).sample

    try:
        with torch.no_grad():
            forward("native"), forward("libsdpa")  # warm up
            for n in in_attention:
                in_attention[n] = 0.0
            med = median_times({"native": lambda: forward("native"),
                                "libsdpa": lambda: forward("libsdpa")}, args.reps)
            per_forward = {n: v / (args.reps + 1) for n, v in in_attention.items()}
            diff = (forward("native").float() - forward("libsdpa").float()).abs().max().item()
    finally:
        registry.update(originals)
    print(f"# diffusers {diffusers.__version__} FluxTransformer2DModel (2 joint + 4 single blocks, "
          f"{heads} heads x {hd}, {S} image + {T} text tokens, random weights), {args.dtype}, "
          f"one forward, {args.reps} interleaved rounds, {torch.get_num_threads()} threads")
    print(f"# attention per forward (inside the backend, mean): native "
          f"{per_forward['native']:.1f} ms, libsdpa {per_forward['libsdpa']:.1f} ms")
    print(f"native {med['native']:.1f} ms, libsdpa {med['libsdpa']:.1f} ms: libsdpa "
          f"{med['native'] / med['libsdpa']:.2f}x native; max |difference| {diff:.2e}")


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m libsdpa.bench", description=__doc__.split("\n")[0])
    p.add_argument("--suite", default="smoke")
    p.add_argument("--dtype", default="f32", choices=sorted(_DTYPES))
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dit", action="store_true", help="also a diffusers transformer forward")
    p.add_argument("--dit-only", action="store_true")
    p.add_argument("--calls", action="store_true", help="only the fixed cost of small calls")
    args = p.parse_args(argv)
    if args.calls:
        bench_calls(args)
        return
    if not args.dit_only:
        bench_suite(args)
    if args.dit or args.dit_only:
        bench_dit(args)


if __name__ == "__main__":
    main()
