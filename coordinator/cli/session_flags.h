/* session_flags: the flags every generating command shares and the way a
 * command opens, runs and closes a session (coordinator/cli/). The engine's
 * session (session.h) takes parsed options and prints nothing; these parse
 * argv, print usage lines and errors, and report. Thread: main. */
#ifndef SHOAL_SESSION_FLAGS_H
#define SHOAL_SESSION_FLAGS_H

#include <stdint.h>
#include <stdio.h>

#include "session.h"

/* Try to consume argv[*i] (and its value) as a session flag (--model, --ctx,
 * --kv, --isa, --batch, --threads, --verbose, and the expert store's --expert-cache, --direct,
 * --stats, --io, --queue-depth, --prefetch, --pin, --mirror,
 * --mirror-weights). Returns 1 if consumed (advancing *i past a value),
 * 0 if not a session flag, -1 after printing a usage error. */
int shoal_session_parse_flag(struct shoal_session_opts *o, int argc,
                             char **argv, int *i);

/* Print the expert store flags' help lines (for a subcommand's usage),
 * followed by the cluster flags'. */
void shoal_session_usage_store(FILE *f);

/* Check the cluster flags once all are parsed: addresses parse (or
 * --workers is "auto" alone, with --cluster-key), and
 * without --cluster-key every listener is a loopback address. Returns 0
 * or -1 after printing a one-line usage error (exit status 2). */
int shoal_session_check_opts(const struct shoal_session_opts *o);

/* Which command's generation flags shoal_gen_usage prints. */
enum shoal_gen_usage_cmd {
    SHOAL_GEN_USAGE_RUN,    /* and the flags only run takes: --no-bos, --logits-out, --ids-out */
    SHOAL_GEN_USAGE_CHAT,
    SHOAL_GEN_USAGE_SERVE,  /* --max-tokens is the default of a request without max_tokens */
};

/* Print the generation flags' help lines (sampling, --max-tokens with its
 * default, --stop, ...). run and chat print the one default of
 * shoal_gen_opts_default(); serve prints its per-request defaults. */
void shoal_gen_usage(FILE *f, enum shoal_gen_usage_cmd cmd);

/* Same for generation flags (sampling, --max-tokens, --stop, ...). */
int shoal_gen_parse_flag(struct shoal_gen_opts *o, int argc, char **argv,
                         int *i);

/* Parse "1,2,3" or "1 2 3" into a newly allocated array (caller frees;
 * shoal_parse_id_list). Returns 0 or -1 after printing an error naming the
 * bad item. */
int shoal_cli_parse_id_list(const char *s, int32_t **ids, size_t *n);

/* Append prompt tokens to the session's context and generate, streaming
 * text to out, the timings line to stderr (o->print_timings) and the
 * --logits-out/--ids-out files. Tokens already in the cache are kept (chat
 * turns). Returns 0 (including a stop by EOS, stop string, max tokens, a
 * full context or an interrupt) or -1 after printing an error. Thread: main
 * (generate_loop.c). */
int shoal_cli_generate(struct shoal_session *s, const int32_t *prompt,
                       size_t n_prompt, const struct shoal_gen_opts *o, FILE *out);

/* Split the --workers lists into addrs (at most max, pointers into buf of
 * cap bytes). Returns the count, or -1 after printing an error. */
int shoal_cli_split_workers(const struct shoal_session_opts *o, char *buf, size_t cap,
                            const char **addrs, int max);

struct shoal_discover_worker;

/* Browse the LAN for key_path's cluster for seconds (discover.h), printing a
 * one-line error when that fails or finds nothing (no --cluster-key, no mDNS
 * in this build, the key file, the backend).
 *   out  [max] written: the workers found, sorted by address
 * Returns n >= 1, or -1 with *status the exit status (2: usage, 1: else).
 * Blocks for seconds. Thread: main. */
int shoal_cli_discover(const char *key_path, double seconds,
                       struct shoal_discover_worker *out, int max, int *status);

/* --workers auto: browse for o->discover_timeout and replace o->workers
 * with the addresses found (a list owned by this module for the life of the
 * process; one stderr line names them). Returns 0 (done, or --workers is not
 * auto), or -1 after a one-line error, *status 2 (usage: auto mixed with
 * addresses, no --cluster-key) or 1 (nothing found, the key file, mDNS).
 * Thread: main. */
int shoal_cli_workers_auto(struct shoal_session_opts *o, int *status);

/* Open a session as the commands do: check the flags, resolve the model
 * (the bundled one by default; a checkpoint given with --workers is
 * converted once into the cache, saying so), open it (shoal_session_open),
 * warn about store flags a checkpoint ignores, and with -v print what was
 * loaded. Returns the session, or NULL after printing a one-line error, with
 * *status (if not NULL) the exit status: 2 for bad command-line input (no
 * such model path, a bad flag value), 1 for anything else. */
struct shoal_session *shoal_cli_session_open(const struct shoal_session_opts *o, int *status);

/* Print the --stats lines (expert store, time per token, cluster) when the
 * session was opened with --stats, then close it. NULL is a no-op. */
void shoal_cli_session_close(struct shoal_session *s);

/* shoal_session_tokenize, printing its error, followed by "; " and hint
 * when hint is not NULL: what the command accepts instead of text, in its
 * own flags (run: --tokens IDS). Returns 0 or -1. */
int shoal_cli_tokenize(struct shoal_session *s, const char *text, const char *hint,
                       int add_bos, int32_t **ids, size_t *n_ids);

#endif
