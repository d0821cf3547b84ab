/* shard: partial containers (docs/FORMAT.md "Shards") written by
 * shoal_container_write_shard and read back: the held set, O(1) offsets,
 * blob bytes equal to the full container's, fingerprint, verify, bind
 * without dense.bin, refusals; and the expert store on a shard (experts
 * outside it, hints, the pinned hot-set, mirrors).
 *
 * The full container is converted from the bundled model
 * (models/shakespeare-moe: 4 MoE layers x 8 experts, bf16) into a fresh
 * temporary directory per test. */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "config.h"
#include "container.h"
#include "expert_store.h"
#include "model.h"
#include "util.h"
#include "test_fs.h"

#define MODEL_DIR SHOAL_SOURCE_ROOT "/models/shakespeare-moe"
#define N_LAYER 4
#define N_EXPERT 8

static char tmp[64];
static char full_dir[128];

static void rm_rf(const char *d)
{
    cr_assert(eq(int, test_rm_rf(d), 0), "rm -rf %s: %s", d, strerror(errno));
}

static void setup(void)
{
    snprintf(tmp, sizeof tmp, "/tmp/shoal-shard-XXXXXX");
    cr_assert(mkdtemp(tmp) != NULL);
    snprintf(full_dir, sizeof full_dir, "%s/full", tmp);
    struct shoal_err err = {0};
    struct shoal_model *m = shoal_model_load(MODEL_DIR, &err);
    cr_assert(m != NULL, "%s", err.msg);
    struct shoal_convert_params p = shoal_convert_params_default();
    cr_assert(eq(int, shoal_container_convert(m, MODEL_DIR, full_dir, &p, &err), 0), "%s",
              err.msg);
    shoal_model_free(m);
}

static void teardown(void)
{
    rm_rf(tmp);
}

static struct shoal_container *open_ct(const char *dir)
{
    struct shoal_err err = {0};
    struct shoal_model_config cfg;
    struct shoal_container *ct = shoal_container_open(dir, &cfg, &err);
    cr_assert(ct != NULL, "%s: %s", dir, err.msg);
    return ct;
}

/* The test's held pattern: layer 2 holds nothing, the others every
 * expert with (il + ie) % 3 != 0 (5 or 6 of 8). */
static void pattern(uint8_t *held)
{
    for (int il = 0; il < N_LAYER; il++)
        for (int ie = 0; ie < N_EXPERT; ie++)
            held[il * N_EXPERT + ie] = il != 2 && (il + ie) % 3 != 0;
}

static char *write_shard(const struct shoal_container *full, const char *name,
                         const uint8_t *held, int with_dense)
{
    static const double weights[3] = {2, 1, 1};
    char *dst = shoal_path_join(tmp, name);
    struct shoal_shard_params p = {.index = 1, .count = 3, .replicas = 2, .weights = weights,
                                   .held = held, .with_dense = with_dense};
    struct shoal_err err = {0};
    uint64_t bytes = 0;
    cr_assert(eq(int, shoal_container_write_shard(full, dst, &p, &bytes, &err), 0), "%s",
              err.msg);
    cr_assert(bytes > 0);
    return dst;
}

static void read_blob(const struct shoal_container *ct, int64_t il, int64_t ie, void *buf)
{
    int fd = open(ct->experts_path, O_RDONLY);
    cr_assert(fd >= 0);
    uint64_t off = shoal_container_expert_offset(ct, il, ie);
    cr_assert(ne(u64, off, UINT64_MAX), "layer %lld expert %lld held", (long long)il,
              (long long)ie);
    cr_assert(eq(i64, (int64_t)pread(fd, buf, ct->blob_bytes, (off_t)off),
                 (int64_t)ct->blob_bytes));
    close(fd);
}

