#!/bin/sh
# fuzz.sh - build the libFuzzer targets and fuzz each one for a bounded time.
#
#   sh scripts/fuzz.sh                       every target, FUZZ_SECONDS (default 25) each
#   FUZZ_SECONDS=600 sh scripts/fuzz.sh ops  one target for ten minutes
#   FUZZ_JOBS=N                              build jobs (default 2)
#
# Builds build-fuzz/ with clang: ASan + UBSan everywhere, libFuzzer coverage
# (-fsanitize=fuzzer-no-link) in the library too, and -Dfuzzing=true so the harnesses link
# libFuzzer. Each target fuzzes a copy of fuzz/corpus/<target>/ in a temporary directory (CI
# never changes the repository) with its dictionary fuzz/<target>.dict when there is one.
# A crash, leak, timeout or failed assertion stops the script with a non-zero status; the
# input that caused it is kept under fuzz-out/ (ignored by git) and the log is printed.
# docs/fuzzing.md says how to minimize it and add it to the corpus.
# Skips (status 0, with a message) when clang cannot build a libFuzzer program.
set -eu
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-25}
targets=${*:-isolation ops collision noninterference replay_input jsonl_scan kv_decode router tokenize template}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n);\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { return (int)(d == NULL && n); }\n' \
    >"$tmp/probe.c"
if ! command -v clang >/dev/null 2>&1 ||
    ! clang -fsanitize=fuzzer,address,undefined "$tmp/probe.c" -o "$tmp/probe" >/dev/null 2>&1; then
    echo "== fuzz: SKIPPED: clang with libFuzzer (libclang-rt-14-dev) is not available"
    exit 0
fi

echo "== fuzz: libFuzzer build (build-fuzz/), ${seconds}s per target"
[ -f build-fuzz/build.ninja ] || CC=clang meson setup build-fuzz -Dfuzzing=true \
    -Db_sanitize=address,undefined -Db_lundef=false -Dtests=false -Dbench=false \
    -Dc_args='-fsanitize=fuzzer-no-link -fno-sanitize-recover=all' >/dev/null
ninja -C build-fuzz -j "${FUZZ_JOBS:-2}" >/dev/null

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
mkdir -p fuzz-out
for t in $targets; do
    bin=build-fuzz/fuzz/fuzz_$t
    [ -x "$bin" ] || { echo "== fuzz: no target $t"; exit 1; }
    cp -R "fuzz/corpus/$t" "$tmp/corpus-$t"
    set -- -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="fuzz-out/$t-"
    [ -f "fuzz/$t.dict" ] && set -- "$@" -dict="fuzz/$t.dict"
    if ! "$bin" "$@" "$tmp/corpus-$t" >"$tmp/log-$t" 2>&1; then
        tail -n 60 "$tmp/log-$t"
        echo "== fuzz: $t FAILED; the input is in fuzz-out/ (see docs/fuzzing.md)"
        exit 1
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$tmp/log-$t")
    cov=$(grep -o 'cov: [0-9]*' "$tmp/log-$t" | tail -n 1)
    corp=$(ls "$tmp/corpus-$t" | wc -l)
    echo "fuzz_$t: ok, ${runs:-?} runs in ${seconds}s, ${cov:-cov: ?} edges, corpus $corp inputs"
done
rmdir fuzz-out 2>/dev/null || true
