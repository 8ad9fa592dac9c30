#!/usr/bin/env bash
# deps.sh - installs what building and testing libsdpa needs, only where it
# is missing: a C compiler, CMake, Python 3 with NumPy (for the CLI tests),
# OpenBLAS (the cpu.blas baseline), libpng (`sdpa dit` images), clang with
# libFuzzer (the fuzz targets), Open MPI (libsdpa_mpi), oneDNN (a peer in
# bench/peers), and an AArch64 cross-compiler with qemu user-mode emulation
# (cpu.neon's tests, scripts/neon-check.sh); libsdpa builds
# without those, leaving out what needs them.
set -euo pipefail
missing=()
command -v cc >/dev/null || command -v gcc >/dev/null || missing+=(gcc)
command -v cmake >/dev/null || missing+=(cmake)
command -v make >/dev/null || missing+=(make)
command -v python3 >/dev/null || missing+=(python3 python3-pip)
command -v clang >/dev/null || missing+=(clang)
for pkg in libopenblas-dev libpng-dev libclang-rt-dev openmpi-bin libopenmpi-dev libdnnl-dev \
  gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static; do
  if command -v dpkg >/dev/null && ! dpkg -s "$pkg" >/dev/null 2>&1; then
    missing+=("$pkg")
  fi
done
# venv for the Python package's tests (scripts/python-test.sh); Debian's
# python3 keeps it in a separate package
if command -v python3 >/dev/null && ! python3 -c "import venv, ensurepip" 2>/dev/null; then
  missing+=(python3-venv)
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
