/* wire: framing, handshake, key and request validation (common/net/wire.h). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wire.h"

/* ---- framing ---- */

struct got {
    int n;
    uint64_t ids[16];
    int bad;
};

static int on_frame(void *user, const uint8_t *body, size_t len)
{
    struct got *g = user;
    Shoal__Frame *f = shoal_wire_unpack(body, len, NULL);
    if (!f) {
        g->bad++;
        return 0;
    }
    cr_assert_eq(f->msg_case, SHOAL__FRAME__MSG_HEARTBEAT);
    g->ids[g->n++] = f->heartbeat->id;
    shoal_wire_frame_free(f);
    return 0;
}

static void heartbeat(Shoal__Frame *f, Shoal__Heartbeat *h, uint64_t id)
{
    shoal__frame__init(f);
    shoal__heartbeat__init(h);
    h->id = id;
    h->sent_ns = id * 1000;
    f->msg_case = SHOAL__FRAME__MSG_HEARTBEAT;
    f->heartbeat = h;
}

Test(wire, frames_survive_any_split)
{
    struct shoal_wire_buf b = {0};
    for (uint64_t id = 1; id <= 5; id++) {
        Shoal__Frame f;
        Shoal__Heartbeat h;
        heartbeat(&f, &h, id * 77);
        cr_assert_eq(shoal_wire_buf_append(&b, &f, 1 << 20, NULL), 0);
    }
    /* feed in chunks of every size from 1 to the whole stream */
    for (size_t chunk = 1; chunk <= b.len; chunk++) {
        struct shoal_frame_reader r;
        shoal_frame_reader_init(&r, 1 << 20);
        struct got g = {0};
        for (size_t off = 0; off < b.len; off += chunk) {
            size_t n = b.len - off < chunk ? b.len - off : chunk;
            cr_assert_eq(shoal_frame_reader_feed(&r, b.data + off, n, on_frame, &g, NULL), 0);
        }
        cr_assert_eq(g.n, 5, "chunk %zu: %d frames", chunk, g.n);
        for (int i = 0; i < 5; i++)
            cr_assert_eq(g.ids[i], (uint64_t)(i + 1) * 77);
        cr_assert_eq(r.len, 0);
        shoal_frame_reader_free(&r);
    }
    shoal_wire_buf_free(&b);
}

Test(wire, oversized_and_zero_lengths_are_refused)
{
    struct shoal_frame_reader r;
    shoal_frame_reader_init(&r, 1000);
    struct got g = {0};
    struct shoal_err err = {0};
    const uint8_t big[4] = {0xe9, 0x03, 0, 0}; /* 1001 */
    cr_assert_eq(shoal_frame_reader_feed(&r, big, 4, on_frame, &g, &err), SHOAL_ERANGE);
    cr_assert(strstr(err.msg, "1001") && strstr(err.msg, "1000"), "%s", err.msg);
    shoal_frame_reader_free(&r);

    shoal_frame_reader_init(&r, 1000);
    const uint8_t zero[4] = {0, 0, 0, 0};
    cr_assert_eq(shoal_frame_reader_feed(&r, zero, 4, on_frame, &g, NULL), SHOAL_ERANGE);
    shoal_frame_reader_free(&r);

    /* a sender refuses to pack what the peer would refuse */
    Shoal__Frame f;
    Shoal__Heartbeat h;
    heartbeat(&f, &h, 1);
    struct shoal_wire_buf b = {0};
    cr_assert_eq(shoal_wire_buf_append(&b, &f, 2, NULL), SHOAL_ERANGE);
    shoal_wire_buf_free(&b);
}

Test(wire, garbage_body_is_malformed_but_stream_stays_in_sync)
{
    uint8_t stream[64];
    size_t n = 0;
    const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0xff};
    stream[n++] = sizeof junk;
    stream[n++] = 0;
    stream[n++] = 0;
    stream[n++] = 0;
    memcpy(stream + n, junk, sizeof junk);
    n += sizeof junk;
    Shoal__Frame f;
    Shoal__Heartbeat h;
    heartbeat(&f, &h, 9);
    size_t len;
    uint8_t *p = shoal_wire_pack(&f, 1 << 20, &len, NULL);
    cr_assert_not_null(p);
    memcpy(stream + n, p, len);
    n += len;
    free(p);
    struct shoal_frame_reader r;
    shoal_frame_reader_init(&r, 1 << 20);
    struct got g = {0};
    cr_assert_eq(shoal_frame_reader_feed(&r, stream, n, on_frame, &g, NULL), 0);
    cr_assert_eq(g.bad, 1);
    cr_assert_eq(g.n, 1);
    cr_assert_eq(g.ids[0], 9);
    shoal_frame_reader_free(&r);
}

