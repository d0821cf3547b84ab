/* kv: KV cache element types, the scalar reference kernels and the choice
 * of the active table (kv.h). */
#include "kv.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "log.h"
#include "util.h"

#if defined(SHOAL_KV_HAVE_AVX2)
#include <cpuid.h>
#endif

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

static void scores_scalar(float *s, int64_t s_ld, const float *q, int64_t q_ld, int64_t n_q,
                          const void *k, int64_t stride, int64_t n_rows, int64_t n,
                          enum shoal_dtype t)
{
    float stack[512];
    float *row = t == SHOAL_DTYPE_F32 ? NULL
                 : n <= 512 ? stack : shoal_xmalloc((size_t)n * sizeof(float));
    for (int64_t j = 0; j < n_rows; j++) {
        const void *kr = shoal_kv_row(k, j, stride, t);
        if (row)
            shoal_to_f32(row, kr, t, (size_t)n);
        for (int64_t r = 0; r < n_q; r++)
            s[r * s_ld + j] = shoal_dot_f32(q + r * q_ld, row ? row : kr, n);
    }
    if (row && row != stack)
        free(row);
}

void shoal_kv_mix_cols_scalar(float *out, const float *p, const void *v, int64_t stride,
                              int64_t n_rows, int64_t d0, int64_t d1, enum shoal_dtype t)
{
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

static void mix_scalar(float *out, int64_t out_ld, const float *p, int64_t p_ld, int64_t n_q,
                       const void *v, int64_t stride, int64_t n_rows, int64_t n,
                       enum shoal_dtype t)
{
    for (int64_t r = 0; r < n_q; r++)
        shoal_kv_mix_cols_scalar(out + r * out_ld, p + r * p_ld, v, stride, n_rows, 0, n, t);
}

/* one row of shoal_kv_softmax_scalar. The divisions and the sum run as
 * loops of their own, the divisions vectorized by the compiler (one IEEE
 * division per element either way), the sum in element order. */
static void softmax_row(float *sc, int64_t n, float div, const float *sink)
{
    float mx = sink ? *sink : -INFINITY;
    for (int64_t j = 0; j < n; j++)
        sc[j] = sc[j] / div;
    for (int64_t j = 0; j < n; j++)
        if (sc[j] > mx)
            mx = sc[j];
    for (int64_t j = 0; j < n; j++)
        sc[j] = shoal_expf(sc[j] - mx);
    float sum = 0.0f;
    for (int64_t j = 0; j < n; j++)
        sum += sc[j];
    if (sink)
        sum += shoal_expf(*sink - mx);
    for (int64_t j = 0; j < n; j++)
        sc[j] = sc[j] / sum;
}

void shoal_kv_softmax_scalar(float *sc, int64_t ld, int64_t n_rows, int64_t n, float div,
                             const float *sinks)
{
    for (int64_t r = 0; r < n_rows; r++)
        softmax_row(sc + r * ld, n, div, sinks ? sinks + r : NULL);
}

const struct shoal_kv_ops shoal_kv_ops_scalar = {
    .name = "scalar",
    .scores = scores_scalar,
    .mix = mix_scalar,
    .softmax = shoal_kv_softmax_scalar,
};

/* ---- selection ------------------------------------------------------------ */

/* Written only by shoal_kv_init (main thread, while no kernel runs). */
static const struct shoal_kv_ops *active_ops = &shoal_kv_ops_scalar;

void shoal_kv_scores(float *s, const float *q, const void *k, int64_t stride,
                     int64_t n_rows, int64_t n, enum shoal_dtype t)
{
    active_ops->scores(s, 0, q, 0, 1, k, stride, n_rows, n, t);
}

void shoal_kv_scores_many(float *s, int64_t s_ld, const float *q, int64_t q_ld, int64_t n_q,
                          const void *k, int64_t stride, int64_t n_rows, int64_t n,
                          enum shoal_dtype t)
{
    active_ops->scores(s, s_ld, q, q_ld, n_q, k, stride, n_rows, n, t);
}

void shoal_kv_mix(float *out, const float *p, const void *v, int64_t stride,
                  int64_t n_rows, int64_t n, enum shoal_dtype t)
{
    memset(out, 0, (size_t)n * sizeof(float));
    active_ops->mix(out, 0, p, 0, 1, v, stride, n_rows, n, t);
}

/* ---- attention over a batch of queries ------------------------------------ */

int64_t shoal_kv_attn_round(int64_t n_head, int64_t scores_ld, int64_t n_batch)
{
    const int64_t per_token = n_head * scores_ld * (int64_t)sizeof(float);
    int64_t r = per_token > 0 ? ((int64_t)4 << 20) / per_token : 1;
    const int64_t cap = n_batch < 8 ? n_batch : 8;
    if (r > cap)
        r = cap;
    return r < 1 ? 1 : r;
}

/* items u0 .. u1-1 of n_units, thread ith of nth (contiguous, even) */
static void kv_share(int64_t n_units, int ith, int nth, int64_t *u0, int64_t *u1)
{
    const int64_t per = n_units / nth, rem = n_units % nth;
    *u0 = ith * per + (ith < rem ? ith : rem);
    *u1 = *u0 + per + (ith < rem ? 1 : 0);
}

/* the first cache row token t (0-based in the batch) sees */
static int64_t kv_first(const struct shoal_kv_attn *a, int64_t t)
{
    const int64_t pos = a->n_past + t;
    return a->window > 0 && pos - a->window + 1 > 0 ? pos - a->window + 1 : 0;
}

/* the rows of tile [ja, jb) token t sees: [*j0, *j1); 0 if none */
static int kv_clip(const struct shoal_kv_attn *a, int64_t t, int64_t ja, int64_t jb,
                   int64_t *j0, int64_t *j1)
{
    const int64_t f = kv_first(a, t), e = a->n_past + t + 1;
    *j0 = f > ja ? f : ja;
    *j1 = e < jb ? e : jb;
    return *j0 < *j1;
}

/* Prefetch rows j0 .. j1-1 of a cache slice into L2: bytes from byte
 * offset off of each row (rows row_bytes apart). Only a hint: changes no
 * value. Not into L1: a tile of one KV head's rows is a row of the cache
 * apart, so the next tile maps onto the L1 sets of this one (16 rows of
 * 2 KiB are 32 KiB) and would evict it; at 16 K tokens of f32 on a Zen 3,
 * 39.5 against 44.4 ms for 6 layers. */
static void kv_prefetch(const void *base, int64_t j0, int64_t j1, size_t row_bytes, size_t off,
                        size_t bytes)
{
    for (int64_t j = j0; j < j1; j++) {
        const char *r = (const char *)base + (size_t)j * row_bytes + off;
        for (size_t b = 0; b < bytes; b += 64)
            __builtin_prefetch(r + b, 0, 2);
    }
}

/* Bytes of one KV head's rows per tile (kv_tile_rows); changed only by
 * shoal_kv_set_tile_bytes, while no kernel runs. */
static int64_t tile_bytes = 8192;

int64_t shoal_kv_tile_bytes(void) { return tile_bytes; }

void shoal_kv_set_tile_bytes(int64_t bytes)
{
    tile_bytes = bytes < 512 ? 512 : bytes;
}

/* Rows of cache per tile: tile_bytes of one KV head's keys (or values), so
 * that a tile and the next one (prefetched) stay in L1 while every query of
 * a round uses it (8 KiB measured best of 8, 16, 32 on Zen 5 at 16 K; on
 * Zen 4, 32 KiB L1, attn_bench's decode ran ~10 % faster at 4 KiB but the
 * engine did not: docs/BENCHMARKS.md, "KV cache dtype and
 * attention", Zen 4). */
static int64_t kv_tile_rows(const struct shoal_kv_attn *a)
{
    const int64_t row = a->head_dim * (int64_t)shoal_dtype_size(a->t);
    const int64_t r = tile_bytes / (row > 0 ? row : 1);
    return r < 8 ? 8 : r;
}

/* Phase A: scores of tokens r0 .. r1-1 (every query head) over their rows,
 * split by (row tile, KV head), KV head fastest, so that a thread streams
 * whole cache rows in order; the n_rep heads of one token and KV head run
 * as one multi-query kernel call. */
static void kv_phase_scores(const struct shoal_kv_attn *a, int64_t r0, int64_t r1,
                            int ith, int nth)
{
    const int64_t hd = a->head_dim, nh = a->n_head, n_rep = nh / a->n_head_kv;
    const int64_t nkv = a->n_head_kv * hd, nq = nh * hd, ld = a->scores_ld;
    const int64_t jlo = kv_first(a, r0), jhi = a->n_past + r1, tile = kv_tile_rows(a);
    const int64_t n_tiles = (jhi - jlo + tile - 1) / tile;
    const size_t es = shoal_dtype_size(a->t);
    int64_t u0, u1;
    kv_share(a->n_head_kv * n_tiles, ith, nth, &u0, &u1);
    for (int64_t u = u0; u < u1; u++) {
        const int64_t g = u % a->n_head_kv, ja = jlo + (u / a->n_head_kv) * tile;
        const int64_t jb = ja + tile < jhi ? ja + tile : jhi;
        if (u + 1 < u1) {   /* the next unit's keys, while these compute */
            const int64_t gn = (u + 1) % a->n_head_kv, jn = jlo + ((u + 1) / a->n_head_kv) * tile;
            kv_prefetch(a->k, jn, jn + tile < jhi ? jn + tile : jhi, (size_t)nkv * es,
                        (size_t)(gn * hd) * es, (size_t)hd * es);
        }
        for (int64_t t = r0, j0, j1; t < r1; t++) {
            if (!kv_clip(a, t, ja, jb, &j0, &j1))
                continue;
            active_ops->scores(a->scores + ((t - r0) * nh + g * n_rep) * ld + j0, ld,
                               a->q + t * nq + g * n_rep * hd, hd, n_rep,
                               (const char *)a->k + (size_t)(j0 * nkv + g * hd) * es, nkv,
                               j1 - j0, hd, a->t);
        }
    }
}

/* Phase C: output columns of tokens r0 .. r1-1, items u0 .. u1-1 of the
 * (KV head g, block of w columns) pairs: every item over each row tile in
 * turn (so that the thread streams its share of each cache row in order),
 * each column summed in row order. */
static void kv_phase_mix(const struct shoal_kv_attn *a, int64_t r0, int64_t r1, int64_t u0,
                         int64_t u1, int64_t w)
{
    const int64_t hd = a->head_dim, nh = a->n_head, n_rep = nh / a->n_head_kv;
    const int64_t vd = a->v_dim > 0 ? a->v_dim : hd;
    const int64_t nkv = a->n_head_kv * hd, nq = nh * hd, ld = a->scores_ld, n_cb = vd / w;
    const int64_t jlo = kv_first(a, r0), jhi = a->n_past + r1, tile = kv_tile_rows(a);
    const size_t es = shoal_dtype_size(a->t);
    for (int64_t u = u0; u < u1; u++)
        for (int64_t t = r0; t < r1; t++)
            for (int64_t r = 0; r < n_rep; r++)
                memset(a->out + t * nq + ((u / n_cb) * n_rep + r) * hd + (u % n_cb) * w, 0,
                       (size_t)w * sizeof(float));
    for (int64_t ja = jlo; ja < jhi; ja += tile) {
        const int64_t jb = ja + tile < jhi ? ja + tile : jhi;
        const int64_t jn = jb + tile < jhi ? jb + tile : jhi;
        for (int64_t u = u0; u < u1; u++) {
            const int64_t g = u / n_cb, d0 = (u % n_cb) * w;
            /* this item's values of the next tile, while these compute */
            kv_prefetch(a->v, jb, jn, (size_t)nkv * es, (size_t)(g * hd + d0) * es,
                        (size_t)w * es);
            for (int64_t t = r0, j0, j1; t < r1; t++) {
                if (!kv_clip(a, t, ja, jb, &j0, &j1))
                    continue;
                active_ops->mix(a->out + t * nq + g * n_rep * hd + d0, hd,
                                a->scores + ((t - r0) * nh + g * n_rep) * ld + j0, ld, n_rep,
                                (const char *)a->v + (size_t)(j0 * nkv + g * hd + d0) * es,
                                nkv, j1 - j0, w, a->t);
            }
        }
    }
}

void shoal_kv_attend(const struct shoal_kv_attn *a, int ith, int nth)
{
    const int64_t hd = a->head_dim, nh = a->n_head, nkv_h = a->n_head_kv;
    const int64_t vd = a->v_dim > 0 ? a->v_dim : hd;
    const float sq = a->score_div > 0 ? a->score_div : sqrtf((float)hd);
    /* mix columns per work item: halve while there are fewer than two
     * items a thread and the halves stay whole 32-column blocks */
    int64_t w = vd;
    while (w % 64 == 0 && nkv_h * (vd / w) < 2 * (int64_t)nth)
        w /= 2;
    for (int64_t r0 = 0; r0 < a->n; r0 += a->round) {
        const int64_t r1 = r0 + a->round < a->n ? r0 + a->round : a->n;
        int64_t u0, u1;
        kv_phase_scores(a, r0, r1, ith, nth);
#pragma omp barrier
        kv_share((r1 - r0) * nh, ith, nth, &u0, &u1);
        for (int64_t u = u0, n_u; u < u1; u += n_u) {   /* the heads of one token at once */
            const int64_t t = r0 + u / nh, h = u % nh, j0 = kv_first(a, t);
            n_u = nh - h < u1 - u ? nh - h : u1 - u;
            active_ops->softmax(a->scores + u * a->scores_ld + j0, a->scores_ld, n_u,
                                a->n_past + t + 1 - j0, sq, a->sinks ? a->sinks + h : NULL);
        }
#pragma omp barrier
        kv_share(nkv_h * (vd / w), ith, nth, &u0, &u1);
        kv_phase_mix(a, r0, r1, u0, u1, w);
        if (r1 < a->n) {
#pragma omp barrier
        }
    }
}

const char *shoal_kv_ops_name(void)
{
    return active_ops->name;
}

/* AVX2 + F16C (every AVX2 CPU has F16C, but check both: a hypervisor may
 * hide either); __builtin_cpu_supports also checks that the OS saves the
 * YMM registers. F16C is read from CPUID leaf 1 (ECX bit 29): clang's
 * __builtin_cpu_supports does not know "f16c". */
static const struct shoal_kv_ops *ops_avx2(void)
{
#if defined(SHOAL_KV_HAVE_AVX2)
    unsigned eax, ebx, ecx, edx;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) &&
        (ecx & (1u << 29)))
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
