/* hot_set: routing counts per (layer, expert) that persist across runs, and
 * the ranking the expert store pins from (DESIGN §3 step 7, §4).
 *
 * The counts live in a small JSON sidecar:
 *   {"format": "shoal-routing-counts", "version": 1,
 *    "fingerprint": "<16 hex, the container's>", "n_layer": L, "n_expert": E,
 *    "decay": 0.9, "runs": N, "counts": [[c00, c01, ...], ...]}   (L rows of E)
 * Saving writes old * decay + this run's counts (exponential decay per
 * run), atomically (a temporary file renamed into place). A file that is
 * missing, malformed, or from another container (fingerprint or shape
 * differs) is not an error: the counts start at zero and a warning says
 * why (never abort on bytes from disk).
 *
 * Where: DIR/routing_counts.json next to the container when DIR is
 * writable, else FALLBACK/routing_counts-<fingerprint>.json (the caller
 * passes $XDG_CACHE_HOME/shoal or ~/.cache/shoal); see
 * shoal_hot_set_path().
 *
 * Thread: one thread (the expert store's caller).
 */
#ifndef SHOAL_HOT_SET_H
#define SHOAL_HOT_SET_H

#include <stdint.h>

#include "err.h"

#define SHOAL_HOT_SET_DECAY 0.9   /* weight of the previous runs' counts at save */

struct shoal_hot_set;

/* Choose the sidecar path for a container.
 *   container_dir  borrowed; used when writable; NULL: the fallback only
 *                  (a GGUF file, whose directory may hold other models)
 *   fallback_dir   borrowed, may be NULL; created (mode 0700) on save
 * Returns a path owned by the caller (free()), or NULL when the container
 * directory is not writable and there is no fallback. *in_container is
 * set to 1 when the path is inside the container. Thread: any. */
char *shoal_hot_set_path(const char *container_dir, const char *fallback_dir,
                         uint64_t fingerprint, int *in_container);

/* Open counts for a container of n_layer x n_expert experts (path borrowed;
 * NULL: in memory only, never saved). Loads path when it exists and
 * matches. decay in [0, 1]. Returns the object (owned by the caller,
 * shoal_hot_set_destroy); bookkeeping allocation only, so never NULL.
 * Thread: any. */
struct shoal_hot_set *shoal_hot_set_open(const char *path, uint64_t fingerprint,
                                         int64_t n_layer, int64_t n_expert, double decay);

/* Free; does not save. NULL is a no-op. */
void shoal_hot_set_destroy(struct shoal_hot_set *h);

/* Add n routings of expert (il, ie) in this run. Out-of-range ids are
 * ignored. Thread: owner. */
void shoal_hot_set_add(struct shoal_hot_set *h, int64_t il, int64_t ie, double n);

/* Count of (il, ie) used for ranking: the loaded (past) counts plus this
 * run's. Thread: owner. */
double shoal_hot_set_count(const struct shoal_hot_set *h, int64_t il, int64_t ie);

/* Routings added in this run (sum over every expert). */
double shoal_hot_set_run_total(const struct shoal_hot_set *h);

/* Every expert ranked hottest first: order[i] = il * n_expert + ie, by
 * count descending, ties to the lower layer then the lower expert id.
 * order [n_layer * n_expert] i64, written. Thread: owner. */
void shoal_hot_set_rank(const struct shoal_hot_set *h, int64_t *order);

/* Write past * decay + this run to the path (atomic rename). Returns 0, a
 * -errno with err naming the file, or 0 without writing when the object has
 * no path. Thread: owner. */
int shoal_hot_set_save(struct shoal_hot_set *h, struct shoal_err *err);

/* The sidecar path, or NULL. Borrowed. */
const char *shoal_hot_set_file(const struct shoal_hot_set *h);

#endif
