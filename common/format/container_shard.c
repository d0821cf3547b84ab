/* container_shard: writing one worker's partial container
 * (shoal_container_write_shard, docs/FORMAT.md "Shards"). */
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
#include "kv.h"
#include "quant.h"
#include "util.h"

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
    return shoal_container_sync_close(fd, path, 0, err);
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
        total += p->held[i] ? shoal_container_blob_bytes(ct, i / NE) : 0;
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
        const uint64_t bb = shoal_container_blob_bytes(ct, il);   /* a GGML layer's own */
        json_t *ids = json_array();
        json_array_append_new(held_json, json_pack("{s:I, s:o}", "layer", (json_int_t)il,
                                                   "experts", ids));
        for (int64_t ie = 0; ie < NE && !rc; ie++) {
            if (!p->held[il * NE + ie])
                continue;
            uint64_t from = shoal_container_expert_offset(ct, il, ie);
            if ((rc = pread_full(src, blob, (size_t)bb, from, ct->experts_path, err)))
                break;
            uint64_t h = XXH64(blob, (size_t)bb, 0);
            uint64_t want = ct->expert_xxh64[il * NE + ie];
            if (h != want) {
                rc = shoal_err_set(err, SHOAL_EFORMAT, "checksum mismatch: '%s' layer %lld "
                                   "expert %lld at offset %" PRIu64 ": xxh64 %016" PRIx64
                                   ", manifest %016" PRIx64, ct->experts_path, (long long)il,
                                   (long long)ie, from, h, want);
                break;
            }
            if ((rc = shoal_pwrite_all(fd, blob, (size_t)bb, off, path, err)))
                break;
            json_array_append_new(ids, json_integer((json_int_t)ie));
            off += bb;
            done += bb;
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
        rc = container_check_destination(ct->dir, dst, p->force, err);
    if (rc)
        return rc;
    json_error_t jerr;
    json_t *manifest = json_load_file(ct->manifest_path, 0, &jerr);
    if (!manifest)
        return shoal_err_set(err, SHOAL_EFORMAT, "'%s': malformed JSON at line %d: %s",
                             ct->manifest_path, jerr.line, jerr.text);
    char *tmp, *exp_path = NULL, *manifest_path = NULL;
    int fd = -1;
    if ((rc = shoal_container_make_tmp(dst, &tmp, err)))
        goto fail;    /* tmp NULL: nothing of ours to remove */
    exp_path = shoal_path_join(tmp, "experts.bin");
    manifest_path = shoal_path_join(tmp, "shoal.json");
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
    rc = shoal_container_sync_close(fd, exp_path, 0, err);
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
    for (size_t i = 0; i < sizeof container_side_files / sizeof container_side_files[0] && !rc; i++) {
        char *from = shoal_path_join(ct->dir, container_side_files[i]);
        if (shoal_exists(from)) {
            char *to = shoal_path_join(tmp, container_side_files[i]);
            rc = container_copy_file(from, to, err);
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
    if ((rc = shoal_container_publish_dir(tmp, dst, p->force, err)))
        goto fail;
    if (bytes_out)
        *bytes_out = bytes;
    goto done;
fail:
    if (fd >= 0)
        close(fd);
    if (tmp)
        shoal_container_rm_tree(tmp);
done:
    json_decref(manifest);
    free(exp_path);
    free(manifest_path);
    free(tmp);
    return rc;
}
