/* plan_speed: the verdict, memory and tok/s of a planned model
 * (plan_speed.h says what is modelled and why). */
#include "plan_speed.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The mean Lorenz curve of the 18 (layer, domain) routing counts of
 * OLMoE-1B-7B-0924 in ../shared/data/traces/allenai-OLMoE-routing
 * (expert_counts.json: layers 0, 7, 15 x arxiv, book, c4, github,
 * wikipedia, tulu): experts sorted by count, cumulative share at 0, 1/16,
 * ..., 1 of the experts, averaged. tests/reference/test_plan.py recomputes
 * it from the file. The hottest sixteenth takes 22 % of the routings, the
 * hottest half 71 %. */
const double SHOAL_PLAN_SKEW[17] = {
    0.0,    0.2177, 0.3437, 0.4402, 0.5220, 0.5931, 0.6560, 0.7121, 0.7622,
    0.8074, 0.8474, 0.8834, 0.9155, 0.9437, 0.9680, 0.9876, 1.0,
};

static double skew_at(double x)
{
    if (x <= 0)
        return 0;
    if (x >= 1)
        return 1;
    double f = x * 16;
    int i = (int)f;
    return SHOAL_PLAN_SKEW[i] + (f - i) * (SHOAL_PLAN_SKEW[i + 1] - SHOAL_PLAN_SKEW[i]);
}

void shoal_plan_default_shares(int64_t n_expert, double *out)
{
    for (int64_t i = 0; i < n_expert; i++)
        out[i] = skew_at((double)(i + 1) / (double)n_expert) -
                 skew_at((double)i / (double)n_expert);
}

/* xorshift64*: the sampled expected maxima are the same on every run */
static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static double rng_unit(uint64_t *s)
{
    return (double)(rng_next(s) >> 11) / 9007199254740992.0;
}

double shoal_plan_lru_hit(const double *r, int64_t n, double c, double *item_hit)
{
    double rsum = 0;
    for (int64_t i = 0; i < n; i++)
        rsum += r[i];
    const int64_t cap = (int64_t)c;
    if (cap >= n || rsum <= 0 || cap <= 0) {
        double h = cap >= n || rsum <= 0 ? 1 : 0;
        for (int64_t i = 0; item_hit && i < n; i++)
            item_hit[i] = h;
        return h;
    }
    /* an LRU of cap items, asked token by token in the engine's order
     * (item i with probability r[i], layer after layer): a warm-up of three
     * fills, then about 300 000 asks counted */
    int64_t *prev = malloc((size_t)n * sizeof *prev), *next = malloc((size_t)n * sizeof *next);
    uint8_t *in = calloc((size_t)n, 1);
    double *asks = calloc((size_t)n, sizeof *asks), *hits = calloc((size_t)n, sizeof *hits);
    if (!prev || !next || !in || !asks || !hits) {
        free(prev), free(next), free(in), free(asks), free(hits);
        return -1;
    }
    int64_t head = -1, tail = -1, size = 0;
    const int64_t warm = 3 * (int64_t)ceil((double)cap / rsum) + 20;
    int64_t count = (int64_t)ceil(300000.0 / rsum);
    count = count < 200 ? 200 : count > 100000 ? 100000 : count;
    uint64_t seed = 0x2545f4914f6cdd1dull;
    for (int64_t t = 0; t < warm + count; t++) {
        for (int64_t i = 0; i < n; i++) {
            if (rng_unit(&seed) >= r[i])
                continue;
            if (t >= warm) {
                asks[i] += 1;
                hits[i] += in[i];
            }
            if (in[i]) {                       /* to the front */
                if (head == i)
                    continue;
                next[prev[i]] = next[i];
                if (next[i] >= 0)
                    prev[next[i]] = prev[i];
                else
                    tail = prev[i];
            } else {
                in[i] = 1;
                if (++size > cap) {            /* evict the tail */
                    int64_t v = tail;
                    tail = prev[v];
                    next[tail] = -1;
                    in[v] = 0;
                    size--;
                }
            }
            prev[i] = -1;
            next[i] = head;
            if (head >= 0)
                prev[head] = i;
            head = i;
            if (tail < 0)
                tail = i;
        }
    }
    double h = 0, a = 0;
    for (int64_t i = 0; i < n; i++) {
        if (item_hit)
            item_hit[i] = asks[i] > 0 ? hits[i] / asks[i] : 0;
        h += hits[i], a += asks[i];
    }
    free(prev), free(next), free(in), free(asks), free(hits);
    return a > 0 ? h / a : 0;
}

