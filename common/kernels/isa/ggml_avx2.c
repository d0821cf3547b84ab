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
 * Every type but Q8_0 has the general body (rows8_t, specialised per
 * type at compile time; the commonest types have faster paths below): a row's block is unpacked to registers of 32
 * byte codes (shifts, masks, vpshufb codebooks; the grid types IQ2_XXS,
 * IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M through their codebooks
 * expanded once to a byte per element, and sign bytes from 128 parity
 * patterns or 256 whole sign bytes) and per-16 int16 scales, the same
 * integers as ggml_dot.c's shoal_ggml_iblock_decode (the comment above
 * unpack_row says how the offsets and mins come back in).
 *
 * Batches: one token (the decode matvec) unpacks each row's block into
 * registers and uses it at once (Q4_K, Q5_K, Q6_K, Q2_K, Q3_K and IQ4_XS in
 * few registers: rows8_k_1; Q8_0 a block of 32 at a time: rows8_q8_0_1;
 * Q4_0, Q4_1, Q5_0, Q5_1, MXFP4 and, with VNNI, IQ4_NL two blocks at a
 * time: rows8_b32_pair_1; the grid types straight to their raw sum: raw1, with
 * VNNI (and VBMI) IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S a whole block
 * in 512-bit registers); more tokens unpack a block of eight rows
 * once into a 6 KiB buffer and use it for every token of the call, up to
 * TOK_TILE tokens at a time, the chains of all those tokens kept in
 * acc[]. Q4_K, Q5_K (and Q6_K, Q3_K, Q2_K from K16_GEMM_MIN tokens), the
 * blocks of 32 (Q4_0, MXFP4, Q4_1, Q5_0, Q5_1; IQ4_NL and, from
 * Q80_GEMM_MIN tokens, Q8_0 with VNNI) transpose the eight rows' block
 * instead, rows in lanes (rows8_k_n: the prefill GEMM). Rows past the end of the share repeat its last row and are not
 * stored. While a group of eight rows runs, the next group's blocks are
 * prefetched (prefetch_block).
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "ggml_dot.h"
#include "ggml_types_impl.h"
#include "prefetch_x86.h"

/* Built a second time with AVX-512 VL and VNNI (common/meson.build) as
 * shoal_ggml_rows_avx512: the one-token rows of Q4_K, Q6_K, Q2_K, Q3_K and
 * Q8_0 then sum with vpdpbusd / vpdpwssd (dp_pair; Q2_K's and Q3_K's in
 * 512-bit registers, a third fewer instructions: 2 threads from RAM, Q2_K
 * 18-21 -> 22-25 GB/s on Zen 4; IQ4_XS's 512-bit with its codes + 128), the
 * same integers, and Q8_0's GEMM takes the transposed block (kblk_q80). */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define SHOAL_GGML_VNNI 1
#define SHOAL_GGML_ROWS_FN shoal_ggml_rows_avx512
#else
#define SHOAL_GGML_VNNI 0
#define SHOAL_GGML_ROWS_FN shoal_ggml_rows_avx2
#endif

#define QK_K 256
#define TOK_TILE 64   /* tokens whose chains run against one unpacked block */
#define PF_AHEAD ((size_t)8192)   /* least bytes of a row share prefetched ahead */

/* lane i = the sum of v[i]'s eight int32 lanes (exact integer sums) */
/* lane i = the sum of row i's lanes, from the pairs' folds a[k] =
 * hadd(v[2k], v[2k + 1]) (hsum_rows8's last steps; rows8_k_1 folds the
 * pairs as they come) */
static inline __m256i fold_pairs(const __m256i a[4])
{
    const __m256i b0 = _mm256_hadd_epi32(a[0], a[1]);  /* rows 0-3: lo | hi halves */
    const __m256i b1 = _mm256_hadd_epi32(a[2], a[3]);  /* rows 4-7 */
    return _mm256_add_epi32(_mm256_permute2x128_si256(b0, b1, 0x20),
                            _mm256_permute2x128_si256(b0, b1, 0x31));
}

static inline __m256i hsum_rows8(const __m256i v[8])
{
    const __m256i a[4] = {_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]),
                          _mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7])};
    return fold_pairs(a);
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

/* -v lane by lane as the scalar's unary minus: the sign bit flipped (a
 * zero and a NaN too, where 0 - v would keep a NaN's sign) */
static inline __m256 neg8(__m256 v)
{
    return _mm256_xor_ps(v, _mm256_set1_ps(-0.0f));
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

static inline uint32_t le32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* an empty asm that *v passes through: it keeps the int16 sums of a run
 * a chain per token, in the order written. Without it GCC reassociates the
 * run into a tree of adds whose leaves (every product of every token of the
 * block) are computed first and spilled to the stack: 2x slower. */
static inline __attribute__((always_inline)) void chain(__m256i *v)
{
    __asm__("" : "+x"(*v));
}

/* the int32 at p in every lane (vpbroadcastd from memory) */
static inline __m256i bcast4(const void *p)
{
    return _mm256_set1_epi32((int)le32((const uint8_t *)p));
}

/* ---- Q8_0 ------------------------------------------------------------------ */

/* noinline: inlined into rows8_q8_0_n beside the transposed path, GCC
 * built it 10 % slower (kernel_l2, 2 and 5 tokens) */
static __attribute__((noinline)) void rows8_q8_0(float *y, const struct shoal_ggml_act *a, int64_t t0, int64_t nt,
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

/* Prefetch block off of the row pf[i] (the next eight rows' row i, or
 * NULL at the end of the share): the eight rows of a group are short
 * streams (a few hundred bytes to a few KiB each) read block by block
 * across rows, an order the hardware prefetchers pick up late; one group
 * ahead hides the DRAM latency. Into L2 (prefetch_x86.h): on Zen 4 the
 * one-token Q4_K / Q6_K / Q8_0 rows at 2 threads went from 0.62-0.66 /
 * 0.53-0.62 / 0.53 of a paired read with _MM_HINT_T0 to 0.87 / 0.76-0.80
 * / 0.90-0.92. always_inline: GCC 12 takes a function of
 * nothing but prefetches for a const one and drops its calls unless it is
 * inlined before that analysis. */
static inline __attribute__((always_inline)) void prefetch_block(const uint8_t *const pf[8], int i, size_t off, size_t type_size)
{
    if (pf[i] == NULL)
        return;
    for (size_t o = 0; o < type_size; o += 64)
        _mm_prefetch((const char *)(pf[i] + off + o), SHOAL_PF_WEIGHTS);
    _mm_prefetch((const char *)(pf[i] + off + type_size - 1), SHOAL_PF_WEIGHTS);
}

/* ---- every other type: a block of eight rows unpacked --------------------
 *
 * Each type's block is one or eight registers of 32 codes that vpmaddubsw
 * takes as its unsigned side: the codes themselves where they are >= 0
 * (Q4_K, Q5_K, Q2_K, Q4_1, Q5_1; Q6_K and Q3_K as q + 32 and q + 4, the
 * offset taken back below), else |c| with c's sign put on qx (vpsignb).
 * With the scale of each 16 (vpmaddwd) the registers give the block's raw
 * integer sum; the correction per type (kind) then gives isum and msum of
 * ggml_dot.h exactly:
 *   KIND_MIN32  Q4_K, Q5_K: msum = sum_j m[j] * (the sum of qx over
 *               sub-block j's 32), four vpmaddwd pairs
 *   KIND_MIN16  Q2_K, Q4_1, Q5_1: msum = sum_k m[k] * bsum[k]
 *   KIND_OFF    Q6_K (32), Q3_K (4): isum = raw - off * sum_k sc[k] * bsum[k]
 *   KIND_NONE   the signed types: isum = raw
 * Every vpmaddubsw pair stays in int16: |c| <= 127 against |qx| <= 127
 * (2 * 127 * 127), unsigned codes <= 63. */

enum kind { KIND_NONE, KIND_MIN32, KIND_MIN16, KIND_OFF };

struct urow {
    __m256i q[8];       /* [register] unsigned codes or |c| */
    __m256i s[8];       /* [register] signed types: a byte of c's sign (c or +-1) */
    __m256i sc[8];      /* [register] int16 scale per product pair: the first
                           16 elements' in the low 128 bits */
    __m256i corr16;     /* blocks of 256 with a correction: the int16 weight
                           of each 16's bsum (m[k], or sc[k] for KIND_OFF) */
    float d, dmin;      /* D and DMIN (ggml_dot.h) */
};

static inline __attribute__((always_inline)) int t_nreg(enum shoal_ggml_type t)
{
    switch (t) {
    case SHOAL_GGML_TYPE_IQ4_NL: case SHOAL_GGML_TYPE_MXFP4: case SHOAL_GGML_TYPE_Q4_0:
    case SHOAL_GGML_TYPE_Q4_1: case SHOAL_GGML_TYPE_Q5_0: case SHOAL_GGML_TYPE_Q5_1:
        return 1;
    default:
        return 8;
    }
}

static inline __attribute__((always_inline)) enum kind t_kind(enum shoal_ggml_type t)
{
    switch (t) {
    case SHOAL_GGML_TYPE_Q4_K: case SHOAL_GGML_TYPE_Q5_K: return KIND_MIN32;
    case SHOAL_GGML_TYPE_Q2_K: case SHOAL_GGML_TYPE_Q4_1: case SHOAL_GGML_TYPE_Q5_1:
        return KIND_MIN16;
    case SHOAL_GGML_TYPE_Q6_K: case SHOAL_GGML_TYPE_Q3_K: return KIND_OFF;
    default: return KIND_NONE;
    }
}

/* KIND_OFF's offset as a shift: 32 (Q6_K) or 4 (Q3_K) */
static inline __attribute__((always_inline)) int t_offshift(enum shoal_ggml_type t)
{
    return t == SHOAL_GGML_TYPE_Q6_K ? 5 : 2;
}

static inline __attribute__((always_inline)) int t_signed(enum shoal_ggml_type t)
{
    return t_kind(t) == KIND_NONE;
}

/* the grid codebooks a byte per element and the sign patterns
 * (ggml_grid_bytes.c, built once by shoal_ggml_grid_bytes_init) */
#define GB shoal_ggml_grid_bytes


static inline float f16_at(const uint8_t *p) { return _cvtsh_ss(ld16(p)); }

/* the bits of each byte of v shifted down by n, masked with mask (shifts of
 * 16-bit lanes: the mask keeps each byte's own bits) */
static inline __m256i bits8(__m256i v, int n, int mask)
{
    return _mm256_and_si256(_mm256_srli_epi16(v, n), _mm256_set1_epi8((char)mask));
}

/* the 16 nibbles of qs as 32 bytes: low nibbles elements 0..15, high 16..31 */
static inline __m256i nibbles32(const uint8_t *qs)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
}

/* byte j of the result: 16 if bit j of qh is set, else 0 */
static inline __m256i bits16(uint32_t qh)
{
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, bit), _mm256_set1_epi8(16));
}

/* a 16-entry int8 table looked up with the nibbles of qs (nibbles32's order) */
static inline __m256i lut32(const uint8_t *qs, const int8_t *table)
{
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)table));
    return _mm256_shuffle_epi8(lut, nibbles32(qs));
}

static inline __m256i sc2(int lo, int hi)
{
    return _mm256_set_m128i(_mm_set1_epi16((short)hi), _mm_set1_epi16((short)lo));
}

/* IQ2_XXS's and IQ3_XXS's u32 of a group of 32: four 7-bit sign indices
 * (u->s[j]) and the 4-bit scale s on top (u->sc[j] = 2 s + 1) */
static inline void grid_signs(struct urow *u, int j, uint32_t aux)
{
    u->s[j] = _mm256_set_epi64x((long long)GB.sign7[(aux >> 21) & 127],
                                (long long)GB.sign7[(aux >> 14) & 127],
                                (long long)GB.sign7[(aux >> 7) & 127], (long long)GB.sign7[aux & 127]);
    u->sc[j] = _mm256_set1_epi16((short)(2 * (aux >> 28) + 1));
}

/* Scale vectors from bytes of scales S (int8; < 128 if unsigned), the
 * 16-bit lanes of register j: per16, the 16s 2j (low 128 bits) and 2j + 1
 * (high) are bytes 2j and 2j + 1 of S; else (a scale per 32) byte j.
 * vpshufb puts the byte in both halves of each int16, the arithmetic shift
 * sign-extends it. */
static inline __m256i scale_reg(__m256i S2, int j, int per16)
{
    const __m256i ctrl = per16 ? _mm256_set_m128i(_mm_set1_epi8((char)(2 * j + 1)),
                                                  _mm_set1_epi8((char)(2 * j)))
                               : _mm256_set1_epi8((char)j);
    return _mm256_srai_epi16(_mm256_shuffle_epi8(S2, ctrl), 8);
}

static inline void scales_put(struct urow *u, __m128i S, int per16)
{
    const __m256i S2 = _mm256_broadcastsi128_si256(S);
    for (int j = 0; j < 8; j++)
        u->sc[j] = scale_reg(S2, j, per16);
}

/* scales_put for unsigned scales (bytes < 128: Q2_K, Q4_K, Q5_K): vpshufb
 * zeroes the high byte of each int16 itself (control bytes 0x80), one
 * shuffle per register instead of a shuffle and a shift */
static inline void scales_put_u(struct urow *u, __m128i S, int per16)
{
    const __m256i S2 = _mm256_broadcastsi128_si256(S);
    for (int j = 0; j < 8; j++) {
        const __m256i ctrl = per16 ? _mm256_set_m128i(_mm_set1_epi16((short)(0x8000 | (2 * j + 1))),
                                                      _mm_set1_epi16((short)(0x8000 | (2 * j))))
                                   : _mm256_set1_epi16((short)(0x8000 | j));
        u->sc[j] = _mm256_shuffle_epi8(S2, ctrl);
    }
}

/* signed codes c into u: |c| and c for its sign */
static inline void put_signed(struct urow *u, int j, __m256i c)
{
    u->q[j] = _mm256_abs_epi8(c);
    u->s[j] = c;
}

/* the four 8-byte table entries a .. d as one register (a lowest) */
static inline __m256i q4(const uint64_t *a, const uint64_t *b, const uint64_t *c,
                         const uint64_t *d)
{
    const __m256i r = _mm256_blend_epi32(_mm256_set1_epi64x((long long)*a),
                                         _mm256_set1_epi64x((long long)*b), 0x0C);
    return _mm256_blend_epi32(_mm256_blend_epi32(r, _mm256_set1_epi64x((long long)*c), 0x30),
                              _mm256_set1_epi64x((long long)*d), 0xC0);
}

/* The +-1 bytes of four 7-bit sign fields f_k (IQ2_XXS, IQ3_XXS): v holds
 * field k in bits sh_k .. sh_k + 6 of qword k (any bits around it); byte e
 * of qword k is -1 if bit e of f_k is set (e < 7) or, for e = 7, if f_k
 * has an odd number of set bits (ksigns_iq2xs: the count of negatives is
 * even), else +1. vpsadbw counts the set bits of each qword's seven. */
static inline __m256i signs4(__m256i v, __m256i sh)
{
    const __m256i rep = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 8, 8, 8, 8, 8, 8, 8, 8,
                                         0, 0, 0, 0, 0, 0, 0, 0, 8, 8, 8, 8, 8, 8, 8, 8);
    /* byte 7 never matches: its and-mask is 0, its compare value 0xFF */
    const __m256i bit = _mm256_set1_epi64x((long long)0x0040201008040201ull);
    const __m256i hit = _mm256_set1_epi64x((long long)0xFF40201008040201ull);
    const __m256i f = _mm256_shuffle_epi8(_mm256_srlv_epi64(v, sh), rep);
    const __m256i m = _mm256_cmpeq_epi8(_mm256_and_si256(f, bit), hit);   /* bytes 0..6 */
    const __m256i par = _mm256_slli_epi64(_mm256_sad_epu8(m, _mm256_setzero_si256()), 63);
    return _mm256_or_si256(_mm256_or_si256(m, par), _mm256_set1_epi8(1));
}

/* The +-1 bytes of four whole sign bytes (IQ2_S, IQ3_S): byte e of qword
 * k is -1 if bit e of byte k of sg4 is set, else +1 */
static inline __m256i signs_bytes4(uint32_t sg4)
{
    const __m256i rep = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                         2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i f = _mm256_shuffle_epi8(_mm256_set1_epi32((int)sg4), rep);
    return _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(f, bit), bit), _mm256_set1_epi8(1));
}

/* Group j (32 elements) of an IQ2_XS, IQ2_S, IQ3_S or IQ1_M block: its
 * codes |c|, sign bytes s (sign(qx, s) = sign_i qx_i) and per-16 scales
 * sc, the integers of shoal_ggml_iblock_decode. unpack_row stores them in
 * a urow (several tokens); raw1_grid uses them at once for one token of
 * IQ2_XS, IQ2_S and IQ3_S without VBMI (IQ1_M's one token: raw1_iq1m). */
struct grid_grp {
    __m256i q, s, sc;
};

static inline __attribute__((always_inline)) struct grid_grp grid_group_of(enum shoal_ggml_type t,
                                                                           const uint8_t *blk,
                                                                           int j)
{
    struct grid_grp g;
    if (t == SHOAL_GGML_TYPE_IQ2_XS) {
        /* a u16 per 8: 9 index bits, 7 sign bits (signs4 finds field k at
         * bit 16 k + 9 of the group's 8 bytes); a 4-bit s per 16 */
        uint64_t g8;
        memcpy(&g8, blk + 2 + 8 * j, sizeof g8);
        g.q = q4(&GB.iq2xs[g8 & 511], &GB.iq2xs[(g8 >> 16) & 511], &GB.iq2xs[(g8 >> 32) & 511],
                 &GB.iq2xs[(g8 >> 48) & 511]);
        g.s = signs4(_mm256_set1_epi64x((long long)g8), _mm256_setr_epi64x(9, 25, 41, 57));
        g.sc = sc2(2 * (blk[66 + j] & 0x0F) + 1, 2 * (blk[66 + j] >> 4) + 1);
    } else if (t == SHOAL_GGML_TYPE_IQ2_S) {
        /* an index byte per 8 with 2 high bits in qh (4 a byte), a whole
         * sign byte per 8, a 4-bit s per 16 */
        const unsigned h = blk[66 + j];
        const uint8_t *qs = blk + 2 + 4 * j;
        g.q = q4(&GB.iq2s[qs[0] | (h & 3) << 8], &GB.iq2s[qs[1] | ((h >> 2) & 3) << 8],
                 &GB.iq2s[qs[2] | ((h >> 4) & 3) << 8], &GB.iq2s[qs[3] | (h >> 6) << 8]);
        g.s = signs_bytes4(le32(blk + 34 + 4 * j));
        g.sc = sc2(2 * (blk[74 + j] & 0x0F) + 1, 2 * (blk[74 + j] >> 4) + 1);
    } else if (t == SHOAL_GGML_TYPE_IQ3_S) {
        /* an index byte per 4 with its 9th bit in qh (8 a byte), a whole
         * sign byte per 8, a 4-bit s per 32 */
        const unsigned h = blk[66 + j];
        const uint8_t *qs = blk + 2 + 8 * j;
        g.q = _mm256_setr_epi32(
            (int)GB.iq3s[qs[0] | (h & 1) << 8], (int)GB.iq3s[qs[1] | ((h >> 1) & 1) << 8],
            (int)GB.iq3s[qs[2] | ((h >> 2) & 1) << 8], (int)GB.iq3s[qs[3] | ((h >> 3) & 1) << 8],
            (int)GB.iq3s[qs[4] | ((h >> 4) & 1) << 8], (int)GB.iq3s[qs[5] | ((h >> 5) & 1) << 8],
            (int)GB.iq3s[qs[6] | ((h >> 6) & 1) << 8], (int)GB.iq3s[qs[7] | (h >> 7) << 8]);
        g.s = signs_bytes4(le32(blk + 74 + 4 * j));
        g.sc = _mm256_set1_epi16((short)(2 * ((blk[106 + j / 2] >> (4 * (j % 2))) & 0x0F) + 1));
    } else {
        /* IQ1_M: c = 8 g + delta (delta = +-1 per 8, the top bit of its qh
         * nibble), taken whole; 3-bit scales per 16, four to a u16 of the
         * block's last 8 bytes (the 4 bits left of each: D) */
        const uint8_t *qs = blk + 4 * j, *qh = blk + 32 + 2 * j;
        const unsigned n0 = qh[0] & 0x0F, n1 = qh[0] >> 4, n2 = qh[1] & 0x0F, n3 = qh[1] >> 4;
        const long long p1 = 0x0101010101010101ll, m1 = -1ll;
        const __m256i c = _mm256_add_epi8(
            q4(&GB.iq1s[qs[0] | (n0 & 7) << 8], &GB.iq1s[qs[1] | (n1 & 7) << 8],
               &GB.iq1s[qs[2] | (n2 & 7) << 8], &GB.iq1s[qs[3] | (n3 & 7) << 8]),
            _mm256_set_epi64x(n3 & 8 ? m1 : p1, n2 & 8 ? m1 : p1, n1 & 8 ? m1 : p1,
                              n0 & 8 ? m1 : p1));
        const unsigned sc = ld16(blk + 48 + 2 * (j / 2)) >> (6 * (j % 2));   /* 16s 2j, 2j + 1 */
        g.q = _mm256_abs_epi8(c);
        g.s = c;
        g.sc = sc2((int)(2 * (sc & 7) + 1), (int)(2 * ((sc >> 3) & 7) + 1));
    }
    return g;
}

