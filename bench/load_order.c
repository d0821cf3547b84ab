/* load_order: how fast one core streams weight rows from RAM in the order
 * the decode matvec loads them, with no arithmetic (docs/BENCHMARKS_LOG.md,
 * "The kernel against a read of the same pool").
 *
 *   load_order [--pool-mb MB] [--passes N] [--rows R] [--row-bytes B]
 *              [--ahead-kib K] [--json FILE]
 *
 * A 4 KiB-aligned pool of --pool-mb MiB (default 1024; far above the
 * last-level cache, or the figures are the cache's) of rows of B bytes
 * (default 1152: one row of a [768][2048] G64 int4 matrix, its 128 bytes
 * of scales and 1024 of nibbles; 432 is one of [2048][768]) is read on the
 * calling thread in four ways, one after the other within each of N
 * passes (default 8). Every way loads 32 bytes at a time through the same
 * vector load (load32) and XORs them, so the ways differ only in order
 * and prefetch:
 *   seq         front to back over the pool's whole 64-byte lines
 *   seq+pf      the same, each line prefetched K KiB ahead (default 16)
 *   rows        R rows side by side (default 8, the AVX2 matvec's block;
 *               R = 1 is front to back through the same loop, the check
 *               that this loop costs nothing of its own): 32 bytes of row
 *               0, of row 1, ... of row R-1, then the next 32 of each,
 *               each row's last B % 32 bytes after its block
 *   rows+pf     the same with a prefetch like the matvec's: the block of R
 *               rows at least K KiB ahead, its lines spread evenly over the
 *               current block's 32-byte steps (the matvec spreads them over
 *               its group steps, and prefetches the first blocks up front)
 * The prefetches go into L2 (__builtin_prefetch locality 2: prefetcht1 on
 * x86-64, common/kernels/isa/prefetch_x86.h's choice). Prints, for each way, the
 * median GB/s over passes and the median of its per-pass ratio to seq (GB
 * = 1e9 bytes); --json writes them too. Each way's XOR must equal a plain
 * loop's over the bytes that way reads (seq: the whole lines, rows: every
 * byte): a difference is an error (exit 1). Exit 2 on bad arguments.
 * Thread: main, single-threaded. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_stats.h"
#include "parse.h"

#define N_WAY 4
static const char *const way_name[N_WAY] = {"seq", "seq+pf", "rows", "rows+pf"};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline uint64_t load64(const uint8_t *p)
{
    uint64_t u;
    memcpy(&u, p, sizeof u);
    return u;
}

/* 16 bytes as one vector (SSE2 on baseline x86-64, NEON on aarch64); 32
 * bytes are two. Every way loads through load32, so the ways differ in
 * their order and prefetches only, not in their loads. */
typedef uint64_t u64x2 __attribute__((vector_size(16)));

static inline __attribute__((always_inline)) u64x2 load16(const uint8_t *p)
{
    u64x2 v;
    memcpy(&v, p, sizeof v);
    return v;
}

#define load32(p) (load16(p) ^ load16((p) + 16))

static inline __attribute__((always_inline)) uint64_t fold(u64x2 v)
{
    return v[0] ^ v[1];
}

/* Front to back over n bytes (a multiple of 64); with pf, every line
 * prefetched `ahead` bytes before it is read (never past the end). */
static uint64_t read_seq(const uint8_t *pool, size_t n, int pf, size_t ahead)
{
    u64x2 x = {0, 0};
    if (pf) {
        size_t i = 0;
        for (; i + ahead < n; i += 64) {
            __builtin_prefetch(pool + i + ahead, 0, 2);
            x ^= load32(pool + i) ^ load32(pool + i + 32);
        }
        for (; i < n; i += 64)
            x ^= load32(pool + i) ^ load32(pool + i + 32);
    } else {
        for (size_t i = 0; i < n; i += 64)
            x ^= load32(pool + i) ^ load32(pool + i + 32);
    }
    return fold(x);
}

/* R rows of rb bytes side by side (R a compile-time constant where the
 * caller passes one), 32 bytes of each per step over the rows' first
 * rb / 32 * 32 bytes, then their last rb % 32 (a multiple of 8) row by row;
 * n_rows rows in all (a multiple of R). With pf: the block k blocks ahead
 * (k blocks of R rows >= ahead bytes), pf_step bytes of it at each step. */
