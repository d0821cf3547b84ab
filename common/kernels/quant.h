/* quant: grouped int8 / int4 weight quantization and the kernels that use it.
 *
 * Owns the byte layout of quantized rows and matrices (the container stores
 * them as they are), quantization from f32/bf16/f16, dequantization, and the
 * dot product and linear layer over quantized weights, with one scalar
 * reference and one file per ISA (quant_avx2.c, quant_avx512.c,
 * quant_neon.c, quant_neon_dot.c) behind struct shoal_quant_ops. All of them give the same bits (DESIGN contract 1).
 *
 * ## Byte layout (little-endian; version 1 of these formats)
 *
 * A row of n elements (n >= 1) is cut into n_group = ceil(n / G) groups of G
 * consecutive elements, G in {32, 64, 128}; the last group holds
 * n - (n_group - 1) * G elements (it is partial when n % G != 0). A row is
 * self-contained:
 *
 *     offset 0                f32  d[n_group]      IEEE binary32 scale per group
 *     offset 4 * n_group      quants:
 *        SHOAL_QUANT_INT8     int8  q[n]           one byte per element
 *        SHOAL_QUANT_INT4     uint8 p[(n + 1) / 2] two elements per byte: element
 *                                                  2k in the low nibble of p[k],
 *                                                  element 2k+1 in the high nibble;
 *                                                  nibble u encodes q = u - 8
 *     then zero bytes up to   shoal_quant_row_bytes(type, n, G), a multiple of 4
 *
 * so every row starts 4-byte aligned when the matrix does (scales are still
 * read with memcpy; data loads are unaligned). Groups never share a byte
 * because G is even. When n is odd the high nibble of the last int4 byte is
 * padding (zero). A matrix [rows][cols] is its rows back to back:
 * shoal_quant_matrix_bytes() = rows * shoal_quant_row_bytes(type, cols, G).
 *
 * Scales are f32, not f16: precision is a property of the file (contract 2),
 * the scale array costs 4/G bytes per element (3 % of int8 G=128, 12.5 % of
 * int4 G=32 over the quants), and an f16 scale would add a second rounding
 * that the round-trip bound below would have to absorb.
 *
 * Element value: x' = d[g] * q. Quantization (scalar only, deterministic):
 *   int8  d = max|x| / 127, q = rne(x / d) clamped to [-127, 127]
 *   int4  d = max|x| / 7,   q = rne(x / d) clamped to [-7, 7]  (symmetric;
 *         nibble 0, q = -8, is never written but reads as -8)
 * with rne = round to nearest, ties to even (rintf in the default rounding
 * mode), max|x| over the group, and d = 0, q = 0 for an all-zero group (or
 * one whose max|x| / 127 underflows to 0). Non-finite inputs are an error.
 * Readers accept every byte value (int8 -128 reads as -128).
 * Round trip: |x - d * q| <= d / 2 (up to one f32 rounding of x / d).
 *
 * ## Canonical computation (every ops table reproduces it bit for bit)
 *
 *   acc = 0.0f
 *   for each group g in order 0 .. n_group-1, with elements i0 .. i0+len-1:
 *       s[0..7] = +0.0f
 *       for k = 0 .. len-1:  s[k % 8] = s[k % 8] + x[i0+k] * (float)q[i0+k]
 *       gsum = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]))
 *       acc  = acc + d[g] * gsum
 *   return acc
 *
 * Every + and * is one f32 operation rounded to nearest (no FMA: the build
 * uses -ffp-contract=off and the SIMD files use separate mul and add).
 * The lane pattern restarts at every group; G is a multiple of 8, so only
 * the last (partial) group can end with fewer than 8 elements, and its tail
 * fills lanes 0 .. len%8-1. This is shoal_dot_f32's order applied per group.
 *
 * ## Int8 activations (the INT4A8 dtype)
 *
 * A tensor of dtype INT4A8 has INT4's bytes; the file says that its dot
 * products run in integers against the input quantized to int8 per group of
 * the weight's G (the W4A8 scheme of llama.cpp's Q4_0 x Q8_0):
 *
 *   per group g of x (elements i0 .. i0+len-1, as above):
 *       amax  = max |x[i]|; dx[g] = amax / 127.0f   (NaN when amax is not
 *               finite: a NaN or infinity in x makes the result NaN)
 *       qx[i] = 0 when dx[g] is 0 or NaN, else rne(x[i] / dx[g]) clamped
 *               to [-127, 127]                      (the INT8 rule above)
 *   acc = 0.0f
 *   for each group g in order:
 *       isum = sum of q[i] * qx[i] over the group, exact in int32
 *              (|isum| <= 8 * 127 * 128)
 *       acc  = acc + (d[g] * dx[g]) * (float)isum
 *   return acc
 *
 * The integer sums do not depend on their order, so every ISA reaches the
 * same isum with its own widest instructions (vpmaddubsw/vpmaddwd, NEON
 * vmull_s8, sdot or smmla); only
 * the per-group combine is f32, in the order above. It is about 3x less
 * work per weight than the f32 canonical dot, whose mul + add per element
 * and f32 conversion of every nibble bound its speed, and it is what
 * `shoal convert --experts int4a8` asks for: the precision is the file's.
 *
 * ## FP8 (the FP8 dtype: E4M3 codes with 128 x 128 block scales)
 *
 * DeepSeek-V3/R1 and Kimi-K2 ship their linear weights as safetensors
 * F8_E4M3 (OCP E4M3FN: 1 sign, 4 exponent bits of bias 7, 3 mantissa bits,
 * no infinities; S.1111.111, codes 0x7f and 0xff, is NaN; max 448;
 * subnormals m * 2^-9) plus an f32 `weight_scale_inv` per 128 x 128 block.
 * The weight is code value * scale[r / 128][c / 128]: DeepSeek-V3's
 * inference/kernel.py weight_dequant_kernel multiplies by it (`y = x * s`)
 * despite the name. shoal keeps the codes and scales as they are
 * (struct shoal_weight: data = codes [rows][cols], scale = the blocks,
 * group = 128); decoding a code is exact (shoal_fp8_e4m3_table).
 *
 * Canonical dot product of x[n] with row r (every ops table, bit for bit):
 *
 *   acc = 0.0f
 *   for each column block b in order (elements i0 .. i0+len-1, len <= 128,
 *   only the last block partial):
 *       s[0..7] = +0.0f
 *       for k = 0 .. len-1:  s[k % 8] = s[k % 8] + x[i0+k] * e4m3(q[i0+k])
 *       bsum = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]))
 *       acc  = acc + scale[r / 128][b] * bsum
 *
 * which is the INT8 order above with the code's exact f32 value for
 * (float)q and the block's scale for d[g] (shoal_dot_f32's order per block).
 * NaN codes are refused when a weight is loaded (shoal_fp8_check), so the
 * kernels never see one.
 *
 * ## MXFP4 (the MXFP4 dtype: E2M1 pairs, one E8M0 exponent per 32 values)
 *
 * gpt-oss ships its experts as OCP Microscaling MXFP4 (OCP MX spec v1.0):
 * a weight X [rows][cols] is two U8 tensors, `X_blocks` [rows][cols/32][16]
 * (32 E2M1 values in 16 bytes: element 2k of a block in the low nibble of
 * byte k, element 2k+1 in the high nibble) and `X_scales` [rows][cols/32]
 * (one E8M0 exponent e per block). The value of element (r, c) is
 *
 *     e2m1(nibble) * 2^(e[r][c/32] - 127)
 *
 * with e2m1 = {+0, 0.5, 1, 1.5, 2, 3, 4, 6, -0, -0.5, -1, -1.5, -2, -3, -4,
 * -6} by nibble (sign bit 3). This is openai/gpt-oss gpt_oss/torch/weights.py
 * _get_mxfp4_tensor: FP4_VALUES, `sub[:, 0::2] = lut[blk & 0x0F]`,
 * `sub[:, 1::2] = lut[blk >> 4]`, `ldexp(sub, scales - 127)`. shoal keeps the
 * bytes as they are (struct shoal_weight: data = the packed pairs, rows of
 * cols / 2 bytes; e8m0 = the exponents; group = 32), so a weight binds to
 * the mapped checkpoint without a copy (shoal_mxfp4_bind, safetensors.h).
 *
 * Exponents: shoal accepts |e - 127| <= SHOAL_MXFP4_EMAX_DELTA (64), i.e.
 * block scales 2^-64 .. 2^64. E8M0's NaN (255) and anything outside the
 * range are refused when the weight is bound or read (shoal_mxfp4_check
 * names the tensor, row and block). Inside it every decoded value and
 * every scale below is a normal f32, so decoding is exact and the
 * products by the scale are exact powers-of-two scalings (real checkpoints
 * sit far inside it: a weight of 2^-64 is below bf16's useful range for a
 * linear layer).
 *
 * Canonical dot product of x[n] with row r (every ops table, bit for bit):
 * with v2(nibble) = 2 * e2m1(nibble), an integer in {0, ±1, ±2, ±3, ±4,
 * ±6, ±8, ±12}, and d[b] = 2^(e[r][b] - 128) (the block's scale halved, to
 * undo the 2),
 *
 *   acc = 0.0f
 *   for each block b in order (elements i0 = 32 b .. i0 + 31):
 *       s[0..7] = +0.0f
 *       for k = 0 .. 31:  s[k % 8] = s[k % 8] + x[i0+k] * v2(q[i0+k])
 *       bsum = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]))
 *       acc  = acc + d[b] * bsum
 *
 * which is the INT8 order above with q = v2 and the scale d (so v2 is an
 * exact small integer, as SIMD decodes it through a 16-entry byte table).
 * A lane never holds -0 (it starts at +0 and +0 + -0 = +0), so the sign of
 * a zero weight (nibble 8) cannot change a result; the kernels may decode
 * it as +0. Dequantized rows keep E2M1's -0: dst = v2 * d, the exact value.
 *
 * Thread: every function may be called from any thread, except
 * shoal_quant_init (main thread, at start-up, before any parallel region)
 * and shoal_quant_linear (opens its own OpenMP region; call it from outside
 * one, or use shoal_quant_linear_part inside one).
 */
