/* quant_avx2: the quant kernels with AVX2 (x86-64), built with -mavx2 only.
 *
 * Same bits as the scalar reference in quant.c: one __m256 holds the eight
 * lane sums s[0..7] of quant.h's canonical order, products and sums use
 * separate _mm256_mul_ps / _mm256_add_ps (never FMA; this file is not built
 * with -mfma and the project uses -ffp-contract=off), quants become f32
 * exactly through _mm256_cvtepi32_ps of sign-extended integers, and the
 * horizontal sum reproduces ((s0+s4)+(s2+s6))+((s1+s5)+(s3+s7)) with the
 * same operand order. A group's tail (< 8 elements, only in the last group)
 * is finished in scalar on the stored lanes.
 *
 * Speed comes from independent add chains, never from reordering one: the
 * matvec runs four rows at a time (prefetching the next four) and the
 * batched path four tokens at a time against a group unpacked once to f32.
 * On CPUs with AVX-512 VBMI, quant_avx512.c takes over the int4 matvec. */
#include <immintrin.h>
#include <string.h>

#include "ggml_dot.h"
#include "prefetch_x86.h"
#include "quant.h"

#define QUANT_GROUP_MAX 128
#define ROW_TILE 16     /* rows whose groups are reused across token blocks */

/* 8 int8 quants -> 8 f32 (exact) */
static inline __m256 q8x8(const int8_t *p)
{
    const __m128i b = _mm_loadl_epi64((const __m128i *)(const void *)p);
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}

/* 16 packed bytes -> 32 signed int4 values as int8, element order */
static inline void q4_unpack16(__m128i b, __m128i *e0_15, __m128i *e16_31)
{
    const __m128i m = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    const __m128i lo = _mm_and_si128(b, m);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    *e0_15 = _mm_sub_epi8(_mm_unpacklo_epi8(lo, hi), eight);
    *e16_31 = _mm_sub_epi8(_mm_unpackhi_epi8(lo, hi), eight);
}

static inline __m256 i8x8_to_f32(__m128i v)   /* low 8 bytes of v */
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
}

/* 32 int4 quants (16 bytes) -> 4 x 8 f32 */
static inline void q4x32(const uint8_t *p, __m256 v[4])
{
    __m128i a, b;
    q4_unpack16(_mm_loadu_si128((const __m128i *)(const void *)p), &a, &b);
    v[0] = i8x8_to_f32(a);
    v[1] = i8x8_to_f32(_mm_srli_si128(a, 8));
    v[2] = i8x8_to_f32(b);
    v[3] = i8x8_to_f32(_mm_srli_si128(b, 8));
}

/* 8 int4 quants (4 bytes) -> 8 f32 */
static inline __m256 q4x8(const uint8_t *p)
{
    int32_t u;
    memcpy(&u, p, sizeof u);
    __m128i a, b;
    q4_unpack16(_mm_cvtsi32_si128(u), &a, &b);
    (void)b;
    return i8x8_to_f32(a);
}

static inline int q4_at(const uint8_t *p, int64_t k)
{
    return (int)((p[k / 2] >> (4 * (k & 1))) & 0x0f) - 8;
}

/* ((s0+s4)+(s2+s6))+((s1+s5)+(s3+s7)), operands in the scalar order */
static inline float hsum8(__m256 s)
{
    const __m128 v = _mm_add_ps(_mm256_castps256_ps128(s),
                                _mm256_extractf128_ps(s, 1));  /* s0+s4 .. s3+s7 */
    const __m128 w = _mm_add_ps(v, _mm_movehl_ps(v, v));       /* v0+v2, v1+v3 */
    return _mm_cvtss_f32(_mm_add_ss(w, _mm_movehdup_ps(w)));   /* w0+w1 */
}

/* hsum8 of four chains at once, chain r in lane r (same operations) */
static inline __m128 hsum8x4(__m256 a, __m256 b, __m256 c, __m256 d)
{
    __m128 va = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 vb = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
    __m128 vc = _mm_add_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
    __m128 vd = _mm_add_ps(_mm256_castps256_ps128(d), _mm256_extractf128_ps(d, 1));
    _MM_TRANSPOSE4_PS(va, vb, vc, vd);   /* va = every chain's v0, ..., vd = v3 */
    return _mm_add_ps(_mm_add_ps(va, vc), _mm_add_ps(vb, vd));
}

static inline float tree8(const float s[8])
{
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

static inline __m256 madd(__m256 s, __m256 x, __m256 q)
{
    return _mm256_add_ps(s, _mm256_mul_ps(x, q));
}

static inline float scale_at(const void *row, int64_t g)
{
    float d;
    memcpy(&d, (const uint8_t *)row + 4 * (size_t)g, sizeof d);
    return d;
}

/* ---- one row, one token ---------------------------------------------------- */

static float group_q8(const float *x, const int8_t *q, int64_t len)
{
    __m256 s = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= len; k += 8)
        s = madd(s, _mm256_loadu_ps(x + k), q8x8(q + k));
    if (k == len)
        return hsum8(s);
    float l[8];
    _mm256_storeu_ps(l, s);
    for (int j = 0; k + j < len; j++)
        l[j] += x[k + j] * (float)q[k + j];
    return tree8(l);
}

static float group_q4(const float *x, const uint8_t *p, int64_t len)
{
    __m256 s = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= len; k += 32) {
        __m256 v[4];
        q4x32(p + k / 2, v);
        s = madd(s, _mm256_loadu_ps(x + k), v[0]);
        s = madd(s, _mm256_loadu_ps(x + k + 8), v[1]);
        s = madd(s, _mm256_loadu_ps(x + k + 16), v[2]);
        s = madd(s, _mm256_loadu_ps(x + k + 24), v[3]);
    }
    for (; k + 8 <= len; k += 8)
        s = madd(s, _mm256_loadu_ps(x + k), q4x8(p + k / 2));
    if (k == len)
        return hsum8(s);
    float l[8];
    _mm256_storeu_ps(l, s);
    for (int j = 0; k + j < len; j++)
        l[j] += x[k + j] * (float)q4_at(p, k + j);
    return tree8(l);
}

static float dot_avx2(enum shoal_quant_type type, int group, const float *x,
                      const void *row, int64_t n)
{
    const uint8_t *qs = shoal_quant_row_qs(row, n, group);
    float acc = 0.0f;
    for (int64_t i0 = 0, g = 0; i0 < n; i0 += group, g++) {
        const int64_t len = n - i0 < group ? n - i0 : group;
        const float gs = type == SHOAL_QUANT_INT8
                             ? group_q8(x + i0, (const int8_t *)qs + i0, len)
                             : group_q4(x + i0, qs + i0 / 2, len);
        acc += scale_at(row, g) * gs;
    }
    return acc;
}

/* ---- four rows, one token (matvec) ---------------------------------------- */

/* Full groups only (len == G, a multiple of 32): four independent chains,
 * row r's group sum in lane r. */
static __m128 group4_q8(const float *x, const int8_t *const q[4], int64_t len)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (int64_t k = 0; k < len; k += 8) {
        const __m256 xv = _mm256_loadu_ps(x + k);
        s0 = madd(s0, xv, q8x8(q[0] + k));
        s1 = madd(s1, xv, q8x8(q[1] + k));
        s2 = madd(s2, xv, q8x8(q[2] + k));
        s3 = madd(s3, xv, q8x8(q[3] + k));
    }
    return hsum8x4(s0, s1, s2, s3);
}

static __m128 group4_q4(const float *x, const uint8_t *const p[4], int64_t len)
{
    __m256 s[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t k = 0; k < len; k += 32) {
        const __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
        const __m256 x2 = _mm256_loadu_ps(x + k + 16), x3 = _mm256_loadu_ps(x + k + 24);
        for (int r = 0; r < 4; r++) {
            __m256 v[4];
            q4x32(p[r] + k / 2, v);
            s[r] = madd(s[r], x0, v[0]);
            s[r] = madd(s[r], x1, v[1]);
            s[r] = madd(s[r], x2, v[2]);
            s[r] = madd(s[r], x3, v[3]);
        }
    }
    return hsum8x4(s[0], s[1], s[2], s[3]);
}

