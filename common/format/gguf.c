#include "gguf.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ggml_types.h"
#include "util.h"

#define GGUF_DEFAULT_ALIGNMENT 32

struct gguf_kv {
    char *key;                 /* owned, NUL-terminated */
    enum shoal_gguf_type type; /* value type */
    enum shoal_gguf_type arr_type;
    uint64_t n;                /* array element count; 1 for scalars */
    union {
        uint64_t u;
        int64_t i;
        double f;
    } v;                       /* scalar value (bool, ints, floats) */
    char *str;                 /* string scalar, owned */
    uint64_t str_len;
    void *data;                /* numeric array, host order, owned */
    char *blob;                /* string array bytes, owned */
    char **strs;               /* [n] pointers into blob, owned */
    uint64_t *str_lens;        /* [n], owned */
};

struct gguf_tensor {
    char *name;
    uint32_t n_dims;
    uint64_t ne[SHOAL_GGUF_MAX_DIMS];
    uint32_t type;
    uint64_t offset; /* relative to the data section while parsing */
    uint64_t nbytes; /* bytes of data (ggml_types.h) */
};

struct shoal_gguf {
    uint32_t version;
    uint64_t n_kv;
    struct gguf_kv *kv;        /* [n_kv] (capacity cap_kv) */
    uint64_t n_tensors;
    struct gguf_tensor *tensors; /* [n_tensors] (capacity cap_tensors) */
    uint64_t cap_kv, cap_tensors;
    uint64_t alignment;        /* bytes */
    uint64_t data_offset;      /* absolute, bytes */
    uint64_t file_size;        /* bytes */
};

/* A bounded byte source: a FILE or a memory image. The header (metadata
 * and tensor descriptors) is parsed within limit = min(file size,
 * SHOAL_GGUF_MAX_HEADER_BYTES) bytes; every allocation is made for entries
 * already read (arrays grow as they are read), so memory stays a small
 * multiple of the header bytes actually read, whatever a count claims. */
struct src {
    FILE *f;
    const uint8_t *mem;
    uint64_t pos;   /* bytes consumed */
    uint64_t size;  /* the parse limit, bytes */
    uint64_t file_size; /* total bytes */
    const char *name;
    struct shoal_err *err;
};

static int host_is_le(void)
{
    const uint16_t one = 1;
    return *(const uint8_t *)&one == 1;
}

/* Check that n more bytes exist before reading (or allocating for) them. */
static int need(struct src *s, uint64_t n, const char *what)
{
    if (n > s->size - s->pos && s->size < s->file_size)
        return shoal_err_set(s->err, SHOAL_EFORMAT,
                             "gguf '%s': %s at offset %" PRIu64 " (%" PRIu64
                             " bytes) passes the header limit of %" PRIu64
                             " bytes; the metadata and tensor descriptors of a "
                             "GGUF file are expected to be far smaller",
                             s->name, what, s->pos, n, s->size);
    if (n > s->size - s->pos)
        return shoal_err_set(s->err, SHOAL_EFORMAT,
                             "gguf '%s': truncated at offset %" PRIu64
                             ": need %" PRIu64 " bytes for %s, %" PRIu64
                             " left",
                             s->name, s->pos, n, what, s->size - s->pos);
    return 0;
}

static int rd(struct src *s, void *buf, uint64_t n, const char *what)
{
    int rc = need(s, n, what);
    if (rc)
        return rc;
    if (s->mem) {
        memcpy(buf, s->mem + s->pos, n);
    } else if (n > 0 && fread(buf, 1, n, s->f) != n) {
        int e = ferror(s->f) ? (errno ? errno : EIO) : EIO;
        return shoal_err_set(s->err, -e,
                             "gguf '%s': read of %" PRIu64
                             " bytes at offset %" PRIu64 " failed: %s",
                             s->name, n, s->pos, strerror(e));
    }
    s->pos += n;
    return 0;
}

static uint64_t le_u64(const uint8_t *b, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v |= (uint64_t)b[i] << (8 * i);
    return v;
}

static int rd_u32(struct src *s, uint32_t *out, const char *what)
{
    uint8_t b[4];
    int rc = rd(s, b, 4, what);
    if (rc == 0)
        *out = (uint32_t)le_u64(b, 4);
    return rc;
}

static int rd_u64(struct src *s, uint64_t *out, const char *what)
{
    uint8_t b[8];
    int rc = rd(s, b, 8, what);
    if (rc == 0)
        *out = le_u64(b, 8);
    return rc;
}