static inline __attribute__((always_inline)) uint64_t
rows_impl(const uint8_t *pool, size_t rb, size_t n_rows, const size_t R, const int pf, size_t ahead)
{
    const size_t block = R * rb, k = (ahead + block - 1) / block, steps = rb / 32 ? rb / 32 : 1;
    const size_t pf_step = ((block + steps - 1) / steps + 63) & ~(size_t)63;
    const size_t whole = rb / 32 * 32;
    u64x2 x = {0, 0};
    uint64_t xt = 0;
    for (size_t r0 = 0; r0 < n_rows; r0 += R) {
        const uint8_t *b = pool + r0 * rb;
        /* the block k ahead, formed only when it lies inside the pool */
        const int have_pf = pf && r0 + (k + 1) * R <= n_rows;
        const uint8_t *pfb = have_pf ? pool + (r0 + k * R) * rb : b;
        size_t pf_at = 0;
        for (size_t o = 0; o < whole; o += 32) {
            if (have_pf) {
                const size_t e = pf_at + pf_step < block ? pf_at + pf_step : block;
                for (; pf_at < e; pf_at += 64)
                    __builtin_prefetch(pfb + pf_at, 0, 2);
            }
            for (size_t i = 0; i < R; i++)
                x ^= load32(b + i * rb + o);
        }
        for (size_t i = 0; i < R; i++)
            for (size_t o = whole; o < rb; o += 8)
                xt ^= load64(b + i * rb + o);
        for (; have_pf && pf_at < block; pf_at += 64)   /* what the steps did not cover */
            __builtin_prefetch(pfb + pf_at, 0, 2);
    }
    return fold(x) ^ xt;
}

static uint64_t read_rows(const uint8_t *pool, size_t rb, size_t n_rows, size_t R, int pf,
                          size_t ahead)
{
#define ROWS_R(R_) (pf ? rows_impl(pool, rb, n_rows, R_, 1, ahead) \
                       : rows_impl(pool, rb, n_rows, R_, 0, ahead))
    switch (R) {
    case 1: return ROWS_R(1);
    case 2: return ROWS_R(2);
    case 4: return ROWS_R(4);
    case 8: return ROWS_R(8);
    case 16: return ROWS_R(16);
    default: return ROWS_R(R);
    }
#undef ROWS_R
}

