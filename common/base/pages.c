/* Anonymous buffers on huge pages where the kernel offers them (pages.h). */
#include "pages.h"

#include <errno.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#define HUGE_BYTES ((size_t)2 << 20)

static size_t page_bytes(void)
{
    const long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

/* mark [p, p + bytes) for huge pages where the kernel offers them */
static void advise(void *p, size_t bytes)
{
#ifdef MADV_HUGEPAGE
    if (p && bytes)
        (void)madvise(p, bytes, MADV_HUGEPAGE);
#else
    (void)p;
    (void)bytes;
#endif
}

int shoal_pages_remap(void *p, size_t bytes)
{
    if (mmap(p, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) ==
        MAP_FAILED)
        return -errno;
    advise(p, bytes);
    return 0;
}

void *shoal_pages_map(size_t bytes)
{
    if (bytes == 0)
        return NULL;
    if (bytes < HUGE_BYTES) {
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    /* over-map by 2 MiB, keep the 2 MiB-aligned part, give the rest back */
    const size_t pg = page_bytes();
    if (bytes > SIZE_MAX - HUGE_BYTES - pg)
        return NULL;   /* no address space holds it */
    uint8_t *r = mmap(NULL, bytes + HUGE_BYTES, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED)
        return NULL;
    uint8_t *p = (uint8_t *)(((uintptr_t)r + HUGE_BYTES - 1) & ~(uintptr_t)(HUGE_BYTES - 1));
    uint8_t *end = (uint8_t *)(((uintptr_t)p + bytes + pg - 1) & ~(uintptr_t)(pg - 1));
    if (p > r)
        munmap(r, (size_t)(p - r));
    if (r + bytes + HUGE_BYTES > end)
        munmap(end, (size_t)(r + bytes + HUGE_BYTES - end));
    advise(p, bytes);
    return p;
}

void shoal_pages_unmap(void *p, size_t bytes)
{
    if (p && bytes)
        munmap(p, bytes);
}
