/* Prompt-lookup drafts and the speculation gate (coordinator/engine/
 * speculate.h). Assert kind: exact token ids and draft lengths. */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <string.h>

#include "speculate.h"

Test(speculate, lookup_takes_the_longest_most_recent_match)
{
    /* S = 1 2 3 9 | 5 2 3 4 | 7 2 3 + next 4: the suffix 2 3 4 (n = 3)
     * occurred at 5..7, followed by 7 2 3 4 */
    const int32_t h[] = {1, 2, 3, 9, 5, 2, 3, 4, 7, 2, 3};
    int32_t d[8];
    int64_t k = shoal_lookup_draft(h, 11, 4, 2, 4, d, 8);
    cr_assert(eq(i64, k, 4));
    const int32_t want[] = {7, 2, 3, 4};
    cr_assert(eq(int, memcmp(d, want, sizeof want), 0));
    /* at most max_draft */
    cr_assert(eq(i64, shoal_lookup_draft(h, 11, 4, 2, 4, d, 2), 2));
    cr_assert(eq(i32, d[0], 7));
    cr_assert(eq(i32, d[1], 2));
    /* next 9: suffix 2 3 9 (n = 3) matches at 1..3, followed by the rest of
     * S up to its end: 5 2 3 4 7 2 3 9 */
    k = shoal_lookup_draft(h, 11, 9, 2, 4, d, 8);
    cr_assert(eq(i64, k, 8));
    cr_assert(eq(i32, d[0], 5));
    cr_assert(eq(i32, d[7], 9));
    /* the most recent of two matches of the same length: 2 3 -> after 2 3 at
     * 5..6 comes 4 (not 9, which followed the older one) */
    k = shoal_lookup_draft(h, 10, 3, 2, 2, d, 1);
    cr_assert(eq(i64, k, 1));
    cr_assert(eq(i32, d[0], 4));
}

Test(speculate, lookup_without_a_match_drafts_nothing)
{
    const int32_t h[] = {1, 2, 3, 4, 5};
    int32_t d[4];
    cr_assert(eq(i64, shoal_lookup_draft(h, 5, 6, 2, 4, d, 4), 0));
    cr_assert(eq(i64, shoal_lookup_draft(h, 0, 6, 2, 4, d, 4), 0));   /* S of one token */
    cr_assert(eq(i64, shoal_lookup_draft(h, 5, 1, 1, 1, d, 4), 4));   /* unigram 1 at 0 */
    cr_assert(eq(i32, d[0], 2));
    /* a repeating run: 7 7 7 + 7 drafts the 7s after the match, never past S */
    const int32_t r[] = {7, 7, 7};
    cr_assert(eq(i64, shoal_lookup_draft(r, 3, 7, 2, 4, d, 4), 1));
    cr_assert(eq(i32, d[0], 7));
}

Test(speculate, modes_parse)
{
    enum shoal_spec_mode m = SHOAL_SPEC_OFF;
    cr_assert(eq(int, shoal_spec_mode_parse("lookup", &m), 0));
    cr_assert(eq(int, (int)m, SHOAL_SPEC_LOOKUP));
    cr_assert(eq(int, shoal_spec_mode_parse("auto", &m), 0));
    cr_assert(eq(int, (int)m, SHOAL_SPEC_AUTO));
    cr_assert(eq(int, shoal_spec_mode_parse("mtp", &m), 0));
    cr_assert(eq(int, (int)m, SHOAL_SPEC_MTP));
    cr_assert(eq(str, (char *)shoal_spec_mode_name(SHOAL_SPEC_MTP), "mtp"));
    cr_assert(eq(int, shoal_spec_mode_parse("on", &m), -1));
    cr_assert(eq(str, (char *)shoal_spec_mode_name(SHOAL_SPEC_OFF), "off"));
}

/* A history whose lookup drafts 6 tokens: 1 2 3 4 5 6 1 2 3 + 4 matches
 * 1 2 3 4 at 0, followed by 5 6 1 2 3 4 */
