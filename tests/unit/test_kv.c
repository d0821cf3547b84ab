/* Tests for common/kernels/kv.h (the KV cache dtypes and their attention kernels)
 * and for the forward pass with an f16 / bf16 KV cache (forward.h).
 *
 * Assert kinds (STYLE 35): "bit-exact" tests compare bytes with memcmp;
 * "tolerance" tests name their bound and why. Seeds are fixed. */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "forward.h"
#include "kernels.h"
#include "kv.h"
#include "model.h"
#include "tensor.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#define MODEL_DIR SHOAL_SOURCE_ROOT "/models/shakespeare-moe"

static const enum shoal_dtype kv_types[] = {SHOAL_DTYPE_F32, SHOAL_DTYPE_F16, SHOAL_DTYPE_BF16};

static uint32_t xs(uint32_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

/* in [-1, 1) times 2^e, e in [-12, 12]: very different magnitudes */
static float frand(uint32_t *s)
{
    const float u = (float)((double)xs(s) / 4294967296.0 * 2.0 - 1.0);
    return ldexpf(u, (int)(xs(s) % 25) - 12);
}

/* n random finite elements of t at dst; f16 patterns cover every finite
 * exponent, subnormals included */
static void fill_row(void *dst, int64_t n, enum shoal_dtype t, uint32_t *s)
{
    float *f = dst;
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++) {
        if (t == SHOAL_DTYPE_F32) {
            f[i] = frand(s);
        } else if (t == SHOAL_DTYPE_BF16) {
            h[i] = shoal_f32_to_bf16(frand(s));
        } else {
            uint16_t b = (uint16_t)xs(s);
            if (((b >> 10) & 0x1f) == 0x1f)   /* no inf / NaN */
                b &= (uint16_t)~0x4000u;
            h[i] = b;
        }
    }
}

/* the kernels' definitions, literally (kv.h "Canonical computation") */
static float ref_score(const float *q, const void *row, int64_t n, enum shoal_dtype t)
{
    float *f = malloc((size_t)n * sizeof(float));
    shoal_to_f32(f, row, t, (size_t)n);
    const float r = shoal_dot_f32(q, f, n);
    free(f);
    return r;
}

static void ref_mix(float *out, const float *p, const void *v, int64_t stride, int64_t n_rows,
                    int64_t n, enum shoal_dtype t)
{
    float *f = malloc((size_t)n * sizeof(float));
    for (int64_t d = 0; d < n; d++)
        out[d] = 0.0f;
    for (int64_t j = 0; j < n_rows; j++) {
        shoal_to_f32(f, shoal_kv_row(v, j, stride, t), t, (size_t)n);
        for (int64_t d = 0; d < n; d++)
            out[d] += p[j] * f[d];
    }
    free(f);
}

struct table {
    const struct shoal_kv_ops *ops;
    enum shoal_kv_isa isa;
};

/* every table this build and CPU run, the scalar one first */
static int kv_tables(struct table tab[3])
{
    int n = 0;
    tab[n++] = (struct table){&shoal_kv_ops_scalar, SHOAL_KV_ISA_SCALAR};
#if defined(SHOAL_KV_HAVE_AVX2)
    if (shoal_kv_init(SHOAL_KV_ISA_AVX2, NULL) == 0)
        tab[n++] = (struct table){&shoal_kv_ops_avx2, SHOAL_KV_ISA_AVX2};
#endif
#if defined(SHOAL_KV_HAVE_NEON)
    if (shoal_kv_init(SHOAL_KV_ISA_NEON, NULL) == 0)
        tab[n++] = (struct table){&shoal_kv_ops_neon, SHOAL_KV_ISA_NEON};
#endif
    shoal_kv_init(SHOAL_KV_ISA_SCALAR, NULL);
    return n;
}

/* ---- f32 -> f16 --------------------------------------------------------- */

