/* ggml_dot: dot products and linear layers over ggml-typed weights as a GGUF
 * file ships them, against int8-quantized activations: Q8_0, Q4_K, Q6_K,
 * and in an integer form shared by the rest (below) Q2_K, Q3_K, Q5_K,
 * IQ4_XS, IQ4_NL, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M,
 * MXFP4, Q4_0, Q4_1, Q5_0 and Q5_1 (shoal_ggml_dot_supported).
 *
 * Owns the activation format each weight type is paired with, the
 * canonical order of its dot product, the scalar reference, and the driver
 * that splits a matrix's rows over threads. The SIMD rows sit in the
 * active quant ops table (struct shoal_quant_ops member ggml_rows;
 * ggml_avx2.c, ggml_neon.c); every one gives the scalar reference's bits (DESIGN
 * contract 1): the result does not depend on the thread count, the batch
 * size or the ISA. It is shoal's order, not ggml's: llama.cpp's kernels
 * sum in another order and round activations to f16 scales, so their
 * bits differ from these (by the usual few ulps of a reordered sum).
 *
 * ## Weights (ggml/src/ggml-common.h block layouts; ggml_dequant.c reads them)
 *
 * A matrix [rows][cols] is rows rows of cols / block_size blocks back to
 * back (no padding); cols is a multiple of the block size (32 for Q8_0,
 * 256 for the K-quants).
 *   Q8_0  34 bytes / 32:  d f16 | q[32] int8;          w = d * q
 *   Q4_K 144 bytes / 256: d f16 | dmin f16 | scales[12] (8 pairs of 6-bit
 *         sc, m; get_scale_min_k4) | qs[128] (sub-block 2k: low nibbles of
 *         qs[32k..], 2k+1: high nibbles), 8 sub-blocks of 32;
 *         w = (d * sc[j]) * q - dmin * m[j], q in 0..15
 *   Q6_K 210 bytes / 256: ql[128] | qh[64] | sc[16] int8 | d f16, 16
 *         sub-blocks of 16; w = (d * sc[j]) * (q - 32), q in 0..63
 * The other types' layouts: ggml_dequant.c, one comment per type.
 *
 * ## Integer form of the other types (struct shoal_ggml_iblock)
 *
 * Every other supported type's block of 32 or 256 weights is, exactly,
 *     w[i] = D * sc[i / 16] * c[i] - DMIN * m[i / 16]
 * with int8 codes c, int16 scales sc and mins m per 16 elements, and two
 * f32 block scales D and DMIN (0 and m = 0 for types without a min):
 *   Q2_K    c = q 0..3;       sc, m = the 4-bit nibbles; D = d, DMIN = dmin
 *   Q3_K    c = q - 4 (hmask bit clear) or q, -4..3; sc = 6-bit - 32; D = d
 *   Q5_K    c = q 0..31;      sc, m = Q4_K's 6-bit pair of the 32; D = d, DMIN = dmin
 *   IQ4_XS  c = kvalues_iq4nl[nibble] (-127..113); sc = 6-bit - 32; D = d
 *   IQ4_NL  c = kvalues_iq4nl[nibble]; sc = 1; D = d (blocks of 32)
 *   IQ2_XXS c = +-{8, 25, 43} (grid, signs); sc = 2 s + 1 per 32; D = d * 0.125f
 *   IQ2_XS, IQ2_S  c = +-{8, 25, 43} (grid, signs); sc = 2 s + 1 per 16;
 *           D = d * 0.125f
 *   IQ3_XXS c = +-{4 .. 62} (grid, signs);   sc = 2 s + 1 per 32; D = d * 0.25f
 *   IQ3_S   c = +-{1, 3 .. 15} (grid, signs); sc = 2 s + 1 per 32; D = d
 *   IQ1_S   c = 8 g + 1 or 8 g - 1 (g in -1..1 from the grid, the sign of
 *           the group's delta): +-1, +-7, +-9; sc = 2 s + 1 per 32; D = d * 0.125f
 *   IQ1_M   as IQ1_S with a delta sign per 8 and sc = 2 s + 1 per 16; D = d * 0.125f
 *   MXFP4   c = 2 * E2M1 value (-12..12, ggml's kvalues_mxfp4); sc = 1;
 *           D = 2^(e - 128) (ggml_e8m0_to_fp32_half; blocks of 32)
 *   Q4_0    c = q - 8;  Q5_0 c = q - 16; sc = 1; D = d (blocks of 32)
 *   Q4_1    c = q;      Q5_1 c = q;      sc = 1; D = d, DMIN = -m, m = 1
 *           (blocks of 32; w = d * q + m)
 * (d, dmin, m: the block's f16 scales; the products by 0.125f and 0.25f
 * are exact.) Each line is ggml_dequant.c's formula regrouped with exact
 * rationals: e.g. IQ1_S's d * (2 s + 1) * (g +- 1/8).
 *
 * ## Activations (struct shoal_ggml_act), quantized once per token
 *
 * x [n] f32 is cut into activation blocks of B elements: B = 32 for the
 * types of blocks of 32 (Q8_0, IQ4_NL, MXFP4, Q4_0, Q4_1, Q5_0, Q5_1:
 * ggml's Q8_0 / Q8_1 pairing), B = 256 for the others (ggml's Q8_K).
 * Each block is quantized by quant.h's INT8 rule (shoal_quant_act_group_base):
 *
 *     amax = max |x[i]| over the block;  dx = amax / 127.0f  (one f32 division)
 *     qx[i] = rne(x[i] / dx) clamped to [-127, 127]  (rne: ties to even),
 *             0 for every i when dx is 0; dx = NaN and qx = 0 when amax is
 *             not finite (a NaN or infinity in x makes the results NaN)
 *
 * dx stays f32 (ggml rounds Q8_0's and Q8_1's to f16; shoal does not). For
 * B = 256 and for Q4_1, Q5_1, Q4_0, Q5_0, MXFP4, IQ4_NL and Q8_0, bsum[k] =
 * sum of qx over elements 16k .. 16k+15 (int16, |bsum| <= 2032) is kept
 * with the block: the mins and the SIMD forms of Q6_K's -32, Q4_0's -8,
 * Q5_0's -16 and MXFP4's, IQ4_NL's and Q8_0's codes + 12, + 128 and + 128
 * need them.
 *
 * ## Canonical dot product of token x with row r (every table, bit for bit)
 *
 * Integer sums are exact (int32 bounds below), so any ISA reaches them in
 * any order; only the f32 steps are ordered. Every * + - is one IEEE f32
 * operation rounded to nearest (no FMA: -ffp-contract=off, and the SIMD
 * files use separate mul/add/sub), (float)i is int32 -> f32 rounded to
 * nearest, and f16 scales become f32 exactly.
 *
 *   acc = 0.0f
 *   for each weight block b in order (b = 0 .. cols / block_size - 1):
 *     Q8_0 (activation block b, same 32 elements):
 *       isum = sum_i q[i] * qx[i]                       |isum| <= 32*128*127
 *       acc  = acc + (d * dx[b]) * (float)isum
 *     Q4_K (activation block b, same 256 elements):
 *       isum = sum_j sc[j] * (sum_{i in j} q[i] * qx[i])  |isum| <= 8*63*32*15*127
 *       msum = sum_j m[j] * (sum_{i in j} qx[i])          |msum| <= 8*63*32*127
 *       acc  = acc + ((d * dx[b]) * (float)isum - (dmin * dx[b]) * (float)msum)
 *     Q6_K (activation block b, same 256 elements):
 *       isum = sum_j sc[j] * (sum_{i in j} (q[i] - 32) * qx[i])
 *                                                       |isum| <= 16*128*16*32*127
 *       acc  = acc + (d * dx[b]) * (float)isum
 *     every other type (activation block b, the same 32 or 256 elements):
 *       isum = sum_k sc[k] * (sum_{i in k} c[i] * qx[i])  (k: the 16s)
 *       msum = sum_k m[k] * (sum_{i in k} qx[i])   (types with a min only)
 *       no min:   acc = acc + (D * dx[b]) * (float)isum
 *       with min: acc = acc + ((D * dx[b]) * (float)isum - (DMIN * dx[b]) * (float)msum)
 *       bounds: |c| <= 127, |sc| <= 63, |m| <= 63, so |isum| <= 256 *
 *       127 * 127 * 63 < 2^31 and |msum| <= 256 * 127 * 63
 *   return acc
 *
 * (the parentheses are the order: in Q4_K both products, then their
 * difference, then the add to acc; Q4_1's DMIN = -m makes the difference
 * the sum (d*dx)*isum + (m*dx)*msum, bit for bit). One add per block in a chain keeps
 * the f32 rounding to one per 32 or 256 weights; SIMD runs rows (matvec)
 * or rows x tokens (GEMM) in lanes, never reorders a chain. A NaN result
 * is NaN on every table, but its sign and payload are not part of this
 * contract: where two NaNs meet in an add, x86 keeps the first operand, and
 * the compiler may swap the operands of a commutative add or multiply
 * (NaN scales are refused at load; NaN activations make logits the engine
 * refuses anyway).
 *
 * Thread: every function may be called from any thread; the _part and
 * _rows functions are compute-thread work (no allocation, no locks, no
 * logging). shoal_ggml_linear opens its own OpenMP region.
 */
