/* io_engine: asynchronous positional reads for the expert store (DESIGN §4).
 *
 * Two backends sit behind one ops table (io_engine_impl.h), chosen once at
 * create and logged by name:
 *   pread  a small portable pool of threads doing pread(2), each read in
 *          full (short reads are continued);
 *   uring  one io_uring owned by one io thread (liburing), at most
 *          queue_depth reads in flight. When liburing is not built in or the
 *          ring cannot be set up (old kernel, seccomp, RLIMIT), the engine
 *          falls back to pread and logs one warning line with the reason
 *          (once per process).
 * Either way at most queue_depth reads are in flight; further submissions
 * wait in a FIFO queue (no allocation: requests are intrusive).
 *
 * Async contract: if shoal_io_engine_submit() returns an error the
 * callback never runs; if it returns 0 the callback runs exactly once, on an
 * io thread, with req->result = req->len (every byte read; see min_len), a negative
 * -errno from the read, -SHOAL_EIO at an unexpected end of file, or
 * -SHOAL_ECANCELED when the engine is destroyed or shoal_io_engine_cancel
 * asked before the read finished (a background read may have filled part
 * of buf then).
 * Callbacks of different requests may run concurrently (pread pool); a
 * callback may submit new requests. The request and its buffer are borrowed
 * by the engine from submit until its callback returns.
 *
 * Thread: create/destroy on the owning thread (the coordinator's main
 * thread); submit from any thread; callbacks on io threads.
 */
#ifndef SHOAL_IO_ENGINE_H
#define SHOAL_IO_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

enum shoal_io_kind {
    SHOAL_IO_AUTO = 0,   /* uring when built in, else pread; a ring failure is logged */
    SHOAL_IO_PREAD = 1,  /* portable thread pool */
    SHOAL_IO_URING = 2,  /* io_uring (Linux); logged fallback to pread */
};

#define SHOAL_IO_QUEUE_DEPTH_MAX 256

struct shoal_io_engine_params {
    enum shoal_io_kind kind;
    int queue_depth;      /* reads in flight at most, 1..SHOAL_IO_QUEUE_DEPTH_MAX */
};

static inline struct shoal_io_engine_params shoal_io_engine_params_default(void)
{
    return (struct shoal_io_engine_params){.kind = SHOAL_IO_AUTO, .queue_depth = 8};
}

/* One read. The caller fills the first block and owns the memory; the
 * engine writes result and uses the private link while it holds req. */
struct shoal_io_req {
    int fd;                                  /* open for reading, borrowed */
    void *buf;                               /* [len] bytes, borrowed; aligned for O_DIRECT fds */
    size_t len;                              /* bytes to read, > 0 */
    uint64_t off;                            /* file offset, bytes */
    void (*cb)(struct shoal_io_req *req);    /* completion, exactly once (see above) */
    void *user_data;                         /* for the callback */
    int urgent;                              /* 1: starts before the queued requests
                                              * that are not (a read someone waits for,
                                              * ahead of prefetches); each kind in
                                              * order. 0: a background read: read in
                                              * pieces of SHOAL_IO_BG_PIECE, of all
                                              * such reads as many pieces in flight as
                                              * the disk reads in about 15 ms (uring;
                                              * one in the pread pool), so that an
                                              * urgent read queued later waits about
                                              * that long behind them
                                              * (shoal_io_engine_promote turns it
                                              * urgent) */
    size_t min_len;                          /* 0: every byte; else a short read (the end
                                              * of the file) that has brought at least
                                              * min_len bytes ends the read, result the
                                              * bytes read (a page-rounded O_DIRECT read
                                              * of a file's tail) */
    int map;                                 /* 1: when every page of the range is in
                                              * the page cache (Linux), map the file
                                              * over buf instead of copying it: buf,
                                              * off page-aligned, buf the start of a
                                              * private anonymous mapping of >= len
                                              * bytes (its pages are replaced), the
                                              * range inside the file. Else the read
                                              * as usual. */
    int mapped;                              /* out: 1 when buf is now a read-only
                                              * shared mapping of the file (munmap
                                              * it; never read into it again) */
    int64_t result;                          /* out: len (or with min_len, the bytes
                                              * read), or a negative status */
    struct shoal_io_req *next_;              /* private to the engine */
    size_t done_;                            /* private: bytes read so far */
    size_t piece_;                           /* private: bytes asked of the read in flight */
    int bg_;                                 /* private: the read in flight is a piece */
    int cancel_;                             /* private: shoal_io_engine_cancel asked */
};

