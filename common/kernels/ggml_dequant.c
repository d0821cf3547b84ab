/* ggml_dequant: the scalar reference dequantization of each ggml type, one
 * block at a time (ggml_types_impl.h).
 *
 * Block layouts are ggml/src/ggml-common.h's block_* structs, read here
 * byte by byte (little-endian, any alignment); the arithmetic is the one
 * ggml-quants.c's dequantize_row_* and gguf-py's quants.py perform, in the
 * same order, so the floats are the same bits (each step is one IEEE float
 * operation; the build has -ffp-contract=off, so nothing is fused). The
 * comment above each function gives the layout: offsets in bytes.
 *
 * Thread: any (pure functions; compute threads may call them).
 */
#include <string.h>

#include "ggml_types_impl.h"
#include "tensor.h"

#define QK_K SHOAL_GGML_QK_K

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

static float f16(const uint8_t *p) { return shoal_f16_to_f32(le16(p)); }

/* The 4-bit non-linear codebook of IQ4_NL and IQ4_XS (ggml-common.h
 * kvalues_iq4nl). */
static const int8_t iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                        1,    13,   25,  38,  53,  69,  89,  113};

/* E2M1 (MXFP4's element) times 2, as ggml stores it (kvalues_mxfp4); the
 * block scale is then half the E8M0 power of two. */
static const int8_t mxfp4_values[16] = {0, 1,  2,  3,  4,  6,  8,  12,
                                        0, -1, -2, -3, -4, -6, -8, -12};

/* The sign byte of IQ2/IQ3 groups: 7 stored sign bits, the 8th chosen so
 * the count of negative signs is even (ggml-common.h ksigns_iq2xs lists
 * the same 128 bytes). Bit j set means element j is negated. */
static unsigned ksigns(unsigned i7)
{
    unsigned odd = 0;
    for (unsigned b = i7; b; b >>= 1)
        odd ^= b & 1u;
    return i7 | odd << 7;
}

/* ---- plain floats (block of 1) ------------------------------------------ */

void shoal_ggml_dequant_f32(const uint8_t *src, float *dst)
{
    uint32_t u = le32(src);
    memcpy(dst, &u, 4);
}

void shoal_ggml_dequant_f16(const uint8_t *src, float *dst) { dst[0] = f16(src); }

void shoal_ggml_dequant_bf16(const uint8_t *src, float *dst)
{
    dst[0] = shoal_bf16_to_f32(le16(src));
}

/* ---- 32-element blocks ---------------------------------------------------- */

/* Q4_0, 18 bytes: d f16 @0 | qs[16] @2. Element j < 16 is the low nibble
 * of qs[j], element j + 16 its high nibble; y = d * (q - 8). */
void shoal_ggml_dequant_q4_0(const uint8_t *src, float *dst)
{
    const float d = f16(src);
    const uint8_t *qs = src + 2;
    for (int j = 0; j < 16; j++) {
        dst[j] = d * (float)((int)(qs[j] & 0x0F) - 8);
        dst[j + 16] = d * (float)((int)(qs[j] >> 4) - 8);
    }
}

/* Q4_1, 20 bytes: d f16 @0 | m f16 @2 | qs[16] @4; y = d * q + m. */
void shoal_ggml_dequant_q4_1(const uint8_t *src, float *dst)
{
    const float d = f16(src), m = f16(src + 2);
    const uint8_t *qs = src + 4;
    for (int j = 0; j < 16; j++) {
        dst[j] = d * (float)(qs[j] & 0x0F) + m;
        dst[j + 16] = d * (float)(qs[j] >> 4) + m;
    }
}

/* Q5_0, 22 bytes: d f16 @0 | qh u32 @2 (bit i: the 5th bit of element i)
 * | qs[16] @6 (nibbles as Q4_0); y = d * (q - 16). */
