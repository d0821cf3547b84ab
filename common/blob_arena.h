/* blob_arena: the expert store's blob buffers (one expert's packed weights
 * each, all the same size) in one reserved address range backed by 2 MiB
 * transparent huge pages where the kernel offers them (Linux
 * madvise(MADV_HUGEPAGE)).
 *
 * Why: a decode token streams its experts' weights once from RAM. In 4 KiB
 * pages each page is a TLB walk on the only memory stream of a thread; in
 * huge pages one thread's expert compute ran 1.14-1.30x faster on an AMD
 * EPYC Zen 4 VM (docs/BENCHMARKS.md, "Expert blobs in huge pages"). At two
 * threads the memory's rate bounds it either way. Performance only: no
 * result depends on where a blob lies.
 *
 * The range is reserved for max_blobs slots (MAP_NORESERVE: pages are
 * committed only when first written, so the resident size is the most
 * slots ever in use at once, never more than the caller's bound). Slots are
 * handed out lowest first and reused last-freed first. Each slot is
 * blob_bytes rounded up to 4 KiB and 4 KiB aligned (O_DIRECT reads land in
 * it). Freed slots stay resident for the next blob (as the store's spare
 * buffers did); the memory returns to the system when the arena is
 * destroyed.
 *
 * Thread: not thread-safe; the caller serializes (the expert store holds
 * its mutex). */
#ifndef SHOAL_BLOB_ARENA_H
#define SHOAL_BLOB_ARENA_H

#include <stddef.h>
#include <stdint.h>

struct shoal_blob_arena;

/* An arena of max_blobs slots of blob_bytes each. Returns NULL (nothing
 * allocated; the caller falls back to one allocation per blob) when
 * blob_bytes or max_blobs is 0, the range does not fit size_t, or the
 * address space cannot be reserved (an RLIMIT_AS, strict overcommit). */
struct shoal_blob_arena *shoal_blob_arena_create(size_t blob_bytes, int64_t max_blobs);

/* A free slot (4 KiB aligned, blob_bytes usable), or NULL when all
 * max_blobs are in use. Its bytes are those the slot last held (zero when
 * new). */
void *shoal_blob_arena_get(struct shoal_blob_arena *a);

/* 1 if p is a slot of a (a may be NULL: 0). */
int shoal_blob_arena_owns(const struct shoal_blob_arena *a, const void *p);

/* Return slot p (shoal_blob_arena_owns(a, p) must hold; not already free). */
void shoal_blob_arena_put(struct shoal_blob_arena *a, void *p);

/* Slots in use now, and bytes of the reserved range (tests, logs). */
int64_t shoal_blob_arena_in_use(const struct shoal_blob_arena *a);
size_t shoal_blob_arena_reserved(const struct shoal_blob_arena *a);

/* Unmap the range (every slot, in use or not) and free a. NULL: no-op. */
void shoal_blob_arena_destroy(struct shoal_blob_arena *a);

#endif
