#include "model_config.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "quant_config.h"
#include "util.h"

/* Family descriptors. Sources: transformers/models/<family>/
 * configuration_<family>.py and modeling_<family>.py. */
static const struct shoal_family families[] = {
    {
        .model_type = "mixtral",
        .qk_norm = SHOAL_QK_NORM_NONE,
        .norm_topk_forced = 1,          /* MixtralSparseMoeBlock always renormalises */
        .key_n_expert = "num_local_experts",
        .key_n_ff_exp = "intermediate_size",
        .moe_prefix = "block_sparse_moe",
        .expert_gate = "w1", .expert_up = "w3", .expert_down = "w2",
        .rms_norm_eps_default = 1e-5,
        .rope_theta_default = 1e6,
        .sliding = SHOAL_SLIDING_IF_SET,
    },
    {
        .model_type = "qwen2_moe",
        .qk_norm = SHOAL_QK_NORM_NONE,
        .qkv_bias_forced = 0,           /* config qkv_bias, default true */
        .norm_topk_default = 0,
        .key_n_expert = "num_experts",
        .key_n_ff_exp = "moe_intermediate_size",
        .moe_prefix = "mlp",
        .expert_gate = "gate_proj", .expert_up = "up_proj", .expert_down = "down_proj",
        .head_dim_rule = SHOAL_HEAD_DIM_EXACT,
        .has_shared_expert = 1,
        .has_sparse_step = 1,
        .rms_norm_eps_default = 1e-6,
        .rope_theta_default = 10000.0,
        .sliding = SHOAL_SLIDING_QWEN,
    },
    {
        .model_type = "qwen3_moe",
        .qk_norm = SHOAL_QK_NORM_HEAD,
        .norm_topk_default = 0,
        .key_n_expert = "num_experts",
        .key_n_ff_exp = "moe_intermediate_size",
        .moe_prefix = "mlp",
        .expert_gate = "gate_proj", .expert_up = "up_proj", .expert_down = "down_proj",
        .has_sparse_step = 1,
        .rms_norm_eps_default = 1e-6,
        .rope_theta_default = 10000.0,
        .sliding = SHOAL_SLIDING_QWEN,
        /* Qwen3 ships no MTP layer; the bundled model's head (models/) is
         * DeepSeek-V3's MTP module under the same config key and names */
        .has_nextn = 1,
    },
    {
        .model_type = "olmoe",
        .qk_norm = SHOAL_QK_NORM_FULL,
        .norm_topk_default = 0,
        .key_n_expert = "num_experts",
        .key_n_ff_exp = "intermediate_size",
        .moe_prefix = "mlp",
        .expert_gate = "gate_proj", .expert_up = "up_proj", .expert_down = "down_proj",
        .head_dim_rule = SHOAL_HEAD_DIM_DERIVED,
        .has_clip_qkv = 1,
        .rms_norm_eps_default = 1e-5,
        .rope_theta_default = 10000.0,
        .sliding = SHOAL_SLIDING_NEVER,
    },
    /* DeepSeek-V2 / V2-Lite / Coder-V2, DeepSeek-V3 / R1 / V3.1, and Kimi-K2
     * (DeepseekV3ForCausalLM): the original modeling_deepseek.py shipped
     * with the checkpoints (DeepseekV2/V3Attention, MoEGate) */
#define DEEPSEEK_FAMILY(type, norm_default)                                        \
    {                                                                               \
        .model_type = type, .norm_topk_default = norm_default,                      \
        .key_n_expert = "n_routed_experts", .key_n_ff_exp = "moe_intermediate_size",\
        .moe_prefix = "mlp", .expert_gate = "gate_proj", .expert_up = "up_proj",    \
        .expert_down = "down_proj", .rms_norm_eps_default = 1e-6,                   \
        .rope_theta_default = 10000.0, .mla = 1, .rope_interleave = 1,             \
        .deepseek_moe = 1, .has_nextn = 1,                                          \
    }
    DEEPSEEK_FAMILY("deepseek_v2", 0),
    DEEPSEEK_FAMILY("deepseek_v3", 1),
    DEEPSEEK_FAMILY("kimi_k2", 1),
#undef DEEPSEEK_FAMILY
    /* gpt-oss-20b / 120b: transformers' modeling_gpt_oss.py (GptOssAttention
     * with sinks, GptOssTopKRouter, GptOssExperts) */
    {
        .model_type = "gpt_oss",
        .key_n_expert = "num_local_experts",
        .key_n_ff_exp = "intermediate_size",
        .moe_prefix = "mlp",
        .expert_gate = "gate_up_proj", .expert_up = "gate_up_proj", .expert_down = "down_proj",
        .rms_norm_eps_default = 1e-5,
        .rope_theta_default = 150000.0,
        .sliding = SHOAL_SLIDING_LAYER_TYPES,
        .gpt_oss = 1,
    },
    /* GLM-4.5 / 4.5-Air / 4.6: transformers' modeling_glm4_moe.py (GQA with
     * q/k/v bias, partial rotary in the rotate_half layout, optional
     * per-head QK-norm, DeepSeek-V3's router) */
    {
        .model_type = "glm4_moe",
        .norm_topk_default = 1,
        .key_n_expert = "n_routed_experts",
        .key_n_ff_exp = "moe_intermediate_size",
        .moe_prefix = "mlp",
        .expert_gate = "gate_proj", .expert_up = "up_proj", .expert_down = "down_proj",
        .rms_norm_eps_default = 1e-5,
        .rope_theta_default = 10000.0,
        .deepseek_moe = 1, .sigmoid_router = 1, .has_use_qk_norm = 1, .has_nextn = 1,
    },
};

