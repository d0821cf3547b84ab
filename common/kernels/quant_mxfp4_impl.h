/* quant_mxfp4_impl: the MXFP4 rows driver (quant.h "MXFP4"), written once
 * and compiled into each ISA file with that file's three primitives:
 *
 *   static void mx_decode(float *dst, const uint8_t *q, int64_t nb)
 *       the 32 * nb values v2(nibble) of nb packed blocks (16 bytes each),
 *       in element order (the sign of a zero is free: quant.h "MXFP4")
 *   static float mx_block_dot(const float *x, const float *w)
 *       the 8-lane sum of the canonical order over one block of 32
 *       (shoal_dot_f32's order)
 *   static float mx_row_dot(const float *x, const uint8_t *q, const uint8_t *e,
 *                           int64_t nb)
 *       the whole canonical dot of one token with one row of nb blocks
 *       (exponents e), decoding in registers
 *
 * (optionally, with MX_HAVE_ROW_DOT_N defined, mx_row_dot_n(x, q, qs, e, es,
 * nb, out): MX_NR rows at once, row r at q + r qs and e + r es, the same
 * bits as MX_NR calls of mx_row_dot) and MXFP4_ROWS_NAME set to the
 * function to define. One token runs
 * mx_row_dot per row (decode, the matvec); more tokens decode a row
 * MX_CHUNK columns at a time into a stack buffer and run every token
 * against it; a token's running sum lives in y between chunks (an f32
 * store and load change nothing), so the blocks are combined in order
 * exactly as the canonical loop does.
 * Thread: any (the defined function allocates nothing). */
#if !defined(MXFP4_ROWS_NAME)
#error "define MXFP4_ROWS_NAME before including quant_mxfp4_impl.h"
#endif

#define MX_CHUNK 2048

void MXFP4_ROWS_NAME(float *y, const float *x, int64_t n_tok, const struct shoal_weight *w,
                     int64_t r0, int64_t r1)
{
    const int64_t rows = w->rows, cols = w->cols, nb = cols / SHOAL_MXFP4_BLOCK;
    if (n_tok == 1) {
        int64_t r = r0;
#ifdef MX_HAVE_ROW_DOT_N
        const size_t step = w->row_step > 1 ? (size_t)w->row_step : 1;
        for (; r + MX_NR <= r1; r += MX_NR)
            mx_row_dot_n(x, shoal_mxfp4_row_q(w, r), step * (size_t)(cols / 2),
                         shoal_mxfp4_row_e(w, r), step * (size_t)nb, nb, y + r);
#endif
        for (; r < r1; r++)
            y[r] = mx_row_dot(x, shoal_mxfp4_row_q(w, r), shoal_mxfp4_row_e(w, r), nb);
        return;
    }
    float wf[MX_CHUNK];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *q = shoal_mxfp4_row_q(w, r);
        const uint8_t *e = shoal_mxfp4_row_e(w, r);
        for (int64_t t = 0; t < n_tok; t++)
            y[t * rows + r] = 0.0f;
        for (int64_t c0 = 0; c0 < cols; c0 += MX_CHUNK) {
            const int64_t c1 = cols - c0 < MX_CHUNK ? cols : c0 + MX_CHUNK;
            mx_decode(wf, q + c0 / 2, (c1 - c0) / SHOAL_MXFP4_BLOCK);
            for (int64_t t = 0; t < n_tok; t++) {
                const float *xt = x + t * cols;
                float acc = y[t * rows + r];
                for (int64_t i0 = c0; i0 < c1; i0 += SHOAL_MXFP4_BLOCK)
                    acc = acc + shoal_mxfp4_d(e[i0 / SHOAL_MXFP4_BLOCK]) *
                                mx_block_dot(xt + i0, wf + (i0 - c0));
                y[t * rows + r] = acc;
            }
        }
    }
}

#undef MX_CHUNK
