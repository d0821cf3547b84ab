/* container: the shoal container's reader (docs/FORMAT.md): open, check,
 * bind to a model, verify; the writer is container_write.c, the shard
 * writer container_shard.c. */
#include "container.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "container_impl.h"
#include "ggml_dot.h"
#include "ggml_types.h"
#include "kv.h"
#include "quant.h"
#include "util.h"

const char shoal_container_magic_dense[8] = {'S', 'H', 'O', 'A', 'L', 'D', 'N', 'S'};
const char shoal_container_magic_experts[8] = {'S', 'H', 'O', 'A', 'L', 'E', 'X', 'P'};

/* Files copied verbatim from the source checkpoint when present. */
const char *const container_side_files[CONTAINER_N_SIDE_FILES] = {
    "config.json", "tokenizer.json", "tokenizer_config.json",
    "generation_config.json", "chat_template.jinja", "special_tokens_map.json",
    "tiktoken.model", /* Kimi-K2's tokenizer (no tokenizer.json) */
    "tokenizer.gguf", /* a converted GGUF's metadata: vocabulary, chat template */
};


/* One line of the canonical text the fingerprint hashes (writer and
 * reader build the same lines). */
void container_fp_line(XXH64_state_t *st, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    XXH64_update(st, buf, (size_t)n);
}

/* ---- reader --------------------------------------------------------------- */

int shoal_container_is(const char *dir)
{
    char *p = shoal_path_join(dir, "shoal.json");
    int r = shoal_exists(p);
    free(p);
    return r;
}

static int parse_hex64(const char *s, uint64_t *out)
{
    if (!s || strlen(s) != 16)
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 16);
    if (*end || errno)
        return -1;
    *out = v;
    return 0;
}

static int check_header(const char *path, const unsigned char *h, size_t file_size,
                        const char magic[8], uint64_t fingerprint, struct shoal_err *err)
{
    if (file_size < SHOAL_CONTAINER_HEADER_BYTES)
        return shoal_err_set(err, SHOAL_EFORMAT, "'%s' is %zu bytes, shorter than its "
                             "%d-byte header (truncated)", path, file_size,
                             SHOAL_CONTAINER_HEADER_BYTES);
    if (memcmp(h, magic, 8))
        return shoal_err_set(err, SHOAL_EFORMAT, "'%s': bad magic; expected '%.8s'",
                             path, magic);
    uint32_t v = get_u32(h + 8);
    if (v != SHOAL_CONTAINER_VERSION)
        return shoal_err_set(err, SHOAL_EUNSUPPORTED,
                             "'%s': format version %u; this shoal reads version %d",
                             path, v, SHOAL_CONTAINER_VERSION);
    uint64_t want = get_u64(h + 16);
    if (want != file_size)
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "'%s' is %zu bytes; its header says %" PRIu64 " (truncated "
                             "or damaged)", path, file_size, want);
    if (get_u64(h + 24) != fingerprint)
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "'%s': fingerprint %016" PRIx64 " does not match the manifest's "
                             "%016" PRIx64 " (files from different conversions?)",
                             path, get_u64(h + 24), fingerprint);
    return 0;
}

void shoal_container_close(struct shoal_container *ct)
{
    if (!ct)
        return;
    if (ct->dense_map)
        munmap(ct->dense_map, ct->dense_size);
    for (size_t i = 0; i < ct->n_dense; i++)
        free(ct->dense[i].name);
    free(ct->dense);
    free(ct->layer_offset);
    free(ct->layer_layout);
    free(ct->expert_xxh64);
    free(ct->held);
    free(ct->held_rank);
    free(ct->shard.weights);
    free(ct->dir);
    free(ct->manifest_path);
    free(ct->dense_path);
    free(ct->experts_path);
    if (ct->gguf) {
        for (uint32_t i = 0; i < ct->gguf->n_file; i++)
            free(ct->gguf->files[i]);
        free(ct->gguf->files);
        free(ct->gguf->range);
        free(ct->gguf->tmpl);
        free(ct->gguf->blob_bytes);
        free(ct->gguf);
    }
    free(ct);
}

struct fp_walk {
    XXH64_state_t *st;
    const struct shoal_container *ct;
    size_t cursor;
};


/* The writer's canonical text (shoal_container_fp_*), rebuilt from the
 * manifest in walk order. */
static int fp_slot(const struct shoal_weight_slot *s, void *user)
{
    struct fp_walk *f = user;
    const struct shoal_container *ct = f->ct;
    if (s->kind == SHOAL_SLOT_EXPERT) {
        if (s->comp == ct->n_comp - 1 && ct->layer_offset[s->il] != UINT64_MAX)
            shoal_container_fp_expert(f->st, s->il, s->ie,
                                      ct->expert_xxh64[s->il * ct->n_expert + s->ie]);
        return 0;
    }
    const struct shoal_container_tensor *t = NULL;
    if (f->cursor < ct->n_dense && !strcmp(ct->dense[f->cursor].name, s->name))
        t = &ct->dense[f->cursor++];
    for (size_t i = 0; !t && i < ct->n_dense; i++)
        if (!strcmp(ct->dense[i].name, s->name))
            t = &ct->dense[i];
    if (t)
        shoal_container_fp_dense(f->st, s, t->w.dtype, t->w.group, t->xxh64);
    if (t && t->w.dtype == SHOAL_DTYPE_GGML)
        shoal_container_fp_ggml(f->st, s->name, t->w.ggml_type);
    return 0;
}

/* An MTP layer's tensor (its routed experts too: convert writes them as
 * dense tensors). */
static int fp_mtp_slot(const struct shoal_weight_slot *s, void *user)
{
    struct shoal_weight_slot d = *s;
    d.kind = SHOAL_SLOT_DENSE;
    return fp_slot(&d, user);
}

static uint64_t recompute_fingerprint(const struct shoal_container *ct,
                                      const struct shoal_model_config *cfg)
{
    struct fp_walk f = {.st = XXH64_createState(), .ct = ct};
    XXH64_reset(f.st, 0);
    shoal_container_fp_head(f.st, cfg->family->model_type, ct->experts_dtype,
                            ct->experts_group, ct->blob_bytes);
    for (int64_t il = 0; ct->layer_layout && il < cfg->n_layer; il++)
        if (ct->layer_layout[il].blob_bytes)
            shoal_container_fp_layout(f.st, il, &ct->layer_layout[il], ct->n_comp);
    struct shoal_model *m = shoal_xcalloc(1, sizeof *m);
    m->cfg = *cfg;
    shoal_model_alloc_layers(m);
    shoal_model_walk(m, fp_slot, &f);
    shoal_model_walk_mtp(m, fp_mtp_slot, &f);   /* hashes only the MTP tensors it lists */
    shoal_model_free(m);
    uint64_t h = XXH64_digest(f.st);
    XXH64_freeState(f.st);
    return h;
}

