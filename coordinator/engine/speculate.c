/* speculate: prompt-lookup drafts and the gate (speculate.h). */
#include <string.h>

#include "speculate.h"

#define NGRAM_MIN 2
#define NGRAM_MAX 4
#define EMA 0.25          /* weight of a new step time */
#define DECAY 0.98        /* of the acceptance counts, per verify step */
#define PROBE_EVERY 32    /* declined matches before auto tries one draft anyway; the
                           * interval doubles after each probe that did not lead to
                           * drafting on its merits, up to PROBE_MAX */
#define PROBE_MAX 1024    /* ... and is PROBE_MAX when a kept draft could not pay at all
                           * (drafting and the verify step cost two one-row steps) */

const char *shoal_spec_mode_name(enum shoal_spec_mode m)
{
    switch (m) {
    case SHOAL_SPEC_OFF: return "off";
    case SHOAL_SPEC_AUTO: return "auto";
    case SHOAL_SPEC_LOOKUP: return "lookup";
    case SHOAL_SPEC_MTP: return "mtp";
    }
    return NULL;
}

int shoal_spec_mode_parse(const char *s, enum shoal_spec_mode *m)
{
    for (int k = SHOAL_SPEC_OFF; k <= SHOAL_SPEC_MTP; k++)
        if (!strcmp(s, shoal_spec_mode_name((enum shoal_spec_mode)k))) {
            *m = (enum shoal_spec_mode)k;
            return 0;
        }
    return -1;
}

int64_t shoal_lookup_draft(const int32_t *hist, int64_t n_hist, int32_t next,
                           int ngram_min, int ngram_max, int32_t *draft, int64_t max_draft)
{
    const int64_t len = n_hist + 1;   /* S = hist, next */
#define AT(i) ((i) < n_hist ? hist[i] : next)
    for (int n = ngram_max; n >= ngram_min; n--) {
        if (len < (int64_t)n + 1)
            continue;
        const int64_t suf = len - n;   /* the suffix S[suf .. len-1] */
        for (int64_t i = suf - 1; i >= 0; i--) {
            if (hist[i] != AT(suf))
                continue;
            int j = 1;
            while (j < n && AT(i + j) == AT(suf + j))
                j++;
            if (j < n)
                continue;
            int64_t k = 0;
            for (; k < max_draft && i + n + k < len; k++)
                draft[k] = AT(i + n + k);
            if (k > 0)
                return k;
        }
    }
#undef AT
    return 0;
}

void shoal_spec_cost_record(struct shoal_spec_cost *c, int64_t rows, double seconds)
{
    if (rows < 1 || rows > SHOAL_SPEC_MAX_ROWS || !(seconds > 0))
        return;
    double *t = &c->t_rows[rows];
    *t = *t > 0 ? (1 - EMA) * *t + EMA * seconds : seconds;
}

void shoal_spec_draft_estimate(struct shoal_spec_cost *c, int64_t n_layer)
{
    c->t_draft_est = c->t_rows[1] * 2.0 / (double)(n_layer > 0 ? n_layer + 1 : 2);
}

void shoal_spec_draft_cost_record(struct shoal_spec_cost *c, int64_t k, double seconds)
{
    if (k < 1 || k > SHOAL_SPEC_DRAFT_MAX || !(seconds > 0))
        return;
    double *t = &c->t_draft[k];
    *t = *t > 0 ? (1 - EMA) * *t + EMA * seconds : seconds;
}

void shoal_spec_init(struct shoal_spec *sp, enum shoal_spec_mode mode, int draft_max)
{
    memset(sp, 0, sizeof *sp);
    sp->mode = mode;
    if (draft_max <= 0)
        draft_max = mode == SHOAL_SPEC_MTP ? SHOAL_SPEC_DRAFT_DEFAULT_MTP
                                           : SHOAL_SPEC_DRAFT_DEFAULT;
    sp->draft_max = draft_max > SHOAL_SPEC_DRAFT_MAX ? SHOAL_SPEC_DRAFT_MAX : draft_max;
    sp->kept = 1.0;   /* a prior of one kept in two */
    sp->tried = 2.0;
    sp->n_skipped = PROBE_EVERY - 1;   /* the first declined match probes */
    sp->probe_every = PROBE_EVERY;
}

/* The expected seconds of a step of n rows: measured, else extrapolated
 * from the largest row count m measured below n, by the slope between it
 * and the one measured below it; with only m known, each row costs what
 * a row of m does (no gain: the probe measures a second count). 0: nothing
 * measured at or below n. */
static double rows_time(const struct shoal_spec_cost *c, int64_t n)
{
    if (n > SHOAL_SPEC_MAX_ROWS)
        return 0;
    if (c->t_rows[n] > 0)
        return c->t_rows[n];
    int64_t m = n - 1;
    while (m >= 1 && c->t_rows[m] <= 0)
        m--;
    if (m < 1)
        return 0;
    int64_t l = m - 1;
    while (l >= 1 && c->t_rows[l] <= 0)
        l--;
    const double slope = l >= 1 ? (c->t_rows[m] - c->t_rows[l]) / (double)(m - l)
                                : c->t_rows[m] / (double)m;
    return c->t_rows[m] + (double)(n - m) * (slope > 0 ? slope : 0);
}

