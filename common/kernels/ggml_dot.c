/* ggml_dot: the activation quantizer, the scalar reference of ggml_dot.h's
 * canonical dot products, and the per-thread driver. The SIMD rows live in
 * isa/ggml_avx2.c (the quant ops table's ggml_rows member).
 *
 * Block layouts: ggml/src/ggml-common.h's block_* structs, read byte by
 * byte (little-endian, any alignment) as ggml_dequant.c reads them; the
 * other types' integer form (shoal_ggml_iblock_decode) regroups
 * ggml_dequant.c's formulas (ggml-quants.c dequantize_row_*) exactly.
 */
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "ggml_dot.h"
#include "ggml_types_impl.h"
#include "kernels.h"
#include "quant.h"
#include "tensor.h"

#define QK_K 256

int shoal_ggml_iform(uint32_t type)
{
    switch (type) {
    case SHOAL_GGML_TYPE_Q2_K: case SHOAL_GGML_TYPE_Q3_K: case SHOAL_GGML_TYPE_Q5_K:
    case SHOAL_GGML_TYPE_IQ4_XS: case SHOAL_GGML_TYPE_IQ4_NL:
    case SHOAL_GGML_TYPE_IQ2_XXS: case SHOAL_GGML_TYPE_IQ3_XXS:
    case SHOAL_GGML_TYPE_IQ1_S: case SHOAL_GGML_TYPE_IQ1_M: case SHOAL_GGML_TYPE_MXFP4:
    case SHOAL_GGML_TYPE_Q4_0: case SHOAL_GGML_TYPE_Q4_1:
    case SHOAL_GGML_TYPE_Q5_0: case SHOAL_GGML_TYPE_Q5_1:
    case SHOAL_GGML_TYPE_IQ2_XS: case SHOAL_GGML_TYPE_IQ2_S: case SHOAL_GGML_TYPE_IQ3_S:
        return 1;
    default:
        return 0;
    }
}

int shoal_ggml_dot_supported(uint32_t type)
{
    return type == SHOAL_GGML_TYPE_Q8_0 || type == SHOAL_GGML_TYPE_Q4_K ||
           type == SHOAL_GGML_TYPE_Q6_K || shoal_ggml_iform(type);
}

const char *shoal_ggml_dot_types(void)
{
    return "Q8_0, Q4_K, Q6_K, Q2_K, Q3_K, Q5_K, IQ4_XS, IQ4_NL, IQ2_XXS, IQ2_XS, "
           "IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, MXFP4, Q4_0, Q4_1, Q5_0 and Q5_1";
}

int64_t shoal_ggml_act_block(uint32_t type)
{
    if (!shoal_ggml_dot_supported(type))
        return 0;
    return (int64_t)shoal_ggml_type_info(type)->block_size;
}

/* whether only the GEMMs read bsum (the SIMD forms' offsets of Q4_0,
 * MXFP4, Q5_0, IQ4_NL and Q8_0, codes + 8, + 12, + 16, + 128, + 128; one
 * token: these rows sum qx themselves), so that a one-token call need not
 * fill it */
static int bsum_gemm_only(uint32_t type)
{
    return type == SHOAL_GGML_TYPE_Q4_0 || type == SHOAL_GGML_TYPE_MXFP4 ||
           type == SHOAL_GGML_TYPE_Q5_0 || type == SHOAL_GGML_TYPE_IQ4_NL ||
           type == SHOAL_GGML_TYPE_Q8_0;
}

/* whether the activations keep bsum (the mins; Q6_K's SIMD -32; the
 * GEMMs above) */
static int act_has_bsum(uint32_t type)
{
    return shoal_ggml_act_block(type) == QK_K || type == SHOAL_GGML_TYPE_Q4_1 ||
           type == SHOAL_GGML_TYPE_Q5_1 || bsum_gemm_only(type);
}

