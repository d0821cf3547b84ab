/* metrics: what `shoal serve` shows about itself: GET /metrics (Prometheus
 * text) and the dashboard's JSON snapshot (GET / reads it from the SSE
 * stream GET /v1/dashboard/events).
 *
 * An opaque object with its own mutex. Writers: the HTTP threads (one call
 * per finished HTTP request) and the engine thread (a call per finished
 * generation, a snapshot of the running and queued requests, and a sample
 * of the session's expert store, cluster and timings after each engine
 * step). Readers (the renderers, any thread) see only the copies kept
 * here: they never touch the session, model, store or cluster.
 *
 * The heat map: per (layer, expert), the demand acquires by tier (the
 * store's pinned / cache / disk, see shoal_expert_store_use_get) and the
 * runs done by cluster workers (shoal_cluster_expert_use_get), each
 * decayed exponentially with a half-life of SHOAL_SERVE_HEAT_HALF_LIFE_S
 * seconds of wall time, so it shows recent use; a cell's colour is its
 * dominant tier, its brightness its decayed count relative to the hottest
 * cell. A model without an expert store (a checkpoint: every expert in
 * RAM) has no heat map.
 */
#ifndef SHOAL_SERVE_METRICS_H
#define SHOAL_SERVE_METRICS_H

#include <stdint.h>

#include "session.h"

#define SHOAL_SERVE_HEAT_HALF_LIFE_S 20.0
#define SHOAL_SERVE_RECENT_REQUESTS 20     /* finished requests the dashboard lists */
#define SHOAL_SERVE_MAX_EVENT_STREAMS 16   /* dashboards watching at once */
#define SHOAL_SERVE_EVENT_PERIOD_MS 1000   /* one snapshot per stream per period */

struct shoal_serve_metrics;
struct serve_conns;

enum shoal_serve_job_state {
    SHOAL_SERVE_JOB_QUEUED = 0,
    SHOAL_SERVE_JOB_PREFILL,
    SHOAL_SERVE_JOB_DECODE,
};

/* One request the engine holds (queued or running), as the engine posts it. */
struct shoal_serve_job_stat {
    char id[48];                /* "cmpl-..." / "chatcmpl-..." */
    const char *endpoint;       /* "/v1/completions" or "/v1/chat/completions"; static */
    enum shoal_serve_job_state state;
    int64_t n_prompt;           /* prompt tokens (0 while queued) */
    int64_t n_cached;           /* of them, reused from the KV cache */
    int64_t n_gen;              /* tokens generated so far */
    int64_t max_tokens;         /* its limit (0: unknown) */
    double tok_per_s;           /* decode rate so far (0 before two tokens) */
    double t_received;          /* shoal_time_s() when the request arrived */
};

/* One generation the engine ran, when it ends (whatever the outcome). */
struct shoal_serve_request_stat {
    const char *id;             /* borrowed */
    const char *endpoint;       /* borrowed */
    int status;                 /* 200, or the error's HTTP status */
    const char *finish;         /* "stop", "length", "tool_calls", "cancelled", "error";
                                 * borrowed */
    int64_t n_prompt, n_cached, n_gen;
    double ttft_s;              /* arrival to the first token (0: none) */
    double tok_per_s;           /* decode rate (0: fewer than two tokens) */
    double seconds;             /* arrival to the end */
};

/* A new, empty metrics object for the model named model_id (copied).
 * Never fails (aborts on out-of-memory like shoal_xmalloc). Thread: any. */
struct shoal_serve_metrics *shoal_serve_metrics_create(const char *model_id);

/* Free it; NULL is a no-op. No other call may be running or follow (stop
 * the HTTP daemon first). Thread: any. */
void shoal_serve_metrics_free(struct shoal_serve_metrics *m);

/* The endpoint label of a URL path: the API's paths as they are, the
 * dashboard's files as "/", anything else as "other" (so labels stay a
 * small fixed set). Static storage. Thread: any. */
const char *shoal_serve_metrics_endpoint(const char *url);

/* An HTTP request ended with status (0: the connection closed before a
 * response was queued, counted as 499). Counts
 * shoal_requests_total{endpoint, status}. Thread: any. */
