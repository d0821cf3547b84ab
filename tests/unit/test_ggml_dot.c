/* ggml_dot: the canonical dot products of ggml-typed weights (Q8_0, Q4_K,
 * Q6_K) against int8 activations, and every ISA's rows kernel.
 *
 * Two kinds of assert (STYLE 35):
 *   - tolerance: the scalar reference against a float64 sum of
 *     ggml_dequant's weights times the dequantized activations, within the
 *     bound derived in ref_bound() (a different summation order), and
 *     exactly equal where every product and sum is exact;
 *   - bit-exact: every ISA table, thread split and batch size against the
 *     scalar reference (DESIGN contract 1).
 * Seeds are fixed and printed in the messages. */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml_dot.h"
#include "ggml_types.h"
#include "quant.h"
#include "tensor.h"

/* the first three have their own kernels; the rest share the integer form */
static const enum shoal_ggml_type types[] = {
    SHOAL_GGML_TYPE_Q8_0,    SHOAL_GGML_TYPE_Q4_K,    SHOAL_GGML_TYPE_Q6_K,
    SHOAL_GGML_TYPE_Q5_K,    SHOAL_GGML_TYPE_Q2_K,    SHOAL_GGML_TYPE_Q3_K,
    SHOAL_GGML_TYPE_IQ4_XS,  SHOAL_GGML_TYPE_IQ4_NL,  SHOAL_GGML_TYPE_IQ2_XXS,
    SHOAL_GGML_TYPE_IQ3_XXS, SHOAL_GGML_TYPE_IQ1_S,   SHOAL_GGML_TYPE_MXFP4,
    SHOAL_GGML_TYPE_IQ1_M,   SHOAL_GGML_TYPE_Q4_0,    SHOAL_GGML_TYPE_Q4_1,
    SHOAL_GGML_TYPE_Q5_0,    SHOAL_GGML_TYPE_Q5_1,    SHOAL_GGML_TYPE_IQ2_XS,
    SHOAL_GGML_TYPE_IQ2_S,   SHOAL_GGML_TYPE_IQ3_S};
#define N_TYPES (sizeof types / sizeof *types)
#define N_OWN_KERNEL 3

/* ---- generators ------------------------------------------------------------ */

static uint64_t rng_state;

static void rng_seed(uint64_t s) { rng_state = s * 0x9E3779B97F4A7C15ull + 1; }

static uint32_t rng_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* uniform in [lo, hi) */
static float rng_f(float lo, float hi) { return lo + (hi - lo) * (float)(rng_u32() >> 8) / 16777216.0f; }

static void put_f16(uint8_t *p, float v)
{
    const uint16_t h = shoal_f32_to_f16(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* The f16 d of an IQ1_M block: the top nibbles of its four u16 scales */
static void put_iq1_m_d(uint8_t *blk, float v)
{
    const uint16_t h = shoal_f32_to_f16(v);
    for (int i = 0; i < 4; i++)
        blk[49 + 2 * i] = (uint8_t)((blk[49 + 2 * i] & 0x0F) | ((h >> (4 * i)) & 0x0F) << 4);
}

/* An extreme f16 block scale: 0, the largest f16, the smallest and the
 * largest subnormal */
static float extreme_f16(void)
{
    static const float v[4] = {0.0f, 65504.0f, 0x1p-24f, 0x3FFp-24f};
    return v[rng_u32() % 4];
}

/* A random matrix of type, rows x cols, with realistic scales (f16 d of a
 * few 1e-3, random codes and sub-block scales; every byte pattern of the
 * codes is a valid block). mode 1: the scales are powers of two (every
 * product exact; Q8_0, Q4_K, Q6_K only); mode 2: one block in eight gets
 * an extreme scale (extreme_f16; MXFP4 exponents 0, 1, 2, 254). Owned by
 * the caller. */
static uint8_t *make_matrix(enum shoal_ggml_type type, int64_t rows, int64_t cols, int mode,
                            size_t *bytes)
{
    const int pow2 = mode == 1;
    const struct shoal_ggml_type_info *ti = shoal_ggml_type_info(type);
    const int64_t nb = rows * (cols / ti->block_size);
    *bytes = (size_t)nb * ti->type_size;
    uint8_t *m = malloc(*bytes);
    cr_assert_not_null(m);
    for (size_t i = 0; i < *bytes; i++)
        m[i] = (uint8_t)rng_u32();
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *blk = m + (size_t)b * ti->type_size;
        const int extreme = mode == 2 && rng_u32() % 8 == 0;
        float d = pow2 ? 0x1p-8f : rng_f(0.0005f, 0.004f);
        float dmin = pow2 ? 0x1p-9f : rng_f(0.0005f, 0.004f);
        if (extreme) {
            d = extreme_f16();
            dmin = extreme_f16();
        }
        switch (type) {
        case SHOAL_GGML_TYPE_Q8_0:
            put_f16(blk, extreme ? d : d * 4);
            break;
        case SHOAL_GGML_TYPE_Q4_K:
        case SHOAL_GGML_TYPE_Q5_K:
            put_f16(blk, d);
            put_f16(blk + 2, dmin);
            if (pow2)   /* every sc and m <= 7 (see the exact test) */
                for (int k = 0; k < 12; k++)
                    blk[4 + k] &= k < 8 ? 0x07 : 0x77;
            break;
        case SHOAL_GGML_TYPE_Q6_K:   /* int8 sub-block scales, full range kept (-128 included) */
            put_f16(blk + 208, d);
            if (pow2)   /* sc in [-4, 3] */
                for (int k = 0; k < 16; k++)
                    blk[192 + k] = (uint8_t)((int)(rng_u32() % 8) - 4);
            break;
        case SHOAL_GGML_TYPE_Q2_K:
            put_f16(blk + 80, d);
            put_f16(blk + 82, dmin);
            break;
        case SHOAL_GGML_TYPE_Q3_K:
            put_f16(blk + 108, d);
            break;
        case SHOAL_GGML_TYPE_Q4_1:
        case SHOAL_GGML_TYPE_Q5_1:   /* m: the block's minimum, negative */
            put_f16(blk, d);
            put_f16(blk + 2, extreme ? dmin : -8 * dmin);
            break;
        case SHOAL_GGML_TYPE_IQ1_M:
            put_iq1_m_d(blk, d);
            break;
        case SHOAL_GGML_TYPE_MXFP4:   /* 2^(e - 128): weights up to 12 * 2^-7 */
            blk[0] = extreme ? (uint8_t)((const int[]){0, 1, 2, 254}[rng_u32() % 4])
                             : (uint8_t)(115 + rng_u32() % 6);
            break;
        default:   /* d f16 at 0: Q4_0, Q5_0, IQ4_NL, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S,
                      IQ3_XXS, IQ3_S, IQ1_S */
            put_f16(blk, d);
            break;
        }
    }
    return m;
}

/* x [n_tok][n]: per 32 columns a random magnitude (1e-3 .. 10), one block
 * of 32 all zeros in token 0 (dx = 0). grid: every value k * 2^-3 with
 * |k| <= 127 and each 32 columns holding a 127 * 2^-3, so dx = 2^-3 and
 * qx = k exactly. */
static float *make_x(int64_t n_tok, int64_t n, int grid)
{
    float *x = malloc((size_t)(n_tok * n) * sizeof *x);
    cr_assert_not_null(x);
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t i0 = 0; i0 < n; i0 += 32) {
            const float mag = powf(10.0f, rng_f(-3.0f, 1.0f));
            for (int64_t i = i0; i < i0 + 32; i++) {
                if (grid)
                    x[t * n + i] = (i % 32 == 5) ? 127 * 0.125f
                                                  : (float)((int)(rng_u32() % 255) - 127) * 0.125f;
                else
                    x[t * n + i] = (t == 0 && i0 == 32) ? 0.0f : rng_f(-mag, mag);
            }
        }
    return x;
}

