/* shoal status: ask a running coordinator (its control port) for the
 * cluster's state and print it as a table or JSON (DESIGN §5
 * observability). Connects as an OBSERVER with wire.h's blocking client. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "cluster.h"
#include "config.h"
#include "discover.h"
#include "session_flags.h"
#include "wire.h"

static volatile sig_atomic_t g_stop;

static void on_sigint(int sig)
{
    (void)sig;
    g_stop = 1;
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: shoal status [--control ADDR:PORT] [--json] [--watch [SECONDS]]\n"
        "                    [--cluster-key FILE] [--timeout SECONDS]\n"
        "       shoal status --workers auto --cluster-key FILE [--discover-timeout S]\n"
        "\n"
        "  --control ADDR:PORT  the coordinator's control port, the address its own\n"
        "                       --control listens on (default %s)\n"
        "  --json               one JSON object per query instead of the table\n"
        "  --watch [SECONDS]    refresh every SECONDS (default 2) until Ctrl-C\n"
        "  --cluster-key FILE   the cluster's key, when the coordinator has one\n"
        "  --timeout SECONDS    connect and reply deadline (default 5)\n"
        "  --workers auto       instead of asking a coordinator, list the workers of\n"
        "                       this --cluster-key found on the LAN (mDNS/DNS-SD\n"
        "                       %s), one line each: address, name, model\n"
        "                       fingerprint; none found: exit 1\n"
        "  --discover-timeout S how long --workers auto browses (default %g)\n",
        SHOAL_CLUSTER_CONTROL_DEFAULT, SHOAL_DISCOVER_SERVICE,
        SHOAL_DISCOVER_BROWSE_S_DEFAULT);
}

static double fin(double v)
{
    return isfinite(v) ? v : 0.0;
}

static const char *str_or(const char *s, const char *dflt)
{
    return s && s[0] ? s : dflt;
}

static void fmt_bytes(char *buf, size_t n, uint64_t b)
{
    if (b == UINT64_MAX)
        snprintf(buf, n, "unlimited");
    else if (b >= (1ull << 30))
        snprintf(buf, n, "%.1fG", (double)b / (double)(1ull << 30));
    else if (b >= (1ull << 20))
        snprintf(buf, n, "%.1fM", (double)b / (double)(1ull << 20));
    else if (b >= 1024)
        snprintf(buf, n, "%.1fK", (double)b / 1024.0);
    else
        snprintf(buf, n, "%" PRIu64, b);
}

static void print_table(const Shoal__ClusterStatus *cs, FILE *out)
{
    /* two windows: the tokens of the whole session, the rate of its last
     * decode steps (tokens per second of engine time, batches included) */
    fprintf(out, "cluster %s  uptime %.0f s  %" PRIu64 " tokens evaluated  decode %.2f tok/s "
            "(last 32 steps)\n",
            str_or(cs->fingerprint, "?"), fin(cs->uptime_seconds), cs->tokens,
            fin(cs->tok_per_s));
    fprintf(out, "%-22s %-8s %9s %19s %6s %9s %8s %5s %9s %7s %9s\n", "executor", "state",
            "experts", "cache used/limit", "hit%", "disk MB/s", "rtt ms", "queue",
            "requests", "errors", "last seen");
    for (size_t i = 0; i < cs->n_executors; i++) {
        const Shoal__ExecutorStatus *e = cs->executors[i];
        char held[32], used[16], lim[16], cache[40], rtt[16], seen[16];
        snprintf(held, sizeof held, "%u/%u", e->experts_held, e->experts_total);
        fmt_bytes(used, sizeof used, e->cache_used);
        fmt_bytes(lim, sizeof lim, e->cache_limit);
        snprintf(cache, sizeof cache, "%s/%s", used, lim);
        int local = !strcmp(str_or(e->address, ""), "local");
        if (local)
            snprintf(rtt, sizeof rtt, "-");
        else
            snprintf(rtt, sizeof rtt, "%.2f", fin(e->rtt_ms));
        if (local || e->last_seen_seconds < 0)
            snprintf(seen, sizeof seen, "-");
        else
            snprintf(seen, sizeof seen, "%.1f s", fin(e->last_seen_seconds));
        fprintf(out, "%-22s %-8s %9s %19s %6.1f %9.1f %8s %5u %9" PRIu64 " %7" PRIu64 " %9s\n",
                str_or(e->address, "?"), str_or(e->state, "?"), held, cache,
                100.0 * fin(e->hit_rate), fin(e->disk_mbps), rtt, e->queue_depth,
                e->requests, e->errors, seen);
    }
    for (size_t i = 0; i < cs->n_executors; i++) {
        const Shoal__ExecutorStatus *e = cs->executors[i];
        if (e->last_error && e->last_error[0] && strcmp(str_or(e->state, ""), "up"))
            fprintf(out, "  %s: %s (%" PRIu64 " reconnects)\n", str_or(e->address, "?"),
                    e->last_error, e->reconnects);
    }
    fprintf(out, "per token: attention %.3f ms, routing %.3f ms, expert wait %.3f ms "
            "(network %.3f ms), combine %.3f ms, other %.3f ms\n",
            1e3 * fin(cs->attention_s), 1e3 * fin(cs->routing_s),
            1e3 * fin(cs->expert_wait_s), 1e3 * fin(cs->network_s), 1e3 * fin(cs->combine_s),
            1e3 * fin(cs->other_s));
    fprintf(out, "wire: %.2f MB sent, %.2f MB received\n",
            (double)cs->wire_bytes_sent / 1e6, (double)cs->wire_bytes_received / 1e6);
    fflush(out);
}

