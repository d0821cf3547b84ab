/* serve: the HTTP layer of `shoal serve` and its one-request engine loop
 * (see serve.h). */
#include "serve.h"

#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sodium.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "api.h"
#include "serve_impl.h"
#include "chat_template.h"
#include "conns.h"
#include "cors.h"
#include "harmony.h"
#include "metrics.h"
#include "util.h"
#include "wire.h"

/* per connection: the request body gathered so far */
struct conn {
    const char *url;            /* the metrics label of its path (static) */
    char *body;
    size_t len, cap;
    int too_large;
};

/* ---- replies ---- */

/* The request's Origin when --cors allows it, else NULL: set at the top of
 * every handle() call, read by the reply helpers below on the same thread
 * within that call (libmicrohttpd calls handle() for one connection at a
 * time on a thread, and a response's headers are set when it is made), so
 * it never outlives the request whose header it points into. */
static _Thread_local const char *cors_origin;

/* The CORS headers of an allowed origin on r (none when not allowed). */
static void add_cors(struct MHD_Response *r)
{
    if (!cors_origin)
        return;
    MHD_add_response_header(r, MHD_HTTP_HEADER_ACCESS_CONTROL_ALLOW_ORIGIN, cors_origin);
    MHD_add_response_header(r, MHD_HTTP_HEADER_VARY, "Origin");
}

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, char *json,
                             unsigned retry_after)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(json), json,
                                                             MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(json);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    add_cors(r);
    if (retry_after) {
        char v[16];
        snprintf(v, sizeof v, "%u", retry_after);
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, v);
    }
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result reply_error(struct MHD_Connection *c, const struct shoal_api_error *e)
{
    return reply(c, (unsigned)e->status, shoal_api_error_json(e), e->status == 429 ? 1 : 0);
}

static enum MHD_Result fail(struct MHD_Connection *c, int status, const char *type,
                            const char *code, const char *msg)
{
    struct shoal_api_error e;
    shoal_api_fail(&e, status, type, NULL, code, "%s", msg);
    return reply_error(c, &e);
}

/* A body that is not JSON: text (owned, freed) or a static asset. */
static enum MHD_Result reply_typed(struct MHD_Connection *c, char *text,
                                   const struct shoal_serve_asset *a, const char *type)
{
    struct MHD_Response *r;
    if (a)
        r = MHD_create_response_from_buffer(a->size, (void *)a->data, MHD_RESPMEM_PERSISTENT);
    else
        r = MHD_create_response_from_buffer(text ? strlen(text) : 0, text,
                                            MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, a ? a->content_type : type);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    add_cors(r);
    if (a) {
        MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
        MHD_add_response_header(r, "Content-Security-Policy",
                                "default-src 'self'; frame-ancestors 'none'");
    }
    enum MHD_Result rc = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return rc;
}

/* A CORS preflight (OPTIONS from an allowed origin): 204 with the methods
 * and headers a page may use, the ones it asks for echoed when they are
 * plain header names. No key needed: a browser sends none in a preflight. */
static enum MHD_Result reply_preflight(struct MHD_Connection *c)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    const char *asked = MHD_lookup_connection_value(
        c, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCESS_CONTROL_REQUEST_HEADERS);
    char headers[600] = "Authorization, Content-Type";
    if (asked && *asked && shoal_serve_cors_headers_ok(asked))
        snprintf(headers, sizeof headers, "Authorization, Content-Type, %s", asked);
    add_cors(r);
    MHD_add_response_header(r, MHD_HTTP_HEADER_ACCESS_CONTROL_ALLOW_METHODS,
                            "GET, POST, OPTIONS");
    MHD_add_response_header(r, MHD_HTTP_HEADER_ACCESS_CONTROL_ALLOW_HEADERS, headers);
    MHD_add_response_header(r, MHD_HTTP_HEADER_ACCESS_CONTROL_MAX_AGE, "3600");
    enum MHD_Result rc = MHD_queue_response(c, MHD_HTTP_NO_CONTENT, r);
    MHD_destroy_response(r);
    return rc;
}

/* 1 when the peer of fd has closed its end (or the socket failed).
 * Thread: the connection's own, which owns fd. */
