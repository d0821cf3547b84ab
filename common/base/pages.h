#ifndef SHOAL_PAGES_H
#define SHOAL_PAGES_H

#include <stddef.h>

/* Anonymous memory for large buffers that are streamed (expert blobs, the
 * KV cache, the RAM probes' arrays), asking the kernel for transparent huge
 * pages.
 *
 * A stream through 4 KiB pages pays a TLB miss every 4 KiB (in a VM, a
 * two-level page walk). On an AMD EPYC Zen 4 guest (2 vCPUs) the INT4A8
 * rows at 4 tokens ran 1.3x faster from 2 MiB pages and the RAM probe's
 * read 1.2-1.7x (docs/BENCHMARKS.md "Huge pages: expert buffers, the KV
 * cache, the RAM probe"). Linux gives them under THP "madvise" (Debian's
 * default) only to ranges marked MADV_HUGEPAGE, and only to 2 MiB-aligned
 * 2 MiB pieces, so a buffer of 2 MiB or more starts at a 2 MiB boundary.
 * 2 MiB is the huge page of x86-64 and of aarch64 with 4 KiB pages; with
 * 16 or 64 KiB pages (32 or 512 MiB huge pages) the buffers stay on small
 * pages, as on macOS or with THP "never": a plain anonymous mapping.
 * Performance only: no result depends on it. Each buffer of 2 MiB or more
 * is a mapping of its own (the alignment leaves gaps), counted against
 * vm.max_map_count (65530 by default) with the other mappings. */

/* bytes (> 0) of zeroed anonymous read-write memory, page-aligned, 2 MiB-
 * aligned when bytes >= 2 MiB. NULL when out of memory. Free with
 * shoal_pages_unmap(p, bytes). Thread: any. */
void *shoal_pages_map(size_t bytes);

/* Zeroed anonymous read-write pages again at [p, p + bytes) (p page-
 * aligned, any length), replacing what was mapped there (MAP_FIXED: a
 * file mapping, say), marked for huge pages as shoal_pages_map's are.
 * Returns 0, or -errno (the range may then be unmapped). Thread: any. */
int shoal_pages_remap(void *p, size_t bytes);

/* Unmap what shoal_pages_map returned (NULL: nothing). Thread: any. */
void shoal_pages_unmap(void *p, size_t bytes);

#endif
