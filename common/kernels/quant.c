/* quant: layout arithmetic, quantization, the scalar reference kernels and
 * the choice of the active kernel table. The layout and the canonical
 * reduction order are specified in quant.h; the ISA files copy the order. */
#include "quant.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "log.h"

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#elif defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
#endif

#define QUANT_GROUP_MAX 128

/* ---- the activation tile: one heap buffer per thread ---------------------
 * On the heap, not the stack: 256 KiB would crowd a secondary thread's
 * stack (512 KiB by default on macOS). */
static pthread_key_t act_tile_key;
static pthread_once_t act_tile_once = PTHREAD_ONCE_INIT;
static int act_tile_key_ok;

static void act_tile_key_make(void)
{
    act_tile_key_ok = pthread_key_create(&act_tile_key, free) == 0;
}

uint8_t *shoal_act_tile(void)
{
    pthread_once(&act_tile_once, act_tile_key_make);
    if (!act_tile_key_ok)
        return NULL;
    void *t = pthread_getspecific(act_tile_key);
    if (t == NULL) {
        if (posix_memalign(&t, 64, SHOAL_ACT_TILE_BYTES) != 0)
            return NULL;
        if (pthread_setspecific(act_tile_key, t) != 0) {
            free(t);
            return NULL;
        }
    }
    return t;
}

const char *shoal_quant_type_name(enum shoal_quant_type type)
{
    switch (type) {
    case SHOAL_QUANT_INT8: return "int8";
    case SHOAL_QUANT_INT4: return "int4";
    default: return "?";
    }
}

int shoal_quant_group_ok(int group)
{
    return group == 32 || group == 64 || group == 128;
}

static int type_ok(enum shoal_quant_type type)
{
    return type == SHOAL_QUANT_INT8 || type == SHOAL_QUANT_INT4;
}

size_t shoal_quant_row_bytes(enum shoal_quant_type type, int64_t n, int group)
{
    /* n <= SIZE_MAX / 8 keeps every term below far from overflowing */
    if (!type_ok(type) || !shoal_quant_group_ok(group) || n < 1 ||
        (uint64_t)n > SIZE_MAX / 8)
        return 0;
    size_t n_group = ((size_t)n + (size_t)group - 1) / (size_t)group;
    size_t qbytes = type == SHOAL_QUANT_INT8 ? (size_t)n : ((size_t)n + 1) / 2;
    size_t bytes = 4 * n_group + qbytes;
    return (bytes + 3) & ~(size_t)3;
}

size_t shoal_quant_matrix_bytes(enum shoal_quant_type type, int64_t rows,
                                int64_t cols, int group)
{
    size_t row = shoal_quant_row_bytes(type, cols, group);
    if (row == 0 || rows < 1 || (uint64_t)rows > (uint64_t)(SIZE_MAX / row))
        return 0;
    return (size_t)rows * row;
}

int shoal_quant_weight_check(const struct shoal_quant_weight *w,
                             size_t data_bytes, struct shoal_err *err)
{
    if (!type_ok(w->type))
        return shoal_err_set(err, SHOAL_EINVAL,
                             "quantized weight has unknown type %d; expected "
                             "int8 (%d) or int4 (%d)", (int)w->type,
                             SHOAL_QUANT_INT8, SHOAL_QUANT_INT4);
    if (!shoal_quant_group_ok(w->group))
        return shoal_err_set(err, SHOAL_EINVAL,
                             "quantized %s weight has group size %d; expected "
                             "32, 64 or 128", shoal_quant_type_name(w->type),
                             w->group);
    size_t need = shoal_quant_matrix_bytes(w->type, w->rows, w->cols, w->group);
    if (need == 0)
        return shoal_err_set(err, SHOAL_EINVAL,
                             "quantized %s weight has shape [%lld][%lld]; "
                             "expected both dimensions >= 1 and a size that "
                             "fits in memory", shoal_quant_type_name(w->type),
                             (long long)w->rows, (long long)w->cols);
    if (w->data == NULL || data_bytes < need)
        return shoal_err_set(err, SHOAL_ESHAPE,
                             "quantized %s weight [%lld][%lld] G=%d needs %zu "
                             "bytes, got %zu", shoal_quant_type_name(w->type),
                             (long long)w->rows, (long long)w->cols, w->group,
                             need, w->data ? data_bytes : (size_t)0);
    return 0;
}

