/* ggml_grid_bytes: the IQ codebooks (ggml_grids.c's packed codes) expanded
 * to a byte per element, and the sign patterns, that the SIMD rows kernels
 * load whole (ggml_types_impl.h, struct shoal_ggml_grid_bytes). Built once
 * at the first rows call. Thread: any (pthread_once). */
#include <pthread.h>

#include "ggml_types_impl.h"

struct shoal_ggml_grid_bytes shoal_ggml_grid_bytes;
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* the 8 bytes of a 2-bit packed grid code through values v */
static uint64_t grid8(unsigned code, const uint8_t v[4])
{
    uint64_t g = 0;
    for (int i = 0; i < 8; i++)
        g |= (uint64_t)v[(code >> (2 * i)) & 3] << (8 * i);
    return g;
}

/* the 4 bytes of a 3-bit packed grid code through values v */
static uint32_t grid4(unsigned code, const uint8_t v[8])
{
    uint32_t g = 0;
    for (int i = 0; i < 4; i++)
        g |= (uint32_t)v[(code >> (3 * i)) & 7] << (8 * i);
    return g;
}

/* bytes -1 where bit e of b is set, else +1 */
static uint64_t signs8(unsigned b)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)((b >> i) & 1 ? 0xFF : 0x01) << (8 * i);
    return v;
}

static void build(void)
{
    static const uint8_t v2[4] = {8, 25, 43, 0};
    static const uint8_t v3xxs[8] = {4, 12, 20, 28, 36, 44, 52, 62};
    static const uint8_t v3s[8] = {1, 3, 5, 7, 9, 11, 13, 15};
    struct shoal_ggml_grid_bytes *g = &shoal_ggml_grid_bytes;
    for (int e = 0; e < 256; e++) {
        g->iq2xxs[e] = grid8(shoal_ggml_iq2xxs_codes[e], v2);
        g->iq3xxs[e] = grid4(shoal_ggml_iq3xxs_codes[e], v3xxs);
    }
    for (int e = 0; e < 512; e++) {
        g->iq2xs[e] = grid8(shoal_ggml_iq2xs_codes[e], v2);
        g->iq3s[e] = grid4(shoal_ggml_iq3s_codes[e], v3s);
    }
    for (int e = 0; e < 1024; e++)
        g->iq2s[e] = grid8(shoal_ggml_iq2s_codes[e], v2);
    for (int e = 0; e < 2048; e++) {
        uint64_t v = 0;
        for (int i = 0; i < 8; i++)
            v |= (uint64_t)(uint8_t)(int8_t)(8 * ((int)((shoal_ggml_iq1s_codes[e] >> (2 * i)) & 3) - 1))
                 << (8 * i);
        g->iq1s[e] = v;
    }
    for (unsigned i7 = 0; i7 < 128; i7++) {   /* the 8th sign: the count of negatives even */
        g->ksign[i7] = (uint8_t)(i7 | (unsigned)__builtin_parity(i7) << 7);
        g->sign7[i7] = signs8(g->ksign[i7]);
    }
    for (unsigned b = 0; b < 256; b++)
        g->sign8[b] = signs8(b);
}

void shoal_ggml_grid_bytes_init(void)
{
    pthread_once(&once, build);
}
