/* kernel_l2: a ggml rows kernel alone, its weights in L2, the fastest of
 * many calls: the kernel's compute cost, steady on a shared host where
 * kernel_bench's RAM-bound figures move by 2x between rounds (a busy
 * neighbour slows some calls, never speeds one up).
 *
 *   kernel_l2 [--types q4_k,q6_k,...] [--rows R] [--cols C] [--tokens T]
 *             [--isa NAME] [--calls N]
 *
 * For each type: a [R][C] matrix of random blocks with finite f16 scales
 * (default 64 x 2048: 73 KiB of Q4_K, inside any L2), T tokens of random
 * activations (default 1: the decode matvec), one thread, the active
 * table's rows kernel through shoal_ggml_linear_part, as the engine calls
 * it (the activations quantized in each call), N times (default 20000);
 * prints the fastest call as ns per (row, block, token), the
 * weight bytes per ns (GB/s) and, for the rows of T tokens, GMAC/s; and
 * checks that call's output against the scalar table bit for bit (exit 1
 * if it differs). Not a test: a benchmark (docs/BENCHMARKS.md "GGUF
 * kernels"). int4a8 (int4a8/32, int4a8/128: its group) times shoal's own
 * INT4A8 rows the same way. Thread: main, one OpenMP thread.
 */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml_dot.h"
#include "ggml_types.h"
#include "parse.h"
#include "quant.h"
#include "tensor.h"
#include "util.h"

