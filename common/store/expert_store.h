/* expert_store: the routed experts of a container, served from RAM tiers
 * and read from disk on demand (DESIGN §4).
 *
 * Tiers, in the order an acquire looks:
 *   pinned   a hot-set read at create under its own byte budget (pin_bytes),
 *            ranked by routing counts persisted across runs (hot_set.h);
 *            never evicted
 *   cache    under a byte budget (cache_bytes), in recency order;
 *            prefetched experts land here too. What it keeps is the
 *            policy's (cache_policy): LRU evicts the least recent idle
 *            expert and admits every miss; FREQ admits a miss only when it
 *            has been acquired more often than the least used of the
 *            SHOAL_CACHE_FREQ_SAMPLE least recent idle experts, which it
 *            then evicts (counts per expert, halved every
 *            SHOAL_CACHE_FREQ_WINDOW x the cache's capacity in experts
 *            acquires), else reads it into staging: a prompt's wide union
 *            or a stream's passing experts do not push out the experts
 *            that several streams keep using
 *   disk     one aligned read of the expert's blob (O_DIRECT/F_NOCACHE when
 *            asked) through an I/O engine (io_engine.h: io_uring or a pread
 *            pool, queue_depth reads in flight), checked against the
 *            manifest's xxh64 on an io thread before anyone sees it.
 * Experts that fit neither budget are read into a fixed staging area of
 * 2 x queue_depth blobs (up to queue_depth for the batch being acquired,
 * up to queue_depth read ahead: below), so expert RAM never exceeds
 *   pin_bytes + cache_bytes + 2 * queue_depth * blob_bytes.
 *
 * A layer's batch-union is acquired at once: every missing expert is read
 * in parallel, then the caller computes and releases the batch. A hint
 * (router lookahead for the next layer) starts reads early; they land in
 * the cache, or, where the cache does not take them, in staging. When a
 * union is acquired in parts (acquire_batch returns m < n), the reads of
 * the rest start into staging at once, while the caller computes the
 * first part. Sources: the container's experts.bin plus mirrors (copies with
 * the same fingerprint); each expert is read from one source chosen by
 * weighted rendezvous hashing, so nothing is cached twice, and a read
 * error or checksum mismatch on one source falls back to the next.
 *
 * On a shard (container.h) the store serves only the experts the shard
 * holds: acquiring another is -SHOAL_ENOTFOUND, hints skip them, the
 * pinned hot-set is chosen among held experts, and a mirror must be a copy
 * of the same shard (same fingerprint and held set).
 *
 * None of this changes a byte the caller sees (DESIGN contract 1): every
 * view points at the verified bytes of the container's blob, whatever the
 * tier, engine, source or timing.
 *
 * Thread: one thread (the coordinator's main thread) calls the store; its
 * reads complete on io threads, which take the store's lock briefly.
 */
#ifndef SHOAL_EXPERT_STORE_H
#define SHOAL_EXPERT_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "container.h"
#include "err.h"
#include "io_engine.h"
#include "model.h"

#define SHOAL_EXPERT_STORE_MAX_SOURCES 8   /* the container + 7 mirrors */

/* What the cache tier keeps (params.cache_policy; --cache-policy). Either
 * way the bytes an acquire returns are the same: only which experts are
 * read again changes. */
enum shoal_cache_policy {
    SHOAL_CACHE_LRU = 0,         /* evict the least recently acquired; admit every miss */
    SHOAL_CACHE_FREQ = 1,        /* frequency-aware admission and eviction (above) */
};
#define SHOAL_CACHE_FREQ_SAMPLE 8    /* idle experts from the LRU end compared */
#define SHOAL_CACHE_FREQ_WINDOW 16   /* acquires per halving, x capacity in experts */

/* "lru" or "freq" -> *out; -1 for anything else. Thread: any. */
int shoal_cache_policy_parse(const char *s, enum shoal_cache_policy *out);
/* "lru" or "freq"; static. Thread: any. */
const char *shoal_cache_policy_name(enum shoal_cache_policy p);

