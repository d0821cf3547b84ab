/* mxfp4: MXFP4 experts through the container (docs/FORMAT.md "MXFP4
 * tensors"): the bundled model (models/shakespeare-moe: 4 MoE layers x 8
 * experts, n_embd 256, n_ff_exp 192) with every routed expert replaced by a
 * random MXFP4 weight built here, converted with MXFP4 kept (the pairs and
 * exponents byte for byte, read back through the expert store), to bf16
 * and f32 (the dequantized values), refused from a bf16 source and with a
 * bad exponent. */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "container.h"
#include "expert_store.h"
#include "model.h"
#include "quant.h"
#include "test_fs.h"
#include "util.h"

#define MODEL_DIR SHOAL_SOURCE_ROOT "/models/shakespeare-moe"

static char tmp[64];
static struct shoal_model *model;
static uint8_t *bytes;   /* every MXFP4 weight's pairs and exponents */

static uint32_t xs(uint32_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

/* w becomes a random MXFP4 weight of its shape, carved from *p */
static void make_mxfp4(struct shoal_weight *w, uint8_t **p, uint32_t *st)
{
    const size_t nq = (size_t)(w->rows * w->cols / 2), ne = (size_t)(w->rows * w->cols / 32);
    uint8_t *q = *p, *e = q + nq;
    for (size_t i = 0; i < nq; i++)
        q[i] = (uint8_t)xs(st);
    for (size_t i = 0; i < ne; i++)
        e[i] = (uint8_t)(120 + xs(st) % 6);   /* 2^-7 .. 2^-2 */
    *w = (struct shoal_weight){.dtype = SHOAL_DTYPE_MXFP4, .rows = w->rows, .cols = w->cols,
                               .group = SHOAL_MXFP4_BLOCK, .data = q, .e8m0 = e};
    *p = e + ne;
}

static void setup(void)
{
    snprintf(tmp, sizeof tmp, "/tmp/shoal-mxfp4-XXXXXX");
    cr_assert(mkdtemp(tmp) != NULL);
    struct shoal_err err = {0};
    model = shoal_model_load(MODEL_DIR, &err);
    cr_assert(model != NULL, "%s", err.msg);
    const int64_t E = model->cfg.n_embd, F = model->cfg.n_ff_exp;
    const size_t per = 3 * (size_t)(E * F / 2 + E * F / 32);
    bytes = malloc(per * (size_t)(model->cfg.n_layer * model->cfg.n_expert));
    uint8_t *p = bytes;
    uint32_t st = 12345;
    for (int64_t il = 0; il < model->cfg.n_layer; il++)
        for (int64_t ie = 0; ie < model->cfg.n_expert && model->layers[il].experts; ie++) {
            struct shoal_expert_weights *x = &model->layers[il].experts[ie];
            make_mxfp4(&x->w_gate, &p, &st);
            make_mxfp4(&x->w_up, &p, &st);
            make_mxfp4(&x->w_down, &p, &st);
        }
}

static void teardown(void)
{
    shoal_model_free(model);
    free(bytes);
    cr_assert(eq(int, test_rm_rf(tmp), 0));
}

static char *convert(const char *name, enum shoal_dtype experts, struct shoal_err *err)
{
    char *dst = shoal_path_join(tmp, name);
    struct shoal_convert_params p = shoal_convert_params_default();
    p.experts_dtype = experts;
    if (shoal_container_convert(model, MODEL_DIR, dst, &p, err)) {
        free(dst);
        return NULL;
    }
    return dst;
}

static struct shoal_container *open_ct(const char *dir)
{
    struct shoal_err err = {0};
    struct shoal_model_config cfg;
    struct shoal_container *ct = shoal_container_open(dir, &cfg, &err);
    cr_assert(ct != NULL, "%s: %s", dir, err.msg);
    return ct;
}

static struct shoal_expert_store *store(const struct shoal_container *ct)
{
    struct shoal_expert_store_params p = shoal_expert_store_params_default();
    p.learn = 0;
    p.io.kind = SHOAL_IO_PREAD;
    struct shoal_err err = {0};
    struct shoal_expert_store *s = shoal_expert_store_create(ct, p, &err);
    cr_assert(s != NULL, "%s", err.msg);
    return s;
}

/* bit-exact: MXFP4 kept, every expert's pairs and exponents as the source's
 * (through the store, which checks the exponents after the xxh64) */
Test(mxfp4, convert_keeps_mxfp4_bytes, .init = setup, .fini = teardown, .timeout = 120)
{
    struct shoal_err err = {0};
    char *dir = convert("mx", SHOAL_DTYPE_MXFP4, &err);
    cr_assert(dir != NULL, "%s", err.msg);
    struct shoal_container *ct = open_ct(dir);
    cr_assert(eq(int, ct->experts_dtype, SHOAL_DTYPE_MXFP4));
    cr_assert(eq(int, ct->experts_group, 32));
    cr_assert(eq(int, shoal_container_verify(ct, NULL, NULL, &err), 0), "%s", err.msg);
    struct shoal_expert_store *s = store(ct);
    for (int64_t il = 0; il < model->cfg.n_layer; il++)
        for (int64_t ie = 0; ie < model->cfg.n_expert; ie += 3) {
            struct shoal_expert_weights v;
            cr_assert(eq(int, shoal_expert_store_acquire(s, il, ie, &v, &err), 0), "%s", err.msg);
            const struct shoal_weight *got[3] = {&v.w_gate, &v.w_up, &v.w_down};
            const struct shoal_expert_weights *src = &model->layers[il].experts[ie];
            const struct shoal_weight *want[3] = {&src->w_gate, &src->w_up, &src->w_down};
            for (int c = 0; c < 3; c++) {
                cr_assert(eq(int, got[c]->dtype, SHOAL_DTYPE_MXFP4));
                cr_assert(eq(i64, got[c]->rows, want[c]->rows));
                const size_t nq = (size_t)(want[c]->rows * want[c]->cols / 2);
                cr_assert(eq(int, memcmp(got[c]->data, want[c]->data, nq), 0),
                          "layer %lld expert %lld comp %d pairs", (long long)il, (long long)ie, c);
                cr_assert(eq(int, memcmp(got[c]->e8m0, want[c]->e8m0, nq / 16), 0),
                          "layer %lld expert %lld comp %d exponents", (long long)il,
                          (long long)ie, c);
            }
            shoal_expert_store_release(s, il, ie);
        }
    shoal_expert_store_destroy(s);
    shoal_container_close(ct);
    free(dir);
}

/* bit-exact: --experts bf16 / f32 of an MXFP4 source hold the dequantized
 * values (f32 exactly, bf16 as rounded from them: exact too, two significant
 * bits) */
Test(mxfp4, convert_to_bf16_and_f32_dequantizes, .init = setup, .fini = teardown,
     .timeout = 120)
{
    const enum shoal_dtype ts[2] = {SHOAL_DTYPE_F32, SHOAL_DTYPE_BF16};
    for (int k = 0; k < 2; k++) {
        struct shoal_err err = {0};
        char *dir = convert(k ? "bf16" : "f32", ts[k], &err);
        cr_assert(dir != NULL, "%s", err.msg);
        struct shoal_container *ct = open_ct(dir);
        cr_assert(eq(int, ct->experts_dtype, ts[k]));
        struct shoal_expert_store *s = store(ct);
        const int64_t il = 2, ie = 5;
        struct shoal_expert_weights v;
        cr_assert(eq(int, shoal_expert_store_acquire(s, il, ie, &v, &err), 0), "%s", err.msg);
        const struct shoal_weight *src = &model->layers[il].experts[ie].w_down;
        float *a = malloc((size_t)src->cols * sizeof(float));
        float *b = malloc((size_t)src->cols * sizeof(float));
        int64_t nonzero = 0;
        for (int64_t r = 0; r < src->rows; r++) {
            shoal_weight_row_to_f32(a, src, r);
            shoal_weight_row_to_f32(b, &v.w_down, r);
            for (int64_t c = 0; c < src->cols; c++) {
                cr_assert(eq(flt, a[c], b[c]), "%s (%lld, %lld)", shoal_dtype_name(ts[k]),
                          (long long)r, (long long)c);
                nonzero += a[c] != 0.0f;
            }
        }
        cr_assert(gt(i64, nonzero, src->rows * src->cols / 2));
        free(a);
        free(b);
        shoal_expert_store_release(s, il, ie);
        shoal_expert_store_destroy(s);
        shoal_container_close(ct);
        free(dir);
    }
}

/* refusals: MXFP4 from a bf16 source, and a source exponent of 255 (named) */
Test(mxfp4, convert_refuses_non_mxfp4_sources_and_bad_exponents, .init = setup,
     .fini = teardown, .timeout = 120)
{
    struct shoal_err err = {0};
    struct shoal_model *bf = shoal_model_load(MODEL_DIR, &err);
    cr_assert(bf != NULL, "%s", err.msg);
    struct shoal_convert_params p = shoal_convert_params_default();
    p.experts_dtype = SHOAL_DTYPE_MXFP4;
    char *dst = shoal_path_join(tmp, "refused");
    cr_assert(eq(int, shoal_container_convert(bf, MODEL_DIR, dst, &p, &err),
                 SHOAL_EUNSUPPORTED));
    cr_assert(strstr(err.msg, "MXFP4 keeps MXFP4 source weights only") != NULL, "%s", err.msg);
    shoal_model_free(bf);
    struct shoal_weight *w = &model->layers[1].experts[3].w_down;
    ((uint8_t *)(uintptr_t)w->e8m0)[4 * (w->cols / 32) + 2] = 255;
    for (int k = 0; k < 2; k++) {   /* kept and dequantized: both read every exponent */
        err = (struct shoal_err){0};
        cr_assert(convert(k ? "bad-bf16" : "bad", k ? SHOAL_DTYPE_BF16 : SHOAL_DTYPE_MXFP4,
                          &err) == NULL);
        cr_assert(eq(int, err.code, SHOAL_EFORMAT), "%s", err.msg);
        cr_assert(strstr(err.msg, "(row 4, block 2) is 255 (NaN)") != NULL, "%s", err.msg);
        cr_assert(strstr(err.msg, "layers.1.mlp.experts.3.down_proj") != NULL, "%s", err.msg);
    }
    free(dst);
}
