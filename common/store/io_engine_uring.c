/* The io_uring backend (Linux, liburing): one ring owned by one io thread,
 * which sets it up, submits and reaps (STYLE 22). Other threads hand it
 * requests through the engine's queue and wake it with an eventfd whose
 * read is always armed in the ring, so the thread sleeps in one place:
 * io_uring_submit_and_wait. At most queue_depth reads are in flight; the
 * ring has one more entry for the eventfd read. Short reads (signals, end
 * of file races) are continued from where they stopped. A background
 * (not urgent) read goes a piece at a time, as many pieces of them in
 * flight as the disk reads in BG_WAIT_S, and its next piece queues behind
 * the urgent reads (io_engine.h). */
#include <errno.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "io_engine_impl.h"
#include "util.h"

struct uring {
    struct io_uring ring;
    pthread_t thread;
    int efd;                         /* eventfd: submit -> io thread wakeup */
    uint64_t efd_buf;                /* target of the armed eventfd read */
    int init_done, init_rc;          /* handshake with start(), under e->mu */
    char why[200];                   /* setup failure, for the fallback line */
    struct shoal_io_req *retry;      /* continued short reads; io thread only */
    int inflight;                    /* reads in the ring; io thread only */
    int bg_inflight;                 /* of them background pieces; io thread only */
    double busy_s, bytes, t_last;    /* decayed seconds with reads in flight and the
                                      * bytes they brought (the disk's rate); io
                                      * thread only */
};

static char efd_marker;   /* user_data of the eventfd read */

/* Background pieces in flight at most: as many as the disk reads in
 * BG_WAIT_S at its measured rate (an urgent read waits about that long
 * behind them), at least one. 150 MB/s: one piece; 2 GB/s: about 14. */
#define BG_WAIT_S 0.015

/* The time since the last change with reads in flight counts as busy;
 * the sums halve past a second of it, so the rate follows the disk.
 * Call before every change of u->inflight. */
static void account(struct uring *u)
{
    const double now = shoal_time_s();
    if (u->inflight > 0)
        u->busy_s += now - u->t_last;
    u->t_last = now;
    if (u->busy_s > 1.0) {
        u->busy_s *= 0.5;
        u->bytes *= 0.5;
    }
}

static int bg_max(const struct shoal_io_engine *e, const struct uring *u)
{
    if (u->busy_s < 0.01)
        return 1;
    const double n = u->bytes / u->busy_s * BG_WAIT_S / (double)SHOAL_IO_BG_PIECE;
    return n < 1 ? 1 : n > e->queue_depth ? e->queue_depth : (int)n;
}

static void arm_eventfd(struct uring *u)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
    if (!sqe)
        return;   /* cannot happen: the ring has one spare entry for it */
    io_uring_prep_read(sqe, u->efd, &u->efd_buf, sizeof u->efd_buf, 0);
    io_uring_sqe_set_data(sqe, &efd_marker);
}

/* Caller holds e->mu (req->urgent is read under it). */
static void prep(struct uring *u, struct shoal_io_req *req)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
    size_t n = req->len - req->done_;
    req->bg_ = !req->urgent;
    if (req->bg_ && n > SHOAL_IO_BG_PIECE)
        n = SHOAL_IO_BG_PIECE;
    req->piece_ = n;
    account(u);
    io_uring_prep_read(sqe, req->fd, (char *)req->buf + req->done_, (unsigned)n,
                       req->off + req->done_);
    io_uring_sqe_set_data(sqe, req);
    u->inflight++;
    u->bg_inflight += req->bg_;
}

/* A finished CQE for req: complete it, or queue the rest (a short read, or
 * a background read's next piece). */
static void reap_one(struct shoal_io_engine *e, struct uring *u, struct shoal_io_req *req,
                     int res)
{
    account(u);
    u->inflight--;
    u->bg_inflight -= req->bg_;
    if (res > 0) {
        req->done_ += (size_t)res;
        u->bytes += res;
    }
    /* min_len ends a read at a short one (the end of the file), not at a
     * piece's end */
    const int enough = req->done_ >= req->len ||
                       (req->min_len && req->done_ >= req->min_len && res >= 0 &&
                        (size_t)res < req->piece_);
    if (res == -EAGAIN || res == -EINTR || (res > 0 && !enough)) {
        pthread_mutex_lock(&e->mu);
        const int drop = req->cancel_;
        if (!drop && req->urgent) {   /* promoted meanwhile, or urgent from the start */
            req->next_ = u->retry;
            u->retry = req;
        } else if (!drop) {
            shoal_io_engine_requeue_bg_(e, req);
        }
        pthread_mutex_unlock(&e->mu);
        if (drop)
            shoal_io_engine_complete_(req, SHOAL_ECANCELED);
        return;
    }
    if (res < 0)
        shoal_io_engine_complete_(req, res);
    else if (res == 0 && !enough)
        shoal_io_engine_complete_(req, SHOAL_EIO);
    else
        shoal_io_engine_complete_(req, (int64_t)req->done_);
}