size_t shoal_ggml_act_bytes(uint32_t type, int64_t n)
{
    const int64_t B = shoal_ggml_act_block(type);
    if (B == 0 || n < 1 || n % B != 0 || n > INT64_MAX / 4)
        return 0;
    const size_t bsum = act_has_bsum(type) ? (size_t)(n / 16) * sizeof(int16_t) : 0;
    /* q padded to 4 bytes so d is aligned (n is a multiple of 32 anyway) */
    return (size_t)n + (size_t)(n / B) * sizeof(float) + bsum;
}

void shoal_ggml_act_init(struct shoal_ggml_act *a, enum shoal_ggml_type type, int64_t n,
                         int64_t n_tok, void *buf)
{
    const int64_t B = shoal_ggml_act_block(type);
    a->type = type;
    a->n = n;
    a->n_blk = n / B;
    a->q = buf;
    a->d = (float *)((uint8_t *)buf + (size_t)(n_tok * n));
    a->bsum = act_has_bsum(type) ? (int16_t *)(a->d + n_tok * a->n_blk) : NULL;
    a->pf_next = NULL;
    a->pf_next_bytes = 0;
}

void shoal_ggml_act_quantize(struct shoal_ggml_act *a, const float *x, int64_t n_tok)
{
    const int64_t n = a->n, B = n / a->n_blk;
    /* the active table's build of the rule (the same bytes at any ISA) */
    int32_t (*group)(const float *, int64_t, float *, int8_t *) =
        shoal_quant_active_ops()->act_group;
    if (group == NULL)
        group = shoal_quant_act_group_base;
    for (int64_t t = 0; t < n_tok; t++) {
        int8_t *q = a->q + t * n;
        for (int64_t b = 0; b < a->n_blk; b++)
            group(x + t * n + b * B, B, &a->d[t * a->n_blk + b], q + b * B);
        if (a->bsum && (n_tok > 1 || !bsum_gemm_only(a->type))) {
            int16_t *bs = a->bsum + t * (n / 16);
            for (int64_t k = 0; k < n / 16; k++) {
                int s = 0;
                for (int i = 0; i < 16; i++)
                    s += q[16 * k + i];
                bs[k] = (int16_t)s;
            }
        }
    }
}

