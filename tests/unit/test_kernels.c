#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "expert_ffn.h"
#include "kernels.h"
#include "kv.h"
#include "quant.h"
#include "tensor.h"

/* xorshift32 in [-1, 1): fixed seed, checked to be non-degenerate */
static float frand(uint32_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return (float)((double)*s / 4294967296.0 * 2.0 - 1.0);
}

static void fill(float *x, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        x[i] = frand(&seed);
    /* the generator must not produce constant data */
    cr_assert(n < 2 || x[0] != x[1]);
}

Test(kernels, dot_matches_double_reference_for_odd_sizes)
{
    const int64_t sizes[] = {1, 7, 8, 9, 63, 1000, 1031};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int64_t n = sizes[k];
        float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
        fill(a, (size_t)n, 11u + (uint32_t)n);
        fill(b, (size_t)n, 97u + (uint32_t)n);
        double ref = 0;
        for (int64_t i = 0; i < n; i++)
            ref += (double)a[i] * b[i];
        float got = shoal_dot_f32(a, b, n);
        cr_assert(fabs(got - ref) <= 1e-5 * (1 + fabs(ref)) * sqrt((double)n),
                  "n=%lld got %.9g want %.9g", (long long)n, got, ref);
        free(a);
        free(b);
    }
}

Test(kernels, dot_uses_the_documented_lane_order)
{
    /* values chosen so that summation order changes the float result */
    float a[9] = {1e8f, 1, -1e8f, 1, 3, 1, 5, 1, 0.5f};
    float b[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    float s[8];
    for (int j = 0; j < 8; j++)
        s[j] = a[j] * b[j];
    s[0] += a[8] * b[8];
    float want = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
    float got = shoal_dot_f32(a, b, 9);
    cr_assert(eq(int, memcmp(&got, &want, sizeof got), 0), "got %.9g want %.9g", got, want);
}

Test(kernels, linear_bits_do_not_depend_on_thread_count)
{
    const int64_t rows = 37, cols = 45, n = 5;
    float *w = malloc(rows * cols * 4), *x = malloc(n * cols * 4), *bias = malloc(rows * 4);
    fill(w, rows * cols, 3);
    fill(x, n * cols, 5);
    fill(bias, rows, 7);
    struct shoal_weight W = {.dtype = SHOAL_DTYPE_F32, .data = w, .rows = rows, .cols = cols};
    struct shoal_weight B = {.dtype = SHOAL_DTYPE_F32, .data = bias, .rows = 1, .cols = rows};
    float *y1 = malloc(n * rows * 4), *y3 = malloc(n * rows * 4);
    omp_set_num_threads(1);
    shoal_linear(y1, x, n, &W, &B);
    omp_set_num_threads(3);
    shoal_linear(y3, x, n, &W, &B);
    cr_assert(eq(int, memcmp(y1, y3, n * rows * 4), 0));
    /* and the values are the dot products */
    for (int64_t t = 0; t < n; t++)
        for (int64_t r = 0; r < rows; r++) {
            double ref = bias[r];
            for (int64_t c = 0; c < cols; c++)
                ref += (double)x[t * cols + c] * w[r * cols + c];
            cr_assert(fabs(y1[t * rows + r] - ref) < 1e-4);
        }
    free(w); free(x); free(bias); free(y1); free(y3);
}

Test(kernels, bf16_weights_equal_their_f32_expansion_bit_for_bit)
{
    const int64_t rows = 9, cols = 33;
    float *w = malloc(rows * cols * 4), *x = malloc(cols * 4);
    uint16_t *wb = malloc(rows * cols * 2);
    fill(w, rows * cols, 17);
    fill(x, cols, 19);
    for (int64_t i = 0; i < rows * cols; i++) {
        wb[i] = shoal_f32_to_bf16(w[i]);
        w[i] = shoal_bf16_to_f32(wb[i]);
    }
    struct shoal_weight Wf = {.dtype = SHOAL_DTYPE_F32, .data = w, .rows = rows, .cols = cols};
    struct shoal_weight Wb = {.dtype = SHOAL_DTYPE_BF16, .data = wb, .rows = rows, .cols = cols};
    float yf[9], yb[9];
    shoal_linear(yf, x, 1, &Wf, NULL);
    shoal_linear(yb, x, 1, &Wb, NULL);
    cr_assert(eq(int, memcmp(yf, yb, sizeof yf), 0));
    free(w); free(x); free(wb);
}

/* The dense linear of F32 / F16 / BF16 weights (the KV scores kernel of the
 * active table, kv.h, in row tiles) gives shoal_dot_f32's bits for every
 * token of a batch, in every table this machine runs, at any batch size,
 * row length (tails, a row over the 64 KiB tile) and thread count. */
Test(kernels, float_linears_give_the_canonical_dot_in_every_table)
{
    const enum shoal_dtype types[] = {SHOAL_DTYPE_F32, SHOAL_DTYPE_F16, SHOAL_DTYPE_BF16};
    const enum shoal_kv_isa isas[] = {SHOAL_KV_ISA_SCALAR, SHOAL_KV_ISA_AVX2, SHOAL_KV_ISA_NEON};
    const int64_t colss[] = {1, 7, 45, 300, 17000};
    const int64_t rows = 13;
    int ran = 0;
    for (size_t ii = 0; ii < sizeof isas / sizeof isas[0]; ii++) {
        if (shoal_kv_init(isas[ii], NULL) != 0)
            continue;   /* not this CPU */
        ran++;
        for (size_t ti = 0; ti < 3; ti++)
            for (size_t ci = 0; ci < sizeof colss / sizeof colss[0]; ci++) {
                const int64_t cols = colss[ci], n_tok = 9;
                const size_t es = shoal_dtype_size(types[ti]);
                float *wf = malloc((size_t)(rows * cols) * 4);
                float *x = malloc((size_t)(n_tok * cols) * 4);
                void *w = malloc((size_t)(rows * cols) * es);
                fill(wf, (size_t)(rows * cols), 23u + (uint32_t)cols);
                fill(x, (size_t)(n_tok * cols), 29u + (uint32_t)cols);
                for (int64_t i = 0; i < rows * cols; i++) {
                    if (types[ti] == SHOAL_DTYPE_F16)
                        ((uint16_t *)w)[i] = shoal_f32_to_f16(wf[i]);
                    else if (types[ti] == SHOAL_DTYPE_BF16)
                        ((uint16_t *)w)[i] = shoal_f32_to_bf16(wf[i]);
                    else
                        ((float *)w)[i] = wf[i];
                }
                shoal_to_f32(wf, w, types[ti], (size_t)(rows * cols));
                struct shoal_weight W = {.dtype = types[ti], .data = w, .rows = rows,
                                         .cols = cols};
                float *y = malloc((size_t)(n_tok * rows) * 4);
                for (int64_t nt = 1; nt <= n_tok; nt += 3)
                    for (int th = 1; th <= 2; th++) {
                        omp_set_num_threads(th);
                        memset(y, 0xff, (size_t)(n_tok * rows) * 4);
                        shoal_linear(y, x, nt, &W, NULL);
                        for (int64_t t = 0; t < nt; t++)
                            for (int64_t r = 0; r < rows; r++) {
                                const float want =
                                    shoal_dot_f32(x + t * cols, wf + r * cols, cols);
                                cr_assert(eq(int, memcmp(&y[t * rows + r], &want, 4), 0),
                                          "table %d dtype %d cols %lld tokens %lld row %lld",
                                          (int)isas[ii], (int)types[ti], (long long)cols,
                                          (long long)nt, (long long)r);
                            }
                    }
                free(wf); free(x); free(w); free(y);
            }
    }
    cr_assert(ran >= 2, "the scalar table and this CPU's SIMD table both ran");
    shoal_kv_init(SHOAL_KV_ISA_AUTO, NULL);
}

Test(kernels, f16_and_bf16_conversions_are_exact)
{
    cr_assert(eq(flt, shoal_f16_to_f32(0x3c00), 1.0f));
    cr_assert(eq(flt, shoal_f16_to_f32(0xc000), -2.0f));
    cr_assert(eq(flt, shoal_f16_to_f32(0x7bff), 65504.0f));
    cr_assert(eq(flt, shoal_f16_to_f32(0x0001), ldexpf(1.0f, -24)));
    cr_assert(isinf(shoal_f16_to_f32(0x7c00)));
    cr_assert(isnan(shoal_f16_to_f32(0x7e00)));
    cr_assert(eq(u16, shoal_f32_to_bf16(1.0f), 0x3f80));
    /* round to nearest even: 1 + 2^-8 is a tie between 0x3f80 and 0x3f81 */
    cr_assert(eq(u16, shoal_f32_to_bf16(1.0f + ldexpf(1.0f, -8)), 0x3f80));
    cr_assert(eq(u16, shoal_f32_to_bf16(1.0f + 3 * ldexpf(1.0f, -8)), 0x3f82));
}

Test(kernels, rmsnorm_matches_definition)
{
    float x[6] = {1, -2, 3, 0.5f, -0.25f, 4}, w[6] = {1, 2, 0.5f, 1, 1, -1}, y[6];
    struct shoal_weight W = {.dtype = SHOAL_DTYPE_F32, .data = w, .rows = 1, .cols = 6};
    shoal_rmsnorm(y, x, 1, 6, &W, 1e-6f);
    double ss = 0;
    for (int i = 0; i < 6; i++)
        ss += x[i] * x[i];
    double inv = 1.0 / sqrt(ss / 6 + 1e-6);
    for (int i = 0; i < 6; i++)
        cr_assert(fabs(y[i] - w[i] * x[i] * inv) < 1e-6, "i=%d", i);
}

Test(kernels, softmax_sums_to_one_and_is_shift_invariant)
{
    float a[4] = {1, 2, 3, 4}, b[4] = {1001, 1002, 1003, 1004};
    shoal_softmax(a, 4);
    shoal_softmax(b, 4);
    float s = a[0] + a[1] + a[2] + a[3];
    cr_assert(fabs(s - 1.0f) < 1e-6);
    for (int i = 0; i < 4; i++)
        cr_assert(fabs(a[i] - b[i]) < 1e-6);
    cr_assert(a[3] > a[2] && a[2] > a[1]);
}

/* ---- shoal_expert_ffn_batch ------------------------------------------------ */

/* xorshift32 in [-1, 1) */
static float ffn_rand(uint32_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return (float)((double)*s / 4294967296.0 * 2.0 - 1.0);
}

/* bit-exact: a batch of experts (decode's shape: equal jobs, which threads
 * may run whole; uneven ones, which threads run whole when no job holds
 * more than a thread's share of the rows, and split by rows otherwise, as
 * the first jobs of the uneven shape do) gives the bytes
 * of one shoal_expert_ffn per expert on one thread, at 1, 2 and 3 threads,
 * for int4, int4a8 and f32 experts; int4a8's single experts are also
 * checked against shoal_quant_dot_a8 row by row (gate and up share one
 * quantized input there, which must change nothing) */
Test(kernels, expert_ffn_batch_equals_single_experts_at_any_thread_count)
{
    enum { N_EMBD = 256, N_FF = 160, N_EXP = 6 };
    const enum shoal_dtype dtypes[] = {SHOAL_DTYPE_INT4, SHOAL_DTYPE_INT4A8, SHOAL_DTYPE_F32};
    static const char *const names[] = {"int4", "int4a8", "f32"};
    for (size_t id = 0; id < 3; id++) {
        const enum shoal_dtype dt = dtypes[id];
        struct shoal_expert_weights w[N_EXP];
        memset(w, 0, sizeof w);
        void *blobs[N_EXP][3];
        uint32_t seed = 11 + (uint32_t)id;
        for (int e = 0; e < N_EXP; e++) {
            struct shoal_weight *m[3] = {&w[e].w_gate, &w[e].w_up, &w[e].w_down};
            for (int k = 0; k < 3; k++) {
                const int64_t rows = k < 2 ? N_FF : N_EMBD, cols = k < 2 ? N_EMBD : N_FF;
                float *f = malloc((size_t)(rows * cols) * sizeof(float));
                for (int64_t i = 0; i < rows * cols; i++)
                    f[i] = ffn_rand(&seed) * 0.2f;
                if (dt != SHOAL_DTYPE_F32) {
                    const size_t b = shoal_quant_matrix_bytes(SHOAL_QUANT_INT4, rows, cols, 32);
                    blobs[e][k] = malloc(b);
                    cr_assert(eq(int, shoal_quant_quantize_matrix(SHOAL_QUANT_INT4, 32, blobs[e][k], b, f,
                                                                  SHOAL_DTYPE_F32, rows, cols, NULL), 0));
                    free(f);
                } else {
                    blobs[e][k] = f;
                }
                *m[k] = (struct shoal_weight){.dtype = dt, .data = blobs[e][k], .rows = rows, .cols = cols, .group = 32};
            }
        }
        /* rows per job: all 1 (decode), then uneven */
        const int64_t shapes[2][N_EXP] = {{1, 1, 1, 1, 1, 1}, {1, 3, 2, 1, 4, 1}};
        for (int sh = 0; sh < 2; sh++) {
            float *x[N_EXP], *want[N_EXP], *got[N_EXP], *scr[N_EXP];
            for (int e = 0; e < N_EXP; e++) {
                const int64_t n = shapes[sh][e];
                x[e] = malloc((size_t)(n * N_EMBD) * sizeof(float));
                want[e] = malloc((size_t)(n * N_EMBD) * sizeof(float));
                got[e] = malloc((size_t)(n * N_EMBD) * sizeof(float));
                scr[e] = malloc((size_t)(2 * n * N_FF) * sizeof(float));
                for (int64_t i = 0; i < n * N_EMBD; i++)
                    x[e][i] = ffn_rand(&seed);
                omp_set_num_threads(1);
                shoal_expert_ffn(want[e], x[e], n, &w[e], scr[e]);
                if (dt == SHOAL_DTYPE_INT4A8)
                    for (int64_t t = 0; t < n; t++) {
                        float h[N_FF];
                        const size_t rg = shoal_quant_row_bytes(SHOAL_QUANT_INT4, N_EMBD, 32);
                        const size_t rd = shoal_quant_row_bytes(SHOAL_QUANT_INT4, N_FF, 32);
                        for (int r = 0; r < N_FF; r++) {
                            const float gv = shoal_quant_dot_a8(
                                32, x[e] + t * N_EMBD, (const uint8_t *)blobs[e][0] + r * rg, N_EMBD);
                            const float uv = shoal_quant_dot_a8(
                                32, x[e] + t * N_EMBD, (const uint8_t *)blobs[e][1] + r * rg, N_EMBD);
                            h[r] = shoal_silu(gv) * uv;
                        }
                        for (int r = 0; r < N_EMBD; r++) {
                            const float ref = shoal_quant_dot_a8(
                                32, h, (const uint8_t *)blobs[e][2] + r * rd, N_FF);
                            cr_assert(eq(int, memcmp(&ref, &want[e][t * N_EMBD + r], 4), 0),
                                      "int4a8 expert %d token %lld row %d: %.9g vs dot_a8 %.9g", e,
                                      (long long)t, r, want[e][t * N_EMBD + r], ref);
                        }
                    }
            }
            for (int threads = 1; threads <= 3; threads++)
                for (int n_jobs = 1; n_jobs <= N_EXP; n_jobs++) {
                    struct shoal_expert_ffn_job jobs[N_EXP];
                    for (int e = 0; e < n_jobs; e++) {
                        memset(got[e], 0xff, (size_t)(shapes[sh][e] * N_EMBD) * sizeof(float));
                        jobs[e] = (struct shoal_expert_ffn_job){got[e], x[e], shapes[sh][e], &w[e], scr[e]};
                    }
                    omp_set_num_threads(threads);
                    shoal_expert_ffn_batch(jobs, n_jobs);
                    for (int e = 0; e < n_jobs; e++)
                        cr_assert(eq(int, memcmp(got[e], want[e], (size_t)(shapes[sh][e] * N_EMBD) * sizeof(float)), 0),
                                  "%s rows %s, %d jobs, %d threads: expert %d differs",
                                  names[id], sh ? "uneven" : "all 1", n_jobs, threads, e);
                }
            for (int e = 0; e < N_EXP; e++) {
                free(x[e]);
                free(want[e]);
                free(got[e]);
                free(scr[e]);
            }
        }
        for (int e = 0; e < N_EXP; e++)
            for (int k = 0; k < 3; k++)
                free(blobs[e][k]);
    }
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* shoal_expf against e^x from double exp() rounded once to f32 (exp's
 * double error, under 1 ULP of a double, moves the f32 rounding only when
 * e^x lies within ~1e-16 of an f32 midpoint): every 251st f32 in
 * [-110, 95] and the special cases. Its own error bound is 0.5 ULP +
 * 2e-7 ULP, so at most a handful of midpoint cases may round the other
 * way, never by more than one ULP. */
Test(kernels, expf_is_exp_rounded_to_f32)
{
    long n = 0, off_by_one = 0;
    for (uint32_t u = 0; u < 0xffffffffu - 251; u += 251) {
        float x;
        memcpy(&x, &u, sizeof x);
        if (!(x >= -110.0f && x <= 95.0f))
            continue;
        const float got = shoal_expf(x), want = (float)exp((double)x);
        n++;
        if (f32_bits(got) == f32_bits(want))
            continue;
        off_by_one++;
        cr_assert(isfinite(want) && isfinite(got) &&
                      (f32_bits(got) - f32_bits(want) == 1 || f32_bits(want) - f32_bits(got) == 1),
                  "x = %a: %a vs %a", (double)x, (double)got, (double)want);
    }
    cr_assert(n > 4000000, "%ld points", n);
    cr_assert(off_by_one <= 10, "%ld of %ld points off by one ULP", off_by_one, n);
    cr_assert(eq(u32, f32_bits(shoal_expf(0.0f)), f32_bits(1.0f)));
    cr_assert(eq(u32, f32_bits(shoal_expf(-0.0f)), f32_bits(1.0f)));
    cr_assert(isnan(shoal_expf(NAN)));
    cr_assert(eq(u32, f32_bits(shoal_expf(INFINITY)), f32_bits(INFINITY)));
    cr_assert(eq(u32, f32_bits(shoal_expf(-INFINITY)), f32_bits(0.0f)));
    cr_assert(eq(u32, f32_bits(shoal_expf(89.0f)), f32_bits(INFINITY)));
    cr_assert(eq(u32, f32_bits(shoal_expf(-104.0f)), f32_bits(0.0f)));
    /* the largest finite result and the subnormals round as exp does */
    cr_assert(eq(u32, f32_bits(shoal_expf(88.72283f)), f32_bits((float)exp((double)88.72283f))));
    cr_assert(eq(u32, f32_bits(shoal_expf(-100.0f)), f32_bits((float)exp((double)-100.0f))));
    cr_assert(shoal_expf(-100.0f) > 0.0f && shoal_expf(-100.0f) < 1.2e-38f);
}
