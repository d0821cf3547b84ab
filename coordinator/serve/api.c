/* api: OpenAI request parsing and response JSON (see api.h). */
#include "api.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "util.h"

int shoal_api_fail(struct shoal_api_error *e, int status, const char *type,
                   const char *param, const char *code, const char *fmt, ...)
{
    e->status = status;
    e->type = type;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

static int bad(struct shoal_api_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int bad(struct shoal_api_error *e, const char *param, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return shoal_api_fail(e, 400, "invalid_request_error", param, NULL, "%s", msg);
}

/* A number field in [lo, hi]; absent or null leaves *has 0. */
static int get_number(json_t *root, const char *name, double lo, double hi, int *has,
                      double *out, struct shoal_api_error *e)
{
    json_t *v = json_object_get(root, name);
    *has = 0;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_number(v))
        return bad(e, name, "'%s' must be a number", name);
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi))
        return bad(e, name, "'%s' is %g, expected a number from %g to %g", name, d, lo, hi);
    *has = 1;
    *out = d;
    return 0;
}

static int get_int(json_t *root, const char *name, long long lo, long long hi, int *has,
                   long long *out, struct shoal_api_error *e)
{
    json_t *v = json_object_get(root, name);
    *has = 0;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_integer(v))
        return bad(e, name, "'%s' must be an integer", name);
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return bad(e, name, "'%s' is %lld, expected an integer from %lld to %lld", name, x,
                   lo, hi);
    *has = 1;
    *out = x;
    return 0;
}

static int get_stop(json_t *root, struct shoal_api_request *r, struct shoal_api_error *e)
{
    json_t *v = json_object_get(root, "stop");
    if (!v || json_is_null(v))
        return 0;
    if (json_is_string(v)) {
        if (!json_string_length(v))
            return bad(e, "stop", "'stop' must not be an empty string");
        r->stop[r->n_stop++] = shoal_xstrdup(json_string_value(v));
        return 0;
    }
    if (!json_is_array(v))
        return bad(e, "stop", "'stop' must be a string or a list of strings");
    if (json_array_size(v) > SHOAL_API_MAX_STOP)
        return bad(e, "stop", "'stop' holds %zu strings, at most %d allowed",
                   json_array_size(v), SHOAL_API_MAX_STOP);
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        if (!json_is_string(s) || !json_string_length(s))
            return bad(e, "stop", "'stop' item %zu must be a non-empty string", i);
        r->stop[r->n_stop++] = shoal_xstrdup(json_string_value(s));
    }
    return 0;
}

/* chat: "logprobs": bool, "top_logprobs": 0..20 (only with logprobs true);
 * completions: "logprobs": 0..5, the number of alternatives. */
