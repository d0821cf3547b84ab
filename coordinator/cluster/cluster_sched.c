/* cluster_sched: placement of a MoE layer's batch-union on the executors,
 * the requests, and failure handling within the layer step (see cluster.h).
 * Runs on the forward thread; talks to the loop through cluster.c's
 * outbox and the pending table. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cluster.h"
#include "cluster_impl.h"
#include "expert_store.h"
#include "log.h"
#include "placement.h"
#include "util.h"

#define NET_BYTES_PER_S 1e9          /* transfer estimate of hidden/out rows */
#define HINT_QUEUE_MAX (8u << 20)    /* skip hints to a peer with this much queued */
#define WARM_MIN_RUNS 2              /* remote runs before an expert's other holders warm it */
#define SHOAL_CLUSTER_MAX_EXPERT_BITS 1024   /* the local store's bitmap: 8192 experts */

/* ------------------------------------------------------------ snapshot */

/* Record executor x's RAM for layer il as reported: bits and loading,
 * n_expert bits each (any other length is ignored: an older worker sends
 * none; loading may be absent). Main thread. */
static void note_resident(struct shoal_cluster *cl, int x, int64_t il, const ProtobufCBinaryData *bits,
                          const ProtobufCBinaryData *loading)
{
    const size_t nb = (size_t)((cl->n_expert + 7) / 8);
    if (il < 0 || il >= cl->n_layer || !cl->is_moe[il] || bits->len != nb || !bits->data)
        return;
    struct exec *e = &cl->exec[x];
    if (!e->resident) {
        e->resident = shoal_xcalloc((size_t)cl->n_layer * nb, 1);
        e->loading = shoal_xcalloc((size_t)cl->n_layer * nb, 1);
        e->resident_known = shoal_xcalloc((size_t)cl->n_layer, 1);
        e->resident_at = shoal_xcalloc((size_t)cl->n_layer, sizeof *e->resident_at);
    }
    memcpy(e->resident + (size_t)il * nb, bits->data, nb);
    if (loading->len == nb && loading->data)
        memcpy(e->loading + (size_t)il * nb, loading->data, nb);
    else
        memset(e->loading + (size_t)il * nb, 0, nb);
    e->resident_known[il] = 1;
    e->resident_at[il] = shoal_cluster_now();
}

/* Seconds of reads still ahead of executor x's disk for layer il when it
 * last reported (the experts being read there, at its disk's rate, less the
 * time since): placement's sunk work, whichever executor gets what. */
static double sunk_reads(const struct shoal_cluster *cl, const struct cluster_snap *s, int x,
                         int64_t il)
{
    const struct exec *e = &cl->exec[x];
    if (!e->resident_known || !e->resident_known[il])
        return 0.0;
    const size_t nb = (size_t)((cl->n_expert + 7) / 8);
    const uint8_t *ld = e->loading + (size_t)il * nb;
    int n = 0;
    for (size_t i = 0; i < nb; i++)
        n += __builtin_popcount(ld[i]);
    const double t = (double)n * (double)cl->blob_bytes / s->disk[x] -
                     (shoal_cluster_now() - e->resident_at[il]);
    return t > 0 ? t : 0.0;
}

/* Copy what placement needs about every executor for layer il. */
static void snapshot(struct shoal_cluster *cl, struct cluster_snap *s, int64_t il)
{
    const int64_t NE = cl->n_expert;
    pthread_mutex_lock(&cl->mu);
    s->n = cl->n_exec;
    s->il = il;
    for (int i = 0; i < s->n; i++) {
        struct exec *x = &cl->exec[i];
        if (x->kind == EXEC_LOCAL && cl->model->store) {
            /* the local store's disk as its reads achieved it, as for workers */
            struct shoal_expert_store_stats st;
            shoal_expert_store_stats_get(cl->model->store, &st);
            if (st.bytes_read >= 8u << 20 && st.read_busy_seconds > 0.005)
                x->disk_mbps_seen = (double)st.bytes_read / 1e6 / st.read_busy_seconds;
        }
        s->up[i] = x->kind == EXEC_LOCAL || (x->state == EXEC_UP && !x->faulty);
        s->gen[i] = x->gen;
        s->max_frame[i] = x->max_frame ? x->max_frame : SHOAL_WIRE_MAX_FRAME_DEFAULT;
        s->rtt_s[i] = x->kind == EXEC_LOCAL ? 0.0 : x->rtt_ms / 1e3;
        const double mbps = x->disk_mbps_seen > 0 ? x->disk_mbps_seen : x->disk_mbps;
        s->disk[i] = (mbps > 0 ? mbps : CLUSTER_DEFAULT_DISK_MBPS) * 1e6;
        const double gbps = x->compute_gbps_seen > 0 ? x->compute_gbps_seen : x->compute_gbps;
        s->compute[i] = (gbps > 0 ? gbps : CLUSTER_DEFAULT_COMPUTE_GBPS) * 1e9;
        double blob = (double)(cl->blob_bytes ? cl->blob_bytes : 1);
        s->weight[i] = 1.0 / (blob / s->disk[i] + blob / s->compute[i]);
        s->write_queue[i] = x->write_queue;
        if (x->reset_assigned && x->assigned) {
            memset(x->assigned, 0, (size_t)(cl->n_layer * NE));
            x->assigned_bytes = 0;
            if (x->resident_known)
                memset(x->resident_known, 0, (size_t)cl->n_layer);
            x->reset_assigned = 0;
        }
        uint8_t *row = s->holds + (size_t)i * (size_t)NE;
        if (x->holds)
            memcpy(row, x->holds + il * NE, (size_t)NE);
        else
            memset(row, 0, (size_t)NE);
    }
    pthread_mutex_unlock(&cl->mu);
    if (cl->local >= 0 && cl->model->store) {
        uint8_t bits[2][SHOAL_CLUSTER_MAX_EXPERT_BITS];
        const size_t nb = (size_t)((NE + 7) / 8);
        if (nb <= sizeof bits[0] &&
            shoal_expert_store_resident_bits(cl->model->store, il, bits[0], bits[1]) == 0)
            note_resident(cl, cl->local, il, &(ProtobufCBinaryData){.data = bits[0], .len = nb},
                          &(ProtobufCBinaryData){.data = bits[1], .len = nb});
    }
}

static int holds(const struct shoal_cluster *cl, const struct cluster_snap *s, int x,
                 int64_t ie)
{
    return s->holds[(size_t)x * (size_t)cl->n_expert + (size_t)ie];
}

/* ------------------------------------------------------------ placement */

/* 1 when placement believes expert (il, ie) is in x's RAM. */
static int cached(const struct shoal_cluster *cl, int x, int64_t il, int64_t ie)
{
    const struct exec *e = &cl->exec[x];
    if (e->resident_known && e->resident_known[il])
        return e->resident[il * ((cl->n_expert + 7) / 8) + (ie >> 3)] >> (ie & 7) & 1;
    if (!e->assigned[il * cl->n_expert + ie])
        return 0;
    return e->cache_bytes == UINT64_MAX || e->assigned_bytes <= e->cache_bytes;
}

/* Estimated seconds for executor x to run union entry u (rows routed). */
static double cost(const struct shoal_cluster *cl, const struct cluster_snap *s, int x,
                   int64_t il, int64_t ie, int64_t rows)
{
    const double blob = (double)cl->blob_bytes;
    double t = blob / s->compute[x] * (1.0 + (double)(rows - 1) / 8.0);
    if (!cached(cl, x, il, ie))
        t += blob / s->disk[x];
    if (x != cl->local)
        t += (double)rows * (double)cl->n_embd * 8.0 / NET_BYTES_PER_S;
    return t;
}

/* Why executor x is out of this step (for the no-holder message). */
struct step_state {
    uint64_t bad;                               /* bit x: excluded in this step */
    char why[SHOAL_CLUSTER_MAX_EXECUTORS][200];
};

