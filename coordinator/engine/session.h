/* session: what every generating subcommand (run, chat, perplexity) shares:
 * the common flags, opening a model + tokenizer + context, and the
 * generation loop (prefill, sample, stream, stop) with its timings line.
 * Thread: main.
 */
#ifndef SHOAL_SESSION_H
#define SHOAL_SESSION_H

#include <stdint.h>
#include <stdio.h>

#include "forward.h"
#include "model.h"
#include "sampler.h"
#include "speculate.h"
#include "tokenizer.h"

struct shoal_cluster;

#define SHOAL_MAX_STOP 16
#define SHOAL_MAX_MIRRORS 7   /* SHOAL_EXPERT_STORE_MAX_SOURCES - 1 */
#define SHOAL_MAX_WORKER_ARGS 16

struct shoal_session_opts {
    const char *model_dir;   /* NULL: the bundled model */
    int64_t n_ctx;           /* 0: default */
    int64_t n_batch;         /* --batch: prefill chunk in tokens; 0: default */
    int64_t n_seq;           /* sequences the context holds (shoal serve --parallel);
                              * 0: 1 */
    unsigned long long kv_budget; /* shoal serve --kv-budget: bytes the KV cache of all
                              * n_seq sequences may take; the context per sequence is
                              * lowered to fit. 0: none */
    int mtp;                 /* the context keeps the MTP layers' state (forward.h
                              * params.mtp): 1 required (--speculate mtp: an error
                              * when the model has none), 2 when the model has
                              * usable ones (--speculate auto), 0 never */
    int kv;                  /* --kv: the KV cache's enum shoal_dtype (F32, F16,
                              * BF16); -1: the container's "kv", else F32 */
    int64_t threads;         /* 0: OpenMP default */
    int verbose;
    unsigned long long expert_cache;  /* bytes; ~0 = unlimited (containers) */
    int cache_policy;                 /* --cache-policy: enum shoal_cache_policy */
    int direct;                       /* O_DIRECT expert reads (containers) */
    int stats;                        /* print expert store stats at close */
    /* expert store v2 (containers; see common/store/expert_store.h) */
    int io;                           /* enum shoal_io_kind: --io auto|pread|uring */
    int queue_depth;                  /* --queue-depth N, reads in flight (default 8) */
    int prefetch;                     /* --prefetch on|off (default on) */
    unsigned long long pin;           /* --pin SIZE, pinned hot-set bytes (default 0) */
    const char *mirrors[SHOAL_MAX_MIRRORS]; /* --mirror DIR, repeatable; borrowed argv */
    int n_mirror;
    double mirror_weights[SHOAL_MAX_MIRRORS + 1]; /* --mirror-weights w0,w1,...: the
                                       * container first, then each --mirror */
    int n_mirror_weights;             /* 0: measured with a read probe */
    /* cluster (containers; see coordinator/cluster/cluster.h) */
    const char *workers[SHOAL_MAX_WORKER_ARGS]; /* --workers HOST:PORT,...; each a
                                       * comma-separated list; borrowed argv */
    int n_workers_args;
    const char *accept_workers;       /* --accept-workers ADDR:PORT */
    int local_experts;                /* --local-experts on|off (default on) */
    int local_fallback;               /* --local-fallback: no worker up at start, the
                                       * local experts run alone (else it fails) */
    const char *cluster_key;          /* --cluster-key FILE */
    const char *control;              /* --control ADDR:PORT|off; NULL: the default
                                       * (127.0.0.1:7077) in cluster mode */
    double connect_timeout;           /* --connect-timeout S (default 5) */
    double discover_timeout;          /* --discover-timeout S: how long --workers auto
                                       * browses (default 2) */
    double request_timeout;           /* --request-timeout S (default 30) */
    int max_unauth;                   /* --max-unauthenticated N; 0: the default */
    int max_unauth_per_addr;          /* --max-unauthenticated-per-address N; 0: the
                                       * default, at most max_unauth */
    int split_rows;                   /* --split-rows: enum shoal_cluster_split (0: auto) */
};

