#!/usr/bin/env bash
# cuda-wheel-check.sh PYTHON - the CUDA plugin built against the cuDNN of a
# Python wheel (nvidia-cudnn-cu*, as PyTorch brings it: nvidia/cudnn/
# {include,lib} with a versioned libcudnn.so.9 and no unversioned name),
# named by SDPA_CUDNN_ROOT as a GPU machine with no system cuDNN gets it
# (CMakeLists.txt also finds it by itself through Python when nothing else
# is there; here the system's cuDNN shares its folders with the toolkit, so
# that path cannot be shown by hiding it). The plugin's RUNPATH must reach
# the wheel so that ldd resolves libcudnn.so.9 there, whatever the loader
# cache holds. Skips, saying why, without the toolkit or the wheel. Called
# by scripts/test.sh after the Python tests.
set -euo pipefail
py=${1:?usage: scripts/cuda-wheel-check.sh PYTHON}
cd "$(dirname "$0")/.."
wheel=$("$py" -c "import importlib.util as u; s = u.find_spec('nvidia.cudnn'); print(list(s.submodule_search_locations)[0] if s else '')" 2>/dev/null || true)
if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "cuda-wheel-check: skipped (no CUDA toolkit)"
  exit 0
fi
if [ -z "$wheel" ]; then
  echo "cuda-wheel-check: skipped ($py has no nvidia-cudnn wheel)"
  exit 0
fi
dir=build-cuda-wheel
rm -rf "$dir"
mkdir -p "$dir"
log=$dir/cuda-wheel-check.log
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$py" -DSDPA_CUDA_ARCHS=90a-real \
  -DSDPA_MPI=OFF -DSDPA_CUDNN_ROOT="$wheel" > "$log" 2>&1
grep -o "CUDA plugin: .*" "$log"
cmake --build "$dir" -j"$(nproc)" --target sdpa_cuda >> "$log" 2>&1
runpath=$(readelf -d "$dir/libsdpa_cuda.so" | sed -n 's/.*RUNPATH.*\[\(.*\)\]/\1/p')
echo "RUNPATH $runpath"
case ":$runpath:" in
  *":$wheel/lib:"*) ;;
  *) echo "cuda-wheel-check: FAILED: the plugin's RUNPATH does not reach $wheel/lib"; exit 1 ;;
esac
case "$runpath" in
  *::*|:*|*:) echo "cuda-wheel-check: FAILED: an empty RUNPATH entry (the current directory)"; exit 1 ;;
esac
resolved=$(env -u LD_LIBRARY_PATH ldd "$dir/libsdpa_cuda.so" | grep 'libcudnn.so.9' || true)
echo "$resolved"
case "$resolved" in
  *"$wheel/lib/libcudnn.so.9"*) echo "cuda-wheel-check: ok (cuDNN from the wheel, through the RUNPATH)" ;;
  *) echo "cuda-wheel-check: FAILED: libcudnn.so.9 does not resolve to the wheel's"; exit 1 ;;
esac
rm -rf "$dir"
