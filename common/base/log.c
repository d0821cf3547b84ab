#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

enum shoal_log_level shoal_log_level_current = SHOAL_LOG_WARN;

static shoal_log_sink_fn sink_fn;
static void *sink_user;

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
    fprintf(stderr, "%02d:%02d:%02d.%03ld %s %s: %s\n", tm.tm_hour, tm.tm_min,
            tm.tm_sec, ts.tv_nsec / 1000000L, level_name(level), component,
            line);
}
