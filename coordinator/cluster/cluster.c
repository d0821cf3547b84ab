/* cluster: create and destroy (see cluster.h): executors, the key, the
 * listeners, the loop thread, the start-up wait for static workers and the
 * coverage check; plus the counters' accessors. The loop's code is in
 * cluster_net.c, placement and the layer step in cluster_sched.c. */
#include "cluster.h"

#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cluster_impl.h"
#include "container.h"
#include "expert_ffn.h"
#include "expert_store.h"
#include "log.h"
#include "util.h"

/* ------------------------------------------------------------ create / destroy */

static int bind_listener(struct shoal_cluster *cl, uv_tcp_t *srv, const char *addr,
                         const char *flag, char *bound, size_t bound_n,
                         struct shoal_err *err)
{
    struct sockaddr_storage ss;
    socklen_t len;
    int rc = shoal_wire_parse_addr(addr, &ss, &len, err);
    if (rc)
        return rc;
    if (!cl->key.set && !shoal_wire_addr_is_loopback(&ss))
        return shoal_err_set(err, SHOAL_EINVAL,
                             "%s %s is not a loopback address: without --cluster-key "
                             "listeners bind to loopback only", flag, addr);
    uv_tcp_init(&cl->loop, srv);
    srv->data = cl;
    rc = uv_tcp_bind(srv, (const struct sockaddr *)&ss, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)srv, 128, shoal_cluster_net_on_incoming);
    if (rc < 0) {
        uv_close((uv_handle_t *)srv, NULL);
        return shoal_err_set(err, rc, "%s %s: cannot listen: %s", flag, addr,
                             uv_strerror(rc));
    }
    struct sockaddr_storage got;
    int glen = sizeof got;
    if (uv_tcp_getsockname(srv, (struct sockaddr *)&got, &glen) == 0)
        shoal_wire_addr_str((struct sockaddr *)&got, bound, bound_n);
    else
        snprintf(bound, bound_n, "%s", addr);
    return 0;
}

/* Check every MoE expert has a holder among executors that are up;
 * otherwise name the first that has none and the peers that are down.
 * Caller holds mu; err may be NULL. */
static int check_coverage(struct shoal_cluster *cl, struct shoal_err *err)
{
    for (int64_t il = 0; il < cl->n_layer; il++) {
        if (!cl->is_moe[il])
            continue;
        for (int64_t ie = 0; ie < cl->n_expert; ie++) {
            int ok = 0;
            for (int i = 0; i < cl->n_exec && !ok; i++) {
                struct exec *x = &cl->exec[i];
                if (x->kind == EXEC_LOCAL)
                    ok = shoal_container_holds(cl->ct, il, ie);
                else
                    ok = x->state == EXEC_UP && x->holds &&
                         x->holds[il * cl->n_expert + ie];
            }
            if (ok)
                continue;
            char down[400] = "";
            size_t o = 0;
            for (int i = 0; i < cl->n_exec && o < sizeof down - 1; i++) {
                struct exec *x = &cl->exec[i];
                if (x->kind == EXEC_LOCAL || x->state != EXEC_DOWN)
                    continue;
                int w = snprintf(down + o, sizeof down - o, "%s%s (%s)", o ? ", " : "",
                                 x->addr, x->last_error[0] ? x->last_error : "not connected");
                o = w > 0 && (size_t)w < sizeof down - o ? o + (size_t)w : sizeof down - 1;
            }
            /* joiners: say none had joined (or that the ones that did lack it) */
            int joined = 0;
            for (int i = 0; i < cl->n_exec; i++)
                joined += cl->exec[i].kind == EXEC_JOINED && cl->exec[i].state == EXEC_UP;
            char accept[640] = "";
            if (cl->have_accept && !down[0] && joined)
                snprintf(accept, sizeof accept, " (%d worker%s joined on %s)", joined,
                         joined == 1 ? "" : "s", cl->accept_bound);
            else if (cl->have_accept && !down[0])
                snprintf(accept, sizeof accept, " (no worker has joined on %s yet%s%.280s)",
                         cl->accept_bound, cl->join_refused[0] ? "; the last to try: " : "",
                         cl->join_refused);
            return shoal_err_set(err, SHOAL_ENOTFOUND,
                                 "layer %lld expert %lld has no holder: %s%s%s%s",
                                 (long long)il, (long long)ie,
                                 cl->local < 0 ? "--local-experts is off and " : "",
                                 down[0] ? "down: " : "no worker's shard holds it",
                                 down, accept);
        }
    }
    return 0;
}

