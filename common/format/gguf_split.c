/* gguf_split: a GGUF model in one file or in llama.cpp's split files
 * (gguf.h, "split files"). The naming and keys follow llama.cpp's
 * llama_split_path ("%s-%05d-of-%05d.gguf", 1-based) and gguf-split
 * (split.no 0-based, split.count, split.tensors.count). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "util.h"

struct shoal_gguf_files {
    uint32_t n;             /* files */
    struct shoal_gguf **g;  /* [n], owned */
    char **paths;           /* [n], owned */
};

static int all_digits(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return 0;
    return 1;
}

int shoal_gguf_split_name(const char *path, size_t *prefix_len, uint32_t *no,
                          uint32_t *count)
{
    /* "-NNNNN-of-MMMMM.gguf" is 20 bytes */
    static const size_t tail = 20;
    size_t n = strlen(path);
    if (n < tail + 1)
        return SHOAL_ENOTFOUND;
    const char *t = path + n - tail;
    if (t[0] != '-' || !all_digits(t + 1, 5) || memcmp(t + 6, "-of-", 4) != 0 ||
        !all_digits(t + 10, 5) || memcmp(t + 15, ".gguf", 5) != 0)
        return SHOAL_ENOTFOUND;
    uint32_t a = (uint32_t)strtoul(t + 1, NULL, 10), b = (uint32_t)strtoul(t + 10, NULL, 10);
    if (a == 0 || a > b)
        return SHOAL_ENOTFOUND;
    *prefix_len = n - tail;
    *no = a;
    *count = b;
    return 0;
}

void shoal_gguf_files_close(struct shoal_gguf_files *f)
{
    if (!f)
        return;
    for (uint32_t i = 0; i < f->n; i++) {
        shoal_gguf_close(f->g[i]);
        free(f->paths[i]);
    }
    free(f->g);
    free(f->paths);
    free(f);
}

uint32_t shoal_gguf_files_count(const struct shoal_gguf_files *f) { return f->n; }

const struct shoal_gguf *shoal_gguf_files_get(const struct shoal_gguf_files *f, uint32_t i)
{
    return i < f->n ? f->g[i] : NULL;
}

const char *shoal_gguf_files_path(const struct shoal_gguf_files *f, uint32_t i)
{
    return i < f->n ? f->paths[i] : NULL;
}

/* split.no / split.count of g as integers (default 0 / 1). */
static int split_keys(const struct shoal_gguf *g, const char *path, int64_t *no,
                      int64_t *count, struct shoal_err *err)
{
    *no = 0;
    *count = 1;
    int rc = shoal_gguf_get_int(g, "split.no", no, err);
    if (rc && rc != SHOAL_ENOTFOUND)
        return rc;
    rc = shoal_gguf_get_int(g, "split.count", count, err);
    if (rc && rc != SHOAL_ENOTFOUND)
        return rc;
    if (*count < 1 || *count > 99999 || *no < 0 || *no >= *count)
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "gguf '%s': split.no %" PRId64 " and split.count %" PRId64
                             " are inconsistent; expected 0 <= split.no < split.count <= 99999",
                             path, *no, *count);
    return 0;
}

static int cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Tensor names are unique across the set; the first file's
 * split.tensors.count, when present, is the set's tensor count. */