#define FAIL(...) do { shoal_err_set(err, SHOAL_EFORMAT, __VA_ARGS__); goto fail; } while (0)

/* The manifest's "shard" object (docs/FORMAT.md "Shards"): fills
 * ct->shard, ct->held and ct->held_rank (left NULL when the shard holds
 * every expert, whose layout is then the full container's). */
static int parse_shard(struct shoal_container *ct, json_t *sh,
                       const struct shoal_model_config *cfg, struct shoal_err *err)
{
    const char *mp = ct->manifest_path;
    const int64_t NE = cfg->n_expert;
    json_t *jc = json_object_get(sh, "count"), *ji = json_object_get(sh, "index");
    json_t *jr = json_object_get(sh, "replicas"), *jw = json_object_get(sh, "weights");
    json_t *jd = json_object_get(sh, "dense"), *jh = json_object_get(sh, "held");
    if (!json_is_object(sh) || !json_is_integer(jc) || !json_is_integer(ji) ||
        !json_is_integer(jr) || !json_is_array(jw) || !json_is_boolean(jd) ||
        !json_is_array(jh))
        return shoal_err_set(err, SHOAL_EFORMAT, "'%s': field 'shard' needs index, count, "
                             "replicas, weights, dense and held", mp);
    json_int_t count = json_integer_value(jc), index = json_integer_value(ji);
    json_int_t replicas = json_integer_value(jr);
    if (count < 1 || count > 65536 || index < 0 || index >= count || replicas < 1 ||
        replicas > count || (json_int_t)json_array_size(jw) != count)
        return shoal_err_set(err, SHOAL_EFORMAT, "'%s': shard index %lld, count %lld, "
                             "replicas %lld, %zu weights: expected 0 <= index < count, "
                             "1 <= replicas <= count and count weights", mp,
                             (long long)index, (long long)count, (long long)replicas,
                             json_array_size(jw));
    ct->shard.count = (int)count;
    ct->shard.index = (int)index;
    ct->shard.replicas = (int)replicas;
    ct->shard.has_dense = json_is_true(jd);
    ct->shard.weights = shoal_xcalloc((size_t)count, sizeof *ct->shard.weights);
    for (json_int_t i = 0; i < count; i++) {
        json_t *w = json_array_get(jw, (size_t)i);
        double v = json_number_value(w);
        if (!json_is_number(w) || !(v > 0) || !isfinite(v))
            return shoal_err_set(err, SHOAL_EFORMAT, "'%s': shard weight %lld must be a "
                                 "positive number", mp, (long long)i);
        ct->shard.weights[i] = v;
    }
    const int64_t total = cfg->n_layer * NE;
    ct->held = shoal_xcalloc((size_t)total + 1, 1);
    ct->held_rank = shoal_xmalloc(((size_t)total + 1) * sizeof *ct->held_rank);
    for (int64_t i = 0; i < total; i++)
        ct->held_rank[i] = -1;
    uint8_t *seen_layer = shoal_xcalloc((size_t)cfg->n_layer + 1, 1);
    int rc = 0;
    for (size_t i = 0; i < json_array_size(jh) && !rc; i++) {
        json_t *l = json_array_get(jh, i);
        json_t *jl = json_object_get(l, "layer"), *ids = json_object_get(l, "experts");
        json_int_t il = json_integer_value(jl);
        if (!json_is_integer(jl) || il < 0 || il >= cfg->n_layer ||
            !shoal_layer_is_moe(cfg, il) || seen_layer[il] || !json_is_array(ids) ||
            (int64_t)json_array_size(ids) > NE) {
            rc = shoal_err_set(err, SHOAL_EFORMAT, "'%s': shard.held[%zu] must name a MoE "
                               "layer once, with at most %lld expert ids", mp, i,
                               (long long)NE);
            break;
        }
        seen_layer[il] = 1;
        json_int_t prev = -1;
        for (size_t k = 0; k < json_array_size(ids); k++) {
            json_t *jx = json_array_get(ids, k);
            json_int_t ie = json_integer_value(jx);
            if (!json_is_integer(jx) || ie <= prev || ie >= NE) {
                rc = shoal_err_set(err, SHOAL_EFORMAT, "'%s': shard.held layer %lld: expert "
                                   "ids must ascend strictly within [0, %lld); #%zu is %s",
                                   mp, (long long)il, (long long)NE, k,
                                   json_is_integer(jx) ? "out of order or range"
                                                       : "not an integer");
                break;
            }
            prev = ie;
            ct->held[il * NE + ie] = 1;
            ct->held_rank[il * NE + ie] = (int32_t)k;
            ct->n_held++;
        }
    }
    free(seen_layer);
    if (rc)
        return rc;
    if (ct->n_held == ct->n_moe_expert) {   /* holds everything: the full layout */
        free(ct->held);
        free(ct->held_rank);
        ct->held = NULL;
        ct->held_rank = NULL;
    }
    return 0;
}

/* Blobs experts.bin holds for MoE layer il. */
static int64_t layer_held(const struct shoal_container *ct, int64_t il)
{
    if (!ct->held)
        return ct->n_expert;
    int64_t n = 0;
    for (int64_t ie = 0; ie < ct->n_expert; ie++)
        n += ct->held[il * ct->n_expert + ie];
    return n;
}

/* The shape of the manifest's expert table, checked before any table of
 * n_layer x n_expert entries is allocated: experts.layers names each MoE
 * layer with n_expert checksums, so those tables never outgrow the
 * manifest (a 3 KiB manifest claiming 512 x 65536 experts held 268 MB;
 * found by tests/fuzz/fuzz_container). Returns 0 or SHOAL_EFORMAT. */
