/* cluster_net: the loop thread's side of the cluster (see cluster.h and
 * cluster_impl.h): connections, handshakes, heartbeats, reconnects with
 * backoff, the control port's ClusterStatus, and the outbox the forward
 * thread posts frames to. create/destroy are in cluster.c, placement and
 * the layer step in cluster_sched.c. */
#include "cluster.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "cluster_impl.h"
#include "container.h"
#include "expert_store.h"
#include "log.h"
#include "util.h"

#define STATUS_EVERY_TICKS 1
#define BACKOFF_MIN_S 0.25
#define BACKOFF_MAX_S 5.0
#define READ_BUF_BYTES (256u << 10)
/* authenticated observers (`shoal status`) on the control port at once */
#define MAX_OBSERVERS 64
/* an observer whose unread replies pass this is closed */
#define OBSERVER_MAX_QUEUED (1u << 20)
/* an authenticated worker's frames while it owes no reply: status replies
 * (16.5 KiB at most), heartbeats and error replies */
#define WORKER_IDLE_MAX_FRAME (64u << 10)

enum conn_kind {
    CONN_DIAL = 0,       /* we dialled a static worker */
    CONN_WORKER_IN,      /* accepted on --accept-workers */
    CONN_CONTROL_IN,     /* accepted on the control port */
};

struct conn {
    uv_tcp_t tcp;
    uv_timer_t timer;              /* handshake deadline */
    uv_connect_t creq;
    struct shoal_cluster *cl;
    enum conn_kind kind;
    int exec;                      /* bound executor, or -1 */
    uint64_t gen;                  /* its generation once the handshake is done */
    struct shoal_handshake hs;
    int hs_started, hs_done;
    int observer;                  /* serves ClusterStatus */
    int unauth;                    /* in cl->preauth */
    struct shoal_frame_reader rd;
    char peer[128];                /* the address we dialled or the peer's socket address */
    int closing;
    int open_handles;
    struct conn *prev, *next;      /* cl->conns */
};

struct write_req {
    uv_write_t req;
    uint8_t *data;
    size_t len;
    int exec;
    struct shoal_cluster *cl;
};

double shoal_cluster_now(void)
{
    return shoal_time_s();
}

const char *shoal_cluster_state_name(const struct exec *x)
{
    if (x->faulty)
        return "faulty";
    switch (x->state) {
    case EXEC_UP: return "up";
    case EXEC_JOINING: return "joining";
    case EXEC_DRAINING: return "draining";
    default: return "down";
    }
}

uint64_t shoal_cluster_addr_seed(const char *addr)
{
    return XXH64(addr, strlen(addr), 0x73686f616cull);
}

/* ------------------------------------------------------------ writes */

static void on_write(uv_write_t *req, int status)
{
    struct write_req *w = (struct write_req *)req;
    struct shoal_cluster *cl = w->cl;
    pthread_mutex_lock(&cl->mu);
    if (w->exec >= 0) {
        struct exec *x = &cl->exec[w->exec];
        x->write_queue = x->write_queue >= w->len ? x->write_queue - w->len : 0;
        if (status == 0)
            x->bytes_sent += w->len;
    }
    pthread_mutex_unlock(&cl->mu);
    free(w->data);
    free(w);
}

/* Write len bytes (ownership of data moves here). A failed write closes the
 * connection through the read side's error; libuv keeps the order. */
static void conn_write(struct conn *c, uint8_t *data, size_t len)
{
    if (c->closing) {
        free(data);
        return;
    }
    struct shoal_cluster *cl = c->cl;
    struct write_req *w = shoal_xcalloc(1, sizeof *w);
    w->data = data;
    w->len = len;
    w->cl = cl;
    w->exec = c->hs_done && !c->observer ? c->exec : -1;
    if (w->exec >= 0) {
        pthread_mutex_lock(&cl->mu);
        cl->exec[w->exec].write_queue += len;
        pthread_mutex_unlock(&cl->mu);
    }
    uv_buf_t b = uv_buf_init((char *)data, (unsigned)len);
    int rc = uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, on_write);
    if (rc < 0) {
        shoal_log(SHOAL_LOG_WARN, "cluster", "peer=%s: write failed: %s", c->peer,
                  uv_strerror(rc));
        on_write(&w->req, rc);
    }
}

static void conn_write_frame(struct conn *c, const Shoal__Frame *f, uint32_t max_frame)
{
    struct shoal_err err = {0};
    size_t len;
    uint8_t *data = shoal_wire_pack(f, max_frame, &len, &err);
    if (!data) {
        shoal_log(SHOAL_LOG_WARN, "cluster", "peer=%s: %s", c->peer, err.msg);
        return;
    }
    conn_write(c, data, len);
}

/* ------------------------------------------------------------ connections */

static void conn_on_close(uv_handle_t *h)
{
    struct conn *c = h->data;
    if (--c->open_handles > 0)
        return;
    if (c->prev)
        c->prev->next = c->next;
    else
        c->cl->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    shoal_handshake_free(&c->hs);
    shoal_frame_reader_free(&c->rd);
    free(c);
}

static struct conn *conn_new(struct shoal_cluster *cl, enum conn_kind kind)
{
    struct conn *c = shoal_xcalloc(1, sizeof *c);
    c->cl = cl;
    c->kind = kind;
    c->exec = -1;
    /* until the peer has authenticated: handshake-sized frames only */
    shoal_frame_reader_init(&c->rd, SHOAL_WIRE_HANDSHAKE_MAX_FRAME);
    uv_tcp_init(&cl->loop, &c->tcp);
    uv_timer_init(&cl->loop, &c->timer);
    c->tcp.data = c;
    c->timer.data = c;
    c->open_handles = 2;
    c->next = cl->conns;
    if (cl->conns)
        cl->conns->prev = c;
    cl->conns = c;
    return c;
}

static void schedule_reconnect(struct shoal_cluster *cl, int xi)
{
    struct exec *x = &cl->exec[xi];
    if (cl->stopping || x->kind != EXEC_STATIC)
        return;
    double d = x->backoff_s > 0 ? x->backoff_s : BACKOFF_MIN_S;
    x->backoff_s = d * 2 > BACKOFF_MAX_S ? BACKOFF_MAX_S : d * 2;
    uv_timer_start(&x->reconnect, shoal_cluster_net_reconnect, (uint64_t)(d * 1000), 0);
}

