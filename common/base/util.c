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

int shoal_read_file(const char *path, size_t max_bytes, char **out,
                    size_t *out_len, struct shoal_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        return shoal_err_set(err, -e, "cannot open '%s': %s", path, strerror(e));
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = shoal_xmalloc(cap);
    for (;;) {
        if (len + 1 >= cap) {
            cap *= 2;
            buf = shoal_xrealloc(buf, cap);
        }
        size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (len > max_bytes) {
            fclose(f);
            free(buf);
            return shoal_err_set(err, SHOAL_ERANGE,
                                 "file '%s' is larger than the %zu-byte limit",
                                 path, max_bytes);
        }
        if (got == 0) {
            if (ferror(f)) {
                int e = errno ? errno : EIO;
                fclose(f);
                free(buf);
                return shoal_err_set(err, -e, "cannot read '%s': %s", path,
                                     strerror(e));
            }
            break;
        }
    }
    fclose(f);
    buf[len] = '\0';
    *out = buf;
    if (out_len)
        *out_len = len;
    return 0;
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