struct shoal_expert_store_params {
    uint64_t cache_bytes;        /* cache budget, bytes; UINT64_MAX = unlimited */
    enum shoal_cache_policy cache_policy; /* what the cache keeps (default FREQ: it read
                                  * 0.6-0.85x the bytes of LRU in bench/serve_bench.py
                                  * and shoal bench, docs/BENCHMARKS.md) */
    uint64_t pin_bytes;          /* pinned hot-set budget, bytes; 0 = none */
    int direct;                  /* 1: O_DIRECT (Linux) / F_NOCACHE (macOS) reads */
    struct shoal_io_engine_params io;  /* engine kind and queue depth */
    int prefetch;                /* 1: act on hints (router lookahead) */
    int learn;                   /* 1: count routings and save them at destroy */
    const char *const *mirrors;  /* [n_mirror] container directories, borrowed */
    int n_mirror;                /* 0..SHOAL_EXPERT_STORE_MAX_SOURCES-1 */
    const double *source_weights;/* [n_source_weights] read weights, the container
                                  * first, then each mirror; borrowed; NULL: measure
                                  * with a short read probe at create */
    int n_source_weights;        /* 0 or 1 + n_mirror */
    const char *counts_fallback_dir; /* routing counts go here when the container
                                  * directory is not writable; borrowed; NULL: none */
};

static inline struct shoal_expert_store_params shoal_expert_store_params_default(void)
{
    return (struct shoal_expert_store_params){.cache_bytes = UINT64_MAX,
                                              .cache_policy = SHOAL_CACHE_FREQ,
                                              .io = shoal_io_engine_params_default(),
                                              .prefetch = 1,
                                              .learn = 1};
}

struct shoal_expert_store_source_stats {
    const char *path;         /* experts.bin of the source; borrowed from the store */
    double weight;            /* rendezvous weight (probe MB/s or given) */
    int direct;               /* 1 when O_DIRECT/F_NOCACHE is in effect */
    uint64_t reads;           /* blobs read and verified */
    uint64_t bytes_read;      /* bytes of those blobs */
    uint64_t errors;          /* failed reads and checksum mismatches */
    double busy_seconds;      /* wall time with at least one read in flight here */
};

/* A snapshot of the store's counters (plain data; see
 * shoal_expert_store_stats_get). Acquires count each expert of a batch
 * once; "used" means acquired by the forward pass. */
struct shoal_expert_store_stats {
    /* demand acquires by tier */
    uint64_t pinned_hits;        /* served by the pinned hot-set */
    uint64_t cache_hits;         /* cache tier, bytes already there */
    uint64_t inflight_hits;      /* joined a prefetch: a read still in flight into the
                                  * cache, or one read ahead into staging */
    uint64_t disk_reads;         /* read on demand (misses) */
    uint64_t staged_reads;       /* of disk_reads: read into staging (over budget) */
    uint64_t read_ahead;         /* staging reads of a union's rest started while its
                                  * first part was acquired (each counted in disk_reads
                                  * when acquired) */
    /* I/O, every source and purpose (demand, prefetch, pin) */
    uint64_t bytes_read;         /* verified blob bytes */
    uint64_t mapped_reads;       /* of the reads, experts found in the page cache and
                                  * mapped from it, not copied (--direct off, Linux;
                                  * their bytes counted in bytes_read too) */
    double read_busy_seconds;    /* wall time with at least one read in flight */
    double stall_seconds;        /* the caller waiting for reads in acquire_batch */
    uint64_t tokens;             /* tokens routed (counted at the first MoE layer) */
    uint64_t source_fallbacks;   /* reads retried on another source after an error */
    /* prefetch (router lookahead) */
    uint64_t hints;              /* hint calls that were acted on */
    uint64_t hinted;             /* distinct experts named by those hints */
    uint64_t prefetch_reads;     /* reads started by hints */
    uint64_t prefetch_staged;    /* of those, into staging (the cache did not take them) */
    uint64_t prefetch_used;      /* of those, acquired by the forward pass */
    uint64_t prefetch_dropped;   /* hinted experts not read: no room in the cache */
    uint64_t hints_backed_off;   /* hint calls not acted on: most recent prefetches went
                                  * unused (the back-off in shoal_expert_store_hint) */
    uint64_t used_after_hint;    /* experts acquired in layer steps that had a hint */
    uint64_t used_hinted;        /* of those, named by the hint (recall numerator) */
    /* memory */
    uint64_t evictions;          /* cache entries dropped for room */
    uint64_t not_admitted;       /* misses (demand or prefetch) the FREQ policy kept out
                                  * of the cache: the idle experts it would have evicted
                                  * were acquired as often or more */
    uint64_t prefetch_evicted;   /* prefetched and never used: evicted from the cache,
                                  * or dropped from staging */
    uint64_t reads_cancelled;    /* reads into staging dropped before they finished
                                  * (a background read stops between pieces) */
    uint64_t cached_bytes, cached_experts;   /* cache tier now (reads in flight included) */
    uint64_t pinned_bytes, pinned_experts;   /* pinned tier */
    uint64_t staging_bytes;      /* staging blobs allocated (fixed overhead) */
    uint64_t peak_expert_bytes;  /* max of pinned + cached + staging bytes */
    /* configuration */
    const char *io_engine;       /* "uring" or "pread"; static */
    const char *cache_policy;    /* "lru" or "freq"; static */
    int queue_depth;
    const char *counts_path;     /* routing counts sidecar or NULL; borrowed from the store */
    int n_source;
    struct shoal_expert_store_source_stats source[SHOAL_EXPERT_STORE_MAX_SOURCES];
};

