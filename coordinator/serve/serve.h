/* serve: `shoal serve`, the OpenAI-compatible HTTP server (libmicrohttpd).
 *
 * Threads: libmicrohttpd runs a thread per connection; they parse and check
 * requests (api.h) and queue a generating request as a job for the engine,
 * which runs on the calling thread (shoal_serve_run) and owns the session.
 * The batcher (batcher.c) runs up to `parallel` jobs at once, one KV slot
 * each, all of them in every step (continuous batching); up to `queue`
 * more wait, and beyond that a request gets 429 with Retry-After. A job
 * carries its own output queue (SSE bytes) and cancel flag.
 */
#ifndef SHOAL_SERVE_H
#define SHOAL_SERVE_H

#include <stddef.h>

#include "conns.h"
#include "session.h"

struct shoal_serve_config {
    const char *host;          /* address to bind, e.g. "127.0.0.1", "::1", "0.0.0.0" */
    int port;                  /* 0: any free port (printed at start) */
    const char *api_key_path;  /* --api-key FILE; NULL: none (then loopback only) */
    const char *model_id;      /* the model's name in /v1/models and responses */
    struct shoal_gen_opts defaults; /* sampling and --max-tokens/--stop from the
                                * command line, for fields a request leaves out */
    int max_tokens_given;      /* --max-tokens given: the default for requests */
    int seed_given;            /* --seed given: requests without "seed" use it;
                                * otherwise each draws a fresh one */
    size_t max_body;           /* request body bytes (larger: 413) */
    int parallel;              /* requests generating at once: the session's context
                                * must hold as many sequences (KV slots) */
    int queue;                 /* requests waiting for a slot; more get 429 */
    struct serve_conns_limits conns; /* HTTP connections: how many, per address,
                                * and the deadlines of a request head and body
                                * (conns.h; --max-connections,
                                * --max-connections-per-address, --header-timeout) */
    const char *cors;          /* --cors: origins a browser may call the API from,
                                * comma-separated, or "*" (cors.h); NULL: none */
    const char *slot_dir;      /* --slot-dir: slots saved at stop, loaded at start
                                * (slots.h); NULL: none */
    unsigned token_delay_ms;   /* tests only: sleep after each engine step */
    const char *test_logits_dir; /* tests only: each request's logits rows (one per
                                * sampled token) to DIR/<id>.npy, as shoal run
                                * --logits-out writes them */
    const char *test_forced_tokens; /* tests only: a file of token ids ("1 2 3"), read
                                * when a request is admitted; the request's first
                                * tokens are these ids, whatever the model's
                                * logits (logprobs still report the model's) */
};

/* Check cfg before the model is opened: the host parses, without an API
 * key it is a loopback address, --cors names origins, and the --api-key
 * file loads (shoal_wire_key_check). Returns 0, or -1 with err set (one
 * line, a usage error). */
int shoal_serve_check_config(const struct shoal_serve_config *cfg, struct shoal_err *err);

/* Serve s (borrowed; generation happens on this thread) until SIGINT or
 * SIGTERM, then stop accepting, finish or cancel the running request and
 * return. Logs "shoal serve: listening on http://HOST:PORT ..." on stderr
 * once ready, and a line per request (the server's log). Returns 0, or 1
 * with err set (one line: cannot bind, unreadable key file, bad chat
 * template). */
int shoal_serve_run(struct shoal_session *s, const struct shoal_serve_config *cfg,
                    struct shoal_err *err);

#endif
