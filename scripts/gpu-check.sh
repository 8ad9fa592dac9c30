#!/usr/bin/env bash
# gpu-check.sh RESULTS_DIR - everything libsdpa can check on a GPU machine,
# in one run that must finish within 8 minutes on an H200:
#   1. build (with the CUDA plugin) and run the whole CTest suite
#   2. `sdpa info`: the plugin's view of the device
#   3. the backend grid for every cuda.* backend that is present (against ref),
#      once per cuda.flash kernel variant (SDPA_CUDA_FLASH_VARIANT=0, 1)
#   4. build-gpu/cuda_bench on diffusion-gpu.tsv rows that fit: every cuda.*
#      backend side by side, against the cuBLAS bf16 GEMM ceiling, outputs
#      checked against cuda.unfused, the dispatcher's choice against the fastest
#   5. PyTorch's scaled_dot_product_attention (flash and cuDNN backends) on
#      the same rows as the outside reference, when torch is installed
# Writes every log under RESULTS_DIR and prints a short table last.
# On a machine without a GPU it runs as a dry run: steps 3-5 report what
# is missing instead of failing.
set -uo pipefail
out=${1:?usage: scripts/gpu-check.sh RESULTS_DIR}
mkdir -p "$out"
cd "$(dirname "$0")/.."
shapes=${SDPA_SHAPES_DIR:-bench/shapes}
summary=()
note() { summary+=("$1"); echo "== $1"; }

start=$(date +%s)
scripts/deps.sh >"$out/deps.log" 2>&1
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release >"$out/cmake.log" 2>&1 &&
  cmake --build build-gpu -j"$(nproc)" >"$out/build.log" 2>&1
if [ $? -ne 0 ]; then
  note "build: FAILED (see $out/build.log)"
else
  note "build: ok ($(grep -c 'CUDA plugin: toolkit' "$out/cmake.log") CUDA plugin)"
  (cd build-gpu && timeout 300 ctest --output-on-failure -j4) >"$out/ctest.log" 2>&1
  note "ctest: $(grep -E 'tests passed|tests failed' "$out/ctest.log" | tail -1)"
fi

sdpa=build-gpu/sdpa
$sdpa info >"$out/info.txt" 2>&1
note "device: $(grep '^cuda' "$out/info.txt")"

present=$(grep -E '^  cuda\.' "$out/info.txt" | awk '$NF == "present" {print $1}' | paste -sd, -)
if [ -n "$present" ]; then
  for variant in 0 1; do
    SDPA_CUDA_FLASH_VARIANT=$variant SDPA_CUDA_PLUGIN=$PWD/build-gpu/libsdpa_cuda.so \
      timeout 90 build-gpu/tests/test_cuda_grid >"$out/grid-flash-v$variant.txt" 2>&1
    note "cuda grid ($present; cuda.flash variant $variant): $(tail -1 "$out/grid-flash-v$variant.txt")"
  done
  # cuda.flash has two kernel variants (flash_kernel.cuh); time both.
  for variant in 0 1; do
    SDPA_CUDA_FLASH_VARIANT=$variant timeout 120 build-gpu/cuda_bench "$shapes/diffusion-gpu.tsv" \
      --reps 5 >"$out/bench-flash-v$variant.txt" 2>&1
    note "bench (cuda.flash variant $variant): $(grep -c fastest "$out/bench-flash-v$variant.txt") rows; $(tail -1 "$out/bench-flash-v$variant.txt")"
  done
else
  note "cuda.* backends: none present ($(grep -m1 -E '^  cuda\.cudnn' "$out/info.txt" | sed 's/.*lse  //'))"
fi

if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  timeout 100 python3 scripts/torch_sdpa_bench.py "$shapes/diffusion-gpu.tsv" >"$out/torch.txt" 2>&1
  note "torch reference: $(tail -1 "$out/torch.txt")"
else
  note "torch reference: skipped (no PyTorch with CUDA here)"
fi

echo
echo "gpu-check summary ($(( $(date +%s) - start )) s, results in $out)"
printf '  %s\n' "${summary[@]}"