void shoal_ggml_dequant_q5_0(const uint8_t *src, float *dst)
{
    const float d = f16(src);
    const uint32_t qh = le32(src + 2);
    const uint8_t *qs = src + 6;
    for (int j = 0; j < 16; j++) {
        int q0 = (qs[j] & 0x0F) | (int)((qh >> j) & 1u) << 4;
        int q1 = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1u) << 4;
        dst[j] = d * (float)(q0 - 16);
        dst[j + 16] = d * (float)(q1 - 16);
    }
}

/* Q5_1, 24 bytes: d f16 @0 | m f16 @2 | qh u32 @4 | qs[16] @8;
 * y = d * q + m. */
void shoal_ggml_dequant_q5_1(const uint8_t *src, float *dst)
{
    const float d = f16(src), m = f16(src + 2);
    const uint32_t qh = le32(src + 4);
    const uint8_t *qs = src + 8;
    for (int j = 0; j < 16; j++) {
        int q0 = (qs[j] & 0x0F) | (int)((qh >> j) & 1u) << 4;
        int q1 = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1u) << 4;
        dst[j] = d * (float)q0 + m;
        dst[j + 16] = d * (float)q1 + m;
    }
}

/* Q8_0, 34 bytes: d f16 @0 | qs[32] int8 @2; y = q * d. */
void shoal_ggml_dequant_q8_0(const uint8_t *src, float *dst)
{
    const float d = f16(src);
    for (int j = 0; j < 32; j++)
        dst[j] = (float)(int8_t)src[2 + j] * d;
}

/* IQ4_NL, 18 bytes: d f16 @0 | qs[16] @2 (nibbles as Q4_0, indices into
 * iq4nl_values); y = d * value. */
void shoal_ggml_dequant_iq4_nl(const uint8_t *src, float *dst)
{
    const float d = f16(src);
    const uint8_t *qs = src + 2;
    for (int j = 0; j < 16; j++) {
        dst[j] = d * (float)iq4nl_values[qs[j] & 0x0F];
        dst[j + 16] = d * (float)iq4nl_values[qs[j] >> 4];
    }
}

/* MXFP4, 17 bytes: e E8M0 @0 | qs[16] @1 (nibbles as Q4_0, E2M1 codes).
 * The scale is 2^(e - 128) (half of E8M0's 2^(e - 127), because the codes
 * are doubled), built from its bits as ggml_e8m0_to_fp32_half does: for
 * e < 2 a subnormal float; e = 255 (E8M0's NaN) gives 2^127, as in ggml.
 * y = value * scale. */
void shoal_ggml_dequant_mxfp4(const uint8_t *src, float *dst)
{
    const unsigned e = src[0];
    const uint32_t bits = e < 2 ? UINT32_C(0x00200000) << e : (uint32_t)(e - 1) << 23;
    float d;
    memcpy(&d, &bits, 4);
    const uint8_t *qs = src + 1;
    for (int j = 0; j < 16; j++) {
        dst[j] = (float)mxfp4_values[qs[j] & 0x0F] * d;
        dst[j + 16] = (float)mxfp4_values[qs[j] >> 4] * d;
    }
}

/* ---- K-quants (256-element super-blocks) --------------------------------- */

/* Q2_K, 84 bytes: scales[16] @0 (low nibble scale, high nibble min of each
 * 16-element sub-block) | qs[64] @16 | d f16 @80 | dmin f16 @82.
 * Element e = 128 h + 32 s + l (h < 2, s < 4, l < 32) is bits 2s..2s+1 of
 * qs[32 h + l], in sub-block e / 16; y = (d * sc) * q - dmin * min. */
void shoal_ggml_dequant_q2_k(const uint8_t *src, float *dst)
{
    const uint8_t *sc = src, *qs = src + 16;
    const float d = f16(src + 80), dmin = f16(src + 82);
    for (int e = 0; e < QK_K; e++) {
        int h = e / 128, s = (e / 32) % 4, l = e % 32, ib = e / 16;
        float dl = d * (float)(sc[ib] & 0x0F);
        float ml = dmin * (float)(sc[ib] >> 4);
        dst[e] = dl * (float)((qs[32 * h + l] >> (2 * s)) & 3) - ml;
    }
}

