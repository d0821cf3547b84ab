/* experts_local: the local executor of routed experts (experts.h): the
 * model's expert store (common/store/expert_exec.c runs the acquired
 * batches) or, for a checkpoint held in RAM, its resident experts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expert_exec.h"
#include "expert_ffn.h"
#include "experts.h"
#include "ggml_types.h"
#include "quant.h"
#include "util.h"

struct shoal_local_experts {
    const struct shoal_model *model;      /* borrowed */
    struct shoal_expert_store *store;     /* borrowed; NULL: resident experts */
    int64_t rows_cap;                     /* rows the scratch below holds */
    float *xg;                            /* [rows][n_embd] gathered inputs, by union slot */
    float *ob;                            /* [rows][n_embd] outputs, by union slot */
    float *ffn;                           /* [2][rows][n_ff_exp] */
    struct shoal_expert_ffn_job *jobs;    /* [n_expert] */
    struct shoal_expert_weights *ew;      /* [n_expert] views of an acquired batch */
    int32_t *sel_ids;                     /* [n_expert] ids of a selection */
    uint8_t *fp8_ok;                      /* [n_layer][n_expert] 1: the memory-mapped
                                           * FP8/MXFP4 expert's codes (or ggml block
                                           * scales, for a GGUF model run without
                                           * its store) were checked */
    /* the step in progress (the iface's hook) */
    const struct shoal_moe_step *st;
};

struct shoal_local_experts *shoal_local_experts_create(const struct shoal_model *m,
                                                       struct shoal_expert_store *store)
{
    struct shoal_local_experts *lx = shoal_xcalloc(1, sizeof *lx);
    const size_t ne = (size_t)(m->cfg.n_expert > 0 ? m->cfg.n_expert : 1);
    lx->model = m;
    lx->store = store;
    lx->jobs = shoal_xcalloc(ne, sizeof *lx->jobs);
    lx->ew = shoal_xcalloc(ne, sizeof *lx->ew);
    lx->sel_ids = shoal_xcalloc(ne, sizeof *lx->sel_ids);
    return lx;
}

void shoal_local_experts_free(struct shoal_local_experts *lx)
{
    if (!lx)
        return;
    free(lx->xg);
    free(lx->ob);
    free(lx->ffn);
    free(lx->jobs);
    free(lx->ew);
    free(lx->sel_ids);
    free(lx->fp8_ok);
    free(lx);
}

struct shoal_expert_store *shoal_local_experts_store(const struct shoal_local_experts *lx)
{
    return lx->store;
}

/* Scratch for rows union slots (contents not kept). */
static void reserve(struct shoal_local_experts *lx, int64_t rows)
{
    if (rows <= lx->rows_cap)
        return;
    const struct shoal_model_config *c = &lx->model->cfg;
    free(lx->xg);
    free(lx->ob);
    free(lx->ffn);
    lx->xg = shoal_xcalloc((size_t)(rows * c->n_embd), sizeof(float));
    lx->ob = shoal_xcalloc((size_t)(rows * c->n_embd), sizeof(float));
    lx->ffn = shoal_xcalloc((size_t)(2 * rows * (c->n_ff_exp > 0 ? c->n_ff_exp : 1)),
                            sizeof(float));
    lx->rows_cap = rows;
}

/* Gather entries sel[0..n_sel) (sel NULL: 0..n_sel): each expert's rows of
 * st->h into lx->xg at its own slot range, and its FFN job (outputs into
 * lx->ob at that range, its own scratch) into lx->jobs[i]; the weights are
 * set by the caller. */
static void gather(struct shoal_local_experts *lx, const struct shoal_moe_step *st,
                   const int64_t *sel, int64_t n_sel)
{
    const int64_t E = lx->model->cfg.n_embd, F = lx->model->cfg.n_ff_exp, K = st->k;
    const struct shoal_batch_union *bu = st->bu;
    for (int64_t i = 0; i < n_sel; i++) {
        const int64_t u = sel ? sel[i] : i;
        const int64_t b = bu->slot_begin[u], cnt = bu->slot_begin[u + 1] - b;
        for (int64_t j = 0; j < cnt; j++)
            memcpy(lx->xg + (b + j) * E, st->h + (bu->slots[b + j] / K) * E,
                   (size_t)E * sizeof(float));
        lx->jobs[i] = (struct shoal_expert_ffn_job){
            .out = lx->ob + b * E, .x = lx->xg + b * E, .n = cnt,
            .scratch = lx->ffn + 2 * b * F};
    }
}

