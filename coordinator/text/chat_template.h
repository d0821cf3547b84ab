/* chat_template: render a Hugging Face `chat_template` (the Jinja2 subset
 * that real chat templates use) for a list of chat messages.
 *
 * The module owns a small Jinja2 implementation: a lexer that applies the
 * whitespace rules transformers compiles chat templates with
 * (trim_blocks=True, lstrip_blocks=True, `{%-`/`-%}` stripping, one trailing
 * newline dropped), a parser into an AST, and an evaluator over a small
 * value type (undefined/none/bool/int/float/string/list/dict/namespace).
 *
 * Supported: `{{ }}`, `{% if/elif/else %}`, `{% for %}` (with `else`, a loop
 * filter `if`, `loop.*`, `break`/`continue`, tuple targets), `{% set %}`
 * (names, `ns.attr`, `{% set x %}...{% endset %}`), `{% macro %}`,
 * `{% raw %}`, `{% generation %}`, comments; Python-like operators, literals,
 * attribute/subscript/slice access, inline `a if c else b`; the usual tests
 * (`defined`, `none`, `string`, `mapping`, ...), filters (`trim`, `length`,
 * `tojson`, `join`, `selectattr`, `map`, ...), string/dict methods
 * (including str.format with '{}', '{0}', '{name}', '{0.attr}', '{0[key]}'
 * and !r/!s), dicts with string, integer, float, bool and none keys (Python
 * key equality: d[1] finds 1.0), and the globals `namespace`, `dict`,
 * `range`, `raise_exception` and `strftime_now` (each `is defined`).
 * An unknown filter, test, method or function fails only when evaluated, so a
 * template renders the paths it can.
 *
 * Differences from jinja2 a user may notice: attribute or subscript access on
 * an undefined value (e.g. messages[0].role with no messages) yields undefined
 * instead of raising, and tojson writes undefined as null; tuples behave as
 * lists (and print as `[...]`); select/reject/map give lists, not
 * generators; a global function prints as `<function range>` without an
 * address; str.format refuses format specs (`{:>5}`) and !a; `%` string
 * formatting, tuple subscripts,
 * recursive loops and the call/filter/include/extends/import tags are not
 * supported; case mapping is per code point (only 'ß' gets Python's special
 * casing).
 *
 * Runaway templates are bounded: evaluation steps, output bytes, working
 * memory and nesting (expressions, blocks, macro recursion) all have limits
 * that end rendering with SHOAL_ERANGE instead of hanging or exhausting
 * memory.
 *
 * The implementation is split by concern: chat_template.c (parser, config
 * loading), chat_template_lex.c, chat_template_value.c, chat_template_eval.c,
 * chat_template_builtins.c and chat_template_format.c, sharing
 * chat_template_impl.h.
 *
 * Thread: any. A parsed template is read-only after shoal_chat_template_parse
 * and may be rendered from several threads at once; each render uses its own
 * working memory. At the nesting limits a render needs under 512 KiB of C
 * stack (measured at -O0 and -O2).
 */
#ifndef SHOAL_CHAT_TEMPLATE_H
#define SHOAL_CHAT_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

/* Render limits. STEPS and OUTPUT are defaults that the vars can override;
 * MEMORY and DEPTH are fixed. Rendering 4,000 messages through the Qwen3
 * template takes about 3% of the steps and 4% of the memory. */
#define SHOAL_CHAT_TEMPLATE_MAX_STEPS   10000000ULL /* expressions + statements + iterations */
#define SHOAL_CHAT_TEMPLATE_MAX_OUTPUT  (16u << 20) /* bytes per rendered string */
#define SHOAL_CHAT_TEMPLATE_MAX_MEMORY  (64u << 20) /* bytes of values per render */
#define SHOAL_CHAT_TEMPLATE_MAX_DEPTH   1000        /* nested evaluation frames */

/* One chat message. Both strings are borrowed UTF-8; content may be NULL,
 * which the template sees as `none` (e.g. an assistant turn that only made
 * tool calls). */
struct shoal_chat_message {
    const char *role;     /* "system", "user", "assistant", "tool", ... */
    const char *content;
};

/* A parsed template: opaque, immutable, reusable for any number of renders. */
struct shoal_chat_template;

/* Parse a template.
 *   source  borrowed NUL-terminated UTF-8 template text (copied as needed).
 * Returns a template owned by the caller (free with
 * shoal_chat_template_free), or NULL with err set: SHOAL_EFORMAT and
 * "chat template line L column C: ..." on a syntax error, SHOAL_EINVAL if
 * source is NULL. Thread: any. */
struct shoal_chat_template *shoal_chat_template_parse(const char *source,
                                                      struct shoal_err *err);

/* Free a parsed template; NULL is a no-op. Thread: any (not concurrently
 * with a render of the same template). */
void shoal_chat_template_free(struct shoal_chat_template *t);