void shoal_cluster_fail_pending_locked(struct shoal_cluster *cl, int x, uint64_t gen,
                                       const char *why)
{
    for (int i = 0; i < cl->n_pend; i++) {
        struct pending *p = &cl->pend[i];
        if (p->id && p->exec == x && p->gen == gen && p->state == PEND_SENT) {
            p->state = PEND_FAILED;
            snprintf(p->why, sizeof p->why, "%s", why);
        }
    }
    pthread_cond_broadcast(&cl->cond);
}

/* Close c (once). When it was an executor's connection the executor goes
 * down with why, its requests in flight fail, and a static worker is
 * redialled after its backoff. hard: a failure that retrying will not fix
 * (authentication, fingerprint), which resolves the start-up wait. */
static void conn_close(struct conn *c, const char *why, int hard)
{
    if (c->closing)
        return;
    c->closing = 1;
    struct shoal_cluster *cl = c->cl;
    if (c->unauth) {
        c->unauth = 0;
        shoal_preauth_remove(&cl->preauth, c);
    }
    if (c->observer && c->hs_done)
        cl->n_observers--;
    if (c->exec >= 0 && !c->observer && cl->exec[c->exec].conn == c) {
        struct exec *x = &cl->exec[c->exec];
        pthread_mutex_lock(&cl->mu);
        int was_up = x->state != EXEC_DOWN && c->hs_done;
        x->state = EXEC_DOWN;
        snprintf(x->last_error, sizeof x->last_error, "%s", why);
        if (hard)
            x->resolved = 1;
        x->conn = NULL;
        x->hb_sent_ns = 0;
        x->write_queue = 0;
        if (c->hs_done)
            shoal_cluster_fail_pending_locked(cl, c->exec, c->gen, why);
        pthread_cond_broadcast(&cl->cond);
        pthread_mutex_unlock(&cl->mu);
        if (was_up && !cl->stopping)
            shoal_log(SHOAL_LOG_WARN, "cluster", "worker %s is down: %s", x->addr, why);
        else if (!cl->stopping)
            shoal_log(SHOAL_LOG_DEBUG, "cluster", "worker %s: %s", x->addr, why);
        schedule_reconnect(cl, c->exec);
    } else if (!cl->stopping && c->kind == CONN_WORKER_IN && hard && !c->observer) {
        /* a joiner refused (key, model, room): a warning when the reason is
         * new (it re-dials every 2 s), and kept for a start that fails */
        char line[sizeof cl->join_refused];
        snprintf(line, sizeof line, "%s", why);   /* it names the peer */
        /* the same reason again (the peer's port changes each dial): quiet */
        const char *r_new = strstr(line, ": "), *r_old = strstr(cl->join_refused, ": ");
        pthread_mutex_lock(&cl->mu);
        const int fresh = !r_new || !r_old || strcmp(r_new, r_old) != 0;
        memcpy(cl->join_refused, line, sizeof line);
        pthread_mutex_unlock(&cl->mu);
        shoal_log(fresh ? SHOAL_LOG_WARN : SHOAL_LOG_DEBUG, "cluster",
                  "refused a joining worker: %s", line);
    } else if (!cl->stopping && c->kind != CONN_CONTROL_IN) {
        shoal_log(SHOAL_LOG_INFO, "cluster", "peer=%s: %s", c->peer, why);
    }
    uv_read_stop((uv_stream_t *)&c->tcp);
    uv_timer_stop(&c->timer);
    uv_close((uv_handle_t *)&c->tcp, conn_on_close);
    uv_close((uv_handle_t *)&c->timer, conn_on_close);
}

static void hs_timeout_cb(uv_timer_t *t)
{
    struct conn *c = t->data;
    if (c->hs_done)
        return;
    char why[200];
    snprintf(why, sizeof why, "handshake did not complete within %.1f s",
             c->cl->p.connect_timeout_s);
    conn_close(c, why, 1);
}

/* A worker whose machine or link is gone sends no reset: without this its
 * step would wait for --request-timeout. Bytes the coordinator sent (a
 * request, or the heartbeat it sends every second) that stay
 * unacknowledged this long drop the connection (TCP_USER_TIMEOUT on Linux,
 * TCP_RXT_CONNDROPTIME on macOS), and the step re-runs its experts on their
 * other holders. A busy worker still acknowledges (its kernel does), and a
 * slow link keeps acknowledging as it drains, so neither trips it. */
#define CLUSTER_LINK_TIMEOUT_MS 5000

static void set_link_timeout(struct shoal_cluster *cl, struct conn *c)
{
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) < 0)
        return;
    double ms = cl->p.request_timeout_s * 1e3;
    if (!(ms < CLUSTER_LINK_TIMEOUT_MS))
        ms = CLUSTER_LINK_TIMEOUT_MS;
    if (ms < 1000)
        ms = 1000;
#if defined(TCP_USER_TIMEOUT)
    unsigned int v = (unsigned int)ms;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &v, sizeof v);
#elif defined(TCP_RXT_CONNDROPTIME)
    int v = (int)ceil(ms / 1e3);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_RXT_CONNDROPTIME, &v, sizeof v);
#else
    (void)fd;
    (void)ms;
#endif
}

static void send_heartbeat(struct shoal_cluster *cl, int xi)
{
    struct exec *x = &cl->exec[xi];
    struct conn *c = x->conn;
    if (!c || !c->hs_done)
        return;
    Shoal__Frame f = SHOAL__FRAME__INIT;
    Shoal__Heartbeat hb = SHOAL__HEARTBEAT__INIT;
    x->hb_id++;
    x->hb_sent_ns = shoal_wire_now_ns();
    hb.id = x->hb_id;
    hb.sent_ns = x->hb_sent_ns;
    f.msg_case = SHOAL__FRAME__MSG_HEARTBEAT;
    f.heartbeat = &hb;
    conn_write_frame(c, &f, SHOAL_WIRE_MAX_FRAME_DEFAULT);
}

