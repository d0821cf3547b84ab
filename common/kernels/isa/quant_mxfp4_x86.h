/* quant_mxfp4_x86: the MXFP4 primitives of the x86 tables (quant.h
 * "MXFP4"; quant_mxfp4_impl.h's contract) around one decode, which the
 * including file defines first:
 *
 *   static inline void mx_block_regs(const uint8_t *q, __m256 w[4])
 *       one packed block (16 bytes) -> its 32 values v2(nibble) as 4 x 8
 *       f32 in element order (exact; the sign of a zero is free)
 *
 * with MXFP4_ROWS_NAME set to the rows function to define: AVX2
 * (quant_avx2.c) and AVX-512 (quant_avx512.c, a 16-entry vpermt2ps
 * decode), the same bits. Needs AVX2. */

#include "prefetch_x86.h"

/* the 8 lanes s[k % 8] of one block: ((0 + p0) + p8) + p16) + p24 per lane */
static inline __m256 mx_block_lanes(const float *x, const __m256 w[4])
{
    __m256 acc = _mm256_setzero_ps();
    for (int j = 0; j < 4; j++)
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(x + 8 * j), w[j]));
    return acc;
}

/* ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)) of one register */
static inline float mx_tree8(__m256 v)
{
    const __m128 p = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 q = _mm_add_ps(p, _mm_movehl_ps(p, p));
    return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}

static void mx_decode(float *dst, const uint8_t *q, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++) {
        __m256 w[4];
        mx_block_regs(q + 16 * b, w);
        for (int j = 0; j < 4; j++)
            _mm256_storeu_ps(dst + 32 * b + 8 * j, w[j]);
    }
}

static float mx_block_dot(const float *x, const float *w)
{
    const __m256 wv[4] = {_mm256_loadu_ps(w), _mm256_loadu_ps(w + 8), _mm256_loadu_ps(w + 16),
                          _mm256_loadu_ps(w + 24)};
    return mx_tree8(mx_block_lanes(x, wv));
}

/* The tree of 8 blocks' lanes at once: the same three levels of adds as
 * mx_tree8, each level one vector add over lanes of several blocks
 * (128-bit halves, then pairs, then neighbours), leaving block k's sum in
 * lane k. */
static inline __m256 mx_tree8x8(const __m256 v[8])
{
    __m256 p[4];
    for (int i = 0; i < 4; i++)   /* [Vlo + Vhi | V'lo + V'hi]: p0..p3 of 2i, 2i+1 */
        p[i] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x31));
    __m256 q[2];
    for (int i = 0; i < 2; i++)   /* p0 + p2, p1 + p3 */
        q[i] = _mm256_add_ps(_mm256_shuffle_ps(p[2 * i], p[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(p[2 * i], p[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* q0 + q1: blocks in lanes 0 2 4 6 | 1 3 5 7 */
    const __m256 s = _mm256_add_ps(_mm256_shuffle_ps(q[0], q[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm256_shuffle_ps(q[0], q[1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm256_permutevar8x32_ps(s, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static float mx_row_dot(const float *x, const uint8_t *q, const uint8_t *e, int64_t nb)
{
    float acc = 0.0f;
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        _mm_prefetch((const char *)q + 16 * b + 4096, SHOAL_PF_WEIGHTS);
        _mm_prefetch((const char *)q + 16 * b + 4096 + 64, SHOAL_PF_WEIGHTS);
        __m256 v[8];
        for (int k = 0; k < 8; k++) {
            __m256 w[4];
            mx_block_regs(q + 16 * (b + k), w);
            v[k] = mx_block_lanes(x + 32 * (b + k), w);
        }
        /* d = 2^(e - 128): biased exponent e - 1 (shoal_mxfp4_d) */
        const __m256i ei = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(e + b)));
        const __m256 d = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_sub_epi32(ei, _mm256_set1_epi32(1)), 23));
        float prod[8];
        _mm256_storeu_ps(prod, _mm256_mul_ps(d, mx_tree8x8(v)));
        for (int k = 0; k < 8; k++)
            acc = acc + prod[k];
    }
    for (; b < nb; b++) {
        __m256 w[4];
        mx_block_regs(q + 16 * b, w);
        acc = acc + shoal_mxfp4_d(e[b]) * mx_tree8(mx_block_lanes(x + 32 * b, w));
    }
    return acc;
}

/* MX_NR rows at once (row r: q0 + r qs, e0 + r es), each in the order of
 * mx_row_dot: MX_NR independent chains of block sums in flight, where one
 * row's chain of dependent adds bounds mx_row_dot. */
#define MX_NR 4
static void mx_row_dot_n(const float *x, const uint8_t *q0, size_t qs, const uint8_t *e0,
                         size_t es, int64_t nb, float *out)
{
    float acc[MX_NR];
    for (int r = 0; r < MX_NR; r++)
        acc[r] = 0.0f;
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        float prod[MX_NR][8];
        for (int r = 0; r < MX_NR; r++) {
            const uint8_t *q = q0 + r * qs, *e = e0 + r * es;
            _mm_prefetch((const char *)q + 16 * b + 4096, SHOAL_PF_WEIGHTS);
            _mm_prefetch((const char *)q + 16 * b + 4096 + 64, SHOAL_PF_WEIGHTS);
            __m256 v[8];
            for (int k = 0; k < 8; k++) {
                __m256 w[4];
                mx_block_regs(q + 16 * (b + k), w);
                v[k] = mx_block_lanes(x + 32 * (b + k), w);
            }
            const __m256i ei = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(e + b)));
            const __m256 d = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_sub_epi32(ei, _mm256_set1_epi32(1)), 23));
            _mm256_storeu_ps(prod[r], _mm256_mul_ps(d, mx_tree8x8(v)));
        }
        for (int k = 0; k < 8; k++)
            for (int r = 0; r < MX_NR; r++)
                acc[r] = acc[r] + prod[r][k];
    }
    for (int r = 0; r < MX_NR; r++) {
        for (int64_t bb = b; bb < nb; bb++) {
            __m256 w[4];
            mx_block_regs(q0 + r * qs + 16 * bb, w);
            acc[r] = acc[r] + shoal_mxfp4_d(e0[r * es + bb]) *
                              mx_tree8(mx_block_lanes(x + 32 * bb, w));
        }
        out[r] = acc[r];
    }
}

#define MX_HAVE_ROW_DOT_N
#include "quant_mxfp4_impl.h"
