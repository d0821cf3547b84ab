/* quant_mxfp4: E2M1/E8M0 decoding, the MXFP4 checks, and the
 * scalar MXFP4 kernels (quant.h "MXFP4"). */
#include <stdio.h>
#include <string.h>

#include "kernels.h"
#include "quant.h"

/* FP4_VALUES of openai/gpt-oss gpt_oss/torch/weights.py: E2M1 (1 sign bit,
 * 2 exponent bits of bias 1, 1 mantissa bit; exponent 0: m * 0.5). Exact
 * literals; tests/unit/test_quant.c recomputes each from the formula. */
const float shoal_mxfp4_e2m1_table[16] = {
    0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
};

/* v2(nibble) = 2 * e2m1(nibble), the kernels' integer values */
static const float v2_table[16] = {
    0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 6.0f, 8.0f, 12.0f,
    -0.0f, -1.0f, -2.0f, -3.0f, -4.0f, -6.0f, -8.0f, -12.0f,
};

static int e_ok(uint8_t e)
{
    return e >= 127 - SHOAL_MXFP4_EMAX_DELTA && e <= 127 + SHOAL_MXFP4_EMAX_DELTA;
}

int shoal_mxfp4_check(const struct shoal_weight *w, const char *name, struct shoal_err *err)
{
    if (w->dtype != SHOAL_DTYPE_MXFP4 || w->group != SHOAL_MXFP4_BLOCK || !w->data ||
        !w->e8m0 || w->rows < 1 || w->cols < SHOAL_MXFP4_BLOCK ||
        w->cols % SHOAL_MXFP4_BLOCK)
        return shoal_err_set(err, SHOAL_EINVAL,
                             "tensor '%s': expected an MXFP4 weight [rows][cols], cols a "
                             "multiple of %d, with its exponents; found dtype %s, [%lld][%lld], "
                             "group %d, %s", name, SHOAL_MXFP4_BLOCK, shoal_dtype_name(w->dtype),
                             (long long)w->rows, (long long)w->cols, w->group,
                             w->e8m0 ? "exponents set" : "no exponents");
    const int64_t nb = w->cols / SHOAL_MXFP4_BLOCK;
    for (int64_t r = 0; r < w->rows; r++) {
        const uint8_t *e = shoal_mxfp4_row_e(w, r);
        for (int64_t b = 0; b < nb; b++)
            if (!e_ok(e[b]))
                return shoal_err_set(err, SHOAL_EFORMAT,
                                     "tensor '%s': E8M0 scale at (row %lld, block %lld) is "
                                     "%u%s; expected %d..%d (scales 2^-%d..2^%d)", name,
                                     (long long)r, (long long)b, e[b],
                                     e[b] == 255 ? " (NaN)" : "",
                                     127 - SHOAL_MXFP4_EMAX_DELTA, 127 + SHOAL_MXFP4_EMAX_DELTA,
                                     SHOAL_MXFP4_EMAX_DELTA, SHOAL_MXFP4_EMAX_DELTA);
    }
    return 0;
}

#define MXFP4_ROWS_NAME shoal_mxfp4_rows_scalar
/* the scalar table's primitives */
static void mx_decode(float *dst, const uint8_t *q, int64_t nb);
static float mx_block_dot(const float *x, const float *w);
static float mx_row_dot(const float *x, const uint8_t *q, const uint8_t *e, int64_t nb);
#include "quant_mxfp4_impl.h"

void shoal_mxfp4_dequantize_row(float *dst, const struct shoal_weight *w, int64_t r)
{
    const int64_t nb = w->cols / SHOAL_MXFP4_BLOCK;
    const uint8_t *q = shoal_mxfp4_row_q(w, r);
    const uint8_t *e = shoal_mxfp4_row_e(w, r);
    for (int64_t b = 0; b < nb; b++) {
        const float d = shoal_mxfp4_d(e[b]);
        float *o = dst + b * SHOAL_MXFP4_BLOCK;
        for (int k = 0; k < 16; k++) {
            o[2 * k] = v2_table[q[16 * b + k] & 15];
            o[2 * k + 1] = v2_table[q[16 * b + k] >> 4];
        }
        for (int k = 0; k < SHOAL_MXFP4_BLOCK; k++)
            o[k] = o[k] * d;
    }
}

float shoal_mxfp4_dot_ref(const float *x, const struct shoal_weight *w, int64_t r)
{
    const int64_t nb = w->cols / SHOAL_MXFP4_BLOCK;
    const uint8_t *q = shoal_mxfp4_row_q(w, r);
    const uint8_t *e = shoal_mxfp4_row_e(w, r);
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int k = 0; k < SHOAL_MXFP4_BLOCK; k++) {
            const uint8_t byte = q[16 * b + k / 2];
            const float v = v2_table[k % 2 ? byte >> 4 : byte & 15];
            s[k % 8] = s[k % 8] + x[SHOAL_MXFP4_BLOCK * b + k] * v;
        }
        const float bsum = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
        acc = acc + shoal_mxfp4_d(e[b]) * bsum;
    }
    return acc;
}

void shoal_mxfp4_linear_part(float *y, const float *x, int64_t n_tok,
                             const struct shoal_weight *w, int ith, int nth)
{
    int64_t r0, r1;
    shoal_split_rows(w->rows, ith, nth, &r0, &r1);
    if (r0 < r1)
        shoal_quant_active_ops()->mxfp4_rows(y, x, n_tok, w, r0, r1);
}

/* ---- the scalar table's primitives ---------------------------------------- */

static void mx_decode(float *dst, const uint8_t *q, int64_t nb)
{
    for (int64_t i = 0; i < 16 * nb; i++) {
        dst[2 * i] = v2_table[q[i] & 15];
        dst[2 * i + 1] = v2_table[q[i] >> 4];
    }
}

static float mx_block_dot(const float *x, const float *w)
{
    return shoal_dot_f32(x, w, SHOAL_MXFP4_BLOCK);
}

static float mx_row_dot(const float *x, const uint8_t *q, const uint8_t *e, int64_t nb)
{
    float wf[SHOAL_MXFP4_BLOCK], acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        mx_decode(wf, q + 16 * b, 1);
        acc = acc + shoal_mxfp4_d(e[b]) * mx_block_dot(x + SHOAL_MXFP4_BLOCK * b, wf);
    }
    return acc;
}
