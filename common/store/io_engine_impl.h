/* io_engine_impl: what the io_engine backends share (io_engine.h is the
 * public side). The engine object holds one FIFO of submitted requests
 * under a mutex; a backend takes requests from it on its own thread(s) and
 * completes each exactly once through shoal_io_engine_complete_().
 *
 * Thread: see each member.
 */
#ifndef SHOAL_IO_ENGINE_IMPL_H
#define SHOAL_IO_ENGINE_IMPL_H

#include <pthread.h>

#include "io_engine.h"

struct shoal_io_engine_ops {
    const char *name;   /* "pread", "uring": logged at create */
    /* Start the backend's thread(s) and set e->impl. Returns 0, or a
     * negative status with why[] saying what failed (the caller falls back
     * or fails). Required. Thread: main. */
    int (*start)(struct shoal_io_engine *e, char *why, size_t why_len);
    /* New requests are queued (called after the queue lock is released).
     * Required. Thread: any. */
    void (*kick)(struct shoal_io_engine *e);
    /* e->stopping is set: complete the queued requests with
     * -SHOAL_ECANCELED, wait for the reads in flight, join the threads and
     * free e->impl. Required. Thread: main. */
    void (*stop)(struct shoal_io_engine *e);
};

struct shoal_io_engine {
    const struct shoal_io_engine_ops *ops;
    void *impl;                    /* backend state, owned by the backend */
    int queue_depth;               /* reads in flight at most */
    pthread_mutex_t mu;            /* guards head, tail, stopping */
    pthread_cond_t cv;             /* signalled when a request is queued or on stop */
    struct shoal_io_req *head, *tail;  /* FIFO of requests not yet started: the
                                    * urgent ones first, each kind in order */
    struct shoal_io_req *urgent_tail;  /* the last urgent one queued, or NULL */
    int bg_busy;                   /* background pieces being read (pread pool) */
    int stopping;                  /* destroy has begun: submit refuses */
    char *fallback;                /* why not the asked-for backend, or NULL; owned */
};

/* Queue req (caller holds e->mu): an urgent one after the urgent ones
 * already queued, ahead of the others; the others at the end. */
void shoal_io_engine_enqueue_(struct shoal_io_engine *e, struct shoal_io_req *req);

/* Queue background req ahead of the other background ones (caller holds
 * e->mu): the rest of a read whose piece just finished goes on next. */
void shoal_io_engine_requeue_bg_(struct shoal_io_engine *e, struct shoal_io_req *req);

/* Pop the first queued request (caller holds e->mu) or NULL. */
struct shoal_io_req *shoal_io_engine_pop_(struct shoal_io_engine *e);

/* req->map's attempt, on a backend thread before its read: 1 when the
 * range was all in the page cache and is now mapped over req->buf
 * (req->mapped set; complete it with len), 0 when it is to be read as
 * usual (buf is a fresh private anonymous mapping again), or a negative
 * status when buf could not be restored (complete it with that). */
int shoal_io_engine_try_map_(struct shoal_io_req *req);

/* Finish req with result (len, or a negative status) and run its callback.
 * Call without holding e->mu. Thread: io. */
void shoal_io_engine_complete_(struct shoal_io_req *req, int64_t result);

/* Block every signal in the calling io thread, so that SIGINT and friends
 * reach the main thread. Thread: io. */
void shoal_io_engine_block_signals_(void);

/* The backends. io_engine_uring.c is built only when HAVE_LIBURING. */
extern const struct shoal_io_engine_ops shoal_io_engine_pread_ops;
extern const struct shoal_io_engine_ops shoal_io_engine_uring_ops;

#endif