/* ---- references -------------------------------------------------------------- */

struct act_buf {
    struct shoal_ggml_act a;
    void *mem;
};

static void act_make(struct act_buf *ab, enum shoal_ggml_type type, const float *x, int64_t n_tok,
                     int64_t n)
{
    const size_t tb = shoal_ggml_act_bytes(type, n);
    cr_assert(tb > 0);
    ab->mem = aligned_alloc(64, (tb * (size_t)n_tok + 63) & ~(size_t)63);
    cr_assert_not_null(ab->mem);
    shoal_ggml_act_init(&ab->a, type, n, n_tok, ab->mem);
    shoal_ggml_act_quantize(&ab->a, x, n_tok);
}

/* sum_i W_i * X_i in float64, W from ggml_dequant, X_i = dx * qx_i;
 * *mag = the same sum of |W_i X_i| */
static double ref64(const struct shoal_ggml_act *a, int64_t it, const void *row, double *mag)
{
    float *w = malloc((size_t)a->n * sizeof *w);
    cr_assert_not_null(w);
    cr_assert(eq(int, shoal_ggml_dequant_row(a->type, row, w, (uint64_t)a->n, NULL), 0));
    const int64_t B = a->n / a->n_blk;
    double s = 0, m = 0;
    for (int64_t i = 0; i < a->n; i++) {
        const double xi = (double)a->d[it * a->n_blk + i / B] * a->q[it * a->n + i];
        s += (double)w[i] * xi;
        m += fabs((double)w[i] * xi);
    }
    free(w);
    *mag = m;
    return s;
}

/* |S - R| bound for the scalar S against ref64's R, with u = 2^-24 and E
 * the exact value of the canonical formula (exact integer sums, exact
 * real products):
 *  - R vs E: the dequantized weights W are exact for Q8_0 (8-bit q times
 *    an 11-bit d) and round once for Q4_K ((d*sc)*q - dmin*m) and Q6_K
 *    ((d*sc)*(q-32)), so |R - E| <= u * mag, mag = sum_i |W_i X_i|;
 *  - S vs E, per block: A_b = (d*dx)*(float)isum is three roundings,
 *    B_b = (dmin*dx)*(float)msum two (msum < 2^24 is exact), A_b - B_b
 *    one more: at most 4u (|A_b| + |B_b|) to first order; the chain's
 *    n_blk - 1 adds each within u of a partial sum <= tmag =
 *    sum_b (|A_b| + |B_b|). So |S - E| <= (n_blk + 3) u tmag.
 *  - tmag: for the types without a min |A_b| <= its block's sum of
 *    |W X| (B = 0); for those with one (Q4_K, Q5_K, Q2_K, Q4_1, Q5_1) A's
 *    weights are W + DMIN*m, so tmag <= mag + 2 * mins with
 *    mins = sum |DMIN m_j X_i|.
 *  - the other types' W are exact or round once as Q4_K's: the products
 *    of an f16 d, a scale of at most 6 bits and a code of at most 7 bits
 *    fit f32's 24 (ggml_dequant.c's formulas).
 * The bound is u * (mag + (n_blk + 4) * tmag) (one n_blk of slack for
 * second-order terms and float64's own rounding). */
