/* make_wire_seeds: writes the seed corpora of the wire fuzz targets
 * (tests/fuzz/corpus/wire_worker, wire_coordinator): real frames packed by
 * common/net/wire.c, as a coordinator, a worker or an observer sends them, with
 * the settings byte fuzz_wire.c reads in front.
 * Usage: make_wire_seeds CORPUS_DIR   (run by tests/fuzz/run.sh --seeds) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

static struct shoal_wire_buf buf;

static void put(const Shoal__Frame *f)
{
    struct shoal_err err = {0};
    if (shoal_wire_buf_append(&buf, f, SHOAL_WIRE_MAX_FRAME_DEFAULT, &err)) {
        fprintf(stderr, "make_wire_seeds: %s\n", err.msg);
        exit(1);
    }
}

static void hello(Shoal__Role role, int with_mac)
{
    static uint8_t nonce[SHOAL_WIRE_NONCE_BYTES], mac[SHOAL_WIRE_MAC_BYTES];
    for (int i = 0; i < SHOAL_WIRE_NONCE_BYTES; i++)
        nonce[i] = (uint8_t)(i * 37 + 11), mac[i] = (uint8_t)(i * 91 + 5);
    Shoal__Hello h = SHOAL__HELLO__INIT;
    Shoal__Frame f = SHOAL__FRAME__INIT;
    h.version = SHOAL_PROTO_VERSION;
    h.role = role;
    h.nonce.data = nonce;
    h.nonce.len = sizeof nonce;
    if (with_mac) {
        h.mac.data = mac;
        h.mac.len = sizeof mac;
        h.keyed = 1;
    }
    f.msg_case = SHOAL__FRAME__MSG_HELLO;
    f.hello = &h;
    put(&f);
}

static void info_frame(int auth, Shoal__Role role)
{
    static uint8_t coverage[4] = {0x00, 0x0f, 0xf0, 0x3c};
    Shoal__PeerInfo pi = SHOAL__PEER_INFO__INIT;
    pi.name = (char *)(role == SHOAL__ROLE__ROLE_WORKER ? "10.0.0.2:7070" : "coordinator");
    pi.software = (char *)"shoal 0.1.0";
    if (role != SHOAL__ROLE__ROLE_OBSERVER) {
        pi.fingerprint = (char *)"00c0ffee00c0ffee";
        pi.model_type = (char *)"qwen3_moe";
        pi.n_layer = 4;
        pi.n_expert = 8;
        pi.n_embd = 16;
    }
    if (role == SHOAL__ROLE__ROLE_WORKER) {
        pi.coverage.data = coverage;
        pi.coverage.len = sizeof coverage;
        pi.cores = 4;
        pi.disk_mbps = 2100.5;
        pi.compute_gbps = 12.25;
        pi.cache_bytes = 1u << 30;
        pi.caps = SHOAL_CAP_PREFETCH | SHOAL_CAP_URING;
        pi.expert_dtype = (char *)"INT4";
    }
    pi.max_frame = SHOAL_WIRE_MAX_FRAME_DEFAULT;
    Shoal__Frame f = SHOAL__FRAME__INIT;
    Shoal__Auth a = SHOAL__AUTH__INIT;
    Shoal__Ready r = SHOAL__READY__INIT;
    if (auth) {
        a.info = &pi;
        f.msg_case = SHOAL__FRAME__MSG_AUTH;
        f.auth = &a;
    } else {
        r.info = &pi;
        f.msg_case = SHOAL__FRAME__MSG_READY;
        f.ready = &r;
    }
    put(&f);
}

static void request(uint64_t id, uint32_t layer, uint32_t n_rows)
{
    static float hidden[4 * 16];
    for (int i = 0; i < 4 * 16; i++)
        hidden[i] = (float)i * 0.125f - 3.0f;
    uint32_t rows_a[] = {0, 2, 3}, rows_b[] = {1};
    Shoal__ExpertRows a = SHOAL__EXPERT_ROWS__INIT, b = SHOAL__EXPERT_ROWS__INIT;
    /* held by the fuzzed worker (fuzz_wire.c COVERAGE): layer 1 experts
     * 0-3, layer 2 experts 4-7, layer 3 experts 2-5 */
    a.expert = layer == 1 ? 1 : layer == 2 ? 4 : 2;
    a.rows = rows_a;
    a.n_rows = n_rows >= 4 ? 3 : 1;
    b.expert = layer == 1 ? 3 : layer == 2 ? 6 : 5;
    b.rows = rows_b;
    b.n_rows = n_rows >= 2 ? 1 : 0;
    Shoal__ExpertRows *ex[] = {&a, &b};
    Shoal__ExpertRequest rq = SHOAL__EXPERT_REQUEST__INIT;
    rq.id = id;
    rq.layer = layer;
    rq.n_rows = n_rows;
    rq.n_embd = 16;
    rq.hidden.data = (uint8_t *)hidden;
    rq.hidden.len = (size_t)n_rows * 16 * 4;
    rq.experts = ex;
    rq.n_experts = n_rows >= 2 ? 2 : 1;
    Shoal__Frame f = SHOAL__FRAME__INIT;
    f.msg_case = SHOAL__FRAME__MSG_REQUEST;
    f.request = &rq;
    put(&f);
}

static void hint(void)
{
    uint32_t ids[] = {4, 5, 5, 7};
    Shoal__PrefetchHint h = SHOAL__PREFETCH_HINT__INIT;
    h.layer = 2;
    h.experts = ids;
    h.n_experts = 4;
    Shoal__Frame f = SHOAL__FRAME__INIT;
    f.msg_case = SHOAL__FRAME__MSG_HINT;
    f.hint = &h;
    put(&f);
}

