/* shoal synth: synthetic containers for benchmarks (docs/BENCHMARKS.md).
 *
 *   shoal synth DST --gb N [--family F | --config FILE] [--experts T] ...
 *       writes a container (docs/FORMAT.md) of a real architecture's shapes,
 *       scaled in layer count to about N GB, with random but well-formed
 *       weights, straight from a seeded generator (no checkpoint, no
 *       quantization pass): the same options give the same bytes.
 *   shoal synth --check DIR [run/store flags] [--decode N] ...
 *       decodes on a container and reports finite logits, per-stage
 *       timings of a measured window, and (for synthetic containers) the
 *       achieved expert frequencies against the target ones.
 *
 * Routing. The generated model routes like a real one in distribution: the
 * per-expert frequencies of a real routing trace (shared/data/traces, OLMoE
 * or Mixtral counts; see SOURCES.md §4) are stretched to n_expert and
 * permuted per layer. Channel c0 = n_embd-1 of the residual stream carries
 * a constant C = sqrt(n_embd-1) (embedding column c0); nothing writes to it
 * (the c0 rows of attn_output, of every w_down are zero) and the norms
 * before attention and lm_head zero it, so after ffn_norm it is a positive
 * per-layer constant u0. Router row e holds b_e / u0 at c0 and small
 * random weights elsewhere, so its logit is b_e + z_e with z_e ~ N(0, 1)
 * varying with the token. b is calibrated by Monte Carlo, routing b + z
 * through the engine's own router (shoal_router_select: softmax or sigmoid
 * scores, DeepSeek's group limits; the router_bias written is zero), so
 * that the top-k inclusion frequencies match the trace. The expected growth
 * of the residual (every MoE block adds about --drift rms per channel) is
 * compensated layer by layer. Tokens are routed independently of each
 * other (no temporal locality beyond what the sampled text repeats).
 *
 * Thread: main (generation opens OpenMP regions).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "bench_tools.h"
#include "cli.h"
#include "config.h"
#include "container.h"
#include "expert_store.h"
#include "forward.h"
#include "model.h"
#include "moe.h"
#include "quant.h"
#include "sampler.h"
#include "session.h"
#include "session_flags.h"
#include "util.h"

#define DENSE_ALIGN 64
#define MC_TOKENS 32768          /* Monte Carlo tokens for the router calibration */
#define BATCH_BYTES (64u << 20)  /* expert blobs generated per batch, at most */
#define DEFAULT_TRACE_FILE SHOAL_SOURCE_ROOT \
    "/../shared/data/traces/allenai-OLMoE-routing/expert_counts.json"

#define MAGIC_DENSE shoal_container_magic_dense
#define MAGIC_EXPERTS shoal_container_magic_experts

/* E[silu(g)^2] for g ~ N(0, 1) (numerical integral, 0.3551). */
#define SILU2 0.3551

/* ---- random numbers (splitmix64: fast, seekable by key) ------------------ */

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

struct rng {
    uint64_t s;
};

static inline uint64_t rng_next(struct rng *r)
{
    r->s += 0x9e3779b97f4a7c15ULL;
    return mix64(r->s);
}

/* An independent stream per (seed, a, b, c). */
static struct rng rng_for(uint64_t seed, uint64_t a, uint64_t b, uint64_t c)
{
    struct rng r = {mix64(seed ^ mix64(a ^ mix64(b ^ mix64(c + 0x5eedULL))))};
    return r;
}

/* uniform in [0, 1) with 24 bits */
static inline float rng_unit(struct rng *r)
{
    return (float)(rng_next(r) >> 40) * (1.0f / 16777216.0f);
}

/* uniform in [-1, 1) */
static inline float rng_sym(struct rng *r)
{
    return 2.0f * rng_unit(r) - 1.0f;
}

