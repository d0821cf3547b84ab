/* shoal chat: a multi-turn REPL. Renders the model's chat template
 * (tokenizer_config.json) over the whole conversation each turn, reuses the
 * KV cache for the longest common token prefix (so a turn prefills only its
 * new tokens), streams the reply, and keeps line editing + history.
 * Commands: /help, /reset, /quit (or Ctrl-D); other /words are refused
 * locally, never sent. Ctrl-C stops a generation. On a terminal, echo is
 * off while a reply streams, so text typed meanwhile does not land in the
 * printed reply; it stays in the input queue and the line editor shows it
 * at the next prompt (typeahead is kept, not flushed).
 * Harmony models (gpt-oss: <|start|>, <|channel|>, <|message|>, <|end|> in
 * the vocabulary): the reply is parsed per token (harmony.h); the final
 * channel is shown, the analysis channel only with --show-reasoning, the
 * reply ends at <|return|> or <|call|> (not at <|end|>, which closes the
 * analysis), and the conversation keeps the final text as the assistant's
 * content (the template drops past analysis).
 * Signals: SIGINT stops the reply being generated (at the next token) and
 * the session goes on; at the prompt it cancels the line. SIGTERM ends the
 * reply being generated at the next token, as SIGINT does, then the
 * session (exit status 143, nothing more is read); at the prompt it ends
 * the session at once. A second signal while a reply is still stopping,
 * or any after SIGTERM, exits at once (the process dies of it, the
 * terminal's echo restored first) -- the discipline of shoal-worker.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <unistd.h>

#include "chat_template.h"
#include "cli.h"
#include "harmony.h"
#include "log.h"
#include "config.h"
#include "session.h"
#include "session_flags.h"
#include "util.h"

#if HAVE_LIBEDIT
#include <editline/readline.h>
#endif

static volatile sig_atomic_t interrupted;   /* stop the reply, or cancel the line */
static volatile sig_atomic_t terminated;    /* SIGTERM's number: end the session */
static volatile sig_atomic_t generating;    /* a reply is being generated */

static void die_of(int sig);

/* SIGINT and SIGTERM: the first stops the reply at the next token; a
 * second before it has stopped, or any after SIGTERM, exits at once. */
static void on_stop(int sig)
{
    if (terminated || (generating && interrupted))
        die_of(sig);
    if (sig == SIGTERM)
        terminated = sig;
    interrupted = 1;
}

/* "/word" (letters only, then the end or a blank): a command, never sent. */
static int is_command(const char *line)
{
    size_t n = 1;
    if (line[0] != '/')
        return 0;
    while ((line[n] >= 'a' && line[n] <= 'z') || (line[n] >= 'A' && line[n] <= 'Z'))
        n++;
    return n > 1 && (line[n] == '\0' || line[n] == ' ' || line[n] == '\t');
}

static void print_commands(FILE *f)
{
    fprintf(f,
        "  /help                these commands\n"
        "  /reset               forget the conversation (the system message stays)\n"
        "  /quit, /exit, Ctrl-D leave\n"
        "  Ctrl-C               stop a reply that is being generated\n"
        "  //TEXT               send /TEXT (a message that starts with '/')\n");
}

/* Terminal echo while a reply streams (stdin a terminal): off, so that text
 * typed meanwhile is not printed into the reply; restored afterwards
 * without flushing, so that text is the start of the next line. */
static struct termios g_tty_saved;
static volatile sig_atomic_t g_tty_quiet;

static void tty_quiet_begin(int tty)
{
    struct termios t;
    if (!tty || tcgetattr(STDIN_FILENO, &g_tty_saved) != 0)
        return;
    t = g_tty_saved;
    t.c_lflag &= ~(tcflag_t)(ECHO | ECHONL);
    if (tcsetattr(STDIN_FILENO, TCSANOW, &t) == 0)
        g_tty_quiet = 1;
}

