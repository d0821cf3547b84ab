/* ggml_types: the ggml type table, byte sizes, and dequantization by row
 * (ggml_types.h). Block sizes and bytes per block: ggml's type traits
 * (ggml.c type_traits) and gguf-py's GGML_QUANT_SIZES, which agree. */
#include "ggml_types.h"

#include <inttypes.h>
#include <strings.h>

#include "ggml_types_impl.h"
#include "tensor.h"

#define QK_K SHOAL_GGML_QK_K

#define T(id_, name_, bs, ts, fn) \
    [SHOAL_GGML_TYPE_##id_] = {SHOAL_GGML_TYPE_##id_, name_, bs, ts, fn}

/* Indexed by id; entries with a NULL name are ids ggml does not define. */
static const struct shoal_ggml_type_info types[SHOAL_GGML_TYPE_COUNT] = {
    T(F32, "F32", 1, 4, shoal_ggml_dequant_f32),
    T(F16, "F16", 1, 2, shoal_ggml_dequant_f16),
    T(Q4_0, "Q4_0", 32, 18, shoal_ggml_dequant_q4_0),
    T(Q4_1, "Q4_1", 32, 20, shoal_ggml_dequant_q4_1),
    T(Q5_0, "Q5_0", 32, 22, shoal_ggml_dequant_q5_0),
    T(Q5_1, "Q5_1", 32, 24, shoal_ggml_dequant_q5_1),
    T(Q8_0, "Q8_0", 32, 34, shoal_ggml_dequant_q8_0),
    T(Q8_1, "Q8_1", 32, 36, NULL),
    T(Q2_K, "Q2_K", QK_K, 84, shoal_ggml_dequant_q2_k),
    T(Q3_K, "Q3_K", QK_K, 110, shoal_ggml_dequant_q3_k),
    T(Q4_K, "Q4_K", QK_K, 144, shoal_ggml_dequant_q4_k),
    T(Q5_K, "Q5_K", QK_K, 176, shoal_ggml_dequant_q5_k),
    T(Q6_K, "Q6_K", QK_K, 210, shoal_ggml_dequant_q6_k),
    T(Q8_K, "Q8_K", QK_K, 292, NULL),
    T(IQ2_XXS, "IQ2_XXS", QK_K, 66, shoal_ggml_dequant_iq2_xxs),
    T(IQ2_XS, "IQ2_XS", QK_K, 74, shoal_ggml_dequant_iq2_xs),
    T(IQ3_XXS, "IQ3_XXS", QK_K, 98, shoal_ggml_dequant_iq3_xxs),
    T(IQ1_S, "IQ1_S", QK_K, 50, shoal_ggml_dequant_iq1_s),
    T(IQ4_NL, "IQ4_NL", 32, 18, shoal_ggml_dequant_iq4_nl),
    T(IQ3_S, "IQ3_S", QK_K, 110, shoal_ggml_dequant_iq3_s),
    T(IQ2_S, "IQ2_S", QK_K, 82, shoal_ggml_dequant_iq2_s),
    T(IQ4_XS, "IQ4_XS", QK_K, 136, shoal_ggml_dequant_iq4_xs),
    T(I8, "I8", 1, 1, NULL),
    T(I16, "I16", 1, 2, NULL),
    T(I32, "I32", 1, 4, NULL),
    T(I64, "I64", 1, 8, NULL),
    T(F64, "F64", 1, 8, NULL),
    T(IQ1_M, "IQ1_M", QK_K, 56, shoal_ggml_dequant_iq1_m),
    T(BF16, "BF16", 1, 2, shoal_ggml_dequant_bf16),
    T(TQ1_0, "TQ1_0", QK_K, 54, NULL),
    T(TQ2_0, "TQ2_0", QK_K, 66, NULL),
    T(MXFP4, "MXFP4", 32, 17, shoal_ggml_dequant_mxfp4),
    T(NVFP4, "NVFP4", 64, 36, NULL),
    T(Q1_0, "Q1_0", 128, 18, NULL),
    T(Q2_0, "Q2_0", 64, 18, NULL),
};

#undef T

const struct shoal_ggml_type_info *shoal_ggml_type_info(uint32_t id)
{
    if (id >= SHOAL_GGML_TYPE_COUNT || !types[id].name)
        return NULL;
    return &types[id];
}

const char *shoal_ggml_type_name(uint32_t id)
{
    const struct shoal_ggml_type_info *t = shoal_ggml_type_info(id);
    return t ? t->name : "unknown";
}

int shoal_ggml_type_from_name(const char *name)
{
    for (uint32_t id = 0; id < SHOAL_GGML_TYPE_COUNT; id++)
        if (types[id].name && strcasecmp(types[id].name, name) == 0)
            return (int)id;
    return SHOAL_ENOTFOUND;
}

int shoal_ggml_nbytes(uint32_t id, const uint64_t *ne, uint32_t n_dims,
                      const char *what, uint64_t *out, struct shoal_err *err)
{
    const struct shoal_ggml_type_info *t = shoal_ggml_type_info(id);
    if (!what)
        what = "tensor";
    if (!t)
        return shoal_err_set(err, SHOAL_EUNSUPPORTED,
                             "%s has ggml type %" PRIu32 ", which is not a ggml type "
                             "(known: 0-3, 6-30, 34, 35, 39-42)",
                             what, id);
    if (n_dims == 0)
        return shoal_err_set(err, SHOAL_ESHAPE, "%s has no dimensions", what);
    if (ne[0] % t->block_size != 0)
        return shoal_err_set(err, SHOAL_ESHAPE,
                             "%s: row of %" PRIu64 " elements is not a multiple of %s's "
                             "block of %" PRIu32,
                             what, ne[0], t->name, t->block_size);
    const uint64_t lim = (uint64_t)INT64_MAX;
    uint64_t bytes = ne[0] / t->block_size;
    if (bytes > lim / t->type_size)
        goto overflow;
    bytes *= t->type_size;
    for (uint32_t d = 1; d < n_dims; d++) {
        if (ne[d] != 0 && bytes > lim / ne[d])
            goto overflow;
        bytes *= ne[d];
    }
    *out = bytes;
    return 0;
overflow:
    return shoal_err_set(err, SHOAL_ERANGE,
                         "%s: %s with dims [%" PRIu64 ", %" PRIu64 ", %" PRIu64 ", %" PRIu64
                         "] (first %" PRIu32 " used) overflows 2^63 bytes",
                         what, t->name, ne[0], n_dims > 1 ? ne[1] : 1,
                         n_dims > 2 ? ne[2] : 1, n_dims > 3 ? ne[3] : 1, n_dims);
}

int shoal_ggml_dequant_row(uint32_t id, const void *src, float *dst,
                           uint64_t n, struct shoal_err *err)
{
    const struct shoal_ggml_type_info *t = shoal_ggml_type_info(id);
    if (!t || !t->dequant)
        return shoal_err_set(err, SHOAL_EUNSUPPORTED,
                             "dequantization of ggml type %" PRIu32 " (%s) is not "
                             "implemented",
                             id, shoal_ggml_type_name(id));
    if (n % t->block_size != 0)
        return shoal_err_set(err, SHOAL_ESHAPE,
                             "dequantize %s: %" PRIu64 " elements is not a multiple of "
                             "the block of %" PRIu32,
                             t->name, n, t->block_size);
    const uint8_t *p = src;
    for (uint64_t i = 0; i < n / t->block_size; i++)
        t->dequant(p + i * t->type_size, dst + i * t->block_size);
    return 0;
}

int shoal_ggml_check_scales(uint32_t id, const void *src, uint64_t n_blocks, const char *what,
                            uint64_t block0, struct shoal_err *err)
{
    /* the byte offsets of a block's f16 scales (-1: none) and their names */
    int off[2] = {-1, -1};
    const char *name[2] = {"d", "dmin"};
    switch (id) {
    case SHOAL_GGML_TYPE_Q8_0: case SHOAL_GGML_TYPE_Q4_0: case SHOAL_GGML_TYPE_Q5_0:
    case SHOAL_GGML_TYPE_IQ4_NL: case SHOAL_GGML_TYPE_IQ4_XS: case SHOAL_GGML_TYPE_IQ2_XXS:
    case SHOAL_GGML_TYPE_IQ3_XXS: case SHOAL_GGML_TYPE_IQ1_S: case SHOAL_GGML_TYPE_IQ2_XS:
    case SHOAL_GGML_TYPE_IQ2_S: case SHOAL_GGML_TYPE_IQ3_S:
        off[0] = 0;
        break;
    case SHOAL_GGML_TYPE_Q4_1: case SHOAL_GGML_TYPE_Q5_1:
        off[0] = 0, off[1] = 2, name[1] = "m";
        break;
    case SHOAL_GGML_TYPE_Q4_K: case SHOAL_GGML_TYPE_Q5_K: off[0] = 0, off[1] = 2; break;
    case SHOAL_GGML_TYPE_Q2_K: off[0] = 80, off[1] = 82; break;
    case SHOAL_GGML_TYPE_Q3_K: off[0] = 108; break;
    case SHOAL_GGML_TYPE_Q6_K: off[0] = 208; break;
    case SHOAL_GGML_TYPE_IQ1_M: case SHOAL_GGML_TYPE_MXFP4: break;   /* below */
    default: return 0;
    }
    const size_t size = shoal_ggml_type_info(id)->type_size;
    const uint8_t *p = src;
    for (uint64_t b = 0; b < n_blocks; b++, p += size) {
        if (id == SHOAL_GGML_TYPE_MXFP4) {
            if (p[0] == 0xFF)   /* E8M0's NaN (ggml reads it as 2^127) */
                return shoal_err_set(err, SHOAL_EFORMAT,
                                     "tensor '%s': MXFP4 block %" PRIu64 " has scale e = 255 "
                                     "(E8M0 NaN); expected an exponent 0..254",
                                     what, block0 + b);
            continue;
        }
        for (int k = 0; k < 2; k++) {
            uint16_t h;
            if (id == SHOAL_GGML_TYPE_IQ1_M) {   /* d: the top nibbles of 4 u16 at 48 */
                if (k > 0)
                    break;
                h = (uint16_t)(p[49] >> 4 | (p[51] & 0xF0) | (p[53] >> 4) << 8 |
                               (p[55] & 0xF0) << 8);
            } else if (off[k] >= 0) {
                h = (uint16_t)(p[off[k]] | p[off[k] + 1] << 8);
            } else {
                break;
            }
            if ((h & 0x7C00u) == 0x7C00u)   /* exponent all ones: inf or NaN */
                return shoal_err_set(err, SHOAL_EFORMAT,
                                     "tensor '%s': %s block %" PRIu64 " has scale %s = %g "
                                     "(f16 0x%04x); expected a finite f16",
                                     what, shoal_ggml_type_name(id), block0 + b, name[k],
                                     (double)shoal_f16_to_f32(h), (unsigned)h);
        }
    }
    return 0;
}
