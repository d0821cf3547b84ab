#include "server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "log.h"
#include "util.h"

#define LOG_C "worker"
/* one read buffer for every connection (the loop reads one socket at a
 * time, and the frame reader copies what it keeps), so an idle or
 * unauthenticated connection costs no read buffer of its own */
#define READ_CHUNK (64u << 10)
#define FLUSH_TIMEOUT_MS 2000
#define DIAL_BACKOFF_MIN_MS 500
/* at most 2 s between a joining worker's dials: a coordinator's start
 * waits --connect-timeout (default 5 s) for joiners, so an idle joiner
 * still reaches each new session in time (at 10 s it missed half of them) */
#define DIAL_BACKOFF_MAX_MS 2000
/* protobuf overhead of an ExpertResponse around its out bytes, bounded */
#define RESPONSE_OVERHEAD 256

struct conn {
    uv_tcp_t tcp;                  /* data = conn */
    uv_timer_t timer;              /* handshake deadline, then flush deadline */
    uv_connect_t connect;          /* --join dial */
    uv_shutdown_t shut;
    struct shoal_worker_server *srv;
    struct conn *prev, *next;      /* srv->conns while open */
    int refs;                      /* handles + writes + jobs + connect/shutdown reqs */
    int closing;                   /* no more dispatch; replies are discarded */
    int handles_closed;            /* uv_close called on tcp and timer */
    int dialled;                   /* our --join connection */
    int hs_done;
    int unauth;                    /* in srv->preauth (accepted, not yet authenticated) */
    int coord;                     /* counted in srv->n_coord (an authenticated coordinator) */
    int reading, paused;
    uint64_t pauses;               /* times reading stopped for backpressure */
    char peer[96];                 /* "host:port" */
    char peer_name[192];           /* the peer's PeerInfo name (sanitised) once authenticated */
    Shoal__Role peer_role;
    uint32_t peer_max_frame;       /* bytes; our max until the peer says */
    struct shoal_frame_reader reader;
    struct shoal_handshake hs;
    uint64_t write_bytes;          /* handed to uv_write, not yet written */
    uint64_t job_bytes;            /* request bytes queued at the compute thread */
    uint64_t reply_bytes;          /* bytes the replies of those requests will take */
    uint64_t requests, errors;
};

struct wreq {
    uv_write_t req;
    struct conn *c;
    uint8_t *data;                 /* owned; freed in the write callback */
    size_t len;
};

struct shoal_worker_server {
    struct shoal_worker_server_params p;
    uv_loop_t loop;
    int loop_init;
    uv_tcp_t listener;
    uv_async_t async;
    uv_signal_t sigint, sigterm;
    uv_timer_t dial_timer;
    uv_timer_t drain_timer;        /* while draining: waits for the compute queue */
    double drain_start;
    int draining;                  /* SIGTERM/SIGINT seen: finish, refuse new requests */
    int handles_init;
    char listen_addr[96];
    struct sockaddr_storage join_addr;
    struct shoal_worker_exec *exec;
    struct conn *conns;            /* open connections */
    struct conn *join_conn;        /* the --join connection while open */
    int n_conns;
    struct shoal_preauth preauth;  /* accepted connections not authenticated yet */
    int n_coord;                   /* authenticated coordinators */
    char *rbuf;                    /* [READ_CHUNK], shared by every connection's reads */
    uint64_t dial_backoff_ms;
    int stopping;
    double t_start;
    uint64_t requests, errors;     /* totals over every connection */
};

/* ------------------------------------------------------------ helpers */

static const char *conn_label(const struct conn *c)
{
    return c->peer_name[0] ? c->peer_name : c->peer;
}

static void conn_ref(struct conn *c)
{
    c->refs++;
}

static void conn_unref(struct conn *c)
{
    if (--c->refs > 0)
        return;
    struct shoal_worker_server *srv = c->srv;
    shoal_frame_reader_free(&c->reader);
    shoal_handshake_free(&c->hs);
    free(c);
#if defined(__GLIBC__)
    /* the last connection is gone: hand its frames and replies (freed to
     * glibc's arenas, which keep them) back to the system */
    if (!srv->conns)
        malloc_trim(0);
#else
    (void)srv;
#endif
}

static void conn_unlink(struct conn *c)
{
    struct shoal_worker_server *srv = c->srv;
    if (c->prev)
        c->prev->next = c->next;
    else if (srv->conns == c)
        srv->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
    srv->n_conns--;
    if (c->unauth) {
        c->unauth = 0;
        shoal_preauth_remove(&srv->preauth, c);
    }
    if (c->coord) {
        c->coord = 0;
        srv->n_coord--;
    }
}

/* Cancel c's requests still queued at the compute thread (the running one
 * finishes; its reply is dropped since c is closing). */
static void conn_cancel_jobs(struct conn *c)
{
    struct shoal_worker_server *srv = c->srv;
    if (!srv->exec || srv->stopping)
        return;
    int n = shoal_worker_exec_cancel(srv->exec, c);
    if (n > 0)
        shoal_log(SHOAL_LOG_INFO, LOG_C, "cancelled %d queued request%s of peer=%s", n,
                  n == 1 ? "" : "s", conn_label(c));
}

