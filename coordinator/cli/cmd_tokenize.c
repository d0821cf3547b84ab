/* shoal tokenize / shoal detokenize: text <-> token ids from the command
 * line. Exit status: 0 ok, 1 bad file or data, 2 bad usage. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "tokenizer.h"
#include "util.h"

#define MAX_INPUT_BYTES ((size_t)1 << 30)

static void tokenize_usage(FILE *f)
{
    fprintf(f,
            "usage: shoal tokenize [--model] [PATH] (--text T | --file F) "
            "[--no-bos] [--parse-special]\n"
            "\n"
            "Print the token ids of a text on one line, space-separated.\n"
            "  --model PATH, PATH  checkpoint directory, tokenizer.json or .gguf file\n"
            "                      (default: %s)\n"
            "  --text T            the text to encode\n"
            "  --file F            encode the bytes of file F ('-' = stdin)\n"
            "  --no-bos            do not add BOS (or other template tokens)\n"
            "  --parse-special     turn special-token text such as \"<s>\" into its id\n",
            shoal_cli_default_model());
}

static void detokenize_usage(FILE *f)
{
    fprintf(f,
            "usage: shoal detokenize [--model] [PATH] (--ids IDS | --file F) "
            "[--special] [-n]\n"
            "\n"
            "Print the text of token ids (followed by a newline unless -n).\n"
            "  --model PATH, PATH  checkpoint directory, tokenizer.json or .gguf file\n"
            "                      (default: %s)\n"
            "  --ids IDS           ids separated by spaces or commas: \"1 2 3\", 1,2,3\n"
            "  --file F            read the ids from file F ('-' = stdin)\n"
            "  --special           render special tokens (BOS, EOS, ...) too\n"
            "  -n                  no trailing newline\n",
            shoal_cli_default_model());
}

/* Take the model path, given as --model PATH (set) or as a plain word a.
 * Returns 1 when taken, 0 when a is a flag, -1 after a usage error: a
 * second path, whose hint names the command's input flags (a user who
 * typed 'tokenize MODEL "some text"' meant --text). */
static int take_model(const char *cmd, const char *input_flags, const char *a, int flag,
                      const char **model)
{
    if (!flag && a[0] == '-' && a[1] != '\0')
        return 0;
    if (*model) {
        shoal_cli_error("%s: unexpected %s '%s': the model is already '%s' (give it once, "
                        "as a path or with --model; the input is %s)", cmd,
                        flag ? "--model" : "argument", a, *model, input_flags);
        return -1;
    }
    *model = a;
    return 1;
}

/* Fetch the value of flag argv[*i]; prints the usage error itself. */
static const char *flag_value(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        shoal_cli_error("%s needs a value", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

/* The tokenizer of model (a directory, tokenizer.json, tiktoken.model or
 * .gguf); NULL after the error line. *usage: 1 when the path does not
 * exist or is a directory with neither a tokenizer nor a model (exit 2, as
 * for the other commands' --model). */
static struct shoal_tokenizer *load(const char *model, int *usage)
{
    struct stat st;
    *usage = stat(model, &st) != 0;
    if (*usage) {
        if (errno == ENOENT || errno == ENOTDIR)
            shoal_cli_error("tokenizer: '%s' does not exist (expected a model directory or "
                            "a tokenizer file)", model);
        else
            shoal_cli_error("tokenizer: '%s': %s", model, strerror(errno));
        return NULL;
    }
    if (S_ISDIR(st.st_mode)) {
        /* a directory with no tokenizer that is no model either: a wrong path */
        static const char *const names[] = {"tokenizer.json", "tiktoken.model",
                                            "config.json", "shoal.json"};
        int any = 0;
        for (size_t k = 0; k < sizeof names / sizeof names[0] && !any; k++) {
            char *p = shoal_path_join(model, names[k]);
            any = shoal_exists(p);
            free(p);
        }
        if (!any) {
            *usage = 1;
            shoal_cli_error("not a model directory: '%s' has no tokenizer.json or "
                            "tiktoken.model, nor config.json or shoal.json; expected a "
                            "model directory, a tokenizer.json, a tiktoken.model or a .gguf",
                            model);
            return NULL;
        }
    }
    struct shoal_err err = {0};
    struct shoal_tokenizer *tok = shoal_tokenizer_load(model, &err);
    if (!tok)
        shoal_cli_error("%s", err.msg);
    return tok;
}

/* Neither input flag or both: say which, and when the positional argument
 * taken as the model is no path at all, that it was read as one (a text or
 * ids given without their flag) */
static void no_input(const char *cmd, const char *flags, const char *model)
{
    if (model && !shoal_exists(model))
        shoal_cli_error("%s: give exactly one of %s ('%s' was read as the model path, and "
                        "there is no such path)", cmd, flags, model);
    else
        shoal_cli_error("%s: give exactly one of %s", cmd, flags);
}

int shoal_cmd_tokenize(int argc, char **argv)
{
    const char *model = NULL, *text = NULL, *file = NULL;
    struct shoal_tokenize_params p = shoal_tokenize_params_default();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            tokenize_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--model")) {
            const char *v = flag_value(argc, argv, &i);
            if (!v || take_model("tokenize", "--text T or --file F", v, 1, &model) < 0)
                return 2;
        } else if (!strcmp(a, "--text") || !strcmp(a, "--file")) {
            const char **slot = a[2] == 't' ? &text : &file;
            if (*slot) {
                shoal_cli_error("tokenize: %s given twice", a);
                return 2;
            }
            if (!(*slot = flag_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "--no-bos")) {
            p.add_special = 0;
        } else if (!strcmp(a, "--parse-special")) {
            p.parse_special = 1;
        } else {
            int r = take_model("tokenize", "--text T or --file F", a, 0, &model);
            if (r < 0)
                return 2;
            if (r == 0) {
                shoal_cli_error("tokenize: unknown option '%s' (see 'shoal tokenize --help')",
                                a);
                return 2;
            }
        }
    }
    if (!!text == !!file) {
        no_input("tokenize", "--text or --file", model);
        return 2;
    }
    char *buf = NULL;
    size_t len = 0;
    int read_rc = file ? shoal_cli_read_input(file, MAX_INPUT_BYTES, &buf, &len) : 0;
    if (read_rc)
        return read_rc;
    if (text)
        len = strlen(text);
    int usage = 0;
    struct shoal_tokenizer *tok = load(model ? model : shoal_cli_default_model(), &usage);
    if (!tok) {
        free(buf);
        return usage ? 2 : 1;
    }
    struct shoal_err err = {0};
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc = 0;
    if (shoal_tokenizer_encode(tok, text ? text : buf, len, p, &ids, &n_ids,
                               &err)) {
        shoal_cli_error("%s", err.msg);
        rc = 1;
    } else {
        for (size_t i = 0; i < n_ids; i++)
            printf("%s%d", i ? " " : "", (int)ids[i]);
        printf("\n");
        if (fflush(stdout) != 0) {
            shoal_cli_error("cannot write the ids: %s", strerror(errno));
            rc = 1;
        }
    }
    free(ids);
    free(buf);
    shoal_tokenizer_destroy(tok);
    return rc;
}

/* Parse ids separated by spaces, tabs, newlines or commas ('[' and ']'
 * are ignored so a JSON list works too). Returns 0 or -1 (error shown). */
static int parse_ids(const char *s, int32_t **out, size_t *n_out)
{
    size_t n = 0, cap = 64;
    int32_t *v = shoal_xmalloc(cap * sizeof *v);
    const char *p = s;
    for (;;) {
        /* one comma between ids at most: "1,,2", ",1" and "1," are typos */
        int commas = 0;
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' ||
               *p == ',' || *p == '[' || *p == ']')
            commas += *p++ == ',';
        if (commas > 1 || (commas == 1 && (n == 0 || *p == '\0'))) {
            shoal_cli_error("detokenize: an empty item near id %zu (two commas in a row, "
                            "or a comma at an end)", n + 1);
            free(v);
            return -1;
        }
        if (*p == '\0')
            break;
        char *end = NULL;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno != 0 || x < 0 || x > INT32_MAX ||
            !(*end == '\0' || *end == ' ' || *end == '\t' || *end == '\n' ||
              *end == '\r' || *end == ',' || *end == ']')) {
            int w = 0;
            while (p[w] && p[w] != ' ' && p[w] != ',' && w < 32)
                w++;
            shoal_cli_error("detokenize: '%.*s' is not a token id; expected "
                            "a non-negative integer",
                            w, p);
            free(v);
            return -1;
        }
        if (n == cap) {
            cap *= 2;
            v = shoal_xrealloc(v, cap * sizeof *v);
        }
        v[n++] = (int32_t)x;
        p = end;
    }
    *out = v;
    *n_out = n;
    return 0;
}

