#!/bin/sh
# deps.sh - install the Debian 12 packages kvprefix needs, if any are missing.
# Used by example.sh and test.sh, so a fresh machine needs nothing installed by hand.
# Runs apt-get as root (or through sudo when available); does nothing when all are present.
set -eu

PKGS="meson ninja-build pkg-config gcc clang clang-format libclang-rt-14-dev llvm libxxhash-dev uthash-dev \
libcriterion-dev libjansson-dev zlib1g-dev libzstd-dev libssl-dev libsodium-dev"
# The Python package (pyproject.toml) and its tests.
PKGS="$PKGS python3-dev python3-venv python3-pip python3-mesonpy python3-pytest \
python3-prometheus-client python3-numpy python3-cbor2 python3-xxhash python3-jinja2"
# libkvprefix-events (KV events, router) and its tests: ZeroMQ, msgpack-c, the Python decoder.
PKGS="$PKGS libzmq3-dev libmsgpack-dev python3-zmq python3-msgpack"
# The router daemon (src/routerd/): HTTP through libmicrohttpd.
PKGS="$PKGS libmicrohttpd-dev"
# Its readiness notification under systemd (sd_notify; optional in meson).
PKGS="$PKGS libsystemd-dev"
# The BPE tokenizer (src/cli/tok/): PCRE2; its reference test (scripts/tokref.sh): node, npm
# (Debian's npm package, unless npm is there already: NodeSource's nodejs bundles its own).
PKGS="$PKGS libpcre2-dev libutf8proc-dev libsentencepiece-dev g++ nodejs"
# The router index's Redis backend (hiredis) and the server its tests start.
PKGS="$PKGS libhiredis-dev redis-server"
command -v npm >/dev/null 2>&1 || PKGS="$PKGS npm"

missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
        missing="$missing $p"
done
[ -z "$missing" ] && exit 0

echo "deps.sh: installing:$missing" >&2
if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
elif command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
else
    echo "deps.sh: need root (or sudo) to install:$missing" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q >/dev/null
# shellcheck disable=SC2086
$SUDO apt-get install -y -q --no-install-recommends $missing >/dev/null
