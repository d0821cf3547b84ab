/* conns: the connection table of `shoal serve` (see conns.h). */
#include "conns.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

enum phase {
    PHASE_HEAD = 0,   /* waiting for (the rest of) a request head */
    PHASE_BODY,       /* head read, body arriving */
    PHASE_BUSY,       /* request whole: being answered */
};

/* an address as it is counted: IPv4 whole, IPv6 by its /64 */
struct addr_key {
    int family;
    unsigned char b[8];
};

struct entry {
    const void *conn;
    int fd;
    struct addr_key addr;
    enum phase phase;
    double since;         /* when the phase began (shoal_time_s) */
    uint64_t body_bytes;  /* PHASE_BODY: bytes so far */
    int closing;          /* shut down here; waiting for serve_conns_closed */
};

struct keyed;

struct serve_conns {
    struct serve_conns_limits lim;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct entry *e;
    struct keyed *keyed;                  /* [cap] scratch of victim() */
    int n, cap;
    struct serve_conns_stats st;
    int stop;
    pthread_t reaper;
};

static struct addr_key key_of(const struct sockaddr *sa)
{
    struct addr_key k;
    memset(&k, 0, sizeof k);
    if (!sa)
        return k;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        k.family = AF_INET;
        memcpy(k.b, &in->sin_addr, 4);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
            k.family = AF_INET;
            memcpy(k.b, in6->sin6_addr.s6_addr + 12, 4);
        } else {
            k.family = AF_INET6;
            memcpy(k.b, in6->sin6_addr.s6_addr, 8);   /* the /64 */
        }
    }
    return k;
}

static int same_addr(const struct addr_key *a, const struct addr_key *b)
{
    return a->family == b->family && !memcmp(a->b, b->b, sizeof a->b);
}

char *serve_conns_addr_key(const struct sockaddr *addr, char *buf, size_t n)
{
    struct addr_key k = key_of(addr);
    if (k.family == AF_INET) {
        inet_ntop(AF_INET, k.b, buf, (socklen_t)n);
    } else if (k.family == AF_INET6) {
        unsigned char full[16] = {0};
        memcpy(full, k.b, 8);
        char t[INET6_ADDRSTRLEN];
        inet_ntop(AF_INET6, full, t, sizeof t);
        snprintf(buf, n, "%s/64", t);
    } else {
        snprintf(buf, n, "other");
    }
    return buf;
}

static struct entry *find(struct serve_conns *t, const void *conn)
{
    for (int i = 0; i < t->n; i++)
        if (t->e[i].conn == conn)
            return &t->e[i];
    return NULL;
}

/* Close e's connection (mu held): its thread sees the end of the stream. */
static void close_entry(struct entry *e)
{
    if (e->closing)
        return;
    e->closing = 1;
    if (e->fd >= 0)
        shutdown(e->fd, SHUT_RDWR);
}

/* Open connections (not closing) in all, and from addr. */
static void count(const struct serve_conns *t, const struct addr_key *addr, int *all, int *same)
{
    *all = *same = 0;
    for (int i = 0; i < t->n; i++) {
        if (t->e[i].closing)
            continue;
        (*all)++;
        *same += same_addr(&t->e[i].addr, addr);
    }
}

static int evictable(const struct entry *e)
{
    return !e->closing && e->phase != PHASE_BUSY;
}

/* a made less progress than b: still in its head before one sending its
 * body, then the phase that began earlier */
static int worse(const struct entry *a, const struct entry *b)
{
    if (a->phase != b->phase)
        return a->phase < b->phase;
    return a->since < b->since;
}

/* An open connection's address and its place in the table (victim()). */
struct keyed {
    struct addr_key k;
    int i;
};

static int keyed_cmp(const void *pa, const void *pb)
{
    const struct keyed *a = pa, *b = pb;
    if (a->k.family != b->k.family)
        return a->k.family < b->k.family ? -1 : 1;
    int c = memcmp(a->k.b, b->k.b, sizeof a->k.b);
    if (c)
        return c;
    return (a->i > b->i) - (a->i < b->i);
}

/* The address holding the most open connections among those with one to
 * give (ties: the one whose first evictable connection comes first in the
 * table), into *most. Returns 0, or -1 when none can give one. Sorts the
 * open connections' addresses: O(n log n) per new connection, so a table
 * of thousands stays cheap under a flood (mu held). */
static int most_held(struct serve_conns *t, struct addr_key *most)
{
    int n = 0;
    for (int i = 0; i < t->n; i++)
        if (!t->e[i].closing)
            t->keyed[n++] = (struct keyed){t->e[i].addr, i};
    qsort(t->keyed, (size_t)n, sizeof *t->keyed, keyed_cmp);
    int best_n = -1, best_first = 0;
    for (int r = 0; r < n;) {
        int end = r, first = -1;
        while (end < n && same_addr(&t->keyed[end].k, &t->keyed[r].k)) {
            const int i = t->keyed[end].i;
            if (evictable(&t->e[i]) && (first < 0 || i < first))
                first = i;
            end++;
        }
        if (first >= 0 && (end - r > best_n || (end - r == best_n && first < best_first))) {
            best_n = end - r;
            best_first = first;
            *most = t->keyed[r].k;
        }
        r = end;
    }
    return best_n < 0 ? -1 : 0;
}

