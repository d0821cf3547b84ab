/* ggml_neon: ggml_dot.h's rows kernels (Q8_0, Q4_K, Q6_K and the
 * integer-form types: Q2_K, Q3_K, Q5_K, the IQ types, MXFP4, Q4_0 ..
 * Q5_1) against int8 activations with NEON (aarch64).
 *
 * Built twice (common/meson.build), each copy its own translation unit:
 *   baseline ARMv8          shoal_ggml_rows_neon (the "neon" table):
 *                           products by vmull_s8 / vmlal_high_s8, pairs of
 *                           them widened into int32 by vpadalq_s16
 *   -march=armv8.2-a+dotprod shoal_ggml_rows_neon_dotprod ("neon-dotprod"
 *                           and "neon-i8mm"): four products per int32 lane
 *                           by sdot (vdotq_s32)
 *
 * Same bits as shoal_ggml_rows_scalar: four rows run side by side, lane i
 * of every float32x4 is row i's chain of ggml_dot.h's canonical order, step
 * for step (separate vmulq_f32 / vsubq_f32 / vaddq_f32 with the operands in
 * the reference's order, -ffp-contract=off keeping them unfused;
 * vcvtq_f32_s32 rounds to nearest as (float)i does; f16 scales widen
 * exactly by vcvt_f32_f16). The integer sums are reached in another order
 * than the reference's, which is exact: in the plain form an int16 lane
 * holds two products, at most 2 * 128 * 127 = 32512 (Q8_0's -128 weight
 * against |qx| <= 127); sdot's int32 lanes cannot overflow; each lane of a
 * row's int32 accumulator holds a part of ggml_dot.h's isum, bounded by it.
 *
 * One form for every type: a block is unpacked into int8 codes per 16
 * elements with a scale (and for the types with a min, a min) per 16,
 *   Q8_0  c = q, scale 1           Q4_K  c = nibble 0..15, sc and m per 32
 *   Q6_K  c = q - 32, sc per 16    others: ggml_dot.h's shoal_ggml_iblock
 * which is the canonical isum and msum regrouped exactly (Q4_K's sum over a
 * sub-block of 32 is the sum of its two 16s; Q6_K's (q - 32) * qx is taken
 * directly instead of the reference's subtraction, the same integer). Types
 * with one scale per 32 (or 1) add both 16s' products before the multiply.
 * Q5_K, Q2_K, Q3_K, IQ4_XS, IQ4_NL and MXFP4 codes are unpacked with NEON
 * (shifts, masks, vqtbl1q_s8 for the codebooks), the grid types (IQ2_*,
 * IQ3_*, IQ1_*) from their codebooks a byte per element and the sign
 * patterns of ggml_grid_bytes.c (a multiply by +-1 bytes); Q4_0 .. Q5_1
 * take them from the scalar shoal_ggml_iblock_decode.
 *
 * Batches: a block of four rows is unpacked once into a buffer of about
 * 1.4 KiB and used for every token of the call, up to TOK_TILE tokens at a
 * time, the chains of all those tokens kept in acc[]. A decode matvec is
 * the same path with one token. Rows past the end of the share repeat its
 * last row and are not stored.
 */
#include <arm_neon.h>
#include <stdint.h>
#include <string.h>

#include "ggml_dot.h"
#include "ggml_types_impl.h"

#if defined(__ARM_FEATURE_DOTPROD)
#define ROWS_FN shoal_ggml_rows_neon_dotprod
#else
#define ROWS_FN shoal_ggml_rows_neon
#endif

#define TOK_TILE 64   /* tokens whose chains run against one unpacked block */

/* how a type's scales repeat over its 16s */
enum scale_mode {
    SCALE_ONE,   /* every scale 1: no multiply (Q8_0, blocks of 32 but Q4_1 / Q5_1's mins) */
    SCALE_32,    /* one scale (and min) per 32: sc[2j] == sc[2j + 1] */
    SCALE_16,    /* one per 16 */
};

