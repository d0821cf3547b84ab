/* container_impl: what the container's reader (container.c), writer
 * (container_write.c), shard writer (container_shard.c) and layout rules
 * (container_layout.c) share. Internal to common/format/; what writers
 * outside it share too is public in container_write.h. */
#ifndef SHOAL_CONTAINER_IMPL_H
#define SHOAL_CONTAINER_IMPL_H

#include <stdint.h>
#include <xxhash.h>

#include "container.h"
#include "container_write.h"
#include "quant.h"

#define DENSE_ALIGN SHOAL_CONTAINER_DENSE_ALIGN
#define MAGIC_DENSE shoal_container_magic_dense
#define MAGIC_EXPERTS shoal_container_magic_experts

/* Files copied verbatim from the source checkpoint when present
 * (CONTAINER_N_SIDE_FILES of them). */
#define CONTAINER_N_SIDE_FILES 8
extern const char *const container_side_files[CONTAINER_N_SIDE_FILES];

static inline uint64_t align_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

static inline void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline void put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline uint32_t get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static inline uint64_t get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* 1 for the checkpoint-native dtypes shoal keeps but never makes. */
static inline int native_only(enum shoal_dtype t)
{
    return t == SHOAL_DTYPE_FP8 || t == SHOAL_DTYPE_MXFP4;
}

/* One line of the canonical text the fingerprint hashes (writer and
 * reader build the same lines). */
void container_fp_line(XXH64_state_t *st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The converter's and shard writer's file steps (container_write.c; the
 * others every writer shares are in container_write.h): copy a file;
 * refuse a destination that would destroy the source or an unrelated
 * directory. Each returns 0 or an error code with err set, as their
 * definitions say. */
int container_copy_file(const char *from, const char *to, struct shoal_err *err);
int container_check_destination(const char *src_dir, const char *dst, int force,
                                struct shoal_err *err);

#endif
