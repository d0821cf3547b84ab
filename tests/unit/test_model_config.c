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

static void skip_without_shared_configs(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/data/configs", SHOAL_SHARED_DIR);
    FILE *probe = fopen(path, "r");
    if (!probe)
        cr_skip("../shared/data/configs not found (needs the shared data directory)");
    fclose(probe);
}

Test(model_config, real_configs_parse)
{
    static const struct { const char *file; const char *type; long long n_expert, k; } cases[] = {
        {"Mixtral-8x7B-v0.1.json", "mixtral", 8, 2},
        {"Qwen1.5-MoE-A2.7B.json", "qwen2_moe", 60, 4},
        {"Qwen3-30B-A3B.json", "qwen3_moe", 128, 8},
        {"OLMoE-1B-7B-0924.json", "olmoe", 64, 8},
        {"DeepSeek-V2-Lite.json", "deepseek_v2", 64, 6},
        {"DeepSeek-V3-Base.json", "deepseek_v3", 256, 8},
        {"DeepSeek-R1.json", "deepseek_v3", 256, 8},
        {"Kimi-K2-Instruct.json", "kimi_k2", 384, 8},
        {"GLM-4.5-Air-arch.INTELLECT-3-Base.json", "glm4_moe", 128, 8},
    };
    char path[512];
    skip_without_shared_configs();
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
    /* gpt-oss as shipped: MXFP4 experts, alternating windows of 128 */
    snprintf(path, sizeof path, "%s/data/configs/gpt-oss-20b.json", SHOAL_SHARED_DIR);
    shoal_err_clear(&e);
    cr_assert(eq(int, shoal_model_config_load(path, &c, &e), 0), "%s", e.msg);
    cr_assert(eq(str, (char *)c.family->model_type, "gpt_oss"));
    cr_assert(eq(int, c.mxfp4_experts, 1));
    cr_assert(eq(i64, c.n_expert, 32));
    cr_assert(eq(i64, c.n_expert_used, 4));
    cr_assert(eq(int, shoal_layer_uses_window(&c, 0), 1));
    cr_assert(eq(int, shoal_layer_uses_window(&c, 1), 0));
    cr_assert(eq(i64, c.sliding_window, 128));
}

/* The values each field of the real DeepSeek, Kimi and GLM configs sets,
 * read back as the modeling files use them. */
Test(model_config, frontier_families_read_their_fields)
{
    char path[512];
    skip_without_shared_configs();
    snprintf(path, sizeof path, "%s/data/configs/DeepSeek-V3-Base.json", SHOAL_SHARED_DIR);
    struct shoal_model_config c;
    struct shoal_err e = {0};
    cr_assert(eq(int, shoal_model_config_load(path, &c, &e), 0), "%s", e.msg);
    cr_assert(eq(i64, c.head_dim, 192));
    cr_assert(eq(i64, c.rope_dim, 64));
    cr_assert(eq(i64, c.q_lora_rank, 1536));
    cr_assert(eq(i64, shoal_kv_elems_per_token(&c), 576));
    cr_assert(eq(int, c.router_score, SHOAL_ROUTER_SIGMOID));
    cr_assert(eq(int, c.router_topk, SHOAL_TOPK_NOAUX_TC));
    cr_assert(eq(int, c.router_bias, 1));
    cr_assert(eq(i64, c.n_group, 8));
    cr_assert(eq(i64, c.topk_group, 4));
    cr_assert(eq(dbl, c.routed_scaling_factor, 2.5));
    cr_assert(eq(int, c.norm_topk_prob, 1));
    cr_assert(eq(i64, c.n_ff_shexp, 2048));
    cr_assert(eq(int, c.shexp_gated, 0));
    cr_assert(eq(i64, c.n_nextn, 1));
    cr_assert(eq(int, c.layer_is_moe[2], 0));
    cr_assert(eq(int, c.layer_is_moe[3], 1));
    /* yarn factor 40, mscale_all_dim 1: (0.1 ln 40 + 1)^2 */
    const double m = 0.1 * log(40.0) + 1.0;
    cr_assert(fabs(c.attn_scale - m * m) < 1e-12, "%g", c.attn_scale);

    snprintf(path, sizeof path, "%s/data/configs/DeepSeek-V2-Lite.json", SHOAL_SHARED_DIR);
    cr_assert(eq(int, shoal_model_config_load(path, &c, &e), 0), "%s", e.msg);
    cr_assert(eq(i64, c.q_lora_rank, 0));
    cr_assert(eq(int, c.router_score, SHOAL_ROUTER_SOFTMAX));
    cr_assert(eq(int, c.router_topk, SHOAL_TOPK_GREEDY));
    cr_assert(eq(int, c.router_bias, 0));
    cr_assert(eq(i64, c.n_ff_shexp, 2 * 1408));
    cr_assert(eq(int, c.layer_is_moe[0], 0));
    cr_assert(eq(int, c.layer_is_moe[1], 1));
    const double m2 = 0.1 * 0.707 * log(40.0) + 1.0;
    cr_assert(fabs(c.attn_scale - m2 * m2) < 1e-12, "%g", c.attn_scale);

    snprintf(path, sizeof path, "%s/data/configs/Kimi-K2-Instruct.json", SHOAL_SHARED_DIR);
    cr_assert(eq(int, shoal_model_config_load(path, &c, &e), 0), "%s", e.msg);
    cr_assert(eq(i64, c.n_head, 64));
    cr_assert(eq(i64, c.n_group, 1));
    cr_assert(eq(dbl, c.routed_scaling_factor, 2.827));
    cr_assert(eq(dbl, c.rope_freq_base, 50000.0));
    cr_assert(eq(i64, c.n_nextn, 0));

    snprintf(path, sizeof path, "%s/data/configs/GLM-4.5-Air-arch.INTELLECT-3-Base.json",
             SHOAL_SHARED_DIR);
    cr_assert(eq(int, shoal_model_config_load(path, &c, &e), 0), "%s", e.msg);
    cr_assert(eq(i64, c.head_dim, 128));
    cr_assert(eq(i64, c.rope_dim, 64));          /* partial_rotary_factor 0.5 */
    cr_assert(eq(i64, c.n_head_kv, 8));
    cr_assert(eq(int, c.qkv_bias, 1));
    cr_assert(eq(int, c.qk_norm, SHOAL_QK_NORM_NONE));  /* use_qk_norm false */
    cr_assert(eq(int, c.router_score, SHOAL_ROUTER_SIGMOID));
    cr_assert(eq(int, c.router_bias, 1));
    cr_assert(eq(i64, c.n_ff_shexp, 1408));
    cr_assert(eq(i64, shoal_kv_elems_per_token(&c), 2 * 8 * 128));
    cr_assert(eq(i64, c.n_nextn, 1));
}

