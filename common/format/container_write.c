/* container_write: converting a model into a shoal container
 * (shoal_container_convert, docs/FORMAT.md) and the file steps the
 * writers share (container_impl.h). */
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
#include "ggml_types.h"
#include "gguf.h"
#include "gguf_arch.h"
#include "kv.h"
#include "quant.h"
#include "util.h"

/* The dtype, group and bytes of a slot for this conversion
 * (container_write.h). */
static enum shoal_dtype target_dtype(const struct shoal_weight_slot *s,
                                     const struct shoal_convert_params *p)
{
    return shoal_container_slot_dtype(s, p->experts_dtype, p->dense_dtype);
}

static int target_group(enum shoal_dtype t, const struct shoal_convert_params *p)
{
    return shoal_container_dtype_group(t, p->group);
}

/* ---- writer --------------------------------------------------------------- */

struct writer {
    const struct shoal_model *src;
    const struct shoal_convert_params *p;
    struct shoal_err *err;
    int fd_dense, fd_exp;
    char *dense_path, *exp_path;
    uint64_t dense_off;            /* next write offset in dense.bin */
    uint64_t exp_off;              /* next blob offset in experts.bin */
    struct shoal_container_layout lay;  /* the expert blob's layout (pass 0) */
    json_t *tensors;               /* manifest dense tensor list */
    json_t *layers;                /* manifest expert layers */
    json_t *cur_layer_sums;        /* xxh64 list of the current layer */
    int64_t cur_layer;
    unsigned char *blob;           /* one expert blob being assembled */
    unsigned char *chunk;          /* conversion buffer */
    size_t chunk_cap;
    XXH64_state_t *fp;             /* running fingerprint */
    uint64_t done, total;
    int pass;                      /* 0: measure, 1: write */
};


/* Convert rows [r0, r1) of a source weight into dst (target dtype). An FP8
 * source to another dtype is dequantized first, these rows only (f32 in
 * *tmp, grown as needed and owned by the caller). */
