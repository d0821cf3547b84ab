#include "expert_ffn.h"

#include <omp.h>
#include <stdlib.h>

#include "kernels.h"
#include "util.h"

static int needs_row_buf(const struct shoal_expert_weights *w)
{
    return w->w_gate.dtype == SHOAL_DTYPE_BF16 || w->w_gate.dtype == SHOAL_DTYPE_F16 ||
           w->w_down.dtype == SHOAL_DTYPE_BF16 || w->w_down.dtype == SHOAL_DTYPE_F16;
}

/* Share ith of nth of one job's gate and up rows, then SiLU(gate) * up on
 * those rows, into the job's scratch (g first, then u). */
static void gate_up_silu(const struct shoal_expert_ffn_job *j, int ith, int nth, float *row)
{
    const int64_t n = j->n, n_ff = j->w->w_gate.rows;
    float *g = j->scratch, *u = j->scratch + n * n_ff;
    shoal_linear_pair_part(g, u, j->x, n, &j->w->w_gate, &j->w->w_up, ith, nth, row);
    int64_t r0, r1;
    shoal_split_rows(n_ff, ith, nth, &r0, &r1);
    for (int64_t t = 0; t < n; t++)
        for (int64_t r = r0; r < r1; r++)
            g[t * n_ff + r] = shoal_silu(g[t * n_ff + r]) * u[t * n_ff + r];
}

void shoal_expert_ffn_batch(const struct shoal_expert_ffn_job *jobs, int64_t n_jobs)
{
    int64_t cols_max = 0;
    int row_buf = 0;
    for (int64_t k = 0; k < n_jobs; k++) {
        const struct shoal_expert_weights *w = jobs[k].w;
        if (w->w_gate.rows > cols_max)
            cols_max = w->w_gate.rows;
        if (w->w_down.rows > cols_max)
            cols_max = w->w_down.rows;
        row_buf |= needs_row_buf(w);
    }
    if (n_jobs <= 0)
        return;
    /* Decode's shape: every job the same rows and shapes, at least as many
     * jobs as threads. Then each thread runs whole experts (gate, up, SiLU,
     * down) on its own, taking the next one when done, with no barrier: a
     * sleeping thread's wake-up at a barrier costs tens of µs per layer.
     * Any row range gives the same bits (each output row is computed
     * alone), so this changes only who computes what. */
    int whole = 1;
    for (int64_t k = 1; k < n_jobs && whole; k++)
        whole = jobs[k].n == jobs[0].n && jobs[k].w->w_gate.rows == jobs[0].w->w_gate.rows &&
                jobs[k].w->w_down.rows == jobs[0].w->w_down.rows &&
                jobs[k].w->w_gate.dtype == jobs[0].w->w_gate.dtype;
#pragma omp parallel
    {
        const int ith = omp_get_thread_num(), nth = omp_get_num_threads();
        float *row = row_buf ? shoal_xmalloc((size_t)cols_max * sizeof(float)) : NULL;
        if (whole && nth > 1 && n_jobs >= nth) {
            /* experts handed out one at a time: a thread that wakes late
             * (passive waits, a descheduled vCPU) takes fewer of them */
#pragma omp for schedule(dynamic, 1) nowait
            for (int64_t k = 0; k < n_jobs; k++) {
                gate_up_silu(&jobs[k], 0, 1, row);
                shoal_linear_part(jobs[k].out, jobs[k].scratch, jobs[k].n, &jobs[k].w->w_down,
                                  0, 1, row);
            }
        } else {
            for (int64_t k = 0; k < n_jobs; k++)
                gate_up_silu(&jobs[k], ith, nth, row);
#pragma omp barrier
            for (int64_t k = 0; k < n_jobs; k++)
                shoal_linear_part(jobs[k].out, jobs[k].scratch, jobs[k].n, &jobs[k].w->w_down,
                                  ith, nth, row);
        }
        free(row);
    }
}

/* Seconds of the fastest of 20+ calls (about 30 ms, at most 0.3 s), after
 * one unmeasured call (thread team, caches). */
static double fastest_call(const struct shoal_expert_weights *w, float *o, const float *x,
                           int64_t n, float *s)
{
    shoal_expert_ffn(o, x, n, w, s);
    int iters = 0;
    double t0 = shoal_time_s(), best = 1e30, now = t0;
    do {
        double t1 = now;
        shoal_expert_ffn(o, x, n, w, s);
        now = shoal_time_s();
        if (now - t1 < best)
            best = now - t1;
        iters++;
    } while ((now - t0 < 0.03 || iters < 20) && iters < 1000 && now - t0 < 0.3);
    return best > 1e-9 ? best : 1e-9;
}

double shoal_expert_ffn_rate(const struct shoal_expert_weights *w, uint64_t blob_bytes)
{
    const int64_t n = 8, n_embd = w->w_down.rows, n_ff = w->w_gate.rows;
    float *x = malloc((size_t)(n * n_embd) * sizeof(float));
    float *o = malloc((size_t)(n * n_embd) * sizeof(float));
    float *s = malloc((size_t)(2 * n * n_ff) * sizeof(float));
    double gbps = 0;
    if (x && o && s) {
        for (int64_t i = 0; i < n * n_embd; i++)
            x[i] = (float)((i * 7919) % 2003) / 2003.0f - 0.5f;
        double best = fastest_call(w, o, x, n, s);
        const int team = omp_get_max_threads();
        if (team > 1) {
            /* one thread needs no barrier: on a busy machine whose OpenMP
             * threads spin, a team call can wait a whole time slice for a
             * descheduled member (100x slower); the probe then reports what
             * one thread reaches rather than that stall */
            omp_set_num_threads(1);
            double one = fastest_call(w, o, x, n, s);
            omp_set_num_threads(team);
            if (one < best)
                best = one;
        }
        gbps = (double)blob_bytes / 1e9 / best;
    }
    free(x);
    free(o);
    free(s);
    return gbps;
}

void shoal_expert_ffn(float *out, const float *x, int64_t n,
                      const struct shoal_expert_weights *w, float *scratch)
{
    /* one region for gate, up, SiLU and down: a batch of one */
    const struct shoal_expert_ffn_job job = {.out = out, .x = x, .n = n, .w = w,
                                             .scratch = scratch};
    shoal_expert_ffn_batch(&job, 1);
}
