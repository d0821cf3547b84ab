#include "kernels.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "ggml_dot.h"
#include "kv.h"
#include "quant.h"
#include "util.h"

float shoal_dot_f32(const float *a, const float *b, int64_t n)
{
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            s[j] += a[i + j] * b[i + j];
    for (int j = 0; i + j < n; j++)
        s[j] += a[i + j] * b[i + j];
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

void shoal_linear(float *y, const float *x, int64_t n_tok,
                  const struct shoal_weight *w, const struct shoal_weight *bias)
{
    const struct shoal_linear_job job = {y, x, n_tok, w, bias};
    shoal_linear_many(&job, 1);
}

void shoal_linear_many(const struct shoal_linear_job *jobs, int n_jobs)
{
    enum { MAX_JOBS = 8 };
    float *bias_f32[MAX_JOBS] = {0};
    if (n_jobs > MAX_JOBS) {   /* a programmer error; stay correct anyway */
        for (int k = 0; k < n_jobs; k++)
            shoal_linear(jobs[k].y, jobs[k].x, jobs[k].n_tok, jobs[k].w, jobs[k].bias);
        return;
    }
    for (int k = 0; k < n_jobs; k++) {
        const struct shoal_weight *b = jobs[k].bias;
        if (b && b->data) {
            bias_f32[k] = shoal_xmalloc((size_t)jobs[k].w->rows * sizeof(float));
            shoal_to_f32(bias_f32[k], b->data, b->dtype, (size_t)jobs[k].w->rows);
        }
    }
#pragma omp parallel
    {
        const int nth = omp_get_num_threads(), ith = omp_get_thread_num();
        for (int k = 0; k < n_jobs; k++) {
            const struct shoal_linear_job *j = &jobs[k];
            /* the next job's rows are prefetched while this one finishes */
            shoal_linear_prefetch_next(k + 1 < n_jobs ? jobs[k + 1].w : NULL, ith, nth);
            shoal_linear_part(j->y, j->x, j->n_tok, j->w, ith, nth, NULL);
            if (bias_f32[k]) {
                const int64_t rows = j->w->rows;
                int64_t r0, r1;
                shoal_split_rows(rows, ith, nth, &r0, &r1);
                for (int64_t t = 0; t < j->n_tok; t++)
                    for (int64_t r = r0; r < r1; r++)
                        j->y[t * rows + r] += bias_f32[k][r];
            }
        }
    }
    for (int k = 0; k < n_jobs; k++)
        free(bias_f32[k]);
}

/* a GGML weight as the ggml kernels take it */
static struct shoal_ggml_matrix as_ggml(const struct shoal_weight *w)
{
    return (struct shoal_ggml_matrix){.type = (enum shoal_ggml_type)w->ggml_type,
                                      .rows = w->rows, .cols = w->cols, .data = w->data};
}

/* A quantized (INT8, INT4, INT4A8) weight as the quant kernels take it */
static struct shoal_quant_weight as_quant(const struct shoal_weight *w)
{
    return (struct shoal_quant_weight){
        .type = w->dtype == SHOAL_DTYPE_INT8 ? SHOAL_QUANT_INT8 : SHOAL_QUANT_INT4,
        .group = w->group, .rows = w->rows, .cols = w->cols, .data = w->data};
}

void shoal_linear_part(float *y, const float *x, int64_t n_tok,
                       const struct shoal_weight *w, int ith, int nth, float *row_buf)
{
    const int64_t rows = w->rows, cols = w->cols;
    if (shoal_dtype_is_quant(w->dtype)) {
        const struct shoal_quant_weight qw = as_quant(w);
        if (w->dtype == SHOAL_DTYPE_INT4A8)
            shoal_quant_linear_a8_part(y, x, n_tok, &qw, ith, nth);
        else
            shoal_quant_linear_part(y, x, n_tok, &qw, ith, nth);
        return;
    }
    if (w->dtype == SHOAL_DTYPE_FP8) {
        shoal_fp8_linear_part(y, x, n_tok, w, ith, nth);
        return;
    }
    if (w->dtype == SHOAL_DTYPE_MXFP4) {
        shoal_mxfp4_linear_part(y, x, n_tok, w, ith, nth);
        return;
    }
    if (w->dtype == SHOAL_DTYPE_GGML) {   /* a GGUF file's Q8_0 / Q4_K / Q6_K */
        const struct shoal_ggml_matrix gm = as_ggml(w);
        shoal_ggml_linear_part(y, x, n_tok, &gm, ith, nth);
        return;
    }
    int64_t r0, r1;
    shoal_split_rows(rows, ith, nth, &r0, &r1);
    if (w->dtype == SHOAL_DTYPE_F32 || w->dtype == SHOAL_DTYPE_F16 ||
        w->dtype == SHOAL_DTYPE_BF16) {
        /* the rows as K rows and the tokens as queries (kv.h: the canonical
         * dot, each weight element loaded once for 4 tokens), in tiles of
         * about 64 KiB of weights that stay in L2 while every token passes */
        const int64_t rb = cols * (int64_t)shoal_dtype_size(w->dtype);
        const int64_t tile = rb >= (64 << 10) ? 1 : (64 << 10) / rb;
        for (int64_t r = r0; r < r1; r += tile)
            shoal_kv_scores_many(y + r, rows, x, cols, n_tok, shoal_weight_row(w, r), cols,
                                 r1 - r < tile ? r1 - r : tile, cols, w->dtype);
        return;
    }
    float *row = NULL;
    if (w->dtype != SHOAL_DTYPE_F32)
        row = row_buf ? row_buf : shoal_xmalloc((size_t)cols * sizeof(float));
    for (int64_t r = r0; r < r1; r++) {
        const float *wr;
        if (row) {
            shoal_to_f32(row, shoal_weight_row(w, r), w->dtype, (size_t)cols);
            wr = row;
        } else {
            wr = shoal_weight_row(w, r);
        }
        for (int64_t t = 0; t < n_tok; t++)
            y[t * rows + r] = shoal_dot_f32(x + t * cols, wr, cols);
    }
    if (row && !row_buf)
        free(row);
}

void shoal_rmsnorm(float *y, const float *x, int64_t n_rows, int64_t n,
                   const struct shoal_weight *weight, float eps)
{
    /* the weight as f32: itself, or converted (exactly) 512 elements at a
     * time, once for all rows when it fits (per-head norms: 128) */
    enum { CHUNK = 512 };
    float wbuf[CHUNK];
    const size_t es = shoal_dtype_size(weight->dtype);
    const int is_f32 = weight->dtype == SHOAL_DTYPE_F32, once = !is_f32 && n <= CHUNK;
    if (once)
        shoal_to_f32(wbuf, weight->data, weight->dtype, (size_t)n);
    for (int64_t r = 0; r < n_rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        float ss = shoal_dot_f32(xr, xr, n);
        float scale = 1.0f / sqrtf(ss / (float)n + eps);
        for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
            const int64_t m = n - i0 < CHUNK ? n - i0 : CHUNK;
            const float *w = is_f32 ? (const float *)weight->data + i0 : wbuf;
            if (!is_f32 && !once)
                shoal_to_f32(wbuf, (const char *)weight->data + (size_t)i0 * es, weight->dtype,
                             (size_t)m);
            for (int64_t i = 0; i < m; i++)   /* HF: weight * (x * rsqrt(var + eps)) */
                yr[i0 + i] = w[i] * (xr[i0 + i] * scale);
        }
    }
}