static int no_holder(struct shoal_cluster *cl, const struct step_state *ss, int64_t il,
                     int64_t ie, struct shoal_err *err)
{
    char list[600] = "";
    size_t o = 0;
    pthread_mutex_lock(&cl->mu);
    for (int i = 0; i < cl->n_exec && o < sizeof list - 1; i++) {
        const struct exec *x = &cl->exec[i];
        const char *why = NULL;
        if (ss->bad >> i & 1)
            why = ss->why[i];
        else if (x->kind != EXEC_LOCAL && (x->state != EXEC_UP || x->faulty))
            why = x->last_error[0] ? x->last_error : shoal_cluster_state_name(x);
        else
            continue;
        int known = x->kind == EXEC_LOCAL ? 1 : x->holds != NULL;
        if (known && !x->holds[il * cl->n_expert + ie])
            continue;   /* never held it */
        int w = snprintf(list + o, sizeof list - o, "%s%s (%s)", o ? ", " : "", x->addr, why);
        o = w > 0 && (size_t)w < sizeof list - o ? o + (size_t)w : sizeof list - 1;
    }
    pthread_mutex_unlock(&cl->mu);
    return shoal_err_set(err, SHOAL_ENOTFOUND, "layer %lld expert %lld: no holder left (%s%s)",
                         (long long)il, (long long)ie, list[0] ? "down: " : "",
                         list[0] ? list : "no executor that is up holds it");
}

/* A small step (a decode token's top-k) placed exactly: every choice of a
 * holder per entry is tried (at most EXACT_MAX_CHOICES assignments of at
 * most EXACT_MAX_ENTRIES entries) and the one with the earliest estimated
 * end kept (cost(), the reads under way, one RTT per remote executor
 * used), ties to the one that keeps the most entries where rendezvous put
 * them. Spill-over's one-move steps stall where two executors tie for the
 * latest: 3 + 3 reads on two of four disks stay there. Returns 1 and
 * rewrites assign[] when it ran, 0 when the step is too large (spill-over's
 * then). */
#define EXACT_MAX_ENTRIES 16
#define EXACT_MAX_CHOICES 4096
static int place_exact(struct shoal_cluster *cl, const struct cluster_snap *s,
                       const struct step_state *ss, const uint64_t *avoid, int64_t il,
                       const struct shoal_batch_union *bu, const int64_t *todo, int64_t n,
                       int *assign)
{
    const int N = s->n;
    if (n > EXACT_MAX_ENTRIES)
        return 0;
    int cand[EXACT_MAX_ENTRIES][SHOAL_CLUSTER_MAX_EXECUTORS];
    double c[EXACT_MAX_ENTRIES][SHOAL_CLUSTER_MAX_EXECUTORS];
    int nc[EXACT_MAX_ENTRIES], pick[EXACT_MAX_ENTRIES], best[EXACT_MAX_ENTRIES];
    double combos = 1;
    for (int64_t i = 0; i < n; i++) {
        const int64_t u = todo[i], ie = bu->expert[u];
        const int64_t rows = bu->slot_begin[u + 1] - bu->slot_begin[u];
        nc[i] = 0;
        for (int x = 0; x < N; x++)
            if (s->up[x] && !((ss->bad | avoid[u]) >> x & 1) && holds(cl, s, x, ie)) {
                cand[i][nc[i]] = x;
                c[i][nc[i]] = cost(cl, s, x, il, ie, rows);
                nc[i]++;
            }
        if (nc[i] == 0)
            return 0;
        combos *= nc[i];
        if (combos > EXACT_MAX_CHOICES)
            return 0;
    }
    double base[SHOAL_CLUSTER_MAX_EXECUTORS];
    for (int x = 0; x < N; x++)
        base[x] = s->up[x] ? sunk_reads(cl, s, x, il) : 0.0;
    double best_end = INFINITY;
    int best_kept = -1;
    memset(pick, 0, sizeof pick);
    for (;;) {
        double t[SHOAL_CLUSTER_MAX_EXECUTORS];
        int used[SHOAL_CLUSTER_MAX_EXECUTORS] = {0};
        memcpy(t, base, (size_t)N * sizeof *t);
        int kept = 0;
        for (int64_t i = 0; i < n; i++) {
            const int x = cand[i][pick[i]];
            t[x] += c[i][pick[i]];
            used[x] = 1;
            kept += x == assign[todo[i]];
        }
        double end = 0;
        for (int x = 0; x < N; x++) {
            if (used[x])
                t[x] += s->rtt_s[x];
            end = t[x] > end ? t[x] : end;
        }
        if (end < best_end * (1 - 1e-9) || (end <= best_end * (1 + 1e-9) && kept > best_kept)) {
            best_end = end;
            best_kept = kept;
            memcpy(best, pick, (size_t)n * sizeof *best);
        }
        int64_t i = 0;   /* the next choice, odometer-wise */
        while (i < n && ++pick[i] == nc[i])
            pick[i++] = 0;
        if (i == n)
            break;
    }
    for (int64_t i = 0; i < n; i++)
        assign[todo[i]] = cand[i][best[i]];
    return 1;
}

/* Place union entries todo[0..n) of layer il: weighted rendezvous over the
 * holders that are up, not excluded and not in avoid[u] (bit x: x's answer
 * for entry u is being checked), then spill-over. Writes assign[u].
 * Returns 0 or -SHOAL_ENOTFOUND (no holder, err set). */
static int place(struct shoal_cluster *cl, const struct cluster_snap *s,
                 const struct step_state *ss, const uint64_t *avoid, int64_t il,
                 const struct shoal_batch_union *bu, const int64_t *todo, int64_t n,
                 int *assign, struct shoal_err *err)
{
    const int N = s->n;
    uint64_t seeds[SHOAL_CLUSTER_MAX_EXECUTORS];
    double weights[SHOAL_CLUSTER_MAX_EXECUTORS];
    int cand[SHOAL_CLUSTER_MAX_EXECUTORS];
    double t[SHOAL_CLUSTER_MAX_EXECUTORS] = {0};
    int cnt[SHOAL_CLUSTER_MAX_EXECUTORS] = {0};
    for (int64_t i = 0; i < n; i++) {
        const int64_t u = todo[i], ie = bu->expert[u];
        int nc = 0;
        for (int x = 0; x < N; x++)
            if (s->up[x] && !((ss->bad | avoid[u]) >> x & 1) && holds(cl, s, x, ie)) {
                cand[nc] = x;
                seeds[nc] = cl->exec[x].seed;
                weights[nc] = s->weight[x];
                nc++;
            }
        if (nc == 0)
            return no_holder(cl, ss, il, ie, err);
        int b = shoal_placement_best(shoal_placement_key(il, ie), seeds, weights, nc, 0);
        assign[u] = cand[b < 0 ? 0 : b];
    }
    if (N < 2 || place_exact(cl, s, ss, avoid, il, bu, todo, n, assign))
        return 0;
    /* spill-over: estimated finish time per executor; move an expert off the
     * latest one while that shortens the layer by more than moving it costs
     * (its read from disk where it is not cached yet) */
    for (int64_t i = 0; i < n; i++) {
        const int64_t u = todo[i];
        const int x = assign[u];
        const int64_t rows = bu->slot_begin[u + 1] - bu->slot_begin[u];
        t[x] += cost(cl, s, x, il, bu->expert[u], rows);
        cnt[x]++;
    }
    for (int x = 0; x < N; x++) {
        if (cnt[x])
            t[x] += s->rtt_s[x];
        if (s->up[x])
            t[x] += sunk_reads(cl, s, x, il);
    }
    for (int64_t iter = 0; iter < n; iter++) {
        int m = 0;
        for (int x = 1; x < N; x++)
            if (t[x] > t[m])
                m = x;
        const double makespan = t[m];
        double best_gain = 0;
        int64_t best_u = -1;
        int best_x = -1;
        double best_tm = 0, best_tx = 0;
        for (int64_t i = 0; i < n; i++) {
            const int64_t u = todo[i], ie = bu->expert[u];
            if (assign[u] != m)
                continue;
            const int64_t rows = bu->slot_begin[u + 1] - bu->slot_begin[u];
            const double tm = t[m] - cost(cl, s, m, il, ie, rows) -
                              (cnt[m] == 1 ? s->rtt_s[m] : 0.0);
            for (int x = 0; x < N; x++) {
                if (x == m || !s->up[x] || ((ss->bad | avoid[u]) >> x & 1) ||
                    !holds(cl, s, x, ie))
                    continue;
                const double tx = t[x] + cost(cl, s, x, il, ie, rows) +
                                  (cnt[x] == 0 ? s->rtt_s[x] : 0.0);
                double ms = tm > tx ? tm : tx;
                for (int y = 0; y < N; y++)
                    if (y != m && y != x && t[y] > ms)
                        ms = t[y];
                /* tx already counts x's read of the expert; moving costs
                 * more only when it leaves the copy m has cached (the next
                 * use may find it at neither) */
                const double move = cached(cl, m, il, ie) && !cached(cl, x, il, ie)
                                        ? (double)cl->blob_bytes / s->disk[x] : 0.0;
                const double gain = makespan - ms - move;
                if (gain > best_gain) {
                    best_gain = gain;
                    best_u = u;
                    best_x = x;
                    best_tm = tm;
                    best_tx = tx;
                }
            }
        }
        if (best_u < 0)
            break;
        assign[best_u] = best_x;
        t[m] = best_tm;
        t[best_x] = best_tx;
        cnt[m]--;
        cnt[best_x]++;
    }
    return 0;
}