#ifndef SHOAL_QUANT_H
#define SHOAL_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "tensor.h"

/* Quantized element types. The values are stable (files may store them). */
enum shoal_quant_type {
    SHOAL_QUANT_INT8 = 1,
    SHOAL_QUANT_INT4 = 2,
};

/* A borrowed view of a quantized matrix [rows][cols] laid out as above. */
struct shoal_quant_weight {
    enum shoal_quant_type type;
    int group;                /* G: 32, 64 or 128 elements */
    int64_t rows;             /* output features */
    int64_t cols;             /* input features (elements per row) */
    const void *data;         /* borrowed, shoal_quant_matrix_bytes() bytes */
};

/* ---- sizes and names -------------------------------------------------- */

/* "int8" / "int4" / "?". Static string. Thread: any. */
const char *shoal_quant_type_name(enum shoal_quant_type type);

/* 1 if G is a supported group size (32, 64, 128), else 0. Thread: any. */
int shoal_quant_group_ok(int group);

/* Bytes of one quantized row of n elements, padding included.
 * Returns 0 for an unknown type, an unsupported G, n < 1 or overflow.
 * Thread: any. */
size_t shoal_quant_row_bytes(enum shoal_quant_type type, int64_t n, int group);

/* Bytes of a [rows][cols] matrix: rows * shoal_quant_row_bytes(type, cols, G).
 * Returns 0 for invalid arguments (rows < 1 included) or overflow. */
