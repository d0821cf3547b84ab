/* cluster: the coordinator's side of a shoal cluster (DESIGN §5): the
 * executors that run routed experts (the coordinator's own expert store
 * and shoal-worker processes), their connections, placement of each MoE
 * layer's batch-union on them, failure handling, and the status served to
 * `shoal status` on the control port.
 *
 * Executors: index 0 is the local store (unless local_experts is off),
 * then the static workers in the order given, then workers that joined,
 * each keeping its index for as long as the cluster lives (a worker that
 * reconnects gets its old index back, by address).
 *
 * Threads: a libuv loop on its own thread owns every socket: it dials the
 * static workers (handshake connector, role COORDINATOR), accepts joining
 * workers and observers, sends heartbeats (every second; RTT) and status
 * requests (every 2 s), and reconnects dropped static workers with backoff
 * (0.25 s doubling to 5 s). The forward thread (the caller of everything
 * below) hands it packed frames through a mutex-protected outbox and
 * uv_async_send, and waits for replies on a condition variable, always
 * with a deadline.
 *
 * Results never depend on placement (DESIGN contract 1): an executor
 * returns each expert's unweighted output rows, which land in their own
 * slots of the caller's buffer; the combine stays with the caller, in
 * route-rank order. A row's output does not depend on the other rows of
 * its request (the kernels are batch-invariant: tests/unit/
 * test_batching.c), so an expert's rows may be split among its holders.
 */
#ifndef SHOAL_CLUSTER_H
#define SHOAL_CLUSTER_H

#include <stdint.h>

#include "err.h"
#include "experts.h"
#include "model.h"
#include "moe.h"
#include "wire.h"

#define SHOAL_CLUSTER_MAX_EXECUTORS 64
#define SHOAL_CLUSTER_READS_HIST 1025   /* buckets of shoal_cluster_balance.reads_hist */
#define SHOAL_CLUSTER_CONTROL_DEFAULT "127.0.0.1:7077"

/* When an expert's rows are split among its holders (issue 33). */
enum shoal_cluster_split {
    SHOAL_CLUSTER_SPLIT_AUTO = 0,   /* when the estimate says it shortens the step */
    SHOAL_CLUSTER_SPLIT_OFF,        /* never: each expert runs whole on one holder */
    SHOAL_CLUSTER_SPLIT_ALWAYS,     /* every expert of >= 4 rows with >= 2 holders up, in
                                     * proportion to their speed (tests, measurements) */
};

struct shoal_cluster_params {
    const char *const *workers;   /* [n_workers] static workers "HOST:PORT", borrowed */
    int n_workers;
    const char *accept_addr;      /* --accept-workers ADDR:PORT, or NULL */
    const char *control_addr;     /* control port for `shoal status`; NULL: off */
    int control_explicit;         /* 1: given by the user, a bind failure is fatal;
                                   * 0: the default, a bind failure is a warning */
    int local_experts;            /* 1: the coordinator's store is an executor */
    int local_fallback;           /* 1: with local_experts, a start where no static
                                   * worker came up goes on with the local store
                                   * alone (a warning); 0: it fails */
    const char *key_path;         /* --cluster-key FILE, or NULL (loopback only) */
    double connect_timeout_s;     /* wait for static workers at start (default 5) */
    double request_timeout_s;     /* deadline of one expert request (default 30) */
    uint64_t local_cache_bytes;   /* the local store's cache budget (status only) */
    int max_unauthenticated;      /* accepted connections in their handshake at once
                                   * (control and accept ports together; each costs
                                   * at most ~64 KiB, docs/PROTOCOL.md "Limits"); a
                                   * new one evicts the least advanced. 1..
                                   * SHOAL_WIRE_MAX_UNAUTH_LIMIT */
    int max_unauth_per_addr;      /* of those, from one source (an IPv6 /64:
                                   * shoal_wire_peer_group); 1..max_unauthenticated */
    const struct shoal_container *ct; /* the routed experts' container, borrowed: NULL
                                   * for m->ct; a GGUF model's (the session's
                                   * gguf_experts, container_gguf.c) */
    enum shoal_cluster_split split_rows;   /* default auto */
};

static inline struct shoal_cluster_params shoal_cluster_params_default(void)
{
    return (struct shoal_cluster_params){.local_experts = 1,
                                         .connect_timeout_s = 5.0,
                                         .request_timeout_s = 30.0,
                                         .local_cache_bytes = UINT64_MAX,
                                         .max_unauthenticated =
                                             SHOAL_WIRE_MAX_UNAUTH_DEFAULT,
                                         .max_unauth_per_addr =
                                             SHOAL_WIRE_MAX_UNAUTH_PER_ADDR_DEFAULT};
}

struct shoal_cluster;

