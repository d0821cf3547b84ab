/* synth_config: the families `shoal synth` writes (synth.h): built-in
 * shapes or a real checkpoint's config.json as the template, the config.json
 * written, parsed back with the shared parser, and the container's bytes
 * measured with the converter's layout rules (container_write.h). */
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "synth.h"

/* ---- the families ------------------------------------------------------------- */

/* Real shapes and the values of the real config.json (shared/data/configs;
 * SOURCES.md §1) that the shared family table (model_config.c) does not
 * hold: which keys a family's config has and what they mean is the shared
 * table's (make_config), what the real checkpoint set them to is this one's. */
struct fam_shape {
    const char *model_type, *arch;   /* model_type (a shoal_family's); architectures[0] */
    int64_t hidden, heads, kv_heads, head_dim, moe_ff, n_expert, top_k, shexp_ff;
    int norm_topk;                   /* norm_topk_prob (unless the family forces it) */
    int attn_bias_key;               /* the real config says attention_bias: false */
    int window_keys;                 /* ... and sliding_window: null, max_window_layers */
    double eps, theta;
};

static const struct fam_shape fams[] = {
    {"qwen3_moe", "Qwen3MoeForCausalLM", 2048, 32, 4, 128, 768, 128, 8, 0, 1, 1, 1, 1e-6, 1e6},
    {"olmoe", "OlmoeForCausalLM", 2048, 16, 16, 128, 1024, 64, 8, 0, 0, 1, 0, 1e-5, 1e4},
    {"mixtral", "MixtralForCausalLM", 4096, 32, 8, 128, 14336, 8, 2, 0, 1, 0, 0, 1e-5, 1e6},
    {"qwen2_moe", "Qwen2MoeForCausalLM", 2048, 16, 16, 128, 1408, 60, 4, 5632, 0, 0, 0, 1e-6,
     1e6},
};

/* Families written from a real checkpoint's config.json (shared/data/configs;
 * SOURCES.md §1): every key the real file has, in its order, with the shapes
 * replaced (apply_shapes) and quantization_config dropped (synth writes no
 * FP8). --config FILE does the same from any supported config.json. */
struct fam_tmpl {
    const char *model_type, *source, *json;
};

