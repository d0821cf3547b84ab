#!/bin/sh
# Install what shoal needs to build and test, if it is missing.
# Debian/Ubuntu: apt-get (uses sudo when not root). macOS: Homebrew.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)

# The official OpenAI client (npm package `openai`, the version pinned in
# tests/serve/node/package-lock.json) for tests/serve/test_clients.py, into
# tests/serve/node/node_modules (git ignores it); skipped when it is there.
npm_client() {
    dir="$ROOT/tests/serve/node"
    want=$(sed -n 's/.*"openai": "\([0-9.]*\)".*/\1/p' "$dir/package.json")
    have=$(sed -n 's/^  "version": "\(.*\)",$/\1/p' \
        "$dir/node_modules/openai/package.json" 2>/dev/null || true)
    [ -n "$want" ] && [ "$have" = "$want" ] && return 0
    echo "install-deps: npm ci: openai $want into tests/serve/node/node_modules" >&2
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
}

DEBS="build-essential meson ninja-build pkg-config clang libclang-rt-dev libomp-dev \
libjansson-dev libxxhash-dev libpcre2-dev libutf8proc-dev libuv1-dev libprotobuf-c-dev \
protobuf-c-compiler libsodium-dev liburing-dev libcriterion-dev libedit-dev python3 \
python3-numpy python3-matplotlib python3-jinja2 python3-regex fio \
libmicrohttpd-dev curl chromium python3-websocket libavahi-core-dev"
BREWS="meson ninja pkg-config libomp jansson xxhash pcre2 utf8proc libuv protobuf-c \
criterion libedit libsodium libmicrohttpd numpy node"

if [ "$(uname -s)" = "Darwin" ]; then
    missing=""
    for p in $BREWS; do brew list --versions "$p" >/dev/null 2>&1 || missing="$missing $p"; done
    [ -z "$missing" ] || brew install $missing
    npm_client
    exit 0
fi

missing=""
for p in $DEBS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
# Node.js and npm for the client tests: Debian's, unless a node and an npm
# are already on PATH (NodeSource's nodejs carries its own npm, and
# conflicts with Debian's npm package).
command -v node >/dev/null 2>&1 || missing="$missing nodejs"
command -v npm >/dev/null 2>&1 || missing="$missing npm"
if [ -n "$missing" ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "install-deps: installing:$missing" >&2
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q $missing
fi
npm_client