static void heartbeat(uint64_t id, int reply)
{
    static uint8_t payload[48];
    Shoal__Heartbeat hb = SHOAL__HEARTBEAT__INIT;
    hb.id = id;
    hb.sent_ns = 123456789012ull;
    hb.reply = reply;
    hb.payload.data = payload;
    hb.payload.len = id % 2 ? sizeof payload : 0;
    Shoal__Frame f = SHOAL__FRAME__INIT;
    f.msg_case = SHOAL__FRAME__MSG_HEARTBEAT;
    f.heartbeat = &hb;
    put(&f);
}

static void status_request(uint64_t id)
{
    Shoal__StatusRequest s = SHOAL__STATUS_REQUEST__INIT;
    s.id = id;
    Shoal__Frame f = SHOAL__FRAME__INIT;
    f.msg_case = SHOAL__FRAME__MSG_STATUS_REQUEST;
    f.status_request = &s;
    put(&f);
}

static void response(uint64_t id)
{
    static uint8_t out[5 * 16 * 4];
    Shoal__ExpertResponse r = SHOAL__EXPERT_RESPONSE__INIT;
    r.id = id;
    r.out.data = out;
    r.out.len = (id % 64) * 16 * 4 <= sizeof out ? (id % 64) * 16 * 4 : 0;
    r.queue_seconds = 0.001;
    r.compute_seconds = 0.0025;
    r.cache_hits = 2;
    Shoal__Frame f = SHOAL__FRAME__INIT;
    f.msg_case = SHOAL__FRAME__MSG_RESPONSE;
    f.response = &r;
    put(&f);
}

static void status_reply(uint64_t id)
{
    Shoal__StatusReply s = SHOAL__STATUS_REPLY__INIT;
    s.id = id;
    s.cache_used = 1u << 20;
    s.cache_limit = 1u << 30;
    s.hits = 10;
    s.misses = 3;
    s.bytes_read = 3u << 20;
    s.read_busy_seconds = 0.01;
    s.queue_depth = 1;
    s.requests = 13;
    Shoal__Frame f = SHOAL__FRAME__INIT;
    f.msg_case = SHOAL__FRAME__MSG_STATUS;
    f.status = &s;
    put(&f);
}

static void error_reply(void)
{
    struct shoal_wire_error e;
    shoal_wire_error_init(&e, 7, -22, "request 7: layer 0 is not a MoE layer");
    put(&e.frame);
}

static void emit(const char *dir, const char *name, unsigned mode)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "wb");
    if (!fp || fputc((int)mode, fp) == EOF || fwrite(buf.data, 1, buf.len, fp) != buf.len ||
        fclose(fp)) {
        perror(path);
        exit(1);
    }
    buf.len = 0;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: make_wire_seeds WORKER_CORPUS COORDINATOR_CORPUS\n");
        return 2;
    }
    const char *w = argv[1], *co = argv[2];
    /* worker, accepting a coordinator (keyless): handshake, then traffic */
    hello(SHOAL__ROLE__ROLE_COORDINATOR, 0);
    info_frame(1, SHOAL__ROLE__ROLE_COORDINATOR);
    request(1, 1, 4);
    request(2, 2, 1);
    hint();
    heartbeat(3, 0);
    status_request(4);
    emit(w, "coordinator-session", 0x00);
    hello(SHOAL__ROLE__ROLE_COORDINATOR, 0);
    info_frame(1, SHOAL__ROLE__ROLE_COORDINATOR);
    request(9, 0, 2);     /* a dense layer: refused */
    request(0, 1, 1);     /* id 0: refused */
    emit(w, "coordinator-bad-requests", 0x04);
    /* worker dialling a coordinator: its hello, then ready */
    hello(SHOAL__ROLE__ROLE_COORDINATOR, 0);
    info_frame(0, SHOAL__ROLE__ROLE_COORDINATOR);
    heartbeat(5, 0);
    request(6, 3, 2);
    emit(w, "dialled-coordinator", 0x19);
    /* an observer asking for status */
    hello(SHOAL__ROLE__ROLE_OBSERVER, 0);
    info_frame(1, SHOAL__ROLE__ROLE_OBSERVER);
    status_request(1);
    heartbeat(2, 0);
    emit(w, "observer", 0x28);
    /* keyed worker: the peer's hello and an auth without a valid MAC */
    hello(SHOAL__ROLE__ROLE_COORDINATOR, 1);
    info_frame(1, SHOAL__ROLE__ROLE_COORDINATOR);
    emit(w, "keyed-bad-mac", 0x02);
    error_reply();
    emit(w, "error-first", 0x00);

    /* coordinator dialling a worker: the worker's hello, ready, replies */
    hello(SHOAL__ROLE__ROLE_WORKER, 0);
    info_frame(0, SHOAL__ROLE__ROLE_WORKER);
    heartbeat(1, 1);
    status_reply(2);
    response(3);
    response(5);
    heartbeat(7, 0);
    error_reply();
    emit(co, "worker-session", 0x01);
    /* a worker joining through the control port */
    hello(SHOAL__ROLE__ROLE_WORKER, 0);
    info_frame(1, SHOAL__ROLE__ROLE_WORKER);
    status_reply(0);
    response(2);
    emit(co, "joining-worker", 0x14);
    /* `shoal status` */
    hello(SHOAL__ROLE__ROLE_OBSERVER, 0);
    info_frame(1, SHOAL__ROLE__ROLE_OBSERVER);
    status_request(1);
    heartbeat(2, 0);
    response(3);          /* not for an observer: an error reply, stays open */
    emit(co, "observer", 0x08);
    hello(SHOAL__ROLE__ROLE_WORKER, 1);
    emit(co, "keyed-hello", 0x03);
    shoal_wire_buf_free(&buf);
    return 0;
}
