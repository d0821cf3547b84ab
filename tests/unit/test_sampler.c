#include <criterion/criterion.h>
#include <criterion/new/assert.h>

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