static void schedule_dial(struct shoal_worker_server *srv);

static void on_handle_close(uv_handle_t *h)
{
    conn_unref(h->data);
}

/* Close now: pending writes are cancelled, replies still at the compute
 * thread are discarded when they come back. why: for the log line. */
static void conn_close(struct conn *c, const char *why)
{
    if (c->handles_closed)
        return;
    if (why)
        shoal_log(SHOAL_LOG_INFO, LOG_C, "closed %s peer=%s: %s",
                  c->hs_done ? shoal_wire_role_name(c->peer_role) : "connection", conn_label(c), why);
    c->closing = 1;
    c->handles_closed = 1;
    struct shoal_worker_server *srv = c->srv;
    conn_unlink(c);
    conn_cancel_jobs(c);
    uv_close((uv_handle_t *)&c->tcp, on_handle_close);
    uv_close((uv_handle_t *)&c->timer, on_handle_close);
    if (c->dialled && srv->join_conn == c) {
        srv->join_conn = NULL;
        schedule_dial(srv);
    }
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    struct conn *c = req->data;
    (void)status;
    conn_close(c, NULL);
    conn_unref(c);
}

static void on_flush_timeout(uv_timer_t *t)
{
    struct conn *c = t->data;
    conn_close(c, "peer did not read the error reply in time");
}

/* Close after the queued writes (an error reply) are sent, within
 * FLUSH_TIMEOUT_MS. why: logged now. */
static void conn_close_flush(struct conn *c, const char *why)
{
    if (c->closing)
        return;
    shoal_log(SHOAL_LOG_INFO, LOG_C, "closing %s peer=%s: %s",
              c->hs_done ? shoal_wire_role_name(c->peer_role) : "connection", conn_label(c), why);
    c->closing = 1;
    conn_cancel_jobs(c);
    if (c->reading)
        uv_read_stop((uv_stream_t *)&c->tcp);
    c->reading = 0;
    uv_timer_stop(&c->timer);
    uv_timer_start(&c->timer, on_flush_timeout, FLUSH_TIMEOUT_MS, 0);
    c->shut.data = c;
    conn_ref(c);
    if (uv_shutdown(&c->shut, (uv_stream_t *)&c->tcp, on_shutdown) < 0) {
        conn_unref(c);
        conn_close(c, NULL);
    }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct conn *c = h->data;
    (void)suggested;
    *buf = uv_buf_init(c->srv->rbuf, READ_CHUNK);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

/* Read unless the connection is over its backpressure limit: its queued
 * requests, the replies they will produce and its unwritten bytes. */
static void conn_update_reading(struct conn *c)
{
    if (c->closing)
        return;
    const uint64_t limit = c->srv->p.backpressure_bytes;
    const uint64_t queued = c->write_bytes + c->job_bytes + c->reply_bytes;
    if (c->reading && queued > limit) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->reading = 0;
        /* an event worth a line the first time; debug after that */
        shoal_log(c->pauses ? SHOAL_LOG_DEBUG : SHOAL_LOG_INFO, LOG_C,
                  "backpressure peer=%s: %llu bytes queued (limit %llu), reading paused",
                  conn_label(c), (unsigned long long)queued, (unsigned long long)limit);
        c->pauses++;
        c->paused = 1;
    } else if (!c->reading && queued <= limit / 2) {
        if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0) {
            c->reading = 1;
            c->paused = 0;
        }
    }
}

static void on_write(uv_write_t *req, int status)
{
    struct wreq *w = (struct wreq *)req;
    struct conn *c = w->c;
    c->write_bytes -= w->len;
    free(w->data);
    free(w);
    if (status < 0 && !c->closing) {
        char why[128];
        snprintf(why, sizeof why, "write failed: %s", uv_strerror(status));
        conn_close(c, why);
    } else {
        conn_update_reading(c);
    }
    conn_unref(c);
}

/* Queue data (len bytes, a packed frame; takes ownership) for writing. */
static void conn_send(struct conn *c, uint8_t *data, size_t len)
{
    if (c->closing) {   /* after uv_shutdown a write would fail with EPIPE */
        free(data);
        return;
    }
    struct wreq *w = shoal_xmalloc(sizeof *w);
    w->c = c;
    w->data = data;
    w->len = len;
    uv_buf_t b = uv_buf_init((char *)data, (unsigned int)len);
    c->write_bytes += len;
    conn_ref(c);
    int rc = uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, on_write);
    if (rc < 0) {
        c->write_bytes -= len;
        free(data);
        free(w);
        conn_unref(c);
        char why[128];
        snprintf(why, sizeof why, "write failed: %s", uv_strerror(rc));
        conn_close(c, why);
        return;
    }
    conn_update_reading(c);
}

/* Send the frames of a wire buffer (its bytes change owner). */
static void conn_send_buf(struct conn *c, struct shoal_wire_buf *b)
{
    if (b->len == 0) {
        shoal_wire_buf_free(b);
        return;
    }
    uint8_t *data = b->data;
    size_t len = b->len;
    b->data = NULL;
    b->len = b->cap = 0;
    conn_send(c, data, len);
}

