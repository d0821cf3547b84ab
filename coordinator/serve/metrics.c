/* metrics: counters, gauges and the heat map of `shoal serve` (see
 * metrics.h), rendered as Prometheus text and as the dashboard's JSON. */
#include "metrics.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cluster.h"
#include "conns.h"
#include "expert_store.h"
#include "util.h"

#define MAX_LABELED 64          /* distinct (endpoint, status) pairs kept */
#define N_HEAT_TIERS 4          /* pinned, cache, disk, worker */
#define HEAT_WORKER 3

static const char *const tier_names[N_HEAT_TIERS] = {"pinned", "cache", "disk", "worker"};
static const char *const job_state_names[] = {"queued", "prefill", "decode"};

/* a counter with two string labels (static strings) and a number label */
struct labeled {
    const char *a, *b;
    unsigned code;
    uint64_t n;
};

struct recent {
    char id[48];
    const char *endpoint;       /* static (shoal_serve_metrics_endpoint) */
    int status;
    char finish[16];
    int64_t n_prompt, n_cached, n_gen;
    double ttft_s, tok_per_s, seconds;
    double t_end;               /* shoal_time_s() */
};

struct shoal_serve_metrics {
    pthread_mutex_t mu;
    pthread_cond_t cv;                    /* stop */
    char *model_id;
    double t_start;                       /* shoal_time_s() */
    int64_t unix_start;

    /* [mu] counters */
    struct labeled http[MAX_LABELED];     /* a endpoint, code status */
    int n_http;
    struct labeled gens[MAX_LABELED];     /* a endpoint, b finish */
    int n_gens;
    uint64_t prompt_tokens, cached_tokens, completion_tokens;
    struct recent recent[SHOAL_SERVE_RECENT_REQUESTS];
    int n_recent, i_recent;               /* ring: i_recent is the next slot */

    /* [mu] engine steps: [0] decode only, [1] with prompt rows */
    struct shoal_serve_step_stat step[2];

    /* [mu] the engine's snapshot of its requests */
    struct shoal_serve_job_stat *jobs;
    int n_jobs, cap_jobs, n_queued, parallel, queue_cap;

    /* [mu] copies from the session */
    int sampled;
    int have_store;
    struct shoal_expert_store_stats store;
    int have_cluster;
    int n_exec;
    struct shoal_cluster_exec_stats exec[SHOAL_CLUSTER_MAX_EXECUTORS];

    struct serve_conns *conns;            /* borrowed; NULL: none */
    struct shoal_ctx_timings t;
    int64_t n_layer, n_expert;
    uint8_t *moe;                         /* [n_layer] */
    float *heat;                          /* [n_layer][n_expert][N_HEAT_TIERS] decayed
                                           * counts as of t_heat */
    double t_heat;
    uint64_t *total;                      /* [n_layer][n_expert] every tier, cumulative */
    uint8_t *last_worker;                   /* [n_layer][n_expert] cluster only */
    uint64_t remote_total;

    /* [engine] the previous counts, to take deltas (only the sampling
     * thread touches these) */
    uint64_t *use, *use_prev;             /* [n_layer][n_expert][SHOAL_EXPERT_N_TIERS] */
    uint64_t *runs, *runs_prev;           /* [n_layer][n_expert] */
    uint8_t *last_tmp;

    /* [mu] event streams */
    int n_streams, stopping;
};

struct shoal_serve_metrics *shoal_serve_metrics_create(const char *model_id)
{
    struct shoal_serve_metrics *m = shoal_xcalloc(1, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cv, NULL);
    m->model_id = shoal_xstrdup(model_id ? model_id : "");
    m->t_start = shoal_time_s();
    m->unix_start = (int64_t)time(NULL);
    m->parallel = 1;
    return m;
}

