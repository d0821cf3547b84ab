/* expert_store: routed experts of a container, read from disk on demand
 * into a byte-budgeted LRU cache (DESIGN §4).
 *
 * acquire() returns views of one expert's w_gate/w_up/w_down; the bytes are
 * read with one aligned pread of the expert's blob (O_DIRECT when asked),
 * checked against the manifest's xxh64, and cached while the budget allows.
 * An acquired expert is never evicted until released. With a zero budget
 * each acquire reads into a scratch blob (nothing is cached), so results are
 * the same bytes whatever the budget: the cache changes speed, never values.
 *
 * Thread: one thread (the coordinator's main thread) calls the store.
 */
#ifndef SHOAL_EXPERT_STORE_H
#define SHOAL_EXPERT_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "container.h"
#include "err.h"
#include "model.h"

struct shoal_expert_store_params {
    uint64_t cache_bytes;   /* budget for cached blobs; UINT64_MAX = unlimited */
    int direct;             /* 1: O_DIRECT (F_NOCACHE on macOS) reads */
};

static inline struct shoal_expert_store_params shoal_expert_store_params_default(void)
{
    return (struct shoal_expert_store_params){.cache_bytes = UINT64_MAX, .direct = 0};
}

struct shoal_expert_store_stats {
    uint64_t hits, misses;       /* acquires served from cache / from disk */
    uint64_t bytes_read;         /* from experts.bin */
    double read_seconds;         /* wall time inside reads */
    uint64_t evictions;
    uint64_t cached_bytes, cached_experts;
};

struct shoal_expert_store;

/* Create a store over ct (borrowed; must outlive the store).
 * Returns NULL with err set (cannot open experts.bin). If O_DIRECT cannot be
 * used on this file system the store falls back to buffered reads and logs
 * it once. Thread: main. */
struct shoal_expert_store *shoal_expert_store_create(const struct shoal_container *ct,
                                                     struct shoal_expert_store_params p,
                                                     struct shoal_err *err);
void shoal_expert_store_destroy(struct shoal_expert_store *s);

/* Make expert (il, ie) resident and point *out at it.
 * Returns 0; -errno/SHOAL_EIO on a read error, SHOAL_EFORMAT on a checksum
 * mismatch (err names the file, layer, expert and offset). Thread: main. */
int shoal_expert_store_acquire(struct shoal_expert_store *s, int64_t il, int64_t ie,
                               struct shoal_expert_weights *out, struct shoal_err *err);

/* Done with (il, ie) for now: it becomes evictable (or is dropped at once
 * when the budget is exceeded). */
void shoal_expert_store_release(struct shoal_expert_store *s, int64_t il, int64_t ie);

const struct shoal_expert_store_stats *shoal_expert_store_stats(const struct shoal_expert_store *s);

#endif
