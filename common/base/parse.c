#include "parse.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"

int shoal_parse_size(const char *s, unsigned long long *out)
{
    if (!s || !*s || isspace((unsigned char)*s))   /* strtod skips it */
        return SHOAL_EINVAL;
    if (!strcmp(s, "unlimited")) {
        *out = ~0ull;
        return 0;
    }
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    unsigned long long mul = 1;
    if (end && *end) {
        switch (*end) {
        case 'k': case 'K': mul = 1ull << 10; break;
        case 'm': case 'M': mul = 1ull << 20; break;
        case 'g': case 'G': mul = 1ull << 30; break;
        case 't': case 'T': mul = 1ull << 40; break;
        default: mul = 0;
        }
        if (mul && end[1] && strcmp(end + 1, "B") && strcmp(end + 1, "iB"))
            mul = 0;
    }
    if (end == s || errno || !(v >= 0) || mul == 0 || v * (double)mul > 1.8e19)
        return SHOAL_EINVAL;
    *out = (unsigned long long)(v * (double)mul);
    return 0;
}

int shoal_parse_i64(const char *s, long long lo, long long hi, long long *out)
{
    /* strtoll would skip leading white space: " 64" is not a number here */
    if (!s || !*s || isspace((unsigned char)*s))
        return SHOAL_EINVAL;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end != '\0' || errno != 0 || v < lo || v > hi)
        return SHOAL_EINVAL;
    *out = v;
    return 0;
}
