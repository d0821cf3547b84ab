/* tokenizer: text <-> token ids for the supported model families.
 *
 * Loads a Hugging Face tokenizer.json (byte-level BPE: GPT-2 / GPT-NeoX /
 * Qwen2 pre-tokenizers; SentencePiece-style BPE with byte fallback as used by
 * Llama/Mixtral), or the tokenizer metadata of a GGUF file
 * (tokenizer.ggml.*), with added/special tokens and the normalizers these
 * families use. Decoding is streaming: shoal_detok_feed never emits a broken
 * UTF-8 sequence.
 *
 * Thread: a loaded tokenizer is read-only and may be used from any thread;
 * a detok stream belongs to one thread.
 */
#ifndef SHOAL_TOKENIZER_H
#define SHOAL_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

struct shoal_tokenizer;

/* Load a tokenizer.
 *   path  borrowed: a checkpoint directory (reads tokenizer.json and, when
 *         present, tokenizer_config.json for bos/eos/add_bos), a
 *         tokenizer.json file, or a .gguf file.
 * Returns a tokenizer owned by the caller (free with
 * shoal_tokenizer_destroy), or NULL with err set (file, field, expected vs
 * found). Thread: any. */
struct shoal_tokenizer *shoal_tokenizer_load(const char *path,
                                             struct shoal_err *err);

/* Free a tokenizer; NULL is a no-op. */
void shoal_tokenizer_destroy(struct shoal_tokenizer *tok);

struct shoal_tokenize_params {
    int add_special;   /* add BOS (and whatever the model's post-processor adds) */
    int parse_special; /* match special/added tokens written in the text */
};

/* Encode UTF-8 text.
 *   text  [len] bytes, borrowed (need not be NUL-terminated; invalid UTF-8
 *         is accepted and handled like the reference tokenizers do).
 *   *ids  [*n_ids] int32 token ids, owned by the caller (free()).
 * Returns 0 or a negative status with err set. Thread: any. */
int shoal_tokenizer_encode(const struct shoal_tokenizer *tok, const char *text,
                           size_t len, struct shoal_tokenize_params params,
                           int32_t **ids, size_t *n_ids,
                           struct shoal_err *err);

/* Number of token ids (the largest id + 1). */
int32_t shoal_tokenizer_n_vocab(const struct shoal_tokenizer *tok);

/* Special ids, or -1 when the tokenizer has none. */
int32_t shoal_tokenizer_bos(const struct shoal_tokenizer *tok);
int32_t shoal_tokenizer_eos(const struct shoal_tokenizer *tok);

/* Look up the id of a token's exact text (e.g. "<|im_end|>"); -1 if absent. */
int32_t shoal_tokenizer_token_id(const struct shoal_tokenizer *tok,
                                 const char *text);

/* 1 if id is a special/control token (not rendered by default), else 0. */
int shoal_tokenizer_is_special(const struct shoal_tokenizer *tok, int32_t id);

/* Streaming detokenizer: feed ids one by one, get back only complete UTF-8.
 * A stream remembers what the model's decoder needs across tokens
 * (SentencePiece's leading-space strip, byte-fallback bytes, partial
 * UTF-8 sequences). */
struct shoal_detok;

/* Create a stream over tok (borrowed; must outlive the stream).
 *   skip_special  do not render special tokens (e.g. BOS/EOS). */
struct shoal_detok *shoal_detok_create(const struct shoal_tokenizer *tok,
                                       int skip_special);
void shoal_detok_destroy(struct shoal_detok *d);

/* Feed one id. Appends the newly complete text to out (at most out_cap - 1
 * bytes, NUL-terminated) and returns its byte length, or a negative status
 * (-SHOAL_ERANGE for an id outside the vocabulary, err set). Bytes of an
 * unfinished UTF-8 sequence are held back until it completes. */
int shoal_detok_feed(struct shoal_detok *d, int32_t id, char *out,
                     size_t out_cap, struct shoal_err *err);

/* Flush whatever is held back (an incomplete sequence becomes U+FFFD).
 * Same return convention as shoal_detok_feed. */
int shoal_detok_flush(struct shoal_detok *d, char *out, size_t out_cap);

/* Decode a whole sequence into a newly allocated NUL-terminated string
 * (owned by the caller, free()). Returns NULL with err set on a bad id. */
char *shoal_tokenizer_decode(const struct shoal_tokenizer *tok,
                             const int32_t *ids, size_t n_ids,
                             int skip_special, struct shoal_err *err);

#endif
