/* ggml_avx2: ggml_dot.h's rows kernels (Q8_0, Q4_K, Q6_K, and the
 * integer-form types: Q2_K, Q3_K, Q5_K, the IQ types, MXFP4, Q4_0 ..
 * Q5_1) against int8 activations with AVX2, built with -mavx2 -mf16c and
 * without FMA.
 *
 * Same bits as shoal_ggml_rows_scalar: eight rows run side by side, lane i
 * of every f32 vector is row i's chain of ggml_dot.h's canonical order, so
 * each chain is the scalar one, step for step (separate mul / sub / add,
 * _mm256_cvtepi32_ps for (float)isum, F16C's exact f16 -> f32 for the
 * scales). The integer sums are reached with vpmaddubsw / vpmaddwd in
 * another order than the reference's, which is exact: every partial sum
 * stays inside int16 (vpmaddubsw pairs: at most 2 * 128 * 127 = 32512 for
 * Q8_0 with |w| as the unsigned side, 2 * 63 * 127 for Q6_K) and int32.
 *
 * The integer-form types (ggml_dot.h): Q5_K, Q2_K, Q3_K, IQ4_XS, IQ4_NL
 * and MXFP4 codes are unpacked with shifts, masks and vpshufb (the
 * codebooks); the grid types and Q4_0 .. Q5_1 take the codes from the
 * scalar shoal_ggml_iblock_decode. Codes are signed: vpmaddubsw takes |c|
 * and qx with c's sign (vpsignb), |c| * 127 * 2 fits int16.
 *
 * Batches: a block of eight rows is unpacked once (K-quants: nibbles and
 * 6-bit codes to bytes, scales to int16 vectors) into a 4 KiB buffer and
 * used for every token of the call, up to TOK_TILE tokens at a time, the
 * chains of all those tokens kept in acc[]. A decode matvec is the same
 * path with one token. Rows past the end of the share repeat its last row
 * and are not stored.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "ggml_dot.h"
#include "ggml_types_impl.h"

#define QK_K 256
#define TOK_TILE 64   /* tokens whose chains run against one unpacked block */

/* lane i = the sum of v[i]'s eight int32 lanes (exact integer sums) */
static inline __m256i hsum_rows8(const __m256i v[8])
{
    const __m256i a0 = _mm256_hadd_epi32(v[0], v[1]);
    const __m256i a1 = _mm256_hadd_epi32(v[2], v[3]);
    const __m256i a2 = _mm256_hadd_epi32(v[4], v[5]);
    const __m256i a3 = _mm256_hadd_epi32(v[6], v[7]);
    const __m256i b0 = _mm256_hadd_epi32(a0, a1);  /* rows 0-3: lo | hi halves */
    const __m256i b1 = _mm256_hadd_epi32(a2, a3);  /* rows 4-7 */
    return _mm256_add_epi32(_mm256_permute2x128_si256(b0, b1, 0x20),
                            _mm256_permute2x128_si256(b0, b1, 0x31));
}

static inline uint16_t ld16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return h;
}

/* the f16 at offset off of each of the eight rows, as exact f32 */
static inline __m256 f16x8(const uint8_t *const p[8], size_t off)
{
    const __m128i h = _mm_setr_epi16((short)ld16(p[0] + off), (short)ld16(p[1] + off),
                                     (short)ld16(p[2] + off), (short)ld16(p[3] + off),
                                     (short)ld16(p[4] + off), (short)ld16(p[5] + off),
                                     (short)ld16(p[6] + off), (short)ld16(p[7] + off));
    return _mm256_cvtph_ps(h);
}

/* two int16 values in one int32 lane: vpmaddwd's pair (lo, hi) */
static inline int32_t pair16(int lo, int hi)
{
    return (int32_t)((uint32_t)(uint16_t)lo | (uint32_t)(uint16_t)hi << 16);
}

static void store_rows(float *y, int64_t rows, int64_t t, int64_t r, int nr, __m256 v)
{
    float l[8];
    _mm256_storeu_ps(l, v);
    for (int i = 0; i < nr; i++)
        y[t * rows + r + i] = l[i];
}

/* the nt chains of a tile of tokens, each starting at 0.0f */
static inline void zero_acc(__m256 *acc, int64_t nt)
{
    for (int64_t t = 0; t < nt; t++)
        acc[t] = _mm256_setzero_ps();
}

/* ---- Q8_0 ------------------------------------------------------------------ */