void shoal_serve_metrics_free(struct shoal_serve_metrics *m)
{
    if (!m)
        return;
    free(m->model_id);
    free(m->jobs);
    free(m->moe);
    free(m->heat);
    free(m->total);
    free(m->last_worker);
    free(m->use);
    free(m->use_prev);
    free(m->runs);
    free(m->runs_prev);
    free(m->last_tmp);
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

const char *shoal_serve_metrics_endpoint(const char *url)
{
    static const char *const known[] = {"/v1/completions", "/v1/chat/completions",
                                        "/v1/models", "/health", "/metrics",
                                        "/v1/dashboard/events"};
    if (!url)
        return "other";
    for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
        if (!strcmp(url, known[k]))
            return known[k];
    if (shoal_serve_asset_find(url))
        return "/";
    return "other";
}

/* Add n to the counter labelled (a, b, code); mu held. Past MAX_LABELED
 * distinct labels the last slot takes the rest (labels are a small fixed
 * set in practice: endpoints x statuses). */
static void labeled_add(struct labeled *v, int *n_v, const char *a, const char *b,
                        unsigned code, uint64_t n)
{
    for (int i = 0; i < *n_v; i++)
        if (v[i].a == a && v[i].b == b && v[i].code == code) {
            v[i].n += n;
            return;
        }
    if (*n_v == MAX_LABELED) {
        v[MAX_LABELED - 1].n += n;
        return;
    }
    v[(*n_v)++] = (struct labeled){.a = a, .b = b, .code = code, .n = n};
}

void shoal_serve_metrics_http(struct shoal_serve_metrics *m, const char *url, unsigned status)
{
    const char *ep = shoal_serve_metrics_endpoint(url);
    pthread_mutex_lock(&m->mu);
    labeled_add(m->http, &m->n_http, ep, NULL, status ? status : 499, 1);
    pthread_mutex_unlock(&m->mu);
}

static const char *finish_label(const char *f)
{
    static const char *const known[] = {"stop", "length", "tool_calls", "cancelled", "error"};
    for (size_t k = 0; f && k < sizeof known / sizeof known[0]; k++)
        if (!strcmp(f, known[k]))
            return known[k];
    return "error";
}

void shoal_serve_metrics_request(struct shoal_serve_metrics *m,
                                 const struct shoal_serve_request_stat *r)
{
    const char *ep = shoal_serve_metrics_endpoint(r->endpoint);
    const char *fin = finish_label(r->finish);
    pthread_mutex_lock(&m->mu);
    labeled_add(m->gens, &m->n_gens, ep, fin, 0, 1);
    m->prompt_tokens += (uint64_t)(r->n_prompt > 0 ? r->n_prompt : 0);
    m->cached_tokens += (uint64_t)(r->n_cached > 0 ? r->n_cached : 0);
    m->completion_tokens += (uint64_t)(r->n_gen > 0 ? r->n_gen : 0);
    struct recent *q = &m->recent[m->i_recent];
    memset(q, 0, sizeof *q);
    snprintf(q->id, sizeof q->id, "%s", r->id ? r->id : "");
    q->endpoint = ep;
    q->status = r->status;
    snprintf(q->finish, sizeof q->finish, "%s", fin);
    q->n_prompt = r->n_prompt;
    q->n_cached = r->n_cached;
    q->n_gen = r->n_gen;
    q->ttft_s = r->ttft_s;
    q->tok_per_s = r->tok_per_s;
    q->seconds = r->seconds;
    q->t_end = shoal_time_s();
    m->i_recent = (m->i_recent + 1) % SHOAL_SERVE_RECENT_REQUESTS;
    if (m->n_recent < SHOAL_SERVE_RECENT_REQUESTS)
        m->n_recent++;
    pthread_mutex_unlock(&m->mu);
}

void shoal_serve_metrics_jobs(struct shoal_serve_metrics *m,
                              const struct shoal_serve_job_stat *jobs, int n, int n_queued,
                              int parallel, int queue_cap)
{
    pthread_mutex_lock(&m->mu);
    if (n > m->cap_jobs) {
        m->cap_jobs = n * 2;
        m->jobs = shoal_xrealloc(m->jobs, (size_t)m->cap_jobs * sizeof *m->jobs);
    }
    if (n > 0)
        memcpy(m->jobs, jobs, (size_t)n * sizeof *jobs);
    m->n_jobs = n > 0 ? n : 0;
    m->n_queued = n_queued;
    m->parallel = parallel;
    m->queue_cap = queue_cap;
    pthread_mutex_unlock(&m->mu);
}

/* ---- sampling (the engine thread) ---- */

/* Size the heat map for the model on the first sample; mu held. */
static void heat_init(struct shoal_serve_metrics *m, const struct shoal_model_config *c)
{
    const size_t ne = (size_t)(c->n_layer * c->n_expert);
    m->n_layer = c->n_layer;
    m->n_expert = c->n_expert;
    m->moe = shoal_xcalloc((size_t)c->n_layer + 1, 1);
    for (int64_t il = 0; il < c->n_layer; il++)
        m->moe[il] = (uint8_t)shoal_layer_is_moe(c, il);
    m->heat = shoal_xcalloc(ne * N_HEAT_TIERS + 1, sizeof *m->heat);
    m->total = shoal_xcalloc(ne + 1, sizeof *m->total);
    m->last_worker = shoal_xmalloc(ne + 1);
    memset(m->last_worker, 0xff, ne + 1);
    m->use = shoal_xcalloc(ne * SHOAL_EXPERT_N_TIERS + 1, sizeof *m->use);
    m->use_prev = shoal_xcalloc(ne * SHOAL_EXPERT_N_TIERS + 1, sizeof *m->use_prev);
    m->runs = shoal_xcalloc(ne + 1, sizeof *m->runs);
    m->runs_prev = shoal_xcalloc(ne + 1, sizeof *m->runs_prev);
    m->last_tmp = shoal_xmalloc(ne + 1);
    m->t_heat = shoal_time_s();
}

void shoal_serve_metrics_sample(struct shoal_serve_metrics *m, struct shoal_session *s)
{
    const struct shoal_model *model = s->model;
    const struct shoal_model_config *c = &model->cfg;
    struct shoal_expert_store *store = model->store;
    struct shoal_cluster *cl = s->cluster;
    if (!m->heat) {
        pthread_mutex_lock(&m->mu);
        heat_init(m, c);
        pthread_mutex_unlock(&m->mu);
    }
    const size_t ne = (size_t)(m->n_layer * m->n_expert);
    /* copies taken without m's lock (the store and cluster lock their own) */
    struct shoal_expert_store_stats st;
    if (store) {
        shoal_expert_store_stats_get(store, &st);
        shoal_expert_store_use_get(store, m->use);
    }
    int n_exec = 0;
    struct shoal_cluster_exec_stats ex[SHOAL_CLUSTER_MAX_EXECUTORS];
    if (cl) {
        n_exec = shoal_cluster_n_executors(cl);
        if (n_exec > SHOAL_CLUSTER_MAX_EXECUTORS)
            n_exec = SHOAL_CLUSTER_MAX_EXECUTORS;
        for (int i = 0; i < n_exec; i++)
            shoal_cluster_exec_stats_get(cl, i, &ex[i]);
        shoal_cluster_expert_use_get(cl, m->runs, m->last_tmp);
    }
    const double now = shoal_time_s();

    pthread_mutex_lock(&m->mu);
    m->sampled = 1;
    m->have_store = store != NULL;
    if (store)
        m->store = st;
    m->have_cluster = cl != NULL;
    m->n_exec = n_exec;
    memcpy(m->exec, ex, (size_t)n_exec * sizeof *ex);
    m->t = *shoal_ctx_timings(s->ctx);
    const float f = (float)exp2(-(now - m->t_heat) / SHOAL_SERVE_HEAT_HALF_LIFE_S);
    m->t_heat = now;
    for (size_t i = 0; i < ne; i++) {
        float *h = m->heat + i * N_HEAT_TIERS;
        uint64_t add = 0;
        for (int t = 0; t < SHOAL_EXPERT_N_TIERS; t++) {
            const size_t k = i * SHOAL_EXPERT_N_TIERS + (size_t)t;
            const uint64_t d = store ? m->use[k] - m->use_prev[k] : 0;
            h[t] = h[t] * f + (float)d;
            add += d;
        }
        const uint64_t r = cl ? m->runs[i] - m->runs_prev[i] : 0;
        h[HEAT_WORKER] = h[HEAT_WORKER] * f + (float)r;
        m->total[i] += add + r;
        m->remote_total += r;
    }
    if (cl)
        memcpy(m->last_worker, m->last_tmp, ne);
    pthread_mutex_unlock(&m->mu);
    if (store)
        memcpy(m->use_prev, m->use, ne * SHOAL_EXPERT_N_TIERS * sizeof *m->use);
    if (cl)
        memcpy(m->runs_prev, m->runs, ne * sizeof *m->runs);
}

/* ---- Prometheus text ---- */

/* Running requests and the aggregate decode rate; mu held. */
static void job_totals(const struct shoal_serve_metrics *m, int *running, double *tps)
{
    *running = 0;
    *tps = 0;
    for (int i = 0; i < m->n_jobs; i++) {
        if (m->jobs[i].state == SHOAL_SERVE_JOB_QUEUED)
            continue;
        (*running)++;
        if (m->jobs[i].state == SHOAL_SERVE_JOB_DECODE)
            *tps += m->jobs[i].tok_per_s;
    }
}

static void family(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value escaped as the exposition format asks (\\, \", \n). */
static void label_value(FILE *f, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\' || *v == '"')
            fputc('\\', f);
        if (*v == '\n') {
            fputs("\\n", f);
            continue;
        }
        fputc(*v, f);
    }
}

static void exec_labels(FILE *f, int i, const char *address)
{
    fprintf(f, "{executor=\"%d\",address=\"", i);
    label_value(f, address);
    fputs("\"}", f);
}

void shoal_serve_metrics_step(struct shoal_serve_metrics *m, int prefill,
                              const struct shoal_serve_step_stat *st)
{
    pthread_mutex_lock(&m->mu);
    struct shoal_serve_step_stat *t = &m->step[prefill ? 1 : 0];
    t->steps += st->steps;
    t->rows += st->rows;
    t->acquires += st->acquires;
    t->bytes_read += st->bytes_read;
    t->seconds += st->seconds;
    t->kv_bytes += st->kv_bytes;
    pthread_mutex_unlock(&m->mu);
}

void shoal_serve_metrics_conns(struct shoal_serve_metrics *m, struct serve_conns *conns)
{
    pthread_mutex_lock(&m->mu);
    m->conns = conns;
    pthread_mutex_unlock(&m->mu);
}

char *shoal_serve_metrics_prometheus(struct shoal_serve_metrics *m)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return shoal_xstrdup("");
    pthread_mutex_lock(&m->mu);
    int running;
    double tps;
    job_totals(m, &running, &tps);

    family(f, "shoal_info", "gauge", "The served model (label model); always 1.");
    fputs("shoal_info{model=\"", f);
    label_value(f, m->model_id);
    fputs("\"} 1\n", f);
    family(f, "shoal_start_time_seconds", "gauge", "When the server started, Unix time.");
    fprintf(f, "shoal_start_time_seconds %" PRId64 "\n", m->unix_start);
    family(f, "shoal_requests_total", "counter",
           "HTTP requests answered, by endpoint and status (499: closed before a response).");
    for (int i = 0; i < m->n_http; i++)
        fprintf(f, "shoal_requests_total{endpoint=\"%s\",status=\"%u\"} %" PRIu64 "\n",
                m->http[i].a, m->http[i].code, m->http[i].n);
    family(f, "shoal_generations_total", "counter",
           "Generations the engine ran, by endpoint and how they ended "
           "(stop, length, cancelled, error).");
    for (int i = 0; i < m->n_gens; i++)
        fprintf(f, "shoal_generations_total{endpoint=\"%s\",finish=\"%s\"} %" PRIu64 "\n",
                m->gens[i].a, m->gens[i].b, m->gens[i].n);
    family(f, "shoal_prompt_tokens_total", "counter",
           "Prompt tokens of the generations run (usage.prompt_tokens).");
    fprintf(f, "shoal_prompt_tokens_total %" PRIu64 "\n", m->prompt_tokens);
    family(f, "shoal_prompt_tokens_cached_total", "counter",
           "Of the prompt tokens, those reused from the KV cache (not prefilled).");
    fprintf(f, "shoal_prompt_tokens_cached_total %" PRIu64 "\n", m->cached_tokens);
    family(f, "shoal_completion_tokens_total", "counter",
           "Tokens generated (usage.completion_tokens), cancelled generations included.");
    fprintf(f, "shoal_completion_tokens_total %" PRIu64 "\n", m->completion_tokens);
    family(f, "shoal_requests_running", "gauge", "Requests in prefill or decode now.");
    fprintf(f, "shoal_requests_running %d\n", running);
    family(f, "shoal_requests_queued", "gauge", "Requests waiting for a slot.");
    fprintf(f, "shoal_requests_queued %d\n", m->n_queued);
    family(f, "shoal_parallel_slots", "gauge", "Requests that may generate at once.");
    fprintf(f, "shoal_parallel_slots %d\n", m->parallel);
    family(f, "shoal_queue_capacity", "gauge", "Requests that may wait for a slot.");
    fprintf(f, "shoal_queue_capacity %d\n", m->queue_cap);
    family(f, "shoal_tokens_per_second", "gauge",
           "Aggregate decode rate: the sum of the running requests' tokens per second.");
    fprintf(f, "shoal_tokens_per_second %.3f\n", tps);
    static const char *const step_kind[2] = {"decode", "prefill"};
    static const struct {
        const char *name, *help;
    } step_fam[] = {
        {"shoal_engine_steps_total", "Engine steps (one forward pass over the batch's rows), "
         "by kind: decode rows only, or with prompt rows (prefill)."},
        {"shoal_engine_step_rows_total", "Rows those steps computed (decode tokens, drafts, "
         "prompt tokens)."},
        {"shoal_engine_step_seconds_total", "Wall time of those steps' forward passes."},
        {"shoal_engine_step_expert_acquires_total", "Routed experts the local store "
         "acquired in those steps (one per expert and layer step, for all its rows)."},
        {"shoal_engine_step_expert_bytes_read_total", "Expert bytes the local store read "
         "during those steps (demand and prefetch)."},
        {"shoal_engine_step_kv_bytes_total", "KV cache bytes those steps' rows attend over "
         "(per row and layer, its sequence's cached rows up to its own)."},
    };
    for (size_t k = 0; k < sizeof step_fam / sizeof step_fam[0]; k++) {
        family(f, step_fam[k].name, "counter", step_fam[k].help);
        for (int j = 0; j < 2; j++) {
            const struct shoal_serve_step_stat *st = &m->step[j];
            const double v[] = {(double)st->steps, (double)st->rows, st->seconds,
                                (double)st->acquires, (double)st->bytes_read, st->kv_bytes};
            fprintf(f, "%s{kind=\"%s\"} %.*f\n", step_fam[k].name, step_kind[j],
                    k == 2 ? 6 : 0, v[k]);
        }
    }
    family(f, "shoal_engine_stage_seconds_total", "counter",
           "The engine's time by stage, every step and row (as shoal bench prints it): "
           "attention (norms, projections, RoPE, the KV), routing, experts (routed and "
           "shared FFNs, dense MLPs), expert_wait (of experts: the routed batch-unions), "
           "combine, head, mtp (the MTP layers' drafts).");
    {
        const struct shoal_ctx_timings *t = &m->t;
        const struct {
            const char *stage;
            double s;
        } stage[] = {{"attention", t->attention}, {"routing", t->routing},
                     {"experts", t->experts},     {"expert_wait", t->expert_wait},
                     {"combine", t->combine},     {"head", t->head},
                     {"mtp", t->mtp}};
        for (size_t k = 0; k < sizeof stage / sizeof stage[0]; k++)
            fprintf(f, "shoal_engine_stage_seconds_total{stage=\"%s\"} %.6f\n", stage[k].stage,
                    stage[k].s);
    }
    family(f, "shoal_dashboard_streams", "gauge", "Open /v1/dashboard/events streams.");
    fprintf(f, "shoal_dashboard_streams %d\n", m->n_streams);
    if (m->conns) {
        const struct serve_conns_stats cs = serve_conns_stats(m->conns);
        family(f, "shoal_http_connections", "gauge", "HTTP connections open now.");
        fprintf(f, "shoal_http_connections %d\n", cs.open);
        family(f, "shoal_http_connections_closed_total", "counter",
               "HTTP connections the server closed by its limits: evicted for a new one, "
               "refused (every slot answering a request), head_timeout (request head not "
               "whole in time), body_slow (body below the minimum rate).");
        fprintf(f, "shoal_http_connections_closed_total{reason=\"evicted\"} %" PRIu64 "\n",
                cs.evicted);
        fprintf(f, "shoal_http_connections_closed_total{reason=\"refused\"} %" PRIu64 "\n",
                cs.refused);
        fprintf(f, "shoal_http_connections_closed_total{reason=\"head_timeout\"} %" PRIu64
                "\n", cs.head_timeout);
        fprintf(f, "shoal_http_connections_closed_total{reason=\"body_slow\"} %" PRIu64 "\n",
                cs.body_slow);
    }

    if (m->have_store) {
        const struct shoal_expert_store_stats *s = &m->store;
        family(f, "shoal_expert_acquires_total", "counter",
               "Routed experts acquired by the forward pass, by the tier that served them.");
        fprintf(f, "shoal_expert_acquires_total{tier=\"pinned\"} %" PRIu64 "\n", s->pinned_hits);
        fprintf(f, "shoal_expert_acquires_total{tier=\"cache\"} %" PRIu64 "\n",
                s->cache_hits + s->inflight_hits);
        fprintf(f, "shoal_expert_acquires_total{tier=\"disk\"} %" PRIu64 "\n", s->disk_reads);
        family(f, "shoal_expert_bytes_read_total", "counter",
               "Expert bytes read from disk and verified (demand, prefetch and pins).");
        fprintf(f, "shoal_expert_bytes_read_total %" PRIu64 "\n", s->bytes_read);
        family(f, "shoal_expert_read_seconds_total", "counter",
               "Wall time with at least one expert read in flight.");
        fprintf(f, "shoal_expert_read_seconds_total %.6f\n", s->read_busy_seconds);
        family(f, "shoal_expert_stall_seconds_total", "counter",
               "Wall time the forward pass waited for expert reads.");
        fprintf(f, "shoal_expert_stall_seconds_total %.6f\n", s->stall_seconds);
        family(f, "shoal_expert_prefetch_reads_total", "counter",
               "Expert reads started by router lookahead hints.");
        fprintf(f, "shoal_expert_prefetch_reads_total %" PRIu64 "\n", s->prefetch_reads);
        family(f, "shoal_expert_evictions_total", "counter", "Expert cache evictions.");
        fprintf(f, "shoal_expert_evictions_total %" PRIu64 "\n", s->evictions);
        family(f, "shoal_expert_memory_bytes", "gauge", "Expert bytes in RAM, by tier.");
        fprintf(f, "shoal_expert_memory_bytes{tier=\"pinned\"} %" PRIu64 "\n", s->pinned_bytes);
        fprintf(f, "shoal_expert_memory_bytes{tier=\"cache\"} %" PRIu64 "\n", s->cached_bytes);
        fprintf(f, "shoal_expert_memory_bytes{tier=\"staging\"} %" PRIu64 "\n",
                s->staging_bytes);
    }
    if (m->have_cluster) {
        family(f, "shoal_expert_remote_runs_total", "counter",
               "Routed experts run by cluster workers.");
        fprintf(f, "shoal_expert_remote_runs_total %" PRIu64 "\n", m->remote_total);
        family(f, "shoal_executor_up", "gauge",
               "1 when the executor is up (placement uses it), else 0.");
        for (int i = 0; i < m->n_exec; i++) {
            fputs("shoal_executor_up", f);
            exec_labels(f, i, m->exec[i].address);
            fprintf(f, " %d\n", !strcmp(m->exec[i].state, "up"));
        }
        static const struct {
            const char *name, *type, *help;
            size_t off;
        } fam[] = {
            {"shoal_executor_requests_total", "counter", "Expert requests sent to it.",
             offsetof(struct shoal_cluster_exec_stats, requests)},
            {"shoal_executor_errors_total", "counter", "Its failed requests.",
             offsetof(struct shoal_cluster_exec_stats, errors)},
            {"shoal_executor_reconnects_total", "counter", "Its reconnections.",
             offsetof(struct shoal_cluster_exec_stats, reconnects)},
            {"shoal_executor_sent_bytes_total", "counter", "Bytes sent to it.",
             offsetof(struct shoal_cluster_exec_stats, bytes_sent)},
            {"shoal_executor_received_bytes_total", "counter", "Bytes received from it.",
             offsetof(struct shoal_cluster_exec_stats, bytes_received)},
        };
        for (size_t k = 0; k < sizeof fam / sizeof fam[0]; k++) {
            family(f, fam[k].name, fam[k].type, fam[k].help);
            for (int i = 0; i < m->n_exec; i++) {
                uint64_t v;
                memcpy(&v, (const char *)&m->exec[i] + fam[k].off, sizeof v);
                fputs(fam[k].name, f);
                exec_labels(f, i, m->exec[i].address);
                fprintf(f, " %" PRIu64 "\n", v);
            }
        }
        family(f, "shoal_executor_rtt_seconds", "gauge", "Its last heartbeat round trip.");
        for (int i = 0; i < m->n_exec; i++) {
            fputs("shoal_executor_rtt_seconds", f);
            exec_labels(f, i, m->exec[i].address);
            fprintf(f, " %.6f\n", m->exec[i].rtt_ms / 1e3);
        }
        family(f, "shoal_executor_experts_held", "gauge", "Routed experts its shard holds.");
        for (int i = 0; i < m->n_exec; i++) {
            fputs("shoal_executor_experts_held", f);
            exec_labels(f, i, m->exec[i].address);
            fprintf(f, " %u\n", m->exec[i].experts_held);
        }
    }
    pthread_mutex_unlock(&m->mu);
    fclose(f);
    return buf;
}

/* ---- the dashboard's JSON ---- */

static json_t *jobs_json(const struct shoal_serve_metrics *m, double now)
{
    json_t *a = json_array();
    for (int i = 0; i < m->n_jobs; i++) {
        const struct shoal_serve_job_stat *j = &m->jobs[i];
        json_array_append_new(a, json_pack(
            "{s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:f, s:f}", "id", j->id, "endpoint",
            j->endpoint ? j->endpoint : "", "state", job_state_names[j->state], "n_prompt",
            (json_int_t)j->n_prompt, "n_cached", (json_int_t)j->n_cached, "n_gen",
            (json_int_t)j->n_gen, "max_tokens", (json_int_t)j->max_tokens, "tok_per_s",
            j->tok_per_s, "age_s", now - j->t_received));
    }
    return a;
}

static json_t *recent_json(const struct shoal_serve_metrics *m, double now)
{
    json_t *a = json_array();
    for (int k = 0; k < m->n_recent; k++) {
        /* newest first */
        int i = (m->i_recent - 1 - k + 2 * SHOAL_SERVE_RECENT_REQUESTS) %
                SHOAL_SERVE_RECENT_REQUESTS;
        const struct recent *q = &m->recent[i];
        json_array_append_new(a, json_pack(
            "{s:s, s:s, s:i, s:s, s:I, s:I, s:I, s:f, s:f, s:f, s:f}", "id", q->id, "endpoint",
            q->endpoint, "status", q->status, "finish", q->finish, "n_prompt",
            (json_int_t)q->n_prompt, "n_cached", (json_int_t)q->n_cached, "n_gen",
            (json_int_t)q->n_gen, "ttft_s", q->ttft_s, "tok_per_s", q->tok_per_s, "seconds",
            q->seconds, "ago_s", now - q->t_end));
    }
    return a;
}

/* The executors: the cluster's, or the local store alone. */
static json_t *executors_json(const struct shoal_serve_metrics *m)
{
    json_t *a = json_array();
    if (m->have_cluster) {
        for (int i = 0; i < m->n_exec; i++) {
            const struct shoal_cluster_exec_stats *x = &m->exec[i];
            const int local = !strcmp(x->address, "local");
            json_t *o = json_pack("{s:i, s:s, s:s, s:b, s:I, s:I, s:I, s:I, s:I, s:f, s:I}",
                                  "index", i, "address", x->address, "state", x->state,
                                  "local", local, "requests", (json_int_t)x->requests,
                                  "errors", (json_int_t)x->errors, "reconnects",
                                  (json_int_t)x->reconnects, "bytes_sent",
                                  (json_int_t)x->bytes_sent, "bytes_received",
                                  (json_int_t)x->bytes_received, "rtt_ms", x->rtt_ms,
                                  "experts_held", (json_int_t)x->experts_held);
            if (local && m->have_store)
                json_object_set_new(o, "bytes_read", json_integer((json_int_t)m->store.bytes_read));
            json_array_append_new(a, o);
        }
    } else if (m->have_store) {
        json_array_append_new(a, json_pack("{s:i, s:s, s:s, s:b, s:I}", "index", 0, "address",
                                           "local", "state", "up", "local", 1, "bytes_read",
                                           (json_int_t)m->store.bytes_read));
    }
    return a;
}

static json_t *store_json(const struct shoal_serve_metrics *m)
{
    if (!m->have_store)
        return json_null();
    const struct shoal_expert_store_stats *s = &m->store;
    return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:s, s:i}",
                     "pinned", (json_int_t)s->pinned_hits, "cache",
                     (json_int_t)(s->cache_hits + s->inflight_hits), "disk",
                     (json_int_t)s->disk_reads, "bytes_read", (json_int_t)s->bytes_read,
                     "pinned_bytes", (json_int_t)s->pinned_bytes, "cached_bytes",
                     (json_int_t)s->cached_bytes, "prefetch_reads",
                     (json_int_t)s->prefetch_reads, "evictions", (json_int_t)s->evictions,
                     "read_busy_s", s->read_busy_seconds, "stall_s", s->stall_seconds,
                     "io_engine", s->io_engine ? s->io_engine : "", "queue_depth",
                     s->queue_depth);
}

