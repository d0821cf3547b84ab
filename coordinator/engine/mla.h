/* mla: the two per-head products that let multi-head latent attention run
 * over its compressed KV cache (DeepSeek-V2 paper, arXiv:2405.04434, §2.1
 * and appendix C: "absorbing" W^UK into the query and W^UV into the
 * output; the modeling file is DeepseekV2Attention in DeepSeek's
 * modeling_deepseek.py).
 *
 * The cache holds per token c = kv_a_layernorm(latent) [kv_lora_rank] and
 * the roped shared key k_pe [qk_rope_head_dim]. For head h, with
 * kv_b_proj's rows split per head into W^UK_h [qk_nope][kv_lora] and
 * W^UV_h [v_head_dim][kv_lora]:
 *   q_nope_h . (W^UK_h c) = (W^UK_h^T q_nope_h) . c     (absorb_q)
 *   sum_j p_j W^UV_h c_j  = W^UV_h (sum_j p_j c_j)       (out)
 * so attention is MQA with one KV head of kv_lora + qk_rope columns whose
 * values are the first kv_lora of the same row, and nothing grows with the
 * head count. Prefill takes the same path (no decompressed K/V), so a
 * token's bits do not depend on how a prompt was chunked.
 *
 * Canonical order (every output element by one thread, any nth):
 *   absorb_q: qm[t][h][j] = 0.0f + q_nope[t][h][0] * W[0][j] + ... in i order,
 *             W the rows of kv_b_proj converted to f32 (shoal_weight_row_to_f32;
 *             quantized rows for up to 32 tokens through shoal_weight_axpy_rows,
 *             the same bits without the f32 row)
 *   out:      ov[t][h] = latent[t][h] . (W^UV_h)^T by shoal_linear_part on the
 *             rows of W^UV_h as a weight of their own (the dtype's kernels;
 *             an FP8 head whose rows do not start on a 128-row block edge,
 *             as in tiny test models, uses shoal_dot_f32 on converted rows).
 *
 * Thread: one OpenMP thread of the caller's region (ith of nth).
 */
#ifndef SHOAL_MLA_H
#define SHOAL_MLA_H

#include <stdint.h>

#include "model_config.h"
#include "tensor.h"

/* qm[t][h] = [W^UK_h^T q_nope[t][h] ; q_pe[t][h]] for the heads [h0, h1)
 * of thread ith's even share.
 *   qm     [n][n_head][kv_lora_rank + qk_rope_head_dim] f32, written
 *   q      [n][n_head][qk_nope_head_dim + qk_rope_head_dim] f32 (q_pe roped)
 *   wkv_b  [n_head*(qk_nope+v_head_dim)][kv_lora_rank] any dtype, borrowed:
 *          each element of W^UK_h^T q_nope summed over the rows in order
 *   wk_b   NULL or unbound, or [n_head*kv_lora_rank][qk_nope] (a GGUF's
 *          attn_k_b as shipped, model.h), which then replaces wkv_b: head
 *          h's kv_lora_rank rows times q_nope by the dtype's linear kernels
 *          (shoal_linear; a block type: its int8 activations), as
 *          llama.cpp's deepseek2 graph multiplies wk_b
 *   row    [kv_lora_rank] f32 scratch of this thread
 * Bits: independent of nth and of how tokens are batched. */
void shoal_mla_absorb_q(float *qm, const float *q, int64_t n, const struct shoal_weight *wkv_b,
                        const struct shoal_weight *wk_b, const struct shoal_model_config *c,
                        float *row, int ith, int nth);

/* ov[t][h*v_head_dim + i] = W^UV_h row i . att[t][h][0 .. kv_lora_rank).
 *   ov     [n][n_head*v_head_dim] f32, written (thread ith: its heads)
 *   att    [n][n_head][kv_lora_rank + qk_rope_head_dim] f32, the attention
 *          output over the cache rows (its first kv_lora_rank columns)
 *   wv_b   NULL or unbound, or [n_head*v_head_dim][kv_lora_rank] (a GGUF's
 *          attn_v_b as shipped), which then replaces wkv_b's W^UV rows
 *   row    [kv_lora_rank] f32 scratch of this thread */
void shoal_mla_out(float *ov, const float *att, int64_t n, const struct shoal_weight *wkv_b,
                   const struct shoal_weight *wv_b, const struct shoal_model_config *c,
                   float *row, int ith, int nth);

#endif