/* ---- memory bounds (issue 12) ---- */

Test(wire, reader_buffer_grows_with_the_bytes_that_arrive)
{
    struct shoal_frame_reader r;
    shoal_frame_reader_init(&r, 64u << 20);
    struct got g = {0};
    const uint8_t prefix[4] = {0xff, 0xff, 0xff, 0x03}; /* 64 MiB - 1 announced */
    cr_assert_eq(shoal_frame_reader_feed(&r, prefix, 4, on_frame, &g, NULL), 0);
    const uint8_t one = 0x3a;
    cr_assert_eq(shoal_frame_reader_feed(&r, &one, 1, on_frame, &g, NULL), 0);
    cr_assert(r.cap <= 512, "one body byte of a 64 MiB frame holds %zu bytes", r.cap);
    static uint8_t chunk[10000];
    size_t got = 5;
    for (int i = 0; i < 100; i++) {
        cr_assert_eq(shoal_frame_reader_feed(&r, chunk, sizeof chunk, on_frame, &g, NULL), 0);
        got += sizeof chunk;
        cr_assert(r.cap >= got && r.cap <= 2 * got + 256,
                  "after %zu bytes the buffer holds %zu (expected at most twice that)", got,
                  r.cap);
    }
    cr_assert_eq(shoal_frame_reader_buffered(&r), r.cap);
    cr_assert_eq(g.n + g.bad, 0);
    shoal_frame_reader_free(&r);
}

Test(wire, a_frame_of_unknown_fields_is_refused_before_any_allocation)
{
    static uint8_t body[1 << 16];
    for (size_t i = 0; i < sizeof body; i += 2) {
        body[i] = 0x78;   /* field 15, varint */
        body[i + 1] = 0;
    }
    struct shoal_err err = {0};
    size_t used = 1;
    Shoal__Frame *f = shoal_wire_unpack_bounded(body, sizeof body,
                                                shoal_wire_unpack_budget(sizeof body), &used,
                                                &err);
    cr_assert_null(f);
    cr_assert_eq(err.code, SHOAL_EFORMAT);
    cr_assert_eq(used, 0, "%zu bytes allocated", used);
    cr_assert(strstr(err.msg, "field 15"), "%s", err.msg);
}

/* A heartbeat (field 7) whose body is n_fields unknown varint fields. */
static uint8_t *nested_unknown(size_t n_fields, size_t *len)
{
    size_t inner = 2 * n_fields;
    uint8_t *b = malloc(inner + 16);
    size_t o = 0;
    b[o++] = 0x3a;
    for (size_t v = inner; ; v >>= 7) {
        b[o++] = (uint8_t)(v & 0x7f) | (v >= 0x80 ? 0x80 : 0);
        if (v < 0x80)
            break;
    }
    for (size_t i = 0; i < n_fields; i++) {
        b[o++] = 0x78;
        b[o++] = 0;
    }
    *len = o;
    return b;
}

Test(wire, nested_unknown_fields_are_refused_before_any_allocation)
{
    size_t len;
    uint8_t *body = nested_unknown(1u << 19, &len);   /* 1 MiB of `78 00` */
    struct shoal_err err = {0};
    size_t used = 1, budget = shoal_wire_unpack_budget(len);
    cr_assert_eq(budget, SHOAL_WIRE_UNPACK_FACTOR * len + SHOAL_WIRE_UNPACK_SLACK);
    Shoal__Frame *f = shoal_wire_unpack_bounded(body, len, budget, &used, &err);
    cr_assert_null(f);
    cr_assert_eq(used, 0, "%zu bytes allocated", used);
    cr_assert_eq(err.code, SHOAL_EFORMAT);
    cr_assert(strstr(err.msg, "Heartbeat") && strstr(err.msg, "unknown field 15"), "%s",
              err.msg);
    free(body);
}