const struct shoal_family *shoal_family_find(const char *model_type)
{
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (!strcmp(families[i].model_type, model_type))
            return &families[i];
    return NULL;
}

const char *shoal_family_list(void)
{
    return "mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v2, deepseek_v3, kimi_k2, "
           "glm4_moe, gpt_oss";
}

int shoal_layer_uses_window(const struct shoal_model_config *cfg, int64_t il)
{
    if (cfg->sliding_window <= 0)
        return 0;
    switch (cfg->family->sliding) {
    case SHOAL_SLIDING_IF_SET: return 1;
    case SHOAL_SLIDING_QWEN:
        return cfg->use_sliding_window && il >= cfg->max_window_layers;
    case SHOAL_SLIDING_LAYER_TYPES: return cfg->layer_window[il];
    default: return 0;
    }
}

/* ---- typed field readers: each names the field and what it found ---- */

static const char *json_kind(json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* Integer field in [lo, hi]. required=0: missing or null keeps *out. */
static int get_int(json_t *o, const char *what, const char *key, int required,
                   int64_t lo, int64_t hi, int64_t *out, struct shoal_err *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required)
            return shoal_err_set(err, SHOAL_EFORMAT,
                                 "%s: required field '%s' is missing", what, key);
        return 0;
    }
    if (!json_is_integer(v))
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "%s: field '%s' must be an integer, found %s", what,
                             key, json_kind(v));
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return shoal_err_set(err, SHOAL_ERANGE,
                             "%s: field '%s' is %lld, expected a value in [%lld, %lld]",
                             what, key, (long long)x, (long long)lo, (long long)hi);
    *out = (int64_t)x;
    return 0;
}

static int get_num(json_t *o, const char *what, const char *key, double lo,
                   double hi, double *out, struct shoal_err *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_number(v))
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "%s: field '%s' must be a number, found %s", what, key,
                             json_kind(v));
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return shoal_err_set(err, SHOAL_ERANGE,
                             "%s: field '%s' is %g, expected a value in [%g, %g]",
                             what, key, x, lo, hi);
    *out = x;
    return 0;
}

static int get_bool(json_t *o, const char *what, const char *key, int *out,
                    struct shoal_err *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v))
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "%s: field '%s' must be true or false, found %s", what,
                             key, json_kind(v));
    *out = json_is_true(v);
    return 0;
}

/* Keys a RoPE object (rope_scaling, or transformers v5 rope_parameters) may
 * hold. Anything else could change the rotation in a way shoal does not
 * implement (mrope_section, short_factor, ...), so it is refused rather than
 * ignored. */
static const char *const rope_keys[] = {
    "rope_type", "type", "rope_theta", "partial_rotary_factor", "factor",
    "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
    "mscale", "mscale_all_dim", "truncate", "low_freq_factor", "high_freq_factor",
};

/* A number that may be given at the top level and inside the RoPE object
 * (v5 moved rope_theta and partial_rotary_factor inside): either place, and
 * both only when they agree, since transformers 4 reads the top level and 5
 * the object. */
static int get_num_twice(json_t *root, json_t *o, const char *okey, const char *what,
                         const char *key, double lo, double hi, double *out,
                         struct shoal_err *err)
{
    double top = NAN, in = NAN;
    int rc = get_num(root, what, key, lo, hi, &top, err);
    if (!rc && o)
        rc = get_num(o, what, key, lo, hi, &in, err);
    if (rc)
        return rc;
    if (!isnan(top) && !isnan(in) && top != in)
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "%s: '%s' is %.17g at the top level but %.17g in '%s'; "
                             "give one value", what, key, top, in, okey);
    if (!isnan(in))
        *out = in;
    else if (!isnan(top))
        *out = top;
    return 0;
}

/* RoPE: rope_theta, partial_rotary_factor and the scaling, from the
 * transformers 4 layout (top-level rope_theta + rope_scaling) or the v5 one
 * (one rope_parameters object holding all of it). Sets rope_freq_base,
 * partial_rotary_factor, rope_dim and rope_scaling. */
