#!/usr/bin/env bash
# gpu-check.sh RESULTS_DIR - the first run on a GPU machine, as one command
# of about 5-6 minutes: a global deadline (SDPA_GPU_DEADLINE seconds, default
# 330) that every step's timeout is cut to, the steps in the order of what
# matters, and at most eight files under RESULTS_DIR, each written as its
# step goes (unbuffered), so that a kill keeps what finished:
#
#   summary.txt  one line per step, appended as each step ends
#   env.txt      the machine, first: GPU and driver (nvidia-smi), nvcc,
#                cmake, ninja or make, where cuDNN, cuBLAS and NVRTC are
#                (loader cache, CUDA folders, Python wheels), torch
#   build.txt    configure and build of the CUDA targets only: the plugin
#                for SDPA_CUDA_ARCHS (default 90a-real: what an H200 runs),
#                Ninja where make is missing, cuDNN from the system or from
#                a wheel (CMakeLists.txt finds either)
#   info.txt     `sdpa info` and ldd of the plugin: recorded, never a gate
#   grid.txt     test_cuda_grid once per cuda.* backend and per cuda.flash
#                variant, each in its own process (one sticky CUDA fault
#                must not hide the other backends' results)
#   bench.txt    cuda_bench on diffusion-gpu.tsv, per cuda.flash variant
#   torch.txt    PyTorch's flash and cuDNN SDPA on the same rows
#   ctest.txt    the CPU suite, only with the time that is left
#
# No scripts/deps.sh (the GPU machine has no network): what it needs must
# be there. The CUDA libraries are found through the plugin's RUNPATH;
# LD_LIBRARY_PATH is set to the same folders for the processes cuDNN starts
# (its runtime compiler). Without a GPU it runs to the end as a dry run:
# the GPU steps say what is missing.
set -uo pipefail
out=${1:?usage: scripts/gpu-check.sh RESULTS_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
shapes=${SDPA_SHAPES_DIR:-bench/shapes}
deadline=$(( $(date +%s) + ${SDPA_GPU_DEADLINE:-330} ))
export PYTHONUNBUFFERED=1
: > "$out/summary.txt"

note() { # one line of the summary, now
  echo "$1" | tee -a "$out/summary.txt"
}
left() { echo $(( deadline - $(date +%s) )); }
# timeout for a step: its own cap, or what is left of the deadline
budget() {
  local cap=$1 rest
  rest=$(left)
  [ "$rest" -lt "$cap" ] && cap=$rest
  [ "$cap" -lt 1 ] && cap=1
  echo "$cap"
}
run() { # file, cap seconds, command...: appended to the file, unbuffered
  local file=$1 cap=$2
  shift 2
  if [ "$(left)" -le 5 ]; then
    echo "(skipped: the deadline passed)" >> "$file"
    return 124
  fi
  echo "\$ $*" >> "$file"
  timeout "$(budget "$cap")" stdbuf -oL -eL "$@" >> "$file" 2>&1
}

# ---- 1. the machine, first
{
  date -u
  nvidia-smi 2>&1 | head -20 || echo "nvidia-smi: not found"
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv 2>&1
  command -v nvcc >/dev/null && nvcc --version | tail -2 || echo "nvcc: not found"
  cmake --version | head -1
  command -v ninja >/dev/null && echo "ninja $(ninja --version)" || echo "ninja: not found"
  command -v make >/dev/null && make --version | head -1 || echo "make: not found"
  echo "-- loader cache"
  ldconfig -p 2>/dev/null | grep -E 'libcudnn\.so|libcublas\.so|libnvrtc\.so|libcudart\.so' | head
  echo "-- CUDA folders"
  ls -d /usr/local/cuda* 2>/dev/null
  ls /usr/local/cuda/lib64/libcudnn* /usr/local/cuda/lib/libcudnn* 2>/dev/null | head -3
  echo "-- Python wheels"
  python3 - <<'EOF' 2>&1
import importlib.util
for m in ("nvidia.cudnn", "nvidia.cublas", "nvidia.cuda_nvrtc", "nvidia.cuda_runtime"):
    s = importlib.util.find_spec(m)
    print(m, list(s.submodule_search_locations) if s else "not installed")
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "available",
          torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
except Exception as e:
    print("torch:", e)
EOF
} > "$out/env.txt" 2>&1
note "env: $(grep -m1 -E 'H200|H100|GPU|nvidia-smi: not found' "$out/env.txt" | tr -s ' ' | cut -c1-100)"

# ---- 2. build the CUDA targets only
gen=()
if ! command -v make >/dev/null && command -v ninja >/dev/null; then
  gen=(-G Ninja)
fi
if run "$out/build.txt" 150 cmake -S . -B build-gpu "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DSDPA_CUDA_ARCHS="${SDPA_CUDA_ARCHS:-90a-real}" &&
  run "$out/build.txt" 200 cmake --build build-gpu -j"$(nproc)" --target sdpa_tool sdpa_cuda \
    test_cuda_grid cuda_bench; then
  note "build: ok ($(grep -m1 -o 'CUDA plugin: .*' "$out/build.txt" | cut -c1-120))"
else
  note "build: FAILED ($(grep -m1 -E 'CUDA plugin: not built|error' "$out/build.txt" | cut -c1-120))"
fi
plugin=$PWD/build-gpu/libsdpa_cuda.so
# the processes cuDNN starts (NVRTC) find the same libraries as the plugin
if [ -f "$plugin" ]; then
  rp=$(readelf -d "$plugin" 2>/dev/null | sed -n 's/.*R.*PATH.*\[\(.*\)\]/\1/p')
  export LD_LIBRARY_PATH="${rp}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# ---- 3. what the plugin sees (recorded, not a gate)
{
  build-gpu/sdpa info 2>&1
  echo "-- ldd $plugin"
  ldd "$plugin" 2>&1
  readelf -d "$plugin" 2>&1 | grep -E 'NEEDED|RUNPATH|RPATH'
} > "$out/info.txt" 2>&1
note "device: $(grep -m1 '^cuda' "$out/info.txt" | cut -c1-150)"
present=$(grep -E '^  cuda\.' "$out/info.txt" | awk '$NF == "present" {print $1}')

# ---- 4. the grid: each backend, each flash variant, its own process
if [ -n "$present" ]; then
  for b in $present; do
    variants=0
    [ "$b" = cuda.flash ] && variants="0 1"
    for v in $variants; do
      SDPA_CUDA_FLASH_VARIANT=$v SDPA_CUDA_PLUGIN=$plugin \
        run "$out/grid.txt" 60 build-gpu/tests/test_cuda_grid "$b"
      note "grid $b$([ "$b" = cuda.flash ] && echo " variant $v"): exit $? - $(tail -1 "$out/grid.txt")"
    done
  done
  # ---- 5. the benchmark, per cuda.flash variant
  for v in 0 1; do
    SDPA_CUDA_FLASH_VARIANT=$v SDPA_CUDA_PLUGIN=$plugin \
      run "$out/bench.txt" 70 build-gpu/cuda_bench "$shapes/diffusion-gpu.tsv" --reps 5
    note "bench (cuda.flash variant $v): exit $? - $(tail -1 "$out/bench.txt" | cut -c1-150)"
  done
else
  note "cuda.* backends: none present - $(grep -m1 -E '^  cuda\.cudnn' "$out/info.txt" | sed 's/.*  //' | cut -c1-150)"
fi

# ---- 6. the outside reference
if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  run "$out/torch.txt" 60 python3 scripts/torch_sdpa_bench.py "$shapes/diffusion-gpu.tsv"
  note "torch reference: exit $? - $(tail -1 "$out/torch.txt" | cut -c1-150)"
else
  note "torch reference: skipped (no PyTorch with CUDA here)"
fi

# ---- 7. the rest, with the time that is left
if [ "$(left)" -gt 60 ]; then
  run "$out/ctest.txt" 100 cmake --build build-gpu -j"$(nproc)" &&
    (cd build-gpu && run "$out/ctest.txt" "$(budget 200)" \
      ctest --output-on-failure -j4 -E 'test_soak')
  note "ctest: $(grep -E 'tests passed|tests failed' "$out/ctest.txt" | tail -1)"
else
  note "ctest: skipped ($(left) s left)"
fi
note "gpu-check: done, $(( ${SDPA_GPU_DEADLINE:-330} - $(left) )) s"
