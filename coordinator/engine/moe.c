#include "moe.h"

#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "util.h"

int shoal_router_select(const float *logits, int64_t n_tok, int64_t n_expert,
                        int64_t k, int norm_topk_prob, float *probs,
                        int32_t *ids, float *weights)
{
    if (k <= 0 || k > n_expert)
        return SHOAL_EINVAL;
    for (int64_t t = 0; t < n_tok; t++) {
        memcpy(probs, logits + t * n_expert, (size_t)n_expert * sizeof(float));
        shoal_softmax(probs, n_expert);
        int32_t *id = ids + t * k;
        float *w = weights + t * k;
        /* selection by repeated max: k is small; strict > keeps the lower id
         * on ties, as torch.topk does on CPU for equal values */
        for (int64_t r = 0; r < k; r++) {
            int64_t best = -1;
            for (int64_t e = 0; e < n_expert; e++) {
                int taken = 0;
                for (int64_t q = 0; q < r; q++)
                    if (id[q] == e)
                        taken = 1;
                if (taken)
                    continue;
                if (best < 0 || probs[e] > probs[best])
                    best = e;
            }
            id[r] = (int32_t)best;
            w[r] = probs[best];
        }
        if (norm_topk_prob) {
            float sum = 0.0f;
            for (int64_t r = 0; r < k; r++)
                sum += w[r];
            for (int64_t r = 0; r < k; r++)
                w[r] /= sum;
        }
    }
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
