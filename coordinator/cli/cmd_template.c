/* shoal template: render a model's chat template for a conversation given
 * on the command line and print the prompt byte for byte (no newline added),
 * the text `shoal chat` would tokenize. Loads only tokenizer_config.json
 * (or chat_template.jinja), never the weights, so it is instant on any
 * model directory or shoal container.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"
#include "cli.h"
#include "util.h"

#define TEMPLATE_MAX_FILE (16u << 20) /* bytes of a --template or --messages file */

static void usage(FILE *f)
{
    fprintf(f,
        "usage: shoal template [--model] [DIR] [--system TEXT] [--user TEXT]\n"
        "                      [--assistant TEXT] ... [--add-generation-prompt]\n"
        "\n"
        "Render the model's chat template for the given conversation and print\n"
        "the prompt exactly as 'shoal chat' tokenizes it (no newline is added).\n"
        "\n"
        "  --model DIR, DIR         checkpoint directory or shoal container\n"
        "                           (default: the bundled model)\n"
        "  --system, --user, --assistant, --tool TEXT\n"
        "                           a message with that role; repeat them, in order\n"
        "  --messages FILE          messages from a JSON array of {\"role\": ...,\n"
        "                           \"content\": ...}; other members (tool_calls,\n"
        "                           reasoning_content, ...) reach the template too\n"
        "                           (before the flags above)\n"
        "  --add-generation-prompt  end with the assistant header ('shoal chat' does)\n"
        "  --vars JSON              more template variables, a JSON object\n"
        "                           (e.g. '{\"enable_thinking\": false}' or tools)\n"
        "  --template FILE          a Jinja template file instead of the model's\n"
        "                           (bos/eos still come from the model's config)\n");
}

/* The conversation, a JSON array of message objects handed to the template
 * whole (tool_calls, tool_call_id, reasoning_content, content lists). */
struct msgs {
    json_t *arr;
};

static void msgs_push(struct msgs *ms, const char *role, const char *content)
{
    if (!ms->arr)
        ms->arr = json_array();
    json_array_append_new(ms->arr, json_pack("{s:s, s:s}", "role", role,
                                             "content", content));
}

static void msgs_free(struct msgs *ms)
{
    json_decref(ms->arr);
}

/* Append the messages of a JSON file; returns 0 or -1 after an error line. */
static int load_messages(const char *path, struct msgs *ms)
{
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    if (!j) {
        if (jerr.line < 0)   /* not opened or not read: no line to name */
            shoal_cli_error("template: --messages '%s': %s", path, jerr.text);
        else
            shoal_cli_error("template: --messages '%s': line %d: %s", path, jerr.line,
                            jerr.text);
        return -1;
    }
    int rc = -1;
    if (!json_is_array(j)) {
        shoal_cli_error("template: --messages '%s': expected a JSON array of "
                        "messages, found %s", path, json_is_object(j) ? "an object"
                                                                       : "a scalar");
        goto out;
    }
    for (size_t k = 0; k < json_array_size(j); k++) {
        json_t *m = json_array_get(j, k);
        if (!json_is_object(m) || !json_is_string(json_object_get(m, "role"))) {
            shoal_cli_error("template: --messages '%s': message %zu needs a string "
                            "\"role\"", path, k);
            goto out;
        }
    }
    if (!ms->arr)
        ms->arr = json_array();
    json_array_extend(ms->arr, j);
    rc = 0;
out:
    json_decref(j);
    return rc;
}