static void print_json(const Shoal__ClusterStatus *cs, FILE *out)
{
    json_t *root = json_object();
    json_object_set_new(root, "fingerprint", json_string(str_or(cs->fingerprint, "")));
    json_object_set_new(root, "uptime_s", json_real(fin(cs->uptime_seconds)));
    json_object_set_new(root, "tokens", json_integer((json_int_t)cs->tokens));
    json_object_set_new(root, "tok_per_s", json_real(fin(cs->tok_per_s)));
    json_t *pt = json_object();
    json_object_set_new(pt, "attention", json_real(fin(cs->attention_s)));
    json_object_set_new(pt, "routing", json_real(fin(cs->routing_s)));
    json_object_set_new(pt, "expert_wait", json_real(fin(cs->expert_wait_s)));
    json_object_set_new(pt, "network", json_real(fin(cs->network_s)));
    json_object_set_new(pt, "combine", json_real(fin(cs->combine_s)));
    json_object_set_new(pt, "other", json_real(fin(cs->other_s)));
    json_object_set_new(root, "seconds_per_token", pt);
    json_object_set_new(root, "wire_bytes_sent", json_integer((json_int_t)cs->wire_bytes_sent));
    json_object_set_new(root, "wire_bytes_received",
                        json_integer((json_int_t)cs->wire_bytes_received));
    json_t *arr = json_array();
    for (size_t i = 0; i < cs->n_executors; i++) {
        const Shoal__ExecutorStatus *e = cs->executors[i];
        json_t *o = json_object();
        json_object_set_new(o, "address", json_string(str_or(e->address, "")));
        json_object_set_new(o, "state", json_string(str_or(e->state, "")));
        json_object_set_new(o, "experts_held", json_integer(e->experts_held));
        json_object_set_new(o, "experts_total", json_integer(e->experts_total));
        json_object_set_new(o, "cache_used", json_integer((json_int_t)e->cache_used));
        json_object_set_new(o, "cache_limit", e->cache_limit == UINT64_MAX
                                                  ? json_null()
                                                  : json_integer((json_int_t)e->cache_limit));
        json_object_set_new(o, "hit_rate", json_real(fin(e->hit_rate)));
        json_object_set_new(o, "disk_mbps", json_real(fin(e->disk_mbps)));
        json_object_set_new(o, "rtt_ms", json_real(fin(e->rtt_ms)));
        json_object_set_new(o, "queue_depth", json_integer(e->queue_depth));
        json_object_set_new(o, "requests", json_integer((json_int_t)e->requests));
        json_object_set_new(o, "errors", json_integer((json_int_t)e->errors));
        json_object_set_new(o, "last_seen_s", e->last_seen_seconds < 0
                                                  ? json_null()
                                                  : json_real(fin(e->last_seen_seconds)));
        json_object_set_new(o, "reconnects", json_integer((json_int_t)e->reconnects));
        json_object_set_new(o, "last_error", json_string(str_or(e->last_error, "")));
        json_array_append_new(arr, o);
    }
    json_object_set_new(root, "executors", arr);
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (text) {
        fprintf(out, "%s\n", text);
        free(text);
    }
    json_decref(root);
    fflush(out);
}

