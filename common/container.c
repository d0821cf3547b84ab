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

#include "kv.h"
#include "quant.h"
#include "util.h"

#define DENSE_ALIGN 64
const char shoal_container_magic_dense[8] = {'S', 'H', 'O', 'A', 'L', 'D', 'N', 'S'};
const char shoal_container_magic_experts[8] = {'S', 'H', 'O', 'A', 'L', 'E', 'X', 'P'};
#define MAGIC_DENSE shoal_container_magic_dense
#define MAGIC_EXPERTS shoal_container_magic_experts

/* Files copied verbatim from the source checkpoint when present. */
static const char *const side_files[] = {
    "config.json", "tokenizer.json", "tokenizer_config.json",
    "generation_config.json", "chat_template.jinja", "special_tokens_map.json",
    "tiktoken.model", /* Kimi-K2's tokenizer (no tokenizer.json) */
};

static uint64_t align_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* Target dtype of a slot for the chosen conversion (shoal_target_dtype).
 * FP8 keeps the source's precision: an FP8 tensor as it is (codes and block
 * scales), a dense tensor that is not FP8 in the source (DeepSeek's
 * embeddings, norms, routers) at its own dtype (F16, which containers do
 * not store, as F32: exact), since shoal never quantizes to FP8. MXFP4
 * likewise (gpt-oss's experts are MXFP4, its trunk BF16). */
static enum shoal_dtype target_dtype(const struct shoal_weight_slot *s,
                                     const struct shoal_convert_params *p)
{
    enum shoal_dtype t =
        shoal_target_dtype(s->kind, s->cols, s->router, p->experts_dtype, p->dense_dtype);
    if ((t == SHOAL_DTYPE_FP8 || t == SHOAL_DTYPE_MXFP4) && s->kind == SHOAL_SLOT_DENSE &&
        s->w->dtype != t)
        t = s->w->dtype == SHOAL_DTYPE_BF16 ? SHOAL_DTYPE_BF16 : SHOAL_DTYPE_F32;
    return t;
}

/* The group (FP8: block edge; MXFP4: 32) a tensor of dtype t is written
 * with. */
static int target_group(enum shoal_dtype t, const struct shoal_convert_params *p)
{
    return t == SHOAL_DTYPE_FP8 ? SHOAL_FP8_BLOCK
           : t == SHOAL_DTYPE_MXFP4 ? SHOAL_MXFP4_BLOCK : p->group;
}

/* The group the manifest and the fingerprint record: 0 for float dtypes. */
static int recorded_group(enum shoal_dtype t, int group)
{
    return shoal_dtype_is_quant(t) || t == SHOAL_DTYPE_FP8 || t == SHOAL_DTYPE_MXFP4 ? group
                                                                                      : 0;
}

/* 1 for the checkpoint-native dtypes shoal keeps but never makes. */
static int native_only(enum shoal_dtype t)
{
    return t == SHOAL_DTYPE_FP8 || t == SHOAL_DTYPE_MXFP4;
}

static uint64_t target_bytes(const struct shoal_weight_slot *s, enum shoal_dtype t,
                             int group)
{
    struct shoal_weight w = {.dtype = t, .rows = s->cols ? s->rows : 1,
                             .cols = s->cols ? s->cols : s->rows, .group = group};
    return (uint64_t)shoal_weight_bytes(&w);
}

/* One line of the canonical text the fingerprint hashes (writer and
 * reader build the same lines). */
static void fp_line(XXH64_state_t *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fp_line(XXH64_state_t *st, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    XXH64_update(st, buf, (size_t)n);
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
    uint64_t blob_bytes;
    uint64_t comp_off[6], comp_bytes[6];
    enum shoal_dtype comp_dtype[6];
    int comp_group[6];
    int n_comp;                    /* shoal_expert_n_comp */
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
    if ((src->dtype == SHOAL_DTYPE_FP8 || src->dtype == SHOAL_DTYPE_MXFP4) && t != src->dtype) {
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
                              .group = target_group(t, wr->p)};
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
    for (int64_t r0 = 0; r0 < src->rows && !rc; r0 += rows_per) {
        int64_t r1 = r0 + rows_per < src->rows ? r0 + rows_per : src->rows;
        size_t n = (size_t)(r1 - r0) * row_bytes;
        rc = convert_rows(src, t, tw.group, r0, r1, wr->chunk, s->hf_name, &tmp, wr->err);
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


static json_t *shape_json(const struct shoal_weight_slot *s)
{
    return s->cols ? json_pack("[II]", (json_int_t)s->rows, (json_int_t)s->cols)
                   : json_pack("[I]", (json_int_t)s->rows);
}

static int flush_layer(struct writer *wr)
{
    if (wr->cur_layer >= 0 && wr->cur_layer_sums) {
        json_t *l = json_pack("{s:I, s:I, s:o}", "layer", (json_int_t)wr->cur_layer,
                              "offset", (json_int_t)(wr->exp_off -
                                  json_array_size(wr->cur_layer_sums) * wr->blob_bytes),
                              "xxh64", wr->cur_layer_sums);
        json_array_append_new(wr->layers, l);
        wr->cur_layer_sums = NULL;
    }
    return 0;
}

static int write_slot(const struct shoal_weight_slot *s, void *user)
{
    struct writer *wr = user;
    if (!s->w->data)
        return 0; /* optional and absent */
    enum shoal_dtype t = target_dtype(s, wr->p);
    const int group = target_group(t, wr->p);
    uint64_t bytes = target_bytes(s, t, group);
    if (wr->pass == 0) {
        if (native_only(t) && s->w->dtype != t)
            return shoal_err_set(wr->err, SHOAL_EUNSUPPORTED,
                                 "--experts %s: expert tensor '%s' is %s in the source; "
                                 "%s keeps %s source weights only (choose int4a8|int4|"
                                 "int8|bf16|f32)", t == SHOAL_DTYPE_FP8 ? "fp8" : "mxfp4",
                                 s->hf_name, shoal_dtype_name(s->w->dtype),
                                 shoal_dtype_name(t), shoal_dtype_name(t));
        wr->total += bytes;
        if (s->kind == SHOAL_SLOT_EXPERT && s->il == 0 && s->ie == 0) {
            /* lay out one blob from the first expert's shapes */
        }
        if (s->kind == SHOAL_SLOT_EXPERT && wr->blob_bytes == 0) {
            wr->comp_off[s->comp] = s->comp ? align_up(wr->comp_off[s->comp - 1] +
                                                       wr->comp_bytes[s->comp - 1],
                                                       DENSE_ALIGN) : 0;
            wr->comp_bytes[s->comp] = bytes;
            wr->comp_dtype[s->comp] = t;
            wr->comp_group[s->comp] = recorded_group(t, group);
            if (s->comp == wr->n_comp - 1)
                wr->blob_bytes = align_up(wr->comp_off[s->comp] + bytes,
                                          SHOAL_CONTAINER_ALIGN);
        }
        return 0;
    }
    int rc;
    uint64_t xxh = 0;
    if (s->kind == SHOAL_SLOT_DENSE) {
        uint64_t off = align_up(wr->dense_off, DENSE_ALIGN);
        rc = write_tensor(wr, s, t, wr->fd_dense, wr->dense_path, off, &xxh);
        if (rc)
            return rc;
        json_t *o = json_pack("{s:s, s:s, s:o, s:I, s:I, s:s}", "name", s->name,
                              "dtype", shoal_dtype_name(t), "shape", shape_json(s),
                              "offset", (json_int_t)off, "bytes", (json_int_t)bytes,
                              "xxh64", "");
        char hex[17];
        snprintf(hex, sizeof hex, "%016" PRIx64, xxh);
        json_object_set_new(o, "xxh64", json_string(hex));
        if (recorded_group(t, group))
            json_object_set_new(o, "group", json_integer(group));
        json_array_append_new(wr->tensors, o);
        fp_line(wr->fp, "dense %s %s %lld %lld %d %s\n", s->name, shoal_dtype_name(t),
               (long long)s->rows, (long long)s->cols, recorded_group(t, group), hex);
        wr->dense_off = off + bytes;
    } else {
        if (s->il != wr->cur_layer) {
            flush_layer(wr);
            wr->cur_layer = s->il;
            wr->cur_layer_sums = json_array();
        }
        if (s->comp == 0)
            memset(wr->blob, 0, wr->blob_bytes);
        rc = write_tensor(wr, s, t, -1, NULL, wr->comp_off[s->comp], &xxh);
        if (rc)
            return rc;
        if (s->comp == wr->n_comp - 1) {
            uint64_t sum = XXH64(wr->blob, wr->blob_bytes, 0);
            rc = shoal_pwrite_all(wr->fd_exp, wr->blob, wr->blob_bytes, wr->exp_off,
                           wr->exp_path, wr->err);
            if (rc)
                return rc;
            char hex[17];
            snprintf(hex, sizeof hex, "%016" PRIx64, sum);
            json_array_append_new(wr->cur_layer_sums, json_string(hex));
            fp_line(wr->fp, "expert %lld %lld %s\n", (long long)s->il, (long long)s->ie, hex);
            wr->exp_off += wr->blob_bytes;
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

static int copy_file(const char *from, const char *to, struct shoal_err *err)
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

static void rm_tree(const char *dir)
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

static int sync_close(int fd, const char *path, struct shoal_err *err)
{
    int rc = 0;
    if (fsync(fd) != 0) {
        int e = errno;
        rc = shoal_err_set(err, -e, "cannot sync '%s': %s", path, strerror(e));
    }
    if (close(fd) != 0 && !rc) {
        int e = errno;
        rc = shoal_err_set(err, -e, "cannot close '%s': %s", path, strerror(e));
    }
    return rc;
}

/* Rename the finished directory tmp to dst. With replace, an existing dst
 * (already checked to be a container that may be replaced) is moved aside
 * first and put back if the rename fails, then removed. Without it, a dst
 * that appeared while we wrote (another process converting the same
 * model) is left alone: rename() refuses to replace a non-empty directory,
 * so readers of that dst never see it vanish. */
static int publish_dir(const char *tmp, const char *dst, int replace, struct shoal_err *err)
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
            rm_tree(old);
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
static int check_destination(const char *src_dir, const char *dst, int force,
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
    int rc0 = check_destination(src_dir, dst, p->force, err);
    if (rc0)
        return rc0;
    size_t dl = strlen(dst);
    char *tmp = shoal_xmalloc(dl + 32);
    snprintf(tmp, dl + 32, "%s.tmp-%ld", dst, (long)getpid());
    rm_tree(tmp);
    if (mkdir(tmp, 0755) != 0) {
        int e = errno;
        int rc = shoal_err_set(err, -e, "cannot create '%s': %s", tmp, strerror(e));
        free(tmp);
        return rc;
    }
    struct writer wr = {.src = src, .p = p, .err = err, .fd_dense = -1, .fd_exp = -1,
                        .cur_layer = -1, .n_comp = shoal_expert_n_comp(&src->cfg)};
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
    const int egroup = target_group(p->experts_dtype, p);
    wr.blob = shoal_xcalloc(1, wr.blob_bytes ? wr.blob_bytes : 1);
    wr.fd_dense = open(wr.dense_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    wr.fd_exp = open(wr.exp_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (wr.fd_dense < 0 || wr.fd_exp < 0) {
        int e = errno;
        rc = shoal_err_set(err, -e, "cannot create files in '%s': %s", tmp, strerror(e));
        goto fail;
    }
    wr.dense_off = SHOAL_CONTAINER_HEADER_BYTES;
    wr.exp_off = SHOAL_CONTAINER_HEADER_BYTES;
    fp_line(wr.fp, "shoal-container %d %s experts %s %d %" PRIu64 "\n",
           SHOAL_CONTAINER_VERSION, src->cfg.family->model_type,
           shoal_dtype_name(p->experts_dtype), egroup, wr.blob_bytes);
    wr.pass = 1;
    if ((rc = shoal_model_walk(m, write_slot, &wr)))
        goto fail;
    flush_layer(&wr);
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
    rc = sync_close(wr.fd_dense, wr.dense_path, err);
    wr.fd_dense = -1;
    if (!rc)
        rc = sync_close(wr.fd_exp, wr.exp_path, err);
    wr.fd_exp = -1;
    if (rc)
        goto fail;

    /* side files, then the manifest last: a container without a complete
     * manifest is never valid */
    char *cfg_src = shoal_path_join(src_dir, "config.json");
    json_error_t jerr;
    json_t *config = json_load_file(cfg_src, 0, &jerr);
    free(cfg_src);
    if (!config) {
        rc = shoal_err_set(err, SHOAL_EFORMAT, "cannot re-read config.json: %s", jerr.text);
        goto fail;
    }
    json_t *files = json_object();
    for (size_t i = 0; i < sizeof side_files / sizeof side_files[0]; i++) {
        char *from = shoal_path_join(src_dir, side_files[i]);
        if (shoal_exists(from)) {
            char *to = shoal_path_join(tmp, side_files[i]);
            rc = copy_file(from, to, err);
            free(to);
            if (!rc)
                json_array_append_new(files, json_string(side_files[i]));
        }
        free(from);
        if (rc) {
            json_decref(files);
            json_decref(config);
            goto fail;
        }
    }
    char fph[17];
    snprintf(fph, sizeof fph, "%016" PRIx64, fingerprint);
    json_t *comps = json_array();
    static const char *cn[6] = {"w_gate", "w_up", "w_down", "b_gate", "b_up", "b_down"};
    for (int c = 0; c < wr.n_comp && wr.blob_bytes; c++) {
        json_t *jc = json_pack("{s:s, s:I, s:I}", "name", cn[c],
                               "offset", (json_int_t)wr.comp_off[c],
                               "bytes", (json_int_t)wr.comp_bytes[c]);
        if (c >= 3)   /* the biases' own dtype (the weights': experts.dtype) */
            json_object_set_new(jc, "dtype", json_string(shoal_dtype_name(wr.comp_dtype[c])));
        json_array_append_new(comps, jc);
    }
    manifest = json_pack(
        "{s:s, s:i, s:s, s:s, s:s, s:o, s:o, s:{s:s, s:I, s:o}, s:{s:s, s:I, s:s, s:i, s:I, s:I, s:I, s:o, s:o}}",
        "format", "shoal-container", "version", SHOAL_CONTAINER_VERSION,
        "model_type", src->cfg.family->model_type, "fingerprint", fph,
        "kv", shoal_kv_dtype_name(p->kv_dtype),
        "config", config, "files", files,
        "dense", "file", "dense.bin", "bytes", (json_int_t)dense_bytes, "tensors", wr.tensors,
        "experts", "file", "experts.bin", "bytes", (json_int_t)wr.exp_off,
        "dtype", shoal_dtype_name(p->experts_dtype), "group", egroup,
        "blob_bytes", (json_int_t)wr.blob_bytes,
        "n_layer", (json_int_t)src->cfg.n_layer, "n_expert", (json_int_t)src->cfg.n_expert,
        "components", comps, "layers", wr.layers);
    wr.tensors = wr.layers = NULL; /* owned by manifest now */
    if (!manifest || json_dump_file(manifest, manifest_tmp, JSON_INDENT(1)) != 0) {
        rc = shoal_err_set(err, SHOAL_EIO, "cannot write '%s'", manifest_tmp);
        goto fail;
    }
    int mfd = open(manifest_tmp, O_RDONLY);
    if (mfd >= 0) {
        fsync(mfd);
        close(mfd);
    }
    if ((rc = publish_dir(tmp, dst, p->force, err)))
        goto fail;
    goto done;
fail:
    if (wr.fd_dense >= 0)
        close(wr.fd_dense);
    if (wr.fd_exp >= 0)
        close(wr.fd_exp);
    rm_tree(tmp);
done:
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
    free(ct->expert_xxh64);
    free(ct->held);
    free(ct->held_rank);
    free(ct->shard.weights);
    free(ct->dir);
    free(ct->manifest_path);
    free(ct->dense_path);
    free(ct->experts_path);
    free(ct);
}

struct fp_walk {
    XXH64_state_t *st;
    const struct shoal_container *ct;
    size_t cursor;
};


/* The writer's canonical text (write_slot / fp_line), rebuilt from the
 * manifest in walk order. */
static int fp_slot(const struct shoal_weight_slot *s, void *user)
{
    struct fp_walk *f = user;
    const struct shoal_container *ct = f->ct;
    if (s->kind == SHOAL_SLOT_EXPERT) {
        if (s->comp == ct->n_comp - 1 && ct->layer_offset[s->il] != UINT64_MAX)
            fp_line(f->st, "expert %lld %lld %016" PRIx64 "\n", (long long)s->il,
                    (long long)s->ie, ct->expert_xxh64[s->il * ct->n_expert + s->ie]);
        return 0;
    }
    const struct shoal_container_tensor *t = NULL;
    if (f->cursor < ct->n_dense && !strcmp(ct->dense[f->cursor].name, s->name))
        t = &ct->dense[f->cursor++];
    for (size_t i = 0; !t && i < ct->n_dense; i++)
        if (!strcmp(ct->dense[i].name, s->name))
            t = &ct->dense[i];
    if (t)
        fp_line(f->st, "dense %s %s %lld %lld %d %016" PRIx64 "\n", s->name,
                shoal_dtype_name(t->w.dtype), (long long)s->rows, (long long)s->cols,
                recorded_group(t->w.dtype, t->w.group), t->xxh64);
    return 0;
}

static uint64_t recompute_fingerprint(const struct shoal_container *ct,
                                      const struct shoal_model_config *cfg)
{
    struct fp_walk f = {.st = XXH64_createState(), .ct = ct};
    XXH64_reset(f.st, 0);
    fp_line(f.st, "shoal-container %d %s experts %s %d %" PRIu64 "\n",
            SHOAL_CONTAINER_VERSION, cfg->family->model_type,
            shoal_dtype_name(ct->experts_dtype), ct->experts_group, ct->blob_bytes);
    struct shoal_model *m = shoal_xcalloc(1, sizeof *m);
    m->cfg = *cfg;
    shoal_model_alloc_layers(m);
    shoal_model_walk(m, fp_slot, &f);
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
        if (shoal_dtype_parse(dt, &ctt->w.dtype))
            FAIL("'%s': tensor '%s' has unknown dtype '%s'", mp, name, dt);
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
        ctt->offset = (uint64_t)json_integer_value(off);
        ctt->bytes = (uint64_t)json_integer_value(bytes);
        if (ctt->bytes != shoal_weight_bytes(&ctt->w))
            FAIL("'%s': tensor '%s' (%s) has %" PRIu64 " bytes; its shape needs %zu", mp,
                 name, dt, ctt->bytes, shoal_weight_bytes(&ctt->w));
        if (ctt->offset < SHOAL_CONTAINER_HEADER_BYTES || ctt->offset > ct->dense_size ||
            ctt->bytes > ct->dense_size - ctt->offset || ctt->offset % 4)
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
    if (shoal_dtype_parse(edt, &ct->experts_dtype))
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
        if (ct->blob_bytes == 0 || ct->blob_bytes % SHOAL_CONTAINER_ALIGN ||
            (int)json_array_size(comps) != ct->n_comp)
            FAIL("'%s': experts.blob_bytes must be a positive multiple of %d with %d "
                 "components (%s)", mp, SHOAL_CONTAINER_ALIGN, ct->n_comp,
                 cfg->family->model_type);
        if (shoal_dtype_is_quant(ct->experts_dtype) && !shoal_quant_group_ok(ct->experts_group))
            FAIL("'%s': experts have dtype %s and group %d; expected group 32, 64 or 128",
                 mp, edt, ct->experts_group);
        if (ct->experts_dtype == SHOAL_DTYPE_FP8 && ct->experts_group != SHOAL_FP8_BLOCK)
            FAIL("'%s': experts have dtype FP8 and group %d; expected block %d", mp,
                 ct->experts_group, SHOAL_FP8_BLOCK);
        if (ct->experts_dtype == SHOAL_DTYPE_MXFP4 && ct->experts_group != SHOAL_MXFP4_BLOCK)
            FAIL("'%s': experts have dtype MXFP4 and group %d; expected %d", mp,
                 ct->experts_group, SHOAL_MXFP4_BLOCK);
        static const int64_t one = 1;
        int64_t E = cfg->n_embd, F = cfg->n_ff_exp;
        /* weights, then gpt_oss's 1-D biases (rows 1), each with its own dtype */
        int64_t shapes[6][2] = {{F, E}, {F, E}, {E, F}, {1, F}, {1, F}, {1, E}};
        (void)one;
        for (int c = 0; c < ct->n_comp; c++) {
            json_t *jc = json_array_get(comps, (size_t)c);
            struct shoal_expert_component *k = &ct->comp[c];
            k->dtype = ct->experts_dtype;
            k->group = ct->experts_group;
            if (c >= 3) {
                const char *bd = json_string_value(json_object_get(jc, "dtype"));
                if (!bd || shoal_dtype_parse(bd, &k->dtype) ||
                    (k->dtype != SHOAL_DTYPE_F32 && k->dtype != SHOAL_DTYPE_BF16 &&
                     k->dtype != SHOAL_DTYPE_F16))
                    FAIL("'%s': expert component %d needs a dtype F32, F16 or BF16, found "
                         "'%s'", mp, c, bd ? bd : "(none)");
                k->group = 0;
            }
            k->rows = shapes[c][0];
            k->cols = shapes[c][1];
            k->offset = (uint64_t)json_integer_value(json_object_get(jc, "offset"));
            k->bytes = (uint64_t)json_integer_value(json_object_get(jc, "bytes"));
            struct shoal_weight w = {.dtype = k->dtype, .rows = k->rows, .cols = k->cols,
                                     .group = k->group};
            if ((shoal_dtype_is_quant(k->dtype) && !shoal_quant_group_ok(k->group)) ||
                (k->dtype == SHOAL_DTYPE_MXFP4 && k->cols % SHOAL_MXFP4_BLOCK) ||
                k->bytes != shoal_weight_bytes(&w) || k->offset > ct->blob_bytes ||
                k->bytes > ct->blob_bytes - k->offset || k->offset % 4)
                FAIL("'%s': expert component %d does not fit the %" PRIu64 "-byte blob "
                     "with shape [%lld, %lld] %s", mp, c, ct->blob_bytes,
                     (long long)k->rows, (long long)k->cols, edt);
        }
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
        uint64_t end = (uint64_t)off + ct->blob_bytes * (uint64_t)layer_held(ct, il);
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
};

static int bind_slot(const struct shoal_weight_slot *s, void *user)
{
    struct bind_ct *b = user;
    if (s->kind == SHOAL_SLOT_EXPERT) {
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
    if (want_dims == 1 && (shoal_dtype_is_quant(t->w.dtype) || native_only(t->w.dtype)))
        return shoal_err_set(b->err, SHOAL_EFORMAT, "'%s': 1-D tensor '%s' cannot be %s",
                             ct->manifest_path, s->name, shoal_dtype_name(t->w.dtype));
    *s->w = t->w;
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
    /* int8 / int4: every group scale finite (once here, as FP8's) */
    if (shoal_dtype_is_quant(t->w.dtype)) {
        struct shoal_err e = {0};
        if (shoal_weight_check_scales(&t->w, s->name, &e))
            return shoal_err_set(b->err, e.code, "'%s': %s", ct->dense_path, e.msg);
    }
    return 0;
}

int shoal_container_bind(struct shoal_container *ct, struct shoal_model *m,
                         struct shoal_err *err)
{
    if (!ct->dense_map)
        return shoal_err_set(err, SHOAL_EUNSUPPORTED,
                             "'%s' is a shard without dense tensors (made by shoal shard "
                             "without --with-dense); run the coordinator on the full "
                             "container", ct->dir);
    struct bind_ct b = {.ct = ct, .err = err};
    int rc = shoal_model_walk(m, bind_slot, &b);
    if (!rc && m->cfg.tie_embeddings)
        m->lm_head = m->tok_embd;
    return rc;
}

void shoal_container_expert_views(const struct shoal_container *ct,
                                  const void *blob, struct shoal_expert_weights *e)
{
    memset(e, 0, sizeof *e);   /* no biases, plain SwiGLU, unless gpt_oss */
    struct shoal_weight *w[6] = {&e->w_gate, &e->w_up, &e->w_down, &e->b_gate, &e->b_up,
                                 &e->b_down};
    e->swiglu_limit = ct->swiglu_limit;
    const int n_comp = ct->n_comp ? ct->n_comp : 3;   /* 0: a container made by hand */
    for (int c = 0; c < n_comp; c++) {
        const struct shoal_expert_component *k = &ct->comp[c];
        *w[c] = (struct shoal_weight){.dtype = k->dtype, .rows = k->rows, .cols = k->cols,
                                      .group = k->group,
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
    uint64_t total = ct->blob_bytes * (uint64_t)ct->n_held, done = 0;
    int rc = 0;
    for (int64_t il = 0; il < ct->n_layer && !rc; il++) {
        if (ct->layer_offset[il] == UINT64_MAX)
            continue;
        for (int64_t ie = 0; ie < ct->n_expert && !rc; ie++) {
            if (!shoal_container_holds(ct, il, ie))
                continue;
            uint64_t off = shoal_container_expert_offset(ct, il, ie);
            ssize_t got = pread(fd, buf, ct->blob_bytes, (off_t)off);
            if (got != (ssize_t)ct->blob_bytes) {
                rc = shoal_err_set(err, SHOAL_EIO, "short read of '%s' layer %lld expert "
                                   "%lld at offset %" PRIu64, ct->experts_path,
                                   (long long)il, (long long)ie, off);
                break;
            }
            uint64_t h = XXH64(buf, ct->blob_bytes, 0);
            uint64_t want = ct->expert_xxh64[il * ct->n_expert + ie];
            if (h != want)
                rc = shoal_err_set(err, SHOAL_EFORMAT,
                                   "checksum mismatch: '%s' layer %lld expert %lld at offset "
                                   "%" PRIu64 ": xxh64 %016" PRIx64 ", manifest %016" PRIx64,
                                   ct->experts_path, (long long)il, (long long)ie, off, h,
                                   want);
            done += ct->blob_bytes;
            if (progress)
                progress(done, total, user);
        }
    }
    free(buf);
    close(fd);
    return rc;
}

/* ---- shard writer (docs/FORMAT.md "Shards") ------------------------------ */

static int pread_full(int fd, void *buf, size_t n, uint64_t off, const char *path,
                      struct shoal_err *err)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (char *)buf + done, n - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            return shoal_err_set(err, -e, "cannot read '%s' at offset %" PRIu64 ": %s", path,
                                 off + done, strerror(e));
        }
        if (r == 0)
            return shoal_err_set(err, SHOAL_EIO, "'%s' ends at offset %" PRIu64 "; expected "
                                 "%zu more bytes (truncated?)", path, off + done, n - done);
        done += (size_t)r;
    }
    return 0;
}

/* Copy ct's dense.bin to path byte for byte, in 8 MiB chunks from the
 * mapping, after checking every tensor against its xxh64; each chunk's
 * source pages are dropped once written (bounded RSS). */
static int copy_dense(const struct shoal_container *ct, const char *path,
                      struct shoal_err *err)
{
    for (size_t i = 0; i < ct->n_dense; i++) {
        const struct shoal_container_tensor *t = &ct->dense[i];
        uint64_t h = XXH64(t->w.data, t->bytes, 0);
        if (h != t->xxh64)
            return shoal_err_set(err, SHOAL_EFORMAT,
                                 "checksum mismatch: '%s' tensor '%s' at offset %" PRIu64
                                 ": xxh64 %016" PRIx64 ", manifest %016" PRIx64,
                                 ct->dense_path, t->name, t->offset, h, t->xxh64);
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        int e = errno;
        return shoal_err_set(err, -e, "cannot create '%s': %s", path, strerror(e));
    }
    const size_t chunk = (size_t)8 << 20;
    int rc = 0;
    for (size_t off = 0; off < ct->dense_size && !rc; off += chunk) {
        size_t n = ct->dense_size - off < chunk ? ct->dense_size - off : chunk;
        rc = shoal_pwrite_all(fd, (const char *)ct->dense_map + off, n, off, path, err);
        madvise((char *)ct->dense_map + off, n, MADV_DONTNEED);   /* a hint; may fail */
    }
    if (rc) {
        close(fd);
        return rc;
    }
    return sync_close(fd, path, err);
}

/* Bytes of the regular files directly in dir. */
static uint64_t dir_bytes(const char *dir)
{
    uint64_t n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        char *p = shoal_path_join(dir, de->d_name);
        struct stat sb;
        if (stat(p, &sb) == 0 && S_ISREG(sb.st_mode))
            n += (uint64_t)sb.st_size;
        free(p);
    }
    closedir(d);
    return n;
}

static int check_shard_params(const struct shoal_container *ct,
                              const struct shoal_shard_params *p, struct shoal_err *err)
{
    if (ct->shard.count)
        return shoal_err_set(err, SHOAL_EINVAL, "'%s' is shard %d of %d; shard the full "
                             "container", ct->dir, ct->shard.index, ct->shard.count);
    if (p->count < 1 || p->index < 0 || p->index >= p->count || p->replicas < 1 ||
        p->replicas > p->count || !p->held)
        return shoal_err_set(err, SHOAL_EINVAL, "shard %d of %d with %d replicas: expected "
                             "0 <= index < count, 1 <= replicas <= count and a held set",
                             p->index, p->count, p->replicas);
    for (int i = 0; p->weights && i < p->count; i++)
        if (!(p->weights[i] > 0) || !isfinite(p->weights[i]))
            return shoal_err_set(err, SHOAL_EINVAL, "shard weight %d is %g; weights must be "
                                 "positive", i, p->weights[i]);
    for (int64_t il = 0; il < ct->n_layer; il++)
        for (int64_t ie = 0; ie < ct->n_expert; ie++)
            if (p->held[il * ct->n_expert + ie] && !shoal_container_holds(ct, il, ie))
                return shoal_err_set(err, SHOAL_EINVAL, "layer %lld expert %lld is not a "
                                     "routed expert of '%s'", (long long)il, (long long)ie,
                                     ct->dir);
    return 0;
}

/* Copy the held blobs into fd (experts.bin of the shard), layer by layer,
 * experts ascending, each checked against its xxh64; rewrite the manifest
 * layers' offsets and fill held_json. Returns 0 with *end = file bytes. */
static int copy_experts(const struct shoal_container *ct, const struct shoal_shard_params *p,
                        int fd, const char *path, json_t *layers, json_t *held_json,
                        uint64_t *end, struct shoal_err *err)
{
    const int64_t NE = ct->n_expert;
    int src = open(ct->experts_path, O_RDONLY | O_CLOEXEC);
    if (src < 0) {
        int e = errno;
        return shoal_err_set(err, -e, "cannot open '%s': %s", ct->experts_path, strerror(e));
    }
    uint64_t total = 0, done = 0;
    for (int64_t i = 0; i < ct->n_layer * NE; i++)
        total += p->held[i] ? ct->blob_bytes : 0;
    void *blob = NULL;
    if (posix_memalign(&blob, SHOAL_CONTAINER_ALIGN, (size_t)ct->blob_bytes) != 0) {
        close(src);
        return shoal_err_set(err, SHOAL_ENOMEM, "cannot allocate a %" PRIu64 "-byte blob",
                             ct->blob_bytes);
    }
    uint64_t off = SHOAL_CONTAINER_HEADER_BYTES;
    int rc = 0;
    for (int64_t il = 0; il < ct->n_layer && !rc; il++) {
        if (ct->layer_offset[il] == UINT64_MAX)
            continue;
        json_t *l = NULL;
        for (size_t i = 0; i < json_array_size(layers) && !l; i++)
            if (json_integer_value(json_object_get(json_array_get(layers, i), "layer")) == il)
                l = json_array_get(layers, i);
        if (!l) {
            rc = shoal_err_set(err, SHOAL_EFORMAT, "'%s': layer %lld is missing from "
                               "experts.layers", ct->manifest_path, (long long)il);
            break;
        }
        json_object_set_new(l, "offset", json_integer((json_int_t)off));
        json_t *ids = json_array();
        json_array_append_new(held_json, json_pack("{s:I, s:o}", "layer", (json_int_t)il,
                                                   "experts", ids));
        for (int64_t ie = 0; ie < NE && !rc; ie++) {
            if (!p->held[il * NE + ie])
                continue;
            uint64_t from = shoal_container_expert_offset(ct, il, ie);
            if ((rc = pread_full(src, blob, (size_t)ct->blob_bytes, from, ct->experts_path,
                                 err)))
                break;
            uint64_t h = XXH64(blob, (size_t)ct->blob_bytes, 0);
            uint64_t want = ct->expert_xxh64[il * NE + ie];
            if (h != want) {
                rc = shoal_err_set(err, SHOAL_EFORMAT, "checksum mismatch: '%s' layer %lld "
                                   "expert %lld at offset %" PRIu64 ": xxh64 %016" PRIx64
                                   ", manifest %016" PRIx64, ct->experts_path, (long long)il,
                                   (long long)ie, from, h, want);
                break;
            }
            if ((rc = shoal_pwrite_all(fd, blob, (size_t)ct->blob_bytes, off, path, err)))
                break;
            json_array_append_new(ids, json_integer((json_int_t)ie));
            off += ct->blob_bytes;
            done += ct->blob_bytes;
            if (p->progress)
                p->progress(done, total, p->progress_user);
        }
    }
    free(blob);
    close(src);
    *end = off;
    return rc;
}

int shoal_container_write_shard(const struct shoal_container *ct, const char *dst_arg,
                                const struct shoal_shard_params *p, uint64_t *bytes_out,
                                struct shoal_err *err)
{
    char dst_buf[PATH_MAX];
    snprintf(dst_buf, sizeof dst_buf, "%s", dst_arg);
    for (size_t n = strlen(dst_buf); n > 1 && dst_buf[n - 1] == '/'; n--)
        dst_buf[n - 1] = '\0';
    const char *dst = dst_buf;
    int rc = check_shard_params(ct, p, err);
    if (!rc && p->with_dense && !ct->dense_map)
        rc = shoal_err_set(err, SHOAL_EINVAL, "'%s' has no dense.bin to copy", ct->dir);
    if (!rc)
        rc = check_destination(ct->dir, dst, p->force, err);
    if (rc)
        return rc;
    json_error_t jerr;
    json_t *manifest = json_load_file(ct->manifest_path, 0, &jerr);
    if (!manifest)
        return shoal_err_set(err, SHOAL_EFORMAT, "'%s': malformed JSON at line %d: %s",
                             ct->manifest_path, jerr.line, jerr.text);
    size_t dl = strlen(dst);
    char *tmp = shoal_xmalloc(dl + 32);
    snprintf(tmp, dl + 32, "%s.tmp-%ld", dst, (long)getpid());
    rm_tree(tmp);
    char *exp_path = shoal_path_join(tmp, "experts.bin");
    char *manifest_path = shoal_path_join(tmp, "shoal.json");
    int fd = -1;
    if (mkdir(tmp, 0755) != 0) {
        int e = errno;
        rc = shoal_err_set(err, -e, "cannot create '%s': %s", tmp, strerror(e));
        free(tmp);
        tmp = NULL;   /* not ours to remove */
        goto fail;
    }
    json_t *ex = json_object_get(manifest, "experts");
    json_t *layers = json_object_get(ex, "layers");
    if (!json_is_array(layers)) {
        rc = shoal_err_set(err, SHOAL_EFORMAT, "'%s': experts.layers missing",
                           ct->manifest_path);
        goto fail;
    }
    fd = open(exp_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        int e = errno;
        rc = shoal_err_set(err, -e, "cannot create '%s': %s", exp_path, strerror(e));
        goto fail;
    }
    json_t *held_json = json_array();
    uint64_t end = 0;
    rc = copy_experts(ct, p, fd, exp_path, layers, held_json, &end, err);
    if (!rc)
        rc = shoal_container_write_header(fd, MAGIC_EXPERTS, end, ct->fingerprint, exp_path,
                                          err);
    if (rc) {
        json_decref(held_json);
        goto fail;
    }
    rc = sync_close(fd, exp_path, err);
    fd = -1;
    json_object_set_new(ex, "bytes", json_integer((json_int_t)end));
    json_t *weights = json_array();
    for (int i = 0; i < p->count; i++)
        json_array_append_new(weights, json_real(p->weights ? p->weights[i] : 1.0));
    json_object_set_new(manifest, "shard",
                        json_pack("{s:i, s:i, s:i, s:o, s:b, s:o}", "index", p->index,
                                  "count", p->count, "replicas", p->replicas,
                                  "weights", weights, "dense", p->with_dense != 0,
                                  "held", held_json));
    if (rc)
        goto fail;
    if (p->with_dense) {
        char *dense_path = shoal_path_join(tmp, "dense.bin");
        rc = copy_dense(ct, dense_path, err);
        free(dense_path);
        if (rc)
            goto fail;
    }
    for (size_t i = 0; i < sizeof side_files / sizeof side_files[0] && !rc; i++) {
        char *from = shoal_path_join(ct->dir, side_files[i]);
        if (shoal_exists(from)) {
            char *to = shoal_path_join(tmp, side_files[i]);
            rc = copy_file(from, to, err);
            free(to);
        }
        free(from);
    }
    if (rc)
        goto fail;
    /* the manifest last: a directory without it is never a container */
    if (json_dump_file(manifest, manifest_path, JSON_INDENT(1)) != 0) {
        rc = shoal_err_set(err, SHOAL_EIO, "cannot write '%s'", manifest_path);
        goto fail;
    }
    int mfd = open(manifest_path, O_RDONLY);
    if (mfd >= 0) {
        fsync(mfd);
        close(mfd);
    }
    uint64_t bytes = dir_bytes(tmp);
    if ((rc = publish_dir(tmp, dst, p->force, err)))
        goto fail;
    if (bytes_out)
        *bytes_out = bytes;
    goto done;
fail:
    if (fd >= 0)
        close(fd);
    if (tmp)
        rm_tree(tmp);
done:
    json_decref(manifest);
    free(exp_path);
    free(manifest_path);
    free(tmp);
    return rc;
}
