/* kv_avx2: the KV attention kernels with AVX2 and F16C (x86-64), built with
 * -mavx2 -mf16c only (no FMA).
 *
 * Same bits as the scalar reference in kv.c: one __m256 holds the eight lane
 * sums of shoal_dot_f32's canonical order; f16 elements become f32 exactly
 * through vcvtph2ps, bf16 through a 16-bit shift; products and sums are
 * separate _mm256_mul_ps / _mm256_add_ps; the tail (< 8 elements) and the
 * final reduction are the scalar code of kv.h on the stored lanes. Speed
 * comes from independent chains: scores run four K rows at a time, mix
 * keeps 64 outputs in eight registers while it walks the V rows. */
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

KV_INLINE void scores_t(float *s, const float *q, const void *k, int64_t stride,
                        int64_t n_rows, int64_t n, const enum shoal_dtype t)
{
    const int64_t n8 = n & ~(int64_t)7;
    int64_t j = 0;
    for (; j + 4 <= n_rows; j += 4) {
        const void *r0 = shoal_kv_row(k, j, stride, t), *r1 = shoal_kv_row(k, j + 1, stride, t);
        const void *r2 = shoal_kv_row(k, j + 2, stride, t), *r3 = shoal_kv_row(k, j + 3, stride, t);
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t i = 0; i < n8; i += 8) {
            const __m256 qv = _mm256_loadu_ps(q + i);
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(qv, load8(r0, i, t)));
            a1 = _mm256_add_ps(a1, _mm256_mul_ps(qv, load8(r1, i, t)));
            a2 = _mm256_add_ps(a2, _mm256_mul_ps(qv, load8(r2, i, t)));
            a3 = _mm256_add_ps(a3, _mm256_mul_ps(qv, load8(r3, i, t)));
        }
        s[j] = finish(a0, q, r0, n8, n, t);
        s[j + 1] = finish(a1, q, r1, n8, n, t);
        s[j + 2] = finish(a2, q, r2, n8, n, t);
        s[j + 3] = finish(a3, q, r3, n8, n, t);
    }
    for (; j < n_rows; j++) {
        const void *r = shoal_kv_row(k, j, stride, t);
        __m256 a = _mm256_setzero_ps();
        for (int64_t i = 0; i < n8; i += 8)
            a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_loadu_ps(q + i), load8(r, i, t)));
        s[j] = finish(a, q, r, n8, n, t);
    }
}

KV_INLINE void mix_t(float *out, const float *p, const void *v, int64_t stride,
                     int64_t n_rows, int64_t n, const enum shoal_dtype t)
{
    int64_t d = 0;
    for (; d + 64 <= n; d += 64) {
        __m256 a[8];
        for (int b = 0; b < 8; b++)
            a[b] = _mm256_setzero_ps();
        for (int64_t j = 0; j < n_rows; j++) {
            const __m256 pj = _mm256_set1_ps(p[j]);
            const void *r = shoal_kv_row(v, j, stride, t);
            for (int b = 0; b < 8; b++)
                a[b] = _mm256_add_ps(a[b], _mm256_mul_ps(pj, load8(r, d + 8 * b, t)));
        }
        for (int b = 0; b < 8; b++)
            _mm256_storeu_ps(out + d + 8 * b, a[b]);
    }
    for (; d + 8 <= n; d += 8) {
        __m256 a = _mm256_setzero_ps();
        for (int64_t j = 0; j < n_rows; j++)
            a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_set1_ps(p[j]),
                                               load8(shoal_kv_row(v, j, stride, t), d, t)));
        _mm256_storeu_ps(out + d, a);
    }
    if (d < n)
        shoal_kv_mix_cols_scalar(out, p, v, stride, n_rows, d, n, t);
}

SHOAL_KV_OPS_DEFINE(avx2)
