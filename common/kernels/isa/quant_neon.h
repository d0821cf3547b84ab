/* quant_neon.h: helpers the NEON quant files share (quant_neon.c,
 * quant_neon_dot.c). Internal to common/; include only from aarch64 builds.
 *
 * INT4A8 "pieces": 16 packed bytes of an INT4 row are 32 columns i0 ..
 * i0 + 31 (i0 a multiple of 32): their low nibbles are the even columns, at
 * the activation's chunk position 16 k .. 16 k + 15 for piece k of its
 * 128-column chunk, their high nibbles the odd ones, 64 further on (chunk
 * order, struct shoal_quant_act in quant.h). */
#ifndef SHOAL_QUANT_NEON_H
#define SHOAL_QUANT_NEON_H

#include <arm_neon.h>
#include <stdint.h>
#include <string.h>

/* The 16 packed bytes of the piece at column i0 of a row of n columns whose
 * quants start at qs. A partial last piece (n - i0 < 32) goes through a
 * zeroed copy: the bytes past the row belong to the next one, and the
 * activation's columns past n are 0. */
static inline uint8x16_t shoal_neon_a8_piece(const uint8_t *qs, int64_t i0, int64_t n)
{
    if (n - i0 >= 32)
        return vld1q_u8(qs + i0 / 2);
    uint8_t buf[16] = {0};
    memcpy(buf, qs + i0 / 2, (size_t)((n - i0 + 1) / 2));
    return vld1q_u8(buf);
}

/* A token's activations for the piece at column i0: the 16 even columns at
 * the result, the 16 odd ones at result + 64. */
static inline const int8_t *shoal_neon_a8_act(const int8_t *q, int64_t i0)
{
    return q + (i0 - (i0 & 127)) + (i0 & 127) / 2;
}

/* The f32 scale of group g of a quantized row. */
static inline float shoal_neon_scale(const void *row, int64_t g)
{
    float d;
    memcpy(&d, (const uint8_t *)row + 4 * (size_t)g, sizeof d);
    return d;
}

#endif