#ifndef SHOAL_GGML_DOT_H
#define SHOAL_GGML_DOT_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "ggml_types.h"

/* A borrowed view of a ggml-typed matrix [rows][cols] (layout above). */
struct shoal_ggml_matrix {
    enum shoal_ggml_type type;  /* a type with a dot product (shoal_ggml_dot_supported) */
    int64_t rows;               /* output features */
    int64_t cols;               /* input features, a multiple of the block size */
    const void *data;           /* borrowed, rows * cols / block_size * type_size bytes */
};

/* One or more tokens' activations quantized for a weight type (above).
 * Buffers are borrowed from the caller (shoal_ggml_act_bytes per token). */
struct shoal_ggml_act {
    enum shoal_ggml_type type;  /* the weight type it pairs with */
    int64_t n;                  /* elements per token */
    int64_t n_blk;              /* activation blocks per token: n / B */
    int8_t *q;                  /* [n_tok][n] int8 qx */
    float *d;                   /* [n_tok][n_blk] f32 dx */
    int16_t *bsum;              /* [n_tok][n / 16] sums of 16 qx (B = 256, Q4_1,
                                   Q5_1, Q4_0, Q5_0, MXFP4, IQ4_NL, Q8_0; NULL for
                                   the others) */
    const uint8_t *pf_next;     /* (optional, performance only) bytes the next
                                   linear of this thread reads first, for the
                                   rows kernels to prefetch as they finish;
                                   NULL: none (shoal_ggml_prefetch_next) */
    size_t pf_next_bytes;
};

