#include "cli.h"

#include "parse.h"
#include "quant.h"

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
    if (shoal_parse_i64(s, lo, hi, out) == 0)
        return 0;
    shoal_cli_error("%s expects an integer in [%lld, %lld], got '%s'", flag, lo, hi,
                    s ? s : "(nothing)");
    return -1;
}

int shoal_cli_parse_group(const char *flag, const char *s, int *out)
{
    long long g;
    if (shoal_parse_i64(s, 32, 128, &g) == 0 && shoal_quant_group_ok((int)g)) {
        *out = (int)g;
        return 0;
    }
    shoal_cli_error("%s expects 32, 64 or 128, got '%s'", flag, s ? s : "(nothing)");
    return -1;
}

int shoal_cli_parse_dtype(const char *flag, const char *s, int experts,
                          enum shoal_dtype *out)
{
    static const struct {
        const char *name;
        enum shoal_dtype dtype;
        int experts_only;
    } names[] = {
        {"f32", SHOAL_DTYPE_F32, 0},      {"bf16", SHOAL_DTYPE_BF16, 0},
        {"int8", SHOAL_DTYPE_INT8, 0},    {"int4", SHOAL_DTYPE_INT4, 1},
        {"int4a8", SHOAL_DTYPE_INT4A8, 1},
    };
    for (size_t i = 0; s && i < sizeof names / sizeof names[0]; i++) {
        if (!strcmp(s, names[i].name) && (experts || !names[i].experts_only)) {
            *out = names[i].dtype;
            return 0;
        }
    }
    shoal_cli_error("%s expects %s, got '%s'", flag,
                    experts ? "int4a8|int4|int8|bf16|f32" : "int8|bf16|f32",
                    s ? s : "(nothing)");
    return -1;
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
    if (shoal_parse_size(s, out) == 0)
        return 0;
    shoal_cli_error("%s expects a size such as 0, 512M, 4G or unlimited, got '%s'", flag,
                    s ? s : "(nothing)");
    return -1;
}
