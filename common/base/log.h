/* log: one logging API. Lines go to a replaceable sink (default stderr) as
 *   "ts level component: message"
 * The macro tests the level before evaluating its arguments.
 * Thread: any (the default sink writes each line with one fprintf).
 */
#ifndef SHOAL_LOG_H
#define SHOAL_LOG_H

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

#define shoal_log(level, component, ...)                          \
    do {                                                          \
        if ((level) <= shoal_log_level_current)                   \
            shoal_log_write((level), (component), __VA_ARGS__);   \
    } while (0)

#endif
