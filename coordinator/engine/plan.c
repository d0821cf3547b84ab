/* plan: sizes of a model from its config.json (plan.h). */
#include "plan.h"

#include <jansson.h>
#include <string.h>

#include "model.h"
#include "model_config.h"
#include "quant.h"

#define ALIGN_COMP 64      /* expert components inside a blob (container.c) */
#define ALIGN_BLOB 4096    /* one expert blob (SHOAL_CONTAINER_ALIGN) */
#define MAX_DIM (1 << 24)

/* The architecture the sizes need, from either config parser. */
struct arch {
    int64_t V, E, L, n_mtp, max_pos;
    int tie;
    int mla;
    int64_t H, Hkv, hd;               /* GQA */
    int64_t q_norm, k_norm;           /* QK-norm weight lengths, 0 = none */
    int qkv_bias, o_bias, sinks;      /* gpt_oss: o bias and attention sinks */
    int64_t q_lora, kv_lora, qk_nope, qk_rope, v_hd;   /* MLA */
    int64_t n_ff, n_ff_exp, n_ff_shexp;
    int shexp_gate;                   /* qwen2_moe's sigmoid gate [1, E] */
    int router_bias;                  /* e_score_correction_bias or router bias */
    int expert_bias;                  /* gpt_oss: biases of gate_up and down */
    int64_t n_expert, n_used, n_shared;
    uint8_t is_moe[SHOAL_MAX_LAYERS];
};

/* ---- the families shoal runs: the same parse as convert ----------------- */

static void from_config(const struct shoal_model_config *c, struct arch *a)
{
    a->V = c->n_vocab, a->E = c->n_embd, a->L = c->n_layer, a->max_pos = c->max_pos;
    a->tie = c->tie_embeddings;
    a->H = c->n_head, a->Hkv = c->n_head_kv, a->hd = c->head_dim;
    if (c->qk_norm == SHOAL_QK_NORM_HEAD)
        a->q_norm = a->k_norm = c->head_dim;
    else if (c->qk_norm == SHOAL_QK_NORM_FULL)
        a->q_norm = c->n_head * c->head_dim, a->k_norm = c->n_head_kv * c->head_dim;
    a->qkv_bias = c->qkv_bias;
    a->mla = c->family->mla;
    a->q_lora = c->q_lora_rank, a->kv_lora = c->kv_lora_rank;
    a->qk_nope = c->qk_nope_head_dim, a->qk_rope = c->qk_rope_head_dim;
    a->v_hd = c->v_head_dim;
    a->n_mtp = c->n_nextn;
    a->n_ff = c->n_ff, a->n_ff_exp = c->n_ff_exp, a->n_ff_shexp = c->n_ff_shexp;
    /* qwen2_moe: one gated shared expert of its own width; DeepSeek / GLM:
     * n_shared_experts of moe_intermediate_size, run as one FFN */
    a->n_shared = c->n_ff_shexp == 0 ? 0 : c->shexp_gated ? 1 : c->n_ff_shexp / c->n_ff_exp;
    a->shexp_gate = c->n_ff_shexp > 0 && c->shexp_gated;
    a->router_bias = c->router_bias;
    a->o_bias = c->o_bias;
    a->sinks = c->attn_sinks;
    a->expert_bias = c->family->gpt_oss;
    a->n_expert = c->n_expert, a->n_used = c->n_expert_used;
    memcpy(a->is_moe, c->layer_is_moe, (size_t)c->n_layer);
}

/* ---- sizes ------------------------------------------------------------------ */

struct acc {
    const struct shoal_plan_params *p;
    struct shoal_plan *out;
    int mtp;                      /* counting an MTP layer */
};

/* Bytes of one tensor as convert writes it in dtype t (container.c
 * target_bytes); the caller picks t with shoal_target_dtype. */
static uint64_t tensor_bytes(enum shoal_dtype t, int64_t rows, int64_t cols, int group)
{
    struct shoal_weight w = {.dtype = t, .rows = cols ? rows : 1, .cols = cols ? cols : rows,
                             .group = t == SHOAL_DTYPE_FP8 ? SHOAL_FP8_BLOCK : group};
    return (uint64_t)shoal_weight_bytes(&w);
}

/* A trunk tensor [rows][cols] (cols 0: 1-D of rows); router: a router or
 * shared-expert gate (shoal_target_dtype). */