/* ---- quantization -------------------------------------------------------- */

/* Quantize len <= QUANT_GROUP_MAX finite-or-not f32 values into *d and q[].
 * Returns the index of the first non-finite value, or -1. */
static int64_t quantize_group(enum shoal_quant_type type, const float *x,
                              int64_t len, float *d, int8_t *q)
{
    float amax = 0.0f;
    for (int64_t k = 0; k < len; k++) {
        if (!isfinite(x[k]))
            return k;
        float a = fabsf(x[k]);
        if (a > amax)
            amax = a;
    }
    const float qmax = type == SHOAL_QUANT_INT8 ? 127.0f : 7.0f;
    *d = amax / qmax;
    for (int64_t k = 0; k < len; k++) {
        float v = *d == 0.0f ? 0.0f : rintf(x[k] / *d);  /* ties to even */
        if (v > qmax)
            v = qmax;
        if (v < -qmax)
            v = -qmax;
        q[k] = (int8_t)v;
    }
    return -1;
}

/* Quantize one row into dst. Returns the first non-finite element or -1. */
static int64_t quantize_row(enum shoal_quant_type type, int group, void *dst,
                            const void *src, enum shoal_dtype src_dtype,
                            int64_t n)
{
    uint8_t *out = dst;
    uint8_t *qs = out + 4 * (size_t)((n + group - 1) / group);
    const size_t esize = shoal_dtype_size(src_dtype);
    float xf[QUANT_GROUP_MAX];
    int8_t q[QUANT_GROUP_MAX];
    for (int64_t i0 = 0, g = 0; i0 < n; i0 += group, g++) {
        const int64_t len = n - i0 < group ? n - i0 : group;
        shoal_to_f32(xf, (const uint8_t *)src + (size_t)i0 * esize, src_dtype,
                     (size_t)len);
        float d = 0.0f;
        int64_t bad = quantize_group(type, xf, len, &d, q);
        if (bad >= 0)
            return i0 + bad;
        memcpy(out + 4 * (size_t)g, &d, sizeof d);
        if (type == SHOAL_QUANT_INT8) {
            memcpy(qs + i0, q, (size_t)len);
        } else {
            /* i0 is even (G is), so a group starts on a byte boundary */
            for (int64_t k = 0; k < len; k += 2) {
                unsigned lo = (unsigned)(q[k] + 8);
                unsigned hi = k + 1 < len ? (unsigned)(q[k + 1] + 8) : 0u;
                qs[(i0 + k) / 2] = (uint8_t)(lo | hi << 4);
            }
        }
    }
    const size_t used = (size_t)(qs - out) +
                        (type == SHOAL_QUANT_INT8 ? (size_t)n
                                                  : ((size_t)n + 1) / 2);
    memset(out + used, 0, shoal_quant_row_bytes(type, n, group) - used);
    return -1;
}

static int check_args(enum shoal_quant_type type, int group,
                      enum shoal_dtype src_dtype, int64_t rows, int64_t cols,
                      struct shoal_err *err)
{
    if (!type_ok(type) || !shoal_quant_group_ok(group))
        return shoal_err_set(err, SHOAL_EINVAL,
                             "quantize: type %d / group %d unsupported; "
                             "expected int8 or int4 with G in {32, 64, 128}",
                             (int)type, group);
    if (src_dtype != SHOAL_DTYPE_F32 && src_dtype != SHOAL_DTYPE_F16 &&
        src_dtype != SHOAL_DTYPE_BF16)
        return shoal_err_set(err, SHOAL_EINVAL,
                             "quantize: source dtype %d unsupported; expected "
                             "F32, F16 or BF16", (int)src_dtype);
    if (shoal_quant_matrix_bytes(type, rows, cols, group) == 0)
        return shoal_err_set(err, SHOAL_EINVAL,
                             "quantize: shape [%lld][%lld] invalid; expected "
                             "both dimensions >= 1", (long long)rows,
                             (long long)cols);
    return 0;
}