/* Q3_K, 110 bytes: hmask[32] @0 | qs[64] @32 | scales[12] @96 | d f16 @108.
 * 16 sub-blocks of 16; sub-block i's 6-bit scale is the nibble
 * scales[i % 8] >> (4 * (i / 8)) and the 2 bits scales[8 + i % 4] >>
 * (2 * (i / 4)), minus 32. Element e = 128 h + 32 s + l: low bits as Q2_K,
 * and 4 is subtracted unless bit (4 h + s) of hmask[l] is set;
 * y = (d * scale) * q. */
void shoal_ggml_dequant_q3_k(const uint8_t *src, float *dst)
{
    const uint8_t *hm = src, *qs = src + 32, *sc = src + 96;
    const float d = f16(src + 108);
    float dl[16];
    for (int i = 0; i < 16; i++) {
        int lo = (sc[i % 8] >> (4 * (i / 8))) & 0x0F;
        int hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
        dl[i] = d * (float)((lo | hi << 4) - 32);
    }
    for (int e = 0; e < QK_K; e++) {
        int h = e / 128, s = (e / 32) % 4, l = e % 32;
        int q = (qs[32 * h + l] >> (2 * s)) & 3;
        if (!((hm[l] >> (4 * h + s)) & 1))
            q -= 4;
        dst[e] = dl[e / 16] * (float)q;
    }
}

/* Q4_K, 144 bytes: d f16 @0 | dmin f16 @2 | scales[12] @4 | qs[128] @16.
 * 8 sub-blocks of 32: sub-block 2k is the low nibbles of qs[32k..32k+31],
 * 2k + 1 their high nibbles; y = (d * sc) * q - dmin * m. */
void shoal_ggml_dequant_q4_k(const uint8_t *src, float *dst)
{
    const float d = f16(src), dmin = f16(src + 2);
    const uint8_t *scales = src + 4, *qs = src + 16;
    for (int ib = 0; ib < 8; ib++) {
        int sc, m;
        shoal_ggml_scale_min_k4(ib, scales, &sc, &m);
        const float d1 = d * (float)sc, m1 = dmin * (float)m;
        const uint8_t *q = qs + 32 * (ib / 2);
        const int shift = 4 * (ib % 2);
        for (int l = 0; l < 32; l++)
            dst[32 * ib + l] = d1 * (float)((q[l] >> shift) & 0x0F) - m1;
    }
}

/* Q5_K, 176 bytes: d f16 @0 | dmin f16 @2 | scales[12] @4 | qh[32] @16 |
 * qs[128] @48. As Q4_K, with bit ib of qh[l] the 5th bit of element l of
 * sub-block ib. */
void shoal_ggml_dequant_q5_k(const uint8_t *src, float *dst)
{
    const float d = f16(src), dmin = f16(src + 2);
    const uint8_t *scales = src + 4, *qh = src + 16, *qs = src + 48;
    for (int ib = 0; ib < 8; ib++) {
        int sc, m;
        shoal_ggml_scale_min_k4(ib, scales, &sc, &m);
        const float d1 = d * (float)sc, m1 = dmin * (float)m;
        const uint8_t *q = qs + 32 * (ib / 2);
        const int shift = 4 * (ib % 2);
        for (int l = 0; l < 32; l++) {
            int v = ((q[l] >> shift) & 0x0F) | ((qh[l] >> ib) & 1) << 4;
            dst[32 * ib + l] = d1 * (float)v - m1;
        }
    }
}

/* Q6_K, 210 bytes: ql[128] @0 | qh[64] @128 | scales[16] int8 @192 |
 * d f16 @208. Each half h of 128 elements uses ql[64 h..], qh[32 h..] and
 * scales[8 h..]: element 32 r + l (r < 4, l < 32) takes ql[64 h + l + 32
 * (r % 2)]'s nibble r / 2 and bits 2r..2r+1 of qh[32 h + l], minus 32, in
 * sub-block 16-element l / 16 + 2 r; y = (d * scale) * q. */