static enum scale_mode type_scale_mode(enum shoal_ggml_type type)
{
    switch (type) {
    case SHOAL_GGML_TYPE_Q8_0: case SHOAL_GGML_TYPE_IQ4_NL: case SHOAL_GGML_TYPE_MXFP4:
    case SHOAL_GGML_TYPE_Q4_0: case SHOAL_GGML_TYPE_Q4_1:
    case SHOAL_GGML_TYPE_Q5_0: case SHOAL_GGML_TYPE_Q5_1:
        return SCALE_ONE;
    case SHOAL_GGML_TYPE_Q4_K: case SHOAL_GGML_TYPE_Q5_K: case SHOAL_GGML_TYPE_IQ4_XS:
    case SHOAL_GGML_TYPE_IQ2_XXS: case SHOAL_GGML_TYPE_IQ3_XXS: case SHOAL_GGML_TYPE_IQ1_S:
    case SHOAL_GGML_TYPE_IQ3_S:
        return SCALE_32;
    default:   /* Q6_K, Q2_K, Q3_K, IQ1_M, and any type added later: always right */
        return SCALE_16;
    }
}

/* acc + the products of a and b, 16 int8 pairs, spread over four int32 lanes */
static inline int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b)
{
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, a, b);
#else
    /* each int16 lane two products: |p| <= 2 * 128 * 127 */
    const int16x8_t p = vmlal_high_s8(vmull_s8(vget_low_s8(a), vget_low_s8(b)), a, b);
    return vpadalq_s16(acc, p);
#endif
}

/* lane i = the sum of v[i]'s four int32 lanes (exact integer sums) */
static inline int32x4_t hsum_rows4(const int32x4_t v[4])
{
    return vpaddq_s32(vpaddq_s32(v[0], v[1]), vpaddq_s32(v[2], v[3]));
}

/* each byte of v shifted down by n (0..7, a variable: vshlq by -n) */
static inline uint8x16_t shr8(uint8x16_t v, int n)
{
    return vshlq_u8(v, vdupq_n_s8((int8_t)-n));
}

/* the bits of each byte of v shifted down by n, masked with mask */
static inline int8x16_t bits8(uint8x16_t v, int n, uint8_t mask)
{
    return vreinterpretq_s8_u8(vandq_u8(shr8(v, n), vdupq_n_u8(mask)));
}

static inline uint16_t ld16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return h;
}

/* ---- a block of four rows unpacked ------------------------------------------ */

struct block4 {
    int8x16_t c[4][16];   /* [row][16s] codes */
    int32_t sc[4][16];    /* [row][16s] scale (SCALE_32: the even entries used) */
    int16_t m[16][4];     /* [16s][row] min (has_min only) */
    float d[4], dmin[4];  /* [row] D and DMIN, f32 */
};

/* 32 codes from 16 bytes of nibbles (low nibbles elements 0..15, high
 * 16..31) through a 16-entry int8 table, into c[0], c[1] */
static inline void nibbles_lut(const uint8_t *qs, const int8_t *table, int8x16_t c[2])
{
    const uint8x16_t v = vld1q_u8(qs);
    const int8x16_t lut = vld1q_s8(table);
    c[0] = vqtbl1q_s8(lut, vandq_u8(v, vdupq_n_u8(0x0F)));
    c[1] = vqtbl1q_s8(lut, vshrq_n_u8(v, 4));
}

static inline uint32_t le32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* the grid codebooks a byte per element and the sign patterns
 * (ggml_grid_bytes.c) */
#define GB shoal_ggml_grid_bytes

/* 16 bytes: a's 8, then b's */
static inline int8x16_t bytes16(uint64_t a, uint64_t b)
{
    return vreinterpretq_s8_u64(vcombine_u64(vcreate_u64(a), vcreate_u64(b)));
}

/* 16 codes: the magnitudes a, b (8 bytes each) times the +-1 bytes sa, sb */
static inline int8x16_t signed16(uint64_t a, uint64_t b, uint64_t sa, uint64_t sb)
{
    return vmulq_s8(bytes16(a, b), bytes16(sa, sb));
}

/* The codes of one block of the integer-form types unpacked with NEON here
 * into c (ggml_dot.h's table, the same integers as
 * shoal_ggml_iblock_decode), the scales, mins and D, DMIN into ib (its c
 * untouched). Returns 0 for the other types (they use the scalar decode). */