static int check_layer_table(json_t *layers, const struct shoal_model_config *cfg,
                             const char *mp, struct shoal_err *err)
{
    int64_t n_moe = 0;
    for (int64_t il = 0; il < cfg->n_layer; il++)
        n_moe += shoal_layer_is_moe(cfg, il);
    if (!json_is_array(layers))
        return 0;   /* named with the other missing fields of 'experts' */
    if ((int64_t)json_array_size(layers) != n_moe)
        return shoal_err_set(err, SHOAL_EFORMAT, "'%s': experts.layers lists %zu layers; "
                             "the config has %lld MoE layers", mp, json_array_size(layers),
                             (long long)n_moe);
    for (size_t i = 0; i < json_array_size(layers); i++) {
        json_t *l = json_array_get(layers, i);
        json_int_t il = json_integer_value(json_object_get(l, "layer"));
        json_t *sums = json_object_get(l, "xxh64");
        if (il < 0 || il >= cfg->n_layer || !shoal_layer_is_moe(cfg, il) ||
            !json_is_array(sums) || (int64_t)json_array_size(sums) != cfg->n_expert)
            return shoal_err_set(err, SHOAL_EFORMAT, "'%s': experts.layers[%zu] must name a "
                                 "MoE layer with %lld checksums", mp, i,
                                 (long long)cfg->n_expert);
    }
    return 0;
}

/* A manifest dtype: shoal_dtype_parse's names, or "GGML" with the entry's
 * "ggml_type" naming a type shoal computes with (ggml_dot.h). Returns 0,
 * or -1 when dt is unknown, -2 when GGML has no such ggml_type. */
static int parse_dtype(const char *dt, json_t *entry, enum shoal_dtype *t, uint32_t *ggml_type)
{
    *ggml_type = 0;
    if (!dt)
        return -1;
    if (strcmp(dt, "GGML"))
        return shoal_dtype_parse(dt, t) ? -1 : 0;
    const char *gt = json_string_value(json_object_get(entry, "ggml_type"));
    const int id = gt ? shoal_ggml_type_from_name(gt) : -1;
    if (id < 0 || !shoal_ggml_dot_supported((uint32_t)id))
        return -2;
    *t = SHOAL_DTYPE_GGML;
    *ggml_type = (uint32_t)id;
    return 0;
}

/* The expert blob components in comps (n_comp of them) into k[] for a
 * blob of blob bytes: the experts dtype `edt` and group for the weights
 * (uniform layout), or each entry's own dtype (per_layer: a GGML
 * container's layer, `where` names it); biases always their own. Each
 * shape is the config's, its bytes what its dtype implies, inside the
 * blob. Returns 0 or SHOAL_EFORMAT naming the manifest and component. */
static int parse_components(const struct shoal_container *ct, json_t *comps, int per_layer,
                            uint64_t blob, const struct shoal_model_config *cfg,
                            struct shoal_expert_component *k, const char *where,
                            struct shoal_err *err)
{
    const char *mp = ct->manifest_path;
    const int64_t E = cfg->n_embd, F = cfg->n_ff_exp;
    /* weights, then gpt_oss's 1-D biases (rows 1), each with its own dtype */
    const int64_t shapes[6][2] = {{F, E}, {F, E}, {E, F}, {1, F}, {1, F}, {1, E}};
    if (!json_is_array(comps) || (int)json_array_size(comps) != ct->n_comp)
        return shoal_err_set(err, SHOAL_EFORMAT, "'%s': %s needs %d components (%s); found "
                             "%zu", mp, where, ct->n_comp, cfg->family->model_type,
                             json_array_size(comps));
    for (int c = 0; c < ct->n_comp; c++, k++) {
        json_t *jc = json_array_get(comps, (size_t)c);
        k->dtype = ct->experts_dtype;
        k->group = ct->experts_group;
        k->ggml_type = 0;
        if (c >= 3 || per_layer) {
            const char *bd = json_string_value(json_object_get(jc, "dtype"));
            const int prc = parse_dtype(bd, jc, &k->dtype, &k->ggml_type);
            const int ok = c >= 3 ? !prc && (k->dtype == SHOAL_DTYPE_F32 ||
                                             k->dtype == SHOAL_DTYPE_BF16 ||
                                             k->dtype == SHOAL_DTYPE_F16)
                                  : !prc && (k->dtype == SHOAL_DTYPE_GGML ||
                                             k->dtype == SHOAL_DTYPE_F32 ||
                                             k->dtype == SHOAL_DTYPE_BF16 ||
                                             k->dtype == SHOAL_DTYPE_F16);
            if (!ok)
                return shoal_err_set(err, SHOAL_EFORMAT, "'%s': %s component %d needs a dtype "
                                     "%s, found '%s'%s", mp, where, c,
                                     c >= 3 ? "F32, F16 or BF16"
                                            : "GGML (with a ggml_type shoal runs), F32, F16 "
                                              "or BF16",
                                     bd ? bd : "(none)",
                                     prc == -2 ? " with an unknown or unrunnable ggml_type"
                                               : "");
            k->group = 0;
        }
        k->rows = shapes[c][0];
        k->cols = shapes[c][1];
        k->offset = (uint64_t)json_integer_value(json_object_get(jc, "offset"));
        k->bytes = (uint64_t)json_integer_value(json_object_get(jc, "bytes"));
        const struct shoal_ggml_type_info *ti = k->dtype == SHOAL_DTYPE_GGML
                                                    ? shoal_ggml_type_info(k->ggml_type) : NULL;
        struct shoal_weight w = {.dtype = k->dtype, .rows = k->rows, .cols = k->cols,
                                 .group = k->group, .ggml_type = k->ggml_type};
        if ((shoal_dtype_is_quant(k->dtype) && !shoal_quant_group_ok(k->group)) ||
            (k->dtype == SHOAL_DTYPE_MXFP4 && k->cols % SHOAL_MXFP4_BLOCK) ||
            (ti && k->cols % ti->block_size) ||
            k->bytes != shoal_weight_bytes(&w) || k->offset > blob ||
            k->bytes > blob - k->offset || k->offset % 4)
            return shoal_err_set(err, SHOAL_EFORMAT, "'%s': %s component %d does not fit the "
                                 "%" PRIu64 "-byte blob with shape [%lld, %lld] %s%s%s", mp,
                                 where, c, blob, (long long)k->rows, (long long)k->cols,
                                 shoal_dtype_name(k->dtype), ti ? " " : "",
                                 ti ? ti->name : "");
    }
    return 0;
}

/* A GGML container's per-layer layouts (experts.layers[i].blob_bytes and
 * .components, docs/FORMAT.md "GGML tensors") into ct->layer_layout; the
 * experts' blob_bytes must be the largest. */
