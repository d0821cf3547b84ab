/* batcher: continuous batching for `shoal serve`.
 *
 * The context holds one KV slot per --parallel (forward.h: n_seq). Each
 * step runs every active request together through
 * shoal_ctx_eval_segs: one decode token of each request that is generating,
 * and chunks of the prompts being prefilled in what is left of n_batch
 * rows. Each MoE layer's batch-union spans all of them, so an expert routed
 * by several users is read once and passes through the cache once. The
 * rows' bits do not depend on their batch-mates (forward.h), so a request's
 * tokens and logits are those it gets alone.
 *
 * Prefix reuse: a slot keeps its tokens after its request ends. A new
 * request goes to the idle slot whose cached tokens share the longest
 * prefix with its prompt (a conversation's next turn finds its history);
 * when another slot, busy or idle, holds a longer prefix (a shared system
 * prompt), its KV rows are copied (shoal_ctx_seq_copy) instead of being
 * prefilled again.
 *
 * Harmony (gpt-oss): a chat reply on a harmony vocabulary is parsed per
 * token (harmony.h, through the generation's on_token hook, as shoal chat
 * does): the final channel's text (and a commentary message without a
 * recipient, a preamble for the user) is the reply's "content", the
 * analysis channel's (and any channel harmony does not define) its
 * "reasoning_content", and a message ending in <|call|> with a recipient a
 * tool call (finish_reason "tool_calls").
 *
 * Thread: everything here runs on the batcher's thread (the one in
 * shoal_serve_run), which owns the session; the jobs' shared fields
 * (jobs.h) are touched under srv->mu.
 */
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "chat_template.h"
#include "harmony.h"
#include "metrics.h"
#include "npy.h"
#include "slots.h"
#include "serve_impl.h"
#include "parse.h"
#include "util.h"

/* A request in a slot. */
struct run {
    struct server *srv;
    struct job *job;
    int64_t seq;                /* its slot */
    struct shoal_gen_opts go;   /* borrowed by gen */
    struct shoal_gen *gen;
    struct shoal_gen_result res;
    int32_t *prompt;            /* [n_prompt] */
    int64_t n_prompt;
    int32_t next;               /* decoding: the token to feed next */
    struct shoal_spec sp;       /* --speculate: its drafts and their figures */
    int32_t step[1 + SHOAL_SPEC_DRAFT_MAX]; /* this step's tokens: next, then the drafts */
    int64_t n_draft;            /* drafts in this step (0: none) */
    float *rows;                /* [1 + draft_max][n_vocab] the logits of a verify step;
                                 * NULL when --speculate is off */
    int last;                   /* next is an end token: feed it without logits, then end */
    float *logits;              /* [n_vocab] */
    double t_start, t_first, t_prefilled;
    int max_mates;              /* the most requests one of its steps ran */
    /* The reply's text (on_text or, harmony, on_token): [OUT_CONTENT] the
     * content, [OUT_REASONING] the harmony analysis; what is past sent[k]
     * was not streamed yet. Without harmony only a streamed reply keeps it. */
    struct outbuf {
        char *p;
        size_t n, cap, sent;
    } out[2];
    int harmony;                /* a chat reply in harmony's channels */
    struct shoal_harmony h;     /* its parser */
    int h_begun;                /* harmony: a message body began, none of its text seen */
    int32_t *forced;            /* --test-forced-tokens: the first [n_forced] tokens */
    size_t n_forced;
    int want_lp, n_top;         /* logprobs asked for, with n_top alternatives */
    float *lp_logits;           /* [n_vocab] the logits a token is sampled from */
    struct shoal_api_token_logprob *lp;   /* [n_lp] per generated token; owned text */
    size_t n_lp, cap_lp, lp_sent;
    int64_t chars_sent;         /* completion characters streamed (text_offset) */
    struct shoal_npy_writer npy;/* --test-logits-dir: the logits of each sampled token */
    int npy_open;
};

/* A KV slot: the tokens its sequence holds in the cache. */
struct slot {
    int32_t *tokens;
    int64_t n_tokens, cap;
    struct run *run;            /* NULL: idle */
    uint64_t last_used;
};

struct engine {
    struct server *srv;
    struct shoal_session *s;
    int64_t n_seq, n_ctx, n_batch, n_vocab;
    struct slot *slots;         /* [n_seq] */
    uint64_t clock;
    int64_t rr;                 /* build_step's rotating first slot */
    double t_noted;             /* when note_jobs last posted */
    int jobs_changed;           /* a run started or ended since note_jobs last posted */
    int harmony;                /* the vocabulary is harmony's (gpt-oss) */
    struct shoal_harmony_ids hids;
    struct shoal_spec_cost cost;/* step times by rows (the speculation gate) */
    struct shoal_ctx_seg *segs; /* [n_seq] */
    struct run **seg_run;       /* [n_seq] */
};

static void slot_push(struct slot *sl, const int32_t *ids, int64_t n)
{
    if (sl->n_tokens + n > sl->cap) {
        sl->cap = (sl->n_tokens + n) * 2 + 64;
        sl->tokens = shoal_xrealloc(sl->tokens, (size_t)sl->cap * sizeof(int32_t));
    }
    memcpy(sl->tokens + sl->n_tokens, ids, (size_t)n * sizeof(int32_t));
    sl->n_tokens += n;
}

static int64_t common_prefix(const int32_t *a, int64_t na, const int32_t *b, int64_t nb)
{
    int64_t k = 0;
    while (k < na && k < nb && a[k] == b[k])
        k++;
    return k;
}

/* ---- output (streamed chunks) ---- */

enum { OUT_CONTENT = 0, OUT_REASONING = 1 };

static void out_add(struct outbuf *b, const char *text, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = shoal_xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, text, n);
    b->n += n;
}

/* The generation's text as it becomes safe to show (stop strings held
 * back): kept until the step's token has its log probabilities, then sent
 * by flush_text. */
static void on_text(void *user, const char *text, size_t n)
{
    struct run *r = user;
    if (r->job->req.stream && n)
        out_add(&r->out[OUT_CONTENT], text, n);
}

/* Where the body text of h's current message goes: the content, the
 * reasoning, or nowhere (-1: a tool call's arguments, kept by h). */