/* Per machine defaults when a field is 0: a desktop of 2025 (dual-channel
 * DDR5, an NVMe SSD, 8 cores); `shoal plan` prints which were assumed. */
#define DEF_MEM_BW 50e9
#define DEF_DISK_BW 3e9
#define DEF_FLOPS 300e9
#define GiB (1024.0 * 1024 * 1024)

static uint64_t default_reserve(uint64_t ram)
{
    uint64_t r = ram / 10;
    uint64_t lo = 1ull << 30, hi = 8ull << 30;
    return r < lo ? lo : r > hi ? hi : r;
}

static void set_bound(struct shoal_plan_time *t)
{
    struct {
        double v;
        const char *name;
    } c[] = {{t->ram, "RAM bandwidth"}, {t->disk, "disk reads"}, {t->link, "link"},
             {t->compute, "compute"}, {t->fixed, "per-layer overhead"}};
    int best = 0;
    for (int i = 1; i < 5; i++)
        if (c[i].v > c[best].v)
            best = i;
    t->bound = c[best].name;
}

/* Seconds the wire takes for one exchange: send[m] bytes out to and
 * recv[m] back from each remote machine m, each over its own link and all
 * through the coordinator's (machine 0), both full duplex. */
static double wire_time(const struct shoal_plan_machine *mc, int first, int M,
                        const double *send, const double *recv)
{
    double t = 0, ss = 0, sr = 0;
    for (int m = first > 0 ? first : 1; m < M; m++) {
        t = fmax(t, fmax(send[m], recv[m]) / mc[m].link_bw);
        ss += send[m], sr += recv[m];
    }
    return fmax(t, fmax(ss, sr) / mc[0].link_bw);
}

/* The prefill of env->prompt tokens into f: per MoE layer the batch-union
 * of experts (item i used with probability 1 - (1 - r_i)^P) read once,
 * its misses from disk (hit NULL: every one) overlapping the compute, which
 * reads the cached part from RAM and runs each routed row at the GEMM rate
 * times SHOAL_PLAN_PREFILL_EFF; the trunk's rows likewise on machine 0,
 * attention's scores and values at a quarter of that rate. */
static void prefill(const struct shoal_plan *o, const struct shoal_plan_env *env,
                    const struct shoal_plan_machine *mc, int first, int S, const double *rate,
                    const double *hit, size_t n, struct shoal_plan_time *f)
{
    const int M = env->n_machine;
    const int64_t L = o->n_moe_layer, E = o->n_expert, k = o->n_expert_used;
    const double blob = (double)o->expert_blob_bytes, eff = SHOAL_PLAN_DECODE_EFF;
    const double geff = SHOAL_PLAN_PREFILL_EFF, row_bytes = 4.0 * (double)o->n_embd;
    const double P = (double)env->prompt;
    double trunk_params = (double)o->params_trunk - (double)o->params_embed -
                          (double)o->params_lm_head;   /* the head runs for the last row */
    if (trunk_params < 0)
        trunk_params = 0;
    f->compute = (2.0 * P * trunk_params + 2.0 * (double)o->params_lm_head) /
                 (mc[0].flops * geff) +
                 (double)o->attn_flops_per_pos * P * P / 2 / (mc[0].flops * geff / 4);
    f->fixed = (double)o->n_layer * SHOAL_PLAN_LAYER_S * 4 + SHOAL_PLAN_PREFILL_START_S;
    for (int64_t l = 0; l < L; l++) {
        double worst = 0, wc = 0, wd = 0, wl = 0;
        double send[SHOAL_PLAN_MAX_MACHINES] = {0}, recv[SHOAL_PLAN_MAX_MACHINES] = {0};
        for (int m = first; m < M; m++) {
            double U = 0, miss = 0;
            for (int64_t i = 0; i < E; i++) {
                double u = 1 - pow(1 - rate[l * E + i], P);
                U += u;
                miss += u * (1 - (hit ? hit[(size_t)m * n + (size_t)(l * E + i)] : 0));
            }
            U /= S, miss /= S;
            double tdisk = miss * blob / mc[m].disk_bw +
                           (miss > 0.01 ? SHOAL_PLAN_DISK_LATENCY_S : 0);
            double tcomp = (U - miss) * blob / (mc[m].mem_bw * eff) +
                           2.0 * P * (double)k / S * (double)o->params_expert_one /
                           (mc[m].flops * geff);
            double rtt = m > 0 ? env->link_rtt : 0;
            if (m > 0) {
                send[m] = P * row_bytes * (1 - pow(1 - 1.0 / S, (double)k));
                recv[m] = P * (double)k / S * row_bytes;
            }
            double t = fmax(tdisk, tcomp) + rtt;
            if (t > worst) {
                worst = t, wl = rtt;
                wc = tdisk > tcomp ? 0 : tcomp;
                wd = tdisk > tcomp ? tdisk : 0;
            }
        }
        f->compute += wc;
        f->disk += wd;
        f->link += wl + (M > 1 ? wire_time(mc, first, M, send, recv) : 0);
    }
    f->total = f->ram + f->disk + f->link + f->compute + f->fixed;
    set_bound(f);
}

