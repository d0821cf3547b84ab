/* api.c: OpenAI request parsing (fields, ranges, 400s naming the field) and
 * the response JSON, the logprobs shapes above all. */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"

/* cr_assert of a call (a macro's parenthesis cannot start its argument) */
#define cr_assert_true(x) cr_assert(eq(int, !!(x), 1), "%s", #x)

#define USAGE(p, c, g) ((struct shoal_api_usage){.n_prompt = (p), .n_cached = (c), \
                                                .n_completion = (g)})

static int parse(enum shoal_api_kind kind, const char *body, struct shoal_api_request *r,
                 struct shoal_api_error *e)
{
    memset(e, 0, sizeof *e);
    return shoal_api_parse_request(kind, body, strlen(body), r, e);
}

Test(api, completion_fields_are_parsed)
{
    struct shoal_api_request r;
    struct shoal_api_error e;
    const char *body = "{\"model\": \"m\", \"prompt\": [\"ROMEO:\"], \"max_completion_tokens\": 7,"
                       " \"temperature\": 0.5, \"top_k\": 3, \"seed\": 11, \"stop\": [\"a\", \"b\"],"
                       " \"presence_penalty\": -2, \"frequency_penalty\": 1.25, \"logprobs\": 3,"
                       " \"stream\": true, \"stream_options\": {\"include_usage\": true},"
                       " \"unknown\": {\"x\": 1}}";
    cr_assert(eq(int, parse(SHOAL_API_COMPLETION, body, &r, &e), 0), "%s", e.message);
    cr_assert(eq(str, r.model, "m"));
    cr_assert(eq(str, r.prompt, "ROMEO:"));
    cr_assert(eq(i64, r.max_tokens, 7));
    cr_assert(r.has_temperature && r.temperature == 0.5);
    cr_assert(r.has_top_k && r.top_k == 3);
    cr_assert(r.has_seed && r.seed == 11);
    cr_assert(eq(int, r.has_top_p + r.has_min_p, 0));
    cr_assert(eq(int, r.n_stop, 2));
    cr_assert(eq(str, r.stop[1], "b"));
    cr_assert(r.has_presence_penalty && r.presence_penalty == -2.0);
    cr_assert(r.has_frequency_penalty && r.frequency_penalty == 1.25);
    cr_assert(eq(int, r.logprobs, 1));
    cr_assert(eq(int, r.top_logprobs, 3));
    cr_assert(r.stream && r.include_usage);
    shoal_api_request_free(&r);
    /* nothing given: the server's defaults, no logprobs */
    cr_assert(eq(int, parse(SHOAL_API_COMPLETION, "{\"prompt\": \"x\"}", &r, &e), 0));
    cr_assert(eq(i64, r.max_tokens, -1));
    cr_assert(eq(int, r.has_presence_penalty + r.has_frequency_penalty + r.logprobs +
                          r.top_logprobs + r.stream, 0));
    shoal_api_request_free(&r);
    /* logprobs 0: the chosen tokens' logprobs, no alternatives */
    cr_assert(eq(int, parse(SHOAL_API_COMPLETION, "{\"prompt\": \"x\", \"logprobs\": 0}", &r,
                            &e), 0));
    cr_assert(r.logprobs == 1 && r.top_logprobs == 0);
    shoal_api_request_free(&r);
}

Test(api, chat_fields_are_parsed)
{
    struct shoal_api_request r;
    struct shoal_api_error e;
    const char *body = "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\","
                       " \"text\": \"a\"}, {\"type\": \"text\", \"text\": \"b\"}]}],"
                       " \"logprobs\": true, \"top_logprobs\": 20, \"presence_penalty\": 2}";
    cr_assert(eq(int, parse(SHOAL_API_CHAT, body, &r, &e), 0), "%s", e.message);
    cr_assert(eq(str, r.messages_json, "[{\"role\":\"user\",\"content\":\"ab\"}]"));
    cr_assert(r.logprobs == 1 && r.top_logprobs == 20);
    cr_assert(r.has_presence_penalty && r.presence_penalty == 2.0);
    shoal_api_request_free(&r);
    cr_assert(eq(int, parse(SHOAL_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                            "\"logprobs\": false}", &r, &e), 0));
    cr_assert(r.logprobs == 0 && r.top_logprobs == 0);
    shoal_api_request_free(&r);
}

