/* shoal serve: the OpenAI-compatible HTTP API (coordinator/serve/). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <errno.h>

#include "cli.h"
#include "config.h"
#include "serve.h"
#include "session.h"
#include "session_flags.h"
#include "util.h"

#define SERVE_MAX_BODY ((size_t)1 << 20)
#define SERVE_CONNS 64               /* --max-connections' least default */
#define SERVE_STREAMS 16             /* dashboards' event streams (SHOAL_SERVE_MAX_EVENT_STREAMS) */
#define SERVE_HEADER_TIMEOUT_S 30.0  /* --header-timeout's default */
#define SERVE_MIN_BODY_RATE 1024.0   /* bytes/s a request body averages after its grace */

static void usage(FILE *f)
{
    fprintf(f,
        "usage: shoal serve [--model] [MODEL] [--host ADDR] [--port N] [--api-key FILE]\n"
        "                   [--parallel N] [--queue N] [--cors ORIGIN[,ORIGIN]] [options]\n"
        "\n"
        "An OpenAI-compatible HTTP API: GET /health, GET /v1/models[/ID],\n"
        "POST /v1/completions, POST /v1/chat/completions (whole or streamed as\n"
        "server-sent events). Up to --parallel requests generate together, one KV\n"
        "cache slot each, in shared engine steps (their experts are read once per\n"
        "step); --queue more wait; beyond that a request gets 429 with Retry-After.\n"
        "A request's tokens are the same alone or beside others. Stop with Ctrl-C or\n"
        "SIGTERM (running requests end with what they have; queued ones get 503).\n"
        "GET /metrics: Prometheus text; GET /: a live dashboard (docs/OPERATIONS.md).\n"
        "\n");
    shoal_cli_usage_model(f);
    fprintf(f,
        "  --host ADDR          address to listen on (default 127.0.0.1); one that is not\n"
        "                       loopback needs --api-key\n"
        "  --port N             TCP port (default 8080; 0: any free port, printed)\n"
        "  --api-key FILE       require 'Authorization: Bearer KEY', KEY the file's secret\n"
        "                       (at least 16 bytes; surrounding whitespace ignored)\n"
        "  --parallel N         requests generating at once, each in its own KV slot of\n"
        "                       --ctx tokens (default 4; 1..64); a slot keeps its tokens\n"
        "                       after its request, for the next one with the same prefix\n"
        "  --queue N            requests waiting for a slot (default 16; 0..4096)\n"
        "  --kv-budget SIZE     bytes the KV cache of all slots may take (e.g. 2G); the\n"
        "                       context per slot (--ctx) is lowered to fit\n"
        "  --cors ORIGINS       let browser pages of these origins call the API (CORS):\n"
        "                       http://HOST[:PORT] or https://HOST[:PORT], separated by\n"
        "                       commas, or * for any; preflights need no key (default:\n"
        "                       none, no CORS headers)\n"
        "  --slot-dir DIR       keep the slots' tokens and KV rows in DIR when stopping and\n"
        "                       load them at start: conversations survive a restart\n"
        "  --max-connections N  HTTP connections at once (default 64, or more when\n"
        "                       --parallel + --queue need it; 1..4096); a client that\n"
        "                       has not sent a whole request yet is closed to make room\n"
        "  --max-connections-per-address N  from one IPv4 address or IPv6 /64\n"
        "                       (default: half of --max-connections)\n"
        "  --header-timeout S   seconds a request head may take, from the connection's\n"
        "                       start or its previous reply (default 30; 1..3600); a body\n"
        "                       must then average 1 KiB/s after as many seconds\n"
        "\n"
        "Defaults for what a request leaves out (each request may set its own):\n");
    shoal_gen_usage(f, SHOAL_GEN_USAGE_SERVE);
    fprintf(f,
        "\n"
        "Engine flags as for 'shoal run': --ctx, --kv, --batch, --isa, --threads, -v.\n"
        "  --test-token-delay MS  tests only: sleep MS after each engine step\n"
        "  --test-logits-dir DIR  tests only: each request's logits to DIR/<id>.npy\n"
        "  --test-forced-tokens FILE  tests only: each request's first tokens are the ids\n"
        "                       in FILE (read per request), whatever the logits\n"
        "\nExpert store (shoal containers and GGUF files):\n");
    shoal_session_usage_store(f);
}

