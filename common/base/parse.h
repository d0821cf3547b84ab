/* parse: pure parsers for command-line values that both programs take
 * (`shoal`, `shoal-worker`). They print nothing: the caller names the flag
 * in its own error line.
 * Thread: any.
 */
#ifndef SHOAL_PARSE_H
#define SHOAL_PARSE_H

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

#endif
