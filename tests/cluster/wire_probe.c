/* wire_probe: sends crafted frames to a shoal-worker and checks what comes
 * back (tests/cluster/test_worker.py drives it). It speaks through
 * common/net/wire.h's blocking client, and writes raw bytes on the client's
 * socket for frames the client would refuse to build.
 *
 * Expert outputs are checked bit for bit against an independent
 * computation here: the probe opens the same container with its own expert
 * store and runs shoal_expert_ffn on the same rows (DESIGN contract 1: the
 * executor never changes a byte).
 *
 * Exit status: 0 when the worker behaved as expected, 1 when it did not
 * (or refused us: the message is printed), 2 on a usage error.
 *
 * usage: wire_probe --addr HOST:PORT --model DIR [--key FILE]
 *                   [--role coordinator|worker|observer] SCENARIO [N]
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "container.h"
#include "expert_ffn.h"
#include "expert_store.h"
#include "quant.h"
#include "util.h"
#include "wire.h"

#define REPLY_TIMEOUT_MS 20000

struct probe {
    const char *addr, *model;
    struct shoal_wire_key key;
    Shoal__Role role;
    struct shoal_container *ct;
    struct shoal_model_config cfg;
    char fp[17];
    Shoal__PeerInfo info;
    struct shoal_expert_store *store;   /* lazily, for the reference outputs */
    struct shoal_wire_client c;
    int connected;
    const uint8_t *cov;                 /* the worker's coverage (its PeerInfo) */
    size_t cov_len;
    int64_t layer;                      /* a MoE layer the requests use */
    int64_t n_embd;
};

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    return -1;
}

/* ------------------------------------------------------------ requests */

/* An ExpertRequest and the memory it points at. */
struct req {
    Shoal__Frame f;
    Shoal__ExpertRequest rq;
    Shoal__ExpertRows *er;      /* [n] */
    Shoal__ExpertRows **erp;    /* [n] */
    uint32_t *rows;             /* [n][n_rows] */
    float *hidden;              /* [n_rows][n_embd] */
    uint64_t total_rows;
};

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* A request of n_rows rows for experts ids[0..n): expert k gets rows
 * k, k+1, ... (mod n_rows), 1 + (k*3 + seed) % n_rows of them; hidden is
 * pseudo-random in [-2, 2) from seed. */
static void req_build(struct req *r, uint64_t id, int64_t layer, const int32_t *ids, int n,
                      uint32_t n_rows, int64_t n_embd, uint64_t seed)
{
    memset(r, 0, sizeof *r);
    r->er = shoal_xcalloc((size_t)n, sizeof *r->er);
    r->erp = shoal_xcalloc((size_t)n, sizeof *r->erp);
    r->rows = shoal_xcalloc((size_t)n * n_rows, sizeof *r->rows);
    r->hidden = shoal_xcalloc((size_t)n_rows * (size_t)n_embd, sizeof(float));
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < (size_t)n_rows * (size_t)n_embd; i++)
        r->hidden[i] = (float)((rng_next(&s) >> 40) / (double)(1u << 24) * 4.0 - 2.0);
    shoal__frame__init(&r->f);
    shoal__expert_request__init(&r->rq);
    r->rq.id = id;
    r->rq.layer = (uint32_t)layer;
    r->rq.n_rows = n_rows;
    r->rq.n_embd = (uint32_t)n_embd;
    r->rq.hidden.data = (uint8_t *)r->hidden;
    r->rq.hidden.len = (size_t)n_rows * (size_t)n_embd * sizeof(float);
    for (int k = 0; k < n; k++) {
        shoal__expert_rows__init(&r->er[k]);
        r->er[k].expert = (uint32_t)ids[k];
        uint32_t cnt = 1 + (uint32_t)((k * 3 + seed) % n_rows);
        r->er[k].rows = r->rows + (size_t)k * n_rows;
        for (uint32_t j = 0; j < cnt; j++)
            r->er[k].rows[j] = (uint32_t)((k + j) % n_rows);
        r->er[k].n_rows = cnt;
        r->erp[k] = &r->er[k];
        r->total_rows += cnt;
    }
    r->rq.experts = r->erp;
    r->rq.n_experts = (size_t)n;
    r->f.msg_case = SHOAL__FRAME__MSG_REQUEST;
    r->f.request = &r->rq;
}

static void req_free(struct req *r)
{
    free(r->er);
    free(r->erp);
    free(r->rows);
    free(r->hidden);
}

/* The worker's covered experts of layer il, at most max of them. */
static int covered_experts(const struct probe *p, int64_t il, int32_t *ids, int max)
{
    int n = 0;
    for (int64_t ie = 0; ie < p->ct->n_expert && n < max; ie++)
        if (shoal_wire_covers(p->cov, p->cov_len, p->ct->n_expert, il, ie))
            ids[n++] = (int32_t)ie;
    return n;
}

/* The reference output of request r, computed here: for each expert in
 * order, for each of its rows in order, n_embd f32. Returns a malloc'd
 * buffer of total_rows * n_embd floats, or NULL after printing why. */
static float *reference_output(struct probe *p, const struct req *r)
{
    struct shoal_err err = {0};
    if (!p->store) {
        struct shoal_expert_store_params sp = shoal_expert_store_params_default();
        sp.learn = 0;
        sp.prefetch = 0;
        sp.io.kind = SHOAL_IO_PREAD;
        p->store = shoal_expert_store_create(p->ct, sp, &err);
        if (!p->store) {
            fail("reference store: %s", err.msg);
            return NULL;
        }
    }
    const int64_t E = p->n_embd, n_ff = p->cfg.n_ff_exp, NR = r->rq.n_rows;
    float *out = malloc((size_t)r->total_rows * (size_t)E * sizeof(float));
    float *xg = malloc((size_t)(NR * E) * sizeof(float));
    float *scratch = malloc((size_t)(2 * NR * n_ff) * sizeof(float));
    if (!out || !xg || !scratch) {
        free(out);
        free(xg);
        free(scratch);
        fail("reference: out of memory");
        return NULL;
    }
    size_t pos = 0;
    for (size_t k = 0; k < r->rq.n_experts; k++) {
        const Shoal__ExpertRows *er = r->rq.experts[k];
        struct shoal_expert_weights ew;
        if (shoal_expert_store_acquire(p->store, r->rq.layer, er->expert, &ew, &err) < 0) {
            fail("reference acquire: %s", err.msg);
            free(out);
            out = NULL;
            break;
        }
        for (size_t j = 0; j < er->n_rows; j++)
            memcpy(xg + j * E, r->hidden + (size_t)er->rows[j] * E, (size_t)E * sizeof(float));
        shoal_expert_ffn(out + pos, xg, (int64_t)er->n_rows, &ew, scratch);
        shoal_expert_store_release(p->store, r->rq.layer, er->expert);
        pos += er->n_rows * (size_t)E;
    }
    free(xg);
    free(scratch);
    return out;
}

