/* synth_write: the bytes `shoal synth` writes (synth.h): every weight from
 * a generator seeded by (seed, tensor, row), so the same options give the
 * same bytes; experts a batch at a time, one batch generated while a writer
 * thread writes the other; the manifest, the fingerprint and the layout by
 * the converter's rules (container_write.h). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "model.h"
#include "quant.h"
#include "synth.h"
#include "util.h"

#define BATCH_BYTES (64u << 20)  /* expert blobs generated per batch, at most */

#define MAGIC_DENSE shoal_container_magic_dense
#define MAGIC_EXPERTS shoal_container_magic_experts

/* ---- the generator ----------------------------------------------------------- */

enum init_kind {
    INIT_EMB,        /* N(0,1)-like, column c0 = C */
    INIT_ONES,       /* norms */
    INIT_ONES_NOC0,  /* norms that zero c0 (attn_norm, out_norm) */
    INIT_ZERO,       /* biases */
    INIT_IN,         /* uniform with variance var, column c0 zero */
    INIT_OUT,        /* uniform with variance var, row c0 zero */
    INIT_ROUTER,
};

static void progress(struct synth *sy)
{
    if (!sy->tty)
        return;
    double el = shoal_time_s() - sy->t0;
    double rate = el > 0 ? (double)sy->done / el : 0;
    fprintf(stderr, "\rsynth %5.1f%%  %.0f/%.0f MB  %.0f MB/s   ",
            sy->total ? 100.0 * (double)sy->done / (double)sy->total : 100.0,
            (double)sy->done / 1e6, (double)sy->total / 1e6, rate / 1e6);
    if (sy->done >= sy->total)
        fprintf(stderr, "\n");
}

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static enum init_kind classify(const struct synth *sy, const struct shoal_weight_slot *s,
                               double *var)
{
    const double E = (double)sy->cfg.n_embd;
    *var = 0;
    if (!strcmp(s->name, "tok_embd"))
        return INIT_EMB;
    if (!strcmp(s->name, "out_norm") || ends_with(s->name, ".attn_norm"))
        return INIT_ONES_NOC0;
    if (!strcmp(s->name, "lm_head")) {
        *var = sy->var_head;
        return INIT_IN;
    }
    if (ends_with(s->name, ".bias") || ends_with(s->name, ".router_bias") ||
        ends_with(s->name, ".attn_sinks"))
        return INIT_ZERO;
    if (ends_with(s->name, "_norm"))
        return INIT_ONES;
    if (ends_with(s->name, ".router"))
        return INIT_ROUTER;
    if (ends_with(s->name, ".attn_q") || ends_with(s->name, ".attn_k") ||
        ends_with(s->name, ".attn_v") || ends_with(s->name, ".attn_q_a") ||
        ends_with(s->name, ".attn_kv_a")) {
        *var = sy->var_att_in[s->il];
        return INIT_IN;
    }
    if (ends_with(s->name, ".attn_q_b") || ends_with(s->name, ".attn_kv_b")) {
        /* MLA up-projections read an RMS-normed latent: unit-variance outputs */
        *var = 1.0 / (double)s->cols;
        return INIT_IN;
    }
    if (ends_with(s->name, ".attn_output")) {
        *var = sy->p_att / (double)s->cols;
        return INIT_OUT;
    }
    if (ends_with(s->name, ".w_gate") || ends_with(s->name, ".w_up")) {
        *var = sy->sigma[s->il] * sy->sigma[s->il];
        return INIT_IN;
    }
    if (ends_with(s->name, ".w_down")) {
        *var = strstr(s->name, ".ffn.") ? sy->var_dense_out : sy->var_ffn_out;
        return INIT_OUT;
    }
    *var = 0.5 / E; /* shexp_gate and anything new: small, c0 ignored */
    return INIT_IN;
}