Test(kv, f16_rounding_is_exact_on_halves_and_ties_to_even)
{
    for (uint32_t h = 0; h < 0x10000u; h++) {
        if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu))
            continue;   /* NaN: below */
        const float f = shoal_f16_to_f32((uint16_t)h);
        cr_assert(eq(u16, shoal_f32_to_f16(f), (uint16_t)h), "half 0x%04x", h);
        /* halfway to the next half away from zero: ties go to the even one */
        if ((h & 0x7fffu) >= 0x7bffu)
            continue;
        const float next = shoal_f16_to_f32((uint16_t)(h + 1));
        const float mid = (float)(((double)f + (double)next) / 2.0);   /* exact in f32 */
        const uint16_t even = (h & 1u) ? (uint16_t)(h + 1) : (uint16_t)h;
        cr_assert(eq(u16, shoal_f32_to_f16(mid), even), "midpoint above 0x%04x", h);
    }
    cr_assert(eq(u16, shoal_f32_to_f16(65519.0f), 0x7bff));
    cr_assert(eq(u16, shoal_f32_to_f16(65520.0f), 0x7c00));   /* rounds to infinity */
    cr_assert(eq(u16, shoal_f32_to_f16(-INFINITY), 0xfc00));
    cr_assert(eq(u16, shoal_f32_to_f16(0x1p-25f), 0x0000));   /* tie below the least subnormal */
    cr_assert(eq(u16, shoal_f32_to_f16(0x1.8p-25f), 0x0001));
    cr_assert(eq(u16, shoal_f32_to_f16(-0.0f), 0x8000));
    const uint16_t nan = shoal_f32_to_f16(NAN);
    cr_assert(eq(int, (nan & 0x7c00u) == 0x7c00u && (nan & 0x3ffu) != 0, 1),
              "NaN stays NaN: 0x%04x", nan);
}

#if defined(__x86_64__)
__attribute__((target("f16c"))) static uint16_t hw_f16(float f)
{
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}
#elif defined(__aarch64__)
static uint16_t hw_f16(float f)
{
    const __fp16 h = (__fp16)f;
    uint16_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}
#endif

Test(kv, f16_rounding_matches_the_cpus_conversion)
{
#if defined(__x86_64__)
    unsigned eax, ebx, ecx, edx;   /* F16C: CPUID 1, ECX bit 29 (clang's
                                      __builtin_cpu_supports lacks "f16c") */
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & (1u << 29)))
        cr_skip_test("no F16C on this CPU");
#elif !defined(__aarch64__)
    cr_skip_test("no hardware f16 conversion known for this ISA");
#endif
#if defined(__x86_64__) || defined(__aarch64__)
    /* about 1.05 M f32 bit patterns spread over all of them (NaNs included) */
    for (uint64_t u = 0; u <= 0xffffffffu; u += 4093) {
        float f;
        const uint32_t b = (uint32_t)u;
        memcpy(&f, &b, sizeof f);
        cr_assert(eq(u16, shoal_f32_to_f16(f), hw_f16(f)), "f32 0x%08x", b);
    }
#endif
}

/* ---- kernels vs their definition, every table ----------------------------- */

