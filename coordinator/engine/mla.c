/* mla: absorbed MLA products (mla.h). */
#include "mla.h"

#include <string.h>

#include "kernels.h"

void shoal_mla_absorb_q(float *qm, const float *q, int64_t n, const struct shoal_weight *wkv_b,
                        const struct shoal_model_config *c, float *row, int ith, int nth)
{
    const int64_t H = c->n_head, nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim;
    const int64_t kvl = c->kv_lora_rank, hd = nope + rope, mr = kvl + rope;
    const int64_t per_head = nope + c->v_head_dim;
    int64_t h0, h1;
    shoal_split_rows(H, ith, nth, &h0, &h1);
    for (int64_t h = h0; h < h1; h++) {
        for (int64_t t = 0; t < n; t++) {
            float *dst = qm + (t * H + h) * mr;
            memset(dst, 0, (size_t)kvl * sizeof(float));
            memcpy(dst + kvl, q + (t * H + h) * hd + nope, (size_t)rope * sizeof(float));
        }
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
}

void shoal_mla_out(float *ov, const float *att, int64_t n, const struct shoal_weight *wkv_b,
                   const struct shoal_model_config *c, float *row, int ith, int nth)
{
    const int64_t H = c->n_head, nope = c->qk_nope_head_dim, vh = c->v_head_dim;
    const int64_t kvl = c->kv_lora_rank, mr = kvl + c->qk_rope_head_dim;
    const int64_t per_head = nope + vh;
    int64_t h0, h1;
    shoal_split_rows(H, ith, nth, &h0, &h1);
    for (int64_t h = h0; h < h1; h++)
        for (int64_t i = 0; i < vh; i++) {
            shoal_weight_row_to_f32(row, wkv_b, h * per_head + nope + i);  /* W^UV_h row i */
            for (int64_t t = 0; t < n; t++)
                ov[(t * H + h) * vh + i] = shoal_dot_f32(row, att + (t * H + h) * mr, kvl);
        }
}
