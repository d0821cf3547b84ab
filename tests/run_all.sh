#!/bin/bash
# The whole test suite: what README's second command and CI run.
#
#   tests/run_all.sh              every stage, in this order (CI: .ci/run)
#   tests/run_all.sh STAGE...     the chosen stages only, still in this order
#   tests/run_all.sh --list       the stage names, one a line
#
# Stages:
#   gcc        gcc release build with -Werror (build-test): unit tests,
#              reference model, CLI, cluster, serve and bench smoke tests
#   asan       gcc ASan+UBSan debug build (build-asan): unit tests,
#              reference model tests, cluster and serve tests
#   clang      clang build, liburing disabled (closest to macOS), -Werror
#              (build-clang): unit tests, the OpenMP wait default
#   fuzz       clang libFuzzer build: each fuzz target for a bounded number
#              of runs (tests/fuzz/run.sh)
#   aarch64    aarch64 cross build of the unit tests (build-aarch64), run
#              under qemu-user (NEON; tests/run_aarch64.sh)
#   cross-isa  an aarch64 worker under qemu serving an x86 coordinator, and
#              GGUF files run whole by the aarch64 shoal under qemu; needs
#              build-test's shoal (built when missing) and build-aarch64 (from
#              the aarch64 stage: run `tests/run_all.sh aarch64 cross-isa`)
# A new stage: a function stage_NAME below and NAME in STAGES.
# An unknown stage: a one-line error naming the stages, exit status 2.
# Prints one closing line "tests: N passed, M failed" and exits non-zero on
# any failure.
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
JOBS=${SHOAL_JOBS:-2}
# No OpenMP wait policy here: shoal and shoal-worker choose one that holds
# on a loaded machine themselves (common/base/omp_env.h), and the tests run what
# users get; the unit tests get the same values from meson (tests/meson.build).
passed=0
failed=0
failures=()
STAGES="gcc asan clang fuzz aarch64 cross-isa"

step() { # name, command...
    local name=$1; shift
    echo "=== $name"
    if "$@"; then
        passed=$((passed + 1)); echo "--- ok: $name"
    else
        failed=$((failed + 1)); failures+=("$name"); echo "--- FAILED: $name"
    fi
}

setup() { # dir, meson args...
    local dir=$1; shift
    if [ -d "$dir" ]; then
        meson setup --reconfigure "$dir" "$@" >/dev/null
    else
        meson setup "$dir" "$@" >/dev/null
    fi && ninja -C "$dir" -j"$JOBS"
}

unit() { meson test -C "$1" --suite unit --print-errorlogs --num-processes 1; }

reference() { # build dir
    "$PY" tests/reference/test_reference.py --shoal "$1/coordinator/shoal" &&
    "$PY" tests/reference/test_bad_input.py --shoal "$1/coordinator/shoal" &&
    "$PY" tests/reference/test_fp8.py --shoal "$1/coordinator/shoal"
}