static const struct fam_tmpl tmpls[] = {
    {"deepseek_v3", "DeepSeek-V3-Base",
     "{\"architectures\":[\"DeepseekV3ForCausalLM\"],\"attention_bias\":false,"
     "\"attention_dropout\":0.0,"
     "\"auto_map\":{\"AutoConfig\":\"configuration_deepseek.DeepseekV3Config\","
     "\"AutoModel\":\"modeling_deepseek.DeepseekV3Model\","
     "\"AutoModelForCausalLM\":\"modeling_deepseek.DeepseekV3ForCausalLM\"},"
     "\"aux_loss_alpha\":0.001,\"bos_token_id\":0,\"eos_token_id\":1,\"ep_size\":1,"
     "\"first_k_dense_replace\":3,\"hidden_act\":\"silu\",\"hidden_size\":7168,"
     "\"initializer_range\":0.02,\"intermediate_size\":18432,\"kv_lora_rank\":512,"
     "\"max_position_embeddings\":163840,\"model_type\":\"deepseek_v3\","
     "\"moe_intermediate_size\":2048,\"moe_layer_freq\":1,\"n_group\":8,\"n_routed_experts\":256,"
     "\"n_shared_experts\":1,\"norm_topk_prob\":true,\"num_attention_heads\":128,"
     "\"num_experts_per_tok\":8,\"num_hidden_layers\":61,\"num_key_value_heads\":128,"
     "\"num_nextn_predict_layers\":1,\"pretraining_tp\":1,\"q_lora_rank\":1536,"
     "\"qk_nope_head_dim\":128,\"qk_rope_head_dim\":64,\"rms_norm_eps\":1e-06,"
     "\"rope_scaling\":{\"beta_fast\":32,\"beta_slow\":1,\"factor\":40,\"mscale\":1.0,"
     "\"mscale_all_dim\":1.0,\"original_max_position_embeddings\":4096,\"type\":\"yarn\"},"
     "\"rope_theta\":10000,\"routed_scaling_factor\":2.5,\"scoring_func\":\"sigmoid\","
     "\"seq_aux\":true,\"tie_word_embeddings\":false,\"topk_group\":4,\"topk_method\":\"noaux_tc\","
     "\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.33.1\",\"use_cache\":true,"
     "\"v_head_dim\":128,\"vocab_size\":129280}"},
    {"kimi_k2", "Kimi-K2-Instruct",
     "{\"architectures\":[\"DeepseekV3ForCausalLM\"],\"attention_bias\":false,"
     "\"attention_dropout\":0.0,"
     "\"auto_map\":{\"AutoConfig\":\"configuration_deepseek.DeepseekV3Config\","
     "\"AutoModel\":\"modeling_deepseek.DeepseekV3Model\","
     "\"AutoModelForCausalLM\":\"modeling_deepseek.DeepseekV3ForCausalLM\"},"
     "\"aux_loss_alpha\":0.001,\"bos_token_id\":163584,\"eos_token_id\":163585,"
     "\"first_k_dense_replace\":1,\"hidden_act\":\"silu\",\"hidden_size\":7168,"
     "\"initializer_range\":0.02,\"intermediate_size\":18432,\"kv_lora_rank\":512,"
     "\"max_position_embeddings\":131072,\"model_type\":\"kimi_k2\","
     "\"moe_intermediate_size\":2048,\"moe_layer_freq\":1,\"n_group\":1,\"n_routed_experts\":384,"
     "\"n_shared_experts\":1,\"norm_topk_prob\":true,\"num_attention_heads\":64,"
     "\"num_experts_per_tok\":8,\"num_hidden_layers\":61,\"num_key_value_heads\":64,"
     "\"num_nextn_predict_layers\":0,\"pretraining_tp\":1,\"q_lora_rank\":1536,"
     "\"qk_nope_head_dim\":128,\"qk_rope_head_dim\":64,\"rms_norm_eps\":1e-06,"
     "\"rope_theta\":50000.0,\"routed_scaling_factor\":2.827,\"rope_scaling\":{\"beta_fast\":1.0,"
     "\"beta_slow\":1.0,\"factor\":32.0,\"mscale\":1.0,\"mscale_all_dim\":1.0,"
     "\"original_max_position_embeddings\":4096,\"type\":\"yarn\"},\"scoring_func\":\"sigmoid\","
     "\"seq_aux\":true,\"tie_word_embeddings\":false,\"topk_group\":1,\"topk_method\":\"noaux_tc\","
     "\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.48.3\",\"use_cache\":true,"
     "\"v_head_dim\":128,\"vocab_size\":163840}"},
    {"glm4_moe", "GLM-4.5-Air-arch.INTELLECT-3-Base",
     "{\"architectures\":[\"Glm4MoeForCausalLM\"],"
     "\"auto_map\":{\"AutoConfig\":\"configuration_glm4_moe.Glm4MoeConfig\","
     "\"AutoModelForCausalLM\":\"modeling_glm4_moe.Glm4MoeForCausalLM\","
     "\"AutoModel\":\"modeling_glm4_moe.Glm4MoeModel\"},\"attention_bias\":true,"
     "\"attention_dropout\":0.0,\"pad_token_id\":151329,\"eos_token_id\":[151334,151329],"
     "\"head_dim\":128,\"hidden_act\":\"silu\",\"hidden_size\":4096,\"partial_rotary_factor\":0.5,"
     "\"initializer_range\":0.02,\"intermediate_size\":10944,\"max_position_embeddings\":131072,"
     "\"model_type\":\"glm4_moe\",\"moe_intermediate_size\":1408,\"norm_topk_prob\":true,"
     "\"num_attention_heads\":96,\"n_group\":1,\"topk_group\":1,\"n_routed_experts\":128,"
     "\"n_shared_experts\":1,\"routed_scaling_factor\":1.0,\"num_experts_per_tok\":8,"
     "\"first_k_dense_replace\":1,\"num_hidden_layers\":46,\"num_key_value_heads\":8,"
     "\"rms_norm_eps\":1e-05,\"rope_scaling\":null,\"rope_theta\":1000000,"
     "\"num_nextn_predict_layers\":1,\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\","
     "\"transformers_version\":\"4.54.0\",\"use_cache\":true,\"use_qk_norm\":false,"
     "\"vocab_size\":151552}"},
    {"deepseek_v2", "DeepSeek-V2-Lite",
     "{\"architectures\":[\"DeepseekV2ForCausalLM\"],\"attention_bias\":false,"
     "\"attention_dropout\":0.0,"
     "\"auto_map\":{\"AutoConfig\":\"configuration_deepseek.DeepseekV2Config\","
     "\"AutoModel\":\"modeling_deepseek.DeepseekV2Model\","
     "\"AutoModelForCausalLM\":\"modeling_deepseek.DeepseekV2ForCausalLM\"},"
     "\"aux_loss_alpha\":0.001,\"bos_token_id\":100000,\"eos_token_id\":100001,\"ep_size\":1,"
     "\"first_k_dense_replace\":1,\"hidden_act\":\"silu\",\"hidden_size\":2048,"
     "\"initializer_range\":0.02,\"intermediate_size\":10944,\"kv_lora_rank\":512,"
     "\"max_position_embeddings\":163840,\"model_type\":\"deepseek_v2\","
     "\"moe_intermediate_size\":1408,\"moe_layer_freq\":1,\"n_group\":1,\"n_routed_experts\":64,"
     "\"n_shared_experts\":2,\"norm_topk_prob\":false,\"num_attention_heads\":16,"
     "\"num_experts_per_tok\":6,\"num_hidden_layers\":27,\"num_key_value_heads\":16,"
     "\"pretraining_tp\":1,\"q_lora_rank\":null,\"qk_nope_head_dim\":128,\"qk_rope_head_dim\":64,"
     "\"rms_norm_eps\":1e-06,\"rope_scaling\":{\"beta_fast\":32,\"beta_slow\":1,\"factor\":40,"
     "\"mscale\":0.707,\"mscale_all_dim\":0.707,\"original_max_position_embeddings\":4096,"
     "\"type\":\"yarn\"},\"rope_theta\":10000,\"routed_scaling_factor\":1.0,"
     "\"scoring_func\":\"softmax\",\"seq_aux\":true,\"tie_word_embeddings\":false,\"topk_group\":1,"
     "\"topk_method\":\"greedy\",\"torch_dtype\":\"bfloat16\",\"v_head_dim\":128,"
     "\"vocab_size\":102400}"},
    {"gpt_oss", "gpt-oss-20b (quantization_config dropped)",
     "{\"architectures\":[\"GptOssForCausalLM\"],\"attention_bias\":true,\"attention_dropout\":0.0,\"eo"
     "s_token_id\":200002,\"experts_per_token\":4,\"head_dim\":64,\"hidden_act\":\"silu\",\"hidden_size\""
     ":2880,\"initial_context_length\":4096,\"initializer_range\":0.02,\"intermediate_size\":2880,\"l"
     "ayer_types\":[\"sliding_attention\",\"full_attention\",\"sliding_attention\",\"full_attention\",\""
     "sliding_attention\",\"full_attention\",\"sliding_attention\",\"full_attention\",\"sliding_attent"
     "ion\",\"full_attention\",\"sliding_attention\",\"full_attention\",\"sliding_attention\",\"full_att"
     "ention\",\"sliding_attention\",\"full_attention\",\"sliding_attention\",\"full_attention\",\"slidi"
     "ng_attention\",\"full_attention\",\"sliding_attention\",\"full_attention\",\"sliding_attention\","
     "\"full_attention\"],\"max_position_embeddings\":131072,\"model_type\":\"gpt_oss\",\"num_attention"
     "_heads\":64,\"num_experts_per_tok\":4,\"num_hidden_layers\":24,\"num_key_value_heads\":8,\"num_l"
     "ocal_experts\":32,\"output_router_logits\":false,\"pad_token_id\":199999,\"rms_norm_eps\":1e-05"
     ",\"rope_scaling\":{\"beta_fast\":32.0,\"beta_slow\":1.0,\"factor\":32.0,\"original_max_position_e"
     "mbeddings\":4096,\"rope_type\":\"yarn\",\"truncate\":false},\"rope_theta\":150000,\"router_aux_los"
     "s_coef\":0.9,\"sliding_window\":128,\"swiglu_limit\":7.0,\"tie_word_embeddings\":false,\"transfo"
     "rmers_version\":\"4.55.0.dev0\",\"use_cache\":true,\"vocab_size\":201088}"},
};