static float f16_at(const uint8_t *p) { return shoal_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

/* One block's term of the canonical order: blk the weight block, q its
 * activation block's qx, dx its scale */
static float term_q8_0(const uint8_t *blk, const int8_t *q, float dx)
{
    int32_t isum = 0;
    for (int i = 0; i < 32; i++)
        isum += (int8_t)blk[2 + i] * q[i];
    return (f16_at(blk) * dx) * (float)isum;
}

static float term_q4_k(const uint8_t *blk, const int8_t *q, float dx)
{
    const uint8_t *scales = blk + 4, *qs = blk + 16;
    int32_t isum = 0, msum = 0;
    for (int j = 0; j < 8; j++) {
        int sc, m;
        shoal_ggml_scale_min_k4(j, scales, &sc, &m);
        const int shift = 4 * (j % 2);
        int32_t s = 0, xs = 0;
        for (int l = 0; l < 32; l++) {
            s += ((qs[32 * (j / 2) + l] >> shift) & 0x0F) * q[32 * j + l];
            xs += q[32 * j + l];
        }
        isum += sc * s;
        msum += m * xs;
    }
    return (f16_at(blk) * dx) * (float)isum - (f16_at(blk + 2) * dx) * (float)msum;
}

static float term_q6_k(const uint8_t *blk, const int8_t *q, float dx)
{
    const uint8_t *ql = blk, *qh = blk + 128;
    const int8_t *sc = (const int8_t *)(blk + 192);
    int32_t sub[16] = {0};   /* sum of (q - 32) * qx per sub-block of 16 */
    for (int h = 0; h < 2; h++)
        for (int r = 0; r < 4; r++)
            for (int l = 0; l < 32; l++) {
                const int lo = (ql[64 * h + l + 32 * (r % 2)] >> (4 * (r / 2))) & 0x0F;
                const int hi = (qh[32 * h + l] >> (2 * r)) & 3;
                sub[8 * h + 2 * r + l / 16] += ((lo | hi << 4) - 32) * q[128 * h + 32 * r + l];
            }
    int32_t isum = 0;
    for (int j = 0; j < 16; j++)
        isum += sc[j] * sub[j];
    return (f16_at(blk + 208) * dx) * (float)isum;
}

/* ---- the integer form (ggml_dot.h's table; layouts: ggml_dequant.c) ------ */

static uint32_t le32_at(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

const int8_t shoal_ggml_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                           1,    13,   25,  38,  53,  69,  89,  113};
const int8_t shoal_ggml_mxfp4_values[16] = {0,  1,  2,  3,  4,  6,  8,  12,
                                           0, -1, -2, -3, -4, -6, -8, -12};
#define iq4nl_values shoal_ggml_iq4nl_values
#define mxfp4_values shoal_ggml_mxfp4_values

/* the sign byte of an IQ2/IQ3 group of 8: 7 stored bits, the 8th making the
 * count of negatives even (ggml-common.h ksigns_iq2xs) */
static unsigned ksigns(unsigned i7)
{
    return i7 | (unsigned)__builtin_parity(i7) << 7;
}

/* nibbles of qs[16] as 32 codes: j < 16 the low nibble of qs[j], j + 16 its
 * high one (Q4_0's order), each through map (NULL: the nibble) plus off */
static void nibbles32(const uint8_t *qs, const int8_t *map, int off, int8_t *c)
{
    for (int j = 0; j < 16; j++) {
        const int lo = qs[j] & 0x0F, hi = qs[j] >> 4;
        c[j] = (int8_t)((map ? map[lo] : lo) + off);
        c[j + 16] = (int8_t)((map ? map[hi] : hi) + off);
    }
}

/* the 8 codes of IQ1 grid entry idx: 8 g + delta, g = its 2-bit value - 1 */
static void iq1_codes(unsigned idx, int delta, int8_t *c)
{
    const unsigned code = shoal_ggml_iq1s_codes[idx];
    for (int i = 0; i < 8; i++)
        c[i] = (int8_t)(8 * ((int)((code >> (2 * i)) & 3) - 1) + delta);
}

static void set_sc(struct shoal_ggml_iblock *ib, int k16, int n16, int v)
{
    for (int k = k16; k < k16 + n16; k++)
        ib->sc[k] = (int16_t)v;
}

void shoal_ggml_iblock_scales(enum shoal_ggml_type type, const uint8_t *blk,
                              struct shoal_ggml_iblock *ib)
{
    memset(ib->m, 0, sizeof ib->m);
    ib->dmin = 0.0f;
    ib->has_min = 0;
    switch (type) {
    case SHOAL_GGML_TYPE_Q2_K:
        for (int k = 0; k < 16; k++) {
            ib->sc[k] = blk[k] & 0x0F;
            ib->m[k] = blk[k] >> 4;
        }
        ib->d = f16_at(blk + 80);
        ib->dmin = f16_at(blk + 82);
        ib->has_min = 1;
        break;
    case SHOAL_GGML_TYPE_Q3_K: {
        const uint8_t *sc = blk + 96;
        for (int k = 0; k < 16; k++)
            ib->sc[k] = (int16_t)((((sc[k % 8] >> (4 * (k / 8))) & 0x0F) |
                                   ((sc[8 + k % 4] >> (2 * (k / 4))) & 3) << 4) - 32);
        ib->d = f16_at(blk + 108);
        break;
    }
    case SHOAL_GGML_TYPE_Q5_K:
        for (int j = 0; j < 8; j++) {
            int sc, m;
            shoal_ggml_scale_min_k4(j, blk + 4, &sc, &m);
            set_sc(ib, 2 * j, 2, sc);
            ib->m[2 * j] = ib->m[2 * j + 1] = (int16_t)m;
        }
        ib->d = f16_at(blk);
        ib->dmin = f16_at(blk + 2);
        ib->has_min = 1;
        break;
    case SHOAL_GGML_TYPE_IQ4_XS: {
        const unsigned sh = (unsigned)(blk[2] | blk[3] << 8);
        for (int j = 0; j < 8; j++)
            set_sc(ib, 2 * j, 2, (((blk[4 + j / 2] >> (4 * (j % 2))) & 0x0F) |
                                  (int)((sh >> (2 * j)) & 3) << 4) - 32);
        ib->d = f16_at(blk);
        break;
    }
    case SHOAL_GGML_TYPE_IQ2_XXS:
    case SHOAL_GGML_TYPE_IQ3_XXS:   /* a 4-bit s in the top of each group's u32 */
        for (int j = 0; j < 8; j++)
            set_sc(ib, 2 * j, 2,
                   (int)(2 * (le32_at(type == SHOAL_GGML_TYPE_IQ2_XXS ? blk + 6 + 8 * j
                                                                      : blk + 66 + 4 * j) >> 28) +
                         1));
        ib->d = f16_at(blk) * (type == SHOAL_GGML_TYPE_IQ2_XXS ? 0.125f : 0.25f);
        break;
    case SHOAL_GGML_TYPE_IQ2_XS:
    case SHOAL_GGML_TYPE_IQ2_S:   /* a 4-bit s per 16, a byte of two per 32 */
        for (int k = 0; k < 16; k++)
            ib->sc[k] = (int16_t)(2 * ((blk[(type == SHOAL_GGML_TYPE_IQ2_XS ? 66 : 74) + k / 2] >>
                                        (4 * (k % 2))) & 0x0F) + 1);
        ib->d = f16_at(blk) * 0.125f;
        break;
    case SHOAL_GGML_TYPE_IQ3_S:   /* a 4-bit s per 32, two a byte */
        for (int j = 0; j < 8; j++)
            set_sc(ib, 2 * j, 2, (int)(2 * ((blk[106 + j / 2] >> (4 * (j % 2))) & 0x0F) + 1));
        ib->d = f16_at(blk);
        break;
    case SHOAL_GGML_TYPE_IQ1_S:
        for (int j = 0; j < 8; j++)
            set_sc(ib, 2 * j, 2, (int)(2 * ((blk[35 + 2 * j] >> 4) & 7) + 1));
        ib->d = f16_at(blk) * 0.125f;
        break;
    case SHOAL_GGML_TYPE_IQ1_M: {
        unsigned sc[4];
        for (int i = 0; i < 4; i++)
            sc[i] = (unsigned)(blk[48 + 2 * i] | blk[49 + 2 * i] << 8);
        for (int k = 0; k < 16; k++)   /* 3 bits per 16 elements, 4 per u16 */
            ib->sc[k] = (int16_t)(2 * ((sc[k / 4] >> (3 * (k % 4))) & 7) + 1);
        const uint16_t dbits = (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) |
                                          ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000));
        ib->d = shoal_f16_to_f32(dbits) * 0.125f;
        break;
    }
    case SHOAL_GGML_TYPE_MXFP4: {
        /* 2^(e - 128) from its bits, as ggml_e8m0_to_fp32_half builds it */
        const unsigned e = blk[0];
        const uint32_t bits = e < 2 ? UINT32_C(0x00200000) << e : (uint32_t)(e - 1) << 23;
        memcpy(&ib->d, &bits, sizeof ib->d);
        set_sc(ib, 0, 2, 1);
        break;
    }
    default:   /* IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1 */
        set_sc(ib, 0, 2, 1);
        ib->d = f16_at(blk);
        if (type == SHOAL_GGML_TYPE_Q4_1 || type == SHOAL_GGML_TYPE_Q5_1) {
            ib->m[0] = ib->m[1] = 1;
            ib->dmin = -f16_at(blk + 2);
            ib->has_min = 1;
        }
        break;
    }
}