Test(wire, many_empty_submessages_stop_at_the_budget)
{
    /* a request of 512 Ki empty ExpertRows (`32 00` each): 1 MiB on the
     * wire, ~100 bytes each once unpacked */
    const size_t n = 1u << 19, inner = 2 * n;
    uint8_t *body = malloc(inner + 8);
    size_t o = 0;
    body[o++] = 0x22;   /* Frame.request */
    for (size_t v = inner;; v >>= 7) {
        body[o++] = (uint8_t)((v & 0x7f) | (v >= 0x80 ? 0x80 : 0));
        if (v < 0x80)
            break;
    }
    for (size_t i = 0; i < n; i++) {
        body[o++] = 0x32;   /* ExpertRequest.experts, empty */
        body[o++] = 0;
    }
    struct shoal_err err = {0};
    size_t used = 0, budget = shoal_wire_unpack_budget(o);
    cr_assert_null(shoal_wire_unpack_bounded(body, o, budget, &used, &err));
    cr_assert_eq(err.code, SHOAL_ERANGE, "%s", err.msg);
    cr_assert(used <= budget, "%zu bytes charged, budget %zu", used, budget);
    free(body);
}

Test(wire, frames_over_their_message_size_or_with_two_messages_are_refused)
{
    /* a hello of 300 bytes (its real size is under 100) */
    uint8_t body[303] = {0x0a, 0xac, 0x02};   /* field 1, length 300 */
    struct shoal_err err = {0};
    size_t used = 1;
    cr_assert_null(shoal_wire_unpack_bounded(body, sizeof body, 1u << 20, &used, &err));
    cr_assert_eq(err.code, SHOAL_ERANGE);
    cr_assert_eq(used, 0);
    cr_assert(strstr(err.msg, "hello") && strstr(err.msg, "256"), "%s", err.msg);
    /* two status requests in one frame */
    const uint8_t two[] = {0x42, 0x02, 0x08, 0x01, 0x42, 0x02, 0x08, 0x02};
    memset(&err, 0, sizeof err);
    cr_assert_null(shoal_wire_unpack(two, sizeof two, &err));
    cr_assert_eq(err.code, SHOAL_EFORMAT);
    cr_assert_eq(shoal_wire_msg_max_bytes(SHOAL__FRAME__MSG_REQUEST), 0);
    cr_assert_eq(shoal_wire_msg_max_bytes(SHOAL__FRAME__MSG_AUTH),
                 SHOAL_WIRE_HANDSHAKE_MAX_FRAME);
}

Test(wire, the_budget_refuses_what_does_not_fit_and_admits_real_requests)
{
    /* a request of 8 experts x 2048 rows with its hidden rows */
    enum { N_EXP = 8, N_ROWS = 2048, N_EMBD = 64 };
    static uint32_t rows[N_EXP][N_ROWS];
    static float hidden[N_ROWS * N_EMBD];
    Shoal__ExpertRows er[N_EXP], *erp[N_EXP];
    for (int k = 0; k < N_EXP; k++) {
        shoal__expert_rows__init(&er[k]);
        er[k].expert = (uint32_t)k;
        for (int j = 0; j < N_ROWS; j++)
            rows[k][j] = (uint32_t)j;
        er[k].rows = rows[k];
        er[k].n_rows = N_ROWS;
        erp[k] = &er[k];
    }
    Shoal__ExpertRequest rq = SHOAL__EXPERT_REQUEST__INIT;
    rq.id = 5;
    rq.n_rows = N_ROWS;
    rq.n_embd = N_EMBD;
    rq.hidden.data = (uint8_t *)hidden;
    rq.hidden.len = sizeof hidden;
    rq.experts = erp;
    rq.n_experts = N_EXP;
    Shoal__Frame f = SHOAL__FRAME__INIT;
    f.msg_case = SHOAL__FRAME__MSG_REQUEST;
    f.request = &rq;
    size_t len;
    uint8_t *p = shoal_wire_pack(&f, 64u << 20, &len, NULL);
    cr_assert_not_null(p);
    struct shoal_err err = {0};
    size_t used = 0;
    Shoal__Frame *g = shoal_wire_unpack_bounded(p + 4, len - 4, shoal_wire_unpack_budget(len - 4),
                                                &used, &err);
    cr_assert_not_null(g, "%s", err.msg);
    cr_assert_eq(g->request->n_experts, N_EXP);
    cr_assert_eq(g->request->experts[7]->rows[2047], 2047);
    cr_assert(used > len - 4 && used <= shoal_wire_unpack_budget(len - 4), "%zu of %zu",
              used, shoal_wire_unpack_budget(len - 4));
    shoal_wire_frame_free(g);
    /* the same frame under a smaller budget: refused, nothing kept */
    memset(&err, 0, sizeof err);
    cr_assert_null(shoal_wire_unpack_bounded(p + 4, len - 4, used / 2, NULL, &err));
    cr_assert_eq(err.code, SHOAL_ERANGE, "%s", err.msg);
    cr_assert(strstr(err.msg, "budget"), "%s", err.msg);
    free(p);
}

/* ---- handshake ---- */