static uint64_t fnv1a(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* Check a response frame against request r: its id, its size, and every
 * byte against the reference (computed once per distinct request when
 * want is NULL). */
/* The response's RAM bitmaps (PROTOCOL.md "Expert requests"): n_expert
 * bits each, loading a subset of resident, next_layer the next layer with
 * experts after the request's (none: no next bitmaps); with a cache that
 * holds the whole container, the request's experts are resident. */
static int check_resident(struct probe *p, const Shoal__ExpertResponse *rs, const struct req *r)
{
    const struct shoal_container *ct = p->ct;
    const size_t nb = (size_t)((ct->n_expert + 7) / 8);
    const int64_t il = (int64_t)r->rq.layer;
    if (rs->resident.len != nb || rs->loading.len != nb)
        return fail("request %" PRIu64 ": resident/loading bitmaps of %zu/%zu bytes, expected "
                    "%zu (n_expert %lld)", r->rq.id, rs->resident.len, rs->loading.len, nb,
                    (long long)ct->n_expert);
    int64_t next = -1;
    for (int64_t l2 = il + 1; l2 < ct->n_layer && next < 0; l2++)
        if (ct->layer_offset[l2] != UINT64_MAX)
            next = l2;
    if (next < 0 ? rs->next_resident.len != 0
                 : (rs->next_layer != (uint32_t)next || rs->next_resident.len != nb ||
                    rs->next_loading.len != nb))
        return fail("request %" PRIu64 " (layer %lld): next_layer %u with %zu bytes, expected "
                    "layer %lld with %zu", r->rq.id, (long long)il, rs->next_layer,
                    rs->next_resident.len, (long long)next, next < 0 ? (size_t)0 : nb);
    for (size_t i = 0; i < nb; i++)
        if ((rs->loading.data[i] & ~rs->resident.data[i]) ||
            (next >= 0 && (rs->next_loading.data[i] & ~rs->next_resident.data[i])))
            return fail("request %" PRIu64 ": a loading bit outside resident (byte %zu)",
                        r->rq.id, i);
    const Shoal__PeerInfo *pi = p->c.hs.peer_info;
    const uint64_t all = (uint64_t)ct->n_layer * (uint64_t)ct->n_expert *
                         shoal_container_blob_bytes(ct, il);
    if (pi && pi->cache_bytes >= all)
        for (size_t i = 0; i < r->rq.n_experts; i++) {
            const uint32_t ie = r->rq.experts[i]->expert;
            if (!(rs->resident.data[ie / 8] >> (ie % 8) & 1))
                return fail("request %" PRIu64 ": expert %u of layer %lld ran but is not "
                            "resident in a cache of %" PRIu64 " bytes", r->rq.id, ie,
                            (long long)il, pi->cache_bytes);
        }
    return 0;
}

static int check_response(struct probe *p, const Shoal__Frame *f, const struct req *r,
                          const float *want)
{
    if (f->msg_case == SHOAL__FRAME__MSG_ERROR)
        return fail("request %" PRIu64 ": error reply code %d (%s): %s", r->rq.id,
                    f->error->code, shoal_err_name(f->error->code), f->error->message);
    if (f->msg_case != SHOAL__FRAME__MSG_RESPONSE)
        return fail("request %" PRIu64 ": got a %s frame, expected a response", r->rq.id,
                    shoal_wire_frame_name(f));
    const Shoal__ExpertResponse *rs = f->response;
    struct shoal_err err = {0};
    if (rs->id != r->rq.id)
        return fail("response id %" PRIu64 ", expected %" PRIu64, rs->id, r->rq.id);
    if (shoal_wire_check_response(rs, r->total_rows, p->n_embd, &err) < 0)
        return fail("%s", err.msg);
    if (check_resident(p, rs, r) < 0)
        return -1;
    float *own = NULL;
    if (!want && !(want = own = reference_output(p, r)))
        return -1;
    int rc = 0;
    if (memcmp(rs->out.data, want, rs->out.len) != 0) {
        size_t i = 0;
        while (i < rs->out.len && rs->out.data[i] == ((const uint8_t *)want)[i])
            i++;
        float got;
        memcpy(&got, rs->out.data + (i & ~(size_t)3), sizeof got);
        rc = fail("request %" PRIu64 ": output differs from the local computation at byte "
                  "%zu (float %zu: worker %.9g, local %.9g)", r->rq.id, i, i / 4, got,
                  want[i / 4]);
    }
    free(own);
    return rc;
}

/* ------------------------------------------------------------ connection */

static int probe_connect(struct probe *p)
{
    struct shoal_err err = {0};
    if (shoal_wire_client_connect(&p->c, p->addr, p->role, &p->key, &p->info,
                                  p->role == SHOAL__ROLE__ROLE_OBSERVER ? NULL : p->fp, 10000,
                                  &err) < 0) {
        printf("refused: %s\n", err.msg);
        fflush(stdout);
        return -1;
    }
    p->connected = 1;
    const Shoal__PeerInfo *pi = p->c.hs.peer_info;
    p->cov = pi->coverage.data;
    p->cov_len = pi->coverage.len;
    return 0;
}

static void probe_close(struct probe *p)
{
    if (p->connected)
        shoal_wire_client_close(&p->c);
    p->connected = 0;
}

static Shoal__Frame *recv_frame(struct probe *p)
{
    struct shoal_err err = {0};
    Shoal__Frame *f = shoal_wire_client_recv(&p->c, REPLY_TIMEOUT_MS, &err);
    if (!f)
        fail("no frame from the worker: %s", err.msg);
    return f;
}

/* Send raw bytes on the client's socket. */
static int send_raw(struct probe *p, const void *data, size_t n)
{
    const uint8_t *b = data;
    while (n > 0) {
        ssize_t w = send(p->c.fd, b, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pf = {.fd = p->c.fd, .events = POLLOUT};
            poll(&pf, 1, 1000);
            continue;
        }
        if (w < 0)
            return fail("send: %s", strerror(errno));
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

static int send_frame(struct probe *p, const Shoal__Frame *f)
{
    struct shoal_err err = {0};
    if (shoal_wire_client_send(&p->c, f, &err) < 0)
        return fail("send %s: %s", shoal_wire_frame_name(f), err.msg);
    return 0;
}

/* Receive the next frame and require an ErrorReply with this id and code
 * (code 0: any nonzero). */
static int expect_error(struct probe *p, const char *what, uint64_t id, int code)
{
    Shoal__Frame *f = recv_frame(p);
    if (!f)
        return fail("%s: no error reply", what);
    int rc = 0;
    if (f->msg_case != SHOAL__FRAME__MSG_ERROR)
        rc = fail("%s: got a %s frame, expected an error reply", what,
                  shoal_wire_frame_name(f));
    else if (f->error->id != id || (code ? f->error->code != code : f->error->code >= 0))
        rc = fail("%s: error reply id %" PRIu64 " code %d (%s), expected id %" PRIu64
                  " code %d (%s): %s", what, f->error->id, f->error->code,
                  shoal_err_name(f->error->code), id, code, shoal_err_name(code),
                  f->error->message);
    else
        printf("ok %s: error reply id=%" PRIu64 " %s: %s\n", what, f->error->id,
               shoal_err_name(f->error->code), f->error->message);
    fflush(stdout);
    shoal_wire_frame_free(f);
    return rc;
}

/* One good request on the open connection, checked bit for bit. */
static int valid_request(struct probe *p, uint64_t id, int64_t layer, const int32_t *ids,
                         int n, uint32_t n_rows, uint64_t seed, int quiet)
{
    int32_t def[8];
    if (!ids) {
        n = covered_experts(p, layer, def, 4);
        ids = def;
        if (n == 0)
            return fail("the worker covers no expert of layer %lld", (long long)layer);
    }
    struct req r;
    req_build(&r, id, layer, ids, n, n_rows, p->n_embd, seed);
    int rc = send_frame(p, &r.f);
    Shoal__Frame *f = rc ? NULL : recv_frame(p);
    if (!f)
        rc = -1;
    else if ((rc = check_response(p, f, &r, NULL)) == 0 && !quiet) {
        const Shoal__ExpertResponse *rs = f->response;
        printf("ok valid: id=%" PRIu64 " layer=%lld experts=%d rows=%" PRIu64 " bytes=%zu "
               "fnv1a=%016" PRIx64 " identical to the local computation (hits=%u "
               "disk_reads=%u read=%.3fms compute=%.3fms)\n", rs->id, (long long)layer, n,
               r.total_rows, rs->out.len, fnv1a(rs->out.data, rs->out.len), rs->cache_hits,
               rs->disk_reads, rs->read_seconds * 1e3, rs->compute_seconds * 1e3);
        fflush(stdout);
    }
    shoal_wire_frame_free(f);
    req_free(&r);
    return rc;
}

/* A request allowing the answer in parts (ExpertRequest.parts = k), sent
 * after the same request in one frame put its experts in the worker's RAM:
 * the answer must come in 2..k frames of the id, every frame but the last
 * a valid part (`more`, whole rows) and the last without `more`, and the
 * frames' outputs put together must be the local computation's bytes. */
static int sc_parts(struct probe *p, uint32_t k)
{
    int32_t ids[8];
    int n = covered_experts(p, p->layer, ids, 8);
    if (n < 2)
        return fail("parts: the worker covers %d experts of layer %lld, need 2", n,
                    (long long)p->layer);
    if (valid_request(p, 300, p->layer, ids, n, 6, 31, 1) < 0)   /* into RAM */
        return -1;
    struct req r;
    req_build(&r, 301, p->layer, ids, n, 6, p->n_embd, 31);
    r.rq.parts = k;
    const size_t want = (size_t)r.total_rows * (size_t)p->n_embd * sizeof(float);
    uint8_t *all = malloc(want ? want : 1);
    size_t have = 0;
    uint32_t frames = 0;
    int rc = all ? send_frame(p, &r.f) : fail("parts: out of memory");
    Shoal__Frame *f = NULL;
    while (!rc) {
        if (!(f = recv_frame(p))) {
            rc = -1;
            break;
        }
        frames++;
        if (f->msg_case != SHOAL__FRAME__MSG_RESPONSE || !f->response->more)
            break;
        struct shoal_err err = {0};
        if (shoal_wire_check_response_part(f->response, have, r.total_rows, p->n_embd,
                                           k - (frames - 1), &err) < 0) {
            rc = fail("parts: frame %u: %s", frames, err.msg);
            break;
        }
        if (f->response->id != r.rq.id) {
            rc = fail("parts: frame %u has id %" PRIu64 ", expected %" PRIu64, frames,
                      f->response->id, r.rq.id);
            break;
        }
        memcpy(all + have, f->response->out.data, f->response->out.len);
        have += f->response->out.len;
        shoal_wire_frame_free(f);
        f = NULL;
    }
    if (!rc && f && f->msg_case == SHOAL__FRAME__MSG_RESPONSE) {
        /* the last frame with every part's outputs before its own */
        Shoal__ExpertResponse *rs = f->response;
        if (have + rs->out.len != want)
            rc = fail("parts: %zu bytes in %u frames, expected %zu", have + rs->out.len,
                      frames, want);
        else {
            memcpy(all + have, rs->out.data, rs->out.len);
            free(rs->out.data);
            rs->out.data = all;
            rs->out.len = want;
            all = NULL;
            rc = check_response(p, f, &r, NULL);
        }
        if (!rc && (frames < 2 || frames > k))
            rc = fail("parts: the answer came in %u frames, expected 2..%u (every expert "
                      "was in RAM)", frames, k);
        if (!rc)
            printf("ok parts: %d experts, %" PRIu64 " rows answered in %u frames (at most "
                   "%u allowed), identical to the local computation\n", n, r.total_rows,
                   frames, k);
    } else if (!rc && f) {
        rc = check_response(p, f, &r, NULL);   /* says what came instead */
    }
    shoal_wire_frame_free(f);
    free(all);
    req_free(&r);
    fflush(stdout);
    return rc;
}

/* A bad ExpertRequest built by mutate from a good one: the worker must
 * answer with an error carrying id and code, then serve a good request on
 * the same connection. */
static int bad_request(struct probe *p, const char *what, int code,
                       void (*mutate)(struct probe *p, struct req *r))
{
    int32_t ids[4];
    int n = covered_experts(p, p->layer, ids, 3);
    if (n == 0)
        return fail("the worker covers no expert of layer %lld", (long long)p->layer);
    struct req r;
    req_build(&r, 77, p->layer, ids, n, 4, p->n_embd, 5);
    mutate(p, &r);
    int rc = send_frame(p, &r.f);
    if (!rc)
        rc = expect_error(p, what, r.rq.id, code);
    req_free(&r);
    if (!rc)
        rc = valid_request(p, 78, p->layer, NULL, 0, 3, 9, 0);
    return rc;
}

static void m_zero_rows(struct probe *p, struct req *r)
{
    (void)p;
    r->rq.n_rows = 0;
    r->rq.hidden.len = 0;
}
static void m_zero_embd(struct probe *p, struct req *r)
{
    (void)p;
    r->rq.n_embd = 0;
}
static void m_no_experts(struct probe *p, struct req *r)
{
    (void)p;
    r->rq.n_experts = 0;
}
static void m_expert_no_rows(struct probe *p, struct req *r)
{
    (void)p;
    r->er[0].n_rows = 0;
}
static void m_huge_rows(struct probe *p, struct req *r)
{
    (void)p;
    r->rq.n_rows = UINT32_MAX;   /* hidden stays small: n_rows x n_embd x 4 overflows 32 bits */
}
static void m_huge_embd(struct probe *p, struct req *r)
{
    (void)p;
    r->rq.n_embd = UINT32_MAX;
}
static void m_bad_expert(struct probe *p, struct req *r)
{
    r->er[0].expert = (uint32_t)p->ct->n_expert;
}
static void m_huge_expert(struct probe *p, struct req *r)
{
    (void)p;
    r->er[r->rq.n_experts - 1].expert = UINT32_MAX;
}
static void m_bad_layer(struct probe *p, struct req *r)
{
    r->rq.layer = (uint32_t)p->ct->n_layer;
}
static void m_huge_layer(struct probe *p, struct req *r)
{
    (void)p;
    r->rq.layer = UINT32_MAX;
}
static void m_rows_mismatch(struct probe *p, struct req *r)
{
    (void)p;
    r->rq.hidden.len -= 4;   /* one float short */
}
static void m_dup_expert(struct probe *p, struct req *r)
{
    (void)p;
    if (r->rq.n_experts >= 2)   /* the worker must cover 2 experts of the layer */
        r->er[1].expert = r->er[0].expert;
}
static void m_bad_row(struct probe *p, struct req *r)
{
    (void)p;
    r->er[0].rows[0] = r->rq.n_rows;
}
static void m_id_zero(struct probe *p, struct req *r)
{
    (void)p;
    r->rq.id = 0;
}
static void m_too_many_experts(struct probe *p, struct req *r)
{
    /* n_expert + 1 entries (ids repeat): refused before anything else */
    size_t n = (size_t)p->ct->n_expert + 1;
    Shoal__ExpertRows **erp = shoal_xcalloc(n, sizeof *erp);
    for (size_t i = 0; i < n; i++)
        erp[i] = &r->er[0];
    free(r->erp);
    r->erp = erp;
    r->rq.experts = erp;
    r->rq.n_experts = n;
}
static void m_not_held(struct probe *p, struct req *r)
{
    /* the first expert of the layer this worker does not cover */
    for (int64_t ie = 0; ie < p->ct->n_expert; ie++)
        if (!shoal_wire_covers(p->cov, p->cov_len, p->ct->n_expert, r->rq.layer, ie)) {
            r->er[0].expert = (uint32_t)ie;
            return;
        }
}

/* ------------------------------------------------------------ scenarios */

static int sc_malformed(struct probe *p)
{
    /* not protobuf at all: a varint that never ends */
    uint8_t bad[4 + 16];
    uint32_t n = 16;
    memcpy(bad, &n, 4);   /* hosts are little-endian (the wire format's order) */
    memset(bad + 4, 0xff, 16);
    if (send_raw(p, bad, sizeof bad) || expect_error(p, "malformed body", 0, SHOAL_EFORMAT))
        return -1;
    /* valid protobuf, but no message of the oneof (an unknown field 99) */
    uint8_t unk[4 + 3] = {3, 0, 0, 0, 0x98, 0x06, 0x01};   /* field 99 varint = tag 792 */
    if (send_raw(p, unk, sizeof unk) || expect_error(p, "empty frame", 0, SHOAL_EFORMAT))
        return -1;
    /* a length-delimited field whose length runs past the frame */
    uint8_t trunc[4 + 4] = {4, 0, 0, 0, (4 << 3) | 2, 100, 1, 2};
    if (send_raw(p, trunc, sizeof trunc) ||
        expect_error(p, "field past the frame end", 0, SHOAL_EFORMAT))
        return -1;
    /* a frame a worker does not answer: a response */
    Shoal__Frame f = SHOAL__FRAME__INIT;
    Shoal__ExpertResponse rs = SHOAL__EXPERT_RESPONSE__INIT;
    rs.id = 5;
    f.msg_case = SHOAL__FRAME__MSG_RESPONSE;
    f.response = &rs;
    if (send_frame(p, &f) || expect_error(p, "unexpected response frame", 0, 0))
        return -1;
    /* a hint for a layer that does not exist */
    Shoal__PrefetchHint h = SHOAL__PREFETCH_HINT__INIT;
    uint32_t ex[2] = {0, 1};
    h.layer = (uint32_t)p->ct->n_layer + 3;
    h.experts = ex;
    h.n_experts = 2;
    f.msg_case = SHOAL__FRAME__MSG_HINT;
    f.hint = &h;
    if (send_frame(p, &f) || expect_error(p, "hint for a bad layer", 0, SHOAL_ERANGE))
        return -1;
    return valid_request(p, 11, p->layer, NULL, 0, 4, 3, 0);
}

/* A length prefix the worker must refuse: an error reply, then the worker
 * closes the connection (the stream is out of sync). */
static int sc_bad_length(struct probe *p, uint32_t len, const char *what)
{
    if (send_raw(p, &len, 4) || expect_error(p, what, 0, SHOAL_ERANGE))
        return -1;
    struct shoal_err err = {0};
    Shoal__Frame *f = shoal_wire_client_recv(&p->c, 10000, &err);
    if (f) {
        shoal_wire_frame_free(f);
        return fail("%s: the worker kept the connection open and sent another frame", what);
    }
    if (!strstr(err.msg, "closed"))
        return fail("%s: expected the worker to close the connection: %s", what, err.msg);
    printf("ok %s: connection closed by the worker\n", what);
    return 0;
}

static int sc_truncated(struct probe *p)
{
    int32_t ids[4];
    int n = covered_experts(p, p->layer, ids, 4);
    struct req r;
    req_build(&r, 21, p->layer, ids, n, 8, p->n_embd, 4);
    struct shoal_err err = {0};
    size_t len;
    uint8_t *b = shoal_wire_pack(&r.f, SHOAL_WIRE_MAX_FRAME_DEFAULT, &len, &err);
    req_free(&r);
    if (!b)
        return fail("pack: %s", err.msg);
    int rc = send_raw(p, b, len / 2);
    free(b);
    if (!rc)
        printf("ok truncated: sent %zu of %zu bytes, closing\n", len / 2, len);
    return rc;
}

/* N requests sent back to back before any reply is read; every reply must
 * come back, matched by id, each checked against the local computation. */
static int sc_pipeline(struct probe *p, int n)
{
    int32_t ids[8];
    int ne = covered_experts(p, p->layer, ids, 8);
    struct req *r = shoal_xcalloc((size_t)n, sizeof *r);
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        req_build(&r[i], 1000 + (uint64_t)i, p->layer, ids, 1 + i % ne, 2 + (uint32_t)(i % 7),
                  p->n_embd, 100 + (uint64_t)i);
        rc = send_frame(p, &r[i].f);
    }
    int got = 0;
    char *seen = shoal_xcalloc((size_t)n, 1);
    while (!rc && got < n) {
        Shoal__Frame *f = recv_frame(p);
        if (!f) {
            rc = -1;
            break;
        }
        uint64_t id = f->msg_case == SHOAL__FRAME__MSG_RESPONSE ? f->response->id
                      : f->msg_case == SHOAL__FRAME__MSG_ERROR    ? f->error->id : 0;
        if (id < 1000 || id >= 1000 + (uint64_t)n || seen[id - 1000])
            rc = fail("pipeline: unexpected reply id %" PRIu64, id);
        else {
            seen[id - 1000] = 1;
            rc = check_response(p, f, &r[id - 1000], NULL);
            got++;
        }
        shoal_wire_frame_free(f);
    }
    for (int i = 0; i < n; i++)
        req_free(&r[i]);
    free(r);
    free(seen);
    if (!rc)
        printf("ok pipeline: %d requests, %d replies, all identical to the local computation\n",
               n, got);
    return rc;
}

struct sender {
    struct probe *p;
    const struct req *r;
    int n, rc;
};

static void *send_many(void *arg)
{
    struct sender *s = arg;
    for (int i = 0; i < s->n && !s->rc; i++) {
        Shoal__ExpertRequest rq = s->r->rq;
        Shoal__Frame f = s->r->f;
        rq.id = 5000 + (uint64_t)i;
        f.request = &rq;
        struct shoal_err err = {0};
        if (shoal_wire_client_send(&s->p->c, &f, &err) < 0)
            s->rc = fail("backpressure: send %d: %s", i, err.msg);
    }
    return NULL;
}

/* A slow reader: n large requests (each response about 8 MiB) are sent
 * while nothing is read for a while, so the worker's queued replies pass
 * its backpressure limit. Every reply must still arrive, intact. */
static int sc_backpressure(struct probe *p, int n)
{
    int32_t ids[8];
    int ne = covered_experts(p, p->layer, ids, 8);
    const uint32_t rows = 1024;
    struct req r;
    req_build(&r, 5000, p->layer, ids, ne, rows, p->n_embd, 42);
    for (int k = 0; k < ne; k++) {   /* every expert takes every row */
        r.er[k].n_rows = rows;
        for (uint32_t j = 0; j < rows; j++)
            r.er[k].rows[j] = j;
    }
    r.total_rows = (uint64_t)ne * rows;
    float *want = reference_output(p, &r);
    if (!want) {
        req_free(&r);
        return -1;
    }
    /* time one request, so that the pause below lets the worker compute
     * every reply (and queue them unread) however fast it is */
    double t0 = shoal_time_s();
    r.rq.id = 4999;
    int rc = send_frame(p, &r.f);
    Shoal__Frame *f0 = rc ? NULL : recv_frame(p);
    rc = f0 ? check_response(p, f0, &r, want) : -1;
    shoal_wire_frame_free(f0);
    double per = shoal_time_s() - t0;
    if (rc) {
        free(want);
        req_free(&r);
        return rc;
    }
    struct sender s = {.p = p, .r = &r, .n = n};
    pthread_t t;
    pthread_create(&t, NULL, send_many, &s);
    /* at most 25 s: once the worker stops reading, the sender's blocked
     * send gives up after 30 s (common/net/wire.c send_all), and a slow build
     * (ASan, a loaded CI box: about 1.6 s a request) made the pause reach
     * that and the test fail with "send timed out" */
    double wait = 1.5 * per * n + 1.0;
    if (wait > 25)
        wait = 25;
    struct timespec ts = {.tv_sec = (time_t)wait,
                          .tv_nsec = (long)((wait - (double)(time_t)wait) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {   /* read nothing meanwhile */
    }
    int got = 0;
    struct req chk = r;   /* the sender reads r; the check uses its own copy */
    chk.f.request = &chk.rq;
    while (!rc && got < n) {
        Shoal__Frame *f = recv_frame(p);
        if (!f) {
            rc = -1;
            break;
        }
        uint64_t id = f->msg_case == SHOAL__FRAME__MSG_RESPONSE ? f->response->id : 0;
        chk.rq.id = 5000 + (uint64_t)got;   /* one connection, one FIFO: in order */
        if (id != chk.rq.id)
            rc = fail("backpressure: reply %d has id %" PRIu64 ", expected %" PRIu64, got, id,
                      chk.rq.id);
        else
            rc = check_response(p, f, &chk, want);
        got++;
        shoal_wire_frame_free(f);
    }
    pthread_join(t, NULL);
    if (!rc && s.rc)
        rc = s.rc;
    if (!rc)
        printf("ok backpressure: %d replies of %" PRIu64 " bytes each, unread for %.1f s, "
               "none dropped, all identical\n", n, r.total_rows * (uint64_t)p->n_embd * 4,
               wait);
    free(want);
    req_free(&r);
    return rc;
}

static int sc_heartbeat(struct probe *p)
{
    uint8_t payload[3000];
    for (size_t i = 0; i < sizeof payload; i++)
        payload[i] = (uint8_t)(i * 31);
    Shoal__Heartbeat hb = SHOAL__HEARTBEAT__INIT;
    hb.id = 9;
    hb.sent_ns = shoal_wire_now_ns();
    hb.payload.data = payload;
    hb.payload.len = sizeof payload;
    Shoal__Frame f = SHOAL__FRAME__INIT;
    f.msg_case = SHOAL__FRAME__MSG_HEARTBEAT;
    f.heartbeat = &hb;
    if (send_frame(p, &f))
        return -1;
    Shoal__Frame *g = recv_frame(p);
    if (!g)
        return -1;
    int rc = 0;
    if (g->msg_case != SHOAL__FRAME__MSG_HEARTBEAT || !g->heartbeat->reply ||
        g->heartbeat->id != hb.id || g->heartbeat->sent_ns != hb.sent_ns ||
        g->heartbeat->payload.len != sizeof payload ||
        memcmp(g->heartbeat->payload.data, payload, sizeof payload))
        rc = fail("heartbeat: expected the echo with reply=true, got a %s frame",
                  shoal_wire_frame_name(g));
    else
        printf("ok heartbeat: echoed id=%" PRIu64 " payload=%zu bytes rtt=%.3f ms\n",
               g->heartbeat->id, g->heartbeat->payload.len,
               (shoal_wire_now_ns() - hb.sent_ns) / 1e6);
    shoal_wire_frame_free(g);
    return rc;
}

static int sc_status(struct probe *p)
{
    Shoal__StatusRequest sr = SHOAL__STATUS_REQUEST__INIT;
    sr.id = 33;
    Shoal__Frame f = SHOAL__FRAME__INIT;
    f.msg_case = SHOAL__FRAME__MSG_STATUS_REQUEST;
    f.status_request = &sr;
    if (send_frame(p, &f))
        return -1;
    Shoal__Frame *g = recv_frame(p);
    if (!g)
        return -1;
    int rc = 0;
    if (g->msg_case != SHOAL__FRAME__MSG_STATUS || g->status->id != 33 || !g->status->info)
        rc = fail("status: got a %s frame, expected a status reply with id 33",
                  shoal_wire_frame_name(g));
    else {
        const Shoal__StatusReply *s = g->status;
        printf("ok status: requests=%" PRIu64 " errors=%" PRIu64 " connections=%u "
               "queue_depth=%u cache_used=%" PRIu64 " hits=%" PRIu64 " misses=%" PRIu64
               " bytes_read=%" PRIu64 " uptime=%.1fs name=%s fingerprint=%s\n",
               s->requests, s->errors, s->connections, s->queue_depth, s->cache_used, s->hits,
               s->misses, s->bytes_read, s->uptime_seconds, s->info->name,
               s->info->fingerprint);
    }
    shoal_wire_frame_free(g);
    return rc;
}

static int sc_hint(struct probe *p)
{
    int32_t ids[8];
    int n = covered_experts(p, p->layer, ids, 8);
    uint32_t ex[16];
    for (int i = 0; i < n; i++)
        ex[i] = ex[n + i] = (uint32_t)ids[i];   /* duplicates are allowed */
    Shoal__PrefetchHint h = SHOAL__PREFETCH_HINT__INIT;
    h.layer = (uint32_t)p->layer;
    h.experts = ex;
    h.n_experts = (size_t)(2 * n);
    Shoal__Frame f = SHOAL__FRAME__INIT;
    f.msg_case = SHOAL__FRAME__MSG_HINT;
    f.hint = &h;
    if (send_frame(p, &f))
        return -1;
    printf("ok hint: %d experts of layer %lld hinted\n", n, (long long)p->layer);
    return valid_request(p, 12, p->layer, NULL, 0, 6, 8, 0);
}

/* The worker must close a connection that never completes the handshake. */
static int sc_no_handshake(struct probe *p)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    struct shoal_err err = {0};
    if (shoal_wire_parse_addr(p->addr, &ss, &sl, &err) < 0)
        return fail("%s", err.msg);
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&ss, sl) < 0)
        return fail("connect %s: %s", p->addr, strerror(errno));
    double t0 = shoal_time_s();
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    int r = poll(&pf, 1, 60000);   /* a watchdog: the deadline is 5 s, a busy box is slower */
    char b[64];
    ssize_t got = r > 0 ? recv(fd, b, sizeof b, 0) : -1;
    double dt = shoal_time_s() - t0;
    close(fd);
    if (r <= 0 || got != 0)
        return fail("no-handshake: the worker did not close a silent connection within 60 s "
                    "(poll %d, recv %zd)", r, got);
    printf("ok no-handshake: closed by the worker after %.1f s\n", dt);
    /* not before the deadline; how late is not timed (load stretches it) */
    return dt >= 3.0 ? 0 : fail("no-handshake: closed after %.1f s, before the 5 s deadline", dt);
}

/* After the handshake, two frames of mb MiB made of repeated unknown
 * fields (`78 00 ...`): one at the top level, one inside a heartbeat. Each
 * must get an ErrorReply (or, where the peer's frame limit is smaller,
 * an ErrorReply and a closed connection) without the peer unpacking it
 * into many times its size (test_peer_limits.py measures its peak RSS). */
static int sc_unknown_fields(struct probe *p, int mb)
{
    const size_t n = (size_t)mb << 20;
    uint8_t *b = malloc(n + 16);
    if (!b)
        return fail("no memory for %zu bytes", n);
    for (int nested = 0; nested < 2; nested++) {
        size_t o = 4, pairs = (n - 8) / 2;
        if (nested) {   /* Frame.heartbeat (field 7) holding the pairs */
            b[o++] = 0x3a;
            for (size_t v = 2 * pairs;; v >>= 7) {
                b[o++] = (uint8_t)((v & 0x7f) | (v >= 0x80 ? 0x80 : 0));
                if (v < 0x80)
                    break;
            }
        }
        for (size_t k = 0; k < pairs; k++) {
            b[o++] = 0x78;
            b[o++] = 0x00;
        }
        const uint32_t body = (uint32_t)(o - 4);
        b[0] = (uint8_t)body;
        b[1] = (uint8_t)(body >> 8);
        b[2] = (uint8_t)(body >> 16);
        b[3] = (uint8_t)(body >> 24);
        if (!p->connected && probe_connect(p) < 0) {
            free(b);
            return -1;
        }
        /* the peer may refuse at the length prefix and close while we send */
        for (size_t sent = 0; sent < o;) {
            ssize_t w = send(p->c.fd, b + sent, o - sent, MSG_NOSIGNAL);
            if (w < 0 && errno == EINTR)
                continue;
            if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                struct pollfd wp = {.fd = p->c.fd, .events = POLLOUT};
                if (poll(&wp, 1, 5000) <= 0)
                    break;
                continue;
            }
            if (w <= 0)
                break;
            sent += (size_t)w;
        }
        struct shoal_err err = {0};
        Shoal__Frame *f = shoal_wire_client_recv(&p->c, REPLY_TIMEOUT_MS, &err);
        if (!f || f->msg_case != SHOAL__FRAME__MSG_ERROR) {
            int rc = fail("unknown fields (%s, %u bytes): %s", nested ? "in a heartbeat"
                          : "top level", body, f ? "a reply that is not an error" : err.msg);
            shoal_wire_frame_free(f);
            free(b);
            return rc;
        }
        char msg[200];
        printf("ok unknown fields (%s, %u bytes): error reply %s: %s\n",
               nested ? "in a heartbeat" : "top level", body, shoal_err_name(f->error->code),
               shoal_wire_printable(msg, sizeof msg, f->error->message));
        fflush(stdout);
        shoal_wire_frame_free(f);
        /* a peer that closed after its error reply gets a fresh connection */
        struct pollfd pf = {.fd = p->c.fd, .events = POLLIN};
        char c1;
        if (poll(&pf, 1, 200) > 0 && recv(p->c.fd, &c1, 1, MSG_PEEK) <= 0)
            probe_close(p);
    }
    free(b);
    return 0;
}

