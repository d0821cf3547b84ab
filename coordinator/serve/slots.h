/* slots: `shoal serve --slot-dir DIR`, the KV cache slots kept across
 * restarts. When the server stops, each slot that holds tokens (a
 * conversation's history, a system prompt) is written to DIR/slot-<i>.kv:
 * a header (the model's identity, the KV dtype, layers, row size), the
 * tokens, every layer's cache rows, and an xxh64 of all of it; at start
 * each file is read back into its slot, so the next request with that
 * prefix is not prefilled again. A file that does not match the model or
 * is damaged is reported and skipped (that slot starts empty): it never
 * changes results. Thread: the engine's (the session's owner). */
#ifndef SHOAL_SERVE_SLOTS_H
#define SHOAL_SERVE_SLOTS_H

#include <stdint.h>

#include "err.h"
#include "session.h"

/* The model's identity in slot files: a container's fingerprint, else an
 * xxh64 of the checkpoint's config.json and its safetensors files' names,
 * sizes and modification times. */
uint64_t serve_slots_model_id(const struct shoal_model *m);

/* Write sequence seq's first n cached tokens (ids [n], borrowed) to
 * DIR/slot-<seq>.kv (through a temporary file renamed into place). Returns
 * 0 or SHOAL_EIO with err set (nothing replaced then). */
int serve_slots_save(const char *dir, struct shoal_session *s, uint64_t model_id, int64_t seq,
                     const int32_t *tokens, int64_t n, struct shoal_err *err);

/* Read DIR/slot-<seq>.kv into sequence seq. Returns 0 with *tokens
 * (malloc'd, [*n]) and n_past(seq) = *n; 1 when there is no such file;
 * SHOAL_EIO or SHOAL_EFORMAT with err set (another model or KV dtype, a
 * damaged or truncated file: the sequence stays empty). */
int serve_slots_load(const char *dir, struct shoal_session *s, uint64_t model_id, int64_t seq,
                     int32_t **tokens, int64_t *n, struct shoal_err *err);

#endif