/* The name /v1/models gives the model: its directory's last component. */
static char *model_id_of(const char *dir)
{
    char *d = shoal_xstrdup(dir);
    size_t n = strlen(d);
    while (n > 1 && d[n - 1] == '/')
        d[--n] = '\0';
    const char *slash = strrchr(d, '/');
    char *id = shoal_xstrdup(slash && slash[1] ? slash + 1 : d);
    free(d);
    return id;
}

int shoal_cmd_serve(int argc, char **argv)
{
    struct shoal_session_opts so = shoal_session_opts_default();
    struct shoal_serve_config cfg = {.host = "127.0.0.1", .port = 8080,
                                     .max_body = SERVE_MAX_BODY, .parallel = 4, .queue = 16};
    cfg.defaults = shoal_gen_opts_default();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = shoal_session_parse_flag(&so, argc, argv, &i);
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
        if (!strcmp(a, "--max-tokens"))
            cfg.max_tokens_given = 1;
        if (!strcmp(a, "--seed"))
            cfg.seed_given = 1;
        r = shoal_gen_parse_flag(&cfg.defaults, argc, argv, &i);
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--host") || !strcmp(a, "--port") || !strcmp(a, "--api-key") ||
            !strcmp(a, "--parallel") || !strcmp(a, "--queue") || !strcmp(a, "--slot-dir") ||
            !strcmp(a, "--kv-budget") || !strcmp(a, "--cors") || !strcmp(a, "--max-connections") ||
            !strcmp(a, "--max-connections-per-address") || !strcmp(a, "--header-timeout") ||
            !strcmp(a, "--test-token-delay") || !strcmp(a, "--test-logits-dir") ||
            !strcmp(a, "--test-forced-tokens")) {
            if (i + 1 >= argc) {
                shoal_cli_error("%s needs a value", a);
                return 2;
            }
            const char *v = argv[++i];
            long long x;
            if (!strcmp(a, "--host")) {
                cfg.host = v;
            } else if (!strcmp(a, "--api-key")) {
                cfg.api_key_path = v;
            } else if (!strcmp(a, "--slot-dir")) {
                cfg.slot_dir = v;
            } else if (!strcmp(a, "--cors")) {
                cfg.cors = v;
            } else if (!strcmp(a, "--kv-budget")) {
                if (shoal_cli_parse_size(a, v, &so.kv_budget))
                    return 2;
                if (so.kv_budget == 0) {   /* 0 would read as "no budget" */
                    shoal_cli_error("--kv-budget expects a size above 0 such as 2G, got '%s'", v);
                    return 2;
                }
            } else if (!strcmp(a, "--test-logits-dir")) {
                cfg.test_logits_dir = v;
            } else if (!strcmp(a, "--test-forced-tokens")) {
                cfg.test_forced_tokens = v;
            } else if (!strcmp(a, "--port")) {
                if (shoal_cli_parse_i64(a, v, 0, 65535, &x))
                    return 2;
                cfg.port = (int)x;
            } else if (!strcmp(a, "--parallel")) {
                if (shoal_cli_parse_i64(a, v, 1, 64, &x))
                    return 2;
                cfg.parallel = (int)x;
            } else if (!strcmp(a, "--queue")) {
                if (shoal_cli_parse_i64(a, v, 0, 4096, &x))
                    return 2;
                cfg.queue = (int)x;
            } else if (!strcmp(a, "--max-connections")) {
                if (shoal_cli_parse_i64(a, v, 1, 4096, &x))
                    return 2;
                cfg.conns.max = (int)x;
            } else if (!strcmp(a, "--max-connections-per-address")) {
                if (shoal_cli_parse_i64(a, v, 1, 4096, &x))
                    return 2;
                cfg.conns.per_addr = (int)x;
            } else if (!strcmp(a, "--header-timeout")) {
                if (shoal_cli_parse_i64(a, v, 1, 3600, &x))
                    return 2;
                cfg.conns.head_s = (double)x;
            } else {
                /* tests only: hold each request open this many ms per token */
                if (shoal_cli_parse_i64(a, v, 0, 10000, &x))
                    return 2;
                cfg.token_delay_ms = (unsigned)x;
            }
            continue;
        }
        if (shoal_cli_model_or_unknown("serve", a, &so.model_dir))
            return 2;
    }
    if (cfg.defaults.no_bos || cfg.defaults.logits_out || cfg.defaults.ids_out ||
        cfg.defaults.draft_logits_out) {
        shoal_cli_error("serve: --no-bos, --logits-out and --ids-out are options of "
                        "'shoal run' only");
        return 2;
    }
    if (cfg.conns.max == 0) {   /* room for every request that may be in flight */
        const int need = cfg.parallel + cfg.queue + SERVE_STREAMS + 16;
        cfg.conns.max = need > SERVE_CONNS ? need : SERVE_CONNS;
    }
    if (cfg.conns.per_addr == 0)
        cfg.conns.per_addr = cfg.conns.max > 1 ? cfg.conns.max / 2 : 1;
    if (cfg.conns.per_addr > cfg.conns.max) {
        shoal_cli_error("serve: --max-connections-per-address %d is more than "
                        "--max-connections %d", cfg.conns.per_addr, cfg.conns.max);
        return 2;
    }
    if (cfg.conns.head_s == 0)
        cfg.conns.head_s = SERVE_HEADER_TIMEOUT_S;
    cfg.conns.body_grace_s = cfg.conns.head_s;
    cfg.conns.body_rate = SERVE_MIN_BODY_RATE;
