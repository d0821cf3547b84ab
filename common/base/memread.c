/* The RAM probes' read loop (memread.h). */
#include "memread.h"

#include <string.h>

typedef uint64_t v2u64 __attribute__((vector_size(16)));

static uint64_t read_tail(const uint8_t *p, size_t bytes, uint64_t x)
{
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        uint64_t u;
        memcpy(&u, p + i, sizeof u);
        x ^= u;
    }
    return x;
}

/* 16-byte vectors, 8 accumulators: SSE2 on x86-64, NEON on aarch64 */
static uint64_t read_v16(const uint8_t *p, size_t bytes)
{
    v2u64 a[8] = {{0}};
    size_t i = 0;
    for (; i + 128 <= bytes; i += 128)
        for (int k = 0; k < 8; k++) {
            v2u64 v;
            memcpy(&v, p + i + 16 * k, sizeof v);
            a[k] ^= v;
        }
    for (int k = 1; k < 8; k++)
        a[0] ^= a[k];
    return read_tail(p + i, bytes - i, a[0][0] ^ a[0][1]);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
typedef uint64_t v4u64 __attribute__((vector_size(32)));

__attribute__((target("avx2"))) static uint64_t read_v32(const uint8_t *p, size_t bytes)
{
    v4u64 a[4] = {{0}};
    size_t i = 0;
    for (; i + 128 <= bytes; i += 128)
        for (int k = 0; k < 4; k++) {
            v4u64 v;
            memcpy(&v, p + i + 32 * k, sizeof v);
            a[k] ^= v;
        }
    for (int k = 1; k < 4; k++)
        a[0] ^= a[k];
    return read_tail(p + i, bytes - i, a[0][0] ^ a[0][1] ^ a[0][2] ^ a[0][3]);
}
#endif

uint64_t shoal_mem_read_xor(const void *p, size_t bytes)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (__builtin_cpu_supports("avx2"))
        return read_v32(p, bytes);
#endif
    return read_v16(p, bytes);
}
