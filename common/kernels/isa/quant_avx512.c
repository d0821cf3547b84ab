/* quant_avx512: the int4 and int8 linears with AVX-512 (F, BW, VL, and
 * VBMI for int4 in the "avx512" build of this file), x86-64.
 *
 * Same bits as the scalar reference in quant.c (quant.h's canonical order):
 * one __m512 holds the eight lane sums s[0..7] of TWO rows (row 2p in lanes
 * 0..7, row 2p+1 in lanes 8..15), so every lane runs exactly the scalar
 * chain s[k % 8] = s[k % 8] + x[k] * (float)q[k] with separate mul and add
 * (this file is built without FMA and the project uses -ffp-contract=off).
 * The per-group tree ((s0+s4)+(s2+s6))+((s1+s5)+(s3+s7)) and
 * acc = acc + d * gsum are done eight rows at a time with the same
 * associations (IEEE addition and multiplication are commutative, so only
 * the grouping matters, and it is the scalar one).
 *
 * Where the speed comes from (quant_avx2.c unpacks nibbles to bytes,
 * sign-extends them to int32 and converts; measured in bench/kernel_bench):
 *   - a nibble becomes its f32 value in one vpermps: the index lanes carry
 *     the nibble in bits 0..3 (vpermps ignores the rest) and the table is
 *     {-8, -7, ..., 7}, exactly (float)(u - 8);
 *   - the index lanes come from one vpmultishiftqb per step out of packed
 *     bytes regrouped once per 64-element window (one vpermb), so neither
 *     nibble needs masking or interleaving;
 *   - 16 lanes per instruction and 16 rows per pass: eight independent add
 *     chains hide the add latency (four chains ran 1.5x slower), and each
 *     x load serves 16 rows;
 *   - group scales are applied eight groups at a time from an 8 x 8
 *     transpose of eight rows' scales (a gather per group cost 17 %);
 *   - the next block of rows is prefetched while this one computes: the
 *     hardware prefetcher loses track of 16 row streams (without it the
 *     kernel ran at a third of its speed on weights in RAM).
 *
 * int8 (rows_q8) has the same structure: a step widens 8 bytes of each of
 * two rows with vpermq + vpmovsxbd and converts them; 1.4x the AVX2 int8
 * kernel on one core, which already came near the RAM read limit on two.
 *
 * Blocks of 16 or 8 rows run here, for any batch: a block's weights (about
 * 18 KiB int4) stay in L1 while every token of the batch runs the matvec
 * over them, 1.7x the AVX2 kernel's batched int4 path (which unpacks each
 * group once for four tokens). Remainder rows and the single-row dot go to
 * the AVX2 kernels, which give the same bits. quant.c selects a table only
 * when the CPU has what it was built for (and AVX2). */
#include <immintrin.h>
#include <string.h>

#include "ggml_dot.h"
#include "prefetch_x86.h"
#include "quant.h"

/* This file is built twice (common/meson.build): with VBMI for
 * shoal_quant_ops_avx512, and without it for shoal_quant_ops_avx512bw
 * (Skylake-SP, Cascade Lake: AVX-512 F/BW/VL but no VBMI). Without VBMI a
 * step takes the dword holding its 8 nibbles of each row with vpermd and
 * shifts nibble l of it to lane l with vpsrlvd: one instruction more per
 * step than vpmultishiftqb, and no regrouping per window. Same bits. */
#if defined(__AVX512VBMI__)
#define OPS_TABLE shoal_quant_ops_avx512
#define OPS_NAME "avx512"
#define MXFP4_ROWS_FN shoal_mxfp4_rows_avx512
#else
#define OPS_TABLE shoal_quant_ops_avx512bw
#define OPS_NAME "avx512bw"
#define MXFP4_ROWS_FN shoal_mxfp4_rows_avx512bw
#endif

void MXFP4_ROWS_FN(float *y, const float *x, int64_t n_tok, const struct shoal_weight *w,
                   int64_t r0, int64_t r1);

#define WINDOW 64          /* int4 elements per row per packed load */

/* The two constants of the nibble extraction.
 *
 * tr: a vpermb that regroups a 64-byte window (row A's 32 packed bytes at
 * 0..31, row B's at 32..63) so that qword q (q < 4) holds A's bytes q,
 * q+4, ..., q+28 and qword 4+q holds B's bytes q, q+4, ..., q+28.
 *
 * sel0, step j (elements 8j .. 8j+7 of the window): a vpmultishiftqb
 * control. Output qword q is int32 lanes 2q and 2q+1, which need the low
 * and the high nibble of byte 4j + (q mod 4) of their row: that byte sits
 * at byte j of the regrouped qword, so lane 2q's low byte takes the 8 bits
 * at offset 8j and lane 2q+1's the 8 bits at 8j + 4. Only bits 0..3 of
 * each lane matter to the vpermps that follows. sel0 is step 0's control;
 * step j's is sel0 + 8j in every byte. */
static void nibble_constants(__m512i *tr, __m512i *sel0)
{
#if !defined(__AVX512VBMI__)
    /* without VBMI: tr holds the vpsrlvd counts 4 * (l % 8) that bring
     * nibble l % 8 of a dword to bits 0..3 of lane l, and sel0 the vpermd
     * indices of step 0: dword 0 (row A's elements 0..7) for lanes 0..7,
     * dword 8 (row B's) for lanes 8..15; step j's are sel0 + j */
    uint32_t c[16], d[16];
    for (int l = 0; l < 16; l++) {
        c[l] = (uint32_t)(4 * (l & 7));
        d[l] = l < 8 ? 0u : 8u;
    }
    *tr = _mm512_loadu_si512(c);
    *sel0 = _mm512_loadu_si512(d);
#else
    uint8_t b[64];
    for (int q = 0; q < 8; q++)
        for (int m = 0; m < 8; m++)
            b[8 * q + m] = (uint8_t)((q < 4 ? 0 : 32) + (q & 3) + 4 * m);
    *tr = _mm512_loadu_si512(b);
    for (int k = 0; k < 64; k++)
        b[k] = (uint8_t)((k & 4) ? 4 : 0);
    *sel0 = _mm512_loadu_si512(b);
#endif
}

/* lanes 0..7: ((s0+s4)+(s2+s6))+((s1+s5)+(s3+s7)) of rows 0..7, where row
 * 2p's s[] is lanes 0..7 of c[p] and row 2p+1's is lanes 8..15 */
static inline __m256 tree8_rows8(const __m512 c[4])
{
    /* per 128-bit lane one row: (s0+s4, s1+s5, s2+s6, s3+s7) */
    const __m512 v01 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 v23 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(3, 1, 3, 1)));
    /* w0 = v0 + v2, w1 = v1 + v3 */
    const __m512 w01 = _mm512_add_ps(v01, _mm512_permute_ps(v01, _MM_SHUFFLE(1, 0, 3, 2)));
    const __m512 w23 = _mm512_add_ps(v23, _mm512_permute_ps(v23, _MM_SHUFFLE(1, 0, 3, 2)));
    /* t0 = w0 + w1 in lane 0 of every 128-bit lane */
    const __m512 t01 = _mm512_add_ps(w01, _mm512_permute_ps(w01, _MM_SHUFFLE(2, 3, 0, 1)));
    const __m512 t23 = _mm512_add_ps(w23, _mm512_permute_ps(w23, _MM_SHUFFLE(2, 3, 0, 1)));
    const __m512i pick = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28,
                                           0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castps512_ps256(_mm512_permutex2var_ps(t01, pick, t23));
}

/* d[k] = the scales of group g0 + k of rows 0..7 (row r in lane r), for
 * k < n_g <= 8: eight rows' runs of scales loaded and transposed 8 x 8 */
