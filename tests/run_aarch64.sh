#!/bin/sh
# Cross-compile the unit tests for aarch64 and run them under qemu-user, so
# that the NEON kernels and their bit-exactness against the scalar ones are
# tested on an x86-64 machine (docs/DESIGN.md section 7).
#
#   tests/run_aarch64.sh [--no-install]
#
# 1. installs what is missing (idempotent; apt never removes a package):
#    gcc-aarch64-linux-gnu, qemu-user-static, the arm64 architecture and the
#    arm64 -dev packages the build needs (ARM64_DEV below);
# 2. builds the Criterion shim (tests/cross/criterion-shim) for aarch64:
#    real Criterion cannot be used here. libcriterion-dev:arm64 is not
#    co-installable with the amd64 one (apt removes libcriterion-dev:amd64,
#    libnanomsg-dev and libgit2-dev to install it), and Criterion's BoxFort
#    re-executes the test binary for every test, which needs binfmt_misc
#    (not mounted here), while its nanomsg IPC hangs under qemu-aarch64 7.2;
# 3. configures build-aarch64 with tests/cross/aarch64-linux-gnu.ini (once),
#    builds only the unit-test executables (suite 'unit'), one by one;
# 4. runs each under qemu-aarch64 -cpu $QEMU_CPU -L /usr/aarch64-linux-gnu
#    from the build directory (as meson test does) and ends with the line
#        aarch64: N passed, M failed
#    counting test cases; a unit-test binary that does not build or whose
#    runner dies counts as one failure. Exit status 0 iff M is 0.
#
# Environment: BUILD_DIR (default <repo>/build-aarch64), JOBS (ninja -j,
# default 1), QEMU (default qemu-aarch64-static, else qemu-aarch64),
# QEMU_CPU (default max: every extension qemu emulates, DotProd and I8MM
# included, so the neon-dotprod and neon-i8mm kernels are tested; e.g.
# cortex-a57 for a baseline ARMv8.0 CPU, cortex-a76 for DotProd without I8MM),
# UNIT_TESTS (default all: space-separated unit-test names, e.g. "quant").
# Logs: $BUILD_DIR/meson-logs/aarch64-<test>.log.
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD_DIR:-$ROOT/build-aarch64}
SHIM_OUT=$BUILD-shim
SHIM_SRC=$ROOT/tests/cross/criterion-shim
CROSS=$ROOT/tests/cross/aarch64-linux-gnu.ini
JOBS=${JOBS:-1}
QEMU_CPU=${QEMU_CPU:-max}
ONLY=${UNIT_TESTS:-}
# arm64 -dev packages for the dependency() calls of the meson files (keep in
# step; optional ones like liburing are left out: qemu-user has no io_uring)
ARM64_DEV="libjansson-dev:arm64 libxxhash-dev:arm64 libpcre2-dev:arm64
           libutf8proc-dev:arm64 libuv1-dev:arm64 libprotobuf-c-dev:arm64
           libsodium-dev:arm64 pkgconf:arm64"
SYSROOT=/usr/aarch64-linux-gnu
START=$(date +%s)

say() { printf 'run_aarch64: %s\n' "$*" >&2; }

installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'ok installed'
}

# ---- 1. packages ----------------------------------------------------------
if [ "${1:-}" != "--no-install" ]; then
    missing=""
    for p in gcc-aarch64-linux-gnu qemu-user-static; do
        installed "$p" || missing="$missing $p"
    done
    if ! dpkg --print-foreign-architectures | grep -qx arm64; then
        say "adding the arm64 architecture"
        dpkg --add-architecture arm64
        apt-get update -qq
    fi
    # Never libcriterion-dev:arm64 here: see the header.
    for p in $ARM64_DEV; do
        installed "$p" || missing="$missing $p"
    done
    if [ -n "$missing" ]; then
        say "installing:$missing"
        # --no-remove: fail rather than remove an amd64 package to make room
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-remove \
            $missing >/dev/null
    fi
fi

QEMU=${QEMU:-}
if [ -z "$QEMU" ]; then
    QEMU=$(command -v qemu-aarch64-static || command -v qemu-aarch64 || true)
fi
[ -n "$QEMU" ] || { say "no qemu-aarch64 found"; exit 2; }

