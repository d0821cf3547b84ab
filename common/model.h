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
};

struct shoal_layer_weights {
    struct shoal_weight attn_norm;   /* [n_embd] input_layernorm */
    struct shoal_weight wq;          /* [n_head*head_dim][n_embd] */
    struct shoal_weight wk;          /* [n_head_kv*head_dim][n_embd] */
    struct shoal_weight wv;          /* [n_head_kv*head_dim][n_embd] */
    struct shoal_weight wo;          /* [n_embd][n_head*head_dim] */
    struct shoal_weight bq, bk, bv;  /* biases, data NULL when absent */
    struct shoal_weight q_norm;      /* [head_dim] or [n_head*head_dim]; NULL data if none */
    struct shoal_weight k_norm;      /* [head_dim] or [n_head_kv*head_dim] */
    struct shoal_weight ffn_norm;    /* [n_embd] post_attention_layernorm */
    /* MoE layers */
    struct shoal_weight w_router;    /* [n_expert][n_embd] */
    struct shoal_expert_weights *experts; /* [n_expert], owned by the model */
    struct shoal_expert_weights shexp;    /* shared expert [n_ff_shexp] */
    struct shoal_weight w_shexp_gate;     /* [1][n_embd] */
    /* dense layers */
    struct shoal_expert_weights mlp;      /* [n_ff] */
};

struct shoal_model {
    struct shoal_model_config cfg;
    struct shoal_safetensors *st;    /* owned: the mapping the views borrow */
    struct shoal_weight tok_embd;    /* [n_vocab][n_embd] */
    struct shoal_weight out_norm;    /* [n_embd] */
    struct shoal_weight lm_head;     /* [n_vocab][n_embd] (tok_embd when tied) */
    struct shoal_layer_weights *layers; /* [n_layer] */
    char *dir;                       /* checkpoint directory */
};

/* Load the checkpoint in dir (borrowed path): config.json + *.safetensors.
 * Returns a model owned by the caller (shoal_model_free) or NULL with err
 * naming the file, tensor or field and what was expected vs found.
 * Thread: any. */
struct shoal_model *shoal_model_load(const char *dir, struct shoal_err *err);

/* Free a model and unmap its weights; NULL is a no-op. */
void shoal_model_free(struct shoal_model *m);

#endif