void shoal_ggml_dequant_q6_k(const uint8_t *src, float *dst)
{
    const uint8_t *ql = src, *qh = src + 128;
    const int8_t *sc = (const int8_t *)(src + 192);
    const float d = f16(src + 208);
    for (int h = 0; h < 2; h++)
        for (int r = 0; r < 4; r++)
            for (int l = 0; l < 32; l++) {
                int lo = (ql[64 * h + l + 32 * (r % 2)] >> (4 * (r / 2))) & 0x0F;
                int hi = (qh[32 * h + l] >> (2 * r)) & 3;
                float ds = d * (float)sc[8 * h + l / 16 + 2 * r];
                dst[128 * h + 32 * r + l] = ds * (float)((lo | hi << 4) - 32);
            }
}

/* IQ4_XS, 136 bytes: d f16 @0 | scales_h u16 @2 | scales_l[4] @4 |
 * qs[128] @8. Sub-block ib < 8 of 32: 6-bit scale = nibble ib % 2 of
 * scales_l[ib / 2] | bits 2ib..2ib+1 of scales_h << 4, minus 32; its
 * elements are qs[16 ib..16 ib+15]'s low then high nibbles, indices into
 * iq4nl_values; y = (d * scale) * value. */
void shoal_ggml_dequant_iq4_xs(const uint8_t *src, float *dst)
{
    const float d = f16(src);
    const unsigned sh = le16(src + 2);
    const uint8_t *sl = src + 4, *qs = src + 8;
    for (int ib = 0; ib < 8; ib++) {
        int ls = ((sl[ib / 2] >> (4 * (ib % 2))) & 0x0F) | (int)((sh >> (2 * ib)) & 3) << 4;
        const float dl = d * (float)(ls - 32);
        for (int j = 0; j < 16; j++) {
            dst[32 * ib + j] = dl * (float)iq4nl_values[qs[16 * ib + j] & 0x0F];
            dst[32 * ib + 16 + j] = dl * (float)iq4nl_values[qs[16 * ib + j] >> 4];
        }
    }
}

/* ---- IQ types with codebooks (ggml_grids.c) ------------------------------ */

/* The scale of the IQ2 types, of a 4-bit s: d * (0.5 + s) * 0.25 */
static float iq2_db(float d, unsigned s) { return d * (0.5f + (float)s) * 0.25f; }

/* The 8 elements of an IQ2 codebook entry (2-bit codes into {8, 25, 43}),
 * times db, negated where signs (bit j: element j) says */
static void iq2_put8(float *dst, float db, unsigned code, unsigned signs)
{
    static const float values[4] = {8.0f, 25.0f, 43.0f, 0.0f};
    for (int j = 0; j < 8; j++) {
        float v = db * values[(code >> (2 * j)) & 3];
        dst[j] = (signs >> j) & 1 ? -v : v;
    }
}

/* IQ2_XXS, 66 bytes: d f16 @0 | 8 groups of 8 bytes @2: u32 a (4 codebook
 * indices, one a byte) | u32 b (4 x 7 sign bits, then a 4-bit scale in bits
 * 28..31). 32 elements a group, 8 per index; db = d * (0.5 + scale) * 0.25;
 * y = db * grid value, negated where the sign bit says. */
void shoal_ggml_dequant_iq2_xxs(const uint8_t *src, float *dst)
{
    const float d = f16(src);
    for (int ib = 0; ib < 8; ib++) {
        const uint8_t *g = src + 2 + 8 * ib;
        const uint32_t b = le32(g + 4);
        const float db = iq2_db(d, b >> 28);
        for (int l = 0; l < 4; l++)
            iq2_put8(dst + 32 * ib + 8 * l, db, shoal_ggml_iq2xxs_codes[g[l]],
                     ksigns((b >> (7 * l)) & 127u));
    }
}