static void send_status_request(struct shoal_cluster *cl, int xi)
{
    struct conn *c = cl->exec[xi].conn;
    if (!c || !c->hs_done)
        return;
    Shoal__Frame f = SHOAL__FRAME__INIT;
    Shoal__StatusRequest sr = SHOAL__STATUS_REQUEST__INIT;
    sr.id = ++cl->status_seq | (1ull << 63);   /* never a request id */
    f.msg_case = SHOAL__FRAME__MSG_STATUS_REQUEST;
    f.status_request = &sr;
    conn_write_frame(c, &f, SHOAL_WIRE_MAX_FRAME_DEFAULT);
}

/* ------------------------------------------------------------ handshake done */

static int finite_nonneg(double v)
{
    return isfinite(v) && v >= 0 && v < 1e12;
}

/* Check a worker's PeerInfo against our model (DESIGN contract 3). */
static int check_worker_info(struct shoal_cluster *cl, const Shoal__PeerInfo *pi,
                             const char *peer, struct shoal_err *err)
{
    if ((int64_t)pi->n_layer != cl->n_layer || (int64_t)pi->n_expert != cl->n_expert ||
        (int64_t)pi->n_embd != cl->n_embd)
        return shoal_err_set(err, SHOAL_EINVAL,
                             "%s: serves n_layer %u, n_expert %u, n_embd %u; expected %lld, "
                             "%lld, %lld", peer, pi->n_layer, pi->n_expert, pi->n_embd,
                             (long long)cl->n_layer, (long long)cl->n_expert,
                             (long long)cl->n_embd);
    if (!finite_nonneg(pi->disk_mbps) || !finite_nonneg(pi->compute_gbps))
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "%s: disk_mbps %g / compute_gbps %g are not finite "
                             "non-negative rates", peer, pi->disk_mbps, pi->compute_gbps);
    size_t need = (size_t)((cl->n_layer * cl->n_expert + 7) / 8);
    if (pi->coverage.len != need)
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "%s: coverage bitmap of %zu bytes, expected %zu (n_layer %lld x "
                             "n_expert %lld bits)", peer, pi->coverage.len, need,
                             (long long)cl->n_layer, (long long)cl->n_expert);
    if (pi->max_frame != 0 && pi->max_frame < 4096)
        return shoal_err_set(err, SHOAL_EFORMAT, "%s: max_frame %" PRIu64 " is below 4096",
                             peer, pi->max_frame);
    return 0;
}

static int name_ok(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n >= 120)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] <= ' ' || s[i] > '~')
            return 0;
    return 1;
}

/* The executor index for a joining worker named name: its old index, or a
 * new one. -1 when it is connected already or the table is full. */
static int joiner_index(struct shoal_cluster *cl, const char *name)
{
    for (int i = 0; i < cl->n_exec; i++)
        if (cl->exec[i].kind != EXEC_LOCAL && !strcmp(cl->exec[i].addr, name))
            return cl->exec[i].conn ? -1 : i;
    if (cl->n_exec >= SHOAL_CLUSTER_MAX_EXECUTORS)
        return -1;
    int i = cl->n_exec;
    struct exec *x = &cl->exec[i];
    memset(x, 0, sizeof *x);
    size_t n = strlen(name) < sizeof x->addr - 1 ? strlen(name) : sizeof x->addr - 1;
    memcpy(x->addr, name, n);
    x->addr[n] = 0;
    x->kind = EXEC_JOINED;
    x->seed = shoal_cluster_addr_seed(x->addr);
    x->assigned = shoal_xcalloc((size_t)(cl->n_layer * cl->n_expert), 1);
    pthread_mutex_lock(&cl->mu);
    cl->n_exec++;
    pthread_mutex_unlock(&cl->mu);
    return i;
}

/* An ErrorReply (id 0) written now, best effort, before a close. */
static void try_send_error(struct conn *c, int code, const char *msg)
{
    struct shoal_wire_error e;
    shoal_wire_error_init(&e, 0, code, msg);
    size_t len;
    uint8_t *b = shoal_wire_pack(&e.frame, SHOAL_WIRE_MAX_FRAME_DEFAULT, &len, NULL);
    if (b) {
        uv_buf_t buf = uv_buf_init((char *)b, (unsigned)len);
        (void)uv_try_write((uv_stream_t *)&c->tcp, &buf, 1);
        free(b);
    }
}

static void refuse(struct conn *c, int code, const char *msg)
{
    try_send_error(c, code, msg);
    conn_close(c, msg, 1);
}

/* Handshake hook of an accepted connection, before Ready: the role its
 * port serves, and the observer cap. */
static int admit_peer(void *user, Shoal__Role role, char *msg, size_t n)
{
    struct conn *c = user;
    if (c->kind == CONN_CONTROL_IN && role != SHOAL__ROLE__ROLE_OBSERVER) {
        snprintf(msg, n, "the control port serves observers (shoal status) only; "
                 "workers join on --accept-workers");
        return -1;
    }
    if (c->kind == CONN_WORKER_IN && role == SHOAL__ROLE__ROLE_COORDINATOR) {
        snprintf(msg, n, "this port accepts workers and observers, not a coordinator");
        return -1;
    }
    if (role == SHOAL__ROLE__ROLE_OBSERVER && c->cl->n_observers >= MAX_OBSERVERS) {
        snprintf(msg, n, "%d observers are connected, the most a coordinator serves at "
                 "once; try again later", c->cl->n_observers);
        return -1;
    }
    return 0;
}

/* The largest frame an authenticated worker may send now: a status reply
 * or a heartbeat, or the largest reply among the requests it owes, so a
 * worker cannot make the coordinator buffer more than it asked for. */
static uint32_t worker_frame_limit(struct conn *c)
{
    struct shoal_cluster *cl = c->cl;
    uint64_t owed = 0;
    pthread_mutex_lock(&cl->mu);
    for (int i = 0; i < cl->n_pend; i++) {
        const struct pending *p = &cl->pend[i];
        if (p->id && p->exec == c->exec && p->gen == c->gen && p->state == PEND_SENT &&
            p->reply_bytes > owed)
            owed = p->reply_bytes;
    }
    pthread_mutex_unlock(&cl->mu);
    uint64_t lim = WORKER_IDLE_MAX_FRAME + owed;
    return lim < SHOAL_WIRE_MAX_FRAME_DEFAULT ? (uint32_t)lim : SHOAL_WIRE_MAX_FRAME_DEFAULT;
}

