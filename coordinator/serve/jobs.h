/* jobs: the job a generating request becomes in `shoal serve`, shared by
 * the HTTP side (serve.c: one connection thread per request) and the
 * batcher (batcher.c: the thread that runs every admitted job step by
 * step), the queue of jobs waiting for a slot, and a job's output queue.
 * Every field below `req` is guarded by the server's mutex; the functions
 * say which they need. Internal to coordinator/serve/. */
#ifndef SHOAL_SERVE_JOBS_H
#define SHOAL_SERVE_JOBS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "api.h"

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

/* Jobs waiting for a slot, oldest first (under the server's mutex). */
struct job_queue {
    struct job *head, *tail;
    int n;
};

/* Append j (its next is reset). mu held. */
void job_queue_push(struct job_queue *q, struct job *j);

/* Take the oldest job, or NULL when none waits. mu held. */
struct job *job_queue_pop(struct job_queue *q);

/* Stream bytes a job may queue for a client that does not read them
 * before the request is cancelled (serve_out_put). */
#define SERVE_MAX_UNSENT ((size_t)4 << 20)

/* Drop a reference (mu: the server's mutex, which guards refs); the last
 * frees the job and what it owns. Thread: any (takes mu). */
void serve_job_unref(pthread_mutex_t *mu, struct job *j);

/* Queue one server-sent event "data: json\n\n" (json freed); mu held. */
void serve_out_event(struct job *j, char *json);

/* Append raw bytes to the job's stream queue; mu held. Past
 * SERVE_MAX_UNSENT unsent bytes it sets j->cancel (the client is not
 * reading). */
void serve_out_put(struct job *j, const char *p, size_t n);

/* Free n token log probabilities and the texts they own. */
void serve_logprobs_free(struct shoal_api_token_logprob *lp, size_t n);

#endif