/* Each output row of entries sel[0..n_sel) into its slot of st->yg. */
static void scatter(struct shoal_local_experts *lx, const struct shoal_moe_step *st,
                    const int64_t *sel, int64_t n_sel)
{
    const int64_t E = lx->model->cfg.n_embd;
    const struct shoal_batch_union *bu = st->bu;
    for (int64_t i = 0; i < n_sel; i++) {
        const int64_t u = sel ? sel[i] : i;
        const int64_t b = bu->slot_begin[u], cnt = bu->slot_begin[u + 1] - b;
        for (int64_t j = 0; j < cnt; j++)
            memcpy(st->yg + bu->slots[b + j] * E, lx->ob + (b + j) * E,
                   (size_t)E * sizeof(float));
    }
}

/* An expert's ggml-typed matrix k (0 gate, 1 up, 2 down) of a GGUF file:
 * its block scales finite, the message naming the stacked tensor and the
 * block's index in it */
static int check_ggml_expert(const struct shoal_weight *w, int64_t il, int32_t ie, int k,
                             struct shoal_err *err)
{
    static const char *const exps[3] = {"gate", "up", "down"};
    const struct shoal_ggml_type_info *ti = shoal_ggml_type_info(w->ggml_type);
    const uint64_t n_blk = (uint64_t)w->rows * (uint64_t)w->cols / ti->block_size;
    char name[96];
    snprintf(name, sizeof name, "blk.%lld.ffn_%s_exps.weight", (long long)il, exps[k]);
    struct shoal_err e = {0};
    if (shoal_ggml_check_scales(w->ggml_type, w->data, n_blk, name, (uint64_t)ie * n_blk, &e))
        return shoal_err_set(err, e.code, "%s (in expert %d)", e.msg, (int)ie);
    return 0;
}

/* The first time a memory-mapped FP8 or MXFP4 expert (a Hugging Face
 * directory) or ggml-typed one (a GGUF file) runs, check its codes or
 * block scales: a NaN code or a non-finite scale is an error naming the
 * tensor (model.c and model_gguf.c check the trunk at load; a container's
 * experts are checked by convert and when the store reads them). Checking
 * a GGUF's experts here rather than at load keeps the load from reading
 * every page of the file. */
static int check_mapped_experts(struct shoal_local_experts *lx, int64_t il, const int32_t *ids,
                             int64_t nb, struct shoal_err *err)
{
    const struct shoal_model_config *c = &lx->model->cfg;
    const struct shoal_layer_weights *L = &lx->model->layers[il];
    for (int64_t i = 0; i < nb; i++) {
        const struct shoal_expert_weights *e = &L->experts[ids[i]];
        const int mx = e->w_gate.dtype == SHOAL_DTYPE_MXFP4;   /* gpt-oss as shipped */
        const int gg = e->w_gate.dtype == SHOAL_DTYPE_GGML || e->w_up.dtype == SHOAL_DTYPE_GGML ||
                       e->w_down.dtype == SHOAL_DTYPE_GGML;
        /* int8 / int4 views: a container's MTP experts, mapped */
        const int qt = shoal_dtype_is_quant(e->w_gate.dtype) ||
                       shoal_dtype_is_quant(e->w_up.dtype) || shoal_dtype_is_quant(e->w_down.dtype);
        if (e->w_gate.dtype != SHOAL_DTYPE_FP8 && e->w_up.dtype != SHOAL_DTYPE_FP8 &&
            e->w_down.dtype != SHOAL_DTYPE_FP8 && !mx && !gg && !qt)
            continue;
        if (!lx->fp8_ok)
            lx->fp8_ok = shoal_xcalloc((size_t)((c->n_layer + c->n_nextn) * c->n_expert), 1);
        uint8_t *ok = &lx->fp8_ok[il * c->n_expert + ids[i]];
        if (*ok)
            continue;
        const struct shoal_weight *w[3] = {&e->w_gate, &e->w_up, &e->w_down};
        const char *hf[3] = {c->family->expert_gate, c->family->expert_up,
                             c->family->expert_down};
        for (int k = 0; k < 3; k++) {
            if (w[k]->dtype == SHOAL_DTYPE_GGML) {
                int rc = check_ggml_expert(w[k], il, ids[i], k, err);
                if (rc)
                    return rc;
                continue;
            }
            if (shoal_dtype_is_quant(w[k]->dtype)) {
                char name[160];
                snprintf(name, sizeof name, "blk.%lld.exp.%d.%s", (long long)il, ids[i],
                         k == 0 ? "w_gate" : k == 1 ? "w_up" : "w_down");
                int rc = shoal_weight_check_scales(w[k], name, err);
                if (rc)
                    return rc;
                continue;
            }
            if (w[k]->dtype != SHOAL_DTYPE_FP8 && w[k]->dtype != SHOAL_DTYPE_MXFP4)
                continue;
            char name[160];
            if (mx)   /* gate and up are the even and odd rows of gate_up_proj */
                snprintf(name, sizeof name, "model.layers.%lld.mlp.experts.%s_scales[%d]%s",
                         (long long)il, hf[k], ids[i],
                         k == 0 ? " (gate: its even rows)" : k == 1 ? " (up: its odd rows)" : "");
            else
                snprintf(name, sizeof name, "model.layers.%lld.%s.experts.%d.%s.weight",
                         (long long)il, c->family->moe_prefix, ids[i], hf[k]);
            int rc = w[k]->dtype == SHOAL_DTYPE_MXFP4 ? shoal_mxfp4_check(w[k], name, err)
                                                      : shoal_fp8_check(w[k], 1, name, err);
            if (rc)
                return rc;
        }
        *ok = 1;
    }
    return 0;
}

