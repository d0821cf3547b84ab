/* cluster_experts: the cluster as an executor of routed experts
 * (experts.h): each MoE layer step goes to shoal_cluster_run_layer, whose
 * local share runs on the cluster's local executor over the coordinator's
 * expert store, and the router lookahead is hinted to the executors that
 * would get the next layer's experts. */
#include "cluster.h"

#include <stdlib.h>

#include "cluster_impl.h"
#include "expert_store.h"
#include "util.h"

/* the local share of a step starts its reads: the lookahead's local share
 * queues behind them */
static void local_started(void *user)
{
    struct shoal_cluster *cl = user;
    if (cl->pf_pending) {
        shoal_expert_store_hint(cl->model->store, cl->cur_step->il + 1, cl->pf_local,
                                cl->n_pf_local);
        cl->pf_pending = 0;
    }
}

static int local_share(void *user, int64_t il, const struct shoal_batch_union *bu,
                       const int64_t *sel, int64_t n_sel, struct shoal_err *err)
{
    (void)il;
    struct shoal_cluster *cl = user;
    struct shoal_moe_step st = *cl->cur_step;
    st.bu = bu;   /* the step's pieces: the same slots of yg */
    return shoal_local_experts_run(cl->lx, &st, sel, n_sel, local_started, cl, err);
}

/* Every remote request of the step is out: hint the next layer's experts
 * to the executors placement would give them; the local share is hinted
 * between the local acquire's start and wait when there is one (n_local >
 * 0), else now. */
static void after_send(void *user, int64_t n_local)
{
    struct shoal_cluster *cl = user;
    const struct shoal_moe_step *st = cl->cur_step;
    struct shoal_expert_store *store = cl->model->store;
    cl->pf_pending = 0;
    if (!cl->cur_prefetch || !st->lookahead)
        return;
    const int32_t *ids;
    const int64_t n = st->lookahead(st->user, &ids);
    if (n <= 0)
        return;
    if (n > cl->cap_pf) {
        free(cl->pf_local);
        cl->pf_local = shoal_xcalloc((size_t)n, sizeof *cl->pf_local);
        cl->cap_pf = n;
    }
    cl->n_pf_local = shoal_cluster_hint(cl, st->il + 1, ids, n, cl->pf_local);
    if (cl->n_pf_local == 0 || !shoal_cluster_local_experts(cl) ||
        !shoal_expert_store_wants_hints(store))
        return;
    if (n_local > 0)
        cl->pf_pending = 1;
    else
        shoal_expert_store_hint(store, st->il + 1, cl->pf_local, cl->n_pf_local);
}

static int run(void *impl, const struct shoal_moe_step *st, struct shoal_err *err)
{
    struct shoal_cluster *cl = impl;
    struct shoal_expert_store *store = cl->model->store;
    cl->cur_step = st;
    cl->cur_prefetch = store && shoal_expert_store_wants_hints(store);
    const struct shoal_cluster_layer L = {.il = st->il, .n_tok = st->n_tok, .k = st->k,
                                          .h = st->h, .bu = st->bu, .yg = st->yg,
                                          .local = local_share, .after_send = after_send,
                                          .user = cl};
    int rc = shoal_cluster_run_layer(cl, &L, err);
    cl->pf_pending = 0;
    cl->cur_step = NULL;
    return rc;
}

static double take_network_s(void *impl)
{
    return shoal_cluster_take_network_s(impl);
}

static void note_eval(void *impl, const struct shoal_ctx_timings *t, int64_t n_tokens,
                      int decode, double seconds)
{
    shoal_cluster_note_eval(impl, t, n_tokens, decode, seconds);
}

static const struct shoal_experts_ops cluster_ops = {
    .run = run, .take_network_s = take_network_s, .note_eval = note_eval};

struct shoal_experts shoal_cluster_experts(struct shoal_cluster *cl)
{
    /* a layer's request to one worker carries up to the step's rows of f32
     * hidden state, and oversized requests are not split: keep a step
     * within half a wire frame */
    const int64_t row = cl->n_embd * (int64_t)sizeof(float);
    return (struct shoal_experts){
        .ops = &cluster_ops, .impl = cl,
        .max_rows = (int64_t)(SHOAL_WIRE_MAX_FRAME_DEFAULT / 2) / (row > 0 ? row : 1)};
}
