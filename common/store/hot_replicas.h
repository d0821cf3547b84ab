/* hot_replicas: the hottest routed experts of each MoE layer get more
 * holders than the rest in a sharded cluster (issue 33), so that a skewed
 * routing does not leave one worker with most of a layer's rows.
 *
 * An expert (il, ie) is hot when it is among the n_hot experts of layer il
 * with the highest routing count (ties to the lower expert id; a count of
 * 0 is never hot). Its holders are the top replicas + extra of
 * shoal_placement_holders instead of the top replicas: the same ranking, so
 * the R base holders stay holders and every expert keeps >= R of them.
 *
 * The counts come from a file the workers, `shoal shard` and the user
 * agree on: a container's synth.json ("layers"[]: "layer", "target_share",
 * the frequencies a synthetic router was built to give: fixed for the
 * container's life) or a routing_counts.json (hot_set.h: "counts", one row
 * per layer). The coordinator needs neither: it learns every worker's
 * holdings from the coverage bitmap of its PeerInfo.
 *
 * Everything here is a pure function of its arguments and the file's
 * bytes. Thread: any.
 */
#ifndef SHOAL_HOT_REPLICAS_H
#define SHOAL_HOT_REPLICAS_H

#include <stdint.h>

#include "err.h"

/* The counts file a container directory offers: DIR/synth.json when it
 * exists (fixed), else DIR/routing_counts.json when it exists (it changes
 * as the coordinator saves counts: give every worker the same copy with
 * --routing for holdings that never move). Returns a path owned by the
 * caller (free()), or NULL when there is neither. Thread: any. */
char *shoal_hot_replicas_default_path(const char *dir);

/* Read routing counts per (layer, expert) from path (borrowed): a
 * routing_counts.json's "counts" rows (row il = layer il) or a synth.json's
 * "layers" (each with its "layer" index and "target_share"). Negative or
 * non-numeric values count as 0; layers the file lacks are all 0.
 *   counts  [n_layer][n_expert] f64, written (only on success)
 * Returns 0, or with err set (naming the file): -SHOAL_EFORMAT (not JSON,
 * neither format, a row whose length is not n_expert, a layer index out of
 * range), -SHOAL_ENOTFOUND (the file is missing). Thread: any. */
int shoal_hot_replicas_load(const char *path, int64_t n_layer, int64_t n_expert,
                            double *counts, struct shoal_err *err);

/* Mark the n_hot experts of each layer with the highest count (ties to the
 * lower id; counts <= 0 are never hot; n_hot >= n_expert marks every
 * expert with a positive count).
 *   counts  [n_layer][n_expert] f64, borrowed
 *   hot     [n_layer][n_expert] u8, written: 1 hot, 0 not
 * Returns the number of experts marked. Thread: any. */
int64_t shoal_hot_replicas_mark(const double *counts, int64_t n_layer, int64_t n_expert,
                                int n_hot, uint8_t *hot);

/* Parse a --hot-replicas value "H" or "H:X" (H hot experts per layer in
 * [1, 1<<20], X extra holders in [1, max_extra], default 1) into *n_hot and
 * *extra (written only on success). Returns 0 or -SHOAL_EINVAL. Thread: any. */
int shoal_hot_replicas_parse(const char *v, int max_extra, int *n_hot, int *extra);

/* The hot map of --hot-replicas: the counts of path (borrowed; NULL: the
 * default file of container directory dir, borrowed) marked top n_hot.
 * Returns [n_layer][n_expert] u8 (owned by the caller, free()), or NULL
 * with err set: shoal_hot_replicas_load's errors, -SHOAL_ENOTFOUND when dir
 * has no counts file. Thread: any. */
uint8_t *shoal_hot_replicas_build(const char *path, const char *dir, int64_t n_layer,
                                  int64_t n_expert, int n_hot, struct shoal_err *err);

#endif