static inline void scales8x8(__m256 d[8], const uint8_t *row0, size_t row_bytes,
                             int64_t g0, int n_g)
{
    const __mmask8 m = (__mmask8)((1u << n_g) - 1u);
    __m256 r[8];
    for (int k = 0; k < 8; k++)
        r[k] = _mm256_maskz_loadu_ps(m, row0 + (size_t)k * row_bytes + 4 * (size_t)g0);
    /* rows (r0 r1), (r2 r3), ...: interleave, then 4 x 4 blocks, then halves */
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
    d[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    d[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    d[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    d[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    d[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    d[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    d[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    d[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* The canonical group sum of one partial group (scalar, cold path). */
static float tail_q4(const float *x, const uint8_t *p, int64_t len)
{
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t k = 0; k < len; k++) {
        const int q = (int)((p[k / 2] >> (4 * (k & 1))) & 0x0f) - 8;
        s[k & 7] += x[k] * (float)q;
    }
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

/* The canonical group sum of one partial int8 group (scalar, cold path). */
static float tail_q8(const float *x, const int8_t *q, int64_t len)
{
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t k = 0; k < len; k++)
        s[k & 7] += x[k] * (float)q[k];
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

/* the next pf_step bytes of the block ahead (pf, pf_bytes) */
static inline void prefetch_next(const uint8_t *pf, size_t pf_bytes, size_t pf_step,
                                 size_t *pf_at)
{
    for (size_t o = *pf_at; o < *pf_at + pf_step && o < pf_bytes; o += 64)
        _mm_prefetch((const char *)pf + o, SHOAL_PF_WEIGHTS);
    *pf_at += pf_step;
}

/* s[0 .. NP-1] = 0 (unrolled: a loop GCC turns into memset puts the chains
 * in memory) */
static inline __attribute__((always_inline)) void zero_chains(const int NP, __m512 s[8])
{
#pragma GCC unroll 8
    for (int p = 0; p < NP; p++)
        s[p] = _mm512_setzero_ps();
}

/* acc[h] = acc[h] + d * gsum for groups g0 .. g0+n_g-1 in order (rows
 * 8h .. 8h+7 in lanes; gs: their group sums, [group][row]) */
static inline __attribute__((always_inline)) void
apply_scales(const int NP, __m256 acc[2], const uint8_t *row0, size_t row_bytes, int64_t g0,
             int n_g, float gs[8][16])
{
    for (int h = 0; h < NP / 4; h++) {
        __m256 d[8];
        scales8x8(d, row0 + (size_t)(8 * h) * row_bytes, row_bytes, g0, n_g);
        for (int k = 0; k < n_g; k++)
            acc[h] = _mm256_add_ps(acc[h], _mm256_mul_ps(d[k], _mm256_loadu_ps(gs[k] + 8 * h)));
    }
}

/* y[0 .. 2*NP-1] = the rows' sums over full groups (acc) plus the partial
 * last group, if any, in scalar (int4 when q4, else int8; qs: each row's
 * quants) */
static inline __attribute__((always_inline)) void
store_rows(const int NP, const int q4, float *y, const __m256 acc[2], const float *x,
           const uint8_t *row0, size_t row_bytes, int64_t n, int G, const void *const *qs)
{
    float out[16];
    _mm256_storeu_ps(out, acc[0]);
    _mm256_storeu_ps(out + 8, acc[1]);
    const int64_t n_full = n / G;
    if (n_full * G < n) {
        const int64_t i0 = n_full * G;
        for (int r = 0; r < 2 * NP; r++) {
            float d;
            memcpy(&d, row0 + (size_t)r * row_bytes + 4 * (size_t)n_full, sizeof d);
            out[r] += d * (q4 ? tail_q4(x + i0, (const uint8_t *)qs[r] + i0 / 2, n - i0)
                              : tail_q8(x + i0, (const int8_t *)qs[r] + i0, n - i0));
        }
    }
    memcpy(y, out, (size_t)(2 * NP) * sizeof(float));
}

/* y[0 .. 2*NP-1] = x . W[rows 0 .. 2*NP-1]^T for one token, int4, group G
 * (NP = 4 or 8 row pairs, G = 32, 64 or 128: compile-time constants of the
 * callers below). row0 is the first row; pf/pf_bytes: memory to prefetch
 * while computing (the next block). */
static inline __attribute__((always_inline)) void
rows_q4(const int NP, const int G, float *y, const float *x, const uint8_t *row0,
        size_t row_bytes, int64_t n, __m512i tr, __m512i sel0, __m512 table,
        const uint8_t *pf, size_t pf_bytes)
{
    const int64_t n_full = n / G;   /* full groups; a partial one is done in scalar */
    const uint8_t *qs[16];
    for (int r = 0; r < 2 * NP; r++)
        qs[r] = shoal_quant_row_qs(row0 + (size_t)r * row_bytes, n, G);
#if defined(__AVX512VBMI__)
    const __m512i eight = _mm512_set1_epi8(8);    /* next step's bit offsets */
#else
    const __m512i eight = _mm512_set1_epi32(1);   /* next step's dwords */
#endif
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    /* prefetch stride: the block ahead, spread over this block's windows */
    const int64_t n_win = (n_full * G + WINDOW - 1) / WINDOW;
    const size_t pf_step = n_win > 0 ? (pf_bytes / (size_t)n_win + 63) & ~(size_t)63 : 0;
    size_t pf_at = 0;
    for (int64_t g0 = 0; g0 < n_full; g0 += 8) {
        /* up to 8 groups; their sums wait in gs (rows in lanes) until the
         * scales are transposed the same way, then go in group order */
        const int n_g = n_full - g0 < 8 ? (int)(n_full - g0) : 8;
        const int64_t e_end = (g0 + n_g) * G;
        float gs[8][16];
        int gi = 0;
        __m512 s[8];
        zero_chains(NP, s);
        for (int64_t e0 = g0 * G; e0 < e_end; e0 += WINDOW) {
            prefetch_next(pf, pf_bytes, pf_step, &pf_at);
            /* a window is 64 elements, or 32 at the end of an odd number
             * of G = 32 groups: load only those bytes */
            const int wl = e_end - e0 < WINDOW ? (int)(e_end - e0) : WINDOW;
            const __mmask32 m = wl == WINDOW ? 0xffffffffu : 0x0000ffffu;
            __m512i z[8];
#pragma GCC unroll 8
            for (int p = 0; p < NP; p++) {
                const __m256i a = _mm256_maskz_loadu_epi8(m, qs[2 * p] + e0 / 2);
                const __m256i b = _mm256_maskz_loadu_epi8(m, qs[2 * p + 1] + e0 / 2);
#if defined(__AVX512VBMI__)
                z[p] = _mm512_permutexvar_epi8(
                    tr, _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1));
#else
                z[p] = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
#endif
            }
            __m512i sel = sel0;
#pragma GCC unroll 8
            for (int j = 0; j < WINDOW / 8; j++) {
                if (G == 32 && j == 4 && wl < WINDOW)
                    break;   /* only G = 32 has half windows */
                const __m512 xv = _mm512_castpd_ps(_mm512_broadcast_f64x4(
                    _mm256_castps_pd(_mm256_loadu_ps(x + e0 + 8 * j))));
#pragma GCC unroll 8
                for (int p = 0; p < NP; p++) {
#if defined(__AVX512VBMI__)
                    const __m512i u = _mm512_multishift_epi64_epi8(sel, z[p]);
#else
                    const __m512i u = _mm512_srlv_epi32(_mm512_permutexvar_epi32(sel, z[p]), tr);
#endif
                    const __m512 q = _mm512_permutexvar_ps(u, table);
                    s[p] = _mm512_add_ps(s[p], _mm512_mul_ps(xv, q));
                }
                sel = _mm512_add_epi32(sel, eight);   /* bytes never carry: < 64 */
                /* keep GCC from hoisting later steps' nibble lookups above
                 * this step's adds: it did, and spilled them (G=128 ran
                 * 15 % slower); the empty asm orders the compiler only */
                if (NP == 8)
                    __asm__("" : "+v"(sel) : "v"(s[0]), "v"(s[1]), "v"(s[2]), "v"(s[3]),
                            "v"(s[4]), "v"(s[5]), "v"(s[6]), "v"(s[7]));
                else
                    __asm__("" : "+v"(sel) : "v"(s[0]), "v"(s[1]), "v"(s[2]), "v"(s[3]));
                /* a group ends here: G = 32 after steps 3 and 7, G = 64
                 * after step 7, G = 128 after step 7 of every other window */
                if ((G == 32 && j == 3) ||
                    (j == 7 && (G <= WINDOW || (e0 + WINDOW) % G == 0))) {
                    _mm256_storeu_ps(gs[gi], tree8_rows8(s));
                    if (NP == 8)
                        _mm256_storeu_ps(gs[gi] + 8, tree8_rows8(s + 4));
                    gi++;
                    zero_chains(NP, s);
                }
            }
        }
        apply_scales(NP, acc, row0, row_bytes, g0, n_g, gs);
    }
    store_rows(NP, 1, y, acc, x, row0, row_bytes, n, G, (const void *const *)qs);
}

#define WINDOW8 32   /* int8 elements per row per packed load */

/* rows_q4's int8 twin: same rows, chains, trees, scales and prefetch. A
 * window is 32 elements of each row of a pair, z = [A's 32 bytes | B's];
 * step j (elements 8j .. 8j+7) brings A's qword j and B's qword j to the
 * low 128 bits with vpermq, widens those 16 bytes to int32 lanes (row A in
 * lanes 0..7, B in 8..15) with vpmovsxbd and converts them exactly. */
static inline __attribute__((always_inline)) void
rows_q8(const int NP, const int G, float *y, const float *x, const uint8_t *row0,
        size_t row_bytes, int64_t n, const uint8_t *pf, size_t pf_bytes)
{
    const int64_t n_full = n / G;
    const int8_t *qs[16];
    for (int r = 0; r < 2 * NP; r++)
        qs[r] = (const int8_t *)shoal_quant_row_qs(row0 + (size_t)r * row_bytes, n, G);
    const __m512i one = _mm512_set1_epi64(1);
    const __m512i idx0 = _mm512_setr_epi64(0, 4, 0, 0, 0, 0, 0, 0);
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    const int64_t n_win = n_full * G / WINDOW8;
    const size_t pf_step = n_win > 0 ? (pf_bytes / (size_t)n_win + 63) & ~(size_t)63 : 0;
    size_t pf_at = 0;
    for (int64_t g0 = 0; g0 < n_full; g0 += 8) {
        const int n_g = n_full - g0 < 8 ? (int)(n_full - g0) : 8;
        const int64_t e_end = (g0 + n_g) * G;
        float gs[8][16];
        int gi = 0;
        __m512 s[8];
        zero_chains(NP, s);
        for (int64_t e0 = g0 * G; e0 < e_end; e0 += WINDOW8) {
            prefetch_next(pf, pf_bytes, pf_step, &pf_at);
            __m512i z[8];
#pragma GCC unroll 8
            for (int p = 0; p < NP; p++)
                z[p] = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)(qs[2 * p] + e0))),
                    _mm256_loadu_si256((const __m256i *)(const void *)(qs[2 * p + 1] + e0)), 1);
            __m512i sel = idx0;
#pragma GCC unroll 4
            for (int j = 0; j < WINDOW8 / 8; j++) {
                const __m512 xv = _mm512_castpd_ps(_mm512_broadcast_f64x4(
                    _mm256_castps_pd(_mm256_loadu_ps(x + e0 + 8 * j))));
#pragma GCC unroll 8
                for (int p = 0; p < NP; p++) {
                    const __m128i b = _mm512_castsi512_si128(_mm512_permutexvar_epi64(sel, z[p]));
                    const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
                    s[p] = _mm512_add_ps(s[p], _mm512_mul_ps(xv, q));
                }
                sel = _mm512_add_epi64(sel, one);
                if (NP == 8)
                    __asm__("" : "+v"(sel) : "v"(s[0]), "v"(s[1]), "v"(s[2]), "v"(s[3]),
                            "v"(s[4]), "v"(s[5]), "v"(s[6]), "v"(s[7]));
                else
                    __asm__("" : "+v"(sel) : "v"(s[0]), "v"(s[1]), "v"(s[2]), "v"(s[3]));
                if (j == 3 && (e0 + WINDOW8) % G == 0) {   /* a group ends */
                    _mm256_storeu_ps(gs[gi], tree8_rows8(s));
                    if (NP == 8)
                        _mm256_storeu_ps(gs[gi] + 8, tree8_rows8(s + 4));
                    gi++;
                    zero_chains(NP, s);
                }
            }
        }
        apply_scales(NP, acc, row0, row_bytes, g0, n_g, gs);
    }
    store_rows(NP, 0, y, acc, x, row0, row_bytes, n, G, (const void *const *)qs);
}

typedef void (*rows_fn)(float *y, const float *x, const uint8_t *row0, size_t row_bytes,
                        int64_t n, __m512i tr, __m512i sel0, __m512 table,
                        const uint8_t *pf, size_t pf_bytes);

#define ROWS_FN(NP, G)                                                                   \
    static void rows_q4_##NP##_##G(float *y, const float *x, const uint8_t *row0,        \
                                   size_t row_bytes, int64_t n, __m512i tr, __m512i sel0, \
                                   __m512 table, const uint8_t *pf, size_t pf_bytes)     \
    {                                                                                    \
        rows_q4(NP, G, y, x, row0, row_bytes, n, tr, sel0, table, pf, pf_bytes);         \
    }
ROWS_FN(8, 32)
ROWS_FN(8, 64)
ROWS_FN(8, 128)
ROWS_FN(4, 32)
ROWS_FN(4, 64)
ROWS_FN(4, 128)

#define ROWS8_FN(NP, G)                                                                   \
    static void rows_q8_##NP##_##G(float *y, const float *x, const uint8_t *row0,         \
                                   size_t row_bytes, int64_t n, __m512i tr, __m512i sel0,  \
                                   __m512 table, const uint8_t *pf, size_t pf_bytes)      \
    {                                                                                     \
        (void)tr;                                                                         \
        (void)sel0;                                                                       \
        (void)table;                                                                      \
        rows_q8(NP, G, y, x, row0, row_bytes, n, pf, pf_bytes);                           \
    }
ROWS8_FN(8, 32)
ROWS8_FN(8, 64)
ROWS8_FN(8, 128)
ROWS8_FN(4, 32)
ROWS8_FN(4, 64)
ROWS8_FN(4, 128)

static void linear_rows_avx512(float *y, const float *x, int64_t n_tok,
                               const struct shoal_quant_weight *w, int64_t r0,
                               int64_t r1)
{
    const size_t row_bytes = shoal_quant_row_bytes(w->type, w->cols, w->group);
    rows_fn f16, f8;
    const int q4 = w->type == SHOAL_QUANT_INT4;
    switch (w->group) {
    case 32: f16 = q4 ? rows_q4_8_32 : rows_q8_8_32; f8 = q4 ? rows_q4_4_32 : rows_q8_4_32; break;
    case 64: f16 = q4 ? rows_q4_8_64 : rows_q8_8_64; f8 = q4 ? rows_q4_4_64 : rows_q8_4_64; break;
    default:
        f16 = q4 ? rows_q4_8_128 : rows_q8_8_128;
        f8 = q4 ? rows_q4_4_128 : rows_q8_4_128;
        break;
    }
    __m512i tr, sel0;
    nibble_constants(&tr, &sel0);
    const __m512 table = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1,
                                        0, 1, 2, 3, 4, 5, 6, 7);
    const uint8_t *base = w->data;
    int64_t r = r0;
    while (r1 - r >= 8) {
        const int nb = r1 - r >= 16 ? 16 : 8;
        /* the next block (rows are back to back), read ahead of the
         * hardware prefetcher */
        const int64_t rn = r + nb, rn1 = rn + 16 < r1 ? rn + 16 : r1;
        const size_t pf_bytes = rn < rn1 ? (size_t)(rn1 - rn) * row_bytes : 0;
        for (int64_t t = 0; t < n_tok; t++)
            (nb == 16 ? f16 : f8)(y + t * w->rows + r, x + t * w->cols,
                                  base + (size_t)r * row_bytes, row_bytes, w->cols, tr,
                                  sel0, table, base + (size_t)rn * row_bytes,
                                  t == 0 ? pf_bytes : 0);
        r += nb;
    }
    if (r < r1)
        shoal_quant_ops_avx2.linear_rows(y, x, n_tok, w, r, r1);
}

/* one row at a time gains nothing from two-row vectors: the AVX2 kernel */
static float dot_avx512(enum shoal_quant_type type, int group, const float *x,
                        const void *row, int64_t n)
{
    return shoal_quant_ops_avx2.dot(type, group, x, row, n);
}

/* ---- INT4A8: int4 weights against int8 activations (quant.h) ------------
 *
 * Per row and token, each 128-column chunk is one 64-byte load: its low
 * nibbles are the even columns, its high nibbles the odd ones, which is the
 * order of the activation's chunk (struct shoal_quant_act). vpmaddubsw
 * multiplies nibble (u8, 0..15) by activation (s8) and adds pairs
 * (|sum| <= 2 * 15 * 127, no saturation); the even and odd halves are added
 * in int16 (<= 7620) and vpmaddwd with ones widens pairs to int32, so lane
 * l of a chunk's vector holds columns 8l .. 8l+7. Group sums are G/8
 * consecutive lanes: pair sums of neighbouring lanes, log2(G/8) times, keep
 * the groups in order. The f32 combine, acc + (d * dx) * isum, runs in group
 * order as the scalar one. Integer sums are exact, so the bits are the
 * scalar table's. A row whose width is not a multiple of 128 loads its last
 * chunk under a byte mask. */

#define A8_SEG 16          /* chunks of 128 columns per reduction */
#define A8_PF 8192         /* bytes of weights prefetched ahead */

static inline __m512i pair_sums(__m512i a, __m512i b, __m512i ie, __m512i io)
{
    return _mm512_add_epi32(_mm512_permutex2var_epi32(a, ie, b),
                            _mm512_permutex2var_epi32(a, io, b));
}

/* The int32 lanes of chunks c0 .. c0+nc-1 of one row into v[0 .. NC):
 * lane l of v[c] = sum over its 8 columns of nibble * activation; v[c] = 0
 * for nc <= c < NC. The last chunk of a row whose width is not a multiple
 * of 128 holds tail < 64 packed bytes and is loaded under a byte mask (the
 * activation's columns past the row are 0). The avx512 build (VBMI and
 * VNNI) uses vpdpbusd, 4-6 % faster on cache-resident weights; the
 * avx512bw build vpmaddubsw + vpmaddwd. Same integers. */
static inline __attribute__((always_inline)) void
a8_chunks(__m512i *v, const uint8_t *qs, const int8_t *q, int64_t c0, int NC, int nc, int tail,
          int prefetch)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), ones = _mm512_set1_epi16(1);
