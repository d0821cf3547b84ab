#include "rope.h"

#include <math.h>
#include <stdlib.h>

#include "util.h"

/* Base inverse frequencies: 1 / base^(2i/dim), computed in float32 like
 * torch does for `base ** (arange(0, dim, 2).float() / dim)`. */
static void base_inv_freq(float *out, int64_t dim, double base)
{
    for (int64_t i = 0; i < dim / 2; i++) {
        float expo = (float)(2 * i) / (float)dim;
        float p = powf((float)base, expo);
        out[i] = 1.0f / p;
    }
}

static double yarn_get_mscale(double scale, double mscale)
{
    if (scale <= 1.0)
        return 1.0;
    return 0.1 * mscale * log(scale) + 1.0;
}

static double yarn_correction_dim(double num_rot, double dim, double base,
                                  double max_pos)
{
    return (dim * log(max_pos / (num_rot * 2.0 * M_PI))) / (2.0 * log(base));
}

static void compute(struct shoal_rope *r, double base)
{
    const struct shoal_model_config *c = r->cfg;
    const struct shoal_rope_scaling *s = &c->rope_scaling;
    const int64_t dim = r->rope_dim, half = dim / 2;
    r->attention_factor = 1.0f;
    base_inv_freq(r->inv_freq, dim, base);
    switch (s->type) {
    case SHOAL_ROPE_DEFAULT:
    case SHOAL_ROPE_DYNAMIC:
        break;
    case SHOAL_ROPE_LINEAR:
        for (int64_t i = 0; i < half; i++)
            r->inv_freq[i] = r->inv_freq[i] / (float)s->factor;
        break;
    case SHOAL_ROPE_YARN: {
        double factor = s->factor;
        double af = s->attention_factor;
        if (af < 0 && c->family && c->family->mla) {
            /* DeepseekV2/V3YarnRotaryEmbedding: mscale defaults to 1 and
             * mscale_all_dim to 0 (yarn_get_mscale(f, 0) == 1) */
            af = yarn_get_mscale(factor, s->mscale < 0 ? 1.0 : s->mscale) /
                 yarn_get_mscale(factor, s->mscale_all_dim < 0 ? 0.0 : s->mscale_all_dim);
        } else if (af < 0) {
            if (s->mscale > 0 && s->mscale_all_dim > 0)
                af = yarn_get_mscale(factor, s->mscale) /
                     yarn_get_mscale(factor, s->mscale_all_dim);
            else
                af = yarn_get_mscale(factor, 1.0);
        }
        double low = yarn_correction_dim(s->beta_fast, (double)dim, base,
                                         s->original_max_pos);
        double high = yarn_correction_dim(s->beta_slow, (double)dim, base,
                                          s->original_max_pos);
        if (s->truncate) {
            low = floor(low);
            high = ceil(high);
        }
        if (low < 0)
            low = 0;
        if (high > (double)(dim - 1))
            high = (double)(dim - 1);
        if (low == high)
            high += 0.001;
        for (int64_t i = 0; i < half; i++) {
            float pos_freq = powf((float)base, (float)(2 * i) / (float)dim);
            float extra = 1.0f / pos_freq;
            float inter = 1.0f / ((float)factor * pos_freq);
            float ramp = (float)(((double)i - low) / (high - low));
            ramp = ramp < 0 ? 0 : (ramp > 1 ? 1 : ramp);
            float extra_factor = 1.0f - ramp;
            r->inv_freq[i] = inter * (1.0f - extra_factor) + extra * extra_factor;
        }
        r->attention_factor = (float)af;
        break;
    }
    case SHOAL_ROPE_LLAMA3: {
        double factor = s->factor, lo = s->low_freq_factor, hi = s->high_freq_factor;
        double old = s->original_max_pos;
        double low_wl = old / lo, high_wl = old / hi;
        for (int64_t i = 0; i < half; i++) {
            double f = r->inv_freq[i];
            double wl = 2.0 * M_PI / f;
            double out;
            if (wl < high_wl)
                out = f;
            else if (wl > low_wl)
                out = f / factor;
            else {
                double smooth = (old / wl - lo) / (hi - lo);
                out = (1.0 - smooth) * f / factor + smooth * f;
            }
            r->inv_freq[i] = (float)out;
        }
        break;
    }
    }
}

void shoal_rope_init(struct shoal_rope *r, const struct shoal_model_config *cfg)
{
    r->cfg = cfg;
    r->rope_dim = cfg->rope_dim;
    r->interleave = cfg->family && cfg->family->rope_interleave;
    r->inv_freq = shoal_xcalloc((size_t)(r->rope_dim / 2 + 1), sizeof(float));
    r->seq_len_cached = (double)cfg->max_pos;
    compute(r, cfg->rope_freq_base);
}

void shoal_rope_free(struct shoal_rope *r)
{
    free(r->inv_freq);
    r->inv_freq = NULL;
}

void shoal_rope_update(struct shoal_rope *r, int64_t seq_len)
{
    const struct shoal_model_config *c = r->cfg;
    if (c->rope_scaling.type != SHOAL_ROPE_DYNAMIC)
        return;
    /* transformers: grow when seq_len > max_seq_len_cached, using
     * base * ((factor * seq_len / original_max) - (factor - 1))^(dim/(dim-2)) */
    double orig = (double)c->max_pos;
    if ((double)seq_len < orig && r->seq_len_cached > orig) {
        /* a new, shorter sequence: back to the original frequencies */
        compute(r, c->rope_freq_base);
        r->seq_len_cached = orig;
        return;
    }
    if ((double)seq_len <= r->seq_len_cached)
        return;
    double factor = c->rope_scaling.factor;
    double dim = (double)r->rope_dim;
    double base = c->rope_freq_base *
                  pow((factor * (double)seq_len / orig) - (factor - 1.0),
                      dim / (dim - 2.0));
    compute(r, base);
    r->seq_len_cached = (double)seq_len;
}

void shoal_rope_apply(const struct shoal_rope *r, float *x, int64_t n_heads,
                      int64_t head_dim, int64_t pos)
{
    const int64_t half = r->rope_dim / 2;
    /* pair i: (i, i + half), or (2i, 2i + 1) when interleaved */
    const int64_t lo_step = r->interleave ? 2 : 1, hi_off = r->interleave ? 1 : half;
    for (int64_t i = 0; i < half; i++) {
        float freq = (float)pos * r->inv_freq[i];
        float c = cosf(freq) * r->attention_factor;
        float s = sinf(freq) * r->attention_factor;
        for (int64_t h = 0; h < n_heads; h++) {
            float *v = x + h * head_dim + i * lo_step;
            float a = v[0], b = v[hi_off];
            v[0] = a * c - b * s;
            v[hi_off] = b * c + a * s;
        }
    }
}