static int harmony_out(const struct shoal_harmony *h)
{
    switch (h->channel) {
    case SHOAL_HARMONY_FINAL:
    case SHOAL_HARMONY_NONE:
        return OUT_CONTENT;
    case SHOAL_HARMONY_COMMENTARY:
        return h->recipient[0] ? -1 : OUT_CONTENT;
    default:
        return OUT_REASONING;
    }
}

/* on_token of a harmony reply: parse, and keep the text of the channels
 * shown (two messages of one field are joined by a newline). */
static int on_harmony_token(void *user, int32_t id, const char *text, size_t n)
{
    struct run *r = user;
    const enum shoal_harmony_event ev = shoal_harmony_feed(&r->h, id, text, n);
    if (ev == SHOAL_HARMONY_EV_BEGIN)
        r->h_begun = 1;
    const int k = harmony_out(&r->h);
    if (ev != SHOAL_HARMONY_EV_TEXT || !n || k < 0)
        return 0;
    if (r->h_begun && r->out[k].n)
        out_add(&r->out[k], "\n", 1);
    r->h_begun = 0;
    out_add(&r->out[k], text, n);
    return 0;
}

/* Stream what on_text (on_token) kept as one chunk, with the log
 * probabilities of the tokens not sent yet (all of them when final). */
static void flush_text(struct run *r, int final)
{
    struct job *j = r->job;
    struct outbuf *c = &r->out[OUT_CONTENT], *t = &r->out[OUT_REASONING];
    const size_t nc = c->n - c->sent, nt = t->n - t->sent;
    if (!j->req.stream || (!nc && !nt && !(final && r->lp_sent < r->n_lp)))
        return;
    struct shoal_api_logprobs lp = {.tokens = r->lp + r->lp_sent,
                                    .n_tokens = r->n_lp - r->lp_sent,
                                    .text_offset = r->chars_sent};
    const char *ct = c->p ? c->p + c->sent : "";
    char *chunk;
    if (r->harmony)   /* a delta of what each field got (content "": logprobs only) */
        chunk = shoal_api_chat_chunk_json(
            j->id, j->created, r->srv->cfg->model_id,
            &(struct shoal_api_chat_parts){.content = nc || !nt ? ct : NULL, .n_content = nc,
                                           .reasoning = nt ? t->p + t->sent : NULL,
                                           .n_reasoning = nt},
            NULL, r->want_lp ? &lp : NULL);
    else
        chunk = shoal_api_chunk_json(j->req.kind, j->id, j->created, r->srv->cfg->model_id, 0,
                                     ct, nc, NULL, r->want_lp ? &lp : NULL);
    r->lp_sent = r->n_lp;
    r->chars_sent += shoal_api_n_chars(ct, nc);
    c->sent = c->n;
    t->sent = t->n;
    pthread_mutex_lock(&r->srv->mu);
    serve_out_event(j, chunk);
    pthread_cond_broadcast(&r->srv->cv);
    pthread_mutex_unlock(&r->srv->mu);
}

/* The text of token id for logprobs (malloc'd, *n bytes): the detokenizer's
 * for it alone, "[id]" without a tokenizer. */
static char *token_text(const struct shoal_session *s, int32_t id, size_t *n)
{
    char *t = NULL;
    if (s->tok && id < shoal_tokenizer_n_vocab(s->tok)) {
        struct shoal_err err = {0};
        t = shoal_tokenizer_decode_len(s->tok, &id, 1, 0, n, &err);
    }
    if (!t) {
        t = shoal_xmalloc(24);
        snprintf(t, 24, "[%d]", id);
        *n = strlen(t);
    }
    return t;
}

/* Record the log probabilities of token id under logits [V] (the model's
 * distribution: log-softmax of the logits, before penalties and
 * temperature), with the n_top likeliest alternatives. */
static void add_logprob(struct run *r, const struct shoal_session *s, const float *logits,
                        int64_t V, int32_t id)
{
    float mx = logits[0];
    for (int64_t i = 1; i < V; i++)
        if (logits[i] > mx)
            mx = logits[i];
    double sum = 0;
    for (int64_t i = 0; i < V; i++)
        sum += exp((double)logits[i] - mx);
    const double lse = mx + log(sum);
    int32_t top[20];
    int nt = 0;
    for (int64_t i = 0; i < V && r->n_top > 0; i++) {   /* insertion into the best n_top */
        if (nt == r->n_top && logits[i] <= logits[top[nt - 1]])
            continue;
        int k = nt < r->n_top ? nt++ : nt - 1;
        while (k > 0 && logits[top[k - 1]] < logits[i]) {
            top[k] = top[k - 1];
            k--;
        }
        top[k] = (int32_t)i;
    }
    if (r->n_lp == r->cap_lp) {
        r->cap_lp = r->cap_lp * 2 + 16;
        r->lp = shoal_xrealloc(r->lp, r->cap_lp * sizeof *r->lp);
    }
    struct shoal_api_token_logprob *t = &r->lp[r->n_lp++];
    t->text = token_text(s, id, &t->n);
    t->logprob = (float)(logits[id] - lse);
    struct shoal_api_top_logprob *alt = shoal_xcalloc((size_t)(nt ? nt : 1), sizeof *alt);
    for (int k = 0; k < nt; k++) {
        alt[k].text = token_text(s, top[k], &alt[k].n);
        alt[k].logprob = (float)(logits[top[k]] - lse);
    }
    t->top = alt;
    t->n_top = nt;
}

/* ---- the dashboard and /metrics (metrics.h) ---- */

static const char *job_endpoint(const struct job *j)
{
    return j->req.kind == SHOAL_API_CHAT ? "/v1/chat/completions" : "/v1/completions";
}

/* A generation ended (finish: "stop", "length", "cancelled" or "error"). */
static void note_done(struct server *srv, struct job *j, const char *finish)
{
    const double now = shoal_time_s();
    struct shoal_serve_request_stat st = {
        .id = j->id, .endpoint = job_endpoint(j), .status = j->failed ? j->err.status : 200,
        .finish = finish, .n_prompt = j->n_prompt, .n_cached = j->n_cached, .n_gen = j->n_gen,
        .ttft_s = j->t_first > 0 ? j->t_first - j->t_recv : 0, .seconds = now - j->t_recv};
    if (j->n_gen > 1 && j->t_first > 0 && now > j->t_first)
        st.tok_per_s = (double)(j->n_gen - 1) / (now - j->t_first);
    shoal_serve_metrics_request(srv->metrics, &st);
}

