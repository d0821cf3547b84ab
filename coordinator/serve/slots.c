/* slots: `shoal serve --slot-dir DIR`, the KV cache slots kept across
 * restarts (slots.h). */
#include "slots.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "container.h"
#include "util.h"

#define SLOT_MAGIC "SHOALKV1"

/* The header of a slot file (all fields little-endian as the host writes
 * them; a file from another byte order fails its checks). */
struct slot_header {
    char magic[8];
    uint64_t model_id;    /* serve_slots_model_id */
    uint32_t kv_dtype;    /* enum shoal_dtype */
    uint32_t n_layer;
    uint64_t row_bytes;   /* one cache row */
    uint32_t has_v;       /* 0: MLA (one row per token and layer) */
    uint32_t pad;
    uint64_t n_tokens;
};

uint64_t serve_slots_model_id(const struct shoal_model *m)
{
    if (m->ct)
        return m->ct->fingerprint;
    /* a checkpoint: its config.json, and each safetensors file's name,
     * size and modification time */
    XXH64_state_t *st = XXH64_createState();
    XXH64_reset(st, 0x5107);
    char *cfg = shoal_path_join(m->dir, "config.json");
    size_t n = 0;
    char *text = NULL;
    struct shoal_err err = {0};
    if (shoal_read_file(cfg, (size_t)16 << 20, &text, &n, &err) == 0)
        XXH64_update(st, text, n);
    free(text);
    free(cfg);
    uint64_t files = 0;   /* readdir's order is not sorted: the files' hashes summed */
    DIR *d = opendir(m->dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        const size_t l = strlen(e->d_name);
        if (l < 12 || strcmp(e->d_name + l - 12, ".safetensors"))
            continue;
        char *p = shoal_path_join(m->dir, e->d_name);
        struct stat sb;
        if (!stat(p, &sb)) {
            const int64_t meta[2] = {(int64_t)sb.st_size, (int64_t)sb.st_mtime};
            files += XXH64(e->d_name, l, XXH64(meta, sizeof meta, 0));
        }
        free(p);
    }
    if (d)
        closedir(d);
    XXH64_update(st, &files, sizeof files);
    const uint64_t id = XXH64_digest(st);
    XXH64_freeState(st);
    return id;
}

static char *slot_path(const char *dir, int64_t seq)
{
    char name[32];
    snprintf(name, sizeof name, "slot-%lld.kv", (long long)seq);
    return shoal_path_join(dir, name);
}

static void header_of(struct shoal_session *s, uint64_t model_id, int64_t n,
                      struct slot_header *h)
{
    size_t rb = 0;
    memset(h, 0, sizeof *h);
    memcpy(h->magic, SLOT_MAGIC, 8);
    h->model_id = model_id;
    h->kv_dtype = (uint32_t)shoal_ctx_kv_dtype(s->ctx);
    h->n_layer = (uint32_t)s->model->cfg.n_layer;
    h->has_v = shoal_ctx_seq_kv(s->ctx, 0, 0, 1, &rb) != NULL;
    h->row_bytes = rb;
    h->n_tokens = (uint64_t)n;
}

/* write n bytes and hash them; 0 or -1 */
static int put(FILE *f, XXH64_state_t *st, const void *p, size_t n)
{
    XXH64_update(st, p, n);
    return fwrite(p, 1, n, f) == n ? 0 : -1;
}

int serve_slots_save(const char *dir, struct shoal_session *s, uint64_t model_id, int64_t seq,
                     const int32_t *tokens, int64_t n, struct shoal_err *err)
{
    char *path = slot_path(dir, seq);
    char *tmp = shoal_xmalloc(strlen(path) + 8);
    sprintf(tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        shoal_err_set(err, SHOAL_EIO, "cannot create '%s': %s", tmp, strerror(errno));
        free(tmp);
        free(path);
        return SHOAL_EIO;
    }
    struct slot_header h;
    header_of(s, model_id, n, &h);
    XXH64_state_t *st = XXH64_createState();
    XXH64_reset(st, 0);
    int bad = put(f, st, &h, sizeof h) ||
              put(f, st, tokens, (size_t)n * sizeof(int32_t));
    for (int64_t il = 0; il < (int64_t)h.n_layer && !bad; il++)
        for (int v = 0; v <= (int)h.has_v && !bad; v++) {
            size_t rb;
            const void *rows = shoal_ctx_seq_kv(s->ctx, seq, il, v, &rb);
            bad = put(f, st, rows, (size_t)n * rb);
        }
    const uint64_t sum = XXH64_digest(st);
    XXH64_freeState(st);
    bad = bad || fwrite(&sum, sizeof sum, 1, f) != 1;
    bad = fflush(f) != 0 || bad;
    bad = fsync(fileno(f)) != 0 || bad;
    bad = fclose(f) != 0 || bad;
    if (!bad && rename(tmp, path) != 0)
        bad = 1;
    int rc = 0;
    if (bad) {
        rc = shoal_err_set(err, SHOAL_EIO, "cannot write '%s': %s", path,
                           strerror(errno ? errno : EIO));
        unlink(tmp);
    }
    free(tmp);
    free(path);
    return rc;
}