static int get_logprobs(json_t *root, struct shoal_api_request *r, struct shoal_api_error *e)
{
    int has;
    long long v = 0;
    if (r->kind == SHOAL_API_COMPLETION) {
        if (get_int(root, "logprobs", 0, 5, &has, &v, e))
            return -1;
        r->logprobs = has;
        r->top_logprobs = (int)v;
        return 0;
    }
    json_t *lp = json_object_get(root, "logprobs");
    if (lp && !json_is_null(lp) && !json_is_boolean(lp))
        return bad(e, "logprobs", "'logprobs' must be true or false");
    r->logprobs = json_is_true(lp);
    if (get_int(root, "top_logprobs", 0, 20, &has, &v, e))
        return -1;
    if (has && !r->logprobs)
        return bad(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r->top_logprobs = (int)v;
    return 0;
}

/* What a JSON value is (NULL: "missing"), for "expected ..., got ..." */
static const char *kind_of(const json_t *v)
{
    static const char *const kinds[] = {
        [JSON_OBJECT] = "an object", [JSON_ARRAY] = "a list", [JSON_STRING] = "a string",
        [JSON_INTEGER] = "a number", [JSON_REAL] = "a number", [JSON_TRUE] = "true",
        [JSON_FALSE] = "false", [JSON_NULL] = "null"};
    return v ? kinds[json_typeof(v)] : "missing";
}

/* content: a string or a list of {"type": "text", "text": ...} parts; a
 * list becomes the joined string in place. Null or missing is checked by
 * the caller (check_message). */
static int flatten_content(json_t *msg, size_t idx, struct shoal_api_error *e)
{
    char param[64];
    snprintf(param, sizeof param, "messages[%zu].content", idx);
    json_t *c = json_object_get(msg, "content");
    if (!c || json_is_null(c) || json_is_string(c))
        return 0;
    if (!json_is_array(c))
        return bad(e, param, "%s must be a string or a list of text parts, got %s", param,
                   kind_of(c));
    size_t len = 0, i;
    json_t *part;
    json_array_foreach(c, i, part) {
        json_t *t = json_object_get(part, "text");
        const char *type = json_string_value(json_object_get(part, "type"));
        if (!type || strcmp(type, "text") || !json_is_string(t))
            return bad(e, param, "%s[%zu] is not a text part ({\"type\": \"text\", "
                       "\"text\": ...}); only text is supported", param, i);
        len += json_string_length(t);
    }
    char *joined = shoal_xmalloc(len + 1);
    size_t at = 0;
    json_array_foreach(c, i, part) {
        json_t *t = json_object_get(part, "text");
        memcpy(joined + at, json_string_value(t), json_string_length(t));
        at += json_string_length(t);
    }
    json_object_set_new(msg, "content", json_stringn(joined, at));
    free(joined);
    return 0;
}

/* The roles OpenAI's chat API takes ("function": its older form of "tool"). */
static const char *const ROLES[] = {"system", "developer", "user", "assistant", "tool",
                                    "function"};
#define ROLES_TEXT "'system', 'developer', 'user', 'assistant', 'tool' or 'function'"

/* messages[idx]: an object with one of ROLES and a content; only an
 * assistant message with tool_calls (or function_call) may leave the
 * content null or out (then it is set to null: what a template that reads
 * tool calls tests, `message.content is none`). *null_content: 1 when so. */
static int check_message(json_t *msg, size_t idx, int *null_content, struct shoal_api_error *e)
{
    char param[64];
    *null_content = 0;
    if (!json_is_object(msg)) {
        snprintf(param, sizeof param, "messages[%zu]", idx);
        return bad(e, param, "%s must be an object with a 'role' and a 'content', got %s",
                   param, kind_of(msg));
    }
    snprintf(param, sizeof param, "messages[%zu].role", idx);
    json_t *role = json_object_get(msg, "role");
    if (!json_is_string(role))
        return bad(e, param, "%s is %s: expected one of " ROLES_TEXT, param, kind_of(role));
    const char *rs = json_string_value(role);
    size_t k = 0;
    while (k < sizeof ROLES / sizeof ROLES[0] && strcmp(rs, ROLES[k]))
        k++;
    if (k == sizeof ROLES / sizeof ROLES[0])
        return bad(e, param, "%s is '%.64s': expected one of " ROLES_TEXT, param, rs);
    json_t *calls = json_object_get(msg, "tool_calls");
    if (calls && !json_is_null(calls)) {
        snprintf(param, sizeof param, "messages[%zu].tool_calls", idx);
        if (strcmp(rs, "assistant"))
            return bad(e, param, "%s is set on a '%s' message: only an assistant message has "
                       "tool calls", param, rs);
        if (!json_is_array(calls))
            return bad(e, param, "%s must be a list of tool calls, got %s", param,
                       kind_of(calls));
        size_t i;
        json_t *call;
        json_array_foreach(calls, i, call) {
            if (!json_is_object(call))
                return bad(e, param, "%s[%zu] must be an object ({\"id\", \"type\": "
                           "\"function\", \"function\": {\"name\", \"arguments\"}}), got "
                           "%s", param, i, kind_of(call));
        }
    }
    json_t *c = json_object_get(msg, "content");
    if (c && !json_is_null(c))
        return flatten_content(msg, idx, e);
    const int has_call = !strcmp(rs, "assistant") &&
                         (json_array_size(calls) > 0 ||
                          json_is_object(json_object_get(msg, "function_call")));
    snprintf(param, sizeof param, "messages[%zu].content", idx);
    if (!has_call)
        return bad(e, param, "%s is %s: expected a string or a list of text parts (only an "
                   "assistant message with tool_calls may leave it out)", param, kind_of(c));
    if (!c)
        json_object_set_new(msg, "content", json_null());
    *null_content = 1;
    return 0;
}

static int get_messages(json_t *root, struct shoal_api_request *r, struct shoal_api_error *e)
{
    json_t *m = json_object_get(root, "messages");
    if (!json_is_array(m) || json_array_size(m) == 0)
        return bad(e, "messages", "'messages' must be a non-empty list of messages");
    size_t i, n_null = 0;
    json_t *msg;
    json_array_foreach(m, i, msg) {
        int null_content;
        if (check_message(msg, i, &null_content, e))
            return -1;
        n_null += (size_t)null_content;
    }
    r->messages_json = json_dumps(m, JSON_COMPACT);
    if (!r->messages_json)
        return bad(e, "messages", "'messages' cannot be serialized");
    if (!n_null)
        return 0;
    json_array_foreach(m, i, msg) {
        if (json_is_null(json_object_get(msg, "content")))
            json_object_set_new(msg, "content", json_string(""));
    }
    r->messages_json_empty = json_dumps(m, JSON_COMPACT);
    return r->messages_json_empty ? 0 : bad(e, "messages", "'messages' cannot be serialized");
}

/* Chat template variables: "chat_template_kwargs" (an object: its members,
 * e.g. {"enable_thinking": false}, as llama-server and vLLM take them;
 * "messages" and "add_generation_prompt" are refused) and "tools" (a list
 * of objects; null or [] is none), which overrides a kwargs member of that
 * name. */
static int get_template_vars(json_t *root, struct shoal_api_request *r,
                             struct shoal_api_error *e)
{
    json_t *kw = json_object_get(root, "chat_template_kwargs");
    json_t *tools = json_object_get(root, "tools");
    if (kw && !json_is_null(kw) && !json_is_object(kw))
        return bad(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
    if (tools && !json_is_null(tools) && !json_is_array(tools))
        return bad(e, "tools", "'tools' must be a list of tool objects");
    /* the render's own variables: as transformers' apply_chat_template,
     * whose named arguments a kwarg cannot repeat */
    static const char *const own[] = {"messages", "add_generation_prompt"};
    for (size_t k = 0; k < sizeof own / sizeof own[0]; k++)
        if (json_is_object(kw) && json_object_get(kw, own[k]))
            return bad(e, "chat_template_kwargs", "'chat_template_kwargs' cannot set '%s': "
                       "the server sets it from the request", own[k]);
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        if (!json_is_object(t))
            return bad(e, "tools", "tools[%zu] must be an object ({\"type\": \"function\", "
                       "\"function\": {...}})", i);
    }
    const int has_kw = json_is_object(kw) && json_object_size(kw) > 0;
    const int has_tools = json_is_array(tools) && json_array_size(tools) > 0;
    if (!has_kw && !has_tools)
        return 0;
    json_t *v = has_kw ? json_deep_copy(kw) : json_object();
    if (has_tools)
        json_object_set(v, "tools", tools);
    r->template_vars_json = json_dumps(v, JSON_COMPACT);
    json_decref(v);
    return r->template_vars_json ? 0
                                 : bad(e, "tools", "the template variables cannot be serialized");
}

/* "prompt": [id, ...] (or [[id, ...]]): token ids, as OpenAI accepts them.
 * Returns 1 when p is such a list (r filled, or e set and -1), 0 when not. */
static int get_prompt_tokens(json_t *p, struct shoal_api_request *r, struct shoal_api_error *e)
{
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_array(json_array_get(p, 0)))
        p = json_array_get(p, 0);   /* [[ids]]: one prompt */
    if (!json_is_array(p) || json_array_size(p) == 0 || !json_is_integer(json_array_get(p, 0)))
        return 0;
    const size_t n = json_array_size(p);
    r->prompt_tokens = shoal_xcalloc(n, sizeof(int32_t));
    size_t i;
    json_t *v;
    json_array_foreach(p, i, v) {
        const json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id < 0 || id > INT32_MAX)
            return bad(e, "prompt", "prompt[%zu] must be a token id (an integer >= 0)", i);
        r->prompt_tokens[i] = (int32_t)id;
    }
    r->n_prompt_tokens = n;
    return 1;
}