static int unpack_codes(enum shoal_ggml_type type, const uint8_t *blk, int8x16_t c[16],
                        struct shoal_ggml_iblock *ib)
{
    switch (type) {
    case SHOAL_GGML_TYPE_Q5_K: {
        const uint8x16_t qh[2] = {vld1q_u8(blk + 16), vld1q_u8(blk + 32)};
        for (int j = 0; j < 8; j++)
            for (int h = 0; h < 2; h++) {
                const uint8x16_t v = vld1q_u8(blk + 48 + 32 * (j / 2) + 16 * h);
                c[2 * j + h] = vorrq_s8(bits8(v, 4 * (j % 2), 0x0F),
                                        vshlq_n_s8(bits8(qh[h], j, 1), 4));
            }
        break;
    }
    case SHOAL_GGML_TYPE_Q2_K:
        for (int h = 0; h < 2; h++)
            for (int u = 0; u < 2; u++) {
                const uint8x16_t v = vld1q_u8(blk + 16 + 32 * h + 16 * u);
                for (int s = 0; s < 4; s++)
                    c[2 * (4 * h + s) + u] = bits8(v, 2 * s, 3);
            }
        break;
    case SHOAL_GGML_TYPE_Q3_K: {
        /* q | 4 * hmask bit, minus 4 */
        const uint8x16_t hm[2] = {vld1q_u8(blk), vld1q_u8(blk + 16)};
        const int8x16_t four = vdupq_n_s8(4);
        for (int h = 0; h < 2; h++)
            for (int u = 0; u < 2; u++) {
                const uint8x16_t v = vld1q_u8(blk + 32 + 32 * h + 16 * u);
                for (int s = 0; s < 4; s++)
                    c[2 * (4 * h + s) + u] = vsubq_s8(
                        vorrq_s8(bits8(v, 2 * s, 3), vshlq_n_s8(bits8(hm[u], 4 * h + s, 1), 2)),
                        four);
            }
        break;
    }
    case SHOAL_GGML_TYPE_IQ4_XS:
        for (int j = 0; j < 8; j++)
            nibbles_lut(blk + 8 + 16 * j, shoal_ggml_iq4nl_values, c + 2 * j);
        break;
    case SHOAL_GGML_TYPE_IQ4_NL:
        nibbles_lut(blk + 2, shoal_ggml_iq4nl_values, c);
        break;
    case SHOAL_GGML_TYPE_MXFP4:
        nibbles_lut(blk + 1, shoal_ggml_mxfp4_values, c);
        break;
    case SHOAL_GGML_TYPE_IQ2_XXS:
        for (int j = 0; j < 8; j++) {   /* 4 index bytes, then 4 x 7 sign bits and s */
            const uint8_t *g = blk + 2 + 8 * j;
            const uint32_t aux = le32(g + 4);
            for (int h = 0; h < 2; h++)
                c[2 * j + h] = signed16(GB.iq2xxs[g[2 * h]], GB.iq2xxs[g[2 * h + 1]],
                                        GB.sign7[(aux >> (14 * h)) & 127],
                                        GB.sign7[(aux >> (14 * h + 7)) & 127]);
        }
        break;
    case SHOAL_GGML_TYPE_IQ3_XXS:
        for (int j = 0; j < 8; j++) {   /* 8 index bytes; a u32 of signs and s after all 64 */
            const uint8_t *g = blk + 2 + 8 * j;
            const uint32_t aux = le32(blk + 66 + 4 * j);
            for (int h = 0; h < 2; h++)
                c[2 * j + h] = signed16(
                    (uint64_t)GB.iq3xxs[g[4 * h]] | (uint64_t)GB.iq3xxs[g[4 * h + 1]] << 32,
                    (uint64_t)GB.iq3xxs[g[4 * h + 2]] | (uint64_t)GB.iq3xxs[g[4 * h + 3]] << 32,
                    GB.sign7[(aux >> (14 * h)) & 127], GB.sign7[(aux >> (14 * h + 7)) & 127]);
        }
        break;
    case SHOAL_GGML_TYPE_IQ2_XS:
        for (int k = 0; k < 16; k++) {   /* a u16 per 8: 9 index bits, 7 sign bits */
            const unsigned q0 = ld16(blk + 2 + 4 * k), q1 = ld16(blk + 4 + 4 * k);
            c[k] = signed16(GB.iq2xs[q0 & 511], GB.iq2xs[q1 & 511], GB.sign7[q0 >> 9],
                            GB.sign7[q1 >> 9]);
        }
        break;
    case SHOAL_GGML_TYPE_IQ2_S:
        for (int k = 0; k < 16; k++) {   /* index byte + 2 high bits in qh; a sign byte per 8 */
            const unsigned h = blk[66 + k / 2] >> (4 * (k % 2));
            c[k] = signed16(GB.iq2s[blk[2 + 2 * k] | (h & 3) << 8],
                            GB.iq2s[blk[3 + 2 * k] | ((h >> 2) & 3) << 8],
                            GB.sign8[blk[34 + 2 * k]], GB.sign8[blk[35 + 2 * k]]);
        }
        break;
    case SHOAL_GGML_TYPE_IQ3_S:
        for (int k = 0; k < 16; k++) {   /* index byte + 9th bit in qh per 4; a sign byte per 8 */
            const unsigned h = blk[66 + k / 2] >> (4 * (k % 2));
            const uint8_t *qs = blk + 2 + 4 * k;
            c[k] = signed16((uint64_t)GB.iq3s[qs[0] | (h & 1) << 8] |
                                (uint64_t)GB.iq3s[qs[1] | ((h >> 1) & 1) << 8] << 32,
                            (uint64_t)GB.iq3s[qs[2] | ((h >> 2) & 1) << 8] |
                                (uint64_t)GB.iq3s[qs[3] | ((h >> 3) & 1) << 8] << 32,
                            GB.sign8[blk[74 + 2 * k]], GB.sign8[blk[75 + 2 * k]]);
        }
        break;
    case SHOAL_GGML_TYPE_IQ1_S:
        for (int j = 0; j < 8; j++) {   /* 8 g + delta: index byte + 3 bits of qh, delta qh's top */
            const uint8_t *qs = blk + 2 + 4 * j;
            const unsigned qh = ld16(blk + 34 + 2 * j);
            const int8x16_t delta = vdupq_n_s8(qh & 0x8000 ? -1 : 1);
            for (int h = 0; h < 2; h++)
                c[2 * j + h] = vaddq_s8(
                    bytes16(GB.iq1s[qs[2 * h] | ((qh >> (6 * h)) & 7) << 8],
                            GB.iq1s[qs[2 * h + 1] | ((qh >> (6 * h + 3)) & 7) << 8]),
                    delta);
        }
        break;
    case SHOAL_GGML_TYPE_IQ1_M:
        for (int k = 0; k < 16; k++) {   /* a nibble of qh per 8: 3 index bits, the delta's sign */
            const unsigned n = blk[32 + k];
            const unsigned n0 = n & 0x0F, n1 = n >> 4;
            const int8x16_t g = bytes16(GB.iq1s[blk[2 * k] | (n0 & 7) << 8],
                                        GB.iq1s[blk[2 * k + 1] | (n1 & 7) << 8]);
            const int8x8_t d0 = vdup_n_s8(n0 & 8 ? -1 : 1), d1 = vdup_n_s8(n1 & 8 ? -1 : 1);
            c[k] = vaddq_s8(g, vcombine_s8(d0, d1));
        }
        break;
    default:
        return 0;
    }
    shoal_ggml_iblock_scales(type, blk, ib);
    return 1;
}

