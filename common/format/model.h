/* model: a loaded checkpoint: its config, and borrowed views of every
 * weight, named and shaped as the family's Hugging Face modeling file does.
 *
 * Loading checks that every tensor the architecture needs is present with
 * exactly the expected shape and a supported dtype, and that the checkpoint
 * holds no tensor the architecture does not use.
 *
 * Thread: load/free on one thread; the loaded model is read-only.
 */
#ifndef SHOAL_MODEL_H
#define SHOAL_MODEL_H

#include "err.h"
#include "model_config.h"
#include "safetensors.h"
#include "tensor.h"

/* One routed expert's SwiGLU FFN: down(silu(gate(x)) * up(x)). */
struct shoal_expert_weights {
    struct shoal_weight w_gate;  /* [n_ff_exp][n_embd] */
    struct shoal_weight w_up;    /* [n_ff_exp][n_embd] */
    struct shoal_weight w_down;  /* [n_embd][n_ff_exp] */
    /* gpt_oss: biases (data NULL when absent) */
    struct shoal_weight b_gate;  /* [n_ff_exp] */
    struct shoal_weight b_up;    /* [n_ff_exp] */
    struct shoal_weight b_down;  /* [n_embd] */
    float swiglu_limit;          /* > 0: gpt_oss's clamped SwiGLU (expert_ffn.h) */
};

struct shoal_layer_weights {
    struct shoal_weight attn_norm;   /* [n_embd] input_layernorm */
    struct shoal_weight wq;          /* [n_head*head_dim][n_embd] */
    struct shoal_weight wk;          /* [n_head_kv*head_dim][n_embd] */
    struct shoal_weight wv;          /* [n_head_kv*head_dim][n_embd] */
    struct shoal_weight wo;          /* [n_embd][n_head*head_dim] */
    struct shoal_weight bq, bk, bv;  /* biases, data NULL when absent */
    struct shoal_weight bo;          /* [n_embd] o_proj bias (gpt_oss) */
    struct shoal_weight sinks;       /* [n_head] attention sinks (gpt_oss) */
    struct shoal_weight q_norm;      /* [head_dim] or [n_head*head_dim]; NULL data if none */
    struct shoal_weight k_norm;      /* [head_dim] or [n_head_kv*head_dim] */
    /* MLA (cfg.family->mla; DeepSeek-V2 paper §2.1). wq is q_proj when
     * q_lora_rank == 0; wo is [n_embd][n_head*v_head_dim] */
    struct shoal_weight wq_a;        /* [q_lora_rank][n_embd] q_a_proj */
    struct shoal_weight q_a_norm;    /* [q_lora_rank] q_a_layernorm (eps 1e-6) */
    struct shoal_weight wq_b;        /* [n_head*head_dim][q_lora_rank] q_b_proj */
    struct shoal_weight wkv_a;       /* [kv_lora_rank+qk_rope_head_dim][n_embd]
                                        kv_a_proj_with_mqa */
    struct shoal_weight kv_a_norm;   /* [kv_lora_rank] kv_a_layernorm (eps 1e-6) */
    struct shoal_weight wkv_b;       /* [n_head*(qk_nope_head_dim+v_head_dim)][kv_lora_rank]
                                        kv_b_proj: per head qk_nope rows of W_UK then
                                        v_head_dim rows of W_UV */
    /* or, from a GGUF whose split attn_k_b / attn_v_b are not one float
     * type (DeepseekV2Model.modify_tensors in llama.cpp's converter), the
     * two as shipped (contract 2), wkv_b then unbound (data NULL):
     *   wk_b [n_head*kv_lora_rank][qk_nope_head_dim]: W_UK_h transposed, so
     *        W_UK_h^T q_nope is a matvec of head h's kv_lora_rank rows
     *   wv_b [n_head*v_head_dim][kv_lora_rank]: W_UV_h's rows
     * Optional slots of shoal_model_walk (kv_b_part), visited before
     * wkv_b, which is then required only without them: a container keeps
     * them as the GGUF shipped them. */
    struct shoal_weight wk_b, wv_b;
    struct shoal_weight ffn_norm;    /* [n_embd] post_attention_layernorm */
    /* MoE layers */
    struct shoal_weight w_router;    /* [n_expert][n_embd] */
    struct shoal_weight router_bias; /* [n_expert] e_score_correction_bias (noaux_tc), or
                                        gpt_oss's router bias (added to the logits) */
    struct shoal_expert_weights *experts; /* [n_expert], owned by the model */
    struct shoal_expert_weights shexp;    /* shared expert [n_ff_shexp] */
    struct shoal_weight w_shexp_gate;     /* [1][n_embd] */
    /* dense layers */
    struct shoal_expert_weights mlp;      /* [n_ff] */
};

