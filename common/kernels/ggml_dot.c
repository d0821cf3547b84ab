/* ggml_dot: the activation quantizer, the scalar reference of ggml_dot.h's
 * canonical dot products, and the per-thread driver. The SIMD rows live in
 * isa/ggml_avx2.c (the quant ops table's ggml_rows member).
 *
 * Block layouts: ggml/src/ggml-common.h block_q8_0, block_q4_K and
 * block_q6_K, read byte by byte (little-endian, any alignment) as
 * ggml_dequant.c reads them.
 */
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "ggml_dot.h"
#include "ggml_types_impl.h"
#include "kernels.h"
#include "quant.h"
#include "tensor.h"

#define QK_K 256
#define ACT_TILE_BYTES (64 * 1024)   /* the stack tile each thread quantizes into */

int shoal_ggml_dot_supported(uint32_t type)
{
    return type == SHOAL_GGML_TYPE_Q8_0 || type == SHOAL_GGML_TYPE_Q4_K ||
           type == SHOAL_GGML_TYPE_Q6_K;
}

int64_t shoal_ggml_act_block(uint32_t type)
{
    if (!shoal_ggml_dot_supported(type))
        return 0;
    return type == SHOAL_GGML_TYPE_Q8_0 ? 32 : QK_K;
}

size_t shoal_ggml_act_bytes(uint32_t type, int64_t n)
{
    const int64_t B = shoal_ggml_act_block(type);
    if (B == 0 || n < 1 || n % B != 0 || n > INT64_MAX / 4)
        return 0;
    const size_t bsum = B == QK_K ? (size_t)(n / 16) * sizeof(int16_t) : 0;
    /* q padded to 4 bytes so d is aligned (n is a multiple of 32 anyway) */
    return (size_t)n + (size_t)(n / B) * sizeof(float) + bsum;
}

void shoal_ggml_act_init(struct shoal_ggml_act *a, enum shoal_ggml_type type, int64_t n,
                         int64_t n_tok, void *buf)
{
    const int64_t B = shoal_ggml_act_block(type);
    a->type = type;
    a->n = n;
    a->n_blk = n / B;
    a->q = buf;
    a->d = (float *)((uint8_t *)buf + (size_t)(n_tok * n));
    a->bsum = B == QK_K ? (int16_t *)(a->d + n_tok * a->n_blk) : NULL;
}

void shoal_ggml_act_quantize(struct shoal_ggml_act *a, const float *x, int64_t n_tok)
{
    const int64_t n = a->n, B = n / a->n_blk;
    for (int64_t t = 0; t < n_tok; t++) {
        int8_t *q = a->q + t * n;
        for (int64_t b = 0; b < a->n_blk; b++)
            shoal_quant_act_group_base(x + t * n + b * B, B, &a->d[t * a->n_blk + b],
                                       q + b * B);
        if (a->bsum) {
            int16_t *bs = a->bsum + t * (n / 16);
            for (int64_t k = 0; k < n / 16; k++) {
                int s = 0;
                for (int i = 0; i < 16; i++)
                    s += q[16 * k + i];
                bs[k] = (int16_t)s;
            }
        }
    }
}