/* D of a block of those types */
static inline __attribute__((always_inline)) float grid_d(enum shoal_ggml_type t,
                                                          const uint8_t *blk)
{
    if (t == SHOAL_GGML_TYPE_IQ1_M) {   /* the f16 of the 4 scale u16s' top nibbles, / 8 */
        const uint16_t dbits = (uint16_t)((ld16(blk + 48) >> 12) | ((ld16(blk + 50) >> 8) & 0x00F0) |
                                          ((ld16(blk + 52) >> 4) & 0x0F00) | (ld16(blk + 54) & 0xF000));
        return _cvtsh_ss(dbits) * 0.125f;
    }
    return t == SHOAL_GGML_TYPE_IQ3_S ? f16_at(blk) : f16_at(blk) * 0.125f;
}

/* IQ4_XS's eight 6-bit scales less 32 (int8, bytes 0..7): sc[j] = nibble j
 * of bytes 4..7 (low first) | 2 bits j of the u16 at 2 above it, minus 32 */
static inline __m128i iq4xs_scales(const uint8_t *blk)
{
    const unsigned sh = ld16(blk + 2);
    uint64_t hb = 0;
    for (int j = 0; j < 8; j++)
        hb |= (uint64_t)((sh >> (2 * j)) & 3) << (8 * j + 4);
    const __m128i v = _mm_cvtsi32_si128((int)le32(blk + 4)), m4b = _mm_set1_epi8(0x0F);
    const __m128i nib = _mm_unpacklo_epi8(_mm_and_si128(v, m4b),
                                          _mm_and_si128(_mm_srli_epi16(v, 4), m4b));
    return _mm_sub_epi8(_mm_or_si128(nib, _mm_cvtsi64_si128((long long)hb)), _mm_set1_epi8(32));
}

/* Q3_K's 16 scales as int8: sc[k] = nibble k % 8 of bytes 0..7 (low for
 * k < 8), bits 2 (k / 4) of byte 8 + k % 4 above it, minus 32 */
static inline __attribute__((always_inline)) __m128i q3k_scales(const uint8_t *blk)
{
    const __m128i v = _mm_loadl_epi64((const __m128i *)(blk + 96)), m4b = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_unpacklo_epi64(_mm_and_si128(v, m4b),
                                          _mm_and_si128(_mm_srli_epi16(v, 4), m4b));
    const __m128i hi = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32((int)le32(blk + 104)),
                                                    _mm_setr_epi32(0, 2, 4, 6)),
                                     _mm_set1_epi8(3));
    return _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
}

/* One row's block blk of type t unpacked into *u: the same integers as
 * shoal_ggml_iblock_decode (Q6_K, Q3_K: offset; see above) and D, DMIN as
 * it computes them. */
static inline __attribute__((always_inline)) void unpack_row(enum shoal_ggml_type t,
                                                            const uint8_t *blk, struct urow *u)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    u->dmin = 0.0f;
    switch (t) {
    case SHOAL_GGML_TYPE_Q4_K:
    case SHOAL_GGML_TYPE_Q5_K: {
        const int q5 = t == SHOAL_GGML_TYPE_Q5_K;
        const uint8_t *qs = blk + (q5 ? 48 : 16);
        const __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : m4;
        for (int h = 0; h < 4; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
            u->q[2 * h] = _mm256_and_si256(v, m4);
            u->q[2 * h + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if (q5)
                for (int e = 0; e < 2; e++)
                    u->q[2 * h + e] = _mm256_or_si256(
                        u->q[2 * h + e], _mm256_slli_epi16(bits8(qh, 2 * h + e, 1), 4));
        }
        /* get_scale_min_k4 four at a time: sc, m of sub-blocks 0..3 are the
         * low 6 bits of bytes 0..3, 4..7; of 4..7, the nibbles of bytes
         * 8..11 with the top 2 bits of bytes 0..3, 4..7 above them */
        const uint32_t w0 = le32(blk + 4), w1 = le32(blk + 8), w2 = le32(blk + 12);
        const uint32_t sc03 = w0 & 0x3f3f3f3fu, m03 = w1 & 0x3f3f3f3fu;
        const uint32_t sc47 = (w2 & 0x0f0f0f0fu) | ((w0 >> 6) & 0x03030303u) << 4;
        const uint32_t m47 = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 6) & 0x03030303u) << 4;
        scales_put_u(u, _mm_setr_epi32((int)sc03, (int)sc47, 0, 0), 0);
        const __m128i dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
        u->corr16 = _mm256_cvtepu8_epi16(
            _mm_shuffle_epi8(_mm_setr_epi32((int)m03, (int)m47, 0, 0), dup));
        u->d = f16_at(blk);
        u->dmin = f16_at(blk + 2);
        break;
    }
    case SHOAL_GGML_TYPE_Q6_K: {
        const uint8_t *ql = blk, *qh = blk + 128;
        const uint8_t *sc = blk + 192;
        for (int h = 0; h < 2; h++) {
            const __m256i hv = _mm256_loadu_si256((const __m256i *)(qh + 32 * h));
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(ql + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 64 * h + 32));
            const __m256i lo[4] = {
                _mm256_and_si256(l0, m4), _mm256_and_si256(l1, m4),
                _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4)};
            for (int r = 0; r < 4; r++)
                u->q[4 * h + r] = _mm256_or_si256(lo[r], _mm256_slli_epi16(bits8(hv, 2 * r, 3), 4));
        }
        /* register 4h + r: the 16s 8h + 2r and 8h + 2r + 1 */
        const __m128i S = _mm_loadu_si128((const __m128i *)sc);
        scales_put(u, S, 1);
        u->corr16 = _mm256_cvtepi8_epi16(S);
        u->d = f16_at(blk + 208);
        break;
    }
    case SHOAL_GGML_TYPE_Q2_K:
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * h));
            for (int s = 0; s < 4; s++)
                u->q[4 * h + s] = bits8(v, 2 * s, 3);
        }
        {
            const __m128i v = _mm_loadu_si128((const __m128i *)blk), m4b = _mm_set1_epi8(0x0F);
            scales_put_u(u, _mm_and_si128(v, m4b), 1);
            u->corr16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), m4b));
        }
        u->d = f16_at(blk + 80);
        u->dmin = f16_at(blk + 82);
        break;
    case SHOAL_GGML_TYPE_Q3_K: {
        /* q | 4 * hmask bit (c + 4) */
        const __m256i hm = _mm256_loadu_si256((const __m256i *)blk);
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 32 + 32 * h));
            for (int s = 0; s < 4; s++)
                u->q[4 * h + s] = _mm256_or_si256(bits8(v, 2 * s, 3),
                                                  _mm256_slli_epi16(bits8(hm, 4 * h + s, 1), 2));
        }
        const __m128i S = q3k_scales(blk);
        scales_put(u, S, 1);
        u->corr16 = _mm256_cvtepi8_epi16(S);
        u->d = f16_at(blk + 108);
        break;
    }
    case SHOAL_GGML_TYPE_IQ4_XS:
        for (int j = 0; j < 8; j++)
            put_signed(u, j, lut32(blk + 8 + 16 * j, shoal_ggml_iq4nl_values));
        scales_put(u, iq4xs_scales(blk), 0);
        u->d = f16_at(blk);
        break;
    case SHOAL_GGML_TYPE_IQ2_XXS:
        for (int j = 0; j < 8; j++) {
            const uint8_t *g = blk + 2 + 8 * j;
            const uint32_t aux = le32(g + 4);
            u->q[j] = _mm256_set_epi64x((long long)GB.iq2xxs[g[3]], (long long)GB.iq2xxs[g[2]],
                                        (long long)GB.iq2xxs[g[1]], (long long)GB.iq2xxs[g[0]]);
            grid_signs(u, j, aux);
        }
        u->d = f16_at(blk) * 0.125f;
        break;
    case SHOAL_GGML_TYPE_IQ3_XXS:
        for (int j = 0; j < 8; j++) {
            const uint8_t *g = blk + 2 + 8 * j;
            const uint32_t aux = le32(blk + 66 + 4 * j);
            u->q[j] = _mm256_setr_epi32((int)GB.iq3xxs[g[0]], (int)GB.iq3xxs[g[1]],
                                        (int)GB.iq3xxs[g[2]], (int)GB.iq3xxs[g[3]],
                                        (int)GB.iq3xxs[g[4]], (int)GB.iq3xxs[g[5]],
                                        (int)GB.iq3xxs[g[6]], (int)GB.iq3xxs[g[7]]);
            grid_signs(u, j, aux);
        }
        u->d = f16_at(blk) * 0.25f;
        break;
    case SHOAL_GGML_TYPE_IQ1_S:
        for (int j = 0; j < 8; j++) {
            const uint8_t *qs = blk + 2 + 4 * j;
            const unsigned qh = ld16(blk + 34 + 2 * j);
            const __m256i g = _mm256_set_epi64x((long long)GB.iq1s[qs[3] | ((qh >> 9) & 7) << 8],
                                                (long long)GB.iq1s[qs[2] | ((qh >> 6) & 7) << 8],
                                                (long long)GB.iq1s[qs[1] | ((qh >> 3) & 7) << 8],
                                                (long long)GB.iq1s[qs[0] | (qh & 7) << 8]);
            put_signed(u, j, _mm256_add_epi8(g, _mm256_set1_epi8(qh & 0x8000 ? -1 : 1)));
            u->sc[j] = _mm256_set1_epi16((short)(2 * ((qh >> 12) & 7) + 1));
        }
        u->d = f16_at(blk) * 0.125f;
        break;
    case SHOAL_GGML_TYPE_IQ4_NL:
        put_signed(u, 0, lut32(blk + 2, shoal_ggml_iq4nl_values));
        u->sc[0] = _mm256_set1_epi16(1);
        u->d = f16_at(blk);
        break;
    case SHOAL_GGML_TYPE_MXFP4: {
        put_signed(u, 0, lut32(blk + 1, shoal_ggml_mxfp4_values));
        u->sc[0] = _mm256_set1_epi16(1);
        /* 2^(e - 128) from its bits, as ggml_e8m0_to_fp32_half builds it */
        const unsigned e = blk[0];
        const uint32_t bits = e < 2 ? UINT32_C(0x00200000) << e : (uint32_t)(e - 1) << 23;
        memcpy(&u->d, &bits, sizeof u->d);
        break;
    }
    case SHOAL_GGML_TYPE_Q4_0:
        put_signed(u, 0, _mm256_sub_epi8(nibbles32(blk + 2), _mm256_set1_epi8(8)));
        u->sc[0] = _mm256_set1_epi16(1);
        u->d = f16_at(blk);
        break;
    case SHOAL_GGML_TYPE_Q5_0:
        put_signed(u, 0, _mm256_sub_epi8(_mm256_or_si256(nibbles32(blk + 6), bits16(le32(blk + 2))),
                                         _mm256_set1_epi8(16)));
        u->sc[0] = _mm256_set1_epi16(1);
        u->d = f16_at(blk);
        break;
    case SHOAL_GGML_TYPE_Q4_1:
    case SHOAL_GGML_TYPE_Q5_1:   /* w = d q + m: DMIN = -m against msum = sum qx */
        u->q[0] = t == SHOAL_GGML_TYPE_Q4_1
                      ? nibbles32(blk + 4)
                      : _mm256_or_si256(nibbles32(blk + 8), bits16(le32(blk + 4)));
        u->sc[0] = _mm256_set1_epi16(1);
        u->d = f16_at(blk);
        u->dmin = -f16_at(blk + 2);
        break;
    case SHOAL_GGML_TYPE_IQ2_XS:
    case SHOAL_GGML_TYPE_IQ2_S:
    case SHOAL_GGML_TYPE_IQ3_S:
    case SHOAL_GGML_TYPE_IQ1_M:
        for (int j = 0; j < 8; j++) {
            const struct grid_grp g = grid_group_of(t, blk, j);
            u->q[j] = g.q;
            u->s[j] = g.s;
            u->sc[j] = g.sc;
        }
        u->d = grid_d(t, blk);
        break;
    default:
        break;
    }
}

/* row u's raw integer sum against the block's qx registers xv: int32 lanes
 * to be summed across (hsum_rows8) */
static inline __attribute__((always_inline)) __m256i urow_raw(enum shoal_ggml_type t,
                                                             const struct urow *u,
                                                             const __m256i *xv)
{
    __m256i acc = _mm256_setzero_si256();
    for (int j = 0; j < t_nreg(t); j++) {
        const __m256i x = t_signed(t) ? _mm256_sign_epi8(xv[j], u->s[j]) : xv[j];
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u->q[j], x), u->sc[j]));
    }
    return acc;
}

/* lanes rows: the correction sum c of ggml_dot.h's msum (KIND_MIN*) or
 * sum_k sc[k] * bsum[k] (KIND_OFF) for one token, bs its bsum of the
 * block; m[i] = row i's vpmaddwd of corr16 with bs (blocks of 256) */
static inline __attribute__((always_inline)) __m256i corr_sum(enum shoal_ggml_type t,
                                                             const __m256i m[8],
                                                             const int16_t *bs)
{
    if (t_nreg(t) == 1)   /* Q4_1, Q5_1: m = 1 for both 16s, every row */
        return _mm256_set1_epi32(bs[0] + bs[1]);
    return hsum_rows8(m);
}

/* acc + the block's term (ggml_dot.h's canonical step) for one token: raw
 * the rows' raw sums, c their corr_sum (KIND_NONE: unused), d and dmin the
 * rows' D and DMIN, dx1 the token's scale */
static inline __attribute__((always_inline)) __m256 block_term(enum shoal_ggml_type t,
                                                              __m256 acc, __m256i raw,
                                                              __m256i c, __m256 d,
                                                              __m256 dmin, float dx1)
{
    const __m256 dx = _mm256_set1_ps(dx1);
    const enum kind kind = t_kind(t);
    if (kind == KIND_NONE)
        return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(raw)));
    if (kind == KIND_OFF) {
        const __m256i isum = _mm256_sub_epi32(raw, _mm256_sll_epi32(c, _mm_cvtsi32_si128(t_offshift(t))));
        return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(isum)));
    }
    const __m256 ta = _mm256_mul_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(raw));
    const __m256 tb = _mm256_mul_ps(_mm256_mul_ps(dmin, dx), _mm256_cvtepi32_ps(c));
    return _mm256_add_ps(acc, _mm256_sub_ps(ta, tb));
}

/* ---- one token: a row's block straight to its raw sum ---------------------
 *
 * The decode matvec of the grid types is bound by the core, not by RAM
 * (docs/BENCHMARKS.md "GGUF kernels"): every 8 weights are a codebook
 * look-up, and IQ2_XXS / IQ3_XXS add a 7-bit sign field. These paths sum a
 * row's block against the token's qx in registers, without the urow
 * detour: the sign bytes are computed (signs4: no sign table, no scalar
 * index arithmetic), the scales come from the same broadcast u32 (one
 * vpshufb), and IQ1_S's delta is taken out of the per-32 loop (raw1_iq1s).
 * On Zen 3 the vector ports are the limit: vpmaddubsw, vpmaddwd and
 * vpsadbw share one pair of pipes, vpshufb and the shifts another. */

#if !SHOAL_GGML_VNNI
/* One group of 32 of IQ2_XXS or IQ3_XXS: sum_i |c_i| (sign_i qx_i) times
 * 2 s + 1, as int32 lanes. q: the 32 |c| bytes; v: the group's u32 of sign
 * fields and scale (its bits 27..31 are 2 s + a sign bit) in the 16-bit
 * word that wsc's control bytes pick (both bytes, every word), its four
 * sign fields where signs4 finds them with shifts sh. */
static inline __m256i grid_group(__m256i q, __m256i v, __m256i sh, __m256i wsc, const int8_t *x)
{
    /* 2 s + 1 in every int16: bits 11..15 of the word are 2 s + a sign bit, or 1 */
    const __m256i sc = _mm256_shuffle_epi8(
        _mm256_or_si256(_mm256_srli_epi16(v, 11), _mm256_set1_epi16(1)), wsc);
    const __m256i xv = _mm256_loadu_si256((const __m256i *)x);
    const __m256i pr = _mm256_maddubs_epi16(q, _mm256_sign_epi8(xv, signs4(v, sh)));
    return _mm256_madd_epi16(pr, sc);
}
#endif

#if !SHOAL_GGML_VNNI
/* IQ2_XXS: raw = sum_j (2 s_j + 1) * sum_{i in j} |c_i| * (sign_i qx_i) */
static inline __attribute__((always_inline)) __m256i raw1_iq2xxs(const uint8_t *blk,
                                                                const int8_t *xq)
{
    const __m256i sh = _mm256_setr_epi64x(32, 39, 46, 53);
    const __m256i w3 = _mm256_set1_epi64x(0x0706070607060706ll);   /* word 3, every word */
    __m256i acc = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) {
        const uint8_t *g = blk + 2 + 8 * j;
        uint64_t g8;
        memcpy(&g8, g, sizeof g8);
        const __m256i v = _mm256_set1_epi64x((long long)g8);
        const __m256i q = q4(&GB.iq2xxs[g[0]], &GB.iq2xxs[g[1]], &GB.iq2xxs[g[2]],
                             &GB.iq2xxs[g[3]]);
        acc = _mm256_add_epi32(acc, grid_group(q, v, sh, w3, xq + 32 * j));
    }
    return acc;
}
#endif

#if SHOAL_GGML_VNNI
/* IQ2_XXS with AVX-512 VBMI, the whole block in registers. Its 64 bytes of
 * qs are one load; the 32 grid indices (bytes 8j .. 8j + 3 of group j)
 * become words, looked up in the 2-bit codes of the codebook
 * (shoal_ggml_iq2xxs_codes: 256 words, four vpermt2w tables of 64 picked
 * by index bits 6 and 7), laid out so that qword L holds in word z the
 * code of register z's lane L; one vpmultishiftqb per register then puts
 * each bit pair in its byte and a vpermb of a table repeating 8, 25, 43
 * makes |c|. The 7-bit sign fields of every group come out of qs by one
 * vpmultishiftqb, in order (vpermb), and become sign bytes by one
 * vpermt2b of ksigns (its 128 bytes: a field indexes it whole); through
 * memory they are the byte masks that negate qx where a sign is set. Then
 * vpdpbusd sums |c| against it, two groups a register, times each group's
 * 2 s + 1 (vpmulld). The same integers as raw1_iq2xxs. Zen 4, kernel_l2
 * in L2: 15.2 -> 11.9 ns a row-block (12.6 with the masks and scales
 * extracted from registers, which GCC does unless told not to). */
/* byte 4L + z: qs byte of register z's lane L (group 2z + L / 4, its
 * sub-group L % 4); bytes 32 .. 63 unused (32 words) */
