/* quant_neon: the quant kernels with NEON (aarch64).
 *
 * Same bits as the scalar reference in quant.c: two float32x4 hold the eight
 * lane sums (lo = s[0..3], hi = s[4..7]) of quant.h's canonical order,
 * products and sums use separate vmulq_f32 / vaddq_f32 (never vfmaq/vmlaq;
 * GCC lowers these intrinsics to plain vector * and +, so the project's
 * -ffp-contract=off is what keeps them from being fused), quants become f32
 * exactly through vcvtq_f32_s32 of sign-extended integers, and the
 * horizontal sum reproduces ((s0+s4)+(s2+s6))+((s1+s5)+(s3+s7)) with the
 * same operand order (vaddvq_f32 sums pairwise in another order, so it is
 * not used). A group's tail (< 8 elements) is finished in scalar.
 *
 * The matvec runs four rows at a time and the batched path four tokens at a
 * time against a group unpacked once to f32: independent add chains, the
 * order of each chain unchanged. */
#include <arm_neon.h>
#include <string.h>

#include "ggml_dot.h"
#include "quant.h"
#include "quant_neon.h"

#define QUANT_GROUP_MAX 128
#define ROW_TILE 16

/* eight lane sums */
struct acc8 {
    float32x4_t lo;   /* s[0..3] */
    float32x4_t hi;   /* s[4..7] */
};

/* eight quants as f32 */
struct q8f {
    float32x4_t lo;
    float32x4_t hi;
};

static inline struct acc8 acc8_zero(void)
{
    struct acc8 a = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    return a;
}

static inline struct q8f i8x8_to_f32(int8x8_t v)
{
    const int16x8_t h = vmovl_s8(v);
    struct q8f q = {vcvtq_f32_s32(vmovl_s16(vget_low_s16(h))),
                    vcvtq_f32_s32(vmovl_s16(vget_high_s16(h)))};
    return q;
}

static inline struct q8f q8x8(const int8_t *p)
{
    return i8x8_to_f32(vld1_s8(p));
}

/* 16 packed bytes -> 32 signed int4 values as int8, element order */
static inline void q4_unpack16(uint8x16_t b, int8x16_t *e0_15, int8x16_t *e16_31)
{
    const uint8x16_t lo = vandq_u8(b, vdupq_n_u8(0x0f));
    const uint8x16_t hi = vshrq_n_u8(b, 4);
    const int8x16_t eight = vdupq_n_s8(8);
    *e0_15 = vsubq_s8(vreinterpretq_s8_u8(vzip1q_u8(lo, hi)), eight);
    *e16_31 = vsubq_s8(vreinterpretq_s8_u8(vzip2q_u8(lo, hi)), eight);
}

static inline void q4x32(const uint8_t *p, struct q8f v[4])
{
    int8x16_t a, b;
    q4_unpack16(vld1q_u8(p), &a, &b);
    v[0] = i8x8_to_f32(vget_low_s8(a));
    v[1] = i8x8_to_f32(vget_high_s8(a));
    v[2] = i8x8_to_f32(vget_low_s8(b));
    v[3] = i8x8_to_f32(vget_high_s8(b));
}

/* 8 int4 quants (4 bytes) -> 8 f32 */
static inline struct q8f q4x8(const uint8_t *p)
{
    uint32_t u;
    memcpy(&u, p, sizeof u);
    const uint8x8_t b = vreinterpret_u8_u32(vdup_n_u32(u));
    const uint8x8_t lo = vand_u8(b, vdup_n_u8(0x0f));
    const uint8x8_t hi = vshr_n_u8(b, 4);
    const int8x8_t e = vsub_s8(vreinterpret_s8_u8(vzip1_u8(lo, hi)), vdup_n_s8(8));
    return i8x8_to_f32(e);
}

static inline int q4_at(const uint8_t *p, int64_t k)
{
    return (int)((p[k / 2] >> (4 * (k & 1))) & 0x0f) - 8;
}