/* Start the cluster of a container model (m borrowed; m->store and the
 * container, p->ct or else m->ct, must be set and outlive the cluster). Loads the key, binds the listeners
 * (without a key each must be a loopback address), starts the loop thread,
 * then waits up to connect_timeout_s for the static workers' handshakes.
 * Each worker that failed (refused, wrong fingerprint or key, silent) is
 * reported on stderr with its address and why, in one line. Fails when an
 * expert of a MoE layer then has no holder, naming the layer, the expert
 * and the peers that are down; and, with workers given and the local store
 * on, when none of them (nor a joiner) is up, naming each and why, unless
 * local_fallback.
 * Returns the cluster (owned by the caller) or NULL with err set:
 * -SHOAL_EINVAL (bad address, a non-loopback listener without a key,
 * not a container, unauthenticated caps out of range), -SHOAL_ENOTFOUND (an expert
 * without a holder, no worker up), -errno
 * (bind/listen). Thread: main. */
struct shoal_cluster *shoal_cluster_create(const struct shoal_model *m,
                                           const struct shoal_cluster_params *p,
                                           struct shoal_err *err);

/* Stop the loop thread, close every connection, free everything. NULL is a
 * no-op. Workers are left running. Thread: main. */
void shoal_cluster_destroy(struct shoal_cluster *cl);

/* The cluster as an executor of routed experts (experts.h), for
 * shoal_ctx_params.experts: each MoE layer step runs as
 * shoal_cluster_run_layer, its local share on the cluster's local executor
 * (the model's store), and the router lookahead is hinted to the executors
 * placement would give the next layer's experts. max_rows keeps a step's
 * request to one worker within half a wire frame. The cluster must outlive
 * the contexts using it. Thread: main. */
struct shoal_experts shoal_cluster_experts(struct shoal_cluster *cl);

/* Compute the given entries of bu with the local expert store into their
 * slots of yg (the caller's code, run on the calling thread).
 *   bu   the step's work union, borrowed: the layer's batch-union, or one
 *        whose entries are pieces of it (an expert with a run of its
 *        slots: row splitting), over the same slots; each expert at most
 *        once in sel
 *   sel  [n_sel] indices into bu->expert, ascending, borrowed
 * Returns 0 or a negative status with err set. */
typedef int (*shoal_cluster_local_fn)(void *user, int64_t il,
                                      const struct shoal_batch_union *bu, const int64_t *sel,
                                      int64_t n_sel, struct shoal_err *err);

/* One MoE layer step of the forward pass. */
struct shoal_cluster_layer {
    int64_t il;                         /* a MoE layer */
    int64_t n_tok;                      /* rows of h */
    int64_t k;                          /* n_expert_used */
    const float *h;                     /* [n_tok][n_embd] f32 normed input, borrowed */
    const struct shoal_batch_union *bu; /* the layer's batch-union, borrowed */
    float *yg;                          /* [n_tok*k][n_embd] f32 expert outputs by slot,
                                         * written for every slot of bu */
    shoal_cluster_local_fn local;       /* computes local entries */
    /* called once, after every remote request of the first round is out and
     * before the local executor starts (router lookahead goes here);
     * n_local: entries the local executor got this round. May be NULL. */
    void (*after_send)(void *user, int64_t n_local);
    void *user;
};

/* Run one layer's batch-union on the cluster: place each expert on one
 * holder that is up (weighted rendezvous, then spill-over to balance the
 * estimated finish times), then split the rows of an expert with several
 * up holders among them (in proportion to their estimated speed: a
 * contiguous run of its slots each) where that shortens the step's
 * estimated makespan (issue 33; an expert of fewer than 4 rows stays
 * whole); from then on each piece is placed, sent, checked and re-run as
 * an expert is (one piece of an expert per executor per round). Send one
 * ExpertRequest per remote executor (all
 * before any wait), compute the local share with L->local, then wait for
 * the replies (deadline request_timeout_s), validate them and copy each
 * expert's rows into its slots of L->yg. A request that times out or whose
 * connection drops marks its executor down; one answered by an ErrorReply
 * is logged; either way its experts are re-run on other holders within the
 * step, until done or no holder is left. An expert whose answer from a
 * worker holds a NaN or an infinity is recomputed by another holder (the
 * local store's answer and finite answers are trusted): the same bits are
 * kept, other bits mark that worker faulty for the cluster's life (one
 * warning; placement and hints skip it) and the recomputation is used;
 * with no other holder up, the answer is kept with a warning.
 * Returns 0, or with err set: -SHOAL_ENOTFOUND "layer L expert E: no
 * holder left (down: ADDR (why), ...)", or the local store's error when no
 * other holder could take over. Never blocks past the deadlines.
 * Thread: main. */
int shoal_cluster_run_layer(struct shoal_cluster *cl, const struct shoal_cluster_layer *L,
                            struct shoal_err *err);

/* The estimated wire time of the layer steps since the last call,
 * seconds (see shoal_ctx_timings.network); resets it. Thread: main. */
double shoal_cluster_take_network_s(struct shoal_cluster *cl);