/* IQ3_XXS, 98 bytes: d f16 @0 | qs[64] @2 (codebook indices, 4 elements
 * each) | 8 x u32 @66 (one a group of 32: 4 x 7 sign bits, then a 4-bit
 * scale in bits 28..31). db = d * (0.5 + scale) * 0.5; y = db * grid
 * value, negated where the sign bit says (8 signs per 2 indices). */
void shoal_ggml_dequant_iq3_xxs(const uint8_t *src, float *dst)
{
    static const float values[8] = {4.0f, 12.0f, 20.0f, 28.0f, 36.0f, 44.0f, 52.0f, 62.0f};
    const float d = f16(src);
    const uint8_t *qs = src + 2;
    for (int ib = 0; ib < 8; ib++) {
        const uint32_t b = le32(src + 66 + 4 * ib);
        const float db = d * (0.5f + (float)(b >> 28)) * 0.5f;
        for (int l = 0; l < 4; l++) {
            const unsigned signs = ksigns((b >> (7 * l)) & 127u);
            for (int j = 0; j < 8; j++) {
                const unsigned code = shoal_ggml_iq3xxs_codes[qs[8 * ib + 2 * l + j / 4]];
                float v = db * values[(code >> (3 * (j % 4))) & 7];
                dst[32 * ib + 8 * l + j] = (signs >> j) & 1 ? -v : v;
            }
        }
    }
}

/* IQ2_XS, 74 bytes: d f16 @0 | qs[32] u16 @2 (one per 8 elements: a 9-bit
 * codebook index, then 7 sign bits, the 8th of even parity) | scales[8]
 * @66 (a byte per 32: the 4-bit scale of its first 16 low, second 16
 * high). y = db * grid value, negated where the sign bit says. */
void shoal_ggml_dequant_iq2_xs(const uint8_t *src, float *dst)
{
    const float d = f16(src);
    for (int g = 0; g < 32; g++) {   /* groups of 8; 4 a scale byte */
        const unsigned q = le16(src + 2 + 2 * g);
        iq2_put8(dst + 8 * g, iq2_db(d, (src[66 + g / 4] >> (4 * (g % 4 / 2))) & 0x0F),
                 shoal_ggml_iq2xs_codes[q & 511u], ksigns(q >> 9));
    }
}

/* IQ2_S, 82 bytes: d f16 @0 | qs[32] @2 (low 8 bits of the codebook
 * indices, one per 8 elements) | signs[32] @34 (a byte per 8 elements, all
 * 8 bits stored) | qh[8] @66 (a byte per 32: bits 2l, 2l+1 the high 2 bits
 * of index l) | scales[8] @74 (as IQ2_XS's). y = db * grid value, negated
 * where the sign bit says. */
void shoal_ggml_dequant_iq2_s(const uint8_t *src, float *dst)
{
    const float d = f16(src);
    for (int g = 0; g < 32; g++) {   /* groups of 8; 4 a scale and a qh byte */
        const unsigned idx = src[2 + g] | ((src[66 + g / 4] >> (2 * (g % 4))) & 3) << 8;
        iq2_put8(dst + 8 * g, iq2_db(d, (src[74 + g / 4] >> (4 * (g % 4 / 2))) & 0x0F),
                 shoal_ggml_iq2s_codes[idx], src[34 + g]);
    }
}

/* IQ3_S, 110 bytes: d f16 @0 | qs[64] @2 (low 8 bits of the codebook
 * indices, one per 4 elements) | qh[8] @66 (a byte per 32: bit k the 9th
 * bit of its index k) | signs[32] @74 (a byte per 8 elements, all 8 bits
 * stored) | scales[4] @106 (a nibble per 32, low first). db = d * (1 + 2
 * scale); y = db * grid value, negated where the sign bit says. */
