/* The portable I/O backend: queue_depth threads, each taking the oldest
 * queued request and reading it in full with pread(2). The fd decides
 * caching: the expert store opens it with O_DIRECT (Linux) or sets
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

/* Read req in full (or, with min_len, until a short read has brought
 * min_len bytes). Returns the bytes read, -errno, or SHOAL_EIO at an end
 * of file before that. */
static int64_t read_all(struct shoal_io_req *req)
{
    while (req->done_ < req->len) {
        ssize_t r = pread(req->fd, (char *)req->buf + req->done_, req->len - req->done_,
                          (off_t)(req->off + req->done_));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r == 0)
            return SHOAL_EIO;
        req->done_ += (size_t)r;
        if (req->min_len && req->done_ >= req->min_len)
            break;
    }
    return (int64_t)req->done_;
}

static void *worker(void *arg)
{
    struct shoal_io_engine *e = arg;
    shoal_io_engine_block_signals_();
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->head && !e->stopping)
            pthread_cond_wait(&e->cv, &e->mu);
        struct shoal_io_req *req = shoal_io_engine_pop_(e);
        int stopping = e->stopping;
        pthread_mutex_unlock(&e->mu);
        if (!req)
            return NULL;   /* stopping and the queue is empty */
        int m = 0;
        if (!stopping && req->map)
            m = shoal_io_engine_try_map_(req);
        shoal_io_engine_complete_(req, stopping ? SHOAL_ECANCELED
                                       : m > 0  ? (int64_t)req->len
                                       : m < 0  ? m
                                                : read_all(req));
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
