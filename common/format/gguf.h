/* gguf: a small, defensive reader for GGUF files (versions 2 and 3), the
 * container llama.cpp's models ship in; shoal's one GGUF parser (the
 * tokenizer's vocabulary and the model's tensors both come through it).
 *
 * Reads the header, every metadata key/value pair and the tensor
 * descriptors with buffered reads; never the tensor data (each tensor's
 * absolute file offset and byte count are given so a caller can map or
 * pread it). Every count and length read from the file is checked against
 * the bytes that remain before it is used, and arrays grow only as their
 * entries are read, so a truncated or hostile file yields an error, never
 * a crash or an allocation sized by a count in the file. The header (all
 * bytes before the data section) may be at most SHOAL_GGUF_MAX_HEADER_BYTES.
 * Each tensor's type must be a ggml type (ggml_types.h), its ne[0] a
 * multiple of the type's block, its offset a multiple of the alignment and
 * its bytes (ggml_types.h's shoal_ggml_nbytes) inside the file; tensor
 * names and keys are unique.
 *
 * Byte layout (all integers little-endian):
 *   u32 magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv times:      str key | u32 type | value
 *   n_tensors times: str name | u32 n_dims | u64 ne[n_dims] | u32 type |
 *                    u64 offset (relative to the data section)
 *   padding to general.alignment (default 32), then the data section
 * where str = u64 length + bytes (no terminator), and a value is a scalar
 * of the given type, a str, or an array: u32 element type | u64 count |
 * elements (arrays of arrays are refused). The format's own description:
 * ggml/docs/gguf.md in llama.cpp; ggml/src/gguf.cpp is its reader.
 *
 * Split files (llama.cpp's gguf-split): NAME-00001-of-00003.gguf ... each
 * a complete GGUF holding some of the tensors, with metadata split.no
 * (u16, 0-based), split.count (u16) and, in the first, split.tensors.count
 * (i32); shoal_gguf_files_open() opens all of them from any one.
 *
 * Thread: a loaded struct shoal_gguf is read-only; any thread may query it.
 */
#ifndef SHOAL_GGUF_H
#define SHOAL_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

enum shoal_gguf_type {
    SHOAL_GGUF_TYPE_UINT8   = 0,
    SHOAL_GGUF_TYPE_INT8    = 1,
    SHOAL_GGUF_TYPE_UINT16  = 2,
    SHOAL_GGUF_TYPE_INT16   = 3,
    SHOAL_GGUF_TYPE_UINT32  = 4,
    SHOAL_GGUF_TYPE_INT32   = 5,
    SHOAL_GGUF_TYPE_FLOAT32 = 6,
    SHOAL_GGUF_TYPE_BOOL    = 7,
    SHOAL_GGUF_TYPE_STRING  = 8,
    SHOAL_GGUF_TYPE_ARRAY   = 9,
    SHOAL_GGUF_TYPE_UINT64  = 10,
    SHOAL_GGUF_TYPE_INT64   = 11,
    SHOAL_GGUF_TYPE_FLOAT64 = 12,
    SHOAL_GGUF_TYPE_COUNT
};

#define SHOAL_GGUF_MAX_DIMS 4
/* The most bytes the metadata and tensor descriptors may span; real files
 * use a few MB (a 256k-token vocabulary is ~10 MB). */
#define SHOAL_GGUF_MAX_HEADER_BYTES ((uint64_t)256 << 20)

struct shoal_gguf;

/* Borrowed view of an array value; valid while the gguf is alive. */
struct shoal_gguf_array {
    enum shoal_gguf_type type; /* element type (never ARRAY) */
    uint64_t n;                /* element count */
    const void *data;          /* [n] elements in host byte order (bool: u8);
                                  NULL for strings */
    const char *const *strs;   /* [n] NUL-terminated strings (may also
                                  contain NULs: use str_lens), or NULL */
    const uint64_t *str_lens;  /* [n] byte lengths, or NULL */
};

/* Descriptor of one tensor (no data is read). */
struct shoal_gguf_tensor {
    const char *name;                 /* borrowed, NUL-terminated */
    uint32_t n_dims;                  /* 1..SHOAL_GGUF_MAX_DIMS */
    uint64_t ne[SHOAL_GGUF_MAX_DIMS]; /* elements per dim, innermost first;
                                         unused dims are 1 */
    uint32_t type;                    /* ggml type id (enum
                                         shoal_ggml_type), a known one */
    uint64_t offset;                  /* absolute file offset, bytes;
                                         aligned, and offset + nbytes is
                                         inside the file */
    uint64_t nbytes;                  /* bytes of data: ne[0] / block *
                                         type_size * ne[1] * ne[2] * ne[3] */
};

/* Open and parse path. Returns a handle owned by the caller (free with
 * shoal_gguf_close), or NULL with err set: -errno for open/read failures,
 * -SHOAL_EFORMAT for a bad magic, truncation, an impossible count, a
 * tensor whose bytes pass the end of the file or whose offset is not
 * aligned (the message names the file, the field or tensor, and expected
 * vs found), -SHOAL_EUNSUPPORTED for an unknown version, value type or
 * ggml type, -SHOAL_ESHAPE for a row that is not whole blocks of its type,
 * -SHOAL_ERANGE for a byte count past 2^63. Thread: any. */
struct shoal_gguf *shoal_gguf_open(const char *path, struct shoal_err *err);

/* Parse a GGUF image held in memory (the same checks; data is copied as
 * needed and may be freed afterwards). name is used in messages only.
 * Thread: any. */
