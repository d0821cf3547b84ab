/* wire: what both ends of a shoal connection share (DESIGN §5,
 * docs/PROTOCOL.md): length-prefixed protobuf-c frames with a maximum size,
 * the cluster key and the challenge-response handshake, validation of
 * every field that comes off the wire, addresses, and a blocking client
 * for short-lived tools (`shoal status`, tests).
 *
 * The event-loop code (worker/, coordinator/cluster/) feeds received bytes
 * to a shoal_frame_reader, runs the handshake as a state machine over the
 * frames it yields, and writes the bytes this module packs. Allowed pairs:
 * coordinator-worker, coordinator-observer, worker-observer. Nothing here
 * touches a socket except shoal_wire_client_*.
 *
 * Thread: any; each object belongs to one thread at a time.
 */
#ifndef SHOAL_WIRE_H
#define SHOAL_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "err.h"
#include "shoal.pb-c.h"

#define SHOAL_PROTO_VERSION 1
#define SHOAL_WIRE_MAX_FRAME_DEFAULT (64u << 20)  /* bytes of one frame, prefix excluded */
#define SHOAL_WIRE_NONCE_BYTES 32
#define SHOAL_WIRE_MAC_BYTES 32                   /* HMAC-SHA-256 */
#define SHOAL_WIRE_KEY_BYTES 32
/* Frames before the handshake is done (hello, auth and ready; a PeerInfo
 * with a coverage bitmap of up to ~120 000 layer x expert bits), and every
 * frame of an observer: bytes of one frame, prefix excluded. */
#define SHOAL_WIRE_HANDSHAKE_MAX_FRAME (16u << 10)
/* shoal_wire_unpack may allocate at most FACTOR x len + SLACK bytes
 * (malloc's own overhead counted) for a frame body of len bytes. */
#define SHOAL_WIRE_UNPACK_FACTOR 4u
#define SHOAL_WIRE_UNPACK_SLACK (64u << 10)
/* Accepted connections held in their handshake at once (shoal_preauth),
 * and of those from one source (shoal_wire_peer_group): the defaults of
 * shoal-worker's and the coordinator's --max-unauthenticated and
 * --max-unauthenticated-per-address, and the largest value either takes
 * (each connection costs at most ~64 KiB: docs/PROTOCOL.md "Limits"). */
#define SHOAL_WIRE_MAX_UNAUTH_DEFAULT 16
#define SHOAL_WIRE_MAX_UNAUTH_PER_ADDR_DEFAULT 4
#define SHOAL_WIRE_MAX_UNAUTH_LIMIT 4096

/* PeerInfo.caps bits */
#define SHOAL_CAP_PREFETCH 1u
#define SHOAL_CAP_URING 2u
#define SHOAL_CAP_DIRECT 4u

/* ---- cluster key ---- */

struct shoal_wire_key {
    int set;                              /* 0: no key (loopback only) */
    uint8_t bytes[SHOAL_WIRE_KEY_BYTES];  /* SHA-256 of the key file's secret */
};

/* Load a cluster key file (path borrowed): any secret of at least 16
 * bytes (e.g. `head -c 32 /dev/urandom | base64 > key`); surrounding
 * whitespace is ignored and the key is SHA-256 of the rest, so the same
 * file gives the same key everywhere. Warns once when the file is readable
 * by group or others. Returns 0 or a negative status with err naming the
 * file (missing, unreadable, shorter than 16 bytes). Thread: any. */
int shoal_wire_key_load(const char *path, struct shoal_wire_key *key, struct shoal_err *err);

/* shoal_wire_key_load's checks alone, silent and keeping nothing: for a
 * command line to refuse a bad key file before it opens a model. Returns
 * as shoal_wire_key_load (-ENOENT, -EISDIR, ... for the file itself).
 * Thread: any. */
int shoal_wire_key_check(const char *path, struct shoal_err *err);

/* ---- frames ---- */

/* A growable byte buffer of packed frames waiting to be written. */
struct shoal_wire_buf {
    uint8_t *data;
    size_t len, cap;
};