static void expect_refused(const char *json, int code, const char *needle);

Test(model_config, frontier_families_refuse_bad_routing_fields)
{
    const char *base = "{\"model_type\":\"deepseek_v3\",\"vocab_size\":32,\"hidden_size\":16,"
                       "\"num_hidden_layers\":2,\"num_attention_heads\":2,"
                       "\"n_routed_experts\":8,\"num_experts_per_tok\":2,"
                       "\"moe_intermediate_size\":8,\"intermediate_size\":16,"
                       "\"kv_lora_rank\":8,\"qk_nope_head_dim\":4,\"qk_rope_head_dim\":4,"
                       "\"v_head_dim\":4,";
    char json[1024];
    snprintf(json, sizeof json, "%s\"n_group\":2,\"topk_group\":3}", base);
    expect_refused(json, SHOAL_EFORMAT, "topk_group 3 is larger than n_group 2");
    snprintf(json, sizeof json, "%s\"n_group\":3}", base);
    expect_refused(json, SHOAL_EFORMAT, "not a multiple of n_group 3");
    snprintf(json, sizeof json, "%s\"topk_method\":\"greedy\"}", base);
    expect_refused(json, SHOAL_EUNSUPPORTED, "topk_method 'greedy'");
    snprintf(json, sizeof json, "%s\"qk_rope_head_dim\":5}", base);
    expect_refused(json, SHOAL_EFORMAT, "qk_rope_head_dim 5 must be even");
    snprintf(json, sizeof json, "%s\"attention_bias\":true}", base);
    expect_refused(json, SHOAL_EUNSUPPORTED, "attention_bias");
}

/* ---- derived dimensions (issue 12 item 6) ---- */

static void expect_refused(const char *json, int code, const char *needle)
{
    struct shoal_model_config c;
    struct shoal_err e = {0};
    int rc = parse(json, &c, &e);
    cr_assert(eq(int, rc, code), "rc %d (%s) for %s", rc, e.msg, json);
    cr_assert_not_null(strstr(e.msg, needle), "'%s' not in: %s", needle, e.msg);
    cr_assert_null(strchr(e.msg, '\n'), "%s", e.msg);
}

