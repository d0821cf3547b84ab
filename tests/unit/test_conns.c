/* The HTTP connection table of shoal serve (coordinator/serve/conns.h):
 * which connection is closed to make room, the deadlines, address keys.
 * Connections are socketpairs: the table shuts down one end, and the test
 * sees end-of-stream on the other. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "conns.h"

struct fake {
    int ours, peer;   /* the table's end, the client's end */
};

static struct sockaddr_in v4(const char *ip)
{
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    cr_assert_eq(inet_pton(AF_INET, ip, &a.sin_addr), 1);
    return a;
}

static struct sockaddr_in6 v6(const char *ip)
{
    struct sockaddr_in6 a;
    memset(&a, 0, sizeof a);
    a.sin6_family = AF_INET6;
    cr_assert_eq(inet_pton(AF_INET6, ip, &a.sin6_addr), 1);
    return a;
}

static void open_fake(struct serve_conns *t, struct fake *f, const char *ip)
{
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    f->ours = sv[0];
    f->peer = sv[1];
    struct sockaddr_in a = v4(ip);
    serve_conns_started(t, f, f->ours, (struct sockaddr *)&a);
}

/* 1 when the table shut our end down (the client reads end-of-stream) */
static int closed(const struct fake *f)
{
    struct pollfd p = {.fd = f->peer, .events = POLLIN};
    if (poll(&p, 1, 0) <= 0)
        return 0;
    char b;
    return recv(f->peer, &b, 1, MSG_DONTWAIT) == 0;
}

static void close_fake(struct serve_conns *t, struct fake *f)
{
    serve_conns_closed(t, f);
    close(f->ours);
    close(f->peer);
}

static struct serve_conns *table(int max, int per_addr, double head_s)
{
    struct serve_conns_limits lim = {.max = max, .per_addr = per_addr, .head_s = head_s,
                                     .body_grace_s = head_s, .body_rate = 1024};
    struct serve_conns *t = serve_conns_create(&lim);
    cr_assert_not_null(t);
    return t;
}

Test(conns, per_address_cap_evicts_that_address_oldest_waiting)
{
    struct serve_conns *t = table(16, 3, 60);
    struct fake a[3], b, n;
    for (int i = 0; i < 3; i++)
        open_fake(t, &a[i], "10.0.0.1");
    open_fake(t, &b, "10.0.0.2");
    serve_conns_head(t, &a[0]);
    serve_conns_busy(t, &a[0]);   /* answering a request: never evicted */
    open_fake(t, &n, "10.0.0.1");
    cr_assert(!closed(&a[0]), "a connection answering a request is kept");
    cr_assert(closed(&a[1]), "the oldest waiting connection of the full address is closed");
    cr_assert(!closed(&a[2]) && !closed(&b) && !closed(&n));
    struct serve_conns_stats st = serve_conns_stats(t);
    cr_assert_eq(st.evicted, 1);
    cr_assert_eq(st.open, 4);
    close_fake(t, &a[1]);
    cr_assert_eq(serve_conns_stats(t).open, 4);
    for (int i = 0; i < 3; i++)
        if (i != 1)
            close_fake(t, &a[i]);
    close_fake(t, &b);
    close_fake(t, &n);
    cr_assert_eq(serve_conns_stats(t).open, 0);
    serve_conns_free(t);
}

Test(conns, full_table_evicts_from_the_address_holding_most)
{
    struct serve_conns *t = table(5, 5, 60);
    struct fake a[3], b[2], n;
    open_fake(t, &b[0], "10.0.0.2");
    for (int i = 0; i < 3; i++)
        open_fake(t, &a[i], "10.0.0.1");
    open_fake(t, &b[1], "10.0.0.2");
    /* b[0] is the oldest of all, but 10.0.0.1 holds the most */
    serve_conns_head(t, &a[0]);   /* sending its body: ranks above one in its head */
    open_fake(t, &n, "10.0.0.3");
    cr_assert(!closed(&b[0]) && !closed(&b[1]), "the other address keeps its connections");
    cr_assert(!closed(&a[0]), "a connection sending its body ranks above one in its head");
    cr_assert(closed(&a[1]), "the oldest in its head of the address holding most goes");
    cr_assert(!closed(&a[2]) && !closed(&n));
    for (int i = 0; i < 3; i++)
        close_fake(t, &a[i]);
    close_fake(t, &b[0]);
    close_fake(t, &b[1]);
    close_fake(t, &n);
    serve_conns_free(t);
}