#pragma GCC unroll 16
    for (int c = 0; c < NC; c++) {
        if (c >= nc) {
            v[c] = _mm512_setzero_si512();
            continue;
        }
        const uint8_t *p = qs + 64 * (size_t)(c0 + c);
        if (prefetch)
            _mm_prefetch((const char *)p + A8_PF, SHOAL_PF_WEIGHTS);
        const __m512i b = c == nc - 1 && tail < 64
                              ? _mm512_maskz_loadu_epi8((__mmask64)((1ull << tail) - 1ull), p)
                              : _mm512_loadu_si512(p);
        const __m512i lo = _mm512_and_si512(b, m4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(b, 4), m4);
        const int8_t *e = q + 128 * (c0 + c);
#if defined(__AVX512VNNI__)
        /* vpdpbusd: the same four-product int32 sums in one instruction */
        (void)ones;
        v[c] = _mm512_dpbusd_epi32(
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(e)), hi,
            _mm512_loadu_si512(e + 64));
#else
        const __m512i s16 = _mm512_add_epi16(_mm512_maddubs_epi16(lo, _mm512_loadu_si512(e)),
                                             _mm512_maddubs_epi16(hi, _mm512_loadu_si512(e + 64)));
        v[c] = _mm512_madd_epi16(s16, ones);
