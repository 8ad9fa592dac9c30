#!/usr/bin/env bash
# ggml-check.sh BUILD_DIR [ARGS...] - libsdpa as a ggml operator, built as a
# ggml user would get ggml: from PyPI, where stable-diffusion-cpp-python's
# source distribution (0.4.7) vendors stable-diffusion.cpp and its ggml.
#   1. pip download the sdist once into build-ggml/ (20 MB), build ggml
#      (static, GGML_NATIVE, its CPU backend only) and install it there;
#   2. install libsdpa from BUILD_DIR into build-ggml/sdpa;
#   3. build examples/ggml against both (find_package) and run it with
#      ARGS: default its check (libsdpa's node against ggml_flash_attn_ext
#      and float64, on ggml's threads); --bench for the timing.
# scripts/test.sh runs the check; about two minutes on 2 cores, the first
# time (ggml's build), seconds after.
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(cd "${1:-build}" && pwd)
shift || true
work=$PWD/build-ggml
version=0.4.7
mkdir -p "$work"
src="$work/stable_diffusion_cpp_python-$version/vendor/stable-diffusion.cpp/ggml"
if [ ! -f "$work/ggml/lib/cmake/ggml/ggml-config.cmake" ]; then
  if [ ! -d "$src" ]; then
    python3 -m pip download --quiet --disable-pip-version-check --no-binary :all: --no-deps \
      -d "$work" "stable-diffusion-cpp-python==$version"
    tar -xzf "$work/stable_diffusion_cpp_python-$version.tar.gz" -C "$work"
  fi
  # ggml's own warnings (tens of thousands of lines) go to a log, shown on failure
  if ! { cmake -S "$src" -B "$work/ggml-build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
           -DGGML_NATIVE=ON -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF &&
         cmake --build "$work/ggml-build" -j"$(nproc 2>/dev/null || echo 2)" &&
         cmake --install "$work/ggml-build" --prefix "$work/ggml"; } >"$work/ggml-build.log" 2>&1; then
    tail -40 "$work/ggml-build.log"
    echo "ggml-check: ggml did not build (the whole log: $work/ggml-build.log)"
    exit 1
  fi
fi
cmake --install "$build" --prefix "$work/sdpa" >/dev/null
cmake -S examples/ggml -B "$work/example" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/sdpa;$work/ggml" -DCMAKE_C_FLAGS="-Wall -Wextra -Werror" \
  -DCMAKE_CXX_FLAGS="-Wall -Wextra -Werror" >/dev/null
cmake --build "$work/example" >/dev/null
"$work/example/ggml_attention" "$@"