#define SAMPLES 512

int shoal_plan_speed(const struct shoal_plan *o, const struct shoal_plan_params *p,
                     const struct shoal_plan_env *env, struct shoal_plan_speed *out,
                     struct shoal_err *err)
{
    (void)p;
    memset(out, 0, sizeof *out);
    const int M = env->n_machine;
    if (M < 1 || M > SHOAL_PLAN_MAX_MACHINES)
        return shoal_err_set(err, SHOAL_EINVAL, "machines: %d, expected 1..%d", M,
                             SHOAL_PLAN_MAX_MACHINES);
    if (!env->coordinator_experts && M < 2)
        return shoal_err_set(err, SHOAL_EINVAL, "--coordinator-experts off needs a second "
                             "machine to serve the experts (--machines 2 or more)");
    if (env->prompt < 1)
        return shoal_err_set(err, SHOAL_EINVAL, "--prompt %lld: expected at least 1 token",
                             (long long)env->prompt);
    if (M > 1 && (env->link_bw <= 0 || env->link_rtt < 0))
        return shoal_err_set(err, SHOAL_EINVAL, "a cluster needs a link rate above 0 and a "
                             "round trip of 0 or more");
    struct shoal_plan_machine mc[SHOAL_PLAN_MAX_MACHINES];
    for (int m = 0; m < M; m++) {
        mc[m] = env->m[m];
        if (mc[m].mem_bw <= 0)
            mc[m].mem_bw = DEF_MEM_BW;
        if (mc[m].disk_bw <= 0)
            mc[m].disk_bw = DEF_DISK_BW;
        if (mc[m].flops <= 0)
            mc[m].flops = DEF_FLOPS;
        if (mc[m].link_bw <= 0)
            mc[m].link_bw = env->link_bw;
    }
    out->n_machine = M;
    out->fits = 1;
    const int64_t L = o->n_moe_layer, E = o->n_expert, k = o->n_expert_used;
    const double blob = (double)o->expert_blob_bytes;
    const uint64_t staging = 2 * (uint64_t)SHOAL_PLAN_QUEUE_DEPTH * o->expert_blob_bytes;
    const int first = env->coordinator_experts ? 0 : 1;
    const int S = M - first;
    out->n_serving = S;
    const uint64_t n_items = (uint64_t)L * (uint64_t)E;

