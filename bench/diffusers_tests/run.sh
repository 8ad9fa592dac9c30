#!/usr/bin/env bash
# run.sh - diffusers' own transformer model tests with libsdpa as diffusers'
# active attention backend, against the same tests with diffusers' native
# backend, in one venv (build-py/venv: torch and diffusers, as
# scripts/python-test.sh keeps it; the package installed from this tree):
#
#   bench/diffusers_tests/run.sh DIFFUSERS_CHECKOUT [pytest target ...]
#
# DIFFUSERS_CHECKOUT is a diffusers source tree (its tests/ are run, its
# package is not: the installed diffusers is). Default target:
# tests/models/transformers. Three runs: native, libsdpa (the backend), and
# libsdpa+route (the backend and libsdpa.torch_route.enable(), for the
# processors that call torch's SDPA themselves); then compare.py lists the
# tests that pass with native and fail with libsdpa, with the calls libsdpa
# took. Outputs in build-py/diffusers-tests/.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
checkout=$(cd "${1:?usage: run.sh DIFFUSERS_CHECKOUT [pytest target ...]}" && pwd)
shift
targets=("${@:-tests/models/transformers}")
py="$root/build-py/venv/bin/python"
out="$root/build-py/diffusers-tests"
mkdir -p "$out"
# what diffusers' tests import beyond diffusers itself
"$py" -m pip install --quiet --disable-pip-version-check parameterized pytest-timeout \
  transformers accelerate peft sentencepiece 2>&1 | tail -2 || true
for mode in native libsdpa libsdpa+route; do
  echo "== $mode"
  (cd "$checkout" && LIBSDPA_DIFFUSERS_MODE=$mode LIBSDPA_DIFFUSERS_REPORT="$out/$mode.json" \
    PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} \
    "$py" -m pytest -q -p libsdpa_plugin -p no:cacheprovider --timeout 600 \
      "${targets[@]}" > "$out/$mode.log" 2>&1 || true)
  tail -1 "$out/$mode.log"
done
"$py" "$here/compare.py" "$out/native.json" "$out/libsdpa.json" "$out/libsdpa+route.json"