/* The heat map: per layer, each expert's level (0..100 of the hottest
 * cell's decayed count), dominant tier (-1 none, else an index of tiers)
 * and cumulative count; in a cluster also the worker (executor index)
 * that ran it last, -1 none. */
static json_t *heat_json(const struct shoal_serve_metrics *m)
{
    if (!m->heat || (!m->have_store && !m->have_cluster))
        return json_null();
    const int64_t L = m->n_layer, E = m->n_expert;
    float max = 0;
    for (int64_t i = 0; i < L * E; i++) {
        const float *h = m->heat + i * N_HEAT_TIERS;
        float v = h[0] + h[1] + h[2] + h[3];
        if (v > max)
            max = v;
    }
    json_t *tiers = json_array();
    for (int t = 0; t < N_HEAT_TIERS; t++)
        json_array_append_new(tiers, json_string(tier_names[t]));
    json_t *level = json_array(), *tier = json_array(), *total = json_array();
    json_t *worker = m->have_cluster ? json_array() : NULL;
    json_t *moe = json_array();
    for (int64_t il = 0; il < L; il++) {
        json_t *lv = json_array(), *tr = json_array(), *to = json_array();
        json_t *ex = worker ? json_array() : NULL;
        json_array_append_new(moe, json_boolean(m->moe[il]));
        for (int64_t ie = 0; ie < E; ie++) {
            const int64_t i = il * E + ie;
            const float *h = m->heat + i * N_HEAT_TIERS;
            const float v = h[0] + h[1] + h[2] + h[3];
            int best = -1;
            for (int t = 0; t < N_HEAT_TIERS; t++)
                if (h[t] > 0 && (best < 0 || h[t] > h[best]))
                    best = t;
            int lvl = max > 0 ? (int)lrintf(100.0f * v / max) : 0;
            if (v > 0 && lvl < 1)
                lvl = 1;
            json_array_append_new(lv, json_integer(lvl));
            json_array_append_new(tr, json_integer(best));
            json_array_append_new(to, json_integer((json_int_t)m->total[i]));
            if (ex)
                json_array_append_new(ex, json_integer(m->last_worker[i] == 0xff
                                                           ? -1 : m->last_worker[i]));
        }
        json_array_append_new(level, lv);
        json_array_append_new(tier, tr);
        json_array_append_new(total, to);
        if (worker)
            json_array_append_new(worker, ex);
    }
    json_t *o = json_pack("{s:I, s:I, s:f, s:f, s:o, s:o, s:o, s:o, s:o}", "n_layer",
                          (json_int_t)L, "n_expert", (json_int_t)E, "half_life_s",
                          SHOAL_SERVE_HEAT_HALF_LIFE_S, "max", (double)max, "tiers", tiers,
                          "moe", moe, "level", level, "tier", tier, "total", total);
    if (worker)
        json_object_set_new(o, "worker", worker);
    return o;
}

