#include "moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "util.h"

struct shoal_router shoal_router_of(const struct shoal_model_config *c, const float *bias)
{
    return (struct shoal_router){
        .n_expert = c->n_expert, .k = c->n_expert_used, .score = c->router_score,
        .topk = c->router_topk, .n_group = c->n_group > 0 ? c->n_group : 1,
        .topk_group = c->topk_group > 0 ? c->topk_group : 1,
        .norm_topk_prob = c->norm_topk_prob, .scaling = (float)c->routed_scaling_factor,
        .bias = bias};
}

/* Index of the largest of x[0..n) not yet taken (taken[i] != 0), ties to
 * the lower index; NaN never wins over a number. -1 if all are taken. */
static int64_t argmax_free(const float *x, int64_t n, const unsigned char *taken)
{
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++)
        if (!taken[i] && (best < 0 || x[i] > x[best] || (x[best] != x[best] && x[i] == x[i])))
            best = i;
    return best;
}

/* Step 3: keep the topk_group best groups of choice [n_expert] (the other
 * experts' choice becomes -inf). gs: [n_group] scratch. */
static void mask_groups(const struct shoal_router *r, float *choice, float *gs,
                        unsigned char *taken)
{
    const int64_t G = r->n_group, per = r->n_expert / G;
    for (int64_t g = 0; g < G; g++) {
        const float *c = choice + g * per;
        float best = -INFINITY, second = -INFINITY;
        for (int64_t i = 0; i < per; i++) {
            if (c[i] > best) {
                second = best;
                best = c[i];
            } else if (c[i] > second) {
                second = c[i];
            }
        }
        gs[g] = r->topk == SHOAL_TOPK_NOAUX_TC ? best + second : best;
    }
    for (int64_t g = 0; g < G; g++)
        taken[g] = 0;
    for (int64_t j = 0; j < r->topk_group; j++) {
        const int64_t g = argmax_free(gs, G, taken);
        if (g >= 0)
            taken[g] = 1;
    }
    for (int64_t g = 0; g < G; g++)
        if (!taken[g])
            for (int64_t i = 0; i < per; i++)
                choice[g * per + i] = -INFINITY;
}

int shoal_router_select(const struct shoal_router *r, const float *logits, int64_t n_tok,
                        float *scratch, int32_t *ids, float *weights)
{
    const int64_t NE = r->n_expert, k = r->k;
    if (k <= 0 || k > NE || r->n_group <= 0 || NE % r->n_group ||
        r->topk_group > r->n_group)
        return SHOAL_EINVAL;
    float *scores = scratch, *choice = scratch + NE, *gs = scratch + 2 * NE;
    unsigned char taken_s[512];
    unsigned char *taken = NE <= (int64_t)sizeof taken_s ? taken_s : malloc((size_t)NE);
    if (!taken)
        return SHOAL_ENOMEM;
    const int grouped = r->topk != SHOAL_TOPK_GREEDY && r->n_group > 1;
    for (int64_t t = 0; t < n_tok; t++) {
        const float *lt = logits + t * NE;
        const int topk_softmax = r->score == SHOAL_ROUTER_TOPK_SOFTMAX;
        if (r->score == SHOAL_ROUTER_SIGMOID) {
            for (int64_t e = 0; e < NE; e++)
                scores[e] = 1.0f / (1.0f + shoal_expf(-lt[e]));
        } else if (topk_softmax) {   /* the bias is part of the logits */
            for (int64_t e = 0; e < NE; e++)
                scores[e] = r->bias ? lt[e] + r->bias[e] : lt[e];
        } else {
            memcpy(scores, lt, (size_t)NE * sizeof(float));
            shoal_softmax(scores, NE);
        }
        for (int64_t e = 0; e < NE; e++)
            choice[e] = r->bias && !topk_softmax ? scores[e] + r->bias[e] : scores[e];
        if (grouped)
            mask_groups(r, choice, gs, taken);
        int32_t *id = ids + t * k;
        float *w = weights + t * k;
        memset(taken, 0, (size_t)NE);
        for (int64_t q = 0; q < k; q++) {
            int64_t best = argmax_free(choice, NE, taken);
            if (best < 0)
                best = 0;   /* unreachable: k <= n_expert */
            taken[best] = 1;
            id[q] = (int32_t)best;
            w[q] = scores[best];
        }
        if (topk_softmax)   /* the k chosen logits, best first: w[0] is their max */
            shoal_softmax(w, k);
        if (r->norm_topk_prob) {
            float sum = 0.0f;
            for (int64_t q = 0; q < k; q++)
                sum += w[q];
            sum += 1e-20f;
            for (int64_t q = 0; q < k; q++)
                w[q] /= sum;
        }
        for (int64_t q = 0; q < k; q++)
            w[q] *= r->scaling;
    }
    if (taken != taken_s)
        free(taken);
    return 0;
}

void shoal_batch_union_init(struct shoal_batch_union *u, int64_t n_expert,
                            int64_t n_slots_max)
{
    u->n_used = 0;
    u->expert = shoal_xcalloc((size_t)n_expert, sizeof *u->expert);
    u->slot_begin = shoal_xcalloc((size_t)n_expert + 1, sizeof *u->slot_begin);
    u->slots = shoal_xcalloc((size_t)n_slots_max, sizeof *u->slots);
    u->count = shoal_xcalloc((size_t)n_expert, sizeof *u->count);
}

void shoal_batch_union_free(struct shoal_batch_union *u)
{
    free(u->expert);
    free(u->slot_begin);
    free(u->slots);
    free(u->count);
    memset(u, 0, sizeof *u);
}

void shoal_batch_union_build(struct shoal_batch_union *u, const int32_t *ids,
                             int64_t n_tok, int64_t k, int64_t n_expert)
{
    memset(u->count, 0, (size_t)n_expert * sizeof *u->count);
    for (int64_t s = 0; s < n_tok * k; s++)
        u->count[ids[s]]++;
    u->n_used = 0;
    int64_t off = 0;
    for (int64_t e = 0; e < n_expert; e++) {
        if (!u->count[e])
            continue;
        u->expert[u->n_used] = (int32_t)e;
        u->slot_begin[u->n_used] = off;
        off += u->count[e];
        u->n_used++;
    }
    u->slot_begin[u->n_used] = off;
    /* fill: reuse count as a cursor per used expert */
    int64_t *cursor = u->count;
    for (int64_t i = 0; i < u->n_used; i++)
        cursor[u->expert[i]] = u->slot_begin[i];
    for (int64_t s = 0; s < n_tok * k; s++)
        u->slots[cursor[ids[s]]++] = s;
}

void shoal_moe_combine(float *y, const float *out, const float *weights,
                       int64_t n_tok, int64_t k, int64_t n_embd)
{
    for (int64_t t = 0; t < n_tok; t++) {
        float *yt = y + t * n_embd;
        for (int64_t i = 0; i < n_embd; i++)
            yt[i] = 0.0f;
        for (int64_t r = 0; r < k; r++) {
            const float w = weights[t * k + r];
            const float *o = out + (t * k + r) * n_embd;
            for (int64_t i = 0; i < n_embd; i++)
                yt[i] += w * o[i];
        }
    }
}