static void handshake_done(struct conn *c)
{
    struct shoal_cluster *cl = c->cl;
    const Shoal__PeerInfo *pi = c->hs.peer_info;
    uv_timer_stop(&c->timer);
    if (c->unauth) {
        c->unauth = 0;
        shoal_preauth_remove(&cl->preauth, c);
    }
    if (c->hs.peer_role == SHOAL__ROLE__ROLE_OBSERVER) {
        if (c->kind == CONN_DIAL) {
            refuse(c, SHOAL_EINVAL, "expected a worker, the peer is an observer");
            return;
        }
        if (cl->n_observers >= MAX_OBSERVERS) {
            refuse(c, SHOAL_EINVAL, "too many observers connected; try again later");
            return;
        }
        /* its frames stay handshake-sized: status requests and heartbeats */
        c->observer = 1;
        c->hs_done = 1;
        cl->n_observers++;
        return;
    }
    if (c->kind == CONN_CONTROL_IN) {
        refuse(c, SHOAL_EINVAL, "the control port serves observers (shoal status) only; "
                                "workers join on --accept-workers");
        return;
    }
    struct shoal_err err = {0};
    char peer[160];
    snprintf(peer, sizeof peer, "worker %s", c->kind == CONN_DIAL ? cl->exec[c->exec].addr
                                                                   : c->peer);
    if (check_worker_info(cl, pi, peer, &err)) {
        refuse(c, err.code, err.msg);
        return;
    }
    if (c->kind == CONN_WORKER_IN) {
        const char *name = name_ok(pi->name) ? pi->name : c->peer;
        int i = joiner_index(cl, name);
        if (i < 0 && name != c->peer)
            i = joiner_index(cl, c->peer);
        if (i < 0) {
            refuse(c, SHOAL_EINVAL, "no room for another executor or already connected");
            return;
        }
        c->exec = i;
        cl->exec[i].conn = c;
    }
    struct exec *x = &cl->exec[c->exec];
    /* a new bitmap, swapped in under the lock: the forward thread reads it */
    uint8_t *holds = shoal_xcalloc((size_t)(cl->n_layer * cl->n_expert), 1);
    uint32_t held = 0;
    for (int64_t il = 0; il < cl->n_layer; il++)
        for (int64_t ie = 0; ie < cl->n_expert; ie++) {
            int h = cl->is_moe[il] && shoal_wire_covers(pi->coverage.data, pi->coverage.len,
                                                        cl->n_expert, il, ie);
            held += (uint32_t)h;
            holds[il * cl->n_expert + ie] = (uint8_t)h;
        }
    pthread_mutex_lock(&cl->mu);
    int again = x->gen > 0;
    uint8_t *old = x->holds;
    x->holds = holds;
    x->experts_held = held;
    x->disk_mbps = pi->disk_mbps;
    x->bytes_read = 0;             /* a new process: its counters start again */
    x->read_busy_seconds = 0;
    x->compute_gbps = pi->compute_gbps;
    x->cache_bytes = pi->cache_bytes ? pi->cache_bytes : UINT64_MAX;
    x->max_frame = pi->max_frame == 0 || pi->max_frame > SHOAL_WIRE_MAX_FRAME_DEFAULT
                       ? SHOAL_WIRE_MAX_FRAME_DEFAULT : (uint32_t)pi->max_frame;
    x->gen++;
    c->gen = x->gen;
    x->state = x->kind == EXEC_JOINED ? EXEC_JOINING : EXEC_UP;
    x->resolved = 1;
    x->last_error[0] = 0;    /* up: no error stands (the log keeps the history) */
    x->last_seen_ns = shoal_wire_now_ns();
    x->backoff_s = 0;
    x->hb_sent_ns = 0;
    if (again)
        x->reconnects++;
    x->reset_assigned = 1;   /* placement's cache model: it starts empty */
    pthread_cond_broadcast(&cl->cond);
    pthread_mutex_unlock(&cl->mu);
    free(old);
    c->hs_done = 1;
    c->rd.max_frame = WORKER_IDLE_MAX_FRAME;   /* until it owes a reply (read_cb) */
    set_link_timeout(cl, c);
    shoal_log(again ? SHOAL_LOG_WARN : SHOAL_LOG_INFO, "cluster",
              "worker %s is %s: %u of %lld experts, disk %.0f MB/s, compute %.1f GB/s",
              x->addr, again ? "back" : (x->kind == EXEC_JOINED ? "joining" : "up"), held,
              (long long)(cl->n_layer_moe * cl->n_expert), pi->disk_mbps, pi->compute_gbps);
    send_heartbeat(cl, c->exec);
    send_status_request(cl, c->exec);
}

/* ------------------------------------------------------------ frames */

static void build_status(struct shoal_cluster *cl, uint64_t id, struct conn *c);

/* A response frame f for pending request p (cl->mu held): a valid part
 * (`more`) is appended to p->part (the whole answer's size) and freed,
 * returning 1; the last frame's outputs complete p->part, which becomes its
 * out, returning 0 (f goes to the forward thread, whose checks see any
 * mismatch). An invalid part returns
 * 0 too: shoal_wire_check_response rejects `more`, and the worker is
 * marked down for a protocol error. */
static int take_part(struct shoal_cluster *cl, struct pending *p, Shoal__Frame *f)
{
    Shoal__ExpertResponse *rs = f->response;
    if (rs->more) {
        struct shoal_err e = {0};
        if (shoal_wire_check_response_part(rs, p->part_len, p->total_rows, cl->n_embd,
                                           p->parts_left, &e) < 0) {
            char msg[300];
            shoal_log(SHOAL_LOG_WARN, "cluster", "worker %s: %s", cl->exec[p->exec].addr,
                      shoal_wire_printable(msg, sizeof msg, e.msg));
            return 0;
        }
        if (!p->part)   /* the whole answer's size, which this request set */
            p->part = shoal_xmalloc((size_t)(p->total_rows * (uint64_t)cl->n_embd * 4u));
        memcpy(p->part + p->part_len, rs->out.data, rs->out.len);
        p->part_len += rs->out.len;
        p->parts_left--;
        shoal_wire_frame_free(f);
        return 1;
    }
    if (p->part_len > 0) {
        /* the last frame completes the buffer the parts went into, or the
         * answer is short or long: out then holds none of it, and the
         * forward thread's size check fails it */
        const uint64_t left = p->total_rows * (uint64_t)cl->n_embd * 4u - p->part_len;
        if (rs->out.len == left) {
            if (left)
                memcpy(p->part + p->part_len, rs->out.data, rs->out.len);
            free(rs->out.data);   /* protobuf-c's, from malloc (wire_unpack.c) */
            rs->out.data = p->part;
            rs->out.len = (size_t)(p->part_len + left);
            p->part = NULL;
        } else {
            shoal_log(SHOAL_LOG_WARN, "cluster", "worker %s: response %llu: a last part of "
                      "%zu bytes after %llu, expected %llu", cl->exec[p->exec].addr,
                      (unsigned long long)rs->id, rs->out.len,
                      (unsigned long long)p->part_len, (unsigned long long)left);
            rs->out.len = 0;
        }
    }
    free(p->part);
    p->part = NULL;
    p->part_len = 0;
    return 0;
}