void shoal_ggml_dequant_iq3_s(const uint8_t *src, float *dst)
{
    static const float values[8] = {1.0f, 3.0f, 5.0f, 7.0f, 9.0f, 11.0f, 13.0f, 15.0f};
    const float d = f16(src);
    for (int ib = 0; ib < 8; ib++) {
        const unsigned qh = src[66 + ib];
        const float db = d * (float)(1 + 2 * ((src[106 + ib / 2] >> (4 * (ib % 2))) & 0x0F));
        for (int k = 0; k < 8; k++) {
            const unsigned code = shoal_ggml_iq3s_codes[src[2 + 8 * ib + k] | ((qh >> k) & 1) << 8];
            const unsigned signs = src[74 + 4 * ib + k / 2];
            for (int j = 0; j < 4; j++) {
                const int e = 4 * (k % 2) + j;   /* element of the sign byte's 8 */
                float v = db * values[(code >> (3 * j)) & 7];
                dst[32 * ib + 4 * k + j] = (signs >> e) & 1 ? -v : v;
            }
        }
    }
}

/* The IQ1 shift added to every codebook value: +-1/8 (ggml IQ1S_DELTA). */
#define IQ1_DELTA 0.125f

/* IQ1_S, 50 bytes: d f16 @0 | qs[32] @2 (low 8 bits of the indices) |
 * qh[8] u16 @34, one a group of 32: bits 3l..3l+2 the high 3 bits of index
 * l, bits 12..14 a scale s, bit 15 the sign of the shift.
 * dl = d * (2 s + 1); y = dl * (grid value + shift). */
void shoal_ggml_dequant_iq1_s(const uint8_t *src, float *dst)
{
    const float d = f16(src);
    const uint8_t *qs = src + 2;
    for (int ib = 0; ib < 8; ib++) {
        const unsigned qh = le16(src + 34 + 2 * ib);
        const float dl = d * (float)(2 * ((qh >> 12) & 7) + 1);
        const float delta = qh & 0x8000 ? -IQ1_DELTA : IQ1_DELTA;
        for (int l = 0; l < 4; l++) {
            const unsigned code = shoal_ggml_iq1s_codes[qs[4 * ib + l] | ((qh >> (3 * l)) & 7) << 8];
            for (int j = 0; j < 8; j++)
                dst[32 * ib + 8 * l + j] =
                    dl * ((float)((int)((code >> (2 * j)) & 3) - 1) + delta);
        }
    }
}

/* IQ1_M, 56 bytes: qs[32] @0 (low 8 bits of the indices) | qh[16] @32
 * (a nibble per index: 3 high index bits, then the shift's sign) |
 * scales 4 x u16 @48. The f16 block scale d is the top nibbles of the four
 * u16, first one lowest; each u16 also holds 4 3-bit sub-scales s (bits 0,
 * 3, 6, 9), one per 16 elements; dl = d * (2 s + 1);
 * y = dl * (grid value + shift). */
void shoal_ggml_dequant_iq1_m(const uint8_t *src, float *dst)
{
    const uint8_t *qs = src, *qh = src + 32;
    unsigned sc[4];
    for (int i = 0; i < 4; i++)
        sc[i] = le16(src + 48 + 2 * i);
    const uint16_t dbits = (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) |
                                      ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000));
    const float d = shoal_f16_to_f32(dbits);
    for (int ib = 0; ib < 8; ib++) {
        for (int l = 0; l < 4; l++) {
            const unsigned nib = (qh[2 * ib + l / 2] >> (4 * (l % 2))) & 0x0F;
            const unsigned s = (sc[ib / 2] >> (6 * (ib % 2) + 3 * (l / 2))) & 7;
            const float dl = d * (float)(2 * s + 1);
            const float delta = nib & 0x08 ? -IQ1_DELTA : IQ1_DELTA;
            const unsigned code = shoal_ggml_iq1s_codes[qs[4 * ib + l] | (nib & 7) << 8];
            for (int j = 0; j < 8; j++)
                dst[32 * ib + 8 * l + j] =
                    dl * ((float)((int)((code >> (2 * j)) & 3) - 1) + delta);
        }
    }
}
