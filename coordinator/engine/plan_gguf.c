/* plan_gguf: the sizes of a GGUF file (or split set) for the planner
 * (plan.h): every tensor at the type it ships in, read from the tensor
 * descriptors and the architecture's metadata; no tensor data is read. */
#include "plan.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml_dot.h"
#include "ggml_types.h"
#include "gguf.h"
#include "gguf_arch.h"
#include "model_config.h"

static int64_t meta_int(const struct shoal_gguf *g, const char *arch, const char *key,
                        int64_t dflt)
{
    char k[160];
    int64_t v;
    snprintf(k, sizeof k, "%s.%s", arch, key);
    if (shoal_gguf_get_int(g, k, &v, NULL) == 0)
        return v;
    /* a per-layer array (head counts of some architectures): its largest */
    struct shoal_gguf_array a;
    if (shoal_gguf_get_array(g, k, &a, NULL) == 0 && a.n > 0 &&
        (a.type == SHOAL_GGUF_TYPE_UINT32 || a.type == SHOAL_GGUF_TYPE_INT32)) {
        int64_t best = 0;
        for (uint64_t i = 0; i < a.n; i++) {
            int64_t x = a.type == SHOAL_GGUF_TYPE_UINT32
                             ? (int64_t)((const uint32_t *)a.data)[i]
                             : (int64_t)((const int32_t *)a.data)[i];
            best = x > best ? x : best;
        }
        return best;
    }
    return dflt;
}

static uint64_t n_elements(const struct shoal_gguf_tensor *t)
{
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->n_dims; d++)
        n *= t->ne[d];
    return n;
}

/* Where a trunk tensor's bytes go, by llama.cpp's tensor names. */
static enum shoal_plan_part part_of(const char *name)
{
    if (!strncmp(name, "token_embd", 10))
        return SHOAL_PLAN_EMBED;
    if (!strncmp(name, "output.", 7))
        return SHOAL_PLAN_LM_HEAD;
    if (strstr(name, "_norm") || strstr(name, "norm."))
        return SHOAL_PLAN_NORM;
    if (strstr(name, "ffn_gate_inp") || strstr(name, "exp_probs_b"))
        return SHOAL_PLAN_ROUTER;
    if (strstr(name, "_shexp"))
        return SHOAL_PLAN_SHEXP;
    if (strstr(name, ".ffn_"))
        return SHOAL_PLAN_DENSE_MLP;
    return SHOAL_PLAN_ATTN;
}

