/* container: shoal's on-disk model format (docs/FORMAT.md), its streaming
 * writer (`shoal convert`) and its reader. The layout rules, records and
 * file steps every writer shares (convert, shard, `shoal synth`) are in
 * container_write.h.
 *
 * A container is a directory:
 *   shoal.json     manifest: format version, model_type, the verbatim
 *                  config.json object, every dense tensor (name, dtype,
 *                  shape, group, offset, bytes, xxh64), the expert section
 *                  layout and one xxh64 per expert, and the model fingerprint
 *   dense.bin      4 KiB header + the resident tensors (64-byte aligned)
 *   experts.bin    4 KiB header + one blob per routed expert: w_gate, w_up,
 *                  w_down adjacent, the blob 4 KiB aligned and padded to a
 *                  multiple of 4 KiB, so one aligned read fetches one expert
 *   config.json, tokenizer.json, ...   copied from the source checkpoint
 *
 * A shard (`shoal shard`, docs/FORMAT.md "Shards") is a container whose
 * experts.bin holds only some experts and which may lack dense.bin; its
 * manifest is the full model's plus a "shard" object, so its fingerprint
 * is the full model's. Workers open shards; the coordinator needs the
 * dense tensors, so it runs on a full container (or a shard made with
 * --with-dense).
 *
 * Thread: the writer runs on the main thread (it opens OpenMP regions to
 * quantize); an opened container is read-only and may be shared.
 */
#ifndef SHOAL_CONTAINER_H
#define SHOAL_CONTAINER_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "model.h"
#include "tensor.h"

#define SHOAL_CONTAINER_VERSION 1
#define SHOAL_CONTAINER_HEADER_BYTES 4096
#define SHOAL_CONTAINER_ALIGN 4096

/* Magic of the two binary files' headers (docs/FORMAT.md). */
extern const char shoal_container_magic_dense[8];    /* "SHOALDNS" */
extern const char shoal_container_magic_experts[8];  /* "SHOALEXP" */

/* Write the 4 KiB header of dense.bin or experts.bin at offset 0: magic,
 * format version, header size, total file bytes, fingerprint (all
 * little-endian). Returns 0 or -errno with err naming path. Thread: any. */
int shoal_container_write_header(int fd, const char magic[8], uint64_t file_bytes,
                                 uint64_t fingerprint, const char *path,
                                 struct shoal_err *err);

struct shoal_convert_params {
    enum shoal_dtype experts_dtype;  /* F32, BF16, INT8, INT4 (INT4A8, FP8, MXFP4 as
                                      * FORMAT.md says); GGML: each tensor keeps the
                                      * type it has in the source (a GGUF model) */
    enum shoal_dtype dense_dtype;    /* F32, BF16, INT8 (1-D tensors stay F32); GGML
                                      * likewise */
    int group;                       /* quant group size: 32, 64, 128 */
    enum shoal_dtype kv_dtype;       /* the KV cache's default (manifest "kv"):
                                      * F32, F16 or BF16 */
    int force;                       /* replace an existing destination */
    /* progress: called after each tensor with bytes written and total */
    void (*progress)(uint64_t done, uint64_t total, void *user);
    void *progress_user;
};

static inline struct shoal_convert_params shoal_convert_params_default(void)
{
    return (struct shoal_convert_params){.experts_dtype = SHOAL_DTYPE_BF16,
                                         .dense_dtype = SHOAL_DTYPE_BF16,
                                         .kv_dtype = SHOAL_DTYPE_F32,
                                         .group = 64};
}

/* Convert a loaded model (typically a Hugging Face checkpoint, borrowed)
 * into a container at dst. Streams tensor by tensor in bounded memory,
 * writes into a temporary directory beside dst and renames it into place
 * only when everything is written and synced; on any error the temporary
 * directory is removed and dst is untouched. Refuses an existing dst unless
 * params.force. src_dir: where to copy config/tokenizer files from (a
 * GGUF model: its first file's path; the config is the one its metadata
 * gives and the vocabulary and chat template go to tokenizer.gguf, a copy
 * of its metadata without tensors).
 * Returns 0 or a negative status with err set. Thread: main. */
int shoal_container_convert(const struct shoal_model *src, const char *src_dir,
                            const char *dst, const struct shoal_convert_params *params,
                            struct shoal_err *err);