static uint32_t rng(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

/* random bytes, then every f16 a block starts with (and Q4_K/Q2_K's dmin,
 * Q4_1/Q5_1's m, Q6_K's trailing d) set to 2^-10 .. 2^-8 so that every scale is finite;
 * an MXFP4 block's exponent byte 2^-10 .. 2^-6 (random ones reach
 * subnormal and infinite products, which slow the f32 steps) */
static void fill_blocks(uint8_t *w, size_t bytes, enum shoal_ggml_type t, uint32_t *s)
{
    const struct shoal_ggml_type_info *ti = shoal_ggml_type_info(t);
    for (size_t i = 0; i < bytes; i++)
        w[i] = (uint8_t)rng(s);
    const size_t ts = ti->type_size;
    for (size_t b = 0; b + ts <= bytes; b += ts) {
        if (t == SHOAL_GGML_TYPE_MXFP4) {
            w[b] = (uint8_t)(118 + rng(s) % 5);
            continue;
        }
        size_t offs[2] = {0, 2};
        int n = t == SHOAL_GGML_TYPE_Q4_K || t == SHOAL_GGML_TYPE_Q5_K ||
                        t == SHOAL_GGML_TYPE_Q4_1 || t == SHOAL_GGML_TYPE_Q5_1
                    ? 2   /* d and dmin, or d and m */
                    : 1;
        if (t == SHOAL_GGML_TYPE_Q6_K)
            offs[0] = 208;
        else if (t == SHOAL_GGML_TYPE_Q2_K || t == SHOAL_GGML_TYPE_Q3_K) {
            offs[0] = t == SHOAL_GGML_TYPE_Q2_K ? 80 : 108;
            offs[1] = 82;
            n = t == SHOAL_GGML_TYPE_Q2_K ? 2 : 1;
        }
        for (int k = 0; k < n; k++) {
            const uint16_t h = shoal_f32_to_f16((float)(1 + rng(s) % 4) / 1024.0f);
            w[b + offs[k]] = (uint8_t)h;
            w[b + offs[k] + 1] = (uint8_t)(h >> 8);
        }
    }
}

/* The fastest of calls calls of fn(arg), in seconds */
static double fastest(long calls, void (*fn)(void *), void *arg)
{
    double best = 1e30;
    for (long c = 0; c < calls; c++) {
        const double t0 = shoal_time_s();
        fn(arg);
        const double dt = shoal_time_s() - t0;
        best = dt < best ? dt : best;
    }
    return best;
}

/* one timed call: the engine's INT4A8 linear, the rows kernel alone, or
 * the ggml linear */
struct call {
    float *y;
    const float *x;
    int64_t n_tok;
    const struct shoal_quant_weight *w;
    const struct shoal_quant_act *act;
    const struct shoal_ggml_matrix *m;
};

static void call_a8(void *p)
{
    const struct call *c = p;
    shoal_quant_linear_a8_part(c->y, c->x, c->n_tok, c->w, 0, 1);
}

static void call_a8_rows(void *p)
{
    const struct call *c = p;
    shoal_quant_active_ops()->linear_rows_a8(c->y, c->act, c->n_tok, c->w, 0, c->w->rows);
}

static void call_ggml(void *p)
{
    const struct call *c = p;
    shoal_ggml_linear_part(c->y, c->x, c->n_tok, c->m, 0, 1);
}

/* shoal's INT4A8 (quant.h): random nibbles, scales 2^-10 .. 2^-8, through
 * shoal_quant_linear_a8_part as the engine calls it (the activations
 * quantized in each call); ns per (row, 32 columns, token) */
static int run_int4a8(int64_t rows, int64_t cols, int group, int64_t n_tok, long calls,
                      enum shoal_quant_isa isa)
{
    const size_t rb = shoal_quant_row_bytes(SHOAL_QUANT_INT4, cols, group);
    const int64_t n_group = (cols + group - 1) / group;
    uint8_t *w = shoal_xmalloc((size_t)rows * rb);
    uint32_t s = 12345;
    for (size_t i = 0; i < (size_t)rows * rb; i++)
        w[i] = (uint8_t)rng(&s);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < n_group; g++) {
            const float d = (float)(1 + rng(&s) % 4) / 1024.0f;
            memcpy(w + (size_t)r * rb + 4 * (size_t)g, &d, sizeof d);
        }
    float *x = shoal_xmalloc((size_t)(n_tok * cols) * sizeof(float));
    for (int64_t i = 0; i < n_tok * cols; i++)
        x[i] = (float)(rng(&s) % 2001) / 1000.0f - 1.0f;
    float *y = shoal_xmalloc((size_t)(n_tok * rows) * sizeof(float));
    float *want = shoal_xmalloc((size_t)(n_tok * rows) * sizeof(float));
    const struct shoal_quant_weight m = {.type = SHOAL_QUANT_INT4, .group = group, .rows = rows,
                                         .cols = cols, .data = w};
    shoal_quant_init(SHOAL_QUANT_ISA_SCALAR, NULL);
    shoal_quant_linear_a8_part(want, x, n_tok, &m, 0, 1);
    shoal_quant_init(isa, NULL);
    struct call cl = {.y = y, .x = x, .n_tok = n_tok, .w = &m};
    const double best = fastest(calls, call_a8, &cl);
    /* the rows kernel alone: the activations quantized once, outside the
     * timed calls (as quant_a8.c lays them out) */
    const int64_t q_stride = ((cols + 127) / 128) * 128 + 64;
    uint8_t *abuf = shoal_xmalloc((size_t)n_tok * shoal_quant_act_bytes(cols, group) + 64);
    struct shoal_quant_act act = {.n = cols, .group = group, .n_group = n_group,
                                  .q_stride = q_stride};
    act.q = (int8_t *)abuf;
    act.d = (float *)(abuf + (size_t)(n_tok * q_stride));
    act.s = (int32_t *)(act.d + n_tok * n_group);
    shoal_quant_act_quantize(&act, x, n_tok);
    cl.act = &act;
    const double best_k = fastest(calls, call_a8_rows, &cl);
    free(abuf);
    const int same = memcmp(y, want, (size_t)(n_tok * rows) * sizeof(float)) == 0;
    const double units = (double)rows * (double)((cols + 31) / 32) * (double)n_tok;
    printf("%-8s %-10s %6lld x %-6lld %4lld tok  %8.2f ns/row-32cols-token  kernel alone "
           "(activations quantized once)\n",
           "int4a8", shoal_quant_isa_name(isa), (long long)rows, (long long)cols,
           (long long)n_tok, 1e9 * best_k / units);
    printf("%-8s %-10s %6lld x %-6lld %4lld tok  %8.2f ns/row-32cols-token  %7.2f GB/s  "
           "%7.2f GMAC/s  bits %s\n",
           "int4a8", shoal_quant_isa_name(isa), (long long)rows, (long long)cols,
           (long long)n_tok, 1e9 * best / units, (double)rows * (double)rb / best / 1e9,
           (double)rows * (double)cols * (double)n_tok / best / 1e9, same ? "same" : "DIFFER");
    free(w);
    free(x);
    free(y);
    free(want);
    return same ? 0 : 1;
}