/* Post the jobs the engine holds (running, then queued) and sample the
 * session; after a step at most every 50 ms, unless a run started or ended
 * (force: now). So /metrics never shows fewer running requests than the
 * engine holds: a run that started and ended between two timed posts
 * would otherwise be invisible, and a client that saw "0 running" could
 * read the finish counters before that run's outcome was counted. */
static void note_jobs(struct engine *en, int force);

/* Mark a job done with error e (before it ran); mu not held. */
static void job_fail(struct server *srv, struct job *j, const struct shoal_api_error *e)
{
    pthread_mutex_lock(&srv->mu);
    const char *outcome = j->cancel ? "cancelled" : "error";   /* before the reply ends */
    j->err = *e;
    j->failed = 1;
    j->state = JOB_DONE;
    pthread_cond_broadcast(&srv->cv);
    pthread_mutex_unlock(&srv->mu);
    note_done(srv, j, outcome);
    serve_job_unref(&srv->mu, j);
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
    if (j->req.prompt_tokens) {   /* token ids: no tokenizer needed */
        const int64_t V = s->model->cfg.n_vocab;
        for (size_t i = 0; i < j->req.n_prompt_tokens; i++)
            if (j->req.prompt_tokens[i] >= V)
                return shoal_api_fail(e, 400, "invalid_request_error", "prompt", NULL,
                                      "prompt[%zu] is token %d: expected an id below the "
                                      "vocabulary's %lld", i, j->req.prompt_tokens[i],
                                      (long long)V);
        *n = j->req.n_prompt_tokens;
        *ids = shoal_xcalloc(*n ? *n : 1, sizeof(int32_t));
        memcpy(*ids, j->req.prompt_tokens, *n * sizeof(int32_t));
        return 0;
    }
    if (!s->tok)
        return shoal_api_fail(e, 400, "invalid_request_error", NULL, NULL,
                              "the model has no tokenizer (tokenizer.json or tiktoken.model)");
    if (j->req.kind == SHOAL_API_CHAT) {
        if (!srv->tmpl)
            return shoal_api_fail(e, 400, "invalid_request_error", "messages", NULL,
                                  shoal_model_gguf_meta(s->model)
                                      ? "the model ships no chat template (the GGUF file's "
                                        "tokenizer.chat_template); use /v1/completions"
                                      : "the model ships no chat template "
                                        "(tokenizer_config.json); use /v1/completions");
        struct shoal_chat_template_vars v = {.bos_token = srv->bos ? srv->bos : "",
                                             .eos_token = srv->eos ? srv->eos : "",
                                             .add_generation_prompt = 1,
                                             .messages_json = j->req.messages_json,
                                             .extra_json = j->req.template_vars_json};
        int rc = shoal_chat_template_render(srv->tmpl, NULL, 0, &v, &rendered, &err);
        if (rc == SHOAL_EINVAL && j->req.messages_json_empty) {
            /* a null content (an assistant's tool calls) that the template
             * cannot take as none, e.g. '...' + message['content']: as ""
             * (minja's fallback for templates that need a content) */
            v.messages_json = j->req.messages_json_empty;
            err = (struct shoal_err){0};
            rc = shoal_chat_template_render(srv->tmpl, NULL, 0, &v, &rendered, &err);
        }
        if (rc)
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

/* The request's generation options: the server's defaults, then what the
 * request sets. n: its prompt tokens. */
static void gen_opts_of(struct run *r, int64_t n)
{
    struct server *srv = r->srv;
    const struct shoal_api_request *q = &r->job->req;
    const int64_t n_ctx = shoal_ctx_n_ctx(srv->s->ctx);
    struct shoal_gen_opts *go = &r->go;
    *go = srv->cfg->defaults;
    struct shoal_sampler_params *sp = &go->sampling;
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
    if (q->has_presence_penalty)
        sp->presence_penalty = (float)q->presence_penalty;
    if (q->has_frequency_penalty)
        sp->frequency_penalty = (float)q->frequency_penalty;
    if (q->has_seed)
        sp->seed = q->seed;
    else if (!srv->cfg->seed_given)
        randombytes_buf(&sp->seed, sizeof sp->seed);
    const int64_t room = n_ctx - n;
    if (q->max_tokens >= 0)
        go->max_tokens = q->max_tokens;
    else if (!srv->cfg->max_tokens_given)
        go->max_tokens = q->kind == SHOAL_API_COMPLETION ? 16 : room;
    if (go->max_tokens > room)
        go->max_tokens = room;
    if (q->n_stop) {
        go->n_stop = q->n_stop;
        for (int k = 0; k < q->n_stop; k++)
            go->stop[k] = q->stop[k];
    }
    if (q->kind == SHOAL_API_CHAT) {
        memcpy(go->stop_ids, srv->chat_stop_ids, sizeof go->stop_ids);
        go->n_stop_ids = srv->n_chat_stop_ids;
    }
    go->echo = NULL;
    go->logits_out = go->ids_out = NULL;
    go->on_token = NULL;
    go->on_text = on_text;
    go->on_text_user = r;
    go->capture = NULL;
    go->result = &r->res;
    go->print_timings = 0;
}

/* ---- admission ---- */

/* The slot for a prompt: the idle one sharing the longest prefix with it,
 * else the least recently used idle one; -1 when none is idle. */
static int64_t pick_slot(const struct engine *en, const int32_t *ids, int64_t n)
{
    int64_t best = -1, best_len = -1;
    for (int64_t i = 0; i < en->n_seq; i++) {
        const struct slot *sl = &en->slots[i];
        if (sl->run)
            continue;
        const int64_t k = common_prefix(sl->tokens, sl->n_tokens, ids, n);
        if (k > best_len || (k == best_len && sl->last_used < en->slots[best].last_used)) {
            best = i;
            best_len = k;
        }
    }
    return best;
}

/* --test-forced-tokens: the ids in path become r's first tokens (an empty
 * file: none; a file that does not read or parse, or an id outside the
 * vocabulary: a line on stderr, none). */
static void read_forced(struct run *r, const char *path, int64_t n_vocab)
{
    struct shoal_err err = {0};
    char *txt = NULL;
    size_t len;
    if (shoal_read_file(path, (size_t)1 << 20, &txt, &len, &err)) {
        fprintf(stderr, "shoal: %s\n", err.msg);
        return;
    }
    if (txt[strspn(txt, " \t\r\n")] &&   /* an empty file forces nothing */
        shoal_parse_id_list(txt, &r->forced, &r->n_forced, &err) != 0)
        fprintf(stderr, "shoal: %s: %s\n", path, err.msg);
    else if (r->n_forced)
        for (size_t i = 0; i < r->n_forced; i++)
            if (r->forced[i] >= n_vocab) {
                fprintf(stderr, "shoal: %s: token %d is outside the vocabulary (%lld)\n",
                        path, r->forced[i], (long long)n_vocab);
                free(r->forced);
                r->forced = NULL;
                r->n_forced = 0;
                break;
            }
    free(txt);
}

/* Start job j in an idle slot: tokenize, check, reuse the longest cached
 * prefix (its own slot's, or copied from another slot), create its
 * generation. Returns the run, or NULL when j failed (answered). */
static struct run *admit(struct engine *en, struct job *j)
{
    struct server *srv = en->srv;
    struct shoal_session *s = en->s;
    struct shoal_api_error e;
    int32_t *ids = NULL;
    size_t n = 0;
    const int harmony = en->harmony && j->req.kind == SHOAL_API_CHAT;
    /* the harmony parser takes every token (on_token): no stop strings */
    int bad = harmony && j->req.n_stop
                  ? shoal_api_fail(&e, 400, "invalid_request_error", "stop", NULL,
                                   "'stop' is not supported with this model's harmony format "
                                   "(gpt-oss): its replies end at <|return|> or <|call|>")
                  : prompt_ids(srv, j, &ids, &n, &e);
    if (!bad && n == 0)
        bad = shoal_api_fail(&e, 400, "invalid_request_error", NULL, NULL,
                             "the prompt is empty (no tokens)");
    if (!bad && (int64_t)n >= en->n_ctx)
        bad = shoal_api_fail(&e, 400, "invalid_request_error",
                             j->req.kind == SHOAL_API_CHAT ? "messages" : "prompt",
                             "context_length_exceeded",
                             "this model's context holds %lld tokens (--ctx) and one must be "
                             "left for the reply; the prompt is %zu tokens",
                             (long long)en->n_ctx, n);
    if (bad) {
        free(ids);
        job_fail(srv, j, &e);
        return NULL;
    }
    const int64_t seq = pick_slot(en, ids, (int64_t)n);
    struct slot *sl = &en->slots[seq];
    /* keep what the cache holds of the prompt (at least one token is
     * evaluated, for fresh logits) */
    int64_t keep = common_prefix(sl->tokens, sl->n_tokens, ids, (int64_t)n - 1);
    int64_t src = seq;
    for (int64_t i = 0; i < en->n_seq; i++) {
        const struct slot *o = &en->slots[i];
        const int64_t k = common_prefix(o->tokens, o->n_tokens, ids, (int64_t)n - 1);
        if (k > keep) {
            keep = k;
            src = i;
        }
    }
    if (src != seq) {
        shoal_ctx_seq_copy(s->ctx, seq, src, keep);
        sl->n_tokens = 0;
        slot_push(sl, en->slots[src].tokens, keep);
    } else {
        shoal_ctx_seq_truncate(s->ctx, seq, keep);
        sl->n_tokens = keep;
    }
    struct run *r = shoal_xcalloc(1, sizeof *r);
    r->srv = srv;
    r->job = j;
    r->seq = seq;
    r->prompt = ids;
    r->n_prompt = (int64_t)n;
    r->logits = shoal_xcalloc((size_t)en->n_vocab, sizeof(float));
    r->t_start = shoal_time_s();
    gen_opts_of(r, (int64_t)n);
    if (harmony) {
        r->harmony = 1;
        shoal_harmony_init(&r->h, &en->hids);
        r->go.on_token = on_harmony_token;
        r->go.on_token_user = r;
        r->go.on_text = NULL;
        r->go.n_stop = 0;   /* --stop of the server: not with on_token */
    }
    if (srv->cfg->test_forced_tokens)
        read_forced(r, srv->cfg->test_forced_tokens, en->n_vocab);
    r->gen = shoal_gen_create(s, &r->go, NULL);
    shoal_spec_init(&r->sp, r->go.speculate, r->go.draft_max);
    if (r->go.speculate != SHOAL_SPEC_OFF)
        r->rows = shoal_xmalloc((size_t)(1 + r->sp.draft_max) * (size_t)en->n_vocab *
                                sizeof(float));
    r->want_lp = j->req.logprobs;
    r->n_top = j->req.top_logprobs;
    if (r->want_lp)
        r->lp_logits = shoal_xcalloc((size_t)en->n_vocab, sizeof(float));
    if (srv->cfg->test_logits_dir) {   /* as shoal run --logits-out */
        struct shoal_err err = {0};
        char *path = shoal_path_join(srv->cfg->test_logits_dir, j->id);
        path = shoal_xrealloc(path, strlen(path) + 5);
        strcat(path, ".npy");
        if (shoal_npy_open(&r->npy, path, en->n_vocab, &err) == 0)
            r->npy_open = 1;
        else
            fprintf(stderr, "shoal: %s\n", err.msg);
        free(path);
    }
    sl->run = r;
    en->jobs_changed = 1;
    pthread_mutex_lock(&srv->mu);
    j->n_prompt = (int64_t)n;
    j->n_cached = keep;
    j->max_tokens = r->go.max_tokens;
    j->state = JOB_STARTED;
    srv->n_active++;
    if (j->req.stream && j->req.kind == SHOAL_API_CHAT)
        serve_out_event(j, shoal_api_chunk_json(j->req.kind, j->id, j->created,
                                                srv->cfg->model_id, 1, NULL, 0, NULL, NULL));
    pthread_cond_broadcast(&srv->cv);
    pthread_mutex_unlock(&srv->mu);
    return r;
}

/* ---- finishing ---- */

static const char *finish_of(enum shoal_stop_reason r)
{
    return r == SHOAL_STOP_EOS || r == SHOAL_STOP_STRING ? "stop" : "length";
}

/* The harmony reply of r in parts (borrowing r's buffers): the content
 * ("" when none; null beside a tool call), the reasoning when there is
 * some, and when called the tool call, its name the recipient without
 * "functions." and its id a fresh "call_<24 hex>" in call_id[32]. */
static void harmony_parts(struct run *r, int called, struct shoal_api_chat_parts *m,
                          char call_id[32])
{
    const struct outbuf *c = &r->out[OUT_CONTENT], *t = &r->out[OUT_REASONING];
    memset(m, 0, sizeof *m);
    m->content = c->n || !called ? (c->p ? c->p : "") : NULL;
    m->n_content = c->n;
    if (t->n) {
        m->reasoning = t->p;
        m->n_reasoning = t->n;
    }
    if (!called)
        return;
    const char *name = r->h.recipient;
    if (!strncmp(name, "functions.", 10))
        name += 10;
    m->tool_name = name;
    m->tool_args = r->h.call_args ? r->h.call_args : "";
    m->n_tool_args = r->h.call_len;
    unsigned char rnd[12];
    randombytes_buf(rnd, sizeof rnd);
    memcpy(call_id, "call_", 5);
    for (int i = 0; i < 12; i++)
        snprintf(call_id + 5 + 2 * i, 3, "%02x", rnd[i]);
    m->tool_call_id = call_id;
}

/* End run r (failed: a 500), complete its reply, free its slot. */
static void finish(struct engine *en, struct run *r, int failed)
{
    struct server *srv = en->srv;
    struct job *j = r->job;
    const char *why = shoal_gen_why(r->gen);
    size_t n_text = 0;
    char *text = shoal_gen_finish(r->gen, failed, &n_text);
    /* harmony: the end token (<|return|>, <|call|>) stopped the generation
     * before on_token saw it */
    const int called = r->harmony && !failed && r->res.reason == SHOAL_STOP_EOS &&
                       shoal_harmony_feed(&r->h, r->res.last_id, "", 0) == SHOAL_HARMONY_EV_CALL;
    if (!failed)
        flush_text(r, 1);
    const int64_t n_gen = r->res.n_generated;
    const double t_end = shoal_time_s();
    if (r->npy_open) {   /* complete before the reply is */
        struct shoal_err err = {0};
        if (shoal_npy_close(&r->npy, &err))
            fprintf(stderr, "shoal: %s\n", err.msg);
    }
    if (!failed) {
        /* the per-request line, as shoal run's timings line */
        const int64_t n_new = r->n_prompt - j->n_cached;
        const double t_pre = r->t_prefilled > r->t_start ? r->t_prefilled - r->t_start : 0;
        char rate[32] = "n/a";
        if (n_gen > 1 && t_end > r->t_first)
            snprintf(rate, sizeof rate, "%.2f", (double)(n_gen - 1) / (t_end - r->t_first));
        char spec[96] = "";
        if (r->sp.mode != SHOAL_SPEC_OFF)
            snprintf(spec, sizeof spec, " | speculate %s: %lld drafted, %lld kept",
                     shoal_spec_mode_name(r->sp.mode), (long long)r->sp.n_drafted,
                     (long long)r->sp.n_accepted);
        fprintf(stderr, "shoal: %s prompt %lld tokens (%lld cached), prefill %.1f tok/s, "
                "TTFT %.1f ms | decode %lld tokens, %s tok/s | stop: %s | batched with up "
                "to %d%s\n", j->id, (long long)r->n_prompt, (long long)j->n_cached,
                t_pre > 0 ? (double)n_new / t_pre : 0.0,
                r->t_first > 0 ? (r->t_first - r->t_start) * 1e3 : 0.0, (long long)n_gen, rate,
                why, r->max_mates - 1 > 0 ? r->max_mates - 1 : 0, spec);
    }
    pthread_mutex_lock(&srv->mu);
    j->n_gen = n_gen;
    j->finish = called ? "tool_calls" : finish_of(r->res.reason);
    /* read before the reply completes: the connection's end sets cancel */
    const char *outcome = failed ? "error" : j->cancel ? "cancelled" : j->finish;
    if (failed) {
        j->failed = 1;
        shoal_api_fail(&j->err, 500, "server_error", NULL, NULL,
                       "generation failed (the server's log says why)");
    }
    struct shoal_api_chat_parts parts = {0};
    char call_id[32];
    if (r->harmony && !failed)
        harmony_parts(r, called, &parts, call_id);
    if (j->req.stream) {
        if (failed) {
            serve_out_event(j, shoal_api_error_json(&j->err));
        } else {
            if (called) {   /* the call in one delta, its arguments whole */
                parts.content = parts.reasoning = NULL;   /* streamed already */
                serve_out_event(j, shoal_api_chat_chunk_json(j->id, j->created,
                                                             srv->cfg->model_id, &parts, NULL,
                                                             NULL));
            }
            serve_out_event(j, shoal_api_chunk_json(j->req.kind, j->id, j->created,
                                                    srv->cfg->model_id, 0, NULL, 0, j->finish,
                                                    NULL));
        }
        if (!failed && j->req.include_usage)
            serve_out_event(j, shoal_api_usage_chunk_json(j->req.kind, j->id, j->created,
                                                          srv->cfg->model_id,
                                                          serve_job_usage(j)));
        serve_out_put(j, "data: [DONE]\n\n", 14);
        free(text);
    } else if (r->harmony && !failed) {
        j->reply = shoal_api_chat_response_json(
            j->id, j->created, srv->cfg->model_id, &parts, j->finish, serve_job_usage(j),
            r->want_lp ? &(struct shoal_api_logprobs){.tokens = r->lp, .n_tokens = r->n_lp}
                       : NULL);
        free(text);
    } else {
        j->text = text;
        j->text_len = n_text;
        if (r->want_lp) {   /* the connection thread builds the reply: a copy */
            j->lp = r->lp;
            j->n_lp = r->n_lp;
            r->lp = NULL;
            r->n_lp = 0;
        }
    }
    j->state = JOB_DONE;
    srv->n_active--;
    srv->mean_request_s = srv->mean_request_s > 0
                              ? 0.8 * srv->mean_request_s + 0.2 * (t_end - r->t_start)
                              : t_end - r->t_start;
    pthread_cond_broadcast(&srv->cv);
    pthread_mutex_unlock(&srv->mu);
    note_done(srv, j, outcome);
    serve_job_unref(&srv->mu, j);
    struct slot *sl = &en->slots[r->seq];
    sl->run = NULL;
    en->jobs_changed = 1;
    sl->last_used = ++en->clock;
    free(r->prompt);
    free(r->logits);
    free(r->rows);
    free(r->lp_logits);
    for (int k = 0; k < 2; k++)
        free(r->out[k].p);
    if (r->harmony)
        shoal_harmony_free(&r->h);
    free(r->forced);
    serve_logprobs_free(r->lp, r->n_lp);
    free(r);
}

/* ---- the step ---- */

/* Build this step's segments: one decode token of every generating run,
 * then prompt chunks in the rows left, the slots visited from a start that
 * rotates each step (so that none waits forever when the rows are fewer
 * than the runs). Returns the count. */
static int build_step(struct engine *en)
{
    int ns = 0;
    int64_t room = en->n_batch;
    en->rr = (en->rr + 1) % en->n_seq;
    int64_t n_dec = 0;   /* runs decoding this step: each gives a token */
    for (int64_t i = 0; i < en->n_seq; i++)
        n_dec += en->slots[i].run && en->slots[i].run->n_prompt <= en->slots[i].n_tokens;
    int64_t n_rows = n_dec;   /* decode rows of the step, drafts included */
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t k = 0; k < en->n_seq && room > 0; k++) {
            const int64_t i = (en->rr + k) % en->n_seq;
            struct slot *sl = &en->slots[i];
            struct run *r = sl->run;
            if (!r)
                continue;
            const int64_t todo = r->n_prompt - sl->n_tokens;   /* prompt left */
            const int prefill = todo > 0;
            if (prefill != pass)
                continue;
            struct shoal_ctx_seg *g = &en->segs[ns];
            g->seq = i;
            g->all_logits = 0;
            if (prefill) {
                g->tokens = r->prompt + sl->n_tokens;
                g->n = todo < room ? todo : room;
                g->logits = g->n == todo ? r->logits : NULL;
            } else {
                r->step[0] = r->next;
                r->n_draft = 0;
                if (!r->last && r->rows) {
                    /* drafts that fit the step, the context and max-tokens */
                    int64_t limit = room - 1;
                    const int64_t ctx_left = en->n_ctx - sl->n_tokens - 1;
                    const int64_t gen_left = r->go.max_tokens -
                                             shoal_gen_n_generated(r->gen) - 1;
                    limit = ctx_left < limit ? ctx_left : limit;
                    limit = gen_left < limit ? gen_left : limit;
                    const int mtp = shoal_ctx_has_mtp(en->s->ctx) &&
                                    r->sp.mode != SHOAL_SPEC_LOOKUP;
                    /* a lookup match first (none in mode mtp) */
                    r->n_draft = shoal_spec_plan(&r->sp, &en->cost, n_rows, n_dec, sl->tokens,
                                                 sl->n_tokens, r->next, limit, r->step + 1);
                    if (mtp && r->n_draft == 0) {
                        /* the model's MTP layers (mtp, or auto on a model with them):
                         * the gate first, then this sequence's drafts; a failed
                         * draft only means none (the step's bits never depend on it) */
                        shoal_spec_draft_estimate(&en->cost, en->s->model->cfg.n_layer);
                        const int64_t k = shoal_spec_choose(&r->sp, &en->cost, n_rows, n_dec,
                                                            limit);
                        struct shoal_err derr = {0};
                        const double td = shoal_time_s();
                        const int nd = k > 0 ? shoal_ctx_mtp_draft(en->s->ctx, i, r->next,
                                                                   (int)k, r->step + 1, NULL,
                                                                   &derr) : 0;
                        if (nd > 0)
                            shoal_spec_draft_cost_record(&en->cost, nd, shoal_time_s() - td);
                        r->n_draft = nd > 0 ? nd : 0;
                    }
                    n_rows += r->n_draft;
                }
                g->tokens = r->step;
                g->n = 1 + r->n_draft;
                g->all_logits = r->n_draft > 0;
                g->logits = r->last ? NULL : r->n_draft ? r->rows : r->logits;
            }
            en->seg_run[ns++] = r;
            room -= g->n;
        }
    }
    for (int k = 0; k < ns; k++)
        if (en->seg_run[k]->max_mates < ns)
            en->seg_run[k]->max_mates = ns;
    return ns;
}