int shoal_quant_quantize_row(enum shoal_quant_type type, int group, void *dst,
                             const void *src, enum shoal_dtype src_dtype,
                             int64_t n, struct shoal_err *err)
{
    int rc = check_args(type, group, src_dtype, 1, n, err);
    if (rc < 0)
        return rc;
    int64_t bad = quantize_row(type, group, dst, src, src_dtype, n);
    if (bad >= 0)
        return shoal_err_set(err, SHOAL_ERANGE,
                             "quantize %s: element %lld of %lld is not finite "
                             "(NaN or infinity); quantized weights need finite "
                             "values", shoal_quant_type_name(type),
                             (long long)bad, (long long)n);
    return 0;
}

int shoal_quant_quantize_matrix(enum shoal_quant_type type, int group,
                                void *dst, size_t dst_bytes, const void *src,
                                enum shoal_dtype src_dtype, int64_t rows,
                                int64_t cols, struct shoal_err *err)
{
    int rc = check_args(type, group, src_dtype, rows, cols, err);
    if (rc < 0)
        return rc;
    const size_t need = shoal_quant_matrix_bytes(type, rows, cols, group);
    if (dst_bytes < need)
        return shoal_err_set(err, SHOAL_ESHAPE,
                             "quantize %s [%lld][%lld] G=%d: destination has "
                             "%zu bytes, expected %zu",
                             shoal_quant_type_name(type), (long long)rows,
                             (long long)cols, group, dst_bytes, need);
    const size_t row_bytes = need / (size_t)rows;
    const size_t src_row = (size_t)cols * shoal_dtype_size(src_dtype);
    int64_t bad_row = rows, bad_col = 0;   /* first bad element, row-major */
#pragma omp parallel
    {
        const int nth = omp_get_num_threads(), ith = omp_get_thread_num();
        const int64_t per = rows / nth, rem = rows % nth;
        const int64_t r0 = ith * per + (ith < rem ? ith : rem);
        const int64_t r1 = r0 + per + (ith < rem ? 1 : 0);
        for (int64_t r = r0; r < r1; r++) {
            int64_t c = quantize_row(type, group, (uint8_t *)dst + (size_t)r * row_bytes,
                                     (const uint8_t *)src + (size_t)r * src_row,
                                     src_dtype, cols);
            if (c >= 0) {
#pragma omp critical(shoal_quant_bad)
                if (r < bad_row) {
                    bad_row = r;
                    bad_col = c;
                }
                break;
            }
        }
    }
    if (bad_row < rows)
        return shoal_err_set(err, SHOAL_ERANGE,
                             "quantize %s [%lld][%lld]: element (row %lld, col "
                             "%lld) is not finite (NaN or infinity); quantized "
                             "weights need finite values",
                             shoal_quant_type_name(type), (long long)rows,
                             (long long)cols, (long long)bad_row,
                             (long long)bad_col);
    return 0;
}

static inline float row_scale(const void *row, int64_t g)
{
    float d;
    memcpy(&d, (const uint8_t *)row + 4 * (size_t)g, sizeof d);
    return d;
}

/* The two int4 elements of each byte value, as floats: element 2k (low
 * nibble) and 2k+1 (high nibble), u - 8 each. */
