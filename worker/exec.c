#include "exec.h"

#include <errno.h>
#include <fcntl.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "expert_exec.h"
#include "expert_ffn.h"
#include "util.h"
#include "wire.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the wire carries f32 little-endian rows; a big-endian host needs byte swaps here"
#endif

struct shoal_worker_exec {
    struct shoal_worker_exec_params p;
    struct shoal_worker_exec_info info;
    pthread_t thread;
    int started, stopped;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct shoal_worker_job *q_head, *q_tail;       /* requests, FIFO */
    struct shoal_worker_job *h_head, *h_tail;       /* hints, FIFO */
    struct shoal_worker_job *d_head, *d_tail;       /* finished requests */
    uint32_t depth;                                 /* requests queued or running */
    int stop;                                       /* set by stop */
    int ready;                                      /* 1 running, -1 failed at start */
    struct shoal_err start_err;
    struct shoal_expert_store *store;               /* compute thread; NULL once destroyed */
    struct shoal_expert_store_stats final;          /* counters when the store went away */
    uint64_t answered_bytes;                        /* store bytes_read at the last answer */
    double answered_busy;                           /* and its read_busy_seconds */

    /* compute-thread scratch, grown as requests need */
    int32_t *ids;                                   /* [n_expert] */
    struct shoal_expert_weights *ew;                /* [n_expert] */
    float *xg, *ffn;                                /* [rows][n_embd], [2][rows][n_ff_exp] */
    struct shoal_expert_ffn_job *jobs;              /* [n_expert] one acquired batch */
    int64_t scratch_rows;
    int64_t n_embd, n_ff;
};

void shoal_worker_job_free(struct shoal_worker_job *job)
{
    if (!job)
        return;
    shoal_wire_frame_free(job->frame);
    free(job->ids);
    free(job->reply);
    free(job->error);
    free(job);
}

static void list_push(struct shoal_worker_job **head, struct shoal_worker_job **tail,
                      struct shoal_worker_job *j)
{
    j->next = NULL;
    if (*tail)
        (*tail)->next = j;
    else
        *head = j;
    *tail = j;
}

static struct shoal_worker_job *list_pop(struct shoal_worker_job **head,
                                         struct shoal_worker_job **tail)
{
    struct shoal_worker_job *j = *head;
    if (j) {
        *head = j->next;
        if (!*head)
            *tail = NULL;
        j->next = NULL;
    }
    return j;
}

/* ------------------------------------------------------------ probes */

/* Read len bytes at off of path into buf (4 KiB aligned), O_DIRECT where
 * the file system allows it (the page cache would measure RAM), buffered
 * otherwise; stop at the end of the file. Returns the bytes read. */