Test(shard, open_reports_the_held_set_and_offsets_hold_the_full_bytes, .init = setup,
     .fini = teardown, .timeout = 120)
{
    struct shoal_container *full = open_ct(full_dir);
    cr_assert(full->held == NULL && full->held_rank == NULL && full->shard.count == 0);
    cr_assert(eq(i64, full->n_held, N_LAYER * N_EXPERT));
    uint8_t held[N_LAYER * N_EXPERT];
    pattern(held);
    char *dir = write_shard(full, "s", held, 0);
    struct shoal_container *ct = open_ct(dir);
    cr_assert(eq(u64, ct->fingerprint, full->fingerprint), "the full model's fingerprint");
    cr_assert(eq(int, ct->shard.count, 3));
    cr_assert(eq(int, ct->shard.index, 1));
    cr_assert(eq(int, ct->shard.replicas, 2));
    cr_assert(ct->shard.weights[0] == 2 && ct->shard.weights[1] == 1);
    cr_assert(eq(int, ct->shard.has_dense, 0));
    cr_assert(ct->dense_map == NULL);
    cr_assert(eq(sz, ct->n_dense, full->n_dense), "the dense list is kept");
    int64_t n = 0;
    for (int i = 0; i < N_LAYER * N_EXPERT; i++)
        n += held[i];
    cr_assert(eq(i64, ct->n_held, n));
    cr_assert(eq(i64, ct->n_moe_expert, N_LAYER * N_EXPERT));
    cr_assert(eq(u64, ct->experts_size, SHOAL_CONTAINER_HEADER_BYTES + (uint64_t)n *
                                        ct->blob_bytes));
    void *a = malloc(ct->blob_bytes), *b = malloc(ct->blob_bytes);
    for (int il = 0; il < N_LAYER; il++) {
        int rank = 0;
        for (int ie = 0; ie < N_EXPERT; ie++) {
            int h = held[il * N_EXPERT + ie];
            cr_assert(eq(int, shoal_container_holds(ct, il, ie), h), "layer %d expert %d",
                      il, ie);
            cr_assert(eq(u64, ct->expert_xxh64[il * N_EXPERT + ie],
                         full->expert_xxh64[il * N_EXPERT + ie]), "every checksum is kept");
            if (!h) {
                cr_assert(eq(u64, shoal_container_expert_offset(ct, il, ie), UINT64_MAX));
                continue;
            }
            cr_assert(eq(u64, shoal_container_expert_offset(ct, il, ie),
                         ct->layer_offset[il] + (uint64_t)rank * ct->blob_bytes),
                      "layer %d expert %d at rank %d", il, ie, rank);
            rank++;
            read_blob(ct, il, ie, a);
            read_blob(full, il, ie, b);
            cr_assert(eq(int, memcmp(a, b, ct->blob_bytes), 0), "layer %d expert %d bytes",
                      il, ie);
        }
    }
    free(a);
    free(b);
    struct shoal_err err = {0};
    cr_assert(eq(int, shoal_container_verify(ct, NULL, NULL, &err), 0), "%s", err.msg);
    shoal_container_close(ct);
    shoal_container_close(full);
    free(dir);
}

Test(shard, verify_names_a_damaged_held_blob, .init = setup, .fini = teardown,
     .timeout = 120)
{
    struct shoal_container *full = open_ct(full_dir);
    uint8_t held[N_LAYER * N_EXPERT];
    pattern(held);
    char *dir = write_shard(full, "s", held, 0);
    struct shoal_container *ct = open_ct(dir);
    /* layer 3 expert 4 is held ((3 + 4) % 3 != 0): flip one of its bytes */
    uint64_t off = shoal_container_expert_offset(ct, 3, 4) + 100;
    int fd = open(ct->experts_path, O_RDWR);
    unsigned char c;
    cr_assert(eq(int, (int)pread(fd, &c, 1, (off_t)off), 1));
    c ^= 0x40;
    cr_assert(eq(int, (int)pwrite(fd, &c, 1, (off_t)off), 1));
    close(fd);
    struct shoal_err err = {0};
    cr_assert(eq(int, shoal_container_verify(ct, NULL, NULL, &err), SHOAL_EFORMAT));
    cr_assert(strstr(err.msg, "layer 3 expert 4") != NULL, "%s", err.msg);
    cr_assert(strstr(err.msg, "experts.bin") != NULL, "%s", err.msg);
    shoal_container_close(ct);
    shoal_container_close(full);
    free(dir);
}

