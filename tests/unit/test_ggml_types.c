/* ggml types: the type table (ids, names, block sizes, bytes per block),
 * tensor byte counts, and each scalar dequantization against gguf-py.
 *
 * The dequantization tests are bit-exact (eq on the float bits): the
 * vectors in tests/data/gguf/ are random blocks and gguf-py's quants.py
 * dequantization of them (tests/data/gguf/README.md), and every type's
 * reference does the same IEEE float operations in the same order, so no
 * tolerance is needed. */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "ggml_types.h"
#include "util.h"

#define DATA_DIR SHOAL_SOURCE_ROOT "/tests/data/gguf/"

/* The types issue 30 lists, with ggml's ids and GGML_QUANT_SIZES. */
static const struct {
    const char *name;
    uint32_t id, block_size, type_size;
} listed[] = {
    {"F32", 0, 1, 4},          {"F16", 1, 1, 2},         {"BF16", 30, 1, 2},
    {"Q8_0", 8, 32, 34},       {"Q4_0", 2, 32, 18},      {"Q4_1", 3, 32, 20},
    {"Q5_0", 6, 32, 22},       {"Q5_1", 7, 32, 24},      {"Q2_K", 10, 256, 84},
    {"Q3_K", 11, 256, 110},    {"Q4_K", 12, 256, 144},   {"Q5_K", 13, 256, 176},
    {"Q6_K", 14, 256, 210},    {"IQ1_S", 19, 256, 50},   {"IQ1_M", 29, 256, 56},
    {"IQ2_XXS", 16, 256, 66},  {"IQ2_XS", 17, 256, 74},  {"IQ2_S", 22, 256, 82},
    {"IQ3_XXS", 18, 256, 98},  {"IQ3_S", 21, 256, 110},  {"IQ4_NL", 20, 32, 18},
    {"IQ4_XS", 23, 256, 136},  {"MXFP4", 39, 32, 17},
};

Test(ggml_types, listed_types_have_ggml_ids_and_sizes)
{
    for (size_t i = 0; i < sizeof listed / sizeof *listed; i++) {
        const struct shoal_ggml_type_info *t = shoal_ggml_type_info(listed[i].id);
        cr_assert_not_null(t, "%s (id %u) missing", listed[i].name, listed[i].id);
        cr_assert(eq(str, (char *)t->name, (char *)listed[i].name));
        cr_assert(eq(u32, t->block_size, listed[i].block_size), "%s", t->name);
        cr_assert(eq(u32, t->type_size, listed[i].type_size), "%s", t->name);
        cr_assert(eq(int, shoal_ggml_type_from_name(listed[i].name), (int)listed[i].id));
    }
    cr_assert(eq(int, shoal_ggml_type_from_name("q4_k"), SHOAL_GGML_TYPE_Q4_K));
}

Test(ggml_types, removed_and_out_of_range_ids_are_unknown)
{
    const uint32_t bad[] = {4, 5, 31, 32, 33, 36, 37, 38, SHOAL_GGML_TYPE_COUNT, 1000,
                            UINT32_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_null(shoal_ggml_type_info(bad[i]), "id %u", bad[i]);
        cr_assert(eq(str, (char *)shoal_ggml_type_name(bad[i]), "unknown"));
    }
    cr_assert(eq(int, shoal_ggml_type_from_name("Q4_2"), SHOAL_ENOTFOUND));
}