void shoal_ggml_iblock_decode(enum shoal_ggml_type type, const uint8_t *blk,
                              struct shoal_ggml_iblock *ib)
{
    shoal_ggml_iblock_scales(type, blk, ib);
    switch (type) {
    case SHOAL_GGML_TYPE_Q2_K: {
        const uint8_t *qs = blk + 16;
        for (int e = 0; e < QK_K; e++)
            ib->c[e] = (int8_t)((qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3);
        break;
    }
    case SHOAL_GGML_TYPE_Q3_K: {
        const uint8_t *hm = blk, *qs = blk + 32;
        for (int e = 0; e < QK_K; e++) {
            const int h = e / 128, s = (e / 32) % 4, l = e % 32;
            const int q = (qs[32 * h + l] >> (2 * s)) & 3;
            ib->c[e] = (int8_t)((hm[l] >> (4 * h + s)) & 1 ? q : q - 4);
        }
        break;
    }
    case SHOAL_GGML_TYPE_Q5_K: {
        const uint8_t *qh = blk + 16, *qs = blk + 48;
        for (int j = 0; j < 8; j++)
            for (int l = 0; l < 32; l++)
                ib->c[32 * j + l] = (int8_t)(((qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F) |
                                             ((qh[l] >> j) & 1) << 4);
        break;
    }
    case SHOAL_GGML_TYPE_IQ4_XS:
        for (int j = 0; j < 8; j++)
            nibbles32(blk + 8 + 16 * j, iq4nl_values, 0, ib->c + 32 * j);
        break;
    case SHOAL_GGML_TYPE_IQ4_NL:
        nibbles32(blk + 2, iq4nl_values, 0, ib->c);
        break;
    case SHOAL_GGML_TYPE_IQ2_XXS: {
        static const int8_t values[4] = {8, 25, 43, 0};
        for (int j = 0; j < 8; j++) {
            const uint8_t *g = blk + 2 + 8 * j;
            const uint32_t b = le32_at(g + 4);
            for (int l = 0; l < 4; l++) {
                const unsigned code = shoal_ggml_iq2xxs_codes[g[l]];
                const unsigned signs = ksigns((b >> (7 * l)) & 127u);
                for (int i = 0; i < 8; i++) {
                    const int v = values[(code >> (2 * i)) & 3];
                    ib->c[32 * j + 8 * l + i] = (int8_t)((signs >> i) & 1 ? -v : v);
                }
            }
        }
        break;
    }
    case SHOAL_GGML_TYPE_IQ3_XXS: {
        static const int8_t values[8] = {4, 12, 20, 28, 36, 44, 52, 62};
        const uint8_t *qs = blk + 2;
        for (int j = 0; j < 8; j++) {
            const uint32_t b = le32_at(blk + 66 + 4 * j);
            for (int l = 0; l < 4; l++) {
                const unsigned signs = ksigns((b >> (7 * l)) & 127u);
                for (int i = 0; i < 8; i++) {
                    const unsigned code = shoal_ggml_iq3xxs_codes[qs[8 * j + 2 * l + i / 4]];
                    const int v = values[(code >> (3 * (i % 4))) & 7];
                    ib->c[32 * j + 8 * l + i] = (int8_t)((signs >> i) & 1 ? -v : v);
                }
            }
        }
        break;
    }
    case SHOAL_GGML_TYPE_IQ2_XS:
    case SHOAL_GGML_TYPE_IQ2_S: {
        /* 8 elements an index: IQ2_XS u16 of 9 index and 7 sign bits;
         * IQ2_S a low index byte, 2 high bits in qh, a whole sign byte */
        static const int8_t values[4] = {8, 25, 43, 0};
        const int xs = type == SHOAL_GGML_TYPE_IQ2_XS;
        for (int g = 0; g < 32; g++) {
            unsigned code, signs;
            if (xs) {
                const unsigned q = (unsigned)(blk[2 + 2 * g] | blk[3 + 2 * g] << 8);
                code = shoal_ggml_iq2xs_codes[q & 511u];
                signs = ksigns(q >> 9);
            } else {
                code = shoal_ggml_iq2s_codes[blk[2 + g] | ((blk[66 + g / 4] >> (2 * (g % 4))) & 3) << 8];
                signs = blk[34 + g];
            }
            for (int i = 0; i < 8; i++) {
                const int v = values[(code >> (2 * i)) & 3];
                ib->c[8 * g + i] = (int8_t)((signs >> i) & 1 ? -v : v);
            }
        }
        break;
    }
    case SHOAL_GGML_TYPE_IQ3_S: {
        /* 4 elements an index: a low byte, the 9th bit in qh; a sign byte per 8 */
        static const int8_t values[8] = {1, 3, 5, 7, 9, 11, 13, 15};
        for (int k = 0; k < 64; k++) {
            const unsigned code =
                shoal_ggml_iq3s_codes[blk[2 + k] | ((blk[66 + k / 8] >> (k % 8)) & 1) << 8];
            const unsigned signs = blk[74 + k / 2];
            for (int i = 0; i < 4; i++) {
                const int v = values[(code >> (3 * i)) & 7];
                ib->c[4 * k + i] = (int8_t)((signs >> (4 * (k % 2) + i)) & 1 ? -v : v);
            }
        }
        break;
    }
    case SHOAL_GGML_TYPE_IQ1_S: {
        const uint8_t *qs = blk + 2;
        for (int j = 0; j < 8; j++) {
            const unsigned qh = (unsigned)(blk[34 + 2 * j] | blk[35 + 2 * j] << 8);
            for (int l = 0; l < 4; l++)
                iq1_codes(qs[4 * j + l] | ((qh >> (3 * l)) & 7) << 8, qh & 0x8000 ? -1 : 1,
                          ib->c + 32 * j + 8 * l);
        }
        break;
    }
    case SHOAL_GGML_TYPE_IQ1_M: {
        const uint8_t *qs = blk, *qh = blk + 32;
        for (int j = 0; j < 8; j++)
            for (int l = 0; l < 4; l++) {
                const unsigned nib = (qh[2 * j + l / 2] >> (4 * (l % 2))) & 0x0F;
                iq1_codes(qs[4 * j + l] | (nib & 7) << 8, nib & 0x08 ? -1 : 1,
                          ib->c + 32 * j + 8 * l);
            }
        break;
    }
    case SHOAL_GGML_TYPE_MXFP4:
        nibbles32(blk + 1, mxfp4_values, 0, ib->c);
        break;
    case SHOAL_GGML_TYPE_Q4_0:
    case SHOAL_GGML_TYPE_Q4_1:
        nibbles32(blk + (type == SHOAL_GGML_TYPE_Q4_0 ? 2 : 4), NULL,
                  type == SHOAL_GGML_TYPE_Q4_0 ? -8 : 0, ib->c);
        break;
    case SHOAL_GGML_TYPE_Q5_0:
    case SHOAL_GGML_TYPE_Q5_1: {
        const int q51 = type == SHOAL_GGML_TYPE_Q5_1;
        const uint32_t qh = le32_at(blk + (q51 ? 4 : 2));
        nibbles32(blk + (q51 ? 8 : 6), NULL, 0, ib->c);
        for (int j = 0; j < 32; j++)
            ib->c[j] = (int8_t)(ib->c[j] + (int)((qh >> j) & 1u) * 16 - (q51 ? 0 : 16));
        break;
    }
    default:
        break;
    }
}

/* The term of an integer-form block: ggml_dot.h's "every other type" */
static float term_iform(enum shoal_ggml_type type, const uint8_t *blk, const int8_t *q,
                        float dx)
{
    struct shoal_ggml_iblock ib;
    shoal_ggml_iblock_decode(type, blk, &ib);
    const int n16 = (int)shoal_ggml_type_info(type)->block_size / 16;
    int32_t isum = 0, msum = 0;
    for (int k = 0; k < n16; k++) {
        int32_t s = 0, xs = 0;
        for (int i = 16 * k; i < 16 * k + 16; i++) {
            s += ib.c[i] * q[i];
            xs += q[i];
        }
        isum += ib.sc[k] * s;
        msum += ib.m[k] * xs;
    }
    if (!ib.has_min)
        return (ib.d * dx) * (float)isum;
    return (ib.d * dx) * (float)isum - (ib.dmin * dx) * (float)msum;
}

/* The term of weight block blk (type) against its activation block's qx
 * (the 32 or 256 elements the weight block covers) and scale dx */
static float term(enum shoal_ggml_type type, const uint8_t *blk, const int8_t *q, float dx)
{
    switch (type) {
    case SHOAL_GGML_TYPE_Q8_0: return term_q8_0(blk, q, dx);
    case SHOAL_GGML_TYPE_Q4_K: return term_q4_k(blk, q, dx);
    case SHOAL_GGML_TYPE_Q6_K: return term_q6_k(blk, q, dx);
    default:                   return term_iform(type, blk, q, dx);
    }
}

float shoal_ggml_dot(const struct shoal_ggml_act *a, int64_t it, const void *row)
{
    const struct shoal_ggml_type_info *ti = shoal_ggml_type_info(a->type);
    const int8_t *q = a->q + it * a->n;
    const float *d = a->d + it * a->n_blk;
    const uint8_t *p = row;
    float acc = 0.0f;
    /* weight block b and activation block b cover the same elements */
    for (int64_t b = 0; b < a->n_blk; b++, p += ti->type_size)
        acc = acc + term(a->type, p, q + b * ti->block_size, d[b]);
    return acc;
}

static size_t row_bytes(const struct shoal_ggml_matrix *w)
{
    const struct shoal_ggml_type_info *ti = shoal_ggml_type_info(w->type);
    return (size_t)(w->cols / ti->block_size) * ti->type_size;
}

/* shoal_ggml_dot of row r with x [w->cols] f32, each activation block
 * quantized when its weight block is reached (same rule, same bits) */
static float dot_wide(const struct shoal_ggml_matrix *w, int64_t r, const float *x)
{
    const struct shoal_ggml_type_info *ti = shoal_ggml_type_info(w->type);
    const uint8_t *p = (const uint8_t *)w->data + (size_t)r * row_bytes(w);
    int8_t qb[QK_K];
    float acc = 0.0f;
    for (int64_t i0 = 0; i0 < w->cols; i0 += ti->block_size, p += ti->type_size) {
        float dx;
        shoal_quant_act_group_base(x + i0, ti->block_size, &dx, qb);
        acc = acc + term(w->type, p, qb, dx);
    }
    return acc;
}

void shoal_ggml_rows_scalar(float *y, const struct shoal_ggml_act *a, int64_t n_tok,
                            const struct shoal_ggml_matrix *w, int64_t r0, int64_t r1)
{
    const size_t rb = row_bytes(w);
    for (int64_t r = r0; r < r1; r++)
        for (int64_t t = 0; t < n_tok; t++)
            y[t * w->rows + r] = shoal_ggml_dot(a, t, (const uint8_t *)w->data + (size_t)r * rb);
}

int shoal_ggml_matrix_check(const struct shoal_ggml_matrix *w, size_t data_bytes,
                            struct shoal_err *err)
{
    if (!shoal_ggml_dot_supported(w->type))
        return shoal_err_set(err, SHOAL_EUNSUPPORTED,
                             "ggml matrix: type %s (id %u) has no dot product here; "
                             "expected one of %s",
                             shoal_ggml_type_name(w->type), (unsigned)w->type,
                             shoal_ggml_dot_types());
    const struct shoal_ggml_type_info *ti = shoal_ggml_type_info(w->type);
    if (w->rows < 1 || w->cols < 1 || w->cols % ti->block_size != 0)
        return shoal_err_set(err, SHOAL_ESHAPE,
                             "ggml matrix %s: shape [%lld][%lld]; expected rows >= 1 "
                             "and cols a positive multiple of %u",
                             ti->name, (long long)w->rows, (long long)w->cols,
                             ti->block_size);
    if (w->data == NULL)
        return shoal_err_set(err, SHOAL_EINVAL, "ggml matrix %s: data is NULL", ti->name);
    const size_t rb = row_bytes(w);
    if ((uint64_t)w->rows > SIZE_MAX / rb || (size_t)w->rows * rb > data_bytes)
        return shoal_err_set(err, SHOAL_ESHAPE,
                             "ggml matrix %s [%lld][%lld]: needs %lld rows of %zu "
                             "bytes, found %zu bytes",
                             ti->name, (long long)w->rows, (long long)w->cols,
                             (long long)w->rows, rb, data_bytes);
    return 0;
}

/* shoal_ggml_prefetch_next's hint: this thread's next weight bytes */
static _Thread_local const uint8_t *next_p;
static _Thread_local size_t next_n;

#define PF_NEXT_BYTES ((size_t)16384)

void shoal_ggml_prefetch_next(const struct shoal_ggml_matrix *w, int ith, int nth)
{
    next_p = NULL;
    next_n = 0;
    if (w == NULL || w->data == NULL)
        return;
    int64_t r0, r1;
    shoal_split_rows(w->rows, ith, nth, &r0, &r1);
    if (r0 >= r1)
        return;
    const size_t rb = row_bytes(w), share = (size_t)(r1 - r0) * rb;
    next_p = (const uint8_t *)w->data + (size_t)r0 * rb;
    next_n = share < PF_NEXT_BYTES ? share : PF_NEXT_BYTES;
}

struct shoal_ggml_hint shoal_ggml_hint_take(void)
{
    const struct shoal_ggml_hint h = {next_p, next_n};
    next_p = NULL;
    next_n = 0;
    return h;
}

void shoal_ggml_hint_put(struct shoal_ggml_hint h)
{
    next_p = h.p;
    next_n = h.n;
}

void shoal_ggml_linear_part(float *y, const float *x, int64_t n_tok,
                            const struct shoal_ggml_matrix *w, int ith, int nth)
{
    const uint8_t *const hint = next_p;
    const size_t hint_n = next_n;
    next_p = NULL;
    next_n = 0;
    int64_t r0, r1;
    shoal_split_rows(w->rows, ith, nth, &r0, &r1);
    if (r0 >= r1 || n_tok < 1)
        return;
    void (*rows)(float *, const struct shoal_ggml_act *, int64_t,
                 const struct shoal_ggml_matrix *, int64_t, int64_t) =
        shoal_quant_active_ops()->ggml_rows;
    if (rows == NULL)
        rows = shoal_ggml_rows_scalar;
    const int64_t n = w->cols;
    const size_t tok_bytes = shoal_ggml_act_bytes(w->type, n);
    uint8_t *const tile = tok_bytes <= SHOAL_ACT_TILE_BYTES ? shoal_act_tile() : NULL;
    if (tile == NULL) {
        /* a token wider than the tile (above about 229 K columns, 209 K for
         * the blocks of 32 with bsum; no shipped
         * model's matrix is): row by row, each activation block quantized
         * where it is used, the chain continued block by block: same bits */
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t r = r0; r < r1; r++)
                y[t * w->rows + r] = dot_wide(w, r, x + t * n);
        return;
    }
    struct shoal_ggml_act a;
    const int64_t per_tile = (int64_t)(SHOAL_ACT_TILE_BYTES / tok_bytes);
    for (int64_t t0 = 0; t0 < n_tok; t0 += per_tile) {
        const int64_t nt = n_tok - t0 < per_tile ? n_tok - t0 : per_tile;
        shoal_ggml_act_init(&a, w->type, n, nt, tile);
        if (t0 + nt >= n_tok) {   /* the last tile: its rows finish the call */
            a.pf_next = hint;
            a.pf_next_bytes = hint_n;
        }
        shoal_ggml_act_quantize(&a, x + t0 * n, nt);
        rows(y + t0 * w->rows, &a, nt, w, r0, r1);
    }
}

int shoal_ggml_linear(float *y, const float *x, int64_t n_tok,
                      const struct shoal_ggml_matrix *w)
{
    if (w == NULL || y == NULL || x == NULL || n_tok < 0)
        return SHOAL_EINVAL;
    int rc = shoal_ggml_matrix_check(w, SIZE_MAX, NULL);
    if (rc != 0)
        return rc;
    if (n_tok == 0)
        return 0;
#pragma omp parallel
    shoal_ggml_linear_part(y, x, n_tok, w, omp_get_thread_num(), omp_get_num_threads());
    return 0;
}
