#include "blob_arena.h"

#include <stdlib.h>
#include <sys/mman.h>

#include "util.h"

#define SLOT_ALIGN 4096u
#define HUGE_BYTES ((size_t)2 << 20)

struct shoal_blob_arena {
    char *base;          /* 2 MiB aligned start of the slots */
    char *map;           /* what mmap returned, and its length */
    size_t map_len;
    size_t slot;         /* bytes per slot */
    int64_t n_slot;      /* max_blobs */
    int64_t n_new;       /* slots [0, n_new) have been handed out once */
    int64_t *free_ix;    /* stack of freed slot indices */
    int64_t n_free;
};

struct shoal_blob_arena *shoal_blob_arena_create(size_t blob_bytes, int64_t max_blobs)
{
    if (blob_bytes == 0 || max_blobs <= 0)
        return NULL;
    const size_t slot = (blob_bytes + SLOT_ALIGN - 1) & ~(size_t)(SLOT_ALIGN - 1);
    if (slot < blob_bytes || (uint64_t)max_blobs > (SIZE_MAX - 2 * HUGE_BYTES) / slot)
        return NULL;
    const size_t len = slot * (size_t)max_blobs;
    const size_t map_len = len + HUGE_BYTES;   /* room to align the start */
    void *m = mmap(NULL, map_len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    struct shoal_blob_arena *a = shoal_xcalloc(1, sizeof *a);
    a->map = m;
    a->map_len = map_len;
    a->base = (char *)(((uintptr_t)m + HUGE_BYTES - 1) & ~(uintptr_t)(HUGE_BYTES - 1));
    a->slot = slot;
    a->n_slot = max_blobs;
    a->free_ix = shoal_xmalloc((size_t)max_blobs * sizeof *a->free_ix);
#ifdef MADV_HUGEPAGE
    madvise(a->base, len, MADV_HUGEPAGE);   /* a hint: 4 KiB pages when refused */
#endif
    return a;
}

void *shoal_blob_arena_get(struct shoal_blob_arena *a)
{
    if (a->n_free > 0)
        return a->base + (size_t)a->free_ix[--a->n_free] * a->slot;
    if (a->n_new < a->n_slot)
        return a->base + (size_t)a->n_new++ * a->slot;
    return NULL;
}

int shoal_blob_arena_owns(const struct shoal_blob_arena *a, const void *p)
{
    if (!a || !p)
        return 0;
    const uintptr_t u = (uintptr_t)p, b = (uintptr_t)a->base;
    return u >= b && u < b + a->slot * (size_t)a->n_slot;
}

void shoal_blob_arena_put(struct shoal_blob_arena *a, void *p)
{
    a->free_ix[a->n_free++] = (int64_t)(((char *)p - a->base) / (ptrdiff_t)a->slot);
}

int64_t shoal_blob_arena_in_use(const struct shoal_blob_arena *a)
{
    return a ? a->n_new - a->n_free : 0;
}

size_t shoal_blob_arena_reserved(const struct shoal_blob_arena *a)
{
    return a ? a->slot * (size_t)a->n_slot : 0;
}

void shoal_blob_arena_destroy(struct shoal_blob_arena *a)
{
    if (!a)
        return;
    munmap(a->map, a->map_len);
    free(a->free_ix);
    free(a);
}