#endif
    }
}

/* The ng group terms of one row's segment (chunks c0 .. c0+nc-1, run as NC
 * with zero chunks after them) into pr[0 .. ng):
 * pr[g] = (d[g] * dx[g]) * (float)isum[g]. */
static inline __attribute__((always_inline)) void
a8_segment(float *pr, const uint8_t *qs, const float *dw, const int8_t *q, const float *dx,
           const int32_t *sx, int64_t c0, int NC, int nc, int tail, int64_t ng, int G, int levels,
           int prefetch)
{
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22,
                                         24, 26, 28, 30);
    const __m512i io = _mm512_add_epi32(ie, _mm512_set1_epi32(1));
    __m512i v[A8_SEG];
    a8_chunks(v, qs, q, c0, NC, nc, tail, prefetch);
    int nv = NC;
#pragma GCC unroll 4
    for (int l = 0; l < levels; l++) {
        const int m = (nv + 1) / 2;
#pragma GCC unroll 8
        for (int i = 0; i < m; i++)
            v[i] = pair_sums(v[2 * i], 2 * i + 1 < nv ? v[2 * i + 1] : _mm512_setzero_si512(),
                             ie, io);
        nv = m;
    }
    const int64_t g0 = c0 * 128 / G;
    for (int64_t h = 0; 16 * h < ng; h++) {
        const int cnt = ng - 16 * h < 16 ? (int)(ng - 16 * h) : 16;
        const __mmask16 k = (__mmask16)((1u << cnt) - 1u);
        const int64_t gi = g0 + 16 * h;
        const __m512 f =
            _mm512_cvtepi32_ps(_mm512_sub_epi32(v[h], _mm512_maskz_loadu_epi32(k, sx + gi)));
        const __m512 dd = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, dw + gi),
                                        _mm512_maskz_loadu_ps(k, dx + gi));
        _mm512_mask_storeu_ps(pr + 16 * h, k, _mm512_mul_ps(dd, f));
    }
}

