#include "sampler.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "util.h"

struct cand {
    float logit;
    int32_t id;
};

struct shoal_sampler {
    struct shoal_sampler_params p;
    int64_t n_vocab;
    uint64_t rng;
    struct cand *c;      /* [n_vocab] */
    float *prob;         /* [n_vocab] */
    uint8_t *seen;       /* [n_vocab] */
    /* presence/frequency penalties (NULL when both are 0): how often each
     * token was returned, and the distinct ones in the order first seen */
    uint32_t *count;     /* [n_vocab] */
    int32_t *distinct;   /* [n_distinct] */
    int64_t n_distinct;
};

struct shoal_sampler *shoal_sampler_create(struct shoal_sampler_params p,
                                           int64_t n_vocab)
{
    struct shoal_sampler *s = shoal_xcalloc(1, sizeof *s);
    s->p = p;
    s->n_vocab = n_vocab;
    s->rng = p.seed;
    s->c = shoal_xcalloc((size_t)n_vocab, sizeof *s->c);
    s->prob = shoal_xcalloc((size_t)n_vocab, sizeof *s->prob);
    s->seen = shoal_xcalloc((size_t)n_vocab, 1);
    if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
        s->count = shoal_xcalloc((size_t)n_vocab, sizeof *s->count);
        s->distinct = shoal_xcalloc((size_t)n_vocab, sizeof *s->distinct);
    }
    return s;
}

void shoal_sampler_free(struct shoal_sampler *s)
{
    if (!s)
        return;
    free(s->c);
    free(s->prob);
    free(s->seen);
    free(s->count);
    free(s->distinct);
    free(s);
}

/* splitmix64: small, well-distributed, identical everywhere */
static uint64_t next_u64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int cmp_cand(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->logit > y->logit)
        return -1;
    if (x->logit < y->logit)
        return 1;
    return x->id < y->id ? -1 : (x->id > y->id);
}

/* 1 if a ranks before b in cmp_cand's order (higher logit, then lower id) */
static int before(const struct cand *a, const struct cand *b)
{
    return cmp_cand(a, b) < 0;
}

/* Restore the heap c[0..k) (the worst candidate at the root) below j. */
static void sift_down(struct cand *c, int64_t k, int64_t j)
{
    for (;;) {
        int64_t w = j, l = 2 * j + 1, r = l + 1;
        if (l < k && before(&c[w], &c[l]))
            w = l;
        if (r < k && before(&c[w], &c[r]))
            w = r;
        if (w == j)
            return;
        struct cand t = c[j];
        c[j] = c[w];
        c[w] = t;
        j = w;
    }
}

/* Move the k best of c[0..V) (cmp_cand's order: a total order for non-NaN
 * logits, so the set is unique) to c[0..k), sorted: O(V log k) with a heap
 * of the k best so far whose root is the worst of them, instead of sorting
 * all V. The result is the first k of the full sort. */
static void select_top(struct cand *c, int64_t V, int64_t k)
{
    /* heapify c[0..k) with the worst at the root */
    for (int64_t i = k / 2 - 1; i >= 0; i--)
        sift_down(c, k, i);
    for (int64_t i = k; i < V; i++) {
        if (!before(&c[i], &c[0]))
            continue;
        c[0] = c[i];   /* replace the worst, sift down */
        sift_down(c, k, 0);
    }
    qsort(c, (size_t)k, sizeof *c, cmp_cand);
}

/* OpenAI's presence and frequency penalties over the tokens returned so far */
static void penalize_returned(const struct shoal_sampler *s, float *logits)
{
    for (int64_t i = 0; i < s->n_distinct; i++) {
        int32_t id = s->distinct[i];
        logits[id] -= s->p.presence_penalty + s->p.frequency_penalty * (float)s->count[id];
    }
}

static void count_returned(struct shoal_sampler *s, int32_t id)
{
    if (!s->count)
        return;
    if (s->count[id]++ == 0)
        s->distinct[s->n_distinct++] = id;
}

static int32_t pick(struct shoal_sampler *s, float *logits);

/* 1 for NaN and +-inf: all exponent bits set */
static inline uint32_t nonfinite_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (u & 0x7f800000u) == 0x7f800000u;
}