#if !HAVE_SERVE
    shoal_cli_error("serve: this shoal was built without libmicrohttpd (install "
                    "libmicrohttpd-dev or Homebrew's libmicrohttpd and rebuild)");
    return 1;
#else
    struct shoal_err err = {0};
    so.mtp = cfg.defaults.speculate == SHOAL_SPEC_MTP ? 1
             : cfg.defaults.speculate == SHOAL_SPEC_AUTO ? 2 : 0;
    if (shoal_session_check_opts(&so))
        return 2;
    if (shoal_serve_check_config(&cfg, &err)) {
        shoal_cli_error("%s", err.msg);
        return 2;
    }
    struct stat sb;
    errno = 0;
    if (cfg.slot_dir && (stat(cfg.slot_dir, &sb) != 0 || !S_ISDIR(sb.st_mode) ||
                         access(cfg.slot_dir, W_OK | X_OK) != 0)) {
        shoal_cli_error("serve: --slot-dir '%s': expected a writable directory (%s)",
                        cfg.slot_dir, errno ? strerror(errno) : "not a directory");
        return 2;
    }
    /* SIGINT/SIGTERM belong to serve's signal thread (shoal_serve_run):
     * block them before the session starts threads of its own (a cluster's
     * loop, I/O), which would otherwise take them and end the process */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    int rc = 1;
    so.n_seq = cfg.parallel;
    struct shoal_session *s = shoal_cli_session_open(&so, &rc);
    if (!s)
        return rc;
    char *id = model_id_of(s->model->dir);
    cfg.model_id = id;
    rc = shoal_serve_run(s, &cfg, &err);
    if (rc)
        shoal_cli_error("%s", err.msg);
    free(id);
    shoal_cli_session_close(s);
    return rc;
#endif
}
