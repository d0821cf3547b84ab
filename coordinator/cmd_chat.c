/* shoal chat: a multi-turn REPL. Renders the model's chat template
 * (tokenizer_config.json) over the whole conversation each turn, reuses the
 * KV cache for the longest common token prefix (so a turn prefills only its
 * new tokens), streams the reply, and keeps line editing + history.
 * Commands: /reset, /quit (or Ctrl-D). Ctrl-C stops a generation.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat_template.h"
#include "cli.h"
#include "config.h"
#include "session.h"
#include "util.h"

#if HAVE_LIBEDIT
#include <editline/readline.h>
#endif

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: shoal chat [--model DIR] [--system TEXT] [sampling options]\n"
        "\n"
        "  --model DIR        checkpoint directory (default: the bundled model)\n"
        "  --system TEXT      a system message to start the conversation\n"
        "  --max-tokens N     reply length limit (default 128)\n"
        "  --ctx N, --threads N, --temp, --top-k, --top-p, --min-p, --seed,\n"
        "  --repeat-penalty, --greedy, --stop STR   as for 'shoal run'\n"
        "\n"
        "In the session: /reset forgets the conversation, /quit or Ctrl-D leaves,\n"
        "Ctrl-C stops a reply that is being generated.\n"
        "\nExpert store (shoal containers only):\n");
    shoal_session_usage_store(f);
}

struct conv {
    struct shoal_chat_message *msgs;
    size_t n, cap;
};

static void conv_push(struct conv *c, const char *role, const char *content)
{
    if (c->n == c->cap) {
        c->cap = c->cap ? c->cap * 2 : 8;
        c->msgs = shoal_xrealloc(c->msgs, c->cap * sizeof *c->msgs);
    }
    c->msgs[c->n].role = shoal_xstrdup(role);
    c->msgs[c->n].content = shoal_xstrdup(content);
    c->n++;
}

static void conv_clear(struct conv *c, size_t keep)
{
    while (c->n > keep) {
        c->n--;
        free((char *)c->msgs[c->n].role);
        free((char *)c->msgs[c->n].content);
    }
}

/* Read one line; returns a malloc'd string without the newline, or NULL at
 * end of input. *was_interrupted set when Ctrl-C cancelled the line. */
static char *read_line(int tty, int *was_interrupted)
{
    *was_interrupted = 0;
    interrupted = 0;
#if HAVE_LIBEDIT
    if (tty) {
        char *l = readline("> ");
        if (!l && interrupted) {
            *was_interrupted = 1;
            return NULL;
        }
        if (l && *l)
            add_history(l);
        return l;
    }
#else
    if (tty) {
        fputs("> ", stdout);
        fflush(stdout);
    }
#endif
    size_t cap = 256, len = 0;
    char *buf = shoal_xmalloc(cap);
    int c;
    while ((c = fgetc(stdin)) != EOF && c != '\n') {
        if (len + 2 > cap) {
            cap *= 2;
            buf = shoal_xrealloc(buf, cap);
        }
        buf[len++] = (char)c;
    }
    if (c == EOF && len == 0) {
        free(buf);
        if (interrupted && errno == EINTR) {
            clearerr(stdin);
            *was_interrupted = 1;
        }
        return NULL;
    }
    buf[len] = '\0';
    return buf;
}

struct turn {
    char *prompt;      /* the rendered conversation, generation prompt included */
    int32_t *ids;      /* [n_ids] the tokens the cache must hold before generating */
    size_t n_ids;
    int64_t keep;      /* how many of them are already in the KV cache */
};

static int tokenize_text(struct shoal_session *s, const char *text, int32_t **ids,
                         size_t *n)
{
    struct shoal_err err = {0};
    struct shoal_tokenize_params tp = {.add_special = 0, .parse_special = 1};
    if (shoal_tokenizer_encode(s->tok, text, strlen(text), tp, ids, n, &err)) {
        shoal_cli_error("chat: %s", err.msg);
        return -1;
    }
    return 0;
}

/* Render the conversation and work out the tokens of this turn.
 * When the cache's text is a prefix of the new rendering, only the new text
 * is tokenized and appended, so the tokens the model generated stay in the
 * cache exactly as they are (the next turn prefills only the new tokens).
 * Otherwise the whole rendering is tokenized and the longest common token
 * prefix is kept. When the conversation no longer fits the context, the
 * oldest exchanges (after any system message) are dropped, with a note. */