static void free_snaps(struct shoal_cluster *cl)
{
    if (cl->step)
        free(cl->step->holds);
    if (cl->hint)
        free(cl->hint->holds);
    free(cl->step);
    free(cl->hint);
}

struct shoal_cluster *shoal_cluster_create(const struct shoal_model *m,
                                           const struct shoal_cluster_params *p,
                                           struct shoal_err *err)
{
    const struct shoal_container *ct = p->ct ? p->ct : m->ct;
    if (!ct || !m->store) {
        shoal_err_set(err, SHOAL_EINVAL, "a cluster needs a shoal container; '%s' is a Hugging "
                      "Face directory (make one with: shoal convert)", m->dir);
        return NULL;
    }
    if (p->n_workers + 1 > SHOAL_CLUSTER_MAX_EXECUTORS) {
        shoal_err_set(err, SHOAL_EINVAL, "%d workers given, at most %d", p->n_workers,
                      SHOAL_CLUSTER_MAX_EXECUTORS - 1);
        return NULL;
    }
    if (p->max_unauthenticated < 1 || p->max_unauthenticated > SHOAL_WIRE_MAX_UNAUTH_LIMIT ||
        p->max_unauth_per_addr < 1 || p->max_unauth_per_addr > p->max_unauthenticated) {
        shoal_err_set(err, SHOAL_EINVAL, "unauthenticated connections: %d at once and %d per "
                      "address given, expected 1 <= per address <= at once <= %d",
                      p->max_unauthenticated, p->max_unauth_per_addr,
                      SHOAL_WIRE_MAX_UNAUTH_LIMIT);
        return NULL;
    }
    /* a peer that goes away must not kill the coordinator with SIGPIPE */
    signal(SIGPIPE, SIG_IGN);
    struct shoal_cluster *cl = shoal_xcalloc(1, sizeof *cl);
    shoal_preauth_init(&cl->preauth, p->max_unauthenticated, p->max_unauth_per_addr);
    const struct shoal_model_config *c = &m->cfg;
    cl->model = m;
    cl->lx = shoal_local_experts_create(m, m->store);
    cl->p = *p;
    cl->local = -1;
    cl->t_start = shoal_cluster_now();
    cl->next_id = 1;
    cl->n_layer = c->n_layer;
    cl->n_expert = c->n_expert;
    cl->n_embd = c->n_embd;
    cl->ct = ct;
    cl->blob_bytes = ct->blob_bytes;
    cl->is_moe = shoal_xcalloc((size_t)c->n_layer, 1);
    for (int64_t il = 0; il < c->n_layer; il++) {
        cl->is_moe[il] = (uint8_t)shoal_layer_is_moe(c, il);
        cl->n_layer_moe += cl->is_moe[il];
    }
    cl->remote_runs = shoal_xcalloc((size_t)(c->n_layer * c->n_expert) + 1,
                                    sizeof *cl->remote_runs);
    cl->last_worker = shoal_xmalloc((size_t)(c->n_layer * c->n_expert) + 1);
    memset(cl->last_worker, 0xff, (size_t)(c->n_layer * c->n_expert) + 1);
    snprintf(cl->fingerprint, sizeof cl->fingerprint, "%016" PRIx64, ct->fingerprint);
    pthread_mutex_init(&cl->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&cl->cond, &ca);
    pthread_condattr_destroy(&ca);
    int loop_ok = 0;
    if (p->key_path && shoal_wire_key_load(p->key_path, &cl->key, err) < 0)
        goto fail;
    /* our PeerInfo */
    shoal__peer_info__init(&cl->info);
    if (gethostname(cl->info_name, sizeof cl->info_name - 1) != 0)
        snprintf(cl->info_name, sizeof cl->info_name, "coordinator");
    snprintf(cl->software, sizeof cl->software, "shoal %s", "0.1.0");
    cl->info.name = cl->info_name;
    cl->info.software = cl->software;
    cl->info.fingerprint = cl->fingerprint;
    cl->info.model_type = (char *)c->family->model_type;
    cl->info.n_layer = (uint32_t)c->n_layer;
    cl->info.n_expert = (uint32_t)c->n_expert;
    cl->info.n_embd = (uint32_t)c->n_embd;
    cl->info.cores = (uint32_t)sysconf(_SC_NPROCESSORS_ONLN);
    cl->info.max_frame = SHOAL_WIRE_MAX_FRAME_DEFAULT;
    cl->info.expert_dtype = (char *)shoal_dtype_name(ct->experts_dtype);
    /* executors: local, then the static workers */
    if (p->local_experts) {
        struct exec *x = &cl->exec[cl->n_exec];
        cl->local = cl->n_exec++;
        snprintf(x->addr, sizeof x->addr, "local");
        x->kind = EXEC_LOCAL;
        x->state = EXEC_UP;
        x->seed = shoal_cluster_addr_seed(x->addr);
        x->resolved = 1;
        x->cache_bytes = p->local_cache_bytes;
        x->max_frame = SHOAL_WIRE_MAX_FRAME_DEFAULT;
        x->holds = shoal_xcalloc((size_t)(c->n_layer * c->n_expert), 1);
        for (int64_t il = 0; il < c->n_layer; il++)
            for (int64_t ie = 0; ie < c->n_expert; ie++)
                if (cl->is_moe[il] && shoal_container_holds(ct, il, ie)) {
                    x->holds[il * c->n_expert + ie] = 1;
                    x->experts_held++;
                }
        x->assigned = shoal_xcalloc((size_t)(c->n_layer * c->n_expert), 1);
        /* its compute rate, measured as every worker measures its own, so
         * placement compares like with like (one blob is read for it) */
        for (int64_t il = 0; il < c->n_layer && m->store && x->compute_gbps == 0; il++)
            for (int64_t ie = 0; ie < c->n_expert; ie++) {
                if (!x->holds[il * c->n_expert + ie])
                    continue;
                struct shoal_expert_weights ew;
                struct shoal_err e2 = {0};
                if (shoal_expert_store_acquire(m->store, il, ie, &ew, &e2) == 0) {
                    x->compute_gbps = shoal_expert_ffn_rate(&ew, ct->blob_bytes);
                    shoal_expert_store_release(m->store, il, ie);
                }
                break;
            }
    }
    for (int i = 0; i < p->n_workers; i++) {
        struct exec *x = &cl->exec[cl->n_exec];
        if (shoal_wire_parse_addr(p->workers[i], &x->ss, &x->ss_len, err) < 0)
            goto fail;
        for (int j = 0; j < cl->n_exec; j++)
            if (!strcmp(cl->exec[j].addr, p->workers[i])) {
                shoal_err_set(err, SHOAL_EINVAL, "worker %s is listed twice", p->workers[i]);
                goto fail;
            }
        snprintf(x->addr, sizeof x->addr, "%s", p->workers[i]);
        x->kind = EXEC_STATIC;
        x->seed = shoal_cluster_addr_seed(x->addr);
        x->assigned = shoal_xcalloc((size_t)(c->n_layer * c->n_expert), 1);
        cl->n_exec++;
    }
    if (cl->n_exec == 0 && !p->accept_addr) {
        shoal_err_set(err, SHOAL_EINVAL, "--local-experts off needs --workers or "
                      "--accept-workers");
        goto fail;
    }
    /* scratch of a layer step */
    cl->step = shoal_xcalloc(1, sizeof *cl->step);
    cl->hint = shoal_xcalloc(1, sizeof *cl->hint);
    cl->step->holds = shoal_xcalloc((size_t)SHOAL_CLUSTER_MAX_EXECUTORS * (size_t)c->n_expert, 1);
    cl->hint->holds = shoal_xcalloc((size_t)SHOAL_CLUSTER_MAX_EXECUTORS * (size_t)c->n_expert, 1);
    /* the loop */
    if (uv_loop_init(&cl->loop) < 0) {
        shoal_err_set(err, SHOAL_EIO, "cannot start the cluster's event loop");
        goto fail;
    }
    loop_ok = 1;
    cl->loop.data = cl;
    uv_async_init(&cl->loop, &cl->async, shoal_cluster_net_async);
    cl->async.data = cl;
    uv_timer_init(&cl->loop, &cl->tick);
    cl->tick.data = cl;
    for (int i = 0; i < cl->n_exec; i++)
        if (cl->exec[i].kind == EXEC_STATIC) {
            uv_timer_init(&cl->loop, &cl->exec[i].reconnect);
            cl->exec[i].reconnect.data = &cl->exec[i];
            cl->exec[i].reconnect_init = 1;
        }
    if (p->accept_addr) {
        struct shoal_err e2 = {0};
        if (bind_listener(cl, &cl->accept_srv, p->accept_addr, "--accept-workers",
                          cl->accept_bound, sizeof cl->accept_bound, &e2) < 0) {
            shoal_err_set(err, e2.code, "%s%s", e2.msg, e2.code == UV_EADDRINUSE
                          ? " (another coordinator holds it?); pass --accept-workers "
                            "ADDR:PORT with a free port" : "");
            goto fail;
        }
        cl->have_accept = 1;
    }
    if (p->control_addr) {
        struct shoal_err e2 = {0};
        if (bind_listener(cl, &cl->control_srv, p->control_addr, "--control",
                          cl->control_bound, sizeof cl->control_bound, &e2) < 0) {
            if (p->control_explicit || e2.code == SHOAL_EINVAL) {
                shoal_err_set(err, e2.code, "%s%s", e2.msg, e2.code == UV_EADDRINUSE
                              ? " (another coordinator holds it?); pass --control off, or "
                                "--control ADDR:PORT with a free port" : "");
                goto fail;
            }
            fprintf(stderr, "shoal: warning: %s; `shoal status` is not served "
                    "(--control ADDR:PORT picks another; --control off drops it)\n", e2.msg);
        } else {
            cl->have_control = 1;
        }
    }
    uv_timer_start(&cl->tick, shoal_cluster_net_tick, CLUSTER_HEARTBEAT_MS,
                   CLUSTER_HEARTBEAT_MS);
    for (int i = 0; i < cl->n_exec; i++)
        if (cl->exec[i].kind == EXEC_STATIC)
            shoal_cluster_net_dial(cl, i);
    if (uv_thread_create(&cl->thread, shoal_cluster_net_thread, cl) != 0) {
        shoal_err_set(err, SHOAL_EIO, "cannot start the cluster's loop thread");
        goto fail;
    }
    cl->thread_started = 1;
    /* wait for the static workers: each up, failed for good, or the deadline */
    double deadline = shoal_cluster_now() + p->connect_timeout_s;
    pthread_mutex_lock(&cl->mu);
    for (;;) {
        int pending = 0;
        for (int i = 0; i < cl->n_exec; i++)
            if (cl->exec[i].kind == EXEC_STATIC && !cl->exec[i].resolved)
                pending++;
        double now = shoal_cluster_now();
        /* with --accept-workers, also wait for joiners to cover every expert */
        if ((!pending && (!cl->have_accept || check_coverage(cl, NULL) == 0)) ||
            now >= deadline)
            break;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        double wait = deadline - now;
        if (wait > 0.1)
            wait = 0.1;
        ts.tv_sec += (time_t)wait;
        ts.tv_nsec += (long)((wait - (double)(time_t)wait) * 1e9);
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&cl->cond, &cl->mu, &ts);
    }
    /* each static worker that is not up, and why */
    int n_up = 0, n_static = 0, n_joined = 0, n_down = 0;
    char why[SHOAL_CLUSTER_MAX_EXECUTORS][400];
    for (int i = 0; i < cl->n_exec; i++) {
        struct exec *x = &cl->exec[i];
        if (x->kind == EXEC_JOINED && x->state != EXEC_DOWN)
            n_joined++;
        if (x->kind != EXEC_STATIC)
            continue;
        n_static++;
        if (x->state != EXEC_DOWN) {
            n_up++;
            continue;
        }
        char *w = why[n_down++];
        if (!x->resolved)
            snprintf(w, sizeof why[0], "%s: not up after %.1f s: %s", x->addr,
                     p->connect_timeout_s, x->last_error[0] ? x->last_error : "not connected");
        else if (!strncmp(x->last_error, x->addr, strlen(x->addr)))
            snprintf(w, sizeof why[0], "%s", x->last_error);   /* it names the address */
        else
            snprintf(w, sizeof why[0], "%s: %s", x->addr, x->last_error);
    }
    /* workers asked for and none came: the local store alone would carry the
     * run, which the user did not ask for unless --local-fallback */
    if (n_static > 0 && n_up == 0 && n_joined == 0 && cl->local >= 0 && !p->local_fallback) {
        pthread_mutex_unlock(&cl->mu);
        char all[SHOAL_ERR_MSG_MAX] = "";
        size_t len = 0;
        for (int i = 0; i < n_down && len < sizeof all; i++) {
            int k = snprintf(all + len, sizeof all - len, "%s%s", i ? "; " : "", why[i]);
            len += k > 0 ? (size_t)k : 0;
        }
        /* the hint first: a long list of workers is cut at the message's end */
        shoal_err_set(err, SHOAL_ENOTFOUND, "no worker of --workers is up, and the local "
                      "experts run alone only with --local-fallback: %s", all);
        goto fail;
    }
    for (int i = 0; i < n_down; i++)
        fprintf(stderr, "shoal: worker %s\n", why[i]);
    if (n_static > 0 && n_up == 0 && n_joined == 0 && cl->local >= 0)
        fprintf(stderr, "shoal: warning: no worker of --workers is up: the local experts "
                "run alone (--local-fallback)\n");
    int rc = check_coverage(cl, err);
    pthread_mutex_unlock(&cl->mu);
    if (rc < 0)
        goto fail;
    char lines[512];
    int o = snprintf(lines, sizeof lines, "shoal: cluster %s: %d of %d workers up%s",
                     cl->fingerprint, n_up, n_static,
                     cl->local >= 0 ? " + local experts" : "");
    if (cl->have_accept && o > 0 && (size_t)o < sizeof lines)
        o += snprintf(lines + o, sizeof lines - (size_t)o, ", workers join on %s",
                      cl->accept_bound);
    if (cl->have_control && o > 0 && (size_t)o < sizeof lines)
        o += snprintf(lines + o, sizeof lines - (size_t)o, ", control %s", cl->control_bound);
    if (!cl->key.set && (cl->have_control || cl->have_accept) && o > 0 &&
        (size_t)o < sizeof lines)
        snprintf(lines + o, sizeof lines - (size_t)o,
                 " (no --cluster-key: listening on loopback only)");
    fprintf(stderr, "%s\n", lines);
    return cl;
