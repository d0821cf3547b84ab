/* gguf_arch: per-architecture metadata and tensor names of GGUF files
 * (gguf_arch.h). Each architecture's keys are those llama.cpp's converter
 * writes (convert_hf_to_gguf.py: TextModel.set_gguf_parameters plus the
 * model class's own) and its loader reads (src/models/<arch>.cpp
 * load_arch_hparams); each becomes the config.json key of the Hugging Face
 * family it was converted from, so the same parser checks it. */
#include "gguf_arch.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml_dot.h"
#include "ggml_types.h"
#include "util.h"

/* ---- typed metadata readers ------------------------------------------- */

/* A getter's rc for key: 1 when absent and not required, the "required
 * key is missing" error when absent and required, else rc. */
static int found(struct shoal_gguf_meta *mt, const char *key, int rc, int required)
{
    if (rc != SHOAL_ENOTFOUND)
        return rc;
    if (!required)
        return 1;
    return shoal_err_set(mt->err, SHOAL_ENOTFOUND, "%s: required key '%s' is missing (a %s "
                         "model needs it)", mt->path, key, mt->arch);
}

/* Integer key ARCH.suffix in [lo, hi] into cfg[hf_key] (hf_key NULL: into
 * *out only). Returns 0, 1 when absent and not required, or an error. */
static int meta_int(struct shoal_gguf_meta *mt, const char *suffix, int required, int64_t lo,
                    int64_t hi, const char *hf_key, int64_t *out)
{
    char key[160];
    snprintf(key, sizeof key, "%s.%s", mt->arch, suffix);
    int64_t v = 0;
    const int rc = found(mt, key, shoal_gguf_get_int(mt->g, key, &v, mt->err), required);
    if (rc)
        return rc;
    if (v < lo || v > hi)
        return shoal_err_set(mt->err, SHOAL_ERANGE, "%s: key '%s' is %lld; expected %lld to "
                             "%lld", mt->path, key, (long long)v, (long long)lo, (long long)hi);
    if (hf_key)
        json_object_set_new(mt->cfg, hf_key, json_integer((json_int_t)v));
    if (out)
        *out = v;
    return 0;
}

/* Float key ARCH.suffix in (lo, hi] into cfg[hf_key] (NULL: *out only). */
static int meta_f64(struct shoal_gguf_meta *mt, const char *suffix, int required, double lo,
                    double hi, const char *hf_key, double *out)
{
    char key[160];
    snprintf(key, sizeof key, "%s.%s", mt->arch, suffix);
    double v = 0;
    const int rc = found(mt, key, shoal_gguf_get_f64(mt->g, key, &v, mt->err), required);
    if (rc)
        return rc;
    if (!(v > lo && v <= hi))
        return shoal_err_set(mt->err, SHOAL_ERANGE, "%s: key '%s' is %g; expected a value in "
                             "(%g, %g]", mt->path, key, v, lo, hi);
    if (hf_key)
        json_object_set_new(mt->cfg, hf_key, json_real(v));
    if (out)
        *out = v;
    return 0;
}

/* Bool key ARCH.suffix into *out (kept when absent). */
static int meta_bool(struct shoal_gguf_meta *mt, const char *suffix, int *out)
{
    char key[160];
    snprintf(key, sizeof key, "%s.%s", mt->arch, suffix);
    const int rc = shoal_gguf_get_bool(mt->g, key, out, mt->err);
    return rc == SHOAL_ENOTFOUND ? 1 : rc;
}

/* String key ARCH.suffix: *out borrowed from the file (NUL-terminated). */
static int meta_str(struct shoal_gguf_meta *mt, const char *suffix, const char **out)
{
    char key[160];
    snprintf(key, sizeof key, "%s.%s", mt->arch, suffix);
    size_t len = 0;
    const int rc = shoal_gguf_get_str(mt->g, key, out, &len, mt->err);
    return rc == SHOAL_ENOTFOUND ? 1 : rc;
}

/* Refuse a key under "ARCH." that is not in known. */
static int check_keys(struct shoal_gguf_meta *mt, const char *const *known, size_t n_known)
{
    const size_t al = strlen(mt->arch);
    for (uint64_t i = 0; i < shoal_gguf_n_kv(mt->g); i++) {
        const char *k = shoal_gguf_key(mt->g, i);
        if (strncmp(k, mt->arch, al) || k[al] != '.')
            continue;   /* general.*, tokenizer.*, split.*: not the computation */
        size_t j = 0;
        while (j < n_known && strcmp(k + al + 1, known[j]))
            j++;
        if (j == n_known)
            return shoal_err_set(mt->err, SHOAL_EUNSUPPORTED, "%s: metadata key '%s' is not "
                                 "one shoal understands for %s; refused rather than ignored "
                                 "(it could change the computation)", mt->path, k, mt->arch);
    }
    return 0;
}

#define KEYS(list) check_keys(mt, list, sizeof list / sizeof list[0])
#define REQ(s) do { if ((s) < 0) return -1; } while (0)
static const int64_t BIG = (int64_t)1 << 31;

/* ---- the parts every architecture shares ----------------------------------- */

/* block_count, context_length, embedding_length, the head counts (into
 * *n_head, *n_head_kv), the RMSNorm epsilon and rope.freq_base. */
static int meta_trunk(struct shoal_gguf_meta *mt, int64_t *n_embd, int64_t *n_head,
                      int64_t *n_head_kv)
{
    int rc;
    REQ(rc = meta_int(mt, "block_count", 1, 1, SHOAL_MAX_LAYERS, "num_hidden_layers", NULL));
    REQ(rc = meta_int(mt, "context_length", 1, 1, BIG, "max_position_embeddings", NULL));
    REQ(rc = meta_int(mt, "embedding_length", 1, 1, 1 << 20, "hidden_size", n_embd));
    REQ(rc = meta_int(mt, "attention.head_count", 1, 1, 1 << 16, "num_attention_heads",
                      n_head));
    *n_head_kv = *n_head;
    REQ(rc = meta_int(mt, "attention.head_count_kv", 0, 1, 1 << 16, NULL, n_head_kv));
    REQ(rc = meta_f64(mt, "attention.layer_norm_rms_epsilon", 1, 0, 1, "rms_norm_eps", NULL));
    REQ(rc = meta_f64(mt, "rope.freq_base", 0, 0, 1e30, "rope_theta", NULL));
    return 0;
}

/* The vocabulary (token_embd's rows; ARCH.vocab_size must agree), tied
 * embeddings (output.weight absent), bos / eos ids. */
static int meta_vocab(struct shoal_gguf_meta *mt)
{
    json_t *c = mt->cfg;
    const uint8_t *data;
    const char *file;
    const struct shoal_gguf_tensor *te = mt->lk->find(mt->lk->ctx, "token_embd.weight", 0,
                                                      &data, &file);
    if (!te)
        return shoal_err_set(mt->err, SHOAL_ENOTFOUND, "%s: missing tensor 'token_embd.weight' "
                             "(a %s model needs it)", mt->path, mt->arch);
    if (te->n_dims != 2)
        return shoal_err_set(mt->err, SHOAL_ESHAPE, "%s: tensor 'token_embd.weight' has %u "
                             "dims; expected 2 (ne = {n_embd, n_vocab})", mt->path, te->n_dims);
    json_object_set_new(c, "vocab_size", json_integer((json_int_t)te->ne[1]));
    int rc;
    REQ(rc = meta_int(mt, "vocab_size", 0, (int64_t)te->ne[1], (int64_t)te->ne[1], NULL, NULL));
    const int tied = !mt->lk->find(mt->lk->ctx, "output.weight", 0, &data, &file);
    json_object_set_new(c, "tie_word_embeddings", json_boolean(tied));
    static const char *const ids[2][2] = {{"tokenizer.ggml.bos_token_id", "bos_token_id"},
                                          {"tokenizer.ggml.eos_token_id", "eos_token_id"}};
    for (int i = 0; i < 2; i++) {
        int64_t id = -1;
        rc = shoal_gguf_get_int(mt->g, ids[i][0], &id, mt->err);
        if (rc == 0 && id >= 0 && id < BIG)
            json_object_set_new(c, ids[i][1], json_integer((json_int_t)id));
        else if (rc && rc != SHOAL_ENOTFOUND)
            return -1;
    }
    return 0;
}

