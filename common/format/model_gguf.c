/* model_gguf: a GGUF file (or split set) of a llama.cpp architecture shoal
 * runs, as a struct shoal_model: the architecture's metadata becomes the
 * same struct shoal_model_config a Hugging Face config.json gives (through
 * the same parser, so the same checks), and every weight is a view into a
 * read-only mapping of the file at the type it ships in (docs/MODELS.md
 * "GGUF files").
 *
 * Today: architecture qwen3moe (llama.cpp's name for Qwen3-MoE; its
 * converter, convert_hf_to_gguf.py Qwen3MoeModel < Qwen2MoeModel, writes
 * q_proj / k_proj unpermuted: llama.cpp rotates qwen3moe in the NEOX
 * layout, transformers' rotate_half, as shoal does), tensors of type F32,
 * F16, BF16 (shoal's own dtypes, the same row-major [n_out][n_in] bytes) and
 * matrices of the types ggml_dot.h has dot products for (SHOAL_DTYPE_GGML;
 * shoal_ggml_dot_supported: Q8_0, the K-quants, IQ types, MXFP4, ...).
 *
 * GGUF dims are innermost first: a [n_out][n_in] weight is ne = {n_in,
 * n_out}; a layer's experts ffn_{gate,up,down}_exps are ne = {n_in, n_out,
 * n_expert}, expert e being bytes [e * nbytes / n_expert, (e + 1) * ...). */
#include "model.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ggml_dot.h"
#include "ggml_types.h"
#include "gguf.h"
#include "util.h"

/* One tensor of the set, where its bytes are mapped. */
struct gtensor {
    struct shoal_gguf_tensor d;   /* descriptor (d.name borrowed from its file) */
    const uint8_t *data;          /* d.nbytes bytes in the mapping */
    const char *file;             /* its file's path, borrowed */
    int used;                     /* bound to a weight */
};

struct shoal_model_gguf {
    struct shoal_gguf_files *files;  /* owned */
    uint32_t n_files;
    void **maps;                     /* [n_files] read-only mappings, owned */
    size_t *map_len;                 /* [n_files] bytes */
    struct gtensor *t;               /* [n_t], sorted by name */
    size_t n_t;
};

/* An architecture shoal runs: its llama.cpp name, shoal's family, and the
 * metadata keys (after "ARCH.") it reads; any other key under "ARCH." is
 * refused, since it could change the computation. */
struct arch {
    const char *name;         /* general.architecture */
    const char *model_type;   /* shoal_family model_type */
};

static const struct arch archs[] = {
    {"qwen3moe", "qwen3_moe"},
};

static const char *const qwen3moe_keys[] = {
    "block_count", "context_length", "embedding_length", "feed_forward_length",
    "expert_feed_forward_length", "expert_count", "expert_used_count",
    "attention.head_count", "attention.head_count_kv", "attention.key_length",
    "attention.value_length", "attention.layer_norm_rms_epsilon", "rope.freq_base",
    "rope.dimension_count", "vocab_size", "expert_weights_norm",
};

int shoal_model_is_gguf(const char *path)
{
    struct stat st;
    if (!path || stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        return 0;
    const size_t n = strlen(path);
    if (n >= 5 && !strcmp(path + n - 5, ".gguf"))
        return 1;
    char magic[4];
    FILE *f = fopen(path, "rb");
    const int yes = f && fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4);
    if (f)
        fclose(f);
    return yes;
}

const struct shoal_gguf *shoal_model_gguf_meta(const struct shoal_model *m)
{
    return m && m->gguf ? shoal_gguf_files_get(m->gguf->files, 0) : NULL;
}

void shoal_model_gguf_free(struct shoal_model_gguf *g)
{
    if (!g)
        return;
    for (uint32_t i = 0; i < g->n_files; i++)
        if (g->maps && g->maps[i])
            munmap(g->maps[i], g->map_len[i]);
    free(g->maps);
    free(g->map_len);
    free(g->t);
    shoal_gguf_files_close(g->files);
    free(g);
}

static int cmp_gtensor(const void *a, const void *b)
{
    return strcmp(((const struct gtensor *)a)->d.name, ((const struct gtensor *)b)->d.name);
}