Test(kv, every_table_reproduces_the_canonical_kernels_bit_for_bit)
{
    struct table tab[3];
    const int n_ops = kv_tables(tab);
    static const int64_t dims[] = {1, 5, 8, 13, 64, 67, 128, 136, 256};
    static const int64_t rows[] = {1, 3, 4, 7, 9, 33};
    uint32_t seed = 7;
    for (size_t it = 0; it < sizeof kv_types / sizeof kv_types[0]; it++) {
        const enum shoal_dtype t = kv_types[it];
        for (size_t id = 0; id < sizeof dims / sizeof dims[0]; id++) {
            const int64_t n = dims[id], stride = 3 * n + 8;   /* GQA-like: rows apart */
            for (size_t ir = 0; ir < sizeof rows / sizeof rows[0]; ir++) {
                const int64_t nr = rows[ir];
                void *k = calloc((size_t)(nr * stride), 4);
                float *q = malloc((size_t)n * 4), *p = malloc((size_t)nr * 4);
                float *want = malloc((size_t)(nr > n ? nr : n) * 4);
                float *got = malloc((size_t)(nr > n ? nr : n) * 4);
                for (int64_t j = 0; j < nr; j++)
                    fill_row((char *)k + (size_t)(j * stride) * shoal_dtype_size(t), n, t, &seed);
                for (int64_t i = 0; i < n; i++)
                    q[i] = frand(&seed);
                for (int64_t j = 0; j < nr; j++)
                    p[j] = (float)(xs(&seed) % 1000) / 1000.0f;
                for (int o = 0; o < n_ops; o++) {
                    const struct shoal_kv_ops *op = tab[o].ops;
                    for (int64_t j = 0; j < nr; j++)
                        want[j] = ref_score(q, shoal_kv_row(k, j, stride, t), n, t);
                    op->scores(got, 0, q, 0, 1, k, stride, nr, n, t);
                    cr_assert(eq(int, memcmp(got, want, (size_t)nr * 4), 0),
                              "scores: %s %s n=%lld rows=%lld", op->name,
                              shoal_kv_dtype_name(t), (long long)n, (long long)nr);
                    ref_mix(want, p, k, stride, nr, n, t);
                    memset(got, 0, (size_t)n * 4);
                    op->mix(got, 0, p, 0, 1, k, stride, nr, n, t);
                    cr_assert(eq(int, memcmp(got, want, (size_t)n * 4), 0),
                              "mix: %s %s n=%lld rows=%lld", op->name,
                              shoal_kv_dtype_name(t), (long long)n, (long long)nr);
                }
                free(k);
                free(q);
                free(p);
                free(want);
                free(got);
            }
        }
    }
}

/* The multi-query kernels (ops->scores / ops->mix with n_q queries):
 * bit-exact against the single-query definitions, with the rows of the mix
 * split in two calls that continue the same sums. */
Test(kv, every_table_runs_several_queries_with_the_bits_of_one)
{
    struct table tab[3];
    const int n_ops = kv_tables(tab);
    static const int64_t dims[] = {5, 8, 36, 64, 128, 136};
    static const int64_t nqs[] = {1, 2, 3, 4, 5, 8};
    const int64_t nr = 11, split = 6;
    uint32_t seed = 19;
    for (size_t it = 0; it < sizeof kv_types / sizeof kv_types[0]; it++) {
        const enum shoal_dtype t = kv_types[it];
        for (size_t id = 0; id < sizeof dims / sizeof dims[0]; id++) {
            const int64_t n = dims[id], stride = 2 * n + 4, ld = n + 3, sld = nr + 2;
            for (size_t iq = 0; iq < sizeof nqs / sizeof nqs[0]; iq++) {
                const int64_t nq = nqs[iq];
                void *k = calloc((size_t)(nr * stride), 4);
                float *q = malloc((size_t)(nq * ld) * 4), *p = malloc((size_t)(nq * sld) * 4);
                const size_t got_bytes = (size_t)(nq * (ld + sld)) * 4;   /* scores or outputs */
                float *want = malloc((size_t)n * 4), *got = malloc(got_bytes);
                for (int64_t j = 0; j < nr; j++)
                    fill_row((char *)k + (size_t)(j * stride) * shoal_dtype_size(t), n, t, &seed);
                for (int64_t i = 0; i < nq * ld; i++)
                    q[i] = frand(&seed);
                for (int64_t i = 0; i < nq * sld; i++)
                    p[i] = (float)(xs(&seed) % 1000) / 1000.0f;
                for (int o = 0; o < n_ops; o++) {
                    const struct shoal_kv_ops *op = tab[o].ops;
                    memset(got, 0, got_bytes);
                    op->scores(got, sld, q, ld, nq, k, stride, nr, n, t);
                    for (int64_t r = 0; r < nq; r++)
                        for (int64_t j = 0; j < nr; j++) {
                            const float w = ref_score(q + r * ld, shoal_kv_row(k, j, stride, t), n, t);
                            cr_assert(eq(int, memcmp(&got[r * sld + j], &w, 4), 0),
                                      "scores: %s %s n=%lld n_q=%lld query %lld row %lld",
                                      op->name, shoal_kv_dtype_name(t), (long long)n,
                                      (long long)nq, (long long)r, (long long)j);
                        }
                    memset(got, 0, got_bytes);
                    op->mix(got, ld, p, sld, nq, k, stride, split, n, t);
                    op->mix(got, ld, p + split, sld, nq, shoal_kv_row(k, split, stride, t),
                            stride, nr - split, n, t);
                    for (int64_t r = 0; r < nq; r++) {
                        ref_mix(want, p + r * sld, k, stride, nr, n, t);
                        cr_assert(eq(int, memcmp(got + r * ld, want, (size_t)n * 4), 0),
                                  "mix: %s %s n=%lld n_q=%lld query %lld", op->name,
                                  shoal_kv_dtype_name(t), (long long)n, (long long)nq,
                                  (long long)r);
                    }
                }
                free(k);
                free(q);
                free(p);
                free(want);
                free(got);
            }
        }
    }
}