void shoal_wire_buf_free(struct shoal_wire_buf *b);

/* Append frame f as 4-byte LE length + protobuf bytes. Returns 0 or
 * -SHOAL_ENOMEM / -SHOAL_ERANGE (larger than max_frame) with err set. */
int shoal_wire_buf_append(struct shoal_wire_buf *b, const Shoal__Frame *f,
                          uint32_t max_frame, struct shoal_err *err);

/* Pack f into a new buffer with its length prefix (owned by the caller,
 * free()); *len gets the total bytes. NULL with err set as above. */
uint8_t *shoal_wire_pack(const Shoal__Frame *f, uint32_t max_frame, size_t *len,
                         struct shoal_err *err);

/* Incremental reader: feed whatever recv() returned, take whole frames.
 * Holds at most one frame's bytes; refuses a length prefix over max_frame
 * before reading the body. Its buffer grows with the bytes that arrive
 * (geometrically, at most twice what it holds and never past the
 * announced frame), so an announced length alone costs nothing.
 * max_frame may be changed between feeds (e.g. raised once the peer has
 * authenticated). */
struct shoal_frame_reader {
    uint8_t *buf;
    size_t len, cap;
    uint32_t max_frame;
};

void shoal_frame_reader_init(struct shoal_frame_reader *r, uint32_t max_frame);
void shoal_frame_reader_free(struct shoal_frame_reader *r);

/* Feed n bytes; for each complete frame call on_frame(user, body, len)
 * with the frame's bytes (prefix excluded, borrowed for the call; unpack
 * them with shoal_wire_unpack, which may fail on a malformed body while
 * the stream stays in sync). A nonzero return from on_frame stops feeding
 * and is returned. Returns 0, or -SHOAL_ERANGE (a length over max_frame or
 * a zero length) with err set; the stream is then out of sync and the
 * connection must be closed (after an error reply). Thread: the reader's. */
int shoal_frame_reader_feed(struct shoal_frame_reader *r, const uint8_t *data, size_t n,
                            int (*on_frame)(void *user, const uint8_t *body, size_t len),
                            void *user, struct shoal_err *err);

/* Bytes of buffer the reader holds now (its capacity). Thread: the reader's. */
size_t shoal_frame_reader_buffered(const struct shoal_frame_reader *r);

/* Unpack one frame body (no prefix, data borrowed) with a memory budget.
 * Before anything is allocated the body must be exactly one field of the
 * Frame oneof (field 1..11, length-delimited, spanning the body), no
 * larger than shoal_wire_msg_max_bytes of that message, and hold only
 * fields its message types know, at every depth (a walk over the wire
 * bytes). protobuf-c then allocates through an allocator that refuses to
 * go past `budget` bytes (each allocation charged with malloc's overhead,
 * frees not credited).
 * *used (may be NULL) gets the bytes charged. Returns the frame (owned by
 * the caller: shoal_wire_frame_free) or NULL with err set: -SHOAL_EFORMAT
 * (not one known message, malformed protobuf, unknown field) or
 * -SHOAL_ERANGE (over the size of its message type, or over the budget).
 * Thread: any. */
Shoal__Frame *shoal_wire_unpack_bounded(const uint8_t *data, size_t len, size_t budget,
                                        size_t *used, struct shoal_err *err);

/* shoal_wire_unpack_bounded with the budget shoal_wire_unpack_budget(len). */
Shoal__Frame *shoal_wire_unpack(const uint8_t *data, size_t len, struct shoal_err *err);

/* The memory bound of shoal_wire_unpack for a body of len bytes:
 * SHOAL_WIRE_UNPACK_FACTOR x len + SHOAL_WIRE_UNPACK_SLACK bytes. Thread: any. */
size_t shoal_wire_unpack_budget(size_t len);

/* Largest body of a frame carrying message msg, in bytes: 256 for hello,
 * SHOAL_WIRE_HANDSHAKE_MAX_FRAME for auth and ready, 64 for
 * status_request, 4096 for error, ...; 0 for the messages bounded only by
 * the frame limit (request, response, hint, heartbeat). Thread: any. */
