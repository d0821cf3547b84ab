#include "expert_ffn.h"

#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "kernels.h"
#include "util.h"

static int needs_row_buf(const struct shoal_expert_weights *w)
{
    return w->w_gate.dtype == SHOAL_DTYPE_BF16 || w->w_gate.dtype == SHOAL_DTYPE_F16 ||
           w->w_down.dtype == SHOAL_DTYPE_BF16 || w->w_down.dtype == SHOAL_DTYPE_F16;
}

/* Element i of a 1-D bias weight (any float dtype) as f32; 0 when absent. */
static float bias_at(const struct shoal_weight *b, int64_t i)
{
    if (!b->data)
        return 0.0f;
    float f;
    shoal_to_f32(&f, (const char *)b->data + (size_t)i * shoal_dtype_size(b->dtype), b->dtype,
                 1);
    return f;
}

/* gpt_oss's activation (GptOssExperts.forward): with biases, gate = min(g,
 * limit), up = clip(u, -limit, limit), out = (up + 1) * gate *
 * sigmoid(1.702 * gate). */
static inline float clamped_swiglu(float g, float u, float limit)
{
    g = g < limit ? g : limit;
    u = u < -limit ? -limit : (u > limit ? limit : u);
    const float glu = g * (1.0f / (1.0f + shoal_expf(-(g * 1.702f))));
    return (u + 1.0f) * glu;
}

/* Share ith of nth of one job's gate and up rows, then SiLU(gate) * up on
 * those rows (gpt_oss: its biases and clamped SwiGLU), into the job's
 * scratch (g first, then u). */
static void gate_up_silu(const struct shoal_expert_ffn_job *j, int ith, int nth, float *row)
{
    const struct shoal_expert_weights *w = j->w;
    const int64_t n = j->n, n_ff = w->w_gate.rows;
    float *g = j->scratch, *u = j->scratch + n * n_ff;
    shoal_linear_pair_part(g, u, j->x, n, &w->w_gate, &w->w_up, ith, nth, row);
    int64_t r0, r1;
    shoal_split_rows(n_ff, ith, nth, &r0, &r1);
    if (w->swiglu_limit > 0) {
        for (int64_t r = r0; r < r1; r++) {
            const float bg = bias_at(&w->b_gate, r), bu = bias_at(&w->b_up, r);
            for (int64_t t = 0; t < n; t++)
                g[t * n_ff + r] = clamped_swiglu(g[t * n_ff + r] + bg, u[t * n_ff + r] + bu,
                                                 w->swiglu_limit);
        }
        return;
    }
    for (int64_t t = 0; t < n; t++)
        for (int64_t r = r0; r < r1; r++)
            g[t * n_ff + r] = shoal_silu(g[t * n_ff + r]) * u[t * n_ff + r];
}

/* Share ith of nth of one job's down rows, plus the down bias if any. */
static void down_part(const struct shoal_expert_ffn_job *j, int ith, int nth, float *row)
{
    const struct shoal_weight *wd = &j->w->w_down;
    shoal_linear_part(j->out, j->scratch, j->n, wd, ith, nth, row);
    if (!j->w->b_down.data)
        return;
    int64_t r0, r1;
    shoal_split_rows(wd->rows, ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const float b = bias_at(&j->w->b_down, r);
        for (int64_t t = 0; t < j->n; t++)
            j->out[t * wd->rows + r] += b;
    }
}

