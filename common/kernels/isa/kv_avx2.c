/* kv_avx2: the KV attention kernels with AVX2 and F16C (x86-64), built with
 * -mavx2 -mf16c only (no FMA).
 *
 * Same bits as the scalar reference in kv.c: one __m256 holds the eight lane
 * sums of shoal_dot_f32's canonical order; f16 elements become f32 exactly
 * through vcvtph2ps, bf16 through a 16-bit shift; products and sums are
 * separate _mm256_mul_ps / _mm256_add_ps; the tail (< 8 elements) is the
 * scalar code of kv.h on the stored lanes, and the final reduction its
 * order in registers. Speed comes from independent chains and from loading
 * each K / V element once for several queries: scores run 4 queries x 2 K
 * rows (one query: 4 rows) as eight chains, mix keeps 4 queries x 16
 * outputs (one query: 64) in eight registers while it walks the V rows. */
#include <immintrin.h>

#include "kv.h"

#define KV_INLINE static inline __attribute__((always_inline))

/* elements i .. i+7 of a row as f32 (exact) */
KV_INLINE __m256 load8(const void *row, int64_t i, enum shoal_dtype t)
{
    if (t == SHOAL_DTYPE_F32)
        return _mm256_loadu_ps((const float *)row + i);
    const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)row + i));
    if (t == SHOAL_DTYPE_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* lanes of acc + the row's tail from element i, reduced canonically */
KV_INLINE float finish(__m256 acc, const float *q, const void *row, int64_t i, int64_t n,
                       enum shoal_dtype t)
{
    float s[8], tail[8];
    _mm256_storeu_ps(s, acc);
    if (i < n)
        shoal_to_f32(tail, (const char *)row + (size_t)i * shoal_dtype_size(t), t,
                     (size_t)(n - i));
    return shoal_kv_dot_finish(s, q, tail, i, n);
}

/* shoal_dot_f32's reduction of the eight lanes, ((s0+s4)+(s2+s6)) +
 * ((s1+s5)+(s3+s7)), in registers: every sum has the scalar operands in the
 * scalar order */
KV_INLINE float reduce8(__m256 acc)
{
    const __m128 v = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    const __m128 u = _mm_add_ps(v, _mm_movehl_ps(v, v));   /* v0+v2, v1+v3 */
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)));
}

/* a[c][m] = a[c][m] + y[c] * x[m] for c < QN, m < NX: QN x NX independent
 * chains, one separate multiply and add each */
KV_INLINE void outer_add(__m256 a[4][8], const __m256 *y, const __m256 *x, const int QN,
                         const int NX)
{
#pragma GCC unroll 4
    for (int c = 0; c < QN; c++)
#pragma GCC unroll 8
        for (int m = 0; m < NX; m++)
            a[c][m] = _mm256_add_ps(a[c][m], _mm256_mul_ps(y[c], x[m]));
}

/* scores of QN queries against RN rows from row j (QN * RN <= 8 chains):
 * each K element is loaded (and converted) once for the QN queries */
KV_INLINE void scores_blk(float *s, int64_t s_ld, const float *q, int64_t q_ld,
                          const void *k, int64_t stride, int64_t j, int64_t n,
                          const int QN, const int RN, const enum shoal_dtype t)
{
    const int64_t n8 = n & ~(int64_t)7;
    const void *r[4];
    __m256 a[4][8];
#pragma GCC unroll 4
    for (int m = 0; m < RN; m++) {
        r[m] = shoal_kv_row(k, j + m, stride, t);
#pragma GCC unroll 4
        for (int c = 0; c < QN; c++)
            a[c][m] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < n8; i += 8) {
        __m256 kv[4], qv[4];
#pragma GCC unroll 4
        for (int m = 0; m < RN; m++)
            kv[m] = load8(r[m], i, t);
#pragma GCC unroll 4
        for (int c = 0; c < QN; c++)
            qv[c] = _mm256_loadu_ps(q + c * q_ld + i);
        outer_add(a, qv, kv, QN, RN);
    }
#pragma GCC unroll 4
    for (int c = 0; c < QN; c++)
#pragma GCC unroll 4
        for (int m = 0; m < RN; m++)
            s[c * s_ld + j + m] = n8 == n ? reduce8(a[c][m])
                                          : finish(a[c][m], q + c * q_ld, r[m], n8, n, t);
}

/* QN queries over all rows: RN rows at a time, then single rows */
KV_INLINE void scores_q(float *s, int64_t s_ld, const float *q, int64_t q_ld, const void *k,
                        int64_t stride, int64_t n_rows, int64_t n, const int QN,
                        const enum shoal_dtype t)
{
    const int RN = QN == 1 ? 4 : 2;
    int64_t j = 0;
    for (; j + RN <= n_rows; j += RN)
        scores_blk(s, s_ld, q, q_ld, k, stride, j, n, QN, RN, t);
    for (; j < n_rows; j++)
        scores_blk(s, s_ld, q, q_ld, k, stride, j, n, QN, 1, t);
}

/* out columns d .. d+8*CB-1 of QN queries += their p times the V rows, in
 * row order (QN * CB <= 8 accumulators, each V load used QN times) */
KV_INLINE void mix_blk(float *out, int64_t out_ld, const float *p, int64_t p_ld,
                       const void *v, int64_t stride, int64_t n_rows, int64_t d,
                       const int QN, const int CB, const enum shoal_dtype t)
{
    __m256 a[4][8];
#pragma GCC unroll 4
    for (int c = 0; c < QN; c++)
#pragma GCC unroll 8
        for (int b = 0; b < CB; b++)
            a[c][b] = _mm256_loadu_ps(out + c * out_ld + d + 8 * b);
    for (int64_t j = 0; j < n_rows; j++) {
        const void *r = shoal_kv_row(v, j, stride, t);
        __m256 x[8], pj[4];
#pragma GCC unroll 8
        for (int b = 0; b < CB; b++)
            x[b] = load8(r, d + 8 * b, t);
#pragma GCC unroll 4
        for (int c = 0; c < QN; c++)
            pj[c] = _mm256_set1_ps(p[c * p_ld + j]);
        outer_add(a, pj, x, QN, CB);
    }
#pragma GCC unroll 4
    for (int c = 0; c < QN; c++)
#pragma GCC unroll 8
        for (int b = 0; b < CB; b++)
            _mm256_storeu_ps(out + c * out_ld + d + 8 * b, a[c][b]);
}

KV_INLINE void mix_q(float *out, int64_t out_ld, const float *p, int64_t p_ld, const void *v,
                     int64_t stride, int64_t n_rows, int64_t n, const int QN,
                     const enum shoal_dtype t)
{
    const int CB = QN == 1 ? 8 : QN == 2 ? 4 : 2;
    int64_t d = 0;
    for (; d + 8 * CB <= n; d += 8 * CB)
        mix_blk(out, out_ld, p, p_ld, v, stride, n_rows, d, QN, CB, t);
    for (; d + 8 <= n; d += 8)
        mix_blk(out, out_ld, p, p_ld, v, stride, n_rows, d, QN, 1, t);
    for (int c = 0; d < n && c < QN; c++)
        shoal_kv_mix_cols_scalar(out + c * out_ld, p + c * p_ld, v, stride, n_rows, d, n, t);
}

SHOAL_KV_OPS_DEFINE(avx2)