/* Read a GGUF string into a fresh NUL-terminated allocation. */
static int rd_str(struct src *s, char **out, uint64_t *len, const char *what)
{
    uint64_t n;
    int rc = rd_u64(s, &n, what);
    if (rc)
        return rc;
    if ((rc = need(s, n, what)))
        return rc;
    char *p = shoal_xmalloc((size_t)n + 1);
    if ((rc = rd(s, p, n, what))) {
        free(p);
        return rc;
    }
    p[n] = '\0';
    *out = p;
    if (len)
        *len = n;
    return 0;
}

/* A metadata key must be printable ASCII (the GGUF spec's rule), a tensor
 * name free of control bytes (the spec allows any UTF-8 there), and
 * neither may hold a NUL (the rest would be dropped silently): a damaged
 * one is refused here, with the first bad byte, rather than printed raw
 * inside a later message. */
static int check_name(struct src *s, const char *name, size_t len, const char *what,
                      uint64_t index, int ascii)
{
    for (size_t k = 0; k < len; k++) {
        const unsigned char c = (unsigned char)name[k];
        if (c < 0x20 || c == 0x7f || (ascii && c > 0x7e))
            return shoal_err_set(s->err, SHOAL_EFORMAT,
                                 "gguf '%s': %s %" PRIu64 " has byte 0x%02x at %zu (\"%.*s\" "
                                 "before it); expected %s (damaged file?)", s->name, what,
                                 index, c, k, (int)(k < 40 ? k : 40), name,
                                 ascii ? "printable ASCII" : "text without control bytes");
    }
    return 0;
}

/* Make room for entry i of an array that grows as entries are read
 * (capacity doubles), so a count in the file never sizes an allocation. */
static void *grow(void *p, uint64_t *cap, uint64_t i, size_t elem)
{
    if (i < *cap)
        return p;
    uint64_t c = *cap ? *cap * 2 : 16;
    p = shoal_xrealloc(p, (size_t)c * elem);
    memset((char *)p + (size_t)*cap * elem, 0, (size_t)(c - *cap) * elem);
    *cap = c;
    return p;
}