static int get_prompt(json_t *root, struct shoal_api_request *r, struct shoal_api_error *e)
{
    json_t *p = json_object_get(root, "prompt");
    const int toks = get_prompt_tokens(p, r, e);
    if (toks)
        return toks < 0 ? -1 : 0;
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
        p = json_array_get(p, 0);   /* ["text"]: one prompt */
    if (!json_is_string(p))
        return bad(e, "prompt", "'prompt' must be a string or a list of token ids (one "
                   "prompt per request)");
    r->prompt = shoal_xstrdup(json_string_value(p));
    if (strlen(r->prompt) != json_string_length(p))
        return bad(e, "prompt", "'prompt' holds a NUL character");
    return 0;
}

/* What the server does not do yet, refused rather than ignored (a client
 * asking for JSON must not get prose with 200): completions "echo": true,
 * and a "response_format" other than {"type": "text"} (json_object and
 * json_schema need constrained decoding). */
static int check_unsupported(json_t *root, enum shoal_api_kind kind,
                             struct shoal_api_error *e)
{
    json_t *echo = json_object_get(root, "echo");
    if (kind == SHOAL_API_COMPLETION && echo && !json_is_null(echo) && !json_is_false(echo))
        return bad(e, "echo", "'echo' is %s: only false is supported (the reply holds the "
                   "completion without the prompt)", json_is_true(echo) ? "true" : kind_of(echo));
    json_t *rf = json_object_get(root, "response_format");
    if (!rf || json_is_null(rf))
        return 0;
    const char *type = json_string_value(json_object_get(rf, "type"));
    if (!json_is_object(rf) || !type)
        return bad(e, "response_format", "'response_format' must be an object with a string "
                   "'type' ({\"type\": \"text\"}), got %s", kind_of(rf));
    if (!strcmp(type, "text"))
        return 0;
    if (!strcmp(type, "json_object") || !strcmp(type, "json_schema"))
        return bad(e, "response_format", "'response_format' type '%s' is not supported: this "
                   "server has no constrained decoding; only {\"type\": \"text\"}", type);
    return bad(e, "response_format", "'response_format' type is '%.64s': expected 'text' "
               "('json_object' and 'json_schema' are not supported)", type);
}