static int parse_rope(json_t *root, const char *what, struct shoal_model_config *cfg,
                      struct shoal_err *err)
{
    struct shoal_rope_scaling *rs = &cfg->rope_scaling;
    memset(rs, 0, sizeof *rs);
    rs->type = SHOAL_ROPE_DEFAULT;
    rs->factor = 1.0;
    rs->attention_factor = -1.0;
    rs->beta_fast = 32.0;
    rs->beta_slow = 1.0;
    rs->truncate = 1;
    rs->mscale = -1.0;
    rs->mscale_all_dim = -1.0;
    rs->original_max_pos = (double)cfg->max_pos;
    json_t *sc = json_object_get(root, "rope_scaling");
    json_t *rp = json_object_get(root, "rope_parameters");
    if (json_is_null(sc))
        sc = NULL;
    if (json_is_null(rp))
        rp = NULL;
    if (sc && rp && !json_equal(sc, rp))
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "%s: both 'rope_scaling' and 'rope_parameters' are given and "
                             "they differ; give one", what);
    json_t *o = rp ? rp : sc;
    const char *okey = rp ? "rope_parameters" : "rope_scaling";
    if (o && !json_is_object(o))
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "%s: field '%s' must be an object or null, found %s", what,
                             okey, json_kind(o));
    const char *k;
    json_t *v;
    if (o) {
        json_object_foreach(o, k, v)
        {
            if (json_is_object(v))
                return shoal_err_set(err, SHOAL_EUNSUPPORTED,
                                     "%s: '%s' per layer type ('%s') is not supported; "
                                     "expected one set of RoPE parameters", what, okey, k);
        }
    }
    cfg->rope_freq_base = cfg->family->rope_theta_default;
    int rc = get_num_twice(root, o, okey, what, "rope_theta", 1e-9, 1e18,
                           &cfg->rope_freq_base, err);
    cfg->partial_rotary_factor = 1.0;
    if (!rc)
        rc = get_num_twice(root, o, okey, what, "partial_rotary_factor", 1e-6, 1.0,
                           &cfg->partial_rotary_factor, err);
    if (rc)
        return rc;
    /* transformers: dim = int(head_dim * partial_rotary_factor) */
    cfg->rope_dim = (int64_t)((double)cfg->head_dim * cfg->partial_rotary_factor);
    cfg->rope_dim -= cfg->rope_dim % 2;
    if (cfg->rope_dim < 2)
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "%s: rotary dimension %lld (head_dim %lld x "
                             "partial_rotary_factor %g) must be >= 2", what,
                             (long long)cfg->rope_dim, (long long)cfg->head_dim,
                             cfg->partial_rotary_factor);
    if (!o)
        return 0;
    json_t *t = json_object_get(o, "rope_type");
    if (!t)
        t = json_object_get(o, "type"); /* older name */
    const char *name = json_is_string(t) ? json_string_value(t) : NULL;
    if (!name && !t && rp) {
        /* v5 defaults rope_type to "default"; only safe when nothing else
         * would be dropped with it */
        json_object_foreach(o, k, v)
        {
            if (strcmp(k, "rope_theta") && strcmp(k, "partial_rotary_factor"))
                return shoal_err_set(err, SHOAL_EFORMAT,
                                     "%s: rope_parameters has '%s' but no 'rope_type'",
                                     what, k);
        }
        name = "default";
    }
    if (!name)
        return shoal_err_set(err, SHOAL_EFORMAT, "%s: %s needs a string 'rope_type'",
                             what, okey);
    if (!strcmp(name, "default"))
        rs->type = SHOAL_ROPE_DEFAULT;
    else if (!strcmp(name, "linear"))
        rs->type = SHOAL_ROPE_LINEAR;
    else if (!strcmp(name, "dynamic"))
        rs->type = SHOAL_ROPE_DYNAMIC;
    else if (!strcmp(name, "yarn"))
        rs->type = SHOAL_ROPE_YARN;
    else if (!strcmp(name, "llama3"))
        rs->type = SHOAL_ROPE_LLAMA3;
    else
        return shoal_err_set(err, SHOAL_EUNSUPPORTED,
                             "%s: %s type '%s' is not supported; "
                             "supported: default, linear, dynamic, yarn, llama3",
                             what, okey, name);
    json_object_foreach(o, k, v)
    {
        size_t i = 0, n = sizeof rope_keys / sizeof rope_keys[0];
        while (i < n && strcmp(rope_keys[i], k))
            i++;
        if (i == n)
            return shoal_err_set(err, SHOAL_EUNSUPPORTED,
                                 "%s: %s key '%s' is not supported (it may change the "
                                 "rotation); refusing rather than ignoring it", what, okey, k);
    }
    if (rs->type != SHOAL_ROPE_DEFAULT) {
        json_t *f = json_object_get(o, "factor");
        if (!json_is_number(f))
            return shoal_err_set(err, SHOAL_EFORMAT,
                                 "%s: %s '%s' needs a numeric 'factor'", what, okey, name);
        rc = get_num(o, what, "factor", 1e-6, 1e9, &rs->factor, err);
    }
    if (!rc)
        rc = get_num(o, what, "original_max_position_embeddings", 1, 1e12,
                     &rs->original_max_pos, err);
    if (!rc)
        rc = get_num(o, what, "attention_factor", 0, 1e9, &rs->attention_factor, err);
    if (!rc)
        rc = get_num(o, what, "beta_fast", -1e9, 1e9, &rs->beta_fast, err);
    if (!rc)
        rc = get_num(o, what, "beta_slow", -1e9, 1e9, &rs->beta_slow, err);
    if (!rc)
        rc = get_num(o, what, "mscale", 0, 1e9, &rs->mscale, err);
    if (!rc)
        rc = get_num(o, what, "mscale_all_dim", 0, 1e9, &rs->mscale_all_dim, err);
    if (!rc)
        rc = get_bool(o, what, "truncate", &rs->truncate, err);
    if (!rc && rs->type == SHOAL_ROPE_DYNAMIC && cfg->rope_dim <= 2)
        rc = shoal_err_set(err, SHOAL_EFORMAT,
                           "%s: %s 'dynamic' needs a rotary dimension > 2, found %lld "
                           "(its base grows by the power dim/(dim-2))", what, okey,
                           (long long)cfg->rope_dim);
    if (!rc && rs->type == SHOAL_ROPE_YARN && !(cfg->rope_freq_base > 1.0))
        rc = shoal_err_set(err, SHOAL_EFORMAT,
                           "%s: %s 'yarn' needs rope_theta > 1, found %g (its correction "
                           "range divides by log(rope_theta))", what, okey,
                           cfg->rope_freq_base);
    if (!rc && rs->type == SHOAL_ROPE_LLAMA3) {
        rs->low_freq_factor = -1;
        rs->high_freq_factor = -1;
        rc = get_num(o, what, "low_freq_factor", 0, 1e9, &rs->low_freq_factor, err);
        if (!rc)
            rc = get_num(o, what, "high_freq_factor", 0, 1e9, &rs->high_freq_factor, err);
        if (!rc && (rs->low_freq_factor <= 0 || rs->high_freq_factor <= 0 ||
                    rs->high_freq_factor == rs->low_freq_factor))
            rc = shoal_err_set(err, SHOAL_EFORMAT,
                               "%s: %s 'llama3' needs low_freq_factor and "
                               "high_freq_factor (positive and different)", what, okey);
        if (!rc && !json_object_get(o, "original_max_position_embeddings"))
            rc = shoal_err_set(err, SHOAL_EFORMAT,
                               "%s: %s 'llama3' needs "
                               "'original_max_position_embeddings'", what, okey);
    }
    return rc;
}