stage_gcc() {
    step "numpy reference self-test"  "$PY" tests/reference/selftest_ref.py
    step "source layers: no include of a later layer, no circle between folders" "$PY" tests/check_layers.py
    step "build gcc -Werror"          setup build-test --werror -Dbuildtype=release
    step "unit tests (gcc)"           unit build-test
    step "reference tests (gcc)"      reference build-test
    step "container + expert store contract (gcc)" "$PY" tests/reference/test_store_contract.py --shoal build-test/coordinator/shoal
    step "shoal synth smoke (gcc)" "$PY" tests/reference/test_synth.py --shoal build-test/coordinator/shoal
    step "shoal's OpenMP wait default (gcc, libgomp)" "$PY" tests/reference/test_omp_env.py --shoal build-test/coordinator/shoal --worker build-test/worker/shoal-worker
    step "shoal shard (gcc)" "$PY" tests/reference/test_shard.py --shoal build-test/coordinator/shoal
    step "shoal plan vs convert/synth and the real configs (gcc)" "$PY" tests/reference/test_plan.py --shoal build-test/coordinator/shoal
    step "shoal plan: verdict, exit 3, units, memory per machine, derived hit rate vs a simulated LRU, the default skew curve (gcc)" "$PY" tests/reference/test_plan_speed.py --shoal build-test/coordinator/shoal
    step "shoal template vs jinja2 (gcc)" "$PY" tests/reference/test_chat_template_jinja.py --shoal build-test/coordinator/shoal
    step "expert store memory bound (gcc; needs root)" "$PY" tests/reference/test_memory_bound.py --shoal build-test/coordinator/shoal
    step "shoal-worker protocol, bad frames, keys, churn (gcc)" "$PY" tests/cluster/test_worker.py --worker build-test/worker/shoal-worker --probe build-test/tests/cluster/wire_probe --shoal build-test/coordinator/shoal
    step "cluster: placements, failover, handshake errors, status (gcc)" "$PY" tests/cluster/test_cluster.py --shoal build-test/coordinator/shoal --worker build-test/worker/shoal-worker
    step "cluster: non-finite outputs from a poisoned worker: recomputed, worker marked faulty, bits unchanged (gcc)" "$PY" tests/cluster/test_faulty.py --shoal build-test/coordinator/shoal --worker build-test/worker/shoal-worker
    step "cluster: every family, netlab, restarts, 1000-step soak (gcc)" "$PY" tests/cluster/test_cluster_more.py --shoal build-test/coordinator/shoal --worker build-test/worker/shoal-worker
    step "bench/sweep + shoal bench smoke (gcc)" "$PY" tests/bench/test_sweep_smoke.py --shoal build-test/coordinator/shoal --worker build-test/worker/shoal-worker
    step "bench/omp_policy_bench.py smoke (gcc)" "$PY" tests/bench/test_omp_policy_bench.py --shoal build-test/coordinator/shoal
    step "bench/vs_llamacpp.py smoke (gcc; GGUF case with SHOAL_LLAMA_CPP)" "$PY" tests/bench/test_vs_llamacpp.py --shoal build-test/coordinator/shoal
    step "bench/kernel_bench smoke (gcc)" "$PY" tests/bench/test_kernel_bench.py --bench build-test/bench/kernel_bench
    step "README cluster quick start on the bundled checkpoint (gcc)" "$PY" tests/cluster/test_quickstart.py --shoal build-test/coordinator/shoal --worker build-test/worker/shoal-worker
    step "worker draining on SIGTERM (gcc)" "$PY" tests/cluster/test_drain.py --shoal build-test/coordinator/shoal --worker build-test/worker/shoal-worker
    step "peer limits: memory per unauthenticated peer, cancel on close, SIGTERM, handshake caps as flags (gcc)" "$PY" tests/cluster/test_peer_limits.py --shoal build-test/coordinator/shoal --worker build-test/worker/shoal-worker --probe build-test/tests/cluster/wire_probe
    [ -f tests/golden/run_golden.py ] && step "bundled model golden (gcc)" "$PY" tests/golden/run_golden.py --shoal build-test/coordinator/shoal
    step "command line: help, model paths, prompt files, bad input, chat, worker start line (gcc)" "$PY" tests/cli/test_cli.py --shoal build-test/coordinator/shoal --worker build-test/worker/shoal-worker
    step "a new user's first hour: no worker up fails unless --local-fallback, log lines off the streamed text, 'not a model directory', convert without a tokenizer, a busy control port (gcc)" "$PY" tests/cli/test_first_hour.py --shoal build-test/coordinator/shoal --worker build-test/worker/shoal-worker
    step "one name and one meaning per flag across commands: hints name accepted flags, positional model, shard --shards, status --control, one --max-tokens default, bench's default model (gcc)" "$PY" tests/cli/test_flag_names.py --shoal build-test/coordinator/shoal
    step "shoal run/chat stop signals: SIGTERM/SIGINT end at the next token (143/130), a second exits at once (gcc)" "$PY" tests/cli/test_signals.py --shoal build-test/coordinator/shoal --worker build-test/worker/shoal-worker
    step "tokenizer.json ids far past its token count: sparse tables, peak RSS bounded, real files still tokenize (gcc)" "$PY" tests/cli/test_tokenizer_ids.py --shoal build-test/coordinator/shoal
    step "KV cache dtype: --kv, convert --kv, the manifest's kv field (gcc)" "$PY" tests/cli/test_kv.py --shoal build-test/coordinator/shoal
    step "shoal inspect FILE.gguf: groups, types, experts, split sets, bad files (gcc)" "$PY" tests/cli/test_inspect_gguf.py --shoal build-test/coordinator/shoal
    step "shoal run FILE.gguf (qwen3moe): BF16/F32 files give the checkpoint's logits bytes, Q8_0 experts within cosine 0.99 and Q4_K/Q6_K within 0.98, random Q2_K..IQ1_S/MXFP4 experts within 0.9999 of their F32 decoding, thread-count independent, its vocabulary, bad files exit 2 (gcc)" "$PY" tests/cli/test_run_gguf.py --shoal build-test/coordinator/shoal
    step "a GGUF's experts streamed by the expert store and served by shoal-workers: the checkpoint's logits bytes with O_DIRECT, uring/pread, a 1 MB cache, pins, a split set, 2 workers; counts in the cache dir; --mirror refused (gcc)" "$PY" tests/cli/test_gguf_stream.py --shoal build-test/coordinator/shoal
    step "shoal convert FILE.gguf: every tensor keeps its ggml type (K-quant and IQ mixes, gpt-oss MXFP4, deepseek2, a split set): the GGUF's logits bytes; inspect types, --verify, chat template, requantize with --experts/--dense, --mirror, shard + 2 workers; truncated or NaN input exit 2 with no DST (gcc)" "$PY" tests/cli/test_gguf_convert.py --shoal build-test/coordinator/shoal
    step "shoal run FILE.gguf (deepseek2 with attn_kv_b or attn_k_b/attn_v_b, qwen2moe, olmoe, glm4moe, Mixtral, gpt-oss F32/BF16/MXFP4): tiny checkpoints written as llama.cpp's converter writes them give the checkpoint's logits bytes (MXFP4: within int8 activations' rounding); bad files exit 2 (gcc)" "$PY" tests/cli/test_gguf_arch.py --shoal build-test/coordinator/shoal
    step "shoal chat / serve on a GGUF: its tokenizer.chat_template and bos/eos token texts give the checkpoint's replies; without one, one line (gcc)" "$PY" tests/cli/test_gguf_chat.py --shoal build-test/coordinator/shoal
    step "shoal serve: OpenAI API vs shoal run, streaming, chat, errors, key, 429, disconnects (gcc)" "$PY" tests/serve/test_serve.py --shoal build-test/coordinator/shoal
    step "shoal serve against slow clients: 220 slow sockets, head deadline, body rate, per-address cap, eviction (gcc)" "$PY" tests/serve/test_slow_clients.py --shoal build-test/coordinator/shoal
    step "shoal serve under load: 8 streaming clients x 50 requests with disconnects beside 200 slow sockets, solo texts, RSS/fds flat, /metrics (gcc)" "$PY" tests/serve/test_load.py --shoal build-test/coordinator/shoal
    step "shoal serve batching: each request alone = beside 3 others = shoal run, tokens and logits bytes (bundled, deepseek_v3, gpt_oss) (gcc)" "$PY" tests/serve/test_batching.py --shoal build-test/coordinator/shoal
    step "shoal serve on a harmony model (gpt-oss vocabulary and template): analysis in reasoning_content, final in content, tool calls, streamed and whole (gcc)" "$PY" tests/serve/test_harmony_serve.py --shoal build-test/coordinator/shoal
    step "shoal serve with real clients: the OpenAI npm client vs shoal run, curl errors, slow clients (gcc; node part skips without deploy/install-deps.sh)" "$PY" tests/serve/test_clients.py --shoal build-test/coordinator/shoal
    step "shoal serve: /metrics (Prometheus) and the dashboard in headless chromium (gcc)" "$PY" tests/serve/test_dashboard.py --shoal build-test/coordinator/shoal --worker build-test/worker/shoal-worker
}