/* the most row chunks of the shared last expert (each a few tens of µs) */
#define FFN_CHUNKS 8

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
    /* Decode's shape: jobs of the same shapes and dtype, at least as many
     * as threads, none holding more than a thread's share of the rows
     * (serving's batch-unions: most experts one row, a few two to four).
     * Then each thread runs whole experts (gate, up, SiLU, down) on its own,
     * taking the next one when done, with no barrier: a sleeping thread's
     * wake-up at a barrier costs tens of µs per layer, and a thread
     * streams each expert's 3 matrices whole instead of half of each.
     * Experts are taken most rows first (the longest first keeps the
     * threads' ends close). Any row range gives the same bits (each output
     * row is computed alone), so this changes only who computes what. */
    int whole = 1;
    int64_t rows_sum = jobs[0].n, rows_max = jobs[0].n;
    for (int64_t k = 1; k < n_jobs && whole; k++) {
        whole = jobs[k].w->w_gate.rows == jobs[0].w->w_gate.rows &&
                jobs[k].w->w_down.rows == jobs[0].w->w_down.rows &&
                jobs[k].w->w_gate.dtype == jobs[0].w->w_gate.dtype &&
                jobs[k].w->w_down.dtype == jobs[0].w->w_down.dtype;
        rows_sum += jobs[k].n;
        if (jobs[k].n > rows_max)
            rows_max = jobs[k].n;
    }
    const int team = omp_get_max_threads();
    whole = whole && team > 1 && n_jobs >= team && rows_max * team <= rows_sum;
    /* the order experts are taken in: by rows, most first (stable) */
    int64_t order_small[64];
    int64_t *order = !whole ? NULL
                     : n_jobs <= 64 ? order_small
                                    : shoal_xmalloc((size_t)n_jobs * sizeof(int64_t));
    if (order) {
        for (int64_t k = 0; k < n_jobs; k++) {
            int64_t i = k;
            for (; i > 0 && jobs[order[i - 1]].n < jobs[k].n; i--)
                order[i] = order[i - 1];
            order[i] = k;
        }
    }
    _Atomic int64_t claim = 0;   /* the next expert not yet taken (whole experts) */
    /* the last expert, shared by rows: chunks of its gate/up rows claimed,
     * then done, then chunks of its down rows claimed */
    _Atomic int64_t gu_claim = 0, gu_done = 0, dn_claim = 0;
#pragma omp parallel
    {
        const int ith = omp_get_thread_num(), nth = omp_get_num_threads();
        float *row = row_buf ? shoal_xmalloc((size_t)cols_max * sizeof(float)) : NULL;
        if (whole && nth == team) {
            /* experts handed out one at a time: a thread that wakes late
             * (passive waits, a descheduled vCPU) takes fewer of them.
             * While a thread's down projection finishes, the kernels
             * prefetch the gate rows of the first expert nobody has taken
             * yet (the weight stream does not stall between experts); it
             * is not claimed before it is taken, so a thread is never
             * left idle while another holds two */
            const int64_t last = n_jobs - 1;
            for (int64_t c = atomic_fetch_add(&claim, 1); c < last;
                 c = atomic_fetch_add(&claim, 1)) {
                const struct shoal_expert_ffn_job *j = &jobs[order[c]];
                shoal_linear_prefetch_next(&j->w->w_down, 0, 1);
                gate_up_silu(j, 0, 1, row);
                const int64_t c_next = atomic_load(&claim);
                shoal_linear_prefetch_next(c_next < n_jobs ? &jobs[order[c_next]].w->w_gate
                                                           : NULL,
                                           0, 1);
                down_part(j, 0, 1, row);
            }
            /* The last expert is shared: whoever runs out of whole experts
             * takes row chunks of it, so that a thread is not left waiting
             * at the region's end for another's whole expert (half an
             * expert per layer on average). Each output row is computed
             * alone, whichever chunk holds it: the same bits. */
            const struct shoal_expert_ffn_job *j = &jobs[order[last]];
            /* two chunks a thread: balance enough, and each chunk
             * quantizes its input again */
            const int chunks = 2 * nth < FFN_CHUNKS ? 2 * nth : FFN_CHUNKS;
            for (int64_t c = atomic_fetch_add(&gu_claim, 1); c < chunks;
                 c = atomic_fetch_add(&gu_claim, 1)) {
                gate_up_silu(j, (int)c, chunks, row);
                atomic_fetch_add(&gu_done, 1);
            }
            while (atomic_load(&gu_done) < chunks)   /* the chunks others hold */
                ;
            for (int64_t c = atomic_fetch_add(&dn_claim, 1); c < chunks;
                 c = atomic_fetch_add(&dn_claim, 1))
                down_part(j, (int)c, chunks, row);
        } else {
            /* each weight's share is followed by the next one's */
            for (int64_t k = 0; k < n_jobs; k++) {
                shoal_linear_prefetch_next(k + 1 < n_jobs ? &jobs[k + 1].w->w_gate
                                                          : &jobs[0].w->w_down,
                                           ith, nth);
                gate_up_silu(&jobs[k], ith, nth, row);
            }
#pragma omp barrier
            for (int64_t k = 0; k < n_jobs; k++) {
                shoal_linear_prefetch_next(k + 1 < n_jobs ? &jobs[k + 1].w->w_down : NULL, ith,
                                           nth);
                down_part(&jobs[k], ith, nth, row);
            }
        }
        free(row);
    }
    if (order != order_small)
        free(order);
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
