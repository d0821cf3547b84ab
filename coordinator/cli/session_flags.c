/* session_flags: the flags every generating command shares (the model,
 * the context, the expert store, the cluster, sampling and generation),
 * their usage lines and checks, and opening and closing a session the way
 * the commands report it (errors, -v, --stats). The engine (session.h)
 * takes the parsed options and prints nothing; this is where they are
 * read from argv and where what it returns is printed. Thread: main. */
#include "session_flags.h"

#include <netinet/in.h>

#include <ctype.h>
#include <errno.h>
#include <omp.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cluster.h"
#include "container.h"
#include "container_cache.h"
#include "discover.h"
#include "expert_store.h"
#include "kv.h"
#include "log.h"
#include "parse.h"
#include "quant.h"
#include "util.h"
#include "wire.h"

static int need_value(int argc, char **argv, int i)
{
    if (i + 1 >= argc) {
        shoal_cli_error("%s needs a value", argv[i]);
        return -1;
    }
    return 0;
}

/* The expert store's v2 flags (expert_store.h). Returns 1 or -1. */
static int parse_store_flag(struct shoal_session_opts *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    long long v;
    if (need_value(argc, argv, *i))
        return -1;
    const char *val = argv[++*i];
    if (!strcmp(a, "--io")) {
        enum shoal_io_kind k;
        if (shoal_io_kind_parse(val, &k)) {
            shoal_cli_error("--io expects pread, uring or auto, got '%s'", val);
            return -1;
        }
        o->io = (int)k;
    } else if (!strcmp(a, "--queue-depth")) {
        if (shoal_cli_parse_i64(a, val, 1, SHOAL_IO_QUEUE_DEPTH_MAX, &v))
            return -1;
        o->queue_depth = (int)v;
    } else if (!strcmp(a, "--prefetch")) {
        if (strcmp(val, "on") && strcmp(val, "off")) {
            shoal_cli_error("--prefetch expects on or off, got '%s'", val);
            return -1;
        }
        o->prefetch = !strcmp(val, "on");
    } else if (!strcmp(a, "--pin")) {
        if (shoal_cli_parse_size(a, val, &o->pin))
            return -1;
    } else if (!strcmp(a, "--cache-policy")) {
        enum shoal_cache_policy cp;
        if (shoal_cache_policy_parse(val, &cp)) {
            shoal_cli_error("--cache-policy expects lru or freq, got '%s'", val);
            return -1;
        }
        o->cache_policy = (int)cp;
    } else if (!strcmp(a, "--mirror")) {
        if (o->n_mirror >= SHOAL_MAX_MIRRORS) {
            shoal_cli_error("at most %d --mirror directories", SHOAL_MAX_MIRRORS);
            return -1;
        }
        o->mirrors[o->n_mirror++] = val;
    } else {   /* --mirror-weights w0,w1,... */
        int n = 0;
        const char *p = val;
        while (*p) {
            char *end;
            errno = 0;
            double w = strtod(p, &end);
            if (end == p || errno || !(w > 0) || w > 1e12 || (*end && *end != ',') ||
                n >= SHOAL_MAX_MIRRORS + 1) {
                shoal_cli_error("--mirror-weights expects up to %d positive numbers "
                                "separated by commas (the container first, then each "
                                "--mirror), got '%s'", SHOAL_MAX_MIRRORS + 1, val);
                return -1;
            }
            o->mirror_weights[n++] = w;
            p = *end ? end + 1 : end;
        }
        if (n == 0) {
            shoal_cli_error("--mirror-weights needs at least one weight");
            return -1;
        }
        o->n_mirror_weights = n;
    }
    return 1;
}

void shoal_session_usage_store(FILE *f)
{
    fprintf(f,
        "  --expert-cache SIZE  RAM budget for routed experts (default unlimited)\n"
        "  --cache-policy lru|freq  what that cache keeps: the most recently used\n"
        "                       experts, or those acquired most often (a miss enters\n"
        "                       only in place of one used less; default %s)\n"
        "  --pin SIZE           experts pinned in RAM, hottest first by routing counts\n"
        "                       kept in DIR/routing_counts.json (default 0)\n"
        "  --direct on|off      O_DIRECT / F_NOCACHE expert reads (default off: experts\n"
        "                       in the page cache are mapped from it, others read)\n"
        "  --io auto|pread|uring  I/O engine (default auto: uring when available)\n"
        "  --queue-depth N      expert reads in flight (default 8)\n"
        "  --prefetch on|off    start the next layer's reads early (default on)\n"
        "  --mirror DIR         another copy of the container (repeatable)\n"
        "  --mirror-weights W0,W1,...  read shares: the container, then each mirror\n"
        "                       (default: measured at start)\n"
        "  --stats              print expert store statistics at exit\n"
        "\nCluster (a shoal container or a GGUF file; a checkpoint is converted):\n"
        "  --workers HOST:PORT,...  static shoal-worker processes (repeatable); a\n"
        "                       checkpoint --model is converted once into\n"
        "                       $XDG_CACHE_HOME/shoal (else ~/.cache/shoal)\n"
        "  --workers auto       the workers of this --cluster-key found on the LAN by\n"
        "                       mDNS/DNS-SD (%s) within --discover-timeout\n"
        "  --discover-timeout S how long --workers auto browses (default %g)\n"
        "  --accept-workers ADDR:PORT  let workers join (shoal-worker --join)\n"
        "  --local-experts on|off  the coordinator's own store executes experts too\n"
        "                       (default on)\n"
        "  --local-fallback     when no worker of --workers is up after\n"
        "                       --connect-timeout, run on the local experts alone\n"
        "                       (a warning); without it that start fails (exit 1)\n"
        "  --cluster-key FILE   shared secret; without one every listener is loopback\n"
        "  --control ADDR:PORT|off  where `shoal status` connects (default %s)\n"
        "  --connect-timeout S  wait for static workers at start (default 5)\n"
        "  --request-timeout S  deadline of one expert request (default 30)\n"
        "  --split-rows auto|off|always  share an expert's rows among its holders when\n"
        "                       that shortens the layer step (auto, the default), never,\n"
        "                       or whenever it has 4+ rows and 2+ holders up; the same\n"
        "                       bits in every mode\n"
        "  --max-unauthenticated N  connections held in their handshake at once on\n"
        "                       --control and --accept-workers together, each at most\n"
        "                       ~64 KiB; a new one closes the least advanced (default\n"
        "                       %d, at most %d)\n"
        "  --max-unauthenticated-per-address N  of those, from one source address (an\n"
        "                       IPv6 /64 counts as one; default %d)\n",
        shoal_cache_policy_name((enum shoal_cache_policy)
                                shoal_session_opts_default().cache_policy),
        SHOAL_DISCOVER_SERVICE, SHOAL_DISCOVER_BROWSE_S_DEFAULT,
        SHOAL_CLUSTER_CONTROL_DEFAULT, SHOAL_WIRE_MAX_UNAUTH_DEFAULT,
        SHOAL_WIRE_MAX_UNAUTH_LIMIT, SHOAL_WIRE_MAX_UNAUTH_PER_ADDR_DEFAULT);
}