static void dot4_rows(enum shoal_quant_type type, int group, const float *x,
                      const uint8_t *const row[4], int64_t n, float out[4])
{
    const uint8_t *qs[4];
    for (int r = 0; r < 4; r++)
        qs[r] = shoal_quant_row_qs(row[r], n, group);
    /* full groups: acc[r] = acc[r] + d[r] * gsum[r], one lane per row */
    __m128 acc = _mm_setzero_ps();
    int64_t i0 = 0, g = 0;
    for (; i0 + group <= n; i0 += group, g++) {
        __m128 gs;
        if (type == SHOAL_QUANT_INT8) {
            const int8_t *q[4] = {(const int8_t *)qs[0] + i0, (const int8_t *)qs[1] + i0,
                                  (const int8_t *)qs[2] + i0, (const int8_t *)qs[3] + i0};
            gs = group4_q8(x + i0, q, group);
        } else {
            const uint8_t *p[4] = {qs[0] + i0 / 2, qs[1] + i0 / 2, qs[2] + i0 / 2,
                                   qs[3] + i0 / 2};
            gs = group4_q4(x + i0, p, group);
        }
        const __m128 d = _mm_setr_ps(scale_at(row[0], g), scale_at(row[1], g),
                                     scale_at(row[2], g), scale_at(row[3], g));
        acc = _mm_add_ps(acc, _mm_mul_ps(d, gs));
    }
    _mm_storeu_ps(out, acc);
    if (i0 == n)
        return;
    /* the partial last group, row by row */
    for (int r = 0; r < 4; r++) {
        const float gs = type == SHOAL_QUANT_INT8
                             ? group_q8(x + i0, (const int8_t *)qs[r] + i0, n - i0)
                             : group_q4(x + i0, qs[r] + i0 / 2, n - i0);
        out[r] += scale_at(row[r], g) * gs;
    }
}

/* ---- one row, four tokens (batched): groups unpacked once to f32 ---------- */

/* q[0..len) as exact f32 values */
static void unpack_group(enum shoal_quant_type type, const uint8_t *qs,
                         int64_t i0, int64_t len, float *qf)
{
    int64_t k = 0;
    if (type == SHOAL_QUANT_INT8) {
        const int8_t *q = (const int8_t *)qs + i0;
        for (; k + 8 <= len; k += 8)
            _mm256_storeu_ps(qf + k, q8x8(q + k));
        for (; k < len; k++)
            qf[k] = (float)q[k];
    } else {
        const uint8_t *p = qs + i0 / 2;
        for (; k + 8 <= len; k += 8)
            _mm256_storeu_ps(qf + k, q4x8(p + k / 2));
        for (; k < len; k++)
            qf[k] = (float)q4_at(p, k);
    }
}

static float group_f(const float *x, const float *qf, int64_t len)
{
    __m256 s = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= len; k += 8)
        s = madd(s, _mm256_loadu_ps(x + k), _mm256_loadu_ps(qf + k));
    if (k == len)
        return hsum8(s);
    float l[8];
    _mm256_storeu_ps(l, s);
    for (int j = 0; k + j < len; j++)
        l[j] += x[k + j] * qf[k + j];
    return tree8(l);
}

/* four tokens x[t] (each at its group offset) against one unpacked group,
 * token t's group sum in lane t */
static __m128 group4_f(const float *const x[4], const float *qf, int64_t len)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t k = 0;
    for (; k + 8 <= len; k += 8) {
        const __m256 q = _mm256_loadu_ps(qf + k);
        s0 = madd(s0, _mm256_loadu_ps(x[0] + k), q);
        s1 = madd(s1, _mm256_loadu_ps(x[1] + k), q);
        s2 = madd(s2, _mm256_loadu_ps(x[2] + k), q);
        s3 = madd(s3, _mm256_loadu_ps(x[3] + k), q);
    }
    if (k == len)
        return hsum8x4(s0, s1, s2, s3);
    const __m256 sv[4] = {s0, s1, s2, s3};
    float gs[4];
    for (int t = 0; t < 4; t++) {
        float l[8];
        _mm256_storeu_ps(l, sv[t]);
        for (int j = 0; k + j < len; j++)
            l[j] += x[t][k + j] * qf[k + j];
        gs[t] = tree8(l);
    }
    return _mm_loadu_ps(gs);
}

/* y[t][r] for tokens t0 .. t0+nt-1 of one row, nt == 4 or 1 */
static void row_tokens(float *y, const float *x, int64_t t0, int64_t nt,
                       const struct shoal_quant_weight *w, int64_t r,
                       const uint8_t *row)
{
    const int64_t n = w->cols;
    const int group = w->group;
    const uint8_t *qs = shoal_quant_row_qs(row, n, group);
    float qf[QUANT_GROUP_MAX];
    __m128 acc4 = _mm_setzero_ps();   /* nt == 4: token t in lane t */
    float acc = 0.0f;                 /* nt == 1 */
    for (int64_t i0 = 0, g = 0; i0 < n; i0 += group, g++) {
        const int64_t len = n - i0 < group ? n - i0 : group;
        const float d = scale_at(row, g);
        unpack_group(w->type, qs, i0, len, qf);
        if (nt == 4) {
            const float *xt[4] = {x + t0 * n + i0, x + (t0 + 1) * n + i0,
                                  x + (t0 + 2) * n + i0, x + (t0 + 3) * n + i0};
            acc4 = _mm_add_ps(acc4, _mm_mul_ps(_mm_set1_ps(d), group4_f(xt, qf, len)));
        } else {
            acc += d * group_f(x + t0 * n + i0, qf, len);
        }
    }
    if (nt == 4) {
        float out[4];
        _mm_storeu_ps(out, acc4);
        for (int64_t t = 0; t < 4; t++)
            y[(t0 + t) * w->rows + r] = out[t];
    } else {
        y[t0 * w->rows + r] = acc;
    }
}

static void linear_rows_avx2(float *y, const float *x, int64_t n_tok,
                             const struct shoal_quant_weight *w, int64_t r0,
                             int64_t r1)
{
    const size_t row_bytes = shoal_quant_row_bytes(w->type, w->cols, w->group);
    const uint8_t *base = w->data;
    if (n_tok < 4) {
        /* decode: stream the weights once per token, four rows at a time */
        for (int64_t t = 0; t < n_tok; t++) {
            const float *xt = x + t * w->cols;
            int64_t r = r0;
            for (; r + 4 <= r1; r += 4) {
                /* the next four rows (back to back), ahead of the hardware
                 * prefetcher, which loses track of four row streams: 1.3x
                 * on weights in RAM (bench/kernel_bench) */
                if (t == 0 && r + 8 <= r1)
                    for (size_t o = 0; o < 4 * row_bytes; o += 64)
                        _mm_prefetch((const char *)base + (size_t)(r + 4) * row_bytes + o,
                                     SHOAL_PF_WEIGHTS);
                const uint8_t *rows[4] = {base + (size_t)r * row_bytes,
                                          base + (size_t)(r + 1) * row_bytes,
                                          base + (size_t)(r + 2) * row_bytes,
                                          base + (size_t)(r + 3) * row_bytes};
                float out[4];
                dot4_rows(w->type, w->group, xt, rows, w->cols, out);
                for (int j = 0; j < 4; j++)
                    y[t * w->rows + r + j] = out[j];
            }
            for (; r < r1; r++)
                y[t * w->rows + r] = dot_avx2(w->type, w->group, xt,
                                              base + (size_t)r * row_bytes, w->cols);
        }
        return;
    }
    /* batch: tiles of ROW_TILE rows x all tokens, four tokens at a time */
    for (int64_t rt = r0; rt < r1; rt += ROW_TILE) {
        const int64_t rt1 = rt + ROW_TILE < r1 ? rt + ROW_TILE : r1;
        int64_t t = 0;
        for (; t + 4 <= n_tok; t += 4)
            for (int64_t r = rt; r < rt1; r++)
                row_tokens(y, x, t, 4, w, r, base + (size_t)r * row_bytes);
        for (; t < n_tok; t++)
            for (int64_t r = rt; r < rt1; r++)
                row_tokens(y, x, t, 1, w, r, base + (size_t)r * row_bytes);
    }
}