Test(shard, without_dense_binds_nothing_and_says_run_on_the_full_container, .init = setup,
     .fini = teardown, .timeout = 120)
{
    struct shoal_container *full = open_ct(full_dir);
    uint8_t held[N_LAYER * N_EXPERT];
    pattern(held);
    char *bare = write_shard(full, "bare", held, 0);
    char *dense = write_shard(full, "dense", held, 1);
    struct shoal_err err = {0};
    struct shoal_model *m = shoal_model_load(bare, &err);
    cr_assert(m == NULL);
    cr_assert(strstr(err.msg, "is a shard without dense tensors (made by shoal shard without "
                              "--with-dense); run the coordinator on the full container") != NULL,
              "%s", err.msg);
    cr_assert(strstr(err.msg, bare) != NULL, "%s", err.msg);
    shoal_err_clear(&err);
    m = shoal_model_load(dense, &err);
    cr_assert(m != NULL, "a shard with dense.bin binds: %s", err.msg);
    cr_assert(eq(int, m->ct->shard.has_dense, 1));
    shoal_model_free(m);
    struct shoal_container *ct = open_ct(dense);
    cr_assert(eq(int, shoal_container_verify(ct, NULL, NULL, &err), 0), "%s", err.msg);
    shoal_container_close(ct);
    shoal_container_close(full);
    free(bare);
    free(dense);
}

Test(shard, holding_everything_is_the_full_layout, .init = setup, .fini = teardown,
     .timeout = 120)
{
    struct shoal_container *full = open_ct(full_dir);
    uint8_t held[N_LAYER * N_EXPERT];
    memset(held, 1, sizeof held);
    char *dir = write_shard(full, "all", held, 0);
    struct shoal_container *ct = open_ct(dir);
    cr_assert(ct->held == NULL && ct->held_rank == NULL, "no held table when all are held");
    cr_assert(eq(int, ct->shard.count, 3));
    char *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    cr_assert(eq(int, shoal_read_file(ct->experts_path, 1u << 30, &a, &na, NULL), 0));
    cr_assert(eq(int, shoal_read_file(full->experts_path, 1u << 30, &b, &nb, NULL), 0));
    cr_assert(eq(sz, na, nb));
    cr_assert(eq(int, memcmp(a, b, na), 0), "experts.bin byte-identical to the full one");
    free(a);
    free(b);
    shoal_container_close(ct);
    shoal_container_close(full);
    free(dir);
}

Test(shard, refuses_an_existing_destination_and_sharding_a_shard, .init = setup,
     .fini = teardown, .timeout = 120)
{
    struct shoal_container *full = open_ct(full_dir);
    uint8_t held[N_LAYER * N_EXPERT];
    pattern(held);
    char *dir = write_shard(full, "s", held, 0);
    struct shoal_shard_params p = {.index = 0, .count = 2, .replicas = 1, .held = held};
    struct shoal_err err = {0};
    cr_assert(eq(int, shoal_container_write_shard(full, dir, &p, NULL, &err), SHOAL_EINVAL));
    cr_assert(strstr(err.msg, "--force") != NULL, "%s", err.msg);
    p.force = 1;
    shoal_err_clear(&err);
    cr_assert(eq(int, shoal_container_write_shard(full, dir, &p, NULL, &err), 0), "%s",
              err.msg);
    struct shoal_container *ct = open_ct(dir);
    cr_assert(eq(int, ct->shard.count, 2), "--force replaced it");
    char *dst2 = shoal_path_join(tmp, "s2");
    shoal_err_clear(&err);
    cr_assert(eq(int, shoal_container_write_shard(ct, dst2, &p, NULL, &err), SHOAL_EINVAL));
    cr_assert(strstr(err.msg, "shard the full container") != NULL, "%s", err.msg);
    cr_assert(eq(int, shoal_exists(dst2), 0));
    p.replicas = 3;   /* > count */
    shoal_err_clear(&err);
    cr_assert(eq(int, shoal_container_write_shard(full, dst2, &p, NULL, &err), SHOAL_EINVAL));
    cr_assert(eq(int, shoal_exists(dst2), 0));
    shoal_container_close(ct);
    shoal_container_close(full);
    free(dst2);
    free(dir);
}