/* The cluster flags. Returns 1 or -1. */
static int parse_cluster_flag(struct shoal_session_opts *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    double d;
    if (need_value(argc, argv, *i))
        return -1;
    const char *val = argv[++*i];
    if (!strcmp(a, "--workers")) {
        if (o->n_workers_args >= SHOAL_MAX_WORKER_ARGS) {
            shoal_cli_error("at most %d --workers flags", SHOAL_MAX_WORKER_ARGS);
            return -1;
        }
        o->workers[o->n_workers_args++] = val;
    } else if (!strcmp(a, "--accept-workers")) {
        o->accept_workers = val;
    } else if (!strcmp(a, "--local-experts")) {
        if (strcmp(val, "on") && strcmp(val, "off")) {
            shoal_cli_error("--local-experts expects on or off, got '%s'", val);
            return -1;
        }
        o->local_experts = !strcmp(val, "on");
    } else if (!strcmp(a, "--split-rows")) {
        static const char *const modes[] = {"auto", "off", "always"};
        int m = -1;
        for (int k = 0; k < 3; k++)
            m = !strcmp(val, modes[k]) ? k : m;
        if (m < 0) {
            shoal_cli_error("--split-rows expects auto, off or always, got '%s'", val);
            return -1;
        }
        o->split_rows = m;   /* enum shoal_cluster_split's order */
    } else if (!strcmp(a, "--cluster-key")) {
        o->cluster_key = val;
    } else if (!strcmp(a, "--control")) {
        o->control = val;
    } else if (!strcmp(a, "--max-unauthenticated") ||
               !strcmp(a, "--max-unauthenticated-per-address")) {
        long long n;
        if (shoal_cli_parse_i64(a, val, 1, SHOAL_WIRE_MAX_UNAUTH_LIMIT, &n))
            return -1;
        if (!strcmp(a, "--max-unauthenticated"))
            o->max_unauth = (int)n;
        else
            o->max_unauth_per_addr = (int)n;
    } else {
        /* a browse is bounded (discover.h): a minute at most */
        const double max = strcmp(a, "--discover-timeout") ? 3600 : 60;
        if (shoal_cli_parse_f64(a, val, 0.05, max, &d))
            return -1;
        if (!strcmp(a, "--connect-timeout"))
            o->connect_timeout = d;
        else if (!strcmp(a, "--discover-timeout"))
            o->discover_timeout = d;
        else
            o->request_timeout = d;
    }
    return 1;
}

int shoal_cli_split_workers(const struct shoal_session_opts *o, char *buf, size_t cap,
                            const char **addrs, int max)
{
    size_t used = 0;
    int n = 0;
    for (int k = 0; k < o->n_workers_args; k++) {
        size_t len = strlen(o->workers[k]);
        if (used + len + 1 > cap) {
            shoal_cli_error("--workers lists are too long");
            return -1;
        }
        char *p = buf + used;
        memcpy(p, o->workers[k], len + 1);
        used += len + 1;
        /* items separated by one comma; an empty item is a typo, not nothing */
        for (char *tok = p, *next; tok; tok = next) {
            next = strchr(tok, ',');
            if (next)
                *next++ = 0;
            while (*tok == ' ')
                tok++;
            if (!*tok) {
                shoal_cli_error("--workers '%s' has an empty item, expected "
                                "HOST:PORT[,HOST:PORT...]", o->workers[k]);
                return -1;
            }
            if (n >= max) {
                shoal_cli_error("at most %d workers", max);
                return -1;
            }
            addrs[n++] = tok;
        }
    }
    if (o->n_workers_args > 0 && n == 0) {
        shoal_cli_error("--workers needs at least one HOST:PORT");
        return -1;
    }
    return n;
}

/* 1 when --workers is "auto", 0 when it is not, -1 after a usage error
 * line: auto mixed with addresses, or without --cluster-key. */