/* One StatusRequest; returns the ClusterStatus frame or NULL with err. */
static Shoal__Frame *query(struct shoal_wire_client *c, uint64_t id, int timeout_ms,
                           struct shoal_err *err)
{
    Shoal__Frame f = SHOAL__FRAME__INIT;
    Shoal__StatusRequest sr = SHOAL__STATUS_REQUEST__INIT;
    sr.id = id;
    f.msg_case = SHOAL__FRAME__MSG_STATUS_REQUEST;
    f.status_request = &sr;
    if (shoal_wire_client_send(c, &f, err) < 0)
        return NULL;
    for (;;) {
        Shoal__Frame *r = shoal_wire_client_recv(c, timeout_ms, err);
        if (!r)
            return NULL;
        if (r->msg_case == SHOAL__FRAME__MSG_CLUSTER && r->cluster->id == id) {
            /* validate what the table reads */
            for (size_t i = 0; i < r->cluster->n_executors; i++)
                if (!r->cluster->executors[i]) {
                    shoal_wire_frame_free(r);
                    shoal_err_set(err, SHOAL_EFORMAT, "malformed ClusterStatus");
                    return NULL;
                }
            return r;
        }
        if (r->msg_case == SHOAL__FRAME__MSG_ERROR) {
            shoal_err_set(err, SHOAL_EIO, "the coordinator answered: %s",
                          str_or(r->error->message, "an error"));
            shoal_wire_frame_free(r);
            return NULL;
        }
        shoal_wire_frame_free(r);   /* heartbeats and stale replies */
    }
}

/* shoal status --workers auto: the workers of key_path's cluster on the
 * LAN, one line each (or a JSON array). Returns the exit status. */
static int list_workers(const char *workers, const char *key_path, double seconds, int json)
{
    if (strcmp(workers, "auto")) {
        shoal_cli_error("status: --workers expects auto (the workers found on the LAN), "
                        "got '%s'; a coordinator's workers: shoal status --control ADDR:PORT",
                        workers);
        return 2;
    }
    struct shoal_discover_worker found[SHOAL_CLUSTER_MAX_EXECUTORS - 1];
    int status = 1;
    const int n = shoal_cli_discover(key_path, seconds, found,
                                     SHOAL_CLUSTER_MAX_EXECUTORS - 1, &status);
    if (n < 0)
        return status;
    if (json) {
        json_t *arr = json_array();
        for (int i = 0; i < n; i++)
            json_array_append_new(arr, json_pack("{s:s,s:s,s:s?}", "address", found[i].addr,
                                                 "name", found[i].name, "fingerprint",
                                                 found[i].fingerprint[0]
                                                     ? found[i].fingerprint : NULL));
        json_dumpf(arr, stdout, JSON_COMPACT);
        fputc('\n', stdout);
        json_decref(arr);
        return 0;
    }
    for (int i = 0; i < n; i++)
        printf("%-24s name %s  fingerprint %s\n", found[i].addr, found[i].name,
               found[i].fingerprint[0] ? found[i].fingerprint : "?");
    return 0;
}

