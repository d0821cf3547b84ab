#include "cli.h"

#include "kv.h"
#include "log.h"
#include "parse.h"
#include "quant.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config.h"
#include "container.h"
#include "util.h"

void shoal_cli_error(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    shoal_log_break();   /* streamed text that stands mid-line in stderr's file ends first */
    fprintf(stderr, "shoal: %s\n", buf);
}

int shoal_cli_parse_i64(const char *flag, const char *s, long long lo,
                        long long hi, long long *out)
{
    if (shoal_parse_i64(s, lo, hi, out) == 0)
        return 0;
    shoal_cli_error("%s expects an integer in [%lld, %lld], got '%s'", flag, lo, hi,
                    s ? s : "(nothing)");
    return -1;
}

int shoal_cli_parse_group(const char *flag, const char *s, int *out)
{
    long long g;
    if (shoal_parse_i64(s, 32, 128, &g) == 0 && shoal_quant_group_ok((int)g)) {
        *out = (int)g;
        return 0;
    }
    shoal_cli_error("%s expects 32, 64 or 128, got '%s'", flag, s ? s : "(nothing)");
    return -1;
}

int shoal_cli_parse_dtype(const char *flag, const char *s,
                          enum shoal_dtype *out)
{
    static const struct {
        const char *name;
        enum shoal_dtype dtype;
    } names[] = {
        {"f32", SHOAL_DTYPE_F32},         {"bf16", SHOAL_DTYPE_BF16},
        {"int8", SHOAL_DTYPE_INT8},       {"int4", SHOAL_DTYPE_INT4},
        {"int4a8", SHOAL_DTYPE_INT4A8},   {"fp8", SHOAL_DTYPE_FP8},
        {"mxfp4", SHOAL_DTYPE_MXFP4},
    };
    for (size_t i = 0; s && i < sizeof names / sizeof names[0]; i++) {
        if (!strcmp(s, names[i].name)) {
            *out = names[i].dtype;
            return 0;
        }
    }
    shoal_cli_error("%s expects int4a8|int4|int8|fp8|mxfp4|bf16|f32, got '%s'", flag,
                    s ? s : "(nothing)");
    return -1;
}

int shoal_cli_parse_kv(const char *flag, const char *s, enum shoal_dtype *out)
{
    if (!shoal_kv_dtype_parse(s, out))
        return 0;
    shoal_cli_error("%s expects f32|f16|bf16, got '%s'", flag, s ? s : "(nothing)");
    return -1;
}

int shoal_cli_parse_f64(const char *flag, const char *s, double lo, double hi,
                        double *out)
{
    char *end = NULL;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    if (!s || *s == '\0' || *end != '\0' || errno != 0 || isnan(v) || v < lo ||
        v > hi) {
        shoal_cli_error("%s expects a number in [%g, %g], got '%s'", flag, lo,
                        hi, s ? s : "(nothing)");
        return -1;
    }
    *out = v;
    return 0;
}

const char *shoal_cli_default_model(void)
{
    return SHOAL_SOURCE_ROOT "/models/shakespeare-moe";
}

int shoal_cli_parse_size(const char *flag, const char *s, unsigned long long *out)
{
    if (shoal_parse_size(s, out) == 0)
        return 0;
    shoal_cli_error("%s expects a size such as 0, 512M, 4G or unlimited, got '%s'", flag,
                    s ? s : "(nothing)");
    return -1;
}

void shoal_cli_usage_model(FILE *f)
{
    fprintf(f,
        "  --model DIR, DIR     the model: a Hugging Face checkpoint directory\n"
        "                       (config.json, *.safetensors, tokenizer.json) or a shoal\n"
        "                       container (made by 'shoal convert'), or a GGUF file\n"
        "                       (docs/MODELS.md \"GGUF files\"); default: the bundled\n"
        "                       model, %s\n", shoal_cli_default_model());
}

int shoal_cli_take_path(const char *cmd, const char *what, const char *a,
                        const char **slot)
{
    if (a[0] == '-' && a[1] != '\0')
        return 0;
    if (*slot) {
        shoal_cli_error("%s: unexpected argument '%s': the %s is already '%s' (give it "
                        "once, as a path or with its flag; see 'shoal %s --help')", cmd, a,
                        what, *slot, cmd);
        return -1;
    }
    *slot = a;
    return 1;
}

