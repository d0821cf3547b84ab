/* Fuzz target: the bytes a peer sends on a shoal connection, as the worker
 * (FUZZ_WIRE_WORKER=1) or the coordinator (0) takes them: the frame reader
 * (shoal_frame_reader_feed), unpacking (shoal_wire_unpack), the handshake
 * state machine (shoal_handshake_on_frame) and, once authenticated, the
 * checks of what arrives (shoal_wire_check_request on the worker,
 * shoal_wire_check_response and the PeerInfo checks on the coordinator), in
 * the order worker/server.c and coordinator/cluster_net.c run them.
 *
 * Input: one byte of settings, then the peer's byte stream.
 *   bit 0     we dialled (connector) rather than accepted
 *   bit 1     we hold a cluster key (the peer cannot pass the MAC check, so
 *             this exercises the unauthenticated side only)
 *   bits 2-3  how the stream is cut into reads: 1..7, 1..64, 1..4096 bytes,
 *             or all at once
 *   bits 4-7  seed of the read sizes
 * Budgets (docs/PROTOCOL.md "Limits"): before the handshake completes the
 * connection holds at most PREAUTH_BUDGET bytes whatever arrives; after it,
 * at most POSTAUTH_BUDGET plus a constant times the bytes received. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "wire.h"

#ifndef FUZZ_WIRE_WORKER
#define FUZZ_WIRE_WORKER 1
#endif

/* the frame limit before authentication (and for observers): wire.h's when
 * it states one, else what worker/server.c and coordinator/cluster_net.c
 * used before issue 12 */
#if defined(SHOAL_WIRE_HANDSHAKE_MAX_FRAME)
#define PREAUTH_MAX_FRAME SHOAL_WIRE_HANDSHAKE_MAX_FRAME
#define OBSERVER_MAX_FRAME SHOAL_WIRE_HANDSHAKE_MAX_FRAME
#elif FUZZ_WIRE_WORKER
#define PREAUTH_MAX_FRAME (4u << 20)
#define OBSERVER_MAX_FRAME SHOAL_WIRE_MAX_FRAME_DEFAULT
#else
#define PREAUTH_MAX_FRAME SHOAL_WIRE_MAX_FRAME_DEFAULT
#define OBSERVER_MAX_FRAME SHOAL_WIRE_MAX_FRAME_DEFAULT
#endif
/* docs/PROTOCOL.md "Limits": an unauthenticated connection holds at most
 * 64 KiB; after authentication a frame costs its bytes in the reader (at
 * most twice what arrived), its unpacking (4 x its bytes + 64 KiB) and a
 * reply of about its size: POSTAUTH_BUDGET + POSTAUTH_PER_BYTE x bytes
 * received bounds all of it */
#define PREAUTH_BUDGET (64 * FUZZ_KIB)
#define POSTAUTH_BUDGET (256 * FUZZ_KIB)
#define POSTAUTH_PER_BYTE 16

#define TARGET (FUZZ_WIRE_WORKER ? "wire_worker" : "wire_coordinator")
#define FINGERPRINT "00c0ffee00c0ffee"

/* The model both sides serve: 4 layers (0 dense), 8 experts, n_embd 16. */
enum { N_LAYER = 4, N_EXPERT = 8, N_EMBD = 16 };
static const uint8_t IS_MOE[N_LAYER] __attribute__((unused)) = {0, 1, 1, 1};
static const uint8_t COVERAGE[(N_LAYER * N_EXPERT + 7) / 8] = {0x00, 0x0f, 0xf0, 0x3c};

struct conn {
    struct shoal_handshake hs;
    struct shoal_frame_reader rd;
    struct shoal_wire_buf out;     /* what we would send; dropped after each frame */
    int done;                      /* authenticated */
    int closed;
    size_t fed_after_auth;         /* bytes fed since the handshake completed */
};

static void send_frame(struct conn *c, const Shoal__Frame *f)
{
    (void)shoal_wire_buf_append(&c->out, f, SHOAL_WIRE_MAX_FRAME_DEFAULT, NULL);
}

static void send_error(struct conn *c, uint64_t id, int code, const char *msg)
{
    struct shoal_wire_error e;
    shoal_wire_error_init(&e, id, code, msg);
    send_frame(c, &e.frame);
}

