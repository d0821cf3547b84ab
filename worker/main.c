/* shoal-worker: an expert worker (DESIGN §5). Opens a container (or a
 * shard of one), builds an expert store over it on a compute thread, and
 * serves batch-unions of expert FFNs to a coordinator over the wire
 * protocol (docs/PROTOCOL.md): on its --listen address, and by dialling
 * --join. Exit status: 0 after SIGINT/SIGTERM, 1 on a runtime error at
 * start, 2 on a usage error.
 *
 * Signals: SIGINT and SIGTERM are blocked from the first line of main, so
 * every thread the worker starts (compute, OpenMP, I/O) inherits the
 * block; the loop thread unblocks them once the server's handlers are in
 * place and before it says it serves, and blocks them again when the
 * server returns. A signal at any moment thus either drains the worker
 * (the first), ends the drain (the second), or arrives while it is
 * already exiting and is ignored: never the default action, so the exit
 * status is 0. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "container.h"
#include "container_cache.h"
#include "discover.h"
#include "exec.h"
#include "hot_replicas.h"
#include "log.h"
#include "omp_env.h"
#include "parse.h"
#include "placement.h"
#include "quant.h"
#include "server.h"
#include "util.h"
#include "wire.h"

#define MAX_SHARD_WORKERS 4096

struct opts {
    const char *model;
    const char *listen;
    const char *join;
    const char *key_file;
    const char *name;
    int shard_index, shard_count, shard_replicas;   /* count 0: no --shard */
    double shard_weights[MAX_SHARD_WORKERS];        /* --shard-weights, n_shard_weights */
    int n_shard_weights;
    int hot_n, hot_extra;            /* --hot-replicas H[:X]; hot_n 0: none */
    const char *routing;             /* --routing FILE: the counts that rank them */
    struct shoal_expert_store_params store;
    int threads;
    int max_coordinators;            /* 0: the server's default */
    int max_unauth;                  /* --max-unauthenticated */
    int max_unauth_per_addr;         /* --max-unauthenticated-per-address; 0: the
                                      * default, at most max_unauth */
    int stats;                       /* log the store's counters at exit */
    int announce;                    /* --announce: mDNS with a key (default on) */
    const char *test_nan;            /* TEST ONLY: SHOAL_TEST_NAN_EXPERT, or NULL */
    int64_t test_nan_layer, test_nan_expert;   /* -1: any */
    enum shoal_log_level log_level;
};

static void die_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void error_line(const char *fmt, va_list ap)
{
    char buf[1024];
    vsnprintf(buf, sizeof buf, fmt, ap);
    fprintf(stderr, "shoal-worker: %s\n", buf);
}

static void fail_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail_line(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    error_line(fmt, ap);
    va_end(ap);
}