static const float int4_pairs[256][2] = {
    {-8, -8}, {-7, -8}, {-6, -8}, {-5, -8}, {-4, -8}, {-3, -8}, {-2, -8}, {-1, -8},
    {0, -8}, {1, -8}, {2, -8}, {3, -8}, {4, -8}, {5, -8}, {6, -8}, {7, -8},
    {-8, -7}, {-7, -7}, {-6, -7}, {-5, -7}, {-4, -7}, {-3, -7}, {-2, -7}, {-1, -7},
    {0, -7}, {1, -7}, {2, -7}, {3, -7}, {4, -7}, {5, -7}, {6, -7}, {7, -7},
    {-8, -6}, {-7, -6}, {-6, -6}, {-5, -6}, {-4, -6}, {-3, -6}, {-2, -6}, {-1, -6},
    {0, -6}, {1, -6}, {2, -6}, {3, -6}, {4, -6}, {5, -6}, {6, -6}, {7, -6},
    {-8, -5}, {-7, -5}, {-6, -5}, {-5, -5}, {-4, -5}, {-3, -5}, {-2, -5}, {-1, -5},
    {0, -5}, {1, -5}, {2, -5}, {3, -5}, {4, -5}, {5, -5}, {6, -5}, {7, -5},
    {-8, -4}, {-7, -4}, {-6, -4}, {-5, -4}, {-4, -4}, {-3, -4}, {-2, -4}, {-1, -4},
    {0, -4}, {1, -4}, {2, -4}, {3, -4}, {4, -4}, {5, -4}, {6, -4}, {7, -4},
    {-8, -3}, {-7, -3}, {-6, -3}, {-5, -3}, {-4, -3}, {-3, -3}, {-2, -3}, {-1, -3},
    {0, -3}, {1, -3}, {2, -3}, {3, -3}, {4, -3}, {5, -3}, {6, -3}, {7, -3},
    {-8, -2}, {-7, -2}, {-6, -2}, {-5, -2}, {-4, -2}, {-3, -2}, {-2, -2}, {-1, -2},
    {0, -2}, {1, -2}, {2, -2}, {3, -2}, {4, -2}, {5, -2}, {6, -2}, {7, -2},
    {-8, -1}, {-7, -1}, {-6, -1}, {-5, -1}, {-4, -1}, {-3, -1}, {-2, -1}, {-1, -1},
    {0, -1}, {1, -1}, {2, -1}, {3, -1}, {4, -1}, {5, -1}, {6, -1}, {7, -1},
    {-8, 0}, {-7, 0}, {-6, 0}, {-5, 0}, {-4, 0}, {-3, 0}, {-2, 0}, {-1, 0},
    {0, 0}, {1, 0}, {2, 0}, {3, 0}, {4, 0}, {5, 0}, {6, 0}, {7, 0},
    {-8, 1}, {-7, 1}, {-6, 1}, {-5, 1}, {-4, 1}, {-3, 1}, {-2, 1}, {-1, 1},
    {0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 1}, {6, 1}, {7, 1},
    {-8, 2}, {-7, 2}, {-6, 2}, {-5, 2}, {-4, 2}, {-3, 2}, {-2, 2}, {-1, 2},
    {0, 2}, {1, 2}, {2, 2}, {3, 2}, {4, 2}, {5, 2}, {6, 2}, {7, 2},
    {-8, 3}, {-7, 3}, {-6, 3}, {-5, 3}, {-4, 3}, {-3, 3}, {-2, 3}, {-1, 3},
    {0, 3}, {1, 3}, {2, 3}, {3, 3}, {4, 3}, {5, 3}, {6, 3}, {7, 3},
    {-8, 4}, {-7, 4}, {-6, 4}, {-5, 4}, {-4, 4}, {-3, 4}, {-2, 4}, {-1, 4},
    {0, 4}, {1, 4}, {2, 4}, {3, 4}, {4, 4}, {5, 4}, {6, 4}, {7, 4},
    {-8, 5}, {-7, 5}, {-6, 5}, {-5, 5}, {-4, 5}, {-3, 5}, {-2, 5}, {-1, 5},
    {0, 5}, {1, 5}, {2, 5}, {3, 5}, {4, 5}, {5, 5}, {6, 5}, {7, 5},
    {-8, 6}, {-7, 6}, {-6, 6}, {-5, 6}, {-4, 6}, {-3, 6}, {-2, 6}, {-1, 6},
    {0, 6}, {1, 6}, {2, 6}, {3, 6}, {4, 6}, {5, 6}, {6, 6}, {7, 6},
    {-8, 7}, {-7, 7}, {-6, 7}, {-5, 7}, {-4, 7}, {-3, 7}, {-2, 7}, {-1, 7},
    {0, 7}, {1, 7}, {2, 7}, {3, 7}, {4, 7}, {5, 7}, {6, 7}, {7, 7},
};

/* o[k] = d * (float)q[i0 + k] for k < len: one group of a row whose
 * quants start at qs (i0 even for INT4: groups are), the pair table then
 * the scale, in loops the compiler vectorizes */
