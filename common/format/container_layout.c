/* container_layout: the dtypes, byte sizes, layout and records every
 * container writer shares (container_write.h). */
#include "container_write.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "container_impl.h"
#include "ggml_types.h"
#include "quant.h"
#include "util.h"

/* ---- dtypes and bytes ------------------------------------------------------ */

enum shoal_dtype shoal_container_slot_dtype(const struct shoal_weight_slot *s,
                                            enum shoal_dtype experts, enum shoal_dtype dense)
{
    /* GGML: as the source has it (a GGUF's ggml type, or its F32/F16/BF16) */
    if ((s->kind == SHOAL_SLOT_DENSE ? dense : experts) == SHOAL_DTYPE_GGML)
        return s->w->dtype;
    enum shoal_dtype t = shoal_target_dtype(s->kind, s->cols, s->router, experts, dense);
    if ((t == SHOAL_DTYPE_FP8 || t == SHOAL_DTYPE_MXFP4) && s->kind == SHOAL_SLOT_DENSE &&
        s->w->dtype != t)
        t = s->w->dtype == SHOAL_DTYPE_BF16 ? SHOAL_DTYPE_BF16 : SHOAL_DTYPE_F32;
    return t;
}

int shoal_container_dtype_group(enum shoal_dtype t, int group)
{
    return t == SHOAL_DTYPE_FP8 ? SHOAL_FP8_BLOCK
           : t == SHOAL_DTYPE_MXFP4 ? SHOAL_MXFP4_BLOCK : group;
}

int shoal_container_recorded_group(enum shoal_dtype t, int group)
{
    return shoal_dtype_is_quant(t) || t == SHOAL_DTYPE_FP8 || t == SHOAL_DTYPE_MXFP4 ? group
                                                                                      : 0;
}

uint64_t shoal_container_slot_bytes(const struct shoal_weight_slot *s, enum shoal_dtype t,
                                    int group)
{
    struct shoal_weight w = {.dtype = t, .rows = s->cols ? s->rows : 1,
                             .cols = s->cols ? s->cols : s->rows, .group = group,
                             .ggml_type = t == SHOAL_DTYPE_GGML ? s->w->ggml_type : 0};
    return (uint64_t)shoal_weight_bytes(&w);
}

/* ---- layout ---------------------------------------------------------------- */

void shoal_container_layout_init(struct shoal_container_layout *l,
                                 const struct shoal_model_config *c)
{
    memset(l, 0, sizeof *l);
    l->dense_end = SHOAL_CONTAINER_HEADER_BYTES;
    l->n_comp = shoal_expert_n_comp(c);
}

void shoal_container_layout_per_layer(struct shoal_container_layout *l, int64_t n_layer)
{
    l->layer = shoal_xcalloc((size_t)n_layer + 1, sizeof *l->layer);
    l->n_layer = n_layer;
}

void shoal_container_layout_free(struct shoal_container_layout *l)
{
    free(l->layer);
    l->layer = NULL;
}

uint64_t shoal_container_layout_blob(const struct shoal_container_layout *l, int64_t il)
{
    return l->layer ? l->layer[il].blob_bytes : l->blob_bytes;
}

/* A layer's own blob: its first expert lays it out. */
static uint64_t layout_layer_slot(struct shoal_container_layout *l,
                                  const struct shoal_weight_slot *s, enum shoal_dtype t,
                                  int group, uint64_t bytes)
{
    struct shoal_expert_layout *L = &l->layer[s->il];
    struct shoal_expert_component *k = &L->comp[s->comp];
    if (s->ie == 0) {
        k->offset = s->comp ? align_up(L->comp[s->comp - 1].offset +
                                       L->comp[s->comp - 1].bytes, DENSE_ALIGN) : 0;
        k->bytes = bytes;
        k->dtype = t;
        k->group = shoal_container_recorded_group(t, group);
        k->ggml_type = t == SHOAL_DTYPE_GGML ? s->w->ggml_type : 0;
        k->rows = s->cols ? s->rows : 1;
        k->cols = s->cols ? s->cols : s->rows;
        if (s->comp == l->n_comp - 1) {
            L->blob_bytes = align_up(k->offset + bytes, SHOAL_CONTAINER_ALIGN);
            if (L->blob_bytes > l->blob_bytes)
                l->blob_bytes = L->blob_bytes;
        }
    }
    if (s->comp == l->n_comp - 1) {
        l->n_blobs++;
        l->blobs_bytes += L->blob_bytes;
    }
    return k->offset;
}

