/* model_config: the architecture of a checkpoint, read from Hugging Face
 * config.json, and the per-family descriptors that keep family differences
 * in data rather than in branches spread through the forward pass.
 *
 * Supported model_type values: mixtral, qwen2_moe, qwen3_moe, olmoe,
 * deepseek_v2, deepseek_v3, kimi_k2, glm4_moe. Semantics follow
 * transformers' modeling_<family>.py and modeling_rope_utils.py; for the
 * DeepSeek families (and Kimi-K2, DeepSeek-V3's architecture) the original
 * modeling_deepseek.py that ships with the checkpoints (MLA, the MoEGate,
 * the YaRN mscale applied to the softmax scale).
 *
 * Thread: any (configs and descriptors are plain data).
 */
#ifndef SHOAL_MODEL_CONFIG_H
#define SHOAL_MODEL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

#define SHOAL_MAX_LAYERS 512
#define SHOAL_MAX_NEXTN 16   /* MTP layers (num_nextn_predict_layers) at most */

enum shoal_qk_norm {
    SHOAL_QK_NORM_NONE = 0,
    SHOAL_QK_NORM_HEAD,   /* RMSNorm over each head's head_dim (qwen3_moe) */
    SHOAL_QK_NORM_FULL,   /* RMSNorm over the whole q / k projection (olmoe) */
};

enum shoal_rope_type {
    SHOAL_ROPE_DEFAULT = 0,
    SHOAL_ROPE_LINEAR,
    SHOAL_ROPE_DYNAMIC,
    SHOAL_ROPE_YARN,
    SHOAL_ROPE_LLAMA3,
};

enum shoal_sliding {
    SHOAL_SLIDING_NEVER = 0,    /* family ignores sliding_window */
    SHOAL_SLIDING_IF_SET,       /* mixtral: window when sliding_window != null */
    SHOAL_SLIDING_QWEN,         /* use_sliding_window && layer >= max_window_layers */
    SHOAL_SLIDING_LAYER_TYPES,  /* gpt_oss: the layers layer_types marks
                                   "sliding_attention" (default: even layers) */
};

/* Where head_dim comes from (transformers' <family>Attention). */
enum shoal_head_dim_rule {
    SHOAL_HEAD_DIM_KEY = 0,   /* config head_dim, else hidden_size / heads (mixtral, qwen3_moe) */
    SHOAL_HEAD_DIM_EXACT,     /* same, but head_dim x heads must equal hidden_size: older
                                 transformers derive and check it (qwen2_moe) */
    SHOAL_HEAD_DIM_DERIVED,   /* always hidden_size / heads, which must divide (olmoe) */
};

/* How router logits become expert scores (DeepSeek's scoring_func). */
enum shoal_router_score {
    SHOAL_ROUTER_SOFTMAX = 0,  /* softmax over all n_expert logits */
    SHOAL_ROUTER_SIGMOID,      /* sigmoid of each logit (deepseek_v3, kimi_k2, glm4_moe) */
    SHOAL_ROUTER_TOPK_SOFTMAX, /* top-k of the raw logits, then softmax over those k
                                  (gpt_oss GptOssTopKRouter) */
};

/* How the top-k experts are chosen from the scores (DeepSeek's topk_method). */
enum shoal_router_topk {
    SHOAL_TOPK_GREEDY = 0,     /* top-k of the scores */
    SHOAL_TOPK_GROUP_MAX,      /* deepseek_v2 group_limited_greedy: keep the topk_group
                                  groups with the largest max score, top-k inside them */
    SHOAL_TOPK_NOAUX_TC,       /* deepseek_v3: scores + e_score_correction_bias choose;
                                  groups ranked by the sum of their two best biased
                                  scores; weights are the unbiased scores */
};