size_t shoal_quant_matrix_bytes(enum shoal_quant_type type, int64_t rows,
                                int64_t cols, int group);

/* Check a view against the bytes available behind it.
 *   w      borrowed; data_bytes: how many bytes w->data may be read
 * Returns 0, or SHOAL_EINVAL (type/group/shape) or SHOAL_ESHAPE (too few
 * bytes) with err naming what was expected and what was found. Thread: any. */
int shoal_quant_weight_check(const struct shoal_quant_weight *w,
                             size_t data_bytes, struct shoal_err *err);

/* ---- quantize / dequantize (scalar, deterministic) --------------------- */

/* Quantize one row of n elements.
 *   dst    [shoal_quant_row_bytes(type, n, G)] bytes, written (padding zeroed)
 *   src    [n] elements of src_dtype (f32, bf16 or f16), borrowed
 * Returns 0, SHOAL_EINVAL (bad type/G/n/dtype) or SHOAL_ERANGE (a NaN or
 * infinity, naming the element); on error dst is unspecified.
 * Allocates nothing. Thread: any. */
int shoal_quant_quantize_row(enum shoal_quant_type type, int group, void *dst,
                             const void *src, enum shoal_dtype src_dtype,
                             int64_t n, struct shoal_err *err);

/* Quantize a matrix [rows][cols] row by row (OpenMP over rows; the bytes do
 * not depend on the thread count).
 *   dst        [dst_bytes] bytes, written; needs shoal_quant_matrix_bytes()
 *   src        [rows][cols] of src_dtype, borrowed
 * Returns 0, SHOAL_EINVAL, SHOAL_ESHAPE (dst_bytes too small) or
 * SHOAL_ERANGE naming the first bad (row, col). Thread: main (opens a
 * parallel region). */
int shoal_quant_quantize_matrix(enum shoal_quant_type type, int group,
                                void *dst, size_t dst_bytes, const void *src,
                                enum shoal_dtype src_dtype, int64_t rows,
                                int64_t cols, struct shoal_err *err);

/* Rows scaled and added into one vector, each element in row order:
 *   for i = 0 .. n_rows-1: dst[j] = dst[j] + coef[i * coef_stride] * deq_i[j]
 * for j < n, deq_i = shoal_quant_dequantize_row of row i (a separate
 * multiply and add, never fused): the bits of dequantizing each row into
 * f32 and adding it scaled, without the f32 row. MLA's absorbed query
 * (W^UK_h^T q_nope, DeepSeek-V2's "absorb" of kv_b_proj) is this product:
 * the rows of W^UK_h weighted by q_nope.
 *   dst [n] f32, read and written; rows: n_rows quantized rows of n
 *   elements, row_bytes apart (shoal_quant_row_bytes), borrowed; coef: f32,
 *   borrowed. The active table's kernel (AVX2 or NEON where built and run,
 *   else the scalar one: the same bits). Arguments are programmer
 *   invariants (not checked). Allocates nothing. Thread: any. */
void shoal_quant_axpy_rows(enum shoal_quant_type type, int group, float *dst, int64_t n,
                           const void *rows, size_t row_bytes, const float *coef,
                           int64_t coef_stride, int64_t n_rows);

/* The scalar table's shoal_quant_axpy_rows (the reference), the AVX2 one
 * (quant_avx2.c; the AVX-512 tables use it too) and the NEON one
 * (quant_neon.c; the DotProd and I8MM tables too). */
void shoal_quant_axpy_rows_scalar(enum shoal_quant_type type, int group, float *dst,
                                  int64_t n, const void *rows, size_t row_bytes,
                                  const float *coef, int64_t coef_stride, int64_t n_rows);
void shoal_quant_axpy_rows_avx2(enum shoal_quant_type type, int group, float *dst, int64_t n,
                                const void *rows, size_t row_bytes, const float *coef,
                                int64_t coef_stride, int64_t n_rows);
void shoal_quant_axpy_rows_neon(enum shoal_quant_type type, int group, float *dst, int64_t n,
                                const void *rows, size_t row_bytes, const float *coef,
                                int64_t coef_stride, int64_t n_rows);

/* Dequantize one row: dst[i] = d[g] * (float)q[i].
 *   dst [n] f32, written; row: one quantized row of n elements, borrowed.
 * Arguments are programmer invariants (not checked). Thread: any. */
