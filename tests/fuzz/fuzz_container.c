/* Fuzz target: a container manifest (shoal.json) opened with
 * shoal_container_open. The input is the manifest; the harness keeps a
 * container directory beside it whose dense.bin and experts.bin are sparse
 * files of FILE_BYTES with valid headers carrying the fingerprint the input
 * names (so mutations get past the header checks to the tensor, expert and
 * shard tables). An opened container must keep every tensor and expert
 * blob inside its file; memory stays a multiple of the manifest plus
 * tables sized by the config (layers x experts), which the manifest must
 * list in full. */
#include <fcntl.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "container.h"
#include "fuzz_common.h"
#include "util.h"

#define FILE_BYTES ((uint64_t)16 << 20)   /* each of dense.bin, experts.bin */

static char dir[64];
static char *manifest, *dense_bin, *experts_bin;

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/shoal-fuzz-container.XXXXXX");
    if (!mkdtemp(dir)) {
        perror("fuzz: mkdtemp");
        abort();
    }
    manifest = shoal_path_join(dir, "shoal.json");
    dense_bin = shoal_path_join(dir, "dense.bin");
    experts_bin = shoal_path_join(dir, "experts.bin");
}

static void cleanup(void)
{
    unlink(manifest);
    unlink(dense_bin);
    unlink(experts_bin);
    rmdir(dir);
}

static void write_file(const char *path, const void *data, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || (n && write(fd, data, n) != (ssize_t)n)) {
        perror(path);
        abort();
    }
    close(fd);
}

static void write_bin(const char *path, const char magic[8], uint64_t fingerprint)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    struct shoal_err err = {0};
    if (fd < 0 || ftruncate(fd, (off_t)FILE_BYTES) != 0 ||
        shoal_container_write_header(fd, magic, FILE_BYTES, fingerprint, path, &err) != 0) {
        fprintf(stderr, "fuzz: cannot write %s: %s\n", path, err.msg);
        abort();
    }
    close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    if (!manifest) {
        setup();
        atexit(cleanup);
    }
    /* the fingerprint the manifest names, for the binary files' headers */
    uint64_t fp = 0;
    json_t *root = json_loadb((const char *)data, n, 0, NULL);
    const char *fps = json_string_value(json_object_get(root, "fingerprint"));
    if (fps)
        fp = strtoull(fps, NULL, 16);
    json_decref(root);
    write_file(manifest, data, n);
    write_bin(dense_bin, shoal_container_magic_dense, fp);
    write_bin(experts_bin, shoal_container_magic_experts, fp);

    struct shoal_model_config cfg;
    struct shoal_err err = {0};
    memset(&cfg, 0, sizeof cfg);
    fuzz_mem_begin();
    struct shoal_container *ct = shoal_container_open(dir, &cfg, &err);
    struct fuzz_mem m = fuzz_mem_now();
    fuzz_mem_check("container", "open", m, n, 256 * n + 256 * FUZZ_KIB, 8 * n + 256 * FUZZ_KIB);
    if (!ct) {
        fuzz_mem_end();
        FUZZ_ASSERT(err.code < 0 && err.msg[0], "no error set");
        return 0;
    }
    for (size_t i = 0; i < ct->n_dense; i++) {
        const struct shoal_container_tensor *t = &ct->dense[i];
        FUZZ_ASSERT(t->offset >= SHOAL_CONTAINER_HEADER_BYTES && t->offset <= ct->dense_size &&
                    t->bytes <= ct->dense_size - t->offset, "tensor '%s' outside dense.bin",
                    t->name);
    }
    for (int64_t il = 0; il < ct->n_layer; il++)
        for (int64_t ie = 0; ie < ct->n_expert; ie++) {
            if (!shoal_container_holds(ct, il, ie))
                continue;
            uint64_t off = shoal_container_expert_offset(ct, il, ie);
            FUZZ_ASSERT(off != UINT64_MAX && off >= SHOAL_CONTAINER_HEADER_BYTES &&
                        off <= ct->experts_size && ct->blob_bytes <= ct->experts_size - off,
                        "expert %lld/%lld at %llu outside experts.bin", (long long)il,
                        (long long)ie, (unsigned long long)off);
        }
    shoal_container_close(ct);
    fuzz_mem_end();
    return 0;
}
