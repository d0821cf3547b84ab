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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "api.h"
#include "chat_template.h"
#include "cli.h"
#include "harmony.h"
#include "metrics.h"
#include "util.h"
#include "wire.h"

enum job_state { JOB_QUEUED = 0, JOB_STARTED, JOB_DONE };

/* One generating request, shared by its connection's thread and the
 * engine; every field below `req` is guarded by the server's mutex. */
struct job {
    struct shoal_api_request req;
    char id[48];
    int64_t created;
    enum job_state state;
    int failed;                 /* err holds why (before or while generating) */
    struct shoal_api_error err;
    volatile int cancel;        /* the client left or the server stops */
    char *out;                  /* streaming: SSE bytes not yet sent */
    size_t out_len, out_cap, out_sent;
    char *text;                 /* whole: the generated text */
    int64_t n_prompt, n_gen;
    const char *finish;
    int refs;                   /* connection thread + engine */
    double t_recv, t_first;     /* dashboard: arrival, first token (shoal_time_s) */
    int64_t n_cached, max_tokens;
};

struct server {
    struct shoal_session *s;
    const struct shoal_serve_config *cfg;
    struct shoal_chat_template *tmpl;   /* NULL: the model has none */
    char *bos, *eos;
    int32_t chat_stop_ids[8];
    int n_chat_stop_ids;
    int check_host;                     /* bound to loopback: Host must name it */
    struct shoal_wire_key key;          /* key.set: Authorization required */
    int64_t started_at;
    pthread_mutex_t mu;
    pthread_cond_t cv;                  /* any job or server state change */
    struct job *pending;                /* handed to the engine */
    int busy;                           /* a job is pending or running */
    int stopping;
    struct shoal_serve_metrics *metrics;   /* /metrics and the dashboard */
};

/* per connection: the request body gathered so far */
struct conn {
    const char *url;            /* the metrics label of its path (static) */
    char *body;
    size_t len, cap;
    int too_large;
};

/* ---- replies ---- */

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
    if (a) {
        MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
        MHD_add_response_header(r, "Content-Security-Policy",
                                "default-src 'self'; frame-ancestors 'none'");
    }
    enum MHD_Result rc = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return rc;
}

/* ---- jobs ---- */

static void job_unref(struct server *srv, struct job *j)
{
    pthread_mutex_lock(&srv->mu);
    int last = --j->refs == 0;
    pthread_mutex_unlock(&srv->mu);
    if (!last)
        return;
    shoal_api_request_free(&j->req);
    free(j->out);
    free(j->text);
    free(j);
}

/* Append bytes to the job's stream queue; mutex held. */
static void out_put(struct job *j, const char *p, size_t n)
{
    if (j->out_len + n > j->out_cap) {
        j->out_cap = (j->out_len + n) * 2 + 256;
        j->out = shoal_xrealloc(j->out, j->out_cap);
    }
    memcpy(j->out + j->out_len, p, n);
    j->out_len += n;
}

/* Queue one server-sent event "data: json\n\n" (json freed); mutex held. */
static void out_event(struct job *j, char *json)
{
    out_put(j, "data: ", 6);
    out_put(j, json, strlen(json));
    out_put(j, "\n\n", 2);
    free(json);
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
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&srv->cv, &srv->mu, &ts);
}

/* ---- the engine side (the thread in shoal_serve_run) ---- */

static const char *job_endpoint(const struct job *j)
{
    return j->req.kind == SHOAL_API_CHAT ? "/v1/chat/completions" : "/v1/completions";
}

/* The dashboard: post the engine's one job and sample the session
 * (metrics.h). Thread: the engine. */
static void note_job(struct server *srv, struct job *j, enum shoal_serve_job_state state,
                     int64_t n_gen)
{
    const double now = shoal_time_s();
    if (state == SHOAL_SERVE_JOB_DECODE && j->t_first == 0)
        j->t_first = now;
    struct shoal_serve_job_stat js = {.endpoint = job_endpoint(j), .state = state,
                                      .n_prompt = j->n_prompt, .n_cached = j->n_cached,
                                      .n_gen = n_gen, .max_tokens = j->max_tokens,
                                      .t_received = j->t_recv};
    snprintf(js.id, sizeof js.id, "%s", j->id);
    if (n_gen > 1 && now > j->t_first)
        js.tok_per_s = (double)(n_gen - 1) / (now - j->t_first);
    shoal_serve_metrics_jobs(srv->metrics, &js, 1, 0, 1, 0);
    shoal_serve_metrics_sample(srv->metrics, srv->s);
}