int shoal_cmd_status(int argc, char **argv)
{
    const char *addr = SHOAL_CLUSTER_CONTROL_DEFAULT, *key_path = NULL;
    const char *workers = NULL;
    int json = 0, watch = 0;
    double every = 2.0, timeout = 5.0, discover = SHOAL_DISCOVER_BROWSE_S_DEFAULT;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--watch")) {
            watch = 1;
            if (i + 1 < argc && argv[i + 1][0] != '-') {
                if (shoal_cli_parse_f64(a, argv[++i], 0.1, 3600, &every))
                    return 2;
            }
        } else if (!strcmp(a, "--coordinator")) {
            /* one name for one address: run, chat and serve listen on --control */
            shoal_cli_error("status: --coordinator is now --control ADDR:PORT (the address "
                            "given to run/chat/serve --control)");
            return 2;
        } else if (!strcmp(a, "--control") || !strcmp(a, "--cluster-key") ||
                   !strcmp(a, "--timeout") || !strcmp(a, "--workers") ||
                   !strcmp(a, "--discover-timeout")) {
            if (i + 1 >= argc) {
                shoal_cli_error("%s needs a value", a);
                return 2;
            }
            const char *v = argv[++i];
            if (!strcmp(a, "--control"))
                addr = v;
            else if (!strcmp(a, "--cluster-key"))
                key_path = v;
            else if (!strcmp(a, "--workers"))
                workers = v;
            else if (!strcmp(a, "--discover-timeout")) {
                if (shoal_cli_parse_f64(a, v, 0.05, 60, &discover))
                    return 2;
            } else if (shoal_cli_parse_f64(a, v, 0.1, 3600, &timeout))
                return 2;
        } else {
            shoal_cli_error("status: unknown option '%s' (see 'shoal status --help')", a);
            return 2;
        }
    }
    if (workers)
        return list_workers(workers, key_path, discover, json);
    struct shoal_err err = {0};
    {   /* no HOST:PORT shape is a usage error (a name that does not resolve is
         * the connect's error, exit 1: DNS may be down for a while) */
        const char *colon = strrchr(addr, ':');
        char *end = NULL;
        const long port = colon ? strtol(colon + 1, &end, 10) : 0;
        if (!colon || colon == addr || !colon[1] || *end || port < 1 || port > 65535) {
            shoal_cli_error("status: --control '%s': expected HOST:PORT (e.g. "
                            "127.0.0.1:7077, [::1]:7077)", addr);
            return 2;
        }
    }
    struct shoal_wire_key key = {0};
    if (key_path && shoal_wire_key_load(key_path, &key, &err) < 0) {
        shoal_cli_error("%s", err.msg);
        return 1;
    }
    char name[64];
    snprintf(name, sizeof name, "shoal status (pid %d)", (int)getpid());
    Shoal__PeerInfo info = SHOAL__PEER_INFO__INIT;
    info.name = name;
    info.software = (char *)"shoal " SHOAL_VERSION;
    info.max_frame = SHOAL_WIRE_MAX_FRAME_DEFAULT;
    const int timeout_ms = (int)(timeout * 1000);
    struct shoal_wire_client c;
    if (shoal_wire_client_connect(&c, addr, SHOAL__ROLE__ROLE_OBSERVER, &key, &info, NULL,
                                  timeout_ms, &err) < 0) {
        /* the wire's message may start with the address already */
        const char *why = err.msg;
        size_t al = strlen(addr);
        if (!strncmp(why, addr, al) && !strncmp(why + al, ": ", 2))
            why += al + 2;
        shoal_cli_error("cannot reach a coordinator at %s: %s (is 'shoal run', 'chat' "
                        "or 'serve' running with --workers or --accept-workers? its --control "
                        "port is %s unless set; give the same --control here)", addr, why,
                        SHOAL_CLUSTER_CONTROL_DEFAULT);
        return 1;
    }
    if (c.hs.peer_role != SHOAL__ROLE__ROLE_COORDINATOR) {
        shoal_cli_error("%s is a shoal %s, not a coordinator: give --control the "
                        "address of its --control port (default 127.0.0.1:7077)", addr,
                        shoal_wire_role_name(c.hs.peer_role));
        shoal_wire_client_close(&c);
        return 1;
    }
    if (watch) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_sigint;
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
    }
    int rc = 0, tty = isatty(STDOUT_FILENO);
    for (uint64_t id = 1;; id++) {
        Shoal__Frame *r = query(&c, id, timeout_ms, &err);
        if (!r) {
            if (!g_stop) {
                shoal_cli_error("coordinator %s: %s", addr, err.msg);
                rc = 1;
            }
            break;
        }
        if (watch && tty && !json)
            fputs("\033[H\033[2J", stdout);
        if (json)
            print_json(r->cluster, stdout);
        else
            print_table(r->cluster, stdout);
        shoal_wire_frame_free(r);
        if (!watch)
            break;
        /* sleep in short steps so Ctrl-C ends at once */
        for (double left = every; left > 0 && !g_stop; left -= 0.1) {
            struct timespec ts = {0, 100000000L};
            nanosleep(&ts, NULL);
        }
        if (g_stop)
            break;
        if (!json && !tty)
            fputc('\n', stdout);
    }
    shoal_wire_client_close(&c);
    return rc;
}