/* Run a handshake between a connector and an acceptor in memory.
 * Returns 1 when both finished, else the failing side's status. */
static int run_handshake(struct shoal_handshake *c, struct shoal_handshake *a,
                         struct shoal_err *ec, struct shoal_err *ea)
{
    struct shoal_wire_buf to_a = {0}, to_c = {0};
    int rc = shoal_handshake_start(c, &to_a, ec);
    cr_assert_eq(rc, 0);
    int done_c = 0, done_a = 0, result = 0;
    for (int step = 0; step < 8 && !(done_c && done_a) && result == 0; step++) {
        struct shoal_wire_buf *bufs[2] = {&to_a, &to_c};
        struct shoal_handshake *dst[2] = {a, c};
        struct shoal_wire_buf *back[2] = {&to_c, &to_a};
        struct shoal_err *errs[2] = {ea, ec};
        int *done[2] = {&done_a, &done_c};
        for (int side = 0; side < 2 && result == 0; side++) {
            struct shoal_wire_buf *in = bufs[side];
            size_t off = 0;
            struct shoal_wire_buf pending = *in;
            memset(in, 0, sizeof *in);
            while (off < pending.len) {
                uint32_t body = (uint32_t)pending.data[off] | pending.data[off + 1] << 8 |
                                pending.data[off + 2] << 16 | (uint32_t)pending.data[off + 3] << 24;
                Shoal__Frame *f = shoal_wire_unpack(pending.data + off + 4, body, NULL);
                cr_assert_not_null(f);
                off += 4 + body;
                int r = shoal_handshake_on_frame(dst[side], f, back[side], errs[side]);
                if (r == 1) {
                    shoal_handshake_adopt(dst[side], f);
                    *done[side] = 1;
                } else {
                    shoal_wire_frame_free(f);
                }
                if (r < 0) {
                    result = r;
                    /* deliver the error reply so the other side learns why */
                    break;
                }
            }
            shoal_wire_buf_free(&pending);
        }
    }
    shoal_wire_buf_free(&to_a);
    shoal_wire_buf_free(&to_c);
    return result ? result : (done_c && done_a);
}

static struct shoal_wire_key key_of(const char *secret)
{
    char path[] = "/tmp/shoal-test-key-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, secret, strlen(secret)), (ssize_t)strlen(secret));
    close(fd);
    struct shoal_wire_key k;
    struct shoal_err err = {0};
    int rc = shoal_wire_key_load(path, &k, &err);
    unlink(path);
    cr_assert_eq(rc, 0, "%s", err.msg);
    return k;
}

Test(wire, handshake_with_the_same_key_exchanges_info)
{
    struct shoal_wire_key k = key_of("correct horse battery staple\n");
    struct shoal_wire_key k2 = key_of("  correct horse battery staple  ");
    cr_assert_eq(memcmp(k.bytes, k2.bytes, sizeof k.bytes), 0, "whitespace is not the key");
    Shoal__PeerInfo ci = SHOAL__PEER_INFO__INIT, wi = SHOAL__PEER_INFO__INIT;
    ci.fingerprint = "0123456789abcdef";
    ci.name = "coord";
    wi.fingerprint = "0123456789abcdef";
    wi.name = "worker-1";
    wi.n_expert = 8;
    struct shoal_handshake c, a;
    shoal_handshake_init(&c, 1, SHOAL__ROLE__ROLE_COORDINATOR, &k, &ci, "0123456789abcdef", "w");
    shoal_handshake_init(&a, 0, SHOAL__ROLE__ROLE_WORKER, &k2, &wi, "0123456789abcdef", "c");
    struct shoal_err ec = {0}, ea = {0};
    cr_assert_eq(run_handshake(&c, &a, &ec, &ea), 1, "%s | %s", ec.msg, ea.msg);
    cr_assert_str_eq(c.peer_info->name, "worker-1");
    cr_assert_eq(c.peer_info->n_expert, 8);
    cr_assert_str_eq(a.peer_info->name, "coord");
    cr_assert_eq(c.peer_role, SHOAL__ROLE__ROLE_WORKER);
    shoal_handshake_free(&c);
    shoal_handshake_free(&a);
}