static size_t type_size(enum shoal_gguf_type t)
{
    switch (t) {
    case SHOAL_GGUF_TYPE_UINT8:
    case SHOAL_GGUF_TYPE_INT8:
    case SHOAL_GGUF_TYPE_BOOL: return 1;
    case SHOAL_GGUF_TYPE_UINT16:
    case SHOAL_GGUF_TYPE_INT16: return 2;
    case SHOAL_GGUF_TYPE_UINT32:
    case SHOAL_GGUF_TYPE_INT32:
    case SHOAL_GGUF_TYPE_FLOAT32: return 4;
    case SHOAL_GGUF_TYPE_UINT64:
    case SHOAL_GGUF_TYPE_INT64:
    case SHOAL_GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

const char *shoal_gguf_type_name(enum shoal_gguf_type t)
{
    static const char *const names[SHOAL_GGUF_TYPE_COUNT] = {
        "uint8", "int8",  "uint16", "int16", "uint32", "int32", "float32",
        "bool",  "string", "array", "uint64", "int64", "float64"};
    return (unsigned)t < SHOAL_GGUF_TYPE_COUNT ? names[t] : "unknown";
}

static void scalar_from_bytes(struct gguf_kv *kv, const uint8_t *b)
{
    size_t n = type_size(kv->type);
    uint64_t u = le_u64(b, (unsigned)n);
    switch (kv->type) {
    case SHOAL_GGUF_TYPE_INT8: kv->v.i = (int8_t)u; break;
    case SHOAL_GGUF_TYPE_INT16: kv->v.i = (int16_t)u; break;
    case SHOAL_GGUF_TYPE_INT32: kv->v.i = (int32_t)u; break;
    case SHOAL_GGUF_TYPE_INT64: kv->v.i = (int64_t)u; break;
    case SHOAL_GGUF_TYPE_FLOAT32: {
        uint32_t w = (uint32_t)u;
        float f;
        memcpy(&f, &w, 4);
        kv->v.f = f;
        break;
    }
    case SHOAL_GGUF_TYPE_FLOAT64: memcpy(&kv->v.f, &u, 8); break;
    default: kv->v.u = u; break;
    }
}

static void swap_elems(void *data, uint64_t n, size_t size)
{
    uint8_t *p = data;
    for (uint64_t i = 0; i < n; i++, p += size)
        for (size_t a = 0, b = size - 1; a < b; a++, b--) {
            uint8_t t = p[a];
            p[a] = p[b];
            p[b] = t;
        }
}

static int rd_string_array(struct src *s, struct gguf_kv *kv)
{
    /* Each element needs at least its 8-byte length: bound n first. */
    uint64_t n = kv->n;
    if (n > (s->size - s->pos) / 8)
        return shoal_err_set(s->err, SHOAL_EFORMAT,
                             "gguf '%s': key '%s' claims %" PRIu64
                             " strings at offset %" PRIu64
                             "; at most %" PRIu64 " fit in the %" PRIu64
                             " bytes left",
                             s->name, kv->key, n, s->pos,
                             (s->size - s->pos) / 8, s->size - s->pos);
    uint64_t *offs = NULL, cap_offs = 0, cap_lens = 0;
    size_t cap = 4096, len = 0;
    char *blob = shoal_xmalloc(cap);
    int rc = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t sl;
        if ((rc = rd_u64(s, &sl, "array string length")) ||
            (rc = need(s, sl, "array string")))
            break;
        offs = grow(offs, &cap_offs, i, sizeof *offs);
        kv->str_lens = grow(kv->str_lens, &cap_lens, i, sizeof *kv->str_lens);
        if (cap - len < sl + 1) {
            while (cap - len < sl + 1)
                cap *= 2;
            blob = shoal_xrealloc(blob, cap);
        }
        if ((rc = rd(s, blob + len, sl, "array string")))
            break;
        offs[i] = len;
        kv->str_lens[i] = sl;
        len += (size_t)sl;
        blob[len++] = '\0';
    }
    if (rc) {
        free(offs);
        free(blob);
        return rc;
    }
    kv->blob = blob;
    if (!kv->str_lens)
        kv->str_lens = shoal_xmalloc(sizeof *kv->str_lens);
    kv->strs = shoal_xmalloc((size_t)(n ? n : 1) * sizeof *kv->strs);
    for (uint64_t i = 0; i < n; i++)
        kv->strs[i] = blob + offs[i];
    free(offs);
    return 0;
}

/* Read a numeric array's n elements of es bytes, growing the buffer as
 * they are read (1 MiB at a time), never by the count alone. */
static int rd_numeric_array(struct src *s, struct gguf_kv *kv, size_t es)
{
    uint64_t bytes = kv->n * es, done = 0, cap = 0; /* n * es <= bytes left */
    int rc = 0;
    while (done < bytes) {
        uint64_t chunk = bytes - done < ((uint64_t)1 << 20) ? bytes - done : (uint64_t)1 << 20;
        if (done + chunk > cap) {
            cap = done + chunk > cap * 2 ? done + chunk : cap * 2;
            if (cap > bytes)
                cap = bytes;
            kv->data = shoal_xrealloc(kv->data, (size_t)cap);
        }
        if ((rc = rd(s, (char *)kv->data + done, chunk, kv->key)))
            return rc;
        done += chunk;
    }
    if (!kv->data)
        kv->data = shoal_xmalloc(1);
    return 0;
}

static int rd_value(struct src *s, struct gguf_kv *kv)
{
    int rc;
    if (kv->type == SHOAL_GGUF_TYPE_STRING)
        return rd_str(s, &kv->str, &kv->str_len, kv->key);
    if (kv->type == SHOAL_GGUF_TYPE_ARRAY) {
        uint32_t at;
        if ((rc = rd_u32(s, &at, "array element type")) ||
            (rc = rd_u64(s, &kv->n, "array count")))
            return rc;
        if (at >= SHOAL_GGUF_TYPE_COUNT || at == SHOAL_GGUF_TYPE_ARRAY)
            return shoal_err_set(s->err, SHOAL_EUNSUPPORTED,
                                 "gguf '%s': key '%s' has array element "
                                 "type %u; expected a scalar or string type",
                                 s->name, kv->key, at);
        kv->arr_type = (enum shoal_gguf_type)at;
        if (at == SHOAL_GGUF_TYPE_STRING)
            return rd_string_array(s, kv);
        size_t es = type_size(kv->arr_type);
        if (kv->n > (s->size - s->pos) / es)
            return shoal_err_set(s->err, SHOAL_EFORMAT,
                                 "gguf '%s': key '%s' claims %" PRIu64
                                 " %s elements at offset %" PRIu64
                                 "; only %" PRIu64 " bytes left",
                                 s->name, kv->key, kv->n,
                                 shoal_gguf_type_name(kv->arr_type), s->pos,
                                 s->size - s->pos);
        if ((rc = rd_numeric_array(s, kv, es)))
            return rc;
        if (!host_is_le() && es > 1)
            swap_elems(kv->data, kv->n, es);
        return 0;
    }
    size_t n = type_size(kv->type);
    if (n == 0)
        return shoal_err_set(s->err, SHOAL_EUNSUPPORTED,
                             "gguf '%s': key '%s' has value type %u; "
                             "expected 0..12",
                             s->name, kv->key, (unsigned)kv->type);
    uint8_t b[8];
    if ((rc = rd(s, b, n, kv->key)))
        return rc;
    scalar_from_bytes(kv, b);
    kv->n = 1;
    return 0;
}

static void kv_free(struct gguf_kv *kv)
{
    free(kv->key);
    free(kv->str);
    free(kv->data);
    free(kv->blob);
    free(kv->strs);
    free(kv->str_lens);
}

void shoal_gguf_close(struct shoal_gguf *g)
{
    if (!g)
        return;
    for (uint64_t i = 0; i < g->n_kv; i++)
        kv_free(&g->kv[i]);
    free(g->kv);
    for (uint64_t i = 0; i < g->n_tensors; i++)
        free(g->tensors[i].name);
    free(g->tensors);
    free(g);
}

static int parse_tensors(struct src *s, struct shoal_gguf *g,
                         uint64_t n_tensors)
{
    int rc;
    /* name length 8 + n_dims 4 + type 4 + offset 8 = 24 bytes minimum */
    if (n_tensors > (s->size - s->pos) / 24)
        return shoal_err_set(s->err, SHOAL_EFORMAT,
                             "gguf '%s': header claims %" PRIu64
                             " tensors; at most %" PRIu64
                             " descriptors fit in the %" PRIu64
                             " bytes left",
                             s->name, n_tensors, (s->size - s->pos) / 24,
                             s->size - s->pos);
    for (uint64_t i = 0; i < n_tensors; i++) {
        g->tensors = grow(g->tensors, &g->cap_tensors, i, sizeof *g->tensors);
        struct gguf_tensor *t = &g->tensors[i];
        g->n_tensors = i + 1; /* so close() frees what was read */
        uint64_t name_len = 0;
        if ((rc = rd_str(s, &t->name, &name_len, "tensor name")) ||
            (rc = check_name(s, t->name, (size_t)name_len, "tensor name", i, 0)) ||
            (rc = rd_u32(s, &t->n_dims, "tensor n_dims")))
            return rc;
        if (t->n_dims == 0 || t->n_dims > SHOAL_GGUF_MAX_DIMS)
            return shoal_err_set(s->err, SHOAL_EFORMAT,
                                 "gguf '%s': tensor '%s' has %u dims; "
                                 "expected 1..%d",
                                 s->name, t->name, t->n_dims,
                                 SHOAL_GGUF_MAX_DIMS);
        for (uint32_t d = 0; d < SHOAL_GGUF_MAX_DIMS; d++)
            t->ne[d] = 1;
        uint64_t total = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            if ((rc = rd_u64(s, &t->ne[d], "tensor dim")))
                return rc;
            if (t->ne[d] > (uint64_t)INT64_MAX ||
                (t->ne[d] && total > (uint64_t)INT64_MAX / t->ne[d]))
                return shoal_err_set(s->err, SHOAL_EFORMAT,
                                     "gguf '%s': tensor '%s' dim %u = %" PRIu64
                                     " overflows the element count",
                                     s->name, t->name, d, t->ne[d]);
            total *= t->ne[d];
        }
        if ((rc = rd_u32(s, &t->type, "tensor type")) ||
            (rc = rd_u64(s, &t->offset, "tensor offset")))
            return rc;
        char what[256];
        snprintf(what, sizeof what, "gguf '%s': tensor '%s'", s->name, t->name);
        if ((rc = shoal_ggml_nbytes(t->type, t->ne, t->n_dims, what, &t->nbytes, s->err)))
            return rc;
    }
    return 0;
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp(((const struct gguf_tensor *)a)->name,
                  ((const struct gguf_tensor *)b)->name);
}

