/* ggml_types_impl: what ggml_types.c, ggml_dequant.c and ggml_grids.c share,
 * and the dot products (ggml_dot.c, isa/ggml_avx2.c) read
 * (not a public header: include ggml_types.h).
 *
 * One scalar reference dequantization per type (the shoal_ggml_dequant_fn
 * contract of ggml_types.h: one block of type_size bytes in, block_size
 * floats out), and the IQ types' codebooks. Thread: any. */
#ifndef SHOAL_GGML_TYPES_IMPL_H
#define SHOAL_GGML_TYPES_IMPL_H

#include <stdint.h>

#define SHOAL_GGML_QK_K 256 /* super-block of the K-quants and IQ types */

/* The 6-bit scale and min of sub-block j < 8 of Q4_K and Q5_K, packed in
 * the block's 12 scale bytes q (ggml-quants.c get_scale_min_k4). */
static inline void shoal_ggml_scale_min_k4(int j, const uint8_t *q, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0F) | (q[j - 4] >> 6) << 4;
        *m = (q[j + 4] >> 4) | (q[j] >> 6) << 4;
    }
}

void shoal_ggml_dequant_f32(const uint8_t *src, float *dst);
void shoal_ggml_dequant_f16(const uint8_t *src, float *dst);
void shoal_ggml_dequant_bf16(const uint8_t *src, float *dst);
void shoal_ggml_dequant_q4_0(const uint8_t *src, float *dst);
void shoal_ggml_dequant_q4_1(const uint8_t *src, float *dst);
void shoal_ggml_dequant_q5_0(const uint8_t *src, float *dst);
void shoal_ggml_dequant_q5_1(const uint8_t *src, float *dst);
void shoal_ggml_dequant_q8_0(const uint8_t *src, float *dst);
void shoal_ggml_dequant_q2_k(const uint8_t *src, float *dst);
void shoal_ggml_dequant_q3_k(const uint8_t *src, float *dst);
void shoal_ggml_dequant_q4_k(const uint8_t *src, float *dst);
void shoal_ggml_dequant_q5_k(const uint8_t *src, float *dst);
void shoal_ggml_dequant_q6_k(const uint8_t *src, float *dst);
void shoal_ggml_dequant_iq4_nl(const uint8_t *src, float *dst);
void shoal_ggml_dequant_iq4_xs(const uint8_t *src, float *dst);
void shoal_ggml_dequant_mxfp4(const uint8_t *src, float *dst);
void shoal_ggml_dequant_iq2_xxs(const uint8_t *src, float *dst);
void shoal_ggml_dequant_iq3_xxs(const uint8_t *src, float *dst);
void shoal_ggml_dequant_iq1_s(const uint8_t *src, float *dst);
void shoal_ggml_dequant_iq1_m(const uint8_t *src, float *dst);
void shoal_ggml_dequant_iq2_xs(const uint8_t *src, float *dst);
void shoal_ggml_dequant_iq2_s(const uint8_t *src, float *dst);
void shoal_ggml_dequant_iq3_s(const uint8_t *src, float *dst);

/* Codebooks (ggml_grids.c): entry i of ggml-common.h's table, one code of
 * 2 (iq2xxs, iq2xs, iq2s, iq1s) or 3 (iq3xxs, iq3s) bits per element,
 * element 0 in the low bits (ggml_grids.c says where the values come
 * from). */
extern const uint16_t shoal_ggml_iq2xxs_codes[256];
extern const uint16_t shoal_ggml_iq3xxs_codes[256];
extern const uint16_t shoal_ggml_iq1s_codes[2048];
extern const uint16_t shoal_ggml_iq2xs_codes[512];
extern const uint16_t shoal_ggml_iq2s_codes[1024];
extern const uint16_t shoal_ggml_iq3s_codes[512];

/* The grid codebooks expanded to a byte per element, and sign patterns,
 * for the SIMD rows (isa/ggml_avx2.c, isa/ggml_neon.c; ggml_grid_bytes.c).
 * Built once by shoal_ggml_grid_bytes_init (pthread_once: any thread, each
 * rows call makes it before its first read), read only after. */
struct shoal_ggml_grid_bytes {
    uint64_t iq2xxs[256], iq2xs[512], iq2s[1024];   /* bytes |c|: 8, 25, 43 */
    uint32_t iq3xxs[256];                            /* bytes |c|: 4 .. 62 */
    uint32_t iq3s[512];                              /* bytes |c|: 1 .. 15 */
    uint64_t iq1s[2048];                             /* bytes 8 g: -8, 0, 8 */
    uint64_t sign7[128];   /* bytes +1 / -1 of a 7-bit sign index (bit e set:
                            * byte e -1), byte 7 -1 when the count is odd
                            * (ggml-common.h ksigns_iq2xs) */
    uint64_t sign8[256];   /* bytes -1 where a bit of a whole sign byte is set */
    uint8_t ksign[128];    /* a 7-bit sign index with its parity as bit 7
                            * (ggml-common.h ksigns_iq2xs itself) */
};
extern struct shoal_ggml_grid_bytes shoal_ggml_grid_bytes;
void shoal_ggml_grid_bytes_init(void);

/* ggml-common.h kvalues_iq4nl and kvalues_mxfp4 (E2M1 times 2), as the dot
 * products' integer codes (ggml_dot.c) */
extern const int8_t shoal_ggml_iq4nl_values[16];
extern const int8_t shoal_ggml_mxfp4_values[16];

#endif