struct shoal_expert_store;

/* Create a store over ct (borrowed; must outlive the store).
 * Opens each source (a mirror that does not exist is reported once and
 * ignored; one with another fingerprint or size is refused), starts the I/O
 * engine, measures source weights when there are mirrors and no weights,
 * loads the routing counts and reads the pinned hot-set.
 * If O_DIRECT cannot be used on a file system the source falls back to
 * buffered reads and logs it once.
 * Returns the store (owned by the caller) or NULL with err set: a source
 * cannot be opened, a mirror does not match, weights are malformed, a
 * pinned expert cannot be read or verified, or -SHOAL_ENOMEM with the byte
 * count. Thread: main. */
struct shoal_expert_store *shoal_expert_store_create(const struct shoal_container *ct,
                                                     struct shoal_expert_store_params p,
                                                     struct shoal_err *err);

/* Wait for reads in flight, save the routing counts (when learn and any
 * routing was recorded; a failure is logged), free everything. NULL is a
 * no-op. Thread: main. */
void shoal_expert_store_destroy(struct shoal_expert_store *s);

/* Make experts (il, ids[i]) resident, reading the missing ones in parallel,
 * and point out[i] at their weights.
 *   il    a MoE layer of the container
 *   ids   [n] i32 distinct expert ids (a batch-union), borrowed
 *   out   [n] views, written for i < the returned count; valid until
 *         shoal_expert_store_release_batch
 * Returns m in [1, n]: ids[0..m) are acquired. m < n only when the cache
 * budget and the staging area cannot hold the whole union at once: compute
 * and release the first m, then acquire the rest. Errors (nothing is held
 * then): -SHOAL_EINVAL (bad il or id, n < 1, a batch already held),
 * -SHOAL_ENOTFOUND (an expert a shard does not hold: "layer L expert E is
 * not in this shard (DIR holds X of Y experts)"), -errno
 * or -SHOAL_EIO when every source failed to read an expert, -SHOAL_EFORMAT
 * on a checksum mismatch on every source (err names the file, layer, expert
 * and offset), -SHOAL_ENOMEM. Blocks until the reads are done.
 * Thread: main. */
int shoal_expert_store_acquire_batch(struct shoal_expert_store *s, int64_t il,
                                     const int32_t *ids, int64_t n,
                                     struct shoal_expert_weights *out,
                                     struct shoal_err *err);

/* acquire_batch in two steps, so that a caller can do something (hint the
 * next layer) while the reads run: start holds ids[0..m) and submits the
 * missing reads without waiting, returning m as acquire_batch does (or a
 * negative status, nothing held); wait blocks until they are verified and
 * writes out[0..m), or returns the first read error (nothing held then).
 * Between them only hint, learn and stats may be called.
 *   out  [m] views, written on success
 * Thread: main. */
int shoal_expert_store_acquire_start(struct shoal_expert_store *s, int64_t il,
                                     const int32_t *ids, int64_t n, struct shoal_err *err);
int shoal_expert_store_acquire_wait(struct shoal_expert_store *s,
                                    struct shoal_expert_weights *out, struct shoal_err *err);

/* Release the batch returned by the last acquire_batch or acquire_start
 * (the same il, ids and count m): its experts become evictable, staging
 * blobs free. Waits for reads still in flight. Thread: main. */
void shoal_expert_store_release_batch(struct shoal_expert_store *s, int64_t il,
                                      const int32_t *ids, int64_t m);

/* One expert: acquire_batch/release_batch with n = 1. Thread: main. */
int shoal_expert_store_acquire(struct shoal_expert_store *s, int64_t il, int64_t ie,
                               struct shoal_expert_weights *out, struct shoal_err *err);
void shoal_expert_store_release(struct shoal_expert_store *s, int64_t il, int64_t ie);

/* 1 when the store will act on the next hint (params.prefetch, and not
 * backing off: see shoal_expert_store_hint), so a caller can skip
 * computing it (the router lookahead costs a parallel region per layer);
 * a 0 while backing off counts as a skipped hint. Thread: the store's
 * caller (takes the lock). */
int shoal_expert_store_wants_hints(struct shoal_expert_store *s);