static void add_as(struct acc *ac, enum shoal_plan_part part, int64_t rows, int64_t cols,
                   int router)
{
    uint64_t n = (uint64_t)rows * (uint64_t)(cols ? cols : 1);
    /* an MTP layer's matrices take a router's dtype (container_write.c) */
    enum shoal_dtype t = shoal_target_dtype(SHOAL_SLOT_DENSE, cols,
                                            router || (ac->mtp && cols != 0),
                                            ac->p->experts_dtype, ac->p->dense_dtype);
    /* FP8 is the checkpoint's own precision (convert never makes it): the
     * tensors DeepSeek-V3 and Kimi-K2 ship in BF16 (embeddings, lm_head,
     * routers, norms) stay BF16 */
    if (t == SHOAL_DTYPE_FP8 && (cols == 0 || router || part == SHOAL_PLAN_EMBED ||
                                 part == SHOAL_PLAN_LM_HEAD))
        t = SHOAL_DTYPE_BF16;
    uint64_t b = tensor_bytes(t, rows, cols, ac->p->group);
    if (ac->mtp) {
        ac->out->params_mtp += n;
        ac->out->mtp_bytes += b;
        return;
    }
    ac->out->params_trunk += n;
    ac->out->part_bytes[part] += b;
}

static void add(struct acc *ac, enum shoal_plan_part part, int64_t rows, int64_t cols)
{
    add_as(ac, part, rows, cols, 0);
}

static void add_ffn(struct acc *ac, enum shoal_plan_part part, int64_t E, int64_t ff)
{
    add(ac, part, ff, E);
    add(ac, part, ff, E);
    add(ac, part, E, ff);
}

static void add_layer(struct acc *ac, const struct arch *a, int moe)
{
    const int64_t E = a->E;
    add(ac, SHOAL_PLAN_NORM, E, 0);                       /* input_layernorm */
    add(ac, SHOAL_PLAN_NORM, E, 0);                       /* post_attention_layernorm */
    if (a->mla) {
        const int64_t qk = a->qk_nope + a->qk_rope;
        if (a->q_lora) {
            add(ac, SHOAL_PLAN_ATTN, a->q_lora, E);           /* q_a_proj */
            add(ac, SHOAL_PLAN_NORM, a->q_lora, 0);           /* q_a_layernorm */
            add(ac, SHOAL_PLAN_ATTN, a->H * qk, a->q_lora);   /* q_b_proj */
        } else {
            add(ac, SHOAL_PLAN_ATTN, a->H * qk, E);           /* q_proj */
        }
        add(ac, SHOAL_PLAN_ATTN, a->kv_lora + a->qk_rope, E); /* kv_a_proj_with_mqa */
        add(ac, SHOAL_PLAN_NORM, a->kv_lora, 0);              /* kv_a_layernorm */
        add(ac, SHOAL_PLAN_ATTN, a->H * (a->qk_nope + a->v_hd), a->kv_lora); /* kv_b_proj */
        add(ac, SHOAL_PLAN_ATTN, E, a->H * a->v_hd);          /* o_proj */
    } else {
        const int64_t nq = a->H * a->hd, nkv = a->Hkv * a->hd;
        add(ac, SHOAL_PLAN_ATTN, nq, E);
        add(ac, SHOAL_PLAN_ATTN, nkv, E);
        add(ac, SHOAL_PLAN_ATTN, nkv, E);
        add(ac, SHOAL_PLAN_ATTN, E, nq);
        if (a->qkv_bias) {
            add(ac, SHOAL_PLAN_ATTN, nq, 0);
            add(ac, SHOAL_PLAN_ATTN, nkv, 0);
            add(ac, SHOAL_PLAN_ATTN, nkv, 0);
        }
        if (a->o_bias)
            add(ac, SHOAL_PLAN_ATTN, E, 0);
        if (a->sinks)
            add(ac, SHOAL_PLAN_ATTN, a->H, 0);
        if (a->q_norm) {
            add(ac, SHOAL_PLAN_NORM, a->q_norm, 0);
            add(ac, SHOAL_PLAN_NORM, a->k_norm, 0);
        }
    }
    if (!moe) {
        add_ffn(ac, SHOAL_PLAN_DENSE_MLP, E, a->n_ff);
        return;
    }
    add_as(ac, SHOAL_PLAN_ROUTER, a->n_expert, E, 1);
    if (a->router_bias)   /* F32 always, as convert keeps a router's bias */
        add_as(ac, SHOAL_PLAN_ROUTER, a->n_expert, 0, 1);
    if (a->n_ff_shexp) {
        add_ffn(ac, SHOAL_PLAN_SHEXP, E, a->n_ff_shexp);
        if (a->shexp_gate)
            add_as(ac, SHOAL_PLAN_SHEXP, 1, E, 1);
    }
    for (int64_t ie = 0; ac->mtp && ie < a->n_expert; ie++)   /* the MTP layer's routed */
        add_ffn(ac, SHOAL_PLAN_DENSE_MLP, E, a->n_ff_exp);  /* experts: dense tensors, as
                                                             * convert writes them */
}

