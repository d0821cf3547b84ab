/* bench_tools: the entry points of coordinator/bench/, the `shoal bench`
 * and `shoal synth` commands (called from coordinator/main.c's command
 * table). Like cli.h's commands, each takes argv after the command name
 * (argv[0] is the command) and returns the exit status (0 ok, 1 runtime
 * error, 2 usage error).
 *
 * coordinator/bench/ sits above coordinator/cli/ (tests/check_layers.py):
 * it uses the cli's flag helpers, the session, the engine and the store;
 * nothing below it includes its headers.
 * Thread: main.
 */
#ifndef SHOAL_BENCH_TOOLS_H
#define SHOAL_BENCH_TOOLS_H

/* shoal bench: one configuration measured beside the machine's limits
 * (cmd_bench.c, bench_probe.h, bench_cluster.h); one JSON. */
int shoal_cmd_bench(int argc, char **argv);

/* shoal plan: will a model run on these machines, and how fast (engine/
 * plan.h, plan_speed.h). Returns 0 (runs), 3 (does not fit), 2 (usage). */
int shoal_cmd_plan(int argc, char **argv);

/* shoal synth: a synthetic container of a real architecture's shapes
 * (synth.h), or with --check, a decode measured on one. */
int shoal_cmd_synth(int argc, char **argv);

#endif