#define IX(L) 8 * ((L) / 4) + (L) % 4, 16 + 8 * ((L) / 4) + (L) % 4, \
        32 + 8 * ((L) / 4) + (L) % 4, 48 + 8 * ((L) / 4) + (L) % 4
static const uint8_t iq2x_idx[64] __attribute__((aligned(64))) = {
    IX(0), IX(1), IX(2), IX(3), IX(4), IX(5), IX(6), IX(7)};
#undef IX
/* sign fields in order: byte 4j + k = byte 8j + k */
#define SX(j) 8 * (j), 8 * (j) + 1, 8 * (j) + 2, 8 * (j) + 3
static const uint8_t iq2x_sidx[64] __attribute__((aligned(64))) = {
    SX(0), SX(1), SX(2), SX(3), SX(4), SX(5), SX(6), SX(7)};
#undef SX
#define V2R 8, 25, 43, 0
static const uint8_t iq2x_vals[64] __attribute__((aligned(64))) = {
    V2R, V2R, V2R, V2R, V2R, V2R, V2R, V2R, V2R, V2R, V2R, V2R, V2R, V2R, V2R, V2R};
#undef V2R

/* the 16-bit codes of the 32 word indices gi (0 .. 64 n - 1) in a table C
 * of 64 n words (n = 4, 8 or 16): vpermt2w tables of 64, picked by index
 * bits 6, 7 (, 8, 9) */
static inline __attribute__((always_inline)) __m512i lut_w(const uint16_t *C, int n, __m512i gi)
{
    __m512i c[16];
    for (int k = 0; k < n; k++)
        c[k] = _mm512_permutex2var_epi16(_mm512_loadu_si512((const void *)(C + 64 * k)), gi,
                                         _mm512_loadu_si512((const void *)(C + 64 * k + 32)));
    for (int bit = 6, m = n; m > 1; bit++, m /= 2) {
        const __mmask32 b = _mm512_test_epi16_mask(gi, _mm512_set1_epi16((short)(1 << bit)));
        for (int k = 0; k < m / 2; k++)
            c[k] = _mm512_mask_blend_epi16(b, c[2 * k], c[2 * k + 1]);
    }
    return c[0];
}

/* sign bytes from 7-bit fields f (bit 7 ignored): ksigns through vpermt2b */
static inline __attribute__((always_inline)) __m512i ksign_bytes(__m512i f)
{
    return _mm512_permutex2var_epi8(_mm512_loadu_si512((const void *)GB.ksign), f,
                                    _mm512_loadu_si512((const void *)(GB.ksign + 64)));
}

/* register z's scales when each 32 has one: 2 s + 1 of its two groups,
 * sc[st * 2z] and sc[st * (2z + 1)], read back from memory */
static inline __attribute__((always_inline)) __m512i group_scales(const int32_t *sc, int st,
                                                                 int z)
{
    return _mm512_mask_blend_epi32(0xFF00, _mm512_set1_epi32(sc[st * 2 * z]),
                                   _mm512_set1_epi32(sc[st * (2 * z + 1)]));
}

/* sum over registers z of 64 elements of |c| (g[z]) against the token's
 * bytes negated under sign mask sb[z], times its scales s[z] (int32
 * lanes), as int32 lanes. The masks and scales come through memory: mask
 * loads and broadcast loads use the load pipes, where extracting them from
 * registers (what GCC does unless told not to) took the shuffle pipes. */
static inline __attribute__((always_inline)) __m256i grid_sum512(const __m512i g[4],
                                                                const uint64_t sb[4],
                                                                const __m512i s[4],
                                                                const int8_t *xq)
{
    const __m512i z0 = _mm512_setzero_si512();
    __m512i acc = z0;
    for (int z = 0; z < 4; z++) {
        const __m512i x = _mm512_loadu_si512((const void *)(xq + 64 * z));
        const __m512i xs = _mm512_mask_sub_epi8(x, _load_mask64((__mmask64 *)&sb[z]), z0, x);
        const __m512i d = _mm512_dpbusd_epi32(z0, g[z], xs);
        acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(d, s[z]));
    }
    return _mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1));
}

/* |c| of register z from 2-bit codes laid out word z of qword L = lane
 * L's: byte b of each qword is bits 16z + 2b .., word z's pair b, through
 * a table repeating 8, 25, 43 */
static inline __attribute__((always_inline)) __m512i iq2_bytes(__m512i codes, int z)
{
    return _mm512_permutexvar_epi8(
        _mm512_multishift_epi64_epi8(
            _mm512_set1_epi64(0x0E0C0A0806040200ll + 0x1010101010101010ll * z), codes),
        _mm512_load_si512((const void *)iq2x_vals));
}

static inline __attribute__((always_inline)) __m256i raw1_iq2xxs_512(const uint8_t *blk,
                                                                    const int8_t *xq)
{
    const __m512i Q = _mm512_loadu_si512((const void *)(blk + 2));
    const __m512i gi = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(
        _mm512_permutexvar_epi8(_mm512_load_si512((const void *)iq2x_idx), Q)));
    const __m512i codes = lut_w(shoal_ggml_iq2xxs_codes, 4, gi);
    /* sign bytes: byte 4j + k of sb (fields at bits 32, 39, 46, 53 of qword
     * j); qword z of it is register z's mask */
    const __m512i sf = _mm512_permutexvar_epi8(
        _mm512_load_si512((const void *)iq2x_sidx),
        _mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x352E2720), Q));
    uint64_t sb[8];
    _mm512_storeu_si512((void *)sb, ksign_bytes(sf));
    /* 2 s + 1 of group j in dword 2j */
    int32_t sc[16];
    _mm512_storeu_si512((void *)sc, _mm512_or_si512(_mm512_slli_epi64(_mm512_srli_epi64(Q, 60), 1),
                                                    _mm512_set1_epi64(1)));
    __asm__("" : : "r"(sb), "r"(sc) : "memory");
    __m512i g[4], sv[4];
    for (int z = 0; z < 4; z++) {
        g[z] = iq2_bytes(codes, z);
        sv[z] = group_scales(sc, 2, z);
    }
    return grid_sum512(g, sb, sv, xq);
}

/* IQ2_XS as raw1_iq2xxs_512: 32 u16 of a 9-bit index and a 7-bit sign field
 * each (sub-group g of 8), looked up in 512 codes (eight vpermt2w tables);
 * word 4L + z of the look-up is sub-group 8z + L's, the sign bytes in
 * order, and a 4-bit scale per 16 (2 s + 1): register z's lanes 4m ..
 * 4m + 3 take the 16 4z + m's (vpermd). */
#define XW(L) (L), 8 + (L), 16 + (L), 24 + (L)
static const int16_t iq2xs_w[32] __attribute__((aligned(64))) = {
    XW(0), XW(1), XW(2), XW(3), XW(4), XW(5), XW(6), XW(7)};
#undef XW

/* 2 s + 1 of the 16 4-bit scales at sc (one per 16, low nibble first), as
 * int32 lanes 0 .. 15 */
static inline __attribute__((always_inline)) __m512i iq2_scales16(const uint8_t *sc)
{
    const __m128i v = _mm_loadl_epi64((const __m128i *)sc), m4b = _mm_set1_epi8(0x0F);
    return _mm512_or_si512(
        _mm512_slli_epi32(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(
                              _mm_and_si128(v, m4b), _mm_and_si128(_mm_srli_epi16(v, 4), m4b))),
                          1),
        _mm512_set1_epi32(1));
}

/* register z's scales with one per 16: lanes 4m .. 4m + 3 the 16 4z + m's */
static inline __attribute__((always_inline)) __m512i scales16_of(__m512i s16, int z)
{
    return _mm512_permutexvar_epi32(
        _mm512_add_epi32(_mm512_set1_epi32(4 * z),
                         _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)),
        s16);
}

/* word indices whose low byte is byte lo[2w] of Q (a control byte with bit
 * 7 set gives 0) and whose high bits (hmask) come from the u64 at qh, its
 * bits from hi[2w + 1] on (vpmultishiftqb) */
static inline __attribute__((always_inline)) __m512i split_index(__m512i Q, const uint8_t *qh,
                                                                __m512i lo, __m512i hi,
                                                                short hmask)
{
    const __m512i h = _mm512_set1_epi64((long long)((uint64_t)le32(qh) |
                                                    (uint64_t)le32(qh + 4) << 32));
    return _mm512_or_si512(_mm512_maskz_permutexvar_epi8(~_mm512_movepi8_mask(lo), lo, Q),
                           _mm512_and_si512(_mm512_multishift_epi64_epi8(hi, h),
                                            _mm512_set1_epi16(hmask)));
}

static inline __attribute__((always_inline)) __m256i raw1_iq2xs_512(const uint8_t *blk,
                                                                   const int8_t *xq)
{
    const __m512i Q = _mm512_loadu_si512((const void *)(blk + 2));
    const __m512i codes = lut_w(shoal_ggml_iq2xs_codes, 8,
                                _mm512_and_si512(_mm512_permutexvar_epi16(
                                                     _mm512_load_si512((const void *)iq2xs_w), Q),
                                                 _mm512_set1_epi16(511)));
    uint64_t sb[8];
    _mm512_storeu_si512((void *)sb, ksign_bytes(_mm512_zextsi256_si512(
                                        _mm512_cvtepi16_epi8(_mm512_srli_epi16(Q, 9)))));
    __asm__("" : : "r"(sb) : "memory");
    const __m512i s16 = iq2_scales16(blk + 66);
    __m512i g[4], sv[4];
    for (int z = 0; z < 4; z++) {
        g[z] = iq2_bytes(codes, z);
        sv[z] = scales16_of(s16, z);
    }
    return grid_sum512(g, sb, sv, xq);
}

/* IQ2_S as raw1_iq2xs_512: sub-group g's 10-bit index is qs[g] with bits
 * 2g, 2g + 1 of the u64 qh above it (vpmultishiftqb into each word's high
 * byte), 1024 codes; its sign byte is whole, in order after the indices
 * (register z's mask: the u64 at 32 + 8z of qs); scales as IQ2_XS's. */
#define SW(L) (L), 0x80, 8 + (L), 0x80, 16 + (L), 0x80, 24 + (L), 0x80
static const uint8_t iq2s_lo[64] __attribute__((aligned(64))) = {
    SW(0), SW(1), SW(2), SW(3), SW(4), SW(5), SW(6), SW(7)};
#undef SW
#define SH(L) 0, 2 * (L), 0, 2 * (8 + (L)), 0, 2 * (16 + (L)), 0, 2 * (24 + (L))
static const uint8_t iq2s_hi[64] __attribute__((aligned(64))) = {
    SH(0), SH(1), SH(2), SH(3), SH(4), SH(5), SH(6), SH(7)};
#undef SH

static inline __attribute__((always_inline)) __m256i raw1_iq2s_512(const uint8_t *blk,
                                                                  const int8_t *xq)
{
    const __m512i codes = lut_w(
        shoal_ggml_iq2s_codes, 16,
        split_index(_mm512_loadu_si512((const void *)(blk + 2)), blk + 66,
                    _mm512_load_si512((const void *)iq2s_lo),
                    _mm512_load_si512((const void *)iq2s_hi), 0x300));
    uint64_t sb[4];
    memcpy(sb, blk + 34, sizeof sb);
    const __m512i s16 = iq2_scales16(blk + 74);
    __m512i g[4], sv[4];
    for (int z = 0; z < 4; z++) {
        g[z] = iq2_bytes(codes, z);
        sv[z] = scales16_of(s16, z);
    }
    return grid_sum512(g, sb, sv, xq);
}

/* IQ3_XXS as raw1_iq2xxs_512: element e's grid index is qs[e / 4] and its
 * code 12 bits (four 3-bit values), so register z's qword L takes the two
 * codes of qs[16z + 2L ..]: two look-ups of 32 words, A for registers 0
 * and 1 and B for 2 and 3, word 4L + 2z' + h the code of qs[16z' + 2L + h]
 * (+ 32 in B); vpmultishiftqb picks bits 32z' + 16h + 3i, vpermb a table
 * repeating 4 .. 62 makes |c|. The signs and scale of group j are the u32
 * after the indices, fields at bits 0, 7, 14, 21 and 2 s + 1 on top. */
#define I3(zq, L) (uint8_t)(16 * (zq) + 2 * (L)), 0x80, (uint8_t)(16 * (zq) + 2 * (L) + 1), 0x80
#define I3L(L, B) I3(2 * (B), L), I3(2 * (B) + 1, L)
static const uint8_t iq3x_idx[2][64] __attribute__((aligned(64))) = {
    {I3L(0, 0), I3L(1, 0), I3L(2, 0), I3L(3, 0), I3L(4, 0), I3L(5, 0), I3L(6, 0), I3L(7, 0)},
    {I3L(0, 1), I3L(1, 1), I3L(2, 1), I3L(3, 1), I3L(4, 1), I3L(5, 1), I3L(6, 1), I3L(7, 1)},
};
#undef I3L
#undef I3
#define V3R 4, 12, 20, 28, 36, 44, 52, 62
static const uint8_t iq3x_vals[64] __attribute__((aligned(64))) = {
    V3R, V3R, V3R, V3R, V3R, V3R, V3R, V3R};
#undef V3R

/* |c| of register z from 12-bit codes laid out as raw1_iq3xxs_512's two
 * look-ups (codes[z / 2], words 2 (z % 2) and 2 (z % 2) + 1 of qword L:
 * lane L's two codes): byte b is bits 32 (z % 2) + 16 (b / 4) + 3 (b % 4)
 * .., through vals, a table repeating the type's eight values */
static inline __attribute__((always_inline)) __m512i iq3_bytes(const __m512i codes[2], int z,
                                                              const uint8_t *vals)
{
    return _mm512_permutexvar_epi8(
        _mm512_multishift_epi64_epi8(
            _mm512_set1_epi64(0x1916131009060300ll + 0x2020202020202020ll * (z & 1)),
            codes[z >> 1]),
        _mm512_load_si512((const void *)vals));
}

static inline __attribute__((always_inline)) __m256i raw1_iq3xxs_512(const uint8_t *blk,
                                                                    const int8_t *xq)
{
    const __m512i Q = _mm512_loadu_si512((const void *)(blk + 2));
    /* words: a control byte 0x80 zeroes its byte (vpermb's zero mask) */
    __m512i codes[2];
    for (int h = 0; h < 2; h++) {
        const __m512i ix = _mm512_load_si512((const void *)iq3x_idx[h]);
        codes[h] = lut_w(shoal_ggml_iq3xxs_codes, 4,
                           _mm512_maskz_permutexvar_epi8(
                               ~_mm512_movepi8_mask(ix), ix, Q));
    }
    const __m256i su = _mm256_loadu_si256((const __m256i *)(blk + 66));
    uint64_t sb[8];
    _mm512_storeu_si512((void *)sb,
                        ksign_bytes(_mm512_multishift_epi64_epi8(
                            _mm512_set1_epi64(0x352E2720150E0700ll), _mm512_zextsi256_si512(su))));
    int32_t sc[8];
    _mm256_storeu_si256((__m256i *)sc, _mm256_or_si256(_mm256_slli_epi32(_mm256_srli_epi32(su, 28), 1),
                                                      _mm256_set1_epi32(1)));
    __m512i g[4], sv[4];
    for (int z = 0; z < 4; z++) {
        g[z] = iq3_bytes(codes, z, iq3x_vals);
        sv[z] = group_scales(sc, 1, z);
    }
    return grid_sum512(g, sb, sv, xq);
}

/* IQ3_S as raw1_iq3xxs_512 (the same index layout): 9-bit indices, the
 * 9th bit k of the u64 qh put in each word's high byte by vpmultishiftqb
 * (control byte 2w + 1 = k, the look-up's qs byte shifted up); 512 codes;
 * whole sign bytes in order, so register z's mask is the u64 of signs at
 * 8z; a 4-bit scale per 32 (2 s + 1), d without a factor. */
#define V3S 1, 3, 5, 7, 9, 11, 13, 15
static const uint8_t iq3s_vals[64] __attribute__((aligned(64))) = {
    V3S, V3S, V3S, V3S, V3S, V3S, V3S, V3S};
#undef V3S

static inline __attribute__((always_inline)) __m256i raw1_iq3s_512(const uint8_t *blk,
                                                                  const int8_t *xq)
{
    const __m512i Q = _mm512_loadu_si512((const void *)(blk + 2));
    __m512i codes[2];
    for (int h = 0; h < 2; h++) {
        const __m512i ix = _mm512_load_si512((const void *)iq3x_idx[h]);
        codes[h] = lut_w(shoal_ggml_iq3s_codes, 8,
                         split_index(Q, blk + 66, ix, _mm512_slli_epi16(ix, 8), 0x100));
    }
    const __m128i v = _mm_cvtsi32_si128((int)le32(blk + 106)), m4b = _mm_set1_epi8(0x0F);
    int32_t sc[8];
    _mm256_storeu_si256((__m256i *)sc,
                        _mm256_or_si256(_mm256_slli_epi32(_mm256_cvtepu8_epi32(_mm_unpacklo_epi8(
                                                              _mm_and_si128(v, m4b),
                                                              _mm_and_si128(_mm_srli_epi16(v, 4), m4b))),
                                                          1),
                                        _mm256_set1_epi32(1)));
    __asm__("" : : "r"(sc) : "memory");
    uint64_t sb[4];
    memcpy(sb, blk + 74, sizeof sb);
    __m512i g[4], sv[4];
    for (int z = 0; z < 4; z++) {
        g[z] = iq3_bytes(codes, z, iq3s_vals);
        sv[z] = group_scales(sc, 1, z);
    }
    return grid_sum512(g, sb, sv, xq);
}
#endif

#if !SHOAL_GGML_VNNI
/* IQ3_XXS: as IQ2_XXS with 4-byte grid entries, the signs and scale in a
 * u32 of their own per 32 (after the 64 index bytes) */
static inline __attribute__((always_inline)) __m256i raw1_iq3xxs(const uint8_t *blk,
                                                                const int8_t *xq)
{
    const __m256i sh = _mm256_setr_epi64x(0, 7, 14, 21);
    const __m256i w1 = _mm256_set1_epi32(0x03020302);   /* word 1, every word */
    __m256i acc = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) {
        const uint8_t *g = blk + 2 + 8 * j;
        const __m256i v = _mm256_set1_epi32((int)le32(blk + 66 + 4 * j));
        const __m256i q = _mm256_setr_epi32((int)GB.iq3xxs[g[0]], (int)GB.iq3xxs[g[1]],
                                            (int)GB.iq3xxs[g[2]], (int)GB.iq3xxs[g[3]],
                                            (int)GB.iq3xxs[g[4]], (int)GB.iq3xxs[g[5]],
                                            (int)GB.iq3xxs[g[6]], (int)GB.iq3xxs[g[7]]);
        acc = _mm256_add_epi32(acc, grid_group(q, v, sh, w1, xq + 32 * j));
    }
    return acc;
}
#endif

/* sum_i |c_i| (sign_i qx_i) of a group of 32 times its per-16 scales sc */
static inline __m256i grid_group_sc(__m256i q, __m256i sg, __m256i sc, const int8_t *x)
{
    const __m256i xv = _mm256_loadu_si256((const __m256i *)x);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(q, _mm256_sign_epi8(xv, sg)), sc);
}

#if !SHOAL_GGML_VNNI
/* IQ2_XS, IQ2_S and IQ3_S without VBMI: raw = sum over groups of
 * grid_group_sc */
static inline __attribute__((always_inline)) __m256i raw1_grid(enum shoal_ggml_type t,
                                                              const uint8_t *blk,
                                                              const int8_t *xq)
{
    __m256i acc = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) {
        const struct grid_grp g = grid_group_of(t, blk, j);
        acc = _mm256_add_epi32(acc, grid_group_sc(g.q, g.s, g.sc, xq + 32 * j));
    }
    return acc;
}
#endif

/* IQ1_S: c = 8 g + delta (g in -1..1, delta = +-1 per 32), so
 *   raw = sum_j (2 s_j + 1) * (8 * sum_{i in j} g_i qx_i + delta_j * X_j)
 * with X_j the sum of the 32 qx (the token's bsum pairs; an exact integer
 * regrouping). sum g qx is vpsignb of qx by the codebook's 8 g bytes (sign
 * and zero) summed by vpmaddubsw against ones; the delta part is one
 * vpmaddwd per row block. xs: the token's X_j as int16 in the low half of
 * int32 lane j (high half 0), iq1s_xs. */