/* Tensor names must be unique (as ggml's gguf reader requires). */
static int check_unique_tensors(struct src *s, const struct shoal_gguf *g)
{
    if (g->n_tensors < 2)
        return 0;
    struct gguf_tensor *c = shoal_xmalloc((size_t)g->n_tensors * sizeof *c);
    memcpy(c, g->tensors, (size_t)g->n_tensors * sizeof *c);
    qsort(c, (size_t)g->n_tensors, sizeof *c, cmp_tensor_name);
    int rc = 0;
    for (uint64_t i = 1; i < g->n_tensors && rc == 0; i++)
        if (strcmp(c[i - 1].name, c[i].name) == 0)
            rc = shoal_err_set(s->err, SHOAL_EFORMAT,
                               "gguf '%s': duplicate tensor name '%s'", s->name,
                               c[i].name);
    free(c);
    return rc;
}

static int cmp_key_ptr(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sort a copy of the key pointers: O(n log n) even for hostile counts. */
static int check_unique_keys(struct src *s, const struct shoal_gguf *g)
{
    if (g->n_kv < 2)
        return 0;
    char **keys = shoal_xmalloc((size_t)g->n_kv * sizeof *keys);
    for (uint64_t i = 0; i < g->n_kv; i++)
        keys[i] = g->kv[i].key;
    qsort(keys, (size_t)g->n_kv, sizeof *keys, cmp_key_ptr);
    int rc = 0;
    for (uint64_t i = 1; i < g->n_kv && rc == 0; i++)
        if (strcmp(keys[i - 1], keys[i]) == 0)
            rc = shoal_err_set(s->err, SHOAL_EFORMAT,
                               "gguf '%s': duplicate metadata key '%s'",
                               s->name, keys[i]);
    free(keys);
    return rc;
}

static struct shoal_gguf *parse(struct src *s)
{
    struct shoal_err *err = s->err;
    struct shoal_gguf *g = shoal_xcalloc(1, sizeof *g);
    uint8_t magic[4];
    uint64_t n_tensors = 0, n_kv = 0;
    if (rd(s, magic, 4, "magic"))
        goto fail;
    if (memcmp(magic, "GGUF", 4) != 0) {
        shoal_err_set(err, SHOAL_EFORMAT,
                      "gguf '%s': bad magic %02x %02x %02x %02x; expected "
                      "\"GGUF\"",
                      s->name, magic[0], magic[1], magic[2], magic[3]);
        goto fail;
    }
    if (rd_u32(s, &g->version, "version"))
        goto fail;
    if (g->version != 2 && g->version != 3) {
        if ((g->version & 0xFFFF) == 0 && g->version != 0)
            shoal_err_set(err, SHOAL_EUNSUPPORTED,
                          "gguf '%s': version field is 0x%08x; this looks "
                          "like a big-endian file, only little-endian is "
                          "supported",
                          s->name, g->version);
        else
            shoal_err_set(err, SHOAL_EUNSUPPORTED,
                          "gguf '%s': version %u; expected 2 or 3", s->name,
                          g->version);
        goto fail;
    }
    if (rd_u64(s, &n_tensors, "tensor count") ||
        rd_u64(s, &n_kv, "metadata count"))
        goto fail;
    /* key length 8 + type 4 + the smallest value 1 = 13 bytes minimum */
    if (n_kv > (s->size - s->pos) / 13) {
        shoal_err_set(err, SHOAL_EFORMAT,
                      "gguf '%s': header claims %" PRIu64
                      " metadata pairs; at most %" PRIu64
                      " fit in the %" PRIu64 " bytes left",
                      s->name, n_kv, (s->size - s->pos) / 13,
                      s->size - s->pos);
        goto fail;
    }
    for (uint64_t i = 0; i < n_kv; i++) {
        g->kv = grow(g->kv, &g->cap_kv, i, sizeof *g->kv);
        struct gguf_kv *kv = &g->kv[i];
        uint32_t type;
        g->n_kv = i + 1;
        uint64_t key_len = 0;
        if (rd_str(s, &kv->key, &key_len, "metadata key") ||
            check_name(s, kv->key, (size_t)key_len, "metadata key", i, 1) ||
            rd_u32(s, &type, "metadata value type"))
            goto fail;
        if (type >= SHOAL_GGUF_TYPE_COUNT) {
            shoal_err_set(err, SHOAL_EUNSUPPORTED,
                          "gguf '%s': key '%s' has value type %u; expected "
                          "0..12",
                          s->name, kv->key, type);
            goto fail;
        }
        kv->type = (enum shoal_gguf_type)type;
        if (rd_value(s, kv))
            goto fail;
    }
    if (check_unique_keys(s, g))
        goto fail;
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t ai = shoal_gguf_find(g, "general.alignment");
    if (ai >= 0) {
        const struct gguf_kv *kv = &g->kv[ai];
        if (kv->type != SHOAL_GGUF_TYPE_UINT32 || kv->v.u == 0 ||
            (kv->v.u & (kv->v.u - 1)) != 0) {
            shoal_err_set(err, SHOAL_EFORMAT,
                          "gguf '%s': general.alignment must be a uint32 "
                          "power of two; got %s %" PRIu64,
                          s->name, shoal_gguf_type_name(kv->type), kv->v.u);
            goto fail;
        }
        g->alignment = kv->v.u;
    }
    if (parse_tensors(s, g, n_tensors) || check_unique_tensors(s, g))
        goto fail;
    uint64_t pad = (g->alignment - s->pos % g->alignment) % g->alignment;
    g->data_offset = s->pos + pad;
    g->file_size = s->file_size;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        struct gguf_tensor *t = &g->tensors[i];
        /* Every tensor's bytes [data_offset + offset, + nbytes) lie inside
         * the file (a vocab-only file has no tensors at all). */
        if (t->offset % g->alignment != 0) {
            shoal_err_set(err, SHOAL_EFORMAT,
                          "gguf '%s': tensor '%s' data offset %" PRIu64
                          " is not a multiple of the alignment %" PRIu64,
                          s->name, t->name, t->offset, g->alignment);
            goto fail;
        }
        if (g->data_offset > s->file_size ||
            t->offset > s->file_size - g->data_offset) {
            shoal_err_set(err, SHOAL_EFORMAT,
                          "gguf '%s': tensor '%s' data offset %" PRIu64
                          " is past the end of the %" PRIu64
                          "-byte file (data section at %" PRIu64 ")",
                          s->name, t->name, t->offset, s->file_size, g->data_offset);
            goto fail;
        }
        if (t->nbytes > s->file_size - g->data_offset - t->offset) {
            shoal_err_set(err, SHOAL_EFORMAT,
                          "gguf '%s': tensor '%s' (%s) needs %" PRIu64
                          " bytes at file offset %" PRIu64 "; only %" PRIu64
                          " are left in the %" PRIu64 "-byte file (truncated?)",
                          s->name, t->name, shoal_ggml_type_name(t->type), t->nbytes,
                          g->data_offset + t->offset,
                          s->file_size - g->data_offset - t->offset, s->file_size);
            goto fail;
        }
        t->offset += g->data_offset;
    }
    return g;
fail:
    shoal_gguf_close(g);
    return NULL;
}

