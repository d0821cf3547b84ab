/* The harmony response format of gpt-oss (openai/harmony docs/format.md):
 * a reply is a sequence of messages
 *   <|start|>ROLE[ to=RECIPIENT]<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>TYPE]<|message|>TEXT END
 * where END is <|end|> (more messages follow), <|return|> (the final answer
 * is complete) or <|call|> (a tool call: the caller runs it). The chat
 * template's generation prompt ends with "<|start|>assistant", so a reply
 * starts inside a header: "<|channel|>analysis<|message|>...".
 *
 * shoal_harmony is a small state machine fed one generated token at a time
 * (the markers are single special ids, so a marker is never split across
 * feeds); it says, per token, whether the token is header, marker or message
 * text, and for text, of which channel; it keeps the final and analysis
 * texts of the reply and the recipient of a tool call. No allocation per
 * token beyond the growing text buffers. */
#ifndef SHOAL_HARMONY_H
#define SHOAL_HARMONY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "tokenizer.h"

enum shoal_harmony_channel {
    SHOAL_HARMONY_NONE = 0,   /* no channel named in the header */
    SHOAL_HARMONY_ANALYSIS,   /* chain of thought: hidden unless asked */
    SHOAL_HARMONY_COMMENTARY, /* tool calls (with a recipient) and preambles */
    SHOAL_HARMONY_FINAL,      /* the answer shown to the user */
    SHOAL_HARMONY_OTHER,      /* a channel name harmony does not define */
};

enum shoal_harmony_event {
    SHOAL_HARMONY_EV_NONE = 0,  /* header text or a marker: nothing to show */
    SHOAL_HARMONY_EV_BEGIN,     /* <|message|>: a message body of .channel starts */
    SHOAL_HARMONY_EV_TEXT,      /* the token's text belongs to the body of .channel */
    SHOAL_HARMONY_EV_END,       /* <|end|>: the message of .channel ended, more may follow */
    SHOAL_HARMONY_EV_RETURN,    /* <|return|>: the reply is complete */
    SHOAL_HARMONY_EV_CALL,      /* <|call|>: the message is a tool call to .recipient */
};

/* The marker ids of a vocabulary (-1 where absent). */
struct shoal_harmony_ids {
    int32_t start, channel, message, end, ret, call, constrain;
};

struct shoal_harmony {
    struct shoal_harmony_ids ids;
    int in_body;                         /* between <|message|> and its end marker */
    enum shoal_harmony_channel channel;  /* of the current (or last) message */
    char header[256];                    /* header text of the current message, cut */
    size_t header_len;
    char recipient[128];                 /* "functions.f" from " to=functions.f", or "" */
    char *final;                         /* malloc'd, NUL-terminated: every final (or
                                            channel-less) body, NULL while none */
    size_t final_len, final_cap;
    char *analysis;                      /* likewise for the analysis bodies */
    size_t analysis_len, analysis_cap;
    char *call_args;                     /* the body of the last message with a recipient */
    size_t call_len, call_cap;
    int hidden_open;                     /* shoal_harmony_show: a marked block is open */
    int shown_any;                       /* shoal_harmony_show: visible text was written */
};

/* The harmony marker ids of tok. Returns 1 when the vocabulary has
 * <|start|>, <|channel|>, <|message|> and <|end|> as tokens (a harmony
 * vocabulary such as gpt-oss's o200k_harmony), else 0. Thread: any. */
int shoal_harmony_ids_of(const struct shoal_tokenizer *tok, struct shoal_harmony_ids *ids);

/* The token ids that end a chat reply with tok's vocabulary: the
 * end-of-turn markers chat templates write (<|im_end|>, <|eot_id|>,
 * <|end|>, <end_of_turn>, <|endoftext|>) that are tokens of tok; for a
 * harmony vocabulary <|return|> and <|call|> instead of <|end|> (which
 * closes one message). Writes at most max ids; returns how many.
 * Thread: any. */
int shoal_chat_end_ids(const struct shoal_tokenizer *tok, int32_t *ids, int max);

/* Start a reply: the state right after the generation prompt
 * "<|start|>assistant" (inside a header). h is overwritten; free with
 * shoal_harmony_free. ids borrowed by value. Thread: the caller's. */
void shoal_harmony_init(struct shoal_harmony *h, const struct shoal_harmony_ids *ids);

/* Feed one generated token: its id and the text the detokenizer gave for it
 * (text may be empty, and is ignored for marker ids; id -1: text that is no
 * marker, e.g. bytes the detokenizer held back). Returns the event;
 * for EV_TEXT the text is appended to h->final or h->analysis per channel
 * (and to h->call_args when the message has a recipient). Thread: the
 * caller's. */
enum shoal_harmony_event shoal_harmony_feed(struct shoal_harmony *h, int32_t id,
                                            const char *text, size_t n);

/* What shoal chat shows of a reply, per fed token (ev and text as fed):
 * the final channel's text (and a commentary message without recipient, a
 * preamble meant for the user) as it streams; the analysis channel (and
 * any channel harmony does not define) only when show_reasoning, each
 * message on its own line starting "[analysis] " (the channel's name), in
 * dim (ESC[2m ... ESC[0m) when color; a tool call, at its <|call|>, as one
 * line "[tool call to RECIPIENT: ARGUMENTS]". Writes to out, which is not
 * flushed. Thread: the caller's. */
void shoal_harmony_show(struct shoal_harmony *h, enum shoal_harmony_event ev,
                        const char *text, size_t n, int show_reasoning, int color,
                        FILE *out);

/* Free the text buffers (h itself is the caller's). */
void shoal_harmony_free(struct shoal_harmony *h);

#endif
