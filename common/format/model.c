#include "model.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "container.h"
#include "quant.h"
#include "util.h"

/* ---- the walker: one description of every weight ---------------------- */

struct walk {
    struct shoal_model *m;
    int (*fn)(const struct shoal_weight_slot *slot, void *user);
    void *user;
    int rc;
};

enum shoal_dtype shoal_target_dtype(enum shoal_slot_kind kind, int64_t cols, int router,
                                    enum shoal_dtype experts, enum shoal_dtype dense)
{
    enum shoal_dtype t = kind == SHOAL_SLOT_EXPERT ? experts : dense;
    if (cols == 0 && (router || (t != SHOAL_DTYPE_F32 && t != SHOAL_DTYPE_BF16 &&
                                 t != SHOAL_DTYPE_F16)))
        return SHOAL_DTYPE_F32;
    if (router && (t == SHOAL_DTYPE_INT4 || t == SHOAL_DTYPE_INT4A8))
        return SHOAL_DTYPE_INT8;
    return t;
}

static void visit_full(struct walk *wk, struct shoal_weight *w, int64_t rows,
                       int64_t cols, int required, enum shoal_slot_kind kind,
                       int64_t il, int64_t ie, int comp, const char *name,
                       const char *hf_name, int router, int fused)
{
    if (wk->rc)
        return;
    struct shoal_weight_slot s = {
        .name = name, .hf_name = hf_name, .w = w, .rows = rows, .cols = cols,
        .required = required, .kind = kind, .il = il, .ie = ie, .comp = comp,
        .router = router, .fused = fused};
    wk->rc = wk->fn(&s, wk->user);
}

/* MLA's split W^UK / W^UV of layer il (model.h wk_b, wv_b), optional; then
 * wkv_b, required unless both are bound (the walk binds in this order) */
static void visit_kv_b(struct walk *wk, struct shoal_layer_weights *L, int64_t il,
                       const char *p, const char *hp)
{
    const struct shoal_model_config *c = &wk->m->cfg;
    const int64_t H = c->n_head, kvl = c->kv_lora_rank;
    char n[3][128], h[3][256];
    static const char *sn[3] = {"attn_k_b", "attn_v_b", "attn_kv_b"};
    static const char *hn[3] = {"k_b_proj", "v_b_proj", "kv_b_proj"};
    for (int i = 0; i < 3; i++) {
        snprintf(n[i], sizeof n[i], "%s.%s", p, sn[i]);
        snprintf(h[i], sizeof h[i], "%s.self_attn.%s.weight", hp, hn[i]);
    }
    struct shoal_weight *w[2] = {&L->wk_b, &L->wv_b};
    const int64_t rows[2] = {H * kvl, H * c->v_head_dim}, cols[2] = {c->qk_nope_head_dim, kvl};
    for (int i = 0; i < 2 && !wk->rc; i++) {
        const struct shoal_weight_slot s = {.name = n[i], .hf_name = h[i], .w = w[i],
                                            .rows = rows[i], .cols = cols[i],
                                            .kind = SHOAL_SLOT_DENSE, .il = il, .ie = -1,
                                            .kv_b_part = 1};
        wk->rc = wk->fn(&s, wk->user);
    }
    visit_full(wk, &L->wkv_b, H * (c->qk_nope_head_dim + c->v_head_dim), kvl,
               !(L->wk_b.data && L->wv_b.data), SHOAL_SLOT_DENSE, il, -1, 0, n[2], h[2], 0, 0);
}

static void visit_as(struct walk *wk, struct shoal_weight *w, int64_t rows,
                     int64_t cols, int required, enum shoal_slot_kind kind,
                     int64_t il, int64_t ie, int comp, const char *name,
                     const char *hf_name, int router)
{
    visit_full(wk, w, rows, cols, required, kind, il, ie, comp, name, hf_name, router, 0);
}

/* gpt_oss: expert ie of layer il, cut from the layer's stacked tensors
 * (enum shoal_fused_part): w_gate, w_up, w_down, then the three biases
 * (components 3, 4, 5) */