/* kv.h's softmax of one row, literally (shoal_kv_attend's order) */
static void ref_softmax(float *sc, int64_t n, float div, const float *sink)
{
    float mx = sink ? *sink : -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        sc[j] = sc[j] / div;
        if (sc[j] > mx)
            mx = sc[j];
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        sc[j] = shoal_expf(sc[j] - mx);
        sum += sc[j];
    }
    if (sink)
        sum += shoal_expf(*sink - mx);
    for (int64_t j = 0; j < n; j++)
        sc[j] = sc[j] / sum;
}

/* every NaN of x[0 .. n-1] as one pattern: which NaN an operation on two
 * NaNs returns depends on the compiler's operand order (kv.h) */
static void nan_canonical(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (x[i] != x[i])
            x[i] = NAN;
}

/* Every table's softmax (rows interleaved, elementwise steps vectorized)
 * has the bytes of the literal definition: row lengths around the vector
 * width, 1-13 rows, sinks or none, and inputs that reach every branch of
 * shoal_expf (NaN, +-inf, past +-128 after the division, +-0 ties,
 * subnormal results); rows [0, x] with x below -17 check e^x itself (the
 * sum rounds to 1). */
Test(kv, every_table_computes_the_softmax_with_the_bits_of_the_definition)
{
    struct table tab[3];
    const int n_ops = kv_tables(tab);
    static const int64_t lens[] = {1, 2, 7, 8, 9, 16, 31, 100, 517};
    static const int64_t n_rows_of[] = {1, 3, 8, 9, 13};
    static const float specials[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 300.0f, -300.0f,
                                     129.0f, -129.0f, 127.9f, -127.9f, 88.7f, -103.9f, -87.3f};
    uint32_t seed = 41;
    const int64_t ld = 530;
    float *want = malloc((size_t)(13 * ld) * 4), *got = malloc((size_t)(13 * ld) * 4);
    float sinks[13];
    for (size_t il = 0; il < sizeof lens / sizeof lens[0]; il++)
        for (size_t ir = 0; ir < sizeof n_rows_of / sizeof n_rows_of[0]; ir++)
            for (int mode = 0; mode < 4; mode++) {
                const int64_t n = lens[il], nr = n_rows_of[ir];
                const float div = mode == 3 ? 1.0f : 11.3137085f;   /* sqrt(128) */
                for (int64_t r = 0; r < nr; r++) {
                    for (int64_t j = 0; j < n; j++) {
                        float x = frand(&seed) * 64.0f;
                        if (mode == 1 && xs(&seed) % 5 == 0)
                            x = specials[xs(&seed) % (sizeof specials / sizeof specials[0])];
                        if (mode == 2)   /* ties of the max at +-0 */
                            x = xs(&seed) % 3 ? -(float)(xs(&seed) % 100) : (xs(&seed) & 1 ? 0.0f : -0.0f);
                        want[r * ld + j] = x;
                    }
                    sinks[r] = mode == 1 && r == 1 ? NAN : frand(&seed) * 8.0f;
                }
                memcpy(got, want, (size_t)(13 * ld) * 4);
                for (int with_sinks = 0; with_sinks < 2; with_sinks++) {
                    float *ref = malloc((size_t)(13 * ld) * 4);
                    memcpy(ref, want, (size_t)(13 * ld) * 4);
                    for (int64_t r = 0; r < nr; r++)
                        ref_softmax(ref + r * ld, n, div, with_sinks ? sinks + r : NULL);
                    nan_canonical(ref, nr * ld);
                    for (int o = 0; o < n_ops; o++) {
                        memcpy(got, want, (size_t)(13 * ld) * 4);
                        tab[o].ops->softmax(got, ld, nr, n, div, with_sinks ? sinks : NULL);
                        nan_canonical(got, nr * ld);
                        cr_assert(eq(int, memcmp(got, ref, (size_t)(nr * ld) * 4), 0),
                                  "softmax: %s n=%lld rows=%lld mode %d sinks %d",
                                  tab[o].ops->name, (long long)n, (long long)nr, mode,
                                  with_sinks);
                    }
                    free(ref);
                }
            }
    /* e^x directly: rows [0, x], x from -128 to -17 */
    int checked = 0;
    for (float x = -128.0f; x < -17.0f; x += 0.0371f) {
        for (int o = 0; o < n_ops; o++) {
            float row[9] = {0.0f, x, x, x, x, x, x, x, x};
            tab[o].ops->softmax(row, 9, 1, 9, 1.0f, NULL);
            const float e = shoal_expf(x);
            cr_assert(eq(int, memcmp(&row[1], &e, 4), 0), "%s e^%a", tab[o].ops->name,
                      (double)x);
            cr_assert(row[1] == row[8]);
        }
        checked++;
    }
    cr_assert(gt(int, checked, 2900));
    free(want);
    free(got);
}

