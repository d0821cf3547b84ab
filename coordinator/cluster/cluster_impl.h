/* cluster internals shared by cluster.c (create/destroy), cluster_net.c
 * (loop thread: connections, handshakes, heartbeats, reconnects, control
 * port) and cluster_sched.c (forward thread: placement, requests, failure
 * handling).
 *
 * Locking: cl->mu guards every field marked [mu] (executor state, peer
 * info, counters, the pending table, the outbox). Fields marked [loop] are
 * touched only by the loop thread, [main] only by the forward thread.
 */
#ifndef SHOAL_CLUSTER_IMPL_H
#define SHOAL_CLUSTER_IMPL_H

#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#include "cluster.h"
#include "wire.h"

/* Frames a worker may split one answer into (ExpertRequest.parts): the
 * wire carries the first parts while it computes the rest. */
#define SHOAL_CLUSTER_PARTS 4

/* A rate from decayed sums of observations (shoal_cluster_seen_rate). */
struct seen_rate {
    double bytes, seconds;
};

enum exec_kind {
    EXEC_LOCAL = 0,
    EXEC_STATIC,     /* dialled by us, reconnected with backoff */
    EXEC_JOINED,     /* dialled us (--accept-workers) */
};

enum exec_state {
    EXEC_DOWN = 0,
    EXEC_JOINING,    /* handshake done, waiting for the first heartbeat echo */
    EXEC_UP,
    EXEC_DRAINING,   /* the worker is shutting down: placement skips it */
};

struct conn;

/* What the forward thread copies from the executors for one layer
 * (placement reads only this, without the lock). */
struct cluster_snap {
    int n;                                         /* executors */
    int64_t il;
    int up[SHOAL_CLUSTER_MAX_EXECUTORS];
    uint64_t gen[SHOAL_CLUSTER_MAX_EXECUTORS];
    uint32_t max_frame[SHOAL_CLUSTER_MAX_EXECUTORS];
    double rtt_s[SHOAL_CLUSTER_MAX_EXECUTORS];     /* 0 for the local store */
    double disk[SHOAL_CLUSTER_MAX_EXECUTORS];      /* bytes/s */
    double compute[SHOAL_CLUSTER_MAX_EXECUTORS];   /* expert bytes/s */
    double weight[SHOAL_CLUSTER_MAX_EXECUTORS];    /* rendezvous weight: experts/s */
    uint64_t write_queue[SHOAL_CLUSTER_MAX_EXECUTORS];
    uint8_t *holds;                                /* [MAX_EXECUTORS][n_expert] layer il */
};

struct exec {
    /* fixed at creation */
    char addr[128];              /* "local", the static address, or the joiner's name */
    enum exec_kind kind;
    uint64_t seed;               /* rendezvous seed: hash of addr */
    struct sockaddr_storage ss;  /* STATIC: where to dial */
    socklen_t ss_len;
    /* [mu] */
    enum exec_state state;
    uint64_t gen;                /* connection generation (bumped per handshake) */
    uint8_t *holds;              /* [n_layer][n_expert] 1 if held; NULL: nothing yet */
    uint32_t experts_held;       /* MoE experts of the shard */
    double disk_mbps;            /* handshake (0: unknown -> default) */
    double disk_mbps_seen;       /* observed from StatusReply deltas (0: none yet); a
                                  * short start-up probe misjudges throttled or bursty
                                  * disks, so placement prefers this once known */
    struct seen_rate disk_seen;     /* [mu] behind disk_mbps_seen */
    double compute_gbps_seen;       /* [mu] from its answers (0: none yet), preferred to
                                     * compute_gbps once known */
    struct seen_rate compute_seen;  /* [mu] behind compute_gbps_seen */
    int seen_from_answers;          /* [mu] its answers carry read_busy_seconds: they
                                     * feed the sums, its status replies no longer */
    double compute_gbps;
    uint64_t cache_bytes;        /* its expert cache budget (UINT64_MAX unlimited) */
    uint32_t max_frame;          /* largest frame it accepts */
    int resolved;                /* start-up: up, or failed for good, or timed out */
    char last_error[256];
    uint64_t requests, errors, reconnects;
    uint64_t bytes_sent, bytes_received;
    uint64_t payload_sent;       /* [mu] f32 rows its requests needed: hidden rows sent */
    uint64_t payload_received;   /* [mu] and expert outputs answered (the wire's minimum) */
    uint64_t ssd_bytes;          /* [mu] bytes_read its answered requests reported */
    double rtt_ms;               /* last heartbeat round trip */
    uint64_t last_seen_ns;       /* monotonic time of the last frame from it */
    uint32_t in_flight;          /* expert requests outstanding */
    uint64_t write_queue;        /* bytes queued in libuv towards it */
    /* its StatusReply (workers) */
    uint64_t cache_used, cache_limit, hits, misses, bytes_read;
    double read_busy_seconds;
    uint32_t queue_depth;
    int faulty;                  /* it returned non-finite expert outputs that another
                                  * holder's recomputation did not reproduce: placement
                                  * skips it for the cluster's life (its connection
                                  * stays, for status) */
    uint64_t unchecked;          /* its non-finite answers kept with no other holder up
                                  * to recompute them */
    /* [loop] */
    struct conn *conn;           /* live connection or NULL */
    uv_timer_t reconnect;        /* STATIC */
    int reconnect_init;
    double backoff_s;
    uint64_t hb_sent_ns;         /* outstanding heartbeat (0: none) */
    uint64_t hb_id;
    int reset_assigned;          /* [mu] set at a new connection: its cache is empty */
    double busy_s;               /* [mu] read + compute seconds of its layer steps */
    uint64_t busy_steps;         /* [mu] layer steps it was up for */
    /* [main] what placement believes is in its RAM (cache model for spill-over) */
    uint8_t *assigned;           /* [n_layer][n_expert] */
    uint64_t assigned_bytes;
    /* [main] its RAM as it last reported it (ExpertResponse resident bitmaps;
     * the local store's read at each snapshot): placement's cache model
     * where known, the assigned guess above where not. NULL until the first */
    uint8_t *resident;           /* [n_layer][(n_expert + 7) / 8] */
    uint8_t *loading;            /* [n_layer][(n_expert + 7) / 8] of those, still read */
    uint8_t *resident_known;     /* [n_layer] 1: the row was reported */
    double *resident_at;         /* [n_layer] when (shoal_cluster_now) */
};