static void visit_fused_expert(struct walk *wk, struct shoal_expert_weights *e, int64_t E,
                               int64_t F, int64_t il, int64_t ie, const char *name_prefix,
                               const char *hf_prefix)
{
    static const char *comp[6] = {"w_gate", "w_up", "w_down", "b_gate", "b_up", "b_down"};
    static const char *hf[6] = {"gate_up_proj", "gate_up_proj", "down_proj",
                                "gate_up_proj_bias", "gate_up_proj_bias", "down_proj_bias"};
    struct shoal_weight *w[6] = {&e->w_gate, &e->w_up, &e->w_down, &e->b_gate, &e->b_up,
                                 &e->b_down};
    const int64_t rows[6] = {F, F, E, F, F, E}, cols[6] = {E, E, F, 0, 0, 0};
    for (int c = 0; c < 6; c++) {
        char n[128], h[256];
        snprintf(n, sizeof n, "%s.%s", name_prefix, comp[c]);
        snprintf(h, sizeof h, "%s.%s", hf_prefix, hf[c]);
        visit_full(wk, w[c], rows[c], cols[c], 1, SHOAL_SLOT_EXPERT, il, ie, c, n, h, 0,
                   SHOAL_FUSED_GATE + c);
    }
}

static void visit(struct walk *wk, struct shoal_weight *w, int64_t rows,
                  int64_t cols, int required, enum shoal_slot_kind kind,
                  int64_t il, int64_t ie, int comp, const char *name,
                  const char *hf_name)
{
    visit_as(wk, w, rows, cols, required, kind, il, ie, comp, name, hf_name, 0);
}

static void visit_ffn(struct walk *wk, struct shoal_expert_weights *e,
                      int64_t E, int64_t F, enum shoal_slot_kind kind,
                      int64_t il, int64_t ie, const char *name_prefix,
                      const char *hf_prefix, const char *g, const char *u,
                      const char *d)
{
    char n[3][128], h[3][256];
    const char *hf[3] = {g, u, d};
    static const char *comp[3] = {"w_gate", "w_up", "w_down"};
    for (int c = 0; c < 3; c++) {
        snprintf(n[c], sizeof n[c], "%s.%s", name_prefix, comp[c]);
        snprintf(h[c], sizeof h[c], "%s.%s.weight", hf_prefix, hf[c]);
    }
    visit(wk, &e->w_gate, F, E, 1, kind, il, ie, 0, n[0], h[0]);
    visit(wk, &e->w_up, F, E, 1, kind, il, ie, 1, n[1], h[1]);
    visit(wk, &e->w_down, E, F, 1, kind, il, ie, 2, n[2], h[2]);
}

void shoal_model_alloc_layers(struct shoal_model *m)
{
    const struct shoal_model_config *c = &m->cfg;
    m->layers = shoal_xcalloc((size_t)(c->n_layer + c->n_nextn), sizeof *m->layers);
    m->mtp = c->n_nextn ? shoal_xcalloc((size_t)c->n_nextn, sizeof *m->mtp) : NULL;
    for (int64_t il = 0; il < c->n_layer + c->n_nextn; il++)
        if (shoal_layer_is_moe(c, il))
            m->layers[il].experts =
                shoal_xcalloc((size_t)c->n_expert, sizeof *m->layers[il].experts);
}