    /* ---- memory ---- */
    for (int m = 0; m < M; m++) {
        struct shoal_plan_mem *mm = &out->mem[m];
        mm->ram = env->m[m].ram;
        mm->reserve = env->reserve ? env->reserve : default_reserve(mm->ram);
        mm->serves = m >= first;
        if (m == 0) {
            mm->trunk = o->trunk_bytes;
            mm->kv = o->kv_budget_bytes;
        }
        mm->staging = mm->serves ? staging : 0;
        uint64_t need = mm->trunk + mm->kv + mm->reserve + mm->staging;
        if (mm->ram < need) {
            if (out->fits) {
                out->fits = 0;
                if (m == 0)
                    snprintf(out->reason, sizeof out->reason,
                             "machine 1 (the coordinator) needs %.2f GiB (trunk %.2f + KV "
                             "%.2f + reserve %.2f + expert staging %.2f) and has %.2f GiB",
                             need / GiB, mm->trunk / GiB, mm->kv / GiB, mm->reserve / GiB,
                             mm->staging / GiB, mm->ram / GiB);
                else
                    snprintf(out->reason, sizeof out->reason,
                             "machine %d needs %.2f GiB (reserve %.2f + expert staging %.2f) "
                             "and has %.2f GiB", m + 1, need / GiB, mm->reserve / GiB,
                             mm->staging / GiB, mm->ram / GiB);
            }
            continue;
        }
        if (!mm->serves)
            continue;
        mm->held = (n_items + (uint64_t)S - 1) / (uint64_t)S;
        mm->cache = mm->ram - need;
        uint64_t fit = mm->cache / o->expert_blob_bytes;
        mm->cache_experts = fit < mm->held ? fit : mm->held;
        mm->cache = mm->cache_experts * o->expert_blob_bytes;
    }
    if (!out->fits || L == 0 || E == 0 || k == 0) {
        /* no MoE layer: the trunk alone */
        if (!out->fits)
            return 0;
    }

    /* ---- routing: rates per (layer, expert), per-item hit per machine ---- */
    const size_t n = (size_t)n_items;
    double *rate = calloc(n ? n : 1, sizeof *rate);
    double *hit = calloc(n ? n * (size_t)M : 1, sizeof *hit);
    double *lhit = calloc((size_t)(L ? L : 1) * (size_t)M, sizeof *lhit);
    if (!rate || !hit || !lhit) {
        free(rate), free(hit), free(lhit);
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    }
    for (int64_t l = 0; l < L; l++) {
        double *row = rate + l * E;
        if (env->shares)
            memcpy(row, env->shares + l * E, (size_t)E * sizeof *row);
        else
            shoal_plan_default_shares(E, row);
        for (int64_t i = 0; i < E; i++)
            row[i] = fmin(1.0, (double)k * row[i]);   /* asks per token */
    }
    double disk_bytes = 0, hit_num = 0;
    for (int m = first; m < M; m++) {
        /* an even split: this machine sees a random 1/S of every layer,
         * which its cache holds as the whole set would hold S times it */
        double c = (double)out->mem[m].cache_experts * S;
        /* a machine caching as many experts as the one before it (identical
         * workers) has its hit rates: the simulation is not run again */
        if (m > first && out->mem[m].cache_experts == out->mem[m - 1].cache_experts)
            memcpy(hit + (size_t)m * n, hit + (size_t)(m - 1) * n, n * sizeof *hit);
        else if (shoal_plan_lru_hit(rate, (int64_t)n, c, hit + (size_t)m * n) < 0) {
            free(rate), free(hit), free(lhit);
            return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        }
        double asked = 0, got = 0;
        for (int64_t l = 0; l < L; l++) {
            double la = 0, lg = 0;
            for (int64_t i = 0; i < E; i++) {
                la += rate[l * E + i];
                lg += rate[l * E + i] * hit[(size_t)m * n + (size_t)(l * E + i)];
            }
            lhit[l * M + m] = la > 0 ? lg / la : 1;
            asked += la, got += lg;
        }
        out->mem[m].hit = asked > 0 ? got / asked : 1;
        hit_num += out->mem[m].hit / S;
        disk_bytes += SHOAL_PLAN_MISS_COST * (1 - out->mem[m].hit) *
                      (double)o->token_expert_bytes / S;
    }
    out->hit = S ? hit_num : 1;
    out->token_disk_bytes = (uint64_t)(disk_bytes + 0.5);