fail:
    if (!loop_ok) {
        for (int i = 0; i < cl->n_exec; i++) {
            free(cl->exec[i].holds);
            free(cl->exec[i].assigned);
        free(cl->exec[i].resident);
        free(cl->exec[i].resident_known);
        free(cl->exec[i].loading);
        free(cl->exec[i].resident_at);
        }
        free(cl->is_moe);
        free(cl->remote_runs);
        free(cl->last_worker);
        free_snaps(cl);
        shoal_local_experts_free(cl->lx);
        pthread_mutex_destroy(&cl->mu);
        pthread_cond_destroy(&cl->cond);
        free(cl);
        return NULL;
    }
    shoal_cluster_destroy(cl);
    return NULL;
}

void shoal_cluster_destroy(struct shoal_cluster *cl)
{
    if (!cl)
        return;
    pthread_mutex_lock(&cl->mu);
    cl->stopping = 1;
    pthread_mutex_unlock(&cl->mu);
    if (cl->thread_started) {
        uv_async_send(&cl->async);
        uv_thread_join(&cl->thread);
    } else {
        /* the loop never ran: close what create opened */
        shoal_cluster_net_stop_all(cl);
        uv_run(&cl->loop, UV_RUN_DEFAULT);
    }
    /* run remaining close callbacks */
    uv_run(&cl->loop, UV_RUN_NOWAIT);
    if (uv_loop_close(&cl->loop) != 0)
        shoal_log(SHOAL_LOG_DEBUG, "cluster", "event loop closed with handles open");
    struct out_msg *m = cl->out_head;
    while (m) {
        struct out_msg *n = m->next;
        free(m->data);
        free(m);
        m = n;
    }
    for (int i = 0; i < cl->n_pend; i++) {
        shoal_wire_frame_free(cl->pend[i].frame);
        free(cl->pend[i].part);
    }
    free(cl->pend);
    for (int i = 0; i < cl->n_exec; i++) {
        free(cl->exec[i].holds);
        free(cl->exec[i].assigned);
        free(cl->exec[i].resident);
        free(cl->exec[i].resident_known);
        free(cl->exec[i].loading);
        free(cl->exec[i].resident_at);
    }
    free(cl->is_moe);
    free(cl->remote_runs);
    free(cl->last_worker);
    free_snaps(cl);
    free(cl->tokmap);
    free(cl->hidden);
    free(cl->rows);
    free(cl->rbuf);
    shoal_local_experts_free(cl->lx);
    free(cl->pf_local);
    shoal_preauth_free(&cl->preauth);
    pthread_mutex_destroy(&cl->mu);
    pthread_cond_destroy(&cl->cond);
    free(cl);
}

