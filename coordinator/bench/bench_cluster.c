#include "bench_cluster.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "config.h"
#include "util.h"
#include "wire.h"

#define NET_TIMEOUT_MS 10000

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One heartbeat round trip carrying payload (may be empty). Returns the
 * round-trip time in seconds, or -1 with err set. */
static double heartbeat(struct shoal_wire_client *c, uint64_t id, uint8_t *payload,
                        size_t n, struct shoal_err *err)
{
    Shoal__Frame f = SHOAL__FRAME__INIT;
    Shoal__Heartbeat hb = SHOAL__HEARTBEAT__INIT;
    hb.id = id;
    hb.sent_ns = shoal_wire_now_ns();
    hb.payload.data = payload;
    hb.payload.len = n;
    f.msg_case = SHOAL__FRAME__MSG_HEARTBEAT;
    f.heartbeat = &hb;
    double t0 = shoal_time_s();
    if (shoal_wire_client_send(c, &f, err) < 0)
        return -1;
    for (;;) {
        Shoal__Frame *r = shoal_wire_client_recv(c, NET_TIMEOUT_MS, err);
        if (!r)
            return -1;
        int ours = r->msg_case == SHOAL__FRAME__MSG_HEARTBEAT && r->heartbeat->reply &&
                   r->heartbeat->id == id;
        size_t got = ours ? r->heartbeat->payload.len : 0;
        int is_error = r->msg_case == SHOAL__FRAME__MSG_ERROR;
        char msg[256] = "";
        if (is_error && r->error->message)
            snprintf(msg, sizeof msg, "%s", r->error->message);
        shoal_wire_frame_free(r);
        if (is_error) {
            shoal_err_set(err, SHOAL_EIO, "the worker answered a heartbeat with an error: %s",
                          msg);
            return -1;
        }
        if (!ours)
            continue;   /* the worker's own heartbeats or status: not ours */
        if (got != n) {
            shoal_err_set(err, SHOAL_EFORMAT, "heartbeat %llu came back with %zu payload "
                          "bytes, sent %zu", (unsigned long long)id, got, n);
            return -1;
        }
        return shoal_time_s() - t0;
    }
}

static json_t *probe_one(const char *addr, const struct shoal_wire_key *key,
                         const Shoal__PeerInfo *info, const struct shoal_bench_net_params *p)
{
    struct shoal_err err = {0};
    struct shoal_wire_client c;
    json_t *o = json_object();
    json_object_set_new(o, "address", json_string(addr));
    if (shoal_wire_client_connect(&c, addr, SHOAL__ROLE__ROLE_COORDINATOR, key, info,
                                  p->fingerprint, NET_TIMEOUT_MS, &err) < 0) {
        json_object_set_new(o, "error", json_string(err.msg));
        return o;
    }
    const int rounds = p->rtt_rounds > 0 ? p->rtt_rounds : 50;
    double *rtt = shoal_xmalloc((size_t)rounds * sizeof *rtt);
    uint64_t id = 1;
    int ok = 1;
    for (int i = 0; i < rounds && ok; i++) {
        rtt[i] = heartbeat(&c, id++, NULL, 0, &err);
        ok = rtt[i] >= 0;
    }
    if (ok) {
        qsort(rtt, (size_t)rounds, sizeof *rtt, cmp_double);
        json_object_set_new(o, "rtt_ms", json_real(1e3 * rtt[rounds / 2]));
        json_object_set_new(o, "rtt_ms_min", json_real(1e3 * rtt[0]));
        json_object_set_new(o, "rtt_rounds", json_integer(rounds));
        const size_t n = p->payload_bytes ? p->payload_bytes : 4u << 20;
        uint8_t *buf = malloc(n);
        if (!buf) {
            shoal_err_set(&err, SHOAL_ENOMEM, "cannot allocate %zu payload bytes", n);
            ok = 0;
        } else {
            for (size_t i = 0; i < n; i++)
                buf[i] = (uint8_t)(i * 131u + 7u);
            /* one untimed round trip (buffers, TCP window), then the timed ones */
            ok = heartbeat(&c, id++, buf, n, &err) >= 0;
            double t0 = shoal_time_s(), moved = 0;
            int trips = 0;
            const double want = p->bulk_seconds > 0 ? p->bulk_seconds : 1.0;
            while (ok && (shoal_time_s() - t0 < want || trips < 3)) {
                ok = heartbeat(&c, id++, buf, n, &err) >= 0;
                moved += 2.0 * (double)n;
                trips++;
            }
            double dt = shoal_time_s() - t0;
            if (ok) {
                json_object_set_new(o, "mb_per_s", json_real(moved / 1e6 / dt));
                json_object_set_new(o, "payload_bytes", json_integer((json_int_t)n));
                json_object_set_new(o, "bulk_round_trips", json_integer(trips));
                json_object_set_new(o, "bulk_seconds", json_real(dt));
            }
            free(buf);
        }
    }
    if (!ok)
        json_object_set_new(o, "error", json_string(err.msg));
    free(rtt);
    shoal_wire_client_close(&c);
    return o;
}