/* The counters of the step about to run (metrics.h's step figures): its
 * kind (prompt rows in it or not), rows and the KV bytes its rows attend
 * over; acquires and bytes read are the store's before it (after_step_stat
 * turns them into the step's). */
static int before_step_stat(const struct engine *en, int ns, struct shoal_serve_step_stat *st,
                            struct shoal_expert_store_stats *s0)
{
    const struct shoal_model_config *c = &en->s->model->cfg;
    const double row_bytes = (double)shoal_kv_elems_per_token(c) *
                             (double)shoal_dtype_size(shoal_ctx_kv_dtype(en->s->ctx));
    int prefill = 0;
    memset(st, 0, sizeof *st);
    st->steps = 1;
    for (int k = 0; k < ns; k++) {
        const struct shoal_ctx_seg *g = &en->segs[k];
        prefill |= g->tokens != en->seg_run[k]->step;
        st->rows += (uint64_t)g->n;
        const int64_t p0 = en->slots[g->seq].n_tokens;
        double attended = 0;   /* cached rows, summed over the layers */
        for (int64_t il = 0; il < c->n_layer; il++) {
            const int win = shoal_layer_uses_window(c, il);
            for (int64_t j = 0; j < g->n; j++) {
                const int64_t n = p0 + j + 1;
                attended += (double)(win && c->sliding_window < n ? c->sliding_window : n);
            }
        }
        st->kv_bytes += attended * row_bytes;
    }
    if (en->s->model->store)
        shoal_expert_store_stats_get(en->s->model->store, s0);
    return prefill;
}

