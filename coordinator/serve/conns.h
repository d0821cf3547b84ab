/* conns: the HTTP connections `shoal serve` holds, and the limits that keep
 * a slot free for a client that sends its request (slow-client defence).
 *
 * libmicrohttpd runs a thread per connection and times out only a
 * connection that sends nothing at all; one that trickles its request head
 * or body a byte every few seconds would hold its slot for ever. This
 * table tracks each connection's phase and enforces:
 *  - a deadline for the whole request head (head_s seconds from the
 *    connection's start, or from the end of its previous reply: an idle
 *    kept-alive connection is closed then too);
 *  - a minimum body rate: after the head, body bytes must keep up with
 *    body_rate bytes/s once body_grace_s seconds have passed;
 *  - at most max connections, and at most per_addr from one address
 *    (IPv4: the address; IPv6: its /64; IPv4-mapped IPv6 as IPv4).
 * A new connection is never refused for want of a slot while some
 * connection has not yet sent a whole request: the one that made the least
 * progress (still in its head before one sending its body; then the
 * oldest) is closed, among the new connection's address's own when that
 * address is at per_addr, else among the address holding the most
 * connections. Connections with a request in progress (generating, or
 * their reply being sent) are never evicted; when every slot holds one,
 * the new connection is closed (docs/OPERATIONS.md, "Limits").
 *
 * Closing is shutdown(2) on the connection's socket: libmicrohttpd's
 * thread for it sees the end and closes it. A connection stays in the
 * table until serve_conns_closed, which libmicrohttpd calls before it
 * closes the socket, so a descriptor shut down here is never a reused one.
 *
 * Thread: every call takes the table's mutex; any thread. A reaper thread,
 * started by serve_conns_create, enforces the deadlines every 100 ms.
 */
#ifndef SHOAL_SERVE_CONNS_H
#define SHOAL_SERVE_CONNS_H

#include <stdint.h>
#include <sys/socket.h>

struct serve_conns;

struct serve_conns_limits {
    int max;               /* connections at once (>= 1) */
    int per_addr;          /* from one address (>= 1, <= max) */
    double head_s;         /* seconds for a whole request head (> 0) */
    double body_grace_s;   /* seconds a body may stall before the rate applies */
    double body_rate;      /* bytes/s a body must average after the grace */
};

/* Why the table closed connections (counters, for /metrics). */
struct serve_conns_stats {
    uint64_t evicted;      /* closed to make room for a new connection */
    uint64_t refused;      /* new connections closed: every slot was busy */
    uint64_t head_timeout; /* request head not whole within head_s */
    uint64_t body_slow;    /* body below body_rate after the grace */
    int open;              /* connections in the table now (not yet closed) */
};

/* A table with these limits and its reaper thread. Returns NULL when the
 * thread cannot start. Owned by the caller; serve_conns_free. */
struct serve_conns *serve_conns_create(const struct serve_conns_limits *lim);

/* Stop the reaper and free. NULL is a no-op. */
void serve_conns_free(struct serve_conns *t);

/* A connection was accepted (libmicrohttpd's NOTIFY_STARTED): conn is its
 * handle (an opaque key), fd its socket, addr its peer. Makes room by
 * closing a victim when the limits require, or closes this connection
 * when nothing can be evicted. */
void serve_conns_started(struct serve_conns *t, const void *conn, int fd,
                         const struct sockaddr *addr);

/* The connection is closing (NOTIFY_CLOSED): forget it. Unknown conn: no-op. */
void serve_conns_closed(struct serve_conns *t, const void *conn);

/* Its request head is whole: the body phase begins (bytes counted by
 * serve_conns_body). */
void serve_conns_head(struct serve_conns *t, const void *conn);

/* n more body bytes arrived. */
void serve_conns_body(struct serve_conns *t, const void *conn, uint64_t n);

/* The whole request arrived: it is being answered; never evicted now. */
void serve_conns_busy(struct serve_conns *t, const void *conn);

/* Its reply is done: the connection waits for its next request head. */
void serve_conns_idle(struct serve_conns *t, const void *conn);

/* The counters so far. */
struct serve_conns_stats serve_conns_stats(struct serve_conns *t);

/* The address key a connection counts under, as text ("127.0.0.1",
 * "2001:db8:1:2::/64"); exposed for tests. buf of n >= 64 bytes. Returns buf. */
char *serve_conns_addr_key(const struct sockaddr *addr, char *buf, size_t n);

#endif
