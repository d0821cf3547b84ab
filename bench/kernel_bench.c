/* kernel_bench: the quantized expert matvec of every kernel table this CPU
 * runs, on weights in RAM, next to the RAM bandwidth measured in the same
 * run (issue 4's warm-compute question without the engine around it).
 *
 *   kernel_bench [--threads N] [--pool-mb MB] [--seconds S] [--group G]
 *                [--types int4,int8,int4a8,mxfp4] [--shape N_EMBD,N_FF] [--tokens T]
 *                [--json FILE]
 *
 * A pool of --pool-mb MiB (default 1024, far beyond the last-level cache;
 * at least 64) holds expert-shaped quantized matrices: w_gate and w_up
 * [N_FF][N_EMBD] and w_down [N_EMBD][N_FF] (default 2048,768: qwen3_moe's
 * experts), group G (default 64; MXFP4: E2M1 pairs with an E8M0 exponent
 * per 32, the gpt-oss experts' format, random bytes). Each measurement is pass after pass over
 * the pool for --seconds (default 2, at least one pass), every matrix a
 * linear of T tokens (default 1: the decode matvec; more: a prefill batch)
 * split by output rows over the OpenMP threads (default: all CPUs, at most
 * that many) in one parallel region, as shoal_expert_ffn_batch runs a
 * layer's batch-union; the gate/up outputs do not feed down here, so there
 * are no barriers to measure, only the kernel and the memory system. The
 * figure is weight bytes x tokens per second.
 *
 * Memory: the pool plus the RAM probe's 3 x 512 MiB (run alone, in a child
 * process). A default run takes about 12 s here (2 vCPUs).
 *
 * Before the timing, every table's output over one whole expert is compared
 * with the scalar reference byte for byte (DESIGN contract 1); a difference
 * is an error (exit 1).
 *
 * The RAM probe (shoal bench's: read, copy, triad, best of 5) runs before
 * and after, each kernel table in its own child process, so no OpenMP pool
 * exists when a probe forks. GB = 1e9 bytes. Prints a table; --json writes
 * every figure (the file is opened before anything runs). Exit 0; 1 on a
 * bit difference, a failed probe or child, or memory that cannot be
 * allocated; 2 on bad arguments. Thread: main. */
#include <errno.h>
#include <jansson.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_probe.h"
#include "parse.h"
#include "quant.h"
#include "util.h"

