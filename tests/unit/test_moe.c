#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <math.h>
#include <string.h>

#include "moe.h"

/* a softmax / greedy router of n_expert experts, top-k */
static struct shoal_router softmax_router(int64_t n_expert, int64_t k, int norm)
{
    return (struct shoal_router){.n_expert = n_expert, .k = k, .n_group = 1,
                                 .topk_group = 1, .norm_topk_prob = norm, .scaling = 1.0f};
}

Test(router, selects_top_k_in_rank_order_and_renormalises)
{
    const float logits[2 * 5] = {0.1f, 2.0f, -1.0f, 1.5f, 0.0f,
                                 3.0f, 3.0f, 0.0f, -5.0f, 2.5f};
    float scratch[15], w[4];
    int32_t ids[4];
    const struct shoal_router r = softmax_router(5, 2, 1);
    cr_assert(eq(int, shoal_router_select(&r, logits, 2, scratch, ids, w), 0));
    cr_assert(eq(i32, ids[0], 1));
    cr_assert(eq(i32, ids[1], 3));
    /* tie between experts 0 and 1: the lower id ranks first */
    cr_assert(eq(i32, ids[2], 0));
    cr_assert(eq(i32, ids[3], 1));
    cr_assert(fabs(w[0] + w[1] - 1.0f) < 1e-6);
    double e1 = exp(2.0), e3 = exp(1.5);
    cr_assert(fabs(w[0] - e1 / (e1 + e3)) < 1e-6);
}

Test(router, without_renormalisation_weights_are_softmax_probabilities)
{
    const float logits[4] = {0, 1, 2, 3};
    float scratch[12], w[2];
    int32_t ids[2];
    const struct shoal_router r = softmax_router(4, 2, 0);
    shoal_router_select(&r, logits, 1, scratch, ids, w);
    double z = 1 + exp(1) + exp(2) + exp(3);
    cr_assert(eq(i32, ids[0], 3));
    cr_assert(fabs(w[0] - exp(3) / z) < 1e-6);
    cr_assert(fabs(w[1] - exp(2) / z) < 1e-6);
}

Test(router, rejects_k_out_of_range)
{
    float l[3] = {0}, p[9], w[4];
    int32_t ids[4];
    struct shoal_router r = softmax_router(3, 0, 1);
    cr_assert(eq(int, shoal_router_select(&r, l, 1, p, ids, w), SHOAL_EINVAL));
    r.k = 4;
    cr_assert(eq(int, shoal_router_select(&r, l, 1, p, ids, w), SHOAL_EINVAL));
    /* k == n_expert is allowed and selects everything */
    r.k = 3;
    cr_assert(eq(int, shoal_router_select(&r, l, 1, p, ids, w), 0));
    cr_assert(eq(i32, ids[0] + ids[1] + ids[2], 3));
}

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* DeepSeek-V3 noaux_tc: 8 experts in 4 groups of 2, keep 2 groups, top-3.
 * Logits and bias chosen so that the bias changes which group wins and the
 * weights are the unbiased sigmoids, renormalised, times the scaling. */
Test(router, noaux_tc_groups_by_two_best_biased_scores)
{
    const float logits[8] = {2.0f, -3.0f,   /* group 0: one strong expert */
                             0.5f, 0.4f,    /* group 1: two fair ones */
                             0.0f, 0.0f,    /* group 2 */
                             1.0f, -1.0f};  /* group 3 */
    const float bias[8] = {0, 0, 0, 0, 0.6f, 0.6f, 0, 0};   /* lifts group 2 */
    struct shoal_router r = {.n_expert = 8, .k = 3, .score = SHOAL_ROUTER_SIGMOID,
                             .topk = SHOAL_TOPK_NOAUX_TC, .n_group = 4, .topk_group = 2,
                             .norm_topk_prob = 1, .scaling = 2.5f, .bias = bias};
    float scratch[24], w[3];
    int32_t ids[3];
    cr_assert(eq(int, shoal_router_select(&r, logits, 1, scratch, ids, w), 0));
    /* biased group scores (sum of the two best): g0 s(2)+s(-3) = 0.928;
     * g1 s(.5)+s(.4) = 1.221; g2 2 x (0.5 + 0.6) = 2.2; g3 s(1)+s(-1) = 1.0.
     * Kept: g2, g1. Biased choices there: 1.1, 1.1, 0.622, 0.599 -> 4, 5, 2 */
    cr_assert(eq(i32, ids[0], 4));
    cr_assert(eq(i32, ids[1], 5));
    cr_assert(eq(i32, ids[2], 2));
    const double s4 = sigmoid(0), s2 = sigmoid(0.5), sum = 2 * s4 + s2;
    cr_assert(fabs(w[0] - 2.5 * s4 / sum) < 1e-6, "w0 %g", w[0]);
    cr_assert(fabs(w[2] - 2.5 * s2 / sum) < 1e-6, "w2 %g", w[2]);
    /* expert 0 has the best raw score but its group lost */
    r.topk_group = 4;
    shoal_router_select(&r, logits, 1, scratch, ids, w);
    cr_assert(eq(i32, ids[0], 4));
    cr_assert(eq(i32, ids[1], 5));
    cr_assert(eq(i32, ids[2], 0));
}