/* The engine is done with j (finish: "stop", "length", "cancelled" or
 * "error"): its outcome, an empty snapshot, a sample. Thread: the engine. */
static void note_done(struct server *srv, struct job *j, const char *finish)
{
    const double now = shoal_time_s();
    struct shoal_serve_request_stat r = {
        .id = j->id, .endpoint = job_endpoint(j), .status = j->failed ? j->err.status : 200,
        .finish = finish, .n_prompt = j->n_prompt, .n_cached = j->n_cached,
        .n_gen = j->n_gen, .ttft_s = j->t_first > 0 ? j->t_first - j->t_recv : 0,
        .seconds = now - j->t_recv};
    if (j->n_gen > 1 && now > j->t_first && j->t_first > 0)
        r.tok_per_s = (double)(j->n_gen - 1) / (now - j->t_first);
    shoal_serve_metrics_request(srv->metrics, &r);
    shoal_serve_metrics_jobs(srv->metrics, NULL, 0, 0, 1, 0);
    shoal_serve_metrics_sample(srv->metrics, srv->s);
}

struct gen_ctx {
    struct server *srv;
    struct job *job;
    int first;
};

static void on_text(void *user, const char *text, size_t n)
{
    struct gen_ctx *g = user;
    struct job *j = g->job;
    if (g->srv->cfg->token_delay_ms)
        usleep(g->srv->cfg->token_delay_ms * 1000u);
    note_job(g->srv, j, SHOAL_SERVE_JOB_DECODE, g->srv->s->n_history - j->n_prompt + 1);
    if (!j->req.stream || !n)
        return;
    char *chunk = shoal_api_chunk_json(j->req.kind, j->id, j->created, g->srv->cfg->model_id, 0,
                                       text, n, NULL);
    pthread_mutex_lock(&g->srv->mu);
    out_event(j, chunk);
    pthread_cond_broadcast(&g->srv->cv);
    pthread_mutex_unlock(&g->srv->mu);
}

/* The prompt tokens of a request; 0, or -1 with e set. */
static int prompt_ids(struct server *srv, struct job *j, int32_t **ids, size_t *n,
                      struct shoal_api_error *e)
{
    struct shoal_err err = {0};
    struct shoal_session *s = srv->s;
    char *rendered = NULL;
    const char *text = j->req.prompt;
    struct shoal_tokenize_params tp = {.add_special = 1, .parse_special = 1};
    if (!s->tok)
        return shoal_api_fail(e, 400, "invalid_request_error", NULL, NULL,
                              "the model has no tokenizer (tokenizer.json or tiktoken.model)");
    if (j->req.kind == SHOAL_API_CHAT) {
        if (!srv->tmpl)
            return shoal_api_fail(e, 400, "invalid_request_error", "messages", NULL,
                                  "the model ships no chat template (tokenizer_config.json); "
                                  "use /v1/completions");
        struct shoal_chat_template_vars v = {.bos_token = srv->bos ? srv->bos : "",
                                             .eos_token = srv->eos ? srv->eos : "",
                                             .add_generation_prompt = 1,
                                             .messages_json = j->req.messages_json};
        if (shoal_chat_template_render(srv->tmpl, NULL, 0, &v, &rendered, &err))
            return shoal_api_fail(e, 400, "invalid_request_error", "messages", NULL,
                                  "chat template: %s", err.msg);
        text = rendered;
        tp.add_special = 0;   /* the template places BOS */
    }
    int rc = shoal_tokenizer_encode(s->tok, text, strlen(text), tp, ids, n, &err);
    free(rendered);
    if (rc)
        return shoal_api_fail(e, 400, "invalid_request_error",
                              j->req.kind == SHOAL_API_CHAT ? "messages" : "prompt", NULL,
                              "%s", err.msg);
    return 0;
}

static const char *finish_of(enum shoal_stop_reason r)
{
    return r == SHOAL_STOP_EOS || r == SHOAL_STOP_STRING ? "stop" : "length";
}

