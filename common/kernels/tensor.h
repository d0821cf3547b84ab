/* tensor: element types and borrowed weight views.
 *
 * A weight view points into memory owned by someone else (an mmap'd
 * safetensors file, later the container or the expert store) and lives as
 * long as that owner. Views are never freed individually.
 * Thread: any (views are read-only).
 */
#ifndef SHOAL_TENSOR_H
#define SHOAL_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum shoal_dtype {
    SHOAL_DTYPE_F32 = 0,
    SHOAL_DTYPE_F16 = 1,
    SHOAL_DTYPE_BF16 = 2,
    SHOAL_DTYPE_INT8 = 3,   /* grouped int8, layout in quant.h (2-D only) */
    SHOAL_DTYPE_INT4 = 4,   /* grouped int4, layout in quant.h (2-D only) */
    SHOAL_DTYPE_INT4A8 = 5, /* INT4's bytes, computed against int8
                               activations (quant.h "Int8 activations") */
    SHOAL_DTYPE_FP8 = 6,    /* OCP E4M3FN bytes with one f32 scale per
                               128 x 128 block (quant.h "FP8"; 2-D only) */
    SHOAL_DTYPE_MXFP4 = 7,  /* OCP MXFP4: E2M1 pairs with one E8M0 exponent
                               per 32 values of a row (quant.h "MXFP4";
                               2-D only, cols a multiple of 32) */
    SHOAL_DTYPE_GGML = 8,   /* a ggml-typed matrix as a GGUF file ships it
                               (w->ggml_type: shoal_ggml_dot_supported, ggml_dot.h;
                               2-D only). Not a name shoal_dtype_parse accepts:
                               a container writes "GGML" with its "ggml_type",
                               which its reader parses together (FORMAT.md) */
    SHOAL_DTYPE_COUNT
};

static inline int shoal_dtype_is_quant(enum shoal_dtype t)
{
    return t == SHOAL_DTYPE_INT8 || t == SHOAL_DTYPE_INT4 || t == SHOAL_DTYPE_INT4A8;
}

/* Bytes per element of a float dtype, 1 for FP8's codes (its block scales
 * come on top; quantized types: see quant.h; MXFP4 has half a byte per
 * element, see shoal_weight_row_bytes). */
static inline size_t shoal_dtype_size(enum shoal_dtype t)
{
    return t == SHOAL_DTYPE_F32 ? 4 : t == SHOAL_DTYPE_FP8 ? 1 : 2;
}

/* Name: "F32", "F16", "BF16" (as safetensors spells them), "INT8", "INT4",
 * "INT4A8", "FP8", "MXFP4", "GGML".
 * Static string. */
const char *shoal_dtype_name(enum shoal_dtype t);

/* Parse a name as written by shoal_dtype_name (case-insensitive), except
 * "GGML" (a GGUF tensor's type is its ggml type, never a file's dtype name).
 * Returns 0 and sets *t, or -1. */
int shoal_dtype_parse(const char *name, enum shoal_dtype *t);

/* A 1-D or 2-D weight: rows x cols elements of dtype, row-major,
 * rows contiguous. For 1-D weights rows == 1. */
struct shoal_weight {
    enum shoal_dtype dtype;
    const void *data;   /* borrowed, rows*cols elements */
    int64_t rows;       /* outer dimension (output features) */
    int64_t cols;       /* inner dimension (input features) */
    int group;          /* quantized dtypes: elements per scale group;
                           FP8: the block edge B (128), rows and columns;
                           MXFP4: 32 */
    const float *scale; /* FP8 only: borrowed block scales
                           [ceil(rows/B)][ceil(cols/B)] f32; element (r, c)
                           is code value * scale[r/B][c/B]. NULL otherwise */
    const uint8_t *e8m0; /* MXFP4 only: borrowed E8M0 exponents
                           [rows][cols/32]; data holds the packed E2M1
                           pairs [rows][cols/2]; element (r, c) is
                           e2m1(nibble) * 2^(e8m0[r][c/32] - 127). NULL
                           otherwise */
    int row_step;       /* MXFP4 only: row r is row r * row_step of the tensor data
                           and e8m0 point into (gpt-oss's gate and up: the even and
                           odd rows of gate_up_proj); 0 or 1: rows back to back */
    uint32_t ggml_type; /* GGML only: enum shoal_ggml_type (ggml_types.h), one with
                           a dot product (shoal_ggml_dot_supported); rows are
                           cols / block blocks back to back */
};

/* Row r of an MXFP4 weight: its packed pairs and its exponents. Thread: any. */
static inline const uint8_t *shoal_mxfp4_row_q(const struct shoal_weight *w, int64_t r)
{
    const size_t step = w->row_step > 1 ? (size_t)w->row_step : 1;
    return (const uint8_t *)w->data + (size_t)r * step * (size_t)(w->cols / 2);
}
static inline const uint8_t *shoal_mxfp4_row_e(const struct shoal_weight *w, int64_t r)
{
    const size_t step = w->row_step > 1 ? (size_t)w->row_step : 1;
    return w->e8m0 + (size_t)r * step * (size_t)(w->cols / 32);
}

/* The MXFP4 block: 32 consecutive values of a row share one exponent. */
#define SHOAL_MXFP4_BLOCK 32

/* Bytes of an MXFP4 weight's E8M0 exponents ([rows][cols/32], one byte
 * each); in a container they follow the rows * cols / 2 packed bytes
 * directly (docs/FORMAT.md "MXFP4 tensors"). Thread: any. */
static inline size_t shoal_mxfp4_scale_bytes(int64_t rows, int64_t cols)
{
    return (size_t)rows * (size_t)(cols / SHOAL_MXFP4_BLOCK);
}

