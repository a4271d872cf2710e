#!/bin/sh
# fuzz.sh - build the libFuzzer targets and fuzz each one for a bounded time.
#
#   sh scripts/fuzz.sh                       every target, FUZZ_SECONDS (default 25) each
#   FUZZ_SECONDS=600 sh scripts/fuzz.sh ops  one target for ten minutes (a campaign)
#   FUZZ_PARALLEL=2                          targets fuzzed at once (default 1)
#   FUZZ_JOBS=N                              build jobs (default 2)
#   sh scripts/fuzz.sh --setup               configure and build only (scripts/test.sh)
#
# Builds build-asan/ with clang: ASan + UBSan everywhere, libFuzzer coverage
# (-fsanitize=fuzzer-no-link) in the library too, and -Dfuzzing=true so the harnesses link
# libFuzzer. It is the same build scripts/test.sh runs every suite in (its fuzz tests replay
# each corpus with -runs=0), so a test run and a campaign share one build. Each target
# fuzzes a copy of fuzz/corpus/<target>/ in a temporary directory (a run never changes the
# repository) with its dictionary fuzz/<target>.dict when there is one. A crash, leak,
# timeout or failed assertion stops the script with a non-zero status; the input that
# caused it is kept under fuzz-out/ (ignored by git) and the log is printed.
# docs/fuzzing.md says how to minimize it and add it to the corpus.
# Skips (status 0, with a message) when clang cannot build a libFuzzer program.
set -eu
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-25}
parallel=${FUZZ_PARALLEL:-1}
setup_only=false
if [ "${1:-}" = "--setup" ]; then
    setup_only=true
    shift
fi
targets=${*:-isolation ops collision noninterference replay_input jsonl_scan kv_decode router tokenize template jinja hftok routerd_http routerd_events tiers}
build=build-asan

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n);\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { return (int)(d == NULL && n); }\n' \
    >"$tmp/probe.c"
if ! command -v clang >/dev/null 2>&1 ||
    ! clang -fsanitize=fuzzer,address,undefined "$tmp/probe.c" -o "$tmp/probe" >/dev/null 2>&1; then
    echo "== fuzz: SKIPPED: clang with libFuzzer (libclang-rt-14-dev) is not available"
    exit 0
fi

[ -f $build/build.ninja ] || CC=clang CXX=clang++ meson setup $build -Dfuzzing=true \
    -Db_sanitize=address,undefined -Db_lundef=false -Dbench=false \
    -Dc_args='-fsanitize=fuzzer-no-link -fno-sanitize-recover=all' >/dev/null
ninja -C $build -j "${FUZZ_JOBS:-2}" >/dev/null
$setup_only && exit 0
echo "== fuzz: libFuzzer ($build/), ${seconds}s per target, $parallel at a time"

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
mkdir -p fuzz-out

# Fuzz one target into $tmp/log-$1; exit status 0 when it found nothing.
fuzz_one() {
    bin=$build/fuzz/fuzz_$1
    cp -R "fuzz/corpus/$1" "$tmp/corpus-$1"
    set -- "$1" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="fuzz-out/$1-"
    [ -f "fuzz/$1.dict" ] && set -- "$@" -dict="fuzz/$1.dict"
    t=$1
    shift
    "$bin" "$@" "$tmp/corpus-$t" >"$tmp/log-$t" 2>&1
}

# Report one finished target; exit on a failure.
report() {
    if [ "$2" -ne 0 ]; then
        tail -n 60 "$tmp/log-$1"
        echo "== fuzz: $1 FAILED; the input is in fuzz-out/ (see docs/fuzzing.md)"
        exit 1
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$tmp/log-$1")
    cov=$(grep -o 'cov: [0-9]*' "$tmp/log-$1" | tail -n 1)
    corp=$(ls "$tmp/corpus-$1" | wc -l)
    echo "fuzz_$1: ok, ${runs:-?} runs in ${seconds}s, ${cov:-cov: ?} edges, corpus $corp inputs"
}

for t in $targets; do
    [ -x "$build/fuzz/fuzz_$t" ] || {
        echo "== fuzz: no target $t"
        exit 1
    }
done
# Batches of $parallel targets, each in the background; wait for each and report in order.
set -- $targets
while [ $# -gt 0 ]; do
    batch=""
    i=0
    while [ $# -gt 0 ] && [ $i -lt "$parallel" ]; do
        fuzz_one "$1" &
        batch="$batch $1:$!"
        shift
        i=$((i + 1))
    done
    for tp in $batch; do
        st=0
        wait "${tp#*:}" || st=$?
        report "${tp%%:*}" "$st"
    done
done
rmdir fuzz-out 2>/dev/null || true
