/* log.h - one line per event: time, level, identity, message; to stderr or a
 * file that SIGHUP reopens. The level is checked before formatting. */
#ifndef FERRY_LOG_H
#define FERRY_LOG_H

enum log_level { LOG_DEBUG = 0, LOG_INFO, LOG_WARN, LOG_ERROR };

/* Set the level and destination (NULL or "" = stderr). Returns 0 or -errno. */
int log_init(int level, const char *path);
/* Reopen the log file (after logrotate moved it). Returns 0 or -errno. */
int log_reopen(void);
void log_close(void);
int log_enabled(int level);
void log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Parse "debug|info|warn|error"; returns the level or -1. */
int log_level_parse(const char *s);

#define log_debug(...)                                                                             \
    do {                                                                                           \
        if (log_enabled(LOG_DEBUG))                                                                \
            log_write(LOG_DEBUG, __VA_ARGS__);                                                     \
    } while (0)
#define log_info(...)                                                                              \
    do {                                                                                           \
        if (log_enabled(LOG_INFO))                                                                 \
            log_write(LOG_INFO, __VA_ARGS__);                                                      \
    } while (0)
#define log_warn(...)                                                                              \
    do {                                                                                           \
        if (log_enabled(LOG_WARN))                                                                 \
            log_write(LOG_WARN, __VA_ARGS__);                                                      \
    } while (0)
#define log_error(...) log_write(LOG_ERROR, __VA_ARGS__)

#endif