static int convert_rows(const struct shoal_weight *src, enum shoal_dtype t, int group,
                        int64_t r0, int64_t r1, unsigned char *dst,
                        const char *name, float **tmp, struct shoal_err *err)
{
    const int64_t cols = src->cols;
    if (src->dtype == SHOAL_DTYPE_GGML) {
        /* every block scale finite (a GGUF's experts are not checked at
         * load), then the blocks as they are, or dequantized below */
        const uint64_t blk_row = (uint64_t)cols / shoal_ggml_type_info(src->ggml_type)->block_size;
        struct shoal_err fe = {0};
        if (shoal_ggml_check_scales(src->ggml_type, shoal_weight_row(src, r0),
                                    (uint64_t)(r1 - r0) * blk_row, name, (uint64_t)r0 * blk_row,
                                    &fe))
            return shoal_err_set(err, fe.code, "%s", fe.msg);
        if (t == SHOAL_DTYPE_GGML) {
            memcpy(dst, shoal_weight_row(src, r0),
                   (size_t)(r1 - r0) * shoal_weight_row_bytes(src));
            return 0;
        }
    }
    if (src->dtype == SHOAL_DTYPE_FP8) {   /* every code passes here once: no NaN */
        const size_t n = (size_t)(r1 - r0) * (size_t)cols;
        const int64_t bad = shoal_fp8_find_nan(shoal_weight_row(src, r0), n);
        if (bad >= 0)
            return shoal_err_set(err, SHOAL_EFORMAT,
                                 "tensor '%s': FP8 code at (row %lld, col %lld) is NaN; "
                                 "expected finite E4M3 weights", name,
                                 (long long)(r0 + bad / cols), (long long)(bad % cols));
    }
    if (src->dtype == SHOAL_DTYPE_MXFP4) {
        /* every exponent, once per tensor (rows * cols / 32 bytes) */
        const int rc = r0 == 0 ? shoal_mxfp4_check(src, name, err) : 0;
        if (rc)
            return rc;
        if (t == SHOAL_DTYPE_MXFP4) {   /* the packed pairs as they are, row by row */
            for (int64_t r = r0; r < r1; r++)
                memcpy(dst + (size_t)(r - r0) * (size_t)(cols / 2), shoal_mxfp4_row_q(src, r),
                       (size_t)(cols / 2));
            return 0;
        }
    }
    /* FP8, MXFP4 and ggml types to another dtype: dequantized first (a
     * ggml type by its scalar reference, ggml_types.h) */
    if ((src->dtype == SHOAL_DTYPE_FP8 || src->dtype == SHOAL_DTYPE_MXFP4 ||
         src->dtype == SHOAL_DTYPE_GGML) && t != src->dtype) {
        free(*tmp);
        *tmp = shoal_xmalloc((size_t)(r1 - r0) * (size_t)cols * sizeof(float));
        for (int64_t r = r0; r < r1; r++)
            shoal_weight_row_to_f32(*tmp + (size_t)(r - r0) * (size_t)cols, src, r);
        const struct shoal_weight f = {.dtype = SHOAL_DTYPE_F32, .data = *tmp,
                                       .rows = r1 - r0, .cols = cols};
        return convert_rows(&f, t, group, 0, r1 - r0, dst, name, tmp, err);
    }
    if (native_only(t) && src->dtype != t)
        return shoal_err_set(err, SHOAL_EUNSUPPORTED,
                             "tensor '%s': cannot convert %s to %s (%s keeps a %s source; "
                             "shoal does not quantize to %s)", name,
                             shoal_dtype_name(src->dtype), shoal_dtype_name(t),
                             shoal_dtype_name(t), shoal_dtype_name(t), shoal_dtype_name(t));
    if (shoal_dtype_is_quant(t)) {
        enum shoal_quant_type qt = t == SHOAL_DTYPE_INT8 ? SHOAL_QUANT_INT8 : SHOAL_QUANT_INT4;
        size_t bytes = shoal_quant_matrix_bytes(qt, r1 - r0, cols, group);
        struct shoal_err qerr = {0};
        int rc = shoal_quant_quantize_matrix(qt, group, dst, bytes,
                                             shoal_weight_row(src, r0), src->dtype,
                                             r1 - r0, cols, &qerr);
        if (rc)
            return shoal_err_set(err, rc, "tensor '%s' rows %lld..%lld: %s", name,
                                 (long long)r0, (long long)r1, qerr.msg);
        return 0;
    }
    for (int64_t r = r0; r < r1; r++) {
        const void *row = shoal_weight_row(src, r);
        unsigned char *out = dst + (size_t)(r - r0) * (size_t)cols * shoal_dtype_size(t);
        if (t == src->dtype) {
            memcpy(out, row, (size_t)cols * shoal_dtype_size(t));
        } else if (t == SHOAL_DTYPE_F32) {
            shoal_to_f32((float *)out, row, src->dtype, (size_t)cols);
        } else if (t == SHOAL_DTYPE_BF16) {
            for (int64_t c = 0; c < cols; c++) {
                float f;
                shoal_to_f32(&f, (const char *)row + c * shoal_dtype_size(src->dtype),
                             src->dtype, 1);
                uint16_t h = shoal_f32_to_bf16(f);
                memcpy(out + 2 * c, &h, 2);
            }
        } else {
            return shoal_err_set(err, SHOAL_EUNSUPPORTED,
                                 "tensor '%s': cannot convert %s to %s", name,
                                 shoal_dtype_name(src->dtype), shoal_dtype_name(t));
        }
    }
    return 0;
}

/* n bytes of a tensor at offset off: hashed, then written to fd (dense.bin)
 * or into the expert blob being assembled (fd < 0). */
static int put_bytes(struct writer *wr, XXH64_state_t *h, int fd, const char *path,
                     uint64_t off, const void *p, size_t n)
{
    if (n == 0)
        return 0;
    XXH64_update(h, p, n);
    if (fd >= 0)
        return shoal_pwrite_all(fd, p, n, off, path, wr->err);
    memcpy(wr->blob + off, p, n);
    return 0;
}

/* Write a whole converted tensor at file offset off (in row chunks of at
 * most ~8 MiB), hashing the bytes. */