/* forward.c's attention before shoal_kv_attend, literally: one (token,
 * head) at a time, scores, softmax, mix */
static void ref_attend(const struct shoal_kv_attn *a, float *out)
{
    const int64_t hd = a->head_dim, nh = a->n_head, n_rep = nh / a->n_head_kv;
    const int64_t nkv = a->n_head_kv * hd, nq = nh * hd;
    const size_t es = shoal_dtype_size(a->t);
    const float sq = sqrtf((float)hd);
    float *sc = malloc((size_t)(a->n_past + a->n) * sizeof(float));
    for (int64_t t = 0; t < a->n; t++)
        for (int64_t h = 0; h < nh; h++) {
            const int64_t pos = a->n_past + t;
            const int64_t j0 = a->window > 0 && pos - a->window + 1 > 0 ? pos - a->window + 1 : 0;
            const size_t first = (size_t)(j0 * nkv + (h / n_rep) * hd) * es;
            for (int64_t j = j0; j <= pos; j++)
                sc[j] = ref_score(a->q + t * nq + h * hd,
                                  (const char *)a->k + first + (size_t)((j - j0) * nkv) * es, hd,
                                  a->t);
            float mx = -INFINITY;
            for (int64_t j = j0; j <= pos; j++) {
                float s = sc[j] / sq;
                sc[j] = s;
                if (s > mx)
                    mx = s;
            }
            float sum = 0.0f;
            for (int64_t j = j0; j <= pos; j++) {
                sc[j] = shoal_expf(sc[j] - mx);
                sum += sc[j];
            }
            for (int64_t j = j0; j <= pos; j++)
                sc[j] = sc[j] / sum;
            ref_mix(out + t * nq + h * hd, sc + j0, (const char *)a->v + first, nkv,
                    pos - j0 + 1, hd, a->t);
        }
    free(sc);
}

