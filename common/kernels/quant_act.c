/* quant_act: the activation quantizer of INT4A8 (quant.h "Int8
 * activations"), in plain C that the compiler vectorizes.
 *
 * This file is built twice (common/meson.build): at the baseline ISA as
 * shoal_quant_act_*_base, used by the scalar and NEON tables and by the
 * reference dot, and with -mavx2 (no FMA) as shoal_quant_act_*_avx2, used by
 * the x86 SIMD tables. Every operation is an IEEE f32 division, addition,
 * comparison or an integer operation on the same elements in the same
 * order, so both builds give the same bytes; only the vector width differs.
 * (At the baseline, max|x| as an unsigned max of bit patterns takes three
 * SSE2 instructions per vector; AVX2 has vpmaxud. The baseline build ran
 * at about 11 % of a 512-token prefill.)
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "quant.h"

#ifndef ACT_SUFFIX
#define ACT_SUFFIX base
#endif
#define ACT_CAT2(a, b) a##b
#define ACT_CAT(a, b) ACT_CAT2(a, b)
#define ACT_FN(name) ACT_CAT(shoal_quant_act_##name##_, ACT_SUFFIX)

/* Quantize one group x[0..len) by the INT8 rule: *d and q[k]; returns
 * sum of q. A non-finite amax gives d = NaN and q = 0. max|x| is the max of
 * the sign-cleared bit patterns (their order is the values' order; NaN and
 * infinity are the largest), and rne(v) is (v + 1.5 * 2^23) - 1.5 * 2^23,
 * which is exactly rintf(v) for |v| < 2^22 in the default rounding mode
 * (here |v| <= 127 * (1 + 2^-23), or a few hundred when d is subnormal). */
int32_t ACT_FN(group)(const float *x, int64_t len, float *d, int8_t *q)
{
    uint32_t amax_bits = 0;
    for (int64_t k = 0; k < len; k++) {
        uint32_t u;
        memcpy(&u, &x[k], sizeof u);
        u &= 0x7fffffffu;
        amax_bits = u > amax_bits ? u : amax_bits;
    }
    float amax;
    memcpy(&amax, &amax_bits, sizeof amax);
    if (amax_bits >= 0x7f800000u) {
        *d = NAN;
        memset(q, 0, (size_t)len);
        return 0;
    }
    const float dx = amax / 127.0f;
    *d = dx;
    if (dx == 0.0f) {
        memset(q, 0, (size_t)len);
        return 0;
    }
    const float magic = 12582912.0f;   /* 1.5 * 2^23 */
    int32_t sum = 0;
    int64_t k = 0;
#ifdef __AVX2__
    /* eight at a time, the same IEEE steps (divide, add, subtract, the
     * clamps as min / max of finite values, truncation of an integral
     * value): GCC left this loop scalar (~1.7 cycles an element) */
    {
        const __m256 vd = _mm256_set1_ps(dx), vm = _mm256_set1_ps(magic);
        const __m256 hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
        __m256i vs = _mm256_setzero_si256();
        for (; k + 8 <= len; k += 8) {
            __m256 v = _mm256_sub_ps(_mm256_add_ps(_mm256_div_ps(_mm256_loadu_ps(x + k), vd), vm),
                                     vm);
            v = _mm256_max_ps(_mm256_min_ps(v, hi), lo);
            const __m256i i32 = _mm256_cvttps_epi32(v);
            vs = _mm256_add_epi32(vs, i32);
            const __m128i i16 = _mm_packs_epi32(_mm256_castsi256_si128(i32),
                                                _mm256_extracti128_si256(i32, 1));
            _mm_storel_epi64((__m128i *)(void *)(q + k), _mm_packs_epi16(i16, i16));
        }
        int32_t l[8];
        _mm256_storeu_si256((__m256i *)(void *)l, vs);
        sum = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    }
#endif
    for (; k < len; k++) {
        float v = (x[k] / dx + magic) - magic;
        v = v > 127.0f ? 127.0f : v;
        v = v < -127.0f ? -127.0f : v;
        q[k] = (int8_t)v;
        sum += q[k];
    }
    return sum;
}

#ifdef __AVX2__
/* The whole groups of one token (n_full of G elements at x) by the INT8
 * rule, the same IEEE steps as ACT_FN(group) (its amax, then d = amax /
 * 127 or NaN, then per element divide, add and subtract 1.5 * 2^23,
 * clamp, truncate), written straight into chunk order (q, zeroed), d and
 * s. Every group's amax and d first, then the divisions: no group waits
 * for the one before it, where group by group the scalar division of d
 * and the horizontal max stood between every group's divisions (about 2
 * cycles an element before, the divisions' throughput now). */