static int parse_layer_layouts(struct shoal_container *ct, json_t *layers,
                               const struct shoal_model_config *cfg, struct shoal_err *err)
{
    const char *mp = ct->manifest_path;
    ct->layer_layout = shoal_xcalloc((size_t)cfg->n_layer + 1, sizeof *ct->layer_layout);
    uint64_t largest = 0;
    for (size_t i = 0; i < json_array_size(layers); i++) {
        json_t *l = json_array_get(layers, i);
        const json_int_t il = json_integer_value(json_object_get(l, "layer"));  /* checked */
        json_t *jb = json_object_get(l, "blob_bytes");
        const json_int_t b = json_integer_value(jb);
        char where[64];
        snprintf(where, sizeof where, "experts.layers[%zu] (layer %lld)", i, (long long)il);
        if (!json_is_integer(jb) || b <= 0 || b % SHOAL_CONTAINER_ALIGN)
            return shoal_err_set(err, SHOAL_EFORMAT, "'%s': %s needs blob_bytes, a positive "
                                 "multiple of %d (experts dtype GGML)", mp, where,
                                 SHOAL_CONTAINER_ALIGN);
        struct shoal_expert_layout *L = &ct->layer_layout[il];
        L->blob_bytes = (uint64_t)b;
        largest = L->blob_bytes > largest ? L->blob_bytes : largest;
        if (parse_components(ct, json_object_get(l, "components"), 1, L->blob_bytes, cfg,
                             L->comp, where, err))
            return SHOAL_EFORMAT;
    }
    if (largest != ct->blob_bytes)
        return shoal_err_set(err, SHOAL_EFORMAT, "'%s': experts.blob_bytes is %" PRIu64 "; "
                             "expected %" PRIu64 ", the largest layer's", mp, ct->blob_bytes,
                             largest);
    return 0;
}

struct shoal_container *shoal_container_open(const char *dir,
                                             struct shoal_model_config *cfg,
                                             struct shoal_err *err)
{
    struct shoal_container *ct = shoal_xcalloc(1, sizeof *ct);
    ct->dir = shoal_xstrdup(dir);
    ct->manifest_path = shoal_path_join(dir, "shoal.json");
    const char *mp = ct->manifest_path;
    json_error_t jerr;
    json_t *root = json_load_file(mp, 0, &jerr);
    int fd = -1;
    if (!root) {
        shoal_err_set(err, SHOAL_EFORMAT, "'%s': malformed JSON at line %d: %s", mp,
                      jerr.line, jerr.text);
        goto fail;
    }
    json_t *jv = json_object_get(root, "version");
    if (!json_is_integer(json_object_get(root, "version")) ||
        strcmp(json_string_value(json_object_get(root, "format")) ?
               json_string_value(json_object_get(root, "format")) : "", "shoal-container"))
        FAIL("'%s': not a shoal container manifest (format/version missing)", mp);
    ct->version = (int)json_integer_value(jv);
    if (ct->version != SHOAL_CONTAINER_VERSION) {
        shoal_err_set(err, SHOAL_EUNSUPPORTED, "'%s': container version %d; this shoal "
                      "reads version %d", mp, ct->version, SHOAL_CONTAINER_VERSION);
        goto fail;
    }
    if (parse_hex64(json_string_value(json_object_get(root, "fingerprint")), &ct->fingerprint))
        FAIL("'%s': field 'fingerprint' must be 16 hex digits", mp);
    /* the KV cache's default dtype; absent (containers before it): f32 */
    json_t *kv = json_object_get(root, "kv");
    ct->kv_dtype = SHOAL_DTYPE_F32;
    if (kv && shoal_kv_dtype_parse(json_string_value(kv), &ct->kv_dtype))
        FAIL("'%s': field 'kv' is '%s'; expected \"f32\", \"f16\" or \"bf16\" (the KV "
             "cache dtype; override with --kv)", mp,
             json_is_string(kv) ? json_string_value(kv) : "not a string");
    json_t *config = json_object_get(root, "config");
    if (!json_is_object(config))
        FAIL("'%s': field 'config' missing or not an object", mp);
    char *cfg_text = json_dumps(config, JSON_COMPACT);
    int crc = shoal_model_config_parse(cfg_text, strlen(cfg_text), mp, cfg, err);
    free(cfg_text);
    if (crc)
        goto fail;
    if (check_layer_table(json_object_get(json_object_get(root, "experts"), "layers"), cfg,
                          mp, err))
        goto fail;
    ct->n_layer = cfg->n_layer;
    ct->n_expert = cfg->n_expert;
    for (int64_t il = 0; il < cfg->n_layer; il++)
        ct->n_moe_expert += shoal_layer_is_moe(cfg, il) ? cfg->n_expert : 0;
    ct->n_held = ct->n_moe_expert;
    json_t *shard = json_object_get(root, "shard");
    if (shard) {
        ct->n_held = 0;
        if (parse_shard(ct, shard, cfg, err))
            goto fail;
    }
    const int dense_file = !ct->shard.count || ct->shard.has_dense;

