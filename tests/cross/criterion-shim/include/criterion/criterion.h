/* A small Criterion-compatible shim, used only to run the unit tests under
 * qemu-user (tests/run_aarch64.sh). Real Criterion cannot run there: BoxFort
 * re-executes the test binary for every test, which needs binfmt_misc, and
 * its nanomsg IPC hangs under qemu-aarch64 7.2; Debian's
 * libcriterion-dev:arm64 also cannot be installed next to the amd64 one.
 *
 * Supported: Test(suite, name, .init/.fini/.timeout/.disabled/.description),
 * TestSuite(suite, .init/.fini), cr_assert / cr_expect with the new/assert.h
 * operators (eq ne lt le gt ge not, epsilon_eq, ieee_ulp_eq on the usual
 * type tags), cr_assert_null / cr_assert_not_null, cr_assert_eq & co.,
 * cr_skip / cr_skip_test, cr_log_info / cr_log_warn / cr_log_error, and
 * stdout/stderr redirection with cr_assert_stdout_eq_str. Each test runs in
 * its own forked process (no exec), like Criterion. A failed assertion
 * prints the expression, not the operand values. */
#ifndef SHOAL_CRITERION_SHIM_H
#define SHOAL_CRITERION_SHIM_H

#include <stdbool.h>
#include <stddef.h>

/* cr_assert(cond) passes an empty message format */
#pragma GCC diagnostic ignored "-Wformat-zero-length"

struct crs_extra {
    int crs_dummy_;            /* lets `{ .crs_dummy_ = 0, __VA_ARGS__ }` be empty */
    void (*init)(void);
    void (*fini)(void);
    double timeout;            /* seconds, 0 for none (scaled under qemu) */
    bool disabled;
    const char *description;
    int exit_code;             /* accepted, not checked */
    int signal;                /* accepted, not checked */
};

struct crs_test {
    const char *suite;
    const char *name;
    void (*fn)(void);
    const struct crs_extra *extra;
    struct crs_test *next;
};

struct crs_suite {
    const char *name;
    const struct crs_extra *extra;
    struct crs_suite *next;
};

void crs_register_test(struct crs_test *t);
void crs_register_suite(struct crs_suite *s);

#define CRS_CAT_(a, b) a##b
#define CRS_CAT(a, b) CRS_CAT_(a, b)

#define Test(Suite, Name, ...)                                                 \
    static void Suite##_##Name##_impl(void);                                   \
    static const struct crs_extra Suite##_##Name##_extra = {                   \
        .crs_dummy_ = 0, __VA_ARGS__};                                         \
    static struct crs_test Suite##_##Name##_test = {                           \
        #Suite, #Name, Suite##_##Name##_impl, &Suite##_##Name##_extra, NULL};  \
    __attribute__((constructor)) static void Suite##_##Name##_reg(void)        \
    {                                                                          \
        crs_register_test(&Suite##_##Name##_test);                             \
    }                                                                          \
    static void Suite##_##Name##_impl(void)

#define TestSuite(Suite, ...)                                                  \
    static const struct crs_extra Suite##_suite_extra = {                      \
        .crs_dummy_ = 0, __VA_ARGS__};                                         \
    static struct crs_suite Suite##_suite = {#Suite, &Suite##_suite_extra,     \
                                             NULL};                            \
    __attribute__((constructor)) static void Suite##_suite_reg(void)           \
    {                                                                          \
        crs_register_suite(&Suite##_suite);                                    \
    }                                                                          \
    struct crs_suite_semicolon_##Suite

/* failure reporting; fatal ones do not return */
void crs_fail(int fatal, const char *file, int line, const char *expr,
              const char *fmt, ...) __attribute__((format(printf, 5, 6)));
void crs_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void crs_log(const char *level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Text: the assertion as written (condition and message arguments) */
#define CRS_CHECK_(Fatal, Text, Cond, ...)                                     \
    do {                                                                       \
        if (!(Cond))                                                           \
            crs_fail((Fatal), __FILE__, __LINE__, Text, "" __VA_ARGS__);       \
    } while (0)
#define CRS_CHECK(Fatal, ...) CRS_CHECK_(Fatal, #__VA_ARGS__, __VA_ARGS__)

#define cr_assert(...) CRS_CHECK_(1, #__VA_ARGS__, __VA_ARGS__)
#define cr_expect(...) CRS_CHECK_(0, #__VA_ARGS__, __VA_ARGS__)
#define cr_assert_not(Cond, ...) CRS_CHECK(1, !(Cond), __VA_ARGS__)
#define cr_expect_not(Cond, ...) CRS_CHECK(0, !(Cond), __VA_ARGS__)
#define cr_assert_fail(...) crs_fail(1, __FILE__, __LINE__, "fail", "" __VA_ARGS__)
#define cr_expect_fail(...) crs_fail(0, __FILE__, __LINE__, "fail", "" __VA_ARGS__)
#define cr_assert_null(Ptr, ...) CRS_CHECK(1, (Ptr) == NULL, __VA_ARGS__)
#define cr_assert_not_null(Ptr, ...) CRS_CHECK(1, (Ptr) != NULL, __VA_ARGS__)
#define cr_expect_null(Ptr, ...) CRS_CHECK(0, (Ptr) == NULL, __VA_ARGS__)
#define cr_expect_not_null(Ptr, ...) CRS_CHECK(0, (Ptr) != NULL, __VA_ARGS__)
#define cr_assert_eq(A, B, ...) CRS_CHECK(1, (A) == (B), __VA_ARGS__)
#define cr_assert_neq(A, B, ...) CRS_CHECK(1, (A) != (B), __VA_ARGS__)
#define cr_assert_lt(A, B, ...) CRS_CHECK(1, (A) < (B), __VA_ARGS__)
#define cr_assert_leq(A, B, ...) CRS_CHECK(1, (A) <= (B), __VA_ARGS__)
#define cr_assert_gt(A, B, ...) CRS_CHECK(1, (A) > (B), __VA_ARGS__)
#define cr_assert_geq(A, B, ...) CRS_CHECK(1, (A) >= (B), __VA_ARGS__)
#define cr_assert_str_eq(A, B, ...) CRS_CHECK(1, crs_str_eq((A), (B)), __VA_ARGS__)
#define cr_assert_str_neq(A, B, ...) CRS_CHECK(1, !crs_str_eq((A), (B)), __VA_ARGS__)
#define cr_expect_eq(A, B, ...) CRS_CHECK(0, (A) == (B), __VA_ARGS__)
#define cr_expect_str_eq(A, B, ...) CRS_CHECK(0, crs_str_eq((A), (B)), __VA_ARGS__)

#define cr_skip(...) crs_skip("" __VA_ARGS__)
#define cr_skip_test(...) crs_skip("" __VA_ARGS__)

#define cr_log_info(...) crs_log("info", __VA_ARGS__)
#define cr_log_warn(...) crs_log("warn", __VA_ARGS__)
#define cr_log_error(...) crs_log("error", __VA_ARGS__)

int crs_str_eq(const char *a, const char *b);

#endif