/* Row i's block blk into k: codes, scales, mins, D and DMIN. n16: the 16s
 * of a block (2 or 16). Returns has_min (the same for every block of a
 * type). */
static int unpack_row(struct block4 *k, int i, enum shoal_ggml_type type, const uint8_t *blk,
                      int n16)
{
    switch (type) {
    case SHOAL_GGML_TYPE_Q8_0: {
        k->c[i][0] = vld1q_s8((const int8_t *)blk + 2);
        k->c[i][1] = vld1q_s8((const int8_t *)blk + 18);
        k->d[i] = vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(ld16(blk)))), 0);
        k->dmin[i] = 0.0f;   /* unused: no min */
        return 0;
    }
    case SHOAL_GGML_TYPE_Q4_K: {
        /* sub-block 2h: low nibbles of qs[32h ..], 2h + 1: high nibbles */
        const uint8_t *qs = blk + 16;
        for (int h = 0; h < 4; h++)
            for (int u = 0; u < 2; u++) {
                const uint8x16_t v = vld1q_u8(qs + 32 * h + 16 * u);
                k->c[i][4 * h + u] = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F)));
                k->c[i][4 * h + 2 + u] = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
            }
        for (int j = 0; j < 8; j++) {
            int sc, m;
            shoal_ggml_scale_min_k4(j, blk + 4, &sc, &m);
            k->sc[i][2 * j] = k->sc[i][2 * j + 1] = sc;
            k->m[2 * j][i] = k->m[2 * j + 1][i] = (int16_t)m;
        }
        const float32x4_t dd =
            vcvt_f32_f16(vreinterpret_f16_u32(vdup_n_u32((uint32_t)ld16(blk) |
                                                         (uint32_t)ld16(blk + 2) << 16)));
        k->d[i] = vgetq_lane_f32(dd, 0);
        k->dmin[i] = vgetq_lane_f32(dd, 1);
        return 1;   /* the canonical Q4_K term always subtracts its min term */
    }
    case SHOAL_GGML_TYPE_Q6_K: {
        /* element 128h + 32r + l: low 4 bits from ql[64h + 32 (r % 2) + l]
         * (nibble r / 2), high 2 from qh[32h + l] (bits 2r) */
        const uint8_t *ql = blk, *qh = blk + 128;
        const int8x16_t m32 = vdupq_n_s8(32);
        for (int h = 0; h < 2; h++)
            for (int u = 0; u < 2; u++) {
                const uint8x16_t hv = vld1q_u8(qh + 32 * h + 16 * u);
                for (int r = 0; r < 4; r++) {
                    const uint8x16_t lv = vld1q_u8(ql + 64 * h + 32 * (r % 2) + 16 * u);
                    const int8x16_t q = vorrq_s8(bits8(lv, 4 * (r / 2), 0x0F),
                                                 vshlq_n_s8(bits8(hv, 2 * r, 3), 4));
                    k->c[i][8 * h + 2 * r + u] = vsubq_s8(q, m32);
                }
            }
        for (int j = 0; j < 16; j++)
            k->sc[i][j] = (int8_t)blk[192 + j];
        k->d[i] = vgetq_lane_f32(
            vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(ld16(blk + 208)))), 0);
        k->dmin[i] = 0.0f;
        return 0;
    }
    default: {
        struct shoal_ggml_iblock ib;
        if (!unpack_codes(type, blk, k->c[i], &ib)) {
            shoal_ggml_iblock_decode(type, blk, &ib);
            for (int j = 0; j < n16; j++)
                k->c[i][j] = vld1q_s8(ib.c + 16 * j);
        }
        for (int j = 0; j < n16; j++) {
            k->sc[i][j] = ib.sc[j];
            k->m[j][i] = ib.m[j];
        }
        k->d[i] = ib.d;
        k->dmin[i] = ib.dmin;
        return ib.has_min;
    }
    }
}

