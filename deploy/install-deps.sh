#!/bin/sh
# Install what shoal needs to build and test, if it is missing.
# Debian/Ubuntu: apt-get (uses sudo when not root). macOS: Homebrew.
set -eu

DEBS="build-essential meson ninja-build pkg-config clang libclang-rt-dev libomp-dev \
libjansson-dev libxxhash-dev libpcre2-dev libutf8proc-dev libuv1-dev libprotobuf-c-dev \
protobuf-c-compiler libsodium-dev liburing-dev libcriterion-dev libedit-dev python3 \
python3-numpy python3-matplotlib python3-jinja2 python3-regex fio \
libmicrohttpd-dev chromium python3-websocket"
BREWS="meson ninja pkg-config libomp jansson xxhash pcre2 utf8proc libuv protobuf-c \
criterion libedit libsodium libmicrohttpd numpy"

if [ "$(uname -s)" = "Darwin" ]; then
    missing=""
    for p in $BREWS; do brew list --versions "$p" >/dev/null 2>&1 || missing="$missing $p"; done
    [ -z "$missing" ] || brew install $missing
    exit 0
fi

missing=""
for p in $DEBS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "install-deps: installing:$missing" >&2
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q $missing
fi
