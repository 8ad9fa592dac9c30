#!/usr/bin/env bash
# python-test.sh - the Python package's tests (called by scripts/test.sh):
# builds the wheel once (pip wheel ., scikit-build-core and CMake), then
#   build-py/venv        torch, diffusers, ml_dtypes, pytest: every test in
#                        python/tests (against numpy float64, torch's SDPA,
#                        torch.compile, a diffusers transformer)
#   build-py/venv-numpy  numpy and pytest only: the package imports and runs
#                        without torch (the torch and diffusers tests skip,
#                        saying so)
# The torch wheel from PyPI brings its CUDA libraries (about 5 GB, a few
# minutes on a fresh machine); the venv is kept between runs in one tree.
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(command -v python3)
mkdir -p build-py
for v in venv venv-numpy; do
  [ -x "build-py/$v/bin/python" ] || "$py" -m venv "build-py/$v"
done
echo "== python: dependencies"
build-py/venv/bin/pip install --quiet --disable-pip-version-check numpy pytest ml_dtypes torch \
  diffusers
build-py/venv-numpy/bin/pip install --quiet --disable-pip-version-check numpy pytest
echo "== python: the wheel"
rm -rf build-py/dist
build-py/venv/bin/pip wheel --quiet --disable-pip-version-check --no-deps -w build-py/dist .
wheel=$(ls build-py/dist/libsdpa-*.whl)
echo "$wheel"
for v in venv venv-numpy; do
  "build-py/$v/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps \
    "$wheel"
done
# From a directory without the sources, so the installed package is tested.
cd build-py
echo "== python: numpy only"
venv-numpy/bin/python -c "import libsdpa, numpy as np; q = np.ones((1, 4, 1, 8), np.float32); \
print('numpy only:', libsdpa.attention(q, q, q).shape, libsdpa.last_backend())"
venv-numpy/bin/python -m libsdpa info | head -3
venv-numpy/bin/python -m pytest -q -rs ../python/tests
echo "== python: with torch and diffusers"
venv/bin/python -m pytest -q -rs ../python/tests