struct shoal_gguf *shoal_gguf_open_mem(const void *data, size_t size,
                                       const char *name,
                                       struct shoal_err *err);

/* Free; NULL is a no-op. Thread: any. */
void shoal_gguf_close(struct shoal_gguf *g);

/* Header facts. Thread: any. */
uint32_t shoal_gguf_version(const struct shoal_gguf *g);
uint64_t shoal_gguf_n_kv(const struct shoal_gguf *g);
uint64_t shoal_gguf_n_tensors(const struct shoal_gguf *g);
/* Absolute file offset of the (aligned) data section. Thread: any. */
uint64_t shoal_gguf_data_offset(const struct shoal_gguf *g);
/* general.alignment (default 32), bytes. Thread: any. */
uint64_t shoal_gguf_alignment(const struct shoal_gguf *g);
/* The file's (or memory image's) size in bytes. Thread: any. */
uint64_t shoal_gguf_file_size(const struct shoal_gguf *g);

/* Index of key, or -1 if absent (linear search). Thread: any. */
int64_t shoal_gguf_find(const struct shoal_gguf *g, const char *key);
/* Key name (borrowed) and value type of entry i (0 <= i < n_kv); NULL /
 * SHOAL_GGUF_TYPE_COUNT when i is out of range. Thread: any. */
const char *shoal_gguf_key(const struct shoal_gguf *g, uint64_t i);
enum shoal_gguf_type shoal_gguf_kv_type(const struct shoal_gguf *g,
                                        uint64_t i);

/* Typed getters. Each returns 0 and writes *out, -SHOAL_ENOTFOUND if key is
 * absent (err not set, so optional keys cost nothing), or -SHOAL_EFORMAT
 * with err set when the key holds another type.
 *   get_int   any integer type (u64 values above INT64_MAX are refused)
 *   get_bool  bool (or an integer: nonzero is true)
 *   get_f64   float32 or float64
 *   get_str   string; *out borrowed, NUL-terminated, *len bytes
 *   get_array array; *out is a borrowed view
 * Thread: any. */
int shoal_gguf_get_int(const struct shoal_gguf *g, const char *key,
                       int64_t *out, struct shoal_err *err);
int shoal_gguf_get_bool(const struct shoal_gguf *g, const char *key, int *out,
                        struct shoal_err *err);
int shoal_gguf_get_f64(const struct shoal_gguf *g, const char *key,
                       double *out, struct shoal_err *err);
int shoal_gguf_get_str(const struct shoal_gguf *g, const char *key,
                       const char **out, size_t *len, struct shoal_err *err);
int shoal_gguf_get_array(const struct shoal_gguf *g, const char *key,
                         struct shoal_gguf_array *out, struct shoal_err *err);

/* Tensor descriptor i (0 <= i < n_tensors); returns 0, or -SHOAL_ERANGE.
 * out->name is borrowed. Thread: any. */
int shoal_gguf_tensor(const struct shoal_gguf *g, uint64_t i,
                      struct shoal_gguf_tensor *out);

/* Name of a value type ("uint32", "string", ...); static string.
 * Thread: any. */
const char *shoal_gguf_type_name(enum shoal_gguf_type t);

/* ---- split files --------------------------------------------------------- */

/* Parse a split file name "PREFIX-NNNNN-of-MMMMM.gguf" (5 digits each, as
 * gguf-split writes them). Returns 0 and writes *prefix_len (bytes of path
 * before "-NNNNN"), *no (1-based) and *count; -SHOAL_ENOTFOUND if path
 * does not have that form (or no is 0 or above count). Thread: any. */
int shoal_gguf_split_name(const char *path, size_t *prefix_len, uint32_t *no,
                          uint32_t *count);

/* One GGUF model: a single file, or every file of a split set. */
/* Write g's metadata as a GGUF file of its own at path: version 3, no
 * tensors, every key/value pair in order except split.* (the result is
 * one file, not part of a set), values re-encoded little-endian exactly as
 * read. shoal convert keeps a GGUF's vocabulary and chat template this
 * way (tokenizer.gguf in the container). Returns 0, or -errno /
 * SHOAL_EIO with err naming path. Thread: any. */
int shoal_gguf_write_meta(const struct shoal_gguf *g, const char *path, struct shoal_err *err);

struct shoal_gguf_files;

/* Open path, and when its split.count is above 1, the set's other files
 * (named from path's prefix by shoal_gguf_split_name). Checks that file i
 * (0-based) says split.no = i and every file the same split.count, that
 * tensor names are unique across the set, and that the first file's
 * split.tensors.count (when present) equals the set's tensor count.
 * Returns a handle owned by the caller (shoal_gguf_files_close), or NULL
 * with err set: shoal_gguf_open's errors for any file (naming it), or
 * -SHOAL_EFORMAT for an inconsistent set, naming the file and the key with
 * expected vs found. Thread: any. */
struct shoal_gguf_files *shoal_gguf_files_open(const char *path,
                                               struct shoal_err *err);

/* Free; NULL is a no-op. Thread: any. */
void shoal_gguf_files_close(struct shoal_gguf_files *f);

/* Number of files (1 when not split). Thread: any. */
uint32_t shoal_gguf_files_count(const struct shoal_gguf_files *f);

/* File i (0 <= i < count, in split order) and its path; borrowed, valid
 * until shoal_gguf_files_close. NULL when i is out of range. Thread: any. */
const struct shoal_gguf *shoal_gguf_files_get(const struct shoal_gguf_files *f,
                                              uint32_t i);
const char *shoal_gguf_files_path(const struct shoal_gguf_files *f, uint32_t i);

#endif
