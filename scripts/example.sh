#!/bin/sh
# example.sh - install what is missing, build, generate the bundled example request log and
# replay it through kvprefix: the report at one cache size, the capacity curve (also drawn as
# build/example/curve.svg) and where prompts stop sharing (the timestamp-first tenant).
#
# The example log comes from examples/gen_chatlog.c (fixed seed, so the same bytes every
# time): 600 chat requests of three tenants on two models, with shared system prompts, tool
# text, multi-turn chats, a shared document, one tenant that puts a timestamp first and one
# that puts it last.
set -eu
cd "$(dirname "$0")/.."
sh scripts/deps.sh
[ -f build/build.ninja ] || meson setup build >/dev/null
ninja -C build >/dev/null
mkdir -p build/example
./build/gen_chatlog -o build/example/chat.jsonl
./build/src/cli/kvprefix replay --capacity 1024 --sweep=12 --plot build/example/curve.svg \
    --diagnose --top 5 build/example/chat.jsonl
echo
echo "(curve: build/example/curve.svg; the same log as OpenAI request bodies:"
echo " ./build/gen_chatlog --format openai | ./build/src/cli/kvprefix replay --capacity 1024 -)"