/* Both sides answer a heartbeat that is not a reply with its echo. */
static void echo_heartbeat(struct conn *c, const Shoal__Heartbeat *in)
{
    if (in->reply)
        return;
    Shoal__Heartbeat hb = *in;
    Shoal__Frame r = SHOAL__FRAME__INIT;
    hb.reply = 1;
    r.msg_case = SHOAL__FRAME__MSG_HEARTBEAT;
    r.heartbeat = &hb;
    send_frame(c, &r);
}

#if FUZZ_WIRE_WORKER
/* worker/server.c dispatch, without the executor */
static void dispatch(struct conn *c, const Shoal__Frame *f)
{
    const int coord = c->hs.peer_role == SHOAL__ROLE__ROLE_COORDINATOR;
    struct shoal_err err = {0};
    switch (f->msg_case) {
    case SHOAL__FRAME__MSG_REQUEST: {
        if (!coord)
            break;
        const Shoal__ExpertRequest *rq = f->request;
        const int64_t max_rows = SHOAL_WIRE_MAX_FRAME_DEFAULT / (N_EMBD * 4);
        int rc = shoal_wire_check_request(rq, N_LAYER, N_EXPERT, N_EMBD, IS_MOE, COVERAGE,
                                          sizeof COVERAGE, max_rows, &err);
        if (rc < 0) {
            FUZZ_ASSERT(err.msg[0], "check_request %d without a message", rc);
            send_error(c, rq->id, rc, err.msg);
            return;
        }
        /* what the executor relies on once the check passed */
        FUZZ_ASSERT(rq->layer < N_LAYER && IS_MOE[rq->layer], "layer %u", rq->layer);
        FUZZ_ASSERT(rq->hidden.len == (size_t)rq->n_rows * N_EMBD * 4, "hidden bytes");
        for (size_t i = 0; i < rq->n_experts; i++) {
            const Shoal__ExpertRows *er = rq->experts[i];
            FUZZ_ASSERT(er->expert < N_EXPERT &&
                        shoal_wire_covers(COVERAGE, sizeof COVERAGE, N_EXPERT, rq->layer,
                                          er->expert), "expert %u", er->expert);
            for (size_t j = 0; j < er->n_rows; j++)
                FUZZ_ASSERT(er->rows[j] < rq->n_rows, "row %u of %u", er->rows[j], rq->n_rows);
        }
        return;
    }
    case SHOAL__FRAME__MSG_HINT:
        if (!coord)
            break;
        if (f->hint->layer >= N_LAYER || !IS_MOE[f->hint->layer])
            send_error(c, 0, SHOAL_ERANGE, "prefetch hint for a layer that is not MoE");
        return;
    case SHOAL__FRAME__MSG_HEARTBEAT:
        echo_heartbeat(c, f->heartbeat);
        return;
    case SHOAL__FRAME__MSG_STATUS_REQUEST: {
        Shoal__StatusReply r = SHOAL__STATUS_REPLY__INIT;
        Shoal__Frame fr = SHOAL__FRAME__INIT;
        r.id = f->status_request->id;
        fr.msg_case = SHOAL__FRAME__MSG_STATUS;
        fr.status = &r;
        send_frame(c, &fr);
        return;
    }
    default:
        break;
    }
    send_error(c, 0, SHOAL_EUNSUPPORTED, "unexpected frame");
}