static inline __attribute__((always_inline)) __m256i raw1_iq1s(const uint8_t *blk,
                                                              const int8_t *xq, __m256i xs)
{
    const __m256i ones = _mm256_set1_epi8(1);
    /* 8 (2 s_j + 1) as int16 j of S, both halves */
    const __m128i qh = _mm_loadu_si128((const __m128i *)(blk + 34));
    const __m128i sc8 = _mm_slli_epi16(
        _mm_or_si128(_mm_and_si128(_mm_srli_epi16(qh, 11), _mm_set1_epi16(0x0E)), _mm_set1_epi16(1)), 3);
    const __m256i S = _mm256_broadcastsi128_si256(sc8);
    __m256i acc = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) {
        const uint8_t *qs = blk + 2 + 4 * j;
        const unsigned h = ld16(blk + 34 + 2 * j);
        const __m256i g = q4(&GB.iq1s[qs[0] | (h & 7) << 8], &GB.iq1s[qs[1] | ((h >> 3) & 7) << 8],
                             &GB.iq1s[qs[2] | ((h >> 6) & 7) << 8], &GB.iq1s[qs[3] | ((h >> 9) & 7) << 8]);
        const __m256i x = _mm256_loadu_si256((const __m256i *)(xq + 32 * j));
        const __m256i pr = _mm256_maddubs_epi16(ones, _mm256_sign_epi8(x, g));
        const __m256i sc = _mm256_shuffle_epi8(S, _mm256_set1_epi16((short)(0x0100 * (2 * j + 1) + 2 * j)));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pr, sc));
    }
    /* delta_j (2 s_j + 1) X_j: the scale with qh's bit 15 as its sign */
    const __m256i h32 = _mm256_cvtepu16_epi32(qh);
    const __m256i sc = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(h32, 11), _mm256_set1_epi32(0x0E)),
                                       _mm256_set1_epi32(1));
    const __m256i neg = _mm256_cmpgt_epi32(h32, _mm256_set1_epi32(0x7FFF));
    const __m256i ssc = _mm256_sub_epi32(_mm256_xor_si256(sc, neg), neg);
    return _mm256_add_epi32(acc, _mm256_madd_epi16(ssc, xs));
}

/* IQ1_M: c = 8 g + delta (delta = +-1 per 8, the top bit of its qh
 * nibble), raw = sum over the 16 halves-of-32 of sc_m sum c qx, as
 * grid_group_of's IQ1_M group but with the block's 32 codebook indices,
 * its deltas and its 16 scales built a block at a time in vectors (the
 * per-group scalar shifts, masks and branches were most of its time):
 * index k = qs[k] | (nibble k of qh & 7) << 8, nibble k the low (k even)
 * or high half of qh[k / 2]; scale m = bits 3 (m % 4) of the u16 m / 4 of
 * the last 8 bytes, sc = 2 s + 1 (vpmullw by 2^(13 - 3r), then >> 13). */
static inline __attribute__((always_inline)) __m256i raw1_iq1m(const uint8_t *blk,
                                                              const int8_t *xq)
{
    const __m128i m4 = _mm_set1_epi8(0x0F), m7 = _mm_set1_epi8(7);
    const __m128i qh = _mm_loadu_si128((const __m128i *)(blk + 32));
    const __m128i lo = _mm_and_si128(qh, m4), hi = _mm_and_si128(_mm_srli_epi16(qh, 4), m4);
    const __m128i na = _mm_unpacklo_epi8(lo, hi), nb = _mm_unpackhi_epi8(lo, hi); /* n_0..31 */
    const __m128i qa = _mm_loadu_si128((const __m128i *)blk);
    const __m128i qb = _mm_loadu_si128((const __m128i *)(blk + 16));
    uint16_t idx[32];
    _mm_storeu_si128((__m128i *)idx, _mm_unpacklo_epi8(qa, _mm_and_si128(na, m7)));
    _mm_storeu_si128((__m128i *)(idx + 8), _mm_unpackhi_epi8(qa, _mm_and_si128(na, m7)));
    _mm_storeu_si128((__m128i *)(idx + 16), _mm_unpacklo_epi8(qb, _mm_and_si128(nb, m7)));
    _mm_storeu_si128((__m128i *)(idx + 24), _mm_unpackhi_epi8(qb, _mm_and_si128(nb, m7)));
    /* delta bytes 1 - 2 (bit 3 of n_k): deltas 0..15, then 16..31, both lanes */
    const __m128i one = _mm_set1_epi8(1), two = _mm_set1_epi8(2);
    const __m256i dlo = _mm256_broadcastsi128_si256(
        _mm_sub_epi8(one, _mm_and_si128(_mm_srli_epi16(na, 2), two)));
    const __m256i dhi = _mm256_broadcastsi128_si256(
        _mm_sub_epi8(one, _mm_and_si128(_mm_srli_epi16(nb, 2), two)));
    /* scales 2 s_m + 1 as int16: 0..7, then 8..15, both lanes */
    const __m128i w = _mm_loadl_epi64((const __m128i *)(blk + 48));
    const __m128i mul = _mm_setr_epi16(1 << 13, 1 << 10, 1 << 7, 1 << 4, 1 << 13, 1 << 10, 1 << 7,
                                       1 << 4);
    __m256i sv[2];   /* scales 0..7 (u16s 0, 1), then 8..15 (u16s 2, 3) */
    for (int h = 0; h < 2; h++) {
        const char u = (char)(4 * h);
        const __m128i rep = _mm_setr_epi8(u, u + 1, u, u + 1, u, u + 1, u, u + 1,
                                          u + 2, u + 3, u + 2, u + 3, u + 2, u + 3, u + 2, u + 3);
        const __m128i s3 = _mm_srli_epi16(_mm_mullo_epi16(_mm_shuffle_epi8(w, rep), mul), 13);
        sv[h] = _mm256_broadcastsi128_si256(_mm_or_si128(_mm_slli_epi16(s3, 1), _mm_set1_epi16(1)));
    }
    const __m256i slo = sv[0], shi = sv[1];
    __m256i acc = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        const __m256i g = q4(&GB.iq1s[idx[4 * j]], &GB.iq1s[idx[4 * j + 1]],
                             &GB.iq1s[idx[4 * j + 2]], &GB.iq1s[idx[4 * j + 3]]);
        /* group j's deltas k = 4j .. 4j+3, each over its 8 bytes: the low
         * lane takes k = 4j, 4j+1, the high lane 4j+2, 4j+3 */
        const char k0 = (char)(4 * j % 16);
        const __m256i dsel = _mm256_setr_epi8(k0, k0, k0, k0, k0, k0, k0, k0,
                                              k0 + 1, k0 + 1, k0 + 1, k0 + 1, k0 + 1, k0 + 1, k0 + 1, k0 + 1,
                                              k0 + 2, k0 + 2, k0 + 2, k0 + 2, k0 + 2, k0 + 2, k0 + 2, k0 + 2,
                                              k0 + 3, k0 + 3, k0 + 3, k0 + 3, k0 + 3, k0 + 3, k0 + 3, k0 + 3);
        const __m256i c = _mm256_add_epi8(g, _mm256_shuffle_epi8(j < 4 ? dlo : dhi, dsel));
        /* scales 2j (low lane's 16 elements) and 2j + 1 (high lane's) */
        const char m0 = (char)(2 * (2 * j % 8)), m1 = (char)(m0 + 2);
        const __m256i ssel = _mm256_setr_epi8(m0, m0 + 1, m0, m0 + 1, m0, m0 + 1, m0, m0 + 1,
                                              m0, m0 + 1, m0, m0 + 1, m0, m0 + 1, m0, m0 + 1,
                                              m1, m1 + 1, m1, m1 + 1, m1, m1 + 1, m1, m1 + 1,
                                              m1, m1 + 1, m1, m1 + 1, m1, m1 + 1, m1, m1 + 1);
        const __m256i sc = _mm256_shuffle_epi8(j < 4 ? slo : shi, ssel);
        acc = _mm256_add_epi32(acc, grid_group_sc(_mm256_abs_epi8(c), c, sc, xq + 32 * j));
    }
    return acc;
}

/* the token's X_j of one block of 256 (bs: its 16 bsum) for raw1_iq1s */
static inline __m256i iq1s_xs(const int16_t *bs)
{
    const __m256i x32 = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)bs), _mm256_set1_epi16(1));
    return _mm256_blend_epi16(x32, _mm256_setzero_si256(), 0xAA);
}

/* whether type t has a raw1 path (one token) */
static inline __attribute__((always_inline)) int t_raw1(enum shoal_ggml_type t)
{
    return t == SHOAL_GGML_TYPE_IQ2_XXS || t == SHOAL_GGML_TYPE_IQ3_XXS ||
           t == SHOAL_GGML_TYPE_IQ1_S || t == SHOAL_GGML_TYPE_IQ2_XS ||
           t == SHOAL_GGML_TYPE_IQ2_S || t == SHOAL_GGML_TYPE_IQ3_S || t == SHOAL_GGML_TYPE_IQ1_M;
}

/* row block blk's raw sum against the token's block xq (xs: iq1s_xs of
 * its bsum, IQ1_S only), and its D, DMIN */
static inline __attribute__((always_inline)) __m256i raw1(enum shoal_ggml_type t,
                                                         const uint8_t *blk, const int8_t *xq,
                                                         __m256i xs, float *d, float *dmin)
{
    *dmin = 0.0f;
    switch (t) {
    case SHOAL_GGML_TYPE_IQ2_XXS:
        *d = f16_at(blk) * 0.125f;
#if SHOAL_GGML_VNNI
        return raw1_iq2xxs_512(blk, xq);
#else
        return raw1_iq2xxs(blk, xq);
#endif
    case SHOAL_GGML_TYPE_IQ3_XXS:
        *d = f16_at(blk) * 0.25f;
#if SHOAL_GGML_VNNI
        return raw1_iq3xxs_512(blk, xq);
#else
        return raw1_iq3xxs(blk, xq);
#endif
    case SHOAL_GGML_TYPE_IQ1_S:
        *d = f16_at(blk) * 0.125f;
        return raw1_iq1s(blk, xq, xs);
    case SHOAL_GGML_TYPE_IQ2_XS:
    case SHOAL_GGML_TYPE_IQ3_S:
    case SHOAL_GGML_TYPE_IQ2_S:
        *d = grid_d(t, blk);
#if SHOAL_GGML_VNNI
        return t == SHOAL_GGML_TYPE_IQ2_XS  ? raw1_iq2xs_512(blk, xq)
               : t == SHOAL_GGML_TYPE_IQ3_S ? raw1_iq3s_512(blk, xq)
                                            : raw1_iq2s_512(blk, xq);
#else
        return raw1_grid(t, blk, xq);
#endif
    case SHOAL_GGML_TYPE_IQ1_M:
        *d = grid_d(t, blk);
        return raw1_iq1m(blk, xq);
    default:
        return _mm256_setzero_si256();
    }
}

/* Eight rows (p) against tokens t0 .. t0 + nt - 1 of a, type t. One token
 * (a decode matvec): each row's block is unpacked and used at once, in
 * registers. More: the eight rows' block is unpacked once into u[] and
 * used for every token. */
static inline __attribute__((always_inline)) void rows8_t(enum shoal_ggml_type t, float *y,
                                                         const struct shoal_ggml_act *a,
                                                         int64_t t0, int64_t nt,
                                                         const struct shoal_ggml_matrix *w,
                                                         const uint8_t *const p[8],
                                                         const uint8_t *const pf[8], int64_t r,
                                                         int nr)
{
    const size_t type_size = shoal_ggml_type_info(t)->type_size;
    const int nreg = t_nreg(t), B = 32 * nreg;
    const int64_t n16 = a->n / 16;
    const int has_bs = t_kind(t) != KIND_NONE, corr256 = has_bs && nreg == 8;
    float d[8], dmin[8] = {0};
    __m256 acc[TOK_TILE];
    zero_acc(acc, nt);
    if (nt == 1) {
        const int8_t *xq = a->q + t0 * a->n;
        for (int64_t b = 0; b < a->n_blk; b++) {
            const size_t off = (size_t)b * type_size;
            const int16_t *bs = has_bs ? a->bsum + t0 * n16 + (int64_t)(B / 16) * b : NULL;
            const __m256i bsv = corr256 ? _mm256_loadu_si256((const __m256i *)bs)
                                        : _mm256_setzero_si256();
            __m256i xv[8], s[8], m[8];
            for (int j = 0; j < nreg; j++)
                xv[j] = _mm256_loadu_si256((const __m256i *)(xq + (int64_t)B * b + 32 * j));
            if (t_raw1(t)) {
                const __m256i xs = t == SHOAL_GGML_TYPE_IQ1_S
                                       ? iq1s_xs(a->bsum + t0 * n16 + 16 * b)
                                       : _mm256_setzero_si256();
                for (int i = 0; i < 8; i++) {
                    prefetch_block(pf, i, off, type_size);
                    s[i] = raw1(t, p[i] + off, xq + (int64_t)B * b, xs, &d[i], &dmin[i]);
                }
                acc[0] = block_term(t, acc[0], hsum_rows8(s), s[0], _mm256_loadu_ps(d),
                                    _mm256_loadu_ps(dmin), a->d[t0 * a->n_blk + b]);
                continue;
            }
            for (int i = 0; i < 8; i++) {
                struct urow u;
                prefetch_block(pf, i, off, type_size);
                unpack_row(t, p[i] + off, &u);
                s[i] = urow_raw(t, &u, xv);
                if (corr256)
                    m[i] = _mm256_madd_epi16(u.corr16, bsv);
                d[i] = u.d;
                dmin[i] = u.dmin;
            }
            acc[0] = block_term(t, acc[0], hsum_rows8(s), has_bs ? corr_sum(t, m, bs) : s[0],
                                _mm256_loadu_ps(d), _mm256_loadu_ps(dmin),
                                a->d[t0 * a->n_blk + b]);
        }
    } else {
        struct urow u[8];
        for (int64_t b = 0; b < a->n_blk; b++) {
            const size_t off = (size_t)b * type_size;
            for (int i = 0; i < 8; i++) {
                prefetch_block(pf, i, off, type_size);
                unpack_row(t, p[i] + off, &u[i]);
                d[i] = u[i].d;
                dmin[i] = u[i].dmin;
            }
            const __m256 dv = _mm256_loadu_ps(d), dminv = _mm256_loadu_ps(dmin);
            for (int64_t k = 0; k < nt; k++) {
                const int64_t tt = t0 + k;
                const int16_t *bs = has_bs ? a->bsum + tt * n16 + (int64_t)(B / 16) * b : NULL;
                __m256i xv[8], s[8], m[8];
                for (int j = 0; j < nreg; j++)
                    xv[j] = _mm256_loadu_si256(
                        (const __m256i *)(a->q + tt * a->n + (int64_t)B * b + 32 * j));
                for (int i = 0; i < 8; i++)
                    s[i] = urow_raw(t, &u[i], xv);
                if (corr256) {
                    const __m256i bsv = _mm256_loadu_si256((const __m256i *)bs);
                    for (int i = 0; i < 8; i++)
                        m[i] = _mm256_madd_epi16(u[i].corr16, bsv);
                }
                acc[k] = block_term(t, acc[k], hsum_rows8(s), has_bs ? corr_sum(t, m, bs) : s[0],
                                    dv, dminv, a->d[tt * a->n_blk + b]);
            }
        }
    }
    for (int64_t k = 0; k < nt; k++)
        store_rows(y, w->rows, t0 + k, r, nr, acc[k]);
}

#define ROWS8_FN(name, T)                                                                     \
    static void name(float *y, const struct shoal_ggml_act *a, int64_t t0, int64_t nt,       \
                     const struct shoal_ggml_matrix *w, const uint8_t *const p[8],            \
                     const uint8_t *const pf[8], int64_t r, int nr)                           \
    {                                                                                         \
        rows8_t(T, y, a, t0, nt, w, p, pf, r, nr);                                            \
    }
ROWS8_FN(rows8_iq2_xxs, SHOAL_GGML_TYPE_IQ2_XXS)
ROWS8_FN(rows8_iq3_xxs, SHOAL_GGML_TYPE_IQ3_XXS)
ROWS8_FN(rows8_iq1_s, SHOAL_GGML_TYPE_IQ1_S)
ROWS8_FN(rows8_iq1_m, SHOAL_GGML_TYPE_IQ1_M)
ROWS8_FN(rows8_iq2_xs, SHOAL_GGML_TYPE_IQ2_XS)
ROWS8_FN(rows8_iq2_s, SHOAL_GGML_TYPE_IQ2_S)
ROWS8_FN(rows8_iq3_s, SHOAL_GGML_TYPE_IQ3_S)

/* ---- Q4_0 and MXFP4, one token: as rows8_q8_0_1 ---------------------------
 *
 * A row's block is 32 unsigned codes u (Q4_0: the nibble; MXFP4: its E2M1
 * value doubled plus 12, 0 .. 24, by vpshufb) against the token's 32 qx:
 * isum = sum u qx - off * sum qx (off 8 or 12) is ggml_dot.h's sum c qx
 * exactly. The rows' raw sums fold pairwise as Q8_0's do, sum qx is taken
 * once per block for the eight rows, and the f32 step is block_term's. */
static const int8_t mxfp4_plus12[16] __attribute__((aligned(16))) = {
    12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
};

/* With VNNI IQ4_NL runs here too (Q4_0's layout, its codes through
 * kvalues_iq4nl + 128, 1 .. 241, offset 128): vpdpbusd sums them in int32,
 * where vpmaddubsw pairs would leave int16 (so AVX2 keeps rows8_t). */
static const uint8_t iq4nl_plus128[16] __attribute__((aligned(16))) = {
    1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241,
};

/* the blocks of 32: where its codes start (after the scale, Q4_1's and
 * Q5_1's m, Q5_0's and Q5_1's fifth bits), its bytes (those 16 code bytes
 * after them), where its 32 fifth bits start (Q5_0, Q5_1; else 0), the
 * offset of its unsigned codes (0: Q4_1 and Q5_1, whose codes are q
 * itself, their m applied through DMIN and msum = sum qx, ggml_dot.h),
 * whether it has that m (at byte 2), and the codes' table (NULL: the
 * nibble itself) */
static inline __attribute__((always_inline)) size_t b32_qs(enum shoal_ggml_type t)
{
    return t == SHOAL_GGML_TYPE_MXFP4  ? 1
           : t == SHOAL_GGML_TYPE_Q4_1 ? 4
           : t == SHOAL_GGML_TYPE_Q5_0 ? 6
           : t == SHOAL_GGML_TYPE_Q5_1 ? 8
                                       : 2;
}
static inline __attribute__((always_inline)) size_t b32_ts(enum shoal_ggml_type t)
{
    return b32_qs(t) + 16;
}
static inline __attribute__((always_inline)) size_t b32_qh(enum shoal_ggml_type t)
{
    return t == SHOAL_GGML_TYPE_Q5_0 ? 2 : t == SHOAL_GGML_TYPE_Q5_1 ? 4 : 0;
}
static inline __attribute__((always_inline)) int b32_off(enum shoal_ggml_type t)
{
    return t == SHOAL_GGML_TYPE_Q4_0    ? 8
           : t == SHOAL_GGML_TYPE_MXFP4 ? 12
           : t == SHOAL_GGML_TYPE_Q5_0  ? 16
           : t == SHOAL_GGML_TYPE_Q4_1 || t == SHOAL_GGML_TYPE_Q5_1 ? 0
                                        : 128;
}
static inline __attribute__((always_inline)) int b32_min(enum shoal_ggml_type t)
{
    return t == SHOAL_GGML_TYPE_Q4_1 || t == SHOAL_GGML_TYPE_Q5_1;
}
static inline __attribute__((always_inline)) const int8_t *b32_lut(enum shoal_ggml_type t)
{
    return t == SHOAL_GGML_TYPE_MXFP4    ? mxfp4_plus12
           : t == SHOAL_GGML_TYPE_IQ4_NL ? (const int8_t *)iq4nl_plus128
                                         : NULL;
}

