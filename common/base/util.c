#include "util.h"

#include <errno.h>
#include <inttypes.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static void oom(size_t n)
{
    fprintf(stderr, "shoal: out of memory allocating %zu bytes\n", n);
    abort();
}

void *shoal_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        oom(n);
    return p;
}

void *shoal_xcalloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p)
        oom(count * size);
    return p;
}

void *shoal_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        oom(n);
    return q;
}

char *shoal_xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = shoal_xmalloc(n);
    memcpy(p, s, n);
    return p;
}

int shoal_read_stream(FILE *f, const char *what, size_t max_bytes, char **out,
                      size_t *out_len, struct shoal_err *err)
{
    /* grown by doubling, never past one byte over the limit (so that a
     * longer input is seen) and its terminator: an endless input costs at
     * most max_bytes + 2 bytes, and memory running out is an error, not
     * an abort */
    const size_t cap_max = max_bytes < SIZE_MAX - 2 ? max_bytes + 2 : SIZE_MAX;
    size_t cap = cap_max < ((size_t)1 << 16) ? cap_max : (size_t)1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (buf && len + 1 >= cap) {
            const size_t want = cap > cap_max / 2 ? cap_max : 2 * cap;
            char *grown = realloc(buf, want);
            if (!grown)
                free(buf);
            buf = grown;
            cap = want;
        }
        if (!buf)
            return shoal_err_set(err, SHOAL_ENOMEM, "out of memory reading %s: %zu bytes "
                                 "read, %zu needed to go on", what, len, cap);
        size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (len > max_bytes) {
            free(buf);
            return shoal_err_set(err, SHOAL_ERANGE, "%s is larger than the %zu-byte limit",
                                 what, max_bytes);
        }
        if (got == 0) {
            if (ferror(f)) {
                int e = errno ? errno : EIO;
                free(buf);
                return shoal_err_set(err, -e, "cannot read %s: %s", what, strerror(e));
            }
            break;
        }
    }
    buf[len] = '\0';
    *out = buf;
    if (out_len)
        *out_len = len;
    return 0;
}

int shoal_read_file(const char *path, size_t max_bytes, char **out,
                    size_t *out_len, struct shoal_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        return shoal_err_set(err, -e, "cannot open '%s': %s", path, strerror(e));
    }
    char what[64 + 4096];
    snprintf(what, sizeof what, "file '%s'", path);
    int rc = shoal_read_stream(f, what, max_bytes, out, out_len, err);
    fclose(f);
    return rc;
}

double shoal_time_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int shoal_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, unsigned ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)(ms / 1000);
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return pthread_cond_timedwait(cv, mu, &ts);
}

char *shoal_path_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = shoal_xmalloc(a + b + 2);
    memcpy(p, dir, a);
    size_t o = a;
    if (a > 0 && dir[a - 1] != '/')
        p[o++] = '/';
    memcpy(p + o, name, b + 1);
    return p;
}

int shoal_is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int shoal_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

int shoal_pwrite_all(int fd, const void *buf, size_t n, uint64_t off,
                     const char *path, struct shoal_err *err)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            return shoal_err_set(err, -e, "cannot write '%s' at offset %" PRIu64 ": %s",
                                 path, off, strerror(e));
        }
        p += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return 0;
}
