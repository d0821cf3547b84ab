/* kv_neon: the KV attention kernels with NEON (aarch64).
 *
 * Same bits as the scalar reference in kv.c: two float32x4 hold the eight
 * lane sums of shoal_dot_f32's canonical order (lo = s[0..3], hi =
 * s[4..7]); f16 elements become f32 exactly through fcvtl (vcvt_f32_f16),
 * bf16 through a 16-bit shift (vshll_n_u16); products and sums are separate
 * vmulq_f32 / vaddq_f32 (the project's -ffp-contract=off keeps GCC from
 * fusing them); the tail is the scalar code of kv.h on the stored lanes,
 * the final reduction its order in registers. Scores run 4 queries x 2 K
 * rows (one query: 4 rows), each K element loaded once for all of them;
 * mix keeps 4 queries x 16 outputs (one or two queries: 32 each) in
 * registers while it walks the V rows. */
#include <arm_neon.h>

#include "kv.h"

#define KV_INLINE static inline __attribute__((always_inline))

/* elements i .. i+3 of a row as f32 (exact) */
KV_INLINE float32x4_t load4(const void *row, int64_t i, enum shoal_dtype t)
{
    if (t == SHOAL_DTYPE_F32)
        return vld1q_f32((const float *)row + i);
    const uint16x4_t h = vld1_u16((const uint16_t *)row + i);
    if (t == SHOAL_DTYPE_F16)
        return vcvt_f32_f16(vreinterpret_f16_u16(h));
    return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
}

struct acc8 {
    float32x4_t lo, hi;
};

KV_INLINE float finish(struct acc8 a, const float *q, const void *row, int64_t i, int64_t n,
                       enum shoal_dtype t)
{
    float s[8], tail[8];
    vst1q_f32(s, a.lo);
    vst1q_f32(s + 4, a.hi);
    if (i < n)
        shoal_to_f32(tail, (const char *)row + (size_t)i * shoal_dtype_size(t), t,
                     (size_t)(n - i));
    return shoal_kv_dot_finish(s, q, tail, i, n);
}

/* shoal_dot_f32's reduction ((s0+s4)+(s2+s6)) + ((s1+s5)+(s3+s7)) in
 * registers, each sum with the scalar operands in the scalar order */
KV_INLINE float reduce8(struct acc8 a)
{
    const float32x4_t v = vaddq_f32(a.lo, a.hi);                 /* s0+s4 .. s3+s7 */
    const float32x4_t u = vaddq_f32(v, vextq_f32(v, v, 2));      /* v0+v2, v1+v3 */
    return vgetq_lane_f32(u, 0) + vgetq_lane_f32(u, 1);
}

/* scores of QN queries against RN rows from row j (QN * RN <= 8 chains of
 * two registers): each K element is loaded (and converted) once for the
 * QN queries */
KV_INLINE void scores_blk(float *s, int64_t s_ld, const float *q, int64_t q_ld,
                          const void *k, int64_t stride, int64_t j, int64_t n,
                          const int QN, const int RN, const enum shoal_dtype t)
{
    const int64_t n8 = n & ~(int64_t)7;
    const struct acc8 z = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    const void *r[4];
    struct acc8 a[4][4];
#pragma GCC unroll 4
    for (int m = 0; m < RN; m++) {
        r[m] = shoal_kv_row(k, j + m, stride, t);
#pragma GCC unroll 4
        for (int c = 0; c < QN; c++)
            a[c][m] = z;
    }
    for (int64_t i = 0; i < n8; i += 8) {
        float32x4_t k0[4], k1[4];
#pragma GCC unroll 4
        for (int m = 0; m < RN; m++) {
            k0[m] = load4(r[m], i, t);
            k1[m] = load4(r[m], i + 4, t);
        }
#pragma GCC unroll 4
        for (int c = 0; c < QN; c++) {
            const float32x4_t q0 = vld1q_f32(q + c * q_ld + i), q1 = vld1q_f32(q + c * q_ld + i + 4);
#pragma GCC unroll 4
            for (int m = 0; m < RN; m++) {
                a[c][m].lo = vaddq_f32(a[c][m].lo, vmulq_f32(q0, k0[m]));
                a[c][m].hi = vaddq_f32(a[c][m].hi, vmulq_f32(q1, k1[m]));
            }
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < QN; c++)
#pragma GCC unroll 4
        for (int m = 0; m < RN; m++)
            s[c * s_ld + j + m] = n8 == n ? reduce8(a[c][m])
                                          : finish(a[c][m], q + c * q_ld, r[m], n8, n, t);
}

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

/* out columns d .. d+4*CB-1 of QN queries += their p times the V rows, in
 * row order (QN * CB <= 16 accumulators, each V load used QN times) */
KV_INLINE void mix_blk(float *out, int64_t out_ld, const float *p, int64_t p_ld,
                       const void *v, int64_t stride, int64_t n_rows, int64_t d,
                       const int QN, const int CB, const enum shoal_dtype t)
{
    float32x4_t a[4][8];
#pragma GCC unroll 4
    for (int c = 0; c < QN; c++)
#pragma GCC unroll 8
        for (int b = 0; b < CB; b++)
            a[c][b] = vld1q_f32(out + c * out_ld + d + 4 * b);
    for (int64_t j = 0; j < n_rows; j++) {
        const void *r = shoal_kv_row(v, j, stride, t);
        float32x4_t x[8];
#pragma GCC unroll 8
        for (int b = 0; b < CB; b++)
            x[b] = load4(r, d + 4 * b, t);
#pragma GCC unroll 4
        for (int c = 0; c < QN; c++) {
            const float32x4_t pj = vdupq_n_f32(p[c * p_ld + j]);
#pragma GCC unroll 8
            for (int b = 0; b < CB; b++)
                a[c][b] = vaddq_f32(a[c][b], vmulq_f32(pj, x[b]));
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < QN; c++)
#pragma GCC unroll 8
        for (int b = 0; b < CB; b++)
            vst1q_f32(out + c * out_ld + d + 4 * b, a[c][b]);
}

KV_INLINE void mix_q(float *out, int64_t out_ld, const float *p, int64_t p_ld, const void *v,
                     int64_t stride, int64_t n_rows, int64_t n, const int QN,
                     const enum shoal_dtype t)
{
    const int CB = QN == 1 ? 8 : QN == 2 ? 8 : 4;
    int64_t d = 0;
    for (; d + 4 * CB <= n; d += 4 * CB)
        mix_blk(out, out_ld, p, p_ld, v, stride, n_rows, d, QN, CB, t);
    for (; d + 4 <= n; d += 4)
        mix_blk(out, out_ld, p, p_ld, v, stride, n_rows, d, QN, 1, t);
    for (int c = 0; d < n && c < QN; c++)
        shoal_kv_mix_cols_scalar(out + c * out_ld, p + c * p_ld, v, stride, n_rows, d, n, t);
}

SHOAL_KV_OPS_DEFINE(neon, shoal_kv_softmax_scalar)
