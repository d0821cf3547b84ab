/* synth_routing: the routing `shoal synth` builds in (synth.h): a real
 * trace's per-expert shares stretched to the model's experts, the router
 * biases calibrated by Monte Carlo through the engine's own router so that
 * the top-k inclusion frequencies match them, and the per-layer plan (trace
 * layer by depth, a seeded permutation, the residual's expected statistics
 * that turn biases into router weights). */
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "synth.h"
#include "util.h"

/* E[silu(g)^2] for g ~ N(0, 1) (numerical integral, 0.3551). */
#define SILU2 0.3551

/* Shares of a trace layer, sorted descending, stretched (linear interpolation
 * of the rank-frequency curve) to n experts, normalised to sum 1. */
static void stretch_shares(const double *src, int64_t m, double *dst, int64_t n)
{
    double *s = shoal_xmalloc((size_t)m * sizeof *s);
    memcpy(s, src, (size_t)m * sizeof *s);
    for (int64_t i = 1; i < m; i++) /* insertion sort, descending */
        for (int64_t j = i; j > 0 && s[j] > s[j - 1]; j--) {
            double t = s[j];
            s[j] = s[j - 1];
            s[j - 1] = t;
        }
    double sum = 0;
    for (int64_t j = 0; j < n; j++) {
        double x = ((double)j + 0.5) * (double)m / (double)n - 0.5;
        if (x < 0)
            x = 0;
        if (x > (double)(m - 1))
            x = (double)(m - 1);
        int64_t i0 = (int64_t)x;
        int64_t i1 = i0 + 1 < m ? i0 + 1 : i0;
        double f = x - (double)i0;
        dst[j] = s[i0] * (1 - f) + s[i1] * f;
        if (dst[j] < 1e-12)
            dst[j] = 1e-12;
        sum += dst[j];
    }
    for (int64_t j = 0; j < n; j++)
        dst[j] /= sum;
    free(s);
}

void synth_trace_free(struct trace *t)
{
    for (int i = 0; i < t->n_src; i++)
        free(t->shares[i]);
}

/* Load the target shares for n experts. */
static int trace_load(struct trace *t, const char *name, const char *file, const char *domain,
                      double zipf_s, int64_t n, struct shoal_err *err)
{
    memset(t, 0, sizeof *t);
    t->name = name;
    if (!strcmp(name, "uniform") || !strcmp(name, "zipf")) {
        t->n_src = 1;
        t->shares[0] = shoal_xmalloc((size_t)n * sizeof(double));
        double sum = 0;
        for (int64_t j = 0; j < n; j++) {
            t->shares[0][j] = !strcmp(name, "uniform") ? 1.0 : pow((double)(j + 1), -zipf_s);
            sum += t->shares[0][j];
        }
        for (int64_t j = 0; j < n; j++)
            t->shares[0][j] /= sum;
        return 0;
    }
    const char *model = !strcmp(name, "olmoe") ? "OLMoE-1B-7B-0924" :
                        !strcmp(name, "mixtral") ? "Mixtral-8x7B-v0.1" : NULL;
    if (!model)
        return shoal_err_set(err, SHOAL_EINVAL, "--trace expects olmoe, mixtral, uniform or "
                             "zipf, got '%s'", name);
    json_error_t jerr;
    json_t *root = json_load_file(file, 0, &jerr);
    if (!root)
        return shoal_err_set(err, SHOAL_ENOTFOUND, "cannot read the routing trace '%s': %s "
                             "(pass --trace-file FILE, or --trace zipf|uniform when "
                             "../shared/data is absent)", file, jerr.text);
    int rc = 0;
    json_t *jm = json_object_get(json_object_get(root, "models"), model);
    json_t *doms = json_object_get(jm, "domains");
    json_t *layers = json_object_get(root, "layers");
    int64_t ne_src = json_integer_value(json_object_get(jm, "num_experts"));
    if (!json_is_object(doms) || !json_is_array(layers) || json_array_size(layers) < 1 ||
        json_array_size(layers) > 3 || ne_src < 2) {
        rc = shoal_err_set(err, SHOAL_EFORMAT, "'%s': no model '%s' with domains, layers "
                           "and num_experts", file, model);
        goto done;
    }
    /* the traced models' depth: OLMoE 16 layers, Mixtral 32 */
    double depth_den = !strcmp(name, "olmoe") ? 15.0 : 31.0;
    t->n_src = (int)json_array_size(layers);
    t->src_n_layer = (int)depth_den + 1;
    double *acc = shoal_xcalloc((size_t)ne_src, sizeof *acc);
    for (int li = 0; li < t->n_src && !rc; li++) {
        int64_t L = json_integer_value(json_array_get(layers, (size_t)li));
        char key[32];
        snprintf(key, sizeof key, "%lld", (long long)L);
        t->src_layer[li] = (int)L;
        t->src_depth[li] = (double)L / depth_den;
        memset(acc, 0, (size_t)ne_src * sizeof *acc);
        int used = 0;
        const char *dk;
        json_t *dv;
        json_object_foreach(doms, dk, dv) {
            if (strcmp(domain, "all") && strcmp(domain, dk))
                continue;
            json_t *arr = json_object_get(dv, key);
            if (!json_is_array(arr) || (int64_t)json_array_size(arr) != ne_src) {
                rc = shoal_err_set(err, SHOAL_EFORMAT, "'%s': %s domain %s layer %s needs "
                                   "%lld counts", file, model, dk, key, (long long)ne_src);
                break;
            }
            for (int64_t e = 0; e < ne_src; e++)
                acc[e] += json_number_value(json_array_get(arr, (size_t)e));
            used++;
        }
        if (!rc && !used)
            rc = shoal_err_set(err, SHOAL_EINVAL, "--domain '%s' is not in '%s' for %s "
                               "(use all, or one of its domains)", domain, file, model);
        if (!rc) {
            t->shares[li] = shoal_xmalloc((size_t)n * sizeof(double));
            stretch_shares(acc, ne_src, t->shares[li], n);
        }
    }
    free(acc);
done:
    json_decref(root);
    if (rc)
        synth_trace_free(t);
    return rc;
}