void shoal_quant_dequantize_row(enum shoal_quant_type type, int group,
                                float *dst, const void *row, int64_t n);

/* ---- kernels (active ops table) ---------------------------------------- */

/* Canonical dot product of x with one quantized row (order above).
 *   x [n] f32, borrowed; row: one quantized row of n elements, borrowed.
 * Arguments are programmer invariants (type known, G valid, n >= 1).
 * Allocates nothing. Thread: any. */
float shoal_quant_dot(enum shoal_quant_type type, int group, const float *x,
                      const void *row, int64_t n);

/* y = x · W^T over a batch of tokens, parallel over W's rows: each y element
 * is the canonical dot product, computed by exactly one thread, so the bits
 * do not depend on the thread count, the batch size or the ISA. n_tok = 1
 * is a matvec (decode); larger batches reuse each unpacked group across
 * tokens (prefill) and give the same bits per element.
 *   y  [n_tok][w->rows] f32, written
 *   x  [n_tok][w->cols] f32, borrowed
 *   w  quantized [rows][cols], borrowed (check it once with
 *      shoal_quant_weight_check when it is loaded)
 * Returns 0, or SHOAL_EINVAL for a bad type/group/shape or n_tok < 0.
 * Allocates nothing. Thread: main (opens its own OpenMP region). */
int shoal_quant_linear(float *y, const float *x, int64_t n_tok,
                       const struct shoal_quant_weight *w);

/* The share of shoal_quant_linear that thread ith of nth computes (an even
 * split of the output rows, remainder to the first threads), for callers
 * that already run inside one OpenMP region per layer step. Same bits.
 * Arguments are programmer invariants. Allocates nothing. Thread: compute. */
void shoal_quant_linear_part(float *y, const float *x, int64_t n_tok,
                             const struct shoal_quant_weight *w, int ith,
                             int nth);

/* ---- int8 activations (INT4A8) ---------------------------------------- */

/* One or more tokens' input quantized to int8 for the INT4A8 dot product
 * ("Int8 activations" above). q is kept in "chunk order": per 128 columns,
 * the 64 even columns, then the 64 odd ones, the order in which a SIMD
 * register of 64 packed int4 bytes splits into low and high nibbles;
 * columns past n are 0. s[g] = 8 * (sum of qx over group g), so that
 * sum (u - 8) * qx = sum u * qx - s[g] for nibbles u. */
struct shoal_quant_act {
    int64_t n;          /* elements per token */
    int group;          /* G, the weight's */
    int64_t n_group;    /* ceil(n / G): entries per token in d and s */
    int64_t q_stride;   /* bytes per token in q: n rounded up to 128 or
                           more (a multiple of 64; the columns past n are
                           0) */
    int8_t *q;          /* [n_tok][q_stride] int8, chunk order */
    float *d;           /* [n_tok][n_group] f32 scales dx */
    int32_t *s;         /* [n_tok][n_group] 8 * sum of q per group */
    /* the weight bytes this thread reads after these rows (NULL: none
     * known): the decode kernels prefetch the first of them while they
     * finish, so the stream does not stall between matrices. Performance
     * only: no result depends on it. */
    const uint8_t *next;
    size_t next_bytes;
};

/* Bytes of q + d + s for one token of n elements (group G), as
 * shoal_quant_linear_a8_part lays them out in its tile (q_stride: n
 * rounded up to 128, plus 64). Thread: any. */
size_t shoal_quant_act_bytes(int64_t n, int group);

/* Bytes of the calling thread's activation tile (shoal_act_tile). The
 * linears quantize up to this many bytes of tokens at a time and run every
 * weight row against them, so a matrix is read once per tile: 256 KiB holds
 * 32 tokens of 7168 columns (DeepSeek-V3's hidden; 64 KiB held 8, and the
 * prefill GEMM of such a matrix ran 15-31 % slower per weight, Zen 4,
 * docs/BENCHMARKS.md "GGUF kernels") and stays in a 512 KiB L2. */
#define SHOAL_ACT_TILE_BYTES ((size_t)256 * 1024)

/* The calling thread's activation tile: SHOAL_ACT_TILE_BYTES, 64-byte
 * aligned, allocated at the thread's first call and freed when the thread
 * exits (a pthread key's destructor); NULL when it cannot be allocated
 * (the linears then take their row-by-row path: the same bits). Only the
 * calling thread may use it, and only until its next call returns it
 * again to a nested user (the linears use it within one call, never across
 * a nested call). Thread: any; the caller owns nothing. */
uint8_t *shoal_act_tile(void);

/* Quantize n_tok tokens x[n_tok][n] into a (whose n and group are set and
 * whose buffers hold n_tok tokens), by the rule above. Deterministic: the
 * active table's build of quant_act.c, every build the same bytes. Allocates nothing. Thread: any. */
void shoal_quant_act_quantize(struct shoal_quant_act *a, const float *x,
                              int64_t n_tok);

/* Canonical INT4A8 dot product of x[n] with one INT4 row (the rule above,
 * straight from its definition; tests compare every kernel with it).
 * Thread: any. */
float shoal_quant_dot_a8(int group, const float *x, const void *row, int64_t n);