static void run_job(struct server *srv, struct job *j)
{
    struct shoal_session *s = srv->s;
    const struct shoal_api_request *q = &j->req;
    struct shoal_api_error e;
    int32_t *ids = NULL;
    size_t n = 0;
    const int64_t n_ctx = shoal_ctx_n_ctx(s->ctx);
    int bad = prompt_ids(srv, j, &ids, &n, &e);
    if (!bad && n == 0)
        bad = shoal_api_fail(&e, 400, "invalid_request_error", NULL, NULL,
                             "the prompt is empty (no tokens)");
    if (!bad && (int64_t)n >= n_ctx)
        bad = shoal_api_fail(&e, 400, "invalid_request_error",
                             q->kind == SHOAL_API_CHAT ? "messages" : "prompt",
                             "context_length_exceeded",
                             "this model's context holds %lld tokens (--ctx) and one must be "
                             "left for the reply; the prompt is %zu tokens",
                             (long long)n_ctx, n);
    if (bad) {
        pthread_mutex_lock(&srv->mu);
        j->err = e;
        j->failed = 1;
        j->state = JOB_DONE;
        pthread_cond_broadcast(&srv->cv);
        pthread_mutex_unlock(&srv->mu);
        free(ids);
        note_done(srv, j, "error");
        return;
    }
    /* keep the cached tokens this prompt starts with (at least one new
     * token is evaluated, for fresh logits) */
    int64_t keep = 0;
    while (keep < s->n_history && keep < (int64_t)n - 1 && s->history[keep] == ids[keep])
        keep++;
    shoal_ctx_truncate(s->ctx, keep);
    s->n_history = keep;

    struct shoal_gen_opts go = srv->cfg->defaults;
    struct shoal_sampler_params *sp = &go.sampling;
    if (q->has_temperature) {
        sp->temperature = (float)q->temperature;
        sp->greedy = q->temperature <= 0;
    }
    if (q->has_top_p)
        sp->top_p = (float)q->top_p;
    if (q->has_top_k)
        sp->top_k = q->top_k;
    if (q->has_min_p)
        sp->min_p = (float)q->min_p;
    if (q->has_seed)
        sp->seed = q->seed;
    else if (!srv->cfg->seed_given)
        randombytes_buf(&sp->seed, sizeof sp->seed);
    int64_t room = n_ctx - (int64_t)n;
    if (q->max_tokens >= 0)
        go.max_tokens = q->max_tokens;
    else if (!srv->cfg->max_tokens_given)
        go.max_tokens = q->kind == SHOAL_API_COMPLETION ? 16 : room;
    if (go.max_tokens > room)
        go.max_tokens = room;
    if (q->n_stop) {
        go.n_stop = q->n_stop;
        for (int k = 0; k < q->n_stop; k++)
            go.stop[k] = q->stop[k];
    }
    if (q->kind == SHOAL_API_CHAT) {
        memcpy(go.stop_ids, srv->chat_stop_ids, sizeof go.stop_ids);
        go.n_stop_ids = srv->n_chat_stop_ids;
    }
    char *text = NULL;
    struct shoal_gen_result res = {0};
    struct gen_ctx g = {.srv = srv, .job = j, .first = 1};
    go.echo = NULL;
    go.logits_out = go.ids_out = NULL;
    go.on_token = NULL;
    go.on_text = on_text;
    go.on_text_user = &g;
    go.capture = &text;
    go.result = &res;
    go.print_timings = 1;   /* the per-request log line */

    pthread_mutex_lock(&srv->mu);
    j->n_prompt = (int64_t)n;
    j->n_cached = keep;
    j->max_tokens = go.max_tokens;
    j->state = JOB_STARTED;
    if (q->stream && q->kind == SHOAL_API_CHAT)
        out_event(j, shoal_api_chunk_json(q->kind, j->id, j->created, srv->cfg->model_id, 1,
                                          NULL, 0, NULL));
    pthread_cond_broadcast(&srv->cv);
    pthread_mutex_unlock(&srv->mu);

    note_job(srv, j, SHOAL_SERVE_JOB_PREFILL, 0);
    s->interrupt = &j->cancel;
    int rc = shoal_session_generate(s, ids + keep, n - (size_t)keep, &go, NULL);
    s->interrupt = NULL;
    free(ids);
    if (rc)
        shoal_session_reset(s);   /* the cache may hold part of a step */

    pthread_mutex_lock(&srv->mu);
    j->n_gen = res.n_generated;
    j->finish = finish_of(res.reason);
    j->text = text;
    if (rc) {
        j->failed = 1;
        shoal_api_fail(&j->err, 500, "server_error", NULL, NULL,
                       "generation failed (the server's log says why)");
    }
    if (q->stream) {
        if (rc)
            out_event(j, shoal_api_error_json(&j->err));
        else
            out_event(j, shoal_api_chunk_json(q->kind, j->id, j->created, srv->cfg->model_id,
                                              0, NULL, 0, j->finish));
        if (!rc && q->include_usage)
            out_event(j, shoal_api_usage_chunk_json(q->kind, j->id, j->created,
                                                    srv->cfg->model_id, j->n_prompt, j->n_gen));
        out_put(j, "data: [DONE]\n\n", 14);
    }
    j->state = JOB_DONE;
    pthread_cond_broadcast(&srv->cv);
    pthread_mutex_unlock(&srv->mu);
    note_done(srv, j, rc ? "error" : res.reason == SHOAL_STOP_INTERRUPTED ? "cancelled"
                                                                         : j->finish);
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
    job_unref(st->srv, st->job);
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
        job_unref(srv, j);
        free(st);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
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
    if (srv->stopping || srv->busy) {
        int stopping = srv->stopping;
        pthread_mutex_unlock(&srv->mu);
        j->refs = 1;
        job_unref(srv, j);
        if (stopping)
            return fail(c, 503, "server_error", NULL, "the server is shutting down");
        return fail(c, 429, "rate_limit_error", "busy",
                    "the server is generating for another request (one at a time); "
                    "retry after the Retry-After seconds");
    }
    srv->busy = 1;
    srv->pending = j;
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
    else
        rc = reply(c, MHD_HTTP_OK,
                   shoal_api_response_json(j->req.kind, j->id, j->created, srv->cfg->model_id,
                                           j->text, j->text ? strlen(j->text) : 0, j->finish,
                                           j->n_prompt, j->n_gen),
                   0);
    job_unref(srv, j);
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
    if (!cn) {
        cn = shoal_xcalloc(1, sizeof *cn);
        cn->url = shoal_serve_metrics_endpoint(url);
        *con_cls = cn;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > srv->cfg->max_body)
            cn->too_large = 1;
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t k = *upload_data_size;
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
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    if (!host_ok(srv, host)) {
        char msg[200];
        snprintf(msg, sizeof msg, "the Host header names '%.64s'; a server bound to loopback "
                 "answers only localhost, 127.0.0.1 or [::1] (DNS rebinding protection)",
                 host ? host : "(none)");
        return fail(c, 403, "invalid_request_error", "forbidden_host", msg);
    }
    int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
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
                    "no such endpoint (GET /health, GET /v1/models, POST /v1/completions, "
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
    /* "model" may name anything: one model is served (clients often send
     * their own default name) */
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
    if (cn) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_HTTP_STATUS);
        shoal_serve_metrics_http(srv->metrics, cn->url, ci ? ci->http_status : 0);
        free(cn->body);
        free(cn);
        *con_cls = NULL;
    }
}

