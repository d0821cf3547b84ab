/* forward: the decoder forward pass of the supported MoE families over a
 * KV cache (f32, f16 or bf16 elements, kv.h): embeddings, RMSNorm, attention (GQA, RoPE, QK-norm, qkv bias,
 * optional sliding window), the sparse MoE block (router, batch-union,
 * experts, canonical combine, shared expert) or a dense MLP, and lm_head.
 *
 * Follows transformers' modeling_mixtral.py, modeling_qwen2_moe.py,
 * modeling_qwen3_moe.py and modeling_olmoe.py; the family differences come
 * from struct shoal_family (model_config.h).
 *
 * A prompt is evaluated as a matrix (prefill, in chunks of n_batch tokens);
 * decode feeds one token at a time. A context may hold several sequences
 * (n_seq KV slots, for `shoal serve`): one step then runs segments of
 * several sequences together (decode tokens of some, prompt chunks of
 * others) and each MoE layer's batch-union spans all of them. Every row is
 * computed by code whose bits depend only on that row (linears, norms,
 * router, experts: quant.h) and on its own sequence's cache (attention:
 * kv.h), so a token's logits bytes do not depend on the thread count, on
 * how its sequence is chunked, nor on which other sequences share its step
 * (tests/unit/test_batching.c checks this bit for bit).
 *
 * Thread: a context belongs to one thread (it opens OpenMP regions).
 */
#ifndef SHOAL_FORWARD_H
#define SHOAL_FORWARD_H

#include <stdint.h>

#include "err.h"
#include "experts.h"
#include "model.h"


struct shoal_ctx_params {
    int64_t n_ctx;     /* KV cache length in tokens; 0 = min(max_pos, 4096) */
    int64_t n_batch;   /* prefill chunk size in tokens; 0 = 256 (each MoE layer's
                          batch-union spans the chunk: 256 tokens give a top-8 of
                          128 experts ~16 rows per expert for the batched kernels;
                          64 gave 4 and ran prefill at 0.5x) */
    enum shoal_dtype kv_dtype; /* KV cache elements: F32 (default), F16 or BF16
                                * (kv.h: rounded once when written) */
    const struct shoal_experts *experts; /* routed experts run on it (experts.h: the
                                    * cluster's); borrowed, outlives the context;
                                    * NULL: in-process, on the model's store or its
                                    * resident experts */
    int64_t n_seq;     /* sequences (KV cache slots of n_ctx tokens each); 0 = 1 */
    int mtp;           /* 1: keep what the model's MTP layers need (every position's
                          final normed hidden state and token, and the MTP layers'
                          KV cache) so that shoal_ctx_mtp_draft can run; needs
                          model->n_mtp > 0, else shoal_ctx_create fails */
};

static inline struct shoal_ctx_params shoal_ctx_params_default(void)
{
    return (struct shoal_ctx_params){.n_ctx = 0, .n_batch = 0,
                                     .kv_dtype = SHOAL_DTYPE_F32, .experts = NULL,
                                     .n_seq = 1, .mtp = 0};
}

struct shoal_ctx;

/* Create a context (KV cache + scratch) for model (borrowed; must outlive
 * the context). Returns NULL with err set if the KV cache cannot be
 * allocated (SHOAL_ENOMEM; the message gives the byte count) or kv_dtype is
 * not F32, F16 or BF16 (SHOAL_EINVAL). Thread: any. */
struct shoal_ctx *shoal_ctx_create(const struct shoal_model *model,
                                   struct shoal_ctx_params params,
                                   struct shoal_err *err);
void shoal_ctx_free(struct shoal_ctx *ctx);

/* Append n tokens to the sequence and run them.
 *   tokens  [n] i32 ids, borrowed; each must be in [0, n_vocab)
 *   logits  [n][n_vocab] f32 if all_logits, else [n_vocab] for the last
 *           token; written. May be NULL to skip the head.
 * Returns 0; SHOAL_ERANGE with err set if a token id is out of range or
 * the sequence would exceed n_ctx (nothing is appended then).
 * Thread: the context's thread. */
int shoal_ctx_eval(struct shoal_ctx *ctx, const int32_t *tokens, int64_t n,
                   float *logits, int all_logits, struct shoal_err *err);

/* One sequence's share of a multi-sequence step (shoal_ctx_eval_segs). */
struct shoal_ctx_seg {
    int64_t seq;            /* the sequence (KV slot), in [0, n_seq) */
    const int32_t *tokens;  /* [n] i32 ids appended to it, borrowed */
    int64_t n;              /* >= 1 */
    float *logits;          /* [n][n_vocab] f32 if all_logits, else [n_vocab] of its
                             * last token; written; NULL: no head for it */
    int all_logits;
};

