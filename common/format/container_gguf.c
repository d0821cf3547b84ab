/* container_gguf: a GGUF model's routed experts as a container the expert
 * store streams (container.h, struct shoal_container_gguf): each expert is
 * one byte range per component in its layer's stacked tensors, read in
 * whole pages around it, so that the store's cache, pins, prefetch,
 * O_DIRECT reads and --stats work on a GGUF file as on experts.bin, and
 * the views it hands out are the bytes the memory-mapped model would have
 * used (DESIGN contract 1). */
#include "container.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "ggml_types.h"
#include "util.h"

#define ALIGN ((uint64_t)SHOAL_CONTAINER_ALIGN)
#define N_COMP 6

static uint64_t align_down(uint64_t x)
{
    return x & ~(ALIGN - 1);
}

static uint64_t align_up(uint64_t x)
{
    return (x + ALIGN - 1) & ~(ALIGN - 1);
}

/* The components of an expert, in struct shoal_expert_weights order. */
static struct shoal_weight *comp_of(struct shoal_expert_weights *e, int c)
{
    struct shoal_weight *w[N_COMP] = {&e->w_gate, &e->w_up, &e->w_down,
                                      &e->b_gate, &e->b_up, &e->b_down};
    return w[c];
}

static const char *const comp_gguf[N_COMP] = {"ffn_gate_exps.weight", "ffn_up_exps.weight",
                                              "ffn_down_exps.weight", "ffn_gate_exps.bias",
                                              "ffn_up_exps.bias", "ffn_down_exps.bias"};

int shoal_container_expert_reads(const struct shoal_container *ct, int64_t il, int64_t ie,
                                 struct shoal_expert_read *out)
{
    if (!ct->gguf) {
        const uint64_t blob = shoal_container_blob_bytes(ct, il);
        out[0] = (struct shoal_expert_read){.file = 0, .len = blob, .need = blob, .comp = -1,
                                            .off = shoal_container_expert_offset(ct, il, ie)};
        return 1;
    }
    int n = 0;
    for (int c = 0; c < N_COMP; c++) {
        const struct shoal_expert_range *r = &ct->gguf->range[il * N_COMP + c];
        if (!r->bytes)
            continue;
        const uint64_t off = r->base + (uint64_t)ie * r->bytes;
        out[n++] = (struct shoal_expert_read){.file = r->file, .off = align_down(off),
                                              .len = align_up(off + r->bytes) - align_down(off),
                                              .need = off + r->bytes - align_down(off),
                                              .buf_off = r->buf_off, .comp = c};
    }
    return n;
}

void shoal_container_expert_views_at(const struct shoal_container *ct, int64_t il, int64_t ie,
                                     const void *blob, struct shoal_expert_weights *e)
{
    if (!ct->gguf) {
        shoal_container_expert_views(ct, il, blob, e);
        return;
    }
    *e = ct->gguf->tmpl[il];
    for (int c = 0; c < N_COMP; c++) {
        const struct shoal_expert_range *r = &ct->gguf->range[il * N_COMP + c];
        if (r->bytes)
            comp_of(e, c)->data = (const uint8_t *)blob + r->buf_off +
                                  (r->base + (uint64_t)ie * r->bytes) % ALIGN;
    }
}

int shoal_container_gguf_check(const struct shoal_container *ct, int64_t il, int64_t ie,
                               const struct shoal_expert_read *rd, const void *blob,
                               struct shoal_err *err)
{
    if (!ct->gguf || rd->comp < 0)
        return 0;
    struct shoal_expert_weights e = ct->gguf->tmpl[il];
    const struct shoal_weight *w = comp_of(&e, rd->comp);
    if (w->dtype != SHOAL_DTYPE_GGML)
        return 0;
    const struct shoal_expert_range *r = &ct->gguf->range[il * N_COMP + rd->comp];
    const uint8_t *p = (const uint8_t *)blob + rd->buf_off + (r->base + (uint64_t)ie * r->bytes) % ALIGN;
    const uint64_t n_blk = (uint64_t)w->rows * (uint64_t)w->cols /
                           shoal_ggml_type_info(w->ggml_type)->block_size;
    char name[96];
    snprintf(name, sizeof name, "blk.%lld.%s", (long long)il, comp_gguf[rd->comp]);
    struct shoal_err fe = {0};
    if (shoal_ggml_check_scales(w->ggml_type, p, n_blk, name, (uint64_t)ie * n_blk, &fe))
        return shoal_err_set(err, SHOAL_EFORMAT, "%s (in expert %lld)", fe.msg, (long long)ie);
    return 0;
}

/* Three pages of a stacked expert tensor (its first, middle and last; p
 * in the model's mapping, n bytes) into the fingerprint: two files of one
 * layout whose experts differ (another quantization or a re-upload under
 * the same name) get different fingerprints, without reading the file
 * through at every start. */
static void hash_samples(XXH64_state_t *h, const uint8_t *p, uint64_t n)
{
    const uint64_t page = n < ALIGN ? n : ALIGN;
    const uint64_t at[3] = {0, (n - page) / 2, n - page};
    for (int i = 0; i < 3; i++)
        XXH64_update(h, p + at[i], (size_t)page);
}

