#!/usr/bin/env python3
"""Every figure a built-in rule states is recomputed from the raw results it cites.

usage: test_evidence.py RULES_FILE REPO_ROOT

A rule that cites measurements names the raw file (`source
bench/results/...`: `sdpa bench` output, or bench/peers' peers.py output)
and states each figure as a `claim` this script recomputes from that file:

  claim ratio A/B LO-HI ROWS...   median time of B / median time of A, the
                                  speed-up of A over B, over the rows selected
  claim gflops A LO-HI ROWS...    A's GFLOP/s column over the rows selected
  claim ceiling fp32|avx512bf16|amx-bf16 N  the ceiling the run measured (its header)

ROWS: Skv>=N, Skv<N, D=N, self (Sq == Skv), cross (Sq != Skv), row=NAME;
none means every row. LO-HI (or one value) must equal the computed minimum
and maximum printed with the claim's own number of decimals. Every range
or ratio figure written in the rule's evidence line ("1.38-2.44x",
"0.83x", "714-769 GFLOP/s") must be one of its claims, so prose cannot
drift from the data. Prints "N passed, N failed" last.
"""
import os
import re
import sys

passed = failed = 0
quiet = False


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        if not quiet:
            print(f"FAIL {what}")


def rules(path):
    """[(name, origin, {key: [values]})] in file order."""
    out, cur = [], None
    for n, line in enumerate(open(path), 1):
        line = line.split("#", 1)[0].rstrip() if not line.lstrip().startswith("evidence") else line.rstrip()
        if not line.strip():
            continue
        key, _, value = line.strip().partition(" ")
        value = value.strip()
        if key == "rule":
            cur = (value, f"{path}:{n}", {})
            out.append(cur)
        elif cur:
            cur[2].setdefault(key, []).append(value)
    return out


def peers_rows(path):
    """bench/peers/peers.py output: {row: {contender: (median_ms, gflops)}}, shapes (from the
    suite the header names: bench/shapes/NAME), {ceiling: GFLOP/s}. The dispatcher's arm
    ("libsdpa (cpu.x)") is recorded as "libsdpa"."""
    rows, shape, ceilings, suite = {}, {}, {}, None
    for line in open(path):
        m = re.match(r"# bench/peers/peers.py --suite (\S+)", line)
        if m:
            suite = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(path))),
                                 "bench", "shapes", m[1])
        m = re.match(r"# ceiling: fp32 FMA (\d+) GFLOP/s; VDPBF16PS (\d+|none)(?: GFLOP/s)?"
                     r"(?:; TDPBF16PS (\d+|none))?", line)
        if m:
            for what, v in (("fp32", m[1]), ("avx512bf16", m[2]), ("amx-bf16", m[3])):
                if v and v != "none":
                    ceilings[what] = v
        if line.startswith("#") or line.startswith("row "):
            continue
        f = line.split()
        if len(f) >= 8 and f[2] == "libsdpa":
            f = f[:2] + ["libsdpa"] + f[4:]
        if len(f) < 7 or f[2] == "choice":
            continue
        try:
            med, gf = float(f[3]), float(f[4])
        except ValueError:
            continue
        rows.setdefault(f[0], {})[f[2]] = (med, gf)
    if suite and os.path.exists(suite):
        for line in open(suite):
            g = line.split("\t")
            if line.startswith("#") or len(g) < 8 or g[0] not in rows:
                continue
            shape[g[0]] = dict(zip(("B", "Sq", "Skv", "Hq", "Hkv", "D"), map(int, g[1:7])))
    for name in rows:
        shape.setdefault(name, {"B": 0, "Sq": 0, "Skv": 0, "Hq": 0, "Hkv": 0, "D": 0})
    return rows, shape, ceilings


def bench_rows(path):
    """{row: {backend: (median_ms, gflops)}}, {row: shape dict}, {ceiling: GFLOP/s}; sdpa
    bench's output, or bench/peers' (peers_rows)."""
    with open(path) as f:
        if f.readline().startswith("# bench/peers/peers.py"):
            return peers_rows(path)
    rows, shape, ceilings = {}, {}, {}
    for line in open(path):
        m = re.match(r"# ceiling: (fp32 FMA|AVX512-BF16|AMX bf16) peak (\d+) GFLOP/s", line)
        if m:
            ceilings[{"fp32 FMA": "fp32", "AVX512-BF16": "avx512bf16",
                      "AMX bf16": "amx-bf16"}[m[1]]] = m[2]
        if line.startswith("#") or line.startswith("row ") or line[:1].isspace():
            continue  # headers, and indented notes under a row (a sparse row's dense call)
        f = line.split()
        if len(f) < 13:
            continue
        try:
            med, gf = float(f[9]), float(f[12])
        except ValueError:
            continue  # refused lines and the like
        name = f[0]
        rows.setdefault(name, {})[f[8]] = (med, gf)
        shape[name] = dict(zip(("B", "Sq", "Skv", "Hq", "Hkv", "D"), map(int, f[1:7])))
    return rows, shape, ceilings