static void whole_groups_avx2(const float *x, int64_t n_full, int64_t G, int8_t *q, float *d,
                              int32_t *s)
{
    const __m256i absm = _mm256_set1_epi32(0x7fffffff);
    for (int64_t g = 0; g < n_full; g++) {
        __m256i m = _mm256_setzero_si256();
        for (int64_t k = 0; k < G; k += 8)
            m = _mm256_max_epu32(m, _mm256_and_si256(_mm256_loadu_si256(
                                                         (const __m256i *)(const void *)(x + g * G + k)),
                                                     absm));
        __m128i h = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
        h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4e));
        h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xb1));
        const uint32_t amax_bits = (uint32_t)_mm_cvtsi128_si32(h);
        float amax;
        memcpy(&amax, &amax_bits, sizeof amax);
        d[g] = amax_bits >= 0x7f800000u ? NAN : amax / 127.0f;
    }
    const __m256 vm = _mm256_set1_ps(12582912.0f);   /* 1.5 * 2^23 */
    const __m256 hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    /* 16 bytes in element order -> the 8 even ones, then the 8 odd ones */
    const __m128i eo = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    for (int64_t g = 0; g < n_full; g++) {
        const int64_t i0 = g * G;
        if (!(d[g] != 0.0f && d[g] == d[g])) {   /* zero or NaN: q stays 0 */
            s[g] = 0;
            continue;
        }
        const __m256 vd = _mm256_set1_ps(d[g]);
        /* chunk order (quant.h): G divides 128, so the group's even columns
         * are one run at qe, the odd ones at qe + 64 */
        int8_t *qe = q + (i0 - (i0 & 127)) + (i0 & 127) / 2;
        __m256i vs = _mm256_setzero_si256();
        for (int64_t k = 0; k < G; k += 16) {
            __m256i v[2];
            for (int h = 0; h < 2; h++) {
                __m256 f = _mm256_sub_ps(
                    _mm256_add_ps(_mm256_div_ps(_mm256_loadu_ps(x + i0 + k + 8 * h), vd), vm), vm);
                f = _mm256_max_ps(_mm256_min_ps(f, hi), lo);
                v[h] = _mm256_cvttps_epi32(f);
                vs = _mm256_add_epi32(vs, v[h]);
            }
            const __m128i w0 = _mm_packs_epi32(_mm256_castsi256_si128(v[0]),
                                               _mm256_extracti128_si256(v[0], 1));
            const __m128i w1 = _mm_packs_epi32(_mm256_castsi256_si128(v[1]),
                                               _mm256_extracti128_si256(v[1], 1));
            const __m128i b = _mm_shuffle_epi8(_mm_packs_epi16(w0, w1), eo);
            _mm_storel_epi64((__m128i *)(void *)(qe + k / 2), b);
            _mm_storel_epi64((__m128i *)(void *)(qe + 64 + k / 2), _mm_unpackhi_epi64(b, b));
        }
        int32_t l[8];
        _mm256_storeu_si256((__m256i *)(void *)l, vs);
        s[g] = 8 * (((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])));
    }
}
#endif

void ACT_FN(quantize)(struct shoal_quant_act *a, const float *x, int64_t n_tok)
{
    const int64_t n = a->n, G = a->group;
    int8_t qg[128];
    for (int64_t t = 0; t < n_tok; t++) {
        int8_t *q = a->q + t * a->q_stride;
        float *d = a->d + t * a->n_group;
        int32_t *s = a->s + t * a->n_group;
        memset(q, 0, (size_t)a->q_stride);
        int64_t i0 = 0, g = 0;
#ifdef __AVX2__
        /* G is 32, 64 or 128: the whole groups eight elements at a time */
        whole_groups_avx2(x + t * n, n / G, G, q, d, s);
        g = n / G;
        i0 = g * G;
#endif
        for (; i0 < n; i0 += G, g++) {
            const int64_t len = n - i0 < G ? n - i0 : G;
            s[g] = 8 * ACT_FN(group)(x + t * n + i0, len, &d[g], qg);
            /* chunk order (quant.h): per 128 columns the even ones, then
             * the odd ones; G is even and divides 128, so a group's columns
             * are one run of each */
            int8_t *qe = q + (i0 - (i0 & 127)) + (i0 & 127) / 2;
            int8_t *qo = qe + 64;
            for (int64_t k = 0; 2 * k < len; k++)
                qe[k] = qg[2 * k];
            for (int64_t k = 0; 2 * k + 1 < len; k++)
                qo[k] = qg[2 * k + 1];
        }
    }
}
