/* ggml_types: the tensor element types a GGUF file may hold, as ggml numbers
 * and sizes them, and the scalar reference dequantization of each.
 *
 * A ggml tensor of type T stores its innermost dimension (ne[0]) in blocks
 * of block_size elements, each block type_size bytes; a row of ne[0]
 * elements is ne[0] / block_size blocks back to back, and ne[0] must be a
 * multiple of block_size. The ids, names and sizes follow ggml/include/ggml.h
 * (enum ggml_type) and gguf-py/gguf/constants.py (GGML_QUANT_SIZES); the
 * block layouts follow ggml/src/ggml-common.h, and every dequantization
 * here gives the same floats, bit for bit, as gguf-py/gguf/quants.py and
 * ggml-quants.c's dequantize_row_* (tests/unit/test_ggml_types.c checks it
 * against vectors made with gguf-py; tests/data/gguf/README.md).
 *
 * Ids 4, 5, 31-33 and 36-38 were types ggml has removed; they, and ids
 * past the table, are unknown: shoal_ggml_type_info() returns NULL for them.
 *
 * Thread: any (everything here is pure; no state).
 */
#ifndef SHOAL_GGML_TYPES_H
#define SHOAL_GGML_TYPES_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

enum shoal_ggml_type {
    SHOAL_GGML_TYPE_F32     = 0,
    SHOAL_GGML_TYPE_F16     = 1,
    SHOAL_GGML_TYPE_Q4_0    = 2,
    SHOAL_GGML_TYPE_Q4_1    = 3,
    SHOAL_GGML_TYPE_Q5_0    = 6,
    SHOAL_GGML_TYPE_Q5_1    = 7,
    SHOAL_GGML_TYPE_Q8_0    = 8,
    SHOAL_GGML_TYPE_Q8_1    = 9,
    SHOAL_GGML_TYPE_Q2_K    = 10,
    SHOAL_GGML_TYPE_Q3_K    = 11,
    SHOAL_GGML_TYPE_Q4_K    = 12,
    SHOAL_GGML_TYPE_Q5_K    = 13,
    SHOAL_GGML_TYPE_Q6_K    = 14,
    SHOAL_GGML_TYPE_Q8_K    = 15,
    SHOAL_GGML_TYPE_IQ2_XXS = 16,
    SHOAL_GGML_TYPE_IQ2_XS  = 17,
    SHOAL_GGML_TYPE_IQ3_XXS = 18,
    SHOAL_GGML_TYPE_IQ1_S   = 19,
    SHOAL_GGML_TYPE_IQ4_NL  = 20,
    SHOAL_GGML_TYPE_IQ3_S   = 21,
    SHOAL_GGML_TYPE_IQ2_S   = 22,
    SHOAL_GGML_TYPE_IQ4_XS  = 23,
    SHOAL_GGML_TYPE_I8      = 24,
    SHOAL_GGML_TYPE_I16     = 25,
    SHOAL_GGML_TYPE_I32     = 26,
    SHOAL_GGML_TYPE_I64     = 27,
    SHOAL_GGML_TYPE_F64     = 28,
    SHOAL_GGML_TYPE_IQ1_M   = 29,
    SHOAL_GGML_TYPE_BF16    = 30,
    SHOAL_GGML_TYPE_TQ1_0   = 34,
    SHOAL_GGML_TYPE_TQ2_0   = 35,
    SHOAL_GGML_TYPE_MXFP4   = 39,
    SHOAL_GGML_TYPE_NVFP4   = 40,
    SHOAL_GGML_TYPE_Q1_0    = 41,
    SHOAL_GGML_TYPE_Q2_0    = 42,
    SHOAL_GGML_TYPE_COUNT   = 43 /* ids are < this; some below it are unknown */
};

/* One block of a dequantizable type:
 *   src  [type_size] bytes, one block as stored in the file (any alignment),
 *        borrowed
 *   dst  [block_size] f32, written
 * Pure; allocates nothing. Thread: any (compute). */
typedef void (*shoal_ggml_dequant_fn)(const uint8_t *src, float *dst);

struct shoal_ggml_type_info {
    enum shoal_ggml_type id;     /* ggml's number */
    const char *name;            /* "Q4_K", spelled as ggml and gguf-py do */
    uint32_t block_size;         /* elements per block */
    uint32_t type_size;          /* bytes per block */
    shoal_ggml_dequant_fn dequant; /* scalar reference, or NULL where shoal
                                      has none yet */
};

/* The table entry of ggml type id, or NULL if id is not a type ggml
 * defines (removed ids, ids >= SHOAL_GGML_TYPE_COUNT). Static storage.
 * Thread: any. */
const struct shoal_ggml_type_info *shoal_ggml_type_info(uint32_t id);

/* The name of id ("Q4_K"), or "unknown" for an id without a table entry.
 * Static string. Thread: any. */
const char *shoal_ggml_type_name(uint32_t id);

/* The id whose name is name (case-insensitive, "q4_k" = "Q4_K"); returns
 * the id (>= 0), or -SHOAL_ENOTFOUND. Thread: any. */
int shoal_ggml_type_from_name(const char *name);

/* Bytes of a contiguous tensor of type id with dims ne (innermost first,
 * n_dims of them, unused dims absent): ne[0] / block_size * type_size *
 * ne[1] * ... * ne[n_dims-1], computed without overflow.
 *   ne     [n_dims] element counts, borrowed
 * Returns 0 and writes *out (bytes); -SHOAL_EUNSUPPORTED for an unknown
 * id; -SHOAL_ESHAPE if ne[0] is not a multiple of the block size;
 * -SHOAL_ERANGE if the byte count does not fit in 63 bits. Sets err with
 * what (a tensor name, for the message; may be NULL). Thread: any. */
int shoal_ggml_nbytes(uint32_t id, const uint64_t *ne, uint32_t n_dims,
                      const char *what, uint64_t *out, struct shoal_err *err);

/* Dequantize n elements of type id (n a multiple of its block size) from
 * src to dst with the type's scalar reference.
 *   src  [n / block_size * type_size] bytes, borrowed
 *   dst  [n] f32, written
 * Returns 0; -SHOAL_EUNSUPPORTED for an unknown id or a type without a
 * dequantization here (err names it); -SHOAL_ESHAPE if n is not a multiple
 * of the block size. Allocates nothing. Thread: any (compute). */
int shoal_ggml_dequant_row(uint32_t id, const void *src, float *dst,
                           uint64_t n, struct shoal_err *err);

/* Check the block scales of n_blocks blocks of type id at src: the f16 d
 * (and dmin or m, where the type has one) of every Q4_0, Q4_1, Q5_0, Q5_1,
 * Q8_0, Q2_K .. Q6_K, IQ4_NL, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
 * IQ3_S, IQ1_S and IQ1_M block must be finite, and an MXFP4 block's E8M0 exponent must not be
 * 255 (its NaN), since one NaN or infinite scale makes every dot product
 * with its row NaN (the byte layouts: ggml_dot.h, ggml_dequant.c).
 *   src    [n_blocks * type_size] bytes, borrowed
 *   what   the tensor's name for the message, borrowed
 *   block0 the index of src's first block in the tensor (for the message)
 * Returns 0 (also for a type without scales checked here), or
 * -SHOAL_EFORMAT with err naming the tensor, the block index in it, which
 * scale and its value. Reads 1 to 8 bytes per block; allocates nothing.
 * Thread: any. */
int shoal_ggml_check_scales(uint32_t id, const void *src, uint64_t n_blocks, const char *what,
                            uint64_t block0, struct shoal_err *err);

#endif
