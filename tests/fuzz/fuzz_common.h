/* fuzz_common: what every libFuzzer target under tests/fuzz/ shares.
 *
 * Memory accounting: the targets run under ASan, whose allocator calls the
 * hooks installed here on every malloc/free. Between fuzz_mem_begin and
 * fuzz_mem_end the live bytes are counted as glibc would charge them (each
 * block rounded up to 16 bytes plus a 16-byte header, so a million 1-byte
 * blocks cost what they cost in a real process), and the peak and the
 * largest single block are kept. fuzz_mem_check aborts, so libFuzzer saves
 * the input as a crash, when a peak or a block passes its budget.
 *
 * Thread: the hooks are atomic (a decoder may allocate from any thread);
 * begin/end/check run on the fuzzing thread.
 */
#ifndef SHOAL_FUZZ_COMMON_H
#define SHOAL_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>

#define FUZZ_KIB ((size_t)1 << 10)
#define FUZZ_MIB ((size_t)1 << 20)

struct fuzz_mem {
    size_t peak;      /* most bytes live at once since begin (charged sizes) */
    size_t biggest;   /* largest single block requested since begin, bytes */
    size_t count;     /* allocations since begin, by any thread */
    size_t count_here; /* those made by the thread that called begin (for
                          "allocates nothing": libFuzzer's own threads may
                          allocate meanwhile) */
};

/* Start counting: live, peak, biggest and count start at 0. Installs the
 * hooks on the first call. */
void fuzz_mem_begin(void);

/* What was counted since fuzz_mem_begin (or the last fuzz_mem_reset_peak);
 * counting goes on. */
struct fuzz_mem fuzz_mem_now(void);

/* Start a new phase: the peak restarts from the bytes live now. */
void fuzz_mem_reset_peak(void);

/* Stop counting and return the totals. */
struct fuzz_mem fuzz_mem_end(void);

/* Abort with one line naming target, what, the input size and the budget
 * when m.peak > peak_budget or m.biggest > block_budget. */
void fuzz_mem_check(const char *target, const char *what, struct fuzz_mem m,
                    size_t input_len, size_t peak_budget, size_t block_budget);

/* Abort with a message when cond is false (an API promise broken). */
#define FUZZ_ASSERT(cond, ...)                                                   \
    do {                                                                         \
        if (!(cond))                                                             \
            fuzz_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);                   \
    } while (0)
void fuzz_fail(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 4, 5)));

/* A copy of data[n] as a NUL-terminated string (malloc'd; the caller frees). */
char *fuzz_strndup(const uint8_t *data, size_t n);

/* Write data[n] into a file the decoder can open by path: one memfd per
 * process, rewritten for each input; returns its "/proc/self/fd/N" path
 * (static storage). Aborts if the memfd cannot be made. */
const char *fuzz_as_file(const uint8_t *data, size_t n);

/* Split data at the first NUL: *a gets the bytes before it, *b those after
 * (empty when there is no NUL). Returns 1 when a NUL was found. */
int fuzz_split(const uint8_t *data, size_t n, const uint8_t **a, size_t *na,
               const uint8_t **b, size_t *nb);

struct shoal_tokenizer;

/* Encode text[len] with tok (add_special and parse_special both set to
 * special), check every id is inside the vocabulary and there are at most
 * max_ids of them, and decode them back. A refused encode is fine (err
 * set). */
void fuzz_encode_round(const struct shoal_tokenizer *tok, const uint8_t *text, size_t len,
                       int special, size_t max_ids);

#endif
