#include "expert_ffn.h"

#include "kernels.h"

void shoal_expert_ffn(float *out, const float *x, int64_t n,
                      const struct shoal_expert_weights *w, float *scratch)
{
    const int64_t n_ff = w->w_gate.rows;
    float *g = scratch;                 /* [n][n_ff] */
    float *u = scratch + n * n_ff;      /* [n][n_ff] */
    shoal_linear(g, x, n, &w->w_gate, NULL);
    shoal_linear(u, x, n, &w->w_up, NULL);
    for (int64_t i = 0; i < n * n_ff; i++)
        g[i] = shoal_silu(g[i]) * u[i];
    shoal_linear(out, g, n, &w->w_down, NULL);
}
