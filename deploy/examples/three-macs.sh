#!/bin/sh
# Three Macs on a home LAN (docs/OPERATIONS.md): this Mac runs the
# coordinator and its own expert store over the whole container; two others
# run shoal-worker under launchd, each holding its shard on its own SSD.
#
#   deploy/examples/three-macs.sh MODEL_CONTAINER
#
# Edit the variables below first. Needs: ssh access to the workers (keys,
# not passwords), shoal built and installed on every Mac (`meson install -C
# build` puts shoal and shoal-worker in /usr/local/bin), and the same
# container (or its shards) on every Mac. Nothing here runs on the workers
# but `mkdir`, `rsync` and `launchctl`.
set -eu
MODEL=${1:?usage: $0 MODEL_CONTAINER}
WORKERS="mac-mini.local macbook.local"     # ssh host names of the two workers
PORT=7070                                   # shoal-worker port on each
REMOTE_DIR=/Users/Shared/shoal              # where shards and the key live there
CACHE=8G                                    # expert cache per worker
# How to split the experts between the two workers (their disks' MB/s).
WEIGHTS=2000,1000

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$MODEL.shards
KEY=$HOME/.config/shoal/cluster.key

# 1. One cluster key, copied to every machine; it never crosses the wire.
if [ ! -f "$KEY" ]; then
    mkdir -p "$(dirname "$KEY")"
    (umask 077 && head -c 32 /dev/urandom | base64 > "$KEY")
fi

# 2. One shard per worker. This Mac keeps the whole container: it holds
#    every expert too, so the cluster survives a worker going down, and the
#    coordinator places each expert by measured bandwidth among its holders.
shoal shard --model "$MODEL" --shards 2 --weights "$WEIGHTS" --out "$OUT"

# 3. Ship each worker its shard and the key, and start it under launchd.
i=0
ADDRS=""
for host in $WORKERS; do
    ssh "$host" mkdir -p "$REMOTE_DIR"
    rsync -a --info=progress2 "$OUT/worker-$i/" "$host:$REMOTE_DIR/shard/"
    rsync -a "$KEY" "$host:$REMOTE_DIR/cluster.key"
    ssh "$host" chmod 600 "$REMOTE_DIR/cluster.key"
    sed -e "s|/Users/Shared/shoal/qwen3-30b-a3b-int4/worker-1|$REMOTE_DIR/shard|" \
        -e "s|/Users/Shared/shoal/cluster.key|$REMOTE_DIR/cluster.key|" \
        -e "s|0.0.0.0:7070|0.0.0.0:$PORT|" -e "s|<string>8G</string>|<string>$CACHE</string>|" \
        "$ROOT/deploy/launchd/org.shoal.worker.plist" |
        ssh "$host" "cat > ~/Library/LaunchAgents/org.shoal.worker.plist &&
                     (launchctl bootout gui/\$(id -u)/org.shoal.worker 2>/dev/null || true) &&
                     launchctl bootstrap gui/\$(id -u) ~/Library/LaunchAgents/org.shoal.worker.plist"
    ADDRS="$ADDRS${ADDRS:+,}$host:$PORT"
    i=$((i + 1))
done

# 4. Chat. This Mac's in-process store is one more executor; `shoal status`
#    in another terminal shows all three.
echo "workers: $ADDRS"
exec shoal chat --model "$MODEL" --workers "$ADDRS" --cluster-key "$KEY" --expert-cache "$CACHE"
