/* speculate: drafts for speculative decoding and the gate that decides
 * whether a draft pays.
 *
 * A decode step that evaluates the sampled token together with k drafted
 * tokens gives k + 1 rows of logits; the sampler then runs on the rows in
 * order and a draft is kept while it equals the token sampled before it
 * (generate_loop.c). Every row's logits are the bits a one-token step would
 * give (contract 1: forward.h), and the sampler draws once per generated
 * token either way, so the generated tokens, greedy or sampled with a seed,
 * are bit-identical to decoding without drafts. For a draft that is one
 * token (a point mass), "sample from p, keep the draft if they are equal"
 * is speculative sampling's acceptance rule (accept d with probability
 * p(d), else draw from p without d) exactly, so nothing of the
 * distribution changes either.
 *
 * Drafts come from prompt lookup (Saxena 2023, "Prompt Lookup Decoding";
 * llama.cpp's examples/lookup): the longest recent n-gram of the sequence
 * that occurred before, and the tokens that followed it then. No model.
 * Or from the model's own MTP layers (DeepSeek-V3 report §2.2;
 * forward.h shoal_ctx_mtp_draft): their argmax, chained for k > 1.
 *
 * The gate (mode auto) drafts only when it expects to win: it keeps the
 * measured wall time of steps of each row count (a step of k + 1 rows reads
 * the batch-union's experts: more experts, on disk maybe) and the rate at
 * which drafted tokens are kept, and drafts the k that maximizes expected
 * tokens per second, or none when no k beats a one-row step. Timing moves
 * only the choice of k; the tokens never depend on it.
 *
 * Thread: a struct shoal_spec belongs to one generation's thread.
 */
#ifndef SHOAL_SPECULATE_H
#define SHOAL_SPECULATE_H

#include <stdint.h>

enum shoal_spec_mode {
    SHOAL_SPEC_OFF = 0,
    SHOAL_SPEC_AUTO,      /* prompt lookup, drafted only when the gate expects a gain */
    SHOAL_SPEC_LOOKUP,    /* prompt lookup, every match drafted (up to draft_max) */
    SHOAL_SPEC_MTP,       /* the model's MTP layers draft draft_max tokens every step */
};

#define SHOAL_SPEC_DRAFT_MAX 16   /* the most tokens one step drafts */
#define SHOAL_SPEC_DRAFT_DEFAULT 8     /* drafts a step unless asked: lookup, auto */
#define SHOAL_SPEC_DRAFT_DEFAULT_MTP 1 /* mtp: one per MTP layer (DeepSeek-V3 has one;
                                        * chained drafts fall off fast) */

/* "off", "auto", "lookup"; NULL for an unknown mode. */
const char *shoal_spec_mode_name(enum shoal_spec_mode m);

/* Parse a --speculate value ("off", "auto", "lookup", "mtp"). Returns 0
 * with *m set, -1 for an unknown word. */
int shoal_spec_mode_parse(const char *s, enum shoal_spec_mode *m);

/* Prompt lookup over the sequence S = hist[0 .. n_hist-1] followed by next
 * (the token about to be evaluated): for n from ngram_max down to
 * ngram_min, the most recent earlier occurrence of S's last n tokens; the
 * tokens that followed it (at most max_draft, never past S's end) are the
 * draft.
 *   hist  [n_hist] i32, borrowed; draft [max_draft] i32, written
 * Returns the draft's length (0: no match). 1 <= ngram_min <= ngram_max.
 * Cost O(n_hist * ngram_max). Thread: any. */
int64_t shoal_lookup_draft(const int32_t *hist, int64_t n_hist, int32_t next,
                           int ngram_min, int ngram_max, int32_t *draft, int64_t max_draft);

/* The measured wall time of steps by their row count, shared by the
 * sequences of a context (a step of shoal serve carries several). */
#define SHOAL_SPEC_MAX_ROWS 64
struct shoal_spec_cost {
    double t_rows[SHOAL_SPEC_MAX_ROWS + 1];   /* EMA seconds of a step of n rows; 0:
                                               * none measured */
    double t_draft[SHOAL_SPEC_DRAFT_MAX + 1]; /* EMA seconds to draft k tokens with the
                                               * MTP layers; 0: none measured */
    double t_draft_est;   /* seconds one MTP draft is expected to take before any is
                           * measured (the caller's estimate: an MTP layer and its
                           * head against the trunk's layers and head); 0: none */
};