/* Status of the worker on client c: demand acquires, requests received,
 * queue depth. Returns 0 or -1. */
static int status_counts(struct shoal_wire_client *c, uint64_t *acquires, uint64_t *requests,
                         uint32_t *depth)
{
    Shoal__StatusRequest sr = SHOAL__STATUS_REQUEST__INIT;
    sr.id = 44;
    Shoal__Frame f = SHOAL__FRAME__INIT;
    f.msg_case = SHOAL__FRAME__MSG_STATUS_REQUEST;
    f.status_request = &sr;
    struct shoal_err err = {0};
    if (shoal_wire_client_send(c, &f, &err) < 0)
        return fail("status: %s", err.msg);
    Shoal__Frame *g = shoal_wire_client_recv(c, REPLY_TIMEOUT_MS, &err);
    if (!g || g->msg_case != SHOAL__FRAME__MSG_STATUS) {
        shoal_wire_frame_free(g);
        return fail("status: %s", g ? "not a status reply" : err.msg);
    }
    *acquires = g->status->hits + g->status->misses;
    *requests = g->status->requests;
    *depth = g->status->queue_depth;
    shoal_wire_frame_free(g);
    return 0;
}

/* n large requests, all received and queued by the worker (an observer
 * connection watches its counters), then the connection closes: the
 * worker must drop the queued ones (at most the running one finishes),
 * seen as the expert acquires it performs after the close. */
