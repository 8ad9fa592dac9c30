#!/usr/bin/env bash
# neon-check.sh - cpu.neon, the AArch64 backend, on an x86-64 machine: the
# library and its tests cross-built with Debian's aarch64-linux-gnu-gcc
# (cmake/toolchain-aarch64.cmake) and run under qemu user-mode emulation
# (qemu-aarch64-static; CTest prefixes every test with it).
#
# What runs (about 5 minutes on 2 cores; emulation is 10-30x slower than
# native, and gives no timing worth quoting):
#   the dispatcher, policy, platform, merge, faults, soak and stats tests as
#   they are (on AArch64: NEON detected, the aarch64 rules decide; test_tune,
#   scripted backends only, is left to the native builds: 40 s here);
#   test_grid and test_masks for cpu.neon, every case kind (SDPA_TEST_QUICK:
#   test_grid's reduced case list, still every kind);
#   test_sparse, test_backward and test_shares in their quick mode (a few
#   cases of each kind; the whole lists run natively on the x86 kernels,
#   which share the framework).
# usage: scripts/neon-check.sh [BUILD_DIR]   (default build-aarch64)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-aarch64}
for tool in aarch64-linux-gnu-gcc qemu-aarch64-static; do
  if ! command -v $tool >/dev/null; then
    echo "neon-check: $tool missing (scripts/deps.sh installs gcc-aarch64-linux-gnu," \
         "libc6-dev-arm64-cross and qemu-user-static)" >&2
    exit 1
  fi
done
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B "$dir" -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-aarch64.cmake \
  -DCMAKE_BUILD_TYPE=Release -DSDPA_WERROR=ON -DSDPA_CUDA=OFF -DSDPA_MPI=OFF >/dev/null
cmake --build "$dir" -j"$jobs" >/dev/null
# the binaries really are AArch64 ones, and the backend is there
file "$dir/sdpa" | grep -q "ARM aarch64" || { echo "neon-check: $dir/sdpa is not AArch64" >&2; exit 1; }
qemu=(qemu-aarch64-static -L /usr/aarch64-linux-gnu)
"${qemu[@]}" "$dir/sdpa" info | grep -E "^(cpu|isa|arch) |cpu.neon "
"${qemu[@]}" "$dir/sdpa" info | grep -q "cpu.neon .* present" ||
  { echo "neon-check: cpu.neon is not present under emulation" >&2; exit 1; }
"${qemu[@]}" "$dir/sdpa" explain --shape 1,1024,1024,8,8,128 | grep -E "^decided by|^  1\."
export SDPA_WISDOM=none SDPA_TEST_QUICK=1
cd "$dir"
ctest --output-on-failure -j"$jobs" \
  -R "^(test_half|test_validate|test_platform|test_merge|test_policy|test_dispatch|test_guard|test_faults|test_soak|test_stats|test_image)$"
# the kernels, cpu.neon named: ref and cpu.portable run natively elsewhere
for t in test_grid test_sparse test_backward test_shares; do
  echo "== $t cpu.neon (qemu)"
  start=$(date +%s)
  "${qemu[@]}" "tests/$t" cpu.neon | tail -2
  echo "   $(( $(date +%s) - start )) s"
done
echo "== test_masks (every CPU backend present: ref, cpu.portable, cpu.neon)"
"${qemu[@]}" tests/test_masks | tail -1