def selected(shape, conds):
    for c in conds:
        m = re.fullmatch(r"(Skv|Sq|D|B)(>=|<=|<|>|=)(\d+)", c)
        if m:
            v, op, n = shape[m[1]], m[2], int(m[3])
            if not {"=": v == n, ">=": v >= n, "<=": v <= n, "<": v < n, ">": v > n}[op]:
                return False
        elif c == "self":
            if shape["Sq"] != shape["Skv"]:
                return False
        elif c == "cross":
            if shape["Sq"] == shape["Skv"]:
                return False
        elif not c.startswith("row="):
            raise ValueError(f"unknown row condition {c!r}")
    return True


def decimals(text):
    return len(text.split(".")[1]) if "." in text else 0


def verify(rule, origin, keys, root):
    sources = keys.get("source", [])
    claims = keys.get("claim", [])
    evidence = " ".join(keys.get("evidence", []))
    # sdpa_decision.evidence holds 511 bytes: a longer note reaches explain cut
    check(len(evidence.encode()) <= 511,
          f"{origin} rule {rule}: evidence is {len(evidence.encode())} bytes, explain shows 511")
    if not sources:
        check(not claims, f"{origin} rule {rule}: claims without a source")
        check(not re.search(r"\d\.\d+x", evidence),
              f"{origin} rule {rule}: evidence states measured ratios but cites no source")
        return
    data, ceilings = {}, {}
    for s in sources:
        p = os.path.join(root, s)
        check(os.path.exists(p), f"{origin} rule {rule}: source {s} is not in the repository")
        if os.path.exists(p):
            rows, shape, ceil = bench_rows(p)
            ceilings.update(ceil)
            for name in rows:
                data[name] = (rows[name], shape[name])
    stated = set()
    for c in claims:
        f = c.split()
        kind, what, rng, conds = f[0], f[1], f[2], f[3:]
        stated.add(rng)
        if kind == "ceiling":
            check(ceilings.get(what) == rng, f"{origin} rule {rule}: claim '{c}': the run's "
                  f"{what} ceiling is {ceilings.get(what)}")
            continue
        names = [x[4:] for x in conds if x.startswith("row=")]
        lo_s, _, hi_s = rng.partition("-")
        hi_s = hi_s or lo_s
        values = []
        for name, (by_backend, shape) in data.items():
            if names and name not in names:
                continue
            if not selected(shape, conds):
                continue
            if kind == "ratio":
                a, b = what.split("/")
                if a in by_backend and b in by_backend:
                    values.append(by_backend[b][0] / by_backend[a][0])
            elif kind == "gflops":
                if what in by_backend:
                    values.append(by_backend[what][1])
            else:
                check(False, f"{origin} rule {rule}: unknown claim kind {kind!r}")
        if not values:
            check(False, f"{origin} rule {rule}: claim '{c}' selects no measured row")
            continue
        d = max(decimals(lo_s), decimals(hi_s))
        got = (f"{min(values):.{d}f}", f"{max(values):.{d}f}")
        check(got == (lo_s, hi_s),
              f"{origin} rule {rule}: claim '{c}': the raw results give {got[0]}-{got[1]} "
              f"over {len(values)} rows")
    for fig in re.findall(r"(\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?)(?:x| GFLOP/s)", evidence):
        check(fig in stated,
              f"{origin} rule {rule}: evidence figure {fig} is not one of its claims {sorted(stated)}")


def main():
    path, root = sys.argv[1], sys.argv[2]
    for rule, origin, keys in rules(path):
        verify(rule, origin, keys, root)
    # The checker must catch a wrong figure: a claim that is off by 0.01.
    global passed, failed, quiet
    p0, f0 = passed, failed
    quiet = True
    verify("self-test", "(self-test)", {
        "source": ["bench/results/2026-11-29-diffusion-cpu-f32.txt"],
        "claim": ["ratio cpu.avx512/cpu.blas 1.39-2.44 Skv>=77"],
        "evidence": ["cpu.avx512 1.39-2.44x cpu.blas"]}, root)
    caught = failed - f0
    passed, failed, quiet = p0, f0, False
    check(caught == 1, f"the checker missed a wrong claim (caught {caught})")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
