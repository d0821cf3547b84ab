/* kv: the element types of the KV cache and the two attention kernels that
 * read it (scores = q . K rows, and the softmax-weighted sum of V rows).
 *
 * The cache stores keys and values as f32, f16 or bf16 (enum shoal_dtype;
 * `--kv`, or the container's "kv" field, docs/FORMAT.md). A value is rounded
 * once, when it is written (shoal_kv_store_row: round to nearest, ties to
 * even, by one scalar conversion), and converted back exactly when read, so
 * attention sees the same f32 numbers whatever reads them. f16 and bf16
 * halve the bytes attention reads per token of context.
 *
 * ## Canonical computation (every ops table reproduces it bit for bit)
 *
 *   scores:  s[j] = shoal_dot_f32(q, f32(K row j), n)     (kernels.h order)
 *   mix:     out[d] = 0.0f; for j = 0 .. n_rows-1 in order:
 *                out[d] = out[d] + p[j] * f32(V row j)[d]
 *
 * with f32() the exact conversion of the stored element. Every + and * is
 * one f32 operation rounded to nearest (no FMA). The SIMD tables (AVX2 with
 * F16C on x86-64, NEON on aarch64) keep the eight lane sums of
 * shoal_dot_f32 in one register (two on NEON) and gain speed from
 * independent chains (several K rows, queries and output blocks), never by
 * reordering one chain. So the result depends on the cache dtype only,
 * never on the ISA, the thread count or how tokens were batched
 * (DESIGN contract 1).
 *
 * Thread: every function may be called from any thread, except
 * shoal_kv_init (main thread, at start-up, while no kernel runs).
 */
#ifndef SHOAL_KV_H
#define SHOAL_KV_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "tensor.h"

/* ---- cache element types ------------------------------------------------ */

/* 1 if t can be a KV cache element type (F32, F16, BF16). Thread: any. */
int shoal_kv_dtype_ok(enum shoal_dtype t);

/* "f32" / "f16" / "bf16" (how --kv and the manifest spell them), "?" for
 * anything else. Static string. Thread: any. */
const char *shoal_kv_dtype_name(enum shoal_dtype t);

/* Parse "f32", "f16" or "bf16" (exactly, lower case). Returns 0 and sets
 * *t, or -1 (t untouched). Thread: any. */
int shoal_kv_dtype_parse(const char *s, enum shoal_dtype *t);

/* Write n f32 values as one cache row of dtype t (rounded to nearest even;
 * NaN stays NaN, overflow becomes infinity).
 *   dst [n] elements of t, written; src [n] f32, borrowed. Thread: any. */
void shoal_kv_store_row(void *dst, const float *src, int64_t n, enum shoal_dtype t);

/* ---- kernels (active ops table) ----------------------------------------- */

/* s[j] = canonical dot of q with K row j, for j < n_rows.
 *   s  [n_rows] f32, written
 *   q  [n] f32, borrowed
 *   k  rows of n elements of dtype t, row j at k + j * stride elements
 * Arguments are programmer invariants (t a KV dtype, n >= 1, n_rows >= 0).
 * Allocates nothing for n <= 512. Thread: any. */
void shoal_kv_scores(float *s, const float *q, const void *k, int64_t stride,
                     int64_t n_rows, int64_t n, enum shoal_dtype t);

/* shoal_kv_scores for n_q queries at once: s[r * s_ld + j] = canonical dot
 * of q + r * q_ld with K row j, for r < n_q, j < n_rows; each row element is
 * loaded (and converted) once for a block of up to 4 queries. The dense
 * linears of F32 / F16 / BF16 weights run through it too (kernels.c: the
 * weight rows are K, the tokens the queries). Same arguments otherwise.
 * Thread: any. */
void shoal_kv_scores_many(float *s, int64_t s_ld, const float *q, int64_t q_ld, int64_t n_q,
                          const void *k, int64_t stride, int64_t n_rows, int64_t n,
                          enum shoal_dtype t);

/* out[d] = sum over j of p[j] * V row j [d], summed from 0.0f in j order.
 *   out [n] f32, written; p [n_rows] f32, borrowed
 *   v   rows of n elements of dtype t, row j at v + j * stride elements
 * Allocates nothing. Thread: any. */