static int sc_cancel_on_close(struct probe *p, int n)
{
    struct shoal_wire_client obs;
    struct shoal_err err = {0};
    Shoal__PeerInfo oi = SHOAL__PEER_INFO__INIT;
    oi.name = "wire_probe-observer";
    if (shoal_wire_client_connect(&obs, p->addr, SHOAL__ROLE__ROLE_OBSERVER, &p->key, &oi,
                                  NULL, 10000, &err) < 0)
        return fail("observer: %s", err.msg);
    int32_t ids[256];
    int ne = covered_experts(p, p->layer, ids, 256);
    struct req r;
    /* 768 rows: n = 8 requests and their replies (every expert takes every
     * row) stay within the worker's 64 MiB per-connection budget, so it
     * reads them all */
    req_build(&r, 500, p->layer, ids, ne, 768, p->n_embd, 3);
    for (int k = 0; k < ne; k++) {
        r.er[k].n_rows = 768;
        for (uint32_t j = 0; j < 768; j++)
            r.er[k].rows[j] = j;
    }
    uint64_t acq0, req0, acq1, req1;
    uint32_t depth;
    int rc = status_counts(&obs, &acq0, &req0, &depth);
    for (int i = 0; i < n && !rc; i++) {
        r.rq.id = 500 + (uint64_t)i;
        rc = send_frame(p, &r.f);
    }
    req_free(&r);
    /* wait until the worker has read every request (watchdog 120 s) */
    double t0 = shoal_time_s();
    for (req1 = req0; !rc && req1 < req0 + (uint64_t)n;) {
        if (shoal_time_s() - t0 > 120) {
            rc = fail("cancel-on-close: the worker read %llu of %d requests in 120 s",
                      (unsigned long long)(req1 - req0), n);
            break;
        }
        rc = status_counts(&obs, &acq1, &req1, &depth);
    }
    uint64_t acq_close = acq1;
    probe_close(p);
    /* wait until its queue is empty (watchdog 300 s) */
    t0 = shoal_time_s();
    for (depth = 1; !rc && depth > 0;) {
        if (shoal_time_s() - t0 > 300) {
            rc = fail("cancel-on-close: queue depth still %u after 300 s", depth);
            break;
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
        rc = status_counts(&obs, &acq1, &req1, &depth);
    }
    shoal_wire_client_close(&obs);
    if (rc)
        return rc;
    const uint64_t ran = (acq1 - acq0) / (uint64_t)ne;
    const uint64_t after = (acq1 - acq_close) / (uint64_t)ne;
    printf("%s cancel-on-close: %d requests queued, %llu computed in all, %llu after the "
           "connection closed (at most 2 expected: the one running then, and one starting)\n",
           after <= 2 ? "ok" : "FAIL", n, (unsigned long long)ran,
           (unsigned long long)after);
    fflush(stdout);
    if (after > 2)
        return -1;
    if ((rc = probe_connect(p)) == 0)
        rc = valid_request(p, 99, p->layer, NULL, 0, 3, 9, 0);
    return rc;
}

/* N cycles of connect / partial send / drop, four kinds in turn. */
static int sc_churn(struct probe *p, int n)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    struct shoal_err err = {0};
    if (shoal_wire_parse_addr(p->addr, &ss, &sl, &err) < 0)
        return fail("%s", err.msg);
    int32_t ids[4];
    int ne = covered_experts(p, p->layer, ids, 4);
    struct req r;
    req_build(&r, 31, p->layer, ids, ne, 16, p->n_embd, 6);
    size_t len;
    uint8_t *frame = shoal_wire_pack(&r.f, SHOAL_WIRE_MAX_FRAME_DEFAULT, &len, &err);
    req_free(&r);
    if (!frame)
        return fail("pack: %s", err.msg);
    int handshakes = 0;
    for (int i = 0; i < n; i++) {
        if (i % 4 == 3) {   /* authenticated, then half a request */
            probe_close(p);
            if (probe_connect(p) < 0) {
                free(frame);
                return fail("churn %d: handshake refused", i);
            }
            handshakes++;
            send_raw(p, frame, len / 2);
            probe_close(p);
            continue;
        }
        int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&ss, sl) < 0) {
            if (fd >= 0)
                close(fd);
            free(frame);
            return fail("churn %d: connect: %s", i, strerror(errno));
        }
        if (i % 4 == 1) {          /* 2 bytes of a length prefix */
            (void)send(fd, "\x10\x00", 2, MSG_NOSIGNAL);
        } else if (i % 4 == 2) {   /* a prefix and part of a body */
            uint8_t part[4 + 8] = {40, 0, 0, 0, 0x0a, 0x26, 0x08, 0x01, 0x10, 0x01, 0x1a, 0x20};
            (void)send(fd, part, sizeof part, MSG_NOSIGNAL);
        }
        close(fd);
    }
    free(frame);
    printf("ok churn: %d connect/partial-send/drop cycles (%d authenticated)\n", n, handshakes);
    return 0;
}