/* Layout of one expert blob component. */
struct shoal_expert_component {
    enum shoal_dtype dtype;
    int group;
    uint32_t ggml_type; /* GGML only: its ggml type (ggml_types.h) */
    int64_t rows, cols;
    uint64_t offset;   /* within the blob */
    uint64_t bytes;
};

/* One MoE layer's expert blob when the layers differ (a container whose
 * experts dtype is GGML, converted from a GGUF file that mixes ggml types
 * per layer: docs/FORMAT.md "GGML tensors"). */
struct shoal_expert_layout {
    uint64_t blob_bytes;                  /* this layer's blob, a multiple of 4 KiB;
                                           * 0 for a dense layer */
    struct shoal_expert_component comp[6];
};

/* Routed experts read in place from the files of a GGUF set (model_gguf.c,
 * container_gguf.c) rather than from a container's experts.bin. A layer's
 * experts are llama.cpp's stacked tensors (blk.N.ffn_{gate,up,down}_exps,
 * ne = {n_in, n_out, n_expert}: the expert index slowest), so component c
 * of expert ie is the one range [base + ie * bytes, + bytes) of its file.
 * GGUF offsets are only 32-byte aligned: each range is read whole pages
 * around it ([align_down(off), align_up(off + bytes)), always, buffered
 * or O_DIRECT alike) into its own part of the expert's buffer, and the
 * view starts off % SHOAL_CONTAINER_ALIGN into that part. A GGUF carries
 * no checksums: a read is checked for length and, for ggml-typed
 * matrices, finite block scales. */
struct shoal_expert_range {
    uint32_t file;     /* index into shoal_container_gguf.files */
    uint64_t base;     /* file offset of expert 0's bytes */
    uint64_t bytes;    /* one expert's bytes (the stride); 0: no such component */
    uint64_t buf_off;  /* where its pages start in the expert's buffer */
};

struct shoal_container_gguf {
    uint32_t n_file;
    char **files;                         /* [n_file] paths, owned */
    struct shoal_expert_range *range;     /* [n_layer][6] w_gate, w_up, w_down, b_gate,
                                           * b_up, b_down */
    struct shoal_expert_weights *tmpl;    /* [n_layer] dtype and shape of each component
                                           * (data NULL) */
    uint64_t *blob_bytes;                 /* [n_layer] an expert's buffer; 0: dense layer */
};

/* An opened container (read side). Plain data, owned by the opener. */
struct shoal_container {
    char *dir;
    char *manifest_path;
    uint64_t fingerprint;
    int version;
    enum shoal_dtype kv_dtype;  /* manifest "kv": the KV cache's default (F32 when
                                 * absent); not part of the fingerprint */
    /* dense section */
    char *dense_path;
    void *dense_map;            /* mmap of dense.bin */
    size_t dense_size;
    size_t n_dense;
    struct shoal_container_tensor {
        char *name;
        struct shoal_weight w;  /* view into dense_map */
        int n_dims;
        uint64_t offset, bytes, xxh64;
    } *dense;                   /* [n_dense] */
    /* expert section */
    char *experts_path;
    uint64_t experts_size;
    enum shoal_dtype experts_dtype;
    int experts_group;
    uint64_t blob_bytes;        /* per expert, multiple of 4 KiB */
    struct shoal_expert_component comp[6]; /* w_gate, w_up, w_down (+ gpt_oss's
                                              b_gate, b_up, b_down) */
    int n_comp;                 /* 3, or 6 for gpt_oss (shoal_expert_n_comp) */
    float swiglu_limit;         /* gpt_oss: the config's, for the expert views */
    struct shoal_expert_layout *layer_layout; /* [n_layer] each MoE layer's own blob
                                 * and components (experts dtype GGML); NULL: every
                                 * layer is blob_bytes and comp (blob_bytes is then
                                 * the largest layer's) */
    int64_t n_layer, n_expert;
    uint64_t *layer_offset;     /* [n_layer] first (held) blob; UINT64_MAX for dense layers */
    uint64_t *expert_xxh64;     /* [n_layer][n_expert], every expert, held or not */
    /* shard (docs/FORMAT.md "Shards"): NULL when every expert is held */
    uint8_t *held;              /* [n_layer][n_expert] 1 if experts.bin holds it */
    int32_t *held_rank;         /* [n_layer][n_expert] blob index of the expert within
                                 * its layer's held blobs, -1 if not held; NULL with held */
    int64_t n_held;             /* experts experts.bin holds (all MoE experts when full) */
    int64_t n_moe_expert;       /* MoE layers x n_expert of the model */
    struct shoal_container_shard {
        int count;              /* workers the model was sharded for; 0: not a shard */
        int index;              /* this shard's worker index in [0, count) */
        int replicas;           /* holders per expert in [1, count] */
        double *weights;        /* [count] placement weights (owned) */
        int has_dense;          /* 1 when dense.bin is present (--with-dense) */
    } shard;
    /* experts read from a GGUF set instead of experts_path (blob_bytes is
     * then the largest layer's buffer); NULL for a shoal container */
    struct shoal_container_gguf *gguf;
};