static int write_tensor(struct writer *wr, const struct shoal_weight_slot *s,
                        enum shoal_dtype t, int fd, const char *path, uint64_t off,
                        uint64_t *xxh)
{
    const struct shoal_weight *src = s->w;
    struct shoal_weight tw = {.dtype = t, .rows = src->rows, .cols = src->cols,
                              .group = target_group(t, wr->p), .ggml_type = src->ggml_type};
    size_t row_bytes = shoal_weight_row_bytes(&tw);
    int64_t rows_per = (int64_t)((8u << 20) / (row_bytes ? row_bytes : 1));
    if (rows_per < 1)
        rows_per = 1;
    size_t need = (size_t)rows_per * row_bytes;
    if (need > wr->chunk_cap) {
        free(wr->chunk);
        wr->chunk = shoal_xmalloc(need);
        wr->chunk_cap = need;
    }
    XXH64_state_t *h = XXH64_createState();
    XXH64_reset(h, 0);
    int rc = 0;
    float *tmp = NULL;
    /* messages name a GGUF's own tensor (blk.0.ffn_down_exps.weight) */
    char gname[200];
    const char *name = s->hf_name;
    const struct shoal_gguf *meta = shoal_model_gguf_meta(wr->src);
    const char *arch = NULL;
    if (meta && !shoal_gguf_get_str(meta, "general.architecture", &arch, NULL, NULL)) {
        shoal_gguf_arch_tensor_name(arch, s, gname, sizeof gname);
        name = gname;
    }
    for (int64_t r0 = 0; r0 < src->rows && !rc; r0 += rows_per) {
        int64_t r1 = r0 + rows_per < src->rows ? r0 + rows_per : src->rows;
        size_t n = (size_t)(r1 - r0) * row_bytes;
        rc = convert_rows(src, t, tw.group, r0, r1, wr->chunk, name, &tmp, wr->err);
        if (rc && meta) {   /* which file, and which expert of the stacked tensor */
            const struct shoal_err e = *wr->err;
            char ex[48] = "";
            if (s->kind == SHOAL_SLOT_EXPERT)
                snprintf(ex, sizeof ex, " (in expert %lld)", (long long)s->ie);
            memset(wr->err, 0, sizeof *wr->err);
            shoal_err_set(wr->err, e.code, "'%s': %s%s", wr->src->dir, e.msg, ex);
        }
        if (!rc)
            rc = put_bytes(wr, h, fd, path, off + (uint64_t)r0 * row_bytes, wr->chunk, n);
    }
    free(tmp);
    if (!rc && t == SHOAL_DTYPE_FP8) {
        /* the codes' padding to 4 bytes, then the block scales as they are
         * (docs/FORMAT.md "FP8 tensors") */
        static const unsigned char zero[4];
        const size_t codes = (size_t)src->rows * (size_t)src->cols;
        const size_t so = shoal_fp8_scale_offset(src->rows, src->cols);
        rc = put_bytes(wr, h, fd, path, off + codes, zero, so - codes);
        if (!rc)
            rc = put_bytes(wr, h, fd, path, off + so, src->scale,
                           shoal_fp8_scale_bytes(src->rows, src->cols, tw.group));
    }
    /* the exponents right after the pairs (docs/FORMAT.md "MXFP4 tensors"),
     * row by row (a source may step over rows: gpt-oss's gate and up) */
    for (int64_t r = 0; !rc && t == SHOAL_DTYPE_MXFP4 && r < src->rows; r++)
        rc = put_bytes(wr, h, fd, path,
                       off + (uint64_t)src->rows * row_bytes +
                           (uint64_t)r * (uint64_t)(src->cols / SHOAL_MXFP4_BLOCK),
                       shoal_mxfp4_row_e(src, r), (size_t)(src->cols / SHOAL_MXFP4_BLOCK));
    *xxh = XXH64_digest(h);
    XXH64_freeState(h);
    return rc;
}


static int flush_layer(struct writer *wr)
{
    if (wr->cur_layer >= 0 && wr->cur_layer_sums) {
        json_array_append_new(wr->layers, shoal_container_layer_entry(
            wr->cur_layer, wr->exp_off - json_array_size(wr->cur_layer_sums) *
                           shoal_container_layout_blob(&wr->lay, wr->cur_layer),
            wr->cur_layer_sums));
        wr->cur_layer_sums = NULL;
    }
    return 0;
}