/* Variables besides `messages`. Zero-initialize and set what you need. */
struct shoal_chat_template_vars {
    const char *bos_token;      /* borrowed; NULL leaves `bos_token` undefined */
    const char *eos_token;      /* borrowed; NULL leaves `eos_token` undefined */
    int add_generation_prompt;  /* nonzero: end with the assistant header */
    /* Optional, borrowed: a JSON object whose members become template
     * variables, e.g. {"enable_thinking": false} or {"tools": [...]}.
     * Members override the variables above. NULL for none. */
    const char *extra_json;
    /* Optional, borrowed: the conversation as a JSON array of message
     * objects, every member kept (tool_calls, tool_call_id,
     * reasoning_content, content as a string, null or a list of parts), as
     * transformers hands them to the template. Each needs a string "role".
     * When set, msgs must be empty (n_msgs == 0). NULL for none. */
    const char *messages_json;
    uint64_t max_steps;         /* 0: SHOAL_CHAT_TEMPLATE_MAX_STEPS */
    size_t max_output_bytes;    /* 0: SHOAL_CHAT_TEMPLATE_MAX_OUTPUT */
};

/* Render messages through the template, as transformers'
 * apply_chat_template(..., tokenize=False) would. The template also sees
 * `tools` and `documents` as none unless extra_json sets them.
 *   t       borrowed parsed template.
 *   msgs    [n_msgs] borrowed messages (msgs may be NULL when n_msgs == 0).
 *   vars    borrowed; NULL means all defaults.
 *   *out    on success, a malloc'd NUL-terminated UTF-8 string owned by the
 *           caller (release with free()); untouched on failure.
 * Returns 0, or a negative status with err set:
 *   SHOAL_EINVAL  the template called raise_exception(msg) (err->msg holds
 *                  "chat template raised: msg"), a type error (e.g. adding a
 *                  string to an int), an unknown filter/test/method/function
 *                  (named in the message), or bad arguments;
 *   SHOAL_ERANGE  a limit was hit (steps, output bytes, memory, depth);
 *   SHOAL_EFORMAT extra_json is not a JSON object, or messages_json is
 *                  not an array of objects with a string "role".
 * Runtime messages carry the template line. Thread: any. */
int shoal_chat_template_render(const struct shoal_chat_template *t,
                               const struct shoal_chat_message *msgs,
                               size_t n_msgs,
                               const struct shoal_chat_template_vars *vars,
                               char **out, struct shoal_err *err);

/* Load the chat template and special-token strings from a
 * tokenizer_config.json.
 *   tokenizer_config_path  borrowed path.
 *   *template_source  malloc'd template text, owned by the caller (free()).
 *                     When the config's chat_template is a list of named
 *                     templates, the one named "default" (else the first) is
 *                     used. When the config has none, a chat_template.jinja
 *                     next to it is read instead (the newer HF layout).
 *   *bos_token, *eos_token  malloc'd strings owned by the caller (free()), or
 *                     NULL when the config has no such token. Each may be a
 *                     plain string or an AddedToken object {"content": ...}.
 *                     Either pointer argument may be NULL if not wanted.
 * Out-parameters are written only on success.
 * Returns 0; -errno if the file cannot be read; SHOAL_EFORMAT if it is not
 * JSON or a field has the wrong type; SHOAL_ENOTFOUND if there is no chat
 * template (base models such as Mixtral-8x7B-v0.1 ship none). Thread: any. */
int shoal_chat_template_load_config(const char *tokenizer_config_path,
                                    char **template_source, char **bos_token,
                                    char **eos_token, struct shoal_err *err);

struct shoal_gguf;

/* The GGUF counterpart of shoal_chat_template_load_config: the template is
 * the string tokenizer.chat_template (llama.cpp's converter writes the
 * checkpoint's default template there; named extras under
 * tokenizer.chat_template.NAME are not read), bos / eos the texts in
 * tokenizer.ggml.tokens of the ids tokenizer.ggml.bos_token_id and
 * eos_token_id (NULL when the id key is absent).
 *   g      borrowed parsed GGUF metadata (gguf.h), the set's first file.
 *   path   borrowed, named in messages.
 * Same ownership and out-parameters as shoal_chat_template_load_config.
 * Returns 0; SHOAL_ENOTFOUND when the file has no tokenizer.chat_template;
 * SHOAL_EFORMAT for a key of the wrong type, a NUL byte in the template or
 * token, an id set without tokenizer.ggml.tokens; SHOAL_ERANGE for an id
 * past the vocabulary. Messages name path and the key. Thread: any. */
int shoal_chat_template_load_gguf(const struct shoal_gguf *g, const char *path,
                                  char **template_source, char **bos_token,
                                  char **eos_token, struct shoal_err *err);

/* The template of a model, as shoal chat and shoal serve read it: from
 * its GGUF metadata when gguf is non-NULL (shoal_chat_template_load_gguf,
 * model_path named in messages), else from model_path/tokenizer_config.json
 * (shoal_chat_template_load_config, chat_template.jinja beside it), or,
 * when there is none, from model_path/tokenizer.gguf (a container shoal
 * convert made of a GGUF: its metadata, read as the GGUF's).
 *   model_path  borrowed: a checkpoint directory or the GGUF file.
 *   gguf        borrowed GGUF metadata (shoal_model_gguf_meta), or NULL.
 * Returns and ownership as those two. Thread: any. */
int shoal_chat_template_load_model(const char *model_path, const struct shoal_gguf *gguf,
                                   char **template_source, char **bos_token,
                                   char **eos_token, struct shoal_err *err);

#endif
