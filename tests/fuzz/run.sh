#!/bin/bash
# Build the libFuzzer targets (clang, -Dfuzz=true, in build-fuzz) and run
# each for a bounded number of executions (tests/fuzz/README.md).
#
#   tests/fuzz/run.sh                  the short run tests/run_all.sh does:
#                                      about a minute in all on 2 cores
#   tests/fuzz/run.sh --time 600       each target for 10 minutes instead
#   tests/fuzz/run.sh --time 3600 wire_worker container
#                                      chosen targets only
# New inputs that reach new code go to build-fuzz/fuzz-corpus/<target>
# (kept between runs, so longer runs build on shorter ones); a crash, a
# leak or a broken memory budget is saved as
# build-fuzz/fuzz-artifacts/<target>-crash-<sha1> and fails the run (replay
# it with build-fuzz/tests/fuzz/fuzz_<target> FILE).
# Environment: SHOAL_FUZZ_SEED (default 1: the short run is reproducible),
# SHOAL_FUZZ_ARGS (extra libFuzzer flags, e.g. -fork=4), SHOAL_JOBS (ninja).
set -u
cd "$(dirname "$0")/../.."
BUILD=build-fuzz
TIME=""
ALL="wire_worker wire_coordinator safetensors container model_config tokenizer_hf gguf_vocab gguf ggml_blocks chat_template"
while [ $# -gt 0 ]; do
    case "$1" in
    --time) TIME=$2; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    -*) echo "run.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
    esac
done
TARGETS=${*:-$ALL}

# executions per target in the short run, each about 5 s on a busy core
# (a -max_total_time watchdog of 10 s stops a slow machine earlier)
runs_of() {
    case "$1" in
    wire_*) echo 400000 ;;
    container) echo 1500 ;;
    tokenizer_hf) echo 25000 ;;
    gguf_vocab|gguf|chat_template) echo 50000 ;;
    ggml_blocks) echo 700 ;;
    safetensors) echo 120000 ;;
    model_config) echo 300000 ;;
    esac
}
max_len_of() {
    case "$1" in
    tokenizer_hf|gguf_vocab|container) echo 32768 ;;
    *) echo 16384 ;;
    esac
}

if [ -d "$BUILD" ]; then
    CC=clang meson setup --reconfigure "$BUILD" -Dfuzz=true -Dtests=false \
        -Dbuildtype=debug -Doptimization=1 >/dev/null
else
    CC=clang meson setup "$BUILD" -Dfuzz=true -Dtests=false \
        -Dbuildtype=debug -Doptimization=1 >/dev/null
fi || exit 1
ninja -C "$BUILD" -j"${SHOAL_JOBS:-2}" fuzz >/dev/null || exit 1

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=0
for t in $TARGETS; do
    exe="$BUILD/tests/fuzz/fuzz_$t"
    seeds="tests/fuzz/corpus/$t"
    [ -x "$exe" ] && [ -d "$seeds" ] || { echo "run.sh: no target '$t'" >&2; exit 2; }
    work="$BUILD/fuzz-corpus/$t"
    mkdir -p "$work" "$BUILD/fuzz-artifacts"
    if [ -n "$TIME" ]; then
        limits="-max_total_time=$TIME"
    else
        limits="-runs=$(runs_of "$t") -max_total_time=10"
    fi
    log="$BUILD/fuzz-artifacts/$t.log"
    # shellcheck disable=SC2086
    if "$exe" $limits -seed="${SHOAL_FUZZ_SEED:-1}" -max_len="$(max_len_of "$t")" \
        -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=25 -print_final_stats=1 \
        -artifact_prefix="$BUILD/fuzz-artifacts/$t-" ${SHOAL_FUZZ_ARGS:-} \
        "$work" "$seeds" >"$log" 2>&1; then
        echo "fuzz $t: ok, $(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$log" |
            grep -o '[0-9]*$') inputs, $(grep -m1 -o 'stat::peak_rss_mb: *[0-9]*' "$log" |
            grep -o '[0-9]*$') MB peak RSS"
    else
        failed=$((failed + 1))
        echo "fuzz $t: FAILED (log: $log)"
        grep -E '^fuzz:|ERROR|SUMMARY|Test unit written' "$log" | head -6
    fi
done
[ "$failed" -eq 0 ]
