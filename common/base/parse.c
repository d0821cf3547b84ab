#include "parse.h"

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "util.h"

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

int shoal_parse_id_list(const char *s, int32_t **ids, size_t *n, struct shoal_err *err)
{
    size_t cap = 16, cnt = 0;
    int32_t *out = shoal_xmalloc(cap * sizeof *out);
    const char *p = s;
    for (;;) {
        /* ids are separated by one comma and/or whitespace: "1,2", "1 2",
         * "1, 2"; an empty item ("1,,2", ",1", "1,") is a typo, not nothing */
        int commas = 0;
        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n')
            commas += *p++ == ',';
        if (commas > 1 || (commas == 1 && (cnt == 0 || !*p))) {
            free(out);
            return shoal_err_set(err, SHOAL_EINVAL, "token list: an empty item near id %zu "
                                 "(two commas in a row, or a comma at an end)", cnt + 1);
        }
        if (!*p)
            break;
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < 0 || v > INT32_MAX ||
            (*end && *end != ',' && !isspace((unsigned char)*end))) {
            int w = 0;   /* the item alone: up to the next separator */
            while (p[w] && p[w] != ',' && !isspace((unsigned char)p[w]) && w < 40)
                w++;
            shoal_err_set(err, SHOAL_EINVAL, "token list: item %zu ('%.*s') is not a token "
                          "id (a non-negative integer)", cnt + 1, w, p);
            free(out);
            return SHOAL_EINVAL;
        }
        if (cnt == cap) {
            cap *= 2;
            out = shoal_xrealloc(out, cap * sizeof *out);
        }
        out[cnt++] = (int32_t)v;
        p = end;
    }
    if (cnt == 0) {
        free(out);
        return shoal_err_set(err, SHOAL_EINVAL, "token list is empty");
    }
    *ids = out;
    *n = cnt;
    return 0;
}