/* worker/server.c on_authenticated: only a coordinator or an observer */
static int authenticated(struct conn *c)
{
    return c->hs.peer_role == SHOAL__ROLE__ROLE_COORDINATOR ||
           c->hs.peer_role == SHOAL__ROLE__ROLE_OBSERVER;
}
#else
/* coordinator/cluster_net.c: a worker's or an observer's frames */
static void dispatch(struct conn *c, const Shoal__Frame *f)
{
    struct shoal_err err = {0};
    const int observer = c->hs.peer_role == SHOAL__ROLE__ROLE_OBSERVER;
    switch (f->msg_case) {
    case SHOAL__FRAME__MSG_RESPONSE:
        if (observer)
            break;
        /* the forward thread checks a reply against its request: here
         * request id k asked for k % 64 rows; a part (`more`, the loop
         * thread's take_part) follows id % 7 rows of earlier parts with
         * id % 5 frames left */
        if (f->response->more) {
            const uint64_t rows = f->response->id % 64, have = (f->response->id % 7) * N_EMBD * 4;
            if (shoal_wire_check_response_part(f->response, have, rows, N_EMBD,
                                               (uint32_t)(f->response->id % 5), &err) == 0)
                FUZZ_ASSERT(f->response->out.len > 0 && f->response->out.len % (N_EMBD * 4) == 0 &&
                                have + f->response->out.len <= rows * N_EMBD * 4 &&
                                f->response->id % 5 >= 2,
                            "response part bytes");
            FUZZ_ASSERT(shoal_wire_check_response(f->response, rows, N_EMBD, &err) < 0,
                        "a part taken for a whole response");
            return;
        }
        if (shoal_wire_check_response(f->response, f->response->id % 64, N_EMBD, &err) == 0)
            FUZZ_ASSERT(f->response->out.len == (f->response->id % 64) * N_EMBD * 4,
                        "response bytes");
        return;
    case SHOAL__FRAME__MSG_HEARTBEAT:
        echo_heartbeat(c, f->heartbeat);
        return;
    case SHOAL__FRAME__MSG_STATUS:
        if (observer)
            break;
        return;
    case SHOAL__FRAME__MSG_STATUS_REQUEST:
        if (!observer)
            break;
        {
            Shoal__ClusterStatus s = SHOAL__CLUSTER_STATUS__INIT;
            Shoal__Frame fr = SHOAL__FRAME__INIT;
            s.id = f->status_request->id;
            s.fingerprint = (char *)FINGERPRINT;
            fr.msg_case = SHOAL__FRAME__MSG_CLUSTER;
            fr.cluster = &s;
            send_frame(c, &fr);
        }
        return;
    default:
        break;
    }
    if (observer) {
        send_error(c, 0, SHOAL_EFORMAT, "unexpected frame on the control port");
        return;
    }
    c->closed = 1;   /* a worker that breaks the protocol is dropped */
}

/* coordinator/cluster_net.c check_worker_info, for a worker */
static int authenticated(struct conn *c)
{
    if (c->hs.peer_role == SHOAL__ROLE__ROLE_OBSERVER)
        return !c->hs.connector;   /* observers only call the control port */
    const Shoal__PeerInfo *pi = c->hs.peer_info;
    if (c->hs.peer_role != SHOAL__ROLE__ROLE_WORKER || !pi)
        return 0;
    if (pi->n_layer != N_LAYER || pi->n_expert != N_EXPERT || pi->n_embd != N_EMBD ||
        pi->coverage.len != sizeof COVERAGE || (pi->max_frame && pi->max_frame < 4096))
        return 0;
    char name[64];
    shoal_wire_printable(name, sizeof name, pi->name);
    return 1;
}
#endif

