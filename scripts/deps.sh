#!/usr/bin/env bash
# deps.sh - installs what building and testing libsdpa needs, only where it
# is missing: a C compiler, CMake, Python 3 with NumPy (for the CLI tests),
# OpenBLAS (for the cpu.blas baseline; libsdpa builds without it).
set -euo pipefail
missing=()
command -v cc >/dev/null || command -v gcc >/dev/null || missing+=(gcc)
command -v cmake >/dev/null || missing+=(cmake)
command -v make >/dev/null || missing+=(make)
command -v python3 >/dev/null || missing+=(python3 python3-pip)
if command -v dpkg >/dev/null && ! dpkg -s libopenblas-dev >/dev/null 2>&1; then
  missing+=(libopenblas-dev)
fi
if ((${#missing[@]})); then
  echo "deps: installing ${missing[*]} with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! python3 -c "import numpy" 2>/dev/null; then
  echo "deps: installing numpy with pip"
  python3 -m pip install --quiet numpy 2>/dev/null ||
    python3 -m pip install --quiet --break-system-packages numpy
fi