struct shoal_gen_opts {
    struct shoal_sampler_params sampling;
    int64_t max_tokens;
    const char *stop[SHOAL_MAX_STOP];
    int n_stop;
    int ignore_eos;
    int no_bos;
    int print_timings;       /* timings line on stderr (default 1) */
    const char *logits_out;  /* .npy path or NULL */
    const char *draft_logits_out; /* .npy path or NULL: for every generated token that
                              * is fed back, the MTP head's logits for the token
                              * after it (shoal_ctx_mtp_draft; needs the MTP state) */
    const char *ids_out;     /* path or NULL */
    const char *echo;        /* printed to out once the output files are open and the
                              * prompt fits, before generating (shoal run); NULL: none */
    enum shoal_spec_mode speculate; /* --speculate: drafts verified in one step
                              * (speculate.h; shoal run and chat); default off */
    int draft_max;           /* --draft-max: most drafts a step; 0 (default): the
                              * mode's (speculate.h SHOAL_SPEC_DRAFT_DEFAULT*) */
    int32_t stop_ids[8];     /* extra end-of-turn token ids (e.g. <|im_end|>) */
    int n_stop_ids;
    char **capture;          /* if set: *capture = the generated text (malloc) */
    struct shoal_gen_result *result; /* if set: how the generation ended */
    struct shoal_spec *spec;  /* if set: the speculation's figures at the end (drafted,
                              * kept, verify steps; shoal chat -v) */
    /* If set: called for every generated token that does not end the
     * generation, with the text the detokenizer gives for it (special
     * tokens give none; may be empty while a UTF-8 sequence is incomplete).
     * The session then prints and captures nothing itself and --stop
     * strings do not apply: the callback shows what it wants (shoal chat's
     * harmony channels). A nonzero return stops the generation (reason
     * SHOAL_STOP_STRING; that token is not evaluated into the cache). Text
     * held back at the end (an unfinished UTF-8 sequence, as U+FFFD) comes
     * with id -1. Thread: the caller's. */
    int (*on_token)(void *user, int32_t id, const char *text, size_t n);
    void *on_token_user;
    /* If set (and on_token is not): receives the generated text instead of
     * out, in the pieces the session would print (a suffix that may still
     * become a --stop string held back, the text cut before a stop string),
     * so together they are exactly the captured text. out is then not
     * written, nor is the newline after it that print_timings adds; the
     * timings line still goes to stderr. Thread: the caller's. */
    void (*on_text)(void *user, const char *text, size_t n);
    void *on_text_user;
};

enum shoal_stop_reason {
    SHOAL_STOP_MAX_TOKENS = 0,
    SHOAL_STOP_EOS,          /* an end token; it was evaluated into the cache */
    SHOAL_STOP_STRING,       /* a --stop string; tokens past it are in the cache */
    SHOAL_STOP_CONTEXT_FULL,
    SHOAL_STOP_INTERRUPTED,
    SHOAL_STOP_ERROR,
};

struct shoal_gen_result {
    int64_t n_generated;
    int32_t last_id;         /* the last sampled token (-1 if none) */
    enum shoal_stop_reason reason;
};

struct shoal_session_opts shoal_session_opts_default(void);
struct shoal_gen_opts shoal_gen_opts_default(void);

struct shoal_session {
    struct shoal_model *model;          /* owned */
    struct shoal_expert_store *store;   /* owned: a container's or a GGUF file's routed
                                         * experts (the model borrows it: model->store) */
    struct shoal_container *gguf_experts;/* owned: a GGUF model's experts as the store
                                         * reads them (container.h), else NULL */
    struct shoal_tokenizer *tok;        /* owned; NULL if the model has none */
    struct shoal_ctx *ctx;              /* owned */
    int32_t *history;                   /* [n_history] tokens in the KV cache */
    int64_t n_history, cap_history;
    float *logits;                      /* [n_vocab] scratch */
    volatile int *interrupt;            /* optional: set to stop a generation */
    int stats;                          /* the opener's: print statistics at close
                                         * (--stats; shoal_cli_session_close) */
    struct shoal_cluster *cluster;      /* the opener's cluster (--workers or
                                         * --accept-workers, cluster.h), NULL: none;
                                         * owned when cluster_destroy is set */
    void (*cluster_destroy)(struct shoal_cluster *cl);   /* called at close, after the
                                         * context, before the model is freed */
    char *cached_dir;                   /* owned (set by the opener); the cached
                                           container a cluster run on a checkpoint
                                           uses, else NULL */
    int64_t kv_budget_ctx_wanted;       /* the context per sequence the options asked
                                         * for when --kv-budget lowered it, else 0 */
};

/* 1 when the options ask for a cluster (--workers or --accept-workers). */
int shoal_session_is_cluster(const struct shoal_session_opts *o);

/* Open the model at dir (a checkpoint or a container; the options' model_dir
 * is not read: the caller resolved it), its expert store (a container's,
 * with the options' store settings) and its tokenizer. Sets the OpenMP
 * thread count from o->threads. The session cannot evaluate until
 * shoal_session_start. Prints nothing. Returns the session (owned;
 * shoal_session_close), or NULL with err set (one line) and *status (if not
 * NULL) 1. Thread: main. */