Test(wire, handshake_refuses_a_wrong_key_before_any_info)
{
    struct shoal_wire_key k1 = key_of("the first secret key 1234"), k2 = key_of("another secret key 5678");
    Shoal__PeerInfo ci = SHOAL__PEER_INFO__INIT, wi = SHOAL__PEER_INFO__INIT;
    ci.fingerprint = wi.fingerprint = "0123456789abcdef";
    struct shoal_handshake c, a;
    shoal_handshake_init(&c, 1, SHOAL__ROLE__ROLE_COORDINATOR, &k1, &ci, NULL, "w");
    shoal_handshake_init(&a, 0, SHOAL__ROLE__ROLE_WORKER, &k2, &wi, NULL, "c");
    struct shoal_err ec = {0}, ea = {0};
    int rc = run_handshake(&c, &a, &ec, &ea);
    cr_assert_lt(rc, 0);
    /* the connector checks the acceptor's proof first and never sends its info */
    cr_assert(strstr(ec.msg, "authentication failed"), "%s", ec.msg);
    cr_assert_null(a.peer_info);
    cr_assert_null(c.peer_info);
    shoal_handshake_free(&c);
    shoal_handshake_free(&a);
}

Test(wire, handshake_refuses_a_key_on_one_side_only)
{
    struct shoal_wire_key k = key_of("only the worker has this key");
    Shoal__PeerInfo ci = SHOAL__PEER_INFO__INIT, wi = SHOAL__PEER_INFO__INIT;
    struct shoal_handshake c, a;
    shoal_handshake_init(&c, 1, SHOAL__ROLE__ROLE_COORDINATOR, NULL, &ci, NULL, "w");
    shoal_handshake_init(&a, 0, SHOAL__ROLE__ROLE_WORKER, &k, &wi, NULL, "c");
    struct shoal_err ec = {0}, ea = {0};
    cr_assert_lt(run_handshake(&c, &a, &ec, &ea), 0);
    cr_assert(strstr(ea.msg, "has none"), "%s", ea.msg);
    shoal_handshake_free(&c);
    shoal_handshake_free(&a);
}

Test(wire, handshake_refuses_a_wrong_fingerprint_and_two_coordinators)
{
    Shoal__PeerInfo ci = SHOAL__PEER_INFO__INIT, wi = SHOAL__PEER_INFO__INIT;
    ci.fingerprint = "aaaaaaaaaaaaaaaa";
    wi.fingerprint = "bbbbbbbbbbbbbbbb";
    struct shoal_handshake c, a;
    shoal_handshake_init(&c, 1, SHOAL__ROLE__ROLE_COORDINATOR, NULL, &ci, "aaaaaaaaaaaaaaaa",
                         "10.0.0.2:7070");
    shoal_handshake_init(&a, 0, SHOAL__ROLE__ROLE_WORKER, NULL, &wi, NULL, "c");
    struct shoal_err ec = {0}, ea = {0};
    cr_assert_lt(run_handshake(&c, &a, &ec, &ea), 0);
    cr_assert(strstr(ec.msg, "10.0.0.2:7070") && strstr(ec.msg, "the worker has model bbbbbbbbbbbbbbbb") &&
              strstr(ec.msg, "aaaaaaaaaaaaaaaa"), "%s", ec.msg);
    shoal_handshake_free(&c);
    shoal_handshake_free(&a);

    shoal_handshake_init(&c, 1, SHOAL__ROLE__ROLE_COORDINATOR, NULL, &ci, NULL, "x");
    shoal_handshake_init(&a, 0, SHOAL__ROLE__ROLE_COORDINATOR, NULL, &ci, NULL, "y");
    memset(&ec, 0, sizeof ec);
    memset(&ea, 0, sizeof ea);
    cr_assert_lt(run_handshake(&c, &a, &ec, &ea), 0);
    cr_assert(strstr(ea.msg, "coordinator"), "%s", ea.msg);
    shoal_handshake_free(&c);
    shoal_handshake_free(&a);
}

Test(wire, short_key_file_is_refused)
{
    char path[] = "/tmp/shoal-test-key-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_eq(write(fd, "short\n", 6), 6);
    close(fd);
    struct shoal_wire_key k;
    struct shoal_err err = {0};
    cr_assert_lt(shoal_wire_key_load(path, &k, &err), 0);
    cr_assert(strstr(err.msg, path) && strstr(err.msg, "at least 16"), "%s", err.msg);
    unlink(path);
}

/* ---- request validation ---- */

