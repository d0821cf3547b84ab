/* session: a model, its tokenizer, context and expert executors, opened
 * from options (session.h). Prints nothing: errors come back in a
 * shoal_err; cli/session_flags.c parses the flags and reports. */
#include "session.h"

#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "container.h"
#include "discover.h"
#include "expert_store.h"
#include "gguf.h"
#include "kv.h"
#include "log.h"
#include "quant.h"
#include "util.h"

struct shoal_session_opts shoal_session_opts_default(void)
{
    return (struct shoal_session_opts){.kv = -1, .expert_cache = ~0ull, .io = SHOAL_IO_AUTO,
                                       .queue_depth = 8, .prefetch = 1,
                                       .cache_policy = SHOAL_CACHE_FREQ,
                                       .local_experts = 1, .connect_timeout = 5.0,
                                       .discover_timeout = SHOAL_DISCOVER_BROWSE_S_DEFAULT,
                                       .request_timeout = 30.0};
}

struct shoal_gen_opts shoal_gen_opts_default(void)
{
    struct shoal_gen_opts o;
    memset(&o, 0, sizeof o);
    o.sampling = shoal_sampler_params_default();
    o.sampling.seed = 24301;
    o.max_tokens = 256;
    o.print_timings = 1;
    o.speculate = SHOAL_SPEC_OFF;
    o.draft_max = 0;   /* per mode: SHOAL_SPEC_DRAFT_DEFAULT, or _MTP */
    return o;
}

int shoal_session_is_cluster(const struct shoal_session_opts *o)
{
    return o->n_workers_args > 0 || o->accept_workers;
}

struct shoal_session *shoal_session_open(const struct shoal_session_opts *o, const char *dir,
                                         int *status, struct shoal_err *err)
{
    int dummy;
    if (!status)
        status = &dummy;
    *status = 1;
    if (o->threads > 0)
        omp_set_num_threads((int)o->threads);
    struct shoal_session *s = shoal_xcalloc(1, sizeof *s);
    s->model = shoal_model_load(dir, err);
    if (!s->model) {
        /* a GGUF file shoal cannot run (architecture, key, tensor type, shape)
         * is bad input, like a bad flag; an I/O error stays 1 */
        if (shoal_model_is_gguf(dir) && err && shoal_err_is_bad_input(err->code))
            *status = 2;
        free(s);
        return NULL;
    }
    if (shoal_model_gguf_meta(s->model) && s->model->cfg.n_expert > 0) {
        /* a GGUF's experts are streamed from the file itself, like a container's */
        s->gguf_experts = shoal_container_from_gguf(s->model, err);
        if (!s->gguf_experts) {
            if (err && shoal_err_is_bad_input(err->code))
                *status = 2;
            shoal_session_close(s);
            return NULL;
        }
    }
    const struct shoal_container *ect = s->model->ct ? s->model->ct : s->gguf_experts;
    if (ect) {
        if (o->n_mirror_weights && o->n_mirror_weights != 1 + o->n_mirror) {
            shoal_err_set(err, SHOAL_EINVAL, "--mirror-weights gives %d weights for %d "
                          "sources (the container first, then each --mirror)",
                          o->n_mirror_weights, 1 + o->n_mirror);
            *status = 2;   /* a bad flag value */
            shoal_session_close(s);
            return NULL;
        }
        /* routing counts go next to the container, or here when it is
         * read-only: $XDG_CACHE_HOME/shoal, else ~/.cache/shoal */
        char cache_dir[4096] = "";
        const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
        if (xdg && xdg[0] == '/')
            snprintf(cache_dir, sizeof cache_dir, "%s/shoal", xdg);
        else if (home && home[0] == '/')
            snprintf(cache_dir, sizeof cache_dir, "%s/.cache/shoal", home);
        struct shoal_expert_store_params sp = shoal_expert_store_params_default();
        sp.cache_bytes = o->expert_cache;
        sp.cache_policy = (enum shoal_cache_policy)o->cache_policy;
        sp.direct = o->direct;
        sp.io.kind = (enum shoal_io_kind)o->io;
        sp.io.queue_depth = o->queue_depth;
        sp.prefetch = o->prefetch;
        sp.pin_bytes = o->pin;
        sp.mirrors = o->mirrors;
        sp.n_mirror = o->n_mirror;
        sp.source_weights = o->n_mirror_weights ? o->mirror_weights : NULL;
        sp.n_source_weights = o->n_mirror_weights;
        sp.counts_fallback_dir = cache_dir[0] ? cache_dir : NULL;
        s->store = shoal_expert_store_create(ect, sp, err);
        if (!s->store) {
            shoal_session_close(s);
            return NULL;
        }
        s->model->store = s->store;
    }
    const struct shoal_gguf *meta = shoal_model_gguf_meta(s->model);
    if (meta) {   /* a GGUF file: its own vocabulary, when it has one */
        if (shoal_gguf_find(meta, "tokenizer.ggml.tokens") >= 0) {
            s->tok = shoal_tokenizer_load_gguf(meta, dir, err);
            if (!s->tok) {
                if (err && shoal_err_is_bad_input(err->code))
                    *status = 2;   /* the file's vocabulary, as its tensors */
                shoal_session_close(s);
                return NULL;
            }
        }
    } else if (shoal_tokenizer_present(dir)) {   /* tokenizer.json, or Kimi-K2's tiktoken.model */
        s->tok = shoal_tokenizer_load(dir, err);
        if (!s->tok) {
            shoal_session_close(s);
            return NULL;
        }
    }
    return s;
}