Test(conns, every_slot_busy_refuses_the_new_one)
{
    struct serve_conns *t = table(2, 2, 60);
    struct fake a[2], n;
    for (int i = 0; i < 2; i++) {
        open_fake(t, &a[i], "10.0.0.1");
        serve_conns_busy(t, &a[i]);
    }
    open_fake(t, &n, "10.0.0.9");
    cr_assert(!closed(&a[0]) && !closed(&a[1]));
    cr_assert(closed(&n), "the new connection is closed when every slot is busy");
    cr_assert_eq(serve_conns_stats(t).refused, 1);
    /* a reply done: that connection waits for its next head, evictable again */
    close_fake(t, &n);
    serve_conns_idle(t, &a[1]);
    open_fake(t, &n, "10.0.0.9");
    cr_assert(closed(&a[1]) && !closed(&n) && !closed(&a[0]));
    for (int i = 0; i < 2; i++)
        close_fake(t, &a[i]);
    close_fake(t, &n);
    serve_conns_free(t);
}

Test(conns, head_deadline_and_body_rate)
{
    struct serve_conns *t = table(16, 16, 1);
    struct fake head, body, fast, busy;
    open_fake(t, &head, "10.0.0.1");
    open_fake(t, &body, "10.0.0.1");
    open_fake(t, &fast, "10.0.0.1");
    open_fake(t, &busy, "10.0.0.1");
    serve_conns_head(t, &body);
    serve_conns_head(t, &fast);
    serve_conns_busy(t, &busy);
    usleep(600 * 1000);
    cr_assert(!closed(&head) && !closed(&body), "nothing closes before its deadline");
    /* 1 s grace at 1024 B/s: by 2.5 s a body needs ~1.5 KiB */
    serve_conns_body(t, &body, 100);
    serve_conns_body(t, &fast, 64 * 1024);
    usleep(1900 * 1000);
    cr_assert(closed(&head), "a head not whole within head_s is closed");
    cr_assert(closed(&body), "a body below the rate after the grace is closed");
    cr_assert(!closed(&fast), "a body above the rate is kept");
    cr_assert(!closed(&busy), "a request being answered has no deadline here");
    struct serve_conns_stats st = serve_conns_stats(t);
    cr_assert_eq(st.head_timeout, 1);
    cr_assert_eq(st.body_slow, 1);
    close_fake(t, &head);
    close_fake(t, &body);
    close_fake(t, &fast);
    close_fake(t, &busy);
    serve_conns_free(t);
}

Test(conns, address_keys)
{
    char buf[80];
    struct sockaddr_in a = v4("192.0.2.7");
    cr_assert_str_eq(serve_conns_addr_key((struct sockaddr *)&a, buf, sizeof buf), "192.0.2.7");
    struct sockaddr_in6 b = v6("2001:db8:1:2:aaaa:bbbb:cccc:dddd");
    cr_assert_str_eq(serve_conns_addr_key((struct sockaddr *)&b, buf, sizeof buf),
                     "2001:db8:1:2::/64");
    struct sockaddr_in6 m = v6("::ffff:192.0.2.7");
    cr_assert_str_eq(serve_conns_addr_key((struct sockaddr *)&m, buf, sizeof buf), "192.0.2.7");
}

Test(conns, ipv6_peers_of_one_slash64_share_a_cap)
{
    struct serve_conns *t = table(16, 2, 60);
    int sv[3][2];
    const char *ips[3] = {"2001:db8:1:2::1", "2001:db8:1:2::ffff", "2001:db8:1:2:1::9"};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv[i]), 0);
        struct sockaddr_in6 a = v6(ips[i]);
        serve_conns_started(t, &sv[i], sv[i][0], (struct sockaddr *)&a);
    }
    struct fake f0 = {sv[0][0], sv[0][1]}, f1 = {sv[1][0], sv[1][1]}, f2 = {sv[2][0], sv[2][1]};
    cr_assert(closed(&f0), "the third connection of one /64 evicts its oldest");
    cr_assert(!closed(&f1) && !closed(&f2));
    for (int i = 0; i < 3; i++) {
        serve_conns_closed(t, &sv[i]);
        close(sv[i][0]);
        close(sv[i][1]);
    }
    serve_conns_free(t);
}