void shoal_kv_mix(float *out, const float *p, const void *v, int64_t stride,
                  int64_t n_rows, int64_t n, enum shoal_dtype t);

/* ---- attention over a batch of queries ------------------------------------ */

/* One layer's attention for n new tokens at positions n_past .. n_past+n-1
 * over the cache rows 0 .. n_past+n-1 (the new tokens' rows already stored).
 * Token t sees rows first(t) .. n_past+t, first(t) = 0, or with a window W
 * > 0 max(0, n_past+t-W+1). For each token t and query head h (KV head g =
 * h / (n_head / n_head_kv)) the arithmetic is, in this order:
 *
 *   s[j] = shoal_kv scores of q[t][h] against K row j, head g;  s[j] = s[j] / div
 *          (div = score_div, or sqrtf(head_dim) when score_div is 0)
 *   mx   = the largest s[j] (NaN never taken), and of sinks[h] when given
 *   s[j] = expf(s[j] - mx), sum = 0.0f + s[first] + ... + s[pos] in j order
 *          (+ expf(sinks[h] - mx) last: a logit in the denominator only)
 *   p[j] = s[j] / sum
 *   out[t][h] = shoal_kv mix of p over V rows first .. pos, head g (its first
 *               v_dim columns; the rest of out[t][h] is left as it was)
 *
 * so the bits are those of one head at a time. The work is laid out for
 * the cache reads: the query heads of one KV head (and `round` tokens of
 * the batch) are computed together over tiles of cached rows, so each K and
 * V row is read from memory once per round instead of once per query head.
 * Each output is computed by exactly one thread, so the split (ith, nth)
 * does not change the bits. */
struct shoal_kv_attn {
    float *out;          /* [n][n_head * head_dim] written */
    const float *q;      /* [n][n_head * head_dim] borrowed */
    const void *k, *v;   /* the layer's cache: row j at j * n_head_kv*head_dim elements of t */
    float *scores;       /* scratch [round][n_head][scores_ld] f32 */
    int64_t scores_ld;   /* >= n_past + n */
    int64_t round;       /* tokens per round, >= 1 (shoal_kv_attn_round) */
    int64_t n, n_past;
    int64_t n_head, n_head_kv, head_dim;   /* n_head a multiple of n_head_kv */
    int64_t window;      /* 0: full causal attention */
    float score_div;     /* scores are divided by it; 0: sqrtf(head_dim) */
    const float *sinks;  /* [n_head] f32 attention sinks (gpt_oss), or NULL */
    int64_t v_dim;       /* value columns mixed per head, <= head_dim; 0: head_dim.
                          * MLA passes k == v (the latent and rope key of one cache
                          * row) and mixes only the latent's kv_lora_rank columns */
    enum shoal_dtype t;  /* the cache's dtype */
};

/* Tokens per round for a scores scratch of about 4 MiB: between 1 and
 * min(n_batch, 8). The scratch is round * n_head * scores_ld floats.
 * Thread: any. */
int64_t shoal_kv_attn_round(int64_t n_head, int64_t scores_ld, int64_t n_batch);

/* Thread ith's share of the attention described by a (kv.h above). Called
 * by all nth threads of one OpenMP parallel region (it runs barriers
 * between its phases); when it returns, a.out is complete only after one
 * more barrier. Allocates nothing for head_dim <= 512. Thread: every thread
 * of the region, the same a. */
void shoal_kv_attend(const struct shoal_kv_attn *a, int ith, int nth);

/* ---- kernel selection ---------------------------------------------------- */

enum shoal_kv_isa {
    SHOAL_KV_ISA_AUTO = 0,   /* AVX2 + F16C, NEON, else scalar */
    SHOAL_KV_ISA_SCALAR,     /* the reference (tests) */
    SHOAL_KV_ISA_AVX2,       /* x86-64 with AVX2 and F16C (built -mavx2 -mf16c, no FMA) */
    SHOAL_KV_ISA_NEON,       /* aarch64 */
};

/* shoal_kv_attend's tiles: about `bytes` (default 8192, at least 512) of
 * one KV head's cached rows, at least 8 rows. Speed only: the bits do not
 * depend on it (test_kv). For benchmarks and tests. Thread: main, while no
 * kernel runs. */