static uint64_t align_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

/* One expert as a blob: gate [ff][E], up [ff][E], down [E][ff] (gpt_oss:
 * then the gate, up and down biases), each 64-byte aligned, the blob 4 KiB
 * aligned (container.c write_slot). */
static void expert_blob(const struct arch *a, const struct shoal_plan_params *p,
                        struct shoal_plan *o)
{
    const int64_t shapes[6][2] = {{a->n_ff_exp, a->E}, {a->n_ff_exp, a->E},
                                  {a->E, a->n_ff_exp}, {a->n_ff_exp, 0}, {a->n_ff_exp, 0},
                                  {a->E, 0}};
    uint64_t off = 0;
    for (int c = 0; c < (a->expert_bias ? 6 : 3); c++) {
        uint64_t b = tensor_bytes(shoal_target_dtype(SHOAL_SLOT_EXPERT, shapes[c][1], 0,
                                                     p->experts_dtype, p->dense_dtype),
                                  shapes[c][0], shapes[c][1], p->group);
        off = align_up(off, ALIGN_COMP) + b;
        o->expert_weight_bytes += b;
        o->params_expert_one += (uint64_t)shapes[c][0] * (uint64_t)(shapes[c][1] ? shapes[c][1] : 1);
        o->expert_comp_bytes[c] = b;
        o->n_expert_comp = c + 1;
    }
    o->expert_blob_bytes = align_up(off, ALIGN_BLOB);
}