static int write_slot(const struct shoal_weight_slot *s, void *user);

/* The MTP layers (shoal_model_walk_mtp): every tensor, its routed experts
 * too, a dense tensor (it runs only when drafting, from the mapping); its
 * matrices at a router's dtype (shoal_target_dtype): int8 when the dense
 * dtype is 4-bit, the precision DeepSeek's MTP heads are served at. */
static int write_mtp_slot(const struct shoal_weight_slot *s, void *user)
{
    struct shoal_weight_slot d = *s;
    d.kind = SHOAL_SLOT_DENSE;
    d.router = s->cols != 0;
    return write_slot(&d, user);
}

static int write_slot(const struct shoal_weight_slot *s, void *user)
{
    struct writer *wr = user;
    if (!s->w->data) {
        if (s->required)   /* a tensor the model holds in another form (a caller's bug) */
            return shoal_err_set(wr->err, SHOAL_EINVAL, "tensor '%s' has no data to write",
                                 s->hf_name);
        return 0; /* optional and absent */
    }
    enum shoal_dtype t = target_dtype(s, wr->p);
    const int group = target_group(t, wr->p);
    uint64_t bytes = shoal_container_slot_bytes(s, t, group);
    if (wr->pass == 0) {
        if (native_only(t) && s->w->dtype != t)
            return shoal_err_set(wr->err, SHOAL_EUNSUPPORTED,
                                 "--experts %s: expert tensor '%s' is %s in the source; "
                                 "%s keeps %s source weights only (choose int4a8|int4|"
                                 "int8|bf16|f32)", t == SHOAL_DTYPE_FP8 ? "fp8" : "mxfp4",
                                 s->hf_name, shoal_dtype_name(s->w->dtype),
                                 shoal_dtype_name(t), shoal_dtype_name(t));
        if (wr->lay.layer && s->kind == SHOAL_SLOT_EXPERT && s->ie > 0) {
            /* a layer's experts share its blob (a GGUF stacks them in one tensor) */
            const struct shoal_expert_component *k = &wr->lay.layer[s->il].comp[s->comp];
            if (k->dtype != t || k->bytes != bytes ||
                (t == SHOAL_DTYPE_GGML && k->ggml_type != s->w->ggml_type))
                return shoal_err_set(wr->err, SHOAL_EFORMAT, "tensor '%s': expert %lld is "
                                     "%s in %" PRIu64 " bytes; expert 0 of its layer is %s "
                                     "in %" PRIu64, s->hf_name, (long long)s->ie,
                                     shoal_dtype_name(t), bytes, shoal_dtype_name(k->dtype),
                                     k->bytes);
        }
        wr->total += bytes;
        shoal_container_layout_slot(&wr->lay, s, t, group, bytes);
        return 0;
    }
    int rc;
    uint64_t xxh = 0;
    if (s->kind == SHOAL_SLOT_DENSE) {
        uint64_t off = align_up(wr->dense_off, DENSE_ALIGN);
        rc = write_tensor(wr, s, t, wr->fd_dense, wr->dense_path, off, &xxh);
        if (rc)
            return rc;
        json_array_append_new(wr->tensors, shoal_container_dense_entry(s, t, group, off, bytes,
                                                                        xxh));
        shoal_container_fp_dense(wr->fp, s, t, group, xxh);
        if (t == SHOAL_DTYPE_GGML)
            shoal_container_fp_ggml(wr->fp, s->name, s->w->ggml_type);
        wr->dense_off = off + bytes;
    } else {
        if (s->il != wr->cur_layer) {
            flush_layer(wr);
            wr->cur_layer = s->il;
            wr->cur_layer_sums = json_array();
        }
        const uint64_t blob = shoal_container_layout_blob(&wr->lay, s->il);
        if (s->comp == 0)
            memset(wr->blob, 0, blob);
        rc = write_tensor(wr, s, t, -1, NULL,
                          wr->lay.layer ? wr->lay.layer[s->il].comp[s->comp].offset
                                        : wr->lay.comp_off[s->comp], &xxh);
        if (rc)
            return rc;
        if (s->comp == wr->lay.n_comp - 1) {
            uint64_t sum = XXH64(wr->blob, blob, 0);
            rc = shoal_pwrite_all(wr->fd_exp, wr->blob, blob, wr->exp_off,
                           wr->exp_path, wr->err);
            if (rc)
                return rc;
            char hex[17];
            shoal_container_hex(sum, hex);
            json_array_append_new(wr->cur_layer_sums, json_string(hex));
            shoal_container_fp_expert(wr->fp, s->il, s->ie, sum);
            wr->exp_off += blob;
        }
    }
    /* the source pages are done with: keep RSS bounded on big checkpoints */
    if (wr->src->st)
        shoal_safetensors_drop_pages(shoal_safetensors_find(wr->src->st, s->hf_name));
    wr->done += bytes;
    if (wr->p->progress)
        wr->p->progress(wr->done, wr->total, wr->p->progress_user);
    return 0;
}

