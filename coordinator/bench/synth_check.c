/* synth_check: `shoal synth --check DIR` (synth.h): decode on a container
 * with run's engine, store and cluster flags and report finite logits, the
 * per-stage timings of a measured window and, for a synthetic container,
 * the achieved expert frequencies against synth.json's targets. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "config.h"
#include "expert_store.h"
#include "forward.h"
#include "model.h"
#include "quant.h"
#include "sampler.h"
#include "session.h"
#include "session_flags.h"
#include "synth.h"
#include "util.h"

/* Top-k of v[n] into idx[k] (descending, ties to the lower id). */
static void topk(const double *v, int64_t n, int64_t k, int32_t *idx)
{
    int64_t m = 0;
    for (int64_t e = 0; e < n; e++) {
        if (m == k && v[e] <= v[idx[k - 1]])
            continue;
        int64_t p = m < k ? m++ : k - 1;
        while (p > 0 && v[idx[p - 1]] < v[e]) {
            idx[p] = idx[p - 1];
            p--;
        }
        idx[p] = (int32_t)e;
    }
}

struct routing_summary {
    int have;
    int64_t n_layers;
    double tokens;          /* routed tokens per layer (counts / k) */
    double tv, tv_noise;    /* mean total variation distance; its sampling floor */
    double top8_target, top8_achieved;  /* share of the hottest n/8 experts (by target) */
    double top1_target, top1_achieved;  /* mean over layers of the largest share */
    double uniform;         /* 1 / n_expert */
};

/* Compare DIR/routing_counts.json (this run's routing) with synth.json's
 * targets; optionally write both per layer to out_path. */
static int routing_compare(const char *dir, const char *out_path, struct routing_summary *rs)
{
    memset(rs, 0, sizeof *rs);
    char *pc = shoal_path_join(dir, "routing_counts.json");
    char *pt = shoal_path_join(dir, "synth.json");
    json_error_t jerr;
    json_t *jc = json_load_file(pc, 0, &jerr);
    json_t *jt = json_load_file(pt, 0, &jerr);
    free(pc);
    free(pt);
    json_t *counts = json_object_get(jc, "counts");
    json_t *tl = json_object_get(jt, "layers");
    json_t *out = json_array();
    int rc = -1;
    if (!json_is_array(counts))
        goto done;
    int64_t k = 1;
    {
        char *pcfg = shoal_path_join(dir, "config.json");
        json_t *cf = json_load_file(pcfg, 0, &jerr);
        free(pcfg);
        k = json_integer_value(json_object_get(cf, "num_experts_per_tok"));
        json_decref(cf);
        if (k < 1)
            k = 1;
    }
    for (size_t il = 0; il < json_array_size(counts); il++) {
        json_t *row = json_array_get(counts, il);
        size_t ne = json_array_size(row);
        double tot = 0;
        for (size_t e = 0; e < ne; e++)
            tot += json_number_value(json_array_get(row, e));
        if (tot <= 0 || ne == 0)
            continue;
        json_t *tgt = NULL;
        for (size_t j = 0; json_is_array(tl) && j < json_array_size(tl); j++) {
            json_t *l = json_array_get(tl, j);
            if ((size_t)json_integer_value(json_object_get(l, "layer")) == il)
                tgt = json_object_get(l, "target_share");
        }
        double *a = shoal_xmalloc(ne * sizeof *a), *t = shoal_xmalloc(ne * sizeof *t);
        int32_t *ord = shoal_xmalloc(ne * sizeof *ord);
        for (size_t e = 0; e < ne; e++) {
            a[e] = json_number_value(json_array_get(row, e)) / tot;
            t[e] = json_is_array(tgt) && json_array_size(tgt) == ne
                       ? json_number_value(json_array_get(tgt, e)) : 1.0 / (double)ne;
        }
        topk(t, (int64_t)ne, (int64_t)ne, ord);
        double tv = 0, floor_ = 0, t8 = 0, a8 = 0, amax = 0, tmax = 0;
        const double m = tot; /* (token, slot) samples */
        for (size_t e = 0; e < ne; e++) {
            tv += 0.5 * fabs(a[e] - t[e]);
            floor_ += 0.5 * sqrt(2.0 / M_PI) * sqrt(t[e] * (1 - t[e]) / m);
            if (a[e] > amax)
                amax = a[e];
            if (t[e] > tmax)
                tmax = t[e];
        }
        size_t n8 = ne / 8 ? ne / 8 : 1;
        for (size_t j = 0; j < n8; j++) {
            t8 += t[ord[j]];
            a8 += a[ord[j]];
        }
        rs->n_layers++;
        rs->tokens = tot / (double)k;
        rs->tv += tv;
        rs->tv_noise += floor_;
        rs->top8_target += t8;
        rs->top8_achieved += a8;
        rs->top1_target += tmax;
        rs->top1_achieved += amax;
        rs->uniform = 1.0 / (double)ne;
        json_t *ja = json_array(), *jtg = json_array();
        for (size_t e = 0; e < ne; e++) {
            json_array_append_new(ja, json_real(a[e]));
            json_array_append_new(jtg, json_real(t[e]));
        }
        json_array_append_new(out, json_pack("{s:I, s:f, s:f, s:o, s:o}", "layer",
                                             (json_int_t)il, "tv", tv, "tv_noise", floor_,
                                             "target", jtg, "achieved", ja));
        free(a);
        free(t);
        free(ord);
    }
    if (rs->n_layers) {
        double n = (double)rs->n_layers;
        rs->tv /= n;
        rs->tv_noise /= n;
        rs->top8_target /= n;
        rs->top8_achieved /= n;
        rs->top1_target /= n;
        rs->top1_achieved /= n;
        rs->have = 1;
        rc = 0;
    }
    if (out_path && rs->have) {
        json_t *doc = json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:o}", "tokens_per_layer",
                                rs->tokens, "tv", rs->tv, "tv_noise", rs->tv_noise,
                                "top_eighth_target", rs->top8_target, "top_eighth_achieved",
                                rs->top8_achieved, "top1_target", rs->top1_target,
                                "top1_achieved", rs->top1_achieved, "layers", out);
        out = NULL;
        if (json_dump_file(doc, out_path, JSON_INDENT(1)) != 0)
            shoal_cli_error("cannot write '%s'", out_path);
        json_decref(doc);
    }
