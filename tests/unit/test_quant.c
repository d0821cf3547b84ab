/* Tests for common/kernels/quant.h: layout, quantization, the canonical dot order,
 * and bit-exactness of the active SIMD kernels against the scalar ones.
 *
 * Assert kinds (STYLE 35): "bit-exact" tests compare bytes with memcmp /
 * eq(u32, bits); "tolerance" tests name their bound. Seeds are fixed. */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

#include "quant.h"
#include "safetensors.h"
#include "tensor.h"

static const enum shoal_quant_type types[] = {SHOAL_QUANT_INT8, SHOAL_QUANT_INT4};
static const int groups[] = {32, 64, 128};

/* round trip: |x - d*q| <= d/2, plus one f32 rounding of x/d */
#define QUANT_RT_SLACK (1.0f + 4.0f * FLT_EPSILON)

/* ---- helpers ------------------------------------------------------------ */

/* xorshift32 in [-1, 1) */
static float frand(uint32_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return (float)((double)*s / 4294967296.0 * 2.0 - 1.0);
}

/* Random data whose magnitude changes from one block of 16 to the next
 * (so groups get very different scales), with some exact zeros. The
 * generator is checked: not constant, both signs present. */
static void fill(float *x, int64_t n, uint32_t seed)
{
    uint32_t s = seed * 2654435761u + 1u;
    float mag = 1.0f;
    int pos = 0, neg = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i % 16 == 0)
            mag = ldexpf(1.0f, (int)(frand(&s) * 12.0f));
        float v = frand(&s);
        x[i] = (i % 11 == 5) ? 0.0f : v * mag;
        pos += x[i] > 0;
        neg += x[i] < 0;
    }
    if (n >= 8) {
        cr_assert(x[0] != x[1] || x[1] != x[2], "generator is constant");
        cr_assert(pos > 0 && neg > 0, "generator lacks a sign: pos=%d neg=%d", pos, neg);
    }
}

static void *quantize(enum shoal_quant_type type, int group, const float *x,
                      int64_t n)
{
    size_t bytes = shoal_quant_row_bytes(type, n, group);
    cr_assert(bytes > 0);
    void *row = malloc(bytes);
    memset(row, 0xAB, bytes);   /* the quantizer must write every byte */
    struct shoal_err err = {0};
    int rc = shoal_quant_quantize_row(type, group, row, x, SHOAL_DTYPE_F32, n, &err);
    cr_assert(eq(int, rc, 0), "quantize: %s", err.msg);
    return row;
}

static float scale_of(const void *row, int64_t g)
{
    float d;
    memcpy(&d, (const uint8_t *)row + 4 * g, 4);
    return d;
}

static int q_at(enum shoal_quant_type type, const void *row, int64_t n,
                int group, int64_t i)
{
    const uint8_t *qs = shoal_quant_row_qs(row, n, group);
    if (type == SHOAL_QUANT_INT8)
        return (int8_t)qs[i];
    return (int)((qs[i / 2] >> (4 * (i & 1))) & 0x0f) - 8;
}

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void use_isa(enum shoal_quant_isa isa)
{
    struct shoal_err err = {0};
    cr_assert(eq(int, shoal_quant_init(isa, &err), 0), "%s", err.msg);
}

/* Every SIMD kernel table this build and CPU can run (not the scalar one),
 * so each is compared with the reference, not only the one AUTO picks.
 * Returns how many were written to isas[] (at most SIMD_ISA_MAX). */
#define SIMD_ISA_MAX 7
static int simd_isas(enum shoal_quant_isa isas[SIMD_ISA_MAX])
{
    const enum shoal_quant_isa all[SIMD_ISA_MAX] = {
        SHOAL_QUANT_ISA_AVX2, SHOAL_QUANT_ISA_AVX512, SHOAL_QUANT_ISA_AVX512_ZEN4,
        SHOAL_QUANT_ISA_AVX512BW, SHOAL_QUANT_ISA_NEON, SHOAL_QUANT_ISA_NEON_DOTPROD,
        SHOAL_QUANT_ISA_NEON_I8MM};
    int n = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (shoal_quant_init(all[i], NULL) == 0)
            isas[n++] = all[i];
    use_isa(SHOAL_QUANT_ISA_SCALAR);
    return n;
}

/* The avx2 INT4A8 decode matvec reads a block of 8 rows in one of two
 * orders (quant.h, shoal_quant_avx2_set_decode_order), chosen by vendor:
 * the a8 tests run each table with both, set after use_isa (whose init
 * chooses). Elsewhere there is one order. */
#if defined(SHOAL_QUANT_HAVE_AVX2)
#define N_ORDER 2
static void set_order(int seq) { shoal_quant_avx2_set_decode_order(seq); }
#else
#define N_ORDER 1
static void set_order(int seq) { (void)seq; }
#endif

/* ---- layout --------------------------------------------------------------- */

Test(quant, row_bytes_follow_the_documented_layout)
{
    /* 4 bytes per group scale + quants, padded to a multiple of 4 */
    cr_assert(eq(sz, shoal_quant_row_bytes(SHOAL_QUANT_INT8, 32, 32), (size_t)36));
    cr_assert(eq(sz, shoal_quant_row_bytes(SHOAL_QUANT_INT8, 33, 32), (size_t)44));   /* 8+33 -> 44 */
    cr_assert(eq(sz, shoal_quant_row_bytes(SHOAL_QUANT_INT8, 768, 128), (size_t)(24 + 768)));
    cr_assert(eq(sz, shoal_quant_row_bytes(SHOAL_QUANT_INT4, 3, 32), (size_t)8));     /* 4+2 -> 8 */
    cr_assert(eq(sz, shoal_quant_row_bytes(SHOAL_QUANT_INT4, 64, 32), (size_t)40));   /* 8+32 */
    cr_assert(eq(sz, shoal_quant_row_bytes(SHOAL_QUANT_INT4, 65, 64), (size_t)44));   /* 8+33 -> 44 */
    cr_assert(eq(sz, shoal_quant_row_bytes(SHOAL_QUANT_INT4, 2048, 32), (size_t)(256 + 1024)));
    cr_assert(eq(sz, shoal_quant_matrix_bytes(SHOAL_QUANT_INT4, 7, 65, 64), (size_t)(7 * 44)));
}

Test(quant, sizes_reject_invalid_arguments)
{
    cr_assert(eq(sz, shoal_quant_row_bytes(SHOAL_QUANT_INT8, 0, 32), (size_t)0));
    cr_assert(eq(sz, shoal_quant_row_bytes(SHOAL_QUANT_INT8, 64, 16), (size_t)0));
    cr_assert(eq(sz, shoal_quant_row_bytes((enum shoal_quant_type)9, 64, 32), (size_t)0));
    cr_assert(eq(sz, shoal_quant_matrix_bytes(SHOAL_QUANT_INT4, 0, 64, 32), (size_t)0));
    cr_assert(eq(sz, shoal_quant_matrix_bytes(SHOAL_QUANT_INT4, INT64_MAX, 64, 32), (size_t)0));
}

Test(quant, int4_bytes_are_scale_then_low_nibble_first)
{
    const float x[3] = {7.0f, -7.0f, 1.0f};   /* d = 1: q = 7, -7, 1 */
    uint8_t *row = quantize(SHOAL_QUANT_INT4, 32, x, 3);
    const uint8_t want[8] = {0x00, 0x00, 0x80, 0x3f,   /* f32 1.0, little-endian */
                             0x1f,                     /* q0 = 7 -> 15, q1 = -7 -> 1 */
                             0x09,                     /* q2 = 1 -> 9, padding nibble 0 */
                             0x00, 0x00};              /* row padding */
    /* (Criterion's eq(u8[8], ...) trips UBSan and LSan, so compare by hand) */
    for (int i = 0; i < 8; i++)
        cr_assert(eq(u8, row[i], want[i]), "byte %d", i);
    free(row);
}

Test(quant, weight_check_names_what_is_wrong)
{
    uint8_t buf[64] = {0};
    struct shoal_quant_weight w = {SHOAL_QUANT_INT8, 32, 1, 32, buf};
    struct shoal_err err = {0};
    cr_assert(eq(int, shoal_quant_weight_check(&w, 36, &err), 0));
    cr_assert(eq(int, shoal_quant_weight_check(&w, 35, &err), SHOAL_ESHAPE));
    cr_assert(strstr(err.msg, "needs 36 bytes, got 35") != NULL, "msg: %s", err.msg);
    shoal_err_clear(&err);
    w.group = 48;
    cr_assert(eq(int, shoal_quant_weight_check(&w, 64, &err), SHOAL_EINVAL));
    cr_assert(strstr(err.msg, "group size 48") != NULL, "msg: %s", err.msg);
    w.group = 32;
    float y = 0, xv[32] = {0};
    w.rows = 0;
    cr_assert(eq(int, shoal_quant_linear(&y, xv, 1, &w), SHOAL_EINVAL));
}

/* ---- quantization: exact small cases ------------------------------------ */

Test(quant, all_zero_group_has_zero_scale_and_quants)
{
    for (size_t it = 0; it < 2; it++) {
        float x[40] = {0};
        for (int i = 32; i < 40; i++)
            x[i] = (float)(i - 35);           /* second (partial) group non-zero */
        uint8_t *row = quantize(types[it], 32, x, 40);
        cr_assert(eq(u32, bits(scale_of(row, 0)), 0u));
        for (int i = 0; i < 32; i++)
            cr_assert(eq(int, q_at(types[it], row, 40, 32, i), 0), "i=%d", i);
        float y[40];
        shoal_quant_dequantize_row(types[it], 32, y, row, 40);
        for (int i = 0; i < 32; i++)
            cr_assert(eq(u32, bits(y[i]), 0u), "i=%d", i);
        float ones[40];
        for (int i = 0; i < 40; i++)
            ones[i] = 1.0f;
        int qsum = 0;
        for (int i = 32; i < 40; i++)
            qsum += q_at(types[it], row, 40, 32, i);
        const float want = scale_of(row, 1) * (float)qsum;   /* group 0 adds 0 */
        cr_assert(eq(u32, bits(shoal_quant_dot(types[it], 32, ones, row, 40)), bits(want)));
        free(row);
    }
}

Test(quant, one_big_value_sets_the_scale)
{
    float x[64] = {0};
    x[5] = 127.0f;
    x[6] = 0.4f;
    x[7] = 0.6f;
    uint8_t *row = quantize(SHOAL_QUANT_INT8, 64, x, 64);
    cr_assert(eq(flt, scale_of(row, 0), 1.0f));
    cr_assert(eq(int, q_at(SHOAL_QUANT_INT8, row, 64, 64, 5), 127));
    cr_assert(eq(int, q_at(SHOAL_QUANT_INT8, row, 64, 64, 6), 0));
    cr_assert(eq(int, q_at(SHOAL_QUANT_INT8, row, 64, 64, 7), 1));
    free(row);

    x[5] = -7.0f;
    row = quantize(SHOAL_QUANT_INT4, 64, x, 64);
    cr_assert(eq(flt, scale_of(row, 0), 1.0f));
    cr_assert(eq(int, q_at(SHOAL_QUANT_INT4, row, 64, 64, 5), -7));
    cr_assert(eq(int, q_at(SHOAL_QUANT_INT4, row, 64, 64, 7), 1));
    free(row);
}

