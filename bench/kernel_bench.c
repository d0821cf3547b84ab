/* kernel_bench: the quantized expert matvec of every kernel table this CPU
 * runs, on weights in RAM, next to the RAM bandwidth measured in the same
 * run (issue 4's warm-compute question without the engine around it).
 *
 *   kernel_bench [--threads N] [--pool-mb MB] [--seconds S] [--group G]
 *                [--types int4,int8,int4a8,mxfp4] [--shape N_EMBD,N_FF] [--tokens T]
 *                [--isa LIST] [--rounds R] [--paired-read on|off] [--json FILE]
 *
 * A pool of --pool-mb MiB (default 1024, far beyond the last-level cache;
 * at least 1: a pool inside the cache gives the compute ceiling) holds expert-shaped quantized matrices: w_gate and w_up
 * [N_FF][N_EMBD] and w_down [N_EMBD][N_FF] (default 2048,768: qwen3_moe's
 * experts), group G (default 64; MXFP4: E2M1 pairs with an E8M0 exponent
 * per 32, the gpt-oss experts' format, random bytes; or a ggml type as a
 * GGUF file ships it, by name, e.g. q4_k or iq2_xxs (ggml's MXFP4 in
 * capitals: lower-case mxfp4 is shoal's own): random codes with
 * f16 scales 2^-10 .. 2^-8, through ggml_dot.h's kernels; both dimensions
 * multiples of its block size). Each measurement is pass after pass over
 * the pool for --seconds (default 2, at least one pass; at most 10^6), every matrix a
 * linear of T tokens (default 1: the decode matvec; more: a prefill batch)
 * on the OpenMP threads (default: all CPUs, at most that many) in one
 * parallel region, as shoal_expert_ffn_batch runs a layer's batch-union:
 * at one token each thread takes whole experts one at a time (during the
 * down projection the INT4A8 kernels prefetch the first rows of the first
 * expert not yet taken: shoal_quant_prefetch_next), at more every
 * matrix's output rows are split over the threads. The gate/up outputs do
 * not feed down here, so there are no barriers to measure, only the kernel
 * and the memory system. The
 * figure is weight bytes x tokens per second, over all passes; "best pass"
 * is the fastest single pass (a barrier between passes), the statistic the
 * RAM probe reports (its best of 5 reps), so "best pass/read" compares like
 * with like on a host whose bandwidth swings.
 *
 * Paired read (--paired-read on, the default): before every kernel pass the
 * same threads read the whole pool once with the RAM probe's read loop
 * (x ^= bits of every 8 bytes, each thread a contiguous share), timed
 * between barriers. "paired read" is the median over passes of the
 * kernel pass's rate over the read just before it: the RAM bandwidth of
 * that moment, on the same bytes, pages and threads, where the probes run
 * seconds away in another process on a host whose bandwidth swings 2-3x
 * within minutes. The reads take time besides --seconds (up to about as
 * long again); the kernel figures count only the kernel passes. The read
 * is handed out in 1 MiB chunks the threads claim, as the kernel's experts
 * are.
 *
 * Memory: the pool plus the RAM probe's 3 x 512 MiB (run alone, in a child
 * process). A default run takes about 20 s here (2 vCPUs).
 *
 * Before the timing, every table's output over one whole expert is compared
 * with the scalar reference byte for byte (DESIGN contract 1); a difference
 * is an error (exit 1).
 *
 * The RAM probe (shoal bench's: read, copy, triad, best of 5) runs before
 * and after, each kernel table in its own child process, so no OpenMP pool
 * exists when a probe forks. --rounds R (default 1) repeats the tables R
 * times with a probe between rounds: each table's rate in a round is set
 * against the better of the probes on either side of it (the same
 * bandwidth the machine gave at that moment, on a host whose neighbours
 * come and go), and the table prints the median over rounds of the rate
 * and of that ratio, with the ratio's range. --isa LIST (names as `shoal
 * run --isa` spells them) times only those tables; each is still checked
 * against the scalar bits. GB = 1e9 bytes. Prints a table; --json writes
 * every figure (the file is opened before anything runs). Exit 0; 1 on a
 * bit difference, a failed probe or child, or memory that cannot be
 * allocated; 2 on bad arguments. Thread: main. */
#include <errno.h>
#include <jansson.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_stats.h"
#include "bench_probe.h"
#include "ggml_dot.h"
#include "ggml_types.h"
#include "kernels.h"
#include "memread.h"
#include "pages.h"
#include "parse.h"
#include "quant.h"
#include "tensor.h"
#include "util.h"

struct bench {
    enum shoal_quant_type type;
    int a8;                  /* INT4A8: int4 weights, int8 activations */
    int mx;                  /* MXFP4 (type unused) */
    int ggml;                /* a ggml type id (ggml_dot.h), -1 for none (type unused) */
    int sw;                  /* mx or ggml: runs through shoal_linear_part */
    enum shoal_quant_isa isa;
    int group;
    int64_t n_embd, n_ff;
    size_t m_up, m_down;     /* bytes of one gate (= up) and one down matrix */
    size_t expert_bytes;     /* 2 m_up + m_down */
    int64_t n_expert;        /* experts in the pool */
    int64_t n_tok;           /* tokens per linear (1: decode matvec) */
    uint8_t *pool;
    double seconds;
    int threads;
    int paired;              /* a read of the whole pool before every pass */
};

/* xorshift32 in [-1, 1) */
static float frand(uint32_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return (float)((double)*s / 4294967296.0 * 2.0 - 1.0);
}

/* Quantize one random [rows][cols] matrix into dst row by row (no OpenMP:
 * the parent must stay single-threaded for the probes' fork). */
static int fill_matrix(uint8_t *dst, enum shoal_quant_type type, int group, int64_t rows,
                       int64_t cols, uint32_t seed)
{
    float *row = shoal_xmalloc((size_t)cols * sizeof(float));
    const size_t rb = shoal_quant_row_bytes(type, cols, group);
    uint32_t s = seed * 2654435761u + 1u;
    int rc = 0;
    for (int64_t r = 0; r < rows && rc == 0; r++) {
        for (int64_t c = 0; c < cols; c++)
            row[c] = frand(&s) * (float)(1 + (c % 7));
        rc = shoal_quant_quantize_row(type, group, dst + (size_t)r * rb, row,
                                      SHOAL_DTYPE_F32, cols, NULL);
    }
    free(row);
    return rc;
}

/* One random MXFP4 [rows][cols] matrix: pairs, then exponents 2^-7..2^-2. */
static void fill_mx(uint8_t *dst, int64_t rows, int64_t cols, uint32_t seed)
{
    const size_t nq = (size_t)(rows * cols / 2), ne = (size_t)(rows * cols / 32);
    uint32_t s = seed * 2654435761u + 1u;
    for (size_t i = 0; i < nq; i++)
        dst[i] = (uint8_t)((frand(&s) + 1.0f) * 127.9f);
    for (size_t i = 0; i < ne; i++)
        dst[nq + i] = (uint8_t)(123.0f + 3.0f * frand(&s));
}