/* ------------------------------------------------------------ row splitting */

#define SPLIT_MIN_ROWS 4       /* an entry with fewer rows is never split */
#define SPLIT_MIN_GAIN 0.02    /* a split must shorten the step by this share */

/* The pieces of a layer step: each union entry whole, or its rows cut into
 * contiguous runs of its slots, one per holder (issue 33). wb is a
 * batch-union over the same slots (wb.slots = bu->slots), so requests,
 * answers, failover and the non-finite checks work on pieces as they did
 * on entries; every row still gets the output of its own expert, computed
 * by a kernel whose row results do not depend on the other rows
 * (tests/unit/test_batching.c), and the combine stays in route order. */
struct pieces {
    struct shoal_batch_union wb;   /* expert [cap], slot_begin [cap + 1]; slots borrowed */
    int *assign;                   /* [cap] executor per piece (round 0) */
    int64_t cap;
    int64_t n_split, split_rows;   /* entries split, rows they held */
};

/* Estimated finish times t[x] and entry counts cnt[x] of an assignment of
 * entries todo[0..n) (place()'s model: costs plus one RTT per executor used). */
static void loads(struct shoal_cluster *cl, const struct cluster_snap *s, int64_t il,
                  const struct shoal_batch_union *bu, const int64_t *todo, int64_t n,
                  const int *assign, double *t, int *cnt)
{
    for (int x = 0; x < s->n; x++) {
        t[x] = 0;
        cnt[x] = 0;
    }
    for (int64_t i = 0; i < n; i++) {
        const int64_t u = todo[i], x = assign[u];
        t[x] += cost(cl, s, (int)x, il, bu->expert[u], bu->slot_begin[u + 1] - bu->slot_begin[u]);
        cnt[x]++;
    }
    for (int x = 0; x < s->n; x++) {
        if (cnt[x])
            t[x] += s->rtt_s[x];
        if (s->up[x])
            t[x] += sunk_reads(cl, s, x, il);
    }
}

/* Split the entries of bu (placed whole in assign, round 0: nothing
 * excluded yet) whose rows shorten the step when shared among their up
 * holders in proportion to their speed: per entry, largest first, the rows
 * go to the holders by water-filling the estimated finish times (a holder's
 * fixed cost: one pass over the weights, plus its read when the cache model
 * says it lacks the expert, plus its RTT when it had nothing; then a cost
 * per row), kept when the step's makespan drops by SPLIT_MIN_GAIN. Writes
 * pc->wb and pc->assign. */
static void split_rows(struct shoal_cluster *cl, const struct cluster_snap *s, int64_t il,
                       const struct shoal_batch_union *bu, const int *assign,
                       struct pieces *pc)
{
    const int N = s->n;
    const int64_t nu = bu->n_used;
    double t[SHOAL_CLUSTER_MAX_EXECUTORS], c[SHOAL_CLUSTER_MAX_EXECUTORS],
        f[SHOAL_CLUSTER_MAX_EXECUTORS];
    int cnt[SHOAL_CLUSTER_MAX_EXECUTORS], H[SHOAL_CLUSTER_MAX_EXECUTORS];
    int64_t r[SHOAL_CLUSTER_MAX_EXECUTORS];
    int64_t *order = shoal_xmalloc((size_t)(nu > 0 ? nu : 1) * sizeof *order);
    int64_t *part_n = shoal_xcalloc((size_t)(nu > 0 ? nu : 1), sizeof *part_n);
    int64_t *part_r = shoal_xcalloc((size_t)(nu > 0 ? nu : 1) * (size_t)N, sizeof *part_r);
    int *part_x = shoal_xcalloc((size_t)(nu > 0 ? nu : 1) * (size_t)N, sizeof *part_x);
    for (int64_t u = 0; u < nu; u++)
        order[u] = u;
    loads(cl, s, il, bu, order, nu, assign, t, cnt);
    /* largest entries first (ties: the lower entry) */
    for (int64_t i = 1; i < nu; i++)
        for (int64_t j = i; j > 0; j--) {
            const int64_t a = order[j - 1], b = order[j];
            const int64_t ra = bu->slot_begin[a + 1] - bu->slot_begin[a],
                          rb = bu->slot_begin[b + 1] - bu->slot_begin[b];
            if (ra >= rb)
                break;
            order[j - 1] = b;
            order[j] = a;
        }
    pc->n_split = pc->split_rows = 0;
    const double blob = (double)cl->blob_bytes;
    const int always = cl->p.split_rows == SHOAL_CLUSTER_SPLIT_ALWAYS;
    for (int64_t i = 0; i < nu && N > 1 && cl->p.split_rows != SHOAL_CLUSTER_SPLIT_OFF; i++) {
        const int64_t u = order[i], ie = bu->expert[u];
        const int64_t rows = bu->slot_begin[u + 1] - bu->slot_begin[u];
        if (rows < SPLIT_MIN_ROWS)
            break;   /* sorted: every later one is smaller */
        double M = 0;
        for (int x = 0; x < N; x++)
            M = t[x] > M ? t[x] : M;
        /* take u off its executor, then water-fill its rows */
        const int x0 = assign[u];
        double t0[SHOAL_CLUSTER_MAX_EXECUTORS];
        memcpy(t0, t, sizeof t0);
        t0[x0] -= cost(cl, s, x0, il, ie, rows) + (cnt[x0] == 1 ? s->rtt_s[x0] : 0.0);
        int nh = 0;
        double hi = 0;
        for (int x = 0; x < N; x++) {
            if (!s->up[x] || !holds(cl, s, x, ie))
                continue;
            c[x] = blob / s->compute[x] / 8.0 +
                   (x != cl->local ? (double)cl->n_embd * 8.0 / NET_BYTES_PER_S : 0.0);
            f[x] = cost(cl, s, x, il, ie, 1) - c[x] +
                   ((x == x0 ? cnt[x] == 1 : cnt[x] == 0) ? s->rtt_s[x] : 0.0);
            if (always) {   /* rows in proportion to speed alone */
                f[x] = 0;
                t0[x] = 0;
            }
            const double all = t0[x] + f[x] + (double)rows * c[x];
            hi = nh == 0 || all < hi ? all : hi;   /* every row on one holder */
            H[nh++] = x;
        }
        if (nh < 2)
            continue;
        double lo = 0;
        int64_t got = 0;
        for (int it = 0; it < 60; it++) {
            const double mid = 0.5 * (lo + hi);
            got = 0;
            for (int h = 0; h < nh; h++) {
                const double v = (mid - t0[H[h]] - f[H[h]]) / c[H[h]];
                got += v >= 1 ? (v >= (double)rows ? rows : (int64_t)v) : 0;
            }
            if (got >= rows)
                hi = mid;
            else
                lo = mid;
        }
        got = 0;
        for (int h = 0; h < nh; h++) {
            const double v = (hi - t0[H[h]] - f[H[h]]) / c[H[h]];
            r[h] = v >= 1 ? (v >= (double)rows ? rows : (int64_t)v) : 0;
            got += r[h];
        }
        /* rounding: take the excess from the holders that finish last,
         * give a shortfall to the first that finish */
        while (got != rows) {
            int b = -1;
            double bt = 0;
            for (int h = 0; h < nh; h++) {
                if (got > rows && r[h] == 0)
                    continue;
                const double fin = t0[H[h]] + f[H[h]] + (double)(r[h] + (got < rows)) * c[H[h]];
                if (b < 0 || (got > rows ? fin > bt : fin < bt)) {
                    b = h;
                    bt = fin;
                }
            }
            r[b] += got > rows ? -1 : 1;
            got += got > rows ? -1 : 1;
        }
        int used = 0;
        double M2 = 0;
        double t2[SHOAL_CLUSTER_MAX_EXECUTORS];
        memcpy(t2, t0, sizeof t2);
        for (int h = 0; h < nh; h++)
            if (r[h] > 0) {
                t2[H[h]] += f[H[h]] + (double)r[h] * c[H[h]];
                used++;
            }
        for (int x = 0; x < N; x++)
            M2 = t2[x] > M2 ? t2[x] : M2;
        if (used < 2 || (!always && !(M2 < M * (1.0 - SPLIT_MIN_GAIN))))
            continue;
        if (always) {   /* the finish times as they will be */
            memcpy(t2, t, sizeof t2);
            t2[x0] -= cost(cl, s, x0, il, ie, rows) + (cnt[x0] == 1 ? s->rtt_s[x0] : 0.0);
            for (int h = 0; h < nh; h++)
                if (r[h] > 0)
                    t2[H[h]] += cost(cl, s, H[h], il, ie, r[h]) +
                                (cnt[H[h]] - (H[h] == x0) == 0 ? s->rtt_s[H[h]] : 0.0);
        }
        memcpy(t, t2, sizeof t2);
        cnt[x0]--;
        for (int h = 0; h < nh; h++)
            if (r[h] > 0) {
                cnt[H[h]]++;
                part_x[u * N + part_n[u]] = H[h];
                part_r[u * N + part_n[u]] = r[h];
                part_n[u]++;
            }
        pc->n_split++;
        pc->split_rows += rows;
    }
    /* the pieces, entry by entry in union order */
    int64_t np = 0;
    struct shoal_batch_union *wb = &pc->wb;
    wb->slots = bu->slots;
    wb->count = NULL;
    for (int64_t u = 0; u < nu; u++) {
        int64_t b = bu->slot_begin[u];
        if (!part_n[u]) {
            wb->expert[np] = bu->expert[u];
            wb->slot_begin[np] = b;
            pc->assign[np++] = assign[u];
            continue;
        }
        for (int64_t k = 0; k < part_n[u]; k++) {
            wb->expert[np] = bu->expert[u];
            wb->slot_begin[np] = b;
            pc->assign[np++] = part_x[u * N + k];
            b += part_r[u * N + k];
        }
    }
    wb->slot_begin[np] = bu->slot_begin[nu];
    wb->n_used = np;
    free(order);
    free(part_n);
    free(part_r);
    free(part_x);
}

