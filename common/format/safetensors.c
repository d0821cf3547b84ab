#include "safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "quant.h"
#include "util.h"

#define MAX_HEADER_BYTES (256u << 20) /* a JSON header larger is refused */

struct st_map {
    char *path;
    void *base;        /* mmap of the whole file */
    size_t size;
    void **copies;     /* aligned copies of misaligned tensors */
    size_t n_copies;
};

struct shoal_safetensors {
    struct st_map *maps;
    size_t n_maps;
    struct shoal_st_tensor *tensors;
    size_t n_tensors, cap_tensors;
    /* open-addressing index name -> tensor slot + 1 */
    uint32_t *index;
    size_t index_cap;
};

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h;
}

static void index_build(struct shoal_safetensors *st)
{
    free(st->index);
    st->index_cap = 16;
    while (st->index_cap < st->n_tensors * 2)
        st->index_cap *= 2;
    st->index = shoal_xcalloc(st->index_cap, sizeof *st->index);
    for (size_t i = 0; i < st->n_tensors; i++) {
        size_t h = hash_str(st->tensors[i].name) & (st->index_cap - 1);
        while (st->index[h])
            h = (h + 1) & (st->index_cap - 1);
        st->index[h] = (uint32_t)(i + 1);
    }
}

struct shoal_st_tensor *shoal_safetensors_find(struct shoal_safetensors *st,
                                               const char *name)
{
    if (!st || !st->index)
        return NULL;
    size_t h = hash_str(name) & (st->index_cap - 1);
    while (st->index[h]) {
        struct shoal_st_tensor *t = &st->tensors[st->index[h] - 1];
        if (!strcmp(t->name, name))
            return t;
        h = (h + 1) & (st->index_cap - 1);
    }
    return NULL;
}

void shoal_safetensors_drop_pages(const struct shoal_st_tensor *t)
{
    if (!t || !t->mapped || t->nbytes == 0)
        return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)t->data + page - 1) / page * page;
    uintptr_t b = ((uintptr_t)t->data + t->nbytes) / page * page;
    if (b > a)
        madvise((void *)a, b - a, MADV_DONTNEED);
}

size_t shoal_safetensors_count(const struct shoal_safetensors *st)
{
    return st ? st->n_tensors : 0;
}

struct shoal_st_tensor *shoal_safetensors_at(struct shoal_safetensors *st,
                                             size_t i)
{
    return i < st->n_tensors ? &st->tensors[i] : NULL;
}

static int parse_dtype(const char *s, enum shoal_dtype *t, size_t *elsize)
{
    static const struct { const char *name; int ok; enum shoal_dtype t; size_t size; } table[] = {
        {"F32", 1, SHOAL_DTYPE_F32, 4},  {"F16", 1, SHOAL_DTYPE_F16, 2},
        {"BF16", 1, SHOAL_DTYPE_BF16, 2}, {"F64", 0, 0, 8},
        {"I64", 0, 0, 8},  {"I32", 0, 0, 4}, {"I16", 0, 0, 2},
        {"I8", 0, 0, 1},   {"U8", 0, 0, 1},  {"BOOL", 0, 0, 1},
        {"U16", 0, 0, 2},  {"U32", 0, 0, 4}, {"U64", 0, 0, 8},
        {"F8_E4M3", 1, SHOAL_DTYPE_FP8, 1}, {"F8_E5M2", 0, 0, 1},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (!strcmp(s, table[i].name)) {
            *t = table[i].t;
            *elsize = table[i].size;
            return table[i].ok ? 1 : 0;
        }
    }
    return -1;
}

