#include "io_engine.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/mman.h>
#include <sys/stat.h>
#endif

#include "config.h"
#include "io_engine_impl.h"
#include "log.h"
#include "pages.h"
#include "util.h"

int shoal_io_kind_parse(const char *s, enum shoal_io_kind *out)
{
    if (!strcmp(s, "auto"))
        *out = SHOAL_IO_AUTO;
    else if (!strcmp(s, "pread"))
        *out = SHOAL_IO_PREAD;
    else if (!strcmp(s, "uring"))
        *out = SHOAL_IO_URING;
    else
        return SHOAL_EINVAL;
    return 0;
}

void shoal_io_engine_enqueue_(struct shoal_io_engine *e, struct shoal_io_req *req)
{
    if (req->urgent) {
        struct shoal_io_req **at = e->urgent_tail ? &e->urgent_tail->next_ : &e->head;
        req->next_ = *at;
        *at = req;
        if (!req->next_)
            e->tail = req;
        e->urgent_tail = req;
        return;
    }
    req->next_ = NULL;
    if (e->tail)
        e->tail->next_ = req;
    else
        e->head = req;
    e->tail = req;
}

void shoal_io_engine_requeue_bg_(struct shoal_io_engine *e, struct shoal_io_req *req)
{
    struct shoal_io_req **at = e->urgent_tail ? &e->urgent_tail->next_ : &e->head;
    req->next_ = *at;
    *at = req;
    if (!req->next_)
        e->tail = req;
}

struct shoal_io_req *shoal_io_engine_pop_(struct shoal_io_engine *e)
{
    struct shoal_io_req *r = e->head;
    if (r) {
        e->head = r->next_;
        if (!e->head)
            e->tail = NULL;
        if (e->urgent_tail == r)
            e->urgent_tail = NULL;
        r->next_ = NULL;
    }
    return r;
}

/* Reading a warm page cache into private buffers costs a fresh page's
 * zeroing and a copy per page (perf, a 256-token prefill of a DeepSeek-V3-width
 * container in a fresh process: clear_page 33 %, the copy 9 % of the
 * samples), and holds the bytes twice while the page cache keeps them. A
 * shared read-only mapping of the resident range does neither. Pages that
 * are not resident would be read one fault at a time on this thread, so
 * those ranges are read as before (queue depth, O_DIRECT stay the
 * store's). */
int shoal_io_engine_try_map_(struct shoal_io_req *req)
{
    req->mapped = 0;
#if defined(__linux__)
    const long pg = sysconf(_SC_PAGESIZE);
    if (pg <= 0 || req->len == 0 || req->off % (uint64_t)pg || (uintptr_t)req->buf % (uintptr_t)pg)
        return 0;
    struct stat sb;   /* a range past the end (a GGUF's page-rounded tail) is read */
    if (fstat(req->fd, &sb) != 0 || (uint64_t)sb.st_size < req->off + req->len)
        return 0;
    void *p = mmap(req->buf, req->len, PROT_READ, MAP_SHARED | MAP_FIXED, req->fd,
                   (off_t)req->off);
    int resident = p != MAP_FAILED;
    unsigned char vec[1024];
    const size_t chunk = sizeof vec * (size_t)pg;
    for (size_t o = 0; resident && o < req->len; o += chunk) {
        const size_t n = req->len - o < chunk ? req->len - o : chunk;
        if (mincore((char *)req->buf + o, n, vec) != 0) {
            resident = 0;
            break;
        }
        for (size_t i = 0; i < (n + (size_t)pg - 1) / (size_t)pg; i++)
            if (!(vec[i] & 1)) {
                resident = 0;
                break;
            }
    }
    if (resident) {
#ifdef MADV_POPULATE_READ
        (void)madvise(req->buf, req->len, MADV_POPULATE_READ);   /* page tables now */
#endif
        req->mapped = 1;
        return 1;
    }
    /* back to private anonymous pages for the read (also when the mapping
     * itself failed: MAP_FIXED may have unmapped the range) */
    return shoal_pages_remap(req->buf, req->len);
#else
    return 0;
#endif
}

void shoal_io_engine_complete_(struct shoal_io_req *req, int64_t result)
{
    req->result = result;
    req->cb(req);   /* req may be reused or freed by the callback: last touch */
}

void shoal_io_engine_block_signals_(void)
{
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
}

static int start_backend(struct shoal_io_engine *e, const struct shoal_io_engine_ops *ops,
                         char *why, size_t why_len)
{
    e->ops = ops;
    return ops->start(e, why, why_len);
}