/* A usage error: one line on stderr, exit 2. */
static void die_usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    error_line(fmt, ap);
    va_end(ap);
    exit(2);
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: shoal-worker --model DIR|FILE.gguf [options]\n\n"
        "Serves the routed experts of a shoal container (or a shard made by 'shoal shard')\n"
        "to a coordinator: each MoE layer's batch-union runs here with the same kernels.\n\n"
        "  --model DIR          the container or shard (make one with 'shoal convert');\n"
        "                       a Hugging Face checkpoint directory is converted once\n"
        "                       into $XDG_CACHE_HOME/shoal (else ~/.cache/shoal); a GGUF\n"
        "                       file (or any file of a split set) is served as it is,\n"
        "                       its experts read from the file\n"
        "  --shard I/N[:R]      serve only worker I's share (0-based) of N workers,\n"
        "                       R holders per expert (default 1), by weighted rendezvous\n"
        "  --shard-weights W0,W1,...  with --shard: one positive weight per worker (its\n"
        "                       disk's MB/s, say): worker I holds about W_I / sum of the\n"
        "                       experts, as 'shoal shard --weights' (default equal)\n"
        "  --hot-replicas H[:X] with --shard: the H experts of each layer with the most\n"
        "                       routings get X more holders (default 1), the same ones on\n"
        "                       every worker given the same counts\n"
        "  --routing FILE       the counts that rank them: a routing_counts.json or a\n"
        "                       synth.json (default: the container's synth.json, else its\n"
        "                       routing_counts.json)\n"
        "  --listen ADDR:PORT   where to accept the coordinator (default 127.0.0.1:7070;\n"
        "                       port 0 picks a free one). Without --cluster-key only a\n"
        "                       loopback address is allowed\n"
        "  --join HOST:PORT     also dial this coordinator (--accept-workers there) and\n"
        "                       re-dial with backoff whenever the connection drops\n"
        "  --cluster-key FILE   shared secret; every peer must prove it holds it\n"
        "  --name NAME          how this worker names itself to peers (default host:port)\n"
        "  --announce on|off    with --cluster-key and a non-loopback --listen, announce\n"
        "                       this worker on the LAN as mDNS/DNS-SD %s (shoal\n"
        "                       --workers auto finds it; the key is not in it, only a\n"
        "                       key id; default on)\n"
        "  --expert-cache SIZE  RAM budget for experts (default unlimited)\n"
        "  --cache-policy lru|freq  what that cache keeps: the most recently used\n"
        "                       experts, or those acquired most often (default %s)\n"
        "  --pin SIZE           experts pinned in RAM, hottest first (default 0)\n"
        "  --direct on|off      O_DIRECT / F_NOCACHE expert reads (default off: experts\n"
        "                       in the page cache are mapped from it, others read)\n"
        "  --io auto|pread|uring  I/O engine (default auto)\n"
        "  --queue-depth N      expert reads in flight (default 8)\n"
        "  --prefetch on|off    act on the coordinator's prefetch hints (default on)\n"
        "  --threads N          compute threads (default: OpenMP's)\n"
        "  --max-coordinators N coordinators served at once; more are refused (default 8)\n"
        "  --max-unauthenticated N  connections held in their handshake at once, each\n"
        "                       at most ~64 KiB; a new one closes the least advanced\n"
        "                       (default %d, at most %d)\n"
        "  --max-unauthenticated-per-address N  of those, from one source address (an\n"
        "                       IPv6 /64 counts as one; default %d)\n"
        "  --stats              log the expert store's counters at exit\n"
        "  -q, --quiet          log warnings and errors only\n"
        "  -v, --verbose        log debug lines too\n"
        "  --version, --help\n",
        SHOAL_DISCOVER_SERVICE,
        shoal_cache_policy_name(shoal_expert_store_params_default().cache_policy),
        SHOAL_WIRE_MAX_UNAUTH_DEFAULT, SHOAL_WIRE_MAX_UNAUTH_LIMIT,
        SHOAL_WIRE_MAX_UNAUTH_PER_ADDR_DEFAULT);
}

static const char *need_value(int argc, char **argv, int i)
{
    if (i + 1 >= argc)
        die_usage("%s needs a value", argv[i]);
    return argv[i + 1];
}

static int parse_on_off(const char *flag, const char *v)
{
    if (strcmp(v, "on") && strcmp(v, "off"))
        die_usage("%s expects on or off, got '%s'", flag, v);
    return !strcmp(v, "on");
}

static unsigned long long parse_size_flag(const char *flag, const char *v)
{
    unsigned long long x;
    if (shoal_parse_size(v, &x) < 0)
        die_usage("%s expects a size such as 0, 512M, 4G or unlimited, got '%s'", flag, v);
    return x;
}

static long long parse_int_flag(const char *flag, const char *v, long long lo, long long hi)
{
    long long x;
    if (shoal_parse_i64(v, lo, hi, &x) < 0)
        die_usage("%s expects an integer in [%lld, %lld], got '%s'", flag, lo, hi, v);
    return x;
}

/* "I/N" or "I/N:R", I in [0, N), R in [1, N]. */
static void parse_shard(const char *v, struct opts *o)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%s", v);
    char *slash = strchr(buf, '/');
    char *colon = slash ? strchr(slash + 1, ':') : NULL;
    long long i = -1, n = 0, r = 1;
    if (slash)
        *slash = 0;
    if (colon)
        *colon = 0;
    if (!slash || strlen(v) >= sizeof buf ||
        shoal_parse_i64(slash + 1, 1, MAX_SHARD_WORKERS, &n) < 0 ||
        shoal_parse_i64(buf, 0, n - 1, &i) < 0 ||
        (colon && shoal_parse_i64(colon + 1, 1, n, &r) < 0))
        die_usage("--shard expects I/N or I/N:R with 0 <= I < N <= %d and 1 <= R <= N "
                  "(worker I of N, R holders per expert), got '%s'", MAX_SHARD_WORKERS, v);
    o->shard_index = (int)i;
    o->shard_count = (int)n;
    o->shard_replicas = (int)r;
}

