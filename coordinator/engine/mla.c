/* mla: absorbed MLA products (mla.h). */
#include "mla.h"

#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "util.h"

/* tokens up to which absorb_q weights W^UK's quantized rows per token
 * (shoal_weight_axpy_rows) instead of converting each row once for all:
 * 32 heads of 128 x 512 int4a8 on one Zen 4 thread, 0.18 ms a token
 * against 0.93 ms + 0.165 ms a token (1.3x ahead at 12 tokens; even near
 * 60) */
#define MLA_AXPY_MAX_TOK 32

/* y[t] = rows [r0, r0 + n_out) of w (a weight of n_in columns) times x[t]
 * for n tokens whose inputs lie x_ld floats apart and whose outputs go
 * y_ld floats apart: one head's matrix of the split wk_b / wv_b, in the
 * calling thread (shoal_linear_part with nth 1: the bits of shoal_linear).
 * xs [n][n_in] and ys [n][n_out] are scratch the caller frees. */
static void head_linear(float *y, int64_t y_ld, const float *x, int64_t x_ld, int64_t n,
                        const struct shoal_weight *w, int64_t r0, int64_t n_out, float **xs,
                        float **ys, float *row)
{
    struct shoal_weight view;
    const int64_t n_in = w->cols;
    if (shoal_weight_rows_view(w, r0, n_out, &view))
        abort();   /* programmer invariant: bind_kv_b checked the shape; no FP8 here */
    if (!*xs) {
        *xs = shoal_xmalloc((size_t)(n * n_in) * sizeof(float));
        *ys = shoal_xmalloc((size_t)(n * n_out) * sizeof(float));
    }
    for (int64_t t = 0; t < n; t++)
        memcpy(*xs + t * n_in, x + t * x_ld, (size_t)n_in * sizeof(float));
    shoal_linear_part(*ys, *xs, n, &view, 0, 1, row);
    for (int64_t t = 0; t < n; t++)
        memcpy(y + t * y_ld, *ys + t * n_out, (size_t)n_out * sizeof(float));
}

void shoal_mla_absorb_q(float *qm, const float *q, int64_t n, const struct shoal_weight *wkv_b,
                        const struct shoal_weight *wk_b, const struct shoal_model_config *c,
                        float *row, int ith, int nth)
{
    const int64_t H = c->n_head, nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim;
    const int64_t kvl = c->kv_lora_rank, hd = nope + rope, mr = kvl + rope;
    const int64_t per_head = nope + c->v_head_dim;
    int64_t h0, h1;
    shoal_split_rows(H, ith, nth, &h0, &h1);
    float *xs = NULL, *ys = NULL;
    for (int64_t h = h0; h < h1; h++) {
        for (int64_t t = 0; t < n; t++) {
            float *dst = qm + (t * H + h) * mr;
            memset(dst, 0, (size_t)kvl * sizeof(float));
            memcpy(dst + kvl, q + (t * H + h) * hd + nope, (size_t)rope * sizeof(float));
        }
        if (wk_b && wk_b->data) {   /* W^UK_h^T as shipped: a matvec of its kvl rows */
            head_linear(qm + h * mr, H * mr, q + h * hd, H * hd, n, wk_b, h * kvl, kvl, &xs,
                        &ys, row);
            continue;
        }
        /* a few tokens: the rows of W^UK_h weighted by each token's q_nope
         * straight from their bytes (decode: no f32 row per row and
         * token); more (long prompts): each row converted once for all. The
         * same bits either way: each element's sum runs over i in order. */
        int64_t done = 0;
        if (n <= MLA_AXPY_MAX_TOK)
            for (; done < n; done++)
                if (shoal_weight_axpy_rows(qm + (done * H + h) * mr, wkv_b, h * per_head, nope,
                                           q + (done * H + h) * hd, 1))
                    break;   /* another dtype (done is 0): all tokens below */
        if (done == n)
            continue;
        for (int64_t i = 0; i < nope; i++) {
            shoal_weight_row_to_f32(row, wkv_b, h * per_head + i);   /* W^UK_h row i */
            for (int64_t t = 0; t < n; t++) {
                const float a = q[(t * H + h) * hd + i];
                float *dst = qm + (t * H + h) * mr;
                for (int64_t j = 0; j < kvl; j++)
                    dst[j] = dst[j] + a * row[j];
            }
        }
    }
    free(xs);
    free(ys);
}

void shoal_mla_out(float *ov, const float *att, int64_t n, const struct shoal_weight *wkv_b,
                   const struct shoal_weight *wv_b, const struct shoal_model_config *c,
                   float *row, int ith, int nth)
{
    const int64_t H = c->n_head, nope = c->qk_nope_head_dim, vh = c->v_head_dim;
    const int64_t kvl = c->kv_lora_rank, mr = kvl + c->qk_rope_head_dim;
    const int64_t per_head = nope + vh;
    int64_t h0, h1;
    shoal_split_rows(H, ith, nth, &h0, &h1);
    float *x = NULL, *y = NULL;
    for (int64_t h = h0; h < h1; h++) {
        if (wv_b && wv_b->data) {   /* W^UV_h as shipped */
            head_linear(ov + h * vh, H * vh, att + h * mr, H * mr, n, wv_b, h * vh, vh, &x, &y,
                        row);
            continue;
        }
        struct shoal_weight uv;
        if (shoal_weight_rows_view(wkv_b, h * per_head + nope, vh, &uv) == 0) {
            /* W^UV_h as a weight of its own: the dtype's linear kernels */
            if (!x) {
                x = shoal_xmalloc((size_t)(n * kvl) * sizeof(float));
                y = shoal_xmalloc((size_t)(n * vh) * sizeof(float));
            }
            for (int64_t t = 0; t < n; t++)
                memcpy(x + t * kvl, att + (t * H + h) * mr, (size_t)kvl * sizeof(float));
            shoal_linear_part(y, x, n, &uv, 0, 1, row);               /* [n][vh] */
            for (int64_t t = 0; t < n; t++)
                memcpy(ov + (t * H + h) * vh, y + t * vh, (size_t)vh * sizeof(float));
            continue;
        }
        for (int64_t i = 0; i < vh; i++) {      /* an FP8 head off a block edge */
            shoal_weight_row_to_f32(row, wkv_b, h * per_head + nope + i);  /* W^UV_h row i */
            for (int64_t t = 0; t < n; t++)
                ov[(t * H + h) * vh + i] = shoal_dot_f32(row, att + (t * H + h) * mr, kvl);
        }
    }
    free(x);
    free(y);
}