Test(quant, negative_extremes_map_to_minus_qmax)
{
    float x[32];
    for (int i = 0; i < 32; i++)
        x[i] = i % 2 ? -3.0f : 1.5f;
    uint8_t *r8 = quantize(SHOAL_QUANT_INT8, 32, x, 32);
    uint8_t *r4 = quantize(SHOAL_QUANT_INT4, 32, x, 32);
    cr_assert(eq(flt, scale_of(r8, 0), 3.0f / 127.0f));
    cr_assert(eq(flt, scale_of(r4, 0), 3.0f / 7.0f));
    for (int i = 0; i < 32; i++) {
        cr_assert(eq(int, q_at(SHOAL_QUANT_INT8, r8, 32, 32, i), i % 2 ? -127 : 64), "i=%d", i);
        cr_assert(eq(int, q_at(SHOAL_QUANT_INT4, r4, 32, 32, i), i % 2 ? -7 : 4), "i=%d", i);
    }
    free(r8);
    free(r4);
}

Test(quant, readers_accept_minus_128_and_nibble_zero)
{
    /* not produced by the quantizer, but valid bytes of the format */
    uint8_t r8[36] = {0}, r4[20] = {0};
    const float one = 1.0f;
    memcpy(r8, &one, 4);
    memcpy(r4, &one, 4);
    r8[4] = 0x80;          /* int8 -128 */
    r4[4] = 0x80;          /* elements 0 (nibble 0 -> -8) and 1 (8 -> 0) */
    float y8[32], y4[32];
    shoal_quant_dequantize_row(SHOAL_QUANT_INT8, 32, y8, r8, 32);
    shoal_quant_dequantize_row(SHOAL_QUANT_INT4, 32, y4, r4, 32);
    cr_assert(eq(flt, y8[0], -128.0f));
    cr_assert(eq(flt, y4[0], -8.0f));
    cr_assert(eq(flt, y4[1], 0.0f));
}

Test(quant, partial_last_group_has_its_own_scale)
{
    /* n = 40, G = 32: groups of 32 and 8 */
    float x[40];
    for (int i = 0; i < 40; i++)
        x[i] = i < 32 ? 127.0f * (float)(i % 3) : 0.25f * (float)(i - 31);
    for (size_t it = 0; it < 2; it++) {
        uint8_t *row = quantize(types[it], 32, x, 40);
        const float qmax = types[it] == SHOAL_QUANT_INT8 ? 127.0f : 7.0f;
        cr_assert(eq(flt, scale_of(row, 0), 254.0f / qmax));
        cr_assert(eq(flt, scale_of(row, 1), 2.0f / qmax));
        cr_assert(eq(int, q_at(types[it], row, 40, 32, 39), (int)qmax));
        free(row);
    }
}

Test(quant, short_row_below_eight_elements)
{
    const float x[5] = {0.5f, -1.0f, 0.25f, 0.0f, 1.0f};   /* n = 5 < 8 */
    for (size_t it = 0; it < 2; it++) {
        uint8_t *row = quantize(types[it], 128, x, 5);
        const float qmax = types[it] == SHOAL_QUANT_INT8 ? 127.0f : 7.0f;
        cr_assert(eq(flt, scale_of(row, 0), 1.0f / qmax));
        cr_assert(eq(int, q_at(types[it], row, 5, 128, 1), -(int)qmax));
        cr_assert(eq(int, q_at(types[it], row, 5, 128, 4), (int)qmax));
        float y[5];
        shoal_quant_dequantize_row(types[it], 128, y, row, 5);
        float w[5] = {1, 2, 3, 4, 5};
        double ref = 0;
        for (int i = 0; i < 5; i++)
            ref += (double)w[i] * y[i];
        float got = shoal_quant_dot(types[it], 128, w, row, 5);
        cr_assert(fabs(got - ref) <= 1e-5 * fabs(ref), "got %.9g want %.9g", got, ref);
        free(row);
    }
}

Test(quant, ties_round_to_even)
{
    /* amax = 127 (int8) / 7 (int4) gives d = 1, so x/d are exact halves */
    float x8[8] = {127.0f, 0.5f, 1.5f, 2.5f, -2.5f, -0.5f, 126.5f, -3.5f};
    int want8[8] = {127, 0, 2, 2, -2, 0, 126, -4};
    float x4[8] = {7.0f, 0.5f, 1.5f, 2.5f, 3.5f, -3.5f, 6.5f, -4.5f};
    int want4[8] = {7, 0, 2, 2, 4, -4, 6, -4};
    uint8_t *r8 = quantize(SHOAL_QUANT_INT8, 32, x8, 8);
    uint8_t *r4 = quantize(SHOAL_QUANT_INT4, 32, x4, 8);
    cr_assert(eq(flt, scale_of(r8, 0), 1.0f));
    cr_assert(eq(flt, scale_of(r4, 0), 1.0f));
    for (int i = 0; i < 8; i++) {
        cr_assert(eq(int, q_at(SHOAL_QUANT_INT8, r8, 8, 32, i), want8[i]), "int8 x=%g", x8[i]);
        cr_assert(eq(int, q_at(SHOAL_QUANT_INT4, r4, 8, 32, i), want4[i]), "int4 x=%g", x4[i]);
    }
    free(r8);
    free(r4);
}

/* tolerance: d/2 per element (QUANT_RT_SLACK) */
Test(quant, round_trip_error_is_at_most_half_a_step)
{
    const int64_t sizes[] = {1, 7, 31, 32, 33, 100, 129, 1031};
    for (size_t it = 0; it < 2; it++)
        for (size_t ig = 0; ig < 3; ig++)
            for (size_t is = 0; is < sizeof sizes / sizeof sizes[0]; is++) {
                const int64_t n = sizes[is];
                const int G = groups[ig];
                float *x = malloc((size_t)n * 4), *y = malloc((size_t)n * 4);
                fill(x, n, (uint32_t)(n * 7 + G + it));
                uint8_t *row = quantize(types[it], G, x, n);
                shoal_quant_dequantize_row(types[it], G, y, row, n);
                for (int64_t i = 0; i < n; i++) {
                    const float d = scale_of(row, i / G);
                    cr_assert(fabsf(x[i] - y[i]) <= 0.5f * d * QUANT_RT_SLACK,
                              "%s G=%d n=%lld i=%lld x=%.9g deq=%.9g d=%.9g",
                              shoal_quant_type_name(types[it]), G, (long long)n,
                              (long long)i, x[i], y[i], d);
                }
                free(row);
                free(x);
                free(y);
            }
}

Test(quant, bf16_and_f16_sources_match_their_f32_values)
{
    const int64_t n = 77;
    uint16_t hb[77], hh[77];
    float xb[77], xh[77];
    uint32_t s = 12345;
    for (int64_t i = 0; i < n; i++) {
        float v = frand(&s) * 3.0f;
        hb[i] = shoal_f32_to_bf16(v);
        hh[i] = (uint16_t)(0x3c00u + (uint16_t)(s % 1024u)) ^ (uint16_t)(i % 2 ? 0x8000u : 0u);
    }
    shoal_to_f32(xb, hb, SHOAL_DTYPE_BF16, (size_t)n);
    shoal_to_f32(xh, hh, SHOAL_DTYPE_F16, (size_t)n);
    cr_assert(xh[0] != xh[2] && xb[0] != xb[1], "generator is constant");
    for (size_t it = 0; it < 2; it++) {
        const size_t bytes = shoal_quant_row_bytes(types[it], n, 32);
        uint8_t *a = malloc(bytes), *b = malloc(bytes);
        struct shoal_err err = {0};
        cr_assert(eq(int, shoal_quant_quantize_row(types[it], 32, a, hb, SHOAL_DTYPE_BF16, n, &err), 0));
        cr_assert(eq(int, shoal_quant_quantize_row(types[it], 32, b, xb, SHOAL_DTYPE_F32, n, &err), 0));
        cr_assert(eq(int, memcmp(a, b, bytes), 0), "bf16");
        cr_assert(eq(int, shoal_quant_quantize_row(types[it], 32, a, hh, SHOAL_DTYPE_F16, n, &err), 0));
        cr_assert(eq(int, shoal_quant_quantize_row(types[it], 32, b, xh, SHOAL_DTYPE_F32, n, &err), 0));
        cr_assert(eq(int, memcmp(a, b, bytes), 0), "f16");
        free(a);
        free(b);
    }
}

Test(quant, non_finite_input_is_an_error_with_its_position)
{
    float x[70] = {0};
    x[3] = 1.0f;
    x[65] = NAN;
    uint8_t row[128];
    struct shoal_err err = {0};
    cr_assert(eq(int, shoal_quant_quantize_row(SHOAL_QUANT_INT8, 32, row, x, SHOAL_DTYPE_F32, 70, &err),
                 SHOAL_ERANGE));
    cr_assert(strstr(err.msg, "element 65 of 70") != NULL, "msg: %s", err.msg);

    float m[3][70] = {{0}};
    m[2][9] = -INFINITY;
    m[1][40] = INFINITY;
    uint8_t out[3 * 128];
    shoal_err_clear(&err);
    omp_set_num_threads(3);
    cr_assert(eq(int, shoal_quant_quantize_matrix(SHOAL_QUANT_INT4, 64, out, sizeof out, m,
                                                  SHOAL_DTYPE_F32, 3, 70, &err), SHOAL_ERANGE));
    cr_assert(strstr(err.msg, "(row 1, col 40)") != NULL, "msg: %s", err.msg);
    shoal_err_clear(&err);
    cr_assert(eq(int, shoal_quant_quantize_matrix(SHOAL_QUANT_INT4, 64, out, 10, m,
                                                  SHOAL_DTYPE_F32, 3, 70, &err), SHOAL_ESHAPE));
    cr_assert(eq(int, shoal_quant_quantize_row(SHOAL_QUANT_INT4, 16, out, m, SHOAL_DTYPE_F32, 70, NULL),
                 SHOAL_EINVAL));
}

/* bit-exact: the matrix bytes equal the row bytes for any thread count */
Test(quant, matrix_is_its_rows_for_any_thread_count)
{
    const int64_t rows = 13, cols = 201;
    float *x = malloc((size_t)(rows * cols) * 4);
    fill(x, rows * cols, 99);
    for (size_t it = 0; it < 2; it++) {
        const size_t rb = shoal_quant_row_bytes(types[it], cols, 64);
        const size_t mb = shoal_quant_matrix_bytes(types[it], rows, cols, 64);
        uint8_t *m1 = malloc(mb), *m3 = malloc(mb);
        omp_set_num_threads(1);
        cr_assert(eq(int, shoal_quant_quantize_matrix(types[it], 64, m1, mb, x, SHOAL_DTYPE_F32,
                                                      rows, cols, NULL), 0));
        omp_set_num_threads(3);
        cr_assert(eq(int, shoal_quant_quantize_matrix(types[it], 64, m3, mb, x, SHOAL_DTYPE_F32,
                                                      rows, cols, NULL), 0));
        cr_assert(eq(int, memcmp(m1, m3, mb), 0));
        for (int64_t r = 0; r < rows; r++) {
            uint8_t *row = quantize(types[it], 64, x + r * cols, cols);
            cr_assert(eq(int, memcmp(row, m1 + (size_t)r * rb, rb), 0), "row %lld", (long long)r);
            free(row);
        }
        free(m1);
        free(m3);
    }
    free(x);
}

/* ---- the dot product -------------------------------------------------------- */