struct shoal_gguf *shoal_gguf_open(const char *path, struct shoal_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        shoal_err_set(err, -e, "gguf '%s': cannot open: %s", path,
                      strerror(e));
        return NULL;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        int e = errno;
        fclose(f);
        shoal_err_set(err, -e, "gguf '%s': fstat failed: %s", path,
                      strerror(e));
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        fclose(f);
        shoal_err_set(err, SHOAL_EINVAL, "gguf '%s': not a regular file",
                      path);
        return NULL;
    }
    struct src s = {.f = f, .file_size = (uint64_t)st.st_size, .name = path,
                    .err = err};
    s.size = s.file_size < SHOAL_GGUF_MAX_HEADER_BYTES ? s.file_size
                                                       : SHOAL_GGUF_MAX_HEADER_BYTES;
    struct shoal_gguf *g = parse(&s);
    fclose(f);
    return g;
}

struct shoal_gguf *shoal_gguf_open_mem(const void *data, size_t size,
                                       const char *name,
                                       struct shoal_err *err)
{
    struct src s = {.mem = data, .file_size = size,
                    .name = name ? name : "(memory)", .err = err};
    s.size = s.file_size < SHOAL_GGUF_MAX_HEADER_BYTES ? s.file_size
                                                       : SHOAL_GGUF_MAX_HEADER_BYTES;
    return parse(&s);
}

