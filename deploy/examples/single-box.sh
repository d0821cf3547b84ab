#!/bin/sh
# A coordinator and one expert worker on one machine (docs/OPERATIONS.md).
#
#   deploy/examples/single-box.sh [MODEL_DIR] [BUILD_DIR]
#
# MODEL_DIR: a Hugging Face checkpoint or a shoal container (default: the
# bundled model). A checkpoint is converted to a container first (workers
# serve containers). The worker listens on loopback, so no cluster key is
# needed; it holds every expert, and the coordinator runs none itself
# (--local-experts off), so every routed expert crosses the socket.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MODEL=${1:-$ROOT/models/shakespeare-moe}
BUILD=${2:-$ROOT/build}
SHOAL=$BUILD/coordinator/shoal
WORKER=$BUILD/worker/shoal-worker
WORK=$(mktemp -d /tmp/shoal-single-box.XXXXXX)
PORT=${SHOAL_WORKER_PORT:-7070}

cleanup() {
    [ -n "${WPID:-}" ] && kill "$WPID" 2>/dev/null && wait "$WPID" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

if [ ! -f "$MODEL/shoal.json" ]; then
    echo "== converting $MODEL to a container (int4 experts)"
    "$SHOAL" convert "$MODEL" "$WORK/model" --experts int4
    MODEL=$WORK/model
fi

echo "== starting shoal-worker on 127.0.0.1:$PORT"
"$WORKER" --model "$MODEL" --listen "127.0.0.1:$PORT" >"$WORK/worker.log" 2>&1 &
WPID=$!
i=0
until grep -q "serving" "$WORK/worker.log" 2>/dev/null; do
    i=$((i + 1))
    if [ $i -gt 100 ] || ! kill -0 "$WPID" 2>/dev/null; then
        cat "$WORK/worker.log"; exit 1
    fi
    sleep 0.1
done

echo "== generating through the worker"
"$SHOAL" run --model "$MODEL" --workers "127.0.0.1:$PORT" --local-experts off \
    --prompt "ROMEO:" --max-tokens 64 --seed 7 --stats
echo "== worker log"
cat "$WORK/worker.log"