static void group_to_f32(enum shoal_quant_type type, const uint8_t *qs, int64_t i0,
                         int64_t len, float d, float *o)
{
    if (type == SHOAL_QUANT_INT8) {
        const int8_t *q = (const int8_t *)qs + i0;
        for (int64_t k = 0; k < len; k++)
            o[k] = d * (float)q[k];
        return;
    }
    const uint8_t *p = qs + i0 / 2;
    int64_t k = 0;
    for (; k + 1 < len; k += 2)         /* the pair, then the scale */
        memcpy(o + k, int4_pairs[p[k / 2]], 2 * sizeof(float));
    if (k < len)
        o[k] = int4_pairs[p[k / 2]][0];
    for (k = 0; k < len; k++)
        o[k] = d * o[k];
}

void shoal_quant_dequantize_row(enum shoal_quant_type type, int group,
                                float *dst, const void *row, int64_t n)
{
    const uint8_t *qs = shoal_quant_row_qs(row, n, group);
    /* a group at a time, so the compiler vectorizes the inner loops; each
     * element is d * (float)q as before */
    for (int64_t i0 = 0, g = 0; i0 < n; i0 += group, g++)
        group_to_f32(type, qs, i0, n - i0 < group ? n - i0 : group, row_scale(row, g),
                     dst + i0);
}

void shoal_quant_axpy_rows_scalar(enum shoal_quant_type type, int group, float *dst,
                                  int64_t n, const void *rows, size_t row_bytes,
                                  const float *coef, int64_t coef_stride, int64_t n_rows)
{
    /* a group at a time, as shoal_quant_dequantize_row: its values
     * v[k] = d * q, then dst + a * v[k] */
    float v[QUANT_GROUP_MAX];
    for (int64_t i = 0; i < n_rows; i++) {
        const uint8_t *row = (const uint8_t *)rows + (size_t)i * row_bytes;
        const uint8_t *qs = shoal_quant_row_qs(row, n, group);
        const float a = coef[i * coef_stride];
        for (int64_t i0 = 0, g = 0; i0 < n; i0 += group, g++) {
            const int64_t len = n - i0 < group ? n - i0 : group;
            group_to_f32(type, qs, i0, len, row_scale(row, g), v);
            float *o = dst + i0;
            for (int64_t k = 0; k < len; k++)
                o[k] = o[k] + a * v[k];
        }
    }
}

void shoal_quant_axpy_rows(enum shoal_quant_type type, int group, float *dst, int64_t n,
                           const void *rows, size_t row_bytes, const float *coef,
                           int64_t coef_stride, int64_t n_rows)
{
    const struct shoal_quant_ops *ops = shoal_quant_active_ops();
    (ops->axpy_rows ? ops->axpy_rows : shoal_quant_axpy_rows_scalar)(
        type, group, dst, n, rows, row_bytes, coef, coef_stride, n_rows);
}

/* ---- scalar reference kernels -------------------------------------------- */

static inline float tree8(const float s[8])
{
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

static float dot_scalar(enum shoal_quant_type type, int group, const float *x,
                        const void *row, int64_t n)
{
    const uint8_t *qs = shoal_quant_row_qs(row, n, group);
    float acc = 0.0f;
    for (int64_t i0 = 0, g = 0; i0 < n; i0 += group, g++) {
        const int64_t len = n - i0 < group ? n - i0 : group;
        float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (type == SHOAL_QUANT_INT8) {
            const int8_t *q = (const int8_t *)qs + i0;
            for (int64_t k = 0; k < len; k++)
                s[k & 7] += x[i0 + k] * (float)q[k];
        } else {
            const uint8_t *p = qs + i0 / 2;
            for (int64_t k = 0; k < len; k++) {
                const int q = (int)((p[k / 2] >> (4 * (k & 1))) & 0x0f) - 8;
                s[k & 7] += x[i0 + k] * (float)q;
            }
        }
        acc += row_scale(row, g) * tree8(s);
    }
    return acc;
}

static void linear_rows_scalar(float *y, const float *x, int64_t n_tok,
                               const struct shoal_quant_weight *w, int64_t r0,
                               int64_t r1)
{
    const size_t row_bytes = shoal_quant_row_bytes(w->type, w->cols, w->group);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * row_bytes;
        for (int64_t t = 0; t < n_tok; t++)
            y[t * w->rows + r] = dot_scalar(w->type, w->group, x + t * w->cols,
                                            row, w->cols);
    }
}