/* tolerance: worst-case f32 accumulation bound (n + 8) eps sum|terms| */
Test(quant, dot_matches_double_reference)
{
    use_isa(SHOAL_QUANT_ISA_AUTO);
    const int64_t sizes[] = {1, 5, 8, 9, 63, 64, 65, 768, 1031, 2048};
    for (size_t it = 0; it < 2; it++)
        for (size_t ig = 0; ig < 3; ig++)
            for (size_t is = 0; is < sizeof sizes / sizeof sizes[0]; is++) {
                const int64_t n = sizes[is];
                const int G = groups[ig];
                float *w = malloc((size_t)n * 4), *x = malloc((size_t)n * 4), *y = malloc((size_t)n * 4);
                fill(w, n, (uint32_t)(3 * n + G));
                fill(x, n, (uint32_t)(5 * n + G + 1));
                uint8_t *row = quantize(types[it], G, w, n);
                shoal_quant_dequantize_row(types[it], G, y, row, n);
                double ref = 0, mag = 0;
                for (int64_t i = 0; i < n; i++) {
                    ref += (double)x[i] * (double)y[i];
                    mag += fabs((double)x[i] * (double)y[i]);
                }
                const float got = shoal_quant_dot(types[it], G, x, row, n);
                cr_assert(fabs(got - ref) <= (double)(n + 8) * FLT_EPSILON * mag,
                          "%s G=%d n=%lld got %.9g want %.9g", shoal_quant_type_name(types[it]),
                          G, (long long)n, got, ref);
                free(row);
                free(w);
                free(x);
                free(y);
            }
}

/* The documented order written out with plain f32 operations; tree selects
 * the lane combination: 0 canonical, 1 ((s0+s4)+(s1+s5))+((s2+s6)+(s3+s7)),
 * 2 a plain left-to-right sum of the elements. */
static float dot_written_out(enum shoal_quant_type type, const float *x,
                             const void *row, int64_t n, int group, int tree)
{
    float acc = 0.0f;
    for (int64_t i0 = 0; i0 < n; i0 += group) {
        const int64_t len = n - i0 < group ? n - i0 : group;
        float s[8] = {0, 0, 0, 0, 0, 0, 0, 0}, seq = 0.0f;
        for (int64_t k = 0; k < len; k++) {
            const float p = x[i0 + k] * (float)q_at(type, row, n, group, i0 + k);
            s[k % 8] = s[k % 8] + p;
            seq = seq + p;
        }
        float gsum;
        if (tree == 0)
            gsum = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
        else if (tree == 1)
            gsum = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
        else
            gsum = seq;
        acc = acc + scale_of(row, i0 / group) * gsum;
    }
    return acc;
}

/* bit-exact: scalar and active kernels follow the documented order, on data
 * where the other orders give other bits (checked) */
Test(quant, dot_follows_the_canonical_order)
{
    const int64_t n = 75;   /* G = 32: groups of 32, 32, 11 (tail of 3) */
    float w[75], x[75];
    uint32_t seed = 7;
    for (int64_t i = 0; i < n; i++)
        w[i] = frand(&seed);   /* one magnitude: quants spread over the range */
    fill(x, n, 8);
    w[0] = w[2] = w[8] = w[10] = 1.0f;   /* q = qmax in lanes 0 and 2 */
    x[0] = x[8] = 1e8f;     /* lanes 0 and 2 cancel before meeting the others */
    x[2] = x[10] = -1e8f;   /* only in the canonical tree */
    x[33] = 3e7f;
    x[72] = -2e7f;          /* in the tail of the partial group */
    for (size_t it = 0; it < 2; it++) {
        uint8_t *row = quantize(types[it], 32, w, n);
        const float want = dot_written_out(types[it], x, row, n, 32, 0);
        for (int tree = 1; tree <= 2; tree++)
            cr_assert(bits(dot_written_out(types[it], x, row, n, 32, tree)) != bits(want),
                      "test data cannot tell order %d from the canonical one", tree);
        use_isa(SHOAL_QUANT_ISA_SCALAR);
        const float scalar = shoal_quant_dot(types[it], 32, x, row, n);
        use_isa(SHOAL_QUANT_ISA_AUTO);
        const float simd = shoal_quant_dot(types[it], 32, x, row, n);
        cr_assert(eq(u32, bits(scalar), bits(want)), "scalar %.9g want %.9g", scalar, want);
        cr_assert(eq(u32, bits(simd), bits(want)), "%s %.9g want %.9g", shoal_quant_ops_name(), simd, want);
        free(row);
    }
}

/* ---- kernel selection and bit-exactness across ISAs ----------------------- */

Test(quant, auto_selects_the_simd_kernels_of_this_cpu)
{
    cr_assert(eq(str, (char *)shoal_quant_ops_name(), "scalar"), "default before init");
    use_isa(SHOAL_QUANT_ISA_AUTO);
    const char *name = shoal_quant_ops_name();
#if defined(__aarch64__) && defined(__linux__)
    /* DotProd and I8MM as the kernel reports them (qemu-user: its -cpu) */
    const int dotprod = (getauxval(AT_HWCAP) & (1UL << 20)) != 0;        /* HWCAP_ASIMDDP */
    const int i8mm = dotprod && (getauxval(AT_HWCAP2) & (1UL << 13)) != 0; /* HWCAP2_I8MM */
#if !defined(SHOAL_QUANT_HAVE_NEON_DOTPROD)
    const int have_dotprod = 0;
#else
    const int have_dotprod = dotprod;
#endif
#if !defined(SHOAL_QUANT_HAVE_NEON_I8MM)
    const int have_i8mm = 0;
#else
    const int have_i8mm = i8mm;
#endif
    cr_log_info("CPU: dotprod %d, i8mm %d", dotprod, i8mm);
    cr_assert(eq(str, (char *)name,
                 (char *)(have_i8mm ? "neon-i8mm" : have_dotprod ? "neon-dotprod" : "neon")));
    cr_assert(eq(int, shoal_quant_init(SHOAL_QUANT_ISA_NEON_DOTPROD, NULL),
                 have_dotprod ? 0 : SHOAL_EUNSUPPORTED));
    cr_assert(eq(int, shoal_quant_init(SHOAL_QUANT_ISA_NEON_I8MM, NULL),
                 have_i8mm ? 0 : SHOAL_EUNSUPPORTED));
    use_isa(SHOAL_QUANT_ISA_AUTO);
    cr_assert(eq(int, shoal_quant_init(SHOAL_QUANT_ISA_AVX2, NULL), SHOAL_EUNSUPPORTED));
#elif defined(__aarch64__)
    cr_assert(strncmp(name, "neon", 4) == 0, "%s", name);
    cr_assert(eq(int, shoal_quant_init(SHOAL_QUANT_ISA_AVX2, NULL), SHOAL_EUNSUPPORTED));
#elif defined(__x86_64__)
    __builtin_cpu_init();
    const int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi") &&
                       __builtin_cpu_supports("avx512vnni");
#if defined(SHOAL_QUANT_HAVE_AVX512)
    /* AMD family 19h (Zen 4): the avx512 table with the avx2 decode */
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    __get_cpuid(0, &eax, &ebx, &ecx, &edx);
    const int amd = ebx == 0x68747541u && edx == 0x69746e65u && ecx == 0x444d4163u;
    __get_cpuid(1, &eax, &ebx, &ecx, &edx);
    const int zen4 = amd && ((eax >> 8) & 0xf) + ((eax >> 20) & 0xff) == 0x19;
    if (avx512 && __builtin_cpu_supports("avx2"))
        cr_assert(eq(str, (char *)name, zen4 ? "avx512-zen4" : "avx512"));
    else
#else
    (void)avx512;
#endif
    if (__builtin_cpu_supports("avx2"))
        cr_assert(eq(str, (char *)name, "avx2"));
    else
        cr_assert(eq(str, (char *)name, "scalar"));
    struct shoal_err err = {0};
    cr_assert(eq(int, shoal_quant_init(SHOAL_QUANT_ISA_NEON, &err), SHOAL_EUNSUPPORTED));
    cr_assert(strstr(err.msg, "'neon'") != NULL, "msg: %s", err.msg);
    cr_assert(eq(int, shoal_quant_init(SHOAL_QUANT_ISA_NEON_DOTPROD, NULL), SHOAL_EUNSUPPORTED));
    cr_assert(eq(int, shoal_quant_init(SHOAL_QUANT_ISA_NEON_I8MM, NULL), SHOAL_EUNSUPPORTED));
#endif
    cr_assert(eq(str, (char *)shoal_quant_ops_name(), (char *)name), "a refused init changes nothing");
    use_isa(SHOAL_QUANT_ISA_SCALAR);
    cr_assert(eq(str, (char *)shoal_quant_ops_name(), "scalar"));
    cr_log_info("active quant kernels: %s", name);
}

/* every ISA name parses back to its value (what --isa accepts) */
Test(quant, isa_names_parse_back)
{
    const enum shoal_quant_isa all[] = {
        SHOAL_QUANT_ISA_AUTO, SHOAL_QUANT_ISA_SCALAR, SHOAL_QUANT_ISA_AVX2,
        SHOAL_QUANT_ISA_NEON, SHOAL_QUANT_ISA_AVX512, SHOAL_QUANT_ISA_AVX512BW,
        SHOAL_QUANT_ISA_NEON_DOTPROD, SHOAL_QUANT_ISA_NEON_I8MM, SHOAL_QUANT_ISA_AVX512_ZEN4};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) {
        const char *name = shoal_quant_isa_name(all[k]);
        enum shoal_quant_isa got = SHOAL_QUANT_ISA_AUTO;
        cr_assert(eq(int, shoal_quant_isa_parse(name, &got), 0), "%s", name);
        cr_assert(eq(int, (int)got, (int)all[k]), "%s", name);
        cr_assert(strstr(shoal_quant_isa_list(), name) != NULL, "%s not in the list", name);
    }
    cr_assert(eq(str, (char *)shoal_quant_isa_name(SHOAL_QUANT_ISA_NEON_I8MM), "neon-i8mm"));
    enum shoal_quant_isa keep = SHOAL_QUANT_ISA_NEON;
    cr_assert(eq(int, shoal_quant_isa_parse("neon-sve", &keep), SHOAL_EINVAL));
    cr_assert(eq(int, (int)keep, (int)SHOAL_QUANT_ISA_NEON), "unchanged on error");
    cr_assert(eq(str, (char *)shoal_quant_isa_name((enum shoal_quant_isa)99), "?"));
}

/* bit-exact: active SIMD dot == scalar dot over a shape grid */
Test(quant, simd_dot_bits_equal_scalar)
{
    const int64_t sizes[] = {1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 40, 63, 64, 65,
                             100, 127, 128, 129, 200, 255, 256, 257, 383, 513, 1000, 1031};
    enum shoal_quant_isa isas[SIMD_ISA_MAX];
    const int n_isa = simd_isas(isas);
    cr_log_info("SIMD kernel tables on this CPU: %d", n_isa);
    int checked = 0;
    for (size_t it = 0; it < 2; it++)
        for (size_t ig = 0; ig < 3; ig++)
            for (size_t is = 0; is < sizeof sizes / sizeof sizes[0]; is++)
                for (uint32_t seed = 1; seed <= 3; seed++) {
                    const int64_t n = sizes[is];
                    const int G = groups[ig];
                    float *w = malloc((size_t)n * 4), *x = malloc((size_t)n * 4);
                    fill(w, n, seed * 1000u + (uint32_t)n);
                    fill(x, n, seed * 2000u + (uint32_t)n + (uint32_t)G);
                    uint8_t *row = quantize(types[it], G, w, n);
                    use_isa(SHOAL_QUANT_ISA_SCALAR);
                    const float want = shoal_quant_dot(types[it], G, x, row, n);
                    for (int ii = 0; ii < n_isa; ii++) {
                        use_isa(isas[ii]);
                        const float got = shoal_quant_dot(types[it], G, x, row, n);
                        cr_assert(eq(u32, bits(got), bits(want)),
                                  "%s %s G=%d n=%lld seed=%u: %.9g vs scalar %.9g",
                                  shoal_quant_ops_name(), shoal_quant_type_name(types[it]), G,
                                  (long long)n, seed, got, want);
                    }
                    checked++;
                    free(row);
                    free(w);
                    free(x);
                }
    cr_assert(eq(int, checked, 2 * 3 * 27 * 3));
}

