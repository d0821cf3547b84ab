/* quant_a8: the INT4A8 dot product (int4 weights against int8 activations,
 * quant.h "Int8 activations"): the activation quantizer every ISA shares,
 * the scalar reference and the per-thread driver. The SIMD rows live in
 * quant_avx2.c and quant_avx512.c, the quantizer in quant_act.c.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "quant.h"

/* q_stride of a tile: n rounded up to 128, plus 64, an odd multiple of 64
 * bytes, so that the same chunk of consecutive tokens falls in different
 * L1 sets (at n = 2048 a stride of 2048 put every other token's chunk in
 * the same 8-way set, and the batch kernels' 16-token passes missed L1) */
static int64_t act_stride(int64_t n)
{
    return ((n + 127) & ~(int64_t)127) + 64;
}

size_t shoal_quant_act_bytes(int64_t n, int group)
{
    const int64_t n_group = (n + group - 1) / group;
    return (size_t)act_stride(n) + (size_t)n_group * (sizeof(float) + sizeof(int32_t));
}

void shoal_quant_act_quantize(struct shoal_quant_act *a, const float *x,
                              int64_t n_tok)
{
    shoal_quant_active_ops()->act_quantize(a, x, n_tok);
}

static inline int nibble(const uint8_t *qs, int64_t i)
{
    return (qs[i >> 1] >> (4 * (i & 1))) & 0x0f;
}

static inline float row_scale(const void *row, int64_t g)
{
    float d;
    memcpy(&d, (const uint8_t *)row + 4 * (size_t)g, sizeof d);
    return d;
}

float shoal_quant_dot_a8(int group, const float *x, const void *row, int64_t n)
{
    const uint8_t *qs = shoal_quant_row_qs(row, n, group);
    int8_t qx[128];
    float acc = 0.0f;
    for (int64_t i0 = 0, g = 0; i0 < n; i0 += group, g++) {
        const int64_t len = n - i0 < group ? n - i0 : group;
        float dx;
        shoal_quant_act_group_base(x + i0, len, &dx, qx);
        int32_t isum = 0;
        for (int64_t k = 0; k < len; k++)
            isum += (nibble(qs, i0 + k) - 8) * qx[k];
        acc = acc + (row_scale(row, g) * dx) * (float)isum;
    }
    return acc;
}

void shoal_quant_a8_rows_scalar(float *y, const struct shoal_quant_act *a,
                                int64_t n_tok,
                                const struct shoal_quant_weight *w, int64_t r0,
                                int64_t r1)
{
    const int64_t n = w->cols, G = w->group;
    const size_t row_bytes = shoal_quant_row_bytes(SHOAL_QUANT_INT4, n, w->group);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * row_bytes;
        const uint8_t *qs = shoal_quant_row_qs(row, n, w->group);
        for (int64_t t = 0; t < n_tok; t++) {
            const int8_t *q = a->q + t * a->q_stride;
            const float *d = a->d + t * a->n_group;
            float acc = 0.0f;
            for (int64_t i0 = 0, g = 0; i0 < n; i0 += G, g++) {
                const int64_t len = n - i0 < G ? n - i0 : G;
                int32_t isum = 0;
                for (int64_t k = 0; k < len; k++)
                    isum += (nibble(qs, i0 + k) - 8) * q[shoal_quant_act_pos(i0 + k)];
                acc = acc + (row_scale(row, g) * d[g]) * (float)isum;
            }
            y[t * w->rows + r] = acc;
        }
    }
}

/* shoal_quant_prefetch_next's hint: this thread's next weight bytes */
static _Thread_local const uint8_t *next_p;
static _Thread_local size_t next_n;

/* Where share ith of nth of w's rows starts, and its bytes */
static const uint8_t *share_at(const struct shoal_quant_weight *w, int ith, int nth, size_t *bytes)
{
    int64_t r0, r1;
    shoal_split_rows(w->rows, ith, nth, &r0, &r1);
    const size_t row_bytes = shoal_quant_row_bytes(SHOAL_QUANT_INT4, w->cols, w->group);
    *bytes = (size_t)(r1 - r0) * row_bytes;
    return *bytes ? (const uint8_t *)w->data + (size_t)r0 * row_bytes : NULL;
}