static void after_step_stat(const struct engine *en, int prefill, double seconds,
                            struct shoal_serve_step_stat *st,
                            const struct shoal_expert_store_stats *s0)
{
    st->seconds = seconds;
    if (en->s->model->store) {
        struct shoal_expert_store_stats s1;
        shoal_expert_store_stats_get(en->s->model->store, &s1);
        st->acquires = (s1.pinned_hits + s1.cache_hits + s1.inflight_hits + s1.disk_reads) -
                       (s0->pinned_hits + s0->cache_hits + s0->inflight_hits + s0->disk_reads);
        st->bytes_read = s1.bytes_read - s0->bytes_read;
    }
    shoal_serve_metrics_step(en->srv->metrics, prefill, st);
}

/* Sample run r's next token from logits ([n_vocab], modified): the
 * --test-logits-dir row, logprobs, --test-forced-tokens, the generation's
 * streaming. Returns what the run does next (*id: the token; -1 none);
 * SHOAL_GEN_ERROR with err set when the logits file cannot be written. */
static enum shoal_gen_action sample_row(struct engine *en, struct run *r, float *logits,
                                        double now, int32_t *id, struct shoal_err *err)
{
    struct slot *sl = &en->slots[r->seq];
    *id = -1;
    if (r->npy_open && shoal_gen_n_generated(r->gen) < r->go.max_tokens &&
        shoal_npy_append(&r->npy, logits, err))
        return SHOAL_GEN_ERROR;
    if (r->want_lp)   /* the sampler applies penalties in place */
        memcpy(r->lp_logits, logits, (size_t)en->n_vocab * sizeof(float));
    const int64_t k_gen = shoal_gen_n_generated(r->gen);
    if ((size_t)k_gen < r->n_forced)   /* tests: only that token can be drawn */
        for (int64_t i = 0; i < en->n_vocab; i++)
            logits[i] = i == r->forced[k_gen] ? 0.0f : -1e30f;
    const enum shoal_gen_action act =
        shoal_gen_next(r->gen, logits, sl->tokens, sl->n_tokens, en->n_ctx - sl->n_tokens,
                       id, err);
    if (r->want_lp && *id >= 0 && act != SHOAL_GEN_FEED_LAST)
        add_logprob(r, en->s, r->lp_logits, en->n_vocab, *id);
    flush_text(r, 0);
    if (*id >= 0 && !r->t_first)
        r->t_first = r->job->t_first = now;
    return act;
}