/* bit-exact: linear (n_tok 1, 2, 3 and 5; 1 and 3 threads; the scalar ops
 * and every SIMD table of this CPU) equals the scalar single-threaded dot of
 * every (token, row). The shapes cover blocks of 8 rows with remainders
 * (the AVX-512 matvec), one or two 64-element windows per group, and
 * partial last groups. */
Test(quant, simd_linear_bits_equal_scalar_for_any_batch_and_thread_count)
{
    const int64_t shapes[][2] = {{1, 1}, {3, 7}, {4, 32}, {5, 33}, {9, 64}, {17, 100},
                                 {13, 129}, {37, 257}, {8, 768}, {6, 1031}, {16, 64},
                                 {48, 160}, {27, 384}, {64, 200}, {24, 2048}};
    const int64_t toks[] = {1, 2, 3, 5};
    const int threads[] = {1, 3};
    enum shoal_quant_isa isas[1 + SIMD_ISA_MAX] = {SHOAL_QUANT_ISA_SCALAR};
    const int n_isa = 1 + simd_isas(isas + 1);
    for (size_t it = 0; it < 2; it++)
        for (size_t ig = 0; ig < 3; ig++)
            for (size_t ish = 0; ish < sizeof shapes / sizeof shapes[0]; ish++) {
                const int64_t rows = shapes[ish][0], cols = shapes[ish][1];
                const int G = groups[ig];
                const int64_t n_tok_max = toks[sizeof toks / sizeof toks[0] - 1];
                float *wf = malloc((size_t)(rows * cols) * 4);
                float *x = malloc((size_t)(n_tok_max * cols) * 4);
                fill(wf, rows * cols, (uint32_t)(rows * 31 + cols + G));
                fill(x, n_tok_max * cols, (uint32_t)(cols * 17 + G + it));
                const size_t mb = shoal_quant_matrix_bytes(types[it], rows, cols, G);
                const size_t rb = mb / (size_t)rows;
                uint8_t *wq = malloc(mb);
                cr_assert(eq(int, shoal_quant_quantize_matrix(types[it], G, wq, mb, wf,
                                                              SHOAL_DTYPE_F32, rows, cols, NULL), 0));
                struct shoal_quant_weight w = {types[it], G, rows, cols, wq};
                float *want = malloc((size_t)(n_tok_max * rows) * 4);
                float *got = malloc((size_t)(n_tok_max * rows) * 4);
                use_isa(SHOAL_QUANT_ISA_SCALAR);
                for (int64_t t = 0; t < n_tok_max; t++)
                    for (int64_t r = 0; r < rows; r++)
                        want[t * rows + r] = shoal_quant_dot(types[it], G, x + t * cols,
                                                             wq + (size_t)r * rb, cols);
                for (int ii = 0; ii < n_isa; ii++)
                    for (size_t in = 0; in < sizeof toks / sizeof toks[0]; in++)
                        for (size_t ith = 0; ith < 2; ith++) {
                            const int64_t n_tok = toks[in];
                            use_isa(isas[ii]);
                            omp_set_num_threads(threads[ith]);
                            memset(got, 0xff, (size_t)(n_tok * rows) * 4);
                            cr_assert(eq(int, shoal_quant_linear(got, x, n_tok, &w), 0));
                            for (int64_t e = 0; e < n_tok * rows; e++)
                                cr_assert(eq(u32, bits(got[e]), bits(want[e])),
                                          "%s %s G=%d [%lld][%lld] n_tok=%lld threads=%d "
                                          "t=%lld r=%lld: %.9g vs scalar dot %.9g",
                                          shoal_quant_ops_name(), shoal_quant_type_name(types[it]),
                                          G, (long long)rows, (long long)cols, (long long)n_tok,
                                          threads[ith], (long long)(e / rows), (long long)(e % rows),
                                          got[e], want[e]);
                        }
                free(wf);
                free(x);
                free(wq);
                free(want);
                free(got);
            }
}

/* bit-exact: a caller-owned parallel region splitting with linear_part */
Test(quant, linear_part_inside_a_caller_region_gives_the_same_bits)
{
    use_isa(SHOAL_QUANT_ISA_AUTO);
    const int64_t rows = 23, cols = 96, n_tok = 6;
    float *wf = malloc((size_t)(rows * cols) * 4), *x = malloc((size_t)(n_tok * cols) * 4);
    fill(wf, rows * cols, 5);
    fill(x, n_tok * cols, 6);
    const size_t mb = shoal_quant_matrix_bytes(SHOAL_QUANT_INT4, rows, cols, 32);
    uint8_t *wq = malloc(mb);
    cr_assert(eq(int, shoal_quant_quantize_matrix(SHOAL_QUANT_INT4, 32, wq, mb, wf, SHOAL_DTYPE_F32,
                                                  rows, cols, NULL), 0));
    struct shoal_quant_weight w = {SHOAL_QUANT_INT4, 32, rows, cols, wq};
    float y1[6 * 23], y2[6 * 23];
    omp_set_num_threads(1);
    cr_assert(eq(int, shoal_quant_linear(y1, x, n_tok, &w), 0));
    omp_set_num_threads(4);
#pragma omp parallel
    shoal_quant_linear_part(y2, x, n_tok, &w, omp_get_thread_num(), omp_get_num_threads());
    cr_assert(eq(int, memcmp(y1, y2, sizeof y1), 0));
    free(wf);
    free(x);
    free(wq);
}

/* ---- INT4A8: int4 weights against int8 activations ------------------------ */

/* The test's own reading of quant.h "Int8 activations": quantize x per
 * group, sum (u - 8) * qx in int64, combine in f32 in group order. */
static float a8_reference(int G, const float *x, const uint8_t *row, int64_t n)
{
    const int64_t ng = (n + G - 1) / G;
    const uint8_t *qs = row + 4 * ng;
    float acc = 0.0f;
    for (int64_t g = 0; g < ng; g++) {
        const int64_t i0 = g * G, len = n - i0 < G ? n - i0 : G;
        float amax = 0.0f;
        for (int64_t k = 0; k < len; k++)
            amax = fabsf(x[i0 + k]) > amax ? fabsf(x[i0 + k]) : amax;
        const float dx = amax / 127.0f;
        int64_t isum = 0;
        for (int64_t k = 0; k < len; k++) {
            const int64_t i = i0 + k;
            float v = dx == 0.0f ? 0.0f : rintf(x[i] / dx);
            v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
            const int u = (qs[i / 2] >> (4 * (i % 2))) & 15;
            isum += (int64_t)(u - 8) * (int64_t)v;
        }
        float dw;
        memcpy(&dw, row + 4 * g, 4);
        acc = acc + (dw * dx) * (float)isum;
    }
    return acc;
}

/* bit-exact against the test's reference; and within the activation
 * rounding bound of the f32 dot of the dequantized row with x:
 * |x - dx*qx| <= dx/2 per element, so |a8 - exact| <= sum_g d_w 8 len dx/2
 * (|q| <= 8), plus f32 rounding (1e-5 of the magnitude sum). */
Test(quant, a8_dot_matches_reference_and_rounding_bound)
{
    const int64_t sizes[] = {1, 7, 8, 31, 32, 33, 64, 100, 128, 129, 200, 256, 1000, 2048};
    int checked = 0, nonzero = 0;
    for (size_t ig = 0; ig < 3; ig++)
        for (size_t is = 0; is < sizeof sizes / sizeof sizes[0]; is++)
            for (uint32_t seed = 1; seed <= 3; seed++) {
                const int64_t n = sizes[is];
                const int G = groups[ig];
                float *w = malloc((size_t)n * 4), *x = malloc((size_t)n * 4),
                      *wd = malloc((size_t)n * 4);
                fill(w, n, seed * 3000u + (uint32_t)n);
                fill(x, n, seed * 4000u + (uint32_t)n + (uint32_t)G);
                uint8_t *row = quantize(SHOAL_QUANT_INT4, G, w, n);
                const float got = shoal_quant_dot_a8(G, x, row, n);
                const float want = a8_reference(G, x, row, n);
                cr_assert(eq(u32, bits(got), bits(want)), "G=%d n=%lld seed=%u: %.9g vs %.9g", G,
                          (long long)n, seed, got, want);
                shoal_quant_dequantize_row(SHOAL_QUANT_INT4, G, wd, row, n);
                double exact = 0, mag = 0, bound = 0;
                for (int64_t i = 0; i < n; i++) {
                    exact += (double)wd[i] * x[i];
                    mag += fabs((double)wd[i] * x[i]);
                }
                for (int64_t g = 0; g * G < n; g++) {
                    const int64_t len = n - g * G < G ? n - g * G : G;
                    float amax = 0.0f, dw;
                    for (int64_t k = 0; k < len; k++)
                        amax = fmaxf(amax, fabsf(x[g * G + k]));
                    memcpy(&dw, row + 4 * g, 4);
                    bound += (double)dw * 8.0 * (double)len * (amax / 127.0) / 2.0;
                }
                cr_assert(fabs((double)got - exact) <= bound + 1e-5 * mag,
                          "G=%d n=%lld: a8 %.9g, exact %.9g, bound %.3g", G, (long long)n, got,
                          exact, bound);
                nonzero += got != 0.0f;
                checked++;
                free(row);
                free(w);
                free(x);
                free(wd);
            }
    cr_assert(eq(int, checked, 3 * 14 * 3));
    cr_assert(nonzero > checked * 9 / 10, "degenerate data: %d of %d results are 0", checked - nonzero,
              checked);
}

/* a NaN or infinity in x makes the dot NaN (not a finite guess); zeros give 0 */
Test(quant, a8_nonfinite_input_gives_nan)
{
    float w[256], x[256];
    fill(w, 256, 7);
    fill(x, 256, 8);
    uint8_t *row = quantize(SHOAL_QUANT_INT4, 64, w, 256);
    x[130] = NAN;
    cr_assert(isnan(shoal_quant_dot_a8(64, x, row, 256)));
    x[130] = INFINITY;
    cr_assert(isnan(shoal_quant_dot_a8(64, x, row, 256)));
    memset(x, 0, sizeof x);
    cr_assert(eq(u32, bits(shoal_quant_dot_a8(64, x, row, 256)), 0u));
    free(row);
}

/* bit-exact: the INT4A8 linear of every table, every batch of 1..17
 * tokens and 29..33 and 40 (8 .. 40 cross an activation tile of 33000 columns,
 * 33 and 40 the avx2 batch kernel's passes of 32 tokens; odd batches leave
 * neon-i8mm a last token for sdot), threads 1 and 3 (row ranges that do
 * not start at a multiple of 4), equals shoal_quant_dot_a8; widths that are
 * and are not multiples of 128 (a partial last chunk, odd widths, a
 * partial last group, a last 64-column half of 1 to 20 bytes) with and
 * without whole blocks of 8 rows; 8 rows of 33000 columns (over 256 groups
 * at every G, a partial last group, batches past the GEMM paths' widths);
 * blocks of 16 rows for every thread count (48, 40 and 32 rows: avx512's
 * rows_a8_few and GEMM, a last half of 1 and 16 bytes, an odd group count) */