Test(ggml_types, nbytes_counts_blocks_and_refuses_bad_shapes)
{
    struct shoal_err err = {0};
    uint64_t n = 0;
    /* a [8 experts][512 rows][2048] Q4_K tensor: 2048 / 256 * 144 per row */
    const uint64_t ne[3] = {2048, 512, 8};
    cr_assert(eq(int, shoal_ggml_nbytes(SHOAL_GGML_TYPE_Q4_K, ne, 3, "t", &n, &err), 0));
    cr_assert(eq(u64, n, (uint64_t)8 * 144 * 512 * 8));

    const uint64_t odd[2] = {100, 3};
    cr_assert(eq(int, shoal_ggml_nbytes(SHOAL_GGML_TYPE_Q8_0, odd, 2, "tensor 'x'", &n, &err),
                 SHOAL_ESHAPE));
    cr_assert_not_null(strstr(err.msg, "tensor 'x'"), "%s", err.msg);
    cr_assert_not_null(strstr(err.msg, "100"), "%s", err.msg);

    shoal_err_clear(&err);
    const uint64_t huge[4] = {(uint64_t)1 << 40, (uint64_t)1 << 20, 1 << 10, 1};
    cr_assert(eq(int, shoal_ggml_nbytes(SHOAL_GGML_TYPE_F32, huge, 4, "h", &n, &err),
                 SHOAL_ERANGE));

    shoal_err_clear(&err);
    cr_assert(eq(int, shoal_ggml_nbytes(77, ne, 1, "tensor 'y'", &n, &err),
                 SHOAL_EUNSUPPORTED));
    cr_assert_not_null(strstr(err.msg, "77"), "%s", err.msg);
}

Test(ggml_types, dequant_row_refuses_missing_types_and_partial_blocks)
{
    struct shoal_err err = {0};
    uint8_t src[256] = {0};
    float dst[256];
    cr_assert(eq(int, shoal_ggml_dequant_row(SHOAL_GGML_TYPE_TQ1_0, src, dst, 256, &err),
                 SHOAL_EUNSUPPORTED));
    cr_assert_not_null(strstr(err.msg, "TQ1_0"), "%s", err.msg);
    shoal_err_clear(&err);
    cr_assert(eq(int, shoal_ggml_dequant_row(SHOAL_GGML_TYPE_Q8_0, src, dst, 33, &err),
                 SHOAL_ESHAPE));
}

/* Read tests/data/gguf/<file>; *n bytes, owned by the caller. */
static uint8_t *read_data(const char *file, size_t *n)
{
    char path[512];
    snprintf(path, sizeof path, "%s%s", DATA_DIR, file);
    char *buf = NULL;
    struct shoal_err err = {0};
    int rc = shoal_read_file(path, 1 << 22, &buf, n, &err);
    cr_assert(eq(int, rc, 0), "%s", err.msg);
    return (uint8_t *)buf;
}

/* Dequantize the vector file's blocks and compare bits with gguf-py's. */
static void check_against_gguf_py(uint32_t id)
{
    const struct shoal_ggml_type_info *t = shoal_ggml_type_info(id);
    cr_assert_not_null(t);
    char file[64];
    snprintf(file, sizeof file, "%s.bin", t->name);
    for (char *c = file; *c; c++)
        *c = (char)(*c >= 'A' && *c <= 'Z' ? *c - 'A' + 'a' : *c);
    size_t size;
    uint8_t *buf = read_data(file, &size);
    const size_t per_block = t->type_size + 4 * (size_t)t->block_size;
    cr_assert(eq(sz, size % per_block, 0), "%s: %zu bytes", file, size);
    const size_t n_blocks = size / per_block, n = n_blocks * t->block_size;
    cr_assert(n_blocks >= 4, "%s: %zu blocks", file, n_blocks);
    /* the generator is checked too: the expected floats are not all equal */
    const uint8_t *want = buf + n_blocks * t->type_size;
    size_t n_distinct = 0;
    for (size_t i = 1; i < n; i++)
        n_distinct += memcmp(want, want + 4 * i, 4) != 0;
    cr_assert(n_distinct >= n / 2, "%s: degenerate vectors (%zu of %zu differ from the first)",
              file, n_distinct, n);
    float *got = malloc(n * sizeof *got);
    cr_assert_not_null(got);
    struct shoal_err err = {0};
    cr_assert(eq(int, shoal_ggml_dequant_row(id, buf, got, n, &err), 0), "%s", err.msg);
    for (size_t i = 0; i < n; i++) {
        uint32_t g, w;
        float wf;
        memcpy(&g, got + i, 4);
        memcpy(&w, want + 4 * i, 4);
        memcpy(&wf, want + 4 * i, 4);
        cr_assert(eq(u32, g, w), "%s: element %zu (block %zu, index %zu): got %a, gguf-py %a",
                  t->name, i, i / t->block_size, i % t->block_size, (double)got[i],
                  (double)wf);
    }
    free(got);
    free(buf);
}

