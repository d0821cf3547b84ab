/* quant_fp8: E4M3 decoding, the FP8 checks and the scalar FP8 kernels
 * (quant.h "FP8"). */
#include <math.h>
#include <string.h>

#include "kernels.h"
#include "quant.h"

/* Generated from the E4M3FN definition (sign, exponent bias 7, 3 mantissa
 * bits; exponent 0: subnormal m * 2^-9; S.1111.111: NaN). Every value is a
 * dyadic rational with at most 4 significant bits, so the decimal literals
 * are exact. tests/unit/test_quant.c recomputes each from the formula. */
const float shoal_fp8_e4m3_table[256] = {
    0.0f, 0.001953125f, 0.00390625f, 0.005859375f,
    0.0078125f, 0.009765625f, 0.01171875f, 0.013671875f,
    0.015625f, 0.017578125f, 0.01953125f, 0.021484375f,
    0.0234375f, 0.025390625f, 0.02734375f, 0.029296875f,
    0.03125f, 0.03515625f, 0.0390625f, 0.04296875f,
    0.046875f, 0.05078125f, 0.0546875f, 0.05859375f,
    0.0625f, 0.0703125f, 0.078125f, 0.0859375f,
    0.09375f, 0.1015625f, 0.109375f, 0.1171875f,
    0.125f, 0.140625f, 0.15625f, 0.171875f,
    0.1875f, 0.203125f, 0.21875f, 0.234375f,
    0.25f, 0.28125f, 0.3125f, 0.34375f,
    0.375f, 0.40625f, 0.4375f, 0.46875f,
    0.5f, 0.5625f, 0.625f, 0.6875f,
    0.75f, 0.8125f, 0.875f, 0.9375f,
    1.0f, 1.125f, 1.25f, 1.375f,
    1.5f, 1.625f, 1.75f, 1.875f,
    2.0f, 2.25f, 2.5f, 2.75f,
    3.0f, 3.25f, 3.5f, 3.75f,
    4.0f, 4.5f, 5.0f, 5.5f,
    6.0f, 6.5f, 7.0f, 7.5f,
    8.0f, 9.0f, 10.0f, 11.0f,
    12.0f, 13.0f, 14.0f, 15.0f,
    16.0f, 18.0f, 20.0f, 22.0f,
    24.0f, 26.0f, 28.0f, 30.0f,
    32.0f, 36.0f, 40.0f, 44.0f,
    48.0f, 52.0f, 56.0f, 60.0f,
    64.0f, 72.0f, 80.0f, 88.0f,
    96.0f, 104.0f, 112.0f, 120.0f,
    128.0f, 144.0f, 160.0f, 176.0f,
    192.0f, 208.0f, 224.0f, 240.0f,
    256.0f, 288.0f, 320.0f, 352.0f,
    384.0f, 416.0f, 448.0f, NAN,
    -0.0f, -0.001953125f, -0.00390625f, -0.005859375f,
    -0.0078125f, -0.009765625f, -0.01171875f, -0.013671875f,
    -0.015625f, -0.017578125f, -0.01953125f, -0.021484375f,
    -0.0234375f, -0.025390625f, -0.02734375f, -0.029296875f,
    -0.03125f, -0.03515625f, -0.0390625f, -0.04296875f,
    -0.046875f, -0.05078125f, -0.0546875f, -0.05859375f,
    -0.0625f, -0.0703125f, -0.078125f, -0.0859375f,
    -0.09375f, -0.1015625f, -0.109375f, -0.1171875f,
    -0.125f, -0.140625f, -0.15625f, -0.171875f,
    -0.1875f, -0.203125f, -0.21875f, -0.234375f,
    -0.25f, -0.28125f, -0.3125f, -0.34375f,
    -0.375f, -0.40625f, -0.4375f, -0.46875f,
    -0.5f, -0.5625f, -0.625f, -0.6875f,
    -0.75f, -0.8125f, -0.875f, -0.9375f,
    -1.0f, -1.125f, -1.25f, -1.375f,
    -1.5f, -1.625f, -1.75f, -1.875f,
    -2.0f, -2.25f, -2.5f, -2.75f,
    -3.0f, -3.25f, -3.5f, -3.75f,
    -4.0f, -4.5f, -5.0f, -5.5f,
    -6.0f, -6.5f, -7.0f, -7.5f,
    -8.0f, -9.0f, -10.0f, -11.0f,
    -12.0f, -13.0f, -14.0f, -15.0f,
    -16.0f, -18.0f, -20.0f, -22.0f,
    -24.0f, -26.0f, -28.0f, -30.0f,
    -32.0f, -36.0f, -40.0f, -44.0f,
    -48.0f, -52.0f, -56.0f, -60.0f,
    -64.0f, -72.0f, -80.0f, -88.0f,
    -96.0f, -104.0f, -112.0f, -120.0f,
    -128.0f, -144.0f, -160.0f, -176.0f,
    -192.0f, -208.0f, -224.0f, -240.0f,
    -256.0f, -288.0f, -320.0f, -352.0f,
    -384.0f, -416.0f, -448.0f, NAN,
};

