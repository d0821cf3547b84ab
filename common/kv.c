/* kv: KV cache element types, the scalar reference kernels and the choice
 * of the active table (kv.h). */
#include "kv.h"

#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "log.h"
#include "util.h"

int shoal_kv_dtype_ok(enum shoal_dtype t)
{
    return t == SHOAL_DTYPE_F32 || t == SHOAL_DTYPE_F16 || t == SHOAL_DTYPE_BF16;
}

const char *shoal_kv_dtype_name(enum shoal_dtype t)
{
    switch (t) {
    case SHOAL_DTYPE_F32: return "f32";
    case SHOAL_DTYPE_F16: return "f16";
    case SHOAL_DTYPE_BF16: return "bf16";
    default: return "?";
    }
}

int shoal_kv_dtype_parse(const char *s, enum shoal_dtype *t)
{
    static const enum shoal_dtype all[] = {SHOAL_DTYPE_F32, SHOAL_DTYPE_F16, SHOAL_DTYPE_BF16};
    for (size_t i = 0; s && i < sizeof all / sizeof all[0]; i++) {
        if (!strcmp(s, shoal_kv_dtype_name(all[i]))) {
            *t = all[i];
            return 0;
        }
    }
    return -1;
}

void shoal_kv_store_row(void *dst, const float *src, int64_t n, enum shoal_dtype t)
{
    uint16_t *d = dst;
    switch (t) {
    case SHOAL_DTYPE_F16:
        for (int64_t i = 0; i < n; i++)
            d[i] = shoal_f32_to_f16(src[i]);
        break;
    case SHOAL_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++)
            d[i] = shoal_f32_to_bf16(src[i]);
        break;
    default:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    }
}

/* ---- scalar reference: the definitions of kv.h, literally ------------------ */

static void scores_scalar(float *s, const float *q, const void *k, int64_t stride,
                          int64_t n_rows, int64_t n, enum shoal_dtype t)
{
    float stack[512];
    float *row = t == SHOAL_DTYPE_F32 ? NULL
                 : n <= 512 ? stack : shoal_xmalloc((size_t)n * sizeof(float));
    for (int64_t j = 0; j < n_rows; j++) {
        const void *kr = shoal_kv_row(k, j, stride, t);
        if (!row) {
            s[j] = shoal_dot_f32(q, kr, n);
            continue;
        }
        shoal_to_f32(row, kr, t, (size_t)n);
        s[j] = shoal_dot_f32(q, row, n);
    }
    if (row && row != stack)
        free(row);
}

void shoal_kv_mix_cols_scalar(float *out, const float *p, const void *v, int64_t stride,
                              int64_t n_rows, int64_t d0, int64_t d1, enum shoal_dtype t)
{
    for (int64_t d = d0; d < d1; d++)
        out[d] = 0.0f;
    for (int64_t j = 0; j < n_rows; j++) {
        const void *vr = shoal_kv_row(v, j, stride, t);
        const float *f = vr;
        const uint16_t *h = vr;
        for (int64_t d = d0; d < d1; d++) {
            const float x = t == SHOAL_DTYPE_F32    ? f[d]
                            : t == SHOAL_DTYPE_BF16 ? shoal_bf16_to_f32(h[d])
                                                    : shoal_f16_to_f32(h[d]);
            out[d] += p[j] * x;
        }
    }
}

static void mix_scalar(float *out, const float *p, const void *v, int64_t stride,
                       int64_t n_rows, int64_t n, enum shoal_dtype t)
{
    shoal_kv_mix_cols_scalar(out, p, v, stride, n_rows, 0, n, t);
}

const struct shoal_kv_ops shoal_kv_ops_scalar = {
    .name = "scalar",
    .scores = scores_scalar,
    .mix = mix_scalar,
};

/* ---- selection ------------------------------------------------------------ */

/* Written only by shoal_kv_init (main thread, while no kernel runs). */
static const struct shoal_kv_ops *active_ops = &shoal_kv_ops_scalar;

void shoal_kv_scores(float *s, const float *q, const void *k, int64_t stride,
                     int64_t n_rows, int64_t n, enum shoal_dtype t)
{
    active_ops->scores(s, q, k, stride, n_rows, n, t);
}

void shoal_kv_mix(float *out, const float *p, const void *v, int64_t stride,
                  int64_t n_rows, int64_t n, enum shoal_dtype t)
{
    active_ops->mix(out, p, v, stride, n_rows, n, t);
}

const char *shoal_kv_ops_name(void)
{
    return active_ops->name;
}

/* AVX2 + F16C (every AVX2 CPU has F16C, but check both: a hypervisor may
 * hide either); __builtin_cpu_supports also checks that the OS saves the
 * YMM registers */
static const struct shoal_kv_ops *ops_avx2(void)
{
#if defined(SHOAL_KV_HAVE_AVX2)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c"))
        return &shoal_kv_ops_avx2;
#endif
    return NULL;
}

static const struct shoal_kv_ops *ops_neon(void)
{
#if defined(SHOAL_KV_HAVE_NEON)
    return &shoal_kv_ops_neon;   /* NEON and fcvtl are the aarch64 baseline */
#else
    return NULL;
#endif
}

int shoal_kv_init(enum shoal_kv_isa isa, struct shoal_err *err)
{
    const struct shoal_kv_ops *ops = NULL;
    switch (isa) {
    case SHOAL_KV_ISA_AUTO:
        ops = ops_avx2();
        if (!ops)
            ops = ops_neon();
        if (!ops)
            ops = &shoal_kv_ops_scalar;
        break;
    case SHOAL_KV_ISA_SCALAR: ops = &shoal_kv_ops_scalar; break;
    case SHOAL_KV_ISA_AVX2: ops = ops_avx2(); break;
    case SHOAL_KV_ISA_NEON: ops = ops_neon(); break;
    default: break;
    }
    if (!ops)
        return shoal_err_set(err, SHOAL_EUNSUPPORTED,
                             "kv kernels #%d requested but not available in this build or "
                             "on this CPU; active kernels stay '%s'", (int)isa,
                             active_ops->name);
    active_ops = ops;
    shoal_log(SHOAL_LOG_INFO, "kv", "kernels=%s", ops->name);
    return 0;
}