/* After a step: take each run's logits through its generation. A run that
 * carried drafts samples its rows in order, keeping each draft that equals
 * the token sampled before it (speculate.h: the tokens of a run without
 * drafts); the cache drops the drafts from the first one refused. */
static void after_step(struct engine *en, int ns)
{
    struct shoal_err err = {0};
    const double now = shoal_time_s();
    for (int k = 0; k < ns; k++) {
        struct run *r = en->seg_run[k];
        struct slot *sl = &en->slots[r->seq];
        const struct shoal_ctx_seg *g = &en->segs[k];
        const int64_t n_draft = g->tokens == r->step ? r->n_draft : 0;
        slot_push(sl, g->tokens, g->n - n_draft);   /* drafts once they are kept */
        if (r->last) {
            finish(en, r, 0);   /* the end token is in the cache */
            continue;
        }
        if (!g->logits)
            continue;           /* a prompt chunk before the last */
        if (!r->t_prefilled)
            r->t_prefilled = now;
        int64_t kept = 0;
        int end = 0;   /* 1: the run ends here, 2: it failed */
        for (int64_t j = 0;; j++) {
            int32_t id;
            const enum shoal_gen_action act =
                sample_row(en, r, n_draft ? r->rows + j * en->n_vocab : r->logits, now, &id,
                           &err);
            const int fed = act == SHOAL_GEN_FEED || act == SHOAL_GEN_FEED_LAST;
            if (j < n_draft && fed && id == r->step[1 + j]) {
                kept++;   /* in the cache already */
                slot_push(sl, &id, 1);
                if (act == SHOAL_GEN_FEED)
                    continue;   /* row j + 1 follows it */
                end = 1;        /* an end token, kept: it stays in the cache */
            } else if (act == SHOAL_GEN_ERROR) {
                fprintf(stderr, "shoal: %s: %s\n", r->job->id, err.msg);
                end = 2;
            } else if (act == SHOAL_GEN_END) {
                end = 1;
            } else {
                r->next = id;
                r->last = act == SHOAL_GEN_FEED_LAST;
            }
            break;
        }
        if (n_draft) {   /* the drafts from the first refused one go */
            shoal_ctx_seq_truncate(en->s->ctx, r->seq, sl->n_tokens);
            shoal_spec_record(&r->sp, n_draft, kept);
        }
        if (end)
            finish(en, r, end == 2);
    }
}