static int workers_auto(const struct shoal_session_opts *o)
{
    int n_auto = 0;
    for (int k = 0; k < o->n_workers_args; k++)
        n_auto += !strcmp(o->workers[k], "auto");
    if (n_auto == 0)
        return 0;
    if (n_auto != o->n_workers_args || n_auto > 1) {
        shoal_cli_error("--workers auto finds every worker: give it alone, not with "
                        "addresses or twice");
        return -1;
    }
    if (!o->cluster_key) {
        shoal_cli_error("--workers auto needs --cluster-key FILE: only the workers of a "
                        "keyed cluster announce themselves");
        return -1;
    }
    return 1;
}

int shoal_cli_discover(const char *key_path, double seconds,
                       struct shoal_discover_worker *out, int max, int *status)
{
    struct shoal_err err = {0};
    struct shoal_wire_key key = {0};
    *status = 1;
    if (!shoal_discover_backend()) {
        shoal_cli_error("--workers auto: this build has no mDNS (rebuild with avahi-core: "
                        "Debian's libavahi-core-dev); name the workers instead");
        return -1;
    }
    if (!key_path) {
        *status = 2;
        shoal_cli_error("--workers auto needs --cluster-key FILE: only the workers of a "
                        "keyed cluster announce themselves");
        return -1;
    }
    if (shoal_wire_key_load(key_path, &key, &err) < 0) {
        shoal_cli_error("%s", err.msg);
        return -1;
    }
    struct shoal_discover_browse_params bp = {.key = &key, .seconds = seconds};
    struct shoal_discover_stats st = {0};
    const int n = shoal_discover_browse(&bp, out, max, &st, &err);
    sodium_memzero(&key, sizeof key);
    if (n < 0) {
        shoal_cli_error("--workers auto: %s", err.msg);
        return -1;
    }
    if (n == 0) {
        shoal_cli_error("--workers auto: no shoal-worker of this cluster answered on the LAN "
                        "within %g s (%s services of other keys: %d, malformed: %d); is "
                        "shoal-worker running there with the same --cluster-key and a "
                        "non-loopback --listen?", seconds, SHOAL_DISCOVER_SERVICE,
                        st.other_key, st.malformed);
        return -1;
    }
    if (st.dropped > 0)
        fprintf(stderr, "shoal: --workers auto: kept the first %d workers; %d more answers "
                "dropped\n", n, st.dropped);
    *status = 0;
    return n;
}

int shoal_cli_workers_auto(struct shoal_session_opts *o, int *status)
{
    /* the list lives as long as the process: o->workers borrows it */
    static char list[SHOAL_CLUSTER_MAX_EXECUTORS * SHOAL_DISCOVER_ADDR_MAX];
    *status = 2;
    const int is_auto = workers_auto(o);
    if (is_auto <= 0)
        return is_auto;
    struct shoal_discover_worker found[SHOAL_CLUSTER_MAX_EXECUTORS - 1];
    const int n = shoal_cli_discover(o->cluster_key, o->discover_timeout, found,
                                     SHOAL_CLUSTER_MAX_EXECUTORS - 1, status);
    if (n < 0)
        return -1;
    size_t used = 0;
    list[0] = 0;
    for (int i = 0; i < n; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? "," : "",
                                 found[i].addr);
    fprintf(stderr, "shoal: --workers auto: found %d worker%s: %s\n", n, n > 1 ? "s" : "",
            list);
    o->workers[0] = list;
    *status = 0;
    return 0;
}

int shoal_session_check_opts(const struct shoal_session_opts *o)
{
    if (!shoal_session_is_cluster(o)) {
        if (!o->local_experts || o->local_fallback || o->cluster_key || o->control ||
            o->max_unauth || o->max_unauth_per_addr) {
            shoal_cli_error("--local-experts, --local-fallback, --cluster-key, --control and "
                            "--max-unauthenticated[-per-address] need --workers or "
                            "--accept-workers");
            return -1;
        }
        return 0;
    }
    if (o->local_fallback && !o->local_experts) {
        shoal_cli_error("--local-fallback runs the local experts, but --local-experts is "
                        "off: drop one of them");
        return -1;
    }
    const int max_unauth = o->max_unauth ? o->max_unauth : SHOAL_WIRE_MAX_UNAUTH_DEFAULT;
    if (o->max_unauth_per_addr > max_unauth) {
        shoal_cli_error("--max-unauthenticated-per-address %d exceeds --max-unauthenticated "
                        "%d (the share of one address is part of the whole)",
                        o->max_unauth_per_addr, max_unauth);
        return -1;
    }
    const int is_auto = workers_auto(o);
    if (is_auto < 0)
        return -1;
    if (o->cluster_key) {   /* before a model opens: a bad key file is a bad flag value */
        struct shoal_err err = {0};
        if (shoal_wire_key_check(o->cluster_key, &err)) {
            shoal_cli_error("--cluster-key: %s", err.msg);
            return -1;
        }
    }
    char buf[4096];
    const char *addrs[SHOAL_CLUSTER_MAX_EXECUTORS];
    int n = is_auto ? 0 : shoal_cli_split_workers(o, buf, sizeof buf, addrs,
                                                  SHOAL_CLUSTER_MAX_EXECUTORS - 1);
    if (n < 0)
        return -1;
    struct sockaddr_storage ss;
    socklen_t len;
    struct shoal_err err = {0};
    struct sockaddr_storage seen[SHOAL_CLUSTER_MAX_EXECUTORS];
    socklen_t seen_len[SHOAL_CLUSTER_MAX_EXECUTORS];
    for (int i = 0; i < n; i++) {
        if (shoal_wire_parse_addr(addrs[i], &seen[i], &seen_len[i], &err)) {
            shoal_cli_error("--workers: %s", err.msg);
            return -1;
        }
        const struct sockaddr_in *v4 = (const struct sockaddr_in *)&seen[i];
        const struct sockaddr_in6 *v6 = (const struct sockaddr_in6 *)&seen[i];
        if ((seen[i].ss_family == AF_INET && v4->sin_port == 0) ||
            (seen[i].ss_family == AF_INET6 && v6->sin6_port == 0)) {
            shoal_cli_error("--workers: '%s' has port 0, expected the port its shoal-worker "
                            "listens on", addrs[i]);
            return -1;
        }
        /* the same worker under two names would count twice */
        for (int j = 0; j < i; j++)
            if (seen_len[j] == seen_len[i] && !memcmp(&seen[j], &seen[i], seen_len[i])) {
                shoal_cli_error("--workers: '%s' and '%s' are the same worker", addrs[j],
                                addrs[i]);
                return -1;
            }
    }
    const char *listen[2] = {o->accept_workers, o->control && strcmp(o->control, "off")
                                                    ? o->control : NULL};
    const char *flag[2] = {"--accept-workers", "--control"};
    struct sockaddr_storage lss[2];
    socklen_t llen[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
        if (!listen[i])
            continue;
        if (shoal_wire_parse_addr(listen[i], &ss, &len, &err)) {
            shoal_cli_error("%s: %s", flag[i], err.msg);
            return -1;
        }
        if (!o->cluster_key && !shoal_wire_addr_is_loopback(&ss)) {
            shoal_cli_error("%s %s is not a loopback address: without --cluster-key "
                            "listeners bind to loopback only", flag[i], listen[i]);
            return -1;
        }
        lss[i] = ss;
        llen[i] = len;
    }
    /* the two listeners on one address: the second could not bind, and the
     * error blamed another coordinator */
    if (llen[0] && llen[0] == llen[1] && !memcmp(&lss[0], &lss[1], llen[0]) &&
        shoal_wire_addr_port(&lss[0]) != 0) {
        shoal_cli_error("--accept-workers %s and --control %s are the same address: give "
                        "them different ports", listen[0], listen[1]);
        return -1;
    }
    return 0;
}

