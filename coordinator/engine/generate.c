/* generate: one sequence's generation state (sample, detokenize, stream,
 * stop) as struct shoal_gen. `shoal run` and `shoal chat` drive one
 * (cli/generate_loop.c), `shoal serve` many at once over one
 * multi-sequence context (session.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "session.h"
#include "util.h"

void shoal_session_history_push(struct shoal_session *s, const int32_t *ids, size_t n)
{
    if (s->n_history + (int64_t)n > s->cap_history) {
        s->cap_history = (s->n_history + (int64_t)n) * 2 + 64;
        s->history = shoal_xrealloc(s->history, (size_t)s->cap_history * sizeof(int32_t));
    }
    memcpy(s->history + s->n_history, ids, n * sizeof(int32_t));
    s->n_history += (int64_t)n;
}

static int is_eos(const struct shoal_session *s, const struct shoal_gen_opts *o,
                  int32_t id)
{
    const struct shoal_model_config *c = &s->model->cfg;
    for (int i = 0; i < o->n_stop_ids; i++)
        if (o->stop_ids[i] == id)
            return 1;
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == id)
            return 1;
    return s->tok && shoal_tokenizer_eos(s->tok) == id;
}

/* Text generated so far and how much of it was printed: a suffix that could
 * still become a stop string is held back. */
struct stream_state {
    char *text;
    size_t len, cap, printed;
    int write_errno;   /* the output could not be written: why (EIO if unknown) */
};

/* The first occurrence of needle [m] in hay [n] (bytes: generated text can
 * hold NUL bytes, so not strstr), or NULL. */
static const char *find_bytes(const char *hay, size_t n, const char *needle, size_t m)
{
    if (m == 0 || m > n)
        return m == 0 ? hay : NULL;
    for (const char *p = hay, *end = hay + n - m + 1; p < end; p++) {
        p = memchr(p, (unsigned char)needle[0], (size_t)(end - p));
        if (!p)
            return NULL;
        if (!memcmp(p, needle, m))
            return p;
    }
    return NULL;
}

static void stream_append(struct stream_state *st, const char *p, size_t n)
{
    if (st->len + n + 1 > st->cap) {
        st->cap = (st->len + n + 1) * 2;
        st->text = shoal_xrealloc(st->text, st->cap);
    }
    memcpy(st->text + st->len, p, n);
    st->len += n;
    st->text[st->len] = '\0';
}

/* Returns 1 if a stop string occurred (text is cut before it). Prints what
 * is safe to print. */
static int stream_emit(struct stream_state *st, const struct shoal_gen_opts *o,
                       FILE *out, int final)
{
    size_t safe = st->len;
    int stopped = 0;
    for (int k = 0; k < o->n_stop; k++) {
        const char *hit = find_bytes(st->text, st->len, o->stop[k], strlen(o->stop[k]));
        if (hit && (size_t)(hit - st->text) < safe) {
            safe = (size_t)(hit - st->text);
            stopped = 1;
        }
    }
    if (!stopped && !final) {
        /* hold back the longest suffix that is a proper prefix of a stop string */
        for (int k = 0; k < o->n_stop; k++) {
            size_t sl = strlen(o->stop[k]);
            for (size_t l = sl - 1; l > 0; l--) {
                if (l <= st->len && !memcmp(st->text + st->len - l, o->stop[k], l)) {
                    if (st->len - l < safe)
                        safe = st->len - l;
                    break;
                }
            }
        }
    }
    if (safe > st->printed) {
        if (o->on_text) {
            o->on_text(o->on_text_user, st->text + st->printed, safe - st->printed);
        } else {
            /* through the log: a log line meanwhile starts its own line */
            if (shoal_log_text(out, st->text + st->printed, safe - st->printed) &&
                !st->write_errno)
                st->write_errno = errno ? errno : EIO;
        }
        st->printed = safe;
    }
    return stopped;
}

struct shoal_gen {
    const struct shoal_session *s;   /* borrowed: tokenizer, model config */
    const struct shoal_gen_opts *o;  /* borrowed */
    FILE *out;
    struct shoal_sampler *smp;
    struct shoal_detok *dt;
    struct stream_state st;
    char *piece;
    size_t piece_cap;
    int64_t n_gen;
    int32_t last_id;
    enum shoal_stop_reason reason;
    const char *why;
    int ended;
};

struct shoal_gen *shoal_gen_create(const struct shoal_session *s, const struct shoal_gen_opts *o,
                                   FILE *out)
{
    struct shoal_gen *g = shoal_xcalloc(1, sizeof *g);
    g->s = s;
    g->o = o;
    g->out = out;
    g->smp = shoal_sampler_create(o->sampling, s->model->cfg.n_vocab);
    g->dt = s->tok ? shoal_detok_create(s->tok, 1) : NULL;
    g->piece_cap = 1024;
    if (s->tok && shoal_detok_out_max(s->tok) > g->piece_cap)
        g->piece_cap = shoal_detok_out_max(s->tok);
    g->piece = shoal_xmalloc(g->piece_cap);
    g->last_id = -1;
    g->reason = SHOAL_STOP_MAX_TOKENS;
    g->why = "max tokens";
    return g;
}