/* Layer il's slots (a decoder layer, or MTP layer il - n_layer's block). */
static void walk_layer(struct walk *wk, int64_t il)
{
    struct shoal_model *m = wk->m;
    const struct shoal_model_config *c = &m->cfg;
    const struct shoal_family *f = c->family;
    const int64_t E = c->n_embd, hd = c->head_dim;
    const int64_t nq = c->n_head * hd, nkv = c->n_head_kv * hd;
    const enum shoal_slot_kind D = SHOAL_SLOT_DENSE;
    struct shoal_layer_weights *L = &m->layers[il];
    char p[64], hp[96], n[128], h[256];
    snprintf(p, sizeof p, "blk.%lld", (long long)il);
    snprintf(hp, sizeof hp, "model.layers.%lld", (long long)il);
#define V(field, rows, cols, short, hf)                                     \
do {                                                                    \
    snprintf(n, sizeof n, "%s.%s", p, short);                           \
    snprintf(h, sizeof h, "%s.%s", hp, hf);                             \
    visit(wk, &L->field, rows, cols, 1, D, il, -1, 0, n, h);           \
} while (0)
    V(attn_norm, E, 0, "attn_norm", "input_layernorm.weight");
    if (f->mla) {
        const int64_t H = c->n_head, kvl = c->kv_lora_rank, ql = c->q_lora_rank;
        if (ql) {
            V(wq_a, ql, E, "attn_q_a", "self_attn.q_a_proj.weight");
            V(q_a_norm, ql, 0, "attn_q_a_norm", "self_attn.q_a_layernorm.weight");
            V(wq_b, nq, ql, "attn_q_b", "self_attn.q_b_proj.weight");
        } else {
            V(wq, nq, E, "attn_q", "self_attn.q_proj.weight");
        }
        V(wkv_a, kvl + c->qk_rope_head_dim, E, "attn_kv_a",
          "self_attn.kv_a_proj_with_mqa.weight");
        V(kv_a_norm, kvl, 0, "attn_kv_a_norm", "self_attn.kv_a_layernorm.weight");
        visit_kv_b(wk, L, il, p, hp);
        V(wo, E, H * c->v_head_dim, "attn_output", "self_attn.o_proj.weight");
        goto ffn;
    }
    V(wq, nq, E, "attn_q", "self_attn.q_proj.weight");
    V(wk, nkv, E, "attn_k", "self_attn.k_proj.weight");
    V(wv, nkv, E, "attn_v", "self_attn.v_proj.weight");
    V(wo, E, nq, "attn_output", "self_attn.o_proj.weight");
    if (c->qkv_bias) {
        V(bq, nq, 0, "attn_q.bias", "self_attn.q_proj.bias");
        V(bk, nkv, 0, "attn_k.bias", "self_attn.k_proj.bias");
        V(bv, nkv, 0, "attn_v.bias", "self_attn.v_proj.bias");
    }
    if (c->o_bias)
        V(bo, E, 0, "attn_output.bias", "self_attn.o_proj.bias");
    if (c->attn_sinks)
        V(sinks, c->n_head, 0, "attn_sinks", "self_attn.sinks");
    if (c->qk_norm == SHOAL_QK_NORM_HEAD) {
        V(q_norm, hd, 0, "attn_q_norm", "self_attn.q_norm.weight");
        V(k_norm, hd, 0, "attn_k_norm", "self_attn.k_norm.weight");
    } else if (c->qk_norm == SHOAL_QK_NORM_FULL) {
        V(q_norm, nq, 0, "attn_q_norm", "self_attn.q_norm.weight");
        V(k_norm, nkv, 0, "attn_k_norm", "self_attn.k_norm.weight");
    }
ffn:
    V(ffn_norm, E, 0, "ffn_norm", "post_attention_layernorm.weight");
    if (shoal_layer_is_moe(c, il)) {
        char mp[160];
        snprintf(mp, sizeof mp, "%s.%s", hp, f->moe_prefix);
        /* gpt_oss: mlp.router.weight and .bias; the others mlp.gate */
        const char *gate = f->gpt_oss ? "router" : "gate";
        snprintf(n, sizeof n, "%s.router", p);
        snprintf(h, sizeof h, "%s.%s.weight", mp, gate);
        visit_as(wk, &L->w_router, c->n_expert, E, 1, D, il, -1, 0, n, h, 1);
        if (c->router_bias) {
            snprintf(n, sizeof n, "%s.router_bias", p);
            snprintf(h, sizeof h, "%s.%s", mp, f->gpt_oss ? "router.bias"
                                               : "gate.e_score_correction_bias");
            visit_as(wk, &L->router_bias, c->n_expert, 0, 1, D, il, -1, 0, n, h, 1);
        }
        if (c->n_ff_shexp > 0) {
            char np[96], sp[200];
            snprintf(np, sizeof np, "%s.shexp", p);
            /* qwen2_moe: shared_expert (+ gate); DeepSeek, GLM: shared_experts */
            snprintf(sp, sizeof sp, "%s.shared_expert%s", mp, c->shexp_gated ? "" : "s");
            visit_ffn(wk, &L->shexp, E, c->n_ff_shexp, D, il, -1, np, sp,
                      "gate_proj", "up_proj", "down_proj");
        }
        if (c->n_ff_shexp > 0 && c->shexp_gated) {
            snprintf(n, sizeof n, "%s.shexp_gate", p);
            snprintf(h, sizeof h, "%s.shared_expert_gate.weight", mp);
            visit_as(wk, &L->w_shexp_gate, 1, E, 1, D, il, -1, 0, n, h, 1);
        }
        for (int64_t ie = 0; ie < c->n_expert && !wk->rc && f->gpt_oss; ie++) {
            char np[96], ep[200];
            snprintf(np, sizeof np, "%s.exp.%lld", p, (long long)ie);
            snprintf(ep, sizeof ep, "%s.experts", mp);
            visit_fused_expert(wk, &L->experts[ie], E, c->n_ff_exp, il, ie, np, ep);
        }
        for (int64_t ie = 0; ie < c->n_expert && !wk->rc && !f->gpt_oss; ie++) {
            char np[96], ep[200];
            snprintf(np, sizeof np, "%s.exp.%lld", p, (long long)ie);
            snprintf(ep, sizeof ep, "%s.experts.%lld", mp, (long long)ie);
            visit_ffn(wk, &L->experts[ie], E, c->n_ff_exp, SHOAL_SLOT_EXPERT,
                      il, ie, np, ep, f->expert_gate, f->expert_up,
                      f->expert_down);
        }
    } else {
        char np[96], mp[160];
        snprintf(np, sizeof np, "%s.ffn", p);
        snprintf(mp, sizeof mp, "%s.mlp", hp);
        visit_ffn(wk, &L->mlp, E, c->n_ff, D, il, -1, np, mp, "gate_proj",
                  "up_proj", "down_proj");
    }
#undef V
}