/* transformers (later 4.x, 5) may save the per-layer attention kind as
 * layer_types. shoal derives it from sliding_window / use_sliding_window /
 * max_window_layers; a list that says otherwise is refused rather than
 * ignored. */
static int check_layer_types(json_t *root, const char *what,
                             struct shoal_model_config *cfg, struct shoal_err *err)
{
    json_t *lt = json_object_get(root, "layer_types");
    const int read_kinds = cfg->family->sliding == SHOAL_SLIDING_LAYER_TYPES;
    if (read_kinds)   /* GptOssConfig's default: sliding, full, sliding, ... */
        for (int64_t il = 0; il < cfg->n_layer; il++)
            cfg->layer_window[il] = il % 2 == 0;
    if (!lt || json_is_null(lt))
        return 0;
    if (!json_is_array(lt) || (int64_t)json_array_size(lt) != cfg->n_layer)
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "%s: field 'layer_types' must be a list of %lld strings "
                             "(num_hidden_layers), found %s", what, (long long)cfg->n_layer,
                             json_is_array(lt) ? "a list of another length" : json_kind(lt));
    for (int64_t il = 0; il < cfg->n_layer; il++) {
        json_t *x = json_array_get(lt, (size_t)il);
        const char *kind = json_is_string(x) ? json_string_value(x) : "";
        int window = !strcmp(kind, "sliding_attention");
        if (!window && strcmp(kind, "full_attention"))
            return shoal_err_set(err, SHOAL_EUNSUPPORTED,
                                 "%s: layer_types[%lld] '%s' is not supported; expected "
                                 "'full_attention' or 'sliding_attention'", what,
                                 (long long)il, kind);
        if (read_kinds) {
            cfg->layer_window[il] = (uint8_t)window;
            continue;
        }
        if (window != shoal_layer_uses_window(cfg, il))
            return shoal_err_set(err, SHOAL_EUNSUPPORTED,
                                 "%s: layer_types[%lld] is '%s' but sliding_window / "
                                 "use_sliding_window / max_window_layers give %s attention "
                                 "for %s", what, (long long)il, kind,
                                 window ? "full" : "sliding", cfg->family->model_type);
    }
    return 0;
}

/* The whole model's weight count, in double (each product here is below
 * 2^53 given the per-field bounds, so it is exact), against a bound that
 * keeps every byte size and offset derived from the config inside int64 and
 * size_t: 2^46 parameters (70 T; the largest open models have ~1 T). */
static int check_total_size(const struct shoal_model_config *c, const char *what,
                            struct shoal_err *err)
{
    const double e = (double)c->n_embd, hd = (double)c->head_dim, H = (double)c->n_head;
    double attn = 2.0 * e * hd * (double)(c->n_head + c->n_head_kv);
    if (c->family->mla) {
        const double ql = (double)c->q_lora_rank, kvl = (double)c->kv_lora_rank;
        attn = (ql > 0 ? e * ql + ql * H * hd : e * H * hd) +
               e * (kvl + (double)c->qk_rope_head_dim) +
               kvl * H * (double)(c->qk_nope_head_dim + c->v_head_dim) +
               H * (double)c->v_head_dim * e;
    }
    double total = 2.0 * (double)c->n_vocab * e;
    for (int64_t il = 0; il < c->n_layer; il++) {
        total += attn;
        if (c->layer_is_moe[il])
            total += (double)c->n_expert * (3.0 * e * (double)c->n_ff_exp + e) +
                     3.0 * e * (double)c->n_ff_shexp;
        else
            total += 3.0 * e * (double)c->n_ff;
    }
    const double max_params = 70368744177664.0; /* 2^46 */
    if (total > max_params)
        return shoal_err_set(err, SHOAL_ERANGE,
                             "%s: the sizes describe %.3g weights (hidden_size %lld, "
                             "num_hidden_layers %lld, vocab_size %lld, %lld experts of "
                             "width %lld), more than the supported %.3g", what, total,
                             (long long)c->n_embd, (long long)c->n_layer,
                             (long long)c->n_vocab, (long long)c->n_expert,
                             (long long)c->n_ff_exp, max_params);
    return 0;
}

/* head_dim per family rule (shoal_family.head_dim_rule), then the checks
 * every rule shares: the RoPE pairs need an even head_dim >= 2, and the
 * q / kv projection widths stay small enough that no tensor size can
 * overflow. */