/* The FP8 block edge shoal reads and writes (quantization_config
 * weight_block_size [128, 128], as DeepSeek-V3/R1 and Kimi-K2 ship). */
#define SHOAL_FP8_BLOCK 128

/* FP8 block scales: where they start in a container's FP8 tensor (after the
 * rows * cols codes, padded to 4 bytes) and how many bytes they take.
 * docs/FORMAT.md "FP8 tensors". Thread: any. */
static inline size_t shoal_fp8_scale_offset(int64_t rows, int64_t cols)
{
    return ((size_t)rows * (size_t)cols + 3) & ~(size_t)3;
}
static inline size_t shoal_fp8_scale_bytes(int64_t rows, int64_t cols, int block)
{
    if (block < 1)
        return 0;
    return 4 * (size_t)((rows + block - 1) / block) * (size_t)((cols + block - 1) / block);
}

static inline float shoal_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round-to-nearest-even f32 -> bf16 (NaN stays NaN), as torch does. */
static inline uint16_t shoal_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* IEEE half -> f32 (exact; handles subnormals, inf, NaN). */
float shoal_f16_to_f32(uint16_t h);

/* f32 -> IEEE half, round to nearest, ties to even (as F16C's vcvtps2ph
 * and NEON's fcvtn with the default rounding): |f| >= 65520 becomes
 * infinity, tiny values become subnormals or a signed zero, NaN stays a
 * quiet NaN with the top payload bits. Thread: any. */
uint16_t shoal_f32_to_f16(float f);

/* Convert n elements of src (dtype t) to f32 in dst. Thread: any. */
void shoal_to_f32(float *dst, const void *src, enum shoal_dtype t, size_t n);

/* Bytes of one row of w (quantized rows include their scales; an MXFP4
 * row is its cols / 2 packed bytes, the exponents live apart in e8m0; a
 * GGML row is its cols / block_size blocks). */
size_t shoal_weight_row_bytes(const struct shoal_weight *w);

/* Bytes of the whole weight (FP8: codes, padding and block scales; MXFP4:
 * packed pairs, then exponents; as a container stores them). */
static inline size_t shoal_weight_bytes(const struct shoal_weight *w)
{
    if (w->dtype == SHOAL_DTYPE_FP8)
        return shoal_fp8_scale_offset(w->rows, w->cols) +
               shoal_fp8_scale_bytes(w->rows, w->cols, w->group);
    if (w->dtype == SHOAL_DTYPE_MXFP4)
        return (size_t)w->rows * (size_t)w->cols / 2 + shoal_mxfp4_scale_bytes(w->rows, w->cols);
    return (size_t)w->rows * shoal_weight_row_bytes(w);
}

/* Row r of a weight as a pointer to its first byte (MXFP4: of its packed
 * pairs). */
static inline const void *shoal_weight_row(const struct shoal_weight *w,
                                           int64_t r)
{
    return (const char *)w->data + (size_t)r * shoal_weight_row_bytes(w);
}

struct shoal_err;

/* Check that every group scale of a grouped int8 / int4 weight (dtype INT8,
 * INT4 or INT4A8: quant.h's row layout, an f32 scale per group) is finite.
 * The quantizer never writes another, but a file's bytes are the file's: a
 * NaN or infinite scale would make the kernels' outputs NaN with a sign
 * that differs between ISAs (contract 1) instead of a clear error
 * (contract 3). Reads rows * ceil(cols / group) scales; other dtypes pass.
 *   name   the tensor's name for the message (borrowed)
 * Returns 0, or SHOAL_EFORMAT with err set: "tensor 'NAME': group scale
 * (row R, group G) is nan; expected a finite f32". Allocates nothing, opens
 * no parallel region (the expert store calls it on its I/O threads).
 * Thread: any. */
int shoal_weight_check_scales(const struct shoal_weight *w, const char *name,
                              struct shoal_err *err);

/* A view of rows [r0, r0 + n) of a 2-D weight w (borrowed: the view reads
 * w's bytes), usable wherever w is. Returns 0, or -1 when the rows cannot
 * be a weight of their own: out of range, or an FP8 weight whose r0 is not
 * on a block edge (its scales cover 128-row blocks). An MXFP4 view is two
 * pointer offsets (any r0). Thread: any. */
int shoal_weight_rows_view(const struct shoal_weight *w, int64_t r0, int64_t n,
                           struct shoal_weight *out);

/* Rows r0 .. r0 + n_rows - 1 of a quantized (INT8, INT4, INT4A8:
 * shoal_quant_axpy_rows), FP8 (shoal_fp8_axpy_rows), F32 or BF16 weight w
 * scaled and added into dst in
 * row order, without an f32 copy of each row: dst[j] = dst[j] +
 * coef[i * coef_stride] * row_to_f32(r0 + i)[j], the bits of
 * shoal_weight_row_to_f32 and that sum.
 *   dst [w->cols] f32, read and written; coef borrowed.
 * Returns 0, or -1 (nothing done) for any other dtype: the caller converts
 * the rows itself. Allocates nothing. Thread: any. */
int shoal_weight_axpy_rows(float *dst, const struct shoal_weight *w, int64_t r0,
                           int64_t n_rows, const float *coef, int64_t coef_stride);

/* Row r of w converted to f32 (dequantized for quantized dtypes, FP8,
 * whose w->scale must be set, MXFP4, whose w->e8m0 must be set, and GGML,
 * by its type's scalar reference, ggml_types.h).
 *   dst [w->cols] f32, written. Thread: any. */
void shoal_weight_row_to_f32(float *dst, const struct shoal_weight *w, int64_t r);

#endif