int shoal_model_walk(struct shoal_model *m,
                     int (*fn)(const struct shoal_weight_slot *slot, void *user),
                     void *user)
{
    const struct shoal_model_config *c = &m->cfg;
    struct walk wk = {.m = m, .fn = fn, .user = user};
    const int64_t E = c->n_embd;
    const enum shoal_slot_kind D = SHOAL_SLOT_DENSE;

    visit(&wk, &m->tok_embd, c->n_vocab, E, 1, D, -1, -1, 0, "tok_embd",
          "model.embed_tokens.weight");
    visit(&wk, &m->out_norm, E, 0, 1, D, -1, -1, 0, "out_norm", "model.norm.weight");
    if (!c->tie_embeddings)
        visit(&wk, &m->lm_head, c->n_vocab, E, 1, D, -1, -1, 0, "lm_head",
              "lm_head.weight");
    for (int64_t il = 0; il < c->n_layer && !wk.rc; il++)
        walk_layer(&wk, il);
    return wk.rc;
}

int shoal_model_walk_mtp(struct shoal_model *m,
                         int (*fn)(const struct shoal_weight_slot *slot, void *user),
                         void *user)
{
    const struct shoal_model_config *c = &m->cfg;
    struct walk wk = {.m = m, .fn = fn, .user = user};
    const int64_t E = c->n_embd, V = c->n_vocab;
    const enum shoal_slot_kind D = SHOAL_SLOT_DENSE;
    for (int64_t j = 0; j < c->n_nextn && !wk.rc; j++) {
        const int64_t il = c->n_layer + j;
        struct shoal_mtp_weights *t = &m->mtp[j];
        char n[64], h[96];
#define M(field, rows, cols, req, short, hf)                                   \
    do {                                                                       \
        snprintf(n, sizeof n, "blk.%lld.nextn.%s", (long long)il, short);     \
        snprintf(h, sizeof h, "model.layers.%lld.%s", (long long)il, hf);     \
        visit(&wk, &t->field, rows, cols, req, D, il, -1, 0, n, h);           \
    } while (0)
        M(enorm, E, 0, 1, "enorm", "enorm.weight");
        M(hnorm, E, 0, 1, "hnorm", "hnorm.weight");
        M(eh_proj, E, 2 * E, 1, "eh_proj", "eh_proj.weight");
        M(head_norm, E, 0, 1, "shared_head_norm", "shared_head.norm.weight");
        M(embd, V, E, 0, "embed_tokens", "embed_tokens.weight");
        M(head, V, E, 0, "shared_head_head", "shared_head.head.weight");
#undef M
        walk_layer(&wk, il);
    }
    return wk.rc;
}