static int peer_gone(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
#ifdef POLLRDHUP
    p.events |= POLLRDHUP;
#endif
    if (poll(&p, 1, 0) <= 0)
        return 0;
#ifdef POLLRDHUP
    if (p.revents & POLLRDHUP)
        return 1;
#endif
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL))
        return 1;
    char b;
    ssize_t k = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* Wait on the server's condition for up to 100 ms; mutex held. */
static void wait_tick(struct server *srv)
{
    shoal_cond_wait_ms(&srv->cv, &srv->mu, 100);
}

/* ---- the connection side ---- */

/* A streamed response: what its reader needs. */
struct stream {
    struct server *srv;
    struct job *job;
    int fd;                     /* the connection's socket, for peer_gone */
};

/* The stream's reader: hands out queued SSE bytes, waits for more, ends
 * after [DONE]; a peer that went away cancels the generation.
 * Thread: the connection's. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct stream *st = cls;
    struct job *j = st->job;
    ssize_t rc;
    pthread_mutex_lock(&st->srv->mu);
    for (;;) {
        if (j->out_len > j->out_sent) {
            size_t k = j->out_len - j->out_sent;
            if (k > max)
                k = max;
            memcpy(buf, j->out + j->out_sent, k);
            j->out_sent += k;
            if (j->out_sent == j->out_len)
                j->out_sent = j->out_len = 0;
            rc = (ssize_t)k;
            break;
        }
        if (j->state == JOB_DONE) {
            rc = MHD_CONTENT_READER_END_OF_STREAM;
            break;
        }
        wait_tick(st->srv);
        if (j->state != JOB_DONE && j->out_len == j->out_sent && peer_gone(st->fd)) {
            j->cancel = 1;
            rc = MHD_CONTENT_READER_END_WITH_ERROR;
            break;
        }
    }
    pthread_mutex_unlock(&st->srv->mu);
    return rc;
}

/* The response is gone (sent, or the connection closed): a generation
 * still running is cancelled. */
static void stream_free(void *cls)
{
    struct stream *st = cls;
    st->job->cancel = 1;
    serve_job_unref(&st->srv->mu, st->job);
    free(st);
}

static enum MHD_Result start_stream(struct server *srv, struct MHD_Connection *c,
                                    struct job *j, int fd)
{
    struct stream *st = shoal_xmalloc(sizeof *st);
    st->srv = srv;
    st->job = j;
    st->fd = fd;
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384,
                                                               stream_read, st, stream_free);
    if (!r) {
        j->cancel = 1;
        serve_job_unref(&srv->mu, j);
        free(st);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    add_cors(r);
    enum MHD_Result rc = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return rc;
}

/* Run a parsed request: claim the engine, wait for the prompt to be
 * accepted, then stream or wait for the whole reply. req is moved into the
 * job. */