/* A GGUF model's side files in tmp: config.json, the config its metadata
 * gives (the manifest's too: *config), and tokenizer.gguf, its metadata
 * without tensors (vocabulary, chat template); *files lists them. */
static int write_gguf_side_files(const struct shoal_model *src, const char *tmp,
                                 json_t **config, json_t **files, struct shoal_err *err)
{
    json_error_t jerr;
    const char *text = shoal_model_gguf_config_json(src);
    *config = text ? json_loads(text, 0, &jerr) : NULL;
    if (!*config)
        return shoal_err_set(err, SHOAL_EFORMAT, "'%s': no config from its metadata",
                             src->dir);
    char *cfg_path = shoal_path_join(tmp, "config.json");
    char *tok_path = shoal_path_join(tmp, "tokenizer.gguf");
    const struct shoal_gguf *meta = shoal_model_gguf_meta(src);
    /* without a vocabulary the GGUF runs on token ids; so does the container */
    const int vocab = shoal_gguf_find(meta, "tokenizer.ggml.tokens") >= 0;
    int rc = shoal_container_write_json(*config, cfg_path, err);
    if (!rc && vocab)
        rc = shoal_gguf_write_meta(meta, tok_path, err);
    free(cfg_path);
    free(tok_path);
    if (rc) {
        json_decref(*config);
        *config = NULL;
        return rc;
    }
    *files = vocab ? json_pack("[ss]", "config.json", "tokenizer.gguf")
                   : json_pack("[s]", "config.json");
    return 0;
}

int shoal_container_write_header(int fd, const char magic[8], uint64_t file_bytes,
                                 uint64_t fingerprint, const char *path,
                                 struct shoal_err *err)
{
    unsigned char h[SHOAL_CONTAINER_HEADER_BYTES];
    memset(h, 0, sizeof h);
    memcpy(h, magic, 8);
    put_u32(h + 8, SHOAL_CONTAINER_VERSION);
    put_u32(h + 12, SHOAL_CONTAINER_HEADER_BYTES);
    put_u64(h + 16, file_bytes);
    put_u64(h + 24, fingerprint);
    return shoal_pwrite_all(fd, h, sizeof h, 0, path, err);
}

int container_copy_file(const char *from, const char *to, struct shoal_err *err)
{
    char *buf = NULL;
    size_t len = 0;
    int rc = shoal_read_file(from, (size_t)1 << 30, &buf, &len, err);
    if (rc)
        return rc;
    int fd = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        int e = errno;
        free(buf);
        return shoal_err_set(err, -e, "cannot create '%s': %s", to, strerror(e));
    }
    rc = shoal_pwrite_all(fd, buf, len, 0, to, err);
    if (!rc && fsync(fd) != 0) {
        int e = errno;
        rc = shoal_err_set(err, -e, "cannot sync '%s': %s", to, strerror(e));
    }
    close(fd);
    free(buf);
    return rc;
}

void shoal_container_rm_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        char *p = shoal_path_join(dir, de->d_name);
        unlink(p);
        free(p);
    }
    closedir(d);
    rmdir(dir);
}