static inline __attribute__((always_inline)) __m256i b32_row(enum shoal_ggml_type t,
                                                            const uint8_t *blk, __m256i xv)
{
    __m256i u = b32_lut(t) ? lut32(blk + b32_qs(t), b32_lut(t)) : nibbles32(blk + b32_qs(t));
    if (b32_qh(t))
        u = _mm256_or_si256(u, bits16(le32(blk + b32_qh(t))));
#if SHOAL_GGML_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, xv);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, xv), _mm256_set1_epi16(1));
#endif
}

/* MXFP4's D = 2^(e - 128) of the eight rows' block (lanes), from its bits
 * as ggml_e8m0_to_fp32_half builds them (unpack_row's scalar form) */
static inline __m256 e8m0x8(const uint8_t *const p[8], size_t off)
{
    const __m256i e = _mm256_setr_epi32(p[0][off], p[1][off], p[2][off], p[3][off], p[4][off],
                                        p[5][off], p[6][off], p[7][off]);
    const __m256i big = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i small = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    const __m256i lt2 = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(big, small, lt2));
}

/* the sum of the token's 32 bytes xv in every int32 lane (vpmaddubsw
 * pairs, vpmaddwd, the eight lanes summed) */
static inline __attribute__((always_inline)) __m256i sum32_all(__m256i xv)
{
    __m256i sx = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), xv),
                                   _mm256_set1_epi16(1));
    sx = _mm256_add_epi32(sx, _mm256_permute2x128_si256(sx, sx, 0x01));
    sx = _mm256_add_epi32(sx, _mm256_shuffle_epi32(sx, 0x4e));
    return _mm256_add_epi32(sx, _mm256_shuffle_epi32(sx, 0xb1));
}

/* acc + the term of the eight rows' block at byte o (a block of 32: Q4_0,
 * MXFP4, Q4_1, Q5_0, Q5_1, IQ4_NL) for
 * the token's bytes xv and scale dx */
static inline __attribute__((always_inline)) __m256 b32_step(enum shoal_ggml_type t, __m256 acc,
                                                            const uint8_t *const p[8],
                                                            const uint8_t *const pf[8],
                                                            size_t o, __m256i xv, float dx)
{
    const size_t ts = b32_ts(t);
    const int off = b32_off(t);
    __m256i s2[4];
    for (int k = 0; k < 4; k++) {
        prefetch_block(pf, 2 * k, o, ts);
        const __m256i r0 = b32_row(t, p[2 * k] + o, xv);
        prefetch_block(pf, 2 * k + 1, o, ts);
        s2[k] = _mm256_hadd_epi32(r0, b32_row(t, p[2 * k + 1] + o, xv));
    }
    const __m256 d = t == SHOAL_GGML_TYPE_MXFP4 ? e8m0x8(p, o) : f16x8(p, o);
    if (b32_min(t))   /* raw sum q qx; msum = sum qx against DMIN = -m */
        return block_term(t, acc, fold_pairs(s2), sum32_all(xv), d, neg8(f16x8(p, o + 2)), dx);
    const __m256i isum = _mm256_sub_epi32(fold_pairs(s2),   /* minus off * sum qx */
                                          _mm256_mullo_epi32(sum32_all(xv), _mm256_set1_epi32(off)));
    return block_term(t, acc, isum, _mm256_setzero_si256(), d, _mm256_setzero_ps(), dx);
}

/* ---- Q4_0 and MXFP4 (Q4_1, Q5_0, Q5_1), one token: two blocks of each row at a time
 *
 * A block at a time (b32_step) spent about 37 cycles on a block of eight rows (the scales
 * gathered a u16 at a time, three horizontal folds and two prefetches per
 * row and block; 0.69 of a paired read at 2 threads on a Zen 4). Here a
 * row's blocks b and b + 1 are one register of 32 code bytes [qs_b |
 * qs_b+1] whose nibbles meet the token's bytes rearranged once per pair,
 * xlo = [x_b 0..15 | x_b+1 0..15] and xhi = [x_b 16..31 | x_b+1 16..31],
 * so each vpdpbusd (vpmaddubsw + vpmaddwd) lane holds one block's partial
 * sum and one fold of the eight rows serves both blocks, and each row is
 * prefetched once per pair. MXFP4's codes go through its table (+ 12) as
 * b32_row's. The
 * integers are the same (exact sums), and
 * each block's f32 step is block_term's in block order: the same bits.
 * Zen 4, one thread, weights in L3: 14.4 -> 20 GB/s; at 2 threads 0.69 ->
 * 0.95 of a paired read. The scales still come a u16 at a time (a quarter
 * of the samples); two vpgatherdd per pair (the rows lie rb bytes apart)
 * were slower, 18 GB/s. Q5_0 and Q5_1 add each code's fifth bit (16) from
 * the block's qh (a byte mask with AVX-512 BW, bits16 with AVX2), and Q4_1
 * and Q5_1 have no offset: their m goes through block_term as DMIN = -m
 * against msum = sum qx (the sx below), as the general body's does. In L2
 * (kernel_l2, Zen 4, one thread, ns a row-block of 32): Q4_1 2.18 -> 1.12,
 * Q5_0 3.08 -> 1.22, Q5_1 2.33 -> 1.44 (avx512). */
/* rows8_b32_pair_1's sums of one row: blocks b and b + 1 of type t (Q4_0,
 * or MXFP4 through its table of values plus 12) at blk */
static inline __attribute__((always_inline)) __m256i b32_pair(enum shoal_ggml_type t,
                                                             const uint8_t *blk, __m256i xlo,
                                                             __m256i xhi)
{
    const size_t ts = b32_ts(t), qs = b32_qs(t);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i v = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(blk + qs))),
        _mm_loadu_si128((const __m128i *)(blk + ts + qs)), 1);
    __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    if (b32_qh(t)) {   /* the fifth bits: element j's is bit j of its block's qh */
        const uint32_t h0 = le32(blk + b32_qh(t)), h1 = le32(blk + ts + b32_qh(t));
#if SHOAL_GGML_VNNI && defined(__AVX512BW__)
        const __m256i b4 = _mm256_set1_epi8(0x10);
        lo = _mm256_mask_add_epi8(lo, (__mmask32)((h0 & 0xFFFFu) | (h1 << 16)), lo, b4);
        hi = _mm256_mask_add_epi8(hi, (__mmask32)((h0 >> 16) | (h1 & 0xFFFF0000u)), hi, b4);
#else
        const __m256i e0 = bits16(h0), e1 = bits16(h1);
        lo = _mm256_or_si256(lo, _mm256_permute2x128_si256(e0, e1, 0x20));
        hi = _mm256_or_si256(hi, _mm256_permute2x128_si256(e0, e1, 0x31));
#endif
    }
    if (b32_lut(t)) {
        const __m256i lut = _mm256_broadcastsi128_si256(
            _mm_load_si128((const __m128i *)b32_lut(t)));
        lo = _mm256_shuffle_epi8(lut, lo);
        hi = _mm256_shuffle_epi8(lut, hi);
    }
#if SHOAL_GGML_VNNI
    return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, xlo), hi, xhi);
#else
    /* pairs of 24 * 127 twice: at most 12192, inside int16 */
    return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, xlo),
                                              _mm256_maddubs_epi16(hi, xhi)),
                             _mm256_set1_epi16(1));
#endif
}

/* a block of 32 (Q4_0, MXFP4, Q4_1, Q5_0, Q5_1, IQ4_NL), one token: two blocks
 * of each row at a time (above) */
static inline __attribute__((always_inline)) void rows8_b32_pair_1(enum shoal_ggml_type t, float *y, const struct shoal_ggml_act *a,
                             int64_t t0, const struct shoal_ggml_matrix *w,
                             const uint8_t *const p[8], const uint8_t *const pf[8], int64_t r,
                             int nr)
{
    const int e8m0 = t == SHOAL_GGML_TYPE_MXFP4;
    const size_t ts = b32_ts(t);
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    const int8_t *xq = a->q + t0 * a->n;
    const float *dx = a->d + t0 * a->n_blk;
    __m256 acc = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= a->n_blk; b += 2) {
        const size_t o = (size_t)b * ts;
        const int8_t *x = xq + 32 * b;
        const __m256i xlo = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)x)),
            _mm_loadu_si128((const __m128i *)(x + 32)), 1);
        const __m256i xhi = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(x + 16))),
            _mm_loadu_si128((const __m128i *)(x + 48)), 1);
        __m256i h[4];
        for (int k = 0; k < 4; k++) {
            if (pf[2 * k])
                _mm_prefetch((const char *)(pf[2 * k] + o + 2 * ts - 1), SHOAL_PF_WEIGHTS);
            if (pf[2 * k + 1])
                _mm_prefetch((const char *)(pf[2 * k + 1] + o + 2 * ts - 1), SHOAL_PF_WEIGHTS);
            h[k] = _mm256_hadd_epi32(b32_pair(t, p[2 * k] + o, xlo, xhi),
                                     b32_pair(t, p[2 * k + 1] + o, xlo, xhi));
        }
        /* A = [rows 0-3 of b | of b+1], B = rows 4-7 likewise */
        const __m256i A = _mm256_hadd_epi32(h[0], h[1]), B = _mm256_hadd_epi32(h[2], h[3]);
        /* sum qx of each block, in every lane of its half, then times off */
        __m256i sx = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(ones8, xlo), ones16),
                                      _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, xhi), ones16));
        sx = _mm256_add_epi32(sx, _mm256_shuffle_epi32(sx, 0x4e));
        sx = _mm256_add_epi32(sx, _mm256_shuffle_epi32(sx, 0xb1));
        const __m256 d0 = e8m0 ? e8m0x8(p, o) : f16x8(p, o);
        const __m256 d1 = e8m0 ? e8m0x8(p, o + ts) : f16x8(p, o + ts);
        if (b32_min(t)) {   /* raw sums q qx; msum = sum qx against DMIN = -m */
            acc = block_term(t, acc, _mm256_permute2x128_si256(A, B, 0x20),
                             _mm256_permute2x128_si256(sx, sx, 0x00), d0,
                             neg8(f16x8(p, o + 2)), dx[b]);
            acc = block_term(t, acc, _mm256_permute2x128_si256(A, B, 0x31),
                             _mm256_permute2x128_si256(sx, sx, 0x11), d1,
                             neg8(f16x8(p, o + ts + 2)), dx[b + 1]);
            continue;
        }
        sx = t == SHOAL_GGML_TYPE_Q4_0   ? _mm256_slli_epi32(sx, 3)   /* 8, 16, 12 or 128 times */
             : t == SHOAL_GGML_TYPE_Q5_0 ? _mm256_slli_epi32(sx, 4)
             : e8m0 ? _mm256_add_epi32(_mm256_slli_epi32(sx, 3), _mm256_slli_epi32(sx, 2))
                    : _mm256_slli_epi32(sx, 7);
        const __m256i i0 = _mm256_sub_epi32(_mm256_permute2x128_si256(A, B, 0x20),
                                            _mm256_permute2x128_si256(sx, sx, 0x00));
        const __m256i i1 = _mm256_sub_epi32(_mm256_permute2x128_si256(A, B, 0x31),
                                            _mm256_permute2x128_si256(sx, sx, 0x11));
        acc = block_term(t, acc, i0, _mm256_setzero_si256(), d0, _mm256_setzero_ps(), dx[b]);
        acc = block_term(t, acc, i1, _mm256_setzero_si256(), d1, _mm256_setzero_ps(),
                         dx[b + 1]);
    }
    if (b < a->n_blk)   /* an odd last block: one block's step */
        acc = b32_step(t, acc, p, pf, (size_t)b * ts,
                       _mm256_loadu_si256((const __m256i *)(xq + 32 * b)), dx[b]);
    store_rows(y, w->rows, t0, r, nr, acc);
}

/* one token through ONE (rows8_b32_pair_1, rows8_k_1), more through MANY
 * (rows8_t, rows8_k_n, rows8_gemm_n) */
#define ROWS8_1N_FN(name, T, ONE, MANY)                                                       \
    static void name(float *y, const struct shoal_ggml_act *a, int64_t t0, int64_t nt,       \
                     const struct shoal_ggml_matrix *w, const uint8_t *const p[8],            \
                     const uint8_t *const pf[8], int64_t r, int nr)                           \
    {                                                                                         \
        if (nt == 1)                                                                          \
            ONE(T, y, a, t0, w, p, pf, r, nr);                                                \
        else                                                                                  \
            MANY(T, y, a, t0, nt, w, p, pf, r, nr);                                           \
    }
/* ---- Q4_0 and MXFP4 (Q4_1, Q5_0, Q5_1, IQ4_NL), more tokens: the eight rows' block transposed
 *
 * As rows8_k_n does for Q4_K: lane i of code register g holds row i's
 * elements 4g .. 4g + 3 as unsigned codes u (Q4_0: the nibble; MXFP4: its
 * E2M1 value doubled plus 12, as b32_row) of qs 4g .. 4g + 3's low
 * nibbles for g < 4 and high ones of qs 4(g-4) .. for g >= 4, built once
 * per block by one transpose of the rows' 16 code bytes; every token then
 * multiplies them by its own four activation bytes, broadcast, so the
 * eight rows' sums land in their lanes with no horizontal fold. isum = sum
 * u qx - off sum qx (off 8 or 12; Q8_0's codes + 128 with VNNI, kblk_q80,
 * 128; sum qx from the activations' bsum pair of the block) as b32_step,
 * block_term per block: the same bits.
 * Without VNNI the int16 pairs of four registers stay inside int16 (4 x 2
 * x 24 x 128 = 24576; Q4_0's codes <= 15 allow all eight: 30720) before a
 * vpmaddwd; VNNI's vpdpbusd sums straight to int32. */
/* tg tokens tt .. tt + tg - 1 (tg <= 4, a constant) of block b against
 * the transposed codes q: acc[k] + the block's term of token tt + k, their
 * chains interleaved (one token's eight steps alone wait on each other) */
static inline __attribute__((always_inline)) void b32_tokens(enum shoal_ggml_type t,
                                                            const __m256i q[8],
                                                            const struct shoal_ggml_act *a,
                                                            int64_t tt, int tg, int64_t b,
                                                            __m256 d, __m256 dmin, __m256 *acc)
{
    const int32_t off = b32_off(t);   /* Q8_0: 128 */
    const int8_t *x[4];
    __m256i raw[4];
    for (int k = 0; k < tg; k++)
        x[k] = a->q + (tt + k) * a->n + 32 * b;
#if SHOAL_GGML_VNNI
    for (int k = 0; k < tg; k++)
        raw[k] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q[0], bcast4(x[k]));
    for (int g = 1; g < 8; g++)
        for (int k = 0; k < tg; k++)
            raw[k] = _mm256_dpbusd_epi32(raw[k], q[g], bcast4(x[k] + 4 * g));
#else
    if (t == SHOAL_GGML_TYPE_Q8_0)   /* its c + 128 pairs would leave int16 (rows8_q8_0_n) */
        __builtin_unreachable();
    const __m256i ones16 = _mm256_set1_epi16(1);
    /* registers per int16 sum: codes <= 15 all eight (8 * 2 * 15 * 127),
     * <= 24 (MXFP4) or 31 (Q5_0, Q5_1) four */
    const int span = t == SHOAL_GGML_TYPE_Q4_0 || t == SHOAL_GGML_TYPE_Q4_1 ? 8 : 4;
    __m256i s16[4];
    for (int k = 0; k < tg; k++)
        raw[k] = _mm256_setzero_si256();
    for (int g0 = 0; g0 < 8; g0 += span) {
        for (int k = 0; k < tg; k++)
            s16[k] = _mm256_maddubs_epi16(q[g0], bcast4(x[k] + 4 * g0));
        for (int g = g0 + 1; g < g0 + span; g++)
            for (int k = 0; k < tg; k++) {
                s16[k] = _mm256_add_epi16(s16[k],
                                          _mm256_maddubs_epi16(q[g], bcast4(x[k] + 4 * g)));
                chain(&s16[k]);
            }
        for (int k = 0; k < tg; k++)
            raw[k] = _mm256_add_epi32(raw[k], _mm256_madd_epi16(s16[k], ones16));
    }
#endif
    for (int k = 0; k < tg; k++) {
        const int16_t *bs = a->bsum + (tt + k) * (a->n / 16) + 2 * b;
        if (b32_min(t)) {   /* raw sum q qx; msum = sum qx against DMIN = -m */
            acc[k] = block_term(t, acc[k], raw[k], _mm256_set1_epi32((int32_t)bs[0] + bs[1]), d,
                                dmin, a->d[(tt + k) * a->n_blk + b]);
            continue;
        }
        const __m256i sx = _mm256_set1_epi32(off * ((int32_t)bs[0] + bs[1]));
        acc[k] = block_term(t, acc[k], _mm256_sub_epi32(raw[k], sx), _mm256_setzero_si256(), d,
                            _mm256_setzero_ps(), a->d[(tt + k) * a->n_blk + b]);
    }
}

/* Q8_0, one token: as rows8_k_1, a row's 32 codes at a time against the
 * token's, the rows' sums folded pairwise, the next group's blocks
 * prefetched (rows8_q8_0 keeps sixteen registers of codes, spills, and has
 * no prefetch: at 2 threads it streamed at about 0.6 of the RAM read) */
static inline __attribute__((always_inline)) __m256i q80_row(const uint8_t *blk, __m256i xv)
{
    const __m256i wq = _mm256_loadu_si256((const __m256i *)(blk + 2));
#if SHOAL_GGML_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(wq),
                               _mm256_sign_epi8(xv, wq));
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(wq), _mm256_sign_epi8(xv, wq)),
                             _mm256_set1_epi16(1));
#endif
}

static void rows8_q8_0_1(float *y, const struct shoal_ggml_act *a, int64_t t0,
                         const struct shoal_ggml_matrix *w, const uint8_t *const p[8],
                         const uint8_t *const pf[8], int64_t r, int nr)
{
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < a->n_blk; b++) {
        const size_t off = (size_t)b * 34;
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(a->q + t0 * a->n + 32 * b));
        __m256i s2[4];
        for (int k = 0; k < 4; k++) {
            prefetch_block(pf, 2 * k, off, 34);
            const __m256i r0 = q80_row(p[2 * k] + off, xv);
            prefetch_block(pf, 2 * k + 1, off, 34);
            s2[k] = _mm256_hadd_epi32(r0, q80_row(p[2 * k + 1] + off, xv));
        }
        const __m256 dd = _mm256_mul_ps(f16x8(p, off), _mm256_set1_ps(a->d[t0 * a->n_blk + b]));
        acc = _mm256_add_ps(acc, _mm256_mul_ps(dd, _mm256_cvtepi32_ps(fold_pairs(s2))));
    }
    store_rows(y, w->rows, t0, r, nr, acc);
}

static void rows8_q8_0_n(float *y, const struct shoal_ggml_act *a, int64_t t0, int64_t nt,
                         const struct shoal_ggml_matrix *w, const uint8_t *const p[8],
                         const uint8_t *const pf[8], int64_t r, int nr);

static void rows8_q8_0_pf(float *y, const struct shoal_ggml_act *a, int64_t t0, int64_t nt,
                          const struct shoal_ggml_matrix *w, const uint8_t *const p[8],
                          const uint8_t *const pf[8], int64_t r, int nr)
{
    if (nt == 1)
        rows8_q8_0_1(y, a, t0, w, p, pf, r, nr);
    else
        rows8_q8_0_n(y, a, t0, nt, w, p, pf, r, nr);
}

/* ---- Q4_K, Q6_K and Q2_K, one token ----------------------------------------------------------
 *
 * The decode matvec of the commonest GGUF expert type, written for few live
 * registers: rows8_t keeps a whole unpacked block per row (24 registers)
 * and spilled it to the stack on every block, which held it at ~9 GB/s a
 * core with the weights in cache. Here a row's block streams through as
 * four 64-element chunks (a load, two masks, two vpmaddubsw against the
 * activations read from L1, two vpmaddwd with the sub-blocks' scales), and
 * the eight rows' sums are folded pairwise as they come (the same adds as
 * hsum_rows8). Same integers, and the same f32 steps (block_term), as
 * rows8_t: same bits. */

