/* serve_impl: what the HTTP side (serve.c) and the batcher (batcher.c) of
 * `shoal serve` share: the server state (the jobs they pass are jobs.h's).
 * Internal to coordinator/serve/. */
#ifndef SHOAL_SERVE_IMPL_H
#define SHOAL_SERVE_IMPL_H

#include <stdatomic.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "api.h"
#include "jobs.h"
#include "serve.h"
#include "wire.h"

struct shoal_chat_template;
struct shoal_serve_metrics;
struct serve_conns;

struct server {
    struct shoal_session *s;
    const struct shoal_serve_config *cfg;
    pthread_t http_starter;             /* the thread in MHD_start_daemon: its messages
                                         * (a bind error) go to http_err, others print */
    _Atomic int http_starting;          /* MHD_start_daemon has not returned yet */
    char http_err[256];
    struct shoal_chat_template *tmpl;   /* NULL: the model has none */
    char *bos, *eos;
    int32_t chat_stop_ids[8];
    int n_chat_stop_ids;
    int check_host;                     /* bound to loopback: Host must name it */
    struct shoal_wire_key key;          /* key.set: Authorization required */
    int64_t started_at;
    pthread_mutex_t mu;
    pthread_cond_t cv;                  /* any job or server state change */
    struct job_queue queue;             /* queued for a slot, oldest first */
    int n_active;                       /* jobs in slots (engine's count, under mu) */
    int n_requests;                     /* requests begun and not yet completed (their
                                         * replies not yet sent; under mu): a stop
                                         * waits for them */
    double mean_request_s;              /* admission to end, moving mean (Retry-After) */
    int stopping;
    struct shoal_serve_metrics *metrics;   /* /metrics and the dashboard (metrics.h) */
    struct serve_conns *conns;          /* the HTTP connections and their limits (conns.h) */
};


/* The usage counts of a job (prompt, cached, generated); mu held. */
static inline struct shoal_api_usage serve_job_usage(const struct job *j)
{
    return (struct shoal_api_usage){.n_prompt = j->n_prompt, .n_cached = j->n_cached,
                                    .n_completion = j->n_gen};
}





/* The batcher: runs on the thread of shoal_serve_run until srv->stopping
 * and every job is done. Admits queued jobs into the KV cache's slots and
 * runs all of them together, step by step (batcher.c). */
void serve_batcher_run(struct server *srv);

#endif