Test(api, null_content_of_a_tool_call_and_the_roles)
{
    struct shoal_api_request r;
    struct shoal_api_error e;
    /* an assistant message with tool_calls: content null or left out is
     * none for the template, and "" in the fallback copy */
    const char *body =
        "{\"messages\": [{\"role\": \"developer\", \"content\": \"d\"}, {\"role\": \"user\", "
        "\"content\": \"u\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": "
        "[{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"f\", "
        "\"arguments\": \"{}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"c1\", "
        "\"content\": \"1\"}, {\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"c2\"}]}],"
        " \"response_format\": {\"type\": \"text\"}}";
    cr_assert(eq(int, parse(SHOAL_API_CHAT, body, &r, &e), 0), "%s", e.message);
    json_t *m = json_loads(r.messages_json, 0, NULL);
    cr_assert_true(json_is_null(json_object_get(json_array_get(m, 2), "content")));
    cr_assert_true(json_is_null(json_object_get(json_array_get(m, 4), "content")));
    json_decref(m);
    m = json_loads(r.messages_json_empty, 0, NULL);
    cr_assert(eq(str, (char *)json_string_value(json_object_get(json_array_get(m, 4),
                                                                "content")), ""));
    json_decref(m);
    shoal_api_request_free(&r);
    cr_assert(eq(int, parse(SHOAL_API_CHAT, "{\"messages\": [{\"role\": \"user\", "
                            "\"content\": \"x\"}]}", &r, &e), 0));
    cr_assert_true(r.messages_json_empty == NULL);
    shoal_api_request_free(&r);
    cr_assert(eq(int, parse(SHOAL_API_CHAT, "{\"messages\": [{\"role\": \"wizard\", "
                            "\"content\": \"x\"}]}", &r, &e), -1));
    cr_assert(strstr(e.message, "'wizard'") && strstr(e.message, "'assistant'"), "%s",
              e.message);
    shoal_api_request_free(&r);
    cr_assert(eq(int, parse(SHOAL_API_COMPLETION, "{\"prompt\": \"x\", \"echo\": false}", &r,
                            &e), 0));
    shoal_api_request_free(&r);
}

Test(api, usage_and_the_model_object)
{
    char *text = shoal_api_usage_chunk_json(SHOAL_API_CHAT, "chatcmpl-1", 5, "m",
                                            USAGE(10, 7, 3));
    json_t *root = json_loads(text, 0, NULL);
    free(text);
    json_t *u = json_object_get(root, "usage");
    cr_assert(eq(i64, json_integer_value(json_object_get(u, "total_tokens")), 13));
    cr_assert(eq(i64, json_integer_value(json_object_get(json_object_get(
                          u, "prompt_tokens_details"), "cached_tokens")), 7));
    json_decref(root);
    text = shoal_api_model_json("m", 42);
    root = json_loads(text, 0, NULL);
    free(text);
    cr_assert(eq(str, (char *)json_string_value(json_object_get(root, "id")), "m"));
    cr_assert(eq(str, (char *)json_string_value(json_object_get(root, "object")), "model"));
    cr_assert(eq(i64, json_integer_value(json_object_get(root, "created")), 42));
    json_decref(root);
}

struct bad_case {
    enum shoal_api_kind kind;
    const char *body;
    const char *param;   /* the field the 400 names, "" for none */
};

