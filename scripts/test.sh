#!/usr/bin/env bash
# test.sh - builds libsdpa and runs every test, three ways:
#   build/        optimised, warnings as errors: the whole CTest suite
#   build-asan/   AddressSanitizer + UndefinedBehaviorSanitizer: the whole suite
#   build-tsan/   ThreadSanitizer: the threading tests (dispatch, grid)
# Installs what it needs first (scripts/deps.sh). Fresh random inputs each
# run; a failing test prints SDPA_TEST_SEED=... to repeat it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
jobs=$(nproc 2>/dev/null || echo 2)
py=$(command -v python3)

configure_and_test() { # dir, ctest filter, cmake flags...
  local dir=$1 filter=$2
  shift 2
  echo "== $dir"
  cmake -S . -B "$dir" -DSDPA_WERROR=ON -DPython3_EXECUTABLE="$py" "$@" >/dev/null
  cmake --build "$dir" -j"$jobs" >/dev/null
  (cd "$dir" && ctest --output-on-failure -j"$jobs" ${filter:+-R "$filter"})
}

configure_and_test build "" -DCMAKE_BUILD_TYPE=Release
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:protect_shadow_gap=0 UBSAN_OPTIONS=print_stacktrace=1 \
  configure_and_test build-asan "" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSDPA_SANITIZE=address,undefined
TSAN_OPTIONS=halt_on_error=1 \
  configure_and_test build-tsan "test_dispatch|test_grid" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSDPA_SANITIZE=thread