/* y = x . W^T for an INT4 weight computed as INT4A8 (the rule above),
 * thread ith of nth's share of the rows (the split of
 * shoal_quant_linear_part). Each thread quantizes x itself into its
 * activation tile (shoal_act_tile: tokens in tiles of 256 KiB; when one
 * token does not fit, above about 233 K columns, the per-group scalar
 * path), so there is no barrier and nothing is allocated after a thread's
 * first call. Same bits at any thread count, batch size and ISA.
 *   y  [n_tok][w->rows] f32, written; x [n_tok][w->cols] f32, borrowed
 *   w  INT4 layout, borrowed (checked once at load)
 * Thread: compute (inside an OpenMP region, or alone with ith 0, nth 1). */
void shoal_quant_linear_a8_part(float *y, const float *x, int64_t n_tok,
                                const struct shoal_quant_weight *w, int ith,
                                int nth);

/* shoal_quant_linear_a8_part for n_w (1 or 2) weights of the same cols and
 * G that read the same x (an expert's gate and up): x is quantized once,
 * each weight's rows split as shoal_quant_linear_a8_part splits them, so
 * the bits are those of separate calls.
 *   y  [n_w] outputs, y[k] [n_tok][w[k]->rows]; w [n_w], borrowed.
 * Thread: compute. */
void shoal_quant_linear_a8_many_part(float *const *y, const float *x, int64_t n_tok,
                                     const struct shoal_quant_weight *const *w, int n_w,
                                     int ith, int nth);

/* The next INT4A8 linear this thread runs, after the one it runs now,
 * reads w's rows share ith of nth (shoal_split_rows): the current call's
 * decode kernels prefetch its first bytes while they finish, so the
 * weight stream runs on across matrices and experts. The hint holds for
 * the calling thread's next shoal_quant_linear_a8_part or _many_part call
 * and is then cleared; w NULL clears it. Performance only: no result
 * depends on it. Thread: compute (thread-local state). */
void shoal_quant_prefetch_next(const struct shoal_quant_weight *w, int ith, int nth);

/* The whole of shoal_quant_linear_a8_part in its own OpenMP region.
 * Returns 0, or SHOAL_EINVAL for a weight that is not INT4 with a valid
 * G and shape, or n_tok < 0. Thread: main. */
int shoal_quant_linear_a8(float *y, const float *x, int64_t n_tok,
                          const struct shoal_quant_weight *w);

/* ---- FP8 (E4M3 codes, 128 x 128 block scales) ---------------------------- */

/* Exact f32 value of every E4M3FN code (NaN for 0x7f and 0xff; 0x80 is
 * -0.0f). */
extern const float shoal_fp8_e4m3_table[256];

static inline float shoal_fp8_e4m3_to_f32(uint8_t code)
{
    return shoal_fp8_e4m3_table[code];
}

/* Index of the first NaN code (0x7f or 0xff) among n bytes, or -1.
 * Thread: any. */
int64_t shoal_fp8_find_nan(const uint8_t *codes, size_t n);

/* Check an FP8 weight before use: group == SHOAL_FP8_BLOCK, data and scale
 * set, every block scale finite, and (when check_codes) no NaN code, which
 * reads all rows * cols bytes.
 *   name   the tensor's name for the message (borrowed)
 * Returns 0 or SHOAL_EFORMAT / SHOAL_EINVAL with err naming the tensor and
 * the first bad (row, col) or block. Allocates nothing, opens no
 * parallel region (the store calls it on its io threads). Thread: any. */
int shoal_fp8_check(const struct shoal_weight *w, int check_codes, const char *name,
                    struct shoal_err *err);

/* Rows r0 .. r0 + n_rows - 1 of an FP8 weight scaled and added into one
 * vector, each element in row order:
 *   for i = 0 .. n_rows-1: dst[c] = dst[c] + coef[i * coef_stride] * deq_i[c]
 * with deq_i = shoal_fp8_dequantize_row of row r0 + i (a separate multiply
 * and add): the bits of converting each row and adding it, without the f32
 * row. MLA's absorbed query over a DeepSeek-V3 checkpoint's FP8 kv_b_proj
 * (one V3-width layer and token, 2 threads on a Zen 4: 3.7 ms converting
 * each row first).
 *   dst [w->cols] f32, read and written; coef borrowed. Arguments are
 * programmer invariants. Allocates nothing. Thread: any. */
void shoal_fp8_axpy_rows(float *dst, const struct shoal_weight *w, int64_t r0, int64_t n_rows,
                         const float *coef, int64_t coef_stride);

/* Row r of an FP8 weight as f32: dst[c] = e4m3(q[r][c]) * scale[r/B][c/B]
 * (one f32 multiply per element). dst [w->cols], written. Thread: any. */
void shoal_fp8_dequantize_row(float *dst, const struct shoal_weight *w, int64_t r);

/* Canonical FP8 dot product of x[w->cols] with row r of w (the order above,
 * straight from its definition; tests compare every table with it).
 * Thread: any. */
float shoal_fp8_dot_ref(const float *x, const struct shoal_weight *w, int64_t r);

/* y = x . W^T for an FP8 weight, thread ith of nth's share of the rows
 * (shoal_quant_linear_part's split), with the active table. Same bits at
 * any thread count, batch size and ISA.
 *   y [n_tok][w->rows] f32, written; x [n_tok][w->cols] f32, borrowed
 * Allocates nothing. Thread: compute. */
void shoal_fp8_linear_part(float *y, const float *x, int64_t n_tok,
                           const struct shoal_weight *w, int ith, int nth);

/* ---- MXFP4 (E2M1 pairs, one E8M0 exponent per 32 values) ----------------- */