Test(ggml_types, f32_equals_gguf_py) { check_against_gguf_py(SHOAL_GGML_TYPE_F32); }
Test(ggml_types, f16_equals_gguf_py) { check_against_gguf_py(SHOAL_GGML_TYPE_F16); }
Test(ggml_types, bf16_equals_gguf_py) { check_against_gguf_py(SHOAL_GGML_TYPE_BF16); }
Test(ggml_types, q4_0_equals_gguf_py) { check_against_gguf_py(SHOAL_GGML_TYPE_Q4_0); }
Test(ggml_types, q4_1_equals_gguf_py) { check_against_gguf_py(SHOAL_GGML_TYPE_Q4_1); }
Test(ggml_types, q5_0_equals_gguf_py) { check_against_gguf_py(SHOAL_GGML_TYPE_Q5_0); }
Test(ggml_types, q5_1_equals_gguf_py) { check_against_gguf_py(SHOAL_GGML_TYPE_Q5_1); }
Test(ggml_types, q8_0_equals_gguf_py) { check_against_gguf_py(SHOAL_GGML_TYPE_Q8_0); }
Test(ggml_types, q2_k_equals_gguf_py) { check_against_gguf_py(SHOAL_GGML_TYPE_Q2_K); }
Test(ggml_types, q3_k_equals_gguf_py) { check_against_gguf_py(SHOAL_GGML_TYPE_Q3_K); }
Test(ggml_types, q4_k_equals_gguf_py) { check_against_gguf_py(SHOAL_GGML_TYPE_Q4_K); }
Test(ggml_types, q5_k_equals_gguf_py) { check_against_gguf_py(SHOAL_GGML_TYPE_Q5_K); }
Test(ggml_types, q6_k_equals_gguf_py) { check_against_gguf_py(SHOAL_GGML_TYPE_Q6_K); }
Test(ggml_types, iq4_nl_equals_gguf_py) { check_against_gguf_py(SHOAL_GGML_TYPE_IQ4_NL); }
Test(ggml_types, iq4_xs_equals_gguf_py) { check_against_gguf_py(SHOAL_GGML_TYPE_IQ4_XS); }
Test(ggml_types, mxfp4_equals_gguf_py) { check_against_gguf_py(SHOAL_GGML_TYPE_MXFP4); }
Test(ggml_types, iq2_xxs_equals_gguf_py) { check_against_gguf_py(SHOAL_GGML_TYPE_IQ2_XXS); }
Test(ggml_types, iq3_xxs_equals_gguf_py) { check_against_gguf_py(SHOAL_GGML_TYPE_IQ3_XXS); }
Test(ggml_types, iq1_s_equals_gguf_py) { check_against_gguf_py(SHOAL_GGML_TYPE_IQ1_S); }
Test(ggml_types, iq1_m_equals_gguf_py) { check_against_gguf_py(SHOAL_GGML_TYPE_IQ1_M); }
Test(ggml_types, iq2_xs_equals_gguf_py) { check_against_gguf_py(SHOAL_GGML_TYPE_IQ2_XS); }
Test(ggml_types, iq2_s_equals_gguf_py) { check_against_gguf_py(SHOAL_GGML_TYPE_IQ2_S); }
Test(ggml_types, iq3_s_equals_gguf_py) { check_against_gguf_py(SHOAL_GGML_TYPE_IQ3_S); }

/* Where index number i of a block goes, for each IQ type's layout (the
 * block zeroed but for d = 1.0; signs and scales 0) */