static double ref_bound(const struct shoal_ggml_act *a, int64_t it, const void *row, double mag)
{
    const double u = ldexp(1.0, -24);
    double tmag = mag;
    if (a->type == SHOAL_GGML_TYPE_Q4_K) {
        /* the min term of each block separately: sum |dmin * m_j * X| */
        const uint8_t *p = row;
        double mins = 0;
        for (int64_t b = 0; b < a->n_blk; b++, p += 144) {
            const float dmin = shoal_f16_to_f32((uint16_t)(p[2] | p[3] << 8));
            for (int j = 0; j < 8; j++) {
                const int m = j < 4 ? p[4 + j + 4] & 63 : (p[4 + j + 4] >> 4) | (p[4 + j] >> 6) << 4;
                for (int l = 0; l < 32; l++)
                    mins += fabs((double)dmin * m * a->d[it * a->n_blk + b] *
                                 a->q[it * a->n + 256 * b + 32 * j + l]);
            }
        }
        tmag = mag + 2 * mins;   /* |A| <= |W X| + |B| */
    } else if (shoal_ggml_iform(a->type)) {
        const struct shoal_ggml_type_info *ti = shoal_ggml_type_info(a->type);
        const int64_t B = ti->block_size;
        const uint8_t *p = row;
        double mins = 0;
        for (int64_t b = 0; b < a->n_blk; b++, p += ti->type_size) {
            struct shoal_ggml_iblock ib;
            shoal_ggml_iblock_decode(a->type, p, &ib);
            for (int64_t i = 0; i < B; i++)
                mins += fabs((double)ib.dmin * ib.m[i / 16] * a->d[it * a->n_blk + b] *
                             a->q[it * a->n + B * b + i]);
        }
        tmag = mag + 2 * mins;
    }
    return u * (mag + (double)(a->n_blk + 4) * tmag);
}

/* One test case: a random matrix, its tokens, their quantized activations */
struct gcase {
    uint8_t *w;                 /* [rows] rows of rb bytes, owned */
    size_t bytes, rb;
    float *x;                   /* [n_tok][n], owned */
    struct act_buf ab;          /* x quantized for w's type */
    struct shoal_ggml_matrix m;
};

/* mode: make_matrix's (1 also makes grid activations) */
static void case_make(struct gcase *c, enum shoal_ggml_type type, int64_t rows, int64_t n,
                      int64_t n_tok, uint64_t seed, int mode)
{
    rng_seed(seed);
    c->w = make_matrix(type, rows, n, mode, &c->bytes);
    c->rb = c->bytes / (size_t)rows;
    c->x = make_x(n_tok, n, mode == 1);
    act_make(&c->ab, type, c->x, n_tok, n);
    c->m = (struct shoal_ggml_matrix){type, rows, n, c->w};
}

static void case_free(struct gcase *c)
{
    free(c->ab.mem);
    free(c->x);
    free(c->w);
}

/* ---- (a) scalar reference against float64 ----------------------------------- */

Test(ggml_dot, scalar_dot_within_derived_bound_of_float64)
{
    const int64_t cols[] = {256, 512, 2304};
    for (size_t ti = 0; ti < N_TYPES; ti++)
        for (size_t ci = 0; ci < 3; ci++) {
            const uint64_t seed = 100 + 10 * ti + ci;
            const int64_t n = cols[ci], rows = 9, n_tok = 3;
            struct gcase c;
            case_make(&c, types[ti], rows, n, n_tok, seed, 0);
            int inexact = 0;
            for (int64_t t = 0; t < n_tok; t++)
                for (int64_t r = 0; r < rows; r++) {
                    const uint8_t *row = c.w + (size_t)r * c.rb;
                    double mag;
                    const double want = ref64(&c.ab.a, t, row, &mag);
                    const float got = shoal_ggml_dot(&c.ab.a, t, row);
                    const double bound = ref_bound(&c.ab.a, t, row, mag);
                    cr_assert(fabs((double)got - want) <= bound,
                              "%s cols %lld seed %llu t %lld r %lld: got %.9g want %.9g "
                              "diff %.3g > bound %.3g",
                              shoal_ggml_type_name(types[ti]), (long long)n,
                              (unsigned long long)seed, (long long)t, (long long)r, got, want,
                              fabs((double)got - want), bound);
                    cr_assert(mag > 0, "generator: a row/token with all-zero products");
                    inexact += (double)got != want;
                }
            /* the generator makes sums that do round (the bound is exercised) */
            cr_assert(inexact > 0, "%s cols %lld: every dot exact", shoal_ggml_type_name(types[ti]),
                      (long long)n);
            case_free(&c);
        }
}

