/* discover: finding the workers of a keyed cluster on a LAN with mDNS /
 * DNS-SD (docs/PROTOCOL.md "Discovery"). A shoal-worker that has a cluster
 * key announces a `_shoal._tcp` service: its instance name, its port, and a
 * TXT record
 *
 *   v=1             the TXT layout's version
 *   keyid=HEX16     the key id: the first 8 bytes of HMAC-SHA-256(key,
 *                   "shoal discovery key id v1") in lower-case hex; it
 *                   names the cluster without revealing the key
 *   fp=HEX16        the model fingerprint the worker serves (optional)
 *
 * and a coordinator browses for a bounded time, keeping the services whose
 * keyid is its own. Discovery is only a hint: the TCP handshake still
 * proves the key and checks the fingerprint of every worker it dials.
 *
 * Backends: Avahi's embeddable avahi-core on Linux (no daemon, so it works
 * in network namespaces and on machines without avahi-daemon); a build
 * without it (HAVE_AVAHI 0) has discover_none.c, whose start and browse
 * return -SHOAL_EUNSUPPORTED. macOS's dns_sd.h (DNSServiceRegister /
 * DNSServiceBrowse) is the intended macOS backend; it is not written yet.
 *
 * What a hostile LAN can cost: every string taken from an answer is checked
 * (length, characters) before use, the number of services resolved at once
 * and the number kept are capped, and avahi-core's record cache is bounded
 * per interface; an answer that fails a check is counted and dropped.
 *
 * Threads: the announcer runs its own thread (created with the caller's
 * signal mask); a browse runs on the calling thread. Thread: any, below.
 */
#ifndef SHOAL_DISCOVER_H
#define SHOAL_DISCOVER_H

#include <stddef.h>

#include "err.h"
#include "wire.h"

#define SHOAL_DISCOVER_SERVICE "_shoal._tcp"
#define SHOAL_DISCOVER_KEY_ID_HEX 16          /* hex digits of a key id */
#define SHOAL_DISCOVER_BROWSE_S_DEFAULT 2.0   /* how long --workers auto browses */
#define SHOAL_DISCOVER_NAME_MAX 63            /* DNS-SD instance name, bytes */
#define SHOAL_DISCOVER_ADDR_MAX 64            /* "HOST:PORT", bytes with the NUL */

/* One worker found by a browse (plain data). */
struct shoal_discover_worker {
    char addr[SHOAL_DISCOVER_ADDR_MAX];       /* numeric "A.B.C.D:PORT" or "[V6]:PORT" */
    char name[SHOAL_DISCOVER_NAME_MAX + 1];   /* instance name, printable ASCII
                                               * (other bytes shown as '?') */
    char fingerprint[17];                     /* its TXT fp, 16 hex; "" when absent */
};

/* The key id of a cluster key into out (SHOAL_DISCOVER_KEY_ID_HEX hex digits
 * and a NUL). Returns 0, -SHOAL_EINVAL when the key is not set (an unkeyed
 * worker never announces). Thread: any. */
int shoal_discover_key_id(const struct shoal_wire_key *key,
                          char out[SHOAL_DISCOVER_KEY_ID_HEX + 1]);

/* The backend's name ("avahi-core"), or NULL when this build has no mDNS. */
const char *shoal_discover_backend(void);

/* ---- announcing (shoal-worker) ---- */

struct shoal_discover_announce_params {
    const char *name;             /* instance name, borrowed; cut to 63 bytes */
    const char *listen;           /* the bound "ADDR:PORT" (a wildcard address:
                                   * every interface; else the interface that has
                                   * it), borrowed */
    const struct shoal_wire_key *key;   /* borrowed, must be set */
    const char *fingerprint;      /* 16 hex or NULL, borrowed */
};

struct shoal_discover_announcer;

/* Start announcing the worker on the LAN (a thread of its own; copies what
 * it needs from p). A name taken by another service is replaced by
 * avahi's alternative ("name #2"), and so is the mDNS host name, which is
 * "shoal-<hostname>-<random hex>". Returns the announcer (owned by the caller) or
 * NULL with err set: -SHOAL_EINVAL (no key, a bad address, a loopback
 * address: nothing on the LAN could reach it), -SHOAL_EUNSUPPORTED (a build
 * without mDNS), -SHOAL_EIO (the backend failed, with its message).
 * Thread: any (call it with the signals the process handles blocked). */
struct shoal_discover_announcer *
shoal_discover_announce_start(const struct shoal_discover_announce_params *p,
                              struct shoal_err *err);

/* Withdraw the service and stop the thread. NULL is a no-op. Thread: any,
 * not the announcer's. */
void shoal_discover_announce_stop(struct shoal_discover_announcer *a);

/* ---- browsing (coordinator, shoal status) ---- */

struct shoal_discover_browse_params {
    const struct shoal_wire_key *key;   /* borrowed, must be set */
    double seconds;                     /* how long to browse, (0, 60] */
};

/* What a browse saw besides the workers it kept. */
struct shoal_discover_stats {
    int other_key;      /* services of another cluster (their keyid differs) */
    int malformed;      /* bad TXT, name or address, or no keyid */
    int dropped;        /* beyond the caps (resolves in flight or max) */
};

/* Browse for `_shoal._tcp` services for p->seconds and keep those whose
 * keyid is p->key's, one per instance (IPv4 preferred, link-local IPv6
 * skipped), sorted by address.
 *   out    [max] written: out[0..n); max >= 1 (e.g.
 *          SHOAL_CLUSTER_MAX_EXECUTORS - 1)
 *   stats  may be NULL; written on success
 * Returns n >= 0 (0: none found), or a negative status with err set:
 * -SHOAL_EINVAL (no key, seconds or max out of range), -SHOAL_EUNSUPPORTED
 * (no mDNS in this build), -SHOAL_EIO (the backend failed). Blocks for
 * p->seconds. Thread: any. */
int shoal_discover_browse(const struct shoal_discover_browse_params *p,
                          struct shoal_discover_worker *out, int max,
                          struct shoal_discover_stats *stats, struct shoal_err *err);

/* ---- the checks of one answer (used by the backends; for tests) ---- */

/* A browse's results while it runs: out [max] and its count. */
struct shoal_discover_set {
    struct shoal_discover_worker *out;  /* [max], borrowed */
    int n, max;
    char key_id[SHOAL_DISCOVER_KEY_ID_HEX + 1];
    struct shoal_discover_stats stats;
};

/* One resolved answer, as raw as the wire gave it. */
struct shoal_discover_answer {
    const char *name;            /* instance name, NUL-terminated, borrowed */
    const char *host;            /* numeric address without brackets, borrowed */
    int port;                    /* 1..65535 */
    const char *const *txt;      /* [n_txt] TXT strings "k=v", borrowed */
    const size_t *txt_len;       /* [n_txt] their lengths in bytes (may hold NULs) */
    int n_txt;
};

/* Check one answer and add it to set when it is of set's cluster: every
 * TXT string at most 255 bytes, v=1, keyid exactly 16 lower-case hex and
 * equal to set->key_id, fp absent or 16 hex, the port in range, the host a
 * numeric IPv4 or non-link-local IPv6 address. An instance already in the
 * set keeps its entry, unless that is IPv6 and this one is IPv4. Returns 1
 * (kept), 0 (counted in set->stats: another key, malformed, or the set is
 * full). Allocates nothing. Thread: any. */
int shoal_discover_set_add(struct shoal_discover_set *set,
                           const struct shoal_discover_answer *a);

/* Sort set->out by address (the order a browse returns). Thread: any. */
void shoal_discover_set_sort(struct shoal_discover_set *set);

#endif