/* 2^(j/32), j = 0 .. 31, as the nearest doubles (kernels.h) */
const double shoal_exp2_j32[32] = {
    0x1.0000000000000p+0,
    0x1.059b0d3158574p+0,
    0x1.0b5586cf9890fp+0,
    0x1.11301d0125b51p+0,
    0x1.172b83c7d517bp+0,
    0x1.1d4873168b9aap+0,
    0x1.2387a6e756238p+0,
    0x1.29e9df51fdee1p+0,
    0x1.306fe0a31b715p+0,
    0x1.371a7373aa9cbp+0,
    0x1.3dea64c123422p+0,
    0x1.44e086061892dp+0,
    0x1.4bfdad5362a27p+0,
    0x1.5342b569d4f82p+0,
    0x1.5ab07dd485429p+0,
    0x1.6247eb03a5585p+0,
    0x1.6a09e667f3bcdp+0,
    0x1.71f75e8ec5f74p+0,
    0x1.7a11473eb0187p+0,
    0x1.82589994cce13p+0,
    0x1.8ace5422aa0dbp+0,
    0x1.93737b0cdc5e5p+0,
    0x1.9c49182a3f090p+0,
    0x1.a5503b23e255dp+0,
    0x1.ae89f995ad3adp+0,
    0x1.b7f76f2fb5e47p+0,
    0x1.c199bdd85529cp+0,
    0x1.cb720dcef9069p+0,
    0x1.d5818dcfba487p+0,
    0x1.dfc97337b9b5fp+0,
    0x1.ea4afa2a490dap+0,
    0x1.f50765b6e4540p+0,
};