static int64_t jint(const json_t *o, const char *key, int64_t dflt)
{
    const json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : dflt;
}

/* Set key to n only where the template has it (so the written config has
 * exactly the real file's keys). */
static void jset_if(json_t *o, const char *key, int64_t n)
{
    if (json_object_get(o, key))
        json_object_set_new(o, key, json_integer(n));
}

/* A token id key (bos/eos/pad, an id or a list of ids) kept inside the
 * vocabulary: ids >= vocab become vocab - 1. */
static void clamp_ids(json_t *o, const char *key, int64_t vocab)
{
    json_t *v = json_object_get(o, key);
    if (json_is_integer(v) && json_integer_value(v) >= vocab)
        json_object_set_new(o, key, json_integer(vocab - 1));
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x)
        if (json_is_integer(x) && json_integer_value(x) >= vocab)
            json_array_set_new(v, i, json_integer(vocab - 1));
}

void synth_shape_of_tmpl(const json_t *t, const struct shoal_family *f, struct shape *s)
{
    memset(s, 0, sizeof *s);
    s->hidden = jint(t, "hidden_size", 0);
    s->heads = jint(t, "num_attention_heads", 1);
    s->kv_heads = jint(t, "num_key_value_heads", s->heads);
    s->head_dim = jint(t, "head_dim", jint(t, "qk_nope_head_dim", s->hidden / s->heads));
    s->moe_ff = jint(t, f->key_n_ff_exp, 0);
    s->n_expert = jint(t, f->key_n_expert, 0);
    s->top_k = jint(t, "num_experts_per_tok", 1);
    s->shexp_ff = jint(t, "shared_expert_intermediate_size", 0);
    s->vocab = jint(t, "vocab_size", 32000);
    s->ff = strcmp(f->key_n_ff_exp, "intermediate_size") ? jint(t, "intermediate_size", 0) : 0;
    s->q_lora = jint(t, "q_lora_rank", 0);
    s->kv_lora = jint(t, "kv_lora_rank", 0);
    s->rope_dim = jint(t, "qk_rope_head_dim", 0);
    s->n_group = jint(t, "n_group", 1);
    s->topk_group = jint(t, "topk_group", 1);
    /* a few layers keep one of the leading dense layers */
    s->dense_layers = jint(t, "first_k_dense_replace", 0) > 0 ? 1 : 0;
    s->layers = 1;
}