/* lanes rows: isum = sum over the 16s of sc * (sum of c * qx) */
static inline int32x4_t block_isum(const struct block4 *k, const int8_t *x, int n16,
                                   enum scale_mode mode)
{
    int8x16_t xv[16];
    int32x4_t s[4];
    for (int j = 0; j < n16; j++)
        xv[j] = vld1q_s8(x + 16 * j);
    for (int i = 0; i < 4; i++) {
        int32x4_t acc = vdupq_n_s32(0);
        if (mode == SCALE_ONE) {
            for (int j = 0; j < n16; j++)
                acc = dot16(acc, k->c[i][j], xv[j]);
        } else if (mode == SCALE_32) {
            for (int j = 0; j < n16; j += 2) {
                const int32x4_t p = dot16(dot16(vdupq_n_s32(0), k->c[i][j], xv[j]),
                                          k->c[i][j + 1], xv[j + 1]);
                acc = vmlaq_n_s32(acc, p, k->sc[i][j]);
            }
        } else {
            for (int j = 0; j < n16; j++)
                acc = vmlaq_n_s32(acc, dot16(vdupq_n_s32(0), k->c[i][j], xv[j]), k->sc[i][j]);
        }
        s[i] = acc;
    }
    return hsum_rows4(s);
}

/* lanes rows: msum = sum over the 16s of m * bsum (|bsum| <= 2032, a pair
 * of them <= 4064: int16) */