static json_t *net_one(const char *addr, const struct shoal_wire_key *key,
                       const Shoal__PeerInfo *info, const struct shoal_bench_net_params *p)
{
    fprintf(stderr, "shoal: bench: network probe of %s...\n", addr);
    return probe_one(addr, key, info, p);
}

static json_t *each_worker(const struct shoal_session_opts *so,
                           const struct shoal_bench_net_params *p,
                           json_t *(*fn)(const char *addr, const struct shoal_wire_key *key,
                                         const Shoal__PeerInfo *info,
                                         const struct shoal_bench_net_params *p),
                           struct shoal_err *err);

json_t *shoal_bench_net(const struct shoal_session_opts *so,
                        const struct shoal_bench_net_params *p)
{
    if (so->n_workers_args == 0)
        return json_pack("{s:s}", "skipped", so->accept_workers ?
                         "only --accept-workers: joining workers cannot be dialled" :
                         "no --workers");
    struct shoal_err err = {0};
    json_t *ws = each_worker(so, p, net_one, &err);
    if (!ws)
        return json_pack("{s:s}", "error", err.msg);
    double slowest = INFINITY, worst_rtt = 0;
    size_t i;
    json_t *w;
    json_array_foreach(ws, i, w) {
        double mb = json_number_value(json_object_get(w, "mb_per_s"));
        double rtt = json_number_value(json_object_get(w, "rtt_ms"));
        if (json_object_get(w, "mb_per_s") && mb < slowest)
            slowest = mb;
        if (rtt > worst_rtt)
            worst_rtt = rtt;
    }
    json_t *o = json_object();
    json_object_set_new(o, "workers", ws);
    json_object_set_new(o, "mb_per_s", isfinite(slowest) ? json_real(slowest) : json_null());
    json_object_set_new(o, "rtt_ms", worst_rtt > 0 ? json_real(worst_rtt) : json_null());
    json_object_set_new(o, "method", json_string(
        "Heartbeat ping-pong as a coordinator: RTT = median of empty round trips; throughput "
        "= payload bytes out and back / time (MB = 1e6 bytes)"));
    return o;
}

/* Call fn(addr, key, info, p, user) for each --workers address; returns
 * the array of the objects it made. */