int shoal_api_parse_request(enum shoal_api_kind kind, const char *body, size_t len,
                            struct shoal_api_request *r, struct shoal_api_error *e)
{
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->max_tokens = -1;
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return bad(e, NULL, "the request body is not valid JSON: %s (line %d column %d)",
                   je.text, je.line, je.column);
    int rc = -1, has;
    long long v = 0;
    if (!json_is_object(root)) {
        bad(e, NULL, "the request body must be a JSON object");
        goto out;
    }
    json_t *model = json_object_get(root, "model");
    if (model && !json_is_null(model) && !json_is_string(model)) {
        bad(e, "model", "'model' must be a string");
        goto out;
    }
    if (json_is_string(model))
        r->model = shoal_xstrdup(json_string_value(model));
    if (kind == SHOAL_API_CHAT ? get_messages(root, r, e) || get_template_vars(root, r, e)
                               : get_prompt(root, r, e))
        goto out;
    json_t *stream = json_object_get(root, "stream");
    if (stream && !json_is_null(stream) && !json_is_boolean(stream)) {
        bad(e, "stream", "'stream' must be true or false");
        goto out;
    }
    r->stream = json_is_true(stream);
    json_t *so = json_object_get(root, "stream_options");
    if (so && json_is_object(so))
        r->include_usage = json_is_true(json_object_get(so, "include_usage"));
    const char *mt = json_object_get(root, "max_completion_tokens") ? "max_completion_tokens"
                                                                     : "max_tokens";
    if (get_int(root, mt, 0, INT32_MAX, &has, &v, e))
        goto out;
    if (has)
        r->max_tokens = v;
    if (get_int(root, "n", 1, 1, &has, &v, e)) {
        snprintf(e->message, sizeof e->message, "'n' must be 1 (one choice per request)");
        goto out;
    }
    if (get_number(root, "temperature", 0, 100, &r->has_temperature, &r->temperature, e) ||
        get_number(root, "top_p", 0, 1, &r->has_top_p, &r->top_p, e) ||
        get_number(root, "min_p", 0, 1, &r->has_min_p, &r->min_p, e))
        goto out;
    if (get_int(root, "top_k", 0, INT32_MAX, &r->has_top_k, &v, e))
        goto out;
    r->top_k = v;
    if (get_int(root, "seed", INT64_MIN, INT64_MAX, &r->has_seed, &v, e))
        goto out;
    r->seed = (uint64_t)v;
    if (get_number(root, "presence_penalty", -2, 2, &r->has_presence_penalty,
                   &r->presence_penalty, e) ||
        get_number(root, "frequency_penalty", -2, 2, &r->has_frequency_penalty,
                   &r->frequency_penalty, e))
        goto out;
    if (get_stop(root, r, e) || get_logprobs(root, r, e) || check_unsupported(root, kind, e))
        goto out;
    rc = 0;
out:
    json_decref(root);
    return rc;
}