/* Row r of a dense tensor in f32. */
static void dense_row(const struct synth *sy, const struct shoal_weight_slot *s,
                      enum init_kind kind, double var, int64_t r, int64_t cols, float *out)
{
    struct rng g = rng_for(sy->seed, str_hash(s->name), (uint64_t)r, 1);
    const float a = (float)sqrt(3.0 * var);
    const int64_t c0 = sy->c0;
    switch (kind) {
    case INIT_EMB: {
        const float u = 1.7320508f; /* variance 1 */
        for (int64_t i = 0; i < cols; i++)
            out[i] = u * rng_sym(&g);
        out[c0] = (float)sy->C;
        break;
    }
    case INIT_ONES:
    case INIT_ONES_NOC0:
        for (int64_t i = 0; i < cols; i++)
            out[i] = 1.0f;
        if (kind == INIT_ONES_NOC0)
            out[c0] = 0.0f;
        break;
    case INIT_ZERO:
        memset(out, 0, (size_t)cols * sizeof *out);
        break;
    case INIT_IN:
        for (int64_t i = 0; i < cols; i++)
            out[i] = a * rng_sym(&g);
        if (cols == sy->cfg.n_embd)
            out[c0] = 0.0f;
        break;
    case INIT_OUT:
        for (int64_t i = 0; i < cols; i++)
            out[i] = r == c0 ? 0.0f : a * rng_sym(&g);
        break;
    case INIT_ROUTER: {
        const int64_t il = s->il, ne = sy->cfg.n_expert;
        const float sa = (float)(sy->sigma[il] * 1.7320508);
        for (int64_t i = 0; i < cols; i++)
            out[i] = sa * rng_sym(&g);
        out[c0] = (float)(sy->layer_bias[il * ne + r] / sy->u0[il]);
        break;
    }
    }
}

static int write_dense(struct synth *sy, const struct shoal_weight_slot *s)
{
    enum shoal_dtype t = shoal_container_slot_dtype(s, sy->experts_dtype, sy->dense_dtype);
    const int64_t rows = s->cols ? s->rows : 1, cols = s->cols ? s->cols : s->rows;
    struct shoal_weight tw = {.dtype = t, .rows = rows, .cols = cols, .group = sy->group};
    const size_t row_bytes = shoal_weight_row_bytes(&tw);
    const uint64_t bytes = (uint64_t)rows * row_bytes;
    const uint64_t off = shoal_container_layout_slot(&sy->written, s, t, sy->group, bytes);
    double var;
    enum init_kind kind = classify(sy, s, &var);
    int64_t per = (int64_t)((8u << 20) / row_bytes);
    if (per < 1)
        per = 1;
    if (per > rows)
        per = rows;
    if ((size_t)(per * cols) > sy->rowbuf_cap) {
        free(sy->rowbuf);
        sy->rowbuf_cap = (size_t)(per * cols);
        sy->rowbuf = shoal_xmalloc(sy->rowbuf_cap * sizeof(float));
    }
    if ((size_t)per * row_bytes > sy->chunk_cap) {
        free(sy->chunk);
        sy->chunk_cap = (size_t)per * row_bytes;
        sy->chunk = shoal_xmalloc(sy->chunk_cap);
    }
    XXH64_state_t *h = XXH64_createState();
    XXH64_reset(h, 0);
    int rc = 0;
    double tg = shoal_time_s();
    for (int64_t r0 = 0; r0 < rows && !rc; r0 += per) {
        const int64_t r1 = r0 + per < rows ? r0 + per : rows;
        float *rb = sy->rowbuf;
        unsigned char *ck = sy->chunk;
#pragma omp parallel for schedule(static)
        for (int64_t r = r0; r < r1; r++) {
            float *row = rb + (r - r0) * cols;
            dense_row(sy, s, kind, var, r, cols, row);
            unsigned char *dst = ck + (size_t)(r - r0) * row_bytes;
            if (t == SHOAL_DTYPE_F32) {
                memcpy(dst, row, (size_t)cols * sizeof(float));
            } else if (t == SHOAL_DTYPE_BF16) {
                for (int64_t i = 0; i < cols; i++) {
                    uint16_t b = shoal_f32_to_bf16(row[i]);
                    memcpy(dst + 2 * i, &b, 2);
                }
            } else {
                shoal_quant_quantize_row(t == SHOAL_DTYPE_INT8 ? SHOAL_QUANT_INT8
                                                               : SHOAL_QUANT_INT4,
                                         sy->group, dst, row, SHOAL_DTYPE_F32, cols, NULL);
            }
        }
        const size_t n = (size_t)(r1 - r0) * row_bytes;
        XXH64_update(h, sy->chunk, n);
        rc = shoal_pwrite_all(sy->fd_dense, sy->chunk, n, off + (uint64_t)r0 * row_bytes,
                       sy->dense_path, sy->err);
    }
    sy->t_gen += shoal_time_s() - tg;
    uint64_t sum = XXH64_digest(h);
    XXH64_freeState(h);
    if (rc)
        return rc;
    json_array_append_new(sy->tensors, shoal_container_dense_entry(s, t, sy->group, off, bytes,
                                                                    sum));
    shoal_container_fp_dense(sy->fp, s, t, sy->group, sum);
    sy->done += bytes;
    progress(sy);
    return 0;
}

