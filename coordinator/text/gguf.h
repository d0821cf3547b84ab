/* gguf: a small, defensive reader for GGUF files (versions 2 and 3).
 *
 * Reads the header, every metadata key/value pair and the tensor
 * descriptors; never the tensor data (its absolute file offset is given so
 * a caller can map it). Every count and length read from the file is
 * checked against the bytes that remain before anything is allocated, so a
 * truncated or hostile file yields an error, never a crash or a huge
 * allocation.
 *
 * Byte layout (all integers little-endian):
 *   u32 magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv times:      str key | u32 type | value
 *   n_tensors times: str name | u32 n_dims | u64 ne[n_dims] | u32 type |
 *                    u64 offset (relative to the data section)
 *   padding to general.alignment (default 32), then the data section
 * where str = u64 length + bytes (no terminator), and a value is a scalar
 * of the given type, a str, or an array: u32 element type | u64 count |
 * elements (arrays of arrays are refused).
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
    uint32_t type;                    /* ggml type id, unchecked */
    uint64_t offset;                  /* absolute file offset, bytes;
                                         checked to be aligned and inside
                                         the file, but the tensor's byte
                                         size is not (this reader has no
                                         ggml type table) */
};

/* Open and parse path. Returns a handle owned by the caller (free with
 * shoal_gguf_close), or NULL with err set: -errno for open/read failures,
 * -SHOAL_EFORMAT for a bad magic, truncation or an impossible count (the
 * message names the file, the field and its offset), -SHOAL_EUNSUPPORTED
 * for an unknown version or value type. Thread: any. */
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

#endif