int shoal_session_parse_flag(struct shoal_session_opts *o, int argc,
                             char **argv, int *i)
{
    const char *a = argv[*i];
    long long v;
    if (!strcmp(a, "--verbose") || !strcmp(a, "-v")) {
        o->verbose = 1;
        return 1;
    }
    if (!strcmp(a, "--stats")) {
        o->stats = 1;
        return 1;
    }
    if (!strcmp(a, "--local-fallback")) {
        o->local_fallback = 1;
        return 1;
    }
    if (!strcmp(a, "--workers") || !strcmp(a, "--accept-workers") ||
        !strcmp(a, "--local-experts") || !strcmp(a, "--cluster-key") ||
        !strcmp(a, "--control") || !strcmp(a, "--connect-timeout") ||
        !strcmp(a, "--request-timeout") || !strcmp(a, "--discover-timeout") ||
        !strcmp(a, "--max-unauthenticated") ||
        !strcmp(a, "--max-unauthenticated-per-address") || !strcmp(a, "--split-rows"))
        return parse_cluster_flag(o, argc, argv, i);
    if (!strcmp(a, "--io") || !strcmp(a, "--queue-depth") || !strcmp(a, "--prefetch") ||
        !strcmp(a, "--pin") || !strcmp(a, "--mirror") || !strcmp(a, "--mirror-weights") ||
        !strcmp(a, "--cache-policy"))
        return parse_store_flag(o, argc, argv, i);
    if (!strcmp(a, "--isa")) {
        /* every command starts with the best kernels of the CPU (main.c);
         * --isa runs another table: the same bits, another speed */
        enum shoal_quant_isa want;
        if (need_value(argc, argv, *i))
            return -1;
        const char *v = argv[++*i];
        if (shoal_quant_isa_parse(v, &want)) {
            shoal_cli_error("--isa expects %s, got '%s'", shoal_quant_isa_list(), v);
            return -1;
        }
        if (shoal_quant_init(want, NULL)) {
            shoal_cli_error("--isa %s: these kernels are not built in or this CPU lacks them; "
                            "the best here are '%s'", v, shoal_quant_ops_name());
            return -1;
        }
        /* the attention kernels follow: scalar with scalar, else the best */
        shoal_kv_init(want == SHOAL_QUANT_ISA_SCALAR ? SHOAL_KV_ISA_SCALAR : SHOAL_KV_ISA_AUTO,
                      NULL);
        return 1;
    }
    if (!strcmp(a, "--kv")) {
        enum shoal_dtype t;
        if (need_value(argc, argv, *i) || shoal_cli_parse_kv(a, argv[*i + 1], &t))
            return -1;
        ++*i;
        o->kv = (int)t;
        return 1;
    }
    if (!strcmp(a, "--expert-cache") || !strcmp(a, "--direct")) {
        if (need_value(argc, argv, *i))
            return -1;
        const char *val = argv[++*i];
        if (!strcmp(a, "--direct")) {
            if (strcmp(val, "on") && strcmp(val, "off")) {
                shoal_cli_error("--direct expects on or off, got '%s'", val);
                return -1;
            }
            o->direct = !strcmp(val, "on");
            return 1;
        }
        return shoal_cli_parse_size(a, val, &o->expert_cache) ? -1 : 1;
    }
    if (strcmp(a, "--model") && strcmp(a, "--ctx") && strcmp(a, "--threads") &&
        strcmp(a, "--batch"))
        return 0;
    if (need_value(argc, argv, *i))
        return -1;
    const char *val = argv[++*i];
    if (!strcmp(a, "--model")) {
        if (o->model_dir) {
            shoal_cli_error("--model '%s': the model is already '%s' (give it once, as "
                            "--model DIR or as a path)", val, o->model_dir);
            return -1;
        }
        o->model_dir = val;
    } else if (!strcmp(a, "--ctx")) {
        if (shoal_cli_parse_i64(a, val, 1, INT32_MAX, &v))
            return -1;
        o->n_ctx = v;
    } else if (!strcmp(a, "--batch")) {
        if (shoal_cli_parse_i64(a, val, 1, 4096, &v))
            return -1;
        o->n_batch = v;
    } else {
        if (shoal_cli_parse_i64(a, val, 1, 1024, &v))
            return -1;
        o->threads = v;
    }
    return 1;
}

