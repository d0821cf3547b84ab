/* hot_replicas: see hot_replicas.h. */
#include "hot_replicas.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parse.h"
#include "util.h"

char *shoal_hot_replicas_default_path(const char *dir)
{
    static const char *const names[2] = {"synth.json", "routing_counts.json"};
    for (int i = 0; i < 2; i++) {
        char *p = shoal_path_join(dir, names[i]);
        if (shoal_exists(p))
            return p;
        free(p);
    }
    return NULL;
}

/* row (a JSON array of n_expert numbers) into out; 0 or -1 (wrong length). */
static int read_row(const json_t *row, int64_t n_expert, double *out)
{
    if (!json_is_array(row) || (int64_t)json_array_size(row) != n_expert)
        return -1;
    for (int64_t e = 0; e < n_expert; e++) {
        const double v = json_number_value(json_array_get(row, (size_t)e));
        out[e] = v > 0 ? v : 0;   /* NaN and negatives count as 0 */
    }
    return 0;
}

int shoal_hot_replicas_load(const char *path, int64_t n_layer, int64_t n_expert,
                            double *counts, struct shoal_err *err)
{
    if (!shoal_exists(path))
        return shoal_err_set(err, SHOAL_ENOTFOUND, "routing counts '%s': no such file", path);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root)
        return shoal_err_set(err, SHOAL_EFORMAT, "routing counts '%s': line %d: %s", path,
                             je.line, je.text);
    const size_t n = (size_t)(n_layer * n_expert);
    double *c = shoal_xcalloc(n ? n : 1, sizeof *c);
    json_t *rows = json_object_get(root, "counts");
    json_t *layers = json_object_get(root, "layers");
    int rc = 0;
    if (json_is_array(rows)) {
        size_t i;
        json_t *row;
        json_array_foreach(rows, i, row) {
            if ((int64_t)i >= n_layer || read_row(row, n_expert, c + i * (size_t)n_expert)) {
                rc = shoal_err_set(err, SHOAL_EFORMAT, "routing counts '%s': \"counts\" row "
                                   "%zu: expected one of %lld layers with %lld values", path,
                                   i, (long long)n_layer, (long long)n_expert);
                break;
            }
        }
    } else if (json_is_array(layers)) {
        size_t i;
        json_t *l;
        json_array_foreach(layers, i, l) {
            const json_t *jl = json_object_get(l, "layer");
            const int64_t il = json_is_integer(jl) ? (int64_t)json_integer_value(jl) : -1;
            if (il < 0 || il >= n_layer ||
                read_row(json_object_get(l, "target_share"), n_expert,
                         c + (size_t)il * (size_t)n_expert)) {
                rc = shoal_err_set(err, SHOAL_EFORMAT, "routing counts '%s': \"layers\" "
                                   "item %zu: expected a \"layer\" in [0, %lld) and a "
                                   "\"target_share\" of %lld values", path, i,
                                   (long long)n_layer, (long long)n_expert);
                break;
            }
        }
    } else {
        rc = shoal_err_set(err, SHOAL_EFORMAT, "routing counts '%s': neither a "
                           "routing_counts.json (\"counts\") nor a synth.json (\"layers\")",
                           path);
    }
    json_decref(root);
    if (!rc)
        memcpy(counts, c, n * sizeof *c);
    free(c);
    return rc;
}

int64_t shoal_hot_replicas_mark(const double *counts, int64_t n_layer, int64_t n_expert,
                                int n_hot, uint8_t *hot)
{
    int64_t marked = 0;
    memset(hot, 0, (size_t)(n_layer * n_expert));
    for (int64_t il = 0; il < n_layer; il++) {
        const double *c = counts + il * n_expert;
        uint8_t *h = hot + il * n_expert;
        /* n_hot picks of the largest unmarked count: n_hot is small (a few
         * experts) so O(n_hot * n_expert) beats sorting; strict > keeps the
         * lower id on ties */
        for (int k = 0; k < n_hot; k++) {
            int64_t best = -1;
            for (int64_t e = 0; e < n_expert; e++)
                if (!h[e] && c[e] > 0 && (best < 0 || c[e] > c[best]))
                    best = e;
            if (best < 0)
                break;
            h[best] = 1;
            marked++;
        }
    }
    return marked;
}

int shoal_hot_replicas_parse(const char *v, int max_extra, int *n_hot, int *extra)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%s", v);
    char *colon = strchr(buf, ':');
    long long h = 0, x = 1;
    if (colon)
        *colon = 0;
    if (strlen(v) >= sizeof buf || shoal_parse_i64(buf, 1, 1 << 20, &h) < 0 ||
        (colon && shoal_parse_i64(colon + 1, 1, max_extra, &x) < 0))
        return SHOAL_EINVAL;
    *n_hot = (int)h;
    *extra = (int)x;
    return 0;
}

uint8_t *shoal_hot_replicas_build(const char *path, const char *dir, int64_t n_layer,
                                  int64_t n_expert, int n_hot, struct shoal_err *err)
{
    char *rpath = path ? shoal_xstrdup(path) : shoal_hot_replicas_default_path(dir);
    if (!rpath) {
        shoal_err_set(err, SHOAL_ENOTFOUND, "'%s' has neither synth.json nor "
                      "routing_counts.json to rank the hot experts; give --routing FILE", dir);
        return NULL;
    }
    const size_t n = (size_t)(n_layer * n_expert) + 1;
    double *counts = shoal_xcalloc(n, sizeof *counts);
    uint8_t *hot = NULL;
    if (shoal_hot_replicas_load(rpath, n_layer, n_expert, counts, err) == 0) {
        hot = shoal_xcalloc(n, 1);
        shoal_hot_replicas_mark(counts, n_layer, n_expert, n_hot, hot);
    }
    free(counts);
    free(rpath);
    return hot;
}