Test(api, bad_requests_are_400s_naming_the_field)
{
    static const struct bad_case cases[] = {
        {SHOAL_API_COMPLETION, "{\"prompt\": ", ""},
        {SHOAL_API_COMPLETION, "[1, 2]", ""},
        {SHOAL_API_COMPLETION, "{\"prompt\": \"a\", \"prompt\": \"b\"}", ""},
        {SHOAL_API_COMPLETION, "{\"prompt\": \"\xff\"}", ""},
        {SHOAL_API_COMPLETION, "{\"max_tokens\": 3}", "prompt"},
        {SHOAL_API_COMPLETION, "{\"prompt\": [\"a\", \"b\"]}", "prompt"},
        {SHOAL_API_COMPLETION, "{\"prompt\": \"x\", \"max_tokens\": \"ten\"}", "max_tokens"},
        {SHOAL_API_COMPLETION, "{\"prompt\": \"x\", \"max_tokens\": -1}", "max_tokens"},
        {SHOAL_API_COMPLETION, "{\"prompt\": \"x\", \"temperature\": -0.5}", "temperature"},
        {SHOAL_API_COMPLETION, "{\"prompt\": \"x\", \"top_p\": 1.5}", "top_p"},
        {SHOAL_API_COMPLETION, "{\"prompt\": \"x\", \"top_k\": 1.5}", "top_k"},
        {SHOAL_API_COMPLETION, "{\"prompt\": \"x\", \"n\": 2}", "n"},
        {SHOAL_API_COMPLETION, "{\"prompt\": \"x\", \"stop\": \"\"}", "stop"},
        {SHOAL_API_COMPLETION, "{\"prompt\": \"x\", \"stop\": [1]}", "stop"},
        {SHOAL_API_COMPLETION, "{\"prompt\": \"x\", \"stream\": 1}", "stream"},
        {SHOAL_API_COMPLETION, "{\"prompt\": \"x\", \"model\": 5}", "model"},
        {SHOAL_API_COMPLETION, "{\"prompt\": \"x\", \"presence_penalty\": 2.01}",
         "presence_penalty"},
        {SHOAL_API_COMPLETION, "{\"prompt\": \"x\", \"presence_penalty\": -3}",
         "presence_penalty"},
        {SHOAL_API_COMPLETION, "{\"prompt\": \"x\", \"frequency_penalty\": \"1\"}",
         "frequency_penalty"},
        {SHOAL_API_COMPLETION, "{\"prompt\": \"x\", \"logprobs\": 6}", "logprobs"},
        {SHOAL_API_COMPLETION, "{\"prompt\": \"x\", \"logprobs\": true}", "logprobs"},
        {SHOAL_API_CHAT, "{\"messages\": []}", "messages"},
        {SHOAL_API_CHAT, "{\"messages\": [{\"content\": \"hi\"}]}", "messages[0].role"},
        {SHOAL_API_CHAT, "{\"messages\": [3]}", "messages[0]"},
        {SHOAL_API_CHAT, "{\"messages\": [{\"role\": \"wizard\", \"content\": \"hi\"}]}",
         "messages[0].role"},
        {SHOAL_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, "
                         "{\"role\": 7, \"content\": \"hi\"}]}", "messages[1].role"},
        {SHOAL_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": "
                         "\"image_url\"}]}]}", "messages[0].content"},
        {SHOAL_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}",
         "messages[0].content"},
        {SHOAL_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": null}]}",
         "messages[0].content"},
        {SHOAL_API_CHAT, "{\"messages\": [{\"role\": \"user\"}]}", "messages[0].content"},
        {SHOAL_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, "
                         "{\"role\": \"assistant\", \"content\": null}]}",
         "messages[1].content"},
        {SHOAL_API_CHAT, "{\"messages\": [{\"role\": \"assistant\", \"content\": null, "
                         "\"tool_calls\": []}]}", "messages[0].content"},
        {SHOAL_API_CHAT, "{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": 1}]}",
         "messages[0].tool_calls"},
        {SHOAL_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\", "
                         "\"tool_calls\": [{}]}]}", "messages[0].tool_calls"},
        {SHOAL_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                         "\"response_format\": {\"type\": \"json_object\"}}", "response_format"},
        {SHOAL_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                         "\"response_format\": {\"type\": \"json_schema\", \"json_schema\": "
                         "{\"name\": \"a\", \"schema\": {}}}}", "response_format"},
        {SHOAL_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                         "\"response_format\": \"json\"}", "response_format"},
        {SHOAL_API_COMPLETION, "{\"prompt\": \"x\", \"echo\": true}", "echo"},
        {SHOAL_API_COMPLETION, "{\"prompt\": \"x\", \"response_format\": {\"type\": "
                               "\"json_object\"}}", "response_format"},
        {SHOAL_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": 1}", "logprobs"},
        {SHOAL_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": true, "
                         "\"top_logprobs\": 21}", "top_logprobs"},
        {SHOAL_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_logprobs\": 2}",
         "top_logprobs"},
        {SHOAL_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": true, "
                         "\"top_logprobs\": -1}", "top_logprobs"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct shoal_api_request r;
        struct shoal_api_error e;
        int rc = parse(cases[i].kind, cases[i].body, &r, &e);
        shoal_api_request_free(&r);
        cr_assert(eq(int, rc, -1), "case %zu (%s) was accepted", i, cases[i].body);
        cr_assert(eq(int, e.status, 400), "case %zu: status %d", i, e.status);
        cr_assert(eq(str, (char *)e.type, "invalid_request_error"), "case %zu", i);
        cr_assert(eq(str, e.param, (char *)cases[i].param), "case %zu (%s): param '%s'", i,
                  cases[i].body, e.param);
        cr_assert(e.message[0] && !strchr(e.message, '\n'), "case %zu: one-line message", i);
    }
}