static inline struct q8f load8(const float *p)
{
    struct q8f v = {vld1q_f32(p), vld1q_f32(p + 4)};
    return v;
}

static inline struct acc8 madd(struct acc8 s, struct q8f x, struct q8f q)
{
    s.lo = vaddq_f32(s.lo, vmulq_f32(x.lo, q.lo));
    s.hi = vaddq_f32(s.hi, vmulq_f32(x.hi, q.hi));
    return s;
}

/* ((s0+s4)+(s2+s6))+((s1+s5)+(s3+s7)), operands in the scalar order */
static inline float hsum8(struct acc8 s)
{
    const float32x4_t v = vaddq_f32(s.lo, s.hi);                        /* s0+s4 .. s3+s7 */
    const float32x2_t w = vadd_f32(vget_low_f32(v), vget_high_f32(v));  /* v0+v2, v1+v3 */
    return vget_lane_f32(w, 0) + vget_lane_f32(w, 1);
}

/* hsum8 of four chains at once, chain r in lane r (same operations) */
static inline float32x4_t hsum8x4(struct acc8 a, struct acc8 b, struct acc8 c,
                                  struct acc8 d)
{
    const float32x4_t va = vaddq_f32(a.lo, a.hi), vb = vaddq_f32(b.lo, b.hi);
    const float32x4_t vc = vaddq_f32(c.lo, c.hi), vd = vaddq_f32(d.lo, d.hi);
    /* 4x4 transpose: cj = (va[j], vb[j], vc[j], vd[j]) */
    const float64x2_t t0 = vreinterpretq_f64_f32(vtrn1q_f32(va, vb));
    const float64x2_t t1 = vreinterpretq_f64_f32(vtrn2q_f32(va, vb));
    const float64x2_t t2 = vreinterpretq_f64_f32(vtrn1q_f32(vc, vd));
    const float64x2_t t3 = vreinterpretq_f64_f32(vtrn2q_f32(vc, vd));
    const float32x4_t c0 = vreinterpretq_f32_f64(vtrn1q_f64(t0, t2));
    const float32x4_t c1 = vreinterpretq_f32_f64(vtrn1q_f64(t1, t3));
    const float32x4_t c2 = vreinterpretq_f32_f64(vtrn2q_f64(t0, t2));
    const float32x4_t c3 = vreinterpretq_f32_f64(vtrn2q_f64(t1, t3));
    return vaddq_f32(vaddq_f32(c0, c2), vaddq_f32(c1, c3));
}

