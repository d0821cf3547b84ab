/* shoal: the coordinator command line. Dispatches to subcommands. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bench_tools.h"
#include "cli.h"
#include "config.h"
#include "kv.h"
#include "omp_env.h"
#include "quant.h"

struct subcommand {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
};

static const struct subcommand subcommands[] = {
    {"run", shoal_cmd_run, "generate text from a prompt"},
    {"chat", shoal_cmd_chat, "talk with a model (multi-turn, chat template)"},
    {"serve", shoal_cmd_serve, "serve an OpenAI-compatible HTTP API (completions, chat)"},
    {"perplexity", shoal_cmd_perplexity, "score a text file (perplexity)"},
    {"convert", shoal_cmd_convert, "make a shoal container from a Hugging Face checkpoint or a GGUF file"},
    {"inspect", shoal_cmd_inspect, "describe a container, shard or GGUF file (--verify: its checksums)"},
    {"bench", shoal_cmd_bench, "measure one configuration against the machine's limits (JSON)"},
    {"plan", shoal_cmd_plan, "size a model (config.json, container or GGUF): RAM, disk, speed"},
    {"shard", shoal_cmd_shard, "split a container into one partial container per worker"},
    {"status", shoal_cmd_status, "show a running cluster: executors, caches, time per token"},
    {"synth", shoal_cmd_synth, "write a synthetic container for benchmarks (--check: measure one)"},
    {"template", shoal_cmd_template, "print the prompt a chat template renders for a conversation"},
    {"tokenize", shoal_cmd_tokenize, "print the token ids of a text"},
    {"detokenize", shoal_cmd_detokenize, "print the text of token ids"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: shoal <command> [options]\n"
               "       shoal help [<command>]\n"
               "       shoal --version\n\ncommands:\n");
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        fprintf(f, "  %-12s %s\n", subcommands[i].name, subcommands[i].help);
    fprintf(f, "\noptions:\n"
               "  -h, --help   this help\n"
               "  --version    print the version (shoal %s) and exit\n"
               "\n'shoal <command> --help' or 'shoal help <command>' shows a command's "
               "options.\n", SHOAL_VERSION);
}

static const struct subcommand *find(const char *name)
{
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        if (!strcmp(name, subcommands[i].name))
            return &subcommands[i];
    return NULL;
}

static void unknown(const char *name)
{
    char names[256] = "";
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++) {
        if (i)
            strncat(names, ", ", sizeof names - strlen(names) - 1);
        strncat(names, subcommands[i].name, sizeof names - strlen(names) - 1);
    }
    shoal_cli_error("unknown command '%s'; expected one of: %s", name, names);
}

/* A memory-mapped model file (a GGUF's trunk, a container's dense.bin,
 * safetensors) that shrinks while shoal runs faults with SIGBUS on the
 * next read of a page past its new end: say so in one line and exit 1,
 * rather than die with no word (write and _exit: async-signal-safe). */
static void on_sigbus(int sig)
{
    (void)sig;
    static const char msg[] = "shoal: a model file shrank or became unreadable while it was "
                              "in use (SIGBUS reading its mapping: was it replaced or "
                              "truncated?); stopping\n";
    ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)w;
    _exit(1);
}

int main(int argc, char **argv)
{
    shoal_omp_env_init(argv);            /* first: it may re-execute the process */
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "help") && argc > 2) {
        /* shoal help CMD = shoal CMD --help */
        const struct subcommand *c = find(argv[2]);
        if (!c) {
            unknown(argv[2]);
            return 2;
        }
        char *help_argv[] = {argv[2], (char *)"--help", NULL};
        return c->fn(2, help_argv);
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("shoal %s\n", SHOAL_VERSION);
        return 0;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigbus;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
    /* pick the quantized kernels once (AVX2, NEON or scalar; same bits) */
    shoal_quant_init(SHOAL_QUANT_ISA_AUTO, NULL);
    shoal_kv_init(SHOAL_KV_ISA_AUTO, NULL);
    const struct subcommand *c = find(argv[1]);
    if (c) {
        int rc = c->fn(argc - 1, argv + 1);
        /* what a command printed must have reached stdout (a full disk, a
         * closed pipe): otherwise the run did not do what it said */
        errno = 0;
        if ((fflush(stdout) != 0 || ferror(stdout)) && rc == 0) {
            shoal_cli_error("%s: cannot write the output: %s", argv[1],
                            errno ? strerror(errno) : "write error");
            rc = 1;
        }
        return rc;
    }
    unknown(argv[1]);
    return 2;
}
