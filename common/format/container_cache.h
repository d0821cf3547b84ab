/* container_cache: Hugging Face checkpoints converted once, on demand, into
 * a cache of shoal containers, for the programs that need a container
 * (shoal-worker, shoal run|chat --workers) when given a checkpoint
 * directory such as the bundled models/shakespeare-moe.
 *
 * A cached container is named <cache_dir>/<name>-<key>.shoal, where key is
 * an xxh64 of the checkpoint's file names, sizes and modification times
 * (config.json, tokenizer files, *.safetensors): the coordinator and every
 * worker on one machine find the same container, and a changed checkpoint
 * gets a new one. The conversion is lossless (precision is a property of
 * the model file, DESIGN contract 2): bf16 when every weight of the
 * checkpoint is bf16, else f32, so the cluster computes the same bits as an
 * in-process run on the checkpoint. Concurrent conversions are safe: each
 * writes its own temporary directory and renames it into place
 * (shoal_container_convert); a process that loses the race uses the
 * winner's container.
 *
 * common/ never prints: callers say "converting ... once" themselves.
 * Thread: main.
 */
#ifndef SHOAL_CONTAINER_CACHE_H
#define SHOAL_CONTAINER_CACHE_H

#include <stddef.h>

#include "err.h"

/* The cache directory: xdg_cache_home/shoal when it is an absolute path,
 * else home/.cache/shoal (both borrowed, normally getenv's XDG_CACHE_HOME
 * and HOME, read by main). Returns 0, or SHOAL_ENOTFOUND with err set when
 * neither is an absolute path. */
int shoal_container_cache_dir(const char *xdg_cache_home, const char *home,
                              char *buf, size_t n, struct shoal_err *err);

/* The cached container's path for checkpoint hf_dir (borrowed), whether or
 * not it exists yet. *path is malloc'd, owned by the caller (free()), and
 * written only on success. Returns 0, or -errno / SHOAL_EINVAL with err
 * naming hf_dir when it cannot be read or has no *.safetensors. */
int shoal_container_cache_path(const char *hf_dir, const char *cache_dir,
                               char **path, struct shoal_err *err);

/* Make the container at path (from shoal_container_cache_path) from hf_dir
 * unless it exists: creates the cache directory, loads the checkpoint,
 * converts it losslessly. Returns 0 when path holds a container afterwards
 * (also when another process finished it first), or a negative status with
 * err set (a bad checkpoint, a full disk); nothing partial is left at path. */
int shoal_container_cache_fill(const char *hf_dir, const char *path,
                               struct shoal_err *err);

#endif