/* One row of expert component comp (0 gate, 1 up, 2 down) straight in the
 * container's element type: random quants with per-group scales around d. */
static void expert_row(const struct synth *sy, int64_t il, int64_t ie, int comp, int64_t r,
                       unsigned char *dst)
{
    const struct {
        int64_t rows, cols;
    } shp[3] = {{sy->cfg.n_ff_exp, sy->cfg.n_embd}, {sy->cfg.n_ff_exp, sy->cfg.n_embd},
                {sy->cfg.n_embd, sy->cfg.n_ff_exp}};
    const int64_t cols = shp[comp].cols, c0 = sy->c0;
    const int zero_row = comp == 2 && r == c0;       /* nothing writes channel c0 */
    const int64_t zero_col = comp < 2 ? c0 : -1;      /* experts ignore channel c0 */
    const double var = comp < 2 ? sy->sigma[il] * sy->sigma[il] : sy->var_exp_out;
    struct rng g = rng_for(sy->seed, ((uint64_t)il << 32) | (uint64_t)ie, (uint64_t)comp,
                           (uint64_t)r);
    const enum shoal_dtype t = sy->experts_dtype;
    if (t == SHOAL_DTYPE_F32 || t == SHOAL_DTYPE_BF16) {
        const float a = (float)sqrt(3.0 * var);
        for (int64_t i = 0; i < cols; i++) {
            float v = zero_row || i == zero_col ? 0.0f : a * rng_sym(&g);
            if (t == SHOAL_DTYPE_F32) {
                memcpy(dst + 4 * i, &v, 4);
            } else {
                uint16_t b = shoal_f32_to_bf16(v);
                memcpy(dst + 2 * i, &b, 2);
            }
        }
        return;
    }
    const int G = sy->group;
    const int64_t ng = (cols + G - 1) / G;
    const enum shoal_quant_type qt = t == SHOAL_DTYPE_INT8 ? SHOAL_QUANT_INT8 : SHOAL_QUANT_INT4;
    const size_t rb = shoal_quant_row_bytes(qt, cols, G);
    /* E[q^2]: int4 q in -7..7 with 0 twice as likely = 17.5; int8 q in
     * -127..127 with 0 twice as likely = 5397.5; scale factor spread
     * E[(0.75 + 0.5u)^2] = 0.5625 + 0.375 + 0.25/3 = 1.0208 */
    const double eq2 = qt == SHOAL_QUANT_INT4 ? 17.5 : 5397.5;
    const float d = (float)sqrt(var / (eq2 * 1.0208333));
    for (int64_t k = 0; k < ng; k++) {
        float s = zero_row ? 0.0f : d * (0.75f + 0.5f * rng_unit(&g));
        memcpy(dst + 4 * k, &s, 4);
    }
    unsigned char *q = dst + 4 * ng;
    const size_t nq = qt == SHOAL_QUANT_INT4 ? (size_t)(cols + 1) / 2 : (size_t)cols;
    if (zero_row) {
        memset(q, qt == SHOAL_QUANT_INT4 ? 0x88 : 0x00, nq);
    } else {
        size_t i = 0;
        for (; i + 8 <= nq; i += 8) {
            uint64_t w = rng_next(&g);
            if (qt == SHOAL_QUANT_INT4) {
                /* nibble 0 would be q = -8, never written by the quantizer:
                 * turn it into 8 (q = 0) */
                uint64_t x = w | (w >> 1);
                x |= x >> 2;
                w |= (~x & 0x1111111111111111ULL) << 3;
            }
            memcpy(q + i, &w, 8);
        }
        if (i < nq) {
            uint64_t w = rng_next(&g);
            for (; i < nq; i++, w >>= 8) {
                unsigned char b = (unsigned char)w;
                if (qt == SHOAL_QUANT_INT4) {
                    if (!(b & 0x0f))
                        b |= 0x08;
                    if (!(b & 0xf0))
                        b |= 0x80;
                }
                q[i] = b;
            }
        }
        if (qt == SHOAL_QUANT_INT8) {
            for (size_t j = 0; j < nq; j++)
                if (q[j] == 0x80)   /* -128: also never written by the quantizer */
                    q[j] = 0;
            if (zero_col >= 0)
                q[zero_col] = 0;
        } else {
            if (zero_col >= 0) {
                unsigned char *b = q + zero_col / 2;
                *b = zero_col % 2 ? (unsigned char)((*b & 0x0f) | 0x80)
                                  : (unsigned char)((*b & 0xf0) | 0x08);
            }
            if (cols % 2)
                q[nq - 1] &= 0x0f;   /* padding nibble */
        }
    }
    memset(q + nq, 0, rb - 4 * (size_t)ng - nq);
}

