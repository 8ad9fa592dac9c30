#!/usr/bin/env bash
# run.sh - the peer benchmark, f32 and bf16, on a suite (default
# diffusion-cpu, then decode-cpu for the forward), raw output into
# bench/results/DATE-peers-SUITE-{f32,bf16}.txt:
#
#   bench/peers/run.sh [--backward] [suite.tsv] [reps]
#
# --backward times the backward pass (peers.py --backward) into
# DATE-peers-backward-SUITE-{f32,bf16}.txt.
#
# Builds build/ (libsdpa_peers.so needs OpenBLAS, oneDNN and OpenMP:
# scripts/deps.sh installs them) and uses the venv with torch that
# scripts/python-test.sh keeps in build-py/venv (made here if missing).
# Run it on a quiet machine: the figures are ratios measured side by side.
set -euo pipefail
cd "$(dirname "$0")/../.."
pass=()
what=peers
if [ "${1:-}" = "--backward" ]; then
  pass=(--backward)
  what=peers-backward
  shift
fi
# the default: the diffusion rows, then (forward) the few-query rows, so that
# every run shows short calls too
suites=${1:-bench/shapes/diffusion-cpu.tsv}
[ -z "${1:-}" ] && [ ${#pass[@]} -eq 0 ] && suites="$suites bench/shapes/decode-cpu.tsv"
reps=${2:-7}
scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target sdpa sdpa_peers >/dev/null
if [ ! -x build-py/venv/bin/python ]; then
  python3 -m venv build-py/venv
  build-py/venv/bin/pip install --quiet --disable-pip-version-check numpy torch
fi
day=$(date +%F)
for suite in $suites; do
name=$(basename "$suite" .tsv)
for dtype in f32 bf16; do
  out="bench/results/$day-$what-$name-$dtype.txt"
  # never over an earlier run (another machine's, perhaps): the next free name
  n=2
  while [ -e "$out" ]; do out="bench/results/$day-$what-$name-$dtype-$n.txt"; n=$((n + 1)); done
  echo "run.sh: writing $out" >&2
  build-py/venv/bin/python bench/peers/peers.py --lib build/libsdpa_peers.so --suite "$suite" \
    --dtype "$dtype" --reps "$reps" "${pass[@]}" | tee "$out"
done
done
