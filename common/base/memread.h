#ifndef SHOAL_MEMREAD_H
#define SHOAL_MEMREAD_H

#include <stddef.h>
#include <stdint.h>

/* XOR of every 8-byte word of p[0 .. bytes) (bytes a multiple of 8; p
 * 8-byte aligned at least), read front to back with the widest loads this
 * CPU has (AVX2's 32 bytes on x86-64 where present, 16-byte vectors
 * otherwise) and eight independent accumulators: the read loop of the RAM
 * probes (shoal bench, bench/kernel_bench, bench/ram_probe), i.e. what
 * "RAM read bandwidth" means in every ratio shoal prints. A scalar 8-byte
 * loop measured 20-25 % below this on Zen 3 (docs/BENCHMARKS.md "The RAM
 * probe"), which overstated every ratio against it. Returns the XOR (keep it,
 * so the loads are not dropped). Thread: any; reads only. */
uint64_t shoal_mem_read_xor(const void *p, size_t bytes);

#endif