static enum MHD_Result generate(struct server *srv, struct MHD_Connection *c,
                                struct shoal_api_request *req)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    int fd = ci ? ci->connect_fd : -1;
    struct job *j = shoal_xcalloc(1, sizeof *j);
    j->req = *req;
    memset(req, 0, sizeof *req);
    unsigned char rnd[12];
    randombytes_buf(rnd, sizeof rnd);
    int at = snprintf(j->id, sizeof j->id, "%s",
                      j->req.kind == SHOAL_API_CHAT ? "chatcmpl-" : "cmpl-");
    for (size_t k = 0; k < sizeof rnd; k++)
        at += snprintf(j->id + at, sizeof j->id - (size_t)at, "%02x", rnd[k]);
    j->created = (int64_t)time(NULL);
    j->t_recv = shoal_time_s();
    j->refs = 2;

    pthread_mutex_lock(&srv->mu);
    /* a slot is free or will be: the queue holds what the idle slots cannot */
    const int idle = srv->cfg->parallel - srv->n_active;
    if (srv->stopping || srv->queue.n - (idle > 0 ? idle : 0) >= srv->cfg->queue) {
        int stopping = srv->stopping;
        /* when a slot is likely free: the queue ahead, parallel at a time, at
         * the recent mean request time */
        const double wait = srv->mean_request_s * (double)(srv->queue.n + 1) /
                            (double)(srv->cfg->parallel > 0 ? srv->cfg->parallel : 1);
        const unsigned retry = wait < 1 ? 1u : wait > 3600 ? 3600u : (unsigned)(wait + 0.999);
        pthread_mutex_unlock(&srv->mu);
        j->refs = 1;
        serve_job_unref(&srv->mu, j);
        if (stopping)
            return fail(c, 503, "server_error", NULL, "the server is shutting down");
        char msg[200];
        snprintf(msg, sizeof msg, "the server is busy: %d request%s generating (--parallel) "
                 "and %d queued (--queue); retry after the Retry-After seconds",
                 srv->cfg->parallel, srv->cfg->parallel == 1 ? "" : "s", srv->cfg->queue);
        struct shoal_api_error e;
        shoal_api_fail(&e, 429, "rate_limit_error", NULL, "busy", "%s", msg);
        return reply(c, 429, shoal_api_error_json(&e), retry);
    }
    job_queue_push(&srv->queue, j);
    pthread_cond_broadcast(&srv->cv);
    /* wait until the engine accepted the prompt (or refused it) */
    while (j->state == JOB_QUEUED) {
        wait_tick(srv);
        if (j->state == JOB_QUEUED && fd >= 0 && peer_gone(fd))
            j->cancel = 1;
    }
    if (j->state != JOB_QUEUED && !j->failed && j->req.stream) {
        pthread_mutex_unlock(&srv->mu);
        return start_stream(srv, c, j, fd);   /* takes this thread's reference */
    }
    while (j->state != JOB_DONE) {
        wait_tick(srv);
        if (j->state != JOB_DONE && fd >= 0 && !j->cancel && peer_gone(fd))
            j->cancel = 1;
    }
    pthread_mutex_unlock(&srv->mu);
    enum MHD_Result rc;
    if (j->failed)
        rc = reply_error(c, &j->err);
    else if (j->cancel)
        rc = MHD_NO;   /* the client is gone: close */
    else if (j->reply) {   /* built by the engine (harmony chat); reply() frees it */
        rc = reply(c, MHD_HTTP_OK, j->reply, 0);
        j->reply = NULL;
    } else
        rc = reply(c, MHD_HTTP_OK,
                   shoal_api_response_json(j->req.kind, j->id, j->created, srv->cfg->model_id,
                                           j->text, j->text_len, j->finish,
                                           serve_job_usage(j),
                                           j->req.logprobs ? &(struct shoal_api_logprobs){
                                               .tokens = j->lp, .n_tokens = j->n_lp} : NULL),
                   0);
    serve_job_unref(&srv->mu, j);
    return rc;
}

/* Host header check (DNS rebinding): bound to loopback, a request must
 * name a loopback host. */
static int host_ok(const struct server *srv, const char *host)
{
    if (!srv->check_host)
        return 1;
    if (!host)
        return 0;
    size_t n;
    if (host[0] == '[') {
        const char *e = strchr(host, ']');
        if (!e)
            return 0;
        n = (size_t)(e - host) + 1;
        if (e[1] && e[1] != ':')
            return 0;
    } else {
        const char *colon = strchr(host, ':');
        n = colon ? (size_t)(colon - host) : strlen(host);
    }
    static const char *const ok[] = {"localhost", "127.0.0.1", "[::1]"};
    for (size_t k = 0; k < sizeof ok / sizeof ok[0]; k++)
        if (strlen(ok[k]) == n && !strncasecmp(host, ok[k], n))
            return 1;
    return 0;
}