struct shoal_io_engine *shoal_io_engine_create(struct shoal_io_engine_params p,
                                               struct shoal_err *err)
{
    struct shoal_io_engine *e = shoal_xcalloc(1, sizeof *e);
    e->queue_depth = p.queue_depth < 1 ? 1
                   : p.queue_depth > SHOAL_IO_QUEUE_DEPTH_MAX ? SHOAL_IO_QUEUE_DEPTH_MAX
                   : p.queue_depth;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    char why[256] = "";
    int want_uring = p.kind == SHOAL_IO_URING || p.kind == SHOAL_IO_AUTO;
#if HAVE_LIBURING
    if (want_uring && start_backend(e, &shoal_io_engine_uring_ops, why, sizeof why) == 0)
        goto started;
#else
    /* --io auto on a build without liburing is simply the pread pool */
    if (p.kind == SHOAL_IO_URING)
        snprintf(why, sizeof why, "liburing is not built in");
    want_uring = p.kind == SHOAL_IO_URING;
#endif
    if (want_uring) {
        /* once per process: a model load and a session may each make an engine */
        static atomic_int logged;
        e->fallback = shoal_xstrdup(why);
        if (atomic_exchange(&logged, 1) == 0)
            shoal_log(SHOAL_LOG_WARN, "io_engine", "io_uring unavailable (%s); using the "
                      "pread thread pool", why);
    }
    char why2[256] = "";
    int rc = start_backend(e, &shoal_io_engine_pread_ops, why2, sizeof why2);
    if (rc) {
        shoal_err_set(err, rc, "cannot start the pread I/O threads: %s", why2);
        pthread_cond_destroy(&e->cv);
        pthread_mutex_destroy(&e->mu);
        free(e->fallback);
        free(e);
        return NULL;
    }
#if HAVE_LIBURING
started:
#endif
    shoal_log(SHOAL_LOG_INFO, "io_engine", "io engine %s queue_depth=%d", e->ops->name,
              e->queue_depth);
    return e;
}

void shoal_io_engine_destroy(struct shoal_io_engine *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&e->mu);
    e->stopping = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    e->ops->stop(e);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e->fallback);
    free(e);
}

int shoal_io_engine_submit(struct shoal_io_engine *e, struct shoal_io_req *req,
                           struct shoal_err *err)
{
    if (!req || !req->cb || !req->buf || req->len == 0)
        return shoal_err_set(err, SHOAL_EINVAL, "io request needs a callback, a buffer "
                             "and a length (got cb=%s buf=%s len=%zu)",
                             req && req->cb ? "set" : "NULL", req && req->buf ? "set" : "NULL",
                             req ? req->len : (size_t)0);
    req->next_ = NULL;
    req->done_ = req->piece_ = 0;
    req->bg_ = req->cancel_ = 0;
    req->result = 0;
    pthread_mutex_lock(&e->mu);
    if (e->stopping) {
        pthread_mutex_unlock(&e->mu);
        return shoal_err_set(err, SHOAL_ECANCELED, "io engine is shutting down");
    }
    shoal_io_engine_enqueue_(e, req);
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    e->ops->kick(e);
    return 0;
}

/* Unlink req from the queue if it is there (caller holds e->mu).
 * Returns 1 if it was queued. */
static int unqueue(struct shoal_io_engine *e, struct shoal_io_req *req)
{
    struct shoal_io_req *prev = NULL, *r = e->head;
    while (r && r != req) {
        prev = r;
        r = r->next_;
    }
    if (!r)
        return 0;
    if (prev)
        prev->next_ = req->next_;
    else
        e->head = req->next_;
    if (e->tail == req)
        e->tail = prev;
    if (e->urgent_tail == req)
        e->urgent_tail = prev;
    req->next_ = NULL;
    return 1;
}

/* Make req urgent (cancel: and cancelled), moving it ahead of the
 * background reads if it is queued. A piece in flight: the backend reads
 * the rest at once, or, cancelled, not at all. */
static void urge(struct shoal_io_engine *e, struct shoal_io_req *req, int cancel)
{
    pthread_mutex_lock(&e->mu);
    req->cancel_ |= cancel;
    if (!req->urgent) {
        req->urgent = 1;
        if (unqueue(e, req))
            shoal_io_engine_enqueue_(e, req);
    }
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    e->ops->kick(e);
}

void shoal_io_engine_promote(struct shoal_io_engine *e, struct shoal_io_req *req)
{
    urge(e, req, 0);
}

void shoal_io_engine_cancel(struct shoal_io_engine *e, struct shoal_io_req *req)
{
    urge(e, req, 1);   /* to the front: it costs no read */
}

const char *shoal_io_engine_name(const struct shoal_io_engine *e)
{
    return e->ops->name;
}

const char *shoal_io_engine_fallback_reason(const struct shoal_io_engine *e)
{
    return e->fallback;
}

int shoal_io_engine_queue_depth(const struct shoal_io_engine *e)
{
    return e->queue_depth;
}