static int build_turn(struct shoal_session *s, const struct shoal_chat_template *tmpl,
                      const struct shoal_chat_template_vars *vars, struct conv *conv,
                      size_t base_msgs, char **cache_text, struct turn *t)
{
    struct shoal_err err = {0};
    const int64_t n_ctx = shoal_ctx_n_ctx(s->ctx);
    memset(t, 0, sizeof *t);
    for (;;) {
        if (shoal_chat_template_render(tmpl, conv->msgs, conv->n, vars, &t->prompt, &err)) {
            shoal_cli_error("chat: template: %s", err.msg);
            return -1;
        }
        size_t cl = *cache_text ? strlen(*cache_text) : 0;
        if (*cache_text && s->n_history > 0 && !strncmp(t->prompt, *cache_text, cl)) {
            int32_t *delta = NULL;
            size_t nd = 0;
            if (tokenize_text(s, t->prompt + cl, &delta, &nd)) {
                free(t->prompt);
                return -1;
            }
            t->n_ids = (size_t)s->n_history + nd;
            t->ids = shoal_xmalloc((t->n_ids ? t->n_ids : 1) * sizeof(int32_t));
            memcpy(t->ids, s->history, (size_t)s->n_history * sizeof(int32_t));
            memcpy(t->ids + s->n_history, delta, nd * sizeof(int32_t));
            free(delta);
            t->keep = s->n_history;
        } else {
            if (tokenize_text(s, t->prompt, &t->ids, &t->n_ids)) {
                free(t->prompt);
                return -1;
            }
            t->keep = 0;
            while (t->keep < s->n_history && t->keep < (int64_t)t->n_ids &&
                   s->history[t->keep] == t->ids[t->keep])
                t->keep++;
        }
        if (t->keep == (int64_t)t->n_ids)
            t->keep--; /* one token must be evaluated for fresh logits */
        if ((int64_t)t->n_ids < n_ctx)
            break;
        /* too long: drop the oldest exchange and start the cache over */
        free(t->prompt);
        free(t->ids);
        memset(t, 0, sizeof *t);
        free(*cache_text);
        *cache_text = NULL;
        if (conv->n - base_msgs <= 1) {
            shoal_cli_error("chat: this message alone does not fit the context of %lld "
                            "tokens", (long long)n_ctx);
            return -1;
        }
        size_t drop = conv->n - base_msgs >= 3 ? 2 : 1;
        for (size_t k = 0; k < drop; k++) {
            free((char *)conv->msgs[base_msgs + k].role);
            free((char *)conv->msgs[base_msgs + k].content);
        }
        memmove(conv->msgs + base_msgs, conv->msgs + base_msgs + drop,
                (conv->n - base_msgs - drop) * sizeof *conv->msgs);
        conv->n -= drop;
        fprintf(stderr, "shoal: (the conversation outgrew the %lld-token context; "
                "dropped the oldest exchange)\n", (long long)n_ctx);
    }
    shoal_ctx_truncate(s->ctx, t->keep);
    s->n_history = t->keep;
    return 0;
}