json_t *synth_apply_shapes(const json_t *t, const struct shoal_family *f,
                           const struct shape *s)
{
    json_t *c = json_deep_copy(t);
    json_object_del(c, "quantization_config");
    json_object_set_new(c, "hidden_size", json_integer(s->hidden));
    json_object_set_new(c, "num_hidden_layers", json_integer(s->layers));
    json_object_set_new(c, "num_attention_heads", json_integer(s->heads));
    jset_if(c, "num_key_value_heads", f->mla ? s->heads : s->kv_heads);
    json_object_set_new(c, "vocab_size", json_integer(s->vocab));
    json_object_set_new(c, f->key_n_expert, json_integer(s->n_expert));
    json_object_set_new(c, f->key_n_ff_exp, json_integer(s->moe_ff));
    json_object_set_new(c, "num_experts_per_tok", json_integer(s->top_k));
    if (s->ff)
        jset_if(c, "intermediate_size", s->ff);
    jset_if(c, "shared_expert_intermediate_size", s->shexp_ff);
    jset_if(c, "head_dim", s->head_dim);
    if (f->mla) {
        jset_if(c, "qk_nope_head_dim", s->head_dim);
        jset_if(c, "v_head_dim", s->head_dim);
        jset_if(c, "qk_rope_head_dim", s->rope_dim);
        jset_if(c, "kv_lora_rank", s->kv_lora);
        if (json_is_integer(json_object_get(c, "q_lora_rank"))) /* null: no q-LoRA */
            jset_if(c, "q_lora_rank", s->q_lora);
    }
    jset_if(c, "n_group", s->n_group);
    jset_if(c, "topk_group", s->topk_group);
    jset_if(c, "first_k_dense_replace", s->dense_layers);
    jset_if(c, "max_window_layers", s->layers);
    jset_if(c, "experts_per_token", s->top_k);
    json_t *lt = json_object_get(c, "layer_types");
    if (json_is_array(lt) && json_array_size(lt) > 0) {   /* gpt_oss: the pattern, resized */
        json_t *nl = json_array();
        for (int64_t il = 0; il < s->layers; il++)
            json_array_append(nl, json_array_get(lt, (size_t)il % json_array_size(lt)));
        json_object_set_new(c, "layer_types", nl);
    }
    clamp_ids(c, "bos_token_id", s->vocab);
    clamp_ids(c, "eos_token_id", s->vocab);
    clamp_ids(c, "pad_token_id", s->vocab);
    return c;
}