/* ARCH.expert_count, expert_used_count and expert_feed_forward_length into
 * the family's config keys. */
static int meta_experts(struct shoal_gguf_meta *mt, const char *key_n_expert,
                        const char *key_n_ff_exp, int64_t *n_expert)
{
    int rc;
    int64_t k = 0;
    REQ(rc = meta_int(mt, "expert_count", 1, 1, 1 << 16, key_n_expert, n_expert));
    REQ(rc = meta_int(mt, "expert_used_count", 1, 1, *n_expert, "num_experts_per_tok", &k));
    if (key_n_ff_exp)
        REQ(rc = meta_int(mt, "expert_feed_forward_length", 1, 1, 1 << 22, key_n_ff_exp, NULL));
    return 0;
}

/* ARCH.nextn_predict_layers: the MTP layers block_count counts after the
 * decoder (llama.cpp's n_layer_nextn; n_layer() = block_count - it), as
 * config num_hidden_layers and num_nextn_predict_layers. Their blk.N
 * tensors, when the file has them, stay mapped and are never run. */
static int meta_nextn(struct shoal_gguf_meta *mt)
{
    int64_t n_block = 0, nextn = 0;
    int rc;
    REQ(rc = meta_int(mt, "block_count", 1, 1, SHOAL_MAX_LAYERS, NULL, &n_block));
    REQ(rc = meta_int(mt, "nextn_predict_layers", 0, 0, 16, "num_nextn_predict_layers",
                      &nextn));
    if (nextn >= n_block)
        return shoal_err_set(mt->err, SHOAL_EFORMAT, "%s: %s.nextn_predict_layers %lld leaves "
                             "no decoder layer of block_count %lld", mt->path, mt->arch,
                             (long long)nextn, (long long)n_block);
    json_object_set_new(mt->cfg, "num_hidden_layers", json_integer((json_int_t)(n_block - nextn)));
    return 0;
}

/* ARCH.rope.scaling.* (TextModel.set_gguf_parameters writes type "linear"
 * or "yarn", factor, original_context_length, yarn_beta_fast / slow) as
 * config rope_scaling, or nothing for type "none" / absent. *rs is the
 * object, borrowed by mt->cfg, NULL when none. */
static int meta_rope_scaling(struct shoal_gguf_meta *mt, json_t **rs)
{
    const char *type = NULL;
    int rc = meta_str(mt, "rope.scaling.type", &type);
    *rs = NULL;
    if (rc < 0)
        return rc;
    if (rc == 1 || !strcmp(type, "none"))
        return 0;
    if (strcmp(type, "linear") && strcmp(type, "yarn"))
        return shoal_err_set(mt->err, SHOAL_EUNSUPPORTED, "%s: %s.rope.scaling.type '%s' is "
                             "not supported; expected none, linear or yarn", mt->path,
                             mt->arch, type);
    json_t *o = json_object();
    json_object_set_new(mt->cfg, "rope_scaling", o);
    json_object_set_new(o, "type", json_string(type));
    double f = 0;
    REQ(rc = meta_f64(mt, "rope.scaling.factor", 1, 0, 1e9, NULL, &f));
    json_object_set_new(o, "factor", json_real(f));
    if (!strcmp(type, "yarn")) {
        int64_t orig = 0;
        double b = 0;
        REQ(rc = meta_int(mt, "rope.scaling.original_context_length", 1, 1, BIG, NULL, &orig));
        json_object_set_new(o, "original_max_position_embeddings", json_integer(orig));
        REQ(rc = meta_f64(mt, "rope.scaling.yarn_beta_fast", 0, -1e9, 1e9, NULL, &b));
        if (!rc)
            json_object_set_new(o, "beta_fast", json_real(b));
        REQ(rc = meta_f64(mt, "rope.scaling.yarn_beta_slow", 0, -1e9, 1e9, NULL, &b));
        if (!rc)
            json_object_set_new(o, "beta_slow", json_real(b));
        /* the converter's copies of rope_parameters' extrapolation_factor
         * and attention_factor. llama.cpp's graphs of these architectures
         * never read them: its YaRN mixes with ext_factor 1 (the whole
         * ramp, as transformers and shoal do), so 1 is the only value
         * that means what both compute; attention_factor is transformers'
         * scale of cos and sin, kept as the checkpoint's (llama.cpp
         * recomputes it from factor and mscale, which gives the same
         * value unless the config chose another) */
        REQ(rc = meta_f64(mt, "rope.scaling.yarn_ext_factor", 0, -1e9, 1e9, NULL, &b));
        if (!rc && b != 1.0)
            return shoal_err_set(mt->err, SHOAL_EUNSUPPORTED, "%s: %s.rope.scaling."
                                 "yarn_ext_factor is %g; expected 1 (YaRN's whole ramp, the "
                                 "only mix llama.cpp's %s graph and transformers compute)",
                                 mt->path, mt->arch, b, mt->arch);
        REQ(rc = meta_f64(mt, "rope.scaling.yarn_attn_factor", 0, 0, 1e9, NULL, &b));
        if (!rc)
            json_object_set_new(o, "attention_factor", json_real(b));
    } else {
        static const char *const yarn_only[] = {"yarn_beta_fast", "yarn_beta_slow",
                                                "yarn_ext_factor", "yarn_attn_factor"};
        for (size_t i = 0; i < sizeof yarn_only / sizeof yarn_only[0]; i++) {
            char key[160];
            snprintf(key, sizeof key, "%s.rope.scaling.%s", mt->arch, yarn_only[i]);
            if (shoal_gguf_find(mt->g, key) >= 0)
                return shoal_err_set(mt->err, SHOAL_EFORMAT, "%s: %s is given with "
                                     "rope.scaling.type %s; expected yarn", mt->path, key,
                                     type);
        }
    }
    *rs = o;
    return 0;
}

/* ---- qwen3moe ------------------------------------------------------------ */

static const char *const qwen3moe_keys[] = {
    "block_count", "context_length", "embedding_length", "feed_forward_length",
    "expert_feed_forward_length", "expert_count", "expert_used_count",
    "attention.head_count", "attention.head_count_kv", "attention.key_length",
    "attention.value_length", "attention.layer_norm_rms_epsilon", "rope.freq_base",
    "rope.dimension_count", "vocab_size", "expert_weights_norm",
};

/* head_dim from key_length (default n_embd / n_head), value_length equal
 * to it, n_head a multiple of n_head_kv. */
static int meta_head_dim(struct shoal_gguf_meta *mt, int64_t n_embd, int64_t n_head,
                         int64_t n_head_kv, int64_t *head_dim)
{
    int rc;
    if (n_head % n_head_kv)
        return shoal_err_set(mt->err, SHOAL_EFORMAT, "%s: %s.attention.head_count %lld is not "
                             "a multiple of %s.attention.head_count_kv %lld", mt->path,
                             mt->arch, (long long)n_head, mt->arch, (long long)n_head_kv);
    json_object_set_new(mt->cfg, "num_key_value_heads", json_integer((json_int_t)n_head_kv));
    int64_t hd = n_embd / n_head, vd = 0;   /* llama.cpp's default n_embd_head_k */
    REQ(rc = meta_int(mt, "attention.key_length", 0, 2, 1 << 16, NULL, &hd));
    vd = hd;
    REQ(rc = meta_int(mt, "attention.value_length", 0, 1, 1 << 16, NULL, &vd));
    if (vd != hd)
        return shoal_err_set(mt->err, SHOAL_EUNSUPPORTED, "%s: %s.attention.value_length %lld "
                             "differs from key_length %lld; shoal runs %s with one head size",
                             mt->path, mt->arch, (long long)vd, (long long)hd, mt->arch);
    *head_dim = hd;
    return 0;
}