/* Inclusion probabilities pi = k * share, capped at 0.95 (water-filling). */
static void inclusion_targets(const double *share, int64_t n, int64_t k, double *pi)
{
    for (int64_t e = 0; e < n; e++)
        pi[e] = (double)k * share[e];
    for (int it = 0; it < 64; it++) {
        double excess = 0, free_mass = 0;
        for (int64_t e = 0; e < n; e++) {
            if (pi[e] > 0.95) {
                excess += pi[e] - 0.95;
                pi[e] = 0.95;
            } else if (pi[e] < 0.95) {
                free_mass += pi[e];
            }
        }
        if (excess <= 1e-12 || free_mass <= 0)
            break;
        for (int64_t e = 0; e < n; e++)
            if (pi[e] < 0.95)
                pi[e] += excess * pi[e] / free_mass;
    }
}

/* d log P(b + z > x) / db for z ~ N(0, 1) at the x where P = p: the hazard
 * of the normal tail. Inclusion of a rare expert reacts to its bias about
 * this much faster than log-linearly; dividing the update by it keeps the
 * calibration from oscillating. */
static double tail_hazard(double p)
{
    double lo = -12, hi = 12;
    for (int i = 0; i < 80; i++) {
        double m = 0.5 * (lo + hi);
        if (0.5 * erfc(m / sqrt(2.0)) > p)
            lo = m;
        else
            hi = m;
    }
    double x = 0.5 * (lo + hi);
    return exp(-0.5 * x * x) / sqrt(2.0 * M_PI) / p;
}

#define MC_CHUNK 64   /* Monte Carlo tokens per router call */

/* Route T Monte Carlo tokens with logits b + z[t] through the engine's own
 * router (shoal_router_select: softmax or sigmoid scores, group limits,
 * renormalisation, routed scaling, exactly as decode routes), counting each
 * expert's top-k inclusions into cnt[n]; returns the mean over tokens of
 * the sum of squared combine weights. */
static double mc_count(const struct shoal_router *rt, const float *z, int64_t T,
                       const double *b, double *cnt)
{
    const int64_t n = rt->n_expert, k = rt->k;
    double w2 = 0;
    memset(cnt, 0, (size_t)n * sizeof *cnt);
#pragma omp parallel reduction(+ : w2)
    {
        float *lg = shoal_xmalloc((size_t)(MC_CHUNK * n) * sizeof *lg);
        float *scratch = shoal_xmalloc((size_t)(3 * n) * sizeof *scratch);
        int32_t *ids = shoal_xmalloc((size_t)(MC_CHUNK * k) * sizeof *ids);
        float *w = shoal_xmalloc((size_t)(MC_CHUNK * k) * sizeof *w);
        double *c = shoal_xcalloc((size_t)n, sizeof *c);
#pragma omp for schedule(static)
        for (int64_t t0 = 0; t0 < T; t0 += MC_CHUNK) {
            const int64_t nt = t0 + MC_CHUNK <= T ? MC_CHUNK : T - t0;
            for (int64_t t = 0; t < nt; t++)
                for (int64_t e = 0; e < n; e++)
                    lg[t * n + e] = (float)(b[e] + z[(t0 + t) * n + e]);
            /* cannot fail: k <= n and the groups divide n (config checked) */
            shoal_router_select(rt, lg, nt, scratch, ids, w);
            for (int64_t j = 0; j < nt * k; j++) {
                c[ids[j]] += 1;
                w2 += (double)w[j] * (double)w[j];
            }
        }
#pragma omp critical
        for (int64_t e = 0; e < n; e++)
            cnt[e] += c[e];
        free(lg);
        free(scratch);
        free(ids);
        free(w);
        free(c);
    }
    return w2 / (double)T;
}