/* An MTP (multi-token prediction) layer's own weights: DeepSeek-V3
 * technical report §2.2, as vLLM's deepseek_mtp.py runs it. At position i
 * it maps the trunk's final normed hidden state h_i and the next token's
 * embedding e = embd[t_{i+1}] (zero at position 0) to
 *   x = eh_proj([enorm(e) ; hnorm(h_i)])   then its decoder layer
 *   (m->layers[n_layer + j], with its own KV cache) and
 *   logits = head(head_norm(x)), a draft for t_{i+2}. */
struct shoal_mtp_weights {
    struct shoal_weight enorm;      /* [n_embd] */
    struct shoal_weight hnorm;      /* [n_embd] */
    struct shoal_weight eh_proj;    /* [n_embd][2 n_embd] */
    struct shoal_weight head_norm;  /* [n_embd] shared_head.norm */
    struct shoal_weight embd;       /* [n_vocab][n_embd] embed_tokens, its own copy;
                                       data NULL: the trunk's tok_embd */
    struct shoal_weight head;       /* [n_vocab][n_embd] shared_head.head; data NULL:
                                       the trunk's lm_head */
};

struct shoal_container;
struct shoal_expert_store;
struct shoal_gguf;
struct shoal_model_gguf;   /* a GGUF file (set) and its read-only mappings (model_gguf.c) */

struct shoal_model {
    struct shoal_model_config cfg;
    struct shoal_safetensors *st;    /* owned: the mapping the views borrow (HF dir) */
    struct shoal_container *ct;      /* owned: the container the views borrow */
    struct shoal_model_gguf *gguf;   /* owned: the GGUF file(s) the views borrow */
    struct shoal_expert_store *store;/* borrowed: serves a container's routed experts;
                                      * set by whoever runs them (the session,
                                      * expert_store.h), NULL until then */
    struct shoal_weight tok_embd;    /* [n_vocab][n_embd] */
    struct shoal_weight out_norm;    /* [n_embd] */
    struct shoal_weight lm_head;     /* [n_vocab][n_embd] (tok_embd when tied) */
    struct shoal_layer_weights *layers; /* [n_layer + cfg.n_nextn]: the decoder's, then
                                      * the MTP layers' blocks */
    struct shoal_mtp_weights *mtp;   /* [cfg.n_nextn], NULL when none */
    int64_t n_mtp;                   /* MTP layers bound and usable: cfg.n_nextn, or 0
                                      * (mtp_why says why when cfg.n_nextn > 0) */
    char mtp_why[SHOAL_ERR_MSG_MAX + 160]; /* one line: why the MTP layers are not usable */
    char *dir;                       /* checkpoint directory (or GGUF file) */
    void **owned;                    /* buffers the views above may borrow (gpt_oss
                                        experts cut from stacked tensors) */
    size_t n_owned;
};

/* Every weight of the architecture, as the walker hands it out. */
enum shoal_slot_kind {
    SHOAL_SLOT_DENSE = 0,   /* stays resident (trunk, norms, router, shared expert) */
    SHOAL_SLOT_EXPERT = 1,  /* a routed expert's w_gate / w_up / w_down */
};

