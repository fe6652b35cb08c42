/* mem.c - the helpers every module uses and that use nothing of ferry but
 * the log: allocation that aborts on OOM, the invariant check, the error
 * text of ferry's codes. At the bottom of the stack, beside buf and resp. */
#include "ferry.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL) {
        log_error("out of memory allocating %zu bytes", n);
        abort();
    }
    return p;
}

void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (p == NULL) {
        log_error("out of memory allocating %zu bytes", n * size);
        abort();
    }
    return p;
}

void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (q == NULL) {
        log_error("out of memory allocating %zu bytes", n);
        abort();
    }
    return q;
}

char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = xmalloc(n);
    memcpy(p, s, n);
    return p;
}

char *xstrndup(const char *p, size_t n)
{
    char *c = xmalloc(n + 1);
    memcpy(c, p, n);
    c[n] = '\0';
    return c;
}

void ferry_assert_fail(const char *what, const char *file, int line)
{
    log_error("assertion failed: %s (%s:%d)", what, file, line);
    abort();
}

const char *ferry_strerror(int err)
{
    switch (err) {
    case FERRY_EPROTO:
        return "protocol error";
    case FERRY_ECONFIG:
        return "bad configuration";
    case FERRY_ETIMEDOUT:
        return "timed out";
    case FERRY_EAUTH:
        return "authentication refused";
    default:
        return err < 0 && err > -4096 ? uv_strerror(err) : "unknown error";
    }
}
