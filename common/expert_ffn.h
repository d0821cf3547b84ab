/* expert_ffn: the one SwiGLU FFN implementation every executor uses
 * (in-process store, workers): out = down(silu(gate(x)) * up(x)).
 * Source: the MLP / expert modules of transformers' modeling_mixtral.py,
 * modeling_qwen2_moe.py, modeling_qwen3_moe.py, modeling_olmoe.py.
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

#endif