/* shoal_kv_attend (query heads of a KV head and rounds of tokens together
 * over tiles of rows, split over threads by phase) gives the bytes of the
 * one-head-at-a-time attention: GQA 1-4, head sizes with and without SIMD
 * tails, a sliding window, a cache already holding rows, batches that span
 * several tiles and rounds, 1-3 threads, tiles of 1, 4 and 16 KiB, every
 * table and dtype. */
Test(kv, batched_attention_has_the_bits_of_one_head_at_a_time)
{
    struct table tab[3];
    const int n_ops = kv_tables(tab);
    static const struct { int64_t nh, nkv_h, hd; } shapes[] = {
        {8, 2, 128}, {6, 6, 36}, {12, 4, 64}, {4, 1, 40}};
    static const struct { int64_t n_past, n, window, round; } runs[] = {
        {0, 1, 0, 1}, {0, 19, 0, 8}, {37, 1, 0, 1}, {37, 13, 0, 3}, {150, 21, 0, 8},
        {37, 13, 5, 4}, {150, 9, 64, 8}, {0, 30, 7, 8}};
    uint32_t seed = 23;
    for (size_t is = 0; is < sizeof shapes / sizeof shapes[0]; is++) {
        const int64_t nh = shapes[is].nh, nkv_h = shapes[is].nkv_h, hd = shapes[is].hd;
        for (size_t it = 0; it < sizeof kv_types / sizeof kv_types[0]; it++) {
            const enum shoal_dtype t = kv_types[it];
            for (size_t ir = 0; ir < sizeof runs / sizeof runs[0]; ir++) {
                const int64_t n = runs[ir].n, L = runs[ir].n_past + n, ld = L + 5;
                const size_t row_bytes = (size_t)(nkv_h * hd) * shoal_dtype_size(t);
                void *k = malloc((size_t)L * row_bytes), *v = malloc((size_t)L * row_bytes);
                float *q = malloc((size_t)(n * nh * hd) * 4);
                float *want = malloc((size_t)(n * nh * hd) * 4);
                float *got = malloc((size_t)(n * nh * hd) * 4);
                float *scores = malloc((size_t)(runs[ir].round * nh * ld) * 4);
                for (int64_t j = 0; j < L; j++) {
                    /* attention's magnitudes: scores of a few units */
                    float row[4096];
                    for (int64_t i = 0; i < nkv_h * hd; i++)
                        row[i] = (float)((double)xs(&seed) / 4294967296.0 - 0.5);
                    shoal_kv_store_row((char *)k + (size_t)j * row_bytes, row, nkv_h * hd, t);
                    for (int64_t i = 0; i < nkv_h * hd; i++)
                        row[i] = frand(&seed);
                    shoal_kv_store_row((char *)v + (size_t)j * row_bytes, row, nkv_h * hd, t);
                }
                for (int64_t i = 0; i < n * nh * hd; i++)
                    q[i] = (float)((double)xs(&seed) / 4294967296.0 * 4.0 - 2.0);
                const struct shoal_kv_attn a = {
                    .out = got, .q = q, .k = k, .v = v, .scores = scores, .scores_ld = ld,
                    .round = runs[ir].round, .n = n, .n_past = runs[ir].n_past, .n_head = nh,
                    .n_head_kv = nkv_h, .head_dim = hd, .window = runs[ir].window, .t = t};
                ref_attend(&a, want);
                for (int o = 0; o < n_ops; o++) {
                    cr_assert(eq(int, shoal_kv_init(tab[o].isa, NULL), 0));
                    for (int nt = 1; nt <= 3; nt++)
                        for (int64_t tb = 1024; tb <= 16384; tb *= 4) {
                            shoal_kv_set_tile_bytes(tb);   /* 8, 8.., 32.. rows a tile */
                            memset(got, 0xff, (size_t)(n * nh * hd) * 4);
#pragma omp parallel num_threads(nt)
                            shoal_kv_attend(&a, omp_get_thread_num(), omp_get_num_threads());
                            cr_assert(eq(int, memcmp(got, want, (size_t)(n * nh * hd) * 4), 0),
                                      "%s %s heads %lld/%lld x %lld, n_past %lld n %lld window "
                                      "%lld round %lld, %d threads, tiles of %lld bytes",
                                      tab[o].ops->name, shoal_kv_dtype_name(t), (long long)nh,
                                      (long long)nkv_h, (long long)hd,
                                      (long long)runs[ir].n_past, (long long)n,
                                      (long long)runs[ir].window, (long long)runs[ir].round, nt,
                                      (long long)tb);
                        }
                    shoal_kv_set_tile_bytes(8192);
                }
                shoal_kv_init(SHOAL_KV_ISA_SCALAR, NULL);
                free(k);
                free(v);
                free(q);
                free(want);
                free(got);
                free(scores);
            }
        }
    }
}