/* Act as a coordinator that workers join (--join): listen on --addr (port
 * 0: any; the bound address is printed), and for each of n sessions accept
 * one worker, run the handshake as the acceptor, check one request bit for
 * bit and hang up, so the worker must re-dial for the next session. */
static int sc_serve(struct probe *p, int n)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    struct shoal_err err = {0};
    if (shoal_wire_parse_addr(p->addr, &ss, &sl, &err) < 0)
        return fail("%s", err.msg);
    int one = 1, lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&ss, sl) < 0 || listen(lfd, 4) < 0)
        return fail("listen on %s: %s", p->addr, strerror(errno));
    sl = sizeof ss;
    getsockname(lfd, (struct sockaddr *)&ss, &sl);
    char bound[96];
    printf("listening on %s\n", shoal_wire_addr_str((struct sockaddr *)&ss, bound, sizeof bound));
    fflush(stdout);
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        struct pollfd pf = {.fd = lfd, .events = POLLIN};
        if (poll(&pf, 1, 60000) <= 0) {
            rc = fail("serve: no worker joined within 60 s (session %d)", i + 1);
            break;
        }
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) {
            rc = fail("accept: %s", strerror(errno));
            break;
        }
        memset(&p->c, 0, sizeof p->c);
        p->c.fd = fd;
        p->c.max_frame = SHOAL_WIRE_MAX_FRAME_DEFAULT;
        p->connected = 1;
        shoal_frame_reader_init(&p->c.reader, p->c.max_frame);
        shoal_handshake_init(&p->c.hs, 0, SHOAL__ROLE__ROLE_COORDINATOR, &p->key, &p->info,
                             p->fp, "joining worker");
        for (;;) {
            Shoal__Frame *f = recv_frame(p);
            if (!f) {
                rc = -1;
                break;
            }
            struct shoal_wire_buf out = {0};
            int h = shoal_handshake_on_frame(&p->c.hs, f, &out, &err);
            if (out.len)
                send_raw(p, out.data, out.len);
            shoal_wire_buf_free(&out);
            if (h == 1) {
                shoal_handshake_adopt(&p->c.hs, f);
                break;
            }
            shoal_wire_frame_free(f);
            if (h < 0) {
                rc = fail("serve: handshake: %s", err.msg);
                break;
            }
        }
        if (!rc) {
            const Shoal__PeerInfo *pi = p->c.hs.peer_info;
            p->cov = pi->coverage.data;
            p->cov_len = pi->coverage.len;
            rc = valid_request(p, 1 + (uint64_t)i, p->layer, NULL, 0, 5, 20 + (uint64_t)i, 1);
            if (!rc)
                printf("ok serve: session %d: worker %s joined, request identical\n", i + 1,
                       pi->name);
            fflush(stdout);
        }
        probe_close(p);
    }
    close(lfd);
    return rc;
}