/* Run one step over several sequences: segment i appends its tokens to
 * sequence segs[i].seq (at positions n_past(seq) ..). The rows of all
 * segments form one batch (one batch-union per MoE layer); attention runs
 * per segment over its own sequence. Each row's bits are those it would
 * have with the sequence evaluated alone (shoal_ctx_eval), in any chunking.
 * Returns 0; SHOAL_EINVAL with err set when n_segs < 1, the rows exceed
 * n_batch, a seq is out of range or appears twice, or a segment is empty;
 * SHOAL_ERANGE when a token id is out of range or a sequence would exceed
 * n_ctx (nothing is appended then); an expert store / cluster error (the
 * caches of the step's sequences may then hold part of the step: truncate
 * them). Thread: the context's thread. */
int shoal_ctx_eval_segs(struct shoal_ctx *ctx, const struct shoal_ctx_seg *segs, int n_segs,
                        struct shoal_err *err);

/* Tokens currently in the KV cache (of sequence 0 / of sequence seq). */
int64_t shoal_ctx_n_past(const struct shoal_ctx *ctx);
int64_t shoal_ctx_seq_n_past(const struct shoal_ctx *ctx, int64_t seq);
int64_t shoal_ctx_n_ctx(const struct shoal_ctx *ctx);
int64_t shoal_ctx_n_seq(const struct shoal_ctx *ctx);
/* The largest step in rows (n_batch). */
int64_t shoal_ctx_n_batch(const struct shoal_ctx *ctx);

/* The KV cache's element type, and its bytes (K and V, every layer,
 * n_ctx tokens, every sequence). */
enum shoal_dtype shoal_ctx_kv_dtype(const struct shoal_ctx *ctx);
uint64_t shoal_ctx_kv_bytes(const struct shoal_ctx *ctx);

/* Forget everything after the first n tokens (n <= n_past) of sequence 0
 * / of sequence seq. */
void shoal_ctx_truncate(struct shoal_ctx *ctx, int64_t n);
void shoal_ctx_seq_truncate(struct shoal_ctx *ctx, int64_t seq, int64_t n);

/* Make sequence dst hold the first n cached tokens of sequence src (their
 * KV rows copied, every layer; a shared prefix is then not evaluated
 * again): afterwards n_past(dst) = n. n <= n_past(src); src == dst
 * truncates. Programmer invariants (seqs in range). Thread: the context's. */
void shoal_ctx_seq_copy(struct shoal_ctx *ctx, int64_t dst, int64_t src, int64_t n);

/* The cache rows of sequence seq in layer il: K (v = 0) or V (v = 1; NULL
 * for MLA, whose one row holds both), row j at j * *row_bytes bytes, n_ctx
 * rows. For saving and restoring a sequence (shoal serve --slot-dir): rows
 * 0 .. n_past(seq)-1 are valid. Programmer invariants (seq, il in range).
 * Thread: the context's, between evaluations. */
void *shoal_ctx_seq_kv(struct shoal_ctx *ctx, int64_t seq, int64_t il, int v,
                       size_t *row_bytes);

/* Declare rows 0 .. n-1 of sequence seq filled (by the caller, through
 * shoal_ctx_seq_kv, with rows a context of the same model and KV dtype
 * wrote): n_past(seq) = n. n in [0, n_ctx]. Thread: the context's. */
void shoal_ctx_seq_set_past(struct shoal_ctx *ctx, int64_t seq, int64_t n);

const struct shoal_ctx_timings *shoal_ctx_timings(const struct shoal_ctx *ctx);

/* 1 if the context keeps the MTP layers' state (params.mtp), else 0. */
int shoal_ctx_has_mtp(const struct shoal_ctx *ctx);

/* Draft up to k tokens for sequence seq with the model's MTP layers
 * (model.h struct shoal_mtp_weights; DeepSeek-V3 report §2.2, run as
 * vLLM's deepseek_mtp.py does). next is the token sampled after the
 * sequence's last cached one (it will sit at position n_past). First the
 * MTP layer catches up: every position j from the last one it saw to
 * n_past - 1 runs once, pairing j's final normed hidden state with the
 * token at j + 1 (next for the last), in chunks of n_batch rows, its KV
 * rows kept. The last row's logits give draft 1 (their argmax); drafts 2..k
 * chain the MTP layer on its own output hidden state and the previous
 * draft, at positions n_past.. (their MTP KV rows are provisional and
 * rewritten by the next catch-up). Layer j % n_mtp drafts token j + 1.
 *   drafts  [k] i32, written: the first *return* entries
 *   logits  [n_vocab] f32 or NULL: draft 1's logits (MTP head), written
 * Returns the number of drafts (0 .. k; fewer when the context is full or
 * the sequence's MTP state was lost by shoal_ctx_seq_set_past), or a
 * negative status with err set: SHOAL_EINVAL for a context made without
 * params.mtp, a seq out of range, an empty sequence, k < 0, or next out
 * of the vocabulary; the MTP experts' own errors. Never changes the
 * trunk's KV cache or any logits the trunk computes (contract 1: drafts
 * change only how many tokens a step verifies). Thread: the context's. */
int shoal_ctx_mtp_draft(struct shoal_ctx *ctx, int64_t seq, int32_t next, int k,
                        int32_t *drafts, float *logits, struct shoal_err *err);

#endif