static struct gtensor *find_tensor(struct shoal_model_gguf *g, const char *name)
{
    struct gtensor key = {.d = {.name = name}};
    return bsearch(&key, g->t, g->n_t, sizeof *g->t, cmp_gtensor);
}

/* Map every file of the set read-only and index its tensors. */
static int map_files(struct shoal_model_gguf *g, struct shoal_err *err)
{
    g->n_files = shoal_gguf_files_count(g->files);
    g->maps = shoal_xcalloc(g->n_files, sizeof *g->maps);
    g->map_len = shoal_xcalloc(g->n_files, sizeof *g->map_len);
    for (uint32_t i = 0; i < g->n_files; i++) {
        const struct shoal_gguf *f = shoal_gguf_files_get(g->files, i);
        const char *path = shoal_gguf_files_path(g->files, i);
        g->n_t += shoal_gguf_n_tensors(f);
        const int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            return shoal_err_set(err, -errno, "open '%s': %s", path, strerror(errno));
        struct stat st;
        const uint64_t size = shoal_gguf_file_size(f);
        if (fstat(fd, &st) != 0) {
            const int e = errno;
            close(fd);
            return shoal_err_set(err, -e, "fstat '%s': %s", path, strerror(e));
        }
        if ((uint64_t)st.st_size != size) {
            close(fd);
            return shoal_err_set(err, SHOAL_EFORMAT, "'%s' changed while it was read: %lld "
                                 "bytes, expected %llu", path, (long long)st.st_size,
                                 (unsigned long long)size);
        }
        void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
        const int e = errno;
        close(fd);
        if (p == MAP_FAILED)
            return shoal_err_set(err, -e, "mmap '%s' (%llu bytes): %s", path,
                                 (unsigned long long)size, strerror(e));
        g->maps[i] = p;
        g->map_len[i] = (size_t)size;
    }
    g->t = shoal_xcalloc(g->n_t ? g->n_t : 1, sizeof *g->t);
    size_t k = 0;
    for (uint32_t i = 0; i < g->n_files; i++) {
        const struct shoal_gguf *f = shoal_gguf_files_get(g->files, i);
        for (uint64_t j = 0; j < shoal_gguf_n_tensors(f); j++, k++) {
            shoal_gguf_tensor(f, j, &g->t[k].d);   /* offset + nbytes checked by the reader */
            g->t[k].data = (const uint8_t *)g->maps[i] + g->t[k].d.offset;
            g->t[k].file = shoal_gguf_files_path(g->files, i);
        }
    }
    qsort(g->t, g->n_t, sizeof *g->t, cmp_gtensor);
    return 0;
}

/* ---- metadata -> config ------------------------------------------------- */

struct meta {
    const struct shoal_gguf *g;
    const char *path;
    const char *arch;
    json_t *cfg;          /* the config.json equivalent being built */
    struct shoal_err *err;
};

/* A getter's rc for key: 1 when absent and not required, the "required
 * key is missing" error when absent and required, else rc. */
static int found(struct meta *mt, const char *key, int rc, int required)
{
    if (rc != SHOAL_ENOTFOUND)
        return rc;
    if (!required)
        return 1;
    return shoal_err_set(mt->err, SHOAL_ENOTFOUND, "%s: required key '%s' is missing (a %s "
                         "model needs it)", mt->path, key, mt->arch);
}

/* Integer key ARCH.suffix in [lo, hi] into cfg[hf_key] (hf_key NULL: into
 * *out only). Returns 0, 1 when absent and not required, or an error. */
static int meta_int(struct meta *mt, const char *suffix, int required, int64_t lo, int64_t hi,
                    const char *hf_key, int64_t *out)
{
    char key[160];
    snprintf(key, sizeof key, "%s.%s", mt->arch, suffix);
    int64_t v = 0;
    const int rc = found(mt, key, shoal_gguf_get_int(mt->g, key, &v, mt->err), required);
    if (rc)
        return rc;
    if (v < lo || v > hi)
        return shoal_err_set(mt->err, SHOAL_ERANGE, "%s: key '%s' is %lld; expected %lld to "
                             "%lld", mt->path, key, (long long)v, (long long)lo, (long long)hi);
    if (hf_key)
        json_object_set_new(mt->cfg, hf_key, json_integer((json_int_t)v));
    if (out)
        *out = v;
    return 0;
}

