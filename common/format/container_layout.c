/* container_layout: the dtypes, byte sizes, layout and records every
 * container writer shares (container_write.h). */
#include "container_write.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "container_impl.h"
#include "quant.h"

/* ---- dtypes and bytes ------------------------------------------------------ */

enum shoal_dtype shoal_container_slot_dtype(const struct shoal_weight_slot *s,
                                            enum shoal_dtype experts, enum shoal_dtype dense)
{
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
                             .cols = s->cols ? s->cols : s->rows, .group = group};
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

uint64_t shoal_container_layout_slot(struct shoal_container_layout *l,
                                     const struct shoal_weight_slot *s, enum shoal_dtype t,
                                     int group, uint64_t bytes)
{
    if (s->kind == SHOAL_SLOT_DENSE) {
        const uint64_t off = align_up(l->dense_end, DENSE_ALIGN);
        l->dense_end = off + bytes;
        return off;
    }
    if (l->blob_bytes == 0) {   /* the first expert lays out the blob */
        l->comp_off[s->comp] = s->comp ? align_up(l->comp_off[s->comp - 1] +
                                                  l->comp_bytes[s->comp - 1], DENSE_ALIGN) : 0;
        l->comp_bytes[s->comp] = bytes;
        l->comp_dtype[s->comp] = t;
        l->comp_group[s->comp] = shoal_container_recorded_group(t, group);
        if (s->comp == l->n_comp - 1)
            l->blob_bytes = align_up(l->comp_off[s->comp] + bytes, SHOAL_CONTAINER_ALIGN);
    }
    if (s->comp == l->n_comp - 1)
        l->n_blobs++;
    return l->comp_off[s->comp];
}

uint64_t shoal_container_layout_dense_bytes(const struct shoal_container_layout *l)
{
    return align_up(l->dense_end, SHOAL_CONTAINER_ALIGN);
}

uint64_t shoal_container_layout_bytes(const struct shoal_container_layout *l)
{
    return shoal_container_layout_dense_bytes(l) + SHOAL_CONTAINER_HEADER_BYTES +
           (uint64_t)l->n_blobs * l->blob_bytes;
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
    return o;
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
    for (int c = 0; c < l->n_comp && l->blob_bytes; c++) {
        json_t *jc = json_pack("{s:s, s:I, s:I}", "name", cn[c],
                               "offset", (json_int_t)l->comp_off[c],
                               "bytes", (json_int_t)l->comp_bytes[c]);
        if (c >= 3)   /* the biases' own dtype (the weights': experts.dtype) */
            json_object_set_new(jc, "dtype", json_string(shoal_dtype_name(l->comp_dtype[c])));
        json_array_append_new(comps, jc);
    }
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
