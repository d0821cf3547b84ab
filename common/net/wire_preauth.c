/* wire_preauth: the table of accepted connections still in their
 * handshake, and which one to evict (see wire.h and docs/PROTOCOL.md). */
#include "wire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "util.h"
#include "wire_impl.h"

/* ---- connections in their handshake ---- */

void shoal_preauth_init(struct shoal_preauth *p, int cap, int per_ip)
{
    memset(p, 0, sizeof *p);
    p->cap = cap > 0 ? cap : 1;
    p->per_ip = per_ip > 0 ? per_ip : 1;
    p->slot = shoal_xcalloc((size_t)p->cap, sizeof *p->slot);
}

void shoal_preauth_free(struct shoal_preauth *p)
{
    free(p->slot);
    memset(p, 0, sizeof *p);
}

char *shoal_wire_peer_group(const char *peer, char *dst, size_t n)
{
    if (n == 0)
        return dst;
    char host[INET6_ADDRSTRLEN + 8];
    const char *h = peer, *end;
    if (peer[0] == '[') {
        /* "[v6]:port" or "[v6]" */
        h = peer + 1;
        end = strchr(h, ']');
        if (!end)
            end = h + strlen(h);
    } else {
        /* "v4:port", "v4", or a bare v6 without a port (more than one colon) */
        const char *colon = strchr(peer, ':');
        end = colon && !strchr(colon + 1, ':') ? colon : peer + strlen(peer);
    }
    size_t len = (size_t)(end - h);
    struct in6_addr a6;
    struct in_addr a4;
    if (len < sizeof host) {
        memcpy(host, h, len);
        host[len] = 0;
        char *pct = strchr(host, '%');   /* a zone ("fe80::1%eth0") is not part of it */
        if (pct)
            *pct = 0;
        if (inet_pton(AF_INET, host, &a4) == 1) {
            inet_ntop(AF_INET, &a4, dst, (socklen_t)n);
            return dst;
        }
        if (inet_pton(AF_INET6, host, &a6) == 1) {
            if (IN6_IS_ADDR_V4MAPPED(&a6)) {
                memcpy(&a4, a6.s6_addr + 12, 4);
                inet_ntop(AF_INET, &a4, dst, (socklen_t)n);
                return dst;
            }
            /* one site usually holds a whole /64: its interface ids are free */
            memset(a6.s6_addr + 8, 0, 8);
            char net[INET6_ADDRSTRLEN];
            inet_ntop(AF_INET6, &a6, net, sizeof net);
            snprintf(dst, n, "%s/64", net);
            return dst;
        }
    }
    /* not an address (a name, "?"): the text before the port, as given */
    if (len >= n)
        len = n - 1;
    memcpy(dst, h, len);
    dst[len] = 0;
    return dst;
}

static void preauth_host(char *dst, size_t n, const char *peer)
{
    shoal_wire_peer_group(peer, dst, n);
}

/* progress: a connection whose hello was read, or that has bytes waiting
 * (the loop accepts before it reads), ranks above a silent one */
static int preauth_progress(const struct shoal_preauth_slot *s)
{
    int avail = 0;
    return s->hs->state != SHOAL_HS_START ||
           (s->fd >= 0 && ioctl(s->fd, FIONREAD, &avail) == 0 && avail > 0);
}

static int preauth_worse(const struct shoal_preauth_slot *a, const struct shoal_preauth_slot *b)
{
    int pa = preauth_progress(a), pb = preauth_progress(b);
    return pa != pb ? pa < pb : a->seq < b->seq;
}

void *shoal_preauth_victim(const struct shoal_preauth *p, const char *peer)
{
    char ip[64];
    preauth_host(ip, sizeof ip, peer);
    int same = 0;
    for (int i = 0; i < p->n; i++)
        same += !strcmp(p->slot[i].ip, ip);
    if (same < p->per_ip && p->n < p->cap)
        return NULL;
    /* the table is full: the victim comes from the address holding the
     * most slots, so addresses that churn connections evict each other,
     * not the one connection of another peer still sending its hello */
    int most = 0, count[p->n > 0 ? p->n : 1];
    for (int i = 0; i < p->n; i++) {
        count[i] = 0;
        for (int j = 0; j < p->n; j++)
            count[i] += !strcmp(p->slot[i].ip, p->slot[j].ip);
        if (count[i] > most)
            most = count[i];
    }
    const struct shoal_preauth_slot *v = NULL;
    for (int i = 0; i < p->n; i++) {
        const struct shoal_preauth_slot *s = &p->slot[i];
        if (same >= p->per_ip ? strcmp(s->ip, ip) != 0 : count[i] < most)
            continue;
        if (!v || preauth_worse(s, v))
            v = s;
    }
    return v ? v->conn : NULL;
}

void shoal_preauth_add(struct shoal_preauth *p, void *conn, const struct shoal_handshake *hs,
                       int fd, const char *peer)
{
    if (p->n >= p->cap)
        return;   /* the caller evicts first; never reached */
    struct shoal_preauth_slot *s = &p->slot[p->n++];
    s->conn = conn;
    s->hs = hs;
    s->fd = fd;
    s->seq = ++p->seq;
    preauth_host(s->ip, sizeof s->ip, peer);
}

void shoal_preauth_remove(struct shoal_preauth *p, const void *conn)
{
    for (int i = 0; i < p->n; i++)
        if (p->slot[i].conn == conn) {
            p->slot[i] = p->slot[--p->n];
            return;
        }
}