    /* dense section (a shard may lack dense.bin: its tensors are listed,
     * for the fingerprint, but not mapped) */
    json_t *dense = json_object_get(root, "dense");
    json_t *tensors = json_object_get(dense, "tensors");
    const char *dfile = json_string_value(json_object_get(dense, "file"));
    if (!json_is_array(tensors) || !dfile || strchr(dfile, '/'))
        FAIL("'%s': field 'dense' needs 'file' and 'tensors'", mp);
    ct->dense_path = shoal_path_join(dir, dfile);
    struct stat sb;
    if (!dense_file) {
        /* offsets are still checked, against the size the full model's
         * dense.bin has */
        json_t *db = json_object_get(dense, "bytes");
        if (!json_is_integer(db) || json_integer_value(db) < SHOAL_CONTAINER_HEADER_BYTES)
            FAIL("'%s': field 'dense.bytes' must be an integer of at least %d", mp,
                 SHOAL_CONTAINER_HEADER_BYTES);
        ct->dense_size = (size_t)json_integer_value(db);
    } else {
        fd = open(ct->dense_path, O_RDONLY);
        if (fd < 0) {
            int e = errno;
            shoal_err_set(err, -e, "cannot open '%s': %s", ct->dense_path, strerror(e));
            goto fail;
        }
        fstat(fd, &sb);
        ct->dense_size = (size_t)sb.st_size;
        if (ct->dense_size < SHOAL_CONTAINER_HEADER_BYTES)
            FAIL("'%s' is %zu bytes, shorter than its %d-byte header (truncated)",
                 ct->dense_path, ct->dense_size, SHOAL_CONTAINER_HEADER_BYTES);
        ct->dense_map = mmap(NULL, ct->dense_size, PROT_READ, MAP_PRIVATE, fd, 0);
        close(fd);
        fd = -1;
        if (ct->dense_map == MAP_FAILED) {
            ct->dense_map = NULL;
            int e = errno;
            shoal_err_set(err, -e, "cannot mmap '%s': %s", ct->dense_path, strerror(e));
            goto fail;
        }
        if (check_header(ct->dense_path, ct->dense_map, ct->dense_size, MAGIC_DENSE,
                         ct->fingerprint, err))
            goto fail;
    }
    ct->n_dense = json_array_size(tensors);
    ct->dense = shoal_xcalloc(ct->n_dense ? ct->n_dense : 1, sizeof *ct->dense);
    for (size_t i = 0; i < ct->n_dense; i++) {
        json_t *t = json_array_get(tensors, i);
        const char *name = json_string_value(json_object_get(t, "name"));
        const char *dt = json_string_value(json_object_get(t, "dtype"));
        json_t *shape = json_object_get(t, "shape");
        json_t *off = json_object_get(t, "offset"), *bytes = json_object_get(t, "bytes");
        struct shoal_container_tensor *ctt = &ct->dense[i];
        if (!name || !dt || !json_is_array(shape) || json_array_size(shape) < 1 ||
            json_array_size(shape) > 2 || !json_is_integer(off) || !json_is_integer(bytes))
            FAIL("'%s': dense tensor #%zu needs name, dtype, shape, offset, bytes", mp, i);
        ctt->name = shoal_xstrdup(name);
        const int prc = parse_dtype(dt, t, &ctt->w.dtype, &ctt->w.ggml_type);
        if (prc)
            FAIL("'%s': tensor '%s' has %s '%s'%s", mp, name,
                 prc == -2 ? "dtype GGML with ggml_type" : "unknown dtype",
                 prc == -2 ? (json_string_value(json_object_get(t, "ggml_type"))
                                  ? json_string_value(json_object_get(t, "ggml_type"))
                                  : "(none)")
                           : dt,
                 prc == -2 ? "; expected a type shoal runs" : "");
        ctt->n_dims = (int)json_array_size(shape);
        json_int_t d0 = json_integer_value(json_array_get(shape, 0));
        json_int_t d1 = ctt->n_dims == 2 ? json_integer_value(json_array_get(shape, 1)) : 0;
        if (d0 < 1 || (ctt->n_dims == 2 && d1 < 1) || d0 > ((json_int_t)1 << 40) ||
            d1 > ((json_int_t)1 << 40))
            FAIL("'%s': tensor '%s' has an invalid shape", mp, name);
        ctt->w.rows = ctt->n_dims == 2 ? d0 : 1;
        ctt->w.cols = ctt->n_dims == 2 ? d1 : d0;
        ctt->w.group = (int)json_integer_value(json_object_get(t, "group"));
        if (shoal_dtype_is_quant(ctt->w.dtype) && (!shoal_quant_group_ok(ctt->w.group) ||
                                                   ctt->n_dims != 2))
            FAIL("'%s': quantized tensor '%s' (%s) needs a 2-D shape and group 32, 64 or 128; "
                 "found %d-D, group %d", mp, name, dt, ctt->n_dims, ctt->w.group);
        if (ctt->w.dtype == SHOAL_DTYPE_FP8 &&
            (ctt->w.group != SHOAL_FP8_BLOCK || ctt->n_dims != 2))
            FAIL("'%s': FP8 tensor '%s' needs a 2-D shape and group (block) %d; found %d-D, "
                 "group %d", mp, name, SHOAL_FP8_BLOCK, ctt->n_dims, ctt->w.group);
        if (ctt->w.dtype == SHOAL_DTYPE_MXFP4 &&
            (ctt->w.group != SHOAL_MXFP4_BLOCK || ctt->n_dims != 2 ||
             ctt->w.cols % SHOAL_MXFP4_BLOCK))
            FAIL("'%s': MXFP4 tensor '%s' needs a 2-D shape, columns a multiple of %d and "
                 "group %d; found %d-D, %lld columns, group %d", mp, name, SHOAL_MXFP4_BLOCK,
                 SHOAL_MXFP4_BLOCK, ctt->n_dims, (long long)ctt->w.cols, ctt->w.group);
        if (ctt->w.dtype == SHOAL_DTYPE_GGML &&
            (ctt->n_dims != 2 ||
             ctt->w.cols % shoal_ggml_type_info(ctt->w.ggml_type)->block_size))
            FAIL("'%s': GGML tensor '%s' (%s) needs a 2-D shape with columns a multiple of "
                 "%u; found %d-D, %lld columns", mp, name,
                 shoal_ggml_type_name(ctt->w.ggml_type),
                 shoal_ggml_type_info(ctt->w.ggml_type)->block_size, ctt->n_dims,
                 (long long)ctt->w.cols);
        ctt->offset = (uint64_t)json_integer_value(off);
        ctt->bytes = (uint64_t)json_integer_value(bytes);
        if (ctt->bytes != shoal_weight_bytes(&ctt->w))
            FAIL("'%s': tensor '%s' (%s) has %" PRIu64 " bytes; its shape needs %zu", mp,
                 name, dt, ctt->bytes, shoal_weight_bytes(&ctt->w));
        if (ctt->offset % 4)
            FAIL("'%s': tensor '%s' has offset %" PRIu64 " in '%s'; expected a multiple "
                 "of 4", mp, name, ctt->offset, ct->dense_path);
        if (ctt->offset < SHOAL_CONTAINER_HEADER_BYTES || ctt->offset > ct->dense_size ||
            ctt->bytes > ct->dense_size - ctt->offset)
            FAIL("'%s': tensor '%s' lies outside '%s' (%zu bytes): offset %" PRIu64
                 ", %" PRIu64 " bytes (truncated?)", mp, name, ct->dense_path,
                 ct->dense_size, ctt->offset, ctt->bytes);
        if (parse_hex64(json_string_value(json_object_get(t, "xxh64")), &ctt->xxh64))
            FAIL("'%s': tensor '%s' needs a 16-hex-digit xxh64", mp, name);
        ctt->w.data = ct->dense_map ? (const char *)ct->dense_map + ctt->offset : NULL;
        if (ctt->w.dtype == SHOAL_DTYPE_FP8 && ctt->w.data)
            ctt->w.scale = (const float *)(const void *)((const char *)ctt->w.data +
                                                         shoal_fp8_scale_offset(ctt->w.rows,
                                                                                ctt->w.cols));
        if (ctt->w.dtype == SHOAL_DTYPE_MXFP4 && ctt->w.data)
            ctt->w.e8m0 = (const uint8_t *)ctt->w.data +
                          (size_t)ctt->w.rows * (size_t)(ctt->w.cols / 2);
    }