static uint64_t probe_read(const char *path, void *buf, uint64_t len, uint64_t off)
{
    int fd = -1, direct = 0;
#ifdef O_DIRECT
    fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    direct = fd >= 0;
#endif
    if (fd < 0)
        fd = open(path, O_RDONLY | O_CLOEXEC);
    uint64_t done = 0;
    while (fd >= 0 && done < len) {
        ssize_t r = pread(fd, (char *)buf + done, (size_t)(len - done), (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && direct) {   /* O_DIRECT refused mid-way: measure buffered */
            close(fd);
            fd = open(path, O_RDONLY | O_CLOEXEC);
            direct = 0;
            continue;
        }
        if (r <= 0)
            break;
        done += (uint64_t)r;
    }
    if (fd >= 0)
        close(fd);
    return done;
}

/* Read 3 to 8 held experts (about 64 MiB) spread over the shard, each as
 * the store reads it (shoal_container_expert_reads: one blob, or a GGUF
 * expert's matrices), timing all but the first: a first read can ride a
 * burst (150 MB/s blkio-throttled disks, timed on one 25 MB read, were put
 * at 138-394 MB/s, and placement's first layer step split 75/72/63/35).
 * Returns MB/s (0 when nothing could be measured) and leaves the last
 * expert read in *blob_out (owned by the caller), which is expert
 * (*il_out, *ie_out), for the compute probe. */
static double probe_disk(const struct shoal_container *ct, void **blob_out, int64_t *il_out,
                         int64_t *ie_out)
{
    *blob_out = NULL;
    int64_t total = 0;
    for (int64_t il = 0; il < ct->n_layer; il++)
        for (int64_t ie = 0; ie < ct->n_expert; ie++)
            total += shoal_container_holds(ct, il, ie);
    if (total == 0 || ct->blob_bytes == 0)
        return 0;
    int64_t n = (int64_t)((64u << 20) / ct->blob_bytes);
    n = n < 3 ? 3 : n > 8 ? 8 : n;
    n = n > total ? total : n;
    void *buf = NULL;
    if (posix_memalign(&buf, SHOAL_CONTAINER_ALIGN, (size_t)ct->blob_bytes))
        return 0;
    uint64_t bytes = 0;
    int got_one = 0;
    double t0 = shoal_time_s();
    for (int64_t k = 0; k < n; k++) {
        int64_t want = k * total / n, seen = 0, il = 0, ie = 0;
        for (il = 0; il < ct->n_layer; il++) {
            for (ie = 0; ie < ct->n_expert; ie++)
                if (shoal_container_holds(ct, il, ie) && seen++ == want)
                    goto found;
        }
        break;
    found:;
        struct shoal_expert_read rd[6];
        const int nr = shoal_container_expert_reads(ct, il, ie, rd);
        int ok = 1;
        for (int j = 0; j < nr && ok; j++) {
            const char *path = ct->gguf ? ct->gguf->files[rd[j].file] : ct->experts_path;
            const uint64_t got = probe_read(path, (char *)buf + rd[j].buf_off, rd[j].len,
                                            rd[j].off);
            ok = got >= rd[j].need;
            bytes += got;
        }
        if (!ok)
            break;
        *il_out = il;
        *ie_out = ie;
        got_one = 1;
        if (k == 0 && n > 1) {   /* the first read warms up; the others are timed */
            bytes = 0;
            t0 = shoal_time_s();
        }
    }
    double dt = shoal_time_s() - t0;
    if (!got_one) {
        free(buf);
        return 0;
    }
    *blob_out = buf;
    return (double)bytes / 1e6 / (dt > 1e-6 ? dt : 1e-6);
}

/* Expert bytes computed per second on expert (il, ie)'s weights in blob,
 * GB/s. */
static double probe_compute(const struct shoal_container *ct, const void *blob, int64_t il,
                            int64_t ie)
{
    if (!blob)
        return 0;
    struct shoal_expert_weights ew;
    shoal_container_expert_views_at(ct, il, ie, blob, &ew);
    return shoal_expert_ffn_rate(&ew, shoal_container_blob_bytes(ct, il));
}

/* ------------------------------------------------------------ requests */

/* batches up to this many rows keep their scratch between requests */
#define SCRATCH_KEEP_ROWS 4096

/* Grow the scratch to rows rows. Returns 0 or -SHOAL_ENOMEM. */
static int scratch_reserve(struct shoal_worker_exec *x, int64_t rows)
{
    if (rows <= x->scratch_rows)
        return 0;
    free(x->xg);
    free(x->ffn);
    x->xg = malloc((size_t)(rows * x->n_embd) * sizeof(float));
    x->ffn = malloc((size_t)(2 * rows * x->n_ff) * sizeof(float));
    if (!x->xg || !x->ffn) {
        free(x->xg);
        free(x->ffn);
        x->xg = x->ffn = NULL;
        x->scratch_rows = 0;
        return -SHOAL_ENOMEM;
    }
    x->scratch_rows = rows;
    return 0;
}

/* Drop the scratch (a large batch's: up to ~160 MB for a 64 MiB reply)
 * when the queue is idle, and give freed memory back to the system, so a
 * worker's RSS returns near its idle size after a burst. Compute thread. */
static void scratch_release(struct shoal_worker_exec *x)
{
    free(x->xg);
    free(x->ffn);
    x->xg = x->ffn = NULL;
    x->scratch_rows = 0;
#if defined(__GLIBC__)
    malloc_trim(0);
#endif
}

/* Act on every queued hint. Caller does not hold mu. */
static void run_hints(struct shoal_worker_exec *x)
{
    for (;;) {
        pthread_mutex_lock(&x->mu);
        struct shoal_worker_job *h = list_pop(&x->h_head, &x->h_tail);
        pthread_mutex_unlock(&x->mu);
        if (!h)
            return;
        shoal_expert_store_hint(x->store, h->layer, h->ids, h->n_ids);
        shoal_worker_job_free(h);
    }
}

static void reply_error(struct shoal_worker_job *job, int code, const char *msg)
{
    struct shoal_wire_error e;
    struct shoal_err err = {0};
    shoal_wire_error_init(&e, job->id, code, msg);
    free(job->reply);
    free(job->error);
    job->error = strdup(msg);   /* NULL without memory: the log says the code only */
    job->status = code;
    job->reply = shoal_wire_pack(&e.frame, job->max_frame, &job->reply_len, &err);
    /* an ErrorReply is a few hundred bytes; pack fails only without memory,
     * and then the loop answers with its own short error */
}

/* TEST ONLY (exec.h test_nan): the first value of each poisoned expert's
 * first row in the response becomes a NaN no kernel computes. */
static void test_poison(const struct shoal_worker_exec *x, const Shoal__ExpertRequest *rq,
                        uint8_t *out, size_t i0, size_t i1)
{
    const uint32_t nan_bits = SHOAL_WORKER_TEST_NAN_BITS;
    size_t off = 0;
    for (size_t i = 0; i < i0; i++)
        off += rq->experts[i]->n_rows * (size_t)x->n_embd * sizeof(float);
    for (size_t i = i0; i < i1; i++) {
        const Shoal__ExpertRows *er = rq->experts[i];
        if (er->n_rows > 0 && (x->p.test_nan_layer < 0 || x->p.test_nan_layer == rq->layer) &&
            (x->p.test_nan_expert < 0 || x->p.test_nan_expert == er->expert))
            memcpy(out + off, &nan_bits, sizeof nan_bits);
        off += er->n_rows * (size_t)x->n_embd * sizeof(float);
    }
}

/* expert_exec's hook: the hints that arrived meanwhile */
static void exec_hints(void *user, int64_t i0)
{
    (void)i0;
    run_hints(user);
}

/* Frames to answer request rq in (ExpertRequest.parts, at most one per
 * expert): 1 unless every expert is in RAM, since a part's reads would
 * start only once the part before it computed. Compute thread. */
static int64_t n_parts(struct shoal_worker_exec *x, const Shoal__ExpertRequest *rq)
{
    const int64_t n = (int64_t)rq->n_experts;
    const int64_t k = (int64_t)rq->parts < n ? (int64_t)rq->parts : n;
    if (k < 2)
        return 1;
    const size_t nb = (size_t)((x->p.ct->n_expert + 7) / 8);
    uint8_t *bits = shoal_xcalloc(2 * nb, 1);
    int all = shoal_expert_store_resident_bits(x->store, rq->layer, bits, bits + nb) == 0;
    for (int64_t i = 0; i < n && all; i++) {
        const uint32_t e = rq->experts[i]->expert;
        all = (bits[e / 8] >> (e % 8) & 1) && !(bits[nb + e / 8] >> (e % 8) & 1);
    }
    free(bits);
    return all ? k : 1;
}

/* Hand len bytes of request job's outputs (whole experts, following the
 * parts before) to the loop thread as an ExpertResponse part (`more`).
 * Returns 0, or -1 when it could not be packed (the last frame then
 * carries these outputs). Compute thread. */
static int send_part(struct shoal_worker_exec *x, const struct shoal_worker_job *job,
                     const uint8_t *data, size_t len)
{
    Shoal__ExpertResponse rs = SHOAL__EXPERT_RESPONSE__INIT;
    rs.id = job->id;
    rs.out = (ProtobufCBinaryData){.data = (uint8_t *)data, .len = len};
    rs.more = 1;
    Shoal__Frame f = SHOAL__FRAME__INIT;
    f.msg_case = SHOAL__FRAME__MSG_RESPONSE;
    f.response = &rs;
    struct shoal_worker_job *pj = calloc(1, sizeof *pj);
    if (!pj)
        return -1;
    struct shoal_err err = {0};
    pj->reply = shoal_wire_pack(&f, job->max_frame, &pj->reply_len, &err);
    if (!pj->reply) {
        free(pj);
        return -1;
    }
    pj->kind = SHOAL_WORKER_JOB_PART;
    pj->owner = job->owner;
    pj->id = job->id;
    pthread_mutex_lock(&x->mu);
    list_push(&x->d_head, &x->d_tail, pj);
    pthread_mutex_unlock(&x->mu);
    if (x->p.notify)
        x->p.notify(x->p.notify_user);
    return 0;
}

/* Run one validated ExpertRequest (shoal_wire_check_request passed on the
 * loop thread) and leave its reply in job. */
static void run_request(struct shoal_worker_exec *x, struct shoal_worker_job *job)
{
    const Shoal__ExpertRequest *rq = job->frame->request;
    const int64_t E = x->n_embd, n = (int64_t)rq->n_experts, il = rq->layer;
    const size_t row_bytes = (size_t)E * sizeof(float);
    struct shoal_err err = {0};
    job->id = rq->id;
    double t_start = shoal_time_s(), t_read = 0, t_compute = 0;

    size_t out_bytes;
    if (shoal_mul_overflow((size_t)job->total_rows, row_bytes, &out_bytes)) {
        reply_error(job, SHOAL_ERANGE, "response size overflows");
        return;
    }
    uint8_t *out = malloc(out_bytes ? out_bytes : 1);
    if (!out) {
        char msg[160];
        snprintf(msg, sizeof msg, "worker out of memory for a %zu-byte response (request %llu)",
                 out_bytes, (unsigned long long)job->id);
        reply_error(job, SHOAL_ENOMEM, msg);
        return;
    }
    /* every expert's rows get their own scratch: the batch runs at once */
    int64_t total_rows = 0;
    for (int64_t i = 0; i < n; i++) {
        x->ids[i] = (int32_t)rq->experts[i]->expert;
        total_rows += (int64_t)rq->experts[i]->n_rows;
    }
    if (scratch_reserve(x, total_rows) < 0) {
        char msg[160];
        snprintf(msg, sizeof msg, "worker out of memory for %lld rows of scratch (request %llu)",
                 (long long)total_rows, (unsigned long long)job->id);
        free(out);
        reply_error(job, SHOAL_ENOMEM, msg);
        return;
    }

    struct shoal_expert_store_stats s0, s1;
    shoal_expert_store_stats_get(x->store, &s0);
    /* gather each expert's rows at its own offset; its outputs go straight
     * into the response, in request order */
    const uint8_t *hidden = rq->hidden.data;
    size_t pos = 0;
    int64_t row = 0;
    for (int64_t i = 0; i < n; i++) {
        const Shoal__ExpertRows *er = rq->experts[i];
        const int64_t cnt = (int64_t)er->n_rows;
        float *xi = x->xg + row * E;
        for (int64_t j = 0; j < cnt; j++)   /* the wire bytes need not be aligned */
            memcpy(xi + j * E, hidden + (size_t)er->rows[j] * row_bytes, row_bytes);
        x->jobs[i] = (struct shoal_expert_ffn_job){
            .out = (float *)(void *)(out + pos), .x = xi, .n = cnt,
            .scratch = x->ffn + 2 * row * x->n_ff};
        row += cnt;
        pos += (size_t)cnt * row_bytes;
    }
    /* hints (the next layer's experts) run once this batch's reads are in
     * flight, so their reads queue behind them: run before, a prefill's
     * whole next-layer union went to the disk ahead of the layer the
     * coordinator waits for (1.5x its time on a throttled disk, and, in a
     * small cache, evictions of prefetches before their use) */
    const struct shoal_expert_exec_hooks hooks = {.started = exec_hints, .user = x};
    /* the answer in parts (ExpertRequest.parts) when every expert is in RAM:
     * part k's outputs go on the wire while part k+1 computes. Each
     * expert's outputs are its own, so the split changes no bit. */
    const int64_t k = n_parts(x, rq);
    int64_t i0 = 0, done_rows = 0;
    size_t pos0 = 0;   /* the outputs before it went out as parts */
    for (int64_t g = 0; g < k && i0 < n; g++) {
        /* whole experts, up to about (g + 1) / k of the rows */
        const int64_t want = g == k - 1 ? total_rows : (g + 1) * total_rows / k;
        int64_t i1 = i0, rows = 0;
        do {
            rows += (int64_t)rq->experts[i1]->n_rows;
            i1++;
        } while (i1 < n && done_rows + rows < want);
        struct shoal_expert_exec_times tm;
        int rc = shoal_expert_exec_run(x->store, il, x->ids + i0, i1 - i0, x->jobs + i0, x->ew,
                                       &hooks, &tm, &err);
        if (rc < 0) {
            free(out);
            reply_error(job, rc, err.msg);
            return;
        }
        t_read += tm.acquire;
        t_compute += tm.compute;
        done_rows += rows;
        if (x->p.test_nan)
            test_poison(x, rq, out, (size_t)i0, (size_t)i1);
        const size_t end = (size_t)done_rows * row_bytes;
        if (i1 < n && send_part(x, job, out + pos0, end - pos0) == 0)
            pos0 = end;
        i0 = i1;
    }
    shoal_expert_store_stats_get(x->store, &s1);

    Shoal__ExpertResponse rs = SHOAL__EXPERT_RESPONSE__INIT;
    rs.id = job->id;
    rs.out.data = out + pos0;   /* after the parts already sent */
    rs.out.len = pos - pos0;
    rs.queue_seconds = t_start - job->t_submit;
    rs.read_seconds = t_read;
    rs.compute_seconds = t_compute;
    rs.cache_hits = (uint32_t)((s1.pinned_hits + s1.cache_hits + s1.inflight_hits) -
                               (s0.pinned_hits + s0.cache_hits + s0.inflight_hits));
    rs.disk_reads = (uint32_t)(s1.disk_reads - s0.disk_reads);
    /* every byte the disk read since the previous answer (prefetches that
     * landed between requests included), with its busy time: the SSD
     * bytes a token costs and the disk's rate */
    rs.bytes_read = s1.bytes_read - x->answered_bytes;
    rs.read_busy_seconds = s1.read_busy_seconds - x->answered_busy;
    x->answered_bytes = s1.bytes_read;
    x->answered_busy = s1.read_busy_seconds;
    /* what is in RAM here now, for placement: this layer, and the next
     * layer with experts here once the hints that came meanwhile ran (the
     * coordinator sends the next layer's hint right after this request) */
    run_hints(x);
    const struct shoal_container *ct = x->p.ct;
    const size_t nb = (size_t)((ct->n_expert + 7) / 8);
    uint8_t *bits = shoal_xcalloc(4 * nb > 0 ? 4 * nb : 1, 1);
    if (shoal_expert_store_resident_bits(x->store, il, bits, bits + nb) == 0) {
        rs.resident = (ProtobufCBinaryData){.data = bits, .len = nb};
        rs.loading = (ProtobufCBinaryData){.data = bits + nb, .len = nb};
    }
    for (int64_t l2 = il + 1; l2 < ct->n_layer; l2++)
        if (ct->layer_offset[l2] != UINT64_MAX) {
            if (shoal_expert_store_resident_bits(x->store, l2, bits + 2 * nb, bits + 3 * nb) ==
                0) {
                rs.next_layer = (uint32_t)l2;
                rs.next_resident = (ProtobufCBinaryData){.data = bits + 2 * nb, .len = nb};
                rs.next_loading = (ProtobufCBinaryData){.data = bits + 3 * nb, .len = nb};
            }
            break;
        }
    Shoal__Frame f = SHOAL__FRAME__INIT;
    f.msg_case = SHOAL__FRAME__MSG_RESPONSE;
    f.response = &rs;
    job->reply = shoal_wire_pack(&f, job->max_frame, &job->reply_len, &err);
    free(out);
    free(bits);
    if (!job->reply)
        reply_error(job, err.code ? err.code : SHOAL_ENOMEM, err.msg);
}

/* ------------------------------------------------------------ thread */

static void *thread_main(void *arg)
{
    struct shoal_worker_exec *x = arg;
    const struct shoal_container *ct = x->p.ct;
    if (x->p.threads > 0)
        omp_set_num_threads(x->p.threads);   /* an ICV of this thread */
    struct shoal_err err = {0};
    struct shoal_expert_store *store = shoal_expert_store_create(ct, x->p.store, &err);
    void *blob = NULL;
    if (store) {
        int64_t pil = 0, pie = 0;
        x->info.disk_mbps = probe_disk(ct, &blob, &pil, &pie);
        x->info.compute_gbps = probe_compute(ct, blob, pil, pie);
        free(blob);
        struct shoal_expert_store_stats st;
        shoal_expert_store_stats_get(store, &st);
        x->info.io_engine = st.io_engine;
        x->info.direct = st.n_source > 0 && st.source[0].direct;
    }
    pthread_mutex_lock(&x->mu);
    x->store = store;
    {   /* pins read at start are not a request's */
        struct shoal_expert_store_stats st0;
        shoal_expert_store_stats_get(store, &st0);
        x->answered_bytes = st0.bytes_read;
        x->answered_busy = st0.read_busy_seconds;
    }
    x->ready = store ? 1 : -1;
    if (!store)
        x->start_err = err;
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
    if (!store)
        return NULL;

    for (;;) {
        pthread_mutex_lock(&x->mu);
        while (!x->stop && !x->q_head && !x->h_head)
            pthread_cond_wait(&x->cv, &x->mu);
        if (x->stop) {
            pthread_mutex_unlock(&x->mu);
            break;
        }
        /* a queued request before queued hints: its reads go first and
         * the hints run behind them (run_request's started hook) */
        struct shoal_worker_job *job = list_pop(&x->q_head, &x->q_tail);
        pthread_mutex_unlock(&x->mu);
        if (!job) {
            run_hints(x);
            continue;
        }
        run_request(x, job);
        pthread_mutex_lock(&x->mu);
        x->depth--;
        list_push(&x->d_head, &x->d_tail, job);
        const int idle = !x->q_head;
        pthread_mutex_unlock(&x->mu);
        if (idle && x->scratch_rows > SCRATCH_KEEP_ROWS)
            scratch_release(x);
        if (x->p.notify)
            x->p.notify(x->p.notify_user);
    }

    pthread_mutex_lock(&x->mu);
    shoal_expert_store_stats_get(store, &x->final);
    x->final.counts_path = NULL;   /* borrowed from the store */
    for (int i = 0; i < x->final.n_source; i++)
        x->final.source[i].path = NULL;
    x->store = NULL;   /* stats callers see NULL before the store goes away */
    pthread_mutex_unlock(&x->mu);
    shoal_expert_store_destroy(store);
    return NULL;
}

struct shoal_worker_exec *shoal_worker_exec_create(const struct shoal_worker_exec_params *p,
                                                   struct shoal_err *err)
{
    struct shoal_worker_exec *x = shoal_xcalloc(1, sizeof *x);
    x->p = *p;
    x->n_embd = p->n_embd;
    x->n_ff = p->n_ff_exp;
    x->ids = shoal_xcalloc((size_t)(p->ct->n_expert > 0 ? p->ct->n_expert : 1), sizeof *x->ids);
    x->ew = shoal_xcalloc((size_t)(p->ct->n_expert > 0 ? p->ct->n_expert : 1), sizeof *x->ew);
    x->jobs = shoal_xcalloc((size_t)(p->ct->n_expert > 0 ? p->ct->n_expert : 1),
                            sizeof *x->jobs);
    x->info.io_engine = "none";
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->cv, NULL);
    int rc = pthread_create(&x->thread, NULL, thread_main, x);
    if (rc) {
        shoal_err_set(err, -rc, "cannot start the compute thread: %s", strerror(rc));
        shoal_worker_exec_destroy(x);
        return NULL;
    }
    x->started = 1;
    pthread_mutex_lock(&x->mu);
    while (!x->ready)
        pthread_cond_wait(&x->cv, &x->mu);
    pthread_mutex_unlock(&x->mu);
    if (x->ready < 0) {
        shoal_err_set(err, x->start_err.code ? x->start_err.code : SHOAL_EIO, "%s",
                      x->start_err.msg);
        shoal_worker_exec_destroy(x);
        return NULL;
    }
    return x;
}

