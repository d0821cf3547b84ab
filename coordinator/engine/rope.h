/* rope: rotary position embeddings and their scaling variants, computed as
 * transformers' modeling_rope_utils.py does (default, linear, dynamic NTK,
 * YaRN, Llama-3), and applied with the rotate_half pairing (element i pairs
 * with element i + rope_dim/2) used by the Llama-derived families, or to
 * interleaved pairs (2i, 2i+1) for DeepSeek's MLA rope dims (its
 * apply_rotary_pos_emb permutes q and k alike before rotate_half, which
 * leaves every q.k product equal to rotating the pairs in place).
 * Thread: a rope object belongs to one forward context.
 */
#ifndef SHOAL_ROPE_H
#define SHOAL_ROPE_H

#include <stdint.h>

#include "model_config.h"

struct shoal_rope {
    int64_t rope_dim;          /* rotated dims per head (even) */
    int interleave;            /* pairs (2i, 2i+1) (DeepSeek), else (i, i + rope_dim/2) */
    float *inv_freq;           /* [rope_dim/2] current inverse frequencies */
    float attention_factor;    /* multiplies cos and sin (YaRN), else 1 */
    double seq_len_cached;     /* dynamic NTK: largest seq_len seen so far */
    const struct shoal_model_config *cfg; /* borrowed */
};

/* Initialise r for cfg (borrowed, must outlive r). Allocates inv_freq. */
void shoal_rope_init(struct shoal_rope *r, const struct shoal_model_config *cfg);
void shoal_rope_free(struct shoal_rope *r);

/* Dynamic NTK: recompute inv_freq when the sequence grows past the cached
 * length (transformers' dynamic_rope_update). No-op for other types.
 *   seq_len  highest position in the batch + 1. */
void shoal_rope_update(struct shoal_rope *r, int64_t seq_len);

/* Rotate n_heads heads of one token at position pos, in place.
 *   x  [n_heads][head_dim] f32 (head_dim is the stride between heads);
 *      only the first rope_dim dims of each head rotate. */
void shoal_rope_apply(const struct shoal_rope *r, float *x, int64_t n_heads,
                      int64_t head_dim, int64_t pos);

#endif