int shoal_container_make_tmp(const char *dst, char **tmp, struct shoal_err *err)
{
    const size_t dl = strlen(dst);
    *tmp = shoal_xmalloc(dl + 32);
    snprintf(*tmp, dl + 32, "%s.tmp-%ld", dst, (long)getpid());
    shoal_container_rm_tree(*tmp);
    if (mkdir(*tmp, 0755) != 0) {
        int e = errno;
        /* name what the user gave: DST's parent missing or not writable */
        int rc = e == ENOENT ? shoal_err_set(err, -e, "cannot create '%s': its parent "
                                             "directory does not exist", dst)
                             : shoal_err_set(err, -e, "cannot create '%s' (the temporary "
                                             "directory for '%s'): %s", *tmp, dst,
                                             strerror(e));
        free(*tmp);
        *tmp = NULL;
        return rc;
    }
    return 0;
}

int shoal_container_sync_close(int fd, const char *path, int drop_cache,
                               struct shoal_err *err)
{
    int rc = 0;
    if (fsync(fd) != 0) {
        int e = errno;
        rc = shoal_err_set(err, -e, "cannot sync '%s': %s", path, strerror(e));
    }
#ifdef POSIX_FADV_DONTNEED
    if (drop_cache)
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
#else
    (void)drop_cache;
#endif
    if (close(fd) != 0 && !rc) {
        int e = errno;
        rc = shoal_err_set(err, -e, "cannot close '%s': %s", path, strerror(e));
    }
    return rc;
}

int shoal_container_write_json(json_t *j, const char *path, struct shoal_err *err)
{
    if (json_dump_file(j, path, JSON_INDENT(1)) != 0)
        return shoal_err_set(err, SHOAL_EIO, "cannot write '%s'", path);
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    return 0;
}

/* Rename the finished directory tmp to dst. With replace, an existing dst
 * (already checked to be a container that may be replaced) is moved aside
 * first and put back if the rename fails, then removed. Without it, a dst
 * that appeared while we wrote (another process converting the same
 * model) is left alone: rename() refuses to replace a non-empty directory,
 * so readers of that dst never see it vanish. */
int shoal_container_publish_dir(const char *tmp, const char *dst, int replace,
                                struct shoal_err *err)
{
    int rc = 0;
    if (!replace) {
        if (rename(tmp, dst) != 0) {
            int e = errno;
            rc = shoal_err_set(err, -e, "cannot publish '%s': %s%s", dst, strerror(e),
                               e == EEXIST || e == ENOTEMPTY
                                   ? " (it appeared while converting)" : "");
        }
        return rc;
    }
    if (shoal_exists(dst)) {
        size_t dl = strlen(dst);
        char *old = shoal_xmalloc(dl + 32);
        snprintf(old, dl + 32, "%s.old-%ld", dst, (long)getpid());
        if (rename(dst, old) != 0) {
            int e = errno;
            rc = shoal_err_set(err, -e, "cannot move the old '%s' aside: %s", dst, strerror(e));
        } else if (rename(tmp, dst) != 0) {
            int e = errno;
            rename(old, dst);
            rc = shoal_err_set(err, -e, "cannot publish '%s': %s", dst, strerror(e));
        } else {
            shoal_container_rm_tree(old);
        }
        free(old);
    } else if (rename(tmp, dst) != 0) {
        int e = errno;
        rc = shoal_err_set(err, -e, "cannot publish '%s': %s", dst, strerror(e));
    }
    return rc;
}

/* Never let a conversion destroy its source or an unrelated directory:
 * the destination may not be the source or contain it, and --force only
 * replaces an existing shoal container. */
int container_check_destination(const char *src_dir, const char *dst, int force,
                             struct shoal_err *err)
{
    char src_real[PATH_MAX], dst_real[PATH_MAX];
    if (!realpath(src_dir, src_real)) {
        int e = errno;
        return shoal_err_set(err, -e, "cannot resolve '%s': %s", src_dir, strerror(e));
    }
    if (realpath(dst, dst_real)) {
        size_t dl = strlen(dst_real);
        if (!strcmp(dst_real, src_real) ||
            (!strncmp(src_real, dst_real, dl) && (src_real[dl] == '/' || dl == 1)))
            return shoal_err_set(err, SHOAL_EINVAL,
                                 "destination '%s' is the source or contains it; choose "
                                 "another path", dst);
        if (!force)
            return shoal_err_set(err, SHOAL_EINVAL,
                                 "'%s' already exists; pass --force to replace it", dst);
        if (!shoal_container_is(dst))
            return shoal_err_set(err, SHOAL_EINVAL,
                                 "'%s' exists and is not a shoal container (no shoal.json); "
                                 "refusing to replace it, even with --force", dst);
    }
    return 0;
}