/* rope.dimension_count: the whole head (want == head_dim), or as given. */
static int meta_rope_dim(struct shoal_gguf_meta *mt, int64_t want, const char *what)
{
    int64_t x = want;
    int rc;
    REQ(rc = meta_int(mt, "rope.dimension_count", 0, 1, 1 << 16, NULL, &x));
    if (x != want)
        return shoal_err_set(mt->err, SHOAL_EUNSUPPORTED, "%s: %s.rope.dimension_count %lld "
                             "differs from %s %lld", mt->path, mt->arch, (long long)x, what,
                             (long long)want);
    return 0;
}

/* llama.cpp's LLM_ARCH_QWEN3MOE: every layer MoE, top-k renormalised
 * (llama.cpp's graph does, as norm_topk_prob = true; ARCH.expert_weights_norm
 * when given), RoPE default (NEOX layout; the converter, Qwen3MoeModel <
 * Qwen2MoeModel, writes q/k unpermuted) with no scaling keys. */
static int qwen3moe_config(struct shoal_gguf_meta *mt)
{
    int rc = KEYS(qwen3moe_keys);
    if (rc)
        return rc;
    json_t *c = mt->cfg;
    json_object_set_new(c, "model_type", json_string("qwen3_moe"));
    json_object_set_new(c, "decoder_sparse_step", json_integer(1));
    json_object_set_new(c, "mlp_only_layers", json_array());
    int64_t n_embd = 0, n_head = 0, n_head_kv = 0, n_expert = 0, hd = 0;
    REQ(rc = meta_trunk(mt, &n_embd, &n_head, &n_head_kv));
    REQ(rc = meta_int(mt, "feed_forward_length", 0, 1, 1 << 22, "intermediate_size", NULL));
    REQ(rc = meta_experts(mt, "num_experts", "moe_intermediate_size", &n_expert));
    REQ(rc = meta_head_dim(mt, n_embd, n_head, n_head_kv, &hd));
    json_object_set_new(c, "head_dim", json_integer((json_int_t)hd));
    REQ(rc = meta_rope_dim(mt, hd, "the head size (shoal runs qwen3moe with full rotary)"));
    int norm = 1;
    REQ(rc = meta_bool(mt, "expert_weights_norm", &norm));
    json_object_set_new(c, "norm_topk_prob", json_boolean(norm));
    return meta_vocab(mt);
}

/* ---- qwen2moe, olmoe --------------------------------------------------- */

static const char *const qwen2moe_keys[] = {
    "block_count", "context_length", "embedding_length", "feed_forward_length",
    "expert_feed_forward_length", "expert_shared_feed_forward_length", "expert_count",
    "expert_used_count", "attention.head_count", "attention.head_count_kv",
    "attention.key_length", "attention.value_length", "attention.layer_norm_rms_epsilon",
    "rope.freq_base", "rope.dimension_count", "vocab_size",
};

/* llama.cpp's LLM_ARCH_QWEN2MOE (Qwen1.5-MoE, Qwen2-57B-A14B;
 * conversion/qwen.py Qwen2MoeModel, src/models/qwen2moe.cpp): every layer
 * MoE, top-k not renormalised, experts expert_feed_forward_length wide
 * (absent: feed_forward_length / top-k, as llama.cpp), a shared expert of
 * expert_shared_feed_forward_length (absent: feed_forward_length) behind
 * its sigmoid gate
 * ffn_gate_inp_shexp, q/k/v biases when the file has them, q/k unpermuted
 * (NEOX rotation, as transformers' rotate_half). */
static int qwen2moe_config(struct shoal_gguf_meta *mt)
{
    int rc = KEYS(qwen2moe_keys);
    if (rc)
        return rc;
    json_t *c = mt->cfg;
    json_object_set_new(c, "model_type", json_string("qwen2_moe"));
    json_object_set_new(c, "decoder_sparse_step", json_integer(1));
    json_object_set_new(c, "mlp_only_layers", json_array());
    json_object_set_new(c, "norm_topk_prob", json_false());
    int64_t n_embd = 0, n_head = 0, n_head_kv = 0, n_expert = 0, hd = 0, ff = 0, k = 0;
    REQ(rc = meta_trunk(mt, &n_embd, &n_head, &n_head_kv));
    REQ(rc = meta_experts(mt, "num_experts", NULL, &n_expert));
    /* llama.cpp's defaults: experts n_ff / top-k, the shared expert n_ff */
    REQ(rc = meta_int(mt, "feed_forward_length", 1, 1, 1 << 22, "intermediate_size", &ff));
    REQ(rc = meta_int(mt, "expert_used_count", 1, 1, n_expert, NULL, &k));
    json_object_set_new(c, "moe_intermediate_size", json_integer((json_int_t)(ff / k)));
    json_object_set_new(c, "shared_expert_intermediate_size", json_integer((json_int_t)ff));
    REQ(rc = meta_int(mt, "expert_feed_forward_length", 0, 1, 1 << 22, "moe_intermediate_size",
                      NULL));
    REQ(rc = meta_int(mt, "expert_shared_feed_forward_length", 0, 1, 1 << 22,
                      "shared_expert_intermediate_size", NULL));
    REQ(rc = meta_head_dim(mt, n_embd, n_head, n_head_kv, &hd));
    if (hd != n_embd / n_head)
        json_object_set_new(c, "head_dim", json_integer((json_int_t)hd));
    REQ(rc = meta_rope_dim(mt, hd, "the head size (shoal runs qwen2moe with full rotary)"));
    const uint8_t *d;
    const char *f;
    json_object_set_new(c, "qkv_bias", json_boolean(
                            mt->lk->find(mt->lk->ctx, "blk.0.attn_q.bias", 0, &d, &f) != NULL));
    return meta_vocab(mt);
}

static const char *const olmoe_keys[] = {
    "block_count", "context_length", "embedding_length", "feed_forward_length",
    "expert_feed_forward_length", "expert_count", "expert_used_count",
    "attention.head_count", "attention.head_count_kv", "attention.layer_norm_rms_epsilon",
    "rope.freq_base", "rope.dimension_count", "vocab_size", "attention.clamp_kqv",
};

/* llama.cpp's LLM_ARCH_OLMOE (OLMoE-1B-7B; conversion/olmo.py OlmoeModel,
 * src/models/olmoe.cpp): every layer MoE, top-k not renormalised, q/k
 * RMSNorm over the whole projection, q/k unpermuted (NEOX), head_dim =
 * n_embd / n_head, attention.clamp_kqv as config clip_qkv. The experts'
 * width is feed_forward_length (OLMoE's intermediate_size, which llama.cpp
 * reads as n_ff); expert_feed_forward_length, when present, must agree. */
static int olmoe_config(struct shoal_gguf_meta *mt)
{
    int rc = KEYS(olmoe_keys);
    if (rc)
        return rc;
    json_t *c = mt->cfg;
    json_object_set_new(c, "model_type", json_string("olmoe"));
    json_object_set_new(c, "norm_topk_prob", json_false());
    int64_t n_embd = 0, n_head = 0, n_head_kv = 0, n_expert = 0, ff = 0, ff_exp = 0;
    REQ(rc = meta_trunk(mt, &n_embd, &n_head, &n_head_kv));
    json_object_set_new(c, "num_key_value_heads", json_integer((json_int_t)n_head_kv));
    REQ(rc = meta_experts(mt, "num_experts", NULL, &n_expert));
    REQ(rc = meta_int(mt, "feed_forward_length", 1, 1, 1 << 22, "intermediate_size", &ff));
    ff_exp = ff;
    REQ(rc = meta_int(mt, "expert_feed_forward_length", 0, 1, 1 << 22, NULL, &ff_exp));
    if (ff != ff_exp)
        return shoal_err_set(mt->err, SHOAL_EFORMAT, "%s: %s.expert_feed_forward_length %lld "
                             "differs from feed_forward_length %lld; an OLMoE's experts have "
                             "one width", mt->path, mt->arch, (long long)ff_exp, (long long)ff);
    REQ(rc = meta_rope_dim(mt, n_embd / n_head, "the head size n_embd / n_head (full rotary)"));
    REQ(rc = meta_f64(mt, "attention.clamp_kqv", 0, 0, 1e30, "clip_qkv", NULL));
    return meta_vocab(mt);
}

