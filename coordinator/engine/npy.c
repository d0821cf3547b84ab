#include "npy.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define NPY_HEADER_BYTES 128 /* magic + version + len + dict, padded */

static int write_header(struct shoal_npy_writer *w)
{
    char dict[NPY_HEADER_BYTES];
    int n = snprintf(dict, sizeof dict,
                     "{'descr': '<f4', 'fortran_order': False, 'shape': (%lld, %lld), }",
                     (long long)w->rows, (long long)w->cols);
    size_t dict_len = NPY_HEADER_BYTES - 10;
    if (n < 0 || (size_t)n + 1 > dict_len)
        return -1;
    memset(dict + n, ' ', dict_len - (size_t)n);
    dict[dict_len - 1] = '\n';
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                             (unsigned char)(dict_len & 0xff),
                             (unsigned char)(dict_len >> 8)};
    if (fseek(w->f, 0, SEEK_SET) != 0 || fwrite(pre, 1, 10, w->f) != 10 ||
        fwrite(dict, 1, dict_len, w->f) != dict_len)
        return -1;
    return 0;
}

int shoal_npy_open(struct shoal_npy_writer *w, const char *path, int64_t cols,
                   struct shoal_err *err)
{
    memset(w, 0, sizeof *w);
    w->f = fopen(path, "wb");
    if (!w->f) {
        int e = errno;
        return shoal_err_set(err, -e, "cannot create '%s': %s", path, strerror(e));
    }
    w->cols = cols;
    w->path = shoal_xstrdup(path);
    if (write_header(w) != 0) {
        int e = errno ? errno : EIO;
        fclose(w->f);
        free(w->path);
        w->f = NULL;
        return shoal_err_set(err, -e, "cannot write '%s': %s", path, strerror(e));
    }
    return 0;
}

int shoal_npy_append(struct shoal_npy_writer *w, const float *row,
                     struct shoal_err *err)
{
    if (fwrite(row, sizeof(float), (size_t)w->cols, w->f) != (size_t)w->cols) {
        int e = errno ? errno : EIO;
        return shoal_err_set(err, -e, "cannot write '%s': %s", w->path, strerror(e));
    }
    w->rows++;
    return 0;
}

int shoal_npy_close(struct shoal_npy_writer *w, struct shoal_err *err)
{
    if (!w->f)
        return 0;
    int rc = 0;
    if (write_header(w) != 0 || fclose(w->f) != 0) {
        int e = errno ? errno : EIO;
        rc = shoal_err_set(err, -e, "cannot finish '%s': %s", w->path, strerror(e));
    }
    w->f = NULL;
    free(w->path);
    w->path = NULL;
    return rc;
}