enum shoal_gen_action shoal_gen_next(struct shoal_gen *g, float *logits, const int32_t *history,
                                     int64_t n_history, int64_t room, int32_t *id_out,
                                     struct shoal_err *err)
{
    const struct shoal_gen_opts *o = g->o;
    *id_out = -1;
    if (g->ended || g->n_gen >= o->max_tokens) {
        g->ended = 1;
        return SHOAL_GEN_END;
    }
    if (shoal_logits_check(logits, g->s->model->cfg.n_vocab, err,
                           "the model's logits for generated token %lld",
                           (long long)g->n_gen + 1)) {
        g->ended = 1;
        g->why = "error";
        g->reason = SHOAL_STOP_ERROR;
        return SHOAL_GEN_ERROR;
    }
    const int32_t id = shoal_sampler_sample(g->smp, logits, history, n_history);
    *id_out = id;
    g->last_id = id;
    g->n_gen++;
    g->ended = 1;   /* unless it goes on below */
    if (is_eos(g->s, o, id) && !o->ignore_eos) {
        g->why = "end of sequence";
        g->reason = SHOAL_STOP_EOS;
        /* the end token is part of the turn: it goes into the cache */
        return room > 0 ? SHOAL_GEN_FEED_LAST : SHOAL_GEN_END;
    }
    if (g->dt && id >= shoal_tokenizer_n_vocab(g->s->tok)) {
        /* the model's vocabulary may be padded past the tokenizer's
         * (OLMoE: 50304 vs 50280); such ids have no text */
    } else if (g->dt) {
        int n = shoal_detok_feed(g->dt, id, g->piece, g->piece_cap, err);
        if (n < 0) {
            g->reason = SHOAL_STOP_ERROR;
            return SHOAL_GEN_ERROR;
        }
        if (o->on_token) {
            if (o->on_token(o->on_token_user, id, g->piece, (size_t)n)) {
                g->why = "stopped by the caller";
                g->reason = SHOAL_STOP_STRING;
                return SHOAL_GEN_END;
            }
        } else {
            stream_append(&g->st, g->piece, (size_t)n);
        }
    } else {
        int n = snprintf(g->piece, g->piece_cap, "[%d]", id);
        stream_append(&g->st, g->piece, (size_t)n);
    }
    const int stopped = stream_emit(&g->st, o, g->out, 0);
    if (g->st.write_errno) {   /* a full disk, a closed pipe: the text is lost */
        g->why = "error";
        g->reason = SHOAL_STOP_ERROR;
        shoal_err_set(err, SHOAL_EIO, "cannot write the output: %s",
                      strerror(g->st.write_errno));
        return SHOAL_GEN_ERROR;
    }
    if (stopped) {
        g->why = "stop string";
        g->reason = SHOAL_STOP_STRING;
        return SHOAL_GEN_END;
    }
    if (g->n_gen == o->max_tokens)
        return SHOAL_GEN_END;
    if (room <= 0) {
        g->why = "context full";
        g->reason = SHOAL_STOP_CONTEXT_FULL;
        return SHOAL_GEN_END;
    }
    g->ended = 0;
    return SHOAL_GEN_FEED;
}

void shoal_gen_interrupt(struct shoal_gen *g)
{
    if (g->ended)
        return;
    g->ended = 1;
    g->why = "interrupted";
    g->reason = SHOAL_STOP_INTERRUPTED;
}

int64_t shoal_gen_n_generated(const struct shoal_gen *g) { return g->n_gen; }
size_t shoal_gen_n_printed(const struct shoal_gen *g) { return g->st.printed; }

const char *shoal_gen_why(const struct shoal_gen *g) { return g->why; }

char *shoal_gen_finish(struct shoal_gen *g, int failed, size_t *n_text)
{
    const struct shoal_gen_opts *o = g->o;
    if (g->dt) {
        int n = shoal_detok_flush(g->dt, g->piece, g->piece_cap);
        if (n > 0 && o->on_token)
            o->on_token(o->on_token_user, -1, g->piece, (size_t)n);
        else if (n > 0)
            stream_append(&g->st, g->piece, (size_t)n);
    }
    if (g->st.len)
        stream_emit(&g->st, o, g->out, 1);
    /* what the user saw: up to a stop string, if one was hit */
    char *text = g->st.text ? g->st.text : shoal_xcalloc(1, 1);
    text[g->st.printed] = '\0';
    if (n_text)
        *n_text = g->st.text ? g->st.printed : 0;
    if (o->result) {
        o->result->n_generated = g->n_gen;
        o->result->last_id = g->last_id;
        o->result->reason = failed ? SHOAL_STOP_ERROR : g->reason;
    }
    shoal_detok_destroy(g->dt);
    shoal_sampler_free(g->smp);
    free(g->piece);
    free(g);
    return text;
}