/* 1 if type has a dot product here (the list above), else 0. Thread: any. */
int shoal_ggml_dot_supported(uint32_t type);

/* The supported types' names, "Q8_0, Q4_K, ..." (for messages). Static
 * string. Thread: any. */
const char *shoal_ggml_dot_types(void);

/* Elements per activation block of a weight type: 32 (blocks of 32), 256
 * (blocks of 256), 0 if unsupported. Thread: any. */
int64_t shoal_ggml_act_block(uint32_t type);

/* Bytes of q + d + bsum for one token of n elements (n a multiple of the
 * type's block size), 0 for an unsupported type or a bad n. Thread: any. */
size_t shoal_ggml_act_bytes(uint32_t type, int64_t n);

/* Point a's buffers into buf for n_tok tokens of n elements (q first, then
 * d, then bsum; buf 4-byte aligned, n_tok * shoal_ggml_act_bytes() bytes,
 * borrowed by a). Programmer invariants, not checked. Thread: any. */
void shoal_ggml_act_init(struct shoal_ggml_act *a, enum shoal_ggml_type type, int64_t n,
                         int64_t n_tok, void *buf);

/* Quantize x [n_tok][a->n] f32 (borrowed) into a by the rule above.
 * Deterministic (scalar), allocates nothing. Thread: any. */
void shoal_ggml_act_quantize(struct shoal_ggml_act *a, const float *x, int64_t n_tok);

/* Canonical dot product of token it of a with one row of a->type and
 * a->n elements (row: a->n / block_size blocks, borrowed), straight from
 * the definition above (the reference the tests hold every table to).
 * Arguments are programmer invariants. Thread: any. */
float shoal_ggml_dot(const struct shoal_ggml_act *a, int64_t it, const void *row);

/* Check a matrix view against the bytes behind it: a supported type, rows
 * >= 1, cols >= 1 and a multiple of the block size, data set, and at least
 * rows * row bytes in data_bytes. Returns 0, SHOAL_EUNSUPPORTED (a type
 * without a dot product here), SHOAL_ESHAPE (shape or too few bytes) or
 * SHOAL_EINVAL (data NULL), with err naming expected vs found.
 * Thread: any. */
int shoal_ggml_matrix_check(const struct shoal_ggml_matrix *w, size_t data_bytes,
                            struct shoal_err *err);

/* y = x . W^T, thread ith of nth's share of W's rows (shoal_split_rows:
 * an even split, remainder to the first threads). Each thread quantizes x
 * itself into its activation tile (shoal_act_tile, quant.h: tokens in
 * tiles of 256 KiB; one token wider than the tile, above about 229 K
 * columns, goes row by row through shoal_ggml_dot), so there is no barrier
 * and nothing is allocated after a thread's first call. Every
 * y element is the canonical dot, computed by one thread: the same bits at
 * any thread count, batch size and ISA.
 *   y  [n_tok][w->rows] f32, written (this share's columns only)
 *   x  [n_tok][w->cols] f32, borrowed
 *   w  borrowed, checked once with shoal_ggml_matrix_check
 * Arguments are programmer invariants. Thread: compute. */
void shoal_ggml_linear_part(float *y, const float *x, int64_t n_tok,
                            const struct shoal_ggml_matrix *w, int ith, int nth);

