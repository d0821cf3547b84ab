/* shoal run: generate text from a prompt, streamed token by token.
 *
 * Signals (the worker's discipline, worker/main.c): the first SIGINT or
 * SIGTERM ends the generation cleanly at the next token: the text so far
 * and the stats line are printed, --logits-out and --ids-out are closed
 * whole, and the exit status is 128 + the signal's number (130, 143), as
 * a shell reports a command a signal ended, so a script can tell the text
 * is cut short. A signal during start-up (loading, prefill) ends it before
 * the first token. A second signal exits at once: the process dies of it
 * (its output files may then be incomplete). */
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "forward.h"
#include "model.h"
#include "npy.h"
#include "sampler.h"
#include "session.h"
#include "session_flags.h"
#include "tokenizer.h"
#include "util.h"

#define MAX_PROMPT_BYTES ((size_t)1 << 30)

static volatile sig_atomic_t g_stop;   /* the first stop signal's number, 0: none */

static void on_stop(int sig)
{
    if (g_stop) {   /* the second: at once, as its default action */
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    g_stop = sig;
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: shoal run [--model] [MODEL] (--prompt TEXT | --file F | --tokens 1,2,3)\n"
        "                 [options]\n"
        "\n");
    shoal_cli_usage_model(f);
    fprintf(f,
        "  --prompt TEXT        prompt text (tokenized with the model's tokenizer);\n"
        "                       --prompt - reads it from stdin\n"
        "  --file F             read the prompt text from file F ('-' = stdin), its\n"
        "                       bytes exactly (a final newline included)\n"
        "  --tokens IDS         prompt as comma-separated token ids\n"
        "  --no-echo            do not print the prompt text before the continuation\n");
    shoal_gen_usage(f, SHOAL_GEN_USAGE_RUN);
    fprintf(f,
        "  --ctx N              context length in tokens (default min(max_position_embeddings, 4096))\n"
        "  --kv f32|f16|bf16    KV cache dtype (default: the container's, else f32)\n"
        "  --batch N            prefill chunk in tokens (default 256; the same bits at any)\n"
        "  --isa NAME           kernels to run (default: the best this CPU has; the same\n"
        "                       bits on every one): avx512, avx2, scalar, neon, ...\n"
        "  --threads N          compute threads (default: all cores)\n"
        "  -v, --verbose        print what was loaded (family, threads, context, kernels)\n"
        "\nThe first SIGINT (Ctrl-C) or SIGTERM ends the generation at the next token (the\n"
        "text so far and the stats line printed, exit status 130 or 143); a second one\n"
        "exits at once.\n"
        "\nExpert store (shoal containers and GGUF files):\n");
    shoal_session_usage_store(f);
}

int shoal_cmd_run(int argc, char **argv)
{
    struct shoal_session_opts so = shoal_session_opts_default();
    struct shoal_gen_opts go = shoal_gen_opts_default();
    const char *prompt = NULL, *tokens_arg = NULL, *file = NULL;
    int no_echo = 0, n_prompts = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = shoal_session_parse_flag(&so, argc, argv, &i);
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
        r = shoal_gen_parse_flag(&go, argc, argv, &i);
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--no-echo")) {
            no_echo = 1;
            continue;
        }
        if (!strcmp(a, "--prompt") || !strcmp(a, "--tokens") || !strcmp(a, "--file")) {
            if (i + 1 >= argc) {
                shoal_cli_error("%s needs a value", a);
                return 2;
            }
            if (!strcmp(a, "--prompt"))
                prompt = argv[++i];
            else if (!strcmp(a, "--file"))
                file = argv[++i];
            else
                tokens_arg = argv[++i];
            n_prompts++;
            continue;
        }
        if (shoal_cli_model_or_unknown("run", a, &so.model_dir))
            return 2;
    }
    if (n_prompts != 1) {
        shoal_cli_error("run: give exactly one of --prompt TEXT, --file F or --tokens IDS "
                        "(%d given)", n_prompts);
        return 2;
    }
    so.mtp = go.speculate == SHOAL_SPEC_MTP ? 1 : go.speculate == SHOAL_SPEC_AUTO ? 2 : 0;
    if (go.draft_logits_out) {
        if (go.speculate != SHOAL_SPEC_OFF) {
            shoal_cli_error("run: --draft-logits-out writes a row per generated token; expected "
                            "--speculate off, found %s", shoal_spec_mode_name(go.speculate));
            return 2;
        }
        so.mtp = 1;
    }
    if (shoal_session_check_opts(&so))
        return 2;
    char *text = NULL;   /* the prompt read from a file or stdin */
    if (prompt && !strcmp(prompt, "-"))
        file = "-";
    if (file) {
        size_t len = 0;
        int read_rc = shoal_cli_read_input(file, MAX_PROMPT_BYTES, &text, &len);
        if (read_rc)
            return read_rc;
        if (strlen(text) != len) {
            shoal_cli_error("run: the prompt in '%s' holds a NUL byte at offset %zu; "
                            "expected UTF-8 text", !strcmp(file, "-") ? "stdin" : file,
                            strlen(text));
            free(text);
            return 1;
        }
        prompt = text;
    }
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (tokens_arg && shoal_cli_parse_id_list(tokens_arg, &ids, &n_ids) != 0)
        return 2;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sa.sa_flags = SA_RESTART;   /* the store's reads and the cluster's waits go on */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    int rc = 1;
    struct shoal_session *s = shoal_cli_session_open(&so, &rc);
    if (!s) {
        free(ids);
        free(text);
        return rc;
    }
    rc = 1;
    if (prompt && shoal_cli_tokenize(s, prompt, "give the prompt as --tokens IDS", !go.no_bos,
                                     &ids, &n_ids) != 0)
        goto done;
    /* a prompt that gives no tokens, or ids outside the vocabulary, is a bad
     * flag value (exit 2), found before anything runs */
    if (n_ids == 0) {
        shoal_cli_error("the prompt is empty (no tokens)%s",
                        prompt ? ": --prompt or --file gave no text" : "");
        rc = 2;
        goto done;
    }
    for (size_t k = 0; k < n_ids; k++)
        if (ids[k] < 0 || ids[k] >= s->model->cfg.n_vocab) {
            shoal_cli_error("%s: token id %d at position %zu is outside the vocabulary "
                            "[0, %lld)", tokens_arg ? "--tokens" : "the prompt", ids[k], k,
                            (long long)s->model->cfg.n_vocab);
            rc = 2;
            goto done;
        }
    if (prompt && !no_echo)
        go.echo = prompt;   /* printed once the output files are open */
    s->interrupt = (volatile int *)&g_stop;
    rc = shoal_cli_generate(s, ids, n_ids, &go, stdout) == 0 ? 0 : 1;
    if (rc == 0 && g_stop)
        rc = 128 + g_stop;
done:
    free(ids);
    free(text);
    shoal_cli_session_close(s);
    return rc;
}
