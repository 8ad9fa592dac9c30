#!/usr/bin/env bash
# run.sh [ROUNDS] - stable-diffusion.cpp itself with its attention on libsdpa,
# against its own two paths, at the same seed. Not run by CI (about 8
# minutes on 2 cores, 2 GB of random weights); needs what
# scripts/ggml-check.sh leaves in build-ggml/ (the sdist, libsdpa installed)
# and a Python with torch and diffusers (scripts/python-test.sh's venv, or
# PYTHON=...).
#   1. copies sd.cpp 0.4.7's vendored source, applies sdcpp.patch (its
#      ggml_ext_attention_ext builds sdpa_ggml_attention's node when
#      SD_LIBSDPA=1 and flash attention is on), builds sd-cli against libsdpa;
#   2. writes a Stable Diffusion 1.5 with random weights (random_sd15.py);
#   3. generates a 256x256 image, 2 Euler steps with guidance, seed 42, on 2
#      threads, three ways, ROUNDS times interleaved: ggml's flash attention
#      (--diffusion-fa), libsdpa (--diffusion-fa, SD_LIBSDPA=1) and ggml's
#      unfused attention (no flag); prints each sampling time and the PSNR
#      between the images.
set -euo pipefail
cd "$(dirname "$0")/../../.."
rounds=${1:-2}
work=$PWD/build-ggml
py=${PYTHON:-$PWD/build-py/venv/bin/python}
src="$work/stable_diffusion_cpp_python-0.4.7/vendor/stable-diffusion.cpp"
[ -d "$src" ] && [ -d "$work/sdpa" ] || { echo "run.sh: run scripts/ggml-check.sh first"; exit 2; }
if [ ! -x "$work/sdcpp/build/bin/sd-cli" ]; then
  rm -rf "$work/sdcpp" && cp -r "$src" "$work/sdcpp"
  patch -s -d "$work/sdcpp" -p1 < examples/ggml/sdcpp/sdcpp.patch
  cmake -S "$work/sdcpp" -B "$work/sdcpp/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DCMAKE_CXX_FLAGS="-DSD_USE_LIBSDPA -I$work/sdpa/include" \
    -DCMAKE_CXX_STANDARD_LIBRARIES="-L$work/sdpa/lib -lsdpa -Wl,-rpath,$work/sdpa/lib" >/dev/null 2>&1
  cmake --build "$work/sdcpp/build" -j"$(nproc 2>/dev/null || echo 2)" --target sd-cli >/dev/null 2>&1
fi
[ -f "$work/sd15-random/unet/diffusion_pytorch_model.safetensors" ] ||
  "$py" examples/ggml/sdcpp/random_sd15.py "$work/sd15-random"
echo "# stable-diffusion.cpp 0.4.7 (sdist's vendored copy + sdcpp.patch), random SD 1.5, 256x256, 2 Euler steps, cfg 7, seed 42, 2 threads; $(date -u +%F)"
grep -m1 "model name" /proc/cpuinfo | sed 's/^/# /'
for r in $(seq 1 "$rounds"); do
  for mode in ggml-fa libsdpa ggml-unfused; do
    flags=(--diffusion-fa); env=0
    [ $mode = libsdpa ] && env=1
    [ $mode = ggml-unfused ] && flags=()
    SD_LIBSDPA=$env "$work/sdcpp/build/bin/sd-cli" -m "$work/sd15-random" -p "a red fox in the snow" \
      -W 256 -H 256 --steps 2 -s 42 -t 2 "${flags[@]}" -o "$work/sd_$mode.png" > "$work/sd_$mode.log" 2>&1
    echo "round $r  $mode  $(grep -o 'sampling completed, taking [0-9.]*s' "$work/sd_$mode.log")"
  done
done
"$py" - "$work" <<'PY'
import sys
import numpy as np
from PIL import Image
w = sys.argv[1]
im = {m: np.asarray(Image.open(f"{w}/sd_{m}.png").convert("RGB")).astype(np.float64)
      for m in ("ggml-fa", "libsdpa", "ggml-unfused")}
for a, b in (("libsdpa", "ggml-fa"), ("libsdpa", "ggml-unfused"), ("ggml-fa", "ggml-unfused")):
    mse = ((im[a] - im[b]) ** 2).mean()
    psnr = float("inf") if mse == 0 else 10 * np.log10(255 ** 2 / mse)
    print(f"{a} vs {b}: PSNR {psnr:.2f} dB, max |diff| {int(np.abs(im[a] - im[b]).max())} of 255")
PY
