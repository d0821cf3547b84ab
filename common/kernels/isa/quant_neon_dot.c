/* quant_neon_dot: the INT4A8 rows (quant.h "Int8 activations") with the
 * ARMv8 dot-product instructions, for CPUs that have them (Apple M1 and
 * later, Cortex-A76 / Neoverse N1 and later).
 *
 * Built twice (common/meson.build), each copy its own translation unit so
 * that the baseline table still runs on any ARMv8:
 *   -march=armv8.2-a+dotprod       shoal_quant_ops_neon_dotprod ("neon-dotprod")
 *   -march=armv8.2-a+dotprod+i8mm  shoal_quant_ops_neon_i8mm ("neon-i8mm"),
 *                                  where __ARM_FEATURE_MATMUL_INT8 is defined
 * and quant.c uses a copy only when the CPU reports the instructions
 * (HWCAP_ASIMDDP, HWCAP2_I8MM; FEAT_DotProd, FEAT_I8MM on macOS).
 *
 * sdot (vdotq_s32) adds four int8 x int8 products into each int32 lane: a
 * piece of 32 columns (quant_neon.h) is two of them per row, nibbles (0..15)
 * against the even and the odd activations, and 8 * sum(qx) is subtracted
 * per group (struct shoal_quant_act's s). Four rows run at once against one
 * token, their group sums gathered into one int32x4 by pairwise adds.
 *
 * smmla (vmmlaq_s32) multiplies a 2x8 int8 matrix by the transpose of
 * another into a 2x2 int32 block: two rows' eight nibbles against two
 * tokens' eight activations give (row 0, token 0), (row 0, token 1),
 * (row 1, token 0), (row 1, token 1) in lanes 0..3, 32 products per
 * instruction against sdot's 16. It runs batches (prefill) two tokens at a
 * time; an odd last token and decode (one token) use sdot.
 *
 * The group sums are exact integers, whatever their order; the per-group
 * combine acc = acc + (d[g] * dx[g]) * (float)isum is then the scalar one,
 * lane by lane, with separate vmulq_f32 / vaddq_f32 in the same order
 * (-ffp-contract=off keeps them apart), so every output has the scalar
 * table's bits. The f32 canonical dot and the int4 / int8 linear rows are
 * the baseline NEON ones (quant_neon.c). */
#include <arm_neon.h>
#include <stdint.h>

#include "ggml_dot.h"
#include "quant.h"
#include "quant_neon.h"

#if !defined(__ARM_FEATURE_DOTPROD)
#error "quant_neon_dot.c needs -march=...+dotprod (common/meson.build)"
#endif

/* One output block of the kernels below: up to four rows (row pointers
 * repeat the last real row when fewer are left, and their outputs are
 * dropped) of one INT4 weight. */
struct rows4 {
    const uint8_t *row[4];   /* scales at row[r], quants at qs[r] */
    const uint8_t *qs[4];
    int nr;                  /* real rows, 1..4 */
};

static struct rows4 rows4_at(const struct shoal_quant_weight *w, size_t row_bytes,
                             int64_t n_group, int64_t r, int64_t r1)
{
    struct rows4 b;
    b.nr = r1 - r < 4 ? (int)(r1 - r) : 4;
    for (int k = 0; k < 4; k++) {
        const int64_t rk = k < b.nr ? r + k : r + b.nr - 1;
        b.row[k] = (const uint8_t *)w->data + (size_t)rk * row_bytes;
        b.qs[k] = b.row[k] + 4 * (size_t)n_group;
    }
    return b;
}

/* the four rows' scales of group g, row k in lane k */
static inline float32x4_t scales4(const struct rows4 *b, int64_t g)
{
    const float d[4] = {shoal_neon_scale(b->row[0], g), shoal_neon_scale(b->row[1], g),
                        shoal_neon_scale(b->row[2], g), shoal_neon_scale(b->row[3], g)};
    return vld1q_f32(d);
}

/* ---- sdot: four rows, one token ------------------------------------------- */

