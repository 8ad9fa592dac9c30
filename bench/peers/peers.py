"""bench/peers/peers.py: libsdpa next to its peers, in one process,
interleaved, on a shape suite (bench/peers/run.sh builds and runs it).

    python bench/peers/peers.py --lib build/libsdpa_peers.so
        [--suite bench/shapes/diffusion-cpu.tsv] [--dtype f32|bf16]
        [--reps 7] [--max-gflop 6] [--threads N] [--backward] [--cold]

Contenders, on the same BSHD tensors:
  libsdpa       the dispatcher's choice, and each present libsdpa CPU backend
                that takes the dtype (peers.c, timed in C)
  torch         torch.nn.functional.scaled_dot_product_attention on the
                [B, H, S, D] views of those tensors (no copy), timed from
                Python as torch users call it
  openblas      unfused OpenBLAS sgemm + vectorised softmax in 256-row
                blocks (peers.c; f32 only)
  onednn        unfused oneDNN matmul + softmax + matmul in 256-row blocks
                (peers.c; bf16 and f32)

Each row's heads are cut (keeping Hq / Hkv) until one call is at most
--max-gflop GFLOP, so that a round stays short; the report says so. A
round runs every contender once in a rotating order; small calls are
repeated inside one timing so that each timing lasts about 20 ms; the
figures are medians of --reps rounds. GFLOP/s = 4 B Hq Sq Skv D / time
(halved for causal Sq == Skv; padded rows count their real keys, and run
unpadded here: the peers take no masks). Ceilings (libsdpa's fp32 FMA and
VDPBF16PS probes) are measured at the start of the run, best of three
(%peak), and again as one more turn of each row's rotation (%row: each
round's timing over that round's probe, the median over the rounds; a
probe of registers only, so it shows the FMA units taken away, not a
neighbour's use of the caches).

Every contender's first output is checked against torch's float64 SDPA on
the first query head; a contender off by more than its dtype allows is
reported and left out of the ratios.

--backward times the backward pass instead (dq, dk, dv from the output's
gradient, the forward's out and LSE): libsdpa's sdpa_backward (the
dispatcher's choice and each backend with a backward pass, peers.c)
against torch's own backward of F.scaled_dot_product_attention (the
kernel torch dispatches to: its CPU flash-attention backward for these
calls), timed as torch.autograd.grad of the saved graph. GFLOP/s then
counts the backward's five products, 10 B Hq Sq Skv D; dq is checked
against torch's float64 backward on the first query head (dk and dv too
where every query head has its own KV head).

--cold times one call per timing, each after 256 MB of other memory are
read on the calling thread (numpy, so that no torch worker is left
spinning), so K and V come from DRAM, as in a decode step that follows
other layers (sdpa bench --cold does the same on the context's threads).

OpenMP: the OpenBLAS and oneDNN peers and torch each run OpenMP thread
teams; GOMP_SPINCOUNT is set (unless given) so that their idle threads
spin about as long as libsdpa's pool does (50 us) instead of taking the
cores from the next contender for milliseconds.
"""
import os

os.environ.setdefault("GOMP_SPINCOUNT", "10000")  # before torch loads its OpenMP

import argparse
import ctypes
import datetime
import json
import math
import pathlib
import platform
import statistics
import sys
import time

import torch

HERE = pathlib.Path(__file__).resolve().parent


def read_suite(path):
    rows = []
    for line in pathlib.Path(path).read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        f = line.split("\t")
        B, Sq, Skv, Hq, Hkv, D, causal = (int(x) for x in f[1:8])
        pad = int(f[8][11:]) if len(f) > 8 and f[8].startswith("seq_len_kv=") else None
        rows.append(dict(name=f[0], B=B, Sq=Sq, Skv=Skv, Hq=Hq, Hkv=Hkv, D=D, causal=bool(causal),
                         pad=pad))
    return rows