/* Rewrite dir/shoal.json with shard.held[i].experts replaced. */
static void set_held(const char *dir, size_t i, json_t *experts)
{
    char *mp = shoal_path_join(dir, "shoal.json");
    json_t *root = json_load_file(mp, 0, NULL);
    cr_assert(root != NULL);
    json_t *l = json_array_get(json_object_get(json_object_get(root, "shard"), "held"), i);
    cr_assert(l != NULL);
    json_object_set_new(l, "experts", experts);
    cr_assert(eq(int, json_dump_file(root, mp, 0), 0));
    json_decref(root);
    free(mp);
}

Test(shard, malformed_held_lists_are_refused_at_open, .init = setup, .fini = teardown,
     .timeout = 120)
{
    struct shoal_container *full = open_ct(full_dir);
    uint8_t held[N_LAYER * N_EXPERT];
    pattern(held);
    char *dir = write_shard(full, "s", held, 0);
    struct shoal_model_config cfg;
    struct shoal_err err = {0};
    set_held(dir, 0, json_pack("[iii]", 1, 4, 2));   /* not ascending */
    cr_assert(shoal_container_open(dir, &cfg, &err) == NULL);
    cr_assert(eq(int, err.code, SHOAL_EFORMAT));
    cr_assert(strstr(err.msg, "ascend") != NULL, "%s", err.msg);
    shoal_err_clear(&err);
    set_held(dir, 0, json_pack("[ii]", 1, 8));       /* out of range */
    cr_assert(shoal_container_open(dir, &cfg, &err) == NULL);
    cr_assert(strstr(err.msg, "[0, 8)") != NULL, "%s", err.msg);
    shoal_err_clear(&err);
    /* the last layer (3, whose 5 blobs end the file) claims 7: refused as
     * lying outside experts.bin */
    set_held(dir, 0, json_pack("[iiiii]", 1, 2, 4, 5, 7));
    set_held(dir, 3, json_pack("[iiiiiii]", 1, 2, 3, 4, 5, 6, 7));
    cr_assert(shoal_container_open(dir, &cfg, &err) == NULL);
    cr_assert(strstr(err.msg, "outside") != NULL, "%s", err.msg);
    shoal_container_close(full);
    free(dir);
}

/* ------------------------------------------------------------ store */

static struct shoal_expert_store_params store_params(void)
{
    struct shoal_expert_store_params p = shoal_expert_store_params_default();
    p.learn = 0;
    p.io.kind = SHOAL_IO_PREAD;
    return p;
}