struct bench {
    enum shoal_quant_type type;
    int a8;                  /* INT4A8: int4 weights, int8 activations */
    int mx;                  /* MXFP4 (type unused) */
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

/* the three MXFP4 matrices of expert e */
static void expert_mx(const struct bench *b, int64_t e, struct shoal_weight w[3])
{
    const uint8_t *base = b->pool + (size_t)e * b->expert_bytes;
    const int64_t shape[3][2] = {{b->n_ff, b->n_embd}, {b->n_ff, b->n_embd}, {b->n_embd, b->n_ff}};
    for (int k = 0; k < 3; k++) {
        const uint8_t *m = base + (size_t)k * b->m_up;
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
    if (b->mx) {
        struct shoal_weight m[3];
        expert_mx(b, e, m);
        shoal_mxfp4_linear_part(y, x, 1, &m[0], 0, 1);
        shoal_mxfp4_linear_part(y + b->n_ff, x, 1, &m[1], 0, 1);
        shoal_mxfp4_linear_part(y + 2 * b->n_ff, h, 1, &m[2], 0, 1);
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
    float *want = shoal_xmalloc(ny * sizeof(float)), *got = shoal_xmalloc(ny * sizeof(float));
    uint32_t s = 99;
    for (int64_t i = 0; i < b->n_tok * b->n_embd; i++)
        x[i] = frand(&s);
    for (int64_t i = 0; i < b->n_tok * b->n_ff; i++)
        h[i] = frand(&s);
    shoal_quant_init(SHOAL_QUANT_ISA_SCALAR, NULL);
    expert_once(b, 0, x, h, want);
    shoal_quant_init(b->isa, NULL);
    expert_once(b, 0, x, h, got);
    int same = memcmp(want, got, ny * sizeof(float)) == 0;
    json_object_set_new(o, "bits_equal_scalar", json_boolean(same));
    /* one pass to warm up and calibrate; it is the measurement when it
     * took at least half of --seconds, else enough passes for --seconds */
    int64_t passes = 1;
    double dt = 0;
    for (int round = 0; round < 2; round++) {
        const double t0 = shoal_time_s();
#pragma omp parallel
        {
            const int ith = omp_get_thread_num(), nth = omp_get_num_threads();
            float *y = shoal_xmalloc((size_t)b->n_tok * ny * sizeof(float));
            float *yu = y + b->n_tok * b->n_ff, *yd = y + 2 * b->n_tok * b->n_ff;
            void (*part)(float *, const float *, int64_t, const struct shoal_quant_weight *, int,
                         int) = b->a8 ? shoal_quant_linear_a8_part : shoal_quant_linear_part;
            for (int64_t p = 0; p < passes && b->mx; p++)
                for (int64_t e = 0; e < b->n_expert; e++) {
                    struct shoal_weight m[3];
                    expert_mx(b, e, m);
                    shoal_mxfp4_linear_part(y, x, b->n_tok, &m[0], ith, nth);
                    shoal_mxfp4_linear_part(yu, x, b->n_tok, &m[1], ith, nth);
                    shoal_mxfp4_linear_part(yd, h, b->n_tok, &m[2], ith, nth);
                }
            for (int64_t p = 0; p < passes && !b->mx; p++)
                for (int64_t e = 0; e < b->n_expert; e++) {
                    struct shoal_quant_weight w[3];
                    expert_weights(b, e, w);
                    part(y, x, b->n_tok, &w[0], ith, nth);
                    part(yu, x, b->n_tok, &w[1], ith, nth);
                    part(yd, h, b->n_tok, &w[2], ith, nth);
                }
            free(y);
        }
        dt = shoal_time_s() - t0;
        if (round == 0) {
            if (dt >= b->seconds / 2)
                break;
            const double want = b->seconds / (dt > 1e-9 ? dt : 1e-9);
            passes = want > 1e9 ? 1000000000 : (int64_t)want + 1;
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
    free(x);
    free(h);
    free(want);
    free(got);
    return same ? 0 : 1;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: kernel_bench [--threads N] [--pool-mb MB] [--seconds S] [--group G]\n"
               "                    [--types int4,int8,int4a8,mxfp4] [--shape N_EMBD,N_FF]\n"
               "                    [--tokens T]\n"
               "                    [--json FILE]\n"
               "  --threads N        OpenMP threads, 1 .. online CPUs (default: all)\n"
               "  --pool-mb MB       weights in RAM, 64 .. half the RAM (default 1024)\n"
               "  --seconds S        per kernel table, at least one pass (default 2)\n"
               "  --group G          32, 64 or 128 (default 64)\n"
               "  --types LIST       int4, int8, int4a8 (int4 weights, int8 activations),\n"
               "                     mxfp4 (E2M1 + E8M0 per 32; E and F multiples of 32),\n"
               "                     each once (default int4,int8)\n"
               "  --shape E,F        expert n_embd,n_ff, 8 .. 65536 each (default 2048,768)\n"
               "  --tokens T         tokens per linear, 1 .. 512 (default 1: decode)\n"
               "  --json FILE        every figure as JSON\n"
               "Memory: the pool + 1.5 GiB for the RAM probe.\n");
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
                                        "--types", "--shape", "--tokens", "--json"};
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
            rc = arg_int(a, v, 64, ram_mb > 256 ? ram_mb / 2 : 128, &pool_mb);
        else if (!strcmp(a, "--tokens"))
            rc = arg_int(a, v, 1, 512, &n_tok);
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
    /* int4, int8, int4a8 (int4 bytes, int8 activations), each once */
    static const char *const tnames[] = {"int4", "int8", "int4a8", "mxfp4"};
    int tlist[4];
    int n_types = 0;
    {
        char buf[64];
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
            for (int k = 0; k < n_types; k++)
                dup |= tlist[k] == q;
            if (q < 0 || dup) {
                n_types = 0;
                break;
            }
            tlist[n_types++] = q;
        }
        if (n_types == 0) {
            fprintf(stderr, "kernel_bench: --types expects int4, int8, int4a8, mxfp4, each "
                            "once, comma-separated; got '%s'\n", types);
            return 2;
        }
        for (int k = 0; k < n_types; k++)
            if (tlist[k] == 3 && (n_embd % 32 || n_ff % 32)) {
                fprintf(stderr, "kernel_bench: --types mxfp4 needs --shape E,F multiples of 32, "
                                "got %ld,%ld\n", (long)n_embd, (long)n_ff);
                return 2;
            }
    }
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
    const struct shoal_bench_ram_params rp = {.threads = (int)threads, .array_mib = 512, .reps = 5};
    json_t *ram0 = shoal_bench_ram(&rp);
    json_object_set_new(res, "ram_start", ram0);
    json_t *runs = json_array();
    int failed = 0;
    for (int it = 0; it < n_types; it++) {
        struct bench b = {.type = tlist[it] == 1 ? SHOAL_QUANT_INT8 : SHOAL_QUANT_INT4,
                          .a8 = tlist[it] == 2, .mx = tlist[it] == 3, .group = (int)group,
                          .n_embd = n_embd, .n_ff = n_ff, .seconds = seconds,
                          .threads = (int)threads};
        b.m_up = b.mx ? (size_t)(n_ff * n_embd / 2 + n_ff * n_embd / 32)
                      : shoal_quant_matrix_bytes(b.type, n_ff, n_embd, b.group);
        b.m_down = b.mx ? b.m_up : shoal_quant_matrix_bytes(b.type, n_embd, n_ff, b.group);
        b.expert_bytes = 2 * b.m_up + b.m_down;
        b.n_expert = (int64_t)((size_t)pool_mb * 1048576 / b.expert_bytes);
        b.n_tok = n_tok;
        b.pool = malloc((size_t)b.n_expert * b.expert_bytes);
        if (!b.pool) {
            fprintf(stderr, "kernel_bench: cannot allocate the %ld MiB pool\n", (long)pool_mb);
            if (json_f) {
                fclose(json_f);
                remove(json_path);
            }
            return 1;
        }
        /* one random expert, copied to every slot (only the addresses matter) */
        if (b.mx) {
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
        const enum shoal_quant_isa isas[] = {SHOAL_QUANT_ISA_SCALAR, SHOAL_QUANT_ISA_AVX2,
                                             SHOAL_QUANT_ISA_AVX512BW, SHOAL_QUANT_ISA_AVX512,
                                             SHOAL_QUANT_ISA_NEON,
                                             SHOAL_QUANT_ISA_NEON_DOTPROD,
                                             SHOAL_QUANT_ISA_NEON_I8MM};
        for (size_t k = 0; k < sizeof isas / sizeof isas[0]; k++) {
            if (shoal_quant_init(isas[k], NULL) != 0)
                continue;   /* not built in or not this CPU */
            shoal_quant_init(SHOAL_QUANT_ISA_SCALAR, NULL);
            b.isa = isas[k];
            struct shoal_err err = {0};
            json_t *r = shoal_bench_fork_json(run_table, &b, &err);
            if (!r) {
                fprintf(stderr, "kernel_bench: %s %s: %s\n", tnames[tlist[it]],
                        shoal_quant_isa_name(isas[k]), err.msg);
                failed = 1;
                continue;
            }
            json_object_set_new(r, "type", json_string(tnames[tlist[it]]));
            json_object_set_new(r, "group", json_integer(b.group));
            json_object_set_new(r, "pool_bytes",
                                json_integer((json_int_t)((size_t)b.n_expert * b.expert_bytes)));
            json_object_set_new(r, "expert_bytes", json_integer((json_int_t)b.expert_bytes));
            if (!json_is_true(json_object_get(r, "bits_equal_scalar"))) {
                fprintf(stderr, "kernel_bench: %s %s: output differs from the scalar kernels\n",
                        tnames[tlist[it]], shoal_quant_isa_name(isas[k]));
                failed = 1;
            }
            json_array_append_new(runs, r);
        }
        free(b.pool);
    }
    json_t *ram1 = shoal_bench_ram(&rp);
    json_object_set_new(res, "ram_end", ram1);
    json_object_set_new(res, "load_end", shoal_bench_loadavg());
    json_object_set_new(res, "runs", runs);
    /* the limit: the better of the two probes, so the ratio is not flattered */
    double read = 0, copy = 0, triad = 0;
    const json_t *probes[2] = {ram0, ram1};
    for (int k = 0; k < 2; k++) {
        const double r = json_real_value(json_object_get(probes[k], "read_gbs"));
        const double t = json_real_value(json_object_get(probes[k], "triad_gbs"));
        const double c = json_real_value(json_object_get(probes[k], "copy_gbs"));
        copy = c > copy ? c : copy;
        read = r > read ? r : read;
        triad = t > triad ? t : triad;
    }
    for (int k = 0; k < 2; k++)
        if (json_object_get(probes[k], "error")) {
            fprintf(stderr, "kernel_bench: RAM probe (%s) failed: %s\n", k ? "end" : "start",
                    json_string_value(json_object_get(probes[k], "error")));
            failed = 1;
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
    printf("RAM (best of start/end): read %.1f GB/s, copy %.1f GB/s, triad %.1f GB/s\n", read,
           copy, triad);
    printf("%-6s %-8s %10s %12s %12s %13s %s\n", "type", "kernels",
           n_tok > 1 ? "GB/s x tok" : "GB/s", "vs RAM read", "vs RAM copy", "vs RAM triad",
           "bits vs scalar");
    size_t i;
    json_t *r;
    json_array_foreach(runs, i, r)
    {
        const double g = json_real_value(json_object_get(r, "weight_gbs"));
        json_object_set_new(r, "vs_ram_read", json_real(read > 0 ? g / read : 0));
        json_object_set_new(r, "vs_ram_copy", json_real(copy > 0 ? g / copy : 0));
        json_object_set_new(r, "vs_ram_triad", json_real(triad > 0 ? g / triad : 0));
        printf("%-6s %-8s %10.2f %12.2f %12.2f %13.2f %s\n",
               json_string_value(json_object_get(r, "type")),
               json_string_value(json_object_get(r, "kernels")), g, read > 0 ? g / read : 0,
               copy > 0 ? g / copy : 0, triad > 0 ? g / triad : 0,
               json_is_true(json_object_get(r, "bits_equal_scalar")) ? "same" : "DIFFERENT");
    }
    if (json_f && (json_dumpf(res, json_f, JSON_INDENT(1)) != 0 || fclose(json_f) != 0)) {
        fprintf(stderr, "kernel_bench: --json: writing '%s' failed: %s\n", json_path,
                strerror(errno));
        failed = 1;
    }
    json_decref(res);
    return failed;
}
