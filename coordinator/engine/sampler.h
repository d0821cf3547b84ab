/* sampler: picks the next token from logits: repetition penalty, then the
 * presence and frequency penalties, then greedy (argmax, lowest id on ties)
 * or temperature -> top-k -> top-p -> min-p -> a draw from a seeded
 * generator. The same seed, logits and history give the same token on
 * every machine.
 * Thread: a sampler belongs to one thread.
 */
#ifndef SHOAL_SAMPLER_H
#define SHOAL_SAMPLER_H

#include <stdint.h>

#include "err.h"

struct shoal_sampler_params {
    int greedy;              /* 1: argmax (other knobs but the penalty ignored) */
    float temperature;       /* <= 0 behaves as greedy */
    int64_t top_k;           /* 0 = off */
    float top_p;             /* 1 = off */
    float min_p;             /* 0 = off */
    float repeat_penalty;    /* 1 = off; HF semantics: logit>0 ? /p : *p */
    int64_t repeat_last_n;   /* how many recent tokens the penalty sees; -1 all */
    /* OpenAI's penalties, 0 = off (the API allows -2..2): before the
     * temperature, on the greedy path too,
     *   logit[t] -= presence_penalty * (count[t] > 0) + frequency_penalty * count[t]
     * where count[t] is how often this sampler has returned t: the tokens
     * of this completion so far, not the prompt's (as OpenAI counts; unlike
     * repeat_penalty, which sees the history). */
    float presence_penalty;
    float frequency_penalty;
    uint64_t seed;
};

static inline struct shoal_sampler_params shoal_sampler_params_default(void)
{
    return (struct shoal_sampler_params){
        .greedy = 0, .temperature = 0.8f, .top_k = 40, .top_p = 0.95f,
        .min_p = 0.05f, .repeat_penalty = 1.0f, .repeat_last_n = 64,
        .seed = 0x5eed};
}

struct shoal_sampler;

/* Create a sampler for n_vocab logits. Owned by the caller. */
struct shoal_sampler *shoal_sampler_create(struct shoal_sampler_params p,
                                           int64_t n_vocab);
void shoal_sampler_free(struct shoal_sampler *s);

/* The first index of logits [n] (f32) that is NaN or infinite, or -1 when
 * every value is finite. A damaged model file (a NaN weight) or an overflow
 * shows here before any token is drawn from it. One pass over the bits,
 * vectorized. Thread: any. */
int64_t shoal_logits_nonfinite(const float *logits, int64_t n);

/* 0 when logits [n] are all finite; else SHOAL_ERANGE with err = "<what>
 * hold NaN|inf at vocabulary index I: its weights or activations are not
 * finite (...)", what (printf format what_fmt and its arguments, formatted
 * only on failure) naming the logits (e.g. "the model's logits for
 * generated token 3"). Thread: any. */
int shoal_logits_check(const float *logits, int64_t n, struct shoal_err *err,
                       const char *what_fmt, ...) __attribute__((format(printf, 4, 5)));

/* Pick a token, and count it for the presence/frequency penalties (one
 * sampler per completion).
 *   logits   [n_vocab] f32, modified in place (penalties applied)
 *   history  [n_history] i32 previous tokens (prompt + generated), borrowed;
 *            only the repetition penalty reads it
 * Returns the token id. Thread: the sampler's. */
int32_t shoal_sampler_sample(struct shoal_sampler *s, float *logits,
                             const int32_t *history, int64_t n_history);

#endif