/* In-register transpose of 16 x 16 f32: c[i] lane j becomes c[j] lane i. */
static inline void transpose16(__m512 c[16])
{
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(c[i], c[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(c[i], c[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        c[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        c[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        c[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
        c[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    /* c[4b + k] now holds, per 128-bit lane L, rows 4b..4b+3 of column 4L + k */
    for (int i = 0; i < 8; i++) {
        const int b = i / 4 * 8 + i % 4;     /* 0 1 2 3 8 9 10 11 */
        t[i] = _mm512_shuffle_f32x4(c[b], c[b + 4], 0x88);       /* lanes 0,2 | 0,2 */
        t[i + 8] = _mm512_shuffle_f32x4(c[b], c[b + 4], 0xdd);   /* lanes 1,3 | 1,3 */
    }
    for (int i = 0; i < 4; i++) {
        c[i] = _mm512_shuffle_f32x4(t[i], t[i + 4], 0x88);
        c[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 4], 0xdd);
        c[i + 4] = _mm512_shuffle_f32x4(t[i + 8], t[i + 12], 0x88);
        c[i + 12] = _mm512_shuffle_f32x4(t[i + 8], t[i + 12], 0xdd);
    }
}

/* a8_segment with the chunk count rounded up to 2, 4, 6, 8 or 16 and G as
 * compile-time constants (A8_SEG = 16 is the most), so that v[] stays in registers and the
 * reduction unrolls (a cache-resident [2048][768] down matrix: 22 -> 28
 * GB/s on one core; [1024][512] and [512][384] ran the general loop at
 * 12 GB/s). Zero chunks past nc cost a little arithmetic, no loads. */
static inline __attribute__((always_inline)) void
a8_segment_any(float *pr, const uint8_t *qs, const float *dw, const int8_t *q, const float *dx,
               const int32_t *sx, int64_t c0, int nc, int tail, int64_t ng, int G, int prefetch)
{
    /* the common counts exactly (no per-chunk branch on nc), the others
     * rounded up */
#define A8_EXACT(NC, GG, LV)                                                               \
    if (nc == (NC) && G == (GG)) {                                                         \
        a8_segment(pr, qs, dw, q, dx, sx, c0, (NC), (NC), tail, ng, (GG), (LV), prefetch); \
        return;                                                                            \
    }
#define A8_CASE(NC, GG, LV)                                                                \
    if (nc <= (NC) && G == (GG)) {                                                         \
        a8_segment(pr, qs, dw, q, dx, sx, c0, (NC), nc, tail, ng, (GG), (LV), prefetch);   \
        return;                                                                            \
    }
    A8_EXACT(16, 32, 2) A8_EXACT(16, 64, 3) A8_EXACT(16, 128, 4)
    A8_EXACT(8, 32, 2) A8_EXACT(8, 64, 3) A8_EXACT(8, 128, 4)
    A8_EXACT(6, 32, 2) A8_EXACT(6, 64, 3) A8_EXACT(6, 128, 4)
    A8_CASE(2, 32, 2) A8_CASE(2, 64, 3) A8_CASE(2, 128, 4)
    A8_CASE(4, 32, 2) A8_CASE(4, 64, 3) A8_CASE(4, 128, 4)
    A8_CASE(8, 32, 2) A8_CASE(8, 64, 3) A8_CASE(8, 128, 4)
    A8_CASE(16, 32, 2) A8_CASE(16, 64, 3)
#undef A8_CASE
#undef A8_EXACT
    a8_segment(pr, qs, dw, q, dx, sx, c0, A8_SEG, nc, tail, ng, 128, 4, prefetch);
}

/* ---- INT4A8 batches: a register-blocked GEMM -----------------------------
 *
 * From A8G_MIN_TOK tokens on, 16 rows at a time: the block's packed nibbles
 * are transposed once into w16 (per 128-column chunk c, vector 16c + j
 * holds dword j of each of the 16 rows, lane i = row i's 8 nibbles of
 * columns 8j .. 8j+7), so that one vpdpbusd multiplies 4 nibbles of each
 * of 16 rows by the same 4 activation bytes of one token, broadcast: the
 * lanes are rows, nothing is summed across lanes, and each nibble is
 * unpacked once per A8G_T tokens. (The activations' chunk order puts
 * columns 8j, 8j+2, 8j+4, 8j+6 at bytes 4j .. 4j+3 of the chunk, and the
 * odd ones 64 bytes later: one dword each.) The integer group sums are
 * exact, so they equal the scalar rows'; each token's combine
 * acc = acc + (d * dx) * (float)isum runs in group order, one lane per row:
 * the same bits as the scalar table. Its weight bytes are read once per
 * token tile instead of once per token, and the horizontal sums of the
 * decode kernel are gone: on a cache-resident [768][2048] G=64 weight,
 * 2 threads, it ran ~5x the per-token path at 32 tokens. */
#define A8G_T 8            /* tokens per register block */
#if defined(__AVX512VNNI__)
#define A8G_MIN_TOK SHOAL_QUANT_AVX512_GEMM_MIN_TOK /* 2 .. A8G_MIN_TOK - 1 tokens run
                            * rows_a8_few (its block unpacked in registers, no
                            * stack copy): kernel_l2, Zen 4, [256][2048] G=64 in
                            * L2, ns per row, 32 columns and token: few 0.21-0.22
                            * (tiles of 8) against the GEMM's 0.26-0.30 at 8-11
                            * tokens, 0.22 against 0.20 at 12, 0.20 against 0.19
                            * at 16 */
#else
#define A8G_MIN_TOK SHOAL_QUANT_AVX512BW_GEMM_MIN_TOK /* without VNNI (dp4: three
                            * instructions) the GEMM led from 8 tokens: kernel_l2
                            * --isa avx512bw on Zen 4, 0.35 against 0.43 */
#endif
#define A8G_MAXN 8192      /* columns: w16 holds 8 * n bytes on the stack */

/* sum of u8 x s8 products of each 4-byte lane added to acc (vpdpbusd) */
static inline __m512i dp4(__m512i acc, __m512i u, __m512i s)
{
#if defined(__AVX512VNNI__)
    return _mm512_dpbusd_epi32(acc, u, s);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s),
                                                   _mm512_set1_epi16(1)));
#endif
}

static inline int32_t load_i32(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* sum[t] lane i = row i's exact sum over dwords J0 .. J0 + NJ - 1 (NJ
 * even) of v (vector j lane i = row i's dword j, nibbles not yet split)
 * against token t's activations: the low nibbles of dword j times the
 * bytes at e[t] + 4j (the chunk order's columns 8j, 8j+2, 8j+4, 8j+6),
 * the high ones times those 64 bytes on, for TT tokens (compile-time, at
 * most A8G_T). NA independent sums a token (their total is the same
 * integer): a vpdpbusd's result is ready 4 cycles after it issues and one
 * zmm (two ymm) issues a cycle (Zen 4), so 4-8 chains keep it busy; with one sum a
 * token, 2-4 tokens waited on their chains. Shared by the GEMM
 * (a8g_block) and rows_a8_few. */
static inline __attribute__((always_inline)) void
dot16_tokens(__m512i sum[], const __m512i *v, const int8_t *const e[], int J0, int NJ,
             const int TT)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const int NA = TT >= 8 ? 1 : TT >= 4 ? 2 : 4;
    __m512i s[A8G_T][4];
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++)
#pragma GCC unroll 4
        for (int k = 0; k < NA; k++)
            s[t][k] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int j = J0; j < J0 + NJ; j += 2) {
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {           /* dword j + h into sums k0, k1 */
            const __m512i b = v[j + h];
            const __m512i lo = _mm512_and_si512(b, m4);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi32(b, 4), m4);
            const int k0 = NA == 4 ? 2 * h : 0, k1 = NA == 1 ? 0 : k0 + 1;
#pragma GCC unroll 8
            for (int t = 0; t < TT; t++) {
                const int8_t *et = e[t] + 4 * (j + h);
                s[t][k0] = dp4(s[t][k0], lo, _mm512_set1_epi32(load_i32(et)));
                s[t][k1] = dp4(s[t][k1], hi, _mm512_set1_epi32(load_i32(et + 64)));
            }
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++) {
        __m512i x = s[t][0];
#pragma GCC unroll 4
        for (int k = 1; k < NA; k++)
            x = _mm512_add_epi32(x, s[t][k]);
        sum[t] = x;
    }
}

/* acc + (d * dx) * (float)(isum - sx), lanes = rows: the scalar chain's
 * operations */
static inline __attribute__((always_inline)) __m512 chain16(__m512 acc, __m512i isum, __m512 d,
                                                            float dx, int32_t sx)
{
    const __m512 f = _mm512_cvtepi32_ps(_mm512_sub_epi32(isum, _mm512_set1_epi32(sx)));
    return _mm512_add_ps(acc, _mm512_mul_ps(_mm512_mul_ps(d, _mm512_set1_ps(dx)), f));
}

/* Tokens t0 .. t0+T-1 against the 16 rows in w16/d16 (y: the block's first
 * row of token 0, y_stride floats per token). */
static inline __attribute__((always_inline)) void
a8g_block(float *y, int64_t y_stride, const struct shoal_quant_act *a, int64_t t0, const int T,
          const __m512i *w16, const float *d16, int64_t nck, int64_t n_group, int G,
          const uint8_t *pf, size_t pf_bytes)
{
    /* pf_bytes at pf (the next block's rows) prefetched over the chunks, so
     * the weight stream runs while this block computes */
    const size_t pf_step = pf_bytes ? (pf_bytes / (size_t)nck + 63) & ~(size_t)63 : 0;
    size_t pf_at = 0;
    const int jpg = G / 8;                       /* dwords per group: 4, 8 or 16 */
    __m512 acc[A8G_T];
    __m512i is[A8G_T];
    const int8_t *e[A8G_T];
    for (int t = 0; t < T; t++)
        acc[t] = _mm512_setzero_ps();
    int64_t g = 0;
    for (int64_t c = 0; c < nck; c++) {
        const __m512i *wc = w16 + 16 * c;
        prefetch_next(pf, pf_bytes, pf_step, &pf_at);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            e[t] = a->q + (t0 + t) * a->q_stride + 128 * c;
        for (int j0 = 0; j0 < 16 && g < n_group; j0 += jpg, g++) {
            dot16_tokens(is, wc, e, j0, jpg, T);
            const __m512 dv = _mm512_load_ps(d16 + 16 * g);
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                const int64_t k = (t0 + t) * a->n_group + g;
                acc[t] = chain16(acc[t], is[t], dv, a->d[k], a->s[k]);
            }
        }
    }
    for (int t = 0; t < T; t++)
        _mm512_storeu_ps(y + (t0 + t) * y_stride, acc[t]);
}

/* d16[16 g + i] = row i's scale of group g, the 16 rows at base */
static void scales16(float *d16, const uint8_t *base, size_t row_bytes, int64_t n_group)
{
    for (int64_t g0 = 0; g0 < n_group; g0 += 16) {
        const int cnt = n_group - g0 < 16 ? (int)(n_group - g0) : 16;
        const __mmask16 k = (__mmask16)((1u << cnt) - 1u);
        __m512 c[16];
        for (int i = 0; i < 16; i++)
            c[i] = _mm512_maskz_loadu_ps(k, base + (size_t)i * row_bytes + 4 * (size_t)g0);
        transpose16(c);
        for (int j = 0; j < cnt; j++)
            _mm512_store_ps(d16 + 16 * (g0 + j), c[j]);
    }
}

/* The rows a block of 16 at rb prefetches while it computes (prefetch_next
 * over its pieces): the block ahead blocks on, while it lies whole below
 * r1; then, for the first block past that, the first bytes this thread
 * reads next (a->next); then none. The pointer is formed only inside the
 * rows. */
static inline const uint8_t *block_ahead(const struct shoal_quant_act *a, const uint8_t *data,
                                         size_t row_bytes, int64_t rb, int64_t r1, int ahead,
                                         size_t *pf_bytes)
{
    const int64_t pr0 = rb + 16 * (int64_t)ahead;
    if (pr0 + 16 <= r1) {
        *pf_bytes = 16 * row_bytes;
        return data + (size_t)pr0 * row_bytes;
    }
    if (a->next && pr0 <= r1) {
        *pf_bytes = a->next_bytes < 16 * row_bytes ? a->next_bytes : 16 * row_bytes;
        return a->next;
    }
    *pf_bytes = 0;
    return NULL;
}

/* Full blocks of 16 rows from rb0 while they fit below r1, every token;
 * returns the first row not done. */
static __attribute__((noinline)) int64_t rows_a8_gemm(float *y, const struct shoal_quant_act *a, int64_t n_tok,
                            const struct shoal_quant_weight *w, int64_t rb0, int64_t r1)
{
    const int64_t n = w->cols;
    const int G = w->group;
    const size_t row_bytes = shoal_quant_row_bytes(SHOAL_QUANT_INT4, n, G);
    const int64_t n_group = (n + G - 1) / G, nck = (n + 127) / 128;
    const int tail = n % 128 ? (int)((n % 128 + 1) / 2) : 64;
    _Alignas(64) __m512i w16[16 * (A8G_MAXN / 128)];
    _Alignas(64) float d16[16 * (A8G_MAXN / 32)];
    int64_t rb = rb0;
    for (; rb + 16 <= r1; rb += 16) {
        const uint8_t *base = (const uint8_t *)w->data + (size_t)rb * row_bytes;
        for (int64_t c = 0; c < nck; c++) {
            __m512 v[16];
            const __mmask64 k = c == nck - 1 && tail < 64 ? (__mmask64)((1ull << tail) - 1ull)
                                                           : ~(__mmask64)0;
            for (int i = 0; i < 16; i++)
                v[i] = _mm512_castsi512_ps(_mm512_maskz_loadu_epi8(
                    k, base + (size_t)i * row_bytes + 4 * (size_t)n_group + 64 * (size_t)c));
            transpose16(v);
            for (int j = 0; j < 16; j++)
                _mm512_store_si512(w16 + 16 * c + j, _mm512_castps_si512(v[j]));
        }
        scales16(d16, base, row_bytes, n_group);
        /* the next block, prefetched by the first token tile */
        size_t pf_bytes;
        const uint8_t *pf = block_ahead(a, w->data, row_bytes, rb, r1, 1, &pf_bytes);
        int64_t t = 0;
#define BLOCK(T_) do {                                                                    \
            a8g_block(y + rb, w->rows, a, t, T_, w16, d16, nck, n_group, G, pf, pf_bytes); \
            pf_bytes = 0;                                                                 \
            t += T_;                                                                      \
        } while (0)
        while (t + A8G_T <= n_tok)
            BLOCK(A8G_T);
        if (n_tok - t >= 4)
            BLOCK(4);
        if (n_tok - t >= 2)
            BLOCK(2);
        if (n_tok - t >= 1)
            BLOCK(1);
#undef BLOCK
    }
    return rb;
}