Test(wire, request_validation_names_what_is_wrong)
{
    uint32_t rows0[] = {0, 1}, rows1[] = {1};
    Shoal__ExpertRows e0 = SHOAL__EXPERT_ROWS__INIT, e1 = SHOAL__EXPERT_ROWS__INIT;
    e0.expert = 3;
    e0.rows = rows0;
    e0.n_rows = 2;
    e1.expert = 5;
    e1.rows = rows1;
    e1.n_rows = 1;
    Shoal__ExpertRows *ex[] = {&e0, &e1};
    float hidden[2 * 4] = {0};
    Shoal__ExpertRequest rq = SHOAL__EXPERT_REQUEST__INIT;
    rq.id = 7;
    rq.layer = 1;
    rq.n_rows = 2;
    rq.n_embd = 4;
    rq.hidden.data = (uint8_t *)hidden;
    rq.hidden.len = sizeof hidden;
    rq.experts = ex;
    rq.n_experts = 2;
    uint8_t is_moe[3] = {0, 1, 1};
    uint8_t cov[3] = {0};      /* 3 layers x 8 experts = 24 bits */
    cov[(1 * 8 + 3) / 8] |= 1u << ((1 * 8 + 3) % 8);
    cov[(1 * 8 + 5) / 8] |= 1u << ((1 * 8 + 5) % 8);
    struct shoal_err err = {0};
    cr_assert_eq(shoal_wire_check_request(&rq, 3, 8, 4, is_moe, cov, 3, 64, &err), 0, "%s",
                 err.msg);

    rq.hidden.len -= 4;
    memset(&err, 0, sizeof err);
    cr_assert_eq(shoal_wire_check_request(&rq, 3, 8, 4, is_moe, cov, 3, 64, &err), SHOAL_EFORMAT);
    cr_assert(strstr(err.msg, "28 bytes") && strstr(err.msg, "32"), "%s", err.msg);
    rq.hidden.len += 4;

    e1.expert = 4; /* not held */
    memset(&err, 0, sizeof err);
    cr_assert_eq(shoal_wire_check_request(&rq, 3, 8, 4, is_moe, cov, 3, 64, &err),
                 SHOAL_ENOTFOUND);
    cr_assert(strstr(err.msg, "expert 4"), "%s", err.msg);
    e1.expert = 3; /* duplicate */
    memset(&err, 0, sizeof err);
    cr_assert_eq(shoal_wire_check_request(&rq, 3, 8, 4, is_moe, NULL, 0, 64, &err), SHOAL_EFORMAT);
    e1.expert = 9; /* out of range */
    cr_assert_eq(shoal_wire_check_request(&rq, 3, 8, 4, is_moe, NULL, 0, 64, NULL), SHOAL_ERANGE);
    e1.expert = 5;
    rows1[0] = 2; /* row out of range */
    cr_assert_eq(shoal_wire_check_request(&rq, 3, 8, 4, is_moe, NULL, 0, 64, NULL), SHOAL_ERANGE);
    rows1[0] = 1;
    rq.layer = 0; /* dense layer */
    cr_assert_eq(shoal_wire_check_request(&rq, 3, 8, 4, is_moe, NULL, 0, 64, NULL), SHOAL_ERANGE);
    rq.layer = 3;
    cr_assert_eq(shoal_wire_check_request(&rq, 3, 8, 4, is_moe, NULL, 0, 64, NULL), SHOAL_ERANGE);
    rq.layer = 1;
    rq.n_embd = 5;
    cr_assert_eq(shoal_wire_check_request(&rq, 3, 8, 4, is_moe, NULL, 0, 64, NULL), SHOAL_ESHAPE);
    rq.n_embd = 4;
    rq.n_rows = 0xffffffffu; /* huge: rows x n_embd x 4 must not overflow into a match */
    cr_assert_eq(shoal_wire_check_request(&rq, 3, 8, 4, is_moe, NULL, 0, 64, NULL), SHOAL_ERANGE);
    rq.n_rows = 2;
    rq.id = 0;
    cr_assert_eq(shoal_wire_check_request(&rq, 3, 8, 4, is_moe, NULL, 0, 64, NULL), SHOAL_EFORMAT);
}

/* A response in parts (ExpertRequest.parts): each part whole rows, inside
 * the request's rows, with a last frame still to come; the last frame
 * (the parts put before it) exactly the request's rows and no `more`. */
