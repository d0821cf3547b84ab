#include "forward.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expert_ffn.h"
#include "expert_store.h"
#include "kernels.h"
#include "kv.h"
#include "log.h"
#include "mla.h"
#include "moe.h"
#include "pages.h"
#include "quant.h"
#include "rope.h"
#include "util.h"

struct shoal_ctx {
    const struct shoal_model *model;   /* borrowed */
    int64_t n_ctx, n_batch, n_seq;
    int64_t *seq_past;/* [n_seq] tokens cached per sequence */
    void *k_cache;    /* [n_seq][n_layer][n_ctx][kv_row] of kv_dtype */
    void *v_cache;    /* [n_seq][n_layer][n_ctx][kv_row] of kv_dtype; NULL for MLA */
    size_t kv_bytes;  /* bytes of each (shoal_pages_map) */
    int64_t kv_row;   /* cache elements per token and layer in k_cache: n_head_kv *
                         head_dim, or for MLA kv_lora_rank + qk_rope_head_dim (the
                         normalised latent and the roped shared key, in one row) */
    enum shoal_dtype kv_dtype;  /* F32, F16 or BF16 (kv.h) */
    size_t kv_es;     /* bytes per cache element */
    struct shoal_rope rope;
    /* the step in progress: its segments, and per row its sequence and position */
    const struct shoal_ctx_seg *segs;
    int n_segs;
    int64_t *seg_row0;/* [n_seq] first row of each segment of the step */
    int64_t *row_seq; /* [B] */
    int64_t *row_pos; /* [B] */
    float *head;      /* [n_seq][n_vocab] logits of the segments' last rows (n_seq > 1) */
    /* scratch, sized for n_batch tokens */
    float *x;         /* [B][n_embd] residual stream */
    float *h;         /* [B][n_embd] normed input */
    float *q;         /* [B][n_head*head_dim] */
    float *k;         /* [B][n_head_kv*head_dim]; MLA: [B][kv_row] kv_a_proj_with_mqa */
    float *v;         /* [B][n_head_kv*head_dim]; MLA: [B][q_lora_rank] q_a_proj */
    float *att;       /* [B][n_head*head_dim]; MLA: [B][n_head][kv_row] */
    float *qm;        /* MLA: [B][n_head][kv_row] absorbed queries */
    float *ov;        /* MLA: [B][n_head*v_head_dim] per-head outputs (o_proj input) */
    float *rbias;     /* [n_expert] the layer's router correction bias as f32 */
    float *sinks;     /* [n_head] the layer's attention sinks as f32 (gpt_oss) */
    float *ov_bias;   /* [n_embd] the layer's o_proj bias as f32 (gpt_oss) */
    float *o;         /* [B][n_embd] */
    float *scores;    /* [attn_round][n_head][n_ctx] (shoal_kv_attend) */
    int64_t attn_round; /* tokens per attention round (kv.h) */
    float *router;    /* [B][n_expert] */
    float *probs;     /* [3*n_expert] router scratch (shoal_router_select) */
    int32_t *ids;     /* [B][k] */
    float *weights;   /* [B][k] */
    float *xg;        /* [B][n_embd] shared expert / dense MLP output */
    float *yg;        /* [B*k][n_embd] expert outputs, by slot */
    float *ffn;       /* [2][B][n_ff_max] shared expert / dense MLP scratch */
    float *shg;       /* [B] shared expert gate logits */
    int32_t *pf_ids;  /* [B][k] router lookahead: the next layer's top-k */
    float *pf_weights;/* [B][k] (unused beyond the select) */
    struct shoal_batch_union bu;
    struct shoal_ctx_timings t;
    /* the routed experts' executor (experts.h) */
    struct shoal_experts experts;
    struct shoal_local_experts *lx;   /* owned: the executor when none was given */
    int64_t cur_n;    /* rows of the layer step in progress */
    int64_t cur_il;   /* its layer */
    int64_t n_kv_layer;      /* layers in the KV cache: n_layer, then the MTP layers' */
    const int64_t *att_past; /* [n_seq] the cached rows attention sees: seq_past, or
                                mtp_attp during an MTP step */
    /* the MTP layers (params.mtp; shoal_ctx_mtp_draft) */
    int mtp;
    float *mtp_hid;   /* [n_seq][n_ctx][n_embd] each position's final normed hidden state */
    int32_t *mtp_tok; /* [n_seq][n_ctx] each position's token */
    int64_t *mtp_past;/* [n_seq] positions the first MTP layer has run (its KV rows) */
    int32_t *mtp_tail;/* [n_seq] the token it paired with position mtp_past - 1 when
                         mtp_past == n_past (that token is not cached yet) */
    uint8_t *mtp_lost;/* [n_seq] 1: cached positions without hidden states (restored) */
    int64_t *mtp_attp;/* [n_seq] */
    float *mtp_in;    /* [B + 1][2 n_embd] [enorm(e) ; hnorm(h)] */
    float *mtp_logits;/* [n_vocab] */
    struct shoal_local_experts *mtp_lx; /* the MTP layers' experts (the model's own) */
};

static float *alloc_f(int64_t n)
{
    return shoal_xcalloc((size_t)(n > 0 ? n : 1), sizeof(float));
}