static void on_worker_frame(struct conn *c, Shoal__Frame *f)
{
    struct shoal_cluster *cl = c->cl;
    struct exec *x = &cl->exec[c->exec];
    uint64_t now = shoal_wire_now_ns();
    pthread_mutex_lock(&cl->mu);
    x->last_seen_ns = now;
    pthread_mutex_unlock(&cl->mu);
    switch (f->msg_case) {
    case SHOAL__FRAME__MSG_RESPONSE:
    case SHOAL__FRAME__MSG_ERROR: {
        uint64_t id = f->msg_case == SHOAL__FRAME__MSG_RESPONSE ? f->response->id
                                                                : f->error->id;
        if (f->msg_case == SHOAL__FRAME__MSG_ERROR && id == 0) {
            char msg[300];
            shoal_log(SHOAL_LOG_WARN, "cluster", "worker %s: error: %s", x->addr,
                      shoal_wire_printable(msg, sizeof msg, f->error->message));
            break;
        }
        int taken = 0;
        pthread_mutex_lock(&cl->mu);
        for (int i = 0; i < cl->n_pend; i++) {
            struct pending *p = &cl->pend[i];
            if (p->id == id && p->exec == c->exec && p->gen == c->gen &&
                p->state == PEND_SENT) {
                if (f->msg_case == SHOAL__FRAME__MSG_RESPONSE && take_part(cl, p, f)) {
                    pthread_mutex_unlock(&cl->mu);
                    return;
                }
                p->state = PEND_DONE;
                p->frame = f;
                p->recv_ns = now;
                taken = 1;
                pthread_cond_broadcast(&cl->cond);
                break;
            }
        }
        pthread_mutex_unlock(&cl->mu);
        if (taken)
            return;   /* the forward thread frees it */
        /* a late reply to an abandoned request: discarded by id */
        shoal_log(SHOAL_LOG_DEBUG, "cluster", "worker %s: late reply %" PRIu64 " discarded",
                  x->addr, id);
        break;
    }
    case SHOAL__FRAME__MSG_HEARTBEAT:
        if (f->heartbeat->reply) {
            if (f->heartbeat->id == x->hb_id && x->hb_sent_ns) {
                pthread_mutex_lock(&cl->mu);
                x->rtt_ms = (double)(now - x->hb_sent_ns) / 1e6;
                x->hb_sent_ns = 0;
                if (x->state == EXEC_JOINING) {
                    x->state = EXEC_UP;
                    pthread_cond_broadcast(&cl->cond);
                }
                pthread_mutex_unlock(&cl->mu);
            }
        } else {
            Shoal__Frame r = SHOAL__FRAME__INIT;
            Shoal__Heartbeat hb = *f->heartbeat;
            hb.reply = 1;
            r.msg_case = SHOAL__FRAME__MSG_HEARTBEAT;
            r.heartbeat = &hb;
            conn_write_frame(c, &r, x->max_frame);
        }
        break;
    case SHOAL__FRAME__MSG_STATUS: {
        const Shoal__StatusReply *s = f->status;
        pthread_mutex_lock(&cl->mu);
        x->cache_used = s->cache_used;
        x->cache_limit = s->cache_limit;
        x->hits = s->hits;
        x->misses = s->misses;
        const double busy = finite_nonneg(s->read_busy_seconds) ? s->read_busy_seconds : 0;
        /* disk bandwidth as the worker's reads achieved it (bytes per
         * second with reads in flight): the ratio of decayed sums over the
         * replies (about the last ten), so a reply window that ends inside
         * a read (bytes count when a read ends, busy time while it runs)
         * does not swing it: with 25 MB experts at 150 MB/s a 2 s window
         * held 5-7 reads, and per-window estimates averaged in halves put
         * equal disks 10-20 % apart, enough to skew placement among holders */
        if (!x->seen_from_answers && s->bytes_read >= x->bytes_read &&
            busy > x->read_busy_seconds)
            shoal_cluster_note_disk(x, (double)(s->bytes_read - x->bytes_read),
                                    busy - x->read_busy_seconds);
        x->bytes_read = s->bytes_read;
        x->read_busy_seconds = busy;
        if (s->draining && x->state != EXEC_DRAINING && x->state != EXEC_DOWN) {
            x->state = EXEC_DRAINING;
            shoal_log(SHOAL_LOG_WARN, "cluster", "worker %s is draining (shutting down): "
                      "no new experts go there", x->addr);
        }
        x->queue_depth = s->queue_depth;
        pthread_mutex_unlock(&cl->mu);
        break;
    }
    default: {
        char why[160];
        snprintf(why, sizeof why, "protocol error: unexpected %s frame from a worker",
                 shoal_wire_frame_name(f));
        shoal_wire_frame_free(f);
        conn_close(c, why, 0);
        return;
    }
    }
    shoal_wire_frame_free(f);
}