int shoal_plan_gguf(const char *path, const struct shoal_plan_params *p, struct shoal_plan *o,
                    char *types, size_t types_len, struct shoal_err *err)
{
    memset(o, 0, sizeof *o);
    struct shoal_gguf_files *fs = shoal_gguf_files_open(path, err);
    if (!fs)
        return err->code ? err->code : SHOAL_EFORMAT;
    const struct shoal_gguf *g0 = shoal_gguf_files_get(fs, 0);
    const char *arch = NULL;
    size_t alen = 0;
    int rc = 0;
    if (shoal_gguf_get_str(g0, "general.architecture", &arch, &alen, NULL) != 0 || alen == 0 ||
        alen > 40) {
        rc = shoal_err_set(err, SHOAL_EFORMAT, "%s: no general.architecture (expected a "
                           "model GGUF, not a vocabulary)", path);
        goto out;
    }
    char a[48];
    snprintf(a, sizeof a, "%.*s", (int)alen, arch);
    snprintf(o->model_type, sizeof o->model_type, "%s (GGUF)", a);
    const int64_t L = meta_int(g0, a, "block_count", 0);
    const int64_t E = meta_int(g0, a, "embedding_length", 0);
    const int64_t NE = meta_int(g0, a, "expert_count", 0);
    const int64_t K = meta_int(g0, a, "expert_used_count", 0);
    const int64_t H = meta_int(g0, a, "attention.head_count", 0);
    const int64_t Hkv = meta_int(g0, a, "attention.head_count_kv", H);
    const int64_t kv_lora = meta_int(g0, a, "attention.kv_lora_rank", 0);
    const int64_t rope = meta_int(g0, a, "rope.dimension_count", 0);
    const int64_t ctx_len = meta_int(g0, a, "context_length", 4096);
    const int64_t hd = meta_int(g0, a, "attention.key_length", H > 0 ? E / H : 0);
    const int64_t vd = meta_int(g0, a, "attention.value_length", hd);
    const int64_t nshared = meta_int(g0, a, "expert_shared_count", 0);
    if (L < 1 || L > SHOAL_MAX_LAYERS || E < 1 || H < 1 || NE < 1 || K < 1 || K > NE) {
        rc = shoal_err_set(err, SHOAL_EUNSUPPORTED, "%s: architecture '%s' with block_count "
                           "%" PRId64 ", embedding_length %" PRId64 ", expert_count %" PRId64
                           ", expert_used_count %" PRId64 ", head_count %" PRId64 ": expected "
                           "a mixture-of-experts model", path, a, L, E, NE, K, H);
        goto out;
    }
    /* every tensor of every file: experts (the *_exps tensors, expert index
     * slowest) apart from the trunk */
    uint8_t moe[SHOAL_MAX_LAYERS] = {0};
    uint64_t exp_bytes = 0, exp_elems = 0, n_type_bytes[64] = {0};
    uint64_t exp_buf = 0;   /* the store's buffers (container_gguf.c): each slice
                             * page-rounded, plus a page for where it falls */
    uint64_t trunk_type_bytes[64] = {0};
    int have_output = 0, types_run = 1;
    for (uint32_t f = 0; f < shoal_gguf_files_count(fs); f++) {
        const struct shoal_gguf *g = shoal_gguf_files_get(fs, f);
        for (uint64_t i = 0; i < shoal_gguf_n_tensors(g); i++) {
            struct shoal_gguf_tensor t;
            if (shoal_gguf_tensor(g, i, &t) != 0)
                continue;
            /* the types `shoal run FILE.gguf` computes today (model_gguf.c) */
            types_run &= t.type == SHOAL_GGML_TYPE_F32 || t.type == SHOAL_GGML_TYPE_F16 ||
                         t.type == SHOAL_GGML_TYPE_BF16 || shoal_ggml_dot_supported(t.type);
            int il = -1;
            if (sscanf(t.name, "blk.%d.", &il) != 1)
                il = -1;
            if (strstr(t.name, "_exps.")) {
                if (il >= 0 && il < L)
                    moe[il] = 1;
                exp_bytes += t.nbytes;
                exp_buf += (uint64_t)NE * (((t.nbytes / (uint64_t)NE + 4095) & ~(uint64_t)4095) +
                                           4096);
                exp_elems += n_elements(&t);
                n_type_bytes[t.type < 64 ? t.type : 63] += t.nbytes;
                continue;
            }
            enum shoal_plan_part part = part_of(t.name);
            have_output |= part == SHOAL_PLAN_LM_HEAD;
            o->part_bytes[part] += t.nbytes;
            o->params_trunk += n_elements(&t);
            trunk_type_bytes[t.type < 64 ? t.type : 63] += t.nbytes;
            if (part == SHOAL_PLAN_EMBED)
                o->params_embed += n_elements(&t);
            if (part == SHOAL_PLAN_LM_HEAD)
                o->params_lm_head += n_elements(&t);
        }
    }
    for (int64_t il = 0; il < L; il++)
        o->n_moe_layer += moe[il];
    if (o->n_moe_layer == 0) {
        rc = shoal_err_set(err, SHOAL_EUNSUPPORTED, "%s: no routed-expert tensors "
                           "(blk.N.ffn_*_exps): expected a mixture-of-experts model", path);
        goto out;
    }
    if (!have_output)
        o->params_lm_head = o->params_embed;   /* tied */
    /* what `shoal run` takes today: an architecture of gguf_arch.h with
     * these types (docs/MODELS.md "GGUF files") */
    o->runnable = shoal_gguf_arch_find(a) && types_run;
    o->n_layer = L;
    o->n_expert = NE;
    o->n_expert_used = K;
    o->n_shared_expert = nshared;
    o->n_embd = E;
    o->mla = kv_lora > 0;
    o->kv_lora_rank = kv_lora;
    o->qk_rope_head_dim = rope;
    const uint64_t per = (uint64_t)o->n_moe_layer * (uint64_t)NE;
    /* one expert: its slices of the layer's gate, up and down (3 ranges in
     * the file, not one blob); the store reads each in whole pages into a
     * buffer of expert_blob_bytes (what its cache and staging hold, and at
     * most what a read brings) */
    o->expert_weight_bytes = (exp_bytes + per - 1) / per;
    o->expert_blob_bytes = (exp_buf + per - 1) / per;
    o->params_expert_one = exp_elems / per;
    o->experts_bytes = exp_bytes;
    o->params_experts = exp_elems;
    for (int i = 0; i < SHOAL_PLAN_N_PART; i++)
        o->trunk_bytes += o->part_bytes[i];
    o->params_total = o->params_trunk + o->params_experts;
    o->params_active = o->params_trunk + o->params_expert_one * (uint64_t)K * (uint64_t)o->n_moe_layer;
    const uint64_t kv_es = shoal_dtype_size(p->kv_dtype);
    if (o->mla) {
        o->kv_mla_bytes_per_token = (uint64_t)L * (uint64_t)(kv_lora + rope) * kv_es;
        o->kv_bytes_per_token = o->kv_mla_bytes_per_token;
    } else {
        o->kv_bytes_per_token = 2 * (uint64_t)L * (uint64_t)Hkv * (uint64_t)hd * kv_es;
    }
    if (p->ctx > 0 && ctx_len > 0 && p->ctx > ctx_len) {   /* as run refuses it */
        rc = shoal_err_set(err, SHOAL_EINVAL, "--ctx %lld exceeds the model's context_length "
                           "%lld; expected 1..%lld", (long long)p->ctx, (long long)ctx_len,
                           (long long)ctx_len);
        goto out;
    }
    o->ctx = p->ctx > 0 ? p->ctx : ctx_len > 0 && ctx_len < 4096 ? ctx_len : 4096;
    o->kv_budget_bytes = (uint64_t)o->ctx * o->kv_bytes_per_token;
    o->token_expert_bytes = (uint64_t)K * o->expert_blob_bytes * (uint64_t)o->n_moe_layer;
    const int64_t V = E > 0 ? (int64_t)(o->params_embed / (uint64_t)E) : 0;
    const uint64_t embed_row = V > 0 ? o->part_bytes[SHOAL_PLAN_EMBED] / (uint64_t)V : 0;
    o->token_trunk_bytes = o->trunk_bytes - o->part_bytes[SHOAL_PLAN_EMBED] + embed_row;
    const int64_t qk = o->mla ? kv_lora + rope : hd;
    const int64_t vdim = o->mla ? kv_lora : vd;
    o->attn_flops_per_pos = (uint64_t)L * (uint64_t)H * 2u * (uint64_t)(qk + vdim);
    /* "experts Q4_K 90 %, IQ2_XXS 10 %; trunk Q8_0 60 %, F32 40 %" */
    if (types && types_len) {
        size_t n = (size_t)snprintf(types, types_len, "as shipped: experts");
        for (int pass = 0; pass < 2; pass++) {
            const uint64_t *tb = pass ? trunk_type_bytes : n_type_bytes;
            const uint64_t tot = pass ? o->trunk_bytes : exp_bytes;
            if (pass && n < types_len)
                n += (size_t)snprintf(types + n, types_len - n, "; trunk");
            int first = 1;
            for (int t = 0; t < 64 && n < types_len; t++)
                if (tb[t]) {
                {
                    double pct = 100.0 * (double)tb[t] / (double)(tot ? tot : 1);
                    n += (size_t)snprintf(types + n, types_len - n, "%s %s %s%.0f %%",
                                          first ? "" : ",", shoal_ggml_type_name((uint32_t)t),
                                          pct < 0.5 ? "<" : "", pct < 0.5 ? 1.0 : pct);
                }
                    first = 0;
                }
        }
    }
out:
    shoal_gguf_files_close(fs);
    return rc;
}