/* Authorization: Bearer KEY, compared in constant time (as hashes). */
static int key_ok(const struct server *srv, const char *auth)
{
    if (!srv->key.set)
        return 1;
    if (!auth || strncasecmp(auth, "Bearer ", 7))
        return 0;
    const char *k = auth + 7;
    while (*k == ' ')
        k++;
    uint8_t h[SHOAL_WIRE_KEY_BYTES];
    crypto_hash_sha256(h, (const unsigned char *)k, strlen(k));
    return sodium_memcmp(h, srv->key.bytes, sizeof h) == 0;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version,
                              const char *upload_data, size_t *upload_data_size,
                              void **con_cls)
{
    (void)version;
    struct server *srv = cls;
    struct conn *cn = *con_cls;
    /* every call: a reply made in it (any of them) sees this request's Origin */
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_ORIGIN);
    cors_origin = shoal_serve_cors_allows(srv->cfg->cors, origin) ? origin : NULL;
    if (!cn) {
        cn = shoal_xcalloc(1, sizeof *cn);
        cn->url = shoal_serve_metrics_endpoint(url);
        *con_cls = cn;
        serve_conns_head(srv->conns, c);   /* the head is whole: the body's rate applies */
        pthread_mutex_lock(&srv->mu);
        srv->n_requests++;
        pthread_mutex_unlock(&srv->mu);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > srv->cfg->max_body)
            cn->too_large = 1;
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t k = *upload_data_size;
        serve_conns_body(srv->conns, c, k);
        if (!cn->too_large && cn->len + k > srv->cfg->max_body) {
            cn->too_large = 1;
            free(cn->body);
            cn->body = NULL;
            cn->len = cn->cap = 0;
        }
        if (!cn->too_large) {
            if (cn->len + k + 1 > cn->cap) {
                cn->cap = (cn->len + k + 1) * 2;
                cn->body = shoal_xrealloc(cn->body, cn->cap);
            }
            memcpy(cn->body + cn->len, upload_data, k);
            cn->len += k;
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    serve_conns_busy(srv->conns, c);   /* the request is whole: never evicted now */
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    if (!host_ok(srv, host)) {
        char msg[200];
        snprintf(msg, sizeof msg, "the Host header names '%.64s'; a server bound to loopback "
                 "answers only localhost, 127.0.0.1 or [::1] (DNS rebinding protection)",
                 host ? host : "(none)");
        return fail(c, 403, "invalid_request_error", "forbidden_host", msg);
    }
    pthread_mutex_lock(&srv->mu);
    const int stopping = srv->stopping;
    pthread_mutex_unlock(&srv->mu);
    if (stopping)   /* every endpoint, /health too: a balancer sends no more */
        return fail(c, 503, "server_error", NULL, "the server is shutting down");
    int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (cors_origin && !strcmp(method, "OPTIONS"))
        return reply_preflight(c);
    if (!strcmp(url, "/health")) {
        if (!get)
            return fail(c, 405, "invalid_request_error", NULL, "/health takes GET");
        return reply(c, MHD_HTTP_OK, shoal_xstrdup("{\"status\":\"ok\"}"), 0);
    }
    /* the dashboard's files are static and open; its data needs the key */
    const struct shoal_serve_asset *asset = shoal_serve_asset_find(url);
    if (asset)
        return get ? reply_typed(c, NULL, asset, NULL)
                   : fail(c, 405, "invalid_request_error", NULL, "the dashboard takes GET");
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                   MHD_HTTP_HEADER_AUTHORIZATION);
    if (!key_ok(srv, auth))
        return fail(c, 401, "invalid_request_error", "invalid_api_key",
                    auth ? "the API key is wrong (Authorization: Bearer KEY, the --api-key file's "
                           "secret)"
                         : "an API key is required: send Authorization: Bearer KEY");
    if (!strcmp(url, "/v1/models")) {
        if (!get)
            return fail(c, 405, "invalid_request_error", NULL, "/v1/models takes GET");
        return reply(c, MHD_HTTP_OK, shoal_api_models_json(srv->cfg->model_id, srv->started_at),
                     0);
    }
    if (!strncmp(url, "/v1/models/", 11)) {   /* the SDKs' models.retrieve */
        if (!get)
            return fail(c, 405, "invalid_request_error", NULL, "/v1/models/ID takes GET");
        if (strcmp(url + 11, srv->cfg->model_id)) {
            struct shoal_api_error e;
            shoal_api_fail(&e, 404, "invalid_request_error", "model", "model_not_found",
                           "the model '%.200s' does not exist: this server serves '%s' "
                           "(GET /v1/models)", url + 11, srv->cfg->model_id);
            return reply_error(c, &e);
        }
        return reply(c, MHD_HTTP_OK, shoal_api_model_json(srv->cfg->model_id, srv->started_at),
                     0);
    }
    if (!strcmp(url, "/metrics") || !strcmp(url, "/v1/dashboard/events")) {
        if (!get)
            return fail(c, 405, "invalid_request_error", NULL, "this endpoint takes GET");
        if (url[1] == 'm')
            return reply_typed(c, shoal_serve_metrics_prometheus(srv->metrics), NULL,
                               "text/plain; version=0.0.4; charset=utf-8");
        struct MHD_Response *r = shoal_serve_metrics_events(srv->metrics);
        if (!r) {
            char msg[100];
            snprintf(msg, sizeof msg, "too many dashboards are watching (%d event streams at "
                     "most)", SHOAL_SERVE_MAX_EVENT_STREAMS);
            return fail(c, 429, "rate_limit_error", "busy", msg);
        }
        add_cors(r);
        enum MHD_Result rc = MHD_queue_response(c, MHD_HTTP_OK, r);
        MHD_destroy_response(r);
        return rc;
    }
    enum shoal_api_kind kind;
    if (!strcmp(url, "/v1/completions"))
        kind = SHOAL_API_COMPLETION;
    else if (!strcmp(url, "/v1/chat/completions"))
        kind = SHOAL_API_CHAT;
    else
        return fail(c, 404, "invalid_request_error", "not_found",
                    "no such endpoint (GET /health, GET /v1/models[/ID], POST /v1/completions, "
                    "POST /v1/chat/completions, GET /metrics, GET / the dashboard)");
    if (!post)
        return fail(c, 405, "invalid_request_error", NULL, "this endpoint takes POST");
    if (cn->too_large) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body is larger than %zu bytes",
                 srv->cfg->max_body);
        return fail(c, 413, "invalid_request_error", "request_too_large", msg);
    }
    struct shoal_api_request req;
    struct shoal_api_error e;
    if (shoal_api_parse_request(kind, cn->body ? cn->body : "", cn->len, &req, &e)) {
        shoal_api_request_free(&req);
        return reply_error(c, &e);
    }
    /* one model is served: "model" omitted or its id, as /v1/models lists it */
    if (req.model && strcmp(req.model, srv->cfg->model_id)) {
        shoal_api_fail(&e, 404, "invalid_request_error", "model", "model_not_found",
                       "the model '%.200s' does not exist: this server serves '%s' "
                       "(GET /v1/models)", req.model, srv->cfg->model_id);
        shoal_api_request_free(&req);
        return reply_error(c, &e);
    }
    enum MHD_Result rc = generate(srv, c, &req);
    shoal_api_request_free(&req);
    return rc;
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe)
{
    (void)toe;
    struct server *srv = cls;
    struct conn *cn = *con_cls;
    serve_conns_idle(srv->conns, c);   /* the next request head's deadline starts */
    if (cn) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_HTTP_STATUS);
        shoal_serve_metrics_http(srv->metrics, cn->url, ci ? ci->http_status : 0);
        free(cn->body);
        free(cn);
        *con_cls = NULL;
        pthread_mutex_lock(&srv->mu);
        srv->n_requests--;
        pthread_cond_broadcast(&srv->cv);
        pthread_mutex_unlock(&srv->mu);
    }
}

