/* shoal run: generate text from a prompt, streamed token by token. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "forward.h"
#include "model.h"
#include "npy.h"
#include "sampler.h"
#include "session.h"
#include "tokenizer.h"
#include "util.h"

static void usage(FILE *f)
{
    fprintf(f,
        "usage: shoal run [--model DIR] (--prompt TEXT | --tokens 1,2,3) [options]\n"
        "\n"
        "  --model DIR          Hugging Face checkpoint directory or shoal container\n"
        "                       (default: the bundled model, %s)\n"
        "  --prompt TEXT        prompt text (tokenized with the model's tokenizer)\n"
        "  --tokens IDS         prompt as comma-separated token ids\n"
        "  --no-echo            do not print the prompt text before the continuation\n"
        "  --max-tokens N       tokens to generate (default 256)\n"
        "  --greedy             argmax decoding\n"
        "  --temp T             temperature (default 0.8; 0 = greedy)\n"
        "  --top-k K            keep the K most likely tokens (default 40, 0 = off)\n"
        "  --top-p P            nucleus sampling threshold (default 0.95)\n"
        "  --min-p P            drop tokens below P x the top probability (default 0.05)\n"
        "  --repeat-penalty R   penalise recent tokens (default 1.0 = off)\n"
        "  --repeat-last-n N    window of the penalty (default 64)\n"
        "  --seed S             sampling seed (default 24301)\n"
        "  --stop STR           stop when STR is generated (repeatable)\n"
        "  --ignore-eos         keep generating past end-of-sequence tokens\n"
        "  --no-bos             do not add the tokenizer's BOS token\n"
        "  --ctx N              context length in tokens (default min(max_position_embeddings, 4096))\n"
        "  --threads N          compute threads (default: all cores)\n"
        "  -v, --verbose        print what was loaded (family, threads, context, kernels)\n"
        "  --logits-out F.npy   write the f32 logits of every step, [steps][vocab]\n"
        "  --ids-out FILE       write the generated token ids, space-separated\n"
        "\nExpert store (shoal containers only):\n",
        shoal_cli_default_model());
    shoal_session_usage_store(f);
}

int shoal_cmd_run(int argc, char **argv)
{
    struct shoal_session_opts so = shoal_session_opts_default();
    struct shoal_gen_opts go = shoal_gen_opts_default();
    const char *prompt = NULL, *tokens_arg = NULL;
    int no_echo = 0;
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
        if (!strcmp(a, "--prompt") || !strcmp(a, "--tokens")) {
            if (i + 1 >= argc) {
                shoal_cli_error("%s needs a value", a);
                return 2;
            }
            if (!strcmp(a, "--prompt"))
                prompt = argv[++i];
            else
                tokens_arg = argv[++i];
            continue;
        }
        shoal_cli_error("run: unknown option '%s' (see 'shoal run --help')", a);
        return 2;
    }
    if (!prompt == !tokens_arg) {
        shoal_cli_error("run: give exactly one of --prompt TEXT or --tokens IDS");
        return 2;
    }
    if (shoal_session_check_opts(&so))
        return 2;
    struct shoal_session *s = shoal_session_open(&so);
    if (!s)
        return 1;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc = 1;
    if (prompt) {
        if (shoal_session_tokenize(s, prompt, !go.no_bos, &ids, &n_ids) != 0)
            goto done;
    } else if (shoal_parse_id_list(tokens_arg, &ids, &n_ids) != 0) {
        rc = 2;
        goto done;
    }
    if (prompt && !no_echo)
        go.echo = prompt;   /* printed once the output files are open */
    rc = shoal_session_generate(s, ids, n_ids, &go, stdout) == 0 ? 0 : 1;
done:
    free(ids);
    shoal_session_close(s);
    return rc;
}
