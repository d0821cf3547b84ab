#include "expert_ffn.h"

#include <omp.h>
#include <stdlib.h>

#include "kernels.h"
#include "util.h"

void shoal_expert_ffn(float *out, const float *x, int64_t n,
                      const struct shoal_expert_weights *w, float *scratch)
{
    const int64_t n_ff = w->w_gate.rows, n_embd = w->w_down.rows;
    float *g = scratch;                 /* [n][n_ff] */
    float *u = scratch + n * n_ff;      /* [n][n_ff] */
    /* One OpenMP region for the three matmuls (a fork/join each cost more
     * than the small expert matmuls of decode): every thread computes its
     * rows of gate and up, applies SiLU to those same rows (the split of
     * n_ff rows is the same for both), and after one barrier its rows of
     * down. Each element is computed by the same code as shoal_linear, so
     * the bits do not depend on the thread count. */
    const int64_t cols_max = n_ff > n_embd ? n_ff : n_embd;
#pragma omp parallel
    {
        const int ith = omp_get_thread_num(), nth = omp_get_num_threads();
        float *row = NULL;
        if (w->w_gate.dtype == SHOAL_DTYPE_BF16 || w->w_gate.dtype == SHOAL_DTYPE_F16 ||
            w->w_down.dtype == SHOAL_DTYPE_BF16 || w->w_down.dtype == SHOAL_DTYPE_F16)
            row = shoal_xmalloc((size_t)cols_max * sizeof(float));
        shoal_linear_part(g, x, n, &w->w_gate, ith, nth, row);
        shoal_linear_part(u, x, n, &w->w_up, ith, nth, row);
        int64_t r0, r1;
        shoal_split_rows(n_ff, ith, nth, &r0, &r1);
        for (int64_t t = 0; t < n; t++)
            for (int64_t r = r0; r < r1; r++)
                g[t * n_ff + r] = shoal_silu(g[t * n_ff + r]) * u[t * n_ff + r];
#pragma omp barrier
        shoal_linear_part(out, g, n, &w->w_down, ith, nth, row);
        free(row);
    }
}