/* ---- loading from a Hugging Face directory ------------------------------- */

static void fmt_shape(char *buf, size_t cap, const int64_t *shape, int n)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (int i = 0; i < n && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "",
                              (long long)shape[i]);
    if (o < cap)
        snprintf(buf + o, cap - o, "]");
}

struct bind_st {
    struct shoal_safetensors *st;
    const struct shoal_model_config *cfg;
    struct shoal_model *m;           /* owns the slices bind_fused cuts */
    struct shoal_err *err;
};

/* gpt_oss as shipped: expert ie's gate / up / down from the MXFP4 tensors
 * X_blocks [n_expert][rows][cols/32][16] and X_scales [n_expert][rows]
 * [cols/32], output-major, gate_up_proj's rows interleaved (gate, up, gate,
 * ...): gate and up are views stepping over every other row (row_step 2),
 * nothing is copied. Their exponents are checked when the expert first runs
 * (forward.c) or by convert. */
static int bind_fused_mxfp4(struct bind_st *b, const struct shoal_weight_slot *s)
{
    const struct shoal_model_config *c = b->cfg;
    const int64_t E = c->n_embd, F = c->n_ff_exp;
    char bn[300], sn[300];
    snprintf(bn, sizeof bn, "%s_blocks", s->hf_name);
    snprintf(sn, sizeof sn, "%s_scales", s->hf_name);
    struct shoal_st_tensor *bt = shoal_safetensors_find(b->st, bn);
    struct shoal_st_tensor *st = shoal_safetensors_find(b->st, sn);
    if (!bt || !st)
        return shoal_err_set(b->err, SHOAL_ENOTFOUND,
                             "missing tensor '%s' in the checkpoint (nor its MXFP4 form "
                             "'%s' + '%s')", s->hf_name, bn, sn);
    bt->used = st->used = 1;
    if (!c->mxfp4_experts)
        return shoal_err_set(b->err, SHOAL_EFORMAT,
                             "tensor '%s' is MXFP4 but config.json has no quantization_config "
                             "{\"quant_method\": \"mxfp4\"}", bn);
    const int down = s->fused == SHOAL_FUSED_DOWN;
    struct shoal_weight *w = s->w;
    int rc = shoal_mxfp4_bind(w, bt, st, s->ie, down ? E : 2 * F, down ? F : E, 0, bn,
                              b->err);
    if (rc)
        return rc;
    if (!down) {   /* gate: rows 0, 2, 4, ...; up: rows 1, 3, 5, ... */
        w->rows = F;
        w->row_step = 2;
        if (s->fused == SHOAL_FUSED_UP) {
            w->data = (const uint8_t *)w->data + E / 2;
            w->e8m0 += E / SHOAL_MXFP4_BLOCK;
        }
        b->m->layers[s->il].experts[s->ie].swiglu_limit = (float)c->swiglu_limit;
    }
    return 0;
}

/* gpt_oss: bind slot s to its slice of a stacked tensor (enum
 * shoal_fused_part). The gate / up / down matrices are transposed (the
 * file is input-major) and gate / up de-interleaved, so they are copied,
 * element by element in the file's dtype, into buffers the model owns; the
 * down bias is a view. */