struct shoal_session *shoal_session_open(const struct shoal_session_opts *o, const char *dir,
                                         int *status, struct shoal_err *err);

/* Create the session's context: the KV cache for o's --ctx, --kv, --batch,
 * --kv-budget and n_seq, its routed experts run by experts (copied; its impl,
 * e.g. the cluster of shoal_cluster_experts, must outlive the session) or,
 * NULL, by the model's own store or resident experts. Returns 0, or -1 with err set and
 * *status (if not NULL) the exit status it calls for: 2 when an option does
 * not fit this model (--ctx above max_position_embeddings, a --kv-budget
 * that holds under 2 tokens), 1 otherwise. Thread: main. */
int shoal_session_start(struct shoal_session *s, const struct shoal_session_opts *o,
                        const struct shoal_experts *experts, int *status,
                        struct shoal_err *err);

/* Free the session and what it owns. Prints nothing (the --stats lines are
 * the CLI's: shoal_cli_session_close). NULL is a no-op. */
void shoal_session_close(struct shoal_session *s);

/* Tokenize text (add_bos: add the tokenizer's BOS when it has one).
 * *ids owned by the caller. Returns 0, or -1 with err set (no tokenizer,
 * or the tokenizer's error). */
int shoal_session_tokenize(struct shoal_session *s, const char *text,
                           int add_bos, int32_t **ids, size_t *n_ids, struct shoal_err *err);

/* Drop the KV cache and history. */
void shoal_session_reset(struct shoal_session *s);

/* Append ids to the session's history (the tokens in its KV cache). */
void shoal_session_history_push(struct shoal_session *s, const int32_t *ids, size_t n);

/* ---- one sequence's generation (generate.c) ------------------------------
 * What one prompt's generation does after each evaluation (shoal_cli_generate,
 * cli/generate_loop.c), as a state
 * machine a caller can drive for many sequences at once (shoal serve):
 * sample from the sequence's logits, detokenize, stream (stop strings held
 * back and cut), and decide whether the token is fed back. */
struct shoal_gen;

enum shoal_gen_action {
    SHOAL_GEN_FEED = 0,     /* evaluate the token (with logits) and call next again */
    SHOAL_GEN_FEED_LAST,    /* an end token: evaluate it without logits, then finish */
    SHOAL_GEN_END,          /* finished (max tokens, stop string, context full, ...) */
    SHOAL_GEN_ERROR,        /* err set (the detokenizer failed) */
};

/* A generation with options o (borrowed, outlive it; o->result, capture,
 * on_token, on_text apply as for shoal_cli_generate; echo, logits_out,
 * ids_out and print_timings are the caller's), text to out unless a
 * callback takes it. s: borrowed for its tokenizer and model. Owned by
 * the caller; end it with shoal_gen_finish. Thread: one at a time. */
struct shoal_gen *shoal_gen_create(const struct shoal_session *s,
                                   const struct shoal_gen_opts *o, FILE *out);

/* After the sequence's latest evaluation: sample from logits ([n_vocab]
 * f32, modified: penalties), with history [n_history] the sequence's cached
 * tokens (for the repetition penalty) and room the tokens its cache can
 * still take. *id_out: the sampled token, or -1 when none was sampled
 * (max_tokens reached before). Returns what the caller does next. */
enum shoal_gen_action shoal_gen_next(struct shoal_gen *g, float *logits, const int32_t *history,
                                     int64_t n_history, int64_t room, int32_t *id_out,
                                     struct shoal_err *err);

/* Mark the generation interrupted (no more tokens; reason
 * SHOAL_STOP_INTERRUPTED unless it had already ended). */
void shoal_gen_interrupt(struct shoal_gen *g);

int64_t shoal_gen_n_generated(const struct shoal_gen *g);
/* Bytes of generated text streamed so far (to out or on_text). */
size_t shoal_gen_n_printed(const struct shoal_gen *g);
/* Why it ended, for the timings line ("max tokens", "end of sequence", ...). */
const char *shoal_gen_why(const struct shoal_gen *g);

/* Flush the detokenizer and what stop strings held back, fill o->result
 * (reason SHOAL_STOP_ERROR when failed), free g. Returns the generated
 * text as streamed (malloc'd, NUL-terminated; the caller frees); *n_text
 * (when not NULL) is its length in bytes, which counts the NUL bytes a
 * model can generate (a byte-level token for byte 0). */
char *shoal_gen_finish(struct shoal_gen *g, int failed, size_t *n_text);

#endif
