/* tokenizer: text <-> token ids for the supported model families.
 *
 * Loads a Hugging Face tokenizer.json (byte-level BPE: GPT-2 / GPT-NeoX /
 * Qwen2 / Llama-3 / DeepSeek pre-tokenizers; SentencePiece-style BPE with
 * byte fallback as used by Llama/Mixtral), or the tokenizer metadata of a
 * GGUF file (tokenizer.ggml.*: "gpt2" byte-level BPE with llama.cpp's
 * pre-tokenizer regexes per tokenizer.ggml.pre, "llama" SentencePiece BPE
 * by scores), with added/special tokens and the normalizers these families
 * use. Decoding is streaming: shoal_detok_feed never emits a broken UTF-8
 * sequence.
 *
 * Encoding is lossless for valid UTF-8 input: decode(encode(x)) == x when
 * no special token is skipped (the SentencePiece families' leading "▁" is
 * removed again by their decoder). Invalid UTF-8 bytes are kept and become
 * byte tokens (byte-level BPE, byte fallback) or the unknown token.
 * Decoding writes only valid UTF-8: invalid byte sequences become U+FFFD.
 * No clean_up_tokenization_spaces pass is applied.
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
struct shoal_gguf;

/* Load a tokenizer.
 *   path  borrowed: a checkpoint directory (reads tokenizer.json and, when
 *         present, tokenizer_config.json for bos/eos/add_bos; without a
 *         tokenizer.json, a tiktoken.model: Kimi-K2's tiktoken BPE with its
 *         split pattern and the special tokens of tokenizer_config.json's
 *         added_tokens_decoder; without either, a tokenizer.gguf: the
 *         metadata of a GGUF that shoal convert kept), a "tiktoken.model" file, a
 *         tokenizer.json file (a "X.tokenizer_config.json" or
 *         "tokenizer_config.json" beside a "X.tokenizer.json" or
 *         "tokenizer.json" is read too), or a .gguf file (or any file that
 *         starts with the GGUF magic).
 * Returns a tokenizer owned by the caller (free with
 * shoal_tokenizer_destroy), or NULL with err set (file, field, expected vs
 * found): -errno for I/O, -SHOAL_EFORMAT for malformed files,
 * -SHOAL_EUNSUPPORTED for models, normalizers, pre-tokenizers or GGUF
 * pre-tokenizer names this module does not implement (named in the
 * message). Thread: any. */
struct shoal_tokenizer *shoal_tokenizer_load(const char *path,
                                             struct shoal_err *err);

/* 1 if directory dir holds a tokenizer shoal_tokenizer_load reads
 * (tokenizer.json, tiktoken.model as Kimi-K2 ships it, or a converted
 * GGUF's tokenizer.gguf), else 0.
 * Thread: any. */
int shoal_tokenizer_present(const char *dir);

/* Load from GGUF metadata already parsed (see gguf.h).
 *   g     borrowed; may be closed after the call
 *   name  borrowed, used in messages (e.g. the file path)
 * Same return convention as shoal_tokenizer_load. Thread: any. */
struct shoal_tokenizer *shoal_tokenizer_load_gguf(const struct shoal_gguf *g,
                                                  const char *name,
                                                  struct shoal_err *err);

/* Load from a tokenizer.json image in memory.
 *   json    [json_len] bytes, borrowed
 *   config  [config_len] bytes of tokenizer_config.json, or NULL
 *   name    borrowed, used in messages
 * Same return convention as shoal_tokenizer_load. Thread: any. */
struct shoal_tokenizer *shoal_tokenizer_load_hf_mem(const char *json,
                                                    size_t json_len,
                                                    const char *config,
                                                    size_t config_len,
                                                    const char *name,
                                                    struct shoal_err *err);

/* Free a tokenizer; NULL is a no-op. No stream may still use it.
 * Thread: any. */
void shoal_tokenizer_destroy(struct shoal_tokenizer *tok);

struct shoal_tokenize_params {
    int add_special;   /* add BOS (and whatever the model's post-processor adds) */
    int parse_special; /* match special (control) tokens written in the text;
                          added non-special tokens are always matched */
};

/* add_special = 1, parse_special = 0. Thread: any. */
struct shoal_tokenize_params shoal_tokenize_params_default(void);

/* Encode UTF-8 text.
 *   text  [len] bytes, borrowed (need not be NUL-terminated; invalid UTF-8
 *         is accepted, see above).
 *   *ids  [*n_ids] int32 token ids, owned by the caller (free()); written
 *         only on success.
 * Returns 0 or a negative status with err set (-SHOAL_ERANGE if a regex
 * hits PCRE2's match limits). Thread: any. */