/* vpshufb controls broadcasting int16 lane j (0 .. 7) of a 128-bit half */
#define BC2(j) 2 * (j), 2 * (j) + 1
#define BC16(j) BC2(j), BC2(j), BC2(j), BC2(j), BC2(j), BC2(j), BC2(j), BC2(j)   /* a half */
#if !SHOAL_GGML_VNNI
static const uint8_t q4k_bcast[8][32] __attribute__((aligned(32))) = {
    {BC16(0), BC16(0)}, {BC16(1), BC16(1)}, {BC16(2), BC16(2)}, {BC16(3), BC16(3)},
    {BC16(4), BC16(4)}, {BC16(5), BC16(5)}, {BC16(6), BC16(6)}, {BC16(7), BC16(7)},
};
#endif

#if SHOAL_GGML_VNNI
/* vpshufb controls of the VNNI rows (vpdpbusd, vpackssdw, vpdpwssd): int16
 * lanes 0-3 of each half from lane a, 4-7 from lane b (as pairs for
 * vpdpwssd). q4k_pair[h]: sub-blocks 2h, 2h + 1 in both halves; k16_pair[j]:
 * the 16s 4j, 4j + 2 in the low half and 4j + 1, 4j + 3 in the high one */
#define BC8(a, b) BC2(a), BC2(a), BC2(a), BC2(a), BC2(b), BC2(b), BC2(b), BC2(b)
static const uint8_t q4k_pair[4][32] __attribute__((aligned(32))) = {
    {BC8(0, 1), BC8(0, 1)}, {BC8(2, 3), BC8(2, 3)}, {BC8(4, 5), BC8(4, 5)}, {BC8(6, 7), BC8(6, 7)},
};
static const uint8_t k16_pair[2][32] __attribute__((aligned(32))) = {
    {BC8(0, 2), BC8(1, 3)}, {BC8(4, 6), BC8(5, 7)},
};
#undef BC8

/* acc + the scaled sums of two registers of codes qa, qb (u8) against the
 * token's 32 bytes at xa, xb: vpdpbusd gives each 4-element run's sum
 * (|sum| <= 4 * 63 * 127 = 32004, so vpackssdw keeps it), and vpdpwssd
 * multiplies the runs by their int16 scales s (a pattern of k16_pair or
 * q4k_pair) and adds pairs into acc. The same integers as vpmaddubsw +
 * vpmaddwd: exact sums in another order. */
static inline __m256i dp_pair(__m256i acc, __m256i qa, __m256i qb, const int8_t *xa,
                              const int8_t *xb, __m256i s)
{
    const __m256i z = _mm256_setzero_si256();
    const __m256i da = _mm256_dpbusd_epi32(z, qa, _mm256_loadu_si256((const __m256i *)xa));
    const __m256i db = _mm256_dpbusd_epi32(z, qb, _mm256_loadu_si256((const __m256i *)xb));
    return _mm256_dpwssd_epi32(acc, _mm256_packs_epi32(da, db), s);
}
#endif

/* One row's Q4_K block blk against a token's 256 qx: *raw = the int32
 * lanes of sum_j sc[j] * (q . qx over sub-block j), *corr = the lanes of
 * sum_j m[j] * (the sum of qx over sub-block j) (bs: the token's 16 bsums
 * of the block), both to be summed across lanes. */
static inline __attribute__((always_inline)) void q4k_row(enum shoal_ggml_type t,
                                                         const uint8_t *blk, const int8_t *x,
                                                         __m256i bs, __m256i *raw,
                                                         __m256i *corr)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    /* Q5_K: the fifth bit of each code from qh (bit 2h of byte l: element
     * l of sub-block 2h, bit 2h + 1: of 2h + 1), codes <= 31 */
    const int q5 = t == SHOAL_GGML_TYPE_Q5_K;
    const __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : m4;
    const uint32_t w0 = le32(blk + 4), w1 = le32(blk + 8), w2 = le32(blk + 12);
    const uint32_t sc03 = w0 & 0x3f3f3f3fu, m03 = w1 & 0x3f3f3f3fu;
    const uint32_t sc47 = (w2 & 0x0f0f0f0fu) | ((w0 >> 6) & 0x03030303u) << 4;
    const uint32_t m47 = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 6) & 0x03030303u) << 4;
    /* int16 sc0..sc7 in both halves; m[j] twice each (one per 16) */
    const __m256i sc = _mm256_broadcastsi128_si256(
        _mm_cvtepu8_epi16(_mm_setr_epi32((int)sc03, (int)sc47, 0, 0)));
    const __m128i dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m256i mm = _mm256_cvtepu8_epi16(
        _mm_shuffle_epi8(_mm_setr_epi32((int)m03, (int)m47, 0, 0), dup));
    *corr = _mm256_madd_epi16(mm, bs);
    const uint8_t *qs = blk + (q5 ? 48 : 16);
    __m256i acc = _mm256_setzero_si256();
    for (int h = 0; h < 4; h++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
        __m256i lo = _mm256_and_si256(v, m4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (q5) {
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(bits8(qh, 2 * h, 1), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(bits8(qh, 2 * h + 1, 1), 4));
        }
#if SHOAL_GGML_VNNI
        acc = dp_pair(acc, lo, hi, x + 64 * h, x + 64 * h + 32,
                      _mm256_shuffle_epi8(sc, _mm256_load_si256((const __m256i *)q4k_pair[h])));
#else
        const __m256i plo = _mm256_maddubs_epi16(
            lo, _mm256_loadu_si256((const __m256i *)(x + 64 * h)));
        const __m256i phi = _mm256_maddubs_epi16(
            hi, _mm256_loadu_si256((const __m256i *)(x + 64 * h + 32)));
        const __m256i s_lo = _mm256_shuffle_epi8(sc, _mm256_load_si256(
                                                         (const __m256i *)q4k_bcast[2 * h]));
        const __m256i s_hi = _mm256_shuffle_epi8(
            sc, _mm256_load_si256((const __m256i *)q4k_bcast[2 * h + 1]));
        acc = _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(plo, s_lo),
                                                     _mm256_madd_epi16(phi, s_hi)));
#endif
    }
    *raw = acc;
}

#if !SHOAL_GGML_VNNI
/* vpshufb controls for Q6_K and Q2_K without VNNI: int16 lane 2r of the
 * low half and 2r + 1 of the high half, each across its half (the scales of
 * a register's two 16s) */
static const uint8_t q6k_bcast[4][32] __attribute__((aligned(32))) = {
    {BC16(0), BC16(1)}, {BC16(2), BC16(3)}, {BC16(4), BC16(5)}, {BC16(6), BC16(7)},
};
#endif
#undef BC16
#undef BC2

/* One row's Q6_K block blk against a token's 256 qx, as q4k_row: *raw =
 * lanes of sum_k sc[k] * ((q + 32) . qx over the 16s k), *corr = lanes of
 * sum_k sc[k] * bsum[k] (block_term takes 32 x corr back off). Register
 * 4h + r holds elements 128h + 32r .. + 31: ql's nibbles with qh's bit
 * pair 2r above them (ggml's dequantize_row_q6_K). */
static inline __attribute__((always_inline)) void q6k_row(const uint8_t *blk, const int8_t *x,
                                                         __m256i bs, __m256i *raw,
                                                         __m256i *corr)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
    *corr = _mm256_madd_epi16(sc, bs);
    const __m256i sc_half[2] = {_mm256_permute2x128_si256(sc, sc, 0x00),
                                _mm256_permute2x128_si256(sc, sc, 0x11)};
    __m256i acc = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        const __m256i hv = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
        const __m256i l0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h));
        const __m256i l1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32));
        const __m256i q[4] = {
            _mm256_or_si256(_mm256_and_si256(l0, m4),
                            _mm256_and_si256(_mm256_slli_epi16(hv, 4), m30)),
            _mm256_or_si256(_mm256_and_si256(l1, m4),
                            _mm256_and_si256(_mm256_slli_epi16(hv, 2), m30)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                            _mm256_and_si256(hv, m30)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                            _mm256_and_si256(_mm256_srli_epi16(hv, 2), m30))};
#if SHOAL_GGML_VNNI
        for (int j = 0; j < 2; j++)
            acc = dp_pair(acc, q[2 * j], q[2 * j + 1], x + 128 * h + 64 * j,
                          x + 128 * h + 64 * j + 32,
                          _mm256_shuffle_epi8(sc_half[h], _mm256_load_si256(
                                                              (const __m256i *)k16_pair[j])));
#else
        for (int r = 0; r < 4; r++) {
            const __m256i pr = _mm256_maddubs_epi16(
                q[r], _mm256_loadu_si256((const __m256i *)(x + 128 * h + 32 * r)));
            const __m256i sr = _mm256_shuffle_epi8(
                sc_half[h], _mm256_load_si256((const __m256i *)q6k_bcast[r]));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pr, sr));
        }
#endif
    }
    *raw = acc;
}

#if SHOAL_GGML_VNNI
/* vpermw indices of bitpair_raw's scales: int16 lanes 8L .. 8L + 3 the scale of
 * the 16 2r + (L & 1) + 8 (L >> 1) with r = 2j, lanes 8L + 4 .. 8L + 7 with
 * r = 2j + 1 */
#define Q2P(k) k, k, k, k
#define Q2L(r, L) Q2P(2 * (r) + ((L) & 1) + 8 * ((L) >> 1)), Q2P(2 * (r) + 2 + ((L) & 1) + 8 * ((L) >> 1))
static const int16_t q2k_perm[2][32] __attribute__((aligned(64))) = {
    {Q2L(0, 0), Q2L(0, 1), Q2L(0, 2), Q2L(0, 3)},
    {Q2L(2, 0), Q2L(2, 1), Q2L(2, 2), Q2L(2, 3)},
};
#undef Q2L
#undef Q2P
#endif

/* The raw sums of Q2_K's and Q3_K's codes: lanes of sum_k sc[k] * (c . qx
 * over the 16s k), sc the 16 int16 scales. c = bit pair r of qs[32h + l]
 * (element 128h + 32r + l, ggml's dequantize_row_q2_K / _q3_K), with Q3_K
 * (hm: its hmask) bit 4h + r of hm[l] above it as 4 (q + 4, 0 .. 7). */
static inline __attribute__((always_inline)) __m256i bitpair_raw(const uint8_t *qs,
                                                                const uint8_t *hm,
                                                                const int8_t *x, __m256i sc)
{
#if SHOAL_GGML_VNNI
    /* 512-bit: the 64 code bytes in one register, bit pair r of byte l
     * (half h: l = 32h + l') element 128h + 32r + l'; the token's bytes in
     * that order, x[32r ..] | x[128 + 32r ..] (loads the eight rows
     * share). Q3_K: byte 32h + l of hz holds hm[l]'s bits 4h .. 4h + 3 in
     * bits 0 .. 3, and a code gets its 4 under a byte mask (vptestmb) by
     * one masked add. A run of four is at most 4 * 7 * 128: packs keeps
     * it. It puts in 128-bit lane L the runs of ca's and cb's lane L, whose
     * 16s are 2r + (L & 1) + 8 (L >> 1): q2k_perm[j] picks their scales. */
    const __m512i m3z = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
    const __m512i z = _mm512_setzero_si512();
    const __m512i qz = _mm512_loadu_si512((const void *)qs);
    const __m512i scz = _mm512_castsi256_si512(sc);
    __m512i hz = z;
    if (hm) {
        const __m256i h = _mm256_loadu_si256((const __m256i *)hm);
        hz = _mm512_inserti64x4(_mm512_castsi256_si512(h), _mm256_srli_epi16(h, 4), 1);
    }
    __m512i accz = z;
    for (int j = 0; j < 2; j++) {
        const __m512i xa = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(x + 64 * j))),
            _mm256_loadu_si256((const __m256i *)(x + 128 + 64 * j)), 1);
        const __m512i xb = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(x + 64 * j + 32))),
            _mm256_loadu_si256((const __m256i *)(x + 128 + 64 * j + 32)), 1);
        __m512i ca = _mm512_and_si512(j ? _mm512_srli_epi16(qz, 4) : qz, m3z);
        __m512i cb = _mm512_and_si512(_mm512_srli_epi16(qz, 4 * j + 2), m3z);
        if (hm) {
            ca = _mm512_mask_add_epi8(
                ca, _mm512_test_epi8_mask(hz, _mm512_set1_epi8((char)(1 << (2 * j)))), ca, four);
            cb = _mm512_mask_add_epi8(
                cb, _mm512_test_epi8_mask(hz, _mm512_set1_epi8((char)(2 << (2 * j)))), cb, four);
        }
        const __m512i da = _mm512_dpbusd_epi32(z, ca, xa);
        const __m512i db = _mm512_dpbusd_epi32(z, cb, xb);
        const __m512i s = _mm512_permutexvar_epi16(
            _mm512_load_si512((const void *)q2k_perm[j]), scz);
        accz = _mm512_dpwssd_epi32(accz, _mm512_packs_epi32(da, db), s);
    }
    return _mm256_add_epi32(_mm512_castsi512_si256(accz), _mm512_extracti64x4_epi64(accz, 1));
#else
    /* register 4h + r: its two 16s' scales in its two halves */
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m256i h = hm ? _mm256_loadu_si256((const __m256i *)hm) : m3;
    const __m256i sc_half[2] = {_mm256_permute2x128_si256(sc, sc, 0x00),
                                _mm256_permute2x128_si256(sc, sc, 0x11)};
    __m256i acc = _mm256_setzero_si256();
    for (int hh = 0; hh < 2; hh++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * hh));
        for (int r = 0; r < 4; r++) {
            __m256i c = _mm256_and_si256(r ? _mm256_srli_epi16(q, 2 * r) : q, m3);
            if (hm)
                c = _mm256_or_si256(c, _mm256_slli_epi16(bits8(h, 4 * hh + r, 1), 2));
            const __m256i pr = _mm256_maddubs_epi16(
                c, _mm256_loadu_si256((const __m256i *)(x + 128 * hh + 32 * r)));
            const __m256i sr = _mm256_shuffle_epi8(
                sc_half[hh], _mm256_load_si256((const __m256i *)q6k_bcast[r]));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pr, sr));
        }
    }
    return acc;
#endif
}

/* One row's Q2_K block blk, as q4k_row: *raw = lanes of sum_k sc[k] *
 * (q . qx over the 16s k), *corr = lanes of sum_k m[k] * bsum[k]. */
static inline __attribute__((always_inline)) void q2k_row(const uint8_t *blk, const int8_t *x,
                                                         __m256i bs, __m256i *raw,
                                                         __m256i *corr)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)blk), m4b = _mm_set1_epi8(0x0F);
    const __m256i sc = _mm256_cvtepu8_epi16(_mm_and_si128(v, m4b));
    *corr = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), m4b)),
                              bs);
    *raw = bitpair_raw(blk + 16, NULL, x, sc);
}

/* One row's Q3_K block blk, as q6k_row: *raw = lanes of sum_k sc[k] *
 * ((q + 4) . qx over the 16s k), *corr = lanes of sum_k sc[k] * bsum[k]
 * (block_term takes 4 x corr back off). */
static inline __attribute__((always_inline)) void q3k_row(const uint8_t *blk, const int8_t *x,
                                                         __m256i bs, __m256i *raw,
                                                         __m256i *corr)
{
    const __m256i sc = _mm256_cvtepi8_epi16(q3k_scales(blk));
    *corr = _mm256_madd_epi16(sc, bs);
    *raw = bitpair_raw(blk + 32, blk, x, sc);
}

/* One row's IQ4_XS block against a token's 256 qx, as q4k_row (no min:
 * *corr = 0): sub-block j's 16 bytes are its 32 nibbles (nibbles32's order),
 * looked up in kvalues_iq4nl (-127 .. 113) and put as |c| against qx with
 * c's sign (vpmaddubsw pairs <= 2 * 127 * 127), then times its 6-bit scale
 * less 32 (vpmaddwd). unpack_row's integers. */
static inline __attribute__((always_inline)) void iq4xs_row(const uint8_t *blk, const int8_t *x,
                                                           __m256i bs, __m256i *raw,
                                                           __m256i *corr)
{
#if SHOAL_GGML_VNNI
    /* 512-bit: register g holds qs of the 32s 4g .. 4g + 3, looked up as
     * kvalues_iq4nl + 128 (1 .. 241, vpdpbusd's unsigned side) in two
     * registers, the low nibbles (elements 0-15 of each 32) and the high
     * ones (16-31), against the token's bytes in that order (xq4: loads
     * and permutes the eight rows share): 128-bit lane L holds the 32 4g
     * + L's partial sums, times its scale (vpmulld). The 128 comes back off
     * as 128 * sum_j sc[j] * (the sum of qx over the 32 j) from the bsums:
     * the same integer sum, exactly (|raw| < 2^28). */
    const __m128i s8 = iq4xs_scales(blk);
    const __m512i s32 = _mm512_cvtepi8_epi32(s8);
    const __m512i lut = _mm512_broadcast_i32x4(_mm_xor_si128(
        _mm_loadu_si128((const __m128i *)shoal_ggml_iq4nl_values), _mm_set1_epi8((char)0x80)));
    const __m512i m4z = _mm512_set1_epi8(0x0F), z = _mm512_setzero_si512();
    __m512i accz = z;
    for (int g = 0; g < 2; g++) {
        const __m512i x0 = _mm512_loadu_si512((const void *)(x + 128 * g));
        const __m512i x1 = _mm512_loadu_si512((const void *)(x + 128 * g + 64));
        const __m512i xlo = _mm512_permutex2var_epi64(x0, _mm512_setr_epi64(0, 1, 4, 5, 8, 9, 12, 13), x1);
        const __m512i xhi = _mm512_permutex2var_epi64(x0, _mm512_setr_epi64(2, 3, 6, 7, 10, 11, 14, 15), x1);
        const __m512i v = _mm512_loadu_si512((const void *)(blk + 8 + 64 * g));
        const __m512i lo = _mm512_shuffle_epi8(lut, _mm512_and_si512(v, m4z));
        const __m512i hi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4z));
        const __m512i d = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, lo, xlo), hi, xhi);
        const __m512i sg = _mm512_permutexvar_epi32(
            _mm512_add_epi32(_mm512_set1_epi32(4 * g),
                             _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)),
            s32);
        accz = _mm512_add_epi32(accz, _mm512_mullo_epi32(d, sg));
    }
    const __m128i dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m256i c = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_shuffle_epi8(s8, dup)), bs);
    *raw = _mm256_sub_epi32(
        _mm256_add_epi32(_mm512_castsi512_si256(accz), _mm512_extracti64x4_epi64(accz, 1)),
        _mm256_slli_epi32(c, 7));
    *corr = _mm256_setzero_si256();
#else
    (void)bs;
    const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(iq4xs_scales(blk)));
    const __m256i lut = _mm256_broadcastsi128_si256(
        _mm_loadu_si128((const __m128i *)shoal_ggml_iq4nl_values));
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i acc = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) {
        const __m128i q = _mm_loadu_si128((const __m128i *)(blk + 8 + 16 * j));
        const __m256i n = _mm256_and_si256(
            _mm256_set_m128i(_mm_srli_epi16(q, 4), q), m4);
        const __m256i c = _mm256_shuffle_epi8(lut, n);
        const __m256i pr = _mm256_maddubs_epi16(
            _mm256_abs_epi8(c), _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(x + 32 * j)), c));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pr, _mm256_shuffle_epi8(
                                        sc, _mm256_load_si256((const __m256i *)q4k_bcast[j]))));
    }
    *raw = acc;
    *corr = _mm256_setzero_si256();
#endif
}

/* the block bytes of the one-token K types, and where D (and DMIN) sit */
static inline __attribute__((always_inline)) size_t k1_size(enum shoal_ggml_type t)
{
    return t == SHOAL_GGML_TYPE_Q4_K ? 144 : t == SHOAL_GGML_TYPE_Q5_K ? 176
           : t == SHOAL_GGML_TYPE_Q6_K ? 210 : t == SHOAL_GGML_TYPE_IQ4_XS ? 136
           : t == SHOAL_GGML_TYPE_Q4_0 ? 18 : t == SHOAL_GGML_TYPE_MXFP4 ? 17
           : t == SHOAL_GGML_TYPE_Q8_0 ? 34 : t == SHOAL_GGML_TYPE_Q3_K ? 110
           : t == SHOAL_GGML_TYPE_Q4_1 || t == SHOAL_GGML_TYPE_Q5_0 ||
                   t == SHOAL_GGML_TYPE_Q5_1 || t == SHOAL_GGML_TYPE_IQ4_NL ? b32_ts(t)
                                                                            : 84;
}

