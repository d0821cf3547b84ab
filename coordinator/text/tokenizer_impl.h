/* tokenizer_impl: the tokenizer's internal state, shared by tokenizer.c
 * (encode, decode, streaming), tokenizer_hf.c (tokenizer.json loader) and
 * tokenizer_gguf.c (GGUF metadata loader). Not a public header.
 *
 * One pipeline serves every supported family:
 *
 *   text -> split on added/special tokens (raw text)
 *        -> normalizer ops (NFC, Prepend "▁", Replace " "->"▁", ...)
 *        -> split on "normalized" added tokens
 *        -> pre-tokenizer ops (regex splits, Metaspace, ByteLevel prefix)
 *        -> model per piece: BPE by merge ranks, or SentencePiece by scores
 *
 * Byte-level vocabularies (GPT-2 alphabet) are decoded to raw bytes at load
 * time, so the pipeline never maps bytes to the alphabet: a piece's bytes
 * are the BPE's initial symbols and a token's text is its decoded bytes.
 *
 * Thread: a built tokenizer is read-only; encode allocates its own scratch.
 */
#ifndef SHOAL_TOKENIZER_IMPL_H
#define SHOAL_TOKENIZER_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "err.h"
#include "tokenizer.h"
#include "util.h"

/* Largest vocabulary accepted from a file (ids are checked against it). */
#define SHOAL_TOK_MAX_VOCAB (1u << 24)

/* Token attributes (bit set), GGUF token types mapped onto llama.cpp's. */
enum shoal_tok_attr {
    SHOAL_TOK_NORMAL       = 1u << 0,
    SHOAL_TOK_UNKNOWN      = 1u << 1,
    SHOAL_TOK_CONTROL      = 1u << 2,  /* special: hidden when skipping */
    SHOAL_TOK_USER_DEFINED = 1u << 3,  /* added, always matched, shown */
    SHOAL_TOK_BYTE         = 1u << 4,  /* <0xXX> byte-fallback token */
    SHOAL_TOK_UNUSED       = 1u << 5,  /* renders as nothing */
    SHOAL_TOK_LSTRIP       = 1u << 6,  /* match eats whitespace on its left */
    SHOAL_TOK_RSTRIP       = 1u << 7,  /* ... and on its right */
    SHOAL_TOK_SINGLE_WORD  = 1u << 8,  /* match only as a whole word */
    SHOAL_TOK_NORMALIZED   = 1u << 9,  /* match after normalization */
    SHOAL_TOK_IN_MODEL     = 1u << 10, /* the BPE/SPM model may emit it */
};

struct shoal_tok_entry {
    uint32_t text_off, text_len;   /* model text in blob (what BPE sees) */
    uint32_t piece_off, piece_len; /* rendered bytes in blob */
    float score;                   /* SentencePiece score; 0 for BPE */
    uint32_t attr;                 /* enum shoal_tok_attr bits */
};

enum shoal_tok_model {
    SHOAL_TOK_MODEL_BPE, /* merges by rank (HF BPE, GGUF "gpt2") */
    SHOAL_TOK_MODEL_SPM, /* merges by score (GGUF "llama") */
};

enum shoal_tok_norm_kind {
    SHOAL_TOK_NORM_NFC,
    SHOAL_TOK_NORM_NFD,
    SHOAL_TOK_NORM_NFKC,
    SHOAL_TOK_NORM_NFKD,
    SHOAL_TOK_NORM_LOWERCASE,
    SHOAL_TOK_NORM_PREPEND,       /* a = prefix, for non-empty text */
    SHOAL_TOK_NORM_REPLACE,       /* literal a -> b */
    SHOAL_TOK_NORM_REPLACE_REGEX, /* re -> b */
    SHOAL_TOK_NORM_STRIP,         /* left / right whitespace */
};

struct shoal_tok_norm_op {
    enum shoal_tok_norm_kind kind;
    char *a;
    size_t a_len;
    char *b;
    size_t b_len;
    pcre2_code *re;
    int left, right;
};

/* HF SplitDelimiterBehavior */
enum shoal_tok_split {
    SHOAL_TOK_SPLIT_REMOVED,
    SHOAL_TOK_SPLIT_ISOLATED,
    SHOAL_TOK_SPLIT_MERGED_PREV,
    SHOAL_TOK_SPLIT_MERGED_NEXT,
    SHOAL_TOK_SPLIT_CONTIGUOUS,
};

enum shoal_tok_pre_kind {
    SHOAL_TOK_PRE_SPLIT,        /* re, behavior, invert */
    SHOAL_TOK_PRE_REPLACE_SPACE,/* every ' ' -> a (Metaspace) */
    SHOAL_TOK_PRE_PREPEND,      /* a unless the piece starts with it */
};

enum shoal_tok_prepend_scheme {
    SHOAL_TOK_PREPEND_ALWAYS,
    SHOAL_TOK_PREPEND_FIRST, /* only to text at offset 0 of the input */
};