/* Cancelled runs end now (their slot is free for the next request); when
 * the server stops, every run ends with what it has. */
static void reap(struct engine *en, int stopping)
{
    for (int64_t i = 0; i < en->n_seq; i++) {
        struct run *r = en->slots[i].run;
        if (r && (r->job->cancel || stopping)) {
            shoal_gen_interrupt(r->gen);
            finish(en, r, 0);
        }
    }
}

/* Queued jobs into idle slots; cancelled queued jobs are dropped. When the
 * server stops, queued jobs get 503. Returns the number of runs. */
static int admit_all(struct engine *en, int stopping)
{
    struct server *srv = en->srv;
    for (;;) {
        int64_t idle = -1;
        for (int64_t i = 0; i < en->n_seq && idle < 0; i++)
            if (!en->slots[i].run)
                idle = i;
        pthread_mutex_lock(&srv->mu);
        struct job *j = (idle >= 0 || stopping) ? job_queue_pop(&srv->queue) : NULL;
        pthread_mutex_unlock(&srv->mu);
        if (!j)
            break;
        if (stopping) {
            struct shoal_api_error e;
            shoal_api_fail(&e, 503, "server_error", NULL, NULL, "the server is shutting down");
            job_fail(srv, j, &e);
        } else if (j->cancel) {
            struct shoal_api_error e;
            shoal_api_fail(&e, 499, "invalid_request_error", NULL, NULL,
                           "the client closed the connection");
            job_fail(srv, j, &e);
        } else {
            admit(en, j);
        }
    }
    int n = 0;
    for (int64_t i = 0; i < en->n_seq; i++)
        n += en->slots[i].run != NULL;
    return n;
}