int shoal_cmd_detokenize(int argc, char **argv)
{
    const char *model = NULL, *ids_arg = NULL, *file = NULL;
    int special = 0, newline = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            detokenize_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--model")) {
            const char *v = flag_value(argc, argv, &i);
            if (!v || take_model("detokenize", "--ids IDS or --file F", v, 1, &model) < 0)
                return 2;
        } else if (!strcmp(a, "--ids") || !strcmp(a, "--file")) {
            const char **slot = a[2] == 'i' ? &ids_arg : &file;
            if (*slot) {
                shoal_cli_error("detokenize: %s given twice", a);
                return 2;
            }
            if (!(*slot = flag_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "--special")) {
            special = 1;
        } else if (!strcmp(a, "-n")) {
            newline = 0;
        } else {
            int r = take_model("detokenize", "--ids IDS or --file F", a, 0, &model);
            if (r < 0)
                return 2;
            if (r == 0) {
                shoal_cli_error("detokenize: unknown option '%s' (see 'shoal detokenize "
                                "--help')", a);
                return 2;
            }
        }
    }
    if (!!ids_arg == !!file) {
        no_input("detokenize", "--ids or --file", model);
        return 2;
    }
    char *buf = NULL;
    size_t len = 0;
    int read_rc = file ? shoal_cli_read_input(file, MAX_INPUT_BYTES, &buf, &len) : 0;
    if (read_rc)
        return read_rc;
    if (file && memchr(buf, '\0', len)) {
        shoal_cli_error("detokenize: '%s' holds a NUL byte; expected ids "
                        "as text",
                        file);
        free(buf);
        return 1;
    }
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (parse_ids(ids_arg ? ids_arg : buf, &ids, &n_ids)) {
        free(buf);
        return ids_arg ? 2 : 1;
    }
    free(buf);
    int usage = 0;
    struct shoal_tokenizer *tok = load(model ? model : shoal_cli_default_model(), &usage);
    if (!tok) {
        free(ids);
        return usage ? 2 : 1;
    }
    struct shoal_err err = {0};
    int rc = 0;
    size_t n_text = 0;
    char *text = shoal_tokenizer_decode_len(tok, ids, n_ids, !special, &n_text, &err);
    if (!text) {
        shoal_cli_error("%s", err.msg);
        rc = 1;
    } else {
        fwrite(text, 1, n_text, stdout);
        if (newline)
            fputc('\n', stdout);
        if (fflush(stdout) != 0 || ferror(stdout)) {
            shoal_cli_error("cannot write the text: %s", strerror(errno));
            rc = 1;
        }
    }
    free(text);
    free(ids);
    shoal_tokenizer_destroy(tok);
    return rc;
}