uint32_t shoal_gguf_version(const struct shoal_gguf *g) { return g->version; }
uint64_t shoal_gguf_n_kv(const struct shoal_gguf *g) { return g->n_kv; }
uint64_t shoal_gguf_n_tensors(const struct shoal_gguf *g)
{
    return g->n_tensors;
}
uint64_t shoal_gguf_data_offset(const struct shoal_gguf *g)
{
    return g->data_offset;
}
uint64_t shoal_gguf_alignment(const struct shoal_gguf *g) { return g->alignment; }
uint64_t shoal_gguf_file_size(const struct shoal_gguf *g) { return g->file_size; }

int64_t shoal_gguf_find(const struct shoal_gguf *g, const char *key)
{
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (g->kv[i].key && strcmp(g->kv[i].key, key) == 0)
            return (int64_t)i;
    return -1;
}

const char *shoal_gguf_key(const struct shoal_gguf *g, uint64_t i)
{
    return i < g->n_kv ? g->kv[i].key : NULL;
}

enum shoal_gguf_type shoal_gguf_kv_type(const struct shoal_gguf *g,
                                        uint64_t i)
{
    return i < g->n_kv ? g->kv[i].type : SHOAL_GGUF_TYPE_COUNT;
}

static const struct gguf_kv *lookup(const struct shoal_gguf *g,
                                    const char *key)
{
    int64_t i = shoal_gguf_find(g, key);
    return i < 0 ? NULL : &g->kv[i];
}

