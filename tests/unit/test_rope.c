#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <math.h>
#include <string.h>

#include "model_config.h"
#include "rope.h"

static struct shoal_model_config cfg(int64_t head_dim, double theta)
{
    struct shoal_model_config c;
    memset(&c, 0, sizeof c);
    c.head_dim = head_dim;
    c.rope_dim = head_dim;
    c.rope_freq_base = theta;
    c.max_pos = 64;
    c.rope_scaling.type = SHOAL_ROPE_DEFAULT;
    c.rope_scaling.factor = 1;
    c.rope_scaling.attention_factor = -1;
    c.rope_scaling.beta_fast = 32;
    c.rope_scaling.beta_slow = 1;
    c.rope_scaling.truncate = 1;
    c.rope_scaling.original_max_pos = 64;
    return c;
}

Test(rope, default_frequencies_follow_the_formula)
{
    struct shoal_model_config c = cfg(8, 10000.0);
    struct shoal_rope r;
    shoal_rope_init(&r, &c);
    for (int i = 0; i < 4; i++)
        cr_assert(fabs(r.inv_freq[i] - pow(10000.0, -2.0 * i / 8)) < 1e-7, "i=%d", i);
    cr_assert(eq(flt, r.attention_factor, 1.0f));
    shoal_rope_free(&r);
}

Test(rope, rotates_pairs_i_and_i_plus_half)
{
    struct shoal_model_config c = cfg(4, 10000.0);
    struct shoal_rope r;
    shoal_rope_init(&r, &c);
    float x[4] = {1, 0, 0, 0};
    shoal_rope_apply(&r, x, 1, 4, 3);
    /* element 0 pairs with element 2 at frequency 1: angle = 3 */
    cr_assert(fabs(x[0] - cosf(3.0f)) < 1e-6);
    cr_assert(fabs(x[2] - sinf(3.0f)) < 1e-6);
    cr_assert(eq(flt, x[1], 0.0f));
    float y[4] = {0.3f, -1.2f, 2.0f, 0.7f};
    float n0 = y[0] * y[0] + y[1] * y[1] + y[2] * y[2] + y[3] * y[3];
    shoal_rope_apply(&r, y, 1, 4, 17);
    float n1 = y[0] * y[0] + y[1] * y[1] + y[2] * y[2] + y[3] * y[3];
    cr_assert(fabs(n0 - n1) < 1e-5, "rotation must preserve the norm");
    shoal_rope_free(&r);
}

Test(rope, linear_scaling_divides_frequencies)
{
    struct shoal_model_config c = cfg(8, 10000.0);
    c.rope_scaling.type = SHOAL_ROPE_LINEAR;
    c.rope_scaling.factor = 4;
    struct shoal_rope r;
    shoal_rope_init(&r, &c);
    cr_assert(fabs(r.inv_freq[1] - pow(10000.0, -0.25) / 4) < 1e-7);
    shoal_rope_free(&r);
}

Test(rope, yarn_attention_factor_and_ramp)
{
    struct shoal_model_config c = cfg(16, 10000.0);
    c.rope_scaling.type = SHOAL_ROPE_YARN;
    c.rope_scaling.factor = 4;
    c.rope_scaling.original_max_pos = 32;
    struct shoal_rope r;
    shoal_rope_init(&r, &c);
    cr_assert(fabs(r.attention_factor - (0.1 * log(4.0) + 1.0)) < 1e-6);
    /* highest frequency is extrapolated (unchanged), lowest interpolated (/factor) */
    cr_assert(fabs(r.inv_freq[0] - 1.0f) < 1e-7);
    double lowest = pow(10000.0, -14.0 / 16);
    cr_assert(fabs(r.inv_freq[7] - lowest / 4) < 1e-7 * lowest,
              "got %g want %g", r.inv_freq[7], lowest / 4);
    shoal_rope_free(&r);
}

Test(rope, llama3_keeps_high_and_scales_low_frequencies)
{
    struct shoal_model_config c = cfg(64, 500000.0);
    c.rope_scaling.type = SHOAL_ROPE_LLAMA3;
    c.rope_scaling.factor = 8;
    c.rope_scaling.low_freq_factor = 1;
    c.rope_scaling.high_freq_factor = 4;
    c.rope_scaling.original_max_pos = 8192;
    struct shoal_rope r;
    shoal_rope_init(&r, &c);
    cr_assert(eq(flt, r.inv_freq[0], 1.0f));
    double base_last = pow(500000.0, -62.0 / 64);
    cr_assert(fabs(r.inv_freq[31] - base_last / 8) < 1e-6 * base_last);
    shoal_rope_free(&r);
}