static void conn_send_frame(struct conn *c, const Shoal__Frame *f)
{
    struct shoal_err err = {0};
    size_t len = 0;
    uint8_t *data = shoal_wire_pack(f, c->peer_max_frame, &len, &err);
    if (!data) {
        shoal_log(SHOAL_LOG_WARN, LOG_C, "cannot send %s to peer=%s: %s",
                  shoal_wire_frame_name(f), conn_label(c), err.msg);
        return;
    }
    conn_send(c, data, len);
}

/* ErrorReply with the id it answers (0: none) and a one-line message. */
static void conn_send_error(struct conn *c, uint64_t id, int code, const char *msg)
{
    struct shoal_wire_error e;
    shoal_wire_error_init(&e, id, code, msg);
    c->errors++;
    c->srv->errors++;
    shoal_log(SHOAL_LOG_INFO, LOG_C, "error reply peer=%s req=%llu: %s", conn_label(c),
              (unsigned long long)id, msg);
    conn_send_frame(c, &e.frame);
}

/* ------------------------------------------------------------ dispatch */

/* The bytes of the reply to a request of total_rows rows (an upper bound). */
static uint64_t reply_bytes(uint64_t total_rows, uint64_t row_bytes)
{
    return total_rows * row_bytes + RESPONSE_OVERHEAD;
}

static void handle_request(struct conn *c, Shoal__Frame *f, size_t wire_len)
{
    struct shoal_worker_server *srv = c->srv;
    const struct shoal_worker_server_params *p = &srv->p;
    const Shoal__ExpertRequest *rq = f->request;
    struct shoal_err err = {0};
    const uint64_t row_bytes = (uint64_t)p->n_embd * sizeof(float);
    const int64_t max_rows = (int64_t)(p->max_frame / (row_bytes ? row_bytes : 1));
    int rc = shoal_wire_check_request(rq, p->n_layer, p->n_expert, p->n_embd, p->is_moe,
                                      p->coverage, p->coverage_len, max_rows, &err);
    if (rc < 0) {
        conn_send_error(c, rq->id, rc, err.msg);
        shoal_wire_frame_free(f);
        return;
    }
    /* the response must fit one frame the peer accepts: each row of each
     * expert comes back as n_embd f32 (checked here, before any memory) */
    uint64_t total_rows = 0;
    for (size_t i = 0; i < rq->n_experts; i++)
        total_rows += rq->experts[i]->n_rows;   /* <= n_expert * n_rows: no overflow */
    const uint64_t limit = c->peer_max_frame < p->max_frame ? c->peer_max_frame : p->max_frame;
    if (total_rows > (limit - RESPONSE_OVERHEAD) / row_bytes) {
        char msg[256];
        snprintf(msg, sizeof msg, "request %llu: response of %llu rows x %lld f32 would exceed "
                 "the %llu-byte frame limit; split the batch", (unsigned long long)rq->id,
                 (unsigned long long)total_rows, (long long)p->n_embd, (unsigned long long)limit);
        conn_send_error(c, rq->id, SHOAL_ERANGE, msg);
        shoal_wire_frame_free(f);
        return;
    }
    struct shoal_worker_job *job = shoal_xcalloc(1, sizeof *job);
    job->kind = SHOAL_WORKER_JOB_REQUEST;
    job->frame = f;
    job->total_rows = total_rows;
    job->max_frame = (uint32_t)limit;
    job->owner = c;
    job->id = rq->id;
    job->frame_bytes = wire_len;
    c->job_bytes += wire_len;
    c->reply_bytes += reply_bytes(total_rows, row_bytes);
    c->requests++;
    srv->requests++;
    conn_ref(c);
    shoal_worker_exec_submit(srv->exec, job);
    conn_update_reading(c);
}

static void handle_hint(struct conn *c, Shoal__Frame *f)
{
    const struct shoal_worker_server_params *p = &c->srv->p;
    const Shoal__PrefetchHint *h = f->hint;
    if (h->layer >= (uint64_t)p->n_layer || !p->is_moe[h->layer]) {
        char msg[160];
        snprintf(msg, sizeof msg, "prefetch hint for layer %u: expected a MoE layer < %lld",
                 h->layer, (long long)p->n_layer);
        conn_send_error(c, 0, SHOAL_ERANGE, msg);
        shoal_wire_frame_free(f);
        return;
    }
    /* keep the experts this worker serves; duplicates are fine (the store
     * dedups), anything else is ignored as the store would */
    int32_t *ids = malloc((h->n_experts ? h->n_experts : 1) * sizeof *ids);
    int64_t n = 0;
    for (size_t i = 0; ids && i < h->n_experts; i++)
        if (h->experts[i] < (uint64_t)p->n_expert &&
            shoal_wire_covers(p->coverage, p->coverage_len, p->n_expert, h->layer,
                              h->experts[i]))
            ids[n++] = (int32_t)h->experts[i];
    if (n == 0) {
        free(ids);
        shoal_wire_frame_free(f);
        return;
    }
    struct shoal_worker_job *job = shoal_xcalloc(1, sizeof *job);
    job->kind = SHOAL_WORKER_JOB_HINT;
    job->layer = h->layer;
    job->ids = ids;
    job->n_ids = n;
    shoal_wire_frame_free(f);
    shoal_worker_exec_submit(c->srv->exec, job);
}