int shoal_tokenizer_encode(const struct shoal_tokenizer *tok, const char *text,
                           size_t len, struct shoal_tokenize_params params,
                           int32_t **ids, size_t *n_ids,
                           struct shoal_err *err);

/* Number of token ids (the largest id + 1; ids the file does not name
 * decode to nothing). Memory is sized by the file's tokens, not by this.
 * Thread: any. */
int32_t shoal_tokenizer_n_vocab(const struct shoal_tokenizer *tok);

/* Special ids, or -1 when the tokenizer has none. Thread: any. */
int32_t shoal_tokenizer_bos(const struct shoal_tokenizer *tok);
int32_t shoal_tokenizer_eos(const struct shoal_tokenizer *tok);

/* Look up the id of a token's exact text (e.g. "<|im_end|>"); -1 if absent.
 * Added tokens are matched by their content, vocabulary tokens by their
 * text as the model sees it (byte-level tokens as raw bytes: " the", not
 * "Ġthe"). Thread: any. */
int32_t shoal_tokenizer_token_id(const struct shoal_tokenizer *tok,
                                 const char *text);

/* The model-side text of id (raw bytes for byte-level vocabularies, "▁"
 * kept for SentencePiece ones); borrowed, *len bytes, not NUL-terminated.
 * Returns 0 or -SHOAL_ERANGE. Thread: any. */
int shoal_tokenizer_token_text(const struct shoal_tokenizer *tok, int32_t id,
                               const char **text, size_t *len);

/* 1 if id is a special/control token (not rendered by default), else 0.
 * Thread: any. */
int shoal_tokenizer_is_special(const struct shoal_tokenizer *tok, int32_t id);

/* Streaming detokenizer: feed ids one by one, get back only complete UTF-8.
 * A stream remembers what the model's decoder needs across tokens
 * (SentencePiece's leading-space strip, byte-fallback bytes, partial
 * UTF-8 sequences). */
struct shoal_detok;

/* Create a stream over tok (borrowed; must outlive the stream).
 *   skip_special  do not render special tokens (e.g. BOS/EOS).
 * Returns a stream owned by the caller (shoal_detok_destroy).
 * Thread: any; the stream then belongs to the calling thread. */
struct shoal_detok *shoal_detok_create(const struct shoal_tokenizer *tok,
                                       int skip_special);
/* Free a stream; NULL is a no-op. Thread: the stream's. */
void shoal_detok_destroy(struct shoal_detok *d);

/* A buffer size (bytes, terminator included) that always suffices for one
 * shoal_detok_feed or shoal_detok_flush on tok. Thread: any. */
size_t shoal_detok_out_max(const struct shoal_tokenizer *tok);

/* Feed one id. Writes the newly complete text to out[0..] (at most
 * out_cap - 1 bytes, NUL-terminated) and returns its byte length (0 when
 * everything is held back), or a negative status with err set:
 * -SHOAL_ERANGE for an id outside the vocabulary, or for an out too small
 * (the id is then not consumed: retry with a buffer of
 * shoal_detok_out_max bytes). Bytes of an unfinished UTF-8 sequence are
 * held back until it completes. Thread: the stream's. */
int shoal_detok_feed(struct shoal_detok *d, int32_t id, char *out,
                     size_t out_cap, struct shoal_err *err);

/* Flush whatever is held back (an incomplete sequence becomes U+FFFD).
 * Same return convention as shoal_detok_feed; the stream can go on
 * afterwards. Thread: the stream's. */
int shoal_detok_flush(struct shoal_detok *d, char *out, size_t out_cap);

/* Decode a whole sequence into a newly allocated NUL-terminated string
 * (owned by the caller, free()); the same text the stream would produce.
 * The text can hold NUL bytes of its own (byte-level vocabularies have a
 * token for byte 0): *len (when len is not NULL) is its length in bytes,
 * the terminator not counted. Returns NULL with err set on a bad id.
 * Thread: any. */
char *shoal_tokenizer_decode_len(const struct shoal_tokenizer *tok,
                                 const int32_t *ids, size_t n_ids,
                                 int skip_special, size_t *len, struct shoal_err *err);

/* shoal_tokenizer_decode_len without the length (text up to its first
 * NUL). */
char *shoal_tokenizer_decode(const struct shoal_tokenizer *tok,
                             const int32_t *ids, size_t n_ids,
                             int skip_special, struct shoal_err *err);

#endif