static int map_file(struct shoal_safetensors *st, const char *path,
                    struct st_map **out, struct shoal_err *err)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        int e = errno;
        return shoal_err_set(err, -e, "cannot open '%s': %s", path, strerror(e));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return shoal_err_set(err, -e, "cannot stat '%s': %s", path, strerror(e));
    }
    size_t size = (size_t)sb.st_size;
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return shoal_err_set(err, SHOAL_EFORMAT, "'%s' is not a regular file", path);
    }
    if (size < 8) {
        close(fd);
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "'%s' is not a safetensors file: %zu bytes, expected "
                             "at least 8 (header length)", path, size);
    }
    void *base = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (base == MAP_FAILED)
        return shoal_err_set(err, -e, "cannot mmap '%s' (%zu bytes): %s", path,
                             size, strerror(e));
    st->maps = shoal_xrealloc(st->maps, (st->n_maps + 1) * sizeof *st->maps);
    struct st_map *m = &st->maps[st->n_maps++];
    memset(m, 0, sizeof *m);
    m->path = shoal_xstrdup(path);
    m->base = base;
    m->size = size;
    *out = m;
    return 0;
}

static int json_to_u64(json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

/* Parse one mapped file's header and append its tensors. */
static int parse_file(struct shoal_safetensors *st, struct st_map *m,
                      struct shoal_err *err)
{
    const unsigned char *b = m->base;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | b[i];
    if (n > m->size - 8 || n > MAX_HEADER_BYTES)
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "'%s': header length %llu exceeds the file (%zu bytes) "
                             "or the %u-byte limit; file truncated or not safetensors",
                             m->path, (unsigned long long)n, m->size,
                             MAX_HEADER_BYTES);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)b + 8, (size_t)n, 0, &jerr);
    if (!root)
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "'%s': malformed JSON header at byte %d: %s", m->path,
                             jerr.position, jerr.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "'%s': header is not a JSON object", m->path);
    }
    const char *data = (const char *)b + 8 + n;
    size_t data_size = m->size - 8 - (size_t)n;
    int rc = 0;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__"))
            continue;
        json_t *jd = json_object_get(val, "dtype");
        json_t *js = json_object_get(val, "shape");
        json_t *jo = json_object_get(val, "data_offsets");
        if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) ||
            json_array_size(jo) != 2) {
            rc = shoal_err_set(err, SHOAL_EFORMAT,
                               "'%s': tensor '%s' needs string dtype, array shape "
                               "and [begin, end] data_offsets", m->path, key);
            break;
        }
        struct shoal_st_tensor t;
        memset(&t, 0, sizeof t);
        snprintf(t.dtype_name, sizeof t.dtype_name, "%s", json_string_value(jd));
        size_t elsize = 0;
        int d = parse_dtype(t.dtype_name, &t.dtype, &elsize);
        if (d < 0) {
            rc = shoal_err_set(err, SHOAL_EFORMAT,
                               "'%s': tensor '%s' has unknown dtype '%s'", m->path,
                               key, t.dtype_name);
            break;
        }
        t.dtype_ok = d;
        size_t nd = json_array_size(js);
        if (nd > SHOAL_MAX_DIMS) {
            rc = shoal_err_set(err, SHOAL_EUNSUPPORTED,
                               "'%s': tensor '%s' has %zu dimensions, at most %d "
                               "supported", m->path, key, nd, SHOAL_MAX_DIMS);
            break;
        }
        t.n_dims = (int)nd;
        size_t count = 1;
        int bad = 0;
        for (size_t i = 0; i < nd; i++) {
            uint64_t dim;
            if (json_to_u64(json_array_get(js, i), &dim) != 0 ||
                dim > INT64_MAX || shoal_mul_overflow(count, (size_t)dim, &count)) {
                bad = 1;
                break;
            }
            t.shape[i] = (int64_t)dim;
        }
        size_t nbytes = 0;
        uint64_t beg, end;
        if (bad || shoal_mul_overflow(count, elsize, &nbytes)) {
            rc = shoal_err_set(err, SHOAL_EFORMAT,
                               "'%s': tensor '%s' has an invalid or overflowing shape",
                               m->path, key);
            break;
        }
        if (json_to_u64(json_array_get(jo, 0), &beg) != 0 ||
            json_to_u64(json_array_get(jo, 1), &end) != 0 || beg > end ||
            end > data_size) {
            rc = shoal_err_set(err, SHOAL_EFORMAT,
                               "'%s': tensor '%s' data_offsets lie outside the %zu-byte "
                               "data section (file truncated?)", m->path, key,
                               data_size);
            break;
        }
        if (end - beg != nbytes) {
            rc = shoal_err_set(err, SHOAL_EFORMAT,
                               "'%s': tensor '%s' (%s) has %llu data bytes, expected "
                               "%zu from its shape", m->path, key, t.dtype_name,
                               (unsigned long long)(end - beg), nbytes);
            break;
        }
        if (shoal_safetensors_find(st, key)) {
            rc = shoal_err_set(err, SHOAL_EFORMAT,
                               "'%s': tensor '%s' appears twice in the checkpoint",
                               m->path, key);
            break;
        }
        t.nbytes = nbytes;
        t.data = data + beg;
        t.mapped = 1;
        if (elsize > 1 && ((uintptr_t)t.data % elsize) != 0 && nbytes > 0) {
            /* Misaligned element data: keep an aligned private copy so
             * kernels may load elements directly. */
            void *copy = malloc(nbytes);
            if (!copy) {
                rc = shoal_err_set(err, SHOAL_ENOMEM,
                                   "cannot allocate %zu bytes to align tensor '%s'",
                                   nbytes, key);
                break;
            }
            memcpy(copy, t.data, nbytes);
            m->copies = shoal_xrealloc(m->copies, (m->n_copies + 1) * sizeof(void *));
            m->copies[m->n_copies++] = copy;
            t.data = copy;
            t.mapped = 0;
        }
        t.name = shoal_xstrdup(key);
        t.file = m->path;
        if (st->n_tensors == st->cap_tensors) {
            st->cap_tensors = st->cap_tensors ? st->cap_tensors * 2 : 64;
            st->tensors = shoal_xrealloc(st->tensors,
                                         st->cap_tensors * sizeof *st->tensors);
        }
        st->tensors[st->n_tensors++] = t;
        /* keep the index current for the duplicate check */
        if (st->n_tensors * 2 > st->index_cap || st->n_tensors < 2)
            index_build(st);
        else {
            size_t h = hash_str(t.name) & (st->index_cap - 1);
            while (st->index[h])
                h = (h + 1) & (st->index_cap - 1);
            st->index[h] = (uint32_t)st->n_tensors;
        }
    }
    json_decref(root);
    return rc;
}