/* Float key ARCH.suffix in (lo, hi] into cfg[hf_key]. */
static int meta_f64(struct meta *mt, const char *suffix, int required, double lo, double hi,
                    const char *hf_key)
{
    char key[160];
    snprintf(key, sizeof key, "%s.%s", mt->arch, suffix);
    double v = 0;
    const int rc = found(mt, key, shoal_gguf_get_f64(mt->g, key, &v, mt->err), required);
    if (rc)
        return rc;
    if (!(v > lo && v <= hi))
        return shoal_err_set(mt->err, SHOAL_ERANGE, "%s: key '%s' is %g; expected a value in "
                             "(%g, %g]", mt->path, key, v, lo, hi);
    json_object_set_new(mt->cfg, hf_key, json_real(v));
    return 0;
}

/* Refuse a key under "ARCH." that shoal does not read. */
static int check_keys(struct meta *mt, const char *const *known, size_t n_known)
{
    const size_t al = strlen(mt->arch);
    for (uint64_t i = 0; i < shoal_gguf_n_kv(mt->g); i++) {
        const char *k = shoal_gguf_key(mt->g, i);
        if (strncmp(k, mt->arch, al) || k[al] != '.')
            continue;   /* general.*, tokenizer.*, split.*: not the computation */
        size_t j = 0;
        while (j < n_known && strcmp(k + al + 1, known[j]))
            j++;
        if (j == n_known)
            return shoal_err_set(mt->err, SHOAL_EUNSUPPORTED, "%s: metadata key '%s' is not "
                                 "one shoal understands for %s; refused rather than ignored "
                                 "(it could change the computation)", mt->path, k, mt->arch);
    }
    return 0;
}

/* qwen3moe metadata (llama.cpp's llm_load_hparams for LLM_ARCH_QWEN3MOE) as
 * a qwen3_moe config.json: every layer MoE, top-k renormalised (llama.cpp's
 * graph does, as norm_topk_prob = true; ARCH.expert_weights_norm when given),
 * RoPE default (NEOX layout) with no scaling keys. */