static const char *const llama_keys[] = {
    "block_count", "context_length", "embedding_length", "feed_forward_length",
    "attention.head_count", "attention.head_count_kv", "attention.layer_norm_rms_epsilon",
    "attention.key_length", "attention.value_length", "rope.freq_base",
    "rope.dimension_count", "expert_count", "expert_used_count", "vocab_size",
};

/* llama.cpp's LLM_ARCH_LLAMA with experts: Mixtral (conversion/llama.py
 * LlamaModel, src/models/llama.cpp). The experts are feed_forward_length
 * wide, top-k renormalised (MixtralSparseMoeBlock), RoPE over the whole
 * head. A llama file without expert_count is a dense model, which shoal
 * does not run. The converter permutes q_proj / k_proj rows per head
 * (LlamaModel.permute) for llama.cpp's rotation of adjacent pairs; shoal
 * rotates the halves (rotate_half) of the checkpoint's rows, so
 * shoal_gguf_arch_bound puts the rows back (llama_unpermute). */
static int llama_config(struct shoal_gguf_meta *mt)
{
    int rc = KEYS(llama_keys);
    if (rc)
        return rc;
    json_t *c = mt->cfg;
    json_object_set_new(c, "model_type", json_string("mixtral"));
    int64_t n_embd = 0, n_head = 0, n_head_kv = 0, n_expert = 0, hd = 0;
    REQ(rc = meta_trunk(mt, &n_embd, &n_head, &n_head_kv));
    REQ(rc = meta_experts(mt, "num_local_experts", NULL, &n_expert));
    REQ(rc = meta_int(mt, "feed_forward_length", 1, 1, 1 << 22, "intermediate_size", NULL));
    REQ(rc = meta_head_dim(mt, n_embd, n_head, n_head_kv, &hd));
    json_object_set_new(c, "head_dim", json_integer((json_int_t)hd));
    if (hd % 2)
        return shoal_err_set(mt->err, SHOAL_EFORMAT, "%s: %s head size %lld is odd; the "
                             "converter's q/k permutation pairs rows", mt->path, mt->arch,
                             (long long)hd);
    REQ(rc = meta_rope_dim(mt, hd, "the head size (shoal runs llama with full rotary)"));
    return meta_vocab(mt);
}

/* ---- deepseek2 ---------------------------------------------------------- */

static const char *const deepseek2_keys[] = {
    "block_count", "context_length", "embedding_length", "feed_forward_length",
    "attention.head_count", "attention.head_count_kv", "attention.layer_norm_rms_epsilon",
    "rope.freq_base", "rope.dimension_count", "vocab_size", "leading_dense_block_count",
    "attention.q_lora_rank", "attention.kv_lora_rank", "attention.key_length",
    "attention.value_length", "attention.key_length_mla", "attention.value_length_mla",
    "expert_count", "expert_used_count", "expert_feed_forward_length", "expert_shared_count",
    "expert_weights_scale", "expert_weights_norm", "expert_gating_func",
    "expert_group_count", "expert_group_used_count", "rope.scaling.yarn_log_multiplier",
    "rope.scaling.type", "rope.scaling.factor", "rope.scaling.original_context_length",
    "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow",
    "rope.scaling.yarn_ext_factor", "rope.scaling.yarn_attn_factor", "nextn_predict_layers",
};

static double mscale_from_log_mul(double log_mul);

/* llama.cpp's expert_gating_func values (gguf-py ExpertGatingFuncType). */
enum { GATING_SOFTMAX = 1, GATING_SIGMOID = 2 };

static const char *const glm4moe_keys[] = {
    "block_count", "context_length", "embedding_length", "feed_forward_length",
    "attention.head_count", "attention.head_count_kv", "attention.layer_norm_rms_epsilon",
    "attention.key_length", "attention.value_length", "rope.freq_base",
    "rope.dimension_count", "expert_count", "expert_used_count", "expert_feed_forward_length",
    "expert_shared_count", "leading_dense_block_count", "expert_gating_func",
    "expert_weights_scale", "expert_weights_norm", "expert_group_count",
    "expert_group_used_count", "nextn_predict_layers",
};

/* llama.cpp's LLM_ARCH_GLM4_MOE (GLM-4.5 / 4.5-Air / 4.6; conversion/glm.py
 * Glm4MoeModel, src/models/glm4-moe.cpp): block_count counts the
 * nextn_predict_layers MTP layers after the decoder (their blk.N tensors
 * are left mapped, never run); q/k unpermuted (NEOX, rotate_half) over
 * rope.dimension_count of each head (partial_rotary_factor = that / head
 * size); q/k/v biases and per-head QK-norm when the file has them;
 * DeepSeek-V3's sigmoid router with exp_probs_b (expert_gating_func must say
 * sigmoid), groups, expert_weights_norm (absent: false) and
 * expert_weights_scale (absent: 1); leading dense layers. */
static int glm4moe_config(struct shoal_gguf_meta *mt)
{
    int rc = KEYS(glm4moe_keys);
    if (rc)
        return rc;
    json_t *c = mt->cfg;
    json_object_set_new(c, "model_type", json_string("glm4_moe"));
    int64_t n_embd = 0, n_head = 0, n_head_kv = 0, n_expert = 0, hd = 0;
    int64_t gating = GATING_SIGMOID, groups = 1, x = 0;
    REQ(rc = meta_trunk(mt, &n_embd, &n_head, &n_head_kv));
    REQ(rc = meta_nextn(mt));
    REQ(rc = meta_int(mt, "feed_forward_length", 0, 1, 1 << 22, "intermediate_size", NULL));
    REQ(rc = meta_experts(mt, "n_routed_experts", "moe_intermediate_size", &n_expert));
    REQ(rc = meta_int(mt, "expert_shared_count", 1, 0, 1 << 10, "n_shared_experts", NULL));
    REQ(rc = meta_int(mt, "leading_dense_block_count", 0, 0, SHOAL_MAX_LAYERS,
                      "first_k_dense_replace", NULL));
    REQ(rc = meta_int(mt, "expert_gating_func", 0, GATING_SOFTMAX, GATING_SIGMOID, NULL,
                      &gating));
    if (gating != GATING_SIGMOID)
        return shoal_err_set(mt->err, SHOAL_EUNSUPPORTED, "%s: %s.expert_gating_func is %lld; "
                             "expected 2 (sigmoid, GLM-4.5's router)", mt->path, mt->arch,
                             (long long)gating);
    REQ(rc = meta_int(mt, "expert_group_count", 0, 1, n_expert, "n_group", &groups));
    REQ(rc = meta_int(mt, "expert_group_used_count", 0, 1, groups, "topk_group", &x));
    int norm = 0;
    REQ(rc = meta_bool(mt, "expert_weights_norm", &norm));
    json_object_set_new(c, "norm_topk_prob", json_boolean(norm));
    REQ(rc = meta_f64(mt, "expert_weights_scale", 0, 0, 1e6, "routed_scaling_factor", NULL));
    REQ(rc = meta_head_dim(mt, n_embd, n_head, n_head_kv, &hd));
    json_object_set_new(c, "head_dim", json_integer((json_int_t)hd));
    int64_t rope = hd / 2;   /* the converter's default partial_rotary_factor 0.5 */
    REQ(rc = meta_int(mt, "rope.dimension_count", 0, 2, hd, NULL, &rope));
    json_object_set_new(c, "partial_rotary_factor", json_real((double)rope / (double)hd));
    const uint8_t *d;
    const char *f;
    json_object_set_new(c, "attention_bias", json_boolean(
                            mt->lk->find(mt->lk->ctx, "blk.0.attn_q.bias", 0, &d, &f) != NULL));
    json_object_set_new(c, "use_qk_norm", json_boolean(
                            mt->lk->find(mt->lk->ctx, "blk.0.attn_q_norm.weight", 0, &d, &f)
                            != NULL));
    return meta_vocab(mt);
}