/* ---- INT4A8 (quant.h): the AVX-512 scheme on 64-column halves ------------
 * (quant_avx512.c explains it). A 32-byte load is 64 columns; its low
 * nibbles are the even columns, found at the activation chunk's 32 * half,
 * its high nibbles the odd ones at 64 + 32 * half. A decode token runs 8
 * rows side by side (rows8_a8 below), a batch of tokens 8 rows transposed
 * (rows8_many_a8); the rows left over, fewer than 8, take a row's group
 * sums from vphaddd trees (groups8). A partial last half
 * (width not a multiple of 64) goes through a zeroed copy. Exact integers,
 * the f32 combine in group order: the scalar table's bits. */

#define A8_PF 16384

/* An 8 x 8 transpose of dwords: r[j] lane i = the old r[i] lane j. */
static inline void transpose8_epi32(__m256i r[8])
{
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(_mm256_castsi256_ps(r[i]), _mm256_castsi256_ps(r[i + 1]));
        t[i + 1] = _mm256_unpackhi_ps(_mm256_castsi256_ps(r[i]), _mm256_castsi256_ps(r[i + 1]));
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    /* u[k] (k < 4) holds rows 0..3 of column k in its low lane and columns
     * 4+k in its high lane; u[4+k] rows 4..7 */
    for (int k = 0; k < 4; k++) {
        r[k] = _mm256_castps_si256(_mm256_permute2f128_ps(u[k], u[4 + k], 0x20));
        r[4 + k] = _mm256_castps_si256(_mm256_permute2f128_ps(u[k], u[4 + k], 0x31));
    }
}

/* The int32 lane sums of half hh of one row (64 columns: lane l = the sum
 * over its 8 columns of nibble * activation); 0 past the row's nh halves.
 * A partial last half goes through a zeroed copy (the activation's columns
 * past the row are 0). */
static inline __attribute__((always_inline)) __m256i
half_sums(const uint8_t *qs, const int8_t *q, int64_t hh, int64_t nh, int tail, int prefetch)
{
    if (hh >= nh)
        return _mm256_setzero_si256();
    const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const uint8_t *p = qs + 32 * (size_t)hh;
    if (prefetch && (hh & 1) == 0)
        _mm_prefetch((const char *)p + A8_PF, SHOAL_PF_WEIGHTS);
    __m256i b;
    if (hh == nh - 1 && tail < 32) {
        uint8_t buf[32] = {0};
        memcpy(buf, p, (size_t)tail);
        b = _mm256_loadu_si256((const __m256i *)(const void *)buf);
    } else {
        b = _mm256_loadu_si256((const __m256i *)(const void *)p);
    }
    const __m256i lo = _mm256_and_si256(b, m4);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
    const int8_t *e = q + 128 * (hh >> 1) + 32 * (hh & 1);
    const __m256i s16 = _mm256_add_epi16(
        _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(const void *)e)),
        _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(const void *)(e + 64))));
    return _mm256_madd_epi16(s16, ones);
}

/* The 8 group sums of HP half-sum vectors v (HP = 8 * G / 64 halves; lane
 * l of half c is its columns 8l .. 8l+7, so a group is 4 lanes (G=32), a
 * half (64) or two halves (128)), in group order. Exact integer sums in
 * any order; the reduction is vphaddd without a vpermq after each level
 * (the earlier tree's), with one cross-lane fix-up at the end: 4
 * instructions per 4 halves at G=32 (6 before), 9 per 8 at G=64 (14), 17
 * per 16 at G=128 (30). */
static inline __attribute__((always_inline)) __m256i groups8_reduce(__m256i v[16], const int HP)
{
    if (HP == 4) {
        /* g: low = each half's lanes 0-3 (groups 2c), high = lanes 4-7 (2c+1) */
        const __m256i g = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]),
                                            _mm256_hadd_epi32(v[2], v[3]));
        return _mm256_permutevar8x32_epi32(g, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    }
    if (HP == 16)
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            v[k] = _mm256_add_epi32(v[2 * k], v[2 * k + 1]);   /* one group per vector */
    /* 8 vectors, one group each: g0 low = lanes 0-3 of v0..v3, high = lanes
     * 4-7 of v0..v3; g1 likewise for v4..v7 */
    const __m256i g0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]),
                                         _mm256_hadd_epi32(v[2], v[3]));
    const __m256i g1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]),
                                         _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(g0, g1, 0x20),
                            _mm256_permute2x128_si256(g0, g1, 0x31));
}

/* groups8_reduce over the halves h0 .. h0+HP-1, any of which may be past
 * the row or partial (half_sums' checks) */
static inline __attribute__((always_inline)) __m256i
groups8(const uint8_t *qs, const int8_t *q, int64_t h0, const int HP, int64_t nh, int tail,
        int prefetch)
{
    __m256i v[16];
#pragma GCC unroll 16
    for (int c = 0; c < HP; c++)
        v[c] = half_sums(qs, q, h0 + c, nh, tail, prefetch);
    return groups8_reduce(v, HP);
}

/* ---- INT4A8 matvec: 8 rows side by side, lanes are rows ------------------
 * A block of 8 rows advances group by group. For each group, each row's
 * 16-bit partial sums (s16: word m = the group's columns 4m .. 4m+3 of one
 * half, nibble * activation, |word| <= 4 * 15 * 127 = 7620) are reduced
 * ACROSS the 8 rows by vphaddw / vpmaddwd trees whose last step leaves lane
 * i = row i's exact group sum, so the f32 chains acc + (d * dx) *
 * (float)(isum - sx) of the 8 rows advance one lane each in group order
 * (the scalar chain's operations) with no transpose of the sums. 16-bit
 * levels stay below 2^15: two vphaddw levels over 7620 (G=32, 64) reach
 * 30480; G=128 adds its two halves first (15240) and takes one. Exact
 * integers, the scalar table's bits. */

/* s16 of one half at p against its activation chunk, loaded: e0 = the
 * chunk's evens, e1 its odds */
static inline __attribute__((always_inline)) __m256i half_s16_e(const uint8_t *p, __m256i e0,
                                                                __m256i e1)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)p);
    const __m256i lo = _mm256_and_si256(b, m4);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
    return _mm256_add_epi16(_mm256_maddubs_epi16(lo, e0), _mm256_maddubs_epi16(hi, e1));
}

/* half_s16_e with the chunk at e (evens at e, odds at e + 64) */
static inline __attribute__((always_inline)) __m256i half_s16(const uint8_t *p, const int8_t *e)
{
    return half_s16_e(p, _mm256_loadu_si256((const __m256i *)(const void *)e),
                      _mm256_loadu_si256((const __m256i *)(const void *)(e + 64)));
}

/* half_s16 of half hh of a row whose quants are qs (nh halves, the last of
 * tail bytes): a partial last half goes through a zeroed copy (the
 * activation's columns past the row are 0), a half past the row is 0. */
static inline __attribute__((always_inline)) __m256i
half_s16_at(const uint8_t *qs, const int8_t *q, int64_t hh, int64_t nh, int tail)
{
    const int8_t *e = q + 128 * (hh >> 1) + 32 * (hh & 1);
    if (hh < nh - 1 || (hh == nh - 1 && tail == 32))
        return half_s16(qs + 32 * (size_t)hh, e);
    if (hh >= nh)
        return _mm256_setzero_si256();
    _Alignas(32) uint8_t buf[32] = {0};
    memcpy(buf, qs + 32 * (size_t)hh, (size_t)tail);
    return half_s16(buf, e);
}

/* Two vphaddw levels over 8 s16 vectors: per 128-bit lane, words 2k and
 * 2k+1 are partial sums of vector k (low lane: vectors 0-3 of x[0..3],
 * then of x[4..7] in *hi) */