static int run_type(const char *name, int64_t rows, int64_t cols, int64_t n_tok, long calls,
                    enum shoal_quant_isa isa)
{
    if (!strncmp(name, "int4a8", 6)) {   /* int4a8, int4a8/32, int4a8/128: G */
        const int g = name[6] == '/' ? atoi(name + 7) : 64;
        if (g != 32 && g != 64 && g != 128) {
            fprintf(stderr, "kernel_l2: --types %s: G is 32, 64 or 128\n", name);
            return 2;
        }
        return run_int4a8(rows, cols, g, n_tok, calls, isa);
    }
    const int t_id = shoal_ggml_type_from_name(name);
    if (t_id < 0 || !shoal_ggml_dot_supported((uint32_t)t_id)) {
        fprintf(stderr, "kernel_l2: --types: '%s' is not a ggml type with a dot product (%s)\n",
                name, shoal_ggml_dot_types());
        return 2;
    }
    const enum shoal_ggml_type t = (enum shoal_ggml_type)t_id;
    const struct shoal_ggml_type_info *ti = shoal_ggml_type_info(t);
    if (cols % ti->block_size) {
        fprintf(stderr, "kernel_l2: %s needs --cols a multiple of %d, got %lld\n", name,
                ti->block_size, (long long)cols);
        return 2;
    }
    const size_t rb = (size_t)(cols / ti->block_size) * ti->type_size;
    uint8_t *w = shoal_xmalloc((size_t)rows * rb);
    uint32_t s = 12345;
    fill_blocks(w, (size_t)rows * rb, t, &s);
    float *x = shoal_xmalloc((size_t)(n_tok * cols) * sizeof(float));
    for (int64_t i = 0; i < n_tok * cols; i++)
        x[i] = (float)(rng(&s) % 2001) / 1000.0f - 1.0f;
    float *y = shoal_xmalloc((size_t)(n_tok * rows) * sizeof(float));
    float *want = shoal_xmalloc((size_t)(n_tok * rows) * sizeof(float));
    const struct shoal_ggml_matrix m = {.type = t, .rows = rows, .cols = cols, .data = w};
    shoal_quant_init(SHOAL_QUANT_ISA_SCALAR, NULL);
    shoal_ggml_linear_part(want, x, n_tok, &m, 0, 1);
    shoal_quant_init(isa, NULL);
    struct call cl = {.y = y, .x = x, .n_tok = n_tok, .m = &m};
    const double best = fastest(calls, call_ggml, &cl);
    const int same = memcmp(y, want, (size_t)(n_tok * rows) * sizeof(float)) == 0;
    const double units = (double)rows * (double)(cols / ti->block_size) * (double)n_tok;
    printf("%-8s %-10s %6lld x %-6lld %4lld tok  %8.2f ns/row-block-token  %7.2f GB/s  "
           "%7.2f GMAC/s  bits %s\n",
           ti->name, shoal_quant_isa_name(isa), (long long)rows, (long long)cols,
           (long long)n_tok, 1e9 * best / units, (double)rows * (double)rb / best / 1e9,
           units * ti->block_size / best / 1e9, same ? "same" : "DIFFER");
    free(w);
    free(x);
    free(y);
    free(want);
    return same ? 0 : 1;
}

/* shoal_parse_i64 into an int64_t */
static int parse_i64(const char *s, long long lo, long long hi, int64_t *out)
{
    long long v;
    const int rc = shoal_parse_i64(s, lo, hi, &v);
    if (rc == 0)
        *out = (int64_t)v;
    return rc;
}

int main(int argc, char **argv)
{
    const char *types = "q4_k,q6_k,q2_k,q8_0";
    int64_t rows = 64, cols = 2048, n_tok = 1, calls = 20000;
    enum shoal_quant_isa isa = SHOAL_QUANT_ISA_AUTO;
    for (int i = 1; i < argc; i += 2) {   /* every flag takes a value */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!v) {
            rc = -1;
        } else if (!strcmp(a, "--types")) {
            types = v;
        } else if (!strcmp(a, "--rows")) {
            rc = parse_i64(v, 8, 1 << 20, &rows);
        } else if (!strcmp(a, "--cols")) {
            rc = parse_i64(v, 32, 1 << 16, &cols);
        } else if (!strcmp(a, "--tokens")) {
            rc = parse_i64(v, 1, 512, &n_tok);
        } else if (!strcmp(a, "--calls")) {
            rc = parse_i64(v, 1, 10000000, &calls);
        } else if (!strcmp(a, "--isa")) {
            rc = shoal_quant_isa_parse(v, &isa);
        } else {
            rc = -1;
        }
        if (rc) {
            fprintf(stderr, "kernel_l2: bad or missing value for '%s' (usage: kernel_l2 "
                            "[--types q4_k,q6_k,...] [--rows 8..] [--cols 32..] "
                            "[--tokens 1..512] [--isa %s] [--calls N])\n",
                    a, shoal_quant_isa_list());
            return 2;
        }
    }
    if (shoal_quant_init(isa, NULL)) {
        fprintf(stderr, "kernel_l2: --isa %s: not built or not on this CPU\n",
                shoal_quant_isa_name(isa));
        return 2;
    }
    omp_set_num_threads(1);
    char *list = shoal_xstrdup(types), *save = NULL;
    int rc = 0;
    for (char *tn = strtok_r(list, ",", &save); tn && rc != 2; tn = strtok_r(NULL, ",", &save)) {
        const int r = run_type(tn, rows, cols, n_tok, calls, isa);
        rc = r > rc ? r : rc;
    }
    free(list);
    return rc;
}