int shoal_plan_config(const char *json, size_t len, const char *what,
                      const struct shoal_plan_params *p, struct shoal_plan *o,
                      struct shoal_err *err)
{
    memset(o, 0, sizeof *o);
    if (!shoal_quant_group_ok(p->group))
        return shoal_err_set(err, SHOAL_EINVAL, "--group %d: expected 32, 64 or 128", p->group);
    json_error_t jerr;
    json_t *root = json_loadb(json, len, 0, &jerr);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return shoal_err_set(err, SHOAL_EFORMAT, "%s: not a JSON object (line %d: %s)", what,
                             jerr.line, jerr.text);
    }
    const char *type = json_string_value(json_object_get(root, "model_type"));
    struct arch *a = calloc(1, sizeof *a);
    int rc = 0;
    if (!a) {
        json_decref(root);
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    }
    if (!type || !shoal_family_find(type)) {
        rc = shoal_err_set(err, SHOAL_EUNSUPPORTED, "%s: unknown model_type '%s'; shoal plan "
                           "knows %s", what, type ? type : "(none)", shoal_family_list());
        goto out;
    }
    snprintf(o->model_type, sizeof o->model_type, "%s", type);
    struct shoal_model_config *c = calloc(1, sizeof *c);
    if (!c) {
        rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        goto out;
    }
    rc = shoal_model_config_parse(json, len, what, c, err);   /* the engine's own parse */
    if (!rc) {
        from_config(c, a);
        o->runnable = 1;
    }
    free(c);
    if (rc)
        goto out;
    o->mla = a->mla;
    o->n_layer = a->L;
    o->n_mtp_layer = a->n_mtp;
    o->n_expert = a->n_expert;
    o->n_expert_used = a->n_used;
    o->n_shared_expert = a->n_shared;
    for (int64_t il = 0; il < a->L; il++)
        o->n_moe_layer += a->is_moe[il];

    expert_blob(a, p, o);
    struct acc ac = {.p = p, .out = o};
    add(&ac, SHOAL_PLAN_EMBED, a->V, a->E);
    add(&ac, SHOAL_PLAN_NORM, a->E, 0);                   /* final norm */
    if (!a->tie)
        add(&ac, SHOAL_PLAN_LM_HEAD, a->V, a->E);
    for (int64_t il = 0; il < a->L; il++)
        add_layer(&ac, a, a->is_moe[il]);
    /* MTP layers (DeepSeek-V3, GLM-4.5): a MoE decoder layer plus enorm,
     * hnorm, eh_proj [E][2E], shared_head.norm and (DeepSeek) their own
     * embed_tokens and shared_head.head; on disk, paged in only when
     * drafting (--speculate mtp) */
    ac.mtp = 1;
    for (int64_t i = 0; i < a->n_mtp; i++) {
        add_layer(&ac, a, 1);
        add(&ac, SHOAL_PLAN_NORM, a->E, 0);
        add(&ac, SHOAL_PLAN_NORM, a->E, 0);
        add(&ac, SHOAL_PLAN_NORM, a->E, 0);
        add(&ac, SHOAL_PLAN_ATTN, a->E, 2 * a->E);
        if (a->mla) {
            add(&ac, SHOAL_PLAN_EMBED, a->V, a->E);
            add(&ac, SHOAL_PLAN_LM_HEAD, a->V, a->E);
        }
    }
    for (int i = 0; i < SHOAL_PLAN_N_PART; i++)
        o->trunk_bytes += o->part_bytes[i];
    const uint64_t n_moe = (uint64_t)o->n_moe_layer;
    o->params_experts = o->params_expert_one * (uint64_t)a->n_expert * n_moe;
    o->params_total = o->params_trunk + o->params_experts;
    o->params_active = o->params_trunk + o->params_expert_one * (uint64_t)a->n_used * n_moe;
    o->experts_bytes = o->expert_blob_bytes * (uint64_t)a->n_expert * n_moe;

    /* KV: shoal's cache is K and V of every layer at --kv (forward.c), or
     * for MLA the compressed row: the latent plus the shared rope key (a
     * per-head cache would hold K (nope + rope) and V of every head) */
    const uint64_t kv_es = shoal_dtype_size(p->kv_dtype);
    if (a->mla) {
        o->kv_per_head_bytes_per_token = (uint64_t)a->L * (uint64_t)a->H *
                                         (uint64_t)(a->qk_nope + a->qk_rope + a->v_hd) * kv_es;
        o->kv_mla_bytes_per_token = (uint64_t)a->L * (uint64_t)(a->kv_lora + a->qk_rope) *
                                    kv_es;
        o->kv_bytes_per_token = o->kv_mla_bytes_per_token;
        o->kv_lora_rank = a->kv_lora;
        o->qk_rope_head_dim = a->qk_rope;
    } else {
        o->kv_bytes_per_token = 2 * (uint64_t)a->L * (uint64_t)a->Hkv * (uint64_t)a->hd * kv_es;
    }
    /* as the engine sizes its cache when --ctx is not given, and refuses
     * one past the model's positions (session.c) */
    if (p->ctx > 0 && a->max_pos > 0 && p->ctx > a->max_pos) {
        const int64_t mp = a->max_pos;
        free(a);
        json_decref(root);
        return shoal_err_set(err, SHOAL_EINVAL, "--ctx %lld exceeds the model's "
                             "max_position_embeddings %lld; expected 1..%lld",
                             (long long)p->ctx, (long long)mp, (long long)mp);
    }
    o->ctx = p->ctx > 0 ? p->ctx : a->max_pos > 0 && a->max_pos < 4096 ? a->max_pos : 4096;
    o->kv_budget_bytes = (uint64_t)o->ctx * o->kv_bytes_per_token;

    o->token_expert_bytes = (uint64_t)a->n_used * o->expert_blob_bytes * n_moe;
    /* a decode token reads every trunk tensor once, but of the embedding
     * table only its own row */
    const uint64_t embed_row = a->V ? o->part_bytes[SHOAL_PLAN_EMBED] / (uint64_t)a->V : 0;
    o->token_trunk_bytes = o->trunk_bytes - o->part_bytes[SHOAL_PLAN_EMBED] + embed_row;
    o->n_embd = a->E;
    o->params_embed = (uint64_t)a->V * (uint64_t)a->E;
    o->params_lm_head = o->params_embed;
    /* per position of context: q.k and p.v, 2 FLOPs per multiply-add, per
     * head (MLA absorbed: over the latent and the rope key) */
    const int64_t qk = a->mla ? a->kv_lora + a->qk_rope : a->hd;
    const int64_t vd = a->mla ? a->kv_lora : a->hd;
    o->attn_flops_per_pos = (uint64_t)a->L * (uint64_t)a->H * 2u * (uint64_t)(qk + vd);
out:
    free(a);
    json_decref(root);
    return rc;
}
