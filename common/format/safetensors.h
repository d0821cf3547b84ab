/* safetensors: read-only, memory-mapped access to Hugging Face
 * *.safetensors files, single or sharded (model.safetensors.index.json).
 *
 * Layout of one file: u64 little-endian header length N, N bytes of JSON
 * {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__"?},
 * then the data section; offsets are relative to the data section.
 * Every length, offset and shape is validated against the file before use.
 * Tensors of dtypes shoal cannot compute with are listed (so a missing or
 * unexpected tensor can be named) but refused when a caller asks for them.
 *
 * Thread: open/close on one thread; lookups are read-only and may run on any.
 */
#ifndef SHOAL_SAFETENSORS_H
#define SHOAL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "tensor.h"

#define SHOAL_MAX_DIMS 4

struct shoal_st_tensor {
    char *name;                    /* owned by the set */
    char dtype_name[16];           /* as written in the file ("BF16", "I64", ...) */
    int dtype_ok;                  /* 1 if dtype is F32/F16/BF16 or F8_E4M3
                                      (FP8, bound with its block scales); 0
                                      for the rest, whose bytes are still
                                      mapped (U8: MXFP4's *_blocks and
                                      *_scales, shoal_mxfp4_bind) */
    enum shoal_dtype dtype;        /* valid when dtype_ok */
    int n_dims;
    int64_t shape[SHOAL_MAX_DIMS]; /* outermost first */
    const void *data;              /* borrowed from the mapping (aligned) */
    size_t nbytes;
    const char *file;              /* path of the file holding it */
    int used;                      /* set by the model loader */
    int mapped;                    /* data points into the file mapping (not a copy) */
};

struct shoal_safetensors;

/* Open the checkpoint weights in dir: model.safetensors.index.json if
 * present (every shard it names must exist and every mapped tensor must be
 * in its shard), else every *.safetensors file in dir.
 * Returns a set owned by the caller (shoal_safetensors_close), or NULL with
 * err naming the file and what is wrong. Thread: any. */
struct shoal_safetensors *shoal_safetensors_open_dir(const char *dir,
                                                     struct shoal_err *err);

/* Open one .safetensors file (path borrowed). Same contract. */
struct shoal_safetensors *shoal_safetensors_open_file(const char *path,
                                                      struct shoal_err *err);

/* Close the set and unmap everything; NULL is a no-op. Views obtained from
 * it become invalid. */
void shoal_safetensors_close(struct shoal_safetensors *st);

/* Find a tensor by exact name; NULL if absent. The pointer is borrowed from
 * the set. Thread: any. */
struct shoal_st_tensor *shoal_safetensors_find(struct shoal_safetensors *st,
                                               const char *name);

/* Tell the kernel the pages of t's data are not needed for now (a file
 * mapping: they are dropped from this process's RSS and re-read from the
 * page cache or disk if touched again). Lets a converter stream a checkpoint
 * larger than RAM with bounded RSS. No-op for copied tensors. Thread: any. */
void shoal_safetensors_drop_pages(const struct shoal_st_tensor *t);

/* Number of tensors and the i-th one (in file order). */
size_t shoal_safetensors_count(const struct shoal_safetensors *st);
struct shoal_st_tensor *shoal_safetensors_at(struct shoal_safetensors *st,
                                             size_t i);

/* Bind an MXFP4 weight [rows][cols] to a checkpoint's `X_blocks` and
 * `X_scales` U8 tensors as shipped, without copying: either one weight
 * (blocks [rows][cols/32][16], scales [rows][cols/32]; index 0) or one
 * expert's slice of all experts' (blocks [n][rows][cols/32][16], scales
 * [n][rows][cols/32]; 0 <= index < n, as gpt-oss's mlp.experts.*_blocks).
 * The leading dimensions of blocks and scales must agree.
 *   w        written: dtype MXFP4, group 32, data and e8m0 pointing into
 *            the tensors' bytes (borrowed: valid while they are mapped)
 *   blocks, scales   borrowed safetensors entries (dtype "U8")
 *   name     the weight's name for messages (borrowed; e.g. "X_blocks")
 *   check_exponents  1: read the slice's exponents now (shoal_mxfp4_check);
 *            0: leave them to a shoal_mxfp4_check before the weight's first
 *            use (a 120 B checkpoint's exponents are 3.6 GB: the engine
 *            checks each routed expert the first time it runs, as for FP8)
 * Checks dtypes, shapes and byte counts (and the exponents as asked).
 * Returns 0, or SHOAL_EFORMAT / SHOAL_ESHAPE / SHOAL_EINVAL with a one-line
 * err naming the tensor, what was expected and what was found. Allocates
 * nothing. Thread: any. */
int shoal_mxfp4_bind(struct shoal_weight *w, const struct shoal_st_tensor *blocks,
                     const struct shoal_st_tensor *scales, int64_t index, int64_t rows,
                     int64_t cols, int check_exponents, const char *name,
                     struct shoal_err *err);

#endif