/* y of token t (activations a, rows b) into out[k] for row k */
static void sdot_rows4(float out[4], const struct shoal_quant_act *a, int64_t t,
                       const struct rows4 *b, int64_t n, int G)
{
    const int8_t *q = a->q + t * a->q_stride;
    const float *dx = a->d + t * a->n_group;
    const int32_t *sx = a->s + t * a->n_group;
    const uint8x16_t m4 = vdupq_n_u8(0x0f);
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t g = 0; g < a->n_group; g++) {
        int32x4_t s[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
        const int64_t end = (g + 1) * G < n ? (g + 1) * G : n;
        for (int64_t i0 = g * G; i0 < end; i0 += 32) {
            const int8_t *e = shoal_neon_a8_act(q, i0);
            const int8x16_t ev = vld1q_s8(e), ov = vld1q_s8(e + 64);
            for (int k = 0; k < 4; k++) {
                const uint8x16_t p = shoal_neon_a8_piece(b->qs[k], i0, n);
                s[k] = vdotq_s32(s[k], vreinterpretq_s8_u8(vandq_u8(p, m4)), ev);
                s[k] = vdotq_s32(s[k], vreinterpretq_s8_u8(vshrq_n_u8(p, 4)), ov);
            }
        }
        /* lane k: row k's sum of nibble * qx, then minus 8 * sum(qx) */
        const int32x4_t isum = vsubq_s32(vpaddq_s32(vpaddq_s32(s[0], s[1]),
                                                    vpaddq_s32(s[2], s[3])),
                                         vdupq_n_s32(sx[g]));
        const float32x4_t dd = vmulq_f32(scales4(b, g), vdupq_n_f32(dx[g]));
        acc = vaddq_f32(acc, vmulq_f32(dd, vcvtq_f32_s32(isum)));
    }
    vst1q_f32(out, acc);
}

#if defined(__ARM_FEATURE_MATMUL_INT8)

/* ---- smmla: four rows, two tokens ------------------------------------------ */

static inline int8x16_t zip1_64(int8x16_t x, int8x16_t y)
{
    return vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s8(x), vreinterpretq_s64_s8(y)));
}

static inline int8x16_t zip2_64(int8x16_t x, int8x16_t y)
{
    return vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s8(x), vreinterpretq_s64_s8(y)));
}

static inline uint8x16_t zip1_64u(uint8x16_t x, uint8x16_t y)
{
    return vreinterpretq_u8_u64(vzip1q_u64(vreinterpretq_u64_u8(x), vreinterpretq_u64_u8(y)));
}

static inline uint8x16_t zip2_64u(uint8x16_t x, uint8x16_t y)
{
    return vreinterpretq_u8_u64(vzip2q_u64(vreinterpretq_u64_u8(x), vreinterpretq_u64_u8(y)));
}

/* Tokens t and t + 1 against the four rows of b: out[j] holds rows 2j and
 * 2j + 1 as (row 2j, t), (row 2j, t+1), (row 2j+1, t), (row 2j+1, t+1). */