/* ---- start, the engine loop, stop ---- */

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
    srv->stopping = 1;
    if (srv->pending)
        srv->pending->cancel = 1;
    pthread_cond_broadcast(&srv->cv);
    pthread_mutex_unlock(&srv->mu);
    return NULL;
}

/* The chat template and the ids that end a reply (as shoal chat). Returns
 * 0, or -1 after printing an error (a template that does not parse). */
static int load_chat(struct server *srv)
{
    struct shoal_session *s = srv->s;
    struct shoal_err err = {0};
    if (!s->tok)
        return 0;
    char *cfg_path = shoal_path_join(s->model->dir, "tokenizer_config.json");
    char *src = NULL;
    int rc = shoal_chat_template_load_config(cfg_path, &src, &srv->bos, &srv->eos, &err);
    free(cfg_path);
    if (rc || !src) {
        fprintf(stderr, "shoal serve: no chat template (%s); /v1/chat/completions will "
                "refuse requests\n", err.code ? err.msg : "none in tokenizer_config.json");
        return 0;
    }
    srv->tmpl = shoal_chat_template_parse(src, &err);
    free(src);
    if (!srv->tmpl) {
        shoal_cli_error("serve: chat_template of '%s': %s", s->model->dir, err.msg);
        return -1;
    }
    srv->n_chat_stop_ids = shoal_chat_end_ids(s->tok, srv->chat_stop_ids, 8);
    return 0;
}