/* A config of each family with the given sizes and extra keys, no head_dim. */
static const char *family_json(const char *type, int hidden, int heads, const char *extra)
{
    static char buf[1024];
    const char *nexp = !strcmp(type, "mixtral") ? "num_local_experts" : "num_experts";
    const char *ff = !strcmp(type, "mixtral") || !strcmp(type, "olmoe")
                         ? "\"intermediate_size\":16"
                         : "\"moe_intermediate_size\":16,\"intermediate_size\":16,"
                           "\"shared_expert_intermediate_size\":16";
    snprintf(buf, sizeof buf,
             "{\"model_type\":\"%s\",\"vocab_size\":100,\"hidden_size\":%d,"
             "\"num_hidden_layers\":2,\"num_attention_heads\":%d,\"%s\":4,"
             "\"num_experts_per_tok\":2,%s%s}",
             type, hidden, heads, nexp, ff, extra);
    return buf;
}

static const char *const all_families[] = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe"};

Test(model_config, head_dim_derived_as_zero_is_refused_in_every_family)
{
    for (size_t i = 0; i < 4; i++)
        expect_refused(family_json(all_families[i], 8, 16, ""), SHOAL_EFORMAT,
                       "config.json: head_dim 0 (from hidden_size 8 / num_attention_heads 16) "
                       "must be even and >= 2");
}

Test(model_config, odd_or_tiny_head_dim_is_refused)
{
    for (size_t i = 0; i < 4; i++) {
        /* 12 / 4 = 3: odd; 2 / 2 = 1: no RoPE pair */
        expect_refused(family_json(all_families[i], 12, 4, ""), SHOAL_EFORMAT,
                       "head_dim 3 (from hidden_size 12 / num_attention_heads 4)");
        expect_refused(family_json(all_families[i], 2, 2, ""), SHOAL_EFORMAT,
                       "head_dim 1 (from hidden_size 2 / num_attention_heads 2)");
    }
    expect_refused(family_json("qwen3_moe", 64, 4, ",\"head_dim\":7"), SHOAL_EFORMAT,
                   "config.json: head_dim 7 must be even and >= 2");
    expect_refused(family_json("mixtral", 64, 4, ",\"head_dim\":0"), SHOAL_ERANGE,
                   "'head_dim' is 0");
}

Test(model_config, heads_times_head_dim_must_match_where_the_family_derives_it)
{
    /* olmoe derives head_dim and ignores the key; 50 / 3 = 16 leaves 2 columns out */
    expect_refused(family_json("olmoe", 50, 3, ",\"head_dim\":16"), SHOAL_EFORMAT,
                   "hidden_size 50 is not divisible by num_attention_heads 3");
    expect_refused(family_json("qwen2_moe", 50, 3, ""), SHOAL_EFORMAT,
                   "hidden_size 50 is not divisible by num_attention_heads 3");
    expect_refused(family_json("qwen2_moe", 64, 4, ",\"head_dim\":32"), SHOAL_EFORMAT,
                   "head_dim 32 x num_attention_heads 4 must equal hidden_size 64");
    /* qwen3_moe and mixtral honour an explicit head_dim != hidden / heads */
    struct shoal_model_config c;
    struct shoal_err e = {0};
    cr_assert(eq(int, parse(family_json("qwen3_moe", 64, 4, ",\"head_dim\":32"), &c, &e), 0),
              "%s", e.msg);
    cr_assert(eq(i64, c.head_dim, 32));
    cr_assert(eq(int, parse(family_json("qwen2_moe", 64, 4, ",\"head_dim\":16"), &c, &e), 0),
              "%s", e.msg);
    cr_assert(eq(i64, c.head_dim, 16));
}

Test(model_config, rotary_dimension_below_two_is_refused)
{
    expect_refused(family_json("qwen3_moe", 64, 4, ",\"partial_rotary_factor\":0.1"),
                   SHOAL_EFORMAT,
                   "rotary dimension 0 (head_dim 16 x partial_rotary_factor 0.1) must be >= 2");
    expect_refused(family_json("mixtral", 32, 16,
                               ",\"rope_scaling\":{\"type\":\"dynamic\",\"factor\":2}"),
                   SHOAL_EFORMAT, "'dynamic' needs a rotary dimension > 2, found 2");
}

