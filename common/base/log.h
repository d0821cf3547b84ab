/* log: one logging API. Lines go to a replaceable sink (default stderr) as
 *   "ts level component: message"
 * The macro tests the level before evaluating its arguments.
 * Thread: any (the default sink writes each line with one fprintf, under a
 * lock it shares with shoal_log_text).
 */
#ifndef SHOAL_LOG_H
#define SHOAL_LOG_H

#include <stdio.h>

enum shoal_log_level {
    SHOAL_LOG_ERROR = 0,
    SHOAL_LOG_WARN  = 1,
    SHOAL_LOG_INFO  = 2,
    SHOAL_LOG_DEBUG = 3,
};

typedef void (*shoal_log_sink_fn)(enum shoal_log_level level,
                                  const char *component, const char *line,
                                  void *user);

extern enum shoal_log_level shoal_log_level_current;

/* Set the maximum level that is emitted (default WARN). Thread: main, at start. */
void shoal_log_set_level(enum shoal_log_level level);

/* Replace the sink (NULL restores stderr). Thread: main, at start. */
void shoal_log_set_sink(shoal_log_sink_fn fn, void *user);

void shoal_log_write(enum shoal_log_level level, const char *component,
                     const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Text streamed to the user (a reply's tokens, written as they come) and
 * log lines share one terminal or pipe when stdout and stderr are the same
 * file (`2>&1`, a terminal): a log line written while that text stands
 * mid-line would land inside it ("King of19:07:19.319 warn ..."). Write
 * such text with shoal_log_text: it writes and flushes the n bytes of p to
 * out under the log's lock and notes whether out now stands mid-line. The
 * default sink then ends that line (a '\n' to out) before a log line when
 * out and stderr are the same file; shoal_log_break does the same for a
 * caller about to write its own line to stderr. Returns 0, or -1 with
 * errno set (a short write, a failed flush). Thread: any. */
int shoal_log_text(FILE *out, const char *p, size_t n);

/* End the line of the text written with shoal_log_text when it stands
 * mid-line and out and stderr are the same file; nothing otherwise.
 * Thread: any. */
void shoal_log_break(void);

#define shoal_log(level, component, ...)                          \
    do {                                                          \
        if ((level) <= shoal_log_level_current)                   \
            shoal_log_write((level), (component), __VA_ARGS__);   \
    } while (0)

#endif