static int wrong_type(const struct gguf_kv *kv, const char *expected,
                      struct shoal_err *err)
{
    return shoal_err_set(err, SHOAL_EFORMAT,
                         "gguf key '%s' has type %s; expected %s", kv->key,
                         shoal_gguf_type_name(kv->type), expected);
}

static int is_int_type(enum shoal_gguf_type t)
{
    return t == SHOAL_GGUF_TYPE_UINT8 || t == SHOAL_GGUF_TYPE_INT8 ||
           t == SHOAL_GGUF_TYPE_UINT16 || t == SHOAL_GGUF_TYPE_INT16 ||
           t == SHOAL_GGUF_TYPE_UINT32 || t == SHOAL_GGUF_TYPE_INT32 ||
           t == SHOAL_GGUF_TYPE_UINT64 || t == SHOAL_GGUF_TYPE_INT64;
}

static int is_signed_type(enum shoal_gguf_type t)
{
    return t == SHOAL_GGUF_TYPE_INT8 || t == SHOAL_GGUF_TYPE_INT16 ||
           t == SHOAL_GGUF_TYPE_INT32 || t == SHOAL_GGUF_TYPE_INT64;
}

int shoal_gguf_get_int(const struct shoal_gguf *g, const char *key,
                       int64_t *out, struct shoal_err *err)
{
    const struct gguf_kv *kv = lookup(g, key);
    if (!kv)
        return SHOAL_ENOTFOUND;
    if (!is_int_type(kv->type))
        return wrong_type(kv, "an integer", err);
    if (!is_signed_type(kv->type) && kv->v.u > (uint64_t)INT64_MAX)
        return shoal_err_set(err, SHOAL_ERANGE,
                             "gguf key '%s' = %" PRIu64 " is out of range",
                             key, kv->v.u);
    *out = is_signed_type(kv->type) ? kv->v.i : (int64_t)kv->v.u;
    return 0;
}

int shoal_gguf_get_bool(const struct shoal_gguf *g, const char *key, int *out,
                        struct shoal_err *err)
{
    const struct gguf_kv *kv = lookup(g, key);
    if (!kv)
        return SHOAL_ENOTFOUND;
    if (kv->type != SHOAL_GGUF_TYPE_BOOL && !is_int_type(kv->type))
        return wrong_type(kv, "bool", err);
    *out = kv->v.u != 0;
    return 0;
}

int shoal_gguf_get_f64(const struct shoal_gguf *g, const char *key,
                       double *out, struct shoal_err *err)
{
    const struct gguf_kv *kv = lookup(g, key);
    if (!kv)
        return SHOAL_ENOTFOUND;
    if (kv->type != SHOAL_GGUF_TYPE_FLOAT32 &&
        kv->type != SHOAL_GGUF_TYPE_FLOAT64)
        return wrong_type(kv, "float32 or float64", err);
    *out = kv->v.f;
    return 0;
}

int shoal_gguf_get_str(const struct shoal_gguf *g, const char *key,
                       const char **out, size_t *len, struct shoal_err *err)
{
    const struct gguf_kv *kv = lookup(g, key);
    if (!kv)
        return SHOAL_ENOTFOUND;
    if (kv->type != SHOAL_GGUF_TYPE_STRING)
        return wrong_type(kv, "string", err);
    *out = kv->str;
    if (len)
        *len = (size_t)kv->str_len;
    return 0;
}