static void note_jobs(struct engine *en, int force)
{
    struct server *srv = en->srv;
    const double now = shoal_time_s();
    if (!force && !en->jobs_changed && now - en->t_noted < 0.05)
        return;
    en->t_noted = now;
    en->jobs_changed = 0;
    enum { MAX_SHOWN = 64 };
    struct shoal_serve_job_stat js[MAX_SHOWN];
    int n = 0, n_queued = 0;
    for (int64_t i = 0; i < en->n_seq && n < MAX_SHOWN; i++) {
        const struct run *r = en->slots[i].run;
        if (!r)
            continue;
        const struct job *j = r->job;
        struct shoal_serve_job_stat *s = &js[n++];
        memset(s, 0, sizeof *s);
        snprintf(s->id, sizeof s->id, "%s", j->id);
        s->endpoint = job_endpoint(j);
        s->state = en->slots[i].n_tokens < r->n_prompt ? SHOAL_SERVE_JOB_PREFILL
                                                        : SHOAL_SERVE_JOB_DECODE;
        s->n_prompt = r->n_prompt;
        s->n_cached = j->n_cached;
        s->n_gen = shoal_gen_n_generated(r->gen);
        s->max_tokens = r->go.max_tokens;
        s->t_received = j->t_recv;
        if (s->n_gen > 1 && r->t_first > 0 && now > r->t_first)
            s->tok_per_s = (double)(s->n_gen - 1) / (now - r->t_first);
    }
    pthread_mutex_lock(&srv->mu);
    for (const struct job *j = srv->queue.head; j; j = j->next, n_queued++) {
        if (n == MAX_SHOWN)
            continue;
        struct shoal_serve_job_stat *s = &js[n++];
        memset(s, 0, sizeof *s);
        snprintf(s->id, sizeof s->id, "%s", j->id);
        s->endpoint = job_endpoint(j);
        s->state = SHOAL_SERVE_JOB_QUEUED;
        s->t_received = j->t_recv;
    }
    pthread_mutex_unlock(&srv->mu);
    shoal_serve_metrics_jobs(srv->metrics, js, n, n_queued, srv->cfg->parallel, srv->cfg->queue);
    shoal_serve_metrics_sample(srv->metrics, en->s);
}

void serve_batcher_run(struct server *srv)
{
    struct engine en = {.srv = srv, .s = srv->s};
    struct shoal_ctx *ctx = srv->s->ctx;
    en.n_seq = shoal_ctx_n_seq(ctx);
    en.n_ctx = shoal_ctx_n_ctx(ctx);
    en.n_batch = shoal_ctx_n_batch(ctx);
    en.n_vocab = srv->s->model->cfg.n_vocab;
    en.harmony = srv->s->tok && shoal_harmony_ids_of(srv->s->tok, &en.hids);
    en.slots = shoal_xcalloc((size_t)en.n_seq, sizeof *en.slots);
    en.segs = shoal_xcalloc((size_t)en.n_seq, sizeof *en.segs);
    en.seg_run = shoal_xcalloc((size_t)en.n_seq, sizeof *en.seg_run);
    struct shoal_err err = {0};
    const uint64_t model_id = srv->cfg->slot_dir ? serve_slots_model_id(srv->s->model) : 0;
    for (int64_t i = 0; srv->cfg->slot_dir && i < en.n_seq; i++) {
        struct slot *sl = &en.slots[i];
        int rc = serve_slots_load(srv->cfg->slot_dir, srv->s, model_id, i, &sl->tokens,
                                  &sl->n_tokens, &err);
        sl->cap = sl->n_tokens;
        if (rc < 0)
            fprintf(stderr, "shoal serve: --slot-dir: %s; slot %lld starts empty\n", err.msg,
                    (long long)i);
        else if (rc == 0)
            fprintf(stderr, "shoal serve: slot %lld: %lld tokens from --slot-dir\n",
                    (long long)i, (long long)sl->n_tokens);
    }
    for (;;) {
        pthread_mutex_lock(&srv->mu);
        int stopping = srv->stopping;
        pthread_mutex_unlock(&srv->mu);
        reap(&en, stopping);
        int n_runs = admit_all(&en, stopping);
        /* idle, or a run started or ended: post now (before a new run's
         * first token can reach its client) */
        if (n_runs == 0 || en.jobs_changed)
            note_jobs(&en, 1);
        if (n_runs == 0) {
            pthread_mutex_lock(&srv->mu);
            while (!srv->queue.head && !srv->stopping)
                pthread_cond_wait(&srv->cv, &srv->mu);
            const int done = srv->stopping && !srv->queue.head;
            pthread_mutex_unlock(&srv->mu);
            if (done)
                break;
            continue;
        }
        const int ns = build_step(&en);
        int64_t rows = 0;
        for (int k = 0; k < ns; k++)
            rows += en.segs[k].n;
        struct shoal_serve_step_stat sst;
        struct shoal_expert_store_stats s0;
        const int prefill = before_step_stat(&en, ns, &sst, &s0);
        const double t_step = shoal_time_s();
        if (shoal_ctx_eval_segs(ctx, en.segs, ns, &err)) {
            /* nothing was appended (positions advance only after a whole
             * step): the step's requests fail, their slots stay usable */
            fprintf(stderr, "shoal: %s\n", err.msg);
            for (int k = 0; k < ns; k++)
                finish(&en, en.seg_run[k], 1);
            continue;
        }
        const double dt_step = shoal_time_s() - t_step;
        shoal_spec_cost_record(&en.cost, rows, dt_step);
        after_step_stat(&en, prefill, dt_step, &sst, &s0);
        after_step(&en, ns);
        note_jobs(&en, 0);
        if (srv->cfg->token_delay_ms)
            usleep(srv->cfg->token_delay_ms * 1000u);
    }
    for (int64_t i = 0; i < en.n_seq; i++) {
        const struct slot *sl = &en.slots[i];
        if (srv->cfg->slot_dir && sl->n_tokens > 0) {
            if (serve_slots_save(srv->cfg->slot_dir, srv->s, model_id, i, sl->tokens,
                                 sl->n_tokens, &err))
                fprintf(stderr, "shoal serve: --slot-dir: %s\n", err.msg);
            else
                fprintf(stderr, "shoal serve: slot %lld: %lld tokens saved\n", (long long)i,
                        (long long)sl->n_tokens);
        }
        free(sl->tokens);
    }
    free(en.slots);
    free(en.segs);
    free(en.seg_run);
}
