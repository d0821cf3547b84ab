/* Criterion's stdout/stderr capture for the shim (see criterion.h there). */
#ifndef SHOAL_CRITERION_SHIM_REDIRECT_H
#define SHOAL_CRITERION_SHIM_REDIRECT_H

#include <stdio.h>

#include "criterion.h"

void cr_redirect_stdout(void);
void cr_redirect_stderr(void);
int crs_stream_eq_str(int fd, const char *want);
/* What the test wrote to stdout so far, readable from its start (NULL
 * without cr_redirect_stdout). */
FILE *cr_get_redirected_stdout(void);

#define cr_assert_stdout_eq_str(Want, ...) \
    CRS_CHECK(1, crs_stream_eq_str(1, (Want)), __VA_ARGS__)
#define cr_assert_stderr_eq_str(Want, ...) \
    CRS_CHECK(1, crs_stream_eq_str(2, (Want)), __VA_ARGS__)
#define cr_expect_stdout_eq_str(Want, ...) \
    CRS_CHECK(0, crs_stream_eq_str(1, (Want)), __VA_ARGS__)

#endif