static int parse_head_dim(json_t *root, const char *what, struct shoal_model_config *cfg,
                          struct shoal_err *err)
{
    const struct shoal_family *fam = cfg->family;
    const long long hidden = cfg->n_embd, heads = cfg->n_head;
    const int64_t derived = cfg->n_embd / cfg->n_head;
    int from_key = 0;
    cfg->head_dim = derived;
    if (fam->head_dim_rule != SHOAL_HEAD_DIM_DERIVED) { /* olmoe never reads it */
        int rc = get_int(root, what, "head_dim", 0, 1, 1 << 16, &cfg->head_dim, err);
        if (rc)
            return rc;
        json_t *v = json_object_get(root, "head_dim");
        from_key = v && !json_is_null(v);
    }
    if (cfg->head_dim < 2 || cfg->head_dim % 2) {
        if (from_key)
            return shoal_err_set(err, SHOAL_EFORMAT,
                                 "%s: head_dim %lld must be even and >= 2 (RoPE rotates "
                                 "pairs)", what, (long long)cfg->head_dim);
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "%s: head_dim %lld (from hidden_size %lld / "
                             "num_attention_heads %lld) must be even and >= 2", what,
                             (long long)cfg->head_dim, hidden, heads);
    }
    if (fam->head_dim_rule != SHOAL_HEAD_DIM_KEY && cfg->head_dim * heads != hidden) {
        if (from_key)
            return shoal_err_set(err, SHOAL_EFORMAT,
                                 "%s: head_dim %lld x num_attention_heads %lld must equal "
                                 "hidden_size %lld for %s", what, (long long)cfg->head_dim,
                                 heads, hidden, fam->model_type);
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "%s: hidden_size %lld is not divisible by num_attention_heads "
                             "%lld (%s derives head_dim from them)", what, hidden, heads,
                             fam->model_type);
    }
    const int64_t max_width = (int64_t)1 << 20;
    if (heads * cfg->head_dim > max_width)
        return shoal_err_set(err, SHOAL_ERANGE,
                             "%s: num_attention_heads %lld x head_dim %lld = %lld exceeds "
                             "the supported q width %lld", what, heads,
                             (long long)cfg->head_dim, heads * (long long)cfg->head_dim,
                             (long long)max_width);
    return 0;
}

/* A string field among `names` (n of them); absent or null keeps *out.
 * Sets *out to the index of the match. */
static int get_choice(json_t *o, const char *what, const char *key, const char *const *names,
                      int n, int *out, struct shoal_err *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return 0;
    const char *s = json_is_string(v) ? json_string_value(v) : NULL;
    for (int i = 0; s && i < n; i++)
        if (!strcmp(s, names[i])) {
            *out = i;
            return 0;
        }
    char list[256] = "";
    for (int i = 0; i < n; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s'%s'", i ? ", " : "",
                 names[i]);
    if (!s)
        return shoal_err_set(err, SHOAL_EFORMAT, "%s: field '%s' must be a string (%s), "
                             "found %s", what, key, list, json_kind(v));
    return shoal_err_set(err, SHOAL_EUNSUPPORTED, "%s: %s '%s' is not supported for %s; "
                         "expected %s", what, key, s, "this model_type", list);
}

/* MLA shapes (DeepSeek-V2 paper §2.1; modeling_deepseek.py
 * DeepseekV2Attention): the q head is qk_nope + qk_rope wide, the value
 * head v_head_dim, and the KV cache holds kv_lora_rank + qk_rope_head_dim
 * per token. Sets head_dim = qk_nope + qk_rope. */
static int parse_mla(json_t *root, const char *what, struct shoal_model_config *cfg,
                     struct shoal_err *err)
{
    const int64_t D = 1 << 16;
    int rc;
    cfg->q_lora_rank = 0;
    if ((rc = get_int(root, what, "q_lora_rank", 0, 1, 1 << 20, &cfg->q_lora_rank, err)) ||
        (rc = get_int(root, what, "kv_lora_rank", 1, 1, 1 << 20, &cfg->kv_lora_rank, err)) ||
        (rc = get_int(root, what, "qk_nope_head_dim", 1, 0, D, &cfg->qk_nope_head_dim, err)) ||
        (rc = get_int(root, what, "qk_rope_head_dim", 1, 2, D, &cfg->qk_rope_head_dim, err)) ||
        (rc = get_int(root, what, "v_head_dim", 1, 1, D, &cfg->v_head_dim, err)))
        return rc;
    if (cfg->qk_rope_head_dim % 2)
        return shoal_err_set(err, SHOAL_EFORMAT, "%s: qk_rope_head_dim %lld must be even "
                             "(RoPE rotates pairs)", what, (long long)cfg->qk_rope_head_dim);
    cfg->head_dim = cfg->qk_nope_head_dim + cfg->qk_rope_head_dim;
    const int64_t max_width = (int64_t)1 << 20;
    const int64_t wide = cfg->head_dim > cfg->v_head_dim ? cfg->head_dim : cfg->v_head_dim;
    if (cfg->n_head * wide > max_width ||
        cfg->n_head * (cfg->kv_lora_rank + cfg->qk_rope_head_dim) > 8 * max_width)
        return shoal_err_set(err, SHOAL_ERANGE, "%s: num_attention_heads %lld x head width "
                             "%lld (kv_lora_rank %lld) exceeds the supported widths", what,
                             (long long)cfg->n_head, (long long)wide,
                             (long long)cfg->kv_lora_rank);
    int bias = 0;
    if ((rc = get_bool(root, what, "attention_bias", &bias, err)))
        return rc;
    if (bias)
        return shoal_err_set(err, SHOAL_EUNSUPPORTED, "%s: attention_bias true is not "
                             "supported for %s (no released checkpoint has it); expected "
                             "false", what, cfg->family->model_type);
    return 0;
}

/* DeepSeek-style MoE (modeling_deepseek.py DeepseekV2/V3MoE and MoEGate;
 * transformers' Glm4MoeTopkRouter): which layers are sparse, the shared
 * experts, and the router's scoring, top-k method, groups and scaling. */