static inline int32x4_t block_msum(const struct block4 *k, const int16_t *bs, int n16,
                                   enum scale_mode mode)
{
    int32x4_t acc = vdupq_n_s32(0);
    if (mode == SCALE_16) {
        for (int j = 0; j < n16; j++)
            acc = vmlal_n_s16(acc, vld1_s16(k->m[j]), bs[j]);
    } else {
        for (int j = 0; j < n16; j += 2)
            acc = vmlal_n_s16(acc, vld1_s16(k->m[j]), (int16_t)(bs[j] + bs[j + 1]));
    }
    return acc;
}

static void store_rows(float *y, int64_t rows, int64_t t, int64_t r, int nr, float32x4_t v)
{
    float l[4];
    vst1q_f32(l, v);
    for (int i = 0; i < nr; i++)
        y[t * rows + r + i] = l[i];
}

/* Tokens t0 .. t0 + nt - 1 against the four rows p[] (rows r .., nr real) */
static void rows4(float *y, const struct shoal_ggml_act *a, int64_t t0, int64_t nt,
                  const struct shoal_ggml_matrix *w, const uint8_t *const p[4],
                  size_t type_size, int64_t r, int nr)
{
    const int B = (int)(a->n / a->n_blk), n16 = B / 16;
    const int64_t bs_tok = a->n / 16;
    const enum scale_mode mode = type_scale_mode(w->type);
    struct block4 k;
    float32x4_t acc[TOK_TILE];
    for (int64_t t = 0; t < nt; t++)
        acc[t] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < a->n_blk; b++) {
        const size_t off = (size_t)b * type_size;
        int has_min = 0;
        for (int i = 0; i < 4; i++)
            has_min = unpack_row(&k, i, w->type, p[i] + off, n16);
        const float32x4_t d = vld1q_f32(k.d), dmin = vld1q_f32(k.dmin);
        for (int64_t t = 0; t < nt; t++) {
            const int64_t tt = t0 + t;
            const int32x4_t isum = block_isum(&k, a->q + tt * a->n + (int64_t)B * b, n16, mode);
            const float32x4_t dx = vdupq_n_f32(a->d[tt * a->n_blk + b]);
            const float32x4_t ta = vmulq_f32(vmulq_f32(d, dx), vcvtq_f32_s32(isum));
            if (!has_min) {
                acc[t] = vaddq_f32(acc[t], ta);
                continue;
            }
            const int32x4_t msum = block_msum(&k, a->bsum + tt * bs_tok + (int64_t)n16 * b,
                                              n16, mode);
            const float32x4_t tb = vmulq_f32(vmulq_f32(dmin, dx), vcvtq_f32_s32(msum));
            acc[t] = vaddq_f32(acc[t], vsubq_f32(ta, tb));
        }
    }
    for (int64_t t = 0; t < nt; t++)
        store_rows(y, w->rows, t0 + t, r, nr, acc[t]);
}

void ROWS_FN(float *y, const struct shoal_ggml_act *a, int64_t n_tok,
             const struct shoal_ggml_matrix *w, int64_t r0, int64_t r1)
{
    /* bytes per block and per row (ggml_types.c's sizes) */
    const struct shoal_ggml_type_info *ti = shoal_ggml_type_info(w->type);
    const size_t rb = (size_t)(w->cols / ti->block_size) * ti->type_size;
    shoal_ggml_grid_bytes_init();   /* after the first call: one load */
    for (int64_t r = r0; r < r1; r += 4) {
        const int nr = r1 - r < 4 ? (int)(r1 - r) : 4;
        const uint8_t *p[4];
        for (int i = 0; i < 4; i++)
            p[i] = (const uint8_t *)w->data + (size_t)(r + (i < nr ? i : nr - 1)) * rb;
        for (int64_t t0 = 0; t0 < n_tok; t0 += TOK_TILE) {
            const int64_t nt = n_tok - t0 < TOK_TILE ? n_tok - t0 : TOK_TILE;
            rows4(y, a, t0, nt, w, p, ti->type_size, r, nr);
        }
    }
}