struct shoal_tok_pre_op {
    enum shoal_tok_pre_kind kind;
    pcre2_code *re;
    enum shoal_tok_split behavior;
    int invert;
    char *a;
    size_t a_len;
    enum shoal_tok_prepend_scheme scheme;
};

struct shoal_tok_merge {
    uint64_t key;  /* (left id << 32) | right id; UINT64_MAX = empty */
    uint32_t rank; /* position in the merges list */
    int32_t id;    /* the merged token */
};

struct shoal_tokenizer {
    char *name;                      /* path, for messages; owned */
    enum shoal_tok_model model;
    int byte_level;                  /* pieces are raw bytes (GPT-2 style) */
    int byte_fallback;               /* unknown chars -> <0xXX> tokens */
    int fuse_unk;                    /* consecutive unknowns -> one unk */
    int ignore_merges;               /* a piece that is a token is kept */
    int32_t unk_id, bos_id, eos_id;  /* -1 when absent */
    int32_t byte_ids[256];           /* token of each byte, -1 if none */

    /* Ids 0..n_dense-1 index vocab directly (holes are SHOAL_TOK_UNUSED
     * entries); the few ids past them a sparse tokenizer.json holds (a toy
     * vocabulary with a model's special tokens at their real ids) are kept
     * in sparse_ids, so the tables are sized by the file's entries, not by
     * its largest id. Use shoal_tok_entry() for an id's entry. */
    size_t n_vocab;                  /* id space: largest id + 1 */
    size_t n_dense;                  /* ids stored at vocab[id] */
    size_t n_slots;                  /* vocab entries: n_dense + sparse */
    uint32_t *sparse_ids;            /* [n_slots - n_dense] ascending ids
                                        >= n_dense; vocab[n_dense + k] is
                                        sparse_ids[k]'s entry */
    struct shoal_tok_entry *vocab;   /* [n_slots] */
    char *blob;                      /* text and piece bytes */
    size_t blob_len, blob_cap;
    uint32_t max_piece_len;          /* longest rendered piece, bytes */

    uint32_t *map;                   /* open addressing: model text -> id */
    size_t map_mask;                 /* capacity - 1 (power of two) */

    struct shoal_tok_merge *merges;  /* open addressing, capacity mask+1 */
    size_t merges_mask;
    size_t n_merges;                 /* merges offered (next rank) */
    size_t n_merges_used;            /* merges in the table */

    uint32_t *added;                 /* matchable ids, by first byte and
                                        then longest first */
    size_t n_added;
    uint32_t added_first[257];       /* added[added_first[b]..[b+1]) */
    int has_normalized_added;

    struct shoal_tok_norm_op *norm;
    size_t n_norm;
    struct shoal_tok_pre_op *pre;
    size_t n_pre;

    int32_t *prefix, *suffix;        /* ids added around the text */
    size_t n_prefix, n_suffix;

    int dec_strip_leading;           /* decoder drops one leading space */
};

/* --- building (used by the loaders) ------------------------------------ */

/* A tokenizer of ids 0..n_vocab-1, every entry SHOAL_TOK_UNUSED until set. */
struct shoal_tokenizer *shoal_tok_new(const char *name, size_t n_vocab);

/* A tokenizer of ids 0..n_dense-1 and the n_sparse ids sparse_ids
 * (ascending, distinct, each >= n_dense; copied): only those ids can be set,
 * and n_vocab is the largest of them + 1. Memory is O(n_dense + n_sparse). */
struct shoal_tokenizer *shoal_tok_new_sparse(const char *name, size_t n_dense,
                                             const uint32_t *sparse_ids,
                                             size_t n_sparse);

/* The slot (vocab index) of id, or SIZE_MAX when the tokenizer has no entry
 * for it (id >= n_vocab, or a sparse tokenizer's hole). */
size_t shoal_tok_slot(const struct shoal_tokenizer *t, uint32_t id);

/* The id whose entry is vocab[slot] (slot < n_slots). */
static inline uint32_t shoal_tok_slot_id(const struct shoal_tokenizer *t,
                                         size_t slot)
{
    return slot < t->n_dense ? (uint32_t)slot
                             : t->sparse_ids[slot - t->n_dense];
}

/* The entry of id: an UNUSED entry (no text, renders as nothing) for an id
 * the tokenizer has none for. Never NULL. */
const struct shoal_tok_entry *shoal_tok_sparse_entry(
    const struct shoal_tokenizer *t, uint32_t id);
static inline const struct shoal_tok_entry *
shoal_tok_entry(const struct shoal_tokenizer *t, uint32_t id)
{
    return id < t->n_dense ? &t->vocab[id] : shoal_tok_sparse_entry(t, id);
}