static int bind_fused(struct bind_st *b, const struct shoal_weight_slot *s)
{
    const struct shoal_model_config *c = b->cfg;
    const int64_t NE = c->n_expert, E = c->n_embd, F = c->n_ff_exp;
    struct shoal_st_tensor *t = shoal_safetensors_find(b->st, s->hf_name);
    if (!t && s->fused <= SHOAL_FUSED_DOWN)
        return bind_fused_mxfp4(b, s);
    if (!t)
        return shoal_err_set(b->err, SHOAL_ENOTFOUND, "missing tensor '%s' in the checkpoint",
                             s->hf_name);
    t->used = 1;
    int64_t want[3];
    int nd;
    switch (s->fused) {
    case SHOAL_FUSED_GATE: case SHOAL_FUSED_UP:
        want[0] = NE, want[1] = E, want[2] = 2 * F, nd = 3; break;
    case SHOAL_FUSED_DOWN:
        want[0] = NE, want[1] = F, want[2] = E, nd = 3; break;
    case SHOAL_FUSED_GATE_BIAS: case SHOAL_FUSED_UP_BIAS:
        want[0] = NE, want[1] = 2 * F, nd = 2; break;
    default:
        want[0] = NE, want[1] = E, nd = 2; break;
    }
    int ok = t->n_dims == nd;
    for (int i = 0; ok && i < nd; i++)
        ok = t->shape[i] == want[i];
    if (!ok) {
        char a[96], g[96];
        fmt_shape(a, sizeof a, want, nd);
        fmt_shape(g, sizeof g, t->shape, t->n_dims);
        return shoal_err_set(b->err, SHOAL_ESHAPE,
                             "tensor '%s' in '%s' has wrong shape; expected %s, got %s",
                             s->hf_name, t->file, a, g);
    }
    if (!t->dtype_ok || shoal_dtype_is_quant(t->dtype) || t->dtype == SHOAL_DTYPE_FP8)
        return shoal_err_set(b->err, SHOAL_EUNSUPPORTED,
                             "tensor '%s' in '%s' has dtype %s; supported for gpt_oss "
                             "experts: F32, F16, BF16", s->hf_name, t->file, t->dtype_name);
    struct shoal_weight *w = s->w;
    const size_t es = shoal_dtype_size(t->dtype);
    const char *src = (const char *)t->data;
    w->dtype = t->dtype;
    w->rows = s->cols ? s->rows : 1;
    w->cols = s->cols ? s->cols : s->rows;
    if (s->fused == SHOAL_FUSED_DOWN_BIAS) {
        w->data = src + (size_t)s->ie * (size_t)E * es;
        return 0;
    }
    char *dst = shoal_xmalloc((size_t)(w->rows * w->cols) * es);
    const int odd = s->fused == SHOAL_FUSED_UP || s->fused == SHOAL_FUSED_UP_BIAS;
    if (s->fused == SHOAL_FUSED_GATE || s->fused == SHOAL_FUSED_UP) {
        const char *x = src + (size_t)s->ie * (size_t)(E * 2 * F) * es;  /* [E][2F] */
        for (int64_t f = 0; f < F; f++)
            for (int64_t e = 0; e < E; e++)
                memcpy(dst + (size_t)(f * E + e) * es,
                       x + (size_t)(e * 2 * F + 2 * f + odd) * es, es);
    } else if (s->fused == SHOAL_FUSED_DOWN) {
        const char *x = src + (size_t)s->ie * (size_t)(F * E) * es;      /* [F][E] */
        for (int64_t e = 0; e < E; e++)
            for (int64_t f = 0; f < F; f++)
                memcpy(dst + (size_t)(e * F + f) * es, x + (size_t)(f * E + e) * es, es);
    } else {
        const char *x = src + (size_t)s->ie * (size_t)(2 * F) * es;      /* [2F] */
        for (int64_t f = 0; f < F; f++)
            memcpy(dst + (size_t)f * es, x + (size_t)(2 * f + odd) * es, es);
    }
    w->data = dst;
    struct shoal_model *m = b->m;
    m->owned = shoal_xrealloc(m->owned, (m->n_owned + 1) * sizeof *m->owned);
    m->owned[m->n_owned++] = dst;
    if (s->fused == SHOAL_FUSED_GATE || s->fused == SHOAL_FUSED_UP)
        m->layers[s->il].experts[s->ie].swiglu_limit = (float)c->swiglu_limit;
    return 0;
}

/* Bind an F8_E4M3 weight's block scales (the tensor named hf_name +
 * "_scale_inv", F32 [ceil(rows/128)][ceil(cols/128)]), then check the
 * scales and, for the trunk, every code (a NaN code is a load error naming
 * the tensor). The trunk's codes are read once here, a sequential pass;
 * their pages are dropped afterwards so the check does not pin memory. A
 * routed expert's codes are checked when it first runs (forward.c), and by
 * convert as it reads them, so that starting on a 700 GB directory does not
 * read 700 GB (docs/QUANTIZATION.md "FP8"). */