def cut_heads(r, max_gflop):
    """Hq (and Hkv in proportion) cut so that a call is <= max_gflop."""
    g = r["Hq"] // r["Hkv"]
    per_head = 4.0 * r["B"] * r["Sq"] * r["Skv"] * r["D"] / 1e9
    hkv = max(1, min(r["Hkv"], int(max_gflop / (per_head * g))))
    return hkv * g, hkv


def cpu_model():
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


class Peers:
    def __init__(self, path):
        L = self.lib = ctypes.CDLL(str(path))
        i64, vp = ctypes.c_int64, ctypes.c_void_p
        dims = [i64] * 6
        L.peers_libsdpa.argtypes = [ctypes.c_char_p, vp, vp, vp, vp] + dims + [ctypes.c_int] * 3
        L.peers_openblas.argtypes = [vp, vp, vp, vp] + dims + [ctypes.c_int] * 2
        L.peers_dnnl.argtypes = [vp, vp, vp, vp] + dims + [ctypes.c_int] * 3
        L.peers_libsdpa_backward.argtypes = [ctypes.c_char_p] + [vp] * 9 + dims + \
            [ctypes.c_int] * 3
        for f in ("peers_libsdpa", "peers_openblas", "peers_dnnl", "peers_ceiling",
                  "peers_libsdpa_backward"):
            getattr(L, f).restype = ctypes.c_double
        L.peers_ceiling.argtypes = [ctypes.c_char_p, ctypes.c_int]
        for f in ("peers_last_error", "peers_libsdpa_choice", "peers_dnnl_version",
                  "peers_openblas_config"):
            getattr(L, f).restype = ctypes.c_char_p
        L.peers_info_json.restype = ctypes.c_void_p
        L.peers_info_json.argtypes = [ctypes.c_int]
        L.peers_free.argtypes = [ctypes.c_void_p]

    def info(self, threads):
        p = self.lib.peers_info_json(threads)
        if not p:
            raise RuntimeError(self.error())
        try:
            return json.loads(ctypes.string_at(p).decode())
        finally:
            self.lib.peers_free(p)

    def error(self):
        return self.lib.peers_last_error().decode()

    def checked(self, seconds):
        if seconds < 0:
            raise RuntimeError(self.error())
        return seconds


def forward_arms(peers, q, k, v, dims, bf16, T, outs, backends, r, Hq):
    """The forward contenders of one row: {name: run(n) -> seconds per call},
    the dispatcher's choice, and torch's float64 result on the first query
    head (outs[name] receives each contender's output, as a 1-tuple)."""
    L = peers.lib
    B, Sq, Skv, Hq, Hkv, D = dims
    ptr = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731

    def c_arm(name, fn):
        o = torch.empty_like(q)
        outs[name] = (o,)
        return lambda n: peers.checked(fn(o, n))

    arms = {}
    arms["libsdpa"] = c_arm("libsdpa", lambda o, n: L.peers_libsdpa(
        None, ptr(q), ptr(k), ptr(v), ptr(o), *dims, int(bf16), T, n))
    peers.checked(L.peers_libsdpa(None, ptr(q), ptr(k), ptr(v), ptr(outs["libsdpa"][0]), *dims,
                                  int(bf16), T, 1))
    chosen = L.peers_libsdpa_choice().decode()
    for b in backends:
        name = b["name"].encode()
        arms[b["name"]] = c_arm(b["name"], (lambda nm: lambda o, n: L.peers_libsdpa(
            nm, ptr(q), ptr(k), ptr(v), ptr(o), *dims, int(bf16), T, n))(name))
    if not bf16:
        arms["openblas"] = c_arm("openblas", lambda o, n: L.peers_openblas(
            ptr(q), ptr(k), ptr(v), ptr(o), *dims, T, n))
    arms["onednn"] = c_arm("onednn", lambda o, n: L.peers_dnnl(
        ptr(q), ptr(k), ptr(v), ptr(o), *dims, int(bf16), T, n))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

    def torch_arm(n):
        t0 = time.perf_counter()
        for _ in range(n):
            o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt,
                                                                 enable_gqa=Hq != Hkv)
        outs["torch"] = (o.transpose(1, 2),)
        return (time.perf_counter() - t0) / n

    arms["torch"] = torch_arm
    with torch.no_grad():
        for n in list(arms):  # warm-up, and the outputs to check
            try:
                arms[n](1)
            except RuntimeError as e:
                if n != "onednn":
                    raise
                # oneDNN 2.6 has no bf16 matmul without AVX512-BF16 or AMX (Zen 3)
                print(f"{r['name']:22} {Hq:3} onednn: left out, not available here: {e}")
                del arms[n], outs[n]
        # float64 check on head 0 (head 0 reads KV head 0)
        ref = torch.nn.functional.scaled_dot_product_attention(
            qt[:, :1].double(), kt[:, :1].double(), vt[:, :1].double()).transpose(1, 2)
    return arms, chosen, (ref,)