/* Open and validate a container directory (path borrowed): manifest
 * version, file sizes, headers, fingerprints, every offset within its file.
 * A shard is accepted with or without dense.bin (shard.has_dense says
 * which; without it the dense tensors' views are NULL and bind fails).
 * On success fills cfg from the manifest's config. Returns NULL with err
 * saying what is wrong (truncated, corrupt, wrong version). Thread: any. */
struct shoal_container *shoal_container_open(const char *dir,
                                             struct shoal_model_config *cfg,
                                             struct shoal_err *err);
void shoal_container_close(struct shoal_container *ct);

/* 1 if dir holds a container manifest (shoal.json). */
int shoal_container_is(const char *dir);

/* Bind the model's dense slots to the container's views and check every
 * name, dtype and shape against the architecture. Expert slots stay
 * unbound (the expert store serves them). A shard without dense.bin fails
 * with SHOAL_EUNSUPPORTED saying to run the coordinator on the full
 * container. Thread: any. */
int shoal_container_bind(struct shoal_container *ct, struct shoal_model *m,
                         struct shoal_err *err);

/* 1 if the container holds expert (il, ie) of a MoE layer: always for a
 * full container, the shard's experts for a shard. Thread: any. */
static inline int shoal_container_holds(const struct shoal_container *ct, int64_t il,
                                        int64_t ie)
{
    if (il < 0 || il >= ct->n_layer || ie < 0 || ie >= ct->n_expert ||
        ct->layer_offset[il] == UINT64_MAX)
        return 0;
    return !ct->held || ct->held[il * ct->n_expert + ie];
}

/* File offset in experts.bin of expert (il, ie)'s blob, bytes: O(1), for
 * a held expert of a MoE layer (shoal_container_holds); UINT64_MAX for an
 * expert a shard does not hold. Thread: any. */
static inline uint64_t shoal_container_expert_offset(const struct shoal_container *ct,
                                                     int64_t il, int64_t ie)
{
    const uint64_t blob = ct->layer_layout ? ct->layer_layout[il].blob_bytes : ct->blob_bytes;
    if (!ct->held_rank)
        return ct->layer_offset[il] + (uint64_t)ie * blob;
    int32_t rank = ct->held_rank[il * ct->n_expert + ie];
    return rank < 0 ? UINT64_MAX : ct->layer_offset[il] + (uint64_t)rank * blob;
}

/* Point e's weights into a blob buffer holding the bytes of an expert of
 * MoE layer il (its components: ct->comp, or the layer's own in
 * ct->layer_layout). Thread: any. */
void shoal_container_expert_views(const struct shoal_container *ct, int64_t il,
                                  const void *blob, struct shoal_expert_weights *e);

/* Bytes of the buffer one expert of layer il is read into: blob_bytes, or
 * a GGUF layer's or a per-layer layout's own (0 for a dense layer).
 * Thread: any. */
static inline uint64_t shoal_container_blob_bytes(const struct shoal_container *ct, int64_t il)
{
    return ct->gguf ? ct->gguf->blob_bytes[il]
           : ct->layer_layout ? ct->layer_layout[il].blob_bytes : ct->blob_bytes;
}

/* Check the block scales of expert (il, ie)'s ggml-typed components in
 * its blob (a container whose experts dtype is GGML, after its xxh64):
 * every one finite (shoal_ggml_check_scales). Returns 0 (also when no
 * component is GGML) or SHOAL_EFORMAT with err naming the component,
 * block, value, layer and expert. Thread: any (an io thread). */
int shoal_container_ggml_check(const struct shoal_container *ct, int64_t il, int64_t ie,
                               const void *blob, struct shoal_err *err);

/* One read of an expert: len bytes at file offset off of file `file`
 * (0: experts_path; a GGUF: index into gguf->files) into the expert's
 * buffer at buf_off. */