/* What differs between families; one static descriptor per model_type. */
struct shoal_family {
    const char *model_type;
    enum shoal_qk_norm qk_norm;
    int qkv_bias_forced;          /* q/k/v projections always have a bias */
    int norm_topk_forced;         /* renormalise top-k weights regardless of config */
    int norm_topk_default;        /* default of config norm_topk_prob */
    const char *key_n_expert;     /* config key of the routed expert count */
    const char *key_n_ff_exp;     /* config key of the expert FFN width */
    const char *moe_prefix;       /* "block_sparse_moe" or "mlp" */
    const char *expert_gate;      /* per-expert tensor names: gate, up, down */
    const char *expert_up;
    const char *expert_down;
    enum shoal_head_dim_rule head_dim_rule;
    int has_shared_expert;        /* qwen2_moe shared expert + sigmoid gate */
    int has_sparse_step;          /* decoder_sparse_step / mlp_only_layers */
    int has_clip_qkv;             /* olmoe clip_qkv */
    double rms_norm_eps_default;
    double rope_theta_default;
    enum shoal_sliding sliding;
    int mla;                      /* multi-head latent attention (DeepSeek-V2 paper §2.1) */
    int rope_interleave;          /* RoPE rotates pairs (2i, 2i+1), not (i, i + dim/2) */
    int deepseek_moe;             /* DeepSeek-style MoE keys: n_routed_experts,
                                     n_shared_experts (ungated), first_k_dense_replace,
                                     routed_scaling_factor, n_group / topk_group */
    int sigmoid_router;           /* scores are sigmoid + correction bias (noaux_tc)
                                     whatever scoring_func says (glm4_moe) */
    int has_use_qk_norm;          /* config use_qk_norm turns per-head QK-norm on */
    int has_nextn;                /* config num_nextn_predict_layers (MTP layers) */
    int gpt_oss;                  /* gpt_oss: attention sinks, o_proj bias, router
                                     bias on the logits, fused gate_up experts with
                                     biases and the clamped SwiGLU (swiglu_limit) */
};

struct shoal_rope_scaling {
    enum shoal_rope_type type;
    double factor;
    double original_max_pos;      /* original_max_position_embeddings */
    double attention_factor;      /* yarn; <0 = derive from factor */
    double beta_fast, beta_slow;  /* yarn */
    double mscale, mscale_all_dim;/* yarn (DeepSeek-style); < 0 = unset */
    int truncate;                 /* yarn correction range rounding */
    double low_freq_factor, high_freq_factor; /* llama3 */
};

