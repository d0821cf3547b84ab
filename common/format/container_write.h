/* container_write: what every writer of a shoal container follows
 * (docs/FORMAT.md), in one place: the converter (container_write.c), the
 * shard writer (container_shard.c), the reader's fingerprint check
 * (container.c) and `shoal synth` (coordinator/bench/), which writes
 * random weights straight into a container laid out byte for byte as a
 * converted one would be.
 *
 *   dtypes and bytes  the dtype and group a slot is stored in, its bytes
 *   layout            where each dense tensor goes in dense.bin (64-byte
 *                     aligned after the header) and where each component
 *                     goes in an expert blob (64-byte aligned, the blob
 *                     padded to 4 KiB), laid out from the first expert
 *   records           a dense tensor's and a layer's manifest entries, the
 *                     blob components' list, the manifest itself, and the
 *                     lines of canonical text the fingerprint hashes
 *   file steps        a temporary directory beside the destination, sync
 *                     and close, write a JSON file, remove the directory or
 *                     publish it under its name
 *
 * Thread: any (one writer's structs on one thread).
 */
#ifndef SHOAL_CONTAINER_WRITE_H
#define SHOAL_CONTAINER_WRITE_H

#include <jansson.h>
#include <stdint.h>
#include <xxhash.h>

#include "container.h"
#include "err.h"
#include "model.h"
#include "tensor.h"

/* Alignment of a dense tensor in dense.bin and of a component in a blob. */
#define SHOAL_CONTAINER_DENSE_ALIGN 64

/* ---- dtypes and bytes ------------------------------------------------------ */

/* The dtype slot s is stored in when experts go to `experts` and dense
 * tensors to `dense` (shoal_target_dtype: 1-D tensors f32, routers int8
 * under int4). FP8 and MXFP4 keep the source's precision: a dense tensor
 * that is not FP8 (MXFP4) in the source stays at its own dtype (BF16, else
 * F32), since shoal never quantizes to either; s->w is read only then. */
enum shoal_dtype shoal_container_slot_dtype(const struct shoal_weight_slot *s,
                                            enum shoal_dtype experts, enum shoal_dtype dense);

/* The group a tensor of dtype t is written with: FP8's block edge,
 * MXFP4's 32, else `group` (the --group of the conversion). */
int shoal_container_dtype_group(enum shoal_dtype t, int group);

/* The group the manifest and the fingerprint record: 0 for float dtypes. */
int shoal_container_recorded_group(enum shoal_dtype t, int group);

/* Bytes of slot s stored as dtype t with group `group` (a 1-D tensor as
 * one row). */
uint64_t shoal_container_slot_bytes(const struct shoal_weight_slot *s, enum shoal_dtype t,
                                    int group);

/* ---- layout ---------------------------------------------------------------- */

struct shoal_container_layout {
    uint64_t dense_end;                 /* end of the dense tensors laid out so far */
    uint64_t blob_bytes;                /* 0 until the first expert is laid out */
    uint64_t comp_off[6], comp_bytes[6];
    enum shoal_dtype comp_dtype[6];
    int comp_group[6];                  /* as recorded (shoal_container_recorded_group) */
    int n_comp;                         /* shoal_expert_n_comp */
    int64_t n_blobs;                    /* experts laid out */
    uint64_t blobs_bytes;               /* their bytes together */
    struct shoal_expert_layout *layer;  /* [n_layer] each MoE layer's own blob, owned
                                         * (shoal_container_layout_per_layer); NULL:
                                         * one blob for every layer */
    int64_t n_layer;
};

/* An empty layout for a model of config c. */
void shoal_container_layout_init(struct shoal_container_layout *l,
                                 const struct shoal_model_config *c);

/* Give every MoE layer its own blob (experts dtype GGML: a GGUF's types
 * may differ per layer, docs/FORMAT.md "GGML tensors"): each layer's
 * first expert lays out its blob, padded to 4 KiB, and blob_bytes becomes
 * the largest. Free with shoal_container_layout_free. */
void shoal_container_layout_per_layer(struct shoal_container_layout *l, int64_t n_layer);

/* Free what shoal_container_layout_per_layer allocated (l itself is the
 * caller's). */
void shoal_container_layout_free(struct shoal_container_layout *l);

/* The blob of an expert of MoE layer il: its layer's (per-layer layouts)
 * or the one blob. */
uint64_t shoal_container_layout_blob(const struct shoal_container_layout *l, int64_t il);

/* Lay out slot s, stored as dtype t with group `group` in `bytes` bytes
 * (the three above). A dense slot goes after the previous one: returns its
 * offset in dense.bin. An expert slot's component takes its place in the
 * blob the first expert lays out (every expert has the same shapes): returns
 * the component's offset in the blob. */
uint64_t shoal_container_layout_slot(struct shoal_container_layout *l,
                                     const struct shoal_weight_slot *s, enum shoal_dtype t,
                                     int group, uint64_t bytes);

