/* discover_avahi.c: discover.h on Avahi's embeddable mDNS stack (avahi-core),
 * which needs no avahi-daemon nor D-Bus: each process runs its own
 * responder on port 5353 (SO_REUSEADDR, so it coexists with a daemon).
 * Every avahi call of an announcer happens on its threaded poll's thread
 * (the callbacks) or before that thread starts and after it stops; a
 * browse runs a simple poll on the caller's thread. */
#include <arpa/inet.h>
#include <ctype.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sodium.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <avahi-common/address.h>
#include <avahi-common/alternative.h>
#include <avahi-common/error.h>
#include <avahi-common/malloc.h>
#include <avahi-common/simple-watch.h>
#include <avahi-common/strlst.h>
#include <avahi-common/thread-watch.h>
#include <avahi-core/core.h>
#include <avahi-core/log.h>
#include <avahi-core/lookup.h>
#include <avahi-core/publish.h>

#include "discover.h"
#include "log.h"

/* services resolved at once by one browse: answers beyond it are dropped
 * (counted), so a LAN full of services costs a bounded number of resolvers */
#define MAX_RESOLVING 64
/* records avahi-core caches per interface (its default is 4096) */
#define CACHE_ENTRIES_MAX 1024
/* TXT strings looked at per answer; more is malformed for us */
#define MAX_TXT 16

const char *shoal_discover_backend(void)
{
    return "avahi-core";
}

/* avahi-core logs to stderr by default: through ours instead, at debug
 * (its warnings are about other hosts' packets; a failure reaches the
 * caller as an error) */
static void avahi_to_shoal_log(AvahiLogLevel level, const char *txt)
{
    shoal_log(level <= AVAHI_LOG_ERROR ? SHOAL_LOG_WARN : SHOAL_LOG_DEBUG, "mdns", "%s", txt);
}

static void base_config(AvahiServerConfig *cfg)
{
    avahi_set_log_function(avahi_to_shoal_log);
    avahi_server_config_init(cfg);
    cfg->publish_hinfo = 0;
    cfg->publish_workstation = 0;
    cfg->publish_domain = 0;
    cfg->n_cache_entries_max = CACHE_ENTRIES_MAX;
}

/* ---- announcing ---- */

struct shoal_discover_announcer {
    AvahiThreadedPoll *poll;
    AvahiServer *server;
    AvahiSEntryGroup *group;
    char *name;                       /* avahi_malloc'd: the current instance name */
    char txt_key[8 + SHOAL_DISCOVER_KEY_ID_HEX]; /* "keyid=…" */
    char txt_fp[4 + 16];                          /* "fp=…" or "" */
    uint16_t port;
    AvahiIfIndex iface;               /* AVAHI_IF_UNSPEC: every interface */
    AvahiProtocol proto;
    int any;                          /* bound to a wildcard address */
    struct sockaddr_storage bound;    /* else the address it is bound to */
};

static void group_cb(AvahiServer *s, AvahiSEntryGroup *g, AvahiEntryGroupState state,
                     void *user);

/* Whether interface address sa is one the worker can be reached at. */
static int reachable_at(const struct shoal_discover_announcer *a, const struct ifaddrs *i)
{
    const struct sockaddr *sa = i->ifa_addr;
    if (!sa || (i->ifa_flags & IFF_LOOPBACK) || !(i->ifa_flags & IFF_UP) ||
        (sa->sa_family != AF_INET && sa->sa_family != AF_INET6))
        return 0;
    const struct sockaddr_in *v4 = (const struct sockaddr_in *)(const void *)sa;
    const struct sockaddr_in6 *v6 = (const struct sockaddr_in6 *)(const void *)sa;
    if (sa->sa_family == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&v6->sin6_addr))
        return 0;   /* HOST:PORT cannot carry its scope: browsers skip it */
    if (a->any)
        return 1;
    if (sa->sa_family != a->bound.ss_family)
        return 0;
    if (sa->sa_family == AF_INET)
        return v4->sin_addr.s_addr == ((const struct sockaddr_in *)&a->bound)->sin_addr.s_addr;
    return !memcmp(&v6->sin6_addr, &((const struct sockaddr_in6 *)&a->bound)->sin6_addr,
                   sizeof v6->sin6_addr);
}