int shoal_cluster_local_experts(const struct shoal_cluster *cl)
{
    return cl->local >= 0;
}

const char *shoal_cluster_control_addr(const struct shoal_cluster *cl)
{
    return cl->have_control ? cl->control_bound : NULL;
}

int shoal_cluster_n_executors(struct shoal_cluster *cl)
{
    pthread_mutex_lock(&cl->mu);
    int n = cl->n_exec;
    pthread_mutex_unlock(&cl->mu);
    return n;
}

void shoal_cluster_exec_stats_get(struct shoal_cluster *cl, int i,
                                  struct shoal_cluster_exec_stats *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&cl->mu);
    if (i >= 0 && i < cl->n_exec) {
        struct exec *x = &cl->exec[i];
        snprintf(out->address, sizeof out->address, "%s", x->addr);
        out->state = shoal_cluster_state_name(x);
        out->requests = x->requests;
        out->errors = x->errors;
        out->reconnects = x->reconnects;
        out->bytes_sent = x->bytes_sent;
        out->bytes_received = x->bytes_received;
        out->payload_sent = x->payload_sent;
        out->payload_received = x->payload_received;
        out->ssd_bytes = x->ssd_bytes;
        out->rtt_ms = x->rtt_ms;
        out->experts_held = x->experts_held;
        out->busy_s = x->busy_s;
        out->busy_steps = x->busy_steps;
    }
    pthread_mutex_unlock(&cl->mu);
}