void shoal_api_request_free(struct shoal_api_request *r)
{
    free(r->model);
    free(r->prompt);
    free(r->prompt_tokens);
    free(r->messages_json);
    free(r->messages_json_empty);
    free(r->template_vars_json);
    for (int i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    memset(r, 0, sizeof *r);
}

/* A JSON string of text [n], invalid UTF-8 replaced by U+FFFD. */
static json_t *text_json(const char *text, size_t n)
{
    json_t *j = json_stringn(text ? text : "", text ? n : 0);
    if (j)
        return j;
    char *fixed = shoal_xmalloc(n * 3 + 1);
    size_t at = 0;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)text + i,
                                              (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0 || cp == 0) {
            memcpy(fixed + at, "\xEF\xBF\xBD", 3);
            at += 3;
            i++;
        } else {
            memcpy(fixed + at, text + i, (size_t)k);
            at += (size_t)k;
            i += (size_t)k;
        }
    }
    j = json_stringn(fixed, at);
    free(fixed);
    return j ? j : json_string("");
}

static char *dump(json_t *root)
{
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s ? s : shoal_xstrdup("{}");
}

static json_t *usage_json(struct shoal_api_usage u)
{
    return json_pack("{sIsIsIs{sI}}", "prompt_tokens", (json_int_t)u.n_prompt,
                     "completion_tokens", (json_int_t)u.n_completion, "total_tokens",
                     (json_int_t)(u.n_prompt + u.n_completion), "prompt_tokens_details",
                     "cached_tokens", (json_int_t)u.n_cached);
}

static json_t *envelope(enum shoal_api_kind kind, int chunk, const char *id, int64_t created,
                        const char *model)
{
    const char *object = kind == SHOAL_API_COMPLETION ? "text_completion"
                         : chunk                      ? "chat.completion.chunk"
                                                      : "chat.completion";
    return json_pack("{sssssIss}", "id", id, "object", object, "created", (json_int_t)created,
                     "model", model);
}

static json_t *finish_json(const char *finish)
{
    return finish ? json_string(finish) : json_null();
}

/* -inf and NaN are not JSON numbers: OpenAI writes -9999.0 */
static json_t *logprob_json(float lp)
{
    return json_real(isfinite(lp) ? (double)lp : -9999.0);
}

static json_t *bytes_json(const char *text, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer((unsigned char)text[i]));
    return a;
}

/* {"token", "logprob", "bytes"} of chat's logprobs */
static json_t *chat_token_json(const char *text, size_t n, float lp)
{
    return json_pack("{sososo}", "token", text_json(text, n), "logprob", logprob_json(lp),
                     "bytes", bytes_json(text, n));
}

/* chat: {"content": [{"token", "logprob", "bytes", "top_logprobs"}], "refusal": null} */
static json_t *chat_logprobs_json(const struct shoal_api_logprobs *lp)
{
    json_t *content = json_array();
    for (size_t i = 0; i < lp->n_tokens; i++) {
        const struct shoal_api_token_logprob *t = &lp->tokens[i];
        json_t *tok = chat_token_json(t->text, t->n, t->logprob);
        json_t *top = json_array();
        for (int k = 0; k < t->n_top; k++)
            json_array_append_new(top, chat_token_json(t->top[k].text, t->top[k].n,
                                                       t->top[k].logprob));
        json_object_set_new(tok, "top_logprobs", top);
        json_array_append_new(content, tok);
    }
    return json_pack("{sosn}", "content", content, "refusal");
}