static void handle_status(struct conn *c, const Shoal__StatusRequest *sr)
{
    struct shoal_worker_server *srv = c->srv;
    struct shoal_expert_store_stats st;
    shoal_worker_exec_store_stats(srv->exec, &st);
    Shoal__StatusReply r = SHOAL__STATUS_REPLY__INIT;
    r.id = sr->id;
    r.info = (Shoal__PeerInfo *)srv->p.info;   /* packed, never modified */
    r.cache_used = st.pinned_bytes + st.cached_bytes;
    r.cache_limit = srv->p.info->cache_bytes;
    r.hits = st.pinned_hits + st.cache_hits + st.inflight_hits;
    r.misses = st.disk_reads;
    r.bytes_read = st.bytes_read;
    r.read_busy_seconds = st.read_busy_seconds;
    r.queue_depth = shoal_worker_exec_queue_depth(srv->exec);
    r.requests = srv->requests;
    r.errors = srv->errors;
    r.uptime_seconds = shoal_time_s() - srv->t_start;
    r.connections = (uint32_t)srv->n_conns;
    r.draining = srv->draining;
    Shoal__Frame f = SHOAL__FRAME__INIT;
    f.msg_case = SHOAL__FRAME__MSG_STATUS;
    f.status = &r;
    conn_send_frame(c, &f);
}

/* An authenticated peer's frame (takes ownership of f). */
static void dispatch(struct conn *c, Shoal__Frame *f, size_t wire_len)
{
    const int coord = c->peer_role == SHOAL__ROLE__ROLE_COORDINATOR;
    char msg[400];
    switch (f->msg_case) {
    case SHOAL__FRAME__MSG_REQUEST:
        if (!coord)
            break;
        if (c->srv->draining) {
            /* the coordinator re-runs it on another holder */
            conn_send_error(c, f->request->id, SHOAL_ECANCELED,
                            "worker is draining (shutting down): run it on another holder");
            shoal_wire_frame_free(f);
            return;
        }
        handle_request(c, f, wire_len);
        return;
    case SHOAL__FRAME__MSG_HINT:
        if (!coord)
            break;
        handle_hint(c, f);
        return;
    case SHOAL__FRAME__MSG_HEARTBEAT:
        if (!f->heartbeat->reply) {
            f->heartbeat->reply = 1;
            conn_send_frame(c, f);
        }
        shoal_wire_frame_free(f);
        return;
    case SHOAL__FRAME__MSG_STATUS_REQUEST:
        handle_status(c, f->status_request);
        shoal_wire_frame_free(f);
        return;
    default:
        break;
    }
    uint64_t id = f->msg_case == SHOAL__FRAME__MSG_REQUEST ? f->request->id : 0;
    snprintf(msg, sizeof msg, "unexpected frame '%s' from %s %s: a worker answers %s",
             shoal_wire_frame_name(f), shoal_wire_role_name(c->peer_role), conn_label(c),
             coord ? "request, hint, heartbeat and status_request"
                   : "heartbeat and status_request from an observer");
    conn_send_error(c, id, SHOAL_EUNSUPPORTED, msg);
    shoal_wire_frame_free(f);
}

/* The handshake finished: check who the peer is. Returns 0 or -1 (closed). */
static int on_authenticated(struct conn *c)
{
    const Shoal__PeerInfo *pi = c->hs.peer_info;
    c->peer_role = c->hs.peer_role;
    if (c->peer_role != SHOAL__ROLE__ROLE_COORDINATOR &&
        c->peer_role != SHOAL__ROLE__ROLE_OBSERVER) {
        /* the coordinator we dialled (--join) said it is something else */
        char why[160];
        snprintf(why, sizeof why, "refused: peer is a %s; a worker serves a coordinator "
                 "or an observer", shoal_wire_role_name(c->peer_role));
        struct shoal_wire_error e;
        shoal_wire_error_init(&e, 0, SHOAL_EUNSUPPORTED, why);
        conn_send_frame(c, &e.frame);
        conn_close_flush(c, why);
        return -1;
    }
    c->hs_done = 1;
    if (c->unauth) {
        c->unauth = 0;
        shoal_preauth_remove(&c->srv->preauth, c);
    }
    if (c->peer_role == SHOAL__ROLE__ROLE_COORDINATOR) {
        c->coord = 1;
        c->srv->n_coord++;
    }
    if (pi && pi->name && pi->name[0]) {
        char name[64];
        shoal_wire_printable(name, sizeof name, pi->name);
        snprintf(c->peer_name, sizeof c->peer_name, "%s(%s)", name, c->peer);
    }
    if (pi && pi->max_frame >= 4096)
        c->peer_max_frame = pi->max_frame < c->srv->p.max_frame ? (uint32_t)pi->max_frame
                                                                  : c->srv->p.max_frame;
    /* an observer asks for status: its frames stay handshake-sized */
    if (c->peer_role == SHOAL__ROLE__ROLE_COORDINATOR)
        c->reader.max_frame = c->srv->p.max_frame;
    uv_timer_stop(&c->timer);
    if (c->dialled)
        c->srv->dial_backoff_ms = DIAL_BACKOFF_MIN_MS;
    shoal_log(SHOAL_LOG_INFO, LOG_C, "authenticated %s peer=%s%s", shoal_wire_role_name(c->peer_role),
              conn_label(c), c->srv->p.key->set ? " (cluster key)" : " (no key, loopback)");
    return 0;
}