int shoal_container_convert(const struct shoal_model *src, const char *src_dir,
                            const char *dst_arg, const struct shoal_convert_params *p,
                            struct shoal_err *err)
{
    /* "out/" and "out" name the same directory; rename() wants the latter */
    char dst_buf[PATH_MAX];
    snprintf(dst_buf, sizeof dst_buf, "%s", dst_arg);
    for (size_t n = strlen(dst_buf); n > 1 && dst_buf[n - 1] == '/'; n--)
        dst_buf[n - 1] = '\0';
    const char *dst = dst_buf;
    if (!shoal_quant_group_ok(p->group))
        return shoal_err_set(err, SHOAL_EINVAL, "--group %d: expected 32, 64 or 128", p->group);
    if (!shoal_kv_dtype_ok(p->kv_dtype))
        return shoal_err_set(err, SHOAL_EINVAL, "--kv %s: expected f32, f16 or bf16",
                             shoal_dtype_name(p->kv_dtype));
    if (p->dense_dtype == SHOAL_DTYPE_F16 || p->experts_dtype == SHOAL_DTYPE_F16)
        return shoal_err_set(err, SHOAL_EINVAL,
                             "unsupported conversion: experts %s, dense %s (experts and "
                             "dense: int4a8|int4|int8|bf16|f32)",
                             shoal_dtype_name(p->experts_dtype), shoal_dtype_name(p->dense_dtype));
    int rc0 = container_check_destination(src_dir, dst, p->force, err);
    if (rc0)
        return rc0;
    char *tmp;
    int rc1 = shoal_container_make_tmp(dst, &tmp, err);
    if (rc1)
        return rc1;
    struct writer wr = {.src = src, .p = p, .err = err, .fd_dense = -1, .fd_exp = -1,
                        .cur_layer = -1};
    shoal_container_layout_init(&wr.lay, &src->cfg);
    if (p->experts_dtype == SHOAL_DTYPE_GGML)   /* a GGUF's types may differ per layer */
        shoal_container_layout_per_layer(&wr.lay, src->cfg.n_layer);
    wr.dense_path = shoal_path_join(tmp, "dense.bin");
    wr.exp_path = shoal_path_join(tmp, "experts.bin");
    wr.tensors = json_array();
    wr.layers = json_array();
    wr.fp = XXH64_createState();
    XXH64_reset(wr.fp, 0);
    char *manifest_tmp = shoal_path_join(tmp, "shoal.json");
    json_t *manifest = NULL;
    int rc = 0;
    /* the walker needs a mutable model; it only reads the views */
    struct shoal_model *m = (struct shoal_model *)src;