struct shoal_weight_slot {
    const char *name;        /* shoal's canonical name ("blk.3.attn_q", "blk.3.exp.17.w_gate") */
    const char *hf_name;     /* the Hugging Face tensor name */
    struct shoal_weight *w;  /* the model field the view is bound to */
    int64_t rows, cols;      /* expected shape; cols == 0 means 1-D [rows] */
    int required;            /* 0 only for optional tensors */
    enum shoal_slot_kind kind;
    int64_t il, ie;          /* layer; expert (-1 unless kind == EXPERT) */
    int comp;                /* expert component: 0 w_gate, 1 w_up, 2 w_down */
    int router;              /* 1 for a router, its correction bias or a
                                shared-expert gate (a gate over the hidden
                                state that picks or weighs experts), else 0 */
    int fused;               /* gpt_oss: the slot is a slice of a [n_expert]-stacked
                                tensor (enum shoal_fused_part), else 0 */
    int kv_b_part;           /* 1: MLA's split wk_b or wv_b (optional; a GGUF binds
                                them with attn_kv_b, gguf_arch.c), else 0 */
};

/* How a gpt_oss expert slot is cut from its layer's stacked tensor
 * (modeling_gpt_oss.py GptOssExperts: gate_up_proj [n_expert][n_embd]
 * [2 n_ff_exp] input-major with gate and up interleaved column by column,
 * down_proj [n_expert][n_ff_exp][n_embd] input-major, and their biases). */
enum shoal_fused_part {
    SHOAL_FUSED_NONE = 0,
    SHOAL_FUSED_GATE,        /* gate_up_proj[ie][:, 0::2] transposed: [n_ff_exp][n_embd] */
    SHOAL_FUSED_UP,          /* gate_up_proj[ie][:, 1::2] transposed */
    SHOAL_FUSED_DOWN,        /* down_proj[ie] transposed: [n_embd][n_ff_exp] */
    SHOAL_FUSED_GATE_BIAS,   /* gate_up_proj_bias[ie][0::2] */
    SHOAL_FUSED_UP_BIAS,     /* gate_up_proj_bias[ie][1::2] */
    SHOAL_FUSED_DOWN_BIAS,   /* down_proj_bias[ie] */
};

/* Components of one routed expert as the walker visits them (comp 0 ..
 * n - 1): w_gate, w_up, w_down, and for gpt_oss b_gate, b_up, b_down. */
static inline int shoal_expert_n_comp(const struct shoal_model_config *c)
{
    return c->family->gpt_oss ? 6 : 3;
}

/* The dtype `shoal convert` writes a weight in, given the requested experts
 * and dense dtypes (container.c, plan.c and synth share this one rule):
 *   - a 1-D tensor (cols == 0) stays F32 when the target is not a float
 *     dtype (quantized, FP8), and always when it is a router's
 *     (e_score_correction_bias: it is F32 in the checkpoints and decides
 *     which experts run);
 *   - a router or shared-expert gate stays INT8 when the dense target is
 *     4-bit (INT4, INT4A8): it is well under 1 % of a model's bytes, and
 *     its rows decide which experts run (llama.cpp keeps its router in F32
 *     for the same reason);
 *   - otherwise routed experts take `experts` and every other tensor `dense`.
 * Thread: any. */
enum shoal_dtype shoal_target_dtype(enum shoal_slot_kind kind, int64_t cols, int router,
                                    enum shoal_dtype experts, enum shoal_dtype dense);

/* Visit every weight slot of m's architecture in a fixed order (dense
 * tensors of the model, then each layer's dense tensors, then its routed
 * experts in id order, gate/up/down). m->cfg must be set and m->layers
 * allocated (shoal_model_alloc_layers). The slot is valid during the call.
 * Stops at and returns the first non-zero return of fn. Thread: any. */