/* After a step of rows rows that took seconds (steps over
 * SHOAL_SPEC_MAX_ROWS rows are not kept). Thread: the context's. */
void shoal_spec_cost_record(struct shoal_spec_cost *c, int64_t rows, double seconds);

/* Set c->t_draft_est from the measured one-row step of a model of n_layer
 * layers: an MTP draft runs one layer and a head, as the trunk's step runs
 * n_layer and one (t_rows[1] * 2 / (n_layer + 1)). Thread: the context's. */
void shoal_spec_draft_estimate(struct shoal_spec_cost *c, int64_t n_layer);

/* After the MTP layers drafted k tokens in seconds. Thread: the context's. */
void shoal_spec_draft_cost_record(struct shoal_spec_cost *c, int64_t k, double seconds);

/* One sequence's speculation. */
struct shoal_spec {
    enum shoal_spec_mode mode;
    int draft_max;           /* 1 .. SHOAL_SPEC_DRAFT_MAX */
    /* figures (the timings line, shoal chat -v, shoal serve's reply) */
    int64_t n_verify;        /* steps that carried drafts */
    int64_t n_drafted;       /* drafted tokens evaluated */
    int64_t n_accepted;      /* drafted tokens kept */
    /* the gate's state */
    double kept, tried;      /* decayed counts: drafts kept / drafts that had the chance */
    int64_t n_skipped;       /* matches the gate declined since it last drafted */
    int64_t probe_every;     /* declined matches between probes (doubles per probe) */
};

/* Set sp up for mode with at most draft_max drafts a step (clamped to
 * 1 .. SHOAL_SPEC_DRAFT_MAX; 0 or less: SHOAL_SPEC_DRAFT_DEFAULT, for mode
 * mtp SHOAL_SPEC_DRAFT_DEFAULT_MTP). */
void shoal_spec_init(struct shoal_spec *sp, enum shoal_spec_mode mode, int draft_max);

/* The draft for the step that evaluates next after hist (see
 * shoal_lookup_draft), at most limit tokens (the room the context, the step
 * and max-tokens leave), cut to what the gate expects to pay (mode auto).
 * The step already holds base_rows rows (this sequence's next among them)
 * of which base_tokens each give a generated token (decode rows; 1 for
 * shoal run): k drafts pay when (base_tokens - 1 + E[tokens from k
 * drafts]) / t(base_rows + k) beats base_tokens / t(base_rows), t from
 * cost, E from the kept rate. draft [SHOAL_SPEC_DRAFT_MAX] i32, written.
 * Returns its length; 0 in mode off. Thread: sp's. */
int64_t shoal_spec_plan(struct shoal_spec *sp, const struct shoal_spec_cost *cost,
                        int64_t base_rows, int64_t base_tokens, const int32_t *hist,
                        int64_t n_hist, int32_t next, int64_t limit, int32_t *draft);

/* The gate alone (mode auto), for drafts made after it decides (the MTP
 * layers'): how many of up to limit drafts to make for a step that
 * already holds base_rows rows and base_tokens decode rows, counting what
 * drafting k costs (cost->t_draft, else t_draft_est) with the step; 0 when
 * none pays. A probe (one draft) costs the MTP layer's catch-up over every
 * position it has not seen, so it is made only when a step of one more row
 * has been measured and a draft kept at 0.9 (the best MTP heads' rate)
 * would pay, else once every 1024 declined steps. In modes lookup and mtp:
 * min(limit, draft_max); off: 0. Thread: sp's. */
int64_t shoal_spec_choose(struct shoal_spec *sp, const struct shoal_spec_cost *cost,
                          int64_t base_rows, int64_t base_tokens, int64_t limit);

/* After a step that evaluated drafted of sp's drafts, accepted of which
 * were kept. Thread: sp's. */
void shoal_spec_record(struct shoal_spec *sp, int64_t drafted, int64_t accepted);

#endif