/* ---- INT4A8 batches of a few tokens: 16 rows, each half transposed once --
 *
 * For 2 .. A8G_MIN_TOK - 1 tokens (and the tokens a8g's tiles leave), the
 * GEMM's layout without its stack copy of the block: a block of 16 rows
 * advances a half (32 bytes of each row, 64 columns) at a time; the 16 x 8
 * dwords are transposed in registers (vector j lane i = row i's dword j:
 * rows 0-7 in the low 256 bits, 8-15 in the high), split into nibbles, and
 * every token of the tile multiplies them at once by its activation
 * dwords, broadcast (vpdpbusd; 4j .. 4j+3 are the low nibbles' columns of
 * dword j in the chunk order, the high ones 64 bytes on). Tiles of 8
 * tokens, then 4, 3, 2 or 1: a half's loads, transpose and nibble split
 * (about 56 vector operations, on the pipes vpdpbusd leaves free) are
 * paid once a tile, its 16 vpdpbusd once a token (Zen 4 issues one zmm
 * vpdpbusd a cycle); kernel_l2, [256][2048] G=64 in L2, ns per row, 32
 * columns and token at 8 tokens: 0.21 against 0.24 in two tiles of 4.
 * One, two or four sums a token so that vpdpbusd's latency is hidden. The
 * group sums are exact integers; each token's chain acc + (d * dx) *
 * (float)(isum - sx) runs in group order, a lane per row: the scalar
 * table's bits. The next block's rows are prefetched across the halves. */

/* v[j] (j < 8): lane i = row i's dword j of the half at p (rows p + i rb,
 * i < 16); a partial last half (bytes < 32) is read masked, zero past it */
