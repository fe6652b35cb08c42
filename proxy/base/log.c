/* log.c - leveled, line-oriented logging to stderr or a reopenable file.
 * The level and the file are the only process-wide state ferry keeps outside
 * its context struct: every module logs, and signal-driven reopen needs them. */
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int log_level = LOG_INFO;   /* lowest level written */
static int log_fd = STDERR_FILENO; /* destination */
static char *log_path;             /* NULL: stderr */

static const char *const level_names[] = {"DEBUG", "INFO", "WARN", "ERROR"};

static int open_path(const char *path)
{
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    return fd < 0 ? -errno : fd;
}

int log_init(int level, const char *path)
{
    log_level = level;
    if (path == NULL || path[0] == '\0') {
        return 0;
    }
    int fd = open_path(path);
    if (fd < 0) {
        return fd;
    }
    log_close();
    log_fd = fd;
    log_path = strdup(path);
    if (log_path == NULL) {
        abort();
    }
    return 0;
}

int log_reopen(void)
{
    if (log_path == NULL) {
        return 0;
    }
    int fd = open_path(log_path);
    if (fd < 0) {
        return fd;
    }
    /* dup2 swaps the file under the same descriptor in one step: a worker
     * thread's line (one write each) lands whole in the old file or the
     * new one, never lost or split, without a lock on the write path. */
    dup2(fd, log_fd);
    close(fd);
    return 0;
}

void log_close(void)
{
    if (log_path != NULL) {
        close(log_fd);
        free(log_path);
        log_path = NULL;
        log_fd = STDERR_FILENO;
    }
}

int log_enabled(int level)
{
    return level >= log_level;
}

int log_level_parse(const char *s)
{
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(s, level_names[i]) == 0) {
            return i;
        }
    }
    if (strcasecmp(s, "warning") == 0) {
        return LOG_WARN;
    }
    return -1;
}

void log_write(int level, const char *fmt, ...)
{
    char line[4096];
    struct timeval tv;
    struct tm tm;
    size_t n;
    va_list ap;

    if (level < log_level) {
        return;
    }
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    n = strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
    n += (size_t)snprintf(line + n, sizeof(line) - n, ".%03dZ %d %-5s ", (int)(tv.tv_usec / 1000),
                          (int)getpid(), level_names[level < 0 || level > 3 ? 3 : level]);
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
    va_end(ap);
    if (m < 0) {
        m = 0;
    }
    n += (size_t)m;
    if (n > sizeof(line) - 2) {
        n = sizeof(line) - 2;
    }
    line[n++] = '\n';
    /* One write per line so concurrent writers never interleave mid-line. */
    ssize_t w = write(log_fd, line, n);
    (void)w;
}