uint64_t shoal_container_layout_slot(struct shoal_container_layout *l,
                                     const struct shoal_weight_slot *s, enum shoal_dtype t,
                                     int group, uint64_t bytes)
{
    if (s->kind == SHOAL_SLOT_DENSE) {
        const uint64_t off = align_up(l->dense_end, DENSE_ALIGN);
        l->dense_end = off + bytes;
        return off;
    }
    if (l->layer)
        return layout_layer_slot(l, s, t, group, bytes);
    if (l->blob_bytes == 0) {   /* the first expert lays out the blob */
        l->comp_off[s->comp] = s->comp ? align_up(l->comp_off[s->comp - 1] +
                                                  l->comp_bytes[s->comp - 1], DENSE_ALIGN) : 0;
        l->comp_bytes[s->comp] = bytes;
        l->comp_dtype[s->comp] = t;
        l->comp_group[s->comp] = shoal_container_recorded_group(t, group);
        if (s->comp == l->n_comp - 1)
            l->blob_bytes = align_up(l->comp_off[s->comp] + bytes, SHOAL_CONTAINER_ALIGN);
    }
    if (s->comp == l->n_comp - 1) {
        l->n_blobs++;
        l->blobs_bytes += l->blob_bytes;
    }
    return l->comp_off[s->comp];
}

uint64_t shoal_container_layout_dense_bytes(const struct shoal_container_layout *l)
{
    return align_up(l->dense_end, SHOAL_CONTAINER_ALIGN);
}

uint64_t shoal_container_layout_bytes(const struct shoal_container_layout *l)
{
    return shoal_container_layout_dense_bytes(l) + SHOAL_CONTAINER_HEADER_BYTES +
           l->blobs_bytes;
}

/* ---- records --------------------------------------------------------------- */

void shoal_container_fp_head(XXH64_state_t *st, const char *model_type,
                             enum shoal_dtype experts, int group, uint64_t blob_bytes)
{
    container_fp_line(st, "shoal-container %d %s experts %s %d %" PRIu64 "\n",
                      SHOAL_CONTAINER_VERSION, model_type, shoal_dtype_name(experts), group,
                      blob_bytes);
}

void shoal_container_fp_dense(XXH64_state_t *st, const struct shoal_weight_slot *s,
                              enum shoal_dtype t, int group, uint64_t xxh)
{
    container_fp_line(st, "dense %s %s %lld %lld %d %016" PRIx64 "\n", s->name,
                      shoal_dtype_name(t), (long long)s->rows, (long long)s->cols,
                      shoal_container_recorded_group(t, group), xxh);
}

void shoal_container_fp_expert(XXH64_state_t *st, int64_t il, int64_t ie, uint64_t xxh)
{
    container_fp_line(st, "expert %lld %lld %016" PRIx64 "\n", (long long)il, (long long)ie,
                      xxh);
}

void shoal_container_fp_ggml(XXH64_state_t *st, const char *name, uint32_t ggml_type)
{
    container_fp_line(st, "ggml %s %s\n", name, shoal_ggml_type_name(ggml_type));
}

void shoal_container_fp_layout(XXH64_state_t *st, int64_t il,
                               const struct shoal_expert_layout *L, int n_comp)
{
    container_fp_line(st, "layer %lld blob %" PRIu64 "\n", (long long)il, L->blob_bytes);
    for (int c = 0; c < n_comp; c++) {
        const struct shoal_expert_component *k = &L->comp[c];
        container_fp_line(st, "component %d %s %s %d %" PRIu64 " %" PRIu64 "\n", c,
                          shoal_dtype_name(k->dtype),
                          k->dtype == SHOAL_DTYPE_GGML ? shoal_ggml_type_name(k->ggml_type)
                                                       : "-",
                          k->group, k->offset, k->bytes);
    }
}

void shoal_container_hex(uint64_t xxh, char hex[17])
{
    snprintf(hex, 17, "%016" PRIx64, xxh);
}

json_t *shoal_container_dense_entry(const struct shoal_weight_slot *s, enum shoal_dtype t,
                                    int group, uint64_t off, uint64_t bytes, uint64_t xxh)
{
    char hex[17];
    shoal_container_hex(xxh, hex);
    json_t *shape = s->cols ? json_pack("[II]", (json_int_t)s->rows, (json_int_t)s->cols)
                            : json_pack("[I]", (json_int_t)s->rows);
    json_t *o = json_pack("{s:s, s:s, s:o, s:I, s:I, s:s}", "name", s->name,
                          "dtype", shoal_dtype_name(t), "shape", shape,
                          "offset", (json_int_t)off, "bytes", (json_int_t)bytes, "xxh64", hex);
    if (o && shoal_container_recorded_group(t, group))
        json_object_set_new(o, "group", json_integer(group));
    if (o && t == SHOAL_DTYPE_GGML)
        json_object_set_new(o, "ggml_type", json_string(shoal_ggml_type_name(s->w->ggml_type)));
    return o;
}