Test(kv, dtype_names_parse_and_unknown_ones_are_refused)
{
    enum shoal_dtype t = SHOAL_DTYPE_INT8;
    for (size_t i = 0; i < sizeof kv_types / sizeof kv_types[0]; i++) {
        cr_assert(eq(int, shoal_kv_dtype_parse(shoal_kv_dtype_name(kv_types[i]), &t), 0));
        cr_assert(eq(int, (int)t, (int)kv_types[i]));
    }
    static const char *bad[] = {"f8", "F16", "int8", "", "fp16", "bf16 "};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert(eq(int, shoal_kv_dtype_parse(bad[i], &t), -1), "'%s'", bad[i]);
    cr_assert(eq(int, shoal_kv_dtype_parse(NULL, &t), -1));
    cr_assert(not(shoal_kv_dtype_ok(SHOAL_DTYPE_INT4)));
}

/* ---- the forward pass with an f16 / bf16 cache ------------------------------ */

#define N_TOK 40

struct fwd {
    struct shoal_model *m;
    int32_t tokens[N_TOK];
    int64_t n_vocab;
};

static struct fwd load(void)
{
    struct shoal_err err = {0};
    struct fwd f = {.m = shoal_model_load(MODEL_DIR, &err)};
    cr_assert(not(eq(ptr, f.m, NULL)), "%s", err.msg);
    f.n_vocab = f.m->cfg.n_vocab;
    uint32_t s = 11;
    for (int i = 0; i < N_TOK; i++)
        f.tokens[i] = (int32_t)(xs(&s) % (uint32_t)f.n_vocab);
    return f;
}

/* all logits [N_TOK][n_vocab] of the prompt, evaluated in chunks of n_batch
 * tokens (1: token by token) on nt threads; caller frees */
static float *logits_of(const struct fwd *f, enum shoal_dtype kv, int nt, int64_t n_batch)
{
    struct shoal_err err = {0};
    struct shoal_ctx_params p = shoal_ctx_params_default();
    p.n_ctx = 64;
    p.n_batch = n_batch;
    p.kv_dtype = kv;
    omp_set_num_threads(nt);
    struct shoal_ctx *ctx = shoal_ctx_create(f->m, p, &err);
    cr_assert(not(eq(ptr, ctx, NULL)), "%s", err.msg);
    cr_assert(eq(int, (int)shoal_ctx_kv_dtype(ctx), (int)kv));
    float *lg = malloc((size_t)(N_TOK * f->n_vocab) * sizeof(float));
    cr_assert(eq(int, shoal_ctx_eval(ctx, f->tokens, N_TOK, lg, 1, &err), 0), "%s", err.msg);
    shoal_ctx_free(ctx);
    return lg;
}

