#!/usr/bin/env bash
# bench.sh - the main job: builds libsdpa and runs `sdpa bench` on a shape
# suite, showing per row each backend's speed and the dispatcher's choice.
#   scripts/bench.sh                 smoke.tsv (seconds)
#   scripts/bench.sh diffusion-cpu   the CPU-sized diffusion suite (minutes)
# Extra arguments go to `sdpa bench` (e.g. --reps 7 --json).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
suite=${1:-smoke}
shift || true

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc 2>/dev/null || echo 2)" >/dev/null
build/sdpa info
echo
# smoke.tsv: every backend including the float64 reference; larger suites:
# every fast backend (the reference would take hours).
backends=all
[ "$suite" = smoke ] || backends=
build/sdpa bench --suite "$suite" ${backends:+--backends $backends} --reps 3 "$@"