struct shoal_ctx *shoal_ctx_create(const struct shoal_model *model,
                                   struct shoal_ctx_params p,
                                   struct shoal_err *err)
{
    const struct shoal_model_config *c = &model->cfg;
    if (!shoal_kv_dtype_ok(p.kv_dtype)) {
        shoal_err_set(err, SHOAL_EINVAL, "KV cache dtype %s: expected f32, f16 or bf16",
                      shoal_dtype_name(p.kv_dtype));
        return NULL;
    }
    struct shoal_ctx *ctx = shoal_xcalloc(1, sizeof *ctx);
    ctx->model = model;
    ctx->kv_dtype = p.kv_dtype;
    ctx->kv_es = shoal_dtype_size(p.kv_dtype);
    ctx->n_ctx = p.n_ctx > 0 ? p.n_ctx : (c->max_pos < 4096 ? c->max_pos : 4096);
    ctx->n_batch = p.n_batch > 0 ? p.n_batch : 256;
    ctx->n_seq = p.n_seq > 0 ? p.n_seq : 1;
    if (p.experts && p.experts->max_rows > 0) {
        /* the executor takes at most max_rows rows a step (a worker request's
         * frame: requests are not split); the bits do not depend on the chunk */
        const int64_t K = c->n_expert_used > 0 ? c->n_expert_used : 1;
        const int64_t cap = p.experts->max_rows / K;
        if (cap >= 1 && ctx->n_batch > cap) {
            shoal_log(SHOAL_LOG_INFO, "forward", "prefill chunk %lld tokens (was %lld): a "
                      "step's routed rows stay within the executor's %lld", (long long)cap,
                      (long long)ctx->n_batch, (long long)p.experts->max_rows);
            ctx->n_batch = cap;
        }
    }
    const int64_t B = ctx->n_batch, E = c->n_embd, hd = c->head_dim;
    const int64_t nq = c->n_head * hd, nkv = c->n_head_kv * hd, K = c->n_expert_used;
    const int mla = c->family->mla;
    ctx->kv_row = mla ? c->kv_lora_rank + c->qk_rope_head_dim : nkv;
    if (p.mtp && model->n_mtp <= 0) {
        shoal_err_set(err, SHOAL_EINVAL, "the model has no usable MTP layer: %s",
                      c->n_nextn > 0 ? model->mtp_why
                                     : "its config has no num_nextn_predict_layers");
        free(ctx);
        return NULL;
    }
    ctx->mtp = p.mtp;
    ctx->n_kv_layer = c->n_layer + (p.mtp ? model->n_mtp : 0);
    size_t kv_elems = 0, kv_bytes = 0;
    if (shoal_mul_overflow((size_t)ctx->n_seq * (size_t)ctx->n_kv_layer * (size_t)ctx->n_ctx,
                           (size_t)ctx->kv_row, &kv_elems) ||
        shoal_mul_overflow(kv_elems, ctx->kv_es, &kv_bytes)) {
        shoal_err_set(err, SHOAL_ENOMEM, "KV cache size overflows for n_ctx=%lld",
                      (long long)ctx->n_ctx);
        free(ctx);
        return NULL;
    }
    /* zeroed anonymous pages, on huge pages where the kernel offers them
     * (pages.h): attention streams the cache at long contexts */
    ctx->kv_bytes = kv_bytes;
    ctx->k_cache = shoal_pages_map(kv_bytes);
    ctx->v_cache = mla ? NULL : shoal_pages_map(kv_bytes);
    if (!ctx->k_cache || (!mla && !ctx->v_cache)) {
        shoal_err_set(err, SHOAL_ENOMEM,
                      "cannot allocate the KV cache: %d x %zu bytes (%s) for n_ctx=%lld x "
                      "%lld sequences (use --ctx to lower it%s)", mla ? 1 : 2, kv_bytes,
                      shoal_kv_dtype_name(ctx->kv_dtype), (long long)ctx->n_ctx,
                      (long long)ctx->n_seq,
                      ctx->kv_dtype == SHOAL_DTYPE_F32 ? ", or --kv f16 to halve it" : "");
        shoal_pages_unmap(ctx->k_cache, ctx->kv_bytes);
        shoal_pages_unmap(ctx->v_cache, ctx->kv_bytes);
        free(ctx);
        return NULL;
    }
    if (p.mtp) {
        size_t hid = 0;
        if (!shoal_mul_overflow((size_t)(ctx->n_seq * ctx->n_ctx), (size_t)E, &hid))
            ctx->mtp_hid = calloc(hid, sizeof(float));
        if (!ctx->mtp_hid) {
            shoal_err_set(err, SHOAL_ENOMEM, "cannot allocate the MTP layer's hidden states: "
                          "%lld positions x %lld floats (use --ctx to lower it)",
                          (long long)(ctx->n_seq * ctx->n_ctx), (long long)E);
            shoal_pages_unmap(ctx->k_cache, ctx->kv_bytes);
            shoal_pages_unmap(ctx->v_cache, ctx->kv_bytes);
            free(ctx);
            return NULL;
        }
        ctx->mtp_tok = shoal_xcalloc((size_t)(ctx->n_seq * ctx->n_ctx), sizeof(int32_t));
        ctx->mtp_past = shoal_xcalloc((size_t)ctx->n_seq, sizeof(int64_t));
        ctx->mtp_tail = shoal_xcalloc((size_t)ctx->n_seq, sizeof(int32_t));
        ctx->mtp_lost = shoal_xcalloc((size_t)ctx->n_seq, 1);
        ctx->mtp_attp = shoal_xcalloc((size_t)ctx->n_seq, sizeof(int64_t));
        ctx->mtp_in = alloc_f((ctx->n_batch + 1) * 2 * E);   /* + the chained hidden */
        ctx->mtp_logits = alloc_f(c->n_vocab);
        ctx->mtp_lx = shoal_local_experts_create(model, NULL);
    }
    shoal_rope_init(&ctx->rope, c);
    ctx->seq_past = shoal_xcalloc((size_t)ctx->n_seq, sizeof(int64_t));
    ctx->att_past = ctx->seq_past;
    ctx->seg_row0 = shoal_xcalloc((size_t)ctx->n_seq, sizeof(int64_t));
    ctx->row_seq = shoal_xcalloc((size_t)B, sizeof(int64_t));
    ctx->row_pos = shoal_xcalloc((size_t)B, sizeof(int64_t));
    int64_t ff_max = c->n_ff_exp;
    if (c->n_ff > ff_max)
        ff_max = c->n_ff;
    if (c->n_ff_shexp > ff_max)
        ff_max = c->n_ff_shexp;
    int64_t rows_max = B * K > B ? B * K : B;
    ctx->x = alloc_f(B * E);
    ctx->h = alloc_f(B * E);
    ctx->q = alloc_f(B * nq);
    ctx->k = alloc_f(B * (mla ? ctx->kv_row : nkv));
    ctx->v = alloc_f(B * (mla ? c->q_lora_rank : nkv));
    ctx->att = alloc_f(B * (mla ? c->n_head * ctx->kv_row : nq));
    if (mla) {
        ctx->qm = alloc_f(B * c->n_head * ctx->kv_row);
        ctx->ov = alloc_f(B * c->n_head * c->v_head_dim);
    }
    ctx->rbias = alloc_f(c->n_expert);
    ctx->sinks = alloc_f(c->n_head);
    ctx->ov_bias = alloc_f(E);
    ctx->o = alloc_f(B * E);
    ctx->attn_round = shoal_kv_attn_round(c->n_head, ctx->n_ctx, B);
    ctx->scores = alloc_f(ctx->attn_round * c->n_head * ctx->n_ctx);
    ctx->router = alloc_f(B * c->n_expert);
    ctx->probs = alloc_f(3 * c->n_expert);
    ctx->ids = shoal_xcalloc((size_t)(B * K), sizeof(int32_t));
    ctx->weights = alloc_f(B * K);
    ctx->xg = alloc_f(B * E);
    ctx->yg = alloc_f(rows_max * E);
    ctx->ffn = alloc_f(2 * B * ff_max);
    ctx->shg = alloc_f(B);
    ctx->pf_ids = shoal_xcalloc((size_t)(B * K), sizeof(int32_t));
    ctx->pf_weights = alloc_f(B * K);
    shoal_batch_union_init(&ctx->bu, c->n_expert, B * K);
    if (p.experts) {
        ctx->experts = *p.experts;
    } else {
        ctx->lx = shoal_local_experts_create(model, model->store);
        ctx->experts = shoal_local_experts_iface(ctx->lx);
    }
    return ctx;
}

