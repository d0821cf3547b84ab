/* moe: routing, the batch-union, and the canonical combine of a sparse MoE
 * block (DESIGN §3 steps route, union, combine).
 *
 * Router (transformers' Mixtral/Qwen2-MoE/Qwen3-MoE/OLMoE sparse blocks):
 * softmax over all n_expert router logits in f32, top-k (ties to the lower
 * expert id), then renormalise the k weights when norm_topk_prob.
 * Combine: y[t] = sum over route rank r of weight[t][r] * out[t][r], in rank
 * order, from unweighted expert outputs, so the result never depends on
 * which executor ran an expert or when its answer arrived.
 * Thread: main.
 */
#ifndef SHOAL_MOE_H
#define SHOAL_MOE_H

#include <stdint.h>

#include "err.h"

/* Select top-k experts per token.
 *   logits   [n_tok][n_expert] f32, borrowed (not modified)
 *   probs    [n_expert] f32 scratch
 *   ids      [n_tok][k] i32, written in route-rank order (highest first)
 *   weights  [n_tok][k] f32, written
 * Returns 0, or -SHOAL_EINVAL if k == 0 or k > n_expert. Thread: any. */
int shoal_router_select(const float *logits, int64_t n_tok, int64_t n_expert,
                        int64_t k, int norm_topk_prob, float *probs,
                        int32_t *ids, float *weights);

/* The distinct experts a batch routes to, each with its (token, rank)
 * slots. Slot s = t*k + r. Experts appear in ascending id order and each
 * expert's slots in ascending order. */
struct shoal_batch_union {
    int64_t n_used;        /* distinct experts in the batch */
    int32_t *expert;       /* [n_used] expert ids */
    int64_t *slot_begin;   /* [n_used + 1] offsets into slots */
    int64_t *slots;        /* [n_tok*k] slot indices, grouped by expert */
    int64_t *count;        /* [n_expert] scratch */
};

/* Allocate a union able to hold n_tok_max*k slots over n_expert experts. */
void shoal_batch_union_init(struct shoal_batch_union *u, int64_t n_expert,
                            int64_t n_slots_max);
void shoal_batch_union_free(struct shoal_batch_union *u);

/* Build the union from ids [n_tok][k]. */
void shoal_batch_union_build(struct shoal_batch_union *u, const int32_t *ids,
                             int64_t n_tok, int64_t k, int64_t n_expert);

/* y[t] = sum_r weights[t][r] * out[t*k + r], r ascending.
 *   y        [n_tok][n_embd] f32, written
 *   out      [n_tok*k][n_embd] f32 unweighted expert outputs */
void shoal_moe_combine(float *y, const float *out, const float *weights,
                       int64_t n_tok, int64_t k, int64_t n_embd);

#endif