static inline float tree8(const float s[8])
{
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

static inline void store8(float l[8], struct acc8 s)
{
    vst1q_f32(l, s.lo);
    vst1q_f32(l + 4, s.hi);
}

/* ---- one row, one token ---------------------------------------------------- */

static float group_q8(const float *x, const int8_t *q, int64_t len)
{
    struct acc8 s = acc8_zero();
    int64_t k = 0;
    for (; k + 8 <= len; k += 8)
        s = madd(s, load8(x + k), q8x8(q + k));
    if (k == len)
        return hsum8(s);
    float l[8];
    store8(l, s);
    for (int j = 0; k + j < len; j++)
        l[j] += x[k + j] * (float)q[k + j];
    return tree8(l);
}

static float group_q4(const float *x, const uint8_t *p, int64_t len)
{
    struct acc8 s = acc8_zero();
    int64_t k = 0;
    for (; k + 32 <= len; k += 32) {
        struct q8f v[4];
        q4x32(p + k / 2, v);
        s = madd(s, load8(x + k), v[0]);
        s = madd(s, load8(x + k + 8), v[1]);
        s = madd(s, load8(x + k + 16), v[2]);
        s = madd(s, load8(x + k + 24), v[3]);
    }
    for (; k + 8 <= len; k += 8)
        s = madd(s, load8(x + k), q4x8(p + k / 2));
    if (k == len)
        return hsum8(s);
    float l[8];
    store8(l, s);
    for (int j = 0; k + j < len; j++)
        l[j] += x[k + j] * (float)q4_at(p, k + j);
    return tree8(l);
}

float shoal_quant_neon_dot(enum shoal_quant_type type, int group, const float *x,
                           const void *row, int64_t n)
{
    const uint8_t *qs = shoal_quant_row_qs(row, n, group);
    float acc = 0.0f;
    for (int64_t i0 = 0, g = 0; i0 < n; i0 += group, g++) {
        const int64_t len = n - i0 < group ? n - i0 : group;
        const float gs = type == SHOAL_QUANT_INT8
                             ? group_q8(x + i0, (const int8_t *)qs + i0, len)
                             : group_q4(x + i0, qs + i0 / 2, len);
        acc += shoal_neon_scale(row, g) * gs;
    }
    return acc;
}

/* ---- four rows, one token (matvec) ---------------------------------------- */

/* Full groups only (len == G, a multiple of 32): four independent chains,
 * row r's group sum in lane r. */
static float32x4_t group4_q8(const float *x, const int8_t *const q[4], int64_t len)
{
    struct acc8 s[4] = {acc8_zero(), acc8_zero(), acc8_zero(), acc8_zero()};
    for (int64_t k = 0; k < len; k += 8) {
        const struct q8f xv = load8(x + k);
        for (int r = 0; r < 4; r++)
            s[r] = madd(s[r], xv, q8x8(q[r] + k));
    }
    return hsum8x4(s[0], s[1], s[2], s[3]);
}

static float32x4_t group4_q4(const float *x, const uint8_t *const p[4], int64_t len)
{
    struct acc8 s[4] = {acc8_zero(), acc8_zero(), acc8_zero(), acc8_zero()};
    for (int64_t k = 0; k < len; k += 32) {
        const struct q8f x0 = load8(x + k), x1 = load8(x + k + 8);
        const struct q8f x2 = load8(x + k + 16), x3 = load8(x + k + 24);
        for (int r = 0; r < 4; r++) {
            struct q8f v[4];
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
    float32x4_t acc = vdupq_n_f32(0.0f);
    int64_t i0 = 0, g = 0;
    for (; i0 + group <= n; i0 += group, g++) {
        float32x4_t gs;
        if (type == SHOAL_QUANT_INT8) {
            const int8_t *q[4] = {(const int8_t *)qs[0] + i0, (const int8_t *)qs[1] + i0,
                                  (const int8_t *)qs[2] + i0, (const int8_t *)qs[3] + i0};
            gs = group4_q8(x + i0, q, group);
        } else {
            const uint8_t *p[4] = {qs[0] + i0 / 2, qs[1] + i0 / 2, qs[2] + i0 / 2,
                                   qs[3] + i0 / 2};
            gs = group4_q4(x + i0, p, group);
        }
        const float dv[4] = {shoal_neon_scale(row[0], g), shoal_neon_scale(row[1], g),
                             shoal_neon_scale(row[2], g), shoal_neon_scale(row[3], g)};
        acc = vaddq_f32(acc, vmulq_f32(vld1q_f32(dv), gs));
    }
    vst1q_f32(out, acc);
    if (i0 == n)
        return;
    /* the partial last group, row by row */
    for (int r = 0; r < 4; r++) {
        const float gs = type == SHOAL_QUANT_INT8
                             ? group_q8(x + i0, (const int8_t *)qs[r] + i0, n - i0)
                             : group_q4(x + i0, qs[r] + i0 / 2, n - i0);
        out[r] += shoal_neon_scale(row[r], g) * gs;
    }
}

/* ---- one row, four tokens (batched): groups unpacked once to f32 ---------- */

static void unpack_group(enum shoal_quant_type type, const uint8_t *qs,
                         int64_t i0, int64_t len, float *qf)
{
    int64_t k = 0;
    if (type == SHOAL_QUANT_INT8) {
        const int8_t *q = (const int8_t *)qs + i0;
        for (; k + 8 <= len; k += 8) {
            const struct q8f v = q8x8(q + k);
            vst1q_f32(qf + k, v.lo);
            vst1q_f32(qf + k + 4, v.hi);
        }
        for (; k < len; k++)
            qf[k] = (float)q[k];
    } else {
        const uint8_t *p = qs + i0 / 2;
        for (; k + 8 <= len; k += 8) {
            const struct q8f v = q4x8(p + k / 2);
            vst1q_f32(qf + k, v.lo);
            vst1q_f32(qf + k + 4, v.hi);
        }
        for (; k < len; k++)
            qf[k] = (float)q4_at(p, k);
    }
}

static float group_f(const float *x, const float *qf, int64_t len)
{
    struct acc8 s = acc8_zero();
    int64_t k = 0;
    for (; k + 8 <= len; k += 8)
        s = madd(s, load8(x + k), load8(qf + k));
    if (k == len)
        return hsum8(s);
    float l[8];
    store8(l, s);
    for (int j = 0; k + j < len; j++)
        l[j] += x[k + j] * qf[k + j];
    return tree8(l);
}

/* four tokens x[t] (each at its group offset) against one unpacked group,
 * token t's group sum in lane t */
static float32x4_t group4_f(const float *const x[4], const float *qf, int64_t len)
{
    struct acc8 s[4] = {acc8_zero(), acc8_zero(), acc8_zero(), acc8_zero()};
    int64_t k = 0;
    for (; k + 8 <= len; k += 8) {
        const struct q8f q = load8(qf + k);
        for (int t = 0; t < 4; t++)
            s[t] = madd(s[t], load8(x[t] + k), q);
    }
    if (k == len)
        return hsum8x4(s[0], s[1], s[2], s[3]);
    float gs[4];
    for (int t = 0; t < 4; t++) {
        float l[8];
        store8(l, s[t]);
        for (int j = 0; k + j < len; j++)
            l[j] += x[t][k + j] * qf[k + j];
        gs[t] = tree8(l);
    }
    return vld1q_f32(gs);
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
    float32x4_t acc4 = vdupq_n_f32(0.0f);   /* nt == 4: token t in lane t */
    float acc = 0.0f;                       /* nt == 1 */
    for (int64_t i0 = 0, g = 0; i0 < n; i0 += group, g++) {
        const int64_t len = n - i0 < group ? n - i0 : group;
        const float d = shoal_neon_scale(row, g);
        unpack_group(w->type, qs, i0, len, qf);
        if (nt == 4) {
            const float *xt[4] = {x + t0 * n + i0, x + (t0 + 1) * n + i0,
                                  x + (t0 + 2) * n + i0, x + (t0 + 3) * n + i0};
            acc4 = vaddq_f32(acc4, vmulq_f32(vdupq_n_f32(d), group4_f(xt, qf, len)));
        } else {
            acc += d * group_f(x + t0 * n + i0, qf, len);
        }
    }
    if (nt == 4) {
        float out[4];
        vst1q_f32(out, acc4);
        for (int64_t t = 0; t < 4; t++)
            y[(t0 + t) * w->rows + r] = out[t];
    } else {
        y[t0 * w->rows + r] = acc;
    }
}

void shoal_quant_neon_linear_rows(float *y, const float *x, int64_t n_tok,
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
                y[t * w->rows + r] = shoal_quant_neon_dot(w->type, w->group, xt,
                                                          base + (size_t)r * row_bytes,
                                                          w->cols);
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

/* ---- INT4A8 (quant.h "Int8 activations") ----------------------------------
 * Baseline ARMv8 NEON (no dotprod needed; quant_neon_dot.c has the sdot and
 * smmla versions). 16 packed bytes are 32 columns (a piece, quant_neon.h).
 * vmull_s8 multiplies nibble (0..15) by activation; the four int16
 * products of a lane add up to at most 4 * 15 * 127, so they are summed in
 * int16, widened pairwise to int32 and accumulated per group (G = 32, 64,
 * 128 is 1, 2 or 4 pieces). A partial last piece goes through a zeroed
 * copy. The integers
 * are exact and the f32 combine runs in group order as the scalar one: the
 * scalar table's bits. */
static void rows_a8_neon(float *y, const struct shoal_quant_act *a, int64_t n_tok,
                         const struct shoal_quant_weight *w, int64_t r0, int64_t r1)
{
    const int64_t n = w->cols;
    const int G = w->group;
    const size_t row_bytes = shoal_quant_row_bytes(SHOAL_QUANT_INT4, n, G);
    const int64_t n_group = (n + G - 1) / G;
    const int pieces = G / 32;
    const uint8x16_t m4 = vdupq_n_u8(0x0f);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * row_bytes;
        const uint8_t *qs = row + 4 * (size_t)n_group;
        for (int64_t t = 0; t < n_tok; t++) {
            const int8_t *q = a->q + t * a->q_stride;
            const float *dx = a->d + t * a->n_group;
            const int32_t *sx = a->s + t * a->n_group;
            float acc = 0.0f;
            for (int64_t g = 0; g < n_group; g++) {
                int32x4_t s32 = vdupq_n_s32(0);
                for (int k = 0; k < pieces && g * G + 32 * k < n; k++) {
                    const int64_t i0 = g * G + 32 * k;           /* first column */
                    const uint8x16_t b = shoal_neon_a8_piece(qs, i0, n);
                    const int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(b, m4));
                    const int8x16_t hi = vreinterpretq_s8_u8(vshrq_n_u8(b, 4));
                    const int8_t *e = shoal_neon_a8_act(q, i0);
                    const int8x16_t ev = vld1q_s8(e), ov = vld1q_s8(e + 64);
                    int16x8_t p = vmull_s8(vget_low_s8(lo), vget_low_s8(ev));
                    p = vaddq_s16(p, vmull_s8(vget_high_s8(lo), vget_high_s8(ev)));
                    p = vaddq_s16(p, vmull_s8(vget_low_s8(hi), vget_low_s8(ov)));
                    p = vaddq_s16(p, vmull_s8(vget_high_s8(hi), vget_high_s8(ov)));
                    s32 = vpadalq_s16(s32, p);
                }
                const int32_t isum = vaddvq_s32(s32) - sx[g];
                acc = acc + (shoal_neon_scale(row, g) * dx[g]) * (float)isum;
            }
            y[t * w->rows + r] = acc;
        }
    }
}

/* ---- rows scaled and added (shoal_quant_axpy_rows) ------------------------ */

/* quant_avx2.c's loop in NEON: 32 columns (inside one group) held in eight
 * vectors while every row adds into them in row order, each element
 * a * (d * q) by separate vmulq_f32 and vaddq_f32, q exact (q8x8, q4x32);
 * the columns past the last whole 32 in scalar. */
void shoal_quant_axpy_rows_neon(enum shoal_quant_type type, int group, float *dst, int64_t n,
                                const void *rows, size_t row_bytes, const float *coef,
                                int64_t coef_stride, int64_t n_rows)
{
    const size_t scales = 4 * (size_t)((n + group - 1) / group);   /* shoal_quant_row_qs */
    int64_t j0 = 0;
    for (; j0 + 32 <= n; j0 += 32) {
        float32x4_t acc[8];
        for (int k = 0; k < 8; k++)
            acc[k] = vld1q_f32(dst + j0 + 4 * k);
        const size_t g = (size_t)(j0 / group);
        const uint8_t *row = (const uint8_t *)rows;
        for (int64_t i = 0; i < n_rows; i++, row += row_bytes) {
            float d;
            memcpy(&d, row + 4 * g, sizeof d);
            const float32x4_t a = vdupq_n_f32(coef[i * coef_stride]), dv = vdupq_n_f32(d);
            struct q8f v[4];
            if (type == SHOAL_QUANT_INT8)
                for (int k = 0; k < 4; k++)
                    v[k] = q8x8((const int8_t *)(row + scales) + j0 + 8 * k);
            else
                q4x32(row + scales + j0 / 2, v);
            for (int k = 0; k < 4; k++) {
                acc[2 * k] = vaddq_f32(acc[2 * k], vmulq_f32(a, vmulq_f32(dv, v[k].lo)));
                acc[2 * k + 1] = vaddq_f32(acc[2 * k + 1], vmulq_f32(a, vmulq_f32(dv, v[k].hi)));
            }
        }
        for (int k = 0; k < 8; k++)
            vst1q_f32(dst + j0 + 4 * k, acc[k]);
    }
    for (int64_t i = 0; j0 < n && i < n_rows; i++) {   /* the rest, in scalar */
        const uint8_t *row = (const uint8_t *)rows + (size_t)i * row_bytes;
        const float a = coef[i * coef_stride];
        for (int64_t j = j0; j < n; j++) {
            float d;
            memcpy(&d, row + 4 * (size_t)(j / group), sizeof d);
            const float v = type == SHOAL_QUANT_INT8 ? (float)((const int8_t *)(row + scales))[j]
                                                     : (float)q4_at(row + scales, j);
            dst[j] = dst[j] + a * (d * v);
        }
    }
}

const struct shoal_quant_ops shoal_quant_ops_neon = {
    .name = "neon",
    .dot = shoal_quant_neon_dot,
    .linear_rows = shoal_quant_neon_linear_rows,
    .linear_rows_a8 = rows_a8_neon,
    .act_quantize = shoal_quant_act_quantize_base,
    .fp8_rows = shoal_fp8_rows_neon,
    .fp8_dequant_row = shoal_fp8_dequant_row_neon,
    .fp8_axpy_rows = shoal_fp8_axpy_rows_neon,
    .mxfp4_rows = shoal_mxfp4_rows_neon,
    .ggml_rows = shoal_ggml_rows_neon,   /* ggml_neon.c */
    .axpy_rows = shoal_quant_axpy_rows_neon,
};

/* ---- FP8 (quant.h "FP8") --------------------------------------------------- */

/* 4 E4M3 codes (widened to u32) -> 4 f32, exactly the table's values (NaN
 * codes excepted: the loader refuses them); the rule of quant_avx2.c's
 * e4m3x8: normal codes rebiased in place, subnormals (2^-6 + m 2^-9) - 2^-6 */
static inline float32x4_t e4m3x4(uint32x4_t c)
{
    const uint32x4_t mag = vandq_u32(c, vdupq_n_u32(0x7f));
    const uint32x4_t sign = vshlq_n_u32(vandq_u32(c, vdupq_n_u32(0x80)), 24);
    const uint32x4_t normal = vaddq_u32(vshlq_n_u32(mag, 20), vdupq_n_u32(120u << 23));
    const uint32x4_t sub_bits = vorrq_u32(vshlq_n_u32(vandq_u32(mag, vdupq_n_u32(7)), 20),
                                          vdupq_n_u32(121u << 23));
    const float32x4_t sub = vsubq_f32(vreinterpretq_f32_u32(sub_bits), vdupq_n_f32(0x1p-6f));
    const uint32x4_t is_sub = vcltq_u32(mag, vdupq_n_u32(8));
    const uint32x4_t v = vbslq_u32(is_sub, vreinterpretq_u32_f32(sub), normal);
    return vreinterpretq_f32_u32(vorrq_u32(v, sign));
}

static void fp8_decode(float *dst, const uint8_t *q, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const uint16x8_t h = vmovl_u8(vld1_u8(q + i));
        vst1q_f32(dst + i, e4m3x4(vmovl_u16(vget_low_u16(h))));
        vst1q_f32(dst + i + 4, e4m3x4(vmovl_u16(vget_high_u16(h))));
    }
    for (; i < n; i++)
        dst[i] = shoal_fp8_e4m3_table[q[i]];
}

/* shoal_dot_f32's order: lanes 0-3 in a, 4-7 in b, the tail on the stored
 * lanes; separate multiply and add (no FMA) */
static float fp8_block_dot(const float *x, const float *w, int64_t len)
{
    float32x4_t a = vdupq_n_f32(0.0f), b = vdupq_n_f32(0.0f);
    int64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        a = vaddq_f32(a, vmulq_f32(vld1q_f32(x + i), vld1q_f32(w + i)));
        b = vaddq_f32(b, vmulq_f32(vld1q_f32(x + i + 4), vld1q_f32(w + i + 4)));
    }
    float s[8];
    vst1q_f32(s, a);
    vst1q_f32(s + 4, b);
    for (int j = 0; i + j < len; j++)
        s[j] += x[i + j] * w[i + j];
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

#define FP8_ROWS_NAME shoal_fp8_rows_neon
#define FP8_DEQUANT_NAME shoal_fp8_dequant_row_neon
#define FP8_AXPY_NAME shoal_fp8_axpy_rows_neon
#include "quant_fp8_impl.h"

/* ---- MXFP4 (quant.h "MXFP4") ----------------------------------------------- */

/* One packed block (16 bytes) -> its 32 values v2(nibble) as 8 x 4 f32 in
 * element order: the nibbles index a 16-byte table of the small integers
 * (tbl), low and high nibbles zip back into element order, then widen and
 * convert (exact). Nibble 8 (-0) decodes as +0, which no result can see
 * (quant.h). */
static inline void mx_block_regs(const uint8_t *q, float32x4_t w[8])
{
    static const int8_t lut_v[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    const int8x16_t lut = vld1q_s8(lut_v);
    const uint8x16_t b = vld1q_u8(q);
    const int8x16_t lo = vqtbl1q_s8(lut, vandq_u8(b, vdupq_n_u8(0x0f)));
    const int8x16_t hi = vqtbl1q_s8(lut, vshrq_n_u8(b, 4));
    const int8x16_t e[2] = {vzip1q_s8(lo, hi), vzip2q_s8(lo, hi)};
    for (int h = 0; h < 2; h++) {
        const int16x8_t l16 = vmovl_s8(vget_low_s8(e[h])), h16 = vmovl_s8(vget_high_s8(e[h]));
        w[4 * h + 0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(l16)));
        w[4 * h + 1] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(l16)));
        w[4 * h + 2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(h16)));
        w[4 * h + 3] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(h16)));
    }
}