char *shoal_serve_metrics_json(struct shoal_serve_metrics *m)
{
    const double now = shoal_time_s();
    pthread_mutex_lock(&m->mu);
    int running;
    double tps;
    job_totals(m, &running, &tps);
    uint64_t http_total = 0;
    for (int i = 0; i < m->n_http; i++)
        http_total += m->http[i].n;
    const struct shoal_ctx_timings *t = &m->t;
    json_t *o = json_pack(
        "{s:s, s:I, s:f, s:{s:I, s:i, s:i, s:i, s:i, s:f, s:I, s:I, s:I}, s:o, s:o, s:o, "
        "s:o, s:o, s:{s:f, s:f, s:f, s:f, s:f, s:f, s:f}}",
        "model", m->model_id, "time", (json_int_t)time(NULL), "uptime_s", now - m->t_start,
        "requests", "http_total", (json_int_t)http_total, "running", running, "queued",
        m->n_queued, "parallel", m->parallel, "queue_cap", m->queue_cap, "tok_per_s", tps,
        "prompt_tokens", (json_int_t)m->prompt_tokens, "cached_tokens",
        (json_int_t)m->cached_tokens, "completion_tokens", (json_int_t)m->completion_tokens,
        "jobs", jobs_json(m, now), "recent", recent_json(m, now), "executors",
        executors_json(m), "store", store_json(m), "heat", heat_json(m), "timings",
        "attention", t->attention, "routing", t->routing, "experts", t->experts,
        "expert_wait", t->expert_wait, "network", t->network, "combine", t->combine, "head",
        t->head);
    pthread_mutex_unlock(&m->mu);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s ? s : shoal_xstrdup("{}");
}

