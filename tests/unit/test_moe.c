#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <math.h>
#include <string.h>

#include "moe.h"

Test(router, selects_top_k_in_rank_order_and_renormalises)
{
    const float logits[2 * 5] = {0.1f, 2.0f, -1.0f, 1.5f, 0.0f,
                                 3.0f, 3.0f, 0.0f, -5.0f, 2.5f};
    float probs[5], w[4];
    int32_t ids[4];
    cr_assert(eq(int, shoal_router_select(logits, 2, 5, 2, 1, probs, ids, w), 0));
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
    float probs[4], w[2];
    int32_t ids[2];
    shoal_router_select(logits, 1, 4, 2, 0, probs, ids, w);
    double z = 1 + exp(1) + exp(2) + exp(3);
    cr_assert(eq(i32, ids[0], 3));
    cr_assert(fabs(w[0] - exp(3) / z) < 1e-6);
    cr_assert(fabs(w[1] - exp(2) / z) < 1e-6);
}

Test(router, rejects_k_out_of_range)
{
    float l[3] = {0}, p[3], w[4];
    int32_t ids[4];
    cr_assert(eq(int, shoal_router_select(l, 1, 3, 0, 1, p, ids, w), SHOAL_EINVAL));
    cr_assert(eq(int, shoal_router_select(l, 1, 3, 4, 1, p, ids, w), SHOAL_EINVAL));
    /* k == n_expert is allowed and selects everything */
    cr_assert(eq(int, shoal_router_select(l, 1, 3, 3, 1, p, ids, w), 0));
    cr_assert(eq(i32, ids[0] + ids[1] + ids[2], 3));
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
