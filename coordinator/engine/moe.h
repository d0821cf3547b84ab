/* moe: routing, the batch-union, and the canonical combine of a sparse MoE
 * block (DESIGN §3 steps route, union, combine).
 *
 * Router, per token, in f32 (transformers' Mixtral/Qwen2-MoE/Qwen3-MoE/
 * OLMoE sparse blocks; DeepSeek's MoEGate in modeling_deepseek.py and its
 * inference/model.py Gate; transformers' Glm4MoeTopkRouter):
 *   1. scores: softmax over all n_expert logits, or the sigmoid of each, or
 *      (gpt_oss) the logits plus the router bias themselves;
 *   2. choice = scores (+ e_score_correction_bias under noaux_tc);
 *   3. with groups (n_group > 1, not greedy): rank the n_group groups by
 *      their max choice (group_limited_greedy) or the sum of their two best
 *      (noaux_tc), keep the topk_group best (ties to the lower group), and
 *      set every other expert's choice to -inf (DeepSeek's inference code;
 *      modeling_deepseek.py writes 0.0, which only differs when a kept
 *      choice is negative);
 *   4. top-k of choice, by repeated max (ties to the lower expert id, as
 *      torch.topk on CPU); weight = the unbiased score;
 *   5. norm_topk_prob: weights /= (their sum + 1e-20);
 *   6. weights *= routed_scaling_factor (1 outside DeepSeek/GLM);
 *   gpt_oss: the weights are the softmax of the k chosen logits (step 4).
 * Combine: y[t] = sum over route rank r of weight[t][r] * out[t][r], in rank
 * order, from unweighted expert outputs, so the result never depends on
 * which executor ran an expert or when its answer arrived.
 * Thread: main.
 */
#ifndef SHOAL_MOE_H
#define SHOAL_MOE_H

#include <stdint.h>

#include "err.h"
#include "model_config.h"

/* What a router needs besides its logits. */
struct shoal_router {
    int64_t n_expert, k;              /* experts, top-k */
    enum shoal_router_score score;
    enum shoal_router_topk topk;
    int64_t n_group, topk_group;      /* 1, 1: no groups */
    int norm_topk_prob;
    float scaling;                    /* routed_scaling_factor */
    const float *bias;                /* [n_expert] noaux_tc correction bias, or NULL */
};

/* The router of a config; bias borrowed (the layer's router_bias as f32,
 * or NULL when the config has none). Thread: any. */
struct shoal_router shoal_router_of(const struct shoal_model_config *cfg, const float *bias);

/* Select top-k experts per token (steps 1-6 above).
 *   logits   [n_tok][n_expert] f32, borrowed (not modified)
 *   scratch  [3 * n_expert] f32
 *   ids      [n_tok][k] i32, written in route-rank order (best choice first)
 *   weights  [n_tok][k] f32, written
 * Returns 0, or SHOAL_EINVAL if k == 0 or k > n_expert, or the groups do
 * not divide the experts. Thread: any. */
int shoal_router_select(const struct shoal_router *r, const float *logits, int64_t n_tok,
                        float *scratch, int32_t *ids, float *weights);

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
