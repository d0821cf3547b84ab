/* gguf_arch: what differs between the llama.cpp architectures shoal runs
 * from a GGUF file (model_gguf.c's internal helper; docs/MODELS.md "GGUF
 * files"): which metadata keys each reads and the config.json equivalent
 * it makes of them, llama.cpp's tensor names, and the tensors llama.cpp's
 * converter (convert_hf_to_gguf.py, conversion/<family>.py) reshapes, which are
 * put back in the Hugging Face layout shoal computes with.
 *
 * Architectures: qwen3moe, deepseek2 (DeepSeek-V2/V3/R1, Kimi-K2), qwen2moe,
 * olmoe, glm4moe, llama with experts (Mixtral), gpt-oss. A key under "ARCH." that the architecture does not read is refused
 * (it could change the computation), never ignored.
 *
 * Thread: any (load time, one thread per model). */
#ifndef SHOAL_GGUF_ARCH_H
#define SHOAL_GGUF_ARCH_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "gguf.h"
#include "model.h"

/* The tensors of a GGUF set by name, as model_gguf.c maps them. */
struct shoal_gguf_lookup {
    void *ctx;
    /* Tensor `name`: its descriptor (borrowed), *data its bytes in the
     * mapping, *file its file's path; marks it bound when mark_used. NULL
     * when the set has no such tensor. */
    const struct shoal_gguf_tensor *(*find)(void *ctx, const char *name, int mark_used,
                                            const uint8_t **data, const char **file);
};

/* The metadata being turned into a config.json equivalent. */
struct shoal_gguf_meta {
    const struct shoal_gguf *g;          /* the set's first file, borrowed */
    const char *path;                    /* named in messages, borrowed */
    const char *arch;                    /* general.architecture, borrowed */
    json_t *cfg;                         /* the config being built, borrowed */
    const struct shoal_gguf_lookup *lk;  /* tensor presence (vocab, biases), borrowed */
    struct shoal_err *err;
};

struct shoal_gguf_arch {
    const char *name;                    /* general.architecture */
    /* Fill mt->cfg (a config.json object shoal_model_config_parse reads)
     * from the metadata. Returns 0, or a negative status with mt->err set
     * naming the file, the key and expected vs found. */
    int (*config)(struct shoal_gguf_meta *mt);
};

/* The entry for general.architecture `name`, or NULL. Static storage.
 * Thread: any. */
const struct shoal_gguf_arch *shoal_gguf_arch_find(const char *name);

/* "qwen3moe, deepseek2, ..." (static string). Thread: any. */
const char *shoal_gguf_arch_list(void);

/* llama.cpp's tensor name of walker slot s of a general.architecture
 * `arch` model into buf (cap bytes): the model's "token_embd.weight", a
 * layer's "blk.N.attn_kv_a_mqa.weight", "blk.N.exp_probs_b.bias" (gpt-oss:
 * "blk.N.ffn_gate_inp.bias", its ffn_norm "blk.N.post_attention_norm.weight"),
 * and a routed expert's stacked "blk.N.ffn_gate_exps.weight" (gpt-oss's
 * bias components: "blk.N.ffn_gate_exps.bias"). Thread: any. */
void shoal_gguf_arch_tensor_name(const char *arch, const struct shoal_weight_slot *s,
                                 char *buf, size_t cap);

/* Bind slot s when the file holds it in another form than its own name:
 * deepseek2's kv_b_proj as the converter's split attn_k_b ([n_head]
 * [kv_lora_rank][qk_nope], W_UK transposed) and attn_v_b ([n_head]
 * [v_head_dim][kv_lora_rank]). Both of one float type: interleaved back per
 * head into a buffer m owns (m->owned), bit for bit. Otherwise (a block
 * type, or two types) the layer's wk_b and wv_b are views of the two as
 * shipped and s (wkv_b) stays unbound. Returns 0 when bound, 1 when s has
 * no other form (the caller reports the missing tensor), or a negative
 * status with err set. Thread: any. */
int shoal_gguf_arch_bind_other(const struct shoal_weight_slot *s, struct shoal_model *m,
                               const struct shoal_gguf_lookup *lk, const char *path,
                               struct shoal_err *err);

/* For every layer of m (MTP layers included) bound with wk_b / wv_b and no
 * wkv_b: wkv_b as F32 in kv_b_proj's order (head h: W_UK_h's qk_nope rows,
 * then W_UV_h's v_head_dim rows), each element the exact f32 value of the
 * shipped one, into a buffer m owns; wk_b and wv_b are then unbound. For
 * `shoal convert --dense T`, which requantizes kv_b_proj whole (without
 * --dense a container keeps the pair as shipped). Thread: the model's
 * owner, before it runs. */
void shoal_gguf_arch_kv_b_f32(struct shoal_model *m);

/* After slot s of a general.architecture `arch` model is bound as a view
 * of its tensor: llama's q_proj / k_proj rows, which the converter
 * permuted per head (LlamaModel.permute), are put back in the checkpoint's
 * order, into a buffer m owns; a routed expert of a model with a clamped
 * SwiGLU (gpt-oss) gets m->cfg.swiglu_limit. Returns 0 (allocation failure
 * aborts).
 * Thread: any. */
int shoal_gguf_arch_bound(const char *arch, const struct shoal_weight_slot *s,
                          struct shoal_model *m);

/* 1 if tensor `name` may stay unbound: a layer blk.N of the MTP layers
 * (cfg->n_nextn of them) that follow the decoder's cfg->n_layer, kept
 * mapped and never run; else 0. Thread: any. */
int shoal_gguf_arch_unbound_ok(const char *name, const struct shoal_model_config *cfg);

#endif