def backward_arms(peers, q, k, v, dims, bf16, T, outs):
    """The backward contenders of one row (see --backward): libsdpa's
    dispatcher and backends with a backward pass, and torch; outs[name]
    receives (dq,) or (dq, dk, dv); the float64 reference likewise."""
    L = peers.lib
    B, Sq, Skv, Hq, Hkv, D = dims
    ptr = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
    gqa = Hq != Hkv
    gen = torch.Generator().manual_seed(2)
    dout = (torch.rand(q.shape, generator=gen) * 2 - 1).to(q.dtype)
    # torch's forward, kept for its backward; its out and LSE feed libsdpa's
    qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
    with torch.enable_grad():
        ot = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=gqa)
    with torch.no_grad():
        kk, vv = (x.transpose(1, 2).repeat_interleave(Hq // Hkv, dim=1) for x in (k, v))
        s = qt.float() @ kk.float().transpose(-1, -2) * D ** -0.5
        lse = torch.logsumexp(s, -1).contiguous()  # [B, Hq, Sq] float32
        del s
    out = ot.detach().transpose(1, 2).contiguous()
    dot = dout.transpose(1, 2)

    def c_arm(name, backend):
        g = [torch.empty_like(x) for x in (q, k, v)]
        outs[name] = tuple(g) if not gqa else (g[0],)
        return lambda n: peers.checked(L.peers_libsdpa_backward(
            backend, ptr(q), ptr(k), ptr(v), ptr(out), ptr(lse), ptr(dout), *map(ptr, g), *dims,
            int(bf16), T, n))

    arms = {"libsdpa": c_arm("libsdpa", None)}
    arms["libsdpa"](1)
    chosen = L.peers_libsdpa_choice().decode()
    info = peers.info(T)
    for b in info["backends"]:
        if (b["device"] == "cpu" and b["present"] and b.get("backward") and
                ("bf16" if bf16 else "f32") in b["dtypes"] and
                b["name"] not in ("ref", "cpu.portable")):
            arms[b["name"]] = c_arm(b["name"], b["name"].encode())

    def torch_arm(n):
        t0 = time.perf_counter()
        for _ in range(n):
            g = torch.autograd.grad(ot, (qt, kt, vt), dot, retain_graph=True)
        per = (time.perf_counter() - t0) / n
        g = [x.transpose(1, 2) for x in g]
        outs["torch"] = tuple(g) if not gqa else (g[0],)
        return per

    arms["torch"] = torch_arm
    for n in arms:  # warm-up, and the gradients to check
        arms[n](1)
    # float64 on head 0 (and its KV head, when it is its own)
    q0, k0, v0 = (x[:, :, :1].double().requires_grad_() for x in (q, k, v))
    with torch.enable_grad():
        o0 = torch.nn.functional.scaled_dot_product_attention(
            q0.transpose(1, 2), k0.transpose(1, 2), v0.transpose(1, 2))
        g0 = torch.autograd.grad(o0, (q0, k0, v0), dout[:, :, :1].double().transpose(1, 2))
    return arms, chosen, (g0 if not gqa else g0[:1])


PROBE = object()  # the ceiling probes' turn in a row's rotation
UNIT_TITLE = {"fp32": "fp32 FMA", "avx512bf16": "VDPBF16PS", "amx-bf16": "TDPBF16PS"}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lib", required=True, help="libsdpa_peers.so (built by CMake)")
    p.add_argument("--suite", default=str(HERE.parent / "shapes" / "diffusion-cpu.tsv"))
    p.add_argument("--dtype", default="f32", choices=("f32", "bf16"))
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--max-gflop", type=float, default=6.0)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--rows", help="comma-separated row names to run (default: all)")
    p.add_argument("--check", action="store_true",
                   help="exit 1 if any contender's output is wrong (CI's smoke run)")
    p.add_argument("--backward", action="store_true",
                   help="time the backward pass: libsdpa's against torch's")
    p.add_argument("--cold", action="store_true",
                   help="K and V from DRAM: 256 MB of other memory read before every timed "
                        "call (one call per timing), as in a decode step after other layers")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    peers = Peers(a.lib)
    L, T = peers.lib, a.threads
    bf16 = a.dtype == "bf16"
    tdtype = torch.bfloat16 if bf16 else torch.float32
    info = peers.info(T)
    ceil = max(L.peers_ceiling(b"fp32", T) for _ in range(3))
    bf16_ceil = max(L.peers_ceiling(b"avx512bf16", T) for _ in range(3))
    amx_ceil = max(L.peers_ceiling(b"amx-bf16", T) for _ in range(3))
    backends = [b for b in info["backends"] if b["device"] == "cpu" and b["present"]
                and a.dtype in b["dtypes"] and b["name"] not in ("ref", "cpu.portable")
                and (b.get("backward") or not a.backward)]
    # Each contender's %peak is of the unit its products run on: AMX tiles
    # (TDPBF16PS) for cpu.amx, VDPBF16PS for the other bf16-product backends,
    # fp32 FMA for the rest. torch's and oneDNN's bf16 paths take AMX where
    # the CPU has it (oneDNN brgemm), else VDPBF16PS where it has that.
    unit = {b["name"]: ("amx-bf16" if "amx-bf16" in b.get("cpu_features", [])
                        else "avx512bf16" if b["product_bits"] == 8 else "fp32")
            for b in backends}
    peer_bf16_unit = ("amx-bf16" if amx_ceil > 0 else "avx512bf16" if bf16_ceil > 0
                      else "fp32")
    ceilings = {"fp32": ceil, "avx512bf16": bf16_ceil, "amx-bf16": amx_ceil}
    print(f"# bench/peers/peers.py --suite {pathlib.Path(a.suite).name} --dtype {a.dtype} "
          f"--reps {a.reps} --max-gflop {a.max_gflop:g}{' --backward' if a.backward else ''}"
          f"{' --cold' if a.cold else ''}, "
          f"{datetime.date.today()}")
    print(f"# CPU {cpu_model()} ({info['cpu']['model']}), {T} threads; libsdpa {info['version']}, "
          f"torch {torch.__version__}, oneDNN {L.peers_dnnl_version().decode()}, "
          f"OpenBLAS {L.peers_openblas_config().decode()}")
    print(f"# ceiling: fp32 FMA {ceil:.0f} GFLOP/s; VDPBF16PS "
          + (f"{bf16_ceil:.0f} GFLOP/s" if bf16_ceil > 0 else "none") + "; TDPBF16PS "
          + (f"{amx_ceil:.0f} GFLOP/s" if amx_ceil > 0 else "none")
          + " (libsdpa probes, best of 3, this run); %peak of cpu.amx is of TDPBF16PS, of the "
          "other bf16-product backends of VDPBF16PS, of the bf16 peers of "
          + {"amx-bf16": "TDPBF16PS", "avx512bf16": "VDPBF16PS", "fp32": "fp32 FMA"}[
              peer_bf16_unit] + ", of the rest fp32 FMA")
    print("# heads cut to keep a call <= %g GFLOP (Hq/Hkv kept); padded rows run unpadded; "
          "torch timed from Python, the rest in C" % a.max_gflop)
    flush = None
    if a.cold:
        # read by numpy on this thread: torch's reduction would leave its
        # OpenMP workers spinning into the next contender's call
        import numpy as np
        flush = np.ones((256 << 20) // 8)
        print("# cold: before every timed call (one call per timing) 256 MB of other memory are "
              "read on the calling thread, so K and V come from DRAM")
    if a.backward:
        print("# backward pass: dq, dk, dv from dout, out and the LSE; GFLOP/s = 10 B Hq Sq "
              "Skv D / time (five products); torch: torch.autograd.grad of its SDPA")
    # the units a contender's products run on, probed again during each row
    probe_units = [u for u in ("fp32", "avx512bf16", "amx-bf16") if ceilings[u] > 0
                   and (u == "fp32" or u in unit.values() or (bf16 and u == peer_bf16_unit))]
    print("# %peak: of the run's best ceiling; %row: of the same ceiling probed in each round "
          "of the row (a round runs every contender once), the median over its rounds (on a "
          "shared host the units' speed drifts)")
    print(f"{'row':22} {'Hq':>3} {'contender':24} {'median_ms':>10} {'GFLOP/s':>8} {'%peak':>6} "
          f"{'%row':>6} {'maxrel':>8}")
    share = []
    wanted = set(a.rows.split(",")) if a.rows else None
    summary, wrong = [], []
    for r in read_suite(a.suite):
        if wanted and r["name"] not in wanted:
            continue
        Hq, Hkv = cut_heads(r, a.max_gflop)
        B, Sq, Skv, D, causal = r["B"], r["Sq"], r["Skv"], r["D"], r["causal"]
        if causal:
            continue  # the peers here are not causal; diffusion rows are not
        gen = torch.Generator().manual_seed(1)
        q = (torch.rand(B, Sq, Hq, D, generator=gen) * 2 - 1).to(tdtype)
        k = (torch.rand(B, Skv, Hkv, D, generator=gen) * 2 - 1).to(tdtype)
        v = (torch.rand(B, Skv, Hkv, D, generator=gen) * 2 - 1).to(tdtype)
        dims = (B, Sq, Skv, Hq, Hkv, D)
        outs = {}
        if a.backward:
            arms, chosen, ref = backward_arms(peers, q, k, v, dims, bf16, T, outs)
        else:
            arms, chosen, ref = forward_arms(peers, q, k, v, dims, bf16, T, outs, backends,
                                             r, Hq)
        names = list(arms)
        one = {n: max(arms[n](1), 1e-6) for n in arms}
        calls = {n: 1 if a.cold else max(1, min(1000, int(0.02 / one[n]))) for n in arms}
        t = {n: [] for n in arms}
        # The ceiling probes take a turn in the same rotation: on a shared
        # host the FMA units' speed drifts over seconds (a busy sibling
        # thread), so each round's timings are also taken against the probe
        # of that round (%row: the median over the rounds; each probe is a
        # best of five, which keeps %row on the low side). %peak stays
        # against the run's best.
        slots = names + [PROBE]
        row_ceil = {u: [] for u in probe_units}
        for rep in range(a.reps):
            for i in range(len(slots)):
                n = slots[(i + rep) % len(slots)]
                if n is PROBE:
                    for u in probe_units:
                        row_ceil[u].append(L.peers_ceiling(u.encode(), T))
                    continue
                if flush is not None:
                    flush.sum()
                t[n].append(arms[n](calls[n]) * 1e3)
        row_pk = {u: statistics.median(v) for u, v in row_ceil.items()}
        flops = (10.0 if a.backward else 4.0) * B * Hq * Sq * Skv * D

        def pct_row(n, u):
            """n's GFLOP/s over unit u's probe in the same round, the median over rounds"""
            return statistics.median(100 * flops / (ms * 1e6) / g
                                     for ms, g in zip(t[n], row_ceil[u]))
        med = {n: statistics.median(v) for n, v in t.items()}
        bad = set()
        # relative to the largest reference value over everything checked
        # (a gradient can be exactly zero: one query against one key has dq = 0)
        ref_scale = max(max(w.abs().max().item() for w in ref), 1e-30)
        for n in names:
            err = max((o[:, :, :1].double() - w).abs().max().item()
                      for o, w in zip(outs[n], ref)) / ref_scale
            tol = (5e-2 if a.backward else 2e-2) if bf16 else 1e-4
            if not err <= tol:
                bad.add(n)
            gf = flops / (med[n] * 1e6)
            u = unit.get(chosen if n == "libsdpa" else n,
                         peer_bf16_unit if n in ("torch", "onednn") and bf16 else "fp32")
            if ceilings[u] <= 0:
                u = "fp32"
            label = f"libsdpa ({chosen})" if n == "libsdpa" else n
            pk, rw = 100 * gf / ceilings[u], pct_row(n, u)
            print(f"{r['name']:22} {Hq:3} {label:24} {med[n]:10.4g} {gf:8.1f} {pk:5.1f}% {rw:5.1f}% "
                  f"{err:8.1e}" + ("  WRONG: left out" if n in bad else ""))
            if n == "libsdpa":
                share.append((r, pk, rw))
        print(f"{r['name']:22}     ceiling during the row: " + ", ".join(
            f"{UNIT_TITLE[u]} median {row_pk[u]:.0f} GFLOP/s ({min(row_ceil[u]):.0f}-"
            f"{max(row_ceil[u]):.0f})" for u in probe_units))
        wrong += [f"{r['name']} ({n})" for n in sorted(bad)]
        ok_peers = [n for n in ("torch", "openblas", "onednn") if n in med and n not in bad]
        # regret: the chosen backend's own arm against the fastest backend
        # arm (so the dispatcher arm's run-to-run noise does not count)
        lib_best = min((n for n in med if n not in bad and n not in ok_peers and n != "libsdpa"),
                       key=lambda n: med[n], default="libsdpa")
        ratios = {n: med[n] / med["libsdpa"] for n in ok_peers}
        regret = med[chosen] / med[lib_best] - 1 if chosen in med and chosen not in bad \
            else float("nan")
        summary.append((r["name"], chosen, ratios, lib_best, regret))
        print(f"{r['name']:22}     choice {chosen}: " +
              ", ".join(f"{ratios[n]:.2f}x {n}" for n in ok_peers) +
              f"; fastest libsdpa backend {lib_best}, regret {100 * regret:+.1f}%")
        sys.stdout.flush()
    print("# summary: the dispatcher's choice against each peer (peer time / choice time; > 1: "
          "libsdpa faster) and its regret (the chosen backend's time / the fastest libsdpa "
          "backend's time - 1, both named explicitly)")
    for name, chosen, ratios, best, regret in summary:
        print(f"# {name:22} {chosen:15} " + " ".join(f"{n} {v:5.2f}x" for n, v in ratios.items())
              + f"  regret {100 * regret:+5.1f}% (fastest {best})")
    long_ = [(pk, rw) for r, pk, rw in share if r["Sq"] >= 2000 and r["Skv"] >= 2000]
    if long_:
        print(f"# the choice on long rows (Sq, Skv >= 2000): {min(p for p, _ in long_):.1f}-"
              f"{max(p for p, _ in long_):.1f}% of the run's best ceiling, "
              f"{min(w for _, w in long_):.1f}-{max(w for _, w in long_):.1f}% of the ceiling "
              "probed in each round (%row)")
    behind = [(n, p) for n, _, rt, _, _ in summary for p, v in rt.items() if v < 1.0]
    print("# rows where a peer is faster: " +
          (", ".join(f"{n} ({p})" for n, p in behind) if behind else "none"))
    print("# wrong outputs: " + (", ".join(wrong) if wrong else "none"))
    if a.check and wrong:
        sys.exit(1)


if __name__ == "__main__":
    main()
