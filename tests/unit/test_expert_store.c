/* expert_store: tiers and their accounting (LRU budget, pinned hot-set,
 * staging), batch acquires, prefetch hints, mirrors (fallback, refusal),
 * checksum errors, cache policies (LRU against frequency-aware admission),
 * and weighted rendezvous hashing.
 *
 * The container is synthetic but real on disk: an experts.bin with the
 * format's header and blobs of seeded pseudo-random bytes, described by a
 * struct shoal_container filled by hand (the store reads nothing else). */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "expert_store.h"
#include "quant.h"
#include "hot_set.h"
#include "log.h"
#include "util.h"
#include "test_fs.h"

#define N_LAYER 3
#define N_EXPERT 8
#define BLOB 8192

struct fixture {
    char dir[64];
    char path[128];
    struct shoal_container ct;
    uint64_t layer_offset[N_LAYER];
    uint64_t xxh[N_LAYER * N_EXPERT];
};

static void fill_blob(unsigned char *b, int64_t il, int64_t ie)
{
    uint64_t x = 0x243f6a8885a308d3ull ^ (uint64_t)(il * N_EXPERT + ie + 1) * 0x9e37ull;
    for (int i = 0; i < BLOB; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b[i] = (unsigned char)(x >> 24);
    }
}

static void put_le(unsigned char *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* Write dir/experts.bin; layer 1 is a dense layer when dense_mid. */
static void write_container(struct fixture *f, const char *dir, uint64_t fingerprint,
                            int dense_mid)
{
    snprintf(f->dir, sizeof f->dir, "%s", dir);
    snprintf(f->path, sizeof f->path, "%s/experts.bin", dir);
    FILE *fp = fopen(f->path, "wb");
    cr_assert(fp != NULL);
    int n_moe = 0;
    for (int il = 0; il < N_LAYER; il++)
        f->layer_offset[il] = dense_mid && il == 1 ? UINT64_MAX
                            : 4096 + (uint64_t)(n_moe++) * N_EXPERT * BLOB;
    uint64_t total = 4096 + (uint64_t)n_moe * N_EXPERT * BLOB;
    unsigned char h[4096] = {0};
    memcpy(h, "SHOALEXP", 8);
    put_le(h + 8, 1, 4);
    put_le(h + 12, 4096, 4);
    put_le(h + 16, total, 8);
    put_le(h + 24, fingerprint, 8);
    fwrite(h, 1, sizeof h, fp);
    static unsigned char b[BLOB];
    for (int il = 0; il < N_LAYER; il++) {
        if (f->layer_offset[il] == UINT64_MAX)
            continue;
        for (int ie = 0; ie < N_EXPERT; ie++) {
            fill_blob(b, il, ie);
            f->xxh[il * N_EXPERT + ie] = XXH64(b, BLOB, 0);
            fwrite(b, 1, BLOB, fp);
        }
    }
    fclose(fp);
    struct shoal_container *ct = &f->ct;
    memset(ct, 0, sizeof *ct);
    ct->dir = f->dir;
    ct->experts_path = f->path;
    ct->fingerprint = fingerprint;
    ct->experts_size = total;
    ct->experts_dtype = SHOAL_DTYPE_F32;
    ct->blob_bytes = BLOB;
    ct->n_layer = N_LAYER;
    ct->n_expert = N_EXPERT;
    ct->layer_offset = f->layer_offset;
    ct->expert_xxh64 = f->xxh;
    /* three f32 [16][32] components: views are pointers into the blob */
    for (int c = 0; c < 3; c++)
        ct->comp[c] = (struct shoal_expert_component){.dtype = SHOAL_DTYPE_F32, .rows = 16,
                                                       .cols = 32, .offset = (uint64_t)c * 2048,
                                                       .bytes = 2048};
}

static struct fixture F;

static void make(int dense_mid)
{
    char d[64];
    snprintf(d, sizeof d, "/tmp/shoal-store-XXXXXX");
    cr_assert(mkdtemp(d) != NULL);
    write_container(&F, d, 0xfeedf00dull, dense_mid);
}

static void rm_rf(const char *d)
{
    cr_assert(eq(int, test_rm_rf(d), 0), "rm -rf %s: %s", d, strerror(errno));
}

static void check_bytes(const struct shoal_expert_weights *w, int64_t il, int64_t ie)
{
    static unsigned char want[BLOB];
    fill_blob(want, il, ie);
    cr_assert(eq(int, memcmp(w->w_gate.data, want, BLOB), 0), "layer %lld expert %lld bytes",
              (long long)il, (long long)ie);
    cr_assert(eq(ptr, (void *)((const char *)w->w_gate.data + 2048), (void *)w->w_up.data));
}

static struct shoal_expert_store *open_store(struct shoal_expert_store_params p)
{
    struct shoal_err err = {0};
    struct shoal_expert_store *s = shoal_expert_store_create(&F.ct, p, &err);
    cr_assert(s != NULL, "%s", err.msg);
    return s;
}

static struct shoal_expert_store_params params(uint64_t cache, enum shoal_io_kind io, int qd)
{
    struct shoal_expert_store_params p = shoal_expert_store_params_default();
    p.cache_bytes = cache;
    p.io.kind = io;
    p.io.queue_depth = qd;
    p.learn = 0;
    p.cache_policy = SHOAL_CACHE_LRU;   /* the tests of the policies set theirs */
    return p;
}

static void stats(struct shoal_expert_store *s, struct shoal_expert_store_stats *st)
{
    shoal_expert_store_stats_get(s, st);
}

/* ------------------------------------------------------------ batches */

/* cold: the experts file's pages dropped from the page cache (written back
 * first), so the reads cannot be mapped from it */
static void whole_layer_batch(enum shoal_io_kind io, int direct, int cold)
{
    make(0);
    if (cold) {
        char path[128];
        snprintf(path, sizeof path, "%s/experts.bin", F.dir);
        const int fd = open(path, O_RDONLY);
        cr_assert(fd >= 0);
        cr_assert(eq(int, fsync(fd), 0));
        cr_assert(eq(int, posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0));
        close(fd);
    }
    struct shoal_expert_store_params p = params(UINT64_MAX, io, 4);
    p.direct = direct;
    struct shoal_expert_store *s = open_store(p);
    int32_t ids[N_EXPERT] = {7, 0, 3, 5, 1, 2, 6, 4};
    struct shoal_expert_weights w[N_EXPERT];
    struct shoal_err err = {0};
    for (int il = 0; il < N_LAYER; il++) {
        int m = shoal_expert_store_acquire_batch(s, il, ids, N_EXPERT, w, &err);
        cr_assert(eq(int, m, N_EXPERT), "%s", err.msg);
        for (int i = 0; i < m; i++)
            check_bytes(&w[i], il, ids[i]);
        shoal_expert_store_release_batch(s, il, ids, m);
    }
    struct shoal_expert_store_stats st;
    stats(s, &st);
    cr_assert(eq(u64, st.disk_reads, N_LAYER * N_EXPERT));
    cr_assert(eq(u64, st.bytes_read, (uint64_t)N_LAYER * N_EXPERT * BLOB));
    cr_assert(eq(u64, st.cached_experts, N_LAYER * N_EXPERT));
#if defined(__linux__)
    /* a warm page cache is mapped, not copied; O_DIRECT and cold pages read */
    if (!direct && !cold)
        cr_assert(eq(u64, st.mapped_reads, N_LAYER * N_EXPERT));
    else if (direct)
        cr_assert(eq(u64, st.mapped_reads, 0));
    else
        cr_assert(st.mapped_reads < N_LAYER * N_EXPERT, "every read mapped though cold");
#endif
    /* again: all from the cache, nothing read */
    int m = shoal_expert_store_acquire_batch(s, 2, ids, 3, w, &err);
    cr_assert(eq(int, m, 3));
    check_bytes(&w[2], 2, ids[2]);
    shoal_expert_store_release_batch(s, 2, ids, m);
    stats(s, &st);
    cr_assert(eq(u64, st.cache_hits, 3));
    cr_assert(eq(u64, st.disk_reads, N_LAYER * N_EXPERT));
    shoal_expert_store_destroy(s);
    rm_rf(F.dir);
}

Test(expert_store, batch_reads_land_and_verify_pread, .timeout = 60)
{
    whole_layer_batch(SHOAL_IO_PREAD, 0, 0);
}

Test(expert_store, batch_reads_land_and_verify_uring, .timeout = 60)
{
    whole_layer_batch(SHOAL_IO_URING, 0, 0);
}

Test(expert_store, batch_reads_land_and_verify_uring_direct, .timeout = 60)
{
    whole_layer_batch(SHOAL_IO_URING, 1, 0);
}

Test(expert_store, batch_reads_land_and_verify_cold_pread_and_uring, .timeout = 60)
{
    whole_layer_batch(SHOAL_IO_PREAD, 0, 1);
    whole_layer_batch(SHOAL_IO_URING, 0, 1);
}

Test(expert_store, lru_keeps_the_budget_and_evicts_least_recent, .timeout = 60)
{
    make(0);
    struct shoal_expert_store *s = open_store(params(3 * BLOB, SHOAL_IO_PREAD, 2));
    struct shoal_expert_weights w;
    struct shoal_err err = {0};
    struct shoal_expert_store_stats st;
    /* 0 1 2 fill the cache; touching 0 makes 1 the least recent; 3 evicts 1 */
    int seq[] = {0, 1, 2, 0, 3, 1};
    for (size_t k = 0; k < sizeof seq / sizeof seq[0]; k++) {
        cr_assert(eq(int, shoal_expert_store_acquire(s, 0, seq[k], &w, &err), 0), "%s",
                  err.msg);
        check_bytes(&w, 0, seq[k]);
        shoal_expert_store_release(s, 0, seq[k]);
        stats(s, &st);
        cr_assert(st.cached_bytes <= 3 * BLOB, "budget kept: %llu bytes after step %zu",
                  (unsigned long long)st.cached_bytes, k);
    }
    stats(s, &st);
    cr_assert(eq(u64, st.cache_hits, 1), "only the second 0 hits");
    cr_assert(eq(u64, st.disk_reads, 5));
    cr_assert(eq(u64, st.evictions, 2), "3 evicts 1, then 1 evicts 2");
    cr_assert(eq(u64, st.cached_experts, 3));
    cr_assert(eq(u64, st.peak_expert_bytes, 3 * BLOB), "no staging was needed");
    /* 0 3 1 are cached now: all hit */
    int32_t ids[3] = {0, 3, 1};
    struct shoal_expert_weights ws[3];
    cr_assert(eq(int, shoal_expert_store_acquire_batch(s, 0, ids, 3, ws, &err), 3));
    shoal_expert_store_release_batch(s, 0, ids, 3);
    stats(s, &st);
    cr_assert(eq(u64, st.cache_hits, 4));
    shoal_expert_store_destroy(s);
    rm_rf(F.dir);
}

/* layer_resident: 1 exactly when every expert of the layer is in memory;
 * an eviction makes it 0 again; a dense layer or one out of range is 0 */
Test(expert_store, layer_resident_follows_reads_and_evictions, .timeout = 60)
{
    make(1);
    struct shoal_err err = {0};
    struct shoal_expert_weights w;
    for (int small = 0; small < 2; small++) {
        struct shoal_expert_store *s =
            open_store(params(small ? N_EXPERT * BLOB : UINT64_MAX, SHOAL_IO_PREAD, 2));
        cr_assert(eq(int, shoal_expert_store_layer_resident(s, 0), 0), "nothing read yet");
        for (int ie = 0; ie < N_EXPERT; ie++) {
            cr_assert(eq(int, shoal_expert_store_acquire(s, 0, ie, &w, &err), 0), "%s", err.msg);
            shoal_expert_store_release(s, 0, ie);
            cr_assert(eq(int, shoal_expert_store_layer_resident(s, 0), ie == N_EXPERT - 1),
                      "cache %s, after expert %d", small ? "one layer" : "unlimited", ie);
        }
        /* one expert of layer 2: in a cache of one layer it evicts one of layer 0 */
        cr_assert(eq(int, shoal_expert_store_acquire(s, 2, 0, &w, &err), 0), "%s", err.msg);
        shoal_expert_store_release(s, 2, 0);
        cr_assert(eq(int, shoal_expert_store_layer_resident(s, 0), !small));
        cr_assert(eq(int, shoal_expert_store_layer_resident(s, 2), 0), "layer 2: one of 8 read");
        cr_assert(eq(int, shoal_expert_store_layer_resident(s, 1), 0), "dense layer");
        cr_assert(eq(int, shoal_expert_store_layer_resident(s, -1), 0));
        cr_assert(eq(int, shoal_expert_store_layer_resident(s, N_LAYER), 0));
        shoal_expert_store_destroy(s);
    }
    rm_rf(F.dir);
}

/* placement's view of a worker (ExpertResponse.resident): the bits follow
 * reads, hints and evictions, and the loading ones are a subset */
Test(expert_store, resident_bits_follow_reads_hints_and_evictions, .timeout = 60)
{
    make(1);
    struct shoal_err err = {0};
    struct shoal_expert_weights w;
    /* a cache of 3 experts under LRU */
    struct shoal_expert_store_params p = params(3 * BLOB, SHOAL_IO_PREAD, 2);
    p.cache_policy = SHOAL_CACHE_LRU;
    struct shoal_expert_store *s = open_store(p);
    uint8_t bits[(N_EXPERT + 7) / 8 + 1], ld[(N_EXPERT + 7) / 8 + 1];
    memset(bits, 0xee, sizeof bits);
    cr_assert(eq(int, shoal_expert_store_resident_bits(s, 1, bits, ld), -1), "dense layer");
    cr_assert(eq(u8, bits[0], 0xee), "untouched on -1");
    cr_assert(eq(int, shoal_expert_store_resident_bits(s, N_LAYER, bits, ld), -1));
    cr_assert(eq(int, shoal_expert_store_resident_bits(s, -1, bits, NULL), -1));
    cr_assert(eq(int, shoal_expert_store_resident_bits(s, 0, bits, ld), 0));
    for (int i = 0; i < (N_EXPERT + 7) / 8; i++)
        cr_assert(eq(u8, bits[i], 0), "nothing read yet");
    const int order[4] = {5, 1, 6, 2};
    for (int k = 0; k < 4; k++) {
        cr_assert(eq(int, shoal_expert_store_acquire(s, 0, order[k], &w, &err), 0), "%s",
                  err.msg);
        shoal_expert_store_release(s, 0, order[k]);
    }
    /* 5 was the least recent of 4 in a cache of 3 */
    cr_assert(eq(int, shoal_expert_store_resident_bits(s, 0, bits, ld), 0));
    for (int ie = 0; ie < N_EXPERT; ie++) {
        const int want = ie == 1 || ie == 6 || ie == 2;
        cr_assert(eq(int, bits[ie >> 3] >> (ie & 7) & 1, want), "expert %d", ie);
        cr_assert(eq(int, ld[ie >> 3] >> (ie & 7) & 1, 0), "expert %d: read complete", ie);
    }
    /* a hint's reads count as resident at once; loading is a subset */
    int32_t hint[2] = {3, 4};
    shoal_expert_store_hint(s, 2, hint, 2);
    cr_assert(eq(int, shoal_expert_store_resident_bits(s, 2, bits, ld), 0));
    for (int ie = 0; ie < N_EXPERT; ie++) {
        const int b = bits[ie >> 3] >> (ie & 7) & 1, l = ld[ie >> 3] >> (ie & 7) & 1;
        cr_assert(eq(int, b, ie == 3 || ie == 4), "layer 2 expert %d", ie);
        cr_assert(l <= b, "loading implies resident");
    }
    int32_t ids[2] = {3, 4};
    struct shoal_expert_weights w2[2];
    cr_assert(eq(int, shoal_expert_store_acquire_batch(s, 2, ids, 2, w2, &err), 2));
    shoal_expert_store_release_batch(s, 2, ids, 2);
    cr_assert(eq(int, shoal_expert_store_resident_bits(s, 2, bits, ld), 0));
    for (int i = 0; i < (N_EXPERT + 7) / 8; i++)
        cr_assert(eq(u8, ld[i], 0), "every read landed");
    shoal_expert_store_destroy(s);
    rm_rf(F.dir);
}

Test(expert_store, union_over_budget_is_served_in_parts_from_staging, .timeout = 60)
{
    make(0);
    /* cache 2 blobs + 2 new staging blobs (queue depth 2) a part: a union
     * of 8 comes in 4s; the rest's first 2 are read ahead into the other 2
     * staging blobs while the first part is held */
    struct shoal_expert_store *s = open_store(params(2 * BLOB, SHOAL_IO_URING, 2));
    int32_t ids[N_EXPERT] = {0, 1, 2, 3, 4, 5, 6, 7};
    struct shoal_expert_weights w[N_EXPERT];
    struct shoal_err err = {0};
    int64_t done = 0, parts = 0;
    while (done < N_EXPERT) {
        int m = shoal_expert_store_acquire_batch(s, 1, ids + done, N_EXPERT - done, w, &err);
        cr_assert(m >= 1, "%s", err.msg);
        for (int i = 0; i < m; i++)
            check_bytes(&w[i], 1, ids[done + i]);
        shoal_expert_store_release_batch(s, 1, ids + done, m);
        done += m;
        parts++;
    }
    struct shoal_expert_store_stats st;
    stats(s, &st);
    cr_assert(eq(i64, parts, 2));
    cr_assert(eq(u64, st.staged_reads, 4));
    cr_assert(eq(u64, st.read_ahead, 2));
    cr_assert(eq(u64, st.disk_reads, N_EXPERT));
    cr_assert(eq(u64, st.bytes_read, N_EXPERT * BLOB));
    cr_assert(eq(u64, st.staging_bytes, 4 * BLOB), "2 x queue depth");
    cr_assert(st.peak_expert_bytes <= 6 * BLOB, "cache + staging bound, got %llu",
              (unsigned long long)st.peak_expert_bytes);
    cr_assert(st.cached_bytes <= 2 * BLOB);
    shoal_expert_store_destroy(s);
    rm_rf(F.dir);
}

Test(expert_store, zero_budget_caches_nothing, .timeout = 60)
{
    make(0);
    struct shoal_expert_store *s = open_store(params(0, SHOAL_IO_PREAD, 8));
    int32_t ids[3] = {2, 4, 6};
    struct shoal_expert_weights w[3];
    struct shoal_err err = {0};
    for (int rep = 0; rep < 2; rep++) {
        cr_assert(eq(int, shoal_expert_store_acquire_batch(s, 2, ids, 3, w, &err), 3));
        for (int i = 0; i < 3; i++)
            check_bytes(&w[i], 2, ids[i]);
        shoal_expert_store_release_batch(s, 2, ids, 3);
    }
    struct shoal_expert_store_stats st;
    stats(s, &st);
    cr_assert(eq(u64, st.disk_reads, 6));
    cr_assert(eq(u64, st.cached_experts, 0));
    cr_assert(eq(u64, st.cache_hits, 0));
    shoal_expert_store_destroy(s);
    rm_rf(F.dir);
}

Test(expert_store, bad_layer_or_id_is_an_error, .timeout = 30)
{
    make(1);   /* layer 1 is dense */
    struct shoal_expert_store *s = open_store(params(UINT64_MAX, SHOAL_IO_PREAD, 2));
    struct shoal_expert_weights w;
    struct shoal_err err = {0};
    cr_assert(eq(int, shoal_expert_store_acquire(s, 1, 0, &w, &err), SHOAL_EINVAL));
    cr_assert(strstr(err.msg, "layer 1") != NULL, "%s", err.msg);
    shoal_err_clear(&err);
    cr_assert(eq(int, shoal_expert_store_acquire(s, 0, N_EXPERT, &w, &err), SHOAL_EINVAL));
    cr_assert(eq(int, shoal_expert_store_acquire(s, 2, 3, &w, &err), 0));
    check_bytes(&w, 2, 3);
    shoal_expert_store_release(s, 2, 3);
    shoal_expert_store_destroy(s);
    rm_rf(F.dir);
}

/* ------------------------------------------------------------ cache policy */

static struct shoal_expert_store_params policy_params(uint64_t cache,
                                                      enum shoal_cache_policy pol)
{
    struct shoal_expert_store_params p = params(cache, SHOAL_IO_PREAD, 4);
    p.cache_policy = pol;
    p.prefetch = 0;
    return p;
}

/* Acquire layer 0's experts seq[0..n) one at a time, checking the bytes. */
static void acquire_seq(struct shoal_expert_store *s, const int *seq, size_t n)
{
    struct shoal_expert_weights w;
    struct shoal_err err = {0};
    for (size_t k = 0; k < n; k++) {
        cr_assert(eq(int, shoal_expert_store_acquire(s, 0, seq[k], &w, &err), 0), "%s",
                  err.msg);
        check_bytes(&w, 0, seq[k]);
        shoal_expert_store_release(s, 0, seq[k]);
    }
}

Test(expert_store, cache_policy_names_parse_both_ways, .timeout = 10)
{
    enum shoal_cache_policy p;
    cr_assert(eq(int, shoal_cache_policy_parse("lru", &p), 0));
    cr_assert(eq(int, (int)p, SHOAL_CACHE_LRU));
    cr_assert(eq(int, shoal_cache_policy_parse("freq", &p), 0));
    cr_assert(eq(int, (int)p, SHOAL_CACHE_FREQ));
    cr_assert(eq(int, shoal_cache_policy_parse("LFU", &p), -1));
    cr_assert(eq(int, shoal_cache_policy_parse("", &p), -1));
    cr_assert(eq(str, (char *)shoal_cache_policy_name(SHOAL_CACHE_LRU), "lru"));
    cr_assert(eq(str, (char *)shoal_cache_policy_name(SHOAL_CACHE_FREQ), "freq"));
}

Test(expert_store, unknown_cache_policy_is_refused, .timeout = 30)
{
    make(0);
    struct shoal_err err = {0};
    struct shoal_expert_store *s =
        shoal_expert_store_create(&F.ct, policy_params(3 * BLOB, (enum shoal_cache_policy)7),
                                  &err);
    cr_assert(s == NULL);
    cr_assert(eq(int, err.code, SHOAL_EINVAL));
    cr_assert(strstr(err.msg, "cache policy 7") != NULL, "%s", err.msg);
    rm_rf(F.dir);
}

/* Two hot experts, then a scan of four used once (a prompt's wide union,
 * another stream passing by): LRU lets the scan push the hot ones out,
 * FREQ keeps them and reads the scan through staging. Every counter is
 * exact. */
Test(expert_store, freq_keeps_the_hot_experts_a_scan_evicts_under_lru, .timeout = 60)
{
    make(0);
    const int seq[] = {0, 1, 0, 1, 0, 1, 2, 3, 4, 5, 6, 0, 1};
    struct shoal_expert_store_stats st;
    /* LRU: 0 1 2 fill the cache; 3 4 5 6 evict 0 1 2 3; 0 1 miss again */
    struct shoal_expert_store *s = open_store(policy_params(3 * BLOB, SHOAL_CACHE_LRU));
    acquire_seq(s, seq, sizeof seq / sizeof seq[0]);
    stats(s, &st);
    cr_assert(eq(str, (char *)st.cache_policy, "lru"));
    cr_assert(eq(u64, st.cache_hits, 4));
    cr_assert(eq(u64, st.disk_reads, 9));
    cr_assert(eq(u64, st.staged_reads, 0));
    cr_assert(eq(u64, st.evictions, 6));
    cr_assert(eq(u64, st.not_admitted, 0));
    cr_assert(eq(u64, st.bytes_read, 9 * BLOB));
    shoal_expert_store_destroy(s);
    /* FREQ: 3..6 (one acquire each) lose to 2, the least used idle expert
     * (one acquire): staged, nothing evicted; 0 and 1 hit at the end */
    s = open_store(policy_params(3 * BLOB, SHOAL_CACHE_FREQ));
    acquire_seq(s, seq, sizeof seq / sizeof seq[0]);
    stats(s, &st);
    cr_assert(eq(str, (char *)st.cache_policy, "freq"));
    cr_assert(eq(u64, st.cache_hits, 6));
    cr_assert(eq(u64, st.disk_reads, 7));
    cr_assert(eq(u64, st.staged_reads, 4));
    cr_assert(eq(u64, st.evictions, 0));
    cr_assert(eq(u64, st.not_admitted, 4));
    cr_assert(eq(u64, st.bytes_read, 7 * BLOB));
    cr_assert(eq(u64, st.cached_experts, 3));
    cr_assert(eq(u64, st.peak_expert_bytes, 3 * BLOB + BLOB),
              "the cache, and one staging blob (one expert a batch)");
    uint64_t use[N_LAYER * N_EXPERT * SHOAL_EXPERT_N_TIERS];
    shoal_expert_store_use_get(s, use);
    cr_assert(eq(u64, use[(0 * N_EXPERT + 0) * SHOAL_EXPERT_N_TIERS + SHOAL_EXPERT_TIER_CACHE],
                 3), "expert 0: read once, then 3 hits");
    cr_assert(eq(u64, use[(0 * N_EXPERT + 5) * SHOAL_EXPERT_N_TIERS + SHOAL_EXPERT_TIER_DISK],
                 1));
    shoal_expert_store_destroy(s);
    rm_rf(F.dir);
}

/* A miss enters once it has been acquired more often than the least used
 * idle expert, which it evicts; that expert is read again when used. */
Test(expert_store, freq_admits_an_expert_once_it_is_used_more, .timeout = 60)
{
    make(0);
    struct shoal_expert_store *s = open_store(policy_params(3 * BLOB, SHOAL_CACHE_FREQ));
    struct shoal_expert_store_stats st;
    const int warm[] = {0, 1, 0, 1, 2};   /* counts 0:2 1:2 2:1 */
    acquire_seq(s, warm, 5);
    const int seven[] = {7};
    acquire_seq(s, seven, 1);   /* 0 + 1 > 1? no: 7 is staged */
    stats(s, &st);
    cr_assert(eq(u64, st.not_admitted, 1));
    cr_assert(eq(u64, st.evictions, 0));
    acquire_seq(s, seven, 1);   /* 1 + 1 > 1: admitted in place of 2 */
    stats(s, &st);
    cr_assert(eq(u64, st.not_admitted, 1));
    cr_assert(eq(u64, st.evictions, 1));
    cr_assert(eq(u64, st.disk_reads, 3 + 2));
    acquire_seq(s, seven, 1);   /* cached now */
    const int zero_one[] = {0, 1};
    acquire_seq(s, zero_one, 2);
    stats(s, &st);
    cr_assert(eq(u64, st.cache_hits, 2 + 1 + 2));
    cr_assert(eq(u64, st.disk_reads, 5), "0 and 1 stayed");
    const int two[] = {2};
    acquire_seq(s, two, 1);
    stats(s, &st);
    cr_assert(eq(u64, st.disk_reads, 6), "2 was the one evicted");
    cr_assert(eq(u64, st.bytes_read, 6 * BLOB));
    shoal_expert_store_destroy(s);
    rm_rf(F.dir);
}

/* Counts halve every SHOAL_CACHE_FREQ_WINDOW x capacity acquires, so
 * experts hot long ago (here 500 acquires each) give way to those hot now
 * within a few windows, not after 500 acquires; and not at once. */
Test(expert_store, freq_counts_age_so_a_new_hot_pair_replaces_the_old, .timeout = 60)
{
    make(0);
    struct shoal_expert_store *s = open_store(policy_params(2 * BLOB, SHOAL_CACHE_FREQ));
    struct shoal_expert_store_stats st;
    static int seq[1000];
    for (int k = 0; k < 1000; k++)
        seq[k] = k % 2;   /* 0 and 1: 500 acquires each */
    acquire_seq(s, seq, 1000);
    stats(s, &st);
    cr_assert(eq(u64, st.disk_reads, 2));
    /* now only 2 and 3, alternating, until both stay in the cache */
    const int window = SHOAL_CACHE_FREQ_WINDOW * 2;
    int n_acq = 0, both = 0;
    while (!both && n_acq < 20 * window) {
        const uint64_t before = (stats(s, &st), st.disk_reads);
        const int pair[] = {2, 3};
        acquire_seq(s, pair, 2);
        n_acq += 2;
        stats(s, &st);
        both = st.disk_reads == before;
    }
    cr_assert(both, "2 and 3 never both stayed in the cache");
    cr_assert(n_acq <= 4 * window, "%d acquires of 2 and 3 before they stayed", n_acq);
    cr_assert(n_acq >= 8, "%d acquires of 2 and 3 replaced 0 and 1", n_acq);
    const int old[] = {0, 1};
    const uint64_t before = st.disk_reads;
    acquire_seq(s, old, 2);
    stats(s, &st);
    cr_assert(eq(u64, st.disk_reads, before + 2), "0 and 1 were evicted");
    shoal_expert_store_destroy(s);
    rm_rf(F.dir);
}

/* Prefetches meet the same admission: a hint does not push out experts
 * used more often than the ones it names; it reads them into staging,
 * where the hinted layer's acquire takes the one it uses and drops the
 * other (an unused prefetch). */
Test(expert_store, freq_hints_do_not_evict_hotter_experts, .timeout = 60)
{
    make(0);
    struct shoal_expert_store_params p = policy_params(2 * BLOB, SHOAL_CACHE_FREQ);
    p.prefetch = 1;
    struct shoal_expert_store *s = open_store(p);
    const int hot[] = {0, 1, 0, 1};
    acquire_seq(s, hot, 4);
    int32_t hint[2] = {5, 6};
    shoal_expert_store_hint(s, 1, hint, 2);
    struct shoal_expert_store_stats st;
    stats(s, &st);
    cr_assert(eq(u64, st.prefetch_reads, 2));
    cr_assert(eq(u64, st.prefetch_staged, 2));
    cr_assert(eq(u64, st.prefetch_dropped, 0));
    cr_assert(eq(u64, st.not_admitted, 2));
    cr_assert(eq(u64, st.evictions, 0));
    struct shoal_expert_weights w;
    struct shoal_err err = {0};
    cr_assert(eq(int, shoal_expert_store_acquire(s, 1, 5, &w, &err), 0), "%s", err.msg);
    check_bytes(&w, 1, 5);
    shoal_expert_store_release(s, 1, 5);
    stats(s, &st);
    cr_assert(eq(u64, st.inflight_hits, 1), "5: the prefetch read into staging");
    cr_assert(eq(u64, st.prefetch_used, 1));
    cr_assert(eq(u64, st.prefetch_evicted, 1), "6: dropped unused");
    cr_assert(eq(u64, st.disk_reads, 2), "only 0 and 1 were read on demand");
    acquire_seq(s, hot, 2);
    stats(s, &st);
    cr_assert(eq(u64, st.cache_hits, 4), "0 and 1 stayed");
    /* 6's read, dropped, either landed or was cancelled */
    for (int k = 0; k < 1000 && st.bytes_read < 4 * BLOB && !st.reads_cancelled; k++) {
        usleep(1000);
        stats(s, &st);
    }
    cr_assert(eq(u64, st.bytes_read + st.reads_cancelled * BLOB, 4 * BLOB),
              "0, 1, 5 read once each, 6 read or cancelled");
    shoal_expert_store_destroy(s);
    rm_rf(F.dir);
}

/* Whatever each policy keeps, batches over the budget are served in parts
 * with the container's bytes (the rest read ahead, hints into the cache or
 * staging, some of them dropped), and the memory bound holds. */
Test(expert_store, every_policy_serves_the_same_bytes_within_the_budget, .timeout = 60)
{
    make(0);
    for (int pol = 0; pol < 2; pol++) {
        struct shoal_expert_store_params p =
            policy_params(3 * BLOB, (enum shoal_cache_policy)pol);
        p.prefetch = 1;
        struct shoal_expert_store *s = open_store(p);
        struct shoal_err err = {0};
        uint64_t x = 12345;
        for (int step = 0; step < 60; step++) {
            int32_t ids[N_EXPERT];
            int n = 0;
            for (int ie = 0; ie < N_EXPERT; ie++) {
                x = x * 6364136223846793005ull + 1442695040888963407ull;
                if ((x >> 60) < (uint64_t)(ie < 2 ? 14 : 5))   /* 0, 1 hot */
                    ids[n++] = ie;
            }
            if (!n)
                continue;
            const int64_t il = step % 2 ? 2 : 0;
            if (step % 3) {   /* a hint, as the router lookahead gives: some right */
                int32_t h[3] = {ids[0], (int32_t)((x >> 20) % N_EXPERT),
                                (int32_t)((x >> 30) % N_EXPERT)};
                shoal_expert_store_hint(s, il, h, 3);
            }
            for (int i0 = 0; i0 < n;) {
                struct shoal_expert_weights w[N_EXPERT];
                int m = shoal_expert_store_acquire_batch(s, il, ids + i0, n - i0, w, &err);
                cr_assert(m >= 1, "policy %d step %d: %s", pol, step, err.msg);
                for (int i = 0; i < m; i++)
                    check_bytes(&w[i], il, ids[i0 + i]);
                shoal_expert_store_release_batch(s, il, ids + i0, m);
                i0 += m;
            }
            struct shoal_expert_store_stats st;
            stats(s, &st);
            cr_assert(st.cached_bytes <= 3 * BLOB);
            cr_assert(st.peak_expert_bytes <= 3 * BLOB + 2 * 4 * BLOB);
        }
        shoal_expert_store_destroy(s);
    }
    rm_rf(F.dir);
}

/* ------------------------------------------------------------ pinned */

Test(expert_store, pinned_hot_set_follows_counts_and_is_never_evicted, .timeout = 60)
{
    make(0);
    /* history: (2,5) hottest, then (0,3), then (1,1) */
    char *path = shoal_path_join(F.dir, "routing_counts.json");
    struct shoal_hot_set *h = shoal_hot_set_open(path, F.ct.fingerprint, N_LAYER, N_EXPERT,
                                                 SHOAL_HOT_SET_DECAY);
    shoal_hot_set_add(h, 2, 5, 30);
    shoal_hot_set_add(h, 0, 3, 20);
    shoal_hot_set_add(h, 1, 1, 10);
    cr_assert(eq(int, shoal_hot_set_save(h, NULL), 0));
    shoal_hot_set_destroy(h);
    struct shoal_expert_store_params p = params(BLOB, SHOAL_IO_PREAD, 2);
    p.pin_bytes = 2 * BLOB + BLOB / 2;   /* room for 2 */
    p.learn = 1;
    struct shoal_expert_store *s = open_store(p);
    struct shoal_expert_store_stats st;
    stats(s, &st);
    cr_assert(eq(u64, st.pinned_experts, 2));
    cr_assert(eq(u64, st.pinned_bytes, 2 * BLOB));
    cr_assert(eq(u64, st.bytes_read, 2 * BLOB), "the pins are read at create");
    /* churn the 1-blob LRU through every expert of every layer, twice */
    struct shoal_expert_weights w;
    struct shoal_err err = {0};
    for (int rep = 0; rep < 2; rep++)
        for (int il = 0; il < N_LAYER; il++)
            for (int ie = 0; ie < N_EXPERT; ie++) {
                cr_assert(eq(int, shoal_expert_store_acquire(s, il, ie, &w, &err), 0));
                check_bytes(&w, il, ie);
                shoal_expert_store_release(s, il, ie);
                int32_t id = ie;
                shoal_expert_store_learn(s, il, &id, 1, 1);
            }
    stats(s, &st);
    cr_assert(eq(u64, st.pinned_hits, 4), "(2,5) and (0,3), twice each");
    cr_assert(eq(u64, st.disk_reads, 2 * (N_LAYER * N_EXPERT - 2)));
    cr_assert(eq(u64, st.pinned_experts, 2));
    cr_assert(st.cached_bytes <= BLOB);
    cr_assert(st.peak_expert_bytes <= 2 * BLOB + BLOB + 2 * BLOB,
              "pin + cache + staging, got %llu", (unsigned long long)st.peak_expert_bytes);
    shoal_expert_store_destroy(s);   /* saves: 30 * 0.9 + 2 */
    h = shoal_hot_set_open(path, F.ct.fingerprint, N_LAYER, N_EXPERT, SHOAL_HOT_SET_DECAY);
    cr_assert(epsilon_eq(dbl, shoal_hot_set_count(h, 2, 5), 30 * SHOAL_HOT_SET_DECAY + 2, 1e-6));
    cr_assert(epsilon_eq(dbl, shoal_hot_set_count(h, 0, 0), 2, 1e-6));
    shoal_hot_set_destroy(h);
    free(path);
    rm_rf(F.dir);
}

/* use_get: the per-(layer, expert) split of the tier counters */
Test(expert_store, use_counts_split_the_tier_counters_by_expert, .timeout = 60)
{
    make(1);   /* layer 1 dense: its counts stay 0 */
    char *path = shoal_path_join(F.dir, "routing_counts.json");
    struct shoal_hot_set *h = shoal_hot_set_open(path, F.ct.fingerprint, N_LAYER, N_EXPERT,
                                                 SHOAL_HOT_SET_DECAY);
    shoal_hot_set_add(h, 2, 5, 30);
    cr_assert(eq(int, shoal_hot_set_save(h, NULL), 0));
    shoal_hot_set_destroy(h);
    struct shoal_expert_store_params p = params(BLOB, SHOAL_IO_PREAD, 2);
    p.pin_bytes = BLOB;   /* pins (2,5) */
    struct shoal_expert_store *s = open_store(p);
    uint64_t use[N_LAYER][N_EXPERT][SHOAL_EXPERT_N_TIERS];
    memset(use, 0xff, sizeof use);
    shoal_expert_store_use_get(s, &use[0][0][0]);
    for (int i = 0; i < N_LAYER * N_EXPERT * SHOAL_EXPERT_N_TIERS; i++)
        cr_assert(eq(u64, (&use[0][0][0])[i], 0), "nothing acquired yet (pins are not)");
    /* (0,1) disk then cache; (2,5) pinned twice; (0,2) disk, evicting (0,1);
     * (0,1) disk again */
    struct { int il, ie; } seq[] = {{0, 1}, {0, 1}, {2, 5}, {2, 5}, {0, 2}, {0, 1}};
    struct shoal_expert_weights w;
    struct shoal_err err = {0};
    for (size_t k = 0; k < sizeof seq / sizeof seq[0]; k++) {
        cr_assert(eq(int, shoal_expert_store_acquire(s, seq[k].il, seq[k].ie, &w, &err), 0),
                  "%s", err.msg);
        shoal_expert_store_release(s, seq[k].il, seq[k].ie);
    }
    shoal_expert_store_use_get(s, &use[0][0][0]);
    cr_assert(eq(u64, use[0][1][SHOAL_EXPERT_TIER_DISK], 2));
    cr_assert(eq(u64, use[0][1][SHOAL_EXPERT_TIER_CACHE], 1));
    cr_assert(eq(u64, use[0][1][SHOAL_EXPERT_TIER_PINNED], 0));
    cr_assert(eq(u64, use[2][5][SHOAL_EXPERT_TIER_PINNED], 2));
    cr_assert(eq(u64, use[0][2][SHOAL_EXPERT_TIER_DISK], 1));
    /* the per-expert counts add up to the store's totals */
    uint64_t sum[SHOAL_EXPERT_N_TIERS] = {0};
    for (int il = 0; il < N_LAYER; il++)
        for (int ie = 0; ie < N_EXPERT; ie++)
            for (int t = 0; t < SHOAL_EXPERT_N_TIERS; t++) {
                sum[t] += use[il][ie][t];
                if (il == 1)
                    cr_assert(eq(u64, use[il][ie][t], 0), "dense layer");
            }
    struct shoal_expert_store_stats st;
    stats(s, &st);
    cr_assert(eq(u64, sum[SHOAL_EXPERT_TIER_PINNED], st.pinned_hits));
    cr_assert(eq(u64, sum[SHOAL_EXPERT_TIER_CACHE], st.cache_hits + st.inflight_hits));
    cr_assert(eq(u64, sum[SHOAL_EXPERT_TIER_DISK], st.disk_reads));
    cr_assert(eq(u64, sum[0] + sum[1] + sum[2], 6));
    shoal_expert_store_destroy(s);
    free(path);
    rm_rf(F.dir);
}

Test(expert_store, nothing_routed_leaves_the_counts_file_alone, .timeout = 30)
{
    make(0);
    struct shoal_expert_store_params p = params(UINT64_MAX, SHOAL_IO_PREAD, 2);
    p.learn = 1;
    shoal_expert_store_destroy(open_store(p));
    char *path = shoal_path_join(F.dir, "routing_counts.json");
    cr_assert(eq(int, shoal_exists(path), 0), "a store that routed nothing must not decay the counts");
    free(path);
    rm_rf(F.dir);
}

/* ------------------------------------------------------------ prefetch */

Test(expert_store, hints_prefetch_into_the_cache_and_count_precision_recall, .timeout = 60)
{
    make(0);
    struct shoal_expert_store *s = open_store(params(UINT64_MAX, SHOAL_IO_URING, 4));
    cr_assert(eq(int, shoal_expert_store_wants_hints(s), 1));
    int32_t hint[6] = {1, 2, 3, 2, 1, 99};   /* duplicates and an out-of-range id */
    shoal_expert_store_hint(s, 1, hint, 6);
    int32_t ids[3] = {1, 2, 4};
    struct shoal_expert_weights w[3];
    struct shoal_err err = {0};
    cr_assert(eq(int, shoal_expert_store_acquire_batch(s, 1, ids, 3, w, &err), 3));
    for (int i = 0; i < 3; i++)
        check_bytes(&w[i], 1, ids[i]);
    shoal_expert_store_release_batch(s, 1, ids, 3);
    struct shoal_expert_store_stats st;
    stats(s, &st);
    cr_assert(eq(u64, st.hints, 1));
    cr_assert(eq(u64, st.hinted, 3));
    cr_assert(eq(u64, st.prefetch_reads, 3));
    cr_assert(eq(u64, st.prefetch_used, 2), "precision 2/3");
    cr_assert(eq(u64, st.used_after_hint, 3));
    cr_assert(eq(u64, st.used_hinted, 2), "recall 2/3");
    cr_assert(eq(u64, st.disk_reads, 1));
    cr_assert(eq(u64, st.cache_hits + st.inflight_hits, 2));
    /* the next layer's acquire closes layer 1's step: no more recall counting */
    cr_assert(eq(int, shoal_expert_store_acquire_batch(s, 2, ids, 1, w, &err), 1));
    shoal_expert_store_release_batch(s, 2, ids, 1);
    stats(s, &st);
    cr_assert(eq(u64, st.used_after_hint, 3));
    shoal_expert_store_destroy(s);
    rm_rf(F.dir);
}

Test(expert_store, unused_hint_backs_off_at_its_step_and_a_probe_reads_one, .timeout = 60)
{
    make(0);
    struct shoal_expert_store *s = open_store(params(UINT64_MAX, SHOAL_IO_PREAD, 4));
    int32_t hint[7] = {0, 1, 2, 3, 4, 5, 6};
    cr_assert(eq(int, shoal_expert_store_wants_hints(s), 1));
    shoal_expert_store_hint(s, 1, hint, 7);
    /* the step the hint was for uses none of them: 0.9^7 < 0.5, backing off
     * now, while the 7 experts are still in the (unlimited) cache */
    int32_t id = 7;
    struct shoal_expert_weights w;
    struct shoal_err err = {0};
    cr_assert(eq(int, shoal_expert_store_acquire_batch(s, 1, &id, 1, &w, &err), 1), "%s", err.msg);
    check_bytes(&w, 1, id);
    shoal_expert_store_release_batch(s, 1, &id, 1);
    /* one call in 32 is a probe, which reads 1 of the 7 experts it names */
    cr_assert(eq(int, shoal_expert_store_wants_hints(s), 1), "the first call probes");
    shoal_expert_store_hint(s, 2, hint, 7);
    struct shoal_expert_store_stats st;
    stats(s, &st);
    cr_assert(eq(u64, st.prefetch_reads, 7 + 1), "a probe reads 1");
    for (int k = 0; k < 31; k++)
        cr_assert(eq(int, shoal_expert_store_wants_hints(s), 0), "call %d backs off", k);
    stats(s, &st);
    cr_assert(eq(u64, st.hints_backed_off, 31));
    cr_assert(eq(u64, st.prefetch_evicted, 0), "nothing was evicted: judged at the step");
    shoal_expert_store_destroy(s);
    rm_rf(F.dir);
}

Test(expert_store, start_hint_wait_then_release_without_wait_is_safe, .timeout = 60)
{
    make(0);
    struct shoal_expert_store *s = open_store(params(2 * BLOB, SHOAL_IO_URING, 2));
    int32_t ids[N_EXPERT] = {0, 1, 2, 3, 4, 5, 6, 7};
    struct shoal_expert_weights w[N_EXPERT];
    struct shoal_err err = {0};
    /* start, hint the next layer while the reads run, wait */
    int m = shoal_expert_store_acquire_start(s, 0, ids, N_EXPERT, &err);
    cr_assert(eq(int, m, 4), "2 in the cache + 2 staging: %s", err.msg);
    shoal_expert_store_hint(s, 1, ids, 3);
    cr_assert(eq(int, shoal_expert_store_acquire_wait(s, w, &err), 0), "%s", err.msg);
    for (int i = 0; i < m; i++)
        check_bytes(&w[i], 0, ids[i]);
    shoal_expert_store_release_batch(s, 0, ids, m);
    /* start then release at once: release waits for the staging reads */
    m = shoal_expert_store_acquire_start(s, 2, ids + 4, 4, &err);
    cr_assert(m >= 1, "%s", err.msg);
    shoal_expert_store_release_batch(s, 2, ids + 4, m);
    cr_assert(eq(int, shoal_expert_store_acquire_wait(s, w, &err), SHOAL_EINVAL),
              "wait without start is refused");
    struct shoal_expert_store_stats st;
    stats(s, &st);
    cr_assert(st.cached_bytes <= 2 * BLOB);
    cr_assert(st.peak_expert_bytes <= 2 * BLOB + 2 * 2 * BLOB,
              "cache + staging (2 x queue depth), got %llu",
              (unsigned long long)st.peak_expert_bytes);
    shoal_expert_store_destroy(s);
    rm_rf(F.dir);
}

Test(expert_store, hints_never_exceed_the_cache_budget, .timeout = 60)
{
    make(0);
    struct shoal_expert_store *s = open_store(params(2 * BLOB, SHOAL_IO_PREAD, 2));
    int32_t hint[5] = {0, 1, 2, 3, 4};
    shoal_expert_store_hint(s, 0, hint, 5);
    struct shoal_expert_store_stats st;
    stats(s, &st);
    /* two fit the cache (a hint never evicts its own), two are read ahead
     * into staging (queue depth 2), one is dropped */
    cr_assert(eq(u64, st.prefetch_reads, 4));
    cr_assert(eq(u64, st.prefetch_staged, 2));
    cr_assert(eq(u64, st.prefetch_dropped, 1));
    cr_assert(st.cached_bytes <= 2 * BLOB);
    cr_assert(st.peak_expert_bytes <= 2 * BLOB + 2 * 2 * BLOB);
    /* prefetch off: hints are ignored */
    shoal_expert_store_destroy(s);
    struct shoal_expert_store_params p = params(UINT64_MAX, SHOAL_IO_PREAD, 4);
    p.prefetch = 0;
    s = open_store(p);
    cr_assert(eq(int, shoal_expert_store_wants_hints(s), 0));
    shoal_expert_store_hint(s, 0, hint, 5);
    stats(s, &st);
    cr_assert(eq(u64, st.prefetch_reads, 0));
    cr_assert(eq(u64, st.hints, 0));
    shoal_expert_store_destroy(s);
    rm_rf(F.dir);
}

/* ------------------------------------------------------------ errors, mirrors */

static void flip_byte(const char *path, uint64_t off)
{
    FILE *f = fopen(path, "r+b");
    cr_assert(f != NULL);
    fseek(f, (long)off, SEEK_SET);
    int c = fgetc(f);
    fseek(f, (long)off, SEEK_SET);
    fputc(c ^ 0xff, f);
    fclose(f);
}

Test(expert_store, checksum_mismatch_names_file_layer_expert_offset, .timeout = 30)
{
    make(0);
    uint64_t off = shoal_container_expert_offset(&F.ct, 2, 6);
    flip_byte(F.path, off + 100);
    struct shoal_expert_store *s = open_store(params(UINT64_MAX, SHOAL_IO_URING, 2));
    int32_t ids[2] = {5, 6};
    struct shoal_expert_weights w[2];
    struct shoal_err err = {0};
    cr_assert(eq(int, shoal_expert_store_acquire_batch(s, 2, ids, 2, w, &err), SHOAL_EFORMAT));
    char want[256];
    snprintf(want, sizeof want, "checksum mismatch: '%s' layer 2 expert 6 at offset %llu",
             F.path, (unsigned long long)off);
    cr_assert(strstr(err.msg, want) != NULL, "%s", err.msg);
    /* nothing is held after an error, and the good expert still works */
    cr_assert(eq(int, shoal_expert_store_acquire_batch(s, 2, ids, 1, w, &err), 1));
    check_bytes(&w[0], 2, 5);
    shoal_expert_store_release_batch(s, 2, ids, 1);
    shoal_expert_store_destroy(s);
    rm_rf(F.dir);
}

/* contract 3: an int4 expert whose group scale is not finite (a file's
 * bytes; shoal convert never writes one) is refused at its first read, after
 * its xxh64 passed, naming the layer, the expert, the component, the row and
 * the group; the other experts still serve */
Test(expert_store, nonfinite_int4_scale_is_refused_naming_where, .timeout = 30)
{
    make(0);
    /* the components as INT4A8 [16][64], G=32: rows of 2 scales + 32 bytes */
    const size_t rb = shoal_quant_row_bytes(SHOAL_QUANT_INT4, 64, 32);
    F.ct.experts_dtype = SHOAL_DTYPE_INT4A8;
    F.ct.experts_group = 32;
    for (int c = 0; c < 3; c++)
        F.ct.comp[c] = (struct shoal_expert_component){.dtype = SHOAL_DTYPE_INT4A8,
                                                       .group = 32, .rows = 16, .cols = 64,
                                                       .offset = (uint64_t)c * 2048,
                                                       .bytes = 16 * rb};
    /* layer 1's blobs: random quants, every scale 1.0f, then expert 3's
     * w_up row 7 group 1 NaN and expert 5's w_down row 0 group 0 -inf; the
     * manifest's xxh64 of each updated */
    const float one = 1.0f, nan = NAN, ninf = -INFINITY;
    FILE *fp = fopen(F.path, "r+b");
    cr_assert(fp != NULL);
    for (int ie = 0; ie < N_EXPERT; ie++) {
        static unsigned char b[BLOB];
        fill_blob(b, 1, ie);
        for (int c = 0; c < 3; c++)
            for (int r = 0; r < 16; r++)
                for (int g = 0; g < 2; g++)
                    memcpy(b + c * 2048 + r * rb + 4 * g, &one, 4);
        if (ie == 3)
            memcpy(b + 1 * 2048 + 7 * rb + 4 * 1, &nan, 4);
        if (ie == 5)
            memcpy(b + 2 * 2048, &ninf, 4);
        F.xxh[1 * N_EXPERT + ie] = XXH64(b, BLOB, 0);
        cr_assert(eq(int, fseek(fp, (long)shoal_container_expert_offset(&F.ct, 1, ie), SEEK_SET),
                     0));
        cr_assert(eq(sz, fwrite(b, 1, BLOB, fp), BLOB));
    }
    fclose(fp);
    struct shoal_expert_store *s = open_store(params(UINT64_MAX, SHOAL_IO_PREAD, 2));
    struct shoal_expert_weights w[2];
    struct shoal_err err = {0};
    int32_t ids[2] = {2, 3};
    cr_assert(eq(int, shoal_expert_store_acquire_batch(s, 1, ids, 2, w, &err), SHOAL_EFORMAT));
    cr_assert(strstr(err.msg, "layer 1 expert 3") != NULL, "%s", err.msg);
    cr_assert(strstr(err.msg, "tensor 'w_up': group scale (row 7, group 1) is nan; expected a "
                              "finite f32") != NULL, "%s", err.msg);
    cr_assert(strstr(err.msg, "checksum") == NULL, "%s", err.msg);
    int32_t five = 5;
    err = (struct shoal_err){0};   /* shoal_err_set keeps the first error */
    cr_assert(eq(int, shoal_expert_store_acquire_batch(s, 1, &five, 1, w, &err), SHOAL_EFORMAT));
    cr_assert(strstr(err.msg, "layer 1 expert 5") != NULL &&
              strstr(err.msg, "tensor 'w_down': group scale (row 0, group 0) is -inf") != NULL,
              "%s", err.msg);
    /* a finite expert of the same layer still serves (nothing held after the errors) */
    err = (struct shoal_err){0};
    cr_assert(ge(int, shoal_expert_store_acquire_batch(s, 1, ids, 1, w, &err), 0), "%s",
              err.msg);
    cr_assert(eq(int, w[0].w_up.dtype, SHOAL_DTYPE_INT4A8));
    shoal_expert_store_release_batch(s, 1, ids, 1);
    shoal_expert_store_destroy(s);
    rm_rf(F.dir);
}

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static int n_warn;
static char last_warn[1024];

static void sink(enum shoal_log_level level, const char *component, const char *line,
                 void *user)
{
    (void)user;
    (void)component;
    if (level != SHOAL_LOG_WARN)
        return;
    pthread_mutex_lock(&log_mu);
    n_warn++;
    snprintf(last_warn, sizeof last_warn, "%s", line);
    pthread_mutex_unlock(&log_mu);
}

static char mirror_dir[64];

static void make_mirror(uint64_t fingerprint)
{
    snprintf(mirror_dir, sizeof mirror_dir, "/tmp/shoal-mirror-XXXXXX");
    cr_assert(mkdtemp(mirror_dir) != NULL);
    struct fixture *m = malloc(sizeof *m);
    write_container(m, mirror_dir, fingerprint, 0);
    free(m);
}

Test(expert_store, bad_copy_on_a_mirror_falls_back_with_one_warning, .timeout = 60)
{
    make(0);
    make_mirror(F.ct.fingerprint);
    /* the even experts of every layer damaged on the mirror. Which source
     * reads an expert depends on the mirror's (random) path; with the mirror
     * weighted 3:1 some damaged and some intact expert land on it except
     * with probability about 2 * (1/4)^12 */
    char mpath[128];
    snprintf(mpath, sizeof mpath, "%s/experts.bin", mirror_dir);
    for (int il = 0; il < N_LAYER; il++)
        for (int ie = 0; ie < N_EXPERT; ie += 2)
            flip_byte(mpath, shoal_container_expert_offset(&F.ct, il, ie) + 7);
    shoal_log_set_sink(sink, NULL);
    struct shoal_expert_store_params p = params(UINT64_MAX, SHOAL_IO_PREAD, 4);
    const char *mirrors[1] = {mirror_dir};
    double weights[2] = {1, 3};
    p.mirrors = mirrors;
    p.n_mirror = 1;
    p.source_weights = weights;
    p.n_source_weights = 2;
    struct shoal_expert_store *s = open_store(p);
    int32_t ids[N_EXPERT] = {0, 1, 2, 3, 4, 5, 6, 7};
    struct shoal_expert_weights w[N_EXPERT];
    struct shoal_err err = {0};
    for (int il = 0; il < N_LAYER; il++) {
        cr_assert(eq(int, shoal_expert_store_acquire_batch(s, il, ids, N_EXPERT, w, &err),
                     N_EXPERT), "%s", err.msg);
        for (int i = 0; i < N_EXPERT; i++)
            check_bytes(&w[i], il, i);
        shoal_expert_store_release_batch(s, il, ids, N_EXPERT);
    }
    struct shoal_expert_store_stats st;
    stats(s, &st);
    cr_assert(eq(int, st.n_source, 2));
    cr_assert(st.source[1].errors >= 1, "some damaged expert hashes to the mirror");
    cr_assert(eq(u64, st.source_fallbacks, st.source[1].errors));
    cr_assert(eq(u64, st.source[0].reads + st.source[1].reads, N_LAYER * N_EXPERT),
              "each expert read once: nothing is cached twice");
    cr_assert(st.source[1].reads > 0 && st.source[0].reads > 0, "both sources serve");
#if defined(__linux__)
    /* the damaged copies were mapped, failed their checksum, and were read
     * again from the container into the same buffers */
    cr_assert(st.mapped_reads > 0, "the warm copies were mapped");
#endif
    pthread_mutex_lock(&log_mu);
    int warned = n_warn;
    pthread_mutex_unlock(&log_mu);
    cr_assert(warned >= 1 && warned <= 3, "rate-limited warnings, got %d", warned);
    cr_assert(strstr(last_warn, "checksum mismatch") != NULL, "%s", last_warn);
    cr_assert(strstr(last_warn, "reading it from") != NULL, "%s", last_warn);
    shoal_expert_store_destroy(s);
    shoal_log_set_sink(NULL, NULL);
    rm_rf(mirror_dir);
    rm_rf(F.dir);
}

Test(expert_store, damaged_everywhere_is_an_error_naming_the_expert, .timeout = 60)
{
    make(0);
    make_mirror(F.ct.fingerprint);
    char mpath[128];
    snprintf(mpath, sizeof mpath, "%s/experts.bin", mirror_dir);
    uint64_t off = shoal_container_expert_offset(&F.ct, 1, 4);
    flip_byte(mpath, off + 1);
    flip_byte(F.path, off + 1);
    shoal_log_set_sink(sink, NULL);
    struct shoal_expert_store_params p = params(UINT64_MAX, SHOAL_IO_URING, 4);
    const char *mirrors[1] = {mirror_dir};
    p.mirrors = mirrors;
    p.n_mirror = 1;
    struct shoal_expert_store *s = open_store(p);   /* weights from the probe */
    struct shoal_expert_weights w;
    struct shoal_err err = {0};
    cr_assert(eq(int, shoal_expert_store_acquire(s, 1, 4, &w, &err), SHOAL_EFORMAT));
    cr_assert(strstr(err.msg, "layer 1 expert 4") != NULL, "%s", err.msg);
    cr_assert(strstr(err.msg, "every source failed") != NULL, "%s", err.msg);
    shoal_expert_store_destroy(s);
    shoal_log_set_sink(NULL, NULL);
    rm_rf(mirror_dir);
    rm_rf(F.dir);
}

Test(expert_store, mirror_of_another_model_is_refused, .timeout = 30)
{
    make(0);
    make_mirror(0x1234);
    struct shoal_expert_store_params p = params(UINT64_MAX, SHOAL_IO_PREAD, 2);
    const char *mirrors[1] = {mirror_dir};
    p.mirrors = mirrors;
    p.n_mirror = 1;
    struct shoal_err err = {0};
    cr_assert(shoal_expert_store_create(&F.ct, p, &err) == NULL);
    cr_assert(strstr(err.msg, "another model") != NULL, "%s", err.msg);
    cr_assert(strstr(err.msg, mirror_dir) != NULL, "%s", err.msg);
    cr_assert(strstr(err.msg, "0000000000001234") != NULL, "%s", err.msg);
    rm_rf(mirror_dir);
    rm_rf(F.dir);
}

Test(expert_store, missing_mirror_is_reported_once_and_ignored, .timeout = 30)
{
    make(0);
    shoal_log_set_sink(sink, NULL);
    struct shoal_expert_store_params p = params(UINT64_MAX, SHOAL_IO_PREAD, 2);
    const char *mirrors[1] = {"/nonexistent/shoal-mirror"};
    p.mirrors = mirrors;
    p.n_mirror = 1;
    struct shoal_expert_store *s = open_store(p);
    cr_assert(eq(int, n_warn, 1));
    cr_assert(strstr(last_warn, "/nonexistent/shoal-mirror") != NULL, "%s", last_warn);
    struct shoal_expert_store_stats st;
    stats(s, &st);
    cr_assert(eq(int, st.n_source, 1));
    struct shoal_expert_weights w;
    cr_assert(eq(int, shoal_expert_store_acquire(s, 0, 0, &w, NULL), 0));
    check_bytes(&w, 0, 0);
    shoal_expert_store_release(s, 0, 0);
    shoal_expert_store_destroy(s);
    shoal_log_set_sink(NULL, NULL);
    rm_rf(F.dir);
}

Test(expert_store, weights_count_must_match_sources, .timeout = 30)
{
    make(0);
    struct shoal_expert_store_params p = params(UINT64_MAX, SHOAL_IO_PREAD, 2);
    double weights[2] = {1, 2};
    p.source_weights = weights;
    p.n_source_weights = 2;   /* but no mirror */
    struct shoal_err err = {0};
    cr_assert(shoal_expert_store_create(&F.ct, p, &err) == NULL);
    cr_assert(eq(int, err.code, SHOAL_EINVAL));
    cr_assert(strstr(err.msg, "2 source weights") != NULL, "%s", err.msg);
    rm_rf(F.dir);
}

/* ------------------------------------------------------------ rendezvous */

#define N_KEYS 200000

Test(rendezvous, shares_follow_the_weights)
{
    const uint64_t seeds[4] = {11, 22, 33, 44};
    const double weights[4] = {1, 2, 3, 4};
    int64_t n[4] = {0};
    for (uint64_t k = 0; k < N_KEYS; k++)
        n[shoal_expert_store_rendezvous(k, seeds, weights, 4)]++;
    for (int i = 0; i < 4; i++) {
        double share = (double)n[i] / N_KEYS, want = weights[i] / 10.0;
        cr_assert(epsilon_eq(dbl, share, want, 0.01), "source %d: share %.4f, weight share %.2f",
                  i, share, want);
    }
}

Test(rendezvous, removing_a_source_moves_only_its_keys)
{
    const uint64_t seeds[4] = {101, 202, 303, 404};
    const double weights[4] = {3, 1, 2, 5};
    const uint64_t seeds3[3] = {101, 303, 404};   /* source 1 removed */
    const double weights3[3] = {3, 2, 5};
    const int map3[3] = {0, 2, 3};
    int64_t moved = 0, owned_by_1 = 0;
    for (uint64_t k = 0; k < N_KEYS; k++) {
        int a = shoal_expert_store_rendezvous(k << 32 | (k % 97), seeds, weights, 4);
        int b = map3[shoal_expert_store_rendezvous(k << 32 | (k % 97), seeds3, weights3, 3)];
        owned_by_1 += a == 1;
        if (a != 1)
            cr_assert(eq(int, b, a), "key %llu moved from %d to %d", (unsigned long long)k, a, b);
        moved += a != b;
    }
    cr_assert(eq(i64, moved, owned_by_1));
    cr_assert(owned_by_1 > N_KEYS / 20, "the removed source owned its share (%lld)",
              (long long)owned_by_1);
}

Test(rendezvous, is_deterministic_and_ignores_non_positive_weights)
{
    const uint64_t seeds[3] = {1, 2, 3};
    const double weights[3] = {0, 1, -1};
    for (uint64_t k = 0; k < 1000; k++)
        cr_assert(eq(int, shoal_expert_store_rendezvous(k, seeds, weights, 3), 1));
    const double zero[3] = {0, 0, 0};
    int first = shoal_expert_store_rendezvous(77, seeds, zero, 3);
    cr_assert(first >= 0 && first < 3, "all zero: treated as equal");
    cr_assert(eq(int, shoal_expert_store_rendezvous(77, seeds, zero, 3), first));
}