void shoal_gen_usage(FILE *f, enum shoal_gen_usage_cmd cmd)
{
    if (cmd == SHOAL_GEN_USAGE_SERVE)
        fprintf(f,
            "  --max-tokens N       tokens a request generates when it gives no max_tokens\n"
            "                       (default: 16 for /v1/completions, as OpenAI's API; the\n"
            "                       rest of the context for /v1/chat/completions)\n");
    else
        fprintf(f, "  --max-tokens N       tokens to generate (default %lld)\n",
                (long long)shoal_gen_opts_default().max_tokens);
    fprintf(f,
        "  --greedy             argmax decoding\n"
        "  --temp T             temperature (default 0.8; 0 = greedy)\n"
        "  --top-k K            keep the K most likely tokens (default 40, 0 = off)\n"
        "  --top-p P            nucleus sampling threshold (default 0.95)\n"
        "  --min-p P            drop tokens below P x the top probability (default 0.05)\n"
        "  --repeat-penalty R   penalise recent tokens (default 1.0 = off)\n"
        "  --repeat-last-n N    window of the penalty (default 64; 0: none, -1: the whole\n"
        "                       history)\n"
        "  --presence-penalty P subtract P from the logit of a token already generated\n"
        "  --frequency-penalty F\n"
        "                       subtract F x the times it was generated (both -2..2,\n"
        "                       default 0 = off; OpenAI's, over this completion)\n");
    if (cmd == SHOAL_GEN_USAGE_SERVE)
        fprintf(f,
            "  --seed S             the seed of a request that gives none (default: a fresh\n"
            "                       seed per request)\n");
    else
        fprintf(f, "  --seed S             sampling seed (default %llu)\n",
                (unsigned long long)shoal_gen_opts_default().sampling.seed);
    fprintf(f,
        "  --stop STR           stop when STR is generated (repeatable)\n"
        "  --ignore-eos         keep generating past end-of-sequence tokens\n");
    fprintf(f,
        "  --speculate MODE     off (default), lookup, mtp or auto: draft tokens by prompt\n"
        "                       lookup (n-grams of the prompt and the output) or with the\n"
        "                       model's MTP layers, and verify them in one step; the same\n"
        "                       tokens as off, bit for bit; auto drafts (with the MTP\n"
        "                       layers when the model has them) only when the measured\n"
        "                       steps say it pays%s\n"
        "  --draft-max N        most drafted tokens a step, 1..%d (default %d; with mtp\n"
        "                       %d, one per MTP layer: later ones chain on its output)\n",
        cmd == SHOAL_GEN_USAGE_SERVE ? " (each\n                       request drafts its own)" : "",
        SHOAL_SPEC_DRAFT_MAX, SHOAL_SPEC_DRAFT_DEFAULT, SHOAL_SPEC_DRAFT_DEFAULT_MTP);
    if (cmd == SHOAL_GEN_USAGE_RUN)
        fprintf(f,
            "  --no-bos             do not add the tokenizer's BOS token\n"
            "  --logits-out F.npy   write the f32 logits of every step, [steps][vocab]\n"
            "  --draft-logits-out F.npy  write the MTP head's f32 logits for the token\n"
            "                       after each generated one, [steps][vocab]\n"
            "  --ids-out FILE       write the generated token ids, space-separated\n");
}