/* Router lookahead: send each remote executor a PrefetchHint for the
 * experts of layer il that placement would give it, and write the local
 * executor's share to local_ids. An expert's other holders that are up get
 * it too while placement's cache model says their cache has room (warm
 * replicas: spill-over and row splitting may then use them without a read
 * in the step); each then counts as caching it.
 *   ids        [n_ids] i32 expert ids (e.g. [n_tok][k] top-k), duplicates
 *              allowed, borrowed; ids outside [0, n_expert) are ignored
 *   local_ids  [n_ids] i32, written: the ids placed on the local executor
 * Returns the count written to local_ids. Never blocks on the network; a
 * hint to a peer with a long write queue is skipped (backpressure).
 * Thread: main. */
int64_t shoal_cluster_hint(struct shoal_cluster *cl, int64_t il, const int32_t *ids,
                           int64_t n_ids, int32_t *local_ids);

/* Record an evaluation for status: the context's accumulated timings
 * (borrowed, copied), the tokens it evaluated, whether it was a decode
 * step (each row one sequence's next token; a batch of sequences counts
 * too) and its wall time in seconds. Thread: main. */
void shoal_cluster_note_eval(struct shoal_cluster *cl, const struct shoal_ctx_timings *t,
                             int64_t n_tokens, int decode, double seconds);

/* 1 when the local store is one of the executors. Thread: any. */
int shoal_cluster_local_experts(const struct shoal_cluster *cl);

/* The control port's bound address ("127.0.0.1:7077"), or NULL when there
 * is none; static storage of the cluster. Thread: any. */
const char *shoal_cluster_control_addr(const struct shoal_cluster *cl);

/* Per-executor wire and request counters (plain data). */
struct shoal_cluster_exec_stats {
    char address[128];
    const char *state;          /* "up", "down", "joining", "draining", "faulty"; static */
    uint64_t requests, errors, reconnects;
    uint64_t bytes_sent, bytes_received;   /* on its connection, frames whole */
    /* the rows its requests carried, f32 (the protocol's minimum for the
     * placement): hidden rows sent (each row a request needs, once) and
     * expert outputs received (one per routed row of each of its experts) */
    uint64_t payload_sent, payload_received;
    uint64_t ssd_bytes;         /* expert bytes its answers say it read from disk */
    double rtt_ms;
    uint32_t experts_held;
    double busy_s;              /* read + compute seconds of its layer steps (issue 33) */
    uint64_t busy_steps;        /* layer steps it was up for */
};

/* Copy executor i's counters (0 <= i < returned count of
 * shoal_cluster_n_executors). Thread: any. */
int shoal_cluster_n_executors(struct shoal_cluster *cl);
void shoal_cluster_exec_stats_get(struct shoal_cluster *cl, int i,
                                  struct shoal_cluster_exec_stats *out);

/* Layer rounds since create that sent requests to workers and waited for
 * them (one per MoE layer step, more when a failure re-runs experts): the
 * round trips on a step's critical path. Thread: any. */
uint64_t shoal_cluster_rounds(struct shoal_cluster *cl);

/* Where the workers ran routed experts (the batch-union placement, as it
 * happened; the local store's share is in its own counters,
 * shoal_expert_store_use_get): per (layer, expert), the runs completed by
 * remote executors since create, and the index (as in
 * shoal_cluster_exec_stats_get) of the worker that ran it last, 0xff when
 * none has. Recorded by shoal_cluster_run_layer under the cluster's lock,
 * once per answered request; the getter copies n_layer * n_expert * 9
 * bytes under it.
 *   remote_runs  [n_layer][n_expert] u64, written unless NULL
 *   last_worker  [n_layer][n_expert] u8, written unless NULL
 * Thread: any. */
void shoal_cluster_expert_use_get(struct shoal_cluster *cl, uint64_t *remote_runs,
                                  uint8_t *last_worker);

/* How evenly the layer steps loaded the executors (issue 33). */
struct shoal_cluster_balance {
    uint64_t steps;             /* layer steps where an executor was busy */
    double max_over_mean;       /* mean over those steps of max / mean busy (read +
                                 * compute seconds) over the executors up at the
                                 * step's start; 0 when steps is 0 */
    uint64_t n_split;           /* union entries whose rows were split among holders */
    uint64_t split_rows;        /* the rows those entries held */
    uint64_t step_reads;        /* expert reads from disk the workers' answers reported */
    /* layer steps by the disk reads the workers' answers reported, the
     * last bucket counting those with as many or more: a step waits for
     * its busiest disk and a read is not split, so m reads over W equal
     * disks take at least ceil(m / W) read times (the step floor) */
    uint64_t reads_hist[SHOAL_CLUSTER_READS_HIST];
};

/* Copy the balance counters since create. Thread: any. */
void shoal_cluster_balance_get(struct shoal_cluster *cl, struct shoal_cluster_balance *out);

/* Print one line per executor (requests, errors, reconnects, wire bytes,
 * RTT, busy seconds per layer step) and one of the balance (max / mean
 * busy, split entries) on stderr: `shoal run --stats`. Thread: main. */
void shoal_cluster_print_stats(struct shoal_cluster *cl);

#endif