/* A background read's piece: 2 MiB, 14 ms of a 150 MB/s disk, under a
 * millisecond of an NVMe SSD's. A multiple of 4096 (O_DIRECT). */
#define SHOAL_IO_BG_PIECE ((size_t)2 << 20)

struct shoal_io_engine;

/* Create an engine (starts its io thread or threads).
 *   params  kind and queue depth (clamped to 1..SHOAL_IO_QUEUE_DEPTH_MAX)
 * Returns the engine (owned by the caller, shoal_io_engine_destroy) or NULL
 * with err set when no thread can be started. A uring that cannot be set up
 * is not an error: the engine is a pread pool then (see
 * shoal_io_engine_fallback_reason). Thread: main. */
struct shoal_io_engine *shoal_io_engine_create(struct shoal_io_engine_params params,
                                               struct shoal_err *err);

/* Cancel reads that have not started and background reads between pieces
 * (their callbacks run with -SHOAL_ECANCELED), wait for those in flight
 * (callbacks run), then stop the io threads and free the engine. NULL is a
 * no-op. No submit may race with destroy. Thread: main. */
void shoal_io_engine_destroy(struct shoal_io_engine *e);

/* Queue one read (req borrowed until its callback returns).
 * Returns 0 (callback will run exactly once), -SHOAL_EINVAL for a request
 * without a callback, buffer or length, or -SHOAL_ECANCELED while the
 * engine is shutting down; the callback never runs then. Never blocks on
 * I/O. Thread: any. */
int shoal_io_engine_submit(struct shoal_io_engine *e, struct shoal_io_req *req,
                           struct shoal_err *err);

/* Make req, submitted and not yet completed, urgent (a demand for what a
 * background read brings): queued, it moves ahead of the background reads;
 * reading a piece, the rest of it is read at once after that piece. On a
 * request already completed it only sets req->urgent (an input the caller
 * sets again before a new submit); req's memory must stay valid. Thread:
 * any; takes the engine's lock briefly, which no callback runs under, so
 * the caller may hold the lock its callbacks take. */
void shoal_io_engine_promote(struct shoal_io_engine *e, struct shoal_io_req *req);

/* Nobody wants what req brings any more: if it has not started, or is a
 * background read between pieces, it is not read (further); its callback
 * runs once as always, on an io thread, with -SHOAL_ECANCELED unless the
 * read had already finished. Never calls back on the caller's thread, so
 * the caller may hold the lock its callbacks take. req must stay valid
 * until its callback. Thread: any. */
void shoal_io_engine_cancel(struct shoal_io_engine *e, struct shoal_io_req *req);

/* Backend in use: "pread" or "uring". Static string. Thread: any. */
const char *shoal_io_engine_name(const struct shoal_io_engine *e);

/* Why the engine is not what params.kind asked for ("liburing is not built
 * in", "io_uring_queue_init: Function not implemented"), or NULL when it
 * is. Owned by the engine. Thread: any. */
const char *shoal_io_engine_fallback_reason(const struct shoal_io_engine *e);

/* Queue depth in use (reads in flight at most). Thread: any. */
int shoal_io_engine_queue_depth(const struct shoal_io_engine *e);

/* Parse "pread", "uring" or "auto". Returns 0, or -SHOAL_EINVAL. */
int shoal_io_kind_parse(const char *s, enum shoal_io_kind *out);

#endif