static void rows8_q8_0(float *y, const struct shoal_ggml_act *a, int64_t t0, int64_t nt,
                       const struct shoal_ggml_matrix *w, const uint8_t *const p[8],
                       int64_t r, int nr)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[TOK_TILE];
    zero_acc(acc, nt);
    for (int64_t b = 0; b < a->n_blk; b++) {
        const size_t off = (size_t)b * 34;
        const __m256 dw = f16x8(p, off);
        __m256i wq[8], wa[8];
        for (int i = 0; i < 8; i++) {
            wq[i] = _mm256_loadu_si256((const __m256i *)(p[i] + off + 2));
            wa[i] = _mm256_abs_epi8(wq[i]);   /* -128 reads as 128 unsigned */
        }
        for (int64_t t = 0; t < nt; t++) {
            const int64_t tt = t0 + t;
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(a->q + tt * a->n + 32 * b));
            __m256i s[8];
            for (int i = 0; i < 8; i++)
                s[i] = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(wa[i], _mm256_sign_epi8(xv, wq[i])), ones);
            const __m256i isum = hsum_rows8(s);
            const __m256 dd = _mm256_mul_ps(dw, _mm256_set1_ps(a->d[tt * a->n_blk + b]));
            acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(dd, _mm256_cvtepi32_ps(isum)));
        }
    }
    for (int64_t t = 0; t < nt; t++)
        store_rows(y, w->rows, t0 + t, r, nr, acc[t]);
}

/* ---- K-quants: a super-block of eight rows unpacked ----------------------- */

struct kblock {
    __m256i q[8][8];    /* [row][32-element register] codes as bytes (unsigned) */
    __m256i sc[8][8];   /* [row][register] int16 scale of each 16-bit product */
    __m256i corr[8];    /* [pair k] lanes rows: pair16 of the correction weights */
    __m256 d, dmin;     /* lanes rows: the block's f16 scales */
};

/* Q4_K block b: q = the nibbles (register j = sub-block j), sc = its 6-bit
 * scale, corr[k] = (m[2k], m[2k+1]) */
static void unpack_q4_k(struct kblock *k, const uint8_t *const p[8], int64_t b)
{
    const size_t off = (size_t)b * 144;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    int32_t corr[4][8];
    for (int i = 0; i < 8; i++) {
        const uint8_t *blk = p[i] + off;
        for (int h = 0; h < 4; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * h));
            k->q[i][2 * h] = _mm256_and_si256(v, m4);
            k->q[i][2 * h + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        }
        int sc[8], m[8];
        for (int j = 0; j < 8; j++) {
            shoal_ggml_scale_min_k4(j, blk + 4, &sc[j], &m[j]);
            k->sc[i][j] = _mm256_set1_epi16((short)sc[j]);
        }
        for (int j = 0; j < 4; j++)
            corr[j][i] = pair16(m[2 * j], m[2 * j + 1]);
    }
    for (int j = 0; j < 4; j++)
        k->corr[j] = _mm256_loadu_si256((const __m256i *)corr[j]);
    k->d = f16x8(p, off);
    k->dmin = f16x8(p, off + 2);
}

/* Q6_K block b: q = the 6-bit codes 0..63 (register 4h + r = elements
 * 128h + 32r ..), sc = sub-block 8h + 2r's scale in the low 128 bits and
 * 8h + 2r + 1's in the high, corr[k] = (sc[2k], sc[2k+1]) */
static void unpack_q6_k(struct kblock *k, const uint8_t *const p[8], int64_t b)
{
    const size_t off = (size_t)b * 210;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    int32_t corr[8][8];
    for (int i = 0; i < 8; i++) {
        const uint8_t *ql = p[i] + off, *qh = ql + 128;
        const int8_t *sc = (const int8_t *)(ql + 192);
        for (int h = 0; h < 2; h++) {
            const __m256i hv = _mm256_loadu_si256((const __m256i *)(qh + 32 * h));
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(ql + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 64 * h + 32));
            const __m256i lo[4] = {
                _mm256_and_si256(l0, m4), _mm256_and_si256(l1, m4),
                _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4)};
            for (int r = 0; r < 4; r++) {
                /* shifts of 16-bit lanes: the mask keeps each byte's own bits */
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(hv, 2 * r), m2);
                k->q[i][4 * h + r] = _mm256_or_si256(lo[r], _mm256_slli_epi16(hi, 4));
                k->sc[i][4 * h + r] = _mm256_set_m128i(_mm_set1_epi16(sc[8 * h + 2 * r + 1]),
                                                       _mm_set1_epi16(sc[8 * h + 2 * r]));
            }
        }
        for (int j = 0; j < 8; j++)
            corr[j][i] = pair16(sc[2 * j], sc[2 * j + 1]);
    }
    for (int j = 0; j < 8; j++)
        k->corr[j] = _mm256_loadu_si256((const __m256i *)corr[j]);
    k->d = f16x8(p, off + 208);
}

