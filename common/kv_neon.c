/* kv_neon: the KV attention kernels with NEON (aarch64).
 *
 * Same bits as the scalar reference in kv.c: two float32x4 hold the eight
 * lane sums of shoal_dot_f32's canonical order (lo = s[0..3], hi =
 * s[4..7]); f16 elements become f32 exactly through fcvtl (vcvt_f32_f16),
 * bf16 through a 16-bit shift (vshll_n_u16); products and sums are separate
 * vmulq_f32 / vaddq_f32 (the project's -ffp-contract=off keeps GCC from
 * fusing them); the tail and the final reduction are the scalar code of
 * kv.h on the stored lanes. Scores run four K rows at a time, mix keeps 32
 * outputs in eight registers while it walks the V rows. */
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

KV_INLINE void acc_step(struct acc8 *a, float32x4_t q0, float32x4_t q1, const void *row,
                        int64_t i, enum shoal_dtype t)
{
    a->lo = vaddq_f32(a->lo, vmulq_f32(q0, load4(row, i, t)));
    a->hi = vaddq_f32(a->hi, vmulq_f32(q1, load4(row, i + 4, t)));
}

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

KV_INLINE void scores_t(float *s, const float *q, const void *k, int64_t stride,
                        int64_t n_rows, int64_t n, const enum shoal_dtype t)
{
    const int64_t n8 = n & ~(int64_t)7;
    const struct acc8 z = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    int64_t j = 0;
    for (; j + 4 <= n_rows; j += 4) {
        const void *r[4];
        struct acc8 a[4] = {z, z, z, z};
        for (int m = 0; m < 4; m++)
            r[m] = shoal_kv_row(k, j + m, stride, t);
        for (int64_t i = 0; i < n8; i += 8) {
            const float32x4_t q0 = vld1q_f32(q + i), q1 = vld1q_f32(q + i + 4);
            for (int m = 0; m < 4; m++)
                acc_step(&a[m], q0, q1, r[m], i, t);
        }
        for (int m = 0; m < 4; m++)
            s[j + m] = finish(a[m], q, r[m], n8, n, t);
    }
    for (; j < n_rows; j++) {
        const void *r = shoal_kv_row(k, j, stride, t);
        struct acc8 a = z;
        for (int64_t i = 0; i < n8; i += 8)
            acc_step(&a, vld1q_f32(q + i), vld1q_f32(q + i + 4), r, i, t);
        s[j] = finish(a, q, r, n8, n, t);
    }
}

KV_INLINE void mix_t(float *out, const float *p, const void *v, int64_t stride,
                     int64_t n_rows, int64_t n, const enum shoal_dtype t)
{
    int64_t d = 0;
    for (; d + 32 <= n; d += 32) {
        float32x4_t a[8];
        for (int b = 0; b < 8; b++)
            a[b] = vdupq_n_f32(0.0f);
        for (int64_t j = 0; j < n_rows; j++) {
            const float32x4_t pj = vdupq_n_f32(p[j]);
            const void *r = shoal_kv_row(v, j, stride, t);
            for (int b = 0; b < 8; b++)
                a[b] = vaddq_f32(a[b], vmulq_f32(pj, load4(r, d + 4 * b, t)));
        }
        for (int b = 0; b < 8; b++)
            vst1q_f32(out + d + 4 * b, a[b]);
    }
    for (; d + 4 <= n; d += 4) {
        float32x4_t a = vdupq_n_f32(0.0f);
        for (int64_t j = 0; j < n_rows; j++)
            a = vaddq_f32(a, vmulq_f32(vdupq_n_f32(p[j]), load4(shoal_kv_row(v, j, stride, t), d, t)));
        vst1q_f32(out + d, a);
    }
    if (d < n)
        shoal_kv_mix_cols_scalar(out, p, v, stride, n_rows, d, n, t);
}

SHOAL_KV_OPS_DEFINE(neon)