stage_asan() {
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    step "build gcc ASan+UBSan"       setup build-asan -Dbuildtype=debug -Db_sanitize=address,undefined
    step "unit tests (ASan+UBSan)"    unit build-asan
    step "reference tests (ASan+UBSan)" reference build-asan
    [ -f tests/golden/run_golden.py ] && step "bundled model golden + chat (ASan+UBSan)" "$PY" tests/golden/run_golden.py --shoal build-asan/coordinator/shoal --skip-perplexity
    step "shoal's OpenMP wait default (ASan+UBSan)" "$PY" tests/reference/test_omp_env.py --shoal build-asan/coordinator/shoal --worker build-asan/worker/shoal-worker
    step "shoal-worker protocol (ASan+UBSan)" "$PY" tests/cluster/test_worker.py --worker build-asan/worker/shoal-worker --probe build-asan/tests/cluster/wire_probe --shoal build-asan/coordinator/shoal
    step "peer limits (ASan+UBSan)" "$PY" tests/cluster/test_peer_limits.py --shoal build-asan/coordinator/shoal --worker build-asan/worker/shoal-worker --probe build-asan/tests/cluster/wire_probe
    step "cluster (ASan+UBSan)" "$PY" tests/cluster/test_cluster.py --shoal build-asan/coordinator/shoal --worker build-asan/worker/shoal-worker
    step "cluster faulty worker (ASan+UBSan)" "$PY" tests/cluster/test_faulty.py --shoal build-asan/coordinator/shoal --worker build-asan/worker/shoal-worker
    step "cluster more (ASan+UBSan)" "$PY" tests/cluster/test_cluster_more.py --shoal build-asan/coordinator/shoal --worker build-asan/worker/shoal-worker
    step "shoal run/chat stop signals (ASan+UBSan)" "$PY" tests/cli/test_signals.py --shoal build-asan/coordinator/shoal --worker build-asan/worker/shoal-worker
    step "shoal serve (ASan+UBSan)" "$PY" tests/serve/test_serve.py --shoal build-asan/coordinator/shoal
    # a small quarantine, so that the load test's RSS check sees the heap, not ASan's freed-memory hold
    ASAN_OPTIONS=$ASAN_OPTIONS:quarantine_size_mb=1 step "shoal serve under load (ASan+UBSan)" "$PY" tests/serve/test_load.py --shoal build-asan/coordinator/shoal
    step "shoal serve against slow clients (ASan+UBSan)" "$PY" tests/serve/test_slow_clients.py --shoal build-asan/coordinator/shoal
    unset ASAN_OPTIONS UBSAN_OPTIONS
}

