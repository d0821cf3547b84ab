/* plan: what a model needs (RAM, disk, bytes read per token), computed from
 * its Hugging Face config.json alone, before anything is downloaded
 * (`shoal plan`).
 *
 * Sizes follow the container `shoal convert` writes (docs/FORMAT.md): every
 * 2-D tensor in the chosen dtype (int8/int4 rows with one f32 scale per
 * group, quant.h), 1-D tensors f32 when the dtype is quantized, and one
 * expert as one blob (gate, up, down, each 64-byte aligned, the blob 4 KiB
 * aligned). For the families shoal runs the architecture comes from
 * common/model_config (the same parse as convert); deepseek_v2/v3, kimi_k2,
 * glm4_moe and gpt_oss are read here from their config fields (MLA,
 * shared experts, leading dense layers, MTP layers) and sized as a
 * container would hold them, with `runnable` = 0.
 *
 * Thread: any (plain data).
 */
#ifndef SHOAL_PLAN_H
#define SHOAL_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "tensor.h"

struct shoal_plan_params {
    enum shoal_dtype experts_dtype;   /* int4a8|int4|int8|bf16|f32 */
    enum shoal_dtype dense_dtype;     /* int4a8|int4|int8|bf16|f32 */
    int group;                        /* 32, 64, 128 */
    int64_t ctx;                      /* tokens of KV cache budgeted; 0: the
                                       * engine's default, min(max_position_embeddings,
                                       * 4096) */
    enum shoal_dtype kv_dtype;        /* the cache's elements: F32 (0, the
                                       * default), F16 or BF16 (--kv) */
};

/* Where the resident (trunk) bytes go. */
enum shoal_plan_part {
    SHOAL_PLAN_EMBED = 0, SHOAL_PLAN_LM_HEAD, SHOAL_PLAN_ATTN, SHOAL_PLAN_ROUTER,
    SHOAL_PLAN_SHEXP, SHOAL_PLAN_DENSE_MLP, SHOAL_PLAN_NORM, SHOAL_PLAN_N_PART,
};

struct shoal_plan {
    char model_type[64];
    int runnable;                 /* 1 if shoal runs this family today */
    int mla;                      /* multi-head latent attention */
    int64_t n_layer, n_moe_layer, n_mtp_layer;
    int64_t n_expert, n_expert_used, n_shared_expert;
    int64_t n_embd;               /* hidden size: one activation row is n_embd floats */
    /* parameters (elements) */
    uint64_t params_trunk, params_expert_one, params_experts, params_mtp;
    uint64_t params_total;        /* trunk + experts, MTP layers excluded */
    uint64_t params_active;       /* trunk + top-k experts in every MoE layer */
    uint64_t params_embed;        /* the embedding table (one row read per token) */
    uint64_t params_lm_head;      /* the output projection (tied: the embeddings) */
    uint64_t attn_flops_per_pos;  /* attention scores and values: FLOPs per token per
                                     position of context, every layer (4 x heads x dims) */
    /* bytes as `shoal convert` writes them (no 64-byte/4 KiB padding in
     * the trunk; expert blobs padded as on disk) */
    uint64_t part_bytes[SHOAL_PLAN_N_PART];
    uint64_t trunk_bytes;         /* sum of part_bytes: resident in RAM */
    uint64_t expert_weight_bytes; /* one expert's gate + up + down, unpadded */
    uint64_t expert_blob_bytes;   /* one expert on disk (blob_bytes) */
    uint64_t expert_comp_bytes[6];/* gate, up, down (gpt_oss: then their biases) */
    int n_expert_comp;            /* 3, or 6 for gpt_oss */
    uint64_t experts_bytes;       /* blob x n_expert x MoE layers */
    uint64_t mtp_bytes;           /* MTP layers at the same dtypes (not loaded) */
    /* KV cache */
    uint64_t kv_bytes_per_token;  /* what shoal's cache stores at kv_dtype: K and V,
                                     or for MLA the latent + rope key */
    uint64_t kv_mla_bytes_per_token; /* MLA: latent + rope key at kv_dtype; 0 otherwise */
    uint64_t kv_per_head_bytes_per_token; /* MLA: K (nope + rope) and V of every head,
                                     as a decompressed cache would hold them; 0 otherwise */
    int64_t kv_lora_rank, qk_rope_head_dim;
    int64_t ctx;                  /* tokens budgeted (params' ctx, or its default) */
    uint64_t kv_budget_bytes;     /* ctx x kv_bytes_per_token */
    /* per token */
    uint64_t token_expert_bytes;  /* top-k x blob x MoE layers */
    uint64_t token_trunk_bytes;   /* trunk bytes a decode token reads: all of it but
                                     the embedding table, of which one row */
};

/* Plan the model whose config.json text is json (len bytes; `what` names
 * it in errors) for p. Returns 0, or a negative status with one line in
 * err naming the file and field (an unknown model_type lists the known
 * ones). Thread: any. */
int shoal_plan_config(const char *json, size_t len, const char *what,
                      const struct shoal_plan_params *p, struct shoal_plan *out,
                      struct shoal_err *err);

/* Plan a GGUF file or split set (any one file of it; plan_gguf.c): every
 * tensor at its shipped type, sizes from the tensor descriptors, the
 * architecture from its metadata ({arch}.block_count, embedding_length,
 * expert_count, expert_used_count, attention.head_count[_kv],
 * key_length, kv_lora_rank, rope.dimension_count, context_length); one
 * expert's bytes are its slices of the layer's *_exps tensors (no
 * padding); runnable = 1 where `shoal run` takes the file today
 * (qwen3moe of F32/F16/BF16/Q8_0/Q4_K/Q6_K tensors). types gets
 * a line of the types' shares ("as shipped: experts Q4_K 100 %; trunk
 * ..."), types_len bytes. Returns 0, or a negative status with err naming
 * the file: not a GGUF, no architecture, not a mixture of experts.
 * Thread: any. */
int shoal_plan_gguf(const char *path, const struct shoal_plan_params *p, struct shoal_plan *o,
                    char *types, size_t types_len, struct shoal_err *err);

#endif