void shoal_ctx_free(struct shoal_ctx *ctx)
{
    if (!ctx)
        return;
    shoal_pages_unmap(ctx->k_cache, ctx->kv_bytes);
    shoal_pages_unmap(ctx->v_cache, ctx->kv_bytes);
    free(ctx->seq_past);
    free(ctx->seg_row0);
    free(ctx->row_seq);
    free(ctx->row_pos);
    free(ctx->head);
    shoal_rope_free(&ctx->rope);
    free(ctx->x);
    free(ctx->h);
    free(ctx->q);
    free(ctx->k);
    free(ctx->v);
    free(ctx->att);
    free(ctx->qm);
    free(ctx->ov);
    free(ctx->rbias);
    free(ctx->sinks);
    free(ctx->ov_bias);
    free(ctx->o);
    free(ctx->scores);
    free(ctx->router);
    free(ctx->probs);
    free(ctx->ids);
    free(ctx->weights);
    free(ctx->xg);
    free(ctx->yg);
    free(ctx->ffn);
    free(ctx->shg);
    free(ctx->pf_ids);
    free(ctx->pf_weights);
    shoal_batch_union_free(&ctx->bu);
    shoal_local_experts_free(ctx->lx);
    free(ctx->mtp_hid);
    free(ctx->mtp_tok);
    free(ctx->mtp_past);
    free(ctx->mtp_tail);
    free(ctx->mtp_lost);
    free(ctx->mtp_attp);
    free(ctx->mtp_in);
    free(ctx->mtp_logits);
    shoal_local_experts_free(ctx->mtp_lx);
    free(ctx);
}

int64_t shoal_ctx_n_past(const struct shoal_ctx *ctx) { return ctx->seq_past[0]; }
int64_t shoal_ctx_n_ctx(const struct shoal_ctx *ctx) { return ctx->n_ctx; }
int64_t shoal_ctx_n_seq(const struct shoal_ctx *ctx) { return ctx->n_seq; }
int64_t shoal_ctx_n_batch(const struct shoal_ctx *ctx) { return ctx->n_batch; }

int64_t shoal_ctx_seq_n_past(const struct shoal_ctx *ctx, int64_t seq)
{
    return seq >= 0 && seq < ctx->n_seq ? ctx->seq_past[seq] : 0;
}

/* Byte offset of position pos of layer il of sequence seq in k_cache (and
 * v_cache). */
static size_t kv_off(const struct shoal_ctx *ctx, int64_t seq, int64_t il, int64_t pos)
{
    return (size_t)(((seq * ctx->n_kv_layer + il) * ctx->n_ctx + pos) * ctx->kv_row) *
           ctx->kv_es;
}
enum shoal_dtype shoal_ctx_kv_dtype(const struct shoal_ctx *ctx) { return ctx->kv_dtype; }

uint64_t shoal_ctx_kv_bytes(const struct shoal_ctx *ctx)
{
    const struct shoal_model_config *c = &ctx->model->cfg;
    return (uint64_t)ctx->n_seq * (uint64_t)ctx->n_kv_layer * (uint64_t)ctx->n_ctx *
           (uint64_t)shoal_kv_elems_per_token(c) * ctx->kv_es;
}

/* The MTP layer's pair at position n - 1 takes the token at n: when the
 * cache is cut to n tokens that token may change, so it runs again. */
static void mtp_cut(struct shoal_ctx *ctx, int64_t seq, int64_t n)
{
    if (!ctx->mtp)
        return;
    const int64_t keep = n > 0 ? n - 1 : 0;
    if (ctx->mtp_past[seq] > keep)
        ctx->mtp_past[seq] = keep;
    if (n == 0)
        ctx->mtp_lost[seq] = 0;
}

void shoal_ctx_seq_truncate(struct shoal_ctx *ctx, int64_t seq, int64_t n)
{
    if (seq >= 0 && seq < ctx->n_seq && n >= 0 && n < ctx->seq_past[seq]) {
        ctx->seq_past[seq] = n;
        mtp_cut(ctx, seq, n);
    }
}

void shoal_ctx_truncate(struct shoal_ctx *ctx, int64_t n)
{
    shoal_ctx_seq_truncate(ctx, 0, n);
}

void shoal_ctx_seq_copy(struct shoal_ctx *ctx, int64_t dst, int64_t src, int64_t n)
{
    if (n > ctx->seq_past[src])
        n = ctx->seq_past[src];
    if (dst != src && n > 0) {
        const size_t bytes = (size_t)(n * ctx->kv_row) * ctx->kv_es;
        for (int64_t il = 0; il < ctx->n_kv_layer; il++) {
            memcpy((char *)ctx->k_cache + kv_off(ctx, dst, il, 0),
                   (const char *)ctx->k_cache + kv_off(ctx, src, il, 0), bytes);
            if (ctx->v_cache)
                memcpy((char *)ctx->v_cache + kv_off(ctx, dst, il, 0),
                       (const char *)ctx->v_cache + kv_off(ctx, src, il, 0), bytes);
        }
        if (ctx->mtp) {
            const int64_t E = ctx->model->cfg.n_embd;
            memcpy(ctx->mtp_hid + dst * ctx->n_ctx * E, ctx->mtp_hid + src * ctx->n_ctx * E,
                   (size_t)(n * E) * sizeof(float));
            memcpy(ctx->mtp_tok + dst * ctx->n_ctx, ctx->mtp_tok + src * ctx->n_ctx,
                   (size_t)n * sizeof(int32_t));
        }
    }
    if (ctx->mtp && dst != src) {
        ctx->mtp_past[dst] = ctx->mtp_past[src] < n ? ctx->mtp_past[src] : n;
        ctx->mtp_tail[dst] = ctx->mtp_tail[src];
        ctx->mtp_lost[dst] = n > 0 && ctx->mtp_lost[src];
    }
    ctx->seq_past[dst] = n;
    mtp_cut(ctx, dst, n);
}

void *shoal_ctx_seq_kv(struct shoal_ctx *ctx, int64_t seq, int64_t il, int v,
                       size_t *row_bytes)
{
    *row_bytes = (size_t)ctx->kv_row * ctx->kv_es;
    void *base = v ? ctx->v_cache : ctx->k_cache;
    return base ? (char *)base + kv_off(ctx, seq, il, 0) : NULL;
}

void shoal_ctx_seq_set_past(struct shoal_ctx *ctx, int64_t seq, int64_t n)
{
    if (seq >= 0 && seq < ctx->n_seq && n >= 0 && n <= ctx->n_ctx) {
        ctx->seq_past[seq] = n;
        if (ctx->mtp) {   /* rows written by the caller: no hidden states came with them */
            ctx->mtp_past[seq] = 0;
            ctx->mtp_lost[seq] = n > 0;
        }
    }
}

const struct shoal_ctx_timings *shoal_ctx_timings(const struct shoal_ctx *ctx)
{
    return &ctx->t;
}

