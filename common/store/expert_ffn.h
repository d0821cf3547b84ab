/* expert_ffn: the one SwiGLU FFN implementation every executor uses
 * (in-process store, workers): out = down(silu(gate(x)) * up(x)), or for
 * gpt_oss (w->swiglu_limit > 0) with biases and its clamped SwiGLU:
 * g = gate(x) + b_gate, u = up(x) + b_up, out = down((clip(u) + 1) *
 * min(g, limit) * sigmoid(1.702 min(g, limit))) + b_down.
 * Source: the MLP / expert modules of transformers' modeling_mixtral.py,
 * modeling_qwen2_moe.py, modeling_qwen3_moe.py, modeling_olmoe.py,
 * modeling_gpt_oss.py (GptOssExperts).
 * Thread: main (kernels open their own OpenMP regions).
 */
#ifndef SHOAL_EXPERT_FFN_H
#define SHOAL_EXPERT_FFN_H

#include <stdint.h>

#include "model.h"

/* Run one FFN over n rows.
 *   out      [n][n_embd] f32, written (unweighted)
 *   x        [n][n_embd] f32, borrowed
 *   w        the FFN's weights, borrowed; n_ff = w->w_gate.rows
 *   scratch  [2][n][n_ff] f32, caller-owned work space
 * Deterministic: bits independent of thread count. */
void shoal_expert_ffn(float *out, const float *x, int64_t n,
                      const struct shoal_expert_weights *w, float *scratch);

/* Expert weight bytes computed per second, GB/s: shoal_expert_ffn over 8
 * rows of fixed inputs on w, after one unmeasured call (thread team, caches),
 * timed call by call for about 30 ms (20 to 1000 calls, at most 0.3 s) with
 * the thread's OpenMP team, then the same with one thread; the fastest call
 * of either gives the rate. So a call stalled by another process (a busy
 * machine whose spinning OpenMP threads are descheduled: a team call then
 * waits a time slice, 100x slower) does not turn the figure into a
 * near-zero one: it is what the kernels reach on this machine.
 * blob_bytes: the bytes of one expert (its weights and scales). Every
 * executor reports this in its PeerInfo (the coordinator's own store too),
 * so placement compares like with like. Returns 0 when scratch cannot be
 * allocated. Thread: main. */
double shoal_expert_ffn_rate(const struct shoal_expert_weights *w, uint64_t blob_bytes);

/* One expert's share of a batch: out = FFN_w(x) over n rows. */
struct shoal_expert_ffn_job {
    float *out;                             /* [n][n_embd] f32, written */
    const float *x;                         /* [n][n_embd] f32, borrowed */
    int64_t n;                              /* rows, >= 1 */
    const struct shoal_expert_weights *w;   /* borrowed */
    float *scratch;                         /* [2][n][n_ff] f32, this job's own */
};

/* Run several experts' FFNs (a layer's batch-union) in one OpenMP region.
 * When the jobs have the same shapes and dtypes, there are at least as
 * many as threads and none holds more than a thread's share of the rows
 * (decode's case, and serving's batch-unions of mostly one-row experts),
 * each thread runs whole experts, most rows first, taking the next one
 * when done, with no barrier (+16 % experts-stage throughput at 2 threads
 * with passive waits; 4 streams of shoal serve, Zen 4: a decode step 19.5-
 * 21.7 ms against 22.4-22.9 when only equal jobs ran whole). Otherwise
 * every thread computes its rows of each job's gate and
 * up and applies SiLU to them, then after one barrier its rows of each
 * job's down. Each output element is computed exactly as shoal_expert_ffn
 * computes it, so the bits equal n_jobs separate calls at any thread count
 * (tests/unit/test_kernels.c); only the fork/joins and barriers are fewer.
 *   jobs  [n_jobs], borrowed; the outputs and scratches must not overlap
 * Thread: main (opens the region). */
void shoal_expert_ffn_batch(const struct shoal_expert_ffn_job *jobs, int64_t n_jobs);

#endif