static double rng_normal(struct rng *r)
{
    double u1 = ((double)(rng_next(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    double u2 = (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static uint64_t str_hash(const char *s)
{
    return XXH64(s, strlen(s), 0x5ca1ab1eULL);
}

/* ---- architectures -------------------------------------------------------- */

/* Real shapes (shared/data/configs; SOURCES.md §1). */
struct fam_shape {
    const char *model_type, *arch;
    int64_t hidden, heads, kv_heads, head_dim, moe_ff, n_expert, top_k, shexp_ff;
    int64_t real_layers;
    int norm_topk;
    double eps, theta;
};

static const struct fam_shape fams[] = {
    {"qwen3_moe", "Qwen3MoeForCausalLM", 2048, 32, 4, 128, 768, 128, 8, 0, 48, 1, 1e-6, 1e6},
    {"olmoe", "OlmoeForCausalLM", 2048, 16, 16, 128, 1024, 64, 8, 0, 16, 0, 1e-5, 1e4},
    {"mixtral", "MixtralForCausalLM", 4096, 32, 8, 128, 14336, 8, 2, 0, 32, 1, 1e-5, 1e6},
    {"qwen2_moe", "Qwen2MoeForCausalLM", 2048, 16, 16, 128, 1408, 60, 4, 5632, 24, 0, 1e-6, 1e6},
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

struct shape {
    int64_t hidden, heads, kv_heads, head_dim, moe_ff, n_expert, top_k, shexp_ff;
    int64_t vocab, layers;
    /* template families only (0 where the config has no such key) */
    int64_t ff;                   /* dense MLP intermediate_size */
    int64_t q_lora, kv_lora, rope_dim;  /* MLA ranks, qk_rope_head_dim */
    int64_t n_group, topk_group;
    int64_t dense_layers;         /* first_k_dense_replace written */
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

/* The real shapes of a template config (a real config.json). */
static void shape_from_tmpl(const json_t *t, const struct shoal_family *f, struct shape *s)
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

/* A copy of template t with shapes s (new reference). */
static json_t *apply_shapes(const json_t *t, const struct shoal_family *f, const struct shape *s)
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

static json_t *make_config(const struct fam_shape *f, const struct shape *s)
{
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
    if (!strcmp(f->model_type, "qwen3_moe")) {
        json_object_set_new(c, "head_dim", json_integer(s->head_dim));
        json_object_set_new(c, "num_experts", json_integer(s->n_expert));
        json_object_set_new(c, "moe_intermediate_size", json_integer(s->moe_ff));
        json_object_set_new(c, "intermediate_size", json_integer(3 * s->hidden));
        json_object_set_new(c, "decoder_sparse_step", json_integer(1));
        json_object_set_new(c, "mlp_only_layers", json_array());
        json_object_set_new(c, "norm_topk_prob", json_true());
        json_object_set_new(c, "attention_bias", json_false());
        json_object_set_new(c, "use_sliding_window", json_false());
        json_object_set_new(c, "sliding_window", json_null());
        json_object_set_new(c, "max_window_layers", json_integer(s->layers));
    } else if (!strcmp(f->model_type, "olmoe")) {
        json_object_set_new(c, "num_experts", json_integer(s->n_expert));
        json_object_set_new(c, "intermediate_size", json_integer(s->moe_ff));
        json_object_set_new(c, "norm_topk_prob", json_false());
        json_object_set_new(c, "clip_qkv", json_null());
        json_object_set_new(c, "attention_bias", json_false());
    } else if (!strcmp(f->model_type, "mixtral")) {
        json_object_set_new(c, "head_dim", json_integer(s->head_dim));
        json_object_set_new(c, "num_local_experts", json_integer(s->n_expert));
        json_object_set_new(c, "intermediate_size", json_integer(s->moe_ff));
        json_object_set_new(c, "sliding_window", json_null());
    } else { /* qwen2_moe */
        json_object_set_new(c, "num_experts", json_integer(s->n_expert));
        json_object_set_new(c, "moe_intermediate_size", json_integer(s->moe_ff));
        json_object_set_new(c, "shared_expert_intermediate_size", json_integer(s->shexp_ff));
        json_object_set_new(c, "intermediate_size", json_integer(s->shexp_ff));
        json_object_set_new(c, "decoder_sparse_step", json_integer(1));
        json_object_set_new(c, "mlp_only_layers", json_array());
        json_object_set_new(c, "norm_topk_prob", json_false());
        json_object_set_new(c, "use_sliding_window", json_false());
    }
    return c;
}

static int parse_config(json_t *config, struct shoal_model_config *cfg, struct shoal_err *err)
{
    char *text = json_dumps(config, JSON_COMPACT);
    int rc = shoal_model_config_parse(text, strlen(text), "synthetic config", cfg, err);
    free(text);
    return rc;
}

/* ---- byte sizes (the same layout rules as the converter) ------------------ */

static uint64_t align_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

static enum shoal_dtype slot_dtype(const struct shoal_weight_slot *s, enum shoal_dtype dense,
                                   enum shoal_dtype experts)
{
    return shoal_target_dtype(s->kind, s->cols, s->router, experts, dense);
}

static uint64_t slot_bytes(const struct shoal_weight_slot *s, enum shoal_dtype t, int group)
{
    struct shoal_weight w = {.dtype = t, .rows = s->cols ? s->rows : 1,
                             .cols = s->cols ? s->cols : s->rows, .group = group};
    return (uint64_t)shoal_weight_bytes(&w);
}

struct measure {
    enum shoal_dtype dense, experts;
    int group;
    uint64_t dense_off;                 /* end of dense.bin so far */
    uint64_t comp_off[6], comp_bytes[6], blob_bytes;
    enum shoal_dtype comp_dtype[6];
    int n_comp;                         /* shoal_expert_n_comp */
    int64_t n_blobs;
};

static int measure_slot(const struct shoal_weight_slot *s, void *user)
{
    struct measure *m = user;
    enum shoal_dtype t = slot_dtype(s, m->dense, m->experts);
    uint64_t b = slot_bytes(s, t, m->group);
    if (s->kind == SHOAL_SLOT_DENSE) {
        m->dense_off = align_up(m->dense_off, DENSE_ALIGN) + b;
        return 0;
    }
    if (m->blob_bytes == 0) {
        m->comp_off[s->comp] = s->comp ? align_up(m->comp_off[s->comp - 1] +
                                                  m->comp_bytes[s->comp - 1], DENSE_ALIGN) : 0;
        m->comp_bytes[s->comp] = b;
        m->comp_dtype[s->comp] = t;
        if (s->comp == m->n_comp - 1)
            m->blob_bytes = align_up(m->comp_off[s->comp] + b, SHOAL_CONTAINER_ALIGN);
    }
    if (s->comp == m->n_comp - 1)
        m->n_blobs++;
    return 0;
}

/* Walk cfg's architecture and lay it out. Returns total container bytes. */
static uint64_t measure_cfg(const struct shoal_model_config *cfg, struct measure *m)
{
    struct shoal_model model;
    memset(&model, 0, sizeof model);
    model.cfg = *cfg;
    shoal_model_alloc_layers(&model);
    m->dense_off = SHOAL_CONTAINER_HEADER_BYTES;
    m->blob_bytes = 0;
    m->n_blobs = 0;
    m->n_comp = shoal_expert_n_comp(cfg);
    shoal_model_walk(&model, measure_slot, m);
    for (int64_t il = 0; il < cfg->n_layer; il++)
        free(model.layers[il].experts);
    free(model.layers);
    return align_up(m->dense_off, SHOAL_CONTAINER_ALIGN) + SHOAL_CONTAINER_HEADER_BYTES +
           (uint64_t)m->n_blobs * m->blob_bytes;
}

/* ---- routing targets --------------------------------------------------------- */

/* Shares of a trace layer, sorted descending, stretched (linear interpolation
 * of the rank-frequency curve) to n experts, normalised to sum 1. */
static void stretch_shares(const double *src, int64_t m, double *dst, int64_t n)
{
    double *s = shoal_xmalloc((size_t)m * sizeof *s);
    memcpy(s, src, (size_t)m * sizeof *s);
    for (int64_t i = 1; i < m; i++) /* insertion sort, descending */
        for (int64_t j = i; j > 0 && s[j] > s[j - 1]; j--) {
            double t = s[j];
            s[j] = s[j - 1];
            s[j - 1] = t;
        }
    double sum = 0;
    for (int64_t j = 0; j < n; j++) {
        double x = ((double)j + 0.5) * (double)m / (double)n - 0.5;
        if (x < 0)
            x = 0;
        if (x > (double)(m - 1))
            x = (double)(m - 1);
        int64_t i0 = (int64_t)x;
        int64_t i1 = i0 + 1 < m ? i0 + 1 : i0;
        double f = x - (double)i0;
        dst[j] = s[i0] * (1 - f) + s[i1] * f;
        if (dst[j] < 1e-12)
            dst[j] = 1e-12;
        sum += dst[j];
    }
    for (int64_t j = 0; j < n; j++)
        dst[j] /= sum;
    free(s);
}

struct trace {
    const char *name;   /* olmoe, mixtral, uniform, zipf */
    int n_src;          /* source layers (1 for built-ins) */
    int src_layer[3];   /* trace layer index, e.g. 0 7 15 */
    double src_depth[3];/* relative depth of each in its model, 0..1 */
    double *shares[3];  /* [n_src][n_expert] stretched, sorted descending */
};

static void trace_free(struct trace *t)
{
    for (int i = 0; i < t->n_src; i++)
        free(t->shares[i]);
}

/* Load the target shares for n experts. */
static int trace_load(struct trace *t, const char *name, const char *file, const char *domain,
                      double zipf_s, int64_t n, struct shoal_err *err)
{
    memset(t, 0, sizeof *t);
    t->name = name;
    if (!strcmp(name, "uniform") || !strcmp(name, "zipf")) {
        t->n_src = 1;
        t->shares[0] = shoal_xmalloc((size_t)n * sizeof(double));
        double sum = 0;
        for (int64_t j = 0; j < n; j++) {
            t->shares[0][j] = !strcmp(name, "uniform") ? 1.0 : pow((double)(j + 1), -zipf_s);
            sum += t->shares[0][j];
        }
        for (int64_t j = 0; j < n; j++)
            t->shares[0][j] /= sum;
        return 0;
    }
    const char *model = !strcmp(name, "olmoe") ? "OLMoE-1B-7B-0924" :
                        !strcmp(name, "mixtral") ? "Mixtral-8x7B-v0.1" : NULL;
    if (!model)
        return shoal_err_set(err, SHOAL_EINVAL, "--trace expects olmoe, mixtral, uniform or "
                             "zipf, got '%s'", name);
    json_error_t jerr;
    json_t *root = json_load_file(file, 0, &jerr);
    if (!root)
        return shoal_err_set(err, SHOAL_ENOTFOUND, "cannot read the routing trace '%s': %s "
                             "(pass --trace-file FILE, or --trace zipf|uniform when "
                             "../shared/data is absent)", file, jerr.text);
    int rc = 0;
    json_t *jm = json_object_get(json_object_get(root, "models"), model);
    json_t *doms = json_object_get(jm, "domains");
    json_t *layers = json_object_get(root, "layers");
    int64_t ne_src = json_integer_value(json_object_get(jm, "num_experts"));
    if (!json_is_object(doms) || !json_is_array(layers) || json_array_size(layers) < 1 ||
        json_array_size(layers) > 3 || ne_src < 2) {
        rc = shoal_err_set(err, SHOAL_EFORMAT, "'%s': no model '%s' with domains, layers "
                           "and num_experts", file, model);
        goto done;
    }
    /* the traced models' depth: OLMoE 16 layers, Mixtral 32 */
    double depth_den = !strcmp(name, "olmoe") ? 15.0 : 31.0;
    t->n_src = (int)json_array_size(layers);
    double *acc = shoal_xcalloc((size_t)ne_src, sizeof *acc);
    for (int li = 0; li < t->n_src && !rc; li++) {
        int64_t L = json_integer_value(json_array_get(layers, (size_t)li));
        char key[32];
        snprintf(key, sizeof key, "%lld", (long long)L);
        t->src_layer[li] = (int)L;
        t->src_depth[li] = (double)L / depth_den;
        memset(acc, 0, (size_t)ne_src * sizeof *acc);
        int used = 0;
        const char *dk;
        json_t *dv;
        json_object_foreach(doms, dk, dv) {
            if (strcmp(domain, "all") && strcmp(domain, dk))
                continue;
            json_t *arr = json_object_get(dv, key);
            if (!json_is_array(arr) || (int64_t)json_array_size(arr) != ne_src) {
                rc = shoal_err_set(err, SHOAL_EFORMAT, "'%s': %s domain %s layer %s needs "
                                   "%lld counts", file, model, dk, key, (long long)ne_src);
                break;
            }
            for (int64_t e = 0; e < ne_src; e++)
                acc[e] += json_number_value(json_array_get(arr, (size_t)e));
            used++;
        }
        if (!rc && !used)
            rc = shoal_err_set(err, SHOAL_EINVAL, "--domain '%s' is not in '%s' for %s "
                               "(use all, or one of its domains)", domain, file, model);
        if (!rc) {
            t->shares[li] = shoal_xmalloc((size_t)n * sizeof(double));
            stretch_shares(acc, ne_src, t->shares[li], n);
        }
    }
    free(acc);
done:
    json_decref(root);
    if (rc)
        trace_free(t);
    return rc;
}

/* Inclusion probabilities pi = k * share, capped at 0.95 (water-filling). */
static void inclusion_targets(const double *share, int64_t n, int64_t k, double *pi)
{
    for (int64_t e = 0; e < n; e++)
        pi[e] = (double)k * share[e];
    for (int it = 0; it < 64; it++) {
        double excess = 0, free_mass = 0;
        for (int64_t e = 0; e < n; e++) {
            if (pi[e] > 0.95) {
                excess += pi[e] - 0.95;
                pi[e] = 0.95;
            } else if (pi[e] < 0.95) {
                free_mass += pi[e];
            }
        }
        if (excess <= 1e-12 || free_mass <= 0)
            break;
        for (int64_t e = 0; e < n; e++)
            if (pi[e] < 0.95)
                pi[e] += excess * pi[e] / free_mass;
    }
}

/* Top-k of v[n] into idx[k] (descending, ties to the lower id). */
static void topk(const double *v, int64_t n, int64_t k, int32_t *idx)
{
    int64_t m = 0;
    for (int64_t e = 0; e < n; e++) {
        if (m == k && v[e] <= v[idx[k - 1]])
            continue;
        int64_t p = m < k ? m++ : k - 1;
        while (p > 0 && v[idx[p - 1]] < v[e]) {
            idx[p] = idx[p - 1];
            p--;
        }
        idx[p] = (int32_t)e;
    }
}

/* d log P(b + z > x) / db for z ~ N(0, 1) at the x where P = p: the hazard
 * of the normal tail. Inclusion of a rare expert reacts to its bias about
 * this much faster than log-linearly; dividing the update by it keeps the
 * calibration from oscillating. */
static double tail_hazard(double p)
{
    double lo = -12, hi = 12;
    for (int i = 0; i < 80; i++) {
        double m = 0.5 * (lo + hi);
        if (0.5 * erfc(m / sqrt(2.0)) > p)
            lo = m;
        else
            hi = m;
    }
    double x = 0.5 * (lo + hi);
    return exp(-0.5 * x * x) / sqrt(2.0 * M_PI) / p;
}

#define MC_CHUNK 64   /* Monte Carlo tokens per router call */

/* Route T Monte Carlo tokens with logits b + z[t] through the engine's own
 * router (shoal_router_select: softmax or sigmoid scores, group limits,
 * renormalisation, routed scaling, exactly as decode routes), counting each
 * expert's top-k inclusions into cnt[n]; returns the mean over tokens of
 * the sum of squared combine weights. */
static double mc_count(const struct shoal_router *rt, const float *z, int64_t T,
                       const double *b, double *cnt)
{
    const int64_t n = rt->n_expert, k = rt->k;
    double w2 = 0;
    memset(cnt, 0, (size_t)n * sizeof *cnt);
#pragma omp parallel reduction(+ : w2)
    {
        float *lg = shoal_xmalloc((size_t)(MC_CHUNK * n) * sizeof *lg);
        float *scratch = shoal_xmalloc((size_t)(3 * n) * sizeof *scratch);
        int32_t *ids = shoal_xmalloc((size_t)(MC_CHUNK * k) * sizeof *ids);
        float *w = shoal_xmalloc((size_t)(MC_CHUNK * k) * sizeof *w);
        double *c = shoal_xcalloc((size_t)n, sizeof *c);
#pragma omp for schedule(static)
        for (int64_t t0 = 0; t0 < T; t0 += MC_CHUNK) {
            const int64_t nt = t0 + MC_CHUNK <= T ? MC_CHUNK : T - t0;
            for (int64_t t = 0; t < nt; t++)
                for (int64_t e = 0; e < n; e++)
                    lg[t * n + e] = (float)(b[e] + z[(t0 + t) * n + e]);
            /* cannot fail: k <= n and the groups divide n (config checked) */
            shoal_router_select(rt, lg, nt, scratch, ids, w);
            for (int64_t j = 0; j < nt * k; j++) {
                c[ids[j]] += 1;
                w2 += (double)w[j] * (double)w[j];
            }
        }
#pragma omp critical
        for (int64_t e = 0; e < n; e++)
            cnt[e] += c[e];
        free(lg);
        free(scratch);
        free(ids);
        free(w);
        free(c);
    }
    return w2 / (double)T;
}

/* Calibrate logit biases b[n] (noise N(0,1)) so that the router's top-k
 * inclusion frequencies match pi[n]. Also returns E[sum of squared combine
 * weights] and the worst relative error of the inclusion frequencies, both
 * measured at the final biases. */
static void calibrate(const struct shoal_router *rt, const double *pi, uint64_t seed, double *b,
                      double *mean_w2, double *max_rel_err)
{
    const int64_t T = MC_TOKENS, n = rt->n_expert, k = rt->k;
    float *z = shoal_xmalloc((size_t)(T * n) * sizeof *z);
    struct rng r = rng_for(seed, 0xca11b, (uint64_t)n, (uint64_t)k);
    for (int64_t i = 0; i < T * n; i++)
        z[i] = (float)rng_normal(&r);
    double *cnt = shoal_xmalloc((size_t)n * sizeof *cnt);
    double *h = shoal_xmalloc((size_t)n * sizeof *h);
    double mean = 0;
    for (int64_t e = 0; e < n; e++) {
        h[e] = tail_hazard(pi[e]);
        if (h[e] < 0.5)
            h[e] = 0.5;
        mean += log(pi[e]);
    }
    for (int64_t e = 0; e < n; e++)
        b[e] = log(pi[e]) - mean / (double)n;
    double err_max = 0, w2 = 0;
    for (int it = 0; it < 60; it++) {
        w2 = mc_count(rt, z, T, b, cnt);
        err_max = 0;
        for (int64_t e = 0; e < n; e++) {
            double rel = fabs(cnt[e] / (double)T - pi[e]) / pi[e];
            if (rel > err_max)
                err_max = rel;
        }
        if (err_max < 0.02 || it == 59)
            break;
        double bm = 0;
        for (int64_t e = 0; e < n; e++) {
            double got = cnt[e] / (double)T;
            double lg = log(got > 0.25 / (double)T ? got : 0.25 / (double)T);
            b[e] += 0.9 * (log(pi[e]) - lg) / h[e];
            bm += b[e];
        }
        for (int64_t e = 0; e < n; e++)
            b[e] -= bm / (double)n;
    }
    *mean_w2 = w2;
    *max_rel_err = err_max;
    free(z);
    free(cnt);
    free(h);
}

/* ---- the generator ----------------------------------------------------------- */

enum init_kind {
    INIT_EMB,        /* N(0,1)-like, column c0 = C */
    INIT_ONES,       /* norms */
    INIT_ONES_NOC0,  /* norms that zero c0 (attn_norm, out_norm) */
    INIT_ZERO,       /* biases */
    INIT_IN,         /* uniform with variance var, column c0 zero */
    INIT_OUT,        /* uniform with variance var, row c0 zero */
    INIT_ROUTER,
};

struct synth {
    /* options */
    struct shape sh;
    enum shoal_dtype experts_dtype, dense_dtype;
    int group;
    uint64_t seed;
    double drift;
    int tty;
    /* architecture */
    json_t *config;
    struct shoal_model_config cfg;
    int64_t c0;
    double C;                    /* value of the constant channel */
    double p_att;                /* variance attention adds to the residual per channel */
    double var_ffn_out, var_dense_out, var_head, var_exp_out;
    double *var_att_in;          /* [n_layer] q/k/v weight variance: unit-variance outputs */
    /* routing */
    struct trace trace;
    int *layer_src;              /* [n_layer] trace layer used */
    double *layer_target;        /* [n_layer][n_expert] target shares (permuted) */
    double *layer_bias;          /* [n_layer][n_expert] calibrated logit biases */
    double *u0;                  /* [n_layer] expected value of channel c0 after ffn_norm */
    double *sigma;               /* [n_layer] router weight scale off c0; sigma^2 is also the
                                  * gate/up weight variance that gives unit-variance
                                  * pre-activations whatever share c0 has at that depth */
    double mean_w2[3], calib_err[3];
    double layer_err;            /* grouped routers: worst inclusion error of the per-layer fits */
    int n_layer_fits;
    /* writer */
    struct shoal_err *err;
    int fd_dense, fd_exp;
    char *dense_path, *exp_path;
    struct measure lay;
    uint64_t dense_off, exp_off;
    json_t *tensors, *layers;
    XXH64_state_t *fp;
    float *rowbuf;
    size_t rowbuf_cap;
    unsigned char *chunk;
    size_t chunk_cap;
    unsigned char *bufs[2];      /* expert batches: one generated while the other is written */
    int cur;
    uint64_t *sums;
    int64_t batch_blobs;
    int exp_direct;              /* experts.bin opened with O_DIRECT */
    uint64_t done, total;
    double t0, t_gen, t_write;   /* generating; waiting for the writer */
    /* the expert writer thread */
    pthread_t wthread;
    int wstarted;
    pthread_mutex_t wmu;
    pthread_cond_t wcv;
    const unsigned char *wbuf;
    size_t wlen;
    uint64_t woff;
    int wpending, wquit, wrc, wmu_init;
    struct shoal_err werr;
    double wbusy;
};


static void fp_add(struct synth *sy, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fp_add(struct synth *sy, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    XXH64_update(sy->fp, buf, (size_t)n);
}

static void progress(struct synth *sy)
{
    if (!sy->tty)
        return;
    double el = shoal_time_s() - sy->t0;
    double rate = el > 0 ? (double)sy->done / el : 0;
    fprintf(stderr, "\rsynth %5.1f%%  %.0f/%.0f MB  %.0f MB/s   ",
            sy->total ? 100.0 * (double)sy->done / (double)sy->total : 100.0,
            (double)sy->done / 1e6, (double)sy->total / 1e6, rate / 1e6);
    if (sy->done >= sy->total)
        fprintf(stderr, "\n");
}

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static enum init_kind classify(const struct synth *sy, const struct shoal_weight_slot *s,
                               double *var)
{
    const double E = (double)sy->cfg.n_embd;
    *var = 0;
    if (!strcmp(s->name, "tok_embd"))
        return INIT_EMB;
    if (!strcmp(s->name, "out_norm") || ends_with(s->name, ".attn_norm"))
        return INIT_ONES_NOC0;
    if (!strcmp(s->name, "lm_head")) {
        *var = sy->var_head;
        return INIT_IN;
    }
    if (ends_with(s->name, ".bias") || ends_with(s->name, ".router_bias") ||
        ends_with(s->name, ".attn_sinks"))
        return INIT_ZERO;
    if (ends_with(s->name, "_norm"))
        return INIT_ONES;
    if (ends_with(s->name, ".router"))
        return INIT_ROUTER;
    if (ends_with(s->name, ".attn_q") || ends_with(s->name, ".attn_k") ||
        ends_with(s->name, ".attn_v") || ends_with(s->name, ".attn_q_a") ||
        ends_with(s->name, ".attn_kv_a")) {
        *var = sy->var_att_in[s->il];
        return INIT_IN;
    }
    if (ends_with(s->name, ".attn_q_b") || ends_with(s->name, ".attn_kv_b")) {
        /* MLA up-projections read an RMS-normed latent: unit-variance outputs */
        *var = 1.0 / (double)s->cols;
        return INIT_IN;
    }
    if (ends_with(s->name, ".attn_output")) {
        *var = sy->p_att / (double)s->cols;
        return INIT_OUT;
    }
    if (ends_with(s->name, ".w_gate") || ends_with(s->name, ".w_up")) {
        *var = sy->sigma[s->il] * sy->sigma[s->il];
        return INIT_IN;
    }
    if (ends_with(s->name, ".w_down")) {
        *var = strstr(s->name, ".ffn.") ? sy->var_dense_out : sy->var_ffn_out;
        return INIT_OUT;
    }
    *var = 0.5 / E; /* shexp_gate and anything new: small, c0 ignored */
    return INIT_IN;
}

/* Row r of a dense tensor in f32. */
static void dense_row(const struct synth *sy, const struct shoal_weight_slot *s,
                      enum init_kind kind, double var, int64_t r, int64_t cols, float *out)
{
    struct rng g = rng_for(sy->seed, str_hash(s->name), (uint64_t)r, 1);
    const float a = (float)sqrt(3.0 * var);
    const int64_t c0 = sy->c0;
    switch (kind) {
    case INIT_EMB: {
        const float u = 1.7320508f; /* variance 1 */
        for (int64_t i = 0; i < cols; i++)
            out[i] = u * rng_sym(&g);
        out[c0] = (float)sy->C;
        break;
    }
    case INIT_ONES:
    case INIT_ONES_NOC0:
        for (int64_t i = 0; i < cols; i++)
            out[i] = 1.0f;
        if (kind == INIT_ONES_NOC0)
            out[c0] = 0.0f;
        break;
    case INIT_ZERO:
        memset(out, 0, (size_t)cols * sizeof *out);
        break;
    case INIT_IN:
        for (int64_t i = 0; i < cols; i++)
            out[i] = a * rng_sym(&g);
        if (cols == sy->cfg.n_embd)
            out[c0] = 0.0f;
        break;
    case INIT_OUT:
        for (int64_t i = 0; i < cols; i++)
            out[i] = r == c0 ? 0.0f : a * rng_sym(&g);
        break;
    case INIT_ROUTER: {
        const int64_t il = s->il, ne = sy->cfg.n_expert;
        const float sa = (float)(sy->sigma[il] * 1.7320508);
        for (int64_t i = 0; i < cols; i++)
            out[i] = sa * rng_sym(&g);
        out[c0] = (float)(sy->layer_bias[il * ne + r] / sy->u0[il]);
        break;
    }
    }
}

static int write_dense(struct synth *sy, const struct shoal_weight_slot *s)
{
    enum shoal_dtype t = slot_dtype(s, sy->dense_dtype, sy->experts_dtype);
    const int64_t rows = s->cols ? s->rows : 1, cols = s->cols ? s->cols : s->rows;
    struct shoal_weight tw = {.dtype = t, .rows = rows, .cols = cols, .group = sy->group};
    const size_t row_bytes = shoal_weight_row_bytes(&tw);
    const uint64_t bytes = (uint64_t)rows * row_bytes;
    const uint64_t off = align_up(sy->dense_off, DENSE_ALIGN);
    double var;
    enum init_kind kind = classify(sy, s, &var);
    int64_t per = (int64_t)((8u << 20) / row_bytes);
    if (per < 1)
        per = 1;
    if (per > rows)
        per = rows;
    if ((size_t)(per * cols) > sy->rowbuf_cap) {
        free(sy->rowbuf);
        sy->rowbuf_cap = (size_t)(per * cols);
        sy->rowbuf = shoal_xmalloc(sy->rowbuf_cap * sizeof(float));
    }
    if ((size_t)per * row_bytes > sy->chunk_cap) {
        free(sy->chunk);
        sy->chunk_cap = (size_t)per * row_bytes;
        sy->chunk = shoal_xmalloc(sy->chunk_cap);
    }
    XXH64_state_t *h = XXH64_createState();
    XXH64_reset(h, 0);
    int rc = 0;
    double tg = shoal_time_s();
    for (int64_t r0 = 0; r0 < rows && !rc; r0 += per) {
        const int64_t r1 = r0 + per < rows ? r0 + per : rows;
        float *rb = sy->rowbuf;
        unsigned char *ck = sy->chunk;
#pragma omp parallel for schedule(static)
        for (int64_t r = r0; r < r1; r++) {
            float *row = rb + (r - r0) * cols;
            dense_row(sy, s, kind, var, r, cols, row);
            unsigned char *dst = ck + (size_t)(r - r0) * row_bytes;
            if (t == SHOAL_DTYPE_F32) {
                memcpy(dst, row, (size_t)cols * sizeof(float));
            } else if (t == SHOAL_DTYPE_BF16) {
                for (int64_t i = 0; i < cols; i++) {
                    uint16_t b = shoal_f32_to_bf16(row[i]);
                    memcpy(dst + 2 * i, &b, 2);
                }
            } else {
                shoal_quant_quantize_row(t == SHOAL_DTYPE_INT8 ? SHOAL_QUANT_INT8
                                                               : SHOAL_QUANT_INT4,
                                         sy->group, dst, row, SHOAL_DTYPE_F32, cols, NULL);
            }
        }
        const size_t n = (size_t)(r1 - r0) * row_bytes;
        XXH64_update(h, sy->chunk, n);
        rc = shoal_pwrite_all(sy->fd_dense, sy->chunk, n, off + (uint64_t)r0 * row_bytes,
                       sy->dense_path, sy->err);
    }
    sy->t_gen += shoal_time_s() - tg;
    uint64_t sum = XXH64_digest(h);
    XXH64_freeState(h);
    if (rc)
        return rc;
    char hex[17];
    snprintf(hex, sizeof hex, "%016" PRIx64, sum);
    json_t *o = json_pack("{s:s, s:s, s:o, s:I, s:I, s:s}", "name", s->name,
                          "dtype", shoal_dtype_name(t), "shape",
                          s->cols ? json_pack("[II]", (json_int_t)s->rows, (json_int_t)s->cols)
                                  : json_pack("[I]", (json_int_t)s->rows),
                          "offset", (json_int_t)off, "bytes", (json_int_t)bytes, "xxh64", hex);
    if (shoal_dtype_is_quant(t))
        json_object_set_new(o, "group", json_integer(sy->group));
    json_array_append_new(sy->tensors, o);
    fp_add(sy, "dense %s %s %lld %lld %d %s\n", s->name, shoal_dtype_name(t),
           (long long)s->rows, (long long)s->cols, shoal_dtype_is_quant(t) ? sy->group : 0, hex);
    sy->dense_off = off + bytes;
    sy->done += bytes;
    progress(sy);
    return 0;
}

/* One row of expert component comp (0 gate, 1 up, 2 down) straight in the
 * container's element type: random quants with per-group scales around d. */
static void expert_row(const struct synth *sy, int64_t il, int64_t ie, int comp, int64_t r,
                       unsigned char *dst)
{
    const struct {
        int64_t rows, cols;
    } shp[3] = {{sy->cfg.n_ff_exp, sy->cfg.n_embd}, {sy->cfg.n_ff_exp, sy->cfg.n_embd},
                {sy->cfg.n_embd, sy->cfg.n_ff_exp}};
    const int64_t cols = shp[comp].cols, c0 = sy->c0;
    const int zero_row = comp == 2 && r == c0;       /* nothing writes channel c0 */
    const int64_t zero_col = comp < 2 ? c0 : -1;      /* experts ignore channel c0 */
    const double var = comp < 2 ? sy->sigma[il] * sy->sigma[il] : sy->var_exp_out;
    struct rng g = rng_for(sy->seed, ((uint64_t)il << 32) | (uint64_t)ie, (uint64_t)comp,
                           (uint64_t)r);
    const enum shoal_dtype t = sy->experts_dtype;
    if (t == SHOAL_DTYPE_F32 || t == SHOAL_DTYPE_BF16) {
        const float a = (float)sqrt(3.0 * var);
        for (int64_t i = 0; i < cols; i++) {
            float v = zero_row || i == zero_col ? 0.0f : a * rng_sym(&g);
            if (t == SHOAL_DTYPE_F32) {
                memcpy(dst + 4 * i, &v, 4);
            } else {
                uint16_t b = shoal_f32_to_bf16(v);
                memcpy(dst + 2 * i, &b, 2);
            }
        }
        return;
    }
    const int G = sy->group;
    const int64_t ng = (cols + G - 1) / G;
    const enum shoal_quant_type qt = t == SHOAL_DTYPE_INT8 ? SHOAL_QUANT_INT8 : SHOAL_QUANT_INT4;
    const size_t rb = shoal_quant_row_bytes(qt, cols, G);
    /* E[q^2]: int4 q in -7..7 with 0 twice as likely = 17.5; int8 q in
     * -127..127 with 0 twice as likely = 5397.5; scale factor spread
     * E[(0.75 + 0.5u)^2] = 0.5625 + 0.375 + 0.25/3 = 1.0208 */
    const double eq2 = qt == SHOAL_QUANT_INT4 ? 17.5 : 5397.5;
    const float d = (float)sqrt(var / (eq2 * 1.0208333));
    for (int64_t k = 0; k < ng; k++) {
        float s = zero_row ? 0.0f : d * (0.75f + 0.5f * rng_unit(&g));
        memcpy(dst + 4 * k, &s, 4);
    }
    unsigned char *q = dst + 4 * ng;
    const size_t nq = qt == SHOAL_QUANT_INT4 ? (size_t)(cols + 1) / 2 : (size_t)cols;
    if (zero_row) {
        memset(q, qt == SHOAL_QUANT_INT4 ? 0x88 : 0x00, nq);
    } else {
        size_t i = 0;
        for (; i + 8 <= nq; i += 8) {
            uint64_t w = rng_next(&g);
            if (qt == SHOAL_QUANT_INT4) {
                /* nibble 0 would be q = -8, never written by the quantizer:
                 * turn it into 8 (q = 0) */
                uint64_t x = w | (w >> 1);
                x |= x >> 2;
                w |= (~x & 0x1111111111111111ULL) << 3;
            }
            memcpy(q + i, &w, 8);
        }
        if (i < nq) {
            uint64_t w = rng_next(&g);
            for (; i < nq; i++, w >>= 8) {
                unsigned char b = (unsigned char)w;
                if (qt == SHOAL_QUANT_INT4) {
                    if (!(b & 0x0f))
                        b |= 0x08;
                    if (!(b & 0xf0))
                        b |= 0x80;
                }
                q[i] = b;
            }
        }
        if (qt == SHOAL_QUANT_INT8) {
            for (size_t j = 0; j < nq; j++)
                if (q[j] == 0x80)   /* -128: also never written by the quantizer */
                    q[j] = 0;
            if (zero_col >= 0)
                q[zero_col] = 0;
        } else {
            if (zero_col >= 0) {
                unsigned char *b = q + zero_col / 2;
                *b = zero_col % 2 ? (unsigned char)((*b & 0x0f) | 0x80)
                                  : (unsigned char)((*b & 0xf0) | 0x08);
            }
            if (cols % 2)
                q[nq - 1] &= 0x0f;   /* padding nibble */
        }
    }
    memset(q + nq, 0, rb - 4 * (size_t)ng - nq);
}

/* The expert writer: pwrite of one batch at a time, so the next batch is
 * generated while this one goes to disk. */
static void *writer_main(void *arg)
{
    struct synth *sy = arg;
    pthread_mutex_lock(&sy->wmu);
    for (;;) {
        while (!sy->wpending && !sy->wquit)
            pthread_cond_wait(&sy->wcv, &sy->wmu);
        if (!sy->wpending && sy->wquit)
            break;
        const unsigned char *buf = sy->wbuf;
        size_t len = sy->wlen;
        uint64_t off = sy->woff;
        pthread_mutex_unlock(&sy->wmu);
        double t = shoal_time_s();
        int rc = shoal_pwrite_all(sy->fd_exp, buf, len, off, sy->exp_path, &sy->werr);
        t = shoal_time_s() - t;
        pthread_mutex_lock(&sy->wmu);
        sy->wbusy += t;
        if (rc && !sy->wrc)
            sy->wrc = rc;
        sy->wpending = 0;
        pthread_cond_broadcast(&sy->wcv);
    }
    pthread_mutex_unlock(&sy->wmu);
    return NULL;
}

/* Wait until the writer is idle; returns its first error (err copied). */
static int writer_wait(struct synth *sy)
{
    double t = shoal_time_s();
    pthread_mutex_lock(&sy->wmu);
    while (sy->wpending)
        pthread_cond_wait(&sy->wcv, &sy->wmu);
    int rc = sy->wrc;
    pthread_mutex_unlock(&sy->wmu);
    sy->t_write += shoal_time_s() - t;
    if (rc)
        *sy->err = sy->werr;
    return rc;
}

static int writer_submit(struct synth *sy, const unsigned char *buf, size_t len, uint64_t off)
{
    int rc = writer_wait(sy);
    if (rc)
        return rc;
    pthread_mutex_lock(&sy->wmu);
    sy->wbuf = buf;
    sy->wlen = len;
    sy->woff = off;
    sy->wpending = 1;
    pthread_cond_broadcast(&sy->wcv);
    pthread_mutex_unlock(&sy->wmu);
    return 0;
}

static void writer_stop(struct synth *sy)
{
    if (!sy->wstarted)
        return;
    pthread_mutex_lock(&sy->wmu);
    sy->wquit = 1;
    pthread_cond_broadcast(&sy->wcv);
    pthread_mutex_unlock(&sy->wmu);
    pthread_join(sy->wthread, NULL);
    sy->wstarted = 0;
}

/* Generate, hash and write every expert of MoE layer il. */
static int write_layer_experts(struct synth *sy, int64_t il)
{
    const int64_t NE = sy->cfg.n_expert;
    const uint64_t bb = sy->lay.blob_bytes;
    const int64_t rows[3] = {sy->cfg.n_ff_exp, sy->cfg.n_ff_exp, sy->cfg.n_embd};
    size_t rbytes[3];
    for (int c = 0; c < 3; c++)
        rbytes[c] = (size_t)(sy->lay.comp_bytes[c] / (uint64_t)rows[c]);
    const int64_t rows_per_blob = rows[0] + rows[1] + rows[2];
    const uint64_t layer_off = sy->exp_off;
    json_t *sums = json_array();
    int rc = 0;
    for (int64_t e0 = 0; e0 < NE && !rc; e0 += sy->batch_blobs) {
        const int64_t nb = e0 + sy->batch_blobs < NE ? sy->batch_blobs : NE - e0;
        double tg = shoal_time_s();
        unsigned char *batch = sy->bufs[sy->cur];
        sy->cur ^= 1;
        uint64_t *sumv = sy->sums;
        const struct measure *lay = &sy->lay;
        const struct synth *csy = sy;
#pragma omp parallel
        {
#pragma omp for schedule(static)
            for (int64_t j = 0; j < nb; j++) {
                /* zero padding between components and at the end */
                unsigned char *blob = batch + (size_t)j * bb;
                for (int c = 0; c < lay->n_comp; c++) {
                    /* gpt_oss's biases (components 3..5) are zeros too */
                    uint64_t end = c < 3 ? lay->comp_off[c] + lay->comp_bytes[c]
                                         : lay->comp_off[c];
                    uint64_t next = c + 1 < lay->n_comp ? lay->comp_off[c + 1] : bb;
                    memset(blob + end, 0, (size_t)(next - end));
                }
            }
#pragma omp for schedule(static)
            for (int64_t w = 0; w < nb * rows_per_blob; w++) {
                const int64_t j = w / rows_per_blob;
                int64_t r = w % rows_per_blob;
                int c = 0;
                while (r >= rows[c]) {
                    r -= rows[c];
                    c++;
                }
                unsigned char *dst = batch + (size_t)j * bb + lay->comp_off[c] +
                                     (size_t)r * rbytes[c];
                expert_row(csy, il, e0 + j, c, r, dst);
            }
#pragma omp for schedule(static)
            for (int64_t j = 0; j < nb; j++)
                sumv[j] = XXH64(batch + (size_t)j * bb, bb, 0);
        }
        sy->t_gen += shoal_time_s() - tg;
        rc = writer_submit(sy, batch, (size_t)nb * bb, sy->exp_off);
        for (int64_t j = 0; j < nb && !rc; j++) {
            char hex[17];
            snprintf(hex, sizeof hex, "%016" PRIx64, sumv[j]);
            json_array_append_new(sums, json_string(hex));
            fp_add(sy, "expert %lld %lld %s\n", (long long)il, (long long)(e0 + j), hex);
        }
        sy->exp_off += (uint64_t)nb * bb;
        sy->done += (uint64_t)nb * bb;
        progress(sy);
    }
    if (rc) {
        json_decref(sums);
        return rc;
    }
    json_array_append_new(sy->layers, json_pack("{s:I, s:I, s:o}", "layer", (json_int_t)il,
                                                "offset", (json_int_t)layer_off,
                                                "xxh64", sums));
    return 0;
}

static int write_slot(const struct shoal_weight_slot *s, void *user)
{
    struct synth *sy = user;
    if (s->kind == SHOAL_SLOT_DENSE)
        return write_dense(sy, s);
    if (s->ie == 0 && s->comp == 0)
        return write_layer_experts(sy, s->il);
    return 0;
}


static int sync_close(int fd, const char *path, struct shoal_err *err)
{
    int rc = 0;
    if (fsync(fd) != 0) {
        int e = errno;
        rc = shoal_err_set(err, -e, "cannot sync '%s': %s", path, strerror(e));
    }
#ifdef POSIX_FADV_DONTNEED
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
#endif
    if (close(fd) != 0 && !rc) {
        int e = errno;
        rc = shoal_err_set(err, -e, "cannot close '%s': %s", path, strerror(e));
    }
    return rc;
}

static int dump_json(json_t *j, const char *path, struct shoal_err *err)
{
    if (json_dump_file(j, path, JSON_INDENT(1)) != 0)
        return shoal_err_set(err, SHOAL_EIO, "cannot write '%s'", path);
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    return 0;
}

static void rm_dir(const char *dir)
{
    static const char *names[] = {"dense.bin", "experts.bin", "config.json", "synth.json",
                                  "shoal.json", "routing_counts.json"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char *p = shoal_path_join(dir, names[i]);
        unlink(p);
        free(p);
    }
    rmdir(dir);
}

/* Per-layer routing plan: trace layer by relative depth, a seeded
 * permutation of experts, calibrated biases, and the expected residual
 * statistics that turn biases into router weights. */
static int plan_routing(struct synth *sy, const char *trace_name, const char *trace_file,
                        const char *domain, double zipf_s)
{
    const struct shoal_model_config *c = &sy->cfg;
    const int64_t L = c->n_layer, NE = c->n_expert, K = c->n_expert_used;
    const double E = (double)c->n_embd;
    int rc = trace_load(&sy->trace, trace_name, trace_file, domain, zipf_s, NE, sy->err);
    if (rc)
        return rc;
    struct trace *t = &sy->trace;
    double *bias_src[3] = {0};
    double *pi = shoal_xmalloc((size_t)NE * sizeof *pi);
    /* the router_bias written is zero: the engine's router without one */
    const struct shoal_router rt = shoal_router_of(c, NULL);
    for (int i = 0; i < t->n_src; i++) {
        bias_src[i] = shoal_xmalloc((size_t)NE * sizeof(double));
        inclusion_targets(t->shares[i], NE, K, pi);
        calibrate(&rt, pi, sy->seed, bias_src[i], &sy->mean_w2[i], &sy->calib_err[i]);
    }
    const int grouped = rt.topk != SHOAL_TOPK_GREEDY && rt.n_group > 1;
    sy->layer_src = shoal_xcalloc((size_t)L, sizeof *sy->layer_src);
    sy->layer_target = shoal_xcalloc((size_t)(L * NE), sizeof(double));
    sy->layer_bias = shoal_xcalloc((size_t)(L * NE), sizeof(double));
    sy->u0 = shoal_xcalloc((size_t)L, sizeof(double));
    sy->sigma = shoal_xcalloc((size_t)L, sizeof(double));
    int32_t *perm = shoal_xmalloc((size_t)NE * sizeof *perm);
    /* expert outputs: rms rho per channel, so that a MoE block adds about
     * drift^2 of variance per channel: rho^2 * E[sum w^2] = drift^2 */
    double mw2 = 0;
    for (int i = 0; i < t->n_src; i++)
        mw2 += sy->mean_w2[i] / t->n_src;
    const double rho2 = sy->drift * sy->drift / (mw2 > 0 ? mw2 : 1.0);
    /* qwen2_moe's gated shared expert adds rho^2 / 4 (its sigmoid gate is
     * about 0.5); an ungated one (DeepSeek, GLM) adds drift^2, like the
     * routed experts together */
    const double shexp_add = c->n_ff_shexp <= 0 ? 0.0 :
                             c->shexp_gated ? 0.25 * rho2 : sy->drift * sy->drift;
    const double p_moe = sy->drift * sy->drift + shexp_add;
    const double p_att = 0.02 * 0.02;
    sy->p_att = p_att;
    /* leading dense layers (DeepSeek, GLM) add drift^2 */
    sy->var_dense_out = sy->drift * sy->drift / ((double)(c->n_ff > 0 ? c->n_ff : 1) * SILU2);
    sy->var_exp_out = rho2 / ((double)c->n_ff_exp * SILU2);
    sy->var_ffn_out = c->n_ff_shexp > 0 ? (c->shexp_gated ? rho2 : shexp_add) /
                                          ((double)c->n_ff_shexp * SILU2) :
                      rho2 / ((double)(c->n_ff > 0 ? c->n_ff : 1) * SILU2);
    sy->var_att_in = shoal_xcalloc((size_t)L, sizeof(double));
    for (int64_t il = 0; il < L; il++) {
        /* Expected per-channel variance (off c0) of the residual before this
         * layer's attention and before its ffn_norm. The norms divide by the
         * rms of all channels, c0 included, so the share c0 keeps after the
         * norm (u0^2 of n_embd) shrinks with depth; every weight that reads a
         * normed input is scaled by 1 / (n_embd - u0^2) so its outputs keep
         * unit variance (else deeper experts would add ever more to the
         * residual and flatten the routing). */
        double ev_att = 1.0 + (double)il * (p_att + p_moe);
        double u0_att = sy->C / sqrt((sy->C * sy->C + (E - 1) * ev_att) / E);
        sy->var_att_in[il] = 1.0 / (E - u0_att * u0_att);
        double ev = 1.0 + (double)(il + 1) * p_att + (double)il * p_moe;
        double rms2 = (sy->C * sy->C + (E - 1) * ev) / E;
        sy->u0[il] = sy->C / sqrt(rms2);
        sy->sigma[il] = 1.0 / sqrt(E - sy->u0[il] * sy->u0[il]);
        if (!shoal_layer_is_moe(c, il))
            continue;
        double depth = L > 1 ? (double)il / (double)(L - 1) : 0.0;
        int best = 0;
        for (int i = 1; i < t->n_src; i++)
            if (fabs(t->src_depth[i] - depth) < fabs(t->src_depth[best] - depth))
                best = i;
        sy->layer_src[il] = t->src_layer[best];
        for (int64_t e = 0; e < NE; e++)
            perm[e] = (int32_t)e;
        struct rng g = rng_for(sy->seed, 0x9e7, (uint64_t)il, 0);
        for (int64_t e = NE - 1; e > 0; e--) {
            int64_t j = (int64_t)(rng_next(&g) % (uint64_t)(e + 1));
            int32_t tmp = perm[e];
            perm[e] = perm[j];
            perm[j] = tmp;
        }
        /* rank j of the trace goes to expert perm[j] */
        for (int64_t j = 0; j < NE; j++) {
            sy->layer_target[il * NE + perm[j]] = t->shares[best][j];
            sy->layer_bias[il * NE + perm[j]] = bias_src[best][j];
        }
        if (grouped) {
            /* an expert's inclusion depends on its group mates, so the
             * biases fitted in rank order do not carry over to this layer's
             * permutation: fit them again in place */
            double w2, e;
            inclusion_targets(sy->layer_target + il * NE, NE, K, pi);
            calibrate(&rt, pi, sy->seed, sy->layer_bias + il * NE, &w2, &e);
            if (e > sy->layer_err)
                sy->layer_err = e;
            sy->n_layer_fits++;
        }
    }
    free(pi);
    double ev_out = 1.0 + (double)L * (p_att + p_moe);
    /* logits std about 2: out_norm zeroes c0, the rest carries E*ev/(1+ev) */
    sy->var_head = 4.0 / (E * ev_out / (1.0 + ev_out));
    free(perm);
    for (int i = 0; i < t->n_src; i++)
        free(bias_src[i]);
    return 0;
}

static void synth_usage(FILE *f)
{
    fprintf(f,
        "usage: shoal synth [--out] DST --gb N [options]\n"
        "       shoal synth --check [--model] DIR [options]\n"
        "\n"
        "Writes a synthetic container (docs/FORMAT.md) with a real architecture's\n"
        "shapes, scaled in layer count to about N GB, random but well-formed weights,\n"
        "and a router whose expert frequencies follow a real routing trace\n"
        "(docs/BENCHMARKS.md). The same options give the same bytes.\n"
        "\n"
        "  --out DST, DST       the container directory to write\n"
        "  --gb N               target container size in GB (1e9 bytes), e.g. 8 or 0.005\n"
        "  --family F           qwen3_moe (default), olmoe, mixtral, qwen2_moe, or, with\n"
        "                       every key of the real config.json: deepseek_v3\n"
        "                       (DeepSeek-V3-Base), kimi_k2 (Kimi-K2-Instruct), glm4_moe\n"
        "                       (GLM-4.5-Air), deepseek_v2 (DeepSeek-V2-Lite), gpt_oss\n"
        "                       (gpt-oss-20b)\n"
        "  --config FILE        a real config.json of any supported family as the\n"
        "                       template instead (quantization_config dropped)\n"
        "  --experts T          int4 (default), int4a8, int8, bf16, f32 (not fp8)\n"
        "  --dense T            int8 (default), int4a8, int4, bf16, f32 (1-D tensors stay\n"
        "                       f32; routers stay int8 under int4/int4a8)\n"
        "  --group G            quantization group, 32, 64 (default) or 128\n"
        "  --seed S             generator seed (default 1)\n"
        "  --trace T            olmoe (default), mixtral: expert counts of a real trace\n"
        "                       (shared/data/traces); uniform; zipf (built in, --zipf S)\n"
        "  --trace-file FILE    expert_counts.json (default: ../shared/data/traces/...)\n"
        "  --domain D           trace domain or all (default: all domains summed)\n"
        "  --zipf S             exponent of --trace zipf (default 1.0)\n"
        "  --drift D            rms a MoE block adds to the residual, relative to the\n"
        "                       embedding (default 0.3; sets router lookahead accuracy)\n"
        "  --layers N           layer count (default: from --gb)\n"
        "  --n-expert N, --top-k K, --hidden N, --moe-ff N, --heads N, --kv-heads N,\n"
        "  --head-dim N, --vocab N   override the family's shapes (vocab default 32000;\n"
        "                       the real one for config families; shapes shrink\n"
        "                       automatically when --gb is too small)\n"
        "  --ff N, --q-lora N, --kv-lora N, --rope-dim N, --n-group N, --topk-group N,\n"
        "  --dense-layers N     the same for config families: dense intermediate_size,\n"
        "                       MLA ranks and qk_rope_head_dim (--head-dim sets\n"
        "                       qk_nope and v), expert groups, first_k_dense_replace\n"
        "                       (default 1 where the real config has dense layers)\n"
        "  --force              replace an existing DST\n"
        "\n"
        "--check DIR: decode on a container and report finite logits, timings and\n"
        "(synthetic containers) achieved vs target expert frequencies. Takes the\n"
        "engine, store and cluster flags of 'shoal run' (listed below) and:\n"
        "  --model DIR, DIR     the container to check\n"
        "  --seed S             prompt seed (default 1)\n"
        "  --prompt-len N       random prompt tokens (default 16)\n"
        "  --warmup N           decode steps before the measured window (default 0)\n"
        "  --decode N           measured decode steps (default 32)\n"
        "  --preload            read every expert once before decoding (warm cache)\n"
        "  --keep-counts        keep DIR/routing_counts.json (default: start it afresh\n"
        "                       so it holds this run's routing)\n"
        "  --json FILE          write the results as JSON\n"
        "  --routing-out FILE   write per-layer target and achieved expert shares\n"
        "  --isa auto|scalar|avx2|avx512|avx512-zen4|avx512bw|neon|neon-dotprod|neon-i8mm\n"
        "                       use these quant kernels instead of the best this CPU\n"
        "                       has (same bits, another speed)\n"
        "  --ctx N              context length (default: what the prompt and steps need)\n"
        "  --kv f32|f16|bf16    KV cache dtype (default: the container's, else f32)\n"
        "  --batch N            prefill chunk in tokens (default 256; the same bits at any)\n"
        "  --threads N          compute threads (default: all cores)\n"
        "  -v, --verbose        print what was loaded\n"
        "\nExpert store:\n");
    shoal_session_usage_store(f);
}

static int check_main(int argc, char **argv);

int shoal_cmd_synth(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--check"))
            return check_main(argc, argv);
    const char *dst = NULL, *family = "qwen3_moe", *trace = "olmoe", *domain = "all";
    const char *trace_file = DEFAULT_TRACE_FILE, *config_path = NULL;
    double gb = 0, drift = 0.3, zipf_s = 1.0;
    long long seed = 1, group = 64;
    int64_t ov_dense = -1;
    struct shape ov;
    memset(&ov, 0, sizeof ov);
    int family_given = 0;
    enum shoal_dtype ed = SHOAL_DTYPE_INT4, dd = SHOAL_DTYPE_INT8;
    int force = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            synth_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--force")) {
            force = 1;
            continue;
        }
        if (a[0] != '-') {
            if (shoal_cli_take_path("synth", "output directory", a, &dst) < 0)
                return 2;
            continue;
        }
        if (i + 1 >= argc) {
            shoal_cli_error("%s needs a value (see 'shoal synth --help')", a);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--out")) {
            if (shoal_cli_take_path("synth", "output directory", v, &dst) < 0)
                return 2;
            continue;
        }
        long long n;
        struct {
            const char *flag;
            int64_t *dst;
            long long lo, hi;
        } ints[] = {
            {"--layers", &ov.layers, 1, SHOAL_MAX_LAYERS},
            {"--n-expert", &ov.n_expert, 1, 4096},
            {"--top-k", &ov.top_k, 1, 64},
            {"--hidden", &ov.hidden, 16, 65536},
            {"--moe-ff", &ov.moe_ff, 8, 1 << 20},
            {"--heads", &ov.heads, 1, 1024},
            {"--kv-heads", &ov.kv_heads, 1, 1024},
            {"--head-dim", &ov.head_dim, 8, 1024},
            {"--vocab", &ov.vocab, 16, 1 << 24},
            {"--ff", &ov.ff, 8, 1 << 20},
            {"--q-lora", &ov.q_lora, 8, 1 << 16},
            {"--kv-lora", &ov.kv_lora, 8, 1 << 16},
            {"--rope-dim", &ov.rope_dim, 2, 1024},
            {"--n-group", &ov.n_group, 1, 4096},
            {"--topk-group", &ov.topk_group, 1, 4096},
            {"--dense-layers", &ov_dense, 0, SHOAL_MAX_LAYERS},
        };
        int matched = 0;
        for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++) {
            if (strcmp(a, ints[k].flag))
                continue;
            if (shoal_cli_parse_i64(a, v, ints[k].lo, ints[k].hi, &n))
                return 2;
            *ints[k].dst = n;
            matched = 1;
        }
        if (matched)
            continue;
        if (!strcmp(a, "--gb")) {
            if (shoal_cli_parse_f64(a, v, 1e-4, 1e5, &gb))
                return 2;
        } else if (!strcmp(a, "--family")) {
            family = v;
            family_given = 1;
        } else if (!strcmp(a, "--config")) {
            config_path = v;
        } else if (!strcmp(a, "--experts")) {
            if (shoal_cli_parse_dtype(a, v, &ed))
                return 2;
        } else if (!strcmp(a, "--dense")) {
            if (shoal_cli_parse_dtype(a, v, &dd))
                return 2;
        } else if (!strcmp(a, "--group")) {
            int g;
            if (shoal_cli_parse_group(a, v, &g))
                return 2;
            group = g;
        } else if (!strcmp(a, "--seed")) {
            if (shoal_cli_parse_i64(a, v, 0, INT64_MAX, &seed))
                return 2;
        } else if (!strcmp(a, "--trace")) {
            trace = v;
        } else if (!strcmp(a, "--trace-file")) {
            trace_file = v;
        } else if (!strcmp(a, "--domain")) {
            domain = v;
        } else if (!strcmp(a, "--zipf")) {
            if (shoal_cli_parse_f64(a, v, 0, 10, &zipf_s))
                return 2;
        } else if (!strcmp(a, "--drift")) {
            if (shoal_cli_parse_f64(a, v, 0, 10, &drift))
                return 2;
        } else {
            shoal_cli_error("synth: unknown option '%s' (see 'shoal synth --help')", a);
            return 2;
        }
    }
    if (!dst || gb <= 0) {
        shoal_cli_error("synth: usage: shoal synth DST --gb N [options]");
        return 2;
    }
    if (ed == SHOAL_DTYPE_FP8 || dd == SHOAL_DTYPE_FP8 || ed == SHOAL_DTYPE_MXFP4 ||
        dd == SHOAL_DTYPE_MXFP4) {
        const int fp8 = ed == SHOAL_DTYPE_FP8 || dd == SHOAL_DTYPE_FP8;
        shoal_cli_error("synth: --%s %s is not written (shoal keeps %s only from %s "
                        "checkpoints); expected int4a8, int4, int8, bf16 or f32",
                        ed == SHOAL_DTYPE_FP8 || ed == SHOAL_DTYPE_MXFP4 ? "experts" : "dense",
                        fp8 ? "fp8" : "mxfp4", fp8 ? "FP8" : "MXFP4", fp8 ? "FP8" : "MXFP4");
        return 2;
    }
    if (config_path && family_given) {
        shoal_cli_error("synth: --config and --family are exclusive (the config names its "
                        "model_type)");
        return 2;
    }
    /* the family: a built-in table row (fam), or a real config.json as the
     * template of the one written (tmpl, with tfam its descriptor) */
    const struct fam_shape *fam = NULL;
    json_t *tmpl = NULL;
    const struct shoal_family *tfam = NULL;
    const char *model_type = family;
    for (size_t k = 0; !config_path && k < sizeof fams / sizeof fams[0]; k++)
        if (!strcmp(fams[k].model_type, family))
            fam = &fams[k];
    json_error_t jerr;
    if (config_path) {
        tmpl = json_load_file(config_path, 0, &jerr);
        if (!tmpl) {
            if (jerr.line < 0)   /* not opened or not read: no line to name */
                shoal_cli_error("synth: cannot read --config '%s': %s", config_path,
                                jerr.text);
            else
                shoal_cli_error("synth: cannot read --config '%s': %s (line %d)", config_path,
                                jerr.text, jerr.line);
            return 2;
        }
    } else if (!fam) {
        for (size_t k = 0; k < sizeof tmpls / sizeof tmpls[0]; k++)
            if (!strcmp(tmpls[k].model_type, family))
                tmpl = json_loads(tmpls[k].json, 0, &jerr);
        if (!tmpl) {
            shoal_cli_error("--family expects qwen3_moe, olmoe, mixtral, qwen2_moe, "
                            "deepseek_v3, kimi_k2, glm4_moe, deepseek_v2 or gpt_oss, got '%s'",
                            family);
            return 2;
        }
    }
    if (tmpl) {
        model_type = json_string_value(json_object_get(tmpl, "model_type"));
        tfam = model_type ? shoal_family_find(model_type) : NULL;
        if (!tfam || !json_is_integer(json_object_get(tmpl, tfam->key_n_expert))) {
            shoal_cli_error("synth: '%s': model_type %s%s%s is not a supported MoE family "
                            "(expected one of %s, with %s)", config_path ? config_path : family,
                            model_type ? "'" : "", model_type ? model_type : "missing",
                            model_type ? "'" : "", shoal_family_list(),
                            tfam ? tfam->key_n_expert : "its expert count");
            json_decref(tmpl);
            return 2;
        }
    }
    if (strcmp(trace, "olmoe") && strcmp(trace, "mixtral") && strcmp(trace, "uniform") &&
        strcmp(trace, "zipf")) {
        shoal_cli_error("--trace expects olmoe, mixtral, uniform or zipf, got '%s'", trace);
        json_decref(tmpl);
        return 2;
    }
    if (shoal_exists(dst) && !force) {
        shoal_cli_error("synth: '%s' already exists; pass --force to replace it", dst);
        json_decref(tmpl);
        return 1;
    }

    /* shapes: the family's, overridden, then shrunk until two layers (a
     * template family: its leading dense layers and one MoE layer) fit */
    struct shape sh;
    if (tmpl) {
        shape_from_tmpl(tmpl, tfam, &sh);
    } else {
        struct shape fs = {fam->hidden, fam->heads, fam->kv_heads, fam->head_dim, fam->moe_ff,
                           fam->n_expert, fam->top_k, fam->shexp_ff, 32000, 1, 0, 0, 0, 0, 1, 1, 0};
        sh = fs;
    }
    const int olmoe = !strcmp(model_type, "olmoe");
    const int mla = tfam && tfam->mla;
    const uint64_t target = (uint64_t)(gb * 1e9);
    struct shoal_err err = {0};
    struct shoal_model_config cfg;
    struct measure ms = {.dense = dd, .experts = ed, .group = (int)group};
    uint64_t fixed = 0, per_layer = 0, b[2];
    for (;;) {
#define OV(f) if (ov.f) sh.f = ov.f
        OV(hidden); OV(heads); OV(kv_heads); OV(head_dim); OV(moe_ff); OV(n_expert);
        OV(top_k); OV(vocab); OV(ff); OV(q_lora); OV(kv_lora); OV(rope_dim); OV(n_group);
        OV(topk_group);
#undef OV
        if (tmpl && ov_dense >= 0)
            sh.dense_layers = ov_dense;
        if (olmoe)
            sh.head_dim = sh.hidden / sh.heads;
        if (sh.top_k > sh.n_expert)
            sh.top_k = sh.n_expert;
        if (mla)
            sh.kv_heads = sh.heads;
        if (sh.heads % sh.kv_heads)
            sh.kv_heads = sh.heads;
        /* groups divide the experts, hold at least two each (noaux_tc ranks
         * a group by its two best) and, kept, at least top-k experts */
        if (sh.n_expert % sh.n_group || sh.n_expert / sh.n_group < 2)
            sh.n_group = 1;
        if (sh.topk_group > sh.n_group || sh.n_group == 1 ||
            sh.topk_group * (sh.n_expert / sh.n_group) < sh.top_k)
            sh.topk_group = sh.n_group;
        for (int k = 0; k < 2; k++) {
            sh.layers = sh.dense_layers + k + 1;
            json_t *c = tmpl ? apply_shapes(tmpl, tfam, &sh) : make_config(fam, &sh);
            int rc = parse_config(c, &cfg, &err);
            json_decref(c);
            if (rc) {
                shoal_cli_error("synth: %s", err.msg);
                json_decref(tmpl);
                return 2;
            }
            b[k] = measure_cfg(&cfg, &ms);
        }
        per_layer = b[1] - b[0];
        fixed = b[0] - per_layer;
        int any_ov = ov.hidden || ov.moe_ff || ov.vocab || ov.head_dim || ov.heads || ov.ff ||
                     ov.q_lora || ov.kv_lora || ov.rope_dim;
        if (any_ov || (tmpl ? b[0] : fixed + 2 * per_layer) <= target || sh.hidden <= 64)
            break;
        /* too small for real shapes: halve the widths */
        sh.hidden /= 2;
        sh.moe_ff /= 2;
        sh.shexp_ff /= 2;
        sh.ff /= 2;
        if (sh.q_lora > 16)
            sh.q_lora /= 2;
        if (sh.kv_lora > 16)
            sh.kv_lora /= 2;
        if (sh.rope_dim > 16)
            sh.rope_dim /= 2;
        if (sh.head_dim > 32 && !olmoe)
            sh.head_dim /= 2;
        else if (sh.heads > 2)
            sh.heads /= 2;
        if (sh.kv_heads > sh.heads)
            sh.kv_heads = sh.heads;
        if (sh.vocab > 4096)
            sh.vocab = 4096;
    }
    if (ov.layers) {
        sh.layers = ov.layers;
        if (sh.dense_layers >= sh.layers)
            sh.dense_layers = sh.layers - 1;
    } else {
        double nl = target > fixed ? (double)(target - fixed) / (double)per_layer : 1.0;
        int64_t n_moe = (int64_t)(nl + 0.5);
        if (n_moe < 1)
            n_moe = 1;
        sh.layers = sh.dense_layers + n_moe;
        if (sh.layers > SHOAL_MAX_LAYERS)
            sh.layers = SHOAL_MAX_LAYERS;
    }

    struct synth sy;
    memset(&sy, 0, sizeof sy);
    sy.sh = sh;
    sy.experts_dtype = ed;
    sy.dense_dtype = dd;
    sy.group = (int)group;
    sy.seed = (uint64_t)seed;
    sy.drift = drift;
    sy.tty = isatty(2);
    sy.err = &err;
    sy.fd_dense = sy.fd_exp = -1;
    sy.config = tmpl ? apply_shapes(tmpl, tfam, &sh) : make_config(fam, &sh);
    json_decref(tmpl);
    tmpl = NULL;
    if (tfam) /* the template's string is gone: the copy's */
        model_type = json_string_value(json_object_get(sy.config, "model_type"));
    if (parse_config(sy.config, &sy.cfg, &err)) {
        shoal_cli_error("synth: %s", err.msg);
        json_decref(sy.config);
        return 2;
    }
    sy.c0 = sy.cfg.n_embd - 1;
    sy.C = sqrt((double)(sy.cfg.n_embd - 1));
    sy.lay = ms;
    sy.total = measure_cfg(&sy.cfg, &sy.lay);

    double t_plan = shoal_time_s();
    int rc = plan_routing(&sy, trace, trace_file, domain, zipf_s);
    t_plan = shoal_time_s() - t_plan;
    if (rc) {
        shoal_cli_error("synth: %s", err.msg);
        json_decref(sy.config);
        return 1;
    }
    fprintf(stderr, "shoal: synth %s: %s, %lld layers, %lld experts top-%lld, hidden %lld, "
            "moe_ff %lld, heads %lld/%lld x %lld, vocab %lld; experts %s, dense %s; "
            "%.2f GB (blob %" PRIu64 " bytes)\n", dst, model_type,
            (long long)sh.layers, (long long)sh.n_expert, (long long)sy.cfg.n_expert_used,
            (long long)sh.hidden, (long long)sh.moe_ff, (long long)sy.cfg.n_head,
            (long long)sy.cfg.n_head_kv, (long long)sy.cfg.head_dim, (long long)sh.vocab,
            shoal_dtype_name(ed), shoal_dtype_name(dd), (double)sy.total / 1e9,
            sy.lay.blob_bytes);
    fprintf(stderr, "shoal: synth routing: trace %s (%s), router calibrated in %.2f s "
            "(Monte Carlo, %d tokens):", trace, domain, t_plan, MC_TOKENS);
    for (int i = 0; i < sy.trace.n_src; i++)
        fprintf(stderr, "%s trace layer %d worst inclusion error %.1f%%", i ? ";" : "",
                sy.trace.src_layer[i], 100 * sy.calib_err[i]);
    if (sy.n_layer_fits)
        fprintf(stderr, "; group-limited router: refitted for each of %d MoE layers' expert "
                "permutation, worst inclusion error %.1f%%", sy.n_layer_fits,
                100 * sy.layer_err);
    fprintf(stderr, "\n");

    size_t dl = strlen(dst);
    char *tmp = shoal_xmalloc(dl + 32);
    snprintf(tmp, dl + 32, "%s.tmp-%ld", dst, (long)getpid());
    rm_dir(tmp);
    json_t *manifest = NULL, *meta = NULL;
    char *p_cfg = NULL, *p_meta = NULL, *p_man = NULL;
    if (mkdir(tmp, 0755) != 0) {
        int e = errno;
        shoal_cli_error("synth: cannot create '%s': %s", tmp, strerror(e));
        free(tmp);
        json_decref(sy.config);
        return 1;
    }
    sy.dense_path = shoal_path_join(tmp, "dense.bin");
    sy.exp_path = shoal_path_join(tmp, "experts.bin");
    sy.tensors = json_array();
    sy.layers = json_array();
    sy.fp = XXH64_createState();
    XXH64_reset(sy.fp, 0);
    sy.batch_blobs = (int64_t)(BATCH_BYTES / sy.lay.blob_bytes);
    if (sy.batch_blobs < 2)
        sy.batch_blobs = 2;
    if (sy.batch_blobs > sy.cfg.n_expert)
        sy.batch_blobs = sy.cfg.n_expert;
    sy.sums = shoal_xmalloc((size_t)sy.batch_blobs * sizeof *sy.sums);
    for (int b = 0; b < 2; b++) {
        if (posix_memalign((void **)&sy.bufs[b], SHOAL_CONTAINER_ALIGN,
                           (size_t)sy.batch_blobs * sy.lay.blob_bytes) != 0) {
            sy.bufs[b] = NULL;
            rc = shoal_err_set(&err, SHOAL_ENOMEM, "cannot allocate %" PRIu64 " bytes",
                               (uint64_t)sy.batch_blobs * sy.lay.blob_bytes);
            goto fail;
        }
    }
    sy.fd_dense = open(sy.dense_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    /* experts.bin: O_DIRECT where the file system allows it (every batch is
     * 4 KiB aligned in memory, length and offset): large writes without
     * the page cache, which is several times faster here than buffered */
#ifdef O_DIRECT
    sy.fd_exp = open(sy.exp_path, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
    sy.exp_direct = sy.fd_exp >= 0;
    if (sy.fd_exp < 0 && errno == EINVAL)
#endif
        sy.fd_exp = open(sy.exp_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (sy.fd_dense < 0 || sy.fd_exp < 0) {
        int e = errno;
        rc = shoal_err_set(&err, -e, "cannot create files in '%s': %s", tmp, strerror(e));
        goto fail;
    }
    pthread_mutex_init(&sy.wmu, NULL);
    pthread_cond_init(&sy.wcv, NULL);
    sy.wmu_init = 1;
    if (pthread_create(&sy.wthread, NULL, writer_main, &sy) != 0) {
        rc = shoal_err_set(&err, SHOAL_EIO, "cannot start the writer thread");
        goto fail;
    }
    sy.wstarted = 1;
    sy.dense_off = SHOAL_CONTAINER_HEADER_BYTES;
    sy.exp_off = SHOAL_CONTAINER_HEADER_BYTES;
    fp_add(&sy, "shoal-container %d %s experts %s %d %" PRIu64 "\n", SHOAL_CONTAINER_VERSION,
           model_type, shoal_dtype_name(ed), sy.group, sy.lay.blob_bytes);
    sy.t0 = shoal_time_s();
    {
        struct shoal_model model;
        memset(&model, 0, sizeof model);
        model.cfg = sy.cfg;
        shoal_model_alloc_layers(&model);
        rc = shoal_model_walk(&model, write_slot, &sy);
        for (int64_t il = 0; il < sy.cfg.n_layer; il++)
            free(model.layers[il].experts);
        free(model.layers);
    }
    if (!rc)
        rc = writer_wait(&sy);
    writer_stop(&sy);
    if (rc)
        goto fail;
    uint64_t fingerprint = XXH64_digest(sy.fp);
    uint64_t dense_bytes = align_up(sy.dense_off, SHOAL_CONTAINER_ALIGN);
    double t_sync = shoal_time_s();
    if (ftruncate(sy.fd_dense, (off_t)dense_bytes) != 0) {
        int e = errno;
        rc = shoal_err_set(&err, -e, "cannot size '%s': %s", sy.dense_path, strerror(e));
        goto fail;
    }
    if (sy.exp_direct) {
        /* the header is one small unaligned write: through the page cache */
        rc = sync_close(sy.fd_exp, sy.exp_path, &err);
        sy.fd_exp = rc ? -1 : open(sy.exp_path, O_WRONLY);
        if (!rc && sy.fd_exp < 0) {
            int e = errno;
            rc = shoal_err_set(&err, -e, "cannot reopen '%s': %s", sy.exp_path, strerror(e));
        }
        if (rc)
            goto fail;
    }
    if ((rc = shoal_container_write_header(sy.fd_dense, MAGIC_DENSE, dense_bytes, fingerprint, sy.dense_path,
                           &err)) ||
        (rc = shoal_container_write_header(sy.fd_exp, MAGIC_EXPERTS, sy.exp_off, fingerprint, sy.exp_path,
                           &err)))
        goto fail;
    rc = sync_close(sy.fd_dense, sy.dense_path, &err);
    sy.fd_dense = -1;
    if (!rc)
        rc = sync_close(sy.fd_exp, sy.exp_path, &err);
    sy.fd_exp = -1;
    if (rc)
        goto fail;
    t_sync = shoal_time_s() - t_sync;
    double t_all = shoal_time_s() - sy.t0;

    /* config.json, synth.json (how it was made, the routing targets), then
     * the manifest last */
    p_cfg = shoal_path_join(tmp, "config.json");
    p_meta = shoal_path_join(tmp, "synth.json");
    p_man = shoal_path_join(tmp, "shoal.json");
    if ((rc = dump_json(sy.config, p_cfg, &err)))
        goto fail;
    {
        const int64_t NE = sy.cfg.n_expert;
        json_t *lt = json_array();
        for (int64_t il = 0; il < sy.cfg.n_layer; il++) {
            if (!shoal_layer_is_moe(&sy.cfg, il))
                continue;
            json_t *sh_arr = json_array();
            for (int64_t e = 0; e < NE; e++)
                json_array_append_new(sh_arr, json_real(sy.layer_target[il * NE + e]));
            json_array_append_new(lt, json_pack("{s:I, s:i, s:f, s:o}", "layer",
                                                (json_int_t)il, "trace_layer",
                                                sy.layer_src[il], "u0", sy.u0[il],
                                                "target_share", sh_arr));
        }
        char cmdline[2048] = "";
        for (int i = 0; i < argc; i++) {
            strncat(cmdline, i ? " " : "shoal ", sizeof cmdline - strlen(cmdline) - 1);
            strncat(cmdline, argv[i], sizeof cmdline - strlen(cmdline) - 1);
        }
        meta = json_pack("{s:s, s:i, s:s, s:s, s:I, s:s, s:s, s:s, s:s, s:i, s:f, s:I, s:f, "
                         "s:I, s:I, s:f, s:f, s:f, s:o}",
                         "format", "shoal-synth", "version", 1, "command", cmdline,
                         "family", model_type, "seed", (json_int_t)seed, "trace", trace,
                         "domain", domain, "experts_dtype", shoal_dtype_name(ed),
                         "dense_dtype", shoal_dtype_name(dd), "group", sy.group,
                         "drift", drift, "bias_channel", (json_int_t)sy.c0,
                         "bias_channel_value", sy.C,
                         "bytes", (json_int_t)sy.total,
                         "blob_bytes", (json_int_t)sy.lay.blob_bytes,
                         "generate_seconds", sy.t_gen, "write_seconds", sy.wbusy + t_sync,
                         "total_seconds", t_all, "layers", lt);
        if ((rc = dump_json(meta, p_meta, &err)))
            goto fail;
    }
    {
        char fph[17];
        snprintf(fph, sizeof fph, "%016" PRIx64, fingerprint);
        json_t *comps = json_array();
        static const char *cn[6] = {"w_gate", "w_up", "w_down", "b_gate", "b_up", "b_down"};
        for (int c = 0; c < sy.lay.n_comp; c++) {
            json_t *jc = json_pack("{s:s, s:I, s:I}", "name", cn[c], "offset",
                                   (json_int_t)sy.lay.comp_off[c], "bytes",
                                   (json_int_t)sy.lay.comp_bytes[c]);
            if (c >= 3)   /* as convert records them */
                json_object_set_new(jc, "dtype",
                                    json_string(shoal_dtype_name(sy.lay.comp_dtype[c])));
            json_array_append_new(comps, jc);
        }
        manifest = json_pack(
            "{s:s, s:i, s:s, s:s, s:O, s:[s], s:{s:s, s:I, s:o}, "
            "s:{s:s, s:I, s:s, s:i, s:I, s:I, s:I, s:o, s:o}}",
            "format", "shoal-container", "version", SHOAL_CONTAINER_VERSION,
            "model_type", model_type, "fingerprint", fph, "config", sy.config,
            "files", "config.json",
            "dense", "file", "dense.bin", "bytes", (json_int_t)dense_bytes, "tensors", sy.tensors,
            "experts", "file", "experts.bin", "bytes", (json_int_t)sy.exp_off, "dtype",
            shoal_dtype_name(ed), "group", sy.group, "blob_bytes", (json_int_t)sy.lay.blob_bytes,
            "n_layer", (json_int_t)sy.cfg.n_layer, "n_expert", (json_int_t)sy.cfg.n_expert,
            "components", comps, "layers", sy.layers);
        sy.tensors = sy.layers = NULL; /* owned by the manifest */
        if (!manifest) {
            rc = shoal_err_set(&err, SHOAL_ENOMEM, "cannot build the manifest");
            goto fail;
        }
        if ((rc = dump_json(manifest, p_man, &err)))
            goto fail;
    }
    if (shoal_exists(dst)) {
        char *old = shoal_xmalloc(dl + 32);
        snprintf(old, dl + 32, "%s.old-%ld", dst, (long)getpid());
        if (rename(dst, old) != 0) {
            int e = errno;
            rc = shoal_err_set(&err, -e, "cannot move the old '%s' aside: %s", dst, strerror(e));
            free(old);
            goto fail;
        }
        if (rename(tmp, dst) != 0) {
            int e = errno;
            rename(old, dst);
            rc = shoal_err_set(&err, -e, "cannot publish '%s': %s", dst, strerror(e));
            free(old);
            goto fail;
        }
        rm_dir(old);
        free(old);
    } else if (rename(tmp, dst) != 0) {
        int e = errno;
        rc = shoal_err_set(&err, -e, "cannot publish '%s': %s", dst, strerror(e));
        goto fail;
    }
    fprintf(stderr, "shoal: synth wrote %s: %.2f GB in %.1f s (%.0f MB/s; generate+hash "
            "%.1f s = %.0f MB/s; writer busy %.1f s%s, waited for %.1f s; sync %.1f s), "
            "fingerprint %016" PRIx64 "\n", dst, (double)sy.total / 1e9, t_all,
            (double)sy.total / 1e6 / t_all, sy.t_gen,
            (double)sy.total / 1e6 / (sy.t_gen > 0 ? sy.t_gen : 1e-9), sy.wbusy,
            sy.exp_direct ? ", O_DIRECT" : "", sy.t_write, t_sync, fingerprint);
    goto done;
fail:
    writer_stop(&sy);
    shoal_cli_error("synth: %s", err.msg);
    if (sy.fd_dense >= 0)
        close(sy.fd_dense);
    if (sy.fd_exp >= 0)
        close(sy.fd_exp);
    rm_dir(tmp);
    if (!rc)
        rc = 1;
done:
    json_decref(manifest);
    json_decref(meta);
    json_decref(sy.config);
    json_decref(sy.tensors);
    json_decref(sy.layers);
    if (sy.fp)
        XXH64_freeState(sy.fp);
    trace_free(&sy.trace);
    free(sy.layer_src);
    free(sy.layer_target);
    free(sy.layer_bias);
    free(sy.u0);
    free(sy.sigma);
    free(sy.var_att_in);
    free(sy.rowbuf);
    free(sy.chunk);
    free(sy.bufs[0]);
    free(sy.bufs[1]);
    if (sy.wmu_init) {
        pthread_mutex_destroy(&sy.wmu);
        pthread_cond_destroy(&sy.wcv);
    }
    free(sy.sums);
    free(sy.dense_path);
    free(sy.exp_path);
    free(p_cfg);
    free(p_meta);
    free(p_man);
    free(tmp);
    return rc ? 1 : 0;
}

/* ---- --check: decode and measure ---------------------------------------------- */

struct routing_summary {
    int have;
    int64_t n_layers;
    double tokens;          /* routed tokens per layer (counts / k) */
    double tv, tv_noise;    /* mean total variation distance; its sampling floor */
    double top8_target, top8_achieved;  /* share of the hottest n/8 experts (by target) */
    double top1_target, top1_achieved;  /* mean over layers of the largest share */
    double uniform;         /* 1 / n_expert */
};

/* Compare DIR/routing_counts.json (this run's routing) with synth.json's
 * targets; optionally write both per layer to out_path. */
static int routing_compare(const char *dir, const char *out_path, struct routing_summary *rs)
{
    memset(rs, 0, sizeof *rs);
    char *pc = shoal_path_join(dir, "routing_counts.json");
    char *pt = shoal_path_join(dir, "synth.json");
    json_error_t jerr;
    json_t *jc = json_load_file(pc, 0, &jerr);
    json_t *jt = json_load_file(pt, 0, &jerr);
    free(pc);
    free(pt);
    json_t *counts = json_object_get(jc, "counts");
    json_t *tl = json_object_get(jt, "layers");
    json_t *out = json_array();
    int rc = -1;
    if (!json_is_array(counts))
        goto done;
    int64_t k = 1;
    {
        char *pcfg = shoal_path_join(dir, "config.json");
        json_t *cf = json_load_file(pcfg, 0, &jerr);
        free(pcfg);
        k = json_integer_value(json_object_get(cf, "num_experts_per_tok"));
        json_decref(cf);
        if (k < 1)
            k = 1;
    }
    for (size_t il = 0; il < json_array_size(counts); il++) {
        json_t *row = json_array_get(counts, il);
        size_t ne = json_array_size(row);
        double tot = 0;
        for (size_t e = 0; e < ne; e++)
            tot += json_number_value(json_array_get(row, e));
        if (tot <= 0 || ne == 0)
            continue;
        json_t *tgt = NULL;
        for (size_t j = 0; json_is_array(tl) && j < json_array_size(tl); j++) {
            json_t *l = json_array_get(tl, j);
            if ((size_t)json_integer_value(json_object_get(l, "layer")) == il)
                tgt = json_object_get(l, "target_share");
        }
        double *a = shoal_xmalloc(ne * sizeof *a), *t = shoal_xmalloc(ne * sizeof *t);
        int32_t *ord = shoal_xmalloc(ne * sizeof *ord);
        for (size_t e = 0; e < ne; e++) {
            a[e] = json_number_value(json_array_get(row, e)) / tot;
            t[e] = json_is_array(tgt) && json_array_size(tgt) == ne
                       ? json_number_value(json_array_get(tgt, e)) : 1.0 / (double)ne;
        }
        topk(t, (int64_t)ne, (int64_t)ne, ord);
        double tv = 0, floor_ = 0, t8 = 0, a8 = 0, amax = 0, tmax = 0;
        const double m = tot; /* (token, slot) samples */
        for (size_t e = 0; e < ne; e++) {
            tv += 0.5 * fabs(a[e] - t[e]);
            floor_ += 0.5 * sqrt(2.0 / M_PI) * sqrt(t[e] * (1 - t[e]) / m);
            if (a[e] > amax)
                amax = a[e];
            if (t[e] > tmax)
                tmax = t[e];
        }
        size_t n8 = ne / 8 ? ne / 8 : 1;
        for (size_t j = 0; j < n8; j++) {
            t8 += t[ord[j]];
            a8 += a[ord[j]];
        }
        rs->n_layers++;
        rs->tokens = tot / (double)k;
        rs->tv += tv;
        rs->tv_noise += floor_;
        rs->top8_target += t8;
        rs->top8_achieved += a8;
        rs->top1_target += tmax;
        rs->top1_achieved += amax;
        rs->uniform = 1.0 / (double)ne;
        json_t *ja = json_array(), *jtg = json_array();
        for (size_t e = 0; e < ne; e++) {
            json_array_append_new(ja, json_real(a[e]));
            json_array_append_new(jtg, json_real(t[e]));
        }
        json_array_append_new(out, json_pack("{s:I, s:f, s:f, s:o, s:o}", "layer",
                                             (json_int_t)il, "tv", tv, "tv_noise", floor_,
                                             "target", jtg, "achieved", ja));
        free(a);
        free(t);
        free(ord);
    }
    if (rs->n_layers) {
        double n = (double)rs->n_layers;
        rs->tv /= n;
        rs->tv_noise /= n;
        rs->top8_target /= n;
        rs->top8_achieved /= n;
        rs->top1_target /= n;
        rs->top1_achieved /= n;
        rs->have = 1;
        rc = 0;
    }
    if (out_path && rs->have) {
        json_t *doc = json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:o}", "tokens_per_layer",
                                rs->tokens, "tv", rs->tv, "tv_noise", rs->tv_noise,
                                "top_eighth_target", rs->top8_target, "top_eighth_achieved",
                                rs->top8_achieved, "top1_target", rs->top1_target,
                                "top1_achieved", rs->top1_achieved, "layers", out);
        out = NULL;
        if (json_dump_file(doc, out_path, JSON_INDENT(1)) != 0)
            shoal_cli_error("cannot write '%s'", out_path);
        json_decref(doc);
    }
done:
    json_decref(out);
    json_decref(jc);
    json_decref(jt);
    return rc;
}

static void timings_sub(struct shoal_ctx_timings *d, const struct shoal_ctx_timings *a,
                        const struct shoal_ctx_timings *b)
{
    d->attention = a->attention - b->attention;
    d->routing = a->routing - b->routing;
    d->experts = a->experts - b->experts;
    d->combine = a->combine - b->combine;
    d->head = a->head - b->head;
}

static int check_main(int argc, char **argv)
{
    struct shoal_session_opts so = shoal_session_opts_default();
    long long prompt_len = 16, warmup = 0, decode = 32, seed = 1;
    int preload = 0, keep_counts = 0;
    const char *json_out = NULL, *routing_out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--check"))
            continue;
        int r = shoal_session_parse_flag(&so, argc, argv, &i);
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            synth_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--preload")) {
            preload = 1;
            continue;
        }
        if (!strcmp(a, "--keep-counts")) {
            keep_counts = 1;
            continue;
        }
        if (a[0] != '-') {
            if (shoal_cli_take_path("synth", "container to check", a, &so.model_dir) < 0)
                return 2;
            continue;
        }
        if (i + 1 >= argc) {
            shoal_cli_error("%s needs a value", a);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--prompt-len")) {
            if (shoal_cli_parse_i64(a, v, 1, 1 << 20, &prompt_len))
                return 2;
        } else if (!strcmp(a, "--warmup")) {
            if (shoal_cli_parse_i64(a, v, 0, 1 << 20, &warmup))
                return 2;
        } else if (!strcmp(a, "--decode")) {
            if (shoal_cli_parse_i64(a, v, 1, 1 << 20, &decode))
                return 2;
        } else if (!strcmp(a, "--seed")) {
            if (shoal_cli_parse_i64(a, v, 0, INT64_MAX, &seed))
                return 2;
        } else if (!strcmp(a, "--json")) {
            json_out = v;
        } else if (!strcmp(a, "--routing-out")) {
            routing_out = v;
        } else {
            shoal_cli_error("synth --check: unknown option '%s' (see 'shoal synth --help')", a);
            return 2;
        }
    }
    if (!so.model_dir) {
        shoal_cli_error("synth --check: usage: shoal synth --check DIR [options]");
        return 2;
    }
    const char *dir = so.model_dir;
    if (so.n_ctx == 0)
        so.n_ctx = prompt_len + warmup + decode + 8;
    if (!keep_counts) {
        char *pc = shoal_path_join(dir, "routing_counts.json");
        unlink(pc);
        free(pc);
    }
    int open_rc;
    struct shoal_session *s = shoal_cli_session_open(&so, &open_rc);
    if (!s)
        return open_rc;
    struct shoal_err err = {0};
    const struct shoal_model_config *c = &s->model->cfg;
    const int64_t V = c->n_vocab;
    const int64_t n_tok = prompt_len + warmup + decode;
    int32_t *hist = shoal_xmalloc((size_t)(n_tok + 1) * sizeof *hist);
    float *logits = shoal_xmalloc((size_t)V * sizeof *logits);
    struct rng g = rng_for((uint64_t)seed, 0x9a0, 0, 0);
    for (int64_t i = 0; i < prompt_len; i++)
        hist[i] = (int32_t)(rng_next(&g) % (uint64_t)(V > 1 ? V - 1 : 1));
    int64_t n_hist = prompt_len, nonfinite = 0;
    double max_abs = 0, t_preload = 0;
    uint64_t preload_bytes = 0;
    int rc = 0;
    double t0 = shoal_time_s();
    if (shoal_ctx_eval(s->ctx, hist, prompt_len, logits, 0, &err)) {
        shoal_cli_error("%s", err.msg);
        rc = 1;
        goto out;
    }
    double t_prompt = shoal_time_s() - t0;
    if (preload && s->model->store && s->model->ct) {
        const struct shoal_container *ct = s->model->ct;
        double tp = shoal_time_s();
        for (int64_t il = 0; il < ct->n_layer && !rc; il++) {
            if (ct->layer_offset[il] == UINT64_MAX)
                continue;
            for (int64_t ie = 0; ie < ct->n_expert; ie++) {
                struct shoal_expert_weights w;
                if (shoal_expert_store_acquire(s->model->store, il, ie, &w, &err) < 0) {
                    shoal_cli_error("%s", err.msg);
                    rc = 1;
                    break;
                }
                shoal_expert_store_release(s->model->store, il, ie);
                preload_bytes += ct->blob_bytes;
            }
        }
        t_preload = shoal_time_s() - tp;
        if (rc)
            goto out;
    }
    struct shoal_sampler_params sp = shoal_sampler_params_default();
    sp.seed = (uint64_t)seed;
    struct shoal_sampler *smp = shoal_sampler_create(sp, V);
    struct shoal_ctx_timings tw0 = *shoal_ctx_timings(s->ctx), tm0 = tw0, tm1;
    double t_w0 = shoal_time_s(), t_m0 = t_w0, t_m1 = t_w0;
    for (int64_t step = 0; step < warmup + decode; step++) {
        if (step == warmup) {
            tm0 = *shoal_ctx_timings(s->ctx);
            t_m0 = shoal_time_s();
        }
        for (int64_t v = 0; v < V; v++) {
            if (!isfinite(logits[v]))
                nonfinite++;
            else if (fabs(logits[v]) > max_abs)
                max_abs = fabs(logits[v]);
        }
        int32_t id = shoal_sampler_sample(smp, logits, hist, n_hist);
        hist[n_hist++] = id;
        if (shoal_ctx_eval(s->ctx, &id, 1, logits, 0, &err)) {
            shoal_cli_error("%s", err.msg);
            rc = 1;
            break;
        }
    }
    t_m1 = shoal_time_s();
    tm1 = *shoal_ctx_timings(s->ctx);
    shoal_sampler_free(smp);
    if (rc)
        goto out;
    for (int64_t v = 0; v < V; v++)
        if (!isfinite(logits[v]))
            nonfinite++;
    {
        struct shoal_ctx_timings dm;
        timings_sub(&dm, &tm1, &tm0);
        (void)tw0;
        int64_t n_moe = 0;
        for (int64_t il = 0; il < c->n_layer; il++)
            n_moe += shoal_layer_is_moe(c, il);
        const uint64_t blob = s->model->ct ? s->model->ct->blob_bytes : 0;
        const double per_tok = (double)n_moe * (double)c->n_expert_used * (double)blob;
        const double wall = t_m1 - t_m0;
        int distinct = 0;
        for (int64_t i = prompt_len; i < n_hist; i++) {
            int seen = 0;
            for (int64_t j = prompt_len; j < i && !seen; j++)
                seen = hist[j] == hist[i];
            distinct += !seen;
        }
        /* the session prints --stats at close; routing counts are saved then */
        shoal_cli_session_close(s);
        s = NULL;
        struct routing_summary rs;
        routing_compare(dir, routing_out, &rs);
        printf("check %s: %lld prompt + %lld warm-up + %lld measured decode tokens, quant "
               "kernels %s\n", dir, prompt_len, warmup, decode, shoal_quant_ops_name());
        printf("  logits: %lld non-finite, max |logit| %.3g, %d distinct generated ids\n",
               (long long)nonfinite, max_abs, distinct);
        if (preload)
            printf("  preload: %.1f MB in %.2f s (%.0f MB/s, one expert at a time)\n",
                   (double)preload_bytes / 1e6, t_preload,
                   t_preload > 0 ? (double)preload_bytes / 1e6 / t_preload : 0.0);
        printf("  measured: %.2f tok/s; per token: attention %.2f ms, routing %.2f ms, "
               "experts %.2f ms, combine %.2f ms, head %.2f ms, wall %.2f ms\n",
               wall > 0 ? (double)decode / wall : 0.0, 1e3 * dm.attention / (double)decode,
               1e3 * dm.routing / (double)decode, 1e3 * dm.experts / (double)decode,
               1e3 * dm.combine / (double)decode, 1e3 * dm.head / (double)decode,
               1e3 * wall / (double)decode);
        printf("  expert bytes: %.1f MB per token; %.0f MB/s over the experts stage, %.0f "
               "MB/s over the wall time\n", per_tok / 1e6,
               dm.experts > 0 ? per_tok * (double)decode / 1e6 / dm.experts : 0.0,
               wall > 0 ? per_tok * (double)decode / 1e6 / wall : 0.0);
        if (rs.have)
            printf("  routing (%lld layers, %.0f tokens each): top-1/8 experts take %.1f%% "
                   "of slots (target %.1f%%, uniform 12.5%%); largest share %.2f%% (target "
                   "%.2f%%, uniform %.2f%%); total variation %.3f (sampling floor %.3f)\n",
                   (long long)rs.n_layers, rs.tokens, 100 * rs.top8_achieved,
                   100 * rs.top8_target, 100 * rs.top1_achieved, 100 * rs.top1_target,
                   100 * rs.uniform, rs.tv, rs.tv_noise);
        else
            printf("  routing: n/a (no %s/routing_counts.json, or no synth.json)\n", dir);
        if (json_out) {
            json_t *j = json_pack(
                "{s:s, s:s, s:{s:I, s:I, s:I}, s:I, s:f, s:i, s:f, s:f, s:f, s:f, "
                "s:{s:f, s:f, s:f, s:f, s:f}, s:f, s:f, s:f, s:I}",
                "model", dir, "quant_kernels", shoal_quant_ops_name(), "tokens", "prompt", (json_int_t)prompt_len, "warmup",
                (json_int_t)warmup, "measured", (json_int_t)decode,
                "nonfinite_logits", (json_int_t)nonfinite, "max_abs_logit", max_abs,
                "distinct_ids", distinct, "prompt_seconds", t_prompt,
                "preload_seconds", t_preload, "preload_bytes", (double)preload_bytes,
                "measured_seconds", wall,
                "measured_stage_seconds", "attention", dm.attention, "routing", dm.routing,
                "experts", dm.experts, "combine", dm.combine, "head", dm.head,
                "expert_bytes_per_token", per_tok,
                "expert_bytes_per_s_stage", dm.experts > 0 ? per_tok * (double)decode /
                                                             dm.experts : 0.0,
                "expert_bytes_per_s_wall", wall > 0 ? per_tok * (double)decode / wall : 0.0,
                "blob_bytes", (json_int_t)blob);
            if (rs.have)
                json_object_set_new(j, "routing", json_pack(
                    "{s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "layers",
                    (json_int_t)rs.n_layers, "tokens_per_layer", rs.tokens, "tv", rs.tv,
                    "tv_noise", rs.tv_noise, "top_eighth_target", rs.top8_target,
                    "top_eighth_achieved", rs.top8_achieved, "top1_target", rs.top1_target,
                    "top1_achieved", rs.top1_achieved, "uniform", rs.uniform));
            if (!j || json_dump_file(j, json_out, JSON_INDENT(1)) != 0) {
                shoal_cli_error("cannot write '%s'", json_out);
                rc = 1;
            }
            json_decref(j);
        }
        if (nonfinite)
            rc = 1;
    }
out:
    shoal_cli_session_close(s);
    free(hist);
    free(logits);
    return rc;
}
