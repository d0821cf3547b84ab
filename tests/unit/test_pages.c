#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pages.h"

#define MIB ((size_t)1 << 20)

/* 1 if the page at p is mapped in this process */
static int page_mapped(const void *p)
{
#ifdef __APPLE__
    char v;   /* macOS declares mincore's vector as char * */
#else
    unsigned char v;
#endif
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

/* VmSize of this process in kB, read without allocating (-1 if unknown) */
static long vm_size_kb(void)
{
    char buf[4096];
    const int fd = open("/proc/self/status", O_RDONLY);
    if (fd < 0)
        return -1;
    const ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    const char *v = strstr(buf, "VmSize:");
    return v ? strtol(v + 7, NULL, 10) : -1;
}

/* mappings listed in /proc/self/<name> (-1 if unreadable) */
static int count_maps(const char *name)
{
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/self/%s", name);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        n += sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ');
    }
    fclose(f);
    return n;
}

/* 1 if /proc describes this process's own mappings: qemu-user emulates
 * /proc/self/maps (the guest's) but not smaps or status (its own, with
 * qemu's mappings and allocations in them) */
static int proc_native(void)
{
    const int m = count_maps("maps"), sm = count_maps("smaps");
    return m > 0 && m == sm && vm_size_kb() > 0;
}

/* 1 if a mapping marked MADV_HUGEPAGE by this test itself shows "hg" in
 * smaps (Linux with THP; not under qemu-user, which drops the advice) */
static int hg_observable(void)
{
#ifdef MADV_HUGEPAGE
    char fl[256];
    void *p = mmap(NULL, 4 * MIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return 0;
    const int ok = madvise(p, 4 * MIB, MADV_HUGEPAGE) == 0;
    vm_flags(p, fl, sizeof fl);
    munmap(p, 4 * MIB);
    return ok && proc_native() && strstr(fl, " hg") != NULL;
#else
    return 0;
#endif
}

/* the address space grows by the buffer's pages only: the over-mapping
 * before and after a 2 MiB boundary was given back (Linux) */
Test(pages, address_space_grows_by_the_buffer_only)
{
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    if (!proc_native())
        cr_skip_test("/proc/self does not describe this process's mappings (qemu-user)");
    const size_t sizes[] = {2 * MIB, 3 * MIB + 5, 9 * MIB + 4097};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        const long before = vm_size_kb();
        void *p = shoal_pages_map(sizes[k]);
        const long after = vm_size_kb();
        cr_assert(ne(ptr, p, NULL));
        const long want = (long)(((sizes[k] + pg - 1) / pg) * pg / 1024);
        cr_assert(eq(i64, after - before, want), "size %zu: VmSize grew %ld kB, expected %ld",
                  sizes[k], after - before, want);
        shoal_pages_unmap(p, sizes[k]);
        cr_assert(eq(i64, vm_size_kb(), before), "size %zu: VmSize after unmap", sizes[k]);
    }
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
    const int hg = hg_observable();
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
        if (n >= 2 * MIB && hg)
            cr_assert(ne(ptr, strstr(fl, " hg"), NULL), "size %zu: not marked for huge pages: %s",
                      n, fl);
        shoal_pages_unmap(p, n);
        cr_assert(not(page_mapped(p)), "size %zu: still mapped after unmap", n);
    }
}

Test(pages, remap_gives_zeroed_marked_pages_in_place)
{
    uint8_t *p = shoal_pages_map(4 * MIB);
    cr_assert(ne(ptr, p, NULL));
    memset(p, 0xAB, 4 * MIB);
    cr_assert(eq(int, shoal_pages_remap(p + 4096, 3 * MIB), 0));
    cr_assert(eq(u8, p[4095], 0xAB), "the page before the range kept its bytes");
    for (size_t i = 4096; i < 4096 + 3 * MIB; i += 4093)
        cr_assert(eq(u8, p[i], 0), "byte %zu not zero after the remap", i);
    cr_assert(eq(u8, p[4096 + 3 * MIB], 0xAB), "the page after the range kept its bytes");
    char fl[256];
    vm_flags(p + 4096, fl, sizeof fl);
    if (hg_observable())
        cr_assert(ne(ptr, strstr(fl, " hg"), NULL), "not marked: %s", fl);
    shoal_pages_unmap(p, 4 * MIB);
}