static const int32_t rep[] = {1, 2, 3, 4, 5, 6, 1, 2, 3};

Test(speculate, off_and_lookup_modes)
{
    struct shoal_spec sp;
    struct shoal_spec_cost c = {{0}, {0}, 0};
    int32_t d[SHOAL_SPEC_DRAFT_MAX];
    shoal_spec_init(&sp, SHOAL_SPEC_OFF, 8);
    cr_assert(eq(i64, shoal_spec_plan(&sp, &c, 1, 1, rep, 9, 4, 8, d), 0));
    shoal_spec_init(&sp, SHOAL_SPEC_LOOKUP, 3);
    cr_assert(eq(i64, shoal_spec_plan(&sp, &c, 1, 1, rep, 9, 4, 8, d), 3), "draft_max");
    cr_assert(eq(i64, shoal_spec_plan(&sp, &c, 1, 1, rep, 9, 4, 2, d), 2), "the caller's limit");
    cr_assert(eq(i64, shoal_spec_plan(&sp, &c, 1, 1, rep, 9, 4, 0, d), 0));
    shoal_spec_init(&sp, SHOAL_SPEC_LOOKUP, 99);
    cr_assert(eq(int, sp.draft_max, SHOAL_SPEC_DRAFT_MAX));
}

Test(speculate, auto_drafts_only_where_the_measured_steps_pay)
{
    struct shoal_spec sp;
    struct shoal_spec_cost c = {{0}, {0}, 0};
    int32_t d[SHOAL_SPEC_DRAFT_MAX];
    shoal_spec_init(&sp, SHOAL_SPEC_AUTO, 8);
    /* no one-row step measured yet: nothing to compare with */
    cr_assert(eq(i64, shoal_spec_plan(&sp, &c, 1, 1, rep, 9, 4, 8, d), 0));
    /* one-row steps only: extra rows are assumed to cost as much (no gain),
     * so the first match probes one draft, to measure a 2-row step */
    shoal_spec_cost_record(&c, 1, 0.010);
    cr_assert(eq(i64, shoal_spec_plan(&sp, &c, 1, 1, rep, 9, 4, 8, d), 1));
    cr_assert(eq(i64, shoal_spec_plan(&sp, &c, 1, 1, rep, 9, 4, 8, d), 0));
    /* cheap extra rows and every draft kept: the whole match (6 drafts, 7
     * rows: extrapolated from the 1- and 5-row steps) */
    shoal_spec_cost_record(&c, 1, 0.010);
    shoal_spec_cost_record(&c, 5, 0.012);
    for (int i = 0; i < 20; i++)
        shoal_spec_record(&sp, 4, 4);
    cr_assert(eq(i64, shoal_spec_plan(&sp, &c, 1, 1, rep, 9, 4, 8, d), 6));
    cr_assert(eq(i32, d[0], 5));
    /* a step of 3 decode rows already: the others' tokens count, and an
     * unmeasured base (3 rows, 3 tokens: the extrapolation) still drafts */
    cr_assert(eq(i64, shoal_spec_plan(&sp, &c, 3, 3, rep, 9, 4, 8, d), 6));
    /* rows that cost 0.8 of a one-row step each (a kept draft would pay),
     * and drafts refused: none, but one-token probes after 32, then 64,
     * 128 ... more declined matches (the interval doubles per probe) */
    shoal_spec_init(&sp, SHOAL_SPEC_AUTO, 8);
    memset(&c, 0, sizeof c);
    for (int64_t n = 1; n <= 9; n++)
        shoal_spec_cost_record(&c, n, 0.010 + 0.008 * (double)(n - 1));
    for (int64_t n = 2; n <= 5; n++)
        shoal_spec_record(&sp, n - 1, 0);
    sp.n_skipped = 0;   /* past the first probe */
    int probes = 0, at[4] = {0};
    for (int i = 0; i < 32 + 64 + 128; i++) {
        const int64_t k = shoal_spec_plan(&sp, &c, 1, 1, rep, 9, 4, 8, d);
        cr_assert(k == 0 || k == 1);
        if (k == 1 && probes < 4)
            at[probes] = i + 1;
        probes += k == 1;
    }
    cr_assert(eq(int, probes, 3));
    cr_assert(eq(int, at[0], 32));
    cr_assert(eq(int, at[1], 32 + 64));
    cr_assert(eq(int, at[2], 32 + 64 + 128));
    cr_assert(eq(i64, sp.n_drafted, 1 + 2 + 3 + 4));
    cr_assert(eq(i64, sp.n_accepted, 0));
    /* rows that cost as much as one-row steps each: even a kept draft
     * cannot pay, so the probes wait PROBE_MAX (1024) declined matches */
    shoal_spec_init(&sp, SHOAL_SPEC_AUTO, 8);
    memset(&c, 0, sizeof c);
    for (int64_t n = 1; n <= 9; n++)
        shoal_spec_cost_record(&c, n, 0.010 * (double)n);
    sp.n_skipped = 0;
    probes = 0;
    for (int i = 0; i < 1023; i++)
        probes += shoal_spec_plan(&sp, &c, 1, 1, rep, 9, 4, 8, d) > 0;
    cr_assert(eq(int, probes, 0));
    cr_assert(eq(i64, shoal_spec_plan(&sp, &c, 1, 1, rep, 9, 4, 8, d), 1));
    /* steps too large to be measured: no draft */
    shoal_spec_init(&sp, SHOAL_SPEC_AUTO, 8);
    cr_assert(eq(i64, shoal_spec_plan(&sp, &c, SHOAL_SPEC_MAX_ROWS, 1, rep, 9, 4, 8, d), 0));
}

