#!/usr/bin/env bash
# abi-check.sh - a program built against an older libsdpa header keeps
# running (README: Compatibility). The examples (examples/pkg-config,
# packed-qkv, layers, rules) are compiled against tests/abi/0.2.0/sdpa.h,
# the header of the 0.2.0 release kept as it was, and run:
#   1. on the library as built (BUILD_DIR/libsdpa.so);
#   2. on a library built with SDPA_ABI_GROWTH_TEST, whose growing structs
#      (params, masks, options, call and layer descriptions, tuner options)
#      each have a field more than at 0.2.0, which it reads: what the next
#      release that adds fields looks like to these binaries. Library and
#      examples are built with AddressSanitizer there, so a read past an
#      example's struct (the library ignoring its size) stops the example.
#      Its kernels are compiled with -O0 (SDPA_KERNEL_OPT): the examples'
#      calls are small, and sanitised -O3 kernels took this check from
#      about 15 s to about 4 minutes on a 2-core Zen 3.
# Each example checks its own results and exits non-zero when they are wrong.
# A new release copies its header to tests/abi/X.Y.Z/ and points this at it
# when its SONAME moves; until then 0.2.0's header is the one to keep.
# usage: scripts/abi-check.sh [BUILD_DIR]   (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(cd "${1:-build}" && pwd)
old=tests/abi/0.2.0
grown=build-abi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B "$grown" -DCMAKE_BUILD_TYPE=Debug -DSDPA_KERNEL_OPT=-O0 -DSDPA_ABI_GROWTH_TEST=ON \
  -DSDPA_SANITIZE=address -DSDPA_CUDA=OFF -DSDPA_MPI=OFF \
  -DCMAKE_C_FLAGS=-Wno-missing-field-initializers >/dev/null
cmake --build "$grown" --target sdpa -j"$jobs" >/dev/null
declare -A src=([hello]=examples/pkg-config/hello.c [packed_qkv]=examples/packed-qkv/packed_qkv.c
                [layers]=examples/layers/layers.c [rules]=examples/rules/rules.c)
for ex in hello packed_qkv layers rules; do
  for asan in "" -fsanitize=address; do
    cc -std=c11 -O1 -g $asan -Wall -Wextra -Werror -I"$old" \
      -DRULES_FILE="\"$PWD/examples/rules/my.rules\"" "${src[$ex]}" -L"$build" -lsdpa -lm \
      -o "$work/$ex${asan:+-asan}"
  done
done
for lib in "$build" "$grown"; do
  echo "-- the examples, built against $old/sdpa.h, on $lib/libsdpa.so"
  for ex in hello packed_qkv layers rules; do
    bin=$work/$ex
    [ "$lib" = "$grown" ] && bin=$work/$ex-asan
    LD_LIBRARY_PATH="$lib" ASAN_OPTIONS=detect_leaks=0 "$bin" >"$work/$ex.out" 2>&1 ||
      { cat "$work/$ex.out"; echo "abi-check: $ex failed on $lib" >&2; exit 1; }
    echo "   $ex: $(tail -1 "$work/$ex.out" | cut -c1-110)"
  done
done
echo "abi-check: 4 examples built against the 0.2.0 header ran on both libraries"