static int on_frame(void *user, const uint8_t *body, size_t len)
{
    struct conn *c = user;
    if (c->closing)
        return 1;
    struct shoal_err err = {0};
    Shoal__Frame *f = shoal_wire_unpack(body, len, &err);
    if (!c->hs_done) {
        struct shoal_wire_buf out = {0};
        int rc;
        if (f) {
            rc = shoal_handshake_on_frame(&c->hs, f, &out, &err);
        } else {
            struct shoal_wire_error e;
            shoal_wire_error_init(&e, 0, SHOAL_EFORMAT, err.msg);
            shoal_wire_buf_append(&out, &e.frame, c->peer_max_frame, NULL);
            rc = err.code ? err.code : SHOAL_EFORMAT;
        }
        if (rc == 1)
            shoal_handshake_adopt(&c->hs, f);   /* peer_info points into it */
        else
            shoal_wire_frame_free(f);
        conn_send_buf(c, &out);
        if (rc < 0) {
            char why[SHOAL_ERR_MSG_MAX + 16];
            snprintf(why, sizeof why, "refused: %s", err.msg);
            conn_close_flush(c, why);
            return 1;
        }
        if (rc == 1 && on_authenticated(c) < 0)
            return 1;
        return 0;
    }
    if (!f) {
        char msg[SHOAL_ERR_MSG_MAX + 64];
        snprintf(msg, sizeof msg, "malformed frame of %zu bytes: %s", len, err.msg);
        conn_send_error(c, 0, err.code ? err.code : SHOAL_EFORMAT, msg);
        return 0;
    }
    dispatch(c, f, len + 4);
    return c->closing;
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct conn *c = s->data;
    if (nread == 0 || c->closing)
        return;
    if (nread < 0) {
        char why[128];
        snprintf(why, sizeof why, "%s", nread == UV_EOF ? "peer closed the connection"
                                                        : uv_strerror((int)nread));
        conn_close(c, why);
        return;
    }
    struct shoal_err err = {0};
    conn_ref(c);
    int rc = shoal_frame_reader_feed(&c->reader, (const uint8_t *)buf->base, (size_t)nread,
                                     on_frame, c, &err);
    if (rc < 0 && !c->closing) {
        /* a bad length prefix: the stream is out of sync */
        struct shoal_wire_error e;
        shoal_wire_error_init(&e, 0, rc, err.msg);
        c->errors++;
        c->srv->errors++;
        conn_send_frame(c, &e.frame);
        conn_close_flush(c, err.msg);
    }
    conn_unref(c);
}

/* ------------------------------------------------------------ connections */

static void on_hs_timeout(uv_timer_t *t)
{
    struct conn *c = t->data;
    if (c->hs_done || c->closing)
        return;
    char why[96];
    snprintf(why, sizeof why, "no handshake within %.1f s", c->srv->p.handshake_timeout_s);
    conn_close(c, why);
}

/* A new connection with its handles initialised (tcp by the caller). */
static struct conn *conn_new(struct shoal_worker_server *srv, int dialled)
{
    struct conn *c = shoal_xcalloc(1, sizeof *c);
    c->srv = srv;
    c->dialled = dialled;
    c->refs = 2;   /* the tcp and timer handles, released in their close callbacks */
    c->tcp.data = c;
    c->timer.data = c;
    c->peer_max_frame = srv->p.max_frame;
    shoal_frame_reader_init(&c->reader, SHOAL_WIRE_HANDSHAKE_MAX_FRAME < srv->p.max_frame
                                            ? SHOAL_WIRE_HANDSHAKE_MAX_FRAME : srv->p.max_frame);
    uv_timer_init(&srv->loop, &c->timer);
    c->next = srv->conns;
    if (srv->conns)
        srv->conns->prev = c;
    srv->conns = c;
    srv->n_conns++;
    return c;
}

/* Handshake hook, before Ready: the peer's role and the coordinator cap. */
static int admit_peer(void *user, Shoal__Role role, char *msg, size_t n)
{
    struct conn *c = user;
    struct shoal_worker_server *srv = c->srv;
    if (role != SHOAL__ROLE__ROLE_COORDINATOR && role != SHOAL__ROLE__ROLE_OBSERVER) {
        snprintf(msg, n, "peer is a %s; a worker serves a coordinator or an observer",
                 shoal_wire_role_name(role));
        return -1;
    }
    if (role == SHOAL__ROLE__ROLE_COORDINATOR && srv->n_coord >= srv->p.max_coordinators) {
        snprintf(msg, n, "%d coordinator%s connected, the most this worker serves at once "
                 "(--max-coordinators %d)", srv->n_coord, srv->n_coord == 1 ? " is" : "s are",
                 srv->p.max_coordinators);
        return -1;
    }
    return 0;
}