static void on_observer_frame(struct conn *c, Shoal__Frame *f)
{
    if (c->tcp.write_queue_size > OBSERVER_MAX_QUEUED) {
        /* it asks and does not read: its replies would pile up here */
        shoal_wire_frame_free(f);
        conn_close(c, "observer does not read its replies", 0);
        return;
    }
    switch (f->msg_case) {
    case SHOAL__FRAME__MSG_STATUS_REQUEST:
        build_status(c->cl, f->status_request->id, c);
        break;
    case SHOAL__FRAME__MSG_HEARTBEAT:
        if (!f->heartbeat->reply) {
            Shoal__Frame r = SHOAL__FRAME__INIT;
            Shoal__Heartbeat hb = *f->heartbeat;
            hb.reply = 1;
            r.msg_case = SHOAL__FRAME__MSG_HEARTBEAT;
            r.heartbeat = &hb;
            conn_write_frame(c, &r, SHOAL_WIRE_MAX_FRAME_DEFAULT);
        }
        break;
    default: {
        char msg[120];
        snprintf(msg, sizeof msg, "unexpected %s frame on the control port",
                 shoal_wire_frame_name(f));
        struct shoal_wire_error e;
        shoal_wire_error_init(&e, 0, SHOAL_EFORMAT, msg);
        conn_write_frame(c, &e.frame, SHOAL_WIRE_MAX_FRAME_DEFAULT);
        break;
    }
    }
    shoal_wire_frame_free(f);
}

static int on_frame(void *user, const uint8_t *body, size_t len)
{
    struct conn *c = user;
    struct shoal_err err = {0};
    Shoal__Frame *f = shoal_wire_unpack(body, len, &err);
    if (!f && c->hs_done && c->observer) {
        /* the length prefix kept the stream in sync: say why and go on
         * (docs/PROTOCOL.md); a worker that sends garbage is closed below */
        struct shoal_wire_error e;
        shoal_wire_error_init(&e, 0, SHOAL_EFORMAT, err.msg);
        conn_write_frame(c, &e.frame, SHOAL_WIRE_MAX_FRAME_DEFAULT);
        return 0;
    }
    if (!f) {
        char why[SHOAL_ERR_MSG_MAX + 32];
        snprintf(why, sizeof why, "protocol error: %s", err.msg);
        try_send_error(c, err.code ? err.code : SHOAL_EFORMAT, err.msg);
        conn_close(c, why, !c->hs_done);
        return 1;
    }
    if (!c->hs_done) {
        struct shoal_wire_buf out = {0};
        int rc = shoal_handshake_on_frame(&c->hs, f, &out, &err);
        if (rc == 1)
            shoal_handshake_adopt(&c->hs, f);
        else
            shoal_wire_frame_free(f);
        if (out.len) {
            if (rc < 0) {
                uv_buf_t b = uv_buf_init((char *)out.data, (unsigned)out.len);
                (void)uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
                shoal_wire_buf_free(&out);
            } else {
                conn_write(c, out.data, out.len);
            }
        }
        if (rc < 0) {
            conn_close(c, err.msg, 1);
            return 1;
        }
        if (rc == 1)
            handshake_done(c);
        return c->closing ? 1 : 0;
    }
    if (c->observer)
        on_observer_frame(c, f);
    else
        on_worker_frame(c, f);
    return c->closing ? 1 : 0;
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    struct conn *c = h->data;
    /* the loop reads one socket at a time and the frame reader copies what
     * it keeps: one buffer serves every connection */
    if (!c->cl->rbuf)
        c->cl->rbuf = shoal_xmalloc(READ_BUF_BYTES);
    *buf = uv_buf_init((char *)c->cl->rbuf, READ_BUF_BYTES);
}

static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct conn *c = s->data;
    if (nread == 0 || c->closing)
        return;
    if (nread < 0) {
        char why[160];
        if (nread == UV_EOF)
            snprintf(why, sizeof why, "connection closed by the peer");
        else
            snprintf(why, sizeof why, "connection lost: %s", uv_strerror((int)nread));
        conn_close(c, why, 0);
        return;
    }
    struct shoal_cluster *cl = c->cl;
    if (c->hs_done && !c->observer && c->exec >= 0) {
        pthread_mutex_lock(&cl->mu);
        cl->exec[c->exec].bytes_received += (uint64_t)nread;
        pthread_mutex_unlock(&cl->mu);
    }
    if (c->hs_done && !c->observer && c->exec >= 0)
        c->rd.max_frame = worker_frame_limit(c);
    struct shoal_err err = {0};
    int rc = shoal_frame_reader_feed(&c->rd, (const uint8_t *)buf->base, (size_t)nread,
                                     on_frame, c, &err);
    if (rc < 0 && !c->closing) {
        /* a broken length prefix: tell the peer why before closing */
        try_send_error(c, rc, err.msg);
        char why[SHOAL_ERR_MSG_MAX + 32];
        snprintf(why, sizeof why, "protocol error: %s", err.msg);
        conn_close(c, why, !c->hs_done);
    }
}

static void start_handshake(struct conn *c, int connector)
{
    struct shoal_cluster *cl = c->cl;
    shoal_handshake_init(&c->hs, connector, SHOAL__ROLE__ROLE_COORDINATOR, &cl->key, &cl->info,
                         cl->fingerprint, c->peer);
    if (!connector) {
        c->hs.admit = admit_peer;
        c->hs.admit_user = c;
    }
    c->hs_started = 1;
    int rc = uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb);
    if (rc < 0) {
        char why[160];
        snprintf(why, sizeof why, "cannot read: %s", uv_strerror(rc));
        conn_close(c, why, 0);
        return;
    }
    if (connector) {
        struct shoal_wire_buf out = {0};
        struct shoal_err err = {0};
        if (shoal_handshake_start(&c->hs, &out, &err) < 0) {
            shoal_wire_buf_free(&out);
            conn_close(c, err.msg, 1);
            return;
        }
        conn_write(c, out.data, out.len);
    }
}

