#!/usr/bin/env bash
# examples.sh BUILD_DIR - what a C project that uses libsdpa sees:
#   1. `cmake --install` into a temporary prefix; each examples/ project
#      builds against it with find_package(libsdpa) and runs;
#   2. examples/pkg-config builds with pkg-config against the same prefix;
#   3. `cpack -G DEB` packs the same install; the .deb is installed with
#      dpkg (as root, when dpkg is there), `pkg-config --libs libsdpa` and
#      the pkg-config example work against it, and it is removed again.
# A broken install fails here. scripts/test.sh runs it on build/.
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(cd "${1:-build}" && pwd)
work=$(mktemp -d)
deb_installed=
cleanup() {
  [ -n "$deb_installed" ] && dpkg -r libsdpa >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
passed=0

cmake --install "$build" --prefix "$work/prefix" >/dev/null
for ex in packed-qkv layers rules; do
  echo "-- examples/$ex (find_package against $work/prefix)"
  cmake -S "examples/$ex" -B "$work/$ex" -DCMAKE_PREFIX_PATH="$work/prefix" \
    -DCMAKE_C_FLAGS="-Wall -Wextra -Werror" >/dev/null
  cmake --build "$work/$ex" >/dev/null
  "$work/$ex/${ex//-/_}" | tail -3
  passed=$((passed + 1))
done
echo "-- examples/pkg-config (pkg-config against $work/prefix)"
PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig" examples/pkg-config/build.sh "$work/hello"
passed=$((passed + 1))

if command -v dpkg >/dev/null && [ "$(id -u)" = 0 ]; then
  echo "-- cpack -G DEB"
  (cd "$build" && cpack -G DEB -B "$work/deb" >/dev/null)
  deb=$(ls "$work"/deb/libsdpa_*.deb)
  if dpkg -s libsdpa >/dev/null 2>&1; then
    echo "examples: a libsdpa package is already installed here; not replacing it"
    echo "examples: $passed passed, 1 failed"
    exit 1
  fi
  dpkg -i "$deb" >/dev/null
  deb_installed=1
  echo "$(basename "$deb"): pkg-config --libs libsdpa -> $(pkg-config --libs libsdpa)"
  examples/pkg-config/build.sh "$work/hello-deb"
  sdpa --version
  passed=$((passed + 1))
else
  echo "-- SKIP the .deb: needs dpkg and root"
fi
echo "examples: $passed passed, 0 failed"