/* ---- the event stream ---- */

struct events {
    struct shoal_serve_metrics *m;
    char *buf;                  /* "data: ...\n\n" */
    size_t len, off;
    double next;                /* shoal_time_s() of the next snapshot */
};

/* Wait until the next snapshot is due or the server stops; mu held.
 * Returns 1 when stopping. */
static int events_wait(struct events *ev)
{
    struct shoal_serve_metrics *m = ev->m;
    while (!m->stopping) {
        const double left = ev->next - shoal_time_s();
        if (left <= 0)
            break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        const long ns = ts.tv_nsec + (long)(left * 1e9);
        ts.tv_sec += ns / 1000000000L;
        ts.tv_nsec = ns % 1000000000L;
        pthread_cond_timedwait(&m->cv, &m->mu, &ts);
    }
    return m->stopping;
}

static ssize_t events_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct events *ev = cls;
    if (ev->off == ev->len) {
        pthread_mutex_lock(&ev->m->mu);
        const int stop = events_wait(ev);
        pthread_mutex_unlock(&ev->m->mu);
        if (stop)
            return MHD_CONTENT_READER_END_OF_STREAM;
        char *json = shoal_serve_metrics_json(ev->m);
        const size_t n = strlen(json);
        free(ev->buf);
        ev->buf = shoal_xmalloc(n + 9);
        memcpy(ev->buf, "data: ", 6);
        memcpy(ev->buf + 6, json, n);
        memcpy(ev->buf + 6 + n, "\n\n", 3);
        free(json);
        ev->len = n + 8;
        ev->off = 0;
        ev->next = shoal_time_s() + SHOAL_SERVE_EVENT_PERIOD_MS / 1e3;
    }
    size_t k = ev->len - ev->off;
    if (k > max)
        k = max;
    memcpy(buf, ev->buf + ev->off, k);
    ev->off += k;
    return (ssize_t)k;
}

static void events_free(void *cls)
{
    struct events *ev = cls;
    pthread_mutex_lock(&ev->m->mu);
    ev->m->n_streams--;
    pthread_mutex_unlock(&ev->m->mu);
    free(ev->buf);
    free(ev);
}

struct MHD_Response *shoal_serve_metrics_events(struct shoal_serve_metrics *m)
{
    pthread_mutex_lock(&m->mu);
    const int full = m->n_streams >= SHOAL_SERVE_MAX_EVENT_STREAMS || m->stopping;
    if (!full)
        m->n_streams++;
    pthread_mutex_unlock(&m->mu);
    if (full)
        return NULL;
    struct events *ev = shoal_xcalloc(1, sizeof *ev);
    ev->m = m;
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384,
                                                               events_read, ev, events_free);
    if (!r) {
        events_free(ev);
        return NULL;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    return r;
}

void shoal_serve_metrics_stop(struct shoal_serve_metrics *m)
{
    pthread_mutex_lock(&m->mu);
    m->stopping = 1;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
}