/* Segment k's attention over its own sequence's cache of layer il: its
 * rows of q (q_ld floats apart) at positions n_past(seq).. into its rows of
 * out. Fields the caller sets: head counts, dims, window, sinks. */
static struct shoal_kv_attn seg_attn(const struct shoal_ctx *ctx, int64_t il, int k,
                                     float *out, const float *q, int64_t q_ld, int has_v)
{
    const struct shoal_ctx_seg *sg = &ctx->segs[k];
    const int64_t r0 = ctx->seg_row0[k];
    const size_t off = kv_off(ctx, sg->seq, il, 0);
    const void *kc = (const char *)ctx->k_cache + off;
    return (struct shoal_kv_attn){
        .out = out + r0 * q_ld, .q = q + r0 * q_ld, .k = kc,
        .v = has_v ? (const char *)ctx->v_cache + off : kc,
        .scores = ctx->scores, .scores_ld = ctx->n_ctx, .round = ctx->attn_round,
        .n = sg->n, .n_past = ctx->att_past[sg->seq], .t = ctx->kv_dtype};
}

/* Self-attention of the step's n rows, each segment at its positions over
 * its sequence's cache of layer il (shoal_kv_attend: the query heads of a
 * KV head and a round of tokens together over tiles of cached rows), then
 * the output projection, in one OpenMP region. Writes ctx->att
 * [n][n_head*head_dim] and ctx->o = att . wo^T [n][n_embd]. */
static void attention(struct shoal_ctx *ctx, int64_t il, int64_t n,
                      const struct shoal_weight *wo)
{
    const struct shoal_model_config *c = &ctx->model->cfg;
    const struct shoal_weight *sinks = &ctx->model->layers[il].sinks;
    const int64_t nq = c->n_head * c->head_dim;
    if (sinks->data)   /* gpt_oss: one logit per head (bf16 in the file) as f32 */
        shoal_weight_row_to_f32(ctx->sinks, sinks, 0);

#pragma omp parallel
    {
        const int nth = omp_get_num_threads(), ith = omp_get_thread_num();
        for (int k = 0; k < ctx->n_segs; k++) {
            struct shoal_kv_attn a = seg_attn(ctx, il, k, ctx->att, ctx->q, nq, 1);
            a.n_head = c->n_head;
            a.n_head_kv = c->n_head_kv;
            a.head_dim = c->head_dim;
            a.window = shoal_layer_uses_window(c, il) ? c->sliding_window : 0;
            a.sinks = sinks->data ? ctx->sinks : NULL;
            shoal_kv_attend(&a, ith, nth);
#pragma omp barrier
        }
        shoal_linear_part(ctx->o, ctx->att, n, wo, ith, nth, NULL);  /* [n][E] */
    }
}

/* MLA attention of n tokens over layer il's compressed cache (mla.h), then
 * o_proj, in one OpenMP region: absorbed queries ctx->qm, attention as MQA
 * over cache rows [latent ; k_pe] (values: the latent) into ctx->att, the
 * per-head W^UV products into ctx->ov, and ctx->o = ov . wo^T. */
static void mla_attention(struct shoal_ctx *ctx, int64_t il, int64_t n)
{
    const struct shoal_model_config *c = &ctx->model->cfg;
    const struct shoal_layer_weights *L = &ctx->model->layers[il];
    const int64_t ld = c->n_head * ctx->kv_row;
    /* softmax scale (nope + rope)^-0.5 x mscale^2 (DeepseekV2Attention) */
    const float div = (float)(sqrt((double)c->head_dim) / c->attn_scale);
#pragma omp parallel
    {
        const int nth = omp_get_num_threads(), ith = omp_get_thread_num();
        float *row = shoal_xcalloc((size_t)c->kv_lora_rank, sizeof(float));
        shoal_mla_absorb_q(ctx->qm, ctx->q, n, &L->wkv_b, &L->wk_b, c, row, ith, nth);
#pragma omp barrier
        for (int k = 0; k < ctx->n_segs; k++) {
            struct shoal_kv_attn a = seg_attn(ctx, il, k, ctx->att, ctx->qm, ld, 0);
            a.n_head = c->n_head;
            a.n_head_kv = 1;
            a.head_dim = ctx->kv_row;
            a.score_div = div;
            a.v_dim = c->kv_lora_rank;
            shoal_kv_attend(&a, ith, nth);
#pragma omp barrier
        }
        shoal_mla_out(ctx->ov, ctx->att, n, &L->wkv_b, &L->wv_b, c, row, ith, nth);
#pragma omp barrier
        shoal_linear_part(ctx->o, ctx->ov, n, &L->wo, ith, nth, NULL);  /* [n][E] */
        free(row);
    }
}

/* MLA block (DeepseekV2Attention in modeling_deepseek.py): q from q_proj or
 * q_b_proj(q_a_layernorm(q_a_proj(h))), the latent and the shared rope key
 * from kv_a_proj_with_mqa, the latent normalised (kv_a_layernorm, eps
 * 1e-6) and stored with the roped key as one cache row. */
static void mla_attention_block(struct shoal_ctx *ctx, int64_t il, int64_t n)
{
    const struct shoal_model_config *c = &ctx->model->cfg;
    const struct shoal_layer_weights *L = &ctx->model->layers[il];
    const int64_t E = c->n_embd, H = c->n_head, hd = c->head_dim, row = ctx->kv_row;
    const int64_t kvl = c->kv_lora_rank, ql = c->q_lora_rank;
    const float lora_eps = 1e-6f;   /* DeepseekV2RMSNorm's default: not rms_norm_eps */

    shoal_rmsnorm(ctx->h, ctx->x, n, E, &L->attn_norm, (float)c->rms_norm_eps);
    const struct shoal_linear_job first[2] = {                       /* one region */
        {ctx->k, ctx->h, n, &L->wkv_a, NULL},                        /* [n][kvl+rope] */
        ql ? (struct shoal_linear_job){ctx->v, ctx->h, n, &L->wq_a, NULL}   /* [n][ql] */
           : (struct shoal_linear_job){ctx->q, ctx->h, n, &L->wq, NULL},    /* [n][H*hd] */
    };
    shoal_linear_many(first, 2);
    if (ql) {
        shoal_rmsnorm(ctx->v, ctx->v, n, ql, &L->q_a_norm, lora_eps);
        shoal_linear(ctx->q, ctx->v, n, &L->wq_b, NULL);            /* [n][H*hd] */
    }
    for (int64_t t = 0; t < n; t++) {
        const int64_t pos = ctx->row_pos[t];
        float *kv = ctx->k + t * row;
        shoal_rmsnorm(kv, kv, 1, kvl, &L->kv_a_norm, lora_eps);
        shoal_rope_apply(&ctx->rope, kv + kvl, 1, row, pos);          /* k_pe */
        shoal_rope_apply(&ctx->rope, ctx->q + t * H * hd + c->qk_nope_head_dim, H, hd, pos);
        const size_t off = kv_off(ctx, ctx->row_seq[t], il, pos);
        shoal_kv_store_row((char *)ctx->k_cache + off, kv, row, ctx->kv_dtype);
    }
    mla_attention(ctx, il, n);                                        /* o [n][E] */
    for (int64_t i = 0; i < n * E; i++)
        ctx->x[i] += ctx->o[i];
}

