/* quant_mxfp4: E2M1/E8M0 decoding, the MXFP4 checks and binding, and the
 * scalar MXFP4 kernels (quant.h "MXFP4"). */
#include <stdio.h>
#include <string.h>

#include "kernels.h"
#include "quant.h"
#include "safetensors.h"

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

/* "[a, b, c]" of a tensor's shape into buf */
static const char *shape_str(const struct shoal_st_tensor *t, char *buf, size_t cap)
{
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < t->n_dims && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (o < cap)
        snprintf(buf + o, cap - o, "]");
    return buf;
}

int shoal_mxfp4_bind(struct shoal_weight *w, const struct shoal_st_tensor *blocks,
                     const struct shoal_st_tensor *scales, int64_t index, int64_t rows,
                     int64_t cols, int check_exponents, const char *name,
                     struct shoal_err *err)
{
    if (rows < 1 || cols < SHOAL_MXFP4_BLOCK || cols % SHOAL_MXFP4_BLOCK)
        return shoal_err_set(err, SHOAL_EINVAL,
                             "MXFP4 weight '%s': shape [%lld][%lld]; expected rows >= 1 and "
                             "cols a positive multiple of %d", name, (long long)rows,
                             (long long)cols, SHOAL_MXFP4_BLOCK);
    const struct shoal_st_tensor *t[2] = {blocks, scales};
    for (int k = 0; k < 2; k++)
        if (strcmp(t[k]->dtype_name, "U8"))
            return shoal_err_set(err, SHOAL_EFORMAT,
                                 "MXFP4 tensor '%s' in '%s' has dtype %s; expected U8 (%s)",
                                 t[k]->name, t[k]->file, t[k]->dtype_name,
                                 k ? "E8M0 exponents" : "packed E2M1 pairs");
    const int64_t nb = cols / SHOAL_MXFP4_BLOCK;
    /* blocks [(n,) rows, nb, 16], scales [(n,) rows, nb] */
    const int lead = blocks->n_dims - 3;
    int ok = (lead == 0 || lead == 1) && scales->n_dims == lead + 2 &&
             blocks->shape[lead] == rows && blocks->shape[lead + 1] == nb &&
             blocks->shape[lead + 2] == 16 && scales->shape[lead] == rows &&
             scales->shape[lead + 1] == nb && (lead == 0 || blocks->shape[0] == scales->shape[0]);
    const int64_t n = ok && lead ? blocks->shape[0] : 1;
    if (!ok) {
        char b1[96], b2[96];
        return shoal_err_set(err, SHOAL_ESHAPE,
                             "MXFP4 weight '%s': '%s' has shape %s and '%s' %s; expected "
                             "[(n,) %lld, %lld, 16] and [(n,) %lld, %lld]", name, blocks->name,
                             shape_str(blocks, b1, sizeof b1), scales->name,
                             shape_str(scales, b2, sizeof b2), (long long)rows, (long long)nb,
                             (long long)rows, (long long)nb);
    }
    if (index < 0 || index >= n)
        return shoal_err_set(err, SHOAL_EINVAL,
                             "MXFP4 weight '%s': slice %lld of '%s'; expected 0..%lld", name,
                             (long long)index, blocks->name, (long long)(n - 1));
    const size_t qbytes = (size_t)rows * (size_t)(cols / 2), sbytes = (size_t)rows * (size_t)nb;
    if (blocks->nbytes != (size_t)n * qbytes || scales->nbytes != (size_t)n * sbytes)
        return shoal_err_set(err, SHOAL_ESHAPE,
                             "MXFP4 weight '%s': '%s' has %zu bytes and '%s' %zu; expected "
                             "%zu and %zu", name, blocks->name, blocks->nbytes, scales->name,
                             scales->nbytes, (size_t)n * qbytes, (size_t)n * sbytes);
    *w = (struct shoal_weight){.dtype = SHOAL_DTYPE_MXFP4, .rows = rows, .cols = cols,
                               .group = SHOAL_MXFP4_BLOCK,
                               .data = (const uint8_t *)blocks->data + (size_t)index * qbytes,
                               .e8m0 = (const uint8_t *)scales->data + (size_t)index * sbytes};
    return check_exponents ? shoal_mxfp4_check(w, scales->name, err) : 0;
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