/* DeepSeek-V2 group_limited_greedy: groups ranked by their max softmax
 * score; no renormalisation, weights times routed_scaling_factor. */
Test(router, group_limited_greedy_ranks_groups_by_max)
{
    const float logits[6] = {1.0f, 0.9f, 0.95f,   /* group 0: max 1.0 */
                             1.2f, -4.0f, -4.0f}; /* group 1: max 1.2 */
    struct shoal_router r = {.n_expert = 6, .k = 2, .score = SHOAL_ROUTER_SOFTMAX,
                             .topk = SHOAL_TOPK_GROUP_MAX, .n_group = 2, .topk_group = 1,
                             .norm_topk_prob = 0, .scaling = 16.0f};
    float scratch[18], w[2];
    int32_t ids[2];
    cr_assert(eq(int, shoal_router_select(&r, logits, 1, scratch, ids, w), 0));
    cr_assert(eq(i32, ids[0], 3));
    cr_assert(eq(i32, ids[1], 4));   /* the group's second, although 0 scores higher */
    double z = exp(1.0) + exp(0.9) + exp(0.95) + exp(1.2) + 2 * exp(-4.0);
    cr_assert(fabs(w[0] - 16.0 * exp(1.2) / z) < 1e-5);
    cr_assert(fabs(w[1] - 16.0 * exp(-4.0) / z) < 1e-6);
}

Test(batch_union, lists_each_expert_once_with_its_slots)
{
    /* 3 tokens, k = 2 */
    const int32_t ids[6] = {3, 1, 1, 2, 3, 1};
    struct shoal_batch_union u;
    shoal_batch_union_init(&u, 4, 6);
    shoal_batch_union_build(&u, ids, 3, 2, 4);
    cr_assert(eq(i64, u.n_used, 3));
    cr_assert(eq(i32, u.expert[0], 1));
    cr_assert(eq(i32, u.expert[1], 2));
    cr_assert(eq(i32, u.expert[2], 3));
    /* expert 1 serves slots 1, 2, 5 */
    cr_assert(eq(i64, u.slot_begin[1] - u.slot_begin[0], 3));
    cr_assert(eq(i64, u.slots[0], 1));
    cr_assert(eq(i64, u.slots[1], 2));
    cr_assert(eq(i64, u.slots[2], 5));
    cr_assert(eq(i64, u.slots[3], 3));
    cr_assert(eq(i64, u.slots[4], 0));
    cr_assert(eq(i64, u.slots[5], 4));
    shoal_batch_union_free(&u);
}

Test(combine, sums_in_route_rank_order_bit_for_bit)
{
    /* 1 token, k = 3, n_embd = 2; order matters for these magnitudes */
    const float out[3 * 2] = {1e8f, 1.0f, -1e8f, 2.0f, 1.0f, 3.0f};
    const float w[3] = {1.0f, 1.0f, 1.0f};
    float y[2];
    shoal_moe_combine(y, out, w, 1, 3, 2);
    float want0 = 0.0f;
    want0 += 1e8f;
    want0 += -1e8f;
    want0 += 1.0f;
    cr_assert(eq(flt, y[0], want0));
    cr_assert(eq(flt, y[1], 6.0f));
}