static inline __attribute__((always_inline)) size_t k1_d_off(enum shoal_ggml_type t)
{
    return t == SHOAL_GGML_TYPE_Q4_K || t == SHOAL_GGML_TYPE_Q5_K ||
                   t == SHOAL_GGML_TYPE_IQ4_XS || t == SHOAL_GGML_TYPE_Q4_0 ||
                   t == SHOAL_GGML_TYPE_Q8_0 || t == SHOAL_GGML_TYPE_Q4_1 ||
                   t == SHOAL_GGML_TYPE_Q5_0 || t == SHOAL_GGML_TYPE_Q5_1 ||
                   t == SHOAL_GGML_TYPE_IQ4_NL ? 0
           : t == SHOAL_GGML_TYPE_Q6_K ? 208 : t == SHOAL_GGML_TYPE_Q3_K ? 108 : 80;
}

static inline __attribute__((always_inline)) void k1_row(enum shoal_ggml_type t,
                                                        const uint8_t *blk, const int8_t *x,
                                                        __m256i bs, __m256i *raw,
                                                        __m256i *corr)
{
    if (t == SHOAL_GGML_TYPE_Q4_K || t == SHOAL_GGML_TYPE_Q5_K)
        q4k_row(t, blk, x, bs, raw, corr);
    else if (t == SHOAL_GGML_TYPE_IQ4_XS)
        iq4xs_row(blk, x, bs, raw, corr);
    else if (t == SHOAL_GGML_TYPE_Q6_K)
        q6k_row(blk, x, bs, raw, corr);
    else if (t == SHOAL_GGML_TYPE_Q3_K)
        q3k_row(blk, x, bs, raw, corr);
    else
        q2k_row(blk, x, bs, raw, corr);
}

/* rows i and i + 1 of the group (type t: Q4_K, Q6_K or Q2_K): their raw
 * and corr lanes folded once (hsum_rows8's first step) */
static inline __attribute__((always_inline)) void k_pair(enum shoal_ggml_type t,
                                                        const uint8_t *const p[8],
                                                        const uint8_t *const pf[8], int i,
                                                        size_t off, const int8_t *x,
                                                        __m256i bs, __m256i *raw2,
                                                        __m256i *corr2)
{
    __m256i r0, c0, r1, c1;
    prefetch_block(pf, i, off, k1_size(t));
    k1_row(t, p[i] + off, x, bs, &r0, &c0);
    prefetch_block(pf, i + 1, off, k1_size(t));
    k1_row(t, p[i + 1] + off, x, bs, &r1, &c1);
    *raw2 = _mm256_hadd_epi32(r0, r1);
    *corr2 = _mm256_hadd_epi32(c0, c1);
}


/* Q4_K, Q6_K or Q2_K, one token: eight rows' chains (lane i: row i) */
static inline __attribute__((always_inline)) void rows8_k_1(enum shoal_ggml_type t, float *y,
                                                           const struct shoal_ggml_act *a,
                                                           int64_t t0,
                                                           const struct shoal_ggml_matrix *w,
                                                           const uint8_t *const p[8],
                                                           const uint8_t *const pf[8],
                                                           int64_t r, int nr)
{
    const size_t ts = k1_size(t);
    const int8_t *xq = a->q + t0 * a->n;
    const int16_t *bsum = a->bsum + t0 * (a->n / 16);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < a->n_blk; b++) {
        const size_t off = (size_t)b * ts;
        const int8_t *x = xq + QK_K * b;
        const __m256i bs = _mm256_loadu_si256((const __m256i *)(bsum + 16 * b));
        __m256i raw2[4], corr2[4];
        /* unrolled: the four pairs' sums stay in registers (as a loop GCC
         * stored each to the stack and read it back for the fold) */
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++)
            k_pair(t, p, pf, 2 * k, off, x, bs, &raw2[k], &corr2[k]);
        const __m256 d = f16x8(p, off + k1_d_off(t));
        const __m256 dmin = t == SHOAL_GGML_TYPE_Q6_K || t == SHOAL_GGML_TYPE_Q3_K ||
                                    t == SHOAL_GGML_TYPE_IQ4_XS
                                ? _mm256_setzero_ps()
                                : f16x8(p, off + k1_d_off(t) + 2);
        acc = block_term(t, acc, fold_pairs(raw2), fold_pairs(corr2), d, dmin,
                         a->d[t0 * a->n_blk + b]);
    }
    store_rows(y, w->rows, t0, r, nr, acc);
}

/* ---- Q4_K and Q6_K, several tokens: rows in lanes --------------------------
 *
 * The prefill GEMM. rows8_t runs a row's block against a token as 32-byte
 * registers of one row (a vpmaddubsw and a vpmaddwd per 32 weights, then
 * the rows folded by hsum_rows8), which the multiply pipes bound at about
 * 8.5 cycles per (row, block, token) on Zen 3. Here the eight rows' block
 * is transposed once (struct kblk): 32-bit lane i of group register g holds
 * row i's four codes of elements 4g .. 4g + 3, so a token's four qx bytes
 * are one vpbroadcastd and one vpmaddubsw gives all eight rows' pairs. The
 * int16 pairs of a run of groups under one scale are summed in int16 (exact:
 * Q4_K, a run is a sub-block of 32: 16 pairs of products 15 * 127, at most
 * 30480; Q6_K, codes q + 32 <= 63, a run is half a 16: 4 * 63 * 127 =
 * 32004), then one vpmaddwd with the rows' scale of the run gives int32 per
 * row, already in lanes (no hsum). About half the multiply work per weight.
 * raw and corr are the same integers as rows8_t's (corr: the rows' weights
 * against the token's bsum pairs), then block_term: the same bits. */

struct kblk {
    __m256i q[64];    /* [group g] lane i: row i's codes of elements 4g .. 4g + 3
                         (Q4_K q, Q6_K q + 32; the blocks of 32 in q[0 .. 7]:
                         Q4_0 q, MXFP4 its value x 2 + 12, Q8_0 q + 128) */
    __m256i sc[16];   /* [scale k] lane i: row i's scale of sub-block k (Q4_K,
                         32 elements) or of the 16s k (Q6_K), as int16 twice */
    __m256i cw[8];    /* [bsum pair j] lane i: row i's int16 weights of the
                         token's bsum[2j], bsum[2j + 1]: Q4_K (m[j], m[j]),
                         Q6_K (sc[2j], sc[2j + 1]) */
};

/* the 32 bytes at off of the eight rows, transposed: r[k] lane i = row i's
 * int32 k. Rows i and i + 4 share a register (halves), so two levels of
 * in-lane unpacks make the transpose (16 shuffles; vpblendd and the
 * 16-byte broadcast loads stay off the shuffle pipes). */
static inline __attribute__((always_inline)) void ld8_tr(const uint8_t *const p[8], size_t off,
                                                        __m256i r[8])
{
    for (int hb = 0; hb < 2; hb++) {
        __m256i R[4];
        for (int i = 0; i < 4; i++)
            R[i] = _mm256_blend_epi32(
                _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(p[i] + off + 16 * hb))),
                _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(p[i + 4] + off + 16 * hb))),
                0xF0);
        const __m256i t0 = _mm256_unpacklo_epi32(R[0], R[1]), t1 = _mm256_unpackhi_epi32(R[0], R[1]);
        const __m256i t2 = _mm256_unpacklo_epi32(R[2], R[3]), t3 = _mm256_unpackhi_epi32(R[2], R[3]);
        r[4 * hb + 0] = _mm256_unpacklo_epi64(t0, t2);
        r[4 * hb + 1] = _mm256_unpackhi_epi64(t0, t2);
        r[4 * hb + 2] = _mm256_unpacklo_epi64(t1, t3);
        r[4 * hb + 3] = _mm256_unpackhi_epi64(t1, t3);
    }
}

/* Sixteen scale bytes per row, S[i] = row i's in the low half and row
 * i + 4's in the high half, transposed: u[v] byte 4 e + i of each half =
 * byte 4 v + e of row i (rows 0..3 low, 4..7 high) */
static inline __attribute__((always_inline)) void tr_bytes16(const __m256i S[4], __m256i u[4])
{
    const __m256i t0 = _mm256_unpacklo_epi8(S[0], S[1]), t1 = _mm256_unpackhi_epi8(S[0], S[1]);
    const __m256i t2 = _mm256_unpacklo_epi8(S[2], S[3]), t3 = _mm256_unpackhi_epi8(S[2], S[3]);
    u[0] = _mm256_unpacklo_epi16(t0, t2);
    u[1] = _mm256_unpackhi_epi16(t0, t2);
    u[2] = _mm256_unpacklo_epi16(t1, t3);
    u[3] = _mm256_unpackhi_epi16(t1, t3);
}

/* vpshufb controls on tr_bytes16's u: int32 lane i of each half = an int16
 * pair of row i's bytes (4 b + i of the half): LO, byte b twice, each in
 * the low byte of its int16 (unsigned scales); HI, the same in the high
 * bytes (signed: vpsraw 8 after); PAIR, bytes b and b + 1, high bytes */
#define K4(x0, x1, x2, x3) x0(0), x1(0), x2(0), x3(0), x0(1), x1(1), x2(1), x3(1), \
                           x0(2), x1(2), x2(2), x3(2), x0(3), x1(3), x2(3), x3(3)
#define Z(i) 0x80
static const uint8_t kctrl_lo[4][32] __attribute__((aligned(32))) = {
#define B0(i) (i)
#define B1(i) (4 + (i))
#define B2(i) (8 + (i))
#define B3(i) (12 + (i))
    {K4(B0, Z, B0, Z), K4(B0, Z, B0, Z)}, {K4(B1, Z, B1, Z), K4(B1, Z, B1, Z)},
    {K4(B2, Z, B2, Z), K4(B2, Z, B2, Z)}, {K4(B3, Z, B3, Z), K4(B3, Z, B3, Z)},
};
static const uint8_t kctrl_hi[4][32] __attribute__((aligned(32))) = {
    {K4(Z, B0, Z, B0), K4(Z, B0, Z, B0)}, {K4(Z, B1, Z, B1), K4(Z, B1, Z, B1)},
    {K4(Z, B2, Z, B2), K4(Z, B2, Z, B2)}, {K4(Z, B3, Z, B3), K4(Z, B3, Z, B3)},
};
static const uint8_t kctrl_pair[2][32] __attribute__((aligned(32))) = {
    {K4(Z, B0, Z, B1), K4(Z, B0, Z, B1)}, {K4(Z, B2, Z, B3), K4(Z, B2, Z, B3)},
};
#undef B3
#undef B2
#undef B1
#undef B0
#undef Z
#undef K4

static inline __m256i kctrl(const uint8_t c[32])
{
    return _mm256_load_si256((const __m256i *)(const void *)c);
}

/* eight rows' Q4_K block at off into *g (get_scale_min_k4 as unpack_row) */
static inline __attribute__((always_inline)) void kblk_q4k(enum shoal_ggml_type t,
                                                          const uint8_t *const p[8],
                                                          const uint8_t *const pf[8],
                                                          size_t off, struct kblk *g)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const int q5 = t == SHOAL_GGML_TYPE_Q5_K;
    __m128i s8[8];
    for (int i = 0; i < 8; i++) {
        const uint8_t *blk = p[i] + off;
        prefetch_block(pf, i, off, q5 ? 176 : 144);
        const uint32_t w0 = le32(blk + 4), w1 = le32(blk + 8), w2 = le32(blk + 12);
        const uint32_t sc03 = w0 & 0x3f3f3f3fu, m03 = w1 & 0x3f3f3f3fu;
        const uint32_t sc47 = (w2 & 0x0f0f0f0fu) | ((w0 >> 6) & 0x03030303u) << 4;
        const uint32_t m47 = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 6) & 0x03030303u) << 4;
        s8[i] = _mm_setr_epi32((int)sc03, (int)sc47, (int)m03, (int)m47);
    }
    /* u[0]: sc0..3, u[1]: sc4..7, u[2]: m0..3, u[3]: m4..7 */
    __m256i S[4], u[4];
    for (int i = 0; i < 4; i++)
        S[i] = _mm256_set_m128i(s8[i + 4], s8[i]);
    tr_bytes16(S, u);
    for (int j = 0; j < 8; j++) {
        g->sc[j] = _mm256_shuffle_epi8(u[j / 4], kctrl(kctrl_lo[j % 4]));
        g->cw[j] = _mm256_shuffle_epi8(u[2 + j / 4], kctrl(kctrl_lo[j % 4]));
    }
    /* qs[32h + 4k ..]: low nibbles are sub-block 2h's elements 4k.., high 2h + 1's;
     * Q5_K: element l of sub-block j has bit j of qh[l] as its fifth (16) */
    __m256i qh[8];
    if (q5)
        ld8_tr(p, off + 16, qh);
    const __m256i b4 = _mm256_set1_epi8(0x10);
    for (int h = 0; h < 4; h++) {
        __m256i r[8];
        ld8_tr(p, off + (q5 ? 48 : 16) + 32 * (size_t)h, r);
        for (int k = 0; k < 8; k++) {
            g->q[16 * h + k] = _mm256_and_si256(r[k], m4);
            g->q[16 * h + 8 + k] = _mm256_and_si256(_mm256_srli_epi16(r[k], 4), m4);
            if (q5)   /* bit 2h (2h + 1) of each byte to bit 4, within the byte */
                for (int e = 0; e < 2; e++) {
                    const int bit = 2 * h + e;
                    const __m256i at4 = bit <= 4 ? _mm256_slli_epi16(qh[k], 4 - bit)
                                                 : _mm256_srli_epi16(qh[k], bit - 4);
                    g->q[16 * h + 8 * e + k] = _mm256_or_si256(g->q[16 * h + 8 * e + k],
                                                               _mm256_and_si256(at4, b4));
                }
        }
    }
}

/* eight rows' Q6_K block at off into *g (q6k_row's layout, transposed) */
/* g->cw from the eight rows' 16 int8 weights per 16, transposed (u[v]:
 * weights 4v .. 4v + 3, tr_bytes16): the pair 2j, 2j + 1 sign-extended */
static inline __attribute__((always_inline)) void kblk_cw16(const __m256i u[4], struct kblk *g)
{
    for (int j = 0; j < 8; j++)
        g->cw[j] = _mm256_srai_epi16(_mm256_shuffle_epi8(u[j / 2], kctrl(kctrl_pair[j % 2])), 8);
}

/* g->sc and g->cw from the eight rows' 16 int8 scales per 16 (S[i]: rows
 * i and i + 4 in its halves): sign-extended int16, sc[k] twice a lane,
 * cw[j] the pair 2j, 2j + 1; and the next group's blocks of ts bytes at off
 * prefetched */
static inline __attribute__((always_inline)) void kblk_scales16(const __m256i S[4],
                                                               const uint8_t *const pf[8],
                                                               size_t off, size_t ts,
                                                               struct kblk *g)
{
    for (int i = 0; i < 8; i++)
        prefetch_block(pf, i, off, ts);
    __m256i u[4];
    tr_bytes16(S, u);   /* u[v]: sc 4v .. 4v + 3 */
    for (int k = 0; k < 16; k++)
        g->sc[k] = _mm256_srai_epi16(_mm256_shuffle_epi8(u[k / 4], kctrl(kctrl_hi[k % 4])), 8);
    kblk_cw16(u, g);
}

static inline __attribute__((always_inline)) void kblk_q6k(const uint8_t *const p[8],
                                                          const uint8_t *const pf[8],
                                                          size_t off, struct kblk *g)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    __m256i S[4];
    for (int i = 0; i < 4; i++)
        S[i] = _mm256_loadu2_m128i((const __m128i *)(p[i + 4] + off + 192),
                                   (const __m128i *)(p[i] + off + 192));
    kblk_scales16(S, pf, off, 210, g);
    /* element 128h + 32r + 4k .. is group 32h + 8r + k */
    for (int h = 0; h < 2; h++) {
        __m256i l0[8], l1[8], hv[8];
        ld8_tr(p, off + 64 * (size_t)h, l0);
        ld8_tr(p, off + 64 * (size_t)h + 32, l1);
        ld8_tr(p, off + 128 + 32 * (size_t)h, hv);
        for (int k = 0; k < 8; k++) {
            __m256i *q = g->q + 32 * h + k;
            q[0] = _mm256_or_si256(_mm256_and_si256(l0[k], m4),
                                   _mm256_and_si256(_mm256_slli_epi16(hv[k], 4), m30));
            q[8] = _mm256_or_si256(_mm256_and_si256(l1[k], m4),
                                   _mm256_and_si256(_mm256_slli_epi16(hv[k], 2), m30));
            q[16] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0[k], 4), m4),
                                    _mm256_and_si256(hv[k], m30));
            q[24] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1[k], 4), m4),
                                    _mm256_and_si256(_mm256_srli_epi16(hv[k], 2), m30));
        }
    }
}

/* Q3_K's or Q2_K's block of the eight rows, in Q6_K's layout (kblk_q6k):
 * the codes are bit pair r of qs[32h + l] (element 128h + 32r + l, group
 * 32h + 8r + l / 4), Q3_K's with hmask[l]'s bit 4h + r above it (q + 4,
 * 0 .. 7). Q3_K: the int8 scales per 16 (q3k_scales) as Q6_K's, KIND_OFF
 * (block_term takes 4 x the scaled bsums back off); Q2_K: the low nibbles
 * of its 16 scale bytes as sc, the high ones (the mins) as cw, KIND_MIN16. */
static inline __attribute__((always_inline)) void kblk_bitpairs(enum shoal_ggml_type t,
                                                               const uint8_t *const p[8],
                                                               const uint8_t *const pf[8],
                                                               size_t off, struct kblk *g)
{
    const int q3 = t == SHOAL_GGML_TYPE_Q3_K;
    const __m256i m3 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(4), m0f = _mm256_set1_epi8(0x0F);
    __m256i S[4];
    for (int i = 0; i < 4; i++)
        S[i] = q3 ? _mm256_set_m128i(q3k_scales(p[i + 4] + off), q3k_scales(p[i] + off))
                  : _mm256_loadu2_m128i((const __m128i *)(p[i + 4] + off),
                                        (const __m128i *)(p[i] + off));
    if (q3) {
        kblk_scales16(S, pf, off, 110, g);
    } else {
        __m256i lo[4], u[4];
        for (int i = 0; i < 4; i++)
            lo[i] = _mm256_and_si256(S[i], m0f);
        kblk_scales16(lo, pf, off, 84, g);
        for (int i = 0; i < 4; i++)
            lo[i] = _mm256_and_si256(_mm256_srli_epi16(S[i], 4), m0f);
        tr_bytes16(lo, u);
        kblk_cw16(u, g);
    }
    __m256i hm[8];
    if (q3)
        ld8_tr(p, off, hm);
    for (int h = 0; h < 2; h++) {
        __m256i qs[8];
        ld8_tr(p, off + (q3 ? 32 : 16) + 32 * (size_t)h, qs);
        for (int r = 0; r < 4; r++) {
            const int hb = 4 * h + r;   /* hmask's bit, to bit 2 */
            for (int k = 0; k < 8; k++) {
                __m256i c = _mm256_and_si256(r ? _mm256_srli_epi16(qs[k], 2 * r) : qs[k], m3);
                if (q3)
                    c = _mm256_or_si256(c, _mm256_and_si256(hb >= 2 ? _mm256_srli_epi16(hm[k], hb - 2)
                                                                   : _mm256_slli_epi16(hm[k], 2 - hb),
                                                           m4));
                g->q[32 * h + 8 * r + k] = c;
            }
        }
    }
}