/* the choice of a built response, parsed back; the root in *root */
static json_t *choice_of(char *text, json_t **root)
{
    json_error_t je;
    *root = json_loads(text, 0, &je);
    cr_assert(ne(ptr, *root, NULL), "not JSON (%s): %s", je.text, text);
    free(text);
    json_t *c = json_array_get(json_object_get(*root, "choices"), 0);
    cr_assert_true(json_is_object(c));
    return c;
}

static double num(json_t *j)
{
    cr_assert_true(json_is_number(j));
    return json_number_value(j);
}

/* a chat logprob entry: token string, logprob and bytes */
static void assert_chat_token(json_t *t, const char *token, double lp, const int *bytes, size_t n)
{
    cr_assert(eq(str, (char *)json_string_value(json_object_get(t, "token")), (char *)token));
    cr_assert(epsilon_eq(dbl, num(json_object_get(t, "logprob")), lp, 1e-6));
    json_t *b = json_object_get(t, "bytes");
    cr_assert(eq(sz, json_array_size(b), n));
    for (size_t i = 0; i < n; i++)
        cr_assert(eq(i64, json_integer_value(json_array_get(b, i)), bytes[i]));
}

/* two tokens: the first half of U+2019 (’) and the rest plus "s" */
static const struct shoal_api_top_logprob TOP0[2] = {{"\xe2\x80", 2, -0.25f}, {"a", 1, -2.0f}};
static const struct shoal_api_top_logprob TOP1[3] = {
    {"\x99s", 2, -0.5f}, {"\x99s", 2, -1.0f}, {"b", 1, -INFINITY}};
static const struct shoal_api_token_logprob TOKS[2] = {
    {"\xe2\x80", 2, -0.25f, TOP0, 2}, {"\x99s", 2, -0.5f, TOP1, 3}};

