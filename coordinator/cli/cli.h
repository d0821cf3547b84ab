/* cli: the `shoal` command's subcommands and their shared flag helpers.
 * Each subcommand takes argv after the subcommand name (argv[0] is the
 * subcommand) and returns the process exit status (0 ok, 1 runtime error,
 * 2 usage error). User-facing output lives here, never in common/.
 * (`shoal bench` and `shoal synth` live in coordinator/bench/, which uses
 * these helpers: bench_tools.h.)
 * Thread: main.
 */
#ifndef SHOAL_CLI_H
#define SHOAL_CLI_H

#include <stddef.h>
#include <stdio.h>

#include "tensor.h"

int shoal_cmd_run(int argc, char **argv);
int shoal_cmd_chat(int argc, char **argv);
int shoal_cmd_serve(int argc, char **argv);
int shoal_cmd_tokenize(int argc, char **argv);
int shoal_cmd_detokenize(int argc, char **argv);
int shoal_cmd_perplexity(int argc, char **argv);
int shoal_cmd_convert(int argc, char **argv);
int shoal_cmd_inspect(int argc, char **argv);
int shoal_cmd_status(int argc, char **argv);
int shoal_cmd_shard(int argc, char **argv);
int shoal_cmd_template(int argc, char **argv);

/* `shoal inspect FILE.gguf` (cmd_inspect_gguf.c): the GGUF model at path
 * (a single file or any file of a split set) as a table, or JSON when json
 * is nonzero. Returns the exit status (0; after printing the reader's
 * error, 2 for a file that is no valid GGUF, 1 for an I/O error). */
int shoal_cli_inspect_gguf(const char *path, int json);

struct shoal_container;
/* Print what a shard holds (index, replicas, weights, held experts per
 * layer as id ranges, dense or not) for `shoal inspect`; prints nothing
 * for a full container. ct borrowed. */
void shoal_cli_print_shard(const struct shoal_container *ct);

/* shoal inspect's "types" lines: each tensor group's dtypes with their
 * counts, a ggml type by its name (Q4_K x8), a layer's expert components
 * one tensor each (as a GGUF's ffn_*_exps). ct borrowed. Thread: main. */
void shoal_cli_print_types(const struct shoal_container *ct);

/* Parse a byte size: "0", "512K", "256M", "4G", "unlimited". Returns 0
 * or -1 after printing an error naming the flag. */
int shoal_cli_parse_size(const char *flag, const char *s, unsigned long long *out);

/* Print "shoal: <msg>" on stderr as one line. */
void shoal_cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Parse a quantization group size (32, 64 or 128) flag value into *out;
 * returns 0, or prints one error line naming the flag, the allowed values
 * and what was given, and returns -1. */
int shoal_cli_parse_group(const char *flag, const char *s, int *out);

/* Parse a KV cache dtype for flag (--kv): f32, f16 or bf16. Returns 0, or
 * -1 after printing a one-line usage error. */
int shoal_cli_parse_kv(const char *flag, const char *s, enum shoal_dtype *out);

/* Parse an --experts or --dense value (int4a8|int4|int8|bf16|f32) into
 * *out; returns 0, or prints one error line naming the flag, the allowed
 * values and what was given, and returns -1. */
int shoal_cli_parse_dtype(const char *flag, const char *s,
                          enum shoal_dtype *out);

/* Parse a decimal integer flag value; returns 0 or prints an error naming
 * the flag and returns -1. */
int shoal_cli_parse_i64(const char *flag, const char *s, long long lo,
                        long long hi, long long *out);
int shoal_cli_parse_f64(const char *flag, const char *s, double lo, double hi,
                        double *out);

/* Read the whole of file path ('-': stdin) into *out (malloc'd, NUL
 * appended, caller frees) and its length into *len; at most max_bytes.
 * Returns 0, or after printing one error line naming the file: 2 when path
 * does not exist or is a directory (a usage error, as for a missing model),
 * 1 for other failures (unreadable, too large). The return is the exit
 * status a command gives for it. */
int shoal_cli_read_input(const char *path, size_t max_bytes, char **out, size_t *len);

/* Default model directory (the bundled model) used when --model is absent. */
const char *shoal_cli_default_model(void);

/* What a generating command's --model accepts, as help lines: the flag and
 * its positional form, a Hugging Face checkpoint directory or a shoal
 * container, and the default (the bundled model). */
void shoal_cli_usage_model(FILE *f);

/* Take a command-line word that is not a flag as the model path (every
 * command accepts MODEL positionally and as --model MODEL). Returns 1 when
 * a is a path and was stored in *model, 0 when a is a flag (starts with
 * '-'; "-" alone is a path), or -1 after printing a usage error naming cmd
 * (a second path, or a path besides --model). */
int shoal_cli_take_path(const char *cmd, const char *what, const char *a,
                        const char **slot);

/* The last case of a command's flag loop: a that no flag of cmd took is the
 * model path (shoal_cli_take_path); a flag is an unknown option. Returns 0
 * when a was stored in *model, else 2 (the exit status) after one usage
 * error naming cmd. */
int shoal_cli_model_or_unknown(const char *cmd, const char *a, const char **model);

/* A path a command takes either as --flag VALUE or positionally. */
struct shoal_cli_slot {
    const char *flag;     /* "--model", "--out" */
    const char **value;   /* set by the flag, or here from a positional word */
};

/* Give the positional words (in order) to the slots their flag left unset,
 * in slot order. Returns 0, or -1 after printing one usage error naming cmd
 * (more words than unset slots). */
int shoal_cli_assign_paths(const char *cmd, char **words, int n_words,
                           const struct shoal_cli_slot *slots, int n_slots);

/* Check that path can be a --model of a generating command: a directory
 * that holds config.json (a checkpoint) or shoal.json (a container).
 * Returns 0, or -1 (a usage error: exit 2) after printing one line that
 * says what was found (no such path; a file, naming what a .gguf or
 * tokenizer.json is for; "not a model directory") and what --model
 * accepts. given = 0: the bundled default. */
int shoal_cli_check_model_dir(const char *path, int given);

/* bytes as "6.39 MiB" (binary units, as --ram and --expert-cache take them,
 * as shoal plan prints them; "512 B" below 1 KiB) in buf of n bytes.
 * Returns buf. */
const char *shoal_cli_format_bytes(char *buf, size_t n, double bytes);

#endif