static void on_connect(uv_connect_t *req, int status)
{
    struct conn *c = req->data;
    if (c->closing)
        return;
    if (status < 0) {
        char why[160];
        snprintf(why, sizeof why, "cannot connect: %s", uv_strerror(status));
        conn_close(c, why, 0);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    struct shoal_cluster *cl = c->cl;
    pthread_mutex_lock(&cl->mu);
    snprintf(cl->exec[c->exec].last_error, sizeof cl->exec[c->exec].last_error,
             "connected, but the handshake did not complete");
    pthread_mutex_unlock(&cl->mu);
    start_handshake(c, 1);
}

void shoal_cluster_net_dial(struct shoal_cluster *cl, int xi)
{
    struct exec *x = &cl->exec[xi];
    if (x->conn || cl->stopping)
        return;
    struct conn *c = conn_new(cl, CONN_DIAL);
    c->exec = xi;
    snprintf(c->peer, sizeof c->peer, "%s", x->addr);
    x->conn = c;
    c->creq.data = c;
    uv_timer_start(&c->timer, hs_timeout_cb, (uint64_t)(cl->p.connect_timeout_s * 1000), 0);
    int rc = uv_tcp_connect(&c->creq, &c->tcp, (const struct sockaddr *)&x->ss, on_connect);
    if (rc < 0) {
        char why[160];
        snprintf(why, sizeof why, "cannot connect: %s", uv_strerror(rc));
        conn_close(c, why, 0);
    }
}

void shoal_cluster_net_reconnect(uv_timer_t *t)
{
    struct exec *x = t->data;
    struct shoal_cluster *cl = t->loop->data;
    shoal_cluster_net_dial(cl, (int)(x - cl->exec));
}

void shoal_cluster_net_on_incoming(uv_stream_t *srv, int status)
{
    struct shoal_cluster *cl = srv->data;
    if (status < 0) {
        shoal_log(SHOAL_LOG_WARN, "cluster", "accept failed: %s", uv_strerror(status));
        return;
    }
    struct conn *c = conn_new(cl, srv == (uv_stream_t *)&cl->control_srv ? CONN_CONTROL_IN
                                                                         : CONN_WORKER_IN);
    if (uv_accept(srv, (uv_stream_t *)&c->tcp) < 0) {
        conn_close(c, "accept failed", 0);
        return;
    }
    struct sockaddr_storage ss;
    int len = sizeof ss;
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) == 0)
        shoal_wire_addr_str((struct sockaddr *)&ss, c->peer, sizeof c->peer);
    else
        snprintf(c->peer, sizeof c->peer, "?");
    /* the table full, or this address at its share: the connection with the
     * least progress makes room (logged at 1, 2, 4, 8, ... evictions) */
    struct conn *v;
    while ((v = shoal_preauth_victim(&cl->preauth, c->peer)) != NULL) {
        const uint64_t k = ++cl->preauth.evicted;
        if ((k & (k - 1)) == 0)
            shoal_log(SHOAL_LOG_WARN, "cluster", "peer=%s evicted for peer=%s: %d connections "
                      "in their handshake (%llu evicted so far)", v->peer, c->peer,
                      cl->preauth.n, (unsigned long long)k);
        conn_close(v, "evicted for a new connection", 0);
    }
    c->unauth = 1;
    uv_os_fd_t fd = -1;
    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) < 0)
        fd = -1;
    shoal_preauth_add(&cl->preauth, c, &c->hs, fd, c->peer);
    uv_tcp_nodelay(&c->tcp, 1);
    uv_timer_start(&c->timer, hs_timeout_cb, (uint64_t)(cl->p.connect_timeout_s * 1000), 0);
    start_handshake(c, 0);
}

/* ------------------------------------------------------------ status */

static void build_status(struct shoal_cluster *cl, uint64_t id, struct conn *c)
{
    Shoal__ClusterStatus cs = SHOAL__CLUSTER_STATUS__INIT;
    Shoal__ExecutorStatus es[SHOAL_CLUSTER_MAX_EXECUTORS];
    Shoal__ExecutorStatus *esp[SHOAL_CLUSTER_MAX_EXECUTORS];
    struct shoal_expert_store_stats st;
    const struct shoal_model *m = cl->model;
    if (cl->local >= 0)
        shoal_expert_store_stats_get(m->store, &st);
    uint64_t now = shoal_wire_now_ns();
    pthread_mutex_lock(&cl->mu);
    cs.id = id;
    cs.fingerprint = cl->fingerprint;
    uint32_t total = (uint32_t)(cl->n_layer_moe * cl->n_expert);
    uint64_t sent = 0, recv = 0;
    for (int i = 0; i < cl->n_exec; i++) {
        struct exec *x = &cl->exec[i];
        Shoal__ExecutorStatus *e = &es[i];
        shoal__executor_status__init(e);
        esp[i] = e;
        e->address = x->addr;
        e->experts_total = total;
        e->experts_held = x->experts_held;
        e->requests = x->requests;
        e->errors = x->errors;
        e->reconnects = x->reconnects;
        e->last_error = x->last_error;
        e->queue_depth = x->in_flight;
        if (x->kind == EXEC_LOCAL) {
            e->state = (char *)"up";
            uint64_t hits = st.pinned_hits + st.cache_hits + st.inflight_hits;
            uint64_t acq = hits + st.disk_reads;
            e->cache_used = st.cached_bytes + st.pinned_bytes;
            e->cache_limit = cl->p.local_cache_bytes;
            e->hit_rate = acq ? (double)hits / (double)acq : 0.0;
            e->disk_mbps = st.read_busy_seconds > 0
                               ? (double)st.bytes_read / 1e6 / st.read_busy_seconds : 0.0;
            e->last_seen_seconds = 0;
            continue;
        }
        e->state = (char *)shoal_cluster_state_name(x);
        e->cache_used = x->cache_used;
        e->cache_limit = x->cache_limit ? x->cache_limit : x->cache_bytes;
        uint64_t acq = x->hits + x->misses;
        e->hit_rate = acq ? (double)x->hits / (double)acq : 0.0;
        e->disk_mbps = x->read_busy_seconds > 0
                           ? (double)x->bytes_read / 1e6 / x->read_busy_seconds
                           : x->disk_mbps;
        e->rtt_ms = x->rtt_ms;
        e->last_seen_seconds = x->last_seen_ns ? (double)(now - x->last_seen_ns) / 1e9 : -1;
        sent += x->bytes_sent;
        recv += x->bytes_received;
    }
    cs.n_executors = (size_t)cl->n_exec;
    cs.executors = esp;
    cs.tokens = cl->tokens;
    double tok = cl->tokens ? (double)cl->tokens : 1.0;
    double dsum = 0, dn = 0;
    for (int i = 0; i < cl->n_decode; i++) {
        dsum += cl->decode_s[i];
        dn += (double)cl->decode_n[i];
    }
    cs.tok_per_s = dsum > 0 ? dn / dsum : 0.0;
    cs.attention_s = cl->t.attention / tok;
    cs.routing_s = cl->t.routing / tok;
    cs.expert_wait_s = cl->t.expert_wait / tok;
    cs.network_s = cl->t.network / tok;
    cs.combine_s = cl->t.combine / tok;
    double other = cl->t.experts - cl->t.expert_wait + cl->t.head;
    cs.other_s = (other > 0 ? other : 0) / tok;
    cs.uptime_seconds = shoal_cluster_now() - cl->t_start;
    cs.wire_bytes_sent = sent;
    cs.wire_bytes_received = recv;
    Shoal__Frame f = SHOAL__FRAME__INIT;
    f.msg_case = SHOAL__FRAME__MSG_CLUSTER;
    f.cluster = &cs;
    struct shoal_err err = {0};
    size_t len;
    uint8_t *data = shoal_wire_pack(&f, SHOAL_WIRE_MAX_FRAME_DEFAULT, &len, &err);
    pthread_mutex_unlock(&cl->mu);
    if (!data) {
        shoal_log(SHOAL_LOG_WARN, "cluster", "status: %s", err.msg);
        return;
    }
    conn_write(c, data, len);
}