/* llama.cpp's LLM_ARCH_DEEPSEEK2 (DeepSeek-V2/V2-Lite/V2.5, V3/R1, Kimi-K2;
 * conversion/deepseek.py DeepseekV2Model, src/models/deepseek2.cpp).
 *   MLA: the converter writes the MQA view, head_count_kv 1, key_length
 *   kv_lora_rank + qk_rope, value_length kv_lora_rank, and the real heads
 *   as key_length_mla (qk_nope + qk_rope) and value_length_mla (v_head_dim),
 *   with kv_b_proj split into attn_k_b / attn_v_b; files from before that
 *   split have no *_mla keys, key_length qk_nope + qk_rope, value_length
 *   v_head_dim, head_count_kv n_head and attn_kv_b. q/k are unpermuted (the
 *   model's interleaved rope is rotated as such by both).
 *   Routing: expert_gating_func softmax (or absent: llama.cpp's default for
 *   older V2 files) is deepseek_v2's MoEGate (groups, when more than one,
 *   by group_limited_greedy: DeepSeek-V2 has no other grouped method);
 *   sigmoid is deepseek_v3's noaux_tc with exp_probs_b the
 *   e_score_correction_bias. expert_weights_norm (absent: false) is
 *   norm_topk_prob, expert_weights_scale (absent: 1) routed_scaling_factor.
 *   YaRN: yarn_log_multiplier is 0.1 x mscale_all_dim (the converter's
 *   TAG_DEEPSEEK2_YARN_LOG_MUL_FIX); mscale itself is not written and
 *   llama.cpp takes it equal to mscale_all_dim (llama-context.cpp: the
 *   rotation unscaled, the softmax scaled by mscale_all_dim's factor
 *   squared), which every released config has. */
static int deepseek2_config(struct shoal_gguf_meta *mt)
{
    int rc = KEYS(deepseek2_keys);
    if (rc)
        return rc;
    json_t *c = mt->cfg;
    int64_t n_embd = 0, n_head = 0, n_head_kv = 0, n_expert = 0, rope = 0, kvl = 0;
    int64_t hk = 0, hv = 0, x = 0, gating = GATING_SOFTMAX, groups = 1;
    REQ(rc = meta_trunk(mt, &n_embd, &n_head, &n_head_kv));
    REQ(rc = meta_nextn(mt));
    json_object_set_new(c, "num_key_value_heads", json_integer((json_int_t)n_head));
    if (n_head_kv != 1 && n_head_kv != n_head)
        return shoal_err_set(mt->err, SHOAL_EFORMAT, "%s: %s.attention.head_count_kv is %lld; "
                             "expected 1 (MLA as MQA) or head_count %lld", mt->path, mt->arch,
                             (long long)n_head_kv, (long long)n_head);
    REQ(rc = meta_int(mt, "feed_forward_length", 0, 1, 1 << 22, "intermediate_size", NULL));
    REQ(rc = meta_experts(mt, "n_routed_experts", "moe_intermediate_size", &n_expert));
    REQ(rc = meta_int(mt, "expert_shared_count", 1, 0, 1 << 10, "n_shared_experts", NULL));
    REQ(rc = meta_int(mt, "leading_dense_block_count", 0, 0, SHOAL_MAX_LAYERS,
                      "first_k_dense_replace", NULL));
    REQ(rc = meta_int(mt, "attention.q_lora_rank", 0, 1, 1 << 20, "q_lora_rank", NULL));
    REQ(rc = meta_int(mt, "attention.kv_lora_rank", 1, 1, 1 << 20, "kv_lora_rank", &kvl));
    REQ(rc = meta_int(mt, "rope.dimension_count", 1, 2, 1 << 16, "qk_rope_head_dim", &rope));
    REQ(rc = meta_int(mt, "attention.key_length", 1, 1, 1 << 20, NULL, &hk));
    REQ(rc = meta_int(mt, "attention.value_length", 1, 1, 1 << 20, NULL, &hv));
    int64_t hk_mla = 0, hv_mla = 0;
    const int rk = meta_int(mt, "attention.key_length_mla", 0, 1, 1 << 16, NULL, &hk_mla);
    REQ(rk);
    const int rv = meta_int(mt, "attention.value_length_mla", 0, 1, 1 << 16, NULL, &hv_mla);
    REQ(rv);
    if (rk != rv)
        return shoal_err_set(mt->err, SHOAL_ENOTFOUND, "%s: required key '%s.attention.%s' "
                             "is missing (given with %s.attention.%s)", mt->path, mt->arch,
                             rk ? "key_length_mla" : "value_length_mla", mt->arch,
                             rk ? "value_length_mla" : "key_length_mla");
    if (!rk) {   /* the split form: key/value_length describe the latent */
        if (hk != kvl + rope || hv != kvl)
            return shoal_err_set(mt->err, SHOAL_EFORMAT, "%s: %s.attention.key_length %lld / "
                                 "value_length %lld; expected kv_lora_rank + rope dims %lld / "
                                 "kv_lora_rank %lld (MLA as MQA)", mt->path, mt->arch,
                                 (long long)hk, (long long)hv, (long long)(kvl + rope),
                                 (long long)kvl);
        hk = hk_mla;
        hv = hv_mla;
    }
    if (hk <= rope)
        return shoal_err_set(mt->err, SHOAL_EFORMAT, "%s: %s key head size %lld is not larger "
                             "than rope.dimension_count %lld (no qk_nope part)", mt->path,
                             mt->arch, (long long)hk, (long long)rope);
    json_object_set_new(c, "qk_nope_head_dim", json_integer((json_int_t)(hk - rope)));
    json_object_set_new(c, "v_head_dim", json_integer((json_int_t)hv));

    REQ(rc = meta_int(mt, "expert_gating_func", 0, GATING_SOFTMAX, GATING_SIGMOID, NULL,
                      &gating));
    const int sigmoid = gating == GATING_SIGMOID;
    json_object_set_new(c, "model_type", json_string(sigmoid ? "deepseek_v3" : "deepseek_v2"));
    json_object_set_new(c, "scoring_func", json_string(sigmoid ? "sigmoid" : "softmax"));
    REQ(rc = meta_int(mt, "expert_group_count", 0, 1, n_expert, "n_group", &groups));
    REQ(rc = meta_int(mt, "expert_group_used_count", 0, 1, groups, "topk_group", &x));
    json_object_set_new(c, "topk_method", json_string(
                            sigmoid ? "noaux_tc" : groups > 1 ? "group_limited_greedy" : "greedy"));
    int norm = 0;
    double scale = 1.0;
    REQ(rc = meta_bool(mt, "expert_weights_norm", &norm));
    json_object_set_new(c, "norm_topk_prob", json_boolean(norm));
    REQ(rc = meta_f64(mt, "expert_weights_scale", 0, 0, 1e6, "routed_scaling_factor", &scale));
    if (!sigmoid && norm && scale != 1.0)
        return shoal_err_set(mt->err, SHOAL_EUNSUPPORTED, "%s: %s.expert_weights_norm true with "
                             "expert_weights_scale %g under softmax gating; DeepSeek-V2's "
                             "MoEGate applies one or the other, expected scale 1", mt->path,
                             mt->arch, scale);

    json_t *rs = NULL;
    REQ(rc = meta_rope_scaling(mt, &rs));
    double log_mul = 0;
    REQ(rc = meta_f64(mt, "rope.scaling.yarn_log_multiplier", 0, 0, 1e6, NULL, &log_mul));
    if (!rc && (!rs || strcmp(json_string_value(json_object_get(rs, "type")), "yarn")))
        return shoal_err_set(mt->err, SHOAL_EFORMAT, "%s: %s.rope.scaling.yarn_log_multiplier "
                             "is given without rope.scaling.type yarn", mt->path, mt->arch);
    if (!rc) {   /* log_mul = 0.1 * mscale_all_dim; mscale taken equal (see above) */
        const double m = mscale_from_log_mul(log_mul);
        json_object_set_new(rs, "mscale_all_dim", json_real(m));
        json_object_set_new(rs, "mscale", json_real(m));
    }
    return meta_vocab(mt);
}