/* The expert writer: pwrite of one batch at a time, so the next batch is
 * generated while this one goes to disk. */
static void *writer_main(void *arg)
{
    struct synth *sy = arg;
    pthread_mutex_lock(&sy->wmu);
    for (;;) {
        while (!sy->wpending && !sy->wquit)
            pthread_cond_wait(&sy->wcv, &sy->wmu);
        if (!sy->wpending && sy->wquit)
            break;
        const unsigned char *buf = sy->wbuf;
        size_t len = sy->wlen;
        uint64_t off = sy->woff;
        pthread_mutex_unlock(&sy->wmu);
        double t = shoal_time_s();
        int rc = shoal_pwrite_all(sy->fd_exp, buf, len, off, sy->exp_path, &sy->werr);
        t = shoal_time_s() - t;
        pthread_mutex_lock(&sy->wmu);
        sy->wbusy += t;
        if (rc && !sy->wrc)
            sy->wrc = rc;
        sy->wpending = 0;
        pthread_cond_broadcast(&sy->wcv);
    }
    pthread_mutex_unlock(&sy->wmu);
    return NULL;
}

/* Wait until the writer is idle; returns its first error (err copied). */
static int writer_wait(struct synth *sy)
{
    double t = shoal_time_s();
    pthread_mutex_lock(&sy->wmu);
    while (sy->wpending)
        pthread_cond_wait(&sy->wcv, &sy->wmu);
    int rc = sy->wrc;
    pthread_mutex_unlock(&sy->wmu);
    sy->t_write += shoal_time_s() - t;
    if (rc)
        *sy->err = sy->werr;
    return rc;
}