/* a block of 32's eight rows (Q4_0, MXFP4, Q4_1, Q5_0, Q5_1, IQ4_NL) into g->q[0 .. 7] (b32_tokens):
 * the rows' 16 code bytes as 8 x 4 dwords transposed, T[g] lane i = row
 * i's qs 4g .. 4g + 3, then q[g] its low nibbles (elements 4g ..) and
 * q[g + 4] its high ones (elements 16 + 4g ..), MXFP4's looked up to
 * their codes + 12 */
static inline __attribute__((always_inline)) void kblk_b32(enum shoal_ggml_type t,
                                                          const uint8_t *const p[8],
                                                          const uint8_t *const pf[8],
                                                          size_t off, struct kblk *g)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const size_t ts = b32_ts(t), qs = b32_qs(t);
    __m256i Y[4];
    for (int k = 0; k < 4; k++) {
        prefetch_block(pf, k, off, ts);
        prefetch_block(pf, k + 4, off, ts);
        Y[k] = _mm256_loadu2_m128i((const __m128i *)(p[k + 4] + off + qs),
                                   (const __m128i *)(p[k] + off + qs));
    }
    const __m256i u0 = _mm256_unpacklo_epi32(Y[0], Y[1]), u1 = _mm256_unpackhi_epi32(Y[0], Y[1]);
    const __m256i u2 = _mm256_unpacklo_epi32(Y[2], Y[3]), u3 = _mm256_unpackhi_epi32(Y[2], Y[3]);
    const __m256i T[4] = {_mm256_unpacklo_epi64(u0, u2), _mm256_unpackhi_epi64(u0, u2),
                          _mm256_unpacklo_epi64(u1, u3), _mm256_unpackhi_epi64(u1, u3)};
    for (int j = 0; j < 4; j++) {
        g->q[j] = _mm256_and_si256(T[j], m4);
        g->q[j + 4] = _mm256_and_si256(_mm256_srli_epi16(T[j], 4), m4);
        if (b32_lut(t)) {
            const __m256i lut = _mm256_broadcastsi128_si256(
                _mm_load_si128((const __m128i *)b32_lut(t)));
            g->q[j] = _mm256_shuffle_epi8(lut, g->q[j]);
            g->q[j + 4] = _mm256_shuffle_epi8(lut, g->q[j + 4]);
        }
    }
    if (b32_qh(t)) {
        /* Q5_0, Q5_1: byte k of q[j] lane i is element 4j + k of row i
         * (q[j + 4]: 16 + 4j + k), whose fifth bit is that bit of the
         * row's qh: each lane's qh shifted, its low byte spread to the four
         * bytes, bit k of byte k tested */
        const __m256i qh = _mm256_setr_epi32(
            (int)le32(p[0] + off + b32_qh(t)), (int)le32(p[1] + off + b32_qh(t)),
            (int)le32(p[2] + off + b32_qh(t)), (int)le32(p[3] + off + b32_qh(t)),
            (int)le32(p[4] + off + b32_qh(t)), (int)le32(p[5] + off + b32_qh(t)),
            (int)le32(p[6] + off + b32_qh(t)), (int)le32(p[7] + off + b32_qh(t)));
        const __m256i byte0 = _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12,
                                               0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12);
        const __m256i bit = _mm256_set1_epi32(0x08040201), b4 = _mm256_set1_epi8(0x10);
        for (int j = 0; j < 8; j++) {
            const __m256i hb = _mm256_and_si256(
                _mm256_shuffle_epi8(_mm256_srli_epi32(qh, 4 * (j & 3) + 16 * (j >> 2)), byte0),
                bit);
            g->q[j] = _mm256_or_si256(g->q[j], _mm256_and_si256(_mm256_cmpeq_epi8(hb, bit), b4));
        }
    }
}

/* Q8_0's block of the eight rows into g->q[0 .. 7] (b32_tokens, VNNI
 * only): the rows' 32 code bytes transposed (q[k] lane i = row i's codes
 * 4k .. 4k + 3), each code c as the unsigned byte c + 128 (the sign bit
 * flipped), which b32_tokens takes back as 128 sum qx */
static inline __attribute__((always_inline)) void kblk_q80(const uint8_t *const p[8],
                                                          const uint8_t *const pf[8],
                                                          size_t off, struct kblk *g)
{
    for (int i = 0; i < 8; i++)
        prefetch_block(pf, i, off, 34);
    ld8_tr(p, off + 2, g->q);
    for (int k = 0; k < 8; k++)
        g->q[k] = _mm256_xor_si256(g->q[k], _mm256_set1_epi8((char)0x80));
}

/* tg tokens tt .. tt + tg - 1 (tg <= 4, a constant) of block b against *g:
 * acc[k] + the block's term of token tt + k, lanes rows (d, dmin the rows'
 * D and DMIN) */
static inline __attribute__((always_inline)) void kblk_tokens(enum shoal_ggml_type t,
                                                             const struct kblk *g,
                                                             const struct shoal_ggml_act *a,
                                                             int64_t tt, int tg, int64_t b,
                                                             __m256 d, __m256 dmin, __m256 *acc)
{
    /* Q5_K: Q4_K's scales with codes up to 31, so runs of four groups keep
     * the int16 sums inside (4 * 2 * 31 * 127 = 31496) */
    const int q4 = t == SHOAL_GGML_TYPE_Q4_K || t == SHOAL_GGML_TYPE_Q5_K;
    const int nsc = q4 ? 8 : 16, per_sc = 64 / nsc,
              run = t == SHOAL_GGML_TYPE_Q4_K ? 8 : t == SHOAL_GGML_TYPE_Q5_K ? 4 : 2;
    const int8_t *x[4];
    const int16_t *bs[4];
    for (int k = 0; k < tg; k++) {
        x[k] = a->q + (tt + k) * a->n + QK_K * b;
        bs[k] = a->bsum + (tt + k) * (a->n / 16) + 16 * b;
    }
    __m256i raw[4], s16[4], c[4];
    /* the scale groups as a loop, not unrolled: 16 x 4 tokens of unrolled
     * steps overflowed the op cache (Q4_K, Zen 3, kernel_l2 ns per
     * row-block-token: 6.4 -> 5.9 at 4 tokens, 6.6 -> 5.0 at 8, 4.9 -> 4.4 at
     * 256) */
#pragma GCC unroll 1
    for (int s = 0; s < nsc; s++) {
#pragma GCC unroll 8
        for (int e = 0; e < per_sc; e++) {
            const int gi = s * per_sc + e;
            const __m256i code = _mm256_load_si256(&g->q[gi]);
#pragma GCC unroll 4
            for (int k = 0; k < tg; k++) {
                const __m256i pr = _mm256_maddubs_epi16(code, bcast4(x[k] + 4 * gi));
                s16[k] = e % run ? _mm256_add_epi16(s16[k], pr) : pr;
                chain(&s16[k]);
            }
            if (e % run == run - 1) {
#pragma GCC unroll 4
                for (int k = 0; k < tg; k++) {
                    const __m256i m = _mm256_madd_epi16(s16[k], g->sc[s]);
                    raw[k] = gi == run - 1 ? m : _mm256_add_epi32(raw[k], m);
                    if (q4)   /* (Q6_K's 32 runs measured faster without) */
                        chain(&raw[k]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int k = 0; k < tg; k++) {
        c[k] = _mm256_madd_epi16(g->cw[0], bcast4(bs[k]));
#pragma GCC unroll 8
        for (int j = 1; j < 8; j++) {
            c[k] = _mm256_add_epi32(c[k], _mm256_madd_epi16(g->cw[j], bcast4(bs[k] + 2 * j)));
            chain(&c[k]);
        }
        acc[k] = block_term(t, acc[k], raw[k], c[k], d, dmin, a->d[(tt + k) * a->n_blk + b]);
    }
}

/* Q4_K, Q6_K, Q3_K, Q2_K, Q4_0, MXFP4 or Q8_0 (VNNI), nt > 1 tokens from t0: eight rows' chains per token */
static inline __attribute__((always_inline)) void rows8_k_n(enum shoal_ggml_type t, float *y,
                                                           const struct shoal_ggml_act *a,
                                                           int64_t t0, int64_t nt,
                                                           const struct shoal_ggml_matrix *w,
                                                           const uint8_t *const p[8],
                                                           const uint8_t *const pf[8],
                                                           int64_t r, int nr)
{
    const size_t ts = k1_size(t);
    struct kblk g;
    __m256 acc[TOK_TILE];
    zero_acc(acc, nt);
    for (int64_t b = 0; b < a->n_blk; b++) {
        const size_t off = (size_t)b * ts;
        const int b32 = t == SHOAL_GGML_TYPE_Q4_0 || t == SHOAL_GGML_TYPE_MXFP4 ||
                        t == SHOAL_GGML_TYPE_Q8_0 || t == SHOAL_GGML_TYPE_Q4_1 ||
                        t == SHOAL_GGML_TYPE_Q5_0 || t == SHOAL_GGML_TYPE_Q5_1 ||
                        t == SHOAL_GGML_TYPE_IQ4_NL;
        if (t == SHOAL_GGML_TYPE_Q4_K || t == SHOAL_GGML_TYPE_Q5_K)
            kblk_q4k(t, p, pf, off, &g);
        else if (t == SHOAL_GGML_TYPE_Q6_K)
            kblk_q6k(p, pf, off, &g);
        else if (t == SHOAL_GGML_TYPE_Q3_K || t == SHOAL_GGML_TYPE_Q2_K)
            kblk_bitpairs(t, p, pf, off, &g);
        else if (t == SHOAL_GGML_TYPE_Q8_0)
            kblk_q80(p, pf, off, &g);
        else
            kblk_b32(t, p, pf, off, &g);
        /* g is read back from L1 by every token: without this GCC keeps
         * some of its registers live across the token loop from the
         * unpack and spills the tokens' sums instead */
        __asm__ volatile("" : : "r"(&g) : "memory");
        const __m256 d = t == SHOAL_GGML_TYPE_MXFP4 ? e8m0x8(p, off) : f16x8(p, off + k1_d_off(t));
        const __m256 dmin = t == SHOAL_GGML_TYPE_Q4_K || t == SHOAL_GGML_TYPE_Q5_K ||
                                    t == SHOAL_GGML_TYPE_Q2_K
                                ? f16x8(p, off + k1_d_off(t) + 2)
                            : b32_min(t) ? neg8(f16x8(p, off + 2))   /* Q4_1, Q5_1: -m */
                                         : _mm256_setzero_ps();
#define KN_TOKENS(TG)                                                                  \
    (b32 ? b32_tokens(t, g.q, a, t0 + k, TG, b, d, dmin, acc + k)                      \
                               : kblk_tokens(t, &g, a, t0 + k, TG, b, d, dmin, acc + k))
        int64_t k = 0;
        for (; k + 4 <= nt; k += 4)
            KN_TOKENS(4);
        switch (nt - k) {
        case 3: KN_TOKENS(3); break;
        case 2: KN_TOKENS(2); break;
        case 1: KN_TOKENS(1); break;
        default: break;
        }
#undef KN_TOKENS
    }
    for (int64_t k = 0; k < nt; k++)
        store_rows(y, w->rows, t0 + k, r, nr, acc[k]);
}

/* one token through rows8_k_1, more through MANY (rows8_k_n or rows8_t) */
#define ROWS8_K_FN(name, T, MANY) ROWS8_1N_FN(name, T, rows8_k_1, MANY)
/* The transposed block of Q6_K, Q3_K and Q2_K (kblk_scales16 for their
 * scales) pays from K16_GEMM_MIN tokens. Zen 4, kernel_l2 --rows 256 --cols
 * 2048, ns a row-block-token, rows8_k_n against rows8_t, avx512 (AVX2
 * alike): Q6_K 7.3 / 7.6 at 2 tokens, 5.4 / 6.2 at 3, 3.5 / 4.7 at 8, 2.8
 * / 3.9 at 32; Q3_K 7.2 / 7.5 at 2, 5.3 / 6.3 at 3, 3.5 / 4.7 at 8, 2.7 /
 * 3.9 at 64. (On Zen 3, before kblk_scales16, Q6_K's paid from 48.) */
#define K16_GEMM_MIN 3
static inline __attribute__((always_inline)) void rows8_gemm_n(enum shoal_ggml_type t, float *y,
                                                             const struct shoal_ggml_act *a,
                                                             int64_t t0, int64_t nt,
                                                             const struct shoal_ggml_matrix *w,
                                                             const uint8_t *const p[8],
                                                             const uint8_t *const pf[8],
                                                             int64_t r, int nr)
{
    if (nt >= K16_GEMM_MIN)
        rows8_k_n(t, y, a, t0, nt, w, p, pf, r, nr);
    else
        rows8_t(t, y, a, t0, nt, w, p, pf, r, nr);
}

ROWS8_K_FN(rows8_q4_k, SHOAL_GGML_TYPE_Q4_K, rows8_k_n)
ROWS8_1N_FN(rows8_q4_0, SHOAL_GGML_TYPE_Q4_0, rows8_b32_pair_1, rows8_k_n)
ROWS8_1N_FN(rows8_mxfp4, SHOAL_GGML_TYPE_MXFP4, rows8_b32_pair_1, rows8_k_n)
/* Q4_1, Q5_0 and Q5_1 as Q4_0: one token two blocks a row at a time
 * (their fifth bits added to the codes, Q4_1's and Q5_1's m through
 * DMIN), more tokens the eight rows' block transposed (kblk_b32) */
ROWS8_1N_FN(rows8_q4_1, SHOAL_GGML_TYPE_Q4_1, rows8_b32_pair_1, rows8_k_n)
ROWS8_1N_FN(rows8_q5_0, SHOAL_GGML_TYPE_Q5_0, rows8_b32_pair_1, rows8_k_n)
ROWS8_1N_FN(rows8_q5_1, SHOAL_GGML_TYPE_Q5_1, rows8_b32_pair_1, rows8_k_n)
#if SHOAL_GGML_VNNI
ROWS8_1N_FN(rows8_iq4_nl, SHOAL_GGML_TYPE_IQ4_NL, rows8_b32_pair_1, rows8_k_n)
#else
ROWS8_FN(rows8_iq4_nl, SHOAL_GGML_TYPE_IQ4_NL)
#endif

/* Q8_0, more tokens: with VNNI and at least Q80_GEMM_MIN tokens the eight
 * rows' block transposed (kblk_q80, b32_tokens: vpdpbusd takes the codes +
 * 128 as its unsigned side), else rows8_q8_0 (without VNNI the pairs of
 * c + 128 against qx would leave int16). The transpose pays for itself
 * from about 6 tokens (Zen 4, kernel_l2 --rows 512 --cols 512, ns a
 * row-block-token, transposed against rows8_q8_0: 1.28 / 0.83 at 2
 * tokens, 0.78 / 0.71 at 4, 0.54 / 0.65 at 8, 0.36 / 0.61 at 64). */
#define Q80_GEMM_MIN 6
static void rows8_q8_0_n(float *y, const struct shoal_ggml_act *a, int64_t t0, int64_t nt,
                         const struct shoal_ggml_matrix *w, const uint8_t *const p[8],
                         const uint8_t *const pf[8], int64_t r, int nr)
{
#if SHOAL_GGML_VNNI
    if (nt >= Q80_GEMM_MIN) {
        rows8_k_n(SHOAL_GGML_TYPE_Q8_0, y, a, t0, nt, w, p, pf, r, nr);
        return;
    }
#endif
    (void)pf;
    rows8_q8_0(y, a, t0, nt, w, p, r, nr);
}
ROWS8_K_FN(rows8_q5_k, SHOAL_GGML_TYPE_Q5_K, rows8_k_n)
ROWS8_K_FN(rows8_iq4_xs, SHOAL_GGML_TYPE_IQ4_XS, rows8_t)
ROWS8_K_FN(rows8_q6_k, SHOAL_GGML_TYPE_Q6_K, rows8_gemm_n)
ROWS8_K_FN(rows8_q2_k, SHOAL_GGML_TYPE_Q2_K, rows8_gemm_n)
ROWS8_K_FN(rows8_q3_k, SHOAL_GGML_TYPE_Q3_K, rows8_gemm_n)

typedef void (*rows8_fn)(float *, const struct shoal_ggml_act *, int64_t, int64_t,
                         const struct shoal_ggml_matrix *, const uint8_t *const[8],
                         const uint8_t *const[8], int64_t, int);

static rows8_fn rows8_for(enum shoal_ggml_type t)
{
    switch (t) {
    case SHOAL_GGML_TYPE_Q8_0: return rows8_q8_0_pf;
    case SHOAL_GGML_TYPE_Q4_K: return rows8_q4_k;
    case SHOAL_GGML_TYPE_Q5_K: return rows8_q5_k;
    case SHOAL_GGML_TYPE_Q6_K: return rows8_q6_k;
    case SHOAL_GGML_TYPE_Q2_K: return rows8_q2_k;
    case SHOAL_GGML_TYPE_Q3_K: return rows8_q3_k;
    case SHOAL_GGML_TYPE_IQ4_XS: return rows8_iq4_xs;
    case SHOAL_GGML_TYPE_IQ4_NL: return rows8_iq4_nl;
    case SHOAL_GGML_TYPE_IQ2_XXS: return rows8_iq2_xxs;
    case SHOAL_GGML_TYPE_IQ3_XXS: return rows8_iq3_xxs;
    case SHOAL_GGML_TYPE_IQ1_S: return rows8_iq1_s;
    case SHOAL_GGML_TYPE_IQ1_M: return rows8_iq1_m;
    case SHOAL_GGML_TYPE_IQ2_XS: return rows8_iq2_xs;
    case SHOAL_GGML_TYPE_IQ2_S: return rows8_iq2_s;
    case SHOAL_GGML_TYPE_IQ3_S: return rows8_iq3_s;
    case SHOAL_GGML_TYPE_MXFP4: return rows8_mxfp4;
    case SHOAL_GGML_TYPE_Q4_0: return rows8_q4_0;
    case SHOAL_GGML_TYPE_Q4_1: return rows8_q4_1;
    case SHOAL_GGML_TYPE_Q5_0: return rows8_q5_0;
    case SHOAL_GGML_TYPE_Q5_1: return rows8_q5_1;
    default: return NULL;
    }
}

void SHOAL_GGML_ROWS_FN(float *y, const struct shoal_ggml_act *a, int64_t n_tok,
                        const struct shoal_ggml_matrix *w, int64_t r0, int64_t r1)
{
    /* bytes per block and per row (ggml_types.c's sizes) */
    const struct shoal_ggml_type_info *ti = shoal_ggml_type_info(w->type);
    const size_t rb = (size_t)(w->cols / ti->block_size) * ti->type_size;
    const rows8_fn rows8 = rows8_for(w->type);
    shoal_ggml_grid_bytes_init();   /* after the first call: one load */
    static const uint8_t *const none[8] = {NULL};
    /* prefetch distance: whole groups, at least PF_AHEAD bytes (short
     * rows, e.g. a down projection's 432-byte Q4_K rows, need several
     * groups ahead to cover the DRAM latency under load); past the share's
     * end, the next linear's first bytes (a->pf_next) in rows of rb */
    const int64_t ahead = 8 * (rb * 8 >= PF_AHEAD ? 1 : (int64_t)((PF_AHEAD + 8 * rb - 1) / (8 * rb)));
    const uint8_t *const base = (const uint8_t *)w->data;
    for (int64_t r = r0; r < r1; r += 8) {
        const int nr = r1 - r < 8 ? (int)(r1 - r) : 8;
        const uint8_t *p[8], *pf[8];
        for (int i = 0; i < 8; i++) {
            p[i] = base + (size_t)(r + (i < nr ? i : nr - 1)) * rb;
            const int64_t rp = r + ahead + i;
            const size_t o = rp >= r1 ? (size_t)(rp - r1) * rb : 0;
            pf[i] = rp < r1 ? base + (size_t)rp * rb
                    : a->pf_next && o + rb <= a->pf_next_bytes ? a->pf_next + o : NULL;
        }
        for (int64_t t0 = 0; t0 < n_tok; t0 += TOK_TILE) {
            const int64_t nt = n_tok - t0 < TOK_TILE ? n_tok - t0 : TOK_TILE;
            rows8(y, a, t0, nt, w, p, t0 == 0 ? pf : none, r, nr);
        }
    }
}