static float f16_at(const uint8_t *p) { return shoal_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

/* One block's term of the canonical order: blk the weight block, q its
 * activation block's qx, dx its scale */
static float term_q8_0(const uint8_t *blk, const int8_t *q, float dx)
{
    int32_t isum = 0;
    for (int i = 0; i < 32; i++)
        isum += (int8_t)blk[2 + i] * q[i];
    return (f16_at(blk) * dx) * (float)isum;
}

static float term_q4_k(const uint8_t *blk, const int8_t *q, float dx)
{
    const uint8_t *scales = blk + 4, *qs = blk + 16;
    int32_t isum = 0, msum = 0;
    for (int j = 0; j < 8; j++) {
        int sc, m;
        shoal_ggml_scale_min_k4(j, scales, &sc, &m);
        const int shift = 4 * (j % 2);
        int32_t s = 0, xs = 0;
        for (int l = 0; l < 32; l++) {
            s += ((qs[32 * (j / 2) + l] >> shift) & 0x0F) * q[32 * j + l];
            xs += q[32 * j + l];
        }
        isum += sc * s;
        msum += m * xs;
    }
    return (f16_at(blk) * dx) * (float)isum - (f16_at(blk + 2) * dx) * (float)msum;
}

static float term_q6_k(const uint8_t *blk, const int8_t *q, float dx)
{
    const uint8_t *ql = blk, *qh = blk + 128;
    const int8_t *sc = (const int8_t *)(blk + 192);
    int32_t sub[16] = {0};   /* sum of (q - 32) * qx per sub-block of 16 */
    for (int h = 0; h < 2; h++)
        for (int r = 0; r < 4; r++)
            for (int l = 0; l < 32; l++) {
                const int lo = (ql[64 * h + l + 32 * (r % 2)] >> (4 * (r / 2))) & 0x0F;
                const int hi = (qh[32 * h + l] >> (2 * r)) & 3;
                sub[8 * h + 2 * r + l / 16] += ((lo | hi << 4) - 32) * q[128 * h + 32 * r + l];
            }
    int32_t isum = 0;
    for (int j = 0; j < 16; j++)
        isum += sc[j] * sub[j];
    return (f16_at(blk + 208) * dx) * (float)isum;
}

/* The term of weight block blk (type) against its activation block's qx
 * (the 32 or 256 elements the weight block covers) and scale dx */
static float term(enum shoal_ggml_type type, const uint8_t *blk, const int8_t *q, float dx)
{
    switch (type) {
    case SHOAL_GGML_TYPE_Q8_0: return term_q8_0(blk, q, dx);
    case SHOAL_GGML_TYPE_Q4_K: return term_q4_k(blk, q, dx);
    default:                   return term_q6_k(blk, q, dx);
    }
}

float shoal_ggml_dot(const struct shoal_ggml_act *a, int64_t it, const void *row)
{
    const struct shoal_ggml_type_info *ti = shoal_ggml_type_info(a->type);
    const int8_t *q = a->q + it * a->n;
    const float *d = a->d + it * a->n_blk;
    const uint8_t *p = row;
    float acc = 0.0f;
    /* weight block b and activation block b cover the same elements */
    for (int64_t b = 0; b < a->n_blk; b++, p += ti->type_size)
        acc = acc + term(a->type, p, q + b * ti->block_size, d[b]);
    return acc;
}

static size_t row_bytes(const struct shoal_ggml_matrix *w)
{
    const struct shoal_ggml_type_info *ti = shoal_ggml_type_info(w->type);
    return (size_t)(w->cols / ti->block_size) * ti->type_size;
}

/* shoal_ggml_dot of row r with x [w->cols] f32, each activation block
 * quantized when its weight block is reached (same rule, same bits) */
static float dot_wide(const struct shoal_ggml_matrix *w, int64_t r, const float *x)
{
    const struct shoal_ggml_type_info *ti = shoal_ggml_type_info(w->type);
    const uint8_t *p = (const uint8_t *)w->data + (size_t)r * row_bytes(w);
    int8_t qb[QK_K];
    float acc = 0.0f;
    for (int64_t i0 = 0; i0 < w->cols; i0 += ti->block_size, p += ti->type_size) {
        float dx;
        shoal_quant_act_group_base(x + i0, ti->block_size, &dx, qb);
        acc = acc + term(w->type, p, qb, dx);
    }
    return acc;
}

void shoal_ggml_rows_scalar(float *y, const struct shoal_ggml_act *a, int64_t n_tok,
                            const struct shoal_ggml_matrix *w, int64_t r0, int64_t r1)
{
    const size_t rb = row_bytes(w);
    for (int64_t r = r0; r < r1; r++)
        for (int64_t t = 0; t < n_tok; t++)
            y[t * w->rows + r] = shoal_ggml_dot(a, t, (const uint8_t *)w->data + (size_t)r * rb);
}

int shoal_ggml_matrix_check(const struct shoal_ggml_matrix *w, size_t data_bytes,
                            struct shoal_err *err)
{
    if (!shoal_ggml_dot_supported(w->type))
        return shoal_err_set(err, SHOAL_EUNSUPPORTED,
                             "ggml matrix: type %s (id %u) has no dot product here; "
                             "expected Q8_0, Q4_K or Q6_K",
                             shoal_ggml_type_name(w->type), (unsigned)w->type);
    const struct shoal_ggml_type_info *ti = shoal_ggml_type_info(w->type);
    if (w->rows < 1 || w->cols < 1 || w->cols % ti->block_size != 0)
        return shoal_err_set(err, SHOAL_ESHAPE,
                             "ggml matrix %s: shape [%lld][%lld]; expected rows >= 1 "
                             "and cols a positive multiple of %u",
                             ti->name, (long long)w->rows, (long long)w->cols,
                             ti->block_size);
    if (w->data == NULL)
        return shoal_err_set(err, SHOAL_EINVAL, "ggml matrix %s: data is NULL", ti->name);
    const size_t rb = row_bytes(w);
    if ((uint64_t)w->rows > SIZE_MAX / rb || (size_t)w->rows * rb > data_bytes)
        return shoal_err_set(err, SHOAL_ESHAPE,
                             "ggml matrix %s [%lld][%lld]: needs %lld rows of %zu "
                             "bytes, found %zu bytes",
                             ti->name, (long long)w->rows, (long long)w->cols,
                             (long long)w->rows, rb, data_bytes);
    return 0;
}

void shoal_ggml_linear_part(float *y, const float *x, int64_t n_tok,
                            const struct shoal_ggml_matrix *w, int ith, int nth)
{
    int64_t r0, r1;
    shoal_split_rows(w->rows, ith, nth, &r0, &r1);
    if (r0 >= r1 || n_tok < 1)
        return;
    void (*rows)(float *, const struct shoal_ggml_act *, int64_t,
                 const struct shoal_ggml_matrix *, int64_t, int64_t) =
        shoal_quant_active_ops()->ggml_rows;
    if (rows == NULL)
        rows = shoal_ggml_rows_scalar;
    const int64_t n = w->cols;
    const size_t tok_bytes = shoal_ggml_act_bytes(w->type, n);
    if (tok_bytes > ACT_TILE_BYTES) {
        /* a token wider than the tile (above about 57 K columns; no shipped
         * model's matrix is): row by row, each activation block quantized
         * where it is used, the chain continued block by block: same bits */
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t r = r0; r < r1; r++)
                y[t * w->rows + r] = dot_wide(w, r, x + t * n);
        return;
    }
    _Alignas(64) uint8_t tile[ACT_TILE_BYTES];
    struct shoal_ggml_act a;
    const int64_t per_tile = (int64_t)(ACT_TILE_BYTES / tok_bytes);
    for (int64_t t0 = 0; t0 < n_tok; t0 += per_tile) {
        const int64_t nt = n_tok - t0 < per_tile ? n_tok - t0 : per_tile;
        shoal_ggml_act_init(&a, w->type, n, nt, tile);
        shoal_ggml_act_quantize(&a, x + t0 * n, nt);
        rows(y + t0 * w->rows, &a, nt, w, r0, r1);
    }
}

int shoal_ggml_linear(float *y, const float *x, int64_t n_tok,
                      const struct shoal_ggml_matrix *w)
{
    if (w == NULL || y == NULL || x == NULL || n_tok < 0)
        return SHOAL_EINVAL;
    int rc = shoal_ggml_matrix_check(w, SIZE_MAX, NULL);
    if (rc != 0)
        return rc;
    if (n_tok == 0)
        return 0;
#pragma omp parallel
    shoal_ggml_linear_part(y, x, n_tok, w, omp_get_thread_num(), omp_get_num_threads());
    return 0;
}