/* lanes rows: sum_j sc * (sum over register j's elements of code * qx) */
static inline __m256i kblock_raw(const struct kblock *k, const int8_t *x)
{
    __m256i xv[8], s[8];
    for (int j = 0; j < 8; j++)
        xv[j] = _mm256_loadu_si256((const __m256i *)(x + 32 * j));
    for (int i = 0; i < 8; i++) {
        __m256i acc = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++)
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(k->q[i][j], xv[j]),
                                                          k->sc[i][j]));
        s[i] = acc;
    }
    return hsum_rows8(s);
}

static void rows8_k(float *y, const struct shoal_ggml_act *a, int64_t t0, int64_t nt,
                    const struct shoal_ggml_matrix *w, const uint8_t *const p[8], int64_t r,
                    int nr)
{
    const int q6 = w->type == SHOAL_GGML_TYPE_Q6_K;
    const int64_t n16 = a->n / 16;
    struct kblock k;
    __m256 acc[TOK_TILE];
    zero_acc(acc, nt);
    for (int64_t b = 0; b < a->n_blk; b++) {
        if (q6)
            unpack_q6_k(&k, p, b);
        else
            unpack_q4_k(&k, p, b);
        for (int64_t t = 0; t < nt; t++) {
            const int64_t tt = t0 + t;
            const __m256i raw = kblock_raw(&k, a->q + tt * a->n + QK_K * b);
            const int16_t *bs = a->bsum + tt * n16 + 16 * b;
            const __m256 dx = _mm256_set1_ps(a->d[tt * a->n_blk + b]);
            if (q6) {
                /* isum = raw - 32 * sum_j sc[j] * bsum[j] */
                __m256i c = _mm256_setzero_si256();
                for (int j = 0; j < 8; j++)
                    c = _mm256_add_epi32(c, _mm256_madd_epi16(
                        k.corr[j], _mm256_set1_epi32(pair16(bs[2 * j], bs[2 * j + 1]))));
                const __m256i isum = _mm256_sub_epi32(raw, _mm256_slli_epi32(c, 5));
                acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(_mm256_mul_ps(k.d, dx),
                                                             _mm256_cvtepi32_ps(isum)));
            } else {
                /* msum = sum_j m[j] * (bsum[2j] + bsum[2j+1]) */
                __m256i msum = _mm256_setzero_si256();
                for (int j = 0; j < 4; j++)
                    msum = _mm256_add_epi32(msum, _mm256_madd_epi16(
                        k.corr[j], _mm256_set1_epi32(pair16(bs[4 * j] + bs[4 * j + 1],
                                                            bs[4 * j + 2] + bs[4 * j + 3]))));
                const __m256 ta = _mm256_mul_ps(_mm256_mul_ps(k.d, dx), _mm256_cvtepi32_ps(raw));
                const __m256 tb = _mm256_mul_ps(_mm256_mul_ps(k.dmin, dx),
                                                _mm256_cvtepi32_ps(msum));
                acc[t] = _mm256_add_ps(acc[t], _mm256_sub_ps(ta, tb));
            }
        }
    }
    for (int64_t t = 0; t < nt; t++)
        store_rows(y, w->rows, t0 + t, r, nr, acc[t]);
}

/* ---- the integer-form types (ggml_dot.h's shoal_ggml_iblock) ------------ */

struct iblock8 {
    __m256i ca[8][8];   /* [row][32-element register] |c| as unsigned bytes */
    __m256i cs[8][8];   /* [row][register] c, for its signs */
    __m256i sc[8][8];   /* [row][register] int16 scale of each 16-bit product:
                           the first 16 elements' in the low 128 bits */
    __m256i corr[8];    /* [pair k] lanes rows: pair16(m[2k], m[2k+1]) */
    __m256 d, dmin;     /* lanes rows: D and DMIN */
    int has_min;        /* the type's (shoal_ggml_iblock has_min) */
};

/* the bits of each byte of v shifted down by n, masked with mask (shifts of
 * 16-bit lanes: the mask keeps each byte's own bits) */
static inline __m256i bits8(__m256i v, int n, int mask)
{
    return _mm256_and_si256(_mm256_srli_epi16(v, n), _mm256_set1_epi8((char)mask));
}