/* expert_exec's hook: the caller's, once the first batch's reads are in
 * flight */
struct first_started {
    void (*fn)(void *user);
    void *user;
};

static void on_started(void *user, int64_t i0)
{
    const struct first_started *f = user;
    if (i0 == 0 && f->fn)
        f->fn(f->user);
}

int shoal_local_experts_run(struct shoal_local_experts *lx, const struct shoal_moe_step *st,
                            const int64_t *sel, int64_t n_sel,
                            void (*started)(void *user), void *user, struct shoal_err *err)
{
    const struct shoal_layer_weights *L = &lx->model->layers[st->il];
    const int32_t *ids = st->bu->expert;
    if (sel) {
        for (int64_t i = 0; i < n_sel; i++)
            lx->sel_ids[i] = st->bu->expert[sel[i]];
        ids = lx->sel_ids;
    }
    reserve(lx, st->n_tok * st->k);
    gather(lx, st, sel, n_sel);
    if (lx->store) {
        struct first_started f = {started, user};
        const struct shoal_expert_exec_hooks hooks = {.started = on_started, .user = &f};
        int rc = shoal_expert_exec_run(lx->store, st->il, ids, n_sel, lx->jobs, lx->ew, &hooks,
                                       NULL, err);
        if (rc < 0)
            return rc;
    } else if (lx->model->ct && st->il < lx->model->cfg.n_layer) {
        return shoal_err_set(err, SHOAL_EINVAL, "the container '%s' has no expert store: its "
                             "routed experts are not in RAM (expert_store.h)", lx->model->dir);
    } else {
        int rc = check_mapped_experts(lx, st->il, ids, n_sel, err);
        if (rc)
            return rc;
        for (int64_t i = 0; i < n_sel; i++)
            lx->jobs[i].w = &L->experts[ids[i]];
        shoal_expert_ffn_batch(lx->jobs, n_sel);
    }
    scatter(lx, st, sel, n_sel);
    return 0;
}

/* ---- as an executor ---- */

/* Router lookahead (DESIGN section 3 step 5): while the step's first reads
 * run, hint the store with the experts the next layer will likely use. */
static void hint_next(void *user)
{
    struct shoal_local_experts *lx = user;
    const struct shoal_moe_step *st = lx->st;
    const struct shoal_model_config *c = &lx->model->cfg;
    if (!shoal_expert_store_wants_hints(lx->store) || st->il + 1 >= c->n_layer ||
        !shoal_layer_is_moe(c, st->il + 1) ||
        shoal_expert_store_layer_resident(lx->store, st->il + 1))
        return;
    const int32_t *ids;
    const int64_t n = st->lookahead ? st->lookahead(st->user, &ids) : 0;
    if (n > 0)
        shoal_expert_store_hint(lx->store, st->il + 1, ids, n);
}

static int iface_run(void *impl, const struct shoal_moe_step *st, struct shoal_err *err)
{
    struct shoal_local_experts *lx = impl;
    lx->st = st;
    int rc = shoal_local_experts_run(lx, st, NULL, st->bu->n_used, hint_next, lx, err);
    lx->st = NULL;
    return rc;
}

static const struct shoal_experts_ops local_ops = {.run = iface_run};

struct shoal_experts shoal_local_experts_iface(struct shoal_local_experts *lx)
{
    return (struct shoal_experts){.ops = &local_ops, .impl = lx, .max_rows = 0};
}