/* an f16 of the bits h at p (little-endian) */
static void put_h16(uint8_t *p, uint16_t h)
{
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* One random [rows][cols] matrix of ggml type id (ggml_dot.h's layouts):
 * random code and sub-scale bytes (every pattern is a valid block), each
 * block's f16 scales d, dmin in 2^-10 .. 2^-8 (an MXFP4 exponent 2^-10 ..
 * 2^-6), as a shipped file's are: no NaN, no subnormal to slow the f32
 * steps. */
static void fill_ggml(uint8_t *dst, int id, int64_t rows, int64_t cols, uint32_t seed)
{
    const struct shoal_ggml_type_info *ti = shoal_ggml_type_info((uint32_t)id);
    const size_t nb = (size_t)(rows * (cols / ti->block_size));
    uint32_t s = seed * 2654435761u + 1u;
    for (size_t i = 0; i < nb * ti->type_size; i++)
        dst[i] = (uint8_t)((frand(&s) + 1.0f) * 127.9f);
    for (size_t k = 0; k < nb; k++) {
        uint8_t *blk = dst + k * ti->type_size;
        /* f16 exponent field 5..7 (2^-10 .. 2^-8), random mantissa */
        const uint16_t d = (uint16_t)((5 + (s % 3)) << 10 | (s >> 8 & 0x3FF));
        frand(&s);
        switch (id) {
        case SHOAL_GGML_TYPE_Q6_K: put_h16(blk + 208, d); break;
        case SHOAL_GGML_TYPE_Q2_K: put_h16(blk + 80, d); put_h16(blk + 82, d); break;
        case SHOAL_GGML_TYPE_Q3_K: put_h16(blk + 108, d); break;
        case SHOAL_GGML_TYPE_Q4_K: case SHOAL_GGML_TYPE_Q5_K:
        case SHOAL_GGML_TYPE_Q4_1: case SHOAL_GGML_TYPE_Q5_1:
            put_h16(blk, d);
            put_h16(blk + 2, d);
            break;
        case SHOAL_GGML_TYPE_IQ1_M:   /* d: the top nibbles of the 4 u16 scales */
            for (int i = 0; i < 4; i++)
                blk[49 + 2 * i] = (uint8_t)((blk[49 + 2 * i] & 0x0F) | ((d >> (4 * i)) & 0x0F) << 4);
            break;
        case SHOAL_GGML_TYPE_MXFP4: blk[0] = (uint8_t)(118 + s % 5); break;
        default: put_h16(blk, d); break;   /* d at 0: Q8_0, Q4_0, Q5_0, IQ types */
        }
    }
}

/* The three matrices of expert e as shoal_weight views (MXFP4 or ggml) */
static void expert_sw(const struct bench *b, int64_t e, struct shoal_weight w[3])
{
    const uint8_t *base = b->pool + (size_t)e * b->expert_bytes;
    const int64_t shape[3][2] = {{b->n_ff, b->n_embd}, {b->n_ff, b->n_embd}, {b->n_embd, b->n_ff}};
    for (int k = 0; k < 3; k++) {
        const uint8_t *m = base + (size_t)k * b->m_up;
        if (b->ggml >= 0)
            w[k] = (struct shoal_weight){.dtype = SHOAL_DTYPE_GGML, .rows = shape[k][0],
                                         .cols = shape[k][1], .data = m,
                                         .ggml_type = (uint32_t)b->ggml};
        else
            w[k] = (struct shoal_weight){.dtype = SHOAL_DTYPE_MXFP4, .rows = shape[k][0],
                                         .cols = shape[k][1], .group = 32, .data = m,
                                         .e8m0 = m + (size_t)(shape[k][0] * shape[k][1] / 2)};
    }
}

/* the three matrices of expert e */
static void expert_weights(const struct bench *b, int64_t e, struct shoal_quant_weight w[3])
{
    const uint8_t *base = b->pool + (size_t)e * b->expert_bytes;
    w[0] = (struct shoal_quant_weight){b->type, b->group, b->n_ff, b->n_embd, base};
    w[1] = (struct shoal_quant_weight){b->type, b->group, b->n_ff, b->n_embd, base + b->m_up};
    w[2] = (struct shoal_quant_weight){b->type, b->group, b->n_embd, b->n_ff,
                                       base + 2 * b->m_up};
}

/* y = one expert's three matvecs with the active table (y: 2 n_ff + n_embd) */
static void expert_once(const struct bench *b, int64_t e, const float *x, const float *h, float *y)
{
    if (b->sw) {
        struct shoal_weight m[3];
        expert_sw(b, e, m);
        shoal_linear_part(y, x, b->n_tok, &m[0], 0, 1, NULL);
        shoal_linear_part(y + b->n_tok * b->n_ff, x, b->n_tok, &m[1], 0, 1, NULL);
        shoal_linear_part(y + 2 * b->n_tok * b->n_ff, h, b->n_tok, &m[2], 0, 1, NULL);
        return;
    }
    struct shoal_quant_weight w[3];
    expert_weights(b, e, w);
    int (*lin)(float *, const float *, int64_t, const struct shoal_quant_weight *) =
        b->a8 ? shoal_quant_linear_a8 : shoal_quant_linear;
    lin(y, x, 1, &w[0]);
    lin(y + b->n_ff, x, 1, &w[1]);
    lin(y + 2 * b->n_ff, h, 1, &w[2]);
}

#define READ_CHUNK ((size_t)1 << 20)   /* bytes a thread claims at a time */

/* The RAM probe's read kernel (shoal_mem_read_xor, memread.h: bench_probe.c's
 * read) over the pool's first `bytes` (a multiple
 * of 8), in READ_CHUNK pieces each thread claims from *next (starting at
 * 0) until none is left: the paired read of --paired-read (see run_table),
 * balanced across threads as the kernel's claimed experts are, so a thread
 * the host stalls slows both alike. Returns this thread's XOR, kept so the
 * loads are not dropped. Thread: any, every thread of the team. */
static uint64_t read_chunks(const uint8_t *pool, size_t bytes, _Atomic int64_t *next)
{
    uint64_t x = 0;
    for (size_t c = (size_t)atomic_fetch_add(next, 1); c * READ_CHUNK < bytes;
         c = (size_t)atomic_fetch_add(next, 1)) {
        const size_t lo = c * READ_CHUNK / 8,
                     hi = (bytes - c * READ_CHUNK < READ_CHUNK ? bytes : (c + 1) * READ_CHUNK) / 8;
        x ^= shoal_mem_read_xor(pool + 8 * lo, 8 * (hi - lo));
    }
    return x;
}

/* The start of kernel pass p on every thread of the team: this thread's
 * arrival at the pass's barrier into ev[2p], then (--paired-read) its
 * share of the paired read, its arrival at the next barrier into ev[2p+1].
 * ev: this thread's row of run_table's arrival times; next: pass p's read
 * counter (starting at 0). Returns this thread's read XOR (0 without the
 * read). Thread: every thread of the team, in step (it holds barriers). */
static uint64_t pass_start(const struct bench *b, double *ev, int64_t p, _Atomic int64_t *next)
{
    uint64_t x = 0;
    ev[2 * p] = shoal_time_s();
#pragma omp barrier
    if (b->paired) {
        x = read_chunks(b->pool, (size_t)b->n_expert * b->expert_bytes / 8 * 8, next);
        ev[2 * p + 1] = shoal_time_s();
#pragma omp barrier
    }
    return x;
}

/* Child: check this table's bits against scalar on expert 0, then time
 * passes over the pool. */
static int run_table(void *user, json_t **out)
{
    const struct bench *b = user;
    json_t *o = json_object();
    *out = o;
    if (b->threads > 0)
        omp_set_num_threads(b->threads);
    float *x = shoal_xmalloc((size_t)(b->n_tok * b->n_embd) * sizeof(float));
    float *h = shoal_xmalloc((size_t)(b->n_tok * b->n_ff) * sizeof(float));
    const size_t ny = (size_t)(2 * b->n_ff + b->n_embd);
    /* the check: one token for shoal's own types, every token for the
     * shoal_linear_part ones (the ggml GEMM paths) */
    const size_t ny_check = (size_t)b->n_tok * ny;
    float *want = shoal_xcalloc(ny_check, sizeof(float)), *got = shoal_xcalloc(ny_check, sizeof(float));
    uint32_t s = 99;
    for (int64_t i = 0; i < b->n_tok * b->n_embd; i++)
        x[i] = frand(&s);
    for (int64_t i = 0; i < b->n_tok * b->n_ff; i++)
        h[i] = frand(&s);
    shoal_quant_init(SHOAL_QUANT_ISA_SCALAR, NULL);
    expert_once(b, 0, x, h, want);
    shoal_quant_init(b->isa, NULL);
    expert_once(b, 0, x, h, got);
    int same = memcmp(want, got, ny_check * sizeof(float)) == 0;
    json_object_set_new(o, "bits_equal_scalar", json_boolean(same));
    /* one pass to warm up and calibrate; it is the measurement when it
     * took at least half of --seconds, else enough passes for --seconds */
    int64_t passes = 1;
    double dt = 0, best_pass = 0;
    /* per kernel pass: its rate over the read just before it, and that read */
    double *ratio = NULL, *read_gbs = NULL;
    const size_t pool_bytes = (size_t)b->n_expert * b->expert_bytes;
    uint64_t xor_all = 0;
    for (int round = 0; round < 2; round++) {
        /* kernel pass p ran from pt[p] to rs[p + 1], its paired read from
         * rs[p] to pt[p] (a barrier at every boundary: the best pass is
         * timed as the probe's best rep is). Each is the time the last
         * thread reached that barrier (arr[thread][event]: event 2p before
         * read p, 2p + 1 after it, 2 passes at the end), never one thread's
         * clock after a barrier: a thread the host holds there would start
         * the clock late while the others claim the work. */
        const size_t n_ev = 2 * (size_t)passes + 1, max_th = (size_t)omp_get_max_threads();
        double *arr = shoal_xcalloc(max_th * n_ev, sizeof(double));
        double *pt = shoal_xmalloc((size_t)(passes + 1) * sizeof(double));
        double *rs = shoal_xmalloc((size_t)(passes + 1) * sizeof(double));
        /* whole experts per thread: pass p's next expert not yet taken */
        _Atomic int64_t *claim = shoal_xcalloc((size_t)passes, sizeof *claim);
        _Atomic int64_t *rclaim = shoal_xcalloc((size_t)passes, sizeof *rclaim);
#pragma omp parallel
        {
            const int ith = omp_get_thread_num(), nth = omp_get_num_threads();
            uint64_t xr = 0;
            float *y = shoal_xmalloc((size_t)b->n_tok * ny * sizeof(float));
            float *yu = y + b->n_tok * b->n_ff, *yd = y + 2 * b->n_tok * b->n_ff;
            void (*part)(float *, const float *, int64_t, const struct shoal_quant_weight *, int,
                         int) = b->a8 ? shoal_quant_linear_a8_part : shoal_quant_linear_part;
            /* decode (one token) as shoal_expert_ffn_batch runs it: each
             * thread takes whole experts, and prefetches the gate rows of
             * the first one not yet taken during its down projection; a
             * batch: every matrix's rows split over the threads */
            const int whole = b->n_tok == 1 && nth > 1;
            for (int64_t p = 0; p < passes && !b->sw && whole; p++) {
                xr ^= pass_start(b, arr + (size_t)ith * n_ev, p, &rclaim[p]);
                for (int64_t e = atomic_fetch_add(&claim[p], 1); e < b->n_expert;
                     e = atomic_fetch_add(&claim[p], 1)) {
                    struct shoal_quant_weight w[3], wn[3];
                    expert_weights(b, e, w);
                    if (b->a8)
                        shoal_quant_prefetch_next(&w[1], 0, 1);
                    part(y, x, 1, &w[0], 0, 1);
                    if (b->a8)
                        shoal_quant_prefetch_next(&w[2], 0, 1);
                    part(yu, x, 1, &w[1], 0, 1);
                    const int64_t e_next = atomic_load(&claim[p]);
                    if (b->a8 && e_next < b->n_expert) {
                        expert_weights(b, e_next, wn);
                        shoal_quant_prefetch_next(&wn[0], 0, 1);
                    }
                    part(yd, h, 1, &w[2], 0, 1);
                }
            }
            for (int64_t p = 0; p < passes && b->sw && whole; p++) {
                xr ^= pass_start(b, arr + (size_t)ith * n_ev, p, &rclaim[p]);
                for (int64_t e = atomic_fetch_add(&claim[p], 1); e < b->n_expert;
                     e = atomic_fetch_add(&claim[p], 1)) {
                    struct shoal_weight m[3];
                    expert_sw(b, e, m);
                    shoal_linear_part(y, x, 1, &m[0], 0, 1, NULL);
                    shoal_linear_part(yu, x, 1, &m[1], 0, 1, NULL);
                    shoal_linear_part(yd, h, 1, &m[2], 0, 1, NULL);
                }
            }
            for (int64_t p = 0; p < passes && b->sw && !whole; p++) {
                xr ^= pass_start(b, arr + (size_t)ith * n_ev, p, &rclaim[p]);
                for (int64_t e = 0; e < b->n_expert; e++) {
                    struct shoal_weight m[3];
                    expert_sw(b, e, m);
                    shoal_linear_part(y, x, b->n_tok, &m[0], ith, nth, NULL);
                    shoal_linear_part(yu, x, b->n_tok, &m[1], ith, nth, NULL);
                    shoal_linear_part(yd, h, b->n_tok, &m[2], ith, nth, NULL);
                }
            }
            for (int64_t p = 0; p < passes && !b->sw && !whole; p++) {
                xr ^= pass_start(b, arr + (size_t)ith * n_ev, p, &rclaim[p]);
                for (int64_t e = 0; e < b->n_expert; e++) {
                    struct shoal_quant_weight w[3];
                    expert_weights(b, e, w);
                    struct shoal_quant_weight wn[3];
                    expert_weights(b, e + 1 < b->n_expert ? e + 1 : 0, wn);
                    if (b->a8)
                        shoal_quant_prefetch_next(&w[1], ith, nth);
                    part(y, x, b->n_tok, &w[0], ith, nth);
                    if (b->a8)
                        shoal_quant_prefetch_next(&w[2], ith, nth);
                    part(yu, x, b->n_tok, &w[1], ith, nth);
                    if (b->a8)
                        shoal_quant_prefetch_next(&wn[0], ith, nth);
                    part(yd, h, b->n_tok, &w[2], ith, nth);
                }
            }
            arr[(size_t)ith * n_ev + 2 * (size_t)passes] = shoal_time_s();
#pragma omp barrier
#pragma omp atomic
            xor_all ^= xr;
            free(y);
        }
        free(claim);
        free(rclaim);
        for (int64_t p = 0; p <= passes; p++) {
            rs[p] = pt[p] = 0;
            for (size_t t = 0; t < max_th; t++) {
                const double *a = arr + t * n_ev;
                rs[p] = a[2 * p] > rs[p] ? a[2 * p] : rs[p];
                if (p < passes)
                    pt[p] = a[2 * p + 1] > pt[p] ? a[2 * p + 1] : pt[p];
            }
            if (p < passes && !b->paired)
                pt[p] = rs[p];
        }
        free(arr);
        /* kernel pass p: pt[p] .. rs[p + 1]; its paired read: rs[p] .. pt[p] */
        dt = 0;
        best_pass = 0;
        free(ratio);
        free(read_gbs);
        ratio = shoal_xmalloc((size_t)passes * sizeof(double));
        read_gbs = shoal_xmalloc((size_t)passes * sizeof(double));
        for (int64_t p = 0; p < passes; p++) {
            const double tk = rs[p + 1] - pt[p], tr = pt[p] - rs[p];
            dt += tk;
            if (best_pass == 0 || tk < best_pass)
                best_pass = tk;
            ratio[p] = tk > 0 ? (double)b->n_tok * tr / tk : 0;
            read_gbs[p] = tr > 0 ? (double)pool_bytes / tr / 1e9 : 0;
        }
        free(pt);
        free(rs);
        if (round == 0) {
            if (dt >= b->seconds / 2)
                break;
            const double want = b->seconds / (dt > 1e-9 ? dt : 1e-9);
            passes = want > 1e6 ? 1000000 : (int64_t)want + 1;
        }
    }
    const double bytes = (double)passes * (double)b->n_expert * (double)b->expert_bytes *
                         (double)b->n_tok;
    json_object_set_new(o, "kernels", json_string(shoal_quant_ops_name()));
    json_object_set_new(o, "threads", json_integer(omp_get_max_threads()));
    json_object_set_new(o, "passes", json_integer(passes));
    json_object_set_new(o, "tokens", json_integer(b->n_tok));
    json_object_set_new(o, "seconds", json_real(dt));
    json_object_set_new(o, "weight_gbs", json_real(bytes / 1e9 / dt));
    json_object_set_new(o, "best_pass_gbs",
                        json_real((double)b->n_expert * (double)b->expert_bytes * (double)b->n_tok /
                                  1e9 / (best_pass > 0 ? best_pass : dt)));
    if (b->paired) {
        json_object_set_new(o, "paired_read_gbs_median", json_real(bench_median(read_gbs, (size_t)passes)));
        json_object_set_new(o, "vs_paired_read_median", json_real(bench_median(ratio, (size_t)passes)));
        json_object_set_new(o, "read_xor", json_integer((json_int_t)(xor_all & 0xffff)));
    }
    free(ratio);
    free(read_gbs);
    free(x);
    free(h);
    free(want);
    free(got);
    return same ? 0 : 1;
}

/* The smallest key of every probe (0 when none measured). */
static double probe_min(const json_t *probes, const char *key)
{
    double lo = 0;
    size_t i;
    const json_t *p;
    json_array_foreach(probes, i, p)
    {
        const double v = json_real_value(json_object_get(p, key));
        if (v > 0 && (lo == 0 || v < lo))
            lo = v;
    }
    return lo;
}

/* The better key of probes p0 and p0 + 1: the bandwidth beside one round. */
static double probe_best(const json_t *probes, size_t p0, const char *key)
{
    const double a = json_real_value(json_object_get(json_array_get(probes, p0), key));
    const double b = json_real_value(json_object_get(json_array_get(probes, p0 + 1), key));
    return a > b ? a : b;
}

/* One line per (type, table) over its rounds: median rate and ratios, the
 * read ratio's range; the same under res "summary". */
static void print_medians(const json_t *runs, json_t *res)
{
    json_t *summary = json_array();
    const size_t n = json_array_size(runs);
    double *g = shoal_xmalloc((n ? n : 1) * sizeof(double)), *vr = shoal_xmalloc((n ? n : 1) * sizeof(double));
    double *vc = shoal_xmalloc((n ? n : 1) * sizeof(double)), *vt = shoal_xmalloc((n ? n : 1) * sizeof(double));
    double *vb = shoal_xmalloc((n ? n : 1) * sizeof(double));
    double *vp = shoal_xmalloc((n ? n : 1) * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        const json_t *ri = json_array_get(runs, i);
        const char *type = json_string_value(json_object_get(ri, "type"));
        const char *kern = json_string_value(json_object_get(ri, "kernels"));
        int seen = 0;
        for (size_t j = 0; j < i && !seen; j++) {
            const json_t *rj = json_array_get(runs, j);
            seen = !strcmp(type, json_string_value(json_object_get(rj, "type"))) &&
                   !strcmp(kern, json_string_value(json_object_get(rj, "kernels")));
        }
        if (seen)
            continue;
        size_t m = 0;
        int same = 1, has_vp = 1;
        double vp_lo = 0, vp_hi = 0;
        double lo = 0, hi = 0;
        for (size_t j = i; j < n; j++) {
            const json_t *rj = json_array_get(runs, j);
            if (strcmp(type, json_string_value(json_object_get(rj, "type"))) ||
                strcmp(kern, json_string_value(json_object_get(rj, "kernels"))))
                continue;
            g[m] = json_real_value(json_object_get(rj, "weight_gbs"));
            vr[m] = json_real_value(json_object_get(rj, "vs_ram_read"));
            vc[m] = json_real_value(json_object_get(rj, "vs_ram_copy"));
            vt[m] = json_real_value(json_object_get(rj, "vs_ram_triad"));
            vb[m] = json_real_value(json_object_get(rj, "best_pass_vs_ram_read"));
            vp[m] = json_real_value(json_object_get(rj, "vs_paired_read_median"));
            has_vp &= json_object_get(rj, "vs_paired_read_median") != NULL;
            vp_lo = m == 0 || vp[m] < vp_lo ? vp[m] : vp_lo;
            vp_hi = m == 0 || vp[m] > vp_hi ? vp[m] : vp_hi;
            same &= json_is_true(json_object_get(rj, "bits_equal_scalar"));
            lo = m == 0 || vr[m] < lo ? vr[m] : lo;
            hi = m == 0 || vr[m] > hi ? vr[m] : hi;
            m++;
        }
        const double mg = bench_median(g, m), mr = bench_median(vr, m), mc = bench_median(vc, m),
                     mt = bench_median(vt, m), mb = bench_median(vb, m), mp = bench_median(vp, m);
        char range[32], pr_s[32] = "-";
        snprintf(range, sizeof range, "%.2f-%.2f", lo, hi);
        if (has_vp)
            snprintf(pr_s, sizeof pr_s, "%.2f", mp);
        printf("%-8s %-8s %10.2f %12.2f %15s %12.2f %13.2f %15.2f %12s %s\n", type, kern, mg, mr,
               range, mc, mt, mb, pr_s, same ? "same" : "DIFFERENT");
        json_t *o = json_object();
        json_object_set_new(o, "type", json_string(type));
        json_object_set_new(o, "kernels", json_string(kern));
        json_object_set_new(o, "rounds", json_integer((json_int_t)m));
        json_object_set_new(o, "weight_gbs_median", json_real(mg));
        json_object_set_new(o, "vs_ram_read_median", json_real(mr));
        json_object_set_new(o, "vs_ram_read_min", json_real(lo));
        json_object_set_new(o, "vs_ram_read_max", json_real(hi));
        json_object_set_new(o, "vs_ram_copy_median", json_real(mc));
        json_object_set_new(o, "vs_ram_triad_median", json_real(mt));
        json_object_set_new(o, "best_pass_vs_ram_read_median", json_real(mb));
        if (has_vp) {
            json_object_set_new(o, "vs_paired_read_median", json_real(mp));
            json_object_set_new(o, "vs_paired_read_min", json_real(vp_lo));
            json_object_set_new(o, "vs_paired_read_max", json_real(vp_hi));
        }
        json_array_append_new(summary, o);
    }
    free(g);
    free(vr);
    free(vc);
    free(vt);
    free(vb);
    free(vp);
    json_object_set_new(res, "summary", summary);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: kernel_bench [--threads N] [--pool-mb MB] [--seconds S] [--group G]\n"
               "                    [--types int4,int8,int4a8,mxfp4] [--shape N_EMBD,N_FF]\n"
               "                    [--tokens T] [--isa LIST] [--rounds R] [--paired-read on|off]\n"
               "                    [--huge on|off] [--json FILE]\n"
               "  --threads N        OpenMP threads, 1 .. online CPUs (default: all)\n"
               "  --pool-mb MB       weights in RAM, 1 .. half the RAM (default 1024); below the\n"
               "                     last-level cache it gives the kernel's compute ceiling\n"
               "  --seconds S        per kernel table, at least one pass (default 2)\n"
               "  --group G          32, 64 or 128 (default 64)\n"
               "  --types LIST       int4, int8, int4a8 (int4 weights, int8 activations),\n"
               "                     mxfp4 (E2M1 + E8M0 per 32; E and F multiples of 32),\n"
               "                     or ggml types by name (q4_k, iq2_xxs, ...; E and F\n"
               "                     multiples of the block size; ggml's MXFP4 in capitals,\n"
               "                     mxfp4 being shoal's own),\n"
               "                     each once (default int4,int8)\n"
               "  --shape E,F        expert n_embd,n_ff, 8 .. 65536 each (default 2048,768)\n"
               "  --tokens T         tokens per linear, 1 .. 512 (default 1: decode)\n"
               "  --isa LIST         kernel tables to time, comma-separated, e.g. avx2,avx512\n"
               "                     (default: every table this CPU runs, scalar first)\n"
               "  --rounds R         1 .. 50 rounds of every table, a RAM probe between\n"
               "                     rounds; figures are medians over rounds (default 1)\n"
               "  --paired-read V    on or off: read the whole pool with the RAM probe's read\n"
               "                     loop before every kernel pass, on the same threads, and\n"
               "                     set each pass against the read just before it (default on)\n"
               "  --huge V           on or off: the pool on huge pages where the kernel offers\n"
               "                     them, as the expert store's buffers and the RAM probe's\n"
               "                     arrays are (default on); off: malloc's pages\n"
               "  --json FILE        every figure as JSON\n"
               "Memory: the pool + 1.5 GiB for the RAM probe.\n");
}