Test(shard_store, acquiring_an_expert_outside_the_shard_is_not_found, .init = setup,
     .fini = teardown, .timeout = 120)
{
    struct shoal_container *full = open_ct(full_dir);
    uint8_t held[N_LAYER * N_EXPERT];
    pattern(held);
    char *dir = write_shard(full, "s", held, 0);
    struct shoal_container *ct = open_ct(dir);
    struct shoal_err err = {0};
    struct shoal_expert_store *s = shoal_expert_store_create(ct, store_params(), &err);
    cr_assert(s != NULL, "%s", err.msg);
    struct shoal_expert_weights w;
    /* layer 0 expert 3: (0 + 3) % 3 == 0, not held */
    cr_assert(eq(int, shoal_expert_store_acquire(s, 0, 3, &w, &err), SHOAL_ENOTFOUND));
    char want[256];
    snprintf(want, sizeof want, "layer 0 expert 3 is not in this shard (%s holds %lld of 32 "
             "experts)", dir, (long long)ct->n_held);
    cr_assert(strstr(err.msg, want) != NULL, "%s", err.msg);
    /* a batch with one outside expert holds nothing and fails the same way */
    int32_t ids[3] = {1, 2, 6};
    shoal_err_clear(&err);
    cr_assert(eq(int, shoal_expert_store_acquire_batch(s, 0, ids, 3, NULL, &err),
                 SHOAL_ENOTFOUND));
    /* the held ones read the full container's bytes */
    void *blob = malloc(ct->blob_bytes);
    int32_t ok[2] = {1, 2};
    struct shoal_expert_weights ws[2];
    shoal_err_clear(&err);
    cr_assert(eq(int, shoal_expert_store_acquire_batch(s, 0, ok, 2, ws, &err), 2), "%s",
              err.msg);
    for (int i = 0; i < 2; i++) {
        read_blob(full, 0, ok[i], blob);
        cr_assert(eq(int, memcmp(ws[i].w_gate.data, blob, ct->blob_bytes), 0),
                  "expert %d", ok[i]);
    }
    shoal_expert_store_release_batch(s, 0, ok, 2);
    free(blob);
    shoal_expert_store_destroy(s);
    shoal_container_close(ct);
    shoal_container_close(full);
    free(dir);
}

Test(shard_store, hints_skip_and_the_pinned_set_takes_only_held_experts, .init = setup,
     .fini = teardown, .timeout = 120)
{
    struct shoal_container *full = open_ct(full_dir);
    uint8_t held[N_LAYER * N_EXPERT];
    pattern(held);
    char *dir = write_shard(full, "s", held, 0);
    struct shoal_container *ct = open_ct(dir);
    struct shoal_err err = {0};
    struct shoal_expert_store *s = shoal_expert_store_create(ct, store_params(), &err);
    cr_assert(s != NULL, "%s", err.msg);
    int32_t all[N_EXPERT] = {0, 1, 2, 3, 4, 5, 6, 7};
    shoal_expert_store_hint(s, 1, all, N_EXPERT);
    shoal_expert_store_hint(s, 2, all, N_EXPERT);   /* layer 2: nothing held */
    struct shoal_expert_store_stats st;
    shoal_expert_store_stats_get(s, &st);
    int64_t held1 = 0;
    for (int ie = 0; ie < N_EXPERT; ie++)
        held1 += held[1 * N_EXPERT + ie];
    cr_assert(eq(u64, st.prefetch_reads, (uint64_t)held1), "only layer 1's held experts");
    shoal_expert_store_destroy(s);

    struct shoal_expert_store_params p = store_params();
    p.pin_bytes = UINT64_MAX;
    s = shoal_expert_store_create(ct, p, &err);
    cr_assert(s != NULL, "%s", err.msg);
    shoal_expert_store_stats_get(s, &st);
    cr_assert(eq(u64, st.pinned_experts, (uint64_t)ct->n_held));
    struct shoal_expert_weights w;
    cr_assert(eq(int, shoal_expert_store_acquire(s, 3, 4, &w, &err), 0), "%s", err.msg);
    shoal_expert_store_release(s, 3, 4);
    shoal_expert_store_stats_get(s, &st);
    cr_assert(eq(u64, st.pinned_hits, 1));
    cr_assert(eq(u64, st.disk_reads, 0));
    shoal_expert_store_destroy(s);
    shoal_container_close(ct);
    shoal_container_close(full);
    free(dir);
}