const struct shoal_quant_ops shoal_quant_ops_scalar = {
    .name = "scalar",
    .dot = dot_scalar,
    .linear_rows = linear_rows_scalar,
    .linear_rows_a8 = shoal_quant_a8_rows_scalar,
    .act_quantize = shoal_quant_act_quantize_base,
    .fp8_rows = shoal_fp8_rows_scalar,
    .fp8_dequant_row = shoal_fp8_dequant_row_scalar,
    .fp8_axpy_rows = shoal_fp8_axpy_rows_scalar,
    .mxfp4_rows = shoal_mxfp4_rows_scalar,
    .axpy_rows = shoal_quant_axpy_rows_scalar,
};

/* ---- selection --------------------------------------------------------- */

/* Written only by shoal_quant_init (main thread, before parallel regions). */
static const struct shoal_quant_ops *active_ops = &shoal_quant_ops_scalar;

/* F16C (CPUID leaf 1, ECX bit 29): the AVX2 file's FP8 decode widens f16
 * (every AVX2 CPU has it, but a hypervisor may hide it); clang's
 * __builtin_cpu_supports does not know "f16c" */
#if defined(SHOAL_QUANT_HAVE_AVX2)
static int has_f16c(void)
{
    unsigned eax, ebx, ecx, edx;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29));
}
#endif

static const struct shoal_quant_ops *ops_avx2(void)
{
#if defined(SHOAL_QUANT_HAVE_AVX2)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && has_f16c())
        return &shoal_quant_ops_avx2;
#endif
    return NULL;
}

/* AVX-512 F/BW/VL/VBMI/VNNI (Ice Lake, Zen 4 and later); __builtin_cpu_supports
 * also checks that the OS saves the AVX-512 registers (XCR0) */
static const struct shoal_quant_ops *ops_avx512(void)
{
#if defined(SHOAL_QUANT_HAVE_AVX512)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && has_f16c() && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512vnni"))
        return &shoal_quant_ops_avx512;
#endif
    return NULL;
}

/* 1 when CPUID leaf 0's vendor string is v ("GenuineIntel", "AuthenticAMD") */
static int cpu_vendor_is(const char *v)
{
#if defined(__x86_64__)
    unsigned eax, r[3];   /* ebx, edx, ecx: the string's order */
    char s[13] = {0};
    if (!__get_cpuid(0, &eax, &r[0], &r[2], &r[1]))
        return 0;
    memcpy(s, r, 12);
    return strcmp(s, v) == 0;
#else
    (void)v;
    return 0;
#endif
}

/* AMD family 19h (Zen 3, Zen 4; of them only Zen 4 has AVX-512), from
 * CPUID leaf 1: base family 0xf plus extended family 0xa */
static int cpu_is_amd_family_19h(void)
{
#if defined(__x86_64__)
    unsigned eax, ebx, ecx, edx;
    if (!cpu_vendor_is("AuthenticAMD") || !__get_cpuid(1, &eax, &ebx, &ecx, &edx))
        return 0;
    const unsigned base = (eax >> 8) & 0xf, ext = (eax >> 20) & 0xff;
    return base == 0xf && base + ext == 0x19;
#else
    return 0;
#endif
}

#if defined(SHOAL_QUANT_HAVE_AVX512)
/* the avx512 table under its own name (filled in once, by ops_avx512_zen4) */
static struct shoal_quant_ops ops_zen4;
#endif

static const struct shoal_quant_ops *ops_avx512_zen4(void)
{
#if defined(SHOAL_QUANT_HAVE_AVX512)
    if (!ops_avx512())
        return NULL;
    ops_zen4 = shoal_quant_ops_avx512;
    ops_zen4.name = "avx512-zen4";
    return &ops_zen4;
#else
    return NULL;
#endif
}

/* AVX-512 F/BW/VL without VBMI */
static const struct shoal_quant_ops *ops_avx512bw(void)
{
#if defined(SHOAL_QUANT_HAVE_AVX512)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && has_f16c() && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
        return &shoal_quant_ops_avx512bw;
#endif
    return NULL;
}