int shoal_cli_model_or_unknown(const char *cmd, const char *a, const char **model)
{
    const int r = shoal_cli_take_path(cmd, "model", a, model);
    if (r > 0)
        return 0;
    if (r == 0)
        shoal_cli_error("%s: unknown option '%s' (see 'shoal %s --help')", cmd, a, cmd);
    return 2;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

int shoal_cli_check_model_dir(const char *path, int given)
{
    static const char dirs[] =
        "a Hugging Face checkpoint directory (config.json, *.safetensors, "
        "tokenizer.json) or a shoal container directory (made by 'shoal convert')";
    struct stat st;
    if (stat(path, &st) != 0) {
        /* run, chat, perplexity, serve, bench, convert and shard take a GGUF
         * file as well (they check for one before calling here) */
        shoal_cli_error("model '%s' does not exist%s; a model is a GGUF file (run, chat, "
                        "perplexity, serve, bench, convert and shard take one: "
                        "docs/MODELS.md), %s", path,
                        given ? "" : " (the bundled model; pass --model DIR)", dirs);
        return -1;
    }
    if (S_ISDIR(st.st_mode)) {
        char config[4096];
        snprintf(config, sizeof config, "%s/config.json", path);
        if (shoal_container_is(path) || shoal_exists(config))
            return 0;
        shoal_cli_error("not a model directory: '%s' has neither config.json (a Hugging "
                        "Face checkpoint) nor shoal.json (a shoal container, made by "
                        "'shoal convert')", path);
        return -1;
    }
    const char *kind = "a file, not a directory";
    const char *use = "";
    if (ends_with(path, ".gguf")) {
        kind = "a GGUF file";
        use = "; shoal runs a .gguf file (run, chat, perplexity, serve; docs/MODELS.md) "
              "and reads its vocabulary ('shoal tokenize', 'shoal detokenize'), but this "
              "command does not take one";
    } else if (ends_with(path, "tokenizer.json")) {
        kind = "a tokenizer file";
        use = "; a tokenizer.json alone serves 'shoal tokenize' and 'shoal detokenize'";
    } else if (ends_with(path, ".safetensors") || ends_with(path, "config.json")) {
        kind = "one file of a checkpoint";
        use = "; pass the directory that holds it";
    }
    shoal_cli_error("model '%s' is %s; a model is %s%s", path, kind, dirs, use);
    return -1;
}

const char *shoal_cli_format_bytes(char *buf, size_t n, double bytes)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    for (; i < 4 && (bytes >= 1024 || bytes <= -1024); i++)
        bytes /= 1024;
    snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", bytes, unit[i]);
    return buf;
}

int shoal_cli_read_input(const char *path, size_t max_bytes, char **out, size_t *len)
{
    struct shoal_err err = {0};
    if (strcmp(path, "-") == 0) {
        if (shoal_read_stream(stdin, "stdin", max_bytes, out, len, &err)) {
            shoal_cli_error("%s", err.msg);
            return 1;
        }
        return 0;
    }
    struct stat st;
    if (stat(path, &st) != 0 ? errno == ENOENT || errno == ENOTDIR : S_ISDIR(st.st_mode)) {
        shoal_cli_error("input file '%s' %s", path,
                        errno == ENOENT || errno == ENOTDIR ? "does not exist"
                                                            : "is a directory, not a file");
        return 2;
    }
    if (shoal_read_file(path, max_bytes, out, len, &err)) {
        shoal_cli_error("%s", err.msg);
        return 1;
    }
    return 0;
}

int shoal_cli_assign_paths(const char *cmd, char **words, int n_words,
                           const struct shoal_cli_slot *slots, int n_slots)
{
    int w = 0;
    for (int k = 0; k < n_slots && w < n_words; k++)
        if (!*slots[k].value)
            *slots[k].value = words[w++];
    if (w < n_words) {
        char given[128] = "";
        for (int k = 0; k < n_slots; k++)
            snprintf(given + strlen(given), sizeof given - strlen(given), "%s%s '%s'",
                     k ? ", " : "", slots[k].flag, *slots[k].value);
        shoal_cli_error("%s: unexpected argument '%s' (already given: %s; see 'shoal %s "
                        "--help')", cmd, words[w], given, cmd);
        return -1;
    }
    return 0;
}