static void conn_start(struct conn *c)
{
    struct shoal_worker_server *srv = c->srv;
    uv_tcp_nodelay(&c->tcp, 1);
    uv_tcp_keepalive(&c->tcp, 1, 30);
    shoal_handshake_init(&c->hs, c->dialled, SHOAL__ROLE__ROLE_WORKER, srv->p.key,
                         srv->p.info, srv->p.fingerprint, c->peer);
    if (!c->dialled) {
        c->hs.admit = admit_peer;
        c->hs.admit_user = c;
    }
    uint64_t ms = (uint64_t)(srv->p.handshake_timeout_s * 1000.0);
    uv_timer_start(&c->timer, on_hs_timeout, ms ? ms : 1, 0);
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) < 0) {
        conn_close(c, "cannot read");
        return;
    }
    c->reading = 1;
    if (c->dialled) {
        struct shoal_wire_buf out = {0};
        struct shoal_err err = {0};
        if (shoal_handshake_start(&c->hs, &out, &err) < 0) {
            shoal_wire_buf_free(&out);
            conn_close(c, err.msg);
            return;
        }
        conn_send_buf(c, &out);
    }
}

static void on_connection(uv_stream_t *server, int status)
{
    struct shoal_worker_server *srv = server->data;
    if (status < 0) {
        shoal_log(SHOAL_LOG_WARN, LOG_C, "accept on %s failed: %s", srv->listen_addr,
                  uv_strerror(status));
        return;
    }
    struct conn *c = conn_new(srv, 0);
    uv_tcp_init(&srv->loop, &c->tcp);
    int rc = uv_accept(server, (uv_stream_t *)&c->tcp);
    if (rc < 0) {
        snprintf(c->peer, sizeof c->peer, "?");
        char why[96];
        snprintf(why, sizeof why, "accept failed: %s", uv_strerror(rc));
        conn_close(c, why);
        return;
    }
    struct sockaddr_storage ss;
    int len = sizeof ss;
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) == 0)
        shoal_wire_addr_str((struct sockaddr *)&ss, c->peer, sizeof c->peer);
    else
        snprintf(c->peer, sizeof c->peer, "?");
    if (srv->stopping) {
        conn_close(c, "shutting down");
        return;
    }
    if (srv->n_conns > srv->p.max_connections) {
        char why[96];
        snprintf(why, sizeof why, "refused: %d connections already open", srv->n_conns - 1);
        conn_close(c, why);
        return;
    }
    /* a few handshakes at a time, each at most ~64 KiB until it authenticates
     * (docs/PROTOCOL.md): when the table is full, or this address holds its
     * share, the connection with the least progress makes room (logged at
     * 1, 2, 4, 8, ... evictions) */
    struct conn *v;
    while ((v = shoal_preauth_victim(&srv->preauth, c->peer)) != NULL) {
        const uint64_t k = ++srv->preauth.evicted;
        char why[160];
        snprintf(why, sizeof why, "evicted for a new connection: %d in their handshake "
                 "(%llu evicted so far)", srv->preauth.n, (unsigned long long)k);
        conn_close(v, (k & (k - 1)) == 0 ? why : NULL);
    }
    c->unauth = 1;
    uv_os_fd_t fd = -1;
    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) < 0)
        fd = -1;
    shoal_preauth_add(&srv->preauth, c, &c->hs, fd, c->peer);
    shoal_log(SHOAL_LOG_INFO, LOG_C, "accepted connection peer=%s", c->peer);
    conn_start(c);
}

/* ------------------------------------------------------------ --join */

static void on_connect(uv_connect_t *req, int status)
{
    struct conn *c = req->data;
    if (status < 0) {
        if (!c->handles_closed) {
            char why[160];
            snprintf(why, sizeof why, "cannot reach coordinator: %s; retrying in %.1f s",
                     uv_strerror(status), c->srv->dial_backoff_ms / 1000.0);
            conn_close(c, why);
        }
    } else if (!c->closing) {
        shoal_log(SHOAL_LOG_INFO, LOG_C, "connected to coordinator peer=%s", c->peer);
        conn_start(c);
    }
    conn_unref(c);
}

static void dial(uv_timer_t *t)
{
    struct shoal_worker_server *srv = t->data;
    if (srv->stopping || srv->join_conn)
        return;
    struct conn *c = conn_new(srv, 1);
    uv_tcp_init(&srv->loop, &c->tcp);
    snprintf(c->peer, sizeof c->peer, "%s", srv->p.join);
    srv->join_conn = c;
    /* the handshake deadline covers the connect too (an unroutable address
     * would otherwise wait for the kernel's connect timeout) */
    uv_timer_start(&c->timer, on_hs_timeout,
                   (uint64_t)(srv->p.handshake_timeout_s * 1000.0) + 1, 0);
    c->connect.data = c;
    conn_ref(c);
    int rc = uv_tcp_connect(&c->connect, &c->tcp, (const struct sockaddr *)&srv->join_addr,
                            on_connect);
    if (rc < 0) {
        conn_unref(c);
        char why[160];
        snprintf(why, sizeof why, "cannot dial coordinator: %s", uv_strerror(rc));
        conn_close(c, why);
    }
}