Test(ggml_dot, scalar_dot_exact_when_every_step_is_exact)
{
    /* power-of-two scales and grid activations (dx = 2^-3, qx = k): each
     * weight and term is a short dyadic number and every partial sum fits
     * f32's 24 bits, so the scalar order and float64 give the same value
     * (Q8_0, Q4_K, Q6_K: their generator keeps the sums that small) */
    for (size_t ti = 0; ti < N_OWN_KERNEL; ti++) {
        const uint64_t seed = 200 + ti;
        const int64_t n = 512, rows = 5, n_tok = 2;
        struct gcase c;
        case_make(&c, types[ti], rows, n, n_tok, seed, 1);
        for (int64_t b = 0; b < c.ab.a.n_blk; b++)
            cr_assert(eq(flt, c.ab.a.d[b], 0.125f), "generator: dx %g", c.ab.a.d[b]);
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t r = 0; r < rows; r++) {
                double mag;
                const double want = ref64(&c.ab.a, t, c.w + (size_t)r * c.rb, &mag);
                const float got = shoal_ggml_dot(&c.ab.a, t, c.w + (size_t)r * c.rb);
                cr_assert(eq(dbl, (double)got, want), "%s seed %llu t %lld r %lld",
                          shoal_ggml_type_name(types[ti]), (unsigned long long)seed,
                          (long long)t, (long long)r);
                cr_assert(want != 0.0, "generator: zero dot");
            }
        case_free(&c);
    }
}

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* ---- (b) every ISA, thread split and batch: the scalar reference's bits ------ */

static const struct {
    enum shoal_quant_isa isa;
    const char *name;
} isas[] = {
    {SHOAL_QUANT_ISA_SCALAR, "scalar"},   {SHOAL_QUANT_ISA_AVX2, "avx2"},
    {SHOAL_QUANT_ISA_AVX512, "avx512"},   {SHOAL_QUANT_ISA_AVX512BW, "avx512bw"},
    {SHOAL_QUANT_ISA_NEON, "neon"},       {SHOAL_QUANT_ISA_NEON_DOTPROD, "neon-dotprod"},
    {SHOAL_QUANT_ISA_NEON_I8MM, "neon-i8mm"},
};

Test(ggml_dot, every_isa_thread_split_and_batch_gives_the_reference_bits, .timeout = 120)
{
    const int64_t cols[] = {256, 512, 2048 + 256};
    const int64_t rows_list[] = {1, 7, 37};
    /* 65: a second tile of one token (the one-token path past token 0);
     * 5, 6, 7: the AVX2 GEMM's groups of four tokens and a remainder of 1,
     * 2, 3; 48: Q6_K's first GEMM batch (below it, rows8_t) */
    const int64_t toks[] = {1, 2, 5, 6, 7, 48, 64, 65, 70};
    int checked_isas = 0;
    for (size_t ii = 0; ii < sizeof isas / sizeof *isas; ii++) {
        if (shoal_quant_init(isas[ii].isa, NULL) != 0) {
            cr_log_info("ggml_dot: %s not built or not on this CPU, skipped", isas[ii].name);
            continue;
        }
        checked_isas++;
        /* every SIMD table has its own rows (else this loop would only
         * check the scalar fallback again) */
        if (isas[ii].isa != SHOAL_QUANT_ISA_SCALAR)
            cr_assert(shoal_quant_active_ops()->ggml_rows != NULL, "%s: no ggml_rows",
                      isas[ii].name);
        for (size_t ti = 0; ti < N_TYPES; ti++)
            for (size_t ci = 0; ci < 3; ci++)
                for (size_t ri = 0; ri < 3; ri++) {
                    const uint64_t seed = 1000 + 100 * ti + 10 * ci + ri;
                    /* blocks of 32: the last width one block more, an odd count
                     * (73: the two-block Q4_0 rows' last single block) */
                    const int64_t odd =
                        ci == 2 && shoal_ggml_type_info(types[ti])->block_size == 32 ? 32 : 0;
                    const int64_t n = cols[ci] + odd, rows = rows_list[ri], max_tok = 70;
                    struct gcase c;
                    case_make(&c, types[ti], rows, n, max_tok, seed, 2);   /* extremes */
                    cr_assert(eq(int, shoal_ggml_matrix_check(&c.m, c.bytes, NULL), 0));
                    /* the reference: shoal_ggml_dot of each (token, row) */
                    float *want = malloc((size_t)(max_tok * rows) * sizeof *want);
                    float *got = malloc((size_t)(max_tok * rows) * sizeof *got);
                    cr_assert(want && got);
                    for (int64_t t = 0; t < max_tok; t++)
                        for (int64_t r = 0; r < rows; r++)
                            want[t * rows + r] = shoal_ggml_dot(&c.ab.a, t, c.w + (size_t)r * c.rb);
                    for (size_t ki = 0; ki < sizeof toks / sizeof *toks; ki++)
                        for (int nth = 1; nth <= 2; nth++) {
                            const int64_t nt = toks[ki];
                            memset(got, 0xff, (size_t)(nt * rows) * sizeof *got);
                            for (int ith = 0; ith < nth; ith++)
                                shoal_ggml_linear_part(got, c.x, nt, &c.m, ith, nth);
                            for (int64_t e = 0; e < nt * rows; e++) {
                                cr_assert(eq(u32, bits(got[e]), bits(want[e])),
                                          "%s %s cols %lld rows %lld n_tok %lld nth %d seed "
                                          "%llu: y[%lld][%lld] = %.9g, reference %.9g",
                                          isas[ii].name, shoal_ggml_type_name(types[ti]),
                                          (long long)n, (long long)rows, (long long)nt, nth,
                                          (unsigned long long)seed, (long long)(e / rows),
                                          (long long)(e % rows), got[e], want[e]);
                            }
                        }
                    free(got);
                    free(want);
                    case_free(&c);
                }
    }
    cr_assert(checked_isas >= 1);
    shoal_quant_init(SHOAL_QUANT_ISA_SCALAR, NULL);
}