static inline __attribute__((always_inline)) void half16_load(__m512i v[8], const uint8_t *p,
                                                              size_t rb, int bytes)
{
    if (bytes == 32) {
        for (int i = 0; i < 8; i++)
            v[i] = _mm512_inserti64x4(
                _mm512_castsi256_si512(
                    _mm256_loadu_si256((const __m256i *)(const void *)(p + (size_t)i * rb))),
                _mm256_loadu_si256((const __m256i *)(const void *)(p + (size_t)(i + 8) * rb)), 1);
    } else {
        const __mmask32 k = (__mmask32)((1u << bytes) - 1u);
        for (int i = 0; i < 8; i++)
            v[i] = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_maskz_loadu_epi8(k, p + (size_t)i * rb)),
                _mm256_maskz_loadu_epi8(k, p + (size_t)(i + 8) * rb), 1);
    }
    /* an 8 x 8 dword transpose in each 256-bit half */
    __m512i t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    /* u[k] (k < 4), per 128-bit lane L: rows 0-3 (L = 0, 1: dwords k and
     * 4 + k) and 8-11 (L = 2, 3); u[4 + k] rows 4-7 and 12-15 */
    const __m512i lo_idx = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i hi_idx = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    for (int k = 0; k < 4; k++) {
        v[k] = _mm512_permutex2var_epi64(u[k], lo_idx, u[4 + k]);
        v[4 + k] = _mm512_permutex2var_epi64(u[k], hi_idx, u[4 + k]);
    }
}

/* Tokens t0 .. t0 + TT - 1 against the 16 rows at base (scales d16:
 * vector g = the rows' d of group g); y: row 0 of token 0. */
static inline __attribute__((always_inline)) void
a8f_block(float *y, int64_t y_stride, const struct shoal_quant_act *a, int64_t t0,
          const uint8_t *base, size_t row_bytes, const float *d16, int64_t n_group, int64_t nh,
          int tail, const uint8_t *pf, size_t pf_bytes, const int G, const int TT)
{
    const size_t pf_step = pf_bytes ? (pf_bytes / (size_t)nh + 63) & ~(size_t)63 : 0;
    size_t pf_at = 0;
    const uint8_t *qs = base + 4 * (size_t)n_group;
    const int64_t ng = a->n_group;
    __m512 acc[A8G_T];
    __m512i part[A8G_T];                           /* G=128: a group's first half */
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++) {
        acc[t] = _mm512_setzero_ps();
        part[t] = _mm512_setzero_si512();
    }
    for (int64_t hh = 0; hh < nh; hh++) {
        prefetch_next(pf, pf_bytes, pf_step, &pf_at);
        __m512i v[8];
        half16_load(v, qs + 32 * (size_t)hh, row_bytes, hh == nh - 1 ? tail : 32);
        const int8_t *e[A8G_T];
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++)
            e[t] = a->q + (t0 + t) * a->q_stride + 128 * (hh >> 1) + 32 * (hh & 1);
        __m512i sum[A8G_T];
        if (G == 32) {                             /* groups 2 hh (dwords 0-3), 2 hh + 1 */
            const int64_t g = 2 * hh;
            dot16_tokens(sum, v, e, 0, 4, TT);
            const __m512 d = _mm512_load_ps(d16 + 16 * g);
#pragma GCC unroll 8
            for (int t = 0; t < TT; t++)
                acc[t] = chain16(acc[t], sum[t], d, a->d[(t0 + t) * ng + g],
                                 a->s[(t0 + t) * ng + g]);
            if (g + 1 < n_group) {
                dot16_tokens(sum, v, e, 4, 4, TT);
                const __m512 d1 = _mm512_load_ps(d16 + 16 * (g + 1));
#pragma GCC unroll 8
                for (int t = 0; t < TT; t++)
                    acc[t] = chain16(acc[t], sum[t], d1, a->d[(t0 + t) * ng + g + 1],
                                     a->s[(t0 + t) * ng + g + 1]);
            }
            continue;
        }
        dot16_tokens(sum, v, e, 0, 8, TT);
        const int64_t g = G == 64 ? hh : hh / 2;
        if (G == 128 && (hh & 1) == 0 && hh + 1 < nh) {   /* a group's first half of two */
#pragma GCC unroll 8
            for (int t = 0; t < TT; t++)
                part[t] = sum[t];
            continue;
        }
        const __m512 d = _mm512_load_ps(d16 + 16 * g);
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) {
            const __m512i is = G == 128 && (hh & 1) ? _mm512_add_epi32(sum[t], part[t]) : sum[t];
            acc[t] = chain16(acc[t], is, d, a->d[(t0 + t) * ng + g], a->s[(t0 + t) * ng + g]);
        }
    }
    for (; pf_at < pf_bytes; pf_at += 64)
        _mm_prefetch((const char *)pf + pf_at, SHOAL_PF_WEIGHTS);
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++)
        _mm512_storeu_ps(y + (t0 + t) * y_stride, acc[t]);
}

/* blocks of 16 rows a block's prefetch runs ahead (2: kernel_bench, 4
 * tokens, Zen 4, 2 threads, 63-71 GB/s x tok against 63-69 at 1 and 56-63
 * at 3) */
#define A8F_AHEAD 2

/* Whole blocks of 16 rows from rb0 while they fit below r1, every token
 * in tiles of at most 8 (a8f_block); returns the first row not done. */
static __attribute__((noinline)) int64_t rows_a8_few(float *y, const struct shoal_quant_act *a,
                                                     int64_t n_tok,
                                                     const struct shoal_quant_weight *w,
                                                     int64_t rb0, int64_t r1)
{
    const int64_t n = w->cols;
    const int G = w->group;
    const size_t row_bytes = shoal_quant_row_bytes(SHOAL_QUANT_INT4, n, G);
    const int64_t n_group = (n + G - 1) / G, nh = (n + 63) / 64;
    const int tail = n % 64 ? (int)((n % 64 + 1) / 2) : 32;
    _Alignas(64) float d16[16 * (A8G_MAXN / 32)];
    int64_t rb = rb0;
    /* the first A8F_AHEAD blocks now; each later one while the block
     * A8F_AHEAD before it computes */
    const size_t first = (size_t)(r1 - rb0 < 16 * A8F_AHEAD ? r1 - rb0 : 16 * A8F_AHEAD) *
                         row_bytes;
    for (size_t o = 0; o < first; o += 64)
        _mm_prefetch((const char *)w->data + (size_t)rb0 * row_bytes + o, SHOAL_PF_WEIGHTS);
    for (; rb + 16 <= r1; rb += 16) {
        const uint8_t *base = (const uint8_t *)w->data + (size_t)rb * row_bytes;
        scales16(d16, base, row_bytes, n_group);
        size_t pf_bytes;
        const uint8_t *pf = block_ahead(a, w->data, row_bytes, rb, r1, A8F_AHEAD, &pf_bytes);
        for (int64_t t = 0; t < n_tok;) {
            const int64_t left = n_tok - t;
#define FEW(G_, TT_) a8f_block(y + rb, w->rows, a, t, base, row_bytes, d16, n_group, nh, tail, \
                               pf, pf_bytes, G_, TT_)
#define FEW_G(TT_) do {                     \
                if (G == 32)                \
                    FEW(32, TT_);           \
                else if (G == 64)           \
                    FEW(64, TT_);           \
                else                        \
                    FEW(128, TT_);          \
                t += TT_;                   \
            } while (0)
            if (A8G_MIN_TOK > 8 && left >= 8)   /* the avx512bw GEMM takes 8 */
                FEW_G(8);
            else if (left >= 4 && left != 5)
                FEW_G(4);
            else if (left >= 3)             /* 5 tokens: 3 + 2 */
                FEW_G(3);
            else if (left == 2)
                FEW_G(2);
            else
                FEW_G(1);
#undef FEW_G
#undef FEW
            pf_bytes = 0;
        }
    }
    return rb;
}

