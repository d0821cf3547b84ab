/* model_gguf: a GGUF file (or split set) of a llama.cpp architecture shoal
 * runs, as a struct shoal_model: the architecture's metadata becomes the
 * same struct shoal_model_config a Hugging Face config.json gives (through
 * the same parser, so the same checks), and every weight is a view into a
 * read-only mapping of the file at the type it ships in (docs/MODELS.md
 * "GGUF files").
 *
 * Architectures: those of gguf_arch.c (which keys each reads, its tensor
 * names, the tensors its converter reshapes), tensors of type F32,
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
#include "gguf_arch.h"
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
    const char *arch;                /* general.architecture, borrowed from files */
    char *config_json;               /* the config.json its metadata gives, owned */
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

uint32_t shoal_model_gguf_n_files(const struct shoal_model *m)
{
    return m && m->gguf ? m->gguf->n_files : 0;
}

const char *shoal_model_gguf_path(const struct shoal_model *m, uint32_t i)
{
    return m && m->gguf && i < m->gguf->n_files ? shoal_gguf_files_path(m->gguf->files, i)
                                                : NULL;
}

int shoal_model_gguf_locate(const struct shoal_model *m, const void *p, uint32_t *file,
                            uint64_t *off)
{
    const struct shoal_model_gguf *g = m ? m->gguf : NULL;
    for (uint32_t i = 0; g && i < g->n_files; i++) {
        const uint8_t *b = g->maps[i], *q = p;
        if (b && q >= b && q < b + g->map_len[i]) {
            *file = i;
            *off = (uint64_t)(q - b);
            return 0;
        }
    }
    return SHOAL_ENOTFOUND;
}

const char *shoal_model_gguf_config_json(const struct shoal_model *m)
{
    return m && m->gguf ? m->gguf->config_json : NULL;
}

void shoal_model_gguf_free(struct shoal_model_gguf *g)
{
    if (!g)
        return;
    free(g->config_json);
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

/* gguf_arch.h's lookup over the set's tensors. */
static const struct shoal_gguf_tensor *lookup(void *ctx, const char *name, int mark_used,
                                              const uint8_t **data, const char **file)
{
    struct gtensor *t = find_tensor(ctx, name);
    if (!t)
        return NULL;
    t->used |= mark_used;
    *data = t->data;
    *file = t->file;
    return &t->d;
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
                             "shoal runs GGUF files of: %s (docs/MODELS.md)", path,
                             shoal_gguf_arch_list());
    if (rc)
        return rc;
    const struct shoal_gguf_arch *a = shoal_gguf_arch_find(name);
    if (!a)
        return shoal_err_set(err, SHOAL_EUNSUPPORTED, "%s: GGUF architecture '%s' is not "
                             "runnable yet; shoal runs GGUF files of: %s (docs/MODELS.md)",
                             path, name, shoal_gguf_arch_list());
    g->arch = a->name;
    const struct shoal_gguf_lookup lk = {.ctx = g, .find = lookup};
    struct shoal_gguf_meta mt = {.g = g0, .path = path, .arch = a->name, .cfg = json_object(),
                                 .lk = &lk, .err = err};
    rc = a->config(&mt);
    char *text = rc ? NULL : json_dumps(mt.cfg, JSON_REAL_PRECISION(17));
    json_decref(mt.cfg);
    if (rc)
        return err->code ? err->code : SHOAL_EFORMAT;
    if (!text)
        return shoal_err_set(err, SHOAL_ENOMEM, "%s: cannot build the config", path);
    char what[4200];
    snprintf(what, sizeof what, "%s (its %s metadata)", path, a->name);
    rc = shoal_model_config_parse(text, strlen(text), what, &m->cfg, err);
    g->config_json = text;   /* what shoal convert writes as the container's config */
    return rc;
}

/* ---- tensors -> weights ----------------------------------------------- */