json_t *synth_make_config(const struct fam_shape *f, const struct shape *s)
{
    /* the keys are the shared family's (model_config.c): its expert count
     * and width, head_dim where it reads one, its shared expert, sparse step,
     * QKV clip and sliding window */
    const struct shoal_family *sf = shoal_family_find(f->model_type);
    json_t *c = json_object();
    json_object_set_new(c, "architectures", json_pack("[s]", f->arch));
    json_object_set_new(c, "model_type", json_string(f->model_type));
    json_object_set_new(c, "hidden_size", json_integer(s->hidden));
    json_object_set_new(c, "num_hidden_layers", json_integer(s->layers));
    json_object_set_new(c, "num_attention_heads", json_integer(s->heads));
    json_object_set_new(c, "num_key_value_heads", json_integer(s->kv_heads));
    json_object_set_new(c, "vocab_size", json_integer(s->vocab));
    json_object_set_new(c, "max_position_embeddings", json_integer(4096));
    json_object_set_new(c, "rms_norm_eps", json_real(f->eps));
    json_object_set_new(c, "rope_theta", json_real(f->theta));
    json_object_set_new(c, "tie_word_embeddings", json_false());
    json_object_set_new(c, "hidden_act", json_string("silu"));
    json_object_set_new(c, "num_experts_per_tok", json_integer(s->top_k));
    json_object_set_new(c, "eos_token_id", json_integer(s->vocab - 1));
    json_object_set_new(c, "torch_dtype", json_string("bfloat16"));
    if (sf->head_dim_rule == SHOAL_HEAD_DIM_KEY)
        json_object_set_new(c, "head_dim", json_integer(s->head_dim));
    json_object_set_new(c, sf->key_n_expert, json_integer(s->n_expert));
    json_object_set_new(c, sf->key_n_ff_exp, json_integer(s->moe_ff));
    if (sf->has_shared_expert)
        json_object_set_new(c, "shared_expert_intermediate_size", json_integer(s->shexp_ff));
    if (strcmp(sf->key_n_ff_exp, "intermediate_size"))   /* the dense MLP's width */
        json_object_set_new(c, "intermediate_size",
                            json_integer(sf->has_shared_expert ? s->shexp_ff : 3 * s->hidden));
    if (sf->has_sparse_step) {
        json_object_set_new(c, "decoder_sparse_step", json_integer(1));
        json_object_set_new(c, "mlp_only_layers", json_array());
    }
    if (!sf->norm_topk_forced)
        json_object_set_new(c, "norm_topk_prob", json_boolean(f->norm_topk));
    if (sf->has_clip_qkv)
        json_object_set_new(c, "clip_qkv", json_null());
    if (f->attn_bias_key)
        json_object_set_new(c, "attention_bias", json_false());
    if (sf->sliding == SHOAL_SLIDING_QWEN)
        json_object_set_new(c, "use_sliding_window", json_false());
    if (sf->sliding == SHOAL_SLIDING_IF_SET || f->window_keys)
        json_object_set_new(c, "sliding_window", json_null());
    if (f->window_keys)
        json_object_set_new(c, "max_window_layers", json_integer(s->layers));
    return c;
}