int shoal_session_start(struct shoal_session *s, const struct shoal_session_opts *o,
                        const struct shoal_experts *experts, int *status,
                        struct shoal_err *err)
{
    int dummy;
    if (!status)
        status = &dummy;
    *status = 1;
    struct shoal_ctx_params cp = shoal_ctx_params_default();
    cp.n_ctx = o->n_ctx;
    cp.n_batch = o->n_batch;
    cp.n_seq = o->n_seq;
    cp.experts = experts;
    cp.mtp = o->mtp == 1 || (o->mtp == 2 && s->model->n_mtp > 0);
    if (o->mtp == 1 && s->model->n_mtp <= 0) {
        shoal_err_set(err, SHOAL_EINVAL, "--speculate mtp: the model '%s' has no usable MTP "
                      "layer: %s", s->model->dir, s->model->cfg.n_nextn > 0
                      ? s->model->mtp_why : "its config has no num_nextn_predict_layers "
                      "(use lookup or auto)");
        *status = 2;
        return -1;
    }
    /* --kv, else the container's choice, else f32 */
    cp.kv_dtype = o->kv >= 0 ? (enum shoal_dtype)o->kv
                  : s->model->ct ? s->model->ct->kv_dtype : SHOAL_DTYPE_F32;
    if (cp.n_ctx > s->model->cfg.max_pos) {
        shoal_err_set(err, SHOAL_EINVAL, "--ctx %lld exceeds the model's "
                      "max_position_embeddings %lld; expected 1..%lld", (long long)cp.n_ctx,
                      (long long)s->model->cfg.max_pos, (long long)s->model->cfg.max_pos);
        *status = 2;   /* a bad flag value, known once the model is read */
        return -1;
    }
    if (o->kv_budget) {
        /* n_seq slots of n_ctx tokens, each token's K and V rows in every layer */
        const struct shoal_model_config *c = &s->model->cfg;
        /* with the MTP layers' state: their KV rows and each position's hidden state */
        const unsigned long long per_token =
            (unsigned long long)(c->n_layer + (cp.mtp ? s->model->n_mtp : 0)) *
                (unsigned long long)shoal_kv_elems_per_token(c) * shoal_dtype_size(cp.kv_dtype) +
            (cp.mtp ? (unsigned long long)c->n_embd * sizeof(float) : 0);
        const unsigned long long slots = (unsigned long long)(cp.n_seq > 0 ? cp.n_seq : 1);
        const long long fit = (long long)(o->kv_budget / (slots * per_token));
        const long long want = cp.n_ctx > 0 ? cp.n_ctx : (c->max_pos < 4096 ? c->max_pos : 4096);
        if (fit < 2) {
            shoal_err_set(err, SHOAL_EINVAL, "--kv-budget %llu bytes holds %lld tokens per "
                          "sequence (%llu sequences x %llu bytes per token, %s); expected "
                          "at least 2", o->kv_budget, fit, slots, per_token,
                          shoal_kv_dtype_name(cp.kv_dtype));
            *status = 2;
            return -1;
        }
        if (fit < want) {
            s->kv_budget_ctx_wanted = want;
            cp.n_ctx = fit;
        }
    }
    s->ctx = shoal_ctx_create(s->model, cp, err);
    if (!s->ctx)
        return -1;
    s->logits = shoal_xcalloc((size_t)s->model->cfg.n_vocab, sizeof(float));
    return 0;
}

void shoal_session_close(struct shoal_session *s)
{
    if (!s)
        return;
    shoal_ctx_free(s->ctx);
    if (s->cluster && s->cluster_destroy)   /* after the context that ran on it */
        s->cluster_destroy(s->cluster);
    shoal_tokenizer_destroy(s->tok);
    shoal_expert_store_destroy(s->store);
    shoal_container_close(s->gguf_experts);
    shoal_model_free(s->model);
    free(s->history);
    free(s->logits);
    free(s->cached_dir);
    free(s);
}

void shoal_session_reset(struct shoal_session *s)
{
    shoal_ctx_truncate(s->ctx, 0);
    s->n_history = 0;
}

int shoal_session_tokenize(struct shoal_session *s, const char *text,
                           int add_bos, int32_t **ids, size_t *n_ids, struct shoal_err *err)
{
    if (!s->tok)
        return shoal_err_set(err, SHOAL_EINVAL, "model '%s' has no tokenizer (tokenizer.json "
                             "or tiktoken.model; a GGUF file: tokenizer.ggml.tokens)",
                             s->model->dir);
    struct shoal_tokenize_params tp = {.add_special = add_bos, .parse_special = 1};
    return shoal_tokenizer_encode(s->tok, text, strlen(text), tp, ids, n_ids, err) ? -1 : 0;
}