/* libmicrohttpd's connection start and end (its listening thread): the
 * connection table's limits (conns.h) */
static void conn_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                        enum MHD_ConnectionNotificationCode code)
{
    (void)socket_context;
    struct server *srv = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *fd =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *addr =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        serve_conns_started(srv->conns, c, fd ? fd->connect_fd : -1,
                            addr ? addr->client_addr : NULL);
    } else {
        serve_conns_closed(srv->conns, c);
    }
}

/* After the engine stopped: wait until every request begun has had its
 * reply sent (the 503s and the partial replies the engine just wrote are
 * sent by the connection threads), at most SERVE_DRAIN_S seconds (a client
 * that reads nothing). New requests meanwhile get 503. */
#define SERVE_DRAIN_S 10
static void drain(struct server *srv)
{
    const double until = shoal_time_s() + SERVE_DRAIN_S;
    pthread_mutex_lock(&srv->mu);
    while (srv->n_requests > 0 && shoal_time_s() < until)
        wait_tick(srv);
    const int left = srv->n_requests;
    pthread_mutex_unlock(&srv->mu);
    if (left > 0)
        fprintf(stderr, "shoal serve: %d replies not sent after %d s; closing them\n", left,
                SERVE_DRAIN_S);
}

/* ---- start, the engine loop, stop ---- */

/* libmicrohttpd's own messages as one line each with the server's prefix,
 * not bare on stderr. Those of a client that went away are dropped: a
 * stream whose reader saw the peer gone ends with an error on purpose
 * (stream_read), and MHD then says "Application reported internal error"
 * or that it could not send; the request's own line already says
 * "interrupted". A message of the thread starting the daemon (a port in
 * use) is kept for shoal_serve_run's one-line error instead. */