int synth_parse_config(json_t *config, struct shoal_model_config *cfg, struct shoal_err *err)
{
    char *text = json_dumps(config, JSON_COMPACT);
    int rc = shoal_model_config_parse(text, strlen(text), "synthetic config", cfg, err);
    free(text);
    return rc;
}


const struct fam_shape *synth_fam_find(const char *model_type)
{
    for (size_t k = 0; k < sizeof fams / sizeof fams[0]; k++)
        if (!strcmp(fams[k].model_type, model_type))
            return &fams[k];
    return NULL;
}

json_t *synth_tmpl_find(const char *model_type)
{
    json_error_t jerr;
    for (size_t k = 0; k < sizeof tmpls / sizeof tmpls[0]; k++)
        if (!strcmp(tmpls[k].model_type, model_type))
            return json_loads(tmpls[k].json, 0, &jerr);
    return NULL;
}

const char *synth_family_names(void)
{
    static char names[256];
    if (!names[0]) {
        const size_t nf = sizeof fams / sizeof fams[0], nt = sizeof tmpls / sizeof tmpls[0];
        for (size_t k = 0; k < nf + nt; k++) {
            const char *mt = k < nf ? fams[k].model_type : tmpls[k - nf].model_type;
            size_t n = strlen(names);
            snprintf(names + n, sizeof names - n, "%s%s", k == 0 ? "" :
                     k + 1 == nf + nt ? " or " : ", ", mt);
        }
    }
    return names;
}

void synth_shape_of_fam(const struct fam_shape *f, struct shape *s)
{
    const struct shape fs = {f->hidden, f->heads, f->kv_heads, f->head_dim, f->moe_ff,
                             f->n_expert, f->top_k, f->shexp_ff, 32000, 1, 0, 0, 0, 0, 1, 1, 0};
    *s = fs;
}

/* ---- byte sizes (container_write.h: the converter's rules) ------------------ */

struct measure {
    struct shoal_container_layout *l;
    enum shoal_dtype experts, dense;
    int group;
};

static int measure_slot(const struct shoal_weight_slot *s, void *user)
{
    const struct measure *m = user;
    if (s->kv_b_part)   /* synth writes kv_b_proj whole (synth_write.c) */
        return 0;
    const enum shoal_dtype t = shoal_container_slot_dtype(s, m->experts, m->dense);
    const int group = shoal_container_dtype_group(t, m->group);
    shoal_container_layout_slot(m->l, s, t, group, shoal_container_slot_bytes(s, t, group));
    return 0;
}

uint64_t synth_measure(const struct shoal_model_config *cfg, enum shoal_dtype experts,
                       enum shoal_dtype dense, int group, struct shoal_container_layout *l)
{
    struct measure m = {.l = l, .experts = experts, .dense = dense, .group = group};
    struct shoal_model model;
    memset(&model, 0, sizeof model);
    model.cfg = *cfg;
    shoal_model_alloc_layers(&model);
    shoal_container_layout_init(l, cfg);
    shoal_model_walk(&model, measure_slot, &m);
    for (int64_t il = 0; il < cfg->n_layer; il++)
        free(model.layers[il].experts);
    free(model.layers);
    return shoal_container_layout_bytes(l);
}