enum pending_state {
    PEND_SENT = 0,
    PEND_DONE,                   /* frame holds the reply */
    PEND_FAILED,                 /* why says what happened */
};

struct pending {
    uint64_t id;                 /* 0: free */
    int exec;
    uint64_t gen;
    enum pending_state state;
    Shoal__Frame *frame;         /* response or error reply, owned */
    uint64_t reply_bytes;        /* SENT: the largest frame its reply may take */
    uint64_t recv_ns;
    char why[256];
    /* a response in parts (ExpertRequest.parts): the outputs of the parts
     * so far [part_len], put before the last frame's; loop thread */
    uint8_t *part;
    uint64_t part_len;
    uint64_t total_rows;         /* the request's output rows */
    uint32_t parts_left;         /* frames that may still come */
};

enum out_kind {
    OUT_SEND = 0,                /* write data to exec's connection of generation gen */
    OUT_CLOSE,                   /* close exec's connection of generation gen (why) */
};

struct out_msg {
    enum out_kind kind;
    int exec;
    uint64_t gen;
    uint64_t req_id;             /* SEND of a request: fail this pending if unsent */
    uint8_t *data;               /* owned */
    size_t len;
    char why[200];
    struct out_msg *next;
};

struct shoal_cluster {
    const struct shoal_model *model;    /* borrowed */
    const struct shoal_container *ct;   /* borrowed: the experts' container */
    struct shoal_cluster_params p;      /* copy; strings borrowed */
    struct shoal_wire_key key;
    char fingerprint[17];
    Shoal__PeerInfo info;               /* ours */
    char info_name[128];
    char software[32];
    int64_t n_layer, n_expert, n_embd, n_layer_moe;
    uint64_t blob_bytes;
    uint8_t *is_moe;                    /* [n_layer] */

    pthread_mutex_t mu;
    pthread_cond_t cond;                /* CLOCK_MONOTONIC: replies, start-up */

    /* executors [mu] (the array is fixed; entries appended under mu) */
    struct exec exec[SHOAL_CLUSTER_MAX_EXECUTORS];
    int n_exec;
    int local;                          /* index of the local executor, or -1 */
    uint64_t local_bytes_seen;          /* its store's bytes_read counted so far */

    /* pending requests [mu] */
    struct pending *pend;
    int n_pend, cap_pend;
    uint64_t next_id;                   /* [mu] */

    /* outbox [mu] */
    struct out_msg *out_head, *out_tail;
    int stopping;

    /* loop [loop] */
    uv_loop_t loop;
    uv_async_t async;
    uv_timer_t tick;
    uv_tcp_t accept_srv, control_srv;
    int have_accept, have_control;
    char control_bound[128];
    char accept_bound[128];
    char join_refused[300];      /* the last joiner refused: "PEER: why" (loop thread
                                  * writes, a failed start reads it under mu) */
    uv_thread_t thread;
    int thread_started;
    unsigned tick_count;
    uint64_t status_seq;
    struct conn *conns;                 /* every open connection (list) */
    uint8_t *rbuf;                      /* one read buffer for every connection (lazy) */
    struct shoal_preauth preauth;       /* accepted connections in their handshake */
    int n_observers;                    /* authenticated control-port connections */