static void http_log(void *cls, const char *fmt, va_list ap)
{
    struct server *srv = cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == '.'))
        line[--n] = '\0';
    static const char *const gone[] = {"Application reported internal error",
                                       "application error generating response",
                                       "Failed to send", "no longer available",
                                       "Connection reset", "Broken pipe"};
    for (size_t i = 0; i < sizeof gone / sizeof *gone; i++)
        if (strstr(line, gone[i]))
            return;
    if (atomic_load(&srv->http_starting) && pthread_equal(pthread_self(), srv->http_starter)) {
        snprintf(srv->http_err, sizeof srv->http_err, "%s", line);
        return;
    }
    fprintf(stderr, "shoal serve: http: %s\n", line);
}

static void *signal_thread(void *arg)
{
    struct server *srv = arg;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    int sig = 0;
    sigwait(&set, &sig);
    pthread_mutex_lock(&srv->mu);
    srv->stopping = 1;   /* the engine answers queued jobs 503 and ends running ones */
    pthread_cond_broadcast(&srv->cv);
    pthread_mutex_unlock(&srv->mu);
    return NULL;
}

/* The chat template and the ids that end a reply (as shoal chat). Returns
 * 0, or -1 with out set (a template that does not parse). */
static int load_chat(struct server *srv, struct shoal_err *out)
{
    struct shoal_session *s = srv->s;
    struct shoal_err err = {0};
    if (!s->tok)
        return 0;
    char *src = NULL;
    int rc = shoal_chat_template_load_model(s->model->dir, shoal_model_gguf_meta(s->model),
                                            &src, &srv->bos, &srv->eos, &err);
    if (rc || !src) {
        fprintf(stderr, "shoal serve: no chat template (%s); /v1/chat/completions will "
                "refuse requests\n", err.code ? err.msg : "none in the model");
        return 0;
    }
    srv->tmpl = shoal_chat_template_parse(src, &err);
    free(src);
    if (!srv->tmpl) {
        shoal_err_set(out, SHOAL_EFORMAT, "serve: chat_template of '%s': %s", s->model->dir,
                      err.msg);
        return -1;
    }
    srv->n_chat_stop_ids = shoal_chat_end_ids(s->tok, srv->chat_stop_ids, 8);
    return 0;
}

/* The address to bind: 0, or -1 with out set (a usage error). */
static int bind_addr(const struct shoal_serve_config *cfg, struct sockaddr_storage *ss,
                     char *text, size_t cap, struct shoal_err *out)
{
    struct shoal_err err = {0};
    socklen_t len;
    snprintf(text, cap, strchr(cfg->host, ':') ? "[%s]:%d" : "%s:%d", cfg->host, cfg->port);
    if (shoal_wire_parse_addr(text, ss, &len, &err)) {
        shoal_err_set(out, SHOAL_EINVAL, "serve: --host: %s", err.msg);
        return -1;
    }
    return 0;
}

int shoal_serve_check_config(const struct shoal_serve_config *cfg, struct shoal_err *err)
{
    struct sockaddr_storage ss;
    char text[300];
    if (bind_addr(cfg, &ss, text, sizeof text, err))
        return -1;
    char msg[400];
    if (cfg->cors && shoal_serve_cors_check(cfg->cors, msg, sizeof msg)) {
        shoal_err_set(err, SHOAL_EINVAL, "serve: %s", msg);
        return -1;
    }
    if (!cfg->api_key_path && !shoal_wire_addr_is_loopback(&ss)) {
        shoal_err_set(err, SHOAL_EINVAL, "serve: --host %s is not a loopback address: without "
                      "--api-key the server listens on loopback only", cfg->host);
        return -1;
    }
    struct shoal_err ke = {0};   /* a key file that will not load, before the model opens */
    if (cfg->api_key_path && shoal_wire_key_check(cfg->api_key_path, &ke)) {
        shoal_err_set(err, SHOAL_EINVAL, "serve: --api-key: %s", ke.msg);
        return -1;
    }
    return 0;
}

