/* read_probe: what one expert read costs besides the device, for
 * bench/store_bench.py's analysis of cold read bandwidth (docs/BENCHMARKS.md).
 *
 *   read_probe FILE --bs BYTES [--offset 4096] [--reads N] [--seconds S]
 *              [--fresh | --pool N] [--hash] [--direct 0|1] [--seed X]
 *
 * One thread, one read at a time (queue depth 1), pread(2) of BYTES at a
 * random multiple of BYTES past --offset (an expert blob of a container),
 * optionally into a freshly allocated 4 KiB-aligned buffer each time
 * (--fresh: what an LRU that frees evicted blobs and allocates new ones
 * does; the kernel must fault in and zero the pages before O_DIRECT can
 * fill them), or cycling through N buffers faulted in once (--pool N: what
 * a store that recycles its blobs would do), and optionally xxh64 of the buffer after the read (--hash: the
 * store verifies every blob). Prints one JSON object:
 *   {"mb_per_s": ..., "read_ms": ..., "alloc_ms": ..., "hash_ms": ..., ...}
 * with the mean time per read spent in each step.
 * Build: cc -O2 bench/read_probe.c -lxxhash -o read_probe (store_bench.py
 * builds it). Thread: main.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    long long bs = 0, offset = 4096, reads = 1000000, seed = 1;
    double seconds = 8;
    int fresh = 0, hash = 0, direct = 1;
    long pool = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--fresh"))
            fresh = 1;
        else if (!strcmp(a, "--hash"))
            hash = 1;
        else if (i + 1 < argc && !strcmp(a, "--pool"))
            pool = atol(argv[++i]);
        else if (i + 1 < argc && !strcmp(a, "--bs"))
            bs = atoll(argv[++i]);
        else if (i + 1 < argc && !strcmp(a, "--offset"))
            offset = atoll(argv[++i]);
        else if (i + 1 < argc && !strcmp(a, "--reads"))
            reads = atoll(argv[++i]);
        else if (i + 1 < argc && !strcmp(a, "--seconds"))
            seconds = atof(argv[++i]);
        else if (i + 1 < argc && !strcmp(a, "--direct"))
            direct = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(a, "--seed"))
            seed = atoll(argv[++i]);
        else if (a[0] != '-' && !path)
            path = a;
        else {
            fprintf(stderr, "usage: read_probe FILE --bs BYTES [--offset N] [--reads N] "
                            "[--seconds S] [--fresh | --pool N] [--hash] [--direct 0|1] [--seed X]\n");
            return 2;
        }
    }
    if (!path || bs <= 0 || bs % 4096 || offset < 0 || offset % 4096 || pool < 1) {
        fprintf(stderr, "read_probe: need FILE and --bs a multiple of 4096 (offset too)\n");
        return 2;
    }
    int fd = open(path, O_RDONLY | (direct ? O_DIRECT : 0));
    if (fd < 0) {
        fprintf(stderr, "read_probe: cannot open '%s': %s\n", path, strerror(errno));
        return 1;
    }
    struct stat sb;
    fstat(fd, &sb);
    const long long n_blobs = (sb.st_size - offset) / bs;
    if (n_blobs < 1) {
        fprintf(stderr, "read_probe: '%s' holds no %lld-byte blob past %lld\n", path, bs, offset);
        return 1;
    }
    void **bufs = calloc((size_t)pool, sizeof *bufs);
    if (!bufs)
        return 1;
    for (long k = 0; k < pool && !fresh; k++) {
        if (posix_memalign(&bufs[k], 4096, (size_t)bs) != 0) {
            fprintf(stderr, "read_probe: cannot allocate %ld buffers\n", pool);
            return 1;
        }
        memset(bufs[k], 0, (size_t)bs);   /* fault the pages in once */
    }
    double t_alloc = 0, t_read = 0, t_hash = 0, t0 = now();
    long long done = 0;
    uint64_t sink = 0, state = (uint64_t)seed;
    while (done < reads && now() - t0 < seconds) {
        double a = now();
        void *b = bufs[done % pool];
        if (fresh && posix_memalign(&b, 4096, (size_t)bs) != 0)
            return 1;
        double r = now();
        long long ix = (long long)(mix64(state++) % (uint64_t)n_blobs);
        size_t got = 0;
        while (got < (size_t)bs) {
            ssize_t k = pread(fd, (char *)b + got, (size_t)bs - got,
                              (off_t)(offset + ix * bs + (long long)got));
            if (k <= 0) {
                fprintf(stderr, "read_probe: read failed: %s\n", k ? strerror(errno) : "EOF");
                return 1;
            }
            got += (size_t)k;
        }
        double h = now();
        if (hash)
            sink ^= XXH64(b, (size_t)bs, 0);
        double e = now();
        if (fresh)
            free(b);
        t_alloc += r - a;
        t_read += h - r;
        t_hash += e - h;
        done++;
    }
    double wall = now() - t0;
    printf("{\"bs\": %lld, \"reads\": %lld, \"fresh\": %d, \"pool\": %ld, \"hash\": %d, "
           "\"direct\": %d, \"mb_per_s\": %.1f, \"alloc_ms\": %.3f, \"read_ms\": %.3f, "
           "\"hash_ms\": %.3f, \"read_only_mb_per_s\": %.1f, \"sink\": %llu}\n", bs, done, fresh,
           fresh ? 0 : pool, hash, direct,
           (double)done * (double)bs / 1e6 / wall, 1e3 * t_alloc / (double)done,
           1e3 * t_read / (double)done, 1e3 * t_hash / (double)done,
           (double)done * (double)bs / 1e6 / t_read, (unsigned long long)(sink & 1));
    for (long k = 0; k < pool; k++)
        free(bufs[k]);
    free(bufs);
    close(fd);
    return 0;
}