    /* status [mu] */
    struct shoal_ctx_timings t;         /* last snapshot from the forward pass */
    uint64_t tokens;
    uint64_t rounds;                    /* layer rounds that waited on a worker's answer */
    double tok_per_s;
    double decode_s[32];                /* recent decode steps' wall times */
    int64_t decode_n[32];               /* and the tokens each made (its sequences) */
    int n_decode, i_decode;
    double t_start;
    double net_s;                       /* estimated wire time, seconds */
    uint64_t *remote_runs;              /* [n_layer][n_expert] runs done by workers */
    uint8_t *last_worker;               /* [n_layer][n_expert] the worker of the last
                                         * remote run, 0xff: none */
    uint64_t n_split, split_rows;       /* entries whose rows were split among holders,
                                         * and the rows they held */
    uint64_t step_reads;                /* disk reads the workers' answers reported */
    uint64_t reads_hist[SHOAL_CLUSTER_READS_HIST];   /* layer steps by those reads */
    uint64_t bal_steps;                 /* layer steps with busy executors */
    double bal_ratio_sum;               /* sum over them of max / mean busy */

    /* [main] scratch of a layer step (step) and of a hint (hint) */
    struct cluster_snap *step, *hint;
    int32_t *tokmap;                    /* [n_tok_max] */
    float *hidden;                      /* [n_tok_max][n_embd] */
    uint32_t *rows;                     /* [n_slots_max] */
    int64_t n_tok_cap, n_slot_cap;

    /* [main] as an executor (cluster_experts.c) */
    struct shoal_local_experts *lx;     /* owned: the local share's executor */
    const struct shoal_moe_step *cur_step;  /* the step in progress */
    int cur_prefetch;                   /* 1: the local store wants hints */
    int32_t *pf_local;                  /* [cap_pf] the lookahead's local share */
    int64_t cap_pf, n_pf_local;
    int pf_pending;                     /* 1: hint pf_local at the local acquire */
};

#define CLUSTER_HEARTBEAT_MS 1000   /* heartbeat period; status requests every 2nd */

/* Defaults for an executor that reports no rate. */
#define CLUSTER_DEFAULT_DISK_MBPS 1000.0
#define CLUSTER_DEFAULT_COMPUTE_GBPS 10.0

/* cluster_net.c (the loop thread's callbacks; create/destroy wire them) */
void shoal_cluster_net_on_incoming(uv_stream_t *srv, int status);
void shoal_cluster_net_async(uv_async_t *a);     /* drains the outbox; stops */
void shoal_cluster_net_tick(uv_timer_t *t);      /* heartbeats, status, timeouts */
void shoal_cluster_net_reconnect(uv_timer_t *t); /* exec->reconnect's callback */
void shoal_cluster_net_dial(struct shoal_cluster *cl, int xi);
void shoal_cluster_net_stop_all(struct shoal_cluster *cl);  /* closes every handle */
void shoal_cluster_net_thread(void *arg);        /* runs the loop */

/* Add an observation (bytes over seconds) to r's sums, each keeping 0.9 of
 * what came before (about the last ten weigh). Returns the rate, bytes per
 * second, once the sums pass min_bytes and min_s; 0 before then or for
 * non-finite or negative input (not added). Caller holds mu. */
double shoal_cluster_seen_rate(struct seen_rate *r, double bytes, double seconds,
                               double min_bytes, double min_s);

/* Feed executor x's disk rate estimate (disk_mbps_seen): bytes its disk
 * read over busy_s seconds with reads in flight, into decayed sums (about
 * the last ten reports weigh). Non-finite or negative input is ignored.
 * Caller holds mu. */
void shoal_cluster_note_disk(struct exec *x, double bytes, double busy_s);

/* Rendezvous seed of an executor: a hash of its address. */
uint64_t shoal_cluster_addr_seed(const char *addr);

/* "up", "joining", "draining", "down", or "faulty" when x->faulty; static.
 * Caller holds mu. */
const char *shoal_cluster_state_name(const struct exec *x);

/* Queue a message for the loop (takes ownership of m) and wake it.
 * Thread: main. */
void shoal_cluster_post(struct shoal_cluster *cl, struct out_msg *m);

/* Mark executor x (connection generation gen) down with why and ask the
 * loop to close that connection. Caller holds no lock. Thread: main. */
void shoal_cluster_mark_down(struct shoal_cluster *cl, int x, uint64_t gen, const char *why);

/* Fill pend entries of exec x / gen as failed (why); caller holds mu. */
void shoal_cluster_fail_pending_locked(struct shoal_cluster *cl, int x, uint64_t gen,
                                       const char *why);

/* Monotonic seconds. */
double shoal_cluster_now(void);

/* Peer-supplied strings go into logs through shoal_wire_printable. */

#endif
