/* The harmony reply parser (see harmony.h). */
#include "harmony.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

int shoal_harmony_ids_of(const struct shoal_tokenizer *tok, struct shoal_harmony_ids *ids)
{
    ids->start = shoal_tokenizer_token_id(tok, "<|start|>");
    ids->channel = shoal_tokenizer_token_id(tok, "<|channel|>");
    ids->message = shoal_tokenizer_token_id(tok, "<|message|>");
    ids->end = shoal_tokenizer_token_id(tok, "<|end|>");
    ids->ret = shoal_tokenizer_token_id(tok, "<|return|>");
    ids->call = shoal_tokenizer_token_id(tok, "<|call|>");
    ids->constrain = shoal_tokenizer_token_id(tok, "<|constrain|>");
    return ids->start >= 0 && ids->channel >= 0 && ids->message >= 0 && ids->end >= 0;
}

int shoal_chat_end_ids(const struct shoal_tokenizer *tok, int32_t *ids, int max)
{
    struct shoal_harmony_ids h;
    const int harmony = shoal_harmony_ids_of(tok, &h);
    static const char *const end_of_turn[] = {"<|im_end|>", "<|eot_id|>", "<|end|>",
                                              "<end_of_turn>", "<|endoftext|>"};
    int n = 0;
    for (size_t k = 0; k < sizeof end_of_turn / sizeof end_of_turn[0] && n < max; k++) {
        int32_t id = shoal_tokenizer_token_id(tok, end_of_turn[k]);
        if (id >= 0 && !(harmony && id == h.end))
            ids[n++] = id;
    }
    if (harmony && h.ret >= 0 && n < max)
        ids[n++] = h.ret;
    if (harmony && h.call >= 0 && n < max)
        ids[n++] = h.call;
    return n;
}

void shoal_harmony_init(struct shoal_harmony *h, const struct shoal_harmony_ids *ids)
{
    memset(h, 0, sizeof *h);
    h->ids = *ids;
}

void shoal_harmony_free(struct shoal_harmony *h)
{
    free(h->final);
    free(h->analysis);
    free(h->call_args);
    h->final = h->analysis = h->call_args = NULL;
    h->final_len = h->analysis_len = h->call_len = 0;
    h->final_cap = h->analysis_cap = h->call_cap = 0;
}

static void buf_add(char **b, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 1 > *cap) {
        *cap = (*len + n + 1) * 2;
        *b = shoal_xrealloc(*b, *cap);
    }
    memcpy(*b + *len, s, n);
    *len += n;
    (*b)[*len] = '\0';
}

/* The header between <|start|> (or the generation prompt) and <|message|>,
 * e.g. "assistant<|channel|>commentary to=functions.f <|constrain|>json":
 * the channel is the word after <|channel|> (kept in the header as "\x01"),
 * the recipient the word after "to=". */
static void parse_header(struct shoal_harmony *h)
{
    const char *hd = h->header;
    const char *c = strchr(hd, '\x01');
    h->channel = SHOAL_HARMONY_NONE;
    if (c) {
        c++;
        while (*c == ' ')
            c++;
        size_t w = strcspn(c, " \x01\x02");
        if (w == 8 && !strncmp(c, "analysis", 8))
            h->channel = SHOAL_HARMONY_ANALYSIS;
        else if (w == 10 && !strncmp(c, "commentary", 10))
            h->channel = SHOAL_HARMONY_COMMENTARY;
        else if (w == 5 && !strncmp(c, "final", 5))
            h->channel = SHOAL_HARMONY_FINAL;
        else
            h->channel = SHOAL_HARMONY_OTHER;
    }
    h->recipient[0] = '\0';
    for (const char *p = hd; (p = strstr(p, "to=")) != NULL; p += 3) {
        if (p != hd && p[-1] != ' ' && p[-1] != '\x01')
            continue; /* "to=" inside another word */
        size_t w = strcspn(p + 3, " \x01\x02");
        if (w >= sizeof h->recipient)
            w = sizeof h->recipient - 1;
        memcpy(h->recipient, p + 3, w);
        h->recipient[w] = '\0';
        break;
    }
}

static void header_add(struct shoal_harmony *h, const char *s, size_t n)
{
    size_t room = sizeof h->header - 1 - h->header_len;
    if (n > room)
        n = room; /* a header is a few words; a runaway one is cut */
    memcpy(h->header + h->header_len, s, n);
    h->header_len += n;
    h->header[h->header_len] = '\0';
}

