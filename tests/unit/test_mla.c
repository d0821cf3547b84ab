/* mla: the absorbed query and output of a GGUF's split kv_b as shipped
 * (coordinator/engine/mla.h: wk_b / wv_b of a block type) are, bit for bit,
 * each head's rows' canonical ggml dot (ggml_dot.h) with the token's
 * vector quantized for the type, on every kernel table and thread split,
 * for one token and several. */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <stdlib.h>
#include <string.h>

#include "ggml_dot.h"
#include "ggml_types.h"
#include "mla.h"
#include "quant.h"

static uint32_t lcg(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

static float frand(uint32_t *s)
{
    return (float)lcg(s) / 16777216.0f - 0.5f;
}

/* rows x cols of random Q8_0 blocks (d a small f16, codes -127 .. 127) */
static uint8_t *q8_0_rows(int64_t rows, int64_t cols, uint32_t *s)
{
    const size_t n_blk = (size_t)(rows * cols / 32);
    uint8_t *w = malloc(n_blk * 34);
    cr_assert(w != NULL);
    for (size_t b = 0; b < n_blk; b++) {
        const uint16_t d = shoal_f32_to_f16(0.001f + 0.01f * (float)(lcg(s) % 100) / 100.0f);
        memcpy(w + b * 34, &d, 2);
        for (int i = 0; i < 32; i++)
            w[b * 34 + 2 + i] = (uint8_t)(int8_t)((int)(lcg(s) % 255) - 127);
    }
    return w;
}

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* want[t][h][j] = ggml dot of row h * per + j of w (cols elements) with
 * x[t][h] (x_ld floats apart per token, h_ld per head), quantized */
static void reference(float *want, const uint8_t *w, int64_t H, int64_t per, int64_t cols,
                      const float *x, int64_t x_ld, int64_t h_ld, int64_t n)
{
    void *buf = malloc(shoal_ggml_act_bytes(SHOAL_GGML_TYPE_Q8_0, cols));
    const size_t rb = (size_t)(cols / 32) * 34;
    for (int64_t t = 0; t < n; t++)
        for (int64_t h = 0; h < H; h++) {
            struct shoal_ggml_act a;
            shoal_ggml_act_init(&a, SHOAL_GGML_TYPE_Q8_0, cols, 1, buf);
            shoal_ggml_act_quantize(&a, x + t * x_ld + h * h_ld, 1);
            for (int64_t j = 0; j < per; j++)
                want[(t * H + h) * per + j] = shoal_ggml_dot(&a, 0, w + (size_t)(h * per + j) * rb);
        }
    free(buf);
}

/* got[0 .. len) are want's bits (what: the output, th: token * H + head) */
static void same_bits(const char *what, const float *got, const float *want, int64_t len,
                      int64_t n, int nth, int64_t th)
{
    for (int64_t j = 0; j < len; j++)
        cr_assert(eq(u32, bits(got[j]), bits(want[j])),
                  "%s, %lld tokens, %d threads: %s[token x head %lld][%lld] %.9g, reference %.9g",
                  shoal_quant_ops_name(), (long long)n, nth, what, (long long)th, (long long)j,
                  got[j], want[j]);
}

Test(mla, split_kv_b_as_shipped_is_each_heads_ggml_dot)
{
    const int64_t H = 3, kvl = 64, nope = 32, rope = 16, vd = 32, hd = nope + rope;
    const int64_t mr = kvl + rope;
    struct shoal_model_config c;
    memset(&c, 0, sizeof c);
    c.n_head = H;
    c.kv_lora_rank = kvl;
    c.qk_nope_head_dim = nope;
    c.qk_rope_head_dim = rope;
    c.v_head_dim = vd;
    uint32_t s = 7;
    uint8_t *kb = q8_0_rows(H * kvl, nope, &s), *vb = q8_0_rows(H * vd, kvl, &s);
    const struct shoal_weight wk = {.dtype = SHOAL_DTYPE_GGML, .ggml_type = SHOAL_GGML_TYPE_Q8_0,
                                    .data = kb, .rows = H * kvl, .cols = nope};
    const struct shoal_weight wv = {.dtype = SHOAL_DTYPE_GGML, .ggml_type = SHOAL_GGML_TYPE_Q8_0,
                                    .data = vb, .rows = H * vd, .cols = kvl};
    const struct shoal_weight none = {0};   /* wkv_b unbound, as a GGUF leaves it */
    const int64_t max_n = 5;
    float *q = malloc((size_t)(max_n * H * hd) * sizeof *q);
    float *att = malloc((size_t)(max_n * H * mr) * sizeof *att);
    float *qm = malloc((size_t)(max_n * H * mr) * sizeof *qm);
    float *ov = malloc((size_t)(max_n * H * vd) * sizeof *ov);
    float *want_q = malloc((size_t)(max_n * H * kvl) * sizeof *want_q);
    float *want_o = malloc((size_t)(max_n * H * vd) * sizeof *want_o);
    float row[64];
    for (int64_t i = 0; i < max_n * H * hd; i++)
        q[i] = frand(&s);
    for (int64_t i = 0; i < max_n * H * mr; i++)
        att[i] = frand(&s);
    reference(want_q, kb, H, kvl, nope, q, H * hd, hd, max_n);
    reference(want_o, vb, H, vd, kvl, att, H * mr, mr, max_n);
    const enum shoal_quant_isa isas[] = {SHOAL_QUANT_ISA_SCALAR, SHOAL_QUANT_ISA_AUTO};
    for (int ii = 0; ii < 2; ii++) {
        cr_assert(eq(int, shoal_quant_init(isas[ii], NULL), 0));
        for (int64_t n = 1; n <= max_n; n += max_n - 1)
            for (int nth = 1; nth <= 2; nth++) {
                memset(qm, 0xff, (size_t)(n * H * mr) * sizeof *qm);
                memset(ov, 0xff, (size_t)(n * H * vd) * sizeof *ov);
                for (int ith = 0; ith < nth; ith++) {
                    shoal_mla_absorb_q(qm, q, n, &none, &wk, &c, row, ith, nth);
                    shoal_mla_out(ov, att, n, &none, &wv, &c, row, ith, nth);
                }
                for (int64_t t = 0; t < n; t++)
                    for (int64_t h = 0; h < H; h++) {
                        const int64_t th = t * H + h;
                        same_bits("qm", qm + th * mr, want_q + th * kvl, kvl, n, nth, th);
                        same_bits("q_pe", qm + th * mr + kvl, q + th * hd + nope, rope, n, nth,
                                  th);
                        same_bits("ov", ov + th * vd, want_o + th * vd, vd, n, nth, th);
                    }
            }
    }
    shoal_quant_init(SHOAL_QUANT_ISA_SCALAR, NULL);
    free(kb);
    free(vb);
    free(q);
    free(att);
    free(qm);
    free(ov);
    free(want_q);
    free(want_o);
}