int shoal_gguf_get_array(const struct shoal_gguf *g, const char *key,
                         struct shoal_gguf_array *out, struct shoal_err *err)
{
    const struct gguf_kv *kv = lookup(g, key);
    if (!kv)
        return SHOAL_ENOTFOUND;
    if (kv->type != SHOAL_GGUF_TYPE_ARRAY)
        return wrong_type(kv, "array", err);
    out->type = kv->arr_type;
    out->n = kv->n;
    out->data = kv->data;
    out->strs = (const char *const *)kv->strs;
    out->str_lens = kv->str_lens;
    return 0;
}

int shoal_gguf_tensor(const struct shoal_gguf *g, uint64_t i,
                      struct shoal_gguf_tensor *out)
{
    if (i >= g->n_tensors)
        return SHOAL_ERANGE;
    const struct gguf_tensor *t = &g->tensors[i];
    out->name = t->name;
    out->n_dims = t->n_dims;
    memcpy(out->ne, t->ne, sizeof out->ne);
    out->type = t->type;
    out->offset = t->offset;
    out->nbytes = t->nbytes;
    return 0;
}

/* ---- writing the metadata alone ------------------------------------------ */

/* v as n little-endian bytes. */
static void put_le(FILE *f, uint64_t v, size_t n)
{
    uint8_t b[8];
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    fwrite(b, 1, n, f);
}

static void put_str(FILE *f, const char *s, uint64_t len)
{
    put_le(f, len, 8);
    fwrite(s, 1, (size_t)len, f);
}

/* Element i of a numeric array (host order, type_size(t) bytes) as the
 * integer its bytes spell. */
static uint64_t array_elem(const void *data, size_t size, uint64_t i)
{
    uint64_t v = 0;
    const uint8_t *p = (const uint8_t *)data + i * size;
    if (size == 1)
        v = p[0];
    else if (size == 2) {
        uint16_t x;
        memcpy(&x, p, 2);
        v = x;
    } else if (size == 4) {
        uint32_t x;
        memcpy(&x, p, 4);
        v = x;
    } else {
        memcpy(&v, p, 8);
    }
    return v;
}

static void put_scalar(FILE *f, const struct gguf_kv *kv)
{
    const size_t n = type_size(kv->type);
    if (kv->type == SHOAL_GGUF_TYPE_FLOAT32) {
        const float x = (float)kv->v.f;   /* read from a float32: exact */
        uint32_t w;
        memcpy(&w, &x, 4);
        put_le(f, w, 4);
    } else if (kv->type == SHOAL_GGUF_TYPE_FLOAT64) {
        uint64_t w;
        memcpy(&w, &kv->v.f, 8);
        put_le(f, w, 8);
    } else {
        put_le(f, is_signed_type(kv->type) ? (uint64_t)kv->v.i : kv->v.u, n);
    }
}

int shoal_gguf_write_meta(const struct shoal_gguf *g, const char *path, struct shoal_err *err)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return shoal_err_set(err, -errno, "cannot create '%s': %s", path, strerror(errno));
    uint64_t n_kv = 0;
    for (uint64_t i = 0; i < g->n_kv; i++)
        n_kv += strncmp(g->kv[i].key, "split.", 6) != 0;
    fwrite("GGUF", 1, 4, f);
    put_le(f, 3, 4);
    put_le(f, 0, 8);   /* no tensors */
    put_le(f, n_kv, 8);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const struct gguf_kv *kv = &g->kv[i];
        if (!strncmp(kv->key, "split.", 6))
            continue;   /* one file, not a part of a set */
        put_str(f, kv->key, strlen(kv->key));
        put_le(f, (uint64_t)kv->type, 4);
        if (kv->type == SHOAL_GGUF_TYPE_STRING) {
            put_str(f, kv->str, kv->str_len);
        } else if (kv->type == SHOAL_GGUF_TYPE_ARRAY) {
            put_le(f, (uint64_t)kv->arr_type, 4);
            put_le(f, kv->n, 8);
            const size_t size = type_size(kv->arr_type);
            for (uint64_t j = 0; j < kv->n; j++) {
                if (kv->arr_type == SHOAL_GGUF_TYPE_STRING)
                    put_str(f, kv->strs[j], kv->str_lens[j]);
                else
                    put_le(f, array_elem(kv->data, size, j), size);
            }
        } else {
            put_scalar(f, kv);
        }
    }
    /* the (empty) data section starts at the alignment */
    for (long pos = ftell(f); pos >= 0 && (uint64_t)pos % g->alignment; pos++)
        fputc(0, f);
    const int bad = ferror(f);
    if (fclose(f) != 0 || bad)
        return shoal_err_set(err, SHOAL_EIO, "cannot write '%s'", path);
    return 0;
}