static void attention_block(struct shoal_ctx *ctx, int64_t il, int64_t n)
{
    const struct shoal_model *m = ctx->model;
    const struct shoal_model_config *c = &m->cfg;
    const struct shoal_layer_weights *L = &m->layers[il];
    const int64_t E = c->n_embd, hd = c->head_dim;
    const int64_t nq = c->n_head * hd, nkv = c->n_head_kv * hd;
    const float eps = (float)c->rms_norm_eps;

    if (c->family->mla) {
        mla_attention_block(ctx, il, n);
        return;
    }
    shoal_rmsnorm(ctx->h, ctx->x, n, E, &L->attn_norm, eps);        /* [n][E] */
    const struct shoal_linear_job qkv[3] = {                          /* one region */
        {ctx->q, ctx->h, n, &L->wq, L->bq.data ? &L->bq : NULL},     /* [n][nq] */
        {ctx->k, ctx->h, n, &L->wk, L->bk.data ? &L->bk : NULL},     /* [n][nkv] */
        {ctx->v, ctx->h, n, &L->wv, L->bv.data ? &L->bv : NULL},     /* [n][nkv] */
    };
    shoal_linear_many(qkv, 3);
    switch (c->qk_norm) {
    case SHOAL_QK_NORM_FULL: /* olmoe: over the whole projection, before clip */
        shoal_rmsnorm(ctx->q, ctx->q, n, nq, &L->q_norm, eps);
        shoal_rmsnorm(ctx->k, ctx->k, n, nkv, &L->k_norm, eps);
        break;
    case SHOAL_QK_NORM_HEAD: /* qwen3_moe: per head, before RoPE */
        shoal_rmsnorm(ctx->q, ctx->q, n * c->n_head, hd, &L->q_norm, eps);
        shoal_rmsnorm(ctx->k, ctx->k, n * c->n_head_kv, hd, &L->k_norm, eps);
        break;
    default:
        break;
    }
    if (c->clip_qkv > 0) {
        const float lim = (float)c->clip_qkv;
        float *bufs[3] = {ctx->q, ctx->k, ctx->v};
        int64_t lens[3] = {n * nq, n * nkv, n * nkv};
        for (int b = 0; b < 3; b++)
            for (int64_t i = 0; i < lens[b]; i++)
                bufs[b][i] = bufs[b][i] < -lim ? -lim : (bufs[b][i] > lim ? lim : bufs[b][i]);
    }
    for (int64_t t = 0; t < n; t++) {
        const int64_t pos = ctx->row_pos[t];
        shoal_rope_apply(&ctx->rope, ctx->q + t * nq, c->n_head, hd, pos);
        shoal_rope_apply(&ctx->rope, ctx->k + t * nkv, c->n_head_kv, hd, pos);
        const size_t off = kv_off(ctx, ctx->row_seq[t], il, pos);
        shoal_kv_store_row((char *)ctx->k_cache + off, ctx->k + t * nkv, nkv, ctx->kv_dtype);
        shoal_kv_store_row((char *)ctx->v_cache + off, ctx->v + t * nkv, nkv, ctx->kv_dtype);
    }
    attention(ctx, il, n, &L->wo);                       /* att [n][nq], o [n][E] */
    if (L->bo.data) {                                     /* gpt_oss: o_proj bias */
        shoal_weight_row_to_f32(ctx->ov_bias, &L->bo, 0);
        for (int64_t t = 0; t < n; t++)
            for (int64_t i = 0; i < E; i++)
                ctx->o[t * E + i] += ctx->ov_bias[i];
    }
    for (int64_t i = 0; i < n * E; i++)
        ctx->x[i] += ctx->o[i];
}

/* Layer il's router (moe.h), its correction bias converted to f32 in
 * ctx->rbias when it has one. */
static struct shoal_router router_of(struct shoal_ctx *ctx, int64_t il)
{
    const struct shoal_model_config *c = &ctx->model->cfg;
    const struct shoal_weight *b = &ctx->model->layers[il].router_bias;
    if (b->data)
        shoal_weight_row_to_f32(ctx->rbias, b, 0);
    return shoal_router_of(c, b->data ? ctx->rbias : NULL);
}

/* The router lookahead (experts.h, struct shoal_moe_step): layer il+1's
 * router on the rows layer il routes (ctx->h [n][E]), its top-k into
 * ctx->pf_ids. Only scratch is written (ctx->router, ctx->probs, ctx->pf_*):
 * the forward pass and its logits are the same with or without it. */
static int64_t lookahead(void *user, const int32_t **ids)
{
    struct shoal_ctx *ctx = user;
    const struct shoal_model *m = ctx->model;
    const struct shoal_model_config *c = &m->cfg;
    const int64_t il = ctx->cur_il, n = ctx->cur_n, K = c->n_expert_used;
    if (il + 1 >= c->n_layer || !shoal_layer_is_moe(c, il + 1))
        return 0;
    shoal_linear(ctx->router, ctx->h, n, &m->layers[il + 1].w_router, NULL); /* [n][NE] */
    const struct shoal_router r = router_of(ctx, il + 1);
    shoal_router_select(&r, ctx->router, n, ctx->probs, ctx->pf_ids,
                        ctx->pf_weights);                            /* [n][K] */
    *ids = ctx->pf_ids;
    return n * K;
}

/* Sparse MoE block on ctx->h [n][E]; result (routed + shared) in ctx->o.
 * The batch-union runs on the context's executor (experts.h: in-process, or
 * the cluster's); either way each expert's unweighted output
 * lands in its own slots of ctx->yg and the combine is in route-rank
 * order, so the logits do not depend on where an expert ran. Returns 0 or
 * the executor's error (err set). */