static void *ring_thread(void *arg)
{
    struct shoal_io_engine *e = arg;
    struct uring *u = e->impl;
    shoal_io_engine_block_signals_();
    int rc = io_uring_queue_init((unsigned)e->queue_depth + 1, &u->ring, 0);
    if (rc < 0) {
        snprintf(u->why, sizeof u->why, "io_uring_queue_init: %s", strerror(-rc));
    } else if ((u->efd = eventfd(0, EFD_CLOEXEC)) < 0) {
        rc = -errno;
        snprintf(u->why, sizeof u->why, "eventfd: %s", strerror(errno));
        io_uring_queue_exit(&u->ring);
    }
    pthread_mutex_lock(&e->mu);
    u->init_rc = rc < 0 ? rc : 0;
    u->init_done = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (rc < 0)
        return NULL;
    arm_eventfd(u);
    for (;;) {
        struct shoal_io_req *cancel = NULL;
        pthread_mutex_lock(&e->mu);
        const int stopping = e->stopping;
        if (stopping) {
            cancel = e->head;
            e->head = e->tail = e->urgent_tail = NULL;
        }
        struct shoal_io_req *maps = NULL;   /* to map outside the lock */
        while (u->inflight < e->queue_depth && (u->retry || e->head)) {
            struct shoal_io_req *req = u->retry;
            if (req) {
                u->retry = req->next_;
            } else {
                if (!e->head->urgent && !e->head->cancel_ && u->bg_inflight >= bg_max(e, u))
                    break;   /* enough background pieces in flight */
                req = shoal_io_engine_pop_(e);
            }
            req->next_ = NULL;
            if (req->cancel_) {   /* called back below, outside the lock */
                req->next_ = cancel;
                cancel = req;
                continue;
            }
            if (!req->urgent && u->bg_inflight >= bg_max(e, u) && !req->map) {
                shoal_io_engine_requeue_bg_(e, req);   /* a mapping's fallback */
                continue;
            }
            if (req->map && !stopping) {
                req->next_ = maps;
                maps = req;
                continue;
            }
            prep(u, req);
        }
        pthread_mutex_unlock(&e->mu);
        int again = 0;
        while (maps) {
            struct shoal_io_req *req = maps, *next = maps->next_;
            maps = next;
            req->next_ = NULL;
            req->map = 0;   /* one attempt; a read it is then */
            const int m = shoal_io_engine_try_map_(req);
            if (m != 0) {
                shoal_io_engine_complete_(req, m > 0 ? (int64_t)req->len : m);
                continue;
            }
            req->next_ = u->retry;   /* read it, within the queue depth */
            u->retry = req;
            again = 1;
        }
        while (cancel) {
            struct shoal_io_req *next = cancel->next_;
            shoal_io_engine_complete_(cancel, SHOAL_ECANCELED);
            cancel = next;
        }
        if (again)
            continue;
        if (stopping && u->inflight == 0 && !u->retry)
            break;
        /* Errors here are -EINTR, or -EAGAIN/-EBUSY asking us to reap first
         * (done below); a bad fd or offset comes back in its own CQE. */
        (void)io_uring_submit_and_wait(&u->ring, 1);
        struct io_uring_cqe *cqe;
        while (io_uring_peek_cqe(&u->ring, &cqe) == 0) {
            void *ud = io_uring_cqe_get_data(cqe);
            int res = cqe->res;
            io_uring_cqe_seen(&u->ring, cqe);
            if (ud == &efd_marker)
                arm_eventfd(u);
            else
                reap_one(e, u, ud, res);
        }
    }
    io_uring_queue_exit(&u->ring);
    close(u->efd);
    return NULL;
}

static int ring_start(struct shoal_io_engine *e, char *why, size_t why_len)
{
    struct uring *u = shoal_xcalloc(1, sizeof *u);
    u->efd = -1;
    e->impl = u;
    int rc = pthread_create(&u->thread, NULL, ring_thread, e);
    if (rc) {
        snprintf(why, why_len, "pthread_create: %s", strerror(rc));
        free(u);
        e->impl = NULL;
        return -rc;
    }
    pthread_mutex_lock(&e->mu);
    while (!u->init_done)
        pthread_cond_wait(&e->cv, &e->mu);
    rc = u->init_rc;
    pthread_mutex_unlock(&e->mu);
    if (rc) {
        pthread_join(u->thread, NULL);
        snprintf(why, why_len, "%s", u->why);
        free(u);
        e->impl = NULL;
    }
    return rc;
}

static void ring_kick(struct shoal_io_engine *e)
{
    struct uring *u = e->impl;
    uint64_t one = 1;
    ssize_t w;
    do
        w = write(u->efd, &one, sizeof one);
    while (w < 0 && errno == EINTR);
    /* EAGAIN means the counter is saturated: the thread is awake anyway */
}

static void ring_stop(struct shoal_io_engine *e)
{
    struct uring *u = e->impl;
    ring_kick(e);
    pthread_join(u->thread, NULL);
    free(u);
    e->impl = NULL;
}

const struct shoal_io_engine_ops shoal_io_engine_uring_ops = {
    .name = "uring",
    .start = ring_start,
    .kick = ring_kick,
    .stop = ring_stop,
};