/* 32 codes from 16 bytes of nibbles (low nibbles elements 0..15, high
 * 16..31) through a 16-entry int8 table */
static inline __m256i nibbles_lut(const uint8_t *qs, const int8_t *table)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(0x0F);
    const __m128i lut = _mm_loadu_si128((const __m128i *)table);
    const __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(v, m4));
    const __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(v, 4), m4));
    return _mm256_set_m128i(hi, lo);
}

/* The codes of one block of the types unpacked with SIMD here into c
 * (ggml_dot.h's table, the same integers as shoal_ggml_iblock_decode), the
 * scales, mins and D, DMIN into ib (its c untouched). Returns 0 for the
 * other types (they use the scalar decode). */
static int unpack_codes(enum shoal_ggml_type type, const uint8_t *blk, __m256i c[8],
                        struct shoal_ggml_iblock *ib)
{
    switch (type) {
    case SHOAL_GGML_TYPE_Q5_K: {
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 16));
        for (int j = 0; j < 8; j++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 48 + 32 * (j / 2)));
            c[j] = _mm256_or_si256(bits8(v, 4 * (j % 2), 0x0F),
                                   _mm256_slli_epi16(bits8(qh, j, 1), 4));
        }
        break;
    }
    case SHOAL_GGML_TYPE_Q2_K:
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * h));
            for (int s = 0; s < 4; s++)
                c[4 * h + s] = bits8(v, 2 * s, 3);
        }
        break;
    case SHOAL_GGML_TYPE_Q3_K: {
        /* q | 4 * hmask bit, minus 4 */
        const __m256i hm = _mm256_loadu_si256((const __m256i *)blk), four = _mm256_set1_epi8(4);
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 32 + 32 * h));
            for (int s = 0; s < 4; s++)
                c[4 * h + s] = _mm256_sub_epi8(
                    _mm256_or_si256(bits8(v, 2 * s, 3),
                                    _mm256_slli_epi16(bits8(hm, 4 * h + s, 1), 2)), four);
        }
        break;
    }
    case SHOAL_GGML_TYPE_IQ4_XS:
        for (int j = 0; j < 8; j++)
            c[j] = nibbles_lut(blk + 8 + 16 * j, shoal_ggml_iq4nl_values);
        break;
    case SHOAL_GGML_TYPE_IQ4_NL:
        c[0] = nibbles_lut(blk + 2, shoal_ggml_iq4nl_values);
        break;
    case SHOAL_GGML_TYPE_MXFP4:
        c[0] = nibbles_lut(blk + 1, shoal_ggml_mxfp4_values);
        break;
    default:
        return 0;
    }
    /* scales, mins and D: the scalar decode's, with its codes discarded
     * (cheap next to the codes for these types' layouts) */
    shoal_ggml_iblock_scales(type, blk, ib);
    return 1;
}

/* Block b of eight rows: the codes unpacked with SIMD (unpack_codes) or
 * decoded by the scalar shoal_ggml_iblock_decode (the reference's own
 * integers; the SIMD part is then the sums). nreg: 32-element registers a
 * block (1 or 8). */
static void unpack_iform(struct iblock8 *k, enum shoal_ggml_type type, const uint8_t *const p[8],
                         size_t off, int nreg)
{
    struct shoal_ggml_iblock ib;
    float d[8], dmin[8];
    int32_t corr[8][8];
    for (int i = 0; i < 8; i++) {
        __m256i cv[8];
        if (!unpack_codes(type, p[i] + off, cv, &ib)) {
            shoal_ggml_iblock_decode(type, p[i] + off, &ib);
            for (int j = 0; j < nreg; j++)
                cv[j] = _mm256_loadu_si256((const __m256i *)(ib.c + 32 * j));
        }
        for (int j = 0; j < nreg; j++) {
            const __m256i c = cv[j];
            k->cs[i][j] = c;
            k->ca[i][j] = _mm256_abs_epi8(c);
            k->sc[i][j] = _mm256_set_m128i(_mm_set1_epi16(ib.sc[2 * j + 1]),
                                           _mm_set1_epi16(ib.sc[2 * j]));
            corr[j][i] = pair16(ib.m[2 * j], ib.m[2 * j + 1]);
        }
        d[i] = ib.d;
        dmin[i] = ib.dmin;
    }
    k->has_min = ib.has_min;
    for (int j = 0; j < nreg; j++)
        k->corr[j] = _mm256_loadu_si256((const __m256i *)corr[j]);
    k->d = _mm256_loadu_ps(d);
    k->dmin = _mm256_loadu_ps(dmin);
}