void shoal_serve_metrics_http(struct shoal_serve_metrics *m, const char *url, unsigned status);

/* A generation the engine ran ended: token counters, the finish reasons
 * and the dashboard's list of recent requests. Thread: any (the engine). */
void shoal_serve_metrics_request(struct shoal_serve_metrics *m,
                                 const struct shoal_serve_request_stat *r);

/* Replace the snapshot of the requests the engine holds.
 *   jobs       [n] borrowed (copied)
 *   n_queued   of them, waiting for a slot
 *   parallel   slots (requests generating at once), queue_cap: the queue's
 *              length limit (0: none beyond the slots)
 * Thread: any (the engine, after each step). */
void shoal_serve_metrics_jobs(struct shoal_serve_metrics *m,
                              const struct shoal_serve_job_stat *jobs, int n, int n_queued,
                              int parallel, int queue_cap);

/* One engine step (a forward pass over the batch's rows) of a kind:
 * decode rows only, or with prompt rows (prefill).
 *   rows        rows computed (decode tokens, drafts, prompt tokens)
 *   seconds     the step's forward pass
 *   acquires    routed experts the local store acquired during it (each
 *               expert once per layer step, for every row routed to it)
 *   bytes_read  expert bytes the store read during it (demand, prefetch)
 *   kv_bytes    KV cache bytes its rows attend over: per row and layer the
 *               sequence's cached rows up to and including its own (a
 *               window's at most), at the cache's dtype
 * The shoal_engine_step_* families of /metrics. Thread: any (the engine). */
struct shoal_serve_step_stat {
    uint64_t steps, rows, acquires, bytes_read;
    double seconds, kv_bytes;
};
void shoal_serve_metrics_step(struct shoal_serve_metrics *m, int prefill,
                              const struct shoal_serve_step_stat *st);

/* Copy what the renderers need from the session: the expert store's
 * counters and per-expert tier counts, the cluster's executors and
 * per-expert placement, the context's timings; update the decayed heat
 * map. Costs a copy of n_layer * n_expert * 3 counters under the store's
 * lock (and 9 bytes per expert under the cluster's). Thread: the engine
 * (the session's owner), after an engine step, never during one. */
void shoal_serve_metrics_sample(struct shoal_serve_metrics *m, struct shoal_session *s);

/* Report the HTTP connection table's counters (conns.h; borrowed: it must
 * outlive m's renderers) in /metrics. Thread: any. */
void shoal_serve_metrics_conns(struct shoal_serve_metrics *m, struct serve_conns *conns);

/* Render the Prometheus text exposition (version 0.0.4, HELP and TYPE
 * lines for every family). Returns a malloc'd NUL-terminated string owned
 * by the caller. Thread: any. */
char *shoal_serve_metrics_prometheus(struct shoal_serve_metrics *m);

/* Render the dashboard's JSON snapshot (docs/OPERATIONS.md describes its
 * fields). Returns a malloc'd NUL-terminated string owned by the caller.
 * Thread: any. */
char *shoal_serve_metrics_json(struct shoal_serve_metrics *m);

/* The SSE response of GET /v1/dashboard/events: "data: <json>\n\n" at once
 * and then every SHOAL_SERVE_EVENT_PERIOD_MS until the client goes (the
 * next write fails), the connection times out or shoal_serve_metrics_stop
 * is called. Returns NULL when SHOAL_SERVE_MAX_EVENT_STREAMS are open
 * already (answer 429) or libmicrohttpd cannot make a response.
 * Thread: a connection's. */
struct MHD_Response;
struct MHD_Response *shoal_serve_metrics_events(struct shoal_serve_metrics *m);

/* End every event stream now (the server stops). Thread: any. */
void shoal_serve_metrics_stop(struct shoal_serve_metrics *m);

/* The dashboard's static files, embedded at build time
 * (coordinator/serve/dashboard/, see embed.py). */
struct shoal_serve_asset {
    const char *path;            /* "/", "/dashboard.js", ... */
    const char *content_type;
    const unsigned char *data;
    unsigned long size;
};

/* The asset served at url, or NULL. Thread: any. */
const struct shoal_serve_asset *shoal_serve_asset_find(const char *url);

#endif