stage_clang() {
    CC=clang step "build clang, no liburing, -Werror" setup build-clang --werror -Dliburing=disabled
    step "unit tests (clang)"         unit build-clang
    step "shoal's OpenMP wait default (clang, libomp)" "$PY" tests/reference/test_omp_env.py --shoal build-clang/coordinator/shoal --worker build-clang/worker/shoal-worker
}

# libFuzzer targets for every decoder of untrusted bytes (tests/fuzz/README.md),
# a bounded number of executions each: about a minute in all
stage_fuzz() {
    step "fuzz targets, short run (clang ASan+UBSan+libFuzzer)" tests/fuzz/run.sh
}

# aarch64 (Apple Silicon's ISA): cross-compiled unit tests under qemu-user,
# so the NEON kernels are checked bit for bit against the scalar ones.
stage_aarch64() {
    step "unit tests (aarch64 under qemu, NEON)" tests/run_aarch64.sh
}

# the headline mix: an aarch64 (NEON) worker serving an x86 coordinator
cross_isa() {
    if [ ! -f build-aarch64/build.ninja ]; then
        echo "cross-isa: build-aarch64 is not configured: run the aarch64 stage first" \
             "(tests/run_all.sh aarch64 cross-isa)"
        return 1
    fi
    if [ ! -x build-test/coordinator/shoal ]; then
        echo "cross-isa: building build-test's shoal (the gcc stage's build)"
        if [ -f build-test/build.ninja ]; then
            ninja -C build-test -j"$JOBS" coordinator/shoal
        else
            setup build-test --werror -Dbuildtype=release
        fi || return 1
    fi
    ninja -C build-aarch64 -j"$JOBS" worker/shoal-worker coordinator/shoal >/dev/null &&
    "$PY" tests/cluster/test_cross_isa.py --shoal build-test/coordinator/shoal \
        --arm-worker build-aarch64/worker/shoal-worker \
        --arm-shoal build-aarch64/coordinator/shoal
}
stage_cross_isa() {
    step "cluster and GGUF runs across ISAs: aarch64 worker and shoal under qemu, x86 coordinator" cross_isa
}

chosen=()
for a in "$@"; do
    case "$a" in
    --list) printf '%s\n' $STAGES; exit 0 ;;
    -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;;
    esac
    case " $STAGES " in
    *" $a "*) chosen+=("$a") ;;
    *) echo "run_all.sh: unknown stage '$a' (stages: $STAGES)" >&2; exit 2 ;;
    esac
done
for s in $STAGES; do
    case " ${chosen[*]:-$STAGES} " in
    *" $s "*) "stage_${s//-/_}" ;;
    esac
done
echo
for f in "${failures[@]}"; do echo "FAILED: $f"; done
echo "tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
