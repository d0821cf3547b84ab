#include "log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>

enum shoal_log_level shoal_log_level_current = SHOAL_LOG_WARN;

static shoal_log_sink_fn sink_fn;
static void *sink_user;

/* the streamed text (shoal_log_text) when it shares stderr's file, else
 * NULL, and whether it stands mid-line; under text_mu with every line the
 * default sink writes */
static pthread_mutex_t text_mu = PTHREAD_MUTEX_INITIALIZER;
static FILE *text_out;
static int text_midline;

static int same_file(FILE *a, FILE *b)
{
    struct stat sa, sb;
    return fstat(fileno(a), &sa) == 0 && fstat(fileno(b), &sb) == 0 &&
           sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int shoal_log_text(FILE *out, const char *p, size_t n)
{
    pthread_mutex_lock(&text_mu);
    /* kept only while it shares stderr's file (stdout, in practice): a
     * FILE the caller closes later is never written to from here */
    text_out = same_file(out, stderr) ? out : NULL;
    if (!text_out)
        text_midline = 0;
    errno = 0;
    int rc = 0;
    if ((n && fwrite(p, 1, n, out) != n) || fflush(out) != 0 || ferror(out)) {
        if (!errno)
            errno = EIO;
        rc = -1;
    }
    if (n && text_out)
        text_midline = p[n - 1] != '\n';
    pthread_mutex_unlock(&text_mu);
    return rc;
}

/* Caller holds text_mu. */
static void break_line(void)
{
    if (text_out && text_midline) {
        fputc('\n', text_out);
        fflush(text_out);
        text_midline = 0;
    }
}

void shoal_log_break(void)
{
    pthread_mutex_lock(&text_mu);
    break_line();
    pthread_mutex_unlock(&text_mu);
}

void shoal_log_set_level(enum shoal_log_level level)
{
    shoal_log_level_current = level;
}

void shoal_log_set_sink(shoal_log_sink_fn fn, void *user)
{
    sink_fn = fn;
    sink_user = user;
}

static const char *level_name(enum shoal_log_level l)
{
    switch (l) {
    case SHOAL_LOG_ERROR: return "error";
    case SHOAL_LOG_WARN: return "warn";
    case SHOAL_LOG_INFO: return "info";
    default: return "debug";
    }
}

void shoal_log_write(enum shoal_log_level level, const char *component,
                     const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (sink_fn) {
        sink_fn(level, component, line, sink_user);
        return;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    pthread_mutex_lock(&text_mu);
    break_line();
    fprintf(stderr, "%02d:%02d:%02d.%03ld %s %s: %s\n", tm.tm_hour, tm.tm_min,
            tm.tm_sec, ts.tv_nsec / 1000000L, level_name(level), component,
            line);
    pthread_mutex_unlock(&text_mu);
}
