/* experts: the interface that runs a MoE layer's routed experts, and its
 * local implementation.
 *
 * The forward pass routes each MoE layer's rows, builds the batch-union
 * (moe.h: each distinct expert once, over all rows routed to it) and hands
 * it to an executor as one step; the executor writes every expert's
 * unweighted output rows into their own slots of yg, and the forward pass
 * combines them in route-rank order. So the logits do not depend on which
 * executor ran an expert, or in which order (DESIGN contract 1).
 *
 * Two implementations: the local one below (the model's expert store, or
 * its resident experts for a checkpoint held in RAM), and the cluster's
 * (coordinator/cluster/cluster.h: shoal_cluster_experts), which places the
 * union on workers and runs its local share with the local one.
 */
#ifndef SHOAL_EXPERTS_H
#define SHOAL_EXPERTS_H

#include <stdint.h>

#include "err.h"
#include "expert_store.h"
#include "model.h"
#include "moe.h"

/* Time spent per stage, seconds, accumulated over evals. */
struct shoal_ctx_timings {
    double attention;   /* norms, projections, RoPE, attention */
    double routing;     /* router logits, top-k, batch-union */
    double experts;     /* routed + shared expert FFNs, dense MLPs */
    double combine;     /* weighted sum in route-rank order */
    double head;        /* final norm + lm_head */
    double expert_wait; /* of experts: the routed batch-unions, from placement to the
                         * last output (local compute, remote replies, re-runs) */
    double network;     /* of expert_wait: estimated time on the wire (reply time
                         * minus the worker's own time, slowest executor per layer) */
    int64_t tokens;     /* token rows evaluated (prompt and generated, every
                         * sequence): the window the times above cover */
    double mtp;         /* the MTP layers and their head (shoal_ctx_mtp_draft), not
                         * in the stages above */
    int64_t mtp_rows;   /* rows the MTP layers ran (caught-up positions and drafts) */
};

/* One MoE layer step, handed to an executor. Borrowed for the call. */
struct shoal_moe_step {
    int64_t il;                          /* the MoE layer */
    int64_t n_tok;                       /* rows of h */
    int64_t k;                           /* n_expert_used */
    const float *h;                      /* [n_tok][n_embd] f32 normed input */
    const struct shoal_batch_union *bu;  /* the layer's batch-union over h's rows */
    float *yg;                           /* [n_tok*k][n_embd] f32 expert outputs by
                                          * slot: written for every slot of bu */
    /* The router lookahead (DESIGN section 3 step 5): layer il+1's top-k for
     * these rows, [n_tok*k] expert ids into *ids (the caller's scratch,
     * valid until the next call), or 0 when layer il+1 is not a MoE layer.
     * Writes only scratch: the forward pass is the same with or without it.
     * Executors call it to hint the next layer's reads. */
    int64_t (*lookahead)(void *user, const int32_t **ids);
    void *user;
};

struct shoal_experts_ops {
    /* Run every entry of st->bu, outputs into st->yg. Returns 0 or a
     * negative status with err set (the store's, the cluster's). */
    int (*run)(void *impl, const struct shoal_moe_step *st, struct shoal_err *err);
    /* Estimated wire seconds of the steps since the last call (then reset;
     * shoal_ctx_timings.network). NULL: none. */
    double (*take_network_s)(void *impl);
    /* An evaluation ended: the context's accumulated timings (borrowed),
     * its tokens, whether it was a decode step (every row one sequence's
     * next token: one sequence or a batch of them) and its wall seconds
     * (status). NULL: not wanted. */
    void (*note_eval)(void *impl, const struct shoal_ctx_timings *t, int64_t n_tokens,
                      int decode, double seconds);
};

/* An executor: its operations and their state. */
struct shoal_experts {
    const struct shoal_experts_ops *ops;
    void *impl;
    int64_t max_rows;   /* rows (tokens x n_expert_used) one step may carry (a
                         * worker request's frame); 0: no limit */
};

/* ---- the local executor ---- */

struct shoal_local_experts;

/* The local executor of model m (borrowed; outlives it): routed experts
 * from store (borrowed; NULL: the model's resident experts, a checkpoint's,
 * whose memory-mapped FP8/MXFP4 codes are checked the first time each
 * runs). Scratch grows with the largest step. Owned by the caller
 * (shoal_local_experts_free). Thread: the one that runs it. */
struct shoal_local_experts *shoal_local_experts_create(const struct shoal_model *m,
                                                       struct shoal_expert_store *store);
void shoal_local_experts_free(struct shoal_local_experts *lx);

/* The store it reads experts from, or NULL. */
struct shoal_expert_store *shoal_local_experts_store(const struct shoal_local_experts *lx);

/* Run entries sel[0..n_sel) of st->bu (indices into bu->expert, ascending;
 * sel NULL: entries 0..n_sel), outputs into their slots of st->yg. With a
 * store, started(user) is called once the first batch's reads are in
 * flight (hints queue behind them there; NULL: none). Returns 0 or the
 * store's / the FP8 check's error (err set). */
int shoal_local_experts_run(struct shoal_local_experts *lx, const struct shoal_moe_step *st,
                            const int64_t *sel, int64_t n_sel,
                            void (*started)(void *user), void *user, struct shoal_err *err);

/* The local executor as an executor: each step runs the whole union here;
 * with a store that wants hints, the lookahead's experts of the next layer
 * (unless resident) are hinted once the step's first reads are in flight. */
struct shoal_experts shoal_local_experts_iface(struct shoal_local_experts *lx);

#endif