int shoal_model_walk(struct shoal_model *m,
                     int (*fn)(const struct shoal_weight_slot *slot, void *user),
                     void *user);

/* Visit the MTP layers' slots (cfg.n_nextn of them, layers n_layer ..):
 * each one's enorm, hnorm, eh_proj, shared_head.norm, its optional own
 * embed_tokens and shared_head.head, then its decoder layer's slots as
 * shoal_model_walk gives a layer's. Names "blk.N.nextn.*" and
 * "model.layers.N.*" (N = n_layer + j). Same contract as shoal_model_walk. */
int shoal_model_walk_mtp(struct shoal_model *m,
                         int (*fn)(const struct shoal_weight_slot *slot, void *user),
                         void *user);

/* Allocate m->layers (and expert tables) for m->cfg. */
void shoal_model_alloc_layers(struct shoal_model *m);

/* Load the checkpoint in dir (borrowed path): a shoal container (shoal.json,
 * see container.h), a Hugging Face directory (config.json + *.safetensors),
 * or a GGUF file or any file of a split set (shoal_model_is_gguf; the
 * architectures of gguf_arch.h, with F32, F16, BF16 tensors and matrices of
 * the types with a dot product (shoal_ggml_dot_supported), memory-mapped as
 * shipped: docs/MODELS.md "GGUF files"; a
 * metadata key under its architecture's prefix that shoal does not read is
 * refused, SHOAL_EUNSUPPORTED, as is another architecture or tensor type).
 * A container's routed experts are not loaded: an expert store serves them
 * (expert_store.h; the caller creates it and sets m->store).
 * Returns a model owned by the caller (shoal_model_free) or NULL with err
 * naming the file, tensor or field and what was expected vs found.
 * Thread: any. */
struct shoal_model *shoal_model_load(const char *dir, struct shoal_err *err);

/* Free a model and unmap its weights (not its store, which it borrows);
 * NULL is a no-op. */
void shoal_model_free(struct shoal_model *m);

/* 1 if path is a regular file that ends in ".gguf" or starts with GGUF's
 * magic, else 0 (the model is then loaded as one; a bad one gives the GGUF
 * reader's error). Thread: any. */
int shoal_model_is_gguf(const char *path);

/* The first file of a GGUF model (its metadata: architecture, vocabulary),
 * borrowed for the model's lifetime; NULL for any other model. Thread: any. */
const struct shoal_gguf *shoal_model_gguf_meta(const struct shoal_model *m);

/* model_gguf.c's part of shoal_model_load and shoal_model_free: bind m (cfg,
 * layers, views) from the GGUF at path; m->gguf is set even on error, for
 * shoal_model_free. Returns 0 or a negative status with err set. */
int shoal_model_gguf_load(struct shoal_model *m, const char *path, struct shoal_err *err);
void shoal_model_gguf_free(struct shoal_model_gguf *g);

/* The config.json object a GGUF model's metadata gives (the text
 * shoal_model_config_parse read for m->cfg; borrowed, lives as long as m),
 * or NULL for any other model. shoal convert writes it as the container's
 * config, so the container parses to the same config. Thread: any. */
const char *shoal_model_gguf_config_json(const struct shoal_model *m);

/* The files of a GGUF model's set (0 for any other model) and the path of
 * file i (borrowed for the model's lifetime). Thread: any. */
uint32_t shoal_model_gguf_n_files(const struct shoal_model *m);
const char *shoal_model_gguf_path(const struct shoal_model *m, uint32_t i);

/* Where p lies in a GGUF model's mappings: *file its file's index in the
 * set, *off its byte offset in that file. Returns 0, or SHOAL_ENOTFOUND
 * when p is in none of them. Thread: any. */
int shoal_model_gguf_locate(const struct shoal_model *m, const void *p, uint32_t *file,
                            uint64_t *off);

#endif
