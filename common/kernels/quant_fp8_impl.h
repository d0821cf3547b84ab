/* quant_fp8_impl: the FP8 rows driver (quant.h "FP8"), written once and
 * compiled into each ISA file with that file's two primitives:
 *
 *   static void fp8_decode(float *dst, const uint8_t *q, int64_t n)
 *       dst[i] = shoal_fp8_e4m3_table[q[i]] exactly, n <= FP8_CHUNK
 *   static float fp8_block_dot(const float *x, const float *w, int64_t len)
 *       the 8-lane sum of quant.h's canonical order over len <= 128
 *       elements (shoal_dot_f32's order)
 *
 * and FP8_ROWS_NAME, FP8_DEQUANT_NAME and FP8_AXPY_NAME set to the
 * functions to define (the rows kernel; a row as f32: decoded, then times
 * its block scale, the same bits as the table times the scale; and rows
 * scaled and added, shoal_fp8_axpy_rows). The rows driver decodes a
 * row FP8_CHUNK columns at a time (whole blocks) into a stack buffer and
 * runs every token against it; a token's running sum lives in y between
 * chunks (an f32 store and load change nothing), so the blocks are
 * combined in order exactly as the canonical loop does.
 * Thread: any (the defined function allocates nothing). */
#if !defined(FP8_ROWS_NAME) || !defined(FP8_DEQUANT_NAME) || !defined(FP8_AXPY_NAME)
#error "define FP8_ROWS_NAME, FP8_DEQUANT_NAME and FP8_AXPY_NAME before including quant_fp8_impl.h"
#endif

#define FP8_CHUNK (16 * SHOAL_FP8_BLOCK)

void FP8_ROWS_NAME(float *y, const float *x, int64_t n_tok, const struct shoal_weight *w,
                   int64_t r0, int64_t r1)
{
    const int64_t rows = w->rows, cols = w->cols, B = w->group;
    const int64_t nbc = (cols + B - 1) / B;
    float wf[FP8_CHUNK];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *q = (const uint8_t *)w->data + (size_t)r * (size_t)cols;
        const float *sc = w->scale + (r / B) * nbc;
        for (int64_t t = 0; t < n_tok; t++)
            y[t * rows + r] = 0.0f;
        for (int64_t c0 = 0; c0 < cols; c0 += FP8_CHUNK) {
            const int64_t c1 = cols - c0 < FP8_CHUNK ? cols : c0 + FP8_CHUNK;
            fp8_decode(wf, q + c0, c1 - c0);
            for (int64_t t = 0; t < n_tok; t++) {
                const float *xt = x + t * cols;
                float acc = y[t * rows + r];
                for (int64_t i0 = c0; i0 < c1; i0 += B) {
                    const int64_t len = c1 - i0 < B ? c1 - i0 : B;
                    acc = acc + sc[i0 / B] * fp8_block_dot(xt + i0, wf + (i0 - c0), len);
                }
                y[t * rows + r] = acc;
            }
        }
    }
}

#undef FP8_CHUNK

void FP8_DEQUANT_NAME(float *dst, const struct shoal_weight *w, int64_t r)
{
    const int64_t cols = w->cols, B = w->group, nbc = (cols + B - 1) / B;
    const uint8_t *q = (const uint8_t *)w->data + (size_t)r * (size_t)cols;
    const float *sc = w->scale + (r / B) * nbc;
    fp8_decode(dst, q, cols);
    for (int64_t c0 = 0; c0 < cols; c0 += B) {
        const float s = sc[c0 / B];
        const int64_t c1 = cols - c0 < B ? cols : c0 + B;
        for (int64_t c = c0; c < c1; c++)
            dst[c] = dst[c] * s;
    }
}

/* Rows r0 .. r0 + n_rows - 1 scaled and added into dst, FP8_AXPY_COLS
 * columns at a time: the chunk's sums stay in acc (L1) while every row
 * passes, its codes decoded into wf, each times its block scale (the bits
 * of FP8_DEQUANT_NAME), times its coefficient, added: one multiply and one
 * add per element and row, in row order (shoal_fp8_axpy_rows). */
#define FP8_AXPY_COLS 64

void FP8_AXPY_NAME(float *dst, const struct shoal_weight *w, int64_t r0, int64_t n_rows,
                   const float *coef, int64_t coef_stride)
{
    const int64_t cols = w->cols, B = w->group, nbc = (cols + B - 1) / B;
    float wf[FP8_AXPY_COLS], acc[FP8_AXPY_COLS];
    for (int64_t c0 = 0; c0 < cols; c0 += FP8_AXPY_COLS) {
        const int64_t len = cols - c0 < FP8_AXPY_COLS ? cols - c0 : FP8_AXPY_COLS;
        const int one_block = len == FP8_AXPY_COLS && c0 / B == (c0 + len - 1) / B;
        memcpy(acc, dst + c0, (size_t)len * sizeof *acc);
        for (int64_t i = 0; i < n_rows; i++) {
            const int64_t r = r0 + i;
            const float *sc = w->scale + (r / B) * nbc;
            const float a = coef[i * coef_stride];
            fp8_decode(wf, (const uint8_t *)w->data + (size_t)r * (size_t)cols + c0, len);
            if (one_block) {
                const float s = sc[c0 / B];
                for (int k = 0; k < FP8_AXPY_COLS; k++)
                    acc[k] = acc[k] + a * (wf[k] * s);
            } else {
                for (int64_t k = 0; k < len; k++)
                    acc[k] = acc[k] + a * (wf[k] * sc[(c0 + k) / B]);
            }
        }
        memcpy(dst + c0, acc, (size_t)len * sizeof *acc);
    }
}

#undef FP8_AXPY_COLS