static int on_frame(void *user, const uint8_t *body, size_t len)
{
    struct conn *c = user;
    struct shoal_err err = {0};
    Shoal__Frame *f = shoal_wire_unpack(body, len, &err);
    FUZZ_ASSERT(f || (err.code < 0 && err.msg[0]), "unpack failed without a message");
    if (!c->done) {
        if (!f) {
            send_error(c, 0, SHOAL_EFORMAT, err.msg);
            c->closed = 1;
            return 1;
        }
        int rc = shoal_handshake_on_frame(&c->hs, f, &c->out, &err);
        c->out.len = 0;
        if (rc == 1) {
            shoal_handshake_adopt(&c->hs, f);
            FUZZ_ASSERT(c->hs.state == SHOAL_HS_DONE && c->hs.peer_info, "done without info");
            FUZZ_ASSERT(!c->hs.key, "authenticated without the key");
            if (!authenticated(c)) {
                c->closed = 1;
                return 1;
            }
            /* the handshake's cost is settled: the post-auth budget starts */
            struct fuzz_mem m = fuzz_mem_now();
            fuzz_mem_check(TARGET, "the unauthenticated connection", m, len, PREAUTH_BUDGET,
                           PREAUTH_BUDGET);
            fuzz_mem_reset_peak();
            c->done = 1;
            c->rd.max_frame = c->hs.peer_role == SHOAL__ROLE__ROLE_OBSERVER
                                  ? OBSERVER_MAX_FRAME : SHOAL_WIRE_MAX_FRAME_DEFAULT;
            return 0;
        }
        shoal_wire_frame_free(f);
        if (rc < 0) {
            FUZZ_ASSERT(err.msg[0], "handshake %d without a message", rc);
            c->closed = 1;
            return 1;
        }
        return 0;
    }
    if (!f) {
        if (FUZZ_WIRE_WORKER || c->hs.peer_role == SHOAL__ROLE__ROLE_OBSERVER) {
            send_error(c, 0, err.code, err.msg);   /* in sync: say why and go on */
            c->out.len = 0;
            return 0;
        }
        c->closed = 1;
        return 1;
    }
    dispatch(c, f);
    shoal_wire_frame_free(f);
    c->out.len = 0;
    return c->closed;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    if (n < 1)
        return 0;
    static const struct shoal_wire_key key = {.set = 1, .bytes = "fuzz fuzz fuzz fuzz fuzz fuzz!!"};
    const uint8_t mode = data[0];
    const int connector = mode & 1, keyed = (mode >> 1) & 1;
    static const size_t cut[4] = {7, 64, 4096, SIZE_MAX};
    const size_t max_read = cut[(mode >> 2) & 3];
    uint32_t rng = 0x9e3779b9u * (1u + (mode >> 4));
    data++;
    n--;

    Shoal__PeerInfo info = SHOAL__PEER_INFO__INIT;
    uint8_t coverage[sizeof COVERAGE];
    memcpy(coverage, COVERAGE, sizeof coverage);
    info.name = (char *)"fuzz";
    info.software = (char *)"shoal fuzz";
    info.fingerprint = (char *)FINGERPRINT;
    info.n_layer = N_LAYER;
    info.n_expert = N_EXPERT;
    info.n_embd = N_EMBD;
    info.coverage.data = coverage;
    info.coverage.len = sizeof coverage;
    info.max_frame = SHOAL_WIRE_MAX_FRAME_DEFAULT;

    fuzz_mem_begin();
    struct conn c;
    memset(&c, 0, sizeof c);
    struct shoal_err err = {0};
    shoal_handshake_init(&c.hs, connector,
                         FUZZ_WIRE_WORKER ? SHOAL__ROLE__ROLE_WORKER
                                          : SHOAL__ROLE__ROLE_COORDINATOR,
                         keyed ? &key : NULL, &info, FINGERPRINT, "fuzz-peer");
    shoal_frame_reader_init(&c.rd, PREAUTH_MAX_FRAME < SHOAL_WIRE_MAX_FRAME_DEFAULT
                                       ? PREAUTH_MAX_FRAME : SHOAL_WIRE_MAX_FRAME_DEFAULT);
    if (connector) {
        FUZZ_ASSERT(shoal_handshake_start(&c.hs, &c.out, &err) == 0, "start: %s", err.msg);
        c.out.len = 0;
    }
    size_t off = 0;
    while (off < n && !c.closed) {
        rng = rng * 1103515245u + 12345u;
        size_t take = max_read == SIZE_MAX ? n - off : 1 + (rng >> 8) % max_read;
        if (take > n - off)
            take = n - off;
        int rc = shoal_frame_reader_feed(&c.rd, data + off, take, on_frame, &c, &err);
        if (c.done && !c.closed)
            c.fed_after_auth += take;
        off += take;
        if (rc < 0) {
            FUZZ_ASSERT(err.code < 0 && err.msg[0], "reader %d without a message", rc);
            break;
        }
        struct fuzz_mem m = fuzz_mem_now();
        if (c.done)
            fuzz_mem_check(TARGET, "the authenticated connection", m, n,
                           POSTAUTH_BUDGET + POSTAUTH_PER_BYTE * c.fed_after_auth,
                           POSTAUTH_BUDGET + POSTAUTH_PER_BYTE * c.fed_after_auth);
        else
            fuzz_mem_check(TARGET, "the unauthenticated connection", m, off, PREAUTH_BUDGET,
                           PREAUTH_BUDGET);
    }
    shoal_frame_reader_free(&c.rd);
    shoal_handshake_free(&c.hs);
    shoal_wire_buf_free(&c.out);
    fuzz_mem_end();
    return 0;
}