/* "3,1": one positive finite number per worker of --shard (as `shoal shard
 * --weights`); the count is checked against N once every flag is read. */
static void parse_shard_weights(const char *v, struct opts *o)
{
    const char *p = v;
    o->n_shard_weights = 0;
    for (;;) {
        const char *comma = strchr(p, ',');
        const size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[64];
        if (o->n_shard_weights == MAX_SHARD_WORKERS)
            die_usage("--shard-weights has more than %d values", MAX_SHARD_WORKERS);
        if (len == 0 || len >= sizeof item)
            die_usage("--shard-weights item %d is %s; expected a positive number",
                      o->n_shard_weights + 1, len ? "too long" : "empty");
        memcpy(item, p, len);
        item[len] = '\0';
        char *end = NULL;
        errno = 0;
        const double w = strtod(item, &end);
        if (*end || errno || !isfinite(w) || !(w > 0))
            die_usage("--shard-weights item %d is '%s'; expected a positive number",
                      o->n_shard_weights + 1, item);
        o->shard_weights[o->n_shard_weights++] = w;
        if (!comma)
            break;
        p = comma + 1;
    }
}

/* "H" or "H:X" (hot_replicas.h). */
static void parse_hot(const char *v, struct opts *o)
{
    if (shoal_hot_replicas_parse(v, MAX_SHARD_WORKERS, &o->hot_n, &o->hot_extra) < 0)
        die_usage("--hot-replicas expects H or H:X with H >= 1 (hot experts per layer) and "
                  "1 <= X <= %d (extra holders each), got '%s'", MAX_SHARD_WORKERS, v);
}

static void parse_args(int argc, char **argv, struct opts *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--version")) {
            printf("shoal-worker %s\n", SHOAL_VERSION);
            exit(0);
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            o->log_level = SHOAL_LOG_WARN;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            o->log_level = SHOAL_LOG_DEBUG;
        } else if (!strcmp(a, "--stats")) {
            o->stats = 1;
        } else {
            static const char *const valued[] = {
                "--model", "--shard", "--shard-weights", "--hot-replicas", "--routing", "--listen", "--join", "--cluster-key", "--name",
                "--expert-cache", "--cache-policy", "--pin", "--direct", "--prefetch", "--queue-depth",
                "--threads", "--io", "--max-coordinators", "--max-unauthenticated",
                "--max-unauthenticated-per-address", "--announce"};
            int known = 0;
            for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++)
                known |= !strcmp(a, valued[k]);
            if (!known)
                die_usage("%s '%s' (see --help)",
                          a[0] == '-' ? "unknown option" : "unexpected argument", a);
            const char *v = need_value(argc, argv, i++);
            if (!strcmp(a, "--model"))
                o->model = v;
            else if (!strcmp(a, "--shard"))
                parse_shard(v, o);
            else if (!strcmp(a, "--shard-weights"))
                parse_shard_weights(v, o);
            else if (!strcmp(a, "--hot-replicas"))
                parse_hot(v, o);
            else if (!strcmp(a, "--routing"))
                o->routing = v;
            else if (!strcmp(a, "--listen"))
                o->listen = v;
            else if (!strcmp(a, "--join"))
                o->join = v;
            else if (!strcmp(a, "--cluster-key"))
                o->key_file = v;
            else if (!strcmp(a, "--name")) {
                if (!*v)
                    die_usage("--name expects a non-empty name");
                o->name = v;
            }
            else if (!strcmp(a, "--expert-cache"))
                o->store.cache_bytes = parse_size_flag(a, v);
            else if (!strcmp(a, "--pin"))
                o->store.pin_bytes = parse_size_flag(a, v);
            else if (!strcmp(a, "--cache-policy")) {
                if (shoal_cache_policy_parse(v, &o->store.cache_policy) < 0)
                    die_usage("--cache-policy expects lru or freq, got '%s'", v);
            }
            else if (!strcmp(a, "--direct"))
                o->store.direct = parse_on_off(a, v);
            else if (!strcmp(a, "--prefetch"))
                o->store.prefetch = parse_on_off(a, v);
            else if (!strcmp(a, "--announce"))
                o->announce = parse_on_off(a, v);
            else if (!strcmp(a, "--queue-depth"))
                o->store.io.queue_depth = (int)parse_int_flag(a, v, 1, SHOAL_IO_QUEUE_DEPTH_MAX);
            else if (!strcmp(a, "--threads"))
                o->threads = (int)parse_int_flag(a, v, 1, 1024);
            else if (!strcmp(a, "--max-coordinators"))
                o->max_coordinators = (int)parse_int_flag(a, v, 1, 256);
            else if (!strcmp(a, "--max-unauthenticated"))
                o->max_unauth = (int)parse_int_flag(a, v, 1, SHOAL_WIRE_MAX_UNAUTH_LIMIT);
            else if (!strcmp(a, "--max-unauthenticated-per-address"))
                o->max_unauth_per_addr =
                    (int)parse_int_flag(a, v, 1, SHOAL_WIRE_MAX_UNAUTH_LIMIT);
            else if (!strcmp(a, "--io")) {
                if (shoal_io_kind_parse(v, &o->store.io.kind) < 0)
                    die_usage("--io expects pread, uring or auto, got '%s'", v);
            } else {
                die_usage("unknown option '%s' (see --help)", a);
            }
        }
    }
    if (!o->model)
        die_usage("--model DIR is required (see --help)");
    if (o->n_shard_weights && !o->shard_count)
        die_usage("--shard-weights needs --shard I/N: it gives each of the N workers its "
                  "share of the experts");
    if (o->n_shard_weights && o->n_shard_weights != o->shard_count)
        die_usage("--shard-weights has %d values for --shard %d/%d; expected one per worker "
                  "(%d)", o->n_shard_weights, o->shard_index, o->shard_count,
                  o->shard_count);
    if (o->hot_n && !o->shard_count)
        die_usage("--hot-replicas needs --shard I/N[:R] (without it every expert is held)");
    if (o->routing && !o->hot_n)
        die_usage("--routing ranks the experts of --hot-replicas; give that too");
    if (!o->max_unauth_per_addr)
        o->max_unauth_per_addr = o->max_unauth < SHOAL_WIRE_MAX_UNAUTH_PER_ADDR_DEFAULT
                                     ? o->max_unauth : SHOAL_WIRE_MAX_UNAUTH_PER_ADDR_DEFAULT;
    if (o->max_unauth_per_addr > o->max_unauth)
        die_usage("--max-unauthenticated-per-address %d exceeds --max-unauthenticated %d "
                  "(the share of one address is part of the whole)",
                  o->max_unauth_per_addr, o->max_unauth);
}

