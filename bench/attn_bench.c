/* attn_bench: attention over a long KV cache, f32 vs f16 vs bf16, one
 * decode token or a batch (issue 13: "attention reads half the bytes; long
 * contexts measured"; "attention over a batch of queries").
 *
 *   attn_bench [--ctx 4096,16384,32768] [--layers N] [--heads H,HKV,HD]
 *              [--kv f32,f16,bf16] [--threads N] [--seconds S] [--isa auto|scalar]
 *              [--tokens N] [--layout batched|heads] [--tile-bytes B]
 *
 * The attention of --tokens new tokens (default 1: a decode step) at the
 * end of a context of --ctx tokens, per layer, without the projections,
 * RoPE and the rest of the layer. --layout batched (default) runs
 * shoal_kv_attend as forward.c does: the query heads of a KV head and a
 * round of tokens together over tiles of cached rows, each K / V row read
 * once per round. --layout heads runs the loop forward.c ran before it: each
 * (token, query head) on its own (shoal_kv_scores, softmax, shoal_kv_mix),
 * the items split evenly over the threads, so each query head reads its KV
 * head's rows itself. Both give the same bits. --layers caches (default 12)
 * are visited in turn, so the cache is read from RAM as in a model (at 4 K
 * tokens, 12 layers of f32 K+V for 4 KV heads of 128 are 192 MiB). Shapes
 * default to 32,4,128 (qwen3_moe 30B-A3B's attention). --isa scalar uses
 * the reference kernels. --tile-bytes B: tiles of B bytes of a KV head's
 * rows (shoal_kv_set_tile_bytes; default 8192, printed).
 *
 * Prints, per context and dtype, the time of the tokens' attention over all
 * layers (ms: the fastest and the median of the timed steps; on a shared
 * machine the fastest is the better estimate), the KV bytes of the context
 * and their rate at the fastest step (GB/s = 1e9 bytes), and the median CPU
 * time of a step summed over the threads (cpu ms: what the work costs when
 * other processes share the cores; run with OMP_WAIT_POLICY=passive so
 * that waiting threads do not spin). Exit 0; 1 if
 * memory cannot be allocated; 2 on bad arguments. Thread: main. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv.h"
#include "parse.h"
#include "util.h"

static int cmp_d(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* the attention of n tokens (positions L-n .. L-1) over layer caches k, v
 * [L][nkv] of dtype t, --layout heads: one (token, query head) at a time,
 * the loop forward.c ran before shoal_kv_attend (every query head reads its
 * KV head's rows itself) */
static void attend_heads(float *att, const float *q, const void *k, const void *v, int64_t L,
                         int64_t n, int64_t nh, int64_t nkv_h, int64_t hd, enum shoal_dtype t,
                         float *scores)
{
    const int64_t nkv = nkv_h * hd, n_rep = nh / nkv_h;
    const size_t es = shoal_dtype_size(t);
    const float sq = sqrtf((float)hd);
#pragma omp parallel
    {
        const int nth = omp_get_num_threads(), ith = omp_get_thread_num();
        float *sc = scores + (int64_t)ith * L;
        const int64_t per = n * nh / nth, rem = n * nh % nth;
        const int64_t i0 = ith * per + (ith < rem ? ith : rem), i1 = i0 + per + (ith < rem);
        for (int64_t it = i0; it < i1; it++) {
            const int64_t h = it % nh, tok = it / nh, rows = L - n + tok + 1;
            const size_t first = (size_t)((h / n_rep) * hd) * es;
            shoal_kv_scores(sc, q + it * hd, (const char *)k + first, nkv, rows, hd, t);
            float mx = -INFINITY, sum = 0.0f;
            for (int64_t j = 0; j < rows; j++) {
                sc[j] /= sq;
                mx = sc[j] > mx ? sc[j] : mx;
            }
            for (int64_t j = 0; j < rows; j++) {
                sc[j] = expf(sc[j] - mx);
                sum += sc[j];
            }
            for (int64_t j = 0; j < rows; j++)
                sc[j] /= sum;
            shoal_kv_mix(att + it * hd, sc, (const char *)v + first, nkv, rows, hd, t);
        }
    }
}