uint32_t shoal_wire_msg_max_bytes(Shoal__Frame__MsgCase msg);
void shoal_wire_frame_free(Shoal__Frame *f);

/* Name of the frame's message ("request", "hello", ...); static. */
const char *shoal_wire_frame_name(const Shoal__Frame *f);

/* Build an ErrorReply frame (message formatted into a static-per-call
 * buffer owned by f's storage); the helpers below fill frames that point at
 * caller memory: free nothing, keep the memory alive until packed. */
struct shoal_wire_error {
    Shoal__Frame frame;
    Shoal__ErrorReply reply;
    char message[512];
};
void shoal_wire_error_init(struct shoal_wire_error *e, uint64_t id, int code,
                           const char *message);

/* Copy peer text src (may be NULL) into dst[n], every byte outside
 * printable ASCII replaced by '?', truncated, NUL-terminated: safe for one
 * log line. Returns dst. */
char *shoal_wire_printable(char *dst, size_t n, const char *src);

/* "coordinator", "worker", "observer" or "unknown"; static. */
const char *shoal_wire_role_name(Shoal__Role r);

/* ---- validation of what arrives (DESIGN contract 3) ---- */

/* Coverage bitmap: bit (il * n_expert + ie), LSB first. */
static inline int shoal_wire_covers(const uint8_t *cov, size_t cov_len, int64_t n_expert,
                                    int64_t il, int64_t ie)
{
    uint64_t bit = (uint64_t)il * (uint64_t)n_expert + (uint64_t)ie;
    return bit / 8 < cov_len && (cov[bit / 8] >> (bit % 8)) & 1u;
}

/* Check an ExpertRequest against the worker's model and shard: id != 0,
 * layer < n_layer and a MoE layer (is_moe[layer] when is_moe is not
 * NULL), n_embd equal, 1 <= n_rows <= max_rows, hidden bytes ==
 * n_rows * n_embd * 4 (no overflow), 1 <= experts <= n_expert, each
 * expert < n_expert, distinct, held (coverage), with 1..n_rows rows each
 * < n_rows. Returns 0 or -SHOAL_EFORMAT / -SHOAL_ERANGE / -SHOAL_ENOTFOUND
 * (expert not in this shard) with a one-line message. */
int shoal_wire_check_request(const Shoal__ExpertRequest *rq, int64_t n_layer,
                             int64_t n_expert, int64_t n_embd, const uint8_t *is_moe,
                             const uint8_t *coverage, size_t coverage_len,
                             int64_t max_rows, struct shoal_err *err);

/* Check a response (its last frame, with the outputs of earlier parts put
 * before its own) against the request it answers: `more` unset, out bytes
 * == (sum of rows) * n_embd * 4. Returns 0 or -SHOAL_EFORMAT with err set. */
int shoal_wire_check_response(const Shoal__ExpertResponse *rs, uint64_t total_rows,
                              int64_t n_embd, struct shoal_err *err);

/* Check a part of a response (`more` set; ExpertRequest.parts) that follows
 * `have` bytes of earlier parts, for a request of total_rows rows, when
 * parts_left frames (this one and the last included) may still come: at
 * least 2 left, out a positive multiple of n_embd * 4 bytes, have + out at
 * most total_rows * n_embd * 4 (64-bit). Returns 0 or -SHOAL_EFORMAT with
 * err set. Thread: any. */
int shoal_wire_check_response_part(const Shoal__ExpertResponse *rs, uint64_t have,
                                   uint64_t total_rows, int64_t n_embd, uint32_t parts_left,
                                   struct shoal_err *err);

/* ---- handshake ---- */

enum shoal_hs_state {
    SHOAL_HS_START = 0,      /* connector: call start; acceptor: waiting for hello */
    SHOAL_HS_WAIT_HELLO,     /* connector sent hello */
    SHOAL_HS_WAIT_AUTH,      /* acceptor sent hello */
    SHOAL_HS_WAIT_READY,     /* connector sent auth */
    SHOAL_HS_DONE,
    SHOAL_HS_FAILED,
};