Test(quant, a8_linear_bits_equal_reference_for_any_table_batch_and_threads)
{
    const int64_t shapes[][2] = {{1, 128}, {3, 100}, {17, 256}, {5, 384}, {33, 768},
                                 {9, 2048}, {4, 1000}, {7, 2176}, {5, 77}, {6, 129},
                                 {18, 192}, {3, 4000}, {8, 33000}, {9, 1}, {8, 33},
                                 {16, 77}, {8, 100}, {24, 129}, {16, 1000}, {8, 4000},
                                 {48, 130}, {40, 2048}, {32, 96}};
    const int64_t toks[] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12,
                            13, 14, 15, 16, 17, 29, 30, 31, 32, 33, 40};
    const int threads[] = {1, 3};
    enum shoal_quant_isa isas[1 + SIMD_ISA_MAX] = {SHOAL_QUANT_ISA_SCALAR};
    const int n_isa = 1 + simd_isas(isas + 1);
    int compared = 0;
    for (size_t ig = 0; ig < 3; ig++)
        for (size_t ish = 0; ish < sizeof shapes / sizeof shapes[0]; ish++) {
            const int64_t rows = shapes[ish][0], cols = shapes[ish][1];
            const int G = groups[ig];
            const int64_t n_tok_max = 40;
            float *wf = malloc((size_t)(rows * cols) * 4);
            float *x = malloc((size_t)(n_tok_max * cols) * 4);
            fill(wf, rows * cols, (uint32_t)(rows * 37 + cols + G));
            fill(x, n_tok_max * cols, (uint32_t)(cols * 19 + G));
            const size_t mb = shoal_quant_matrix_bytes(SHOAL_QUANT_INT4, rows, cols, G);
            const size_t rb = mb / (size_t)rows;
            uint8_t *wq = malloc(mb);
            cr_assert(eq(int, shoal_quant_quantize_matrix(SHOAL_QUANT_INT4, G, wq, mb, wf,
                                                          SHOAL_DTYPE_F32, rows, cols, NULL), 0));
            struct shoal_quant_weight w = {SHOAL_QUANT_INT4, G, rows, cols, wq};
            float *want = malloc((size_t)(n_tok_max * rows) * 4);
            float *got = malloc((size_t)(n_tok_max * rows) * 4);
            for (int64_t t = 0; t < n_tok_max; t++)
                for (int64_t r = 0; r < rows; r++)
                    want[t * rows + r] = shoal_quant_dot_a8(G, x + t * cols, wq + (size_t)r * rb, cols);
            for (int ii = 0; ii < n_isa; ii++)
                for (size_t in = 0; in < sizeof toks / sizeof toks[0]; in++)
                    for (size_t ith = 0; ith < 2 * N_ORDER; ith++) {
                        const int64_t n_tok = toks[in];
                        use_isa(isas[ii]);
                        set_order((int)(ith / 2));
                        omp_set_num_threads(threads[ith % 2]);
                        memset(got, 0xff, (size_t)(n_tok * rows) * 4);
                        cr_assert(eq(int, shoal_quant_linear_a8(got, x, n_tok, &w), 0));
                        for (int64_t e = 0; e < n_tok * rows; e++)
                            cr_assert(eq(u32, bits(got[e]), bits(want[e])),
                                      "%s G=%d [%lld][%lld] n_tok=%lld threads=%d t=%lld r=%lld: "
                                      "%.9g vs reference %.9g",
                                      shoal_quant_ops_name(), G, (long long)rows, (long long)cols,
                                      (long long)n_tok, threads[ith % 2], (long long)(e / rows),
                                      (long long)(e % rows), got[e], want[e]);
                        compared++;
                    }
            free(wf);
            free(x);
            free(wq);
            free(want);
            free(got);
        }
    omp_set_num_threads(omp_get_num_procs());
    use_isa(SHOAL_QUANT_ISA_SCALAR);
    cr_assert(eq(int, compared, 3 * (int)(sizeof shapes / sizeof shapes[0]) * n_isa *
                                    (int)(sizeof toks / sizeof toks[0]) * 2 * N_ORDER));
    static uint8_t zeros[1024];
    float y1[4];
    struct shoal_quant_weight bad = {SHOAL_QUANT_INT8, 64, 4, 128, zeros};
    cr_assert(eq(int, shoal_quant_linear_a8(y1, y1, 1, &bad), SHOAL_EINVAL));
}

/* bit-exact at the integer extremes: weight bytes whose nibbles are all 15
 * (q = 7) or all 0 (q = -8, never written by the quantizer but read as -8)
 * against activations that quantize to +-127 everywhere, so every partial
 * sum a kernel keeps in 16 bits is at its largest magnitude (4 * 15 * 127
 * per vpmaddubsw pair sum, 8 * 15 * 127 after one horizontal add, 16 * 15
 * * 127 in the avx2 batch kernel's words); a wrapped or saturated partial
 * sum changes the result. Every table, every G, decode and batch paths
 * (1 to 17 tokens), 16 rows (two 8-row blocks). */
Test(quant, a8_linear_bits_at_integer_extremes)
{
    const int64_t rows = 16, cols = 1024;
    const int64_t toks[] = {1, 2, 3, 8, 17};
    const uint8_t wbytes[] = {0xff, 0x00, 0x0f, 0xf0};
    const float xval[] = {3.0f, -3.0f};
    enum shoal_quant_isa isas[1 + SIMD_ISA_MAX] = {SHOAL_QUANT_ISA_SCALAR};
    const int n_isa = 1 + simd_isas(isas + 1);
    const int64_t n_tok_max = 17;
    float *x = malloc((size_t)(n_tok_max * cols) * 4);
    float *got = malloc((size_t)(n_tok_max * rows) * 4);
    float *want = malloc((size_t)(n_tok_max * rows) * 4);
    int compared = 0;
    for (size_t ig = 0; ig < 3; ig++)
        for (size_t iw = 0; iw < sizeof wbytes; iw++)
            for (size_t ix = 0; ix < 2; ix++) {
                const int G = groups[ig];
                const size_t rb = shoal_quant_row_bytes(SHOAL_QUANT_INT4, cols, G);
                const int64_t n_group = cols / G;
                uint8_t *wq = malloc(rb * (size_t)rows);
                for (int64_t r = 0; r < rows; r++) {
                    uint8_t *row = wq + (size_t)r * rb;
                    for (int64_t g = 0; g < n_group; g++) {
                        const float d = 0.5f + 0.25f * (float)((r + g) % 3);
                        memcpy(row + 4 * g, &d, 4);
                    }
                    memset(row + 4 * n_group, wbytes[iw], rb - 4 * (size_t)n_group);
                }
                /* a constant per token: every group's max|x| is that value, so
                 * every activation quantizes to +-127 */
                for (int64_t t = 0; t < n_tok_max; t++)
                    for (int64_t c = 0; c < cols; c++)
                        x[t * cols + c] = xval[ix] * (float)(1 + t);
                for (int64_t t = 0; t < n_tok_max; t++)
                    for (int64_t r = 0; r < rows; r++)
                        want[t * rows + r] =
                            shoal_quant_dot_a8(G, x + t * cols, wq + (size_t)r * rb, cols);
                /* not a degenerate zero: |group sum| is 32 * 127 or more */
                cr_assert(fabsf(want[0]) > 100.0f, "G=%d byte %02x: %g", G, wbytes[iw], want[0]);
                struct shoal_quant_weight w = {SHOAL_QUANT_INT4, G, rows, cols, wq};
                for (int ii = 0; ii < n_isa; ii++)
                    for (size_t in = 0; in < N_ORDER * sizeof toks / sizeof toks[0]; in++) {
                        const int64_t n_tok = toks[in % (sizeof toks / sizeof toks[0])];
                        use_isa(isas[ii]);
                        set_order((int)(in / (sizeof toks / sizeof toks[0])));
                        memset(got, 0xff, (size_t)(n_tok * rows) * 4);
                        cr_assert(eq(int, shoal_quant_linear_a8(got, x, n_tok, &w), 0));
                        for (int64_t e = 0; e < n_tok * rows; e++)
                            cr_assert(eq(u32, bits(got[e]), bits(want[e])),
                                      "%s G=%d byte %02x x=%g n_tok=%lld t=%lld r=%lld: %.9g vs "
                                      "reference %.9g",
                                      shoal_quant_ops_name(), G, wbytes[iw], xval[ix],
                                      (long long)n_tok, (long long)(e / rows),
                                      (long long)(e % rows), got[e], want[e]);
                        compared++;
                    }
                free(wq);
            }
    use_isa(SHOAL_QUANT_ISA_SCALAR);
    cr_assert(eq(int, compared, 3 * 4 * 2 * n_isa * (int)(sizeof toks / sizeof toks[0]) * N_ORDER));
    free(x);
    free(got);
    free(want);
}

/* bit-exact: rows wider than an activation tile (on-the-fly scalar path) equal
 * every table's rows over a heap-quantized input */
Test(quant, a8_wide_rows_equal_table_rows)
{
    const int64_t rows = 3, cols = 262144;
    const int G = 64;
    float *wf = malloc((size_t)(rows * cols) * 4), *x = malloc((size_t)cols * 4);
    fill(wf, rows * cols, 11);
    fill(x, cols, 12);
    const size_t mb = shoal_quant_matrix_bytes(SHOAL_QUANT_INT4, rows, cols, G);
    uint8_t *wq = malloc(mb);
    cr_assert(eq(int, shoal_quant_quantize_matrix(SHOAL_QUANT_INT4, G, wq, mb, wf, SHOAL_DTYPE_F32,
                                                  rows, cols, NULL), 0));
    struct shoal_quant_weight w = {SHOAL_QUANT_INT4, G, rows, cols, wq};
    cr_assert(shoal_quant_act_bytes(cols, G) > SHOAL_ACT_TILE_BYTES, "not wider than a tile");
    float wide[3], tab[3];
    cr_assert(eq(int, shoal_quant_linear_a8(wide, x, 1, &w), 0));
    struct shoal_quant_act a = {.n = cols, .group = G, .n_group = cols / G, .q_stride = cols};
    a.q = malloc((size_t)cols);
    a.d = malloc((size_t)(cols / G) * 4);
    a.s = malloc((size_t)(cols / G) * 4);
    shoal_quant_act_quantize(&a, x, 1);
    enum shoal_quant_isa isas[1 + SIMD_ISA_MAX] = {SHOAL_QUANT_ISA_SCALAR};
    const int n_isa = 1 + simd_isas(isas + 1);
    for (int ii = 0; ii < n_isa; ii++) {
        use_isa(isas[ii]);
        shoal_quant_active_ops()->linear_rows_a8(tab, &a, 1, &w, 0, rows);
        for (int r = 0; r < rows; r++)
            cr_assert(eq(u32, bits(tab[r]), bits(wide[r])), "%s row %d: %.9g vs %.9g",
                      shoal_quant_ops_name(), r, tab[r], wide[r]);
    }
    use_isa(SHOAL_QUANT_ISA_SCALAR);
    free(a.q);
    free(a.d);
    free(a.s);
    free(wf);
    free(x);
    free(wq);
}

/* shoal_quant_prefetch_next is performance only: on every table, INT4A8
 * outputs with a hint (the next weight, a weight smaller than the
 * prefetch distance, the same weight again) are the bits of those
 * without, at shapes whose last 8- and 16-row blocks take the hint and
 * with leftover rows; thread shares 0 and 1 of 2 each take their own
 * hint */