static int writer_submit(struct synth *sy, const unsigned char *buf, size_t len, uint64_t off)
{
    int rc = writer_wait(sy);
    if (rc)
        return rc;
    pthread_mutex_lock(&sy->wmu);
    sy->wbuf = buf;
    sy->wlen = len;
    sy->woff = off;
    sy->wpending = 1;
    pthread_cond_broadcast(&sy->wcv);
    pthread_mutex_unlock(&sy->wmu);
    return 0;
}

static void writer_stop(struct synth *sy)
{
    if (!sy->wstarted)
        return;
    pthread_mutex_lock(&sy->wmu);
    sy->wquit = 1;
    pthread_cond_broadcast(&sy->wcv);
    pthread_mutex_unlock(&sy->wmu);
    pthread_join(sy->wthread, NULL);
    sy->wstarted = 0;
}

/* Generate, hash and write every expert of MoE layer il. */
static int write_layer_experts(struct synth *sy, int64_t il)
{
    const int64_t NE = sy->cfg.n_expert;
    const uint64_t bb = sy->lay.blob_bytes;
    const int64_t rows[3] = {sy->cfg.n_ff_exp, sy->cfg.n_ff_exp, sy->cfg.n_embd};
    size_t rbytes[3];
    for (int c = 0; c < 3; c++)
        rbytes[c] = (size_t)(sy->lay.comp_bytes[c] / (uint64_t)rows[c]);
    const int64_t rows_per_blob = rows[0] + rows[1] + rows[2];
    const uint64_t layer_off = sy->exp_off;
    json_t *sums = json_array();
    int rc = 0;
    for (int64_t e0 = 0; e0 < NE && !rc; e0 += sy->batch_blobs) {
        const int64_t nb = e0 + sy->batch_blobs < NE ? sy->batch_blobs : NE - e0;
        double tg = shoal_time_s();
        unsigned char *batch = sy->bufs[sy->cur];
        sy->cur ^= 1;
        uint64_t *sumv = sy->sums;
        const struct shoal_container_layout *lay = &sy->lay;
        const struct synth *csy = sy;
#pragma omp parallel
        {
#pragma omp for schedule(static)
            for (int64_t j = 0; j < nb; j++) {
                /* zero padding between components and at the end */
                unsigned char *blob = batch + (size_t)j * bb;
                for (int c = 0; c < lay->n_comp; c++) {
                    /* gpt_oss's biases (components 3..5) are zeros too */
                    uint64_t end = c < 3 ? lay->comp_off[c] + lay->comp_bytes[c]
                                         : lay->comp_off[c];
                    uint64_t next = c + 1 < lay->n_comp ? lay->comp_off[c + 1] : bb;
                    memset(blob + end, 0, (size_t)(next - end));
                }
            }
#pragma omp for schedule(static)
            for (int64_t w = 0; w < nb * rows_per_blob; w++) {
                const int64_t j = w / rows_per_blob;
                int64_t r = w % rows_per_blob;
                int c = 0;
                while (r >= rows[c]) {
                    r -= rows[c];
                    c++;
                }
                unsigned char *dst = batch + (size_t)j * bb + lay->comp_off[c] +
                                     (size_t)r * rbytes[c];
                expert_row(csy, il, e0 + j, c, r, dst);
            }
#pragma omp for schedule(static)
            for (int64_t j = 0; j < nb; j++)
                sumv[j] = XXH64(batch + (size_t)j * bb, bb, 0);
        }
        sy->t_gen += shoal_time_s() - tg;
        rc = writer_submit(sy, batch, (size_t)nb * bb, sy->exp_off);
        for (int64_t j = 0; j < nb && !rc; j++) {
            char hex[17];
            shoal_container_hex(sumv[j], hex);
            json_array_append_new(sums, json_string(hex));
            shoal_container_fp_expert(sy->fp, il, e0 + j, sumv[j]);
        }
        sy->exp_off += (uint64_t)nb * bb;
        sy->done += (uint64_t)nb * bb;
        progress(sy);
    }
    if (rc) {
        json_decref(sums);
        return rc;
    }
    json_array_append_new(sy->layers, shoal_container_layer_entry(il, layer_off, sums));
    return 0;
}