    /* ---- decode: one token at env->prompt of context ---- */
    const double eff = SHOAL_PLAN_DECODE_EFF, row_bytes = 4.0 * (double)o->n_embd;
    struct shoal_plan_time *d = &out->decode;
    d->ram = ((double)o->token_trunk_bytes +
              (double)env->prompt * (double)o->kv_bytes_per_token) / (mc[0].mem_bw * eff);
    d->fixed = (double)o->n_layer * SHOAL_PLAN_LAYER_S;
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    double disk_m[SHOAL_PLAN_MAX_MACHINES] = {0};
    double link_bytes = 0, trips = 0;
    for (int64_t l = 0; l < L; l++) {
        double s_ram = 0, s_link = 0;
        for (int s = 0; s < SAMPLES; s++) {
            double tm[SHOAL_PLAN_MAX_MACHINES] = {0}, td[SHOAL_PLAN_MAX_MACHINES] = {0};
            int cnt[SHOAL_PLAN_MAX_MACHINES] = {0}, miss[SHOAL_PLAN_MAX_MACHINES] = {0};
            for (int64_t j = 0; j < k; j++) {
                int m = first + (int)(rng_unit(&seed) * S);
                if (m >= M)
                    m = M - 1;
                cnt[m]++;
                tm[m] += SHOAL_PLAN_EXPERT_S;
                if (rng_unit(&seed) < lhit[l * M + m]) {
                    tm[m] += blob / (mc[m].mem_bw * eff);
                } else {
                    td[m] += SHOAL_PLAN_MISS_COST * blob / mc[m].disk_bw;
                    miss[m] = 1;
                }
            }
            /* RAM and the round trip: the layer waits for the slowest
             * machine; disk reads run on across layers (the lookahead's
             * prefetch keeps each disk busy), so they add up per machine */
            double worst = 0, wl = 0, wire = 0;
            double send[SHOAL_PLAN_MAX_MACHINES] = {0}, recv[SHOAL_PLAN_MAX_MACHINES] = {0};
            for (int m = first; m < M; m++) {
                if (!cnt[m])
                    continue;
                disk_m[m] += (td[m] + (miss[m] ? SHOAL_PLAN_DISK_LATENCY_S : 0)) / SAMPLES;
                double rtt = m > 0 ? env->link_rtt : 0;
                if (m > 0) {
                    send[m] = row_bytes;
                    recv[m] = cnt[m] * row_bytes;
                    wire += send[m] + recv[m];
                    trips += 1.0 / SAMPLES;
                }
                if (tm[m] + rtt > worst)
                    worst = tm[m] + rtt, wl = rtt;
            }
            link_bytes += wire / SAMPLES;
            s_ram += worst - wl;
            s_link += wl + (M > 1 ? wire_time(mc, first, M, send, recv) : 0);
        }
        d->ram += s_ram / SAMPLES;
        d->link += s_link / SAMPLES;
    }
    for (int m = first; m < M; m++)
        d->disk = fmax(d->disk, disk_m[m]);
    /* the disks read on while RAM, compute and the wire work (the
     * lookahead's prefetch): the longer of the two, plus the part the
     * prefetch does not reach (its misses are read on demand) */
    const double rest = d->ram + d->link + d->compute + d->fixed;
    d->total = fmax(d->disk, rest) + SHOAL_PLAN_OVERLAP_LOSS * fmin(d->disk, rest);
    set_bound(d);
    out->token_link_bytes = (uint64_t)(link_bytes + 0.5);
    out->round_trips = trips;
    out->decode_tps = d->total > 0 ? 1.0 / d->total : 0;

    /* ---- prefill: env->prompt tokens at once, with the caches in their
     * steady state and (cold) empty ---- */
    for (int cold = 0; cold < 2; cold++) {
        struct shoal_plan_time *f = cold ? &out->prefill_cold : &out->prefill;
        prefill(o, env, mc, first, S, rate, cold ? NULL : hit, n, f);
        if (cold)
            out->prefill_cold_tps = f->total > 0 ? (double)env->prompt / f->total : 0;
        else
            out->prefill_tps = f->total > 0 ? (double)env->prompt / f->total : 0;
    }
    free(rate), free(hit), free(lhit);
    return 0;
}