/* The gate for drafts made after it decides (the MTP layers'): modes mtp
 * and lookup take what the step allows; auto counts the drafting's own
 * time, so a draft that would pay on the step alone does not once drafting
 * costs as much as the step. */
Test(speculate, choose_counts_the_drafting_time)
{
    struct shoal_spec sp;
    shoal_spec_init(&sp, SHOAL_SPEC_MTP, 4);
    struct shoal_spec_cost c = {{0}, {0}, 0};
    cr_assert(eq(i64, shoal_spec_choose(&sp, &c, 1, 1, 10), 4));
    cr_assert(eq(i64, shoal_spec_choose(&sp, &c, 1, 1, 2), 2));
    cr_assert(eq(i64, shoal_spec_choose(&sp, &c, 1, 1, 0), 0));
    shoal_spec_init(&sp, SHOAL_SPEC_OFF, 4);
    cr_assert(eq(i64, shoal_spec_choose(&sp, &c, 1, 1, 10), 0));

    shoal_spec_init(&sp, SHOAL_SPEC_AUTO, 1);
    for (int i = 0; i < 50; i++)
        shoal_spec_record(&sp, 1, 1);           /* every draft kept */
    shoal_spec_cost_record(&c, 1, 1.0);
    shoal_spec_cost_record(&c, 2, 1.1);         /* 2 rows cost 1.1x one */
    cr_assert(eq(i64, shoal_spec_choose(&sp, &c, 1, 1, 10), 1));   /* no drafting cost yet */
    shoal_spec_draft_cost_record(&c, 1, 0.05);
    cr_assert(eq(i64, shoal_spec_choose(&sp, &c, 1, 1, 10), 1));   /* ~1.73x: pays */
    for (int i = 0; i < 100; i++)
        shoal_spec_draft_cost_record(&c, 1, 1.5);
    /* (1 + ~1) / (1.1 + 1.5) < 1: declined; even a kept draft cannot pay
     * (2 tokens in 2.6 one-row steps), so a probe only every 1024 */
    int drafted = 0;
    for (int i = 0; i < 1023; i++)
        drafted += shoal_spec_choose(&sp, &c, 1, 1, 10) > 0;
    cr_assert(eq(int, drafted, 0));
    cr_assert(eq(i64, shoal_spec_choose(&sp, &c, 1, 1, 10), 1));
}