/* The connection to close for one from addr to fit, or NULL (mu held). */
static struct entry *victim(struct serve_conns *t, const struct addr_key *addr, int same_full)
{
    /* the table is full and addr has room: take from the address holding
     * the most open connections among those with one to give */
    struct addr_key most = {0};
    if (!same_full && most_held(t, &most))
        return NULL;
    struct entry *v = NULL;
    for (int i = 0; i < t->n; i++) {
        struct entry *e = &t->e[i];
        if (!evictable(e) || !same_addr(&e->addr, same_full ? addr : &most))
            continue;
        if (!v || worse(e, v))
            v = e;
    }
    return v;
}

void serve_conns_started(struct serve_conns *t, const void *conn, int fd,
                         const struct sockaddr *addr)
{
    const struct addr_key k = key_of(addr);
    pthread_mutex_lock(&t->mu);
    int all, same;
    count(t, &k, &all, &same);
    int room = 1;
    if (same >= t->lim.per_addr || all >= t->lim.max) {
        struct entry *v = victim(t, &k, same >= t->lim.per_addr);
        if (v) {
            close_entry(v);
            t->st.evicted++;
        } else {
            room = 0;
        }
    }
    if (t->n == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 64;
        t->e = shoal_xrealloc(t->e, (size_t)t->cap * sizeof *t->e);
        t->keyed = shoal_xrealloc(t->keyed, (size_t)t->cap * sizeof *t->keyed);
    }
    struct entry *e = &t->e[t->n++];
    memset(e, 0, sizeof *e);
    e->conn = conn;
    e->fd = fd;
    e->addr = k;
    e->phase = PHASE_HEAD;
    e->since = shoal_time_s();
    if (!room) {   /* every slot answers a request: this one goes */
        close_entry(e);
        t->st.refused++;
    }
    pthread_mutex_unlock(&t->mu);
}

void serve_conns_closed(struct serve_conns *t, const void *conn)
{
    pthread_mutex_lock(&t->mu);
    struct entry *e = find(t, conn);
    if (e)
        *e = t->e[--t->n];
    pthread_mutex_unlock(&t->mu);
}

static void set_phase(struct serve_conns *t, const void *conn, enum phase p)
{
    pthread_mutex_lock(&t->mu);
    struct entry *e = find(t, conn);
    if (e) {
        e->phase = p;
        e->since = shoal_time_s();
        e->body_bytes = 0;
    }
    pthread_mutex_unlock(&t->mu);
}

void serve_conns_head(struct serve_conns *t, const void *conn)
{
    set_phase(t, conn, PHASE_BODY);
}

void serve_conns_busy(struct serve_conns *t, const void *conn)
{
    set_phase(t, conn, PHASE_BUSY);
}

void serve_conns_idle(struct serve_conns *t, const void *conn)
{
    set_phase(t, conn, PHASE_HEAD);
}

void serve_conns_body(struct serve_conns *t, const void *conn, uint64_t n)
{
    pthread_mutex_lock(&t->mu);
    struct entry *e = find(t, conn);
    if (e)
        e->body_bytes += n;
    pthread_mutex_unlock(&t->mu);
}

struct serve_conns_stats serve_conns_stats(struct serve_conns *t)
{
    pthread_mutex_lock(&t->mu);
    struct serve_conns_stats s = t->st;
    s.open = 0;
    for (int i = 0; i < t->n; i++)
        s.open += !t->e[i].closing;
    pthread_mutex_unlock(&t->mu);
    return s;
}

/* Close what is past its deadline (mu held). */
static void reap(struct serve_conns *t, double now)
{
    for (int i = 0; i < t->n; i++) {
        struct entry *e = &t->e[i];
        if (e->closing)
            continue;
        const double age = now - e->since;
        if (e->phase == PHASE_HEAD && age > t->lim.head_s) {
            close_entry(e);
            t->st.head_timeout++;
        } else if (e->phase == PHASE_BODY && age > t->lim.body_grace_s &&
                   (double)e->body_bytes < t->lim.body_rate * (age - t->lim.body_grace_s)) {
            close_entry(e);
            t->st.body_slow++;
        }
    }
}

static void *reaper_main(void *arg)
{
    struct serve_conns *t = arg;
    pthread_mutex_lock(&t->mu);
    while (!t->stop) {
        shoal_cond_wait_ms(&t->cv, &t->mu, 100);
        if (!t->stop)
            reap(t, shoal_time_s());
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

struct serve_conns *serve_conns_create(const struct serve_conns_limits *lim)
{
    struct serve_conns *t = shoal_xcalloc(1, sizeof *t);
    t->lim = *lim;
    if (t->lim.max < 1)
        t->lim.max = 1;
    if (t->lim.per_addr < 1 || t->lim.per_addr > t->lim.max)
        t->lim.per_addr = t->lim.max;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    if (pthread_create(&t->reaper, NULL, reaper_main, t) != 0) {
        pthread_cond_destroy(&t->cv);
        pthread_mutex_destroy(&t->mu);
        free(t);
        return NULL;
    }
    return t;
}

void serve_conns_free(struct serve_conns *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    t->stop = 1;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->reaper, NULL);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    free(t->e);
    free(t->keyed);
    free(t);
}
