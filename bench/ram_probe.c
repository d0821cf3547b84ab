/* ram_probe: a STREAM-like RAM bandwidth probe for bench/store_bench.py.
 *
 *   ram_probe [--mb N] [--reps R] [--threads T]
 *
 * Three arrays of N MiB (default 512, far beyond any cache), OpenMP over a
 * static split (each thread first-touches its own part). Kernels, with the
 * bytes counted the way STREAM counts them:
 *   read   s ^= bits(a[i])         8 bytes per element (what a matvec does
 *                                  with its weights: stream them once;
 *                                  an integer XOR, so it vectorizes)
 *   copy   c[i] = a[i]             16 bytes
 *   triad  a[i] = b[i] + q * c[i]  24 bytes
 * Each is run R times (default 10); the best time is reported, as STREAM
 * does. Prints one JSON object on stdout:
 *   {"threads": T, "array_mib": N, "read_gbs": ..., "copy_gbs": ..., "triad_gbs": ...}
 * GB = 1e9 bytes. Build: cc -O2 -fopenmp -Icommon/base bench/ram_probe.c
 * common/base/memread.c common/base/pages.c -o ram_probe
 * (store_bench.py builds it). Thread: main, OpenMP inside.
 */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "memread.h"
#include "pages.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    long mb = 512, reps = 10, threads = 0;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && !strcmp(argv[i], "--mb"))
            mb = atol(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--reps"))
            reps = atol(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--threads"))
            threads = atol(argv[++i]);
        else {
            fprintf(stderr, "usage: ram_probe [--mb N] [--reps R] [--threads T]\n");
            return 2;
        }
    }
    if (mb < 1 || reps < 1 || threads < 0) {
        fprintf(stderr, "ram_probe: --mb, --reps must be >= 1, --threads >= 0\n");
        return 2;
    }
    if (threads > 0)
        omp_set_num_threads((int)threads);
    const size_t n = (size_t)mb * (1u << 20) / sizeof(double);
    /* on huge pages where the kernel offers them, as shoal bench's probe
     * and the expert buffers are (pages.h) */
    const size_t bytes = n * sizeof(double);
    double *a = shoal_pages_map(bytes), *b = shoal_pages_map(bytes), *c = shoal_pages_map(bytes);
    if (!a || !b || !c) {
        fprintf(stderr, "ram_probe: cannot allocate 3 x %ld MiB\n", mb);
        return 1;
    }
    int nth = 1;
#pragma omp parallel
    {
#pragma omp single
        nth = omp_get_num_threads();
#pragma omp for schedule(static)
        for (size_t i = 0; i < n; i++) {
            a[i] = 1.0;
            b[i] = 2.0;
            c[i] = 0.5;
        }
    }
    double best[3] = {1e30, 1e30, 1e30};
    double sink = 0;
    for (long r = 0; r < reps; r++) {
        double t0 = now();
        uint64_t s = 0;
        /* the widest loads with independent accumulators (memread.h) */
#pragma omp parallel reduction(^ : s)
        {
            const size_t nt = (size_t)omp_get_num_threads(), it = (size_t)omp_get_thread_num();
            const size_t lo = n * it / nt, hi = n * (it + 1) / nt;
            s ^= shoal_mem_read_xor(a + lo, (hi - lo) * sizeof *a);
        }
        double t1 = now();
        sink += (double)(s & 1);
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++)
            c[i] = a[i];
        double t2 = now();
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++)
            a[i] = b[i] + 3.0 * c[i];
        double t3 = now();
        double t[3] = {t1 - t0, t2 - t1, t3 - t2};
        for (int k = 0; k < 3; k++)
            if (t[k] < best[k])
                best[k] = t[k];
    }
    const double fb = (double)bytes;
    printf("{\"threads\": %d, \"array_mib\": %ld, \"reps\": %ld, \"read_gbs\": %.3f, "
           "\"copy_gbs\": %.3f, \"triad_gbs\": %.3f, \"checksum\": %.6g}\n", nth, mb, reps,
           fb / best[0] / 1e9, 2 * fb / best[1] / 1e9, 3 * fb / best[2] / 1e9,
           sink / (double)reps);
    shoal_pages_unmap(a, bytes);
    shoal_pages_unmap(b, bytes);
    shoal_pages_unmap(c, bytes);
    return 0;
}
