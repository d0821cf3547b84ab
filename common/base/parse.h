/* parse: pure parsers for command-line values that both programs take
 * (`shoal`, `shoal-worker`). They print nothing: the caller names the flag
 * in its own error line.
 * Thread: any.
 */
#ifndef SHOAL_PARSE_H
#define SHOAL_PARSE_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

/* Parse a byte size: "0", "4096", "512K", "256M", "4G", "1T" (binary
 * multiples, optional "B"/"iB" suffix, fractions allowed: "1.5G"), or
 * "unlimited" (~0ull).
 *   out  written on success only
 * Returns 0 or SHOAL_EINVAL (empty, leading white space, negative, unknown
 * suffix, over 2^64). */
int shoal_parse_size(const char *s, unsigned long long *out);

/* Parse a whole decimal integer in [lo, hi].
 *   out  written on success only
 * Returns 0 or SHOAL_EINVAL (empty, leading white space, trailing
 * characters, out of range). */
int shoal_parse_i64(const char *s, long long lo, long long hi, long long *out);

/* Parse a token id list: "1,2,3", "1 2 3" or "1, 2" (ids 0..2^31-1; one
 * comma and/or white space between them). *ids (newly allocated, the
 * caller frees) of *n >= 1 ids, written on success only.
 * Returns 0 or SHOAL_EINVAL with err naming the bad item (an empty item, a
 * word that is not an id, an empty list). */
int shoal_parse_id_list(const char *s, int32_t **ids, size_t *n, struct shoal_err *err);

#endif