enum shoal_harmony_event shoal_harmony_feed(struct shoal_harmony *h, int32_t id,
                                            const char *text, size_t n)
{
    /* id -1: text without a token (held-back bytes); -1 is also the id of
     * an absent marker, so markers are matched only for real ids */
    struct shoal_harmony_ids m0 = h->ids;
    if (id < 0)
        m0.start = m0.channel = m0.message = m0.end = m0.ret = m0.call =
            m0.constrain = INT32_MIN;
    const struct shoal_harmony_ids *m = &m0;
    if (id == m->end || id == m->ret || id == m->call) {
        enum shoal_harmony_event ev = id == m->end   ? SHOAL_HARMONY_EV_END
                                      : id == m->ret ? SHOAL_HARMONY_EV_RETURN
                                                     : SHOAL_HARMONY_EV_CALL;
        if (!h->in_body && ev != SHOAL_HARMONY_EV_RETURN)
            ev = SHOAL_HARMONY_EV_NONE; /* no body: no message ended, no call made */
        h->in_body = 0;
        h->header_len = 0;
        h->header[0] = '\0';
        return ev;
    }
    if (id == m->start) {
        /* a new message: its header follows (a body left open is over) */
        h->in_body = 0;
        h->header_len = 0;
        h->header[0] = '\0';
        return SHOAL_HARMONY_EV_NONE;
    }
    if (id == m->message) {
        parse_header(h);
        h->in_body = 1;
        h->header_len = 0;
        h->header[0] = '\0';
        if (h->recipient[0])
            h->call_len = 0; /* the arguments of this call only */
        return SHOAL_HARMONY_EV_BEGIN;
    }
    if (!h->in_body) {
        if (id == m->channel)
            header_add(h, "\x01", 1);
        else if (id == m->constrain)
            header_add(h, "\x02", 1);
        else
            header_add(h, text, n);
        return SHOAL_HARMONY_EV_NONE;
    }
    if (id == m->channel || id == m->constrain)
        return SHOAL_HARMONY_EV_NONE; /* a stray marker inside a body */
    if (h->channel == SHOAL_HARMONY_FINAL || h->channel == SHOAL_HARMONY_NONE)
        buf_add(&h->final, &h->final_len, &h->final_cap, text, n);
    else if (h->channel == SHOAL_HARMONY_ANALYSIS)
        buf_add(&h->analysis, &h->analysis_len, &h->analysis_cap, text, n);
    if (h->recipient[0])
        buf_add(&h->call_args, &h->call_len, &h->call_cap, text, n);
    return SHOAL_HARMONY_EV_TEXT;
}

/* Whether the body of h's current message is shown as plain reply text,
 * as a marked reasoning block, or not at all (1, 2, 0). */
static int show_kind(const struct shoal_harmony *h, int show_reasoning)
{
    switch (h->channel) {
    case SHOAL_HARMONY_FINAL:
    case SHOAL_HARMONY_NONE:
        return 1;
    case SHOAL_HARMONY_COMMENTARY:
        return h->recipient[0] ? 0 : 1;
    default:
        return show_reasoning ? 2 : 0;
    }
}

static const char *channel_name(enum shoal_harmony_channel c)
{
    return c == SHOAL_HARMONY_ANALYSIS ? "analysis" : "other channel";
}

void shoal_harmony_show(struct shoal_harmony *h, enum shoal_harmony_event ev,
                        const char *text, size_t n, int show_reasoning, int color,
                        FILE *out)
{
    int kind = show_kind(h, show_reasoning);
    switch (ev) {
    case SHOAL_HARMONY_EV_BEGIN:
        /* each shown message on a line of its own */
        if (kind && h->shown_any) {
            fputc('\n', out);
            h->shown_any = 0;
        }
        if (kind == 2) {
            fprintf(out, "%s[%s] ", color ? "\x1b[2m" : "", channel_name(h->channel));
            h->hidden_open = 1;
            h->shown_any = 1;
        }
        break;
    case SHOAL_HARMONY_EV_TEXT:
        if (kind && n) {
            fwrite(text, 1, n, out);
            h->shown_any = 1;
        }
        break;
    case SHOAL_HARMONY_EV_END:
    case SHOAL_HARMONY_EV_RETURN:
    case SHOAL_HARMONY_EV_CALL:
        if (h->hidden_open) {
            fputs(color ? "\x1b[0m\n" : "\n", out);
            h->hidden_open = 0;
            h->shown_any = 0; /* the next block starts on a fresh line */
        }
        if (ev == SHOAL_HARMONY_EV_CALL) {
            fprintf(out, "%s[tool call to %s: %s]", h->shown_any ? "\n" : "",
                    h->recipient[0] ? h->recipient : "?",
                    h->call_args ? h->call_args : "");
            h->shown_any = 1;
        }
        break;
    case SHOAL_HARMONY_EV_NONE:
        break;
    }
}
