/* cli: the `shoal` command's subcommands and their shared flag helpers.
 * Each subcommand takes argv after the subcommand name (argv[0] is the
 * subcommand) and returns the process exit status (0 ok, 1 runtime error,
 * 2 usage error). User-facing output lives here, never in common/.
 * Thread: main.
 */
#ifndef SHOAL_CLI_H
#define SHOAL_CLI_H

#include "tensor.h"

int shoal_cmd_run(int argc, char **argv);
int shoal_cmd_chat(int argc, char **argv);
int shoal_cmd_tokenize(int argc, char **argv);
int shoal_cmd_detokenize(int argc, char **argv);
int shoal_cmd_perplexity(int argc, char **argv);
int shoal_cmd_convert(int argc, char **argv);
int shoal_cmd_inspect(int argc, char **argv);
int shoal_cmd_synth(int argc, char **argv);
int shoal_cmd_status(int argc, char **argv);
int shoal_cmd_shard(int argc, char **argv);
int shoal_cmd_bench(int argc, char **argv);
int shoal_cmd_template(int argc, char **argv);

struct shoal_container;
/* Print what a shard holds (index, replicas, weights, held experts per
 * layer as id ranges, dense or not) for `shoal inspect`; prints nothing
 * for a full container. ct borrowed. */
void shoal_cli_print_shard(const struct shoal_container *ct);

/* Parse a byte size: "0", "512K", "256M", "4G", "unlimited". Returns 0
 * or -1 after printing an error naming the flag. */
int shoal_cli_parse_size(const char *flag, const char *s, unsigned long long *out);

/* Print "shoal: <msg>" on stderr as one line. */
void shoal_cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Parse a quantization group size (32, 64 or 128) flag value into *out;
 * returns 0, or prints one error line naming the flag, the allowed values
 * and what was given, and returns -1. */
int shoal_cli_parse_group(const char *flag, const char *s, int *out);

/* Parse a --experts (experts = 1: int4a8|int4|int8|bf16|f32) or --dense
 * (experts = 0: int8|bf16|f32) value into *out; returns 0, or prints one
 * error line naming the flag, the allowed values and what was given, and
 * returns -1. */
int shoal_cli_parse_dtype(const char *flag, const char *s, int experts,
                          enum shoal_dtype *out);

/* Parse a decimal integer flag value; returns 0 or prints an error naming
 * the flag and returns -1. */
int shoal_cli_parse_i64(const char *flag, const char *s, long long lo,
                        long long hi, long long *out);
int shoal_cli_parse_f64(const char *flag, const char *s, double lo, double hi,
                        double *out);

/* Default model directory (the bundled model) used when --model is absent. */
const char *shoal_cli_default_model(void);

#endif