int shoal_serve_run(struct shoal_session *s, const struct shoal_serve_config *cfg,
                    struct shoal_err *out)
{
    struct server srv;
    memset(&srv, 0, sizeof srv);
    srv.s = s;
    srv.cfg = cfg;
    srv.started_at = (int64_t)time(NULL);
    struct shoal_err err = {0};
    char addr_text[300];
    struct sockaddr_storage ss;
    if (bind_addr(cfg, &ss, addr_text, sizeof addr_text, out))
        return 1;
    srv.check_host = shoal_wire_addr_is_loopback(&ss);
    if (cfg->api_key_path && shoal_wire_key_load(cfg->api_key_path, &srv.key, &err)) {
        shoal_err_set(out, SHOAL_EINVAL, "serve: --api-key: %s", err.msg);
        return 1;
    }
    if (load_chat(&srv, out))
        return 1;
    pthread_mutex_init(&srv.mu, NULL);
    pthread_cond_init(&srv.cv, NULL);
    srv.metrics = shoal_serve_metrics_create(cfg->model_id);
    shoal_serve_metrics_sample(srv.metrics, s);
    srv.conns = serve_conns_create(&cfg->conns);
    if (!srv.conns) {
        shoal_err_set(out, SHOAL_EIO, "serve: cannot start a thread");
        shoal_serve_metrics_free(srv.metrics);
        return 1;
    }
    shoal_serve_metrics_conns(srv.metrics, srv.conns);

    /* SIGINT/SIGTERM go to the signal thread only (the mask is inherited
     * by every thread started from here on) */
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, &old);
    signal(SIGPIPE, SIG_IGN);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_ERROR_LOG;
    if (ss.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    srv.http_starter = pthread_self();
    atomic_store(&srv.http_starting, 1);
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)cfg->port, NULL, NULL, handle, &srv,
        MHD_OPTION_EXTERNAL_LOGGER, http_log, &srv,   /* first: it covers the others */
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
        MHD_OPTION_NOTIFY_COMPLETED, completed, &srv,
        MHD_OPTION_NOTIFY_CONNECTION, conn_notify, &srv,
        /* the table (conns.h) holds cfg->conns.max; libmicrohttpd's own
         * limit leaves room for the connections it evicted and has not
         * closed yet, so a new client always reaches the table */
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)(2 * cfg->conns.max + 16),
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)60,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024,
        MHD_OPTION_END);
    int rc = 1;
    pthread_t sig_thread;
    int have_sig_thread = 0;
    if (!d) {
        if (srv.http_err[0])
            shoal_err_set(out, SHOAL_EIO, "serve: cannot listen on %s: %s", addr_text,
                          srv.http_err);
        else
            shoal_err_set(out, SHOAL_EIO, "serve: cannot listen on %s (in use, or not an "
                          "address of this host)", addr_text);
        goto out;
    }
    atomic_store(&srv.http_starting, 0);
    if (srv.http_err[0])   /* a warning while it started: not kept from the log */
        fprintf(stderr, "shoal serve: http: %s\n", srv.http_err);
    if (pthread_create(&sig_thread, NULL, signal_thread, &srv) != 0) {
        shoal_err_set(out, SHOAL_EIO, "serve: cannot start a thread");
        goto out;
    }
    have_sig_thread = 1;
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    fprintf(stderr, "shoal serve: listening on http://%s%s%s:%u (model %s, context %lld "
            "tokens x %lld slots, KV cache %.1f MiB, queue %d%s)\n",
            strchr(cfg->host, ':') ? "[" : "", cfg->host,
            strchr(cfg->host, ':') ? "]" : "", di ? (unsigned)di->port : (unsigned)cfg->port,
            cfg->model_id, (long long)shoal_ctx_n_ctx(s->ctx),
            (long long)shoal_ctx_n_seq(s->ctx),
            (double)shoal_ctx_kv_bytes(s->ctx) / (1024.0 * 1024.0), cfg->queue,
            srv.key.set ? ", API key required" : "");
    fflush(stderr);
    serve_batcher_run(&srv);
    fprintf(stderr, "shoal serve: stopping\n");
    shoal_serve_metrics_stop(srv.metrics);   /* event streams end */
    drain(&srv);
    rc = 0;
out:
    shoal_serve_metrics_stop(srv.metrics);
    if (d)
        MHD_stop_daemon(d);
    shoal_serve_metrics_free(srv.metrics);
    serve_conns_free(srv.conns);
    if (have_sig_thread) {
        pthread_kill(sig_thread, SIGTERM);   /* no-op when it already returned */
        pthread_join(sig_thread, NULL);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_cond_destroy(&srv.cv);
    pthread_mutex_destroy(&srv.mu);
    shoal_chat_template_free(srv.tmpl);
    free(srv.bos);
    free(srv.eos);
    sodium_memzero(&srv.key, sizeof srv.key);
    return rc;
}
