/* kernels: the compute primitives every executor shares (DESIGN contract 1).
 *
 * Determinism: each output element is produced by exactly one thread, and
 * every dot product reduces in one fixed order (8 interleaved partial sums,
 * combined as ((s0+s4)+(s2+s6)) + ((s1+s5)+(s3+s7))), so results do not
 * depend on the thread count, and SIMD versions can reproduce the scalar
 * bits. The build disables FMA contraction (-ffp-contract=off).
 *
 * Parallel kernels open their own OpenMP region and split output rows
 * evenly. Thread: call from the main/compute-owning thread (not from inside
 * another parallel region).
 */
#ifndef SHOAL_KERNELS_H
#define SHOAL_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "tensor.h"

/* Canonical-order dot product of two f32 vectors of n elements. */
float shoal_dot_f32(const float *a, const float *b, int64_t n);

/* y = x · W^T (+ bias): a linear layer over a batch.
 *   y     [n_tok][w->rows] f32, written
 *   x     [n_tok][w->cols] f32, borrowed
 *   w     [rows][cols] any supported dtype, borrowed
 *   bias  [rows] (data NULL for none)
 * Rows of W are converted to f32 once per row and reused across the batch.
 * Parallel over W's rows. Thread: main. */
void shoal_linear(float *y, const float *x, int64_t n_tok,
                  const struct shoal_weight *w, const struct shoal_weight *bias);

/* One of several independent linears run together by shoal_linear_many. */
struct shoal_linear_job {
    float *y;                         /* [n_tok][w->rows] f32, written */
    const float *x;                   /* [n_tok][w->cols] f32, borrowed */
    int64_t n_tok;
    const struct shoal_weight *w;     /* borrowed */
    const struct shoal_weight *bias;  /* [rows] or NULL / data NULL: none */
};

/* Several linears whose outputs do not feed each other (attention's q, k
 * and v) in one OpenMP region instead of one each: the same bits as
 * calling shoal_linear on each (every element computed by the same code
 * with the same row split), with fewer fork/joins, which cost tens of µs
 * each when waiting threads sleep (OMP_WAIT_POLICY=passive).
 *   jobs [n_jobs], borrowed; outputs must not overlap each other or any
 *   input. Thread: main. */
void shoal_linear_many(const struct shoal_linear_job *jobs, int n_jobs);

/* shoal_linear's share of thread ith of nth, without bias, for a caller
 * that is already inside an OpenMP parallel region (one region for several
 * linears, STYLE: fewer fork/joins). Thread ith writes the output rows
 * [r0, r1) of the same even split shoal_linear uses; every element is
 * computed by the same code as shoal_linear, so the bits do not depend on
 * nth. A non-f32, non-quant W uses a row buffer of cols floats from
 * row_buf (caller-owned, one per thread) when not NULL, else allocates.
 * A GGML W (a GGUF file's Q8_0, K-quant, IQ, MXFP4, ... matrix) runs
 * shoal_ggml_linear_part
 * (ggml_dot.h: int8 activations, its canonical order; no row buffer).
 * Thread: one OpenMP thread of the caller's region. */
void shoal_linear_part(float *y, const float *x, int64_t n_tok,
                       const struct shoal_weight *w, int ith, int nth, float *row_buf);

/* shoal_linear_part of two weights that read the same x (an expert's gate
 * and up): the same bits as two calls; when both are INT4A8 of the same
 * shape, x is quantized to int8 once instead of twice.
 * Thread: one OpenMP thread of the caller's region. */
void shoal_linear_pair_part(float *y0, float *y1, const float *x, int64_t n_tok,
                            const struct shoal_weight *w0, const struct shoal_weight *w1,
                            int ith, int nth, float *row_buf);

/* The next linear this thread runs after the one it runs now reads w's
 * rows share ith of nth: for an INT4A8 w, the current call's decode
 * kernels prefetch its first bytes while they finish
 * (shoal_quant_prefetch_next); any other w (or NULL) clears the hint.
 * Performance only. Thread: one OpenMP thread (thread-local state). */
void shoal_linear_prefetch_next(const struct shoal_weight *w, int ith, int nth);

/* The even split of rows among nth threads: thread ith gets [*r0, *r1). */
static inline void shoal_split_rows(int64_t rows, int ith, int nth, int64_t *r0, int64_t *r1)
{
    const int64_t per = rows / nth, rem = rows % nth;
    *r0 = ith * per + (ith < rem ? ith : rem);
    *r1 = *r0 + per + (ith < rem ? 1 : 0);
}

/* RMSNorm over each row of n elements (transformers' *RMSNorm: f32 variance,
 * x * rsqrt(mean(x^2) + eps) * weight).
 *   y, x  [n_rows][n] f32 (may alias); weight [n] any dtype. Thread: any. */
void shoal_rmsnorm(float *y, const float *x, int64_t n_rows, int64_t n,
                   const struct shoal_weight *weight, float eps);

/* In-place softmax over n elements (max-subtracted, f32). Thread: any. */
void shoal_softmax(float *x, int64_t n);

/* e^x for an f32 x, the one exp of the engine (softmax, attention, SiLU,
 * sigmoid gates, sampling), so that its bits do not depend on the C
 * library: glibc picks an FMA or a plain build of its expf at run time, and
 * expf is not correctly rounded, so two machines could differ in a last bit
 * (DESIGN contract 1 across ISAs). Computed in double with IEEE operations
 * only (the build has -ffp-contract=off): e^x = 2^(k/32) * e^y, k = the
 * nearest integer to x * 32 / ln 2, y = x - k ln 2 / 32 (|y| <= ln 2 / 64),
 * 2^(j/32) from a table of 32 doubles, e^y by its degree-5 Taylor
 * polynomial (truncation below 3e-15), one rounding to f32 at the end:
 * within 0.5 ULP + 2e-7 ULP of e^x. NaN gives NaN, +inf +inf, -inf +0;
 * results past FLT_MAX are +inf, below the smallest subnormal +0.
 * Thread: any. */
float shoal_expf(float x);

/* shoal_expf's table: 2^(j/32) for j = 0 .. 31, the nearest doubles (for
 * SIMD builds of the same steps, kv_avx2.c). */
extern const double shoal_exp2_j32[32];

/* SiLU(x) = x * sigmoid(x), the activation of SwiGLU FFNs. */
static inline float shoal_silu(float x)
{
    return x / (1.0f + shoal_expf(-x));
}

#endif