/* Calibrate logit biases b[n] (noise N(0,1)) so that the router's top-k
 * inclusion frequencies match pi[n]. Also returns E[sum of squared combine
 * weights] and the worst relative error of the inclusion frequencies, both
 * measured at the final biases. */
static void calibrate(const struct shoal_router *rt, const double *pi, uint64_t seed, double *b,
                      double *mean_w2, double *max_rel_err)
{
    const int64_t T = MC_TOKENS, n = rt->n_expert, k = rt->k;
    float *z = shoal_xmalloc((size_t)(T * n) * sizeof *z);
    struct rng r = rng_for(seed, 0xca11b, (uint64_t)n, (uint64_t)k);
    for (int64_t i = 0; i < T * n; i++)
        z[i] = (float)rng_normal(&r);
    double *cnt = shoal_xmalloc((size_t)n * sizeof *cnt);
    double *h = shoal_xmalloc((size_t)n * sizeof *h);
    double mean = 0;
    for (int64_t e = 0; e < n; e++) {
        h[e] = tail_hazard(pi[e]);
        if (h[e] < 0.5)
            h[e] = 0.5;
        mean += log(pi[e]);
    }
    for (int64_t e = 0; e < n; e++)
        b[e] = log(pi[e]) - mean / (double)n;
    double err_max = 0, w2 = 0;
    for (int it = 0; it < 60; it++) {
        w2 = mc_count(rt, z, T, b, cnt);
        err_max = 0;
        for (int64_t e = 0; e < n; e++) {
            double rel = fabs(cnt[e] / (double)T - pi[e]) / pi[e];
            if (rel > err_max)
                err_max = rel;
        }
        if (err_max < 0.02 || it == 59)
            break;
        double bm = 0;
        for (int64_t e = 0; e < n; e++) {
            double got = cnt[e] / (double)T;
            double lg = log(got > 0.25 / (double)T ? got : 0.25 / (double)T);
            b[e] += 0.9 * (log(pi[e]) - lg) / h[e];
            bm += b[e];
        }
        for (int64_t e = 0; e < n; e++)
            b[e] -= bm / (double)n;
    }
    *mean_w2 = w2;
    *max_rel_err = err_max;
    free(z);
    free(cnt);
    free(h);
}

/* Per-layer routing plan: trace layer by relative depth, a seeded
 * permutation of experts, calibrated biases, and the expected residual
 * statistics that turn biases into router weights. */
