/* util: small helpers every module uses: checked bookkeeping allocation,
 * whole-file reads, overflow-safe size arithmetic, monotonic time.
 * Thread: any.
 */
#ifndef SHOAL_UTIL_H
#define SHOAL_UTIL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "err.h"

/* Bookkeeping allocations: on failure log the byte count and abort
 * (small sizes only; budgeted buffers use fallible malloc). Thread: any. */
void *shoal_xmalloc(size_t n);
void *shoal_xcalloc(size_t count, size_t size);
void *shoal_xrealloc(void *p, size_t n);
char *shoal_xstrdup(const char *s);

/* Read a stream to its end into a NUL-terminated buffer.
 *   f     borrowed, not closed; what names it in messages ("stdin",
 *         "file 'x'"); *out owned by the caller (free()), *out_len bytes
 *         without the terminator. Refuses input over max_bytes, holding at
 *         most max_bytes + 2 bytes on the way.
 * Returns 0, -errno (read), -SHOAL_ERANGE (too long) or -SHOAL_ENOMEM,
 * with err set. Thread: any (one stream per call). */
int shoal_read_stream(FILE *f, const char *what, size_t max_bytes, char **out,
                      size_t *out_len, struct shoal_err *err);

/* Read a whole file into a NUL-terminated buffer.
 *   path  borrowed; *out owned by the caller (free()), *out_len bytes
 *         without the terminator. Refuses files over max_bytes.
 * Returns 0, -errno (open/read), -SHOAL_ERANGE or -SHOAL_ENOMEM, with err
 * set. */
int shoal_read_file(const char *path, size_t max_bytes, char **out,
                    size_t *out_len, struct shoal_err *err);

/* 1 if a*b overflows size_t, else 0 and *out = a*b. */
static inline int shoal_mul_overflow(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a)
        return 1;
    *out = a * b;
    return 0;
}

/* Write all n bytes of buf at file offset off, retrying short writes and
 * EINTR. path names the file in errors. Returns 0 or -errno with err set
 * ("cannot write '<path>' at offset <off>: <strerror>"). Thread: any. */
int shoal_pwrite_all(int fd, const void *buf, size_t n, uint64_t off,
                     const char *path, struct shoal_err *err);

/* Monotonic clock in seconds. Thread: any. */
double shoal_time_s(void);

/* Wait on cv for at most ms milliseconds (mu held, as for
 * pthread_cond_timedwait, whose result it returns). Thread: mu's holder. */
int shoal_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, unsigned ms);

/* Join dir and name into a newly allocated path (owned by the caller). */
char *shoal_path_join(const char *dir, const char *name);

/* 1 if path is an existing directory, 0 otherwise. */
int shoal_is_dir(const char *path);

/* 1 if path exists (any type), 0 otherwise. */
int shoal_exists(const char *path);

#endif