/* Bytes of dense.bin (4 KiB aligned) for the dense tensors laid out. */
uint64_t shoal_container_layout_dense_bytes(const struct shoal_container_layout *l);

/* Bytes of dense.bin and experts.bin together for what was laid out. */
uint64_t shoal_container_layout_bytes(const struct shoal_container_layout *l);

/* ---- records --------------------------------------------------------------- */

/* The fingerprint's first line: format version, model_type, the experts'
 * dtype and group and the blob size. */
void shoal_container_fp_head(XXH64_state_t *st, const char *model_type,
                             enum shoal_dtype experts, int group, uint64_t blob_bytes);

/* The fingerprint's line of a dense tensor (group: its group, recorded as
 * 0 for float dtypes) and of an expert blob. */
void shoal_container_fp_dense(XXH64_state_t *st, const struct shoal_weight_slot *s,
                              enum shoal_dtype t, int group, uint64_t xxh);
void shoal_container_fp_expert(XXH64_state_t *st, int64_t il, int64_t ie, uint64_t xxh);

/* The lines a GGML dense tensor adds after its dense line (its ggml type)
 * and each MoE layer of a per-layer layout adds after the first line (its
 * blob and each component's dtype, ggml type, offset and bytes), so that
 * equal fingerprints mean equal types as well as equal bytes. */
void shoal_container_fp_ggml(XXH64_state_t *st, const char *name, uint32_t ggml_type);
void shoal_container_fp_layout(XXH64_state_t *st, int64_t il,
                               const struct shoal_expert_layout *L, int n_comp);

/* xxh as the manifest writes it: 16 lowercase hex digits into hex[17]. */
void shoal_container_hex(uint64_t xxh, char hex[17]);

/* The manifest entry of dense slot s stored as t (group as above) at
 * offset off of dense.bin in `bytes` bytes (new reference); a GGML one
 * adds "ggml_type", s->w's. */
json_t *shoal_container_dense_entry(const struct shoal_weight_slot *s, enum shoal_dtype t,
                                    int group, uint64_t off, uint64_t bytes, uint64_t xxh);

/* The manifest entry of MoE layer il: its first blob's offset in
 * experts.bin and its blobs' xxh64 strings (sums stolen; new reference). */
json_t *shoal_container_layer_entry(int64_t il, uint64_t offset, json_t *sums);

/* What the manifest says besides the layout (shoal_container_manifest). */
struct shoal_container_manifest_params {
    const char *model_type;
    uint64_t fingerprint;
    const char *kv;              /* the KV cache's default dtype name; NULL: no "kv" key */
    json_t *config;              /* the config.json object (borrowed) */
    json_t *files;               /* the files copied beside it (stolen) */
    json_t *tensors;             /* dense entries (stolen) */
    json_t *layers;              /* layer entries (stolen) */
    uint64_t dense_bytes, experts_bytes;
    enum shoal_dtype experts_dtype;
    int experts_group;
    const struct shoal_model_config *cfg;
};

/* shoal.json's object for layout l (new reference; NULL when jansson
 * runs out of memory). Its keys in the order docs/FORMAT.md lists them.
 * A per-layer layout gives each layer entry its "blob_bytes" and
 * "components" and leaves experts.components empty. */
json_t *shoal_container_manifest(const struct shoal_container_layout *l,
                                 const struct shoal_container_manifest_params *p);

/* ---- file steps ------------------------------------------------------------ */

/* fsync and close fd (path for the error); drop_cache: also tell the kernel
 * the file's pages are not needed again (a benchmark's container should not
 * start warm). Returns 0 or -errno with err set; fd is closed either way. */
int shoal_container_sync_close(int fd, const char *path, int drop_cache,
                               struct shoal_err *err);

/* Write j to path (one-space indent, as every manifest) and fsync it.
 * Returns 0 or SHOAL_EIO with err naming path. */
int shoal_container_write_json(json_t *j, const char *path, struct shoal_err *err);

/* Create the temporary directory a writer fills beside dst (dst.tmp-PID,
 * a stale one of that name removed first) into *tmp (malloc'd, the
 * caller frees). Returns 0, or -errno with err set and *tmp NULL. */
int shoal_container_make_tmp(const char *dst, char **tmp, struct shoal_err *err);

/* Remove a (temporary) directory and the files in it (not sub-directories:
 * a container has none). Missing: nothing to do. */
void shoal_container_rm_tree(const char *dir);

/* Rename the finished directory tmp to dst. replace: an existing dst
 * (already checked to be a container that may be replaced) is moved aside
 * first, put back if the rename fails, else removed. Without it a dst that
 * appeared while tmp was written is left alone (an error). Returns 0 or
 * -errno with err set. */
int shoal_container_publish_dir(const char *tmp, const char *dst, int replace,
                                struct shoal_err *err);

#endif
