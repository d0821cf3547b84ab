/* The portable I/O backend: queue_depth threads, each taking the oldest
 * queued request and reading it in full with pread(2); a background (not
 * urgent) request a piece at a time, one piece of them being read at most,
 * its next piece queued behind the urgent requests (io_engine.h). The fd
 * decides caching: the expert store opens it with O_DIRECT (Linux) or sets
 * F_NOCACHE (macOS) when asked. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io_engine_impl.h"
#include "util.h"

struct pool {
    pthread_t *threads;   /* [n] */
    int n;                /* threads started */
};

/* Read req from done_ up to upto bytes (or until a short read has brought
 * min_len). Returns 1 when req is finished, *res then the bytes read,
 * -errno, or SHOAL_EIO at an end of file before that; 0 when it stopped at
 * upto with more to read (a background piece). */
static int read_upto(struct shoal_io_req *req, size_t upto, int64_t *res)
{
    while (req->done_ < upto) {
        const size_t asked = upto - req->done_;
        ssize_t r = pread(req->fd, (char *)req->buf + req->done_, asked,
                          (off_t)(req->off + req->done_));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            *res = -errno;
            return 1;
        }
        if (r == 0) {   /* the end of the file, maybe at a piece's end */
            *res = req->min_len && req->done_ >= req->min_len ? (int64_t)req->done_ : SHOAL_EIO;
            return 1;
        }
        req->done_ += (size_t)r;
        if (req->min_len && req->done_ >= req->min_len && (size_t)r < asked) {
            *res = (int64_t)req->done_;   /* a short read with min_len: the end */
            return 1;
        }
    }
    if (req->done_ < req->len)
        return 0;
    *res = (int64_t)req->done_;
    return 1;
}

/* A request can start: an urgent or cancelled one, or a background piece
 * when no other is being read. Caller holds e->mu. */
static int startable(const struct shoal_io_engine *e)
{
    return e->head && (e->head->urgent || e->head->cancel_ || e->bg_busy == 0);
}

static void *worker(void *arg)
{
    struct shoal_io_engine *e = arg;
    shoal_io_engine_block_signals_();
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!startable(e) && !e->stopping)
            pthread_cond_wait(&e->cv, &e->mu);
        struct shoal_io_req *req = shoal_io_engine_pop_(e);
        const int drop = e->stopping || (req && req->cancel_);
        const int bg = req && !drop && !req->urgent;
        e->bg_busy += bg;
        pthread_mutex_unlock(&e->mu);
        if (!req)
            return NULL;   /* stopping and the queue is empty */
        int m = 0;
        if (!drop && req->map) {
            req->map = 0;   /* one attempt; a read it is then */
            m = shoal_io_engine_try_map_(req);
        }
        int64_t res = drop ? SHOAL_ECANCELED : m > 0 ? (int64_t)req->len : m;
        const int done = drop || m != 0 ||
                         read_upto(req, bg && req->len - req->done_ > SHOAL_IO_BG_PIECE
                                            ? req->done_ + SHOAL_IO_BG_PIECE : req->len,
                                   &res);
        if (bg || !done) {
            pthread_mutex_lock(&e->mu);
            e->bg_busy -= bg;
            if (!done) {
                if (e->stopping || req->cancel_) {
                    res = SHOAL_ECANCELED;
                } else if (req->urgent) {   /* promoted while its piece was read */
                    shoal_io_engine_enqueue_(e, req);
                    req = NULL;
                } else {
                    shoal_io_engine_requeue_bg_(e, req);
                    req = NULL;
                }
            }
            pthread_cond_broadcast(&e->cv);
            pthread_mutex_unlock(&e->mu);
        }
        if (req)
            shoal_io_engine_complete_(req, res);
    }
}

static void pool_stop(struct shoal_io_engine *e)
{
    struct pool *p = e->impl;
    /* each worker drains the queue (cancelling) before it sees it empty */
    for (int i = 0; i < p->n; i++)
        pthread_join(p->threads[i], NULL);
    free(p->threads);
    free(p);
    e->impl = NULL;
}

static int pool_start(struct shoal_io_engine *e, char *why, size_t why_len)
{
    struct pool *p = shoal_xcalloc(1, sizeof *p);
    p->threads = shoal_xcalloc((size_t)e->queue_depth, sizeof *p->threads);
    e->impl = p;
    for (int i = 0; i < e->queue_depth; i++) {
        int rc = pthread_create(&p->threads[i], NULL, worker, e);
        if (rc) {
            if (p->n > 0)
                break;   /* fewer threads than asked still work */
            snprintf(why, why_len, "pthread_create: %s", strerror(rc));
            free(p->threads);
            free(p);
            e->impl = NULL;
            return -rc;
        }
        p->n++;
    }
    e->queue_depth = p->n;
    return 0;
}

static void pool_kick(struct shoal_io_engine *e)
{
    (void)e;   /* submit already signalled e->cv */
}

const struct shoal_io_engine_ops shoal_io_engine_pread_ops = {
    .name = "pread",
    .start = pool_start,
    .kick = pool_kick,
    .stop = pool_stop,
};