static int moe_block(struct shoal_ctx *ctx, int64_t il, int64_t n, struct shoal_err *err)
{
    const struct shoal_model *m = ctx->model;
    const struct shoal_model_config *c = &m->cfg;
    const struct shoal_layer_weights *L = &m->layers[il];
    const int64_t E = c->n_embd, K = c->n_expert_used, NE = c->n_expert;
    double t0 = shoal_time_s();

    shoal_linear(ctx->router, ctx->h, n, &L->w_router, NULL);        /* [n][NE] */
    const struct shoal_router r = router_of(ctx, il);
    shoal_router_select(&r, ctx->router, n, ctx->probs, ctx->ids, ctx->weights); /* [n][K] */
    shoal_batch_union_build(&ctx->bu, ctx->ids, n, K, NE);
    if (m->store && il < c->n_layer)
        shoal_expert_store_learn(m->store, il, ctx->ids, n, K);
    double t1 = shoal_time_s();

    /* each distinct expert once, over all rows routed to it, on the executor */
    ctx->cur_il = il;
    ctx->cur_n = n;
    const struct shoal_moe_step st = {.il = il, .n_tok = n, .k = K, .h = ctx->h,
                                      .bu = &ctx->bu, .yg = ctx->yg,
                                      .lookahead = lookahead, .user = ctx};
    int rc = ctx->experts.ops->run(ctx->experts.impl, &st, err);
    if (ctx->experts.ops->take_network_s)
        ctx->t.network += ctx->experts.ops->take_network_s(ctx->experts.impl);
    if (rc < 0)
        return rc;
    double t2 = shoal_time_s();
    shoal_moe_combine(ctx->o, ctx->yg, ctx->weights, n, K, E);       /* [n][E] */
    double t3 = shoal_time_s();
    if (c->n_ff_shexp > 0 && c->shexp_gated) {
        /* qwen2_moe: sigmoid(shared_expert_gate(x)) * shared_expert(x) */
        shoal_expert_ffn(ctx->xg, ctx->h, n, &L->shexp, ctx->ffn);   /* [n][E] */
        shoal_linear(ctx->shg, ctx->h, n, &L->w_shexp_gate, NULL);   /* [n][1] */
        for (int64_t t = 0; t < n; t++) {
            const float g = 1.0f / (1.0f + shoal_expf(-ctx->shg[t]));
            for (int64_t i = 0; i < E; i++)
                ctx->o[t * E + i] += g * ctx->xg[t * E + i];
        }
    } else if (c->n_ff_shexp > 0) {
        /* DeepSeek, GLM: routed + shared_experts(x), ungated */
        shoal_expert_ffn(ctx->xg, ctx->h, n, &L->shexp, ctx->ffn);   /* [n][E] */
        for (int64_t i = 0; i < n * E; i++)
            ctx->o[i] += ctx->xg[i];
    }
    double t4 = shoal_time_s();
    ctx->t.routing += t1 - t0;
    ctx->t.experts += (t2 - t1) + (t4 - t3);
    ctx->t.expert_wait += t2 - t1;
    ctx->t.combine += t3 - t2;
    return 0;
}

/* The head of the step: for each segment that wants logits, the final
 * norm and lm_head of all its rows or of its last. The last rows of
 * several segments go through lm_head together (one pass over it) via
 * ctx->head; each row's bits are those of a lone row. */
static void eval_head(struct shoal_ctx *ctx)
{
    const struct shoal_model *m = ctx->model;
    const struct shoal_model_config *c = &m->cfg;
    const int64_t E = c->n_embd, V = c->n_vocab;
    const float eps = (float)c->rms_norm_eps;
    int64_t nl = 0;
    for (int k = 0; k < ctx->n_segs; k++) {   /* every row (perplexity) */
        const struct shoal_ctx_seg *sg = &ctx->segs[k];
        if (!sg->logits || !sg->all_logits)
            continue;
        shoal_rmsnorm(ctx->h, ctx->x + ctx->seg_row0[k] * E, sg->n, E, &m->out_norm, eps);
        shoal_linear(sg->logits, ctx->h, sg->n, &m->lm_head, NULL);       /* [n][V] */
    }
    for (int k = 0; k < ctx->n_segs; k++) {   /* last rows, together */
        const struct shoal_ctx_seg *sg = &ctx->segs[k];
        if (sg->logits && !sg->all_logits)
            shoal_rmsnorm(ctx->h + (nl++) * E, ctx->x + (ctx->seg_row0[k] + sg->n - 1) * E,
                          1, E, &m->out_norm, eps);
    }
    if (nl == 0)
        return;
    float *out = NULL;
    if (nl == 1) {
        for (int k = 0; k < ctx->n_segs && !out; k++)
            if (ctx->segs[k].logits && !ctx->segs[k].all_logits)
                out = ctx->segs[k].logits;
        shoal_linear(out, ctx->h, 1, &m->lm_head, NULL);                 /* [V] */
        return;
    }
    if (!ctx->head)
        ctx->head = alloc_f(ctx->n_seq * V);
    shoal_linear(ctx->head, ctx->h, nl, &m->lm_head, NULL);              /* [nl][V] */
    int64_t i = 0;
    for (int k = 0; k < ctx->n_segs; k++)
        if (ctx->segs[k].logits && !ctx->segs[k].all_logits)
            memcpy(ctx->segs[k].logits, ctx->head + (i++) * V, (size_t)V * sizeof(float));
}

/* Layer il (a decoder layer, or an MTP layer's block) over the step's n
 * rows of the residual stream ctx->x: attention, then the MoE block or
 * the dense MLP. */
static int layer_step(struct shoal_ctx *ctx, int64_t il, int64_t n, struct shoal_err *err)
{
    const struct shoal_model *m = ctx->model;
    const struct shoal_model_config *c = &m->cfg;
    const int64_t E = c->n_embd;
    double t0 = shoal_time_s();
    attention_block(ctx, il, n);
    double t1 = shoal_time_s();
    ctx->t.attention += t1 - t0;
    shoal_rmsnorm(ctx->h, ctx->x, n, E, &m->layers[il].ffn_norm, (float)c->rms_norm_eps);
    if (shoal_layer_is_moe(c, il)) {
        int rc = moe_block(ctx, il, n, err);
        if (rc)
            return rc;
    } else {
        shoal_expert_ffn(ctx->o, ctx->h, n, &m->layers[il].mlp, ctx->ffn);
        ctx->t.experts += shoal_time_s() - t1;
    }
    for (int64_t i = 0; i < n * E; i++)
        ctx->x[i] += ctx->o[i];
    return 0;
}

/* The MTP bookkeeping of a step (params.mtp): each row's token, and after
 * the layers (mtp_keep_hidden) its final normed hidden state, by position.
 * A sequence whose MTP layer had paired its last position with a token
 * other than the one this step appends runs that position again. */
static void mtp_note_tokens(struct shoal_ctx *ctx)
{
    for (int k = 0; k < ctx->n_segs; k++) {
        const struct shoal_ctx_seg *sg = &ctx->segs[k];
        const int64_t past = ctx->seq_past[sg->seq];
        if (ctx->mtp_past[sg->seq] == past && past > 0 && ctx->mtp_tail[sg->seq] != sg->tokens[0])
            ctx->mtp_past[sg->seq] = past - 1;
        memcpy(ctx->mtp_tok + sg->seq * ctx->n_ctx + past, sg->tokens,
               (size_t)sg->n * sizeof(int32_t));
    }
}

static void mtp_keep_hidden(struct shoal_ctx *ctx, int64_t n)
{
    const struct shoal_model *m = ctx->model;
    const int64_t E = m->cfg.n_embd;
    for (int64_t t = 0; t < n; t++)
        shoal_rmsnorm(ctx->mtp_hid + (ctx->row_seq[t] * ctx->n_ctx + ctx->row_pos[t]) * E,
                      ctx->x + t * E, 1, E, &m->out_norm, (float)m->cfg.rms_norm_eps);
}