static json_t *each_worker(const struct shoal_session_opts *so,
                           const struct shoal_bench_net_params *p,
                           json_t *(*fn)(const char *addr, const struct shoal_wire_key *key,
                                         const Shoal__PeerInfo *info,
                                         const struct shoal_bench_net_params *p),
                           struct shoal_err *err)
{
    struct shoal_wire_key key = {0};
    if (so->cluster_key && shoal_wire_key_load(so->cluster_key, &key, err) < 0)
        return NULL;
    Shoal__PeerInfo info = SHOAL__PEER_INFO__INIT;
    info.name = "shoal bench";
    info.software = "shoal " SHOAL_VERSION;
    info.fingerprint = (char *)(p->fingerprint ? p->fingerprint : "");
    info.max_frame = SHOAL_WIRE_MAX_FRAME_DEFAULT;
    if (p->cfg) {
        info.model_type = (char *)p->cfg->family->model_type;
        info.n_layer = (uint32_t)p->cfg->n_layer;
        info.n_expert = (uint32_t)p->cfg->n_expert;
        info.n_embd = (uint32_t)p->cfg->n_embd;
    }
    json_t *ws = json_array();
    for (int a = 0; a < so->n_workers_args; a++) {
        char *list = shoal_xstrdup(so->workers[a]), *save = NULL;
        for (char *addr = strtok_r(list, ",", &save); addr; addr = strtok_r(NULL, ",", &save))
            json_array_append_new(ws, fn(addr, &key, &info, p));
        free(list);
    }
    return ws;
}

static json_t *status_one(const char *addr, const struct shoal_wire_key *key,
                          const Shoal__PeerInfo *info, const struct shoal_bench_net_params *p)
{
    struct shoal_err err = {0};
    struct shoal_wire_client c;
    json_t *o = json_pack("{s:s}", "address", addr);
    if (shoal_wire_client_connect(&c, addr, SHOAL__ROLE__ROLE_COORDINATOR, key, info,
                                  p->fingerprint, NET_TIMEOUT_MS, &err) < 0) {
        json_object_set_new(o, "error", json_string(err.msg));
        return o;
    }
    Shoal__Frame f = SHOAL__FRAME__INIT;
    Shoal__StatusRequest rq = SHOAL__STATUS_REQUEST__INIT;
    rq.id = 1;
    f.msg_case = SHOAL__FRAME__MSG_STATUS_REQUEST;
    f.status_request = &rq;
    Shoal__Frame *r = NULL;
    if (shoal_wire_client_send(&c, &f, &err) == 0) {
        while ((r = shoal_wire_client_recv(&c, NET_TIMEOUT_MS, &err)) &&
               !(r->msg_case == SHOAL__FRAME__MSG_STATUS && r->status->id == 1) &&
               r->msg_case != SHOAL__FRAME__MSG_ERROR) {
            shoal_wire_frame_free(r);
            r = NULL;
        }
    }
    if (r && r->msg_case == SHOAL__FRAME__MSG_STATUS) {
        const Shoal__StatusReply *st = r->status;
        json_object_set_new(o, "hits", json_real((double)st->hits));
        json_object_set_new(o, "misses", json_real((double)st->misses));
        json_object_set_new(o, "bytes_read", json_real((double)st->bytes_read));
        json_object_set_new(o, "read_busy_seconds", json_real(st->read_busy_seconds));
        json_object_set_new(o, "requests", json_real((double)st->requests));
        json_object_set_new(o, "errors", json_real((double)st->errors));
        json_object_set_new(o, "cache_used", json_real((double)st->cache_used));
    } else {
        json_object_set_new(o, "error", json_string(
            r ? "the worker answered the status request with an error" : err.msg));
    }
    shoal_wire_frame_free(r);
    shoal_wire_client_close(&c);
    return o;
}

json_t *shoal_bench_worker_status(const struct shoal_session_opts *so,
                                  const struct shoal_bench_net_params *p)
{
    if (so->n_workers_args == 0)
        return NULL;
    struct shoal_err err = {0};
    json_t *ws = each_worker(so, p, status_one, &err);
    return ws ? ws : json_pack("[{s:s}]", "error", err.msg);
}

double shoal_bench_network_seconds(const struct shoal_ctx_timings *t)
{
    return t->network;
}