float shoal_expf(float xf)
{
    if (xf != xf)
        return xf + xf;                    /* NaN */
    if (xf > 128.0f)
        return INFINITY;                   /* e^88.73 is past FLT_MAX already */
    if (xf < -128.0f)
        return 0.0f;                       /* e^-103.98 is below the subnormals */
    const double x = xf;
    const double z = x * 0x1.71547652b82fep+5;          /* x * 32 / ln 2, |z| < 5910 */
    const double kd = (z + 0x1.8p52) - 0x1.8p52;        /* nearest integer, ties to even */
    const double y = (z - kd) * 0x1.62e42fefa39efp-6;   /* (z - k) * ln 2 / 32: exact z - k */
    const double p =
        1.0 + y * (1.0 + y * (0.5 + y * (1.0 / 6.0 + y * (1.0 / 24.0 + y * (1.0 / 120.0)))));
    const int64_t k = (int64_t)kd;
    const int64_t j = k & 31, e = (k - j) / 32;         /* k = 32 e + j, e in [-185, 185] */
    uint64_t bits = (uint64_t)(e + 1023) << 52;         /* 2^e */
    double two_e;
    memcpy(&two_e, &bits, sizeof two_e);
    return (float)(shoal_exp2_j32[j] * p * two_e);
}

void shoal_softmax(float *x, int64_t n)
{
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        if (x[i] > mx)
            mx = x[i];
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        x[i] = shoal_expf(x[i] - mx);
        sum += x[i];
    }
    float inv = 1.0f / sum;
    for (int64_t i = 0; i < n; i++)
        x[i] *= inv;
}

void shoal_linear_prefetch_next(const struct shoal_weight *w, int ith, int nth)
{
    if (w && w->dtype == SHOAL_DTYPE_GGML) {
        const struct shoal_ggml_matrix g = as_ggml(w);
        shoal_ggml_prefetch_next(&g, ith, nth);
    } else {
        shoal_ggml_prefetch_next(NULL, ith, nth);
    }
    if (!w || w->dtype != SHOAL_DTYPE_INT4A8) {
        shoal_quant_prefetch_next(NULL, ith, nth);
        return;
    }
    const struct shoal_quant_weight q = as_quant(w);
    shoal_quant_prefetch_next(&q, ith, nth);
}

void shoal_linear_pair_part(float *y0, float *y1, const float *x, int64_t n_tok,
                            const struct shoal_weight *w0, const struct shoal_weight *w1,
                            int ith, int nth, float *row_buf)
{
    if (w0->dtype == SHOAL_DTYPE_INT4A8 && w1->dtype == SHOAL_DTYPE_INT4A8 &&
        w0->cols == w1->cols && w0->group == w1->group) {
        const struct shoal_quant_weight q0 = as_quant(w0), q1 = as_quant(w1);
        float *const y[2] = {y0, y1};
        const struct shoal_quant_weight *const w[2] = {&q0, &q1};
        shoal_quant_linear_a8_many_part(y, x, n_tok, w, 2, ith, nth);
        return;
    }
    if (w0->dtype == SHOAL_DTYPE_GGML && w1->dtype == SHOAL_DTYPE_GGML) {
        /* w0's rows prefetch w1's first; w1's, what was hinted for the pair */
        const struct shoal_ggml_matrix g0 = as_ggml(w0), g1 = as_ggml(w1);
        const struct shoal_ggml_hint keep = shoal_ggml_hint_take();
        shoal_ggml_prefetch_next(&g1, ith, nth);
        shoal_ggml_linear_part(y0, x, n_tok, &g0, ith, nth);
        shoal_ggml_hint_put(keep);
        shoal_ggml_linear_part(y1, x, n_tok, &g1, ith, nth);
        return;
    }
    shoal_linear_part(y0, x, n_tok, w0, ith, nth, row_buf);
    shoal_linear_part(y1, x, n_tok, w1, ith, nth, row_buf);
}