static const struct shoal_quant_ops *ops_neon(void)
{
#if defined(SHOAL_QUANT_HAVE_NEON)
    return &shoal_quant_ops_neon;   /* NEON is part of the aarch64 baseline */
#else
    return NULL;
#endif
}

/* The CPU's ARMv8 dot-product (FEAT_DotProd: sdot) and int8 matrix multiply
 * (FEAT_I8MM: smmla) extensions, as the OS reports them; 0 where it cannot
 * say (another OS, or a macOS before 12 without these sysctl names). */
#if defined(__aarch64__) && defined(__linux__)
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1UL << 13)
#endif
static int cpu_has_dotprod(void) { return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0; }
static int cpu_has_i8mm(void) { return (getauxval(AT_HWCAP2) & HWCAP2_I8MM) != 0; }
#elif defined(__aarch64__) && defined(__APPLE__)
static int apple_feature(const char *name)
{
    int v = 0;
    size_t len = sizeof v;
    return sysctlbyname(name, &v, &len, NULL, 0) == 0 && v == 1;
}
static int cpu_has_dotprod(void) { return apple_feature("hw.optional.arm.FEAT_DotProd"); }
static int cpu_has_i8mm(void) { return apple_feature("hw.optional.arm.FEAT_I8MM"); }
#endif

/* ARMv8 NEON with sdot (quant_neon_dot.c built with +dotprod) */
static const struct shoal_quant_ops *ops_neon_dotprod(void)
{
#if defined(SHOAL_QUANT_HAVE_NEON_DOTPROD)
    if (cpu_has_dotprod())
        return &shoal_quant_ops_neon_dotprod;
#endif
    return NULL;
}

/* ... and smmla (the same file built with +dotprod+i8mm, so it needs both) */
static const struct shoal_quant_ops *ops_neon_i8mm(void)
{
#if defined(SHOAL_QUANT_HAVE_NEON_I8MM)
    if (cpu_has_dotprod() && cpu_has_i8mm())
        return &shoal_quant_ops_neon_i8mm;
#endif
    return NULL;
}

/* names in enum order (the values are stable) */
static const char *const isa_names[] = {
    [SHOAL_QUANT_ISA_AUTO] = "auto",
    [SHOAL_QUANT_ISA_SCALAR] = "scalar",
    [SHOAL_QUANT_ISA_AVX2] = "avx2",
    [SHOAL_QUANT_ISA_NEON] = "neon",
    [SHOAL_QUANT_ISA_AVX512] = "avx512",
    [SHOAL_QUANT_ISA_AVX512BW] = "avx512bw",
    [SHOAL_QUANT_ISA_NEON_DOTPROD] = "neon-dotprod",
    [SHOAL_QUANT_ISA_NEON_I8MM] = "neon-i8mm",
    [SHOAL_QUANT_ISA_AVX512_ZEN4] = "avx512-zen4",
};

#define N_ISA ((int)(sizeof isa_names / sizeof isa_names[0]))

const char *shoal_quant_isa_name(enum shoal_quant_isa isa)
{
    return (int)isa >= 0 && (int)isa < N_ISA && isa_names[isa] ? isa_names[isa] : "?";
}

int shoal_quant_isa_parse(const char *name, enum shoal_quant_isa *isa)
{
    for (int k = 0; k < N_ISA; k++)
        if (isa_names[k] && strcmp(name, isa_names[k]) == 0) {
            *isa = (enum shoal_quant_isa)k;
            return 0;
        }
    return SHOAL_EINVAL;
}

const char *shoal_quant_isa_list(void)
{
    return "auto|scalar|avx2|avx512|avx512-zen4|avx512bw|neon|neon-dotprod|neon-i8mm";
}

