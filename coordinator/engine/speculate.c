/* speculate: prompt-lookup drafts and the gate (speculate.h). */
#include <string.h>

#include "speculate.h"

#define NGRAM_MIN 2
#define NGRAM_MAX 4
#define EMA 0.25          /* weight of a new step time */
#define DECAY 0.98        /* of the acceptance counts, per verify step */
#define PROBE_EVERY 32    /* declined matches before auto tries one draft anyway */

const char *shoal_spec_mode_name(enum shoal_spec_mode m)
{
    switch (m) {
    case SHOAL_SPEC_OFF: return "off";
    case SHOAL_SPEC_AUTO: return "auto";
    case SHOAL_SPEC_LOOKUP: return "lookup";
    }
    return NULL;
}

int shoal_spec_mode_parse(const char *s, enum shoal_spec_mode *m)
{
    for (int k = SHOAL_SPEC_OFF; k <= SHOAL_SPEC_LOOKUP; k++)
        if (!strcmp(s, shoal_spec_mode_name((enum shoal_spec_mode)k))) {
            *m = (enum shoal_spec_mode)k;
            return 0;
        }
    return !strcmp(s, "mtp") ? -2 : -1;
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

void shoal_spec_init(struct shoal_spec *sp, enum shoal_spec_mode mode, int draft_max)
{
    memset(sp, 0, sizeof *sp);
    sp->mode = mode;
    sp->draft_max = draft_max < 1 ? 1 : draft_max > SHOAL_SPEC_DRAFT_MAX
                                            ? SHOAL_SPEC_DRAFT_MAX : draft_max;
    sp->kept = 1.0;   /* a prior of one kept in two */
    sp->tried = 2.0;
}

/* The expected seconds of a step of n rows: measured, else extrapolated
 * from the largest row count measured below n (a prior slope of 0.3 of a
 * one-row step per row until two counts are known) */
static double rows_time(const struct shoal_spec *sp, int64_t n)
{
    if (sp->t_rows[n] > 0)
        return sp->t_rows[n];
    int64_t m = n - 1;
    while (m > 1 && sp->t_rows[m] <= 0)
        m--;
    const double t1 = sp->t_rows[1];
    const double slope = m > 1 ? (sp->t_rows[m] - t1) / (double)(m - 1) : 0.3 * t1;
    return sp->t_rows[m] + (double)(n - m) * (slope > 0 ? slope : 0);
}

int64_t shoal_spec_plan(struct shoal_spec *sp, const int32_t *hist, int64_t n_hist,
                        int32_t next, int64_t limit, int32_t *draft)
{
    if (sp->mode == SHOAL_SPEC_OFF || limit < 1)
        return 0;
    const int64_t max = limit < sp->draft_max ? limit : sp->draft_max;
    const int64_t k = shoal_lookup_draft(hist, n_hist, next, NGRAM_MIN, NGRAM_MAX, draft, max);
    if (k == 0 || sp->mode == SHOAL_SPEC_LOOKUP)
        return k;
    /* auto: the k' <= k of the most tokens per second, 1 + a + .. + a^k'
     * tokens in rows_time(k' + 1) against 1 token in rows_time(1) */
    if (sp->t_rows[1] <= 0)
        return 0;   /* a one-row step first, to compare with */
    const double a = sp->kept / sp->tried;
    double best = 1.0, e = 1.0, p = 1.0;
    int64_t best_k = 0;
    for (int64_t j = 1; j <= k; j++) {
        p *= a;
        e += p;
        const double gain = e * sp->t_rows[1] / rows_time(sp, j + 1);
        if (gain > best * 1.02) {
            best = gain;
            best_k = j;
        }
    }
    if (best_k == 0 && ++sp->n_skipped >= PROBE_EVERY)
        best_k = 1;   /* a probe now and then: the acceptance rate may have risen */
    if (best_k > 0)
        sp->n_skipped = 0;
    return best_k;
}

void shoal_spec_record(struct shoal_spec *sp, int64_t rows, double seconds, int64_t drafted,
                       int64_t accepted)
{
    if (rows >= 1 && rows <= SHOAL_SPEC_DRAFT_MAX + 1 && seconds > 0) {
        double *t = &sp->t_rows[rows];
        *t = *t > 0 ? (1 - EMA) * *t + EMA * seconds : seconds;
    }
    if (drafted <= 0)
        return;
    sp->n_verify++;
    sp->n_drafted += drafted;
    sp->n_accepted += accepted;
    sp->kept = sp->kept * DECAY + (double)accepted;
    /* positions that had the chance: the kept ones and the first refused */
    sp->tried = sp->tried * DECAY + (double)(accepted + (accepted < drafted));
}