void shoal_kv_set_tile_bytes(int64_t bytes);

/* The tile size in use (bytes of one KV head's rows). Thread: any. */
int64_t shoal_kv_tile_bytes(void);

/* Choose the kernels (logged at info, "kv"). Before the first call the
 * scalar table is active; all give the same bits. Returns 0, or
 * SHOAL_EUNSUPPORTED (the active table unchanged) when the ISA is not built
 * in or the CPU lacks it. Thread: main, while no kernel runs. */
int shoal_kv_init(enum shoal_kv_isa isa, struct shoal_err *err);

/* Name of the active table: "scalar", "avx2" or "neon". Thread: any. */
const char *shoal_kv_ops_name(void);

/* One per ISA file; every member required. The kernels of n_q queries at
 * once (shoal_kv_scores and shoal_kv_mix are n_q = 1):
 *   scores: s[r * s_ld + j] = canonical dot of q + r * q_ld with K row j,
 *           for r < n_q, j < n_rows
 *   mix:    out[r * out_ld + d] = out[r * out_ld + d] + p[r * p_ld + j] * V row j [d],
 *           for j = 0 .. n_rows-1 in order, each d < n (accumulates: the
 *           caller zeroes out first, and may continue over further rows)
 * rows as in shoal_kv_scores. A row of K or V is loaded once for all n_q
 * queries. */
struct shoal_kv_ops {
    const char *name;
    void (*scores)(float *s, int64_t s_ld, const float *q, int64_t q_ld, int64_t n_q,
                   const void *k, int64_t stride, int64_t n_rows, int64_t n,
                   enum shoal_dtype t);
    void (*mix)(float *out, int64_t out_ld, const float *p, int64_t p_ld, int64_t n_q,
                const void *v, int64_t stride, int64_t n_rows, int64_t n,
                enum shoal_dtype t);
    /* shoal_kv_softmax_scalar's arguments and bits */
    void (*softmax)(float *sc, int64_t ld, int64_t n_rows, int64_t n, float div,
                    const float *sinks);
};

extern const struct shoal_kv_ops shoal_kv_ops_scalar;
extern const struct shoal_kv_ops shoal_kv_ops_avx2;   /* x86-64 builds */
extern const struct shoal_kv_ops shoal_kv_ops_neon;   /* aarch64 builds */

/* Row j of a cache slice whose rows are stride elements of t apart. */
static inline const void *shoal_kv_row(const void *base, int64_t j, int64_t stride,
                                       enum shoal_dtype t)
{
    return (const char *)base + (size_t)(j * stride) * shoal_dtype_size(t);
}

/* The attention softmax of n_rows score rows (row r at sc + r * ld, n
 * elements each), in place, in shoal_kv_attend's order (above): each row
 * divided by div, its max (and sinks[r]'s, when sinks is not NULL) taken,
 * expf (shoal_expf) of each element less the max, the sum from 0.0f in
 * element order (+ expf(sinks[r] - max) last), each element divided by the
 * sum. The reference the SIMD tables reproduce bit for bit; they may
 * interleave rows and vectorize the elementwise steps, never reorder a sum
 * (a NaN result may be another NaN: which of two NaNs an operation returns
 * follows the compiler's operand order).
 * Allocates nothing. Thread: any. */
void shoal_kv_softmax_scalar(float *sc, int64_t ld, int64_t n_rows, int64_t n, float div,
                             const float *sinks);

/* The scalar mix of the output columns d0 <= d < d1 only, accumulated into
 * out[d] (the SIMD tables' tail; the same bits as the whole mix gives those
 * columns). */
void shoal_kv_mix_cols_scalar(float *out, const float *p, const void *v, int64_t stride,
                              int64_t n_rows, int64_t d0, int64_t d1, enum shoal_dtype t);

/* The canonical tail and reduction the SIMD tables share: finish lanes
 * s[0..7] with elements i .. n-1 (fewer than 8) of q, whose K values are
 * tail[0 .. n-i-1] (already f32), then reduce in shoal_dot_f32's order. */