int shoal_gen_parse_flag(struct shoal_gen_opts *o, int argc, char **argv,
                         int *i)
{
    const char *a = argv[*i];
    long long v;
    double d;
    struct shoal_sampler_params *sp = &o->sampling;
    if (!strcmp(a, "--greedy")) {
        sp->greedy = 1;
        return 1;
    }
    if (!strcmp(a, "--ignore-eos")) {
        o->ignore_eos = 1;
        return 1;
    }
    if (!strcmp(a, "--no-bos")) {
        o->no_bos = 1;
        return 1;
    }
    static const char *valued[] = {"--max-tokens", "--temp", "--top-k", "--top-p",
                                   "--min-p", "--repeat-penalty", "--repeat-last-n",
                                   "--presence-penalty", "--frequency-penalty",
                                   "--seed", "--stop", "--logits-out", "--ids-out",
                                   "--draft-logits-out",
                                   "--speculate", "--draft-max"};
    int known = 0;
    for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++)
        if (!strcmp(a, valued[k]))
            known = 1;
    if (!known)
        return 0;
    if (need_value(argc, argv, *i))
        return -1;
    const char *val = argv[++*i];
    if (!strcmp(a, "--max-tokens")) {
        if (shoal_cli_parse_i64(a, val, 0, INT32_MAX, &v))
            return -1;
        o->max_tokens = v;
    } else if (!strcmp(a, "--temp")) {
        if (shoal_cli_parse_f64(a, val, 0, 100, &d))
            return -1;
        sp->temperature = (float)d;
    } else if (!strcmp(a, "--top-k")) {
        if (shoal_cli_parse_i64(a, val, 0, INT32_MAX, &v))
            return -1;
        sp->top_k = v;
    } else if (!strcmp(a, "--top-p")) {
        if (shoal_cli_parse_f64(a, val, 0, 1, &d))
            return -1;
        sp->top_p = (float)d;
    } else if (!strcmp(a, "--min-p")) {
        if (shoal_cli_parse_f64(a, val, 0, 1, &d))
            return -1;
        sp->min_p = (float)d;
    } else if (!strcmp(a, "--repeat-penalty")) {
        if (shoal_cli_parse_f64(a, val, 0.01, 100, &d))
            return -1;
        sp->repeat_penalty = (float)d;
    } else if (!strcmp(a, "--repeat-last-n")) {
        if (shoal_cli_parse_i64(a, val, -1, INT32_MAX, &v))
            return -1;
        sp->repeat_last_n = v;
    } else if (!strcmp(a, "--presence-penalty") || !strcmp(a, "--frequency-penalty")) {
        if (shoal_cli_parse_f64(a, val, -2, 2, &d))
            return -1;
        *(a[2] == 'p' ? &sp->presence_penalty : &sp->frequency_penalty) = (float)d;
    } else if (!strcmp(a, "--seed")) {
        if (shoal_cli_parse_i64(a, val, 0, INT64_MAX, &v))
            return -1;
        sp->seed = (uint64_t)v;
    } else if (!strcmp(a, "--stop")) {
        if (o->n_stop >= SHOAL_MAX_STOP) {
            shoal_cli_error("at most %d --stop strings", SHOAL_MAX_STOP);
            return -1;
        }
        if (!*val) {
            shoal_cli_error("--stop needs a non-empty string");
            return -1;
        }
        o->stop[o->n_stop++] = val;
    } else if (!strcmp(a, "--speculate")) {
        if (shoal_spec_mode_parse(val, &o->speculate)) {
            shoal_cli_error("--speculate: unknown mode '%s' (expected off, auto, lookup or "
                            "mtp)", val);
            return -1;
        }
    } else if (!strcmp(a, "--draft-max")) {
        if (shoal_cli_parse_i64(a, val, 1, SHOAL_SPEC_DRAFT_MAX, &v))
            return -1;
        o->draft_max = (int)v;
    } else if (!strcmp(a, "--logits-out")) {
        o->logits_out = val;
    } else if (!strcmp(a, "--draft-logits-out")) {
        o->draft_logits_out = val;
    } else {
        o->ids_out = val;
    }
    return 1;
}

/* A Hugging Face directory is loaded whole into RAM: name the expert-store
 * flags the user gave (those that differ from the defaults), which only
 * containers use, rather than dropping them silently. */
static void warn_store_flags(const struct shoal_session_opts *o, const char *dir,
                             const char *kind)
{
    const struct shoal_session_opts d = shoal_session_opts_default();
    const struct {
        int given;
        const char *flag;
    } flags[] = {
        {o->expert_cache != d.expert_cache, "--expert-cache"},
        {o->pin != d.pin, "--pin"},
        {o->cache_policy != d.cache_policy, "--cache-policy"},
        {o->n_mirror > 0, "--mirror"},
        {o->n_mirror_weights > 0, "--mirror-weights"},
        {o->direct != d.direct, "--direct"},
        {o->io != d.io, "--io"},
        {o->queue_depth != d.queue_depth, "--queue-depth"},
        {o->prefetch != d.prefetch, "--prefetch"},
    };
    char given[160] = "";
    int n = 0;
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (flags[i].given) {
            snprintf(given + strlen(given), sizeof given - strlen(given), "%s%s",
                     n++ ? ", " : "", flags[i].flag);
        }
    if (n)
        shoal_log(SHOAL_LOG_WARN, "store",
                  "%s %s only to shoal containers; '%s' is %s, so %s ignored (make a "
                  "container with: shoal convert)", given, n > 1 ? "apply" : "applies", dir,
                  kind, n > 1 ? "they are" : "it is");
}

/* Workers serve containers, so a cluster run on a Hugging Face checkpoint
 * uses the container converted from it once into the cache, the same one
 * shoal-worker --model makes from the same directory (container_cache.h).
 * *out: the container's path, owned by the caller. Returns 0 or -1 after an
 * error line. */
static int cluster_container(const char *dir, char **out)
{
    struct shoal_err err = {0};
    char cache_dir[4096];
    if (shoal_container_cache_dir(getenv("XDG_CACHE_HOME"), getenv("HOME"), cache_dir,
                                  sizeof cache_dir, &err) ||
        shoal_container_cache_path(dir, cache_dir, out, &err)) {
        shoal_cli_error("--workers/--accept-workers need a shoal container; '%s': %s",
                        dir, err.msg);
        return -1;
    }
    if (!shoal_container_is(*out)) {
        fprintf(stderr, "shoal: converting '%s' once into '%s' (the cluster serves "
                "shoal containers; later runs and shoal-worker --model '%s' reuse it)\n",
                dir, *out, dir);
        if (shoal_container_cache_fill(dir, *out, &err)) {
            shoal_cli_error("%s", err.msg);
            free(*out);
            *out = NULL;
            return -1;
        }
    }
    return 0;
}