/* ---- gpt-oss ------------------------------------------------------------- */

static const char *const gptoss_keys[] = {
    "block_count", "context_length", "embedding_length", "feed_forward_length",
    "attention.head_count", "attention.head_count_kv", "attention.layer_norm_rms_epsilon",
    "attention.key_length", "attention.value_length", "attention.sliding_window",
    "attention.sliding_window_pattern", "rope.freq_base", "rope.freq_base_swa",
    "rope.dimension_count", "rope.scaling.type", "rope.scaling.factor",
    "rope.scaling.original_context_length", "rope.scaling.yarn_beta_fast",
    "rope.scaling.yarn_beta_slow", "rope.scaling.yarn_ext_factor",
    "rope.scaling.yarn_attn_factor", "expert_count", "expert_used_count",
    "expert_feed_forward_length", "vocab_size",
};

/* Which layers attend through the window, as config layer_types:
 * attention.sliding_window_pattern (llama.cpp's get_key_or_arr) a period
 * P (absent: 2) with layer il windowed when il % P < P - 1 (P = 0: every
 * layer; llama_hparams::set_swa_pattern), or an array of one bool per
 * layer. */
static int gptoss_layer_types(struct shoal_gguf_meta *mt, int64_t n_layer)
{
    char key[160];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", mt->arch);
    struct shoal_gguf_array arr = {0};
    int64_t period = 2;
    const int64_t at = shoal_gguf_find(mt->g, key);
    const int is_arr = at >= 0 && shoal_gguf_kv_type(mt->g, (uint64_t)at) == SHOAL_GGUF_TYPE_ARRAY;
    int rc;
    if (is_arr)
        REQ(rc = shoal_gguf_get_array(mt->g, key, &arr, mt->err));
    else
        REQ(rc = meta_int(mt, "attention.sliding_window_pattern", 0, 0, SHOAL_MAX_LAYERS, NULL,
                          &period));
    if (is_arr && ((arr.type != SHOAL_GGUF_TYPE_BOOL && arr.type != SHOAL_GGUF_TYPE_UINT8 &&
                    arr.type != SHOAL_GGUF_TYPE_INT8) || arr.n != (uint64_t)n_layer))
        return shoal_err_set(mt->err, SHOAL_EFORMAT, "%s: key '%s' is an array of %llu %s; "
                             "expected a period or %lld bools (one per layer)", mt->path, key,
                             (unsigned long long)arr.n, shoal_gguf_type_name(arr.type),
                             (long long)n_layer);
    json_t *lt = json_array();
    for (int64_t il = 0; il < n_layer; il++) {
        const int swa = is_arr ? ((const uint8_t *)arr.data)[il] != 0
                               : period == 0 || il % period < period - 1;
        json_array_append_new(lt, json_string(swa ? "sliding_attention" : "full_attention"));
    }
    json_object_set_new(mt->cfg, "layer_types", lt);
    return 0;
}

/* llama.cpp's LLM_ARCH_OPENAI_MOE (gpt-oss-20b / 120b; conversion/gpt_oss.py
 * GptOssModel, src/models/openai-moe.cpp) as shoal's gpt_oss family
 * (transformers' modeling_gpt_oss.py):
 *   attention: q/k/v/o biases (when the file has attn_q.bias), one sink
 *   logit per head (attn_sinks.weight), q/k unpermuted (NEOX: rotate_half),
 *   windowed layers per gptoss_layer_types over attention.sliding_window
 *   tokens, one rope.freq_base (freq_base_swa, when given, must equal it);
 *   post_attention_norm is the FFN's norm.
 *   experts: expert_feed_forward_length wide (feed_forward_length, written
 *   from the same intermediate_size, must agree), gate_up_proj split by the
 *   converter into ffn_gate_exps (even rows) and ffn_up_exps (odd rows),
 *   each with its bias; the router's bias ffn_gate_inp.bias; top-k of the
 *   biased logits, softmax over those k (SOFTMAX_WEIGHT); the clamped
 *   SwiGLU with llama.cpp's constants alpha 1.702 and limit 7.0
 *   (LLM_FFN_SWIGLU_OAI_MOE: the file carries no limit; both released
 *   models' swiglu_limit is 7.0).
 *   YaRN: rope.scaling.* as the config's rope_scaling with truncate false,
 *   the model's own rule (gpt-oss's config.json and OpenAI's reference
 *   RotaryEmbedding leave the correction range unrounded); llama.cpp's
 *   ggml_rope_yarn_corr_dims rounds it outward (floor / ceil), so its
 *   rotation of the frequencies inside the ramp differs from the model's
 *   and from shoal's. */
static int gptoss_config(struct shoal_gguf_meta *mt)
{
    int rc = KEYS(gptoss_keys);
    if (rc)
        return rc;
    json_t *c = mt->cfg;
    json_object_set_new(c, "model_type", json_string("gpt_oss"));
    int64_t n_embd = 0, n_head = 0, n_head_kv = 0, n_expert = 0, hd = 0, n_layer = 0;
    int64_t ff = 0, ff_exp = 0, win = 0;
    REQ(rc = meta_trunk(mt, &n_embd, &n_head, &n_head_kv));
    REQ(rc = meta_int(mt, "block_count", 1, 1, SHOAL_MAX_LAYERS, NULL, &n_layer));
    REQ(rc = meta_experts(mt, "num_local_experts", "intermediate_size", &n_expert));
    REQ(rc = meta_int(mt, "expert_feed_forward_length", 1, 1, 1 << 22, NULL, &ff_exp));
    ff = ff_exp;
    REQ(rc = meta_int(mt, "feed_forward_length", 0, 1, 1 << 22, NULL, &ff));
    if (ff != ff_exp)
        return shoal_err_set(mt->err, SHOAL_EFORMAT, "%s: %s.feed_forward_length %lld differs "
                             "from expert_feed_forward_length %lld; gpt-oss has one FFN width "
                             "(intermediate_size)", mt->path, mt->arch, (long long)ff,
                             (long long)ff_exp);
    REQ(rc = meta_head_dim(mt, n_embd, n_head, n_head_kv, &hd));
    json_object_set_new(c, "head_dim", json_integer((json_int_t)hd));
    REQ(rc = meta_rope_dim(mt, hd, "the head size (gpt-oss rotates the whole head)"));
    double base = 0, base_swa = 0;
    REQ(rc = meta_f64(mt, "rope.freq_base", 1, 0, 1e30, NULL, &base));
    REQ(rc = meta_f64(mt, "rope.freq_base_swa", 0, 0, 1e30, NULL, &base_swa));
    if (!rc && base_swa != base)
        return shoal_err_set(mt->err, SHOAL_EUNSUPPORTED, "%s: %s.rope.freq_base_swa %g differs "
                             "from rope.freq_base %g; shoal runs gpt-oss with one RoPE base",
                             mt->path, mt->arch, base_swa, base);
    REQ(rc = meta_int(mt, "attention.sliding_window", 1, 1, BIG, "sliding_window", &win));
    REQ(rc = gptoss_layer_types(mt, n_layer));
    json_t *rs = NULL;
    REQ(rc = meta_rope_scaling(mt, &rs));
    if (rs && !strcmp(json_string_value(json_object_get(rs, "type")), "yarn"))
        json_object_set_new(rs, "truncate", json_false());
    json_object_set_new(c, "swiglu_limit", json_real(7.0));
    const uint8_t *d;
    const char *f;
    json_object_set_new(c, "attention_bias", json_boolean(
                            mt->lk->find(mt->lk->ctx, "blk.0.attn_q.bias", 0, &d, &f) != NULL));
    return meta_vocab(mt);
}

#undef KEYS

/* The shortest decimal m (1 to 9 significant digits) with f32(0.1 * m) ==
 * log_mul, the converter's f32 write of 0.1 x mscale_all_dim: the config's
 * own value (0.707, 1.0), not 0.70699999 (log_mul / 0.1), so the softmax
 * scale is the checkpoint's to the bit. */
