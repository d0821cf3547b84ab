/* api: the OpenAI-compatible request and response JSON of `shoal serve`
 * (POST /v1/completions, POST /v1/chat/completions, GET /v1/models), with
 * jansson. No HTTP and no engine here: a request body in, a parsed request
 * or an error object out; text and counts in, response bytes out.
 * Thread: any (no shared state).
 */
#ifndef SHOAL_API_H
#define SHOAL_API_H

#include <stddef.h>
#include <stdint.h>

#define SHOAL_API_MAX_STOP 16

enum shoal_api_kind {
    SHOAL_API_COMPLETION = 0,   /* /v1/completions: a prompt string */
    SHOAL_API_CHAT,             /* /v1/chat/completions: messages */
};

/* The token counts of a reply's "usage": prompt_tokens, completion_tokens,
 * total_tokens and prompt_tokens_details.cached_tokens (n_cached: prompt
 * tokens found in a slot's KV cache, not prefilled again). */
struct shoal_api_usage {
    int64_t n_prompt;
    int64_t n_cached;
    int64_t n_completion;
};

/* An error as OpenAI shapes it: {"error": {"message", "type", "param",
 * "code"}} with an HTTP status. */
struct shoal_api_error {
    int status;                 /* 400, 401, 404, 413, 429, 500, 503, ... */
    const char *type;           /* static: "invalid_request_error", ... */
    char param[64];             /* the request field at fault, "" for none */
    char code[48];              /* e.g. "context_length_exceeded", "" for none */
    char message[512];          /* one line */
};

/* Fill e (status, type, param/code may be NULL) with a printf message;
 * returns -1 (for `return shoal_api_fail(...)`). */