Test(shard_store, a_mirror_must_be_a_copy_of_the_same_shard, .init = setup, .fini = teardown,
     .timeout = 120)
{
    struct shoal_container *full = open_ct(full_dir);
    uint8_t held[N_LAYER * N_EXPERT], other[N_LAYER * N_EXPERT];
    pattern(held);
    /* the same number of experts, another set: equal file sizes */
    for (int i = 0; i < N_LAYER * N_EXPERT; i++)
        other[i] = held[i];
    other[0 * N_EXPERT + 1] = 0;
    other[0 * N_EXPERT + 0] = 1;
    char *dir = write_shard(full, "s", held, 0);
    char *copy = write_shard(full, "copy", held, 0);
    char *diff = write_shard(full, "other", other, 0);
    struct shoal_container *ct = open_ct(dir);
    struct shoal_err err = {0};

    struct shoal_expert_store_params p = store_params();
    const char *m1[1] = {copy};
    const double weights[2] = {1, 1};
    p.mirrors = m1;
    p.n_mirror = 1;
    p.source_weights = weights;
    p.n_source_weights = 2;
    struct shoal_expert_store *s = shoal_expert_store_create(ct, p, &err);
    cr_assert(s != NULL, "a copy of the same shard is a mirror: %s", err.msg);
    struct shoal_expert_weights w;
    cr_assert(eq(int, shoal_expert_store_acquire(s, 0, 1, &w, &err), 0), "%s", err.msg);
    shoal_expert_store_release(s, 0, 1);
    shoal_expert_store_destroy(s);

    const char *m2[1] = {diff};
    p.mirrors = m2;
    shoal_err_clear(&err);
    cr_assert(shoal_expert_store_create(ct, p, &err) == NULL);
    cr_assert(strstr(err.msg, "another set of experts") != NULL, "%s", err.msg);
    cr_assert(strstr(err.msg, "layer 0 expert 0") != NULL, "%s", err.msg);

    const char *m3[1] = {full_dir};
    p.mirrors = m3;
    shoal_err_clear(&err);
    cr_assert(shoal_expert_store_create(ct, p, &err) == NULL, "the full container is refused");
    cr_assert(strstr(err.msg, "another set of experts") != NULL, "%s", err.msg);

    /* and the other way round: a shard is no mirror of the full container */
    const char *m4[1] = {dir};
    p.mirrors = m4;
    shoal_err_clear(&err);
    cr_assert(shoal_expert_store_create(full, p, &err) == NULL);
    cr_assert(strstr(err.msg, "another set of experts") != NULL, "%s", err.msg);
    /* while a full copy is */
    char *fullcopy = shoal_path_join(tmp, "fullcopy");
    cr_assert(eq(int, test_cp_r(full_dir, fullcopy), 0), "cp -r %s %s: %s", full_dir, fullcopy,
              strerror(errno));
    const char *m5[1] = {fullcopy};
    p.mirrors = m5;
    shoal_err_clear(&err);
    s = shoal_expert_store_create(full, p, &err);
    cr_assert(s != NULL, "%s", err.msg);
    shoal_expert_store_destroy(s);
    free(fullcopy);
    shoal_container_close(ct);
    shoal_container_close(full);
    free(dir);
    free(copy);
    free(diff);
}

/* Found by tests/fuzz/fuzz_container: a 3 KiB manifest whose config claims
 * 512 layers x 65536 experts, with well-formed binary files and an empty
 * entry per layer, made shoal_container_open allocate its n_layer x
 * n_expert checksum table (268 MB) before it looked at the entries. With
 * the data segment limited to 64 MB more than it holds, the old code
 * aborts in shoal_xcalloc; now the entries are checked first and the open
 * fails cleanly. (Under ASan, whose shadow memory defeats the limit, only
 * the clean refusal is checked.) */
