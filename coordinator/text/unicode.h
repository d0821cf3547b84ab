/* unicode: the small UTF-8 and byte-level helpers the tokenizer needs.
 *
 * - UTF-8 sequence lengths, decoding and encoding (strict: overlongs,
 *   surrogates and code points above U+10FFFF are invalid);
 * - the GPT-2 "byte-level" alphabet: a bijection between the 256 byte values
 *   and 256 printable code points, in which byte-level BPE vocabularies are
 *   written ("Ġ" is the space byte 0x20);
 * - a streaming-safe split point for partially received UTF-8 and a
 *   sanitizer that replaces invalid sequences by U+FFFD.
 *
 * Normalization (NFC/NFKC...) is not here: the tokenizer uses utf8proc.
 * Thread: any (no state).
 */
#ifndef SHOAL_UNICODE_H
#define SHOAL_UNICODE_H

#include <stddef.h>
#include <stdint.h>

/* Byte length of the UTF-8 sequence introduced by byte c, judged from its
 * high nibble only (1 for ASCII, continuation and invalid bytes; 2, 3 or 4
 * for lead bytes). This is the rule llama.cpp uses to cut text into
 * characters; callers clamp it to the bytes left. */
size_t shoal_utf8_seq_len(uint8_t c);

/* Decode one strictly valid UTF-8 sequence at s[0..len).
 * Returns its byte length (1..4) and writes *cp, or 0 if the bytes at s do
 * not start a valid, complete sequence (len == 0 included). */
size_t shoal_utf8_decode(const char *s, size_t len, uint32_t *cp);

/* Encode cp (<= U+10FFFF, not a surrogate) into out[0..4).
 * Returns the byte count, 0 for a code point that cannot be encoded. */
size_t shoal_utf8_encode(uint32_t cp, char out[4]);

/* 1 if s[0..len) is entirely valid UTF-8, else 0. */
int shoal_utf8_is_valid(const char *s, size_t len);

/* Number of leading bytes of s[0..len) that can be emitted now: everything
 * except a trailing sequence that is still valid so far but incomplete
 * (a lead byte followed by fewer continuation bytes than it needs). */
size_t shoal_utf8_complete_prefix(const char *s, size_t len);

/* Copy s[0..len) into out, replacing each maximal invalid subpart by U+FFFD
 * (EF BF BD), as the Unicode standard recommends.
 *   out  [>= 3 * len] bytes, written
 * Returns the number of bytes written. */
size_t shoal_utf8_sanitize(const char *s, size_t len, char *out);

/* GPT-2 byte-level alphabet: the code point that stands for byte b. */
uint32_t shoal_bytelevel_cp(uint8_t b);

/* Byte-level decoding of text written in the GPT-2 alphabet.
 *   s    [len] UTF-8 bytes, borrowed
 *   out  [>= len] bytes, written (each code point yields one byte)
 * Returns the number of bytes written, or -1 if s holds invalid UTF-8 or a
 * code point outside the alphabet (out is then unspecified). */
long shoal_bytelevel_decode(const char *s, size_t len, char *out);

#endif
