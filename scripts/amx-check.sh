#!/usr/bin/env bash
# amx-check.sh - everything the AMX work measures, in one command, on a CPU
# with usable AMX (Intel Xeon Sapphire Rapids and later; `sdpa info`:
# "amx permitted"):
#
#   scripts/amx-check.sh [--quick]
#
#   1. builds build/ (Release);
#   2. the test grid of cpu.amx on real tiles;
#   3. sdpa bench, bf16: diffusion-cpu, smoke and padding-cpu (cpu.amx
#      beside cpu.avx512, cpu.avx512bf16, cpu.avx2), smoke in f16;
#   4. bench_amx_cost: what cpu.amx spends outside the tiles, in cycles per
#      score (its kernel with the tile work compiled out, beside it), and
#      the softmax's exponential alone (--softmax: that part's floor);
#      bench_amx_tiles: what the tile unit charges for the loads and
#      stores around its products, one core;
#   5. bench/peers bf16 on diffusion-cpu (PyTorch, oneDNN), in the venv
#      scripts/python-test.sh keeps (made here if missing);
#   6. the FLUX-shaped diffusers transformer forward in bf16, libsdpa's
#      backend against native (python -m libsdpa.bench --dit-only);
#   7. scripts/amx_targets.py: each target of the AMX work as met or
#      missed, with its figure, from the files just written.
#
# Every raw file goes to bench/results/DATE-WHAT-TAG.txt, TAG naming the
# CPU (SDPA_CPU_TAG, else from CPUID: spr, emr, gnr, zen4, zen5, or
# vendor-family-model), never over an earlier file. About 15 minutes on 2
# cores.
#
# --quick (CI): the same steps on the smoke suite only, one round each, no
# peers or diffusers, into build/amx-check-quick/ (not bench/results: its
# figures are not measurements); a minute or two. On a CPU without usable
# AMX it says so and exits 0, after the tile-less cost on smoke where the
# CPU has AVX-512 BF16 (that part runs anywhere).
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [ "${1:-}" = "--quick" ]; then
  quick=1
elif [ -n "${1:-}" ]; then
  echo "usage: scripts/amx-check.sh [--quick]" >&2
  exit 2
fi
jobs=$(nproc 2>/dev/null || echo 2)

echo "== amx-check: build"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs" --target sdpa_tool test_grid bench_amx_cost bench_amx_tiles >/dev/null

tag=${SDPA_CPU_TAG:-$(python3 - <<'EOF'
# the CPU's short name from /proc/cpuinfo (x86): family and model numbers
fam = mod = vendor = None
for line in open("/proc/cpuinfo"):
    k, _, v = line.partition(":")
    k, v = k.strip(), v.strip()
    if k == "vendor_id" and vendor is None:
        vendor = "intel" if v == "GenuineIntel" else "amd" if v == "AuthenticAMD" else "cpu"
    elif k == "cpu family" and fam is None:
        fam = int(v)
    elif k == "model" and mod is None:
        mod = int(v)
names = {("intel", 6, 143): "spr", ("intel", 6, 207): "emr", ("intel", 6, 173): "gnr",
         ("intel", 6, 174): "gnr"}
if (vendor, fam, mod) in names:
    print(names[(vendor, fam, mod)])
elif vendor == "amd" and fam == 25 and mod is not None and (0x10 <= mod < 0x20 or 0x60 <= mod < 0x80 or 0xa0 <= mod < 0xb0):
    print("zen4")
elif vendor == "amd" and fam == 26:
    print("zen5")
else:
    print(f"{vendor}-f{fam}-m{mod}")
EOF
)}
day=$(date +%F)
if [ $quick = 1 ]; then
  dir=build/amx-check-quick
  mkdir -p "$dir"
  reps=1
else
  dir=bench/results
  reps=3
fi
# never over an earlier file: the next free name
name_for() { # what
  local f="$dir/$day-$1-$tag.txt" n=2
  [ $quick = 1 ] && { echo "$f"; return; }
  while [ -e "$f" ]; do f="$dir/$day-$1-$tag-$n.txt"; n=$((n + 1)); done
  echo "$f"
}

build/sdpa info | head -5
if ! build/sdpa info | grep -q '^amx  *permitted'; then
  echo "amx-check: this CPU has no usable AMX ($(build/sdpa info | grep '^amx' || echo 'amx: not reported')): nothing to measure on tiles"
  if [ $quick = 1 ] && build/sdpa info | grep -q '^isa .*avx512bf16'; then
    echo "== amx-check --quick: cpu.amx's cost without tiles, smoke suite"
    build/bench_amx_cost --suite smoke --reps 1 | tee "$(name_for amx-cost)"
  fi
  exit 0
fi

files=()
step() { # title, what, command...: output to the file and the terminal
  local title=$1 what=$2
  shift 2
  local f
  f=$(name_for "$what")
  echo "== amx-check: $title -> $f"
  "$@" | tee "$f"
  files+=("$f")
}

step "test grid on real tiles" amx-grid build/tests/test_grid cpu.amx
suites=(smoke diffusion-cpu padding-cpu)
[ $quick = 1 ] && suites=(smoke)
for s in "${suites[@]}"; do
  step "sdpa bench $s bf16" "sdpa-bench-$s-bf16" build/sdpa bench --suite "$s" --dtype bf16 \
    --backends cpu.amx,cpu.avx512,cpu.avx512bf16,cpu.avx2 --reps $reps
done
step "sdpa bench smoke f16" sdpa-bench-smoke-f16 build/sdpa bench --suite smoke --dtype f16 \
  --backends cpu.amx,cpu.avx512,cpu.avx512bf16,cpu.avx2 --reps $reps
cost_suite=diffusion-cpu
[ $quick = 1 ] && cost_suite=smoke
step "cpu.amx outside the tiles ($cost_suite)" amx-cost build/bench_amx_cost --suite "$cost_suite" \
  --reps $((reps + 2))
step "the softmax's exponential alone" amx-softmax build/bench_amx_cost --softmax --reps $((reps + 2))
step "the tile unit's charges beside its products" amx-tiles build/bench_amx_tiles --reps $((2 * reps + 3))

if [ $quick = 0 ]; then
  scripts/deps.sh
  cmake --build build -j"$jobs" --target sdpa sdpa_peers >/dev/null
  if [ ! -x build-py/venv/bin/python ]; then
    python3 -m venv build-py/venv
  fi
  build-py/venv/bin/pip install --quiet --disable-pip-version-check numpy torch diffusers
  step "bench/peers diffusion-cpu bf16" peers-diffusion-cpu-bf16 \
    build-py/venv/bin/python bench/peers/peers.py --lib build/libsdpa_peers.so \
    --suite bench/shapes/diffusion-cpu.tsv --dtype bf16 --reps 5
  step "FLUX-shaped diffusers forward, bf16" dit-flux-bf16 \
    env SDPA_LIBRARY="$PWD/build/libsdpa.so" PYTHONPATH="$PWD/python" \
    build-py/venv/bin/python -m libsdpa.bench --dit-only --dtype bf16 --reps 4
fi

echo "== amx-check: targets"
summary=$(name_for amx-check)
python3 scripts/amx_targets.py $([ $quick = 1 ] && echo --quick) "${files[@]}" | tee "$summary"
