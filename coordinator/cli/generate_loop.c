/* generate_loop: one prompt's generation as `shoal run` and `shoal chat`
 * run it: evaluate the prompt, then sample, stream and feed tokens back
 * (struct shoal_gen, session.h) until it ends; the --logits-out and
 * --ids-out files, the timings line, errors on their own line. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "log.h"
#include "npy.h"
#include "session_flags.h"
#include "util.h"

/* An error in the middle of the output: on a terminal, the text printed so
 * far (the echoed prompt, g's tokens) ends its line first, so the error
 * starts its own (in a pipe stdout's bytes stay exactly the text). */
static void gen_fail(const struct shoal_gen *g, const char *g_echo, FILE *out, const char *msg)
{
    const int printed = (g_echo && *g_echo) || shoal_gen_n_printed(g) > 0;
    if (printed && out && isatty(fileno(out)))
        shoal_log_text(out, "\n", 1);
    shoal_cli_error("%s", msg);   /* on its own line also when out is stderr's pipe */
}

/* Sample the next token from logits ([n_vocab], modified) with room
 * tokens of context left: --logits-out gets the logits first, --ids-out the
 * token, *t_first the time of the first. Returns 0 with *act and *id set,
 * or -1 with err set when --logits-out cannot be written. */
static int sample(struct shoal_session *s, struct shoal_gen *g, const struct shoal_gen_opts *o,
                  float *logits, int64_t room, struct shoal_npy_writer *npy, FILE *ids_f,
                  double t0, double *t_first, enum shoal_gen_action *act, int32_t *id,
                  struct shoal_err *err)
{
    if (shoal_gen_n_generated(g) < o->max_tokens && o->logits_out &&
        shoal_npy_append(npy, logits, err))
        return -1;
    *act = shoal_gen_next(g, logits, s->history, s->n_history, room, id, err);
    if (*id >= 0 && shoal_gen_n_generated(g) == 1)
        *t_first = shoal_time_s() - t0;
    if (*id >= 0 && ids_f)
        fprintf(ids_f, "%s%d", shoal_gen_n_generated(g) > 1 ? " " : "", *id);
    return 0;
}