/* The entry of id to modify, or NULL when the tokenizer has none for it. */
static inline struct shoal_tok_entry *
shoal_tok_entry_mut(struct shoal_tokenizer *t, uint32_t id)
{
    size_t slot = shoal_tok_slot(t, id);
    return slot == SIZE_MAX ? NULL : &t->vocab[slot];
}

/* Append bytes to the blob; returns their offset. */
uint32_t shoal_tok_blob_add(struct shoal_tokenizer *t, const char *s,
                            size_t n);

/* Set entry id (one the tokenizer has: shoal_tok_slot(t, id) != SIZE_MAX;
 * anything else is a loader's bug and aborts): text/piece bytes are copied. */
void shoal_tok_set(struct shoal_tokenizer *t, uint32_t id, const char *text,
                   size_t text_len, const char *piece, size_t piece_len,
                   float score, uint32_t attr);

/* Build the text map, byte table and added-token index. Call once all
 * entries are set. Returns 0 or -SHOAL_EFORMAT (err set). */
int shoal_tok_build_index(struct shoal_tokenizer *t, struct shoal_err *err);

/* Id of a model token's text, or -1. */
int32_t shoal_tok_lookup(const struct shoal_tokenizer *t, const char *s,
                         size_t n);

/* Reserve room for n merges (call before adding). */
void shoal_tok_merges_reserve(struct shoal_tokenizer *t, size_t n);

/* Add merge (left + right) with the next rank. Returns 0, or 1 if a side
 * or the merged text is not a model token (the merge is skipped). */
int shoal_tok_add_merge(struct shoal_tokenizer *t, const char *l, size_t ln,
                        const char *r, size_t rn);

/* Add merge (left id, right id) -> merged id with an explicit rank (lower
 * merges first); a pair already present keeps its first rank. */
void shoal_tok_add_merge_ranked(struct shoal_tokenizer *t, int32_t left,
                                int32_t right, uint32_t rank, int32_t merged);

/* Compile a pre-tokenizer / normalizer regex (UTF, UCP, $ = end only).
 * literal: match the pattern text as is. Returns NULL with err set. */
pcre2_code *shoal_tok_regex_compile(const char *pattern, size_t len,
                                    int literal, const char *what,
                                    struct shoal_err *err);

/* Append ops (arrays grow as needed); strings are copied. */
struct shoal_tok_norm_op *shoal_tok_add_norm(struct shoal_tokenizer *t,
                                             enum shoal_tok_norm_kind kind);
struct shoal_tok_pre_op *shoal_tok_add_pre(struct shoal_tokenizer *t,
                                           enum shoal_tok_pre_kind kind);
char *shoal_tok_memdup(const char *s, size_t n);

/* Append an id to the prefix or suffix list. */
void shoal_tok_add_prefix(struct shoal_tokenizer *t, int32_t id);
void shoal_tok_add_suffix(struct shoal_tokenizer *t, int32_t id);

/* The regex HF's ByteLevel pre-tokenizer uses (GPT-2's). */
extern const char shoal_tok_gpt2_regex[];

/* Loaders. name is used in messages. */
struct shoal_tokenizer *shoal_tok_load_hf(const char *json, size_t json_len,
                                          const char *config,
                                          size_t config_len,
                                          const char *name,
                                          struct shoal_err *err);

/* tiktoken.model (one "<base64 token> <rank>" per line) with Kimi-K2's
 * split pattern and special tokens; config is tokenizer_config.json or
 * NULL. Errors name the file and line (-SHOAL_EFORMAT). */
struct shoal_tokenizer *shoal_tok_load_tiktoken(const char *model,
                                                size_t model_len,
                                                const char *config,
                                                size_t config_len,
                                                const char *name,
                                                struct shoal_err *err);

/* Kimi-K2's split regex (tokenization_kimi.py pat_str), in PCRE2 syntax. */
extern const char shoal_tok_kimi_regex[];

/* ---- small growable buffers (tokenizer.c, tokenizer_encode.c) ---- */

struct buf {
    char *p;
    size_t len, cap;
};

static inline void buf_reserve(struct buf *b, size_t extra)
{
    if (b->cap - b->len >= extra)
        return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < extra)
        cap *= 2;
    b->p = shoal_xrealloc(b->p, cap);
    b->cap = cap;
}

static inline void buf_add(struct buf *b, const char *s, size_t n)
{
    buf_reserve(b, n + 1);
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
}

struct ivec {
    int32_t *v;
    size_t n, cap;
};

static inline void ivec_push(struct ivec *a, int32_t x)
{
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 64;
        a->v = shoal_xrealloc(a->v, a->cap * sizeof *a->v);
    }
    a->v[a->n++] = x;
}

/* The merge of the pair (l, r), or NULL (tokenizer.c). */
const struct shoal_tok_merge *shoal_tok_merge_find(const struct shoal_tokenizer *t,
                                                  int32_t l, int32_t r);

#endif
