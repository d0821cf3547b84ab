/* exec: the worker's compute thread. It owns the expert store (which is
 * single-threaded: every store call happens on this thread) and runs the
 * batch-unions that arrive over the wire in FIFO order, one at a time, with
 * the same kernels as the coordinator (shoal_expert_ffn).
 *
 * The loop thread submits jobs; the compute thread runs them and hands
 * finished requests back through a done list and a notify callback (the
 * server passes one that calls uv_async_send, which coalesces: take_done
 * returns every finished job). Prefetch hints jump the FIFO: they are acted
 * on before the next request and between a request's acquire_start and
 * acquire_wait, so the reads of layer il+1 start while layer il waits for
 * its own. Hints never change a result (expert_store.h).
 *
 * A request job turns into exactly one packed reply frame: an
 * ExpertResponse (for each expert in request order, for each of its rows
 * in order, n_embd f32 of unweighted output), or an ErrorReply carrying the
 * request id and the store's message (read failure, checksum mismatch,
 * out of memory). The worker keeps serving after either.
 *
 * Thread: create/submit/take_done/stop/destroy on the loop thread; the
 * notify callback runs on the compute thread.
 */
#ifndef SHOAL_WORKER_EXEC_H
#define SHOAL_WORKER_EXEC_H

#include <stddef.h>
#include <stdint.h>

#include "container.h"
#include "err.h"
#include "expert_store.h"
#include "shoal.pb-c.h"

enum shoal_worker_job_kind {
    SHOAL_WORKER_JOB_REQUEST = 0,   /* an ExpertRequest: computes, replies */
    SHOAL_WORKER_JOB_HINT = 1,      /* a PrefetchHint: starts reads, no reply */
    SHOAL_WORKER_JOB_PART = 2,      /* made by exec: a part of a REQUEST's answer
                                     * (ExpertRequest.parts) in reply, owner and id
                                     * copied from it; handed back before the
                                     * request, which keeps owner alive */
};

struct shoal_worker_job {
    /* filled by the submitter (loop thread) */
    enum shoal_worker_job_kind kind;
    Shoal__Frame *frame;      /* REQUEST: the validated request frame; owned by the job */
    uint64_t total_rows;      /* REQUEST: sum of the experts' row counts */
    uint32_t max_frame;       /* REQUEST: largest frame the peer accepts, bytes */
    int64_t layer;            /* HINT: a MoE layer */
    int32_t *ids;             /* HINT: [n_ids] expert ids held here; owned by the job */
    int64_t n_ids;
    void *owner;              /* the submitter's (a connection); exec never touches it */
    uint64_t frame_bytes;     /* bytes of the request on the wire (backpressure) */
    uint64_t id;              /* REQUEST: the request id */
    /* written by the compute thread (REQUEST) */
    int status;               /* 0, or the negative status of an ErrorReply */
    uint8_t *reply;           /* the packed reply frame with its prefix; owned by the job */
    size_t reply_len;         /* bytes */
    char *error;              /* the ErrorReply's message (file, tensor, expert, what is
                               * wrong), for the worker's log; owned; NULL when none */
    /* private */
    double t_submit;          /* shoal_time_s() at submit */
    struct shoal_worker_job *next;
};

struct shoal_worker_exec_params {
    const struct shoal_container *ct;       /* borrowed; outlives the exec */
    int64_t n_embd, n_ff_exp;               /* the model's (w_gate is [n_ff_exp][n_embd]) */
    struct shoal_expert_store_params store; /* passed to shoal_expert_store_create */
    int threads;                            /* OpenMP threads of the kernels; 0: default */
    void (*notify)(void *user);             /* a request finished (compute thread) */
    void *notify_user;
    /* TEST ONLY (a faulty worker for the coordinator's checks; main reads
     * SHOAL_TEST_NAN_EXPERT): when test_nan is set, the first value of
     * every output this worker computes for expert test_nan_expert of
     * layer test_nan_layer (-1: any) is replaced by a NaN no kernel
     * produces (bits SHOAL_WORKER_TEST_NAN_BITS). 0 in every real use. */
    int test_nan;
    int64_t test_nan_layer, test_nan_expert;
};

#define SHOAL_WORKER_TEST_NAN_BITS 0x7fc0bad0u

/* What create measured (plain data). */
struct shoal_worker_exec_info {
    double disk_mbps;         /* O_DIRECT read rate of a few held blobs, MB/s (0: unknown) */
    double compute_gbps;      /* expert bytes through shoal_expert_ffn per second, GB/s */
    const char *io_engine;    /* "uring" or "pread"; static */
    int direct;               /* 1 when the store's reads bypass the page cache */
};

struct shoal_worker_exec;

/* Start the compute thread; it creates the expert store over p->ct and
 * measures disk and compute rates. Blocks until that is done.
 * Returns the exec (owned by the caller) or NULL with err set (the store's
 * message, or no thread). Thread: loop. */
struct shoal_worker_exec *shoal_worker_exec_create(const struct shoal_worker_exec_params *p,
                                                   struct shoal_err *err);

/* Measured rates and store configuration (valid after create). Thread: any. */
const struct shoal_worker_exec_info *shoal_worker_exec_info(const struct shoal_worker_exec *x);

/* Queue a job (takes ownership). A REQUEST comes back through take_done
 * exactly once (after stop: with status -SHOAL_ECANCELED and no reply);
 * a HINT is freed by the exec. Thread: loop. */
void shoal_worker_exec_submit(struct shoal_worker_exec *x, struct shoal_worker_job *job);

/* Cancel the REQUEST jobs of owner (borrowed, compared only) that are
 * still queued: they go to the done list with -SHOAL_ECANCELED and no
 * reply, and notify runs once if there were any. A running job is left to
 * finish. Returns how many were cancelled. Thread: loop. */
int shoal_worker_exec_cancel(struct shoal_worker_exec *x, const void *owner);

/* Take every finished REQUEST job, oldest first, as a list linked by next
 * (owned by the caller: shoal_worker_job_free each). NULL when none.
 * Thread: loop. */
struct shoal_worker_job *shoal_worker_exec_take_done(struct shoal_worker_exec *x);

/* Requests queued or running now. Thread: any. */
uint32_t shoal_worker_exec_queue_depth(struct shoal_worker_exec *x);

/* Copy the store's counters (after stop: their last values, with the
 * borrowed path strings NULL). Thread: any. */
void shoal_worker_exec_store_stats(struct shoal_worker_exec *x,
                                   struct shoal_expert_store_stats *out);

/* Stop: cancel queued jobs (they go to the done list with
 * -SHOAL_ECANCELED), let the running one finish, destroy the store and join
 * the thread. Idempotent. Thread: loop. */
void shoal_worker_exec_stop(struct shoal_worker_exec *x);

/* stop, then free the exec and any jobs still in the done list. NULL is a
 * no-op. Thread: loop. */
void shoal_worker_exec_destroy(struct shoal_worker_exec *x);

/* Free a job and what it owns. NULL is a no-op. Thread: any. */
void shoal_worker_job_free(struct shoal_worker_job *job);

#endif