void shoal_quant_prefetch_next(const struct shoal_quant_weight *w, int ith, int nth)
{
    next_n = 0;
    next_p = w && w->data ? share_at(w, ith, nth, &next_n) : NULL;
}

void shoal_quant_linear_a8_many_part(float *const *y, const float *x, int64_t n_tok,
                                     const struct shoal_quant_weight *const *w, int n_w,
                                     int ith, int nth)
{
    const uint8_t *const hint = next_p;
    const size_t hint_n = next_n;
    next_p = NULL;
    next_n = 0;
    if (n_tok < 1 || n_w < 1)
        return;
    int64_t r0[2], r1[2];   /* n_w <= 2: a documented invariant */
    for (int k = 0; k < n_w; k++)
        shoal_split_rows(w[k]->rows, ith, nth, &r0[k], &r1[k]);
    const int64_t n = w[0]->cols;
    const size_t tok_bytes = shoal_quant_act_bytes(n, w[0]->group);
    uint8_t *const tile = tok_bytes <= SHOAL_ACT_TILE_BYTES ? shoal_act_tile() : NULL;
    if (tile == NULL) {
        /* very wide rows (above about 230 K columns), or no tile: quantize
         * group by group on the fly (same bits) */
        for (int k = 0; k < n_w; k++) {
            const size_t row_bytes = shoal_quant_row_bytes(SHOAL_QUANT_INT4, n, w[k]->group);
            for (int64_t r = r0[k]; r < r1[k]; r++)
                for (int64_t t = 0; t < n_tok; t++)
                    y[k][t * w[k]->rows + r] = shoal_quant_dot_a8(
                        w[k]->group, x + t * n,
                        (const uint8_t *)w[k]->data + (size_t)r * row_bytes, n);
        }
        return;
    }
    /* int8 q first (64-byte aligned), then the f32 scales and int32 sums */
    const int64_t per_tile = (int64_t)(SHOAL_ACT_TILE_BYTES / tok_bytes);
    struct shoal_quant_act a = {.n = n, .group = w[0]->group,
                                .n_group = (n + w[0]->group - 1) / w[0]->group,
                                .q_stride = act_stride(n)};
    for (int64_t t0 = 0; t0 < n_tok; t0 += per_tile) {
        const int64_t nt = n_tok - t0 < per_tile ? n_tok - t0 : per_tile;
        a.q = (int8_t *)tile;
        a.d = (float *)(tile + (size_t)nt * (size_t)a.q_stride);
        a.s = (int32_t *)(a.d + nt * a.n_group);
        shoal_quant_act_quantize(&a, x + t0 * n, nt);
        /* the kernels index y[t * w->rows + r] from token t0's rows */
        for (int k = 0; k < n_w; k++) {
            /* what this thread reads next: the next weight's rows, the
             * first weight again for the next tile, or the caller's hint */
            a.next = NULL;
            a.next_bytes = 0;
            if (k + 1 < n_w)
                a.next = share_at(w[k + 1], ith, nth, &a.next_bytes);
            else if (t0 + nt < n_tok)
                a.next = share_at(w[0], ith, nth, &a.next_bytes);
            else if (hint) {
                a.next = hint;
                a.next_bytes = hint_n;
            }
            if (r0[k] < r1[k])
                shoal_quant_active_ops()->linear_rows_a8(y[k] + t0 * w[k]->rows, &a, nt, w[k],
                                                         r0[k], r1[k]);
        }
    }
}

void shoal_quant_linear_a8_part(float *y, const float *x, int64_t n_tok,
                                const struct shoal_quant_weight *w, int ith, int nth)
{
    shoal_quant_linear_a8_many_part(&y, x, n_tok, &w, 1, ith, nth);
}

int shoal_quant_linear_a8(float *y, const float *x, int64_t n_tok,
                          const struct shoal_quant_weight *w)
{
    if (w->type != SHOAL_QUANT_INT4 || !shoal_quant_group_ok(w->group) ||
        w->rows < 1 || w->cols < 1 || n_tok < 0 || w->data == NULL)
        return SHOAL_EINVAL;
    if (n_tok == 0)
        return 0;
#pragma omp parallel
    shoal_quant_linear_a8_part(y, x, n_tok, w, omp_get_thread_num(),
                               omp_get_num_threads());
    return 0;
}