static int bind_fp8_scales(struct bind_st *b, const struct shoal_weight_slot *s,
                           struct shoal_st_tensor *t, struct shoal_weight *w)
{
    if (!s->cols)
        return shoal_err_set(b->err, SHOAL_EUNSUPPORTED,
                             "tensor '%s' in '%s' is F8_E4M3 but 1-D; expected F32, F16 "
                             "or BF16 (FP8 is read for 2-D weights only)", s->hf_name, t->file);
    if (!b->cfg->fp8_block)
        return shoal_err_set(b->err, SHOAL_EFORMAT,
                             "tensor '%s' in '%s' is F8_E4M3 but config.json has no "
                             "quantization_config; expected {\"quant_method\": \"fp8\", "
                             "\"weight_block_size\": [%d, %d]}", s->hf_name, t->file,
                             SHOAL_FP8_BLOCK, SHOAL_FP8_BLOCK);
    const int64_t B = b->cfg->fp8_block;
    const int64_t want[2] = {(s->rows + B - 1) / B, (s->cols + B - 1) / B};
    char sn[320], a[96], g[96];
    snprintf(sn, sizeof sn, "%s_scale_inv", s->hf_name);
    fmt_shape(a, sizeof a, want, 2);
    struct shoal_st_tensor *st = shoal_safetensors_find(b->st, sn);
    if (!st)
        return shoal_err_set(b->err, SHOAL_ENOTFOUND,
                             "FP8 tensor '%s' in '%s' has no scale tensor '%s'; expected "
                             "F32 %s", s->hf_name, t->file, sn, a);
    st->used = 1;
    if (!st->dtype_ok || st->dtype != SHOAL_DTYPE_F32 || st->n_dims != 2 ||
        st->shape[0] != want[0] || st->shape[1] != want[1]) {
        fmt_shape(g, sizeof g, st->shape, st->n_dims);
        return shoal_err_set(b->err, SHOAL_ESHAPE,
                             "scale tensor '%s' in '%s' is %s %s; expected F32 %s (one "
                             "per %lldx%lld block of '%s')", sn, st->file, st->dtype_name,
                             g, a, (long long)B, (long long)B, s->hf_name);
    }
    w->scale = st->data;
    w->group = (int)B;
    struct shoal_err e = {0};
    const int codes = s->kind != SHOAL_SLOT_EXPERT;
    int rc = shoal_fp8_check(w, codes, s->hf_name, &e);
    if (codes)
        shoal_safetensors_drop_pages(t);
    return rc ? shoal_err_set(b->err, rc, "'%s': %s", t->file, e.msg) : 0;
}

/* Bind one slot to its safetensors tensor, checking shape and dtype. */
static int bind_from_st(const struct shoal_weight_slot *s, void *user)
{
    struct bind_st *b = user;
    struct shoal_weight *w = s->w;
    memset(w, 0, sizeof *w);
    if (s->kv_b_part)   /* a checkpoint has kv_b_proj whole */
        return 0;
    if (s->fused)
        return bind_fused(b, s);
    struct shoal_st_tensor *t = shoal_safetensors_find(b->st, s->hf_name);
    if (!t) {
        if (!s->required)
            return 0;
        return shoal_err_set(b->err, SHOAL_ENOTFOUND,
                             "missing tensor '%s' in the checkpoint", s->hf_name);
    }
    t->used = 1;
    int64_t want[2] = {s->rows, s->cols};
    int want_n = s->cols ? 2 : 1;
    if (!(t->n_dims == want_n && t->shape[0] == s->rows &&
          (want_n == 1 || t->shape[1] == s->cols))) {
        char a[96], g[96];
        fmt_shape(a, sizeof a, want, want_n);
        fmt_shape(g, sizeof g, t->shape, t->n_dims);
        return shoal_err_set(b->err, SHOAL_ESHAPE,
                             "tensor '%s' in '%s' has wrong shape; expected %s, got %s",
                             s->hf_name, t->file, a, g);
    }
    if (!t->dtype_ok)
        return shoal_err_set(b->err, SHOAL_EUNSUPPORTED,
                             "tensor '%s' in '%s' has dtype %s; supported: F32, F16, BF16, "
                             "F8_E4M3 (with block scales)",
                             s->hf_name, t->file, t->dtype_name);
    w->dtype = t->dtype;
    w->data = t->data;
    w->rows = s->cols ? s->rows : 1;
    w->cols = s->cols ? s->cols : s->rows;
    if (t->dtype == SHOAL_DTYPE_FP8)
        return bind_fp8_scales(b, s, t, w);
    return 0;
}

