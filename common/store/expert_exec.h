/* expert_exec: run routed experts of one layer that an expert store holds,
 * batch by batch: acquire (the store reads what is missing, in parallel),
 * run the batch's FFNs in one OpenMP region (shoal_expert_ffn_batch),
 * release. The loop the coordinator's local executor
 * (coordinator/engine/experts_local.c) and shoal-worker (worker/exec.c)
 * share, so both compute an expert the same way: its bits do not depend on
 * which process ran it (DESIGN contract 1).
 *
 * When the store's budget cannot hold every expert of the call at once it
 * hands back a prefix (shoal_expert_store_acquire_start); that prefix runs
 * and is released before the rest is acquired. Each job writes only its own
 * outputs, so the batch boundaries cannot change a bit.
 *
 * Thread: the caller's (one call at a time per store, as the store
 * requires); opens OpenMP regions.
 */
#ifndef SHOAL_EXPERT_EXEC_H
#define SHOAL_EXPERT_EXEC_H

#include <stdint.h>

#include "err.h"
#include "expert_ffn.h"
#include "expert_store.h"

/* Called around each batch's acquire; any may be NULL. i0: the index of the
 * batch's first expert in the call. */
struct shoal_expert_exec_hooks {
    void (*before_start)(void *user, int64_t i0);   /* before its reads are submitted */
    void (*started)(void *user, int64_t i0);        /* reads in flight, before the wait:
                                                     * hints queue behind them here */
    void *user;
};

/* Where the call's time went, seconds (out; optional). */
struct shoal_expert_exec_times {
    double acquire;   /* submitting and waiting for the store's reads */
    double compute;   /* the FFNs and the releases */
};

/* Run experts ids[0..n) of layer il held by store.
 *   ids    [n] i32 expert ids, distinct, borrowed
 *   jobs   [n] one per expert, out, x, n and scratch set by the caller (each
 *          expert's rows of input and where its outputs go; disjoint); w is
 *          set here to the acquired view (ew[i - i0])
 *   ew     [n] views of one acquired batch (scratch, written)
 * Returns 0, or the store's negative status with err set (nothing of the
 * call is held then; outputs of earlier batches are written, later ones
 * not). */
int shoal_expert_exec_run(struct shoal_expert_store *store, int64_t il, const int32_t *ids,
                          int64_t n, struct shoal_expert_ffn_job *jobs,
                          struct shoal_expert_weights *ew,
                          const struct shoal_expert_exec_hooks *hooks,
                          struct shoal_expert_exec_times *times, struct shoal_err *err);

#endif