static int parse_deepseek_moe(json_t *root, const char *what, struct shoal_model_config *cfg,
                              struct shoal_err *err)
{
    const struct shoal_family *fam = cfg->family;
    const int v2 = !strcmp(fam->model_type, "deepseek_v2");
    int64_t n_shared = 0, first_dense = 0, freq = 1;
    int rc;
    if ((rc = get_int(root, what, "n_shared_experts", 0, 0, 1 << 10, &n_shared, err)) ||
        (rc = get_int(root, what, "first_k_dense_replace", 0, 0, SHOAL_MAX_LAYERS,
                      &first_dense, err)) ||
        (rc = get_int(root, what, "intermediate_size", 0, 1, 1 << 22, &cfg->n_ff, err)))
        return rc;
    if (!fam->sigmoid_router &&
        (rc = get_int(root, what, "moe_layer_freq", 0, 1, SHOAL_MAX_LAYERS, &freq, err)))
        return rc;
    if (n_shared * cfg->n_ff_exp > ((int64_t)1 << 22))
        return shoal_err_set(err, SHOAL_ERANGE, "%s: n_shared_experts %lld x "
                             "moe_intermediate_size %lld exceeds the supported width", what,
                             (long long)n_shared, (long long)cfg->n_ff_exp);
    cfg->n_ff_shexp = n_shared * cfg->n_ff_exp;
    for (int64_t il = 0; il < cfg->n_layer + cfg->n_nextn; il++) {
        cfg->layer_is_moe[il] = il >= first_dense && il % freq == 0;
        if (!cfg->layer_is_moe[il] && cfg->n_ff <= 0)
            return shoal_err_set(err, SHOAL_EFORMAT, "%s: layer %lld is dense "
                                 "(first_k_dense_replace %lld, moe_layer_freq %lld) but "
                                 "'intermediate_size' is missing", what, (long long)il,
                                 (long long)first_dense, (long long)freq);
    }
    /* scoring and top-k method: V2 softmax with greedy or group_limited_greedy;
     * V3 / Kimi-K2 sigmoid with noaux_tc (the only pair its MoEGate
     * implements); glm4_moe always the latter, without config keys */
    static const char *const scores[] = {"softmax", "sigmoid"};
    static const char *const methods[] = {"greedy", "group_limited_greedy", "noaux_tc"};
    int score = v2 ? SHOAL_ROUTER_SOFTMAX : SHOAL_ROUTER_SIGMOID;
    int method = v2 ? SHOAL_TOPK_GREEDY : SHOAL_TOPK_NOAUX_TC;
    if (!fam->sigmoid_router) {
        if ((rc = get_choice(root, what, "scoring_func", scores + (v2 ? 0 : 1), 1, &score,
                             err)) ||
            (rc = get_choice(root, what, "topk_method", methods + (v2 ? 0 : 2), v2 ? 2 : 1,
                             &method, err)))
            return rc;
        if (!v2) {
            score = SHOAL_ROUTER_SIGMOID;
            method = SHOAL_TOPK_NOAUX_TC;
        }
    }
    cfg->router_score = (enum shoal_router_score)score;
    cfg->router_topk = (enum shoal_router_topk)method;
    cfg->router_bias = method == SHOAL_TOPK_NOAUX_TC;
    cfg->routed_scaling_factor = 1.0;
    cfg->n_group = 1;
    cfg->topk_group = 1;
    if ((rc = get_num(root, what, "routed_scaling_factor", 1e-6, 1e6,
                      &cfg->routed_scaling_factor, err)) ||
        (rc = get_int(root, what, "n_group", 0, 1, cfg->n_expert, &cfg->n_group, err)) ||
        (rc = get_int(root, what, "topk_group", 0, 1, 1 << 16, &cfg->topk_group, err)))
        return rc;
    if (cfg->topk_group > cfg->n_group)
        return shoal_err_set(err, SHOAL_EFORMAT, "%s: topk_group %lld is larger than "
                             "n_group %lld; expected at most n_group groups kept", what,
                             (long long)cfg->topk_group, (long long)cfg->n_group);
    if (cfg->n_expert % cfg->n_group)
        return shoal_err_set(err, SHOAL_EFORMAT, "%s: n_routed_experts %lld is not a "
                             "multiple of n_group %lld", what, (long long)cfg->n_expert,
                             (long long)cfg->n_group);
    /* MoEGate normalises only when top_k > 1, and DeepSeek-V2's scales only
     * the weights it does not normalise */
    if (cfg->n_expert_used == 1)
        cfg->norm_topk_prob = 0;
    if (v2 && cfg->norm_topk_prob)
        cfg->routed_scaling_factor = 1.0;
    const int64_t per_group = cfg->n_expert / cfg->n_group;
    if (method == SHOAL_TOPK_NOAUX_TC && cfg->n_group > 1 && per_group < 2)
        return shoal_err_set(err, SHOAL_EFORMAT, "%s: noaux_tc ranks a group by its two "
                             "best experts, but n_routed_experts %lld / n_group %lld leaves "
                             "%lld per group", what, (long long)cfg->n_expert,
                             (long long)cfg->n_group, (long long)per_group);
    if (method != SHOAL_TOPK_GREEDY && cfg->topk_group * per_group < cfg->n_expert_used)
        return shoal_err_set(err, SHOAL_EFORMAT, "%s: topk_group %lld groups of %lld "
                             "experts hold fewer than num_experts_per_tok %lld", what,
                             (long long)cfg->topk_group, (long long)per_group,
                             (long long)cfg->n_expert_used);
    return 0;
}

/* The softmax scale of MLA beyond 1/sqrt(q head dim): with YaRN,
 * yarn_get_mscale(factor, mscale_all_dim)^2 (DeepseekV2Attention.__init__
 * in the original modeling_deepseek.py; some transformers releases drop it
 * for V2, the original model applies it). */
static double mla_attn_scale(const struct shoal_model_config *cfg)
{
    const struct shoal_rope_scaling *rs = &cfg->rope_scaling;
    if (rs->type == SHOAL_ROPE_DEFAULT || !(rs->mscale_all_dim > 0) || rs->factor <= 1.0)
        return 1.0;
    const double m = 0.1 * rs->mscale_all_dim * log(rs->factor) + 1.0;
    return m * m;
}

int64_t shoal_kv_elems_per_token(const struct shoal_model_config *cfg)
{
    if (cfg->family && cfg->family->mla)
        return cfg->kv_lora_rank + cfg->qk_rope_head_dim;
    return 2 * cfg->n_head_kv * cfg->head_dim;
}