struct shoal_handshake {
    int connector;                       /* 1: we dialled */
    Shoal__Role role;                    /* ours */
    const struct shoal_wire_key *key;    /* borrowed; NULL or !set: no key */
    const Shoal__PeerInfo *info;         /* ours, borrowed until DONE */
    const char *fingerprint;             /* expected peer fingerprint, borrowed; NULL: any */
    const char *peer_name;               /* for messages ("10.0.0.2:7070"), borrowed */
    enum shoal_hs_state state;
    uint8_t nonce_self[SHOAL_WIRE_NONCE_BYTES];
    uint8_t nonce_peer[SHOAL_WIRE_NONCE_BYTES];
    Shoal__Role peer_role;
    Shoal__Frame *peer_frame;            /* the auth/ready frame holding peer_info */
    const Shoal__PeerInfo *peer_info;    /* valid when DONE; owned by the handshake */
    /* Acceptor, optional: called once the connector has proven the key and
     * its PeerInfo checked, before Ready is sent. A nonzero return refuses
     * the peer: msg (filled by admit, one line) goes to it in an ErrorReply
     * instead of Ready. Set after shoal_handshake_init. */
    int (*admit)(void *user, Shoal__Role peer_role, char *msg, size_t msg_len);
    void *admit_user;
};

/* Prepare a handshake. info is our PeerInfo (sent only after the peer has
 * proven the key). fingerprint: the model fingerprint the peer must have
 * (checked on its PeerInfo unless one side is an observer). */
void shoal_handshake_init(struct shoal_handshake *hs, int connector, Shoal__Role role,
                          const struct shoal_wire_key *key, const Shoal__PeerInfo *info,
                          const char *fingerprint, const char *peer_name);
void shoal_handshake_free(struct shoal_handshake *hs);

/* Connector: append the hello frame to out. Returns 0 or < 0 with err. */
int shoal_handshake_start(struct shoal_handshake *hs, struct shoal_wire_buf *out,
                          struct shoal_err *err);

/* Feed one received frame (borrowed). Appends what must be sent to out.
 * Returns 0 while in progress, 1 when done (peer_info set), or a negative
 * status with err naming the peer and what was wrong: wrong version, two
 * coordinators, a bad or missing MAC, a key on one side only, a wrong
 * fingerprint, an unexpected frame. On failure out may hold an ErrorReply
 * to send before closing. */
int shoal_handshake_on_frame(struct shoal_handshake *hs, const Shoal__Frame *f,
                             struct shoal_wire_buf *out, struct shoal_err *err);

/* After on_frame returned 1, hand the frame it was given to the handshake
 * (ownership moves: peer_info points into it until shoal_handshake_free).
 * Thread: the handshake's. */
void shoal_handshake_adopt(struct shoal_handshake *hs, Shoal__Frame *f);

/* ---- connections in their handshake ---- */

/* The accepted connections that have not authenticated yet, at most cap of
 * them and at most per_ip from one source address (an IPv6 /64 counts as
 * one address, an IPv4-mapped IPv6 address as its IPv4 one:
 * shoal_wire_peer_group). A new connection is
 * never refused for want of a slot: the one that made the least progress
 * (silent before one with bytes waiting or a hello read; then the oldest)
 * is evicted, among the same address's when that address is at per_ip,
 * else among those of the address that holds the most slots. So
 * connections that hold slots without speaking cannot lock out a peer
 * that completes its handshake (docs/PROTOCOL.md, "Limits"). */
struct shoal_preauth_slot {
    void *conn;                          /* the owner's connection, borrowed */
    const struct shoal_handshake *hs;    /* its handshake (progress), borrowed */
    int fd;                              /* its socket (bytes waiting: progress), or -1 */
    char ip[64];                         /* its source (shoal_wire_peer_group) */
    uint64_t seq;                        /* admission order */
};

struct shoal_preauth {
    struct shoal_preauth_slot *slot;     /* [cap] */
    int n, cap, per_ip;
    uint64_t seq, evicted;
};