static void tty_quiet_end(void)
{
    if (g_tty_quiet) {
        tcsetattr(STDIN_FILENO, TCSANOW, &g_tty_saved);   /* TCSANOW: keep typeahead */
        g_tty_quiet = 0;
    }
}

/* Restore the terminal's echo if it is off, then die of sig (SIGHUP, or a
 * second stop signal). Async-signal-safe. */
static void die_of(int sig)
{
    if (g_tty_quiet)
        tcsetattr(STDIN_FILENO, TCSANOW, &g_tty_saved);   /* async-signal-safe */
    signal(sig, SIG_DFL);
    raise(sig);
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: shoal chat [--model] [MODEL] [--system TEXT] [options]\n"
        "\n");
    shoal_cli_usage_model(f);
    fprintf(f,
        "  --system TEXT        a system message to start the conversation\n"
        "  --print-prompt       before each reply, write the whole prompt the chat\n"
        "                       template rendered to stderr, byte for byte, between\n"
        "                       '--- prompt (N bytes)' and '--- end of prompt' lines\n"
        "                       ('shoal template' renders one without the model)\n"
        "  --show-reasoning     harmony models (gpt-oss): also show the analysis channel\n"
        "                       (the chain of thought), each message on a line of its\n"
        "                       own starting '[analysis] ', dim on a terminal; hidden\n"
        "                       by default (the final channel is the answer)\n");
    shoal_gen_usage(f, SHOAL_GEN_USAGE_CHAT);
    fprintf(f,
        "  --ctx N              context length in tokens (default min(max_position_embeddings, 4096))\n"
        "  --kv f32|f16|bf16    KV cache dtype (default: the container's, else f32)\n"
        "  --batch N            prefill chunk in tokens (default 256; the same bits at any)\n"
        "  --isa NAME           kernels to run (default: the best this CPU has; the same\n"
        "                       bits on every one): avx512, avx2, scalar, neon, ...\n"
        "  --threads N          compute threads (default: all cores)\n"
        "  -v, --verbose        print what was loaded, and per turn the tokens prefilled\n"
        "                       and reused from the KV cache\n"
        "\n"
        "One message per line (stdin may be a pipe: then each line is printed as\n"
        "'> LINE' before its reply). In the session:\n");
    print_commands(f);
    fprintf(f,
        "When the conversation outgrows the context, the oldest exchanges are dropped\n"
        "(with a note); a message that does not fit even alone is refused with the\n"
        "reason and the session goes on. Exit status: 0, also after a refused message;\n"
        "1 if a reply failed; 2 for bad options (a system prompt that fills the context);\n"
        "143 after SIGTERM, which ends the reply being generated at the next token, then\n"
        "the session. A second signal while a reply is stopping exits at once.\n"
        "\nExpert store (shoal containers and GGUF files):\n");
    shoal_session_usage_store(f);
}

/* The per-token hook of a harmony reply: parse, then show. */
struct harmony_out {
    struct shoal_harmony h;
    int show_reasoning, color;
    FILE *out;
};

