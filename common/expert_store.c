#include "expert_store.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "log.h"
#include "util.h"

struct entry {
    void *blob;               /* aligned, blob_bytes */
    int64_t il, ie;
    int in_use;
    struct entry *prev, *next; /* LRU list, most recent at head */
};

struct shoal_expert_store {
    const struct shoal_container *ct;
    struct shoal_expert_store_params p;
    int fd;
    int direct;
    struct entry **slot;       /* [n_layer * n_expert] */
    struct entry *head, *tail;
    void *scratch;             /* zero-budget reads */
    int scratch_in_use;
    struct shoal_expert_store_stats st;
};

static void *alloc_blob(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, SHOAL_CONTAINER_ALIGN, n ? n : SHOAL_CONTAINER_ALIGN) != 0)
        return NULL;
    return p;
}

struct shoal_expert_store *shoal_expert_store_create(const struct shoal_container *ct,
                                                     struct shoal_expert_store_params p,
                                                     struct shoal_err *err)
{
    struct shoal_expert_store *s = shoal_xcalloc(1, sizeof *s);
    s->ct = ct;
    s->p = p;
    s->fd = -1;
#ifdef O_DIRECT
    if (p.direct) {
        s->fd = open(ct->experts_path, O_RDONLY | O_DIRECT);
        if (s->fd < 0)
            shoal_log(SHOAL_LOG_WARN, "expert_store",
                      "O_DIRECT not available for '%s' (%s); using buffered reads",
                      ct->experts_path, strerror(errno));
        else
            s->direct = 1;
    }
#endif
    if (s->fd < 0)
        s->fd = open(ct->experts_path, O_RDONLY);
    if (s->fd < 0) {
        int e = errno;
        shoal_err_set(err, -e, "cannot open '%s': %s", ct->experts_path, strerror(e));
        free(s);
        return NULL;
    }
#if defined(F_NOCACHE)
    if (p.direct && fcntl(s->fd, F_NOCACHE, 1) == 0)
        s->direct = 1;
#endif
    s->slot = shoal_xcalloc((size_t)(ct->n_layer * ct->n_expert) + 1, sizeof *s->slot);
    return s;
}

static void lru_unlink(struct shoal_expert_store *s, struct entry *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        s->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        s->tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_push_front(struct shoal_expert_store *s, struct entry *e)
{
    e->prev = NULL;
    e->next = s->head;
    if (s->head)
        s->head->prev = e;
    s->head = e;
    if (!s->tail)
        s->tail = e;
}

static void drop(struct shoal_expert_store *s, struct entry *e)
{
    lru_unlink(s, e);
    s->slot[e->il * s->ct->n_expert + e->ie] = NULL;
    free(e->blob);
    free(e);
    s->st.cached_bytes -= s->ct->blob_bytes;
    s->st.cached_experts--;
    s->st.evictions++;
}

/* Evict least-recently-used idle entries until `need` more bytes fit. */
static int make_room(struct shoal_expert_store *s, uint64_t need)
{
    if (s->p.cache_bytes == UINT64_MAX)
        return 1;
    if (need > s->p.cache_bytes)
        return 0;
    struct entry *e = s->tail;
    while (e && s->st.cached_bytes + need > s->p.cache_bytes) {
        struct entry *prev = e->prev;
        if (!e->in_use)
            drop(s, e);
        e = prev;
    }
    return s->st.cached_bytes + need <= s->p.cache_bytes;
}

static int read_blob(struct shoal_expert_store *s, int64_t il, int64_t ie, void *buf,
                     struct shoal_err *err)
{
    const struct shoal_container *ct = s->ct;
    uint64_t off = shoal_container_expert_offset(ct, il, ie);
    size_t n = ct->blob_bytes, done = 0;
    double t0 = shoal_time_s();
    while (done < n) {
        ssize_t r = pread(s->fd, (char *)buf + done, n - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            return shoal_err_set(err, r < 0 ? -e : SHOAL_EIO,
                                 "cannot read '%s' layer %lld expert %lld at offset %" PRIu64
                                 ": %s", ct->experts_path, (long long)il, (long long)ie,
                                 off + done, r < 0 ? strerror(e) : "unexpected end of file");
        }
        done += (size_t)r;
    }
    s->st.read_seconds += shoal_time_s() - t0;
    s->st.bytes_read += n;
    uint64_t h = XXH64(buf, n, 0), want = ct->expert_xxh64[il * ct->n_expert + ie];
    if (h != want)
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "checksum mismatch: '%s' layer %lld expert %lld at offset %" PRIu64
                             ": xxh64 %016" PRIx64 ", manifest %016" PRIx64,
                             ct->experts_path, (long long)il, (long long)ie, off, h, want);
    return 0;
}

int shoal_expert_store_acquire(struct shoal_expert_store *s, int64_t il, int64_t ie,
                               struct shoal_expert_weights *out, struct shoal_err *err)
{
    const struct shoal_container *ct = s->ct;
    struct entry *e = s->slot[il * ct->n_expert + ie];
    if (e) {
        s->st.hits++;
        e->in_use++;
        lru_unlink(s, e);
        lru_push_front(s, e);
        shoal_container_expert_views(ct, e->blob, out);
        return 0;
    }
    s->st.misses++;
    if (make_room(s, ct->blob_bytes)) {
        void *blob = alloc_blob(ct->blob_bytes);
        if (!blob)
            return shoal_err_set(err, SHOAL_ENOMEM, "cannot allocate %" PRIu64
                                 " bytes for an expert", ct->blob_bytes);
        int rc = read_blob(s, il, ie, blob, err);
        if (rc) {
            free(blob);
            return rc;
        }
        e = shoal_xcalloc(1, sizeof *e);
        e->blob = blob;
        e->il = il;
        e->ie = ie;
        e->in_use = 1;
        lru_push_front(s, e);
        s->slot[il * ct->n_expert + ie] = e;
        s->st.cached_bytes += ct->blob_bytes;
        s->st.cached_experts++;
        shoal_container_expert_views(ct, blob, out);
        return 0;
    }
    /* over budget: read into the scratch blob, cache nothing */
    if (!s->scratch && !(s->scratch = alloc_blob(ct->blob_bytes)))
        return shoal_err_set(err, SHOAL_ENOMEM, "cannot allocate %" PRIu64
                             " bytes for an expert", ct->blob_bytes);
    int rc = read_blob(s, il, ie, s->scratch, err);
    if (rc)
        return rc;
    s->scratch_in_use = 1;
    shoal_container_expert_views(ct, s->scratch, out);
    return 0;
}

void shoal_expert_store_release(struct shoal_expert_store *s, int64_t il, int64_t ie)
{
    struct entry *e = s->slot[il * s->ct->n_expert + ie];
    if (e && e->in_use > 0) {
        e->in_use--;
        return;
    }
    s->scratch_in_use = 0;
}

const struct shoal_expert_store_stats *shoal_expert_store_stats(const struct shoal_expert_store *s)
{
    return &s->st;
}

void shoal_expert_store_destroy(struct shoal_expert_store *s)
{
    if (!s)
        return;
    while (s->head) {
        struct entry *e = s->head;
        s->head = e->next;
        free(e->blob);
        free(e);
    }
    free(s->slot);
    free(s->scratch);
    if (s->fd >= 0)
        close(s->fd);
    free(s);
}
