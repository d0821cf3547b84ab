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
#include <math.h>

#include "kernels.h"
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

/* ---- softmax ---------------------------------------------------------------
 * shoal_expf of 4 floats at a time, its double steps one for one (built
 * without FMA): z = x * 32/ln2, k by the 1.5 * 2^52 rounding trick (the
 * integer k is the low bits of z + 1.5 * 2^52), y = (z - k) * ln2/32,
 * Horner's degree-5 polynomial, (2^(j/32) * p) * 2^e with k = 32 e + j
 * (2^e's exponent field is (k - j) << 47 plus 1023 << 52), one rounding to
 * f32; NaN, > 128 and < -128 blended in last as the scalar returns them. */
KV_INLINE __m128 exp4(__m128 xf)
{
    const __m256d x = _mm256_cvtps_pd(xf);
    const __m256d z = _mm256_mul_pd(x, _mm256_set1_pd(0x1.71547652b82fep+5));
    const __m256d zm = _mm256_add_pd(z, _mm256_set1_pd(0x1.8p52));
    const __m256d kd = _mm256_sub_pd(zm, _mm256_set1_pd(0x1.8p52));
    const __m256d y = _mm256_mul_pd(_mm256_sub_pd(z, kd), _mm256_set1_pd(0x1.62e42fefa39efp-6));
    __m256d p = _mm256_add_pd(_mm256_set1_pd(1.0 / 24.0),
                              _mm256_mul_pd(y, _mm256_set1_pd(1.0 / 120.0)));
    p = _mm256_add_pd(_mm256_set1_pd(1.0 / 6.0), _mm256_mul_pd(y, p));
    p = _mm256_add_pd(_mm256_set1_pd(0.5), _mm256_mul_pd(y, p));
    p = _mm256_add_pd(_mm256_set1_pd(1.0), _mm256_mul_pd(y, p));
    p = _mm256_add_pd(_mm256_set1_pd(1.0), _mm256_mul_pd(y, p));
    const __m256i k = _mm256_sub_epi64(_mm256_castpd_si256(zm),
                                       _mm256_castpd_si256(_mm256_set1_pd(0x1.8p52)));
    const __m256i j = _mm256_and_si256(k, _mm256_set1_epi64x(31));
    const __m256i e = _mm256_add_epi64(_mm256_slli_epi64(_mm256_sub_epi64(k, j), 47),
                                       _mm256_set1_epi64x((int64_t)1023 << 52));
    const __m256d tj = _mm256_i64gather_pd(shoal_exp2_j32, j, 8);
    const __m128 r = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_mul_pd(tj, p),
                                                   _mm256_castsi256_pd(e)));
    const __m128 big = _mm_cmpgt_ps(xf, _mm_set1_ps(128.0f));
    const __m128 small = _mm_cmplt_ps(xf, _mm_set1_ps(-128.0f));
    const __m128 nan = _mm_cmpunord_ps(xf, xf);
    __m128 o = _mm_blendv_ps(r, _mm_set1_ps(INFINITY), big);
    o = _mm_andnot_ps(small, o);
    return _mm_blendv_ps(o, _mm_add_ps(xf, xf), nan);
}

/* shoal_kv_softmax_scalar's bits: the divisions, the max (vmaxps(x, m) is
 * x > m ? x : m, the scalar's test: a NaN never taken; lanes that tie at
 * +0 and -0 may keep the other zero, which changes no x - max) and the
 * exponentials 8 elements at a time, each row's sum in element order with
 * 8 rows' chains interleaved, then the divisions by the sums */
static void softmax_avx2(float *sc, int64_t ld, int64_t n_rows, int64_t n, float div,
                         const float *sinks)
{
    const int64_t n8 = n & ~(int64_t)7;
    for (int64_t r0 = 0; r0 < n_rows; r0 += 8) {
        const int nr = n_rows - r0 < 8 ? (int)(n_rows - r0) : 8;
        float mx[8], sum[8];
        for (int r = 0; r < nr; r++) {
            float *s = sc + (r0 + r) * ld;
            const __m256 vd = _mm256_set1_ps(div);
            __m256 vm = _mm256_set1_ps(-INFINITY);
            for (int64_t j = 0; j < n8; j += 8) {
                const __m256 x = _mm256_div_ps(_mm256_loadu_ps(s + j), vd);
                _mm256_storeu_ps(s + j, x);
                vm = _mm256_max_ps(x, vm);
            }
            float m = sinks ? sinks[r0 + r] : -INFINITY, lane[8];
            _mm256_storeu_ps(lane, vm);
            for (int l = 0; l < 8; l++)
                if (lane[l] > m)
                    m = lane[l];
            for (int64_t j = n8; j < n; j++) {
                s[j] = s[j] / div;
                if (s[j] > m)
                    m = s[j];
            }
            mx[r] = m;
            const __m256 vx = _mm256_set1_ps(m);
            for (int64_t j = 0; j < n8; j += 8) {
                const __m256 x = _mm256_sub_ps(_mm256_loadu_ps(s + j), vx);
                _mm256_storeu_ps(s + j, _mm256_set_m128(exp4(_mm256_extractf128_ps(x, 1)),
                                                        exp4(_mm256_castps256_ps128(x))));
            }
            for (int64_t j = n8; j < n; j++)
                s[j] = shoal_expf(s[j] - m);
            sum[r] = 0.0f;
        }
        for (int64_t j = 0; j < n; j++)   /* nr independent chains, each in j order */
            for (int r = 0; r < nr; r++)
                sum[r] += sc[(r0 + r) * ld + j];
        for (int r = 0; r < nr; r++) {
            float *s = sc + (r0 + r) * ld;
            if (sinks)
                sum[r] += shoal_expf(sinks[r0 + r] - mx[r]);
            const __m256 vs = _mm256_set1_ps(sum[r]);
            for (int64_t j = 0; j < n8; j += 8)
                _mm256_storeu_ps(s + j, _mm256_div_ps(_mm256_loadu_ps(s + j), vs));
            for (int64_t j = n8; j < n; j++)
                s[j] = s[j] / sum[r];
        }
    }
}

SHOAL_KV_OPS_DEFINE(avx2, softmax_avx2)