static inline __attribute__((always_inline)) void hadd16x8(const __m256i x[8], __m256i *lo,
                                                           __m256i *hi)
{
    *lo = _mm256_hadd_epi16(_mm256_hadd_epi16(x[0], x[1]), _mm256_hadd_epi16(x[2], x[3]));
    *hi = _mm256_hadd_epi16(_mm256_hadd_epi16(x[4], x[5]), _mm256_hadd_epi16(x[6], x[7]));
}

/* G=64 (one half per group) and G=128 (two): lane i = row i's sum of x[i]'s
 * 16 words (|word| <= 15240) */
static inline __attribute__((always_inline)) __m256i rows8_sum(const __m256i x[8], const int G)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i m0, m1;
    if (G == 64) {
        __m256i k0, k1;
        hadd16x8(x, &k0, &k1);                     /* |word| <= 30480 */
        m0 = _mm256_madd_epi16(k0, ones);          /* lane: rows 0-3 (this lane's half) */
        m1 = _mm256_madd_epi16(k1, ones);          /* rows 4-7 */
    } else {
        __m256i h[4];
        for (int k = 0; k < 4; k++)                /* |word| <= 30480 */
            h[k] = _mm256_madd_epi16(_mm256_hadd_epi16(x[2 * k], x[2 * k + 1]), ones);
        m0 = _mm256_hadd_epi32(h[0], h[1]);
        m1 = _mm256_hadd_epi32(h[2], h[3]);
    }
    return _mm256_add_epi32(_mm256_permute2x128_si256(m0, m1, 0x20),
                            _mm256_permute2x128_si256(m0, m1, 0x31));
}

/* G=32 (two groups per half, words 0-7 and 8-15): *ga lane i = row i's
 * first group, *gb its second */
static inline __attribute__((always_inline)) void rows8_sum2(const __m256i x[8], __m256i *ga,
                                                             __m256i *gb)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i k0, k1;
    hadd16x8(x, &k0, &k1);
    const __m256i m0 = _mm256_madd_epi16(k0, ones), m1 = _mm256_madd_epi16(k1, ones);
    *ga = _mm256_permute2x128_si256(m0, m1, 0x20);
    *gb = _mm256_permute2x128_si256(m0, m1, 0x31);
}

/* One chain step: acc + (d * dx) * (float)(isum - sx), lanes = rows */
static inline __attribute__((always_inline)) __m256 chain8(__m256 acc, __m256i isum, __m256 d,
                                                           float dx, int32_t sx)
{
    const __m256 f = _mm256_cvtepi32_ps(_mm256_sub_epi32(isum, _mm256_set1_epi32(sx)));
    return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(d, _mm256_set1_ps(dx)), f));
}

/* The scales of groups g0 .. g0+7 of the 8 rows at base, transposed: dd[j]
 * lane i = row i's d[g0 + j]. Lanes of groups past n_group are never used:
 * they hold the row's next bytes (its quants) when those 32 bytes lie
 * inside the row, else 0. */
static inline __attribute__((always_inline)) void scales8(__m256 dd[8], const uint8_t *base,
                                                          size_t row_bytes, int64_t g0,
                                                          int64_t n_group)
{
    __m256i v[8];
    for (int i = 0; i < 8; i++) {
        const uint8_t *p = base + (size_t)i * row_bytes + 4 * (size_t)g0;
        if (4 * (size_t)(g0 + 8) <= row_bytes) {
            v[i] = _mm256_loadu_si256((const __m256i *)(const void *)p);
        } else {
            _Alignas(32) float buf[8] = {0};
            memcpy(buf, p, (size_t)(n_group - g0) * sizeof(float));
            v[i] = _mm256_load_si256((const __m256i *)(const void *)buf);
        }
    }
    transpose8_epi32(v);
    for (int j = 0; j < 8; j++)
        dd[j] = _mm256_castsi256_ps(v[j]);
}

/* The s16 of group g (G=64, 128) or of the half holding groups g, g+1
 * (G=32) for the 8 rows qs[] into x[] (half_s16_at's checks) */
static inline __attribute__((always_inline)) void
group_s16x8(__m256i x[8], const uint8_t *const qs[8], const int8_t *q, int64_t g, int64_t nh,
            int tail, const int G)
{
    const int64_t hh = G == 32 ? g / 2 : G == 64 ? g : 2 * g;
    for (int i = 0; i < 8; i++) {
        x[i] = half_s16_at(qs[i], q, hh, nh, tail);
        if (G == 128)                              /* |word| <= 15240 */
            x[i] = _mm256_add_epi16(x[i], half_s16_at(qs[i], q, hh + 1, nh, tail));
    }
}

/* One group step of rows8_a8 whose halves may be partial or past the row
 * (the last groups; rows8_step_whole runs the others): group g (G=32:
 * groups g and g+1 when j + 1 < cnt) into the chains acc */
static inline __attribute__((always_inline)) __m256
rows8_step(__m256 acc, const uint8_t *const qs[8], const int8_t *q, const float *dx,
           const int32_t *sx, const __m256 dd[8], int64_t g0, int j, int cnt, int64_t nh,
           int tail, const int G)
{
    const int64_t g = g0 + j;
    __m256i x[8];
    group_s16x8(x, qs, q, g, nh, tail, G);
    if (G == 32) {
        __m256i ga, gb;
        rows8_sum2(x, &ga, &gb);
        acc = chain8(acc, ga, dd[j], dx[g], sx[g]);
        if (j + 1 < cnt)
            acc = chain8(acc, gb, dd[j + 1], dx[g + 1], sx[g + 1]);
        return acc;
    }
    return chain8(acc, rows8_sum(x, G), dd[j], dx[g], sx[g]);
}

/* One whole group step of rows8_a8 (no checks: every half inside its row):
 * the 8 rows are p, p + rb, p + 2 rb, p + r3 and p4 likewise (p: row 0's
 * quants at half hh; r3 = 3 rb), so the addresses need 4 registers, not
 * 8 pointers. The same sums and chain steps as rows8_step without its
 * checks. */
static inline __attribute__((always_inline)) __m256
rows8_step_whole(__m256 acc, const uint8_t *p, const uint8_t *p4, size_t rb, size_t r3,
                 const int8_t *q, int64_t hh, const float *dx, const int32_t *sx,
                 const __m256 dd[8], int64_t g, int j, int cnt, const int G)
{
    const int8_t *e = q + 128 * (hh >> 1) + 32 * (hh & 1);
    const __m256i e0 = _mm256_loadu_si256((const __m256i *)(const void *)e);
    const __m256i e1 = _mm256_loadu_si256((const __m256i *)(const void *)(e + 64));
    /* the rows8_sum / rows8_sum2 trees (the same integer sums), written
     * pair by pair so few vectors are live at once and acc stays in a
     * register */
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i m0, m1;
    if (G == 128) {
        /* halves hh (even) and hh + 1: chunks e and e + 32; |word| <= 15240 */
        const __m256i f0 = _mm256_loadu_si256((const __m256i *)(const void *)(e + 32));
        const __m256i f1 = _mm256_loadu_si256((const __m256i *)(const void *)(e + 96));
#define H2(P) _mm256_add_epi16(half_s16_e(P, e0, e1), half_s16_e((P) + 32, f0, f1))
#define PAIR(A, B) _mm256_madd_epi16(_mm256_hadd_epi16(H2(A), H2(B)), ones)
        const __m256i h0 = PAIR(p, p + rb);
        const __m256i h1 = PAIR(p + 2 * rb, p + r3);
        m0 = _mm256_hadd_epi32(h0, h1);
        const __m256i h2 = PAIR(p4, p4 + rb);
        const __m256i h3 = PAIR(p4 + 2 * rb, p4 + r3);
        m1 = _mm256_hadd_epi32(h2, h3);
#undef PAIR
#undef H2
    } else {
#define PAIR(A, B) _mm256_hadd_epi16(half_s16_e(A, e0, e1), half_s16_e(B, e0, e1))
        const __m256i t0 = PAIR(p, p + rb);
        const __m256i t1 = PAIR(p + 2 * rb, p + r3);
        m0 = _mm256_madd_epi16(_mm256_hadd_epi16(t0, t1), ones);
        const __m256i t2 = PAIR(p4, p4 + rb);
        const __m256i t3 = PAIR(p4 + 2 * rb, p4 + r3);
        m1 = _mm256_madd_epi16(_mm256_hadd_epi16(t2, t3), ones);
#undef PAIR
    }
    if (G == 32) {   /* rows8_sum2: ga lane i = row i's first group, gb its second */
        const __m256i ga = _mm256_permute2x128_si256(m0, m1, 0x20);
        const __m256i gb = _mm256_permute2x128_si256(m0, m1, 0x31);
        acc = chain8(acc, ga, dd[j], dx[g], sx[g]);
        if (j + 1 < cnt)
            acc = chain8(acc, gb, dd[j + 1], dx[g + 1], sx[g + 1]);
        return acc;
    }
    const __m256i isum = _mm256_add_epi32(_mm256_permute2x128_si256(m0, m1, 0x20),
                                          _mm256_permute2x128_si256(m0, m1, 0x31));
    return chain8(acc, isum, dd[j], dx[g], sx[g]);
}