static int write_slot(const struct shoal_weight_slot *s, void *user)
{
    struct synth *sy = user;
    if (s->kv_b_part)   /* synth writes kv_b_proj whole */
        return 0;
    if (s->kind == SHOAL_SLOT_DENSE)
        return write_dense(sy, s);
    if (s->ie == 0 && s->comp == 0)
        return write_layer_experts(sy, s->il);
    return 0;
}

/* ---- the container ------------------------------------------------------------- */

int synth_write(struct synth *sy, const char *dst, int force, int argc, char **argv)
{
    const char *model_type = sy->cfg.family->model_type;
    int rc = 0;
    json_t *manifest = NULL, *meta = NULL;
    char *tmp, *p_cfg = NULL, *p_meta = NULL, *p_man = NULL;
    if (shoal_container_make_tmp(dst, &tmp, sy->err)) {
        shoal_cli_error("synth: %s", sy->err->msg);
        return 1;
    }
    sy->dense_path = shoal_path_join(tmp, "dense.bin");
    sy->exp_path = shoal_path_join(tmp, "experts.bin");
    sy->tensors = json_array();
    sy->layers = json_array();
    sy->fp = XXH64_createState();
    XXH64_reset(sy->fp, 0);
    sy->batch_blobs = (int64_t)(BATCH_BYTES / sy->lay.blob_bytes);
    if (sy->batch_blobs < 2)
        sy->batch_blobs = 2;
    if (sy->batch_blobs > sy->cfg.n_expert)
        sy->batch_blobs = sy->cfg.n_expert;
    sy->sums = shoal_xmalloc((size_t)sy->batch_blobs * sizeof *sy->sums);
    for (int b = 0; b < 2; b++) {
        if (posix_memalign((void **)&sy->bufs[b], SHOAL_CONTAINER_ALIGN,
                           (size_t)sy->batch_blobs * sy->lay.blob_bytes) != 0) {
            sy->bufs[b] = NULL;
            rc = shoal_err_set(sy->err, SHOAL_ENOMEM, "cannot allocate %" PRIu64 " bytes",
                               (uint64_t)sy->batch_blobs * sy->lay.blob_bytes);
            goto fail;
        }
    }
    sy->fd_dense = open(sy->dense_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    /* experts.bin: O_DIRECT where the file system allows it (every batch is
     * 4 KiB aligned in memory, length and offset): large writes without
     * the page cache, which is several times faster here than buffered */
#ifdef O_DIRECT
    sy->fd_exp = open(sy->exp_path, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
    sy->exp_direct = sy->fd_exp >= 0;
    if (sy->fd_exp < 0 && errno == EINVAL)
#endif
        sy->fd_exp = open(sy->exp_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (sy->fd_dense < 0 || sy->fd_exp < 0) {
        int e = errno;
        rc = shoal_err_set(sy->err, -e, "cannot create files in '%s': %s", tmp, strerror(e));
        goto fail;
    }
    pthread_mutex_init(&sy->wmu, NULL);
    pthread_cond_init(&sy->wcv, NULL);
    sy->wmu_init = 1;
    if (pthread_create(&sy->wthread, NULL, writer_main, sy) != 0) {
        rc = shoal_err_set(sy->err, SHOAL_EIO, "cannot start the writer thread");
        goto fail;
    }
    sy->wstarted = 1;
    shoal_container_layout_init(&sy->written, &sy->cfg);
    sy->exp_off = SHOAL_CONTAINER_HEADER_BYTES;
    shoal_container_fp_head(sy->fp, model_type, sy->experts_dtype, sy->group,
                            sy->lay.blob_bytes);
    sy->t0 = shoal_time_s();
    {
        struct shoal_model model;
        memset(&model, 0, sizeof model);
        model.cfg = sy->cfg;
        shoal_model_alloc_layers(&model);
        rc = shoal_model_walk(&model, write_slot, sy);
        for (int64_t il = 0; il < sy->cfg.n_layer; il++)
            free(model.layers[il].experts);
        free(model.layers);
    }
    if (!rc)
        rc = writer_wait(sy);
    writer_stop(sy);
    if (rc)
        goto fail;
    uint64_t fingerprint = XXH64_digest(sy->fp);
    uint64_t dense_bytes = shoal_container_layout_dense_bytes(&sy->written);
    double t_sync = shoal_time_s();
    if (ftruncate(sy->fd_dense, (off_t)dense_bytes) != 0) {
        int e = errno;
        rc = shoal_err_set(sy->err, -e, "cannot size '%s': %s", sy->dense_path, strerror(e));
        goto fail;
    }
    if (sy->exp_direct) {
        /* the header is one small unaligned write: through the page cache */
        rc = shoal_container_sync_close(sy->fd_exp, sy->exp_path, 1, sy->err);
        sy->fd_exp = rc ? -1 : open(sy->exp_path, O_WRONLY);
        if (!rc && sy->fd_exp < 0) {
            int e = errno;
            rc = shoal_err_set(sy->err, -e, "cannot reopen '%s': %s", sy->exp_path, strerror(e));
        }
        if (rc)
            goto fail;
    }
    if ((rc = shoal_container_write_header(sy->fd_dense, MAGIC_DENSE, dense_bytes, fingerprint, sy->dense_path,
                           sy->err)) ||
        (rc = shoal_container_write_header(sy->fd_exp, MAGIC_EXPERTS, sy->exp_off, fingerprint, sy->exp_path,
                           sy->err)))
        goto fail;
    rc = shoal_container_sync_close(sy->fd_dense, sy->dense_path, 1, sy->err);
    sy->fd_dense = -1;
    if (!rc)
        rc = shoal_container_sync_close(sy->fd_exp, sy->exp_path, 1, sy->err);
    sy->fd_exp = -1;
    if (rc)
        goto fail;
    t_sync = shoal_time_s() - t_sync;
    double t_all = shoal_time_s() - sy->t0;

    /* config.json, synth.json (how it was made, the routing targets), then
     * the manifest last */
    p_cfg = shoal_path_join(tmp, "config.json");
    p_meta = shoal_path_join(tmp, "synth.json");
    p_man = shoal_path_join(tmp, "shoal.json");
    if ((rc = shoal_container_write_json(sy->config, p_cfg, sy->err)))
        goto fail;
    {
        const int64_t NE = sy->cfg.n_expert;
        json_t *lt = json_array();
        for (int64_t il = 0; il < sy->cfg.n_layer; il++) {
            if (!shoal_layer_is_moe(&sy->cfg, il))
                continue;
            json_t *sh_arr = json_array();
            for (int64_t e = 0; e < NE; e++)
                json_array_append_new(sh_arr, json_real(sy->layer_target[il * NE + e]));
            json_array_append_new(lt, json_pack("{s:I, s:i, s:f, s:o}", "layer",
                                                (json_int_t)il, "trace_layer",
                                                sy->layer_src[il], "u0", sy->u0[il],
                                                "target_share", sh_arr));
        }
        char cmdline[2048] = "";
        for (int i = 0; i < argc; i++) {
            strncat(cmdline, i ? " " : "shoal ", sizeof cmdline - strlen(cmdline) - 1);
            strncat(cmdline, argv[i], sizeof cmdline - strlen(cmdline) - 1);
        }
        meta = json_pack("{s:s, s:i, s:s, s:s, s:I, s:s, s:s, s:s, s:s, s:i, s:f, s:I, s:f, "
                         "s:I, s:I, s:f, s:f, s:f, s:o}",
                         "format", "shoal-synth", "version", 1, "command", cmdline,
                         "family", model_type, "seed", (json_int_t)sy->seed,
                         "trace", sy->trace.name, "domain", sy->domain,
                         "experts_dtype", shoal_dtype_name(sy->experts_dtype),
                         "dense_dtype", shoal_dtype_name(sy->dense_dtype), "group", sy->group,
                         "drift", sy->drift, "bias_channel", (json_int_t)sy->c0,
                         "bias_channel_value", sy->C,
                         "bytes", (json_int_t)sy->total,
                         "blob_bytes", (json_int_t)sy->lay.blob_bytes,
                         "generate_seconds", sy->t_gen, "write_seconds", sy->wbusy + t_sync,
                         "total_seconds", t_all, "layers", lt);
        if ((rc = shoal_container_write_json(meta, p_meta, sy->err)))
            goto fail;
    }
    {
        const struct shoal_container_manifest_params mp = {
            .model_type = model_type, .fingerprint = fingerprint, .config = sy->config,
            .files = json_pack("[s]", "config.json"), .tensors = sy->tensors,
            .layers = sy->layers, .dense_bytes = dense_bytes, .experts_bytes = sy->exp_off,
            .experts_dtype = sy->experts_dtype, .experts_group = sy->group, .cfg = &sy->cfg};
        manifest = shoal_container_manifest(&sy->lay, &mp);
        sy->tensors = sy->layers = NULL; /* owned by the manifest */
        if (!manifest) {
            rc = shoal_err_set(sy->err, SHOAL_ENOMEM, "cannot build the manifest");
            goto fail;
        }
        if ((rc = shoal_container_write_json(manifest, p_man, sy->err)))
            goto fail;
    }
    /* --force: over the container there (cmd_synth.c refused anything else) */
    if ((rc = shoal_container_publish_dir(tmp, dst, force, sy->err)))
        goto fail;
    fprintf(stderr, "shoal: synth wrote %s: %.2f GB in %.1f s (%.0f MB/s; generate+hash "
            "%.1f s = %.0f MB/s; writer busy %.1f s%s, waited for %.1f s; sync %.1f s), "
            "fingerprint %016" PRIx64 "\n", dst, (double)sy->total / 1e9, t_all,
            (double)sy->total / 1e6 / t_all, sy->t_gen,
            (double)sy->total / 1e6 / (sy->t_gen > 0 ? sy->t_gen : 1e-9), sy->wbusy,
            sy->exp_direct ? ", O_DIRECT" : "", sy->t_write, t_sync, fingerprint);
    goto done;
fail:
    writer_stop(sy);
    shoal_cli_error("synth: %s", sy->err->msg);
    if (sy->fd_dense >= 0)
        close(sy->fd_dense);
    if (sy->fd_exp >= 0)
        close(sy->fd_exp);
    shoal_container_rm_tree(tmp);
    if (!rc)
        rc = 1;
done:
    json_decref(manifest);
    json_decref(meta);
    json_decref(sy->tensors);
    json_decref(sy->layers);
    if (sy->fp)
        XXH64_freeState(sy->fp);
    sy->tensors = sy->layers = NULL;
    sy->fp = NULL;
    free(sy->rowbuf);
    free(sy->chunk);
    free(sy->bufs[0]);
    free(sy->bufs[1]);
    if (sy->wmu_init) {
        pthread_mutex_destroy(&sy->wmu);
        pthread_cond_destroy(&sy->wcv);
    }
    free(sy->sums);
    free(sy->dense_path);
    free(sy->exp_path);
    free(p_cfg);
    free(p_meta);
    free(p_man);
    free(tmp);
    return rc ? 1 : 0;
}

void synth_free(struct synth *sy)
{
    json_decref(sy->config);
    sy->config = NULL;
    synth_trace_free(&sy->trace);
    free(sy->layer_src);
    free(sy->layer_target);
    free(sy->layer_bias);
    free(sy->u0);
    free(sy->sigma);
    free(sy->var_att_in);
}