/* lanes rows: isum = sum_k sc[k] * (sum over the 16s of c * qx); each
 * vpmaddubsw pair |c| * qx stays within 2 * 127 * 127 */
static inline __m256i iblock_isum(const struct iblock8 *k, const int8_t *x, int nreg)
{
    __m256i xv[8], s[8];
    for (int j = 0; j < nreg; j++)
        xv[j] = _mm256_loadu_si256((const __m256i *)(x + 32 * j));
    for (int i = 0; i < 8; i++) {
        __m256i acc = _mm256_setzero_si256();
        for (int j = 0; j < nreg; j++)
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(
                _mm256_maddubs_epi16(k->ca[i][j], _mm256_sign_epi8(xv[j], k->cs[i][j])),
                k->sc[i][j]));
        s[i] = acc;
    }
    return hsum_rows8(s);
}

static void rows8_iform(float *y, const struct shoal_ggml_act *a, int64_t t0, int64_t nt,
                        const struct shoal_ggml_matrix *w, const uint8_t *const p[8],
                        size_t type_size, int64_t r, int nr)
{
    const int B = (int)(a->n / a->n_blk), nreg = B / 32;
    const int64_t n16 = a->n / 16;
    struct iblock8 k;
    __m256 acc[TOK_TILE];
    zero_acc(acc, nt);
    for (int64_t b = 0; b < a->n_blk; b++) {
        unpack_iform(&k, w->type, p, (size_t)b * type_size, nreg);
        for (int64_t t = 0; t < nt; t++) {
            const int64_t tt = t0 + t;
            const __m256i isum = iblock_isum(&k, a->q + tt * a->n + (int64_t)B * b, nreg);
            const __m256 dx = _mm256_set1_ps(a->d[tt * a->n_blk + b]);
            const __m256 ta = _mm256_mul_ps(_mm256_mul_ps(k.d, dx), _mm256_cvtepi32_ps(isum));
            if (!k.has_min) {
                acc[t] = _mm256_add_ps(acc[t], ta);
                continue;
            }
            /* msum = sum_k m[k] * bsum[k], two 16s a vpmaddwd pair */
            const int16_t *bs = a->bsum + tt * n16 + (int64_t)(B / 16) * b;
            __m256i msum = _mm256_setzero_si256();
            for (int j = 0; j < nreg; j++)
                msum = _mm256_add_epi32(msum, _mm256_madd_epi16(
                    k.corr[j], _mm256_set1_epi32(pair16(bs[2 * j], bs[2 * j + 1]))));
            const __m256 tb = _mm256_mul_ps(_mm256_mul_ps(k.dmin, dx), _mm256_cvtepi32_ps(msum));
            acc[t] = _mm256_add_ps(acc[t], _mm256_sub_ps(ta, tb));
        }
    }
    for (int64_t t = 0; t < nt; t++)
        store_rows(y, w->rows, t0 + t, r, nr, acc[t]);
}

void shoal_ggml_rows_avx2(float *y, const struct shoal_ggml_act *a, int64_t n_tok,
                          const struct shoal_ggml_matrix *w, int64_t r0, int64_t r1)
{
    /* bytes per block and per row (ggml_types.c's sizes) */
    const struct shoal_ggml_type_info *ti = shoal_ggml_type_info(w->type);
    const size_t rb = (size_t)(w->cols / ti->block_size) * ti->type_size;
    for (int64_t r = r0; r < r1; r += 8) {
        const int nr = r1 - r < 8 ? (int)(r1 - r) : 8;
        const uint8_t *p[8];
        for (int i = 0; i < 8; i++)
            p[i] = (const uint8_t *)w->data + (size_t)(r + (i < nr ? i : nr - 1)) * rb;
        for (int64_t t0 = 0; t0 < n_tok; t0 += TOK_TILE) {
            const int64_t nt = n_tok - t0 < TOK_TILE ? n_tok - t0 : TOK_TILE;
            if (w->type == SHOAL_GGML_TYPE_Q8_0)
                rows8_q8_0(y, a, t0, nt, w, p, r, nr);
            else if (w->type == SHOAL_GGML_TYPE_Q4_K || w->type == SHOAL_GGML_TYPE_Q6_K)
                rows8_k(y, a, t0, nt, w, p, r, nr);
            else
                rows8_iform(y, a, t0, nt, w, p, ti->type_size, r, nr);
        }
    }
}