/* ------------------------------------------------------------ main */

static void usage(FILE *f)
{
    fprintf(f,
        "usage: wire_probe --addr HOST:PORT --model DIR [--key FILE]\n"
        "                  [--role coordinator|worker|observer] SCENARIO [N]\n"
        "scenarios: auth valid status heartbeat hint malformed oversized zero-length\n"
        "           truncated zero-dims huge-dims bad-expert bad-layer rows-mismatch\n"
        "           dup-expert bad-row id-zero not-held big-response store-error\n"
        "           pipeline N backpressure N drop-inflight N churn N no-handshake serve N\n"
        "           unknown-fields MB cancel-on-close N parts K\n");
}

int main(int argc, char **argv)
{
    struct probe p = {.role = SHOAL__ROLE__ROLE_COORDINATOR};
    const char *key_file = NULL, *scenario = NULL;
    int count = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--addr") && i + 1 < argc)
            p.addr = argv[++i];
        else if (!strcmp(argv[i], "--model") && i + 1 < argc)
            p.model = argv[++i];
        else if (!strcmp(argv[i], "--key") && i + 1 < argc)
            key_file = argv[++i];
        else if (!strcmp(argv[i], "--role") && i + 1 < argc) {
            const char *r = argv[++i];
            p.role = !strcmp(r, "observer") ? SHOAL__ROLE__ROLE_OBSERVER
                     : !strcmp(r, "worker") ? SHOAL__ROLE__ROLE_WORKER
                                            : SHOAL__ROLE__ROLE_COORDINATOR;
        } else if (!scenario && argv[i][0] != '-')
            scenario = argv[i];
        else if (scenario && argv[i][0] != '-')
            count = atoi(argv[i]);
        else {
            usage(stderr);
            return 2;
        }
    }
    if (!p.addr || !p.model || !scenario) {
        usage(stderr);
        return 2;
    }
    shoal_quant_init(SHOAL_QUANT_ISA_AUTO, NULL);
    struct shoal_err err = {0};
    if (key_file && shoal_wire_key_load(key_file, &p.key, &err) < 0) {
        printf("key: %s\n", err.msg);
        return 2;
    }
    p.ct = shoal_container_open(p.model, &p.cfg, &err);
    if (!p.ct) {
        printf("model: %s\n", err.msg);
        return 2;
    }
    p.n_embd = p.cfg.n_embd;
    for (p.layer = 0; p.layer < p.ct->n_layer; p.layer++)
        if (p.ct->layer_offset[p.layer] != UINT64_MAX)
            break;
    snprintf(p.fp, sizeof p.fp, "%016" PRIx64, p.ct->fingerprint);
    shoal__peer_info__init(&p.info);
    p.info.name = "wire_probe";
    p.info.software = "wire_probe";
    p.info.fingerprint = p.role == SHOAL__ROLE__ROLE_OBSERVER ? "" : p.fp;
    p.info.max_frame = SHOAL_WIRE_MAX_FRAME_DEFAULT;

    int rc;
    if (!strcmp(scenario, "no-handshake")) {
        rc = sc_no_handshake(&p);
        goto out;
    }
    if (!strcmp(scenario, "serve")) {
        rc = sc_serve(&p, count > 0 ? count : 1);
        goto out;
    }
    if (probe_connect(&p) < 0) {
        rc = -1;
        goto out;
    }
    const Shoal__PeerInfo *pi = p.c.hs.peer_info;
    if (!strcmp(scenario, "auth")) {
        int held = 0;
        for (size_t i = 0; i < pi->coverage.len * 8; i++)
            held += (pi->coverage.data[i / 8] >> (i % 8)) & 1;
        char cov[1024] = "";
        for (size_t i = 0; i < pi->coverage.len && i < 500; i++)
            snprintf(cov + 2 * i, sizeof cov - 2 * i, "%02x", pi->coverage.data[i]);
        printf("ok auth: peer name=%s software=%s fingerprint=%s model=%s n_layer=%u "
               "n_expert=%u n_embd=%u experts_held=%d cores=%u disk_mbps=%.0f "
               "compute_gbps=%.2f cache_bytes=%" PRIu64 " caps=%u max_frame=%" PRIu64
               " dtype=%s coverage=%s\n", pi->name, pi->software, pi->fingerprint,
               pi->model_type, pi->n_layer, pi->n_expert, pi->n_embd, held, pi->cores,
               pi->disk_mbps, pi->compute_gbps, pi->cache_bytes, pi->caps, pi->max_frame,
               pi->expert_dtype, cov);
        rc = 0;
    } else if (!strcmp(scenario, "valid")) {
        rc = valid_request(&p, 1, p.layer, NULL, 0, count > 0 ? (uint32_t)count : 5, 1, 0);
        /* every MoE layer, every covered expert */
        for (int64_t il = 0; !rc && il < p.ct->n_layer; il++) {
            int32_t ids[256];
            int n = p.ct->layer_offset[il] == UINT64_MAX ? 0 : covered_experts(&p, il, ids, 256);
            if (n)
                rc = valid_request(&p, 100 + (uint64_t)il, il, ids, n, 7, 2 + (uint64_t)il, 1);
        }
        if (!rc)
            printf("ok valid: every covered expert of every MoE layer identical\n");
    } else if (!strcmp(scenario, "status"))
        rc = sc_status(&p);
    else if (!strcmp(scenario, "heartbeat"))
        rc = sc_heartbeat(&p);
    else if (!strcmp(scenario, "hint"))
        rc = sc_hint(&p);
    else if (!strcmp(scenario, "malformed"))
        rc = sc_malformed(&p);
    else if (!strcmp(scenario, "oversized"))
        rc = sc_bad_length(&p, SHOAL_WIRE_MAX_FRAME_DEFAULT + 1, "oversized length prefix");
    else if (!strcmp(scenario, "huge-length"))
        rc = sc_bad_length(&p, UINT32_MAX, "length prefix 2^32-1");
    else if (!strcmp(scenario, "zero-length"))
        rc = sc_bad_length(&p, 0, "zero length prefix");
    else if (!strcmp(scenario, "truncated"))
        rc = sc_truncated(&p);
    else if (!strcmp(scenario, "zero-dims"))
        rc = bad_request(&p, "n_rows 0", SHOAL_ERANGE, m_zero_rows) ||
             bad_request(&p, "n_embd 0", SHOAL_ESHAPE, m_zero_embd) ||
             bad_request(&p, "no experts", SHOAL_ERANGE, m_no_experts) ||
             bad_request(&p, "expert without rows", SHOAL_ERANGE, m_expert_no_rows) ? -1 : 0;
    else if (!strcmp(scenario, "huge-dims"))
        rc = bad_request(&p, "n_rows 2^32-1", SHOAL_ERANGE, m_huge_rows) ||
             bad_request(&p, "n_embd 2^32-1", SHOAL_ESHAPE, m_huge_embd) ||
             bad_request(&p, "n_expert+1 experts", SHOAL_ERANGE, m_too_many_experts) ? -1 : 0;
    else if (!strcmp(scenario, "bad-expert"))
        rc = bad_request(&p, "expert n_expert", SHOAL_ERANGE, m_bad_expert) ||
             bad_request(&p, "expert 2^32-1", SHOAL_ERANGE, m_huge_expert) ? -1 : 0;
    else if (!strcmp(scenario, "bad-layer"))
        rc = bad_request(&p, "layer n_layer", SHOAL_ERANGE, m_bad_layer) ||
             bad_request(&p, "layer 2^32-1", SHOAL_ERANGE, m_huge_layer) ? -1 : 0;
    else if (!strcmp(scenario, "rows-mismatch"))
        rc = bad_request(&p, "hidden one float short", SHOAL_EFORMAT, m_rows_mismatch);
    else if (!strcmp(scenario, "dup-expert"))
        rc = bad_request(&p, "expert twice", SHOAL_EFORMAT, m_dup_expert);
    else if (!strcmp(scenario, "bad-row"))
        rc = bad_request(&p, "row index n_rows", SHOAL_ERANGE, m_bad_row);
    else if (!strcmp(scenario, "id-zero"))
        rc = bad_request(&p, "request id 0", SHOAL_EFORMAT, m_id_zero);
    else if (!strcmp(scenario, "not-held"))
        rc = bad_request(&p, "expert outside the shard", SHOAL_ENOTFOUND, m_not_held);
    else if (!strcmp(scenario, "big-response")) {
        /* every expert on 8192 rows: the response would pass the 64 MiB frame */
        int32_t ids[256];
        int n = covered_experts(&p, p.layer, ids, 256);
        struct req r;
        req_build(&r, 55, p.layer, ids, n, 8192, p.n_embd, 1);
        for (int k = 0; k < n; k++) {
            r.er[k].n_rows = 8192;
            for (uint32_t j = 0; j < 8192; j++)
                r.er[k].rows[j] = j;
        }
        rc = send_frame(&p, &r.f) || expect_error(&p, "response over the frame limit", 55,
                                                  SHOAL_ERANGE)
                 ? -1 : valid_request(&p, 56, p.layer, NULL, 0, 3, 9, 0);
        req_free(&r);
    } else if (!strcmp(scenario, "store-error")) {
        /* the last expert of the last MoE layer, whose blob the test damaged:
         * an error reply naming the request, then the worker serves on */
        int64_t il = p.ct->n_layer - 1;
        while (il > 0 && p.ct->layer_offset[il] == UINT64_MAX)
            il--;
        int32_t ie = (int32_t)p.ct->n_expert - 1;
        struct req r;
        req_build(&r, 66, il, &ie, 1, 3, p.n_embd, 1);
        rc = send_frame(&p, &r.f) || expect_error(&p, "damaged expert blob", 66, 0)
                 ? -1 : valid_request(&p, 67, p.layer, NULL, 0, 3, 9, 0);
        req_free(&r);
    } else if (!strcmp(scenario, "drop-inflight")) {
        /* large requests, then hang up without reading: the worker must
         * discard their replies safely and serve the next connection. Each
         * request carries about 4 MiB of rows, so that six of them and
         * their replies (48 MiB) stay under the worker's 64 MiB
         * backpressure budget: the worker reads them all, and the sends
         * cannot block on a paused reader (with 2048 rows a request, the
         * budget paused reading after two or three, and whether the rest
         * fit the socket buffers was a matter of timing) */
        int32_t ids[256];
        int n = covered_experts(&p, p.layer, ids, 256);
        const int64_t per_row = (int64_t)(n > 0 ? n : 1) * p.n_embd * 4;
        uint32_t nr = (uint32_t)((4 << 20) / (per_row > 0 ? per_row : 1));
        nr = nr < 4 ? 4 : nr > 2048 ? 2048 : nr;
        struct req r;
        req_build(&r, 90, p.layer, ids, n, nr, p.n_embd, 3);
        for (int k = 0; k < n; k++) {
            r.er[k].n_rows = nr;
            for (uint32_t j = 0; j < nr; j++)
                r.er[k].rows[j] = j;
        }
        int nreq = count > 0 ? count : 6;
        rc = 0;
        for (int i = 0; i < nreq && !rc; i++) {
            r.rq.id = 90 + (uint64_t)i;
            rc = send_frame(&p, &r.f);
        }
        req_free(&r);
        probe_close(&p);
        if (!rc)
            printf("ok drop-inflight: %d requests of %u rows x %d experts sent, connection "
                   "dropped unread\n", nreq, nr, n);
        if (!rc && (rc = probe_connect(&p)) == 0)
            rc = valid_request(&p, 99, p.layer, NULL, 0, 3, 9, 0);
    } else if (!strcmp(scenario, "pipeline"))
        rc = sc_pipeline(&p, count > 0 ? count : 16);
    else if (!strcmp(scenario, "parts"))
        rc = sc_parts(&p, count > 0 ? (uint32_t)count : 3);
    else if (!strcmp(scenario, "backpressure"))
        rc = sc_backpressure(&p, count > 0 ? count : 12);
    else if (!strcmp(scenario, "churn"))
        rc = sc_churn(&p, count > 0 ? count : 100);
    else if (!strcmp(scenario, "unknown-fields"))
        rc = sc_unknown_fields(&p, count > 0 ? count : 4);
    else if (!strcmp(scenario, "cancel-on-close"))
        rc = sc_cancel_on_close(&p, count > 0 ? count : 8);
    else {
        usage(stderr);
        rc = -2;
    }
out:
    probe_close(&p);
    shoal_expert_store_destroy(p.store);
    shoal_container_close(p.ct);
    fflush(stdout);
    return rc == -2 ? 2 : rc ? 1 : 0;
}