/* one block in shoal_dot_f32's order: lanes 0-3 in a, 4-7 in b, then
 * ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)); no FMA */
static inline float mx_block_sum(const float *x, const float32x4_t w[8])
{
    float32x4_t a = vdupq_n_f32(0.0f), b = vdupq_n_f32(0.0f);
    for (int j = 0; j < 4; j++) {
        a = vaddq_f32(a, vmulq_f32(vld1q_f32(x + 8 * j), w[2 * j]));
        b = vaddq_f32(b, vmulq_f32(vld1q_f32(x + 8 * j + 4), w[2 * j + 1]));
    }
    const float32x4_t p = vaddq_f32(a, b);                            /* s_j + s_j+4 */
    const float32x2_t r = vadd_f32(vget_low_f32(p), vget_high_f32(p)); /* p0+p2, p1+p3 */
    return vget_lane_f32(r, 0) + vget_lane_f32(r, 1);
}

static void mx_decode(float *dst, const uint8_t *q, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++) {
        float32x4_t w[8];
        mx_block_regs(q + 16 * b, w);
        for (int j = 0; j < 8; j++)
            vst1q_f32(dst + 32 * b + 4 * j, w[j]);
    }
}

static float mx_block_dot(const float *x, const float *w)
{
    float32x4_t wv[8];
    for (int j = 0; j < 8; j++)
        wv[j] = vld1q_f32(w + 4 * j);
    return mx_block_sum(x, wv);
}

static float mx_row_dot(const float *x, const uint8_t *q, const uint8_t *e, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        float32x4_t w[8];
        mx_block_regs(q + 16 * b, w);
        acc = acc + shoal_mxfp4_d(e[b]) * mx_block_sum(x + 32 * b, w);
    }
    return acc;
}

#define MXFP4_ROWS_NAME shoal_mxfp4_rows_neon
#include "quant_mxfp4_impl.h"