/* TEST ONLY: SHOAL_TEST_NAN_EXPERT=LAYER:EXPERT (each an index or '*')
 * makes this worker a faulty one for the coordinator's non-finite checks
 * (exec.h test_nan; docs/OPERATIONS.md lists it). A bad value is a usage
 * error (exit 2). */
static void read_test_nan(struct opts *o)
{
    const char *v = getenv("SHOAL_TEST_NAN_EXPERT");
    if (!v || !*v)
        return;
    char buf[64];
    snprintf(buf, sizeof buf, "%s", v);
    char *colon = strchr(buf, ':');
    long long il = -1, ie = -1;
    if (colon)
        *colon = 0;
    if (!colon || strlen(v) >= sizeof buf ||
        (strcmp(buf, "*") && shoal_parse_i64(buf, 0, INT32_MAX, &il) < 0) ||
        (strcmp(colon + 1, "*") && shoal_parse_i64(colon + 1, 0, INT32_MAX, &ie) < 0))
        die_usage("SHOAL_TEST_NAN_EXPERT expects LAYER:EXPERT (each an index or '*'), "
                  "got '%s'", v);
    o->test_nan = v;
    o->test_nan_layer = il;
    o->test_nan_expert = ie;
}

/* Refuse a non-loopback address without a cluster key (exit 2). */
static void check_loopback(const char *flag, const char *addr, const struct shoal_wire_key *key)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    struct shoal_err err = {0};
    if (shoal_wire_parse_addr(addr, &ss, &sl, &err) < 0)
        die_usage("%s: %s", flag, err.msg);
    if (!strcmp(flag, "--join") && shoal_wire_addr_port(&ss) == 0)   /* a coordinator's port, to dial */
        die_usage("--join %s: port 0 cannot be dialled; give the coordinator's "
                  "--accept-workers port", addr);
    if (!key->set && !shoal_wire_addr_is_loopback(&ss))
        die_usage("%s %s is not a loopback address: without --cluster-key a worker only "
                  "talks over loopback (give every machine the same --cluster-key FILE)",
                  flag, addr);
}