static void schedule_dial(struct shoal_worker_server *srv)
{
    if (srv->stopping || srv->draining || !srv->p.join)
        return;
    uint64_t ms = srv->dial_backoff_ms;
    srv->dial_backoff_ms = ms * 2 > DIAL_BACKOFF_MAX_MS ? DIAL_BACKOFF_MAX_MS : ms * 2;
    uv_timer_start(&srv->dial_timer, dial, ms, 0);
}

/* ------------------------------------------------------------ loop */

static void on_async(uv_async_t *a)
{
    struct shoal_worker_server *srv = a->data;
    struct shoal_worker_job *j = shoal_worker_exec_take_done(srv->exec);
    while (j) {
        struct shoal_worker_job *next = j->next;
        struct conn *c = j->owner;
        if (j->kind == SHOAL_WORKER_JOB_PART) {   /* its request, after it, holds c */
            conn_send(c, j->reply, j->reply_len);   /* frees it when c is closing */
            j->reply = NULL;
            shoal_worker_job_free(j);
            j = next;
            continue;
        }
        c->job_bytes -= j->frame_bytes;
        c->reply_bytes -= reply_bytes(j->total_rows, (uint64_t)srv->p.n_embd * sizeof(float));
        if (j->status < 0 && j->status != SHOAL_ECANCELED) {
            srv->errors++;
            c->errors++;
            /* the store's message (file, tensor, expert), as the reply
             * carries it: a damaged file is not the request's fault */
            shoal_log(SHOAL_LOG_WARN, LOG_C, "request %llu (layer %lld) from peer=%s failed: %s",
                      (unsigned long long)j->id, (long long)j->frame->request->layer,
                      conn_label(c), j->error ? j->error : shoal_strerror(j->status));
        }
        if (!c->closing && j->reply) {
            conn_send(c, j->reply, j->reply_len);
            j->reply = NULL;
        } else if (!c->closing && j->status != SHOAL_ECANCELED) {
            /* no reply could be packed (out of memory): say so briefly */
            char msg[96];
            snprintf(msg, sizeof msg, "request %llu failed: %s", (unsigned long long)j->id,
                     shoal_strerror(j->status < 0 ? j->status : SHOAL_ENOMEM));
            conn_send_error(c, j->id, j->status < 0 ? j->status : SHOAL_ENOMEM, msg);
        }
        conn_update_reading(c);
        shoal_worker_job_free(j);   /* first: the last unref may trim the heap */
        conn_unref(c);
        j = next;
    }
}