static int qwen3moe_config(struct meta *mt, struct shoal_model_gguf *g)
{
    int rc = check_keys(mt, qwen3moe_keys, sizeof qwen3moe_keys / sizeof qwen3moe_keys[0]);
    if (rc)
        return rc;
    json_t *c = mt->cfg;
    json_object_set_new(c, "model_type", json_string("qwen3_moe"));
    json_object_set_new(c, "hidden_act", json_string("silu"));
    json_object_set_new(c, "decoder_sparse_step", json_integer(1));
    json_object_set_new(c, "mlp_only_layers", json_array());
    int64_t n_embd = 0, n_head = 0, n_head_kv = 0, n_expert = 0, k = 0, hd = 0, vd = 0, x = 0;
    const int64_t BIG = (int64_t)1 << 31;
#define REQ(s) do { if ((s) < 0) return -1; } while (0)
    REQ(rc = meta_int(mt, "block_count", 1, 1, SHOAL_MAX_LAYERS, "num_hidden_layers", NULL));
    REQ(rc = meta_int(mt, "context_length", 1, 1, BIG, "max_position_embeddings", NULL));
    REQ(rc = meta_int(mt, "embedding_length", 1, 1, 1 << 20, "hidden_size", &n_embd));
    REQ(rc = meta_int(mt, "feed_forward_length", 0, 1, 1 << 22, "intermediate_size", NULL));
    REQ(rc = meta_int(mt, "expert_feed_forward_length", 1, 1, 1 << 22,
                      "moe_intermediate_size", NULL));
    REQ(rc = meta_int(mt, "expert_count", 1, 1, 1 << 16, "num_experts", &n_expert));
    REQ(rc = meta_int(mt, "expert_used_count", 1, 1, n_expert, "num_experts_per_tok", &k));
    REQ(rc = meta_int(mt, "attention.head_count", 1, 1, 1 << 16, "num_attention_heads",
                      &n_head));
    n_head_kv = n_head;
    REQ(rc = meta_int(mt, "attention.head_count_kv", 0, 1, 1 << 16, "num_key_value_heads",
                      &n_head_kv));
    if (n_head % n_head_kv)
        return shoal_err_set(mt->err, SHOAL_EFORMAT, "%s: %s.attention.head_count %lld is not "
                             "a multiple of %s.attention.head_count_kv %lld", mt->path,
                             mt->arch, (long long)n_head, mt->arch, (long long)n_head_kv);
    hd = n_embd / n_head;   /* llama.cpp's default n_embd_head_k */
    REQ(rc = meta_int(mt, "attention.key_length", 0, 2, 1 << 16, "head_dim", &hd));
    if (rc == 1)
        json_object_set_new(c, "head_dim", json_integer((json_int_t)hd));
    vd = hd;
    REQ(rc = meta_int(mt, "attention.value_length", 0, 1, 1 << 16, NULL, &vd));
    if (vd != hd)
        return shoal_err_set(mt->err, SHOAL_EUNSUPPORTED, "%s: %s.attention.value_length %lld "
                             "differs from key_length %lld; shoal runs %s with one head size",
                             mt->path, mt->arch, (long long)vd, (long long)hd, mt->arch);
    x = hd;
    REQ(rc = meta_int(mt, "rope.dimension_count", 0, 1, 1 << 16, NULL, &x));
    if (x != hd)
        return shoal_err_set(mt->err, SHOAL_EUNSUPPORTED, "%s: %s.rope.dimension_count %lld "
                             "differs from the head size %lld; shoal runs %s with full "
                             "rotary", mt->path, mt->arch, (long long)x, (long long)hd,
                             mt->arch);
    REQ(rc = meta_f64(mt, "attention.layer_norm_rms_epsilon", 1, 0, 1, "rms_norm_eps"));
    REQ(rc = meta_f64(mt, "rope.freq_base", 0, 0, 1e30, "rope_theta"));
    int norm = 1;
    char key[160];
    snprintf(key, sizeof key, "%s.expert_weights_norm", mt->arch);
    rc = shoal_gguf_get_bool(mt->g, key, &norm, mt->err);
    if (rc && rc != SHOAL_ENOTFOUND)
        return -1;
    json_object_set_new(c, "norm_topk_prob", json_boolean(norm));

    /* the vocabulary is token_embd's rows; output.weight absent: tied */
    struct gtensor *te = find_tensor(g, "token_embd.weight");
    if (!te)
        return shoal_err_set(mt->err, SHOAL_ENOTFOUND, "%s: missing tensor 'token_embd.weight' "
                             "(a %s model needs it)", mt->path, mt->arch);
    if (te->d.n_dims != 2)
        return shoal_err_set(mt->err, SHOAL_ESHAPE, "%s: tensor 'token_embd.weight' has %u "
                             "dims; expected 2 (ne = {n_embd, n_vocab})", mt->path,
                             te->d.n_dims);
    json_object_set_new(c, "vocab_size", json_integer((json_int_t)te->d.ne[1]));
    REQ(rc = meta_int(mt, "vocab_size", 0, (int64_t)te->d.ne[1], (int64_t)te->d.ne[1], NULL,
                      NULL));
    json_object_set_new(c, "tie_word_embeddings", json_boolean(!find_tensor(g, "output.weight")));
    static const char *const ids[2][2] = {{"tokenizer.ggml.bos_token_id", "bos_token_id"},
                                          {"tokenizer.ggml.eos_token_id", "eos_token_id"}};
    for (int i = 0; i < 2; i++) {
        int64_t id = -1;
        rc = shoal_gguf_get_int(mt->g, ids[i][0], &id, mt->err);
        if (rc == 0 && id >= 0 && id < BIG)
            json_object_set_new(c, ids[i][1], json_integer((json_int_t)id));
        else if (rc && rc != SHOAL_ENOTFOUND)
            return -1;
    }
#undef REQ
    return 0;
}