/* A component's manifest entry: name, offset, bytes, and with_dtype its
 * dtype (and ggml_type). */
static json_t *component_entry(const char *name, const struct shoal_expert_component *k,
                               int with_dtype)
{
    json_t *jc = json_pack("{s:s, s:I, s:I}", "name", name, "offset", (json_int_t)k->offset,
                           "bytes", (json_int_t)k->bytes);
    if (jc && with_dtype) {
        json_object_set_new(jc, "dtype", json_string(shoal_dtype_name(k->dtype)));
        if (k->dtype == SHOAL_DTYPE_GGML)
            json_object_set_new(jc, "ggml_type",
                                json_string(shoal_ggml_type_name(k->ggml_type)));
        if (k->group)
            json_object_set_new(jc, "group", json_integer(k->group));
    }
    return jc;
}

/* A per-layer layout's "blob_bytes" and "components" in each layer entry. */
static void add_layer_layouts(const struct shoal_container_layout *l, json_t *layers)
{
    static const char *cn[6] = {"w_gate", "w_up", "w_down", "b_gate", "b_up", "b_down"};
    for (size_t i = 0; i < json_array_size(layers); i++) {
        json_t *e = json_array_get(layers, i);
        const json_int_t il = json_integer_value(json_object_get(e, "layer"));
        if (il < 0 || il >= l->n_layer)
            continue;
        const struct shoal_expert_layout *L = &l->layer[il];
        json_t *comps = json_array();
        for (int c = 0; c < l->n_comp; c++)
            json_array_append_new(comps, component_entry(cn[c], &L->comp[c], 1));
        json_object_set_new(e, "blob_bytes", json_integer((json_int_t)L->blob_bytes));
        json_object_set_new(e, "components", comps);
    }
}

json_t *shoal_container_layer_entry(int64_t il, uint64_t offset, json_t *sums)
{
    return json_pack("{s:I, s:I, s:o}", "layer", (json_int_t)il, "offset",
                     (json_int_t)offset, "xxh64", sums);
}

json_t *shoal_container_manifest(const struct shoal_container_layout *l,
                                 const struct shoal_container_manifest_params *p)
{
    static const char *cn[6] = {"w_gate", "w_up", "w_down", "b_gate", "b_up", "b_down"};
    json_t *comps = json_array();
    for (int c = 0; c < l->n_comp && l->blob_bytes && !l->layer; c++) {
        const struct shoal_expert_component k = {.dtype = l->comp_dtype[c],
                                                 .offset = l->comp_off[c],
                                                 .bytes = l->comp_bytes[c]};
        /* the biases' own dtype (the weights': experts.dtype) */
        json_array_append_new(comps, component_entry(cn[c], &k, c >= 3));
    }
    if (l->layer)
        add_layer_layouts(l, p->layers);
    char fph[17];
    shoal_container_hex(p->fingerprint, fph);
    json_t *m = json_object();
    json_object_set_new(m, "format", json_string("shoal-container"));
    json_object_set_new(m, "version", json_integer(SHOAL_CONTAINER_VERSION));
    json_object_set_new(m, "model_type", json_string(p->model_type));
    json_object_set_new(m, "fingerprint", json_string(fph));
    if (p->kv)
        json_object_set_new(m, "kv", json_string(p->kv));
    json_object_set(m, "config", p->config);
    json_object_set_new(m, "files", p->files);
    json_object_set_new(m, "dense", json_pack("{s:s, s:I, s:o}", "file", "dense.bin",
                                              "bytes", (json_int_t)p->dense_bytes,
                                              "tensors", p->tensors));
    json_t *e = json_pack("{s:s, s:I, s:s, s:i, s:I, s:I, s:I, s:o, s:o}",
                          "file", "experts.bin", "bytes", (json_int_t)p->experts_bytes,
                          "dtype", shoal_dtype_name(p->experts_dtype),
                          "group", p->experts_group, "blob_bytes", (json_int_t)l->blob_bytes,
                          "n_layer", (json_int_t)p->cfg->n_layer,
                          "n_expert", (json_int_t)p->cfg->n_expert,
                          "components", comps, "layers", p->layers);
    if (!json_object_get(m, "config") || !json_object_get(m, "files") ||
        !json_object_get(m, "dense") || !e) {
        json_decref(e);
        json_decref(m);
        return NULL;
    }
    json_object_set_new(m, "experts", e);
    return m;
}