static int arg_i64(const char *flag, const char *v, long long lo, long long hi, long long *out)
{
    if (!v || shoal_parse_i64(v, lo, hi, out) != 0) {
        fprintf(stderr, "load_order: %s expects a whole number in [%lld, %lld], got '%s'\n", flag,
                lo, hi, v ? v : "(nothing)");
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    long long pool_mb = 1024, passes = 8, R = 8, rb = 1152, ahead_kib = 16;
    const char *json_path = NULL;
    /* every option but --help takes a value */
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: load_order [--pool-mb MB] [--passes N] [--rows R] [--row-bytes B]\n"
                   "                  [--ahead-kib K] [--json FILE]\n"
                   "  --pool-mb MB     16 .. 65536 (default 1024)\n"
                   "  --passes N       1 .. 1000 (default 8)\n"
                   "  --rows R         rows side by side, 1 .. 64 (default 8)\n"
                   "  --row-bytes B    64 .. 1048576, a multiple of 8 (default 1152)\n"
                   "  --ahead-kib K    prefetch distance, 1 .. 1024 KiB (default 16)\n"
                   "  --json FILE      the figures as JSON\n");
            return 0;
        } else if (!strcmp(a, "--pool-mb")) {
            rc = arg_i64(a, v, 16, 65536, &pool_mb);
        } else if (!strcmp(a, "--passes")) {
            rc = arg_i64(a, v, 1, 1000, &passes);
        } else if (!strcmp(a, "--rows")) {
            rc = arg_i64(a, v, 1, 64, &R);
        } else if (!strcmp(a, "--row-bytes")) {
            rc = arg_i64(a, v, 64, 1 << 20, &rb);
            if (rc == 0 && rb % 8) {
                fprintf(stderr, "load_order: --row-bytes expects a multiple of 8, got '%s'\n", v);
                rc = -1;
            }
        } else if (!strcmp(a, "--ahead-kib")) {
            rc = arg_i64(a, v, 1, 1024, &ahead_kib);
        } else if (!strcmp(a, "--json")) {
            if (!v || !strncmp(v, "--", 2)) {
                fprintf(stderr, "load_order: --json needs a file name, got '%s'\n",
                        v ? v : "(nothing)");
                rc = -1;
            }
            json_path = v;
        } else {
            fprintf(stderr, "load_order: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        if (rc)
            return 2;
    }
    if ((unsigned long long)pool_mb > (unsigned long long)(SIZE_MAX >> 21)) {
        fprintf(stderr, "load_order: --pool-mb %lld is more than this build can address\n",
                pool_mb);
        return 2;
    }
    /* whole blocks of R rows, and whole lines for seq */
    const size_t block = (size_t)(R * rb);
    const size_t n_rows = ((size_t)pool_mb << 20) / block * (size_t)R;
    const size_t n = n_rows * (size_t)rb / 64 * 64;
    if (n_rows == 0) {
        fprintf(stderr, "load_order: --pool-mb %lld holds no block of --rows %lld x --row-bytes "
                        "%lld\n", pool_mb, R, rb);
        return 2;
    }
    /* the output file before the measurement (a run is not wasted on a
     * path that fails); removed again if the run fails */
    FILE *jf = NULL;
    if (json_path && !(jf = fopen(json_path, "w"))) {
        fprintf(stderr, "load_order: --json: cannot write '%s': %s\n", json_path, strerror(errno));
        return 2;
    }
    /* 4 KiB aligned, as the engine's weights (container and expert store) */
    void *mem = NULL;
    if (posix_memalign(&mem, 4096, n_rows * (size_t)rb) != 0) {
        fprintf(stderr, "load_order: cannot allocate %lld MiB\n", pool_mb);
        if (jf) {
            fclose(jf);
            remove(json_path);
        }
        return 1;
    }
    uint8_t *pool = mem;
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < n_rows * (size_t)rb; i += 8) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        memcpy(pool + i, &s, 8);
    }
    /* rows reads all n_rows * rb bytes, seq the first n (whole lines): each
     * way's XOR must equal a plain loop's over the same bytes */
    uint64_t ref_seq = 0, ref_all = 0;
    for (size_t i = 0; i < n_rows * (size_t)rb; i += 8) {
        ref_all ^= load64(pool + i);
        if (i < n)
            ref_seq ^= load64(pool + i);
    }
    double *gbs = calloc((size_t)(N_WAY * passes), sizeof(double));
    double *ratio = calloc((size_t)(N_WAY * passes), sizeof(double));
    uint64_t xs[N_WAY] = {0};
    int bad = 0;
    const size_t ahead = (size_t)ahead_kib << 10;
    for (long long p = 0; p < passes && gbs && ratio; p++) {
        for (int w = 0; w < N_WAY; w++) {
            const double t0 = now_s();
            xs[w] = w < 2 ? read_seq(pool, n, w == 1, ahead)
                          : read_rows(pool, (size_t)rb, n_rows, (size_t)R, w == 3, ahead);
            const double dt = now_s() - t0;
            gbs[w * passes + p] = (double)(w < 2 ? n : n_rows * (size_t)rb) / 1e9 / dt;
        }
        for (int w = 0; w < N_WAY; w++)
            ratio[w * passes + p] = gbs[w * passes + p] / gbs[p];
        bad |= xs[0] != ref_seq || xs[1] != ref_seq || xs[2] != ref_all || xs[3] != ref_all;
    }
    if (!gbs || !ratio || bad) {
        fprintf(stderr, "load_order: %s\n", bad ? "the ways read different bytes (XOR mismatch)"
                                                : "out of memory");
        free(gbs);
        free(ratio);
        free(pool);
        if (jf) {
            fclose(jf);
            remove(json_path);
        }
        return 1;
    }
    printf("load_order: 1 thread, %zu rows of %lld bytes (%.0f MiB), %lld rows side by side, "
           "prefetch %lld KiB ahead, %lld passes\n", n_rows, rb,
           (double)(n_rows * (size_t)rb) / 1048576.0, R, ahead_kib, passes);
    printf("%-8s %10s %10s\n", "way", "GB/s", "vs seq");
    if (jf)
        fprintf(jf, "{\"rows\": %lld, \"row_bytes\": %lld, \"ahead_kib\": %lld, \"passes\": %lld, "
                    "\"ways\": {", R, rb, ahead_kib, passes);
    for (int w = 0; w < N_WAY; w++) {
        const double g = bench_median(gbs + w * passes, (size_t)passes),
                     r = bench_median(ratio + w * passes, (size_t)passes);
        printf("%-8s %10.2f %10.2f\n", way_name[w], g, r);
        if (jf)
            fprintf(jf, "%s\"%s\": {\"gbs_median\": %.4f, \"vs_seq_median\": %.4f}",
                    w ? ", " : "", way_name[w], g, r);
    }
    int rc = 0;
    int werr = 0;
    if (jf) {
        werr = fprintf(jf, "}}\n") < 0;
        werr |= fclose(jf) != 0;
    }
    if (werr) {
        fprintf(stderr, "load_order: --json: writing '%s' failed: %s\n", json_path,
                strerror(errno));
        remove(json_path);
        rc = 1;
    }
    free(gbs);
    free(ratio);
    free(pool);
    return rc;
}