Test(wire, response_parts_are_whole_rows_inside_the_request)
{
    enum { E = 4, ROW = E * 4 };
    uint8_t buf[10 * ROW] = {0};
    Shoal__ExpertResponse rs = SHOAL__EXPERT_RESPONSE__INIT;
    rs.id = 7;
    rs.more = 1;
    struct shoal_err err = {0};
    /* 3 rows after 2 of 6, 3 frames left: fine; up to the last row too */
    rs.out = (ProtobufCBinaryData){.data = buf, .len = 3 * ROW};
    err = (struct shoal_err){0};
    cr_assert_eq(shoal_wire_check_response_part(&rs, 2 * ROW, 6, E, 3, &err), 0, "%s", err.msg);
    rs.out.len = 4 * ROW;
    err = (struct shoal_err){0};
    cr_assert_eq(shoal_wire_check_response_part(&rs, 2 * ROW, 6, E, 2, &err), 0, "%s", err.msg);
    /* past the request's rows, from the first part or after others */
    rs.out.len = 5 * ROW;
    err = (struct shoal_err){0};
    cr_assert_eq(shoal_wire_check_response_part(&rs, 2 * ROW, 6, E, 3, &err), SHOAL_EFORMAT);
    cr_assert(strstr(err.msg, "at most 6 rows"), "%s", err.msg);
    rs.out.len = 1 * ROW;
    err = (struct shoal_err){0};
    cr_assert_eq(shoal_wire_check_response_part(&rs, 7 * ROW, 6, E, 3, &err), SHOAL_EFORMAT);
    /* empty, or not whole rows */
    rs.out.len = 0;
    err = (struct shoal_err){0};
    cr_assert_eq(shoal_wire_check_response_part(&rs, 0, 6, E, 3, &err), SHOAL_EFORMAT);
    rs.out.len = ROW + 1;
    err = (struct shoal_err){0};
    cr_assert_eq(shoal_wire_check_response_part(&rs, 0, 6, E, 3, &err), SHOAL_EFORMAT);
    cr_assert(strstr(err.msg, "multiple of n_embd 4"), "%s", err.msg);
    /* no frame left for the last one: more parts than the request allowed */
    rs.out.len = ROW;
    err = (struct shoal_err){0};
    cr_assert_eq(shoal_wire_check_response_part(&rs, 0, 6, E, 1, &err), SHOAL_EFORMAT);
    cr_assert(strstr(err.msg, "more parts"), "%s", err.msg);
    /* a part is never a whole response, even of the right size */
    rs.out.len = 6 * ROW;
    err = (struct shoal_err){0};
    cr_assert_eq(shoal_wire_check_response(&rs, 6, E, &err), SHOAL_EFORMAT);
    rs.more = 0;
    err = (struct shoal_err){0};
    cr_assert_eq(shoal_wire_check_response(&rs, 6, E, &err), 0, "%s", err.msg);
}

Test(wire, addresses)
{
    struct sockaddr_storage ss;
    socklen_t len;
    cr_assert_eq(shoal_wire_parse_addr("127.0.0.1:7070", &ss, &len, NULL), 0);
    cr_assert(shoal_wire_addr_is_loopback(&ss));
    cr_assert_eq(shoal_wire_parse_addr("[::1]:80", &ss, &len, NULL), 0);
    cr_assert(shoal_wire_addr_is_loopback(&ss));
    cr_assert_eq(shoal_wire_parse_addr("10.1.2.3:80", &ss, &len, NULL), 0);
    cr_assert_not(shoal_wire_addr_is_loopback(&ss));
    char buf[64];
    cr_assert_str_eq(shoal_wire_addr_str((struct sockaddr *)&ss, buf, sizeof buf), "10.1.2.3:80");
    struct shoal_err err = {0};
    cr_assert_lt(shoal_wire_parse_addr("nohostport", &ss, &len, &err), 0);
    cr_assert(strstr(err.msg, "HOST:PORT"), "%s", err.msg);
    cr_assert_lt(shoal_wire_parse_addr("1.2.3.4:99999", &ss, &len, NULL), 0);
    cr_assert_lt(shoal_wire_parse_addr("1.2.3.4:", &ss, &len, NULL), 0);
}

/* The handshake table (issue 12): when it is full, a new connection evicts
 * the least advanced one of the address that holds the most slots, or of
 * its own address when that is at its share. An address that churns
 * silent connections must not evict another address's one connection
 * (a real peer whose hello is still on its way). */