Test(quant, prefetch_hints_change_no_bits)
{
    static const int64_t shape[][2] = {{40, 2048}, {20, 768}, {3, 200}, {64, 1024}};
    const int G = 64;
    struct shoal_quant_weight w[4];
    uint8_t *wq[4];
    for (int k = 0; k < 4; k++) {
        const int64_t rows = shape[k][0], cols = shape[k][1];
        float *wf = malloc((size_t)(rows * cols) * 4);
        fill(wf, rows * cols, 40 + (unsigned)k);
        const size_t mb = shoal_quant_matrix_bytes(SHOAL_QUANT_INT4, rows, cols, G);
        wq[k] = malloc(mb);
        cr_assert(eq(int, shoal_quant_quantize_matrix(SHOAL_QUANT_INT4, G, wq[k], mb, wf,
                                                      SHOAL_DTYPE_F32, rows, cols, NULL), 0));
        w[k] = (struct shoal_quant_weight){SHOAL_QUANT_INT4, G, rows, cols, wq[k]};
        free(wf);
    }
    float *x = malloc(2 * 2048 * 4);
    fill(x, 2 * 2048, 49);
    enum shoal_quant_isa isas[1 + SIMD_ISA_MAX] = {SHOAL_QUANT_ISA_SCALAR};
    const int n_isa = 1 + simd_isas(isas + 1);
    float want[2 * 64], got[2 * 64];
    for (int ii = 0; ii < n_isa; ii++) {
        use_isa(isas[ii]);
        for (int k = 0; k < 4; k++)
            for (int64_t n_tok = 1; n_tok <= 2; n_tok++)
                for (int nth = 1; nth <= 2; nth++)
                    for (int h = 0; h < 4; h++) {
                        memset(want, 0, sizeof want);
                        memset(got, 0, sizeof got);
                        for (int ith = 0; ith < nth; ith++)
                            shoal_quant_linear_a8_part(want, x, n_tok, &w[k], ith, nth);
                        for (int ith = 0; ith < nth; ith++) {
                            /* h: the next weight, the smallest, itself, none */
                            shoal_quant_prefetch_next(h == 0   ? &w[(k + 1) % 4]
                                                      : h == 1 ? &w[2]
                                                      : h == 2 ? &w[k]
                                                               : NULL,
                                                      ith, nth);
                            shoal_quant_linear_a8_part(got, x, n_tok, &w[k], ith, nth);
                        }
                        const int64_t n = n_tok * w[k].rows;
                        for (int64_t i = 0; i < n; i++)
                            cr_assert(eq(u32, bits(got[i]), bits(want[i])),
                                      "%s shape %d n_tok %lld nth %d hint %d: y[%lld] %.9g vs "
                                      "%.9g", shoal_quant_ops_name(), k, (long long)n_tok, nth,
                                      h, (long long)i, got[i], want[i]);
                    }
    }
    use_isa(SHOAL_QUANT_ISA_SCALAR);
    for (int k = 0; k < 4; k++)
        free(wq[k]);
    free(x);
}

/* bit-exact: every table's activation quantizer (quant_act.c at the
 * baseline and with AVX2) writes the bytes of the scalar table's, over
 * widths with partial groups and chunks, every G, and inputs with zero
 * groups, subnormals, huge values, ties and a NaN/infinity group */
Test(quant, act_quantize_same_bytes_on_every_table)
{
    static const int64_t widths[] = {1, 7, 32, 100, 128, 200, 768, 2048, 2050};
    static const int groups[] = {32, 64, 128};
    enum shoal_quant_isa isas[1 + SIMD_ISA_MAX] = {SHOAL_QUANT_ISA_SCALAR};
    const int n_isa = 1 + simd_isas(isas + 1);
    const int64_t n_tok = 3;
    for (size_t iw = 0; iw < sizeof widths / sizeof widths[0]; iw++)
        for (size_t ig = 0; ig < 3; ig++) {
            const int64_t n = widths[iw];
            const int G = groups[ig];
            const int64_t n_group = (n + G - 1) / G, stride = (n + 127) & ~(int64_t)127;
            float *x = malloc((size_t)(n * n_tok) * 4);
            fill(x, n * n_tok, (unsigned)(n * 7 + G));
            for (int64_t i = 0; i < n && i < G; i++)
                x[i] = 0.0f;                       /* token 0, group 0: zero */
            if (n > G)
                x[G] = 1e-40f;                     /* a subnormal */
            for (int64_t i = 0; i < n; i += 5)
                x[n + i] = (float)(i % 11) * 0.5f;  /* token 1: ties at .5 */
            x[2 * n + n / 2] = (n & 1) ? NAN : INFINITY;  /* token 2 */
            if (n > 3)
                x[2 * n + 1] = 3e38f;
            int8_t *q[2];
            float *d[2];
            int32_t *s[2];
            for (int ii = 0; ii < n_isa; ii++) {
                const int k = ii ? 1 : 0;
                q[k] = malloc((size_t)(stride * n_tok));
                d[k] = malloc((size_t)(n_group * n_tok) * 4);
                s[k] = malloc((size_t)(n_group * n_tok) * 4);
                struct shoal_quant_act a = {.n = n, .group = G, .n_group = n_group,
                                            .q_stride = stride, .q = q[k], .d = d[k],
                                            .s = s[k]};
                use_isa(isas[ii]);
                shoal_quant_act_quantize(&a, x, n_tok);
                if (ii) {
                    cr_assert(memcmp(q[0], q[1], (size_t)(stride * n_tok)) == 0,
                              "%s q, n %lld G %d", shoal_quant_ops_name(), (long long)n, G);
                    cr_assert(memcmp(d[0], d[1], (size_t)(n_group * n_tok) * 4) == 0,
                              "%s d, n %lld G %d", shoal_quant_ops_name(), (long long)n, G);
                    cr_assert(memcmp(s[0], s[1], (size_t)(n_group * n_tok) * 4) == 0,
                              "%s s, n %lld G %d", shoal_quant_ops_name(), (long long)n, G);
                    free(q[1]);
                    free(d[1]);
                    free(s[1]);
                }
            }
            use_isa(SHOAL_QUANT_ISA_SCALAR);
            free(q[0]);
            free(d[0]);
            free(s[0]);
            free(x);
        }
}

/* ---- FP8 (E4M3 codes, 128 x 128 block scales) ----------------------------- */

/* E4M3FN from its definition, independently of the table: sign, 4-bit
 * exponent of bias 7, 3-bit mantissa, exponent 0 subnormal, S.1111.111 NaN */
static double e4m3_formula(unsigned c)
{
    const unsigned e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7)
        return NAN;
    double v = e == 0 ? ldexp((double)m, -9) : ldexp(1.0 + m / 8.0, (int)e - 7);
    return (c & 0x80) ? -v : v;
}

/* bit-exact: all 256 codes against the formula; 0x80 is -0.0; 448 is the max */
Test(quant, fp8_e4m3_table_is_exact)
{
    for (unsigned c = 0; c < 256; c++) {
        const double want = e4m3_formula(c);
        const float got = shoal_fp8_e4m3_to_f32((uint8_t)c);
        if (isnan(want)) {
            cr_assert(isnan(got), "code 0x%02x should be NaN, got %g", c, (double)got);
            continue;
        }
        cr_assert(eq(dbl, (double)got, want), "code 0x%02x", c);
        cr_assert(eq(int, signbit(got) != 0, (c & 0x80) != 0), "code 0x%02x sign", c);
    }
    cr_assert(eq(flt, shoal_fp8_e4m3_to_f32(0x7e), 448.0f));
    cr_assert(eq(flt, shoal_fp8_e4m3_to_f32(0x01), 0x1p-9f));
    cr_assert(eq(flt, shoal_fp8_e4m3_to_f32(0x08), 0x1p-6f));
}

Test(quant, fp8_find_nan_finds_the_first_nan_code)
{
    uint8_t b[67];
    for (int i = 0; i < 67; i++)
        b[i] = (uint8_t)(i * 37 % 0x7f);            /* never 0x7f */
    b[13] |= 0x80;
    cr_assert(eq(i64, shoal_fp8_find_nan(b, sizeof b), -1));
    for (int at = 0; at < 67; at += 11) {
        const uint8_t keep = b[at];
        b[at] = (at & 1) ? 0xff : 0x7f;
        cr_assert(eq(i64, shoal_fp8_find_nan(b, sizeof b), at));
        b[at] = keep;
    }
}

/* A random FP8 weight [rows][cols] (no NaN codes) with scales in [0.5, 2)/448. */
struct fp8w {
    struct shoal_weight w;
    uint8_t *q;
    float *s;
};

static struct fp8w fp8_random(int64_t rows, int64_t cols, uint32_t seed)
{
    struct fp8w f = {0};
    const int64_t B = SHOAL_FP8_BLOCK, nbr = (rows + B - 1) / B, nbc = (cols + B - 1) / B;
    f.q = malloc((size_t)(rows * cols));
    f.s = malloc((size_t)(nbr * nbc) * sizeof(float));
    uint32_t st = seed;
    for (int64_t i = 0; i < rows * cols; i++) {
        uint8_t c;
        do
            c = (uint8_t)((frand(&st) + 1.0f) * 128.0f);
        while ((c & 0x7f) == 0x7f);
        f.q[i] = c;
    }
    for (int64_t i = 0; i < nbr * nbc; i++)
        f.s[i] = (1.25f + 0.75f * frand(&st)) / 448.0f;
    f.w = (struct shoal_weight){.dtype = SHOAL_DTYPE_FP8, .data = f.q, .rows = rows,
                                .cols = cols, .group = (int)B, .scale = f.s};
    return f;
}

/* bit-exact: every table (scalar and each SIMD one this CPU runs) gives the
 * canonical order's bits (shoal_fp8_dot_ref) for one and several tokens, on
 * shapes with partial blocks and tails of every length mod 8; tolerance:
 * within 1e-5 relative of a double-precision dot of the dequantized weight */
Test(quant, fp8_kernels_canonical_on_every_isa)
{
    enum shoal_quant_isa isas[1 + SIMD_ISA_MAX] = {SHOAL_QUANT_ISA_SCALAR};
    const int n_isa = 1 + simd_isas(isas + 1);
    cr_log_info("FP8: %d kernel tables", n_isa);
    const int64_t shapes[][2] = {{200, 300}, {3, 128}, {130, 2053}, {1, 7}, {129, 4100}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int64_t rows = shapes[k][0], cols = shapes[k][1], n_tok = 3;
        struct fp8w f = fp8_random(rows, cols, 77u + (uint32_t)k);
        cr_assert(eq(int, shoal_fp8_check(&f.w, 1, "t", NULL), 0));
        float *x = malloc((size_t)(n_tok * cols) * sizeof(float));
        float *want = malloc((size_t)(n_tok * rows) * sizeof(float));
        float *y = malloc((size_t)(n_tok * rows) * sizeof(float));
        float *row = malloc((size_t)cols * sizeof(float));
        uint32_t st = 5u + (uint32_t)k;
        for (int64_t i = 0; i < n_tok * cols; i++)
            x[i] = frand(&st);
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t r = 0; r < rows; r++) {
                want[t * rows + r] = shoal_fp8_dot_ref(x + t * cols, &f.w, r);
                shoal_fp8_dequantize_row(row, &f.w, r);
                double ref = 0, mag = 0;
                for (int64_t c = 0; c < cols; c++) {
                    const double wv = (double)shoal_fp8_e4m3_to_f32(f.q[r * cols + c]) *
                                      (double)f.s[(r / 128) * ((cols + 127) / 128) + c / 128];
                    cr_assert(eq(flt, row[c], (float)wv), "dequantize (%lld, %lld)",
                              (long long)r, (long long)c);
                    ref += (double)x[t * cols + c] * wv;
                    mag += fabs((double)x[t * cols + c] * wv);
                }
                cr_assert(fabs(want[t * rows + r] - ref) <= 1e-5 * mag + 1e-30,
                          "shape %lld x %lld row %lld: %g vs double %g", (long long)rows,
                          (long long)cols, (long long)r, (double)want[t * rows + r], ref);
            }
        for (int ii = 0; ii < n_isa; ii++) {
            use_isa(isas[ii]);
            for (int64_t r = 0; r < rows; r++) {   /* each table's row dequantization */
                shoal_fp8_dequantize_row(row, &f.w, r);
                for (int64_t c = 0; c < cols; c++) {
                    const float wv = shoal_fp8_e4m3_to_f32(f.q[r * cols + c]) *
                                     f.s[(r / 128) * ((cols + 127) / 128) + c / 128];
                    cr_assert(eq(u32, bits(row[c]), bits(wv)), "%s dequantize (%lld, %lld)",
                              shoal_quant_ops_name(), (long long)r, (long long)c);
                }
            }
            for (int64_t nt = 1; nt <= n_tok; nt += n_tok - 1) {
                memset(y, 0xcc, (size_t)(n_tok * rows) * sizeof(float));
                for (int nth = 1; nth <= 3; nth += 2)
                    for (int ith = 0; ith < nth; ith++)
                        shoal_fp8_linear_part(y, x, nt, &f.w, ith, nth);
                for (int64_t i = 0; i < nt * rows; i++)
                    cr_assert(eq(u32, bits(y[i]), bits(want[i])),
                              "%s shape %lld x %lld n_tok %lld element %lld: %.9g want %.9g",
                              shoal_quant_ops_name(), (long long)rows, (long long)cols,
                              (long long)nt, (long long)i, (double)y[i], (double)want[i]);
            }
        }
        use_isa(SHOAL_QUANT_ISA_SCALAR);
        free(x);
        free(want);
        free(y);
        free(row);
        free(f.q);
        free(f.s);
    }
}