static inline float shoal_kv_dot_finish(float s[8], const float *q, const float *tail,
                                        int64_t i, int64_t n)
{
    for (int j = 0; i + j < n; j++)
        s[j] += q[i + j] * tail[j];
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

/* call(QN, c) for the queries c .. c+QN-1 of n_q: blocks of QN = 4, then
 * one block of the 1-3 left (QN a constant, for always-inline templates) */
#define SHOAL_KV_FOR_QBLOCKS(n_q, call)                                         \
    {                                                                            \
        int64_t c_ = 0;                                                          \
        for (; c_ + 4 <= (n_q); c_ += 4)                                         \
            call(4, c_);                                                         \
        switch ((n_q) - c_) {                                                    \
        case 3: call(3, c_); break;                                              \
        case 2: call(2, c_); break;                                              \
        case 1: call(1, c_); break;                                              \
        default: break;                                                          \
        }                                                                        \
    }

/* Define struct shoal_kv_ops shoal_kv_ops_<isa> from an ISA file's two
 * always-inline templates for QN (1-4, a constant) queries and a constant
 * dtype t:
 *   scores_q(s, s_ld, q, q_ld, k, stride, n_rows, n, QN, t)
 *   mix_q(out, out_ld, p, p_ld, v, stride, n_rows, n, QN, t)
 * one instance per dtype and QN. */
#define SHOAL_KV_DISPATCH_(fn, t, ...)                                           \
    switch (t) {                                                                 \
    case SHOAL_DTYPE_F16: fn(__VA_ARGS__, SHOAL_DTYPE_F16); break;               \
    case SHOAL_DTYPE_BF16: fn(__VA_ARGS__, SHOAL_DTYPE_BF16); break;             \
    default: fn(__VA_ARGS__, SHOAL_DTYPE_F32); break;                            \
    }
#define SHOAL_KV_OPS_DEFINE(isa, softmax_fn)                                     \
    static inline __attribute__((always_inline)) void                           \
    scores_t(float *s, int64_t s_ld, const float *q, int64_t q_ld, int64_t n_q,  \
             const void *k, int64_t stride, int64_t n_rows, int64_t n,           \
             const enum shoal_dtype t)                                           \
    {                                                                            \
        SHOAL_KV_FOR_QBLOCKS(n_q, SHOAL_KV_SCORES_Q_)                            \
    }                                                                            \
    static inline __attribute__((always_inline)) void                           \
    mix_t(float *out, int64_t out_ld, const float *p, int64_t p_ld, int64_t n_q, \
          const void *v, int64_t stride, int64_t n_rows, int64_t n,              \
          const enum shoal_dtype t)                                              \
    {                                                                            \
        SHOAL_KV_FOR_QBLOCKS(n_q, SHOAL_KV_MIX_Q_)                               \
    }                                                                            \
    static void scores_##isa(float *s, int64_t s_ld, const float *q, int64_t q_ld, \
                             int64_t n_q, const void *k, int64_t stride,         \
                             int64_t n_rows, int64_t n, enum shoal_dtype t)      \
    {                                                                            \
        SHOAL_KV_DISPATCH_(scores_t, t, s, s_ld, q, q_ld, n_q, k, stride, n_rows, n) \
    }                                                                            \
    static void mix_##isa(float *out, int64_t out_ld, const float *p, int64_t p_ld, \
                          int64_t n_q, const void *v, int64_t stride,            \
                          int64_t n_rows, int64_t n, enum shoal_dtype t)         \
    {                                                                            \
        SHOAL_KV_DISPATCH_(mix_t, t, out, out_ld, p, p_ld, n_q, v, stride, n_rows, n) \
    }                                                                            \
    const struct shoal_kv_ops shoal_kv_ops_##isa = {                             \
        .name = #isa, .scores = scores_##isa, .mix = mix_##isa, .softmax = softmax_fn};
#define SHOAL_KV_SCORES_Q_(QN, c)                                                \
    scores_q(s + (c) * s_ld, s_ld, q + (c) * q_ld, q_ld, k, stride, n_rows, n, QN, t)
#define SHOAL_KV_MIX_Q_(QN, c)                                                   \
    mix_q(out + (c) * out_ld, out_ld, p + (c) * p_ld, p_ld, v, stride, n_rows, n, QN, t)

#endif