static void put_iq1_s(uint8_t *blk, int i, unsigned idx)
{
    blk[2 + i] = (uint8_t)idx;   /* the high 3 bits: qh u16 of the group at 34 */
    uint8_t *qh = blk + 34 + 2 * (i / 4);
    const unsigned v = (unsigned)(qh[0] | qh[1] << 8) | (idx >> 8) << (3 * (i % 4));
    qh[0] = (uint8_t)v;
    qh[1] = (uint8_t)(v >> 8);
}
static void put_iq2_xxs(uint8_t *blk, int i, unsigned idx) { blk[2 + 8 * (i / 4) + i % 4] = (uint8_t)idx; }
static void put_iq3_xxs(uint8_t *blk, int i, unsigned idx) { blk[2 + i] = (uint8_t)idx; }
static void put_iq2_xs(uint8_t *blk, int i, unsigned idx)   /* u16, 9 index bits */
{
    blk[2 + 2 * i] = (uint8_t)idx;
    blk[3 + 2 * i] = (uint8_t)(idx >> 8);
}
static void put_iq2_s(uint8_t *blk, int i, unsigned idx)    /* 2 high bits in qh at 66 */
{
    blk[2 + i] = (uint8_t)idx;
    blk[66 + i / 4] = (uint8_t)(blk[66 + i / 4] | (idx >> 8) << (2 * (i % 4)));
}
static void put_iq3_s(uint8_t *blk, int i, unsigned idx)    /* the 9th bit in qh at 66 */
{
    blk[2 + i] = (uint8_t)idx;
    blk[66 + i / 8] = (uint8_t)(blk[66 + i / 8] | (idx >> 8) << (i % 8));
}

/* Every entry of type's codebook (entries of width elements, tests/data/
 * gguf/<file>), read back through the dequantization of blocks that index
 * each entry once, as (y - sub) * mul, against gguf-py's codebook. */
static void check_codebook(uint32_t type, const char *file, int entries, int width, float sub,
                           float mul, void (*put)(uint8_t *, int, unsigned))
{
    size_t size;
    uint8_t *grid = read_data(file, &size);
    cr_assert(eq(sz, size, (size_t)(entries * width)), "%s", file);
    const int per_block = 256 / width;
    for (int b = 0; b < entries / per_block; b++) {
        uint8_t blk[256] = {0x00, 0x3C};
        float y[256];
        for (int i = 0; i < per_block; i++)
            put(blk, i, (unsigned)(per_block * b + i));
        cr_assert(eq(int, shoal_ggml_dequant_row(type, blk, y, 256, NULL), 0));
        for (int e = 0; e < 256; e++)
            cr_assert(eq(flt, (y[e] - sub) * mul, (float)(int8_t)grid[256 * b + e]),
                      "%s entry %d element %d", file, per_block * b + e / width, e % width);
    }
    free(grid);
}

/* Each IQ codebook (f16 scale 1.0, block scale 0, no signs): IQ1_S y =
 * value + 1/8; the IQ2 types 0.125 * value; IQ3_XXS 0.25 * value; IQ3_S
 * value. */
Test(ggml_types, codebooks_equal_gguf_py)
{
    check_codebook(SHOAL_GGML_TYPE_IQ1_S, "grid_iq1_s.i8", 2048, 8, 0.125f, 1.0f, put_iq1_s);
    check_codebook(SHOAL_GGML_TYPE_IQ2_XXS, "grid_iq2_xxs.i8", 256, 8, 0, 8.0f, put_iq2_xxs);
    check_codebook(SHOAL_GGML_TYPE_IQ3_XXS, "grid_iq3_xxs.i8", 256, 4, 0, 4.0f, put_iq3_xxs);
    check_codebook(SHOAL_GGML_TYPE_IQ2_XS, "grid_iq2_xs.i8", 512, 8, 0, 8.0f, put_iq2_xs);
    check_codebook(SHOAL_GGML_TYPE_IQ2_S, "grid_iq2_s.i8", 1024, 8, 0, 8.0f, put_iq2_s);
    check_codebook(SHOAL_GGML_TYPE_IQ3_S, "grid_iq3_s.i8", 512, 4, 0, 1.0f, put_iq3_s);
}