/* a NaN code and a non-finite scale are refused, naming where */
Test(quant, fp8_check_refuses_nan_codes_and_scales)
{
    struct fp8w f = fp8_random(130, 260, 9);
    struct shoal_err err = {0};
    f.q[129 * 260 + 258] = 0xff;
    cr_assert(eq(int, shoal_fp8_check(&f.w, 0, "w", &err), 0), "codes not read");
    cr_assert(eq(int, shoal_fp8_check(&f.w, 1, "w", &err), SHOAL_EFORMAT));
    cr_assert(strstr(err.msg, "row 129, col 258") != NULL, "%s", err.msg);
    f.q[129 * 260 + 258] = 0x7e;
    f.s[5] = INFINITY;
    err = (struct shoal_err){0};
    cr_assert(eq(int, shoal_fp8_check(&f.w, 1, "w", &err), SHOAL_EFORMAT));
    cr_assert(strstr(err.msg, "[1][2]") != NULL, "%s", err.msg);
    free(f.q);
    free(f.s);
}

/* ---- MXFP4 (E2M1 pairs, E8M0 exponents per 32) ----------------------------- */

/* E2M1 from its definition, independently of the table: sign bit 3, 2-bit
 * exponent of bias 1, 1-bit mantissa, exponent 0 subnormal (m * 0.5) */
static double e2m1_formula(unsigned nib)
{
    const unsigned e = (nib >> 1) & 3, m = nib & 1;
    const double v = e == 0 ? 0.5 * m : ldexp(1.0 + 0.5 * m, (int)e - 1);
    return (nib & 8) ? -v : v;
}

/* bit-exact: the 16 nibbles against the formula (FP4_VALUES), 8 is -0 */
Test(quant, mxfp4_e2m1_table_is_exact)
{
    for (unsigned n = 0; n < 16; n++) {
        cr_assert(eq(dbl, (double)shoal_mxfp4_e2m1_table[n], e2m1_formula(n)), "nibble %u", n);
        cr_assert(eq(int, signbit(shoal_mxfp4_e2m1_table[n]) != 0, (n & 8) != 0), "nibble %u", n);
    }
    cr_assert(eq(flt, shoal_mxfp4_e2m1_table[7], 6.0f));
    cr_assert(eq(flt, shoal_mxfp4_e2m1_table[1], 0.5f));
    for (int e = 127 - SHOAL_MXFP4_EMAX_DELTA; e <= 127 + SHOAL_MXFP4_EMAX_DELTA; e++)
        cr_assert(eq(dbl, (double)shoal_mxfp4_d((uint8_t)e), ldexp(1.0, e - 128)), "e %d", e);
}

/* A random MXFP4 weight [rows][cols]: every nibble, exponents in
 * 127 +- 12, and the two range ends in a few blocks. */
struct mxw {
    struct shoal_weight w;
    uint8_t *q, *e;
};

static struct mxw mx_random(int64_t rows, int64_t cols, uint32_t seed)
{
    struct mxw f = {0};
    const int64_t nb = cols / 32;
    f.q = malloc((size_t)(rows * cols / 2));
    f.e = malloc((size_t)(rows * nb));
    uint32_t st = seed;
    for (int64_t i = 0; i < rows * cols / 2; i++)
        f.q[i] = (uint8_t)((frand(&st) + 1.0f) * 128.0f);
    for (int64_t i = 0; i < rows * nb; i++)
        f.e[i] = (uint8_t)(127 + (int)(12.0f * frand(&st)));
    f.e[0] = 127 - SHOAL_MXFP4_EMAX_DELTA;
    f.e[rows * nb - 1] = 127 + SHOAL_MXFP4_EMAX_DELTA;
    f.w = (struct shoal_weight){.dtype = SHOAL_DTYPE_MXFP4, .data = f.q, .rows = rows,
                                .cols = cols, .group = 32, .e8m0 = f.e};
    return f;
}

/* element (r, c) decoded from the bytes by the published rule (gpt-oss
 * weights.py: low nibble first, ldexp by e - 127), in double */
static double mx_value(const struct mxw *f, int64_t r, int64_t c)
{
    const int64_t cols = f->w.cols;
    const uint8_t byte = f->q[r * cols / 2 + c / 2];
    const unsigned nib = (c & 1) ? byte >> 4 : byte & 15;
    return ldexp(e2m1_formula(nib), (int)f->e[r * (cols / 32) + c / 32] - 127);
}

/* bit-exact: each table's MXFP4 rows give the canonical order's bits
 * (shoal_mxfp4_dot_ref) for 1 and 3 tokens and 1/3 threads, on shapes with
 * 1..90 blocks (8-block batches and tails, a chunk edge at 2048 columns);
 * tolerance: within 1e-5 relative of a double dot of the decoded weight;
 * dequantized rows are the exact values (-0 kept); a rows view computes
 * the same rows */
Test(quant, mxfp4_kernels_canonical_on_every_isa)
{
    enum shoal_quant_isa isas[1 + SIMD_ISA_MAX] = {SHOAL_QUANT_ISA_SCALAR};
    const int n_isa = 1 + simd_isas(isas + 1);
    cr_log_info("MXFP4: %d kernel tables", n_isa);
    const int64_t shapes[][2] = {{5, 32}, {37, 96}, {64, 352}, {3, 2880}, {9, 4160}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int64_t rows = shapes[k][0], cols = shapes[k][1], n_tok = 3;
        struct mxw f = mx_random(rows, cols, 91u + (uint32_t)k);
        cr_assert(eq(int, shoal_mxfp4_check(&f.w, "t", NULL), 0));
        cr_assert(eq(sz, shoal_weight_bytes(&f.w), (size_t)(rows * cols / 2 + rows * cols / 32)));
        float *x = malloc((size_t)(n_tok * cols) * sizeof(float));
        float *want = malloc((size_t)(n_tok * rows) * sizeof(float));
        float *y = malloc((size_t)(n_tok * rows) * sizeof(float));
        float *row = malloc((size_t)cols * sizeof(float));
        uint32_t st = 7u + (uint32_t)k;
        for (int64_t i = 0; i < n_tok * cols; i++)
            x[i] = frand(&st);
        for (int64_t r = 0; r < rows; r++) {
            shoal_weight_row_to_f32(row, &f.w, r);
            for (int64_t c = 0; c < cols; c++) {
                const double wv = mx_value(&f, r, c);
                cr_assert(eq(dbl, (double)row[c], wv), "dequantize (%lld, %lld)",
                          (long long)r, (long long)c);
                cr_assert(eq(int, signbit(row[c]) != 0, signbit(wv) != 0), "sign (%lld, %lld)",
                          (long long)r, (long long)c);
            }
            for (int64_t t = 0; t < n_tok; t++) {
                want[t * rows + r] = shoal_mxfp4_dot_ref(x + t * cols, &f.w, r);
                double ref = 0, mag = 0;
                for (int64_t c = 0; c < cols; c++) {
                    const double wv = mx_value(&f, r, c);
                    ref += (double)x[t * cols + c] * wv;
                    mag += fabs((double)x[t * cols + c] * wv);
                }
                cr_assert(fabs(want[t * rows + r] - ref) <= 1e-5 * mag,
                          "shape %lld x %lld row %lld: %g vs double %g", (long long)rows,
                          (long long)cols, (long long)r, (double)want[t * rows + r], ref);
            }
        }
        for (int ii = 0; ii < n_isa; ii++) {
            use_isa(isas[ii]);
            for (int64_t nt = 1; nt <= n_tok; nt += n_tok - 1) {
                memset(y, 0xcc, (size_t)(n_tok * rows) * sizeof(float));
                for (int nth = 1; nth <= 3; nth += 2)
                    for (int ith = 0; ith < nth; ith++)
                        shoal_mxfp4_linear_part(y, x, nt, &f.w, ith, nth);
                for (int64_t t = 0; t < nt; t++)
                    for (int64_t r = 0; r < rows; r++)
                        cr_assert(eq(u32, bits(y[t * rows + r]), bits(want[t * rows + r])),
                                  "%s shape %lld x %lld n_tok %lld token %lld row %lld: %.9g "
                                  "want %.9g", shoal_quant_ops_name(), (long long)rows,
                                  (long long)cols, (long long)nt, (long long)t, (long long)r,
                                  (double)y[t * rows + r], (double)want[t * rows + r]);
            }
            if (rows > 2) {   /* rows [1, rows - 1) through a view */
                struct shoal_weight v;
                cr_assert(eq(int, shoal_weight_rows_view(&f.w, 1, rows - 2, &v), 0));
                shoal_mxfp4_linear_part(y, x, 1, &v, 0, 1);
                for (int64_t r = 0; r < rows - 2; r++)
                    cr_assert(eq(u32, bits(y[r]), bits(want[r + 1])), "%s view row %lld",
                              shoal_quant_ops_name(), (long long)r);
            }
        }
        use_isa(SHOAL_QUANT_ISA_SCALAR);
        free(x);
        free(want);
        free(y);
        free(row);
        free(f.q);
        free(f.e);
    }
}

/* E8M0 NaN (255) and exponents past the accepted range are refused, naming
 * the row and block; the range ends are accepted; a bad shape is refused */
Test(quant, mxfp4_check_refuses_bad_exponents)
{
    struct mxw f = mx_random(4, 96, 3);
    struct shoal_err err = {0};
    cr_assert(eq(int, shoal_mxfp4_check(&f.w, "w", &err), 0), "%s", err.msg);
    const uint8_t bad[] = {255, 0, 127 - SHOAL_MXFP4_EMAX_DELTA - 1, 127 + SHOAL_MXFP4_EMAX_DELTA + 1};
    for (size_t i = 0; i < sizeof bad; i++) {
        f.e[2 * 3 + 1] = bad[i];
        err = (struct shoal_err){0};
        cr_assert(eq(int, shoal_mxfp4_check(&f.w, "w", &err), SHOAL_EFORMAT), "e %u", bad[i]);
        cr_assert(strstr(err.msg, "row 2, block 1") != NULL, "%s", err.msg);
        cr_assert(strstr(err.msg, "'w'") != NULL, "%s", err.msg);
    }
    cr_assert(strstr(err.msg, "is 192") != NULL, "%s", err.msg);
    f.e[7] = 255;
    err = (struct shoal_err){0};
    shoal_mxfp4_check(&f.w, "w", &err);
    cr_assert(strstr(err.msg, "255 (NaN)") != NULL, "%s", err.msg);
    f.e[7] = 127;
    f.w.cols = 80;   /* not a multiple of 32 */
    cr_assert(eq(int, shoal_mxfp4_check(&f.w, "w", &err), SHOAL_EINVAL));
    free(f.q);
    free(f.e);
}