static double mscale_from_log_mul(double log_mul)
{
    const float want = (float)log_mul;
    char buf[32];
    for (int d = 1; d <= 9; d++) {
        snprintf(buf, sizeof buf, "%.*g", d, log_mul / 0.1);
        const double m = strtod(buf, NULL);
        if ((float)(0.1 * m) == want)
            return m;
    }
    return log_mul / 0.1;
}

/* ---- the table ------------------------------------------------------------- */

static const struct shoal_gguf_arch archs[] = {
    {"qwen3moe", qwen3moe_config},
    {"deepseek2", deepseek2_config},
    {"qwen2moe", qwen2moe_config},
    {"olmoe", olmoe_config},
    {"glm4moe", glm4moe_config},
    {"llama", llama_config},
    {"gpt-oss", gptoss_config},
};

const struct shoal_gguf_arch *shoal_gguf_arch_find(const char *name)
{
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (!strcmp(archs[i].name, name))
            return &archs[i];
    return NULL;
}

const char *shoal_gguf_arch_list(void)
{
    return "qwen3moe, deepseek2, qwen2moe, olmoe, glm4moe, llama (with experts: Mixtral), "
           "gpt-oss";
}

/* ---- tensor names -------------------------------------------------------- */

void shoal_gguf_arch_tensor_name(const char *arch, const struct shoal_weight_slot *s,
                                 char *buf, size_t cap)
{
    static const char *const exps[3] = {"gate", "up", "down"};
    if (s->kind == SHOAL_SLOT_EXPERT) {   /* comp 3..5: gpt-oss's biases */
        snprintf(buf, cap, "blk.%lld.ffn_%s_exps.%s", (long long)s->il, exps[s->comp % 3],
                 s->comp < 3 ? "weight" : "bias");
        return;
    }
    static const char *const top[][2] = {{"tok_embd", "token_embd"}, {"out_norm", "output_norm"},
                                         {"lm_head", "output"}};
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        if (!strcmp(s->name, top[i][0])) {
            snprintf(buf, cap, "%s.weight", top[i][1]);
            return;
        }
    /* "blk.N.<short>": llama.cpp's short names but for these */
    static const char *const layer[][2] = {
        {"router", "ffn_gate_inp.weight"}, {"router_bias", "exp_probs_b.bias"},
        {"attn_kv_a", "attn_kv_a_mqa.weight"}, {"shexp_gate", "ffn_gate_inp_shexp.weight"},
        {"shexp.w_gate", "ffn_gate_shexp.weight"}, {"shexp.w_up", "ffn_up_shexp.weight"},
        {"shexp.w_down", "ffn_down_shexp.weight"}, {"ffn.w_gate", "ffn_gate.weight"},
        {"ffn.w_up", "ffn_up.weight"}, {"ffn.w_down", "ffn_down.weight"},
    };
    /* GptOssModel: post_attention_layernorm is ATTN_POST_NORM, the
     * router's bias is ffn_gate_inp's */
    static const char *const gptoss[][2] = {
        {"ffn_norm", "post_attention_norm.weight"}, {"router_bias", "ffn_gate_inp.bias"},
    };
    const char *sfx = strchr(s->name + 4, '.');
    sfx = sfx ? sfx + 1 : s->name;
    /* Glm4MoeModel likewise: GLM4_MOE's tensors have ATTN_POST_NORM and no
     * FFN_NORM, so gguf-py names post_attention_layernorm post_attention_norm */
    if (!strcmp(arch, "glm4moe") && !strcmp(sfx, "ffn_norm")) {
        snprintf(buf, cap, "blk.%lld.post_attention_norm.weight", (long long)s->il);
        return;
    }
    for (size_t i = 0; !strcmp(arch, "gpt-oss") && i < sizeof gptoss / sizeof gptoss[0]; i++)
        if (!strcmp(sfx, gptoss[i][0])) {
            snprintf(buf, cap, "blk.%lld.%s", (long long)s->il, gptoss[i][1]);
            return;
        }
    for (size_t i = 0; i < sizeof layer / sizeof layer[0]; i++)
        if (!strcmp(sfx, layer[i][0])) {
            snprintf(buf, cap, "blk.%lld.%s", (long long)s->il, layer[i][1]);
            return;
        }
    const size_t n = strlen(sfx);
    const int bias = n > 5 && !strcmp(sfx + n - 5, ".bias");
    snprintf(buf, cap, "blk.%lld.%s%s", (long long)s->il, sfx, bias ? "" : ".weight");
}

/* ---- tensors in another form ------------------------------------------------ */

static int is_float_type(uint32_t t)
{
    return t == SHOAL_GGML_TYPE_F32 || t == SHOAL_GGML_TYPE_F16 || t == SHOAL_GGML_TYPE_BF16;
}

static enum shoal_dtype float_dtype(uint32_t t)
{
    return t == SHOAL_GGML_TYPE_F32 ? SHOAL_DTYPE_F32
         : t == SHOAL_GGML_TYPE_F16 ? SHOAL_DTYPE_F16 : SHOAL_DTYPE_BF16;
}

/* deepseek2's kv_b_proj from attn_k_b ne {qk_nope, kv_lora_rank, n_head}
 * and attn_v_b ne {kv_lora_rank, v_head_dim, n_head} (DeepseekV2Model.
 * modify_tensors: kv_b.view(n_head, nope + v, kvl), split, k_b transposed):
 * head h's rows are k_b[h] transposed then v_b[h], as in the checkpoint.
 * Both of one float type: copied in it, bit for bit. Otherwise (a block
 * type cannot be transposed) the layer runs the two as shipped: wk_b and
 * wv_b, views of the file (mla.c). */