    /* expert section */
    json_t *ex = json_object_get(root, "experts");
    const char *efile = json_string_value(json_object_get(ex, "file"));
    const char *edt = json_string_value(json_object_get(ex, "dtype"));
    json_t *layers = json_object_get(ex, "layers"), *comps = json_object_get(ex, "components");
    if (!efile || strchr(efile, '/') || !edt || !json_is_array(layers) || !json_is_array(comps))
        FAIL("'%s': field 'experts' needs file, dtype, components, layers", mp);
    /* GGML: each layer's components carry their own dtypes (a GGUF's) */
    if (!strcmp(edt, "GGML"))
        ct->experts_dtype = SHOAL_DTYPE_GGML;
    else if (shoal_dtype_parse(edt, &ct->experts_dtype))
        FAIL("'%s': experts dtype '%s' is unknown", mp, edt);
    ct->experts_group = (int)json_integer_value(json_object_get(ex, "group"));
    ct->blob_bytes = (uint64_t)json_integer_value(json_object_get(ex, "blob_bytes"));
    ct->experts_path = shoal_path_join(dir, efile);
    fd = open(ct->experts_path, O_RDONLY);
    if (fd < 0) {
        int e = errno;
        shoal_err_set(err, -e, "cannot open '%s': %s", ct->experts_path, strerror(e));
        goto fail;
    }
    fstat(fd, &sb);
    ct->experts_size = (uint64_t)sb.st_size;
    unsigned char hdr[SHOAL_CONTAINER_HEADER_BYTES];
    ssize_t got = pread(fd, hdr, sizeof hdr, 0);
    close(fd);
    fd = -1;
    if (got != (ssize_t)sizeof hdr)
        FAIL("'%s' is %" PRIu64 " bytes, shorter than its %d-byte header (truncated)",
             ct->experts_path, ct->experts_size, SHOAL_CONTAINER_HEADER_BYTES);
    if (check_header(ct->experts_path, hdr, (size_t)ct->experts_size, MAGIC_EXPERTS,
                     ct->fingerprint, err))
        goto fail;
    ct->n_comp = shoal_expert_n_comp(cfg);
    ct->swiglu_limit = (float)cfg->swiglu_limit;
    if (json_array_size(layers) > 0) {   /* checked: one entry per MoE layer */
        const int per_layer = ct->experts_dtype == SHOAL_DTYPE_GGML;
        if (ct->blob_bytes == 0 || ct->blob_bytes % SHOAL_CONTAINER_ALIGN ||
            (int)json_array_size(comps) != (per_layer ? 0 : ct->n_comp))
            FAIL("'%s': experts.blob_bytes must be a positive multiple of %d with %d "
                 "components (%s%s)", mp, SHOAL_CONTAINER_ALIGN, per_layer ? 0 : ct->n_comp,
                 cfg->family->model_type, per_layer ? "; GGML: each layer lists its own" : "");
        if (shoal_dtype_is_quant(ct->experts_dtype) && !shoal_quant_group_ok(ct->experts_group))
            FAIL("'%s': experts have dtype %s and group %d; expected group 32, 64 or 128",
                 mp, edt, ct->experts_group);
        if (ct->experts_dtype == SHOAL_DTYPE_FP8 && ct->experts_group != SHOAL_FP8_BLOCK)
            FAIL("'%s': experts have dtype FP8 and group %d; expected block %d", mp,
                 ct->experts_group, SHOAL_FP8_BLOCK);
        if (ct->experts_dtype == SHOAL_DTYPE_MXFP4 && ct->experts_group != SHOAL_MXFP4_BLOCK)
            FAIL("'%s': experts have dtype MXFP4 and group %d; expected %d", mp,
                 ct->experts_group, SHOAL_MXFP4_BLOCK);
        if (per_layer ? parse_layer_layouts(ct, layers, cfg, err)
                      : parse_components(ct, comps, 0, ct->blob_bytes, cfg, ct->comp,
                                         "experts", err))
            goto fail;
    }
    ct->layer_offset = shoal_xcalloc((size_t)cfg->n_layer, sizeof *ct->layer_offset);
    ct->expert_xxh64 = shoal_xcalloc((size_t)(cfg->n_layer * cfg->n_expert) + 1,
                                     sizeof *ct->expert_xxh64);
    for (int64_t il = 0; il < cfg->n_layer; il++)
        ct->layer_offset[il] = UINT64_MAX;
    for (size_t i = 0; i < json_array_size(layers); i++) {
        json_t *l = json_array_get(layers, i);
        json_int_t il = json_integer_value(json_object_get(l, "layer"));
        json_int_t off = json_integer_value(json_object_get(l, "offset"));
        json_t *sums = json_object_get(l, "xxh64");   /* shapes: check_layer_table */
        if (ct->layer_offset[il] != UINT64_MAX)
            FAIL("'%s': experts.layers lists layer %lld twice", mp, (long long)il);
        /* a shard's layer holds only its held blobs, in ascending expert order */
        uint64_t end = (uint64_t)off + shoal_container_blob_bytes(ct, il) *
                                       (uint64_t)layer_held(ct, il);
        if (off < SHOAL_CONTAINER_HEADER_BYTES || off % SHOAL_CONTAINER_ALIGN ||
            end > ct->experts_size || end < (uint64_t)off)
            FAIL("'%s': layer %lld's experts lie outside '%s' (%" PRIu64 " bytes, need "
                 "%" PRIu64 "; truncated?)", mp, (long long)il, ct->experts_path,
                 ct->experts_size, end);
        ct->layer_offset[il] = (uint64_t)off;
        for (int64_t ie = 0; ie < cfg->n_expert; ie++)
            if (parse_hex64(json_string_value(json_array_get(sums, (size_t)ie)),
                            &ct->expert_xxh64[il * cfg->n_expert + ie]))
                FAIL("'%s': layer %lld expert %lld needs a 16-hex-digit xxh64", mp,
                     (long long)il, (long long)ie);
    }
    const char *mt = json_string_value(json_object_get(root, "model_type"));
    if (!mt || strcmp(mt, cfg->family->model_type))
        FAIL("'%s': model_type '%s' does not match the config's '%s'", mp, mt ? mt : "?",
             cfg->family->model_type);
    for (size_t i = 0; i < ct->n_dense; i++)
        for (size_t j = i + 1; j < ct->n_dense; j++)
            if (!strcmp(ct->dense[i].name, ct->dense[j].name))
                FAIL("'%s': tensor '%s' is listed twice", mp, ct->dense[i].name);
    uint64_t fp = recompute_fingerprint(ct, cfg);
    if (fp != ct->fingerprint)
        FAIL("'%s': the manifest's contents hash to fingerprint %016" PRIx64 ", but it "
             "records %016" PRIx64 " (edited or damaged manifest)", mp, fp, ct->fingerprint);
    json_decref(root);
    return ct;
fail:
    if (fd >= 0)
        close(fd);
    json_decref(root);
    shoal_container_close(ct);
    return NULL;
}

