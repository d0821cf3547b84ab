#include "hot_set.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "util.h"

struct shoal_hot_set {
    char *path;             /* sidecar, NULL = in memory only */
    uint64_t fingerprint;
    int64_t n_layer, n_expert;
    double decay;           /* weight of past counts at save */
    double runs;            /* runs recorded in the file */
    double *past;           /* [n_layer][n_expert] loaded counts */
    double *run;            /* [n_layer][n_expert] this run's counts */
    double run_total;
};

char *shoal_hot_set_path(const char *container_dir, const char *fallback_dir,
                         uint64_t fingerprint, int *in_container)
{
    *in_container = 0;
    if (container_dir && access(container_dir, W_OK) == 0) {
        *in_container = 1;
        return shoal_path_join(container_dir, "routing_counts.json");
    }
    if (!fallback_dir)
        return NULL;
    char name[64];
    snprintf(name, sizeof name, "routing_counts-%016" PRIx64 ".json", fingerprint);
    return shoal_path_join(fallback_dir, name);
}

/* Load path into h->past; a problem is a warning, never an error. */
static void load(struct shoal_hot_set *h)
{
    if (!shoal_exists(h->path))
        return;
    json_error_t je;
    json_t *root = json_load_file(h->path, 0, &je);
    const char *why = NULL;
    char fp[17];
    snprintf(fp, sizeof fp, "%016" PRIx64, h->fingerprint);
    json_t *counts = root ? json_object_get(root, "counts") : NULL;
    const char *got_fp = root ? json_string_value(json_object_get(root, "fingerprint")) : NULL;
    if (!root)
        why = je.text;
    else if (strcmp(json_string_value(json_object_get(root, "format")) ?
                    json_string_value(json_object_get(root, "format")) : "",
                    "shoal-routing-counts"))
        why = "not a shoal-routing-counts file";
    else if (!got_fp || strcmp(got_fp, fp))
        why = "it belongs to another container (fingerprint differs)";
    else if (!json_is_array(counts) || (int64_t)json_array_size(counts) != h->n_layer)
        why = "'counts' is not an array of one row per layer";
    for (int64_t il = 0; !why && il < h->n_layer; il++) {
        json_t *row = json_array_get(counts, (size_t)il);
        if (!json_is_array(row) || (int64_t)json_array_size(row) != h->n_expert) {
            why = "a 'counts' row does not have one number per expert";
            break;
        }
        for (int64_t ie = 0; ie < h->n_expert; ie++) {
            json_t *v = json_array_get(row, (size_t)ie);
            double c = json_number_value(v);
            if (!json_is_number(v) || !(c >= 0) || c > 1e300) {
                why = "a count is not a non-negative number";
                break;
            }
            h->past[il * h->n_expert + ie] = c;
        }
    }
    if (why) {
        memset(h->past, 0, (size_t)(h->n_layer * h->n_expert) * sizeof *h->past);
        shoal_log(SHOAL_LOG_WARN, "hot_set", "ignoring routing counts '%s': %s; "
                  "starting from zero", h->path, why);
    } else {
        h->runs = json_number_value(json_object_get(root, "runs"));
    }
    json_decref(root);
}

struct shoal_hot_set *shoal_hot_set_open(const char *path, uint64_t fingerprint,
                                         int64_t n_layer, int64_t n_expert, double decay)
{
    struct shoal_hot_set *h = shoal_xcalloc(1, sizeof *h);
    h->path = path ? shoal_xstrdup(path) : NULL;
    h->fingerprint = fingerprint;
    h->n_layer = n_layer > 0 ? n_layer : 0;
    h->n_expert = n_expert > 0 ? n_expert : 0;
    h->decay = decay < 0 ? 0 : decay > 1 ? 1 : decay;
    h->past = shoal_xcalloc((size_t)(h->n_layer * h->n_expert) + 1, sizeof *h->past);
    h->run = shoal_xcalloc((size_t)(h->n_layer * h->n_expert) + 1, sizeof *h->run);
    if (h->path)
        load(h);
    return h;
}

void shoal_hot_set_destroy(struct shoal_hot_set *h)
{
    if (!h)
        return;
    free(h->path);
    free(h->past);
    free(h->run);
    free(h);
}