/* the same with --layout batched: shoal_kv_attend, as forward.c runs it */
static void attend_batched(float *att, const float *q, const void *k, const void *v,
                           int64_t L, int64_t n, int64_t nh, int64_t nkv_h, int64_t hd,
                           enum shoal_dtype t, float *scores, int64_t round)
{
    const struct shoal_kv_attn a = {.out = att, .q = q, .k = k, .v = v, .scores = scores,
                                    .scores_ld = L, .round = round, .n = n, .n_past = L - n,
                                    .n_head = nh, .n_head_kv = nkv_h, .head_dim = hd, .t = t};
#pragma omp parallel
    shoal_kv_attend(&a, omp_get_thread_num(), omp_get_num_threads());
}

/* CPU seconds of the process, all threads (robust to sharing the cores:
 * with OMP_WAIT_POLICY=passive idle threads do not spin) */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int parse_list(const char *s, int64_t *out, int max)
{
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ","); tok && n < max; tok = strtok(NULL, ",")) {
        long long v;
        if (shoal_parse_i64(tok, 1, (long long)1 << 40, &v))
            return -1;
        out[n++] = v;
    }
    return n;
}

int main(int argc, char **argv)
{
    int64_t ctxs[8] = {4096, 16384, 32768}, shape[3] = {32, 4, 128}, n_layer = 12, n_tok = 1;
    int64_t tile = 0;
    int n_ctx = 3, n_kv = 3, threads = 0, heads = 0;
    double seconds = 2.0;
    enum shoal_kv_isa isa = SHOAL_KV_ISA_AUTO;
    enum shoal_dtype kvs[3] = {SHOAL_DTYPE_F32, SHOAL_DTYPE_F16, SHOAL_DTYPE_BF16};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t one;
        if (!v) {
            fprintf(stderr, "attn_bench: %s needs a value (see the header of bench/attn_bench.c)\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--ctx") && (n_ctx = parse_list(v, ctxs, 8)) > 0)
            continue;
        if (!strcmp(a, "--heads") && parse_list(v, shape, 3) == 3 && shape[0] % shape[1] == 0)
            continue;
        if (!strcmp(a, "--layers") && parse_list(v, &n_layer, 1) == 1)
            continue;
        if (!strcmp(a, "--tokens") && parse_list(v, &n_tok, 1) == 1)
            continue;
        if (!strcmp(a, "--tile-bytes") && parse_list(v, &tile, 1) == 1 && tile >= 512)
            continue;
        if (!strcmp(a, "--layout") && (!strcmp(v, "heads") || !strcmp(v, "batched"))) {
            heads = !strcmp(v, "heads");
            continue;
        }
        if (!strcmp(a, "--threads") && parse_list(v, &one, 1) == 1) {
            threads = (int)one;
            continue;
        }
        if (!strcmp(a, "--seconds") && parse_list(v, &one, 1) == 1) {
            seconds = (double)one;
            continue;
        }
        if (!strcmp(a, "--isa") && (!strcmp(v, "auto") || !strcmp(v, "scalar"))) {
            isa = strcmp(v, "auto") ? SHOAL_KV_ISA_SCALAR : SHOAL_KV_ISA_AUTO;
            continue;
        }
        if (!strcmp(a, "--kv")) {
            char buf[64];
            snprintf(buf, sizeof buf, "%s", v);
            n_kv = 0;
            for (char *tok = strtok(buf, ","); tok && n_kv < 3; tok = strtok(NULL, ","))
                if (shoal_kv_dtype_parse(tok, &kvs[n_kv++])) {
                    fprintf(stderr, "attn_bench: --kv expects f32,f16,bf16; got '%s'\n", tok);
                    return 2;
                }
            continue;
        }
        fprintf(stderr, "attn_bench: bad option or value: %s %s\n", a, v);
        return 2;
    }
    if (threads > 0)
        omp_set_num_threads(threads);
    shoal_kv_init(isa, NULL);
    if (tile > 0)
        shoal_kv_set_tile_bytes(tile);
    const int64_t nh = shape[0], nkv_h = shape[1], hd = shape[2], nkv = nkv_h * hd;
    printf("attention of %lld token(s) at the end of the context: %lld layers, %lld heads / "
           "%lld KV heads x %lld, %d threads, %s kernels, %s layout, tiles of %lld bytes\n",
           (long long)n_tok, (long long)n_layer, (long long)nh, (long long)nkv_h, (long long)hd,
           omp_get_max_threads(), shoal_kv_ops_name(), heads ? "heads" : "batched",
           (long long)shoal_kv_tile_bytes());
    printf("%8s %5s %10s %10s %10s %8s %10s\n", "ctx", "kv", "min ms", "median ms", "KV MB",
           "GB/s", "cpu ms");
    float *q = shoal_xcalloc((size_t)(n_tok * nh * hd), sizeof(float));
    float *att = shoal_xcalloc((size_t)(n_tok * nh * hd), sizeof(float));
    uint32_t s = 1;
    for (int64_t i = 0; i < n_tok * nh * hd; i++) {
        s = s * 1664525u + 1013904223u;
        q[i] = (float)(s >> 8) / 16777216.0f - 0.5f;
    }
    for (int ic = 0; ic < n_ctx; ic++) {
        const int64_t L = ctxs[ic] > n_tok ? ctxs[ic] : n_tok;
        const int64_t round = shoal_kv_attn_round(nh, L, n_tok);
        const int64_t per = heads ? omp_get_max_threads() : round * nh;
        float *scores = shoal_xcalloc((size_t)(per * L), sizeof(float));
        float *row = shoal_xcalloc((size_t)nkv, sizeof(float));
        for (int ik = 0; ik < n_kv; ik++) {
            const enum shoal_dtype t = kvs[ik];
            const size_t layer_bytes = (size_t)(L * nkv) * shoal_dtype_size(t);
            char *k = malloc(layer_bytes * (size_t)n_layer), *v = malloc(layer_bytes * (size_t)n_layer);
            if (!k || !v) {
                fprintf(stderr, "attn_bench: cannot allocate 2 x %zu bytes\n",
                        layer_bytes * (size_t)n_layer);
                return 1;
            }
            for (int64_t r = 0; r < L * n_layer; r++) {   /* values of attention's size */
                for (int64_t i = 0; i < nkv; i++) {
                    s = s * 1664525u + 1013904223u;
                    row[i] = (float)(s >> 8) / 16777216.0f - 0.5f;
                }
                shoal_kv_store_row(k + (size_t)r * (size_t)nkv * shoal_dtype_size(t), row, nkv, t);
                shoal_kv_store_row(v + (size_t)r * (size_t)nkv * shoal_dtype_size(t), row, nkv, t);
            }
            double times[4096], cpu[4096];
            int n_t = 0;
            const double t_end = shoal_time_s() + seconds;
            do {
                const double t0 = shoal_time_s(), c0 = cpu_s();
                for (int64_t il = 0; il < n_layer; il++) {
                    const char *kl = k + il * layer_bytes, *vl = v + il * layer_bytes;
                    if (heads)
                        attend_heads(att, q, kl, vl, L, n_tok, nh, nkv_h, hd, t, scores);
                    else
                        attend_batched(att, q, kl, vl, L, n_tok, nh, nkv_h, hd, t, scores, round);
                }
                cpu[n_t] = cpu_s() - c0;
                times[n_t++] = shoal_time_s() - t0;
            } while (n_t < 4096 && (n_t < 3 || shoal_time_s() < t_end));
            qsort(times, (size_t)n_t, sizeof times[0], cmp_d);
            qsort(cpu, (size_t)n_t, sizeof cpu[0], cmp_d);
            const double med = times[n_t / 2], bytes = 2.0 * (double)layer_bytes * (double)n_layer;
            printf("%8lld %5s %10.2f %10.2f %10.1f %8.1f %10.2f\n", (long long)L,
                   shoal_kv_dtype_name(t), times[0] * 1e3, med * 1e3, bytes / 1e6,
                   bytes / times[0] / 1e9, cpu[n_t / 2] * 1e3);
            fflush(stdout);
            free(k);
            free(v);
        }
        free(scores);
        free(row);
    }
    free(q);
    free(att);
    return 0;
}
