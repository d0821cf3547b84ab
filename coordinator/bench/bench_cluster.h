/* bench_cluster: what `shoal bench` measures of a cluster: the network
 * limit between the coordinator and each worker (a ping-pong of
 * Heartbeat frames for the round-trip time, and of Heartbeats carrying a
 * payload the worker echoes for bulk throughput), and the cluster's own
 * counters during a run (wire bytes per executor, network time).
 *
 * The probe dials each worker as a coordinator would (same handshake,
 * key and fingerprint), before any session is open, and sends only
 * Heartbeats, so it changes nothing on the worker.
 *
 * Thread: main.
 */
#ifndef SHOAL_BENCH_CLUSTER_H
#define SHOAL_BENCH_CLUSTER_H

#include <jansson.h>
#include <stdint.h>

#include "forward.h"
#include "model_config.h"
#include "session.h"

struct shoal_bench_net_params {
    const char *fingerprint;  /* the model's, 16 hex digits (the worker checks it); borrowed */
    const struct shoal_model_config *cfg;  /* the model's shapes for our PeerInfo; borrowed */
    int rtt_rounds;           /* empty heartbeats for the RTT (default 50) */
    uint32_t payload_bytes;   /* bulk payload per heartbeat (default 4 MiB) */
    double bulk_seconds;      /* at least this long of bulk round trips (default 1) */
};

/* Each worker address of so's --workers (comma lists): RTT (median and
 * min of rtt_rounds round trips, ms) and bulk throughput (payload bytes
 * out and back divided by the time, MB/s = 1e6 bytes/s). Returns
 * {"workers": [{"address", "rtt_ms", "rtt_ms_min", "mb_per_s", ...} or
 * {"address", "error"}], "mb_per_s": the slowest link, "rtt_ms": the
 * slowest median}, or {"skipped": why} when there are no --workers (or
 * only --accept-workers: joining workers cannot be dialled). Never fails.
 * Thread: main (single-threaded: no session may be open). */
json_t *shoal_bench_net(const struct shoal_session_opts *so,
                        const struct shoal_bench_net_params *p);

/* Each --workers address's own counters (a StatusRequest, dialled as in
 * shoal_bench_net): {"address", "hits", "misses", "bytes_read",
 * "read_busy_seconds", "requests", "errors"} or {"address", "error"}; a
 * JSON array, or NULL without --workers. Call it between repetitions (no
 * session open). Thread: main. */
json_t *shoal_bench_worker_status(const struct shoal_session_opts *so,
                                  const struct shoal_bench_net_params *p);

/* Seconds of t spent on the wire (the cluster's estimate; 0 without a
 * cluster). Thread: any. */
double shoal_bench_network_seconds(const struct shoal_ctx_timings *t);

/* Snapshot of the cluster's per-executor counters of session s: a JSON
 * array of {"address", "state", "bytes_sent", "bytes_received",
 * "payload_sent", "payload_received" (the f32 rows requests and answers
 * carried: the wire's minimum), "ssd_bytes" (expert bytes the worker read),
 * "requests", "errors", "reconnects", "rtt_ms", "experts_held", "busy_s"
 * (read + compute seconds of its layer steps), "busy_steps"}, or NULL when
 * s has no cluster. Owned by the caller. Thread: main. */
json_t *shoal_bench_cluster_snapshot(struct shoal_session *s);

/* The cluster's layer rounds that waited on workers so far
 * (shoal_cluster_rounds; 0 without a cluster). Thread: main. */
double shoal_bench_cluster_rounds(struct shoal_session *s);

/* The cluster's balance counters of session s (shoal_cluster_balance_get):
 * {"steps", "ratio_sum" (of max / mean busy per layer step over those
 * steps), "split_experts", "split_rows"}, or NULL without a cluster. Owned
 * by the caller. Thread: main. */
json_t *shoal_bench_cluster_balance(struct shoal_session *s);

/* Per executor, the counters of `after` minus those of `before` (two
 * snapshots of one session), with "wire_bytes" = sent + received added.
 * *total gets the sum of wire_bytes. Returns a new array (owned), or NULL
 * when either is NULL. Thread: any. */
json_t *shoal_bench_cluster_delta(const json_t *before, const json_t *after, double *total);

#endif