static int check_set_tensors(const struct shoal_gguf_files *f, struct shoal_err *err)
{
    uint64_t total = 0;
    for (uint32_t i = 0; i < f->n; i++)
        total += shoal_gguf_n_tensors(f->g[i]);
    int64_t want;
    int rc = shoal_gguf_get_int(f->g[0], "split.tensors.count", &want, err);
    if (rc && rc != SHOAL_ENOTFOUND)
        return rc;
    if (rc == 0 && (uint64_t)want != total)
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "gguf '%s': split.tensors.count is %" PRId64
                             "; the %" PRIu32 " files hold %" PRIu64 " tensors",
                             f->paths[0], want, f->n, total);
    if (total < 2)
        return 0;
    const char **names = shoal_xmalloc((size_t)total * sizeof *names);
    uint64_t k = 0;
    for (uint32_t i = 0; i < f->n; i++)
        for (uint64_t j = 0; j < shoal_gguf_n_tensors(f->g[i]); j++) {
            struct shoal_gguf_tensor t;
            shoal_gguf_tensor(f->g[i], j, &t);
            names[k++] = t.name;
        }
    qsort(names, (size_t)total, sizeof *names, cmp_str_ptr);
    rc = 0;
    for (uint64_t i = 1; i < total && rc == 0; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            rc = shoal_err_set(err, SHOAL_EFORMAT,
                               "gguf '%s': tensor '%s' appears in two files of the split set",
                               f->paths[0], names[i]);
    free(names);
    return rc;
}

struct shoal_gguf_files *shoal_gguf_files_open(const char *path, struct shoal_err *err)
{
    struct shoal_gguf_files *f = shoal_xcalloc(1, sizeof *f);
    struct shoal_gguf *g0 = shoal_gguf_open(path, err);
    int64_t no, count;
    if (!g0 || split_keys(g0, path, &no, &count, err))
        goto fail_g0;
    if (count == 1) {
        f->n = 1;
        f->g = shoal_xmalloc(sizeof *f->g);
        f->paths = shoal_xmalloc(sizeof *f->paths);
        f->g[0] = g0;
        f->paths[0] = shoal_xstrdup(path);
        return f;
    }
    size_t prefix_len;
    uint32_t name_no, name_count;
    if (shoal_gguf_split_name(path, &prefix_len, &name_no, &name_count) != 0) {
        shoal_err_set(err, SHOAL_EFORMAT,
                      "gguf '%s': split.count is %" PRId64
                      " but the name is not PREFIX-%05" PRId64 "-of-%05" PRId64
                      ".gguf, so the other files cannot be found",
                      path, count, no + 1, count);
        goto fail_g0;
    }
    if (name_count != (uint64_t)count || name_no != (uint64_t)no + 1) {
        shoal_err_set(err, SHOAL_EFORMAT,
                      "gguf '%s': the name says split %" PRIu32 " of %" PRIu32
                      "; the metadata says split.no %" PRId64 " (file %" PRId64
                      ") of split.count %" PRId64,
                      path, name_no, name_count, no, no + 1, count);
        goto fail_g0;
    }
    f->g = shoal_xcalloc((size_t)count, sizeof *f->g);
    f->paths = shoal_xcalloc((size_t)count, sizeof *f->paths);
    f->n = (uint32_t)count;
    for (uint32_t i = 0; i < f->n; i++) {
        size_t cap = prefix_len + 32;
        f->paths[i] = shoal_xmalloc(cap);
        snprintf(f->paths[i], cap, "%.*s-%05" PRIu32 "-of-%05" PRIu32 ".gguf",
                 (int)prefix_len, path, i + 1, f->n);
    }
    f->g[no] = g0;
    g0 = NULL;
    for (uint32_t i = 0; i < f->n; i++) {
        if (f->g[i])
            continue;
        int64_t no_i, count_i;
        f->g[i] = shoal_gguf_open(f->paths[i], err);
        if (!f->g[i] || split_keys(f->g[i], f->paths[i], &no_i, &count_i, err))
            goto fail;
        if (no_i != (int64_t)i || count_i != count) {
            shoal_err_set(err, SHOAL_EFORMAT,
                          "gguf '%s': split.no %" PRId64 " of split.count %" PRId64
                          "; expected split.no %" PRIu32 " of %" PRId64 " (from '%s')",
                          f->paths[i], no_i, count_i, i, count, path);
            goto fail;
        }
    }
    if (check_set_tensors(f, err))
        goto fail;
    return f;
fail_g0:
    shoal_gguf_close(g0);
fail:
    shoal_gguf_files_close(f);
    return NULL;
}