/* Bit-exact: the AVX2 GEMM sums runs of vpmaddubsw pairs in int16 (Q4_K:
 * a sub-block of 32, at most 16 * 15 * 127 = 30480; Q6_K: 8 codes q + 32,
 * at most 4 * 63 * 127 = 32004; Q4_0: a block of 32, 30480, and its
 * one-token rows two blocks' pairs, 2 * 2 * 15 * 127 = 7620; MXFP4: half a
 * block of codes + 12, 8 * 24 * 127 = 24384; Q8_0's GEMM, vpdpbusd only,
 * codes + 128 from 0 to 255). Every code and scale at its
 * maximum against qx all 127 or all -127 is the worst case of those
 * bounds; one token and 64. */
Test(ggml_dot, saturated_codes_and_activations_give_the_reference_bits)
{
    const enum shoal_ggml_type types2[] = {
        SHOAL_GGML_TYPE_Q4_K, SHOAL_GGML_TYPE_Q6_K, SHOAL_GGML_TYPE_Q4_0,
        SHOAL_GGML_TYPE_MXFP4, SHOAL_GGML_TYPE_Q8_0, SHOAL_GGML_TYPE_Q4_1,
        SHOAL_GGML_TYPE_Q5_0, SHOAL_GGML_TYPE_Q5_1, SHOAL_GGML_TYPE_IQ4_NL,
        SHOAL_GGML_TYPE_Q5_K};
    const int64_t rows = 9, n = 512, n_tok = 64;   /* 9: a group of 8 and one row */
    for (size_t ii = 0; ii < sizeof isas / sizeof *isas; ii++) {
        if (shoal_quant_init(isas[ii].isa, NULL) != 0)
            continue;
        for (size_t ti = 0; ti < sizeof types2 / sizeof *types2; ti++)
            for (int sign = -1; sign <= 1; sign += 2) {
                const struct shoal_ggml_type_info *info = shoal_ggml_type_info(types2[ti]);
                const size_t rb = (size_t)(n / info->block_size) * info->type_size;
                uint8_t *w = malloc((size_t)rows * rb);
                float *x = malloc((size_t)(n_tok * n) * sizeof *x);
                float *got = malloc((size_t)(n_tok * rows) * sizeof *got);
                void *buf = malloc((size_t)n_tok * shoal_ggml_act_bytes(types2[ti], n));
                cr_assert(w && x && got && buf);
                memset(w, 0xFF, (size_t)rows * rb);   /* codes 15 / 63, sc and m 63 (Q6_K sc -1) */
                for (size_t o = 0; o < (size_t)rows * rb; o += info->type_size) {
                    if (types2[ti] == SHOAL_GGML_TYPE_Q4_K ||
                        types2[ti] == SHOAL_GGML_TYPE_Q5_K) {   /* Q5_K: codes 31 */
                        put_f16(w + o, 0.001f);
                        put_f16(w + o + 2, 0.002f);
                    } else if (types2[ti] == SHOAL_GGML_TYPE_Q4_0 ||
                               types2[ti] == SHOAL_GGML_TYPE_Q5_0 ||
                               types2[ti] == SHOAL_GGML_TYPE_IQ4_NL) {
                        put_f16(w + o, 0.001f);   /* codes 15, Q5_0's 31, IQ4_NL's 113 */
                    } else if (types2[ti] == SHOAL_GGML_TYPE_Q4_1 ||
                               types2[ti] == SHOAL_GGML_TYPE_Q5_1) {
                        put_f16(w + o, 0.001f);   /* codes 15, Q5_1's 31 */
                        put_f16(w + o + 2, -0.002f);
                    } else if (types2[ti] == SHOAL_GGML_TYPE_Q8_0) {
                        memset(w + o + 2, 0x80, 16);   /* codes -128 (0 + 128 unsigned) */
                        memset(w + o + 18, 0x7F, 16);  /* and 127 (255) */
                        put_f16(w + o, 0.001f);
                    } else if (types2[ti] == SHOAL_GGML_TYPE_MXFP4) {
                        memset(w + o + 1, 0x77, 16);   /* codes 7: +6, 24 with the + 12 */
                        w[o] = 120;                    /* D = 2^-8 */
                    } else {
                        memset(w + o + 192, 127, 16);   /* sc 127 */
                        put_f16(w + o + 208, 0.001f);
                    }
                }
                for (int64_t e = 0; e < n_tok * n; e++)
                    x[e] = (float)sign;   /* qx = +-127, every element */
                struct shoal_ggml_matrix m = {.type = types2[ti], .rows = rows, .cols = n, .data = w};
                struct shoal_ggml_act a;
                shoal_ggml_act_init(&a, types2[ti], n, n_tok, buf);
                shoal_ggml_act_quantize(&a, x, n_tok);
                cr_assert(eq(i8, a.q[2], (int8_t)(sign * 127)));
                for (int64_t nt = 1; nt <= n_tok; nt += n_tok - 1) {
                    shoal_ggml_linear_part(got, x, nt, &m, 0, 1);
                    for (int64_t t = 0; t < nt; t++)
                        for (int64_t r = 0; r < rows; r++) {
                            const float want = shoal_ggml_dot(&a, t, w + (size_t)r * rb);
                            cr_assert(eq(u32, bits(got[t * rows + r]), bits(want)),
                                      "%s %s sign %d, %lld tokens: y[%lld][%lld] = %.9g, "
                                      "reference %.9g", isas[ii].name,
                                      shoal_ggml_type_name(types2[ti]), sign, (long long)nt,
                                      (long long)t, (long long)r, got[t * rows + r], want);
                        }
                }
                free(buf);
                free(got);
                free(x);
                free(w);
            }
    }
    shoal_quant_init(SHOAL_QUANT_ISA_SCALAR, NULL);
}