/* The accepted exponent range: |e8m0 - 127| <= this ("MXFP4" above). */
#define SHOAL_MXFP4_EMAX_DELTA 64

/* The canonical order's block factor d = 2^(e - 128) for an exponent e in
 * the accepted range (a normal f32 built from its bits: exact). */
static inline float shoal_mxfp4_d(uint8_t e)
{
    const uint32_t u = (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Exact f32 value of each E2M1 nibble (FP4_VALUES; nibble 8 is -0.0f). */
extern const float shoal_mxfp4_e2m1_table[16];

/* Check an MXFP4 weight before use: dtype MXFP4, group 32, data and e8m0
 * set, rows >= 1, cols a positive multiple of 32, and every exponent in
 * range (255, E8M0's NaN, included: refused). Reads the rows * cols / 32
 * exponents, not the packed bytes (every nibble is a finite value).
 *   name   the tensor's name for the message (borrowed)
 * Returns 0 or SHOAL_EINVAL (shape/fields) / SHOAL_EFORMAT (an exponent,
 * naming its row, block and value). Allocates nothing, opens no parallel
 * region (the store calls it on its io threads). Thread: any. */
int shoal_mxfp4_check(const struct shoal_weight *w, const char *name, struct shoal_err *err);

/* Row r of an MXFP4 weight as f32: dst[c] = v2(nibble) * 2^(e - 128), the
 * exact value (E2M1's -0 kept). dst [w->cols], written. Thread: any. */
void shoal_mxfp4_dequantize_row(float *dst, const struct shoal_weight *w, int64_t r);

/* Canonical MXFP4 dot product of x[w->cols] with row r of w (the order
 * above, straight from its definition; tests compare every table with it).
 * Thread: any. */
float shoal_mxfp4_dot_ref(const float *x, const struct shoal_weight *w, int64_t r);

/* y = x . W^T for an MXFP4 weight, thread ith of nth's share of the rows
 * (shoal_quant_linear_part's split), with the active table. Same bits at
 * any thread count, batch size and ISA.
 *   y [n_tok][w->rows] f32, written; x [n_tok][w->cols] f32, borrowed
 * Allocates nothing. Thread: compute. */
void shoal_mxfp4_linear_part(float *y, const float *x, int64_t n_tok,
                             const struct shoal_weight *w, int ith, int nth);

/* ---- kernel selection ---------------------------------------------------- */

enum shoal_quant_isa {
    SHOAL_QUANT_ISA_AUTO = 0,   /* best the CPU supports: AVX-512 (VBMI; on
                                   Zen 4 avx512-zen4), AVX-512 BW, AVX2, NEON
                                   I8MM, NEON DotProd, NEON, scalar */
    SHOAL_QUANT_ISA_SCALAR,     /* the reference (tests, debugging) */
    SHOAL_QUANT_ISA_AVX2,       /* x86-64 with AVX2 (built with -mavx2, no FMA) */
    SHOAL_QUANT_ISA_NEON,       /* aarch64 */
    SHOAL_QUANT_ISA_AVX512,     /* x86-64 with AVX-512 F/BW/VL/VBMI/VNNI (no FMA):
                                   int4/int8 linears; the dot as AVX2 */
    SHOAL_QUANT_ISA_AVX512BW,   /* the same without VBMI/VNNI (Skylake-SP, Cascade
                                   Lake): one more instruction per step */
    SHOAL_QUANT_ISA_NEON_DOTPROD, /* aarch64 with DotProd (ARMv8.2 sdot; Apple M1,
                                   Cortex-A76 and later): INT4A8 rows; the rest
                                   as NEON */
    SHOAL_QUANT_ISA_NEON_I8MM,  /* aarch64 with DotProd and I8MM (smmla; Apple M2,
                                   Neoverse V1/N2 and later): INT4A8 batches two
                                   tokens x two rows per instruction */
    SHOAL_QUANT_ISA_AVX512_ZEN4, /* "avx512-zen4": the avx512 table under its
                                   own name (it took the avx2 INT4A8 rows for
                                   2-5 tokens until the avx512 table's
                                   rows_a8_few beat them: docs/BENCHMARKS.md).
                                   AUTO picks it on AMD family 19h with
                                   AVX-512 (Zen 4); it runs wherever avx512
                                   does. */
};

/* Tokens from which the avx512 table's INT4A8 kernel runs its register-
 * blocked GEMM (2 to this - 1: rows_a8_few, 16 rows a half at a time; 1:
 * the decode matvec). The avx512bw table (no VNNI: each vpdpbusd is three
 * instructions, and the GEMM's staged block pays off sooner) starts it at
 * SHOAL_QUANT_AVX512BW_GEMM_MIN_TOK. */
#define SHOAL_QUANT_AVX512_GEMM_MIN_TOK 12
#define SHOAL_QUANT_AVX512BW_GEMM_MIN_TOK 6

/* Choose the kernels once at start-up and log the choice (info, "quant").
 * Before the first call the scalar kernels are active; every table gives
 * the same bits, so this only changes speed.
 * Returns 0, or SHOAL_EUNSUPPORTED when the requested ISA is not built in
 * or the CPU lacks it (the active table is then unchanged). Thread: main, not
 * while kernels run. */
int shoal_quant_init(enum shoal_quant_isa isa, struct shoal_err *err);

/* Name of the active kernels: "scalar", "avx2", "avx512", "avx512bw",
 * "avx512-zen4", "neon", "neon-dotprod" or "neon-i8mm".
 * Thread: any. */
const char *shoal_quant_ops_name(void);

/* The name of an ISA choice, as above with "auto" for AUTO ("?" for a value
 * out of range). Static string. Thread: any. */
const char *shoal_quant_isa_name(enum shoal_quant_isa isa);

/* The ISA choice named name (shoal_quant_isa_name's spelling, as `--isa`
 * takes it) into *isa. Returns 0, or SHOAL_EINVAL for an unknown name
 * (*isa unchanged). Thread: any. */
int shoal_quant_isa_parse(const char *name, enum shoal_quant_isa *isa);

/* Every ISA name shoal_quant_isa_parse accepts, "auto|scalar|...", for usage
 * and error messages. Static string. Thread: any. */
const char *shoal_quant_isa_list(void);

struct shoal_quant_ops;
struct shoal_ggml_act;      /* ggml_dot.h */
struct shoal_ggml_matrix;
/* The active table (shoal_quant_init's choice). Thread: any. */
const struct shoal_quant_ops *shoal_quant_active_ops(void);

/* ---- backend table (for quant*.c and tests) -------------------------------
 * One per ISA file; all members are required unless marked (optional).
 * The ISA files may assume that their arguments are valid (checked in
 * quant.c and ggml_dot.c). */
struct shoal_quant_ops {
    const char *name;
    /* canonical dot product, as shoal_quant_dot */
    float (*dot)(enum shoal_quant_type type, int group, const float *x,
                 const void *row, int64_t n);
    /* y[t][r] for every token t < n_tok and rows r0 <= r < r1 */
    void (*linear_rows)(float *y, const float *x, int64_t n_tok,
                        const struct shoal_quant_weight *w, int64_t r0,
                        int64_t r1);
    /* INT4A8: y[t][r] for tokens t < n_tok of a (quantized input) and rows
     * r0 <= r < r1 of the INT4 weight w; same bits as the scalar table */
    void (*linear_rows_a8)(float *y, const struct shoal_quant_act *a,
                           int64_t n_tok, const struct shoal_quant_weight *w,
                           int64_t r0, int64_t r1);
    /* shoal_quant_act_quantize (one of the quant_act.c builds) */
    void (*act_quantize)(struct shoal_quant_act *a, const float *x, int64_t n_tok);
    /* FP8: y[t][r] for every token t < n_tok and rows r0 <= r < r1 of the
     * FP8 weight w (the FP8 canonical order) */
    void (*fp8_rows)(float *y, const float *x, int64_t n_tok, const struct shoal_weight *w,
                     int64_t r0, int64_t r1);
    /* FP8: shoal_fp8_dequantize_row (the same bits: decode, then times the
     * block scale) */
    void (*fp8_dequant_row)(float *dst, const struct shoal_weight *w, int64_t r);
    /* FP8: shoal_fp8_axpy_rows (the same bits) */
    void (*fp8_axpy_rows)(float *dst, const struct shoal_weight *w, int64_t r0,
                          int64_t n_rows, const float *coef, int64_t coef_stride);
    /* MXFP4: y[t][r] for every token t < n_tok and rows r0 <= r < r1 of the
     * MXFP4 weight w (the MXFP4 canonical order) */
    void (*mxfp4_rows)(float *y, const float *x, int64_t n_tok, const struct shoal_weight *w,
                       int64_t r0, int64_t r1);
    /* (optional) ggml-typed weights (ggml_dot.h): y[t][r] for tokens
     * t < n_tok of the quantized activations a and rows r0 <= r < r1 of w,
     * the ggml_dot.h canonical order; NULL: shoal_ggml_rows_scalar */
    void (*ggml_rows)(float *y, const struct shoal_ggml_act *a, int64_t n_tok,
                      const struct shoal_ggml_matrix *w, int64_t r0, int64_t r1);
    /* (optional) one group by the INT8 rule, as shoal_quant_act_group_base
     * (the same bytes; the ggml activations' blocks); NULL: that one */
    int32_t (*act_group)(const float *x, int64_t len, float *d, int8_t *q);
    /* (optional) shoal_quant_axpy_rows (the same bits); NULL: the scalar one */
    void (*axpy_rows)(enum shoal_quant_type type, int group, float *dst, int64_t n,
                      const void *rows, size_t row_bytes, const float *coef,
                      int64_t coef_stride, int64_t n_rows);
};

/* The FP8 rows of the scalar table (quant_fp8.c), the AVX2 table
 * (quant_avx2.c; the AVX-512 tables use it too) and the NEON one
 * (quant_neon.c; the DotProd and I8MM tables too). */
void shoal_fp8_rows_scalar(float *y, const float *x, int64_t n_tok,
                           const struct shoal_weight *w, int64_t r0, int64_t r1);
void shoal_fp8_rows_avx2(float *y, const float *x, int64_t n_tok,
                         const struct shoal_weight *w, int64_t r0, int64_t r1);
void shoal_fp8_rows_neon(float *y, const float *x, int64_t n_tok,
                         const struct shoal_weight *w, int64_t r0, int64_t r1);
void shoal_fp8_dequant_row_scalar(float *dst, const struct shoal_weight *w, int64_t r);
void shoal_fp8_axpy_rows_scalar(float *dst, const struct shoal_weight *w, int64_t r0,
                                int64_t n_rows, const float *coef, int64_t coef_stride);
void shoal_fp8_axpy_rows_avx2(float *dst, const struct shoal_weight *w, int64_t r0,
                              int64_t n_rows, const float *coef, int64_t coef_stride);
void shoal_fp8_axpy_rows_neon(float *dst, const struct shoal_weight *w, int64_t r0,
                              int64_t n_rows, const float *coef, int64_t coef_stride);
void shoal_fp8_dequant_row_avx2(float *dst, const struct shoal_weight *w, int64_t r);
void shoal_fp8_dequant_row_neon(float *dst, const struct shoal_weight *w, int64_t r);

/* The MXFP4 rows of the scalar, AVX2, AVX-512 (both builds: a 16-entry
 * vpermt2ps decode) and NEON (DotProd and I8MM too) tables. */
void shoal_mxfp4_rows_scalar(float *y, const float *x, int64_t n_tok,
                             const struct shoal_weight *w, int64_t r0, int64_t r1);
void shoal_mxfp4_rows_avx2(float *y, const float *x, int64_t n_tok,
                           const struct shoal_weight *w, int64_t r0, int64_t r1);
void shoal_mxfp4_rows_avx512(float *y, const float *x, int64_t n_tok,
                             const struct shoal_weight *w, int64_t r0, int64_t r1);
void shoal_mxfp4_rows_avx512bw(float *y, const float *x, int64_t n_tok,
                               const struct shoal_weight *w, int64_t r0, int64_t r1);
void shoal_mxfp4_rows_neon(float *y, const float *x, int64_t n_tok,
                           const struct shoal_weight *w, int64_t r0, int64_t r1);

/* shoal_quant_act_quantize and its per-group rule (returns the group's sum
 * of q), built at the baseline ISA and with AVX2 (quant_act.c): the same
 * bytes. */
void shoal_quant_act_quantize_base(struct shoal_quant_act *a, const float *x, int64_t n_tok);
void shoal_quant_act_quantize_avx2(struct shoal_quant_act *a, const float *x, int64_t n_tok);
int32_t shoal_quant_act_group_base(const float *x, int64_t len, float *d, int8_t *q);
int32_t shoal_quant_act_group_avx2(const float *x, int64_t len, float *d, int8_t *q);

/* The scalar INT4A8 rows, which any table may use for shapes it does not
 * cover. */
void shoal_quant_a8_rows_scalar(float *y, const struct shoal_quant_act *a,
                                int64_t n_tok,
                                const struct shoal_quant_weight *w, int64_t r0,
                                int64_t r1);

/* Chunk-order position of column i in a token's q (struct shoal_quant_act). */
static inline int64_t shoal_quant_act_pos(int64_t i)
{
    const int64_t j = i & 127;
    return (i - j) + ((j & 1) ? 64 : 0) + (j >> 1);
}

/* The order in which the avx2 table's INT4A8 decode matvec reads a block
 * of 8 rows: 0, side by side (32 bytes of each row per step, the 8-row
 * trees; the faster on AMD Zen 4), or 1, one after another (each row a
 * sequential stream, its group terms transposed 8 by 8; on an Intel Xeon
 * 0.87-0.93 of a paired RAM read against 0.70-0.77 side by side, on a
 * Zen 3 EPYC 0.81-0.87 against 0.67-0.69, docs/BENCHMARKS.md). Same bits
 * either way. Batches of 2 or more tokens always read a block side by side
 * (each 32-column piece transposed once for all of them). shoal_quant_init
 * sets it from the CPU (0 on AMD family 19h with AVX-512, i.e. Zen 4; 1
 * elsewhere) unless SHOAL_AVX2_DECODE_ORDER is "rows" or "seq". Thread:
 * main, not while kernels run. */
void shoal_quant_avx2_set_decode_order(int seq);

extern const struct shoal_quant_ops shoal_quant_ops_scalar;
extern const struct shoal_quant_ops shoal_quant_ops_avx2;  /* x86-64 builds */
extern const struct shoal_quant_ops shoal_quant_ops_avx512; /* x86-64, if the
                                                  compiler has AVX-512 */
extern const struct shoal_quant_ops shoal_quant_ops_avx512bw; /* same, no VBMI */
extern const struct shoal_quant_ops shoal_quant_ops_neon;  /* aarch64 builds */
extern const struct shoal_quant_ops shoal_quant_ops_neon_dotprod; /* aarch64, if the
                                                  compiler has +dotprod */
extern const struct shoal_quant_ops shoal_quant_ops_neon_i8mm; /* same, +i8mm */

/* The baseline NEON dot and linear rows (quant_neon.c), which the DotProd and
 * I8MM tables reuse: the members dot and linear_rows above. aarch64 builds. */
float shoal_quant_neon_dot(enum shoal_quant_type type, int group, const float *x,
                           const void *row, int64_t n);
void shoal_quant_neon_linear_rows(float *y, const float *x, int64_t n_tok,
                                  const struct shoal_quant_weight *w, int64_t r0,
                                  int64_t r1);

/* Where a row's scales and quants start (layout above). */
static inline const uint8_t *shoal_quant_row_qs(const void *row, int64_t n,
                                                int group)
{
    return (const uint8_t *)row + 4 * (size_t)((n + group - 1) / group);
}

#endif
