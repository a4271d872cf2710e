#!/bin/sh
# example.sh - install what is missing, build, and run kvprefix on its bundled example.
set -eu
cd "$(dirname "$0")/.."
sh scripts/deps.sh
[ -f build/build.ninja ] || meson setup build >/dev/null
ninja -C build >/dev/null
./build/src/cli/kvprefix demo