Test(wire, preauth_victims_come_from_the_address_holding_most_slots)
{
    struct shoal_preauth p;
    shoal_preauth_init(&p, 4, 3);
    struct shoal_handshake hs[5];
    int conn[5];
    for (int i = 0; i < 5; i++)
        shoal_handshake_init(&hs[i], 0, SHOAL__ROLE__ROLE_WORKER, NULL, NULL, NULL, "peer");
    /* the real peer first (the oldest), then three silent ones from .9 */
    shoal_preauth_add(&p, &conn[0], &hs[0], -1, "10.0.0.1:5000");
    cr_assert_null(shoal_preauth_victim(&p, "10.0.0.9:1"), "room left");
    shoal_preauth_add(&p, &conn[1], &hs[1], -1, "10.0.0.9:1");
    shoal_preauth_add(&p, &conn[2], &hs[2], -1, "10.0.0.9:2");
    shoal_preauth_add(&p, &conn[3], &hs[3], -1, "10.0.0.9:3");
    /* full: a fourth from .9 (at its share) evicts .9's oldest */
    cr_assert_eq(shoal_preauth_victim(&p, "10.0.0.9:4"), &conn[1]);
    /* a newcomer from elsewhere evicts from .9 too, not the older .1 */
    cr_assert_eq(shoal_preauth_victim(&p, "10.0.0.7:1"), &conn[1]);
    /* progress protects within the address: .9's oldest has said hello */
    hs[1].state = SHOAL_HS_WAIT_AUTH;
    cr_assert_eq(shoal_preauth_victim(&p, "10.0.0.7:1"), &conn[2]);
    shoal_preauth_remove(&p, &conn[2]);
    cr_assert_null(shoal_preauth_victim(&p, "10.0.0.7:1"), "room after a removal");
    for (int i = 0; i < 5; i++)
        shoal_handshake_free(&hs[i]);
    shoal_preauth_free(&p);
}

/* The per-address share groups sources as an attacker gets them: an IPv4
 * address is one source, an IPv6 host picks any address of its /64 (so
 * the /64 is one source), and an IPv4-mapped IPv6 peer is its IPv4 one. */
Test(wire, peer_group_is_the_ipv4_address_or_the_ipv6_slash_64)
{
    static const char *const cases[][2] = {
        {"10.0.0.9:5000", "10.0.0.9"},
        {"10.0.0.9", "10.0.0.9"},
        {"[2001:db8:1:2::1]:7070", "2001:db8:1:2::/64"},
        {"[2001:db8:1:2:ffff:ffff:ffff:ffff]:1", "2001:db8:1:2::/64"},
        {"[2001:db8:1:3::1]:7070", "2001:db8:1:3::/64"},
        {"[2001:DB8:0001:0002:0:0:0:7]:1", "2001:db8:1:2::/64"},
        {"2001:db8:1:2::99", "2001:db8:1:2::/64"},
        {"[fe80::1%eth0]:7070", "fe80::/64"},
        {"[::ffff:10.0.0.9]:5000", "10.0.0.9"},
        {"[::1]:7070", "::/64"},
        {"?", "?"},
        {"host.example:7070", "host.example"},
    };
    char buf[64];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        cr_assert_str_eq(shoal_wire_peer_group(cases[i][0], buf, sizeof buf), cases[i][1],
                         "peer %s: expected group %s, got %s", cases[i][0], cases[i][1], buf);
    /* truncation keeps the buffer terminated */
    char small[6];
    cr_assert_str_eq(shoal_wire_peer_group("[2001:db8::1]:1", small, sizeof small), "2001:");
}

/* Three addresses of one /64 share one address's slots: at per_ip 2 the
 * third evicts the first of them, while another /64 still finds room. */
Test(wire, preauth_counts_an_ipv6_slash_64_as_one_address)
{
    struct shoal_preauth p;
    shoal_preauth_init(&p, 8, 2);
    struct shoal_handshake hs[4];
    int conn[4];
    for (int i = 0; i < 4; i++)
        shoal_handshake_init(&hs[i], 0, SHOAL__ROLE__ROLE_WORKER, NULL, NULL, NULL, "peer");
    shoal_preauth_add(&p, &conn[0], &hs[0], -1, "[2001:db8:1:2::a]:1");
    shoal_preauth_add(&p, &conn[1], &hs[1], -1, "[2001:db8:1:2::b]:1");
    cr_assert_eq(shoal_preauth_victim(&p, "[2001:db8:1:2::c]:1"), &conn[0],
                 "a third address of the same /64 is over the share of 2");
    cr_assert_null(shoal_preauth_victim(&p, "[2001:db8:1:3::c]:1"), "another /64 has room");
    /* an IPv4-mapped peer and the plain IPv4 one are one source */
    shoal_preauth_add(&p, &conn[2], &hs[2], -1, "[::ffff:10.0.0.9]:1");
    shoal_preauth_add(&p, &conn[3], &hs[3], -1, "10.0.0.9:2");
    cr_assert_eq(shoal_preauth_victim(&p, "10.0.0.9:3"), &conn[2],
                 "10.0.0.9 holds 2 slots, one of them as ::ffff:10.0.0.9");
    for (int i = 0; i < 4; i++)
        shoal_handshake_free(&hs[i]);
    shoal_preauth_free(&p);
}