Test(container, a_small_manifest_cannot_claim_a_huge_expert_table)
{
    snprintf(tmp, sizeof tmp, "/tmp/shoal-ct-amp-XXXXXX");
    cr_assert(mkdtemp(tmp) != NULL);
    const uint64_t fp = 0x0123456789abcdefull;
    char path[160];
    struct shoal_err err = {0};
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/%s", tmp, k ? "experts.bin" : "dense.bin");
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        cr_assert(fd >= 0);
        cr_assert(eq(int, ftruncate(fd, 1 << 20), 0));
        cr_assert(eq(int, shoal_container_write_header(fd, k ? shoal_container_magic_experts
                                                             : shoal_container_magic_dense,
                                                       1 << 20, fp, path, &err), 0), "%s",
                  err.msg);
        close(fd);
    }
    /* qwen3_moe, n_embd 64, n_ff_exp 16, F32 experts: 3 x 4096-byte components */
    json_t *cfg = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i}",
                            "model_type", "qwen3_moe", "vocab_size", 100, "hidden_size", 64,
                            "num_hidden_layers", 512, "num_attention_heads", 2,
                            "num_key_value_heads", 2, "head_dim", 32, "num_experts", 65536,
                            "num_experts_per_tok", 2, "moe_intermediate_size", 16);
    json_t *layers = json_array();
    for (int i = 0; i < 512; i++)
        json_array_append_new(layers, json_object());
    json_t *comps = json_pack("[{s:i,s:i},{s:i,s:i},{s:i,s:i}]", "offset", 0, "bytes", 4096,
                              "offset", 4096, "bytes", 4096, "offset", 8192, "bytes", 4096);
    json_t *root = json_pack("{s:s, s:i, s:s, s:s, s:o, s:{s:s, s:[]}, "
                             "s:{s:s, s:s, s:i, s:o, s:o}}",
                             "format", "shoal-container", "version", SHOAL_CONTAINER_VERSION,
                             "model_type", "qwen3_moe", "fingerprint", "0123456789abcdef",
                             "config", cfg, "dense", "file", "dense.bin", "tensors",
                             "experts", "file", "experts.bin", "dtype", "F32", "blob_bytes",
                             12288, "components", comps, "layers", layers);
    cr_assert_not_null(root);
    snprintf(path, sizeof path, "%s/shoal.json", tmp);
    cr_assert(eq(int, json_dump_file(root, path, JSON_COMPACT), 0));
    json_decref(root);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__has_feature)
#define SHOAL_TEST_LIMIT_DATA 1
#elif !defined(__SANITIZE_ADDRESS__) && defined(__has_feature)
#if !__has_feature(address_sanitizer)
#define SHOAL_TEST_LIMIT_DATA 1
#endif
#endif
#ifdef SHOAL_TEST_LIMIT_DATA
    /* VmData now plus 64 MB */
    FILE *st = fopen("/proc/self/status", "r");
    cr_assert_not_null(st);
    char line[256];
    unsigned long long data_kb = 0;
    while (fgets(line, sizeof line, st))
        if (sscanf(line, "VmData: %llu kB", &data_kb) == 1)
            break;
    fclose(st);
    cr_assert(data_kb > 0);
    struct rlimit rl = {.rlim_cur = (data_kb << 10) + (64u << 20),
                        .rlim_max = (data_kb << 10) + (64u << 20)};
    cr_assert(eq(int, setrlimit(RLIMIT_DATA, &rl), 0));
#endif
    struct shoal_model_config mc;
    struct shoal_container *ct = shoal_container_open(tmp, &mc, &err);
    cr_assert_null(ct);
    cr_assert(eq(int, err.code, SHOAL_EFORMAT), "%s", err.msg);
    cr_assert_not_null(strstr(err.msg, "experts.layers[0] must name a MoE layer with 65536 "
                                       "checksums"), "%s", err.msg);
    rm_rf(tmp);
}