int shoal_cli_generate(struct shoal_session *s, const int32_t *prompt,
                       size_t n_prompt, const struct shoal_gen_opts *o, FILE *out)
{
    struct shoal_err err = {0};
    const int64_t V = s->model->cfg.n_vocab;
    const int64_t n_ctx = shoal_ctx_n_ctx(s->ctx);
    const int64_t n_past = shoal_ctx_n_past(s->ctx);
    if (n_prompt == 0) {
        shoal_cli_error("the prompt is empty (no tokens)");
        return -1;
    }
    if ((int64_t)n_prompt > n_ctx - n_past) {
        shoal_cli_error("prompt of %zu tokens is longer than the context allows: "
                        "%lld tokens (--ctx) with %lld already used",
                        n_prompt, (long long)n_ctx, (long long)n_past);
        return -1;
    }
    struct shoal_npy_writer npy = {0}, dnpy = {0};
    FILE *ids_f = NULL;
    if (o->logits_out && shoal_npy_open(&npy, o->logits_out, V, &err)) {
        shoal_cli_error("%s", err.msg);
        return -1;
    }
    if (o->draft_logits_out && shoal_npy_open(&dnpy, o->draft_logits_out, V, &err)) {
        shoal_cli_error("%s", err.msg);
        shoal_npy_close(&npy, NULL);
        return -1;
    }
    float *drow = o->draft_logits_out ? shoal_xmalloc((size_t)V * sizeof(float)) : NULL;
    if (o->ids_out && !(ids_f = fopen(o->ids_out, "w"))) {
        shoal_cli_error("cannot create '%s': %s", o->ids_out, strerror(errno));
        shoal_npy_close(&npy, NULL);
        return -1;
    }
    if (o->echo) {
        /* the continuation reads on from the prompt, as in a terminal */
        shoal_log_text(out, o->echo, strlen(o->echo));
    }
    struct shoal_gen *g = shoal_gen_create(s, o, out);
    struct shoal_spec sp;
    struct shoal_spec_cost cost = {{0}, {0}, 0};
    shoal_spec_init(&sp, o->speculate, o->draft_max);
    /* a verify step: the sampled token and its drafts, and their rows of logits */
    int32_t step[1 + SHOAL_SPEC_DRAFT_MAX];
    float *rows = o->speculate != SHOAL_SPEC_OFF
                      ? shoal_xmalloc((size_t)(1 + sp.draft_max) * (size_t)V * sizeof(float))
                      : NULL;
    const int64_t n_batch = shoal_ctx_n_batch(s->ctx);
    /* drafts from the MTP layers: --speculate mtp, or auto on a context that keeps them */
    const int mtp = o->speculate == SHOAL_SPEC_MTP ||
                    (o->speculate == SHOAL_SPEC_AUTO && shoal_ctx_has_mtp(s->ctx));
    double t_one = 0, t_verify = 0;   /* seconds in 1-row steps, in verify steps */
    int64_t n_one = 0, rows_verify = 0;
    int rc = 0;
    double t0 = shoal_time_s(), t_prefill = 0, t_first = 0, t_dec0 = 0;
    if (shoal_ctx_eval(s->ctx, prompt, (int64_t)n_prompt, s->logits, 0, &err)) {
        gen_fail(g, o->echo, out, err.msg);
        rc = -1;
        goto done;
    }
    shoal_session_history_push(s, prompt, n_prompt);
    t_prefill = shoal_time_s() - t0;
    t_dec0 = shoal_time_s();
    enum shoal_gen_action act = SHOAL_GEN_END;
    int32_t id = -1;
    int pending = 0;   /* act and id come from a verify step's row: already sampled */
    for (;;) {
        if (!pending) {
            if (s->interrupt && *s->interrupt) {
                shoal_gen_interrupt(g);
                break;
            }
            if (sample(s, g, o, s->logits, n_ctx - shoal_ctx_n_past(s->ctx), &npy, ids_f, t0,
                       &t_first, &act, &id, &err)) {
                gen_fail(g, o->echo, out, err.msg);
                rc = -1;
                break;
            }
        }
        pending = 0;
        if (act == SHOAL_GEN_ERROR) {
            gen_fail(g, o->echo, out, err.msg);
            rc = -1;
            break;
        }
        if (act == SHOAL_GEN_END)
            break;
        const int64_t n0 = shoal_ctx_n_past(s->ctx);
        if (drow) {   /* the MTP head's logits for the token after id */
            int32_t d;
            if (shoal_ctx_mtp_draft(s->ctx, 0, id, 1, &d, drow, &err) < 0 ||
                shoal_npy_append(&dnpy, drow, &err)) {
                gen_fail(g, o->echo, out, err.msg);
                rc = -1;
                break;
            }
        }
        int64_t k = 0;
        if (act == SHOAL_GEN_FEED) {
            /* drafts that fit the context and the step, and that max-tokens can use */
            int64_t limit = n_ctx - n0 - 1;
            if (limit > o->max_tokens - shoal_gen_n_generated(g) - 1)
                limit = o->max_tokens - shoal_gen_n_generated(g) - 1;
            if (limit > n_batch - 1)
                limit = n_batch - 1;
            /* a lookup match first (free to draft; none in mode mtp), else the
             * MTP layers: the gate first, then their drafts */
            k = shoal_spec_plan(&sp, &cost, 1, 1, s->history, s->n_history, id, limit,
                                step + 1);
            if (mtp && k == 0) {
                shoal_spec_draft_estimate(&cost, s->model->cfg.n_layer);
                k = shoal_spec_choose(&sp, &cost, 1, 1, limit);
                if (k > 0) {
                    const double td = shoal_time_s();
                    const int nd = shoal_ctx_mtp_draft(s->ctx, 0, id, (int)k, step + 1, NULL,
                                                       &err);
                    if (nd < 0) {
                        gen_fail(g, o->echo, out, err.msg);
                        rc = -1;
                        break;
                    }
                    shoal_spec_draft_cost_record(&cost, nd, shoal_time_s() - td);
                    k = nd;
                }
            }
        }
        if (k == 0) {
            float *lg = act == SHOAL_GEN_FEED ? s->logits : NULL;
            const double ts = shoal_time_s();
            if (shoal_ctx_eval(s->ctx, &id, 1, lg, 0, &err)) {
                if (act == SHOAL_GEN_FEED_LAST)
                    break;   /* the end token stays out of the cache */
                gen_fail(g, o->echo, out, err.msg);
                rc = -1;
                break;
            }
            shoal_session_history_push(s, &id, 1);
            if (act == SHOAL_GEN_FEED_LAST)
                break;
            shoal_spec_cost_record(&cost, 1, shoal_time_s() - ts);
            t_one += shoal_time_s() - ts;
            n_one++;
            continue;
        }
        /* verify: id and k drafts in one step; row j's logits are those a
         * one-token step after draft j-1 would give (forward.h), so the
         * sampler sees what it would see without drafts */
        step[0] = id;
        const double ts = shoal_time_s();
        if (shoal_ctx_eval(s->ctx, step, k + 1, rows, 1, &err)) {
            gen_fail(g, o->echo, out, err.msg);
            rc = -1;
            break;
        }
        const double dt = shoal_time_s() - ts;
        shoal_session_history_push(s, &id, 1);
        int64_t kept = 0;
        int stop = 0;
        for (int64_t j = 0; j < k && !pending && !stop; j++) {
            if (s->interrupt && *s->interrupt) {
                shoal_ctx_truncate(s->ctx, n0 + 1 + j);
                shoal_gen_interrupt(g);
                stop = 1;
                break;
            }
            if (sample(s, g, o, rows + j * V, n_ctx - (n0 + 1 + j), &npy, ids_f, t0, &t_first,
                       &act, &id, &err)) {
                shoal_ctx_truncate(s->ctx, n0 + 1 + j);
                gen_fail(g, o->echo, out, err.msg);
                rc = -1;
                stop = 1;
                break;
            }
            const int same = id == step[1 + j];
            if (same && (act == SHOAL_GEN_FEED || act == SHOAL_GEN_FEED_LAST)) {
                kept++;   /* the draft is the token: it is in the cache already */
                shoal_session_history_push(s, &id, 1);
                stop = act == SHOAL_GEN_FEED_LAST;
                if (stop)
                    shoal_ctx_truncate(s->ctx, n0 + 2 + j);
                continue;
            }
            shoal_ctx_truncate(s->ctx, n0 + 1 + j);   /* the drafts from j on go */
            if (act == SHOAL_GEN_END)
                stop = 1;
            else
                pending = 1;   /* another token (or an error): handled as a sampled one */
        }
        shoal_spec_cost_record(&cost, k + 1, dt);
        t_verify += dt;
        rows_verify += k + 1;
        shoal_spec_record(&sp, k, kept);
        if (rc || stop)
            break;
        if (!pending)   /* every draft kept: the last row is the next step's logits */
            memcpy(s->logits, rows + k * V, (size_t)V * sizeof(float));
    }
    if (o->spec)
        *o->spec = sp;
    const int64_t n_gen = shoal_gen_n_generated(g);
    const char *why = shoal_gen_why(g);
    char *text = shoal_gen_finish(g, rc != 0, NULL);
    g = NULL;
    double t_dec = shoal_time_s() - t_dec0;
    if (o->print_timings && rc == 0) {
        if (!o->on_text)
            shoal_log_text(out, "\n", 1);
        /* the first token comes from the prefill: a rate needs two */
        char rate[32] = "n/a";
        if (n_gen > 1 && t_dec > 0)
            snprintf(rate, sizeof rate, "%.2f", (double)(n_gen - 1) / t_dec);
        char spec[200] = "";
        if (sp.mode != SHOAL_SPEC_OFF) {
            int n = snprintf(spec, sizeof spec,
                             " | speculate %s: %lld drafted, %lld kept (%.0f %%), %lld verify "
                             "steps", shoal_spec_mode_name(sp.mode), (long long)sp.n_drafted,
                             (long long)sp.n_accepted,
                             sp.n_drafted ? 100.0 * (double)sp.n_accepted / (double)sp.n_drafted
                                          : 0.0, (long long)sp.n_verify);
            /* what a verify step cost: its mean rows, and its mean time over a
             * one-row step's */
            if (sp.n_verify && n_one && t_one > 0 && n > 0 && (size_t)n < sizeof spec)
                snprintf(spec + n, sizeof spec - (size_t)n, " of %.1f rows at %.2fx a 1-row step",
                         (double)rows_verify / (double)sp.n_verify,
                         (t_verify / (double)sp.n_verify) / (t_one / (double)n_one));
        }
        fprintf(stderr,
                "shoal: prompt %zu tokens, prefill %.1f tok/s, TTFT %.1f ms | "
                "decode %lld tokens, %s tok/s | stop: %s%s\n",
                n_prompt, t_prefill > 0 ? (double)n_prompt / t_prefill : 0.0,
                t_first * 1e3, (long long)n_gen, rate, why, spec);
    }
    if (o->capture)
        *o->capture = text;
    else
        free(text);
done:
    free(rows);
    if (g) {
        char *t = shoal_gen_finish(g, 1, NULL);
        if (o->capture)
            *o->capture = t;
        else
            free(t);
    }
    if (ids_f) {
        fputc('\n', ids_f);
        int bad = ferror(ids_f);
        if ((fclose(ids_f) != 0 || bad) && rc == 0) {
            shoal_cli_error("cannot write '%s': %s", o->ids_out, strerror(errno ? errno : EIO));
            rc = -1;
        }
    }
    if (o->logits_out && shoal_npy_close(&npy, &err) && rc == 0) {
        shoal_cli_error("%s", err.msg);
        rc = -1;
    }
    if (o->draft_logits_out && shoal_npy_close(&dnpy, &err) && rc == 0) {
        shoal_cli_error("%s", err.msg);
        rc = -1;
    }
    free(drow);
    return rc;
}