int64_t shoal_api_n_chars(const char *text, size_t n)
{
    int64_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((unsigned char)text[i] & 0xC0) != 0x80;
    return c;
}

/* completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"} */
static json_t *completion_logprobs_json(const struct shoal_api_logprobs *lp)
{
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(),
           *offsets = json_array();
    int64_t at = lp->text_offset;
    for (size_t i = 0; i < lp->n_tokens; i++) {
        const struct shoal_api_token_logprob *t = &lp->tokens[i];
        json_array_append_new(tokens, text_json(t->text, t->n));
        json_array_append_new(lps, logprob_json(t->logprob));
        json_t *top = json_object();
        for (int k = 0; k < t->n_top; k++) {
            json_t *key = text_json(t->top[k].text, t->top[k].n);
            const char *ks = json_string_value(key);
            /* keys are C strings: a NUL inside ends them (as a repeat does) */
            if (!json_object_get(top, ks))
                json_object_set_new(top, ks, logprob_json(t->top[k].logprob));
            json_decref(key);
        }
        if (t->n_top > 0) {
            /* the sampled token too, as OpenAI's completions API does (up
             * to logprobs + 1 entries): sampled from outside the top N, it
             * was missing */
            json_t *key = text_json(t->text, t->n);
            const char *ks = json_string_value(key);
            if (!json_object_get(top, ks))
                json_object_set_new(top, ks, logprob_json(t->logprob));
            json_decref(key);
        }
        json_array_append_new(tops, top);
        json_array_append_new(offsets, json_integer(at));
        at += shoal_api_n_chars(t->text, t->n);
    }
    return json_pack("{sosososo}", "tokens", tokens, "token_logprobs", lps, "top_logprobs",
                     tops, "text_offset", offsets);
}

static json_t *logprobs_json(enum shoal_api_kind kind, const struct shoal_api_logprobs *lp)
{
    if (!lp)
        return json_null();
    return kind == SHOAL_API_CHAT ? chat_logprobs_json(lp) : completion_logprobs_json(lp);
}

/* The tool_calls array of m's tool call (delta: with "index": 0). */
static json_t *tool_calls_json(const struct shoal_api_chat_parts *m, int delta)
{
    json_t *call = json_pack("{sssss{ssso}}", "id", m->tool_call_id ? m->tool_call_id : "",
                             "type", "function", "function", "name", m->tool_name,
                             "arguments", text_json(m->tool_args, m->n_tool_args));
    if (delta)
        json_object_set_new(call, "index", json_integer(0));
    return json_pack("[o]", call);
}

/* A chat message (whole: with role, content null when absent) or delta
 * of parts m. */
static json_t *chat_message_json(const struct shoal_api_chat_parts *m, int delta)
{
    json_t *msg = json_object();
    if (!delta)
        json_object_set_new(msg, "role", json_string("assistant"));
    if (m->content || !delta)
        json_object_set_new(msg, "content", m->content ? text_json(m->content, m->n_content)
                                                       : json_null());
    if (m->reasoning)
        json_object_set_new(msg, "reasoning_content", text_json(m->reasoning, m->n_reasoning));
    if (m->tool_name)
        json_object_set_new(msg, "tool_calls", tool_calls_json(m, delta));
    return msg;
}

char *shoal_api_response_json(enum shoal_api_kind kind, const char *id, int64_t created,
                              const char *model, const char *text, size_t n,
                              const char *finish, struct shoal_api_usage usage,
                              const struct shoal_api_logprobs *lp)
{
    if (kind == SHOAL_API_CHAT)
        return shoal_api_chat_response_json(
            id, created, model,
            &(struct shoal_api_chat_parts){.content = text ? text : "", .n_content = text ? n : 0},
            finish, usage, lp);
    json_t *root = envelope(kind, 0, id, created, model);
    json_t *choice = json_pack("{sosisoso}", "text", text_json(text, n), "index", 0, "logprobs",
                               logprobs_json(kind, lp), "finish_reason", finish_json(finish));
    json_object_set_new(root, "choices", json_pack("[o]", choice));
    json_object_set_new(root, "usage", usage_json(usage));
    return dump(root);
}