/* The address to bind: 0, or -1 after printing a usage error. */
static int bind_addr(const struct shoal_serve_config *cfg, struct sockaddr_storage *ss,
                     char *text, size_t cap)
{
    struct shoal_err err = {0};
    socklen_t len;
    snprintf(text, cap, strchr(cfg->host, ':') ? "[%s]:%d" : "%s:%d", cfg->host, cfg->port);
    if (shoal_wire_parse_addr(text, ss, &len, &err)) {
        shoal_cli_error("serve: --host: %s", err.msg);
        return -1;
    }
    return 0;
}

int shoal_serve_check_config(const struct shoal_serve_config *cfg)
{
    struct sockaddr_storage ss;
    char text[300];
    if (bind_addr(cfg, &ss, text, sizeof text))
        return -1;
    if (!cfg->api_key_path && !shoal_wire_addr_is_loopback(&ss)) {
        shoal_cli_error("serve: --host %s is not a loopback address: without --api-key the "
                        "server listens on loopback only", cfg->host);
        return -1;
    }
    return 0;
}

int shoal_serve_run(struct shoal_session *s, const struct shoal_serve_config *cfg)
{
    struct server srv;
    memset(&srv, 0, sizeof srv);
    srv.s = s;
    srv.cfg = cfg;
    srv.started_at = (int64_t)time(NULL);
    struct shoal_err err = {0};
    char addr_text[300];
    struct sockaddr_storage ss;
    if (bind_addr(cfg, &ss, addr_text, sizeof addr_text))
        return 1;
    srv.check_host = shoal_wire_addr_is_loopback(&ss);
    if (cfg->api_key_path && shoal_wire_key_load(cfg->api_key_path, &srv.key, &err)) {
        shoal_cli_error("serve: --api-key: %s", err.msg);
        return 1;
    }
    if (load_chat(&srv))
        return 1;
    pthread_mutex_init(&srv.mu, NULL);
    pthread_cond_init(&srv.cv, NULL);
    srv.metrics = shoal_serve_metrics_create(cfg->model_id);
    shoal_serve_metrics_sample(srv.metrics, s);

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
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)cfg->port, NULL, NULL, handle, &srv,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
        MHD_OPTION_NOTIFY_COMPLETED, completed, &srv,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)64,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)60,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024,
        MHD_OPTION_END);
    int rc = 1;
    pthread_t sig_thread;
    int have_sig_thread = 0;
    if (!d) {
        shoal_cli_error("serve: cannot listen on %s (in use, or not an address of this host)",
                        addr_text);
        goto out;
    }
    if (pthread_create(&sig_thread, NULL, signal_thread, &srv) != 0) {
        shoal_cli_error("serve: cannot start a thread");
        goto out;
    }
    have_sig_thread = 1;
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    fprintf(stderr, "shoal serve: listening on http://%s%s%s:%u (model %s, context %lld "
            "tokens%s)\n", strchr(cfg->host, ':') ? "[" : "", cfg->host,
            strchr(cfg->host, ':') ? "]" : "", di ? (unsigned)di->port : (unsigned)cfg->port,
            cfg->model_id, (long long)shoal_ctx_n_ctx(s->ctx),
            srv.key.set ? ", API key required" : "");
    fflush(stderr);
    for (;;) {
        pthread_mutex_lock(&srv.mu);
        while (!srv.pending && !srv.stopping)
            pthread_cond_wait(&srv.cv, &srv.mu);
        struct job *j = srv.pending;
        srv.pending = NULL;
        if (!j) {
            pthread_mutex_unlock(&srv.mu);
            break;
        }
        if (srv.stopping) {
            shoal_api_fail(&j->err, 503, "server_error", NULL, NULL,
                           "the server is shutting down");
            j->failed = 1;
            j->state = JOB_DONE;
            pthread_cond_broadcast(&srv.cv);
        }
        pthread_mutex_unlock(&srv.mu);
        if (j->state != JOB_DONE)
            run_job(&srv, j);
        pthread_mutex_lock(&srv.mu);
        srv.busy = 0;
        pthread_mutex_unlock(&srv.mu);
        job_unref(&srv, j);
    }
    fprintf(stderr, "shoal serve: stopping\n");
    rc = 0;
out:
    shoal_serve_metrics_stop(srv.metrics);   /* event streams end */
    if (d)
        MHD_stop_daemon(d);
    shoal_serve_metrics_free(srv.metrics);
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