Test(model_config, sizes_that_would_overflow_are_refused)
{
    expect_refused(family_json("qwen3_moe", 1024, 65536, ",\"head_dim\":65536"), SHOAL_ERANGE,
                   "num_attention_heads 65536 x head_dim 65536");
    /* vocab beyond int32 token ids */
    expect_refused("{\"model_type\":\"mixtral\",\"vocab_size\":2147483648}", SHOAL_ERANGE,
                   "'vocab_size' is 2147483648");
    /* each field in range, the product of them not: 2 x vocab x hidden > 2^46 */
    expect_refused("{\"model_type\":\"mixtral\",\"vocab_size\":2147483647,"
                   "\"hidden_size\":1048576,\"num_hidden_layers\":2,"
                   "\"num_attention_heads\":4096,\"num_local_experts\":4,"
                   "\"num_experts_per_tok\":2,\"intermediate_size\":16}",
                   SHOAL_ERANGE, "more than the supported 7.04e+13");
    expect_refused("{\"model_type\":\"mixtral\",\"vocab_size\":100,\"hidden_size\":1048576,"
                   "\"num_hidden_layers\":512,\"num_attention_heads\":4096,"
                   "\"num_local_experts\":65536,\"num_experts_per_tok\":2,"
                   "\"intermediate_size\":4194304}",
                   SHOAL_ERANGE, "65536 experts of width 4194304");
}

/* ---- RoPE layouts and keys that change the math (issue 12 item 8) ---- */

#define YARN_FIELDS "\"factor\":4.0,\"original_max_position_embeddings\":32"

Test(model_config, rope_parameters_v5_layout_equals_the_classic_layout)
{
    struct shoal_model_config a, b;
    struct shoal_err e = {0};
    cr_assert(eq(int, parse("{" BASE_QWEN3 ",\"rope_theta\":1000000.0,\"rope_scaling\":"
                            "{\"rope_type\":\"yarn\"," YARN_FIELDS "}}", &a, &e), 0), "%s", e.msg);
    cr_assert(eq(int, parse("{" BASE_QWEN3 ",\"rope_parameters\":{\"rope_type\":\"yarn\","
                            "\"rope_theta\":1000000.0," YARN_FIELDS "}}", &b, &e), 0), "%s", e.msg);
    cr_assert(eq(int, b.rope_scaling.type, SHOAL_ROPE_YARN));
    cr_assert(eq(dbl, b.rope_freq_base, 1e6));
    cr_assert(eq(dbl, b.rope_scaling.factor, 4.0));
    cr_assert(eq(dbl, b.rope_scaling.original_max_pos, 32.0));
    cr_assert(eq(int, memcmp(&a, &b, sizeof a), 0), "the two layouts give different configs");

    /* v5 default: rope_type may be absent; partial_rotary_factor inside */
    cr_assert(eq(int, parse("{" BASE_QWEN3 ",\"rope_parameters\":{\"rope_theta\":5e5,"
                            "\"partial_rotary_factor\":0.5}}", &b, &e), 0), "%s", e.msg);
    cr_assert(eq(int, b.rope_scaling.type, SHOAL_ROPE_DEFAULT));
    cr_assert(eq(dbl, b.rope_freq_base, 5e5));
    cr_assert(eq(i64, b.rope_dim, 16));
    /* the same object under both names, and a top-level rope_theta that agrees */
    cr_assert(eq(int, parse("{" BASE_QWEN3 ",\"rope_theta\":1e6,"
                            "\"rope_scaling\":{\"rope_type\":\"yarn\"," YARN_FIELDS "},"
                            "\"rope_parameters\":{\"rope_type\":\"yarn\"," YARN_FIELDS "}}",
                            &b, &e), 0), "%s", e.msg);
    cr_assert(eq(int, memcmp(&a, &b, sizeof a), 0));
}

Test(model_config, rope_settings_that_would_be_dropped_are_refused)
{
    expect_refused("{" BASE_QWEN3 ",\"rope_theta\":1e6,\"rope_parameters\":{\"rope_type\":"
                   "\"default\",\"rope_theta\":1e4}}", SHOAL_EFORMAT,
                   "'rope_theta' is 1000000 at the top level but 10000 in 'rope_parameters'");
    expect_refused("{" BASE_QWEN3 ",\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":2},"
                   "\"rope_parameters\":{\"rope_type\":\"yarn\"," YARN_FIELDS "}}",
                   SHOAL_EFORMAT, "both 'rope_scaling' and 'rope_parameters' are given");
    expect_refused("{" BASE_QWEN3 ",\"rope_parameters\":{\"rope_type\":\"longrope\","
                   "\"factor\":2}}", SHOAL_EUNSUPPORTED,
                   "rope_parameters type 'longrope' is not supported");
    expect_refused("{" BASE_QWEN3 ",\"rope_parameters\":{\"full_attention\":{\"rope_type\":"
                   "\"default\",\"rope_theta\":1e4}}}", SHOAL_EUNSUPPORTED,
                   "'rope_parameters' per layer type ('full_attention') is not supported");
    expect_refused("{" BASE_QWEN3 ",\"rope_scaling\":{\"rope_type\":\"default\","
                   "\"mrope_section\":[16,24,24]}}", SHOAL_EUNSUPPORTED,
                   "rope_scaling key 'mrope_section' is not supported");
    expect_refused("{" BASE_QWEN3 ",\"rope_parameters\":{\"factor\":4}}", SHOAL_EFORMAT,
                   "rope_parameters has 'factor' but no 'rope_type'");
    expect_refused("{" BASE_QWEN3 ",\"rope_theta\":1,\"rope_scaling\":{\"rope_type\":\"yarn\","
                   YARN_FIELDS "}}", SHOAL_EFORMAT, "'yarn' needs rope_theta > 1");
}