/* Which experts of layer il are in memory or on their way (pinned, cached,
 * being read into the cache, or read ahead into staging by a hint): bit
 * ie % 8 of bits[ie / 8] set for expert ie; loading (NULL: not wanted)
 * gets the subset whose read is still under way (placement's view of a
 * worker's RAM and disk queue, the ExpertResponse's resident bitmaps).
 *   bits, loading  [(n_expert + 7) / 8] bytes each, written (all of them)
 * Returns 0, or -1 when il is out of range or holds no experts (nothing
 * written). Thread: any (takes the lock). */
int shoal_expert_store_resident_bits(struct shoal_expert_store *s, int64_t il, uint8_t *bits,
                                     uint8_t *loading);

/* 1 when every expert of layer il that this store holds is in memory
 * (pinned or cached, its read complete), so a hint for it would do
 * nothing and a caller can skip computing one (the warm case: the router
 * lookahead costs a parallel region per layer). 0 otherwise, or for a
 * layer out of range or without experts. Thread: main (takes the lock). */
int shoal_expert_store_layer_resident(struct shoal_expert_store *s, int64_t il);

/* Hint that layer il will soon use experts ids (router lookahead): start
 * reads of those not resident, into the cache tier, as far as its budget
 * (and policy) allows without evicting anything in use, else into staging
 * while fewer than queue_depth reads ahead are held; an acquire of layer
 * il that does not name one drops it (an unused prefetch). Never blocks on I/O, never
 * fails (a failed prefetch is re-read on demand), never changes what an
 * acquire returns. Backs off when prefetching does not pay: while fewer
 * than 70 % of the recent prefetched experts were used before eviction
 * (a moving average over about ten), only one hint call in 8 is acted on,
 * and on 2 of its experts (the first named), to keep measuring
 * (hints_backed_off counts the others): a wasted read costs a whole
 * expert of disk bandwidth.
 *   ids  [n_ids] i32 expert ids, duplicates allowed (e.g. [n_tok][k] top-k),
 *        borrowed; ids outside [0, n_expert) are ignored
 * Thread: main. */
void shoal_expert_store_hint(struct shoal_expert_store *s, int64_t il,
                             const int32_t *ids, int64_t n_ids);

/* Record layer il's routing (DESIGN §3 step 7): each id counts once toward
 * the persisted hot-set ranking.
 *   ids  [n_tok][k] i32 top-k expert ids, borrowed
 * Thread: main. */
void shoal_expert_store_learn(struct shoal_expert_store *s, int64_t il,
                              const int32_t *ids, int64_t n_tok, int64_t k);

/* Copy the counters into *out. Thread: any. */
void shoal_expert_store_stats_get(const struct shoal_expert_store *s,
                                  struct shoal_expert_store_stats *out);

/* The tier that served a demand acquire, for the per-expert use counts. */
enum shoal_expert_tier {
    SHOAL_EXPERT_TIER_PINNED = 0,   /* the pinned hot-set */
    SHOAL_EXPERT_TIER_CACHE,        /* the cache (resident, or a prefetch in flight or
                                     * read ahead into staging) */
    SHOAL_EXPERT_TIER_DISK,         /* read on demand (into the cache or staging) */
    SHOAL_EXPERT_N_TIERS
};

/* Copy the demand acquires of every (layer, expert) by tier since create
 * (the per-expert split of pinned_hits, cache_hits + inflight_hits and
 * disk_reads; prefetch and pin reads are not acquires). Counted under the
 * store's lock in acquire, one increment per expert of a batch; a getter
 * copies n_layer * n_expert * SHOAL_EXPERT_N_TIERS counters (a dashboard
 * polls it, e.g. once per engine step).
 *   out  [n_layer][n_expert][SHOAL_EXPERT_N_TIERS] u64 (the container's
 *        n_layer and n_expert; dense layers stay 0), written
 * Thread: any (takes the lock). */
void shoal_expert_store_use_get(const struct shoal_expert_store *s, uint64_t *out);

/* Weighted rendezvous hashing: the source in [0, n) that owns key, the one
 * maximising -weights[i] / ln(u(key, seeds[i])) with u uniform in (0, 1)
 * from a 64-bit hash. A source's share of keys is proportional to its
 * weight; removing a source moves only the keys it owned. Weights <= 0
 * never win unless all are. Ties go to the lower index.
 *   seeds, weights  [n], borrowed; n >= 1
 * Thread: any. */
int shoal_expert_store_rendezvous(uint64_t key, const uint64_t *seeds,
                                  const double *weights, int n);

#endif