int shoal_cmd_chat(int argc, char **argv)
{
    struct shoal_session_opts so = shoal_session_opts_default();
    struct shoal_gen_opts go = shoal_gen_opts_default();
    go.max_tokens = 128;
    const char *system_msg = NULL;
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
        if (!strcmp(a, "--system")) {
            if (i + 1 >= argc) {
                shoal_cli_error("--system needs a value");
                return 2;
            }
            system_msg = argv[++i];
            continue;
        }
        shoal_cli_error("chat: unknown option '%s' (see 'shoal chat --help')", a);
        return 2;
    }
    if (shoal_session_check_opts(&so))
        return 2;
    struct shoal_session *s = shoal_session_open(&so);
    if (!s)
        return 1;
    if (!s->tok) {
        shoal_cli_error("chat: model '%s' has no tokenizer.json", s->model->dir);
        shoal_session_close(s);
        return 1;
    }
    struct shoal_err err = {0};
    char *cfg_path = shoal_path_join(s->model->dir, "tokenizer_config.json");
    char *src = NULL, *bos = NULL, *eos = NULL;
    if (shoal_chat_template_load_config(cfg_path, &src, &bos, &eos, &err) || !src) {
        shoal_cli_error("chat: %s", err.code ? err.msg : "tokenizer_config.json has no chat_template");
        free(cfg_path);
        free(bos);
        free(eos);
        shoal_session_close(s);
        return 1;
    }
    free(cfg_path);
    struct shoal_chat_template *tmpl = shoal_chat_template_parse(src, &err);
    if (!tmpl) {
        shoal_cli_error("chat: chat_template of '%s': %s", s->model->dir, err.msg);
        free(src);
        free(bos);
        free(eos);
        shoal_session_close(s);
        return 1;
    }
    /* Stop at the end-of-turn marker the template writes after a reply. */
    static const char *const end_of_turn[] = {"<|im_end|>", "<|eot_id|>", "<|end|>",
                                              "<end_of_turn>", "<|endoftext|>"};
    for (size_t k = 0; k < sizeof end_of_turn / sizeof end_of_turn[0] && go.n_stop_ids < 8; k++) {
        int32_t id = shoal_tokenizer_token_id(s->tok, end_of_turn[k]);
        if (id >= 0)
            go.stop_ids[go.n_stop_ids++] = id;
    }
    go.print_timings = 0;

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    s->interrupt = (volatile int *)&interrupted;

    int tty = isatty(0) && isatty(1);
    if (tty)
        fprintf(stderr, "shoal chat: %s (%s). /reset, /quit; Ctrl-C stops a reply.\n",
                s->model->dir, s->model->cfg.family->model_type);
    struct conv conv = {0};
    if (system_msg)
        conv_push(&conv, "system", system_msg);
    const size_t base_msgs = conv.n;
    struct shoal_chat_template_vars vars = {.bos_token = bos ? bos : "",
                                            .eos_token = eos ? eos : "",
                                            .add_generation_prompt = 1};
    char *cache_text = NULL; /* the text the KV cache holds, when known */
    int rc = 0;
    for (;;) {
        int was_int = 0;
        char *line = read_line(tty, &was_int);
        if (!line) {
            if (was_int) {
                fputs("^C\n", stdout);
                continue;
            }
            break;
        }
        if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) {
            free(line);
            break;
        }
        if (!strcmp(line, "/reset")) {
            conv_clear(&conv, base_msgs);
            shoal_session_reset(s);
            free(cache_text);
            cache_text = NULL;
            fputs("(conversation reset)\n", stdout);
            fflush(stdout);
            free(line);
            continue;
        }
        if (!*line) {
            free(line);
            continue;
        }
        conv_push(&conv, "user", line);
        free(line);
        struct turn t;
        if (build_turn(s, tmpl, &vars, &conv, base_msgs, &cache_text, &t) != 0) {
            conv_clear(&conv, conv.n - 1);
            rc = 1; /* the session goes on; the exit status remembers */
            continue;
        }
        char *reply = NULL;
        struct shoal_gen_result res;
        go.capture = &reply;
        go.result = &res;
        interrupted = 0;
        double t0 = shoal_time_s();
        int grc = shoal_session_generate(s, t.ids + t.keep, t.n_ids - (size_t)t.keep, &go, stdout);
        if (grc != 0) {
            rc = 1;
            free(t.ids);
            free(t.prompt);
            free(reply);
            conv_clear(&conv, conv.n - 1);
            free(cache_text);
            cache_text = NULL;
            continue;
        }
        if (interrupted)
            fputs(" [stopped]", stdout);
        fputs("\n", stdout);
        fflush(stdout);
        if (so.verbose)
            fprintf(stderr, "shoal: turn prefilled %lld new tokens (%lld reused from the "
                    "KV cache), %.2f s\n", (long long)((int64_t)t.n_ids - t.keep),
                    (long long)t.keep, shoal_time_s() - t0);
        /* What the cache now holds, as text: the prompt, the reply as
         * printed, and the end token when one was evaluated. Unknown after
         * a stop string (tokens past it are cached but not shown). */
        free(cache_text);
        cache_text = NULL;
        if (res.reason != SHOAL_STOP_STRING && reply) {
            const char *et = "";
            size_t el = 0;
            if (res.reason == SHOAL_STOP_EOS)
                shoal_tokenizer_token_text(s->tok, res.last_id, &et, &el);
            size_t pl = strlen(t.prompt), rl = strlen(reply);
            cache_text = shoal_xmalloc(pl + rl + el + 1);
            memcpy(cache_text, t.prompt, pl);
            memcpy(cache_text + pl, reply, rl);
            memcpy(cache_text + pl + rl, et, el);
            cache_text[pl + rl + el] = '\0';
        }
        conv_push(&conv, "assistant", reply ? reply : "");
        free(reply);
        free(t.prompt);
        free(t.ids);
    }
    free(cache_text);
    conv_clear(&conv, 0);
    free(conv.msgs);
    shoal_chat_template_free(tmpl);
    free(src);
    free(bos);
    free(eos);
    shoal_session_close(s);
    return rc;
}