static int add_file(struct shoal_safetensors *st, const char *path,
                    struct shoal_err *err)
{
    struct st_map *m = NULL;
    int rc = map_file(st, path, &m, err);
    if (rc)
        return rc;
    return parse_file(st, m, err);
}

void shoal_safetensors_close(struct shoal_safetensors *st)
{
    if (!st)
        return;
    for (size_t i = 0; i < st->n_maps; i++) {
        munmap(st->maps[i].base, st->maps[i].size);
        for (size_t j = 0; j < st->maps[i].n_copies; j++)
            free(st->maps[i].copies[j]);
        free(st->maps[i].copies);
        free(st->maps[i].path);
    }
    for (size_t i = 0; i < st->n_tensors; i++)
        free(st->tensors[i].name);
    free(st->maps);
    free(st->tensors);
    free(st->index);
    free(st);
}

struct shoal_safetensors *shoal_safetensors_open_file(const char *path,
                                                      struct shoal_err *err)
{
    struct shoal_safetensors *st = shoal_xcalloc(1, sizeof *st);
    if (add_file(st, path, err) != 0) {
        shoal_safetensors_close(st);
        return NULL;
    }
    index_build(st);
    return st;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int open_index(struct shoal_safetensors *st, const char *dir,
                      const char *index_path, struct shoal_err *err)
{
    json_error_t jerr;
    json_t *root = json_load_file(index_path, 0, &jerr);
    if (!root)
        return shoal_err_set(err, SHOAL_EFORMAT, "'%s': malformed JSON at line %d: %s",
                             index_path, jerr.line, jerr.text);
    json_t *map = json_object_get(root, "weight_map");
    int rc = 0;
    if (!json_is_object(map)) {
        rc = shoal_err_set(err, SHOAL_EFORMAT,
                           "'%s': field 'weight_map' missing or not an object",
                           index_path);
        goto done;
    }
    /* distinct shard names */
    size_t n = 0, cap = 0;
    char **shards = NULL;
    const char *key;
    json_t *val;
    json_object_foreach(map, key, val) {
        if (!json_is_string(val)) {
            rc = shoal_err_set(err, SHOAL_EFORMAT,
                               "'%s': weight_map['%s'] is not a file name",
                               index_path, key);
            goto free_shards;
        }
        const char *f = json_string_value(val);
        if (strchr(f, '/') || !strcmp(f, "..")) {
            rc = shoal_err_set(err, SHOAL_EFORMAT,
                               "'%s': shard name '%s' must be a plain file name",
                               index_path, f);
            goto free_shards;
        }
        int seen = 0;
        for (size_t i = 0; i < n; i++)
            if (!strcmp(shards[i], f))
                seen = 1;
        if (!seen) {
            if (n == cap) {
                cap = cap ? cap * 2 : 8;
                shards = shoal_xrealloc(shards, cap * sizeof *shards);
            }
            shards[n++] = (char *)f;
        }
    }
    qsort(shards, n, sizeof *shards, cmp_str);
    for (size_t i = 0; i < n && rc == 0; i++) {
        char *p = shoal_path_join(dir, shards[i]);
        rc = add_file(st, p, err);
        free(p);
    }
    if (rc == 0) {
        index_build(st);
        json_object_foreach(map, key, val) {
            struct shoal_st_tensor *t = shoal_safetensors_find(st, key);
            const char *f = json_string_value(val);
            const char *base = t ? strrchr(t->file, '/') : NULL;
            base = base ? base + 1 : (t ? t->file : NULL);
            if (!t || strcmp(base, f)) {
                rc = shoal_err_set(err, SHOAL_EFORMAT,
                                   "'%s' maps tensor '%s' to '%s', but that shard "
                                   "does not contain it", index_path, key, f);
                break;
            }
        }
    }
free_shards:
    free(shards);
done:
    json_decref(root);
    return rc;
}

struct shoal_safetensors *shoal_safetensors_open_dir(const char *dir,
                                                     struct shoal_err *err)
{
    struct shoal_safetensors *st = shoal_xcalloc(1, sizeof *st);
    char *index_path = shoal_path_join(dir, "model.safetensors.index.json");
    int rc = 0;
    if (shoal_exists(index_path)) {
        rc = open_index(st, dir, index_path, err);
    } else {
        DIR *d = opendir(dir);
        if (!d) {
            int e = errno;
            rc = shoal_err_set(err, -e, "cannot open model directory '%s': %s",
                               dir, strerror(e));
        } else {
            char **names = NULL;
            size_t n = 0;
            struct dirent *de;
            while ((de = readdir(d))) {
                size_t l = strlen(de->d_name);
                if (l > 12 && !strcmp(de->d_name + l - 12, ".safetensors")) {
                    names = shoal_xrealloc(names, (n + 1) * sizeof *names);
                    names[n++] = shoal_xstrdup(de->d_name);
                }
            }
            closedir(d);
            if (n > 1)
                qsort(names, n, sizeof *names, cmp_str);
            if (n == 0)
                rc = shoal_err_set(err, SHOAL_ENOTFOUND,
                                   "no *.safetensors file in '%s'", dir);
            for (size_t i = 0; i < n; i++) {
                if (rc == 0) {
                    char *p = shoal_path_join(dir, names[i]);
                    rc = add_file(st, p, err);
                    free(p);
                }
                free(names[i]);
            }
            free(names);
            if (rc == 0)
                index_build(st);
        }
    }
    free(index_path);
    if (rc != 0) {
        shoal_safetensors_close(st);
        return NULL;
    }
    return st;
}

/* ---- MXFP4 weights (gpt-oss) ---- */

/* "[a, b, c]" of a tensor's shape into buf */
static const char *shape_str(const struct shoal_st_tensor *t, char *buf, size_t cap)
{
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < t->n_dims && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (o < cap)
        snprintf(buf + o, cap - o, "]");
    return buf;
}

int shoal_mxfp4_bind(struct shoal_weight *w, const struct shoal_st_tensor *blocks,
                     const struct shoal_st_tensor *scales, int64_t index, int64_t rows,
                     int64_t cols, int check_exponents, const char *name,
                     struct shoal_err *err)
{
    if (rows < 1 || cols < SHOAL_MXFP4_BLOCK || cols % SHOAL_MXFP4_BLOCK)
        return shoal_err_set(err, SHOAL_EINVAL,
                             "MXFP4 weight '%s': shape [%lld][%lld]; expected rows >= 1 and "
                             "cols a positive multiple of %d", name, (long long)rows,
                             (long long)cols, SHOAL_MXFP4_BLOCK);
    const struct shoal_st_tensor *t[2] = {blocks, scales};
    for (int k = 0; k < 2; k++)
        if (strcmp(t[k]->dtype_name, "U8"))
            return shoal_err_set(err, SHOAL_EFORMAT,
                                 "MXFP4 tensor '%s' in '%s' has dtype %s; expected U8 (%s)",
                                 t[k]->name, t[k]->file, t[k]->dtype_name,
                                 k ? "E8M0 exponents" : "packed E2M1 pairs");
    const int64_t nb = cols / SHOAL_MXFP4_BLOCK;
    /* blocks [(n,) rows, nb, 16], scales [(n,) rows, nb] */
    const int lead = blocks->n_dims - 3;
    int ok = (lead == 0 || lead == 1) && scales->n_dims == lead + 2 &&
             blocks->shape[lead] == rows && blocks->shape[lead + 1] == nb &&
             blocks->shape[lead + 2] == 16 && scales->shape[lead] == rows &&
             scales->shape[lead + 1] == nb && (lead == 0 || blocks->shape[0] == scales->shape[0]);
    const int64_t n = ok && lead ? blocks->shape[0] : 1;
    if (!ok) {
        char b1[96], b2[96];
        return shoal_err_set(err, SHOAL_ESHAPE,
                             "MXFP4 weight '%s': '%s' has shape %s and '%s' %s; expected "
                             "[(n,) %lld, %lld, 16] and [(n,) %lld, %lld]", name, blocks->name,
                             shape_str(blocks, b1, sizeof b1), scales->name,
                             shape_str(scales, b2, sizeof b2), (long long)rows, (long long)nb,
                             (long long)rows, (long long)nb);
    }
    if (index < 0 || index >= n)
        return shoal_err_set(err, SHOAL_EINVAL,
                             "MXFP4 weight '%s': slice %lld of '%s'; expected 0..%lld", name,
                             (long long)index, blocks->name, (long long)(n - 1));
    const size_t qbytes = (size_t)rows * (size_t)(cols / 2), sbytes = (size_t)rows * (size_t)nb;
    if (blocks->nbytes != (size_t)n * qbytes || scales->nbytes != (size_t)n * sbytes)
        return shoal_err_set(err, SHOAL_ESHAPE,
                             "MXFP4 weight '%s': '%s' has %zu bytes and '%s' %zu; expected "
                             "%zu and %zu", name, blocks->name, blocks->nbytes, scales->name,
                             scales->nbytes, (size_t)n * qbytes, (size_t)n * sbytes);
    *w = (struct shoal_weight){.dtype = SHOAL_DTYPE_MXFP4, .rows = rows, .cols = cols,
                               .group = SHOAL_MXFP4_BLOCK,
                               .data = (const uint8_t *)blocks->data + (size_t)index * qbytes,
                               .e8m0 = (const uint8_t *)scales->data + (size_t)index * sbytes};
    return check_exponents ? shoal_mxfp4_check(w, scales->name, err) : 0;
}