/* One step over ctx->segs (checked: rows <= n_batch, positions in range). */
static int eval_step(struct shoal_ctx *ctx, struct shoal_err *err)
{
    const struct shoal_model *m = ctx->model;
    const struct shoal_model_config *c = &m->cfg;
    const int64_t E = c->n_embd;

    int64_t n = 0, max_pos = 0;
    ctx->att_past = ctx->seq_past;
    if (ctx->mtp)
        mtp_note_tokens(ctx);
    for (int k = 0; k < ctx->n_segs; k++) {
        const struct shoal_ctx_seg *sg = &ctx->segs[k];
        const int64_t past = ctx->seq_past[sg->seq];
        ctx->seg_row0[k] = n;
        for (int64_t t = 0; t < sg->n; t++, n++) {
            ctx->row_seq[n] = sg->seq;
            ctx->row_pos[n] = past + t;
            shoal_weight_row_to_f32(ctx->x + n * E, &m->tok_embd, sg->tokens[t]); /* [n][E] */
        }
        if (past + sg->n > max_pos)
            max_pos = past + sg->n;
    }
    shoal_rope_update(&ctx->rope, max_pos);
    ctx->t.tokens += n;
    for (int64_t il = 0; il < c->n_layer; il++) {
        int rc = layer_step(ctx, il, n, err);
        if (rc)
            return rc;
    }
    if (ctx->mtp)
        mtp_keep_hidden(ctx, n);
    for (int k = 0; k < ctx->n_segs; k++)
        ctx->seq_past[ctx->segs[k].seq] += ctx->segs[k].n;
    double t0 = shoal_time_s();
    eval_head(ctx);
    ctx->t.head += shoal_time_s() - t0;
    return 0;
}

/* Check a segment's room in its sequence and its token ids. */
static int check_seg(const struct shoal_ctx *ctx, const struct shoal_ctx_seg *sg,
                     struct shoal_err *err)
{
    const struct shoal_model_config *c = &ctx->model->cfg;
    const int64_t past = ctx->seq_past[sg->seq], n = sg->n;
    if (n > ctx->n_ctx - past)
        return shoal_err_set(err, SHOAL_ERANGE,
                             "sequence of %lld tokens (%lld cached + %lld new) exceeds "
                             "the context of %lld tokens (raise --ctx, at most "
                             "max_position_embeddings=%lld)",
                             (long long)(past + n), (long long)past,
                             (long long)n, (long long)ctx->n_ctx,
                             (long long)c->max_pos);
    for (int64_t i = 0; i < n; i++)
        if (sg->tokens[i] < 0 || sg->tokens[i] >= c->n_vocab)
            return shoal_err_set(err, SHOAL_ERANGE,
                                 "token id %d at position %lld is outside the "
                                 "vocabulary [0, %lld)", sg->tokens[i], (long long)i,
                                 (long long)c->n_vocab);
    return 0;
}

int shoal_ctx_eval_segs(struct shoal_ctx *ctx, const struct shoal_ctx_seg *segs, int n_segs,
                        struct shoal_err *err)
{
    if (n_segs < 1 || n_segs > ctx->n_seq)
        return shoal_err_set(err, SHOAL_EINVAL, "a step of %d segments: expected 1 to %lld "
                             "(the context's sequences)", n_segs, (long long)ctx->n_seq);
    int64_t rows = 0;
    for (int k = 0; k < n_segs; k++) {
        const struct shoal_ctx_seg *sg = &segs[k];
        if (sg->seq < 0 || sg->seq >= ctx->n_seq)
            return shoal_err_set(err, SHOAL_EINVAL, "segment %d: sequence %lld outside "
                                 "[0, %lld)", k, (long long)sg->seq, (long long)ctx->n_seq);
        if (sg->n < 1)
            return shoal_err_set(err, SHOAL_EINVAL, "segment %d: no tokens", k);
        for (int j = 0; j < k; j++)
            if (segs[j].seq == sg->seq)
                return shoal_err_set(err, SHOAL_EINVAL, "segments %d and %d: both on "
                                     "sequence %lld", j, k, (long long)sg->seq);
        int rc = check_seg(ctx, sg, err);
        if (rc)
            return rc;
        rows += sg->n;
    }
    if (rows > ctx->n_batch)
        return shoal_err_set(err, SHOAL_EINVAL, "a step of %lld rows: expected at most "
                             "n_batch=%lld", (long long)rows, (long long)ctx->n_batch);
    const double t_eval = shoal_time_s();
    ctx->segs = segs;
    ctx->n_segs = n_segs;
    int rc = eval_step(ctx, err);
    ctx->segs = NULL;
    ctx->n_segs = 0;
    if (!rc && ctx->experts.ops->note_eval)
        ctx->experts.ops->note_eval(ctx->experts.impl, &ctx->t, rows, rows == n_segs,
                                    shoal_time_s() - t_eval);
    return rc;
}

int shoal_ctx_eval(struct shoal_ctx *ctx, const int32_t *tokens, int64_t n,
                   float *logits, int all_logits, struct shoal_err *err)
{
    const struct shoal_model_config *c = &ctx->model->cfg;
    if (n <= 0)
        return shoal_err_set(err, SHOAL_EINVAL, "no tokens to evaluate");
    const struct shoal_ctx_seg whole = {.seq = 0, .tokens = tokens, .n = n};
    int rc = check_seg(ctx, &whole, err);
    if (rc)
        return rc;
    const double t_eval = shoal_time_s();
    for (int64_t done = 0; done < n; done += ctx->n_batch) {
        int64_t nb = n - done < ctx->n_batch ? n - done : ctx->n_batch;
        int last = done + nb == n;
        struct shoal_ctx_seg sg = {.seq = 0, .tokens = tokens + done, .n = nb,
                                   .all_logits = all_logits};
        if (logits && all_logits)
            sg.logits = logits + done * c->n_vocab;
        else if (logits && last)
            sg.logits = logits;
        ctx->segs = &sg;
        ctx->n_segs = 1;
        rc = eval_step(ctx, err);
        ctx->segs = NULL;
        ctx->n_segs = 0;
        if (rc)
            return rc;
    }
    if (ctx->experts.ops->note_eval)
        ctx->experts.ops->note_eval(ctx->experts.impl, &ctx->t, n, n == 1,
                                    shoal_time_s() - t_eval);
    return 0;
}

/* ---- the MTP layers (DeepSeek-V3 report §2.2; vLLM deepseek_mtp.py) ------ */

/* Run MTP layer j over n rows of sequence seq at positions pos0 .. pos0+n-1
 * (their KV rows written there), each row pairing a hidden state
 * (hid[r], n_embd floats, hid_ld apart) with a token (tok[r]):
 *   x = eh_proj([enorm(e) ; hnorm(h)]), e = embd[tok] (zero at position 0)
 * then the layer's block; ctx->x [n][n_embd] holds its output. */