int shoal_quant_init(enum shoal_quant_isa isa, struct shoal_err *err)
{
    const struct shoal_quant_ops *ops = NULL;
    switch (isa) {
    case SHOAL_QUANT_ISA_AUTO:
        ops = cpu_is_amd_family_19h() ? ops_avx512_zen4() : ops_avx512();
        if (!ops)
            ops = ops_avx512bw();
        if (!ops)
            ops = ops_avx2();
        if (!ops)
            ops = ops_neon_i8mm();
        if (!ops)
            ops = ops_neon_dotprod();
        if (!ops)
            ops = ops_neon();
        if (!ops)
            ops = &shoal_quant_ops_scalar;
        break;
    case SHOAL_QUANT_ISA_SCALAR: ops = &shoal_quant_ops_scalar; break;
    case SHOAL_QUANT_ISA_AVX2: ops = ops_avx2(); break;
    case SHOAL_QUANT_ISA_NEON: ops = ops_neon(); break;
    case SHOAL_QUANT_ISA_AVX512: ops = ops_avx512(); break;
    case SHOAL_QUANT_ISA_AVX512BW: ops = ops_avx512bw(); break;
    case SHOAL_QUANT_ISA_AVX512_ZEN4: ops = ops_avx512_zen4(); break;
    case SHOAL_QUANT_ISA_NEON_DOTPROD: ops = ops_neon_dotprod(); break;
    case SHOAL_QUANT_ISA_NEON_I8MM: ops = ops_neon_i8mm(); break;
    default: break;
    }
    if (!ops)
        return shoal_err_set(err, SHOAL_EUNSUPPORTED,
                             "quant kernels '%s' requested but not available "
                             "in this build or on this CPU; active kernels "
                             "stay '%s'", shoal_quant_isa_name(isa), active_ops->name);
    active_ops = ops;
    const char *order = "";
#if defined(SHOAL_QUANT_HAVE_AVX2)
    /* the avx2 decode matvec's order (quant.h): SHOAL_AVX2_DECODE_ORDER, else
     * side by side on AMD family 19h with AVX-512 (Zen 4, where it was
     * measured the faster), one row after another elsewhere (Intel, Zen 3) */
    const char *env = getenv("SHOAL_AVX2_DECODE_ORDER");
    __builtin_cpu_init();
    const int zen4 = cpu_is_amd_family_19h() && __builtin_cpu_supports("avx512f");
    const int seq = env && !strcmp(env, "seq") ? 1 : env && !strcmp(env, "rows") ? 0 : !zen4;
    if (env && strcmp(env, "seq") && strcmp(env, "rows"))
        shoal_log(SHOAL_LOG_WARN, "quant", "SHOAL_AVX2_DECODE_ORDER='%s': expected rows or seq; "
                  "using %s (this CPU's)", env, seq ? "seq" : "rows");
    shoal_quant_avx2_set_decode_order(seq);
    order = seq ? " avx2-decode=seq" : " avx2-decode=rows";
#endif
    shoal_log(SHOAL_LOG_INFO, "quant", "kernels=%s requested=%s%s", ops->name,
              shoal_quant_isa_name(isa), order);
    return 0;
}

const struct shoal_quant_ops *shoal_quant_active_ops(void)
{
    return active_ops;
}

const char *shoal_quant_ops_name(void)
{
    return active_ops->name;
}

/* ---- public kernels -------------------------------------------------------- */

float shoal_quant_dot(enum shoal_quant_type type, int group, const float *x,
                      const void *row, int64_t n)
{
    return active_ops->dot(type, group, x, row, n);
}

void shoal_quant_linear_part(float *y, const float *x, int64_t n_tok,
                             const struct shoal_quant_weight *w, int ith,
                             int nth)
{
    int64_t r0, r1;
    shoal_split_rows(w->rows, ith, nth, &r0, &r1);
    if (r0 < r1)
        active_ops->linear_rows(y, x, n_tok, w, r0, r1);
}

int shoal_quant_linear(float *y, const float *x, int64_t n_tok,
                       const struct shoal_quant_weight *w)
{
    if (!type_ok(w->type) || !shoal_quant_group_ok(w->group) || w->rows < 1 ||
        w->cols < 1 || n_tok < 0 || w->data == NULL)
        return SHOAL_EINVAL;
    if (n_tok == 0)
        return 0;
#pragma omp parallel
    shoal_quant_linear_part(y, x, n_tok, w, omp_get_thread_num(),
                            omp_get_num_threads());
    return 0;
}
