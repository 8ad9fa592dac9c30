#!/usr/bin/env bash
# build.sh - builds hello.c with pkg-config and runs it. PKG_CONFIG_PATH
# must name PREFIX/lib/pkgconfig for an install outside pkg-config's path.
set -euo pipefail
cd "$(dirname "$0")"
out=${1:-./hello}
# shellcheck disable=SC2046
cc -std=c11 -Wall -Wextra -Werror hello.c $(pkg-config --cflags --libs libsdpa) \
  -Wl,-rpath,"$(pkg-config --variable=libdir libsdpa)" -o "$out"
"$out"