struct shoal_session *shoal_cli_session_open(const struct shoal_session_opts *o, int *status)
{
    int dummy;
    if (!status)
        status = &dummy;
    *status = 2;
    if (shoal_session_check_opts(o))
        return NULL;
    struct shoal_session_opts found = *o;   /* --workers auto: what was found */
    if (shoal_cli_workers_auto(&found, status) < 0)
        return NULL;
    o = &found;
    *status = 2;
    const char *dir = o->model_dir ? o->model_dir : shoal_cli_default_model();
    const int gguf = shoal_model_is_gguf(dir);
    if (!gguf && shoal_cli_check_model_dir(dir, o->model_dir != NULL))
        return NULL;
    if (gguf && (o->n_mirror > 0 || o->n_mirror_weights > 0)) {
        shoal_cli_error("--mirror: '%s' is a GGUF file, whose experts are read from the file "
                        "itself; mirrors are copies of a shoal container's experts.bin", dir);
        return NULL;
    }
    char buf[4096];
    const char *addrs[SHOAL_CLUSTER_MAX_EXECUTORS];
    int n = shoal_cli_split_workers(o, buf, sizeof buf, addrs, SHOAL_CLUSTER_MAX_EXECUTORS - 1);
    if (n < 0)
        return NULL;
    char *cached = NULL;
    if (shoal_session_is_cluster(o) && !gguf && !shoal_container_is(dir) &&
        cluster_container(dir, &cached))
        return NULL;
    if (cached)
        dir = cached;
    struct shoal_err err = {0};
    const double t0 = shoal_time_s();
    *status = 1;
    struct shoal_session *s = shoal_session_open(o, dir, status, &err);
    if (!s) {
        shoal_cli_error("%s", err.msg);
        free(cached);
        return NULL;
    }
    s->cached_dir = cached;
    struct shoal_experts experts;
    if (shoal_session_is_cluster(o)) {
        if (!s->model->ct && !s->gguf_experts) {
            shoal_cli_error("--workers/--accept-workers need a shoal container; '%s' is a "
                            "Hugging Face directory (make one with: shoal convert)", dir);
            shoal_session_close(s);
            return NULL;
        }
        struct shoal_cluster_params cp = shoal_cluster_params_default();
        cp.workers = addrs;
        cp.n_workers = n;
        cp.accept_addr = o->accept_workers;
        cp.control_addr = !o->control ? SHOAL_CLUSTER_CONTROL_DEFAULT
                          : strcmp(o->control, "off") ? o->control : NULL;
        cp.control_explicit = o->control != NULL;
        cp.local_experts = o->local_experts;
        cp.local_fallback = o->local_fallback;
        cp.key_path = o->cluster_key;
        cp.connect_timeout_s = o->connect_timeout;
        cp.request_timeout_s = o->request_timeout;
        cp.local_cache_bytes = o->expert_cache;
        cp.ct = s->gguf_experts;   /* a GGUF's experts; NULL: the container's */
        cp.split_rows = (enum shoal_cluster_split)o->split_rows;
        if (o->max_unauth)
            cp.max_unauthenticated = o->max_unauth;
        cp.max_unauth_per_addr = o->max_unauth_per_addr ? o->max_unauth_per_addr
                                 : cp.max_unauthenticated < cp.max_unauth_per_addr
                                     ? cp.max_unauthenticated : cp.max_unauth_per_addr;
        s->cluster = shoal_cluster_create(s->model, &cp, &err);
        if (!s->cluster) {
            shoal_cli_error("%s", err.msg);
            shoal_session_close(s);
            return NULL;
        }
        s->cluster_destroy = shoal_cluster_destroy;
        experts = shoal_cluster_experts(s->cluster);
    }
    if (shoal_session_start(s, o, s->cluster ? &experts : NULL, status, &err)) {
        shoal_cli_error("%s", err.msg);
        shoal_session_close(s);
        return NULL;
    }
    s->stats = o->stats;
    if (!s->store)
        warn_store_flags(o, dir, "a Hugging Face directory, loaded whole into RAM");
    if (s->kv_budget_ctx_wanted)
        fprintf(stderr, "shoal: --kv-budget: context %lld tokens per sequence (of %lld) "
                "for %llu sequences\n", (long long)shoal_ctx_n_ctx(s->ctx),
                (long long)s->kv_budget_ctx_wanted,
                (unsigned long long)(o->n_seq > 0 ? o->n_seq : 1));
    if (o->verbose)
        fprintf(stderr, "shoal: loaded %s (%s, %lld layers, %lld experts, top-%lld) "
                "in %.2f s, %d threads, ctx %lld, KV %s %.1f MiB%s, %s kernels\n", dir,
                s->model->cfg.family->model_type, (long long)s->model->cfg.n_layer,
                (long long)s->model->cfg.n_expert,
                (long long)s->model->cfg.n_expert_used, shoal_time_s() - t0,
                omp_get_max_threads(), (long long)shoal_ctx_n_ctx(s->ctx),
                shoal_kv_dtype_name(shoal_ctx_kv_dtype(s->ctx)),
                (double)shoal_ctx_kv_bytes(s->ctx) / (1024.0 * 1024.0),
                o->kv >= 0 ? "" : s->model->ct ? " (the container's)" : "",
                shoal_quant_ops_name());
    return s;
}

static double pct(uint64_t a, uint64_t b)
{
    return b ? 100.0 * (double)a / (double)b : 0.0;
}

