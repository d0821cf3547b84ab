#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

void shoal_cli_error(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "shoal: %s\n", buf);
}

int shoal_cli_parse_i64(const char *flag, const char *s, long long lo,
                        long long hi, long long *out)
{
    char *end = NULL;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || *s == '\0' || *end != '\0' || errno != 0 || v < lo || v > hi) {
        shoal_cli_error("%s expects an integer in [%lld, %lld], got '%s'", flag,
                        lo, hi, s ? s : "(nothing)");
        return -1;
    }
    *out = v;
    return 0;
}

int shoal_cli_parse_f64(const char *flag, const char *s, double lo, double hi,
                        double *out)
{
    char *end = NULL;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    if (!s || *s == '\0' || *end != '\0' || errno != 0 || isnan(v) || v < lo ||
        v > hi) {
        shoal_cli_error("%s expects a number in [%g, %g], got '%s'", flag, lo,
                        hi, s ? s : "(nothing)");
        return -1;
    }
    *out = v;
    return 0;
}

const char *shoal_cli_default_model(void)
{
    return SHOAL_SOURCE_ROOT "/models/shakespeare-moe";
}

int shoal_cli_parse_size(const char *flag, const char *s, unsigned long long *out)
{
    if (s && !strcmp(s, "unlimited")) {
        *out = ~0ull;
        return 0;
    }
    char *end = NULL;
    errno = 0;
    double v = s ? strtod(s, &end) : -1;
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
    if (!s || end == s || errno || v < 0 || mul == 0 || v * (double)mul > 1.8e19) {
        shoal_cli_error("%s expects a size such as 0, 512M, 4G or unlimited, got '%s'", flag,
                        s ? s : "(nothing)");
        return -1;
    }
    *out = (unsigned long long)(v * (double)mul);
    return 0;
}