/* the --types name of entry q of main's list (tnames or a ggml type) */
static const char *type_name(const char *const tnames[4], int q)
{
    return q < 4 ? tnames[q] : shoal_ggml_type_name((uint32_t)(q - 4));
}

static int arg_int(const char *flag, const char *v, long long lo, long long hi, int64_t *out)
{
    long long n;
    if (shoal_parse_i64(v, lo, hi, &n) != 0) {
        fprintf(stderr, "kernel_bench: %s expects a whole number in [%lld, %lld], got '%s'\n",
                flag, lo, hi, v);
        return -1;
    }
    *out = n;
    return 0;
}

static int is_flag(const char *a)
{
    static const char *const flags[] = {"--threads", "--pool-mb", "--seconds", "--group",
                                        "--types", "--shape", "--tokens", "--json",
                                        "--isa", "--rounds", "--paired-read", "--huge"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!strcmp(a, flags[i]))
            return 1;
    return 0;
}

int main(int argc, char **argv)
{
    const long n_cpu = sysconf(_SC_NPROCESSORS_ONLN) > 0 ? sysconf(_SC_NPROCESSORS_ONLN) : 1;
    const long long ram_mb = (long long)sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE) / 1048576;
    int64_t threads = 0, pool_mb = 1024, group = 64, n_embd = 2048, n_ff = 768, n_tok = 1;
    int64_t rounds = 1;
    int paired = 1, huge = 1;
    const char *isa_arg = NULL;
    double seconds = 2.0;
    const char *types = "int4,int8", *json_path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!is_flag(a)) {
            fprintf(stderr, "kernel_bench: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (!v) {
            fprintf(stderr, "kernel_bench: %s needs a value\n", a);
            return 2;
        }
        i++;
        int rc = 0;
        if (!strcmp(a, "--threads"))
            rc = arg_int(a, v, 1, n_cpu, &threads);
        else if (!strcmp(a, "--pool-mb"))
            rc = arg_int(a, v, 1, ram_mb > 256 ? ram_mb / 2 : 128, &pool_mb);
        else if (!strcmp(a, "--tokens"))
            rc = arg_int(a, v, 1, 512, &n_tok);
        else if (!strcmp(a, "--rounds"))
            rc = arg_int(a, v, 1, 50, &rounds);
        else if (!strcmp(a, "--isa"))
            isa_arg = v;
        else if (!strcmp(a, "--huge")) {
            huge = !strcmp(v, "on");
            if (!huge && strcmp(v, "off")) {
                fprintf(stderr, "kernel_bench: --huge expects on or off, got '%s'\n", v);
                rc = -1;
            }
        } else if (!strcmp(a, "--paired-read")) {
            paired = !strcmp(v, "on");
            if (!paired && strcmp(v, "off")) {
                fprintf(stderr, "kernel_bench: --paired-read expects on or off, got '%s'\n", v);
                rc = -1;
            }
        }
        else if (!strcmp(a, "--group")) {
            long long g;
            if (shoal_parse_i64(v, 32, 128, &g) != 0 || !shoal_quant_group_ok((int)g)) {
                fprintf(stderr, "kernel_bench: --group expects 32, 64 or 128, got '%s'\n", v);
                rc = -1;
            } else {
                group = g;
            }
        } else if (!strcmp(a, "--seconds")) {
            char *end = NULL;
            seconds = strtod(v, &end);
            if (!end || end == v || *end || !(seconds > 0 && seconds <= 3600)) {
                fprintf(stderr, "kernel_bench: --seconds expects a number in (0, 3600], got '%s'\n", v);
                rc = -1;
            }
        } else if (!strcmp(a, "--types"))
            types = v;
        else if (!strcmp(a, "--shape")) {
            /* two integers split at the comma, each through the shared
             * parser (no white space, no sign games, no trailing bytes) */
            long long e = 0, f = 0;
            char buf[64];
            snprintf(buf, sizeof buf, "%s", v);
            char *comma = strchr(buf, ',');
            if (comma)
                *comma = '\0';
            if (!comma || strlen(v) >= sizeof buf ||
                shoal_parse_i64(buf, 8, 65536, &e) != 0 ||
                shoal_parse_i64(comma + 1, 8, 65536, &f) != 0) {
                fprintf(stderr, "kernel_bench: --shape expects N_EMBD,N_FF (8 .. 65536 each), "
                                "got '%s'\n", v);
                rc = -1;
            }
            n_embd = (long)e;
            n_ff = (long)f;
        } else {
            json_path = v;
        }
        if (rc < 0)
            return 2;
    }
    /* int4, int8, int4a8 (int4 bytes, int8 activations), mxfp4, and ggml
     * types by name (TYPE_GGML + the id), each once */
    static const char *const tnames[] = {"int4", "int8", "int4a8", "mxfp4"};
    enum { TYPE_GGML = 4, MAX_TYPES = 24 };
    int tlist[MAX_TYPES];
    int n_types = 0;
    {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", types);
        /* strtok_r would skip empty entries: refuse them first */
        const size_t tl = strlen(types);
        const int empty = tl == 0 || tl >= sizeof buf || types[0] == ',' ||
                          types[tl - 1] == ',' || strstr(types, ",,") != NULL;
        for (char *save = NULL, *t = empty ? NULL : strtok_r(buf, ",", &save); t;
             t = strtok_r(NULL, ",", &save)) {
            int q = -1, dup = 0;
            for (int k = 0; k < 4; k++)
                if (!strcmp(t, tnames[k]))
                    q = k;
            const int gid = shoal_ggml_type_from_name(t);
            if (q < 0 && gid >= 0 && shoal_ggml_dot_supported((uint32_t)gid))
                q = TYPE_GGML + gid;
            for (int k = 0; k < n_types; k++)
                dup |= tlist[k] == q;
            if (q < 0 || dup || n_types == MAX_TYPES) {
                n_types = 0;
                break;
            }
            tlist[n_types++] = q;
        }
        if (n_types == 0) {
            fprintf(stderr, "kernel_bench: --types expects int4, int8, int4a8, mxfp4 or ggml "
                            "types (%s), each once, comma-separated, at most %d; got '%s'\n",
                    shoal_ggml_dot_types(), MAX_TYPES, types);
            return 2;
        }
        for (int k = 0; k < n_types; k++) {
            const long bs = tlist[k] == 3 ? 32
                          : tlist[k] >= TYPE_GGML ? (long)shoal_ggml_act_block((uint32_t)(tlist[k] - TYPE_GGML))
                                                  : 1;
            if (n_embd % bs || n_ff % bs) {
                fprintf(stderr, "kernel_bench: --types %s needs --shape E,F multiples of %ld, "
                                "got %ld,%ld\n", type_name(tnames, tlist[k]), bs, (long)n_embd,
                        (long)n_ff);
                return 2;
            }
        }
    }
    /* the tables: every one this CPU runs, or --isa's (each once, runnable) */
    const enum shoal_quant_isa all_isas[] = {SHOAL_QUANT_ISA_SCALAR, SHOAL_QUANT_ISA_AVX2,
                                             SHOAL_QUANT_ISA_AVX512BW, SHOAL_QUANT_ISA_AVX512,
                                             SHOAL_QUANT_ISA_NEON,
                                             SHOAL_QUANT_ISA_NEON_DOTPROD,
                                             SHOAL_QUANT_ISA_NEON_I8MM};
    enum shoal_quant_isa isas[sizeof all_isas / sizeof all_isas[0]];
    int n_isa = 0;
    if (!isa_arg) {
        for (size_t k = 0; k < sizeof all_isas / sizeof all_isas[0]; k++)
            if (shoal_quant_init(all_isas[k], NULL) == 0)   /* built in and this CPU */
                isas[n_isa++] = all_isas[k];
    } else {
        char buf[128];
        const size_t il = strlen(isa_arg);
        int bad = il == 0 || il >= sizeof buf || isa_arg[0] == ',' || isa_arg[il - 1] == ',' ||
                  strstr(isa_arg, ",,") != NULL;
        snprintf(buf, sizeof buf, "%s", isa_arg);
        for (char *save = NULL, *t = bad ? NULL : strtok_r(buf, ",", &save); t && !bad;
             t = strtok_r(NULL, ",", &save)) {
            enum shoal_quant_isa q;
            if (shoal_quant_isa_parse(t, &q) != 0 || q == SHOAL_QUANT_ISA_AUTO) {
                fprintf(stderr, "kernel_bench: --isa: unknown table '%s'; expected a list of "
                                "%s other than auto\n", t, shoal_quant_isa_list());
                return 2;
            }
            if (shoal_quant_init(q, NULL) != 0) {
                fprintf(stderr, "kernel_bench: --isa: this CPU (or build) cannot run '%s'\n", t);
                return 2;
            }
            for (int k = 0; k < n_isa; k++)
                bad |= isas[k] == q;
            if (n_isa < (int)(sizeof isas / sizeof isas[0]))
                isas[n_isa++] = q;
        }
        if (bad) {
            fprintf(stderr, "kernel_bench: --isa expects table names, each once, "
                            "comma-separated; got '%s'\n", isa_arg);
            return 2;
        }
    }
    shoal_quant_init(SHOAL_QUANT_ISA_SCALAR, NULL);
    /* the output file first: a run is not wasted on a path that fails */
    FILE *json_f = NULL;
    if (json_path) {
        json_f = fopen(json_path, "w");
        if (!json_f) {
            fprintf(stderr, "kernel_bench: --json: cannot write '%s': %s\n", json_path,
                    strerror(errno));
            return 2;
        }
    }
    const size_t one_expert = 2 * shoal_quant_matrix_bytes(SHOAL_QUANT_INT8, n_ff, n_embd, (int)group) +
                              shoal_quant_matrix_bytes(SHOAL_QUANT_INT8, n_embd, n_ff, (int)group);
    if (one_expert > (size_t)pool_mb * 1048576) {
        fprintf(stderr, "kernel_bench: --pool-mb %ld holds no expert of --shape %ld,%ld (%.1f MiB "
                        "at int8); expected a pool of at least that\n", (long)pool_mb, (long)n_embd,
                (long)n_ff, (double)one_expert / 1048576.0);
        return 2;
    }
    json_t *res = json_object();
    json_object_set_new(res, "machine", shoal_bench_machine("."));
    json_object_set_new(res, "load_start", shoal_bench_loadavg());
    json_object_set_new(res, "rounds", json_integer(rounds));
    json_object_set_new(res, "huge_pages", json_boolean(huge));
    const struct shoal_bench_ram_params rp = {.threads = (int)threads, .array_mib = 512, .reps = 5};
    /* probes[k]: the one before round k of all types' rounds (the last: the end) */
    json_t *probes = json_array();
    json_t *ram0 = shoal_bench_ram(&rp);
    json_array_append_new(probes, ram0);
    json_t *runs = json_array();
    int failed = 0;
    for (int it = 0; it < n_types; it++) {
        const char *tname = type_name(tnames, tlist[it]);
        struct bench b = {.type = tlist[it] == 1 ? SHOAL_QUANT_INT8 : SHOAL_QUANT_INT4,
                          .a8 = tlist[it] == 2, .mx = tlist[it] == 3,
                          .ggml = tlist[it] >= TYPE_GGML ? tlist[it] - TYPE_GGML : -1,
                          .group = (int)group, .n_embd = n_embd, .n_ff = n_ff,
                          .seconds = seconds, .threads = (int)threads, .paired = paired};
        b.sw = b.mx || b.ggml >= 0;
        if (b.ggml >= 0) {
            const struct shoal_ggml_type_info *gi = shoal_ggml_type_info((uint32_t)b.ggml);
            b.m_up = (size_t)(n_ff * n_embd / gi->block_size) * gi->type_size;
        } else {
            b.m_up = b.mx ? (size_t)(n_ff * n_embd / 2 + n_ff * n_embd / 32)
                          : shoal_quant_matrix_bytes(b.type, n_ff, n_embd, b.group);
        }
        b.m_down = b.sw ? b.m_up : shoal_quant_matrix_bytes(b.type, n_embd, n_ff, b.group);
        b.expert_bytes = 2 * b.m_up + b.m_down;
        b.n_expert = (int64_t)((size_t)pool_mb * 1048576 / b.expert_bytes);
        if (b.n_expert < 1) {   /* a type wider than int8 (f16, f32) */
            fprintf(stderr, "kernel_bench: --pool-mb %ld holds no %s expert of --shape %ld,%ld "
                            "(%.1f MiB); expected a pool of at least that\n", (long)pool_mb,
                    tname, (long)n_embd, (long)n_ff, (double)b.expert_bytes / 1048576.0);
            json_decref(res);
            if (json_f) {
                fclose(json_f);
                remove(json_path);
            }
            return 2;
        }
        b.n_tok = n_tok;
        const size_t pool_bytes = (size_t)b.n_expert * b.expert_bytes;
        b.pool = huge ? shoal_pages_map(pool_bytes) : malloc(pool_bytes);
        if (!b.pool) {
            fprintf(stderr, "kernel_bench: cannot allocate the %ld MiB pool\n", (long)pool_mb);
            if (json_f) {
                fclose(json_f);
                remove(json_path);
            }
            return 1;
        }
        /* one random expert, copied to every slot (only the addresses matter) */
        if (b.ggml >= 0) {
            fill_ggml(b.pool, b.ggml, n_ff, n_embd, 1);
            fill_ggml(b.pool + b.m_up, b.ggml, n_ff, n_embd, 2);
            fill_ggml(b.pool + 2 * b.m_up, b.ggml, n_embd, n_ff, 3);
        } else if (b.mx) {
            fill_mx(b.pool, n_ff, n_embd, 1);
            fill_mx(b.pool + b.m_up, n_ff, n_embd, 2);
            fill_mx(b.pool + 2 * b.m_up, n_embd, n_ff, 3);
        } else if (fill_matrix(b.pool, b.type, b.group, n_ff, n_embd, 1) ||
            fill_matrix(b.pool + b.m_up, b.type, b.group, n_ff, n_embd, 2) ||
            fill_matrix(b.pool + 2 * b.m_up, b.type, b.group, n_embd, n_ff, 3)) {
            fprintf(stderr, "kernel_bench: quantizing the test expert failed\n");
            return 1;
        }
        for (int64_t e = 1; e < b.n_expert; e++)
            memcpy(b.pool + (size_t)e * b.expert_bytes, b.pool, b.expert_bytes);
        for (int64_t round = 0; round < rounds; round++) {
            if (round > 0 || it > 0)
                json_array_append_new(probes, shoal_bench_ram(&rp));
            for (int k = 0; k < n_isa; k++) {
                b.isa = isas[k];
                struct shoal_err err = {0};
                json_t *r = shoal_bench_fork_json(run_table, &b, &err);
                if (!r) {
                    fprintf(stderr, "kernel_bench: %s %s: %s\n", tname,
                            shoal_quant_isa_name(isas[k]), err.msg);
                    failed = 1;
                    continue;
                }
                json_object_set_new(r, "type", json_string(tname));
                json_object_set_new(r, "group", json_integer(b.group));
                json_object_set_new(r, "round", json_integer(round));
                json_object_set_new(r, "probe_before",
                                    json_integer((json_int_t)json_array_size(probes) - 1));
                json_object_set_new(r, "pool_bytes", json_integer((json_int_t)((size_t)b.n_expert *
                                                                               b.expert_bytes)));
                json_object_set_new(r, "expert_bytes", json_integer((json_int_t)b.expert_bytes));
                if (!json_is_true(json_object_get(r, "bits_equal_scalar"))) {
                    fprintf(stderr, "kernel_bench: %s %s: output differs from the scalar "
                                    "kernels\n", tname,
                            shoal_quant_isa_name(isas[k]));
                    failed = 1;
                }
                json_array_append_new(runs, r);
            }
        }
        if (huge)
            shoal_pages_unmap(b.pool, pool_bytes);
        else
            free(b.pool);
    }
    json_t *ram1 = shoal_bench_ram(&rp);
    json_array_append_new(probes, ram1);
    json_object_set_new(res, "ram_start", json_incref(ram0));
    json_object_set_new(res, "ram_end", json_incref(ram1));
    json_object_set_new(res, "ram_probes", probes);
    json_object_set_new(res, "load_end", shoal_bench_loadavg());
    json_object_set_new(res, "runs", runs);
    /* the limit: the better of the probes, so the ratio is not flattered;
     * over the whole run for the header, around each round for the ratios */
    double read = 0, copy = 0, triad = 0;
    size_t pi;
    json_t *pr;
    json_array_foreach(probes, pi, pr)
    {
        if (json_object_get(pr, "error")) {
            fprintf(stderr, "kernel_bench: RAM probe %zu failed: %s\n", pi,
                    json_string_value(json_object_get(pr, "error")));
            failed = 1;
        }
        const double r = json_real_value(json_object_get(pr, "read_gbs"));
        const double t = json_real_value(json_object_get(pr, "triad_gbs"));
        const double c = json_real_value(json_object_get(pr, "copy_gbs"));
        copy = c > copy ? c : copy;
        read = r > read ? r : read;
        triad = t > triad ? t : triad;
    }
    json_object_set_new(res, "ram_read_gbs", json_real(read));
    json_object_set_new(res, "ram_copy_gbs", json_real(copy));
    json_object_set_new(res, "ram_triad_gbs", json_real(triad));
    const json_t *m = json_object_get(res, "machine");
    const char *cpu = json_string_value(json_object_get(m, "cpu"));
    printf("kernel_bench: %s, %d threads; experts [%ld][%ld] x2 + [%ld][%ld], G=%ld, pool %ld MiB, "
           "%ld token%s per linear\n",
           cpu ? cpu : "?", threads ? (int)threads : omp_get_max_threads(), (long)n_ff,
           (long)n_embd, (long)n_embd, (long)n_ff, (long)group, (long)pool_mb, (long)n_tok,
           n_tok > 1 ? "s" : "");
    if (rounds == 1) {
        printf("RAM (best probe; each table against the better probe beside it): read %.1f "
               "GB/s, copy %.1f GB/s, triad %.1f GB/s\n", read, copy, triad);
        printf("%-8s %-8s %10s %12s %12s %13s %15s %12s %s\n", "type", "kernels",
               n_tok > 1 ? "GB/s x tok" : "GB/s", "vs RAM read", "vs RAM copy", "vs RAM triad",
               "best pass/read", "paired read", "bits vs scalar");
    } else {
        printf("RAM read, %zu probes: %.1f .. %.1f GB/s; each round's rate against the better "
               "probe beside it; medians over %ld rounds\n", json_array_size(probes),
               probe_min(probes, "read_gbs"), read, (long)rounds);
        printf("%-8s %-8s %10s %12s %15s %12s %13s %15s %12s %s\n", "type", "kernels",
               n_tok > 1 ? "GB/s x tok" : "GB/s", "vs RAM read", "(range)", "vs RAM copy",
               "vs RAM triad", "best pass/read", "paired read", "bits vs scalar");
    }
    size_t i;
    json_t *r;
    json_array_foreach(runs, i, r)
    {
        /* this round's probes: the one before it and the next one */
        const size_t p0 = (size_t)json_integer_value(json_object_get(r, "probe_before"));
        const double g = json_real_value(json_object_get(r, "weight_gbs"));
        const double rr = probe_best(probes, p0, "read_gbs"), rc = probe_best(probes, p0, "copy_gbs"),
                     rt = probe_best(probes, p0, "triad_gbs");
        json_object_set_new(r, "vs_ram_read", json_real(rr > 0 ? g / rr : 0));
        json_object_set_new(r, "vs_ram_copy", json_real(rc > 0 ? g / rc : 0));
        json_object_set_new(r, "vs_ram_triad", json_real(rt > 0 ? g / rt : 0));
        const double gb = json_real_value(json_object_get(r, "best_pass_gbs"));
        json_object_set_new(r, "best_pass_vs_ram_read", json_real(rr > 0 ? gb / rr : 0));
        char pr_s[32] = "-";
        const json_t *vp = json_object_get(r, "vs_paired_read_median");
        if (vp)
            snprintf(pr_s, sizeof pr_s, "%.2f", json_real_value(vp));
        if (rounds == 1)
            printf("%-8s %-8s %10.2f %12.2f %12.2f %13.2f %15.2f %12s %s\n",
                   json_string_value(json_object_get(r, "type")),
                   json_string_value(json_object_get(r, "kernels")), g, rr > 0 ? g / rr : 0,
                   rc > 0 ? g / rc : 0, rt > 0 ? g / rt : 0, rr > 0 ? gb / rr : 0, pr_s,
                   json_is_true(json_object_get(r, "bits_equal_scalar")) ? "same" : "DIFFERENT");
    }
    if (rounds > 1)
        print_medians(runs, res);
    if (json_f && (json_dumpf(res, json_f, JSON_INDENT(1)) != 0 || fclose(json_f) != 0)) {
        fprintf(stderr, "kernel_bench: --json: writing '%s' failed: %s\n", json_path,
                strerror(errno));
        failed = 1;
    }
    json_decref(res);
    return failed;
}