json_t *shoal_bench_cluster_snapshot(struct shoal_session *s)
{
    if (!s->cluster)
        return NULL;
    json_t *a = json_array();
    int n = shoal_cluster_n_executors(s->cluster);
    for (int i = 0; i < n; i++) {
        struct shoal_cluster_exec_stats st;
        memset(&st, 0, sizeof st);
        shoal_cluster_exec_stats_get(s->cluster, i, &st);
        json_array_append_new(a, json_pack(
            "{s:s, s:s, s:f, s:f, s:f, s:f, s:f, s:I, s:I, s:I, s:f, s:I}", "address",
            st.address, "state", st.state ? st.state : "?", "bytes_sent", (double)st.bytes_sent,
            "bytes_received", (double)st.bytes_received, "payload_sent",
            (double)st.payload_sent, "payload_received", (double)st.payload_received,
            "ssd_bytes", (double)st.ssd_bytes, "requests", (json_int_t)st.requests,
            "errors", (json_int_t)st.errors, "reconnects", (json_int_t)st.reconnects,
            "rtt_ms", st.rtt_ms, "experts_held", (json_int_t)st.experts_held));
        json_t *e = json_array_get(a, json_array_size(a) - 1);
        json_object_set_new(e, "busy_s", json_real(st.busy_s));
        json_object_set_new(e, "busy_steps", json_integer((json_int_t)st.busy_steps));
    }
    return a;
}

double shoal_bench_cluster_rounds(struct shoal_session *s)
{
    return s->cluster ? (double)shoal_cluster_rounds(s->cluster) : 0.0;
}

json_t *shoal_bench_cluster_balance(struct shoal_session *s)
{
    if (!s->cluster)
        return NULL;
    struct shoal_cluster_balance b;
    shoal_cluster_balance_get(s->cluster, &b);
    json_t *hist = json_object();   /* "m": layer steps with m worker disk reads */
    for (int m = 0; m < SHOAL_CLUSTER_READS_HIST; m++)
        if (b.reads_hist[m]) {
            char key[16];
            snprintf(key, sizeof key, "%d", m);
            json_object_set_new(hist, key, json_integer((json_int_t)b.reads_hist[m]));
        }
    return json_pack("{s:I, s:f, s:I, s:I, s:I, s:o}", "steps", (json_int_t)b.steps,
                     "ratio_sum", b.max_over_mean * (double)b.steps, "split_experts",
                     (json_int_t)b.n_split, "split_rows", (json_int_t)b.split_rows,
                     "step_reads", (json_int_t)b.step_reads, "reads_hist", hist);
}

json_t *shoal_bench_cluster_delta(const json_t *before, const json_t *after, double *total)
{
    *total = 0;
    if (!before || !after)
        return NULL;
    json_t *d = json_array();
    size_t i;
    json_t *b;
    json_array_foreach(after, i, b) {
        const json_t *a = json_array_get(before, i);
        double sent = json_number_value(json_object_get(b, "bytes_sent")) -
                      json_number_value(json_object_get(a, "bytes_sent"));
        double recv = json_number_value(json_object_get(b, "bytes_received")) -
                      json_number_value(json_object_get(a, "bytes_received"));
        json_t *o = json_deep_copy(b);
        json_object_set_new(o, "bytes_sent", json_real(sent));
        json_object_set_new(o, "bytes_received", json_real(recv));
        json_object_set_new(o, "wire_bytes", json_real(sent + recv));
        static const char *reals[] = {"payload_sent", "payload_received", "ssd_bytes"};
        for (size_t k = 0; k < 3; k++)
            json_object_set_new(o, reals[k], json_real(
                json_number_value(json_object_get(b, reals[k])) -
                json_number_value(json_object_get(a, reals[k]))));
        static const char *counters[] = {"requests", "errors", "reconnects"};
        for (size_t k = 0; k < 3; k++)
            json_object_set_new(o, counters[k], json_integer(
                json_integer_value(json_object_get(b, counters[k])) -
                json_integer_value(json_object_get(a, counters[k]))));
        json_object_set_new(o, "busy_s", json_real(
            json_number_value(json_object_get(b, "busy_s")) -
            json_number_value(json_object_get(a, "busy_s"))));
        json_object_set_new(o, "busy_steps", json_integer(
            json_integer_value(json_object_get(b, "busy_steps")) -
            json_integer_value(json_object_get(a, "busy_steps"))));
        *total += sent + recv;
        json_array_append_new(d, o);
    }
    return d;
}