double shoal_cluster_seen_rate(struct seen_rate *r, double bytes, double seconds,
                               double min_bytes, double min_s)
{
    if (!(bytes >= 0) || !(seconds >= 0) || !isfinite(bytes) || !isfinite(seconds))
        return 0;
    r->bytes = 0.9 * r->bytes + bytes;
    r->seconds = 0.9 * r->seconds + seconds;
    return r->bytes >= min_bytes && r->seconds > min_s ? r->bytes / r->seconds : 0;
}

void shoal_cluster_note_disk(struct exec *x, double bytes, double busy_s)
{
    double rate = shoal_cluster_seen_rate(&x->disk_seen, bytes, busy_s, 8.0 * 1024 * 1024, 0.005);
    if (rate > 0)
        x->disk_mbps_seen = rate / 1e6;
}

uint64_t shoal_cluster_rounds(struct shoal_cluster *cl)
{
    pthread_mutex_lock(&cl->mu);
    uint64_t n = cl->rounds;
    pthread_mutex_unlock(&cl->mu);
    return n;
}

void shoal_cluster_balance_get(struct shoal_cluster *cl, struct shoal_cluster_balance *out)
{
    pthread_mutex_lock(&cl->mu);
    out->steps = cl->bal_steps;
    out->max_over_mean = cl->bal_steps ? cl->bal_ratio_sum / (double)cl->bal_steps : 0.0;
    out->n_split = cl->n_split;
    out->split_rows = cl->split_rows;
    out->step_reads = cl->step_reads;
    memcpy(out->reads_hist, cl->reads_hist, sizeof out->reads_hist);
    pthread_mutex_unlock(&cl->mu);
}

