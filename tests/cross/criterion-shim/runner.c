/* Runner of the Criterion shim (see include/criterion/criterion.h): main()
 * forks one child per registered test, runs suite and test fixtures around
 * it, and prints Criterion-like lines and a final
 *   [====] Synthesis: Tested: N | Passing: P | Failing: F | Crashing: C | Skipped: S
 * Options: --filter=GLOB (suite/name, fnmatch), --list; others (--jobs,
 * --verbose, --tap...) are accepted and ignored. Exit status 1 if any test
 * failed or crashed. Timeouts (.timeout) are multiplied by
 * CRS_TIMEOUT_SCALE (20) because the tests run under an emulator. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "criterion/criterion.h"
#include "criterion/new/assert.h"
#include "criterion/redirect.h"

#define CRS_TIMEOUT_SCALE 20.0
#define CRS_EXIT_FAIL 1
#define CRS_EXIT_SKIP 77

static struct crs_test *tests;
static struct crs_suite *suites;
static const struct crs_test *current;
static jmp_buf abort_jmp;
static int failed_expect;
static FILE *captured[3];   /* [1] stdout, [2] stderr: temp files */
static int saved_fd[3] = {-1, -1, -1};

void crs_register_test(struct crs_test *t)
{
    t->next = tests;
    tests = t;
}

void crs_register_suite(struct crs_suite *s)
{
    s->next = suites;
    suites = s;
}

/* stderr of the test process, also when stderr itself is captured */
static FILE *report(void)
{
    static FILE *f;
    if (saved_fd[2] >= 0) {
        if (!f)
            f = fdopen(dup(saved_fd[2]), "w");
        return f;
    }
    return stderr;
}

void crs_fail(int fatal, const char *file, int line, const char *expr,
              const char *fmt, ...)
{
    FILE *out = report();
    fprintf(out, "[----] %s:%d: %s: %s\n", file, line,
            fatal ? "Assertion Failed" : "Expectation Failed", expr);
    if (fmt && *fmt) {
        va_list ap;
        va_start(ap, fmt);
        fprintf(out, "[----]   ");
        vfprintf(out, fmt, ap);
        fprintf(out, "\n");
        va_end(ap);
    }
    fflush(out);
    failed_expect = 1;
    if (fatal)
        longjmp(abort_jmp, 1);
}

void crs_skip(const char *fmt, ...)
{
    FILE *out = report();
    va_list ap;
    va_start(ap, fmt);
    fprintf(out, "[SKIP] %s::%s: ", current->suite, current->name);
    vfprintf(out, fmt, ap);
    fprintf(out, "\n");
    va_end(ap);
    fflush(out);
    longjmp(abort_jmp, 2);
}

void crs_log(const char *level, const char *fmt, ...)
{
    FILE *out = report();
    va_list ap;
    va_start(ap, fmt);
    fprintf(out, "[----] %s: ", level);
    vfprintf(out, fmt, ap);
    fprintf(out, "\n");
    va_end(ap);
    fflush(out);
}

int crs_str_cmp(const char *a, const char *b)
{
    if (!a || !b)
        return a == b ? 0 : (a ? 1 : -1);
    return strcmp(a, b);
}

int crs_str_eq(const char *a, const char *b)
{
    return crs_str_cmp(a, b) == 0;
}

int crs_all(const int *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!v[i])
            return 0;
    return 1;
}

int crs_any(const int *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (v[i])
            return 1;
    return 0;
}

static int64_t ordered32(float f)
{
    int32_t i;
    memcpy(&i, &f, 4);
    return i < 0 ? (int64_t)INT32_MIN - i : i;
}

int crs_ulp_eq_flt(float a, float b, int ulp)
{
    if (isnan(a) || isnan(b))
        return 0;
    int64_t d = ordered32(a) - ordered32(b);
    return (d < 0 ? -d : d) <= ulp;
}

int crs_ulp_eq_dbl(double a, double b, int ulp)
{
    if (isnan(a) || isnan(b))
        return 0;
    int64_t ia, ib;
    memcpy(&ia, &a, 8);
    memcpy(&ib, &b, 8);
    if (ia < 0)
        ia = INT64_MIN - ia;
    if (ib < 0)
        ib = INT64_MIN - ib;
    /* both are within +-2^63; their difference fits unless signs differ */
    if ((ia < 0) != (ib < 0))
        return a == b;
    int64_t d = ia - ib;
    return (d < 0 ? -d : d) <= ulp;
}

static void redirect(int fd)
{
    fflush(fd == 1 ? stdout : stderr);
    if (!captured[fd]) {
        captured[fd] = tmpfile();
        if (!captured[fd]) {
            perror("criterion shim: tmpfile");
            _exit(CRS_EXIT_FAIL);
        }
    }
    if (saved_fd[fd] < 0)
        saved_fd[fd] = dup(fd);
    dup2(fileno(captured[fd]), fd);
}

void cr_redirect_stdout(void)
{
    redirect(1);
}

void cr_redirect_stderr(void)
{
    redirect(2);
}