/* y[i] (i < 8) = the canonical INT4A8 dot of token q/dx/sx with rows base,
 * base + row_bytes, ... (G compile-time). The groups whose halves are all
 * whole (the first g_full) go through rows8_step_whole, in a loop of their
 * own; the others through rows8_step's checks. PF: prefetch the pf_bytes at pf (a block at least A8_PF ahead),
 * spread over this block's whole group steps (the hardware prefetcher does
 * not follow 8 interleaved row streams that restart at every matrix). */
static inline __attribute__((always_inline)) void
rows8_a8(float *y, const uint8_t *base, size_t row_bytes, const int8_t *q, const float *dx,
         const int32_t *sx, int64_t n_group, int64_t nh, int tail, const int G, const int PF,
         const uint8_t *pf, size_t pf_bytes)
{
    const int64_t n_steps = G == 32 ? (n_group + 1) / 2 : n_group;
    const size_t pf_step = PF ? (pf_bytes / (size_t)n_steps + 63) & ~(size_t)63 : 0;
    size_t pf_at = 0;
    const uint8_t *qs[8];
    for (int i = 0; i < 8; i++)
        qs[i] = base + (size_t)i * row_bytes + 4 * (size_t)n_group;
    const int64_t n_whole = tail == 32 ? nh : nh - 1;      /* whole halves */
    const int64_t g_full = G == 32 ? 2 * n_whole : G == 64 ? n_whole : n_whole / 2;
    const int step = G == 32 ? 2 : 1;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t g0 = 0; g0 < n_group; g0 += 8) {
        __m256 dd[8];
        scales8(dd, base, row_bytes, g0, n_group);
        const int cnt = n_group - g0 < 8 ? (int)(n_group - g0) : 8;
        /* groups g0 + j, j < jf, are whole (G=32: jf even) */
        const int jf = g_full - g0 >= cnt ? cnt : g_full > g0 ? (int)(g_full - g0) : 0;
        int j = 0;
        for (; j + step <= jf; j += step) {
            if (PF)
                for (size_t e = pf_at + pf_step < pf_bytes ? pf_at + pf_step : pf_bytes;
                     pf_at < e; pf_at += 64)
                    _mm_prefetch((const char *)pf + pf_at, SHOAL_PF_WEIGHTS);
            const int64_t g = g0 + j;
            const int64_t hh = G == 32 ? g / 2 : G == 64 ? g : 2 * g;
            acc = rows8_step_whole(acc, qs[0] + 32 * (size_t)hh, qs[4] + 32 * (size_t)hh,
                                   row_bytes, 3 * row_bytes, q, hh, dx, sx, dd, g, j, cnt, G);
        }
        for (; j < cnt; j += step)
            acc = rows8_step(acc, qs, q, dx, sx, dd, g0, j, cnt, nh, tail, G);
    }
    if (PF)   /* what the whole groups did not cover (rows with a partial last group) */
        for (; pf_at < pf_bytes; pf_at += 64)
            _mm_prefetch((const char *)pf + pf_at, SHOAL_PF_WEIGHTS);
    _mm256_storeu_ps(y, acc);
}

static void rows8_a8_any(float *y, const uint8_t *base, size_t row_bytes, const int8_t *q,
                         const float *dx, const int32_t *sx, int64_t n_group, int64_t nh,
                         int tail, int G, const uint8_t *pf, size_t pf_bytes)
{
#define ROWS8(G_, PF_) rows8_a8(y, base, row_bytes, q, dx, sx, n_group, nh, tail, G_, PF_, pf, \
                                pf_bytes)
    if (G == 32)
        pf_bytes ? ROWS8(32, 1) : ROWS8(32, 0);
    else if (G == 64)
        pf_bytes ? ROWS8(64, 1) : ROWS8(64, 0);
    else
        pf_bytes ? ROWS8(128, 1) : ROWS8(128, 0);
#undef ROWS8
}

/* ---- INT4A8 batches: 8 rows x many tokens, each block unpacked once ------
 * The same outputs as rows8_a8 for up to A8M_TB tokens per pass over a
 * block of 8 rows. The block advances 32 columns (a piece: 16 bytes, two
 * qwords, of each row) at a time: the piece is transposed by qwords
 * (cols4_x8: one row per 64-bit lane) and split into nibbles once, and
 * every token multiplies them by its own activation qwords, broadcast
 * (cols4_dot: vpmaddubsw, 16-bit sums, then vpmaddwd), so no token pays
 * for an unpack, a transpose or a horizontal tree. A group's pieces add
 * up exactly in int32 and feed each token's own chain acc + (d * dx) *
 * (float)(isum - sx), one lane per row, in group order: the scalar
 * table's bits. Lanes hold the rows in the order A8M_LANES (the scales are
 * permuted to match, the outputs back). */
#define A8M_TB 32          /* tokens per pass (their chains on the stack) */

/* Lane l of the sums, the scales and the chains holds row A8M_LANES[l];
 * row i sits in lane A8M_ROWS[i]. */
#define A8M_LANES _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)
#define A8M_ROWS _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7)

/* The 16 bytes at p of the 8 rows p, p + rb, ..., p + 7 rb (32 columns of
 * each), transposed by qwords and split into nibbles: lo[2 h + j] 64-bit
 * lane i = the low nibbles (even columns) of row 4 h + i's qword j, hi[]
 * its high nibbles (odd columns). */
static inline __attribute__((always_inline)) void cols4_x8(__m256i lo[4], __m256i hi[4],
                                                           const uint8_t *p, size_t rb)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int h = 0; h < 2; h++) {
        __m256i v[2];
        for (int i = 0; i < 2; i++) {   /* low lane: row 4h + i, high lane: row 4h + i + 2 */
            const uint8_t *r = p + (size_t)(4 * h + i) * rb;
            v[i] = _mm256_blend_epi32(
                _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)r)),
                _mm256_broadcastsi128_si256(
                    _mm_loadu_si128((const __m128i *)(const void *)(r + 2 * rb))),
                0xf0);
        }
        for (int j = 0; j < 2; j++) {
            const __m256i c = j ? _mm256_unpackhi_epi64(v[0], v[1]) : _mm256_unpacklo_epi64(v[0], v[1]);
            lo[2 * h + j] = _mm256_and_si256(c, m4);
            hi[2 * h + j] = _mm256_and_si256(_mm256_srli_epi16(c, 4), m4);
        }
    }
}