Test(api, chat_logprobs_shape)
{
    struct shoal_api_logprobs lp = {TOKS, 2, 0};
    json_t *root;
    json_t *c = choice_of(shoal_api_response_json(SHOAL_API_CHAT, "chatcmpl-1", 5, "m",
                                                  "\xe2\x80\x99s", 4, "length", USAGE(3, 0, 2), &lp),
                          &root);
    cr_assert(eq(str, (char *)json_string_value(json_object_get(json_object_get(c, "message"),
                                                                "content")), "\xe2\x80\x99s"));
    json_t *l = json_object_get(c, "logprobs");
    cr_assert_true(json_is_null(json_object_get(l, "refusal")));
    json_t *content = json_object_get(l, "content");
    cr_assert(eq(sz, json_array_size(content), 2));
    /* a partial UTF-8 sequence: U+FFFD per byte in "token", the bytes kept */
    json_t *t0 = json_array_get(content, 0);
    assert_chat_token(t0, "\xef\xbf\xbd\xef\xbf\xbd", -0.25, (int[]){0xe2, 0x80}, 2);
    json_t *top0 = json_object_get(t0, "top_logprobs");
    cr_assert(eq(sz, json_array_size(top0), 2));
    assert_chat_token(json_array_get(top0, 1), "a", -2.0, (int[]){'a'}, 1);
    json_t *t1 = json_array_get(content, 1);
    assert_chat_token(t1, "\xef\xbf\xbds", -0.5, (int[]){0x99, 's'}, 2);
    json_t *top1 = json_object_get(t1, "top_logprobs");
    cr_assert(eq(sz, json_array_size(top1), 3), "chat keeps repeated alternatives");
    /* -inf is not JSON: -9999.0 as OpenAI writes it */
    cr_assert(eq(dbl, num(json_object_get(json_array_get(top1, 2), "logprob")), -9999.0));
    json_decref(root);

    /* a chunk carries the logprobs of its own tokens */
    struct shoal_api_logprobs one = {TOKS + 1, 1, 0};
    c = choice_of(shoal_api_chunk_json(SHOAL_API_CHAT, "chatcmpl-1", 5, "m", 0, "\x99s", 2, NULL,
                                       &one), &root);
    content = json_object_get(json_object_get(c, "logprobs"), "content");
    cr_assert(eq(sz, json_array_size(content), 1));
    assert_chat_token(json_array_get(content, 0), "\xef\xbf\xbds", -0.5, (int[]){0x99, 's'}, 2);
    cr_assert_true(json_is_null(json_object_get(c, "finish_reason")));
    json_decref(root);
    /* NULL: "logprobs": null, as before */
    c = choice_of(shoal_api_chunk_json(SHOAL_API_CHAT, "chatcmpl-1", 5, "m", 1, NULL, 0, NULL,
                                       NULL), &root);
    cr_assert_true(json_is_null(json_object_get(c, "logprobs")));
    cr_assert_true(json_is_object(json_object_get(c, "delta")));
    json_decref(root);
    c = choice_of(shoal_api_response_json(SHOAL_API_CHAT, "chatcmpl-1", 5, "m", "x", 1, "stop",
                                          USAGE(1, 0, 1), NULL), &root);
    cr_assert_true(json_is_null(json_object_get(c, "logprobs")));
    json_decref(root);
}

Test(api, completion_logprobs_shape)
{
    /* "a", then U+00E9 (é) split over two tokens, the second with "b", then "c" */
    static const struct shoal_api_top_logprob top[3] = {
        {"a", 1, -0.1f}, {"a", 1, -0.2f}, {"c", 1, -3.0f}};
    static const struct shoal_api_token_logprob toks[4] = {
        {"a", 1, -0.1f, top, 3}, {"\xc3", 1, -1.5f, NULL, 0}, {"\xa9" "b", 2, -0.75f, NULL, 0},
        {"c", 1, 0.0f, NULL, 0}};
    struct shoal_api_logprobs lp = {toks, 4, 5};
    json_t *root;
    json_t *c = choice_of(shoal_api_response_json(SHOAL_API_COMPLETION, "cmpl-1", 5, "m",
                                                  "a\xc3\xa9" "bc", 5, "length", USAGE(2, 0, 4), &lp),
                          &root);
    json_t *l = json_object_get(c, "logprobs");
    json_t *tokens = json_object_get(l, "tokens"), *lps = json_object_get(l, "token_logprobs"),
           *tops = json_object_get(l, "top_logprobs"), *off = json_object_get(l, "text_offset");
    cr_assert(eq(sz, json_array_size(tokens), 4));
    cr_assert(eq(str, (char *)json_string_value(json_array_get(tokens, 0)), "a"));
    cr_assert(eq(str, (char *)json_string_value(json_array_get(tokens, 1)), "\xef\xbf\xbd"));
    cr_assert(eq(str, (char *)json_string_value(json_array_get(tokens, 2)), "\xef\xbf\xbd" "b"));
    cr_assert(epsilon_eq(dbl, num(json_array_get(lps, 0)), -0.1, 1e-6));
    cr_assert(epsilon_eq(dbl, num(json_array_get(lps, 1)), -1.5, 1e-6));
    cr_assert(epsilon_eq(dbl, num(json_array_get(lps, 2)), -0.75, 1e-6));
    /* top_logprobs: one object per token, {text: logprob}; a repeated text
     * keeps its first (likeliest) value */
    cr_assert(eq(sz, json_array_size(tops), 4));
    json_t *t0 = json_array_get(tops, 0);
    cr_assert(eq(sz, json_object_size(t0), 2));
    cr_assert(epsilon_eq(dbl, num(json_object_get(t0, "a")), -0.1, 1e-6));
    cr_assert(epsilon_eq(dbl, num(json_object_get(t0, "c")), -3.0, 1e-6));
    cr_assert(eq(sz, json_object_size(json_array_get(tops, 1)), 0));
    /* offsets in characters from 5: "a" one, "\xc3" starts é, "\xa9" continues
     * it (no character), "b" one */
    cr_assert(eq(sz, json_array_size(off), 4));
    cr_assert(eq(i64, json_integer_value(json_array_get(off, 0)), 5));
    cr_assert(eq(i64, json_integer_value(json_array_get(off, 1)), 6));
    cr_assert(eq(i64, json_integer_value(json_array_get(off, 2)), 7));
    cr_assert(eq(i64, json_integer_value(json_array_get(off, 3)), 8));
    json_decref(root);

    struct shoal_api_logprobs one = {toks + 2, 1, 9};
    c = choice_of(shoal_api_chunk_json(SHOAL_API_COMPLETION, "cmpl-1", 5, "m", 0, "\xa9" "b", 2,
                                       "stop", &one), &root);
    l = json_object_get(c, "logprobs");
    cr_assert(eq(sz, json_array_size(json_object_get(l, "tokens")), 1));
    cr_assert(eq(i64, json_integer_value(json_array_get(json_object_get(l, "text_offset"), 0)),
                 9));
    cr_assert(eq(str, (char *)json_string_value(json_object_get(c, "finish_reason")), "stop"));
    json_decref(root);
    c = choice_of(shoal_api_response_json(SHOAL_API_COMPLETION, "cmpl-1", 5, "m", "x", 1, "stop",
                                          USAGE(1, 0, 1), NULL), &root);
    cr_assert_true(json_is_null(json_object_get(c, "logprobs")));
    json_decref(root);
}

