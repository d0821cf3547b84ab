/* container_cache: checkpoints converted once into cached containers; see
 * container_cache.h. */
#include "container_cache.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "container.h"
#include "model.h"
#include "util.h"

/* Bump when what a cached container holds changes for the same checkpoint
 * (the container format, the dtype rule), so old entries are not reused. */
#define CACHE_KEY_VERSION "shoal-container-cache 1"

int shoal_container_cache_dir(const char *xdg_cache_home, const char *home,
                              char *buf, size_t n, struct shoal_err *err)
{
    int w;
    if (xdg_cache_home && xdg_cache_home[0] == '/')
        w = snprintf(buf, n, "%s/shoal", xdg_cache_home);
    else if (home && home[0] == '/')
        w = snprintf(buf, n, "%s/.cache/shoal", home);
    else
        return shoal_err_set(err, SHOAL_ENOTFOUND, "no cache directory for converted "
                             "containers: neither XDG_CACHE_HOME nor HOME is an "
                             "absolute path");
    if (w < 0 || (size_t)w >= n)
        return shoal_err_set(err, SHOAL_EINVAL, "cache directory path is longer than "
                             "%zu bytes", n - 1);
    return 0;
}

/* The files a container is made from: the side files it copies and the
 * weights. */
static int key_file(const char *name)
{
    size_t n = strlen(name);
    return !strcmp(name, "config.json") || !strcmp(name, "tokenizer.json") ||
           !strcmp(name, "tokenizer_config.json") ||
           !strcmp(name, "generation_config.json") ||
           !strcmp(name, "chat_template.jinja") ||
           !strcmp(name, "special_tokens_map.json") ||
           !strcmp(name, "tiktoken.model") ||
           (n > 12 && !strcmp(name + n - 12, ".safetensors"));
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int shoal_container_cache_path(const char *hf_dir, const char *cache_dir,
                               char **path, struct shoal_err *err)
{
    char real[PATH_MAX];
    if (!realpath(hf_dir, real)) {
        int e = errno;
        return shoal_err_set(err, -e, "cannot resolve '%s': %s", hf_dir, strerror(e));
    }
    DIR *d = opendir(real);
    if (!d) {
        int e = errno;
        return shoal_err_set(err, -e, "cannot list '%s': %s", hf_dir, strerror(e));
    }
    char **names = NULL;
    size_t n = 0, cap = 0, n_weights = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!key_file(de->d_name))
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            names = shoal_xrealloc(names, cap * sizeof *names);
        }
        names[n++] = shoal_xstrdup(de->d_name);
        n_weights += strstr(de->d_name, ".safetensors") != NULL;
    }
    closedir(d);
    int rc = 0;
    if (n_weights == 0) {
        rc = shoal_err_set(err, SHOAL_EINVAL, "'%s' holds no *.safetensors; expected "
                           "a Hugging Face checkpoint directory or a shoal container",
                           hf_dir);
        goto out;
    }
    /* readdir order differs between file systems; the key must not */
    qsort(names, n, sizeof *names, cmp_names);
    XXH64_state_t *st = XXH64_createState();
    XXH64_reset(st, 0);
    XXH64_update(st, CACHE_KEY_VERSION, sizeof CACHE_KEY_VERSION);
    for (size_t k = 0; k < n && !rc; k++) {
        char *p = shoal_path_join(real, names[k]);
        struct stat sb;
        if (stat(p, &sb) != 0) {
            int e = errno;
            rc = shoal_err_set(err, -e, "cannot stat '%s': %s", p, strerror(e));
        } else {
            char line[512];
            int w = snprintf(line, sizeof line, "%s %lld %lld.%09ld\n", names[k],
                             (long long)sb.st_size, (long long)sb.st_mtim.tv_sec,
                             (long)sb.st_mtim.tv_nsec);
            XXH64_update(st, line, (size_t)w < sizeof line ? (size_t)w : sizeof line);
        }
        free(p);
    }
    uint64_t key = XXH64_digest(st);
    XXH64_freeState(st);
    if (!rc) {
        const char *base = strrchr(real, '/');
        base = base && base[1] ? base + 1 : "model";
        size_t len = strlen(cache_dir) + strlen(base) + 32;
        *path = shoal_xmalloc(len);
        snprintf(*path, len, "%s/%s-%016" PRIx64 ".shoal", cache_dir, base, key);
    }
out:
    for (size_t k = 0; k < n; k++)
        free(names[k]);
    free(names);
    return rc;
}

/* mkdir -p for the cache directory (0700: it is per user). */
static int make_dirs(const char *dir, struct shoal_err *err)
{
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf)
        return shoal_err_set(err, SHOAL_EINVAL, "path '%s' is too long", dir);
    for (char *p = buf + 1;; p++) {
        int end = *p == '\0';
        if (*p == '/' || end) {
            *p = '\0';
            if (mkdir(buf, 0700) != 0 && errno != EEXIST) {
                int e = errno;
                return shoal_err_set(err, -e, "cannot create '%s': %s", buf, strerror(e));
            }
            if (end)
                return 0;
            *p = '/';
        }
    }
}

struct dtype_scan {
    int all_bf16;
};

static int scan_slot(const struct shoal_weight_slot *slot, void *user)
{
    struct dtype_scan *s = user;
    /* 1-D tensors (norms, biases) stay f32 in a container either way */
    if (slot->cols != 0 && slot->w->data && slot->w->dtype != SHOAL_DTYPE_BF16)
        s->all_bf16 = 0;
    return 0;
}

int shoal_container_cache_fill(const char *hf_dir, const char *path,
                               struct shoal_err *err)
{
    if (shoal_container_is(path))
        return 0;
    char parent[PATH_MAX];
    snprintf(parent, sizeof parent, "%s", path);
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) {
        *slash = '\0';
        int rc = make_dirs(parent, err);
        if (rc)
            return rc;
    }
    struct shoal_model *m = shoal_model_load(hf_dir, err);
    if (!m)
        return err && err->code ? err->code : SHOAL_EINVAL;
    if (m->ct) {
        shoal_model_free(m);
        return shoal_err_set(err, SHOAL_EINVAL, "'%s' is already a shoal container",
                             hf_dir);
    }
    struct dtype_scan scan = {.all_bf16 = 1};
    shoal_model_walk(m, scan_slot, &scan);
    struct shoal_convert_params p = shoal_convert_params_default();
    p.experts_dtype = p.dense_dtype = scan.all_bf16 ? SHOAL_DTYPE_BF16 : SHOAL_DTYPE_F32;
    struct shoal_err conv_err = {0};
    int rc = shoal_container_convert(m, hf_dir, path, &p, &conv_err);
    shoal_model_free(m);
    /* another process may have published the same container first: its
     * rename won, ours failed (or our destination check saw it) */
    if (rc && shoal_container_is(path))
        return 0;
    if (rc)
        shoal_err_set(err, rc, "converting '%s' into '%s': %s", hf_dir, path,
                      conv_err.msg);
    return rc;
}