/* Layer il's component c from m's expert views: its file, expert 0's
 * offset and the stride, checked to be the same for every expert. */
static int locate_comp(const struct shoal_model *m, int64_t il, int c,
                       struct shoal_expert_range *r, struct shoal_err *err)
{
    const struct shoal_layer_weights *L = &m->layers[il];
    struct shoal_expert_weights e0 = L->experts[0];
    const struct shoal_weight *w0 = comp_of(&e0, c);
    if (!w0->data)
        return 0;
    r->bytes = shoal_weight_bytes(w0);
    if (shoal_model_gguf_locate(m, w0->data, &r->file, &r->base))
        return shoal_err_set(err, SHOAL_EINVAL, "'%s': layer %lld's experts are not in the "
                             "file's mapping", m->dir, (long long)il);
    for (int64_t ie = 1; ie < m->cfg.n_expert; ie++) {
        struct shoal_expert_weights e = L->experts[ie];
        const uint8_t *want = (const uint8_t *)w0->data + (size_t)ie * r->bytes;
        if (comp_of(&e, c)->data != want)
            return shoal_err_set(err, SHOAL_EFORMAT, "'%s': blk.%lld.%s: expert %lld is not "
                                 "at expert 0 + %lld x %" PRIu64 " bytes", m->dir,
                                 (long long)il, comp_gguf[c], (long long)ie, (long long)ie,
                                 r->bytes);
    }
    return 0;
}

struct shoal_container *shoal_container_from_gguf(const struct shoal_model *m,
                                                  struct shoal_err *err)
{
    const struct shoal_model_config *cfg = &m->cfg;
    const uint32_t n_file = shoal_model_gguf_n_files(m);
    if (!n_file || cfg->n_expert < 1) {
        shoal_err_set(err, SHOAL_EINVAL, "'%s' is not a GGUF model with routed experts",
                      m->dir);
        return NULL;
    }
    struct shoal_container *ct = shoal_xcalloc(1, sizeof *ct);
    struct shoal_container_gguf *g = shoal_xcalloc(1, sizeof *g);
    ct->gguf = g;
    ct->dir = shoal_xstrdup(m->dir);
    ct->experts_path = shoal_xstrdup(shoal_model_gguf_path(m, 0));
    ct->version = SHOAL_CONTAINER_VERSION;
    ct->kv_dtype = SHOAL_DTYPE_F32;
    ct->experts_dtype = SHOAL_DTYPE_GGML;
    ct->n_comp = shoal_expert_n_comp(cfg);   /* its ranges: struct shoal_container_gguf */
    ct->n_layer = cfg->n_layer;
    ct->n_expert = cfg->n_expert;
    g->n_file = n_file;
    g->files = shoal_xcalloc(n_file, sizeof *g->files);
    for (uint32_t i = 0; i < n_file; i++)
        g->files[i] = shoal_xstrdup(shoal_model_gguf_path(m, i));
    g->range = shoal_xcalloc((size_t)(cfg->n_layer * N_COMP), sizeof *g->range);
    g->tmpl = shoal_xcalloc((size_t)cfg->n_layer, sizeof *g->tmpl);
    g->blob_bytes = shoal_xcalloc((size_t)cfg->n_layer, sizeof *g->blob_bytes);
    ct->layer_offset = shoal_xcalloc((size_t)cfg->n_layer, sizeof *ct->layer_offset);
    XXH64_state_t *h = XXH64_createState();
    XXH64_reset(h, 0x99f);
    for (int64_t il = 0; il < cfg->n_layer; il++) {
        ct->layer_offset[il] = UINT64_MAX;
        if (!shoal_layer_is_moe(cfg, il) || !m->layers[il].experts)
            continue;
        ct->layer_offset[il] = 0;
        ct->n_moe_expert += cfg->n_expert;
        g->tmpl[il] = m->layers[il].experts[0];
        uint64_t at = 0;
        for (int c = 0; c < N_COMP; c++) {
            struct shoal_expert_range *r = &g->range[il * N_COMP + c];
            if (locate_comp(m, il, c, r, err)) {
                XXH64_freeState(h);
                shoal_container_close(ct);
                return NULL;
            }
            comp_of(&g->tmpl[il], c)->data = NULL;
            if (!r->bytes)
                continue;
            r->buf_off = at;
            at += align_up(r->bytes) + ALIGN;   /* the range's pages, however it falls */
            const struct shoal_weight *w = comp_of(&g->tmpl[il], c);
            const uint64_t rec[8] = {(uint64_t)il, (uint64_t)c, r->file, r->base, r->bytes,
                                     (uint64_t)w->dtype, w->ggml_type, (uint64_t)w->rows};
            XXH64_update(h, rec, sizeof rec);
            struct shoal_expert_weights e0 = m->layers[il].experts[0];
            hash_samples(h, comp_of(&e0, c)->data, r->bytes * (uint64_t)cfg->n_expert);
        }
        const float lim = g->tmpl[il].swiglu_limit;
        XXH64_update(h, &lim, sizeof lim);
        g->blob_bytes[il] = at;
        if (at > ct->blob_bytes)
            ct->blob_bytes = at;
    }
    ct->n_held = ct->n_moe_expert;
    ct->fingerprint = XXH64_digest(h);
    XXH64_freeState(h);
    return ct;
}
