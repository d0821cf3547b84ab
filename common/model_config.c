#include "model_config.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

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
    },
    {
        .model_type = "olmoe",
        .qk_norm = SHOAL_QK_NORM_FULL,
        .norm_topk_default = 0,
        .key_n_expert = "num_experts",
        .key_n_ff_exp = "intermediate_size",
        .moe_prefix = "mlp",
        .expert_gate = "gate_proj", .expert_up = "up_proj", .expert_down = "down_proj",
        .has_clip_qkv = 1,
        .rms_norm_eps_default = 1e-5,
        .rope_theta_default = 10000.0,
        .sliding = SHOAL_SLIDING_NEVER,
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
    return "mixtral, qwen2_moe, qwen3_moe, olmoe";
}

int shoal_layer_uses_window(const struct shoal_model_config *cfg, int64_t il)
{
    if (cfg->sliding_window <= 0)
        return 0;
    switch (cfg->family->sliding) {
    case SHOAL_SLIDING_IF_SET: return 1;
    case SHOAL_SLIDING_QWEN:
        return cfg->use_sliding_window && il >= cfg->max_window_layers;
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

static int parse_rope_scaling(json_t *root, const char *what,
                              struct shoal_model_config *cfg,
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
    rs->original_max_pos = (double)cfg->max_pos;
    json_t *o = json_object_get(root, "rope_scaling");
    if (!o || json_is_null(o))
        return 0;
    if (!json_is_object(o))
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "%s: field 'rope_scaling' must be an object or null, "
                             "found %s", what, json_kind(o));
    json_t *t = json_object_get(o, "rope_type");
    if (!t)
        t = json_object_get(o, "type"); /* older name */
    if (!json_is_string(t))
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "%s: rope_scaling needs a string 'rope_type'", what);
    const char *name = json_string_value(t);
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
                             "%s: rope_scaling type '%s' is not supported; "
                             "supported: default, linear, dynamic, yarn, llama3",
                             what, name);
    int rc = 0;
    if (rs->type != SHOAL_ROPE_DEFAULT) {
        json_t *f = json_object_get(o, "factor");
        if (!json_is_number(f))
            return shoal_err_set(err, SHOAL_EFORMAT,
                                 "%s: rope_scaling '%s' needs a numeric 'factor'",
                                 what, name);
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
    if (!rc && rs->type == SHOAL_ROPE_LLAMA3) {
        rs->low_freq_factor = -1;
        rs->high_freq_factor = -1;
        rc = get_num(o, what, "low_freq_factor", 0, 1e9, &rs->low_freq_factor, err);
        if (!rc)
            rc = get_num(o, what, "high_freq_factor", 0, 1e9, &rs->high_freq_factor, err);
        if (!rc && (rs->low_freq_factor <= 0 || rs->high_freq_factor <= 0 ||
                    rs->high_freq_factor == rs->low_freq_factor))
            rc = shoal_err_set(err, SHOAL_EFORMAT,
                               "%s: rope_scaling 'llama3' needs low_freq_factor and "
                               "high_freq_factor (positive and different)", what);
        if (!rc && !json_object_get(o, "original_max_position_embeddings"))
            rc = shoal_err_set(err, SHOAL_EFORMAT,
                               "%s: rope_scaling 'llama3' needs "
                               "'original_max_position_embeddings'", what);
    }
    return rc;
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
    INT("vocab_size", 1, 1, BIG, &cfg->n_vocab);
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
    cfg->head_dim = cfg->n_embd / cfg->n_head;
    if (fam->qk_norm != SHOAL_QK_NORM_FULL) /* olmoe derives it, never reads it */
        INT("head_dim", 0, 1, 1 << 16, &cfg->head_dim);
    if (cfg->head_dim < 2 || cfg->head_dim % 2) {
        /* without head_dim it is hidden_size / num_attention_heads, which
         * is 0 when there are more heads than hidden units */
        rc = shoal_err_set(err, SHOAL_EFORMAT, "%s: head_dim %lld (hidden_size %lld / "
                           "num_attention_heads %lld unless given) must be even and at "
                           "least 2", what, (long long)cfg->head_dim,
                           (long long)cfg->n_embd, (long long)cfg->n_head);
        goto done;
    }
    if (fam->qk_norm == SHOAL_QK_NORM_FULL && cfg->head_dim * cfg->n_head != cfg->n_embd) {
        rc = shoal_err_set(err, SHOAL_EFORMAT,
                           "%s: hidden_size %lld is not divisible by num_attention_heads %lld",
                           what, (long long)cfg->n_embd, (long long)cfg->n_head);
        goto done;
    }
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
    cfg->rope_freq_base = fam->rope_theta_default;
    if ((rc = get_num(root, what, "rope_theta", 1e-9, 1e18, &cfg->rope_freq_base, err)))
        goto done;
    cfg->partial_rotary_factor = 1.0;
    if ((rc = get_num(root, what, "partial_rotary_factor", 1e-6, 1.0,
                      &cfg->partial_rotary_factor, err)))
        goto done;
    cfg->rope_dim = (int64_t)((double)cfg->head_dim * cfg->partial_rotary_factor);
    cfg->rope_dim -= cfg->rope_dim % 2;
    if ((rc = parse_rope_scaling(root, what, cfg, err)))
        goto done;
    cfg->tie_embeddings = 0;
    if ((rc = get_bool(root, what, "tie_word_embeddings", &cfg->tie_embeddings, err)))
        goto done;
    cfg->norm_topk_prob = fam->norm_topk_default;
    if (!fam->norm_topk_forced &&
        (rc = get_bool(root, what, "norm_topk_prob", &cfg->norm_topk_prob, err)))
        goto done;
    if (fam->norm_topk_forced)
        cfg->norm_topk_prob = 1;
    if (!strcmp(fam->model_type, "qwen2_moe")) {
        cfg->qkv_bias = 1;
        if ((rc = get_bool(root, what, "qkv_bias", &cfg->qkv_bias, err)))
            goto done;
    } else if (strcmp(fam->model_type, "mixtral") != 0) {
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

    /* Which layers are sparse: qwen2/3 use decoder_sparse_step and
     * mlp_only_layers (modeling_qwen3_moe.Qwen3MoeDecoderLayer). */
    int64_t step = 1;
    if (fam->has_sparse_step)
        INT("decoder_sparse_step", 0, 0, SHOAL_MAX_LAYERS, &step);
    for (int64_t il = 0; il < cfg->n_layer; il++)
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
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu"))) {
        rc = shoal_err_set(err, SHOAL_EUNSUPPORTED,
                           "%s: hidden_act '%s' is not supported; expected 'silu'",
                           what, json_is_string(act) ? json_string_value(act) : "?");
        goto done;
    }
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
