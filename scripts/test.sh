#!/bin/sh
# test.sh - install what is missing, then build and run the whole test suite twice:
#   1. gcc, warnings as errors            (build-test/)
#   2. clang with ASan + UBSan            (build-asan/); LeakSanitizer checks the plain
#      programs (tests/soak, and the kvprefix binary the CLI tests run) - it cannot see
#      inside Criterion's forked workers, whose tests count library memory themselves
# and check formatting. Exits non-zero on the first failure.
set -eu
cd "$(dirname "$0")/.."
sh scripts/deps.sh

echo "== gcc build, -Werror, full test suite"
[ -f build-test/build.ninja ] || CC=gcc meson setup build-test -Dwerror=true -Dbench=true >/dev/null
ninja -C build-test
meson test -C build-test --print-errorlogs

echo "== clang ASan+UBSan build, full test suite"
[ -f build-asan/build.ninja ] || CC=clang meson setup build-asan -Db_sanitize=address,undefined \
    -Db_lundef=false -Dc_args=-fno-sanitize-recover=all -Dbench=false >/dev/null
ninja -C build-asan
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
    meson test -C build-asan --print-errorlogs

if command -v clang-format >/dev/null 2>&1; then
    echo "== clang-format"
    git ls-files '*.c' '*.h' | xargs clang-format --dry-run --Werror
fi
echo "== all tests passed"
