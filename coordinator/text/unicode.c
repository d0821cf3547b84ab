#include "unicode.h"

#include <string.h>

size_t shoal_utf8_seq_len(uint8_t c)
{
    static const uint8_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1,
                                       1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[c >> 4];
}

size_t shoal_utf8_decode(const char *s, size_t len, uint32_t *cp)
{
    const uint8_t *u = (const uint8_t *)s;
    if (len == 0)
        return 0;
    uint8_t c = u[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t n;
    uint32_t v, min;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2, v = c & 0x1F, min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3, v = c & 0x0F, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4, v = c & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if (len < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((u[i] & 0xC0) != 0x80)
            return 0;
        v = (v << 6) | (u[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return 0;
    *cp = v;
    return n;
}

size_t shoal_utf8_encode(uint32_t cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp >= 0xD800 && cp <= 0xDFFF)
        return 0;
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    if (cp <= 0x10FFFF) {
        out[0] = (char)(0xF0 | (cp >> 18));
        out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[3] = (char)(0x80 | (cp & 0x3F));
        return 4;
    }
    return 0;
}

int shoal_utf8_is_valid(const char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        if ((uint8_t)s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        size_t n = shoal_utf8_decode(s + i, len - i, &cp);
        if (n == 0)
            return 0;
        i += n;
    }
    return 1;
}

/* Length of the longest prefix of s[0..len) (len <= 4) that is the start of
 * some valid sequence: 0 if s[0] cannot start one. Used both to find
 * "incomplete but still valid" tails and the maximal invalid subparts. */
static size_t valid_partial(const uint8_t *u, size_t len)
{
    uint8_t c = u[0];
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) {
        need = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else {
        return 0;
    }
    size_t i = 1;
    for (; i < need && i < len; i++) {
        uint8_t b = u[i];
        uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (b < l || b > h)
            break;
    }
    return i; /* == need: complete; < need: valid so far up to i bytes */
}

size_t shoal_utf8_complete_prefix(const char *s, size_t len)
{
    const uint8_t *u = (const uint8_t *)s;
    /* An incomplete sequence is at most 3 bytes long: look for its lead. */
    size_t back = len < 3 ? len : 3;
    for (size_t k = 1; k <= back; k++) {
        size_t at = len - k;
        uint8_t c = u[at];
        if ((c & 0xC0) == 0x80)
            continue; /* continuation byte: keep looking for the lead */
        size_t need = shoal_utf8_seq_len(c);
        if (c < 0x80 || need <= k)
            return len; /* ASCII, or a sequence with all its bytes */
        /* Lead byte that still lacks bytes: hold it back if what follows
         * is a valid beginning (otherwise it can never complete). */
        if (valid_partial(u + at, k) == k)
            return at;
        return len;
    }
    return len;
}

size_t shoal_utf8_sanitize(const char *s, size_t len, char *out)
{
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0, o = 0;
    while (i < len) {
        if (u[i] < 0x80) {
            out[o++] = (char)u[i++];
            continue;
        }
        size_t rest = len - i < 4 ? len - i : 4;
        size_t p = valid_partial(u + i, rest);
        size_t need = shoal_utf8_seq_len(u[i]);
        if (p > 0 && p == need) {
            memcpy(out + o, u + i, p);
            o += p;
            i += p;
            continue;
        }
        /* invalid: one U+FFFD for the maximal subpart (at least one byte) */
        out[o++] = (char)0xEF;
        out[o++] = (char)0xBF;
        out[o++] = (char)0xBD;
        i += p > 0 ? p : 1;
    }
    return o;
}

/* Bytes that stand for themselves in the GPT-2 alphabet: '!'..'~',
 * U+00A1..U+00AC and U+00AE..U+00FF; the other 68 bytes map, in increasing
 * byte order, to U+0100, U+0101, ... */
static int bytelevel_is_self(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) ||
           (b >= 0xAE && b <= 0xFF);
}

uint32_t shoal_bytelevel_cp(uint8_t b)
{
    if (bytelevel_is_self(b))
        return b;
    if (b <= 0x20)
        return 0x100 + b;              /* 0x00..0x20 -> U+0100..U+0120 */
    if (b >= 0x7F && b <= 0xA0)
        return 0x100 + 33 + (b - 0x7F); /* 0x7F..0xA0 -> U+0121..U+0142 */
    return 0x100 + 67;                 /* 0xAD -> U+0143 */
}

static int bytelevel_byte(uint32_t cp)
{
    if (cp < 0x100)
        return bytelevel_is_self(cp) ? (int)cp : -1;
    uint32_t n = cp - 0x100;
    if (n <= 32)
        return (int)n;
    if (n <= 66)
        return (int)(0x7F + (n - 33));
    if (n == 67)
        return 0xAD;
    return -1;
}

long shoal_bytelevel_decode(const char *s, size_t len, char *out)
{
    size_t i = 0, o = 0;
    while (i < len) {
        uint32_t cp;
        size_t n = shoal_utf8_decode(s + i, len - i, &cp);
        int b = n ? bytelevel_byte(cp) : -1;
        if (b < 0)
            return -1;
        out[o++] = (char)b;
        i += n;
    }
    return (long)o;
}
