/* server: the worker's libuv side (DESIGN §5). One loop thread owns the
 * listener, every connection, the optional dial-out to a coordinator
 * (--join) and all protocol state; the compute thread (exec.h) runs the
 * batch-unions and hands replies back through a uv_async.
 *
 * Per connection: a frame reader, the handshake (common/net/wire.h; the worker
 * is the acceptor on its listener and the connector on --join), then
 * dispatch. A connection that has not finished the handshake within the
 * deadline is closed. Only a coordinator may send ExpertRequest and
 * PrefetchHint; an observer may send StatusRequest and Heartbeat. Every
 * field is validated (shoal_wire_check_request); a bad request gets an
 * ErrorReply with its id and the connection keeps serving; a malformed
 * body gets an ErrorReply with id 0; a length prefix over the maximum (or
 * zero) gets an ErrorReply and the connection is closed, since the stream
 * is out of sync. Backpressure: when a connection's unwritten bytes, its
 * request bytes at the compute thread and the bytes their replies will
 * take pass the limit, reading from it stops until they drain; nothing is
 * dropped. When a connection closes,
 * its requests still queued at the compute thread are cancelled; the one
 * running finishes and its reply is discarded (connections are
 * reference-counted).
 *
 * Memory a peer can cost (docs/PROTOCOL.md, "Limits"): until it has
 * authenticated, and for an observer throughout, its frames are limited to
 * SHOAL_WIRE_HANDSHAKE_MAX_FRAME and the frame buffer grows only with the
 * bytes that arrived, so one connection holds at most ~64 KiB; at most
 * max_unauthenticated such connections are held at once (max_unauth_per_ip
 * from one address; a new one evicts the least advanced), each closed at
 * the handshake deadline; at most max_coordinators coordinators are
 * served, the next refused before Ready. Reads go through one buffer shared by every
 * connection.
 *
 * Thread: loop (the thread that calls shoal_worker_server_run), except
 * shoal_worker_server_notify.
 */
#ifndef SHOAL_WORKER_SERVER_H
#define SHOAL_WORKER_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "exec.h"
#include "wire.h"

struct shoal_worker_server_params {
    const char *listen;                /* "HOST:PORT" (port 0: any), borrowed */
    const char *join;                  /* coordinator "HOST:PORT" to dial, or NULL; borrowed */
    const struct shoal_wire_key *key;  /* borrowed; !set: no key (loopback only) */
    const Shoal__PeerInfo *info;       /* ours, sent after authentication; borrowed */
    const char *fingerprint;           /* 16 hex digits a coordinator must have; borrowed */
    int64_t n_layer, n_expert, n_embd;
    const uint8_t *is_moe;             /* [n_layer] 1 for MoE layers; borrowed */
    const uint8_t *coverage;           /* [coverage_len] bit il*n_expert+ie; borrowed */
    size_t coverage_len;
    uint32_t max_frame;                /* largest frame accepted after the handshake, bytes */
    uint64_t backpressure_bytes;       /* per connection: stop reading above this */
    double handshake_timeout_s;        /* close a connection not authenticated by then */
    int max_connections;               /* refuse more at once */
    int max_unauthenticated;           /* accepted connections in their handshake at once
                                        * (each costs <= ~64 KiB); a new one evicts the
                                        * one with the least progress */
    int max_unauth_per_ip;             /* of those, from one source address (an IPv6
                                        * /64: shoal_wire_peer_group) */
    int max_coordinators;              /* authenticated coordinators at once; more are
                                        * refused with an ErrorReply instead of Ready */
};

static inline struct shoal_worker_server_params shoal_worker_server_params_default(void)
{
    return (struct shoal_worker_server_params){.listen = "127.0.0.1:7070",
                                               .max_frame = SHOAL_WIRE_MAX_FRAME_DEFAULT,
                                               .backpressure_bytes = 64ull << 20,
                                               .handshake_timeout_s = 5.0,
                                               .max_connections = 256,
                                               .max_unauthenticated =
                                                   SHOAL_WIRE_MAX_UNAUTH_DEFAULT,
                                               .max_unauth_per_ip =
                                                   SHOAL_WIRE_MAX_UNAUTH_PER_ADDR_DEFAULT,
                                               .max_coordinators = 8};
}

struct shoal_worker_server;

/* Create the loop and bind the listener (so a taken port fails before the
 * expert store is built). Logs the bound address. Returns the server
 * (owned by the caller) or NULL with err naming the address and the
 * syscall's error. Thread: loop. */
struct shoal_worker_server *shoal_worker_server_create(const struct shoal_worker_server_params *p,
                                                       struct shoal_err *err);

/* The bound listen address, "host:port" (the real port when --listen
 * asked for port 0). Owned by the server. Thread: any. */
const char *shoal_worker_server_address(const struct shoal_worker_server *srv);

/* Wake the loop: a request finished on the compute thread. Pass as the
 * exec's notify with the server as user. Thread: any. */
void shoal_worker_server_notify(void *server);

/* Serve with exec (borrowed) until SIGINT or SIGTERM: accept, dial --join
 * (re-dialled with backoff, 0.5 s doubling to 10 s, whenever that
 * connection drops), answer. On a signal: drain (stop listening, finish
 * the queued requests, at most 10 s), then close every connection, stop
 * exec (shoal_worker_exec_stop) and return 0; a second signal skips the
 * drain. The signal handlers are installed by create, so a signal that
 * arrives between create and run is acted on when run starts. Returns 0
 * (err is kept for callers; nothing fails once create succeeded).
 * Thread: loop. */
int shoal_worker_server_run(struct shoal_worker_server *srv, struct shoal_worker_exec *exec,
                            struct shoal_err *err);

/* Free the server (after run returned, or instead of it). NULL is a no-op.
 * Thread: loop. */
void shoal_worker_server_destroy(struct shoal_worker_server *srv);

#endif