Test(kv, f16_and_bf16_logits_do_not_depend_on_threads_batching_or_isa)
{
    struct fwd f = load();
    struct table tab[3];
    const int n_ops = kv_tables(tab);
    const size_t bytes = (size_t)(N_TOK * f.n_vocab) * sizeof(float);
    for (int k = 1; k < 3; k++) {
        const enum shoal_dtype kv = kv_types[k];
        float *base = logits_of(&f, kv, 1, 64);   /* one batch, one thread, scalar */
        static const struct { int nt; int64_t nb; } runs[] = {{2, 64}, {3, 64}, {1, 1},
                                                               {3, 1}, {2, 7}};
        for (int o = 0; o < n_ops; o++) {
            cr_assert(eq(int, shoal_kv_init(tab[o].isa, NULL), 0));
            for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
                float *lg = logits_of(&f, kv, runs[r].nt, runs[r].nb);
                cr_assert(eq(int, memcmp(lg, base, bytes), 0),
                          "kv %s, %s kernels, %d threads, batches of %lld: logits bytes differ "
                          "from 1 thread, one batch, scalar", shoal_kv_dtype_name(kv),
                          tab[o].ops->name, runs[r].nt, (long long)runs[r].nb);
                free(lg);
            }
        }
        shoal_kv_init(SHOAL_KV_ISA_SCALAR, NULL);
        free(base);
    }
    shoal_model_free(f.m);
}

/* Tolerance: a cache element rounded to f16 is off by at most 2^-11 of
 * itself (bf16: 2^-8, 8x more). Over the bundled model's 4 layers and these
 * 40 tokens the logits moved by at most 3.2e-4 (f16) and 6.9e-3 (bf16) of
 * the largest |logit| when this was written (1.7e-4 and 1.3e-3 over 16
 * greedy steps of `shoal run`); the bounds leave 4-6x of room and stay far
 * below the O(1) change that reading a wrong row gives. */
Test(kv, f16_and_bf16_logits_are_close_to_f32_and_not_equal)
{
    struct fwd f = load();
    shoal_kv_init(SHOAL_KV_ISA_AUTO, NULL);
    float *ref = logits_of(&f, SHOAL_DTYPE_F32, 2, 64);
    static const float tol[3] = {0.0f, 2e-3f, 3e-2f};
    for (int k = 1; k < 3; k++) {
        float *lg = logits_of(&f, kv_types[k], 2, 64);
        int64_t n_diff = 0;
        float worst = 0.0f;
        for (int t = 0; t < N_TOK; t++) {
            const float *a = lg + t * f.n_vocab, *b = ref + t * f.n_vocab;
            float mx = 0.0f, d = 0.0f;
            for (int64_t v = 0; v < f.n_vocab; v++) {
                mx = fmaxf(mx, fabsf(b[v]));
                d = fmaxf(d, fabsf(a[v] - b[v]));
                n_diff += a[v] != b[v];
            }
            worst = fmaxf(worst, d / mx);
        }
        cr_log_info("kv %s: max |dlogit| / max |logit| = %.3g, %lld of %lld differ",
                    shoal_kv_dtype_name(kv_types[k]), (double)worst, (long long)n_diff,
                    (long long)(N_TOK * f.n_vocab));
        cr_assert(le(flt, worst, tol[k]), "kv %s: max |dlogit| / max |logit| = %g > %g",
                  shoal_kv_dtype_name(kv_types[k]), (double)worst, (double)tol[k]);
        cr_assert(gt(i64, n_diff, N_TOK * f.n_vocab / 2), "kv %s changed only %lld logits: the "
                  "cache dtype did not take effect", shoal_kv_dtype_name(kv_types[k]),
                  (long long)n_diff);
        free(lg);
    }
    shoal_kv_init(SHOAL_KV_ISA_SCALAR, NULL);
    free(ref);
    shoal_model_free(f.m);
}

Test(kv, a_context_refuses_a_dtype_that_is_not_a_kv_dtype)
{
    struct fwd f = load();
    struct shoal_err err = {0};
    struct shoal_ctx_params p = shoal_ctx_params_default();
    p.kv_dtype = SHOAL_DTYPE_INT8;
    cr_assert(eq(ptr, shoal_ctx_create(f.m, p, &err), NULL));
    cr_assert(eq(int, err.code, SHOAL_EINVAL));
    cr_assert(not(eq(ptr, strstr(err.msg, "expected f32, f16 or bf16"), NULL)), "%s", err.msg);
    shoal_model_free(f.m);
}