# ---- 2. the Criterion shim, built for aarch64 --------------------------------
mkdir -p "$SHIM_OUT/pkgconfig"
if [ ! -f "$SHIM_OUT/libcriterion_shim.a" ] ||
   [ -n "$(find "$SHIM_SRC" -newer "$SHIM_OUT/libcriterion_shim.a" -type f)" ]; then
    say "building the Criterion shim"
    aarch64-linux-gnu-gcc -std=c11 -O2 -Wall -Wextra -I"$SHIM_SRC/include" \
        -c "$SHIM_SRC/runner.c" -o "$SHIM_OUT/runner.o"
    rm -f "$SHIM_OUT/libcriterion_shim.a"
    aarch64-linux-gnu-ar rcs "$SHIM_OUT/libcriterion_shim.a" "$SHIM_OUT/runner.o"
fi
cat > "$SHIM_OUT/pkgconfig/criterion.pc" <<EOF
Name: criterion
Description: Criterion-compatible shim for qemu-user runs (tests/cross/criterion-shim)
Version: 2.4.1
Libs: $SHIM_OUT/libcriterion_shim.a -lm
Cflags: -I$SHIM_SRC/include
EOF

# ---- 3. configure once, build the unit tests --------------------------------
if [ ! -f "$BUILD/build.ninja" ]; then
    say "configuring $BUILD"
    rm -rf "$BUILD"   # a half-configured directory from a failed setup
    meson setup "$BUILD" "$ROOT" --cross-file "$CROSS" \
        -Dpkg_config_path="$SHIM_OUT/pkgconfig" >"$BUILD.setup.log" 2>&1 || {
        tail -5 "$BUILD.setup.log" >&2
        say "meson setup failed (log: $BUILD.setup.log; a new arm64 -dev package for ARM64_DEV?)"
        echo "aarch64: 0 passed, 1 failed"
        exit 1
    }
fi

# "name<TAB>executable" for every test of suite 'unit'
TESTS=$(meson introspect "$BUILD" --tests | python3 -c '
import json, sys
for t in json.load(sys.stdin):
    if "unit" in t["suite"] or any(s.endswith(":unit") for s in t["suite"]):
        print(t["name"] + "\t" + t["cmd"][0])')

passed=0
failed=0
skipped=0
failures=""
mkdir -p "$BUILD/meson-logs"
TAB=$(printf '\t')
while IFS="$TAB" read -r name exe; do
    [ -n "$name" ] || continue
    if [ -n "$ONLY" ]; then
        case " $ONLY " in *" $name "*) ;; *) continue ;; esac
    fi
    rel=${exe#"$BUILD"/}
    log="$BUILD/meson-logs/aarch64-$name.log"
    if ! ninja -C "$BUILD" -j"$JOBS" "$rel" >"$log" 2>&1; then
        say "$name: build failed (see $log)"
        failed=$((failed + 1))
        failures="$failures $name(build)"
        continue
    fi
    (cd "$BUILD" && timeout 3600 "$QEMU" -cpu "$QEMU_CPU" -L "$SYSROOT" "$exe" --jobs=1) \
        >"$log" 2>&1 || true
    synth=$(grep '^\[====\] Synthesis' "$log" | tail -1)
    if [ -z "$synth" ]; then
        say "$name: runner died (see $log)"
        failed=$((failed + 1))
        failures="$failures $name(runner)"
        continue
    fi
    p=$(echo "$synth" | sed -n 's/.*Passing: \([0-9]*\).*/\1/p')
    f=$(echo "$synth" | sed -n 's/.*Failing: \([0-9]*\).*/\1/p')
    c=$(echo "$synth" | sed -n 's/.*Crashing: \([0-9]*\).*/\1/p')
    s=$(echo "$synth" | sed -n 's/.*Skipped: \([0-9]*\).*/\1/p')
    passed=$((passed + p))
    failed=$((failed + f + c))
    skipped=$((skipped + ${s:-0}))
    if [ $((f + c)) -ne 0 ]; then
        failures="$failures $name"
        grep -E '^\[(FAIL|----)\]' "$log" | head -20 >&2
    fi
    say "$name: $p passed, $((f + c)) failed, ${s:-0} skipped"
    grep -h 'active quant kernels' "$log" | sed 's/^\[----\] info: /run_aarch64: /' >&2 || true
done <<EOF
$TESTS
EOF

say "qemu -cpu $QEMU_CPU; skipped $skipped; failing:${failures:- none}; $(($(date +%s) - START)) s"
echo "aarch64: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