/* general.architecture -> cfg (through shoal_model_config_parse). */
static int load_config(struct shoal_model *m, struct shoal_model_gguf *g, const char *path,
                       struct shoal_err *err)
{
    const struct shoal_gguf *g0 = shoal_gguf_files_get(g->files, 0);
    const char *name = NULL;
    size_t len = 0;
    int rc = shoal_gguf_get_str(g0, "general.architecture", &name, &len, err);
    if (rc == SHOAL_ENOTFOUND || (!rc && len == 0))
        return shoal_err_set(err, SHOAL_EFORMAT, "%s: GGUF file without general.architecture; "
                             "shoal runs GGUF files of: qwen3moe (docs/MODELS.md)", path);
    if (rc)
        return rc;
    const struct arch *a = NULL;
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (!strcmp(archs[i].name, name))
            a = &archs[i];
    if (!a)
        return shoal_err_set(err, SHOAL_EUNSUPPORTED, "%s: GGUF architecture '%s' is not "
                             "runnable yet; shoal runs GGUF files of: qwen3moe (docs/MODELS.md)",
                             path, name);
    struct meta mt = {.g = g0, .path = path, .arch = a->name, .cfg = json_object(), .err = err};
    rc = qwen3moe_config(&mt, g);
    char *text = rc ? NULL : json_dumps(mt.cfg, JSON_REAL_PRECISION(17));
    json_decref(mt.cfg);
    if (rc)
        return err->code ? err->code : SHOAL_EFORMAT;
    if (!text)
        return shoal_err_set(err, SHOAL_ENOMEM, "%s: cannot build the config", path);
    char what[4200];
    snprintf(what, sizeof what, "%s (its %s metadata)", path, a->name);
    rc = shoal_model_config_parse(text, strlen(text), what, &m->cfg, err);
    free(text);
    return rc;
}

/* ---- tensors -> weights ----------------------------------------------- */

struct bind_g {
    struct shoal_model_gguf *g;
    const char *path;                /* the file named in messages, borrowed */
    const char *arch;                /* general.architecture, borrowed */
    const struct shoal_model_config *cfg;
    struct shoal_err *err;
};

/* llama.cpp's name of slot s (its tensor holds every expert of the layer
 * for an expert slot). */
static void gguf_name(const struct shoal_weight_slot *s, char *buf, size_t cap)
{
    static const char *const exps[3] = {"gate", "up", "down"};
    if (s->kind == SHOAL_SLOT_EXPERT) {
        snprintf(buf, cap, "blk.%lld.ffn_%s_exps.weight", (long long)s->il, exps[s->comp]);
        return;
    }
    if (!strcmp(s->name, "tok_embd")) {
        snprintf(buf, cap, "token_embd.weight");
        return;
    }
    if (!strcmp(s->name, "out_norm")) {
        snprintf(buf, cap, "output_norm.weight");
        return;
    }
    if (!strcmp(s->name, "lm_head")) {
        snprintf(buf, cap, "output.weight");
        return;
    }
    /* "blk.N.<short>": the short names are llama.cpp's, but the router */
    const char *sfx = strchr(s->name + 4, '.');
    sfx = sfx ? sfx + 1 : s->name;
    if (!strcmp(sfx, "router"))
        sfx = "ffn_gate_inp";
    const size_t n = strlen(sfx);
    const int bias = n > 5 && !strcmp(sfx + n - 5, ".bias");
    snprintf(buf, cap, "blk.%lld.%s%s", (long long)s->il, sfx, bias ? "" : ".weight");
}

static void fmt_ne(char *buf, size_t cap, const uint64_t *ne, uint32_t n)
{
    size_t o = (size_t)snprintf(buf, cap, "{");
    for (uint32_t i = 0; i < n && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%llu", i ? ", " : "",
                              (unsigned long long)ne[i]);
    if (o < cap)
        snprintf(buf + o, cap - o, "}");
}