const struct shoal_worker_exec_info *shoal_worker_exec_info(const struct shoal_worker_exec *x)
{
    return &x->info;
}

void shoal_worker_exec_submit(struct shoal_worker_exec *x, struct shoal_worker_job *job)
{
    job->t_submit = shoal_time_s();
    pthread_mutex_lock(&x->mu);
    if (job->kind == SHOAL_WORKER_JOB_HINT) {
        if (x->stop)
            shoal_worker_job_free(job);
        else
            list_push(&x->h_head, &x->h_tail, job);
    } else if (x->stop) {
        job->status = SHOAL_ECANCELED;
        list_push(&x->d_head, &x->d_tail, job);
    } else {
        x->depth++;
        list_push(&x->q_head, &x->q_tail, job);
    }
    pthread_cond_signal(&x->cv);
    pthread_mutex_unlock(&x->mu);
}

int shoal_worker_exec_cancel(struct shoal_worker_exec *x, const void *owner)
{
    int n = 0;
    pthread_mutex_lock(&x->mu);
    struct shoal_worker_job *keep_head = NULL, *keep_tail = NULL, *j;
    while ((j = list_pop(&x->q_head, &x->q_tail))) {
        if (j->owner == owner) {
            j->status = SHOAL_ECANCELED;
            x->depth--;
            list_push(&x->d_head, &x->d_tail, j);
            n++;
        } else {
            list_push(&keep_head, &keep_tail, j);
        }
    }
    x->q_head = keep_head;
    x->q_tail = keep_tail;
    pthread_mutex_unlock(&x->mu);
    if (n > 0 && x->p.notify)
        x->p.notify(x->p.notify_user);
    return n;
}