static int bind_kv_b(const struct shoal_weight_slot *s, struct shoal_model *m,
                     const struct shoal_gguf_lookup *lk, const char *path,
                     struct shoal_err *err)
{
    const struct shoal_model_config *c = &m->cfg;
    const int64_t H = c->n_head, kvl = c->kv_lora_rank, nope = c->qk_nope_head_dim;
    const int64_t vd = c->v_head_dim;
    char nk[96], nv[96];
    snprintf(nk, sizeof nk, "blk.%lld.attn_k_b.weight", (long long)s->il);
    snprintf(nv, sizeof nv, "blk.%lld.attn_v_b.weight", (long long)s->il);
    const uint8_t *dk, *dv;
    const char *fk, *fv;
    const struct shoal_gguf_tensor *tk = lk->find(lk->ctx, nk, 1, &dk, &fk);
    const struct shoal_gguf_tensor *tv = lk->find(lk->ctx, nv, 1, &dv, &fv);
    if (!tk || !tv)
        return shoal_err_set(err, SHOAL_ENOTFOUND, "missing tensor '%s' in '%s' (a deepseek2 "
                             "model needs it, or the older 'blk.%lld.attn_kv_b.weight')",
                             tk ? nv : nk, path, (long long)s->il);
    const uint64_t want[2][3] = {{(uint64_t)nope, (uint64_t)kvl, (uint64_t)H},
                                 {(uint64_t)kvl, (uint64_t)vd, (uint64_t)H}};
    const struct shoal_gguf_tensor *t[2] = {tk, tv};
    for (int i = 0; i < 2; i++)
        if (t[i]->n_dims != 3 || t[i]->ne[0] != want[i][0] || t[i]->ne[1] != want[i][1] ||
            t[i]->ne[2] != want[i][2])
            return shoal_err_set(err, SHOAL_ESHAPE, "tensor '%s' in '%s' has wrong shape; "
                                 "expected ne {%llu, %llu, %llu}, got {%llu, %llu, %llu}",
                                 t[i]->name, i ? fv : fk, (unsigned long long)want[i][0],
                                 (unsigned long long)want[i][1],
                                 (unsigned long long)want[i][2],
                                 (unsigned long long)t[i]->ne[0],
                                 (unsigned long long)t[i]->ne[1],
                                 (unsigned long long)t[i]->ne[2]);
    const int is_float = tk->type == tv->type && is_float_type(tk->type);
    struct shoal_weight *w = s->w;
    memset(w, 0, sizeof *w);
    if (!is_float) {   /* the two as shipped, bound once both are checked */
        struct shoal_layer_weights *L = &m->layers[s->il];
        const uint8_t *d[2] = {dk, dv};
        const char *f[2] = {fk, fv};
        struct shoal_weight o[2];
        for (int i = 0; i < 2; i++) {
            o[i] = (struct shoal_weight){.rows = (int64_t)(want[i][1] * want[i][2]),
                                         .cols = (int64_t)want[i][0], .data = d[i]};
            if (is_float_type(t[i]->type)) {
                o[i].dtype = float_dtype(t[i]->type);
                continue;
            }
            const struct shoal_ggml_type_info *ti = shoal_ggml_type_info(t[i]->type);
            if (!shoal_ggml_dot_supported(t[i]->type) || !ti ||
                (uint64_t)o[i].cols % ti->block_size)
                return shoal_err_set(err, SHOAL_EUNSUPPORTED, "tensor '%s' in '%s' has type "
                                     "%s: not runnable yet (shoal runs F32, F16, BF16 and "
                                     "matrices of %s)", t[i]->name, f[i],
                                     shoal_ggml_type_name(t[i]->type), shoal_ggml_dot_types());
            o[i].dtype = SHOAL_DTYPE_GGML;
            o[i].ggml_type = t[i]->type;
            struct shoal_err e = {0};
            const uint64_t n_blk = (uint64_t)(o[i].rows * o[i].cols) / ti->block_size;
            if (shoal_ggml_check_scales(t[i]->type, d[i], n_blk, t[i]->name, 0, &e))
                return shoal_err_set(err, e.code, "'%s': %s", f[i], e.msg);
        }
        L->wk_b = o[0];
        L->wv_b = o[1];
        return 0;
    }
    const size_t rows = (size_t)(H * (nope + vd)), n = rows * (size_t)kvl;
    w->rows = (int64_t)rows;
    w->cols = kvl;
    const size_t es = tk->type == SHOAL_GGML_TYPE_F32 ? 4 : 2;
    uint8_t *out = shoal_xmalloc(n * es);
    for (int64_t h = 0; h < H; h++) {
        uint8_t *o = out + (size_t)(h * (nope + vd) * kvl) * es;
        for (int64_t r = 0; r < nope; r++)        /* W_UK[h] row r = k_b[h][:, r] */
            for (int64_t j = 0; j < kvl; j++)
                memcpy(o + (size_t)(r * kvl + j) * es,
                       dk + (size_t)((h * kvl + j) * nope + r) * es, es);
        memcpy(o + (size_t)(nope * kvl) * es, dv + (size_t)(h * vd * kvl) * es,
               (size_t)(vd * kvl) * es);
    }
    w->dtype = float_dtype(tk->type);
    w->data = out;
    m->owned = shoal_xrealloc(m->owned, (m->n_owned + 1) * sizeof *m->owned);
    m->owned[m->n_owned++] = out;
    return 0;
}

void shoal_gguf_arch_kv_b_f32(struct shoal_model *m)
{
    const struct shoal_model_config *c = &m->cfg;
    const int64_t H = c->n_head, kvl = c->kv_lora_rank, nope = c->qk_nope_head_dim;
    const int64_t vd = c->v_head_dim;
    for (int64_t il = 0; il < c->n_layer + c->n_nextn; il++) {
        struct shoal_layer_weights *L = &m->layers[il];
        if (!L->wk_b.data || !L->wv_b.data || L->wkv_b.data)
            continue;
        float *o = shoal_xmalloc((size_t)(H * (nope + vd) * kvl) * sizeof *o);
        float *row = shoal_xmalloc((size_t)(nope > kvl ? nope : kvl) * sizeof *row);
        for (int64_t h = 0; h < H; h++) {
            float *oh = o + h * (nope + vd) * kvl;
            for (int64_t j = 0; j < kvl; j++) {   /* k_b[h] row j: column j of W_UK_h */
                shoal_weight_row_to_f32(row, &L->wk_b, h * kvl + j);
                for (int64_t r = 0; r < nope; r++)
                    oh[r * kvl + j] = row[r];
            }
            for (int64_t i = 0; i < vd; i++)
                shoal_weight_row_to_f32(oh + (nope + i) * kvl, &L->wv_b, h * vd + i);
        }
        free(row);
        L->wkv_b = (struct shoal_weight){.dtype = SHOAL_DTYPE_F32, .data = o,
                                         .rows = H * (nope + vd), .cols = kvl};
        memset(&L->wk_b, 0, sizeof L->wk_b);   /* the container holds kv_b_proj only */
        memset(&L->wv_b, 0, sizeof L->wv_b);
        m->owned = shoal_xrealloc(m->owned, (m->n_owned + 1) * sizeof *m->owned);
        m->owned[m->n_owned++] = o;
    }
}

/* Undo LlamaModel.permute on w (n_head heads of hd rows): the file's row
 * h*hd + 2i + s is the checkpoint's row h*hd + s*hd/2 + i (s = 0, 1). Rows
 * move whole, in the type they ship in, into a buffer m owns. */
static int llama_unpermute(struct shoal_weight *w, int64_t n_head, struct shoal_model *m)
{
    const int64_t hd = w->rows / n_head;
    size_t row = (size_t)w->cols * shoal_dtype_size(w->dtype);
    if (w->dtype == SHOAL_DTYPE_GGML) {
        const struct shoal_ggml_type_info *ti = shoal_ggml_type_info(w->ggml_type);
        row = (size_t)w->cols / ti->block_size * ti->type_size;
    }
    uint8_t *out = shoal_xmalloc((size_t)w->rows * row);
    const uint8_t *in = w->data;
    for (int64_t h = 0; h < n_head; h++)
        for (int64_t i = 0; i < hd / 2; i++)
            for (int64_t s = 0; s < 2; s++)
                memcpy(out + (size_t)(h * hd + s * hd / 2 + i) * row,
                       in + (size_t)(h * hd + 2 * i + s) * row, row);
    w->data = out;
    m->owned = shoal_xrealloc(m->owned, (m->n_owned + 1) * sizeof *m->owned);
    m->owned[m->n_owned++] = out;
    return 0;
}

int shoal_gguf_arch_bound(const char *arch, const struct shoal_weight_slot *s,
                          struct shoal_model *m)
{
    if (s->kind == SHOAL_SLOT_EXPERT && s->comp == 0 && m->cfg.swiglu_limit > 0)
        m->layers[s->il].experts[s->ie].swiglu_limit = (float)m->cfg.swiglu_limit;
    if (strcmp(arch, "llama") || s->kind == SHOAL_SLOT_EXPERT)
        return 0;
    const size_t n = strlen(s->name);
    if (n > 7 && !strcmp(s->name + n - 7, ".attn_q"))
        return llama_unpermute(s->w, m->cfg.n_head, m);
    if (n > 7 && !strcmp(s->name + n - 7, ".attn_k"))
        return llama_unpermute(s->w, m->cfg.n_head_kv, m);
    return 0;
}

int shoal_gguf_arch_unbound_ok(const char *name, const struct shoal_model_config *cfg)
{
    char *end = NULL;
    if (cfg->n_nextn <= 0 || strncmp(name, "blk.", 4))
        return 0;
    const long long il = strtoll(name + 4, &end, 10);
    return end != name + 4 && *end == '.' && il >= cfg->n_layer &&
           il < cfg->n_layer + cfg->n_nextn;
}

int shoal_gguf_arch_bind_other(const struct shoal_weight_slot *s, struct shoal_model *m,
                               const struct shoal_gguf_lookup *lk, const char *path,
                               struct shoal_err *err)
{
    const size_t n = strlen(s->name);
    if (m->cfg.family->mla && n > 9 && !strcmp(s->name + n - 9, "attn_kv_b"))
        return bind_kv_b(s, m, lk, path, err);
    return 1;
}