static inline int64_t load_i64(const int8_t *p)
{
    int64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Lane l = row A8M_LANES[l]'s exact sum of nibble * activation over
 * cols4_x8's piece, for the token whose activations of the piece's even
 * columns start at e (chunk order: the odd ones at e + 64). a and b (rows
 * 0-3 and 4-7, a row's 4 words in its 64-bit lane) sum 4 vpmaddubsw words
 * each, |word| <= 4 * 2 * 15 * 127 = 15240; folding each row's two dwords
 * together doubles that to 30480, inside int16. */
static inline __attribute__((always_inline)) __m256i cols4_dot(const __m256i lo[4],
                                                               const __m256i hi[4],
                                                               const int8_t *e)
{
    const __m256i e0 = _mm256_set1_epi64x(load_i64(e)), e1 = _mm256_set1_epi64x(load_i64(e + 8));
    const __m256i o0 = _mm256_set1_epi64x(load_i64(e + 64));
    const __m256i o1 = _mm256_set1_epi64x(load_i64(e + 72));
    const __m256i a = _mm256_add_epi16(
        _mm256_add_epi16(_mm256_maddubs_epi16(lo[0], e0), _mm256_maddubs_epi16(hi[0], o0)),
        _mm256_add_epi16(_mm256_maddubs_epi16(lo[1], e1), _mm256_maddubs_epi16(hi[1], o1)));
    const __m256i b = _mm256_add_epi16(
        _mm256_add_epi16(_mm256_maddubs_epi16(lo[2], e0), _mm256_maddubs_epi16(hi[2], o0)),
        _mm256_add_epi16(_mm256_maddubs_epi16(lo[3], e1), _mm256_maddubs_epi16(hi[3], o1)));
    /* dword 2k: a's row k (its two dwords added), dword 2k + 1: b's */
    const __m256i s = _mm256_add_epi16(_mm256_blend_epi32(a, b, 0xaa),
                                       _mm256_shuffle_epi32(_mm256_blend_epi32(b, a, 0xaa), 0xb1));
    return _mm256_madd_epi16(s, _mm256_set1_epi16(1));
}

/* One piece (lo/hi: cols4_x8's) for nt tokens: token t's activations at
 * e + t * q_stride, its dx and sx of the piece's group at dx[t * ng],
 * sx[t * ng]. MODE (compile-time): 0 the group's first piece of several
 * (part = sums), 1 a middle one (part += sums), 2 its last (chain over
 * part + sums), 3 its only one (chain over the sums). d: the group's
 * scales, lane l = row A8M_LANES[l]. */
static inline __attribute__((always_inline)) void
piece_tokens(const __m256i lo[4], const __m256i hi[4], const int8_t *e, int64_t q_stride,
             const float *dx, const int32_t *sx, int64_t ng, int64_t nt, __m256 d,
             int32_t (*part)[8], float (*acc)[8], const int MODE)
{
    for (int64_t t = 0; t < nt; t++, e += q_stride) {
        __m256i v = cols4_dot(lo, hi, e);
        if (MODE == 1 || MODE == 2)
            v = _mm256_add_epi32(v, _mm256_load_si256((const __m256i *)(const void *)part[t]));
        _mm256_store_si256((__m256i *)(void *)part[t], v);
    }
    /* the chains in a loop of their own: short, independent across tokens
     * (after the sums, their latency would hold up the next tokens' sums) */
    if (MODE >= 2)
        for (int64_t t = 0; t < nt; t++, dx += ng, sx += ng)
            _mm256_store_ps(acc[t], chain8(_mm256_load_ps(acc[t]),
                                           _mm256_load_si256((const __m256i *)(const void *)part[t]),
                                           d, *dx, *sx));
}

/* y[t * y_stride + i] (t < nt <= A8M_TB, i < 8) = the canonical INT4A8 dot
 * of token t0 + t of a with rows base, base + row_bytes, ... (n columns,
 * nh halves, the last of tail bytes; G compile-time). pf/pf_bytes: as
 * rows8_a8, spread over the pieces (0 bytes: none). */
static inline __attribute__((always_inline)) void
rows8_many_a8(float *y, int64_t y_stride, const uint8_t *base, size_t row_bytes,
              const struct shoal_quant_act *a, int64_t t0, int64_t nt, int64_t n,
              int64_t n_group, int64_t nh, int tail, const int G, const uint8_t *pf,
              size_t pf_bytes)
{
    const size_t pf_step = pf_bytes ? (pf_bytes / (size_t)((n + 31) / 32) + 63) & ~(size_t)63 : 0;
    size_t pf_at = 0;
    const uint8_t *qs = base + 4 * (size_t)n_group;
    const int8_t *q0 = a->q + t0 * a->q_stride;
    const float *dx0 = a->d + t0 * a->n_group;
    const int32_t *sx0 = a->s + t0 * a->n_group;
    _Alignas(32) float acc[A8M_TB][8];
    _Alignas(32) int32_t part[A8M_TB][8];
    _Alignas(32) uint8_t pad[8 * 32];              /* a partial last half, zero-filled */
    for (int64_t t = 0; t < nt; t++)
        _mm256_store_ps(acc[t], _mm256_setzero_ps());
    for (int64_t g0 = 0; g0 < n_group; g0 += 8) {
        __m256 dd[8];
        scales8(dd, base, row_bytes, g0, n_group);
        for (int j = 0; j < 8; j++)
            dd[j] = _mm256_permutevar8x32_ps(dd[j], A8M_LANES);
        const int64_t c1 = (g0 + 8) * G < n ? (g0 + 8) * G : n;
        for (int64_t col = g0 * G; col < c1; col += 32) {
            for (size_t e = pf_at + pf_step < pf_bytes ? pf_at + pf_step : pf_bytes; pf_at < e;
                 pf_at += 64)
                _mm_prefetch((const char *)pf + pf_at, SHOAL_PF_WEIGHTS);
            const int64_t hh = col / 64, g = col / G;
            const int k4 = (int)(col / 32) & 1;
            const uint8_t *p = qs + col / 2;
            size_t rb = row_bytes;
            if (hh == nh - 1 && tail < 32) {   /* the activation past n is 0 */
                if (k4 == 0) {
                    memset(pad, 0, sizeof pad);
                    for (int i = 0; i < 8; i++)
                        memcpy(pad + 32 * i, p + (size_t)i * row_bytes, (size_t)tail);
                }
                p = pad + 16 * k4;
                rb = 32;
            }
            __m256i lo[4], hi[4];
            cols4_x8(lo, hi, p, rb);
            const int8_t *e = q0 + 128 * (hh >> 1) + 32 * (hh & 1) + 16 * k4;
            const int first = col % G == 0, last = col % G == G - 32 || col + 32 >= n;
#define PIECE(M) piece_tokens(lo, hi, e, a->q_stride, dx0 + g, sx0 + g, a->n_group, nt, \
                              dd[g - g0], part, acc, M)
            if (G == 32 || (first && last))
                PIECE(3);
            else if (first)
                PIECE(0);
            else if (last)
                PIECE(2);
            else
                PIECE(1);
#undef PIECE
        }
    }
    for (; pf_at < pf_bytes; pf_at += 64)
        _mm_prefetch((const char *)pf + pf_at, SHOAL_PF_WEIGHTS);
    for (int64_t t = 0; t < nt; t++)
        _mm256_storeu_ps(y + t * y_stride,
                         _mm256_permutevar8x32_ps(_mm256_load_ps(acc[t]), A8M_ROWS));
}

static void rows8_many_any(float *y, int64_t y_stride, const uint8_t *base, size_t row_bytes,
                           const struct shoal_quant_act *a, int64_t t0, int64_t nt, int64_t n,
                           int64_t n_group, int64_t nh, int tail, int G, const uint8_t *pf,
                           size_t pf_bytes)
{
#define MANY(G_) rows8_many_a8(y, y_stride, base, row_bytes, a, t0, nt, n, n_group, nh, tail, G_, \
                               pf, pf_bytes)
    if (G == 32)
        MANY(32);
    else if (G == 64)
        MANY(64);
    else
        MANY(128);
#undef MANY
}

/* the decode order (shoal_quant_avx2_set_decode_order): 0 rows side by
 * side (rows8_a8), 1 one after another (rows8_seq_a8) */
static int decode_seq;

void shoal_quant_avx2_set_decode_order(int seq)
{
    decode_seq = seq != 0;
}