int shoal_model_config_parse(const char *json, size_t len, const char *what,
                             struct shoal_model_config *cfg,
                             struct shoal_err *err)
{
    memset(cfg, 0, sizeof *cfg);
    json_error_t jerr;
    json_t *root = json_loadb(json, len, 0, &jerr);
    if (!root)
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "%s: malformed JSON at line %d column %d: %s", what,
                             jerr.line, jerr.column, jerr.text);
    int rc = 0;
    if (!json_is_object(root)) {
        rc = shoal_err_set(err, SHOAL_EFORMAT, "%s: top level is not a JSON object",
                           what);
        goto done;
    }
    json_t *mt = json_object_get(root, "model_type");
    if (!json_is_string(mt)) {
        rc = shoal_err_set(err, SHOAL_EFORMAT,
                           "%s: field 'model_type' is missing or not a string; "
                           "supported: %s", what, shoal_family_list());
        goto done;
    }
    const struct shoal_family *fam = shoal_family_find(json_string_value(mt));
    if (!fam) {
        rc = shoal_err_set(err, SHOAL_EUNSUPPORTED,
                           "%s: model_type '%s' is not supported; supported: %s",
                           what, json_string_value(mt), shoal_family_list());
        goto done;
    }
    cfg->family = fam;
    const int64_t BIG = (int64_t)1 << 31;