struct shoal_model_config {
    const struct shoal_family *family;
    int64_t n_vocab;
    int64_t n_embd;           /* hidden_size */
    int64_t n_layer;
    int64_t n_head;
    int64_t n_head_kv;
    int64_t head_dim;
    int64_t n_ff;             /* dense MLP width (non-MoE layers) */
    int64_t n_ff_exp;         /* routed expert FFN width */
    int64_t n_ff_shexp;       /* shared expert width, 0 = none */
    int64_t n_expert;
    int64_t n_expert_used;    /* top-k */
    int norm_topk_prob;
    double rms_norm_eps;
    double rope_freq_base;    /* rope_theta */
    double partial_rotary_factor;
    int64_t rope_dim;         /* rotated dims per head (= head_dim * partial) */
    struct shoal_rope_scaling rope_scaling;
    int64_t max_pos;          /* max_position_embeddings */
    int tie_embeddings;
    int qkv_bias;
    double clip_qkv;          /* 0 = none */
    int64_t sliding_window;   /* 0 = full attention */
    int64_t max_window_layers;
    int use_sliding_window;
    uint8_t layer_is_moe[SHOAL_MAX_LAYERS + SHOAL_MAX_NEXTN]; /* the decoder's, then the
                                     MTP layers' (il >= n_layer) */
    enum shoal_qk_norm qk_norm;   /* the family's, or per-head when use_qk_norm */
    /* MLA (family->mla). head_dim is then qk_nope + qk_rope (the q/k head)
     * and rope_dim qk_rope_head_dim */
    int64_t q_lora_rank;          /* 0: q_proj straight from the hidden state */
    int64_t kv_lora_rank;         /* the latent the KV cache holds */
    int64_t qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    double attn_scale;            /* multiplies 1/sqrt(head_dim) in attention: YaRN's
                                     mscale(factor, mscale_all_dim)^2 for MLA, else 1 */
    /* routing */
    enum shoal_router_score router_score;
    enum shoal_router_topk router_topk;
    int64_t n_group, topk_group;  /* expert groups, groups kept per token (1, 1: none) */
    double routed_scaling_factor; /* multiplies the routed weights (1 = none) */
    int router_bias;              /* 1: mlp.gate.e_score_correction_bias [n_expert] */
    int shexp_gated;              /* 1: qwen2_moe's sigmoid(shared_expert_gate(x)) */
    int64_t n_nextn;              /* MTP layers after the decoder (config
                                     num_nextn_predict_layers): layers n_layer ..
                                     n_layer + n_nextn - 1 (model.h: m->mtp) */
    /* gpt_oss (family->gpt_oss) */
    int o_bias;                   /* o_proj has a bias */
    int attn_sinks;               /* self_attn.sinks [n_head]: a logit per head that
                                     joins every softmax denominator */
    double swiglu_limit;          /* > 0: gate = min(g, limit), up = clip(u, +-limit),
                                     out = (up + 1) * gate * sigmoid(1.702 gate) */
    uint8_t layer_window[SHOAL_MAX_LAYERS]; /* SHOAL_SLIDING_LAYER_TYPES: 1 = window */
    int64_t bos_id, eos_id;   /* -1 when absent; eos may be the first of a list */
    int64_t eos_ids[8];
    int n_eos;
    /* quantization_config {"quant_method": "fp8", "fmt": "e4m3",
     * "weight_block_size": [128, 128]}: the FP8 block edge (128); 0 when
     * config.json has none (shoal_quant_config_parse) */
    int fp8_block;
    int mxfp4_experts;            /* gpt_oss: quantization_config mxfp4 (routed experts
                                     as *_blocks / *_scales) */
};

/* Parse a config.json file (path borrowed) into *cfg.
 * Every size is checked here, so later code may multiply them: head_dim
 * (given or derived) even and >= 2, heads x head_dim == hidden_size where the
 * family derives head_dim, q width <= 2^20, rotary dim >= 2, vocab_size <=
 * INT32_MAX, top-k within the expert count, total weights <= 2^46.
 * RoPE is read from rope_theta + rope_scaling or from a transformers-v5
 * rope_parameters object, to the same config. A key that would change the
 * computation and is not implemented (RoPE type or key, hidden_act,
 * layer_types that disagree with the window rule) is an error, never ignored.
 * Returns 0, or a negative status with err naming the file and field and
 * what was expected vs found (an unknown model_type names itself and lists
 * the supported ones). Thread: any. */
int shoal_model_config_load(const char *path, struct shoal_model_config *cfg,
                            struct shoal_err *err);

/* Same, from a JSON text of len bytes; `what` names the source in errors. */
int shoal_model_config_parse(const char *json, size_t len, const char *what,
                             struct shoal_model_config *cfg,
                             struct shoal_err *err);

/* The descriptor for a model_type, or NULL. */
const struct shoal_family *shoal_family_find(const char *model_type);

/* Comma-separated list of supported model_type values (static string). */
const char *shoal_family_list(void);

/* 1 if layer il uses a (sparse) MoE block, 0 if a dense MLP. */
static inline int shoal_layer_is_moe(const struct shoal_model_config *cfg,
                                     int64_t il)
{
    return cfg->layer_is_moe[il];
}

/* KV cache elements per token and layer: 2 x n_head_kv x head_dim, or for
 * MLA kv_lora_rank + qk_rope_head_dim (the normalised latent and the
 * shared rope key; DeepSeek-V2 paper §2.1.2). Thread: any. */
int64_t shoal_kv_elems_per_token(const struct shoal_model_config *cfg);

/* 1 if layer il attends through a sliding window of cfg->sliding_window. */
int shoal_layer_uses_window(const struct shoal_model_config *cfg, int64_t il);

#endif