static int bind_from_gguf(const struct shoal_weight_slot *s, void *user)
{
    struct bind_g *b = user;
    struct shoal_weight *w = s->w;
    memset(w, 0, sizeof *w);
    char name[200];
    gguf_name(s, name, sizeof name);
    struct gtensor *t = find_tensor(b->g, name);
    if (!t) {
        if (!s->required)
            return 0;
        return shoal_err_set(b->err, SHOAL_ENOTFOUND, "missing tensor '%s' in '%s' (a %s "
                             "model needs it)", name, b->path, b->arch);
    }
    t->used = 1;
    const int expert = s->kind == SHOAL_SLOT_EXPERT;
    uint64_t want[3] = {(uint64_t)(s->cols ? s->cols : s->rows), (uint64_t)s->rows,
                        (uint64_t)b->cfg->n_expert};
    const uint32_t want_n = expert ? 3 : s->cols ? 2 : 1;
    int ok = t->d.n_dims == want_n;
    for (uint32_t i = 0; ok && i < want_n; i++)
        ok = t->d.ne[i] == want[i];
    if (!ok) {
        char a[96], g[96];
        fmt_ne(a, sizeof a, want, want_n);
        fmt_ne(g, sizeof g, t->d.ne, t->d.n_dims);
        return shoal_err_set(b->err, SHOAL_ESHAPE, "tensor '%s' in '%s' has wrong shape; "
                             "expected ne %s, got %s", name, t->file, a, g);
    }
    switch (t->d.type) {
    case SHOAL_GGML_TYPE_F32: w->dtype = SHOAL_DTYPE_F32; break;
    case SHOAL_GGML_TYPE_F16: w->dtype = SHOAL_DTYPE_F16; break;
    case SHOAL_GGML_TYPE_BF16: w->dtype = SHOAL_DTYPE_BF16; break;
    default:
        if (!s->cols || !shoal_ggml_dot_supported(t->d.type))
            return shoal_err_set(b->err, SHOAL_EUNSUPPORTED, "tensor '%s' in '%s' has type "
                                 "%s: not runnable yet (shoal runs F32, F16, BF16%s%s)", name,
                                 t->file, shoal_ggml_type_name(t->d.type),
                                 s->cols ? " and matrices of " : " for a 1-D tensor",
                                 s->cols ? shoal_ggml_dot_types() : "");
        w->dtype = SHOAL_DTYPE_GGML;
        w->ggml_type = t->d.type;
        break;
    }
    w->rows = s->cols ? s->rows : 1;
    w->cols = s->cols ? s->cols : s->rows;
    /* an expert is its contiguous n_out x n_in slice of the stacked tensor */
    w->data = t->data + (expert ? (size_t)s->ie * (size_t)(t->d.nbytes / want[2]) : 0);
    /* every block scale finite: the trunk's here, once; an expert's the
     * first time it runs (experts_local.c), since scanning them all here
     * would touch every page of the file (a block is 34 to 210 bytes) */
    if (w->dtype == SHOAL_DTYPE_GGML && !expert) {
        struct shoal_err e = {0};
        const uint64_t n_blk = t->d.nbytes / shoal_ggml_type_info(t->d.type)->type_size;
        if (shoal_ggml_check_scales(t->d.type, t->data, n_blk, name, 0, &e))
            return shoal_err_set(b->err, e.code, "'%s': %s", t->file, e.msg);
    }
    return 0;
}

int shoal_model_gguf_load(struct shoal_model *m, const char *path, struct shoal_err *err)
{
    struct shoal_model_gguf *g = shoal_xcalloc(1, sizeof *g);
    m->gguf = g;
    g->files = shoal_gguf_files_open(path, err);
    if (!g->files)
        return err->code ? err->code : SHOAL_EFORMAT;
    int rc = map_files(g, err);
    if (!rc)
        rc = load_config(m, g, path, err);
    if (rc)
        return rc;
    shoal_model_alloc_layers(m);
    struct bind_g b = {.g = g, .path = path, .arch = "qwen3moe", .cfg = &m->cfg, .err = err};
    rc = shoal_model_walk(m, bind_from_gguf, &b);
    if (rc)
        return rc;
    if (m->cfg.tie_embeddings)
        m->lm_head = m->tok_embd;
    for (size_t i = 0; i < g->n_t; i++)
        if (!g->t[i].used)
            return shoal_err_set(err, SHOAL_EFORMAT, "unexpected tensor '%s' in '%s': not "
                                 "part of a qwen3moe model with this metadata",
                                 g->t[i].d.name, g->t[i].file);
    return 0;
}