/* ---- INT4A8 matvec: 8 rows one after another ------------------------------
 * The same 8 outputs as rows8_a8, reading each row front to back (one
 * sequential stream, as the avx512 table does): pass 1 takes a row's exact
 * group sums 8 groups at a time (groups8, its halves prefetched A8_PF
 * ahead) and stores each group's term (d * dx) * (float)(isum - sx); pass 2
 * transposes 8 groups of the 8 rows and adds the terms in group order, one
 * lane per row: acc + term, the scalar chain's operations. Rows of at most
 * SEQ_MAXG groups. */
#define SEQ_MAXG 256

static inline __attribute__((always_inline)) void
rows8_seq_a8(float *y, const uint8_t *base, size_t row_bytes, const int8_t *q, const float *dx,
             const int32_t *sx, int64_t n_group, int64_t nh, int tail, const int G, int prefetch)
{
    const int HP = 8 * G / 64;                  /* halves per 8 groups */
    _Alignas(32) float tm[8][SEQ_MAXG];
    for (int i = 0; i < 8; i++) {
        const uint8_t *row = base + (size_t)i * row_bytes;
        const uint8_t *qs = row + 4 * (size_t)n_group;
        for (int64_t g0 = 0, h0 = 0; g0 < n_group; g0 += 8, h0 += HP) {
            const __m256i is = HP == 4    ? groups8(qs, q, h0, 4, nh, tail, prefetch)
                               : HP == 8 ? groups8(qs, q, h0, 8, nh, tail, prefetch)
                                         : groups8(qs, q, h0, 16, nh, tail, prefetch);
            __m256 d, vdx;
            __m256i vsx;
            if (g0 + 8 <= n_group) {
                d = _mm256_loadu_ps((const float *)(const void *)(row + 4 * (size_t)g0));
                vdx = _mm256_loadu_ps(dx + g0);
                vsx = _mm256_loadu_si256((const __m256i *)(const void *)(sx + g0));
            } else {   /* the last groups: lanes past n_group are 0 (masked
                        * loads: three memcpy calls of a variable size cost
                        * rows of 12 groups half their speed) */
                const __m256i live = _mm256_cmpgt_epi32(
                    _mm256_set1_epi32((int)(n_group - g0)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
                d = _mm256_maskload_ps((const float *)(const void *)(row + 4 * (size_t)g0), live);
                vdx = _mm256_maskload_ps(dx + g0, live);
                vsx = _mm256_maskload_epi32(sx + g0, live);
            }
            const __m256 f = _mm256_cvtepi32_ps(_mm256_sub_epi32(is, vsx));
            _mm256_store_ps(&tm[i][g0], _mm256_mul_ps(_mm256_mul_ps(d, vdx), f));
        }
    }
    __m256 acc = _mm256_setzero_ps();
    for (int64_t g0 = 0; g0 < n_group; g0 += 8) {
        __m256i c[8];
        for (int i = 0; i < 8; i++)
            c[i] = _mm256_load_si256((const __m256i *)(const void *)&tm[i][g0]);
        transpose8_epi32(c);                    /* c[j] lane i = row i's term g0 + j */
        const int cnt = n_group - g0 < 8 ? (int)(n_group - g0) : 8;
        for (int j = 0; j < cnt; j++)
            acc = _mm256_add_ps(acc, _mm256_castsi256_ps(c[j]));
    }
    _mm256_storeu_ps(y, acc);
}

static void rows8_seq_any(float *y, const uint8_t *base, size_t row_bytes, const int8_t *q,
                          const float *dx, const int32_t *sx, int64_t n_group, int64_t nh,
                          int tail, int G, int prefetch)
{
    if (G == 32)
        rows8_seq_a8(y, base, row_bytes, q, dx, sx, n_group, nh, tail, 32, prefetch);
    else if (G == 64)
        rows8_seq_a8(y, base, row_bytes, q, dx, sx, n_group, nh, tail, 64, prefetch);
    else
        rows8_seq_a8(y, base, row_bytes, q, dx, sx, n_group, nh, tail, 128, prefetch);
}

/* Rows in blocks of 8: one token through rows8_a8 (or rows8_seq_a8, the
 * decode order), 2 or more through rows8_many_a8, A8M_TB tokens a pass (the
 * weights prefetched on the first pass); remainder rows run the chain in
 * scalar over groups8's sums, token by token. Same bits as the scalar
 * table. */
static void rows_a8_avx2(float *y, const struct shoal_quant_act *a, int64_t n_tok,
                         const struct shoal_quant_weight *w, int64_t r0, int64_t r1)
{
    const int64_t n = w->cols;
    const int G = w->group;
    const size_t row_bytes = shoal_quant_row_bytes(SHOAL_QUANT_INT4, n, G);
    const int64_t n_group = (n + G - 1) / G, nh = (n + 63) / 64;
    /* packed bytes of the last half: 32, or fewer when n % 64 != 0 */
    const int tail = n % 64 ? (int)((n % 64 + 1) / 2) : 32;
    /* prefetch distance: k blocks of 8 rows, at least A8_PF bytes */
    const int64_t k = ((int64_t)A8_PF + 8 * (int64_t)row_bytes - 1) / (8 * (int64_t)row_bytes);
    if (r0 + 8 <= r1) {   /* the first k blocks: the later ones are prefetched k blocks before */
        const int64_t ahead = r1 - r0 < 8 * k ? r1 - r0 : 8 * k;
        for (size_t o = 0; o < (size_t)ahead * row_bytes; o += 64)
            _mm_prefetch((const char *)w->data + (size_t)r0 * row_bytes + o, SHOAL_PF_WEIGHTS);
    }
    size_t next_at = 0;
    const size_t next_end = a->next ? (a->next_bytes < A8_PF ? a->next_bytes : A8_PF) : 0;
    const int seq_order = decode_seq && n_group <= SEQ_MAXG;
    for (; r0 + 8 <= r1; r0 += 8) {
        const uint8_t *base = (const uint8_t *)w->data + (size_t)r0 * row_bytes;
        if (seq_order && n_tok == 1) {   /* its own prefetches, along each row */
            rows8_seq_any(y + r0, base, row_bytes, a->q, a->d, a->s, n_group, nh, tail, G, 1);
            continue;
        }
        /* block k ahead, or what rows are left of it (never past r1) */
        const int64_t pr0 = r0 + 8 * k;
        const int64_t npf = pr0 >= r1 ? 0 : r1 - pr0 < 8 ? r1 - pr0 : 8;
        /* the pointer is formed only inside the rows (no arithmetic past them) */
        const uint8_t *pf = npf ? (const uint8_t *)w->data + (size_t)pr0 * row_bytes : NULL;
        size_t pf_bytes = (size_t)npf * row_bytes;
        if (!npf && next_at < next_end) {
            /* the last k blocks: the first A8_PF bytes of what comes next */
            pf = a->next + next_at;
            pf_bytes = next_end - next_at < 8 * row_bytes ? next_end - next_at : 8 * row_bytes;
            next_at += pf_bytes;
        }
        if (n_tok == 1) {
            rows8_a8_any(y + r0, base, row_bytes, a->q, a->d, a->s, n_group, nh, tail, G, pf,
                         pf_bytes);
            continue;
        }
        for (int64_t t0 = 0; t0 < n_tok; t0 += A8M_TB)   /* the prefetch on the first pass */
            rows8_many_any(y + t0 * w->rows + r0, w->rows, base, row_bytes, a, t0,
                           n_tok - t0 < A8M_TB ? n_tok - t0 : A8M_TB, n, n_group, nh, tail, G,
                           pf, t0 == 0 ? pf_bytes : 0);
    }
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * row_bytes;
        const uint8_t *qs = row + 4 * (size_t)n_group;
        for (int64_t t = 0; t < n_tok; t++) {
            const int8_t *q = a->q + t * a->q_stride;
            const float *dx = a->d + t * a->n_group;
            const int32_t *sx = a->s + t * a->n_group;
            float acc = 0.0f;
            for (int64_t g0 = 0, h0 = 0; g0 < n_group; g0 += 8, h0 += 8 * G / 64) {
                int32_t is[8];
                _mm256_storeu_si256((__m256i *)(void *)is,
                                    G == 32 ? groups8(qs, q, h0, 4, nh, tail, t == 0)
                                    : G == 64 ? groups8(qs, q, h0, 8, nh, tail, t == 0)
                                              : groups8(qs, q, h0, 16, nh, tail, t == 0));
                const int cnt = n_group - g0 < 8 ? (int)(n_group - g0) : 8;
                for (int j = 0; j < cnt; j++) {
                    float dwj;
                    memcpy(&dwj, row + 4 * (size_t)(g0 + j), sizeof dwj);
                    acc = acc + (dwj * dx[g0 + j]) * (float)(is[j] - sx[g0 + j]);
                }
            }
            y[t * w->rows + r] = acc;
        }
    }
}

/* ---- rows scaled and added (shoal_quant_axpy_rows) ------------------------ */

/* 32 columns at a time (inside one group: G is a multiple of 32) held in
 * four vectors while every row adds into them in row order: each element
 * a * (d * q) with the scalar's two separate multiplies and its add, q
 * exact (q8x8, q4x32), no f32 row written. The columns past the last
 * whole 32 run the scalar reference. */
void shoal_quant_axpy_rows_avx2(enum shoal_quant_type type, int group, float *dst, int64_t n,
                                const void *rows, size_t row_bytes, const float *coef,
                                int64_t coef_stride, int64_t n_rows)
{
    const size_t scales = 4 * (size_t)((n + group - 1) / group);   /* shoal_quant_row_qs */
    int64_t j0 = 0;
    for (; j0 + 32 <= n; j0 += 32) {
        __m256 acc[4];
        for (int k = 0; k < 4; k++)
            acc[k] = _mm256_loadu_ps(dst + j0 + 8 * k);
        const size_t g = (size_t)(j0 / group);
        const uint8_t *row = (const uint8_t *)rows;
        for (int64_t i = 0; i < n_rows; i++, row += row_bytes) {
            float d;
            memcpy(&d, row + 4 * g, sizeof d);
            const __m256 a = _mm256_set1_ps(coef[i * coef_stride]), dv = _mm256_set1_ps(d);
            __m256 v[4];
            if (type == SHOAL_QUANT_INT8)
                for (int k = 0; k < 4; k++)
                    v[k] = q8x8((const int8_t *)(row + scales) + j0 + 8 * k);
            else
                q4x32(row + scales + j0 / 2, v);
            for (int k = 0; k < 4; k++)
                acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(a, _mm256_mul_ps(dv, v[k])));
        }
        for (int k = 0; k < 4; k++)
            _mm256_storeu_ps(dst + j0 + 8 * k, acc[k]);
    }
    if (j0 < n) {   /* the rest: the reference on its columns (its rows shifted) */
        for (int64_t i = 0; i < n_rows; i++) {
            const uint8_t *row = (const uint8_t *)rows + (size_t)i * row_bytes;
            const float a = coef[i * coef_stride];
            for (int64_t j = j0; j < n; j++) {
                float d;
                memcpy(&d, row + 4 * (size_t)(j / group), sizeof d);
                const float v = type == SHOAL_QUANT_INT8
                                    ? (float)((const int8_t *)(row + scales))[j]
                                    : (float)q4_at(row + scales, j);
                dst[j] = dst[j] + a * (d * v);
            }
        }
    }
}

