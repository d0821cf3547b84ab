/* Fuzz target: a chat template (shoal_chat_template_parse) rendered for a
 * few messages (shoal_chat_template_render).
 * Input: the template source, then NUL-separated segments; each segment's
 * first byte says what it is: 's', 'u', 'a', 't' a system, user, assistant
 * or tool message with the rest as content ('n': an assistant message with
 * none content), 'j' extra_json, 'g' add_generation_prompt. Without
 * segments a user/assistant/user conversation is rendered.
 * chat_template.h promises bounded steps, output and memory: the output
 * stays under max_output_bytes and memory under the render budget plus a
 * multiple of the input for the parsed template. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"
#include "fuzz_common.h"

#define MAX_MSGS 16
#define MAX_OUTPUT (256u << 10)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    const uint8_t *src, *rest;
    size_t src_len, rest_len;
    int has_rest = fuzz_split(data, n, &src, &src_len, &rest, &rest_len);
    char *source = fuzz_strndup(src, src_len);
    char *segs = fuzz_strndup(rest, rest_len);   /* NUL separators stay */
    struct shoal_chat_message msgs[MAX_MSGS];
    size_t n_msgs = 0;
    struct shoal_chat_template_vars vars = {.bos_token = "<s>", .eos_token = "</s>",
                                            .max_steps = 200000,
                                            .max_output_bytes = MAX_OUTPUT};
    if (!has_rest) {
        msgs[0] = (struct shoal_chat_message){"user", "Hello"};
        msgs[1] = (struct shoal_chat_message){"assistant", "Hi! How can I help?"};
        msgs[2] = (struct shoal_chat_message){"user", "Tell me a story."};
        n_msgs = 3;
        vars.add_generation_prompt = 1;
    }
    for (size_t i = 0; has_rest && i < rest_len; ) {
        char *s = segs + i;
        size_t len = strlen(s);
        i += len + 1;
        if (len == 0)
            continue;
        const char *role = NULL;
        switch (s[0]) {
        case 's': role = "system"; break;
        case 'u': role = "user"; break;
        case 'a': case 'n': role = "assistant"; break;
        case 't': role = "tool"; break;
        case 'j': vars.extra_json = s + 1; break;
        case 'g': vars.add_generation_prompt = 1; break;
        default: break;
        }
        if (role && n_msgs < MAX_MSGS)
            msgs[n_msgs++] = (struct shoal_chat_message){role, s[0] == 'n' ? NULL : s + 1};
    }
    struct shoal_err err = {0};
    fuzz_mem_begin();
    struct shoal_chat_template *t = shoal_chat_template_parse(source, &err);
    struct fuzz_mem m = fuzz_mem_now();
    fuzz_mem_check("chat_template", "parse", m, n, 256 * n + FUZZ_MIB, 64 * n + FUZZ_MIB);
    if (!t) {
        fuzz_mem_end();
        FUZZ_ASSERT(err.code < 0 && err.msg[0], "no error set");
        free(source);
        free(segs);
        return 0;
    }
    fuzz_mem_reset_peak();
    char *out = NULL;
    int rc = shoal_chat_template_render(t, msgs, n_msgs, &vars, &out, &err);
    m = fuzz_mem_now();
    /* the render's own budget (values + output strings), the charge of
     * malloc's headers on top of it, and the input's copy */
    fuzz_mem_check("chat_template", "render", m, n,
                   2 * (size_t)SHOAL_CHAT_TEMPLATE_MAX_MEMORY + 8 * MAX_OUTPUT + 64 * n,
                   SHOAL_CHAT_TEMPLATE_MAX_MEMORY + 2 * MAX_OUTPUT + 64 * n);
    if (rc == 0) {
        FUZZ_ASSERT(out != NULL, "no output");
        FUZZ_ASSERT(strlen(out) <= MAX_OUTPUT, "%zu output bytes, at most %u", strlen(out),
                    MAX_OUTPUT);
        free(out);
    } else {
        FUZZ_ASSERT(rc < 0 && err.msg[0], "status %d without a message", rc);
    }
    shoal_chat_template_free(t);
    fuzz_mem_end();
    free(source);
    free(segs);
    return 0;
}