/* Remember that union entry u now lives on x (cache model). */
static void note_assigned(struct shoal_cluster *cl, int x, int64_t il, int64_t ie)
{
    struct exec *e = &cl->exec[x];
    uint8_t *a = &e->assigned[il * cl->n_expert + ie];
    if (!*a) {
        *a = 1;
        e->assigned_bytes += cl->blob_bytes;
    }
}

/* ------------------------------------------------------------ requests */

struct req {
    int x;
    uint64_t id;
    uint64_t gen;
    int64_t first, n;        /* its union entries: ord[first .. first+n) */
    uint64_t total_rows;
    uint64_t sent_ns;
};

static void grow_scratch(struct shoal_cluster *cl, int64_t n_tok, int64_t n_slots)
{
    if (n_tok > cl->n_tok_cap) {
        free(cl->tokmap);
        free(cl->hidden);
        cl->tokmap = shoal_xmalloc((size_t)n_tok * sizeof *cl->tokmap);
        cl->hidden = shoal_xmalloc((size_t)n_tok * (size_t)cl->n_embd * sizeof(float));
        cl->n_tok_cap = n_tok;
    }
    if (n_slots > cl->n_slot_cap) {
        free(cl->rows);
        cl->rows = shoal_xmalloc((size_t)n_slots * sizeof *cl->rows);
        cl->n_slot_cap = n_slots;
    }
}

static struct pending *pending_add(struct shoal_cluster *cl)
{
    for (int i = 0; i < cl->n_pend; i++)
        if (!cl->pend[i].id)
            return &cl->pend[i];
    if (cl->n_pend == cl->cap_pend) {
        cl->cap_pend = cl->cap_pend ? cl->cap_pend * 2 : 16;
        cl->pend = shoal_xrealloc(cl->pend, (size_t)cl->cap_pend * sizeof *cl->pend);
    }
    struct pending *p = &cl->pend[cl->n_pend++];
    memset(p, 0, sizeof *p);
    return p;
}

/* Build, pack and post the request of executor r->x for union entries
 * ord[r->first ..]: only the rows those experts need, re-indexed in token
 * order; per expert its rows in route order. Returns 0 or a negative
 * status (frame too large) with err set; nothing is posted then. */
static int send_request(struct shoal_cluster *cl, const struct shoal_cluster_layer *L,
                        const struct cluster_snap *s, const int64_t *ord, struct req *r,
                        struct shoal_err *err)
{
    const struct shoal_batch_union *bu = L->bu;
    const int64_t E = cl->n_embd, K = L->k;
    for (int64_t t = 0; t < L->n_tok; t++)
        cl->tokmap[t] = -1;
    for (int64_t i = r->first; i < r->first + r->n; i++) {
        const int64_t u = ord[i];
        for (int64_t j = bu->slot_begin[u]; j < bu->slot_begin[u + 1]; j++)
            cl->tokmap[bu->slots[j] / K] = 0;
    }
    uint32_t n_rows = 0;
    for (int64_t t = 0; t < L->n_tok; t++)
        if (cl->tokmap[t] == 0) {
            memcpy(cl->hidden + (int64_t)n_rows * E, L->h + t * E, (size_t)E * sizeof(float));
            cl->tokmap[t] = (int32_t)n_rows++;
        }
    Shoal__ExpertRows *er = shoal_xcalloc((size_t)r->n, sizeof *er);
    Shoal__ExpertRows **erp = shoal_xcalloc((size_t)r->n, sizeof *erp);
    uint64_t total = 0;
    for (int64_t i = 0; i < r->n; i++) {
        const int64_t u = ord[r->first + i];
        const int64_t b = bu->slot_begin[u], cnt = bu->slot_begin[u + 1] - b;
        shoal__expert_rows__init(&er[i]);
        er[i].expert = (uint32_t)bu->expert[u];
        er[i].n_rows = (size_t)cnt;
        er[i].rows = cl->rows + total;
        for (int64_t j = 0; j < cnt; j++)
            er[i].rows[j] = (uint32_t)cl->tokmap[bu->slots[b + j] / K];
        erp[i] = &er[i];
        total += (uint64_t)cnt;
    }
    Shoal__ExpertRequest rq = SHOAL__EXPERT_REQUEST__INIT;
    pthread_mutex_lock(&cl->mu);
    r->id = cl->next_id++;
    pthread_mutex_unlock(&cl->mu);
    rq.id = r->id;
    rq.layer = (uint32_t)L->il;
    rq.n_rows = n_rows;
    rq.n_embd = (uint32_t)E;
    rq.hidden.data = (uint8_t *)cl->hidden;   /* f32 little-endian: the hosts we build for */
    rq.hidden.len = (size_t)n_rows * (size_t)E * sizeof(float);
    rq.n_experts = (size_t)r->n;
    rq.experts = erp;
    /* the answer in parts: the wire carries the first experts' outputs
     * while the worker computes the rest */
    rq.parts = r->n > 1 ? (uint32_t)(r->n < SHOAL_CLUSTER_PARTS ? r->n : SHOAL_CLUSTER_PARTS) : 0;
    Shoal__Frame f = SHOAL__FRAME__INIT;
    f.msg_case = SHOAL__FRAME__MSG_REQUEST;
    f.request = &rq;
    size_t len = 0;
    uint8_t *data = shoal_wire_pack(&f, s->max_frame[r->x], &len, err);
    free(er);
    free(erp);
    if (!data)
        return err->code ? err->code : SHOAL_ERANGE;
    r->total_rows = total;
    r->gen = s->gen[r->x];
    r->sent_ns = shoal_wire_now_ns();
    pthread_mutex_lock(&cl->mu);
    struct pending *p = pending_add(cl);
    p->id = r->id;
    p->exec = r->x;
    p->gen = r->gen;
    p->state = PEND_SENT;
    /* the reply: total rows of n_embd f32 and a bounded protobuf overhead;
     * the loop reads no larger frame from this worker (cluster_net.c) */
    p->reply_bytes = total * (uint64_t)E * sizeof(float) + 256;
    p->total_rows = total;
    p->parts_left = rq.parts > 1 ? rq.parts : 1;
    cl->exec[r->x].in_flight++;
    cl->exec[r->x].requests++;
    cl->exec[r->x].payload_sent += rq.hidden.len;
    pthread_mutex_unlock(&cl->mu);
    struct out_msg *m = shoal_xcalloc(1, sizeof *m);
    m->kind = OUT_SEND;
    m->exec = r->x;
    m->gen = r->gen;
    m->req_id = r->id;
    m->data = data;
    m->len = len;
    shoal_cluster_post(cl, m);
    return 0;
}