static int64_t gate(struct shoal_spec *sp, const struct shoal_spec_cost *cost,
                    int64_t base_rows, int64_t base_tokens, int64_t k, int with_draft);

int64_t shoal_spec_plan(struct shoal_spec *sp, const struct shoal_spec_cost *cost,
                        int64_t base_rows, int64_t base_tokens, const int32_t *hist,
                        int64_t n_hist, int32_t next, int64_t limit, int32_t *draft)
{
    if (sp->mode == SHOAL_SPEC_OFF || sp->mode == SHOAL_SPEC_MTP || limit < 1)
        return 0;
    const int64_t max = limit < sp->draft_max ? limit : sp->draft_max;
    const int64_t k = shoal_lookup_draft(hist, n_hist, next, NGRAM_MIN, NGRAM_MAX, draft, max);
    if (k == 0 || sp->mode == SHOAL_SPEC_LOOKUP)
        return k;
    return gate(sp, cost, base_rows, base_tokens, k, 0);
}

/* The seconds the MTP layers take to draft k tokens: measured, else the
 * largest k' < k measured, scaled by k / k' (the chained rows). */
static double draft_time(const struct shoal_spec_cost *c, int64_t k)
{
    if (c->t_draft[k] > 0)
        return c->t_draft[k];
    for (int64_t m = k - 1; m >= 1; m--)
        if (c->t_draft[m] > 0)
            return c->t_draft[m] * (double)k / (double)m;
    return c->t_draft_est * (double)k;
}

int64_t shoal_spec_choose(struct shoal_spec *sp, const struct shoal_spec_cost *cost,
                          int64_t base_rows, int64_t base_tokens, int64_t limit)
{
    if (sp->mode == SHOAL_SPEC_OFF || limit < 1)
        return 0;
    const int64_t max = limit < sp->draft_max ? limit : sp->draft_max;
    if (sp->mode != SHOAL_SPEC_AUTO)
        return max;
    return gate(sp, cost, base_rows, base_tokens, max, 1);
}

/* auto: the k' <= k of the most tokens per second for the step, counting
 * the drafting's own time when with_draft */
static int64_t gate(struct shoal_spec *sp, const struct shoal_spec_cost *cost,
                    int64_t base_rows, int64_t base_tokens, int64_t k, int with_draft)
{
    const double t0 = rows_time(cost, base_rows);
    if (t0 <= 0 || base_rows < 1 || base_tokens < 1)
        return 0;   /* a step of this size measured first, to compare with */
    const double a = sp->kept / sp->tried;
    double best = 1.0, e = 1.0, p = 1.0;
    int64_t best_k = 0;
    /* could one draft pay if it were kept (a lookup draft that matched: surely;
     * an MTP draft: at 0.9, as the best heads)? A step of one more row not
     * measured: yes for lookup (its probe is cheap and measures it), no for
     * the MTP layers (their probe first catches up on every position) */
    const double a_max = with_draft ? 0.9 : 1.0;
    const double t1 = base_rows + 1 <= SHOAL_SPEC_MAX_ROWS ? cost->t_rows[base_rows + 1] : 0;
    int can_pay = !with_draft;
    if (t1 > 0 && k >= 1)
        can_pay = ((double)base_tokens + a_max) * t0 >
                  (double)base_tokens * (t1 + (with_draft ? draft_time(cost, 1) : 0)) * 1.02;
    for (int64_t j = 1; j <= k; j++) {
        p *= a;
        e += p;
        double tj = rows_time(cost, base_rows + j);
        if (tj <= 0)
            break;
        if (with_draft)
            tj += draft_time(cost, j);
        const double gain = ((double)base_tokens - 1 + e) * t0 / ((double)base_tokens * tj);
        if (gain > best * 1.02) {
            best = gain;
            best_k = j;
        }
    }
    if (best_k > 0) {   /* on its merits */
        sp->n_skipped = 0;
        sp->probe_every = PROBE_EVERY;
        return best_k;
    }
    if (base_rows < SHOAL_SPEC_MAX_ROWS &&
        ++sp->n_skipped >= (can_pay ? sp->probe_every : PROBE_MAX)) {
        /* a probe now and then: the acceptance rate or the costs may have moved */
        sp->n_skipped = 0;
        sp->probe_every = sp->probe_every * 2 < PROBE_MAX ? sp->probe_every * 2 : PROBE_MAX;
        return 1;
    }
    return 0;
}

void shoal_spec_record(struct shoal_spec *sp, int64_t drafted, int64_t accepted)
{
    if (drafted <= 0)
        return;
    sp->n_verify++;
    sp->n_drafted += drafted;
    sp->n_accepted += accepted;
    sp->kept = sp->kept * DECAY + (double)accepted;
    /* positions that had the chance: the kept ones and the first refused */
    sp->tried = sp->tried * DECAY + (double)(accepted + (accepted < drafted));
}
