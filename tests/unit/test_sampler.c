#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <math.h>
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

/* OpenAI's presence and frequency penalties count the tokens the sampler
 * returned, not the history: logit -= presence*(n>0) + frequency*n */
Test(sampler, presence_penalty_lowers_each_returned_token_once)
{
    struct shoal_sampler_params p = shoal_sampler_params_default();
    p.greedy = 1;
    p.presence_penalty = 0.5f;
    struct shoal_sampler *s = shoal_sampler_create(p, 3);
    /* the prompt (history) holds token 0 three times: not counted */
    int32_t hist[3] = {0, 0, 0};
    float a[3] = {2.0f, 1.9f, 0.0f};
    cr_assert(eq(i32, shoal_sampler_sample(s, a, hist, 3), 0));
    cr_assert(eq(flt, a[0], 2.0f));
    float b[3] = {2.0f, 1.9f, 0.0f};
    cr_assert(eq(i32, shoal_sampler_sample(s, b, hist, 3), 1));
    cr_assert(eq(flt, b[0], 1.5f));
    cr_assert(eq(flt, b[1], 1.9f));
    /* both returned once: both lowered by 0.5, no more (presence, not count) */
    float c[3] = {2.0f, 1.9f, 0.0f};
    cr_assert(eq(i32, shoal_sampler_sample(s, c, hist, 3), 0));
    cr_assert(eq(flt, c[0], 1.5f));
    cr_assert(epsilon_eq(flt, c[1], 1.4f, 1e-6f));
    cr_assert(eq(flt, c[2], 0.0f));
    float d[3] = {2.0f, 1.9f, 0.0f};
    shoal_sampler_sample(s, d, NULL, 0);
    cr_assert(eq(flt, d[0], 1.5f), "token 0 returned twice is still lowered by 0.5 once");
    shoal_sampler_free(s);
}

Test(sampler, frequency_penalty_grows_with_the_count)
{
    struct shoal_sampler_params p = shoal_sampler_params_default();
    p.greedy = 1;
    p.frequency_penalty = 0.3f;
    p.presence_penalty = 0.1f;
    struct shoal_sampler *s = shoal_sampler_create(p, 2);
    /* token 0 wins while 2.0 - (0.1 + 0.3 n) > 1.5: n = 0 (2.0), n = 1 (1.6) */
    const float want[4] = {2.0f, 1.6f, 1.3f, 1.3f};
    const int32_t pick[4] = {0, 0, 1, 0};
    for (int i = 0; i < 4; i++) {
        float l[2] = {2.0f, 1.5f};
        cr_assert(eq(i32, shoal_sampler_sample(s, l, NULL, 0), pick[i]), "step %d", i);
        cr_assert(epsilon_eq(flt, l[0], want[i], 1e-6f), "step %d: logit %g, expected %g", i,
                  (double)l[0], (double)want[i]);
    }
    /* step 3: token 1 returned once: 1.5 - 0.4 = 1.1 < 1.3 */
    float l[2] = {2.0f, 1.5f};
    shoal_sampler_sample(s, l, NULL, 0);
    cr_assert(epsilon_eq(flt, l[0], 2.0f - 0.1f - 0.3f * 3, 1e-6f));
    cr_assert(epsilon_eq(flt, l[1], 1.1f, 1e-6f));
    shoal_sampler_free(s);
}

Test(sampler, negative_presence_penalty_favours_repeats)
{
    struct shoal_sampler_params p = shoal_sampler_params_default();
    p.greedy = 1;
    p.presence_penalty = -1.0f;
    struct shoal_sampler *s = shoal_sampler_create(p, 2);
    float a[2] = {1.0f, 1.5f};
    cr_assert(eq(i32, shoal_sampler_sample(s, a, NULL, 0), 1));
    float b[2] = {2.0f, 1.5f};
    cr_assert(eq(i32, shoal_sampler_sample(s, b, NULL, 0), 1));
    cr_assert(eq(flt, b[1], 2.5f));
    shoal_sampler_free(s);
}

/* The largest gap between the counts of two equally likely tokens over 200
 * draws (no cuts, temperature 1, seed 9) with frequency penalty f. */
static int max_gap(float f)
{
    struct shoal_sampler_params p = shoal_sampler_params_default();
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 9;
    p.frequency_penalty = f;
    struct shoal_sampler *s = shoal_sampler_create(p, 2);
    int n[2] = {0, 0}, gap = 0;
    for (int i = 0; i < 200; i++) {
        float l[2] = {0.0f, 0.0f};
        n[shoal_sampler_sample(s, l, NULL, 0)]++;
        gap = abs(n[0] - n[1]) > gap ? abs(n[0] - n[1]) : gap;
    }
    shoal_sampler_free(s);
    return gap;
}

/* the sampled path honours them too: with a large frequency penalty
 * (beyond the API's 2: e^-20 odds of a repeat) two equally likely tokens are
 * drawn in turn, their counts never apart by two; without it, the same seed
 * lets them drift apart */
Test(sampler, frequency_penalty_applies_before_the_draw)
{
    cr_assert(eq(int, max_gap(20.0f), 1));
    cr_assert(max_gap(0.0f) > 1, "the control draw never drifted: the test would prove nothing");
}

/* shoal_logits_nonfinite: the first NaN or +-inf at any position of a
 * vector whose length is not a multiple of the vector width, -1 when all
 * are finite (the largest finite floats included). */
Test(sampler, logits_nonfinite_finds_the_first_bad_value)
{
    enum { N = 1003 };
    float *l = malloc(N * sizeof *l);
    for (int i = 0; i < N; i++)
        l[i] = (i % 2 ? 1 : -1) * (i % 7 == 0 ? 3.4028235e38f : (float)i * 0.37f);
    cr_assert(eq(i64, shoal_logits_nonfinite(l, N), -1));
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    const int at[4] = {0, 17, 500, N - 1};
    for (int b = 0; b < 3; b++)
        for (int k = 0; k < 4; k++) {
            const float keep = l[at[k]];
            l[at[k]] = bad[b];
            cr_assert(eq(i64, shoal_logits_nonfinite(l, N), at[k]), "value %d at %d", b, at[k]);
            if (at[k] < N - 1) {   /* a later bad value too: the first is reported */
                const float last = l[N - 1];
                l[N - 1] = NAN;
                cr_assert(eq(i64, shoal_logits_nonfinite(l, N), at[k]));
                l[N - 1] = last;
            }
            l[at[k]] = keep;
        }
    cr_assert(eq(i64, shoal_logits_nonfinite(l, N), -1));
    free(l);
}