void shoal_cluster_expert_use_get(struct shoal_cluster *cl, uint64_t *remote_runs,
                                  uint8_t *last_worker)
{
    const size_t n = (size_t)(cl->n_layer * cl->n_expert);
    pthread_mutex_lock(&cl->mu);
    if (remote_runs)
        memcpy(remote_runs, cl->remote_runs, n * sizeof *remote_runs);
    if (last_worker)
        memcpy(last_worker, cl->last_worker, n);
    pthread_mutex_unlock(&cl->mu);
}

void shoal_cluster_print_stats(struct shoal_cluster *cl)
{
    int n = shoal_cluster_n_executors(cl);
    for (int i = 0; i < n; i++) {
        struct shoal_cluster_exec_stats s;
        shoal_cluster_exec_stats_get(cl, i, &s);
        fprintf(stderr, "shoal: executor %d %s: %s, %u experts, %llu requests, %llu errors, "
                "%llu reconnects, %.2f MB sent, %.2f MB received, rtt %.2f ms, "
                "busy %.3f ms per layer step (%llu steps)", i,
                s.address, s.state, s.experts_held, (unsigned long long)s.requests,
                (unsigned long long)s.errors, (unsigned long long)s.reconnects,
                (double)s.bytes_sent / 1e6, (double)s.bytes_received / 1e6, s.rtt_ms,
                s.busy_steps ? 1e3 * s.busy_s / (double)s.busy_steps : 0.0,
                (unsigned long long)s.busy_steps);
        const uint64_t need = s.payload_sent + s.payload_received;
        if (need)
            fprintf(stderr, ", wire %.3fx the rows it carried, %.2f MB read from its disk",
                    (double)(s.bytes_sent + s.bytes_received) / (double)need,
                    (double)s.ssd_bytes / 1e6);
        fputc('\n', stderr);
    }
    struct shoal_cluster_balance b;
    shoal_cluster_balance_get(cl, &b);
    fprintf(stderr, "shoal: cluster balance: busy max/mean per layer step %.3f (%llu steps), "
            "%llu experts split (%llu rows); %llu layer rounds waited on workers\n",
            b.max_over_mean, (unsigned long long)b.steps, (unsigned long long)b.n_split,
            (unsigned long long)b.split_rows, (unsigned long long)shoal_cluster_rounds(cl));
}