Test(model_config, layer_types_must_agree_with_the_sliding_window_rule)
{
    struct shoal_model_config c;
    struct shoal_err e = {0};
    cr_assert(eq(int, parse("{" BASE_QWEN3 ",\"layer_types\":[\"full_attention\","
                            "\"full_attention\",\"full_attention\",\"full_attention\"]}",
                            &c, &e), 0), "%s", e.msg);
    cr_assert(eq(int, parse("{" BASE_QWEN3 ",\"sliding_window\":8,\"use_sliding_window\":true,"
                            "\"max_window_layers\":2,\"layer_types\":[\"full_attention\","
                            "\"full_attention\",\"sliding_attention\",\"sliding_attention\"]}",
                            &c, &e), 0), "%s", e.msg);
    cr_assert(eq(int, shoal_layer_uses_window(&c, 2), 1));
    expect_refused("{" BASE_QWEN3 ",\"sliding_window\":8,\"layer_types\":[\"full_attention\","
                   "\"sliding_attention\",\"full_attention\",\"full_attention\"]}",
                   SHOAL_EUNSUPPORTED, "layer_types[1] is 'sliding_attention' but");
    expect_refused("{" BASE_QWEN3 ",\"layer_types\":[\"full_attention\",\"chunked_attention\","
                   "\"full_attention\",\"full_attention\"]}",
                   SHOAL_EUNSUPPORTED, "layer_types[1] 'chunked_attention' is not supported");
    expect_refused("{" BASE_QWEN3 ",\"layer_types\":[\"full_attention\"]}", SHOAL_EFORMAT,
                   "'layer_types' must be a list of 4 strings");
}

/* gpt_oss (modeling_gpt_oss.py): q/k/v/o biases, sinks, the clamp limit,
 * the router bias on the logits, and windows where layer_types says so
 * (GptOssConfig's default: even layers) */
Test(model_config, gpt_oss_reads_its_fields)
{
    struct shoal_model_config c;
    struct shoal_err e = {0};
    const char *base = "{\"model_type\":\"gpt_oss\",\"vocab_size\":32,\"hidden_size\":16,"
                       "\"num_hidden_layers\":4,\"num_attention_heads\":4,"
                       "\"num_key_value_heads\":2,\"head_dim\":8,\"num_local_experts\":4,"
                       "\"num_experts_per_tok\":2,\"intermediate_size\":8,"
                       "\"sliding_window\":3,\"swiglu_limit\":5.5";
    char json[1024];
    snprintf(json, sizeof json, "%s}", base);
    cr_assert(eq(int, parse(json, &c, &e), 0), "%s", e.msg);
    cr_assert(eq(int, c.qkv_bias, 1));
    cr_assert(eq(int, c.o_bias, 1));
    cr_assert(eq(int, c.attn_sinks, 1));
    cr_assert(eq(int, c.router_bias, 1));
    cr_assert(eq(int, c.router_score, SHOAL_ROUTER_TOPK_SOFTMAX));
    cr_assert(eq(dbl, c.swiglu_limit, 5.5));
    cr_assert(eq(dbl, c.rope_freq_base, 150000.0));
    for (int il = 0; il < 4; il++)
        cr_assert(eq(int, shoal_layer_uses_window(&c, il), il % 2 == 0), "layer %d", il);
    snprintf(json, sizeof json, "%s,\"layer_types\":[\"full_attention\",\"full_attention\","
             "\"sliding_attention\",\"sliding_attention\"]}", base);
    cr_assert(eq(int, parse(json, &c, &e), 0), "%s", e.msg);
    cr_assert(eq(int, shoal_layer_uses_window(&c, 1), 0));
    cr_assert(eq(int, shoal_layer_uses_window(&c, 3), 1));
    snprintf(json, sizeof json, "%s,\"layer_types\":[\"full_attention\",\"chunked\","
             "\"full_attention\",\"full_attention\"]}", base);
    expect_refused(json, SHOAL_EUNSUPPORTED, "layer_types[1] 'chunked'");
}