static void print_store_stats(const struct shoal_expert_store *store)
{
    struct shoal_expert_store_stats st;
    shoal_expert_store_stats_get(store, &st);
    const uint64_t used = st.pinned_hits + st.cache_hits + st.inflight_hits + st.disk_reads;
    if (used == 0 && st.bytes_read == 0 && st.prefetch_reads == 0) {
        /* nothing to show (every expert ran on a worker): one line, not five of zeros */
        fprintf(stderr, "shoal: experts: the local store acquired no experts and read "
                "nothing\n");
        return;
    }
    fprintf(stderr, "shoal: experts: %llu acquired: pinned %llu (%.1f%%), cache %llu "
            "(%.1f%%), in-flight prefetch %llu (%.1f%%), disk %llu (%.1f%%, %llu staged, "
            "%llu of them read ahead)\n",
            (unsigned long long)used, (unsigned long long)st.pinned_hits,
            pct(st.pinned_hits, used), (unsigned long long)st.cache_hits,
            pct(st.cache_hits, used), (unsigned long long)st.inflight_hits,
            pct(st.inflight_hits, used), (unsigned long long)st.disk_reads,
            pct(st.disk_reads, used), (unsigned long long)st.staged_reads,
            (unsigned long long)st.read_ahead);
    fprintf(stderr, "shoal: experts: io %s, queue depth %d: %.1f MB read at %.1f MB/s; "
            "stalled %.2f ms/token over %llu tokens; %llu experts mapped from the page "
            "cache\n", st.io_engine, st.queue_depth,
            (double)st.bytes_read / 1e6, st.read_busy_seconds > 0 ?
            (double)st.bytes_read / 1e6 / st.read_busy_seconds : 0.0,
            st.tokens ? 1e3 * st.stall_seconds / (double)st.tokens : 0.0,
            (unsigned long long)st.tokens, (unsigned long long)st.mapped_reads);
    for (int i = 0; i < st.n_source; i++)
        fprintf(stderr, "shoal: experts: source %d %s: weight %.1f, %llu reads, %.1f MB at "
                "%.1f MB/s, %llu errors%s\n", i, st.source[i].path, st.source[i].weight,
                (unsigned long long)st.source[i].reads,
                (double)st.source[i].bytes_read / 1e6, st.source[i].busy_seconds > 0 ?
                (double)st.source[i].bytes_read / 1e6 / st.source[i].busy_seconds : 0.0,
                (unsigned long long)st.source[i].errors,
                st.source[i].direct ? ", direct" : "");
    fprintf(stderr, "shoal: experts: prefetch: %llu reads, precision %.1f%% (%llu used), "
            "recall %.1f%% (%llu of %llu used experts hinted), %llu into staging, %llu "
            "dropped, %llu evicted unused (%llu reads cancelled), %llu hints skipped "
            "(back-off)\n",
            (unsigned long long)st.prefetch_reads,
            pct(st.prefetch_used, st.prefetch_reads), (unsigned long long)st.prefetch_used,
            pct(st.used_hinted, st.used_after_hint), (unsigned long long)st.used_hinted,
            (unsigned long long)st.used_after_hint, (unsigned long long)st.prefetch_staged,
            (unsigned long long)st.prefetch_dropped,
            (unsigned long long)st.prefetch_evicted, (unsigned long long)st.reads_cancelled,
            (unsigned long long)st.hints_backed_off);
    fprintf(stderr, "shoal: experts: memory: pinned %.1f MB (%llu experts), cache %.1f MB "
            "(%s: %llu experts, %llu evictions, %llu not admitted), staging %.1f MB, peak "
            "%.1f MB; counts %s\n",
            (double)st.pinned_bytes / 1e6, (unsigned long long)st.pinned_experts,
            (double)st.cached_bytes / 1e6, st.cache_policy,
            (unsigned long long)st.cached_experts, (unsigned long long)st.evictions,
            (unsigned long long)st.not_admitted, (double)st.staging_bytes / 1e6,
            (double)st.peak_expert_bytes / 1e6, st.counts_path ? st.counts_path : "not kept");
}

void shoal_cli_session_close(struct shoal_session *s)
{
    if (!s)
        return;
    if (s->stats && s->model && s->model->store)
        print_store_stats(s->model->store);
    /* the times cover every token evaluated since the start (all of a
     * chat's turns), not just those the KV cache holds now */
    const struct shoal_ctx_timings *t = s->ctx ? shoal_ctx_timings(s->ctx) : NULL;
    if (s->stats && t && t->tokens > 0) {
        const double per = 1e3 / (double)t->tokens;
        fprintf(stderr, "shoal: time per token over %lld tokens evaluated: attention %.3f ms, "
                "routing %.3f ms, experts %.3f ms (routed %.3f ms, of it network %.3f ms), "
                "combine %.3f ms, head %.3f ms\n", (long long)t->tokens, t->attention * per,
                t->routing * per, t->experts * per, t->expert_wait * per, t->network * per,
                t->combine * per, t->head * per);
    }
    if (s->stats && s->cluster)
        shoal_cluster_print_stats(s->cluster);
    shoal_session_close(s);
}

int shoal_cli_tokenize(struct shoal_session *s, const char *text, const char *hint,
                       int add_bos, int32_t **ids, size_t *n_ids)
{
    struct shoal_err err = {0};
    if (shoal_session_tokenize(s, text, add_bos, ids, n_ids, &err)) {
        shoal_cli_error("%s%s%s", err.msg, hint ? "; " : "", hint ? hint : "");
        return -1;
    }
    return 0;
}

int shoal_cli_parse_id_list(const char *s, int32_t **ids, size_t *n)
{
    struct shoal_err err = {0};
    if (shoal_parse_id_list(s, ids, n, &err)) {
        shoal_cli_error("%s", err.msg);
        return -1;
    }
    return 0;
}