/* Coverage bitmap: bit il*n_expert+ie set when the container holds expert
 * (il, ie) of a MoE layer and --shard (if any) gives it to this worker:
 * R holders per expert, R + X for the experts hot marks ([n_layer][n_expert],
 * NULL: none; --hot-replicas H:X). Returns the number of experts covered. */
static int64_t build_coverage(const struct shoal_container *ct, const struct opts *o,
                              const uint8_t *hot, uint8_t *cov)
{
    int64_t held = 0;
    int *holders = shoal_xcalloc((size_t)(o->shard_count > 0 ? o->shard_count : 1),
                                 sizeof *holders);
    for (int64_t il = 0; il < ct->n_layer; il++) {
        for (int64_t ie = 0; ie < ct->n_expert; ie++) {
            if (!shoal_container_holds(ct, il, ie))
                continue;
            if (o->shard_count > 0) {
                const int extra = hot && hot[il * ct->n_expert + ie] ? o->hot_extra : 0;
                int n = shoal_placement_holders(
                    il, ie, o->shard_count, o->n_shard_weights ? o->shard_weights : NULL,
                    o->shard_replicas + extra, holders);
                int mine = 0;
                for (int k = 0; k < n; k++)
                    mine |= holders[k] == o->shard_index;
                if (!mine)
                    continue;
            }
            uint64_t bit = (uint64_t)il * (uint64_t)ct->n_expert + (uint64_t)ie;
            cov[bit / 8] |= (uint8_t)(1u << (bit % 8));
            held++;
        }
    }
    free(holders);
    return held;
}

/* The store's counters at exit (--stats): two lines on stderr, whatever
 * the log level. */
static void log_stats(struct shoal_worker_exec *exec)
{
    struct shoal_expert_store_stats st;
    shoal_worker_exec_store_stats(exec, &st);
    const uint64_t demand = st.pinned_hits + st.cache_hits + st.inflight_hits + st.disk_reads;
    fprintf(stderr,
              "shoal-worker: stats: acquires=%llu pinned_hits=%llu cache_hits=%llu inflight_hits=%llu "
              "disk_reads=%llu (%.1f%% hits) staged=%llu bytes_read=%.1f MB "
              "read_busy=%.2f s stall=%.2f s cache_policy=%s evictions=%llu not_admitted=%llu "
              "peak_expert_bytes=%.1f MB\n",
              (unsigned long long)demand, (unsigned long long)st.pinned_hits,
              (unsigned long long)st.cache_hits, (unsigned long long)st.inflight_hits,
              (unsigned long long)st.disk_reads,
              demand ? 100.0 * (double)(demand - st.disk_reads) / (double)demand : 0.0,
              (unsigned long long)st.staged_reads, st.bytes_read / 1e6, st.read_busy_seconds,
              st.stall_seconds, st.cache_policy, (unsigned long long)st.evictions,
              (unsigned long long)st.not_admitted, st.peak_expert_bytes / 1e6);
    fprintf(stderr,
              "shoal-worker: stats: prefetch hints=%llu hinted=%llu reads=%llu used=%llu dropped=%llu "
              "evicted_unused=%llu cancelled=%llu\n",
              (unsigned long long)st.hints, (unsigned long long)st.hinted,
              (unsigned long long)st.prefetch_reads, (unsigned long long)st.prefetch_used,
              (unsigned long long)st.prefetch_dropped, (unsigned long long)st.prefetch_evicted,
              (unsigned long long)st.reads_cancelled);
}

/* Block (how = SIG_BLOCK) or unblock SIGINT and SIGTERM in this thread. */
static void mask_stop_signals(int how)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(how, &set, NULL);
}