int shoal_api_fail(struct shoal_api_error *e, int status, const char *type,
                   const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* What a request asks for. Strings are malloc'd and owned by the request
 * (shoal_api_request_free). has_* say whether the field was given; fields
 * not given keep the server's defaults. */
struct shoal_api_request {
    enum shoal_api_kind kind;
    char *model;              /* "model" as given, or NULL */
    char *prompt;             /* completions: the prompt text (NULL when given as ids) */
    int32_t *prompt_tokens;   /* completions: the prompt as token ids [n_prompt_tokens],
                               * or NULL; each >= 0 (the engine checks the vocabulary) */
    size_t n_prompt_tokens;
    char *messages_json;      /* chat: the "messages" array as JSON, each
                               * content given as a list of text parts
                               * joined into one string; an assistant
                               * message with tool_calls and no content has
                               * "content": null */
    char *messages_json_empty; /* chat: messages_json with each null content
                               * as "" (for a template that cannot take
                               * none), or NULL when no content is null */
    char *template_vars_json; /* chat: a JSON object of extra chat template
                               * variables, or NULL: "chat_template_kwargs"'s
                               * members and "tools" (a list of objects,
                               * OpenAI's {"type": "function", "function":
                               * {...}} as given), as transformers'
                               * apply_chat_template(tools=..., **kwargs) */
    int stream;               /* "stream": true */
    int include_usage;        /* "stream_options": {"include_usage": true} */
    int64_t max_tokens;       /* max_tokens or max_completion_tokens; -1: not given */
    int has_temperature, has_top_p, has_top_k, has_min_p, has_seed;
    int has_presence_penalty, has_frequency_penalty;
    double temperature, top_p, min_p;
    double presence_penalty, frequency_penalty;   /* -2..2, as OpenAI's */
    /* Per-token log probabilities: chat "logprobs": true (with
     * "top_logprobs": 0..20 alternatives, which needs logprobs true), or
     * completions "logprobs": 0..5 (the number of alternatives). logprobs 0:
     * none asked for. */
    int logprobs;
    int top_logprobs;
    int64_t top_k;
    uint64_t seed;
    char *stop[SHOAL_API_MAX_STOP];   /* "stop": a string or a list of them */
    int n_stop;
};

/* Parse and check a request body of kind (len bytes, need not be
 * NUL-terminated). Unknown fields are ignored, as OpenAI does. Returns 0
 * with *req filled (free with shoal_api_request_free, also on failure), or
 * -1 with e set to a 400 naming the field: not JSON (or not UTF-8), not an
 * object, a field of the wrong type or out of range, no prompt/messages, a
 * message whose role is not one of OpenAI's (system, developer, user,
 * assistant, tool, function; param "messages[i].role"), a content that is
 * null or missing except on an assistant message with tool_calls, or not
 * text ("messages[i].content"), n > 1, chat top_logprobs without logprobs:
 * true, and what is not served yet: completions "echo": true, a
 * "response_format" other than {"type": "text"} (no constrained decoding). */
int shoal_api_parse_request(enum shoal_api_kind kind, const char *body, size_t len,
                            struct shoal_api_request *req, struct shoal_api_error *e);

void shoal_api_request_free(struct shoal_api_request *req);

/* Log probabilities of generated tokens, for the response builders. All
 * pointers are borrowed. A token's text is its bytes as the detokenizer
 * gave them (a token may hold part of a UTF-8 sequence: its "token" string
 * then shows U+FFFD where "bytes" keeps the real bytes). logprob: natural
 * log of the token's probability under the distribution it was drawn from;
 * -inf (or NaN) is written as -9999.0, as OpenAI does. */
struct shoal_api_top_logprob {
    const char *text;
    size_t n;
    float logprob;
};

struct shoal_api_token_logprob {
    const char *text;                          /* [n] bytes */
    size_t n;
    float logprob;
    const struct shoal_api_top_logprob *top;   /* [n_top] the likeliest alternatives,
                                                * likeliest first (the chosen one may
                                                * be among them) */
    int n_top;
};

struct shoal_api_logprobs {
    const struct shoal_api_token_logprob *tokens;   /* [n_tokens], in order */
    size_t n_tokens;
    /* completions' text_offset: where the first token starts, in Unicode
     * characters of the completion text (0 for a whole response; for a
     * chunk, the characters streamed before it). Each next token starts
     * after the previous one's characters (its bytes that are not UTF-8
     * continuation bytes). Chat ignores it. */
    int64_t text_offset;
};

/* The response bytes; each a malloc'd NUL-terminated JSON text the caller
 * frees. id: "cmpl-..." or "chatcmpl-..."; created: Unix seconds; model:
 * the model's id; text [n] UTF-8 (invalid sequences become U+FFFD);
 * finish: "stop", "length" or NULL (not finished); lp: the log
 * probabilities of the tokens the text (or chunk) holds, or NULL for
 * "logprobs": null. Shapes: chat "logprobs": {"content": [{"token",
 * "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}],
 * "refusal": null}; completions "logprobs": {"tokens": [...],
 * "token_logprobs": [...], "top_logprobs": [{token: logprob, ...}],
 * "text_offset": [...]} (an alternative whose text repeats an earlier
 * one's is left out of its object). */

/* The whole response: a text_completion or a chat.completion, with usage
 * (usage: {"prompt_tokens", "completion_tokens", "total_tokens",
 * "prompt_tokens_details": {"cached_tokens"}}). */
char *shoal_api_response_json(enum shoal_api_kind kind, const char *id, int64_t created,
                              const char *model, const char *text, size_t n,
                              const char *finish, struct shoal_api_usage usage,
                              const struct shoal_api_logprobs *lp);

/* One streamed chunk (text_completion or chat.completion.chunk). Chat: role
 * set gives the first delta {"role": "assistant", "content": ""}; text NULL
 * with finish set gives the last, {"delta": {}}. */
char *shoal_api_chunk_json(enum shoal_api_kind kind, const char *id, int64_t created,
                           const char *model, int role, const char *text, size_t n,
                           const char *finish, const struct shoal_api_logprobs *lp);

/* A chat reply in parts, for models whose replies have channels (gpt-oss's
 * harmony format): the message "content" (the final answer), its
 * "reasoning_content" (the analysis channel; the field vLLM, llama-server
 * and DeepSeek's API use) and at most one tool call, in OpenAI's shape
 * "tool_calls": [{"id", "type": "function", "function": {"name",
 * "arguments"}}] (a streamed delta adds "index": 0). Pointers borrowed;
 * text need not be NUL-terminated (invalid UTF-8 becomes U+FFFD). */
struct shoal_api_chat_parts {
    const char *content;        /* [n_content]; NULL: whole "content": null, a
                                 * delta leaves it out */
    size_t n_content;
    const char *reasoning;      /* [n_reasoning]; NULL: no "reasoning_content" */
    size_t n_reasoning;
    const char *tool_name;      /* NUL-terminated; NULL: no tool call */
    const char *tool_args;      /* [n_tool_args]: the arguments as the model wrote
                                 * them (JSON text, not checked) */
    size_t n_tool_args;
    const char *tool_call_id;   /* NUL-terminated, e.g. "call_..." */
};

/* The whole chat.completion of a reply in parts: message {"role":
 * "assistant", "content", "reasoning_content"?, "tool_calls"?}; the other
 * arguments as shoal_api_response_json's (finish may be "tool_calls"). */
char *shoal_api_chat_response_json(const char *id, int64_t created, const char *model,
                                   const struct shoal_api_chat_parts *m, const char *finish,
                                   struct shoal_api_usage usage,
                                   const struct shoal_api_logprobs *lp);

/* One chat.completion.chunk whose delta holds the parts d gives
 * ({"content"}, {"reasoning_content"}, {"tool_calls"}, or several); d NULL
 * gives {"delta": {}}. finish and lp as shoal_api_chunk_json's. */
char *shoal_api_chat_chunk_json(const char *id, int64_t created, const char *model,
                                const struct shoal_api_chat_parts *d, const char *finish,
                                const struct shoal_api_logprobs *lp);

/* The closing usage chunk of a stream (stream_options.include_usage):
 * "choices": [] and "usage". */
char *shoal_api_usage_chunk_json(enum shoal_api_kind kind, const char *id, int64_t created,
                                 const char *model, struct shoal_api_usage usage);

/* GET /v1/models: a list holding the one model served. */
char *shoal_api_models_json(const char *model, int64_t created);

/* GET /v1/models/{id}: the model object as the list holds it, {"id",
 * "object": "model", "created", "owned_by"}. */
char *shoal_api_model_json(const char *model, int64_t created);

/* Unicode characters in text [n] (the bytes that do not continue a UTF-8
 * sequence): completions' text_offset unit. Thread: any. */
int64_t shoal_api_n_chars(const char *text, size_t n);

/* The error object of e. */
char *shoal_api_error_json(const struct shoal_api_error *e);

#endif