    wr.pass = 0;
    if ((rc = shoal_model_walk(m, write_slot, &wr)))
        goto fail;
    const int egroup = p->experts_dtype == SHOAL_DTYPE_GGML ? 0   /* per component */
                                                            : target_group(p->experts_dtype, p);
    wr.blob = shoal_xcalloc(1, wr.lay.blob_bytes ? wr.lay.blob_bytes : 1);
    wr.fd_dense = open(wr.dense_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    wr.fd_exp = open(wr.exp_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (wr.fd_dense < 0 || wr.fd_exp < 0) {
        int e = errno;
        rc = shoal_err_set(err, -e, "cannot create files in '%s': %s", tmp, strerror(e));
        goto fail;
    }
    wr.dense_off = SHOAL_CONTAINER_HEADER_BYTES;
    wr.exp_off = SHOAL_CONTAINER_HEADER_BYTES;
    shoal_container_fp_head(wr.fp, src->cfg.family->model_type, p->experts_dtype, egroup,
                            wr.lay.blob_bytes);
    for (int64_t il = 0; wr.lay.layer && il < src->cfg.n_layer; il++)
        if (wr.lay.layer[il].blob_bytes)
            shoal_container_fp_layout(wr.fp, il, &wr.lay.layer[il], wr.lay.n_comp);
    wr.pass = 1;
    if ((rc = shoal_model_walk(m, write_slot, &wr)))
        goto fail;
    flush_layer(&wr);
    if (src->n_mtp > 0 && (rc = shoal_model_walk_mtp(m, write_mtp_slot, &wr)))
        goto fail;
    uint64_t fingerprint = XXH64_digest(wr.fp);
    uint64_t dense_bytes = align_up(wr.dense_off, SHOAL_CONTAINER_ALIGN);
    if (ftruncate(wr.fd_dense, (off_t)dense_bytes) != 0) {
        int e = errno;
        rc = shoal_err_set(err, -e, "cannot size '%s': %s", wr.dense_path, strerror(e));
        goto fail;
    }
    if ((rc = shoal_container_write_header(wr.fd_dense, MAGIC_DENSE, dense_bytes, fingerprint,
                           wr.dense_path, err)) ||
        (rc = shoal_container_write_header(wr.fd_exp, MAGIC_EXPERTS, wr.exp_off, fingerprint,
                           wr.exp_path, err)))
        goto fail;
    rc = shoal_container_sync_close(wr.fd_dense, wr.dense_path, 0, err);
    wr.fd_dense = -1;
    if (!rc)
        rc = shoal_container_sync_close(wr.fd_exp, wr.exp_path, 0, err);
    wr.fd_exp = -1;
    if (rc)
        goto fail;

    /* side files, then the manifest last: a container without a complete
     * manifest is never valid */
    json_error_t jerr;
    json_t *config = NULL, *files = NULL;
    if (src->gguf) {
        if ((rc = write_gguf_side_files(src, tmp, &config, &files, err)))
            goto fail;
    } else {
        char *cfg_src = shoal_path_join(src_dir, "config.json");
        config = json_load_file(cfg_src, 0, &jerr);
        free(cfg_src);
        if (!config) {
            rc = shoal_err_set(err, SHOAL_EFORMAT, "cannot re-read config.json: %s", jerr.text);
            goto fail;
        }
        files = json_array();   /* FORMAT.md: the side files copied, a list */
    }
    for (size_t i = 0; !src->gguf &&
                       i < sizeof container_side_files / sizeof container_side_files[0]; i++) {
        char *from = shoal_path_join(src_dir, container_side_files[i]);
        if (shoal_exists(from)) {
            char *to = shoal_path_join(tmp, container_side_files[i]);
            rc = container_copy_file(from, to, err);
            free(to);
            if (!rc)
                json_array_append_new(files, json_string(container_side_files[i]));
        }
        free(from);
        if (rc) {
            json_decref(files);
            json_decref(config);
            goto fail;
        }
    }
    const struct shoal_container_manifest_params mp = {
        .model_type = src->cfg.family->model_type, .fingerprint = fingerprint,
        .kv = shoal_kv_dtype_name(p->kv_dtype), .config = config, .files = files,
        .tensors = wr.tensors, .layers = wr.layers, .dense_bytes = dense_bytes,
        .experts_bytes = wr.exp_off, .experts_dtype = p->experts_dtype,
        .experts_group = egroup, .cfg = &src->cfg};
    manifest = shoal_container_manifest(&wr.lay, &mp);
    json_decref(config);
    wr.tensors = wr.layers = NULL; /* owned by manifest now */
    if (!manifest) {
        rc = shoal_err_set(err, SHOAL_EIO, "cannot write '%s'", manifest_tmp);
        goto fail;
    }
    if ((rc = shoal_container_write_json(manifest, manifest_tmp, err)))
        goto fail;
    if ((rc = shoal_container_publish_dir(tmp, dst, p->force, err)))
        goto fail;
    goto done;
fail:
    if (wr.fd_dense >= 0)
        close(wr.fd_dense);
    if (wr.fd_exp >= 0)
        close(wr.fd_exp);
    shoal_container_rm_tree(tmp);
done:
    shoal_container_layout_free(&wr.lay);
    json_decref(manifest);
    json_decref(wr.tensors);
    json_decref(wr.layers);
    json_decref(wr.cur_layer_sums);
    XXH64_freeState(wr.fp);
    free(wr.blob);
    free(wr.chunk);
    free(wr.dense_path);
    free(wr.exp_path);
    free(manifest_tmp);
    free(tmp);
    return rc;
}

