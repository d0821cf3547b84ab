/* bench_probe: what `shoal bench` measures besides the engine: the machine
 * it runs on, the physical limits next to which every speed figure is
 * printed (docs/BENCHMARKS.md), and how a cold state is made.
 *
 *   machine   CPU model, cores, ISA flags, RAM, kernel; the file system,
 *             block device, driver, scheduler and free space under a path
 *   ssd       fio random O_DIRECT reads of one expert blob each, on the
 *             container's own experts.bin (read-only), at the engine's
 *             queue depth; fio runs as a subprocess (--output-format=json)
 *   ram       a STREAM-like probe (read / copy / triad, best of R), the
 *             kernel of bench/ram_probe.c, run in a child process so the
 *             caller's peak RSS and OpenMP state stay untouched
 *   cold      drop the page cache (root) or evict the model's files with
 *             posix_fadvise(DONTNEED) (anyone); mincore() says what is
 *             still resident afterwards
 *
 * Every probe returns a JSON object (jansson, owned by the caller). A probe
 * that cannot run returns {"skipped": "why"} or {"error": "what"} instead
 * of failing, so a result always says what was and was not measured.
 * Linux is the measured platform; elsewhere the machine fields that need
 * /proc or /sys are null.
 *
 * Thread: main. Nothing here may be called while OpenMP threads or the
 * expert store's io threads exist in the caller when it forks
 * (shoal_bench_fork_json documents why).
 */
#ifndef SHOAL_BENCH_PROBE_H
#define SHOAL_BENCH_PROBE_H

#include <jansson.h>
#include <stdint.h>

#include "err.h"

/* ---- running something in a child process ---- */

/* Run fn(user, &out) in a forked child and return the JSON object it
 * produced (owned by the caller). The child starts with the parent's
 * memory but its own address space, so its allocations, page faults,
 * peak RSS (getrusage in the child) and OpenMP thread pool are its own
 * and vanish with it. fn returns 0 with *out set, or nonzero (*out may
 * still hold a partial object with an "error" field).
 * The caller must be single-threaded (no OpenMP pool, no io thread):
 * libgomp's pool does not survive fork().
 * Returns the object, or NULL with err set: fork/pipe failure (-errno),
 * the child died on a signal or returned nonzero without JSON
 * (-SHOAL_EIO, the message names the signal or status), or its output is
 * not JSON (-SHOAL_EFORMAT). Thread: main. */
json_t *shoal_bench_fork_json(int (*fn)(void *user, json_t **out), void *user,
                              struct shoal_err *err);

/* ---- the machine ---- */

/* Describe the machine and the storage under path (borrowed): cpu,
 * cores, avx2/avx512f/neon, ram_bytes, kernel, hostname, and "storage":
 * mount point, fstype, source, block device, rotational, scheduler,
 * driver, model, size_bytes, free_bytes. Unknown fields are null. Never
 * fails. Thread: any. */
json_t *shoal_bench_machine(const char *path);

/* Load average over 1, 5, 15 minutes as a JSON array, or null. */
json_t *shoal_bench_loadavg(void);

/* ---- cold state ---- */

/* Make the files of the given directories cold in the page cache.
 *   dirs  [n_dirs] directory paths, or regular files (a GGUF set's), borrowed
 * As root: sync, then write 3 to /proc/sys/vm/drop_caches (every clean
 * page of the machine). Otherwise, or if that write fails: sync and
 * posix_fadvise(POSIX_FADV_DONTNEED) on every regular file directly in
 * each directory, and on each file given (clean pages of those files only).
 * Returns {"method": "drop_caches"|"fadvise", "why": ..., "files": N,
 * "resident_after": fraction of the largest file's pages still cached
 * (mincore), "seconds": ...}. Never fails. Thread: main. */
json_t *shoal_bench_evict(const char *const *dirs, int n_dirs);

/* Fraction in [0, 1] of path's pages resident in the page cache
 * (mmap + mincore, touching nothing), or -1 when it cannot be told: the
 * file cannot be opened, or the caller is not root and cannot write it
 * (Linux >= 5.2 then reports every page resident). Thread: any. */
double shoal_bench_resident(const char *path);

/* ---- limits ---- */

struct shoal_bench_fio_params {
    const char *path;        /* file to read (opened --readonly), borrowed */
    uint64_t offset;         /* first byte of the region, bytes */
    uint64_t size;           /* region length, bytes (rounded down to bs) */
    uint64_t bs;             /* request size, bytes (one expert blob) */
    int iodepth;             /* requests in flight (the engine's queue depth) */
    double runtime_s;        /* measured seconds after a 1 s ramp */
};

/* fio random O_DIRECT reads of bs bytes at iodepth on path, io_uring
 * engine (libaio, then psync at depth 1, when fio lacks it). Returns
 * {"mb_per_s", "iops", "clat_ms_mean", "engine", "bs", "iodepth", "cmd"}
 * (MB = 1e6 bytes), or {"skipped": why} when fio is not on PATH, or
 * {"error": fio's last words, "cmd"} when every engine failed.
 * Thread: main. */
json_t *shoal_bench_fio(const struct shoal_bench_fio_params *p);

struct shoal_bench_ram_params {
    int threads;             /* OpenMP threads; 0: the OpenMP default */
    int64_t array_mib;       /* each of the 3 arrays, MiB (far above the LLC) */
    int reps;                /* repetitions; the best is kept (as STREAM) */
};

/* STREAM-like probe in a child process (shoal_bench_fork_json):
 *   read   x ^= bits(a[i])        8 bytes per element (integer: vectorizes)
 *   copy   c[i] = a[i]            16 bytes
 *   triad  a[i] = b[i] + 3 c[i]   24 bytes
 * Returns {"threads", "array_mib", "reps", "read_gbs", "copy_gbs",
 * "triad_gbs"} (GB = 1e9 bytes per second), or {"error": ...}.
 * Thread: main (single-threaded caller, see shoal_bench_fork_json). */
json_t *shoal_bench_ram(const struct shoal_bench_ram_params *p);

#endif