/* the string at key of o, or NULL */
static const char *str_at(json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key));
}

Test(api, chat_parts_shape)
{
    /* a harmony reply: final text, analysis as reasoning_content, a tool call */
    json_t *root;
    struct shoal_api_chat_parts m = {.content = "Hi.xx", .n_content = 3,
                                     .reasoning = "Think \xff", .n_reasoning = 7};
    struct shoal_api_token_logprob tok = {"Hi", 2, -0.5f, NULL, 0};
    json_t *c = choice_of(shoal_api_chat_response_json("chatcmpl-1", 5, "m", &m, "stop", USAGE(4, 0, 9),
                                                       &(struct shoal_api_logprobs){&tok, 1, 0}),
                          &root);
    json_t *msg = json_object_get(c, "message");
    cr_assert(eq(str, (char *)str_at(msg, "role"), "assistant"));
    cr_assert(eq(str, (char *)str_at(msg, "content"), "Hi."));
    cr_assert(eq(str, (char *)str_at(msg, "reasoning_content"), "Think \xef\xbf\xbd"));
    cr_assert_true(!json_object_get(msg, "tool_calls"));
    cr_assert(eq(str, (char *)str_at(c, "finish_reason"), "stop"));
    cr_assert(eq(sz, json_array_size(json_object_get(json_object_get(c, "logprobs"),
                                                     "content")), 1));
    cr_assert(eq(i64, json_integer_value(json_object_get(json_object_get(root, "usage"),
                                                         "completion_tokens")), 9));
    json_decref(root);
    /* a tool call alone: content null, no reasoning_content */
    m = (struct shoal_api_chat_parts){.tool_name = "get_weather", .tool_args = "{\"c\": 1}x",
                                      .n_tool_args = 8, .tool_call_id = "call_7"};
    c = choice_of(shoal_api_chat_response_json("chatcmpl-1", 5, "m", &m, "tool_calls", USAGE(4, 0, 9),
                                               NULL), &root);
    msg = json_object_get(c, "message");
    cr_assert_true(json_is_null(json_object_get(msg, "content")));
    cr_assert_true(!json_object_get(msg, "reasoning_content"));
    json_t *calls = json_object_get(msg, "tool_calls");
    cr_assert(eq(sz, json_array_size(calls), 1));
    json_t *call = json_array_get(calls, 0);
    cr_assert(eq(str, (char *)str_at(call, "id"), "call_7"));
    cr_assert(eq(str, (char *)str_at(call, "type"), "function"));
    cr_assert_true(!json_object_get(call, "index"));
    cr_assert(eq(str, (char *)str_at(json_object_get(call, "function"), "name"), "get_weather"));
    cr_assert(eq(str, (char *)str_at(json_object_get(call, "function"), "arguments"),
                 "{\"c\": 1}"));
    cr_assert(eq(str, (char *)str_at(c, "finish_reason"), "tool_calls"));
    json_decref(root);

    /* deltas: only the fields given */
    c = choice_of(shoal_api_chat_chunk_json("chatcmpl-1", 5, "m",
                                            &(struct shoal_api_chat_parts){.reasoning = "So",
                                                                           .n_reasoning = 2},
                                            NULL, NULL), &root);
    json_t *d = json_object_get(c, "delta");
    cr_assert(eq(sz, json_object_size(d), 1));
    cr_assert(eq(str, (char *)str_at(d, "reasoning_content"), "So"));
    cr_assert_true(json_is_null(json_object_get(c, "finish_reason")));
    cr_assert(eq(str, (char *)str_at(root, "object"), "chat.completion.chunk"));
    json_decref(root);
    c = choice_of(shoal_api_chat_chunk_json("chatcmpl-1", 5, "m", &m, NULL, NULL), &root);
    d = json_object_get(c, "delta");
    cr_assert(eq(sz, json_object_size(d), 1));
    call = json_array_get(json_object_get(d, "tool_calls"), 0);
    cr_assert(eq(i64, json_integer_value(json_object_get(call, "index")), 0));
    cr_assert(eq(str, (char *)str_at(call, "id"), "call_7"));
    cr_assert(eq(str, (char *)str_at(json_object_get(call, "function"), "arguments"),
                 "{\"c\": 1}"));
    json_decref(root);
    c = choice_of(shoal_api_chat_chunk_json("chatcmpl-1", 5, "m", NULL, "tool_calls", NULL),
                  &root);
    cr_assert(eq(sz, json_object_size(json_object_get(c, "delta")), 0));
    cr_assert(eq(str, (char *)str_at(c, "finish_reason"), "tool_calls"));
    json_decref(root);
    /* the plain builders keep their shapes: chat content as a delta, the
     * first delta with the role */
    c = choice_of(shoal_api_chunk_json(SHOAL_API_CHAT, "chatcmpl-1", 5, "m", 0, "ab", 1, NULL,
                                       NULL), &root);
    d = json_object_get(c, "delta");
    cr_assert(eq(sz, json_object_size(d), 1));
    cr_assert(eq(str, (char *)str_at(d, "content"), "a"));
    json_decref(root);
    c = choice_of(shoal_api_chunk_json(SHOAL_API_CHAT, "chatcmpl-1", 5, "m", 1, NULL, 0, NULL,
                                       NULL), &root);
    d = json_object_get(c, "delta");
    cr_assert(eq(str, (char *)str_at(d, "role"), "assistant"));
    cr_assert(eq(str, (char *)str_at(d, "content"), ""));
    json_decref(root);
    c = choice_of(shoal_api_response_json(SHOAL_API_CHAT, "chatcmpl-1", 5, "m", NULL, 0, "stop",
                                          USAGE(1, 0, 0), NULL), &root);
    msg = json_object_get(c, "message");
    cr_assert(eq(str, (char *)str_at(msg, "content"), ""));
    cr_assert(eq(sz, json_object_size(msg), 2));
    json_decref(root);
}

Test(api, error_object_shape)
{
    struct shoal_api_error e;
    cr_assert(eq(int, shoal_api_fail(&e, 400, "invalid_request_error", "top_logprobs", NULL,
                                     "'%s' is %d", "top_logprobs", 21), -1));
    char *s = shoal_api_error_json(&e);
    json_t *root = json_loads(s, 0, NULL);
    free(s);
    json_t *err = json_object_get(root, "error");
    cr_assert(eq(str, (char *)json_string_value(json_object_get(err, "message")),
                 "'top_logprobs' is 21"));
    cr_assert(eq(str, (char *)json_string_value(json_object_get(err, "param")), "top_logprobs"));
    cr_assert_true(json_is_null(json_object_get(err, "code")));
    json_decref(root);
}