Test(ggml_dot, linear_in_its_own_region_and_wide_rows_give_the_reference_bits)
{
    /* 65536 columns: three tokens of activations (74-82 KiB each) fill a
     * tile, so five cross one; 262144: one token does not fit the tile
     * (SHOAL_ACT_TILE_BYTES), so the driver goes row by row */
    const int64_t widths[] = {2304, 65536, 262144};
    for (int wi = 0; wi < 3; wi++)
        for (size_t ti = 0; ti < N_TYPES; ti++) {
            const uint64_t seed = 3000 + 10 * wi + ti;
            const int64_t n = widths[wi], rows = 11, n_tok = 5;
            cr_assert(wi < 2 || shoal_ggml_act_bytes(types[ti], n) > SHOAL_ACT_TILE_BYTES);
            cr_assert(wi != 1 || 3 * shoal_ggml_act_bytes(types[ti], n) <= SHOAL_ACT_TILE_BYTES);
            struct gcase c;
            case_make(&c, types[ti], rows, n, n_tok, seed, 0);
            float got[5 * 11];
            shoal_quant_init(SHOAL_QUANT_ISA_AUTO, NULL);
            cr_assert(eq(int, shoal_ggml_linear(got, c.x, n_tok, &c.m), 0));
            for (int64_t t = 0; t < n_tok; t++)
                for (int64_t r = 0; r < rows; r++) {
                    const float want = shoal_ggml_dot(&c.ab.a, t, c.w + (size_t)r * c.rb);
                    cr_assert(eq(u32, bits(got[t * rows + r]), bits(want)),
                              "%s cols %lld seed %llu (%s): y[%lld][%lld] %.9g vs %.9g",
                              shoal_ggml_type_name(types[ti]), (long long)n,
                              (unsigned long long)seed, shoal_quant_ops_name(), (long long)t,
                              (long long)r, got[t * rows + r], want);
                }
            shoal_quant_init(SHOAL_QUANT_ISA_SCALAR, NULL);
            case_free(&c);
        }
}

/* ---- (c) bad arguments are refused ------------------------------------------- */