#define INT(key, req, lo, hi, dst) \
    if ((rc = get_int(root, what, key, req, lo, hi, dst, err))) goto done
    INT("vocab_size", 1, 1, INT32_MAX, &cfg->n_vocab); /* token ids are int32 */
    INT("hidden_size", 1, 1, 1 << 20, &cfg->n_embd);
    INT("num_hidden_layers", 1, 1, SHOAL_MAX_LAYERS, &cfg->n_layer);
    INT("num_attention_heads", 1, 1, 1 << 16, &cfg->n_head);
    cfg->n_head_kv = cfg->n_head;
    INT("num_key_value_heads", 0, 1, 1 << 16, &cfg->n_head_kv);
    if (cfg->n_head % cfg->n_head_kv != 0) {
        rc = shoal_err_set(err, SHOAL_EFORMAT,
                           "%s: num_attention_heads %lld is not a multiple of "
                           "num_key_value_heads %lld", what, (long long)cfg->n_head,
                           (long long)cfg->n_head_kv);
        goto done;
    }
    if ((rc = fam->mla ? parse_mla(root, what, cfg, err) : parse_head_dim(root, what, cfg, err)))
        goto done;
    INT(fam->key_n_expert, 1, 1, 1 << 16, &cfg->n_expert);
    INT("num_experts_per_tok", 1, 1, cfg->n_expert, &cfg->n_expert_used);
    INT(fam->key_n_ff_exp, 1, 1, 1 << 22, &cfg->n_ff_exp);
    cfg->n_ff = 0;
    if (fam->has_sparse_step)
        INT("intermediate_size", 0, 1, 1 << 22, &cfg->n_ff);
    if (fam->has_shared_expert)
        INT("shared_expert_intermediate_size", 1, 1, 1 << 22, &cfg->n_ff_shexp);
    cfg->max_pos = 4096;
    INT("max_position_embeddings", 0, 1, BIG, &cfg->max_pos);
    cfg->rms_norm_eps = fam->rms_norm_eps_default;
    if ((rc = get_num(root, what, "rms_norm_eps", 0, 1, &cfg->rms_norm_eps, err)))
        goto done;
    if ((rc = parse_rope(root, what, cfg, err)))
        goto done;
    cfg->attn_scale = 1.0;
    if (fam->mla) {
        if (cfg->partial_rotary_factor != 1.0) {
            rc = shoal_err_set(err, SHOAL_EUNSUPPORTED, "%s: partial_rotary_factor %g is "
                               "not supported for %s (qk_rope_head_dim gives the rotary "
                               "width); expected none", what, cfg->partial_rotary_factor,
                               fam->model_type);
            goto done;
        }
        cfg->rope_dim = cfg->qk_rope_head_dim;
        cfg->attn_scale = mla_attn_scale(cfg);
    }
    cfg->tie_embeddings = 0;
    if ((rc = get_bool(root, what, "tie_word_embeddings", &cfg->tie_embeddings, err)))
        goto done;
    cfg->norm_topk_prob = fam->norm_topk_default;
    cfg->routed_scaling_factor = 1.0;
    cfg->n_group = cfg->topk_group = 1;
    if (!fam->norm_topk_forced &&
        (rc = get_bool(root, what, "norm_topk_prob", &cfg->norm_topk_prob, err)))
        goto done;
    if (fam->norm_topk_forced)
        cfg->norm_topk_prob = 1;
    if (!strcmp(fam->model_type, "qwen2_moe")) {
        cfg->qkv_bias = 1;
        if ((rc = get_bool(root, what, "qkv_bias", &cfg->qkv_bias, err)))
            goto done;
    } else if (fam->gpt_oss) {   /* q, k, v and o */
        cfg->qkv_bias = 1;
        if ((rc = get_bool(root, what, "attention_bias", &cfg->qkv_bias, err)))
            goto done;
        cfg->o_bias = cfg->qkv_bias;
        cfg->attn_sinks = 1;
        cfg->swiglu_limit = 7.0;
        if ((rc = get_num(root, what, "swiglu_limit", 1e-6, 1e9, &cfg->swiglu_limit, err)))
            goto done;
        cfg->router_score = SHOAL_ROUTER_TOPK_SOFTMAX;
        cfg->router_bias = 1;     /* mlp.router.bias, added to the logits */
        cfg->norm_topk_prob = 0;
    } else if (strcmp(fam->model_type, "mixtral") != 0 && !fam->mla) {
        if ((rc = get_bool(root, what, "attention_bias", &cfg->qkv_bias, err)))
            goto done;
    }
    if (fam->has_clip_qkv &&
        (rc = get_num(root, what, "clip_qkv", 1e-9, 1e30, &cfg->clip_qkv, err)))
        goto done;
    INT("sliding_window", 0, 0, BIG, &cfg->sliding_window);
    INT("max_window_layers", 0, 0, SHOAL_MAX_LAYERS, &cfg->max_window_layers);
    if ((rc = get_bool(root, what, "use_sliding_window", &cfg->use_sliding_window, err)))
        goto done;

    cfg->qk_norm = fam->qk_norm;
    if (fam->has_use_qk_norm) {
        int on = 0;
        if ((rc = get_bool(root, what, "use_qk_norm", &on, err)))
            goto done;
        if (on)
            cfg->qk_norm = SHOAL_QK_NORM_HEAD;
    }
    cfg->shexp_gated = fam->has_shared_expert;
    if (fam->has_nextn)
        INT("num_nextn_predict_layers", 0, 0, SHOAL_MAX_NEXTN, &cfg->n_nextn);
    if (fam->deepseek_moe && (rc = parse_deepseek_moe(root, what, cfg, err)))
        goto done;

    /* Which layers are sparse: qwen2/3 use decoder_sparse_step and
     * mlp_only_layers (modeling_qwen3_moe.Qwen3MoeDecoderLayer). */
    int64_t step = 1;
    if (fam->has_sparse_step)
        INT("decoder_sparse_step", 0, 0, SHOAL_MAX_LAYERS, &step);
    for (int64_t il = 0; il < cfg->n_layer + cfg->n_nextn && !fam->deepseek_moe; il++)
        cfg->layer_is_moe[il] = step > 0 && (il + 1) % step == 0;
    if (fam->has_sparse_step) {
        json_t *mol = json_object_get(root, "mlp_only_layers");
        if (mol && !json_is_null(mol)) {
            if (!json_is_array(mol)) {
                rc = shoal_err_set(err, SHOAL_EFORMAT,
                                   "%s: field 'mlp_only_layers' must be an array, "
                                   "found %s", what, json_kind(mol));
                goto done;
            }
            for (size_t i = 0; i < json_array_size(mol); i++) {
                json_t *x = json_array_get(mol, i);
                if (!json_is_integer(x) || json_integer_value(x) < 0 ||
                    json_integer_value(x) >= cfg->n_layer) {
                    rc = shoal_err_set(err, SHOAL_EFORMAT,
                                       "%s: mlp_only_layers[%zu] must be a layer "
                                       "index in [0, %lld)", what, i,
                                       (long long)cfg->n_layer);
                    goto done;
                }
                cfg->layer_is_moe[json_integer_value(x)] = 0;
            }
        }
        for (int64_t il = 0; il < cfg->n_layer; il++) {
            if (!cfg->layer_is_moe[il] && cfg->n_ff <= 0) {
                rc = shoal_err_set(err, SHOAL_EFORMAT,
                                   "%s: layer %lld is dense but 'intermediate_size' "
                                   "is missing", what, (long long)il);
                goto done;
            }
        }
    }

    if ((rc = check_layer_types(root, what, cfg, err)) ||
        (rc = check_total_size(cfg, what, err)))
        goto done;

    cfg->bos_id = -1;
    cfg->eos_id = -1;
    INT("bos_token_id", 0, 0, BIG, &cfg->bos_id);
    json_t *eos = json_object_get(root, "eos_token_id");
    if (json_is_integer(eos)) {
        INT("eos_token_id", 0, 0, BIG, &cfg->eos_id);
        cfg->eos_ids[cfg->n_eos++] = cfg->eos_id;
    } else if (json_is_array(eos)) {
        for (size_t i = 0; i < json_array_size(eos) && cfg->n_eos < 8; i++) {
            json_t *x = json_array_get(eos, i);
            if (!json_is_integer(x) || json_integer_value(x) < 0) {
                rc = shoal_err_set(err, SHOAL_EFORMAT,
                                   "%s: eos_token_id[%zu] must be a token id", what, i);
                goto done;
            }
            cfg->eos_ids[cfg->n_eos++] = json_integer_value(x);
        }
        if (cfg->n_eos)
            cfg->eos_id = cfg->eos_ids[0];
    } else if (eos && !json_is_null(eos)) {
        rc = shoal_err_set(err, SHOAL_EFORMAT,
                           "%s: field 'eos_token_id' must be an integer or a list, "
                           "found %s", what, json_kind(eos));
        goto done;
    }
    json_t *act = json_object_get(root, "hidden_act");
    if (act && !json_is_null(act) &&
        (!json_is_string(act) || strcmp(json_string_value(act), "silu"))) {
        rc = shoal_err_set(err, SHOAL_EUNSUPPORTED,
                           "%s: hidden_act '%s' is not supported; expected 'silu'",
                           what, json_is_string(act) ? json_string_value(act) : "?");
        goto done;
    }
    rc = shoal_quant_config_parse(root, what, cfg, err);
#undef INT
done:
    json_decref(root);
    return rc;
}

int shoal_model_config_load(const char *path, struct shoal_model_config *cfg,
                            struct shoal_err *err)
{
    char *buf = NULL;
    size_t len = 0;
    int rc = shoal_read_file(path, 16u << 20, &buf, &len, err);
    if (rc)
        return rc;
    rc = shoal_model_config_parse(buf, len, path, cfg, err);
    free(buf);
    return rc;
}
