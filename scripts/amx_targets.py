#!/usr/bin/env python3
"""The AMX work's targets, each as met or missed with its figure, from the
raw files scripts/amx-check.sh wrote (passed on the command line; what each
is comes from its name):

  *-amx-grid-*          test_grid cpu.amx on real tiles
  *-sdpa-bench-*        sdpa bench (diffusion-cpu, smoke, padding-cpu; bf16, f16)
  *-amx-cost-*          bench_amx_cost (cycles per score outside the tiles)
  *-peers-*             bench/peers (the dispatcher's choice against PyTorch, oneDNN)
  *-dit-flux-*          python -m libsdpa.bench --dit-only

Long rows: Sq and Skv of 2000 or more. "regret": the dispatcher's choice's
median time over the fastest backend's in the same run, minus 1. With
--quick the figures come from one round of the smoke suite: printed, but
they say nothing about the targets.
"""
import re
import sys


def sdpa_bench(path):
    """[(row, Sq, Skv, D, backend, median_ms, pct_peak, winner, chosen)]"""
    out = []
    for line in open(path):
        if line.startswith("#") or line.startswith("row "):
            continue
        f = line.split()
        if len(f) < 14:
            continue
        try:
            out.append((f[0], int(f[2]), int(f[3]), int(f[6]), f[8], float(f[9]),
                        float(f[13].rstrip("%")), "winner" in f[16:], "chosen" in f[16:]))
        except (ValueError, IndexError):
            continue
    return out


def regrets(rows):
    """{row: (chosen, regret)} for the rows with a choice among the backends run.
    Rows whose fastest median is under 0.01 ms (smoke's one-element call,
    printed as 0.000-0.001) are left out: at three decimals their ratios
    are rounding, and a 0.000 would divide by zero."""
    by = {}
    for r in rows:
        by.setdefault(r[0], []).append(r)
    out = {}
    for name, rs in by.items():
        chosen = [r for r in rs if r[8]]
        best = min(r[5] for r in rs)
        if chosen and best >= 0.01:
            out[name] = (chosen[0][4], chosen[0][5] / best - 1)
    return out


def main(argv):
    quick = "--quick" in argv
    paths = [a for a in argv if a != "--quick"]
    results = []  # (met: bool or None, text)

    def target(ok, text):
        results.append((ok, text))

    for p in paths:
        name = p.rsplit("/", 1)[-1]
        if "-amx-grid-" in name:
            last = [l for l in open(p) if re.match(r"\d+ passed, \d+ failed", l)]
            m = re.match(r"(\d+) passed, (\d+) failed", last[-1]) if last else None
            target(bool(m) and m[2] == "0",
                   f"test grid of cpu.amx on real tiles: {last[-1].strip() if last else 'no summary line'}")
        elif "-sdpa-bench-" in name:
            rows = sdpa_bench(p)
            dtype = "f16" if "-f16" in name else "bf16"
            if "diffusion-cpu" in name:
                amx = [r for r in rows if r[4] == "cpu.amx"]
                for dims, goal, label in (((128,), 35.0, "D = 128"), ((64, 72), 25.0, "D = 64/72")):
                    long_ = [r for r in amx if r[3] in dims and r[1] >= 2000 and r[2] >= 2000]
                    if long_:
                        worst = min(long_, key=lambda r: r[6])
                        target(worst[6] >= goal,
                               f"cpu.amx >= {goal:.0f}% of the TDPBF16PS ceiling on every {label} "
                               f"long row: {min(r[6] for r in long_):.1f}-{max(r[6] for r in long_):.1f}% "
                               f"(lowest {worst[0]})")
                cross = [r for r in amx if r[0] == "sdxl-cross"]
                if cross:
                    target(cross[0][6] >= 12.0,
                           f"cpu.amx >= 12% on SDXL's 77-key cross row: {cross[0][6]:.1f}%")
            reg = regrets(rows)
            if reg:
                worst = max(reg.items(), key=lambda kv: kv[1][1])
                suite = re.search(r"sdpa-bench-(.*)-(bf16|f16)", name)[1]
                note = ""
                if dtype == "f16":
                    note = (" (f16 calls go to kernels with fp32 arithmetic by default: cpu.amx "
                            "and cpu.avx512bf16 round f16 inputs to bf16; see README)")
                target(worst[1][1] <= 0.03,
                       f"regret <= 3% in {dtype} on {suite}: worst {worst[1][1] * 100:+.1f}% on "
                       f"{worst[0]} ({worst[1][0]} chosen){note}")
        elif "-amx-cost-" in name:
            for line in open(p):
                if line.startswith("#") or line.startswith("row "):
                    continue
                f = line.split()
                if len(f) < 11:
                    continue
                sq, skv, d, cyc, goal = int(f[2]), int(f[3]), int(f[6]), float(f[8]), float(f[9])
                if sq >= 2000 and skv >= 2000:
                    target(cyc <= goal, f"outside the tiles <= {goal} cycle per score on {f[0]} "
                                        f"(D = {d}): {cyc:.3f}")
        elif "-peers-" in name:
            behind, slow = [], []
            for line in open(p):
                m = re.match(r"# (\S+)\s+(\S+)\s+torch\s+([\d.]+)x(.*)regret\s+([+-][\d.]+)%", line)
                if not m:
                    continue
                row, choice, torch_x, rest, regret = m[1], m[2], float(m[3]), m[4], float(m[5])
                peers = [float(x) for x in re.findall(r"([\d.]+)x", rest)] + [torch_x]
                if min(peers) < 1.0:
                    behind.append(row)
                slow.append((row, torch_x, regret, choice))
            long_rows = {r[0] for r in sdpa_bench_rows_long()}
            long_ = [s for s in slow if s[0] in long_rows]
            if long_:
                w = min(long_, key=lambda s: s[1])
                target(w[1] >= 2.0, f"the bf16 choice >= 2.0x PyTorch's bf16 SDPA on every long row: "
                                    f"{min(s[1] for s in long_):.2f}-{max(s[1] for s in long_):.2f}x "
                                    f"(lowest {w[0]})")
            target(not behind, "the bf16 choice ahead of every peer on every row: " +
                   ("yes" if not behind else "behind on " + ", ".join(behind)))
            if slow:
                w = max(slow, key=lambda s: s[2])
                target(w[2] <= 3.0, f"regret <= 3% in bf16 (peers): worst {w[2]:+.1f}% on {w[0]} "
                                    f"({w[3]} chosen)")
        elif "-dit-flux-" in name:
            for line in open(p):
                m = re.match(r"native ([\d.]+) ms, libsdpa ([\d.]+) ms: libsdpa ([\d.]+)x native", line)
                if m:
                    target(float(m[3]) > 1.0, f"FLUX-shaped diffusers transformer faster than native "
                                              f"in bf16: {m[3]}x ({m[2]} vs {m[1]} ms)")
    print(f"# amx_targets: {len(paths)} files" + (" (--quick: one round of smoke, not a measurement)"
                                                  if quick else ""))
    for ok, text in results:
        print(f"{'met   ' if ok else 'MISSED'} {text}")
    met = sum(1 for ok, _ in results if ok)
    print(f"# {met} of {len(results)} targets met")
    return 0


def sdpa_bench_rows_long():
    """The long rows of bench/shapes/diffusion-cpu.tsv (Sq and Skv of 2000 or more)."""
    import os
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench", "shapes",
                        "diffusion-cpu.tsv")
    out = []
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        f = line.split("\t")
        if int(f[2]) >= 2000 and int(f[3]) >= 2000:
            out.append((f[0],))
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