done:
    json_decref(out);
    json_decref(jc);
    json_decref(jt);
    return rc;
}

static void timings_sub(struct shoal_ctx_timings *d, const struct shoal_ctx_timings *a,
                        const struct shoal_ctx_timings *b)
{
    d->attention = a->attention - b->attention;
    d->routing = a->routing - b->routing;
    d->experts = a->experts - b->experts;
    d->combine = a->combine - b->combine;
    d->head = a->head - b->head;
}

int synth_check_main(int argc, char **argv)
{
    struct shoal_session_opts so = shoal_session_opts_default();
    long long prompt_len = 16, warmup = 0, decode = 32, seed = 1;
    int preload = 0, keep_counts = 0;
    const char *json_out = NULL, *routing_out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--check"))
            continue;
        int r = shoal_session_parse_flag(&so, argc, argv, &i);
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            synth_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--preload")) {
            preload = 1;
            continue;
        }
        if (!strcmp(a, "--keep-counts")) {
            keep_counts = 1;
            continue;
        }
        if (a[0] != '-') {
            if (shoal_cli_take_path("synth", "container to check", a, &so.model_dir) < 0)
                return 2;
            continue;
        }
        if (i + 1 >= argc) {
            shoal_cli_error("%s needs a value", a);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--prompt-len")) {
            if (shoal_cli_parse_i64(a, v, 1, 1 << 20, &prompt_len))
                return 2;
        } else if (!strcmp(a, "--warmup")) {
            if (shoal_cli_parse_i64(a, v, 0, 1 << 20, &warmup))
                return 2;
        } else if (!strcmp(a, "--decode")) {
            if (shoal_cli_parse_i64(a, v, 1, 1 << 20, &decode))
                return 2;
        } else if (!strcmp(a, "--seed")) {
            if (shoal_cli_parse_i64(a, v, 0, INT64_MAX, &seed))
                return 2;
        } else if (!strcmp(a, "--json")) {
            json_out = v;
        } else if (!strcmp(a, "--routing-out")) {
            routing_out = v;
        } else {
            shoal_cli_error("synth --check: unknown option '%s' (see 'shoal synth --help')", a);
            return 2;
        }
    }
    if (!so.model_dir) {
        shoal_cli_error("synth --check: usage: shoal synth --check DIR [options]");
        return 2;
    }
    const char *dir = so.model_dir;
    if (shoal_model_is_gguf(dir)) {
        /* its routing and expert bytes are a synthetic container's files */
        shoal_cli_error("synth --check: '%s' is a GGUF file; --check decodes on a shoal "
                        "container (made by 'shoal synth' or 'shoal convert'); measure a "
                        "GGUF with 'shoal bench --model FILE.gguf'", dir);
        return 2;
    }
    if (so.n_ctx == 0)
        so.n_ctx = prompt_len + warmup + decode + 8;
    if (!keep_counts) {
        char *pc = shoal_path_join(dir, "routing_counts.json");
        unlink(pc);
        free(pc);
    }
    int open_rc;
    struct shoal_session *s = shoal_cli_session_open(&so, &open_rc);
    if (!s)
        return open_rc;
    struct shoal_err err = {0};
    const struct shoal_model_config *c = &s->model->cfg;
    const int64_t V = c->n_vocab;
    const int64_t n_tok = prompt_len + warmup + decode;
    int32_t *hist = shoal_xmalloc((size_t)(n_tok + 1) * sizeof *hist);
    float *logits = shoal_xmalloc((size_t)V * sizeof *logits);
    struct rng g = rng_for((uint64_t)seed, 0x9a0, 0, 0);
    for (int64_t i = 0; i < prompt_len; i++)
        hist[i] = (int32_t)(rng_next(&g) % (uint64_t)(V > 1 ? V - 1 : 1));
    int64_t n_hist = prompt_len, nonfinite = 0;
    double max_abs = 0, t_preload = 0;
    uint64_t preload_bytes = 0;
    int rc = 0;
    double t0 = shoal_time_s();
    if (shoal_ctx_eval(s->ctx, hist, prompt_len, logits, 0, &err)) {
        shoal_cli_error("%s", err.msg);
        rc = 1;
        goto out;
    }
    double t_prompt = shoal_time_s() - t0;
    if (preload && s->model->store && s->model->ct) {
        const struct shoal_container *ct = s->model->ct;
        double tp = shoal_time_s();
        for (int64_t il = 0; il < ct->n_layer && !rc; il++) {
            if (ct->layer_offset[il] == UINT64_MAX)
                continue;
            for (int64_t ie = 0; ie < ct->n_expert; ie++) {
                struct shoal_expert_weights w;
                if (shoal_expert_store_acquire(s->model->store, il, ie, &w, &err) < 0) {
                    shoal_cli_error("%s", err.msg);
                    rc = 1;
                    break;
                }
                shoal_expert_store_release(s->model->store, il, ie);
                preload_bytes += ct->blob_bytes;
            }
        }
        t_preload = shoal_time_s() - tp;
        if (rc)
            goto out;
    }
    struct shoal_sampler_params sp = shoal_sampler_params_default();
    sp.seed = (uint64_t)seed;
    struct shoal_sampler *smp = shoal_sampler_create(sp, V);
    struct shoal_ctx_timings tw0 = *shoal_ctx_timings(s->ctx), tm0 = tw0, tm1;
    double t_w0 = shoal_time_s(), t_m0 = t_w0, t_m1 = t_w0;
    for (int64_t step = 0; step < warmup + decode; step++) {
        if (step == warmup) {
            tm0 = *shoal_ctx_timings(s->ctx);
            t_m0 = shoal_time_s();
        }
        for (int64_t v = 0; v < V; v++) {
            if (!isfinite(logits[v]))
                nonfinite++;
            else if (fabs(logits[v]) > max_abs)
                max_abs = fabs(logits[v]);
        }
        int32_t id = shoal_sampler_sample(smp, logits, hist, n_hist);
        hist[n_hist++] = id;
        if (shoal_ctx_eval(s->ctx, &id, 1, logits, 0, &err)) {
            shoal_cli_error("%s", err.msg);
            rc = 1;
            break;
        }
    }
    t_m1 = shoal_time_s();
    tm1 = *shoal_ctx_timings(s->ctx);
    shoal_sampler_free(smp);
    if (rc)
        goto out;
    for (int64_t v = 0; v < V; v++)
        if (!isfinite(logits[v]))
            nonfinite++;
    {
        struct shoal_ctx_timings dm;
        timings_sub(&dm, &tm1, &tm0);
        (void)tw0;
        int64_t n_moe = 0;
        for (int64_t il = 0; il < c->n_layer; il++)
            n_moe += shoal_layer_is_moe(c, il);
        const uint64_t blob = s->model->ct ? s->model->ct->blob_bytes : 0;
        const double per_tok = (double)n_moe * (double)c->n_expert_used * (double)blob;
        const double wall = t_m1 - t_m0;
        int distinct = 0;
        for (int64_t i = prompt_len; i < n_hist; i++) {
            int seen = 0;
            for (int64_t j = prompt_len; j < i && !seen; j++)
                seen = hist[j] == hist[i];
            distinct += !seen;
        }
        /* the session prints --stats at close; routing counts are saved then */
        shoal_cli_session_close(s);
        s = NULL;
        struct routing_summary rs;
        routing_compare(dir, routing_out, &rs);
        printf("check %s: %lld prompt + %lld warm-up + %lld measured decode tokens, quant "
               "kernels %s\n", dir, prompt_len, warmup, decode, shoal_quant_ops_name());
        printf("  logits: %lld non-finite, max |logit| %.3g, %d distinct generated ids\n",
               (long long)nonfinite, max_abs, distinct);
        if (preload)
            printf("  preload: %.1f MB in %.2f s (%.0f MB/s, one expert at a time)\n",
                   (double)preload_bytes / 1e6, t_preload,
                   t_preload > 0 ? (double)preload_bytes / 1e6 / t_preload : 0.0);
        printf("  measured: %.2f tok/s; per token: attention %.2f ms, routing %.2f ms, "
               "experts %.2f ms, combine %.2f ms, head %.2f ms, wall %.2f ms\n",
               wall > 0 ? (double)decode / wall : 0.0, 1e3 * dm.attention / (double)decode,
               1e3 * dm.routing / (double)decode, 1e3 * dm.experts / (double)decode,
               1e3 * dm.combine / (double)decode, 1e3 * dm.head / (double)decode,
               1e3 * wall / (double)decode);
        printf("  expert bytes: %.1f MB per token; %.0f MB/s over the experts stage, %.0f "
               "MB/s over the wall time\n", per_tok / 1e6,
               dm.experts > 0 ? per_tok * (double)decode / 1e6 / dm.experts : 0.0,
               wall > 0 ? per_tok * (double)decode / 1e6 / wall : 0.0);
        if (rs.have)
            printf("  routing (%lld layers, %.0f tokens each): top-1/8 experts take %.1f%% "
                   "of slots (target %.1f%%, uniform 12.5%%); largest share %.2f%% (target "
                   "%.2f%%, uniform %.2f%%); total variation %.3f (sampling floor %.3f)\n",
                   (long long)rs.n_layers, rs.tokens, 100 * rs.top8_achieved,
                   100 * rs.top8_target, 100 * rs.top1_achieved, 100 * rs.top1_target,
                   100 * rs.uniform, rs.tv, rs.tv_noise);
        else
            printf("  routing: n/a (no %s/routing_counts.json, or no synth.json)\n", dir);
        if (json_out) {
            json_t *j = json_pack(
                "{s:s, s:s, s:{s:I, s:I, s:I}, s:I, s:f, s:i, s:f, s:f, s:f, s:f, "
                "s:{s:f, s:f, s:f, s:f, s:f}, s:f, s:f, s:f, s:I}",
                "model", dir, "quant_kernels", shoal_quant_ops_name(), "tokens", "prompt", (json_int_t)prompt_len, "warmup",
                (json_int_t)warmup, "measured", (json_int_t)decode,
                "nonfinite_logits", (json_int_t)nonfinite, "max_abs_logit", max_abs,
                "distinct_ids", distinct, "prompt_seconds", t_prompt,
                "preload_seconds", t_preload, "preload_bytes", (double)preload_bytes,
                "measured_seconds", wall,
                "measured_stage_seconds", "attention", dm.attention, "routing", dm.routing,
                "experts", dm.experts, "combine", dm.combine, "head", dm.head,
                "expert_bytes_per_token", per_tok,
                "expert_bytes_per_s_stage", dm.experts > 0 ? per_tok * (double)decode /
                                                             dm.experts : 0.0,
                "expert_bytes_per_s_wall", wall > 0 ? per_tok * (double)decode / wall : 0.0,
                "blob_bytes", (json_int_t)blob);
            if (rs.have)
                json_object_set_new(j, "routing", json_pack(
                    "{s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "layers",
                    (json_int_t)rs.n_layers, "tokens_per_layer", rs.tokens, "tv", rs.tv,
                    "tv_noise", rs.tv_noise, "top_eighth_target", rs.top8_target,
                    "top_eighth_achieved", rs.top8_achieved, "top1_target", rs.top1_target,
                    "top1_achieved", rs.top1_achieved, "uniform", rs.uniform));
            if (!j || json_dump_file(j, json_out, JSON_INDENT(1)) != 0) {
                shoal_cli_error("cannot write '%s'", json_out);
                rc = 1;
            }
            json_decref(j);
        }
        if (nonfinite)
            rc = 1;
    }
out:
    shoal_cli_session_close(s);
    free(hist);
    free(logits);
    return rc;
}