struct bind_g {
    struct shoal_model_gguf *g;
    const char *path;                /* the file named in messages, borrowed */
    const char *arch;                /* general.architecture, borrowed */
    const struct shoal_model_config *cfg;
    struct shoal_model *m;           /* owns what gguf_arch.c rebuilds */
    struct shoal_err *err;
};

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
    if (s->kv_b_part)   /* bound with attn_kv_b (gguf_arch.c bind_kv_b), after it */
        return 0;
    memset(w, 0, sizeof *w);
    char name[200];
    shoal_gguf_arch_tensor_name(b->arch, s, name, sizeof name);
    struct gtensor *t = find_tensor(b->g, name);
    if (!t) {
        const struct shoal_gguf_lookup lk = {.ctx = b->g, .find = lookup};
        const int rc = shoal_gguf_arch_bind_other(s, b->m, &lk, b->path, b->err);
        if (rc != 1)
            return rc;
        if (!s->required)
            return 0;
        return shoal_err_set(b->err, SHOAL_ENOTFOUND, "missing tensor '%s' in '%s' (a %s "
                             "model needs it)", name, b->path, b->arch);
    }
    t->used = 1;
    const int expert = s->kind == SHOAL_SLOT_EXPERT;
    /* a matrix ne {cols, rows}, a vector {rows}; an expert's stacked over
     * n_expert (gpt-oss's expert biases: {rows, n_expert}) */
    uint64_t want[3] = {(uint64_t)(s->cols ? s->cols : s->rows), (uint64_t)s->rows,
                        (uint64_t)b->cfg->n_expert};
    const uint32_t want_n = (s->cols ? 2 : 1) + (uint32_t)expert;
    if (!s->cols)
        want[1] = want[2];
    const uint64_t n_stack = expert ? (uint64_t)b->cfg->n_expert : 1;
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
    w->data = t->data + (size_t)(expert ? s->ie : 0) * (size_t)(t->d.nbytes / n_stack);
    /* every block scale finite: the trunk's here, once; an expert's the
     * first time it runs (experts_local.c), since scanning them all here
     * would touch every page of the file (a block is 34 to 210 bytes) */
    if (w->dtype == SHOAL_DTYPE_GGML && !expert) {
        struct shoal_err e = {0};
        const uint64_t n_blk = t->d.nbytes / shoal_ggml_type_info(t->d.type)->type_size;
        if (shoal_ggml_check_scales(t->d.type, t->data, n_blk, name, 0, &e))
            return shoal_err_set(b->err, e.code, "'%s': %s", t->file, e.msg);
    }
    return shoal_gguf_arch_bound(b->arch, s, b->m);
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
    struct bind_g b = {.g = g, .path = path, .arch = g->arch, .cfg = &m->cfg, .m = m,
                       .err = err};
    rc = shoal_model_walk(m, bind_from_gguf, &b);
    if (rc)
        return rc;
    if (m->cfg.tie_embeddings)
        m->lm_head = m->tok_embd;
    if (m->cfg.n_nextn > 0) {
        /* the MTP layers llama.cpp keeps (blk.N.nextn.* and layer N's usual
         * tensors, N >= n_layer): bound when complete, else only unusable */
        struct shoal_err e = {0};
        struct bind_g bm = b;
        bm.err = &e;
        if (shoal_model_walk_mtp(m, bind_from_gguf, &bm))
            snprintf(m->mtp_why, sizeof m->mtp_why, "its MTP layer is incomplete: %s", e.msg);
        else
            m->n_mtp = m->cfg.n_nextn;
    }
    for (size_t i = 0; i < g->n_t; i++)
        if (!g->t[i].used && !shoal_gguf_arch_unbound_ok(g->t[i].d.name, &m->cfg))
            return shoal_err_set(err, SHOAL_EFORMAT, "unexpected tensor '%s' in '%s': not "
                                 "part of a %s model with this metadata",
                                 g->t[i].d.name, g->t[i].file, g->arch);
    return 0;
}
