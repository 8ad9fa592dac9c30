#!/usr/bin/env bash
# test.sh - builds libsdpa and runs every test, three ways:
#   build/        optimised, warnings as errors: the whole CTest suite; then
#                 installed into a temporary prefix, the examples/ built and
#                 run against it, and the .deb packed, installed and removed
#                 (scripts/examples.sh); the examples built against the 0.2.0
#                 header on this library and on one whose structs grew
#                 (scripts/abi-check.sh); libsdpa as a ggml operator against
#                 ggml's own flash attention (scripts/ggml-check.sh, ggml
#                 from PyPI); scripts/amx-check.sh --quick
#   build-aarch64/ cross-built for AArch64, cpu.neon and the dispatcher's
#                 tests under qemu user-mode emulation (scripts/neon-check.sh)
#   build-asan/   AddressSanitizer + UndefinedBehaviorSanitizer: the whole suite
#                 (test_grid in its quick mode: no float64 reference there)
#   build-tsan/   ThreadSanitizer: the threading tests (dispatch, grid, masks,
#                 sparse maps, shares of a call and the caller's parallel-for,
#                 the soak, the backward pass's cuts into tasks),
#                 SDPA_TEST_QUICK (test_sparse: a few cases of each kind):
#                 the grid without its float64 reference (one thread against
#                 two; the builds above compare every case with ref), and
#                 without cpu.amx-emulated where cpu.amx runs on real tiles
#   build-py/     the Python package: its wheel, and its tests in two virtual
#                 environments (torch and diffusers; numpy alone), see
#                 scripts/python-test.sh; the CUDA plugin built against the
#                 cuDNN of torch's wheel (scripts/cuda-wheel-check.sh); then
#                 bench/peers' contenders on the smoke suite, forward and
#                 backward, outputs checked against float64
#   build-fuzz/   clang + libFuzzer + ASan/UBSan: the policy parser, the .npy
#                 reader and sdpa_forward against ref (fuzz_forward.c),
#                 SDPA_FUZZ_SECONDS (default 20) each, from the corpora in
#                 tests/fuzz/corpus (new inputs stay in build-fuzz/)
# Installs what it needs first (scripts/deps.sh). Fresh random inputs each
# run; a failing test prints SDPA_TEST_SEED=... to repeat it.
set -euo pipefail
cd "$(dirname "$0")/.."
# The tests check the built-in rules, whatever wisdom this machine has
# installed (sdpa tune --install); test_cli tests the lookup itself.
export SDPA_WISDOM=none
# Each phase's header says when it starts (seconds since the script began),
# so that a CI log shows where its minutes go (the budget: DEVELOPERS.md).
phase() { echo "== $* (at ${SECONDS}s)"; }
phase "dependencies (scripts/deps.sh)"
scripts/deps.sh
jobs=$(nproc 2>/dev/null || echo 2)
py=$(command -v python3)

configure_and_test() { # dir, ctest filter, [-E exclude], cmake flags...
  local dir=$1 filter=$2 exclude=
  shift 2
  if [ "${1:-}" = -E ]; then
    exclude=$2
    shift 2
  fi
  phase "$dir"
  cmake -S . -B "$dir" -DSDPA_WERROR=ON -DPython3_EXECUTABLE="$py" "$@" >/dev/null
  cmake --build "$dir" -j"$jobs" >/dev/null
  (cd "$dir" && ctest --output-on-failure -j"$jobs" ${filter:+-R "$filter"} ${exclude:+-E "$exclude"})
}

configure_and_test build "" -DCMAKE_BUILD_TYPE=Release
phase "install, examples and the .deb"
scripts/examples.sh build
# programs built against the 0.2.0 header, on this library and on one whose
# structs grew (README: Compatibility)
phase "scripts/abi-check.sh"
scripts/abi-check.sh build
# libsdpa as a ggml operator on ggml's threads, ggml from PyPI's
# stable-diffusion-cpp-python sdist (about a minute to build ggml)
phase "scripts/ggml-check.sh (ggml_flash_attn_ext against libsdpa's node)"
scripts/ggml-check.sh build
# cpu.amx on real tiles where the CPU has AMX, its tile-less cost elsewhere
# (one round of the smoke suite: a minute or two)
phase "scripts/amx-check.sh --quick"
scripts/amx-check.sh --quick | tail -12
phase "scripts/neon-check.sh (AArch64 under qemu)"
scripts/neon-check.sh build-aarch64
# ASan: every test; test_grid in its quick mode (every case through every
# kernel, twice, against itself: the float64 reference, most of its time
# under ASan, is left to build/, which compares every case with it)
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:protect_shadow_gap=0
export UBSAN_OPTIONS=print_stacktrace=1
configure_and_test build-asan "" -E '^test_grid$' -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSDPA_SANITIZE=address,undefined
(cd build-asan && SDPA_TEST_QUICK=1 ctest --output-on-failure -R '^test_grid$')
unset ASAN_OPTIONS UBSAN_OPTIONS
TSAN_OPTIONS=halt_on_error=1 SDPA_TEST_QUICK=1 \
  configure_and_test build-tsan "test_dispatch|test_grid|test_masks|test_sparse|test_shares|test_soak|test_backward|test_task_lanes" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSDPA_SANITIZE=thread

phase "python"
scripts/python-test.sh
phase "the CUDA plugin against a Python wheel's cuDNN"
scripts/cuda-wheel-check.sh build-py/venv/bin/python

# The peer benchmark's contenders must stay right: one round of the smoke
# suite in both dtypes, every output checked against float64 (no timing).
if [ -f build/libsdpa_peers.so ]; then
  phase "bench/peers (smoke, outputs checked)"
  for pass in "" --backward; do
    for dtype in f32 bf16; do
      build-py/venv/bin/python bench/peers/peers.py --lib build/libsdpa_peers.so \
        --suite bench/shapes/smoke.tsv --dtype $dtype --reps 1 --check $pass | tail -2
    done
  done
fi

phase "build-fuzz"
CC=clang cmake -S . -B build-fuzz -DSDPA_WERROR=ON -DSDPA_CUDA=OFF -DSDPA_FUZZ=ON \
  -DSDPA_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j"$jobs" --target fuzz_policy fuzz_npy fuzz_forward >/dev/null
fuzz_passed=0
for t in policy npy forward; do
  mkdir -p "build-fuzz/corpus-$t"
  if ! (cd build-fuzz && "tests/fuzz_$t" -max_total_time="${SDPA_FUZZ_SECONDS:-20}" -timeout=10 \
      -rss_limit_mb=2048 -print_final_stats=0 "corpus-$t" "../tests/fuzz/corpus/$t" \
      > "fuzz-$t.log" 2>&1); then
    tail -40 "build-fuzz/fuzz-$t.log"
    echo "fuzz: $fuzz_passed passed, 1 failed (fuzz_$t; the input is in build-fuzz/crash-*)"
    exit 1
  fi
  tail -1 "build-fuzz/fuzz-$t.log"
  fuzz_passed=$((fuzz_passed + 1))
done
echo "fuzz: $fuzz_passed passed, 0 failed"
phase "done"