static void mmla_rows4_tok2(float32x4_t out[2], const struct shoal_quant_act *a, int64_t t,
                            const struct rows4 *b, int64_t n, int G)
{
    const int8_t *q0 = a->q + t * a->q_stride, *q1 = q0 + a->q_stride;
    const float *dx0 = a->d + t * a->n_group, *dx1 = dx0 + a->n_group;
    const int32_t *sx0 = a->s + t * a->n_group, *sx1 = sx0 + a->n_group;
    const uint8x16_t m4 = vdupq_n_u8(0x0f);
    float32x4_t acc[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    for (int64_t g = 0; g < a->n_group; g++) {
        int32x4_t s[2] = {vdupq_n_s32(0), vdupq_n_s32(0)};
        const int64_t end = (g + 1) * G < n ? (g + 1) * G : n;
        for (int64_t i0 = g * G; i0 < end; i0 += 32) {
            const int8_t *e0 = shoal_neon_a8_act(q0, i0), *e1 = shoal_neon_a8_act(q1, i0);
            const int8x16_t ev0 = vld1q_s8(e0), ov0 = vld1q_s8(e0 + 64);
            const int8x16_t ev1 = vld1q_s8(e1), ov1 = vld1q_s8(e1 + 64);
            /* 2x8 token blocks: (token t, token t+1) x 8 activations */
            const int8x16_t te_lo = zip1_64(ev0, ev1), te_hi = zip2_64(ev0, ev1);
            const int8x16_t to_lo = zip1_64(ov0, ov1), to_hi = zip2_64(ov0, ov1);
            for (int j = 0; j < 2; j++) {
                const uint8x16_t p0 = shoal_neon_a8_piece(b->qs[2 * j], i0, n);
                const uint8x16_t p1 = shoal_neon_a8_piece(b->qs[2 * j + 1], i0, n);
                /* 2x8 row blocks: (row 2j, row 2j+1) x 8 packed bytes */
                const uint8x16_t w_lo = zip1_64u(p0, p1), w_hi = zip2_64u(p0, p1);
                s[j] = vmmlaq_s32(s[j], vreinterpretq_s8_u8(vandq_u8(w_lo, m4)), te_lo);
                s[j] = vmmlaq_s32(s[j], vreinterpretq_s8_u8(vandq_u8(w_hi, m4)), te_hi);
                s[j] = vmmlaq_s32(s[j], vreinterpretq_s8_u8(vshrq_n_u8(w_lo, 4)), to_lo);
                s[j] = vmmlaq_s32(s[j], vreinterpretq_s8_u8(vshrq_n_u8(w_hi, 4)), to_hi);
            }
        }
        /* lanes (r, t), (r, t+1), (r', t), (r', t+1) */
        const int32_t sxv[4] = {sx0[g], sx1[g], sx0[g], sx1[g]};
        const float dxv[4] = {dx0[g], dx1[g], dx0[g], dx1[g]};
        const int32x4_t sx = vld1q_s32(sxv);
        const float32x4_t dx = vld1q_f32(dxv);
        const float32x4_t d = scales4(b, g);   /* rows 0..3 */
        const float32x4_t dw[2] = {vzip1q_f32(d, d), vzip2q_f32(d, d)};
        for (int j = 0; j < 2; j++) {
            const float32x4_t isum = vcvtq_f32_s32(vsubq_s32(s[j], sx));
            acc[j] = vaddq_f32(acc[j], vmulq_f32(vmulq_f32(dw[j], dx), isum));
        }
    }
    out[0] = acc[0];
    out[1] = acc[1];
}

#endif /* __ARM_FEATURE_MATMUL_INT8 */

/* ---- the rows ----------------------------------------------------------------- */

static void rows_a8(float *y, const struct shoal_quant_act *a, int64_t n_tok,
                    const struct shoal_quant_weight *w, int64_t r0, int64_t r1)
{
    const int64_t n = w->cols;
    const size_t row_bytes = shoal_quant_row_bytes(SHOAL_QUANT_INT4, n, w->group);
    /* four rows at a time, every token against them while they are in L1 */
    for (int64_t r = r0; r < r1; r += 4) {
        const struct rows4 b = rows4_at(w, row_bytes, a->n_group, r, r1);
        int64_t t = 0;
#if defined(__ARM_FEATURE_MATMUL_INT8)
        for (; t + 2 <= n_tok; t += 2) {
            float32x4_t o[2];
            mmla_rows4_tok2(o, a, t, &b, n, w->group);
            float out[8];
            vst1q_f32(out, o[0]);
            vst1q_f32(out + 4, o[1]);
            /* out[2 * k + u]: row k, token t + u */
            for (int k = 0; k < b.nr; k++)
                for (int u = 0; u < 2; u++)
                    y[(t + u) * w->rows + r + k] = out[2 * k + u];
        }
#endif
        for (; t < n_tok; t++) {   /* i8mm: an odd last token */
            float out[4];
            sdot_rows4(out, a, t, &b, n, w->group);
            for (int k = 0; k < b.nr; k++)
                y[t * w->rows + r + k] = out[k];
        }
    }
}

#if defined(__ARM_FEATURE_MATMUL_INT8)
const struct shoal_quant_ops shoal_quant_ops_neon_i8mm = {
    .name = "neon-i8mm",
#else
const struct shoal_quant_ops shoal_quant_ops_neon_dotprod = {
    .name = "neon-dotprod",
#endif
    .dot = shoal_quant_neon_dot,
    .linear_rows = shoal_quant_neon_linear_rows,
    .linear_rows_a8 = rows_a8,
    .act_quantize = shoal_quant_act_quantize_base,
    .fp8_rows = shoal_fp8_rows_neon,
    .fp8_dequant_row = shoal_fp8_dequant_row_neon,
    .fp8_axpy_rows = shoal_fp8_axpy_rows_neon,
    .mxfp4_rows = shoal_mxfp4_rows_neon,
    .ggml_rows = shoal_ggml_rows_neon_dotprod,   /* ggml_neon.c built with +dotprod */
    .axpy_rows = shoal_quant_axpy_rows_neon,
};