/* ------------------------------------------------------------ loop */

void shoal_cluster_net_tick(uv_timer_t *t)
{
    struct shoal_cluster *cl = t->data;
    uint64_t now = shoal_wire_now_ns();
    uint64_t hb_timeout = (uint64_t)(cl->p.request_timeout_s * 1e9);
    if (hb_timeout < 3000000000ull)
        hb_timeout = 3000000000ull;
    cl->tick_count++;
    for (int i = 0; i < cl->n_exec; i++) {
        struct exec *x = &cl->exec[i];
        if (!x->conn || !x->conn->hs_done)
            continue;
        if (x->hb_sent_ns && now - x->hb_sent_ns > hb_timeout) {
            char why[120];
            snprintf(why, sizeof why, "no heartbeat reply for %.1f s",
                     (double)(now - x->hb_sent_ns) / 1e9);
            conn_close(x->conn, why, 0);
            continue;
        }
        if (!x->hb_sent_ns)
            send_heartbeat(cl, i);
        if (cl->tick_count % STATUS_EVERY_TICKS == 0)
            send_status_request(cl, i);
    }
}

void shoal_cluster_net_stop_all(struct shoal_cluster *cl)
{
    for (struct conn *c = cl->conns; c; c = c->next)
        conn_close(c, "coordinator shutting down", 0);
    for (int i = 0; i < cl->n_exec; i++)
        if (cl->exec[i].reconnect_init && !uv_is_closing((uv_handle_t *)&cl->exec[i].reconnect))
            uv_close((uv_handle_t *)&cl->exec[i].reconnect, NULL);
    if (cl->have_accept && !uv_is_closing((uv_handle_t *)&cl->accept_srv))
        uv_close((uv_handle_t *)&cl->accept_srv, NULL);
    if (cl->have_control && !uv_is_closing((uv_handle_t *)&cl->control_srv))
        uv_close((uv_handle_t *)&cl->control_srv, NULL);
    if (!uv_is_closing((uv_handle_t *)&cl->tick))
        uv_close((uv_handle_t *)&cl->tick, NULL);
    if (!uv_is_closing((uv_handle_t *)&cl->async))
        uv_close((uv_handle_t *)&cl->async, NULL);
}

void shoal_cluster_net_async(uv_async_t *a)
{
    struct shoal_cluster *cl = a->data;
    pthread_mutex_lock(&cl->mu);
    struct out_msg *m = cl->out_head;
    cl->out_head = cl->out_tail = NULL;
    int stopping = cl->stopping;
    pthread_mutex_unlock(&cl->mu);
    while (m) {
        struct out_msg *next = m->next;
        struct exec *x = &cl->exec[m->exec];
        struct conn *c = x->conn;
        int live = c && c->hs_done && !c->closing && c->gen == m->gen;
        if (m->kind == OUT_SEND) {
            if (live && !stopping) {
                conn_write(c, m->data, m->len);
                m->data = NULL;
            } else if (m->req_id) {
                pthread_mutex_lock(&cl->mu);
                for (int i = 0; i < cl->n_pend; i++)
                    if (cl->pend[i].id == m->req_id && cl->pend[i].state == PEND_SENT) {
                        cl->pend[i].state = PEND_FAILED;
                        snprintf(cl->pend[i].why, sizeof cl->pend[i].why,
                                 "connection lost before the request was sent");
                    }
                pthread_cond_broadcast(&cl->cond);
                pthread_mutex_unlock(&cl->mu);
            }
        } else if (m->kind == OUT_CLOSE && live) {
            conn_close(c, m->why, 0);
        }
        free(m->data);
        free(m);
        m = next;
    }
    if (stopping)
        shoal_cluster_net_stop_all(cl);
}

void shoal_cluster_net_thread(void *arg)
{
    struct shoal_cluster *cl = arg;
    uv_run(&cl->loop, UV_RUN_DEFAULT);
}

void shoal_cluster_post(struct shoal_cluster *cl, struct out_msg *m)
{
    m->next = NULL;
    pthread_mutex_lock(&cl->mu);
    if (cl->out_tail)
        cl->out_tail->next = m;
    else
        cl->out_head = m;
    cl->out_tail = m;
    pthread_mutex_unlock(&cl->mu);
    uv_async_send(&cl->async);
}

void shoal_cluster_mark_down(struct shoal_cluster *cl, int xi, uint64_t gen, const char *why)
{
    struct exec *x = &cl->exec[xi];
    pthread_mutex_lock(&cl->mu);
    if (x->gen == gen && x->state != EXEC_DOWN) {
        x->state = EXEC_DOWN;
        snprintf(x->last_error, sizeof x->last_error, "%s", why);
        shoal_cluster_fail_pending_locked(cl, xi, gen, why);
    }
    pthread_mutex_unlock(&cl->mu);
    shoal_log(SHOAL_LOG_WARN, "cluster", "worker %s is down: %s", x->addr, why);
    struct out_msg *m = shoal_xcalloc(1, sizeof *m);
    m->kind = OUT_CLOSE;
    m->exec = xi;
    m->gen = gen;
    snprintf(m->why, sizeof m->why, "%s", why);
    shoal_cluster_post(cl, m);
}