/* Rows in blocks of 16: each row's group terms go to pr[row][] (segment by
 * segment, the row's bytes and scales prefetched A8_PF ahead on the first
 * token), then the 16 rows' f32 chains (acc + term, in group order) advance
 * side by side rather than one long dependent chain per row. Rows of more
 * than A8_MAXG groups chain after each segment, one row at a time. */
#define A8_MAXG 256

static void rows_a8_avx512(float *y, const struct shoal_quant_act *a, int64_t n_tok,
                           const struct shoal_quant_weight *w, int64_t r0, int64_t r1)
{
    if (n_tok >= A8G_MIN_TOK && w->cols <= A8G_MAXN)
        r0 = rows_a8_gemm(y, a, n_tok, w, r0, r1);
    else if (n_tok >= 2 && w->cols <= A8G_MAXN)
        r0 = rows_a8_few(y, a, n_tok, w, r0, r1);
    if (r0 >= r1)
        return;
    const int64_t n = w->cols;
    const int G = w->group;
    const size_t row_bytes = shoal_quant_row_bytes(SHOAL_QUANT_INT4, n, G);
    const int64_t n_group = (n + G - 1) / G, nck = (n + 127) / 128;
    /* packed bytes of the last chunk: 64, or fewer when n % 128 != 0 */
    const int tail = n % 128 ? (int)((n % 128 + 1) / 2) : 64;
    const int block = n_group <= A8_MAXG ? 16 : 1;
    /* the transposed chains also move lanes that are never added: the
     * columns past n_group of the last 16 groups, and the rows past a last
     * block of fewer than 16; they are zeroed (no stale stack bytes) */
    float pr[16][A8_MAXG + 16];
    const int64_t n_group16 = (n_group + 15) & ~(int64_t)15;
    /* the rows' prefetches run A8_PF past the row they read: those that
     * fall past r1 go to the first A8_PF bytes of what this thread reads
     * next (a->next), so the stream runs on into the next matrix */
    const size_t share_end = (size_t)r1 * row_bytes;
    const size_t next_end = a->next ? (a->next_bytes < A8_PF ? a->next_bytes : A8_PF) : 0;
    if (block == 16)
        for (int i = 0; i < 16; i++)
            memset(&pr[i][n_group], 0, (size_t)(n_group16 - n_group) * sizeof(float));
    for (int64_t rb = r0; rb < r1; rb += block) {
        const int nr = r1 - rb < block ? (int)(r1 - rb) : block;
        for (int64_t t = 0; t < n_tok; t++) {
            const int8_t *q = a->q + t * a->q_stride;
            const float *dx = a->d + t * a->n_group;
            const int32_t *sx = a->s + t * a->n_group;
            float acc[16] = {0};
            for (int i = 0; i < nr; i++) {
                const uint8_t *row = (const uint8_t *)w->data + (size_t)(rb + i) * row_bytes;
                if (t == 0)
                    for (size_t off = 0; off < 4 * (size_t)n_group; off += 64)
                        _mm_prefetch((const char *)row + off + A8_PF, SHOAL_PF_WEIGHTS);
                /* this row's window past the share: [lo, hi) of a->next */
                const size_t ahead = (size_t)(rb + i + 1) * row_bytes + A8_PF;
                if (t == 0 && next_end && ahead > share_end) {
                    const size_t hi = ahead - share_end < next_end ? ahead - share_end : next_end;
                    const size_t lo = ahead - share_end > row_bytes
                                          ? (ahead - share_end - row_bytes) & ~(size_t)63 : 0;
                    for (size_t o = lo; o < hi; o += 64)
                        _mm_prefetch((const char *)a->next + o, SHOAL_PF_WEIGHTS);
                }
                for (int64_t c0 = 0; c0 < nck; c0 += A8_SEG) {
                    const int nc = nck - c0 < A8_SEG ? (int)(nck - c0) : A8_SEG;
                    const int64_t g0 = c0 * 128 / G;
                    const int64_t ng = n_group - g0 < (int64_t)nc * 128 / G
                                           ? n_group - g0 : (int64_t)nc * 128 / G;
                    float *dst = block == 16 ? pr[i] + g0 : pr[0];
                    a8_segment_any(dst, row + 4 * (size_t)n_group,
                                   (const float *)(const void *)row, q, dx, sx, c0, nc,
                                   c0 + nc == nck ? tail : 64, ng, G, t == 0);
                    if (block == 1)
                        for (int64_t g = 0; g < ng; g++)
                            acc[0] = acc[0] + pr[0][g];
                }
            }
            if (block == 16 && nr < 16)
                for (int i = nr; i < 16; i++)
                    memset(pr[i], 0, (size_t)n_group16 * sizeof(float));
            if (block == 16) {
                /* 16 groups at a time: transpose 16 rows x 16 group terms,
                 * then add column after column (group order), one lane per
                 * row: the scalar chains' operations, vectorized */
                __m512 acc16 = _mm512_setzero_ps();
                for (int64_t g0 = 0; g0 < n_group; g0 += 16) {
                    __m512 c[16];
                    for (int i = 0; i < 16; i++)
                        c[i] = _mm512_loadu_ps(&pr[i][g0]);
                    transpose16(c);
                    const int64_t cnt = n_group - g0 < 16 ? n_group - g0 : 16;
                    for (int64_t j = 0; j < cnt; j++)
                        acc16 = _mm512_add_ps(acc16, c[j]);
                }
                _mm512_storeu_ps(acc, acc16);
            }
            for (int i = 0; i < nr; i++)
                y[t * w->rows + rb + i] = acc[i];
        }
    }
}

const struct shoal_quant_ops OPS_TABLE = {
    .name = OPS_NAME,
    .dot = dot_avx512,
    .linear_rows = linear_rows_avx512,
    .linear_rows_a8 = rows_a8_avx512,
    .act_quantize = shoal_quant_act_quantize_avx2,
    .act_group = shoal_quant_act_group_avx2,
    .fp8_rows = shoal_fp8_rows_avx2,   /* the AVX2 rows: decode-bound at 8 lanes */
    .fp8_dequant_row = shoal_fp8_dequant_row_avx2,
    .fp8_axpy_rows = shoal_fp8_axpy_rows_avx2,
    .axpy_rows = shoal_quant_axpy_rows_avx2,
    .mxfp4_rows = MXFP4_ROWS_FN,
#if defined(__AVX512VNNI__)
    .ggml_rows = shoal_ggml_rows_avx512,  /* ggml_avx2.c with VNNI */
#else
    .ggml_rows = shoal_ggml_rows_avx2,
#endif
};

/* ---- MXFP4 (quant.h "MXFP4") ----------------------------------------------- */

/* One packed block (16 bytes) -> its 32 values v2(nibble) as 4 x 8 f32 in
 * element order, 8 at a time: 4 bytes broadcast to every lane, lane k
 * shifted right by 4k, and its low 4 bits index the 16 values held in two
 * registers (vpermt2ps). Two instructions per 8 values where AVX2 needs
 * five; the same values (-0 included). */
static inline void mx_block_regs(const uint8_t *q, __m256 w[4])
{
    const __m256 lo = _mm256_setr_ps(0, 1, 2, 3, 4, 6, 8, 12);
    const __m256 hi = _mm256_setr_ps(-0.0f, -1, -2, -3, -4, -6, -8, -12);
    const __m256i sr = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    for (int j = 0; j < 4; j++) {
        int32_t v;
        memcpy(&v, q + 4 * j, 4);
        w[j] = _mm256_permutex2var_ps(lo, _mm256_srlv_epi32(_mm256_set1_epi32(v), sr), hi);
    }
}

#define MXFP4_ROWS_NAME MXFP4_ROWS_FN
#include "quant_mxfp4_x86.h"
