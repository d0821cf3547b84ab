/* prefetch_x86: the cache level the x86-64 kernels prefetch weights into.
 *
 * Weight streams are read once per token and prefetched 4-16 KiB ahead
 * (8 or 16 row streams side by side in the INT4A8 matvecs). Into L1
 * (_MM_HINT_T0) the lines ahead evict the block being computed from a
 * 32 KiB L1D: on an AMD EPYC Zen 4 (family 25 model 17, 2 vCPUs, 2.6 GHz)
 * the INT4A8 matvec from RAM ran 1.5-1.8x faster with the prefetches into
 * L2 (docs/BENCHMARKS_LOG.md, "Prefetch into L2"); the L1 hardware prefetcher
 * moves the lines from L2 on. Performance only: no result depends on it. */
#ifndef SHOAL_PREFETCH_X86_H
#define SHOAL_PREFETCH_X86_H

#include <xmmintrin.h>

#define SHOAL_PF_WEIGHTS _MM_HINT_T1

#endif