/* binding: a 3-D single weight and a 4-D per-expert slice point into the
 * tensors' bytes; wrong dtype, shape, slice and exponent are refused */
Test(quant, mxfp4_bind_checks_and_slices)
{
    const int64_t n = 3, rows = 6, cols = 64, nb = 2;
    struct mxw f = mx_random(n * rows, cols, 5);
    struct shoal_st_tensor tb = {.name = "m.gate_up_proj_blocks", .dtype_name = "U8", .n_dims = 4,
                                 .shape = {n, rows, nb, 16}, .data = f.q,
                                 .nbytes = (size_t)(n * rows * cols / 2), .file = "a.safetensors"};
    struct shoal_st_tensor ts = {.name = "m.gate_up_proj_scales", .dtype_name = "U8", .n_dims = 3,
                                 .shape = {n, rows, nb}, .data = f.e,
                                 .nbytes = (size_t)(n * rows * nb), .file = "a.safetensors"};
    struct shoal_weight w;
    struct shoal_err err = {0};
    cr_assert(eq(int, shoal_mxfp4_bind(&w, &tb, &ts, 2, rows, cols, 1, "gate_up", &err), 0), "%s",
              err.msg);
    cr_assert(eq(ptr, (void *)w.data, (void *)(f.q + 2 * rows * cols / 2)));
    cr_assert(eq(ptr, (void *)w.e8m0, (void *)(f.e + 2 * rows * nb)));
    cr_assert(eq(int, w.dtype, SHOAL_DTYPE_MXFP4));
    err = (struct shoal_err){0};
    cr_assert(eq(int, shoal_mxfp4_bind(&w, &tb, &ts, 3, rows, cols, 1, "gate_up", &err), SHOAL_EINVAL));
    err = (struct shoal_err){0};
    cr_assert(eq(int, shoal_mxfp4_bind(&w, &tb, &ts, 0, rows, 96, 1, "gate_up", &err), SHOAL_ESHAPE));
    cr_assert(strstr(err.msg, "[3, 6, 2, 16]") != NULL, "%s", err.msg);
    /* one weight: 3-D blocks, 2-D scales */
    struct shoal_st_tensor b1 = tb, s1 = ts;
    b1.n_dims = 3, b1.shape[0] = rows, b1.shape[1] = nb, b1.shape[2] = 16, b1.nbytes /= n;
    s1.n_dims = 2, s1.shape[0] = rows, s1.shape[1] = nb, s1.nbytes /= n;
    cr_assert(eq(int, shoal_mxfp4_bind(&w, &b1, &s1, 0, rows, cols, 1, "x", &err), 0), "%s", err.msg);
    err = (struct shoal_err){0};
    snprintf(s1.dtype_name, sizeof s1.dtype_name, "BF16");
    cr_assert(eq(int, shoal_mxfp4_bind(&w, &b1, &s1, 0, rows, cols, 1, "x", &err), SHOAL_EFORMAT));
    cr_assert(strstr(err.msg, "dtype BF16; expected U8") != NULL, "%s", err.msg);
    err = (struct shoal_err){0};
    f.e[2 * rows * nb + 3] = 255;   /* expert 2, row 1, block 1 */
    cr_assert(eq(int, shoal_mxfp4_bind(&w, &tb, &ts, 2, rows, cols, 1, "gate_up", &err), SHOAL_EFORMAT));
    cr_assert(strstr(err.msg, "row 1, block 1") != NULL, "%s", err.msg);
    cr_assert(eq(int, shoal_mxfp4_bind(&w, &tb, &ts, 1, rows, cols, 1, "gate_up", &err), 0));
    cr_assert(eq(int, shoal_mxfp4_bind(&w, &tb, &ts, 2, rows, cols, 0, "gate_up", &err), 0),
              "exponents not read");
    cr_assert(eq(int, shoal_mxfp4_check(&w, "gate_up", &err), SHOAL_EFORMAT));
    free(f.q);
    free(f.e);
}

/* ---- rows scaled and added (shoal_quant_axpy_rows) ------------------------ */

/* The written-out reference: each row's elements as q_at and scale_of give
 * them (not the library's dequantizer), d * q, then dst + coef * that,
 * rows in order. */
static void axpy_written_out(enum shoal_quant_type type, int group, float *dst, int64_t n,
                             const uint8_t *rows, size_t rb, const float *coef, int64_t cs,
                             int64_t n_rows)
{
    for (int64_t i = 0; i < n_rows; i++)
        for (int64_t j = 0; j < n; j++) {
            const uint8_t *row = rows + (size_t)i * rb;
            const float v = scale_of(row, j / group) * (float)q_at(type, row, n, group, j);
            dst[j] = dst[j] + coef[i * cs] * v;
        }
}

/* FP8 rows scaled and added (shoal_fp8_axpy_rows, MLA's absorbed query
 * over an FP8 kv_b_proj): every table's bits are those of each row as
 * shoal_fp8_e4m3_to_f32 times its block's scale, written out here, added
 * times its coefficient in row order. Shapes: 512 columns (kv_lora_rank),
 * 200 (a partial block, a chunk of 8), 7; rows that start off a block
 * edge and cross one; a coefficient stride of 3; a non-zero dst. */
Test(quant, fp8_axpy_rows_same_bits_on_every_table)
{
    enum shoal_quant_isa isas[1 + SIMD_ISA_MAX] = {SHOAL_QUANT_ISA_SCALAR};
    const int n_isa = 1 + simd_isas(isas + 1);
    const int64_t shapes[][3] = {{300, 512, 130}, {260, 200, 7}, {9, 7, 1}};   /* rows, cols, n */
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int64_t rows = shapes[k][0], cols = shapes[k][1], nr = shapes[k][2];
        const int64_t r0 = rows > 130 ? 100 : 1, cs = 3, B = SHOAL_FP8_BLOCK;
        const int64_t nbc = (cols + B - 1) / B;
        struct fp8w f = fp8_random(rows, cols, 900u + (uint32_t)k);
        float *coef = malloc((size_t)(nr * cs) * sizeof(float));
        float *base = malloc((size_t)cols * sizeof(float));
        float *want = malloc((size_t)cols * sizeof(float));
        float *got = malloc((size_t)cols * sizeof(float));
        fill(coef, nr * cs, 11);
        fill(base, cols, 12);
        for (int64_t j = 0; j < cols; j++)
            base[j] = ldexpf(base[j], -10);
        memcpy(want, base, (size_t)cols * sizeof(float));
        for (int64_t i = 0; i < nr; i++)
            for (int64_t j = 0; j < cols; j++) {
                const int64_t r = r0 + i;
                const float v = shoal_fp8_e4m3_to_f32(f.q[r * cols + j]) *
                                f.s[(r / B) * nbc + j / B];
                want[j] = want[j] + coef[i * cs] * v;
            }
        int moved = 0;
        for (int64_t j = 0; j < cols; j++)
            moved += bits(want[j]) != bits(base[j]);
        cr_assert(moved > cols / 2, "the rows moved only %d of %lld elements", moved,
                  (long long)cols);
        for (int t = 0; t < n_isa; t++) {
            use_isa(isas[t]);
            memcpy(got, base, (size_t)cols * sizeof(float));
            shoal_fp8_axpy_rows(got, &f.w, r0, nr, coef, cs);
            for (int64_t j = 0; j < cols; j++)
                cr_assert(eq(u32, bits(got[j]), bits(want[j])), "%s %lld x %lld, %lld rows "
                          "from %lld: [%lld] %.9g want %.9g", shoal_quant_ops_name(),
                          (long long)rows, (long long)cols, (long long)nr, (long long)r0,
                          (long long)j, (double)got[j], (double)want[j]);
        }
        float *bufs[] = {coef, base, want, got, (float *)(void *)f.q, f.s};
        for (size_t b = 0; b < sizeof bufs / sizeof *bufs; b++)
            free(bufs[b]);
    }
    use_isa(SHOAL_QUANT_ISA_SCALAR);
}

Test(quant, axpy_rows_same_bits_on_every_table)
{
    /* 512: MLA's kv_lora_rank; 200: 6 blocks of 32 and a tail of 8 (G = 32,
     * 64 end inside a group); 24: tail only; rows 1, 7 and 128 (W^UK_h) */
    const int64_t ns[] = {512, 200, 24}, nrs[] = {1, 7, 128};
    enum shoal_quant_isa isas[SIMD_ISA_MAX];
    const int n_isa = simd_isas(isas);
    for (size_t it = 0; it < 2; it++)
        for (size_t ig = 0; ig < 3; ig++)
            for (size_t in = 0; in < 3; in++)
                for (size_t ir = 0; ir < 3; ir++) {
                    const enum shoal_quant_type type = types[it];
                    const int G = groups[ig];
                    const int64_t n = ns[in], nr = nrs[ir], cs = ir == 1 ? 3 : 1;
                    const size_t rb = shoal_quant_row_bytes(type, n, G);
                    uint8_t *rows = malloc(rb * (size_t)nr);
                    float *x = malloc((size_t)n * sizeof(float));
                    float *coef = malloc((size_t)(nr * cs) * sizeof(float));
                    float *base = malloc((size_t)n * sizeof(float));
                    float *want = malloc((size_t)n * sizeof(float));
                    float *got = malloc((size_t)n * sizeof(float));
                    uint32_t seed = 100 + (uint32_t)(it * 1000 + ig * 100 + in * 10 + ir);
                    for (int64_t i = 0; i < nr; i++) {
                        /* one magnitude a row (fill's blocks would round the
                         * smaller ones of a group to 0), the row's own scale */
                        for (int64_t j = 0; j < n; j++)
                            x[j] = ldexpf(frand(&seed), (int)(i % 5) - 2);
                        void *row = quantize(type, G, x, n);
                        memcpy(rows + (size_t)i * rb, row, rb);
                        free(row);
                    }
                    fill(coef, nr * cs, 7);
                    fill(base, n, 9);   /* dst is added to, not overwritten */
                    for (int64_t j = 0; j < n; j++)
                        base[j] = ldexpf(base[j], -14);   /* below the rows' terms */
                    memcpy(want, base, (size_t)n * sizeof(float));
                    axpy_written_out(type, G, want, n, rows, rb, coef, cs, nr);
                    int moved = 0;
                    for (int64_t j = 0; j < n; j++)
                        moved += bits(want[j]) != bits(base[j]);
                    cr_assert(moved > n / 2, "the rows moved only %d of %lld elements", moved,
                              (long long)n);
                    for (int k = -1; k < n_isa; k++) {
                        use_isa(k < 0 ? SHOAL_QUANT_ISA_SCALAR : isas[k]);
                        memcpy(got, base, (size_t)n * sizeof(float));
                        shoal_quant_axpy_rows(type, G, got, n, rows, rb, coef, cs, nr);
                        for (int64_t j = 0; j < n; j++)
                            cr_assert(eq(u32, bits(got[j]), bits(want[j])),
                                      "%s type %d G %d n %lld rows %lld: [%lld] %.9g want "
                                      "%.9g", shoal_quant_ops_name(), (int)type, G,
                                      (long long)n, (long long)nr, (long long)j,
                                      (double)got[j], (double)want[j]);
                    }
                    use_isa(SHOAL_QUANT_ISA_SCALAR);
                    free(rows);
                    free(x);
                    free(coef);
                    free(base);
                    free(want);
                    free(got);
                }
}
