#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <string.h>

#include "err.h"

Test(err, first_error_wins_and_message_is_one_line)
{
    struct shoal_err e = {0};
    int rc = shoal_err_set(&e, SHOAL_EFORMAT, "bad %s\nline", "header");
    cr_assert(eq(int, rc, SHOAL_EFORMAT));
    shoal_err_set(&e, SHOAL_EIO, "second");
    cr_assert(eq(int, e.code, SHOAL_EFORMAT));
    cr_assert(eq(str, e.msg, "bad header line"));
}

Test(err, names_and_descriptions_cover_codes)
{
    cr_assert(eq(str, (char *)shoal_err_name(SHOAL_ESHAPE), "ESHAPE"));
    cr_assert(eq(str, (char *)shoal_strerror(SHOAL_ENOMEM), "out of memory"));
    cr_assert(eq(str, (char *)shoal_strerror(-2), strerror(2)));
}

Test(err, null_err_is_accepted)
{
    cr_assert(eq(int, shoal_err_set(NULL, SHOAL_EINVAL, "x"), SHOAL_EINVAL));
}

Test(err, bad_input_is_the_file_not_the_machine)
{
    static const int bad[] = {SHOAL_EFORMAT, SHOAL_EUNSUPPORTED, SHOAL_ENOTFOUND,
                              SHOAL_ERANGE, SHOAL_ESHAPE};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_assert(eq(int, shoal_err_is_bad_input(bad[i]), 1), "%s", shoal_err_name(bad[i]));
    cr_assert(eq(int, shoal_err_is_bad_input(SHOAL_EIO), 0));
    cr_assert(eq(int, shoal_err_is_bad_input(SHOAL_ENOMEM), 0));
    cr_assert(eq(int, shoal_err_is_bad_input(-2), 0));   /* ENOENT */
    cr_assert(eq(int, shoal_err_is_bad_input(0), 0));
}