struct shoal_worker_job *shoal_worker_exec_take_done(struct shoal_worker_exec *x)
{
    pthread_mutex_lock(&x->mu);
    struct shoal_worker_job *j = x->d_head;
    x->d_head = x->d_tail = NULL;
    pthread_mutex_unlock(&x->mu);
    return j;
}

uint32_t shoal_worker_exec_queue_depth(struct shoal_worker_exec *x)
{
    pthread_mutex_lock(&x->mu);
    uint32_t d = x->depth;
    pthread_mutex_unlock(&x->mu);
    return d;
}

void shoal_worker_exec_store_stats(struct shoal_worker_exec *x,
                                   struct shoal_expert_store_stats *out)
{
    pthread_mutex_lock(&x->mu);
    if (x->store)
        shoal_expert_store_stats_get(x->store, out);
    else
        *out = x->final;   /* zero before start; the last counters after stop */
    pthread_mutex_unlock(&x->mu);
}

void shoal_worker_exec_stop(struct shoal_worker_exec *x)
{
    if (!x || x->stopped)
        return;
    pthread_mutex_lock(&x->mu);
    x->stop = 1;
    struct shoal_worker_job *j;
    while ((j = list_pop(&x->q_head, &x->q_tail))) {
        j->status = SHOAL_ECANCELED;
        x->depth--;
        list_push(&x->d_head, &x->d_tail, j);
    }
    while ((j = list_pop(&x->h_head, &x->h_tail)))
        shoal_worker_job_free(j);
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
    if (x->started)
        pthread_join(x->thread, NULL);
    x->stopped = 1;
}

void shoal_worker_exec_destroy(struct shoal_worker_exec *x)
{
    if (!x)
        return;
    shoal_worker_exec_stop(x);
    struct shoal_worker_job *j = x->d_head;
    while (j) {
        struct shoal_worker_job *nx = j->next;
        shoal_worker_job_free(j);
        j = nx;
    }
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->cv);
    free(x->ids);
    free(x->ew);
    free(x->jobs);
    free(x->xg);
    free(x->ffn);
    free(x);
}