int main(int argc, char **argv)
{
    shoal_omp_env_init(argv);            /* first: it may re-execute the process */
    mask_stop_signals(SIG_BLOCK);
#if defined(__GLIBC__)
    /* frames, replies and batch scratch of 1 MiB or more get their own
     * mappings, given back when freed: glibc would otherwise raise this
     * threshold after the first large free and keep such blocks in the
     * compute thread's arena, whose top malloc_trim does not release
     * (a worker stayed at 70-166 MB after a burst; now near its idle RSS) */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
#endif
    struct opts o = {.listen = "127.0.0.1:7070",
                     .max_unauth = SHOAL_WIRE_MAX_UNAUTH_DEFAULT,
                     .announce = 1,
                     .store = shoal_expert_store_params_default(),
                     .log_level = SHOAL_LOG_INFO};
    o.store.learn = 0;   /* routing is the coordinator's; a worker only serves */
    parse_args(argc, argv, &o);
    read_test_nan(&o);

    struct shoal_err err = {0};
    struct shoal_wire_key key = {0};
    if (o.key_file && shoal_wire_key_load(o.key_file, &key, &err) < 0) {
        fail_line("--cluster-key: %s", err.msg);   /* a bad flag value: exit 2, as shoal's */
        return 2;
    }
    check_loopback("--listen", o.listen, &key);
    if (o.join)
        check_loopback("--join", o.join, &key);

    const int gguf = shoal_model_is_gguf(o.model);
    if (!gguf && !shoal_is_dir(o.model)) {
        fail_line("--model '%s' does not exist or is neither a directory nor a GGUF file",
                  o.model);
        return 2;
    }
    char *cached = NULL; /* the container converted from a checkpoint */
    if (!gguf && !shoal_container_is(o.model)) {
        char config[4096];
        snprintf(config, sizeof config, "%s/config.json", o.model);
        if (!shoal_exists(config)) {
            fail_line("'%s' is neither a shoal container (no shoal.json) nor a Hugging "
                      "Face checkpoint (no config.json); pass a checkpoint directory or a "
                      "container made with 'shoal convert'", o.model);
            return 2;
        }
        char cache_dir[4096];
        if (shoal_container_cache_dir(getenv("XDG_CACHE_HOME"), getenv("HOME"), cache_dir,
                                      sizeof cache_dir, &err) ||
            shoal_container_cache_path(o.model, cache_dir, &cached, &err)) {
            fail_line("%s", err.msg);
            return 1;
        }
        if (!shoal_container_is(cached)) {
            fprintf(stderr, "shoal-worker: converting '%s' once into '%s' (workers serve "
                    "shoal containers; later starts reuse it)\n", o.model, cached);
            if (shoal_container_cache_fill(o.model, cached, &err)) {
                fail_line("%s", err.msg);
                free(cached);
                return 1;
            }
        }
        static char cached_path[4096]; /* o.model lives until exit */
        snprintf(cached_path, sizeof cached_path, "%s", cached);
        free(cached);
        o.model = cached_path;
    }
    struct shoal_model_config cfg;
    struct shoal_container *ct = NULL;
    if (gguf) {
        /* a GGUF file: its experts read from the file itself, as the
         * coordinator's store reads them (container_gguf.c); the trunk's
         * mapping is not needed once the layout is known */
        struct shoal_model *m = shoal_model_load(o.model, &err);
        ct = m ? shoal_container_from_gguf(m, &err) : NULL;
        if (m)
            cfg = m->cfg;   /* plain data (the family is static) */
        shoal_model_free(m);
        if (!ct) {
            fail_line("%s", err.msg);
            return shoal_err_is_bad_input(err.code) ? 2 : 1;   /* as shoal run */
        }
    } else if (!(ct = shoal_container_open(o.model, &cfg, &err))) {
        fail_line("%s", err.msg);
        return 1;
    }
    /* usage is checked: from here on the worker logs its events */
    shoal_log_set_level(o.log_level);
    /* pick the quantized kernels once (AVX2, NEON or scalar; same bits) */
    shoal_quant_init(SHOAL_QUANT_ISA_AUTO, NULL);
    /* a peer that vanishes mid-write must not kill the process */
    signal(SIGPIPE, SIG_IGN);
    int rc = 1;
    struct shoal_worker_server *srv = NULL;
    struct shoal_worker_exec *exec = NULL;
    struct shoal_discover_announcer *announcer = NULL;
    uint8_t *is_moe = shoal_xcalloc((size_t)ct->n_layer, 1);
    const size_t cov_len = (size_t)((ct->n_layer * ct->n_expert + 7) / 8);
    uint8_t *cov = shoal_xcalloc(cov_len ? cov_len : 1, 1);
    int64_t n_moe = 0;
    for (int64_t il = 0; il < ct->n_layer; il++)
        n_moe += is_moe[il] = ct->layer_offset[il] != UINT64_MAX;
    uint8_t *hot = NULL;
    int64_t n_hot = 0;
    if (o.hot_n) {
        /* the hottest experts by the counts every worker reads alike */
        hot = shoal_hot_replicas_build(o.routing, ct->dir, ct->n_layer, ct->n_expert, o.hot_n,
                                       &err);
        if (!hot) {
            fail_line("--hot-replicas: %s", err.msg);
            rc = 2;   /* a bad --routing file, as a bad flag */
            goto out;
        }
        for (int64_t i = 0; i < ct->n_layer * ct->n_expert; i++)
            n_hot += hot[i];
    }
    const int64_t held = build_coverage(ct, &o, hot, cov);
    free(hot);
    if (held == 0) {
        fail_line("'%s'%s holds no routed experts for this worker; nothing to serve",
                  o.model, o.shard_count ? " with --shard" : "");
        goto out;
    }

    char fingerprint[17];
    snprintf(fingerprint, sizeof fingerprint, "%016" PRIx64, ct->fingerprint);
    char software[32], dtype[16];
    snprintf(software, sizeof software, "shoal %s", SHOAL_VERSION);
    snprintf(dtype, sizeof dtype, "%s", shoal_dtype_name(ct->experts_dtype));
    Shoal__PeerInfo info = SHOAL__PEER_INFO__INIT;
    info.software = software;
    info.fingerprint = fingerprint;
    info.model_type = (char *)cfg.family->model_type;
    info.n_layer = (uint32_t)ct->n_layer;
    info.n_expert = (uint32_t)ct->n_expert;
    info.n_embd = (uint32_t)cfg.n_embd;
    info.coverage.data = cov;
    info.coverage.len = cov_len;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    info.cores = (uint32_t)(o.threads > 0 ? o.threads : ncpu > 0 ? ncpu : 1);
    info.cache_bytes = o.store.cache_bytes;
    if (o.store.cache_bytes != UINT64_MAX)
        info.cache_bytes = o.store.pin_bytes > UINT64_MAX - o.store.cache_bytes
                               ? UINT64_MAX : o.store.cache_bytes + o.store.pin_bytes;
    info.max_frame = SHOAL_WIRE_MAX_FRAME_DEFAULT;
    info.expert_dtype = dtype;

    struct shoal_worker_server_params sp = shoal_worker_server_params_default();
    sp.listen = o.listen;
    sp.join = o.join;
    sp.key = &key;
    sp.info = &info;
    sp.fingerprint = fingerprint;
    sp.n_layer = ct->n_layer;
    sp.n_expert = ct->n_expert;
    sp.n_embd = cfg.n_embd;
    sp.is_moe = is_moe;
    sp.coverage = cov;
    sp.coverage_len = cov_len;
    if (o.max_coordinators)
        sp.max_coordinators = o.max_coordinators;
    sp.max_unauthenticated = o.max_unauth;
    sp.max_unauth_per_ip = o.max_unauth_per_addr;
    srv = shoal_worker_server_create(&sp, &err);
    if (!srv) {
        fail_line("%s", err.msg);
        goto out;
    }
    char name[300];
    if (o.name) {
        snprintf(name, sizeof name, "%s", o.name);
    } else {
        const char *addr = shoal_worker_server_address(srv);
        const char *port = strrchr(addr, ':');
        char host[256] = "";
        if ((!strncmp(addr, "0.0.0.0:", 8) || !strncmp(addr, "[::]:", 5)) &&
            gethostname(host, sizeof host - 1) == 0 && host[0])
            snprintf(name, sizeof name, "%s%s", host, port ? port : "");
        else
            snprintf(name, sizeof name, "%s", addr);
    }
    info.name = name;

    /* routing counts (pinned hot-set ranking) next to the container, or in
     * the user's cache directory when it is read-only */
    char cache_dir[4096] = "";
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && xdg[0] == '/')
        snprintf(cache_dir, sizeof cache_dir, "%s/shoal", xdg);
    else if (home && home[0] == '/')
        snprintf(cache_dir, sizeof cache_dir, "%s/.cache/shoal", home);
    o.store.counts_fallback_dir = cache_dir[0] ? cache_dir : NULL;
    struct shoal_worker_exec_params xp = {.ct = ct,
                                          .n_embd = cfg.n_embd,
                                          .n_ff_exp = cfg.n_ff_exp,
                                          .store = o.store,
                                          .threads = o.threads,
                                          .notify = shoal_worker_server_notify,
                                          .notify_user = srv};
    if (o.test_nan) {
        xp.test_nan = 1;
        xp.test_nan_layer = o.test_nan_layer;
        xp.test_nan_expert = o.test_nan_expert;
        shoal_log(SHOAL_LOG_WARN, "worker", "TEST ONLY: SHOAL_TEST_NAN_EXPERT=%s: the outputs "
                  "of those experts get a NaN (a faulty worker); never set it outside tests",
                  o.test_nan);
    }
    exec = shoal_worker_exec_create(&xp, &err);
    if (!exec) {
        fail_line("%s", err.msg);
        goto out;
    }
    const struct shoal_worker_exec_info *xi = shoal_worker_exec_info(exec);
    info.disk_mbps = xi->disk_mbps;
    info.compute_gbps = xi->compute_gbps;
    info.caps = (o.store.prefetch ? SHOAL_CAP_PREFETCH : 0) |
                (!strcmp(xi->io_engine, "uring") ? SHOAL_CAP_URING : 0) |
                (xi->direct ? SHOAL_CAP_DIRECT : 0);
    char cache[32];
    if (o.store.cache_bytes == UINT64_MAX)
        snprintf(cache, sizeof cache, "unlimited");
    else
        snprintf(cache, sizeof cache, "%.1f MB", o.store.cache_bytes / 1e6);
    char shard[96] = "";
    if (o.shard_count && o.hot_n)
        snprintf(shard, sizeof shard, " (--shard %d/%d:%d, %lld hot experts on %d more)",
                 o.shard_index, o.shard_count, o.shard_replicas, (long long)n_hot,
                 o.hot_extra);
    else if (o.shard_count)
        snprintf(shard, sizeof shard, " (--shard %d/%d:%d)", o.shard_index, o.shard_count,
                 o.shard_replicas);
    /* three significant digits in a unit that fits: never "0.00 GB/s" */
    char compute[48];
    if (!(xi->compute_gbps > 0))
        snprintf(compute, sizeof compute, "not measured (no held expert could be read)");
    else if (xi->compute_gbps >= 1)
        snprintf(compute, sizeof compute, "%.3g GB/s", xi->compute_gbps);
    else
        snprintf(compute, sizeof compute, "%.3g MB/s", xi->compute_gbps * 1e3);
    /* on the LAN for --workers auto: keyed workers only; a failure costs
     * the hint, not the worker (the coordinator can still name it) */
    if (o.announce && key.set) {
        const char *bound = shoal_worker_server_address(srv);
        struct sockaddr_storage ss;
        socklen_t ss_len;
        if (shoal_wire_parse_addr(bound, &ss, &ss_len, NULL) == 0 &&
            shoal_wire_addr_is_loopback(&ss)) {
            shoal_log(SHOAL_LOG_DEBUG, "worker", "not announced on mDNS: %s is loopback",
                      bound);
        } else {
            struct shoal_discover_announce_params ap = {
                .name = name, .listen = bound, .key = &key, .fingerprint = fingerprint};
            struct shoal_err aerr = {0};
            announcer = shoal_discover_announce_start(&ap, &aerr);
            if (!announcer)   /* a build without mDNS: said, not warned */
                shoal_log(aerr.code == -SHOAL_EUNSUPPORTED ? SHOAL_LOG_INFO : SHOAL_LOG_WARN,
                          "worker", "not announced on the LAN: %s (coordinators can still "
                          "name it in --workers)", aerr.msg);
        }
    }
    /* the handlers are installed (server create) and every thread has
     * started with the signals blocked: from now on this thread takes them */
    mask_stop_signals(SIG_UNBLOCK);
    shoal_log(SHOAL_LOG_INFO, "worker",
              "serving %s (%s, fingerprint %s, %s experts): %lld of %lld experts%s, "
              "cache %s, io %s%s, disk %.0f MB/s, compute %s, %s kernels",
              o.model, cfg.family->model_type, fingerprint, dtype, (long long)held,
              (long long)(n_moe * ct->n_expert), shard, cache, xi->io_engine,
              xi->direct ? " direct" : "", xi->disk_mbps, compute,
              shoal_quant_ops_name());

    int run_rc = shoal_worker_server_run(srv, exec, &err);
    /* exiting: a signal from here on is ignored (blocked in every thread;
     * destroy resets the handlers) */
    mask_stop_signals(SIG_BLOCK);
    if (run_rc < 0) {
        fail_line("%s", err.msg);
        goto out;
    }
    if (o.stats)
        log_stats(exec);
    rc = 0;
out:
    shoal_discover_announce_stop(announcer);
    shoal_worker_exec_destroy(exec);
    shoal_worker_server_destroy(srv);
    shoal_container_close(ct);
    free(is_moe);
    free(cov);
    return rc;
}