static void close_if_open(uv_handle_t *h)
{
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

static void shutdown_server(struct shoal_worker_server *srv, const char *why)
{
    if (srv->stopping)
        return;
    srv->stopping = 1;
    shoal_log(SHOAL_LOG_INFO, LOG_C, "%s: shutting down", why);
    close_if_open((uv_handle_t *)&srv->listener);
    close_if_open((uv_handle_t *)&srv->dial_timer);
    close_if_open((uv_handle_t *)&srv->drain_timer);
    /* the signal handles stay (unreferenced, so the loop can end): a
     * signal during the shutdown is handled, not fatal */
    while (srv->conns)
        conn_close(srv->conns, "worker shutting down");
    /* queued requests come back cancelled; the running one finishes */
    shoal_worker_exec_stop(srv->exec);
    on_async(&srv->async);
    close_if_open((uv_handle_t *)&srv->async);
}

#define DRAIN_MAX_S 10.0

/* Draining: every queued request has run and its reply is written, or
 * DRAIN_MAX_S passed. */
static void drain_check(uv_timer_t *t)
{
    struct shoal_worker_server *srv = t->data;
    int busy = shoal_worker_exec_queue_depth(srv->exec) > 0;
    for (struct conn *c = srv->conns; c && !busy; c = c->next)
        busy = c->write_bytes > 0 || c->job_bytes > 0;
    if (!busy)
        shutdown_server(srv, "drained");
    else if (shoal_time_s() - srv->drain_start > DRAIN_MAX_S)
        shutdown_server(srv, "drain timed out");
}

/* First SIGINT/SIGTERM: stop listening and dialling, tell each coordinator
 * (an unsolicited StatusReply with draining set, so it stops placing
 * experts here), answer new requests with an error so they move, and exit
 * once the queued ones are answered. A second signal exits at once. */
static void start_drain(struct shoal_worker_server *srv, const char *why)
{
    srv->draining = 1;
    srv->drain_start = shoal_time_s();
    shoal_log(SHOAL_LOG_INFO, LOG_C, "%s: draining (a second signal exits at once)", why);
    close_if_open((uv_handle_t *)&srv->listener);
    uv_timer_stop(&srv->dial_timer);
    for (struct conn *c = srv->conns; c; c = c->next)
        if (c->hs_done && c->peer_role == SHOAL__ROLE__ROLE_COORDINATOR) {
            Shoal__StatusRequest sr = SHOAL__STATUS_REQUEST__INIT;
            handle_status(c, &sr);
        }
    uv_timer_start(&srv->drain_timer, drain_check, 0, 50);
}

static void on_signal(uv_signal_t *s, int signum)
{
    struct shoal_worker_server *srv = s->data;
    const char *why = signum == SIGINT ? "SIGINT" : "SIGTERM";
    if (srv->draining || srv->stopping)
        shutdown_server(srv, why);
    else
        start_drain(srv, why);
}

struct shoal_worker_server *shoal_worker_server_create(const struct shoal_worker_server_params *p,
                                                       struct shoal_err *err)
{
    struct shoal_worker_server *srv = shoal_xcalloc(1, sizeof *srv);
    srv->p = *p;
    srv->dial_backoff_ms = DIAL_BACKOFF_MIN_MS;
    srv->t_start = shoal_time_s();
    int rc = uv_loop_init(&srv->loop);
    if (rc < 0) {
        shoal_err_set(err, SHOAL_EIO, "cannot start the event loop: %s", uv_strerror(rc));
        free(srv);
        return NULL;
    }
    srv->loop_init = 1;
    struct sockaddr_storage ss;
    socklen_t sl;
    if (shoal_wire_parse_addr(p->listen, &ss, &sl, err) < 0)
        goto fail;
    if (p->join) {
        if (shoal_wire_parse_addr(p->join, &srv->join_addr, &sl, err) < 0)
            goto fail;
    }
    uv_tcp_init(&srv->loop, &srv->listener);
    uv_async_init(&srv->loop, &srv->async, on_async);
    uv_signal_init(&srv->loop, &srv->sigint);
    uv_signal_init(&srv->loop, &srv->sigterm);
    uv_timer_init(&srv->loop, &srv->dial_timer);
    uv_timer_init(&srv->loop, &srv->drain_timer);
    srv->handles_init = 1;
    srv->drain_timer.data = srv;
    srv->listener.data = srv->async.data = srv->sigint.data = srv->sigterm.data = srv;
    srv->dial_timer.data = srv;
    srv->rbuf = shoal_xmalloc(READ_CHUNK);
    shoal_preauth_init(&srv->preauth, p->max_unauthenticated, p->max_unauth_per_ip);
    /* the handlers are in place before the worker says it listens (and
     * serves), and stay until destroy; unreferenced, they do not keep the
     * loop running. A signal before run is handled when run starts. */
    if ((rc = uv_signal_start(&srv->sigint, on_signal, SIGINT)) < 0 ||
        (rc = uv_signal_start(&srv->sigterm, on_signal, SIGTERM)) < 0) {
        shoal_err_set(err, SHOAL_EIO, "cannot handle signals: %s", uv_strerror(rc));
        goto fail;
    }
    uv_unref((uv_handle_t *)&srv->sigint);
    uv_unref((uv_handle_t *)&srv->sigterm);
    if ((rc = uv_tcp_bind(&srv->listener, (const struct sockaddr *)&ss, 0)) < 0 ||
        (rc = uv_listen((uv_stream_t *)&srv->listener, 128, on_connection)) < 0) {
        shoal_err_set(err, SHOAL_EIO, "cannot listen on %s: %s", p->listen, uv_strerror(rc));
        goto fail;
    }
    int len = sizeof ss;
    if (uv_tcp_getsockname(&srv->listener, (struct sockaddr *)&ss, &len) == 0)
        shoal_wire_addr_str((struct sockaddr *)&ss, srv->listen_addr, sizeof srv->listen_addr);
    else
        snprintf(srv->listen_addr, sizeof srv->listen_addr, "%s", p->listen);
    shoal_log(SHOAL_LOG_INFO, LOG_C, "listening on %s%s", srv->listen_addr,
              p->key->set ? " (cluster key: every peer must authenticate)"
                          : " (loopback only: no --cluster-key)");
    return srv;
fail:
    shoal_worker_server_destroy(srv);
    return NULL;
}

const char *shoal_worker_server_address(const struct shoal_worker_server *srv)
{
    return srv->listen_addr;
}

void shoal_worker_server_notify(void *server)
{
    struct shoal_worker_server *srv = server;
    uv_async_send(&srv->async);
}

int shoal_worker_server_run(struct shoal_worker_server *srv, struct shoal_worker_exec *exec,
                            struct shoal_err *err)
{
    (void)err;
    srv->exec = exec;
    if (srv->p.join) {
        shoal_log(SHOAL_LOG_INFO, LOG_C, "joining coordinator %s", srv->p.join);
        uv_timer_start(&srv->dial_timer, dial, 0, 0);
    }
    uv_run(&srv->loop, UV_RUN_DEFAULT);
    return 0;
}

static void walk_close(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

void shoal_worker_server_destroy(struct shoal_worker_server *srv)
{
    if (!srv)
        return;
    srv->exec = NULL;   /* the caller may have destroyed it already */
    if (srv->loop_init) {
        if (!srv->stopping && srv->handles_init) {
            srv->stopping = 1;
            while (srv->conns)
                conn_close(srv->conns, "worker shutting down");
        }
        uv_walk(&srv->loop, walk_close, NULL);
        uv_run(&srv->loop, UV_RUN_DEFAULT);
        if (uv_loop_close(&srv->loop) != 0)
            shoal_log(SHOAL_LOG_WARN, LOG_C, "event loop closed with handles still open");
    }
    free(srv->rbuf);
    shoal_preauth_free(&srv->preauth);
    free(srv);
}