void shoal_hot_set_add(struct shoal_hot_set *h, int64_t il, int64_t ie, double n)
{
    if (il < 0 || il >= h->n_layer || ie < 0 || ie >= h->n_expert)
        return;
    h->run[il * h->n_expert + ie] += n;
    h->run_total += n;
}

double shoal_hot_set_count(const struct shoal_hot_set *h, int64_t il, int64_t ie)
{
    if (il < 0 || il >= h->n_layer || ie < 0 || ie >= h->n_expert)
        return 0;
    return h->past[il * h->n_expert + ie] + h->run[il * h->n_expert + ie];
}

double shoal_hot_set_run_total(const struct shoal_hot_set *h)
{
    return h->run_total;
}

struct ranked {
    double count;
    int64_t i;   /* il * n_expert + ie */
};

static int cmp_rank(const void *a, const void *b)
{
    const struct ranked *x = a, *y = b;
    if (x->count != y->count)
        return x->count > y->count ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

void shoal_hot_set_rank(const struct shoal_hot_set *h, int64_t *order)
{
    const int64_t n = h->n_layer * h->n_expert;
    struct ranked *r = shoal_xmalloc((size_t)(n > 0 ? n : 1) * sizeof *r);
    for (int64_t i = 0; i < n; i++)
        r[i] = (struct ranked){.count = h->past[i] + h->run[i], .i = i};
    qsort(r, (size_t)n, sizeof *r, cmp_rank);
    for (int64_t i = 0; i < n; i++)
        order[i] = r[i].i;
    free(r);
}

/* mkdir -p for the fallback directory (the last component 0700). */
static int make_dirs(const char *dir)
{
    char *p = shoal_xstrdup(dir);
    int rc = 0;
    for (char *s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(p, 0755) && errno != EEXIST)
            rc = -errno;
        *s = '/';
        if (rc)
            break;
    }
    if (!rc && mkdir(p, 0700) && errno != EEXIST)
        rc = -errno;
    free(p);
    return rc;
}

int shoal_hot_set_save(struct shoal_hot_set *h, struct shoal_err *err)
{
    if (!h->path)
        return 0;
    char fp[17];
    snprintf(fp, sizeof fp, "%016" PRIx64, h->fingerprint);
    json_t *root = json_object();
    json_object_set_new(root, "format", json_string("shoal-routing-counts"));
    json_object_set_new(root, "version", json_integer(1));
    json_object_set_new(root, "fingerprint", json_string(fp));
    json_object_set_new(root, "n_layer", json_integer(h->n_layer));
    json_object_set_new(root, "n_expert", json_integer(h->n_expert));
    json_object_set_new(root, "decay", json_real(h->decay));
    json_object_set_new(root, "runs", json_real(h->runs + 1));
    json_t *counts = json_array();
    for (int64_t il = 0; il < h->n_layer; il++) {
        json_t *row = json_array();
        for (int64_t ie = 0; ie < h->n_expert; ie++) {
            const int64_t i = il * h->n_expert + ie;
            json_array_append_new(row, json_real(h->past[i] * h->decay + h->run[i]));
        }
        json_array_append_new(counts, row);
    }
    json_object_set_new(root, "counts", counts);
    char *slash = strrchr(h->path, '/');
    if (slash && slash != h->path) {
        *slash = '\0';
        int rc = shoal_is_dir(h->path) ? 0 : make_dirs(h->path);
        *slash = '/';
        if (rc) {
            json_decref(root);
            return shoal_err_set(err, rc, "cannot create the directory of '%s': %s",
                                 h->path, strerror(-rc));
        }
    }
    size_t n = strlen(h->path) + 32;
    char *tmp = shoal_xmalloc(n);
    snprintf(tmp, n, "%s.tmp-%ld", h->path, (long)getpid());
    int rc = 0;
    if (json_dump_file(root, tmp, JSON_COMPACT | JSON_REAL_PRECISION(10)) != 0) {
        rc = errno ? -errno : SHOAL_EIO;
        shoal_err_set(err, rc, "cannot write '%s': %s", tmp, shoal_strerror(rc));
        unlink(tmp);
    } else if (rename(tmp, h->path) != 0) {
        rc = -errno;
        shoal_err_set(err, rc, "cannot rename '%s' to '%s': %s", tmp, h->path, strerror(-rc));
        unlink(tmp);
    }
    free(tmp);
    json_decref(root);
    return rc;
}

const char *shoal_hot_set_file(const struct shoal_hot_set *h)
{
    return h->path;
}