/* cap, per_ip >= 1. Thread: the owner's (one loop thread). */
void shoal_preauth_init(struct shoal_preauth *p, int cap, int per_ip);
void shoal_preauth_free(struct shoal_preauth *p);

/* The connection to evict before a new one from peer ("host:port" or
 * "host") can be added, or NULL when there is room. The caller closes it
 * (and removes it) and asks again. Thread: the owner's. */
void *shoal_preauth_victim(const struct shoal_preauth *p, const char *peer);

/* Add conn (hs: its handshake, fd: its socket or -1, read for progress)
 * from peer; there must be room (victim returned NULL). Thread: the owner's. */
void shoal_preauth_add(struct shoal_preauth *p, void *conn, const struct shoal_handshake *hs,
                       int fd, const char *peer);

/* Remove conn if present (authenticated or closed). Thread: the owner's. */
void shoal_preauth_remove(struct shoal_preauth *p, const void *conn);

/* The source a peer address counts against in the per-address share:
 * peer "a.b.c.d:port" -> "a.b.c.d"; "[v6]:port" -> its /64 prefix,
 * "2001:db8:1:2::/64" (the interface id and any zone dropped: one host
 * picks any address of its /64); an IPv4-mapped "[::ffff:a.b.c.d]:port"
 * -> "a.b.c.d". The port may be absent ("a.b.c.d", "[v6]", bare "v6").
 * Text that is no address (a name, "?") keeps the part before the port.
 *   peer  NUL-terminated, borrowed
 *   dst   [n] bytes, written (truncated to n - 1 and terminated); a buffer
 *         of INET6_ADDRSTRLEN + 4 holds any address's group
 * Returns dst. Allocates nothing. Thread: any. */
char *shoal_wire_peer_group(const char *peer, char *dst, size_t n);

/* ---- addresses and sockets ---- */

/* Parse "HOST:PORT" or "[V6]:PORT" (HOST may be a name; resolved with
 * getaddrinfo, first result). Returns 0 or -SHOAL_EINVAL with err naming
 * the text. */
int shoal_wire_parse_addr(const char *text, struct sockaddr_storage *ss, socklen_t *len,
                          struct shoal_err *err);

/* 1 if the address is a loopback address (127/8, ::1). */
int shoal_wire_addr_is_loopback(const struct sockaddr_storage *ss);

/* The port of an IPv4 or IPv6 address in host order; 0 for another
 * family (or port 0, "any free port" when binding). Thread: any. */
unsigned shoal_wire_addr_port(const struct sockaddr_storage *ss);

/* Format an address as "host:port" into buf. Returns buf. */
char *shoal_wire_addr_str(const struct sockaddr *sa, char *buf, size_t n);

/* Monotonic nanoseconds. */
uint64_t shoal_wire_now_ns(void);

/* ---- blocking client (tools and tests) ---- */

struct shoal_wire_client {
    int fd;
    uint32_t max_frame;
    struct shoal_frame_reader reader;
    struct shoal_handshake hs;
    uint64_t bytes_sent, bytes_received;
};

/* Connect to addr and complete the handshake as connector within
 * timeout_ms. Returns 0 (c->hs.peer_info holds the peer's info) or a
 * negative status with err naming addr and the step that failed
 * (connect, timeout, authentication, fingerprint). */
int shoal_wire_client_connect(struct shoal_wire_client *c, const char *addr, Shoal__Role role,
                              const struct shoal_wire_key *key, const Shoal__PeerInfo *info,
                              const char *fingerprint, int timeout_ms, struct shoal_err *err);

/* Send one frame / receive the next one within timeout_ms (the caller
 * frees it with shoal_wire_frame_free). */
int shoal_wire_client_send(struct shoal_wire_client *c, const Shoal__Frame *f,
                           struct shoal_err *err);
Shoal__Frame *shoal_wire_client_recv(struct shoal_wire_client *c, int timeout_ms,
                                     struct shoal_err *err);
void shoal_wire_client_close(struct shoal_wire_client *c);

#endif