struct shoal_expert_read {
    uint32_t file;
    uint64_t off, len, buf_off;
    uint64_t need;       /* bytes from off that hold the expert (len: a container's);
                          * the rest of the last page may lie past the end of the file */
    int comp;            /* the component it holds (GGUF), -1: the whole blob */
};

/* The reads that bring expert (il, ie) (held) into a buffer of
 * shoal_container_blob_bytes(ct, il) bytes: one for a container, one per
 * component for a GGUF (4 KiB aligned: an O_DIRECT read needs no more).
 *   out  [6] written; returns how many. Thread: any. */
int shoal_container_expert_reads(const struct shoal_container *ct, int64_t il, int64_t ie,
                                 struct shoal_expert_read *out);

/* shoal_container_expert_views for expert (il, ie) of any container,
 * GGUF included (whose views depend on the expert). Thread: any. */
void shoal_container_expert_views_at(const struct shoal_container *ct, int64_t il, int64_t ie,
                                     const void *blob, struct shoal_expert_weights *e);

/* Check a GGUF expert's component as read (rd from
 * shoal_container_expert_reads, its bytes at blob + rd->buf_off): every
 * ggml block scale finite. Returns 0 or SHOAL_EFORMAT with err naming the
 * tensor (blk.N.ffn_gate_exps.weight), the block, its value and the
 * expert. Thread: any (an io thread). */
int shoal_container_gguf_check(const struct shoal_container *ct, int64_t il, int64_t ie,
                               const struct shoal_expert_read *rd, const void *blob,
                               struct shoal_err *err);

/* A container over the routed experts of a loaded GGUF model m (borrowed;
 * its expert views must point into the mappings of m's files, as
 * model_gguf.c binds them): no dense section, every expert held, each
 * read in place from the GGUF files. dir is the first file's path;
 * fingerprint hashes the expert layout (offsets, sizes, types, shapes,
 * the SwiGLU limit) and three pages of each stacked expert tensor (its
 * first, middle and last), not the files' names: a renamed copy has the
 * same fingerprint, another quantization or a re-upload of other experts
 * another (two files differing only outside those pages are not told
 * apart; reading every byte would read the file at every start). Returns it
 * (owned by the caller: shoal_container_close) or NULL with err (a layer
 * whose experts are not evenly strided in one file). Thread: main. */
struct shoal_container *shoal_container_from_gguf(const struct shoal_model *m,
                                                  struct shoal_err *err);

/* Parameters of one shard written by shoal_container_write_shard. */
struct shoal_shard_params {
    int index, count, replicas;   /* recorded in the manifest: worker index in
                                   * [0, count), workers, holders per expert */
    const double *weights;        /* [count] placement weights, borrowed; NULL = equal */
    const uint8_t *held;          /* [n_layer][n_expert] 1: copy the expert, borrowed */
    int with_dense;               /* 1: copy dense.bin too */
    int force;                    /* replace an existing shoal container at dst */
    /* progress: called after each blob with bytes copied and total */
    void (*progress)(uint64_t done, uint64_t total, void *user);
    void *progress_user;
};

/* Write a shard of ct (a full container, borrowed) at dst: the manifest
 * with its "shard" object, experts.bin with the held experts' blobs (each
 * read, checked against its xxh64 and written; one blob in memory at a
 * time), dense.bin when with_dense, and the side files. Like convert it
 * writes into a temporary directory beside dst and renames it into place
 * when everything is synced; on error nothing is left. Refuses an existing
 * dst unless params.force (and then only a shoal container).
 *   bytes_out  total bytes of the files written, or NULL
 * Returns 0, SHOAL_EINVAL (bad params, ct is itself a shard, dst exists),
 * SHOAL_EFORMAT (a source blob fails its checksum: file, layer, expert,
 * offset) or -errno, with err set. Thread: main. */
int shoal_container_write_shard(const struct shoal_container *ct, const char *dst,
                                const struct shoal_shard_params *p, uint64_t *bytes_out,
                                struct shoal_err *err);

/* Check every checksum: dense tensors (when dense.bin is present) and
 * every expert experts.bin holds (read sequentially).
 * progress(done_bytes, total_bytes, user) after each expert when not NULL.
 * Returns 0 or SHOAL_EFORMAT naming the file, layer, expert and offset. */
int shoal_container_verify(const struct shoal_container *ct,
                           void (*progress)(uint64_t, uint64_t, void *),
                           void *user, struct shoal_err *err);

#endif