Test(ggml_dot, bad_types_and_shapes_are_refused)
{
    uint8_t buf[4 * 210] = {0};
    float x[2 * 512] = {0}, y[16];
    struct shoal_err err = {0};

    struct shoal_ggml_matrix m = {SHOAL_GGML_TYPE_TQ2_0, 2, 256, buf};
    cr_assert(eq(int, shoal_ggml_linear(y, x, 1, &m), SHOAL_EUNSUPPORTED));
    cr_assert(eq(int, shoal_ggml_matrix_check(&m, sizeof buf, &err), SHOAL_EUNSUPPORTED));
    cr_assert(strstr(err.msg, "TQ2_0") != NULL && strstr(err.msg, "IQ2_XXS") != NULL,
              "message: %s", err.msg);

    m = (struct shoal_ggml_matrix){(enum shoal_ggml_type)4, 2, 32, buf};  /* removed id */
    cr_assert(eq(int, shoal_ggml_linear(y, x, 1, &m), SHOAL_EUNSUPPORTED));
    m = (struct shoal_ggml_matrix){(enum shoal_ggml_type)1000, 2, 32, buf};
    cr_assert(eq(int, shoal_ggml_linear(y, x, 1, &m), SHOAL_EUNSUPPORTED));

    m = (struct shoal_ggml_matrix){SHOAL_GGML_TYPE_Q4_K, 2, 100, buf};   /* not x 256 */
    cr_assert(eq(int, shoal_ggml_linear(y, x, 1, &m), SHOAL_ESHAPE));
    m = (struct shoal_ggml_matrix){SHOAL_GGML_TYPE_Q8_0, 2, 48, buf};    /* not x 32 */
    cr_assert(eq(int, shoal_ggml_linear(y, x, 1, &m), SHOAL_ESHAPE));
    m = (struct shoal_ggml_matrix){SHOAL_GGML_TYPE_Q6_K, 0, 256, buf};   /* no rows */
    cr_assert(eq(int, shoal_ggml_linear(y, x, 1, &m), SHOAL_ESHAPE));
    m = (struct shoal_ggml_matrix){SHOAL_GGML_TYPE_Q6_K, 2, -256, buf};
    cr_assert(eq(int, shoal_ggml_linear(y, x, 1, &m), SHOAL_ESHAPE));

    m = (struct shoal_ggml_matrix){SHOAL_GGML_TYPE_Q6_K, 2, 256, NULL};
    cr_assert(eq(int, shoal_ggml_linear(y, x, 1, &m), SHOAL_EINVAL));
    m = (struct shoal_ggml_matrix){SHOAL_GGML_TYPE_Q6_K, 2, 256, buf};
    cr_assert(eq(int, shoal_ggml_linear(y, x, -1, &m), SHOAL_EINVAL));
    cr_assert(eq(int, shoal_ggml_linear(NULL, x, 1, &m), SHOAL_EINVAL));
    cr_assert(eq(int, shoal_ggml_linear(y, x, 0, &m), 0));

    /* 5 rows of Q6_K need 1050 bytes; 840 are there */
    err = (struct shoal_err){0};
    m = (struct shoal_ggml_matrix){SHOAL_GGML_TYPE_Q6_K, 5, 256, buf};
    cr_assert(eq(int, shoal_ggml_matrix_check(&m, sizeof buf, &err), SHOAL_ESHAPE));
    cr_assert(strstr(err.msg, "840") != NULL, "message: %s", err.msg);
    m.rows = 4;
    cr_assert(eq(int, shoal_ggml_matrix_check(&m, sizeof buf, NULL), 0));

    cr_assert(eq(sz, shoal_ggml_act_bytes(SHOAL_GGML_TYPE_Q4_K, 100), 0));
    cr_assert(eq(sz, shoal_ggml_act_bytes(SHOAL_GGML_TYPE_TQ1_0, 256), 0));
    cr_assert(eq(sz, shoal_ggml_act_bytes(SHOAL_GGML_TYPE_Q4_1, 64), 64 + 8 + 8));
    cr_assert(eq(sz, shoal_ggml_act_bytes(SHOAL_GGML_TYPE_IQ1_S, 256), 256 + 4 + 32));
    cr_assert(eq(sz, shoal_ggml_act_bytes(SHOAL_GGML_TYPE_Q4_K, 256), 256 + 4 + 32));
    /* Q8_0, Q4_0, MXFP4, Q5_0, IQ4_NL: bsum too, for their SIMD GEMMs' offsets */
    cr_assert(eq(sz, shoal_ggml_act_bytes(SHOAL_GGML_TYPE_Q8_0, 64), 64 + 8 + 8));
    cr_assert(eq(sz, shoal_ggml_act_bytes(SHOAL_GGML_TYPE_MXFP4, 64), 64 + 8 + 8));
    cr_assert(eq(sz, shoal_ggml_act_bytes(SHOAL_GGML_TYPE_Q5_0, 64), 64 + 8 + 8));
    cr_assert(eq(sz, shoal_ggml_act_bytes(SHOAL_GGML_TYPE_IQ4_NL, 64), 64 + 8 + 8));
}

/* ---- (d) non-finite block scales are refused (shoal_ggml_check_scales) ------- */