int synth_plan_routing(struct synth *sy, const char *trace_name, const char *trace_file,
                       const char *domain, double zipf_s)
{
    const struct shoal_model_config *c = &sy->cfg;
    const int64_t L = c->n_layer, NE = c->n_expert, K = c->n_expert_used;
    const double E = (double)c->n_embd;
    int rc = trace_load(&sy->trace, trace_name, trace_file, domain, zipf_s, NE, sy->err);
    if (rc)
        return rc;
    struct trace *t = &sy->trace;
    double *bias_src[3] = {0};
    double *pi = shoal_xmalloc((size_t)NE * sizeof *pi);
    /* the router_bias written is zero: the engine's router without one */
    const struct shoal_router rt = shoal_router_of(c, NULL);
    for (int i = 0; i < t->n_src; i++) {
        bias_src[i] = shoal_xmalloc((size_t)NE * sizeof(double));
        inclusion_targets(t->shares[i], NE, K, pi);
        calibrate(&rt, pi, sy->seed, bias_src[i], &sy->mean_w2[i], &sy->calib_err[i]);
    }
    const int grouped = rt.topk != SHOAL_TOPK_GREEDY && rt.n_group > 1;
    sy->layer_src = shoal_xcalloc((size_t)L, sizeof *sy->layer_src);
    sy->layer_target = shoal_xcalloc((size_t)(L * NE), sizeof(double));
    sy->layer_bias = shoal_xcalloc((size_t)(L * NE), sizeof(double));
    sy->u0 = shoal_xcalloc((size_t)L, sizeof(double));
    sy->sigma = shoal_xcalloc((size_t)L, sizeof(double));
    int32_t *perm = shoal_xmalloc((size_t)NE * sizeof *perm);
    /* expert outputs: rms rho per channel, so that a MoE block adds about
     * drift^2 of variance per channel: rho^2 * E[sum w^2] = drift^2 */
    double mw2 = 0;
    for (int i = 0; i < t->n_src; i++)
        mw2 += sy->mean_w2[i] / t->n_src;
    const double rho2 = sy->drift * sy->drift / (mw2 > 0 ? mw2 : 1.0);
    /* qwen2_moe's gated shared expert adds rho^2 / 4 (its sigmoid gate is
     * about 0.5); an ungated one (DeepSeek, GLM) adds drift^2, like the
     * routed experts together */
    const double shexp_add = c->n_ff_shexp <= 0 ? 0.0 :
                             c->shexp_gated ? 0.25 * rho2 : sy->drift * sy->drift;
    const double p_moe = sy->drift * sy->drift + shexp_add;
    const double p_att = 0.02 * 0.02;
    sy->p_att = p_att;
    /* leading dense layers (DeepSeek, GLM) add drift^2 */
    sy->var_dense_out = sy->drift * sy->drift / ((double)(c->n_ff > 0 ? c->n_ff : 1) * SILU2);
    sy->var_exp_out = rho2 / ((double)c->n_ff_exp * SILU2);
    sy->var_ffn_out = c->n_ff_shexp > 0 ? (c->shexp_gated ? rho2 : shexp_add) /
                                          ((double)c->n_ff_shexp * SILU2) :
                      rho2 / ((double)(c->n_ff > 0 ? c->n_ff : 1) * SILU2);
    sy->var_att_in = shoal_xcalloc((size_t)L, sizeof(double));
    for (int64_t il = 0; il < L; il++) {
        /* Expected per-channel variance (off c0) of the residual before this
         * layer's attention and before its ffn_norm. The norms divide by the
         * rms of all channels, c0 included, so the share c0 keeps after the
         * norm (u0^2 of n_embd) shrinks with depth; every weight that reads a
         * normed input is scaled by 1 / (n_embd - u0^2) so its outputs keep
         * unit variance (else deeper experts would add ever more to the
         * residual and flatten the routing). */
        double ev_att = 1.0 + (double)il * (p_att + p_moe);
        double u0_att = sy->C / sqrt((sy->C * sy->C + (E - 1) * ev_att) / E);
        sy->var_att_in[il] = 1.0 / (E - u0_att * u0_att);
        double ev = 1.0 + (double)(il + 1) * p_att + (double)il * p_moe;
        double rms2 = (sy->C * sy->C + (E - 1) * ev) / E;
        sy->u0[il] = sy->C / sqrt(rms2);
        sy->sigma[il] = 1.0 / sqrt(E - sy->u0[il] * sy->u0[il]);
        if (!shoal_layer_is_moe(c, il))
            continue;
        double depth = L > 1 ? (double)il / (double)(L - 1) : 0.0;
        int best = 0;
        for (int i = 1; i < t->n_src; i++)
            if (fabs(t->src_depth[i] - depth) < fabs(t->src_depth[best] - depth))
                best = i;
        sy->layer_src[il] = t->src_layer[best];
        for (int64_t e = 0; e < NE; e++)
            perm[e] = (int32_t)e;
        struct rng g = rng_for(sy->seed, 0x9e7, (uint64_t)il, 0);
        for (int64_t e = NE - 1; e > 0; e--) {
            int64_t j = (int64_t)(rng_next(&g) % (uint64_t)(e + 1));
            int32_t tmp = perm[e];
            perm[e] = perm[j];
            perm[j] = tmp;
        }
        /* rank j of the trace goes to expert perm[j] */
        for (int64_t j = 0; j < NE; j++) {
            sy->layer_target[il * NE + perm[j]] = t->shares[best][j];
            sy->layer_bias[il * NE + perm[j]] = bias_src[best][j];
        }
        if (grouped) {
            /* an expert's inclusion depends on its group mates, so the
             * biases fitted in rank order do not carry over to this layer's
             * permutation: fit them again in place */
            double w2, e;
            inclusion_targets(sy->layer_target + il * NE, NE, K, pi);
            calibrate(&rt, pi, sy->seed, sy->layer_bias + il * NE, &w2, &e);
            if (e > sy->layer_err)
                sy->layer_err = e;
            sy->n_layer_fits++;
        }
    }
    free(pi);
    double ev_out = 1.0 + (double)L * (p_att + p_moe);
    /* logits std about 2: out_norm zeroes c0, the rest carries E*ev/(1+ev) */
    sy->var_head = 4.0 / (E * ev_out / (1.0 + ev_out));
    free(perm);
    for (int i = 0; i < t->n_src; i++)
        free(bias_src[i]);
    return 0;
}