int64_t shoal_logits_nonfinite(const float *logits, int64_t n)
{
    /* NaN and +-inf are the floats whose exponent bits are all ones: tested
     * on the bits (no float compare a -ffinite-math-only build could fold
     * away), ORed with no early exit so the pass vectorizes */
    uint32_t any = 0;
    for (int64_t i = 0; i < n; i++)
        any |= nonfinite_bits(logits[i]);
    if (!any)
        return -1;
    for (int64_t i = 0; i < n; i++)
        if (nonfinite_bits(logits[i]))
            return i;
    return -1;
}

int shoal_logits_check(const float *logits, int64_t n, struct shoal_err *err,
                       const char *what_fmt, ...)
{
    const int64_t bad = shoal_logits_nonfinite(logits, n);
    if (bad < 0)
        return 0;
    char what[160];
    va_list ap;
    va_start(ap, what_fmt);
    vsnprintf(what, sizeof what, what_fmt, ap);
    va_end(ap);
    return shoal_err_set(err, SHOAL_ERANGE, "%s hold %s at vocabulary index %lld: its weights "
                         "or activations are not finite (a damaged or mis-converted model "
                         "file?)", what, isnan(logits[bad]) ? "NaN" : "inf", (long long)bad);
}

int32_t shoal_sampler_sample(struct shoal_sampler *s, float *logits,
                             const int32_t *history, int64_t n_history)
{
    const int64_t V = s->n_vocab;
    const struct shoal_sampler_params *p = &s->p;
    if (p->repeat_penalty != 1.0f && n_history > 0) {
        int64_t from = p->repeat_last_n < 0 || p->repeat_last_n > n_history
                           ? 0 : n_history - p->repeat_last_n;
        for (int64_t i = from; i < n_history; i++) {
            int32_t id = history[i];
            if (id < 0 || id >= V || s->seen[id])
                continue;
            s->seen[id] = 1;
            logits[id] = logits[id] > 0 ? logits[id] / p->repeat_penalty
                                        : logits[id] * p->repeat_penalty;
        }
        for (int64_t i = from; i < n_history; i++)
            if (history[i] >= 0 && history[i] < V)
                s->seen[history[i]] = 0;
    }
    if (s->count)
        penalize_returned(s, logits);
    int32_t id = pick(s, logits);
    count_returned(s, id);
    return id;
}

/* greedy, or temperature -> top-k -> top-p -> min-p -> a draw */
static int32_t pick(struct shoal_sampler *s, float *logits)
{
    const int64_t V = s->n_vocab;
    const struct shoal_sampler_params *p = &s->p;
    if (p->greedy || p->temperature <= 0.0f) {
        int64_t best = 0;
        for (int64_t i = 1; i < V; i++)
            if (logits[i] > logits[best])
                best = i;
        return (int32_t)best;
    }
    for (int64_t i = 0; i < V; i++) {
        s->c[i].logit = logits[i] / p->temperature;
        s->c[i].id = (int32_t)i;
    }
    int64_t n = V;
    if (p->top_k > 0 && p->top_k < n)
        n = p->top_k;
    /* the n best in order (all V when top-k is off); ties by id keep it
     * deterministic */
    if (n < V)
        select_top(s->c, V, n);
    else
        qsort(s->c, (size_t)V, sizeof *s->c, cmp_cand);
    double sum = 0.0;
    const float mx = s->c[0].logit;
    for (int64_t i = 0; i < n; i++) {
        s->prob[i] = shoal_expf(s->c[i].logit - mx);
        sum += s->prob[i];
    }
    for (int64_t i = 0; i < n; i++)
        s->prob[i] = (float)(s->prob[i] / sum);
    if (p->top_p < 1.0f) {
        double cum = 0.0;
        int64_t keep = n;
        for (int64_t i = 0; i < n; i++) {
            cum += s->prob[i];
            if (cum >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    if (p->min_p > 0.0f) {
        const float thr = p->min_p * s->prob[0];
        int64_t keep = 1;
        while (keep < n && s->prob[keep] >= thr)
            keep++;
        n = keep;
    }
    double total = 0.0;
    for (int64_t i = 0; i < n; i++)
        total += s->prob[i];
    double u = (double)(next_u64(&s->rng) >> 11) * (1.0 / 9007199254740992.0) * total;
    double cum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        cum += s->prob[i];
        if (u < cum)
            return s->c[i].id;
    }
    return s->c[n - 1].id;
}
