/* placement: which workers hold which routed experts (DESIGN §5).
 *
 * Weighted rendezvous (highest-random-weight) hashing: every (expert,
 * worker) pair gets a score -w / ln(u), u uniform in (0, 1) from a 64-bit
 * hash of (expert key, worker seed); an expert's holders are the workers
 * with the highest scores. A worker's share of experts is proportional to
 * its weight; adding or removing a worker moves only the experts it gains
 * or held, so a placement is stable across cluster changes. Placement only
 * decides where bytes live and who computes: it never changes a result
 * (DESIGN contract 1).
 *
 * The same score ranks the expert store's sources (expert_store.c), so the
 * project has one rendezvous implementation.
 *
 * Everything here is a pure function of its arguments. Thread: any.
 */
#ifndef SHOAL_PLACEMENT_H
#define SHOAL_PLACEMENT_H

#include <stdint.h>

/* Stable key of expert (il, ie) for rendezvous hashing: il in the high
 * 32 bits, ie in the low 32. Thread: any. */
uint64_t shoal_placement_key(int64_t il, int64_t ie);

/* Rendezvous score of one (key, seed) pair for a candidate of weight w:
 * -w / ln(u) > 0 with u in (0, 1) from a 64-bit hash of (key, seed), or
 * -1 when w <= 0 (never preferred to a positive weight). The candidate
 * with the highest score wins. Thread: any. */
double shoal_placement_score(uint64_t key, uint64_t seed, double w);

/* Index in [0, n) of the highest-scoring candidate for key, skipping those
 * whose bit is set in exclude (bit i = candidate i; n <= 64). Weights <= 0
 * never win unless every candidate left has one (then all count as equal).
 * Ties go to the lower index.
 *   seeds, weights  [n], borrowed
 * Returns the index, or -1 when every candidate is excluded or n < 1.
 * Thread: any. */
int shoal_placement_best(uint64_t key, const uint64_t *seeds, const double *weights, int n,
                         uint64_t exclude);

/* The `replicas` holders of expert (il, ie) among n_workers workers with
 * the given weights (NULL = equal; weights <= 0 never hold unless all are),
 * by weighted rendezvous hashing (score -w/ln(u), u from a 64-bit hash of
 * (key, worker index)); out[0..replicas) = worker indices by descending
 * score. replicas is clamped to [1, n_workers]. Returns the count written.
 *   weights  [n_workers] f64, borrowed, or NULL
 *   out      [replicas] i32 worker indices, written (first = preferred)
 * The count is less than replicas only when fewer workers have a positive
 * weight (workers with weight <= 0 hold nothing while any other has a
 * positive one); 0 when n_workers < 1. Ties go to the lower index.
 * Workers are identified by index (the hash's seed): to take one out and
 * keep every other expert where it is, give it weight 0 (or drop the last
 * index); renumbering the workers moves experts.
 * Deterministic: the same arguments give the same holders (a score
 * uses libm's log, so two platforms could differ only on a tie within an
 * ulp; shards and placement.json record the result). Thread: any. */
int shoal_placement_holders(int64_t il, int64_t ie, int n_workers, const double *weights,
                            int replicas, int *out);

#endif