Test(ggml_dot, every_dot_type_refuses_a_non_finite_scale)
{
    /* where each type's f16 scales are: byte offsets of d and (-1: none)
     * dmin / m; IQ1_M's d is spread over four nibbles, MXFP4's is E8M0 */
    static const struct {
        enum shoal_ggml_type type;
        int off[2];
        const char *name[2];
    } cases[] = {
        {SHOAL_GGML_TYPE_Q8_0, {0, -1}, {"d"}},     {SHOAL_GGML_TYPE_Q4_K, {0, 2}, {"d", "dmin"}},
        {SHOAL_GGML_TYPE_Q6_K, {208, -1}, {"d"}},   {SHOAL_GGML_TYPE_Q5_K, {0, 2}, {"d", "dmin"}},
        {SHOAL_GGML_TYPE_Q2_K, {80, 82}, {"d", "dmin"}}, {SHOAL_GGML_TYPE_Q3_K, {108, -1}, {"d"}},
        {SHOAL_GGML_TYPE_IQ4_XS, {0, -1}, {"d"}},   {SHOAL_GGML_TYPE_IQ4_NL, {0, -1}, {"d"}},
        {SHOAL_GGML_TYPE_IQ2_XXS, {0, -1}, {"d"}},  {SHOAL_GGML_TYPE_IQ3_XXS, {0, -1}, {"d"}},
        {SHOAL_GGML_TYPE_IQ1_S, {0, -1}, {"d"}},    {SHOAL_GGML_TYPE_Q4_0, {0, -1}, {"d"}},
        {SHOAL_GGML_TYPE_Q5_0, {0, -1}, {"d"}},     {SHOAL_GGML_TYPE_Q4_1, {0, 2}, {"d", "m"}},
        {SHOAL_GGML_TYPE_Q5_1, {0, 2}, {"d", "m"}},   {SHOAL_GGML_TYPE_IQ2_XS, {0, -1}, {"d"}},
        {SHOAL_GGML_TYPE_IQ2_S, {0, -1}, {"d"}},    {SHOAL_GGML_TYPE_IQ3_S, {0, -1}, {"d"}},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const enum shoal_ggml_type type = cases[ci].type;
        const char *tn = shoal_ggml_type_name(type);
        size_t bytes;
        rng_seed(4000 + ci);
        uint8_t *m = make_matrix(type, 1, 4 * shoal_ggml_type_info(type)->block_size, 0, &bytes);
        const size_t ts = shoal_ggml_type_info(type)->type_size;
        cr_assert(eq(int, shoal_ggml_check_scales(type, m, 4, "w", 0, NULL), 0), "%s", tn);
        for (int k = 0; k < 2 && cases[ci].off[k] >= 0; k++) {
            static const uint16_t bad[3] = {0x7C00, 0xFC00, 0x7E00};   /* inf, -inf, NaN */
            for (int bi = 0; bi < 3; bi++) {
                uint8_t *p = m + 2 * ts + (size_t)cases[ci].off[k];
                const uint8_t save[2] = {p[0], p[1]};
                p[0] = (uint8_t)bad[bi];
                p[1] = (uint8_t)(bad[bi] >> 8);
                struct shoal_err err = {0};
                cr_assert(eq(int, shoal_ggml_check_scales(type, m, 4, "blk.0.w", 10, &err),
                             SHOAL_EFORMAT), "%s %s 0x%04x", tn, cases[ci].name[k], bad[bi]);
                char want[64];
                snprintf(want, sizeof want, "%s block 12 has scale %s = ", tn, cases[ci].name[k]);
                cr_assert(strstr(err.msg, want) && strstr(err.msg, "blk.0.w"), "message: %s",
                          err.msg);
                p[0] = save[0];
                p[1] = save[1];
            }
        }
        free(m);
    }
    /* IQ1_M: d from the top nibbles of the four u16 at 48 */
    size_t bytes;
    uint8_t *m = make_matrix(SHOAL_GGML_TYPE_IQ1_M, 1, 512, 0, &bytes);
    cr_assert(eq(int, shoal_ggml_check_scales(SHOAL_GGML_TYPE_IQ1_M, m, 2, "w", 0, NULL), 0));
    put_iq1_m_d(m + 56, INFINITY);
    struct shoal_err err = {0};
    cr_assert(eq(int, shoal_ggml_check_scales(SHOAL_GGML_TYPE_IQ1_M, m, 2, "w", 0, &err),
                 SHOAL_EFORMAT));
    cr_assert(strstr(err.msg, "IQ1_M block 1 has scale d = inf") != NULL, "message: %s", err.msg);
    free(m);
    /* MXFP4: exponent 255 is E8M0's NaN; 254 is a (huge) finite scale */
    uint8_t mx[3 * 17] = {0};
    mx[0] = 254;
    cr_assert(eq(int, shoal_ggml_check_scales(SHOAL_GGML_TYPE_MXFP4, mx, 3, "w", 0, NULL), 0));
    mx[2 * 17] = 255;
    err = (struct shoal_err){0};
    cr_assert(eq(int, shoal_ggml_check_scales(SHOAL_GGML_TYPE_MXFP4, mx, 3, "w", 0, &err),
                 SHOAL_EFORMAT));
    cr_assert(strstr(err.msg, "MXFP4 block 2 has scale e = 255") != NULL, "message: %s", err.msg);
}

/* The activation blocks are quantized by the active table's build of the
 * INT8 rule (quant.h act_group): the AVX2 build must give the baseline's
 * bytes, d and sum for every block, extremes included (zero, subnormal,
 * huge, infinite and NaN elements, a block of zeros). */
Test(ggml_dot, act_group_builds_give_the_same_bytes)
{
    if (shoal_quant_init(SHOAL_QUANT_ISA_AVX2, NULL) != 0) {
        cr_log_info("ggml_dot: avx2 not built or not on this CPU, act_group not compared");
        return;
    }
    int32_t (*group)(const float *, int64_t, float *, int8_t *) =
        shoal_quant_active_ops()->act_group;
    cr_assert(group != NULL, "the avx2 table has no act_group");
    const int64_t lens[] = {32, 256};
    for (int seed = 0; seed < 200; seed++) {
        rng_seed(7000 + (uint64_t)seed);
        const int64_t len = lens[seed % 2];
        float x[256];
        const float mag = seed % 5 == 0 ? 1e-40f : seed % 5 == 1 ? 3e38f : rng_f(1e-3f, 1e3f);
        for (int64_t k = 0; k < len; k++)
            x[k] = seed % 17 == 3 ? 0.0f : rng_f(-mag, mag);
        if (seed % 11 == 4)
            x[rng_u32() % len] = INFINITY;
        if (seed % 13 == 5)
            x[rng_u32() % len] = NAN;
        float d0, d1;
        int8_t q0[256], q1[256];
        const int32_t s0 = shoal_quant_act_group_base(x, len, &d0, q0);
        const int32_t s1 = group(x, len, &d1, q1);
        cr_assert(eq(i32, s0, s1), "seed %d: sum %d, base %d", seed, s1, s0);
        cr_assert(eq(u32, bits(d0), bits(d1)), "seed %d: d %.9g, base %.9g", seed, d1, d0);
        cr_assert(eq(int, memcmp(q0, q1, (size_t)len), 0), "seed %d: q bytes differ", seed);
    }
    shoal_quant_init(SHOAL_QUANT_ISA_SCALAR, NULL);
}