const struct shoal_quant_ops shoal_quant_ops_avx2 = {
    .name = "avx2",
    .dot = dot_avx2,
    .linear_rows = linear_rows_avx2,
    .linear_rows_a8 = rows_a8_avx2,
    .act_quantize = shoal_quant_act_quantize_avx2,
    .act_group = shoal_quant_act_group_avx2,
    .fp8_rows = shoal_fp8_rows_avx2,
    .fp8_dequant_row = shoal_fp8_dequant_row_avx2,
    .fp8_axpy_rows = shoal_fp8_axpy_rows_avx2,
    .mxfp4_rows = shoal_mxfp4_rows_avx2,
    .ggml_rows = shoal_ggml_rows_avx2,
    .axpy_rows = shoal_quant_axpy_rows_avx2,
};

/* ---- FP8 (quant.h "FP8") --------------------------------------------------- */

/* 16 E4M3 codes -> 16 f32, exactly the table's values (NaN codes excepted;
 * the loader refuses them). A code's sign moved to bit 15 and its 7
 * magnitude bits to bits 7..13 make an f16 whose value is the code's times
 * 2^-8, normal and subnormal codes alike (E4M3's exponent bias 7 against
 * f16's 15, the same 3 mantissa bits on top); vcvtph2ps (F16C) widens it
 * exactly and the multiply by 256 is exact. */
static inline void e4m3x16(const uint8_t *p, __m256 *lo, __m256 *hi)
{
    const __m256i c = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(const void *)p));
    const __m256i h = _mm256_or_si256(
        _mm256_slli_epi16(_mm256_and_si256(c, _mm256_set1_epi16(0x80)), 8),
        _mm256_slli_epi16(_mm256_and_si256(c, _mm256_set1_epi16(0x7f)), 7));
    const __m256 k = _mm256_set1_ps(256.0f);
    *lo = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), k);
    *hi = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), k);
}

static void fp8_decode(float *dst, const uint8_t *q, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 lo, hi;
        if ((i & 63) == 0)   /* the weight stream, 4 KiB ahead (as the int4 rows) */
            _mm_prefetch((const char *)q + i + 4096, SHOAL_PF_WEIGHTS);
        e4m3x16(q + i, &lo, &hi);
        _mm256_storeu_ps(dst + i, lo);
        _mm256_storeu_ps(dst + i + 8, hi);
    }
    for (; i < n; i++)
        dst[i] = shoal_fp8_e4m3_table[q[i]];
}

/* shoal_dot_f32's order: lane k % 8, the tail on the stored lanes */
static float fp8_block_dot(const float *x, const float *w, int64_t len)
{
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= len; i += 8)
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(w + i)));
    float s[8];
    _mm256_storeu_ps(s, acc);
    for (int j = 0; i + j < len; j++)
        s[j] += x[i + j] * w[i + j];
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

#define FP8_ROWS_NAME shoal_fp8_rows_avx2
#define FP8_DEQUANT_NAME shoal_fp8_dequant_row_avx2
#define FP8_AXPY_NAME shoal_fp8_axpy_rows_avx2
#include "quant_fp8_impl.h"

/* ---- MXFP4 (quant.h "MXFP4") ----------------------------------------------- */

/* One packed block (16 bytes) -> its 32 values v2(nibble) as 4 x 8 f32 in
 * element order, 8 at a time from 4 bytes broadcast to every lane: lane k
 * shifted right by 4k holds nibble k in its low bits, whose 3 magnitude
 * bits index a register of the 8 magnitudes (vpermps uses the low 3 bits
 * of each index), and shifted left by 28 - 4k its sign bit in bit 31
 * (exact: every value is a table entry, -0 included). One shuffle per 8
 * values; a byte table (vpshufb) and widening took 2.5. */
static inline void mx_block_regs(const uint8_t *q, __m256 w[4])
{
    const __m256 mag = _mm256_setr_ps(0, 1, 2, 3, 4, 6, 8, 12);
    const __m256i sr = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    const __m256i sl = _mm256_setr_epi32(28, 24, 20, 16, 12, 8, 4, 0);
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u));
    for (int j = 0; j < 4; j++) {
        int32_t v;
        memcpy(&v, q + 4 * j, 4);
        const __m256i b = _mm256_set1_epi32(v);
        const __m256 m = _mm256_permutevar8x32_ps(mag, _mm256_srlv_epi32(b, sr));
        const __m256 s = _mm256_and_ps(_mm256_castsi256_ps(_mm256_sllv_epi32(b, sl)), sign);
        w[j] = _mm256_xor_ps(m, s);
    }
}

#define MXFP4_ROWS_NAME shoal_mxfp4_rows_avx2
#include "quant_mxfp4_x86.h"