struct bind_ct {
    struct shoal_container *ct;
    size_t cursor;
    struct shoal_err *err;
    int mtp;          /* binding the MTP layers: their routed experts are dense tensors,
                         checked when they first run rather than here */
    uint8_t *bound;   /* [n_dense] set for each tensor bound (NULL: the MTP walk,
                         whose tensors are paged in only when drafting runs) */
};

static int bind_slot(const struct shoal_weight_slot *s, void *user)
{
    struct bind_ct *b = user;
    if (s->kind == SHOAL_SLOT_EXPERT && !b->mtp) {
        memset(s->w, 0, sizeof *s->w);
        return 0;
    }
    struct shoal_container *ct = b->ct;
    struct shoal_container_tensor *t = NULL;
    /* tensors are written in walk order: try the cursor first */
    if (b->cursor < ct->n_dense && !strcmp(ct->dense[b->cursor].name, s->name))
        t = &ct->dense[b->cursor++];
    for (size_t i = 0; !t && i < ct->n_dense; i++)
        if (!strcmp(ct->dense[i].name, s->name))
            t = &ct->dense[i];
    if (!t) {
        if (!s->required)
            return 0;
        return shoal_err_set(b->err, SHOAL_ENOTFOUND, "'%s': missing tensor '%s'",
                             ct->manifest_path, s->name);
    }
    int want_dims = s->cols ? 2 : 1;
    int64_t rows = s->cols ? s->rows : 1, cols = s->cols ? s->cols : s->rows;
    if (t->n_dims != want_dims || t->w.rows != rows || t->w.cols != cols)
        return shoal_err_set(b->err, SHOAL_ESHAPE,
                             "'%s': tensor '%s' has shape [%lld, %lld]; the config needs "
                             "[%lld, %lld]", ct->manifest_path, s->name,
                             (long long)t->w.rows, (long long)t->w.cols, (long long)rows,
                             (long long)cols);
    if (want_dims == 1 && (shoal_dtype_is_quant(t->w.dtype) || native_only(t->w.dtype) ||
                           t->w.dtype == SHOAL_DTYPE_GGML))
        return shoal_err_set(b->err, SHOAL_EFORMAT, "'%s': 1-D tensor '%s' cannot be %s",
                             ct->manifest_path, s->name, shoal_dtype_name(t->w.dtype));
    *s->w = t->w;
    if (s->kind == SHOAL_SLOT_EXPERT)   /* an MTP expert: experts_local.c checks it */
        return 0;
    /* FP8: scales and codes checked once here (dense tensors stay resident;
     * experts are checked by the store as they are read); MXFP4 exponents
     * and int8 / int4 group scales likewise */
    if (t->w.dtype == SHOAL_DTYPE_FP8) {
        struct shoal_err e = {0};
        if (shoal_fp8_check(&t->w, 1, s->name, &e))
            return shoal_err_set(b->err, e.code, "'%s': %s", ct->dense_path, e.msg);
    }
    if (t->w.dtype == SHOAL_DTYPE_MXFP4) {
        struct shoal_err e = {0};
        if (shoal_mxfp4_check(&t->w, s->name, &e))
            return shoal_err_set(b->err, e.code, "'%s': %s", ct->dense_path, e.msg);
    }
    if (t->w.dtype == SHOAL_DTYPE_GGML) {   /* every block scale, as a GGUF's trunk */
        struct shoal_err e = {0};
        const uint64_t n_blk = (uint64_t)t->w.rows * (uint64_t)t->w.cols /
                               shoal_ggml_type_info(t->w.ggml_type)->block_size;
        if (shoal_ggml_check_scales(t->w.ggml_type, t->w.data, n_blk, s->name, 0, &e))
            return shoal_err_set(b->err, e.code, "'%s': %s", ct->dense_path, e.msg);
    }
    /* int8 / int4: every group scale finite (once here, as FP8's) */
    if (shoal_dtype_is_quant(t->w.dtype)) {
        struct shoal_err e = {0};
        if (shoal_weight_check_scales(&t->w, s->name, &e))
            return shoal_err_set(b->err, e.code, "'%s': %s", ct->dense_path, e.msg);
    }
    if (b->bound)   /* its bytes are checked once the walk is done (verify_bound) */
        b->bound[t - ct->dense] = 1;
    return 0;
}

/* The bound dense tensors' bytes against the manifest's xxh64, as the
 * expert store checks each expert it reads: a changed dense.bin would
 * otherwise change the output and say nothing. XXH64 runs at about 10
 * GB/s a thread over bytes the forward pass reads every token anyway (a
 * 1.9 GB V3-width trunk in the page cache: 0.2 s more at load; from a cold
 * disk the load now reads dense.bin whole first, at the disk's rate, as
 * the first token would); tensors are shared among the threads. The first
 * mismatching tensor in file order is named. */
static int verify_bound(const struct shoal_container *ct, const uint8_t *bound,
                        struct shoal_err *err)
{
    int64_t bad = -1;
    uint64_t bad_h = 0;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < (int64_t)ct->n_dense; i++) {
        if (!bound[i])
            continue;
        const uint64_t h = XXH64(ct->dense[i].w.data, ct->dense[i].bytes, 0);
        if (h == ct->dense[i].xxh64)
            continue;
#pragma omp critical(shoal_container_verify_bound)
        if (bad < 0 || i < bad) {
            bad = i;
            bad_h = h;
        }
    }
    if (bad < 0)
        return 0;
    const struct shoal_container_tensor *t = &ct->dense[bad];
    return shoal_err_set(err, SHOAL_EFORMAT,
                         "checksum mismatch: '%s' tensor '%s' at offset %" PRIu64
                         ": xxh64 %016" PRIx64 ", manifest %016" PRIx64
                         " (the file changed after it was written)",
                         ct->dense_path, t->name, t->offset, bad_h, t->xxh64);
}

