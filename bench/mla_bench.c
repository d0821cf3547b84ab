/* mla_bench: MLA's absorbed query and output (coordinator/engine/mla.h) for
 * one layer at DeepSeek-V3's widths (128 heads, kv_lora_rank 512, qk_nope
 * and v_head_dim 128), kv_b as each form it comes in:
 *   f32    kv_b_proj in F32 (an F32 GGUF; before b3c9acf, any split GGUF)
 *   fp8    kv_b_proj in FP8 with 128 x 128 block scales (a V3 checkpoint)
 *   q8_0   a GGUF's attn_k_b / attn_v_b in Q8_0, run as shipped
 *
 *   mla_bench [--reps N] [--threads N] [--tokens N]
 *
 * Weights are random (the products' cost does not depend on their values)
 * and each form is held in six copies used in turn, so that they come from
 * RAM as a model's layers do. Prints, per form, the fastest of --reps runs
 * (default 30) of shoal_mla_absorb_q + shoal_mla_out over --tokens tokens
 * (default 1) in one OpenMP region of --threads threads (default: all), the
 * weight bytes and their rate. Not a test: figures only (docs/BENCHMARKS.md
 * "MLA's absorbed query"). Exit 0; 2 on bad arguments. Thread: main. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml_types.h"
#include "mla.h"
#include "parse.h"
#include "quant.h"
#include "util.h"

#define COPIES 6

static uint32_t lcg(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

/* n random bytes: Q8_0 blocks (d a small f16, then 32 codes) or FP8 codes
 * (no NaN) or f32 values, as the form asks */
static void *random_bytes(size_t n, int form, uint32_t *s)
{
    uint8_t *p = shoal_xmalloc(n);
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)lcg(s);
    if (form == 0)
        for (size_t i = 0; i < n / 4; i++)
            ((float *)(void *)p)[i] = (float)(lcg(s) % 1000) / 20000.0f - 0.025f;
    else if (form == 1)
        for (size_t i = 0; i < n; i++)
            p[i] = (p[i] & 0x7f) == 0x7f ? p[i] ^ 1 : p[i];
    else
        for (size_t b = 0; b < n / 34; b++) {
            const uint16_t d = shoal_f32_to_f16(0.0005f);
            memcpy(p + b * 34, &d, 2);
        }
    return p;
}

int main(int argc, char **argv)
{
    long long reps = 30, threads = 0, n_tok = 1;
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long *dst = !strcmp(a, "--reps") ? &reps : !strcmp(a, "--threads") ? &threads
                         : !strcmp(a, "--tokens") ? &n_tok : NULL;
        if (!dst || !v || shoal_parse_i64(v, 1, 4096, dst)) {
            fprintf(stderr, "mla_bench: bad option or value: %s %s (see the header of "
                    "bench/mla_bench.c)\n", a, v ? v : "");
            return 2;
        }
    }
    if (threads > 0)
        omp_set_num_threads((int)threads);
    shoal_quant_init(SHOAL_QUANT_ISA_AUTO, NULL);
    const int64_t H = 128, kvl = 512, nope = 128, vd = 128, rope = 64, n = n_tok;
    const struct shoal_model_config c = {.n_head = H, .kv_lora_rank = kvl,
                                         .qk_nope_head_dim = nope, .qk_rope_head_dim = rope,
                                         .v_head_dim = vd};
    const int64_t kvb_rows = H * (nope + vd), nbc = kvl / 128;
    float *scales = shoal_xmalloc((size_t)(kvb_rows / 128 * nbc) * sizeof(float));
    for (int64_t i = 0; i < kvb_rows / 128 * nbc; i++)
        scales[i] = 0.0005f;
    float *q = shoal_xcalloc((size_t)(n * H * (nope + rope)), sizeof(float));
    float *qm = shoal_xcalloc((size_t)(n * H * (kvl + rope)), sizeof(float));
    float *ov = shoal_xcalloc((size_t)(n * H * vd), sizeof(float));
    uint32_t s = 1;
    for (int64_t i = 0; i < n * H * (nope + rope); i++)
        q[i] = (float)(lcg(&s) % 1000) / 1000.0f - 0.5f;
    static const char *names[3] = {"f32", "fp8", "q8_0"};
    printf("mla_bench: one layer at V3 widths, %lld token(s), %d threads, %s kernels\n", n_tok,
           omp_get_max_threads(), shoal_quant_ops_name());
    printf("%-6s %10s %12s %8s\n", "kv_b", "MB", "ms (best)", "GB/s");
    for (int form = 0; form < 3; form++) {
        struct shoal_weight kv[COPIES], kb[COPIES], vb[COPIES];
        void *mem[2 * COPIES] = {0};
        for (int k = 0; k < COPIES; k++) {
            memset(&kv[k], 0, sizeof kv[k]);
            memset(&kb[k], 0, sizeof kb[k]);
            memset(&vb[k], 0, sizeof vb[k]);
            if (form < 2) {
                mem[k] = random_bytes((size_t)(kvb_rows * kvl) * (form ? 1 : 4), form, &s);
                kv[k] = (struct shoal_weight){.dtype = form ? SHOAL_DTYPE_FP8 : SHOAL_DTYPE_F32,
                                              .data = mem[k], .rows = kvb_rows, .cols = kvl,
                                              .group = form ? 128 : 0,
                                              .scale = form ? scales : NULL};
            } else {
                mem[k] = random_bytes((size_t)(H * kvl * nope / 32 * 34), 2, &s);
                mem[COPIES + k] = random_bytes((size_t)(H * vd * kvl / 32 * 34), 2, &s);
                kb[k] = (struct shoal_weight){.dtype = SHOAL_DTYPE_GGML, .data = mem[k],
                                              .ggml_type = SHOAL_GGML_TYPE_Q8_0,
                                              .rows = H * kvl, .cols = nope};
                vb[k] = (struct shoal_weight){.dtype = SHOAL_DTYPE_GGML,
                                              .data = mem[COPIES + k],
                                              .ggml_type = SHOAL_GGML_TYPE_Q8_0,
                                              .rows = H * vd, .cols = kvl};
            }
        }
        const double bytes = form == 2 ? (double)(H * (kvl * nope + vd * kvl) / 32 * 34)
                                       : (double)(kvb_rows * kvl) * (form ? 1.0 : 4.0);
        double best = 1e30;
        for (long long r = 0; r < reps; r++) {
            const int k = (int)(r % COPIES);
            const double t0 = shoal_time_s();
#pragma omp parallel
            {
                const int ith = omp_get_thread_num(), nth = omp_get_num_threads();
                float row[512];
                shoal_mla_absorb_q(qm, q, n, &kv[k], &kb[k], &c, row, ith, nth);
#pragma omp barrier
                shoal_mla_out(ov, qm, n, &kv[k], &vb[k], &c, row, ith, nth);
            }
            const double dt = shoal_time_s() - t0;
            best = dt < best ? dt : best;
        }
        printf("%-6s %10.1f %12.3f %8.1f\n", names[form], bytes / 1e6, best * 1e3,
               bytes / best / 1e9);
        for (int k = 0; k < 2 * COPIES; k++)
            free(mem[k]);
    }
    free(scales);
    free(q);
    free(qm);
    free(ov);
    return 0;
}
