#!/usr/bin/env python3
"""Two builds of `sdpa` on the same rows, interleaved, on one machine.

usage: ab_builds.py OLD_SDPA NEW_SDPA [--suite S]... [--dtype D]... [--backends a,b]
                    [--rounds N] [--reps N] [--cold]

Each round runs `sdpa bench --json` of the old build, then of the new one
(the order alternates every round, so drift of a busy host falls on both),
for every suite and dtype. Per row and backend it prints the median over
rounds of each build's median time, the ratio new/old (above 1: the new
build is slower) and the spread of the per-round ratios (min-max). Used to
show that a change left the kernels' speed alone ("nothing got slower").
--cold passes `sdpa bench --cold` to both (K and V from DRAM; both builds
need the flag).
"""
import argparse
import json
import statistics
import subprocess
import sys

ap = argparse.ArgumentParser()
ap.add_argument("old")
ap.add_argument("new")
ap.add_argument("--suite", action="append", default=[])
ap.add_argument("--dtype", action="append", default=[])
ap.add_argument("--backends", default="cpu.avx512,cpu.avx2,cpu.avx512bf16,cpu.amx,cpu.portable")
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--reps", type=int, default=5)
ap.add_argument("--cold", action="store_true")
a = ap.parse_args()
suites, dtypes = a.suite or ["smoke"], a.dtype or ["f32", "bf16"]


def run(binary, suite, dtype):
    out = subprocess.run([binary, "bench", "--suite", suite, "--dtype", dtype, "--backends",
                          a.backends, "--reps", str(a.reps), "--json"] + (["--cold"] if a.cold else []),
                         capture_output=True, text=True, env={"SDPA_WISDOM": "none"})
    if out.returncode != 0:
        sys.exit(f"{binary} bench --suite {suite} --dtype {dtype}: {out.stderr.strip()}")
    rows = {}
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            if "median_ms" in r:
                rows[(suite, dtype, r["row"], r["backend"])] = r["median_ms"]
                ceilings.setdefault(r["backend"], []).append(r.get("ceiling_gflops", 0))
    return rows


ceilings = {}  # backend -> the ceiling of its unit, per run
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
           "unknown CPU")


times = {}  # key -> {"old": [...], "new": [...]}
for rnd in range(a.rounds):
    order = [("old", a.old), ("new", a.new)] if rnd % 2 == 0 else [("new", a.new), ("old", a.old)]
    for suite in suites:
        for dtype in dtypes:
            for which, binary in order:
                for k, ms in run(binary, suite, dtype).items():
                    times.setdefault(k, {"old": [], "new": []})[which].append(ms)
print(f"# ab_builds.py: old {a.old}, new {a.new}; {a.rounds} rounds, the builds alternating, "
      f"{a.reps} reps each (sdpa bench medians{', --cold: K and V from DRAM' if a.cold else ''})")
print(f"# cpu: {cpu}; the ceiling of each backend's unit, measured by each sdpa bench run "
      "(GFLOP/s, lowest-highest): " + ", ".join(f"{b} {min(c):.0f}-{max(c):.0f}"
                                                for b, c in sorted(ceilings.items())))
print(f"# {'suite':14} {'dtype':5} {'row':22} {'backend':15} {'old ms':>9} {'new ms':>9} "
      f"{'new/old':>8} {'round ratios':>13}")
ratios = []
for (suite, dtype, row, backend), t in sorted(times.items()):
    if len(t["old"]) != a.rounds or len(t["new"]) != a.rounds:
        continue
    o, n = statistics.median(t["old"]), statistics.median(t["new"])
    per = [y / x for x, y in zip(t["old"], t["new"])]
    ratios.append(n / o)
    print(f"  {suite:14} {dtype:5} {row:22} {backend:15} {o:9.4f} {n:9.4f} {n / o:8.3f} "
          f"{min(per):6.2f}-{max(per):.2f}")
if ratios:
    print(f"# {len(ratios)} rows x backends: new/old median {statistics.median(ratios):.3f}, "
          f"range {min(ratios):.3f}-{max(ratios):.3f}")