char *shoal_api_chat_response_json(const char *id, int64_t created, const char *model,
                                   const struct shoal_api_chat_parts *m, const char *finish,
                                   struct shoal_api_usage usage,
                                   const struct shoal_api_logprobs *lp)
{
    json_t *root = envelope(SHOAL_API_CHAT, 0, id, created, model);
    json_t *choice = json_pack("{sisososo}", "index", 0, "message", chat_message_json(m, 0),
                               "logprobs", logprobs_json(SHOAL_API_CHAT, lp), "finish_reason",
                               finish_json(finish));
    json_object_set_new(root, "choices", json_pack("[o]", choice));
    json_object_set_new(root, "usage", usage_json(usage));
    return dump(root);
}

char *shoal_api_chunk_json(enum shoal_api_kind kind, const char *id, int64_t created,
                           const char *model, int role, const char *text, size_t n,
                           const char *finish, const struct shoal_api_logprobs *lp)
{
    if (kind == SHOAL_API_CHAT && !role)
        return shoal_api_chat_chunk_json(
            id, created, model,
            text ? &(struct shoal_api_chat_parts){.content = text, .n_content = n} : NULL,
            finish, lp);
    json_t *root = envelope(kind, 1, id, created, model);
    json_t *choice;
    if (kind == SHOAL_API_COMPLETION) {
        choice = json_pack("{sosisoso}", "text", text_json(text, n), "index", 0, "logprobs",
                           logprobs_json(kind, lp), "finish_reason", finish_json(finish));
    } else {   /* the first delta */
        json_t *delta = json_pack("{ssss}", "role", "assistant", "content", "");
        choice = json_pack("{sisososo}", "index", 0, "delta", delta, "logprobs",
                           logprobs_json(kind, lp), "finish_reason", finish_json(finish));
    }
    json_object_set_new(root, "choices", json_pack("[o]", choice));
    return dump(root);
}

char *shoal_api_chat_chunk_json(const char *id, int64_t created, const char *model,
                                const struct shoal_api_chat_parts *d, const char *finish,
                                const struct shoal_api_logprobs *lp)
{
    json_t *root = envelope(SHOAL_API_CHAT, 1, id, created, model);
    json_t *choice = json_pack("{sisososo}", "index", 0, "delta",
                               d ? chat_message_json(d, 1) : json_object(), "logprobs",
                               logprobs_json(SHOAL_API_CHAT, lp), "finish_reason",
                               finish_json(finish));
    json_object_set_new(root, "choices", json_pack("[o]", choice));
    return dump(root);
}

char *shoal_api_usage_chunk_json(enum shoal_api_kind kind, const char *id, int64_t created,
                                 const char *model, struct shoal_api_usage usage)
{
    json_t *root = envelope(kind, 1, id, created, model);
    json_object_set_new(root, "choices", json_array());
    json_object_set_new(root, "usage", usage_json(usage));
    return dump(root);
}

static json_t *model_object(const char *model, int64_t created)
{
    return json_pack("{sssssIss}", "id", model, "object", "model", "created",
                     (json_int_t)created, "owned_by", "shoal");
}

char *shoal_api_models_json(const char *model, int64_t created)
{
    return dump(json_pack("{sss[o]}", "object", "list", "data", model_object(model, created)));
}

char *shoal_api_model_json(const char *model, int64_t created)
{
    return dump(model_object(model, created));
}

char *shoal_api_error_json(const struct shoal_api_error *e)
{
    json_t *err = json_pack("{sosssoso}", "message", text_json(e->message, strlen(e->message)),
                            "type", e->type ? e->type : "server_error", "param",
                            e->param[0] ? json_string(e->param) : json_null(), "code",
                            e->code[0] ? json_string(e->code) : json_null());
    return dump(json_pack("{so}", "error", err));
}
