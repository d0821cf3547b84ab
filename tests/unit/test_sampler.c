#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <stdlib.h>
#include <string.h>

#include "sampler.h"

Test(sampler, greedy_takes_the_first_maximum)
{
    struct shoal_sampler_params p = shoal_sampler_params_default();
    p.greedy = 1;
    struct shoal_sampler *s = shoal_sampler_create(p, 5);
    float l[5] = {0.5f, 3.0f, -1.0f, 3.0f, 2.0f};
    cr_assert(eq(i32, shoal_sampler_sample(s, l, NULL, 0), 1));
    shoal_sampler_free(s);
}

Test(sampler, repetition_penalty_follows_hf_sign_rule)
{
    struct shoal_sampler_params p = shoal_sampler_params_default();
    p.greedy = 1;
    p.repeat_penalty = 2.0f;
    struct shoal_sampler *s = shoal_sampler_create(p, 3);
    float l[3] = {4.0f, 3.0f, -1.0f};
    int32_t hist[2] = {0, 2};
    cr_assert(eq(i32, shoal_sampler_sample(s, l, hist, 2), 1));
    cr_assert(eq(flt, l[0], 2.0f));
    cr_assert(eq(flt, l[2], -2.0f));
    shoal_sampler_free(s);
}

Test(sampler, same_seed_same_tokens_and_top_k_1_is_greedy)
{
    struct shoal_sampler_params p = shoal_sampler_params_default();
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 42;
    struct shoal_sampler *a = shoal_sampler_create(p, 4), *b = shoal_sampler_create(p, 4);
    int counts[4] = {0};
    for (int i = 0; i < 400; i++) {
        float l1[4] = {0, 0.5f, 1, 1.5f}, l2[4] = {0, 0.5f, 1, 1.5f};
        int32_t x = shoal_sampler_sample(a, l1, NULL, 0);
        int32_t y = shoal_sampler_sample(b, l2, NULL, 0);
        cr_assert(eq(i32, x, y));
        counts[x]++;
    }
    /* a real draw: every token shows up, the likeliest most */
    for (int i = 0; i < 4; i++)
        cr_assert(counts[i] > 0, "token %d never drawn", i);
    cr_assert(counts[3] > counts[0]);
    shoal_sampler_free(a);
    shoal_sampler_free(b);
    p.top_k = 1;
    struct shoal_sampler *c = shoal_sampler_create(p, 4);
    for (int i = 0; i < 20; i++) {
        float l[4] = {0, 0.5f, 1, 1.5f};
        cr_assert(eq(i32, shoal_sampler_sample(c, l, NULL, 0), 3));
    }
    shoal_sampler_free(c);
}

Test(sampler, min_p_and_top_p_cut_the_tail)
{
    struct shoal_sampler_params p = shoal_sampler_params_default();
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.5f; /* keeps only tokens with prob >= 0.5 * max */
    struct shoal_sampler *s = shoal_sampler_create(p, 3);
    for (int i = 0; i < 50; i++) {
        float l[3] = {5.0f, 4.9f, 0.0f};
        cr_assert(shoal_sampler_sample(s, l, NULL, 0) != 2);
    }
    shoal_sampler_free(s);
}

/* reference order for the test: higher logit first, then lower id */
static const float *g_logits;
static int by_logit_then_id(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (g_logits[x] != g_logits[y])
        return g_logits[x] > g_logits[y] ? -1 : 1;
    return (x > y) - (x < y);
}

static int asc_i32(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* bit-exact behaviour: top-k over the whole vocabulary (the sampler's
 * partial selection) draws exactly what a sampler given only those k
 * logits (kept in id order, so ties break the same way) draws with the
 * same seed; the logits have many ties, also across the k-th place */
Test(sampler, top_k_selection_matches_sampling_the_k_best_alone)
{
    enum { V = 2000, K = 50, DRAWS = 300 };
    static float full[V];
    uint32_t st = 7;
    for (int i = 0; i < V; i++) {
        st = st * 1664525u + 1013904223u;
        full[i] = (float)((int)(st >> 24) % 40) * 0.25f;   /* 40 levels: ties */
    }
    int32_t order[V];
    for (int i = 0; i < V; i++)
        order[i] = i;
    g_logits = full;
    qsort(order, V, sizeof order[0], by_logit_then_id);
    cr_assert(full[order[K - 1]] == full[order[K]], "the test needs a tie across the k-th place");
    int32_t keep[K];
    memcpy(keep, order, sizeof keep);
    qsort(keep, K, sizeof keep[0], asc_i32);
    struct shoal_sampler_params p = shoal_sampler_params_default();
    p.temperature = 0.8f;
    p.top_p = 0.9f;
    p.min_p = 0.0f;
    p.seed = 1234;
    p.top_k = K;
    struct shoal_sampler *a = shoal_sampler_create(p, V);
    p.top_k = 0;
    struct shoal_sampler *b = shoal_sampler_create(p, K);
    int distinct = 0, seen[K] = {0};
    for (int d = 0; d < DRAWS; d++) {
        float la[V], lb[K];
        memcpy(la, full, sizeof la);
        for (int i = 0; i < K; i++)
            lb[i] = full[keep[i]];
        const int32_t x = shoal_sampler_sample(a, la, NULL, 0);
        const int32_t y = shoal_sampler_sample(b, lb, NULL, 0);
        cr_assert(y >= 0 && y < K);
        cr_assert(eq(i32, x, keep[y]), "draw %d: top-k over V gave %d, the k best alone %d",
                  d, x, keep[y]);
        distinct += !seen[y];
        seen[y] = 1;
    }
    cr_assert(distinct >= 5, "a real draw: %d distinct tokens", distinct);
    shoal_sampler_free(a);
    shoal_sampler_free(b);
}