static int mtp_rows(struct shoal_ctx *ctx, int64_t j, int64_t seq, int64_t pos0,
                    const float *hid, int64_t hid_ld, const int32_t *tok, int64_t n,
                    struct shoal_err *err)
{
    const struct shoal_model *m = ctx->model;
    const struct shoal_model_config *c = &m->cfg;
    const struct shoal_mtp_weights *w = &m->mtp[j];
    const int64_t E = c->n_embd;
    const float eps = (float)c->rms_norm_eps;
    for (int64_t r = 0; r < n; r++) {
        float *in = ctx->mtp_in + r * 2 * E;
        if (pos0 + r == 0) {   /* vLLM: "masking inputs at position 0" */
            memset(in, 0, (size_t)E * sizeof(float));
        } else {
            shoal_weight_row_to_f32(ctx->o, w->embd.data ? &w->embd : &m->tok_embd, tok[r]);
            shoal_rmsnorm(in, ctx->o, 1, E, &w->enorm, eps);
        }
        shoal_rmsnorm(in + E, hid + r * hid_ld, 1, E, &w->hnorm, eps);
        ctx->row_seq[r] = seq;
        ctx->row_pos[r] = pos0 + r;
    }
    shoal_linear(ctx->x, ctx->mtp_in, n, &w->eh_proj, NULL);              /* [n][E] */
    const struct shoal_ctx_seg sg = {.seq = seq, .n = n};
    ctx->segs = &sg;
    ctx->n_segs = 1;
    ctx->seg_row0[0] = 0;
    ctx->mtp_attp[seq] = pos0;
    ctx->att_past = ctx->mtp_attp;
    shoal_rope_update(&ctx->rope, pos0 + n);
    const struct shoal_experts saved = ctx->experts;   /* the model's own experts */
    ctx->experts = shoal_local_experts_iface(ctx->mtp_lx);
    int rc = layer_step(ctx, c->n_layer + j, n, err);
    ctx->experts = saved;
    ctx->segs = NULL;
    ctx->n_segs = 0;
    ctx->att_past = ctx->seq_past;
    ctx->t.mtp_rows += n;
    return rc;
}

/* MTP layer j's head on row r of ctx->x into ctx->mtp_logits; its argmax
 * (the lowest id among equal maxima). */
static int32_t mtp_head(struct shoal_ctx *ctx, int64_t j, int64_t r)
{
    const struct shoal_model *m = ctx->model;
    const struct shoal_model_config *c = &m->cfg;
    const int64_t E = c->n_embd;
    shoal_rmsnorm(ctx->h, ctx->x + r * E, 1, E, &m->mtp[j].head_norm, (float)c->rms_norm_eps);
    const struct shoal_weight *head = m->mtp[j].head.data ? &m->mtp[j].head : &m->lm_head;
    shoal_linear(ctx->mtp_logits, ctx->h, 1, head, NULL);                  /* [V] */
    int32_t best = 0;
    for (int64_t v = 1; v < c->n_vocab; v++)
        if (ctx->mtp_logits[v] > ctx->mtp_logits[best])
            best = (int32_t)v;
    return best;
}

int shoal_ctx_has_mtp(const struct shoal_ctx *ctx) { return ctx->mtp; }

int shoal_ctx_mtp_draft(struct shoal_ctx *ctx, int64_t seq, int32_t next, int k,
                        int32_t *drafts, float *logits, struct shoal_err *err)
{
    const struct shoal_model *m = ctx->model;
    const struct shoal_model_config *c = &m->cfg;
    const int64_t E = c->n_embd, B = ctx->n_batch;
    if (!ctx->mtp)
        return shoal_err_set(err, SHOAL_EINVAL, "MTP drafts: the context was made without "
                             "its MTP layers");
    if (seq < 0 || seq >= ctx->n_seq || k < 0 || next < 0 || next >= c->n_vocab ||
        ctx->seq_past[seq] < 1)
        return shoal_err_set(err, SHOAL_EINVAL, "MTP drafts: sequence %lld (of %lld, %lld "
                             "cached), %d drafts, next token %d (vocabulary %lld)",
                             (long long)seq, (long long)ctx->n_seq,
                             (long long)(seq >= 0 && seq < ctx->n_seq ? ctx->seq_past[seq] : 0),
                             k, (int)next, (long long)c->n_vocab);
    if (ctx->mtp_lost[seq] || k == 0)
        return 0;
    const double t0 = shoal_time_s();
    const struct shoal_ctx_timings keep = ctx->t;
    const int64_t past = ctx->seq_past[seq];
    const float *hid = ctx->mtp_hid + seq * ctx->n_ctx * E;
    const int32_t *tok = ctx->mtp_tok + seq * ctx->n_ctx;
    int32_t *next_tok = shoal_xcalloc((size_t)B, sizeof(int32_t));
    int rc = 0, nd = 0;
    /* catch up: positions mtp_past .. past-1, each with the token after it;
     * the last one always runs (its row gives draft 1) */
    if (ctx->mtp_past[seq] > past - 1)
        ctx->mtp_past[seq] = past - 1;
    int64_t r = 0;
    while (ctx->mtp_past[seq] < past) {
        const int64_t p0 = ctx->mtp_past[seq];
        const int64_t n = past - p0 < B ? past - p0 : B;
        for (int64_t i = 0; i < n; i++)
            next_tok[i] = p0 + i + 1 < past ? tok[p0 + i + 1] : next;
        if ((rc = mtp_rows(ctx, 0, seq, p0, hid + p0 * E, E, next_tok, n, err)))
            goto done;
        ctx->mtp_past[seq] = p0 + n;
        ctx->mtp_tail[seq] = next;
        r = n - 1;
    }
    /* the last row gives draft 1; drafts 2.. chain on the MTP's own output */
    drafts[nd++] = mtp_head(ctx, 0, r);
    if (logits)
        memcpy(logits, ctx->mtp_logits, (size_t)c->n_vocab * sizeof(float));
    for (int i = 1; i < k && past + i - 1 < ctx->n_ctx; i++) {
        const int64_t j = i % m->n_mtp;
        float *g = ctx->mtp_in + 2 * E;   /* the previous row's output, out of the way */
        memcpy(g, ctx->x + r * E, (size_t)E * sizeof(float));
        const int32_t t = drafts[nd - 1];
        if ((rc = mtp_rows(ctx, j, seq, past + i - 1, g, E, &t, 1, err)))
            goto done;
        r = 0;
        drafts[nd++] = mtp_head(ctx, j, 0);
    }
done:
    free(next_tok);
    {
        const double mtp = ctx->t.mtp + (shoal_time_s() - t0);
        const int64_t rows = ctx->t.mtp_rows;
        ctx->t = keep;          /* the trunk's stages stay the trunk's */
        ctx->t.mtp = mtp;
        ctx->t.mtp_rows = rows;
    }
    return rc < 0 ? rc : nd;
}