int64_t shoal_fp8_find_nan(const uint8_t *codes, size_t n)
{
    /* 8 bytes at a time: a byte is 0x7f or 0xff iff its low 7 bits are all
     * ones, i.e. (b & 0x7f) + 1 carries into bit 7 */
    size_t i = 0;
    const uint64_t low7 = 0x7f7f7f7f7f7f7f7full, ones = 0x0101010101010101ull,
                   high = 0x8080808080808080ull;
    for (; i + 8 <= n; i += 8) {
        uint64_t v;
        memcpy(&v, codes + i, 8);
        if ((((v & low7) + ones) & high) != 0)
            break;
    }
    for (; i < n; i++)
        if ((codes[i] & 0x7f) == 0x7f)
            return (int64_t)i;
    return -1;
}

int shoal_fp8_check(const struct shoal_weight *w, int check_codes, const char *name,
                    struct shoal_err *err)
{
    if (w->dtype != SHOAL_DTYPE_FP8 || w->group != SHOAL_FP8_BLOCK || !w->data ||
        !w->scale || w->rows < 1 || w->cols < 1)
        return shoal_err_set(err, SHOAL_EINVAL,
                             "tensor '%s': expected an FP8 weight with %dx%d block scales, "
                             "found dtype %s, block %d, %s", name, SHOAL_FP8_BLOCK,
                             SHOAL_FP8_BLOCK, shoal_dtype_name(w->dtype), w->group,
                             w->scale ? "scales set" : "no scales");
    const int64_t B = w->group, nbr = (w->rows + B - 1) / B, nbc = (w->cols + B - 1) / B;
    for (int64_t i = 0; i < nbr * nbc; i++) {
        float s;
        memcpy(&s, w->scale + i, sizeof s);
        if (!isfinite(s))
            return shoal_err_set(err, SHOAL_EFORMAT,
                                 "tensor '%s': block scale [%lld][%lld] is %g; expected a "
                                 "finite f32", name, (long long)(i / nbc),
                                 (long long)(i % nbc), (double)s);
    }
    if (!check_codes)
        return 0;
    const size_t n = (size_t)w->rows * (size_t)w->cols;
    const uint8_t *q = w->data;
    const int64_t bad = shoal_fp8_find_nan(q, n);
    if (bad >= 0)
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "tensor '%s': FP8 code 0x%02x at (row %lld, col %lld) is NaN; "
                             "expected finite E4M3 weights", name, q[bad],
                             (long long)(bad / w->cols), (long long)(bad % w->cols));
    return 0;
}

void shoal_fp8_dequantize_row(float *dst, const struct shoal_weight *w, int64_t r)
{
    shoal_quant_active_ops()->fp8_dequant_row(dst, w, r);   /* the same bits on every table */
}

void shoal_fp8_axpy_rows(float *dst, const struct shoal_weight *w, int64_t r0, int64_t n_rows,
                         const float *coef, int64_t coef_stride)
{
    shoal_quant_active_ops()->fp8_axpy_rows(dst, w, r0, n_rows, coef, coef_stride);
}

float shoal_fp8_dot_ref(const float *x, const struct shoal_weight *w, int64_t r)
{
    const int64_t B = w->group, nbc = (w->cols + B - 1) / B;
    const uint8_t *q = (const uint8_t *)w->data + (size_t)r * (size_t)w->cols;
    const float *sc = w->scale + (r / B) * nbc;
    float acc = 0.0f;
    for (int64_t i0 = 0; i0 < w->cols; i0 += B) {
        const int64_t len = w->cols - i0 < B ? w->cols - i0 : B;
        float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t k = 0; k < len; k++)
            s[k % 8] = s[k % 8] + x[i0 + k] * shoal_fp8_e4m3_table[q[i0 + k]];
        const float bsum = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
        acc = acc + sc[i0 / B] * bsum;
    }
    return acc;
}

void shoal_fp8_linear_part(float *y, const float *x, int64_t n_tok,
                           const struct shoal_weight *w, int ith, int nth)
{
    int64_t r0, r1;
    shoal_split_rows(w->rows, ith, nth, &r0, &r1);
    if (r0 < r1)
        shoal_quant_active_ops()->fp8_rows(y, x, n_tok, w, r0, r1);
}

/* ---- the scalar table's primitives ---------------------------------------- */

static void fp8_decode(float *dst, const uint8_t *q, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = shoal_fp8_e4m3_table[q[i]];
}

static float fp8_block_dot(const float *x, const float *w, int64_t len)
{
    return shoal_dot_f32(x, w, len);
}

#define FP8_ROWS_NAME shoal_fp8_rows_scalar
#define FP8_DEQUANT_NAME shoal_fp8_dequant_row_scalar
#define FP8_AXPY_NAME shoal_fp8_axpy_rows_scalar
#include "quant_fp8_impl.h"