int shoal_cmd_template(int argc, char **argv)
{
    const char *model = NULL, *vars_json = NULL, *template_path = NULL;
    int add_gen = 0;
    struct msgs ms = {0};
    int status = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        static const char *const roles[][2] = {
            {"--system", "system"}, {"--user", "user"},
            {"--assistant", "assistant"}, {"--tool", "tool"}};
        size_t r = 0;
        while (r < 4 && strcmp(a, roles[r][0]))
            r++;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            status = 0;
            goto out;
        }
        if (!strcmp(a, "--add-generation-prompt")) {
            add_gen = 1;
            continue;
        }
        int takes_value = r < 4 || !strcmp(a, "--model") || !strcmp(a, "--vars") ||
                          !strcmp(a, "--messages") || !strcmp(a, "--template");
        if (!takes_value) {
            const int p = shoal_cli_take_path("template", "model", a, &model);
            if (p > 0)
                continue;
            if (p == 0)
                shoal_cli_error("template: unknown option '%s' (see 'shoal template "
                                "--help')", a);
            goto out;
        }
        if (i + 1 >= argc) {
            shoal_cli_error("template: %s needs a value", a);
            goto out;
        }
        const char *v = argv[++i];
        if (r < 4)
            msgs_push(&ms, roles[r][1], v);
        else if (!strcmp(a, "--model")) {
            if (model) {
                shoal_cli_error("template: --model '%s': the model is already '%s' (give "
                                "it once, as --model DIR or as a path)", v, model);
                goto out;
            }
            model = v;
        }
        else if (!strcmp(a, "--vars"))
            vars_json = v;
        else if (!strcmp(a, "--template"))
            template_path = v;
        else if (load_messages(v, &ms))
            goto out;
    }
    if (vars_json) {
        json_error_t jerr;
        json_t *j = json_loads(vars_json, 0, &jerr);
        if (!json_is_object(j)) {
            shoal_cli_error("template: --vars must be a JSON object such as "
                            "'{\"enable_thinking\": false}'; %s%s",
                            j ? "got " : "", j ? (json_is_array(j) ? "an array" : "a scalar")
                                               : jerr.text);
            json_decref(j);
            goto out;
        }
        json_decref(j);
    }
    if (template_path && (!shoal_exists(template_path) || shoal_is_dir(template_path))) {
        shoal_cli_error("template: --template '%s' %s", template_path,
                        shoal_exists(template_path) ? "is a directory, not a file" : "does not exist");
        goto out;
    }
    const char *dir = model ? model : shoal_cli_default_model();
    if (!shoal_is_dir(dir)) {
        shoal_cli_error("template: model '%s' is not a directory (a checkpoint "
                        "directory or shoal container holding tokenizer_config.json)",
                        dir);
        goto out;
    }
    status = 1;
    struct shoal_err err = {0};
    char *cfg = shoal_path_join(dir, "tokenizer_config.json");
    char *src = NULL, *bos = NULL, *eos = NULL, *text = NULL;
    struct shoal_chat_template *t = NULL;
    /* tokenizer_config.json, or a converted GGUF's tokenizer.gguf (as chat reads it) */
    int rc = shoal_chat_template_load_model(dir, NULL, &src, &bos, &eos, &err);
    if (rc && template_path && (rc == SHOAL_ENOTFOUND || rc == -ENOENT))
        rc = 0; /* no template (or config) of its own; --template gives one */
    if (rc) {
        shoal_cli_error("template: %s", err.msg);
        goto done;
    }
    if (template_path) {
        size_t n;
        free(src);
        src = NULL;
        if (shoal_read_file(template_path, TEMPLATE_MAX_FILE, &src, &n, &err)) {
            shoal_cli_error("template: --template: %s", err.msg);
            goto done;
        }
    }
    if (!(t = shoal_chat_template_parse(src, &err))) {
        shoal_cli_error("template: chat template of '%s': %s",
                        template_path ? template_path : dir, err.msg);
        goto done;
    }
    /* the same variables `shoal chat` passes */
    struct shoal_chat_template_vars vars = {.bos_token = bos ? bos : "",
                                            .eos_token = eos ? eos : "",
                                            .add_generation_prompt = add_gen,
                                            .extra_json = vars_json};
    if (!ms.arr)
        ms.arr = json_array();
    char *msgs_json = json_dumps(ms.arr, JSON_COMPACT);
    vars.messages_json = msgs_json;
    rc = shoal_chat_template_render(t, NULL, 0, &vars, &text, &err);
    free(msgs_json);
    if (rc) {
        shoal_cli_error("template: %s", err.msg);
        goto done;
    }
    size_t len = strlen(text);
    if (fwrite(text, 1, len, stdout) != len || fflush(stdout)) {
        shoal_cli_error("template: writing the prompt to stdout failed");
        goto done;
    }
    status = 0;
done:
    free(text);
    shoal_chat_template_free(t);
    free(cfg);
    free(src);
    free(bos);
    free(eos);
out:
    msgs_free(&ms);
    return status;
}
