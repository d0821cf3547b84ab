/* shoal perplexity: mean negative log-likelihood of a text under the model.
 *
 * Protocol (the one models/train_shakespeare_moe.py reports): tokenize the
 * whole file without BOS, cut the ids into consecutive non-overlapping
 * windows of exactly --ctx tokens (the final partial window is dropped),
 * evaluate each window from an empty cache, and score tokens 1..n-1 of each
 * window from their prefix. loss = mean NLL in nats; perplexity = exp(loss).
 * --score-from N scores only the tokens after position N of each window
 * (the predictions made at positions N..n-2): llama.cpp's llama-perplexity
 * scores the second half of each chunk, N = ctx / 2, so that a comparison
 * with it on the same GGUF file uses its protocol.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <utf8proc.h>

#include "cli.h"
#include "sampler.h"
#include "session.h"
#include "session_flags.h"
#include "util.h"

static void usage(FILE *f)
{
    fprintf(f,
        "usage: shoal perplexity [--model] [MODEL] --file TEXT [--ctx N] [--max-windows N]\n"
        "                        [--json] [options]\n"
        "\n");
    shoal_cli_usage_model(f);
    fprintf(f,
        "  --file TEXT          UTF-8 text to score ('-' = stdin)\n"
        "  --ctx N              window length in tokens (default: max_position_embeddings,\n"
        "                       at most 4096)\n"
        "  --max-windows N      score only the first N windows (default: all)\n"
        "  --score-from N       score only the predictions made at positions N.. of\n"
        "                       each window (default 0: all; llama-perplexity's\n"
        "                       protocol is N = ctx / 2)\n"
        "  --json               print the result as one JSON object: model, model_type,\n"
        "                       file, loss, perplexity, window, score_from, n_windows,\n"
        "                       n_predictions, tokens_per_second\n"
        "  --kv f32|f16|bf16    KV cache dtype (default: the container's, else f32)\n"
        "  --batch N            prefill chunk in tokens (default 256; the same bits at any)\n"
        "  --isa NAME           kernels to run (default: the best this CPU has; the same\n"
        "                       bits on every one): avx512, avx2, scalar, neon, ...\n"
        "  --threads N          compute threads (default: all cores)\n"
        "  -v, --verbose        print what was loaded (family, threads, context, kernels)\n"
        "\n"
        "Progress goes to stderr, one updating line, only when stderr is a terminal.\n"
        "\nExpert store (shoal containers and GGUF files):\n");
    shoal_session_usage_store(f);
}

int shoal_cmd_perplexity(int argc, char **argv)
{
    struct shoal_session_opts so = shoal_session_opts_default();
    const char *file = NULL;
    long long max_windows = -1, score_from = 0;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = shoal_session_parse_flag(&so, argc, argv, &i);
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        }
        if ((!strcmp(a, "--file") || !strcmp(a, "--max-windows") ||
             !strcmp(a, "--score-from")) && i + 1 >= argc) {
            shoal_cli_error("%s needs a value", a);
            return 2;
        }
        if (!strcmp(a, "--file")) {
            file = argv[++i];
            continue;
        }
        if (!strcmp(a, "--score-from")) {
            if (shoal_cli_parse_i64(a, argv[++i], 0, (long long)1 << 40, &score_from))
                return 2;
            continue;
        }
        if (!strcmp(a, "--max-windows")) {
            if (shoal_cli_parse_i64(a, argv[++i], 1, (long long)1 << 40, &max_windows))
                return 2;
            continue;
        }
        if (shoal_cli_model_or_unknown("perplexity", a, &so.model_dir))
            return 2;
    }
    if (!file) {
        shoal_cli_error("perplexity: --file TEXT is required");
        return 2;
    }
    if (so.n_ctx == 1) {
        shoal_cli_error("perplexity: --ctx must be at least 2 (a window predicts its "
                        "tokens 1..n-1 from their prefix)");
        return 2;
    }
    struct shoal_err err = {0};
    char *text = NULL;
    size_t len = 0;
    int read_rc = shoal_cli_read_input(file, (size_t)1 << 31, &text, &len);
    if (read_rc)
        return read_rc;
    /* a text to score: UTF-8 without NUL bytes (binary data was scored,
     * perplexity in the millions, exit 0) */
    const char *where = !strcmp(file, "-") ? "stdin" : file;
    for (size_t at = 0; at < len;) {
        utf8proc_int32_t cp;
        const utf8proc_ssize_t n = utf8proc_iterate((const utf8proc_uint8_t *)text + at,
                                                    (utf8proc_ssize_t)(len - at), &cp);
        if (n <= 0 || cp == 0) {
            shoal_cli_error("perplexity: '%s' is not UTF-8 text: %s at byte %zu", where,
                            n <= 0 ? "an invalid sequence" : "a NUL byte", at);
            free(text);
            return 1;
        }
        at += (size_t)n;
    }
    int open_rc;
    struct shoal_session *s = shoal_cli_session_open(&so, &open_rc);
    if (!s) {
        free(text);
        return open_rc;
    }
    int rc = 1;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    float *logits = NULL;
    if (shoal_cli_tokenize(s, text, "perplexity scores a text, so it needs one", 0, &ids,
                           &n_ids))
        goto done;
    const int64_t W = shoal_ctx_n_ctx(s->ctx);
    const int64_t V = s->model->cfg.n_vocab;
    if (score_from > W - 2) {
        shoal_cli_error("perplexity: --score-from %lld leaves nothing to score in a window of "
                        "%lld tokens; expected 0..%lld", score_from, (long long)W,
                        (long long)(W - 2));
        rc = 2;
        goto done;
    }
    int64_t n_windows = (int64_t)n_ids / W;
    if (max_windows > 0 && n_windows > max_windows)
        n_windows = max_windows;
    if (n_windows == 0) {
        shoal_cli_error("perplexity: '%s' has %zu tokens, fewer than one window of "
                        "%lld (lower --ctx)", file, n_ids, (long long)W);
        goto done;
    }
    const int64_t B = 64;
    logits = malloc((size_t)B * (size_t)V * sizeof(float));
    if (!logits) {
        shoal_cli_error("cannot allocate %lld bytes of logits", (long long)(B * V * 4));
        goto done;
    }
    /* an updating line is for a person watching; a pipe or a log gets none */
    const int progress = !json && isatty(STDERR_FILENO);
    double nll = 0.0, t0 = shoal_time_s();
    int64_t n_pred = 0;
    for (int64_t w = 0; w < n_windows; w++) {
        const int32_t *win = ids + w * W;
        shoal_session_reset(s);
        for (int64_t off = 0; off < W; off += B) {
            int64_t nb = W - off < B ? W - off : B;
            if (shoal_ctx_eval(s->ctx, win + off, nb, logits, 1, &err)) {
                if (progress && w > 0)   /* off the \r progress line */
                    fputc('\n', stderr);
                shoal_cli_error("%s", err.msg);
                goto done;
            }
            for (int64_t t = 0; t < nb; t++) {
                int64_t pos = off + t;
                if (pos + 1 >= W)
                    break;
                if (pos < score_from)
                    continue;
                const float *l = logits + t * V;
                if (shoal_logits_check(l, V, &err, "perplexity: window %lld, position %lld: "
                                       "the model's logits", (long long)w + 1,
                                       (long long)pos)) {
                    if (progress && w > 0)   /* off the \r progress line */
                        fputc('\n', stderr);
                    shoal_cli_error("%s", err.msg);
                    goto done;
                }
                double mx = l[0];
                for (int64_t v = 1; v < V; v++)
                    if (l[v] > mx)
                        mx = l[v];
                double z = 0.0;
                for (int64_t v = 0; v < V; v++)
                    z += exp((double)l[v] - mx);
                nll += -(((double)l[win[pos + 1]] - mx) - log(z));
                n_pred++;
            }
        }
        if (progress)
            fprintf(stderr, "\rshoal: window %lld/%lld, running perplexity %.4f",
                    (long long)(w + 1), (long long)n_windows, exp(nll / (double)n_pred));
    }
    if (progress)
        fprintf(stderr, "\n");
    double loss = nll / (double)n_pred;
    double secs = shoal_time_s() - t0;
    if (json) {
        /* which model scored the file, beside the file: a result is
         * compared with others, and names are escaped (jansson) */
        json_t *j = json_pack("{s:s, s:s, s:s, s:f, s:f, s:I, s:I, s:I, s:I, s:f}",
                              "model", s->model->dir, "model_type",
                              s->model->cfg.family->model_type, "file", file, "loss", loss,
                              "perplexity", exp(loss), "window", (json_int_t)W, "score_from",
                              (json_int_t)score_from, "n_windows",
                              (json_int_t)n_windows, "n_predictions", (json_int_t)n_pred,
                              "tokens_per_second", (double)(n_windows * W) / secs);
        if (!j || json_dumpf(j, stdout, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10)) ||
            putchar('\n') == EOF) {
            json_decref(j);
            shoal_cli_error("perplexity: cannot print the result as JSON");
            goto done;
        }
        json_decref(j);
    } else
        printf("perplexity %.4f (loss %.4f nats/token) over %lld predictions in %lld "
               "windows of %lld tokens; %.1f tok/s\n", exp(loss), loss, (long long)n_pred,
               (long long)n_windows, (long long)W, (double)(n_windows * W) / secs);
    rc = 0;
done:
    free(logits);
    free(ids);
    free(text);
    shoal_cli_session_close(s);
    return rc;
}