/* read n bytes and hash them; 0 or -1 */
static int get(FILE *f, XXH64_state_t *st, void *p, size_t n)
{
    if (fread(p, 1, n, f) != n)
        return -1;
    XXH64_update(st, p, n);
    return 0;
}

int serve_slots_load(const char *dir, struct shoal_session *s, uint64_t model_id, int64_t seq,
                     int32_t **tokens, int64_t *n_out, struct shoal_err *err)
{
    *tokens = NULL;
    *n_out = 0;
    char *path = slot_path(dir, seq);
    FILE *f = fopen(path, "rb");
    if (!f) {
        int rc = errno == ENOENT ? 1 : shoal_err_set(err, SHOAL_EIO, "cannot open '%s': %s",
                                                     path, strerror(errno));
        free(path);
        return rc;
    }
    struct slot_header h, want;
    XXH64_state_t *st = XXH64_createState();
    XXH64_reset(st, 0);
    int rc = 0;
    int32_t *ids = NULL;
    if (get(f, st, &h, sizeof h)) {
        rc = shoal_err_set(err, SHOAL_EFORMAT, "'%s': shorter than its %zu-byte header", path,
                           sizeof h);
        goto out;
    }
    header_of(s, model_id, (int64_t)h.n_tokens, &want);
    if (memcmp(h.magic, SLOT_MAGIC, 8)) {
        rc = shoal_err_set(err, SHOAL_EFORMAT, "'%s': not a shoal slot file (magic)", path);
        goto out;
    }
    if (h.model_id != want.model_id || h.kv_dtype != want.kv_dtype ||
        h.n_layer != want.n_layer || h.row_bytes != want.row_bytes || h.has_v != want.has_v) {
        rc = shoal_err_set(err, SHOAL_EFORMAT, "'%s': written for another model or KV cache "
                           "(model %016llx, %s, %u layers, %llu-byte rows; this server: "
                           "%016llx, %s, %u layers, %llu-byte rows)", path,
                           (unsigned long long)h.model_id,
                           shoal_dtype_name((enum shoal_dtype)h.kv_dtype), h.n_layer,
                           (unsigned long long)h.row_bytes, (unsigned long long)want.model_id,
                           shoal_dtype_name((enum shoal_dtype)want.kv_dtype), want.n_layer,
                           (unsigned long long)want.row_bytes);
        goto out;
    }
    const int64_t n_ctx = shoal_ctx_n_ctx(s->ctx);
    if (h.n_tokens == 0 || h.n_tokens > (uint64_t)n_ctx) {
        rc = shoal_err_set(err, SHOAL_EFORMAT, "'%s': %llu tokens, expected 1 to the "
                           "context's %lld", path, (unsigned long long)h.n_tokens,
                           (long long)n_ctx);
        goto out;
    }
    const int64_t n = (int64_t)h.n_tokens;
    ids = shoal_xcalloc((size_t)n, sizeof(int32_t));
    int bad = get(f, st, ids, (size_t)n * sizeof(int32_t));
    for (int64_t il = 0; il < (int64_t)h.n_layer && !bad; il++)
        for (int v = 0; v <= (int)h.has_v && !bad; v++) {
            size_t rb;
            void *rows = shoal_ctx_seq_kv(s->ctx, seq, il, v, &rb);
            bad = get(f, st, rows, (size_t)n * rb);
        }
    uint64_t sum = 0;
    if (bad || fread(&sum, sizeof sum, 1, f) != 1 || fgetc(f) != EOF) {
        rc = shoal_err_set(err, SHOAL_EFORMAT, "'%s': its size is not that of %lld tokens "
                           "of this model's KV rows", path, (long long)n);
        goto out;
    }
    if (sum != XXH64_digest(st)) {
        rc = shoal_err_set(err, SHOAL_EFORMAT, "'%s': checksum mismatch (the file is "
                           "damaged)", path);
        goto out;
    }
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->model->cfg.n_vocab) {
            rc = shoal_err_set(err, SHOAL_EFORMAT, "'%s': token %lld is %d, outside the "
                               "vocabulary [0, %lld)", path, (long long)i, ids[i],
                               (long long)s->model->cfg.n_vocab);
            goto out;
        }
    shoal_ctx_seq_set_past(s->ctx, seq, n);
    *tokens = ids;
    *n_out = n;
    ids = NULL;
out:
    XXH64_freeState(st);
    fclose(f);
    free(ids);
    free(path);
    return rc;
}