/* The next ggml linear this thread runs after the one it runs now reads
 * w's rows share ith of nth (NULL: none): the current call's rows kernels
 * prefetch its first bytes (up to 16 KiB) while they finish their last
 * rows, as the rows of one matrix prefetch their next group. Performance
 * only; consumed by the next shoal_ggml_linear_part call. Thread: one
 * OpenMP thread (thread-local state). */
void shoal_ggml_prefetch_next(const struct shoal_ggml_matrix *w, int ith, int nth);

/* The hint shoal_ggml_prefetch_next left, taken (and cleared) by a caller
 * that runs two linears where one was expected, and put back before the
 * second. Thread: as shoal_ggml_prefetch_next. */
struct shoal_ggml_hint {
    const uint8_t *p;
    size_t n;
};
struct shoal_ggml_hint shoal_ggml_hint_take(void);
void shoal_ggml_hint_put(struct shoal_ggml_hint h);

/* The whole of shoal_ggml_linear_part in its own OpenMP region, after
 * checking the arguments. Returns 0, SHOAL_EUNSUPPORTED (type), SHOAL_ESHAPE
 * (cols not a multiple of the block size, rows < 1) or SHOAL_EINVAL
 * (n_tok < 0, NULL pointers); y is untouched on error. Thread: main. */
int shoal_ggml_linear(float *y, const float *x, int64_t n_tok,
                      const struct shoal_ggml_matrix *w);

/* ---- the integer form (the rows kernels share it) ------------------------ */

/* One block of a type in integer form (above): w[i] = D * sc[i / 16] *
 * c[i] - DMIN * m[i / 16] for i < the type's block size (32 or 256; the
 * entries past it are unused). */
struct shoal_ggml_iblock {
    int8_t c[256];      /* codes, |c| <= 127 */
    int16_t sc[16];     /* scale of each 16 elements, |sc| <= 63 */
    int16_t m[16];      /* min of each 16 elements, 0..63 (0 without a min) */
    float d, dmin;      /* D and DMIN, f32 (DMIN 0 without a min) */
    int has_min;        /* 1 for Q2_K, Q5_K, Q4_1, Q5_1 */
};

/* 1 if type is one of the integer-form types (all supported ones but
 * Q8_0, Q4_K and Q6_K), else 0. Thread: any. */
int shoal_ggml_iform(uint32_t type);

/* The scales, mins, D, DMIN and has_min of one block blk of an
 * integer-form type into *ib (ib->c untouched): the part of
 * shoal_ggml_iblock_decode that SIMD rows keep when they unpack the codes
 * themselves (the NEON rows do; the AVX2 rows unpack the scales too).
 * Thread: any (compute). */
void shoal_ggml_iblock_scales(enum shoal_ggml_type type, const uint8_t *blk,
                              struct shoal_ggml_iblock *ib);

/* Decode one block blk (type_size bytes, any alignment, borrowed) of an
 * integer-form type into *ib, straight from the table above (scalar: the
 * scalar reference reads it; the SIMD rows unpack the same integers their
 * own way and are held to its bits by the tests). type must satisfy
 * shoal_ggml_iform. Thread: any (compute). */
void shoal_ggml_iblock_decode(enum shoal_ggml_type type, const uint8_t *blk,
                              struct shoal_ggml_iblock *ib);

/* ---- rows kernels (the ops tables' ggml_rows member) ---------------------
 * y[t * w->rows + r] for tokens t < n_tok of a and rows r0 <= r < r1.
 * Arguments valid (checked by the callers above). */
void shoal_ggml_rows_scalar(float *y, const struct shoal_ggml_act *a, int64_t n_tok,
                            const struct shoal_ggml_matrix *w, int64_t r0, int64_t r1);
void shoal_ggml_rows_avx2(float *y, const struct shoal_ggml_act *a, int64_t n_tok,
                          const struct shoal_ggml_matrix *w, int64_t r0, int64_t r1);
/* the same file built with AVX-512 VL + VNNI (the avx512 table's): the
 * one-token Q4_K, Q6_K, Q2_K and Q8_0 rows sum with vpdpbusd / vpdpwssd */
void shoal_ggml_rows_avx512(float *y, const struct shoal_ggml_act *a, int64_t n_tok,
                            const struct shoal_ggml_matrix *w, int64_t r0, int64_t r1);
/* aarch64 (isa/ggml_neon.c): plain NEON, and with sdot (ARMv8.2 DotProd) */
void shoal_ggml_rows_neon(float *y, const struct shoal_ggml_act *a, int64_t n_tok,
                          const struct shoal_ggml_matrix *w, int64_t r0, int64_t r1);
void shoal_ggml_rows_neon_dotprod(float *y, const struct shoal_ggml_act *a, int64_t n_tok,
                                  const struct shoal_ggml_matrix *w, int64_t r0, int64_t r1);

#endif