static struct timespec abs_deadline(double seconds_from_now)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double whole = floor(seconds_from_now);
    ts.tv_sec += (time_t)whole;
    ts.tv_nsec += (long)((seconds_from_now - whole) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

/* Wait until every request of the round has an answer or failed, or the
 * deadline passes. */
static void wait_round(struct shoal_cluster *cl, const struct req *rq, int n_rq, double until)
{
    pthread_mutex_lock(&cl->mu);
    for (;;) {
        int open = 0;
        for (int i = 0; i < n_rq && !open; i++)
            for (int j = 0; j < cl->n_pend; j++)
                if (cl->pend[j].id == rq[i].id && cl->pend[j].state == PEND_SENT)
                    open = 1;
        double left = until - shoal_cluster_now();
        if (!open || left <= 0)
            break;
        struct timespec ts = abs_deadline(left);
        pthread_cond_timedwait(&cl->cond, &cl->mu, &ts);
    }
    pthread_mutex_unlock(&cl->mu);
}

/* Take the pending entry of request id out of the table. */
static struct pending pending_take(struct shoal_cluster *cl, uint64_t id)
{
    struct pending out;
    memset(&out, 0, sizeof out);
    pthread_mutex_lock(&cl->mu);
    for (int i = 0; i < cl->n_pend; i++)
        if (cl->pend[i].id == id) {
            out = cl->pend[i];
            free(out.part);   /* parts of an answer that never ended */
            out.part = NULL;
            struct exec *x = &cl->exec[out.exec];
            if (x->in_flight)
                x->in_flight--;
            memset(&cl->pend[i], 0, sizeof cl->pend[i]);
            break;
        }
    pthread_mutex_unlock(&cl->mu);
    return out;
}

/* Copy a validated response's rows into their slots of yg. */
static void scatter(struct shoal_cluster *cl, const struct shoal_cluster_layer *L,
                    const int64_t *ord, const struct req *r, const uint8_t *out)
{
    const struct shoal_batch_union *bu = L->bu;
    const size_t row_bytes = (size_t)cl->n_embd * sizeof(float);
    size_t off = 0;
    for (int64_t i = r->first; i < r->first + r->n; i++) {
        const int64_t u = ord[i];
        for (int64_t j = bu->slot_begin[u]; j < bu->slot_begin[u + 1]; j++) {
            memcpy(L->yg + bu->slots[j] * cl->n_embd, out + off, row_bytes);
            off += row_bytes;
        }
    }
}

static void exclude(struct step_state *ss, int x, const char *why)
{
    ss->bad |= 1ull << x;
    snprintf(ss->why[x], sizeof ss->why[x], "%.190s", why);
}

/* ------------------------------------------------------------ non-finite outputs */

/* A NaN or an infinity in a worker's answer may be what the model computes
 * (then every holder computes the same bits: contract 1) or a fault of
 * that worker. So such an answer is recomputed by another holder before it
 * is trusted: the local store's answer, and any finite answer, is taken as
 * the truth, and every worker whose answer differs from it bit for bit is
 * marked faulty; two workers whose non-finite answers agree are both
 * right; with no other holder left, the answer is kept with a warning. */
struct suspect {
    int64_t u;                  /* union entry */
    int x;                      /* the executor that answered */
    float *rows;                /* [rows of u][n_embd] f32, its answer, owned */
};

struct checks {
    uint64_t *avoid;            /* [n_used] bit x: x's answer for u is in question */
    struct suspect *s;          /* [n], answers awaiting a recomputation */
    int n, cap;
};

/* 1 when every value of entry u's rows in yg is finite (bit test: immune
 * to -ffinite-math). */
static int entry_finite(const struct shoal_cluster *cl, const struct shoal_cluster_layer *L,
                        int64_t u)
{
    const struct shoal_batch_union *bu = L->bu;
    for (int64_t j = bu->slot_begin[u]; j < bu->slot_begin[u + 1]; j++) {
        const float *r = L->yg + bu->slots[j] * cl->n_embd;
        uint32_t bad = 0;
        for (int64_t e = 0; e < cl->n_embd; e++) {
            uint32_t b;
            memcpy(&b, &r[e], sizeof b);
            bad |= (b & 0x7f800000u) == 0x7f800000u;
        }
        if (bad)
            return 0;
    }
    return 1;
}

/* Copy entry u's rows out of yg (to == NULL: a new buffer, returned) or
 * compare them with rows (returns 1 when bit-identical). */
static float *entry_rows(const struct shoal_cluster *cl, const struct shoal_cluster_layer *L,
                         int64_t u, const float *rows, int *same)
{
    const struct shoal_batch_union *bu = L->bu;
    const int64_t E = cl->n_embd, b = bu->slot_begin[u], n = bu->slot_begin[u + 1] - b;
    const size_t row_bytes = (size_t)E * sizeof(float);
    float *copy = rows ? NULL : shoal_xmalloc((size_t)(n > 0 ? n : 1) * row_bytes);
    if (same)
        *same = 1;
    for (int64_t j = 0; j < n; j++) {
        const float *r = L->yg + bu->slots[b + j] * E;
        if (copy)
            memcpy(copy + j * E, r, row_bytes);
        else if (memcmp(rows + j * E, r, row_bytes))
            *same = 0;
    }
    return copy;
}

/* Worker x answered expert (il, ie) with non-finite values that by (an
 * executor's address) computes otherwise: no more experts go to x. */
static void mark_faulty(struct shoal_cluster *cl, int x, int64_t il, int64_t ie, int by)
{
    struct exec *e = &cl->exec[x];
    char by_addr[sizeof e->addr];   /* fixed at creation */
    snprintf(by_addr, sizeof by_addr, "%s", cl->exec[by].addr);
    pthread_mutex_lock(&cl->mu);
    const int first = !e->faulty;
    e->faulty = 1;
    e->errors++;
    if (first)
        snprintf(e->last_error, sizeof e->last_error, "faulty: layer %lld expert %lld: "
                 "non-finite output that %.100s computes otherwise", (long long)il,
                 (long long)ie, by_addr);
    pthread_mutex_unlock(&cl->mu);
    if (first)
        shoal_log(SHOAL_LOG_WARN, "cluster", "worker %s is faulty: layer %lld expert %lld: its "
                  "output holds non-finite values that %s computes otherwise; no more "
                  "experts go there", e->addr, (long long)il, (long long)ie, by_addr);
}

static void checks_drop(struct checks *ck, int64_t u)
{
    for (int i = 0; i < ck->n;)
        if (ck->s[i].u == u) {
            free(ck->s[i].rows);
            ck->s[i] = ck->s[--ck->n];
        } else {
            i++;
        }
}

/* Executor y has just written entry u's rows into yg. Returns 1 when u
 * must be computed again by another holder (its answer is now in
 * question), else 0 (accepted). */
static int check_answer(struct shoal_cluster *cl, const struct shoal_cluster_layer *L,
                        struct checks *ck, int64_t u, int y)
{
    const int64_t il = L->il, ie = L->bu->expert[u];
    int n_open = 0, agree = -1;
    for (int i = 0; i < ck->n; i++)
        if (ck->s[i].u == u)
            n_open++;
    const int trusted = y == cl->local || entry_finite(cl, L, u);
    if (!n_open && trusted)
        return 0;
    if (!trusted)
        for (int i = 0; i < ck->n && agree < 0; i++) {
            int same;
            if (ck->s[i].u == u && (entry_rows(cl, L, u, ck->s[i].rows, &same), same))
                agree = i;
        }
    if (trusted || agree >= 0) {
        /* the truth is in yg: every answer that differs came from a fault */
        for (int i = 0; i < ck->n; i++) {
            int same;
            if (ck->s[i].u != u)
                continue;
            entry_rows(cl, L, u, ck->s[i].rows, &same);
            if (!same)
                mark_faulty(cl, ck->s[i].x, il, ie, y);
            else
                shoal_log(SHOAL_LOG_DEBUG, "cluster", "layer %lld expert %lld: %s computes "
                          "the non-finite output of worker %s bit for bit: accepted",
                          (long long)il, (long long)ie, cl->exec[y].addr,
                          cl->exec[ck->s[i].x].addr);
        }
        checks_drop(ck, u);
        return 0;
    }
    if (ck->n == ck->cap) {
        ck->cap = ck->cap ? 2 * ck->cap : 8;
        ck->s = shoal_xrealloc(ck->s, (size_t)ck->cap * sizeof *ck->s);
    }
    ck->s[ck->n++] = (struct suspect){.u = u, .x = y, .rows = entry_rows(cl, L, u, NULL, NULL)};
    ck->avoid[u] |= 1ull << y;
    shoal_log(SHOAL_LOG_DEBUG, "cluster", "layer %lld expert %lld: worker %s's output holds "
              "non-finite values; recomputing it on another holder", (long long)il,
              (long long)ie, cl->exec[y].addr);
    return 1;
}

/* Entries of todo whose answer is in question and that no other holder
 * can recompute now: the answer in yg stays, with a warning. Returns the
 * new count of todo. */
static int64_t accept_unchecked(struct shoal_cluster *cl, const struct shoal_cluster_layer *L,
                                const struct cluster_snap *s, const struct step_state *ss,
                                struct checks *ck, int64_t *todo, int64_t n_todo)
{
    int64_t o = 0;
    for (int64_t i = 0; i < n_todo; i++) {
        const int64_t u = todo[i], ie = L->bu->expert[u];
        int first = -1, n_open = 0, other = 0;
        for (int k = 0; k < ck->n; k++)
            if (ck->s[k].u == u) {
                first = first < 0 ? k : first;
                n_open++;
            }
        for (int x = 0; x < s->n && n_open && !other; x++)
            other = s->up[x] && !((ss->bad | ck->avoid[u]) >> x & 1) && holds(cl, s, x, ie);
        if (!n_open || other) {
            todo[o++] = u;
            continue;
        }
        struct exec *e = &cl->exec[ck->s[first].x];
        pthread_mutex_lock(&cl->mu);
        const uint64_t k = ++e->unchecked;
        pthread_mutex_unlock(&cl->mu);
        /* a NaN spreads to every later layer: logged at 1, 2, 4, 8, ... */
        if ((k & (k - 1)) == 0)
            shoal_log(SHOAL_LOG_WARN, "cluster", "layer %lld expert %lld: worker %s's output "
                      "holds non-finite values and no other holder is up to recompute it: "
                      "accepted unchecked (%llu so far%s)", (long long)L->il, (long long)ie,
                      e->addr, (unsigned long long)k,
                      n_open > 1 ? "; other workers' answers differ" : "");
        checks_drop(ck, u);
    }
    return o;
}

/* One layer step's busy time per executor (the read + compute seconds
 * its answers reported; the local store's wall time of its share) into the
 * balance counters: per executor its sum, and the step's max / mean over
 * the executors that were up when it started (a step where none was busy
 * counts nowhere). */
static void note_busy(struct shoal_cluster *cl, const double *busy, const int *active, int n,
                      uint64_t reads)
{
    double sum = 0, mx = 0;
    int k = 0;
    for (int x = 0; x < n; x++)
        if (active[x]) {
            sum += busy[x];
            mx = busy[x] > mx ? busy[x] : mx;
            k++;
        }
    pthread_mutex_lock(&cl->mu);
    for (int x = 0; x < n; x++)
        if (active[x]) {
            cl->exec[x].busy_s += busy[x];
            cl->exec[x].busy_steps++;
        }
    cl->step_reads += reads;
    cl->reads_hist[reads < SHOAL_CLUSTER_READS_HIST ? reads : SHOAL_CLUSTER_READS_HIST - 1]++;
    if (k > 0 && sum > 0) {
        cl->bal_steps++;
        cl->bal_ratio_sum += mx / (sum / k);
    }
    pthread_mutex_unlock(&cl->mu);
}

int shoal_cluster_run_layer(struct shoal_cluster *cl, const struct shoal_cluster_layer *L0,
                            struct shoal_err *err)
{
    const struct shoal_batch_union *bu0 = L0->bu;
    const int64_t nu0 = bu0->n_used, il = L0->il;
    struct cluster_snap *s = cl->step;
    struct step_state *ss = shoal_xcalloc(1, sizeof *ss);
    snapshot(cl, s, il);
    /* round 0: every entry placed whole, then the entries worth it split
     * into pieces; from here on a "union entry" is a piece of wb */
    const int64_t cap = (nu0 > 0 ? nu0 : 1) * (s->n > 0 ? s->n : 1);
    struct pieces pc = {.cap = cap};
    pc.wb.expert = shoal_xmalloc((size_t)cap * sizeof *pc.wb.expert);
    pc.wb.slot_begin = shoal_xmalloc((size_t)(cap + 1) * sizeof *pc.wb.slot_begin);
    pc.assign = shoal_xmalloc((size_t)cap * sizeof *pc.assign);
    int *assign = pc.assign;
    int64_t *todo = shoal_xmalloc((size_t)cap * sizeof *todo);
    int64_t *ord = shoal_xmalloc((size_t)cap * sizeof *ord);
    int64_t *sel = shoal_xmalloc((size_t)cap * sizeof *sel);
    int64_t *defer = shoal_xmalloc((size_t)cap * sizeof *defer);
    struct req rq[SHOAL_CLUSTER_MAX_EXECUTORS];
    struct shoal_err local_err = {0};
    struct checks ck = {.avoid = shoal_xcalloc((size_t)cap, sizeof *ck.avoid)};
    double busy[SHOAL_CLUSTER_MAX_EXECUTORS] = {0};   /* read + compute seconds */
    int active[SHOAL_CLUSTER_MAX_EXECUTORS] = {0};    /* up at the step's start */
    int n_active = s->n;
    int rc = 0, round = 0;
    double net_max = 0;
    uint64_t step_reads = 0;   /* the workers' answers' disk reads */
    for (int x = 0; x < s->n; x++)
        active[x] = s->up[x];
    grow_scratch(cl, L0->n_tok, bu0->slot_begin[nu0]);
    for (int64_t u = 0; u < nu0; u++)
        todo[u] = u;
    int *assign0 = shoal_xmalloc((size_t)(nu0 > 0 ? nu0 : 1) * sizeof *assign0);
    rc = place(cl, s, ss, ck.avoid, il, bu0, todo, nu0, assign0, err);
    if (rc == 0)
        split_rows(cl, s, il, bu0, assign0, &pc);
    free(assign0);
    struct shoal_cluster_layer L2 = *L0;
    L2.bu = &pc.wb;
    const struct shoal_cluster_layer *L = &L2;
    const struct shoal_batch_union *bu = &pc.wb;
    const int64_t nu = rc == 0 ? bu->n_used : 0;
    int64_t n_todo = nu;
    for (int64_t u = 0; u < nu; u++)
        todo[u] = u;
    if (pc.n_split) {
        pthread_mutex_lock(&cl->mu);
        cl->n_split += (uint64_t)pc.n_split;
        cl->split_rows += (uint64_t)pc.split_rows;
        pthread_mutex_unlock(&cl->mu);
    }
    while (n_todo > 0) {
        if (round > 0) {
            snapshot(cl, s, il);
            if (ck.n > 0 && (n_todo = accept_unchecked(cl, L, s, ss, &ck, todo, n_todo)) == 0)
                break;
            if ((rc = place(cl, s, ss, ck.avoid, il, bu, todo, n_todo, assign, err)) < 0)
                break;
        }
        /* group the entries by executor: ord holds them executor by
         * executor, each group in ascending union order; a second piece of
         * an expert that one executor already has this round (failover
         * puts pieces together) waits for the next round: a request and a
         * local run name each expert once */
        int n_rq = 0, n_sel = 0;
        int64_t o = 0, n_defer = 0;
        for (int x = 0; x < s->n; x++) {
            int64_t first = o;
            for (int64_t i = 0; i < n_todo; i++) {
                const int64_t u = todo[i];
                if (assign[u] != x)
                    continue;
                int dup = 0;
                for (int64_t j = first; j < o && !dup; j++)
                    dup = bu->expert[ord[j]] == bu->expert[u];
                if (dup) {
                    defer[n_defer++] = u;
                    continue;
                }
                ord[o++] = u;
                note_assigned(cl, x, il, bu->expert[u]);
            }
            if (o == first)
                continue;
            if (x == cl->local) {
                for (int64_t i = first; i < o; i++)
                    sel[n_sel++] = ord[i];
                continue;
            }
            rq[n_rq] = (struct req){.x = x, .first = first, .n = o - first};
            n_rq++;
        }
        memcpy(todo, defer, (size_t)n_defer * sizeof *todo);
        n_todo = n_defer;
        /* every remote request goes out before anything waits */
        for (int i = 0; i < n_rq; i++) {
            struct shoal_err e2 = {0};
            if (send_request(cl, L, s, ord, &rq[i], &e2) < 0) {
                exclude(ss, rq[i].x, e2.msg);
                for (int64_t j = rq[i].first; j < rq[i].first + rq[i].n; j++)
                    todo[n_todo++] = ord[j];
                rq[i].id = 0;
            }
        }
        if (round == 0 && L->after_send)
            L->after_send(L->user, n_sel);
        if (n_sel > 0) {
            pthread_mutex_lock(&cl->mu);
            cl->exec[cl->local].requests++;
            pthread_mutex_unlock(&cl->mu);
            struct shoal_err e2 = {0};
            /* the local store's reads count as a worker's answers' do: in
             * the step's reads and the executor's SSD bytes */
            struct shoal_expert_store_stats l0, l1;
            shoal_expert_store_stats_get(cl->model->store, &l0);
            const double t_local = shoal_cluster_now();
            int lrc = L->local(L->user, il, bu, sel, n_sel, &e2);
            shoal_expert_store_stats_get(cl->model->store, &l1);
            if (cl->local >= 0)
                busy[cl->local] += shoal_cluster_now() - t_local;
            step_reads += l1.disk_reads - l0.disk_reads;
            pthread_mutex_lock(&cl->mu);
            if (l1.bytes_read > cl->local_bytes_seen) {   /* prefetches between steps too */
                cl->exec[cl->local].ssd_bytes += l1.bytes_read - cl->local_bytes_seen;
                cl->local_bytes_seen = l1.bytes_read;
            }
            pthread_mutex_unlock(&cl->mu);
            if (lrc < 0) {
                /* another holder may take over; keep the store's message */
                if (!local_err.code)
                    local_err = e2;
                pthread_mutex_lock(&cl->mu);
                cl->exec[cl->local].errors++;
                pthread_mutex_unlock(&cl->mu);
                shoal_log(SHOAL_LOG_WARN, "cluster", "local experts: layer %lld: %s",
                          (long long)il, e2.msg);
                exclude(ss, cl->local, e2.msg);
                for (int64_t j = 0; j < n_sel; j++)
                    todo[n_todo++] = sel[j];
            } else {
                for (int64_t j = 0; j < n_sel && ck.n > 0; j++)
                    check_answer(cl, L, &ck, sel[j], cl->local);   /* trusted: settles */
            }
        }
        double until = shoal_cluster_now() + cl->p.request_timeout_s;
        if (n_rq > 0) {
            pthread_mutex_lock(&cl->mu);
            cl->rounds++;
            pthread_mutex_unlock(&cl->mu);
        }
        wait_round(cl, rq, n_rq, until);
        for (int i = 0; i < n_rq; i++) {
            if (!rq[i].id)
                continue;
            const int x = rq[i].x;
            struct pending p = pending_take(cl, rq[i].id);
            char why[300];
            why[0] = 0;
            if (p.state == PEND_DONE && p.frame->msg_case == SHOAL__FRAME__MSG_RESPONSE) {
                const Shoal__ExpertResponse *rs = p.frame->response;
                struct shoal_err e2 = {0};
                if (shoal_wire_check_response(rs, rq[i].total_rows, cl->n_embd, &e2) == 0) {
                    scatter(cl, L, ord, &rq[i], rs->out.data);
                    pthread_mutex_lock(&cl->mu);
                    cl->exec[x].hits += rs->cache_hits;      /* until its next StatusReply */
                    cl->exec[x].misses += rs->disk_reads;
                    cl->exec[x].payload_received += rs->out.len;
                    cl->exec[x].ssd_bytes += rs->bytes_read;
                    step_reads += rs->disk_reads;
                    if (rs->compute_seconds > 0) {
                        /* its compute rate as its answers achieve it, in
                         * cost()'s unit: the weight bytes of each expert, 1/8
                         * more per row beyond the first (the start-up probe
                         * times one row on an idle core) */
                        struct exec *e = &cl->exec[x];
                        double w = 0;
                        for (int64_t j = rq[i].first; j < rq[i].first + rq[i].n; j++) {
                            const int64_t u = ord[j];
                            const int64_t rows = bu->slot_begin[u + 1] - bu->slot_begin[u];
                            w += (double)cl->blob_bytes * (1.0 + (double)(rows - 1) / 8.0);
                        }
                        const double rate = shoal_cluster_seen_rate(
                            &e->compute_seen, w, rs->compute_seconds, 0, 0.002);
                        if (rate > 0)
                            e->compute_gbps_seen = rate / 1e9;
                    }
                    if (rs->read_busy_seconds > 0) {
                        /* the disk's rate from the first answer on; the
                         * start-up probe misjudges throttled or bursty disks
                         * (150 MB/s blkio disks probed at 141-394) */
                        cl->exec[x].seen_from_answers = 1;
                        shoal_cluster_note_disk(&cl->exec[x], (double)rs->bytes_read,
                                                rs->read_busy_seconds);
                    }
                    note_resident(cl, x, il, &rs->resident, &rs->loading);
                    note_resident(cl, x, (int64_t)rs->next_layer, &rs->next_resident,
                                  &rs->next_loading);
                    for (int64_t j = rq[i].first; j < rq[i].first + rq[i].n; j++) {
                        const int64_t c = il * cl->n_expert + bu->expert[ord[j]];
                        cl->remote_runs[c]++;
                        cl->last_worker[c] = (uint8_t)x;
                    }
                    pthread_mutex_unlock(&cl->mu);
                    /* the worker's own time; garbage counts as none */
                    double server = rs->queue_seconds + rs->read_seconds + rs->compute_seconds;
                    if (!isfinite(server) || server < 0 || rs->queue_seconds < 0 ||
                        rs->read_seconds < 0 || rs->compute_seconds < 0)
                        server = 0;
                    busy[x] += server > 0 ? rs->read_seconds + rs->compute_seconds : 0.0;
                    double net = (double)(p.recv_ns - rq[i].sent_ns) / 1e9 - server;
                    if (net > net_max)
                        net_max = net;
                    for (int64_t j = rq[i].first; j < rq[i].first + rq[i].n; j++)
                        if (check_answer(cl, L, &ck, ord[j], x))
                            todo[n_todo++] = ord[j];
                } else {
                    snprintf(why, sizeof why, "protocol error: %.260s", e2.msg);
                    shoal_cluster_mark_down(cl, x, rq[i].gen, why);
                }
            } else if (p.state == PEND_DONE) {   /* an ErrorReply */
                char msg[240];
                snprintf(why, sizeof why, "error reply: %s",
                         shoal_wire_printable(msg, sizeof msg, p.frame->error->message));
                shoal_log(SHOAL_LOG_WARN, "cluster", "worker %s: layer %lld: %s",
                          cl->exec[x].addr, (long long)il, why);
            } else if (p.state == PEND_FAILED) {
                snprintf(why, sizeof why, "%s", p.why);
            } else {
                snprintf(why, sizeof why, "request %" PRIu64 " timed out after %.1f s",
                         rq[i].id, cl->p.request_timeout_s);
                shoal_cluster_mark_down(cl, x, rq[i].gen, why);
            }
            shoal_wire_frame_free(p.frame);
            if (why[0]) {
                pthread_mutex_lock(&cl->mu);
                cl->exec[x].errors++;
                pthread_mutex_unlock(&cl->mu);
                exclude(ss, x, why);
                for (int64_t j = rq[i].first; j < rq[i].first + rq[i].n; j++)
                    todo[n_todo++] = ord[j];
            }
        }
        if (n_todo > 0) {
            /* re-run in ascending union order */
            for (int64_t i = 1; i < n_todo; i++)
                for (int64_t j = i; j > 0 && todo[j - 1] > todo[j]; j--) {
                    int64_t t = todo[j];
                    todo[j] = todo[j - 1];
                    todo[j - 1] = t;
                }
            shoal_log(SHOAL_LOG_INFO, "cluster", "layer %lld: re-running %lld experts on "
                      "other holders", (long long)il, (long long)n_todo);
        }
        round++;
    }
    if (rc < 0 && local_err.code) {
        /* the local store failed and nobody else holds the expert: its
         * message says more than "no holder" */
        struct shoal_err e3 = {0};
        shoal_err_set(&e3, local_err.code, "%s; %s", local_err.msg, err->msg);
        *err = e3;
        rc = local_err.code;
    }
    note_busy(cl, busy, active, n_active, step_reads);
    pthread_mutex_lock(&cl->mu);
    cl->net_s += net_max > 0 ? net_max : 0;
    pthread_mutex_unlock(&cl->mu);
    for (int i = 0; i < ck.n; i++)
        free(ck.s[i].rows);
    free(ck.s);
    free(ck.avoid);
    free(ss);
    free(todo);
    free(ord);
    free(sel);
    free(defer);
    free(pc.wb.expert);
    free(pc.wb.slot_begin);
    free(pc.assign);
    return rc;
}

double shoal_cluster_take_network_s(struct shoal_cluster *cl)
{
    pthread_mutex_lock(&cl->mu);
    double v = cl->net_s;
    cl->net_s = 0;
    pthread_mutex_unlock(&cl->mu);
    return v;
}

/* ------------------------------------------------------------ hints */

int64_t shoal_cluster_hint(struct shoal_cluster *cl, int64_t il, const int32_t *ids,
                           int64_t n_ids, int32_t *local_ids)
{
    if (il < 0 || il >= cl->n_layer || !cl->is_moe[il])
        return 0;
    const int64_t NE = cl->n_expert;
    struct cluster_snap *s = cl->hint;
    snapshot(cl, s, il);
    /* the lookahead's union: distinct experts with an up holder, and how
     * many rows each (placement's cost) */
    int64_t *rows = shoal_xcalloc((size_t)NE, sizeof *rows);
    int64_t n = 0;
    for (int64_t i = 0; i < n_ids; i++)
        if (ids[i] >= 0 && ids[i] < NE && rows[ids[i]]++ == 0)
            n++;
    struct shoal_batch_union bu = {.n_used = 0};
    bu.expert = shoal_xmalloc((size_t)(n > 0 ? n : 1) * sizeof *bu.expert);
    bu.slot_begin = shoal_xmalloc((size_t)(n + 1) * sizeof *bu.slot_begin);
    bu.slot_begin[0] = 0;
    for (int64_t ie = 0; ie < NE; ie++) {
        if (!rows[ie])
            continue;
        int held = 0;
        for (int x = 0; x < s->n && !held; x++)
            held = s->up[x] && holds(cl, s, x, ie);
        if (!held)
            continue;
        bu.expert[bu.n_used] = (int32_t)ie;
        bu.slot_begin[bu.n_used + 1] = bu.slot_begin[bu.n_used] + rows[ie];
        bu.n_used++;
    }
    /* each expert to the executor the step's placement would give it,
     * balanced as the step will be (spill-over over the estimated read and
     * compute times): the read starts there now, the worker's answer to
     * this step reports it resident (next_resident) and the step's
     * placement keeps it there, so a prefetch is not wasted by moving its
     * expert, and the disks' work is spread before the step */
    int64_t *todo = shoal_xmalloc((size_t)(bu.n_used > 0 ? bu.n_used : 1) * sizeof *todo);
    int *assign = shoal_xmalloc((size_t)(bu.n_used > 0 ? bu.n_used : 1) * sizeof *assign);
    uint64_t *avoid = shoal_xcalloc((size_t)(bu.n_used > 0 ? bu.n_used : 1), sizeof *avoid);
    struct step_state *ss = shoal_xcalloc(1, sizeof *ss);
    for (int64_t u = 0; u < bu.n_used; u++)
        todo[u] = u;
    struct shoal_err err = {0};
    const int placed = place(cl, s, ss, avoid, il, &bu, todo, bu.n_used, assign, &err) == 0;
    uint32_t *per = shoal_xmalloc((size_t)(s->n > 0 ? s->n : 1) * (size_t)NE * sizeof *per);
    int64_t cnt[SHOAL_CLUSTER_MAX_EXECUTORS] = {0};
    int cand[SHOAL_CLUSTER_MAX_EXECUTORS];
    int64_t n_local = 0;
    for (int64_t u = 0; placed && u < bu.n_used; u++) {
        const int32_t ie = bu.expert[u];
        const int x = assign[u];
        if (x == cl->local)
            local_ids[n_local++] = ie;
        else
            per[(size_t)x * (size_t)NE + (size_t)cnt[x]++] = (uint32_t)ie;
        /* warm replicas (issue 33): the expert's other holders read it too
         * while their cache has room, off the critical path; placement's
         * cache model then counts it there, so spill-over and row
         * splitting may use them without paying a read in the step. Only
         * for an expert the workers already ran WARM_MIN_RUNS times: a
         * second copy of every expert a cold prompt touches doubled its
         * reads (--replicas 2 at V3 widths: 855 against 712 MB a token) */
        if (cl->remote_runs[il * NE + ie] < WARM_MIN_RUNS)
            continue;
        int nc = 0;
        for (int y = 0; y < s->n; y++)
            if (s->up[y] && holds(cl, s, y, ie))
                cand[nc++] = y;
        for (int k = 0; k < nc; k++) {
            const int y = cand[k];
            struct exec *e = &cl->exec[y];
            const int room = e->cache_bytes == UINT64_MAX ||
                             e->assigned_bytes + cl->blob_bytes <= e->cache_bytes;
            if (y == x || e->assigned[il * NE + ie] || !room)
                continue;
            if (y == cl->local)
                local_ids[n_local++] = ie;
            else
                per[(size_t)y * (size_t)NE + (size_t)cnt[y]++] = (uint32_t)ie;
            note_assigned(cl, y, il, ie);
        }
    }
    for (int x = 0; x < s->n; x++) {
        if (!cnt[x] || x == cl->local || s->write_queue[x] > HINT_QUEUE_MAX)
            continue;
        Shoal__PrefetchHint h = SHOAL__PREFETCH_HINT__INIT;
        h.layer = (uint32_t)il;
        h.n_experts = (size_t)cnt[x];
        h.experts = per + (size_t)x * (size_t)NE;
        Shoal__Frame f = SHOAL__FRAME__INIT;
        f.msg_case = SHOAL__FRAME__MSG_HINT;
        f.hint = &h;
        size_t len;
        uint8_t *data = shoal_wire_pack(&f, s->max_frame[x], &len, NULL);
        if (!data)
            continue;
        struct out_msg *m = shoal_xcalloc(1, sizeof *m);
        m->kind = OUT_SEND;
        m->exec = x;
        m->gen = s->gen[x];
        m->data = data;
        m->len = len;
        shoal_cluster_post(cl, m);
    }
    free(per);
    free(ss);
    free(avoid);
    free(assign);
    free(todo);
    free(bu.slot_begin);
    free(bu.expert);
    free(rows);
    return n_local;
}

/* ------------------------------------------------------------ accounting */

void shoal_cluster_note_eval(struct shoal_cluster *cl, const struct shoal_ctx_timings *t,
                             int64_t n_tokens, int decode, double seconds)
{
    pthread_mutex_lock(&cl->mu);
    cl->t = *t;
    cl->tokens += (uint64_t)(n_tokens > 0 ? n_tokens : 0);
    /* a batch of sequences' next tokens is decode too (shoal serve with
     * several requests): counting single-token steps only showed 0 tok/s
     * while tokens flowed */
    if (decode && n_tokens > 0) {
        cl->decode_s[cl->i_decode] = seconds;
        cl->decode_n[cl->i_decode] = n_tokens;
        cl->i_decode = (cl->i_decode + 1) % (int)(sizeof cl->decode_s / sizeof cl->decode_s[0]);
        if (cl->n_decode < (int)(sizeof cl->decode_s / sizeof cl->decode_s[0]))
            cl->n_decode++;
    }
    pthread_mutex_unlock(&cl->mu);
}