static int harmony_on_token(void *user, int32_t id, const char *text, size_t n)
{
    struct harmony_out *ho = user;
    enum shoal_harmony_event ev = shoal_harmony_feed(&ho->h, id, text, n);
    shoal_harmony_show(&ho->h, ev, text, n, ho->show_reasoning, ho->color, ho->out);
    fflush(ho->out);
    return 0;
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

/* Tokens of msgs[0..n) rendered with the template (add_gen: with the
 * assistant header). Returns the count, or -1 with *err set (template or
 * tokenizer error). */
static int64_t count_tokens(struct shoal_session *s, const struct shoal_chat_template *tmpl,
                            const struct shoal_chat_template_vars *vars,
                            const struct shoal_chat_message *msgs, size_t n, int add_gen,
                            struct shoal_err *err)
{
    struct shoal_chat_template_vars v = *vars;
    v.add_generation_prompt = add_gen;
    char *text = NULL;
    if (shoal_chat_template_render(tmpl, msgs, n, &v, &text, err))
        return -1;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    struct shoal_tokenize_params tp = {.add_special = 0, .parse_special = 1};
    int rc = shoal_tokenizer_encode(s->tok, text, strlen(text), tp, &ids, &n_ids, err);
    free(text);
    free(ids);
    return rc ? -1 : (int64_t)n_ids;
}

/* Render the conversation and work out the tokens of this turn.
 * When the cache's text is a prefix of the new rendering, only the new text
 * is tokenized and appended, so the tokens the model generated stay in the
 * cache exactly as they are (the next turn prefills only the new tokens).
 * Otherwise the whole rendering is tokenized and the longest common token
 * prefix is kept. When the conversation no longer fits the context, the
 * oldest exchanges (after any system message) are dropped, with a note;
 * but first, if the new message does not fit even without them, it is
 * refused with the reason and nothing is dropped (returns -1; the caller
 * removes the message and the session goes on unchanged).
 * n_sys: tokens of the system message(s) alone, -1 if unknown. */
static int build_turn(struct shoal_session *s, const struct shoal_chat_template *tmpl,
                      const struct shoal_chat_template_vars *vars, struct conv *conv,
                      size_t base_msgs, int64_t n_sys, char **cache_text, struct turn *t)
{
    struct shoal_err err = {0};
    const int64_t n_ctx = shoal_ctx_n_ctx(s->ctx);
    int checked = 0;
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
        if (t->n_ids == 0) {
            /* nothing to evaluate: no logits to sample from */
            shoal_cli_error("chat: the chat template rendered no tokens for this message "
                            "(%zu bytes of text); the message is not sent ('shoal chat "
                            "--print-prompt' or 'shoal template' shows the rendering)",
                            strlen(t->prompt));
            free(t->prompt);
            free(t->ids);
            memset(t, 0, sizeof *t);
            return -1;
        }
        if (t->keep == (int64_t)t->n_ids)
            t->keep--; /* one token must be evaluated for fresh logits */
        if ((int64_t)t->n_ids < n_ctx)
            break;
        const int64_t n_full = (int64_t)t->n_ids;
        free(t->prompt);
        free(t->ids);
        memset(t, 0, sizeof *t);
        if (!checked) {
            /* would the message fit with no earlier exchange? if not,
             * refuse it now and drop nothing */
            checked = 1;
            int64_t need = n_full;
            if (conv->n - base_msgs > 1) {
                struct shoal_chat_message *alone =
                    shoal_xmalloc((base_msgs + 1) * sizeof *alone);
                memcpy(alone, conv->msgs, base_msgs * sizeof *alone);
                alone[base_msgs] = conv->msgs[conv->n - 1];
                need = count_tokens(s, tmpl, vars, alone, base_msgs + 1, 1, &err);
                free(alone);
                if (need < 0) {
                    shoal_cli_error("chat: template: %s", err.msg);
                    return -1;
                }
            }
            if (need >= n_ctx) {
                char sys[96] = "";
                if (n_sys > 0)
                    snprintf(sys, sizeof sys, " (%lld of them the system prompt's)",
                             (long long)n_sys);
                if (n_sys >= n_ctx)
                    shoal_cli_error("chat: the system prompt is too long: %lld tokens with the "
                                    "chat template, and the context holds %lld (--ctx); no "
                                    "message can be sent", (long long)n_sys, (long long)n_ctx);
                else
                    shoal_cli_error("chat: this message does not fit: with the chat template "
                                    "it needs %lld tokens%s, and the %lld-token context (--ctx) "
                                    "must keep one for the reply; it was not sent and the "
                                    "conversation is unchanged", (long long)need, sys,
                                    (long long)n_ctx);
                return -1;
            }
        }
        /* too long: drop the oldest exchange and start the cache over */
        free(*cache_text);
        *cache_text = NULL;
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
    const char *system_msg = NULL;
    int print_prompt = 0, show_reasoning = 0;
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
        if (!strcmp(a, "--print-prompt")) {
            print_prompt = 1;
            continue;
        }
        if (!strcmp(a, "--show-reasoning")) {
            show_reasoning = 1;
            continue;
        }
        if (!strcmp(a, "--system")) {
            if (i + 1 >= argc) {
                shoal_cli_error("--system needs a value");
                return 2;
            }
            system_msg = argv[++i];
            continue;
        }
        if (shoal_cli_model_or_unknown("chat", a, &so.model_dir))
            return 2;
    }
    if (go.no_bos || go.logits_out || go.ids_out || go.draft_logits_out) {
        shoal_cli_error("chat: %s is an option of 'shoal run' only (in chat the template "
                        "places BOS, and replies are not written to files)",
                        go.no_bos ? "--no-bos" : go.logits_out ? "--logits-out"
                        : go.ids_out ? "--ids-out" : "--draft-logits-out");
        return 2;
    }
    so.mtp = go.speculate == SHOAL_SPEC_MTP ? 1 : go.speculate == SHOAL_SPEC_AUTO ? 2 : 0;
    if (shoal_session_check_opts(&so))
        return 2;
    int open_rc;
    struct shoal_session *s = shoal_cli_session_open(&so, &open_rc);
    if (!s)
        return open_rc;
    if (!s->tok) {
        shoal_cli_error("chat: model '%s' has no tokenizer (tokenizer.json or tiktoken.model)",
                        s->model->dir);
        shoal_cli_session_close(s);
        return 1;
    }
    struct shoal_err err = {0};
    char *src = NULL, *bos = NULL, *eos = NULL;
    if (shoal_chat_template_load_model(s->model->dir, shoal_model_gguf_meta(s->model), &src,
                                       &bos, &eos, &err) || !src) {
        shoal_cli_error("chat: %s", err.code ? err.msg : "the model has no chat template");
        free(bos);
        free(eos);
        shoal_cli_session_close(s);
        return 1;
    }
    struct shoal_chat_template *tmpl = shoal_chat_template_parse(src, &err);
    if (!tmpl) {
        shoal_cli_error("chat: chat_template of '%s': %s", s->model->dir, err.msg);
        free(src);
        free(bos);
        free(eos);
        shoal_cli_session_close(s);
        return 1;
    }
    /* Stop at the end-of-turn marker the template writes after a reply;
     * a harmony reply ends at <|return|> or <|call|>, and its <|end|> only
     * closes one message (the analysis before the final answer). */
    struct shoal_harmony_ids hids;
    const int harmony = shoal_harmony_ids_of(s->tok, &hids);
    go.n_stop_ids = shoal_chat_end_ids(s->tok, go.stop_ids, 8);
    if (harmony) {
        if (go.n_stop) {
            shoal_cli_error("chat: --stop is not supported with the harmony format of '%s' "
                            "(replies end at <|return|> or <|call|>)", s->model->dir);
            shoal_chat_template_free(tmpl);
            free(src);
            free(bos);
            free(eos);
            shoal_cli_session_close(s);
            return 2;
        }
    }
    go.print_timings = 0;

    struct conv conv = {0};
    if (system_msg)
        conv_push(&conv, "system", system_msg);
    const size_t base_msgs = conv.n;
    struct shoal_chat_template_vars vars = {.bos_token = bos ? bos : "",
                                            .eos_token = eos ? eos : "",
                                            .add_generation_prompt = 1};
    char *cache_text = NULL; /* the text the KV cache holds, when known */
    int rc = 0;
    /* The system prompt must leave room for a message and a reply: said
     * now, with its size, not blamed on the first message. A template that
     * cannot render a system message alone is judged per message instead. */
    int64_t n_sys = 0;
    if (base_msgs) {
        n_sys = count_tokens(s, tmpl, &vars, conv.msgs, base_msgs, 1, &err);
        const int64_t n_ctx = shoal_ctx_n_ctx(s->ctx);
        if (n_sys >= n_ctx) {
            const int64_t max = s->model->cfg.max_pos;
            shoal_cli_error("chat: the system prompt is too long: %lld tokens with the chat "
                            "template, and the context holds %lld (--ctx%s); shorten --system%s",
                            (long long)n_sys, (long long)n_ctx,
                            n_ctx < max ? "" : ", the model's maximum",
                            n_ctx < max ? " or raise --ctx" : "");
            rc = 2;
            goto out;
        }
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;   /* no SA_RESTART: a read at the prompt returns EINTR */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    s->interrupt = (volatile int *)&interrupted;

    int tty = isatty(0) && isatty(1);
    /* input that no terminal shows (a pipe, a file): each line is printed
     * as the prompt would show it, so a transcript says which message each
     * reply answers */
    const int echo_input = !isatty(0);
    if (tty) {
        sa.sa_handler = die_of;
        sigaction(SIGHUP, &sa, NULL);
        fprintf(stderr, "shoal chat: %s (%s). /help lists the commands; Ctrl-C stops a "
                "reply.\n", s->model->dir, s->model->cfg.family->model_type);
    }
    for (;;) {
        int was_int = 0;
        char *line = terminated ? NULL : read_line(tty, &was_int);
        if (line && terminated) {   /* it came during the read: not sent */
            free(line);
            line = NULL;
        }
        if (!line) {
            if (was_int && !terminated) {
                fputs("^C\n", stdout);
                continue;
            }
            break;
        }
        if (!*line) {
            free(line);
            continue;
        }
        if (echo_input) {
            printf("> %s\n", line);
            fflush(stdout);
        }
        if (is_command(line)) {
            /* handled here, never sent to the model; trailing blanks allowed */
            size_t w = strcspn(line, " \t");
            int alone = line[w + strspn(line + w, " \t")] == '\0';
            line[w] = '\0';
            if (alone && (!strcmp(line, "/quit") || !strcmp(line, "/exit"))) {
                free(line);
                break;
            }
            if (alone && !strcmp(line, "/help")) {
                print_commands(stdout);
            } else if (alone && !strcmp(line, "/reset")) {
                conv_clear(&conv, base_msgs);
                shoal_session_reset(s);
                free(cache_text);
                cache_text = NULL;
                fputs("(conversation reset)\n", stdout);
            } else if (!strcmp(line, "/quit") || !strcmp(line, "/exit") ||
                       !strcmp(line, "/help") || !strcmp(line, "/reset")) {
                fprintf(stderr, "shoal: %s takes no arguments; /help lists the commands\n",
                        line);
            } else {
                fprintf(stderr, "shoal: unknown command '%s'; /help lists them (start a "
                        "message with // to send one that begins with /)\n", line);
            }
            fflush(stdout);
            free(line);
            continue;
        }
        /* "//text" sends "/text" */
        conv_push(&conv, "user", line[0] == '/' && line[1] == '/' ? line + 1 : line);
        free(line);
        struct turn t;
        if (build_turn(s, tmpl, &vars, &conv, base_msgs, n_sys, &cache_text, &t) != 0) {
            /* reported; the message is dropped and the session goes on as
             * it was (not a failure of the session: exit status stays) */
            conv_clear(&conv, conv.n - 1);
            continue;
        }
        if (print_prompt) {
            size_t pl = strlen(t.prompt);
            fprintf(stderr, "--- prompt (%zu bytes)\n", pl);
            fwrite(t.prompt, 1, pl, stderr);
            fputs("\n--- end of prompt\n", stderr);
            fflush(stderr);
        }
        char *reply = NULL;
        struct shoal_gen_result res;
        struct shoal_spec spec = {0};
        go.spec = &spec;
        struct harmony_out ho;
        go.capture = &reply;
        go.result = &res;
        if (harmony) {
            shoal_harmony_init(&ho.h, &hids);
            ho.show_reasoning = show_reasoning;
            ho.color = isatty(STDOUT_FILENO);
            ho.out = stdout;
            go.capture = NULL;
            go.on_token = harmony_on_token;
            go.on_token_user = &ho;
        }
        interrupted = terminated != 0;
        generating = 1;
        double t0 = shoal_time_s();
        tty_quiet_begin(tty);
        int grc = shoal_cli_generate(s, t.ids + t.keep, t.n_ids - (size_t)t.keep, &go, stdout);
        generating = 0;
        if (harmony) {
            /* the answer is the final channel's text; past analysis is
             * dropped by the template, so the cache is matched by tokens */
            /* the end token (<|return|>, <|call|>) stops the generation
             * before the hook sees it: feed it here (a tool call shows
             * then); otherwise close whatever block is open */
            enum shoal_harmony_event ev = SHOAL_HARMONY_EV_END;
            if (grc == 0 && res.reason == SHOAL_STOP_EOS)
                ev = shoal_harmony_feed(&ho.h, res.last_id, "", 0);
            if (ev == SHOAL_HARMONY_EV_TEXT)
                ev = SHOAL_HARMONY_EV_END;
            const int called = ev == SHOAL_HARMONY_EV_CALL;
            if (ev == SHOAL_HARMONY_EV_NONE)
                ev = SHOAL_HARMONY_EV_END;
            shoal_harmony_show(&ho.h, ev, "", 0, show_reasoning, ho.color, stdout);
            fflush(stdout);
            reply = shoal_xstrdup(ho.h.final ? ho.h.final : "");
            if (called)
                fprintf(stderr, "\nshoal: (the model called a tool, %s; shoal chat runs no "
                        "tools)", ho.h.recipient[0] ? ho.h.recipient : "unnamed");
            else if (grc == 0 && !ho.h.final && res.reason != SHOAL_STOP_EOS &&
                     res.reason != SHOAL_STOP_INTERRUPTED)
                fprintf(stderr, "\nshoal: (no final answer within --max-tokens%s)",
                        show_reasoning ? "" : "; --show-reasoning shows the analysis");
            shoal_harmony_free(&ho.h);
        }
        if (grc != 0) {
            tty_quiet_end();
            rc = 1;
            free(t.ids);
            free(t.prompt);
            free(reply);
            conv_clear(&conv, conv.n - 1);
            free(cache_text);
            cache_text = NULL;
            if (ferror(stdout))
                break;   /* the replies cannot be shown: no use asking on */
            continue;
        }
        if (interrupted)
            shoal_log_text(stdout, " [stopped]", 10);
        shoal_log_text(stdout, "\n", 1);
        tty_quiet_end();
        if (so.verbose) {
            char sl[128] = "";
            if (go.speculate != SHOAL_SPEC_OFF)
                snprintf(sl, sizeof sl, "; speculate %s: %lld drafted, %lld kept",
                         shoal_spec_mode_name(go.speculate), (long long)spec.n_drafted,
                         (long long)spec.n_accepted);
            fprintf(stderr, "shoal: turn prefilled %lld new tokens (%lld reused from the "
                    "KV cache), %.2f s%s\n", (long long)((int64_t)t.n_ids - t.keep),
                    (long long)t.keep, shoal_time_s() - t0, sl);
        }
        /* What the cache now holds, as text: the prompt, the reply as
         * printed, and the end token when one was evaluated. Unknown after
         * a stop string (tokens past it are cached but not shown). */
        free(cache_text);
        cache_text = NULL;
        if (!harmony && res.reason != SHOAL_STOP_STRING && reply) {
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
    if (terminated)
        rc = 128 + terminated;   /* the shell's status of a command SIGTERM ended */
out:
    free(cache_text);
    conv_clear(&conv, 0);
    free(conv.msgs);
    shoal_chat_template_free(tmpl);
    free(src);
    free(bos);
    free(eos);
    shoal_cli_session_close(s);
    return rc;
}
