#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model_config.h"

static int parse(const char *json, struct shoal_model_config *c, struct shoal_err *e)
{
    return shoal_model_config_parse(json, strlen(json), "config.json", c, e);
}

#define BASE_QWEN3 \
    "\"model_type\":\"qwen3_moe\",\"vocab_size\":100,\"hidden_size\":64," \
    "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"num_key_value_heads\":2," \
    "\"head_dim\":32,\"num_experts\":8,\"num_experts_per_tok\":2," \
    "\"moe_intermediate_size\":16,\"intermediate_size\":48"

Test(model_config, unknown_model_type_names_itself_and_lists_supported)
{
    struct shoal_model_config c;
    struct shoal_err e = {0};
    int rc = parse("{\"model_type\":\"llama\"}", &c, &e);
    cr_assert(eq(int, rc, SHOAL_EUNSUPPORTED));
    cr_assert_not_null(strstr(e.msg, "'llama'"), "%s", e.msg);
    cr_assert_not_null(strstr(e.msg, "mixtral, qwen2_moe, qwen3_moe, olmoe"), "%s", e.msg);
}

Test(model_config, wrong_field_type_names_field_and_found_type)
{
    struct shoal_model_config c;
    struct shoal_err e = {0};
    int rc = parse("{\"model_type\":\"mixtral\",\"vocab_size\":\"32000\"}", &c, &e);
    cr_assert(eq(int, rc, SHOAL_EFORMAT));
    cr_assert_not_null(strstr(e.msg, "'vocab_size' must be an integer, found a string"),
                       "%s", e.msg);
}

Test(model_config, malformed_json_gives_position)
{
    struct shoal_model_config c;
    struct shoal_err e = {0};
    cr_assert(eq(int, parse("{\"model_type\": ", &c, &e), SHOAL_EFORMAT));
    cr_assert_not_null(strstr(e.msg, "malformed JSON at line 1"), "%s", e.msg);
}

Test(model_config, qwen3_sparse_step_and_mlp_only_layers)
{
    struct shoal_model_config c;
    struct shoal_err e = {0};
    int rc = parse("{" BASE_QWEN3 ",\"decoder_sparse_step\":2,\"mlp_only_layers\":[3]}", &c, &e);
    cr_assert(eq(int, rc, 0), "%s", e.msg);
    cr_assert(eq(int, shoal_layer_is_moe(&c, 0), 0));
    cr_assert(eq(int, shoal_layer_is_moe(&c, 1), 1));
    cr_assert(eq(int, shoal_layer_is_moe(&c, 2), 0));
    cr_assert(eq(int, shoal_layer_is_moe(&c, 3), 0));
    cr_assert(eq(i64, c.head_dim, 32));
    cr_assert(eq(int, c.family->qk_norm, SHOAL_QK_NORM_HEAD));
    cr_assert(eq(dbl, c.rms_norm_eps, 1e-6));
}

Test(model_config, top_k_larger_than_n_expert_is_refused)
{
    struct shoal_model_config c;
    struct shoal_err e = {0};
    int rc = parse("{\"model_type\":\"olmoe\",\"vocab_size\":10,\"hidden_size\":8,"
                   "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"num_experts\":4,"
                   "\"num_experts_per_tok\":5,\"intermediate_size\":4}", &c, &e);
    cr_assert(eq(int, rc, SHOAL_ERANGE));
    cr_assert_not_null(strstr(e.msg, "'num_experts_per_tok' is 5"), "%s", e.msg);
}

/* Found by tests/fuzz/fuzz_model_config (issue 12 item 6): more heads than
 * hidden units and no head_dim derived head_dim 0, which was accepted (the
 * o_proj shape became [hidden, 0]). */
Test(model_config, derived_head_dim_of_zero_is_refused)
{
    struct shoal_model_config c;
    struct shoal_err e = {0};
    int rc = parse("{\"model_type\":\"mixtral\",\"vocab_size\":100,\"hidden_size\":4,"
                   "\"num_hidden_layers\":1,\"num_attention_heads\":8,"
                   "\"num_key_value_heads\":8,\"num_local_experts\":4,"
                   "\"num_experts_per_tok\":2,\"intermediate_size\":8}", &c, &e);
    cr_assert(eq(int, rc, SHOAL_EFORMAT), "%s", e.msg);
    cr_assert_not_null(strstr(e.msg, "head_dim 0"), "%s", e.msg);
}

Test(model_config, olmoe_defaults_follow_transformers)
{
    struct shoal_model_config c;
    struct shoal_err e = {0};
    int rc = parse("{\"model_type\":\"olmoe\",\"vocab_size\":10,\"hidden_size\":8,"
                   "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"num_experts\":4,"
                   "\"num_experts_per_tok\":2,\"intermediate_size\":4,\"head_dim\":99}", &c, &e);
    cr_assert(eq(int, rc, 0), "%s", e.msg);
    cr_assert(eq(dbl, c.rms_norm_eps, 1e-5));
    cr_assert(eq(i64, c.head_dim, 4)); /* OlmoeAttention: hidden / heads */
    cr_assert(eq(int, c.norm_topk_prob, 0));
    cr_assert(eq(i64, c.n_ff_exp, 4));
}

Test(model_config, real_configs_parse)
{
    static const struct { const char *file; const char *type; long long n_expert, k; } cases[] = {
        {"Mixtral-8x7B-v0.1.json", "mixtral", 8, 2},
        {"Qwen1.5-MoE-A2.7B.json", "qwen2_moe", 60, 4},
        {"Qwen3-30B-A3B.json", "qwen3_moe", 128, 8},
        {"OLMoE-1B-7B-0924.json", "olmoe", 64, 8},
    };
    char path[512];
    snprintf(path, sizeof path, "%s/data/configs", SHOAL_SHARED_DIR);
    FILE *probe = fopen(path, "r");
    if (!probe)
        cr_skip("../shared/data/configs not found (needs the shared data directory)");
    fclose(probe);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(path, sizeof path, "%s/data/configs/%s", SHOAL_SHARED_DIR, cases[i].file);
        struct shoal_model_config c;
        struct shoal_err e = {0};
        cr_assert(eq(int, shoal_model_config_load(path, &c, &e), 0), "%s", e.msg);
        cr_assert(eq(str, (char *)c.family->model_type, (char *)cases[i].type));
        cr_assert(eq(i64, c.n_expert, cases[i].n_expert));
        cr_assert(eq(i64, c.n_expert_used, cases[i].k));
    }
    struct shoal_model_config c;
    struct shoal_err e = {0};
    snprintf(path, sizeof path, "%s/data/configs/Qwen1.5-MoE-A2.7B.json", SHOAL_SHARED_DIR);
    shoal_model_config_load(path, &c, &e);
    cr_assert(eq(i64, c.n_ff_shexp, 5632));
    cr_assert(eq(int, c.qkv_bias, 1));
    cr_assert(eq(int, shoal_layer_uses_window(&c, 23), 0)); /* use_sliding_window false */
    snprintf(path, sizeof path, "%s/data/configs/DeepSeek-V3-Base.json", SHOAL_SHARED_DIR);
    shoal_err_clear(&e);
    cr_assert(eq(int, shoal_model_config_load(path, &c, &e), SHOAL_EUNSUPPORTED));
    cr_assert_not_null(strstr(e.msg, "deepseek_v3"), "%s", e.msg);
}