FILE *cr_get_redirected_stdout(void)
{
    /* a copy of what was captured, read from its start (the capture's own
     * offset is stdout's and stays where writes go) */
    if (!captured[1])
        return NULL;
    fflush(stdout);
    FILE *copy = tmpfile();
    if (!copy)
        return NULL;
    char buf[4096];
    ssize_t n;
    for (off_t at = 0; (n = pread(fileno(captured[1]), buf, sizeof buf, at)) > 0; at += n)
        fwrite(buf, 1, (size_t)n, copy);
    rewind(copy);
    return copy;
}

int crs_stream_eq_str(int fd, const char *want)
{
    if (!captured[fd])
        return 0;
    fflush(fd == 1 ? stdout : stderr);
    FILE *f = captured[fd];
    long end = lseek(fileno(f), 0, SEEK_END);
    if (end < 0)
        return 0;
    char *buf = malloc((size_t)end + 1);
    if (!buf || pread(fileno(f), buf, (size_t)end, 0) != end) {
        free(buf);
        return 0;
    }
    buf[end] = '\0';
    int ok = strlen(want) == (size_t)end && memcmp(buf, want, (size_t)end) == 0;
    if (!ok)
        fprintf(report(), "[----]   captured %s: \"%s\"\n",
                fd == 1 ? "stdout" : "stderr", buf);
    free(buf);
    return ok;
}

static const struct crs_extra *suite_extra(const char *name)
{
    for (struct crs_suite *s = suites; s; s = s->next)
        if (strcmp(s->name, name) == 0)
            return s->extra;
    return NULL;
}

/* the child: fixtures and body; exit status tells the parent the outcome */
static const struct crs_extra *cur_suite;   /* static: survives longjmp */

static void run_child(const struct crs_test *t)
{
    cur_suite = suite_extra(t->suite);
    const struct crs_extra *se = cur_suite;
    current = t;
    double timeout = t->extra->timeout > 0 ? t->extra->timeout
                     : (se && se->timeout > 0 ? se->timeout : 0);
    if (timeout > 0)
        alarm((unsigned)ceil(timeout * CRS_TIMEOUT_SCALE));
    int how = setjmp(abort_jmp);
    if (how == 0) {
        if (cur_suite && cur_suite->init)
            cur_suite->init();
        if (current->extra->init)
            current->extra->init();
        current->fn();
    }
    if (how != 2) {   /* Criterion runs .fini after a failed assertion too */
        if (setjmp(abort_jmp) == 0) {
            if (current->extra->fini)
                current->extra->fini();
            if (cur_suite && cur_suite->fini)
                cur_suite->fini();
        }
    }
    fflush(stdout);
    fflush(stderr);
    _exit(how == 2 ? CRS_EXIT_SKIP : (failed_expect ? CRS_EXIT_FAIL : 0));
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    const char *filter = NULL;
    int list = 0;
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], "--filter=", 9) == 0)
            filter = argv[i] + 9;
        else if (strcmp(argv[i], "--filter") == 0 && i + 1 < argc)
            filter = argv[++i];
        else if (strcmp(argv[i], "--list") == 0 || strcmp(argv[i], "-l") == 0)
            list = 1;
    }
    /* registration order is reversed by the list: restore source order */
    struct crs_test *rev = NULL;
    while (tests) {
        struct crs_test *t = tests;
        tests = t->next;
        t->next = rev;
        rev = t;
    }
    tests = rev;

    int n = 0, pass = 0, fail = 0, crash = 0, skip = 0;
    for (struct crs_test *t = tests; t; t = t->next) {
        char id[512];
        snprintf(id, sizeof id, "%s/%s", t->suite, t->name);
        if (filter && fnmatch(filter, id, 0) != 0)
            continue;
        if (list) {
            printf("%s::%s\n", t->suite, t->name);
            continue;
        }
        if (t->extra->disabled) {
            skip++;
            continue;
        }
        n++;
        fflush(stdout);
        fflush(stderr);
        double t0 = now_s();
        pid_t pid = fork();
        if (pid < 0) {
            perror("criterion shim: fork");
            return 2;
        }
        if (pid == 0)
            run_child(t);
        int st = 0;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
            ;
        double dt = now_s() - t0;
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
            pass++;
            fprintf(stderr, "[PASS] %s::%s: (%.2fs)\n", t->suite, t->name, dt);
        } else if (WIFEXITED(st) && WEXITSTATUS(st) == CRS_EXIT_SKIP) {
            skip++;
        } else if (WIFEXITED(st)) {
            fail++;
            fprintf(stderr, "[FAIL] %s::%s: (%.2fs)\n", t->suite, t->name, dt);
        } else {
            crash++;
            fprintf(stderr, "[FAIL] %s::%s: CRASH (signal %d%s) (%.2fs)\n", t->suite,
                    t->name, WTERMSIG(st), WTERMSIG(st) == SIGALRM ? ", timeout" : "", dt);
        }
    }
    if (!list)
        fprintf(stderr,
                "[====] Synthesis: Tested: %d | Passing: %d | Failing: %d | "
                "Crashing: %d | Skipped: %d\n", n, pass, fail, crash, skip);
    return fail || crash ? 1 : 0;
}