/* The A/AAAA records of host, one per address the worker is reachable at
 * (every interface's for a wildcard --listen), without the reverse PTR
 * records: those name one host per address, so a second responder on the
 * machine (another worker, avahi-daemon) would contest them. Returns how
 * many were added. Thread: the poll's. */
static int add_addresses(struct shoal_discover_announcer *a, AvahiServer *s, const char *host)
{
    struct ifaddrs *list = NULL;
    if (getifaddrs(&list) < 0)
        return 0;
    int n = 0;
    for (struct ifaddrs *i = list; i; i = i->ifa_next) {
        if (!reachable_at(a, i))
            continue;
        AvahiAddress addr;
        memset(&addr, 0, sizeof addr);
        if (i->ifa_addr->sa_family == AF_INET) {
            addr.proto = AVAHI_PROTO_INET;
            addr.data.ipv4.address =
                ((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr.s_addr;
        } else {
            addr.proto = AVAHI_PROTO_INET6;
            memcpy(addr.data.ipv6.address,
                   &((const struct sockaddr_in6 *)(const void *)i->ifa_addr)->sin6_addr, 16);
        }
        const int idx = (int)if_nametoindex(i->ifa_name);
        if (idx > 0 && avahi_server_add_address(s, a->group, idx, addr.proto,
                                                AVAHI_PUBLISH_NO_REVERSE, host, &addr) == 0)
            n++;
    }
    freeifaddrs(list);
    return n;
}

/* (Re)publish the service in an empty group. Thread: the poll's. */
static void publish(struct shoal_discover_announcer *a, AvahiServer *s)
{
    if (!a->group && !(a->group = avahi_s_entry_group_new(s, group_cb, a))) {
        shoal_log(SHOAL_LOG_WARN, "mdns", "cannot create the service's entry group: %s",
                  avahi_strerror(avahi_server_errno(s)));
        return;
    }
    if (!avahi_s_entry_group_is_empty(a->group))
        return;
    const char *host = avahi_server_get_host_name_fqdn(s);
    if (add_addresses(a, s, host) == 0) {
        shoal_log(SHOAL_LOG_WARN, "mdns", "not announced: no interface that is up has an "
                  "address the worker listens on");
        return;
    }
    int r = avahi_server_add_service(s, a->group, a->iface, a->proto, 0, a->name,
                                     SHOAL_DISCOVER_SERVICE, NULL, host, a->port, "v=1",
                                     a->txt_key, a->txt_fp[0] ? a->txt_fp : NULL, NULL);
    if (r == 0)
        r = avahi_s_entry_group_commit(a->group);
    if (r < 0)
        shoal_log(SHOAL_LOG_WARN, "mdns", "cannot announce '%s' (%s port %u): %s", a->name,
                  SHOAL_DISCOVER_SERVICE, a->port, avahi_strerror(r));
}

static void group_cb(AvahiServer *s, AvahiSEntryGroup *g, AvahiEntryGroupState state,
                     void *user)
{
    struct shoal_discover_announcer *a = user;
    if (state == AVAHI_ENTRY_GROUP_ESTABLISHED) {
        shoal_log(SHOAL_LOG_INFO, "mdns", "announced '%s' as %s port %u", a->name,
                  SHOAL_DISCOVER_SERVICE, a->port);
    } else if (state == AVAHI_ENTRY_GROUP_COLLISION) {
        /* another service has the name: take avahi's next ("name #2") */
        char *n = avahi_alternative_service_name(a->name);
        shoal_log(SHOAL_LOG_INFO, "mdns", "service name '%s' is taken, trying '%s'", a->name,
                  n);
        avahi_free(a->name);
        a->name = n;
        avahi_s_entry_group_reset(g);
        publish(a, s);
    } else if (state == AVAHI_ENTRY_GROUP_FAILURE) {
        shoal_log(SHOAL_LOG_WARN, "mdns", "announcing '%s' failed: %s", a->name,
                  avahi_strerror(avahi_server_errno(s)));
    }
}

static void announce_server_cb(AvahiServer *s, AvahiServerState state, void *user)
{
    struct shoal_discover_announcer *a = user;
    if (state == AVAHI_SERVER_RUNNING) {
        publish(a, s);
        return;
    }
    if (state == AVAHI_SERVER_FAILURE) {
        shoal_log(SHOAL_LOG_WARN, "mdns", "the mDNS responder failed: %s",
                  avahi_strerror(avahi_server_errno(s)));
        return;
    }
    if (state == AVAHI_SERVER_COLLISION) {
        /* another host has our mDNS host name (workers in network namespaces
         * share one hostname): take avahi's next ("name-2") */
        char *n = avahi_alternative_host_name(avahi_server_get_host_name(s));
        int r = avahi_server_set_host_name(s, n);
        if (r < 0)
            shoal_log(SHOAL_LOG_WARN, "mdns", "cannot change the mDNS host name to '%s': %s",
                      n, avahi_strerror(r));
        avahi_free(n);
    }
    /* collision or registering: the service waits until the host name is ours */
    if ((state == AVAHI_SERVER_COLLISION || state == AVAHI_SERVER_REGISTERING) && a->group)
        avahi_s_entry_group_reset(a->group);
}

/* The interface that has address ss, or -1. */
static int iface_of(const struct sockaddr_storage *ss)
{
    struct ifaddrs *list = NULL;
    if (getifaddrs(&list) < 0)
        return -1;
    int found = -1;
    for (struct ifaddrs *i = list; i && found < 0; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != ss->ss_family)
            continue;
        if (ss->ss_family == AF_INET &&
            ((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr.s_addr ==
                ((const struct sockaddr_in *)ss)->sin_addr.s_addr)
            found = (int)if_nametoindex(i->ifa_name);
        if (ss->ss_family == AF_INET6 &&
            !memcmp(&((const struct sockaddr_in6 *)(const void *)i->ifa_addr)->sin6_addr,
                    &((const struct sockaddr_in6 *)ss)->sin6_addr, sizeof(struct in6_addr)))
            found = (int)if_nametoindex(i->ifa_name);
    }
    freeifaddrs(list);
    return found > 0 ? found : -1;
}

/* "shoal-<hostname>-<8 random hex>": letters, digits and '-' only, at
 * most 63 bytes. Random, not the port: workers in network namespaces share
 * one hostname and often one port, and two responders that probe the same
 * name at once can both lose and rename in step, again and again. */
static void host_name(char *out, size_t cap)
{
    char h[256] = "";
    if (gethostname(h, sizeof h - 1) < 0 || !h[0])
        snprintf(h, sizeof h, "host");
    char *dot = strchr(h, '.');
    if (dot)
        *dot = 0;
    for (char *c = h; *c; c++)
        if (!isalnum((unsigned char)*c))
            *c = '-';
    h[40] = 0;
    snprintf(out, cap, "shoal-%s-%08x", h, (unsigned)randombytes_random());
}

struct shoal_discover_announcer *
shoal_discover_announce_start(const struct shoal_discover_announce_params *p,
                              struct shoal_err *err)
{
    char key_id[SHOAL_DISCOVER_KEY_ID_HEX + 1];
    if (shoal_discover_key_id(p->key, key_id) < 0) {
        shoal_err_set(err, -SHOAL_EINVAL, "mDNS: a worker announces itself only with a "
                      "cluster key");
        return NULL;
    }
    struct sockaddr_storage ss;
    socklen_t len;
    if (shoal_wire_parse_addr(p->listen, &ss, &len, err) < 0)
        return NULL;
    if (shoal_wire_addr_is_loopback(&ss)) {
        shoal_err_set(err, -SHOAL_EINVAL, "mDNS: %s is a loopback address, which nothing on "
                      "the LAN can reach", p->listen);
        return NULL;
    }
    const uint16_t port = (uint16_t)shoal_wire_addr_port(&ss);
    const struct sockaddr_in *v4 = (const struct sockaddr_in *)&ss;
    const int any = ss.ss_family == AF_INET
                        ? v4->sin_addr.s_addr == htonl(INADDR_ANY)
                        : !memcmp(&((const struct sockaddr_in6 *)&ss)->sin6_addr,
                                  &in6addr_any, sizeof in6addr_any);
    struct shoal_discover_announcer *a = calloc(1, sizeof *a);
    if (!a) {
        shoal_err_set(err, -SHOAL_ENOMEM, "mDNS: out of memory");
        return NULL;
    }
    a->port = port;
    a->any = any;
    a->bound = ss;
    a->iface = AVAHI_IF_UNSPEC;
    a->proto = AVAHI_PROTO_UNSPEC;
    if (!any) {
        int idx = iface_of(&ss);
        if (idx < 0) {
            shoal_err_set(err, -SHOAL_EINVAL, "mDNS: no interface has the address of %s",
                          p->listen);
            free(a);
            return NULL;
        }
        a->iface = idx;
        a->proto = ss.ss_family == AF_INET ? AVAHI_PROTO_INET : AVAHI_PROTO_INET6;
    }
    snprintf(a->txt_key, sizeof a->txt_key, "keyid=%s", key_id);
    if (p->fingerprint && strlen(p->fingerprint) == 16)
        snprintf(a->txt_fp, sizeof a->txt_fp, "fp=%s", p->fingerprint);
    char name[SHOAL_DISCOVER_NAME_MAX + 1];
    snprintf(name, sizeof name, "%s", p->name && p->name[0] ? p->name : "shoal-worker");
    a->name = avahi_strdup(name);
    char hn[64];
    host_name(hn, sizeof hn);
    AvahiServerConfig cfg;
    base_config(&cfg);
    cfg.host_name = avahi_strdup(hn);
    cfg.publish_addresses = 0;   /* add_addresses: ours, without reverse records */
    int aerr = 0;
    if (!(a->poll = avahi_threaded_poll_new())) {
        shoal_err_set(err, -SHOAL_EIO, "mDNS: cannot create avahi's poll thread");
        goto fail;
    }
    /* the server may call back from within avahi_server_new: a is ready */
    a->server = avahi_server_new(avahi_threaded_poll_get(a->poll), &cfg, announce_server_cb,
                                 a, &aerr);
    if (!a->server) {
        shoal_err_set(err, -SHOAL_EIO, "mDNS: cannot start avahi-core's responder: %s",
                      avahi_strerror(aerr));
        goto fail;
    }
    if (avahi_threaded_poll_start(a->poll) < 0) {
        shoal_err_set(err, -SHOAL_EIO, "mDNS: cannot start avahi's poll thread");
        goto fail;
    }
    avahi_server_config_free(&cfg);
    return a;
fail:
    avahi_server_config_free(&cfg);
    if (a->server)
        avahi_server_free(a->server);
    if (a->poll)
        avahi_threaded_poll_free(a->poll);
    avahi_free(a->name);
    free(a);
    return NULL;
}

void shoal_discover_announce_stop(struct shoal_discover_announcer *a)
{
    if (!a)
        return;
    avahi_threaded_poll_stop(a->poll);
    /* freeing the server withdraws the records (goodbye packets) */
    if (a->group)
        avahi_s_entry_group_free(a->group);
    avahi_server_free(a->server);
    avahi_threaded_poll_free(a->poll);
    avahi_free(a->name);
    free(a);
}

/* ---- browsing ---- */

struct browse {
    AvahiSimplePoll *poll;
    AvahiServer *server;
    struct shoal_discover_set set;
    AvahiSServiceResolver *res[MAX_RESOLVING];   /* in flight; NULL: free slot */
    int failed;                                  /* the browser failed: avahi error */
};

static void forget(struct browse *b, AvahiSServiceResolver *r)
{
    for (int i = 0; i < MAX_RESOLVING; i++)
        if (b->res[i] == r)
            b->res[i] = NULL;
    avahi_s_service_resolver_free(r);
}

static void resolve_cb(AvahiSServiceResolver *r, AvahiIfIndex iface, AvahiProtocol proto,
                       AvahiResolverEvent event, const char *name, const char *type,
                       const char *domain, const char *host, const AvahiAddress *addr,
                       uint16_t port, AvahiStringList *txt, AvahiLookupResultFlags flags,
                       void *user)
{
    (void)iface, (void)proto, (void)type, (void)domain, (void)host, (void)flags;
    struct browse *b = user;
    if (event == AVAHI_RESOLVER_FOUND && addr && name) {
        const char *items[MAX_TXT];
        size_t lens[MAX_TXT];
        int n = 0, too_many = 0;
        for (AvahiStringList *l = txt; l; l = avahi_string_list_get_next(l)) {
            if (n == MAX_TXT) {
                too_many = 1;
                break;
            }
            items[n] = (const char *)avahi_string_list_get_text(l);
            lens[n++] = avahi_string_list_get_size(l);
        }
        char host_s[AVAHI_ADDRESS_STR_MAX];
        if (too_many || !avahi_address_snprint(host_s, sizeof host_s, addr)) {
            b->set.stats.malformed++;
        } else {
            struct shoal_discover_answer ans = {.name = name, .host = host_s, .port = port,
                                                .txt = items, .txt_len = lens, .n_txt = n};
            shoal_discover_set_add(&b->set, &ans);
        }
    }
    forget(b, r);
}

static void browse_cb(AvahiSServiceBrowser *sb, AvahiIfIndex iface, AvahiProtocol proto,
                      AvahiBrowserEvent event, const char *name, const char *type,
                      const char *domain, AvahiLookupResultFlags flags, void *user)
{
    (void)sb, (void)flags;
    struct browse *b = user;
    if (event == AVAHI_BROWSER_FAILURE) {
        b->failed = 1;
        return;
    }
    if (event != AVAHI_BROWSER_NEW)
        return;
    int slot = -1;
    for (int i = 0; i < MAX_RESOLVING && slot < 0; i++)
        if (!b->res[i])
            slot = i;
    if (slot < 0) {
        b->set.stats.dropped++;
        return;
    }
    /* the address of the family the service was seen on */
    b->res[slot] = avahi_s_service_resolver_new(b->server, iface, proto, name,
                                                type, domain, proto, 0, resolve_cb, b);
    if (!b->res[slot])
        b->set.stats.dropped++;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void browse_server_cb(AvahiServer *s, AvahiServerState state, void *user)
{
    (void)s, (void)state, (void)user;
}

int shoal_discover_browse(const struct shoal_discover_browse_params *p,
                          struct shoal_discover_worker *out, int max,
                          struct shoal_discover_stats *stats, struct shoal_err *err)
{
    struct browse b = {0};
    if (max < 1 || !(p->seconds > 0 && p->seconds <= 60))
        return shoal_err_set(err, -SHOAL_EINVAL, "mDNS browse: max %d, seconds %g: expected "
                             "max >= 1 and 0 < seconds <= 60", max, p->seconds);
    if (shoal_discover_key_id(p->key, b.set.key_id) < 0)
        return shoal_err_set(err, -SHOAL_EINVAL, "mDNS browse: needs the cluster key");
    b.set.out = out;
    b.set.max = max;
    AvahiServerConfig cfg;
    base_config(&cfg);
    /* a browser publishes nothing: no host name to defend */
    cfg.publish_addresses = 0;
    cfg.disable_publishing = 1;
    AvahiServer *server = NULL;
    AvahiSServiceBrowser *sb = NULL;
    int rc = -SHOAL_EIO, aerr = 0;
    if (!(b.poll = avahi_simple_poll_new())) {
        shoal_err_set(err, -SHOAL_EIO, "mDNS browse: cannot create avahi's poll");
        goto out;
    }
    server = avahi_server_new(avahi_simple_poll_get(b.poll), &cfg, browse_server_cb, &b,
                              &aerr);
    if (!server) {
        shoal_err_set(err, -SHOAL_EIO, "mDNS browse: cannot start avahi-core: %s",
                      avahi_strerror(aerr));
        goto out;
    }
    b.server = server;
    sb = avahi_s_service_browser_new(server, AVAHI_IF_UNSPEC, AVAHI_PROTO_UNSPEC,
                                     SHOAL_DISCOVER_SERVICE, NULL, 0, browse_cb, &b);
    if (!sb) {
        shoal_err_set(err, -SHOAL_EIO, "mDNS browse: cannot browse %s: %s",
                      SHOAL_DISCOVER_SERVICE, avahi_strerror(avahi_server_errno(server)));
        goto out;
    }
    const double end = now_s() + p->seconds;
    for (double left; !b.failed && (left = end - now_s()) > 0;) {
        int ms = (int)(left * 1000) + 1;
        if (avahi_simple_poll_iterate(b.poll, ms) != 0)
            break;
    }
    if (b.failed) {
        shoal_err_set(err, -SHOAL_EIO, "mDNS browse of %s failed: %s", SHOAL_DISCOVER_SERVICE,
                      avahi_strerror(avahi_server_errno(server)));
        goto out;
    }
    shoal_discover_set_sort(&b.set);
    if (stats)
        *stats = b.set.stats;
    rc = b.set.n;
out:
    for (int i = 0; i < MAX_RESOLVING; i++)
        if (b.res[i])
            avahi_s_service_resolver_free(b.res[i]);
    if (sb)
        avahi_s_service_browser_free(sb);
    if (server)
        avahi_server_free(server);
    if (b.poll)
        avahi_simple_poll_free(b.poll);
    avahi_server_config_free(&cfg);
    return rc;
}
