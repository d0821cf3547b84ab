/* Tests for common/base/parse.h: the flag value parsers both programs share. */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>

#include "err.h"
#include "parse.h"

Test(parse, i64_takes_whole_numbers_in_range_only)
{
    long long v = 7;
    cr_assert(eq(int, shoal_parse_i64("64", 32, 128, &v), 0));
    cr_assert(eq(i64, v, 64));
    cr_assert(eq(int, shoal_parse_i64("-5", -10, 10, &v), 0));
    cr_assert(eq(i64, v, -5));
    const char *bad[] = {"", " 64", "\t64", "64 ", "64x", "x", "31", "129", "6.4",
                         "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        v = 7;
        cr_assert(eq(int, shoal_parse_i64(bad[i], 32, 128, &v), SHOAL_EINVAL), "'%s'", bad[i]);
        cr_assert(eq(i64, v, 7), "'%s' wrote the output", bad[i]);
    }
    cr_assert(eq(int, shoal_parse_i64(NULL, 0, 1, &v), SHOAL_EINVAL));
}

Test(parse, size_takes_binary_suffixes_and_unlimited)
{
    const struct {
        const char *s;
        unsigned long long want;
    } good[] = {{"0", 0}, {"4096", 4096}, {"512K", 512ull << 10}, {"256M", 256ull << 20},
                {"4G", 4ull << 30}, {"1T", 1ull << 40}, {"1.5G", 3ull << 29},
                {"2MiB", 2ull << 20}, {"2MB", 2ull << 20}, {"unlimited", ~0ull}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        unsigned long long v = 1;
        cr_assert(eq(int, shoal_parse_size(good[i].s, &v), 0), "'%s'", good[i].s);
        cr_assert(eq(u64, v, good[i].want), "'%s'", good[i].s);
    }
    const char *bad[] = {"", " 1G", "-1", "1X", "1GBB", "nan", "inf", "1e30", "G"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        unsigned long long v = 9;
        cr_assert(eq(int, shoal_parse_size(bad[i], &v), SHOAL_EINVAL), "'%s'", bad[i]);
        cr_assert(eq(u64, v, 9), "'%s' wrote the output", bad[i]);
    }
}