int shoal_container_bind(struct shoal_container *ct, struct shoal_model *m,
                         struct shoal_err *err)
{
    if (!ct->dense_map)
        return shoal_err_set(err, SHOAL_EUNSUPPORTED,
                             "'%s' is a shard without dense tensors (made by shoal shard "
                             "without --with-dense); run the coordinator on the full "
                             "container", ct->dir);
    struct bind_ct b = {.ct = ct, .err = err,
                        .bound = shoal_xcalloc(ct->n_dense + 1, sizeof *b.bound)};
    int rc = shoal_model_walk(m, bind_slot, &b);
    if (!rc)
        rc = verify_bound(ct, b.bound, err);
    free(b.bound);
    if (!rc && m->cfg.tie_embeddings)
        m->lm_head = m->tok_embd;
    if (!rc && m->cfg.n_nextn > 0) {
        /* the MTP layers, when convert wrote them (dense tensors, their routed
         * experts too: memory-mapped, paged in when drafting first runs them) */
        struct shoal_err e = {0};
        struct bind_ct bm = {.ct = ct, .err = &e, .mtp = 1};
        if (shoal_model_walk_mtp(m, bind_slot, &bm))
            snprintf(m->mtp_why, sizeof m->mtp_why, "the container holds no usable MTP "
                     "layer (%s; convert writes it from a Hugging Face directory that has "
                     "one)", e.msg);
        else
            m->n_mtp = m->cfg.n_nextn;
    }
    return rc;
}

void shoal_container_expert_views(const struct shoal_container *ct, int64_t il,
                                  const void *blob, struct shoal_expert_weights *e)
{
    const struct shoal_expert_component *comp = ct->layer_layout ? ct->layer_layout[il].comp
                                                                 : ct->comp;
    memset(e, 0, sizeof *e);   /* no biases, plain SwiGLU, unless gpt_oss */
    struct shoal_weight *w[6] = {&e->w_gate, &e->w_up, &e->w_down, &e->b_gate, &e->b_up,
                                 &e->b_down};
    e->swiglu_limit = ct->swiglu_limit;
    const int n_comp = ct->n_comp ? ct->n_comp : 3;   /* 0: a container made by hand */
    for (int c = 0; c < n_comp; c++) {
        const struct shoal_expert_component *k = &comp[c];
        *w[c] = (struct shoal_weight){.dtype = k->dtype, .rows = k->rows, .cols = k->cols,
                                      .group = k->group, .ggml_type = k->ggml_type,
                                      .data = (const char *)blob + k->offset};
        if (k->dtype == SHOAL_DTYPE_FP8)   /* the scales follow the codes */
            w[c]->scale = (const float *)(const void *)((const char *)blob + k->offset +
                                                        shoal_fp8_scale_offset(k->rows,
                                                                               k->cols));
        if (k->dtype == SHOAL_DTYPE_MXFP4)   /* the exponents follow the pairs */
            w[c]->e8m0 = (const uint8_t *)blob + k->offset +
                         (size_t)k->rows * (size_t)(k->cols / 2);
    }
}

int shoal_container_verify(const struct shoal_container *ct,
                           void (*progress)(uint64_t, uint64_t, void *), void *user,
                           struct shoal_err *err)
{
    for (size_t i = 0; i < ct->n_dense && ct->dense_map; i++) {
        const struct shoal_container_tensor *t = &ct->dense[i];
        uint64_t h = XXH64(t->w.data, t->bytes, 0);
        if (h != t->xxh64)
            return shoal_err_set(err, SHOAL_EFORMAT,
                                 "checksum mismatch: '%s' tensor '%s' at offset %" PRIu64
                                 ": xxh64 %016" PRIx64 ", manifest %016" PRIx64,
                                 ct->dense_path, t->name, t->offset, h, t->xxh64);
    }
    int fd = open(ct->experts_path, O_RDONLY);
    if (fd < 0) {
        int e = errno;
        return shoal_err_set(err, -e, "cannot open '%s': %s", ct->experts_path, strerror(e));
    }
    unsigned char *buf = shoal_xmalloc(ct->blob_bytes ? ct->blob_bytes : 1);
    uint64_t total = 0, done = 0;
    for (int64_t il = 0; il < ct->n_layer; il++)
        total += ct->layer_offset[il] == UINT64_MAX ? 0 : shoal_container_blob_bytes(ct, il) *
                                                          (uint64_t)layer_held(ct, il);
    int rc = 0;
    for (int64_t il = 0; il < ct->n_layer && !rc; il++) {
        if (ct->layer_offset[il] == UINT64_MAX)
            continue;
        const uint64_t blob = shoal_container_blob_bytes(ct, il);
        for (int64_t ie = 0; ie < ct->n_expert && !rc; ie++) {
            if (!shoal_container_holds(ct, il, ie))
                continue;
            uint64_t off = shoal_container_expert_offset(ct, il, ie);
            ssize_t got = pread(fd, buf, blob, (off_t)off);
            if (got != (ssize_t)blob) {
                rc = shoal_err_set(err, SHOAL_EIO, "short read of '%s' layer %lld expert "
                                   "%lld at offset %" PRIu64, ct->experts_path,
                                   (long long)il, (long long)ie, off);
                break;
            }
            uint64_t h = XXH64(buf, blob, 0);
            uint64_t want = ct->expert_xxh64[il * ct->n_expert + ie];
            if (h != want)
                rc = shoal_err_set(err, SHOAL_EFORMAT,
                                   "checksum mismatch: '%s' layer %lld expert %lld at offset "
                                   "%" PRIu64 ": xxh64 %016" PRIx64 ", manifest %016" PRIx64,
                                   ct->experts_path, (long long)il, (long long)ie, off, h,
                                   want);
            if (!rc)
                rc = shoal_container_ggml_check(ct, il, ie, buf, err);
            done += blob;
            if (progress)
                progress(done, total, user);
        }
    }
    free(buf);
    close(fd);
    return rc;
}


int shoal_container_ggml_check(const struct shoal_container *ct, int64_t il, int64_t ie,
                               const void *blob, struct shoal_err *err)
{
    if (!ct->layer_layout)
        return 0;
    static const char *const cn[3] = {"w_gate", "w_up", "w_down"};
    for (int c = 0; c < 3; c++) {
        const struct shoal_expert_component *k = &ct->layer_layout[il].comp[c];
        if (k->dtype != SHOAL_DTYPE_GGML)
            continue;
        struct shoal_err fe = {0};
        const uint64_t n_blk = (uint64_t)k->rows * (uint64_t)k->cols /
                               shoal_ggml_type_info(k->ggml_type)->block_size;
        if (shoal_ggml_check_scales(k->ggml_type, (const uint8_t *)blob + k->offset, n_blk,
                                    cn[c], 0, &fe))
            return shoal_err_set(err, SHOAL_EFORMAT, "'%s' layer %lld expert %lld: %s",
                                 ct->experts_path, (long long)il, (long long)ie, fe.msg);
    }
    return 0;
}
