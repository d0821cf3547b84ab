/* serve_impl: what the HTTP side (serve.c) and the batching engine
 * (engine.c) of `shoal serve` share: the job a request becomes, the server
 * state, and the job's output queue. Internal to coordinator/serve/. */
#ifndef SHOAL_SERVE_IMPL_H
#define SHOAL_SERVE_IMPL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "api.h"
#include "serve.h"
#include "wire.h"

struct shoal_chat_template;
struct shoal_serve_metrics;
struct serve_conns;

enum job_state {
    JOB_QUEUED = 0,   /* waiting for a slot */
    JOB_STARTED,      /* in a slot: its prompt was accepted (prefill, then decode) */
    JOB_DONE,         /* finished, failed or cancelled: the reply can be completed */
};

/* One generating request, shared by its connection's thread and the
 * engine; every field below `req` is guarded by the server's mutex. */
struct job {
    struct shoal_api_request req;
    char id[48];
    int64_t created;
    enum job_state state;
    int failed;                 /* err holds why (before or while generating) */
    struct shoal_api_error err;
    volatile int cancel;        /* the client left */
    char *out;                  /* streaming: SSE bytes not yet sent */
    size_t out_len, out_cap, out_sent;
    char *text;                 /* whole: the generated text, text_len bytes (it can
                                 * hold NUL bytes: a token for byte 0) */
    size_t text_len;
    char *reply;                /* whole: the response JSON when the engine built it
                                 * (a harmony chat reply in parts), else NULL */
    int64_t n_prompt, n_gen;
    int64_t n_cached;           /* prompt tokens found in the KV cache (not prefilled) */
    int64_t max_tokens;         /* its limit, once admitted */
    double t_recv, t_first;     /* arrival, first token (shoal_time_s; dashboard) */
    const char *finish;
    struct shoal_api_token_logprob *lp;   /* whole replies asking logprobs: [n_lp],
                                           * owned (texts too) */
    size_t n_lp;
    int refs;                   /* connection thread + engine */
    struct job *next;           /* the queue */
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
    struct job *q_head, *q_tail;        /* queued for a slot, oldest first */
    int n_queued;
    int n_active;                       /* jobs in slots (engine's count, under mu) */
    int n_requests;                     /* requests begun and not yet completed (their
                                         * replies not yet sent; under mu): a stop
                                         * waits for them */
    double mean_request_s;              /* admission to end, moving mean (Retry-After) */
    int stopping;
    struct shoal_serve_metrics *metrics;   /* /metrics and the dashboard (metrics.h) */
    struct serve_conns *conns;          /* the HTTP connections and their limits (conns.h) */
};

/* Stream bytes a job may queue for a client that does not read them
 * before the request is cancelled (serve_out_put). */
#define SERVE_MAX_UNSENT ((size_t)4 << 20)

/* The usage counts of a job (prompt, cached, generated); mu held. */
static inline struct shoal_api_usage serve_job_usage(const struct job *j)
{
    return (struct shoal_api_usage){.n_prompt = j->n_prompt, .n_cached = j->n_cached,
                                    .n_completion = j->n_gen};
}

/* Drop a reference; the last frees the job. Thread: any (takes mu). */
void serve_job_unref(struct server *srv, struct job *j);

/* Queue one server-sent event "data: json\n\n" (json freed); mu held. */
void serve_out_event(struct job *j, char *json);

/* Append raw bytes to the job's stream queue; mu held. Past
 * SERVE_MAX_UNSENT unsent bytes it sets j->cancel (the client is not
 * reading). */
void serve_out_put(struct job *j, const char *p, size_t n);

/* Free n token log probabilities and the texts they own (engine.c). */
void serve_logprobs_free(struct shoal_api_token_logprob *lp, size_t n);

/* The engine: runs on the thread of shoal_serve_run until srv->stopping
 * and every job is done. Admits queued jobs into the KV cache's slots and
 * runs all of them together, step by step (engine.c). */
void serve_engine_run(struct server *srv);

#endif
