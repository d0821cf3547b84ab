#include "model.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

struct loader {
    struct shoal_safetensors *st;
    struct shoal_err *err;
    int rc;
};

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

/* Fetch tensor `name` with shape [rows][cols] (cols == 0: 1-D [rows]).
 * required == 0: a missing tensor leaves w zeroed. */
static void get(struct loader *ld, struct shoal_weight *w, int required,
                int64_t rows, int64_t cols, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

static void get(struct loader *ld, struct shoal_weight *w, int required,
                int64_t rows, int64_t cols, const char *fmt, ...)
{
    memset(w, 0, sizeof *w);
    if (ld->rc)
        return;
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    struct shoal_st_tensor *t = shoal_safetensors_find(ld->st, name);
    if (!t) {
        if (required)
            ld->rc = shoal_err_set(ld->err, SHOAL_ENOTFOUND,
                                   "missing tensor '%s' in the checkpoint", name);
        return;
    }
    t->used = 1;
    int64_t want[2] = {rows, cols};
    int want_n = cols ? 2 : 1;
    int ok = t->n_dims == want_n && t->shape[0] == rows &&
             (want_n == 1 || t->shape[1] == cols);
    if (!ok) {
        char a[96], b[96];
        fmt_shape(a, sizeof a, want, want_n);
        fmt_shape(b, sizeof b, t->shape, t->n_dims);
        ld->rc = shoal_err_set(ld->err, SHOAL_ESHAPE,
                               "tensor '%s' in '%s' has wrong shape; expected %s, got %s",
                               name, t->file, a, b);
        return;
    }
    if (!t->dtype_ok) {
        ld->rc = shoal_err_set(ld->err, SHOAL_EUNSUPPORTED,
                               "tensor '%s' in '%s' has dtype %s; supported: F32, F16, BF16",
                               name, t->file, t->dtype_name);
        return;
    }
    w->dtype = t->dtype;
    w->data = t->data;
    w->rows = rows;
    w->cols = cols ? cols : rows;
    if (!cols) {
        w->rows = 1;
        w->cols = rows;
    }
}

static void get_ffn(struct loader *ld, struct shoal_expert_weights *e,
                    int64_t n_embd, int64_t n_ff, const char *prefix,
                    const char *g, const char *u, const char *d)
{
    get(ld, &e->w_gate, 1, n_ff, n_embd, "%s.%s.weight", prefix, g);
    get(ld, &e->w_up, 1, n_ff, n_embd, "%s.%s.weight", prefix, u);
    get(ld, &e->w_down, 1, n_embd, n_ff, "%s.%s.weight", prefix, d);
}

/* Tensors some exporters keep that carry no weights of ours. */
static int ignorable(const char *name)
{
    size_t l = strlen(name);
    static const char *suffix = "rotary_emb.inv_freq";
    size_t s = strlen(suffix);
    return l >= s && !strcmp(name + l - s, suffix);
}

struct shoal_model *shoal_model_load(const char *dir, struct shoal_err *err)
{
    struct shoal_model *m = shoal_xcalloc(1, sizeof *m);
    m->dir = shoal_xstrdup(dir);
    char *cfg_path = shoal_path_join(dir, "config.json");
    int rc = shoal_model_config_load(cfg_path, &m->cfg, err);
    free(cfg_path);
    if (rc)
        goto fail;
    m->st = shoal_safetensors_open_dir(dir, err);
    if (!m->st)
        goto fail;

    const struct shoal_model_config *c = &m->cfg;
    const struct shoal_family *f = c->family;
    struct loader ld = {.st = m->st, .err = err};
    int64_t E = c->n_embd, hd = c->head_dim;
    int64_t nq = c->n_head * hd, nkv = c->n_head_kv * hd;

    get(&ld, &m->tok_embd, 1, c->n_vocab, E, "model.embed_tokens.weight");
    get(&ld, &m->out_norm, 1, E, 0, "model.norm.weight");
    if (c->tie_embeddings)
        m->lm_head = m->tok_embd;
    else
        get(&ld, &m->lm_head, 1, c->n_vocab, E, "lm_head.weight");

    m->layers = shoal_xcalloc((size_t)c->n_layer, sizeof *m->layers);
    for (int64_t il = 0; il < c->n_layer && !ld.rc; il++) {
        struct shoal_layer_weights *L = &m->layers[il];
        char p[128];
        snprintf(p, sizeof p, "model.layers.%lld", (long long)il);
        get(&ld, &L->attn_norm, 1, E, 0, "%s.input_layernorm.weight", p);
        get(&ld, &L->ffn_norm, 1, E, 0, "%s.post_attention_layernorm.weight", p);
        get(&ld, &L->wq, 1, nq, E, "%s.self_attn.q_proj.weight", p);
        get(&ld, &L->wk, 1, nkv, E, "%s.self_attn.k_proj.weight", p);
        get(&ld, &L->wv, 1, nkv, E, "%s.self_attn.v_proj.weight", p);
        get(&ld, &L->wo, 1, E, nq, "%s.self_attn.o_proj.weight", p);
        if (c->qkv_bias) {
            get(&ld, &L->bq, 1, nq, 0, "%s.self_attn.q_proj.bias", p);
            get(&ld, &L->bk, 1, nkv, 0, "%s.self_attn.k_proj.bias", p);
            get(&ld, &L->bv, 1, nkv, 0, "%s.self_attn.v_proj.bias", p);
        }
        if (f->qk_norm == SHOAL_QK_NORM_HEAD) {
            get(&ld, &L->q_norm, 1, hd, 0, "%s.self_attn.q_norm.weight", p);
            get(&ld, &L->k_norm, 1, hd, 0, "%s.self_attn.k_norm.weight", p);
        } else if (f->qk_norm == SHOAL_QK_NORM_FULL) {
            get(&ld, &L->q_norm, 1, nq, 0, "%s.self_attn.q_norm.weight", p);
            get(&ld, &L->k_norm, 1, nkv, 0, "%s.self_attn.k_norm.weight", p);
        }
        if (shoal_layer_is_moe(c, il)) {
            char mp[160];
            snprintf(mp, sizeof mp, "%s.%s", p, f->moe_prefix);
            get(&ld, &L->w_router, 1, c->n_expert, E, "%s.gate.weight", mp);
            L->experts = shoal_xcalloc((size_t)c->n_expert, sizeof *L->experts);
            for (int64_t ie = 0; ie < c->n_expert && !ld.rc; ie++) {
                char ep[200];
                snprintf(ep, sizeof ep, "%s.experts.%lld", mp, (long long)ie);
                get_ffn(&ld, &L->experts[ie], E, c->n_ff_exp, ep, f->expert_gate,
                        f->expert_up, f->expert_down);
            }
            if (c->n_ff_shexp > 0) {
                char sp[200];
                snprintf(sp, sizeof sp, "%s.shared_expert", mp);
                get_ffn(&ld, &L->shexp, E, c->n_ff_shexp, sp, "gate_proj",
                        "up_proj", "down_proj");
                get(&ld, &L->w_shexp_gate, 1, 1, E, "%s.shared_expert_gate.weight", mp);
            }
        } else {
            char mp[160];
            snprintf(mp, sizeof mp, "%s.mlp", p);
            get_ffn(&ld, &L->mlp, E, c->n_ff, mp, "gate_proj", "up_proj", "down_proj");
        }
    }
    if (ld.rc)
        goto fail;
    for (size_t i = 0; i < shoal_safetensors_count(m->st); i++) {
        struct shoal_st_tensor *t = shoal_safetensors_at(m->st, i);
        if (!t->used && !ignorable(t->name)) {
            shoal_err_set(err, SHOAL_EFORMAT,
                          "unexpected tensor '%s' in '%s': not part of a %s model "
                          "with this config", t->name, t->file, f->model_type);
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
    if (m->layers) {
        for (int64_t il = 0; il < m->cfg.n_layer; il++)
            free(m->layers[il].experts);
        free(m->layers);
    }
    shoal_safetensors_close(m->st);
    free(m->dir);
    free(m);
}