/* Tensors some exporters keep that carry no weights of ours: rotary
 * inv_freq buffers, and the MTP layers (num_nextn_predict_layers) stored as
 * model.layers.N.* for N in [n_layer, n_layer + n_nextn), which are left
 * mapped and never read until speculative decoding uses them. */
static int ignorable(const char *name, const struct shoal_model_config *c)
{
    static const char layers[] = "model.layers.";
    if (c->n_nextn > 0 && !strncmp(name, layers, sizeof layers - 1)) {
        char *end = NULL;
        long long il = strtoll(name + sizeof layers - 1, &end, 10);
        if (end && *end == '.' && il >= c->n_layer && il < c->n_layer + c->n_nextn)
            return 1;
    }
    size_t l = strlen(name);
    static const char *suffix = "rotary_emb.inv_freq";
    size_t s = strlen(suffix);
    return l >= s && !strcmp(name + l - s, suffix);
}

/* The MTP layers of a Hugging Face directory, when the config has them:
 * bound like the decoder's, but a missing, mis-shaped or unsupported one
 * only makes them unusable (m->mtp_why), since nothing but speculative
 * decoding reads them and checkpoints without them run as before. */
static void bind_mtp(struct shoal_model *m, struct bind_st *b)
{
    const struct shoal_model_config *c = &m->cfg;
    if (c->n_nextn <= 0)
        return;
    struct shoal_err e = {0};
    struct bind_st bm = *b;
    bm.err = &e;
    if (shoal_model_walk_mtp(m, bind_from_st, &bm)) {
        snprintf(m->mtp_why, sizeof m->mtp_why, "its MTP layer is incomplete: %s", e.msg);
        return;
    }
    m->n_mtp = c->n_nextn;
}

struct shoal_model *shoal_model_load(const char *dir, struct shoal_err *err)
{
    struct shoal_model *m = shoal_xcalloc(1, sizeof *m);
    m->dir = shoal_xstrdup(dir);
    if (shoal_model_is_gguf(dir)) {
        if (shoal_model_gguf_load(m, dir, err))
            goto fail;
        return m;
    }
    if (shoal_container_is(dir)) {
        m->ct = shoal_container_open(dir, &m->cfg, err);
        if (!m->ct)
            goto fail;
        shoal_model_alloc_layers(m);
        if (shoal_container_bind(m->ct, m, err))
            goto fail;
        return m;
    }
    char *cfg_path = shoal_path_join(dir, "config.json");
    int rc = shoal_model_config_load(cfg_path, &m->cfg, err);
    free(cfg_path);
    if (rc)
        goto fail;
    m->st = shoal_safetensors_open_dir(dir, err);
    if (!m->st)
        goto fail;
    shoal_model_alloc_layers(m);
    struct bind_st b = {.st = m->st, .cfg = &m->cfg, .m = m, .err = err};
    if (shoal_model_walk(m, bind_from_st, &b))
        goto fail;
    if (m->cfg.tie_embeddings)
        m->lm_head = m->tok_embd;
    bind_mtp(m, &b);
    for (size_t i = 0; i < shoal_safetensors_count(m->st); i++) {
        struct shoal_st_tensor *t = shoal_safetensors_at(m->st, i);
        if (!t->used && !ignorable(t->name, &m->cfg)) {
            shoal_err_set(err, SHOAL_EFORMAT,
                          "unexpected tensor '%s' in '%s': not part of a %s model "
                          "with this config", t->name, t->file,
                          m->cfg.family->model_type);
            goto fail;
        }
    }
    return m;
fail:
    shoal_model_free(m);
    return NULL;
}

void shoal_model_free(struct shoal_model *m)
{
    if (!m)
        return;
    shoal_container_close(m->ct);
    if (m->layers) {
        for (int64_t il = 0; il < m->cfg.n_layer + m->cfg.n_nextn; il++)
            free(m->layers[il].experts);
        free(m->layers);
    }
    free(m->mtp);
    shoal_safetensors_close(m->st);
    shoal_model_gguf_free(m->gguf);
    for (size_t i = 0; i < m->n_owned; i++)
        free(m->owned[i]);
    free(m->owned);
    free(m->dir);
    free(m);
}
