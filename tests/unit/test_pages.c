#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pages.h"

#define MIB ((size_t)1 << 20)

/* 1 if the page at p is mapped in this process */
static int page_mapped(const void *p)
{
    unsigned char v;
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    return mincore((void *)((uintptr_t)p & ~(pg - 1)), 1, &v) == 0;
}

/* the VmFlags line of the smaps entry holding p ("" if none) */
static void vm_flags(const void *p, char *out, size_t cap)
{
    out[0] = 0;
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return;
    char line[512];
    int in = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
            continue;
        }
        if (in && !strncmp(line, "VmFlags:", 8)) {
            snprintf(out, cap, "%.200s", line + 8);
            break;
        }
    }
    fclose(f);
}

Test(pages, zero_bytes_and_impossible_sizes_are_null)
{
    cr_assert(eq(ptr, shoal_pages_map(0), NULL));
    cr_assert(eq(ptr, shoal_pages_map(SIZE_MAX), NULL));
    cr_assert(eq(ptr, shoal_pages_map(SIZE_MAX - 4096), NULL));
    cr_assert(eq(ptr, shoal_pages_map(SIZE_MAX / 2), NULL));
    shoal_pages_unmap(NULL, 123);   /* nothing to do */
}

Test(pages, buffers_are_zeroed_writable_aligned_and_trimmed)
{
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    const size_t sizes[] = {1, 4096, 2 * MIB - 1, 2 * MIB, 5 * MIB + 123, 9 * MIB};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        const size_t n = sizes[k];
        uint8_t *p = shoal_pages_map(n);
        cr_assert(ne(ptr, p, NULL), "size %zu", n);
        cr_assert(eq(u64, (uintptr_t)p % pg, 0), "size %zu: not page-aligned", n);
        if (n >= 2 * MIB)
            cr_assert(eq(u64, (uintptr_t)p % (2 * MIB), 0), "size %zu: not 2 MiB-aligned", n);
        for (size_t i = 0; i < n; i += 511)
            cr_assert(eq(u8, p[i], 0), "size %zu: byte %zu not zero", n, i);
        cr_assert(eq(u8, p[n - 1], 0));
        for (size_t i = 0; i < n; i++)
            p[i] = (uint8_t)(i * 7 + k);
        for (size_t i = 0; i < n; i += 997)
            cr_assert(eq(u8, p[i], (uint8_t)(i * 7 + k)));
        /* the over-mapping past the buffer was given back */
        const uint8_t *end = (const uint8_t *)(((uintptr_t)p + n + pg - 1) & ~(uintptr_t)(pg - 1));
        if (n >= 2 * MIB)
            cr_assert(not(page_mapped(end)), "size %zu: the page after the buffer is mapped", n);
        char fl[256];
        vm_flags(p, fl, sizeof fl);
#ifdef MADV_HUGEPAGE
        if (n >= 2 * MIB && access("/sys/kernel/mm/transparent_hugepage/enabled", R_OK) == 0)
            cr_assert(ne(ptr, strstr(fl, " hg"), NULL), "size %zu: not marked for huge pages: %s",
                      n, fl);
#endif
        shoal_pages_unmap(p, n);
        cr_assert(not(page_mapped(p)), "size %zu: still mapped after unmap", n);
    }
}

Test(pages, advise_marks_a_range_mapped_again_in_place)
{
    uint8_t *p = shoal_pages_map(4 * MIB);
    cr_assert(ne(ptr, p, NULL));
    void *q = mmap(p, 4 * MIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
                   0);
    cr_assert(eq(ptr, q, (void *)p));
    shoal_pages_advise(p, 4 * MIB);
    char fl[256];
    vm_flags(p, fl, sizeof fl);
#ifdef MADV_HUGEPAGE
    if (access("/sys/kernel/mm/transparent_hugepage/enabled", R_OK) == 0)
        cr_assert(ne(ptr, strstr(fl, " hg"), NULL), "not marked: %s", fl);
#endif
    shoal_pages_unmap(p, 4 * MIB);
}
